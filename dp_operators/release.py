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
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import product
from typing import Any

from dp_operators import __version__
from dp_operators.accounting import PrivacyLoss, charge_in_account_unit, exact_number
from dp_operators.ledger import Ledger, ReleaseKey
from dp_operators.mechanisms import (
    discrete_gaussian_accuracy,
    discrete_gaussian_sigma2,
    discrete_laplace_accuracy,
    discrete_laplace_scale,
    rho_for_approx_dp,
    sample_discrete_gaussian_vector,
    sample_discrete_laplace_vector,
)
from dp_operators.spec import Aggregate, ReleaseSpec

log = logging.getLogger(__name__)


class ReleaseInputError(ValueError):
    """The upstream aggregates do not have the shape the spec declares. Raised before any budget is reserved."""


class ReleaseConfigError(ValueError):
    """The spec and the budget account disagree (privacy unit, accountant). Raised before anything is reserved."""


@dataclass(frozen=True)
class NoiseStep:
    """One noised sub-step of a release: a vector of ``partitions`` integers noised with one mechanism.

    Attributes:
        aggregate, component: which aggregate and which part of it (``count`` or ``sum``).
        mechanism: ``discrete_laplace`` (``scale`` is t, pmf ~ exp(-|x|/t)) or ``discrete_gaussian``
            (``scale`` is sigma^2, pmf ~ exp(-x^2 / (2 sigma^2))), in grid units.
        budget: the privacy loss this step is calibrated to.
        l1_sensitivity, l2_sensitivity_squared: of the whole vector, in grid units.
        grid: the fixed-point resolution (1 for counts): released value = integer * grid.
    """

    aggregate: str
    component: str
    mechanism: str
    budget: PrivacyLoss
    l1_sensitivity: int
    l2_sensitivity_squared: int
    scale: Fraction
    grid: Fraction
    partitions: int

    def half_width(self, alpha: float) -> float:
        """Half-width of the (1 - alpha) interval of one value, in value units (public parameters only)."""
        if self.mechanism == "discrete_laplace":
            units = discrete_laplace_accuracy(self.scale, alpha)
        else:
            units = discrete_gaussian_accuracy(self.scale, alpha)
        return float(units * self.grid)

    def draw(self) -> list[int]:
        """Draw the noise vector from the exact sampler (OS CSPRNG)."""
        if self.mechanism == "discrete_laplace":
            return sample_discrete_laplace_vector(self.scale, self.partitions)
        return sample_discrete_gaussian_vector(self.scale, self.partitions)

    def describe(self) -> dict[str, Any]:
        """A JSON-safe description recorded in the ledger and published with the release."""
        scale_name = "scale" if self.mechanism == "discrete_laplace" else "sigma"
        scale_value = self.scale if self.mechanism == "discrete_laplace" else math.sqrt(self.scale)
        return {
            "aggregate": self.aggregate,
            "component": self.component,
            "mechanism": self.mechanism,
            self.budget.unit: float(self.budget.amount),
            f"{self.budget.unit}_exact": str(self.budget.amount),
            scale_name: float(scale_value * self.grid),
            "l1_sensitivity": float(self.l1_sensitivity * self.grid),
            "l2_sensitivity": float(math.sqrt(self.l2_sensitivity_squared) * self.grid),
            "grid": float(self.grid),
            "partitions": self.partitions,
        }


@dataclass(frozen=True)
class ReleasePlan:
    """The public plan of a release: every noised sub-step. Computed without touching data."""

    spec: ReleaseSpec
    steps: tuple[NoiseStep, ...]

    def charge(self, accountant: str) -> Fraction:
        """The exact total charge in ``accountant``'s unit: the sum of every step's converted loss (composition).

        Raises:
            IncompatibleAccountantError: a step cannot be charged to this accountant.
        """
        return sum((charge_in_account_unit(step.budget, accountant) for step in self.steps), Fraction(0))

    def step(self, aggregate: str, component: str) -> NoiseStep:
        return next(s for s in self.steps if s.aggregate == aggregate and s.component == component)


