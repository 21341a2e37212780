"""Ledger refusals and failures. Every refusal depends on public parameters only (spec, budget, configuration)."""

from __future__ import annotations

from fractions import Fraction


class LedgerError(RuntimeError):
    """Base class of ledger errors."""


class LedgerNotInitialisedError(LedgerError):
    """The ledger database has no schema; run ``dpctl ledger init``."""


class AccountNotFoundError(LedgerError):
    """The spec names a budget account the ledger does not hold; a privacy officer runs ``dpctl ledger apply``."""


class DagNotAllowedError(LedgerError):
    """The DAG is not in the account's ``allowed_dags``."""

    @classmethod
    def of(cls, dag_id: str, account: str, allowed: list) -> DagNotAllowedError:
        """The refusal of ``dag_id`` on ``account`` (whose ``allowed_dags`` is ``allowed``), in the one wording
        the reservation and the budget gate share."""
        return cls(
            f"DAG {dag_id!r} may not spend from budget account {account!r} (allowed: {list(allowed)}); a privacy "
            "officer adds it to allowed_dags and runs 'dpctl ledger apply'"
        )


class RoleNotAllowedError(LedgerError):
    """The connection's database role (PostgreSQL ``session_user``) is not a member of any role in the account's
    ``allowed_roles``: the database refused the spend and nothing was written (not even a ``refused`` event).

    Attributes:
        account: the budget account; role: the session's role; allowed: the account's ``allowed_roles``.
    """

    def __init__(self, message: str, *, account: str, role: str, allowed: object) -> None:
        super().__init__(message)
        self.account, self.role, self.allowed = account, role, allowed

    @classmethod
    def of(cls, account: str, role: str, allowed: object) -> RoleNotAllowedError:
        """The refusal of ``role`` on ``account`` (whose ``allowed_roles`` is ``allowed``)."""
        return cls(
            f"budget account {account!r} may be spent only by members of the database roles {allowed}; this "
            f"connection's role {role!r} is a member of none of them, so the database refused and nothing was "
            "written. Give the team's workers a login role that is a member of one of those roles (GRANT role TO "
            "login), or have a privacy officer change the account's allowed_roles and run 'dpctl ledger apply'",
            account=account, role=role, allowed=allowed,
        )


class BudgetExhaustedError(LedgerError):
    """The requested charge exceeds the remaining budget.

    Attributes:
        account, unit: the budget account and its unit (``epsilon`` or ``rho``).
        requested, remaining: exact amounts; ``difference = requested - remaining``.
        note: (argument) what the charge was for, when the caller knows more than the ledger (a series' redraw).
    """

    def __init__(self, account: str, unit: str, requested: Fraction, remaining: Fraction, *,
                 note: str | None = None) -> None:
        self.account, self.unit = account, unit
        self.requested, self.remaining = requested, remaining
        self.difference = requested - remaining
        # a delta short of the charge's is not an exhausted budget: the epsilon may have room for other releases
        state = "has too little delta left for this charge" if unit == "delta" else "is exhausted"
        cap = "its delta" if unit == "delta" else "the cap"
        super().__init__(
            f"budget account {account!r} {state}: requested {unit} {_show(requested)}, "
            f"remaining {_show(remaining)}, short by {_show(self.difference)}. "
            + (f"{note}. " if note else "")
            + f"Nothing was reserved and no noise was drawn. A privacy officer can raise {cap} in the ledger "
            "configuration and run 'dpctl ledger apply'; retrying will not help."
            + (" A release's delta comes from its partition selection (and (epsilon, delta) budgets): a smaller "
               "delta there lowers it." if unit == "delta" else "")
        )


class ChargeStateError(LedgerError):
    """A charge was not in the state an operation needs (e.g. committing a charge that was abandoned)."""


def _show(value: Fraction) -> str:
    exact = str(value)
    decimal = f"{float(value):.6g}"
    return decimal if Fraction(decimal) == value else f"{exact} (~{decimal})"


class LeaseHeldError(LedgerError):
    """Another attempt of the same release key holds a live lease on its reservation (it is still drawing).
    Nothing was charged. Transient: retry after ``expires_at`` (the owner renews the lease while it runs; a dead
    owner's lease expires and the next attempt takes the release over).

    Attributes:
        attempt: the holding attempt's number; expires_at: when its lease ends unless renewed (UTC).
    """

    def __init__(self, message: str, *, attempt: int, expires_at) -> None:
        super().__init__(message)
        self.attempt, self.expires_at = attempt, expires_at


class AmbiguousReleaseKeyError(LedgerError):
    """A release key committed on several accounts was looked up without naming the account."""


class LedgerAccessError(LedgerError):
    """The database refused this login a ledger call (PostgreSQL ``insufficient_privilege``): its role is not the
    spender (or a member of it), or the grants were not re-run after ``dpctl ledger init``; or a SQLite ledger file
    this process may read but not write. Nothing was written; no retry helps."""


class LedgerKeyError(LedgerError):
    """The audit key is missing or is not the key the account accepts (rotated); nothing was changed."""


class AuditChainError(LedgerError):
    """The ledger holds a row it did not write (an audit row at the next sequence number, a running total or amount
    that is not a number the ledger stores): nothing was changed; a privacy officer runs ``dpctl ledger verify``."""


