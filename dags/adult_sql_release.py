"""Example DAG: a differentially private release of UCI Adult statistics computed by SQL queries.

``load_adult_table`` loads the 48,842-row Adult table (four columns) into the database of the connection
``adult_sqlite``. ``release`` (a ``DPSQLReleaseOperator``) runs one ``GROUP BY`` query per aggregate of
``config/releases/adult_census.yaml`` on that connection inside its own ``execute()``, so the true aggregates go
from the database into the release engine without passing through XCom, Airflow's database or the task log; it
charges the budget account ``census_adult`` (shared with ``adult_census_release``: the same spec and release name)
and publishes JSON and CSV files, the released rows into the table ``dp_releases`` of the same database (a SQL sink
keyed by the release key), and an asset event.

The queries are portable SQL (``CASE``, ``SUM``, ``COUNT``, ``GROUP BY``): pointing ``adult_sqlite`` at a
PostgreSQL database runs them unchanged there (install the postgres provider). Neither task logs a number computed
from the table: pandas' ``to_sql`` is used for the load because ``DbApiHook.insert_rows`` logs how many rows it wrote,
and the operator reads the results through the DB-API cursor because ``DbApiHook.run`` logs the number of rows (keys)
a query returned.

Environment:
    DP_OPERATORS_ADULT_CSV: the Adult table (default: ``.data/adult.csv`` as ``make demo`` builds it, else
        ``../shared/data/adult.csv`` beside the repository).
    DP_OPERATORS_SQL_DB: the SQLite database file the table is loaded into (default ``<repo>/.demo/adult.db``):
        the connection ``adult_sqlite`` points there unless it is defined as an environment variable
        (``AIRFLOW_CONN_ADULT_SQLITE``, which this file sets to that default when it is absent; a connection defined
        only in Airflow's database is shadowed by it).
    DP_OPERATORS_OUTPUT_URI: where releases are written (default ``file://<repo>/.demo/releases``).
    The ledger: the Airflow connection ``dp_ledger_default``.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pendulum

from airflow.sdk import BaseHook, dag, task
from dp_operators.operators.sinks import SQLTableSink
from dp_operators.operators.sql import DPSQLReleaseOperator

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "config" / "releases" / "adult_census.yaml"
CONN_ID = "adult_sqlite"
RELEASE_TABLE = "dp_releases"
SQL_DB = Path(os.environ.get("DP_OPERATORS_SQL_DB", REPO / ".demo" / "adult.db"))
os.environ.setdefault(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({"conn_type": "sqlite", "host": str(SQL_DB)}))

#: The age bands of the spec's ``people_by_age_band`` keys (as in ``adult_census_release``).
AGE_BANDS = [(17, 24), (25, 34), (35, 44), (45, 54), (55, 64), (65, 74), (75, None)]
HOURS_BOUNDS = (1, 99)


def _age_band_sql() -> str:
    """``CASE WHEN age <= 24 THEN '17-24' ... ELSE '75+' END``: the band labels the spec lists as public keys."""
    whens = " ".join(f"WHEN age <= {high} THEN '{low}-{high}'" for low, high in AGE_BANDS if high is not None)
    (last,) = (low for low, high in AGE_BANDS if high is None)
    return f"CASE {whens} ELSE '{last}+' END"


LOW, HIGH = HOURS_BOUNDS
#: ``hours_per_week`` clipped to [1, 99], as the mean's bounds declare and the median's bins (one per hour) need.
CLIPPED_HOURS = (
    f"CASE WHEN hours_per_week < {LOW} THEN {LOW} WHEN hours_per_week > {HIGH} THEN {HIGH} ELSE hours_per_week END"
)
#: One query per aggregate of the spec: one row per key, value columns named as the spec's kinds need.
QUERIES = {
    "people_by_education_sex": "SELECT education, sex, COUNT(*) AS count FROM adult GROUP BY education, sex",
    "people_by_age_band": f"SELECT {_age_band_sql()} AS age_band, COUNT(*) AS count FROM adult GROUP BY 1",
    "mean_hours_per_week": f"SELECT SUM({CLIPPED_HOURS}) AS sum, COUNT(*) AS count FROM adult",
    # the median's histogram: one row per bin (its lower edge, the clipped hour) with people in it
    "median_hours_per_week": f"SELECT {CLIPPED_HOURS} AS hours_per_week, COUNT(*) AS count FROM adult GROUP BY 1",
}


def adult_csv_path() -> Path:
    """Where the Adult table is read from (see the module docstring; the same rule as ``adult_census_release``)."""
    if os.environ.get("DP_OPERATORS_ADULT_CSV"):
        return Path(os.environ["DP_OPERATORS_ADULT_CSV"])
    fetched = REPO / ".data" / "adult.csv"
    return fetched if fetched.exists() else REPO.parent / "shared" / "data" / "adult.csv"


def load_adult_table(csv_path: Path, conn_id: str = CONN_ID) -> None:
    """(Re)create the table ``adult`` (``age``, ``education``, ``sex``, ``hours_per_week``) in the database of
    ``conn_id`` from the Adult CSV, in one transaction, through the connection hook's SQLAlchemy engine."""
    import pandas as pd

    connection = BaseHook.get_connection(conn_id)
    if connection.conn_type == "sqlite" and connection.host:  # SQLite creates the file, not its folder
        Path(connection.host).parent.mkdir(parents=True, exist_ok=True)
    hook = connection.get_hook()
    table = pd.read_csv(csv_path, usecols=["age", "education", "sex", "hours_per_week"], skipinitialspace=True)
    with hook.get_sqlalchemy_engine().begin() as connection:
        table.to_sql("adult", connection, if_exists="replace", index=False)


@dag(
    dag_id="adult_sql_release",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["differential-privacy", "example", "sql"],
    doc_md=__doc__,
)
def adult_sql_release():
    @task
    def load_adult() -> None:
        load_adult_table(adult_csv_path())

    release = DPSQLReleaseOperator(
        task_id="release",
        spec_path=SPEC,
        conn_id=CONN_ID,
        queries=QUERIES,
        output_uri=os.environ.get("DP_OPERATORS_OUTPUT_URI", f"file://{REPO / '.demo' / 'releases'}"),
        # the released rows also go to a SQL table beside the source (idempotent: a replay rewrites the same rows)
        sql_sink=SQLTableSink(conn_id=CONN_ID, table=RELEASE_TABLE),
        ledger_conn_id="dp_ledger_default",
        retries=2,  # transient errors (storage, the ledger's database); a held lease waits without a try (ADR 31)
        retry_delay=timedelta(seconds=30),
    )
    load_adult() >> release


adult_sql_release()
