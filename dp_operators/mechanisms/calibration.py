"""Calibration between privacy budgets and noise scales, exact wherever the math is rational.

Inputs may be ints, ``Fraction``/``Decimal`` or finite floats; floats are converted exactly with ``Fraction(x)``,
so a float budget of 0.1 is the binary number 0.1000000000000000055..., not 1/10. Pass ``Fraction(1, 10)`` for 1/10.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

from dp_operators.mechanisms._rational import as_open_unit_interval, as_positive_rational

__all__ = [
    "discrete_gaussian_sigma2",
    "discrete_laplace_scale",
    "pure_epsilon_to_rho",
    "rho_for_approx_dp",
    "rho_to_epsilon",
]


def discrete_laplace_scale(l1_sensitivity: Fraction | int, epsilon: Fraction | int) -> Fraction:
    """Scale of discrete Laplace noise that makes a query with the given L1 sensitivity epsilon-DP (pure).

    Returns ``l1_sensitivity / epsilon`` exactly, in the units of the query (e.g. people). Both arguments must be
    positive finite rationals, else ValueError naming the parameter.

    Source: Canonne, Kamath, Steinke 2020, Section 2 (discrete Laplace: Lap_Z(t) is (Delta/t)-DP for sensitivity
    Delta); Ghosh, Roughgarden, Sundararajan 2009 (geometric mechanism).
    """
    return as_positive_rational(l1_sensitivity, "l1_sensitivity") / as_positive_rational(epsilon, "epsilon")


def discrete_gaussian_sigma2(l2_sensitivity_squared: Fraction | int, rho: Fraction | int) -> Fraction:
    """sigma^2 of discrete Gaussian noise that makes a query rho-zCDP.

    Returns ``l2_sensitivity_squared / (2 rho)`` exactly, in squared query units. The squared sensitivity is asked
    for so that sqrt(k)-type L2 sensitivities stay exact (pass k * s^2). Both arguments must be positive finite
    rationals, else ValueError naming the parameter.

    Source: Canonne, Kamath, Steinke 2020, Theorem 14 (N_Z(0, sigma^2) is Delta^2/(2 sigma^2)-zCDP).
    """
    l2_squared = as_positive_rational(l2_sensitivity_squared, "l2_sensitivity_squared")
    return l2_squared / (2 * as_positive_rational(rho, "rho"))


def pure_epsilon_to_rho(epsilon: Fraction | int) -> Fraction:
    """rho such that every epsilon-DP mechanism is rho-zCDP: ``epsilon**2 / 2`` exactly.

    epsilon must be a positive finite rational, else ValueError. Source: Bun & Steinke 2016, Proposition 1.4.
    """
    epsilon = as_positive_rational(epsilon, "epsilon")
    return epsilon * epsilon / 2


# log(alpha - 1) is searched over this range: the optimum is near log(sqrt(ln(1/delta)/rho)), which stays inside
# it for every rho in [1e-40, 1e12] and delta >= 1e-300; outside it the result is still valid, just less tight.
_LOG_ALPHA_MINUS_ONE_RANGE = (-40.0, 60.0)
_GRID_POINTS = 401
_GOLDEN_ITERATIONS = 100


def _cks_epsilon_terms(x: float, rho: float, log_inv_delta: float) -> tuple[float, ...]:
    """Terms of the CKS 2020 bound at alpha = 1 + exp(x); their sum is a valid epsilon for any real x."""
    alpha_minus_one = math.exp(x)
    inv = 1.0 / alpha_minus_one
    log_alpha = math.log1p(alpha_minus_one)
    # alpha rho + (ln(1/delta) + (alpha-1) ln(1-1/alpha) - ln alpha) / (alpha-1), rewritten with
    # ln(1-1/alpha) = -log1p(1/(alpha-1)) so that alpha near 1 or very large does not cancel catastrophically
    return (rho, alpha_minus_one * rho, log_inv_delta * inv, -math.log1p(inv), -log_alpha * inv)


def _log_inverse(delta: Fraction) -> float:
    """ln(1/delta) for an exact delta in (0, 1), accurate to a few ulps even for delta near 1 or below 1e-308."""
    if delta > Fraction(1, 2):
        return -math.log1p(float(delta - 1))
    # scale by a power of two into (1/2, 2] so float() neither underflows nor loses the exponent
    k = delta.denominator.bit_length() - delta.numerator.bit_length()
    return k * math.log(2) - math.log(float(delta * 2**k))


def rho_to_epsilon(rho: Fraction | int | float, delta: Fraction | float) -> float:
    """Smallest epsilon for which rho-zCDP implies (epsilon, delta)-DP, by the tight CKS 2020 conversion.

    epsilon = inf over alpha > 1 of
        alpha rho + (ln(1/delta) + (alpha - 1) ln(1 - 1/alpha) - ln(alpha)) / (alpha - 1),
    minimised numerically over log(alpha - 1) (grid, then golden-section search). Every alpha gives a valid bound,
    so an imperfect minimum only costs tightness, never validity; the returned float is rounded up by a
    floating-point error bound for the evaluation, and is never above the Bun-Steinke bound
    rho + 2 sqrt(rho ln(1/delta)). Clamped at 0 (an (eps, delta) guarantee with eps < 0 implies one with eps = 0).

    Args:
        rho: zCDP parameter, positive finite. delta: in (0, 1).

    Returns:
        epsilon as a float (dimensionless).

    Raises:
        ValueError: rho not positive finite, or delta not in (0, 1), naming the parameter and value.

    Source: Canonne, Kamath, Steinke 2020, Corollary 13; Bun & Steinke 2016, Proposition 1.3 (the looser bound).
    """
    rho_q = as_positive_rational(rho, "rho")
    rho_f = float(rho_q)
    if rho_f < rho_q:  # rounding rho down would under-report epsilon
        rho_f = math.nextafter(rho_f, math.inf)
    log_inv_delta = _log_inverse(as_open_unit_interval(delta, "delta"))

    def bound(x: float) -> float:
        return math.fsum(_cks_epsilon_terms(x, rho_f, log_inv_delta))

    lo, hi = _LOG_ALPHA_MINUS_ONE_RANGE
    step = (hi - lo) / (_GRID_POINTS - 1)
    grid = [lo + i * step for i in range(_GRID_POINTS)]
    best = min(range(_GRID_POINTS), key=lambda i: bound(grid[i]))
    # the bound is unimodal in x in practice; refine in the bracket around the best grid point
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, _GRID_POINTS - 1)]
    inv_phi = (math.sqrt(5) - 1) / 2
    c, d = b - inv_phi * (b - a), a + inv_phi * (b - a)
    fc, fd = bound(c), bound(d)
    for _ in range(_GOLDEN_ITERATIONS):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - inv_phi * (b - a)
            fc = bound(c)
        else:
            a, c, fc = c, d, fd
            d = a + inv_phi * (b - a)
            fd = bound(d)
    x_best = min((grid[best], c, d), key=bound)

    terms = _cks_epsilon_terms(x_best, rho_f, log_inv_delta)
    # each term carries a few ulps of error from exp/log1p/log; fsum adds none, so this margin covers the total
    margin = 8 * sys.float_info.epsilon * math.fsum(abs(term) for term in terms)
    epsilon = math.nextafter(math.fsum(terms) + margin, math.inf)
    bun_steinke = rho_f + 2 * math.sqrt(rho_f * log_inv_delta)
    bun_steinke = math.nextafter(bun_steinke + 4 * sys.float_info.epsilon * bun_steinke, math.inf)
    return max(0.0, min(epsilon, bun_steinke))


def rho_for_approx_dp(epsilon: Fraction | int | float, delta: Fraction | float) -> Fraction:
    """The largest rho (a decimal with 12 significant digits, rounded down) such that rho-zCDP implies
    (epsilon, delta)-DP by :func:`rho_to_epsilon`.

    Used to calibrate a discrete Gaussian from an (epsilon, delta) budget: the mechanism is calibrated to, and
    charged, this rho, so its guarantee is exactly rho-zCDP and therefore (epsilon, delta)-DP.

    Raises:
        ValueError: epsilon not positive finite, or delta not in (0, 1).

    Source: Canonne, Kamath, Steinke 2020, Corollary 13 (monotone in rho, so a bisection finds the inverse).
    """
    epsilon_f = float(as_positive_rational(epsilon, "epsilon"))
    delta_q = as_open_unit_interval(delta, "delta")
    low, high = 0.0, epsilon_f  # rho = epsilon already gives rho_to_epsilon(rho) > epsilon for any delta < 1
    for _ in range(200):
        middle = (low + high) / 2
        if middle <= low or middle >= high:
            break
        if rho_to_epsilon(middle, delta_q) <= epsilon_f:
            low = middle
        else:
            high = middle
    if low == 0.0:
        raise ValueError(f"no rho > 0 reaches epsilon={epsilon} at delta={delta}")
    exponent = math.floor(math.log10(low)) - 11
    rho = Fraction(math.floor(Fraction(low) / Fraction(10) ** exponent)) * Fraction(10) ** exponent
    while rho_to_epsilon(rho, delta_q) > epsilon_f:  # guard the float round trip
        rho -= Fraction(10) ** exponent
    return rho
