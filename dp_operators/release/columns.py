"""Columnar upstream values: an Arrow table read onto the grid with array operations (issue 11, item 2).

A grouped aggregate's upstream value may be a :class:`pyarrow.Table` (the operator passes Parquet sources this way;
a Python caller may too). When the table's *types* allow it (:func:`columnar_eligible`), this module computes the
same :class:`~dp_operators.release.inputs.PreparedInputs` vectors and the same diagnostics as the row-by-row
reader of :mod:`dp_operators.release.inputs`, with numpy integer arithmetic only:

* keys: each ``group_by`` column is looked up in its public value list (``pyarrow.compute.index_in``); the
  partition's position in the product domain is the mixed-radix number of the per-column positions (the order
  of :func:`~dp_operators.release.inputs.key_domain`). A NULL or unlisted key is outside the domain;
* values: integer columns, and decimal128 columns of at most 18 digits read as unscaled integers over 10^scale,
  added per partition exactly (int64 when the largest possible total fits, Python
  ints in an object array otherwise), then rounded to the grid once per partition: ``floor(v / g + 1/2)`` for a
  sum on grid ``g = p/q`` is ``floor((2 q v + p) / (2 p))``, an integer division; counts are kept >= 0;
  everything saturates at +-SATURATION grid units, as :func:`~dp_operators.release.inputs.prepare_inputs` does.

Which path reads a table depends on its schema and the spec only, never on a value (a NULL value follows the
aggregate's ``non_finite`` policy here as in the row reader). Both paths give identical vectors and diagnostics; ``tests/release_engine/test_columnar_inputs.py`` checks it on random tables.
Floats go the row-by-row way (their exact binary value, and the float-sum rules of docs/adr/0017), as do wider
decimals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_operators.release.upstream_types import SATURATION

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from dp_operators.release.diagnostics import AggregateDiagnostics
    from dp_operators.spec import Aggregate

_I64 = 2**63
#: Rows converted to Python per step when looking for examples of keys outside the domain.
_EXAMPLE_CHUNK = 4096


def is_table(value: Any) -> bool:
    """True for a :class:`pyarrow.Table` (pyarrow is only imported when it already is)."""
    import sys

    pyarrow = sys.modules.get("pyarrow")
    return pyarrow is not None and isinstance(value, pyarrow.Table)


def _domain_kind(values: list) -> type | None:
    """``int`` or ``str`` when every public value of a column is of that type (and ints fit in int64)."""
    if all(type(v) is str for v in values):
        return str
    if all(type(v) is int and -_I64 <= v < _I64 for v in values):
        return int
    return None


def _plain_type(kind: pa.DataType) -> pa.DataType:
    import pyarrow as pa

    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _signed_integer(kind: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) and kind != pa.uint64()


def _exact_number_type(kind: pa.DataType) -> bool:
    """Integer columns (uint64 excepted) and decimal128 of at most 18 digits and a scale >= 0 (an unscaled value
    fits int64, and the value is it over 10^scale)."""
    import pyarrow as pa

    return _signed_integer(kind) or (pa.types.is_decimal128(kind) and kind.precision <= 18 and kind.scale >= 0)


def largest_magnitude(values: np.ndarray) -> int:
    """max |v| as a Python int (0 for no value): ``np.abs`` of int64's -2^63 is -2^63, so never use it for a
    bound."""
    if not len(values):
        return 0
    return max(-int(values.min()), int(values.max()), 0)


def columnar_eligible(spec_units_field: str | None, aggregate: Aggregate, schema: pa.Schema) -> bool:
    """True when a table of ``schema`` can be read by :func:`read_table` for ``aggregate``: public keys, a count
    or a sum, key columns of the type (int or text) of every public value of their column, integer value
    columns (uint64 excepted). Decided by types only."""
    import pyarrow as pa

    if not aggregate.public_keys or aggregate.kind not in ("count", "sum") or spec_units_field is not None:
        return False
    names = {name for name in schema.names if len(schema.get_all_field_indices(name)) == 1}  # duplicates: rows
    for column in aggregate.group_by:
        if column not in names:
            return False
        kind = _domain_kind(list(aggregate.keys[column]))  # type: ignore[index]
        found = _plain_type(schema.field(column).type)
        if kind is int and not _signed_integer(found):
            return False
        if kind is str and not (pa.types.is_string(found) or pa.types.is_large_string(found)):
            return False
        if kind is None:
            return False
    for component in aggregate.components:
        if component not in names or not _exact_number_type(_plain_type(schema.field(component).type)):
            return False
    return True


def _codes(column: pa.ChunkedArray, domain: list) -> np.ndarray:
    """Position of each value in ``domain`` (int64), -1 for NULL or a value not listed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_integer(column.type):
        column, value_set = column.cast(pa.int64()), pa.array(domain, type=pa.int64())
    else:
        value_set = pa.array(domain, type=column.type)
    return pc.index_in(column, value_set=value_set).fill_null(-1).to_numpy().astype(np.int64, copy=False)


