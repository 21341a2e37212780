from __future__ import annotations

import math
from fractions import Fraction

import opendp.accuracy
import pytest

from dp_operators.mechanisms import (
    discrete_gaussian_accuracy,
    discrete_gaussian_pmf,
    discrete_laplace_accuracy,
    discrete_laplace_pmf,
    gaussian_accuracy,
    laplace_accuracy,
)
from dp_operators.mechanisms.accuracy import (
    _discrete_gaussian_accuracy_by_euler_maclaurin,
    _discrete_gaussian_accuracy_by_summation,
)


def test_reference_values():
    assert round(laplace_accuracy(1, 0.05), 4) == 2.9957
    assert gaussian_accuracy(1, 0.05) == pytest.approx(1.95996, abs=1e-5)
    assert round(discrete_laplace_accuracy(1, 0.05), 4) == 3.3756


@pytest.mark.parametrize("scale", [0.5, 1.0, 2.0, 7 / 3, 10.0, 1000.0])
@pytest.mark.parametrize("alpha", [0.5, 0.05, 0.01, 1e-6])
def test_discrete_laplace_accuracy_matches_opendp(scale, alpha):
    expected = opendp.accuracy.discrete_laplacian_scale_to_accuracy(scale, alpha)
    assert discrete_laplace_accuracy(scale, alpha) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 3.5, 10.0, 100.0, 1000.0])
@pytest.mark.parametrize("alpha", [0.5, 0.05, 0.01, 1e-6])
def test_discrete_gaussian_accuracy_is_opendp_minus_one(sigma, alpha):
    # OpenDP takes sigma and returns the smallest a with P(|Z| >= a) <= alpha; ours is the smallest a with
    # P(|Z| > a) <= alpha, i.e. one less for an integer-valued Z.
    expected = opendp.accuracy.discrete_gaussian_scale_to_accuracy(sigma, alpha)
    assert discrete_gaussian_accuracy(sigma * sigma, alpha) + 1 == expected


def tail_mass(a: int, sigma2) -> float:
    """P(|Z| > a) from the pmf, summed from the far tail inwards."""
    far = math.ceil(40 * math.sqrt(float(sigma2))) + 1
    return 2 * math.fsum(discrete_gaussian_pmf(x, sigma2) for x in range(far, a, -1))


@pytest.mark.parametrize("sigma2", [Fraction(3, 10), 1, 4, Fraction(25, 2), 100, 10_000])
@pytest.mark.parametrize("alpha", [0.5, 0.05, 0.01, 1e-6])
def test_discrete_gaussian_interval_covers_and_is_smallest(sigma2, alpha):
    a = discrete_gaussian_accuracy(sigma2, alpha)
    assert type(a) is int
    assert tail_mass(a, sigma2) <= alpha
    if a > 0:
        assert tail_mass(a - 1, sigma2) > alpha


def test_discrete_gaussian_accuracy_at_large_sigma_is_close_to_continuous():
    sigma = 1e6
    a = discrete_gaussian_accuracy(sigma * sigma, 0.05)
    assert abs(a - gaussian_accuracy(sigma, 0.05)) < 2


@pytest.mark.parametrize("sigma", [3.0, 30.0, 317.0, 3000.0, 10_000.0, 12_345.6])
@pytest.mark.parametrize("alpha", [0.9, 0.05, 1e-6, 1e-100])
def test_euler_maclaurin_tail_agrees_with_summation(sigma, alpha):
    # the large-sigma path is checked against exact summation well below and at the switch-over point
    sigma2 = sigma * sigma
    assert _discrete_gaussian_accuracy_by_euler_maclaurin(sigma2, alpha) == _discrete_gaussian_accuracy_by_summation(
        sigma2, alpha
    )


def test_gaussian_accuracy_for_alpha_below_float_resolution_of_one():
    assert gaussian_accuracy(1, 1e-100) == pytest.approx(21.3059, abs=1e-4)


def test_discrete_gaussian_accuracy_is_zero_for_tiny_sigma():
    assert discrete_gaussian_accuracy(Fraction(1, 100), 0.05) == 0


@pytest.mark.parametrize("sigma2", [Fraction(1, 100), Fraction(3, 10), 1, 4, Fraction(25, 2), 10**6])
def test_discrete_gaussian_pmf_is_normalised(sigma2):
    far = math.ceil(40 * math.sqrt(sigma2)) + 1
    assert math.fsum(discrete_gaussian_pmf(x, sigma2) for x in range(-far, far + 1)) == pytest.approx(1, abs=1e-12)


@pytest.mark.parametrize("scale", [Fraction(1, 10), 1, Fraction(7, 3), 50])
def test_discrete_laplace_pmf_is_normalised_and_matches_tail_formula(scale):
    far = math.ceil(60 * scale) + 1
    assert math.fsum(discrete_laplace_pmf(x, scale) for x in range(-far, far + 1)) == pytest.approx(1, abs=1e-12)
    # P(|Z| >= k) = 2 exp(-k/s) / (1 + exp(-1/s)) for integer k >= 1
    k, s = 3, float(scale)
    tail = 2 * math.fsum(discrete_laplace_pmf(x, scale) for x in range(k, far + 1))
    assert tail == pytest.approx(2 * math.exp(-k / s) / (1 + math.exp(-1 / s)), rel=1e-9, abs=1e-300)


ACCURACY_FUNCTIONS = [
    pytest.param(laplace_accuracy, "scale", id="laplace"),
    pytest.param(gaussian_accuracy, "sigma", id="gaussian"),
    pytest.param(discrete_laplace_accuracy, "scale", id="discrete laplace"),
    pytest.param(discrete_gaussian_accuracy, "sigma2", id="discrete gaussian"),
]


@pytest.mark.parametrize(
    "alpha",
    [
        pytest.param(0, id="zero"),
        pytest.param(1, id="one"),
        pytest.param(1.5, id="above one"),
        pytest.param(-0.05, id="negative"),
        pytest.param(float("nan"), id="NaN"),
        pytest.param(True, id="bool"),
    ],
)
@pytest.mark.parametrize(("function", "name"), ACCURACY_FUNCTIONS)
def test_bad_alpha_is_rejected(function, name, alpha):
    with pytest.raises(ValueError, match=r"^alpha must"):
        function(1, alpha)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(0, id="zero"),
        pytest.param(-1, id="negative"),
        pytest.param(float("nan"), id="NaN"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(True, id="bool"),
    ],
)
@pytest.mark.parametrize(("function", "name"), ACCURACY_FUNCTIONS)
def test_bad_scale_is_rejected_with_its_name(function, name, value):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        function(value, 0.05)


@pytest.mark.parametrize(
    ("pmf", "name"),
    [
        pytest.param(discrete_laplace_pmf, "scale", id="laplace"),
        pytest.param(discrete_gaussian_pmf, "sigma2", id="gaussian"),
    ],
)
def test_pmf_rejects_bad_scale(pmf, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        pmf(0, -1)
