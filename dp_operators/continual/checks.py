"""What a series step checks of its spec and its upstream before anything is charged: the spec is one this version
releases, the upstream's running sums are integers by type, and the upstream counts from the series' start. Types
and public metadata only, never a value (DESIGN.md 2). ADR 33.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dp_operators.continual.plan import plan_spec_series
from dp_operators.release import columns
from dp_operators.release.errors import ReleaseConfigError, ReleaseInputError
from dp_operators.release.rows_file import INLINE_ROWS_LIMIT
from dp_operators.spec import ReleaseSpec


def _is_integer(value: Any) -> bool:
    return value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)))


def _integer_column(field_type: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_integer(field_type) or pa.types.is_null(field_type)
            or (pa.types.is_decimal(field_type) and field_type.scale <= 0))


def check_integer_totals(spec: ReleaseSpec, upstream: Any) -> None:
    """Refuse, by type, a series' running totals that are not integers, in every shape the engine reads: a table's
    ``count`` or ``sum`` column must be an integer type (or a decimal of scale 0), each row's field (a list of rows,
    several ungrouped rows) and an ungrouped value an ``int`` or numpy integer (``None`` follows ``non_finite``).
    They are then read exactly, never rounded: rounding a running total (a float count near 2^53, a decimal sum)
    does not commute with adding one unit's contribution, which would then move the totals at more steps than the
    unit's. Types only: no value decides it.

    Raises:
        ReleaseInputError: a total of another type (the message names the aggregate and the type).
    """
    if not isinstance(upstream, Mapping):
        return  # prepare_inputs names the shape problem

    def refuse(aggregate: str, kind: str, found: str) -> ReleaseInputError:
        how = ("return the counts as integers (COUNT(*) is one; cast a float or decimal count upstream)"
               if kind == "count" else
               "round each value to an integer and keep it within the (integer) bounds before summing, e.g. "
               "SUM(LEAST(GREATEST(ROUND(x), lo), hi)), and return the sums as integers")
        return ReleaseInputError(
            f"aggregate {aggregate!r}: a series' running {kind} holds {found}, not an integer: a series reads its "
            f"running totals exactly. {how[0].upper()}{how[1:]} (docs/continual.md)")

    for aggregate in spec.aggregates:
        field = aggregate.kind  # a series releases counts and sums, one component each
        if aggregate.name not in upstream:
            continue
        given = upstream[aggregate.name]
        if columns.is_table(given):
            if field in given.schema.names and not _integer_column(given.schema.field(field).type):
                raise refuse(aggregate.name, field, f"a column of type {given.schema.field(field).type}")
        elif isinstance(given, Sequence) and not isinstance(given, (str, bytes)):
            for row in given:
                if isinstance(row, Mapping) and not _is_integer(row.get(field)):
                    raise refuse(aggregate.name, field, f"a {type(row.get(field)).__name__}")
        elif not isinstance(given, Mapping) and not _is_integer(given):
            raise refuse(aggregate.name, field, f"a {type(given).__name__}")


#: The entry of the upstream's mapping saying where its running totals count from
#: (:func:`dp_operators.operators.series_upstream.series_totals`); ``__dp_`` names are the project's own.
COUNTED_FROM_KEY = "__dp_series_counted_from__"


def counted_as_declared(spec: ReleaseSpec, upstream: Any, counted_from: str) -> Any:
    """The upstream's totals without :data:`COUNTED_FROM_KEY`, once the start it declares is the series' (public
    metadata, never data). Required when the spec may start a new series (``after_horizon: new_series``), whose
    totals must restart at its first step; checked whenever given.

    Raises:
        ReleaseInputError: the declaration is missing where required, or names another start (a hand-written
            upstream counting from a fixed date, or a stale one).
    """
    declared = upstream.get(COUNTED_FROM_KEY) if isinstance(upstream, Mapping) else None
    if declared is None:
        if spec.series is not None and spec.series.after_horizon == "new_series":
            raise ReleaseInputError(
                f"release {spec.release!r} may start a new series (after_horizon: new_series), so its upstream must "
                f"say where its running totals count from: return series_totals(totals, series_start(...)) "
                f"(dp_operators.operators.series_upstream); this step's series counts from {counted_from}")
        return upstream
    try:
        same = dt.datetime.fromisoformat(str(declared)) == dt.datetime.fromisoformat(counted_from)
    except ValueError:
        same = False
    if not same:
        raise ReleaseInputError(
            f"release {spec.release!r}: the upstream's running totals count from {str(declared)[:40]!r}, but this "
            f"step's series counts from {counted_from}: count from series_start(...) "
            "(dp_operators.operators.series_upstream), or clear the upstream task too if its result is stale")
    return {name: value for name, value in upstream.items() if name != COUNTED_FROM_KEY}


def check_releasable(spec: ReleaseSpec) -> None:
    """Refuse a series spec this version cannot release, from the spec alone (the operator calls it at DAG import).

    Raises:
        ReleaseConfigError: no ``series`` block, a sum off grid 1 or of binary64
            arithmetic (a running sum read from upstream must be an integer, ADR 33), or more cells than a series
            publishes inline.
    """
    if spec.series is None:
        raise ReleaseConfigError(f"release {spec.release!r} declares no series")
    sums = [a.name for a in spec.aggregates if a.kind == "sum" and (
        a.grid != 1 or a.upstream.arithmetic != "exact" or any(b.denominator != 1 for b in a.exact_bounds))]
    if sums:
        raise ReleaseConfigError(
            f"release {spec.release!r}: series sums ({', '.join(sums)}) are released on grid 1, with integer bounds, "
            "from integer running sums only (a running sum rounded to a finer grid, or a binary64 one, moves at "
            "more steps than its unit's contributions): declare grid: 1 and integer bounds, and have the upstream "
            "round each value to an integer and clip it to the bounds before summing")
    cells = sum(a.partition_count or 1 for a in spec.aggregates)
    if cells > INLINE_ROWS_LIMIT:
        raise ReleaseConfigError(
            f"release {spec.release!r}: a series publishes its {cells} cells inline, at most {INLINE_ROWS_LIMIT} "
            "(rows files are not released for series yet): split it into several series")
    plan_spec_series(spec)
