"""The searches behind planning are fast at the spec limits and return what the slow searches returned (planning
must never raise a raw error or run for minutes; docs/adr/0019).

* the Gaussian partition-selection threshold bisects where it stepped one unit at a time (5.1 million steps at
  epsilon 1e-4, L0 10^4; a minute at sigma 10^4): the old stepping search is kept below as the reference;
* the discrete Gaussian half-width bisects where it stepped from the normal quantile (sigma 1e-16 steps);
* the exact (epsilon, delta) calibration of the discrete Gaussian evaluates its profile about 5 times instead of
  28, and from sigma 4 on the profile of a vector comes from Poisson summation instead of an FFT of up to 2^22
  points, with a proven error bound about 1e-30 (privacy_profile module docstring), so it is also tighter.

Expected values come from the definitions (the inequalities each search solves), the old algorithms, 40-digit
mpmath convolutions, OpenDP and scipy, never from the code's own output.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import opendp.accuracy
import pytest
from scipy.stats import norm

from dp_operators.mechanisms import (
    analytic_gaussian_sigma,
    discrete_gaussian_accuracy,
    discrete_gaussian_delta,
    discrete_gaussian_sigma2_for_approx_dp,
    discrete_gaussian_threshold,
    discrete_gaussian_upper_tail,
)
from dp_operators.mechanisms import privacy_profile

from test_discrete_gaussian_profile import mp_law, reference_delta_mp


# -- the Gaussian partition-selection threshold ----------------------------------------------------------------------
def released(k: int, sigma2, l0: int) -> float:
    """The threshold's defining quantity (calibration.discrete_gaussian_threshold's docstring): the probability,
    with its float margin, that one of l0 keys held only by the added unit is released, P(Y >= k) per key."""
    tail = discrete_gaussian_upper_tail(k, sigma2)
    any_of = 1.0 if tail >= 1.0 else -math.expm1(l0 * math.log1p(-tail))
    return any_of * (1 + 1e-12)


def stepping_threshold(sigma2, delta, l0: int) -> int:
    """The threshold as the search before this change found it: from the subgaussian start, one unit at a time."""
    target = float(delta) * (1 - 1e-9)
    k = max(1, math.ceil(math.sqrt(2 * float(sigma2) * math.log(2 * l0 / target))))
    while k > 1 and released(k - 1, sigma2, l0) <= target:
        k -= 1
    while released(k, sigma2, l0) > target:
        k += 1
    return k + 1


THRESHOLD_CASES = [
    pytest.param(sigma2, delta, l0, id=f"sigma2 {sigma2}, delta {float(delta):g}, L0 {l0}")
    for sigma2 in (Fraction(1, 4), 3, 16, 400, 10_000)
    for delta in (Fraction(1, 2), Fraction(1, 10**6), Fraction(1, 10**300))
    for l0 in (1, 10, 1000)
] + [
    # the Euler-Maclaurin tail (sigma > 1e4), where stepping still takes a fraction of a second
    pytest.param(10**10, Fraction(1, 10**6), 1000, id="sigma 1e5, delta 1e-6, L0 1000"),
    pytest.param(10**10, Fraction(1, 2), 10, id="sigma 1e5, delta 1/2, L0 10"),
]


@pytest.mark.parametrize(("sigma2", "delta", "l0"), THRESHOLD_CASES)
def test_the_threshold_is_the_one_the_stepping_search_found(sigma2, delta, l0):
    threshold, spent = discrete_gaussian_threshold(sigma2, delta, l0=l0)
    assert threshold == stepping_threshold(sigma2, delta, l0)
    assert spent <= delta


@pytest.mark.parametrize(
    ("sigma2", "delta", "l0"),
    [
        *THRESHOLD_CASES[::7],
        # a minute of stepping each before (sigma 1e4, where the tail is summed term by term)
        pytest.param(10**8, Fraction(1, 2), 1, id="sigma 1e4, delta 1/2"),
        pytest.param(10**8, Fraction(1, 10**6), 1000, id="sigma 1e4, delta 1e-6, L0 1000"),
        # the spec limits: epsilon 1e-4 at L0 10^4 (sigma about 3.7e7), millions of steps before
        pytest.param(Fraction(137 * 10**13), Fraction(1, 10**300), 10**4, id="sigma 3.7e7, delta 1e-300, L0 1e4"),
        pytest.param(10**16, Fraction(1, 10**6), 10**4, id="sigma 1e8, delta 1e-6, L0 1e4"),
    ],
)
def test_the_threshold_is_the_smallest_integer_meeting_the_delta(sigma2, delta, l0):
    """released(t - 1) <= delta (1 - 1e-9) < released(t - 2): the threshold's definition, at t and one below."""
    threshold, spent = discrete_gaussian_threshold(sigma2, delta, l0=l0)
    target = float(delta) * (1 - 1e-9)
    assert released(threshold - 1, sigma2, l0) <= target
    assert threshold == 2 or released(threshold - 2, sigma2, l0) > target
    assert released(threshold - 1, sigma2, l0) <= spent <= delta


