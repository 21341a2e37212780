"""Contribution bounding enforced from raw rows: the aggregates a release noises, computed by the project itself from
a table and its privacy-unit column, so that the spec's ``contribution`` and ``bounds`` hold by construction rather
than by the upstream author's promise (docs/adr/0036).

For one aggregate of a spec, with L0 = ``max_partitions_contributed`` and Linf = ``max_contributions_per_partition``
(the aggregate's own ``contribution``, else the spec's), the bounded aggregation is, per run:

1. **Rows.** Rows whose privacy unit is NULL are dropped (they belong to no unit the bound could count). For a
   ``sum``, ``mean`` or ``variance``, rows whose value is no number are dropped: NULL, NaN on PostgreSQL, text or a
   blob on SQLite, anything but an int, float or decimal in pandas; each value is clipped to the spec's ``bounds``
   [L, U] and snapped to the spec's ``grid`` g as an integer k = round(clip(v) / g), then clamped to
   [ceil(L/g), floor(U/g)], so that k g lies in [L, U] whatever the rounding rule of the database (PostgreSQL rounds
   a double's ties to even, SQLite and ``NUMERIC`` away from zero: a per-row rule either way). A key is its text
   (``CAST(column AS VARCHAR)``; in pandas the text of the key the engine would read): rows are grouped by it, so
   two values the engine would read as one key are one partition here too. Over a public key domain, rows whose
   key text is not a key of the spec are dropped, so they use up none of a unit's L0 partitions, and a kept key is
   returned as the spec's own value. A quantile's histogram column holds values: a row whose value is no number is
   dropped, any other goes to its bin (values beyond the edges to the end bins), whose label is a public key, over
   public keys and under partition selection alike.
2. **Linf.** Per (unit, key), at most Linf rows are kept, chosen uniformly at random (``ROW_NUMBER() OVER
   (PARTITION BY unit, key ORDER BY random())``), never by the table's physical order. For a ``count`` the kept
   number is ``LEAST(COUNT(*), Linf)``, which has the same distribution whichever rows are chosen, and needs no sort.
3. **L0.** Per unit, at most L0 of its keys are kept, chosen uniformly at random (``ROW_NUMBER() OVER (PARTITION BY
   unit ORDER BY random())``). Skipped when L0 is at least the number of public partitions (no unit can exceed it):
   decided from the spec, never from the data; always applied under partition selection (the partitions are the
   data's).
4. **Per key:** ``count`` (kept rows), ``sum`` and ``sum_squares`` (of the kept k, exact integers), ``units``
   (units kept in the key), with the spec's ``group_by`` columns as they are in the table (a quantile's histogram
   column as the spec's bin labels). For a quantile under partition selection, ``units`` is instead its group's
   (the outer ``group_by`` key's): the units with at least one row kept, after steps 2 and 3, in any bin of the
   group, the same number on every row of the group. The selection keeps or drops whole groups by their noised
   number of distinct units, and that number has sensitivity 1 per group over at most L0 groups: one unit adds 1
   to each group it keeps a row in (however many bins it fills there), and it keeps rows in at most L0 cells, so
   in at most L0 groups. A cell's own units would not do: summed over a group's bins they count a unit once per
   bin it fills, and the largest of them can miss units of the group's other bins.

Each step is a function of one unit's own rows (and independent randomness), so adding or removing one unit with
any number of rows in any number of partitions changes at most L0 keys, each by at most Linf rows of values in
[L, U] (Wilson et al., "Differentially Private SQL with Bounded User Contribution", PoPETs 2020, section 3; Amin et
al., "Bounding User Contributions", ICML 2019): the sensitivity the release plan charges for. The random choice is
not part of the privacy argument (any per-unit choice is stable); it keeps the kept rows from being biased by the
table's order.

Exactness. Sums are of integers (grid units), so the database adds them exactly: PostgreSQL's ``SUM(bigint)`` is a
``NUMERIC``; SQLite's 64-bit ``SUM`` raises on overflow, so it adds the high and low 31 bits of each per-unit sum
separately (:data:`SPLIT_BITS`) and they are joined here, in Python integers. A per-unit sum of squares must fit
in 63 bits on SQLite and in pandas: Linf (max(|L|, |U|) / g)^2 < 2^62, checked from the spec before anything is read
(:func:`bounding_problem`). Values come back as exact ``Fraction`` s (k g), which the engine reads exactly.

Where it runs. :func:`bounded_select` builds the query with SQLAlchemy Core for any dialect SQLAlchemy knows
(PostgreSQL and SQLite are tested; the window functions and ``random()`` are standard in both, the differences are
``LEAST``/``GREATEST`` against SQLite's scalar ``MIN``/``MAX`` and the split sums), so the rows never leave the
database: one row per key comes back. :func:`bound_frame` does the same on a pandas DataFrame or an Arrow table (a
file source), with numpy's generator seeded from the operating system.

Everything that shapes the query (columns, bounds, grid, L0, Linf, public keys) is public: its text is recorded
with the charge by SHA-256 (:func:`bounded_sql_sha256`), so an auditor can re-create it from the spec and the
operator's arguments.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa

if TYPE_CHECKING:
    from dp_operators.spec import Aggregate, ReleaseSpec

__all__ = [
    "BoundedRowsSource",
    "bound_frame",
    "bounded_rows",
    "bounded_select",
    "bounded_sql",
    "bounded_sql_sha256",
    "bounding_problem",
    "declared_bounding",
    "enforced_bounding",
    "grid_range",
]

#: SQLite adds per-unit sums as their high part (``x >> SPLIT_BITS``) and low part (``x & (2^SPLIT_BITS - 1)``):
#: each term is below 2^31 in magnitude, so up to 2^32 units add up without overflowing 64 bits.
SPLIT_BITS = 31
#: The largest per-unit sum of squares (in grid^2 units) SQLite and pandas add in 64-bit integers.
MAX_INT64_PER_UNIT = 2**62

#: How a release's contribution bounds came to hold.
BoundingMode = Literal["enforced", "declared"]

# internal column labels of the generated query (never a table's column: the spec's names are identifiers and
# may not start with "dp_" ... they may; the labels are only used inside the subqueries, where they cannot clash
# with the spec's group_by names, which are taken from the source by their own label)
_UNIT, _VALUE, _RANK, _PARTITION_RANK = "dp_unit", "dp_value", "dp_row_rank", "dp_partition_rank"
_KEPT, _SUM, _SUM_SQUARES = "dp_kept", "dp_sum", "dp_sum_squares"
_GROUP_RANK = "dp_group_rank"


@dataclass(frozen=True)
class BoundedRowsSource:
    """Where the raw rows of a bounded aggregation are, and which columns mean what.

    Attributes:
        privacy_unit_column: the column naming the privacy unit (one person, household, aircraft...). Its values are
            compared for equality only: any type.
        table: a table name, optionally schema-qualified (``"public.flights"``), quoted as SQLAlchemy quotes it.
        query: instead of ``table``, a ``SELECT`` returning the raw rows (it becomes a subquery). The bounds are
            enforced on its rows, per value of its unit column: what the query does to the table before (joins,
            filters) is the author's, and recorded by the SHA-256 of the whole text.
        value_columns: aggregate name -> the column whose values a ``sum``, ``mean`` or ``variance`` adds.
    """

    privacy_unit_column: str
    table: str | None = None
    query: str | None = None
    value_columns: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if (self.table is None) == (self.query is None):
            raise ValueError("give exactly one of table (a table name) and query (a SELECT of raw rows)")
        if not self.privacy_unit_column:
            raise ValueError("privacy_unit_column is empty: name the column that identifies the privacy unit")

    @property
    def kind(self) -> str:
        """``"table"`` or ``"query"``: recorded with the charge."""
        return "table" if self.table is not None else "query"

    def value_column(self, aggregate: Aggregate) -> str | None:
        """The value column of ``aggregate`` (None for a count, or a quantile's histogram of counts)."""
        if aggregate.reads_counts:
            return None
        return (self.value_columns or {}).get(aggregate.name)


def bounding_problem(spec: ReleaseSpec, aggregate: Aggregate, value_column: str | None, *,
                     dialect: str | None = None) -> str | None:
    """Why ``aggregate`` cannot be bounded from raw rows, or None. Public parameters only (the spec, the operator's
    arguments, the dialect's name): checked when the DAG is parsed or before anything is read.

    * a ``sum``, ``mean`` or ``variance`` needs a value column;
    * a count takes none;
    * the grid must have a multiple in [L, U] (the snapped values stay inside the bounds);
    * a unit's sum within a key, Linf max(|ceil(L/g)|, |floor(U/g)|) grid units, must be below
      :data:`MAX_INT64_PER_UNIT` (every row's snapped value is a 64-bit integer, and so is a unit's sum);
    * on SQLite and in pandas (``dialect`` ``"sqlite"`` or ``"pandas"``) a unit's sum of squares within a key,
      Linf max(|ceil(L/g)|, |floor(U/g)|)^2, must be below :data:`MAX_INT64_PER_UNIT`.
    """
    if aggregate.reads_counts:
        if value_column is not None:
            return (f"aggregate {aggregate.name!r} is a {aggregate.kind}: it takes no value column (it counts rows; "
                    "drop it from value_columns)")
        return None
    if not value_column:
        return (f"aggregate {aggregate.name!r} is a {aggregate.kind}: give the column whose values it adds in "
                f"value_columns, e.g. value_columns={{{aggregate.name!r}: 'column'}}")
    low, high = grid_range(aggregate)
    if low > high:
        lower, upper = aggregate.bounds  # type: ignore[misc]
        return (f"aggregate {aggregate.name!r}: no multiple of the grid {float(aggregate.grid):g} lies in its bounds "
                f"[{float(lower):g}, {float(upper):g}]: use a finer grid or wider bounds")
    linf = spec.contribution_for(aggregate).max_contributions_per_partition
    if linf * max(abs(low), abs(high)) >= MAX_INT64_PER_UNIT:
        return (f"aggregate {aggregate.name!r}: one unit's sum within a key can reach "
                f"{linf * max(abs(low), abs(high)):.3g} grid units, beyond the 64-bit integers the bounded "
                "aggregation adds exactly: use a coarser grid or bounds nearer 0")
    if aggregate.kind == "variance" and dialect in ("sqlite", "pandas"):
        if linf * max(abs(low), abs(high)) ** 2 >= MAX_INT64_PER_UNIT:
            return (f"aggregate {aggregate.name!r}: one unit's sum of squares within a key can reach "
                    f"{linf * max(abs(low), abs(high)) ** 2:.3g} grid^2 units, beyond the 64-bit integers "
                    f"{'SQLite' if dialect == 'sqlite' else 'pandas'} adds exactly: use a coarser grid, bounds nearer "
                    "0, or PostgreSQL (which adds NUMERIC)")
    return None


def grid_range(aggregate: Aggregate) -> tuple[int, int]:
    """``(ceil(L / g), floor(U / g))``: the range of a snapped value, in grid units (exact)."""
    lower, upper = aggregate.exact_bounds  # type: ignore[misc]
    grid = Fraction(aggregate.grid)
    return math.ceil(lower / grid), math.floor(upper / grid)


# ---------------------------------------------------------------------------------------------------------- SQL


def bounded_select(spec: ReleaseSpec, aggregate: Aggregate, source: BoundedRowsSource, dialect: str) -> sa.Select:
    """The bounded aggregation of ``aggregate`` over ``source`` as a SQLAlchemy Core ``SELECT`` (module docstring).

    It returns one row per key: the keys as text (``dp_key_0``, ...), then ``dp_count``, ``dp_units`` and, for a
    ``sum``, ``mean`` or ``variance``, ``dp_sum`` and (variance) ``dp_sum_squares`` in grid units (grid^2 for
    squares); on SQLite each sum comes as two columns ``..._hi`` and ``..._lo`` (module docstring). Every label is
    the query's own, so no table column can shadow one. An ungrouped aggregate gives one row, also over an empty
    table (zeros). Read it with :func:`bounded_rows`.

    Keys are compared and grouped as the database's text of them (``CAST(column AS VARCHAR)``): a row is in a public
    key's partition when its text is the key as the spec writes it (an integer key column: ``17``; a date column:
    ``2013-01-05`` in PostgreSQL's ISO date style; a whole REAL on SQLite is ``17``; a ``NUMERIC`` with a scale on
    PostgreSQL spells ``17.0``, which matches no integer key);
    under partition selection the text is the published key. Values are read as numbers: a NULL (and on PostgreSQL
    a NaN) value drops its row, and on SQLite so does a value stored as text or a blob (``typeof``).

    For a quantile under partition selection ``dp_units`` is the row's group's number of units (module docstring,
    step 4): each (unit, group) pair's first kept cell is marked by ``ROW_NUMBER() OVER (PARTITION BY unit, outer
    keys)`` over the rows left by L0, and the cells' marks are added over the group, ``SUM(COUNT(marked)) OVER
    (PARTITION BY outer keys)`` after the ``GROUP BY`` of the cells (``COUNT(DISTINCT)`` is no window function on
    PostgreSQL). One pass over the kept rows: a join of the cells to a second aggregate of them by group would
    need a null-safe join for a NULL group key and, unless the database materialises the shared subquery, would
    draw the random choices of steps 2 and 3 twice.

    Args:
        dialect: the SQLAlchemy dialect name (``"postgresql"``, ``"sqlite"``, ...).

    Raises:
        ValueError: :func:`bounding_problem` (the message says how to fix it).
    """
    value_name = source.value_column(aggregate)
    problem = bounding_problem(spec, aggregate, value_name, dialect=dialect)
    if problem:
        raise ValueError(problem)
    contribution = spec.contribution_for(aggregate)
    l0, linf = contribution.max_partitions_contributed, contribution.max_contributions_per_partition
    columns = [source.privacy_unit_column, *aggregate.group_by] + ([value_name] if value_name else [])
    raw = _source(source, list(dict.fromkeys(columns)))
    unit = raw.c[source.privacy_unit_column]
    # a key is its text in the database, grouped and compared as such: two values with one text (SQLite's 1 and
    # '1') are one partition, as the engine reads them, and a public key is the spec's own value (bounded_rows)
    keys = [_key_text_sql(raw.c[column], dialect) for column in aggregate.group_by]
    conditions = [unit.is_not(None)]
    if aggregate.releases_quantiles:  # the histogram's column holds values: each row goes to its bin's label
        binned = raw.c[aggregate.bins.column]  # type: ignore[union-attr]
        conditions.extend(_is_number(binned, dialect))
        keys[-1] = _bin_label_sql(binned, aggregate, dialect)
    selected = [unit.label(_UNIT), *(key.label(_key_label(i)) for i, key in enumerate(keys))]
    if value_name:
        value = raw.c[value_name]
        conditions.extend(_is_number(value, dialect))
        selected.append(_snapped(value, aggregate, dialect).label(_VALUE))
    if aggregate.public_keys:
        for column, key in zip(aggregate.group_by, keys):
            public = [str(v) for v in aggregate.keys[column]]  # type: ignore[index]
            conditions.append(key.in_(public))
    rows = sa.select(*selected).where(*conditions).subquery("dp_rows")
    row_keys = [rows.c[_key_label(i)] for i in range(len(keys))]

    # Linf: per (unit, key), at most linf rows, chosen at random
    if value_name:
        rank = sa.func.row_number().over(partition_by=[rows.c[_UNIT], *row_keys], order_by=sa.func.random())
        ranked = sa.select(rows, rank.label(_RANK)).subquery("dp_ranked")
        ranked_keys = [ranked.c[_key_label(i)] for i in range(len(keys))]
        kept_value = ranked.c[_VALUE]
        aggregates = [sa.func.count().label(_KEPT), sa.func.sum(kept_value).label(_SUM)]
        if aggregate.kind == "variance":
            aggregates.append(sa.func.sum(_square(kept_value, dialect)).label(_SUM_SQUARES))
        groups = (sa.select(ranked.c[_UNIT], *ranked_keys, *aggregates)
                  .where(ranked.c[_RANK] <= linf)
                  .group_by(ranked.c[_UNIT], *ranked_keys)
                  .subquery("dp_groups"))
    else:
        kept = _least(sa.func.count(), sa.literal(linf, sa.Integer), dialect)
        groups = (sa.select(rows.c[_UNIT], *row_keys, kept.label(_KEPT))
                  .group_by(rows.c[_UNIT], *row_keys)
                  .subquery("dp_groups"))
    # L0: per unit, at most l0 keys, chosen at random (only when a unit could touch more)
    partitions = aggregate.partition_count
    if keys and (partitions is None or l0 < partitions):
        partition_rank = sa.func.row_number().over(partition_by=groups.c[_UNIT], order_by=sa.func.random())
        limited = sa.select(groups, partition_rank.label(_PARTITION_RANK)).subquery("dp_partitions")
        final, where = limited, [limited.c[_PARTITION_RANK] <= l0]
    else:
        final, where = groups, []
    if _units_per_group(aggregate):
        # a quantile's groups found in the data: every cell's units are its group's (docstring above)
        outer = [final.c[_key_label(i)] for i in range(len(keys) - 1)]
        first = sa.func.row_number().over(partition_by=[final.c[_UNIT], *outer])
        final = sa.select(final, first.label(_GROUP_RANK)).where(*where).subquery("dp_cells")
        where = []
    final_keys = [final.c[_key_label(i)] for i in range(len(keys))]
    outputs = list(final_keys)
    outputs.append(sa.func.coalesce(sa.func.sum(final.c[_KEPT]), 0).label(_output("count")))
    if _units_per_group(aggregate):
        marked = sa.func.count(sa.case((final.c[_GROUP_RANK] == 1, 1)))
        outputs.append(sa.func.sum(marked).over(partition_by=final_keys[:-1]).label(_output("units")))
    else:
        outputs.append(sa.func.count().label(_output("units")))
    sums = [_SUM] + ([_SUM_SQUARES] if aggregate.kind == "variance" else []) if value_name else []
    for internal in sums:
        outputs.extend(_exact_sum(final.c[internal], _output(_OUTPUT[internal]), dialect))
    query = sa.select(*outputs).select_from(final).where(*where)
    if final_keys:
        query = query.group_by(*final_keys)
    return query


def bounded_sql(spec: ReleaseSpec, aggregate: Aggregate, source: BoundedRowsSource, dialect: str) -> str:
    """The text of :func:`bounded_select` for ``dialect``, its constants inline (what runs, and what is hashed)."""
    compiled = bounded_select(spec, aggregate, source, dialect).compile(
        dialect=_dialect(dialect), compile_kwargs={"literal_binds": True})
    return str(compiled)


def bounded_sql_sha256(text: str) -> str:
    """SHA-256 (hex) of a query's text, as recorded with the charge."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def bounded_rows(aggregate: Aggregate, names: Sequence[str], rows: Sequence[Sequence]) -> list[dict[str, Any]]:
    """The rows of a bounded aggregation (:func:`bounded_select`'s result: column ``names``, ``rows`` as the
    driver returns them) as the engine's tabular rows: ``group_by`` values as they are (a public key, and a
    quantile's bin, as the spec's own value), ``count`` and ``units`` as ``int`` (a group's units for a quantile
    under partition selection: module docstring, step 4), ``sum`` and ``sum_squares`` as exact ``Fraction`` s in
    value units (k g, k g^2). Raises ``KeyError`` if a column is missing (a bug: the query names them all)."""
    position = {name: i for i, name in enumerate(names)}
    grid = Fraction(aggregate.grid)
    public = [_public_keys(aggregate, column) for column in aggregate.group_by]
    result = []
    for row in rows:
        record: dict[str, Any] = {}
        for i, (column, domain) in enumerate(zip(aggregate.group_by, public)):
            text = row[position[_key_label(i)]]
            record[column] = text if domain is None else domain[text]
        record["count"] = int(row[position[_output("count")]])
        record["units"] = int(row[position[_output("units")]])
        for name, scale in (("sum", grid), ("sum_squares", grid * grid)):
            if _output(name) in position:
                record[name] = _integer(row[position[_output(name)]]) * scale
            elif _output(name) + "_hi" in position:
                high, low = row[position[_output(name) + "_hi"]], row[position[_output(name) + "_lo"]]
                record[name] = ((_integer(high) << SPLIT_BITS) + _integer(low)) * scale
        result.append(record)
    return result


def _public_keys(aggregate: Aggregate, column: str) -> dict[str, Any] | None:
    """A public key column's keys by their text (the spec's own values), or None for a column whose keys are found
    in the data (partition selection). A quantile's bins are public under partition selection too: its histogram's
    column gives the spec's labels (integers), as over public keys."""
    if column not in (aggregate.keys or {}):
        return None
    return {str(value): value for value in aggregate.keys[column]}  # type: ignore[index]


