"""The budget ledger: accounts, atomic check-and-reserve, commit of the noised output, idempotent replay, audit.

Life cycle of a charge (DESIGN.md section 3): ``reserved -> committed`` (noised output stored),
``reserved -> released`` (noise provably never drawn: the amount is returned), ``reserved -> abandoned`` (a
reservation of unknown fate found by a later attempt of the same release key: it stays counted as spent).

Every write is one transaction serialised per account: ``BEGIN IMMEDIATE`` on SQLite (the whole file is
write-locked) and ``SELECT ... FOR UPDATE`` on the account row on PostgreSQL. The account row holds the running
totals and the head of the account's audit chain, so a check-and-reserve reads one row whatever the history.
Transactions that lose a lock race (SQLite ``database is locked``, PostgreSQL serialization failures, deadlocks
and lock timeouts) are retried with jittered exponential backoff: they rolled back, so a retry is safe.

Every state change appends an event to ``dp_audit_events`` in the same transaction: account created, updated or
migrated (``dpctl ledger apply``/``init``), reserved, committed, released, abandoned, refused. Each event holds the
SHA-256 of the previous event of its account (a hash chain, :func:`audit_row_hash`); database triggers refuse
UPDATE and DELETE on the table, and :meth:`Ledger.verify` recomputes the chains and cross-checks them against the
running totals, the charges and the stored outputs. Events carry who/what/when and the mechanisms with their
parameters, the charge and the output's digest: never a true (raw) value.
"""

from __future__ import annotations

import datetime as dt
import getpass
import hashlib
import json
import os
import random
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dp_operators import __version__
from dp_operators.accounting import epsilon_at_delta, exact_number, round_down, round_up, unit_of
from dp_operators.ledger import schema
from dp_operators.ledger.config import LedgerConfig
from dp_operators.ledger.errors import (
    AccountNotFoundError,
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    LedgerNotInitialisedError,
)

T = TypeVar("T")

#: ``prev_hash`` of the first event of every account's chain.
GENESIS_HASH = "0" * 64

#: Keys an ``audit`` context may carry (anything else is refused, so no data value can slip into the log).
AUDIT_CONTEXT_KEYS = frozenset({"run_type", "triggering_user", "host", "package_version", "user", "pid"})

