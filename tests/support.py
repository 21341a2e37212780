"""Helpers shared by the test modules (import as ``from support import ...``; ``tests/`` is on pytest's pythonpath).

Kept out of ``conftest.py`` so that several conftest files in sub-folders never shadow each other's names.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from dp_operators.ledger import AccountConfig, Ledger, LedgerConfig

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
EXAMPLE_SPEC = REPO / "config" / "releases" / "adult_census.yaml"


def make_ledger(path: Path, *, cap="1/2", accountant="zcdp", dags=("adult_census_release",), account="census_adult"):
    """A fresh SQLite ledger at ``path`` with one account."""
    ledger = Ledger(f"sqlite:///{path}")
    ledger.init_schema()
    ledger.apply_config(
        LedgerConfig(
            version=1,
            accounts={
                account: AccountConfig(
                    accountant=accountant,
                    cap=Fraction(cap),
                    delta=Fraction(1, 10**6) if accountant == "zcdp" else None,
                    privacy_unit="person",
                    allowed_dags=list(dags),
                )
            },
        )
    )
    return ledger