def _units_per_group(aggregate: Aggregate) -> bool:
    """True when a row's ``units`` are its group's rather than its cell's: a quantile under partition selection,
    whose groups (the outer ``group_by`` keys) are selected by their noised number of units (module docstring)."""
    return aggregate.releases_quantiles and not aggregate.public_keys


def declared_bounding(source: str, sql: str | None = None) -> dict[str, Any]:
    """The record of an aggregate whose bounds its author declared (a hand-written query, a file of aggregates):
    ``source`` is ``"query"``, ``"file"`` or ``"upstream"``; ``sql`` the query's text, recorded by SHA-256."""
    return {"mode": "declared", "source": source, "privacy_unit_column": None,
            "sql_sha256": bounded_sql_sha256(sql) if sql is not None else None}


def enforced_bounding(source: str, privacy_unit_column: str, sql: str | None, *, parameters: Any = None,
                      uri: str | None = None, contribution: Any = None) -> dict[str, Any]:
    """The record of an aggregate the operator bounded itself (``source``: ``"table"``, ``"query"`` or
    ``"file"``), with the SHA-256 of the generated query (None for a file, bounded in pandas) and of the
    ``parameters`` bound to it (compact JSON after the query's text, when there are any), or the file's ``uri``;
    with ``contribution`` (the aggregate's :class:`~dp_operators.spec.ContributionBounds`), the L0 and Linf it
    enforced (``max_partitions_contributed``, ``max_contributions_per_partition``)."""
    record: dict[str, Any] = {"mode": "enforced", "source": source, "privacy_unit_column": privacy_unit_column,
                              "sql_sha256": None}
    if contribution is not None:
        record["max_partitions_contributed"] = contribution.max_partitions_contributed
        record["max_contributions_per_partition"] = contribution.max_contributions_per_partition
    if sql is not None:
        text = sql if parameters is None else sql + "\n" + json.dumps(parameters, sort_keys=True, default=str)
        record["sql_sha256"] = bounded_sql_sha256(text)
    if uri is not None:
        record["rows_uri"] = uri
    return record


