"""The persisted privacy-budget ledger (SQLAlchemy Core over SQLite or PostgreSQL; no Airflow import).

Two ways in (docs/adr/0020): :class:`Ledger`, the spender tasks use (reserve, commit, release, read), and
:class:`LedgerGovernor`, the privacy officer's (schema, accounts, caps, verify).
"""

from __future__ import annotations

from dp_operators.ledger.chain import AuditChainError, canonical_json
from dp_operators.ledger.config import AccountConfig, LedgerConfig, LedgerConfigError, load_ledger_config
from dp_operators.ledger.errors import (
    AccountNotFoundError,
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    LeaseHeldError,
    LedgerError,
    LedgerKeyError,
    LedgerNotInitialisedError,
)
from dp_operators.ledger.govern import LedgerGovernor
from dp_operators.ledger.keys import AuditKey, Keyring
from dp_operators.ledger.spend import Ledger
from dp_operators.ledger.store import AccountStatus, ReleaseKey, Reservation

__all__ = [
    "AccountConfig",
    "AccountNotFoundError",
    "AccountStatus",
    "AuditChainError",
    "AuditKey",
    "BudgetExhaustedError",
    "ChargeStateError",
    "DagNotAllowedError",
    "Keyring",
    "LeaseHeldError",
    "Ledger",
    "LedgerConfig",
    "LedgerConfigError",
    "LedgerError",
    "LedgerGovernor",
    "LedgerKeyError",
    "LedgerNotInitialisedError",
    "ReleaseKey",
    "Reservation",
    "canonical_json",
    "load_ledger_config",
]
