from __future__ import annotations

import inspect
import math
import random
import re
import secrets
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chisquare

from dp_operators.mechanisms import (
    discrete_gaussian_pmf,
    discrete_laplace_pmf,
    sample_discrete_gaussian,
    sample_discrete_gaussian_vector,
    sample_discrete_laplace,
    sample_discrete_laplace_vector,
)
from dp_operators.mechanisms import samplers
from dp_operators.mechanisms.samplers import _bernoulli_exp_minus

DRAWS = 100_000
# A correct sampler fails with probability 1e-4 per test; a 30 % scale error gives p-values far below 1e-6.
ACCEPT_P = 1e-4
REJECT_P = 1e-6
WRONG_SCALE = Fraction(13, 10)


def chi_square_p_value(draws: list[int], pmf) -> float:
    """Chi-square goodness of fit of integer draws to a symmetric pmf on Z.

    Bins: each x with |x| <= K, plus one pooled bin for |x| > K, with K the largest cut-off that keeps every
    expected count (including the pooled tail) at 5 or more.
    """
    n = len(draws)
    k = 0
    while n * pmf(k + 1) >= 5:
        k += 1
    while True:
        support = range(-k, k + 1)
        probabilities = [pmf(x) for x in support]
        tail = 1.0 - math.fsum(probabilities)
        if n * tail >= 5 or k == 0:
            break
        k -= 1
    counts = Counter(draws)
    observed = [counts[x] for x in support] + [n - sum(counts[x] for x in support)]
    expected = [n * p for p in probabilities] + [n * tail]
    return float(chisquare(observed, expected).pvalue)


def laplace_pmf(scale):
    return lambda x: discrete_laplace_pmf(x, scale)


def gaussian_pmf(sigma2):
    return lambda x: discrete_gaussian_pmf(x, sigma2)


LAPLACE_SCALES = [pytest.param(2, id="integer scale 2"), pytest.param(Fraction(7, 3), id="rational scale 7/3")]
GAUSSIAN_SIGMA2S = [pytest.param(4, id="integer sigma2 4"), pytest.param(Fraction(25, 2), id="rational sigma2 25/2")]


#: (sampler, pmf maker, parameter, the parameter 30 % off in scale) of each exact scalar-path sampler
SAMPLER_CASES = [
    *[pytest.param(sample_discrete_laplace_vector, laplace_pmf, p.values[0], p.values[0] * WRONG_SCALE,
                   id=f"discrete Laplace {p.id}") for p in LAPLACE_SCALES],
    *[pytest.param(sample_discrete_gaussian_vector, gaussian_pmf, p.values[0], p.values[0] * WRONG_SCALE**2,
                   id=f"discrete Gaussian {p.id}") for p in GAUSSIAN_SIGMA2S],
]


@pytest.mark.slow
@pytest.mark.parametrize(("sample", "pmf", "parameter", "wrong"), SAMPLER_CASES)
def test_the_sampler_fits_its_pmf(sample, pmf, parameter, wrong):
    """Draws at the right scale pass the chi-square test against the exact pmf."""
    draws = sample(parameter, DRAWS)
    assert chi_square_p_value(draws, pmf(parameter)) > ACCEPT_P


@pytest.mark.slow
@pytest.mark.parametrize(("sample", "pmf", "parameter", "wrong"), SAMPLER_CASES)
def test_the_negative_control_a_scale_30_percent_off_is_rejected(sample, pmf, parameter, wrong):
    """Draws at a scale 30 % off are rejected by the same test: it can fail."""
    draws = sample(wrong, DRAWS)
    assert chi_square_p_value(draws, pmf(parameter)) < REJECT_P


@pytest.mark.parametrize(
    ("num", "den"),
    [
        pytest.param(1, 3, id="gamma 1/3"),
        pytest.param(5, 2, id="gamma 5/2 (above 1)"),
        pytest.param(3, 1, id="gamma 3 (integer)"),
    ],
)
def test_bernoulli_exp_minus_gamma_has_probability_exp_minus_gamma(num, den):
    trials = 20_000
    successes = sum(_bernoulli_exp_minus(num, den) for _ in range(trials))
    p = math.exp(-num / den)
    # 6 binomial standard deviations: a false failure is ~1e-9
    assert abs(successes - trials * p) < 6 * math.sqrt(trials * p * (1 - p))


