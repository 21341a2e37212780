"""Example DAG: a differentially private release of UCI Adult census statistics.

``compute_aggregates`` reads the 48,842-row Adult table and returns true aggregates (plain Python values; its
return value is kept out of the task log). ``release`` noises them as ``config/releases/adult_census.yaml`` says,
after charging the budget account ``census_adult`` in the ledger, and publishes JSON and CSV plus an asset event.

Environment:
    DP_OPERATORS_ADULT_CSV: the Adult table (default: ``.data/adult.csv`` as ``make demo`` builds it, else
        ``../shared/data/adult.csv`` beside the repository).
    DP_OPERATORS_OUTPUT_URI: where releases are written (default ``file://<repo>/.demo/releases``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum

from airflow.sdk import dag, task
from dp_operators.operators.release import DPReleaseOperator

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "config" / "releases" / "adult_census.yaml"
AGE_BANDS = [(17, 24), (25, 34), (35, 44), (45, 54), (55, 64), (65, 74), (75, None)]
HOURS_BOUNDS = (1, 99)


def adult_csv_path() -> Path:
    """Where the Adult table is read from (see the module docstring)."""
    if os.environ.get("DP_OPERATORS_ADULT_CSV"):
        return Path(os.environ["DP_OPERATORS_ADULT_CSV"])
    fetched = REPO / ".data" / "adult.csv"
    return fetched if fetched.exists() else REPO.parent / "shared" / "data" / "adult.csv"


def age_band(age: int) -> str:
    """The age band label of ``age``: ``17-24``, ``25-34``, ..., ``75+``."""
    for low, high in AGE_BANDS:
        if high is None or age <= high:
            return f"{low}+" if high is None else f"{low}-{high}"
    raise AssertionError("unreachable")


def compute_adult_aggregates(path: Path) -> dict:
    """True aggregates of the Adult table, in the shape ``DPReleaseOperator`` expects (plain Python values)."""
    import pandas as pd

    table = pd.read_csv(path, usecols=["age", "education", "sex", "hours_per_week"], skipinitialspace=True)
    by_education_sex = table.groupby(["education", "sex"]).size()
    by_age_band = table["age"].map(age_band).value_counts()
    hours = table["hours_per_week"].clip(*HOURS_BOUNDS)
    return {
        "people_by_education_sex": [
            {"education": education, "sex": sex, "count": int(count)}
            for (education, sex), count in by_education_sex.items()
        ],
        "people_by_age_band": [{"age_band": band, "count": int(count)} for band, count in by_age_band.items()],
        "mean_hours_per_week": {"sum": int(hours.sum()), "count": int(len(hours))},
        # the median's histogram over the spec's bins: one row per hour (a bin's lower edge) present in the data
        "median_hours_per_week": [{"hours_per_week": int(h), "count": int(c)} for h, c in hours.value_counts().items()],
    }


@dag(
    dag_id="adult_census_release",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["differential-privacy", "example"],
    doc_md=__doc__,
)
def adult_census_release():
    @task(show_return_value_in_logs=False, multiple_outputs=False)
    def compute_aggregates() -> dict:
        return compute_adult_aggregates(adult_csv_path())

    aggregates = compute_aggregates()
    release = DPReleaseOperator(
        task_id="release",
        spec_path=SPEC,
        aggregates_task_id="compute_aggregates",
        output_uri=os.environ.get("DP_OPERATORS_OUTPUT_URI", f"file://{REPO / '.demo' / 'releases'}"),
        ledger_conn_id="dp_ledger_default",
        retries=2,  # transient errors (storage, the ledger's database); a held lease waits without a try (ADR 31)
        retry_delay=timedelta(seconds=30),
    )
    aggregates >> release


adult_census_release()