def plan_release(spec: ReleaseSpec) -> ReleasePlan:
    """Compute the mechanisms, sensitivities, scales and losses of ``spec`` from public parameters only.

    A mean is a noised sum and a noised count, each calibrated to half the aggregate's budget (DESIGN.md 2.7).
    Sensitivities follow DESIGN.md 2.6: L1 = L0 * Linf, L2^2 = L0 * Linf^2, with Linf in grid units
    ``ceil(max_contributions_per_partition * max(|lower|, |upper|) / grid)`` for sums: rounding a partition's sum to
    the grid with ``floor(x / grid + 1/2)`` maps values ``d`` apart to integers at most ``ceil(d / grid)`` apart.
    """
    steps: list[NoiseStep] = []
    for aggregate in spec.aggregates:
        bounds = spec.contribution_for(aggregate)
        l0 = bounds.max_partitions_contributed
        per_partition = bounds.max_contributions_per_partition
        components: list[tuple[str, int, Fraction]] = []
        if aggregate.kind in ("sum", "mean"):
            lower, upper = (exact_number(b, name="bounds") for b in aggregate.bounds)  # type: ignore[union-attr]
            linf = math.ceil(per_partition * max(abs(lower), abs(upper)) / aggregate.grid)
            components.append(("sum", linf, aggregate.grid))
        if aggregate.kind in ("count", "mean"):
            components.append(("count", per_partition, Fraction(1)))
        total = aggregate_loss(aggregate)
        share = Fraction(1, len(components))
        for component, linf, grid in components:
            loss = PrivacyLoss(total.unit, total.amount * share)
            l1, l2_squared = l0 * linf, l0 * linf * linf
            if aggregate.mechanism == "discrete_laplace":
                scale = discrete_laplace_scale(l1, loss.amount)
            else:
                scale = discrete_gaussian_sigma2(l2_squared, loss.amount)
            steps.append(
                NoiseStep(
                    aggregate=aggregate.name,
                    component=component,
                    mechanism=aggregate.mechanism,
                    budget=loss,
                    l1_sensitivity=l1,
                    l2_sensitivity_squared=l2_squared,
                    scale=scale,
                    grid=grid,
                    partitions=aggregate.partition_count,
                )
            )
    return ReleasePlan(spec=spec, steps=tuple(steps))


def aggregate_loss(aggregate: Aggregate) -> PrivacyLoss:
    """The privacy loss an aggregate's budget buys, in the unit its mechanism is calibrated in: epsilon for
    ``discrete_laplace``; rho for ``discrete_gaussian`` (an (epsilon, delta) budget becomes the largest rho whose
    zCDP guarantee implies it, :func:`~dp_operators.mechanisms.rho_for_approx_dp`)."""
    budget = aggregate.budget
    if budget.form == "epsilon":
        return PrivacyLoss("epsilon", budget.epsilon)
    if budget.form == "rho":
        return PrivacyLoss("rho", budget.rho)
    return PrivacyLoss("rho", rho_for_approx_dp(budget.epsilon, budget.delta))


# -- upstream values ---------------------------------------------------------------------------------------------
@dataclass
class PreparedInputs:
    """True aggregates in grid units, per aggregate and component, in key-domain order. Never leaves the engine."""

    values: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    dropped_keys: dict[str, int] = field(default_factory=dict)
    replaced_non_finite: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:  # raw values must not reach logs through a repr
        return f"PreparedInputs(<{len(self.values)} vectors withheld>)"


def key_domain(aggregate: Aggregate) -> list[tuple]:
    """The public partitions of ``aggregate`` in release order: the product of the key lists (``[()]`` if not
    grouped)."""
    return list(product(*(aggregate.keys[column] for column in aggregate.group_by)))


