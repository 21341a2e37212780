"""`dpctl ledger show` (LedgerBase.series) and the dashboard's series section show every committed measurement of a
series' steps.

The database accepts a step's run id with its generation written with leading zeros (``__dp_series__/g01/...`` for
``g1``): another release key, so the same step of the same series is committed again, charged 0.
``LedgerBase.series()`` reads the generation as a number and counts distinct step numbers, so steps 0, 1, 1, 1
show as "steps done 2, redraws 0"; the dashboard lists one row per spelling, each "generation 1". Either the ledger
refuses the second spelling, or both summaries count every committed step measurement. SQLite and PostgreSQL (on
PostgreSQL as team A's login: :mod:`series_workers`).
"""

from __future__ import annotations

from fractions import Fraction

from dp_operators.dashboard.queries import account_detail
from dp_operators.ledger import ReleaseKey
from series_workers import Workers, workers  # noqa: F401  (fixture)


def reserve(ledger, run_id: str, amount, takeover):
    return ledger.reserve(ReleaseKey("d", run_id, "t", -1, "r"), account="a", amount=amount,
                          takeover_amount=takeover, mechanisms=[{"kind": "series_step", "horizon": 8}],
                          spec_hash="0" * 64)


def test_every_committed_step_measurement_is_shown(workers: Workers):
    w = workers
    w.a.commit(reserve(w.a, "__dp_series__/g1/step/000000", Fraction(1, 2), Fraction(1, 2)), {"step": 0})
    w.a.commit(reserve(w.a, "__dp_series__/g1/step/000001", 0, Fraction(1, 3)), {"step": 1})
    committed = 2
    for generation in ("01", "001"):
        try:
            w.a.commit(reserve(w.a, f"__dp_series__/g{generation}/step/000001", 0, Fraction(1, 3)), {"step": 1})
        except ValueError:
            continue  # refused: one spelling of a generation
        committed += 1
    shown = sum(entry["steps_committed"] + entry["redraws"] for entry in w.a.series("a"))
    assert shown == committed, f"{committed} step measurements committed, dpctl ledger show counts {shown}"
    dashboard = account_detail(w.officer, "a")["series"]
    assert sum(entry["steps_committed"] + entry["redraws"] for entry in dashboard) == committed
    assert len({entry["generation"] for entry in dashboard}) == len(dashboard), \
        "the dashboard lists several series under one generation number"
