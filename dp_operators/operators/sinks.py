"""Sinks of a published release: files (JSON, CSV, Parquet) and a SQL table.

Every sink takes the ``output`` dict :func:`dp_operators.release.run_release` returns: exactly what the ledger
committed, returned unchanged by every replay. Nothing else reaches a sink, so a sink never sees a true aggregate.
A sink is a function of that dict alone: a replay (a retry, or a rerun of the task instance) rewrites identical
content, byte for byte in files, row for row in the table.

The flat table of a release, :func:`release_rows`, is the one shape the CSV, the Parquet file and the SQL table
share: one row per released value (a grouped aggregate gives one row per released key; an ungrouped one, one row),
aggregates sorted by name, rows in the output's order (the engine's key order).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from dp_operators.release.publish import published_interval

if TYPE_CHECKING:
    import pyarrow as pa
    from airflow.sdk import ObjectStoragePath

log = logging.getLogger(__name__)

#: The columns of :func:`release_rows`, the CSV and the Parquet file, in this order.
COLUMNS = ("aggregate", "kind", "key", "value", "half_width", "confidence", "mechanism", "saturated", "lower", "upper")

#: The file formats :func:`write_files` writes.
FORMATS = ("json", "csv", "parquet")


def release_rows(output: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The flat table of a published release: one dict per released value, with the keys :data:`COLUMNS`.

    * ``aggregate``, ``kind``, ``mechanism``: the aggregate's name, kind and mechanism, as published;
    * ``key``: the row's ``group_by`` columns and values as a compact JSON object, in ``group_by`` order
      (``{"education":"Bachelors","sex":"Female"}``; ``{}`` for an ungrouped aggregate): unambiguous, so NULL
      and ``"None"``, ``1`` and ``"1"``, and values holding ``;``, ``=`` or NUL stay distinct keys;
    * ``value``: the noised value (``int`` for counts and integer sums, else ``float``), in the aggregate's units;
    * ``half_width``: half-width of the confidence interval (``float``), ``None`` for a saturated value;
    * ``confidence``: the interval's confidence level (the release's, e.g. 0.95);
    * ``saturated``: ``True`` when the value is at the noise range's limit (docs/mechanisms.md, "Saturation");
    * ``lower``, ``upper``: the interval's ends (``value -+ half_width`` rounded outwards to floats); ``None`` on
      the unbounded side of a saturated value.

    Order: aggregates sorted by name (whatever the dict's insertion order: a replay returns the ledger's canonical
    JSON, whose key order may differ from the first run's), then rows in the output's order. A grouped aggregate
    whose partition selection released no key has no row.

    Raises:
        KeyError: ``output`` is not a published release (no ``aggregates``, ``confidence``...).
    """
    rows = []
    for name in sorted(output["aggregates"]):
        aggregate = output["aggregates"][name]
        group_by = aggregate["group_by"]
        for row in aggregate["rows"] if "rows" in aggregate else [aggregate]:
            lower, upper = published_interval(row)
            rows.append({
                "aggregate": name,
                "kind": aggregate["kind"],
                "key": json.dumps({column: row[column] for column in group_by}, ensure_ascii=False,
                                  separators=(",", ":")),
                "value": row["value"],
                "half_width": row["half_width"],
                "confidence": output["confidence"],
                "mechanism": aggregate["mechanism"],
                "saturated": bool(row.get("saturated")),
                "lower": lower,
                "upper": upper,
            })
    return rows


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
    ``saturated`` as bool; only ``half_width``, ``lower`` and ``upper`` nullable."""
    import pyarrow as pa

    nullable = {"half_width", "lower", "upper"}
    types = {"value": pa.float64(), "half_width": pa.float64(), "confidence": pa.float64(), "lower": pa.float64(),
             "upper": pa.float64(), "saturated": pa.bool_()}
    return pa.schema([pa.field(c, types.get(c, pa.string()), nullable=c in nullable) for c in COLUMNS])


def release_table(output: Mapping[str, Any]) -> pa.Table:
    """:func:`release_rows` as an Arrow table with :func:`parquet_schema` (values converted to float)."""
    import pyarrow as pa

    floats = ("value", "half_width", "confidence", "lower", "upper")
    rows = [{c: (float(v) if c in floats and v is not None else v) for c, v in row.items()}
            for row in release_rows(output)]
    return pa.Table.from_pylist(rows, schema=parquet_schema())


def release_parquet(output: Mapping[str, Any]) -> bytes:
    """The release as Parquet bytes: :func:`release_table`, one row group, snappy, no pandas index.

    Deterministic for a given pyarrow version: the same output gives the same bytes (the writer stores no
    timestamp; its ``created_by`` names the pyarrow version, so another version may write other bytes for the same
    content, which :func:`write_files` then leaves in place).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(release_table(output), sink, compression="snappy")
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
    """The release as JSON text: sorted keys, indent 2, a final newline (the same text for every replay)."""
    return json.dumps(output, indent=2, sort_keys=True) + "\n"


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
    output: Mapping[str, Any], folder: ObjectStoragePath, stem: str, formats: Sequence[str]
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
        else:
            _publish(path, release_parquet(output), same_content=_same_parquet_content(output))
        written[fmt] = path
    return written


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
        os.replace(handle.name, target)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME_LENGTH = 250  # Airflow's limit for dag, task and run ids


