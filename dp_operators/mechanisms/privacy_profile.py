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
delta = P[Y > eps s2/D - D/2] - e^eps P[Y > eps s2/D + D/2]. For ``l0 > 1``, with F the CDF of S and
k the largest integer below c = l0 D / 2 - eps s2 / D (L > eps iff S < c), and since S under the shifted
neighbour is S + l0 D,

    delta = F(k) - e^eps F(k - l0 D).

F in the far tail is needed to a *relative* accuracy (delta may be 1e-12), which an FFT does not give directly:
its rounding error is absolute, about 1e-16 to 1e-12 per point, uniform over the support. So the tail is moved to
the centre by an exact identity, then the law of S near the centre is computed by FFT. For an integer mu,
p(x) e^{mu x / s2} = e^{mu^2 / (2 s2)} p(x - mu) (complete the square; the normaliser of N_Z(mu, s2) equals that of
N_Z(0, s2) for integer mu), so for the sum

    P[S = r + l0 mu] = exp(-(l0 mu^2 + 2 mu r) / (2 s2)) P[S = r],
    F(k) = sum over r <= k - l0 mu of exp(-(l0 mu^2 + 2 mu r) / (2 s2)) P[S = r].

With mu = round(k / l0) <= 0, r stays near 0, where P[S = r] is large, and the weights decay geometrically for
r -> -inf: each absolute FFT error is multiplied by a weight of the size of the tail itself. Every error term is
bounded and added (upper bound of F(k)) or subtracted (lower bound of F(k - l0 D)):

* input: each computed pmf value exp(-x^2 / (2 s2)) / normaliser is within a relative (4 a + 16) u of the exact
  one (u = 2^-53; a = x^2 / (2 s2), at most 73, or 700 for tiny sigma: rounding of s2, of the exponent, of exp
  within 4 ulp, and of the normaliser); nonnegative inputs carry relative errors through convolution, so the
  l0-fold law is within a factor (1 +- that)^l0;
* truncation of each coordinate at 12 sigma (or where the exponent reaches 700): mass at most
  2 l0 exp(-(cutoff + 1)^2 / (2 s2)), never counted (the discrete Gaussian is s2-subgaussian, CKS 2020, so S is
  l0 s2-subgaussian); the part of S below the FFT window: at most exp(-half^2 / (2 l0 s2)); wrap-around
  (aliasing) of the cyclic convolution: at most 2 exp(-(n - half)^2 / (2 l0 s2));
