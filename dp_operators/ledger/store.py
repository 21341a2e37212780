"""The ledger's database access shared by both roles: engines, transactions, schema check, and the read API.

Life cycle of a charge (DESIGN.md section 3): ``reserved -> committed`` (noised output stored),
``reserved -> released`` (noise provably never drawn: the amount is returned), ``reserved -> abandoned`` (a
reservation whose lease expired: it stays counted as spent).

Two classes build on :class:`LedgerBase`: the spender :class:`~dp_operators.ledger.spend.Ledger` (what tasks use:
reserve, commit, release, read) and the governor :class:`~dp_operators.ledger.govern.LedgerGovernor` (what
``dpctl ledger init/apply/verify`` use). See docs/adr/0020 for who may do what and how the database enforces it.

Every write is one transaction serialised per account: ``BEGIN IMMEDIATE`` on SQLite (the whole file is
write-locked) and ``SELECT ... FOR UPDATE`` on the account row on PostgreSQL. Readers never take the write lock
(SQLite: deferred transactions on a second engine, WAL mode). Transactions that lose a lock race (SQLite
``database is locked``, PostgreSQL serialization failures, deadlocks and lock timeouts) are retried with jittered
exponential backoff: they rolled back, so a retry is safe. PostgreSQL sessions set ``lock_timeout`` and
``idle_in_transaction_session_timeout``, so a hung worker cannot hold an account's lock forever.
"""

from __future__ import annotations

import datetime as dt
import functools
import getpass
import os
import random
import sqlite3
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from urllib.parse import unquote, urlsplit
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dp_operators.accounting import ACCOUNTANTS, epsilon_at_delta, round_down, round_up, unit_of
from dp_operators.accounting.budget import MAX_DENOMINATOR
from dp_operators.ledger import schema
from dp_operators.ledger.sqlite_driver import DriverConnection, driver_error
from dp_operators.ledger.structure import MEMBER_SEPARATOR, config_record, own_or_first_block, structure_of
from dp_operators.ledger.bounded import (
    MAX_JSON_CHARS,
    MAX_OUTPUT_CHARS,
    BoundsError,
    ledger_json,
    ledger_number,
    read_json,
    read_number,
    shown,
)
from dp_operators.ledger.errors import (
    AccountNotFoundError,
    AmbiguousReleaseKeyError,
    LedgerAccessError,
    LedgerNotInitialisedError,
    UnreadableValueError,
)

T = TypeVar("T")

#: SQLSTATEs of PostgreSQL errors after which the transaction was rolled back and may be retried.
_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "55P03"})

#: PostgreSQL session limits (milliseconds): a lock wait longer than this fails and is retried; a session idle
#: inside a transaction longer than that is ended by the server, releasing its locks.
PG_LOCK_TIMEOUT_MS = 10_000
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
#: A pooled PostgreSQL connection idle at least this long (seconds) is pinged (``SELECT 1``) before it is handed out,
#: and replaced if that fails (SQLAlchemy's pessimistic disconnect handling, done in a ``checkout`` pool event: a
#: ``DisconnectionError`` raised there makes the pool connect afresh). One used less than this ago is not: a spend
#: call is then one round trip, not two (ADR 29).
PG_PING_AFTER_IDLE_S = 2.0

#: Rows fetched per round trip by the streaming readers.
STREAM_BATCH = 1000

# Statements built once with named bind parameters, so SQLAlchemy computes each cache key once and reuses the
# compiled form on every call (SQLAlchemy docs, "SQL Compilation Caching"); see also ``chain`` and ``spend``.
_c = schema.charges.c
#: A release key's bind parameters (``ReleaseKey.as_dict()``).
KEY_MATCHES = (
    _c.dag_id == sa.bindparam("dag_id"),
    _c.run_id == sa.bindparam("run_id"),
    _c.task_id == sa.bindparam("task_id"),
    _c.map_index == sa.bindparam("map_index"),
    _c.release_name == sa.bindparam("release_name"),
)
#: The columns of an account row the readers use (its timestamps are not read: a hostile text there would make
#: SQLAlchemy's SQLite datetime parser raise before any check).
ACCOUNT_READ_COLUMNS = tuple(column for column in schema.accounts.c if column.name not in ("created_at", "updated_at"))
_ACCOUNT = sa.select(*ACCOUNT_READ_COLUMNS).where(schema.accounts.c.name == sa.bindparam("account"))
_RESERVED_AMOUNTS = sa.select(_c.id, _c.amount, _c.delta_amount).where(
    _c.account == sa.bindparam("account"), _c.state == "reserved"
).order_by(_c.id)
_COMMITTED_ACCOUNTS = sa.select(_c.id, _c.account).where(*KEY_MATCHES, _c.state == "committed").order_by(_c.id)
_COMMITTED_OUTPUT_BY_ID = sa.select(_c.id, _c.output).where(_c.id == sa.bindparam("charge_id"))
_DB_NOW = sa.select(sa.func.clock_timestamp())
#: The run id prefix of a series step's release key, and the form of one (dp_operators.continual.run.step_key).
SERIES_RUN_PREFIX = "__dp_series__/"
#: The field of a series step's committed output holding its sealed noise state (never published or shown).
SERIES_STATE_FIELD = "series_state"


def published_form(output: Any) -> Any:
    """A committed output as it is published, returned, replayed and shown: a series step's without its sealed
    noise state (:data:`SERIES_STATE_FIELD`); any other value as it is."""
    if isinstance(output, Mapping) and SERIES_STATE_FIELD in output:
        return {name: value for name, value in output.items() if name != SERIES_STATE_FIELD}
    return output
#: A series step's run id, canonical: the generation without leading zeros, the step in six digits (ASCII only).
SERIES_STEP_RUN_ID = re.compile(r"__dp_series__/g(0|[1-9][0-9]{0,5})/step/([0-9]{6})")


def series_step_of(run_id: object) -> tuple[int, int] | None:
    """``(generation, step)`` of a series step's run id (:data:`SERIES_STEP_RUN_ID`), else ``None``."""
    match = SERIES_STEP_RUN_ID.fullmatch(run_id) if isinstance(run_id, str) else None
    return None if match is None else (int(match[1]), int(match[2]))


