"""Does a release's charge still fit its budget account? Public parameters only; nothing is spent or reserved.

The answer is the one :func:`~dp_operators.release.run.run_release` would get from the ledger at that moment, computed
the same way: the plan of the spec on the account's accountant (:func:`plan_release`, ``plan.charge`` and
``plan.delta``), rounded up as :meth:`Ledger.reserve <dp_operators.ledger.Ledger.reserve>` rounds a charge, against
the account's remaining budget rounded down as ``reserve`` rounds it (:attr:`AccountStatus.remaining
<dp_operators.ledger.AccountStatus.remaining>` and ``remaining_delta``). So "fits" now means ``reserve`` would
succeed now, to the ledger's last unit, and "does not fit" means it would raise
:class:`~dp_operators.ledger.BudgetExhaustedError`.

It is advice, not a reservation: other releases may spend from the account between the check and the release, whose
own ``reserve`` stays the only authority. No Airflow import.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dp_operators.accounting import round_up
from dp_operators.ledger import AccountStatus, DagNotAllowedError, ReleaseKey
from dp_operators.ledger.store import LedgerBase, show
from dp_operators.release.plan import plan_release
from dp_operators.release.run import check_privacy_unit
from dp_operators.spec import ReleaseSpec

#: Why a :class:`BudgetCheck` came out as it did.
FITS, EXHAUSTED, DELTA_EXHAUSTED, REPLAY = "fits", "budget_exhausted", "delta_exhausted", "replay"
#: A run over a window whose privacy block is not open (docs/ledger.md, "Privacy blocks and team quotas").
BLOCK_NOT_OPEN = "block_not_open"
#: The charge needs an officer's approval, pending (it fits: the release waits for the decision) or rejected.
APPROVAL_REQUIRED, APPROVAL_REJECTED = "approval_required", "approval_rejected"


@dataclass(frozen=True)
class BudgetCheck:
    """The answer of :func:`check_budget`; true iff the release's charge fits (``bool(check)``).

    Attributes:
        fits: ``reserve`` would succeed now (or the release is a replay, which spends nothing), or will once a
            privacy officer grants the charge (``approval_required``: the release waits for the decision).
        reason: ``"fits"``, ``"budget_exhausted"`` (the charge exceeds the remaining budget in ``unit``),
            ``"delta_exhausted"`` (``approx_dp`` accounts: the delta part exceeds the delta left), ``"replay"``
            (the release key already has a committed output: the release returns it and spends nothing; the
            account is not read, so ``unit`` and ``remaining`` are None and ``charge`` is 0),
            ``"block_not_open"`` (a window of the run has no open privacy block), ``"approval_required"`` (fits,
            pending an officer's approval) or ``"approval_rejected"`` (an officer rejected the charge, or its
            request timed out: the release would be refused).
        release, account: the spec's release name and budget account.
        unit: the account's unit (``epsilon``, ``rho`` or ``mu_squared``).
        charge: what one run of the spec is charged, exact, in ``unit``, rounded up to the ledger's resolution.
        remaining: the account's remaining budget, exact, in ``unit``, rounded down (reservations in flight count
            as spent).
        delta_charge, delta_remaining: the delta part of the charge and the delta left, exact; ``approx_dp``
            accounts only, else None.
    """

    fits: bool
    reason: str
    release: str
    account: str
    unit: str | None
    charge: Fraction
    remaining: Fraction | None
    delta_charge: Fraction | None = None
    delta_remaining: Fraction | None = None

    def __bool__(self) -> bool:
        return self.fits

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON (XCom-safe): every amount as a float for reading and as ``<name>_exact``, the exact
        ``Fraction`` text, for comparing; None where the amount does not apply."""
        result: dict[str, Any] = {
            "fits": self.fits, "reason": self.reason, "release": self.release, "account": self.account,
            "unit": self.unit,
        }
        for name in ("charge", "remaining", "delta_charge", "delta_remaining"):
            value = getattr(self, name)
            result[name] = None if value is None else float(value)
            result[f"{name}_exact"] = None if value is None else str(value)
        return result

    def __str__(self) -> str:
        if self.reason == REPLAY:
            return f"release {self.release!r} is already committed for this task instance: a replay, it fits"
        text = (
            f"release {self.release!r} on account {self.account!r}: charge {self.unit} {_show(self.charge)}, "
            f"remaining {_show(self.remaining)}"
        )
        if self.delta_charge is not None:
            text += f"; delta charge {_show(self.delta_charge)}, delta remaining {_show(self.delta_remaining)}"
        return text + (": fits" if self.fits else f": does not fit ({self.reason})")


