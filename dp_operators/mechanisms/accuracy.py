"""Accuracy of noise mechanisms: half-widths of (1 - alpha) intervals, and exact pmfs.

Everything here depends on public parameters only (scale, sigma2, alpha), never on data, so it can be printed by
``plan`` before any noise is drawn. Scales are in the units of the noised aggregate.
"""

from __future__ import annotations

import math
from functools import lru_cache
from fractions import Fraction
from statistics import NormalDist

import numpy as np

from dp_operators.mechanisms._rational import as_open_unit_interval, as_positive_rational

__all__ = [
    "discrete_gaussian_accuracy",
    "discrete_gaussian_upper_tail",
    "discrete_gaussian_variance",
    "discrete_laplace_variance",
    "discrete_gaussian_pmf",
    "discrete_laplace_accuracy",
    "discrete_laplace_pmf",
    "gaussian_accuracy",
    "laplace_accuracy",
]

# Beyond 40 sigma, exp(-x^2 / (2 sigma^2)) < exp(-800) underflows to 0.0 in float64: summing further changes nothing.
_NEGLIGIBLE_SIGMAS = 40
# Up to this sigma, summing the pmf costs at most 4e5 terms; beyond it the Euler-Maclaurin tail is exact to float
# precision.
_SUMMATION_MAX_SIGMA = 10_000


def _positive(value: object, name: str) -> float:
    return float(as_positive_rational(value, name))


def _alpha(alpha: object) -> float:
    return float(as_open_unit_interval(alpha, "alpha"))


def laplace_accuracy(scale: float | Fraction, alpha: float) -> float:
    """Half-width a with P(|Z| >= a) = alpha for continuous Laplace noise Z of the given scale b: b ln(1/alpha).

    Units: those of the scale. Raises ValueError if scale is not positive finite or alpha not in (0, 1).
    Source: standard Laplace tail P(|Z| >= a) = exp(-a/b); OpenDP ``laplacian_scale_to_accuracy``.
    """
    return _positive(scale, "scale") * math.log(1 / _alpha(alpha))


def gaussian_accuracy(sigma: float | Fraction, alpha: float) -> float:
    """Half-width a with P(|Z| >= a) = alpha for Gaussian noise Z ~ N(0, sigma^2): sigma Phi^{-1}(1 - alpha/2).

    Units: those of sigma (a standard deviation, not a variance). Raises ValueError if sigma is not positive finite
    or alpha not in (0, 1). Source: normal quantile; OpenDP ``gaussian_scale_to_accuracy``.
    """
    # the lower quantile, negated: 1 - alpha/2 would round to 1.0 for alpha below 1e-16
    return -_positive(sigma, "sigma") * NormalDist().inv_cdf(_alpha(alpha) / 2)


def discrete_laplace_accuracy(scale: float | Fraction, alpha: float) -> float:
    """Half-width a with P(|Z| >= a) <= alpha for discrete Laplace noise Z of the given scale s.

    Returns s ln(2 / (alpha (1 + exp(-1/s)))), solving P(|Z| >= k) = 2 exp(-k/s) / (1 + exp(-1/s)) for k. The
    result is a float; since Z is an integer, its floor gives the same coverage. Raises ValueError if scale is not
    positive finite or alpha not in (0, 1). Source: OpenDP ``discrete_laplacian_scale_to_accuracy`` (same formula).
    """
    scale_f = _positive(scale, "scale")
    return scale_f * math.log(2 / (_alpha(alpha) * (1 + math.exp(-1 / scale_f))))


def discrete_laplace_pmf(x: int, scale: float | Fraction) -> float:
    """P(Z = x) for Z discrete Laplace with the given scale: tanh(1/(2 scale)) exp(-|x| / scale).

    The normalisation is exact in closed form (a two-sided geometric series). Raises ValueError for a bad scale.
    Source: Canonne, Kamath, Steinke 2020, Definition 1 (discrete Laplace).
    """
    scale_f = _positive(scale, "scale")
    return math.tanh(1 / (2 * scale_f)) * math.exp(-abs(x) / scale_f)


