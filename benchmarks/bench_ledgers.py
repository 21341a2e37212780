"""The throwaway ledger the benchmarks charge: imported by the scripts beside it (``python benchmarks/X.py`` puts
this folder on ``sys.path``)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path


def pure_dp_ledger(path: Path, *, account: str, dag_id: str, cap: Fraction):
    """A fresh SQLite ledger at ``path`` with one pure-DP ``account`` (epsilon ``cap``) allowing ``dag_id``; returns
    the spender's :class:`~dp_operators.ledger.Ledger` (fresh keys each call)."""
    from dp_operators.ledger import AccountConfig, AuditKey, Ledger, LedgerConfig, LedgerGovernor

    spend_key = AuditKey.generate()
    url = f"sqlite:///{path}"
    officer = LedgerGovernor(url, governor_key=AuditKey.generate(), spend_key=spend_key)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={account: AccountConfig(
        accountant="pure_dp", cap=cap, privacy_unit="person", allowed_dags=[dag_id])}))
    return Ledger(url, audit_key=spend_key)