def test_bernoulli_exp_minus_zero_is_certain():
    assert all(_bernoulli_exp_minus(0, 7) for _ in range(100))


@pytest.mark.parametrize(
    "sampler",
    [
        pytest.param(lambda: sample_discrete_laplace(Fraction(5, 2)), id="discrete laplace"),
        pytest.param(lambda: sample_discrete_gaussian(Fraction(9, 2)), id="discrete gaussian"),
        pytest.param(lambda: sample_discrete_laplace(0.1), id="discrete laplace, float scale"),
        pytest.param(lambda: sample_discrete_gaussian(10**12), id="discrete gaussian, huge sigma2"),
    ],
)
def test_samplers_return_builtin_ints(sampler):
    assert all(type(sampler()) is int for _ in range(50))


def test_vectors_have_requested_size():
    assert len(sample_discrete_laplace_vector(3, 17)) == 17
    assert len(sample_discrete_gaussian_vector(3, 17)) == 17
    assert sample_discrete_gaussian_vector(3, 0) == []


def test_tiny_scale_is_almost_always_zero():
    assert sample_discrete_laplace_vector(Fraction(1, 1000), 200) == [0] * 200


def test_randomness_comes_from_secrets(monkeypatch):
    calls = []
    real_randbelow = secrets.randbelow

    def counting_randbelow(n):
        calls.append(n)
        return real_randbelow(n)

    monkeypatch.setattr(secrets, "randbelow", counting_randbelow)
    sample_discrete_laplace(3)
    laplace_calls = len(calls)
    sample_discrete_gaussian(3)
    assert laplace_calls > 0
    assert len(calls) > laplace_calls


def test_global_seeds_do_not_make_noise_reproducible():
    def seeded_draws():
        random.seed(0)
        np.random.seed(0)
        return sample_discrete_laplace_vector(1000, 32)

    # two runs of 32 draws at scale 1000 coincide with probability ~ 1e-90 unless a seed controls them
    assert seeded_draws() != seeded_draws()


def test_samplers_offer_no_seed_and_hold_no_prng_state():
    public = [sample_discrete_laplace, sample_discrete_gaussian, sample_discrete_laplace_vector,
              sample_discrete_gaussian_vector]
    for function in public:
        assert not {"seed", "rng", "random_state"} & set(inspect.signature(function).parameters)
    assert not any(isinstance(value, (random.Random, np.random.Generator)) for value in vars(samplers).values())
    assert "random" not in vars(samplers)


BAD_PARAMETERS = [
    pytest.param(float("nan"), "finite", id="NaN"),
    pytest.param(float("inf"), "finite", id="+inf"),
    pytest.param(float("-inf"), "finite", id="-inf"),
    pytest.param(Decimal("NaN"), "finite", id="Decimal NaN"),
    pytest.param(0, "> 0", id="zero"),
    pytest.param(-2, "> 0", id="negative int"),
    pytest.param(Fraction(-1, 2), "> 0", id="negative Fraction"),
    pytest.param(-0.5, "> 0", id="negative float"),
    pytest.param(True, "bool", id="bool True"),
]


@pytest.mark.parametrize(("value", "reason"), BAD_PARAMETERS)
@pytest.mark.parametrize(
    ("sampler", "name"),
    [
        pytest.param(sample_discrete_laplace, "scale", id="discrete laplace"),
        pytest.param(sample_discrete_gaussian, "sigma2", id="discrete gaussian"),
        pytest.param(lambda v: sample_discrete_laplace_vector(v, 3), "scale", id="discrete laplace vector"),
        pytest.param(lambda v: sample_discrete_gaussian_vector(v, 3), "sigma2", id="discrete gaussian vector"),
    ],
)
def test_bad_scale_is_rejected_with_its_name(sampler, name, value, reason):
    with pytest.raises(ValueError, match=rf"^{name} must .*{re.escape(reason)}"):
        sampler(value)


def test_non_number_scale_is_a_type_error():
    with pytest.raises(TypeError, match="scale must be"):
        sample_discrete_laplace("3")


@pytest.mark.parametrize(
    "size",
    [pytest.param(-1, id="negative"), pytest.param(2.0, id="float"), pytest.param(True, id="bool")],
)
def test_bad_size_is_rejected(size):
    with pytest.raises(ValueError, match="size must be a non-negative int"):
        sample_discrete_laplace_vector(3, size)
