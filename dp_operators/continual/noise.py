"""A series' noise: fresh exact draws at each step, and the exact noise on each published running total.

A series measures ``y = C x + z`` once over its T steps (:mod:`.strategies`), one step at a time: at step ``t`` the
measurements that step completes get fresh noise ``z`` (one per step for the Toeplitz strategies; the intervals ending
at ``t`` for the tree), drawn from the exact discrete Gaussian on the series' lattice with the OS CSPRNG (DESIGN.md
2.2, 2.5). The running total published at step ``t`` is ``(A x)_t + (B z)_t``, which equals ``(B y)_t`` exactly: this
module computes ``(B z)_t`` from the noise drawn so far, in rationals, so the published total is a function of the
measurements alone (post-processing; ADR 32). The draws of earlier steps are the series' secret state: whoever holds
them and a published total learns the true total.

Units: noise is drawn in *lattice units* (integers); :attr:`SeriesNoise.lattice` converts them to value units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from statistics import NormalDist

import numpy as np

from dp_operators.continual.plan import Candidate
from dp_operators.continual.strategies import (
    GRID_BITS,
    BinaryTree,
    SquareRootToeplitz,
    Strategy,
    SummedIncrements,
)
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array


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
        """The half-width of the running total's interval at step ``step`` (0-based), value units: the Gaussian
        quantile at ``confidence`` times the planned standard deviation ``sqrt(noise_variance * v_step)`` (the
        discrete Gaussian's variance is at most its parameter and its tails no wider than the Gaussian's: CKS 2020,
        section 2), from public parameters only.

        Raises:
            ValueError: a step outside the series, or a confidence outside (0, 1).
        """
        if not 0 <= step < self.strategy.horizon or not 0 < confidence < 1:
            raise ValueError(f"step must be in [0, {self.strategy.horizon}) and confidence in (0, 1), got {step}, "
                             f"{confidence}")
        variance = float(self.candidate.noise_variance) * float(self.strategy.step_variances()[step])
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
        for step, draws in enumerate(history):
            if len(draws) != len(self.measurements_at(step)):
                raise ValueError(f"step {step} holds {len(draws)} draws, not {len(self.measurements_at(step))}")
        if isinstance(self.strategy, SummedIncrements):
            total = Fraction(sum(draws[0] for draws in history))
        elif isinstance(self.strategy, SquareRootToeplitz):
            coefficients = self.decoder
            total = sum((coefficients[t - s] * draws[0] for s, draws in enumerate(history)), Fraction(0))
        else:
            total = self._tree_total(history)
        return total * self.lattice

    @cached_property
    def decoder(self) -> list[Fraction]:
        """The square root's exact decoder coefficients ``b_n`` (``B = A C^-1``, Toeplitz): prefix sums of the power
        series inverse of the rounded ``c``."""
        numerators = self.strategy.numerators  # type: ignore[attr-defined]
        c = [Fraction(n, 1 << GRID_BITS) for n in numerators]
        inverse: list[Fraction] = [Fraction(1)]
        for n in range(1, self.strategy.horizon):
            inverse.append(-sum((c[s] * inverse[n - s] for s in range(1, n + 1)), Fraction(0)))
        prefix, running = [], Fraction(0)
        for value in inverse:
            running += value
            prefix.append(running)
        return prefix

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
            b = np.array([float(value) for value in self.decoder])
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
