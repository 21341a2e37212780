"""Sinks of a published release: files (JSON, CSV, Parquet) here, and a SQL table
(:class:`SQLTableSink`, from :mod:`dp_operators.operators.sql_sink`).

Every sink takes the ``output`` dict :func:`dp_operators.release.run_release` returns: exactly what the ledger
committed, returned unchanged by every replay. Nothing else reaches a sink, so a sink never sees a true aggregate.
A sink is a function of that dict alone: a replay (a retry, or a rerun of the task instance) rewrites identical
content, byte for byte in files, row for row in the table.

The flat table of a release, :func:`release_rows` (:mod:`dp_operators.operators.flat_rows`), is the one shape the
CSV, the Parquet file and the SQL table share: one row per released value (a grouped aggregate gives one row per
released key; an ungrouped one, one row), aggregates sorted by name, rows in the output's order (the engine's key
order).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_operators.operators.flat_rows import COLUMNS, release_rows
from dp_operators.release import rows_file
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


def parquet_schema() -> pa.Schema:
    """The Arrow schema of the Parquet file: :data:`COLUMNS`; ``value``, ``half_width``, ``confidence``, ``lower``
    and ``upper`` as float64 (a count above 2**53 is rounded to the nearest double; the JSON and CSV keep it exact),
    ``saturated`` as bool; only ``half_width``, ``lower`` and ``upper`` nullable (the schema of rows files too:
    :func:`dp_operators.release.rows_file.parquet_schema`)."""
    return rows_file.parquet_schema()


def _inline_table(output: Mapping[str, Any]) -> pa.Table:
    import pyarrow as pa

    floats = ("value", "half_width", "confidence", "lower", "upper")
    rows = [{c: (float(v) if c in floats and v is not None else v) for c, v in row.items()}
            for row in release_rows(output)]
    return pa.Table.from_pylist(rows, schema=parquet_schema())


def _pieces(output: Mapping[str, Any], store: Any = None) -> Iterator[pa.Table]:
    """The flat table in order (aggregates sorted by name): an inline aggregate as one table, a rows file
    (:mod:`dp_operators.release.rows_file`) in :data:`~dp_operators.release.rows_file.ROW_GROUP`-row batches, read
    from a local copy whose SHA-256 was checked against the committed one while it was copied (what is streamed is
    what the ledger recorded, whatever happens to the file meanwhile). With ``store`` (the release's rows folder)
    a rows file must also lie in it, named by its digest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name in sorted(output["aggregates"]):
        aggregate = output["aggregates"][name]
        if "rows_file" not in aggregate:
            yield _inline_table({**output, "aggregates": {name: aggregate}})
            continue
        copy = rows_file.verified_copy(store or _AnyFolder(), aggregate["rows_file"], name)
        try:
            for batch in pq.ParquetFile(copy).iter_batches(batch_size=rows_file.ROW_GROUP):
                yield pa.Table.from_batches([batch]).cast(parquet_schema())
        finally:
            copy.unlink(missing_ok=True)


def release_table(output: Mapping[str, Any], rows_store: Any = None) -> pa.Table:
    """:func:`release_rows` as an Arrow table with :func:`parquet_schema` (values converted to float); the rows
    of an aggregate stored as a rows file are read from it (checked against its committed SHA-256; in
    ``rows_store``'s folder when given).

    Raises:
        RowsFileError: a rows file is missing, altered, or (with ``rows_store``) elsewhere.
    """
    import pyarrow as pa

    if not rows_file.rows_files(dict(output)):
        return _inline_table(output)
    return pa.concat_tables(list(_pieces(output, rows_store)))


def _write_parquet(output: Mapping[str, Any], sink: Any, rows_store: Any = None) -> None:
    import pyarrow.parquet as pq

    if not rows_file.rows_files(dict(output)):
        pq.write_table(release_table(output), sink, compression="snappy")
        return
    with pq.ParquetWriter(sink, parquet_schema(), compression="snappy") as writer:
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
    ``ObjectStoragePath``: local, s3, gcs...), URIs are its paths as text."""

    def __init__(self, folder: ObjectStoragePath) -> None:
        self.folder = folder

    def put(self, name: str, source: Path) -> str:
        target = self.folder / name
        if not target.exists() or target.stat().st_size != source.stat().st_size or not _same_file(target, source):
            publish_file(target, source)
        return str(target)

    def open(self, uri: str) -> Any:
        return _open_stored(uri)

    def owns(self, uri: str) -> bool:
        from airflow.sdk import ObjectStoragePath

        return str(ObjectStoragePath(uri).parent).rstrip("/") == str(self.folder).rstrip("/")


class _AnyFolder(ObjectStorageRowsStore):
    """A rows file's own location, wherever it is (``release_table`` without a store): its digest is still
    checked."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]

    def owns(self, uri: str) -> bool:
        return True


def _open_stored(uri: str) -> Any:
    """Open a stored file for reading: on local storage only a regular file reached without a symbolic link."""
    from airflow.sdk import ObjectStoragePath
    from fsspec.implementations.local import LocalFileSystem

    path = ObjectStoragePath(uri)
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
