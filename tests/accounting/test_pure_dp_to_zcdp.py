"""Pure epsilon-DP charged to a zCDP account: sup over alpha of D_alpha(randomized response) / alpha (ADR 0015).

Reference values come from the definitions, evaluated independently in 60-digit arithmetic: the Rényi divergence
of the binary randomized-response pair summed term by term, its supremum over a dense grid of alpha, and the
Kullback-Leibler divergence as its alpha -> 1 limit.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import pytest

from dp_operators.accounting import (
    PrivacyLoss,
    account_charge,
    largest_epsilon_within_rho,
    pure_epsilon_to_rho,
)
from dp_operators.mechanisms import epsilon_for_rho

DIGITS = 60
#: alpha - 1 = 10^(k/100) for k in [-900, 600): alpha from 1 + 1e-9 to 1 + 1e6, 1500 points
ALPHA_GRID_EXPONENTS = range(-900, 600)


def mp(value) -> mpmath.mpf:
    value = Fraction(value)
    return mpmath.mpf(value.numerator) / value.denominator


def renyi_randomized_response(epsilon: mpmath.mpf, alpha: mpmath.mpf) -> mpmath.mpf:
    """D_alpha(P || Q) = ln(sum_y P(y)^alpha Q(y)^(1 - alpha)) / (alpha - 1) for P = (p, 1 - p), Q = (1 - p, p),
    p = e^eps / (1 + e^eps): the definition, term by term."""
    p = mpmath.exp(epsilon) / (1 + mpmath.exp(epsilon))
    q = 1 - p
    return mpmath.log(p**alpha * q ** (1 - alpha) + q**alpha * p ** (1 - alpha)) / (alpha - 1)


def kl_randomized_response(epsilon: mpmath.mpf) -> mpmath.mpf:
    p = mpmath.exp(epsilon) / (1 + mpmath.exp(epsilon))
    q = 1 - p
    return p * mpmath.log(p / q) + q * mpmath.log(q / p)


def grid_supremum(epsilon) -> mpmath.mpf:
    with mpmath.workdps(DIGITS):
        eps = mp(epsilon)
        alphas = (1 + mpmath.mpf(10) ** (mpmath.mpf(k) / 100) for k in ALPHA_GRID_EXPONENTS)
        return max(renyi_randomized_response(eps, alpha) / alpha for alpha in alphas)


EPSILONS = [
    pytest.param(Fraction(1, 1000), id="epsilon 0.001"),
    pytest.param(Fraction(1, 10), id="epsilon 0.1"),
    pytest.param(Fraction(3, 10), id="epsilon 0.3 (example release)"),
    pytest.param(Fraction(1, 2), id="epsilon 0.5"),
    pytest.param(Fraction(1), id="epsilon 1"),
    pytest.param(Fraction(2), id="epsilon 2"),
    pytest.param(Fraction(7, 3), id="epsilon 7/3 (not a decimal)"),
    pytest.param(Fraction(10), id="epsilon 10"),
]


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_charge_is_an_upper_bound_of_the_brute_force_supremum_and_close_to_it(epsilon):
    charge = pure_epsilon_to_rho(epsilon)
    supremum = grid_supremum(epsilon)
    assert mp(charge) >= supremum
    # the grid reaches alpha = 1 + 1e-9, where D_alpha / alpha is within ~1e-9 (relative) of the supremum
    assert mp(charge) <= supremum * (1 + mpmath.mpf("1e-7"))


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_supremum_is_the_kl_limit_epsilon_tanh_half_epsilon(epsilon):
    with mpmath.workdps(80):  # alpha - 1 = 1e-20 cancels about 20 digits in D_alpha
        eps = mp(epsilon)
        kl = kl_randomized_response(eps)
        assert abs(kl - eps * mpmath.tanh(eps / 2)) <= kl * mpmath.mpf("1e-50")
        near_one = renyi_randomized_response(eps, 1 + mpmath.mpf("1e-20")) / (1 + mpmath.mpf("1e-20"))
        assert abs(near_one - kl) <= kl * mpmath.mpf("1e-15")
        charge = mp(pure_epsilon_to_rho(epsilon))
        assert kl <= charge <= kl * (1 + mpmath.mpf("1e-11"))  # 12 significant digits, rounded up


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_negative_control_one_percent_below_the_charge_is_beaten_by_some_alpha(epsilon):
    with mpmath.workdps(DIGITS):
        eps = mp(epsilon)
        too_small = mp(pure_epsilon_to_rho(epsilon)) * mpmath.mpf("0.99")
        alpha = 1 + mpmath.mpf("1e-4")
        assert renyi_randomized_response(eps, alpha) > too_small * alpha  # rho-zCDP fails at this alpha


@pytest.mark.parametrize(
    ("epsilon", "below", "old_above_new"),
    [
        pytest.param(Fraction(1, 2), 0.0203, 0.0207, id="epsilon 0.5: about 2 %"),
        pytest.param(Fraction(2), 0.2384, 0.3130, id="epsilon 2: 24 % below, the old charge 31 % above"),
    ],
)
def test_tight_charge_is_below_the_bun_steinke_charge_by_the_figures_worked_by_hand(epsilon, below, old_above_new):
    """Expected: 1 - tanh(eps/2) / (eps/2) and (eps/2) / tanh(eps/2) - 1, by hand: tanh(0.25) = 0.244919,
    tanh(1) = 0.761594."""
    new, old = float(pure_epsilon_to_rho(epsilon)), float(epsilon) ** 2 / 2
    assert 1 - new / old == pytest.approx(below, abs=1e-4)
    assert old / new - 1 == pytest.approx(old_above_new, abs=1e-4)


@pytest.mark.parametrize(
    "epsilon",
    [Fraction(1, 10**12), Fraction(1, 3), Fraction(123456789, 10**8), Fraction(75, 2), Fraction(10**12)],
    ids=["1e-12", "1/3", "1.23456789", "37.5", "1e12"],
)
def test_charge_is_an_exact_rounded_up_fraction_never_above_epsilon_squared_over_two(epsilon):
    charge = pure_epsilon_to_rho(epsilon)
    assert isinstance(charge, Fraction) and charge.denominator <= 10**18
    assert charge <= max(epsilon * epsilon / 2, Fraction(1, 10**18))
    with mpmath.workdps(100):
        exact = mp(epsilon) * mpmath.tanh(mp(epsilon) / 2)
        assert mp(charge) >= exact
        assert mp(charge) <= exact * (1 + mpmath.mpf("1e-11")) + mpmath.mpf("1e-18")


def test_float_input_is_read_as_the_decimal_typed():
    assert pure_epsilon_to_rho(0.3) == pure_epsilon_to_rho(Fraction(3, 10)) == Fraction(44665510087, 10**12)


@pytest.mark.parametrize(
    "value", [pytest.param(0, id="zero"), pytest.param(-1, id="negative"), pytest.param(float("nan"), id="NaN"),
              pytest.param(True, id="bool")]
)
def test_bad_epsilon_or_rho_is_refused(value):
    with pytest.raises(ValueError, match="epsilon must"):
        pure_epsilon_to_rho(value)
    with pytest.raises(ValueError, match="rho must"):
        largest_epsilon_within_rho(value)


def test_discrete_laplace_with_a_wider_shift_stays_within_the_charge():
    """Validity on a shipped mechanism: discrete Laplace with L1 sensitivity 3 at scale 3 (epsilon 1); its
    D_alpha / alpha, summed over the pmfs, never exceeds the randomized-response bound."""
    epsilon, shift = Fraction(1), 3
    with mpmath.workdps(30):
        scale = mpmath.mpf(shift) / mp(epsilon)
        weight = mpmath.tanh(1 / (2 * scale))

        def pmf(y):
            return weight * mpmath.exp(-abs(y) / scale)

        ys = range(-400, 401)  # the pmf beyond |y| = 400 is below e^-133
        charge = mp(pure_epsilon_to_rho(epsilon))
        for k in range(-60, 40, 4):
            alpha = 1 + mpmath.mpf(10) ** (mpmath.mpf(k) / 10)
            divergence = mpmath.log(mpmath.fsum(pmf(y) ** alpha * pmf(y - shift) ** (1 - alpha) for y in ys))
            assert divergence / (alpha - 1) <= charge * alpha


@pytest.mark.parametrize(
    "rho",
    [Fraction(1, 20), Fraction(45, 1000), Fraction(1, 10**6), Fraction(3), Fraction(1000), Fraction(1, 10**13)],
    ids=["0.05", "0.045", "1e-6", "3", "1000", "1e-13"],
)
def test_epsilon_for_rho_is_the_exact_inverse_of_the_charge(rho):
    epsilon = epsilon_for_rho(rho)
    assert epsilon == largest_epsilon_within_rho(rho)
    # the largest 12-significant-digit decimal: its charge fits, the next decimal's does not
    step = Fraction(10) ** (math.floor(math.log10(epsilon)) - 11)
    assert (epsilon / step).denominator == 1
    assert pure_epsilon_to_rho(epsilon) <= rho < pure_epsilon_to_rho(epsilon + step)
    # it is the root of eps tanh(eps/2) = rho to about 12 digits (the ledger's 1e-18 resolution aside), and never
    # below the old sqrt(2 rho)
    with mpmath.workdps(40):
        root = mpmath.findroot(lambda e: e * mpmath.tanh(e / 2) - mp(rho), mpmath.sqrt(2 * mp(rho)))
        assert mp(epsilon) == pytest.approx(root, rel=1e-10)
    assert epsilon * epsilon / 2 >= rho * (1 - Fraction(1, 10**10))


def test_epsilon_for_rho_round_trips_the_example_charge():
    assert epsilon_for_rho(pure_epsilon_to_rho(Fraction(3, 10))) == Fraction(3, 10)
    assert epsilon_for_rho(Fraction(45, 1000)) > Fraction(3, 10)  # 0.045 buys a bit more than epsilon 0.3 now


def test_a_zcdp_account_admits_more_laplace_releases_than_under_epsilon_squared_over_two():
    """Cap rho = 10, Laplace releases at epsilon 2: 5 under 2^2/2 = 2; 6 under 2 tanh(1) = 1.5232 (6 x 1.5232 =
    9.14 <= 10 < 7 x 1.5232)."""
    charge = account_charge([PrivacyLoss("epsilon", Fraction(2))], "zcdp").amount
    assert 6 * charge <= 10 < 7 * charge
    assert 5 * 2 <= 10 < 6 * 2


def test_conversions_are_computed_once_per_value():
    """Repeated conversions of one epsilon and one rho are answered from the cache: 2,000 more calls add hits and
    no computation (``functools.lru_cache`` statistics of the two exact searches)."""
    from dp_operators.accounting import conversions

    pure_epsilon_to_rho(Fraction(3, 10)), epsilon_for_rho(Fraction(45, 1000))
    forward, inverse = conversions._pure_epsilon_to_rho, conversions._largest_epsilon_within_rho
    before = forward.cache_info(), inverse.cache_info()
    for _ in range(2000):
        pure_epsilon_to_rho(Fraction(3, 10))
        epsilon_for_rho(Fraction(45, 1000))
    after = forward.cache_info(), inverse.cache_info()
    assert [a.misses - b.misses for a, b in zip(after, before)] == [0, 0]
    assert [a.hits - b.hits for a, b in zip(after, before)] == [2000, 2000]


def test_inverse_at_the_ledger_resolution(monkeypatch):
    """Every charge is rounded up to a multiple of 1e-18: rho below that buys nothing, and just above it the
    largest fitting epsilon is found in at most 100 exact charge evaluations (galloping, then bisection, over the
    12-digit decimals; the charge is 1e-18 for every epsilon up to sqrt(2e-18), so stepping one decimal at a time
    would take billions)."""
    from dp_operators.accounting import conversions

    with pytest.raises(ValueError, match="too small"):
        largest_epsilon_within_rho(Fraction(1, 10**19))
    evaluations = []
    charge = conversions._pure_epsilon_to_rho

    def counting_charge(epsilon):
        evaluations.append(epsilon)
        if len(evaluations) > 1000:  # stop a one-step-at-a-time search at once
            raise AssertionError("the inverse steps through the decimals one at a time")
        return charge(epsilon)

    monkeypatch.setattr(conversions, "_pure_epsilon_to_rho", counting_charge)
    epsilon = conversions._largest_epsilon_within_rho.__wrapped__(Fraction(15, 10**19))  # uncached: counted
    monkeypatch.undo()
    assert 0 < len(evaluations) <= 100, len(evaluations)
    assert epsilon == largest_epsilon_within_rho(Fraction(15, 10**19))
    assert pure_epsilon_to_rho(epsilon) == Fraction(1, 10**18)
    assert pure_epsilon_to_rho(epsilon + Fraction(1, 10**20)) == Fraction(2, 10**18)
