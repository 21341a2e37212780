"""Strategies for releasing running totals over a series of T steps: which noisy measurements are taken of the
per-step increments, how running totals are decoded from them, and what one privacy unit's contributions can change.

A *strategy* is a linear mechanism in factorized form (the matrix mechanism; Li, Miklau, Hay, McGregor, Rastogi,
VLDB Journal 2015): the increments ``x`` (one per step, one public key) are measured as ``y = C x + z`` with ``z``
i.i.d. noise, and the running totals are published as ``B y``, where ``B C = A`` and ``A`` is the T x T
lower-triangular matrix of ones (prefix sums). Then ``B y = A x + B z``: the published totals are exact totals plus
correlated noise, and only ``C x`` is ever noised, so the privacy loss is that of one Gaussian measurement of ``C x``,
whose L2 sensitivity over the declared contribution pattern this module computes exactly.

Strategies:
- :class:`SummedIncrements`: ``C = I``, ``B = A`` (each step's increment noised on its own, totals summed).
- :class:`BinaryTree`: ``C`` the dyadic intervals of the steps (Dwork, Naor, Pitassi, Rothblum, STOC 2010; Chan,
  Shi, Song, TISSEC 2011), decoded either by the dyadic decomposition of each prefix or, with ``honaker=True``, by
  the minimum-variance unbiased combination of the intervals completed by then (Honaker, "Efficient Use of
  Differentially Private Binary Trees", TPDP 2015).
- :class:`SquareRootToeplitz`: ``B = C = A^(1/2)``, the lower-triangular Toeplitz matrix of the coefficients
  ``binom(2s, s) / 4^s`` (Fichtenberger, Henzinger, Upadhyay, ICML 2023; Henzinger, Upadhyay, Upadhyay, SODA 2023),
  its coefficients rounded down to the grid ``2^-GRID_BITS`` so that ``C x`` lies on a lattice for integer ``x`` and
  exact discrete noise can measure it (ADR 32); ``B = A C^-1`` is then the exact decoder of the rounded ``C``.

Contribution pattern (:class:`Participation`): a privacy unit contributes to at most ``max_steps`` steps (``k``),
any two of them at least ``min_separation`` steps apart (``b``; 1 allows consecutive steps), each contribution of
L2 norm at most 1 in the per-step sensitivity's units (the ``(k, b)``-participation of Choquette-Choo, McMahan,
Rush, Thakurta, "Multi-Epoch Matrix Factorization Mechanisms for Private Machine Learning", ICML 2023).

Everything here is a function of public parameters (T, k, b, the strategy): nothing reads data. Variances are for
noise of variance 1 on each measurement; :mod:`.plan` scales them by the noise the budget sets.
"""

from __future__ import annotations

import abc
import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np

#: The square-root factorization's coefficients are rounded down to multiples of 2^-GRID_BITS (ADR 32): C x then
#: lies on the lattice 2^-GRID_BITS Z for integer increments, and the rounding changes a coefficient by less than
#: 6e-8 (the smallest used, at T = 10^4, is 0.0056).
GRID_BITS = 24
#: The longest series a plan accepts (steps). A daily series of 27 years; the decoders are T x T.
MAX_STEPS = 10_000


