"""Sources of true aggregates: files (JSON, CSV, Parquet) by ``ObjectStoragePath``, and SQL queries through any
Airflow ``common.sql`` hook. Both return the mapping :func:`dp_operators.release.prepare_inputs` reads (aggregate
name -> value), so the true aggregates go from storage the data owner controls straight into the engine: never
through XCom, Airflow's database, a templated field or the task log.

A *tabular* source (a CSV or Parquet file, a query's result) holds one aggregate, one row per key: the spec's
``group_by`` columns and the value columns its kind needs, matched by name (other columns are ignored):

========================  =====================================================================================
kind                      value columns
========================  =====================================================================================
count                     ``count``
sum                       ``sum``
mean                      ``sum``, ``count`` (the sum of the values clipped to ``bounds``)
variance                  ``sum``, ``count``, ``sum_squares``
========================  =====================================================================================

plus ``units`` (distinct privacy units per key) under ``partition_selection``, except for a count with one
contribution per partition. For a median or quantile (one row per group and bin, with ``count``), ``units`` is the
group's number of distinct privacy units, the same on each of its bins' rows (the engine takes the largest), and is
not needed when ``max_partitions_contributed`` and ``max_contributions_per_partition`` are both 1. An ungrouped
aggregate's rows are added up, as a grouped aggregate's rows repeating a key are: one row, or several (a query with
a stray ``GROUP BY``, a file of partial sums), is read alike, so the outcome never depends on the number of rows.
No row (a query whose ``WHERE`` or ``HAVING`` matched nobody, an empty file) is the aggregate of nobody, as SQL's
``COUNT`` and ``SUM`` give it: count 0, sums NULL (``None``, which follows the aggregate's ``non_finite`` ``nan``
policy).

Types. Parquet and SQL values arrive typed (pyarrow, the DB-API driver): ints, ``Decimal`` (Parquet ``decimal128``,
SQL ``NUMERIC``) and floats go to the engine as they are, which reads each exactly or refuses it by its type
(:mod:`dp_operators.release.upstream_types`). A Parquet file's column types are checked from its schema before any
value is read (:mod:`dp_operators.operators.file_tables`): under ``upstream.arithmetic: exact`` a floating sum
column is refused whatever it holds, and so are key columns of a type no key can have. CSV cells are text (JSON and
CSV are decoded as UTF-8 with ``surrogateescape``: a key in another encoding is no key, its row ignored), read as
:mod:`dp_operators.operators.file_tables` says: integer literals as ``int``, any other number as a ``float``,
non-numeric text as NULL; since a cell's type would then follow its text, a CSV file is refused for the sums of a
``sum``, ``mean`` or ``variance`` under ``upstream.arithmetic: exact`` (from the suffix and the spec, before reading:
declare ``binary64`` or write Parquet), and counts follow the engine's rules for their type, key columns as ``int`` where the spec's public keys are integers. CSV is
refused for an aggregate under ``partition_selection`` (its keys would be published as the file spells them): use
Parquet or JSON.

References. An upstream value is read as a reference (:func:`is_reference`) only when every string in it is a URI
with a scheme (``s3://...``) or an absolute path, ending in a suffix of :data:`FORMATS`; any other string goes to
the engine, which refuses a string by its type without echoing it (an upstream returning ``str(total)`` must not
see its total in the task log).

Errors are :class:`~airflow.sdk.exceptions.AirflowFailException` (retrying cannot fix them), raised before any
budget is reserved; they name the file or query, the column and how to fix it, never a data value or a row index.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from typing import TYPE_CHECKING, Any

from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from dp_operators.operators.file_tables import column_positions, csv_rows, parquet_rows, unreadable
from dp_operators.release.columns import is_table
from dp_operators.release.inputs import EMPTY_UNGROUPED_ROW, UngroupedRows, selection_units_field

if TYPE_CHECKING:
    from dp_operators.spec import Aggregate, ReleaseSpec

__all__ = ["FORMATS", "is_reference", "query_aggregates", "read_reference", "value_columns"]

#: File formats by (lower-case) suffix.
FORMATS = {".json": "JSON", ".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"}
#: DB-API (PEP 249) error classes that a retry cannot fix: the query or the data, not the connection.
_PERMANENT_DB_ERRORS = {"ProgrammingError", "DataError", "IntegrityError", "NotSupportedError"}
#: A reference string: a URI scheme (RFC 3986) or an absolute path, and a suffix of FORMATS, in any case.
_REFERENCE = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*://|/).*\.(?:json|csv|parquet|pq)", re.IGNORECASE | re.DOTALL)


def value_columns(spec: ReleaseSpec, aggregate: Aggregate) -> list[str]:
    """The value columns a tabular source of ``aggregate`` holds besides its ``group_by`` columns (module
    docstring), in release order: ``count``, ``sum``, ``sum_squares`` as the kind needs, then ``units`` under
    partition selection when the engine reads it."""
    units = selection_units_field(spec, aggregate)
    return list(aggregate.components) + ([units] if units not in (None, "count") else [])


def is_reference(value: Any) -> bool:
    """True if an upstream value is a reference :func:`read_reference` reads rather than the aggregates
    themselves: an ``ObjectStoragePath``, a reference string, or a non-empty mapping whose values all are. A
    reference string is a URI with a scheme (``file://``, ``s3://``, ...) or an absolute path, ending in ``.json``,
    ``.csv``, ``.parquet`` or ``.pq`` (any case). Anything else (``"8675309.25"``, ``"data.csv"``) is a value for
    the engine, which refuses a string by its type without echoing it."""
    if isinstance(value, Mapping):
        return bool(value) and all(_is_reference_path(v) for v in value.values())
    return _is_reference_path(value)


def _is_reference_path(value: Any) -> bool:
    if isinstance(value, ObjectStoragePath):
        return True
    return isinstance(value, str) and _REFERENCE.fullmatch(value) is not None


def read_reference(reference: str | Mapping[str, str], spec: ReleaseSpec) -> dict[str, Any]:
    """Read the true aggregates a reference points to, in the shape of
    :func:`~dp_operators.release.prepare_inputs` (aggregate name -> value). Messages quote the reference's URIs:
    pass an upstream (XCom) value here only if :func:`is_reference` accepts it.

    Args:
        reference: an ``ObjectStoragePath`` URI (``file://``, ``s3://``, ``gs://``, ...; a bare path is local):
            either a ``.json`` file holding the whole mapping, read with Python's ``json`` (a number with a
            fraction or an exponent is a binary float there: give sums as integers), or, for a spec with exactly
            one aggregate, a ``.csv`` or ``.parquet`` (``.pq``) file of its rows. Or a mapping of aggregate name to
            URI, one file per aggregate of the spec: a ``.json`` file holds that aggregate's value (a number, a
            ``{"sum", "count"}`` mapping, a list of rows), a CSV or Parquet file its rows (module docstring). An
            aggregate under ``partition_selection`` cannot be read from CSV (module docstring).
        spec: the release spec.

    Returns:
        ``{aggregate name: value}``; the engine checks types and shapes.

    Raises:
        AirflowFailException: an unknown suffix, a CSV file for an aggregate under ``partition_selection``
            (checked on the spec and the suffixes, before any file is read), a missing or unreadable file, a
            mapping that misses an aggregate of the spec or names another, a missing column, a CSV row with more
            or fewer fields than its header, a Parquet value column that is not numeric (or a floating sum column
            under ``upstream.arithmetic: exact``), a Parquet key column of a type no key can have (bool, binary,
            ...) or that cannot match the spec's public keys. Parquet
            types are checked from the schema, before any value is read. The message names the file and the
            column, never a value.
    """
    if isinstance(reference, (str, ObjectStoragePath)):
        path, kind = _located(reference, "the aggregates reference")
        if kind == "JSON":
            mapping = _read_json(path)
            if not isinstance(mapping, Mapping):
                raise AirflowFailException(
                    f"aggregates file {path} holds a JSON {type(mapping).__name__}, not an object: write the whole "
                    "mapping of aggregate name to value, or pass a mapping {aggregate name: file URI}"
                )
            return dict(mapping)
        if len(spec.aggregates) != 1:
            raise AirflowFailException(
                f"aggregates file {path} is a {kind} file, which holds the rows of one aggregate, but the spec "
                f"releases {len(spec.aggregates)}: pass a mapping {{aggregate name: file URI}} with one file for each "
                f"of {[a.name for a in spec.aggregates]}, or one JSON file holding the whole mapping"
            )
        aggregate = spec.aggregates[0]
        _check_csv_keys(path, kind, aggregate)
        return {aggregate.name: _read_table(path, kind, spec, aggregate)}
    if not isinstance(reference, Mapping):
        raise AirflowFailException(
            f"an aggregates reference is a URI or a mapping of aggregate name to URI, got {type(reference).__name__}"
        )
    _check_names(reference, spec, "the aggregates reference", "files", echo_unknown=False)
    located = {}
    for aggregate in spec.aggregates:  # every file's format is checked before any is read
        uri = reference[aggregate.name]
        if not isinstance(uri, (str, ObjectStoragePath)):
            raise AirflowFailException(
                f"the aggregates reference maps {aggregate.name!r} to a {type(uri).__name__}; give a file URI"
            )
        located[aggregate.name] = _located(uri, f"the file of aggregate {aggregate.name!r}")
        _check_csv_keys(*located[aggregate.name], aggregate)
    aggregates: dict[str, Any] = {}
    for aggregate in spec.aggregates:
        path, kind = located[aggregate.name]
        aggregates[aggregate.name] = _read_json(path) if kind == "JSON" else _read_table(path, kind, spec, aggregate)
    return aggregates


def query_aggregates(
    hook: Any, queries: Mapping[str, str], spec: ReleaseSpec, parameters: Iterable | Mapping | None = None
) -> dict[str, Any]:
    """Run one SQL query per aggregate through a ``common.sql`` hook and return the true aggregates in the shape of
    :func:`~dp_operators.release.prepare_inputs`.

    Each query returns one row per key with the aggregate's ``group_by`` and value columns, by name (module
    docstring; e.g. ``SELECT education, sex, COUNT(*) AS count FROM adult GROUP BY education, sex``); an ungrouped
    aggregate's query returns one row, or none (the empty aggregate: count 0, sums NULL); several rows are added
    up. A column is matched by
    its exact name, else case-insensitively when that is unambiguous (Snowflake and Oracle upper-case unquoted
    names). Values stay as the driver returns them:
    PostgreSQL's ``SUM`` over ``NUMERIC`` (or over ``BIGINT``) is a ``Decimal``, read exactly by the engine.

    The queries run on one connection from ``hook.get_conn()``, through its DB-API cursor rather than
    ``hook.run()``/``get_records()``: those log the cursor's row count and send it to hook-level lineage, and the
    number of rows of a ``GROUP BY`` is the number of keys present in the data (DESIGN.md 2.8).

    Args:
        hook: a ``DbApiHook`` (PostgreSQL, SQLite, ...), or anything with a DB-API ``get_conn()``.
        queries: aggregate name -> SQL, exactly one for each aggregate of ``spec``.
        spec: the release spec.
        parameters: bound to every query (a mapping for named placeholders lets each query use the names it needs).

    Raises:
        AirflowFailException: a missing or extra query (checked before any query runs), a query returning no
            result set, a missing or duplicated column, or a
            database error a retry cannot fix (PEP 249 ``ProgrammingError``, ``DataError``, ...).
        AirflowException: another database error (a lost connection: retryable). Database error messages are
            withheld from both (they can quote data values); the error class is named.
    """
    _check_names(queries, spec, "queries", "queries", echo_unknown=True)
    if isinstance(parameters, list):  # psycopg 3 takes positional parameters as a tuple only
        parameters = tuple(parameters)
    aggregates: dict[str, Any] = {}
    where = _connection_name(hook)
    with closing(_connect(hook, where)) as connection:
        for aggregate in spec.aggregates:
            source = f"the query of aggregate {aggregate.name!r} on {where}"
            names, rows = _fetch(connection, queries[aggregate.name], parameters, source)
            positions = column_positions(names, aggregate.group_by + value_columns(spec, aggregate), source, show=True)
            aggregates[aggregate.name] = _aggregate_value(
                aggregate, spec, ({c: row[i] for c, i in positions.items()} for row in rows), source
            )
    return aggregates


def _connection_name(hook: Any) -> str:
    conn_id = hook.get_conn_id() if hasattr(hook, "get_conn_id") else None
    return f"connection {conn_id!r}" if conn_id else type(hook).__name__


def _connect(hook: Any, where: str) -> Any:
    try:
        return hook.get_conn()
    except Exception as error:  # noqa: BLE001 - a connection failure is retryable; its text may hold the DSN
        raise AirflowException(f"could not connect to {where}: {type(error).__name__}") from None


def _fetch(connection: Any, sql: str, parameters: Any, source: str) -> tuple[list[str], list[Sequence]]:
    """Column names and rows of one query; a database error is re-raised without its message."""
    try:
        with closing(connection.cursor()) as cursor:
            if parameters:
                cursor.execute(sql, parameters)
            else:
                cursor.execute(sql)
            if cursor.description is None:
                raise AirflowFailException(f"{source} returned no result set; give a SELECT returning the rows")
            return [str(column[0]) for column in cursor.description], cursor.fetchall()
    except AirflowFailException:
        raise
    except Exception as error:  # noqa: BLE001 - the driver's message can quote data values: name the class only
        classes = {kind.__name__ for kind in type(error).__mro__}
        text = (f"{source} failed with {type(error).__name__} (the database's message is withheld: it can quote "
                "data values); run the query in a SQL client to see it")
        if classes & _PERMANENT_DB_ERRORS:
            raise AirflowFailException(text) from None
        raise AirflowException(text) from None


def _check_names(given: Mapping, spec: ReleaseSpec, what: str, things: str, *, echo_unknown: bool) -> None:
    names = [a.name for a in spec.aggregates]
    missing = [name for name in names if name not in given]
    unknown = [str(name) for name in given if name not in names]
    if missing:
        raise AirflowFailException(f"{what} misses {missing}: give {things} for every aggregate of the spec {names}")
    if unknown:
        listed = f"{unknown}" if echo_unknown else f"{len(unknown)} name(s)"
        raise AirflowFailException(
            f"{what} names {listed} that the spec does not release; give {things} for exactly the spec's aggregates "
            f"{names} (check the spelling, or add the aggregate to the spec)"
        )


def _located(uri: str | ObjectStoragePath, what: str) -> tuple[ObjectStoragePath, str]:
    path = uri if isinstance(uri, ObjectStoragePath) else ObjectStoragePath(uri)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise AirflowFailException(
            f"{what} {path} has suffix {path.suffix!r}; name the file .json, .csv, .parquet or .pq (the format "
            "follows the suffix)"
        )
    return path, kind


def _check_csv_keys(path: ObjectStoragePath, kind: str, aggregate: Aggregate) -> None:
    """Refuse a CSV file for an aggregate without a public key domain, and for exact sums (decided by the spec and
    the suffix alone, before the file is read)."""
    if kind == "CSV" and not aggregate.reads_counts and aggregate.upstream.arithmetic == "exact":
        # a CSV cell has no type: "30" and "30.5" would read as an int and a float, so under exact arithmetic one
        # person's cell would decide whether the release runs (a refusal that depends on a value)
        raise AirflowFailException(
            f"the file of aggregate {aggregate.name!r} ({path}) is CSV, but its sums are declared exact "
            "(upstream.arithmetic: exact) and CSV cells carry no type, so whether a cell reads as an integer or a "
            "float would depend on its value. Write it as Parquet (int64 or decimal128 columns keep the type) or "
            "JSON of integers, or declare the float arithmetic in the spec: upstream: {arithmetic: binary64, "
            "max_rows: N}"
        )
    if kind == "CSV" and not aggregate.public_keys:
        raise AirflowFailException(
            f"the file of aggregate {aggregate.name!r} ({path}) is CSV, but the aggregate has no public key domain "
            "(partition_selection): its keys would be published as the CSV spells them (17 or 17.0, as pandas "
            "writes an int column holding a NULL), so the published keys could depend on one person. Write it as "
            "Parquet or JSON, which keep the keys' types, or declare the keys in the spec"
        )


def _read_json(path: ObjectStoragePath) -> Any:
    try:
        # surrogateescape, as for CSV: a string in another encoding (one Latin-1 key) is no key, the file is read
        with path.open("r", encoding="utf-8", errors="surrogateescape") as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise unreadable(path, "JSON", error) from None


def _read_table(path: ObjectStoragePath, kind: str, spec: ReleaseSpec, aggregate: Aggregate) -> Any:
    source = f"{kind} file {path} (aggregate {aggregate.name!r})"
    read_rows = csv_rows if kind == "CSV" else parquet_rows
    rows = read_rows(path, aggregate, value_columns(spec, aggregate), source)
    return _aggregate_value(aggregate, spec, rows, source)


def _aggregate_value(aggregate: Aggregate, spec: ReleaseSpec, rows: Iterable[dict], source: str) -> Any:
    """A tabular source's rows as the engine's value: the list of rows when grouped (an Arrow table as it is); when
    ungrouped, the one row's value (a number for a count or sum, ``{"sum", "count", ...}`` for a mean or variance),
    no row the empty aggregate, and several rows :class:`~dp_operators.release.inputs.UngroupedRows`, which the
    engine adds up exactly, per its ``non_finite`` policy, as it would read their total as one row (module
    docstring): the number of rows never changes the outcome."""
    if aggregate.group_by:
        return rows if is_table(rows) else list(rows)  # an Arrow table goes to the engine's columnar reader
    rows = list(rows)
    if len(rows) > 1:  # a stray GROUP BY, partial sums: added up by the engine, never refused
        return UngroupedRows(rows)
    columns = value_columns(spec, aggregate)
    row = rows[0] if rows else _empty_row(columns)
    return row[columns[0]] if len(columns) == 1 else row


def _empty_row(columns: list[str]) -> dict[str, Any]:
    """The aggregate of nobody, as SQL computes it: ``COUNT`` (and a count of units) 0, ``SUM`` NULL."""
    return {column: EMPTY_UNGROUPED_ROW[column] for column in columns}
