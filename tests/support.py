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


#: The example mean's sum: one partition moved by at most 49 grid units, noised at epsilon 0.1 (scale 490).
EXAMPLE_SUM_LINF = 49


def example_charge() -> Fraction:
    """The rho the example spec is charged on a zCDP account: the Gaussian's 9/200, plus the Laplace counts at
    epsilon 0.3 and the mean's count half at epsilon 0.1, converted by epsilon * tanh(epsilon / 2), plus the mean's
    sum half (epsilon 0.1, 49 grid units) at the discrete Laplace's own bound (docs/adr/0015), plus the median's
    exponential mechanism at epsilon 0.4, bounded range: 0.4^2 / 8 = 1/50 (docs/mechanisms.md).
    ``test_example_charge_is_the_composed_rho`` checks it against mpmath."""
    from dp_operators.accounting import discrete_laplace_rho, pure_epsilon_to_rho

    sum_half = discrete_laplace_rho(Fraction(EXAMPLE_SUM_LINF * 10), ((EXAMPLE_SUM_LINF, 1),))
    median = Fraction(1, 50)
    return (Fraction(9, 200) + pure_epsilon_to_rho(Fraction(3, 10)) + pure_epsilon_to_rho(Fraction(1, 10)) + sum_half
            + median)


def discrete_laplace_kl_reference(epsilon, shift: int):
    """KL(P || P shifted by ``shift``) of the discrete Laplace of scale shift / epsilon, from the definition in
    mpmath at the current precision: the loss epsilon on x <= 0 and -epsilon on x >= shift (geometric tails), and
    beta (shift - 2x) on each 0 < x < shift, term by term."""
    import mpmath

    epsilon = mpmath.mpf(Fraction(epsilon).numerator) / Fraction(epsilon).denominator
    beta = epsilon / shift
    b = mpmath.exp(-beta)
    pmf = lambda x: (1 - b) / (1 + b) * b ** abs(x)  # noqa: E731
    middle = mpmath.fsum(pmf(x) * beta * (shift - 2 * x) for x in range(1, shift))
    return epsilon * (1 / (1 + b)) - epsilon * b**shift / (1 + b) + middle


def make_ledger(path: Path, *, cap="1/2", accountant="zcdp", dags=("adult_census_release",), account="census_adult",
                delta: Fraction | None = None):
    """A fresh SQLite ledger at ``path`` with one account (``delta``: its delta cap, 1e-6 by default on zcdp and
    approx_dp accounts); returns the spender's view (the test spend key)."""
    officer = governor(f"sqlite:///{path}")
    officer.init_schema()
    officer.apply_config(
        LedgerConfig(
            version=1,
            accounts={
                account: AccountConfig(
                    accountant=accountant,
                    cap=Fraction(cap),
                    delta=(delta or Fraction(1, 10**6)) if accountant in ("zcdp", "approx_dp") else None,
                    privacy_unit="person",
                    allowed_dags=list(dags),
                )
            },
        )
    )
    return spender(f"sqlite:///{path}")

