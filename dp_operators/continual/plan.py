"""Planning a series: the noise each strategy needs for the series' budget, its error on the running totals, and
the choice of ``mechanism: auto``, all from public parameters (horizon, contribution pattern, budget, per-step
sensitivity).

Under zCDP, one Gaussian measurement of ``C x`` with noise variance ``sigma^2`` per coordinate is
``rho = Delta_C^2 / (2 sigma^2)``-zCDP, where ``Delta_C`` is the L2 sensitivity of ``C x`` (Bun & Steinke, TCC 2016,
Prop. 1.6; the discrete Gaussian on a lattice holding ``C x`` satisfies the same bound, Canonne, Kamath, Steinke,
NeurIPS 2020, coordinate by coordinate). The series spends its whole ``rho`` on that one measurement, so
``sigma^2 = Delta_C^2 / (2 rho)``, and the running total after step ``t`` has noise variance
``sigma^2 * v_t`` with ``v_t`` the strategy's step variance (:meth:`Strategy.step_variances`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dp_operators.continual.strategies import (
    BinaryTree,
    Participation,
    SquareRootToeplitz,
    Strategy,
    SummedIncrements,
    strategies,
)

#: ``mechanism`` values a series spec may name; ``auto`` picks the lowest planned worst-step error.
MECHANISMS = ("auto", "summed_increments", "binary_tree", "tree_honaker", "sqrt_factorization")


@dataclass(frozen=True)
class Candidate:
    """One strategy's plan for a series.

    Attributes:
        mechanism: the strategy's name (:data:`MECHANISMS`).
        sensitivity_squared: ``Delta_C^2`` for the series' pattern, in units of the per-step sensitivity squared.
        noise_variance: ``sigma^2`` of each measurement, value units squared (exact).
        worst_std: the largest standard deviation of a published running total over the series, value units.
        rmse: the root mean square over the steps of those standard deviations, value units.
    """

    mechanism: str
    sensitivity_squared: Fraction
    noise_variance: Fraction
    worst_std: float
    rmse: float


@dataclass(frozen=True)
class SeriesPlan:
    """What a series will release: every candidate's planned error and the chosen mechanism.

    Attributes:
        horizon: T, the number of steps.
        participation: the declared contribution pattern.
        rho: the series' whole budget (zCDP).
        step_sensitivity: the L2 sensitivity of one step's increments (value units): a unit's contribution to the
            increments of one step, over every key it may touch.
        candidates: every candidate considered, in :func:`strategies` order (one if a mechanism was named).
        chosen: the candidate released.
    """

    horizon: int
    participation: Participation
    rho: Fraction
    step_sensitivity: Fraction
    candidates: tuple[Candidate, ...]
    chosen: Candidate


def _strategy(mechanism: str, horizon: int) -> Strategy:
    if mechanism == "summed_increments":
        return SummedIncrements(horizon)
    if mechanism == "binary_tree":
        return BinaryTree(horizon)
    if mechanism == "tree_honaker":
        return BinaryTree(horizon, honaker=True)
    if mechanism == "sqrt_factorization":
        return SquareRootToeplitz(horizon)
    raise ValueError(f"unknown series mechanism {mechanism!r}; expected one of {', '.join(MECHANISMS)}")


def candidate(strategy: Strategy, participation: Participation, rho: Fraction,
              step_sensitivity: Fraction) -> Candidate:
    """``strategy``'s noise and error for a series of budget ``rho`` (see the module docstring)."""
    sensitivity_squared = strategy.sensitivity_squared(participation)
    noise_variance = sensitivity_squared * step_sensitivity * step_sensitivity / (2 * rho)
    variances = strategy.step_variances()
    return Candidate(
        mechanism=strategy.name,
        sensitivity_squared=sensitivity_squared,
        noise_variance=noise_variance,
        worst_std=math.sqrt(float(noise_variance) * float(variances.max())),
        rmse=math.sqrt(float(noise_variance) * float(variances.mean())),
    )


def plan_series(horizon: int, participation: Participation, rho: Fraction | int | str, *,
                step_sensitivity: Fraction | int | str = 1, mechanism: str = "auto") -> SeriesPlan:
    """Plan a series of ``horizon`` steps under ``participation`` with zCDP budget ``rho``.

    Args:
        horizon: T, the number of steps (1 to ``MAX_STEPS``).
        participation: the most steps a unit contributes to, and their least separation.
        rho: the series' whole budget (a positive exact number).
        step_sensitivity: the L2 sensitivity of one step's increments, value units.
        mechanism: a name of :data:`MECHANISMS`; ``auto`` takes the candidate with the lowest ``worst_std``
            (ties: the earlier in :func:`strategies`' order).

    Returns:
        The plan; its ``candidates`` list every strategy considered.

    Raises:
        ValueError: a horizon out of range, a non-positive budget or sensitivity, an unknown mechanism.
    """
    rho, step_sensitivity = Fraction(rho), Fraction(step_sensitivity)
    if rho <= 0 or step_sensitivity <= 0:
        raise ValueError(f"rho and step_sensitivity must be > 0, got {rho}, {step_sensitivity}")
    chosen_strategies = strategies(horizon) if mechanism == "auto" else [_strategy(mechanism, horizon)]
    candidates = tuple(candidate(s, participation, rho, step_sensitivity) for s in chosen_strategies)
    chosen = min(candidates, key=lambda c: c.worst_std)  # min keeps the first of equals
    return SeriesPlan(horizon, participation, rho, step_sensitivity, candidates, chosen)
