"""One Gaussian measurement of a histogram's prefix sums (its cumulative counts), for quantiles (ADR 37).

Two strategies, each a linear mechanism ``y = C x + z`` (``x`` the m bin counts, ``z`` i.i.d. exact discrete Gaussian
noise from the OS CSPRNG) decoded to the m prefix sums as ``B y`` with ``B C = A`` (the prefix-sum matrix), so the
published prefixes are the true ones plus ``B z``, computed here exactly in rationals:

* :class:`ConsistentTreeCdf` (``tree_consistent``): every node of the complete binary tree over the bins padded to
  M = 2^L leaves (the padding bins hold no record), decoded by least squares, the consistent estimate of Hay, Rastogi,
  Miklau & Suciu (VLDB 2010), whose node estimates add up. With A the (2M - 1) x M node matrix, ``A^T A`` is
  diagonal in the Haar basis: a wavelet of support 2^l has eigenvalue 2^l - 1 (the node sizes below it), the
  constant 2M - 1. So the least-squares leaves are ``(A^T A)^-1 A^T y`` in O(M log M), and a prefix of t + 1 bins
  gets, from each level, only the wavelet whose support straddles its end.
* :class:`SquareRootCdf` (``sqrt_factorization``): the square-root factorization of ADR 32
  (:class:`~dp_operators.continual.strategies.SquareRootToeplitz`), the bins playing the steps.

Sensitivity: one privacy unit adds at most Linf records to each of at most L0 bins over the groups
(:func:`unit_sensitivity_squared`); each strategy's squared sensitivity for k bins of one group is exact for the
worst pattern (k contiguous bins from the first).
Everything but :meth:`CdfMeasurement.noised_prefixes` is a function of public parameters.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array

#: The CDF strategies a quantile may name (``cdf_strategy``); ``auto`` takes the smaller published half-width.
CDF_STRATEGIES = ("tree_consistent", "sqrt_factorization")
#: The most bins the square-root factorization takes: its exact decoder costs O(m^2) products of O(m)-bit integers
#: per group (0.7 s at 1,000 bins, 1.8 s at 2,000, 17 s at 4,000: the decoder's denominator has about 1.87 bits a
#: bin); above it ``auto`` takes the consistent tree, O(m log m) (0.2 s at 4,000 bins).
SQRT_MAX_BINS = 2048


def unit_sensitivity_squared(per_group: Callable[[int], Fraction], bins: int, l0: int, groups: int) -> Fraction:
    """The squared L2 sensitivity of the measurement of every group, for one privacy unit in at most L0 partitions
    (bins of any group), each moved by 1: ``per_group(k)`` is one group's for k of its bins (non-decreasing).

    With L0 <= m, or one group, the unit's worst is k = min(L0, m) bins of one group: the strategies' matrices are
    entrywise non-negative, so ``per_group`` is superadditive over disjoint bins, and bins spread over groups move
    the measurement less than the same bins in one. With L0 > m and several groups a unit fills k_g <= m bins of
    each of at most min(G, L0) groups, sum k_g <= L0; ``per_group(k) / k`` is not monotone (it peaks below m for the
    square root and dips after each power of 2 for the tree), so full groups need not be the worst. Then the bound
    is the smaller of min(G, L0) per_group(m) and min(L0, G m) max_k per_group(k) / k (sum_g per_group(k_g) =
    sum_g k_g per_group(k_g) / k_g)."""
    if groups == 1 or l0 <= bins:
        return Fraction(per_group(min(l0, bins)))
    ratio = max(Fraction(per_group(k), k) for k in range(1, bins + 1))
    return min(min(groups, l0) * Fraction(per_group(bins)), min(l0, groups * bins) * ratio)


def tree_sensitivity_squared(leaves: int, contributions: int) -> int:
    """The squared L2 sensitivity of every node of a complete binary tree over ``leaves`` (a power of 2) when one
    unit adds 1 to each of ``contributions`` leaves: k contiguous leaves from the first fill every level's nodes
    fullest at once (exact): sum over levels of (k // 2^l) 4^l + (k mod 2^l)^2."""
    total, size = 0, 1
    while size <= leaves:
        total += (contributions // size) * size * size + (contributions % size) ** 2
        size *= 2
    return total


class CdfMeasurement(abc.ABC):
    """A planned measurement of one group's prefix sums.

    Attributes:
        name: the strategy (:data:`CDF_STRATEGIES`).
        bins: m.
        sensitivity_squared: the squared L2 sensitivity of ``C x`` for one privacy unit (records^2), exact.
        noise_variance: sigma^2 of each measurement (records^2), exact: ``sensitivity_squared / (2 rho)``.
    """

    name: str

    def __init__(self, bins: int, sensitivity_squared: Fraction, rho: Fraction) -> None:
        self.bins = bins
        self.sensitivity_squared = Fraction(sensitivity_squared)
        self.noise_variance = self.sensitivity_squared / (2 * Fraction(rho))

    @property
    def rho(self) -> Fraction:
        """The zCDP rho of the measurement, exact: Delta^2 / (2 sigma^2) (Bun & Steinke 2016; the discrete
        Gaussian: Canonne, Kamath & Steinke 2020)."""
        return self.sensitivity_squared / (2 * self.noise_variance)

    @abc.abstractmethod
    def prefix_variances(self) -> np.ndarray:
        """Shape (bins,): the noise variance of each published prefix sum (records^2, float64)."""

    @property
    def worst_std(self) -> float:
        """The largest standard deviation of a published prefix sum (records)."""
        return math.sqrt(float(self.prefix_variances().max()))

    @abc.abstractmethod
    def half_width(self, confidence: float) -> float:
        """h with P(every prefix of one group is within h of the true one) >= ``confidence`` (records; public)."""

    @abc.abstractmethod
    def noised_prefixes(self, histogram: list[int]) -> list[Fraction]:
        """The m noised prefix sums of ``histogram`` (exact rationals), with fresh noise; the work is fixed by m."""

    def describe(self) -> dict:
        return {"strategy": self.name, "sensitivity_squared_exact": str(self.sensitivity_squared),
                "noise_variance_exact": str(self.noise_variance)}


class ConsistentTreeCdf(CdfMeasurement):
    """Every node of the binary tree over M = 2^L >= m leaves, decoded by least squares (module docstring)."""

    name = "tree_consistent"

    def __init__(self, bins: int, l0: int, linf: int, groups: int, rho: Fraction) -> None:
        self.leaves = 1 << (bins - 1).bit_length()
        self.levels = self.leaves.bit_length()  # node sizes 1, 2, ..., M
        squared = unit_sensitivity_squared(lambda k: Fraction(tree_sensitivity_squared(self.leaves, k)), bins, l0,
                                           groups)
        super().__init__(bins, squared * linf * linf, rho)

    def _straddling(self, t: int) -> list[tuple[int, int]]:
        """Per level l >= 1, the block of 2^l bins straddling the end of the prefix of bins 0..t: ``(l, w)`` with w
        its bins within the prefix in the left half minus those in the right half (0: the block is not cut)."""
        cut = []
        for level in range(1, self.levels):
            half = 1 << (level - 1)
            inside = t + 1 - ((t >> level) << level)  # bins of the block within the prefix, 1..2^l
            weight = min(inside, half) - max(0, inside - half)
            if weight:
                cut.append((level, weight))
        return cut

    def _weights(self, t: int) -> tuple[Fraction, list[tuple[int, Fraction]]]:
        """The prefix of bins 0..t as a combination of the Haar coefficients of ``A^T y``: the constant's weight
        (over its eigenvalue 2M - 1), and per cut block of size 2^l the weight of its left-minus-right sum (over
        2^l (2^l - 1), the wavelet's eigenvalue times its squared norm)."""
        m = self.leaves
        return (Fraction(t + 1, m * (2 * m - 1)),
                [(level, Fraction(weight, (1 << level) * ((1 << level) - 1))) for level, weight in self._straddling(t)])

    def prefix_variances(self) -> np.ndarray:
        m = self.leaves
        variances = np.empty(self.bins)
        for t in range(self.bins):  # the same Haar terms as _weights, squared: the wavelets are orthogonal
            variances[t] = (t + 1) ** 2 / (m * (2 * m - 1)) + sum(
                weight * weight / ((1 << level) * ((1 << level) - 1)) for level, weight in self._straddling(t))
        return variances * float(self.noise_variance)

    def half_width(self, confidence: float) -> float:
        # a rational combination of discrete Gaussians, each sigma^2-sub-Gaussian (Canonne, Kamath & Steinke 2020):
        # P(|noise| >= h) <= 2 exp(-h^2 / 2V); a union bound over the m prefixes
        each = (1 - confidence) / self.bins
        return math.sqrt(2 * float(self.prefix_variances().max()) * math.log(2 / each))

    def noised_prefixes(self, histogram: list[int]) -> list[Fraction]:
        m = self.leaves
        draws = [int(z) for z in sample_discrete_gaussian_array(self.noise_variance, 2 * m - 1)]
        # A^T z: each leaf's sum of the noise of the nodes holding it (level l node j at draws[offset_l + j])
        leaf_noise = [0] * m
        offset = 0
        for level in range(self.levels):
            for leaf in range(m):
                leaf_noise[leaf] += draws[offset + (leaf >> level)]
            offset += m >> level
        partial = [0]
        for value in leaf_noise:
            partial.append(partial[-1] + value)
        total = partial[-1]
        cumulative, running = [], 0
        for t in range(self.bins):
            running += histogram[t]
            constant, terms = self._weights(t)
            noise = constant * total
            for level, weight in terms:
                start, half = (t >> level) << level, 1 << (level - 1)
                left = partial[start + half] - partial[start]
                right = partial[start + 2 * half] - partial[start + half]
                noise += weight * (left - right)
            cumulative.append(running + noise)
        return cumulative


class SquareRootCdf(CdfMeasurement):
    """The square-root factorization of ADR 32 over the m bins (:class:`~dp_operators.continual.noise.SeriesNoise`
    decodes it exactly)."""

    name = "sqrt_factorization"

    def __init__(self, bins: int, l0: int, linf: int, groups: int, rho: Fraction) -> None:
        from dp_operators.continual.noise import SeriesNoise
        from dp_operators.continual.plan import Candidate
        from dp_operators.continual.strategies import GRID_BITS, SquareRootToeplitz

        strategy = SquareRootToeplitz(bins)
        numerators = strategy.numerators
        partial = [0]
        for numerator in numerators:
            partial.append(partial[-1] + numerator)

        def per_group(k: int) -> Fraction:  # k contiguous bins from the first: column sums P_t - P_(t-k)
            return Fraction(sum((partial[t + 1] - partial[max(t + 1 - k, 0)]) ** 2 for t in range(bins)),
                            1 << (2 * GRID_BITS))

        squared = unit_sensitivity_squared(per_group, bins, l0, groups) * linf * linf
        super().__init__(bins, squared, rho)
        variances = strategy.step_variances()
        candidate = Candidate(self.name, squared, self.noise_variance, math.sqrt(float(self.noise_variance)
                              * float(variances.max())), math.sqrt(float(self.noise_variance) * float(variances.mean())))
        self.series = SeriesNoise(strategy, candidate, Fraction(1))

    def prefix_variances(self) -> np.ndarray:
        return self.series.strategy.step_variances() * float(self.noise_variance)

    def half_width(self, confidence: float) -> float:
        each = 1 - (1 - confidence) / self.bins
        worst = int(np.argmax(self.series.strategy.step_variances()))
        return self.series.half_width(worst, each)

    def noised_prefixes(self, histogram: list[int]) -> list[Fraction]:
        history: list[list[int]] = []
        cumulative, running = [], 0
        for t in range(self.bins):
            history.append(self.series.draw(t))
            running += histogram[t]
            cumulative.append(running + self.series.total_noise(history))
        return cumulative

    def describe(self) -> dict:
        return {**super().describe(), "lattice_exact": str(self.series.lattice),
                "sigma2_lattice_units_exact": str(self.series.sigma2)}


def cdf_measurement(strategy: str, bins: int, l0: int, linf: int, groups: int, rho: Fraction,
                    confidence: float = 0.95) -> CdfMeasurement:
    """The measurement of ``strategy`` (``auto``: the one with the smaller :meth:`~CdfMeasurement.half_width` at
    ``confidence``, the one published, ties to the tree; the square root only up to :data:`SQRT_MAX_BINS` bins) for m = ``bins``, L0, Linf,
    G = ``groups`` and the budget ``rho`` (public parameters only).

    Raises:
        ValueError: an unknown strategy; ``sqrt_factorization`` over more than :data:`SQRT_MAX_BINS` bins.
    """
    if strategy == "tree_consistent":
        return ConsistentTreeCdf(bins, l0, linf, groups, rho)
    if strategy == "sqrt_factorization":
        if bins > SQRT_MAX_BINS:
            raise ValueError(f"cdf_strategy sqrt_factorization takes at most {SQRT_MAX_BINS:,} bins (its exact decoder "
                             f"grows as m^3), got {bins:,}: use tree_consistent or auto, or wider bins")
        return SquareRootCdf(bins, l0, linf, groups, rho)
    if strategy != "auto":
        raise ValueError(f"unknown CDF strategy {strategy!r}; expected auto or one of {', '.join(CDF_STRATEGIES)}")
    names = [name for name in CDF_STRATEGIES if name != "sqrt_factorization" or bins <= SQRT_MAX_BINS]
    candidates = [cdf_measurement(name, bins, l0, linf, groups, rho) for name in names]
    return min(candidates, key=lambda candidate: candidate.half_width(confidence))
