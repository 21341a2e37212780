"""A series' noise: fresh exact draws at each step, and the exact noise on each published running total.

A series measures ``y = C x + z`` once over its T steps (:mod:`.strategies`), one step at a time: at step ``t`` the
measurements that step completes get fresh noise ``z`` (one per step for the Toeplitz strategies; the intervals ending
at ``t`` for the tree), drawn from the exact discrete Gaussian on the series' lattice with the OS CSPRNG (DESIGN.md
2.2, 2.5). The running total published at step ``t`` is ``(A x)_t + (B z)_t``, which equals ``(B y)_t`` exactly: this
module computes ``(B z)_t`` from the noise drawn so far, in rationals, so the published total is a function of the
measurements alone (post-processing; ADR 32). The draws of earlier steps are the series' secret state: whoever holds
them and a published total learns the true total.

Units: noise is drawn in *lattice units* (integers); :attr:`SeriesNoise.lattice` converts them to value units.

The square root's exact decoder (:func:`square_root_decoder`) is computed in integers over one power-of-two
denominator (its dot products as exact float64 limb sums), once per horizon and process: a module cache, so every
:class:`SeriesNoise` of that horizon shares it, and :meth:`SeriesNoise.total_noise` is one integer dot product and
one rational.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from statistics import NormalDist

import numpy as np

from dp_operators.consistency.structure import one_blas_thread
from dp_operators.continual.plan import Candidate
from dp_operators.continual.strategies import (
    GRID_BITS,
    BinaryTree,
    SquareRootToeplitz,
    Strategy,
    SummedIncrements,
)
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array


#: The least sigma (lattice units) at which a series' half-width is the continuous Gaussian quantile (the square
#: root's fine lattice); below it the sub-Gaussian bound holds instead.
FINE_LATTICE_SIGMA = 1024
#: The most points :func:`lattice_sum_half_width` convolves (16 Mi doubles, 128 MiB a vector).
_MAX_FFT_POINTS = 1 << 24
#: Reach of a discrete Gaussian's pmf in :func:`lattice_sum_half_width`, in standard deviations (the mass beyond
#: is below exp(-72), far under the float64 resolution of the coverage).
_REACH_SIGMAS = 12


@functools.lru_cache(maxsize=64)
def lattice_sum_half_width(sigma2: Fraction, terms: int, confidence: float) -> int:
    """The smallest integer ``h`` with ``P[|Z_1 + ... + Z_terms| <= h] >= confidence``, the ``Z_i`` i.i.d. discrete
    Gaussians of parameter ``sigma2`` on the integers (lattice units): the exact law, by FFT convolution of the
    pmf (float64), with a margin on the coverage for its rounding. With sigma at least :data:`FINE_LATTICE_SIGMA`
    the Gaussian quantile rounded up to the lattice; when the law would need more than 2^24 points, the
    sub-Gaussian bound (wider, never short). Public parameters only.

    Raises:
        ValueError: ``terms`` below 1, or ``sigma2`` not > 0.
    """
    if terms < 1 or sigma2 <= 0:
        raise ValueError(f"terms must be >= 1 and sigma2 > 0, got {terms}, {sigma2}")
    sigma = math.sqrt(float(sigma2))
    reach = math.ceil(_REACH_SIGMAS * sigma) + 1
    if sigma >= FINE_LATTICE_SIGMA:
        # the lattice is fine against the noise: each pmf is the Gaussian density on the lattice to a relative
        # exp(-2 pi^2 sigma^2), and the Gaussian quantile, rounded up to a lattice point, covers
        return math.ceil(NormalDist().inv_cdf((1 + confidence) / 2) * sigma * math.sqrt(terms))
    if terms * 2 * reach + 1 > _MAX_FFT_POINTS:  # the exact law would not fit: the sub-Gaussian bound, never short
        return math.ceil(sigma * math.sqrt(2 * terms * math.log(2 / (1 - confidence))))
    values = np.arange(-reach, reach + 1, dtype=np.float64)
    pmf = np.exp(-values * values / (2 * float(sigma2)))
    pmf /= pmf.sum()
    size = terms * 2 * reach + 1
    law = np.fft.irfft(np.fft.rfft(pmf, n=size) ** terms, n=size)  # the sum's pmf on [-terms*reach, terms*reach]
    law = np.clip(law, 0.0, None)
    middle = terms * reach
    covered = law[middle] + np.concatenate(([0.0], np.cumsum(law[middle + 1:] + law[middle - 1::-1])))
    # a margin for the FFT's rounding (observed below 1e-12 here), kept well inside the confidence's distance to 1
    h = int(np.searchsorted(covered, confidence + min(1e-9, (1 - confidence) / 1000)))
    if h >= len(covered):
        raise ValueError(f"no half-width within the pmf's reach covers {confidence}")
    return h


@dataclass(frozen=True)
class SeriesNoise:
    """The noise of one series: which measurements each step adds, how they are drawn, and how a step's running
    total is decoded from them.

    Attributes:
        strategy: the factorization (:mod:`.strategies`).
        candidate: its plan (the exact measurement noise variance ``noise_variance``, value units squared).
        grid: the increments' grid (1 for counts; a fixed-point sum's grid), a positive exact number.
    """

    strategy: Strategy
    candidate: Candidate
    grid: Fraction = Fraction(1)

    @property
    def lattice(self) -> Fraction:
        """The lattice ``C x`` lies on, value units: the grid, times ``2^-GRID_BITS`` for the square root's rounded
        coefficients."""
        if isinstance(self.strategy, SquareRootToeplitz):
            return self.grid / (1 << GRID_BITS)
        return self.grid

    @property
    def sigma2(self) -> Fraction:
        """The discrete Gaussian's parameter in lattice units squared (exact): ``noise_variance / lattice^2``."""
        return self.candidate.noise_variance / (self.lattice * self.lattice)

    def measurements_at(self, step: int) -> list[tuple[int, int]]:
        """The measurements step ``step`` (0-based) completes: ``(level, index)`` of each tree interval ending
        there, bottom up; ``(0, step)`` for a Toeplitz strategy."""
        if isinstance(self.strategy, BinaryTree):
            return [(level, (step + 1 >> level) - 1) for level in range(self.strategy.levels)
                    if (step + 1) % (1 << level) == 0]
        return [(0, step)]

    def draw(self, step: int) -> list[int]:
        """Fresh exact noise (lattice units) for :meth:`measurements_at` ``(step)``, from the OS CSPRNG (the exact
        vectorised discrete Gaussian sampler, ADR 22)."""
        return [int(value) for value in sample_discrete_gaussian_array(self.sigma2, len(self.measurements_at(step)))]

    def half_width(self, step: int, confidence: float) -> float:
        """The half-width of the running total's interval at step ``step`` (0-based), value units, from public
        parameters only: the noise on the total lies within it with probability at least ``confidence``.

        - Summed increments and the binary tree decode with integer weights: the noise is a sum of ``n`` i.i.d.
          discrete Gaussians on the lattice (``n = step + 1``; the tree: the intervals of ``step + 1``'s binary
          digits), and the half-width is the smallest lattice point its exact law covers
          (:func:`lattice_sum_half_width`). The Gaussian quantile can fall just short of a lattice point and cover
          much less (sigma^2 = 1: 1.96 covers P[|Z| <= 1] = 0.883).
        - The tree with Honaker's weights: a weighted sum of discrete Gaussians, each sigma^2-sub-Gaussian
          (``E[exp(t X)] <= exp(t^2 sigma^2 / 2)``: Canonne, Kamath, Steinke 2020), so ``P[|noise| >= h] <= 2 exp(-h^2 / 2V)`` with ``V`` the planned variance:
          ``h = sqrt(2 V ln(2 / (1 - confidence)))`` (wider than the Gaussian's, never short).
        - The square root: the Gaussian quantile times the planned standard deviation when sigma is at least
          :data:`FINE_LATTICE_SIGMA` lattice units (its lattice is 2^-24 of the grid: sigma is 2^23 lattice units
          at T = 365, rho = 1), where a discrete Gaussian's pmf is the Gaussian density's on the lattice to a
          relative ``exp(-2 pi^2 sigma^2)`` (Poisson summation; ADR 32); the sub-Gaussian bound below that.

        Raises:
            ValueError: a step outside the series, or a confidence outside (0, 1).
        """
        if not 0 <= step < self.strategy.horizon or not 0 < confidence < 1:
            raise ValueError(f"step must be in [0, {self.strategy.horizon}) and confidence in (0, 1), got {step}, "
                             f"{confidence}")
        variance = float(self.candidate.noise_variance) * float(self.strategy.step_variances()[step])
        if isinstance(self.strategy, SummedIncrements) or (
                isinstance(self.strategy, BinaryTree) and not self.strategy.honaker):
            terms = step + 1 if isinstance(self.strategy, SummedIncrements) else (step + 1).bit_count()
            return lattice_sum_half_width(self.sigma2, terms, confidence) * float(self.lattice)
        if isinstance(self.strategy, BinaryTree) or self.sigma2 < FINE_LATTICE_SIGMA ** 2:
            return math.sqrt(2 * variance * math.log(2 / (1 - confidence)))
        return NormalDist().inv_cdf((1 + confidence) / 2) * math.sqrt(variance)

    def total_noise(self, history: list[list[int]]) -> Fraction:
        """``(B z)_t`` in value units, exactly, where ``t = len(history) - 1`` and ``history[s]`` is step ``s``'s
        draws (:meth:`draw`): the noise on the running total published at step ``t``.

        Raises:
            ValueError: a history longer than the series, or a step with the wrong number of draws.
        """
        t = len(history) - 1
        if not 0 <= t < self.strategy.horizon:
            raise ValueError(f"a history of {len(history)} steps does not fit a series of {self.strategy.horizon}")
        counts = ([len(self.measurements_at(step)) for step in range(t + 1)] if isinstance(self.strategy, BinaryTree)
                  else itertools.repeat(1))  # a Toeplitz strategy draws once a step
        for step, (draws, count) in enumerate(zip(history, counts)):
            if len(draws) != count:
                raise ValueError(f"step {step} holds {len(draws)} draws, not {count}")
        if isinstance(self.strategy, SummedIncrements):
            total = Fraction(sum(draws[0] for draws in history))
        elif isinstance(self.strategy, SquareRootToeplitz):
            # one integer dot product over the decoder's common denominator, then one rational
            decoder = square_root_decoder(self.strategy.horizon)
            weights = decoder.numerators[t::-1]  # 2^exponent b_(t-s), s = 0 .. t
            draws = map(operator.index, map(operator.itemgetter(0), history))
            total = Fraction(sum(map(operator.mul, weights, draws)), 1 << decoder.exponent)
        else:
            total = self._tree_total(history)
        return total * self.lattice

    @cached_property
    def decoder(self) -> list[Fraction]:
        """The square root's exact decoder coefficients ``b_n``, n = 0 .. horizon - 1 (``B = A C^-1``, Toeplitz:
        ``B[t, s] = b_(t-s)``): prefix sums of the power series inverse of the rounded ``c``, as reduced rationals
        (:func:`square_root_decoder_fractions`, shared by every series of the horizon)."""
        return list(square_root_decoder_fractions(self.strategy.horizon))

    def _tree_total(self, history: list[list[int]]) -> Fraction:
        tree: BinaryTree = self.strategy  # type: ignore[assignment]
        noise: dict[tuple[int, int], int] = {}
        for step, draws in enumerate(history):
            noise.update(zip(self.measurements_at(step), draws))
        length, start, total = len(history), 0, Fraction(0)
        for level in reversed(range(tree.levels)):  # the prefix's dyadic intervals, longest first
            if length >> level & 1:
                node = (level, start >> level)
                total += self._estimate(node, noise) if tree.honaker else noise[node]
                start += 1 << level
        return total

    def measurement_order(self) -> list[tuple[int, int]]:
        """Every measurement of the series in the order the steps draw them (the columns of :meth:`decoder_rows`)."""
        return [node for step in range(self.strategy.horizon) for node in self.measurements_at(step)]

    def decoder_rows(self) -> np.ndarray:
        """Shape (horizon, measurements), float64: row ``t`` holds the weights of :meth:`total_noise` at step ``t``
        on every measurement (lattice units in, value units out: times :attr:`lattice`). For simulation and
        planning, where a float is exact enough; a published total is :meth:`total_noise`, in rationals."""
        order = self.measurement_order()
        column = {node: index for index, node in enumerate(order)}
        horizon = self.strategy.horizon
        rows = np.zeros((horizon, len(order)))
        lattice = float(self.lattice)
        if isinstance(self.strategy, SummedIncrements):
            rows[:, :] = np.tril(np.ones((horizon, horizon)))
        elif isinstance(self.strategy, SquareRootToeplitz):
            decoder = square_root_decoder(horizon)
            denominator = 1 << decoder.exponent
            # int / int is correctly rounded, as float(Fraction) is
            b = np.array([numerator / denominator for numerator in decoder.numerators])
            for t in range(horizon):
                rows[t, :t + 1] = b[t::-1]
        else:
            tree: BinaryTree = self.strategy  # type: ignore[assignment]
            for t in range(horizon):
                length, start = t + 1, 0
                for level in reversed(range(tree.levels)):
                    if length >> level & 1:
                        self._add_weights(rows[t], (level, start >> level), 1.0, column, tree.honaker)
                        start += 1 << level
        return rows * lattice

    def _add_weights(self, row: np.ndarray, node: tuple[int, int], weight: float, column: dict, honaker: bool) -> None:
        level, index = node
        if not honaker or level == 0:
            row[column[node]] += weight
            return
        own = float(self.honaker_weights[level])
        row[column[node]] += weight * own
        for half in (2 * index, 2 * index + 1):
            self._add_weights(row, (level - 1, half), weight * (1 - own), column, honaker)

    @cached_property
    def honaker_weights(self) -> list[Fraction]:
        """Per level, the weight of an interval's own measurement against the sum of its halves' estimates
        (inverse-variance, exact): ``2 v / (1 + 2 v)`` with ``v`` the halves' estimate variance."""
        weights, variance = [Fraction(1)], Fraction(1)
        for _ in range(1, self.strategy.levels):  # type: ignore[attr-defined]
            halves = 2 * variance
            weights.append(halves / (1 + halves))
            variance = halves / (1 + halves)
        return weights

    def _estimate(self, node: tuple[int, int], noise: dict[tuple[int, int], int]) -> Fraction:
        """The noise of an interval's minimum-variance estimate from itself and its completed descendants."""
        level, index = node
        if level == 0:
            return Fraction(noise[node])
        weight = self.honaker_weights[level]
        halves = self._estimate((level - 1, 2 * index), noise) + self._estimate((level - 1, 2 * index + 1), noise)
        return weight * noise[node] + (1 - weight) * halves


