"""Ledger refusals and failures. Every refusal depends on public parameters only (spec, budget, configuration)."""

from __future__ import annotations

import re
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
    """

    def __init__(self, account: str, unit: str, requested: Fraction, remaining: Fraction) -> None:
        self.account, self.unit = account, unit
        self.requested, self.remaining = requested, remaining
        self.difference = requested - remaining
        super().__init__(
            f"budget account {account!r} is exhausted: requested {unit} {_show(requested)}, "
            f"remaining {_show(remaining)}, short by {_show(self.difference)}. Nothing was reserved and no noise "
            "was drawn. A privacy officer can raise the cap in the ledger configuration and run "
            "'dpctl ledger apply'; retrying will not help."
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


class LedgerKeyError(LedgerError):
    """The audit key is missing or is not the key the account accepts (rotated); nothing was changed."""


class AuditChainError(LedgerError):
    """The ledger holds a row it did not write (an audit row at the next sequence number, a running total or amount
    that is not a number the ledger stores): nothing was changed; a privacy officer runs ``dpctl ledger verify``."""


#: The only text form the ledger writes for an exact number: ``str(Fraction)`` ("3", "-1/10"), digits bounded so a
#: tampered value cannot make parsing itself expensive (``Fraction("1e-999999999")`` never returns).
_STORED_NUMBER = re.compile(r"-?[0-9]{1,400}(/[0-9]{1,400})?")


def stored_fraction(text: object, what: str) -> Fraction:
    """Parse an exact number as the ledger stores it (``str(Fraction)``).

    Raises:
        AuditChainError: anything else (a decimal, an exponent, a huge or non-numeric text), naming ``what``.
    """
    if isinstance(text, str) and _STORED_NUMBER.fullmatch(text):
        numerator, _, denominator = text.partition("/")
        if denominator and int(denominator) == 0:
            raise AuditChainError(f"{what} is {text!r}, not a number the ledger writes; run 'dpctl ledger verify'")
        return Fraction(int(numerator), int(denominator or 1))
    shown = text if not isinstance(text, str) or len(text) <= 40 else text[:40] + "..."
    raise AuditChainError(
        f"{what} is {shown!r}, not a number the ledger writes (edited outside the ledger); nothing was changed. "
        "A privacy officer runs 'dpctl ledger verify'"
    )
