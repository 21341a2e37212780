"""Upstream values: check their shape and read them onto each aggregate's grid. Raw values never leave here
except as :class:`PreparedInputs`, which the engine noises and drops."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import product
from typing import Any

from dp_operators.accounting import exact_number
from dp_operators.release.errors import ReleaseInputError
from dp_operators.spec import Aggregate, ReleaseSpec

#: Data values are saturated at +-SATURATION grid units (about 4.6e18): they never overflow and never wrap.
SATURATION = 2**62

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
