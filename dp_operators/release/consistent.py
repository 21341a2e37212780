"""Consistent families at publication: the noised cells of a spec's counts (or sums) and their margins made to add
up (``postprocess.consistent``), with the half-widths of the post-processed values.

Post-processing only: the inputs are the noised grid integers and the plan's public parameters (key domains,
hierarchies, noise variances, rounding allowances); the plan, and so the charge, do not depend on it. The numerics
live in :mod:`dp_operators.consistency`; the user-facing description in ``docs/consistency.md``.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dp_operators.consistency import (
    Family,
    Member,
    MemberAccuracy,
    accuracy,
    base_codes,
    fit,
    half_widths,
    member_to_base,
)
from dp_operators.consistency.wls import exact_sums
from dp_operators.mechanisms.accuracy import discrete_gaussian_variance, discrete_laplace_variance
from dp_operators.release.errors import ReleaseConfigError
from dp_operators.release.plan import NoiseStep, ReleasePlan
from dp_operators.release.publish import _towards, count_or_sum_cells, grid_floats, published_interval
from dp_operators.spec.families import FamilyLayout, consistent_families

log = logging.getLogger(__name__)


def _noise_variance(step: NoiseStep) -> float:
    """The exact variance of one cell's noise, value units squared."""
    if step.mechanism == "discrete_laplace":
        units = discrete_laplace_variance(step.scale)
    else:
        units = discrete_gaussian_variance(step.scale)
    return units * float(step.grid) ** 2


def _bias(step: NoiseStep) -> float:
    """The deterministic error bound of one cell before noise, value units: half a grid step for a rounded sum,
    plus the binary64 summation allowance (0 for a count). Rounded up."""
    if step.bound is None:
        return 0.0
    exact = ((Fraction(1, 2) if step.bound.rounded else 0) * step.grid) + step.bound.interval_error
    value = float(exact)
    return math.nextafter(value, math.inf) if value < exact else value


def build_family(plan: ReleasePlan, layout: FamilyLayout) -> Family:
    """The :class:`~dp_operators.consistency.Family` of ``layout``: cell maps from the key domains and
    hierarchies, noise variances and allowances from the plan. Public parameters only."""
    spec = plan.spec
    by_name = {a.name: a for a in spec.aggregates}
    base = by_name[layout.base]
    shape = tuple(len(base.keys[c]) for c in base.group_by)  # type: ignore[index]
    codes = base_codes(shape)
    members = []
    for name in layout.members:
        aggregate = by_name[name]
        step = plan.step(name, aggregate.kind)
        to_base, kept = member_to_base(base.group_by, base.keys, aggregate.group_by, aggregate.keys,  # type: ignore[arg-type]
                                       layout.parents, codes)
        members.append(Member(name=name, cells=aggregate.partition_count, to_base=to_base,  # type: ignore[arg-type]
                              variance=_noise_variance(step), mechanism=step.mechanism, bias=_bias(step),
                              kept_axes=kept))
    return Family(members=tuple(members), base_shape=shape, grid=float(base.grid))