_OUTPUT = {_SUM: "sum", _SUM_SQUARES: "sum_squares"}


def _key_label(index: int) -> str:
    return f"dp_key_{index}"


def _key_text_sql(column: Any, dialect: str) -> Any:
    """A key column as text: ``CAST(column AS VARCHAR)``; on SQLite a REAL value that is a whole number is the text
    of its integer (``17.0`` is ``17``, as the engine reads it: pandas writes an integer column holding a NULL as
    REAL), decided per value by ``typeof``."""
    text = sa.cast(column, sa.String)
    if dialect != "sqlite":
        return text
    whole = sa.cast(column, sa.BigInteger)
    return sa.case((sa.and_(sa.func.typeof(column) == "real", column == whole), sa.cast(whole, sa.String)),
                   else_=text)


def _bin_label_sql(value: Any, aggregate: Aggregate, dialect: str) -> Any:
    """The text of the label of the bin ``value`` falls in, by comparisons with the bins' edges only (no arithmetic
    on the value, so no rounding, overflow or cast can fail on one row): a balanced ``CASE`` tree over the inner
    edges, ``log2(m)`` comparisons a row. ``closed: left`` puts a value equal to an edge in the bin above it, ``right``
    in the bin below; values beyond the edges (infinities included) go to the first or last bin, as a histogram
    clipped upstream has them. Each edge is the double nearest it (an integer edge exactly), as pandas compares
    (:func:`_bin_labels`)."""
    bins = aggregate.bins  # type: ignore[union-attr]
    edges, labels = bins.exact_edges, [str(label) for label in bins.labels]

    def literal(edge: Fraction) -> Any:
        return sa.literal(int(edge), sa.BigInteger) if edge.denominator == 1 else sa.literal(float(edge), sa.Float)

    def below(index: int) -> Any:  # the value lies in a bin below bin ``index`` (whose lower edge is edges[index])
        edge = literal(edges[index])
        return value < edge if bins.closed == "left" else value <= edge

    def tree(low: int, high: int) -> Any:  # the label among bins low..high
        if low == high:
            return sa.literal(labels[low], sa.String)
        middle = (low + high + 1) // 2
        return sa.case((below(middle), tree(low, middle - 1)), else_=tree(middle, high))

    return tree(0, len(labels) - 1)