def test_the_threshold_search_evaluates_the_tail_about_twice_log2_times(monkeypatch):
    """Bisection: about 2 log2(threshold) tail evaluations at the spec limits (epsilon 1e-4, L0 10^4, sigma
    3.7e7), where the stepping search made 5.1 million."""
    from dp_operators.mechanisms import accuracy

    calls = []
    original = accuracy.discrete_gaussian_upper_tail
    monkeypatch.setattr(accuracy, "discrete_gaussian_upper_tail", lambda k, s2: calls.append(k) or original(k, s2))
    threshold, _ = discrete_gaussian_threshold(Fraction(137 * 10**13), Fraction(1, 10**300), l0=10**4)
    assert threshold > 10**9
    assert len(calls) <= 3 * threshold.bit_length()


# -- the discrete Gaussian half-width beyond sigma 1e4 (Euler-Maclaurin) --------------------------------------------
def tail_beyond(a: int, sigma: float) -> float:
    """sum of exp(-x^2 / (2 sigma^2)) over x > a, by Euler-Maclaurin (accuracy.discrete_gaussian_accuracy)."""
    m = a + 1
    w = math.exp(-m * m / (2 * sigma * sigma))
    return sigma * math.sqrt(math.pi / 2) * math.erfc(m / (sigma * math.sqrt(2))) + w / 2 + m * w / (12 * sigma * sigma)


def stepping_half_width(sigma: float, alpha: float) -> int:
    """The half-width as the search before this change found it: from the normal quantile, one unit at a time."""
    from statistics import NormalDist

    target = alpha * math.sqrt(2 * math.pi) * sigma / 2
    a = max(0, math.floor(-sigma * NormalDist().inv_cdf(alpha / 2)))
    while tail_beyond(a, sigma) > target:
        a += 1
    while a > 0 and tail_beyond(a - 1, sigma) <= target:
        a -= 1
    return a


HALF_WIDTH_SIGMAS = [10_000.5, 12_345.6, 1e5, 3.3e6, 1e9, 1e12, 7.7e15, 1e18]
ALPHAS = [0.9, 0.05, 1e-6, 1e-12, 1e-100, 1e-300]


@pytest.mark.parametrize("sigma", HALF_WIDTH_SIGMAS)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_half_width_is_the_one_the_stepping_search_found(sigma, alpha):
    assert discrete_gaussian_accuracy(sigma * sigma, alpha) == stepping_half_width(sigma, alpha)


@pytest.mark.parametrize("sigma", [*HALF_WIDTH_SIGMAS, 1e20, 1e22, 1e24])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_half_width_is_the_smallest_integer_meeting_alpha(sigma, alpha):
    """tail_beyond(h) <= alpha sqrt(2 pi) sigma / 2 < tail_beyond(h - 1): the definition, at h and one below
    (sigma 1e22 and 1e24 took seconds to minutes of stepping before)."""
    half_width = discrete_gaussian_accuracy(sigma * sigma, alpha)
    target = alpha * math.sqrt(2 * math.pi) * sigma / 2
    assert tail_beyond(half_width, sigma) <= target
    assert half_width == 0 or tail_beyond(half_width - 1, sigma) > target