@dataclass(frozen=True)
class DyadicDecoder:
    """The square root's exact decoder over one power-of-two denominator: ``b_n = numerators[n] / 2^exponent``,
    n = 0 .. horizon - 1 (``numerators`` has the horizon's length; the fractions are not reduced).

    Attributes:
        exponent: the denominator's exponent ``E``: ``2^E b_n`` is an integer for every ``n`` (see
            :func:`_denominator_exponent`); about 1.87 bits a step.
        numerators: ``2^E b_n``, integers.
    """

    exponent: int
    numerators: tuple[int, ...]


@functools.lru_cache(maxsize=4)
def square_root_decoder(horizon: int) -> DyadicDecoder:
    """The exact decoder ``b_n`` of :class:`~.strategies.SquareRootToeplitz` ``(horizon)`` over a common
    power-of-two denominator: the prefix sums of the power series inverse of its rounded coefficients.

    Cached per horizon (the rounded coefficients are a function of the horizon alone), so every
    :class:`SeriesNoise` of a horizon in this process shares one computation. It takes about 6 ms at T = 365,
    25 ms at T = 1000 and 3 s at T = 10^4 on one BLAS thread (benchmarks/continual_decoder.py).

    Raises:
        ValueError: a horizon outside the strategies' range.
    """
    numerators = SquareRootToeplitz(horizon).numerators
    exponent = _denominator_exponent(numerators)
    return DyadicDecoder(exponent, tuple(itertools.accumulate(_scaled_inverse(numerators, exponent))))