def series_step_run_id(generation: int, step: int) -> str:
    """The run id of step ``step`` of generation ``generation`` (the inverse of :func:`series_step_of`)."""
    return f"{SERIES_RUN_PREFIX}g{generation}/step/{step:06d}"


def zero_amount_allowed(run_id: object) -> bool:
    """Whether a release key's first attempt may reserve 0: a series step after step 0, whose series paid at step 0
    (ADR 33); PostgreSQL's ``dp_reserve`` applies the same test
    (:data:`~dp_operators.ledger.pg_functions.ZERO_AMOUNT_RUN_ID`)."""
    found = series_step_of(run_id)
    return found is not None and found[1] > 0


@dataclass(frozen=True)
class ReleaseKey:
    """Identity of one release: ``(dag_id, run_id, task_id, map_index, release name)`` (DESIGN.md 2.2).

    Never keyed on ``ti.id`` or ``try_number``: both change on a retry, and a retry must find the stored output.
    """

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    release_name: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
            "release_name": self.release_name,
        }


@dataclass(frozen=True)
class Reservation:
    """A reserved charge: noise may now be drawn; then :meth:`Ledger.commit` stores the output.

    ``amount`` is in the account's unit; ``delta`` is the delta part of an ``approx_dp`` charge (else 0).
    ``token`` proves ownership: :meth:`~dp_operators.ledger.spend.Ledger.commit`, ``release`` and ``renew`` need it
    (the ledger stores only its SHA-256). ``lease_expires_at`` is when another attempt of the same key may take the
    release over unless the lease is renewed. ``repr`` hides the token.
    """

    charge_id: int
    key: ReleaseKey
    account: str
    amount: Fraction
    attempt: int
    delta: Fraction = Fraction(0)
    token: str = ""
    lease_expires_at: dt.datetime | None = None
    #: A charge on an account with privacy blocks or team quotas: one reservation per member account charged, all
    #: under one token (``account`` is then the account the release named, ``charge_id`` its first member's).
    members: tuple[Reservation, ...] = ()

    def parts(self) -> tuple[Reservation, ...]:
        """The single-account reservations this one is made of (itself, or its members)."""
        return self.members or (self,)

    def __repr__(self) -> str:
        members = f", members={[m.account for m in self.members]}" if self.members else ""
        return (
            f"Reservation(charge_id={self.charge_id}, key={self.key!r}, account={self.account!r}, "
            f"amount={self.amount}, attempt={self.attempt}, delta={self.delta}{members})"
        )


@dataclass(frozen=True)
class AccountStatus:
    """An account's state. Amounts are exact, in ``unit`` (``epsilon``, ``rho`` or ``mu_squared``); ``spent``
    includes reserved and abandoned charges. ``delta`` is the delta cap of an ``approx_dp`` account and the
    reporting delta of ``zcdp`` and ``gaussian_dp`` accounts; ``delta_spent``/``delta_reserved`` are the delta
    totals of an ``approx_dp`` account (0 otherwise)."""

    name: str
    accountant: str
    unit: str
    cap: Fraction
    spent: Fraction
    reserved: Fraction
    delta: Fraction | None
    privacy_unit: str
    allowed_dags: tuple[str, ...]
    delta_spent: Fraction = Fraction(0)
    delta_reserved: Fraction = Fraction(0)
    owner: str | None = None
    description: str | None = None
    spend_key_id: str | None = None

    @property
    def remaining(self) -> Fraction:
        return round_down(max(self.cap - self.spent, Fraction(0)))

    @property
    def remaining_delta(self) -> Fraction | None:
        """The delta left on an ``approx_dp`` account, rounded down as :meth:`Ledger.reserve` rounds it (``None``
        for other accountants: their delta is a reporting delta, never spent)."""
        if self.accountant != "approx_dp" or self.delta is None:
            return None
        return round_down(max(self.delta - self.delta_spent, Fraction(0)))

    def as_epsilon(self, amount: Fraction) -> float | None:
        """``amount`` reported as epsilon (at the account's delta for zCDP and Gaussian DP), rounded up."""
        return epsilon_at_delta(amount, self.accountant, self.delta)

    def summary(self) -> dict[str, Any]:
        """The account as ``dpctl ledger show --json`` prints it (and the dashboard's API serves it): exact amounts
        as ``str(Fraction)``; ``delta_spent`` for ``approx_dp`` only; mu for ``gaussian_dp`` only; the spend and
        the cap as epsilon at the account's delta (:meth:`as_epsilon`)."""
        mu = self.accountant == "gaussian_dp"
        return {
            "account": self.name,
            "accountant": self.accountant,
            "unit": self.unit,
            "cap": str(self.cap),
            "spent": str(self.spent),
            "reserved": str(self.reserved),
            "remaining": str(self.remaining),
            "delta": None if self.delta is None else str(self.delta),
            "delta_spent": str(self.delta_spent) if self.accountant == "approx_dp" else None,
            "cap_mu": float(self.cap) ** 0.5 if mu else None,
            "spent_mu": float(self.spent) ** 0.5 if mu else None,
            "spent_epsilon": self.as_epsilon(self.spent),
            "cap_epsilon": self.as_epsilon(self.cap),
            "privacy_unit": self.privacy_unit,
            "allowed_dags": list(self.allowed_dags),
        }


class LedgerFileReplacedError(LedgerNotInitialisedError):
    """The SQLite ledger file a connection opened is no longer the file at its path (deleted or replaced while the
    process had it open); nothing was committed."""


def sqlite_file(url: sa.URL) -> Path | None:
    """The file of a SQLite ledger URL (``sqlite:///path`` or ``sqlite:///file:path?...&uri=true``); ``None`` for
    an in-memory database or another backend."""
    database = url.database
    if (url.get_backend_name() != "sqlite" or not database or database == ":memory:"
            or url.query.get("mode") == "memory"):
        return None
    if database.startswith("file:"):
        database = unquote(urlsplit(database).path)
    return Path(database)


