"""A series sum's running sums are read on grid 1 only as integers, decided by their type, in every shape the
upstream can give them (rows, an Arrow table as a Parquet reference reads, several rows of an ungrouped sum): a
decimal running sum rounded to grid 1 moves the totals at every step where its rounding flips, not only at the
steps a unit contributes to (ADR 33, "Input: running totals")."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from dp_operators.continual.run import StepRun, run_series_step
from dp_operators.continual.state import SeriesKey
from dp_operators.ledger import ReleaseKey
from dp_operators.release import ReleaseInputError
from dp_operators.release.inputs import UngroupedRows
from dp_operators.spec import parse_spec
from ledger_backends import account_config, ledger_url, ledger_with, pg_database  # noqa: F401  (fixtures)

KEY = SeriesKey(bytes(range(32)))
BASE = ReleaseKey("d", "unused", "release", -1, "daily_sums")
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
DAY = StepRun("scheduled__2013-01-01", START, START + dt.timedelta(days=1))


def spec(grouped: bool = True):
    keys = "group_by: [origin], keys: {origin: [EWR, JFK]}, " if grouped else ""
    return parse_spec(
        "version: 1\nrelease: daily_sums\nbudget_account: a\nprivacy_unit: person\n"
        "series: {horizon: 8, mechanism: auto}\n"
        f"aggregates:\n  - {{name: s, kind: sum, {keys}mechanism: auto, budget: {{rho: 1}}, bounds: [0, 1], "
        "grid: 1}\n", source="s.yaml")


@pytest.fixture
def ledger(ledger_url):
    return ledger_with(ledger_url, a=account_config("zcdp", cap=3))


def test_a_decimal_column_of_running_sums_in_a_table_is_refused_before_anything_is_charged(ledger):
    table = pa.table({"origin": ["EWR", "JFK"], "sum": pa.array([Decimal("1.50"), Decimal("0.40")],
                                                                pa.decimal128(10, 2))})
    with pytest.raises(ReleaseInputError, match="integer"):
        run_series_step(spec(), lambda: {"s": table}, ledger, BASE, DAY, series_key=KEY, spec_hash="0" * 64)
    assert list(ledger.charges()) == []


def test_an_integer_column_of_running_sums_in_a_table_is_released(ledger):
    table = pa.table({"origin": ["EWR", "JFK"], "sum": pa.array([3, 0], pa.int64())})
    output = run_series_step(spec(), lambda: {"s": table}, ledger, BASE, DAY, series_key=KEY,
                             spec_hash="0" * 64).output
    assert output["series"]["step"] == 0


def test_several_integer_rows_of_an_ungrouped_running_sum_are_released_as_one_row_is(ledger):
    """The number of rows a query returns is the data's (a stray GROUP BY): it never decides a refusal."""
    output = run_series_step(spec(grouped=False), lambda: {"s": UngroupedRows([{"sum": 2}, {"sum": 1}])}, ledger,
                             BASE, DAY, series_key=KEY, spec_hash="0" * 64).output
    assert output["series"]["step"] == 0