@dataclass(frozen=True)
class Participation:
    """How often one privacy unit may contribute over a series (public, declared in the spec).

    Attributes:
        max_steps: ``k``, the most steps a unit contributes to (1 <= k <= T).
        min_separation: ``b``, the fewest steps between two of a unit's contributions (1: any steps, even
            consecutive ones).

    Raises:
        ValueError: ``max_steps`` or ``min_separation`` below 1.
    """

    max_steps: int = 1
    min_separation: int = 1

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.min_separation < 1:
            raise ValueError(f"max_steps and min_separation must be >= 1, got {self.max_steps}, "
                             f"{self.min_separation}")

    def steps_in(self, horizon: int) -> int:
        """The most steps a unit can contribute to in a series of ``horizon`` steps."""
        return min(self.max_steps, (horizon - 1) // self.min_separation + 1)

    def earliest(self, horizon: int) -> list[int]:
        """The earliest pattern a unit may follow: steps ``0, b, 2b, ...`` (0-based), as many as fit."""
        return [i * self.min_separation for i in range(self.steps_in(horizon))]


def _check_horizon(horizon: int) -> None:
    if not 1 <= horizon <= MAX_STEPS:
        raise ValueError(f"a series has 1 to {MAX_STEPS} steps, got {horizon}")


class Strategy(abc.ABC):
    """A factorization ``A = B C`` of the prefix-sum matrix of ``horizon`` steps (see the module docstring)."""

    #: the name the spec's ``mechanism`` field and the plan use
    name: str

    def __init__(self, horizon: int) -> None:
        _check_horizon(horizon)
        self.horizon = horizon

    @abc.abstractmethod
    def sensitivity_squared(self, participation: Participation) -> Fraction:
        """The squared L2 sensitivity of ``C x`` when one unit's contributions (each of norm at most 1) follow
        ``participation``: exact where the docstring of the subclass says so, else an upper bound (never below the
        true value)."""

    @abc.abstractmethod
    def redraw_sensitivity_squared(self, participation: Participation) -> Fraction:
        """The squared L2 sensitivity of the measurements one step completes, at the worst step, under
        ``participation``: what measuring a step a second time (fresh noise, after an attempt that may have
        published its first measurement died) costs, in the units of :meth:`sensitivity_squared` (an upper bound,
        and never above it: those measurements are some of ``C``'s rows). ADR 33."""

    @abc.abstractmethod
    def step_variances(self) -> np.ndarray:
        """Shape (horizon,): the variance of the noise on each published running total, for measurement noise of
        variance 1 (float64, from public parameters)."""

    def worst_step_variance(self) -> float:
        return float(self.step_variances().max())

    def mean_step_variance(self) -> float:
        return float(self.step_variances().mean())


class SummedIncrements(Strategy):
    """Each step's increment noised on its own; a running total sums the noised increments (``C = I``).
    Sensitivity squared: the number of steps a unit contributes to (exact)."""

    name = "summed_increments"

    def sensitivity_squared(self, participation: Participation) -> Fraction:
        return Fraction(participation.steps_in(self.horizon))

    def redraw_sensitivity_squared(self, participation: Participation) -> Fraction:
        return Fraction(1)  # a step measures its own increment, to which a unit contributes once at most

    def step_variances(self) -> np.ndarray:
        return np.arange(1, self.horizon + 1, dtype=np.float64)


class BinaryTree(Strategy):
    """The binary tree: one measurement per dyadic interval ``[j 2^l, (j+1) 2^l)`` inside the series, for every level
    ``l`` with ``2^l <= horizon``.

    Decoding: without ``honaker``, the total after ``t`` steps sums the intervals of the binary digits of ``t``
    (``popcount(t)`` measurements). With ``honaker``, each interval completed by step ``t`` is first combined with the
    sum of its two halves' estimates by inverse-variance weights, bottom up; this is the minimum-variance unbiased
    estimate from the intervals completed by then, since the intervals of a prefix's decomposition head disjoint
    subtrees (Honaker 2015, here online: only completed intervals are used).

    Sensitivity squared: the sum over levels of the largest sum of squared counts a unit's steps can put in that
    level's ``horizon >> level`` intervals, each holding at most ``ceil(2^level / b)`` of them (fill intervals to
    that cap, then one more with the rest). Exact for ``min_separation = 1`` (the steps ``0 .. k-1`` reach every
    level's largest at once); an upper bound otherwise.
    """

    def __init__(self, horizon: int, *, honaker: bool = False) -> None:
        super().__init__(horizon)
        self.honaker = honaker
        self.name = "tree_honaker" if honaker else "binary_tree"

    @property
    def levels(self) -> int:
        """Number of levels: interval lengths ``1, 2, 4, ..., 2^(levels-1) <= horizon``."""
        return self.horizon.bit_length()

    def sensitivity_squared(self, participation: Participation) -> Fraction:
        k = participation.steps_in(self.horizon)
        total = 0
        for level in range(self.levels):
            # the most of a unit's steps one interval of this level can hold, given their separation
            cap = min(k, -(-(1 << level) // participation.min_separation))
            intervals = self.horizon >> level  # complete intervals of this level: steps past them count nowhere
            full = min(k // cap, intervals)
            rest = min(k - full * cap, cap) if full < intervals else 0
            total += full * cap * cap + rest * rest
        return Fraction(total)

    def redraw_sensitivity_squared(self, participation: Participation) -> Fraction:
        # the step 2^(levels-1) - 1 completes one interval of every level; a unit's steps t, t - b, ... put
        # min(k, ceil(2^l / b)) of them in the level-l interval ending at t, in every level at once
        k = participation.steps_in(self.horizon)
        return Fraction(sum(min(k, -(-(1 << level) // participation.min_separation)) ** 2
                            for level in range(self.levels)))

    def level_variances(self) -> np.ndarray:
        """Shape (levels,): the variance of an interval's estimate at each level (1 for a bare measurement; with
        ``honaker``, the inverse-variance combination with its halves' estimates)."""
        variances = np.ones(self.levels)
        if self.honaker:
            for level in range(1, self.levels):
                halves = 2 * variances[level - 1]
                variances[level] = halves / (1 + halves)
        return variances

    def step_variances(self) -> np.ndarray:
        level_variances = self.level_variances()
        steps = np.arange(1, self.horizon + 1)
        variances = np.zeros(self.horizon)
        for level in range(self.levels):
            variances += ((steps >> level) & 1) * level_variances[level]
        return variances


@functools.lru_cache(maxsize=8)
def _square_root_numerators(horizon: int) -> tuple[int, ...]:
    """``floor(binom(2s, s) / 4^s * 2^GRID_BITS)`` for ``s < horizon``, computed once per horizon per process."""
    scale = 1 << GRID_BITS
    numerators = []
    exact = Fraction(1)
    for s in range(horizon):
        if s:
            exact *= Fraction(2 * s - 1, 2 * s)
        numerators.append(math.floor(exact * scale))
    return tuple(numerators)


class SquareRootToeplitz(Strategy):
    """``C`` the lower-triangular Toeplitz matrix of ``c_s = binom(2s, s) / 4^s`` rounded down to ``2^-GRID_BITS``,
    ``B = A C^-1`` (for the unrounded coefficients ``B = C``: ``C^2 = A``). The worst step's error is within
    ``(ln T + gamma + 4 ln 2) / pi`` of optimal factorizations' (Fichtenberger et al. 2023).

    Sensitivity squared, exact: the coefficients are positive and non-increasing, so every entry of ``C^T C`` is
    non-negative and does not grow when its two columns move earlier or closer together; mapping a unit's ``m``-th
    step to ``(m-1) b`` does both, so the earliest pattern (:meth:`Participation.earliest`) attains the maximum
    (ADR 32 gives the proof).
    """

    name = "sqrt_factorization"

    @property
    def numerators(self) -> list[int]:
        """The rounded coefficients times ``2^GRID_BITS`` (integers; the first is ``2^GRID_BITS``)."""
        return list(_square_root_numerators(self.horizon))

    @cached_property
    def coefficients(self) -> np.ndarray:
        """Shape (horizon,): the rounded coefficients ``c_s`` as float64 (exact: dyadic with 24 bits)."""
        return np.array(self.numerators, dtype=np.float64) / float(1 << GRID_BITS)

    @cached_property
    def decoder_coefficients(self) -> np.ndarray:
        """Shape (horizon,): the coefficients of the Toeplitz decoder ``B = A C^-1`` (float64): the prefix sums of
        the power series inverse of ``c``."""
        c = self.coefficients
        inverse = np.zeros(self.horizon)
        inverse[0] = 1.0
        for n in range(1, self.horizon):
            inverse[n] = -np.dot(c[1:n + 1], inverse[n - 1::-1][:n])
        return np.cumsum(inverse)

    def sensitivity_squared(self, participation: Participation) -> Fraction:
        steps = participation.earliest(self.horizon)
        numerators = self.numerators
        column_sum = [0] * self.horizon  # (C 1_S)_t, times 2^GRID_BITS
        for start in steps:
            for t in range(start, self.horizon):
                column_sum[t] += numerators[t - start]
        return Fraction(sum(value * value for value in column_sum), 1 << (2 * GRID_BITS))

    def redraw_sensitivity_squared(self, participation: Participation) -> Fraction:
        # step t measures (C x)_t = sum_s c_(t-s) x_s: with c non-increasing a unit's steps t, t - b, t - 2b, ...
        # give the most, sum_i c_(i b), which the earliest pattern's column sum reaches at its last step
        numerators = self.numerators
        largest = sum(numerators[start] for start in participation.earliest(self.horizon))
        return Fraction(largest * largest, 1 << (2 * GRID_BITS))

    def step_variances(self) -> np.ndarray:
        return np.cumsum(self.decoder_coefficients ** 2)


def strategies(horizon: int) -> list[Strategy]:
    """The candidates ``mechanism: auto`` chooses among, in a fixed order (ties go to the earlier)."""
    return [SummedIncrements(horizon), BinaryTree(horizon), BinaryTree(horizon, honaker=True),
            SquareRootToeplitz(horizon)]


def prefix_sum_lower_bound(horizon: int) -> float:
    """The RMSE of the running totals that no factorization reaches, for measurement noise calibrated to sensitivity
    1 at variance 1 (one contribution per unit): ``||A||_* / T``, the trace norm of the prefix-sum matrix over the
    number of steps: ``||A||_* = ||B C||_* <= ||B||_F ||C||_F <= ||B||_F sqrt(T) ||C||_(1->2)``, and the RMSE is
    ``||B||_F ||C||_(1->2) / sqrt(T)`` (Li et al. 2015; Henzinger et al. 2023). The singular
    values of ``A`` are ``1 / (2 sin((2j - 1) pi / (4T + 2)))``, j = 1..T."""
    _check_horizon(horizon)
    j = np.arange(1, horizon + 1)
    return float((1.0 / (2.0 * np.sin((2 * j - 1) * np.pi / (4 * horizon + 2)))).sum() / horizon)
