from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

import pytest

from dp_operators.mechanisms import (
    discrete_gaussian_sigma2,
    discrete_laplace_scale,
    pure_epsilon_to_rho,
    rho_to_epsilon,
)


def bun_steinke_epsilon(rho: float, delta: float) -> float:
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def brute_force_cks_epsilon(rho: float, delta: float) -> float:
    """Independent check: the CKS 2020 Corollary 13 expression on a dense log grid of alpha - 1 in [1e-8, 1e12]."""
    best = math.inf
    for k in range(-8000, 12001):
        alpha = 1 + 10 ** (k / 1000)
        value = alpha * rho + (math.log(1 / delta) + (alpha - 1) * math.log(1 - 1 / alpha) - math.log(alpha)) / (
            alpha - 1
        )
        best = min(best, value)
    return max(best, 0.0)


def test_discrete_laplace_scale_is_exact():
    assert discrete_laplace_scale(1, Fraction(1, 2)) == 2
    assert isinstance(discrete_laplace_scale(1, Fraction(1, 2)), Fraction)
    assert discrete_laplace_scale(3, Fraction(1, 10)) == 30
    # a float is read as the decimal it was typed as, like every public number in the project
    assert discrete_laplace_scale(1, 0.1) == 10


def test_discrete_gaussian_sigma2_is_exact():
    assert discrete_gaussian_sigma2(1, Fraction(1, 8)) == 4
    assert discrete_gaussian_sigma2(5, Fraction(1, 2)) == 5
    assert discrete_gaussian_sigma2(Fraction(1, 3), 1) == Fraction(1, 6)


def test_pure_epsilon_to_rho_is_epsilon_tanh_half_epsilon_rounded_up():
    """eps tanh(eps/2) to 12 significant digits, rounded up (tests/accounting/test_pure_dp_to_zcdp.py checks it
    against the Rényi divergence of randomized response). By hand: 0.5 tanh(0.25) = 0.12245933120185...,
    2 tanh(1) = 1.52318831191153..., 0.1 tanh(0.05) = 0.0049958374957880..."""
    assert pure_epsilon_to_rho(Fraction(1, 2)) == Fraction(122459331202, 10**12)
    assert pure_epsilon_to_rho(2) == Fraction(152318831192, 10**11)
    assert pure_epsilon_to_rho(0.1) == Fraction(499583749579, 10**14)
    assert pure_epsilon_to_rho(Fraction(1, 2)) < Fraction(1, 8)  # below Bun & Steinke's epsilon^2 / 2


def test_rho_to_epsilon_reference_case_between_rho_and_bun_steinke():
    epsilon = rho_to_epsilon(0.5, 1e-6)
    assert 0.5 < epsilon < bun_steinke_epsilon(0.5, 1e-6)
    assert epsilon == pytest.approx(5.2215344445, rel=1e-9)


@pytest.mark.parametrize(
    ("rho", "delta"),
    [
        pytest.param(0.5, 1e-6, id="rho 0.5, delta 1e-6"),
        pytest.param(0.01, 1e-5, id="rho 0.01, delta 1e-5"),
        pytest.param(1e-6, 1e-9, id="tiny rho"),
        pytest.param(10, 1e-3, id="large rho"),
        pytest.param(2, 0.3, id="large delta"),
        pytest.param(Fraction(1, 50), Fraction(1, 10**8), id="Fraction inputs"),
    ],
)
def test_rho_to_epsilon_matches_brute_force_grid_and_beats_bun_steinke(rho, delta):
    epsilon = rho_to_epsilon(rho, delta)
    grid = brute_force_cks_epsilon(float(rho), float(delta))
    # never looser than the grid (up to float noise), and the grid is fine enough to be within 1e-5 of the infimum
    assert epsilon <= grid * (1 + 1e-9)
    assert epsilon >= grid * (1 - 1e-5)
    assert epsilon <= bun_steinke_epsilon(float(rho), float(delta))


def test_rho_to_epsilon_is_monotone():
    assert rho_to_epsilon(0.1, 1e-6) < rho_to_epsilon(0.2, 1e-6)
    assert rho_to_epsilon(0.1, 1e-6) > rho_to_epsilon(0.1, 1e-3)


def test_rho_to_epsilon_handles_delta_below_float_range():
    delta = Fraction(1, 10**400)
    epsilon = rho_to_epsilon(Fraction(1, 2), delta)
    log_inv_delta = 400 * math.log(10)
    assert 0.5 < epsilon < 0.5 + 2 * math.sqrt(0.5 * log_inv_delta)


def test_rho_to_epsilon_is_zero_when_delta_covers_total_variation():
    # rho-zCDP bounds the KL divergence by rho, hence total variation by sqrt(rho/2) << delta: (0, delta)-DP
    assert rho_to_epsilon(1e-30, 1e-10) == 0.0


