"""Calibration between privacy budgets and noise scales, exact wherever the math is rational.

Inputs are the typed values of :mod:`dp_operators.accounting.values` (:class:`~dp_operators.accounting.Epsilon`,
:class:`~dp_operators.accounting.Rho`, :class:`~dp_operators.accounting.Delta`, :class:`~dp_operators.accounting.
Sensitivity`, :class:`~dp_operators.accounting.NoiseScale`), taken as they are: the engine reads each budget once, at
the spec (docs/adr/0028). A direct caller may pass ints, ``Fraction``/``Decimal`` or finite floats instead; they are
read here, a float as the decimal it was typed as (``0.1`` is 1/10), as everywhere in the project
(:func:`dp_operators.accounting.exact_number`). Results are typed too: a scale is a ``NoiseScale``, a calibrated
budget an ``Epsilon`` or a ``Rho``.
"""

from __future__ import annotations

import math
import sys
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

from dp_operators.accounting.conversions import largest_epsilon_within_rho, pure_epsilon_to_rho
from dp_operators.accounting.values import Delta, Epsilon, NoiseScale, Rho, Sensitivity
from dp_operators.mechanisms._rational import as_open_unit_interval, as_positive_rational, as_typed

__all__ = [
    "discrete_gaussian_sigma2",
    "discrete_gaussian_sigma2_for_approx_dp",
    "discrete_gaussian_threshold",
    "discrete_laplace_threshold",
    "epsilon_for_rho",
    "epsilon_for_discrete_gaussian_accuracy",
    "epsilon_for_discrete_laplace_accuracy",
    "rho_for_discrete_gaussian_accuracy",
    "discrete_laplace_scale",
    "pure_epsilon_to_rho",
    "rho_for_approx_dp",
    "rho_to_epsilon",
]


def discrete_laplace_scale(l1_sensitivity: Sensitivity | int, epsilon: Epsilon | Fraction | int) -> NoiseScale:
    """Scale of discrete Laplace noise that makes a query with the given L1 sensitivity epsilon-DP (pure).

    Returns ``l1_sensitivity / epsilon`` exactly, in the units of the query (e.g. people). Both arguments must be
    positive finite rationals, else ValueError naming the parameter.

    Source: Canonne, Kamath, Steinke 2020, Section 2 (discrete Laplace: Lap_Z(t) is (Delta/t)-DP for sensitivity
    Delta); Ghosh, Roughgarden, Sundararajan 2009 (geometric mechanism).
    """
    l1 = as_typed(Sensitivity, l1_sensitivity, "l1_sensitivity")
    return NoiseScale(l1 / as_typed(Epsilon, epsilon, "epsilon"))


def discrete_gaussian_sigma2(l2_sensitivity_squared: Sensitivity | int, rho: Rho | Fraction | int) -> NoiseScale:
    """sigma^2 of discrete Gaussian noise that makes a query rho-zCDP.

    Returns ``l2_sensitivity_squared / (2 rho)`` exactly, in squared query units. The squared sensitivity is asked
    for so that sqrt(k)-type L2 sensitivities stay exact (pass k * s^2). Both arguments must be positive finite
    rationals, else ValueError naming the parameter.

    Source: Canonne, Kamath, Steinke 2020, Theorem 14 (N_Z(0, sigma^2) is Delta^2/(2 sigma^2)-zCDP).
    """
    l2_squared = as_typed(Sensitivity, l2_sensitivity_squared, "l2_sensitivity_squared")
    return NoiseScale(l2_squared / (2 * as_typed(Rho, rho, "rho")), name="sigma2")


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


def rho_to_epsilon(rho: Rho | Fraction | int | float, delta: Delta | Fraction | float) -> float:
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
    rho_f = _float_not_below(as_typed(Rho, rho, "rho"))
    return _cks_epsilon(rho_f, _log_inverse(as_typed(Delta, delta, "delta")))


def _float_not_below(value: Fraction) -> float:
    """The float nearest ``value``, or the next one up if that is below it (rounding rho down would under-report
    epsilon)."""
    rounded = float(value)
    return math.nextafter(rounded, math.inf) if rounded < value else rounded


