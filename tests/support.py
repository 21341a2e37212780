"""Helpers shared by the test modules (import as ``from support import ...``; ``tests/`` is on pytest's pythonpath).

Kept out of ``conftest.py`` so that several conftest files in sub-folders never shadow each other's names.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from dp_operators.ledger import AccountConfig, AuditKey, Ledger, LedgerConfig, LedgerGovernor

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
EXAMPLE_SPEC = REPO / "config" / "releases" / "adult_census.yaml"

#: Fixed test keys (docs/adr/0020): the privacy officer's governor key and the workers' spend key.
GOVERNOR_KEY = AuditKey.from_text("test-governor-key-" + "g" * 46)
SPEND_KEY = AuditKey.from_text("test-spend-key-" + "s" * 49)


def governor(url: str) -> LedgerGovernor:
    """The governor's view of the ledger at ``url`` (both test keys)."""
    return LedgerGovernor(url, governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)


def spender(url: str, **kwargs) -> Ledger:
    """The spender's view of the ledger at ``url`` (the test spend key)."""
    return Ledger(url, audit_key=SPEND_KEY, **kwargs)


def example_charge() -> Fraction:
    """The rho the example spec is charged on a zCDP account: the Gaussian's 9/200, plus the Laplace counts at
    epsilon 0.3 and the mean's two Laplace halves at epsilon 0.1 each, converted by epsilon * tanh(epsilon / 2)
    (docs/adr/0015). ``test_example_charge_is_the_composed_rho`` checks it against mpmath."""
    from dp_operators.accounting import pure_epsilon_to_rho

    return Fraction(9, 200) + pure_epsilon_to_rho(Fraction(3, 10)) + 2 * pure_epsilon_to_rho(Fraction(1, 10))


def make_ledger(path: Path, *, cap="1/2", accountant="zcdp", dags=("adult_census_release",), account="census_adult"):
    """A fresh SQLite ledger at ``path`` with one account; returns the spender's view (the test spend key)."""
    officer = governor(f"sqlite:///{path}")
    officer.init_schema()
    officer.apply_config(
        LedgerConfig(
            version=1,
            accounts={
                account: AccountConfig(
                    accountant=accountant,
                    cap=Fraction(cap),
                    delta=Fraction(1, 10**6) if accountant in ("zcdp", "approx_dp") else None,
                    privacy_unit="person",
                    allowed_dags=list(dags),
                )
            },
        )
    )
    return spender(f"sqlite:///{path}")

