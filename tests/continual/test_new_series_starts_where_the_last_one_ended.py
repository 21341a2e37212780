"""after_horizon: new_series. The upstream returns running totals "from the series' start": for generation g + 1 that
start must be a public, predictable point, the end of generation g's last step, or the upstream cannot restart its
totals there. Today the first step of a new generation is not checked against the last step at all: a run after a
gap (or for any interval not yet released) silently opens generation g + 1. An upstream that keeps counting from the
first generation's start (as dags/nycflights_series_release.py and tests/continual/test_series_steps.py's totals()
do) then carries every unit's earlier contributions into generation g + 1's first increment: at T = 365, k = 1, a
unit in both years makes generation 1 4-rho-zCDP while it is charged rho (k = 7: 4.3 rho)."""

from __future__ import annotations

import datetime as dt

import pytest

from dp_operators.continual.run import SeriesOrderError, StepRun, run_series_step
from dp_operators.continual.state import SeriesKey
from dp_operators.ledger import ReleaseKey
from dp_operators.spec import parse_spec
from ledger_backends import account_config, ledger_url, ledger_with, pg_database  # noqa: F401  (fixtures)

KEY = SeriesKey(bytes(range(32)))
BASE = ReleaseKey("d", "unused", "release", -1, "daily_flights")
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)
SPEC = parse_spec(
    "version: 1\nrelease: daily_flights\nbudget_account: a\nprivacy_unit: person\n"
    "series: {horizon: 2, after_horizon: new_series}\n"
    "aggregates:\n  - {name: flights, kind: count, group_by: [origin], keys: {origin: [EWR, JFK]}, "
    "mechanism: auto, budget: {rho: 1}}\n", source="s.yaml")


def day(index: int) -> StepRun:
    return StepRun(f"scheduled__{(START + index * DAY).date()}", START + index * DAY, START + (index + 1) * DAY)


def test_a_new_generation_after_a_gap_is_refused_before_reading_or_charging(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("zcdp", cap=3))
    for index in range(2):  # generation 0: days 0 and 1
        run_series_step(SPEC, lambda index=index: {"flights": [{"origin": "EWR", "count": index + 1}]}, ledger,
                        BASE, day(index), series_key=KEY, spec_hash="0" * 64)
    with pytest.raises(SeriesOrderError, match="gap"):  # day 5: days 2 to 4 were never released
        run_series_step(SPEC, lambda: pytest.fail("read"), ledger, BASE, day(5), series_key=KEY,
                        spec_hash="0" * 64)
    assert ledger.account("a").spent == 1 and len(list(ledger.charges())) == 2
