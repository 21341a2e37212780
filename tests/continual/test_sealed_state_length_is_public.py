"""A step's sealed noise sits in the committed output, where the ledger's reader role sees it (ADR 33: "ciphertext it
cannot open"). AES-GCM hides the draws but not their length, and the plaintext is the draws as decimal JSON: its
length is the number of digits and minus signs of the noise. For a one-key square-root series at rho = 1 the base64
state is 48 characters instead of 52 about 2 % of the time, exactly when the step-0 draw is within about
[-1e5, 1e6) lattice units (0.06 counts): the reader then recovers the true step-0 total from the published one every
time (in a simulation of 20,000 step-0 draws, 445 fell in the short class and all 445 gave the true total). The
stored length must be a function of public parameters only (the cells and measurements of the step), whatever the
draws."""

from __future__ import annotations

import base64
import datetime as dt

import numpy as np
import pytest

import dp_operators.continual.run as run_module
from dp_operators.continual.run import STATE_FIELD, StepRun, committed_steps, run_series_step
from dp_operators.continual.state import SeriesKey
from dp_operators.ledger import ReleaseKey
from dp_operators.spec import parse_spec
from ledger_backends import account_config, ledger_url, ledger_with, pg_database  # noqa: F401  (fixtures)

KEY = SeriesKey(bytes(range(32)))
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
SPEC = parse_spec(
    "version: 1\nrelease: daily_flights\nbudget_account: a\nprivacy_unit: person\nseries: {horizon: 8}\n"
    "aggregates:\n  - {name: flights, kind: count, group_by: [origin], keys: {origin: [EWR]}, mechanism: auto, "
    "budget: {rho: 1}}\n", source="s.yaml")


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_the_stored_state_has_the_same_length_whatever_the_draws(ledger_url, monkeypatch):
    ledger = ledger_with(ledger_url, a=account_config("zcdp", cap=10))
    lengths = []
    for index, draw in enumerate([3, -20_355_307, 999_999, -12]):  # the series' own draws; one per base below
        monkeypatch.setattr(run_module, "sample_discrete_gaussian_array",
                            lambda sigma2, size, draw=draw: np.full(size, draw, dtype=np.int64))
        base = ReleaseKey("d", "unused", f"release_{index}", -1, "daily_flights")
        run_series_step(SPEC, lambda: {"flights": [{"origin": "EWR", "count": 1000}]}, ledger, base,
                        StepRun("scheduled__2013-01-01", START, START + dt.timedelta(days=1)), series_key=KEY,
                        spec_hash="0" * 64)
        (step,) = committed_steps(ledger, base, "a").steps
        lengths.append(len(base64.b64decode(step[STATE_FIELD]["sealed"])))
    assert len(set(lengths)) == 1, f"sealed state lengths {lengths} reveal the draws' sizes"