@pytest.mark.parametrize(
    ("sigma", "alpha"),
    [(12_345.6, 0.05), (12_345.6, 1e-6), (1e5, 0.05), (1e5, 1e-6), (1e6, 0.05)],
)
def test_the_half_width_beyond_sigma_1e4_is_opendp_minus_one(sigma, alpha):
    """OpenDP returns the smallest a with P(|Z| >= a) <= alpha, one more than ours (P(|Z| > a) <= alpha). (At
    sigma 1e6 and alpha 1e-6 OpenDP returns 4891638, where P(|Z| >= a) = 1.000005e-6 by the 40-digit reference
    below: one too few.)"""
    assert discrete_gaussian_accuracy(sigma * sigma, alpha) + 1 == opendp.accuracy.discrete_gaussian_scale_to_accuracy(
        sigma, alpha
    )


def mp_two_sided_tail(a: int, sigma: float) -> mpmath.mpf:
    """P(|Z| > a) in 40 digits: Euler-Maclaurin with terms to f''' (the next is O(sigma^-5) relative), normaliser
    sqrt(2 pi) sigma (the theta correction is exp(-2 pi^2 sigma^2))."""
    with mpmath.workdps(40):
        s, m = mpmath.mpf(sigma), mpmath.mpf(a + 1)

        def f(x):
            return mpmath.exp(-x * x / (2 * s * s))

        total = s * mpmath.sqrt(mpmath.pi / 2) * mpmath.erfc(m / (s * mpmath.sqrt(2))) + f(m) / 2
        total += -mpmath.diff(f, m, 1) / 12 + mpmath.diff(f, m, 3) / 720
        return 2 * total / (mpmath.sqrt(2 * mpmath.pi) * s)


@pytest.mark.parametrize("sigma", [12_345.6, 1e6, 1e9])
@pytest.mark.parametrize("alpha", [0.05, 1e-6, 1e-100])
def test_the_half_width_beyond_sigma_1e4_matches_a_40_digit_tail(sigma, alpha):
    half_width = discrete_gaussian_accuracy(sigma * sigma, alpha)
    assert mp_two_sided_tail(half_width, sigma) <= alpha < mp_two_sided_tail(half_width - 1, sigma)


@pytest.mark.parametrize("sigma", [1e8, 1e12, 1e18, 1e22])
@pytest.mark.parametrize("alpha", [0.05, 1e-6, 1e-100])
def test_the_half_width_at_large_sigma_is_the_normal_quantile_less_half_a_step(sigma, alpha):
    """P(|Z| > a) is 2 Q((a + 1/2) / sigma) up to O(sigma^-2) (midpoint rule), so a = sigma z - 1/2 rounded up,
    with z = scipy's normal quantile; the float evaluation leaves a few ulps of sigma z."""
    z = norm.isf(alpha / 2)
    assert abs(discrete_gaussian_accuracy(sigma * sigma, alpha) - (sigma * z - 0.5)) <= 1 + 8e-16 * sigma * z