def _cks_epsilon(rho_f: float, log_inv_delta: float) -> float:
    """:func:`rho_to_epsilon` of a float rho (already rounded up) and ln(1/delta) (:func:`_log_inverse`)."""

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


@lru_cache(maxsize=256)  # the components of a mean or variance share one (epsilon, delta): about 50 ms each
def rho_for_approx_dp(epsilon: Epsilon | Fraction | int | float, delta: Delta | Fraction | float) -> Rho:
    """The largest rho (a decimal with 12 significant digits, rounded down) such that rho-zCDP implies
    (epsilon, delta)-DP by :func:`rho_to_epsilon`.

    Used to calibrate a discrete Gaussian from an (epsilon, delta) budget: the mechanism is calibrated to, and
    charged, this rho, so its guarantee is exactly rho-zCDP and therefore (epsilon, delta)-DP.

    Raises:
        ValueError: epsilon not positive finite, or delta not in (0, 1).

    Source: Canonne, Kamath, Steinke 2020, Corollary 13 (monotone in rho, so a bisection finds the inverse).
    """
    epsilon_f = float(as_typed(Epsilon, epsilon, "epsilon"))
    delta_q = as_typed(Delta, delta, "delta")
    log_inv_delta = _log_inverse(delta_q)  # once, not at every probe
    low, high = 0.0, epsilon_f  # rho = epsilon already gives rho_to_epsilon(rho) > epsilon for any delta < 1
    for _ in range(200):
        middle = (low + high) / 2
        if middle <= low or middle >= high:
            break
        # a probe is the decimal its float prints as, as rho_to_epsilon reads a float (the search's path, and so
        # its result, stay what they were when each probe went through rho_to_epsilon)
        if _cks_epsilon(_float_not_below(Fraction(Decimal(repr(middle)))), log_inv_delta) <= epsilon_f:
            low = middle
        else:
            high = middle
    if low == 0.0:
        raise ValueError(f"no rho > 0 reaches epsilon={epsilon} at delta={delta}")
    exponent = math.floor(math.log10(low)) - 11
    rho = Rho(Fraction(math.floor(Fraction(low) / Fraction(10) ** exponent)) * Fraction(10) ** exponent)
    while rho_to_epsilon(rho, delta_q) > epsilon_f:  # guard the float round trip
        rho = Rho(rho - Fraction(10) ** exponent)
    return rho


# -- (epsilon, delta) calibration of the discrete Gaussian ---------------------------------------------------------
_SIGNIFICANT_DIGITS = 12


def _round_up_decimal(value: float | Fraction) -> Fraction:
    """``value`` rounded up to a decimal with 12 significant digits (a short, exact rational)."""
    value = Fraction(value)
    exponent = math.floor(math.log10(value)) - (_SIGNIFICANT_DIGITS - 1)
    step = Fraction(10) ** exponent
    return math.ceil(value / step) * step


#: Relative step of the scan for the smallest valid sigma where the privacy profile is not monotone in sigma.
_SCAN_STEP = 2.0**-8
#: The profile is scanned (not bisected) while sigma * sqrt(l0) is at most this many grid units; above it the
#: profile was found nonincreasing in sigma (docs/adr/0011), and an interpolating search is used.
_LATTICE_SCAN_LIMIT = 16.0
#: Above the lattice region the certified lower end is only refined to this relative width: each step costs two
#: tail sums of up to 4e5 terms (sigma near 1e4), and the interpolating search starts from its own probes.
_CERTIFIED_PRECISION = 2.0**-10
#: The search stops when the smallest valid sigma is bracketed to this relative width.
_SIGMA_TOLERANCE = 1e-10
#: First probes of the interpolating search, relative to the continuous analytic Gaussian's sigma: above the
#: lattice region the discrete one was from 4e-5 below to 3e-3 above it in a sweep of 1260 budgets, mostly
#: within 1e-5 (docs/adr/0019).
_REFERENCE_STEP = 1e-3


