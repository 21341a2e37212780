"""A series is charged once, at step 0, for the measurement its step-0 spec plans (rho, mechanism, horizon,
participation, per-step sensitivity, the public keys in their order). A later step must measure under those same
public parameters: a spec edited mid-series (rho raised, another mechanism, keys reordered, a smaller k, a longer
horizon) changes the noise of the steps after it, which nobody pays for, and the stored draws of earlier steps are
then decoded under the wrong strategy or attached to another key. Such a step must be refused before it reads data
or charges (a new series needs a new release name, or after_horizon)."""

from __future__ import annotations

import datetime as dt

import pytest

from dp_operators.continual.run import StepRun, run_series_step
from dp_operators.continual.state import SeriesKey
from dp_operators.ledger import ReleaseKey
from dp_operators.release import ReleaseConfigError
from dp_operators.spec import parse_spec
from ledger_backends import account_config, ledger_url, ledger_with, pg_database  # noqa: F401  (fixtures)

KEY = SeriesKey(bytes(range(32)))
BASE = ReleaseKey("d", "unused", "release", -1, "daily_flights")
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)


def spec(rho: str = "1", mechanism: str = "sqrt_factorization", keys: str = "[EWR, JFK, LGA]", max_steps: int = 2,
         horizon: int = 8):
    return parse_spec(
        "version: 1\nrelease: daily_flights\nbudget_account: a\nprivacy_unit: person\n"
        f"series: {{horizon: {horizon}, mechanism: {mechanism}, participation: {{max_steps: {max_steps}}}}}\n"
        f"aggregates:\n  - {{name: flights, kind: count, group_by: [origin], keys: {{origin: {keys}}}, "
        f"mechanism: auto, budget: {{rho: {rho}}}}}\n", source="s.yaml")


def day(index: int) -> StepRun:
    return StepRun(f"scheduled__{(START + index * DAY).date()}", START + index * DAY, START + (index + 1) * DAY)


def totals(index: int) -> dict:
    return {"flights": [{"origin": "EWR", "count": 10 * (index + 1)}, {"origin": "JFK", "count": 3 * (index + 1)}]}


@pytest.mark.parametrize("edited", [
    pytest.param(spec(rho="1000"), id="rho raised 1000-fold"),
    pytest.param(spec(mechanism="summed_increments"), id="another mechanism"),
    pytest.param(spec(keys="[LGA, JFK, EWR]"), id="keys reordered"),
    pytest.param(spec(max_steps=1), id="fewer steps per unit"),
    pytest.param(spec(horizon=16), id="a longer horizon"),
])
def test_a_step_under_an_edited_spec_is_refused_before_reading_or_charging(ledger_url, edited):
    ledger = ledger_with(ledger_url, a=account_config("zcdp", cap=3))
    for index in range(2):
        run_series_step(spec(), lambda index=index: totals(index), ledger, BASE, day(index), series_key=KEY,
                        spec_hash="0" * 64)
    charges = len(list(ledger.charges()))
    with pytest.raises(ReleaseConfigError):
        run_series_step(edited, lambda: pytest.fail("a step under other parameters reads no data"), ledger, BASE,
                        day(2), series_key=KEY, spec_hash="1" * 64)
    assert len(list(ledger.charges())) == charges and ledger.account("a").spent == 1
