"""Columnar upstream values: an Arrow table read onto the grid with array operations (issue 11, item 2).

A grouped aggregate's upstream value may be a :class:`pyarrow.Table` (the operator passes Parquet sources this way;
a Python caller may too). When the table's *types* allow it (:func:`columnar_eligible`), this module computes the
same :class:`~dp_operators.release.inputs.PreparedInputs` vectors and the same diagnostics as the row-by-row
reader of :mod:`dp_operators.release.inputs`, with numpy integer arithmetic only:

* keys: each ``group_by`` column is looked up in its public value list (``pyarrow.compute.index_in``); the
  partition's position in the product domain is the mixed-radix number of the per-column positions (the order
  of :func:`~dp_operators.release.inputs.key_domain`). A NULL or unlisted key is outside the domain;
* values: integer columns, and decimal128 columns of at most 18 digits read as unscaled integers over 10^scale,
  split into 32-bit limbs and added per partition in int64 (exact for any value), then rounded to the grid once
  per partition: ``floor(v / g + 1/2)`` for a sum on grid ``g = p/q`` is ``floor((2 q v + p) / (2 p))``, an
  integer division, done in int64 by long division of the limbs or with Python ints as :func:`grid_arithmetic`
  decides from the spec and the column's type; counts are kept >= 0; everything saturates at +-SATURATION grid
  units, as :func:`~dp_operators.release.inputs.prepare_inputs` does.

Which path reads a table, and which representation its totals take, depends on its schema and the spec only, never
on a value or the number of rows (a NULL value follows the aggregate's ``non_finite`` policy here as in the row
reader). Both paths give identical vectors and diagnostics; ``tests/release_engine/test_columnar_inputs.py`` checks
it on random tables. A table's value columns are checked by their types first (:func:`table_refusal`, for every
table, read here or row by row): a floating ``sum``/``sum_squares`` column under ``upstream.arithmetic: exact`` is
refused whatever it holds (an all-NULL or empty one too), as are float16/float32 and non-numeric columns. Floats
under ``binary64`` go the row-by-row way (their exact binary value, docs/adr/0017), as do wider decimals.
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
    kinds = set(map(type, values))
    if kinds <= {str}:
        return str
    if kinds == {int} and -_I64 <= min(values) and max(values) < _I64:
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


def value_column_refusal(column_type: pa.DataType, column: str, aggregate: Aggregate) -> str | None:
    """Why a value column (``count``, ``sum``, ``sum_squares``, ``units``) of this Arrow type is refused for
    ``aggregate``, or None: text, bool and other non-numeric types, float16/float32 (they hold neither every count
    above 2^24 nor a sum to double precision; the row reader would see them widened to Python floats), and under
    ``upstream.arithmetic: exact`` any floating column of sums. Decided by the type alone, whatever the column holds
    (also when it is empty or all NULL). The reason names the column and the type, never a value."""
    import pyarrow as pa

    from dp_operators.release.upstream_types import FLOAT_SUM_ADVICE

    kind = _plain_type(column_type)
    if pa.types.is_float16(kind) or pa.types.is_float32(kind):
        return (f"column {column!r} is {kind}, which holds neither every count above 2^24 nor a sum to double "
                "precision; write it as an integer, decimal or double column")
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
            or pa.types.is_null(kind)):
        return (f"column {column!r} is of type {kind}, not a number; write it as an integer, decimal or double "
                "column")
    if pa.types.is_floating(kind) and column in ("sum", "sum_squares") and aggregate.upstream.arithmetic == "exact":
        return (f"column {column!r} is {kind}, a binary float, but the spec's upstream.arithmetic is 'exact' (the "
                f"default): {FLOAT_SUM_ADVICE}. In a table: write sums as an integer or decimal128 column")
    return None


def table_refusal(aggregate: Aggregate, schema: pa.Schema, value_fields: list[str]) -> tuple[str, str] | None:
    """``(field, reason)`` when a table of ``schema`` is refused for ``aggregate`` by its schema alone: a needed
    ``group_by`` or value column it lacks, or a value column of a refused type (:func:`value_column_refusal`).
    Checked before any row is read, so an empty table is refused as a full one is."""
    needed = list(aggregate.group_by) + value_fields
    for column in needed:
        found = len(schema.get_all_field_indices(column))
        if not found:
            return column, f"the table has no column {column!r}; give the columns {needed}"
        if found > 1:
            return column, f"the table has {found} columns named {column!r}; give each column once"
    for column in value_fields:
        reason = value_column_refusal(schema.field(column).type, column, aggregate)
        if reason is not None:
            return column, reason
    return None


def columnar_eligible(spec_units_field: str | None, aggregate: Aggregate, schema: pa.Schema) -> bool:
    """True when a table of ``schema`` can be read by :func:`read_table` for ``aggregate``: public keys, a count
    or a sum, key columns of the type (int or text) of every public value of their column, integer value
    columns (uint64 excepted). Decided by types only."""
    import pyarrow as pa

    if not aggregate.public_keys or (aggregate.kind not in ("count", "sum") and not aggregate.reads_counts) or spec_units_field is not None:
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
        column = column.cast(pa.int64())
        low, high = domain[0], domain[-1]
        if high - low + 1 == len(domain) and domain == list(range(low, high + 1)):
            # a range of keys (0..n-1, as vector_release's index): the position is the value's offset, without
            # a hash table of the domain; the same positions index_in finds
            values = column.fill_null(low - 1 if low > -_I64 else high + 1).to_numpy()
            inside = (values >= low) & (values <= high)
            return np.where(inside, values - low, -1).astype(np.int64, copy=False)
        value_set = pa.array(domain, type=pa.int64())
    else:
        value_set = pa.array(domain, type=column.type)
    return pc.index_in(column, value_set=value_set).fill_null(-1).to_numpy().astype(np.int64, copy=False)


#: Each row value is split into 32-bit limbs, added per partition in int64: a partition total of any int64 (or
#: decimal128) values is exact for fewer than 2^31 rows, whatever the values (no limb sum can leave int64).
_LIMB = 2**32
_LOW_BITS = _LIMB - 1
#: Grid arithmetic of partition totals: int64 long division (:func:`_units_int64`), or Python ints.
INT64 = "int64"
PYTHON_INT = "python-int"


def _limbs(column: pa.ChunkedArray) -> tuple[list[np.ndarray], np.ndarray, int]:
    """``(limbs, null, D)``: the column's values are exactly ``sum(limbs[k] * 2^(32 k)) / D`` (int64 arrays, every
    limb in [0, 2^32) but the last, which is signed; D = 10^scale for a decimal, 1 for integers); ``null`` marks
    NULLs (also a NULL a dictionary holds), whose limbs are 0. How many limbs is decided by the column's type: two
    for integers, four for a decimal128 (its 16-byte two's complement integer, whatever digits it holds: Arrow does
    not check a value against the declared precision)."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    null = column.is_null().to_numpy(zero_copy_only=False).astype(bool, copy=False)
    if not pa.types.is_decimal(column.type):
        words = [column.fill_null(0).cast(pa.int64()).to_numpy().astype(np.int64, copy=False)]
        scale = 1
    else:
        lows, highs = [], []
        for chunk in column.chunks:
            raw = np.frombuffer(chunk.buffers()[1], dtype=np.int64) if len(chunk) else np.zeros(0, dtype=np.int64)
            lows.append(raw[2 * chunk.offset:2 * (chunk.offset + len(chunk)):2])
            highs.append(raw[2 * chunk.offset + 1:2 * (chunk.offset + len(chunk)):2])
        words = [np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64) for parts in (lows, highs)]
        scale = 10**column.type.scale
    limbs = []
    for index, word in enumerate(words):
        word = np.where(null, 0, word)  # a NULL decimal's buffer may hold anything
        limbs.append(word & _LOW_BITS)
        high = word >> 32  # arithmetic shift: signed
        limbs.append(high if index == len(words) - 1 else high & _LOW_BITS)
    return limbs, null, scale