def _output(name: str) -> str:
    """The label of an output column (``count``, ``units``, ``sum``, ``sum_squares``)."""
    return f"dp_{name}"


def _is_number(value: Any, dialect: str) -> list[Any]:
    """The conditions keeping a row whose value is a number: not NULL; on PostgreSQL not NaN (which sorts above
    every number, so ``LEAST``/``GREATEST`` would make it the upper bound); on SQLite stored as an integer or a real
    (text sorts above every number there)."""
    conditions = [value.is_not(None)]
    if dialect == "postgresql":  # NaN > 'Infinity' (numeric NaN is cast to float8 NaN)
        conditions.append(sa.not_(value > sa.cast(sa.literal("Infinity"), sa.Float)))
    elif dialect == "sqlite":
        conditions.append(sa.func.typeof(value).in_(["integer", "real"]))
    return conditions


def _source(source: BoundedRowsSource, columns: list[str]) -> Any:
    named = [sa.column(column) for column in columns]
    if source.table is not None:
        schema, _, name = source.table.rpartition(".")
        return sa.table(name, *named, schema=schema or None)
    return sa.text(source.query).columns(*named).subquery("dp_source")  # type: ignore[arg-type]


def _dialect(name: str) -> sa.engine.Dialect:
    return sa.dialects.registry.load(name)()


