"""The published form of a release: noised values with half-widths, checked to be plain JSON. Post-processing of
noised values and public parameters only.

Saturation is never silent (docs/mechanisms.md): the engine holds values within +-SATURATION grid units, so a true
value beyond the limit is released at the limit. A released value whose *noised* grid integer lies within one noise
half-width of the limit is published with ``"saturated": true`` and an ``"interval"`` ``[lower, upper]`` whose side
towards the limit is ``null`` (unbounded) and ``"half_width": null``; a mean or variance with a saturated component
gets the whole range its bounds allow. Deciding this from the noised value is post-processing: nothing is logged.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain, repeat
from typing import Any

import numpy as np

from dp_operators.mechanisms.accuracy import combination_accuracy
from dp_operators.release.columns import largest_magnitude
from dp_operators.release.upstream_types import SATURATION
from dp_operators.release.plan import NoiseStep, ReleasePlan
from dp_operators.spec import Aggregate, ReleaseSpec


def _number(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)


def _float_towards(value: Fraction, direction: float) -> float:
    """``value`` as a float rounded towards ``direction`` (-inf for a lower end, +inf for an upper end)."""
    near = float(value)
    if (direction < 0 and near > value) or (direction > 0 and near < value):
        near = math.nextafter(near, direction)
    return near


def published_interval(row: dict[str, Any]) -> tuple[float | None, float | None]:
    """The interval of a published row: its ``interval`` when saturated (``None`` on the unbounded side), else
    ``value -+ half_width`` rounded outwards to floats. Post-processing of the published row only."""
    if "interval" in row:
        lower, upper = row["interval"]
        return lower, upper
    value, width = row["value"], row["half_width"]
    if type(width) is float and (type(value) is float or (type(value) is int and abs(value) < 2**53)):
        return _outward(float(value), -width, -math.inf), _outward(float(value), width, math.inf)
    value, width = Fraction(value), Fraction(width)
    return _float_towards(value - width, -math.inf), _float_towards(value + width, math.inf)


def _outward(a: float, b: float, direction: float) -> float:
    """``a + b`` for two doubles, rounded towards ``direction``, exactly: the float sum is the nearest double to
    the exact sum, and Knuth's TwoSum error term (exact, barring overflow) says on which side of it the sum lies.
    The same result as :func:`_float_towards` on the exact rational sum; the scalar form of :func:`_towards`."""
    s = a + b
    if not math.isfinite(s):  # beyond the doubles: the rational route
        return _float_towards(Fraction(a) + Fraction(b), direction)
    bb = s - a
    error = (a - (s - bb)) + (b - bb)
    if (direction < 0 and error < 0) or (direction > 0 and error > 0):
        return math.nextafter(s, direction)
    return s


def _near_limit(units: int, noise_half_width: float) -> int:
    """+1 (or -1) when a noised grid integer is within one noise half-width of +SATURATION (or -SATURATION): the
    true value may lie beyond the limit. 0 otherwise. A function of the noised value and public parameters only."""
    if units + noise_half_width >= SATURATION:
        return 1
    if units - noise_half_width <= -SATURATION:
        return -1
    return 0


def _saturated_interval(units: int, step: NoiseStep, half_width: float, side: int) -> dict[str, Any]:
    """The published fields of a saturated count or sum: an interval unbounded towards the limit."""
    centre = units * step.grid
    if side > 0:
        interval = [_float_towards(centre - Fraction(half_width), -math.inf), None]
    else:
        interval = [None, _float_towards(centre + Fraction(half_width), math.inf)]
    return {"half_width": None, "saturated": True, "interval": interval}


def grid_values(units: np.ndarray, grid: Fraction) -> np.ndarray:
    """``units * grid`` per element as :func:`_number` gives it (an ``int`` when the product is whole, else the
    float nearest to it), as an object array of Python numbers. Exact: integer products, and a division of two
    doubles that are exact (IEEE 754 division is correctly rounded, as ``float(Fraction)`` is); elements beyond
    2^53 take ``float(Fraction)`` itself."""
    p, q = grid.numerator, grid.denominator
    units = np.asarray(units)
    if units.dtype != object and max(largest_magnitude(units), 1) * p < 2**63:  # 1: whatever the values
        product = units * p
    else:
        product = units.astype(object) * p
    out = np.empty(len(units), dtype=object)
    if q == 1:
        out[:] = product.tolist()
        return out
    whole = np.asarray((product % q) == 0, dtype=bool)
    small = q <= 2**53 and largest_magnitude(product) <= 2**53
    if small:
        out[:] = (product.astype(np.float64) / float(q)).tolist()
    else:
        out[:] = [float(Fraction(int(v), q)) for v in product.tolist()]
    out[whole] = (product[whole] // q).tolist()
    return out


def _towards(value: np.ndarray, width: float, direction: float) -> np.ndarray:
    """``value - width`` (``direction`` -inf) or ``value + width`` (+inf) rounded outwards to doubles, exactly
    for doubles: Knuth's TwoSum gives the rounding error of the float sum, whose sign says on which side of the
    exact result the float lies."""
    a = value
    b = -width if direction < 0 else width
    s = a + b
    bb = s - a
    error = (a - (s - bb)) + (b - bb)  # s + error == a + b exactly (no overflow at these magnitudes)
    if direction < 0:
        return np.where(error < 0, np.nextafter(s, -np.inf), s)
    return np.where(error > 0, np.nextafter(s, np.inf), s)


def grid_floats(units: np.ndarray, grid: Fraction) -> np.ndarray:
    """``float(units * grid)`` per element (float64 array): the double nearest the exact product, as ``float()``
    of :func:`_number`'s result gives it. Integer products convert with one rounding; ``product / q`` divides two
    exact doubles (correctly rounded by IEEE 754); anything larger takes ``float(Fraction)`` per element."""
    p, q = grid.numerator, grid.denominator
    units = np.asarray(units)
    if units.dtype != object and max(largest_magnitude(units), 1) * p < 2**63:
        product = units * p
        if q == 1:
            return product.astype(np.float64)
        if q <= 2**53 and largest_magnitude(product) <= 2**53:
            return product.astype(np.float64) / float(q)
    return np.array([float(Fraction(int(u) * p, q)) for u in units.tolist()], dtype=np.float64)


@dataclass
class PublishedCells:
    """The published cells of a count or sum, as arrays of shape (cells,): post-processing of noised grid
    integers and public parameters only.

    Attributes:
        units: the noised grid integers (int64, or Python ints in an object array).
        zeroed: True where the spec's ``clamp_nonnegative`` publishes 0 instead of a negative value.
        half_width: the half-width of every unsaturated cell's interval, value units.
        side: +1 / -1 where the cell may be saturated towards +SATURATION / -SATURATION, else 0 (int8).
        step: the noise step (grid, scale) the cells were drawn with.
    """

    units: np.ndarray
    zeroed: np.ndarray
    half_width: float
    side: np.ndarray
    step: NoiseStep

    def slice(self, start: int, stop: int) -> PublishedCells:
        """The cells ``start:stop`` (views, no copy)."""
        return PublishedCells(self.units[start:stop], self.zeroed[start:stop], self.half_width,
                              self.side[start:stop], self.step)

    def values(self) -> np.ndarray:
        """The published values, a Python ``int`` or ``float`` per cell as :func:`_number` gives it (object
        array)."""
        values = grid_values(self.units, self.step.grid)
        values[self.zeroed] = 0
        return values

    def value_floats(self) -> np.ndarray:
        """The published values as float64 (the Parquet ``value`` column)."""
        floats = grid_floats(self.units, self.step.grid)
        floats[self.zeroed] = 0.0
        return floats

    def rows(self, group_by: Sequence[str], keys: Sequence[tuple]) -> list[dict[str, Any]]:
        """The published rows (JSON objects): key columns, ``value``, ``half_width``; saturated cells carry
        ``saturated`` and ``interval`` instead of a finite ``half_width``."""
        width = self.half_width
        # Keys in sorted order, as the ledger's canonical JSON and every replay hold them (:func:`in_key_order`),
        # built a column at a time; a dict display for the usual one or two key columns (half the time of
        # dict(zip(...)) on 10^5 inline rows).
        names = tuple(sorted((*group_by, "value", "half_width")))
        columns: dict[str, Any] = dict(zip(group_by, zip(*keys))) if keys else dict.fromkeys(group_by, ())
        columns["value"] = self.values().tolist()
        columns["half_width"] = repeat(width)
        ordered = [columns[name] for name in names]
        if len(names) == 3:
            k0, k1, k2 = names
            rows = [{k0: x0, k1: x1, k2: x2} for x0, x1, x2 in zip(*ordered)]
        elif len(names) == 4:
            k0, k1, k2, k3 = names
            rows = [{k0: x0, k1: x1, k2: x2, k3: x3} for x0, x1, x2, x3 in zip(*ordered)]
        else:
            rows = [dict(zip(names, row)) for row in zip(*ordered)]
        saturated = np.flatnonzero(self.side).tolist()
        units = self.units.tolist() if saturated else None
        for index in saturated:
            row = rows[index] | _saturated_interval(units[index], self.step, width, int(self.side[index]))
            rows[index] = dict(sorted(row.items()))
        return rows

    def bounds(self, floats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each cell's interval ends (float64 arrays; NaN on a saturated cell's unbounded side), as
        :func:`published_interval` computes them from the published row; ``floats`` is :meth:`value_floats`."""
        lower = _towards(floats, self.half_width, -math.inf)
        upper = _towards(floats, self.half_width, math.inf)
        beyond = np.flatnonzero(np.abs(floats) >= 2**53)  # a whole value there may not be a double: exactly
        if len(beyond):
            values = self.values()
            for index in beyond.tolist():
                lower[index], upper[index] = published_interval({"value": values[index],
                                                                 "half_width": self.half_width})
        units = self.units.tolist() if np.any(self.side) else None
        for index in np.flatnonzero(self.side).tolist():
            interval = _saturated_interval(units[index], self.step, self.half_width, int(self.side[index]))["interval"]
            lower[index] = math.nan if interval[0] is None else interval[0]
            upper[index] = math.nan if interval[1] is None else interval[1]
        return lower, upper


