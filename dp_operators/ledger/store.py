"""The budget ledger: accounts, atomic check-and-reserve, commit of the noised output, idempotent replay.

Life cycle of a charge (DESIGN.md section 3): ``reserved -> committed`` (noised output stored),
``reserved -> released`` (noise provably never drawn: the amount is returned), ``reserved -> abandoned`` (a
reservation of unknown fate found by a later attempt: it stays counted as spent).

Check-and-reserve is one transaction serialised per account: ``BEGIN IMMEDIATE`` on SQLite (the whole file is
write-locked) and ``SELECT ... FOR UPDATE`` on the account row on PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dp_operators.accounting import epsilon_at_delta, round_down, round_up, unit_of
from dp_operators.ledger import schema
from dp_operators.ledger.config import LedgerConfig
from dp_operators.ledger.errors import (
    AccountNotFoundError,
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    LedgerNotInitialisedError,
)


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
    """A reserved charge: noise may now be drawn; then :meth:`Ledger.commit` stores the output."""

    charge_id: int
    key: ReleaseKey
    account: str
    amount: Fraction
    attempt: int


@dataclass(frozen=True)
class AccountStatus:
    """An account's state. Amounts are exact, in ``unit``; ``spent`` includes reserved and abandoned charges."""

    name: str
    accountant: str
    unit: str
    cap: Fraction
    spent: Fraction
    reserved: Fraction
    delta: Fraction | None
    privacy_unit: str
    allowed_dags: tuple[str, ...]

    @property
    def remaining(self) -> Fraction:
        return round_down(max(self.cap - self.spent, Fraction(0)))

    def as_epsilon(self, amount: Fraction) -> float | None:
        """``amount`` reported as epsilon (at the account's delta for zCDP)."""
        return epsilon_at_delta(amount, self.accountant, self.delta)


