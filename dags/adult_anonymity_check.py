"""Example: anonymise UCI Adult for publication as microdata, gate it, and publish the table with its report.

``anonymise_adult`` (``AnonymiseOperator``) reads ``config/anonymity/adult_anonymisation.yaml``: eight
quasi-identifiers (age, sex, race, marital_status, education, native_country, workclass, occupation) with our own
generalisation hierarchies (``config/anonymity/hierarchies/*.csv`` in ARX's format; age in 5-, 10- and 20-year
bands), targets k = 5 and distinct 2-diversity of income, at most 1 % of the rows suppressed. The optimal
full-domain search picks the lattice node with the least information loss that meets the targets; the task then
writes the anonymised table (``adult_anonymised.csv``: the eight QIs as hierarchy labels, and income; suppressed
rows left out) and the report (``adult_anonymised_report.json``: counts, measures, risk, the chosen node,
information loss; no row contents), and sets the report as the ``adult_anonymised`` asset event's extra. When no
node meets the targets the table is not written, the report (which targets fail, even at full generalisation) is
still written and pushed to XCom under ``anonymity_report``, and the task fails.

Only the declared columns are published (``columns=``): Adult's ``fnlwgt`` is nearly unique per row and
``education_num`` mirrors education, so publishing either would undo the generalisation.

``check_published_adult`` (``AnonymityCheckOperator``) measures the published file again with
``config/anonymity/adult_anonymised_check.yaml`` (the same targets on the generalised columns, no suppression): an
independent check of what was released, with its own report file.

Run it (no ledger or keys needed; ``scripts/demo_env.sh`` sets a throwaway Airflow home in ``.demo/airflow`` and
the two variables below)::

    source scripts/demo_env.sh
    airflow db migrate                        # once per Airflow home
    airflow dags test adult_anonymity_check   # writes .demo/anonymity/adult_anonymised{.csv,_report.json,_check.json}

Environment (both set by ``scripts/demo_env.sh``):
    DP_OPERATORS_ADULT_CSV: the Adult table (48,842 rows); default ``.data/adult.csv`` (``make demo`` fetches it),
        else ``../shared/data/adult.csv`` beside the repository.
    DP_OPERATORS_OUTPUT_DIR: the local folder where the table and the reports go; default ``.demo/anonymity`` in the
        repo (beside the demo's releases, not in them: ``dpctl release show`` reads every JSON file there).
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import Asset, dag

from dp_operators.operators.anonymity import AnonymiseOperator, AnonymityCheckOperator

REPO_ROOT = Path(__file__).resolve().parents[1]
# as in adult_census_release.py: the env var, else the table `make demo` fetched, else the team's shared copy
ADULT_CSV = Path(
    os.environ.get("DP_OPERATORS_ADULT_CSV")
    or next(
        (p for p in (REPO_ROOT / ".data" / "adult.csv",) if p.exists()),
        REPO_ROOT.parent / "shared" / "data" / "adult.csv",
    )
)
OUTPUT_DIR = Path(os.environ.get("DP_OPERATORS_OUTPUT_DIR") or REPO_ROOT / ".demo" / "anonymity")
SPEC = REPO_ROOT / "config" / "anonymity" / "adult_anonymisation.yaml"
CHECK_SPEC = REPO_ROOT / "config" / "anonymity" / "adult_anonymised_check.yaml"
ANONYMISED = OUTPUT_DIR / "adult_anonymised.csv"
REPORT = OUTPUT_DIR / "adult_anonymised_report.json"
CHECK_REPORT = OUTPUT_DIR / "adult_anonymised_check.json"
# What is published: the quasi-identifiers (generalised) and the sensitive attribute, nothing else.
PUBLISHED_COLUMNS = [
    "age", "sex", "race", "marital_status", "education", "native_country", "workclass", "occupation", "income",
]

adult_anonymised = Asset(name="adult_anonymised", uri=ANONYMISED.resolve().as_uri())


@dag(
    dag_id="adult_anonymity_check",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    tags=["dp_operators", "anonymity", "example"],
    doc_md=__doc__,
)
def adult_anonymity_check():
    anonymise = AnonymiseOperator(
        task_id="anonymise_adult",
        spec=SPEC,
        source=str(ADULT_CSV),
        output_path=str(ANONYMISED),
        report_path=str(REPORT),
        columns=PUBLISHED_COLUMNS,
        outlets=[adult_anonymised],
    )
    check = AnonymityCheckOperator(
        task_id="check_published_adult",
        spec=CHECK_SPEC,
        source=str(ANONYMISED),
        report_path=str(CHECK_REPORT),
    )
    anonymise >> check


adult_anonymity_check_dag = adult_anonymity_check()