def _least(a: Any, b: Any, dialect: str) -> Any:
    return sa.func.min(a, b) if dialect == "sqlite" else sa.func.least(a, b)


def _greatest(a: Any, b: Any, dialect: str) -> Any:
    return sa.func.max(a, b) if dialect == "sqlite" else sa.func.greatest(a, b)


def _number(value: Fraction) -> Any:
    """An exact literal where the fraction has a finite decimal form, else a float literal (it only sets where a
    value is clipped or snapped: any per-row rule is stable, module docstring)."""
    if value.denominator == 1:
        return sa.literal(int(value), sa.BigInteger)
    decimal = _finite_decimal(value)
    if decimal is not None:
        return sa.literal(decimal, sa.Numeric(asdecimal=True))
    return sa.literal(float(value), sa.Float)


def _finite_decimal(value: Fraction) -> Decimal | None:
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return None
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    return Decimal(int(value * 10**digits)).scaleb(-digits)


def _snapped(value: Any, aggregate: Aggregate, dialect: str) -> Any:
    """k = clamp(round(clip(v, L, U) / g), ceil(L/g), floor(U/g)), an integer (module docstring)."""
    lower, upper = aggregate.exact_bounds  # type: ignore[misc]
    clipped = _least(_greatest(value, _number(lower), dialect), _number(upper), dialect)
    grid = Fraction(aggregate.grid)
    scaled = clipped * sa.literal(1.0, sa.Float) if dialect == "sqlite" else clipped  # SQLite: no integer division
    if grid != 1:
        scaled = scaled / _number(grid)
    snapped = sa.cast(sa.func.round(scaled), sa.BigInteger)
    low, high = grid_range(aggregate)
    return _least(_greatest(snapped, sa.literal(low, sa.BigInteger), dialect),
                  sa.literal(high, sa.BigInteger), dialect)


