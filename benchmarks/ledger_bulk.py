"""A bulk loader for ledger benchmarks: writes committed releases exactly as ``Ledger.reserve`` + ``Ledger.commit``
would, many per transaction.

Used by ``benchmarks/ledger_cli.py`` (ledgers of 10^5 charges for ``dpctl ledger history/verify/export``) and
``benchmarks/ledger_throughput.py`` (an account with a long history); ``tests/ledger/test_bulk_loader.py`` checks,
on SQLite and PostgreSQL, that a ledger it writes verifies and holds the same rows as one written by the API.

What one release writes (the API's two transactions folded into one batch):

* a ``dp_charges`` row in state ``committed``: the release key, attempt 1, amount and delta (rounded up to the
  ledger's resolution, as text), mechanisms and context as canonical JSON, the SHA-256 of a fresh reservation
  token, the lease end the reservation had, the output and its digest;
* two audit events in the account's chain, signed with the spend key (HMAC through
  :func:`~dp_operators.ledger.chain.audit_row_mac`): ``reserved`` (running totals after the charge, the token
  hash) and ``committed`` (the output digest and the token as ``proof``);
* the account's running totals and chain head, written back through
  :meth:`~dp_operators.ledger.chain.AccountChain.flush` at the end of each transaction.

The account row is locked (:meth:`AccountChain.lock`) for the whole transaction, the spend key must be the one
the account accepts, the DAG must be allowed and the budget must cover every charge: the loader refuses what the
API would refuse (it writes no ``refused`` events) and never writes a ledger that fails ``dpctl ledger verify``.
It is meant for an otherwise idle ledger: it does not look for earlier attempts of the same release key (the
database's unique constraint on the key and attempt rejects a repeat).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import islice
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dp_operators.accounting import exact_number, round_down, round_up, unit_of
from dp_operators.ledger import (
    AccountConfig,
    BudgetExhaustedError,
    DagNotAllowedError,
    Ledger,
    LedgerConfig,
    LedgerGovernor,
    LedgerKeyError,
    ReleaseKey,
    schema,
)
from dp_operators.ledger.chain import (
    AccountChain,
    audit_context,
    canonical_json,
    charge_event_fields,
    timestamp_text,
)
from dp_operators.ledger.errors import AccountNotFoundError
from dp_operators.ledger.keys import AuditKey
from dp_operators.ledger.spend import DEFAULT_LEASE_SECONDS, token_hash

#: The PostgreSQL server benchmarks create their throwaway databases on.
PG_URL = os.environ.get("DP_LEDGER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

#: Releases written per transaction by default.
RELEASES_PER_TRANSACTION = 5_000

#: What a synthetic release records as its mechanisms (one discrete Laplace count, as the example DAG does).
SYNTHETIC_MECHANISMS = [{"mechanism": "discrete_laplace", "scale": 100.0, "l1_sensitivity": 1.0, "epsilon": "1/100"}]


@dataclass(frozen=True)
class BulkRelease:
    """One release to write as reserved and committed: what ``Ledger.reserve`` and ``Ledger.commit`` are given.

    ``amount`` is in the account's unit and ``delta`` the delta part (``approx_dp`` accounts only); ``audit`` is
    the reservation's who/where context (:func:`~dp_operators.ledger.chain.audit_context`); ``output`` the
    noised output (plain JSON).
    """

    key: ReleaseKey
    account: str
    amount: Fraction
    mechanisms: list[dict]
    spec_hash: str
    output: dict
    try_number: int | None = 1
    delta: Fraction = Fraction(0)
    audit: Mapping[str, Any] | None = None


@dataclass
class LoadSummary:
    """What :func:`bulk_load` wrote: charges and audit events (counts), transactions, wall seconds, and the
    charge ids by release (in the order given)."""

    charges: int = 0
    events: int = 0
    transactions: int = 0
    seconds: float = 0.0
    charge_ids: list[int] = field(default_factory=list)


def throwaway_database(backend: str, workdir: Path) -> tuple[str, Callable[[], None]]:
    """The URL of an empty database and a function that disposes of it: a new SQLite file in ``workdir``, or a
    new database on the :data:`PG_URL` server (``backend`` ``"postgresql"``), dropped by the function."""
    if backend == "sqlite":
        return f"sqlite:///{workdir / f'ledger-{uuid.uuid4().hex[:8]}.db'}", lambda: None
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = f"dp_ledger_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False), drop


def bench_account(cap: int = 10**9) -> AccountConfig:
    """A ``pure_dp`` account with a cap no benchmark exhausts, open to DAG ``d``."""
    return AccountConfig(accountant="pure_dp", cap=Fraction(cap), privacy_unit="person", allowed_dags=["d"])


def init_ledger(url: str, governor_key: AuditKey, spend_key: AuditKey, **accounts: AccountConfig) -> None:
    """Create the ledger's schema at ``url`` and apply ``accounts``, as the privacy officer does (``dpctl ledger
    init`` and ``apply`` with both keys)."""
    officer = LedgerGovernor(url, governor_key=governor_key, spend_key=spend_key)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts=accounts))
    officer.engine.dispose()


def synthetic_releases(
    count: int,
    accounts: Iterable[str] = ("bench",),
    *,
    amount: Fraction = Fraction(1, 10**6),
    dag_id: str = "d",
    prefix: str = "bulk",
) -> Iterator[BulkRelease]:
    """``count`` distinct releases of ``amount`` each, spread round-robin over ``accounts``: release key
    ``(dag_id, f"{prefix}-{i}", "t", -1, "r")``, the :data:`SYNTHETIC_MECHANISMS`, a small output.
    Generated lazily (memory stays flat in ``count``)."""
    names = list(accounts)
    context = {"run_type": "scheduled", "triggering_user": None}
    for i in range(count):
        yield BulkRelease(
            key=ReleaseKey(dag_id, f"{prefix}-{i}", "t", -1, "r"),
            account=names[i % len(names)],
            amount=amount,
            mechanisms=SYNTHETIC_MECHANISMS,
            spec_hash=hashlib.sha256(f"spec-{i % 7}".encode()).hexdigest(),
            output={"release": "r", "count": 1000 + i % 97, "noise_scale": 100.0},
            audit=context,
        )


def bulk_load(
    url: str | Engine,
    releases: Iterable[BulkRelease],
    *,
    spend_key: AuditKey,
    per_transaction: int = RELEASES_PER_TRANSACTION,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
) -> LoadSummary:
    """Write each release as a committed charge with its ``reserved`` and ``committed`` events, signed with
    ``spend_key``, ``per_transaction`` releases per transaction (each one all or nothing).

    Args:
        url: the ledger (SQLAlchemy URL or engine); initialised, with the accounts applied.
        releases: what to write, in order (distinct release keys, none already in the ledger).
        spend_key: the spend key the accounts accept.
        per_transaction: releases per transaction.
        lease_seconds: the lease each reservation is recorded with.

    Returns:
        A :class:`LoadSummary`.

    Raises:
        AccountNotFoundError, DagNotAllowedError, BudgetExhaustedError: a release the API would refuse; the
            transaction holding it is rolled back (earlier transactions stay).
        LedgerKeyError: the account accepts another spend key.
        ValueError: a non-positive amount, a delta on an account that is not ``approx_dp``, bad JSON.
        sqlalchemy.exc.IntegrityError: a release key already charged.
    """
    if per_transaction < 1:
        raise ValueError(f"per_transaction must be >= 1, got {per_transaction}")
    ledger = Ledger(url, audit_key=spend_key)
    ledger.check_schema()
    summary = LoadSummary()
    started = time.perf_counter()
    items = iter(releases)
    while batch := list(islice(items, per_transaction)):
        with ledger.engine.begin() as conn:
            ids, events = _write_batch(conn, batch, spend_key, lease_seconds)
        summary.charges += len(ids)
        summary.events += events
        summary.transactions += 1
        summary.charge_ids += ids
    ledger.engine.dispose()
    if ledger._reader is not ledger.engine:
        ledger._reader.dispose()
    summary.seconds = time.perf_counter() - started
    return summary


class _SignedChain:
    """An account's chain during one bulk transaction: events are signed here and inserted in one statement."""

    def __init__(self, chain: AccountChain) -> None:
        self.chain = chain
        row = chain.row
        self.cap = Fraction(row.cap)
        self.delta_cap = None if row.delta is None else Fraction(row.delta)
        self.allowed = json.loads(row.allowed_dags)
        #: totals with the batch's charges so far, for the budget check before the events are signed
        self.planned = (chain.spent, chain.delta_spent)