@lru_cache(maxsize=256)
def _discrete_gaussian_normaliser(sigma2: float) -> float:
    """sum over x in Z of exp(-x^2 / (2 sigma2)).

    Uses the faster-converging side of the Jacobi theta identity (Poisson summation)
        sum_x exp(-x^2 / (2 s2)) = sqrt(2 pi s2) sum_k exp(-2 pi^2 s2 k^2),
    which is exact; either side needs only a handful of terms.
    """
    if sigma2 >= 1:
        terms = _two_sided_terms(lambda k: math.exp(-2 * math.pi**2 * sigma2 * k * k))
        return math.sqrt(2 * math.pi * sigma2) * terms
    return _two_sided_terms(lambda x: math.exp(-x * x / (2 * sigma2)))


def _two_sided_terms(term) -> float:
    total, k = 0.0, 1
    while (value := term(k)) > 0.0:
        total += value
        k += 1
    return 1.0 + 2.0 * total


def discrete_gaussian_pmf(x: int, sigma2: float | Fraction) -> float:
    """P(Z = x) for Z ~ N_Z(0, sigma2), the discrete Gaussian: exp(-x^2 / (2 sigma2)) / normaliser.

    The normaliser is computed without truncation error through the Jacobi theta (Poisson summation) identity.
    Raises ValueError for a bad sigma2. Source: Canonne, Kamath, Steinke 2020, Definition 1.
    """
    sigma2_f = _positive(sigma2, "sigma2")
    return math.exp(-x * x / (2 * sigma2_f)) / _discrete_gaussian_normaliser(sigma2_f)


def discrete_gaussian_accuracy(sigma2: float | Fraction, alpha: float) -> int:
    """Smallest integer a >= 0 with P(|Z| > a) <= alpha for Z ~ N_Z(0, sigma2), the discrete Gaussian.

    So [-a, a] is a (1 - alpha) interval for the noise, in the units of the noised integer aggregate. For
    sigma <= 1e4 the pmf is summed from 40 sigma (where the terms underflow to 0) inwards, small terms first so tiny
    tails stay accurate. Above that, the tail sums come from the Euler-Maclaurin formula (integral + f/2 - f'/12),
    whose remainder is O(sigma^-3) relative, far below float precision; either way the cost is bounded.

    OpenDP's ``discrete_gaussian_scale_to_accuracy(sigma, alpha)`` takes sigma (not sigma2) and returns the
    smallest integer a with P(|Z| >= a) <= alpha, which is this function's result plus one.

    Raises ValueError if sigma2 is not positive finite or alpha not in (0, 1).
    Source: Canonne, Kamath, Steinke 2020, Definition 1 (pmf).
    """
    sigma2_f = _positive(sigma2, "sigma2")
    alpha_f = _alpha(alpha)
    if sigma2_f <= _SUMMATION_MAX_SIGMA**2:
        return _discrete_gaussian_accuracy_by_summation(sigma2_f, alpha_f)
    return _discrete_gaussian_accuracy_by_euler_maclaurin(sigma2_f, alpha_f)


def _discrete_gaussian_accuracy_by_summation(sigma2: float, alpha: float) -> int:
    x = np.arange(1, math.ceil(_NEGLIGIBLE_SIGMAS * math.sqrt(sigma2)) + 2, dtype=np.float64)
    tail_from = np.cumsum(np.exp(-(x * x) / (2 * sigma2))[::-1])[::-1]  # tail_from[j] = sum of w(x) for x >= j + 1
    # P(|Z| > a) = 2 tail_from[a] / (1 + 2 tail_from[0]) <= alpha
    target = alpha * (1 + 2 * tail_from[0]) / 2
    return int(np.flatnonzero(tail_from <= target)[0])


def _discrete_gaussian_accuracy_by_euler_maclaurin(sigma2: float, alpha: float) -> int:
    sigma = math.sqrt(sigma2)

    def tail_beyond(a: int) -> float:  # sum of w(x) over x > a
        m = a + 1
        w = math.exp(-m * m / (2 * sigma2))
        return sigma * math.sqrt(math.pi / 2) * math.erfc(m / (sigma * math.sqrt(2))) + w / 2 + m * w / (12 * sigma2)

    # for sigma this large the theta-function correction to sqrt(2 pi) sigma is below exp(-1e8)
    target = alpha * math.sqrt(2 * math.pi) * sigma / 2
    if tail_beyond(0) <= target:
        return 0
    # The smallest a with tail_beyond(a) <= target (the tail decreases in a), by bisection from the normal quantile:
    # stepping one unit from it took about sigma * 1e-16 steps (its float error), seconds beyond sigma 1e22.
    start = max(1, math.floor(-sigma * NormalDist().inv_cdf(alpha / 2)))
    # bracket: tail_beyond(low) > target >= tail_beyond(high), widened from the start by doubling steps
    step = 1
    if tail_beyond(start) > target:
        low, high = start, start + 1
        while tail_beyond(high) > target:
            low, high, step = high, high + step, 2 * step
    else:
        low, high = max(0, start - 1), start
        while low > 0 and tail_beyond(low) <= target:
            low, high, step = max(0, low - step), low, 2 * step
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if tail_beyond(middle) <= target else (middle, high)
    return high