def _square(value: Any, dialect: str) -> Any:
    if dialect == "sqlite":  # bounded by MAX_INT64_PER_UNIT (bounding_problem)
        return value * value
    return sa.cast(value, sa.Numeric) * value  # no 64-bit overflow: NUMERIC


def _exact_sum(column: Any, name: str, dialect: str) -> list[Any]:
    if dialect == "sqlite":  # SUM(INTEGER) raises on overflow: add the two halves (module docstring)
        high = sa.func.coalesce(sa.func.sum(column.op(">>")(SPLIT_BITS)), 0).label(f"{name}_hi")
        low = sa.func.coalesce(sa.func.sum(column.op("&")(2**SPLIT_BITS - 1)), 0).label(f"{name}_lo")
        return [high, low]
    return [sa.func.coalesce(sa.func.sum(column), 0).label(name)]


def _integer(value: Any) -> int:
    """An integer the database returned (int, or an integral Decimal from PostgreSQL's NUMERIC sums)."""
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    raise TypeError(f"the bounded aggregation returned a {type(value).__name__} where an integer sum was expected")


# ------------------------------------------------------------------------------------------------------- pandas


def _bin_labels(values: Any, aggregate: Aggregate) -> Any:
    """The text of the bin label of each value (binary64), as :func:`_bin_label_sql` assigns them."""
    import numpy as np

    bins = aggregate.bins  # type: ignore[union-attr]
    inner = np.array([float(edge) for edge in bins.exact_edges[1:-1]])
    index = np.searchsorted(inner, values, side="right" if bins.closed == "left" else "left")
    labels = np.array([str(label) for label in bins.labels], dtype=object)
    return labels[index]


