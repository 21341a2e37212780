"""Planning a series: the noise each strategy needs for the series' budget, its error on the running totals, and
the choice of ``mechanism: auto``, all from public parameters (horizon, contribution pattern, budget, per-step
sensitivity).

Under zCDP, one Gaussian measurement of ``C x`` with noise variance ``sigma^2`` per coordinate is
``rho = Delta_C^2 / (2 sigma^2)``-zCDP, where ``Delta_C`` is the L2 sensitivity of ``C x`` (Bun & Steinke, TCC 2016,
Prop. 1.6; the discrete Gaussian on a lattice holding ``C x`` satisfies the same bound, Canonne, Kamath, Steinke,
NeurIPS 2020, coordinate by coordinate). The series spends its whole ``rho`` on that one measurement, so
``sigma^2 = Delta_C^2 Delta^2 / (2 rho)`` (``Delta`` the per-step sensitivity), and the running total after step
``t`` has noise variance
``sigma^2 * v_t`` with ``v_t`` the strategy's step variance (:meth:`Strategy.step_variances`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import TYPE_CHECKING

from dp_operators.continual.strategies import (
    BinaryTree,
    Participation,
    SquareRootToeplitz,
    Strategy,
    SummedIncrements,
    strategies,
)

if TYPE_CHECKING:
    from dp_operators.spec.models import Aggregate, ReleaseSpec

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
        step_sensitivity_squared: the squared L2 sensitivity of one step's increments (value units squared): a
            unit's contribution to the increments of one step, over every key it may touch.
        candidates: every candidate considered, in :func:`strategies` order (one if a mechanism was named).
        chosen: the candidate released.
    """

    horizon: int
    participation: Participation
    rho: Fraction
    step_sensitivity_squared: Fraction
    candidates: tuple[Candidate, ...]
    chosen: Candidate


def strategy_of(mechanism: str, horizon: int) -> Strategy:
    """The strategy a series mechanism names (not ``auto``), for ``horizon`` steps.

    Raises:
        ValueError: an unknown name.
    """
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
              step_sensitivity_squared: Fraction) -> Candidate:
    """``strategy``'s noise and error for a series of budget ``rho`` (see the module docstring)."""
    sensitivity_squared = strategy.sensitivity_squared(participation)
    noise_variance = sensitivity_squared * step_sensitivity_squared / (2 * rho)
    variances = strategy.step_variances()
    return Candidate(
        mechanism=strategy.name,
        sensitivity_squared=sensitivity_squared,
        noise_variance=noise_variance,
        worst_std=math.sqrt(float(noise_variance) * float(variances.max())),
        rmse=math.sqrt(float(noise_variance) * float(variances.mean())),
    )


def plan_series(horizon: int, participation: Participation, rho: Fraction | int | str, *,
                step_sensitivity_squared: Fraction | int | str = 1, mechanism: str = "auto") -> SeriesPlan:
    """Plan a series of ``horizon`` steps under ``participation`` with zCDP budget ``rho``.

    Args:
        horizon: T, the number of steps (1 to ``MAX_STEPS``).
        participation: the most steps a unit contributes to, and their least separation.
        rho: the series' whole budget (a positive exact number).
        step_sensitivity_squared: the squared L2 sensitivity of one step's increments, value units squared.
        mechanism: a name of :data:`MECHANISMS`; ``auto`` takes the candidate with the lowest ``worst_std``
            (ties: the earlier in :func:`strategies`' order).

    Returns:
        The plan; its ``candidates`` list every strategy considered.

    Raises:
        ValueError: a horizon out of range, a non-positive budget or sensitivity, an unknown mechanism.
    """
    rho, squared = Fraction(rho), Fraction(step_sensitivity_squared)
    if rho <= 0 or squared <= 0:
        raise ValueError(f"rho and step_sensitivity_squared must be > 0, got {rho}, {squared}")
    chosen_strategies = strategies(horizon) if mechanism == "auto" else [strategy_of(mechanism, horizon)]
    candidates = tuple(candidate(s, participation, rho, squared) for s in chosen_strategies)
    chosen = min(candidates, key=lambda c: c.worst_std)  # min keeps the first of equals
    return SeriesPlan(horizon, participation, rho, squared, candidates, chosen)


@dataclass(frozen=True)
class AggregateSeriesPlan:
    """One aggregate of a series spec: its plan, and the half-width of a running total's interval at the spec's
    confidence for each candidate (:meth:`SeriesNoise.half_width <dp_operators.continual.noise.SeriesNoise.half_width>`).

    Attributes:
        aggregate: the aggregate's name.
        plan: the series plan of its budget (``budget.rho``) and per-step sensitivity.
        worst_half_width: candidate name -> the half-width published at the widest step, value units.
        mean_half_width: candidate name -> the Gaussian quantile times the root mean square std over the steps
            (a summary: on the integer lattice the published half-widths are lattice points or bounds).
    """

    aggregate: str
    plan: SeriesPlan
    worst_half_width: dict[str, float]
    mean_half_width: dict[str, float]


def step_sensitivity_squared(spec: ReleaseSpec, aggregate: Aggregate) -> Fraction:
    """The squared L2 sensitivity of one step's increments of ``aggregate``, value units squared: L0 keys, each
    moved by at most ``Linf`` grid units (the fixed-point rounding included, as for every release; ADR 10):
    ``L0 * (Linf * grid)^2``, with L0 capped by the number of public keys."""
    contribution = spec.contribution_for(aggregate)
    component = "count" if aggregate.kind == "count" else "sum"
    linf = aggregate.linf_grid_units(contribution.max_contributions_per_partition)[component]
    partitions = min(contribution.max_partitions_contributed, aggregate.partition_count or 1)
    grid = Fraction(1) if aggregate.kind == "count" else Fraction(aggregate.grid)
    return partitions * (linf * grid) ** 2


def plan_spec_series(spec: ReleaseSpec) -> list[AggregateSeriesPlan]:
    """The series plan of each aggregate of a spec with a ``series`` block (public parameters only).

    Raises:
        ValueError: the spec declares no series.
    """
    if spec.series is None:
        raise ValueError(f"release {spec.release!r} declares no series")
    series = spec.series
    participation = Participation(series.participation.max_steps, series.participation.min_separation)
    quantile = NormalDist().inv_cdf((1 + spec.confidence) / 2)
    plans = []
    for aggregate in spec.aggregates:
        plan = plan_series(series.horizon, participation, aggregate.budget.rho,
                           step_sensitivity_squared=step_sensitivity_squared(spec, aggregate),
                           mechanism=series.mechanism)
        grid = Fraction(1) if aggregate.kind == "count" else Fraction(aggregate.grid)
        plans.append(AggregateSeriesPlan(
            aggregate=aggregate.name, plan=plan,
            worst_half_width={c.mechanism: _worst_half_width(c, series.horizon, grid, spec.confidence)
                              for c in plan.candidates},
            mean_half_width={c.mechanism: quantile * c.rmse for c in plan.candidates},
        ))
    return plans


def _worst_half_width(candidate: Candidate, horizon: int, grid: Fraction, confidence: float) -> float:
    """The half-width published at the candidate's widest step (:meth:`SeriesNoise.half_width
    <dp_operators.continual.noise.SeriesNoise.half_width>`: the exact lattice law where the noise lives on the
    integers)."""
    from dp_operators.continual.noise import SeriesNoise  # it imports this module

    strategy = strategy_of(candidate.mechanism, horizon)
    worst = int(strategy.step_variances().argmax())
    return SeriesNoise(strategy, candidate, grid).half_width(worst, confidence)
