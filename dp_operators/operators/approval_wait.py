"""How a release task waits for a privacy officer's approval of a large charge (docs/ledger.md, "Approval before a
large charge"): on :class:`~dp_operators.ledger.errors.ApprovalRequiredError` it files the request once per release
key (idempotent: :meth:`~dp_operators.ledger.spend.Ledger.request_approval`, with the plan the officer sees) and
waits by Airflow's reschedule, as a held lease does (ADR 31): no try spent, no triggerer. The ledger decides: a
grant lets the next run reserve; a rejection, or the request's timeout (``timeout_hours`` from the request, on the
ledger's clock), makes the next reserve raise :class:`~dp_operators.ledger.errors.ApprovalRejectedError`, which the
operator fails without a retry. Public parameters only."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction
from typing import Any, NoReturn

from dp_operators.ledger import ReleaseKey
from dp_operators.ledger.errors import ApprovalRequiredError, BoundingNotEnforcedError
from dp_operators.operators.lease_wait import LEASE_WAIT_MARGIN, LEASE_WAIT_MIN
from dp_operators.spec.models import level_text

#: How often a waiting task looks again (at most: it wakes at the request's timeout if that comes first).
APPROVAL_POLL = dt.timedelta(minutes=5)


def approval_plan(spec: Any, accountant: str, error: ApprovalRequiredError,
                  blocks: list[tuple[str, Fraction]] | None = None,
                  bounding: dict[str, dict[str, Any]] | None = None) -> tuple[dict[str, Any], list[dict]]:
    """The plan a request shows the officer (mechanisms with their expected half-widths at the spec's confidence,
    the charge, the budget left after it) and the mechanisms as the reservation records them, each with its
    aggregate's ``contribution_bounding`` record (``bounding``, as :func:`~dp_operators.release.run_release` takes
    it; declared where absent). Public parameters
    only: the plan is the spec's, no data is read. ``blocks``: on an account with privacy blocks, each window the
    run reads with its block's remaining budget; the plan then lists them, and ``remaining_after`` is the least
    any of them keeps (the run's release key and spec fix its windows, so the grant covers exactly these)."""
    from dp_operators.release.plan import plan_release

    plan = plan_release(spec, accountant=accountant)
    alpha = 1 - float(spec.confidence)
    steps = []
    for step in plan.steps:
        shown_step = {"aggregate": step.aggregate, "component": step.component, "mechanism": step.mechanism}
        if step.component == "quantile":  # a quantile's accuracy is in ranks (records), not in value units
            shown_step.update(half_width=None, rank_half_width=max(step.rank_half_widths),
                              quantiles=[level_text(q) for q in step.quantiles])
            if step.epsilon_each is not None:
                shown_step["epsilon_per_quantile"] = str(step.epsilon_each)
        else:
            shown_step["half_width"] = step.half_width(alpha)
        steps.append(shown_step)
    remaining = Fraction(str(error.remaining)) if error.remaining is not None else None
    if blocks:
        remaining = min(left for _, left in blocks)
    shown = {
        "release": spec.release,
        "account": error.account,
        "charge": str(error.amount),
        "remaining_after": None if remaining is None else str(max(remaining - Fraction(str(error.amount)), 0)),
        "confidence": float(spec.confidence),
        "reasons": list(error.reasons),
        "mechanisms": steps,
    }
    if blocks:
        charge = Fraction(str(error.amount))
        shown["blocks"] = [{"window": window, "remaining_after": str(max(left - charge, 0))} for window, left in blocks]
    from dp_operators.release.run import contribution_bounding

    # the mechanisms as the reservation will record them, with each aggregate's bounding record: an account that
    # requires enforced bounding judges the request by them, and the officer sees what will be charged
    records = contribution_bounding(spec, bounding)
    return shown, [{**step.describe(), "contribution_bounding": records[step.aggregate]} for step in plan.steps]


def wait_for_approval(operator: Any, ledger: Any, key: ReleaseKey, error: ApprovalRequiredError,
                      audit: dict[str, Any], now: dt.datetime | None = None,
                      windows: list[str] | None = None) -> NoReturn:
    """File the request (once per release key and spec) and reschedule the task; raise
    ``AirflowFailException`` if the request is already rejected (or timed out)."""
    from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException

    spec = operator.release_spec
    if spec.series is not None:
        raise AirflowFailException(
            f"budget account {error.account!r} requires approval of this charge, but a series step cannot wait for "
            "one yet: raise the account's approval threshold, or release the step outside a series")
    accountant = ledger.account(error.account).accountant
    blocks = None
    if windows:
        from dp_operators.ledger.structure import block_account

        blocks = [(window, ledger.account(block_account(error.account, window)).remaining) for window in windows]
    plan, mechanisms = approval_plan(spec, accountant, error, blocks, operator.contribution_bounding())
    try:
        state = ledger.request_approval(key, account=error.account, amount=error.amount, mechanisms=mechanisms,
                                        spec_hash=operator.spec_sha256, plan=plan, audit=audit)
    except BoundingNotEnforcedError as refused:  # the account's requirement: a retry would be refused the same way
        raise AirflowFailException(f"budget account {error.account!r} refuses the approval request: {refused}; "
                                   "nothing was reserved") from None
    if state["state"] == "rejected":
        how = "rejected by timeout" if state.get("reason") == "timeout" else "rejected by a privacy officer"
        raise AirflowFailException(f"the charge of {error.amount} on budget account {error.account!r} for release "
                                   f"{key.release_name!r} was {how} (request {state.get('request')}); nothing was "
                                   "reserved")
    now = now or dt.datetime.now(dt.timezone.utc)
    wake = now + APPROVAL_POLL
    if state["state"] == "granted":
        wake = now + LEASE_WAIT_MIN
    elif state.get("expires_at"):
        expires = dt.datetime.fromisoformat(state["expires_at"])
        expires = expires if expires.tzinfo else expires.replace(tzinfo=dt.timezone.utc)
        wake = min(wake, expires + LEASE_WAIT_MARGIN)
    wake = max(wake, now + LEASE_WAIT_MIN)
    operator.log.warning(
        "budget account %r requires a privacy officer's approval of the charge of %s for release %r (%s); nothing "
        "was reserved. Request %s waits until %s ('dpctl ledger approvals', 'dpctl ledger approve %s %s'); this "
        "task looks again at %s (rescheduled, no try spent)", error.account, error.amount, key.release_name,
        ", ".join(error.reasons), state.get("request"), state.get("expires_at"), error.account, state.get("request"),
        wake.isoformat(timespec="seconds"))
    raise AirflowRescheduleException(wake)


__all__ = ["APPROVAL_POLL", "approval_plan", "wait_for_approval"]