def count_or_sum_cells(step: NoiseStep, units: np.ndarray, alpha: float, clamp: bool) -> PublishedCells:
    """:class:`PublishedCells` of a count or sum from its noised grid integers ``units`` (shape (cells,))."""
    units = np.asarray(units)
    zeroed = np.asarray(units < 0, dtype=bool) if clamp and len(units) else np.zeros(len(units), dtype=bool)
    noise_width = step.noise_half_width_units(alpha)
    side = np.zeros(len(units), dtype=np.int8)
    if len(units):
        side[np.asarray(units + noise_width >= SATURATION, dtype=bool)] = 1
        side[np.asarray(units - noise_width <= -SATURATION, dtype=bool) & (side == 0)] = -1
    return PublishedCells(units, zeroed, step.half_width(alpha), side, step)


def publish_aggregate(
    spec: ReleaseSpec,
    aggregate: Aggregate,
    plan: ReleasePlan,
    noised: dict[tuple[str, str], np.ndarray],
    keys: Sequence[tuple],
    rows_file: Callable[[Aggregate, PublishedCells, Sequence[tuple]], dict[str, Any]] | None = None,
    consistent: Any | None = None,
    consistency: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The published form of one aggregate: values with half-widths (post-processing of noised values only).

    Each value carries ``half_width``, the half-width of its interval at the spec's confidence, which holds the
    true value: the noise, the rounding to the grid and, for binary64 upstream sums, their error bound
    (:meth:`NoiseStep.half_width`); a mean's or variance's from its components' (a box bound). A value that may
    be saturated carries ``saturated: true`` and ``interval`` instead (see the module docstring).

    Counts and sums are computed array-at-a-time (:class:`PublishedCells`). With ``rows_file`` (a count or sum
    whose rows are stored as a file, :mod:`dp_operators.release.rows_file`), the aggregate gets ``rows_file``,
    what that function returns (location, SHA-256, number of rows), instead of ``rows``.

    A member of a consistent family (``consistency``: its description, published as ``consistency``) is never
    clamped at 0 independently (that would break its sums); ``consistent`` holds its post-processed cells
    (:class:`~dp_operators.release.consistent.ConsistentCells`), None when the family was left as released.
    """
    alpha = 1 - spec.confidence
    clamp = spec.postprocess.clamp_nonnegative
    steps = {component: plan.step(aggregate.name, component) for component in aggregate.components}
    vectors = [noised[(aggregate.name, component)] for component in aggregate.components]
    values: list[dict[str, Any]] = []
    if aggregate.kind in ("mean", "variance"):
        lower, upper = aggregate.exact_bounds  # type: ignore[misc]
        middle, half = float((lower + upper) / 2), float((upper - lower) / 2)
        # The box below is only the fallback for a row whose Fieller set is empty (a miss already counted in
        # alpha, so any interval keeps the guarantee); saturation is still judged on the components at alpha / k.
        share = alpha / len(steps)
        widths = [steps[c].half_width(share) for c in aggregate.components]
        noise_widths = [steps[c].noise_half_width_units(share) for c in aggregate.components]
        fieller = fieller_table(aggregate.kind, [steps[c] for c in aggregate.components], half, alpha)
        whole_range = (float(lower), float(upper)) if aggregate.kind == "mean" else (0.0, half * half)
        for units in zip(*(vector.tolist() for vector in vectors)):
            centred = {c: float(u * steps[c].grid) for c, u in zip(aggregate.components, units)}
            count = units[aggregate.components.index("count")]
            hw = dict(zip(aggregate.components, widths))
            if aggregate.kind == "mean":
                mean, width = _mean_with_half_width(centred["sum"], count, hw["sum"], hw["count"], -half, half)
                found = _fieller_mean_interval(centred["sum"], count, fieller)
                if found is not None:
                    width = _half_width_around(mean, *found)
                value = middle + mean
            else:
                value, width = _variance_with_half_width(
                    centred["sum"], count, centred["sum_squares"], hw["sum"], hw["count"], hw["sum_squares"], half
                )
                found = _fieller_variance_interval(centred["sum"], count, centred["sum_squares"], half, fieller)
                if found is not None:
                    width = _half_width_around(value, *found)
            row: dict[str, Any] = {"value": value, "half_width": width}
            if any(_near_limit(u, w) for u, w in zip(units, noise_widths)):
                # a component may be beyond the limit: only the bounds still hold the mean / variance
                low, high = whole_range
                row.update(half_width=max(value - low, high - value), saturated=True, interval=[low, high])
            values.append(row)
    else:
        step = steps[aggregate.kind]
        if consistent is not None:
            cells = consistent
        else:
            cells = count_or_sum_cells(step, vectors[0], alpha, clamp and consistency is None and (
                aggregate.kind == "count" or aggregate.bounds[0] >= 0))  # type: ignore[index]
        if rows_file is not None:
            published_rows: Any = rows_file(aggregate, cells, keys)
        else:
            published_rows = cells.rows(aggregate.group_by, keys)
    if aggregate.kind in ("mean", "variance"):
        published_rows = []
        for key, published_value in zip(keys, values):
            row = dict(zip(aggregate.group_by, key))
            row.update(published_value)
            published_rows.append(row)
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
        published["partition_selection"] = plan.step(aggregate.name, "selection").published_selection()
    if consistency is not None:
        published["consistency"] = consistency
    if rows_file is not None and aggregate.kind in ("count", "sum"):
        published["rows_file"] = published_rows
    elif aggregate.group_by:
        published["rows"] = published_rows
    else:
        published.update(published_rows[0])
    return published


#: Cells of |m| (the centred mean, in [0, half]) over which a mean's Fieller half-widths are bounded.
MEAN_CELLS = 64
#: Cells of |m| and of v (in [0, half^2]) for a variance's; fewer: each is a two-dimensional sum over runs.
VARIANCE_CELLS = 12
#: The share of alpha a variance spends on its mean's test (the rest on the variance's own): the mean enters the
#: variance's interval only at second order, so it gets little.
VARIANCE_MEAN_SHARE = 0.1


def _deterministic_error(step: NoiseStep) -> float:
    """The most a component's released value is off before noise, value units: half a grid step when rounded to
    the grid, plus the binary64 summation allowance; 0 for a count. Rounded up."""
    if step.bound is None:
        return 0.0
    exact = (Fraction(1, 2) if step.bound.rounded else 0) * step.grid + step.bound.interval_error
    value = float(exact)
    return math.nextafter(value, math.inf) if value < exact else value


def _half_width_around(value: float, low: float, high: float) -> float:
    """The smallest half-width (rounded up) of an interval centred at ``value`` holding ``[low, high]``."""
    width = max(value - low, high - value, 0.0)
    return math.nextafter(math.nextafter(width, math.inf), math.inf)  # the two subtractions' rounding


@dataclass(frozen=True)
class FiellerTable:
    """Public half-widths of the test statistics behind a mean's or a variance's interval, per cell of the
    unknowns (see :func:`mean_fieller_table`, :func:`variance_fieller_tables`)."""

    edges: np.ndarray  # |m| cell edges, (cells + 1,)
    mean_widths: np.ndarray  # (cells,): W1 for S' - m N'
    v_edges: np.ndarray | None = None  # v cell edges, (v cells + 1,)
    variance_widths: np.ndarray | None = None  # (cells, v cells): W2 for Q' - 2 m S' + (m^2 - v) N'


def _noise(step: NoiseStep) -> tuple[str, Fraction]:
    return step.mechanism, step.scale


def mean_fieller_table(sum_step: NoiseStep, count_step: NoiseStep, half: float, alpha: float,
                       cells: int = MEAN_CELLS) -> FiellerTable:
    """Public half-widths W1(cell) for a mean's Fieller interval (public parameters only).

    With the true centred mean m = S/N (N >= 1 rows, values centred at the middle of the bounds, so |m| <= half)
    and the released S' = S + r + g Z_S (|r| <= the sum's deterministic error b), N' = N + Z_N: S' - m N' =
    r + g Z_S - m Z_N, whatever S and N are. For |m| in a cell [a, a'], :func:`combination_accuracy` gives W with
    P(|g Z_S - m Z_N| > W) <= alpha for every m of the cell (the law is the same for -m: Z_N is symmetric), so
    ``|S' - m N'| <= W + b`` holds at the true m with probability >= 1 - alpha. The published interval is the hull of
    every m passing that test (Fieller 1954; test inversion): it holds the true mean with probability >= 1 - alpha,
    exactly, not by a union bound over the components (which covered 99.2-99.9 %).
    """
    edges = np.linspace(0.0, half, cells + 1)
    widths = combination_accuracy((*_noise(sum_step), float(sum_step.grid)),
                                  [(*_noise(count_step), edges[:-1], edges[1:])], alpha)
    return FiellerTable(edges, widths + _deterministic_error(sum_step))


def variance_fieller_tables(sum_step: NoiseStep, count_step: NoiseStep, squares_step: NoiseStep, half: float,
                            alpha: float, cells: int = VARIANCE_CELLS) -> FiellerTable:
    """Public half-widths for a variance's interval: W1 for the mean's test at ``VARIANCE_MEAN_SHARE * alpha``, W2
    for the variance's at the rest (public parameters only).

    With the true centred mean m and population variance v of the (clamped, centred) values, Q = sum of squares:
    Q - 2 m S + (m^2 - v) N = sum (x - m)^2 - v N = 0, so U = Q' - 2 m S' + (m^2 - v) N' = r_Q - 2 m r_S +
    g_Q Z_Q - 2 m g_S Z_S + (m^2 - v) Z_N, |r_Q| <= b_Q, |r_S| <= b_S. Over a cell of (|m|, v) the coefficients lie
    in boxes and :func:`combination_accuracy` bounds the noise part's quantile for all of them (Z_S symmetric: the
    sign of m does not matter). The union bound over the two tests (mean's and variance's) gives probability
    >= 1 - alpha that the true (m, v) passes both; the published interval is the hull of the v of every (m, v)
    passing both. The mean's uncertainty enters only at second order (Q' - 2 m S' + m^2 N' is flat at m = S'/N'),
    so most of alpha goes to the variance's own test.
    """
    share = alpha * VARIANCE_MEAN_SHARE
    mean = mean_fieller_table(sum_step, count_step, half, share, cells)
    edges = mean.edges
    v_edges = np.linspace(0.0, half * half, cells + 1)
    m_low, v_low = np.meshgrid(edges[:-1], v_edges[:-1], indexing="ij")
    m_high, v_high = np.meshgrid(edges[1:], v_edges[1:], indexing="ij")
    grid = float(sum_step.grid)
    widths = combination_accuracy(
        (*_noise(squares_step), float(squares_step.grid)),
        [(*_noise(sum_step), (2 * grid * m_low).ravel(), (2 * grid * m_high).ravel()),
         (*_noise(count_step), (m_low**2 - v_high).ravel(), (m_high**2 - v_low).ravel())],
        alpha - share, bins=32,
    ).reshape(cells, cells)
    widths = widths + _deterministic_error(squares_step) + 2 * edges[1:, None] * _deterministic_error(sum_step)
    return FiellerTable(edges, mean.mean_widths, v_edges, widths)


_TABLES: OrderedDict[tuple, FiellerTable] = OrderedDict()
_TABLES_KEPT = 64


def fieller_table(kind: str, steps: Sequence[NoiseStep], half: float, alpha: float) -> FiellerTable:
    """The mean's (``steps``: sum, count) or variance's (sum, count, sum_squares) Fieller table, computed once per
    public parameters: each table depends only on each step's mechanism, scale, grid and deterministic error, on
    ``half`` and ``alpha`` (a variance's takes about 0.6 s, so a process keeps the last few)."""
    key = (kind, half, alpha, *((s.mechanism, s.scale, s.grid, _deterministic_error(s)) for s in steps))
    table = _TABLES.get(key)
    if table is None:
        table = mean_fieller_table(*steps, half, alpha) if kind == "mean" else variance_fieller_tables(
            *steps, half, alpha)
        for array in (table.edges, table.mean_widths, table.v_edges, table.variance_widths):
            if array is not None:
                array.setflags(write=False)  # shared between releases: never modified in place
        _TABLES[key] = table
        if len(_TABLES) > _TABLES_KEPT:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    return table


#: Relative margin on every test's width for the float rounding of the per-row arithmetic (errors of order 1e-16
#: relative to the magnitudes involved).
_ROW_MARGIN = 1e-9


def _mean_cells(noised_sum: float, noised_count: float, table: FiellerTable) -> tuple[np.ndarray, np.ndarray]:
    """Per signed cell of m (negative cells first), the range of m passing the mean's test (lower > upper: none)."""
    edges, widths = table.edges, table.mean_widths
    low = np.concatenate([-edges[:0:-1], edges[:-1]])
    high = np.concatenate([-edges[-2::-1], edges[1:]])
    w = np.concatenate([widths[::-1], widths])
    w = w * (1 + _ROW_MARGIN) + _ROW_MARGIN * (abs(noised_sum) + edges[-1] * abs(noised_count))
    if noised_count > 0:
        a, b = (noised_sum - w) / noised_count, (noised_sum + w) / noised_count
    elif noised_count < 0:
        a, b = (noised_sum + w) / noised_count, (noised_sum - w) / noised_count
    else:
        passes = abs(noised_sum) <= w
        a, b = np.where(passes, -np.inf, np.inf), np.where(passes, np.inf, -np.inf)
    return np.maximum(a, low), np.minimum(b, high)


def _fieller_mean_interval(noised_sum: float, noised_count: int, table: FiellerTable) -> tuple[float, float] | None:
    """The hull of the centred means m passing ``|S' - m N'| <= W1(cell of m)``; None when no m passes."""
    a, b = _mean_cells(noised_sum, float(noised_count), table)
    passes = a <= b
    if not passes.any():
        return None
    return float(a[passes].min()), float(b[passes].max())


def _fieller_variance_interval(noised_sum: float, noised_count: int, noised_squares: float, half: float,
                               table: FiellerTable) -> tuple[float, float] | None:
    """The hull of the variances v of every (m, v) passing both tests (:func:`variance_fieller_tables`); None when
    none passes."""
    n = float(noised_count)
    a, b = _mean_cells(noised_sum, n, table)
    cells = len(table.edges) - 1
    index = np.concatenate([np.arange(cells)[::-1], np.arange(cells)])  # |m| cell of each signed cell
    passes = a <= b
    if not passes.any():
        return None
    a, b, index = a[passes], b[passes], index[passes]

    def p(m: np.ndarray) -> np.ndarray:
        return noised_squares - 2 * m * noised_sum + m * m * n

    ends = np.stack([p(a), p(b)])
    p_low, p_high = ends.min(axis=0), ends.max(axis=0)
    if n != 0:
        vertex = noised_sum / n
        inside = (a <= vertex) & (vertex <= b)
        if n > 0:
            p_low = np.where(inside, np.minimum(p_low, p(np.full_like(a, vertex))), p_low)
        else:
            p_high = np.where(inside, np.maximum(p_high, p(np.full_like(a, vertex))), p_high)
    w = table.variance_widths[index]  # (passing m cells, v cells)
    w = w * (1 + _ROW_MARGIN) + _ROW_MARGIN * (abs(noised_squares) + 2 * half * abs(noised_sum) + half * half * abs(n))
    lo_p, hi_p = (p_low[:, None] - w), (p_high[:, None] + w)  # v n must lie in [lo_p, hi_p]
    if n > 0:
        v_a, v_b = lo_p / n, hi_p / n
    elif n < 0:
        v_a, v_b = hi_p / n, lo_p / n
    else:
        ok = (lo_p <= 0) & (0 <= hi_p)
        v_a, v_b = np.where(ok, -np.inf, np.inf), np.where(ok, np.inf, -np.inf)
    smallest_m = np.minimum(np.abs(a), np.abs(b))
    smallest_m[(a <= 0) & (0 <= b)] = 0.0
    v_a = np.maximum(np.maximum(v_a, table.v_edges[None, :-1]), 0.0)
    v_b = np.minimum(np.minimum(v_b, table.v_edges[None, 1:]), (half * half - smallest_m**2)[:, None])
    found = v_a <= v_b
    if not found.any():
        return None
    return float(v_a[found].min()), float(v_b[found].max())


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


def in_key_order(value: Any) -> Any:
    """Plain JSON ``value`` (:func:`check_plain_json`) with every dict's keys in sorted order: equal to
    ``json.loads(canonical_json(value))``, in the same key order, which is what the ledger stores and a replay
    returns, so a first run and its replays give the same XCom. Built without decoding the canonical text: a dict
    already in order is copied as it is, and a list of rows (dicts of scalars) keeps every row whose keys are in
    order (the publishers build them so) and sorts the others. Lists and dicts are new; scalars are shared."""
    kind = type(value)
    if kind is dict:
        keys = list(value)
        if keys != sorted(keys):
            keys.sort()
        return {k: in_key_order(value[k]) for k in keys}
    if kind is list:
        if value and type(value[0]) is dict and _scalar_rows(value):
            in_order = tuple(sorted(value[0]))
            return [row if tuple(row) == in_order else dict(sorted(row.items())) for row in value]
        return [in_key_order(v) for v in value]
    return value


def _scalar_rows(values: list) -> bool:
    """``values`` are all dicts whose values are all scalars (no container to reorder inside a row)."""
    return set(map(type, values)) == {dict} and set(
        map(type, chain.from_iterable(map(dict.values, values)))
    ) <= _SCALARS | {float}


def check_plain_json(value: Any, path: str = "release") -> None:
    """Check ``value`` is built-in JSON: dict with str keys, list, str, bool, None, int, finite float.

    Checked level by level over whole columns (:func:`_plain_level`: the types of every value at one depth of the
    document, the finiteness of its floats at once), so a release of 10^5 inline rows costs a few passes in C
    rather than a Python call per value; only a document that fails is walked again value by value, for the path
    of its first offending element.

    Raises:
        TypeError: with the path of the first offending element (DESIGN.md 2.9; Airflow would fail later).
    """
    if not _plain_level([value]):
        _check_each(value, path)


#: The JSON scalars that need no further check (``float`` must also be finite). Exact types: a subclass (numpy's
#: ``float64`` is one of ``float``, ``bool_`` is none of them) is not plain.
_SCALARS = frozenset({str, int, bool, type(None)})
#: Levels :func:`_plain_level` checks; a release document has fewer than ten.
_DEPTH = 200


def _plain_level(items: list) -> bool:
    """True when every element of ``items`` is plain JSON: the exact types of the elements, then the keys and
    values of their dicts and the elements of their lists as the next level, all at once. Never raises for a
    value: False on anything else (which :func:`_check_each` then names), and on a document nested deeper than
    :data:`_DEPTH` levels (a cycle included)."""
    for _ in range(_DEPTH):
        if not items:
            return True
        kinds = set(map(type, items))
        if kinds <= _SCALARS:
            return True
        if not kinds <= _SCALARS | {float, dict, list}:
            return False
        if float in kinds and not _finite(items, kinds):
            return False
        dicts = _of_type(items, kinds, dict)
        if dicts and set(map(type, chain.from_iterable(dicts))) - {str}:
            return False
        lists = _of_type(items, kinds, list)
        items = list(chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(lists)))
    return False


