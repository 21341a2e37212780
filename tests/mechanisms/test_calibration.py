from __future__ import annotations

import math
from fractions import Fraction

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
    # a float is taken at its exact binary value, not the decimal it was typed as
    assert discrete_laplace_scale(1, 0.1) == 1 / Fraction(0.1)
    assert discrete_laplace_scale(1, 0.1) != 10


def test_discrete_gaussian_sigma2_is_exact():
    assert discrete_gaussian_sigma2(1, Fraction(1, 8)) == 4
    assert discrete_gaussian_sigma2(5, Fraction(1, 2)) == 5
    assert discrete_gaussian_sigma2(Fraction(1, 3), 1) == Fraction(1, 6)


def test_pure_epsilon_to_rho_is_exact():
    assert pure_epsilon_to_rho(Fraction(1, 2)) == Fraction(1, 8)
    assert pure_epsilon_to_rho(2) == 2
    assert pure_epsilon_to_rho(0.1) == Fraction(0.1) ** 2 / 2


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