#: SQLSTATEs of PostgreSQL errors after which the transaction was rolled back and may be retried.
_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "55P03"})


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
    """

    charge_id: int
    key: ReleaseKey
    account: str
    amount: Fraction
    attempt: int
    delta: Fraction = Fraction(0)


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

    @property
    def remaining(self) -> Fraction:
        return round_down(max(self.cap - self.spent, Fraction(0)))

    @property
    def remaining_delta(self) -> Fraction | None:
        """The delta left on an ``approx_dp`` account (``None`` for other accountants)."""
        if self.accountant != "approx_dp" or self.delta is None:
            return None
        return max(self.delta - self.delta_spent, Fraction(0))

    def as_epsilon(self, amount: Fraction) -> float | None:
        """``amount`` reported as epsilon (at the account's delta for zCDP and Gaussian DP), rounded up."""
        return epsilon_at_delta(amount, self.accountant, self.delta)


@dataclass
class VerifyReport:
    """The result of :meth:`Ledger.verify`. ``problems`` is ordered: broken audit rows first, by row id."""

    events: int = 0
    accounts: int = 0
    charges: int = 0
    problems: list[str] = field(default_factory=list)
    heads: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def canonical_json(value: Any) -> str:
    """The canonical JSON text stored for outputs: sorted keys, no whitespace, NaN refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def audit_row_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of an audit row's canonical form: the canonical JSON of every column but ``id`` and
    ``row_hash`` (:data:`~dp_operators.ledger.schema.AUDIT_HASHED_COLUMNS`), ``prev_hash`` included. Values are
    text, integers or null, so the form is the same whichever database stored the row."""
    return hashlib.sha256(
        canonical_json({name: row[name] for name in schema.AUDIT_HASHED_COLUMNS}).encode("utf-8")
    ).hexdigest()


def audit_context(audit: Mapping[str, Any] | None = None, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The who/where of an event: ``base`` (e.g. the context stored with the charge), then ``audit``, over the
    defaults ``host`` (this machine), ``package_version`` and ``pid``.

    Raises:
        ValueError: a key outside :data:`AUDIT_CONTEXT_KEYS`, or a value that is not a string, integer or None.
    """
    context: dict[str, Any] = {"host": socket.gethostname(), "package_version": __version__, "pid": os.getpid()}
    for source in (base or {}), (audit or {}):
        for key, value in source.items():
            if key not in AUDIT_CONTEXT_KEYS:
                raise ValueError(f"audit context key {key!r} is not one of {sorted(AUDIT_CONTEXT_KEYS)}")
            if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
                raise ValueError(f"audit context {key!r} must be a string, an integer or None")
            context[key] = value
    return context


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def create_ledger_engine(url: str, *, read_only: bool = False) -> Engine:
    """Create a SQLAlchemy engine for a ledger URL (``sqlite:///path`` or ``postgresql+psycopg://...``).

    On SQLite, pysqlite's own transaction handling is switched off so every transaction starts with
    ``BEGIN IMMEDIATE`` (SQLAlchemy docs, "Serializable isolation / Savepoints / Transactional DDL" for pysqlite),
    which takes the write lock at once: two workers cannot both read the same remaining budget. A ``read_only``
    engine starts deferred transactions instead, so readers do not queue behind writers (WAL mode).
    """
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 60})
        begin = "BEGIN" if read_only else "BEGIN IMMEDIATE"

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_connection, _record) -> None:  # pragma: no cover - driver hook
            dbapi_connection.isolation_level = None
            dbapi_connection.execute("PRAGMA foreign_keys = ON")

        @sa.event.listens_for(engine, "begin")
        def _begin(connection) -> None:  # pragma: no cover - driver hook
            connection.exec_driver_sql(begin)

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def _is_retryable(error: sa.exc.DBAPIError) -> bool:
    original = error.orig
    if getattr(original, "sqlstate", None) in _RETRYABLE_SQLSTATES:
        return True
    text = str(original).lower()
    return "database is locked" in text or "database table is locked" in text or "database is busy" in text


class _Refusal(Exception):
    """Carries a refusal out of a transaction that must still commit (its audit event)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _lock_reserved_charge(conn: Connection, reservation: Reservation) -> tuple[Any, Any]:
    """Lock the reservation's account (its chain) and return ``(chain, charge)``; ``charge`` is ``None`` unless the
    charge still exists in state ``reserved`` (commit and release both need exactly that)."""
    chain = _AccountChain.lock(conn, reservation.account)
    charge = conn.execute(sa.select(schema.charges).where(schema.charges.c.id == reservation.charge_id)).first()
    if chain is None or charge is None or charge.state != "reserved":
        return chain, None
    return chain, charge


@dataclass
class _AccountChain:
    """An account row locked for this transaction: running totals and the head of its audit chain."""

    row: Any
    spent: Fraction
    delta_spent: Fraction
    seq: int
    head: str
    dirty: bool = False

    @classmethod
    def lock(cls, conn: Connection, name: str) -> _AccountChain | None:
        row = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == name).with_for_update()).first()
        if row is None:
            return None
        return cls(row, Fraction(row.spent), Fraction(row.delta_spent), row.audit_seq, row.audit_head or GENESIS_HASH)

    def append(self, conn: Connection, event: str, context: Mapping[str, Any], **fields: Any) -> None:
        """Append ``event`` to this account's chain (same transaction as the change it records)."""
        values: dict[str, Any] = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
        values.update(fields)
        if isinstance(values.get("mechanisms"), (list, dict)):
            values["mechanisms"] = canonical_json(values["mechanisms"])
        if isinstance(values.get("details"), dict):
            values["details"] = canonical_json(values["details"])
        for name in ("amount", "delta_amount"):
            if values[name] is not None:
                values[name] = str(values[name])
        self.seq += 1
        values.update(
            account=self.row.name,
            account_seq=self.seq,
            event=event,
            spent_after=str(self.spent),
            delta_spent_after=str(self.delta_spent),
            context=canonical_json(dict(context)),
            created_at=_now().isoformat(timespec="microseconds"),
            prev_hash=self.head,
        )
        values["row_hash"] = audit_row_hash(values)
        conn.execute(schema.audit_events.insert().values(**values))
        self.head = values["row_hash"]
        self.dirty = True

    def flush(self, conn: Connection, **extra: Any) -> None:
        """Write the running totals and chain head back to the account row."""
        if self.dirty or extra:
            conn.execute(
                schema.accounts.update()
                .where(schema.accounts.c.name == self.row.name)
                .values(
                    spent=str(self.spent),
                    delta_spent=str(self.delta_spent),
                    audit_seq=self.seq,
                    audit_head=self.head,
                    updated_at=_now(),
                    **extra,
                )
            )


def _charge_event_fields(charge: Any) -> dict[str, Any]:
    return {
        "charge_id": charge.id,
        "dag_id": charge.dag_id,
        "run_id": charge.run_id,
        "task_id": charge.task_id,
        "map_index": charge.map_index,
        "release_name": charge.release_name,
        "attempt": charge.attempt,
        "try_number": charge.try_number,
        "spec_hash": charge.spec_hash,
        "amount": charge.amount,
        "delta_amount": charge.delta_amount,
        "mechanisms": charge.mechanisms,
    }


class Ledger:
    """A persisted privacy-budget ledger.

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

    # -- transactions --------------------------------------------------------------------------------------------
    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one write transaction, retried when it loses a lock race. A :class:`_Refusal` returned
        from ``work`` commits the transaction (its audit event), then its error is raised."""
        delay = 0.01
        for attempt in range(self.max_retries + 1):
            try:
                with self.engine.begin() as conn:
                    result = work(conn)
            except sa.exc.DBAPIError as error:
                if attempt == self.max_retries or not _is_retryable(error):
                    raise
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 1.0)
                continue
            if isinstance(result, _Refusal):
                raise result.error
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _read(self) -> Any:
        return self._reader.begin()

    # -- schema ------------------------------------------------------------------------------------------------
    def init_schema(self) -> int:
        """Create the tables and the audit triggers if missing, upgrade an older schema in place, and record the
        schema version. Explicit (``dpctl ledger init``): never called at import. Idempotent.

        Returns the schema version. Raises :class:`LedgerNotInitialisedError` if the database holds a newer version.
        """
        dialect = self.engine.dialect.name
        found = self._schema_version()
        if found is not None and found > schema.SCHEMA_VERSION:
            raise LedgerNotInitialisedError(
                f"ledger schema version {found} is newer than the version {schema.SCHEMA_VERSION} this package "
                "uses; upgrade dp-operators"
            )
        if found == 1:
            self._upgrade_from_1()
        if dialect == "sqlite":
            # WAL lets readers proceed while a writer holds the lock; synchronous stays FULL (the default), so a
            # committed reservation survives a power loss before any noise is drawn. Outside any transaction.
            raw = self.engine.raw_connection()
            try:
                raw.driver_connection.execute("PRAGMA journal_mode=WAL")
            finally:
                raw.close()
        schema.metadata.create_all(self.engine)

        def create(conn: Connection) -> None:
            for statement in schema.audit_trigger_ddl(dialect):
                conn.exec_driver_sql(statement)
            if not conn.execute(sa.select(schema.schema_version.c.version)).first():
                conn.execute(schema.schema_version.insert().values(version=schema.SCHEMA_VERSION, applied_at=_now()))

        self._write(create)
        self._schema_checked = False
        return schema.SCHEMA_VERSION

    def _schema_version(self) -> int | None:
        if not sa.inspect(self.engine).has_table(schema.schema_version.name):
            return None
        with self._read() as conn:
            return conn.execute(sa.select(sa.func.max(schema.schema_version.c.version))).scalar()

    def _upgrade_from_1(self) -> None:
        """Schema 1 -> 2: add the new columns, create the audit table, and start every account's chain with an
        ``account_migrated`` event recording its totals (charges made before have no events of their own)."""
        dialect = self.engine.dialect
        added = {
            schema.accounts: ("delta_spent", "config", "audit_seq", "audit_head"),
            schema.charges: ("delta_amount", "context"),
        }
        with self.engine.begin() as conn:
            for table, names in added.items():
                for name in names:
                    column = table.c[name]
                    default = f" DEFAULT '{column.server_default.arg}'" if column.server_default is not None else ""
                    null = " NOT NULL" if not column.nullable else ""
                    conn.exec_driver_sql(
                        f"ALTER TABLE {table.name} ADD COLUMN {name} {column.type.compile(dialect)}{default}{null}"
                    )
        schema.metadata.create_all(self.engine)

        def migrate(conn: Connection) -> None:
            last_charge = conn.execute(sa.select(sa.func.max(schema.charges.c.id))).scalar() or 0
            names = conn.execute(sa.select(schema.accounts.c.name).order_by(schema.accounts.c.name)).scalars().all()
            for name in names:
                chain = _AccountChain.lock(conn, name)
                assert chain is not None
                chain.append(
                    conn,
                    "account_migrated",
                    audit_context({"user": _user()}),
                    details={"from_schema": 1, "last_charge_id": last_charge, "stored": _stored_config(chain.row)},
                )
                chain.flush(conn)
            conn.execute(schema.schema_version.insert().values(version=schema.SCHEMA_VERSION, applied_at=_now()))

        self._write(migrate)

    def check_schema(self) -> None:
        """Raise :class:`LedgerNotInitialisedError` unless the ledger's schema is present at the expected version."""
        if self._schema_checked:
            return
        version = self._schema_version()
        if version is None:
            raise LedgerNotInitialisedError(
                f"the ledger at {self.url} has no schema; run 'dpctl ledger init' first"
            )
        if version != schema.SCHEMA_VERSION:
            raise LedgerNotInitialisedError(
                f"ledger schema version {version} found, this package needs {schema.SCHEMA_VERSION}; "
                "run 'dpctl ledger init' to upgrade it"
            )
        self._schema_checked = True

    # -- governance ----------------------------------------------------------------------------------------------
    def apply_config(self, config: LedgerConfig, *, audit: Mapping[str, Any] | None = None) -> list[str]:
        """Create or update accounts from a :class:`LedgerConfig`; every change is an audit event
        (``account_created``/``account_updated`` with the configuration as written and the values stored).
        This is the only way a cap changes. Returns a line per change made.

        An account's accountant is fixed at creation, and its privacy unit once anything was charged to it; a cap
        may not go below what is already spent. Accounts in the ledger but not in ``config`` are left as they are
        (their history stays).

        Raises:
            ValueError: changing an accountant, changing the privacy unit of an account that was charged, or a cap
                below the spent amount (nothing is changed).
            LedgerNotInitialisedError: no schema.
        """
        self.check_schema()
        context = audit_context({"user": _user(), **(audit or {})})
        prepared = {name: (account, _account_values(account)) for name, account in sorted(config.accounts.items())}

        def work(conn: Connection) -> list[str]:
            changes: list[str] = []
            for name, (account, values) in prepared.items():
                chain = _AccountChain.lock(conn, name)
                if chain is None:
                    now = _now()
                    conn.execute(
                        schema.accounts.insert().values(
                            name=name, spent="0", delta_spent="0", audit_seq=0, created_at=now, updated_at=now,
                            **values,
                        )
                    )
                    chain = _AccountChain.lock(conn, name)
                    assert chain is not None
                    chain.append(
                        conn, "account_created", context,
                        details={"config": account.as_record(), "stored": _stored_config(values)},
                    )
                    chain.flush(conn)
                    changes.append(
                        f"created account {name!r} ({account.accountant}, cap {_show(Fraction(values['cap']))} "
                        f"{unit_of(account.accountant)})"
                    )
                    continue
                row = chain.row
                if row.accountant != account.accountant:
                    raise ValueError(_accountant_fixed(name, row.accountant, account.accountant))
                if row.privacy_unit != account.privacy_unit and (
                    chain.spent > 0
                    or conn.execute(
                        sa.select(schema.charges.c.id).where(schema.charges.c.account == name).limit(1)
                    ).first()
                ):
                    raise ValueError(
                        f"account {name!r}: the privacy unit is fixed once budget has been spent "
                        f"({row.privacy_unit!r}); cannot change it to {account.privacy_unit!r}, since spend "
                        f"protecting one unit does not compose with releases protecting another. "
                        "Create a new account instead."
                    )
                cap = Fraction(values["cap"])
                if cap < chain.spent:
                    raise ValueError(
                        f"account {name!r}: cap {_show(cap)} is below the {_show(chain.spent)} already spent"
                    )
                if values["delta"] is not None and account.accountant == "approx_dp":
                    if Fraction(values["delta"]) < chain.delta_spent:
                        raise ValueError(
                            f"account {name!r}: delta {values['delta']} is below the {chain.delta_spent} already spent"
                        )
                changed = {key: value for key, value in values.items() if getattr(row, key) != value}
                if not changed:
                    continue
                before = _stored_config(row)
                chain.append(
                    conn, "account_updated", context,
                    details={
                        "config": account.as_record(),
                        "stored": _stored_config(values),
                        "before": before,
                        "changed": sorted(changed),
                    },
                )
                chain.flush(conn, **changed)
                fields = sorted(k for k in changed if k != "config") or ["configuration as written"]
                changes.append(f"updated account {name!r}: {', '.join(fields)}")
            return changes

        return self._write(work)

    def refuse_accountant_changes(self, accountants: Mapping[str, str]) -> None:
        """Raise the "accountant is fixed" :class:`ValueError` if any existing account in ``accountants``
        (``{name: accountant}`` as written in a configuration) has another accountant; read-only.

        Raises:
            ValueError: an accountant would change.
            LedgerNotInitialisedError: no schema.
        """
        self.check_schema()
        if not accountants:
            return
        with self._read() as conn:
            rows = conn.execute(
                sa.select(schema.accounts.c.name, schema.accounts.c.accountant)
                .where(schema.accounts.c.name.in_(sorted(accountants)))
                .order_by(schema.accounts.c.name)
            ).all()
        for name, stored in rows:
            if stored != accountants[name]:
                raise ValueError(_accountant_fixed(name, stored, accountants[name]))

    def account(self, name: str) -> AccountStatus:
        """The status of account ``name``. Raises :class:`AccountNotFoundError`."""
        self.check_schema()
        with self._read() as conn:
            row = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == name)).first()
            if row is None:
                raise AccountNotFoundError(_not_found(name))
            return _status(row, *_reserved(conn, name))

    def accounts(self) -> list[AccountStatus]:
        """All accounts, by name."""
        self.check_schema()
        with self._read() as conn:
            rows = conn.execute(sa.select(schema.accounts).order_by(schema.accounts.c.name)).all()
            return [_status(row, *_reserved(conn, row.name)) for row in rows]

    # -- the release path ----------------------------------------------------------------------------------------
    def stored_output(self, key: ReleaseKey) -> dict | None:
        """The committed output of ``key`` (parsed JSON), or ``None`` if it has none.

        Raises :class:`LedgerNotInitialisedError` if the ledger has no schema."""
        self.check_schema()
        with self._read() as conn:
            text = conn.execute(
                sa.select(schema.charges.c.output).where(*_key_filter(key), schema.charges.c.state == "committed")
            ).scalar()
        return None if text is None else json.loads(text)

    def reserve(
        self,
        key: ReleaseKey,
        *,
        account: str,
        amount: Fraction,
        mechanisms: list[dict],
        spec_hash: str,
        try_number: int | None = None,
        delta: Fraction | int = 0,
        audit: Mapping[str, Any] | None = None,
    ) -> Reservation | dict:
        """Atomically check the budget and reserve ``amount`` (and ``delta`` on an ``approx_dp`` account) for the
        release ``key``.

        Returns the stored output (a ``dict``) if ``key`` was already committed (idempotent replay: nothing is
        charged), else a :class:`Reservation`. A still-``reserved`` charge under the same key, left by an attempt
        that died, is marked ``abandoned`` and stays counted as spent.

        Args:
            amount: the charge in the account's unit (rounded up to the ledger's resolution).
            mechanisms: JSON-safe descriptions of every noised step (kind, scale, sensitivity, loss), recorded with
                the charge and in the audit log so the spend can be recomputed later.
            delta: the delta part of the charge; must be 0 unless the account is ``approx_dp``.
            audit: who/where context for the audit log: ``run_type``, ``triggering_user`` (and optionally
                ``host``, ``user``); see :func:`audit_context`.

        Raises:
            AccountNotFoundError, DagNotAllowedError, BudgetExhaustedError: refusals; nothing is reserved (a
                ``refused`` audit event is recorded for the last two).
            ValueError: a non-positive amount, a delta on an account that is not ``approx_dp``, or a bad ``audit``.
        """
        self.check_schema()
        amount = round_up(exact_number(amount, name="amount"))
        delta = round_up(exact_number(delta, name="delta"))
        if amount <= 0:
            raise ValueError(f"a charge must be > 0, got {amount}")
        if delta < 0:
            raise ValueError(f"a delta charge must be >= 0, got {delta}")
        context = audit_context(audit)
        mechanisms_text = canonical_json(mechanisms)
        key_fields = {**key.as_dict(), "try_number": try_number, "spec_hash": spec_hash}

        def work(conn: Connection) -> Reservation | dict | _Refusal:
            chain = _AccountChain.lock(conn, account)
            if chain is None:
                raise AccountNotFoundError(_not_found(account))
            row = chain.row
            if delta and row.accountant != "approx_dp":
                raise ValueError(f"account {account!r} is {row.accountant}: a charge on it has no delta part")
            allowed = json.loads(row.allowed_dags)
            if key.dag_id not in allowed:
                chain.append(
                    conn, "refused", context, amount=amount, delta_amount=delta, mechanisms=mechanisms_text,
                    details={"reason": "dag_not_allowed"}, **key_fields,
                )
                chain.flush(conn)
                return _Refusal(
                    DagNotAllowedError(
                        f"DAG {key.dag_id!r} may not spend from budget account {account!r} (allowed: {allowed}); "
                        "a privacy officer adds it to allowed_dags and runs 'dpctl ledger apply'"
                    )
                )
            previous = conn.execute(
                sa.select(schema.charges).where(*_key_filter(key)).order_by(schema.charges.c.attempt)
            ).all()
            for charge in previous:
                if charge.state == "committed":
                    return json.loads(charge.output)
            for charge in previous:
                if charge.state == "reserved":
                    conn.execute(
                        schema.charges.update()
                        .where(schema.charges.c.id == charge.id)
                        .values(state="abandoned", updated_at=_now())
                    )
                    chain.append(
                        conn, "abandoned", context, **_charge_event_fields(charge),
                        details={"reason": "a later attempt of the same release key found it reserved"},
                    )
            remaining = round_down(Fraction(row.cap) - chain.spent)
            refusal: BudgetExhaustedError | None = None
            if amount > remaining:
                refusal = BudgetExhaustedError(account, unit_of(row.accountant), amount, max(remaining, Fraction(0)))
            elif row.accountant == "approx_dp":
                remaining_delta = round_down(Fraction(row.delta) - chain.delta_spent)
                if delta > remaining_delta:
                    refusal = BudgetExhaustedError(account, "delta", delta, max(remaining_delta, Fraction(0)))
            if refusal is not None:
                chain.append(
                    conn, "refused", context, amount=amount, delta_amount=delta, mechanisms=mechanisms_text,
                    details={"reason": "budget_exhausted", "remaining": str(refusal.remaining),
                             "unit": refusal.unit},
                    **key_fields,
                )
                chain.flush(conn)
                return _Refusal(refusal)
            attempt = max((charge.attempt for charge in previous), default=0) + 1
            now = _now()
            charge_id = conn.execute(
                schema.charges.insert().values(
                    account=account,
                    attempt=attempt,
                    state="reserved",
                    amount=str(amount),
                    delta_amount=str(delta),
                    mechanisms=mechanisms_text,
                    spec_hash=spec_hash,
                    try_number=try_number,
                    context=canonical_json(context),
                    created_at=now,
                    updated_at=now,
                    **key.as_dict(),
                )
            ).inserted_primary_key[0]
            chain.spent = round_up(chain.spent + amount)
            chain.delta_spent = round_up(chain.delta_spent + delta)
            chain.append(
                conn, "reserved", context, charge_id=charge_id, attempt=attempt, amount=amount, delta_amount=delta,
                mechanisms=mechanisms_text, **key_fields,
            )
            chain.flush(conn)
            return Reservation(
                charge_id=charge_id, key=key, account=account, amount=amount, attempt=attempt, delta=delta
            )

        return self._write(work)

    def commit(self, reservation: Reservation, output: dict, *, audit: Mapping[str, Any] | None = None) -> str:
        """Store the noised ``output`` (plain JSON) and mark the charge ``committed``. Returns its SHA-256 digest,
        which the ``committed`` audit event records (the output itself is not in the audit log).

        Raises:
            ChargeStateError: the charge is no longer ``reserved`` (a later attempt abandoned it): this output must
                not be published.
            ValueError: ``output`` is not plain, finite JSON.
        """
        text = canonical_json(output)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()

        def work(conn: Connection) -> str | _Refusal:
            chain, charge = _lock_reserved_charge(conn, reservation)
            if charge is None:
                return _Refusal(
                    ChargeStateError(
                        f"charge {reservation.charge_id} for {reservation.key} is no longer reserved (another "
                        "attempt took over the release); this attempt's output is discarded and stays charged"
                    )
                )
            conn.execute(
                schema.charges.update()
                .where(schema.charges.c.id == charge.id)
                .values(state="committed", output=text, output_digest=digest, updated_at=_now())
            )
            chain.append(
                conn, "committed", audit_context(audit, _stored_context(charge)), output_digest=digest,
                **_charge_event_fields(charge),
            )
            chain.flush(conn)
            return digest

        return self._write(work)

    def release(self, reservation: Reservation, *, audit: Mapping[str, Any] | None = None) -> None:
        """Return a reservation whose noise was provably never drawn (``reserved -> released``).

        Raises:
            ChargeStateError: the charge is not ``reserved``.
        """

        def work(conn: Connection) -> None | _Refusal:
            chain, charge = _lock_reserved_charge(conn, reservation)
            if charge is None:
                return _Refusal(ChargeStateError(f"charge {reservation.charge_id} is not reserved; nothing released"))
            conn.execute(
                schema.charges.update()
                .where(schema.charges.c.id == charge.id)
                .values(state="released", updated_at=_now())
            )
            chain.spent -= Fraction(charge.amount)
            chain.delta_spent -= Fraction(charge.delta_amount)
            chain.append(
                conn, "released", audit_context(audit, _stored_context(charge)), **_charge_event_fields(charge),
                details={"reason": "no noise was drawn"},
            )
            chain.flush(conn)
            return None

        self._write(work)

    # -- reading and auditing ----------------------------------------------------------------------------------
    def charges(
        self,
        account: str | None = None,
        dag_id: str | None = None,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        state: str | None = None,
    ) -> list[dict]:
        """Charges (without outputs), oldest first, optionally filtered by account, DAG, state and creation time
        (``since`` inclusive, ``until`` exclusive)."""
        self.check_schema()
        c = schema.charges.c
        query = sa.select(*[column for column in c if column.name != "output"]).order_by(c.id)
        if account is not None:
            query = query.where(c.account == account)
        if dag_id is not None:
            query = query.where(c.dag_id == dag_id)
        if state is not None:
            query = query.where(c.state == state)
        if since is not None:
            query = query.where(c.created_at >= since)
        if until is not None:
            query = query.where(c.created_at < until)
        with self._read() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def events(self, account: str | None = None) -> Iterator[dict]:
        """Audit events, in insertion order (``id``), optionally of one account; every column."""
        self.check_schema()
        query = sa.select(schema.audit_events).order_by(schema.audit_events.c.id)
        if account is not None:
            query = query.where(schema.audit_events.c.account == account)
        with self._read() as conn:
            for row in conn.execute(query):
                yield dict(row._mapping)

    def verify(self) -> VerifyReport:
        """Recompute every account's audit chain and cross-check it against the ledger's mutable tables.

        Checks, per account: sequence numbers run 1, 2, ... without gaps; each row's ``prev_hash`` is the previous
        row's hash and its ``row_hash`` matches its canonical form; the account row's chain head, running totals
        and configuration equal those the events imply; every charge's state, amounts and output digest match its
        events, and its stored output still hashes to the committed digest. Also that the append-only triggers
        are in place.

        Returns a :class:`VerifyReport`; its ``problems`` start with the first broken audit row (by id), named by
        id, account and sequence number.
        """
        self.check_schema()
        report = VerifyReport()
        row_problems: list[tuple[int, str]] = []
        other: list[str] = []
        with self._read() as conn:
            accounts = {row.name: row for row in conn.execute(sa.select(schema.accounts))}
            charges = {row.id: row for row in conn.execute(sa.select(schema.charges))}
            triggers = {name for (name,) in conn.exec_driver_sql(schema.audit_trigger_query(self.engine.dialect.name))}
            events = conn.execute(
                sa.select(schema.audit_events).order_by(schema.audit_events.c.account, schema.audit_events.c.account_seq)
            ).all()
        report.accounts, report.charges, report.events = len(accounts), len(charges), len(events)

        chains: dict[str, dict[str, Any]] = {}
        charge_events: dict[int, list[Any]] = {}
        migrated_up_to = 0
        for row in events:
            values = row._mapping
            where = f"dp_audit_events id={row.id} (account {row.account!r}, seq {row.account_seq}, {row.event})"
            chain = chains.setdefault(
                row.account,
                {"seq": 0, "head": GENESIS_HASH, "spent": Fraction(0), "delta": Fraction(0), "stored": None,
                 "broken": False},
            )
            problem = None
            if row.account_seq != chain["seq"] + 1:
                problem = (
                    f"{where}: expected seq {chain['seq'] + 1}; the rows in between were deleted"
                    if row.account_seq > chain["seq"] + 1 else f"{where}: repeats seq {row.account_seq}"
                )
            elif row.prev_hash != chain["head"]:
                problem = f"{where}: prev_hash does not match the previous row's hash (a row before it was changed)"
            elif audit_row_hash(values) != row.row_hash:
                problem = f"{where}: content does not match its row_hash (the row was edited)"
            if problem and not chain["broken"]:
                row_problems.append((row.id, problem))
                chain["broken"] = True
            chain["seq"], chain["head"] = row.account_seq, row.row_hash
            try:
                amount = Fraction(row.amount) if row.amount is not None else Fraction(0)
                delta_amount = Fraction(row.delta_amount) if row.delta_amount is not None else Fraction(0)
                details = json.loads(row.details) if row.details else {}
            except (ValueError, ZeroDivisionError):
                other.append(f"{where}: unreadable amount or details")
                continue
            if row.event == "account_migrated":
                chain["spent"], chain["delta"] = Fraction(row.spent_after), Fraction(row.delta_spent_after)
                migrated_up_to = max(migrated_up_to, int(details.get("last_charge_id", 0)))
            elif row.event == "reserved":
                chain["spent"] += amount
                chain["delta"] += delta_amount
            elif row.event == "released":
                chain["spent"] -= amount
                chain["delta"] -= delta_amount
            if row.event in ("account_created", "account_updated", "account_migrated"):
                chain["stored"] = details.get("stored")
            if Fraction(row.spent_after) != chain["spent"] or Fraction(row.delta_spent_after) != chain["delta"]:
                other.append(f"{where}: spent_after {row.spent_after} disagrees with the events before it")
                chain["spent"], chain["delta"] = Fraction(row.spent_after), Fraction(row.delta_spent_after)
            if row.charge_id is not None and row.event in ("reserved", "committed", "released", "abandoned"):
                charge_events.setdefault(row.charge_id, []).append(row)

        for name, account in sorted(accounts.items()):
            chain = chains.get(name)
            label = f"dp_budget_accounts {name!r}"
            if chain is None:
                other.append(f"{label}: has no audit events (created outside 'dpctl ledger apply')")
                continue
            report.heads[name] = chain["head"]
            if account.audit_seq != chain["seq"] or account.audit_head != chain["head"]:
                other.append(
                    f"{label}: chain head is seq {account.audit_seq} but the last event is seq {chain['seq']} "
                    "(events at the end of the chain were deleted, or the head was edited)"
                )
            if Fraction(account.spent) != chain["spent"] or Fraction(account.delta_spent) != chain["delta"]:
                other.append(
                    f"{label}: spent {account.spent} (delta {account.delta_spent}) but the audit events add up to "
                    f"{chain['spent']} (delta {chain['delta']})"
                )
            if chain["stored"] != _stored_config(account):
                other.append(
                    f"{label}: cap/accountant/delta/privacy unit/allowed DAGs differ from the last "
                    "'dpctl ledger apply' recorded in the audit log"
                )
        for name in sorted(set(chains) - set(accounts)):
            other.append(f"audit events of account {name!r} exist but the account row is missing (deleted)")

        event_state = {"reserved": "reserved", "committed": "committed", "released": "released", "abandoned": "abandoned"}
        for charge_id, charge in sorted(charges.items()):
            label = f"dp_charges id={charge_id} ({charge.dag_id}/{charge.run_id}/{charge.task_id})"
            found = charge_events.get(charge_id)
            if not found:
                if charge_id > migrated_up_to:
                    other.append(f"{label}: has no audit events (inserted outside the ledger)")
                continue
            last = found[-1]
            if charge.state != event_state[last.event]:
                other.append(f"{label}: state {charge.state!r} but the audit log says {event_state[last.event]!r}")
            first = found[0]
            if first.event == "reserved" and (
                charge.amount != first.amount or charge.delta_amount != first.delta_amount
                or charge.account != first.account
            ):
                other.append(f"{label}: amount/account differ from its 'reserved' audit event")
            if charge.state == "committed":
                digest = next((e.output_digest for e in found if e.event == "committed"), None)
                actual = None if charge.output is None else hashlib.sha256(charge.output.encode("utf-8")).hexdigest()
                if charge.output_digest != digest or actual != digest:
                    other.append(f"{label}: stored output does not match the digest in its 'committed' audit event")
        for charge_id in sorted(set(charge_events) - set(charges)):
            other.append(f"dp_charges id={charge_id}: has audit events but the charge row is missing (deleted)")

        missing = set(schema.AUDIT_TRIGGER_NAMES) - triggers
        if missing:
            other.append(f"dp_audit_events: append-only trigger(s) {sorted(missing)} are missing (dropped)")
        report.problems = [problem for _, problem in sorted(row_problems)] + other
        return report


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no user name in some containers
        return None


