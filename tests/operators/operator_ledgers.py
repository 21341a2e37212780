"""The ledger connection of the operator tests (import as ``from operator_ledgers import connect_ledger``)."""

from __future__ import annotations

import json
from pathlib import Path

from support import SPEND_KEY


def connect_ledger(monkeypatch, conn_id: str, db: Path | str) -> None:
    """Airflow connection ``conn_id`` (an ``AIRFLOW_CONN_*`` variable, for the test's duration) to the SQLite ledger
    file ``db``, holding the tests' spend key: what ``ledger_conn_id`` of an operator names."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{db}", "audit_key": SPEND_KEY.text}}))