def _certified_invalid_below(epsilon: Fraction, target: float, linf: int, high: float) -> float:
    """A sigma such that every sigma' <= it gives delta(epsilon) > target, for any l0 (0.0 if none is found, which
    needs delta > 1 - 1e-9).

    The test A = {y <= 0} on one coordinate gives delta(sigma) >= g(sigma) = P[Y >= 0] - e^eps P[Y >= linf]
    (Y ~ N_Z(0, sigma^2); the other coordinates are a post-processing away). P[Y >= 0] = (1 + P[Y = 0]) / 2
    decreases in sigma and P[Y >= linf] increases (the family has a likelihood ratio increasing in |y|, so |Y|
    grows stochastically with sigma), so g decreases: g(a) > target excludes every sigma <= a. P[Y >= linf] is
    bounded above by its float value with a relative margin, or by exp(-linf^2 / (2 sigma^2)) (the discrete Gaussian
    is sigma^2-subgaussian, CKS 2020) where the float underflows; e^eps times it is formed in the log domain.
    """
    from dp_operators.mechanisms.accuracy import discrete_gaussian_upper_tail

    def excluded(sigma: float) -> bool:
        sigma2 = sigma * sigma
        tail = discrete_gaussian_upper_tail(linf, sigma2)
        log_tail = math.log(tail * (1 + 1e-12)) if tail > 1e-300 else -(linf * linf) / (2 * sigma2)
        exponent = float(epsilon) + log_tail
        if exponent > 0:  # e^eps P[Y >= linf] >= 1 >= P[Y >= 0]: g <= 0
            return False
        g = discrete_gaussian_upper_tail(0, sigma2) * (1 - 1e-12) - math.exp(exponent) * (1 + 1e-12)
        return g > target

    low = high / 2**40
    if not excluded(low):
        return 0.0
    for _ in range(60):
        if low > _LATTICE_SCAN_LIMIT and high - low <= _CERTIFIED_PRECISION * high:
            break  # no lattice scan starts above 16, and the interpolating search needs no tighter lower end
        middle = (low + high) / 2
        if excluded(middle):
            low = middle
        else:
            high = middle
    return low


def _interpolated_crossing(probe, low: float, high: float, low_excess, high_excess) -> None:
    """Narrow [low, high] (low invalid, high valid) to a relative width of _SIGMA_TOLERANCE for a profile that
    decreases in sigma.

    ``probe(sigma)`` checks sigma against the exact profile and returns ``(valid, excess)`` with excess =
    ln(delta / target), or None where unknown; it records the valid points itself. The excesses at the ends may
    be None. Each step is regula falsi on the excess with the Illinois modification (an end kept twice in a row
    has its excess halved, so that both ends converge; Dowell & Jarratt, BIT 11, 1971), or a bisection while an
    end's excess is unknown or the bracket has not halved in three steps. The bracket is kept at every step, so
    for a monotone profile the result is the one a bisection to the same width gives, in about 5-10 profile
    evaluations instead of 25-30.
    """
    kept, steps, halved_at = 0, 0, high - low  # kept: +1 low was kept last step, -1 high was
    while high - low > _SIGMA_TOLERANCE * high:
        steps += 1
        if high - low <= halved_at / 2:
            steps, halved_at = 0, high - low
        if low_excess is None or high_excess is None or low_excess <= high_excess or steps > 3:
            sigma = (low + high) / 2
        else:
            sigma = high - high_excess * (high - low) / (high_excess - low_excess)
            margin = _SIGMA_TOLERANCE * high / 4  # every step moves an end by at least this
            sigma = min(max(sigma, low + margin), high - margin)
        valid, value = probe(sigma)
        if valid:
            high, high_excess = sigma, value
            if kept == 1 and low_excess is not None:
                low_excess /= 2
            kept = 1
        else:
            low, low_excess = sigma, value
            if kept == -1 and high_excess is not None:
                high_excess /= 2
            kept = -1