@functools.lru_cache(maxsize=4)
def square_root_decoder_fractions(horizon: int) -> tuple[Fraction, ...]:
    """:func:`square_root_decoder` ``(horizon)`` as reduced :class:`~fractions.Fraction` (built once per horizon)."""
    decoder = square_root_decoder(horizon)
    fractions = []
    for numerator in decoder.numerators:
        # shift the numerator odd first: the gcd Fraction takes is then against a power of two, half the time
        shift = min((numerator & -numerator).bit_length() - 1, decoder.exponent) if numerator else decoder.exponent
        fractions.append(Fraction(numerator >> shift, 1 << (decoder.exponent - shift)))
    return tuple(fractions)


def _denominator_exponent(numerators: list[int]) -> int:
    """An ``E`` with ``2^E u_n`` an integer for every ``n < len(numerators)``, where ``u`` is the power series
    inverse of ``c_s = numerators[s] / 2^GRID_BITS`` (``c_0 = 1``), and so for its prefix sums.

    With ``v_s`` the exponent of ``c_s``'s reduced (power-of-two) denominator, ``u_n = -sum_(s=1..n) c_s u_(n-s)``
    has a denominator exponent ``e_n <= max_s (v_s + e_(n-s))``, ``e_0 = 0``; by induction ``e_n <= r n`` with
    ``r = max_s v_s / s``, so ``E = floor(r (T - 1))`` (``r = 15/8`` for T > 8, from ``c_8 = 6435 / 2^15``; the
    largest denominator exponent reached is within a few bits of ``E``: 371 of 373 at T = 200).
    """
    ratio = max((Fraction(GRID_BITS - ((value & -value).bit_length() - 1), s)
                 for s, value in enumerate(numerators) if s and value), default=Fraction(0))
    return math.floor(max(ratio, Fraction(0)) * (len(numerators) - 1))