def _show(value: Fraction) -> str:
    decimal = f"{float(value):.6g}"
    return decimal if Fraction(decimal) == value else f"{value} (~{decimal})"


def _accountant_fixed(name: str, stored: str, wanted: str) -> str:
    return (
        f"account {name!r}: the accountant is fixed at creation ({stored}); cannot change it to {wanted}. "
        "Create a new account instead."
    )


def _not_found(name: str) -> str:
    return (
        f"budget account {name!r} is not in the ledger; a privacy officer adds it to the ledger "
        "configuration (config/ledgers.yaml) and runs 'dpctl ledger apply'"
    )


def _account_values(account: Any) -> dict[str, Any]:
    """The account-row values a configuration stands for (the cap converted to the account's unit)."""
    return {
        "accountant": account.accountant,
        "cap": str(account.cap_in_unit()),
        "delta": None if account.delta is None else str(account.delta),
        "privacy_unit": account.privacy_unit,
        "allowed_dags": json.dumps(sorted(account.allowed_dags)),
        "owner": account.owner,
        "description": account.description,
        "config": canonical_json(account.as_record()),
    }


def _stored_config(values: Any) -> dict[str, Any]:
    """The governed fields of an account row (or of the values about to be written), for audit comparison."""
    get = values.get if isinstance(values, Mapping) else lambda name: getattr(values, name)
    return {name: get(name) for name in ("accountant", "cap", "delta", "privacy_unit", "allowed_dags")}