# -- the exact (epsilon, delta) calibration ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sigma", "epsilon", "shift", "l0"),
    [
        # delta from 0.3 down to 1e-55: the 40-digit reference truncates each coordinate at 20 sigma (e^-200)
        pytest.param(4.0, 0.1, 1, 2, id="sigma 4 (the switch), epsilon 0.1"),
        pytest.param(4.0, 3, 1, 2, id="sigma 4, epsilon 3, delta 1.6e-18"),
        pytest.param(4.5, 1, 3, 3, id="sigma 4.5, shift 3, L0 3"),
        pytest.param(7.3, 3, 1, 2, id="sigma 7.3, epsilon 3, delta 1.2e-55"),
        pytest.param(7.3, 1, 1, 3, id="sigma 7.3, epsilon 1, L0 3, delta 5e-38"),
        pytest.param(15.0, 1, 1, 2, id="sigma 15, epsilon 1, delta 2e-28"),
        pytest.param(40.0, 0.1, 1, 2, id="sigma 40, epsilon 0.1", marks=pytest.mark.slow),  # 5 s of mpmath
    ],
)
def test_the_poisson_summation_profile_is_an_upper_bound_within_1e_10_of_a_40_digit_computation(
    sigma, epsilon, shift, l0
):
    """From sigma 4 on, the law of the sum of l0 discrete Gaussians comes from Poisson summation with a proven
    error bound: delta stays above the exact value and within a relative 1e-10 of it (the FFT's error bound
    put it up to 3e-10 above here, and 1.2e-8 at sigma 40 and L0 10)."""
    sigma2 = Fraction(sigma) ** 2
    with mpmath.workdps(40):
        exact = reference_delta_mp(sigma2, epsilon, shift, l0, digits=40)
    computed = discrete_gaussian_delta(sigma2, epsilon, linf=shift, l0=l0)
    assert exact <= computed <= exact * (1 + 1e-10) + 1e-300


def test_the_poisson_summation_bound_holds_against_an_80_digit_law():
    """|P[S = r] - A(r)| <= l0 rho_P e^((l0 - 1) rho_P) + e^(-l0 s2 pi^2 / 2) / (pi^2 l0 s2) for every r (the
    privacy_profile module docstring), checked at sigma 4 and l0 = 3 against the 80-digit convolution, near the
    centre and in the tails."""
    sigma2, l0 = Fraction(16), 3
    with mpmath.workdps(80):
        s2 = mpmath.mpf(16)
        law = mp_law(sigma2, l0, width=200)  # the exact convolution of the pmf truncated at 50 sigma
        pi2s2 = mpmath.pi**2 * s2
        rho_p = 2 * sum(mpmath.exp(-pi2s2 * (2 * j - 1) ** 2 / 2) for j in range(1, 5))
        bound = l0 * rho_p * mpmath.exp((l0 - 1) * rho_p) + mpmath.exp(-l0 * pi2s2 / 2) / (mpmath.pi**2 * l0 * s2)
        variance = l0 * s2
        worst = max(
            abs(law[r] - mpmath.exp(-mpmath.mpf(r * r) / (2 * variance)) / mpmath.sqrt(2 * mpmath.pi * variance))
            for r in range(-60, 61)
        )
    assert worst <= bound < 1e-33
    law_of_module = privacy_profile._sum_law(float(sigma2), l0)
    assert law_of_module.point_error >= bound  # the module charges at least the bound (plus its float margin)


def count_profile_evaluations(monkeypatch) -> list:
    calls = []
    original = privacy_profile.discrete_gaussian_delta

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(privacy_profile, "discrete_gaussian_delta", counted)
    return calls


@pytest.mark.parametrize(
    ("epsilon", "delta", "linf", "l0"),
    [
        # the count of a variance under partition selection at the L0 limit: 12.6 s before (28 FFTs of 2^22 points)
        pytest.param(Fraction(1, 3), Fraction(1, 3 * 10**6), 1, 10**4, id="(1/3, 1e-6/3), L0 1e4"),
        pytest.param(Fraction(1, 2), Fraction(1, 2 * 10**6), 1, 10**4, id="(1/2, 5e-7), L0 1e4"),
        pytest.param(1, Fraction(1, 10**6), 1000, 10, id="(1, 1e-6), Linf 1000, L0 10"),
        pytest.param(Fraction(1, 10), Fraction(1, 10**12), 1000, 2, id="(0.1, 1e-12), Linf 1000, L0 2"),
    ],
)
def test_the_calibration_is_valid_minimal_and_at_the_analytic_gaussian_in_a_few_profile_evaluations(
    monkeypatch, epsilon, delta, linf, l0
):
    """Valid and tight to 1e-9 by the exact profile; within 1e-6 of the continuous analytic Gaussian's sigma
    (Balle & Wang 2018: the sum of l0 discrete Gaussians is normal to 1e-30 here); at most 8 profile evaluations
    (the bisection made 28)."""
    discrete_gaussian_sigma2_for_approx_dp.cache_clear()
    calls = count_profile_evaluations(monkeypatch)
    sigma2 = discrete_gaussian_sigma2_for_approx_dp(epsilon, delta, linf=linf, l0=l0)
    assert len(calls) <= 8
    assert discrete_gaussian_delta(sigma2, epsilon, linf=linf, l0=l0) <= delta
    assert discrete_gaussian_delta(sigma2 * (1 - Fraction(1, 10**9)), epsilon, linf=linf, l0=l0) > delta
    reference = analytic_gaussian_sigma(float(epsilon), float(delta), linf * math.sqrt(l0))
    assert math.sqrt(sigma2) == pytest.approx(reference, rel=1e-6)


