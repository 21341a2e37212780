"""The discrete Laplace's own zCDP charge for integer shifts: sup over alpha of D_alpha / alpha (ADR 0015).

Reference values come from the definition, evaluated independently in 50-digit arithmetic: the Rényi divergence
of the discrete Laplace pmf against its shift, summed term by term over a window wide enough that the tails left out
are below 1e-40, and its supremum over a dense grid of alpha.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import pytest

from dp_operators.accounting import (
    DiscreteLaplaceNoise,
    PrivacyLoss,
    charge_in_account_unit,
    discrete_laplace_rho,
    pure_epsilon_to_rho,
)
from dp_operators.accounting.discrete_laplace_renyi import (
    _certified,
    discrete_laplace_kl,
    discrete_laplace_rho_one_coordinate,
)
from dp_operators.release.plan import NoiseStep
from dp_operators.spec import Budget

DIGITS = 50
#: alpha - 1 = 10^(k/10) for k in [-80, 40): alpha from 1 + 1e-8 to 1 + 1e4, 120 points
ALPHA_GRID_EXPONENTS = range(-80, 40)
EPSILONS = ["0.1", "0.5", "1", "2", "5"]
SHIFTS = range(1, 7)


def mp(value) -> mpmath.mpf:
    value = Fraction(value)
    return mpmath.mpf(value.numerator) / value.denominator


def renyi_by_definition(beta: mpmath.mpf, shift: int, alpha: mpmath.mpf) -> mpmath.mpf:
    """D_alpha(P || P_shift) = ln(sum_x P(x)^alpha P_shift(x)^(1 - alpha)) / (alpha - 1), term by term.

    Each summand is exp(-beta (alpha |x| + (1 - alpha) |x - shift|)) times the normaliser; the next is this one times
    exp of the exponent's step, which takes one value on each of x < 0, 0 <= x < shift and x >= shift. The terms are
    formed by that product (one multiplication each instead of an exp; 5000 products lose < 1e-45 relative at 50
    digits) and summed one by one."""
    b = mpmath.exp(-beta)
    normaliser = (1 - b) / (1 + b)

    def exponent(x: int) -> mpmath.mpf:
        return -beta * (alpha * abs(x) + (1 - alpha) * abs(x - shift))

    # on x <= -w and x >= shift + w the summand is b^w times its value at -w... : a window of 40 / beta leaves out a
    # fraction below e^-40 of the sum (a truncated sum is smaller, so the test that the charge is above it holds)
    width = int(40 / beta) + shift
    ratios = {region: mpmath.exp(exponent(x + 1) - exponent(x)) for region, x in ((-1, -1), (0, 0), (1, shift))}
    term, terms = normaliser * mpmath.exp(exponent(-width)), []
    for x in range(-width, width + shift + 1):
        terms.append(term)
        term *= ratios[-1 if x < 0 else 0 if x < shift else 1]
    return mpmath.log(mpmath.fsum(terms)) / (alpha - 1)


def brute_force_supremum(epsilon: str, shift: int) -> mpmath.mpf:
    with mpmath.workdps(DIGITS):
        beta = mp(Fraction(epsilon)) / shift
        alphas = (1 + mpmath.mpf(10) ** (mpmath.mpf(k) / 10) for k in ALPHA_GRID_EXPONENTS)
        return max(renyi_by_definition(beta, shift, alpha) / alpha for alpha in alphas)


#: the small-epsilon references sum a wide window term by term (seconds each): slow, so they run in CI only
CASES = [
    pytest.param(eps, shift, id=f"epsilon {eps}, shift {shift}",
                 marks=[pytest.mark.slow] if eps in ("0.1", "0.5") and shift > 1 else [])
    for eps in EPSILONS for shift in SHIFTS
]


@pytest.mark.parametrize(("epsilon", "shift"), CASES)
def test_charge_is_an_upper_bound_of_the_brute_force_supremum_and_within_1e_6_of_it(epsilon, shift):
    """The certified rho_1 of an epsilon-DP step with L1 = shift lies above the brute-force sup, by < 1e-6 relative."""
    charge = discrete_laplace_rho_one_coordinate(shift / Fraction(epsilon), shift)
    supremum = brute_force_supremum(epsilon, shift)
    assert charge is not None
    assert mp(charge) >= supremum
    assert mp(charge) <= supremum * (1 + mpmath.mpf("1e-6"))


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_a_shift_of_one_unit_is_charged_epsilon_tanh_half_epsilon(epsilon):
    """With L1 one grid unit the charge is the randomized-response value, the pure-DP conversion, exactly."""
    eps = Fraction(epsilon)
    loss = PrivacyLoss("epsilon", eps, laplace=DiscreteLaplaceNoise(1 / eps, ((1, 1),)))
    assert charge_in_account_unit(loss, "zcdp") == pure_epsilon_to_rho(eps)
    with mpmath.workdps(DIGITS):  # the one-coordinate bound is the same value, above it by < 1e-8 relative
        own = mp(discrete_laplace_rho_one_coordinate(1 / eps, 1))
        assert mp(eps) * mpmath.tanh(mp(eps) / 2) <= own <= mp(eps) * mpmath.tanh(mp(eps) / 2) * (1 + 1e-8)


@pytest.mark.parametrize(("shift", "figure"), [pytest.param(2, "0.3935", id="shift 2"), pytest.param(5, "0.3721", id="shift 5")])
def test_epsilon_1_over_two_and_five_units_reproduces_the_published_figures(shift, figure):
    """At epsilon 1 a sensitivity of 2 (5) units is charged 0.3935 (0.3721), against 0.4621 for the conversion."""
    loss = PrivacyLoss("epsilon", Fraction(1), laplace=DiscreteLaplaceNoise(Fraction(shift), ((shift, 1),)))
    charge = charge_in_account_unit(loss, "zcdp")
    assert round(float(charge), 4) == float(figure)
    assert pure_epsilon_to_rho(1) == Fraction("0.462117157261")


def test_the_closed_form_kl_matches_the_definition():
    """The interval KL of the closed form encloses the term-by-term KL of the definition (shift 49, epsilon 0.1)."""
    from support import discrete_laplace_kl_reference

    with mpmath.workdps(DIGITS):
        reference = discrete_laplace_kl_reference(Fraction(1, 10), 49)
        upper = mp(discrete_laplace_kl(Fraction(490), 49))
        # the reference's 49 terms of both signs cancel a few of its 50 digits
        assert abs(upper - reference) <= reference * mpmath.mpf("1e-40")


def test_the_charge_grows_with_the_shift_at_a_fixed_scale():
    """rho_1 does not decrease in the shift (the worst neighbour moves each coordinate by its largest shift)."""
    charges = [discrete_laplace_rho_one_coordinate(Fraction(3), shift) for shift in range(1, 13)]
    assert charges == sorted(charges) and len(set(charges)) == len(charges)


def test_coordinates_add_over_the_classes_of_shifts():
    """l0 coordinates moved by linf and others by a smaller allowance are charged the sum of their rho_1."""
    scale = Fraction(20)
    per_touched = discrete_laplace_rho_one_coordinate(scale, 7)
    per_untouched = discrete_laplace_rho_one_coordinate(scale, 1)
    assert discrete_laplace_rho(scale, ((7, 3), (1, 40))) == 3 * per_touched + 40 * per_untouched


def test_a_candidate_below_the_kl_is_not_certified():
    """The certificate refuses 1 % below the true supremum: it can fail, so its successes mean something."""
    beta, shift = Fraction(1, 2), 2
    kl = discrete_laplace_kl(1 / beta, shift)
    assert _certified(beta, shift, kl * (1 + Fraction(1, 10**9)))
    assert not _certified(beta, shift, kl * Fraction(99, 100))


def test_small_epsilon_per_coordinate_falls_back_to_the_pure_dp_conversion():
    """Below epsilon 0.01 per coordinate no certificate is attempted and the conversion is charged."""
    eps = Fraction(1, 200)
    assert discrete_laplace_rho_one_coordinate(4 / eps, 4) is None
    loss = PrivacyLoss("epsilon", eps, laplace=DiscreteLaplaceNoise(4 / eps, ((4, 1),)))
    assert charge_in_account_unit(loss, "zcdp") == pure_epsilon_to_rho(eps)


@pytest.mark.parametrize("accountant", ["pure_dp", "approx_dp"])
def test_epsilon_accounts_keep_charging_epsilon(accountant):
    """Pure and approximate DP accounts are charged the step's epsilon, whatever its shifts."""
    loss = PrivacyLoss("epsilon", Fraction(1), laplace=DiscreteLaplaceNoise(Fraction(5), ((5, 1),)))
    assert charge_in_account_unit(loss, accountant) == 1