#: The scaled inverse's dot products run in float64 on 16-bit limbs (exact: see :func:`_scaled_inverse`).
_LIMB_BITS = 16
#: Steps whose dot products with all earlier steps' limbs are one matrix product.
_BLOCK = 128


@one_blas_thread
def _scaled_inverse(numerators: list[int], exponent: int) -> list[int]:
    """``J_n = 2^exponent u_n``, n = 0 .. T - 1, exactly (integers), where ``u`` is the power series inverse of
    ``c_s = N_s / 2^GRID_BITS`` (``N = numerators``, ``N_0 = 2^GRID_BITS``): ``u_0 = 1``,
    ``u_n = -sum_(s=1..n) c_s u_(n-s)``, so ``J_0 = 2^exponent`` and
    ``J_n = -(sum_(s=1..n) N_s J_(n-s)) / 2^GRID_BITS``, a division that is exact when ``exponent`` is at least
    every ``u_n``'s denominator exponent (:func:`_denominator_exponent`; checked at every step).

    The sums run in float64 over each ``J_m``'s 16-bit digits (signed by ``J_m``'s sign, one row per step): every
    product and partial sum is an integer below ``sum_(s>=1) N_s * 2^16 < 2^53`` (checked; ``2^46.8`` at
    T = 10^4), so the matrix products are exact in any order, and each step's digit sums are carried back into one
    integer exactly. The earlier blocks' terms for a block of steps are one matrix product (the Toeplitz block of
    ``N`` times their rows). Memory: T x (exponent / 16) float64 (94 MB at T = 10^4).

    Raises:
        ArithmeticError: a sum beyond float64's exact integers, or a division that is not exact (``exponent`` too
            small).
        OverflowError: a ``|J_n|`` above ``2^(exponent + 8)`` (``|u_n| <= 1`` for these coefficients).
    """
    horizon = len(numerators)
    if sum(numerators[1:]) << _LIMB_BITS >= 1 << 53:
        raise ArithmeticError(f"a horizon of {horizon} steps overflows the decoder's exact float64 sums")
    width = (exponent + 1 + 8) // _LIMB_BITS + 1  # digits of |J_n| <= 2^exponent, with 8 bits to spare
    coefficients = np.array(numerators, dtype=np.float64)  # exact: below 2^(GRID_BITS + 1)
    rows = np.zeros((horizon, width))
    inverse = [1 << exponent]
    rows[0] = _to_limbs(inverse[0], width)
    steps = np.arange(horizon)
    # within a block: near[i, j] = N_(i-j) below the diagonal, 0 on and above it
    near = np.tril(coefficients[np.abs(steps[:_BLOCK, None] - steps[None, :_BLOCK])], -1)
    mask = (1 << GRID_BITS) - 1
    for start in range(1, horizon, _BLOCK):
        stop = min(start + _BLOCK, horizon)
        # the terms of the steps before this block, for every step n of the block: sum_(m < start) N_(n-m) J_m
        earlier = coefficients[steps[start:stop, None] - steps[None, :start]] @ rows[:start]
        for n in range(start, stop):
            i = n - start  # then the block's own earlier steps
            total = _from_limbs(earlier[i] + near[i, :i] @ rows[start:n])
            if total & mask:
                raise ArithmeticError(f"step {n} of the decoder is not a multiple of 2^-{exponent}")
            inverse.append(-(total >> GRID_BITS))
            rows[n] = _to_limbs(inverse[n], width)
    return inverse


def _to_limbs(value: int, width: int) -> np.ndarray:
    """Shape (width,), float64: ``|value|``'s base-2^16 digits, least significant first, with ``value``'s sign.

    Raises:
        OverflowError: ``|value|`` needs more than ``width`` digits.
    """
    digits = np.frombuffer(abs(value).to_bytes(2 * width, "little"), dtype="<u2").astype(np.float64)
    return -digits if value < 0 else digits


def _from_limbs(sums: np.ndarray) -> int:
    """``sum_k sums[k] 2^(16 k)`` exactly, for integer-valued float64 ``|sums[k]| < 2^53``: each sum's 64-bit two's
    complement split into four 16-bit words, the words of one position summed as one integer, less ``2^64`` at each
    negative sum's place."""
    values = sums.astype("<i8")
    words = values.view("<u2").reshape(-1, 4)
    total = sum(int.from_bytes(words[:, j].tobytes(), "little") << (_LIMB_BITS * j) for j in range(4))
    return total - (int.from_bytes((values < 0).astype("<u2").tobytes(), "little") << 64)
