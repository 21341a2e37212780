"""The release plan: mechanisms, sensitivities, scales and charges, from public parameters only (no data).

Sensitivities follow DESIGN.md 2.6 (L1 = L0 * Linf, L2^2 = L0 * Linf^2); calibration follows docs/mechanisms.md and
docs/adr/0010 to 0013.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dp_operators.accounting import (
    GaussianNoise,
    PrivacyLoss,
    charge_in_account_unit,
    delta_in_account,
    exact_number,
)
from dp_operators.mechanisms import (
    discrete_gaussian_accuracy,
    discrete_gaussian_sigma2,
    discrete_gaussian_sigma2_for_approx_dp,
    discrete_gaussian_variance,
    discrete_laplace_accuracy,
    discrete_laplace_scale,
    discrete_laplace_variance,
    sample_discrete_gaussian_vector,
    sample_discrete_laplace_vector,
)
from dp_operators.mechanisms.calibration import (
    discrete_gaussian_threshold,
    discrete_laplace_threshold,
    epsilon_for_rho,
)
from dp_operators.spec import Aggregate, Budget, ReleaseSpec


@dataclass(frozen=True)
class NoiseStep:
    """One noised sub-step of a release: integers (grid units) noised with one exact mechanism.

    Attributes:
        aggregate, component: which aggregate and which part: ``count``, ``sum``, ``sum_squares``, or
            ``selection`` (the noised count of privacy units compared with ``threshold``).
        mechanism: ``discrete_laplace`` (``scale`` is t, pmf ~ exp(-|x|/t)) or ``discrete_gaussian``
            (``scale`` is sigma^2, pmf ~ exp(-x^2 / (2 sigma^2))), in grid units.
        budget: the budget this step was calibrated to (its share of the aggregate's budget).
        linf: how much one privacy unit changes one partition, in grid units; l0: in how many partitions.
        grid: the fixed-point resolution: released value = integer * grid (1 for counts, grid^2 for squares).
        partitions: number of noised values; None under partition selection (it depends on the data).
        noise_delta: the delta of the noise's own (epsilon, delta) guarantee (0 for pure DP and zCDP).
        threshold, threshold_delta: partition selection only: release iff noised count >= threshold; the delta
            that comparison costs.
    """

    aggregate: str
    component: str
    mechanism: str
    budget: Budget
    linf: int
    l0: int
    scale: Fraction
    grid: Fraction
    partitions: int | None
    noise_delta: Fraction = Fraction(0)
    threshold: int | None = None
    threshold_delta: Fraction | None = None

    @property
    def l1_sensitivity(self) -> int:
        return self.l0 * self.linf

    @property
    def l2_sensitivity_squared(self) -> int:
        return self.l0 * self.linf * self.linf

    @property
    def epsilon(self) -> Fraction | None:
        """The pure epsilon of a Laplace step (L1 / t, exact); the calibrated epsilon of an approximate Gaussian."""
        if self.mechanism == "discrete_laplace":
            return Fraction(self.l1_sensitivity) / self.scale
        return self.budget.epsilon if self.budget.form == "epsilon_delta" else None

    @property
    def rho(self) -> Fraction | None:
        """The zCDP rho of a Gaussian step: L2^2 / (2 sigma^2), exact (CKS 2020, Theorem 14)."""
        if self.mechanism == "discrete_gaussian":
            return Fraction(self.l2_sensitivity_squared) / (2 * self.scale)
        return None

    @property
    def delta(self) -> Fraction:
        """The delta this step's (epsilon, delta) guarantee spends (noise profile plus threshold), 0 if pure."""
        return self.noise_delta + (self.threshold_delta or 0)

    def privacy_loss(self, accountant: str) -> PrivacyLoss:
        """The loss to charge to an ``accountant`` account: the adapter between mechanisms and accounting.

        * Laplace: pure epsilon = L1 / t (with the threshold's delta for partition selection).
        * Gaussian calibrated to rho: rho, with its sigma^2 and L2^2 for Gaussian-DP accounts.
        * Gaussian calibrated to (epsilon, delta) by the exact profile: (epsilon, delta) on ``approx_dp``; on other
          accounts the exact rho = L2^2 / (2 sigma^2) of the same noise, a valid but looser description
          (docs/adr/0011), with delta as the conversion delta.
        """
        noise = GaussianNoise(self.scale, Fraction(self.l2_sensitivity_squared), discrete=True)
        if self.component == "selection" or self.mechanism == "discrete_laplace":
            if self.mechanism == "discrete_laplace":
                return PrivacyLoss("epsilon", self.epsilon, delta=self.delta)
            return PrivacyLoss("epsilon", self.budget.epsilon, delta=self.delta)
        if self.budget.form == "epsilon_delta" and accountant == "approx_dp":
            return PrivacyLoss("epsilon", self.budget.epsilon, delta=self.delta)
        return PrivacyLoss("rho", self.rho, delta=self.delta, gaussian=noise)

    def half_width(self, alpha: float) -> float:
        """Half-width of the (1 - alpha) interval of one value, in value units (public parameters only)."""
        if self.mechanism == "discrete_laplace":
            units = discrete_laplace_accuracy(self.scale, alpha)
        else:
            units = discrete_gaussian_accuracy(self.scale, alpha)
        return float(units * self.grid)

    @property
    def standard_deviation(self) -> float:
        """Standard deviation of the noise on one value, in value units."""
        if self.mechanism == "discrete_laplace":
            variance = discrete_laplace_variance(self.scale)
        else:
            variance = discrete_gaussian_variance(self.scale)
        return math.sqrt(variance) * float(self.grid)

    def draw(self, size: int | None = None) -> list[int]:
        """Draw ``size`` (default: ``partitions``) noise integers from the exact sampler (OS CSPRNG)."""
        size = self.partitions if size is None else size
        if self.mechanism == "discrete_laplace":
            return sample_discrete_laplace_vector(self.scale, size)
        return sample_discrete_gaussian_vector(self.scale, size)

    def describe(self) -> dict[str, Any]:
        """A JSON-safe description recorded in the ledger and published: enough to re-derive the guarantee."""
        grid = float(self.grid)
        described: dict[str, Any] = {
            "aggregate": self.aggregate,
            "component": self.component,
            "mechanism": self.mechanism,
            "calibrated_to": {
                name: float(getattr(self.budget, name))
                for name in ("epsilon", "rho", "delta")
                if getattr(self.budget, name) is not None
            },
            "l1_sensitivity": self.l1_sensitivity * grid,
            "l2_sensitivity": math.sqrt(self.l2_sensitivity_squared) * grid,
            "linf_grid_units": self.linf,
            "max_partitions_contributed": self.l0,
            "grid": grid,
            "partitions": self.partitions,
        }
        if self.mechanism == "discrete_laplace":
            described.update(scale=float(self.scale) * grid, scale_grid_units_exact=str(self.scale))
            described["epsilon"], described["epsilon_exact"] = float(self.epsilon), str(self.epsilon)
        else:
            described.update(
                sigma=math.sqrt(self.scale) * grid,
                sigma2_grid_units_exact=str(self.scale),
                rho=float(self.rho),
                rho_exact=str(self.rho),
            )
            if self.epsilon is not None:
                described["epsilon"], described["epsilon_exact"] = float(self.epsilon), str(self.epsilon)
        if self.delta:
            described["delta"], described["delta_exact"] = float(self.delta), str(self.delta)
        if self.threshold is not None:
            described["threshold"] = self.threshold
        return described


@dataclass(frozen=True)
class ReleasePlan:
    """The public plan of a release: every noised sub-step. Computed without touching data."""

    spec: ReleaseSpec
    steps: tuple[NoiseStep, ...]

    def losses(self, accountant: str) -> list[PrivacyLoss]:
        """Every step's privacy loss, as charged to an ``accountant`` account."""
        return [step.privacy_loss(accountant) for step in self.steps]

    def charge(self, accountant: str) -> Fraction:
        """The exact total charge in ``accountant``'s unit: the sum of every step's converted loss (composition).

        Raises:
            IncompatibleAccountantError: a step cannot be charged to this accountant.
        """
        return sum((charge_in_account_unit(loss, accountant) for loss in self.losses(accountant)), Fraction(0))

    def delta(self, accountant: str) -> Fraction:
        """The total delta an ``approx_dp`` account is charged (basic composition); 0 for other accountants."""
        return sum((delta_in_account(loss, accountant) for loss in self.losses(accountant)), Fraction(0))

    def step(self, aggregate: str, component: str) -> NoiseStep:
        return next(s for s in self.steps if s.aggregate == aggregate and s.component == component)

    def steps_of(self, aggregate: str) -> list[NoiseStep]:
        return [s for s in self.steps if s.aggregate == aggregate]


def _share(budget: Budget, parts: int) -> Budget:
    """An equal share of ``budget`` for one of ``parts`` components (basic / zCDP composition)."""
    if parts == 1:
        return budget
    values = {name: getattr(budget, name) / parts for name in ("epsilon", "rho", "delta") if getattr(budget, name)}
    return Budget.model_construct(**values)


def calibrate(mechanism: str, budget: Budget, *, linf: int, l0: int) -> tuple[str, Fraction]:
    """Choose a mechanism and its smallest valid scale for ``budget`` on integers changed by at most ``linf`` in
    each of at most ``l0`` coordinates. Returns ``(mechanism, scale)``: t for ``discrete_laplace``, sigma^2 for
    ``discrete_gaussian``, in grid units.

    * ``discrete_laplace``: t = L1 / epsilon (an ``{rho}`` budget under ``auto`` uses epsilon = sqrt(2 rho),
      rounded down, since epsilon-DP implies (epsilon^2/2)-zCDP);
    * ``discrete_gaussian``: sigma^2 = L2^2 / (2 rho), or the exact (epsilon, delta) calibration of
      :func:`~dp_operators.mechanisms.discrete_gaussian_sigma2_for_approx_dp`;
    * ``auto``: both where the budget allows, keeping the one with the smaller noise variance.
    """
    candidates: list[tuple[str, Fraction]] = []
    if mechanism in ("discrete_laplace", "auto"):
        epsilon = budget.epsilon if budget.form != "rho" else epsilon_for_rho(budget.rho)
        candidates.append(("discrete_laplace", discrete_laplace_scale(l0 * linf, epsilon)))
    if mechanism in ("discrete_gaussian", "auto") and budget.form != "epsilon":
        if budget.form == "rho":
            sigma2 = discrete_gaussian_sigma2(l0 * linf * linf, budget.rho)
        else:
            sigma2 = discrete_gaussian_sigma2_for_approx_dp(budget.epsilon, budget.delta, linf=linf, l0=l0)
        candidates.append(("discrete_gaussian", sigma2))

    def variance(candidate: tuple[str, Fraction]) -> float:
        name, scale = candidate
        return discrete_laplace_variance(scale) if name == "discrete_laplace" else discrete_gaussian_variance(scale)

    return min(candidates, key=variance)


def _selection_step(aggregate: Aggregate, l0: int) -> NoiseStep:
    """The partition-selection step: noised counts of privacy units (one per unit and partition, so linf = 1)."""
    selection = aggregate.partition_selection
    budget = selection.budget  # type: ignore[union-attr]
    noise_delta = Fraction(0)
    if selection.mechanism == "discrete_laplace":  # type: ignore[union-attr]
        scale = discrete_laplace_scale(l0, budget.epsilon)
        threshold, threshold_delta = discrete_laplace_threshold(scale, budget.delta, l0=l0)
    else:  # half the delta for the noise's profile, half for the threshold
        noise_delta = budget.delta / 2
        scale = discrete_gaussian_sigma2_for_approx_dp(budget.epsilon, noise_delta, linf=1, l0=l0)
        threshold, threshold_delta = discrete_gaussian_threshold(scale, budget.delta - noise_delta, l0=l0)
    return NoiseStep(
        aggregate=aggregate.name,
        component="selection",
        mechanism=selection.mechanism,  # type: ignore[union-attr]
        budget=budget,
        linf=1,
        l0=l0,
        scale=scale,
        grid=Fraction(1),
        partitions=None,
        noise_delta=noise_delta,
        threshold=threshold,
        threshold_delta=threshold_delta,
    )


def component_sensitivity(aggregate: Aggregate, component: str, per_partition: int) -> tuple[int, Fraction]:
    """``(linf, grid)`` of one component: the most one privacy unit changes one partition, in grid units.

    Rounding a partition's value to the grid with ``floor(x / grid + 1/2)`` maps values ``d`` apart to integers at
    most ``ceil(d / grid)`` apart, so the rounding is inside the sensitivity (DESIGN.md 2.5). Means and variances
    are computed on values centred at the middle of the bounds, which halves their range: a unit moves a centred
    sum by at most ``(upper - lower)/2`` and a centred sum of squares by at most ``((upper - lower)/2)^2``.
    """
    if component in ("count", "selection"):
        return per_partition, Fraction(1)
    lower, upper = (exact_number(b, name="bounds") for b in aggregate.bounds)  # type: ignore[union-attr]
    grid = aggregate.grid
    if component == "sum" and aggregate.kind == "sum":
        return math.ceil(per_partition * max(abs(lower), abs(upper)) / grid), grid
    half_range = (upper - lower) / 2
    if component == "sum":
        return math.ceil(per_partition * half_range / grid), grid
    return math.ceil(per_partition * half_range**2 / grid**2), grid**2


def plan_release(spec: ReleaseSpec) -> ReleasePlan:
    """Compute the mechanisms, sensitivities, scales and losses of ``spec`` from public parameters only.

    Each aggregate's budget is split equally over its components (a mean: sum and count; a variance: sum, count
    and sum of squares), every one charged (DESIGN.md 2.7). Partition selection adds its own step and budget.
    Sensitivities follow DESIGN.md 2.6 (L1 = L0 * Linf, L2^2 = L0 * Linf^2) with Linf from
    :func:`component_sensitivity`.
    """
    steps: list[NoiseStep] = []
    for aggregate in spec.aggregates:
        bounds = spec.contribution_for(aggregate)
        l0 = bounds.max_partitions_contributed
        per_partition = bounds.max_contributions_per_partition
        if aggregate.partition_selection is not None:
            steps.append(_selection_step(aggregate, l0))
        share = _share(aggregate.budget, len(aggregate.components))
        for component in aggregate.components:
            linf, grid = component_sensitivity(aggregate, component, per_partition)
            mechanism, scale = calibrate(aggregate.mechanism, share, linf=linf, l0=l0)
            gaussian_profile = mechanism == "discrete_gaussian" and share.form == "epsilon_delta"
            steps.append(
                NoiseStep(
                    aggregate=aggregate.name,
                    component=component,
                    mechanism=mechanism,
                    budget=share,
                    linf=linf,
                    l0=l0,
                    scale=scale,
                    grid=grid,
                    partitions=aggregate.partition_count,
                    noise_delta=share.delta if gaussian_profile else Fraction(0),
                )
            )
    return ReleasePlan(spec=spec, steps=tuple(steps))
