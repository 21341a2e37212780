"""The discrete Laplace mechanism's own zCDP parameter for its integer shifts: sup over alpha of D_alpha / alpha.

A discrete Laplace step adds independent noise Lap_Z(t), pmf P(x) = ((1 - b) / (1 + b)) b^|x| with b = e^(-1/t),
to each of its integer coordinates. Charging it the pure-DP conversion epsilon tanh(epsilon / 2) of
:mod:`dp_operators.accounting.conversions` is tight only when its L1 sensitivity is one grid unit; this module
gives the value for the step's actual shifts (docs/adr/0015, "Discrete Laplace of integer sensitivity"):

    rho = sum over coordinate classes of count * rho_1(beta, shift),   beta = 1 / t,
    rho_1(beta, d) = sup_{alpha > 1} D_alpha(P || P shifted by d) / alpha = KL(P || P shifted by d),

with the KL divergence in closed form, ``d beta (1 - b^d) / (1 + b)
+ beta (1 - b) / (1 + b) * sum_{x=1}^{d-1} b^x (d - 2x)``.

Proof.

1. *Coordinates add.* The noise is independent across coordinates, so the Rényi divergence of the released vectors
   at neighbours is the sum over coordinates of D_alpha(P || P_{d_i}), P_d the pmf shifted by the integer d_i by
   which the neighbour moves coordinate i (van Erven & Harremoës 2014, Thm 28: Rényi divergence is additive on
   product distributions).
2. *The worst shift is the largest.* D_alpha(P || P_d) depends only on |d| (reflect x -> -x) and does not decrease
   in |d|: the likelihood ratio P_d / P = b^(|x - d| - |x|) is nondecreasing in x, so by the Neyman-Pearson lemma
   the tests x > k (randomised at x = k) are most powerful for every d > 0; for one such test the type I error
   does not depend on d and the type II error E_P[1 - phi(X + d)] does not increase in d (1 - phi is
   nonincreasing). So the trade-off function of (P, P_{d+1}) lies below that of (P, P_d), by Blackwell's theorem
   (P, P_d) is a post-processing of (P, P_{d+1}) (Dong, Roth & Su 2019, Thm 2.10), and the data-processing
   inequality gives D_alpha(P || P_d) <= D_alpha(P || P_{d+1}) for every alpha. With at most ``count`` coordinates
   of a class moved, each by at most ``shift`` units, the worst neighbour moves all of them by ``shift``, for
   every alpha at once: sup_alpha of the total over alpha is the sum of the classes' count * rho_1(beta, shift).
3. *The supremum is the alpha -> 1 limit, certified per (beta, d).* (alpha - 1) D_alpha = K(lambda), the cumulant
   generating function of the privacy loss L = ln(P / P_d) under P at lambda = alpha - 1 (convex, K(0) = 0,
   K'(0) = KL), and alpha (alpha - 1) = lambda (1 + lambda). So rho_1 <= r holds iff
   K(lambda) <= r lambda (1 + lambda) for every lambda > 0. For lambda >= epsilon / r - 1 (epsilon = beta d, the
   largest privacy loss) it holds because K(lambda) <= lambda epsilon. On [0, epsilon / r - 1] it is checked on a
   partition into intervals: on each, K lies below its chord (convexity), the chord lies below the chord through
   upper bounds of K at the two ends, and r lambda (1 + lambda) minus that chord is a convex quadratic whose
   minimum on the interval is computed exactly in rationals. The upper bounds of K come from its closed form
   (below) in interval arithmetic (mpmath's interval context, 200-bit endpoints rounded outwards). The candidate
   r is KL's interval upper endpoint times (1 + 1e-9), rounded up to 12 significant digits; the certificate needs
   a positive margin over KL near lambda = 0, which the 1e-9 provides. (Numerically, D_alpha / alpha is
   decreasing in alpha for these pairs, as for randomized response; the certificate does not rely on it.)
4. *Closed form of K.* Split Z into x <= 0 (loss epsilon), x >= d (loss -epsilon) and 0 < x < d (loss
   beta (d - 2x)): with r = e^(-beta (1 + 2 lambda)),
   E_P[e^(lambda L)] = e^(lambda epsilon) [1 + e^(-(1 + 2 lambda) epsilon) + (1 - b) r (1 - r^(d-1)) / (1 - r)]
   / (1 + b).

Where the certificate would need too many intervals (the margin of D_alpha / alpha below KL shrinks like
epsilon^2: below epsilon = 0.01 per coordinate) or the arithmetic too much precision, no value is returned and the
step is charged the pure-DP conversion, which is always valid; the savings there are below 0.3 %. A certificate
costs about 10 ms at epsilon 1, 150 ms at 0.1 and 1.5 s at 0.01, once per (scale, shift): it is cached.

Sources: Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020), Sec. 2 (the
discrete Laplace); Bun & Steinke 2016, Def. 1.1 (zCDP); van Erven & Harremoës, "Rényi Divergence and
Kullback-Leibler Divergence" (IEEE TIT 2014); Dong, Roth & Su, "Gaussian Differential Privacy" (2019), Sec. 2;
Harrison & Manurangsi, "Exact zCDP Characterizations for Fundamental Differentially Private Mechanisms"
(FORC 2026), who derive the discrete Laplace's exact zCDP bound analytically.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache

from mpmath import libmp
from mpmath.ctx_iv import MPIntervalContext

from dp_operators.accounting.budget import round_up

__all__ = ["discrete_laplace_kl", "discrete_laplace_rho", "discrete_laplace_rho_one_coordinate"]

SIGNIFICANT_DIGITS = 12
#: relative margin of the candidate over KL: the chord certificate needs a positive one near lambda = 0
_MARGIN = Fraction(1, 10**9)
#: the certificate gives up (and the pure-DP conversion is charged) after this many interval evaluations
_MAX_EVALUATIONS = 6000
#: below this per-coordinate epsilon the certificate would need more evaluations than the limit
_SMALLEST_EPSILON = Fraction(1, 100)
#: a shift's b^d underflows nothing at this precision, and 1 - r keeps ~150 bits down to beta = 1e-15
_PRECISION = 200
_SMALLEST_BETA = Fraction(1, 10**15)

# A private interval context: mpmath.iv is global, and changing its precision would affect other callers.
_INTERVALS = MPIntervalContext()
_INTERVALS.prec = _PRECISION


def _iv(value: Fraction):
    return _INTERVALS.mpf(value.numerator) / value.denominator


def _upper(interval) -> Fraction:
    numerator, denominator = libmp.to_rational(interval._mpi_[1])
    return Fraction(numerator, denominator)


def _kl_interval(beta: Fraction, d: int):
    """KL(P || P_d) enclosed in an interval: beta [d (1 + b - 2 b^d) - 2 b (1 - d b^(d-1) + (d-1) b^d) / (1 - b)]
    / (1 + b), the sum of loss times probability over x <= 0, 0 < x < d, x >= d in closed form."""
    iv = _INTERVALS
    beta_iv = _iv(beta)
    b = iv.exp(-beta_iv)
    b_d = iv.exp(-beta_iv * d)
    # sum_{x=1}^{d-1} x b^x = b (1 - d b^(d-1) + (d-1) b^d) / (1 - b)^2
    weighted = b * (1 - d * b_d / b + (d - 1) * b_d) / (1 - b)
    return beta_iv * (d * (1 + b - 2 * b_d) - 2 * weighted) / (1 + b)


def _cgf_upper_bound(beta: Fraction, d: int):
    """lambda -> an exact rational >= K(lambda) = ln E_P[exp(lambda L)] for the shift d (module docstring, item 4).

    The differences 1 - e^(-x) cancel at most log2(1/x) of the 200 bits (x >= beta >= 1e-15): the interval stays
    narrow, and it is an enclosure whatever the cancellation."""
    iv = _INTERVALS
    beta_iv = _iv(beta)
    epsilon = beta_iv * d
    one_minus_b = 1 - iv.exp(-beta_iv)
    log_normaliser = iv.log(1 + iv.exp(-beta_iv))

    def bound(lam: Fraction) -> Fraction:
        lam_iv = _iv(lam)
        rate = beta_iv * (1 + 2 * lam_iv)
        r = iv.exp(-rate)
        summed = 1 + iv.exp(-rate * d)
        if d > 1:
            summed += one_minus_b * r * (1 - iv.exp(-rate * (d - 1))) / (1 - r)
        return _upper(lam_iv * epsilon + iv.log(summed) - log_normaliser)

    return bound


def _chord_below(a: Fraction, k_a: Fraction, b: Fraction, k_b: Fraction, rho: Fraction) -> bool:
    """Whether the chord through (a, k_a), (b, k_b) is <= rho lambda (1 + lambda) on [a, b] (exact)."""
    slope = (k_b - k_a) / (b - a)
    intercept = k_a - slope * a
    vertex = (slope - rho) / (2 * rho)  # minimum of rho l^2 + (rho - slope) l - intercept
    at = min(max(vertex, a), b)
    return rho * at * at + (rho - slope) * at - intercept >= 0


def _certified(beta: Fraction, d: int, rho: Fraction) -> bool:
    """Whether K(lambda) <= rho lambda (1 + lambda) for every lambda > 0 is proven (module docstring, item 3)."""
    end = beta * d / rho - 1  # from here on, K(lambda) <= lambda epsilon <= rho lambda (1 + lambda)
    cgf_upper = _cgf_upper_bound(beta, d)
    a, k_a = Fraction(0), Fraction(0)
    step = Fraction(1, 2**40)
    for _ in range(_MAX_EVALUATIONS):
        if a >= end:
            return True
        b = min(a + step, end)
        k_b = cgf_upper(b)
        if _chord_below(a, k_a, b, k_b, rho):
            a, k_a, step = b, k_b, step * 2
        else:
            step /= 4
    return False


def _round_up_decimal(value: Fraction) -> Fraction:
    exponent = math.floor(math.log10(value)) - (SIGNIFICANT_DIGITS - 1)
    unit = Fraction(10) ** exponent
    return math.ceil(value / unit) * unit


def discrete_laplace_kl(scale: Fraction | int, shift: int) -> Fraction:
    """An exact rational upper bound (interval arithmetic) of KL(Lap_Z(t) || Lap_Z(t) + shift), t = ``scale``."""
    beta = 1 / Fraction(scale)
    return _upper(_kl_interval(beta, shift))


def discrete_laplace_rho_one_coordinate(scale: Fraction | int, shift: int) -> Fraction | None:
    """rho_1 = sup_{alpha > 1} D_alpha(Lap_Z(t) || Lap_Z(t) + shift) / alpha, certified and rounded up.

    Returns a decimal with 12 significant digits, at most about 1e-9 (relative) above the exact value
    (module docstring for the proof), or None where the certificate is out of reach (per-coordinate
    epsilon = shift / t below 0.01, or 1 / t below 1e-15).

    Raises:
        ValueError: scale not positive, shift not a positive int.
    """
    scale = Fraction(scale)
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 1:
        raise ValueError(f"shift must be a positive int, got {shift!r}")
    return _rho_one_coordinate(1 / scale, shift)


@lru_cache(maxsize=4096)
def _rho_one_coordinate(beta: Fraction, d: int) -> Fraction | None:
    if beta * d < _SMALLEST_EPSILON or beta < _SMALLEST_BETA:
        return None
    candidate = _round_up_decimal(_upper(_kl_interval(beta, d)) * (1 + _MARGIN))
    return candidate if _certified(beta, d, candidate) else None


def discrete_laplace_rho(scale: Fraction | int, shifts: Iterable[tuple[int, int]]) -> Fraction | None:
    """The zCDP rho of discrete Laplace noise of scale t on integer vectors whose neighbours differ by at most
    ``shift`` units in each of at most ``count`` coordinates, for every ``(shift, count)`` in ``shifts``
    (e.g. ``((linf, l0),)``): the sum of ``count * rho_1(t, shift)``, rounded up to the ledger's resolution.

    None when a class's certificate is out of reach (:func:`discrete_laplace_rho_one_coordinate`): the caller
    charges the pure-DP conversion instead. Never below the exact sup over alpha of D_alpha / alpha of the worst
    neighbour (module docstring).

    Raises:
        ValueError: bad scale, shift or count.
    """
    total = Fraction(0)
    for shift, count in shifts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive int, got {count!r}")
        per_coordinate = discrete_laplace_rho_one_coordinate(scale, shift)
        if per_coordinate is None:
            return None
        total += count * per_coordinate
    return round_up(total) if total > 0 else None