def _limb_totals(positions: np.ndarray, limbs: list[np.ndarray], partitions: int) -> list[np.ndarray]:
    """Per-partition sums of each limb (int64, exact for fewer than 2^31 rows), carried so that every limb but the
    last lies in [0, 2^32) again."""
    totals = []
    for limb in limbs:
        total = np.zeros(partitions, dtype=np.int64)
        np.add.at(total, positions, limb)
        totals.append(total)
    for index in range(len(totals) - 1):
        carry = totals[index] >> 32
        totals[index] = totals[index] & _LOW_BITS
        totals[index + 1] = totals[index + 1] + carry
    return totals


def grid_arithmetic(aggregate: Aggregate, component: str, column_type: pa.DataType) -> str:
    """How a component's partition totals are put on the grid: :data:`INT64` (long division in int64) or
    :data:`PYTHON_INT`, decided by the spec (grid, ``upstream.max_rows``) and the column's type alone, never by a
    value or the number of rows, so neighbouring tables always take the same path.

    :data:`INT64` needs an integer column (two limbs), a divisor ``d = p D < 2^31`` (grid ``p/q``, ``D`` 1) with
    ``(2 q + 1) d < 2^63``, and a ``max_rows`` below 2^61 (compared in int64); a decimal column (four limbs) is
    put on the grid with Python ints."""
    import pyarrow as pa

    kind = _plain_type(column_type)
    if pa.types.is_decimal(kind):
        return PYTHON_INT
    p, q = (1, 1) if component == "count" else (aggregate.grid.numerator, aggregate.grid.denominator)
    max_rows = aggregate.upstream.max_rows
    if p >= 2**31 or (2 * q + 1) * p >= 2**63 or (max_rows is not None and max_rows >= 2**61):
        return PYTHON_INT
    return INT64


