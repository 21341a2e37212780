"""The persisted privacy-budget ledger (SQLAlchemy Core over SQLite or PostgreSQL; no Airflow import)."""

from __future__ import annotations

from dp_operators.ledger.config import AccountConfig, LedgerConfig, LedgerConfigError, load_ledger_config
from dp_operators.ledger.errors import (
    AccountNotFoundError,
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    LedgerError,
    LedgerNotInitialisedError,
)
from dp_operators.ledger.store import AccountStatus, Ledger, ReleaseKey, Reservation, canonical_json

__all__ = [
    "AccountConfig",
    "AccountNotFoundError",
    "AccountStatus",
    "BudgetExhaustedError",
    "ChargeStateError",
    "DagNotAllowedError",
    "Ledger",
    "LedgerConfig",
    "LedgerConfigError",
    "LedgerError",
    "LedgerNotInitialisedError",
    "ReleaseKey",
    "Reservation",
    "canonical_json",
    "load_ledger_config",
]