def discrete_gaussian_upper_tail(k: int, sigma2: float | Fraction) -> float:
    """P(Z >= k) for Z ~ N_Z(0, sigma2), for any integer k (by symmetry for k <= 0).

    Summed from the far tail inwards for sigma <= 1e4 (terms beyond 40 sigma underflow), else by Euler-Maclaurin
    (relative error O(sigma^-3), far below float precision there). Raises ValueError for a bad sigma2.
    Source: Canonne, Kamath, Steinke 2020, Definition 1 (pmf).
    """
    sigma2_f = _positive(sigma2, "sigma2")
    if k <= 0:
        return 1.0 - discrete_gaussian_upper_tail(1 - k, sigma2_f)
    sigma = math.sqrt(sigma2_f)
    if k > _NEGLIGIBLE_SIGMAS * sigma + 1:
        return 0.0
    if sigma <= _SUMMATION_MAX_SIGMA:
        x = np.arange(k, math.ceil(_NEGLIGIBLE_SIGMAS * sigma) + 2, dtype=np.float64)
        tail = float(np.sum(np.exp(-(x * x) / (2 * sigma2_f))[::-1]))
        return tail / _discrete_gaussian_normaliser(sigma2_f)
    w = math.exp(-k * k / (2 * sigma2_f))
    tail = sigma * math.sqrt(math.pi / 2) * math.erfc(k / (sigma * math.sqrt(2))) + w / 2 + k * w / (12 * sigma2_f)
    return tail / (math.sqrt(2 * math.pi) * sigma)


def discrete_laplace_variance(scale: float | Fraction) -> float:
    """Variance of discrete Laplace noise of the given scale t: 2 e^(-1/t) / (1 - e^(-1/t))^2.

    Slightly below the continuous Laplace's 2 t^2. Raises ValueError for a bad scale.
    Source: two-sided geometric distribution (Ghosh, Roughgarden, Sundararajan 2009).
    """
    scale_f = _positive(scale, "scale")
    q = math.exp(-1 / scale_f)
    return 2 * q / (-math.expm1(-1 / scale_f)) ** 2


def discrete_gaussian_variance(sigma2: float | Fraction) -> float:
    """Variance of N_Z(0, sigma2): sum of x^2 pmf(x); below sigma2 (CKS 2020, Section 2), equal to it to float
    precision once sigma >= 2 (the Poisson-summation correction is below exp(-2 pi^2 sigma2)). Raises ValueError for a bad sigma2."""
    sigma2_f = _positive(sigma2, "sigma2")
    if sigma2_f >= 4:  # the theta-function correction is below exp(-2 pi^2 sigma2) < 1e-34
        return sigma2_f
    x = np.arange(1, math.ceil(_NEGLIGIBLE_SIGMAS * math.sqrt(sigma2_f)) + 2, dtype=np.float64)
    weights = np.exp(-(x * x) / (2 * sigma2_f))
    return float(2 * np.sum(x * x * weights) / _discrete_gaussian_normaliser(sigma2_f))


# -- linear combinations of independent integer noises (Fieller intervals for means and variances) --------------------

#: Outside +-K, where K is the noise's half-width at ``alpha * _TRUNCATION``, a binned noise counts as a miss.
_TRUNCATION = 1e-4
#: Bins per binned noise (integers are grouped into at most this many runs).
_BINS = 64
#: The computed exceedance bound must be below ``alpha * (1 - _FLOAT_MARGIN)``: the float error of summing a few
#: thousand terms of at most 1 is below 1e-12, far inside this margin.
_FLOAT_MARGIN = 1e-6
_CHUNK = 64
#: The bisection stops when the bracket is below this fraction of the half-width (the upper end is returned).
_RELATIVE_TOLERANCE = 1e-4