def _exact_values(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, int]:
    """``(unscaled, null, D)``: the column's values are exactly ``unscaled / D`` (int64 array, or Python ints in an
    object array for a decimal holding more digits than its type declares; D = 10^scale for a decimal, 1 for
    integers); ``null`` marks NULLs (also a NULL a dictionary holds), whose ``unscaled`` is 0. A decimal128's
    unscaled value is its 16-byte two's complement integer: its low 64 bits read as int64 when the high word is
    their sign's extension (always, within 18 digits), else ``high * 2^64 + low`` exactly."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    null = column.is_null().to_numpy(zero_copy_only=False).astype(bool, copy=False)
    if not pa.types.is_decimal(column.type):
        return column.fill_null(0).cast(pa.int64()).to_numpy().astype(np.int64, copy=False), null, 1
    lows, highs = [], []
    for chunk in column.chunks:
        words = np.frombuffer(chunk.buffers()[1], dtype=np.int64) if len(chunk) else np.zeros(0, dtype=np.int64)
        lows.append(words[2 * chunk.offset:2 * (chunk.offset + len(chunk)):2])
        highs.append(words[2 * chunk.offset + 1:2 * (chunk.offset + len(chunk)):2])
    low = np.concatenate(lows) if lows else np.zeros(0, dtype=np.int64)
    high = np.concatenate(highs) if highs else np.zeros(0, dtype=np.int64)
    unscaled: np.ndarray = low.astype(np.int64, copy=True)
    wide = np.flatnonzero((high != (low >> 63)) & ~null)
    if len(wide):  # more digits than declared (Arrow does not check): the whole 128-bit value, exactly
        unscaled = unscaled.astype(object)
        for index in wide.tolist():
            unscaled[index] = int(high[index]) * 2**64 + int(low[index].view(np.uint64))
    unscaled[null] = 0
    return unscaled, null, 10**column.type.scale


def _exact_totals(positions: np.ndarray, values: np.ndarray, partitions: int) -> np.ndarray:
    """Per-partition sums of ``values``: int64 when no total can leave +-2^62, else Python ints (exact)."""
    largest = largest_magnitude(values)
    if values.dtype != object and largest * len(values) < 2**62:
        totals = np.zeros(partitions, dtype=np.int64)
    else:
        totals = np.zeros(partitions, dtype=object)
        values = values.astype(object)
    np.add.at(totals, positions, values)
    return totals


def _count(counter: Any, component: str, mask: np.ndarray) -> None:
    """Add the number of True cells to ``counter[component]`` (no entry for none, as the row reader leaves it)."""
    found = int(np.count_nonzero(mask))
    if found:
        counter[component] += found


def _saturate(units: np.ndarray, component: str, seen: AggregateDiagnostics) -> np.ndarray:
    saturated = np.asarray((units >= SATURATION) | (units <= -SATURATION), dtype=bool)
    _count(seen.saturated, component, saturated)
    return np.clip(units, -SATURATION, SATURATION).astype(np.int64)


def _on_grid(
    totals: np.ndarray, scale: int, aggregate: Aggregate, component: str, seen: AggregateDiagnostics
) -> np.ndarray:
    """Exact totals ``totals / scale`` as grid integers, as ``inputs._on_grid`` computes them for one partition:
    ``floor(t / g + 1/2)`` on grid ``g = p/q`` is ``floor((2 q t + p D) / (2 p D))`` for ``t = totals / D``."""
    p, q = (1, 1) if component == "count" else (aggregate.grid.numerator, aggregate.grid.denominator)
    largest = max(largest_magnitude(totals), 1)  # 1: the bound must not depend on whether any total is non-zero
    if totals.dtype == object or 2 * q * largest + p * scale >= 2**62:
        totals = totals.astype(object)
    if component == "count":
        if scale != 1:
            _count(seen.non_integer_counts, component, np.asarray(totals % scale != 0, dtype=bool))
        negative = np.asarray(totals < 0, dtype=bool)
        _count(seen.clamped, component, negative)
        totals = np.where(negative, 0, totals)
    units = (2 * q * totals + p * scale) // (2 * p * scale)  # floor(total / grid + 1/2), exactly
    return _saturate(units, component, seen)


def read_table(
    aggregate: Aggregate, table: pa.Table, seen: AggregateDiagnostics, key_domain: Callable[[Aggregate], Any]
) -> tuple[list[tuple], dict[str, np.ndarray]]:
    """Read an eligible table (:func:`columnar_eligible`): the public keys and one int64 vector of grid integers
    per component, in key-domain order. Fills ``seen`` as the row-by-row reader does; a NULL value follows the
    aggregate's ``non_finite.nan`` policy (``replace``: 0, the value a NULL count or sum has; ``drop``: the row is
    ignored), counted as ``null`` in ``special_values`` when its key is in the domain.

    Shapes: ``table`` has one row per (partial) partition: the ``group_by`` columns and the component columns
    (``count`` or ``sum``); rows repeating a key are added up. Returns ``(keys, {component: array of shape
    (partitions,)})``.
    """
    domains = [list(aggregate.keys[column]) for column in aggregate.group_by]  # type: ignore[index]
    sizes = [len(d) for d in domains]
    partitions = int(np.prod(sizes, dtype=object)) if sizes else 1
    rows = table.num_rows
    seen.rows += rows
    position = np.zeros(rows, dtype=np.int64)
    inside = np.ones(rows, dtype=bool)
    for column, domain, size in zip(aggregate.group_by, domains, sizes):
        codes = _codes(table.column(column), domain)
        inside &= codes >= 0
        position = position * size + codes
    outside = np.flatnonzero(~inside)
    if len(outside):
        _outside_examples(aggregate, table, outside, seen)
    read = {component: _exact_values(table.column(component)) for component in aggregate.components}
    kept = inside.copy()
    for component, (_, null, _) in read.items():  # a NULL value: the aggregate's non_finite policy for NaN
        null_inside = int(np.count_nonzero(null & inside))
        if null_inside:
            seen.special_values.setdefault(component, Counter())["null"] += null_inside
        if aggregate.non_finite.nan == "drop":
            kept &= ~null
    seen.rows_dropped += int(np.count_nonzero(inside & ~kept))
    position = position[kept]  # a NULL kept (policy replace) reads as 0: a NULL count or sum is an empty group
    found = np.bincount(position, minlength=partitions) if rows else np.zeros(partitions, dtype=np.int64)
    seen.partitions = int(np.count_nonzero(found))
    vectors: dict[str, np.ndarray] = {}
    for component in aggregate.components:
        values, _, scale = read[component]
        totals = _exact_totals(position, values[kept], partitions)
        max_rows = aggregate.upstream.max_rows
        if component == "count" and max_rows is not None:
            seen.partitions_over_max_rows += int(np.count_nonzero(np.asarray(totals > max_rows * scale, dtype=bool)))
        vectors[component] = _on_grid(totals, scale, aggregate, component, seen)
    return key_domain(aggregate), vectors


def _outside_examples(aggregate: Aggregate, table: pa.Table, outside: np.ndarray, seen: AggregateDiagnostics) -> None:
    """Count the rows outside the domain and keep the first distinct keys as examples, in row order."""
    from dp_operators.release.diagnostics import EXAMPLE_KEYS

    keys = table.select(list(aggregate.group_by))
    for start in range(0, len(outside), _EXAMPLE_CHUNK):
        if len(seen.outside_domain_examples) >= EXAMPLE_KEYS:
            seen.rows_outside_domain += len(outside) - start
            return
        chunk = keys.take(outside[start:start + _EXAMPLE_CHUNK]).to_pylist()
        for row in chunk:
            seen.outside_domain(tuple(row[column] for column in aggregate.group_by))