BAD_POSITIVE = [
    pytest.param(float("nan"), id="NaN"),
    pytest.param(float("inf"), id="inf"),
    pytest.param(0, id="zero"),
    pytest.param(-1, id="negative"),
    pytest.param(True, id="bool"),
]


@pytest.mark.parametrize("value", BAD_POSITIVE)
@pytest.mark.parametrize(
    ("call", "name"),
    [
        pytest.param(lambda v: discrete_laplace_scale(v, 1), "l1_sensitivity", id="laplace sensitivity"),
        pytest.param(lambda v: discrete_laplace_scale(1, v), "epsilon", id="laplace epsilon"),
        pytest.param(lambda v: discrete_gaussian_sigma2(v, 1), "l2_sensitivity_squared", id="gaussian sensitivity"),
        pytest.param(lambda v: discrete_gaussian_sigma2(1, v), "rho", id="gaussian rho"),
        pytest.param(pure_epsilon_to_rho, "epsilon", id="epsilon to rho"),
        pytest.param(lambda v: rho_to_epsilon(v, 1e-6), "rho", id="rho to epsilon, rho"),
    ],
)
def test_bad_budget_or_sensitivity_is_rejected_with_name_and_value(call, name, value):
    with pytest.raises(ValueError, match=rf"^{name} must .*{value!r}"):
        call(value)


@pytest.mark.parametrize(
    "delta",
    [
        pytest.param(0, id="zero"),
        pytest.param(1, id="one"),
        pytest.param(1.5, id="above one"),
        pytest.param(-1e-6, id="negative"),
        pytest.param(float("nan"), id="NaN"),
        pytest.param(True, id="bool"),
    ],
)
def test_bad_delta_is_rejected(delta):
    with pytest.raises(ValueError, match=r"^delta must"):
        rho_to_epsilon(0.5, delta)


# -- the exact (epsilon, delta) profile of the discrete Gaussian, and calibrations built on it ---------------------
from dp_operators.mechanisms import (  # noqa: E402
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
    discrete_gaussian_delta,
    discrete_gaussian_pmf,
    discrete_gaussian_sigma2_for_approx_dp,
    discrete_gaussian_threshold,
    discrete_laplace_accuracy,
    discrete_laplace_threshold,
    discrete_gaussian_accuracy,
    epsilon_for_discrete_gaussian_accuracy,
    epsilon_for_discrete_laplace_accuracy,
    epsilon_for_rho,
    rho_for_approx_dp,
    rho_for_discrete_gaussian_accuracy,
)


def brute_force_delta(sigma2: float, epsilon: float, shift: int, l0: int) -> float:
    """delta(epsilon) = E_P[max(0, 1 - e^(eps - L))] by direct convolution of pmfs (small cases only)."""
    support = np.arange(-60, 61)
    single = np.array([discrete_gaussian_pmf(int(x), sigma2) for x in support])
    law, offset = single, -60
    for _ in range(l0 - 1):
        law, offset = np.convolve(law, single), offset - 60
    s = np.arange(len(law)) + offset
    loss = (l0 * shift * shift - 2.0 * shift * s) / (2 * sigma2)
    return float(np.sum(np.where(loss > epsilon, law * -np.expm1(epsilon - loss), 0.0)))


@pytest.mark.parametrize(
    ("sigma2", "epsilon", "shift", "l0"),
    [
        pytest.param(4.0, 0.5, 1, 1, id="one coordinate, Theorem 7"),
        pytest.param(2.25, 1.0, 2, 1, id="one coordinate, shift 2"),
        pytest.param(9.0, 1.0, 1, 2, id="two coordinates (FFT)"),
        pytest.param(6.0, 0.3, 2, 3, id="three coordinates, shift 2 (FFT)"),
    ],
)
def test_discrete_gaussian_profile_matches_brute_force_and_never_undershoots(sigma2, epsilon, shift, l0):
    exact = brute_force_delta(sigma2, epsilon, shift, l0)
    computed = discrete_gaussian_delta(Fraction(sigma2), epsilon, linf=shift, l0=l0)
    assert exact <= computed <= exact * (1 + 1e-6) + 1e-9


def test_discrete_gaussian_profile_grows_with_the_shift():
    # the worst neighbour moves every coordinate by the full linf (docs/mechanisms.md)
    deltas = [discrete_gaussian_delta(Fraction(16), 0.5, linf=shift) for shift in (1, 2, 3, 5)]
    assert deltas == sorted(deltas) and deltas[0] < deltas[-1]