def bound_frame(spec: ReleaseSpec, aggregate: Aggregate, frame: Any, privacy_unit_column: str,
                value_column: str | None, *, seed: int | None = None) -> list[dict[str, Any]]:
    """The bounded aggregation of ``aggregate`` over a pandas DataFrame or an Arrow table of raw rows, with the same
    steps and result as the SQL (:func:`bounded_select`, read by :func:`bounded_rows`): one dict per key with the
    ``group_by`` values, ``count``, ``units`` (a group's for a quantile under partition selection), and
    ``sum``/``sum_squares`` as exact ``Fraction`` s.

    The random choices use numpy's PCG64 generator seeded from ``secrets`` (``seed`` fixes it, for tests only).
    Values are clipped and snapped in binary64 (the rounding only decides which grid point a value goes to: any
    per-row rule is stable); NaN is a missing value (dropped), +-inf is clipped.

    Raises:
        ValueError: :func:`bounding_problem`, or a column the table does not have (named, with the table's columns).
    """
    import numpy as np
    import pandas as pd

    problem = bounding_problem(spec, aggregate, value_column, dialect="pandas")
    if problem:
        raise ValueError(problem)
    if not isinstance(frame, pd.DataFrame):  # an Arrow table
        frame = frame.to_pandas()
    needed = list(dict.fromkeys([privacy_unit_column, *aggregate.group_by] + ([value_column] if value_column else [])))
    missing = [column for column in needed if column not in frame.columns]
    if missing:
        raise ValueError(f"the rows have no column(s) {missing} (they have {list(map(str, frame.columns))}); name "
                         "the privacy-unit, group_by and value columns as the table does")
    rng = np.random.default_rng(secrets.randbits(128) if seed is None else seed)
    contribution = spec.contribution_for(aggregate)
    l0, linf = contribution.max_partitions_contributed, contribution.max_contributions_per_partition
    rows = frame[needed]
    keep = rows[privacy_unit_column].notna().to_numpy(dtype=bool).copy()
    data = pd.DataFrame({"unit": rows[privacy_unit_column].to_numpy()})
    for i, column in enumerate(aggregate.group_by):
        if aggregate.releases_quantiles and i == len(aggregate.group_by) - 1:  # values to their bins' labels
            binned = _frame_numbers(rows[column])
            keep &= ~np.isnan(binned)
            data[f"key_{i}"] = _bin_labels(np.where(np.isnan(binned), 0.0, binned), aggregate)
            continue
        # each key as the engine reads it, as text: decided per value, never by the column's dtype (an int column
        # holding one NULL is float64 in pandas; its 17.0 is the key 17)
        texts = _key_texts(rows[column], column)
        if aggregate.public_keys:
            public = _public_keys(aggregate, column)
            keep &= texts.isin(list(public)).to_numpy(dtype=bool)  # type: ignore[arg-type]
        data[f"key_{i}"] = texts.to_numpy(dtype=object)
    if value_column:
        values = _frame_numbers(rows[value_column])
        keep &= ~np.isnan(values)
        lower, upper = aggregate.exact_bounds  # type: ignore[misc]
        low, high = grid_range(aggregate)
        clipped = np.clip(values, float(lower), float(upper))
        snapped = np.rint(np.where(np.isnan(clipped), 0.0, clipped) / float(Fraction(aggregate.grid)))
        data["k"] = np.clip(snapped, low, high).astype(np.int64)
    data = data[keep]
    keys = [f"key_{i}" for i in range(len(aggregate.group_by))]
    by = ["unit", *keys]
    data = data.iloc[rng.permutation(len(data))]  # a uniformly random order: the first linf rows of a group
    if value_column:
        data = data[data.groupby(by, sort=False, dropna=False).cumcount() < linf]
        data = data.assign(k2=data["k"] * data["k"]) if aggregate.kind == "variance" else data
        sums = {"kept": ("k", "size"), "sum": ("k", "sum")}
        if aggregate.kind == "variance":
            sums["sum_squares"] = ("k2", "sum")
        groups = data.groupby(by, sort=False, dropna=False).agg(**sums).reset_index()
    else:
        groups = data.groupby(by, sort=False, dropna=False).size().rename("kept").reset_index()
        groups["kept"] = np.minimum(groups["kept"].to_numpy(), linf)
    partitions = aggregate.partition_count
    if keys and (partitions is None or l0 < partitions):
        groups = groups.iloc[rng.permutation(len(groups))]
        groups = groups[groups.groupby("unit", sort=False).cumcount() < l0]
    sum_names = [name for name in ("sum", "sum_squares") if name in groups.columns]
    for name in sum_names:  # 64-bit per unit; added as two halves, joined in Python integers
        column = groups[name].to_numpy(dtype=np.int64)
        groups[f"{name}_hi"] = column >> SPLIT_BITS
        groups[f"{name}_lo"] = column & (2**SPLIT_BITS - 1)
    named = {"kept": ("kept", "sum"), "units": ("unit", "size")}
    if _units_per_group(aggregate):  # each (unit, group) pair's first kept cell, added over the group below
        groups = groups.assign(first=~groups.duplicated(subset=["unit", *keys[:-1]]))
        named["units"] = ("first", "sum")
    for name in sum_names:
        named[f"{name}_hi"] = (f"{name}_hi", "sum")
        named[f"{name}_lo"] = (f"{name}_lo", "sum")
    if keys:
        totals = groups.groupby(keys, sort=True, dropna=False).agg(**named).reset_index()
        if _units_per_group(aggregate):  # a cell's units are its group's: the units with a kept row in the group
            totals["units"] = totals.groupby(keys[:-1], sort=False, dropna=False)["units"].transform("sum")
    else:
        totals = pd.DataFrame([{name: groups[column].sum() if agg == "sum" else len(groups)
                                for name, (column, agg) in named.items()}])
    grid = Fraction(aggregate.grid)
    public_keys = [_public_keys(aggregate, column) for column in aggregate.group_by]
    result = []
    for record in totals.to_dict("records"):
        row: dict[str, Any] = {}
        for column, key, domain in zip(aggregate.group_by, keys, public_keys):
            text = _python(record[key])
            row[column] = text if domain is None else domain[text]
        row["count"] = int(record["kept"])
        row["units"] = int(record["units"])
        for name, scale in (("sum", grid), ("sum_squares", grid * grid)):
            if name in sum_names:
                row[name] = ((int(record[f"{name}_hi"]) << SPLIT_BITS) + int(record[f"{name}_lo"])) * scale
        if value_column and "sum" not in row:  # no rows at all
            row["sum"] = Fraction(0)
            if aggregate.kind == "variance":
                row["sum_squares"] = Fraction(0)
        result.append(row)
    return result


