"""A charge under a series' run id prefix that is not one of its steps must not stop the series for good.

A series reads its steps as every committed charge of its release key whose run id starts with ``__dp_series__/``
(:meth:`Ledger.authenticated_outputs`), and refuses to go on when one of them is not a step (``AuditChainError``,
"the ledger was altered ... a privacy officer runs `dpctl ledger verify`"). The database accepts any run id, so one
reservation and commit of a worker of the account under ``__dp_series__/junk`` (charged 10^-18) makes every later
step of the series fail, for ever (committed charges are kept), and verify, which the error sends the officer to,
passes. Either the ledger refuses a run id under the series prefix that is not a step key, or the series goes on.

Another team's login cannot do it where ``allowed_roles`` separates the accounts (the steps are read on the
series' account only); a worker of the account, or of an account without ``allowed_roles``, can. SQLite and
PostgreSQL (on PostgreSQL as team A's login: :mod:`series_workers`).
"""

from __future__ import annotations

import datetime as dt
from fractions import Fraction

from dp_operators.continual.run import StepRun, run_series_step
from dp_operators.continual.state import SeriesKey
from dp_operators.ledger import ReleaseKey
from dp_operators.spec import parse_spec
from series_workers import Workers, workers  # noqa: F401  (fixture)

SERIES_KEY = SeriesKey(bytes(range(32)))
BASE = ReleaseKey("d", "unused", "release", -1, "daily_flights")
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)
SPEC = parse_spec(
    "version: 1\nrelease: daily_flights\nbudget_account: a\nprivacy_unit: person\n"
    "series: {horizon: 8, after_horizon: refuse, mechanism: auto}\n"
    "aggregates:\n  - {name: flights, kind: count, group_by: [origin], keys: {origin: [EWR, JFK, LGA]}, "
    "mechanism: auto, budget: {rho: 1}}\n", source="s.yaml")


def step(ledger, index: int):
    run = StepRun(f"scheduled__{(START + index * DAY).date()}", START + index * DAY, START + (index + 1) * DAY)
    totals = {"flights": [{"origin": "EWR", "count": 10 * (index + 1)}, {"origin": "JFK", "count": index + 1}]}
    return run_series_step(SPEC, lambda: totals, ledger, BASE, run, series_key=SERIES_KEY, spec_hash="0" * 64)


def test_a_charge_under_the_series_prefix_that_is_no_step_does_not_stop_the_series(workers: Workers):
    w = workers
    step(w.a, 0)
    junk = ReleaseKey(BASE.dag_id, "__dp_series__/junk", BASE.task_id, BASE.map_index, BASE.release_name)
    try:
        reservation = w.a.reserve(junk, account="a", amount=Fraction(1, 10**18), mechanisms=[], spec_hash="0" * 64)
        w.a.commit(reservation, {"not": "a step"})
    except ValueError:
        return  # refused: a run id under the series prefix is a step key or nothing
    assert step(w.a, 1).output["series"]["step"] == 1