@pytest.mark.parametrize("epsilon", [0.05, 0.5, 1, 3, 10, 50])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_approx_dp_sigma_is_valid_minimal_and_near_the_analytic_gaussian_for_any_epsilon(epsilon, delta):
    sigma2 = discrete_gaussian_sigma2_for_approx_dp(epsilon, Fraction(delta))
    assert discrete_gaussian_delta(sigma2, epsilon) <= delta
    assert discrete_gaussian_delta(sigma2 * Fraction(999, 1000), epsilon) > delta  # tight to 0.1 %
    # never above the zCDP route; close to the continuous optimum once the lattice is fine relative to sigma
    assert sigma2 <= 1 / (2 * rho_for_approx_dp(epsilon, Fraction(delta))) * (1 + Fraction(1, 10**11))
    reference = analytic_gaussian_sigma(epsilon, delta)
    if reference >= 4:
        assert math.sqrt(sigma2) == pytest.approx(reference, rel=0.01)
    elif reference >= 1:
        assert math.sqrt(sigma2) == pytest.approx(reference, rel=0.05)


def test_approx_dp_sigma_uses_the_true_l2_sensitivity_of_a_vector():
    one = discrete_gaussian_sigma2_for_approx_dp(1, Fraction(1, 10**6))
    hundred = discrete_gaussian_sigma2_for_approx_dp(1, Fraction(1, 10**6), l0=100)
    assert math.sqrt(hundred / one) == pytest.approx(10, rel=0.01)  # sqrt(k), not k


def test_analytic_gaussian_reference_values():
    assert analytic_gaussian_sigma(1, 1e-6) == pytest.approx(4.2247, abs=1e-3)
    assert analytic_gaussian_delta(analytic_gaussian_sigma(1, 1e-6), 1, 1) == pytest.approx(1e-6, rel=1e-6)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(lambda: discrete_gaussian_sigma2_for_approx_dp(1, 0), "delta", id="delta zero"),
        pytest.param(lambda: discrete_gaussian_sigma2_for_approx_dp(1, 1), "delta", id="delta one"),
        pytest.param(lambda: discrete_gaussian_sigma2_for_approx_dp(float("nan"), 1e-6), "epsilon", id="epsilon NaN"),
        pytest.param(lambda: discrete_gaussian_sigma2_for_approx_dp(0, 1e-6), "epsilon", id="epsilon zero"),
        pytest.param(lambda: discrete_gaussian_sigma2_for_approx_dp(1, 1e-6, l0=0), "l0", id="l0 zero"),
    ],
)
def test_approx_dp_calibration_rejects_bad_parameters(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_laplace_threshold_uses_the_release_comparison_and_rounds_up():
    threshold, spent = discrete_laplace_threshold(1, Fraction(1, 10**6))
    # released iff 1 + Z >= threshold: P(Z >= 14) = e^-14 / (1 + e^-1) <= 1e-6 < P(Z >= 13)
    assert threshold == 15
    assert math.exp(-14) / (1 + math.exp(-1)) <= spent <= Fraction(1, 10**6) < math.exp(-13) / (1 + math.exp(-1))
    wider, _ = discrete_laplace_threshold(1, Fraction(1, 10**6), l0=5)
    assert wider > threshold  # a unit may add l0 keys


def test_gaussian_threshold_is_the_smallest_valid_integer():
    from dp_operators.mechanisms import discrete_gaussian_upper_tail

    threshold, spent = discrete_gaussian_threshold(16, Fraction(1, 10**6))
    assert discrete_gaussian_upper_tail(threshold - 1, 16) <= spent <= 1e-6
    assert discrete_gaussian_upper_tail(threshold - 2, 16) > 1e-6


def test_epsilon_for_rho_fits_the_budget():
    """The root of eps tanh(eps/2) = 0.05 is 0.3175514373..., above the old sqrt(0.1) = 0.3162277660."""
    epsilon = epsilon_for_rho(Fraction(1, 20))
    assert pure_epsilon_to_rho(epsilon) <= Fraction(1, 20)
    assert float(epsilon) == pytest.approx(0.3175514373, rel=1e-9)
    assert epsilon > math.sqrt(0.1)


def test_target_accuracy_gives_the_smallest_budget():
    epsilon = epsilon_for_discrete_laplace_accuracy(10, 0.05, 1)
    assert discrete_laplace_accuracy(1 / epsilon, 0.05) <= 10 < discrete_laplace_accuracy(1 / (epsilon * 0.999), 0.05)
    rho = rho_for_discrete_gaussian_accuracy(10, 0.05, 1)
    assert discrete_gaussian_accuracy(1 / (2 * rho), 0.05) <= 10 < discrete_gaussian_accuracy(1 / (2 * rho * 0.99), 0.05)
    epsilon = epsilon_for_discrete_gaussian_accuracy(10, 0.05, Fraction(1, 10**6))
    assert discrete_gaussian_accuracy(discrete_gaussian_sigma2_for_approx_dp(epsilon, Fraction(1, 10**6)), 0.05) <= 10
    looser = discrete_gaussian_sigma2_for_approx_dp(epsilon * Fraction(99, 100), Fraction(1, 10**6))
    assert discrete_gaussian_accuracy(looser, 0.05) > 10