def canonical_json(value: Any) -> str:
    """The canonical JSON text stored for outputs: sorted keys, no whitespace, NaN refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def create_ledger_engine(url: str) -> Engine:
    """Create a SQLAlchemy engine for a ledger URL (``sqlite:///path`` or ``postgresql+psycopg://...``).

    On SQLite, pysqlite's own transaction handling is switched off so every transaction starts with
    ``BEGIN IMMEDIATE`` (SQLAlchemy docs, "Serializable isolation / Savepoints / Transactional DDL" for pysqlite),
    which takes the write lock at once: two workers cannot both read the same remaining budget.
    """
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 60})

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_connection, _record) -> None:  # pragma: no cover - driver hook
            dbapi_connection.isolation_level = None
            dbapi_connection.execute("PRAGMA foreign_keys = ON")

        @sa.event.listens_for(engine, "begin")
        def _begin_immediate(connection) -> None:  # pragma: no cover - driver hook
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


class Ledger:
    """A persisted privacy-budget ledger.

    Args:
        url: SQLAlchemy URL of the ledger database, or an existing :class:`~sqlalchemy.engine.Engine`.
    """

    def __init__(self, url: str | Engine) -> None:
        self.engine = url if isinstance(url, Engine) else create_ledger_engine(url)

    # -- schema ------------------------------------------------------------------------------------------------
    def init_schema(self) -> int:
        """Create the tables if missing and record the schema version. Explicit: never called at import.

        Returns the schema version. Raises :class:`LedgerNotInitialisedError` if the database holds another version.
        """
        schema.metadata.create_all(self.engine)
        with self.engine.begin() as conn:
            versions = [row.version for row in conn.execute(sa.select(schema.schema_version.c.version))]
            if not versions:
                conn.execute(schema.schema_version.insert().values(version=schema.SCHEMA_VERSION, applied_at=_now()))
            elif max(versions) != schema.SCHEMA_VERSION:
                raise LedgerNotInitialisedError(
                    f"ledger schema version {max(versions)} is not the version {schema.SCHEMA_VERSION} "
                    "this package uses"
                )
        return schema.SCHEMA_VERSION

    def check_schema(self) -> None:
        """Raise :class:`LedgerNotInitialisedError` unless the ledger's schema is present at the expected version."""
        if not sa.inspect(self.engine).has_table(schema.schema_version.name):
            raise LedgerNotInitialisedError(
                f"the ledger at {self.engine.url.render_as_string(hide_password=True)} has no schema; "
                "run 'dpctl ledger init' first"
            )
        with self.engine.connect() as conn:
            version = conn.execute(sa.select(sa.func.max(schema.schema_version.c.version))).scalar()
        if version != schema.SCHEMA_VERSION:
            raise LedgerNotInitialisedError(
                f"ledger schema version {version} found, this package needs {schema.SCHEMA_VERSION}; "
                "run 'dpctl ledger init'"
            )

    # -- governance ----------------------------------------------------------------------------------------------
    def apply_config(self, config: LedgerConfig) -> list[str]:
        """Create or update accounts from a :class:`LedgerConfig`. Returns a line per change made.

        An account's accountant is fixed at creation; a cap may not go below what is already spent.

        Raises:
            ValueError: changing an accountant, or a cap below the spent amount.
        """
        self.check_schema()
        changes: list[str] = []
        with self.engine.begin() as conn:
            for name, account in sorted(config.accounts.items()):
                values = {
                    "accountant": account.accountant,
                    "cap": str(account.cap),
                    "delta": None if account.delta is None else str(account.delta),
                    "privacy_unit": account.privacy_unit,
                    "allowed_dags": json.dumps(sorted(account.allowed_dags)),
                    "owner": account.owner,
                    "description": account.description,
                }
                row = conn.execute(
                    sa.select(schema.accounts).where(schema.accounts.c.name == name).with_for_update()
                ).first()
                if row is None:
                    conn.execute(
                        schema.accounts.insert().values(
                            name=name, spent="0", created_at=_now(), updated_at=_now(), **values
                        )
                    )
                    changes.append(f"created account {name!r} ({account.accountant}, cap {account.cap})")
                    continue
                if row.accountant != account.accountant:
                    raise ValueError(
                        f"account {name!r}: the accountant is fixed at creation ({row.accountant}); "
                        f"cannot change it to {account.accountant}. Create a new account instead."
                    )
                if account.cap < Fraction(row.spent):
                    raise ValueError(
                        f"account {name!r}: cap {account.cap} is below the {Fraction(row.spent)} already spent"
                    )
                changed = {key: value for key, value in values.items() if getattr(row, key) != value}
                if changed:
                    conn.execute(
                        schema.accounts.update()
                        .where(schema.accounts.c.name == name)
                        .values(updated_at=_now(), **changed)
                    )
                    changes.append(f"updated account {name!r}: {', '.join(sorted(changed))}")
        return changes

    def account(self, name: str) -> AccountStatus:
        """The status of account ``name``. Raises :class:`AccountNotFoundError`."""
        self.check_schema()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == name)).first()
            if row is None:
                raise AccountNotFoundError(
                    f"budget account {name!r} is not in the ledger; a privacy officer adds it to the ledger "
                    "configuration (config/ledgers.yaml) and runs 'dpctl ledger apply'"
                )
            reserved = sum(
                (Fraction(amount) for (amount,) in conn.execute(
                    sa.select(schema.charges.c.amount).where(
                        schema.charges.c.account == name, schema.charges.c.state == "reserved"
                    )
                )),
                Fraction(0),
            )
        return _status(row, reserved)

    def accounts(self) -> list[AccountStatus]:
        """All accounts, by name."""
        self.check_schema()
        with self.engine.connect() as conn:
            names = [name for (name,) in conn.execute(sa.select(schema.accounts.c.name).order_by("name"))]
        return [self.account(name) for name in names]

    # -- the release path ----------------------------------------------------------------------------------------
    def stored_output(self, key: ReleaseKey) -> dict | None:
        """The committed output of ``key`` (parsed JSON), or ``None`` if it has none."""
        with self.engine.connect() as conn:
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
    ) -> Reservation | dict:
        """Atomically check the budget and reserve ``amount`` for the release ``key``.

        Returns the stored output (a ``dict``) if ``key`` was already committed (idempotent replay: nothing is
        charged), else a :class:`Reservation`. A still-``reserved`` charge under the same key, left by an attempt
        that died, is marked ``abandoned`` and stays counted as spent.

        Raises:
            AccountNotFoundError, DagNotAllowedError, BudgetExhaustedError: refusals; nothing is reserved.
        """
        if amount <= 0:
            raise ValueError(f"a charge must be > 0, got {amount}")
        amount = round_up(amount)
        now = _now()
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(schema.accounts).where(schema.accounts.c.name == account).with_for_update()
            ).first()
            if row is None:
                raise AccountNotFoundError(
                    f"budget account {account!r} is not in the ledger; a privacy officer adds it to the ledger "
                    "configuration and runs 'dpctl ledger apply'"
                )
            allowed = json.loads(row.allowed_dags)
            if key.dag_id not in allowed:
                raise DagNotAllowedError(
                    f"DAG {key.dag_id!r} may not spend from budget account {account!r} (allowed: {allowed}); "
                    "a privacy officer adds it to allowed_dags and runs 'dpctl ledger apply'"
                )
            previous = conn.execute(
                sa.select(schema.charges.c.id, schema.charges.c.state, schema.charges.c.output, schema.charges.c.attempt)
                .where(*_key_filter(key))
                .order_by(schema.charges.c.attempt)
            ).all()
            for charge in previous:
                if charge.state == "committed":
                    return json.loads(charge.output)
            for charge in previous:
                if charge.state == "reserved":
                    conn.execute(
                        schema.charges.update()
                        .where(schema.charges.c.id == charge.id)
                        .values(state="abandoned", updated_at=now)
                    )
            spent = Fraction(row.spent)
            remaining = round_down(Fraction(row.cap) - spent)
            if amount > remaining:
                raise BudgetExhaustedError(account, unit_of(row.accountant), amount, max(remaining, Fraction(0)))
            attempt = max((charge.attempt for charge in previous), default=0) + 1
            charge_id = conn.execute(
                schema.charges.insert().values(
                    account=account,
                    attempt=attempt,
                    state="reserved",
                    amount=str(amount),
                    mechanisms=canonical_json(mechanisms),
                    spec_hash=spec_hash,
                    try_number=try_number,
                    created_at=now,
                    updated_at=now,
                    **key.as_dict(),
                )
            ).inserted_primary_key[0]
            conn.execute(
                schema.accounts.update()
                .where(schema.accounts.c.name == account)
                .values(spent=str(round_up(spent + amount)), updated_at=now)
            )
        return Reservation(charge_id=charge_id, key=key, account=account, amount=amount, attempt=attempt)

    def commit(self, reservation: Reservation, output: dict) -> str:
        """Store the noised ``output`` (plain JSON) and mark the charge ``committed``. Returns its SHA-256 digest.

        Raises:
            ChargeStateError: the charge is no longer ``reserved`` (a later attempt abandoned it): this output must
                not be published.
            ValueError: ``output`` is not plain, finite JSON.
        """
        text = canonical_json(output)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        with self.engine.begin() as conn:
            updated = conn.execute(
                schema.charges.update()
                .where(schema.charges.c.id == reservation.charge_id, schema.charges.c.state == "reserved")
                .values(state="committed", output=text, output_digest=digest, updated_at=_now())
            ).rowcount
        if updated != 1:
            raise ChargeStateError(
                f"charge {reservation.charge_id} for {reservation.key} is no longer reserved (another attempt took "
                "over the release); this attempt's output is discarded and stays charged"
            )
        return digest

    def release(self, reservation: Reservation) -> None:
        """Return a reservation whose noise was provably never drawn (``reserved -> released``).

        Raises:
            ChargeStateError: the charge is not ``reserved``.
        """
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(schema.accounts.c.spent).where(schema.accounts.c.name == reservation.account).with_for_update()
            ).first()
            updated = conn.execute(
                schema.charges.update()
                .where(schema.charges.c.id == reservation.charge_id, schema.charges.c.state == "reserved")
                .values(state="released", updated_at=_now())
            ).rowcount
            if updated != 1:
                raise ChargeStateError(f"charge {reservation.charge_id} is not reserved; nothing released")
            conn.execute(
                schema.accounts.update()
                .where(schema.accounts.c.name == reservation.account)
                .values(spent=str(Fraction(row.spent) - reservation.amount), updated_at=_now())
            )

    def charges(self, account: str | None = None, dag_id: str | None = None) -> list[dict]:
        """Charges (without outputs), oldest first, optionally filtered by account and DAG."""
        query = sa.select(*[c for c in schema.charges.c if c.name != "output"]).order_by(schema.charges.c.id)
        if account is not None:
            query = query.where(schema.charges.c.account == account)
        if dag_id is not None:
            query = query.where(schema.charges.c.dag_id == dag_id)
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]


def _key_filter(key: ReleaseKey) -> list:
    c = schema.charges.c
    return [
        c.dag_id == key.dag_id,
        c.run_id == key.run_id,
        c.task_id == key.task_id,
        c.map_index == key.map_index,
        c.release_name == key.release_name,
    ]


def _status(row, reserved: Fraction) -> AccountStatus:
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
    )