@lru_cache(maxsize=64)
def _gaussian_tail_table(sigma2: float) -> np.ndarray:
    """``table[k] = P(Z >= k)`` for Z ~ N_Z(0, sigma2) and k = 0 .. K + 1, the last entry 0 (K = 40 sigma + 1,
    beyond which the terms underflow). Summed from the far tail inwards, small terms first."""
    top = math.ceil(_NEGLIGIBLE_SIGMAS * math.sqrt(sigma2)) + 1
    x = np.arange(0, top + 1, dtype=np.float64)
    weights = np.exp(-(x * x) / (2 * sigma2))
    tail = np.cumsum(weights[::-1])[::-1]  # tail[k] = sum of w(x) for x >= k
    normaliser = _discrete_gaussian_normaliser(sigma2)
    table = np.append(tail / normaliser, 0.0)
    table[0] = (normaliser + 1.0) / (2 * normaliser)  # P(Z >= 0): half of everything but P(Z = 0), plus it
    return table


def integer_noise_upper_tail(mechanism: str, scale: float | Fraction):
    """``P(Z >= k)`` for integer arrays k, Z the integer noise of ``mechanism`` (``discrete_laplace``: scale t;
    ``discrete_gaussian``: sigma^2), vectorised, float64.

    Discrete Laplace: P(Z >= k) = q^k / (1 + q), q = exp(-1/t), for k >= 1 (a two-sided geometric series);
    discrete Gaussian: the pmf summed (sigma <= 1e4) or Euler-Maclaurin beyond, as
    :func:`discrete_gaussian_upper_tail`. k <= 0 by symmetry. Source: Canonne, Kamath, Steinke 2020, Definition 1.
    """
    value = _positive(scale, "scale")
    if mechanism == "discrete_laplace":
        q = math.exp(-1 / value)

        def positive(k: np.ndarray) -> np.ndarray:
            return np.exp(-k / value) / (1 + q)
    elif mechanism == "discrete_gaussian":
        if value <= _SUMMATION_MAX_SIGMA**2:
            table = _gaussian_tail_table(value)

            def positive(k: np.ndarray) -> np.ndarray:
                return table[np.minimum(k, len(table) - 1).astype(np.int64)]
        else:
            from scipy.special import erfc

            sigma = math.sqrt(value)

            def positive(k: np.ndarray) -> np.ndarray:
                w = np.exp(-k * k / (2 * value))
                tail = sigma * math.sqrt(math.pi / 2) * erfc(k / (sigma * math.sqrt(2))) + w / 2 + k * w / (12 * value)
                return tail / (math.sqrt(2 * math.pi) * sigma)
    else:
        raise ValueError(f"unknown mechanism {mechanism!r}")

    def upper(k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        out = np.empty(k.shape)
        above = k >= 1
        out[above] = positive(k[above])
        out[~above] = 1.0 - positive(1.0 - k[~above])
        return np.clip(out, 0.0, 1.0)

    return upper


def _noise_bins(mechanism: str, scale: float | Fraction, alpha: float,
                bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The integers -K .. K of a noise grouped into at most ``bins`` runs: (first, last, probability) arrays and
    the mass beyond +-K (at most ``alpha * _TRUNCATION``)."""
    if mechanism == "discrete_laplace":
        top = math.ceil(discrete_laplace_accuracy(scale, alpha * _TRUNCATION))
    else:
        top = discrete_gaussian_accuracy(scale, alpha * _TRUNCATION)
    edges = np.unique(np.rint(np.linspace(-top, top + 1, min(bins, 2 * top + 1) + 1)).astype(np.int64))
    upper = integer_noise_upper_tail(mechanism, scale)
    tails = upper(edges.astype(np.float64))
    probabilities = np.maximum(tails[:-1] - tails[1:], 0.0)
    outside = float(2 * upper(np.array([top + 1.0]))[0])
    return edges[:-1].astype(np.float64), edges[1:].astype(np.float64) - 1, probabilities, outside


def combination_accuracy(
    fixed: tuple[str, float | Fraction, float],
    others: list[tuple[str, float | Fraction, np.ndarray, np.ndarray]],
    alpha: float,
    bins: int = _BINS,
) -> np.ndarray:
    """Half-widths t with ``P(|c0 Z0 + sum_i c_i Z_i| > t) <= alpha`` for *every* coefficient vector in a box,
    for independent integer noises: one box per cell, vectorised over cells.

    Args:
        fixed: ``(mechanism, scale, c0)``: the noise Z0 whose tail is summed exactly, with its coefficient c0 > 0
            (value units per noise unit, e.g. a sum's grid).
        others: per other noise ``(mechanism, scale, lo, hi)``: its coefficient lies in ``[lo, hi]`` (float
            arrays of shape (cells,)). At most two.
        alpha: in (0, 1).

    Returns:
        float64 array of shape (cells,), value units.

    Proof. Each other noise Z_i is cut into runs of integers [l, u] (the integers beyond +-K_i, of mass at most
    ``alpha * 1e-4`` each, count as misses). On a run, for any coefficient in [lo, hi], c_i Z_i lies in the
    interval of the four corner products; summing over the others, ``s = sum_i c_i Z_i`` lies in [s_lo, s_hi], and
    |c0 Z0 + s| > t implies Z0 > (t - s_hi) / c0 or Z0 < -(t + s_lo) / c0, whose probabilities are exact tails of
    Z0 (symmetric) given the runs, by independence. The bound, summed over the runs with their probabilities plus
    the truncated mass, is non-increasing in t; the bisection returns a t at which it is at most
    ``alpha (1 - 1e-6)`` (the margin covers the float error of the sum). Exact for the integer laws (no normal
    approximation); loose only by the width of the runs and of the coefficient boxes.
    """
    size = len(np.asarray(others[0][2])) if others else 0
    if size > _CHUNK:  # bounded memory: (cells, runs) arrays per chunk
        return np.concatenate([
            combination_accuracy(fixed, [(m, s, np.asarray(lo)[i:i + _CHUNK], np.asarray(hi)[i:i + _CHUNK])
                                         for m, s, lo, hi in others], alpha, bins)
            for i in range(0, size, _CHUNK)])
    mechanism0, scale0, c0 = fixed
    upper0 = integer_noise_upper_tail(mechanism0, scale0)
    target = alpha * (1 - _FLOAT_MARGIN)
    shifts_lo, shifts_hi, weights = None, None, None
    outside = 0.0
    cells = None
    for mechanism, scale, lo, hi in others:
        first, last, probability, mass = _noise_bins(mechanism, scale, alpha, bins)
        outside += mass
        lo, hi = np.asarray(lo, dtype=np.float64)[:, None], np.asarray(hi, dtype=np.float64)[:, None]
        cells = lo.shape[0]
        corners = np.stack([lo * first, lo * last, hi * first, hi * last])
        low, high = corners.min(axis=0), corners.max(axis=0)  # (cells, bins)
        if shifts_lo is None:
            shifts_lo, shifts_hi, weights = low, high, probability[None, :]
        else:
            shifts_lo = (shifts_lo[:, :, None] + low[:, None, :]).reshape(cells, -1)
            shifts_hi = (shifts_hi[:, :, None] + high[:, None, :]).reshape(cells, -1)
            weights = (weights[:, :, None] * probability[None, None, :]).reshape(1, -1)
    if shifts_lo is None:
        raise ValueError("combination_accuracy needs at least one other noise")
    c0 = float(c0)

    def exceedance(t: np.ndarray) -> np.ndarray:
        above = upper0(np.floor((t[:, None] - shifts_hi) / c0) + 1)
        below = upper0(np.floor((t[:, None] + shifts_lo) / c0) + 1)
        return (weights * np.minimum(above + below, 1.0)).sum(axis=1) + outside

    # start from the union bound of the parts (valid), widened if the runs make it fail
    width0 = c0 * (discrete_laplace_accuracy(scale0, alpha / 4) if mechanism0 == "discrete_laplace"
                   else discrete_gaussian_accuracy(scale0, alpha / 4) + 1)
    high_t = np.full(cells, width0) + np.maximum(np.abs(shifts_lo), np.abs(shifts_hi)).max(axis=1)
    while True:
        failing = exceedance(high_t) > target
        if not failing.any():
            break
        high_t = np.where(failing, 2 * high_t, high_t)
    low_t = np.zeros(cells)
    while np.any(high_t - low_t > _RELATIVE_TOLERANCE * high_t):
        middle = (low_t + high_t) / 2
        ok = exceedance(middle) <= target
        high_t = np.where(ok, middle, high_t)
        low_t = np.where(ok, low_t, middle)
    return high_t