def check_budget(
    spec: ReleaseSpec, ledger: LedgerBase, dag_id: str, *, release_key: ReleaseKey | None = None,
    windows: list[str] | None = None,
) -> BudgetCheck:
    """Whether one run of ``spec`` by DAG ``dag_id`` fits its budget account now. Reads the ledger, writes nothing
    (no spend key needed).

    Args:
        spec: the validated release spec.
        ledger: the ledger (the spender's :class:`~dp_operators.ledger.Ledger` or any reader).
        dag_id: the DAG that will release; it must be in the account's ``allowed_dags``.
        release_key: optional: the key the release will run under. If it already has a committed output, the
            release is a replay (it spends nothing), and the check says it fits whatever the budget, as
            :func:`~dp_operators.release.run.run_release` replays before it looks at the account.
        windows: on an account with privacy blocks, the windows the run reads
            (:func:`~dp_operators.release.run.block_windows`): the check is then against the block with the least
            left (``account`` names it), and a window whose block is not open does not fit (``block_not_open``).
            On an account with team quotas the check is against the account's cap and the DAG's team quota,
            whichever has less left.

    Raises:
        AccountNotFoundError: the ledger has no account ``spec.budget_account``.
        LedgerNotInitialisedError: the ledger has no schema.
        ReleaseConfigError: the account is for another privacy unit than the spec's.
        DagNotAllowedError: ``dag_id`` may not spend from the account.
        IncompatibleAccountantError: a mechanism of the spec cannot be charged to the account's accountant.
    """
    if release_key is not None and ledger.stored_output(release_key, spec.budget_account) is not None:
        return BudgetCheck(
            fits=True, reason=REPLAY, release=spec.release, account=spec.budget_account, unit=None,
            charge=Fraction(0), remaining=None,
        )
    account = ledger.account(spec.budget_account)
    _check_account(spec, account, dag_id)
    plan = plan_release(spec, accountant=account.accountant)
    # rounded as Ledger.reserve rounds the amounts run_release passes it
    charge = round_up(plan.charge(account.accountant))
    charged = _charged_accounts(spec, ledger, account, dag_id, windows)
    if charged is None:
        return BudgetCheck(
            fits=False, reason=BLOCK_NOT_OPEN, release=spec.release, account=spec.budget_account, unit=account.unit,
            charge=charge, remaining=Fraction(0),
        )
    account = min(charged, key=lambda member: member.remaining)  # the one that decides whether the run fits
    remaining = account.remaining
    remaining_delta = min((member.remaining_delta for member in charged if member.remaining_delta is not None),
                          default=None)  # None unless approx_dp: only there is delta spent
    delta_charge = None if remaining_delta is None else round_up(plan.delta(account.accountant))
    if charge > remaining:
        reason = EXHAUSTED
    elif delta_charge is not None and delta_charge > remaining_delta:
        reason = DELTA_EXHAUSTED
    else:
        reason = _approval(ledger, account, charge, remaining, release_key)
    return BudgetCheck(
        fits=reason in (FITS, APPROVAL_REQUIRED), reason=reason, release=spec.release, account=account.name, unit=account.unit,
        charge=charge, remaining=remaining, delta_charge=delta_charge, delta_remaining=remaining_delta,
    )


def _approval(ledger: LedgerBase, account: AccountStatus, charge: Fraction, remaining: Fraction,
              release_key: ReleaseKey | None) -> str:
    """``fits``, or what the account's approval policy makes of the charge (docs/ledger.md, "Approval before a
    large charge"): ``approval_required`` (the release will wait for an officer: it fits, and the gate lets it go
    on to file its request), ``approval_rejected`` (an officer rejected it, or its request timed out: it will be
    refused). The amount rules only: a change of mechanism is the release's to find."""
    from dp_operators.ledger import approvals

    policy = approvals.policy_of(ledger.account_config(account.name))
    if policy is None or not approvals.approval_reasons(policy, charge, max(remaining, Fraction(0))):
        return FITS
    if release_key is None:
        return APPROVAL_REQUIRED
    state = ledger.approval_state(account.name, release_key, charge)
    if state is None:
        return FITS
    return {"granted": FITS, "rejected": APPROVAL_REJECTED}.get(state["state"], APPROVAL_REQUIRED)


def _charged_accounts(
    spec: ReleaseSpec, ledger: LedgerBase, account: AccountStatus, dag_id: str, windows: list[str] | None
) -> list[AccountStatus] | None:
    """The accounts a run's charge would touch (docs/ledger.md, "Privacy blocks and team quotas"): the account; or
    the blocks of ``windows`` (``None`` if one is not open); or the account and the DAG's team quota.

    Raises:
        ReleaseConfigError: the account has privacy blocks and no ``windows`` were given.
    """
    from dp_operators.ledger.errors import AccountNotFoundError
    from dp_operators.ledger.structure import block_account, quota_account, quota_team
    from dp_operators.release.errors import ReleaseConfigError

    kind, detail = ledger.structure(account.name)
    if kind == "blocks":
        if not windows:
            raise ReleaseConfigError(
                f"budget account {account.name!r} has privacy blocks: the check needs the windows the run reads "
                "(from its data interval or partition key)"
            )
        try:
            return [ledger.account(block_account(account.name, window)) for window in windows]
        except AccountNotFoundError:
            return None
    if kind == "quotas":
        team = quota_team(detail, dag_id)
        if team is not None:
            return [account, ledger.account(quota_account(account.name, team))]
    return [account]


def _check_account(spec: ReleaseSpec, account: AccountStatus, dag_id: str) -> None:
    """The configuration refusals a release would meet on ``account`` (run_release's and reserve's words)."""
    check_privacy_unit(spec, account)
    if dag_id not in account.allowed_dags:
        raise DagNotAllowedError.of(dag_id, account.name, list(account.allowed_dags))


def _show(value: Fraction | None) -> str:
    return "-" if value is None else show(value)