@lru_cache(maxsize=512)
def discrete_gaussian_sigma2_for_approx_dp(
    epsilon: Fraction | int | float, delta: Fraction | float, *, linf: int = 1, l0: int = 1
) -> Fraction:
    """The smallest sigma^2 (12 significant digits, rounded up) for which adding i.i.d. discrete Gaussian noise
    N_Z(0, sigma^2) to an integer vector is (epsilon, delta)-DP, when neighbours differ by at most ``linf`` grid
    units in each of at most ``l0`` coordinates (L2 sensitivity sqrt(l0) * linf). Valid for every epsilon > 0.

    Two valid calibrations are computed and the smaller sigma^2 returned:

    * the exact privacy profile of the discrete Gaussian
      (:func:`~dp_operators.mechanisms.privacy_profile.discrete_gaussian_delta`; CKS 2020 Theorem 7 for one
      coordinate; for vectors an FFT, or Poisson summation from sigma 4 on, with proven error bounds). The
      returned sigma^2 is itself checked against the profile, so validity never rests on the search;
    * the zCDP route: sigma^2 = l0 linf^2 / (2 rho) with the largest rho whose CKS 2020 Corollary 13 conversion
      implies (epsilon, delta) (:func:`rho_for_approx_dp`), used when the exact profile is too large to compute.

    The search does not assume that delta(sigma) decreases: on the lattice, it does not for small sigma (e.g.
    epsilon 5, delta 1e-10, one partition: sigma 1.2251-1.2311 is valid, 1.2311-1.2962 is not). Every sigma up to
    a certified bound is invalid (:func:`_certified_invalid_below`); above it, while sigma sqrt(l0) <= 16, a
    geometric grid of ratio 1 + 2^-8 is scanned upwards for the first valid sigma, and the cell before it is
    bisected; beyond that the profile is searched as a nonincreasing function (docs/adr/0011 for the survey behind
    the limit), by interpolation from probes next to the continuous analytic Gaussian's sigma
    (:func:`_interpolated_crossing`: the bracket of a bisection in 5-10 profile evaluations instead of 25-30;
    docs/adr/0019). Either way the smallest valid sigma is bracketed to a relative 1e-10. The result is the
    smallest valid sigma up to islands of validity narrower than one grid step between two invalid grid points.
    Within 0.3 % of the analytic Gaussian mechanism's sigma (Balle & Wang 2018) once sigma >= 4, including delta
    down to 1e-12 and L0 up to 1000 (benchmarks/noise_efficiency.py).

    Raises:
        ValueError: epsilon not positive finite, delta not in (0, 1), linf or l0 not positive ints.
    """
    from dp_operators.mechanisms.privacy_profile import analytic_gaussian_sigma, discrete_gaussian_delta

    epsilon_q = as_typed(Epsilon, epsilon, "epsilon")
    delta_q = as_typed(Delta, delta, "delta")
    for name, value in (("linf", linf), ("l0", l0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    l2_squared = l0 * linf * linf
    by_zcdp = NoiseScale(_round_up_decimal(Fraction(l2_squared) / (2 * rho_for_approx_dp(epsilon_q, delta_q))))
    target = float(delta_q)
    if Fraction(target) > delta_q:  # compare with a float that is not above delta
        target = math.nextafter(target, 0.0)

    def candidate(sigma: float) -> NoiseScale:
        return NoiseScale(_round_up_decimal(Fraction(sigma) ** 2), name="sigma2")

    def check(sigma2: Fraction) -> tuple[bool, float]:
        """(delta(sigma2) <= target, ln(delta / target)): validity from the exact comparison, the logarithm (the
        profile is never below 1e-300) only steers the search."""
        delta_at = discrete_gaussian_delta(sigma2, epsilon_q, linf=linf, l0=l0)
        valid = delta_at <= target
        excess = math.log(delta_at) - math.log(target)
        return valid, excess if valid else max(excess, 1e-300)  # an invalid point's excess is positive

    valid_at_zcdp, excess_at_zcdp = check(by_zcdp)
    if not valid_at_zcdp:  # the exact profile is out of reach (FFT too large): the zCDP route stands
        return by_zcdp
    # invariant: low is invalid (or 0), high is valid and `checked` is the sigma^2 that was checked there
    checked, high = by_zcdp, math.sqrt(by_zcdp)
    low = _certified_invalid_below(epsilon_q, target, linf, high)

    def probe(sigma: float) -> tuple[bool, float | None]:
        """Check sigma (its sigma^2 rounded up to 12 digits); a valid one becomes the new high. A sigma^2 that
        rounds to `checked` or above counts as invalid, with no excess."""
        nonlocal checked, high
        sigma2 = candidate(sigma)
        if sigma2 >= checked:
            return False, None
        valid, excess = check(sigma2)
        if valid:
            checked, high = sigma2, sigma
        return valid, excess

    # the lattice region: scan upwards for the first valid grid point, then bisect its cell (or the last one
    # below high, when high itself is in the lattice region)
    scan_limit = min(high, _LATTICE_SCAN_LIMIT / math.sqrt(l0))
    sigma = low * (1 + _SCAN_STEP) if low > 0 else scan_limit / 2**40
    while sigma < scan_limit and not probe(sigma)[0]:
        low, sigma = sigma, sigma * (1 + _SCAN_STEP)
    if sigma < scan_limit or scan_limit == high:
        while high - low > _SIGMA_TOLERANCE * high:
            middle = (low + high) / 2
            if not probe(middle)[0]:
                low = middle
        return checked
    # No valid sigma in the lattice region: the profile decreases above it (docs/adr/0011), so the crossing is
    # found by interpolation from probes next to the continuous optimum (Balle & Wang 2018). That optimum is a
    # guess, not a bound (the discrete Gaussian can be valid below it): every point is checked.
    reference = analytic_gaussian_sigma(float(epsilon_q), target, math.sqrt(l2_squared))
    low_excess, high_excess = None, excess_at_zcdp
    for guess in (reference, reference * (1 - _REFERENCE_STEP), reference * (1 + _REFERENCE_STEP)):
        if not low < guess < high:
            continue
        valid, excess = probe(guess)
        if valid:
            high_excess = excess
        else:
            low, low_excess = guess, excess
        if guess != reference:  # one probe on each side of the reference's verdict is enough
            break
    _interpolated_crossing(probe, low, high, low_excess, high_excess)
    return checked


# -- target accuracy -> smallest budget ------------------------------------------------------------------------
def _largest_scale_within(half_width: float, accuracy, start: float) -> float:
    """Largest scale s with accuracy(s) <= half_width, for an accuracy nondecreasing in s (bisection)."""
    low, high = 0.0, start
    while accuracy(high) <= half_width:
        low, high = high, 2 * high
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        if accuracy(middle) <= half_width:
            low = middle
        else:
            high = middle
    if low == 0.0:
        raise ValueError(f"no noise scale reaches half-width {half_width}")
    return low


def epsilon_for_discrete_laplace_accuracy(half_width: float, alpha: float, l1_sensitivity: Sensitivity | int) -> Epsilon:
    """The smallest epsilon (12 significant digits, rounded up) whose discrete Laplace noise, for a query of the
    given L1 sensitivity, has a (1 - alpha) half-width of at most ``half_width`` (same units, e.g. grid steps).

    Raises:
        ValueError: half_width not positive finite, alpha not in (0, 1), sensitivity not positive.
    Source: inverts :func:`~dp_operators.mechanisms.accuracy.discrete_laplace_accuracy`.
    """
    from dp_operators.mechanisms.accuracy import discrete_laplace_accuracy

    half_width_f = float(as_positive_rational(half_width, "half_width"))
    as_open_unit_interval(alpha, "alpha")
    l1 = as_typed(Sensitivity, l1_sensitivity, "l1_sensitivity")
    scale = _largest_scale_within(half_width_f, lambda s: discrete_laplace_accuracy(s, alpha), half_width_f)
    epsilon = _round_up_decimal(l1 / Fraction(scale))
    while discrete_laplace_accuracy(l1 / epsilon, alpha) > half_width_f:
        epsilon = _round_up_decimal(epsilon * (1 + Fraction(1, 10**10)))
    return Epsilon(epsilon)


def rho_for_discrete_gaussian_accuracy(
    half_width: float, alpha: float, l2_sensitivity_squared: Sensitivity | int
) -> Rho:
    """The smallest rho (12 significant digits, rounded up) whose discrete Gaussian noise N_Z(0, D^2/(2 rho)) has
    a (1 - alpha) half-width of at most ``half_width`` grid units.

    Raises:
        ValueError: half_width not positive finite, alpha not in (0, 1), sensitivity not positive.
    Source: inverts :func:`~dp_operators.mechanisms.accuracy.discrete_gaussian_accuracy` (integer-exact).
    """
    from dp_operators.mechanisms.accuracy import discrete_gaussian_accuracy

    half_width_f = float(as_positive_rational(half_width, "half_width"))
    as_open_unit_interval(alpha, "alpha")
    l2_squared = as_typed(Sensitivity, l2_sensitivity_squared, "l2_sensitivity_squared")
    sigma2 = _largest_scale_within(half_width_f, lambda s2: discrete_gaussian_accuracy(s2, alpha), half_width_f**2)
    rho = _round_up_decimal(l2_squared / (2 * Fraction(sigma2)))
    while discrete_gaussian_accuracy(l2_squared / (2 * rho), alpha) > half_width_f:
        rho = _round_up_decimal(rho * (1 + Fraction(1, 10**10)))
    return Rho(rho)


def epsilon_for_discrete_gaussian_accuracy(
    half_width: float, alpha: float, delta: Delta | Fraction | float, *, linf: int = 1, l0: int = 1
) -> Epsilon:
    """The smallest epsilon (12 significant digits, rounded up) such that a discrete Gaussian calibrated by
    :func:`discrete_gaussian_sigma2_for_approx_dp` to (epsilon, delta) has a (1 - alpha) half-width of at most
    ``half_width`` grid units.

    Raises:
        ValueError: bad half_width, alpha, delta, linf or l0.
    """
    from dp_operators.mechanisms.accuracy import discrete_gaussian_accuracy

    half_width_f = float(as_positive_rational(half_width, "half_width"))
    as_open_unit_interval(alpha, "alpha")
    delta_q = as_typed(Delta, delta, "delta")

    def accuracy(epsilon: Fraction) -> int:
        sigma2 = discrete_gaussian_sigma2_for_approx_dp(Epsilon(epsilon), delta_q, linf=linf, l0=l0)
        return discrete_gaussian_accuracy(sigma2, alpha)

    low, high = Fraction(0), Fraction(1)
    while accuracy(high) > half_width_f:
        low, high = high, 2 * high
    for _ in range(45):  # relative precision 2^-45 on epsilon
        middle = _round_up_decimal((low + high) / 2)
        if middle >= high:
            break
        if accuracy(middle) <= half_width_f:
            high = middle
        else:
            low = middle
    return Epsilon(high)


def epsilon_for_rho(rho: Rho | Fraction | int) -> Epsilon:
    """The largest epsilon (12 significant digits, rounded down) whose pure-DP charge on a zCDP account,
    :func:`pure_epsilon_to_rho` (epsilon) = epsilon * tanh(epsilon / 2) rounded up, is at most ``rho``: a pure
    epsilon-DP mechanism at this epsilon fits a rho-zCDP budget. The exact inverse of the charge
    (:func:`dp_operators.accounting.largest_epsilon_within_rho`, cached per rho; docs/adr/0015).

    Raises:
        ValueError: rho not positive finite (or below the ledger's resolution, about 1e-18).
    """
    return Epsilon(largest_epsilon_within_rho(as_typed(Rho, rho, "rho")))


# -- partition selection: thresholds ------------------------------------------------------------------------------
def _any_of_released(probability: float, l0: int) -> float:
    """P(at least one of l0 independent partitions is released) = 1 - (1 - p)^l0, without cancellation."""
    if probability >= 1.0:
        return 1.0
    return -math.expm1(l0 * math.log1p(-probability))


def _discrete_laplace_upper_tail(k: int, scale: float) -> float:
    """P(Z >= k) for Z discrete Laplace of scale t: e^(-k/t) / (1 + e^(-1/t)) for k >= 1."""
    if k <= 0:
        return 1.0 - _discrete_laplace_upper_tail(1 - k, scale)
    return math.exp(-k / scale) / (1 + math.exp(-1 / scale))


def discrete_laplace_threshold(
    scale: NoiseScale | Fraction | int, delta: Delta | Fraction | float, *, l0: int = 1
) -> tuple[int, Fraction]:
    """Threshold for partition selection with discrete Laplace noise of scale t on counts of privacy units.

    A key is released iff its noised count is ``>= threshold`` (an integer, the real threshold rounded up). A key
    held only by the added privacy unit has count 1 and is released with probability P(Z >= threshold - 1); one unit
    adds at most ``l0`` keys, so the mechanism's delta is 1 - (1 - P(Z >= threshold - 1))^l0, computed with the
    same ``>=``. Keys present on both sides are covered by the noise's epsilon = l0 / t.

    Returns ``(threshold, delta_spent)`` with delta_spent <= delta, the smallest threshold that achieves it.
    Raises ValueError for a bad scale, delta or l0. Source: Korolova et al. 2009; Wilson et al., "Differentially
    Private SQL with Bounded User Contribution" (PoPETs 2020), Section 4.
    """
    scale_f = float(as_typed(NoiseScale, scale, "scale"))
    delta_q = as_typed(Delta, delta, "delta")
    target = float(delta_q) * (1 - 1e-9)  # margin for the float evaluation
    per_key = -math.expm1(math.log1p(-target) / l0)
    k = max(1, math.ceil(-scale_f * math.log(per_key * (1 + math.exp(-1 / scale_f)))))
    while k > 1 and _any_of_released(_discrete_laplace_upper_tail(k - 1, scale_f), l0) <= target:
        k -= 1
    while _any_of_released(_discrete_laplace_upper_tail(k, scale_f), l0) > target:
        k += 1
    spent = _round_up_decimal(_any_of_released(_discrete_laplace_upper_tail(k, scale_f), l0) / (1 - 1e-9))
    return k + 1, min(spent, delta_q)


def discrete_gaussian_threshold(
    sigma2: NoiseScale | Fraction | int, delta: Delta | Fraction | float, *, l0: int = 1
) -> tuple[int, Fraction]:
    """Threshold for partition selection with discrete Gaussian noise N_Z(0, sigma2) on counts of privacy units:
    as :func:`discrete_laplace_threshold`, with P(Y >= threshold - 1) from the discrete Gaussian's exact tail.

    k - 1 is the smallest integer k >= 1 with (1 + 1e-12) (1 - (1 - P(Y >= k))^l0) <= delta (1 - 1e-9), found by
    bisection: the tail decreases in k, so about 40 evaluations suffice where stepping one unit at a time from
    the subgaussian bound took millions at large sigma (docs/adr/0019).

    Returns ``(threshold, delta_spent)``. Raises ValueError for a bad sigma2, delta or l0.
    """
    from dp_operators.mechanisms.accuracy import discrete_gaussian_upper_tail

    sigma2_q = as_typed(NoiseScale, sigma2, "sigma2")
    delta_q = as_typed(Delta, delta, "delta")
    target = float(delta_q) * (1 - 1e-9)

    def released(k: int) -> float:
        return _any_of_released(discrete_gaussian_upper_tail(k, sigma2_q), l0) * (1 + 1e-12)

    # invariant: released(low) > target >= released(high); start from the subgaussian bound (CKS 2020) and widen
    k = 1
    if released(1) > target:
        low, high = 1, max(2, math.ceil(math.sqrt(2 * float(sigma2_q) * math.log(2 * l0 / target))))
        while released(high) > target:
            low, high = high, 2 * high
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if released(middle) <= target else (middle, high)
        k = high
    spent = _round_up_decimal(released(k) / (1 - 1e-9)) if released(k) > 0 else Fraction(0)
    return k + 1, min(spent, delta_q)