def sqlite_file_identity(url: sa.URL) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at a SQLite ledger URL's path now, or ``None`` (no such file, not a file
    database)."""
    path = sqlite_file(url)
    try:
        found = os.stat(path) if path is not None else None
    except OSError:
        return None
    return None if found is None else (found.st_dev, found.st_ino)


def create_ledger_engine(url: str, *, read_only: bool = False) -> Engine:
    """Create a SQLAlchemy engine for a ledger URL (``sqlite:///path`` or ``postgresql+psycopg://...``).

    On SQLite, pysqlite's own transaction handling is switched off so every transaction starts with
    ``BEGIN IMMEDIATE`` (SQLAlchemy docs, "Serializable isolation / Savepoints / Transactional DDL" for pysqlite),
    which takes the write lock at once: two workers cannot both read the same remaining budget. A ``read_only``
    engine starts deferred transactions instead, so readers do not queue behind writers (WAL mode).
    On PostgreSQL every session sets :data:`PG_LOCK_TIMEOUT_MS` and :data:`PG_IDLE_IN_TRANSACTION_TIMEOUT_MS`.
    """
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 60}, hide_parameters=True)
        begin = "BEGIN" if read_only else "BEGIN IMMEDIATE"

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_connection, record) -> None:  # pragma: no cover - driver hook
            dbapi_connection.isolation_level = None
            dbapi_connection.execute("PRAGMA foreign_keys = ON")
            record.info["file"] = sqlite_file_identity(engine.url)

        @sa.event.listens_for(engine, "begin")
        def _begin(connection) -> None:  # pragma: no cover - driver hook
            connection.exec_driver_sql(begin)

        return engine
    engine = sa.create_engine(url, hide_parameters=True)

    @sa.event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection, record) -> None:  # pragma: no cover - pool hook
        record.info["idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection, record, _proxy) -> None:  # pragma: no cover - pool hook
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PG_PING_AFTER_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as error:  # noqa: BLE001 - any failure: the pool discards it and connects again
            raise sa.exc.DisconnectionError(str(error)) from error

    @sa.event.listens_for(engine, "connect")
    def _session_limits(dbapi_connection, _record) -> None:  # pragma: no cover - driver hook
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET lock_timeout = {PG_LOCK_TIMEOUT_MS}")
        cursor.execute(f"SET idle_in_transaction_session_timeout = {PG_IDLE_IN_TRANSACTION_TIMEOUT_MS}")
        cursor.close()
        dbapi_connection.autocommit = autocommit

    return engine


def _is_retryable(error: sa.exc.DBAPIError) -> bool:
    original = error.orig
    if getattr(original, "sqlstate", None) in _RETRYABLE_SQLSTATES:
        return True
    text = str(original).lower()
    return "database is locked" in text or "database table is locked" in text or "database is busy" in text


class Refusal(Exception):
    """Carries a refusal out of a transaction that must still commit (its audit event)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class LedgerBase:
    """Database access shared by the spender and the governor: engines, retried write transactions, the schema
    check, and the read API.

    Args:
        url: SQLAlchemy URL of the ledger database, or an existing :class:`~sqlalchemy.engine.Engine`.
        max_retries: how often a transaction that lost a lock race is retried (jittered exponential backoff from
            10 ms, capped at 1 s per wait) before the error is raised.
    """

    def __init__(self, url: str | Engine, *, max_retries: int = 30) -> None:
        self.engine = url if isinstance(url, Engine) else create_ledger_engine(url)
        text_url = self.engine.url.render_as_string(hide_password=False)
        self._reader = (
            create_ledger_engine(text_url, read_only=True) if self.engine.dialect.name == "sqlite" else self.engine
        )
        self.max_retries = max_retries
        self._schema_checked = False

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    # -- transactions --------------------------------------------------------------------------------------------
    def _write(self, work: Callable[[Connection], T], *, retries: int | None = None) -> T:
        """Run ``work`` in one write transaction, retried (``retries`` times, default ``max_retries``) when it loses
        a lock race. A :class:`Refusal` returned from ``work`` commits the transaction (its audit event), then its
        error is raised."""

        def once() -> T:
            with self.engine.begin() as conn:
                result = work(conn)
                self._check_same_file(conn.connection.info, conn.invalidate)
                return result

        return self._retried(once, retries)

    def _retried(self, once: Callable[[], T], retries: int | None) -> T:
        """``once()`` (one write transaction), again after a jittered exponential backoff (from 10 ms, capped at
        1 s) while it loses a lock race, at most ``retries`` more times (default ``max_retries``); a
        :class:`Refusal` it returns is raised as its error."""
        delay = 0.01
        retries = self.max_retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                result = once()
            except sa.exc.DBAPIError as error:
                self._raise_if_read_only(error)
                if attempt == retries or not _is_retryable(error):
                    raise
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 1.0)
                continue
            if isinstance(result, Refusal):
                raise result.error
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _write_driver(
        self, work: Callable[[Any], T], *, retries: int | None = None, before: Callable[[Any], None] | None = None
    ) -> T:
        """:meth:`_write` for the spend path on SQLite: the same ``BEGIN IMMEDIATE`` transaction, retries and
        :class:`Refusal`, with ``work`` given a :class:`~dp_operators.ledger.sqlite_driver.DriverConnection` on the
        pooled ``sqlite3`` connection instead of a SQLAlchemy ``Connection`` (the same statements, compiled once,
        without SQLAlchemy's per-statement work; ADR 29). ``before`` runs first on the same connection outside the
        transaction (its reads take no write lock, so a check that refuses early does not queue for it). Other
        databases: :meth:`_write` (``before`` in a transaction of its own)."""
        if self.dialect != "sqlite":
            if before is not None:
                with self._read() as conn:
                    before(conn)
            return self._write(work, retries=retries)
        return self._retried(lambda: self._in_driver_transaction(self.engine, "BEGIN IMMEDIATE", work, before), retries)

    def _check_same_file(self, info: Mapping[str, Any], invalidate: Callable[[], None]) -> None:
        """Before a SQLite write commits: raise :class:`LedgerNotInitialisedError` (the transaction then rolls back,
        and ``invalidate`` drops the connection from the pool) if the file this connection opened is no longer the
        file at the ledger's path: deleted, or replaced (moved away, restored over). A commit into an unlinked file
        would be lost with it, and a release would publish a result whose charge no ledger holds."""
        opened = info.get("file")
        if self.dialect != "sqlite" or opened is None or sqlite_file_identity(self.engine.url) == opened:
            return
        invalidate()
        path = sqlite_file(self.engine.url)
        now = "holds another file" if path is not None and path.exists() else "holds no file"
        raise LedgerFileReplacedError(
            f"the SQLite ledger {path} was deleted or replaced while this process had it open (its path now {now}); "
            "nothing was committed, and nothing of this release is published. Restore the ledger file from its "
            "backup (a copy taken with sqlite3's .backup, with the privacy officer); 'dpctl ledger init' would make "
            "a new, empty ledger that forgets every charge"
        )

    def _raise_if_read_only(self, error: sa.exc.DBAPIError) -> None:
        """Raise :class:`LedgerAccessError` naming the file and the fix for SQLite's "attempt to write a readonly
        database" (the file, or its folder, where SQLite keeps the ``-wal`` and ``-shm`` files, not writable by this
        process, or a ``mode=ro`` URI): no retry makes it writable."""
        if self.dialect != "sqlite" or "readonly database" not in str(error.orig):
            return
        path = self.engine.url.database or "?"
        raise LedgerAccessError(
            f"the SQLite ledger {path} is read-only for this process ({error.orig}); nothing was written. Give the "
            "user that runs the workers (and dpctl) write access to the file and to its folder, where SQLite keeps "
            "its -wal and -shm files (chown/chmod), or point the ledger connection at the writable file (not a "
            "mode=ro URI)"
        ) from None

    def _in_driver_transaction(
        self, engine: Engine, begin: str, work: Callable[[Any], T], before: Callable[[Any], None] | None = None
    ) -> T:
        plans = self.__dict__.setdefault("_driver_plans", {})
        pooled = engine.raw_connection()
        try:
            connection = pooled.driver_connection
            driver = DriverConnection(connection, engine.dialect, plans)
            statement = begin
            try:
                if before is not None:
                    before(driver)
                connection.execute(begin)
                result = work(driver)
                if begin != "BEGIN":
                    self._check_same_file(pooled.info, lambda: None)
                statement = "COMMIT"
                connection.execute(statement)
                return result
            except BaseException as error:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                if isinstance(error, LedgerFileReplacedError):
                    pooled.invalidate()
                raise
        except sqlite3.Error as error:
            raise driver_error(error, engine.dialect, statement, ()) from error
        finally:
            pooled.close()

    def _read(self) -> Any:
        return self._reader.begin()

    def _db_now(self, conn: Connection) -> dt.datetime:
        """The clock leases are measured on: the server's on PostgreSQL (workers' clocks may differ;
        ``clock_timestamp()``, not the transaction's start, so a lock wait does not shorten a granted lease), this
        machine's on SQLite (a single-machine database)."""
        if self.dialect == "postgresql":
            return conn.execute(_DB_NOW).scalar()
        return dt.datetime.now(dt.timezone.utc)

    # -- schema ------------------------------------------------------------------------------------------------
    def _schema_version(self) -> int | None:
        with self._read() as conn:
            if not sa.inspect(conn).has_table(schema.schema_version.name):
                return None
            return conn.execute(sa.select(sa.func.max(schema.schema_version.c.version))).scalar()

    def check_schema(self) -> None:
        """Raise :class:`LedgerNotInitialisedError` unless the ledger's schema is present at the expected version."""
        if self._schema_checked:
            return
        missing = self._missing_sqlite_file()
        if missing is not None:  # connecting would create an empty file, and 'init' there an empty ledger
            raise LedgerNotInitialisedError(
                f"no ledger at {missing}: the file does not exist (deleted, moved, or a wrong path; an absolute path "
                "takes four slashes, sqlite:////path). Nothing was reserved. Point the ledger connection at the "
                "ledger's file, or restore it from its backup; 'dpctl ledger init' there would start a new, empty "
                "ledger whose budget forgets every earlier charge"
            )
        version = self._schema_version()
        if version is None:
            hidden = self._schemas_without_usage()
            if hidden:
                raise LedgerAccessError(
                    f"the ledger at {self.url}: this login may not use schema {', '.join(hidden)} on its search_path "
                    "(no USAGE), so it sees no ledger there. Its role is not the spender, governor or reader role "
                    "or a member of one: the tables' owner runs 'dpctl ledger roles --execute' (with --config for "
                    "team roles) and grants the login one of those roles. Nothing was reserved"
                )
            raise LedgerNotInitialisedError(f"the ledger at {self.url} has no schema; run 'dpctl ledger init' first")
        if version != schema.SCHEMA_VERSION:
            raise LedgerNotInitialisedError(
                f"ledger schema version {version} found, this package needs {schema.SCHEMA_VERSION}; "
                "a privacy officer runs 'dpctl ledger init' to upgrade it"
            )
        self._schema_checked = True

    def _schemas_without_usage(self) -> list[str]:
        """PostgreSQL: schemas named on the session's ``search_path`` that exist but this login may not use (they
        drop out of its effective path, so the ledger's tables look absent)."""
        if self.dialect != "postgresql":
            return []
        with self._read() as conn:
            return list(conn.exec_driver_sql(
                "SELECT n.nspname FROM pg_catalog.pg_namespace n WHERE n.nspname = ANY (string_to_array("
                "replace(replace(current_setting('search_path'), ' ', ''), '\"', ''), ',')) "
                "AND NOT has_schema_privilege(n.oid, 'USAGE') ORDER BY n.nspname"
            ).scalars())

    def _missing_sqlite_file(self) -> str | None:
        """The path of a SQLite ledger file that does not exist (checked before any connection creates it)."""
        path = sqlite_file(self.engine.url)
        return None if path is None or path.exists() else str(path)

    # -- reading ---------------------------------------------------------------------------------------------------
    def account(self, name: str) -> AccountStatus:
        """The status of account ``name``. Raises :class:`AccountNotFoundError`."""
        self.check_schema()
        with self._read() as conn:
            row = conn.execute(_ACCOUNT, {"account": name}).first()
            if row is None:
                raise AccountNotFoundError(not_found(name))
            return account_status(row, *reserved_totals(conn, name))

    def account_config(self, name: str) -> dict | None:
        """The stored configuration record of account ``name`` (what ``dpctl ledger apply`` wrote: its blocks,
        quotas, approval policy...), or ``None`` if it has none readable
        (:func:`~dp_operators.ledger.structure.config_record`).

        Raises:
            AccountNotFoundError: no such account.
        """
        self.check_schema()
        with self._read() as conn:
            row = conn.execute(sa.select(schema.accounts.c.config).where(schema.accounts.c.name == name)).first()
        if row is None:
            raise AccountNotFoundError(not_found(name))
        return config_record(row.config)

    def accounts_requiring_enforced_bounding(self) -> set[str]:
        """The names of the accounts (members included) whose stored configuration requires enforced contribution
        bounding (:func:`~dp_operators.ledger.structure.requires_enforced_bounding`). One read."""
        from dp_operators.ledger.structure import REQUIRE_ENFORCED_BOUNDING, requires_enforced_bounding

        self.check_schema()
        accounts = schema.accounts.c
        with self._read() as conn:
            rows = conn.execute(sa.select(accounts.name, accounts.config)
                                .where(accounts.config.like(f"%{REQUIRE_ENFORCED_BOUNDING}%"))).all()
        return {row.name for row in rows if requires_enforced_bounding(config_record(row.config))}

    def structure(self, name: str) -> tuple[str, Any]:
        """The budget structure of account ``name`` (:func:`~dp_operators.ledger.structure.structure_of`):
        ``("blocks", "day")``, ``("quotas", {team: {...}})``, ``("member", parent)`` or ``("plain", None)``, read
        from its stored configuration (which only ``dpctl ledger apply`` writes).

        Raises:
            AccountNotFoundError: no such account.
        """
        return structure_of(self.account_config(name))

    def approval_state(self, name: str, key: ReleaseKey, charged: Fraction) -> dict[str, Any] | None:
        """What account ``name``'s approval policy makes of a charge of ``charged`` for ``key`` now (amount
        rules; :mod:`dp_operators.ledger.approvals`): ``None`` when it needs no approval, else
        :func:`~dp_operators.ledger.approvals.approval_state`'s answer (``granted``, ``rejected``, ``pending`` or
        ``none``) for the key on the account that holds its approvals. Reads only.

        Raises:
            AccountNotFoundError: no such account.
        """
        from dp_operators.ledger import approvals

        status = self.account(name)
        self.check_schema()
        with self._read() as conn:
            row = conn.execute(sa.select(schema.accounts.c.name, schema.accounts.c.config,
                                         schema.accounts.c.spend_key_id)
                               .where(schema.accounts.c.name == name)).first()
            policy = approvals.policy_of(row.config)
            if policy is None or not approvals.approval_reasons(policy, charged, max(status.remaining, Fraction(0))):
                return None
            where = approvals.approval_account(row.name, row.config)
            return approvals.approval_state(approvals._key_events(conn, where, key), row.spend_key_id, charged,
                                            approvals.timeout_of(policy), dt.datetime.now(dt.timezone.utc),
                                            approvals.block_of(row.config))

    def members(self, name: str) -> list[AccountStatus]:
        """The member accounts of ``name`` (its privacy blocks or team quotas), by name."""
        return [a for a in self.accounts() if a.name.startswith(name + MEMBER_SEPARATOR)]

    def account_names(self) -> list[str]:
        """The names of all accounts, sorted (read even where an account's other values are unreadable)."""
        self.check_schema()
        with self._read() as conn:
            return [str(name) for name in conn.execute(
                sa.select(schema.accounts.c.name).order_by(schema.accounts.c.name)).scalars()]

    def accounts(self) -> list[AccountStatus]:
        """All accounts, by name.

        Raises:
            UnreadableValueError: an account holds a value the ledger never writes (:meth:`account_names` and
                :meth:`account` read the others one by one).
        """
        self.check_schema()
        with self._read() as conn:
            rows = conn.execute(sa.select(*ACCOUNT_READ_COLUMNS).order_by(schema.accounts.c.name)).all()
            return [account_status(row, *reserved_totals(conn, row.name)) for row in rows]

    def series(self, account: str | None = None) -> list[dict[str, Any]]:
        """The series in the ledger (docs/adr/0033): one entry per ``(account, dag_id, task_id, map_index,
        release_name, generation)``, read from its steps' charges (run ids ``__dp_series__/g<g>/step/<t>``):
        ``steps_committed``, ``last_step`` (0-based, ``None`` before the first), ``horizon`` (from the steps'
        recorded mechanisms; ``None`` if none names it), ``steps_left``, ``charged`` (exact, the account's unit:
        the series' charge plus its redraws), ``redraws`` (step attempts after a step's first), by account and key.

        Raises:
            UnreadableValueError: a step's amount or mechanisms is not what the ledger writes.
        """
        self.check_schema()
        c = schema.charges.c
        query = sa.select(c.id, c.account, c.dag_id, c.task_id, c.map_index, c.release_name, c.run_id, c.attempt,
                          c.state, c.amount, c.mechanisms).where(
            c.run_id.startswith(SERIES_RUN_PREFIX, autoescape=True)).order_by(c.id)
        if account is not None:
            query = query.where(c.account == account)
        found: dict[tuple, dict[str, Any]] = {}
        with self._read() as conn:
            for row in conn.execute(query):
                match = SERIES_STEP_RUN_ID.fullmatch(row.run_id)
                if match is None:
                    continue
                generation, step = int(match[1]), int(match[2])
                entry = found.setdefault(
                    (row.account, row.dag_id, row.task_id, row.map_index, row.release_name, generation),
                    {"account": row.account, "dag_id": row.dag_id, "task_id": row.task_id,
                     "map_index": row.map_index, "release_name": row.release_name, "generation": generation,
                     "committed": set(), "horizon": None, "charged": Fraction(0), "redraws": 0})
                if row.state != "released":  # a released attempt's amount came back to the account
                    entry["charged"] += ledger_number(row.amount, table="dp_charges", row=row.id, column="amount")
                entry["redraws"] += row.attempt > 1
                if row.state == "committed":
                    entry["committed"].add(step)
                if entry["horizon"] is None:
                    described = ledger_json(row.mechanisms, table="dp_charges", row=row.id, column="mechanisms")
                    horizons = [m.get("horizon") for m in described if isinstance(m, dict)] \
                        if isinstance(described, list) else []
                    entry["horizon"] = next((h for h in horizons if type(h) is int), None)
        summaries = []
        for key in sorted(found, key=lambda key: tuple(map(str, key))):  # a SQLite column may hold any type
            entry = found[key]
            committed = entry.pop("committed")
            entry["steps_committed"] = len(committed)
            entry["last_step"] = max(committed, default=None)
            entry["steps_left"] = None if entry["horizon"] is None else max(entry["horizon"] - len(committed), 0)
            summaries.append(entry)
        return summaries

    def stored_output(self, key: ReleaseKey, account: str | None = None) -> dict | None:
        """The committed output of ``key`` on ``account`` (parsed JSON), or ``None`` if it has none (on an account
        with privacy blocks: on its first block charged, which holds the same output as the others). Without
        ``account``, the key's committed output on whichever account holds one: a DAG id allowed on accounts of two
        teams lets each commit the same release key on its own account, and one team's must never stand for the
        other's, so a key committed on several accounts is refused rather than one picked.

        Raises:
            LedgerNotInitialisedError: the ledger has no schema.
            AmbiguousReleaseKeyError: no ``account`` given, and the key is committed on several accounts.
            UnreadableValueError: the stored output is not JSON within the bounds of
                :func:`~dp_operators.ledger.bounded.read_json` (at most ``MAX_OUTPUT_CHARS`` characters).
        """
        self.check_schema()
        with self._read() as conn:
            rows = list(conn.execute(_COMMITTED_ACCOUNTS, key.as_dict()))
            if account is not None:  # privacy blocks: the charge, and its output, is on each block
                rows = own_or_first_block(rows, account, of=lambda row: row.account)
            if len({row.account for row in rows}) > 1:
                raise AmbiguousReleaseKeyError(
                    f"release {key} is committed on accounts {', '.join(sorted(repr(r.account) for r in rows))}: "
                    "a DAG id allowed on accounts of two teams; name the account whose output is meant (the "
                    "release's budget_account)"
                )
            row = conn.execute(_COMMITTED_OUTPUT_BY_ID, {"charge_id": rows[0].id}).first() if rows else None
        if row is None or row.output is None:
            return None
        return ledger_json(row.output, table="dp_charges", row=row.id, column="output", max_chars=MAX_OUTPUT_CHARS)

    def charges(
        self,
        account: str | None = None,
        dag_id: str | None = None,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        state: str | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> Iterator[dict]:
        """Charges (every column but ``output`` and ``token_hash``), by id, streamed from the database (the schema
        is checked at the call, the rows are read as the iterator is consumed).

        Values are as stored; a timestamp that is not one (SQLite: any text; PostgreSQL: beyond the years 1 to
        9999, which the driver cannot return) comes back as its text, or ``None`` on PostgreSQL, instead of making
        the read raise. :func:`read_charge` checks a row against the bounds its readers need.

        Args:
            account, dag_id, state: filters.
            since, until: creation time, ``since`` inclusive, ``until`` exclusive.
            after: only charges with an id greater than this (a page cursor: pass the last id seen).
            limit: at most this many charges.
        """
        self.check_schema()
        c = schema.charges.c
        shown_columns = [column for column in c if column.name not in ("output", "token_hash")]
        query = sa.select(*[timestamp_column(column, self.dialect) for column in shown_columns]).order_by(c.id)
        filters = [
            (account, lambda: c.account == account),
            (dag_id, lambda: c.dag_id == dag_id),
            (state, lambda: c.state == state),
            (since, lambda: c.created_at >= since),
            (until, lambda: c.created_at < until),
            (after, lambda: c.id > after),
        ]
        for value, condition in filters:
            if value is not None:
                query = query.where(condition())
        if limit is not None:
            query = query.limit(limit)
        return self._stream(query, timestamps=_TIMESTAMP_COLUMNS)

    def events(self, account: str | None = None, *, after: int | None = None, limit: int | None = None) -> Iterator[dict]:
        """Audit events in insertion order (``id``), optionally of one account, after an id, at most ``limit``;
        every column, streamed from the database."""
        self.check_schema()
        e = schema.audit_events.c
        query = sa.select(schema.audit_events).order_by(e.id)
        if account is not None:
            query = query.where(e.account == account)
        if after is not None:
            query = query.where(e.id > after)
        if limit is not None:
            query = query.limit(limit)
        return self._stream(query)

    def _stream(self, query: Any, timestamps: frozenset[str] = frozenset()) -> Iterator[dict]:
        """Rows of ``query`` as dicts, read in batches; on SQLite the ``timestamps`` columns (selected as text by
        :func:`timestamp_column`) become datetimes where they hold one."""
        sqlite = self.dialect == "sqlite" and timestamps
        with self._reader.connect() as conn:
            with conn.begin():
                lenient_sqlite_text(conn)
                result = conn.execution_options(stream_results=True, yield_per=STREAM_BATCH).execute(query)
                for row in result:
                    values = dict(row._mapping)
                    if sqlite:
                        for name in timestamps.intersection(values):
                            values[name] = sqlite_timestamp(values[name])
                    yield values


def user_name() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no user name in some containers
        return None


def show(value: Fraction) -> str:
    decimal = f"{float(value):.6g}"
    return decimal if Fraction(decimal) == value else f"{value} (~{decimal})"


def not_found(name: str) -> str:
    return (
        f"budget account {name!r} is not in the ledger; a privacy officer adds it to the ledger "
        "configuration (config/ledgers.yaml) and runs 'dpctl ledger apply'"
    )


def stored_config(values: Any) -> dict[str, Any]:
    """The governed fields of an account row (or of the values about to be written), for audit comparison."""
    get = values.get if isinstance(values, Mapping) else lambda name: getattr(values, name)
    return {name: get(name) for name in schema.ACCOUNT_GOVERNED_COLUMNS}


#: The timestamp columns of ``dp_charges`` (``DateTime``); ``dp_audit_events.created_at`` is text.
_TIMESTAMP_COLUMNS = frozenset({"created_at", "updated_at", "lease_expires_at"})
#: The instants PostgreSQL's driver can return whatever the session's time zone (a day inside the years 1 to 9999).
_PG_FIRST, _PG_LAST = "0001-01-02 00:00:00+00", "9999-12-30 00:00:00+00"
#: Longest text a SQLite timestamp is parsed from (``2026-01-31 12:00:00.123456+00:00`` is 32).
_TIMESTAMP_CHARS = 40
#: Every number column and JSON column of the ledger's tables (``output`` is read alone, with its own bound).
NUMBER_COLUMNS = frozenset({"amount", "delta_amount", "cap", "spent", "delta", "delta_spent", "spent_after",
                            "delta_spent_after"})
JSON_COLUMNS = frozenset({"mechanisms", "context", "details", "allowed_dags", "allowed_roles", "config"})
#: What each JSON column must hold at its top level, where the readers rely on it.
_JSON_SHAPES: dict[str, tuple[type, ...]] = {"mechanisms": (list,), "context": (dict,), "details": (dict,),
                                              "allowed_dags": (list,), "allowed_roles": (list,), "config": (dict,)}
_CHARGE_STATES = frozenset({"reserved", "committed", "released", "abandoned"})
#: Text columns whose value is also checked against a list (a charge's state, an account's accountant).
_CHECKED_TEXT = frozenset({"state", "accountant"})
#: The ranges of an account's numbers (``ledger apply`` and the spend path keep them), which the conversions to
#: epsilon need: a cap and its delta of 1 or more, or a negative spend, would make them raise.
_ACCOUNT_RANGES = {
    "cap": (lambda value: value > 0, "> 0"),
    "delta": (lambda value: 0 < value < 1, "in (0, 1)"),
    "spent": (lambda value: value >= 0, ">= 0"),
    "delta_spent": (lambda value: value >= 0, ">= 0"),
}
_INT64 = 2**63


#: Decodes SQLite text as UTF-8 with replacement characters (a C-level call: no Python frame per value).
_replace_undecodable = functools.partial(bytes.decode, encoding="utf-8", errors="replace")


def lenient_sqlite_text(conn: Connection, lenient: bool = True) -> None:
    """On SQLite, make ``conn`` read text that is not UTF-8 (a hostile ``CAST(x'ff' AS TEXT)``) with replacement
    characters instead of failing the whole read (``lenient``; else back to SQLite's own decoding, which is faster
    and raises on such text); the ledger writes only UTF-8, which reads the same either way. Nothing on other
    databases (PostgreSQL checks the encoding of what it stores)."""
    if conn.dialect.name == "sqlite":
        conn.connection.driver_connection.text_factory = _replace_undecodable if lenient else str


def timestamp_column(column: sa.Column, dialect: str) -> Any:
    """``column`` as a reader selects it so that no stored value makes the read itself raise: on SQLite a
    ``DateTime`` column as its text (SQLAlchemy's parser raises on anything else; :func:`sqlite_timestamp` reads
    it), on PostgreSQL a ``DateTime`` value outside the years 1 to 9999 (``infinity``, ``20000-01-01``, BC) as
    NULL (psycopg cannot return one); any other column as it is."""
    if not isinstance(column.type, sa.DateTime):
        return column
    if dialect == "sqlite":
        return sa.type_coerce(column, sa.String).label(column.name)
    if dialect == "postgresql":
        inside = sa.and_(column >= sa.literal(_PG_FIRST).cast(column.type),
                         column <= sa.literal(_PG_LAST).cast(column.type))
        return sa.case((inside, column), else_=sa.null()).label(column.name)
    return column


def sqlite_timestamp(value: Any) -> Any:
    """A SQLite timestamp's stored text as the naive UTC datetime SQLAlchemy would return; any other value (a text
    that is no timestamp, a number) as it is, for :func:`read_row` to name."""
    if isinstance(value, str) and len(value) <= _TIMESTAMP_CHARS:
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return value
        return parsed.astimezone(dt.timezone.utc).replace(tzinfo=None) if parsed.tzinfo else parsed
    return value


def _row_label(table: sa.Table, values: Mapping[str, Any]) -> Any:
    return values.get("name") if table.name == schema.accounts.name else values.get("id")


@functools.cache
def _column_specs(table: sa.Table) -> dict[str, tuple[str, bool, int]]:
    """Per column of ``table``: what it holds (``number``, ``json``, ``output``, ``time``, ``int`` or ``text``),
    whether it may be NULL, and the longest text it holds; computed once per table."""
    specs = {}
    for column in table.c:
        name, kind = column.name, column.type
        if name in NUMBER_COLUMNS:
            what = "number"
        elif name == "output":
            what = "output"
        elif name in JSON_COLUMNS:
            what = "json"
        elif isinstance(kind, sa.DateTime):
            what = "time"
        elif isinstance(kind, sa.Integer):
            what = "int"
        else:
            what = "text"
        specs[name] = (what, column.nullable or name == "id", getattr(kind, "length", None) or MAX_JSON_CHARS)
    return specs


def _column_problem(table: sa.Table, name: str, value: Any) -> tuple[Any, str | None]:
    """``(value as the readers use it, None)``, or ``(None, what is wrong)``: numbers become ``Fraction``, JSON
    text its value (an output stays its text, only checked: :func:`~dp_operators.ledger.bounded.check_json`),
    timestamps must be datetimes, text must fit its column, integers 64 bits."""
    what, nullable, limit = _column_specs(table)[name]
    if value is None:
        if nullable:
            return None, None
        if what == "time":  # timestamp_column reads one the driver cannot return as NULL
            return None, "is empty (NULL), or a time outside the years 1 to 9999"
        return None, "is empty (NULL)"
    if what == "text":
        if type(value) is not str:
            return None, f"holds {shown(value)}, not text"
        if len(value) > limit:
            return None, f"is {len(value):,} characters long, more than the {limit:,} its column holds"
        if name == "state" and table is schema.charges and value not in _CHARGE_STATES:
            return None, f"is {shown(value)}, not a state of a charge"
        if name == "accountant" and value not in ACCOUNTANTS:
            return None, f"is {shown(value)}, not an accountant"
        return value, None
    if what == "int":
        if type(value) is int and -_INT64 <= value < _INT64:
            return value, None
        return None, f"holds {shown(value)}, not a 64-bit integer"
    if what == "time":
        return (value, None) if isinstance(value, dt.datetime) else (None, f"holds {shown(value)}, not a time")
    try:
        if what == "number":
            number = read_number(value)
            if table is schema.accounts and name in _ACCOUNT_RANGES:
                inside, wanted = _ACCOUNT_RANGES[name]
                if not inside(number):
                    return None, f"is outside what an account holds ({name} {wanted})"
            return number, None
        if what == "output":  # checked, not parsed: a long output is read as a stream, building no value
            from dp_operators.ledger.bounded import check_json

            check_json(value, max_chars=MAX_OUTPUT_CHARS)
            return value, None
        parsed = read_json(value)
    except BoundsError as error:
        return None, str(error)
    if not isinstance(parsed, _JSON_SHAPES[name]):
        return None, f"holds JSON {type(parsed).__name__}, not the {_JSON_SHAPES[name][0].__name__} it stores"
    if name in ("allowed_dags", "allowed_roles") and not all(isinstance(item, str) for item in parsed):
        return None, "holds a list with an item that is not a string"
    return parsed, None


@dataclass(frozen=True)
class ReadRow:
    """A ledger row checked column by column (:func:`read_row`).

    Attributes:
        values: every column read, as the readers use it: numbers as ``Fraction``, JSON columns as their value
            (but ``output``: its text, checked to be JSON the readers accept without building its value, which may
            hold millions of values; :func:`~dp_operators.ledger.bounded.read_json_cut` reads it within bounds),
            the rest as stored; ``None`` where a value is unreadable.
        problems: one :class:`~dp_operators.ledger.errors.UnreadableValueError` per unreadable column (table, row,
            column, reason), in column order; empty when the row is readable.
    """

    values: dict[str, Any]
    problems: tuple[UnreadableValueError, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def reasons(self) -> list[str]:
        """Each problem as ``column [value] what is wrong`` (the row is named by whoever shows them)."""
        return [problem.detail for problem in self.problems]

    @property
    def unreadable(self) -> frozenset[str]:
        """The unreadable columns."""
        return frozenset(problem.column for problem in self.problems)


def read_row(table: sa.Table, row: Mapping[str, Any] | Any) -> ReadRow:
    """Check every column of ``row`` (a mapping, or a SQLAlchemy row, of ``table``'s columns; any subset) against
    what the ledger writes, within the bounds of :mod:`dp_operators.ledger.bounded`. Never raises for a stored
    value: each unreadable column is a problem naming the table, the row (its id; an account's name) and the
    column. Costs one bounded parse per number and JSON column (an output: a check, in memory that does not grow
    with the values it holds)."""
    mapping = row if isinstance(row, Mapping) else row._mapping
    specs = _column_specs(table)
    values: dict[str, Any] = {}
    problems = []
    for name, value in mapping.items():
        what, nullable, limit = specs[name]
        # the common cases inline (this runs for every row verify reads); the rest in _column_problem
        if what == "text" and type(value) is str and len(value) <= limit and name not in _CHECKED_TEXT:
            values[name] = value
            continue
        if what == "int" and type(value) is int and -_INT64 <= value < _INT64:
            values[name] = value
            continue
        values[name], problem = _column_problem(table, name, value)
        if problem is not None:
            label = _row_label(table, mapping)
            if table is schema.accounts and not (isinstance(label, str) and len(label) <= 200):
                label = shown(label)  # a name that is itself unreadable is shown cut, never in full
            quoted = None if what in ("json", "output") or problem.startswith("holds") else value
            problems.append(UnreadableValueError(table.name, label, name, problem, value=quoted))
    return ReadRow(values, tuple(problems))


def read_charge(row: Mapping[str, Any]) -> ReadRow:
    """:func:`read_row` of a ``dp_charges`` row as :meth:`LedgerBase.charges` yields it."""
    return read_row(schema.charges, row)


def reserved_totals(conn: Connection, name: str) -> tuple[Fraction, Fraction]:
    """The amount and delta of account ``name``'s reserved charges: exact while the sum's denominator stays within
    ``MAX_DENOMINATOR**2`` (any number of the ledger's own charges, whose denominators divide 10^18), else rounded
    up to multiples of ``1/MAX_DENOMINATOR`` (rounding only overstates what is in flight), so no number of charges
    with large coprime denominators can grow the sum without bound.

    Raises:
        UnreadableValueError: a reserved charge's amount or delta is not a number the ledger writes.
    """
    amount, delta = Fraction(0), Fraction(0)
    for row in conn.execute(_RESERVED_AMOUNTS, {"account": name}):
        read = read_row(schema.charges, row)
        if not read.ok:
            raise read.problems[0]
        amount = _bounded_sum(amount, read.values["amount"])
        delta = _bounded_sum(delta, read.values["delta_amount"])
    return amount, delta


def _bounded_sum(total: Fraction, value: Fraction) -> Fraction:
    total += value
    return total if total.denominator <= MAX_DENOMINATOR**2 else round_up(total)


def account_status(row: Any, reserved: Fraction, delta_reserved: Fraction) -> AccountStatus:
    """The :class:`AccountStatus` of an account row (any columns of :data:`ACCOUNT_READ_COLUMNS`).

    Raises:
        UnreadableValueError: a column holds a value the ledger does not write (the first one, naming the account
            and the column; :func:`read_row` lists them all).
    """
    read = read_row(schema.accounts, row)
    if not read.ok:
        raise read.problems[0]
    values = read.values
    return AccountStatus(
        name=values["name"],
        accountant=values["accountant"],
        unit=unit_of(values["accountant"]),
        cap=values["cap"],
        spent=values["spent"],
        reserved=reserved,
        delta=values["delta"],
        privacy_unit=values["privacy_unit"],
        allowed_dags=tuple(values["allowed_dags"]),
        delta_spent=values["delta_spent"],
        delta_reserved=delta_reserved,
        owner=values["owner"],
        description=values["description"],
        spend_key_id=values["spend_key_id"],
    )
