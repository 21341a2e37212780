"""A release key's first attempt is charged its amount, every later attempt its takeover amount (ADR 33): a series
step reserves 0 (its series paid) and a redraw of it pays. On SQLite and PostgreSQL; the database decides which
attempt is the first, so a worker cannot take a key over for nothing."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from dp_operators.ledger import BudgetExhaustedError, Reservation, ReleaseKey
from ledger_backends import account_config, ledger_with
from support import governor, spender

KEY = ReleaseKey("d", "__dp_series__/g0/step/000003", "t", -1, "r")
DEAD_STEP = Fraction(1, 3)


ORDINARY = ReleaseKey("d", "scheduled__2026-12-06T00:00:00+00:00", "t", -1, "r")


def reserve(ledger, key: ReleaseKey = KEY, **amounts):
    return ledger.reserve(key, account="a", mechanisms=[], spec_hash="0" * 64, **amounts)


def open_series(ledger) -> None:
    """Steps 0 to 2 of the series committed (step 0 paid): step 3 is next."""
    for step in range(3):
        key = ReleaseKey("d", f"__dp_series__/g0/step/{step:06d}", "t", -1, "r")
        paid = Fraction(1, 10) if step == 0 else 0
        ledger.commit(reserve(ledger, key, amount=paid, takeover_amount=DEAD_STEP), {"step": step})


def test_a_first_attempt_may_reserve_nothing_and_a_takeover_pays_its_takeover_amount(ledger_url):
    ledger_with(ledger_url, a=account_config("zcdp", cap=1))
    first, second = spender(ledger_url, lease_seconds=0.3), spender(ledger_url)
    open_series(second)
    reservation = reserve(first, amount=0, takeover_amount=DEAD_STEP)
    assert isinstance(reservation, Reservation) and reservation.amount == 0
    assert first.account("a").spent == Fraction(1, 10)
    time.sleep(0.5)  # the first attempt's lease (0.3 s) lapses: it died, maybe after drawing noise
    taken = reserve(second, amount=0, takeover_amount=DEAD_STEP)
    assert isinstance(taken, Reservation) and taken.attempt == 2 and taken.amount == DEAD_STEP
    assert second.account("a").spent == Fraction(1, 10) + DEAD_STEP
    amounts = {c["attempt"]: (c["state"], Fraction(c["amount"])) for c in second.charges() if c["run_id"] == KEY.run_id}
    assert amounts == {1: ("abandoned", Fraction(0)), 2: ("reserved", DEAD_STEP)}
    second.commit(taken, {"value": 1})
    assert reserve(first, amount=0, takeover_amount=DEAD_STEP) == {"value": 1}  # a replay charges nothing
    assert governor(ledger_url).verify().ok


def test_a_takeover_that_the_cap_cannot_pay_is_refused(ledger_url):
    ledger_with(ledger_url, a=account_config("zcdp", cap=Fraction(1, 4)))
    first = spender(ledger_url, lease_seconds=0.3)
    open_series(first)
    assert reserve(first, amount=0, takeover_amount=DEAD_STEP).amount == 0
    time.sleep(0.5)
    with pytest.raises(BudgetExhaustedError, match=r"1/3"):
        reserve(spender(ledger_url), amount=0, takeover_amount=DEAD_STEP)


@pytest.mark.parametrize(("amount", "takeover"), [(0, None), (0, 0), (-1, DEAD_STEP), (Fraction(1, 10), 0)])
def test_nothing_is_reserved_without_a_positive_takeover_amount(ledger_url, amount, takeover):
    ledger_with(ledger_url, a=account_config("zcdp", cap=1))
    ledger = spender(ledger_url)
    with pytest.raises(ValueError, match="a charge must be > 0"):
        reserve(ledger, amount=amount, takeover_amount=takeover)
    assert list(ledger.charges()) == []


def test_without_a_takeover_amount_every_attempt_pays_the_amount(ledger_url):
    ledger_with(ledger_url, a=account_config("zcdp", cap=1))
    first = spender(ledger_url, lease_seconds=0.3)
    reserve(first, ORDINARY, amount=Fraction(1, 10))
    time.sleep(0.5)
    assert reserve(spender(ledger_url), ORDINARY, amount=Fraction(1, 10)).amount == Fraction(1, 10)
    assert spender(ledger_url).account("a").spent == Fraction(1, 5)


@pytest.mark.parametrize("run_id", ["scheduled__2026-12-06T00:00:00+00:00", "__dp_series__/g0/step/000000",
                                    "__dp_series__/g0/step/3", "__dp_series__/g0/step/000001\n"])
def test_only_a_series_step_after_the_first_may_reserve_nothing(ledger_url, run_id):
    ledger_with(ledger_url, a=account_config("zcdp", cap=1))
    ledger = spender(ledger_url)
    with pytest.raises(ValueError, match="only a series step after the first"):
        ledger.reserve(ReleaseKey("d", run_id, "t", -1, "r"), account="a", amount=0, takeover_amount=DEAD_STEP,
                       mechanisms=[], spec_hash="0" * 64)
    assert list(ledger.charges()) == []
