"""Rows of one aggregate from a CSV or Parquet file, typed for the release engine (used by
:mod:`dp_operators.operators.sources`, which documents the columns a file holds).

CSV holds text, read as follows:

* a value cell: an integer literal (``12``, ``-3``) is an ``int``; any other number (``12.5``, ``1e3``, ``40.0``,
  ``nan``, ``inf``) is a Python ``float``, exactly as if the upstream task had returned that float through XCom,
  so the engine's float rules apply (:mod:`dp_operators.release.upstream_types`): under ``upstream.arithmetic:
  exact`` a sum may only hold integral floats (up to 2^53), under ``binary64`` any float. Text with a fraction is
  never taken for an exact decimal: a float sum printed as text would otherwise pass as exact (Casacuberta,
  Shoemate, Vadhan, Wagaman, CCS 2022); exact decimal sums go in Parquet ``decimal128`` columns or SQL ``NUMERIC``.
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

Parquet columns arrive typed through pyarrow's ``to_pylist()``: integers as ``int``, ``decimal128``/``decimal256``
as ``Decimal``, doubles as ``float``, NULL as ``None``; a value column of another type (text, float16/float32) is
refused by its type.

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
        with path.open("r", encoding="utf-8-sig", newline="") as handle:  # utf-8-sig: spreadsheets write a BOM
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


def parquet_rows(path: ObjectStoragePath, aggregate: Aggregate, values: list[str], source: str) -> list[dict]:
    """The rows of a Parquet file: ``group_by`` and ``values`` columns, renamed to the spec's names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with path.open("rb") as handle:
            parquet = pq.ParquetFile(handle)
            names = parquet.schema_arrow.names
            positions = column_positions(names, aggregate.group_by + values, source)
            # read() keeps the file's column order: select puts them in the order of ``positions``
            wanted = [names[i] for i in positions.values()]
            table = parquet.read(columns=wanted).select(wanted)
    except (OSError, ValueError, pa.ArrowException) as error:
        raise unreadable(path, "Parquet", error) from None
    table = table.rename_columns(list(positions))  # the spec's names, also after a case-insensitive match
    for column in values:
        _check_parquet_value_type(table.schema.field(column).type, column, source)
    return table.to_pylist()


def _check_parquet_value_type(kind: Any, column: str, source: str) -> None:
    """Refuse a value column by its Parquet type: text, or floats too narrow for counts and sums (the engine
    refuses numpy float16/float32 for the same reason, but ``to_pylist()`` would widen them to Python floats)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_float16(kind) or pa.types.is_float32(kind):
        raise AirflowFailException(
            f"{source}: column {column!r} is {kind}, which holds neither every count above 2^24 nor a sum to double "
            "precision; write it as an integer, decimal or double column"
        )
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
            or pa.types.is_null(kind)):
        raise AirflowFailException(
            f"{source}: column {column!r} is of type {kind}, not a number; write it as an integer, decimal or "
            "double column"
        )
