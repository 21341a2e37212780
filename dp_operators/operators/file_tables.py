"""Rows of one aggregate from a CSV or Parquet file, typed for the release engine (used by
:mod:`dp_operators.operators.sources`, which documents the columns a file holds).

CSV holds text, decoded as UTF-8 (a leading byte-order mark is skipped) with ``errors="surrogateescape"``: a cell
written in another encoding (one source system's Latin-1 ``Z\xfcrich``) becomes text with lone surrogates, never a
refusal of the whole file (that would depend on the one row holding it). Such a text key is one no release can
publish (``normalise_key`` -> ``UNPUBLISHABLE``: its row is ignored and counted); in an integer key or a value cell
it is no number (NULL, below); in the header it names no column the spec needs. Cells are read as follows:

* a value cell: an integer literal (``12``, ``-3``) is an ``int``; any other number (``12.5``, ``1e3``, ``40.0``,
  ``nan``, ``inf``) is a Python ``float``, exactly as if the upstream task had returned that float through XCom,
  so the engine's float rules apply (:mod:`dp_operators.release.upstream_types`) under ``binary64``. Text with a
  fraction is never taken for an exact decimal: a float sum printed as text would otherwise pass as exact
  (Casacuberta, Shoemate, Vadhan, Wagaman, CCS 2022). Since a cell's type would follow its text (``30`` an int,
  ``30.5`` a float), a CSV file is refused for the sums of a ``sum``, ``mean`` or ``variance`` under
  ``upstream.arithmetic: exact``, from the suffix and the spec before the file is read
  (:func:`dp_operators.operators.sources.read_reference`): give exact sums in Parquet (``int64``,
  ``decimal128``; refused by the column's type, below) or declare ``upstream: {arithmetic: binary64, max_rows: N}``.
  Counts are read from CSV by the engine's count rules.
  An empty cell, and text that is not a number (``N/A``, ``-``), is NULL (``None``): it follows the aggregate's
  ``non_finite`` ``nan`` policy like SQL's NULL, never a refusal (that would depend on one cell's value). An
  integer literal beyond Python's int-parsing digit limit is an exact ``Decimal`` (the engine saturates it).
* a key cell is text, read as ``int`` when the column's declared public keys are all integers: an integer literal,
  or an integral number (``25.0``, as pandas writes an int column holding a NULL; exponents are bounded by
  :data:`~dp_operators.release.upstream_types.DECIMAL_EXPONENT_LIMIT`, so ``1e9999999`` costs no time); any other
  text there cannot be a key of the domain and is read as NULL (its row is ignored, counted in the diagnostics as
  a NULL key, never refused: a refusal would depend on that one row). Elsewhere a key is its text, verbatim, and
  an empty cell NULL. Aggregates under ``partition_selection`` (no public key domain) cannot read CSV at all: the
  published keys would be the file's spelling of them (``17`` or ``17.0``, depending on a NULL elsewhere in the
  column); :mod:`dp_operators.operators.sources` refuses such a file before reading it.
* the file's structure must be valid: a header row naming the columns, and every row with as many fields as the
  header; a file that breaks it is refused (its name is given, never its content).

Parquet columns are typed: every refusal is decided by the file's schema (and the spec), before any value is
read, so it never depends on a row. Values arrive through pyarrow's ``to_pylist()``: integers as ``int``,
``decimal128``/``decimal256`` as ``Decimal``, doubles as ``float``, dates as ``datetime.date``, timestamps as
``datetime``, NULL as ``None``.

* a value column must be an integer, decimal or double (or all-NULL) column; text and float16/float32 are refused.
  Under ``upstream.arithmetic: exact`` (the default) a floating ``sum`` or ``sum_squares`` column is refused
  whatever it holds: write sums as integers or ``decimal128`` (pandas: the nullable ``Int64`` dtype), or declare
  ``upstream: {arithmetic: binary64, max_rows: N}``. Counts (``count``, ``units``) may be doubles (pandas makes an
  int column float64 when it holds a NULL): the engine rounds them as it does for XCom.
* a key column must be an integer, string, date, timestamp, decimal, double or all-NULL column (also
  dictionary-encoded: pandas categoricals); bool, binary, time, duration and nested columns are refused, and so is
  a column whose keys can never match the spec's public keys (integers for text keys; text, dates or timestamps
  for integer keys), as the engine refuses such keys, but also when no row holds one. A date or timestamp Python
  cannot hold (beyond year 9999 or before year 1: a sentinel, a typo) is ``UNPUBLISHABLE``: its row is ignored and
  counted in the diagnostics, like any key no release can publish.

Messages name the file and the column, never a cell, a header the file may not have (its first row would be data)
or a row index.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from dp_operators.release.columns import columnar_eligible, value_column_refusal
from dp_operators.release.upstream_types import UNPUBLISHABLE, normalise_key

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

    from dp_operators.spec import Aggregate

_INTEGER = re.compile(r"[+-]?[0-9]+")


def column_positions(
    names: Sequence[str], needed: Sequence[str], source: str, *, show: bool = False
) -> dict[str, int]:
    """Index of each needed column in a result: its exact name, else a unique case-insensitive match. ``show``
    lists the columns found (a query's names are the DAG's; a file's first row may be data, if it has no header)."""
    positions: dict[str, int] = {}
    for column in needed:
        exact = [i for i, name in enumerate(names) if name == column]
        found = exact or [i for i, name in enumerate(names) if name.lower() == column.lower()]
        if not found:
            found_names = f" (it has {list(names)})" if show else ""
            raise AirflowFailException(
                f"{source} has no column {column!r}{found_names}; give one row per key with the columns "
                f"{list(needed)}, named in a header row (a file) or with AS (a query: 'COUNT(*) AS count')"
            )
        if len(found) > 1:
            raise AirflowFailException(f"{source} has {len(found)} columns named {column!r}; give each column once")
        positions[column] = found[0]
    return positions


def unreadable(path: ObjectStoragePath, kind: str, error: BaseException) -> AirflowFailException:
    """The task error for a file that is missing or cannot be parsed as ``kind``: the parser's own text is withheld
    (it can quote the file's content)."""
    if isinstance(error, FileNotFoundError):
        return AirflowFailException(
            f"aggregates file {path} was not found; check the URI (and that the upstream task wrote it)"
        )
    return AirflowFailException(
        f"aggregates file {path} is not a readable {kind} file ({type(error).__name__}); write it as "
        f"{kind} (UTF-8 text for JSON and CSV)"
    )


def csv_rows(path: ObjectStoragePath, aggregate: Aggregate, values: list[str], source: str) -> list[dict]:
    """The rows of a CSV file: ``group_by`` and ``values`` columns, typed as the module docstring says."""
    key_reader = {column: _key_reader(aggregate, column) for column in aggregate.group_by}
    try:
        # utf-8-sig: spreadsheets write a BOM; surrogateescape: a cell in another encoding (one source system's
        # Latin-1 key) is text with lone surrogates, which the engine reads as no key (module docstring)
        with path.open("r", encoding="utf-8-sig", errors="surrogateescape", newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise AirflowFailException(f"{source} is empty; write a header row with the columns "
                                           f"{aggregate.group_by + values}")
            positions = column_positions(header, aggregate.group_by + values, source)
            return [_csv_row(cells, len(header), positions, key_reader, source) for cells in reader]
    except (OSError, ValueError, csv.Error) as error:
        raise unreadable(path, "CSV", error) from None


def _csv_row(cells: list[str], width: int, positions: dict[str, int], key_reader: dict, source: str) -> dict:
    if not cells and width == 1:  # a one-column file's empty cell (a NULL) is a blank line to the csv module
        cells = [""]
    if len(cells) != width:
        raise AirflowFailException(
            f"{source} has a row whose number of fields differs from its header's; write a valid CSV file (quote "
            "cells holding commas)"
        )
    row = {}
    for column, index in positions.items():
        reader = key_reader.get(column)
        row[column] = reader(cells[index]) if reader else _csv_number(cells[index])
    return row


def _csv_number(text: str) -> int | float | Decimal | None:
    """A CSV value cell (module docstring): ``int``, ``float``, or ``None`` for an empty or non-numeric cell."""
    text = text.strip()
    if _INTEGER.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # beyond Python's int-parsing digit limit: an exact integer all the same
            return Decimal(text)
    try:
        return float(text)
    except ValueError:  # empty, or not a number: NULL, never a refusal by the cell's value
        return None


def _key_reader(aggregate: Aggregate, column: str) -> Callable[[str], int | str | None]:
    """How a CSV key cell of ``column`` is read: ``int`` when its declared public keys are all ints, else text."""
    declared = {type(v) for v in aggregate.keys[column]} if aggregate.public_keys else {str}  # type: ignore[index]
    return _int_key if declared == {int} else _text_key


def _text_key(text: str) -> str | None:
    return text if text else None


def _int_key(text: str) -> int | None:
    """An integer key cell: an integral number as ``int`` (through the engine's ``normalise_key``, which bounds the
    exponent it expands), anything else ``None``."""
    text = text.strip()
    try:
        number: int | Decimal = int(text) if _INTEGER.fullmatch(text) else Decimal(text)
    except (ValueError, InvalidOperation):  # not a number, or an integer beyond the int-parsing digit limit
        return None  # no key of an integer domain: NULL, outside it (see the module docstring)
    key = normalise_key(number, "")
    return None if key is UNPUBLISHABLE else key  # type: ignore[return-value]


def parquet_rows(path: ObjectStoragePath, aggregate: Aggregate, values: list[str], source: str) -> Any:
    """The rows of a Parquet file: ``group_by`` and ``values`` columns, renamed to the spec's names. Every column's
    type is checked (module docstring) from the file's schema, before any value is read.

    Returns the Arrow table itself (columns renamed) when the engine reads it array-at-a-time
    (:func:`dp_operators.release.columns.columnar_eligible`: decided by the schema), else a list of row dicts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with path.open("rb") as handle:
            parquet = pq.ParquetFile(handle)
            schema = parquet.schema_arrow
            positions = column_positions(schema.names, aggregate.group_by + values, source)
            for column, index in positions.items():  # by the schema: no refusal depends on a value
                if column not in aggregate.group_by:
                    _check_parquet_value_type(schema.types[index], column, aggregate, source)
                else:
                    _check_parquet_key_type(schema.types[index], column, aggregate, source)
            # read() keeps the file's column order: select puts them in the order of ``positions``
            wanted = [schema.names[i] for i in positions.values()]
            table = parquet.read(columns=wanted).select(wanted)
    except (OSError, ValueError, pa.ArrowException) as error:
        raise unreadable(path, "Parquet", error) from None
    table = table.rename_columns(list(positions))
    if aggregate.group_by and columnar_eligible(None if aggregate.public_keys else "units", aggregate, table.schema):
        return table
    columns = [
        _key_values(table.column(i)) if column in aggregate.group_by else table.column(i).to_pylist()
        for i, column in enumerate(positions)  # the spec's names, also after a case-insensitive match
    ]
    return [dict(zip(positions, row)) for row in zip(*columns)]


def _key_values(column: Any) -> list:
    """A key column's values as Python objects; a value Python cannot hold (a date or timestamp beyond year 9999
    or before year 1: ``OverflowError``) is :data:`UNPUBLISHABLE` (its row is ignored and counted, never refused)."""
    import pyarrow as pa

    try:
        return column.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        return [_key_value(scalar) for scalar in column]


def _key_value(scalar: Any) -> Any:
    import pyarrow as pa

    try:
        return scalar.as_py()
    except (OverflowError, ValueError, pa.ArrowException):
        return UNPUBLISHABLE


def _unwrapped(kind: Any) -> Any:
    import pyarrow as pa

    return kind.value_type if pa.types.is_dictionary(kind) else kind  # pandas categoricals


def _check_parquet_key_type(kind: Any, column: str, aggregate: Aggregate, source: str) -> None:
    """Refuse a key column by its Parquet type: one the engine takes no key of (bool, binary, time, nested), or one
    whose keys can never match the spec's public keys (an integer column for text keys, text or dates for integer
    keys), as :func:`~dp_operators.release.prepare_inputs` refuses such keys, but whatever the rows hold."""
    import pyarrow as pa

    kind = _unwrapped(kind)
    if pa.types.is_boolean(kind):
        raise AirflowFailException(
            f"{source}: key column {column!r} is bool, which is no key; write it as a string column (e.g. "
            "'yes'/'no') or an integer column"
        )
    if (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)
            or pa.types.is_binary_view(kind)):
        raise AirflowFailException(
            f"{source}: key column {column!r} is {kind} (bytes), which is no key; write it as a string column "
            "(decode it upstream, e.g. .decode('utf-8'))"
        )
    if pa.types.is_integer(kind):
        stands_for: type | None = int
    elif (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
          or pa.types.is_date(kind) or pa.types.is_timestamp(kind)):
        stands_for = str  # a date or timestamp key is published as its ISO text
    elif pa.types.is_floating(kind) or pa.types.is_decimal(kind) or pa.types.is_null(kind):
        stands_for = None  # an integral value is its int, any other no key: decided per value by the engine
    else:
        raise AirflowFailException(
            f"{source}: key column {column!r} is of type {kind}, which is no key; write it as a string, integer, "
            "date or timestamp column"
        )
    declared = {type(v) for v in aggregate.keys[column]} if aggregate.public_keys else set()  # type: ignore[index]
    if stands_for is not None and declared and stands_for not in declared:
        fix = ("cast the column to string upstream, or list the spec's keys as integers" if stands_for is int
               else "write it as an integer column, or quote the spec's keys")
        listed = " and ".join(sorted(t.__name__ for t in declared))
        raise AirflowFailException(
            f"{source}: key column {column!r} is {kind}, whose keys are {stands_for.__name__}, but the spec's public "
            f"domain lists only {listed} values, so no row could match; {fix}"
        )


def _check_parquet_value_type(kind: Any, column: str, aggregate: Aggregate, source: str) -> None:
    """Refuse a value column by its Parquet type, as the engine refuses an Arrow table's
    (:func:`~dp_operators.release.columns.value_column_refusal`): text, float16/float32, and under
    ``upstream.arithmetic: exact`` any floating column of sums (``sum``, ``sum_squares``), whatever it holds."""
    reason = value_column_refusal(kind, column, aggregate)
    if reason is not None:
        raise AirflowFailException(f"{source}: {reason}")
