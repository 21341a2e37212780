"""The neighbour harness: one release on two neighbouring inputs, through every upstream representation and several
summation orders, checked against the plan (DESIGN.md 2.4 and 2.6).

A *case* is a spec and two lists of per-person rows ``(key, value)``: ``base`` and ``base`` plus one privacy unit.
The harness plays the upstream: it adds up each partition's values itself, in an order it chooses (left to right,
reversed, sorted, numpy's pairwise sum, fsum, chunked as a database does), and hands the sums over in one of the
representations an upstream task produces:

* ``float``, ``numpy``: a list of row mappings holding Python floats or numpy float64 sums;
* ``pandas``: the same rows as ``DataFrame.to_dict("records")`` gives them;
* ``arrow``: a :class:`pyarrow.Table` (the engine's columnar reader);
* ``sql``: a ``GROUP BY`` query over SQLite through :func:`~dp_operators.operators.sources.query_aggregates`;
* ``parquet``: a Parquet file of the rows through :func:`~dp_operators.operators.sources.read_reference`;
* ``decimal``, ``int``: exact sums (``Decimal``, or integers for counts and integer values).

Two checks, each over every representation and order pair:

* :func:`assert_within_plan`: the grid integers the engine reads from the two neighbours differ, over all
  partitions, by no more than the plan's Linf (each partition), L1 and L2 (the step's sensitivities), so the noise
  covers them;
* :func:`assert_same_outcome`: the engine either reads both or refuses both with the same message (a refusal that
  one person flips is a one-bit release).

:func:`observe` (used by ``tests/release_engine/test_release_neighbours.py``) compares everything else an observer
sees of a whole release: logs, the refusal's text, the published output without its noised parts, ledger rows.
"""

from __future__ import annotations

import itertools
import math
import random
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from dp_operators.release.inputs import prepare_inputs
from dp_operators.release.plan import plan_release
from dp_operators.spec import ReleaseSpec

Rows = Sequence[tuple[Any, Any]]


def _left_to_right(values: list[float]) -> float:
    total = 0.0
    for value in values:
        total += value
    return total


def _chunked(values: list[float], size: int = 3) -> float:
    """Partial sums of chunks, then their sum: what a parallel database plan does."""
    return _left_to_right([_left_to_right(values[i:i + size]) for i in range(0, len(values), size)])


def _extreme(values: list[float], pick: Callable) -> float:
    """The smallest or largest left-to-right float sum over every row order (all permutations up to 7 values,
    else 5,000 seeded shuffles): the adversary of docs/adr/0017 picks the order."""
    if len(values) <= 7:
        orders: Iterable = itertools.permutations(values)
    else:
        generator = random.Random(len(values))
        orders = (generator.sample(values, len(values)) for _ in range(5000))
    return pick(_left_to_right(list(order)) for order in orders)


#: Summation orders an upstream may use; each maps the partition's float values to a float sum.
SUMMATION_ORDERS: dict[str, Callable[[list[float]], float]] = {
    "left to right": _left_to_right,
    "reversed": lambda values: _left_to_right(values[::-1]),
    "ascending": lambda values: _left_to_right(sorted(values)),
    "descending": lambda values: _left_to_right(sorted(values, reverse=True)),
    "numpy pairwise": lambda values: float(np.sum(np.array(values, dtype=np.float64))) if values else 0.0,
    "fsum": math.fsum,
    "chunked": _chunked,
    "smallest over row orders": lambda values: _extreme(values, min),
    "largest over row orders": lambda values: _extreme(values, max),
}


@dataclass(frozen=True)
class Case:
    """A spec of one aggregate (``a``, grouped by ``g`` or not) and its neighbouring rows."""

    spec: ReleaseSpec
    base: Rows
    neighbour: Rows

    @property
    def aggregate(self):
        return self.spec.aggregates[0]


def _partitions(case: Case, rows: Rows) -> dict[Any, list[Any]]:
    grouped: dict[Any, list[Any]] = {}
    for key, value in rows:
        grouped.setdefault(key, []).append(value)
    return grouped


def _fields(kind: str, values: list[Any], order: Callable[[list[float]], float], exact: bool) -> dict[str, Any]:
    """The upstream fields of one partition from its values, summed in ``order`` (floats) or exactly."""
    count = len(values)
    if kind == "count":
        return {"count": count}
    if exact:
        total = sum(values, start=type(values[0])(0)) if values else 0
        squares = sum((v * v for v in values), start=type(values[0])(0)) if values else 0
    else:
        floats = [float(v) for v in values]
        total = order(floats)
        squares = order([v * v for v in floats])
    out = {"sum": total}
    if kind in ("mean", "variance"):
        out["count"] = count
    if kind == "variance":
        out["sum_squares"] = squares
    return out


