"""Gaussian differential privacy (mu-GDP): conversions to and from (epsilon, delta), in high precision.

A mechanism is mu-GDP when distinguishing neighbours is no easier than telling N(0, 1) from N(mu, 1). The
Gaussian mechanism with L2 sensitivity Delta and noise sigma is exactly (Delta / sigma)-GDP, and mu_i-GDP mechanisms
compose to sqrt(sum mu_i^2)-GDP exactly (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022,
arXiv:1905.02383; Thm 2.7 and Cor. 3.3). So a Gaussian-only account keeps ``mu^2`` as an exact rational running
total, and nothing is lost to composition.

mu-GDP holds if and only if (epsilon, delta(epsilon))-DP holds for every epsilon >= 0 with (ibid., Cor. 2.13)

    delta_mu(epsilon) = Phi(-epsilon / mu + mu / 2) - e^epsilon * Phi(-epsilon / mu - mu / 2).

``Phi`` and ``exp`` are irrational: they are evaluated with mpmath at :data:`PRECISION_DIGITS` significant digits
(errors near 1e-60, far below the 1e-12 steps the results are rounded to), and every result is rounded in the safe
direction: a cap in mu^2 *down*, a reported epsilon *up*.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath

from dp_operators.accounting.budget import exact_number

#: Significant decimal digits for the evaluation of ``delta_mu(epsilon)``.
PRECISION_DIGITS = 60
#: A cap in mu^2 derived from (epsilon, delta) is a decimal with this many significant digits, rounded down.
CAP_SIGNIFICANT_DIGITS = 12
_BISECTION_STEPS = 200


def _mp(value: Fraction) -> mpmath.mpf:
    return mpmath.mpf(value.numerator) / value.denominator


def gdp_delta(mu_squared: Fraction, epsilon: Fraction) -> mpmath.mpf:
    """``delta_mu(epsilon)`` of a sqrt(mu_squared)-GDP mechanism (Dong, Roth & Su, Cor. 2.13), as an mpmath number.

    Args:
        mu_squared: mu^2 >= 0 (exact). epsilon: >= 0 (exact).
    """
    mu_squared, epsilon = exact_number(mu_squared, name="mu_squared"), exact_number(epsilon, name="epsilon")
    if mu_squared < 0 or epsilon < 0:
        raise ValueError(f"mu^2 and epsilon must be >= 0, got {mu_squared} and {epsilon}")
    if mu_squared == 0:
        return mpmath.mpf(0)
    with mpmath.workdps(PRECISION_DIGITS):
        mu, eps = mpmath.sqrt(_mp(mu_squared)), _mp(epsilon)
        return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


def gdp_epsilon(mu_squared: Fraction, delta: Fraction) -> float:
    """The smallest epsilon with sqrt(mu_squared)-GDP => (epsilon, delta)-DP, as a float rounded up.

    ``delta_mu`` decreases in epsilon, so a bisection finds it; the upper end of the final bracket is returned,
    which satisfies ``delta_mu(epsilon) <= delta`` in the high-precision evaluation.

    Raises:
        ValueError: mu_squared < 0 or delta outside (0, 1).
    """
    mu_squared, delta = exact_number(mu_squared, name="mu_squared"), exact_number(delta, name="delta")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if mu_squared < 0:
        raise ValueError(f"mu^2 must be >= 0, got {mu_squared}")
    if gdp_delta(mu_squared, Fraction(0)) <= _mp(delta):
        return 0.0
    with mpmath.workdps(PRECISION_DIGITS):
        mu = mpmath.sqrt(_mp(mu_squared))
        # mu^2/2 + mu * z_(1-delta) is a valid epsilon (the privacy-loss tail); widen until it is certainly above
        high = mu * mu / 2 + mu * mpmath.sqrt(2 * mpmath.log(1 / _mp(delta))) + 1
        while gdp_delta(mu_squared, _fraction(high)) > _mp(delta):
            high *= 2
        low = mpmath.mpf(0)
        for _ in range(_BISECTION_STEPS):
            middle = (low + high) / 2
            if gdp_delta(mu_squared, _fraction(middle)) <= _mp(delta):
                high = middle
            else:
                low = middle
        bound = _fraction(high)
    result = float(bound)
    return math.nextafter(result, math.inf) if Fraction(result) < bound else result


def gdp_mu_squared_for_approx_dp(epsilon: Fraction, delta: Fraction) -> Fraction:
    """The largest mu^2 (a decimal with :data:`CAP_SIGNIFICANT_DIGITS` significant digits, rounded down) such that
    sqrt(mu^2)-GDP implies (epsilon, delta)-DP. This is how a ``gaussian_dp`` account configured by
    (epsilon, delta) gets its cap.

    ``delta_mu(epsilon)`` increases in mu, so a bisection finds the boundary; the result is then checked in high
    precision and stepped down until ``delta_mu(epsilon) <= delta`` holds.

    Raises:
        ValueError: epsilon <= 0 or delta outside (0, 1).
    """
    epsilon, delta = exact_number(epsilon, name="epsilon"), exact_number(delta, name="delta")
    if epsilon <= 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and delta in (0, 1), got epsilon={epsilon}, delta={delta}")
    with mpmath.workdps(PRECISION_DIGITS):
        target = _mp(delta)
        low, high = mpmath.mpf(0), mpmath.mpf(1)
        while gdp_delta(_fraction(high * high), epsilon) <= target:
            high *= 2
        for _ in range(_BISECTION_STEPS):
            middle = (low + high) / 2
            if gdp_delta(_fraction(middle * middle), epsilon) <= target:
                low = middle
            else:
                high = middle
        mu_squared = _fraction(low * low)
    if mu_squared == 0:
        raise ValueError(f"no mu > 0 reaches epsilon={epsilon} at delta={delta}")
    exponent = math.floor(math.log10(mu_squared)) - (CAP_SIGNIFICANT_DIGITS - 1)
    step = Fraction(10) ** exponent
    cap = Fraction(math.floor(mu_squared / step)) * step
    while gdp_delta(cap, epsilon) > target:
        cap -= step
    return cap


def _fraction(value: mpmath.mpf) -> Fraction:
    """An mpmath binary float as the exact Fraction it is."""
    mantissa, exponent = mpmath.mpf(value).man_exp
    return Fraction(int(mantissa)) * Fraction(2) ** int(exponent)