def _key_text(value: Any, column: str) -> str | None:
    """A raw key as text, as the engine would read it (:func:`~dp_operators.release.upstream_types.normalise_key`:
    an integral float or decimal is its integer, a NaN or NA is missing); None for a missing key or one no release
    can publish (its row then belongs to no public key, and under partition selection to the NULL key)."""
    from dp_operators.release.upstream_types import InputTypeError, normalise_key

    try:
        key = normalise_key(value, column)
    except InputTypeError:  # a bool or a type no key can have: no key, decided for this value alone
        return None
    return str(key) if isinstance(key, (str, int)) else None


def _key_texts(values: Any, column: str) -> Any:
    """:func:`_key_text` of every value of a key column (a Series of object), computed once per distinct value in a
    column of one type; per value in an ``object`` column, where distinct values can compare equal across types
    (``True == 1``) and one of them would decide the other's text."""
    import pandas as pd

    if values.dtype == object:
        return values.map(lambda value: _key_text(value, column)).astype(object)
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    texts = [_key_text(value, column) for value in uniques]
    mapped = [texts[code] if code >= 0 else None for code in codes.tolist()]
    return pd.Series(mapped, index=values.index, dtype=object)


def _frame_numbers(column: Any) -> Any:
    """A value column as float64, NaN where a value is missing or not a number. A numeric dtype converts as it is;
    in an object column only int, float and Decimal values are numbers (text is not, as on SQLite), each decided by
    its own type."""
    import numpy as np
    import pandas as pd

    if pd.api.types.is_numeric_dtype(column.dtype) and not pd.api.types.is_bool_dtype(column.dtype):
        return column.astype("float64").to_numpy(dtype=np.float64, na_value=np.nan)
    return np.array([_as_float(v) for v in column], dtype=np.float64)


def _as_float(value: Any) -> float:
    """One object-column value as a float, NaN if it is not a number (by its type) or a signalling NaN."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, Decimal, np.integer, np.floating)):
        return float("nan")
    try:
        return float(value)
    except (ValueError, OverflowError):  # Decimal('sNaN'); an int beyond float range is clipped as infinity below
        return float("nan") if isinstance(value, Decimal) else (float("inf") if value > 0 else float("-inf"))


def _python(value: Any) -> Any:
    """A numpy scalar as the Python value (a key: int, str...), as a database driver would return it."""
    return value.item() if hasattr(value, "item") else value
