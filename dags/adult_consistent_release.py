"""Example DAG: a consistent release of UCI Adult counts (docs/consistency.md).

``compute_counts`` reads the Adult table and returns the true counts by education x sex, by education, by sex and
in total (plain Python values, kept out of the task log). ``release`` noises each as
``config/releases/adult_education_sex.yaml`` says, after charging the budget account ``census_adult_tables``, and
post-processes them (no budget): every published margin is the sum of its cells, no cell is negative or fractional.

Environment: as ``adult_census_release`` (``DP_OPERATORS_ADULT_CSV``, ``DP_OPERATORS_OUTPUT_URI``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum

from airflow.sdk import dag, task
from dp_operators.operators.release import DPReleaseOperator

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "config" / "releases" / "adult_education_sex.yaml"


def adult_csv_path() -> Path:
    """Where the Adult table is read from: ``DP_OPERATORS_ADULT_CSV``, else ``.data/adult.csv`` (``make demo``),
    else ``../shared/data/adult.csv`` beside the repository."""
    if os.environ.get("DP_OPERATORS_ADULT_CSV"):
        return Path(os.environ["DP_OPERATORS_ADULT_CSV"])
    fetched = REPO / ".data" / "adult.csv"
    return fetched if fetched.exists() else REPO.parent / "shared" / "data" / "adult.csv"


def compute_education_sex_counts(path: Path) -> dict:
    """True counts of the Adult table in the shape ``DPReleaseOperator`` expects (plain Python values)."""
    import pandas as pd

    table = pd.read_csv(path, usecols=["education", "sex"], skipinitialspace=True)
    return {
        "people_by_education_sex": [
            {"education": education, "sex": sex, "count": int(count)}
            for (education, sex), count in table.groupby(["education", "sex"]).size().items()
        ],
        "people_by_education": [{"education": e, "count": int(c)} for e, c in table["education"].value_counts().items()],
        "people_by_sex": [{"sex": s, "count": int(c)} for s, c in table["sex"].value_counts().items()],
        "people": int(len(table)),
    }


@dag(
    dag_id="adult_consistent_release",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["differential-privacy", "example"],
    doc_md=__doc__,
)
def adult_consistent_release():
    @task(show_return_value_in_logs=False, multiple_outputs=False)
    def compute_counts() -> dict:
        return compute_education_sex_counts(adult_csv_path())

    counts = compute_counts()
    release = DPReleaseOperator(
        task_id="release",
        spec_path=SPEC,
        aggregates_task_id="compute_counts",
        output_uri=os.environ.get("DP_OPERATORS_OUTPUT_URI", f"file://{REPO / '.demo' / 'releases'}"),
        ledger_conn_id="dp_ledger_default",
        retries=2,  # transient errors (storage, the ledger's database); a held lease waits without a try (ADR 31)
        retry_delay=timedelta(seconds=30),
    )
    counts >> release


adult_consistent_release()