def sql_release_table(name: str) -> sa.Table:
    """The SQLAlchemy table of released rows named ``name`` (``table`` or ``schema.table``).

    Primary key: the release key (``dag_id, run_id, task_id, map_index, release_name``) plus ``aggregate`` and
    ``key``. Other columns: ``kind``, ``value``, ``half_width``, ``lower``, ``upper``, ``confidence`` (double
    precision), ``mechanism``, ``saturated`` (boolean), ``released_at`` (timestamp, UTC), ``spec_hash`` (SHA-256
    hex of the spec). Portable types only, so the same definition creates the table on SQLite and PostgreSQL.
    """
    schema, _, table = name.rpartition(".")
    text = sa.String(_NAME_LENGTH)
    return sa.Table(
        table,
        sa.MetaData(),
        sa.Column("dag_id", text, primary_key=True),
        sa.Column("run_id", text, primary_key=True),
        sa.Column("task_id", text, primary_key=True),
        sa.Column("map_index", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("release_name", sa.Text, primary_key=True),  # spec names have no length limit
        sa.Column("aggregate", sa.Text, primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("value", sa.Double, nullable=False),
        sa.Column("half_width", sa.Double),
        sa.Column("lower", sa.Double),
        sa.Column("upper", sa.Double),
        sa.Column("confidence", sa.Double, nullable=False),
        sa.Column("mechanism", sa.String(64), nullable=False),
        sa.Column("saturated", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        schema=schema or None,
    )


_KEY_FIELDS = ("dag_id", "run_id", "task_id", "map_index", "release_name")


@dataclass(frozen=True)
class SQLTableSink:
    """Write a release's rows into a SQL table through an Airflow connection's ``common.sql`` hook.

    Args:
        conn_id: an Airflow connection whose hook is a ``DbApiHook`` able to give a SQLAlchemy engine (PostgreSQL,
            SQLite, and most SQL providers).
        table: ``table`` or ``schema.table``; each part a plain identifier (letters, digits, ``_``; not starting
            with a digit), so the name needs no quoting rules of any particular database.
        create_table: create the table (:func:`sql_release_table`) when it does not exist.

    Raises:
        ValueError: at construction, an empty ``conn_id`` or a ``table`` that is not such a name.
    """

    conn_id: str
    table: str
    create_table: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.conn_id, str) or not self.conn_id:
            raise ValueError(f"SQLTableSink needs an Airflow connection id, got {self.conn_id!r}")
        parts = self.table.split(".") if isinstance(self.table, str) else []
        if not 1 <= len(parts) <= 2 or not all(_IDENTIFIER.match(part) for part in parts):
            raise ValueError(
                f"SQLTableSink table must be 'table' or 'schema.table', each part letters, digits and '_' (not "
                f"starting with a digit), got {self.table!r}"
            )

    def rows(self, output: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The table rows of ``output``: :func:`release_rows` plus the release key, ``released_at`` and
        ``spec_hash``; ``value`` and the interval as float."""
        release_key = {name: output["release_key"][name] for name in _KEY_FIELDS}
        released_at = dt.datetime.fromisoformat(output["released_at"]).astimezone(dt.timezone.utc)
        floats = ("value", "half_width", "lower", "upper", "confidence")
        return [
            {**release_key, **{c: float(v) if c in floats and v is not None else v for c, v in row.items()},
             "released_at": released_at, "spec_hash": output["spec_hash"]}
            for row in release_rows(output)
        ]

    def prepare(self) -> None:
        """Make sure the table exists (created when ``create_table``), before the release reserves any budget, so a
        missing table or a connection that is not SQL fails the task before it is charged, not after.

        Raises:
            AirflowFailException: the connection's hook is not a SQL hook, or the table is missing and
                ``create_table`` is false.
            sqlalchemy.exc.SQLAlchemyError: the database failed (retryable).
        """
        from airflow.sdk.exceptions import AirflowFailException

        engine = self._engine()
        table = sql_release_table(self.table)
        try:
            if self.create_table:
                table.metadata.create_all(engine, checkfirst=True)
            elif not sa.inspect(engine).has_table(table.name, schema=table.schema):
                raise AirflowFailException(
                    f"table {self.table!r} does not exist on connection {self.conn_id!r}; create it (see "
                    "sql_release_table) or let the sink create it (create_table=True)"
                )
        finally:
            engine.dispose()

    def write(self, output: Mapping[str, Any]) -> int:
        """Replace the rows of ``output``'s release key with its rows, in one transaction; returns the row count.

        Idempotent: a replay deletes the rows it wrote before and inserts identical ones, so the table never holds
        a release twice, and other release keys' rows are untouched. If a concurrent writer of the same release key
        commits between this transaction's delete and insert (the insert then hits the primary key), the
        transaction is retried once: both wrote the same rows.

        Raises:
            AirflowFailException: the connection's hook is not a SQL (``DbApiHook``) hook.
            sqlalchemy.exc.SQLAlchemyError: the database failed (retryable), or ``create_table`` is false and the
                table does not exist.
        """
        engine = self._engine()
        table = sql_release_table(self.table)
        rows = self.rows(output)
        match = sa.and_(*(table.c[name] == output["release_key"][name] for name in _KEY_FIELDS))
        try:
            if self.create_table:
                table.metadata.create_all(engine, checkfirst=True)
            for attempt in (1, 2):
                try:
                    with engine.begin() as connection:
                        connection.execute(table.delete().where(match))
                        if rows:
                            connection.execute(table.insert(), rows)
                    break
                except sa.exc.IntegrityError:
                    if attempt == 2:
                        raise
        finally:
            engine.dispose()
        log.info("wrote %d rows of release %r to table %s (connection %r)", len(rows), output["release"],
                 self.table, self.conn_id)
        return len(rows)

    def _engine(self) -> sa.Engine:
        from airflow.providers.common.sql.hooks.sql import DbApiHook
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowFailException

        hook = BaseHook.get_hook(self.conn_id)
        if not isinstance(hook, DbApiHook):
            raise AirflowFailException(
                f"connection {self.conn_id!r} gives a {type(hook).__name__}, not a SQL hook (common.sql DbApiHook); "
                "SQLTableSink needs a database connection such as postgres or sqlite"
            )
        return hook.get_sqlalchemy_engine()
