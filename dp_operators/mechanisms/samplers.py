"""Exact samplers for the discrete Laplace and discrete Gaussian distributions.

Source: C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020
(arXiv:2004.00010), Section 5, Algorithms 1-3. Every step works on integers and rationals, so the output
distribution is exactly the stated one: no floating-point rounding leaks the input (Mironov, CCS 2012).

Randomness comes only from the operating system's CSPRNG through ``secrets.randbelow``. There is deliberately no
seed parameter and no ``random.Random`` state: reproducible noise could be replayed and averaged away.
"""

from __future__ import annotations

import secrets
from fractions import Fraction
from math import isqrt

from dp_operators.mechanisms._rational import as_positive_rational

__all__ = [
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_vector",
    "sample_discrete_laplace",
    "sample_discrete_laplace_vector",
]


def _bernoulli_exp_minus_at_most_one(num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for 0 <= num/den <= 1 (CKS 2020 Algorithm 1, first branch).

    K is the first k with Bernoulli(gamma/k) = 0; P(K odd) = sum_k (-gamma)^k / k! = exp(-gamma).
    """
    k = 1
    while secrets.randbelow(den * k) < num:
        k += 1
    return k % 2 == 1


def _bernoulli_exp_minus(num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for num >= 0, den > 0 (CKS 2020 Algorithm 1)."""
    # exp(-gamma) = exp(-1)^floor(gamma) * exp(-frac(gamma)): the first-branch sampler only handles gamma <= 1.
    whole, num = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_minus_at_most_one(1, 1):
            return False
    return _bernoulli_exp_minus_at_most_one(num, den)


def sample_geometric(t: int, s: int) -> int:
    """One exact draw with P(y) = (1-q) q^y, q = exp(-s/t): CKS 2020 Algorithm 2 before its sign step (``u + t v``
    is geometric with parameter exp(-1/t); floor division by s gives parameter exp(-s/t))."""
    while True:
        u = secrets.randbelow(t)
        if not _bernoulli_exp_minus_at_most_one(u, t):
            continue
        v = 0
        while _bernoulli_exp_minus_at_most_one(1, 1):
            v += 1
        return (u + t * v) // s


def _discrete_laplace(t: int, s: int) -> int:
    """One draw with pmf proportional to exp(-|x| * s / t), i.e. scale t/s (CKS 2020 Algorithm 2)."""
    while True:
        magnitude = sample_geometric(t, s)
        negative = secrets.randbelow(2) == 1
        # without this rejection 0 would be drawn twice as often as the symmetric pmf allows
        if negative and magnitude == 0:
            continue
        return -magnitude if negative else magnitude


def _discrete_gaussian(p: int, q: int) -> int:
    """One draw with pmf proportional to exp(-x^2 / (2 sigma2)), sigma2 = p/q (CKS 2020 Algorithm 3)."""
    t = isqrt(p * q) // q + 1  # floor(sigma) + 1, exactly: floor(sqrt(p q) / q)
    den = 2 * p * q * t * t
    while True:
        y = _discrete_laplace(t, 1)
        # accept with probability exp(-(|y| - sigma2/t)^2 / (2 sigma2)), written over the common denominator
        d = abs(y) * q * t - p
        if _bernoulli_exp_minus(d * d, den):
            return y


def sample_discrete_laplace(scale: Fraction | int) -> int:
    """Draw one integer from the discrete Laplace distribution.

    pmf: P(x) = tanh(1/(2 scale)) * exp(-|x| / scale) for x in Z; the scale is in the units of the integer
    aggregate being noised (e.g. people, or grid steps of a fixed-point sum). Adding it to a query of L1
    sensitivity Delta gives (Delta/scale)-DP.

    Args:
        scale: positive finite rational (int, Fraction, Decimal, or float read as its decimal).

    Raises:
        ValueError: scale is NaN, infinite, <= 0 or a bool. TypeError: scale is not a number.

    Source: Canonne, Kamath, Steinke 2020, Algorithm 2. Randomness: OS CSPRNG (``secrets``); no seed.
    """
    scale = as_positive_rational(scale, "scale")
    return _discrete_laplace(scale.numerator, scale.denominator)


def sample_discrete_laplace_vector(scale: Fraction | int, size: int) -> list[int]:
    """Draw ``size`` independent discrete Laplace integers (see ``sample_discrete_laplace``).

    Returns a list of length ``size`` of built-in ints. Raises ValueError for a bad scale or a size that is
    not a non-negative int.
    """
    scale = as_positive_rational(scale, "scale")
    _check_size(size)
    t, s = scale.numerator, scale.denominator
    return [_discrete_laplace(t, s) for _ in range(size)]


def sample_discrete_gaussian(sigma2: Fraction | int) -> int:
    """Draw one integer from the discrete Gaussian distribution N_Z(0, sigma2).

    pmf: P(x) proportional to exp(-x^2 / (2 sigma2)) for x in Z; sigma2 is the squared scale parameter (close to,
    but not exactly, the variance) in squared units of the integer aggregate. Adding it to a query of L2
    sensitivity Delta gives (Delta^2 / (2 sigma2))-zCDP (CKS 2020 Theorem 14).

    Args:
        sigma2: positive finite rational (int, Fraction, Decimal, or float read as its decimal).

    Raises:
        ValueError: sigma2 is NaN, infinite, <= 0 or a bool. TypeError: sigma2 is not a number.

    Source: Canonne, Kamath, Steinke 2020, Algorithm 3. Randomness: OS CSPRNG (``secrets``); no seed.
    """
    sigma2 = as_positive_rational(sigma2, "sigma2")
    return _discrete_gaussian(sigma2.numerator, sigma2.denominator)


def sample_discrete_gaussian_vector(sigma2: Fraction | int, size: int) -> list[int]:
    """Draw ``size`` independent discrete Gaussian integers (see ``sample_discrete_gaussian``).

    Returns a list of length ``size`` of built-in ints. Raises ValueError for a bad sigma2 or a size that is
    not a non-negative int.
    """
    sigma2 = as_positive_rational(sigma2, "sigma2")
    _check_size(size)
    p, q = sigma2.numerator, sigma2.denominator
    return [_discrete_gaussian(p, q) for _ in range(size)]


def _check_size(size: object) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