@dataclass
class ConsistentCells:
    """The published cells of one family member, as arrays of shape (cells,); the interface of
    :class:`~dp_operators.release.publish.PublishedCells` the row writers use.

    Attributes:
        published: the published values: float64, or int64 with ``integer``.
        half_width: per cell, the half-width of its interval (value units).
        step: the member's noise step (its mechanism is published with each row).
        side: all zeros (a family is post-processed only when no member may be saturated).
    """

    published: np.ndarray
    half_width: np.ndarray
    step: NoiseStep

    @property
    def units(self) -> np.ndarray:  # the row writers take the number of cells from it
        return self.published

    @property
    def side(self) -> np.ndarray:
        return np.zeros(len(self.published), dtype=np.int8)

    def slice(self, start: int, stop: int) -> ConsistentCells:
        return ConsistentCells(self.published[start:stop], self.half_width[start:stop], self.step)

    def values(self) -> np.ndarray:
        out = np.empty(len(self.published), dtype=object)
        out[:] = self.published.tolist()
        return out

    def value_floats(self) -> np.ndarray:
        return self.published.astype(np.float64)

    def rows(self, group_by: Sequence[str], keys: Sequence[tuple]) -> list[dict[str, Any]]:
        rows = []
        for key, value, width in zip(keys, self.published.tolist(), self.half_width.tolist()):
            row = dict(zip(group_by, key))
            row["value"] = value
            row["half_width"] = width
            rows.append(row)
        return rows

    def bounds(self, floats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each cell's interval ends, rounded outwards, as :func:`published_interval` computes them from the row."""
        if not len(floats) or float(np.abs(floats).max()) < 2**53:  # every value a double exactly: TwoSum
            return _towards(floats, self.half_width, -math.inf), _towards(floats, self.half_width, math.inf)
        lower = np.empty(len(floats))
        upper = np.empty(len(floats))
        for index, (value, width) in enumerate(zip(self.published.tolist(), self.half_width.tolist())):
            lower[index], upper[index] = published_interval({"value": value, "half_width": width})
        return lower, upper


@dataclass(frozen=True)
class FamilyResult:
    """What publication adds to each member of a post-processed family."""

    cells: dict[str, ConsistentCells]
    description: dict[str, Any]


def _may_saturate(plan: ReleasePlan, family: Family, noised: Mapping[tuple[str, str], np.ndarray],
                  alpha: float) -> bool:
    """True when a member's noised value may be saturated (public parameters and noised values only)."""
    for member in family.members:
        aggregate = plan.spec.aggregates[[a.name for a in plan.spec.aggregates].index(member.name)]
        step = plan.step(member.name, aggregate.kind)
        cells = count_or_sum_cells(step, noised[(member.name, aggregate.kind)], alpha, clamp=False)
        if np.any(cells.side):
            return True
    return False


def _rounding_allowance(family: Family, member: Member, per_base_cell: float) -> float:
    """The most ``per_base_cell`` of rounding per base cell moves one of the member's cells."""
    largest = int(np.bincount(member.to_base, minlength=member.cells).max()) if member.cells else 0
    return largest * per_base_cell


def integer_sums(member: Member, base: np.ndarray) -> np.ndarray:
    """The member's cells as exact sums of an integer base (int64 array; Python ints in an object array when a sum
    could pass 2^62). A float ``bincount`` would round sums beyond 2^53."""
    largest = int(np.abs(base).max()) if len(base) else 0
    per_cell = int(np.bincount(member.to_base, minlength=member.cells).max()) if member.cells else 0
    if largest * max(per_cell, 1) < 2**62:
        sums = np.zeros(member.cells, dtype=np.int64)
        np.add.at(sums, member.to_base, base.astype(np.int64))
        return sums
    sums = np.zeros(member.cells, dtype=object)
    sums[:] = 0
    np.add.at(sums, member.to_base, base.astype(object))
    return sums


#: The smallest noise variance (grid units squared) of a family member: below it the discrete noise is almost
#: surely 0 (a discrete Gaussian of variance 1e-12 has sigma^2 of about 0.018, rho 28 for a count) and the weights
#: leave binary64's range as rho grows (at rho 720 the exact variance, 4e-313, is subnormal).
MIN_VARIANCE_GRID_UNITS = 1e-12
#: The largest ratio of two members' noise variances a family may have: beyond it the weighted normal equations
#: are too ill-conditioned for the solver in binary64 (a member with almost no noise: drop it from the family).
MAX_VARIANCE_RATIO = 10.0**12


@dataclass(frozen=True)
class PlannedFamily:
    """A family with everything that depends on public parameters only, computed before any budget is reserved:
    its structure and the exact accuracy of its least-squares values."""

    layout: FamilyLayout
    family: Family
    accuracies: list[MemberAccuracy]


def check_families(plan: ReleasePlan) -> list[tuple[FamilyLayout, Family]]:
    """The consistent families of ``plan``'s spec with their structure, checked: cheap enough for DAG parsing
    (no scipy, no accuracy). Public parameters only.

    Raises:
        ReleaseConfigError: a member almost noiseless (variance below :data:`MIN_VARIANCE_GRID_UNITS`), or two
            members whose variances differ by more than :data:`MAX_VARIANCE_RATIO`.
    """
    checked = []
    for layout in consistent_families(plan.spec):
        family = build_family(plan, layout)
        variances = {m.name: m.variance for m in family.members}
        smallest, largest = min(variances, key=variances.get), max(variances, key=variances.get)
        if not variances[smallest] / family.grid**2 >= MIN_VARIANCE_GRID_UNITS:
            raise ReleaseConfigError(
                f"aggregate {smallest!r} of the consistent family {list(family.names)} has a noise variance of "
                f"{variances[smallest] / family.grid**2:.3g} grid units squared (its budget is so large that its "
                f"noise is almost surely 0): nothing to make consistent; give it a smaller budget (below about "
                f"rho 28 or epsilon 27 per unit of sensitivity) or leave it out of the family"
            )
        if variances[largest] / variances[smallest] > MAX_VARIANCE_RATIO:
            raise ReleaseConfigError(
                f"the consistent family {list(family.names)} mixes noise variances {variances[smallest]:.3g} "
                f"({smallest!r}) and {variances[largest]:.3g} ({largest!r}), a ratio above {MAX_VARIANCE_RATIO:.0e}: "
                f"{smallest!r} is almost noiseless (its budget is very large), so its values would dictate the "
                "others'; give it a smaller budget or leave it out of the family"
            )
        checked.append((layout, family))
    return checked


def plan_families(plan: ReleasePlan) -> list[PlannedFamily]:
    """The consistent families of ``plan``'s spec, planned (:func:`check_families`, then the exact accuracy): run
    before the reservation, so that a failure here (a refusal, a missing library) spends nothing. Public parameters
    only."""
    importlib.import_module("dp_operators.consistency.rounding")  # scipy.optimize, before any budget is spent
    return [PlannedFamily(layout, family, accuracy(family)) for layout, family in check_families(plan)]


def make_consistent(plan: ReleasePlan, planned: PlannedFamily, noised: Mapping[tuple[str, str], np.ndarray],
                    alpha: float) -> FamilyResult | None:
    """The published cells of one family, or None when a member may be saturated (then the members are
    published as they are, each with its own interval; the description says why).

    Steps: the weighted least-squares fit (the best linear unbiased estimate), then, as the spec asks, the
    non-negative least-squares fit and controlled rounding; finally the base is rounded to a power-of-two step
    so that every margin is the sum of its cells exactly in binary64. Half-widths: the quantile factor times the
    exact standard deviation of the least-squares value, plus the carried rounding allowances, plus the rounding
    of the last steps (with ``integer``, :func:`~dp_operators.consistency.rounding.guaranteed_rounding`'s allowance,
    a function of the family's structure only, so the same on every draw; without it, the exact-sum step's
    allowance, a power of two chosen from the estimate's magnitude, at most 2^-41 value units per base cell for
    family totals below 4,096; see docs/consistency.md for both, and for what the non-negativity step does to
    coverage).
    """
    from dp_operators.consistency.rounding import controlled_rounding, guaranteed_rounding, nonnegative_fit, two_chains

    post = plan.spec.postprocess
    family = planned.family
    if _may_saturate(plan, family, noised, alpha):
        return None
    kinds = {a.name: a.kind for a in plan.spec.aggregates}
    grid = Fraction(family.grid)
    units = [np.asarray(noised[(m.name, kinds[m.name])]) for m in family.members]
    observations = [grid_floats(u, grid) for u in units]
    # least squares is linear: fit(y) = y_base + fit(y - A y_base), and y - A y_base (every member's noised value
    # minus the sum of the base's noised cells, in exact integers) is noise-sized, so the solver's relative
    # tolerance applies to the correction, not to the values (which may reach 2^62 grid units)
    residuals = [np.zeros(family.base_cells)] + [
        np.asarray(u - integer_sums(m, units[0]), dtype=np.float64) * float(grid)
        for m, u in zip(family.members[1:], units[1:])
    ]
    correction = fit(family, residuals)
    estimate = observations[0] + correction
    widths = half_widths(family, planned.accuracies, alpha)
    controlled: tuple[str, ...] = ()
    if post.nonnegative:
        estimate = nonnegative_fit(family, observations, start=estimate)
    if post.integer:
        if post.nonnegative:
            base, controlled = controlled_rounding(family, estimate)
        else:  # round the correction only: the base's noised integers stay exact, whatever their size
            rounded, controlled = controlled_rounding(family, correction)
            base = units[0] + (rounded.astype(object) if units[0].dtype == object else rounded)  # within +-2^62 + 1
        allowances = guaranteed_rounding(family)
        if not {family.members[i].name for i in [0, *two_chains(family)]} <= set(controlled):
            # only float error beyond the rounding's tolerance could do this: the widths below would not hold, so
            # the family is published as released (consistent_cells catches this)
            raise RuntimeError("controlled rounding gave up a member whose rounding is guaranteed")
        values = [integer_sums(m, base) for m in family.members]
        # half-widths are functions of the family's structure only, the same on every draw: 1 for a member whose
        # controlled rounding is guaranteed, else the fewest cells of a guaranteed member its cells are unions of;
        # never whether this draw's rounding happened to keep it (`controlled`, published as information only)
        extra = [float(allowances[m.name]) for m in family.members]
    else:
        base, step = exact_sums(family, estimate)
        values = [family.margin(m, base) for m in family.members]
        extra = [_rounding_allowance(family, m, step / 2) for m in family.members]
    cells = {}
    for member, value, width, more in zip(family.members, values, widths, extra):
        total = np.nextafter(width + more, np.inf) if more else width
        cells[member.name] = ConsistentCells(value, np.asarray(total, dtype=np.float64),
                                             plan.step(member.name, kinds[member.name]))
    description = {
        "family": list(family.names),
        "base": family.base.name,
        "estimator": "weighted_least_squares",
        "variance": "exact" if all(a.exact for a in planned.accuracies) else "bound",
        "nonnegative": bool(post.nonnegative),
        "integer": bool(post.integer),
    }
    if post.integer:
        # the members this draw's rounding kept (information only: the half-widths use guaranteed_rounding)
        description["controlled_rounding"] = [name for name in family.names if name in controlled]
        description["half_widths"] = "public"
    else:
        # the one part of a half-width that depends on the noised values (post-processing, so no privacy cost):
        # the exact-sum step, a power of two chosen from the estimate's magnitude, published so that it can be read
        description["half_widths"] = "public + exact_sum_step / 2 per base cell"
        description["exact_sum_step"] = float(step)
    return FamilyResult(cells=cells, description=description)


def consistent_cells(plan: ReleasePlan, noised: Mapping[tuple[str, str], np.ndarray], alpha: float,
                     planned: Sequence[PlannedFamily] | None = None,
                     ) -> tuple[dict[str, ConsistentCells], dict[str, dict[str, Any]]]:
    """Every family of the plan's spec (``planned``: :func:`plan_families`, computed when not given): the
    members' published cells, and per member the description published with it (``consistency``). A family
    left as released (saturation) is described with ``applied: false``."""
    cells: dict[str, ConsistentCells] = {}
    described: dict[str, dict[str, Any]] = {}
    for one in plan_families(plan) if planned is None else planned:
        try:
            result = make_consistent(plan, one, noised, alpha)
            reason = "a member may be saturated: published as released"
        except Exception as error:  # noqa: BLE001 - the noise is drawn and charged: publish the DP values as they are
            # post-processing of noised values only, so no data leaks through this branch; only the type is logged
            log.warning("release %s: the consistent family %s could not be post-processed (%s); its members are "
                        "published as released", plan.spec.release, list(one.layout.members), type(error).__name__)
            result, reason = None, f"post-processing failed ({type(error).__name__}): published as released"
        if result is None:
            for name in one.layout.members:
                described[name] = {"family": list(one.layout.members), "applied": False, "reason": reason}
            continue
        cells.update(result.cells)
        for name in one.layout.members:
            described[name] = {"applied": True, **result.description}
    return cells, described