def _of_type(items: list, kinds: set[type], kind: type) -> list:
    """The elements of ``items`` of exactly type ``kind`` (``kinds``: the types ``items`` holds)."""
    if kind not in kinds:
        return []
    return items if len(kinds) == 1 else [v for v in items if type(v) is kind]


def _finite(items: list, kinds: set[type]) -> bool:
    """True when every float of ``items`` is finite. A column of numbers only (a row's keys, value and half-width)
    goes through ``math.isfinite`` whole (an int is finite, but one beyond the doubles overflows the check: then
    the floats are picked out first)."""
    if kinds <= {int, float, bool}:
        try:
            return all(map(math.isfinite, items))
        except OverflowError:
            pass
    return all(map(math.isfinite, [v for v in items if type(v) is float]))


def _check_each(value: Any, path: str) -> None:
    """:func:`check_plain_json` value by value: raises at the first element that is not plain JSON."""
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
            _check_each(v, f"{path}.{k}")
        return
    if type(value) is list:
        for i, v in enumerate(value):
            _check_each(v, f"{path}[{i}]")
        return
    raise TypeError(f"{path}: {type(value).__name__} is not plain JSON")


def release_header(spec: ReleaseSpec, key: Any, account: Any) -> dict[str, Any]:
    """The fields every published release opens with: its name, release key, account, accountant and privacy
    unit (``key``: a :class:`~dp_operators.ledger.ReleaseKey`; ``account``: its
    :class:`~dp_operators.ledger.AccountStatus`)."""
    return {"release": spec.release, "release_key": key.as_dict(), "budget_account": account.name,
            "accountant": account.accountant, "privacy_unit": spec.privacy_unit}
