"""The persisted privacy-budget ledger (SQLAlchemy Core over SQLite or PostgreSQL; no Airflow import).

Two ways in (docs/adr/0020): :class:`Ledger`, the spender tasks use (reserve, commit, release, read), and
:class:`LedgerGovernor`, the privacy officer's (schema, accounts, caps, verify).

The names below are imported on first use (PEP 562 module ``__getattr__``): ``from dp_operators.ledger import
Ledger`` works as always, but importing the package (or only its errors and keys) does not load SQLAlchemy or the
configuration models, so ``dpctl --help`` and commands that never open a ledger start quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dp_operators._lazy import lazy_attributes
from dp_operators.ledger.errors import (
    AccountNotFoundError,
    AmbiguousReleaseKeyError,
    AuditChainError,
    BoundingNotEnforcedError,
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    LeaseHeldError,
    LedgerAccessError,
    LedgerError,
    LedgerKeyError,
    LedgerNotInitialisedError,
    RoleNotAllowedError,
)
from dp_operators.ledger.keys import AuditKey, Keyring

if TYPE_CHECKING:
    from dp_operators.ledger.chain import canonical_json
    from dp_operators.ledger.config import AccountConfig, LedgerConfig, LedgerConfigError, load_ledger_config
    from dp_operators.ledger.govern import LedgerGovernor
    from dp_operators.ledger.spend import Ledger
    from dp_operators.ledger.store import AccountStatus, ReleaseKey, Reservation

#: Public name -> the submodule defining it, imported on first access.
_LAZY = {
    "canonical_json": "chain",
    "AccountConfig": "config",
    "LedgerConfig": "config",
    "LedgerConfigError": "config",
    "load_ledger_config": "config",
    "LedgerGovernor": "govern",
    "Ledger": "spend",
    "AccountStatus": "store",
    "ReleaseKey": "store",
    "Reservation": "store",
}

__all__ = [
    "AmbiguousReleaseKeyError",
    "AccountConfig",
    "AccountNotFoundError",
    "AccountStatus",
    "AuditChainError",
    "AuditKey",
    "BoundingNotEnforcedError",
    "BudgetExhaustedError",
    "ChargeStateError",
    "DagNotAllowedError",
    "Keyring",
    "LeaseHeldError",
    "Ledger",
    "LedgerAccessError",
    "LedgerConfig",
    "LedgerConfigError",
    "LedgerError",
    "LedgerGovernor",
    "LedgerKeyError",
    "LedgerNotInitialisedError",
    "ReleaseKey",
    "Reservation",
    "RoleNotAllowedError",
    "canonical_json",
    "load_ledger_config",
]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