def _stored_context(charge: Any) -> dict[str, Any]:
    return json.loads(charge.context) if charge.context else {}


def _key_filter(key: ReleaseKey) -> list:
    c = schema.charges.c
    return [
        c.dag_id == key.dag_id,
        c.run_id == key.run_id,
        c.task_id == key.task_id,
        c.map_index == key.map_index,
        c.release_name == key.release_name,
    ]


def _reserved(conn: Connection, name: str) -> tuple[Fraction, Fraction]:
    rows = conn.execute(
        sa.select(schema.charges.c.amount, schema.charges.c.delta_amount).where(
            schema.charges.c.account == name, schema.charges.c.state == "reserved"
        )
    )
    amount, delta = Fraction(0), Fraction(0)
    for row in rows:
        amount += Fraction(row.amount)
        delta += Fraction(row.delta_amount)
    return amount, delta


def _status(row: Any, reserved: Fraction, delta_reserved: Fraction) -> AccountStatus:
    return AccountStatus(
        name=row.name,
        accountant=row.accountant,
        unit=unit_of(row.accountant),
        cap=Fraction(row.cap),
        spent=Fraction(row.spent),
        reserved=reserved,
        delta=None if row.delta is None else Fraction(row.delta),
        privacy_unit=row.privacy_unit,
        allowed_dags=tuple(json.loads(row.allowed_dags)),
        delta_spent=Fraction(row.delta_spent),
        delta_reserved=delta_reserved,
        owner=row.owner,
        description=row.description,
    )
