"""The SQL table sink of a published release: :class:`SQLTableSink` upserts the release's flat rows
(:func:`~dp_operators.operators.flat_rows.release_rows`) into a table of :func:`sql_release_table`'s shape.

Like every sink it writes only the ``output`` dict the ledger committed, and a replay writes the same rows again.

The table's primary key is the release key plus ``row_digest``, the SHA-256 of the row's aggregate and key
(:func:`row_digest`), not the key itself: a key released by partition selection can be any text (a URL), and
PostgreSQL refuses a B-tree index row above about 2704 bytes, which would fail the insert after the ledger's commit.
The key's parts are bounded (Airflow ids are ASCII and at most 250 characters, release names at most 200), so
the index row stays near 1 kB whatever the released keys.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import UserDefinedType

from dp_operators.operators.flat_rows import release_rows
from dp_operators.spec.names import MAX_NAME_LENGTH

log = logging.getLogger(__name__)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ID_LENGTH = 250  # Airflow's limit for dag, task and run ids
_KEY_FIELDS = ("dag_id", "run_id", "task_id", "map_index", "release_name")


def row_digest(aggregate: str, key: str) -> str:
    """The ``row_digest`` column: SHA-256 hex (64 characters) of ``aggregate + "\\n" + key``, UTF-8 encoded.

    ``key`` is the row's compact JSON key (:func:`~dp_operators.operators.flat_rows.release_rows`), which never
    holds a raw newline and starts with ``{``, so different (aggregate, key) pairs give different texts. On
    PostgreSQL the same value is ``encode(sha256(convert_to(aggregate || E'\\n' || key, 'UTF8')), 'hex')``.
    """
    return hashlib.sha256(f"{aggregate}\n{key}".encode("utf-8")).hexdigest()


class PublishedNumber(sa.types.TypeDecorator):
    """The ``value`` column: every published number exactly, whatever the release (one table holds the releases of
    many specs, so its type cannot come from one spec's parameters).

    * PostgreSQL: ``NUMERIC`` without precision or scale (arbitrary precision). An ``int`` is stored as it is, with
      no decimal places; a ``float`` as the decimal the release's JSON writes for it (``repr``, the shortest that
      reads back as the same double: ``0.1``, not 0.1000000000000000055...), with at least one decimal place
      (``1e16`` as ``10000000000000000.0``), which NUMERIC keeps. Read back as the JSON held it: a value without
      decimal places as ``int``, one with them as the ``float`` it denotes (the same double, bit for bit).
    * SQLite (no decimal type; ``INTEGER`` is int64, ``REAL`` a double): a column without a declared type (no
      affinity, so SQLite converts nothing): an ``int`` within int64 as ``INTEGER``, a ``float`` as ``REAL``, and an
      ``int`` beyond int64 as its decimal ``TEXT`` (read back as ``int``). SQL compares INTEGER and REAL values
      numerically but sorts TEXT after every number: ``CAST(value AS TEXT)`` or the application reads the rare
      value beyond int64 exactly.
    * Any other database: ``DOUBLE PRECISION``, as before (integers above 2^53 round).
    """

    impl = sa.Double
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(sa.Numeric(asdecimal=True))
        if dialect.name == "sqlite":
            return dialect.type_descriptor(_NoAffinity())
        return dialect.type_descriptor(sa.Double())

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        if value is None:
            return None
        if dialect.name == "postgresql":
            if type(value) is not float:
                return Decimal(value)
            sign, digits, exponent = Decimal(repr(value)).as_tuple()
            if exponent >= 0:  # the same number with one decimal place (quantize would need a wide context)
                digits, exponent = digits + (0,) * (exponent + 1), -1
            return Decimal((sign, digits, exponent))
        if dialect.name == "sqlite" and type(value) is int:
            return value if -(2**63) <= value < 2**63 else str(value)
        if dialect.name == "sqlite" and isinstance(value, Decimal):
            return str(value)
        return value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Any:
        if dialect.name == "sqlite" and isinstance(value, str):
            return int(value) if value.lstrip("-").isdigit() else Decimal(value)
        if dialect.name == "postgresql" and isinstance(value, Decimal):
            return int(value) if value.as_tuple().exponent >= 0 else float(value)
        return value


class _NoAffinity(UserDefinedType):
    """A SQLite column declared without a type: no affinity, each value keeps its storage class."""

    cache_ok = True

    def get_col_spec(self, **kwargs: Any) -> str:
        return ""


def value_column_problem(found: Mapping[str, Any], dialect: str) -> str | None:
    """Why an existing table's ``value`` column (an inspector's column dict) cannot hold every published number
    exactly, or None: on PostgreSQL it must be ``NUMERIC`` without precision or scale, on SQLite without a declared
    type (:class:`PublishedNumber`). A table of an older dp_operators version has ``DOUBLE PRECISION``, which rounds
    integers above 2^53."""
    kind = found.get("type")
    if dialect == "postgresql":
        if isinstance(kind, sa.Numeric) and not isinstance(kind, sa.Float) and kind.precision is None \
                and kind.scale is None:
            return None
        return (f"column value is {kind}, which does not hold every published number exactly (integers above "
                "2^53, decimals); convert it with ALTER TABLE ... ALTER COLUMN value TYPE numeric")
    if dialect == "sqlite":
        if isinstance(kind, (sa.types.NullType, sa.LargeBinary)):
            return None
        return (f"column value is {kind}, whose SQLite affinity converts values (integers above 2^53 round); SQLite "
                "cannot change a column's type: let the sink create a table of another name and copy the rows "
                "(INSERT INTO new SELECT * FROM old)")
    return None


def sql_release_table(name: str) -> sa.Table:
    """The SQLAlchemy table of released rows named ``name`` (``table`` or ``schema.table``).

    Primary key: the release key (``dag_id, run_id, task_id, map_index, release_name``) plus ``row_digest``
    (:func:`row_digest` of ``aggregate`` and ``key``). ``aggregate`` and ``key`` (the row's ``group_by`` values as a
    JSON object) are ordinary TEXT columns of any length. ``value`` holds every published number exactly
    (:class:`PublishedNumber`: ``NUMERIC`` on PostgreSQL, a column without type affinity on SQLite). Other
    columns: ``kind``, ``half_width``, ``lower``, ``upper``, ``confidence`` (double precision: doubles by
    construction), ``mechanism``, ``saturated`` (boolean), ``released_at`` (timestamp, UTC), ``spec_hash``
    (SHA-256 hex of the spec). The same definition creates the table on SQLite and PostgreSQL.
    """
    schema, _, table = name.rpartition(".")
    text = sa.String(_ID_LENGTH)
    return sa.Table(
        table,
        sa.MetaData(),
        sa.Column("dag_id", text, primary_key=True),
        sa.Column("run_id", text, primary_key=True),
        sa.Column("task_id", text, primary_key=True),
        sa.Column("map_index", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("release_name", sa.String(MAX_NAME_LENGTH), primary_key=True),
        sa.Column("row_digest", sa.String(64), primary_key=True),
        sa.Column("aggregate", sa.Text, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("value", PublishedNumber(), nullable=False),
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


def shape_differences(inspector: sa.Inspector, table: sa.Table) -> list[str]:
    """How the existing table ``table.name`` (in ``table.schema``) differs from ``table``: columns missing,
    columns the sink cannot fill (extra, NOT NULL and without a default), the primary key's columns (as a set), and
    a ``value`` column that would round (:func:`value_column_problem`). An empty list: the sink can write it. Extra
    columns that are nullable or have a default are allowed."""
    found = {column["name"]: column for column in inspector.get_columns(table.name, schema=table.schema)}
    expected = [column.name for column in table.columns]
    problems = []
    missing = [name for name in expected if name not in found]
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    unfillable = [name for name, column in found.items()
                  if name not in table.columns and not column.get("nullable", True) and column.get("default") is None
                  and column.get("autoincrement") is not True]
    if unfillable:
        problems.append(f"column(s) {', '.join(unfillable)} NOT NULL without a default, which the sink never fills")
    key = inspector.get_pk_constraint(table.name, schema=table.schema).get("constrained_columns") or []
    wanted = [column.name for column in table.primary_key.columns]
    if set(key) != set(wanted):
        problems.append(f"primary key ({', '.join(key) or 'none'}) instead of ({', '.join(wanted)})")
    value = value_column_problem(found["value"], inspector.dialect.name) if "value" in found else None
    if value:
        problems.append(value)
    return problems


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
        """The table rows of ``output``: :func:`~dp_operators.operators.flat_rows.release_rows` plus the release
        key, ``row_digest``, ``released_at`` and ``spec_hash``; ``value`` as the JSON holds it (``int`` or
        ``float``, stored exactly by :class:`PublishedNumber`), the interval as float."""
        release_key = {name: output["release_key"][name] for name in _KEY_FIELDS}
        released_at = dt.datetime.fromisoformat(output["released_at"]).astimezone(dt.timezone.utc)
        floats = ("half_width", "lower", "upper", "confidence")
        return [
            {**release_key, "row_digest": row_digest(row["aggregate"], row["key"]),
             **{c: float(v) if c in floats and v is not None else v for c, v in row.items()},
             "released_at": released_at, "spec_hash": output["spec_hash"]}
            for row in release_rows(output)
        ]

    def prepare(self) -> None:
        """Make sure the table exists (created when ``create_table``) and has :func:`sql_release_table`'s shape
        (:func:`shape_differences`), before the release reserves any budget, so a table the rows cannot go into
        fails the task before it is charged, not after. Safe to call from many task instances at once: a
        concurrent creation of the same table is not an error.

        Raises:
            AirflowFailException: the connection's hook is not a SQL hook; the table is missing and ``create_table``
                is false; or the table exists with another shape (the message says what differs).
            sqlalchemy.exc.SQLAlchemyError: the database failed (retryable).
        """
        from airflow.sdk.exceptions import AirflowFailException

        engine = self._engine()
        table = sql_release_table(self.table)
        try:
            if self.create_table:
                self._create(engine, table)
            elif not sa.inspect(engine).has_table(table.name, schema=table.schema):
                raise AirflowFailException(
                    f"table {self.table!r} does not exist on connection {self.conn_id!r}; create it (see "
                    "sql_release_table) or let the sink create it (create_table=True)"
                )
            problems = shape_differences(sa.inspect(engine), table)
        finally:
            engine.dispose()
        if problems:
            raise AirflowFailException(
                f"table {self.table!r} on connection {self.conn_id!r} exists but is not a dp_operators release table "
                f"(sql_release_table): {'; '.join(problems)}. Drop or rename it (a table of an older dp_operators "
                "version: move its rows to a new table), or give the SQL sink another table name"
            )

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
                self._create(engine, table)
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

    @staticmethod
    def _create(engine: sa.Engine, table: sa.Table) -> None:
        """Create ``table`` unless it exists. Another task instance may create it between the check and the
        ``CREATE TABLE`` (PostgreSQL then raises DuplicateTable, or UniqueViolation on its type catalogue; SQLite
        'table already exists'): if the table exists afterwards, that is success."""
        try:
            table.metadata.create_all(engine, checkfirst=True)
        except (sa.exc.ProgrammingError, sa.exc.IntegrityError, sa.exc.OperationalError):
            if not sa.inspect(engine).has_table(table.name, schema=table.schema):
                raise
            log.info("table %s was created concurrently by another task instance", table.fullname)

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