def _to_grid(value: Any, grid: Fraction, policy_value: float, counter: list[int], where: str) -> int:
    """Read one data value as an integer on the grid: ``floor(value / grid + 1/2)``. NaN/inf take the policy value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ReleaseInputError(f"{where}: expected a number, got {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        exact = Fraction(int(value))
    else:
        number = float(value)
        if not math.isfinite(number):
            counter[0] += 1
            number = float(policy_value)
        exact = Fraction(number)
    return math.floor(exact / grid + Fraction(1, 2))


def prepare_inputs(spec: ReleaseSpec, aggregates: Mapping[str, Any]) -> PreparedInputs:
    """Check the shape of the upstream aggregates and read them onto each aggregate's grid.

    Shapes (JSON-friendly, as an upstream ``@task`` returns them):

    * ungrouped count or sum: a number; ungrouped mean: ``{"sum": number, "count": number}``;
    * grouped: a list of rows, each a mapping with every ``group_by`` column and ``count`` (count), ``sum`` (sum) or
      both (mean). Rows repeating a key are added up. A public key with no row is a true 0.

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
        components = {"count": ["count"], "sum": ["sum"], "mean": ["sum", "count"]}[aggregate.kind]
        grids = {"sum": aggregate.grid, "count": Fraction(1)}
        replacement = aggregate.non_finite.replace_with
        non_finite = [0]
        raw = aggregates[aggregate.name]
        domain = key_domain(aggregate)
        index = {tuple(str(v) for v in key): i for i, key in enumerate(domain)}
        vectors = {component: [0] * len(domain) for component in components}
        if aggregate.group_by:
            if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
                raise ReleaseInputError(
                    f"aggregate {aggregate.name!r}: expected a list of rows with columns "
                    f"{aggregate.group_by + components}, got {type(raw).__name__}"
                )
            rows = raw
        else:
            if aggregate.kind == "mean":
                if not isinstance(raw, Mapping):
                    raise ReleaseInputError(
                        f"aggregate {aggregate.name!r}: a mean expects {{'sum': number, 'count': number}}, "
                        f"got {type(raw).__name__}"
                    )
                rows = [raw]
            else:
                rows = [{components[0]: raw}]
        dropped = 0
        for row_number, row in enumerate(rows):
            where = f"aggregate {aggregate.name!r}, row {row_number}"
            if not isinstance(row, Mapping):
                raise ReleaseInputError(f"{where}: expected a mapping, got {type(row).__name__}")
            absent = [c for c in aggregate.group_by + components if c not in row]
            if absent:
                raise ReleaseInputError(f"{where}: missing field(s) {absent}")
            position = index.get(tuple(str(row[c]) for c in aggregate.group_by))
            values = {
                c: _to_grid(row[c], grids[c], replacement, non_finite, f"{where}, field {c!r}") for c in components
            }
            if position is None:
                dropped += 1
                continue
            for component, value in values.items():
                vectors[component][position] += value
        if "count" in vectors:
            vectors["count"] = [max(0, count) for count in vectors["count"]]
        for component, vector in vectors.items():
            prepared.values[(aggregate.name, component)] = vector
        if dropped:
            prepared.dropped_keys[aggregate.name] = dropped
        if non_finite[0]:
            prepared.replaced_non_finite[aggregate.name] = non_finite[0]
    return prepared


# -- the release ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReleaseResult:
    """What :func:`run_release` returns: the published release (plain JSON) and whether it was a replay."""

    output: dict[str, Any]
    replayed: bool