def test_a_loss_whose_epsilon_disagrees_with_its_noise_is_refused():
    """A Laplace descriptor must describe the stated epsilon: L1 / t, exactly."""
    with pytest.raises(ValueError, match="is 1-DP, not the epsilon 1/2"):
        PrivacyLoss("epsilon", Fraction(1, 2), laplace=DiscreteLaplaceNoise(Fraction(5), ((5, 1),)))


def laplace_step(linf: int, l0: int, epsilon: Fraction, **shift) -> NoiseStep:
    scale = Fraction(l0 * linf + shift.get("untouched_partitions", 0) * shift.get("untouched_allowance", 0)) / epsilon
    return NoiseStep(
        "total", "sum", "discrete_laplace", Budget.model_construct(epsilon=epsilon), linf, l0, scale, Fraction(1),
        10, **shift,
    )


def test_a_plan_step_is_charged_its_own_bound_on_a_zcdp_account():
    """A Laplace sum over 5 grid units in 2 partitions at epsilon 1 costs 2 rho_1(t = 10, shift 5) on zCDP."""
    step = laplace_step(5, 2, Fraction(1))
    assert step.epsilon == 1
    charge = charge_in_account_unit(step.privacy_loss("zcdp"), "zcdp")
    assert charge == 2 * discrete_laplace_rho_one_coordinate(Fraction(10), 5) < pure_epsilon_to_rho(1)
    assert charge_in_account_unit(step.privacy_loss("pure_dp"), "pure_dp") == 1


def test_a_plan_step_with_untouched_partitions_charges_their_allowance_too():
    """Binary64 sums over public keys: the untouched partitions' allowance is charged with the touched ones."""
    step = laplace_step(5, 1, Fraction(2), untouched_allowance=1, untouched_partitions=3)
    scale = step.scale
    expected = discrete_laplace_rho(scale, ((5, 1), (1, 3)))
    assert charge_in_account_unit(step.privacy_loss("zcdp"), "zcdp") == min(expected, pure_epsilon_to_rho(2))
