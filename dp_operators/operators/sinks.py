"""Sinks of a published release: files (JSON, CSV, Parquet) here, and a SQL table
(:class:`SQLTableSink`, from :mod:`dp_operators.operators.sql_sink`).

Every sink takes the ``output`` dict :func:`dp_operators.release.run_release` returns: exactly what the ledger
committed, returned unchanged by every replay. Nothing else reaches a sink, so a sink never sees a true aggregate.
A sink is a function of that dict alone: a replay (a retry, or a rerun of the task instance) rewrites identical
content, byte for byte in files, row for row in the table.

The flat table of a release, :func:`release_rows` (:mod:`dp_operators.operators.flat_rows`), is the one shape the
CSV, the Parquet file and the SQL table share: one row per released value (a grouped aggregate gives one row per
released key; an ungrouped one, one row), aggregates sorted by name, rows in the output's order (the engine's key
order). Every value is published exactly: the Parquet ``value`` column's type comes from the release's public
parameters (:func:`parquet_schema`), the SQL ``value`` column holds any number exactly
(:func:`~dp_operators.operators.sql_sink.sql_release_table`), the CSV writes the JSON's numbers.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from dp_operators.operators.flat_rows import COLUMNS, release_rows
from dp_operators.release import rows_file
from dp_operators.release.value_types import ColumnRangeError, ValueType, output_value_types, value_columns
from dp_operators.operators.sql_sink import SQLTableSink, row_digest, sql_release_table

__all__ = [
    "COLUMNS", "FORMATS", "SQLTableSink", "check_formats", "parquet_schema", "release_csv", "release_json",
    "release_parquet", "release_rows", "release_table", "row_digest", "sql_release_table", "write_files",
]

if TYPE_CHECKING:
    import pyarrow as pa
    from airflow.sdk import ObjectStoragePath

log = logging.getLogger(__name__)

#: The file formats :func:`write_files` writes.
FORMATS = ("json", "csv", "parquet")


def release_csv(output: Mapping[str, Any]) -> str:
    """The release as CSV text (``\\n`` line ends): a header of :data:`COLUMNS`, then :func:`release_rows`.

    ``None`` is written as an empty field, ``saturated`` as ``true``/``false``, numbers as Python writes them
    (``repr``: the shortest text that reads back as the same float).
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in release_rows(output):
        writer.writerow(_csv_field(row[column]) for column in COLUMNS)
    return buffer.getvalue()


