"""Aggregates the operators compute themselves from raw rows, bounding every privacy unit's contribution as the
spec says (:mod:`dp_operators.release.bounding`): from a table or a ``SELECT`` through a ``common.sql`` hook
(:func:`bounded_sql_aggregates`: the query runs in the database, one row per key comes back), or from a CSV or
Parquet file of rows (:func:`bounded_file_aggregates`: pandas on the worker). Both return the mapping
:func:`dp_operators.release.prepare_inputs` reads, and :func:`bounding_records` says, per aggregate, what the
ledger records: ``enforced``, with the generated query's SHA-256.

Errors are :class:`~airflow.sdk.exceptions.AirflowFailException` raised before any budget is reserved (a retry
cannot fix them), except a lost connection (:class:`~airflow.sdk.exceptions.AirflowException`, retryable); they
name the table or file and the column, never a value.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from contextlib import closing
from typing import TYPE_CHECKING, Any

from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException

from dp_operators.operators.sources import FORMATS, _aggregate_value, _connect, _connection_name, _fetch
from dp_operators.release.bounding import (
    BoundedRowsSource,
    bound_frame,
    bounded_rows,
    bounded_sql,
    bounding_problem,
    enforced_bounding,
)

if TYPE_CHECKING:
    from dp_operators.spec import ReleaseSpec

log = logging.getLogger(__name__)
#: Raw-rows file formats by suffix: the tabular ones of the sources' formats.
_ROWS_FORMATS = {suffix: kind.lower() for suffix, kind in FORMATS.items() if kind != "JSON"}

__all__ = ["bounded_file_aggregates", "bounded_sql_aggregates", "bounding_records", "check_raw_rows_arguments",
           "check_table_schema",
           "sql_dialect"]

#: The SQLAlchemy dialects whose generated SQL the test suite runs (others are tried, as SQLAlchemy compiles them).
TESTED_DIALECTS = ("postgresql", "sqlite")


def check_raw_rows_arguments(spec: ReleaseSpec, privacy_unit_column: str | None,
                             value_columns: Mapping[str, str] | None, task_id: str | None) -> dict[str, str]:
    """Check, when the DAG is parsed, the arguments of a release from raw rows: a privacy-unit column, a value
    column for each ``sum``, ``mean`` and ``variance`` of the spec and none for a count or another name, and
    bounds the bounding can keep (:func:`~dp_operators.release.bounding.bounding_problem`).

    Returns: the value columns, as a dict.

    Raises:
        ValueError: what is wrong and how to fix it (a DAG import error).
    """
    where = f"task {task_id!r}"
    if not privacy_unit_column or not isinstance(privacy_unit_column, str):
        raise ValueError(f"{where}: reading raw rows needs privacy_unit_column, the column that identifies the privacy "
                         f"unit ({spec.privacy_unit!r} in the spec)")
    values = dict(value_columns or {})
    names = {aggregate.name for aggregate in spec.aggregates}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: value_columns names {unknown}, which the spec does not release (it releases "
                         f"{sorted(names)})")
    for aggregate in spec.aggregates:
        problem = bounding_problem(spec, aggregate, values.get(aggregate.name))
        if problem:
            raise ValueError(f"{where}: {problem}")
    return values


def sql_dialect(hook: Any) -> str:
    """The SQLAlchemy dialect name of a ``DbApiHook``'s connection (``postgresql``, ``sqlite``, ...).

    Raises:
        AirflowFailException: the hook does not say, or SQLAlchemy has no such dialect.
    """
    import sqlalchemy as sa

    name = getattr(hook, "dialect_name", None)
    try:
        if not name or name == "default":
            raise LookupError(name)
        sa.dialects.registry.load(name)
    except Exception:  # noqa: BLE001 - an unknown or missing dialect: say which, and what works
        raise AirflowFailException(
            f"{_connection_name(hook)} has no SQLAlchemy dialect the bounded aggregation can be generated for "
            f"({name!r}); use a PostgreSQL or SQLite connection (tested: {', '.join(TESTED_DIALECTS)}), set the "
            "connection's extra 'sqlalchemy_scheme', or compute the aggregates with queries= (declared bounds)"
        ) from None
    return str(name)


def bounding_records(spec: ReleaseSpec, source: BoundedRowsSource, dialect: str,
                     parameters: Iterable | Mapping | None = None) -> dict[str, dict[str, Any]]:
    """What the ledger records of each aggregate bounded in the database: ``enforced``, the source's kind
    (``table`` or ``query``), the unit column and the SHA-256 of the query generated for ``dialect`` (with the
    ``parameters`` bound to a ``rows_query``). Public: computed from the spec and the operator's arguments, before
    any row is read.

    Raises:
        AirflowFailException: the bounds cannot be kept on this dialect (:func:`bounding_problem`).
    """
    records = {}
    for aggregate in spec.aggregates:
        try:
            sql = bounded_sql(spec, aggregate, source, dialect)
        except ValueError as error:
            raise AirflowFailException(str(error)) from None
        bound = list(parameters) if isinstance(parameters, (list, tuple)) else parameters
        records[aggregate.name] = enforced_bounding(source.kind, source.privacy_unit_column, sql,
                                                    parameters=bound if source.query is not None and bound else None,
                                                    contribution=spec.contribution_for(aggregate))
    return records


def bounded_sql_aggregates(hook: Any, spec: ReleaseSpec, source: BoundedRowsSource,
                           parameters: Iterable | Mapping | None = None) -> dict[str, Any]:
    """Run the bounded aggregation of every aggregate of ``spec`` over ``source`` in the database of ``hook``, one
    query per aggregate on one connection, and return the true aggregates (aggregate name -> rows, or the ungrouped
    value) for the engine.

    Each query is :func:`~dp_operators.release.bounding.bounded_sql` for the connection's dialect; it returns one
    row per key, never the raw rows. As for hand-written queries the DB-API cursor is used directly (the hook's
    ``run`` logs the row count, which is the number of keys present: DESIGN.md 2.8).

    Args:
        hook: a ``DbApiHook`` (PostgreSQL, SQLite, ...).
        parameters: bound to ``source.query`` if it has placeholders (a mapping for named placeholders).

    Raises:
        AirflowFailException: for ``table``, :func:`check_table_schema`'s refusals (a missing table or column, a
            value column that is no number), read from the schema before any query; a database error a retry
            cannot fix (its message withheld: it can quote values; PEP 249 ``ProgrammingError`` ...);
            :func:`sql_dialect`'s refusal.
        AirflowException: a lost connection or another retryable database error. SQLite reports an invalid
            ``rows_query`` as an ``OperationalError``, which also covers a locked database: retried.
    """
    dialect = sql_dialect(hook)
    if isinstance(parameters, list):
        parameters = tuple(parameters)
    where = _connection_name(hook)
    if source.table is not None:
        check_table_schema(hook, spec, source, where)
    what = f"table {source.table!r}" if source.table is not None else "the rows query"
    aggregates: dict[str, Any] = {}
    with closing(_connect(hook, where)) as connection:
        for aggregate in spec.aggregates:
            sql = bounded_sql(spec, aggregate, source, dialect)
            columns = [source.privacy_unit_column, *aggregate.group_by] + (
                [source.value_column(aggregate)] if source.value_column(aggregate) else [])
            names, rows = _fetch(connection, sql, parameters if source.query is not None else None,
                                 f"the bounded aggregation of {aggregate.name!r} over {what} on {where} (check "
                                 + ("that the rows query is valid SQL returning " if source.query is not None
                                    else "that the table has ")
                                 + f"the columns {columns}; the generated query is "
                                 "dp_operators.release.bounding.bounded_sql(spec, aggregate, source, dialect))")
            aggregates[aggregate.name] = _aggregate_value(aggregate, spec, bounded_rows(aggregate, names, rows),
                                                          f"the bounded aggregation of {aggregate.name!r}")
    return aggregates


def check_table_schema(hook: Any, spec: ReleaseSpec, source: BoundedRowsSource, where: str) -> None:
    """Refuse, from the table's schema (names and declared types, never a row), a table the bounded aggregation
    would read wrongly: a missing table or column, a value column that is not numeric (its every value would be
    dropped as no number, and the release be noise charged for nothing), an integer public key domain over a
    ``NUMERIC`` key column with a fractional scale (``17.0`` matches no key). Read through the hook's SQLAlchemy
    engine (``inspect``); a column of no declared type (SQLite) passes.

    Raises:
        AirflowFailException: naming the table, the column, its type, and the fix.
    """
    import sqlalchemy as sa

    schema, _, name = source.table.rpartition(".")  # type: ignore[union-attr]
    try:
        engine = hook.get_sqlalchemy_engine()
        inspector = sa.inspect(engine)
        if not inspector.has_table(name, schema=schema or None):
            raise AirflowFailException(f"table {source.table!r} does not exist on {where}; check table= (a "
                                       "schema-qualified name on PostgreSQL: 'schema.table')")
        types = {column["name"]: column["type"] for column in inspector.get_columns(name, schema=schema or None)}
    except AirflowFailException:
        raise
    except Exception as error:  # noqa: BLE001 - no inspector for this connection: the query's own errors remain
        log.info("the schema of table %r could not be read (%s); its columns are checked by the query",
                 source.table, type(error).__name__)
        return
    for aggregate in spec.aggregates:
        value = source.value_column(aggregate)
        for column in [source.privacy_unit_column, *aggregate.group_by] + ([value] if value else []):
            if column not in types:
                raise AirflowFailException(
                    f"table {source.table!r} has no column {column!r} (aggregate {aggregate.name!r}; it has "
                    f"{sorted(types)}); check privacy_unit_column, value_columns and the spec's group_by")
        if aggregate.releases_quantiles:  # the histogram's column holds the values the bins sort
            value = aggregate.bins.column  # type: ignore[union-attr]
        kind = types[value] if value else None
        if kind is not None and not isinstance(kind, (sa.types.NullType, sa.Integer, sa.Numeric, sa.Float)):
            raise AirflowFailException(
                f"the value column {value!r} of aggregate {aggregate.name!r} in table {source.table!r} is {kind}, not "
                "a number: every value would be dropped and the release would be noise. Give a numeric column "
                "(INTEGER, NUMERIC, REAL, DOUBLE PRECISION), or cast it in rows_query=")
        if aggregate.public_keys:
            for column in aggregate.outer_group_by:
                declared = types[column]
                integers = all(isinstance(key, int) for key in aggregate.keys[column])  # type: ignore[index]
                if (integers and isinstance(declared, sa.Numeric) and not isinstance(declared, sa.Float)
                        and (declared.scale or 0) > 0):
                    raise AirflowFailException(
                        f"the key column {column!r} of table {source.table!r} is {declared}: its values read as text "
                        "with a fraction (17.0), which matches none of the spec's integer keys. Cast it in "
                        f"rows_query= (CAST({column} AS INTEGER)), or store it as an integer column")


def bounded_file_aggregates(uri: str | ObjectStoragePath, spec: ReleaseSpec, privacy_unit_column: str,
                            value_columns: Mapping[str, str]) -> dict[str, Any]:
    """Read a CSV or Parquet file of raw rows (any ``ObjectStoragePath`` URI) and bound and aggregate every
    aggregate of ``spec`` from it with pandas (:func:`~dp_operators.release.bounding.bound_frame`).

    Raises:
        AirflowFailException: an unknown suffix, a missing or unreadable file, a missing column (named, with the
            file's columns).
    """
    import pandas as pd

    path = uri if isinstance(uri, ObjectStoragePath) else ObjectStoragePath(uri)
    kind = _ROWS_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise AirflowFailException(f"the rows file {path} has suffix {path.suffix!r}; name it .csv, .parquet or .pq")
    # not microdata_files.read_table: its parser errors name the offending line, a position in the data
    try:
        with path.open("rb") as handle:
            frame = pd.read_parquet(handle) if kind == "parquet" else pd.read_csv(handle)
    except FileNotFoundError:
        raise AirflowFailException(f"the rows file {path} was not found; check rows_uri") from None
    except Exception as error:  # noqa: BLE001 - the parser's text can quote the file's content
        raise AirflowFailException(f"the rows file {path} is not a readable {kind} file "
                                   f"({type(error).__name__})") from None
    if kind == "csv":
        # CSV cells are text: a value cell is the number it spells, cell by cell. pandas types a column by all its
        # cells, so one unit's stray text ("unknown") would make every value of the column text, which the bounding
        # drops: a neighbour would empty the aggregate
        for column in set(value_columns.values()) & set(frame.columns):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    aggregates: dict[str, Any] = {}
    for aggregate in spec.aggregates:
        rows_of = frame
        binned = aggregate.bins.column if aggregate.releases_quantiles else None  # type: ignore[union-attr]
        if kind == "csv" and binned in frame.columns:
            # a quantile's histogram column holds values too: each cell is the number it spells, for this aggregate
            # alone (another may group by the column's text), or one unit's stray text would empty every bin
            rows_of = frame.assign(**{binned: pd.to_numeric(frame[binned], errors="coerce")})
        try:
            rows = bound_frame(spec, aggregate, rows_of, privacy_unit_column, value_columns.get(aggregate.name))
        except ValueError as error:
            raise AirflowFailException(f"the rows file {path}, aggregate {aggregate.name!r}: {error}") from None
        aggregates[aggregate.name] = _aggregate_value(aggregate, spec, rows, f"the rows file {path}")
    return aggregates