def upstream_rows(case: Case, rows: Rows, order: str = "left to right", *, exact: bool = False) -> list[dict]:
    """The upstream's grouped rows (one per partition present) for ``rows``, float sums in ``order``."""
    aggregate = case.aggregate
    summed = SUMMATION_ORDERS[order]
    out = []
    for key, values in _partitions(case, rows).items():
        fields = _fields(aggregate.kind, values, summed, exact)
        out.append({"g": key, **fields} if aggregate.group_by else fields)
    return out


def represent(case: Case, rows: list[dict], representation: str, tmp_path: Path) -> dict[str, Any]:
    """The upstream mapping ``{"a": ...}`` for ``rows`` as ``representation`` hands it over (module docstring)."""
    aggregate = case.aggregate
    grouped = bool(aggregate.group_by)
    value_columns = [c for c in ("count", "sum", "sum_squares") if rows and c in rows[0]] or ["count"]
    if representation in ("float", "decimal", "int"):
        plain = rows
    elif representation == "numpy":
        plain = [{k: (np.float64(v) if k != "g" and isinstance(v, float) else v) for k, v in row.items()}
                 for row in rows]
    elif representation == "pandas":
        import pandas as pd

        frame = pd.DataFrame(rows, columns=(["g"] if grouped else []) + value_columns)
        plain = frame.to_dict("records")
    elif representation == "arrow":
        import pyarrow as pa

        table = pa.Table.from_pylist(rows) if rows else pa.table({c: pa.array([], pa.float64()) for c in value_columns})
        return {"a": table if grouped else _ungrouped(aggregate, table.to_pylist())}
    elif representation == "sql":
        return _through_sql(case, rows, value_columns)
    elif representation == "parquet":
        return _through_parquet(case, rows, value_columns, tmp_path)
    else:
        raise ValueError(representation)
    return {"a": plain if grouped else _ungrouped(aggregate, plain)}


def _ungrouped(aggregate, rows: list[dict]) -> Any:
    """An ungrouped upstream value: the only row (or the empty aggregate), as a number or a mapping."""
    row = rows[0] if rows else {"count": 0, "sum": None, "sum_squares": None}
    if aggregate.kind == "count":
        return row.get("count", 0)
    if aggregate.kind == "sum":
        return row.get("sum")
    return {c: row.get(c) for c in aggregate.components}


class _SQLiteHook:
    """Anything with a DB-API ``get_conn()`` is a hook to :func:`query_aggregates`."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def get_conn(self) -> sqlite3.Connection:
        return self.connection


def _through_sql(case: Case, rows: list[dict], value_columns: list[str]) -> dict[str, Any]:
    """The rows stored as a table whose values are the partition sums, read back by a ``GROUP BY`` query (the sum
    of one row per key is that row: the harness chose the summation order, not SQLite)."""
    from dp_operators.operators.sources import query_aggregates

    connection = sqlite3.connect(":memory:")
    grouped = bool(case.aggregate.group_by)
    columns = (["g"] if grouped else []) + value_columns
    connection.execute(f"CREATE TABLE t ({', '.join(columns)})")
    connection.executemany(
        f"INSERT INTO t VALUES ({', '.join('?' for _ in columns)})",
        [tuple(_sqlite_value(row.get(c)) for c in columns) for row in rows],
    )
    selected = ", ".join(f"SUM({c}) AS {c}" for c in value_columns)
    query = f"SELECT g, {selected} FROM t GROUP BY g" if grouped else f"SELECT {selected} FROM t"
    hook = _SQLiteHook(connection)
    return query_aggregates(hook, {"a": query}, case.spec)


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # SQLite has no decimal type; a text sum would be read back as a float
    if isinstance(value, np.floating):
        return float(value)
    return value


def _through_parquet(case: Case, rows: list[dict], value_columns: list[str], tmp_path: Path) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dp_operators.operators.sources import read_reference

    path = tmp_path / "rows.parquet"  # one name: a refusal quotes it, and both neighbours must read the same
    columns = (["g"] if case.aggregate.group_by else []) + value_columns
    table = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows]) if rows else None
    if table is None:
        table = pa.table({c: pa.array([], pa.string() if c == "g" else pa.float64()) for c in columns})
    pq.write_table(table, path)
    return read_reference(str(path), case.spec)


def read_outcome(case: Case, aggregates: dict[str, Any]) -> tuple[str, Any]:
    """``("read", {(component): {key: grid integer}})`` or ``("refused", message)``: what the engine makes of it."""
    from airflow.sdk.exceptions import AirflowFailException

    from dp_operators.release.errors import ReleaseConfigError, ReleaseInputError

    try:
        prepared = prepare_inputs(case.spec, aggregates)
    except (ReleaseInputError, ReleaseConfigError, AirflowFailException) as refusal:
        return "refused", f"{type(refusal).__name__}: {refusal}"
    keys = list(prepared.keys[case.aggregate.name])
    vectors = {}
    for (name, component), vector in prepared.values.items():
        vectors[component] = {tuple(key): int(units) for key, units in zip(keys, vector.tolist())}
    return "read", vectors


def outcome(case: Case, rows: Rows, representation: str, order: str, tmp_path: Path) -> tuple[str, Any]:
    """The engine's reading of ``rows`` handed over as ``representation`` with float sums in ``order``; a
    refusal of the source itself (a SQL or file reader) counts as the engine's."""
    from airflow.sdk.exceptions import AirflowFailException

    # the upstream sums exact values exactly (integers, Decimal) whatever the representation carries them
    exact = representation in ("decimal", "int") or all(not isinstance(v, float) for _, v in rows)
    try:
        aggregates = represent(case, upstream_rows(case, rows, order, exact=exact), representation, tmp_path)
    except AirflowFailException as refusal:
        return "refused", f"{type(refusal).__name__}: {refusal}"
    return read_outcome(case, aggregates)


