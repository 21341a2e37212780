"""What a series step is charged, attacked from a worker's ledger login (ADR 33, "As built"; docs/ledger.md).

A series step after step 0 reserves 0 at its first attempt and its redraw price at any later one. Two properties
must hold whatever a worker does with its own login and spend key:

* **Another account's charges never change what this account is charged.** The first charge of a step key *on an
  account* reserves its amount, whatever attempts other accounts made of the same key (attempts are numbered across
  accounts): otherwise team B, reserving team A's future step keys on its own account (a DAG id allowed on both:
  docs/adr/0029), would make each of team A's steps a "redraw" that never happened.
* **A 0 charge is a step of a series that paid.** A run id under the series prefix must be a step's, in canonical
  form (``g01`` is not ``g1``: the same step measured again for nothing); a step needs its predecessor committed
  on the account; a step reserving 0 needs its series' step 0 committed with a charge. So no 0 charge is made with
  no step 0, with step 0 released, out of order, or on an exhausted account by a release merely named like a step.
  Either the database refuses such a reservation, or verify names it: the tests accept both.

SQLite and PostgreSQL; on PostgreSQL each team is its own login (:mod:`series_workers`).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from dp_operators.ledger import BudgetExhaustedError, ReleaseKey, Reservation
from series_workers import Workers, workers  # noqa: F401  (fixture)

REDRAW = Fraction(1, 3)
RHO = Fraction(1, 2)


def key(run_id: str, task: str = "t") -> ReleaseKey:
    return ReleaseKey("d", run_id, task, -1, "r")


def step(generation: str | int, t: int) -> str:
    return f"__dp_series__/g{generation}/step/{t:06d}"


def reserve(ledger, run_id: str, amount, takeover=REDRAW, account: str = "a", task: str = "t"):
    return ledger.reserve(key(run_id, task), account=account, amount=amount, takeover_amount=takeover,
                          mechanisms=[{"kind": "series_step", "horizon": 8}], spec_hash="0" * 64)


def refused_or_flagged(w: Workers, attempt) -> None:
    """``attempt()`` reserves and commits a 0 charge that no paid series explains: the ledger must refuse it
    (ValueError, BudgetExhaustedError: nothing charged) or verify must report it."""
    try:
        attempt()
    except (ValueError, BudgetExhaustedError):
        return
    report = w.officer.verify()
    assert not report.ok, "a 0 charge no paid series explains was accepted and dpctl ledger verify passes"


# ---- another account's attempts -----------------------------------------------------------------------------------


def test_another_accounts_charges_of_a_step_key_do_not_make_this_accounts_first_attempt_a_redraw(
        workers: Workers):
    """Team B runs its own series under the same release keys (a DAG id allowed on both accounts) and leaves step
    1 released; team A's first attempt of step 1 is still its first on account a: charged 0."""
    w = workers
    w.b.commit(reserve(w.b, step(0, 0), Fraction(1, 20), Fraction(1, 20), account="b"), {"step": 0})
    w.b.release(reserve(w.b, step(0, 1), 0, Fraction(1, 10**18), account="b"))
    w.a.commit(reserve(w.a, step(0, 0), RHO, RHO), {"step": 0})
    first = reserve(w.a, step(0, 1), 0)
    assert isinstance(first, Reservation) and first.attempt == 2  # numbered after team B's attempt
    assert first.amount == 0, f"team A's first attempt of step 1 was charged the redraw {first.amount}"
    assert w.a.account("a").spent == RHO


def test_another_team_cannot_squat_a_series_steps_or_exhaust_it(workers: Workers):
    """Team B cannot reserve steps 1-7 of a series its own account never opened (steps in order, step 0 paid);
    team A's 8 steps then cost its series' charge only."""
    w = workers
    for t in range(1, 8):
        with pytest.raises(ValueError, match="comes before step .* is committed on account 'b'"):
            reserve(w.b, step(0, t), 0, Fraction(1, 10**18), account="b")
    for t in range(8):
        reservation = reserve(w.a, step(0, t), RHO if t == 0 else 0, RHO if t == 0 else REDRAW)
        w.a.commit(reservation, {"step": t})
    assert w.a.account("a").spent == RHO
    assert w.b.account("b").spent == 0


# ---- 0 charges no paid series explains ----------------------------------------------------------------------------


def test_an_exhausted_account_releases_nothing_named_as_a_series_step(workers: Workers):
    w = workers
    w.a.commit(w.a.reserve(key("scheduled__1"), account="a", amount=3, mechanisms=[], spec_hash="0" * 64), {"v": 1})
    assert w.a.account("a").remaining == 0
    with pytest.raises(BudgetExhaustedError):  # an ordinary release, however small, is refused
        w.a.reserve(key("scheduled__2"), account="a", amount=Fraction(1, 10**18), mechanisms=[], spec_hash="0" * 64)

    def ordinary_release_disguised_as_a_step():
        w.a.commit(reserve(w.a, step(7, 1), 0, task="any_release"), {"counts": [42, 17]})

    refused_or_flagged(w, ordinary_release_disguised_as_a_step)


def test_a_step_after_step_0_is_free_only_when_step_0_paid(workers: Workers):
    w = workers

    def steps_without_step_0():
        for t in (1, 2, 3):
            w.a.commit(reserve(w.a, step(0, t), 0), {"step": t})

    refused_or_flagged(w, steps_without_step_0)


def test_a_series_whose_step_0_was_released_pays_for_its_later_steps(workers: Workers):
    w = workers
    w.a.release(reserve(w.a, step(0, 0), RHO, RHO))  # the series' charge comes back

    def steps_after_a_released_step_0():
        for t in (1, 2, 3):
            w.a.commit(reserve(w.a, step(0, t), 0), {"step": t})

    refused_or_flagged(w, steps_after_a_released_step_0)


def test_a_step_is_not_measured_again_for_nothing_under_another_spelling_of_its_generation(workers: Workers):
    w = workers
    w.a.commit(reserve(w.a, step(1, 0), RHO, RHO), {"step": 0})
    w.a.commit(reserve(w.a, step(1, 1), 0), {"step": 1})

    def the_same_step_again():
        for generation in ("01", "001"):  # int("01") == int("1"): LedgerBase.series() counts it as step 1 of g1
            w.a.commit(reserve(w.a, step(generation, 1), 0), {"step": 1})

    refused_or_flagged(w, the_same_step_again)


def test_a_free_step_follows_the_committed_step_before_it(workers: Workers):
    w = workers
    w.a.commit(reserve(w.a, step(0, 0), RHO, RHO), {"step": 0})

    def a_step_far_ahead():
        w.a.commit(reserve(w.a, step(0, 300), 0), {"step": 300})

    refused_or_flagged(w, a_step_far_ahead)