def _lock(conn: Connection, name: str, key: AuditKey) -> _SignedChain:
    chain = AccountChain.lock(conn, name, key)
    if chain is None:
        raise AccountNotFoundError(f"budget account {name!r} is not in the ledger")
    if chain.row.spend_key_id != key.key_id:
        raise LedgerKeyError(
            f"budget account {name!r} accepts spend key id {chain.row.spend_key_id!r}, not {key.key_id!r}"
        )
    return _SignedChain(chain)


def _charge(signed: _SignedChain, release: BulkRelease) -> tuple[Fraction, Fraction]:
    """The release's amount and delta as the API rounds them, after the API's budget and allowlist checks."""
    row = signed.chain.row
    amount = round_up(exact_number(release.amount, name="amount"))
    delta = round_up(exact_number(release.delta, name="delta"))
    if amount <= 0 or delta < 0:
        raise ValueError(f"{release.key}: a charge must be > 0 and its delta >= 0, got {amount} and {delta}")
    if delta and row.accountant != "approx_dp":
        raise ValueError(f"account {row.name!r} is {row.accountant}: a charge on it has no delta part")
    if release.key.dag_id not in signed.allowed:
        raise DagNotAllowedError(f"DAG {release.key.dag_id!r} may not spend from budget account {row.name!r}")
    spent, delta_spent = signed.planned
    remaining = round_down(signed.cap - spent)
    if amount > remaining:
        raise BudgetExhaustedError(row.name, unit_of(row.accountant), amount, max(remaining, Fraction(0)))
    if row.accountant == "approx_dp":
        remaining_delta = round_down(signed.delta_cap - delta_spent)
        if delta > remaining_delta:
            raise BudgetExhaustedError(row.name, "delta", delta, max(remaining_delta, Fraction(0)))
    signed.planned = (round_up(spent + amount), round_up(delta_spent + delta))
    return amount, delta


