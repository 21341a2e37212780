"""Example: generalise UCI Adult to k = 10 with Mondrian, then gate the extract with an anonymity check.

``generalise_adult`` runs Mondrian (LeFevre et al. 2006) on the quasi-identifiers of
``config/anonymity/adult_microdata.yaml`` and writes the generalised extract; ``check_adult_microdata`` measures k,
l and t on it and publishes the report as XCom and as the extract's asset event. The spec says ``on_failure: warn``:
the extract meets k = 10 but not l-diversity on income (many classes are all ``<=50K``), which the report shows.

Environment:
    DP_OPERATORS_ADULT_CSV: the Adult table (48,842 rows); default ``.data/adult.csv`` (``make demo`` fetches it),
        else ``../shared/data/adult.csv`` beside the repository.
    DP_OPERATORS_OUTPUT_DIR: where the generalised extract goes; default ``.data/anonymity`` in the repo.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import Asset, dag, task

from dp_operators.anonymity import load_anonymity_spec
from dp_operators.operators.anonymity import AnonymityCheckOperator

REPO_ROOT = Path(__file__).resolve().parents[1]
# as in adult_census_release.py: the env var, else the table `make demo` fetched, else the team's shared copy
ADULT_CSV = Path(
    os.environ.get("DP_OPERATORS_ADULT_CSV")
    or next(
        (p for p in (REPO_ROOT / ".data" / "adult.csv",) if p.exists()),
        REPO_ROOT.parent / "shared" / "data" / "adult.csv",
    )
)
OUTPUT_DIR = Path(os.environ.get("DP_OPERATORS_OUTPUT_DIR", REPO_ROOT / ".data" / "anonymity"))
SPEC = REPO_ROOT / "config" / "anonymity" / "adult_microdata.yaml"
EXTRACT = OUTPUT_DIR / "adult_microdata_k10.csv"
TARGET_K = 10
MAX_SUPPRESSION = 0.01

adult_extract = Asset(name="adult_microdata_k10", uri=EXTRACT.resolve().as_uri())


@dag(
    dag_id="adult_anonymity_check",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    tags=["dp_operators", "anonymity", "example"],
    doc_md=__doc__,
)
def adult_anonymity_check():
    @task
    def generalise_adult() -> dict:
        """Mondrian to k = 10 with at most 1 % suppression; returns the information loss (no row contents)."""
        import pandas as pd

        from dp_operators.anonymity import mondrian

        spec = load_anonymity_spec(SPEC)
        table = pd.read_csv(ADULT_CSV)
        result = mondrian(table, spec.quasi_identifiers, k=TARGET_K, max_suppression=MAX_SUPPRESSION)
        EXTRACT.parent.mkdir(parents=True, exist_ok=True)
        result.table.to_csv(EXTRACT, index=False)
        return result.information_loss()

    check = AnonymityCheckOperator(
        task_id="check_adult_microdata",
        spec=SPEC,
        source=str(EXTRACT),
        outlets=[adult_extract],
    )
    generalise_adult() >> check


adult_anonymity_check_dag = adult_anonymity_check()