def _csv_field(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def parquet_schema(output: Mapping[str, Any]) -> pa.Schema:
    """The Arrow schema of the Parquet file of ``output`` (a published release), from its public fields only:
    :data:`COLUMNS`, ``value`` typed by the release's aggregates (:mod:`dp_operators.release.value_types`): int64
    when every value is an integer within int64 (counts, sums on grid 1), a decimal when a value may pass int64 or
    lies on a fractional grid (``decimal128(p, s)``, the grid's decimal places), float64 when every aggregate is a
    binary float (means, variances, consistent families). A release mixing both gets ``value`` (the exact type, null
    on the binary-float rows) and ``float_value`` (float64, null elsewhere). ``half_width``, ``confidence``,
    ``lower`` and ``upper`` are float64, ``saturated`` bool; only ``half_width``, ``lower``, ``upper`` (and a split
    ``value``) nullable (:func:`dp_operators.release.rows_file.parquet_schema`). Two releases of one spec, whatever
    their data, get the same schema."""
    return _layout(output).schema


@dataclass(frozen=True)
class _Layout:
    """The value columns of a release's Parquet file: each aggregate's own type, the ``value`` column's, and
    whether ``float_value`` holds the binary-float aggregates' values."""

    types: Mapping[str, ValueType]
    value: ValueType
    split: bool

    @property
    def schema(self) -> pa.Schema:
        return rows_file.parquet_schema(self.value, self.split)

    def cells(self, name: str, value: Any) -> tuple[Any, float | None]:
        """``(value, float_value)`` of a published value of aggregate ``name``: exactly, through the aggregate's
        own type first (a fractional grid's value is its grid value, then widened to the column's scale).

        Raises:
            ColumnRangeError: the value does not fit (names the aggregate, not the value).
        """
        own = self.types[name]
        try:
            if not own.exact:
                return (None, float(value)) if self.split else (float(value), None)
            return self.value.column_value(own.column_value(value)), None
        except ColumnRangeError as error:
            raise ColumnRangeError(f"aggregate {name!r}: {error}") from None


def _layout(output: Mapping[str, Any]) -> _Layout:
    types = output_value_types(output)
    value, split = value_columns(types.values())
    return _Layout(types, value, split)


def _inline_table(output: Mapping[str, Any], layout: _Layout) -> pa.Table:
    import pyarrow as pa

    floats = ("half_width", "confidence", "lower", "upper")
    rows = []
    for row in release_rows(output):
        converted = {c: (float(v) if c in floats and v is not None else v) for c, v in row.items()}
        converted["value"], float_value = layout.cells(row["aggregate"], row["value"])
        if layout.split:
            converted["float_value"] = float_value
        rows.append(converted)
    return pa.Table.from_pylist(rows, schema=layout.schema)


def _conformed(table: pa.Table, layout: _Layout, name: str) -> pa.Table:
    """A batch of aggregate ``name``'s rows file in the release's schema: its values exactly in the ``value`` (or
    ``float_value``) column. A rows file written before values were typed holds doubles: each is read as the
    aggregate's type reads a published double (an integer; a fractional grid's value)."""
    import pyarrow as pa

    own, found, rows = layout.types[name], table.column("value"), table.num_rows
    if not own.exact:
        value = pa.nulls(rows, layout.value.arrow()) if layout.split else found.cast(pa.float64())
        float_value = found.cast(pa.float64()) if layout.split else None
    elif pa.types.is_floating(found.type):
        value = pa.array([layout.cells(name, v)[0] for v in found.to_pylist()], type=layout.value.arrow())
        float_value = pa.nulls(rows, pa.float64())
    else:  # int64 or a decimal into a type that holds it: a safe cast, exact
        value, float_value = found.cast(layout.value.arrow()), pa.nulls(rows, pa.float64())
    columns = {"value": value, "float_value": float_value}
    schema = layout.schema
    return pa.Table.from_arrays([columns[f.name] if f.name in columns else table.column(f.name).cast(f.type)
                                 for f in schema], schema=schema)


def _pieces(output: Mapping[str, Any], store: Any = None) -> Iterator[pa.Table]:
    """The flat table in order (aggregates sorted by name), in :func:`parquet_schema`: an inline aggregate as one
    table, a rows file (:mod:`dp_operators.release.rows_file`) in
    :data:`~dp_operators.release.rows_file.ROW_GROUP`-row batches, read from a local copy whose SHA-256 was checked
    against the committed one while it was copied (what is streamed is what the ledger recorded, whatever happens to
    the file meanwhile). With ``store`` (the release's rows folder) a rows file must also lie in it, named by its
    digest."""
    for table, _ in _sourced_pieces(output, store):
        yield table


def _sourced_pieces(output: Mapping[str, Any], store: Any = None) -> Iterator[tuple[pa.Table, list[bool]]]:
    """:func:`_pieces`, each with, per row, whether the committed value is a double: a JSON ``float`` of an inline
    row, any value of a rows file whose ``value`` column is floating (written before values were typed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    layout = _layout(output)
    for name in sorted(output["aggregates"]):
        aggregate = output["aggregates"][name]
        if "rows_file" not in aggregate:
            rows = aggregate["rows"] if "rows" in aggregate else [aggregate]
            yield (_inline_table({**output, "aggregates": {name: aggregate}}, layout),
                   [type(row["value"]) is float for row in rows])
            continue
        copy = rows_file.verified_copy(store or _AnyFolder(), aggregate["rows_file"], name)
        try:
            found = pq.ParquetFile(copy)
            double = pa.types.is_floating(found.schema_arrow.field("value").type)
            for batch in found.iter_batches(batch_size=rows_file.ROW_GROUP):
                yield _conformed(pa.Table.from_batches([batch]), layout, name), [double] * batch.num_rows
        finally:
            copy.unlink(missing_ok=True)


def release_table(output: Mapping[str, Any], rows_store: Any = None) -> pa.Table:
    """:func:`release_rows` as an Arrow table with :func:`parquet_schema` (values exactly in their column's type);
    the rows of an aggregate stored as a rows file are read from it (checked against its committed SHA-256; in
    ``rows_store``'s folder when given).

    Raises:
        RowsFileError: a rows file is missing, altered, or (with ``rows_store``) elsewhere.
        ValueError: a value beyond its column's type (a noise tail event below 2^-127,
            :mod:`dp_operators.release.value_types`).
    """
    import pyarrow as pa

    if not rows_file.rows_files(dict(output)):
        return _inline_table(output, _layout(output))
    return pa.concat_tables(list(_pieces(output, rows_store)))


def release_table_with_doubles(output: Mapping[str, Any], rows_store: Any = None) -> tuple[pa.Table, list[bool]]:
    """:func:`release_table`, and per row whether the committed value is a double (a JSON ``float``; a rows file
    written before values were typed): ``dpctl release verify`` accepts, for such a row only, the double itself
    where the table holds the decimal it denotes (a fractional grid's value), as a file of an older version holds it.

    Raises:
        as :func:`release_table`.
    """
    import pyarrow as pa

    tables, doubles = [], []
    for table, double in _sourced_pieces(output, rows_store):
        tables.append(table)
        doubles += double
    return (pa.concat_tables(tables) if tables else _inline_table(output, _layout(output))), doubles


def _write_parquet(output: Mapping[str, Any], sink: Any, rows_store: Any = None) -> None:
    import pyarrow.parquet as pq

    if not rows_file.rows_files(dict(output)):
        pq.write_table(release_table(output), sink, compression="snappy")
        return
    with pq.ParquetWriter(sink, parquet_schema(output), compression="snappy") as writer:
        for piece in _pieces(output, rows_store):
            writer.write_table(piece)


def release_parquet(output: Mapping[str, Any], rows_store: Any = None) -> bytes:
    """The release as Parquet bytes: :func:`release_table`, snappy, no pandas index; one row group, or, with rows
    files, one per inline aggregate and per batch of a rows file.

    Deterministic for a given pyarrow version: the same output gives the same bytes (the writer stores no
    timestamp; its ``created_by`` names the pyarrow version, so another version may write other bytes for the same
    content, which :func:`write_files` then leaves in place).
    """
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    _write_parquet(output, sink, rows_store)
    return sink.getvalue().to_pybytes()


def _same_parquet_content(output: Mapping[str, Any]) -> Callable[[bytes], bool]:
    def same(existing: bytes) -> bool:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(pa.BufferReader(existing))
        except (pa.ArrowException, OSError):
            return False
        expected = release_table(output)
        return table.schema.equals(expected.schema, check_metadata=False) and table.equals(expected)

    return same


def release_json(output: Mapping[str, Any]) -> str:
    """The release as JSON text: sorted keys, indent 2, a final newline (the same text for every replay).

    The text of ``json.dumps(output, indent=2, sort_keys=True)``, character for character, but built with the C
    encoder: with ``indent`` the standard library encodes in Python (CPython before 3.13), a call per value, which
    is most of an inline release of 10^5 rows. A list of rows (dicts of scalars) is one C call whose item separator
    carries the newline and indentation of a row's items (:func:`_rows_json`); only the few containers above the
    rows are joined here."""
    return _indented(output, 0) + "\n"


#: The JSON types encoded in one C call (exact types: the output is plain JSON, checked before the commit).
_SCALARS = frozenset({str, int, float, bool, type(None)})
_scalar_json = json.JSONEncoder().encode


def _indent(level: int) -> str:
    return "\n" + "  " * level


def _rows(values: list) -> bool:
    """``values`` are rows, non-empty dicts of scalars (:func:`_rows_json`), checked a column at a time."""
    return (set(map(type, values)) == {dict} and all(values)
            and set(map(type, chain.from_iterable(map(dict.values, values)))) <= _SCALARS)


def _rows_json(rows: list[dict], level: int) -> str:
    """A non-empty list of non-empty dicts of scalars at depth ``level`` as ``json.dumps(indent=2,
    sort_keys=True)`` writes it there, from one compact C encoding whose item separator is a row item's (a comma,
    a newline and the items' indentation). A newline occurs in that text only in separators (the encoder escapes
    it in strings), and a separator between ``}`` and ``{`` only between two rows (a string ends with a quote):
    that is where the rows' own brackets get their lines."""
    row, items = _indent(level + 1), _indent(level + 2)
    text = json.dumps(rows, sort_keys=True, separators=("," + items, ": "))
    text = text.replace("}," + items + "{", row + "}," + row + "{" + items)
    return "[" + row + "{" + items + text[2:-2] + row + "}" + _indent(level) + "]"


def _indented(value: Any, level: int) -> str:
    """``value`` at depth ``level`` as ``json.dumps(indent=2, sort_keys=True)`` writes it there."""
    kind = type(value)
    if kind is not dict and kind is not list:
        return _scalar_json(value)
    if not value:
        return "{}" if kind is dict else "[]"
    inner = "," + _indent(level + 1)
    if kind is dict:
        parts = [f"{_scalar_json(k)}: {_indented(v, level + 1)}" for k, v in sorted(value.items())]
        return "{" + inner[1:] + inner.join(parts) + _indent(level) + "}"
    if _rows(value):
        return _rows_json(value, level)
    parts = [_indented(v, level + 1) for v in value]
    return "[" + inner[1:] + inner.join(parts) + _indent(level) + "]"


def check_formats(formats: Sequence[str]) -> tuple[str, ...]:
    """``formats`` as a tuple, duplicates removed, order kept; each one of :data:`FORMATS`.

    Raises:
        ValueError: a bare string instead of a sequence, or an unknown format (the message lists the valid ones).
    """
    if isinstance(formats, str):
        raise ValueError(f"output_formats must be a sequence of formats such as ({formats!r},), not a string")
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown output format(s) {', '.join(map(repr, unknown))}; valid formats: "
                         f"{', '.join(FORMATS)}")
    return tuple(dict.fromkeys(formats))


def write_files(
    output: Mapping[str, Any], folder: ObjectStoragePath, stem: str, formats: Sequence[str], rows_store: Any = None
) -> dict[str, ObjectStoragePath]:
    """Write the release as ``<folder>/<stem>.<format>`` for each of ``formats``; returns format -> path.

    ``json``: :func:`release_json`; ``csv``: :func:`release_csv`; ``parquet``: :func:`release_parquet`. The
    folder is created. Each file is replaced atomically: on a local filesystem the bytes go to a temporary sibling
    that is renamed over the target (readers never see half a file); on an object store (s3, gcs...) the object is
    written by one upload, which the store makes visible all at once. A file that already holds these bytes is not
    rewritten, nor a Parquet file that already holds this content (written by another pyarrow version), so a
    replay leaves published files untouched.

    Raises:
        ValueError: an unknown format (see :func:`check_formats`), or a ``stem`` that is not one file name.
        OSError: the storage refused a write (files already written stay, each whole).
    """
    formats = check_formats(formats)
    if not stem or stem in (".", "..") or "/" in stem or "\\" in stem:
        raise ValueError(f"the file stem must be one file name, got {stem!r}")
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for fmt in formats:
        path = folder / f"{stem}.{fmt}"
        if fmt == "json":
            _publish(path, release_json(output).encode("utf-8"))
        elif fmt == "csv":
            _publish(path, release_csv(output).encode("utf-8"))
        elif rows_file.rows_files(dict(output)):
            _publish_parquet_stream(path, output, rows_store)
        else:
            _publish(path, release_parquet(output), same_content=_same_parquet_content(output))
        written[fmt] = path
    return written


def _publish_parquet_stream(path: ObjectStoragePath, output: Mapping[str, Any], rows_store: Any = None) -> None:
    """The Parquet file of a release with rows files, written batch by batch to a local temporary file (memory
    does not grow with the rows), then published like :func:`_publish` (left alone if it holds these bytes)."""
    handle = tempfile.NamedTemporaryFile(prefix="dp-release-", suffix=".parquet", delete=False)
    handle.close()
    source = Path(handle.name)
    try:
        _write_parquet(output, str(source), rows_store)
        if path.exists() and path.stat().st_size == source.stat().st_size and _same_file(path, source):
            log.debug("%s already holds this release; left unchanged", path)
            return
        publish_file(path, source)
    finally:
        source.unlink(missing_ok=True)


def _same_file(path: ObjectStoragePath, source: Path) -> bool:
    with path.open("rb") as found, source.open("rb") as wanted:
        while True:
            a, b = found.read(1 << 22), wanted.read(1 << 22)
            if a != b:
                return False
            if not a:
                return True


def publish_file(path: ObjectStoragePath, source: Path) -> None:
    """Copy the local file ``source`` to ``path``: on a local filesystem through a temporary sibling renamed over
    the target (readers never see half a file), on an object store by one upload."""
    import shutil

    from fsspec.implementations.local import LocalFileSystem

    if not isinstance(path.fs, LocalFileSystem):
        with source.open("rb") as reader, path.open("wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 22)
        return
    target = Path(path.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.parent.is_symlink() or target.is_symlink():
        raise OSError(f"{target} lies behind a symbolic link: release files are never written through one")
    handle = tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp", delete=False)
    try:
        with handle, source.open("rb") as reader:
            shutil.copyfileobj(reader, handle, 1 << 22)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, target)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


class ObjectStorageRowsStore:
    """The :class:`~dp_operators.release.rows_file.RowsStore` of the operator: rows files go to ``folder`` (an
    ``ObjectStoragePath``: local, s3, gcs...); a file's URI is :func:`~dp_operators.operators.locations.published_uri`
    of its path.

    A release committed before rows-file URIs were escaped holds its path as text instead (``str`` of the path: its
    folders' ``%`` raw). Its committed output is signed and is never rewritten, so both spellings are read (ADR 0021,
    "URIs"): a URI names a file of this store when it is either spelling of ``<folder>/<name>``, and the file read is
    always that one, found from the folder, not from the URI."""

    def __init__(self, folder: ObjectStoragePath) -> None:
        self.folder = folder

    def put(self, name: str, source: Path) -> str:
        target = self.folder / name
        if not target.exists() or target.stat().st_size != source.stat().st_size or not _same_file(target, source):
            publish_file(target, source)
        from dp_operators.operators.locations import published_uri

        return published_uri(target)

    def open(self, uri: str) -> Any:
        from dp_operators.operators.locations import published_uri

        name = self._name(uri)
        if name is None:
            raise FileNotFoundError(f"{uri} is not a file of the rows folder {published_uri(self.folder)}")
        return _open_stored(self.folder / name)

    def owns(self, uri: str) -> bool:
        return self._name(uri) is not None

    def _name(self, uri: str) -> str | None:
        """The name of the file ``uri`` names directly in :attr:`folder`, or None: ``uri`` is the folder's
        published URI and one percent-encoded name, or (a release committed before rows-file URIs were escaped)
        the folder's path text and the name as it is."""
        from dp_operators.operators.locations import published_uri

        for prefix, decode in ((published_uri(self.folder), True), (str(self.folder), False)):
            prefix = prefix.rstrip("/") + "/"
            if not uri.startswith(prefix):
                continue
            try:
                name = unquote(uri[len(prefix):], errors="strict") if decode else uri[len(prefix):]
            except UnicodeDecodeError:
                continue
            if name not in ("", ".", "..") and "/" not in name and "\\" not in name:
                return name
        return None


class _AnyFolder(ObjectStorageRowsStore):
    """A rows file's own location, wherever it is (``release_table`` without a store): its digest is still
    checked."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]

    def owns(self, uri: str) -> bool:
        return True

    def open(self, uri: str) -> Any:
        """The file at ``uri`` as published (percent-decoded once); if none is there, the file whose path is
        ``uri``'s text (a release committed before rows-file URIs were escaped). The caller checks its digest."""
        from airflow.sdk import ObjectStoragePath

        from dp_operators.operators.locations import storage_path_of

        literal = ObjectStoragePath(uri)
        try:
            decoded = storage_path_of(uri)
        except ValueError:
            return _open_stored(literal)
        return _open_stored(decoded if decoded.exists() or not literal.exists() else literal)


def _open_stored(path: ObjectStoragePath) -> Any:
    """Open a stored file for reading: on local storage only a regular file reached without a symbolic link."""
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(path.fs, LocalFileSystem):
        return rows_file.open_regular(Path(path.path))
    return path.open("rb")


def _publish(path: ObjectStoragePath, data: bytes, same_content: Callable[[bytes], bool] | None = None) -> None:
    """Write ``data`` to ``path`` unless it already holds them (or, per ``same_content``, the same content)."""
    if path.exists():
        existing = path.read_bytes()
        if existing == data or (same_content is not None and same_content(existing)):
            log.debug("%s already holds this release; left unchanged", path)
            return
    from fsspec.implementations.local import LocalFileSystem

    if not isinstance(path.fs, LocalFileSystem):
        path.write_bytes(data)
        return
    target = Path(path.path)
    handle = tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, 0o644)  # a published file (tempfile creates 0600): readable as rows files are
        os.replace(handle.name, target)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
