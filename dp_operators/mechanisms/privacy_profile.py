"""Privacy profiles delta(epsilon): exact for the discrete Gaussian, analytic for the continuous one (reference).

The *privacy profile* of a mechanism is the smallest delta for which it is (epsilon, delta)-DP, as a function of
epsilon: delta(epsilon) = sup over neighbours of E_P[max(0, 1 - exp(epsilon - L))], with L the privacy-loss random
variable. It is the tightest (epsilon, delta) description there is, valid for every epsilon > 0 (unlike the classical
sqrt(2 ln(1.25/delta))/epsilon rule, which needs epsilon < 1).

Neighbours here: integer vectors (in grid units) that differ by at most ``linf`` in each of at most ``l0``
coordinates (DESIGN.md 2.6 contribution bounds). For i.i.d. discrete Gaussian noise the worst such pair shifts
``l0`` coordinates by exactly ``linf``:

* a coordinate shifted by 0 is a post-processing of the rest (independent noise), and
* for one coordinate, the optimal test between N_Z(0, s2) and N_Z(a, s2) is a threshold on y (monotone likelihood
  ratio), so its hockey-stick divergence max_t [F(t) - e^eps F(t - a)] grows with |a| for *every* e^eps >= 0;
  by Blackwell's theorem the shift-``linf`` pair therefore dominates any smaller shift through a Markov kernel on
  that coordinate, which carries over to the product by data processing.

With every shift equal, L depends only on S = sum of ``l0`` i.i.d. N_Z(0, s2) draws:
L = (l0 linf^2 - 2 linf S) / (2 s2). For ``l0 = 1`` this is Canonne, Kamath, Steinke 2020, Theorem 7:
delta = P[Y > eps s2/D - D/2] - e^eps P[Y > eps s2/D + D/2]. For ``l0 > 1`` the law of S is computed by FFT and
every numerical error (truncation, aliasing, FFT rounding) is added to the returned delta, so the result is a
valid upper bound.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dp_operators.mechanisms._rational import as_positive_rational
from dp_operators.mechanisms.accuracy import _discrete_gaussian_normaliser, discrete_gaussian_upper_tail

__all__ = [
    "analytic_gaussian_delta",
    "analytic_gaussian_sigma",
    "discrete_gaussian_delta",
]

# Each coordinate is truncated at this many sigmas, and S at this many of its standard deviations: the mass left
# out (about exp(-T^2/2) = 1e-31 each) is added to delta.
_TRUNCATION_SIGMAS = 12.0
# Above this FFT length the profile is not computed (delta reported as 1): callers fall back to the zCDP route.
_MAX_FFT_LENGTH = 2**22
_UNIT_ROUNDOFF = 2.0**-53


def _check_shift(linf: int, l0: int) -> None:
    for name, value in (("linf", linf), ("l0", l0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int (grid units / partitions), got {value!r}")


def discrete_gaussian_delta(sigma2: Fraction | float, epsilon: Fraction | float, *, linf: int = 1, l0: int = 1) -> float:
    """The smallest delta for which adding i.i.d. N_Z(0, sigma2) noise to an integer vector is (epsilon, delta)-DP,
    when neighbours differ by at most ``linf`` (an integer) in each of at most ``l0`` coordinates.

    Returns a float that is never below the true delta: the exact two-tail formula for ``l0 = 1`` (relative
    rounding margin 1e-12), an FFT computation with every error term added for ``l0 > 1``; 1.0 when the FFT would
    exceed 2^22 points (use the zCDP conversion instead).

    Raises:
        ValueError: sigma2 or epsilon not positive finite; linf, l0 not positive ints.

    Source: Canonne, Kamath, Steinke 2020, Theorem 7 (one coordinate); the module docstring for vectors.
    """
    sigma2_q = as_positive_rational(sigma2, "sigma2")
    epsilon_q = as_positive_rational(epsilon, "epsilon")
    _check_shift(linf, l0)
    if l0 == 1:
        return _one_coordinate_delta(sigma2_q, epsilon_q, linf)
    return _vector_delta(sigma2_q, epsilon_q, linf, l0)


def _scaled(probability: float, epsilon: float) -> float:
    """e^epsilon * probability without overflow for large epsilon."""
    if probability <= 0.0:
        return 0.0
    return math.exp(epsilon + math.log(probability))


def _one_coordinate_delta(sigma2: Fraction, epsilon: Fraction, shift: int) -> float:
    # P[Y > c] with c = eps s2 / D - D/2 and P[Y > c + D]; c computed exactly so the two thresholds are consistent
    c = epsilon * sigma2 / shift - Fraction(shift, 2)
    first = math.floor(c) + 1
    upper = discrete_gaussian_upper_tail(first, sigma2)
    lower = _scaled(discrete_gaussian_upper_tail(math.floor(c + shift) + 1, sigma2), float(epsilon))
    delta = upper - lower
    return min(1.0, max(0.0, delta) + 1e-12 * (upper + lower) + 1e-300)


def _vector_delta(sigma2: Fraction, epsilon: Fraction, shift: int, l0: int) -> float:
    sigma2_f = float(sigma2)
    sigma = math.sqrt(sigma2_f)
    cutoff = math.ceil(_TRUNCATION_SIGMAS * sigma) + 1
    half = math.ceil(_TRUNCATION_SIGMAS * math.sqrt(l0) * sigma) + l0 * shift + 1
    length = 1 << (2 * half + 1).bit_length()
    if length > _MAX_FFT_LENGTH or cutoff >= length // 2:
        return 1.0
    x = np.arange(-cutoff, cutoff + 1, dtype=np.float64)
    single = np.zeros(length)
    single[np.arange(-cutoff, cutoff + 1) % length] = np.exp(-(x * x) / (2 * sigma2_f)) / _discrete_gaussian_normaliser(
        sigma2_f
    )
    law = np.fft.irfft(np.fft.rfft(single) ** l0, n=length)
    s = np.arange(length, dtype=np.float64)
    s[s > length // 2] -= length
    loss = (l0 * shift * shift - 2.0 * shift * s) / (2 * sigma2_f)
    eps = float(epsilon)
    above = loss > eps
    delta = float(np.sum(np.maximum(law[above], 0.0) * -np.expm1(eps - loss[above])))
    truncated = l0 * 2 * discrete_gaussian_upper_tail(cutoff + 1, sigma2_f)
    # the discrete Gaussian is sigma^2-subgaussian (CKS 2020, Sec. 2), S is (l0 sigma^2)-subgaussian: mass beyond half
    aliased = 2 * math.exp(-((half - l0 * shift) ** 2) / (2 * l0 * sigma2_f))
    rounding = length * (l0 + length.bit_length()) * 4 * _UNIT_ROUNDOFF
    return min(1.0, delta * (1 + 1e-12) + truncated + aliased + rounding)


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def analytic_gaussian_delta(sigma: float, epsilon: float, l2_sensitivity: float) -> float:
    """delta(epsilon) of the *continuous* Gaussian mechanism N(0, sigma^2) with L2 sensitivity D:
    Phi(D/(2 sigma) - epsilon sigma/D) - e^epsilon Phi(-D/(2 sigma) - epsilon sigma/D).

    Reference only (benchmarks, tests): the project's noise is the discrete Gaussian, see
    :func:`discrete_gaussian_delta`. Source: Balle & Wang, ICML 2018, Theorem 8.
    """
    a, b = l2_sensitivity / (2 * sigma), epsilon * sigma / l2_sensitivity
    return _normal_cdf(a - b) - _scaled(_normal_cdf(-a - b), epsilon)


def analytic_gaussian_sigma(epsilon: float, delta: float, l2_sensitivity: float = 1.0) -> float:
    """The smallest sigma for which the continuous Gaussian mechanism is (epsilon, delta)-DP (Balle & Wang 2018),
    by bisection to a relative 1e-12. Reference only (benchmarks, tests, the calibration's search bracket).

    Raises:
        ValueError: a parameter outside epsilon > 0, 0 < delta < 1, l2_sensitivity > 0.
    """
    if not (epsilon > 0 and 0 < delta < 1 and l2_sensitivity > 0) or not math.isfinite(epsilon):
        raise ValueError(f"need epsilon > 0, 0 < delta < 1, sensitivity > 0; got {epsilon}, {delta}, {l2_sensitivity}")
    low, high = 1e-6 * l2_sensitivity, l2_sensitivity
    while analytic_gaussian_delta(high, epsilon, l2_sensitivity) > delta:
        low, high = high, 2 * high
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        if analytic_gaussian_delta(middle, epsilon, l2_sensitivity) > delta:
            low = middle
        else:
            high = middle
    return high