def _units_int64(
    totals: list[np.ndarray], aggregate: Aggregate, component: str, seen: AggregateDiagnostics
) -> np.ndarray:
    """Two-limb totals ``t = hi 2^32 + lo`` (``lo`` in [0, 2^32)) of an integer column as grid integers, in int64
    only: ``floor(t / g + 1/2)`` for ``g = p/q`` is ``q a + floor((2 q r + p) / (2 p))`` with ``t = a p + r``,
    ``0 <= r < p``; ``a`` is found by long division of the limbs, and clipped where the result saturates anyway
    (the conditions of :func:`grid_arithmetic` keep every step within int64)."""
    low, high = totals
    p, q = (1, 1) if component == "count" else (aggregate.grid.numerator, aggregate.grid.denominator)
    if component == "count":
        negative = high < 0  # t < 0 exactly when its signed top limb is
        _count(seen.clamped, component, negative)
        low, high = np.where(negative, 0, low), np.where(negative, 0, high)
        max_rows = aggregate.upstream.max_rows
        if max_rows is not None:  # t > max_rows, with t = high 2^32 + low: compared limb by limb
            top, rest = divmod(max_rows, _LIMB)
            over = (high > top) | ((high == top) & (low > rest))
            seen.partitions_over_max_rows += int(np.count_nonzero(over))
    quotient_high, remainder_high = np.divmod(high, p)
    quotient_low, remainder = np.divmod(remainder_high * _LIMB + low, p)  # < p 2^32 < 2^63
    largest = 2**62 // q + 2  # q a beyond +-q largest: saturated whatever r is
    quotient_high = np.clip(quotient_high, -(largest // _LIMB + 2), largest // _LIMB + 2)
    quotient = np.clip(quotient_high * _LIMB + quotient_low, -largest, largest)
    units = q * quotient + (2 * q * remainder + p) // (2 * p)
    return _saturate(units, component, seen)


def _units_python(
    totals: list[np.ndarray], scale: int, aggregate: Aggregate, component: str, seen: AggregateDiagnostics
) -> np.ndarray:
    """Limb totals ``t / D`` (``t = sum(limbs[k] 2^(32 k))``) as grid integers with Python ints:
    ``floor(t / (D g) + 1/2)`` on grid ``g = p/q`` is ``floor((2 q t + p D) / (2 p D))``."""
    exact = np.zeros(len(totals[0]), dtype=object)
    for index, limb in enumerate(totals):
        exact = exact + limb.astype(object) * (1 << (32 * index))
    p, q = (1, 1) if component == "count" else (aggregate.grid.numerator, aggregate.grid.denominator)
    if component == "count":
        max_rows = aggregate.upstream.max_rows
        if max_rows is not None:
            seen.partitions_over_max_rows += int(np.count_nonzero(np.asarray(exact > max_rows * scale, dtype=bool)))
        if scale != 1:
            _count(seen.non_integer_counts, component, np.asarray(exact % scale != 0, dtype=bool))
        negative = np.asarray(exact < 0, dtype=bool)
        _count(seen.clamped, component, negative)
        exact = np.where(negative, 0, exact)
    units = (2 * q * exact + p * scale) // (2 * p * scale)  # floor(total / grid + 1/2), exactly
    return _saturate(units, component, seen)


def _count(counter: Any, component: str, mask: np.ndarray) -> None:
    """Add the number of True cells to ``counter[component]`` (no entry for none, as the row reader leaves it)."""
    found = int(np.count_nonzero(mask))
    if found:
        counter[component] += found


def _saturate(units: np.ndarray, component: str, seen: AggregateDiagnostics) -> np.ndarray:
    saturated = np.asarray((units >= SATURATION) | (units <= -SATURATION), dtype=bool)
    _count(seen.saturated, component, saturated)
    return np.clip(units, -SATURATION, SATURATION).astype(np.int64)


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
        values = table.column(column)
        if aggregate.releases_quantiles and column == aggregate.group_by[-1]:
            values = _into_end_bins(values, domain, seen)
        codes = _codes(values, domain)
        inside &= codes >= 0
        position = position * size + codes
    outside = np.flatnonzero(~inside)
    if len(outside):
        _outside_examples(aggregate, table, outside, seen)
    read = {component: _limbs(table.column(component)) for component in aggregate.components}
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
        limbs, _, scale = read[component]
        totals = _limb_totals(position, [limb[kept] for limb in limbs], partitions)
        if grid_arithmetic(aggregate, component, table.schema.field(component).type) == INT64:
            vectors[component] = _units_int64(totals, aggregate, component, seen)
        else:
            vectors[component] = _units_python(totals, scale, aggregate, component, seen)
    return key_domain(aggregate), vectors


def _into_end_bins(labels: pa.ChunkedArray, domain: list, seen: AggregateDiagnostics) -> pa.ChunkedArray:
    """A histogram's integer bin labels with those below the first bin's label counted in the first bin and those
    above the last's in the last (NULLs kept), as the row-by-row reader does
    (:func:`~dp_operators.release.inputs.into_end_bins`); counted in ``seen.labels_beyond_bins``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(labels.type):
        labels = labels.cast(labels.type.value_type)
    labels = labels.cast(pa.int64())
    low, high = pa.scalar(domain[0], pa.int64()), pa.scalar(domain[-1], pa.int64())
    beyond = pc.or_(pc.less(labels, low), pc.greater(labels, high))
    seen.labels_beyond_bins += int(pc.sum(beyond.cast(pa.int64())).as_py() or 0)
    return pc.min_element_wise(pc.max_element_wise(labels, low), high)


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