* FFT rounding: each output of a length-n FFT is within log2(n) eta ||input||_1 of the exact transform, eta = 8u
  (the componentwise form of Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., 2002, Thm 24.2:
  every butterfly level adds at most eta times the 1-norm of the inputs it combines, and the levels add up;
  numpy's pocketfft measured at below 0.25 u log2(n) ||input||_1, tests/mechanisms/test_calibration.py);
  the power X^l0 by repeated squaring, with a relative error of at most (1 + sqrt(2) gamma_2)^(l0 - 1) - 1
  (Higham, Lemma 3.5, per complex product), and |X^l0 - X~^l0| <= l0 A^(l0 - 1) |X - X~| for |X|, |X~| <= A;
  the inverse transform adds log2(n) eta max |Y|. The sum is a bound eps_abs on every point of the law;
* the weights exp(.) and the final sums (math.fsum): relative 3 u |exponent| + 6 u.

For sigma >= 4 the law of S near the centre is not computed by FFT but in closed form, with a proven bound
(Poisson summation): the characteristic function of N_Z(0, s2) is phi(t) = Theta(t) / Theta(0) with
Theta(t) = sum over k of G(t + 2 pi k), G(t) = exp(-s2 t^2 / 2). For |t| <= pi every k != 0 term has
|t + 2 pi k| >= pi (2|k| - 1), so 0 <= Theta(t) - G(t) <= rho_P = 2 sum over j >= 1 of exp(-s2 pi^2 (2j - 1)^2 / 2)
<= 2 exp(-s2 pi^2 / 2) / (1 - exp(-4 s2 pi^2)), and Theta(0) is in [1, 1 + rho_P]; hence phi(t) is in
[G(t) / (1 + rho_P), G(t) + rho_P] and |phi^l0 - G^l0| <= l0 rho_P (1 + rho_P)^(l0 - 1). Inverting the Fourier
series of S on [-pi, pi] and the Fourier integral of the sampled normal density
A(r) = exp(-r^2 / (2 l0 s2)) / sqrt(2 pi l0 s2) on the real line,

    |P[S = r] - A(r)| <= l0 rho_P exp((l0 - 1) rho_P) + exp(-l0 s2 pi^2 / 2) / (pi^2 l0 s2)    for every integer r

(the second term bounds (1/2pi) times the integral of G^l0 over |t| > pi, by the Mills-ratio bound). At sigma 4
this is about 1e-30 at most for l0 <= 10^4, far below the FFT's rounding bound, and the law costs one exp per point
instead of two transforms of up to 2^22 points: the same tail identity and error terms then apply, with A's
float evaluation error (the same (4 a + 16) u as the FFT's inputs) as the relative input error, the Poisson
bound as the point error, and no aliasing or per-coordinate truncation (docs/adr/0019 for the measurements).

The result is an upper bound of the true delta; it is within a relative ~1e-9 of it where it matters
(docs/adr/0011).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

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
# Componentwise rounding error of one FFT butterfly level, in units of the 1-norm of its inputs (module docstring).
_FFT_LEVEL_ERROR = 8 * _UNIT_ROUNDOFF
# exp(x) underflows to 0.0 below this: a weight that small is bounded by _UNDERFLOW_SLACK instead.
_EXP_UNDERFLOW = -745.0
# Input pmf values are computed only where the exponent x^2 / (2 s2) is at most this (normal floats, relative error).
_MAX_INPUT_EXPONENT = 700.0
_UNDERFLOW_SLACK = 1e-290
# From this sigma on, the law of S comes from Poisson summation (module docstring): its error bound, about
# l0 exp(-pi^2 sigma^2 / 2), is below 1e-30 here, and the FFT's cost (0.1-0.5 s at 2^22 points) is avoided.
_POISSON_MIN_SIGMA = 4.0


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


@dataclass(frozen=True)
class _SumLaw:
    """The law of S = sum of l0 i.i.d. N_Z(0, s2) on the cyclic window r in [-half, n - half), from an FFT, with
    the bounds that turn it into rigorous upper and lower bounds of P[S = r] (module docstring)."""

    law: np.ndarray  # law[i] approximates P[S = i - half]
    half: int
    point_error: float  # eps_abs: |law[i] - exact cyclic law of the computed inputs| <= point_error
    input_factor: float  # relative error of the law's values: (1 + eps_in)^l0 - 1 through the FFT convolution
    truncated: float  # mass of S never counted (coordinates beyond 12 sigma, S below the window)
    aliased: float  # mass wrapped around the cyclic window


def _integer_power(values: np.ndarray, exponent: int) -> np.ndarray:
    """values ** exponent by repeated squaring (exponent - 1 rounding factors at most, Higham Lemma 3.5 each)."""
    result, base = None, values
    while exponent:
        if exponent & 1:
            result = base if result is None else result * base
        exponent >>= 1
        if exponent:
            base = base * base
    return result


@lru_cache(maxsize=4)  # each law holds up to 2^22 doubles (32 MB); a search evaluates each sigma once
def _sum_law(sigma2: float, l0: int) -> _SumLaw | None:
    """The law of S with its error bounds, or None when the FFT would exceed 2^22 points."""
    u = _UNIT_ROUNDOFF
    sigma = math.sqrt(sigma2)
    # 12 sigma, but never where exp(-x^2 / (2 s2)) would leave the normal float range (tiny sigma)
    cutoff = min(math.ceil(_TRUNCATION_SIGMAS * sigma) + 1, math.isqrt(math.floor(2 * sigma2 * _MAX_INPUT_EXPONENT)))
    half = math.ceil(_TRUNCATION_SIGMAS * math.sqrt(l0) * sigma) + l0 + 1
    length = 1 << (2 * half + 1).bit_length()
    if length > _MAX_FFT_LENGTH or cutoff >= length // 2:
        return None
    if sigma >= _POISSON_MIN_SIGMA and (half * half) / (2 * l0 * sigma2) <= _MAX_INPUT_EXPONENT:
        return _poisson_sum_law(sigma2, l0, half)
    x = np.arange(-cutoff, cutoff + 1, dtype=np.float64)
    pmf = np.exp(-(x * x) / (2 * sigma2)) / _discrete_gaussian_normaliser(sigma2)
    single = np.zeros(length)
    single[np.arange(-cutoff, cutoff + 1) % length] = pmf
    exponent_max = cutoff * cutoff / (2 * sigma2)
    input_error = (4 * exponent_max + 16) * u
    levels = length.bit_length() - 1
    norm = math.fsum(pmf) * (1 + 2 * u)  # the 1-norm of `single`: its padding is zeros (fsum of the window is slow)
    transform_error = levels * _FFT_LEVEL_ERROR * norm
    bound = norm + transform_error  # |X_k| and |X~_k| are at most this
    product_error = math.expm1((l0 - 1) * math.log1p(math.sqrt(2) * 2 * u / (1 - 2 * u))) * 1.01
    power_max = bound**l0 * (1 + product_error)
    point_error = (
        l0 * bound ** (l0 - 1) * transform_error + product_error * bound**l0 + levels * _FFT_LEVEL_ERROR * power_max
    ) * (1 + 1e-6)
    law = np.fft.irfft(_integer_power(np.fft.rfft(single), l0), n=length)
    law = np.roll(law, half)  # index i <-> r = i - half
    # subgaussian tails (CKS 2020): P[|Y| >= t] <= 2 exp(-t^2 / (2 s2)), P[S <= -t] <= exp(-t^2 / (2 l0 s2)); an
    # exponent clamped at the underflow limit only makes a bound larger
    variance_proxy = l0 * sigma2
    return _SumLaw(
        law=law,
        half=half,
        point_error=point_error,
        input_factor=math.expm1(l0 * math.log1p(input_error)),
        truncated=2 * l0 * math.exp(max(-((cutoff + 1) ** 2) / (2 * sigma2), _EXP_UNDERFLOW))
        + math.exp(max(-(half * half) / (2 * variance_proxy), _EXP_UNDERFLOW)),
        aliased=2 * math.exp(max(-((length - half) ** 2) / (2 * variance_proxy), _EXP_UNDERFLOW)),
    )


def _poisson_sum_law(sigma2: float, l0: int, half: int) -> _SumLaw:
    """The law of S on r in [-half, l0] from the sampled normal density A(r), with the Poisson-summation bound
    of the module docstring as its point error. The window reaches r = l0, beyond any r the tail identity uses
    (|r| <= l0 / 2 + 1); below -half, S's mass is at most exp(-half^2 / (2 l0 s2)) (subgaussian, CKS 2020)."""
    u = _UNIT_ROUNDOFF
    pi2_sigma2 = math.pi**2 * sigma2
    rho_p = 2 * math.exp(-pi2_sigma2 / 2) / -math.expm1(-4 * pi2_sigma2)
    poisson = l0 * rho_p * math.exp((l0 - 1) * rho_p) + math.exp(max(-l0 * pi2_sigma2 / 2, _EXP_UNDERFLOW)) / (
        math.pi**2 * l0 * sigma2
    )
    variance = l0 * sigma2
    law = np.arange(-half, l0 + 1, dtype=np.float64)  # r, with |r| < 2^26: r * r is exact
    np.multiply(law, law, out=law)  # in place: the window has up to 2^21 points
    np.divide(law, -2 * variance, out=law)
    np.exp(law, out=law)
    law /= math.sqrt(2 * math.pi * variance)
    # exponent within 3u relative (s2's rounding, the product, the division), exp within 4 ulp, the normaliser
    # (pi, the products, sqrt and the division) within 6u: (3 a + 12) u, rounded up like the FFT's inputs
    input_error = (4 * (half * half) / (2 * variance) + 16) * u
    return _SumLaw(
        law=law,
        half=half,
        # P <= A + eta <= (A~ + eta (1 + e)) / (1 - e) and P >= A - eta >= (A~ - eta (1 + e)) / (1 + e), the
        # forms in which _tail_cdf_bound applies them; margin for the float evaluation of eta itself
        point_error=poisson * (1 + input_error) * (1 + 1e-6) + 1e-300,
        input_factor=input_error,
        truncated=math.exp(max(-(half * half) / (2 * variance), _EXP_UNDERFLOW)),
        aliased=0.0,
    )


def _tail_cdf_bound(law: _SumLaw, sigma2: float, l0: int, k: int, log_factor: float, upper: bool) -> float:
    """An upper (``upper``) or lower bound of e^log_factor * P[S <= k] for k < 0, by the shift identity of the
    module docstring with mu = round(k / l0)."""
    u = _UNIT_ROUNDOFF
    mu = -((-k + l0 // 2) // l0)  # round(k / l0) for k < 0, ties away from zero
    r_top = k - l0 * mu
    # log_factor - (l0 mu^2 + 2 mu r) / (2 s2), computed in place (up to 2^21 points) in the order written
    weights = np.arange(-law.half, r_top + 1, dtype=np.float64)
    count = len(weights)
    weights *= 2.0 * mu
    weights += l0 * mu * mu
    weights /= 2 * sigma2
    np.subtract(log_factor, weights, out=weights)
    # the computed exponent is monotone in r (each rounding is), so its largest magnitude is at an end
    largest_exponent = max(abs(max(float(weights[0]), _EXP_UNDERFLOW)), abs(max(float(weights[-1]), _EXP_UNDERFLOW)))
    np.exp(weights, out=weights)
    top_weight = float(weights[-1])
    values = law.law[:count]
    # exponent and exp rounding, the product, and a sum of N nonnegative terms in any order (relative (N - 1) u)
    weight_error = 3 * u * largest_exponent + 7 * u + 1.01 * count * u
    if upper:
        terms = values + law.point_error
        np.maximum(terms, 0.0, out=terms)
        total = float(np.sum(np.multiply(weights, terms, out=terms)))
        total = total * (1 + weight_error) / (1 - law.input_factor)  # (1 - eps_in)^-l0 <= 1 / (1 - input_factor)
        return total + top_weight * (1 + weight_error) * law.truncated + _UNDERFLOW_SLACK
    terms = values - law.point_error
    np.maximum(terms, 0.0, out=terms)
    total = float(np.sum(np.multiply(weights, terms, out=terms)))
    total = total * (1 - weight_error) / (1 + law.input_factor) - top_weight * (1 + weight_error) * law.aliased
    return max(total - _UNDERFLOW_SLACK, 0.0)  # subnormal weights carry no relative accuracy


def _vector_delta(sigma2: Fraction, epsilon: Fraction, shift: int, l0: int) -> float:
    sigma2_f = float(sigma2)
    law = _sum_law(sigma2_f, l0)
    if law is None:
        return 1.0
    # L > eps iff S < c; k1 the largest integer below c, exactly (Fractions)
    c = Fraction(l0 * shift, 2) - epsilon * sigma2 / shift
    k1 = math.ceil(c) - 1
    k2 = k1 - l0 * shift  # always < 0
    eps_low = float(epsilon)
    if Fraction(eps_low) > epsilon:
        eps_low = math.nextafter(eps_low, -math.inf)
    if k1 < 0:
        first = _tail_cdf_bound(law, sigma2_f, l0, k1, 0.0, upper=True)
    else:  # P[S <= k1] = 1 - P[S <= -k1 - 1] by symmetry
        first = 1.0 - _tail_cdf_bound(law, sigma2_f, l0, -k1 - 1, 0.0, upper=False) + 4 * _UNIT_ROUNDOFF
    second = _tail_cdf_bound(law, sigma2_f, l0, k2, eps_low, upper=False)
    return min(1.0, max(0.0, first - second) + 4 * _UNIT_ROUNDOFF * first + 1e-300)


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