@dataclass(frozen=True)
class Distance:
    """The distance between two readings of one component, in grid units, over all partitions."""

    linf: int
    l1: int
    l2_squared: int


def distance(first: dict, second: dict) -> Distance:
    keys = set(first) | set(second)
    gaps = [abs(first.get(k, 0) - second.get(k, 0)) for k in keys]
    return Distance(max(gaps, default=0), sum(gaps), sum(g * g for g in gaps))


def assert_same_outcome(case: Case, representations: Iterable[str], orders: Iterable[str], tmp_path: Path) -> str:
    """Both neighbours are read, or both refused with the same message, in every representation and order;
    returns the common kind of outcome (``read`` or ``refused``)."""
    kinds = set()
    for representation in representations:
        for order in orders:
            first = outcome(case, case.base, representation, order, tmp_path)
            second = outcome(case, case.neighbour, representation, order, tmp_path)
            assert first[0] == second[0], (representation, order, first, second)
            if first[0] == "refused":
                assert first[1] == second[1], (representation, order)
            kinds.add(first[0])
    assert len(kinds) == 1, kinds
    return kinds.pop()


def assert_within_plan(
    case: Case, representations: Iterable[str], orders: Sequence[str], tmp_path: Path
) -> dict[str, Distance]:
    """For every representation and every pair of summation orders (the adversary picks each neighbour's order),
    the neighbours' grid integers differ by at most the plan's Linf in each partition and its L1 and L2 over all
    partitions. Returns the largest distance seen per component."""
    plan = plan_release(case.spec)
    largest: dict[str, Distance] = {}
    for representation in representations:
        readings = {
            (which, order): outcome(case, rows, representation, order, tmp_path)
            for which, rows in (("base", case.base), ("neighbour", case.neighbour))
            for order in orders
        }
        for first_order in orders:
            for second_order in orders:
                first, second = readings[("base", first_order)], readings[("neighbour", second_order)]
                assert first[0] == second[0] == "read", (representation, first, second)
                for component, values in first[1].items():
                    if component == "selection":
                        continue
                    step = plan.step(case.aggregate.name, component)
                    gap = distance(values, second[1][component])
                    where = (representation, first_order, second_order, component, gap)
                    assert gap.linf <= max(step.linf, _untouched(step)), where
                    assert gap.l1 <= step.l1_sensitivity, where
                    assert gap.l2_squared <= step.l2_sensitivity_squared, where
                    seen = largest.get(component, Distance(0, 0, 0))
                    largest[component] = Distance(max(seen.linf, gap.linf), max(seen.l1, gap.l1),
                                                  max(seen.l2_squared, gap.l2_squared))
    return largest


def _untouched(step) -> int:
    return int(getattr(step, "untouched_allowance", 0) or 0)


def as_fraction(value: Any) -> Fraction:
    return Fraction(value) if not isinstance(value, float) else Fraction(*value.as_integer_ratio())
