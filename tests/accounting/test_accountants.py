"""Accountants: what each charges, the Gaussian-DP conversions, and how many releases each admits."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from dp_operators.accounting import (
    GaussianNoise,
    IncompatibleAccountantError,
    PrivacyLoss,
    account_charge,
    charge_in_account_unit,
    epsilon_at_delta,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_squared_for_approx_dp,
)
from dp_operators.ledger import BudgetExhaustedError, ReleaseKey
from dp_operators.mechanisms import rho_to_epsilon
from ledger_backends import account_config, ledger_with

DELTA = Fraction(1, 10**6)
SIGMA = 20
#: one sensitivity-1 Gaussian release with sigma = 20: rho = 1/800 (CKS Thm 14), mu = 1/20 (DRS Thm 2.7)
GAUSSIAN = PrivacyLoss("rho", Fraction(1, 2 * SIGMA**2), gaussian=GaussianNoise(Fraction(SIGMA**2), Fraction(1)))
LAPLACE = PrivacyLoss("epsilon", Fraction(1, 10))


def classical_gaussian_epsilon(sigma: int, delta: Fraction) -> Fraction:
    """epsilon of the classical calibration sigma = sqrt(2 ln(1.25/delta)) / epsilon (Dwork & Roth 2014, Thm A.1),
    rounded up (a float, then the next float up)."""
    value = math.sqrt(2 * math.log(Fraction(5, 4) / delta)) / sigma
    return Fraction(math.nextafter(value, math.inf))


def admitted(tmp_path, name: str, accountant: str, loss_for_release, **cap) -> int:
    """How many releases an account configured with ``cap`` admits before the first refusal."""
    ledger = ledger_with(f"sqlite:///{tmp_path / name}.db", a=account_config(accountant, **cap))
    for count in range(1000):
        charge = account_charge([loss_for_release], accountant)
        try:
            ledger.reserve(ReleaseKey("d", f"run-{count}", "t", -1, "r"), account="a", amount=charge.amount,
                           delta=charge.delta, mechanisms=[], spec_hash="0" * 64)
        except BudgetExhaustedError:
            return count
    raise AssertionError("never refused")


def test_accountant_comparison_gaussian_dp_22_zcdp_19_basic_composition_3(tmp_path):
    """(epsilon=1, delta=1e-6), sensitivity-1 Gaussian releases with sigma=20 (the table in docs/ledger.md)."""
    assert admitted(tmp_path, "gdp", "gaussian_dp", GAUSSIAN, epsilon=1, delta=DELTA) == 22
    assert admitted(tmp_path, "zcdp", "zcdp", GAUSSIAN, epsilon=1, delta=DELTA) == 19
    # basic composition of classically calibrated (epsilon_i, delta/k) charges; k = 3 is the best split
    by_split = {}
    for k in range(1, 8):
        delta_i = DELTA / k
        loss = PrivacyLoss("epsilon", classical_gaussian_epsilon(SIGMA, delta_i), delta=delta_i)
        by_split[k] = admitted(tmp_path, f"approx{k}", "approx_dp", loss, cap=1, delta=DELTA)
    assert max(by_split.values()) == by_split[3] == 3


def test_zcdp_account_admits_laplace_releases_by_the_tight_conversion(tmp_path):
    """Cap rho = 10, Laplace releases at epsilon 2: charged 2 tanh(1) = 1.5232 each (docs/adr/0015), so 6 fit
    (9.14 <= 10 < 10.66); under the old epsilon^2 / 2 = 2 only 5 did."""
    assert admitted(tmp_path, "laplace", "zcdp", PrivacyLoss("epsilon", Fraction(2)), cap=10) == 6


def test_the_counts_are_the_exact_limits():
    """22 and 19 are where the exact conversions cross, not artefacts of rounding."""
    cap_mu2 = gdp_mu_squared_for_approx_dp(1, DELTA)
    assert 22 * Fraction(1, 400) <= cap_mu2 < 23 * Fraction(1, 400)
    assert gdp_delta(Fraction(22, 400), Fraction(1)) <= DELTA < gdp_delta(Fraction(23, 400), Fraction(1))
    assert rho_to_epsilon(Fraction(19, 800), DELTA) <= 1 < rho_to_epsilon(Fraction(20, 800), DELTA)


def test_gdp_cap_is_rounded_down_and_reported_epsilon_rounded_up():
    cap = gdp_mu_squared_for_approx_dp(1, DELTA)
    assert gdp_delta(cap, Fraction(1)) <= DELTA
    assert gdp_delta(cap + Fraction(1, 10**12), Fraction(1)) > DELTA  # 12 significant digits: the next step is over
    assert 0.99999 < gdp_epsilon(cap, DELTA) <= 1.0
    assert gdp_epsilon(Fraction(0), DELTA) == 0.0


def test_gdp_delta_reference_value():
    """mu = 1 at epsilon = 1: delta = 0.126936737507 (Dong, Roth & Su 2019, Cor. 2.13)."""
    assert float(gdp_delta(Fraction(1), Fraction(1))) == pytest.approx(0.126936737507, rel=1e-9)


@pytest.mark.parametrize(("mu", "epsilon"), [(1, 1), (0.5, 0.5), (0.05, 0.3), (3, 2)])
def test_gdp_delta_matches_an_independent_scipy_evaluation(mu, epsilon):
    from scipy.stats import norm

    reference = norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
    value = gdp_delta(Fraction(mu) ** 2, Fraction(epsilon))
    assert float(value) == pytest.approx(reference, rel=1e-9, abs=1e-15)


def test_gdp_epsilon_inverts_gdp_delta():
    for mu2 in (Fraction(1, 400), Fraction(1, 4), Fraction(9)):
        epsilon = gdp_epsilon(mu2, DELTA)
        assert gdp_delta(mu2, Fraction(epsilon)) <= DELTA
        assert gdp_delta(mu2, Fraction(epsilon * (1 - 1e-9))) > DELTA


@pytest.mark.parametrize(
    ("loss", "accountant", "expected"),
    [
        pytest.param(LAPLACE, "pure_dp", (Fraction(1, 10), 0), id="laplace on pure_dp"),
        pytest.param(LAPLACE, "approx_dp", (Fraction(1, 10), 0), id="laplace on approx_dp is (eps, 0)"),
        # 0.1 tanh(0.05) = 0.0049958374957880..., rounded up to 12 significant digits (docs/adr/0015)
        pytest.param(LAPLACE, "zcdp", (Fraction(499583749579, 10**14), 0), id="laplace on zcdp is eps tanh(eps/2)"),
        pytest.param(GAUSSIAN, "zcdp", (Fraction(1, 800), 0), id="gaussian on zcdp is rho"),
        pytest.param(GAUSSIAN, "gaussian_dp", (Fraction(1, 400), 0), id="gaussian on gaussian_dp is mu^2"),
        pytest.param(PrivacyLoss("epsilon", Fraction(1, 2), delta=DELTA), "approx_dp", (Fraction(1, 2), DELTA),
                     id="approximate loss on approx_dp"),
    ],
)
def test_what_each_accountant_charges(loss, accountant, expected):
    charge = account_charge([loss, loss], accountant)
    assert (charge.amount, charge.delta) == (2 * expected[0], 2 * expected[1])


def test_a_rho_loss_with_a_conversion_delta_is_charged_at_cks_epsilon_on_approx_dp():
    loss = PrivacyLoss("rho", Fraction(1, 800), delta=DELTA)
    amount = charge_in_account_unit(loss, "approx_dp")
    assert amount == Fraction(rho_to_epsilon(Fraction(1, 800), DELTA))
    assert account_charge([loss], "approx_dp").delta == DELTA


@pytest.mark.parametrize(
    ("loss", "accountant", "message"),
    [
        pytest.param(LAPLACE, "gaussian_dp", "composes Gaussian mechanisms only", id="laplace on gaussian_dp"),
        pytest.param(PrivacyLoss("rho", Fraction(1, 800)), "gaussian_dp", "without Gaussian noise parameters",
                     id="rho without sigma on gaussian_dp"),
        pytest.param(GAUSSIAN, "pure_dp", "cannot be charged to a 'pure_dp'", id="gaussian on pure_dp"),
        pytest.param(PrivacyLoss("rho", Fraction(1, 800)), "approx_dp", "needs a delta", id="rho on approx_dp"),
        pytest.param(PrivacyLoss("epsilon", Fraction(1), delta=DELTA), "zcdp", "implies neither pure DP nor zCDP",
                     id="approximate loss on zcdp"),
    ],
)
def test_incompatible_losses_are_refused_before_reserving(loss, accountant, message):
    with pytest.raises(IncompatibleAccountantError, match=message):
        account_charge([loss], accountant)


def test_epsilon_at_delta_per_accountant():
    assert epsilon_at_delta(Fraction(1, 2), "pure_dp", None) == 0.5
    assert epsilon_at_delta(Fraction(1, 2), "approx_dp", DELTA) == 0.5
    assert epsilon_at_delta(Fraction(1, 800), "zcdp", DELTA) == rho_to_epsilon(Fraction(1, 800), DELTA)
    assert epsilon_at_delta(Fraction(1, 400), "gaussian_dp", DELTA) == gdp_epsilon(Fraction(1, 400), DELTA)
    assert epsilon_at_delta(Fraction(1, 400), "gaussian_dp", None) is None


@pytest.mark.parametrize(
    "kwargs",
    [pytest.param({"unit": "mu", "amount": Fraction(1)}, id="unknown unit"),
     pytest.param({"unit": "epsilon", "amount": Fraction(0)}, id="zero amount"),
     pytest.param({"unit": "epsilon", "amount": Fraction(1), "delta": Fraction(1)}, id="delta of 1")],
)
def test_privacy_loss_rejects_invalid_values(kwargs):
    with pytest.raises(ValueError):
        PrivacyLoss(**kwargs)


def test_gaussian_noise_rejects_non_positive_parameters():
    with pytest.raises(ValueError, match="sigma2 must be > 0"):
        GaussianNoise(Fraction(0), Fraction(1))