def reference_delta_dft(sigma2: Fraction, epsilon, l0: int, length: int, digits: int = 90) -> mpmath.mpf:
    """delta(epsilon) for shift 1, independently of the module: F(k) = P[S <= k] from the exact discrete Fourier
    transform of S's characteristic function phi(t)^l0 in 90-digit arithmetic, phi(t) = Theta(t) / Theta(0) by the
    theta series (Poisson summation of the pmf), F(k) = (1/N) sum_j phi(2 pi j / N)^l0 sum_{s=-N/2}^{k} w^(-j s)
    (a geometric sum). Exact but for S's mass beyond N/2, which the lengths below keep under e^-60."""
    with mpmath.workdps(digits):
        s2 = mpmath.mpf(sigma2.numerator) / sigma2.denominator

        def theta(t):
            return mpmath.fsum(mpmath.exp(-s2 * (t + 2 * mpmath.pi * k) ** 2 / 2) for k in range(-3, 4))

        # phi is the wrapped normal's density over its value at 0: even in t and decreasing on [0, pi], so the terms
        # above the cut-off are those of the smallest |j|, and j and -j give the same power
        cutoff = mpmath.mpf(10) ** (5 - digits)
        powers = []
        for j in range(1, length // 2 + 1):
            t = 2 * mpmath.pi * j / length
            power = (theta(t) / theta(mpmath.mpf(0))) ** l0
            if power <= cutoff:
                break
            powers += [(t, power)] if 2 * j == length else [(t, power), (-t, power)]

        def cdf(k: int):
            low = -(length // 2)
            total = mpmath.mpf(k - low + 1)  # j = 0
            for t, power in powers:
                w = mpmath.expj(-t)
                total += power * (w**low - w ** (k + 1)) / (1 - w)
            return total.real / length

        c = Fraction(l0, 2) - Fraction(epsilon) * sigma2  # L > eps iff S < c (privacy_profile)
        k1 = math.ceil(c) - 1
        return cdf(k1) - mpmath.exp(epsilon) * cdf(k1 - l0)


@pytest.mark.parametrize(
    ("epsilon", "delta", "l0", "length"),
    [
        pytest.param(3, Fraction(1, 10**10), 10, 2**11, id="(3, 1e-10), L0 10"),
        pytest.param(1, Fraction(1, 10**6), 100, 2**13, id="(1, 1e-6), L0 100", marks=pytest.mark.slow),
        # the FFT's error allowance put this sigma 2.2 % higher (9.9995): 3.5 times the true delta at 9.78
        pytest.param(100, Fraction(1, 10**6), 10**4, 2**15, id="(100, 1e-6), L0 1e4", marks=pytest.mark.slow),
    ],
)
def test_the_calibrated_sigma_is_valid_by_an_exact_fourier_computation(epsilon, delta, l0, length):
    """The returned sigma meets delta by the 90-digit reference, and the profile it was checked with is above the
    reference by at most a relative 1e-9 (validity never rests on the module's own profile alone)."""
    sigma2 = discrete_gaussian_sigma2_for_approx_dp(epsilon, delta, l0=l0)
    exact = reference_delta_dft(sigma2, epsilon, l0, length)
    computed = discrete_gaussian_delta(sigma2, epsilon, l0=l0)
    assert exact <= computed <= delta
    assert computed <= exact * (1 + 1e-9)