class UnreadableValueError(AuditChainError):
    """A stored value is outside what the ledger writes and its readers accept (:mod:`dp_operators.ledger.bounded`:
    a number not in ``str(Fraction)`` form or over its digit bound, JSON text too long or nested too deep, a value
    of the wrong type): it was written around the ledger. Nothing was changed.

    Attributes:
        table: the table (``dp_charges``, ``dp_budget_accounts``, ``dp_audit_events``).
        row: the row's id, or the account's name for ``dp_budget_accounts``.
        column: the column holding the value.
        reason: what is wrong, in words (never more than a few characters of the value).
        detail: the column, the value cut short when it is shown, and the reason (``amount '1e-9' is not ...``).

    Args:
        value: the value, shown cut to about 60 characters in the message (numbers and short text); ``None``: not
            shown (JSON text, whose first characters say little).
    """

    def __init__(self, table: str, row: object, column: str, reason: str, *, value: object = None) -> None:
        from dp_operators.ledger.bounded import shown

        self.table, self.row, self.column, self.reason = table, row, column, reason
        self.detail = f"{column}{'' if value is None else ' ' + shown(value, 60)} {reason}"
        super().__init__(
            f"{self.where}: {self.detail} (written outside the ledger); nothing was changed. A privacy officer runs "
            "'dpctl ledger verify'"
        )

    @property
    def where(self) -> str:
        """The row as messages name it: ``dp_charges id=5`` or ``dp_budget_accounts 'census'``."""
        from dp_operators.ledger.bounded import shown

        return f"{self.table} id={self.row}" if isinstance(self.row, int) else f"{self.table} {shown(self.row)}"


def stored_fraction(text: object, what: str) -> Fraction:
    """Parse an exact number as the ledger stores it: ``str(Fraction)`` with at most
    :data:`~dp_operators.ledger.bounded.MAX_DIGITS` digits above and below the line, checked on the text before any
    number is built (``Fraction("1e-999999999")`` never returns).

    Raises:
        AuditChainError: anything else (a decimal, an exponent, a huge or non-numeric text), naming ``what``.
    """
    from dp_operators.ledger.bounded import BoundsError, read_number, shown

    try:
        return read_number(text)
    except BoundsError as error:
        raise AuditChainError(
            f"{what} is {shown(text)}, not a number the ledger writes: it {error} (edited outside the ledger); "
            "nothing was changed. A privacy officer runs 'dpctl ledger verify'"
        ) from None


class ApprovalRequiredError(LedgerError):
    """The account's approval policy (``approval`` in ``ledgers.yaml``) requires a privacy officer's approval of
    this charge, and there is none yet: nothing was reserved. Transient: the release operator files a request
    (:meth:`~dp_operators.ledger.spend.Ledger.request_approval`, once per release key) and waits for the decision
    (``dpctl ledger approve``).

    Attributes:
        account: the account whose policy requires it; amount: the charge; reasons: why (``above``,
        ``above_fraction_of_remaining``, ``mechanism_change``); remaining: the account's remaining budget before the
        charge (text); request: the pending request (``{"request": seq, "requested_at": iso, "expires_at": iso}``)
        or ``None`` when none was filed yet.
    """

    def __init__(self, message: str, *, account: str, amount: object, reasons: list, remaining: object = None,
                 request: dict | None = None) -> None:
        super().__init__(message)
        self.account, self.amount, self.reasons = account, amount, list(reasons)
        self.remaining, self.request = remaining, request


class ApprovalRejectedError(LedgerError):
    """A privacy officer rejected the charge (or its request timed out, ``reason == "timeout"``): nothing was
    reserved. Permanent for this release key and spec.

    Attributes:
        account; request: the request's sequence number on the account; reason: ``"rejected"`` or ``"timeout"``;
        note: the officer's reason, if any.
    """

    def __init__(self, message: str, *, account: str, request: object = None, reason: str = "rejected",
                 note: str | None = None) -> None:
        super().__init__(message)
        self.account, self.request, self.reason, self.note = account, request, reason, note


class BoundingNotEnforcedError(LedgerError):
    """The account requires enforced contribution bounding (``require_enforced_bounding: true`` in
    ``ledgers.yaml``) and some step of this charge only declared its bounds (a hand-written aggregate query, an
    upstream aggregate, or a charge that records no bounding): the database refused it and nothing was reserved or
    written. Permanent: retrying will not help.

    Attributes:
        account: the account that requires it (the account the release names, also for a block or a quota);
        declared: the aggregates whose bounds were only declared (empty when the charge lists no step).
    """

    def __init__(self, message: str, *, account: str, declared: list) -> None:
        super().__init__(message)
        self.account, self.declared = account, list(declared)

    @classmethod
    def of(cls, account: str, declared: list) -> BoundingNotEnforcedError:
        """The refusal of a charge on ``account`` whose aggregates ``declared`` only declared their bounds."""
        from dp_operators.ledger.structure import MAX_DECLARED_NAMED

        names = [str(name)[:70] for name in list(declared)[:MAX_DECLARED_NAMED]]
        more = len(declared) - len(names)
        which = (
            f"the contribution bounds of aggregate(s) {names}{f' and {more} more' if more > 0 else ''} were only "
            "declared, not enforced by the operator"
            if names else "the charge lists no step whose contribution bounds were enforced by the operator"
        )
        return cls(
            f"budget account {account!r} requires enforced contribution bounding, and {which}; nothing was reserved. "
            "Read the rows with the operator's table and privacy_unit_column arguments (the operator then bounds "
            "each unit's contributions itself) instead of hand-written aggregate queries or upstream aggregates, or "
            "have a privacy officer lift the requirement (require_enforced_bounding in ledgers.yaml, then 'dpctl "
            "ledger apply')",
            account=account, declared=list(declared),
        )
