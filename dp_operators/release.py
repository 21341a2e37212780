"""The release engine: spec + upstream aggregates + ledger -> noised release. No Airflow import.

Order of one release (DESIGN.md section 2, invariant 1):

1. replay: if the release key already has a committed output, return it (nothing charged, nothing drawn);
2. plan from public parameters only (spec, account): mechanisms, scales, charge;
3. validate the *structure* of the upstream aggregates (missing aggregate, wrong shape, wrong type) — errors here
   spend nothing. Data *values* never raise: NaN/inf follow the spec's ``non_finite`` policy, negative counts
   are clamped to 0, keys outside the public domain are dropped (counted in a warning, never published);
4. reserve the charge in the ledger (atomic check-and-charge);
5. draw noise from the exact samplers (OS CSPRNG);
6. check the output is plain, finite JSON and commit it to the ledger under the release key;
7. return it for publication.

Neighbouring relation: add or remove one privacy unit, which contributes to at most ``max_partitions_contributed``
partitions of each aggregate, at most ``max_contributions_per_partition`` times each, every value clipped to the
declared ``bounds`` upstream.

Mechanisms, calibration, grids and special values are documented for users in ``docs/mechanisms.md``; the
decisions behind them in ``docs/adr/0010`` to ``0014``.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import product
from typing import Any

from dp_operators import __version__
from dp_operators.accounting import (
    GaussianNoise,
    PrivacyLoss,
    charge_in_account_unit,
    delta_in_account,
    exact_number,
)
from dp_operators.ledger import Ledger, ReleaseKey
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
from dp_operators.mechanisms.privacy_profile import discrete_gaussian_delta
from dp_operators.spec import Aggregate, Budget, ReleaseSpec

log = logging.getLogger(__name__)

#: Data values are saturated at +-SATURATION grid units (about 4.6e18): they never overflow and never wrap.
SATURATION = 2**62


class ReleaseInputError(ValueError):
    """The upstream aggregates do not have the shape the spec declares. Raised before any budget is reserved."""


class ReleaseConfigError(ValueError):
    """The spec and the budget account disagree (privacy unit, accountant). Raised before anything is reserved."""


# -- the plan -----------------------------------------------------------------------------------------------------
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


# -- upstream values ---------------------------------------------------------------------------------------------
@dataclass
class PreparedInputs:
    """True aggregates in grid units, per aggregate and component, in release order. Never leaves the engine.

    ``keys[name]`` is the list of partitions (key tuples) the vectors are aligned with: the public key domain, or
    under partition selection the keys found in the data (sorted), whose ``selection`` vector holds their counts
    of privacy units.
    """

    values: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    keys: dict[str, list[tuple]] = field(default_factory=dict)
    dropped_keys: dict[str, int] = field(default_factory=dict)
    special_values: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:  # raw values must not reach logs through a repr
        return f"PreparedInputs(<{len(self.values)} vectors withheld>)"


def key_domain(aggregate: Aggregate) -> list[tuple]:
    """The public partitions of ``aggregate`` in release order: the product of the key lists (``[()]`` if not
    grouped)."""
    return list(product(*(aggregate.keys[column] for column in aggregate.group_by)))  # type: ignore[index]


class _Drop(Exception):
    """A data value whose declared policy is ``drop``: the row is ignored."""


def _read_value(value: Any, aggregate: Aggregate, where: str, counter: list[int]) -> Fraction:
    """One data value as an exact number; NaN, infinities and ``None`` (SQL's NULL, e.g. ``SUM`` over no rows) are
    handled by the aggregate's ``non_finite`` policy (``None`` as NaN).

    numpy integers become Python ints first, so nothing wraps. Raises ReleaseInputError for a value that is not a
    number at all (a shape error, caught before any budget is reserved) and _Drop for a value the policy drops.
    """
    if value is None:
        number = math.nan
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ReleaseInputError(f"{where}: expected a number, got {type(value).__name__}")
    elif isinstance(value, numbers.Integral):
        return Fraction(int(value))
    else:
        number = float(value)
        if math.isfinite(number):
            return Fraction(number)
    counter[0] += 1
    policy = aggregate.non_finite
    action = policy.nan if math.isnan(number) else policy.infinity
    if action == "drop":
        raise _Drop
    if action == "clamp":
        return Fraction(SATURATION if number > 0 else -SATURATION) * _largest_grid(aggregate)
    return Fraction(policy.replace_with)


def _largest_grid(aggregate: Aggregate) -> Fraction:
    return max(aggregate.grid, aggregate.grid**2) if aggregate.kind != "count" else Fraction(1)


def _on_grid(value: Fraction, grid: Fraction, low: Fraction | None, high: Fraction | None) -> int:
    """``value`` clamped to [low, high], then rounded to the grid once, ``floor(value / grid + 1/2)``, and
    saturated at +-SATURATION grid units. Clamping into a range whose ends move by at most the per-contribution
    bound between neighbours is 1-Lipschitz, so it keeps the sensitivity (docs/mechanisms.md)."""
    if low is not None and value < low:
        value = low
    if high is not None and value > high:
        value = high
    return max(-SATURATION, min(SATURATION, math.floor(value / grid + Fraction(1, 2))))


def _row_values(aggregate: Aggregate, row: Mapping, where: str, counter: list[int], units_field: str | None) -> dict:
    """The exact values of one row's components (and its unit count under partition selection), not yet rounded:
    rows of one key are added up exactly first, so each partition is rounded once (rounding every row would let
    one privacy unit's rows each carry a rounding step, beyond the planned sensitivity)."""
    values = {c: _read_value(row[c], aggregate, f"{where}, field {c!r}", counter) for c in aggregate.components}
    if units_field is not None:
        values["selection"] = _read_value(row[units_field], aggregate, f"{where}, field {units_field!r}", counter)
    return values


def _partition_units(aggregate: Aggregate, total: Mapping[str, Fraction]) -> dict[str, int]:
    """The grid integers of one partition's exact totals.

    Counts (and unit counts) are kept >= 0. Means and variances are centred at m = (lower + upper)/2: the centred
    sum S - m N is kept in [-h N, h N] and the centred sum of squares Q - 2 m S + m^2 N in [0, h^2 N], h the half
    range — the ranges clipped data always satisfy. Out-of-range values are always clamped, never dropped:
    dropping would move a whole partition when float sums of correctly clipped data land a hair outside.
    """
    out: dict[str, int] = {}
    if "count" in total:
        out["count"] = _on_grid(total["count"], Fraction(1), Fraction(0), None)
    if "selection" in total:
        out["selection"] = _on_grid(total["selection"], Fraction(1), Fraction(0), None)
    if aggregate.kind == "sum":
        out["sum"] = _on_grid(total["sum"], aggregate.grid, None, None)
    elif aggregate.kind in ("mean", "variance"):
        lower, upper = (exact_number(b, name="bounds") for b in aggregate.bounds)  # type: ignore[union-attr]
        middle, half = (lower + upper) / 2, (upper - lower) / 2
        count = Fraction(out["count"])
        out["sum"] = _on_grid(total["sum"] - middle * count, aggregate.grid, -half * count, half * count)
        if aggregate.kind == "variance":
            centred_squares = total["sum_squares"] - 2 * middle * total["sum"] + middle * middle * count
            out["sum_squares"] = _on_grid(centred_squares, aggregate.grid**2, Fraction(0), half * half * count)
    return out


def _selection_units_field(spec: ReleaseSpec, aggregate: Aggregate) -> str | None:
    """The row field holding a partition's number of distinct privacy units, under partition selection: ``count``
    for a count with one contribution per partition (the same number), else ``units``."""
    if aggregate.public_keys:
        return None
    if aggregate.kind == "count" and spec.contribution_for(aggregate).max_contributions_per_partition == 1:
        return "count"
    return "units"


def _private_key(row: Mapping, aggregate: Aggregate, where: str) -> tuple:
    """A non-public key: str, int or ``None`` (SQL's NULL group is a group like any other, never an error)."""
    key = tuple(row[c] for c in aggregate.group_by)
    for column, value in zip(aggregate.group_by, key):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
            raise ReleaseInputError(f"{where}: key column {column!r} must be a str or int, got {type(value).__name__}")
    return tuple(int(v) if isinstance(v, int) else v for v in key)


def prepare_inputs(spec: ReleaseSpec, aggregates: Mapping[str, Any]) -> PreparedInputs:
    """Check the shape of the upstream aggregates and read them onto each aggregate's grid.

    Shapes (JSON-friendly, as an upstream ``@task`` returns them):

    * ungrouped count or sum: a number; ungrouped mean ``{"sum", "count"}``; variance ``{"sum", "count",
      "sum_squares"}`` (of the clipped values);
    * grouped: a list of rows, each a mapping with every ``group_by`` column and the fields above (``count``,
      ``sum``, ``sum_squares`` as the kind needs). Rows repeating a key are added up. A public key with no row is
      a true 0; a row outside the public domain is dropped (counted, never published). Under partition selection
      each row also carries ``units``, its number of distinct privacy units (not needed for a count with one
      contribution per partition: the count is that number).

    Data values never raise: NaN, inf and ``None`` follow ``non_finite``; rows of one key are added up exactly and
    each partition total is rounded to the grid once, clamped into the range clipped data satisfy, and saturated
    at +-SATURATION grid units. ``non_finite`` replacement and dropping avoid crashes; they are not part of the DP
    guarantee, which assumes the upstream values are the clipped aggregates the spec declares.

    Raises:
        ReleaseInputError: a missing aggregate, a wrong shape or a non-number; the message names the aggregate,
            the row index and the field, never a value.
    """
    if not isinstance(aggregates, Mapping):
        raise ReleaseInputError(
            f"the upstream aggregates must be a mapping of aggregate name to value, got {type(aggregates).__name__}"
        )
    missing = [a.name for a in spec.aggregates if a.name not in aggregates]
    if missing:
        raise ReleaseInputError(
            f"the upstream task did not provide {missing} (it provided {sorted(map(str, aggregates))}); "
            "return a mapping with one entry per aggregate in the spec"
        )
    prepared = PreparedInputs()
    for aggregate in spec.aggregates:
        components = list(aggregate.components)
        units_field = _selection_units_field(spec, aggregate)
        counter = [0]
        raw = aggregates[aggregate.name]
        if aggregate.group_by:
            if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
                raise ReleaseInputError(
                    f"aggregate {aggregate.name!r}: expected a list of rows with columns "
                    f"{aggregate.group_by + components}, got {type(raw).__name__}"
                )
            rows = raw
        elif len(components) > 1:
            if not isinstance(raw, Mapping):
                fields = ", ".join(f"'{c}': number" for c in components)
                raise ReleaseInputError(
                    f"aggregate {aggregate.name!r}: a {aggregate.kind} expects {{{fields}}}, got {type(raw).__name__}"
                )
            rows = [raw]
        else:
            rows = [{components[0]: raw}]
        fields = components + (["selection"] if units_field is not None else [])
        totals: dict[tuple, dict[str, Fraction]] = {}
        if aggregate.public_keys:
            for key in key_domain(aggregate):
                totals[tuple(str(v) for v in key)] = dict.fromkeys(fields, Fraction(0))
        needed = aggregate.group_by + components + ([units_field] if units_field not in (None, "count") else [])
        dropped = 0
        for row_number, row in enumerate(rows):
            where = f"aggregate {aggregate.name!r}, row {row_number}"
            if not isinstance(row, Mapping):
                raise ReleaseInputError(f"{where}: expected a mapping, got {type(row).__name__}")
            absent = [c for c in needed if c not in row]
            if absent:
                raise ReleaseInputError(f"{where}: missing field(s) {absent}")
            if aggregate.public_keys:
                key = tuple(str(row[c]) for c in aggregate.group_by)
                if key not in totals:
                    dropped += 1
                    continue
            else:
                key = _private_key(row, aggregate, where)
            try:
                values = _row_values(aggregate, row, where, counter, units_field)
            except _Drop:
                continue
            slot = totals.setdefault(key, dict.fromkeys(fields, Fraction(0)))
            for field_name, value in values.items():
                slot[field_name] += value
        if aggregate.public_keys:
            prepared.keys[aggregate.name] = key_domain(aggregate)
            ordered = [_partition_units(aggregate, total) for total in totals.values()]
        else:
            order = sorted(totals, key=lambda k: tuple((type(v).__name__, v) for v in k))
            prepared.keys[aggregate.name] = order
            ordered = [_partition_units(aggregate, totals[k]) for k in order]
            prepared.values[(aggregate.name, "selection")] = [slot["selection"] for slot in ordered]
        for component in components:
            prepared.values[(aggregate.name, component)] = [slot[component] for slot in ordered]
        if dropped:
            prepared.dropped_keys[aggregate.name] = dropped
        if counter[0]:
            prepared.special_values[aggregate.name] = counter[0]
    return prepared


# -- the release ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReleaseResult:
    """What :func:`run_release` returns: the published release (plain JSON) and whether it was a replay."""

    output: dict[str, Any]
    replayed: bool


def _warn_if_spec_changed(stored: Mapping[str, Any], spec_hash: str, key: ReleaseKey) -> None:
    """A replay returns what was released under ``key``, whatever the spec says now; say so if the spec changed."""
    if stored.get("spec_hash") != spec_hash:
        log.warning(
            "release %s was already committed with another version of the spec (sha256 %s); replaying the stored "
            "release unchanged. To release under the new spec, give it a new release name.",
            key, stored.get("spec_hash"),
        )


def _draw_noise(
    plan: ReleasePlan, prepared: PreparedInputs, drawn: list[str]
) -> tuple[dict[tuple[str, str], list[int]], dict]:
    """Noised integer vectors per (aggregate, component), and the selected key lists under partition selection.
    ``drawn`` records every draw *before* it starts, so a caller knows whether any noise may exist.

    A key is selected iff its noised unit count is >= the threshold: the same comparison the threshold's delta
    was computed with (:func:`~dp_operators.mechanisms.calibration.discrete_laplace_threshold`).
    """
    noised: dict[tuple[str, str], list[int]] = {}
    selected: dict[str, list[int]] = {}
    for aggregate in plan.spec.aggregates:
        positions = list(range(len(prepared.keys[aggregate.name])))
        if not aggregate.public_keys:
            step = plan.step(aggregate.name, "selection")
            counts = prepared.values[(aggregate.name, "selection")]
            drawn.append(step.component)
            noise = step.draw(len(counts))
            positions = [i for i, (c, n) in enumerate(zip(counts, noise)) if c + n >= step.threshold]
            selected[aggregate.name] = positions
        for component in aggregate.components:
            step = plan.step(aggregate.name, component)
            values = prepared.values[(aggregate.name, component)]
            drawn.append(step.component)
            noise = step.draw(len(positions))
            noised[(aggregate.name, component)] = [values[i] + n for i, n in zip(positions, noise)]
    return noised, selected


def run_release(
    spec: ReleaseSpec,
    aggregates: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    ledger: Ledger,
    key: ReleaseKey,
    *,
    spec_hash: str,
    try_number: int | None = None,
    audit: Mapping[str, Any] | None = None,
) -> ReleaseResult:
    """Run one release end to end (see the module docstring for the order of steps).

    Args:
        spec: the validated release spec.
        aggregates: true aggregates from upstream, shaped as :func:`prepare_inputs` documents, or a function
            returning them, called only when the release is not a replay (a retry then needs no upstream value).
        ledger: the budget ledger.
        key: the release key; ``key.release_name`` must equal ``spec.release``.
        spec_hash: SHA-256 of the spec's text, recorded with the charge.
        try_number: the Airflow try, recorded for the audit trail only (never part of the key).
        audit: who/where context for the ledger's audit events (``run_type``, ``triggering_user``, ...; see
            :meth:`dp_operators.ledger.Ledger.reserve`). Never data values.

    Returns:
        :class:`ReleaseResult`. On a replay the stored output is returned unchanged and nothing is charged.

    Raises:
        ReleaseInputError, ReleaseConfigError, IncompatibleAccountantError: before anything is reserved.
        AccountNotFoundError, DagNotAllowedError, BudgetExhaustedError: refusals from the ledger; nothing reserved.
        ChargeStateError: another attempt took over this release key; the charge stays spent.
    """
    if key.release_name != spec.release:
        raise ReleaseConfigError(f"release key names {key.release_name!r} but the spec releases {spec.release!r}")
    stored = ledger.stored_output(key)
    if stored is not None:
        _warn_if_spec_changed(stored, spec_hash, key)
        return ReleaseResult(output=stored, replayed=True)

    plan = plan_release(spec)
    account = ledger.account(spec.budget_account)
    if account.privacy_unit != spec.privacy_unit:
        raise ReleaseConfigError(
            f"the spec protects privacy unit {spec.privacy_unit!r} but budget account {account.name!r} is for "
            f"{account.privacy_unit!r}; a budget only composes over one privacy unit"
        )
    charge = plan.charge(account.accountant)
    delta_spent = plan.delta(account.accountant)
    if callable(aggregates):
        aggregates = aggregates()
    prepared = prepare_inputs(spec, aggregates)
    unused = sorted(str(name) for name in aggregates if name not in {a.name for a in spec.aggregates})
    if unused:
        log.warning("upstream provided aggregate(s) %s that the spec does not release; they were ignored", unused)
    for name, count in prepared.dropped_keys.items():
        log.warning("aggregate %r: %d upstream row(s) outside the public key domain were dropped", name, count)
    for name, count in prepared.special_values.items():
        log.warning("aggregate %r: %d non-finite value(s) handled per the spec's non_finite policy", name, count)

    mechanisms = [step.describe() for step in plan.steps]
    reservation = ledger.reserve(
        key,
        account=account.name,
        amount=charge,
        delta=delta_spent,
        mechanisms=mechanisms,
        spec_hash=spec_hash,
        try_number=try_number,
        audit=audit,
    )
    if isinstance(reservation, dict):
        _warn_if_spec_changed(reservation, spec_hash, key)
        return ReleaseResult(output=reservation, replayed=True)

    # From here on a failure keeps the charge spent unless no sampler was entered (DESIGN.md 2.1, ADR 1).
    drawn: list[str] = []
    try:
        noised, selected = _draw_noise(plan, prepared, drawn)
    except BaseException:
        if not drawn:
            ledger.release(reservation)
        raise
    for name, positions in selected.items():
        prepared.keys[name] = [prepared.keys[name][i] for i in positions]
    keys = prepared.keys
    del prepared

    output = {
        "release": spec.release,
        "release_key": key.as_dict(),
        "budget_account": account.name,
        "accountant": account.accountant,
        "privacy_unit": spec.privacy_unit,
        "charge": {
            account.unit: float(charge),
            f"{account.unit}_exact": str(charge),
            "epsilon_at_delta": account.as_epsilon(charge),
            "delta": None if account.delta is None else float(account.delta),
        },
        "confidence": spec.confidence,
        "aggregates": {
            aggregate.name: publish_aggregate(spec, aggregate, plan, noised, keys[aggregate.name])
            for aggregate in spec.aggregates
        },
        "mechanisms": mechanisms,
        "spec_hash": spec_hash,
        "package_version": __version__,
        "released_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if delta_spent:
        output["charge"]["delta_spent"] = float(delta_spent)
        output["charge"]["delta_spent_exact"] = str(delta_spent)
    check_plain_json(output)
    ledger.commit(reservation, output)
    return ReleaseResult(output=output, replayed=False)


def _number(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)


def publish_aggregate(
    spec: ReleaseSpec,
    aggregate: Aggregate,
    plan: ReleasePlan,
    noised: dict[tuple[str, str], list[int]],
    keys: list[tuple],
) -> dict[str, Any]:
    """The published form of one aggregate: values with half-widths (post-processing of noised values only)."""
    alpha = 1 - spec.confidence
    clamp = spec.postprocess.clamp_nonnegative
    steps = {component: plan.step(aggregate.name, component) for component in aggregate.components}
    vectors = [noised[(aggregate.name, component)] for component in aggregate.components]
    values: list[tuple[int | float, float]] = []
    if aggregate.kind in ("mean", "variance"):
        lower, upper = (exact_number(b, name="bounds") for b in aggregate.bounds)  # type: ignore[union-attr]
        middle, half = float((lower + upper) / 2), float((upper - lower) / 2)
        # Union bound: each component's interval at alpha/k holds jointly with probability >= 1 - alpha.
        widths = [steps[c].half_width(alpha / len(steps)) for c in aggregate.components]
        for units in zip(*vectors):
            centred = {c: float(u * steps[c].grid) for c, u in zip(aggregate.components, units)}
            count = units[aggregate.components.index("count")]
            hw = dict(zip(aggregate.components, widths))
            if aggregate.kind == "mean":
                mean, width = _mean_with_half_width(centred["sum"], count, hw["sum"], hw["count"], -half, half)
                values.append((middle + mean, width))
            else:
                values.append(
                    _variance_with_half_width(
                        centred["sum"], count, centred["sum_squares"], hw["sum"], hw["count"], hw["sum_squares"], half
                    )
                )
    else:
        step = steps[aggregate.kind]
        half_width = step.half_width(alpha)
        for units in vectors[0]:
            value = _number(units * step.grid)
            if clamp and value < 0 and (aggregate.kind == "count" or aggregate.bounds[0] >= 0):  # type: ignore[index]
                value = 0
            values.append((value, half_width))
    rows: list[dict[str, Any]] = []
    for key, (value, half_width) in zip(keys, values):
        row = dict(zip(aggregate.group_by, key))
        row.update(value=value, half_width=half_width)
        rows.append(row)
    chosen = list(dict.fromkeys(step.mechanism for step in steps.values()))
    published: dict[str, Any] = {
        "kind": aggregate.kind,
        "mechanism": "+".join(chosen),
        "budget": {
            name: float(getattr(aggregate.budget, name))
            for name in ("epsilon", "rho", "delta")
            if getattr(aggregate.budget, name) is not None
        },
        "group_by": list(aggregate.group_by),
    }
    if aggregate.bounds is not None:
        published["bounds"] = [float(b) for b in aggregate.bounds]
    if not aggregate.public_keys:
        selection = plan.step(aggregate.name, "selection")
        published["partition_selection"] = {
            "mechanism": selection.mechanism,
            "threshold": selection.threshold,
            "epsilon": float(selection.budget.epsilon),
            "delta": float(selection.budget.delta),
        }
    if aggregate.group_by:
        published["rows"] = rows
    else:
        published["value"], published["half_width"] = rows[0]["value"], rows[0]["half_width"]
    return published


def _mean_with_half_width(
    noised_sum: float, noised_count: int, sum_hw: float, count_hw: float, lower: float, upper: float
) -> tuple[float, float]:
    """Released mean ``noised_sum / max(noised_count, 1)`` clamped to the bounds, and the half-width of an interval
    holding the true mean whenever both components are within their half-widths: the extremes of ``S / N`` over
    the box ``[S' +- sum_hw] x [N' +- count_hw]`` (``S / N`` is monotone in each for ``N > 0``), clipped to the
    bounds. Post-processing of released values only."""
    mean = min(max(noised_sum / max(noised_count, 1), lower), upper)
    counts = (max(noised_count - count_hw, 1.0), max(noised_count + count_hw, 1.0))
    sums = (noised_sum - sum_hw, noised_sum + sum_hw)
    corners = [s / n for s in sums for n in counts]
    low, high = max(min(corners), lower), min(max(corners), upper)
    return mean, max(mean - low, high - mean, 0.0)


def _variance_with_half_width(
    centred_sum: float,
    noised_count: int,
    centred_squares: float,
    sum_hw: float,
    count_hw: float,
    squares_hw: float,
    half_range: float,
) -> tuple[float, float]:
    """Released (population) variance Q/N - (S/N)^2 of values centred at the middle of the bounds, clamped to
    [0, half_range^2], and a half-width valid whenever the three components are within their half-widths: the
    variance's extremes over the box of (S, N, Q), bounded term by term. Post-processing only."""
    count = max(noised_count, 1)
    cap = half_range * half_range
    variance = min(max(centred_squares / count - (centred_sum / count) ** 2, 0.0), cap)
    counts = (max(noised_count - count_hw, 1.0), max(noised_count + count_hw, 1.0))
    ratios = [s / n for s in (centred_sum - sum_hw, centred_sum + sum_hw) for n in counts]
    low_ratio, high_ratio = min(ratios), max(ratios)
    smallest_square = 0.0 if low_ratio <= 0 <= high_ratio else min(low_ratio**2, high_ratio**2)
    largest_square = max(low_ratio**2, high_ratio**2)
    square_means = [q / n for q in (centred_squares - squares_hw, centred_squares + squares_hw) for n in counts]
    high = min(max(square_means) - smallest_square, cap)
    low = max(min(square_means) - largest_square, 0.0)
    return variance, max(variance - low, high - variance, 0.0)


def check_plain_json(value: Any, path: str = "release") -> None:
    """Check ``value`` is built-in JSON: dict with str keys, list, str, bool, None, int, finite float.

    Raises:
        TypeError: with the path of the first offending element (DESIGN.md 2.9; Airflow would fail later).
    """
    if value is None or isinstance(value, (str, bool, int)) and type(value) in (str, bool, int):
        return
    if type(value) is float:
        if not math.isfinite(value):
            raise TypeError(f"{path}: non-finite float cannot be published")
        return
    if type(value) is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise TypeError(f"{path}: key of type {type(k).__name__} is not JSON")
            check_plain_json(v, f"{path}.{k}")
        return
    if type(value) is list:
        for i, v in enumerate(value):
            check_plain_json(v, f"{path}[{i}]")
        return
    raise TypeError(f"{path}: {type(value).__name__} is not plain JSON")