def run_release(
    spec: ReleaseSpec,
    aggregates: Mapping[str, Any],
    ledger: Ledger,
    key: ReleaseKey,
    *,
    spec_hash: str,
    try_number: int | None = None,
) -> ReleaseResult:
    """Run one release end to end (see the module docstring for the order of steps).

    Args:
        spec: the validated release spec.
        aggregates: true aggregates from upstream, shaped as :func:`prepare_inputs` documents.
        ledger: the budget ledger.
        key: the release key; ``key.release_name`` must equal ``spec.release``.
        spec_hash: SHA-256 of the spec's text, recorded with the charge.
        try_number: the Airflow try, recorded for the audit trail only (never part of the key).

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
        return ReleaseResult(output=stored, replayed=True)

    plan = plan_release(spec)
    account = ledger.account(spec.budget_account)
    if account.privacy_unit != spec.privacy_unit:
        raise ReleaseConfigError(
            f"the spec protects privacy unit {spec.privacy_unit!r} but budget account {account.name!r} is for "
            f"{account.privacy_unit!r}; a budget only composes over one privacy unit"
        )
    charge = plan.charge(account.accountant)
    prepared = prepare_inputs(spec, aggregates)
    for name, count in prepared.dropped_keys.items():
        log.warning("aggregate %r: %d upstream row(s) outside the public key domain were dropped", name, count)
    for name, count in prepared.replaced_non_finite.items():
        log.warning("aggregate %r: %d non-finite value(s) replaced per the spec's non_finite policy", name, count)

    mechanisms = [step.describe() for step in plan.steps]
    reservation = ledger.reserve(
        key,
        account=account.name,
        amount=charge,
        mechanisms=mechanisms,
        spec_hash=spec_hash,
        try_number=try_number,
    )
    if isinstance(reservation, dict):
        return ReleaseResult(output=reservation, replayed=True)

    # From here on a failure keeps the charge spent unless no noise was drawn at all (DESIGN.md 2.1).
    try:
        noise = {(step.aggregate, step.component): step.draw() for step in plan.steps}
    except BaseException:
        ledger.release(reservation)
        raise
    noised = {k: [v + n for v, n in zip(prepared.values[k], noise[k])] for k in noise}
    del prepared, noise

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
            aggregate.name: _publish_aggregate(spec, aggregate, plan, noised) for aggregate in spec.aggregates
        },
        "mechanisms": mechanisms,
        "spec_hash": spec_hash,
        "package_version": __version__,
        "released_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    check_plain_json(output)
    ledger.commit(reservation, output)
    return ReleaseResult(output=output, replayed=False)


def _number(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)


def _publish_aggregate(
    spec: ReleaseSpec, aggregate: Aggregate, plan: ReleasePlan, noised: dict[tuple[str, str], list[int]]
) -> dict[str, Any]:
    alpha = 1 - spec.confidence
    clamp = spec.postprocess.clamp_nonnegative
    rows: list[dict[str, Any]] = []
    if aggregate.kind == "mean":
        sum_step, count_step = plan.step(aggregate.name, "sum"), plan.step(aggregate.name, "count")
        # Union bound: each component's interval at alpha/2 holds jointly with probability >= 1 - alpha.
        sum_hw, count_hw = sum_step.half_width(alpha / 2), count_step.half_width(alpha / 2)
        lower, upper = (float(b) for b in aggregate.bounds)  # type: ignore[union-attr]
        values = [
            _mean_with_half_width(float(s * aggregate.grid), c, sum_hw, count_hw, lower, upper)
            for s, c in zip(noised[(aggregate.name, "sum")], noised[(aggregate.name, "count")])
        ]
    else:
        step = plan.step(aggregate.name, aggregate.kind)
        half_width = step.half_width(alpha)
        values = []
        for units in noised[(aggregate.name, aggregate.kind)]:
            value = _number(units * step.grid)
            if clamp and value < 0 and (aggregate.kind == "count" or aggregate.bounds[0] >= 0):  # type: ignore[index]
                value = 0
            values.append((value, half_width))
    for key, (value, half_width) in zip(key_domain(aggregate), values):
        row = dict(zip(aggregate.group_by, key))
        row.update(value=value, half_width=half_width)
        rows.append(row)
    published: dict[str, Any] = {
        "kind": aggregate.kind,
        "mechanism": aggregate.mechanism,
        "budget": {
            name: float(getattr(aggregate.budget, name))
            for name in ("epsilon", "rho", "delta")
            if getattr(aggregate.budget, name) is not None
        },
        "group_by": list(aggregate.group_by),
    }
    if aggregate.bounds is not None:
        published["bounds"] = [float(b) for b in aggregate.bounds]
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