def _write_batch(
    conn: Connection, batch: list[BulkRelease], key: AuditKey, lease_seconds: float
) -> tuple[list[int], int]:
    """Insert ``batch``'s charges, then their events, then update the accounts; returns (charge ids, events)."""
    chains = {name: _lock(conn, name, key) for name in sorted({release.account for release in batch})}
    # on PostgreSQL the spend functions record the session's role as the context's db_role (docs/adr/0029)
    role = conn.exec_driver_sql("SELECT session_user").scalar() if conn.dialect.name == "postgresql" else None
    stamped = {} if role is None else {"db_role": role}
    lease = dt.timedelta(seconds=lease_seconds)
    charges: list[dict[str, Any]] = []
    pending: list[tuple[BulkRelease, str, dt.datetime]] = []
    for release in batch:
        signed = chains[release.account]
        amount, delta = _charge(signed, release)
        token = secrets.token_urlsafe(32)
        output_text = canonical_json(release.output)
        created = dt.datetime.now(dt.timezone.utc)
        committed = dt.datetime.now(dt.timezone.utc)
        charges.append(
            {
                "account": release.account,
                "attempt": 1,
                "state": "committed",
                "amount": str(amount),
                "delta_amount": str(delta),
                "mechanisms": canonical_json(release.mechanisms),
                "spec_hash": release.spec_hash,
                "try_number": release.try_number,
                "context": canonical_json(audit_context({**(release.audit or {}), **stamped})),
                "output": output_text,
                "output_digest": hashlib.sha256(output_text.encode("utf-8")).hexdigest(),
                "token_hash": token_hash(token),
                "lease_expires_at": created + lease,
                "created_at": created,
                "updated_at": committed,
                **release.key.as_dict(),
            }
        )
        pending.append((release, token, committed))
    c = schema.charges.c
    ids = list(
        conn.execute(schema.charges.insert().returning(c.id, sort_by_parameter_order=True), charges).scalars()
    )
    # Sign each account's events in release order, with the running totals the API's transactions would state.
    events: list[dict[str, Any]] = []
    for charge_id, values, (release, token, committed) in zip(ids, charges, pending):
        signed = chains[release.account]
        chain = signed.chain
        chain.spent = round_up(chain.spent + Fraction(values["amount"]))
        chain.delta_spent = round_up(chain.delta_spent + Fraction(values["delta_amount"]))
        row = _ChargeRow(id=charge_id, **values)
        fields = charge_event_fields(row)
        context = values["context"]
        events.append(
            chain.signed_row(
                "reserved", context, created_at=timestamp_text(values["created_at"]), token_hash=values["token_hash"],
                **fields,
            )
        )
        events.append(
            chain.signed_row(
                "committed", context, created_at=timestamp_text(committed), output_digest=values["output_digest"],
                proof=token, **fields,
            )
        )
    conn.execute(schema.audit_events.insert(), events)
    for signed in chains.values():
        signed.chain.flush(conn)
    return ids, len(events)


class _ChargeRow:
    """Attribute access to a charge's values (what :func:`charge_event_fields` reads from a database row)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)
