"""The spender's ledger: what tasks use. Reserve, renew, commit and release their own reservations, and read.

There is no governance call here: caps, allowlists, accountants and accounts change only through
:class:`~dp_operators.ledger.govern.LedgerGovernor` (``dpctl ledger apply``), signed with the governor's key, and
on PostgreSQL the spender's database role has no privilege to change them (docs/adr/0020).

Ownership: :meth:`Ledger.reserve` returns a :class:`~dp_operators.ledger.store.Reservation` carrying a random
token whose SHA-256 is stored with the charge; :meth:`Ledger.commit`, :meth:`Ledger.release` and
:meth:`Ledger.renew` find the charge by id and check its own account, release key, attempt and token before
changing anything. The ``committed``/``released`` event records the token (then spent) as ``proof``, so
``dpctl ledger verify`` detects a release written without it.

Leases: a reservation holds a lease (``lease_seconds``) its owner renews while it draws (:meth:`Ledger.lease`).
A second attempt of the same key meanwhile gets :class:`~dp_operators.ledger.errors.LeaseHeldError` and is not
charged; once the lease has expired (the owner died), the next attempt marks the reservation ``abandoned`` (still
spent) and is charged. :meth:`Ledger.reconcile` abandons every expired reservation.

Two paths, one behaviour: on SQLite each call runs the Python code below in one transaction; on PostgreSQL it is
one call of the ledger's function of the same name (``dp_reserve``, ``dp_commit``, ``dp_release``, ``dp_abandon``,
``dp_renew``, ``dp_reconcile``: :mod:`~dp_operators.ledger.pg_functions`), which does the same steps inside the
database, so the spender's database role needs no write privilege on any table (docs/adr/0029). The functions'
errors come back as the same exceptions, with the same messages.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import logging
import random
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dp_operators.accounting import exact_number, round_down, round_up, unit_of
from dp_operators.ledger import approvals, pg_functions, schema
from dp_operators.ledger.chain import (
    AccountChain,
    CanonicalOutput,
    audit_context,
    audit_row_mac,
    canonical_json,
    charge_event_fields,
    head_mismatch,
    seq_taken,
)
from dp_operators.ledger.errors import (
    AccountNotFoundError,
    AuditChainError,
    BoundingNotEnforcedError,
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    LeaseHeldError,
    LedgerAccessError,
    LedgerKeyError,
    LedgerNotInitialisedError,
    RoleNotAllowedError,
    stored_fraction,
)
from dp_operators.ledger.keys import AuditKey, Keyring, as_key
from dp_operators.ledger.structure import (
    QUOTA_PREFIX,
    bounding_refusal,
    config_record,
    members_charged,
    own_or_first_block,
    structure_of,
)
from dp_operators.ledger.store import (
    KEY_MATCHES,
    LedgerBase,
    Refusal,
    ReleaseKey,
    Reservation,
    SERIES_RUN_PREFIX,
    not_found,
    series_step_of,
    series_step_run_id,
    zero_amount_allowed,
)
from dp_operators.ledger.store import _is_retryable as is_retryable

log = logging.getLogger(__name__)

#: Default lease of a reservation, seconds. The owner renews it every third of this while it draws.
DEFAULT_LEASE_SECONDS = 120

# Statements built once with named bind parameters, so SQLAlchemy computes each cache key once and reuses the
# compiled form on every call (SQLAlchemy docs, "SQL Compilation Caching"); see also ``chain`` and ``store``.
_c = schema.charges.c
_CHARGE = sa.select(schema.charges).where(_c.id == sa.bindparam("charge_id"))
_ACCOUNT_CONFIG = sa.select(schema.accounts.c.name, schema.accounts.c.config).where(
    schema.accounts.c.name == sa.bindparam("name")
)
_CHARGES_OF_KEY = sa.select(schema.charges).where(*KEY_MATCHES).order_by(_c.attempt)
_RESERVATIONS_OF_KEY = sa.select(_c.state, _c.attempt, _c.lease_expires_at).where(
    *KEY_MATCHES, _c.account == sa.bindparam("account"), _c.state == "reserved"
)
_EXPIRED_RESERVATIONS = (
    sa.select(_c.id, _c.account)
    .where(
        _c.state == "reserved",
        sa.or_(
            _c.lease_expires_at.is_(None),
            _c.lease_expires_at <= sa.bindparam("now"),
            _c.lease_expires_at > sa.bindparam("horizon"),
        ),
    )
    .order_by(_c.account, _c.id)
)
_a = schema.audit_events.c
_COMMITTED_CHARGES = sa.select(schema.charges).where(*KEY_MATCHES, _c.state == "committed").order_by(_c.attempt)
_RESERVED_AND_COMMITTED = (
    sa.select(schema.audit_events)
    .where(_a.charge_id == sa.bindparam("charge_id"), _a.event.in_(("reserved", "committed")))
    .order_by(_a.account_seq)
)
_INSERT_CHARGE = schema.charges.insert()
#: SET columns come from the parameters (each distinct set of columns is compiled once); ``charge_id`` names the row.
_UPDATE_CHARGE = schema.charges.update().where(_c.id == sa.bindparam("charge_id"))


def _function_call(function: pg_functions.Function) -> str:
    """``SELECT name(CAST(%(arg)s AS type), ...)`` for a spend function, in psycopg's placeholders: every argument
    typed, so no overload and no driver's guess of a type can pick another function."""
    arguments = [arg.strip().split(" ", 1) for arg in function.args.split(",")]
    typed = ", ".join(f"CAST(%({name.removeprefix('p_')})s AS {kind})" for name, kind in arguments)
    return f"SELECT {function.name}({typed})"


#: One statement per spend call on PostgreSQL (one round trip, one transaction).
_DRIVER_CALLS = {function.name: _function_call(function) for function in pg_functions.SPEND_FUNCTIONS}


@functools.lru_cache(maxsize=64)
def _many_calls(name: str, count: int) -> str:
    """``SELECT f(args_0), f(args_1), ...``: spend function ``name`` on ``count`` member accounts in one statement,
    so in one transaction (a charge on privacy blocks commits on all of them or on none)."""
    function = next(f for f in pg_functions.SPEND_FUNCTIONS if f.name == name)
    arguments = [arg.strip().split(" ", 1) for arg in function.args.split(",")]
    calls = [
        f"{name}(" + ", ".join(f"CAST(%({n.removeprefix('p_')}_{i})s AS {kind})" for n, kind in arguments) + ")"
        for i in range(count)
    ]
    return "SELECT " + ", ".join(calls)


def series_step_problem(conn: Connection, key: ReleaseKey, account: str, charged: Fraction) -> str | None:
    """Why the ledger refuses to reserve ``charged`` for ``key`` on ``account`` as a series step (ADR 33), or
    ``None``: a run id under the series prefix must be a step's; a step after step 0 needs its predecessor committed
    on the account (steps in order); a step reserving nothing needs its series' step 0 committed with a charge.
    What ``dp_reserve`` checks on PostgreSQL; ``verify`` replays it."""
    if not key.run_id.startswith(SERIES_RUN_PREFIX):
        return None
    found = series_step_of(key.run_id)
    if found is None:
        return (f"run id {key.run_id[:60]!r} is under the series prefix but is no series step "
                "(__dp_series__/g<generation>/step/<6 digits>)")
    generation, step = found

    def committed(index: int) -> list[Any]:
        return [row for row in conn.execute(_CHARGES_OF_KEY, {
            **key.as_dict(), "run_id": series_step_run_id(generation, index)}).all()
            if row.account == account and row.state == "committed"]

    if step > 0 and not committed(step - 1):
        return (f"series step {step} of generation {generation} comes before step {step - 1} is committed on account "
                f"{account!r}: a series releases its steps in order")
    if charged == 0 and not any(row.amount != "0" for row in committed(0)):
        return (f"series step {step} of generation {generation} reserves nothing, but its step 0 was not committed "
                f"with a charge on account {account!r}")
    return None


def _refuse_unlike_siblings(conn: Any, charge: Any, allowed: tuple[str, ...], digest: str | None = None) -> None:
    """A reservation on several member accounts (blocks, quotas) settles whole (what ``dp_commit`` and
    ``dp_release`` check on PostgreSQL): its other charges (same token hash and release key) must be in a state of
    ``allowed``, or (a commit, ``digest`` given) committed with the same output.

    Raises:
        ChargeStateError: a sibling was settled otherwise; nothing is changed.
    """
    for other in conn.execute(_CHARGES_OF_KEY, {name: getattr(charge, name) for name in
                                                ("dag_id", "run_id", "task_id", "map_index", "release_name")}).all():
        if other.id == charge.id or other.token_hash != charge.token_hash:
            continue
        if other.state in allowed or (digest is not None and other.state == "committed"
                                      and other.output_digest == digest):
            continue
        raise ChargeStateError(
            f"charge {charge.id} is one member of a reservation whose member charge {other.id} is {other.state}: a "
            "reservation on several accounts is settled whole (committed with one output, or released when no "
            "noise was drawn for any of them)"
        )


def _member_missing(account: str, member: str) -> str:
    """The refusal of a charge whose member account does not exist: a block not opened (yet)."""
    part = member[len(account) + 1:]
    if part.startswith(QUOTA_PREFIX):
        return (f"account {account!r} has no member {member!r} (team quota {part[len(QUOTA_PREFIX):]!r}): a privacy "
                "officer runs 'dpctl ledger apply' with the configuration that declares it")
    return (f"the privacy block of window {part!r} of account {account!r} is not open: blocks open as the ledger "
            "configuration's 'blocks.open' says, when a privacy officer runs 'dpctl ledger apply'; a window past "
            "them cannot be charged (and a block never gets budget back)")


def _combined(key: ReleaseKey, account: str, parts: list[Reservation]) -> Reservation:
    """One reservation of ``account`` made of its members' (:attr:`Reservation.members`)."""
    first = parts[0]
    leases = [part.lease_expires_at for part in parts if part.lease_expires_at is not None]
    return Reservation(
        charge_id=first.charge_id, key=key, account=account, amount=max(part.amount for part in parts),
        attempt=first.attempt, delta=first.delta, token=first.token, lease_expires_at=min(leases, default=None),
        members=tuple(parts),
    )


def token_hash(token: str) -> str:
    """SHA-256 (hex) of a reservation token, as stored with the charge."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    if value is not None and value.tzinfo is None:  # SQLite returns naive UTC datetimes
        return value.replace(tzinfo=dt.timezone.utc)
    return value


def _live(lease: dt.datetime | None, now: dt.datetime) -> bool:
    """A lease is live until it ends; one ending more than ``MAX_LEASE_SECONDS`` ahead was not granted by the
    ledger (tampered) and counts as expired, so it cannot block its release key for ever."""
    return lease is not None and now < lease <= now + dt.timedelta(seconds=schema.MAX_LEASE_SECONDS)


def _raise_if_leased(charges: Any, key: ReleaseKey, now: dt.datetime) -> None:
    """Raise :class:`LeaseHeldError` for the first ``reserved`` charge of ``charges`` whose lease ends after ``now``."""
    for charge in charges:
        lease = _aware(charge.lease_expires_at)
        if charge.state == "reserved" and _live(lease, now):
            raise _lease_held(key, charge.attempt, lease)


def _lease_held(key: ReleaseKey, attempt: int, lease: dt.datetime) -> LeaseHeldError:
    return LeaseHeldError(
        f"attempt {attempt} of release {key.release_name!r} (run {key.run_id!r}, task {key.task_id!r}) is still "
        f"running and holds its lease until {lease.isoformat()}; nothing was charged. Retry after the lease: it ends "
        "early only if that attempt finishes",
        attempt=attempt,
        expires_at=lease,
    )


def _key_refused(account: str, accepts: str | None, given: str) -> LedgerKeyError:
    return LedgerKeyError(
        f"budget account {account!r} accepts spend key id {accepts!r}, but this connection's audit key has id "
        f"{given!r} (rotated, or the wrong key); nothing was reserved. Set the ledger connection's 'audit_key' to the "
        "current spend key"
    )


def _reconcile_key_refused(account: str, accepts: str | None, given: str) -> LedgerKeyError:
    return LedgerKeyError(
        f"budget account {account!r} accepts spend key id {accepts!r}, not {given!r}; nothing was reconciled. Use "
        "the current spend key, or the governor key"
    )


def _not_owned(where: str, action: str) -> ChargeStateError:
    return ChargeStateError(
        f"{where} is not this reservation's (the account, release key, attempt or token differ); nothing {action}"
    )


def _not_reserved(where: str, state: str, action: str) -> ChargeStateError:
    return ChargeStateError(
        f"{where} is {state}, no longer reserved (another attempt took over the release after its lease expired); "
        f"nothing {action}, and the charge stays spent"
    )


def _stored_context(charge: Any) -> dict[str, Any]:
    return json.loads(charge.context) if charge.context else {}


def abandon(conn: Connection, chain: AccountChain, charge: Any, context: Mapping[str, Any], reason: str) -> None:
    """Mark a reserved ``charge`` abandoned (it stays counted as spent) and record why."""
    conn.execute(_UPDATE_CHARGE, {"state": "abandoned", "updated_at": _utcnow(), "charge_id": charge.id})
    chain.append(conn, "abandoned", context, **charge_event_fields(charge), details={"reason": reason})


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def reconcile_expired(
    base: LedgerBase, key: AuditKey, audit: Mapping[str, Any] | None = None, *, governor: bool = False
) -> list[dict]:
    """Mark every reservation whose lease has expired ``abandoned`` (still spent), signing with ``key``.

    Args:
        governor: ``key`` is the governor key (it may sign for any account); otherwise it must be the spend key
            each touched account accepts.

    Returns one dict per abandoned charge (id, account, release key, attempt, amount, lease_expires_at).

    Raises:
        LedgerKeyError: a spend key an account with expired reservations does not accept; nothing is changed.
    """
    base.check_schema()
    context = audit_context(audit)

    def work(conn: Connection) -> list[dict]:
        now = base._db_now(conn)
        horizon = now + dt.timedelta(seconds=schema.MAX_LEASE_SECONDS)
        expired = conn.execute(_EXPIRED_RESERVATIONS, {"now": now, "horizon": horizon}).all()
        done: list[dict] = []
        for account in sorted({row.account for row in expired}):
            chain = AccountChain.lock(conn, account, key)
            if chain is None:  # pragma: no cover - the foreign key keeps charges' accounts
                continue
            if not governor and chain.row.spend_key_id != key.key_id:
                raise _reconcile_key_refused(account, chain.row.spend_key_id, key.key_id)
            for charge_id in [row.id for row in expired if row.account == account]:
                charge = conn.execute(_CHARGE, {"charge_id": charge_id}).first()
                lease = _aware(charge.lease_expires_at)
                if charge.state != "reserved" or _live(lease, now):
                    continue  # renewed or finished since the first read
                abandon(conn, chain, charge, context, "lease expired (reconcile)")
                done.append(
                    {
                        "id": charge.id, "account": charge.account, "dag_id": charge.dag_id, "run_id": charge.run_id,
                        "task_id": charge.task_id, "map_index": charge.map_index,
                        "release_name": charge.release_name, "attempt": charge.attempt, "amount": charge.amount,
                        "delta_amount": charge.delta_amount, "lease_expires_at": lease,
                    }
                )
            chain.flush(conn)
        return done

    return base._write(work)


class Ledger(LedgerBase):
    """The spender's view of a persisted privacy-budget ledger (what release tasks use).

    Args:
        url: SQLAlchemy URL of the ledger database, or an existing :class:`~sqlalchemy.engine.Engine`.
        audit_key: the spend key (:class:`~dp_operators.ledger.keys.AuditKey` or its text) that signs this
            ledger's spend events; the account must accept its id. Needed to reserve, commit, release and
            reconcile; reading needs none.
        lease_seconds: how long a reservation's lease lasts without renewal (default 120 s; at most
            :data:`~dp_operators.ledger.schema.MAX_LEASE_SECONDS`).
        max_retries: how often a transaction that lost a lock race is retried.
    """

    def __init__(
        self,
        url: str | Engine,
        *,
        audit_key: AuditKey | str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        max_retries: int = 30,
        retired_audit_keys: Iterable[AuditKey | str] = (),
    ) -> None:
        super().__init__(url, max_retries=max_retries)
        self._key = as_key(audit_key)
        # keys that signed earlier spend events: only to authenticate a replay of a release committed under them
        self._verifying_keys = Keyring([self._key, *(as_key(k) for k in retired_audit_keys)])
        if not 0 < lease_seconds <= schema.MAX_LEASE_SECONDS:
            raise ValueError(f"lease_seconds must be in (0, {schema.MAX_LEASE_SECONDS}], got {lease_seconds}")
        self.lease_seconds = lease_seconds

    def _spend_key(self) -> AuditKey:
        if self._key is None:
            raise LedgerKeyError(
                "this ledger connection has no audit key, so it cannot sign spend events: set the extra "
                "'audit_key' of the ledger connection (or DP_LEDGER_AUDIT_KEY for dpctl) to the spend key the "
                "privacy officer gave the accounts ('dpctl ledger apply --audit-key-file')"
            )
        return self._key

    def _check_key(self, row: Any) -> None:
        key = self._spend_key()
        if row.spend_key_id != key.key_id:
            raise _key_refused(row.name, row.spend_key_id, key.key_id)

    def authenticated_output(self, key: ReleaseKey, account: str | None = None) -> dict | None:
        """The committed output of ``key`` (parsed JSON), or ``None``, once it is shown to be what the attempt that
        committed it wrote: a replay publishes it, so a row edited or inserted in the database must not pass.
        ``account``: only a charge on that account counts (a release replays only what its own account paid for:
        another team whose DAG id is allowed on an account of its own cannot choose what this release publishes);
        on an account with privacy blocks, the charge of its first member block.

        Checked against the charge's own audit events, with this connection's spend key (or a retired one it was
        given): exactly one committed charge of ``key``; its ``reserved`` and ``committed`` events name this
        charge's account, release key and attempt, and carry valid MACs under a key this connection holds (an
        unkeyed or unknown-key event is refused); the stored output hashes to the ``committed`` event's
        ``output_digest``; that event's ``proof`` (the reservation's token, known only to the attempt that
        reserved) hashes to the ``token_hash`` of the charge and of its ``reserved`` event. So neither an output
        edited in the database, nor a charge inserted or re-keyed by SQL, nor a reserved charge marked committed
        without the token is replayed. The whole chain is ``dpctl ledger verify``'s.

        Raises:
            AuditChainError: a check fails (nothing is published; a privacy officer runs ``dpctl ledger verify``).
            LedgerKeyError: no spend key, or an event signed by a key this connection does not hold (a release
                committed before a spend-key rotation: give the connection the retired key, extra
                ``retired_audit_keys``), or unkeyed (committed before the ledger's chain was keyed).
        """
        self.check_schema()
        with self._read() as conn:
            charges = [dict(row) for row in conn.execute(_COMMITTED_CHARGES, key.as_dict()).mappings()]
            if account is not None:  # on an account with privacy blocks, its first block charged
                charges = own_or_first_block(charges, account)
            if not charges:
                return None
            events = [dict(row) for row in
                      conn.execute(_RESERVED_AND_COMMITTED, {"charge_id": charges[0]["id"]}).mappings()]
        return self._authenticated(key, charges, events)

    def authenticated_outputs(self, key: ReleaseKey, account: str) -> dict[str, dict]:
        """The committed outputs of every release key that is ``key`` but for a run id starting with
        ``key.run_id``, on ``account``: run id -> output, each authenticated as :meth:`authenticated_output` does
        (one read of the charges and one of their events, however many keys). A series reads its steps so
        (``__dp_series__/...`` run ids: :mod:`dp_operators.continual.run`).

        Raises:
            AuditChainError, LedgerKeyError: as :meth:`authenticated_output`, for any of the keys.
        """
        self.check_schema()
        fields = key.as_dict()
        with self._read() as conn:
            charges = [dict(row) for row in conn.execute(
                sa.select(schema.charges).where(
                    _c.dag_id == fields["dag_id"], _c.task_id == fields["task_id"],
                    _c.map_index == fields["map_index"], _c.release_name == fields["release_name"],
                    _c.run_id.startswith(key.run_id, autoescape=True), _c.account == account,
                    _c.state == "committed",
                ).order_by(_c.run_id, _c.attempt)).mappings()]
            events = [dict(row) for row in conn.execute(
                sa.select(schema.audit_events).where(
                    _a.charge_id.in_([charge["id"] for charge in charges]),
                    _a.event.in_(("reserved", "committed")),
                ).order_by(_a.account_seq)).mappings()] if charges else []
        by_run: dict[str, list[dict]] = {}
        for charge in charges:
            by_run.setdefault(charge["run_id"], []).append(charge)
        outputs = {}
        for run_id, committed in by_run.items():
            ids = {charge["id"] for charge in committed}
            outputs[run_id] = self._authenticated(
                ReleaseKey(key.dag_id, run_id, key.task_id, key.map_index, key.release_name), committed,
                [event for event in events if event["charge_id"] in ids],
            )
        return outputs

    def _authenticated(self, key: ReleaseKey, charges: list[dict], events: list[dict]) -> dict:
        """The output of the committed ``charges`` of ``key`` (one, else refused) once its ``reserved`` and
        ``committed`` ``events`` authenticate it (:meth:`authenticated_output`)."""
        where = (f"the committed output of release {key.release_name!r} (DAG {key.dag_id!r}, run {key.run_id!r}, "
                 f"task {key.task_id!r}, map index {key.map_index})")

        def refuse(why: str) -> AuditChainError:
            return AuditChainError(f"{where} {why}: the ledger was altered; nothing is published from it. A privacy "
                                   "officer runs `dpctl ledger verify`")

        if len(charges) != 1:
            raise refuse(f"has {len(charges)} committed charges")
        charge = charges[0]
        if charge["attempt"] < 1 or charge["output"] is None:
            raise refuse("is not a charge the ledger commits")
        reserved = [e for e in events if e["event"] == "reserved"]
        committed = [e for e in events if e["event"] == "committed"]
        if not events:
            raise LedgerKeyError(
                f"{where} has no audit events: it was committed before the ledger kept them (schema 1), so a replay "
                "cannot authenticate it and does not publish it; a privacy officer checks it with `dpctl ledger "
                "verify` (release anew under another run id)"
            )
        if len(reserved) != 1 or len(committed) != 1:
            raise refuse(f"has {len(reserved)} 'reserved' and {len(committed)} 'committed' audit events instead of "
                         "one each")
        for event in (*reserved, *committed):
            named = {field: event[field] for field in ("account", "dag_id", "run_id", "task_id", "map_index",
                                                       "release_name", "attempt")}
            if named != {field: charge[field] for field in named}:
                raise refuse(f"has a {event['event']!r} audit event of another charge")
            self._authenticate(event, where)
        digest = hashlib.sha256(charge["output"].encode("utf-8")).hexdigest()
        if digest != committed[0]["output_digest"]:
            raise refuse("does not hash to the digest its 'committed' audit event records")
        token_hash, proof = reserved[0]["token_hash"], committed[0]["proof"]
        if (token_hash is None or token_hash != charge["token_hash"] or proof is None
                or hashlib.sha256(proof.encode("utf-8")).hexdigest() != token_hash):
            raise refuse("was committed without its reservation's token (its 'committed' event's proof does not "
                         "match): not by the attempt that reserved it")
        return json.loads(charge["output"])

    def _authenticate(self, event: Mapping[str, Any], where: str) -> None:
        key = self._verifying_keys.get(event["key_id"]) if event["key_id"] is not None else None
        if key is None:
            if self._key is None:
                self._spend_key()  # raises: no key at all
            signer = "no key (written before the ledger's chain was keyed, schema 2)" if event["key_id"] is None else \
                f"key id {event['key_id']!r}"
            raise LedgerKeyError(
                f"{where}: its {event['event']!r} audit event is signed by {signer}, which this connection cannot "
                "check, so it is not shown to be the committed release and is not published. If a spend key was "
                "rotated since, give the connection the retired key (extra 'retired_audit_keys'); else have a "
                "privacy officer check it with `dpctl ledger verify`"
            )
        if audit_row_mac(event, key) != event["row_hash"]:
            raise AuditChainError(f"{where}: its {event['event']!r} audit event does not carry a valid MAC: the "
                                  "ledger was altered; nothing is published from it")

    # -- the release path ----------------------------------------------------------------------------------------
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
        takeover_amount: Fraction | int | None = None,
        windows: Sequence[str] | None = None,
    ) -> Reservation | dict:
        """Atomically check the budget and reserve ``amount`` (and ``delta`` on an ``approx_dp`` account) for the
        release ``key``, under a lease of ``lease_seconds``; a later attempt of ``key`` (an earlier one was
        reserved, so it may have drawn noise) is charged ``takeover_amount`` instead.

        Returns the stored output (a ``dict``) if ``key`` was already committed (idempotent replay: nothing is
        charged), else a :class:`Reservation` with its token. A ``reserved`` charge of the same key whose lease has
        expired (its attempt died) is marked ``abandoned`` and stays counted as spent.

        Args:
            amount: the charge in the account's unit (rounded up to the ledger's resolution); 0 only with a
                positive ``takeover_amount`` (a series step, whose budget its series paid: ADR 33).
            takeover_amount: what an attempt after the key's first is charged (default ``amount``); > 0.
            mechanisms: JSON-safe descriptions of every noised step (kind, scale, sensitivity, loss), recorded with
                the charge and in the audit log so the spend can be recomputed later.
            delta: the delta part of the charge; must be 0 unless the account is ``approx_dp``.
            audit: who/where context for the audit log: ``run_type``, ``triggering_user`` (and optionally
                ``host``, ``user``); see :func:`~dp_operators.ledger.chain.audit_context`.
            windows: the data windows the release reads, on an account with privacy blocks (ids as
                :func:`~dp_operators.ledger.structure.windows_read` gives them); each window's block is charged the
                full amount, all or nothing. ``None`` on any other account.

        On an account with privacy blocks or team quotas the ledger charges its member accounts
        (:func:`~dp_operators.ledger.structure.members_charged`) in one transaction: the returned reservation holds
        one per member (:attr:`Reservation.members`), or nothing is reserved and the refusing member's ``refused``
        event is the only write.

        Raises:
            AccountNotFoundError, DagNotAllowedError, BudgetExhaustedError: refusals; nothing is reserved (a
                ``refused`` audit event is recorded for the last two). A block not opened yet is an
                :class:`AccountNotFoundError` naming the window.
            BoundingNotEnforcedError: the account requires enforced contribution bounding
                (``require_enforced_bounding``) and a step of ``mechanisms`` lacks
                ``contribution_bounding.mode == "enforced"``; nothing is reserved or written.
            LeaseHeldError: another attempt of ``key`` holds a live lease; nothing is charged (transient).
            LedgerKeyError: no audit key, or not the key the account accepts.
            ValueError: a non-positive amount, a delta on an account that is not ``approx_dp``, or a bad ``audit``.
        """
        self.check_schema()
        amount = round_up(exact_number(amount, name="amount"))
        takeover = amount if takeover_amount is None else round_up(exact_number(takeover_amount, name="takeover_amount"))
        delta = round_up(exact_number(delta, name="delta"))
        if amount < 0 or takeover <= 0:
            raise ValueError(f"a charge must be > 0 (0 only for a first attempt, with a takeover amount > 0), got "
                             f"{amount} and takeover amount {takeover}")
        if amount == 0 and not zero_amount_allowed(key.run_id):
            raise ValueError(f"a charge must be > 0, got 0: only a series step after the first (run id "
                             f"__dp_series__/g<generation>/step/<t>, t > 0) reserves nothing, its series paid at step "
                             f"0; run id {key.run_id[:60]!r}")
        if delta < 0:
            raise ValueError(f"a delta charge must be >= 0, got {delta}")
        signing_key = self._spend_key()
        context = audit_context(audit)
        mechanisms_text = canonical_json(mechanisms)
        key_fields = {**key.as_dict(), "try_number": try_number, "spec_hash": spec_hash}
        token = secrets.token_urlsafe(32)
        if windows is not None and (isinstance(windows, str) or not all(isinstance(w, str) for w in windows)):
            raise TypeError(f"windows is a list of window ids (text), got {type(windows).__name__}")
        if self._in_database:
            return self._reserve_in_database(
                key, account, amount, takeover, delta, mechanisms_text, spec_hash, try_number, context, signing_key,
                token, list(windows or ()),
            )

        def work(conn: Connection) -> Reservation | dict | Refusal:
            parent = conn.execute(_ACCOUNT_CONFIG, {"name": account}).first()
            if parent is None:
                raise AccountNotFoundError(not_found(account))
            parent_config = config_record(parent.config)
            members = members_charged(account, parent_config, windows, key.dag_id)
            if isinstance(members, str):
                raise ValueError(members)
            if members == [account]:
                return reserve_on(conn, account)
            for member in members:
                if conn.execute(_ACCOUNT_CONFIG, {"name": member}).first() is None:
                    raise AccountNotFoundError(_member_missing(account, member))
            conn.savepoint("dp_members")
            parts: list[Reservation] = []
            for member in members:
                result = reserve_on(conn, member)
                if isinstance(result, Reservation):
                    parts.append(result)
                    continue
                # all or nothing: undo the members reserved so far; a refusal is then recorded on its member alone
                conn.savepoint("dp_members", "ROLLBACK TO")
                conn.savepoint("dp_members", "RELEASE")
                return reserve_on(conn, member) if isinstance(result, Refusal) else result
            conn.savepoint("dp_members", "RELEASE")
            return _combined(key, account, parts)

        named = account

        def reserve_on(conn: Connection, account: str) -> Reservation | dict | Refusal:
            chain = AccountChain.lock(conn, account, signing_key)
            if chain is None:
                raise AccountNotFoundError(not_found(account))
            row = chain.row
            self._check_key(row)
            if delta and row.accountant != "approx_dp":
                raise ValueError(f"account {account!r} is {row.accountant}: a charge on it has no delta part")
            allowed = json.loads(row.allowed_dags)
            if key.dag_id not in allowed:
                chain.append(
                    conn, "refused", context, amount=amount, delta_amount=delta, mechanisms=mechanisms_text,
                    details={"reason": "dag_not_allowed"}, **key_fields,
                )
                chain.flush(conn)
                return Refusal(DagNotAllowedError.of(key.dag_id, account, allowed))
            previous = conn.execute(_CHARGES_OF_KEY, key.as_dict()).all()
            attempt = max((charge.attempt for charge in previous), default=0) + 1
            # Only this account's charges of the key are replayed, waited for or taken over: another account's (a
            # spec that changed account, or another team whose DAG id is allowed on an account of its own) stay as
            # they are, spent until their own account's reconcile.
            mine = [charge for charge in previous if charge.account == account]
            for charge in mine:
                if charge.state == "committed":
                    return json.loads(charge.output)
            # the account's contribution-bounding policy, on the row locked above (a block's or a quota's own
            # record carries its account's), after the replay of a committed output and before anything is written
            # (dp_reserve_member on PostgreSQL); raised, so the transaction, with any member reserved, rolls back
            declared = bounding_refusal(config_record(row.config), mechanisms_text)
            if declared is not None:
                raise BoundingNotEnforcedError.of(named, declared)
            charged = takeover if mine else amount  # a later attempt on this account may follow a drawn one
            problem = series_step_problem(conn, key, account, charged)
            if problem:
                raise ValueError(problem)
            now = self._db_now(conn)
            _raise_if_leased(mine, key, now)
            for charge in mine:
                if charge.state == "reserved":
                    abandon(conn, chain, charge, context, "lease expired; a later attempt of the same release key took over")
            remaining = round_down(stored_fraction(row.cap, f"budget account {account!r}: cap") - chain.spent)
            refusal: BudgetExhaustedError | None = None
            if charged > remaining:
                refusal = BudgetExhaustedError(account, unit_of(row.accountant), charged, max(remaining, Fraction(0)))
            elif row.accountant == "approx_dp":
                remaining_delta = round_down(
                    stored_fraction(row.delta, f"budget account {account!r}: delta") - chain.delta_spent
                )
                if delta > remaining_delta:
                    refusal = BudgetExhaustedError(account, "delta", delta, max(remaining_delta, Fraction(0)))
            if refusal is not None:
                chain.append(
                    conn, "refused", context, amount=charged, delta_amount=delta, mechanisms=mechanisms_text,
                    details={"reason": "budget_exhausted", "remaining": str(refusal.remaining), "unit": refusal.unit},
                    **key_fields,
                )
                chain.flush(conn)
                return Refusal(refusal)
            held = approvals.check_charge(conn, row, key, spec_hash, charged, max(remaining, Fraction(0)),
                                          mechanisms_text, now)
            if held is not None:  # the account's approval policy: nothing reserved, nothing else written
                chain.flush(conn)
                return Refusal(held)
            created = _utcnow()
            lease_end = now + dt.timedelta(seconds=self.lease_seconds)
            hashed = token_hash(token)
            charge_id = conn.execute(
                _INSERT_CHARGE,
                {
                    "account": account,
                    "attempt": attempt,
                    "state": "reserved",
                    "amount": str(charged),
                    "delta_amount": str(delta),
                    "mechanisms": mechanisms_text,
                    "spec_hash": spec_hash,
                    "try_number": try_number,
                    "context": canonical_json(context),
                    "token_hash": hashed,
                    "lease_expires_at": lease_end,
                    "created_at": created,
                    "updated_at": created,
                    **key.as_dict(),
                },
            ).inserted_primary_key[0]
            chain.spent = round_up(chain.spent + charged)
            chain.delta_spent = round_up(chain.delta_spent + delta)
            chain.append(
                conn, "reserved", context, charge_id=charge_id, attempt=attempt, amount=charged, delta_amount=delta,
                mechanisms=mechanisms_text, token_hash=hashed, created_at=created, **key_fields,
            )
            chain.flush(conn)
            return Reservation(
                charge_id=charge_id, key=key, account=account, amount=charged, attempt=attempt, delta=delta,
                token=token, lease_expires_at=lease_end,
            )

        return self._write_driver(work, before=None if windows else lambda conn: self._refuse_live_lease(conn, key, account))

    def _refuse_live_lease(self, conn: Any, key: ReleaseKey, account: str) -> None:
        """Raise :class:`LeaseHeldError` if another attempt of ``key`` on ``account`` holds a live lease, read
        before the write lock is taken, so attempts polling a busy key do not queue on the account's lock ahead of
        the owner's renewals. (:meth:`reserve` checks again under the lock.)"""
        previous = conn.execute(_RESERVATIONS_OF_KEY, {**key.as_dict(), "account": account}).all()
        if previous:
            _raise_if_leased(previous, key, self._db_now(conn))

    def _owned_charge(self, conn: Connection, reservation: Reservation, action: str) -> tuple[AccountChain, Any]:
        """Lock the charge's own account and return ``(chain, charge)`` if ``reservation`` owns a charge that is
        still ``reserved``.

        Raises:
            ChargeStateError: no such charge, not this reservation's (account, key, attempt or token differ), or
                no longer reserved. Nothing is changed.
        """
        charge = conn.execute(_CHARGE, {"charge_id": reservation.charge_id}).first()
        where = f"charge {reservation.charge_id} for {reservation.key}"
        if charge is None:
            raise ChargeStateError(f"{where} does not exist; nothing {action}")
        # on SQLite (the only database this path runs on: PostgreSQL calls its functions) the transaction holds
        # the write lock from BEGIN IMMEDIATE, so the charge read above is the locked state
        chain = AccountChain.lock(conn, charge.account, self._spend_key())
        owned = (
            charge.account == reservation.account
            and ReleaseKey(charge.dag_id, charge.run_id, charge.task_id, charge.map_index, charge.release_name)
            == reservation.key
            and charge.attempt == reservation.attempt
            and charge.token_hash is not None
            and secrets.compare_digest(charge.token_hash, token_hash(reservation.token))
        )
        if not owned:
            raise _not_owned(where, action)
        self._check_key(chain.row)
        if charge.state != "reserved":
            raise _not_reserved(where, charge.state, action)
        return chain, charge

    def commit(self, reservation: Reservation, output: dict, *, audit: Mapping[str, Any] | None = None,
               canonical: CanonicalOutput | None = None) -> str:
        """Store the noised ``output`` (plain JSON) and mark the charge ``committed``. Returns its SHA-256 digest,
        which the ``committed`` audit event records (the output itself is not in the audit log). ``canonical``:
        ``CanonicalOutput.encode(output)`` when the caller has just encoded it (a large output is then encoded once);
        any other kind of text is refused.

        Raises:
            ChargeStateError: the reservation is not this charge's owner, or the charge is no longer ``reserved``
                (a later attempt abandoned it): this output must not be published.
            ValueError: ``output`` is not plain, finite JSON.
        """
        self.check_schema()
        if canonical is not None and not isinstance(canonical, CanonicalOutput):
            raise TypeError("Ledger.commit(canonical=...) takes a CanonicalOutput.encode(output), not "
                            f"{type(canonical).__name__}: pass the output alone and the ledger encodes it")
        text = canonical_json(output) if canonical is None else str(canonical)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        parts = reservation.parts()
        if self._in_database:
            try:
                self._call_owned("dp_commit", reservation, "committed", output=text, **self._audit_params(audit))
            except ChargeStateError:
                # a call retried after its connection was lost may find its own commit landed: that is success
                if not all(self._committed_as(part, digest) for part in parts):
                    raise
            return digest

        def work(conn: Connection) -> str:
            for index, part in enumerate(parts):  # every member in one transaction
                chain, charge = self._owned_charge(conn, part, "committed")
                if index == 0:  # its siblings are every other member's charge: checked once, before any changes
                    _refuse_unlike_siblings(conn, charge, ("reserved",), digest)
                conn.execute(
                    _UPDATE_CHARGE,
                    {
                        "state": "committed", "output": text, "output_digest": digest, "updated_at": _utcnow(),
                        "charge_id": charge.id,
                    },
                )
                chain.append(
                    conn, "committed", audit_context(audit, _stored_context(charge)), output_digest=digest,
                    proof=part.token, **charge_event_fields(charge),
                )
                chain.flush(conn)
            return digest

        return self._write_driver(work)

    def _committed_as(self, reservation: Reservation, digest: str) -> bool:
        """Whether ``reservation``'s own charge (its account, key, attempt and token) is committed with the output
        of SHA-256 ``digest``."""
        with self._read() as conn:
            charge = conn.execute(_CHARGE, {"charge_id": reservation.charge_id}).first()
        return (
            charge is not None and charge.state == "committed" and charge.output_digest == digest
            and charge.account == reservation.account and charge.attempt == reservation.attempt
            and ReleaseKey(charge.dag_id, charge.run_id, charge.task_id, charge.map_index, charge.release_name)
            == reservation.key
            and charge.token_hash is not None and secrets.compare_digest(charge.token_hash, token_hash(reservation.token))
        )

    def release(self, reservation: Reservation, *, audit: Mapping[str, Any] | None = None) -> None:
        """Return a reservation whose noise was provably never drawn (``reserved -> released``): its owner's
        statement, proven by the token (recorded as the event's ``proof``).

        Raises:
            ChargeStateError: the reservation is not this charge's owner, or the charge is not ``reserved``.
        """
        self.check_schema()
        if self._in_database:
            self._call_owned("dp_release", reservation, "released", **self._audit_params(audit))
            return

        def work(conn: Connection) -> None:
            for index, part in enumerate(reservation.parts()):
                chain, charge = self._owned_charge(conn, part, "released")
                if index == 0:  # its siblings are every other member's charge: checked once, before any changes
                    _refuse_unlike_siblings(conn, charge, ("reserved", "released"))
                conn.execute(_UPDATE_CHARGE, {"state": "released", "updated_at": _utcnow(), "charge_id": charge.id})
                # rounded up to the ledger's resolution, as every total is: subtracting exact amounts one after
                # another would multiply their denominators past what a stored number holds (never below the truth)
                chain.spent = round_up(chain.spent - stored_fraction(charge.amount, f"charge {charge.id}: amount"))
                chain.delta_spent = round_up(
                    chain.delta_spent - stored_fraction(charge.delta_amount, f"charge {charge.id}: delta_amount"))
                chain.append(
                    conn, "released", audit_context(audit, _stored_context(charge)), proof=part.token,
                    **charge_event_fields(charge), details={"reason": "no noise was drawn"},
                )
                chain.flush(conn)

        self._write_driver(work)

    def abandon(self, reservation: Reservation, *, audit: Mapping[str, Any] | None = None) -> None:
        """Give up a reservation whose noise may have been drawn (``reserved -> abandoned``): it stays counted as
        spent, and its lease ends at once, so the next attempt of the key is charged again without waiting.

        Raises:
            ChargeStateError: the reservation is not this charge's owner, or the charge is not ``reserved``.
        """
        self.check_schema()
        if self._in_database:
            self._call_owned("dp_abandon", reservation, "abandoned", **self._audit_params(audit))
            return

        def work(conn: Connection) -> None:
            for part in reservation.parts():
                chain, charge = self._owned_charge(conn, part, "abandoned")
                abandon(conn, chain, charge, audit_context(audit, _stored_context(charge)),
                        "its attempt failed after noise may have been drawn")
                chain.flush(conn)

        self._write_driver(work)

    def renew(self, reservation: Reservation) -> dt.datetime:
        """Extend the reservation's lease by ``lease_seconds`` from now; returns the new end (UTC). Not an audit
        event (the lease is the only column that changes).

        Raises:
            ChargeStateError: the reservation is not this charge's owner, or it is no longer ``reserved``, or it was
                created more than ``MAX_RESERVATION_HOLD_SECONDS`` (6 h) ago: no reservation holds its release key
                against other attempts longer than that.
        """
        self.check_schema()
        if self._in_database:
            result = self._call_owned(
                "dp_renew", reservation, "renewed", retries=3, lease_seconds=float(self.lease_seconds)
            )
            results = result if reservation.members else [result]
            return min(dt.datetime.fromisoformat(r["lease_expires_at"]) for r in results)

        def work(conn: Connection) -> dt.datetime:
            now = self._db_now(conn)
            end = now + dt.timedelta(seconds=self.lease_seconds)
            for part in reservation.parts():
                _, charge = self._owned_charge(conn, part, "renewed")
                created = charge.created_at
                if created.tzinfo is None:  # SQLite's DateTime holds UTC without its zone
                    created = created.replace(tzinfo=dt.timezone.utc)
                if now - created > dt.timedelta(seconds=schema.MAX_RESERVATION_HOLD_SECONDS):
                    raise ChargeStateError(
                        f"charge {charge.id} has held its release key since {created.isoformat()}, longer than the "
                        f"ledger allows ({schema.MAX_RESERVATION_HOLD_SECONDS} s): its lease is not renewed, and "
                        "another attempt may take the release over once it runs out"
                    )
                conn.execute(_UPDATE_CHARGE, {"lease_expires_at": end, "charge_id": charge.id})
            return end

        # Few retries: the keeper tries again a moment later rather than waiting out a long backoff.
        return self._write_driver(work, retries=3)

    @contextlib.contextmanager
    def lease(self, reservation: Reservation) -> Iterator[None]:
        """Keep ``reservation``'s lease alive while the block runs: a daemon thread renews it every third of
        ``lease_seconds``. A transient failure is logged (its type only) and retried within a second; renewals end
        when the charge is no longer this reservation's to renew (the commit then says it was taken over)."""
        stop = threading.Event()
        period = self.lease_seconds / 3

        def keep() -> None:
            wait = period
            while not stop.wait(wait):
                try:
                    self.renew(reservation)
                    wait = period
                except ChargeStateError as error:  # taken over, finished or held too long: the commit will say
                    log.warning("the reservation's lease is no longer renewed: %s", error)
                    return
                except Exception as error:  # noqa: BLE001 - transient (lock race, connection): try again soon
                    log.warning("the reservation's lease could not be renewed (%s); retrying", type(error).__name__)
                    wait = min(period, 1.0)

        thread = threading.Thread(target=keep, name=f"dp-lease-{reservation.charge_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def reconcile(self, *, audit: Mapping[str, Any] | None = None) -> list[dict]:
        """Mark every reservation whose lease has expired ``abandoned`` (still counted as spent); see
        :func:`reconcile_expired`."""
        if not self._in_database:
            return reconcile_expired(self, self._spend_key(), audit)
        self.check_schema()
        key = self._spend_key()
        done = self._call("dp_reconcile", {"key": key.secret, "context": canonical_json(audit_context(audit))})
        for charge in done:
            lease = charge["lease_expires_at"]
            charge["lease_expires_at"] = None if lease is None else dt.datetime.fromisoformat(lease)
        return done

    # -- approval before a large charge (dp_operators.ledger.approvals) -------------------------------------------
    def request_approval(
        self,
        key: ReleaseKey,
        *,
        account: str,
        amount: Fraction,
        mechanisms: list[dict],
        spec_hash: str,
        plan: Mapping[str, Any],
        delta: Fraction | int = 0,
        audit: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """File a request for a privacy officer's approval of a charge of ``amount`` for ``key`` on ``account``
        (an ``approval_requested`` event signed with the spend key, ``details.plan`` = ``plan``: what the officer
        sees), or return the request already filed for the key and spec hash (idempotent), or its decision.

        Returns ``{"state": "pending" | "granted" | "rejected", "request": seq, "requested_at", "expires_at", ...}``
        (``reason`` ``rejected`` or ``timeout`` when rejected). Times are the database's (PostgreSQL) or this
        machine's (SQLite).

        Raises:
            AccountNotFoundError, LedgerKeyError, DagNotAllowedError; ValueError: the account has no approval
                policy, or a bad amount, plan or audit. BoundingNotEnforcedError: the account requires enforced
                contribution bounding and a step of ``mechanisms`` only declared its bounds (the charge would be
                refused, so no request is filed; nothing is written).
        """
        self.check_schema()
        amount = round_up(exact_number(amount, name="amount"))
        delta = round_up(exact_number(delta, name="delta"))
        if amount <= 0 or delta < 0:
            raise ValueError(f"an approval request is for a charge > 0, got {amount} (delta {delta})")
        plan_text = approvals.check_plan(dict(plan))
        signing_key = self._spend_key()
        context = audit_context(audit)
        mechanisms_text = canonical_json(mechanisms)
        if self._in_database:
            result = self._call("dp_request_approval", {
                "key": signing_key.secret, "account": account, **key.as_dict(), "amount": str(amount),
                "delta": str(delta), "mechanisms": mechanisms_text, "spec_hash": spec_hash, "plan": plan_text,
                "context": canonical_json(dict(context)),
            }, key=key)
            if result.get("state") == "dag_not_allowed":
                raise DagNotAllowedError.of(key.dag_id, account, result["allowed"])
            if result.get("state") == "no_policy":
                raise ValueError(f"budget account {account!r} requires no approval: nothing to request")
            if result.get("state") == "bounding_not_enforced":
                raise BoundingNotEnforcedError.of(account, list(result.get("declared") or ()))
            return result

        def work(conn: Connection) -> dict[str, Any]:
            chain = AccountChain.lock(conn, account, signing_key)
            if chain is None:
                raise AccountNotFoundError(not_found(account))
            row = chain.row
            self._check_key(row)
            part_of = approvals.approval_account(account, row.config)
            if structure_of(config_record(row.config))[0] == "member":
                raise ValueError(f"account {account!r} is a member of another account ({part_of!r}): approvals are "
                                 "requested on the account a release names")
            allowed = json.loads(row.allowed_dags)
            if key.dag_id not in allowed:
                raise DagNotAllowedError.of(key.dag_id, account, allowed)
            policy = approvals.policy_of(row.config)
            if policy is None:
                raise ValueError(f"budget account {account!r} requires no approval: nothing to request")
            # an officer never reviews a charge the account's bounding policy would refuse (dp_request_approval)
            declared = bounding_refusal(config_record(row.config), mechanisms_text)
            if declared is not None:
                raise BoundingNotEnforcedError.of(account, declared)
            now = self._db_now(conn)
            state = approvals.approval_state(approvals._key_events(conn, account, key, spec_hash),
                                             row.spend_key_id, amount, approvals.timeout_of(policy), now)
            if state["state"] != "none":
                return state
            event = chain.append(
                conn, approvals.APPROVAL_REQUESTED, context, amount=amount, delta_amount=delta,
                mechanisms=mechanisms_text, spec_hash=spec_hash, details={"plan": json.loads(plan_text)},
                **key.as_dict(),
            )
            chain.flush(conn)
            requested = dt.datetime.fromisoformat(event["created_at"])
            return {"state": "pending", "request": event["account_seq"], "requested_at": requested.isoformat(),
                    "expires_at": (requested + approvals.timeout_of(policy)).isoformat()}

        return self._write_driver(work)

    # -- PostgreSQL: the spend functions (docs/adr/0029) ----------------------------------------------------------
    @property
    def _in_database(self) -> bool:
        """Whether spend calls are the database's functions (PostgreSQL) rather than this module's Python (SQLite)."""
        return self.dialect == "postgresql"

    def _reserve_in_database(
        self, key: ReleaseKey, account: str, amount: Fraction, takeover: Fraction, delta: Fraction, mechanisms: str,
        spec_hash: str, try_number: int | None, context: Mapping[str, Any], signing_key: AuditKey, token: str,
        windows: list[str],
    ) -> Reservation | dict:
        result = self._call(
            "dp_reserve",
            {
                "key": signing_key.secret, "account": account, "windows": windows, **key.as_dict(), "amount": str(amount),
                "takeover": str(takeover), "delta": str(delta), "mechanisms": mechanisms, "spec_hash": spec_hash, "try_number": try_number,
                "context": canonical_json(dict(context)), "token_hash": token_hash(token),
                "lease_seconds": float(self.lease_seconds),
            },
            key=key,
        )
        status = result["status"]
        if status == "reserved" and "members" in result:
            parts = [
                Reservation(
                    charge_id=part["charge_id"], key=key, account=part["account"], amount=Fraction(part["amount"]),
                    attempt=part["attempt"], delta=delta, token=token,
                    lease_expires_at=dt.datetime.fromisoformat(part["lease_expires_at"]),
                )
                for part in result["members"]
            ]
            return _combined(key, account, parts)
        named = account
        account = result.get("account", account)  # a member's refusal names the member
        if status == "reserved":
            return Reservation(
                charge_id=result["charge_id"], key=key, account=account,
                amount=Fraction(result["amount"]), attempt=result["attempt"],
                delta=delta, token=token, lease_expires_at=dt.datetime.fromisoformat(result["lease_expires_at"]),
            )
        if status == "replay":
            return json.loads(result["output"])
        if status == "dag_not_allowed":
            raise DagNotAllowedError.of(key.dag_id, account, result["allowed"])
        if status == "budget_exhausted":
            requested = delta if result["unit"] == "delta" else Fraction(result["requested"])
            raise BudgetExhaustedError(account, result["unit"], requested, Fraction(result["remaining"]))
        if status in ("approval_required", "approval_rejected"):
            raise approvals.from_status({**result, "account": account}, key)
        if status == "bounding_not_enforced":  # named by the account the release names, also for a member
            raise BoundingNotEnforcedError.of(named, list(result.get("declared") or ()))
        raise AssertionError(f"dp_reserve returned an unknown status {status!r}")  # pragma: no cover

    def _driver_call(self, name: str, params: Mapping[str, Any] | list[Mapping[str, Any]]) -> Any:
        """Send ``SELECT name(...)`` on a pooled connection in autocommit and return its one value. The statement
        goes to the driver directly (SQLAlchemy's "Working with Driver SQL and Raw DBAPI Connections", the way its
        docs call stored procedures): it is fixed text, compiled once (:data:`_DRIVER_CALLS`), so SQLAlchemy's
        per-statement work would be the most of this call's client CPU (ADR 29). A driver error is raised as
        SQLAlchemy's :class:`~sqlalchemy.exc.DBAPIError` (parameters hidden), and a lost connection is invalidated
        in the pool, as a :class:`~sqlalchemy.engine.Connection` does.

        The connection goes back to the pool as it came (``autocommit`` off), so the governor's transactions on the
        same pool stay transactions."""
        many = isinstance(params, list)
        if many:  # one call per member account, in one statement (one transaction), in the members' lock order
            sql = _many_calls(name, len(params))
            params = {f"{k}_{i}": v for i, call in enumerate(params) for k, v in call.items()}
        else:
            sql = _DRIVER_CALLS[name]
        pooled = self.engine.raw_connection()
        dbapi = pooled.driver_connection
        try:
            dbapi.autocommit = True  # client-side only: psycopg sends nothing
            try:
                with dbapi.cursor() as cursor:
                    cursor.execute(sql, params)
                    row = cursor.fetchone()
                    return list(row) if many else row[0]
            finally:
                if not dbapi.closed:
                    dbapi.autocommit = False
        except self._driver_error as error:
            lost = self.engine.dialect.is_disconnect(error, dbapi, None)
            if lost:
                pooled.invalidate(error)
            raise sa.exc.DBAPIError.instance(
                sql, params, error, self._driver_error, hide_parameters=True, connection_invalidated=lost,
                dialect=self.engine.dialect,
            ) from error
        finally:
            pooled.close()

    @functools.cached_property
    def _driver_error(self) -> type[Exception]:
        return self.engine.dialect.loaded_dbapi.Error

    @staticmethod
    def _audit_params(audit: Mapping[str, Any] | None) -> dict[str, str]:
        """An event's context as the functions take it: this process's defaults and the caller's ``audit``, apart
        (the charge's stored context goes between them, as :func:`~dp_operators.ledger.chain.audit_context` orders
        them); ``audit`` is checked here first, so a bad one fails with the same message as on SQLite."""
        audit_context(audit)
        return {"defaults": canonical_json(audit_context()), "audit": canonical_json(dict(audit or {}))}

    def _call_owned(self, name: str, reservation: Reservation, action: str, *, retries: int | None = None,
                    **params: Any) -> Any:
        """Call spend function ``name`` on ``reservation``'s charge (its owner's proof: account, key, attempt,
        token)."""
        def owner(part: Reservation) -> dict[str, Any]:
            return {
                "key": self._spend_key().secret, "charge_id": part.charge_id, "account": part.account,
                **part.key.as_dict(), "attempt": part.attempt, "token": part.token,
            }

        where = f"charge {reservation.charge_id} for {reservation.key}"
        if not reservation.members:
            return self._call(name, {**owner(reservation), **params}, retries=retries, where=where, action=action)
        # the members' calls in one statement: one transaction, all or none (a block's commit with the others')
        calls = [{**owner(part), **params} for part in reservation.members]
        return self._call(name, calls, retries=retries, where=where, action=action)

    def _call(self, name: str, params: Mapping[str, Any], *, retries: int | None = None, **about: Any) -> Any:
        """One call of spend function ``name``: one statement, one round trip, its own transaction (autocommit: the
        server commits as the function returns, so the account row's lock is never held while this process is
        scheduled out between the result and a ``COMMIT``). Retried like any write when it lost a lock race (it
        rolled back: :meth:`~dp_operators.ledger.store.LedgerBase._write`'s backoff); its refusals are raised as
        the ledger's exceptions (:func:`_refusal`)."""
        retries = self.max_retries if retries is None else retries
        delay = 0.01
        for attempt in range(retries + 1):
            try:
                return self._driver_call(name, params)
            except sa.exc.DBAPIError as error:
                refusal = _refusal(error, self.url, **about)
                if refusal is not None:
                    raise refusal from None
                # a lost connection (the pool replaces it) is retried too: each call is one autocommit statement, so
                # one whose reply was lost after the server committed it is refused on retry (a live lease, a charge
                # no longer reserved), never applied twice
                if attempt == retries or not (is_retryable(error) or error.connection_invalidated):
                    raise
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")  # pragma: no cover



def _refusal(
    error: sa.exc.DBAPIError, url: str, *, key: ReleaseKey | None = None, where: str = "", action: str = ""
) -> Exception | None:
    """The ledger's exception for a refusal raised by a spend function (SQLSTATE class ``DP``, parameters in the
    error's DETAIL as JSON; :mod:`~dp_operators.ledger.pg_functions`), with the message the Python path gives;
    ``None`` for any other database error."""
    original = error.orig
    code = getattr(original, "sqlstate", None) or ""
    diag = getattr(original, "diag", None)
    message = getattr(diag, "message_primary", None) or str(original)
    if code == "42883" and "dp_" in message:  # undefined_function: a schema-4 ledger initialised without them
        return LedgerNotInitialisedError(
            f"the ledger at {url} has no spend functions ({message}); a privacy officer runs 'dpctl ledger init' "
            "(then 'dpctl ledger roles --execute' again, which grants them to the spender)"
        )
    if code == "42501" and "function dp_" in message:  # insufficient_privilege on a spend function
        return LedgerAccessError(
            f"the ledger at {url} refused this login: {message}. Its role is not the spender role or a member of "
            "it, or the spend functions were re-created without their grants (after 'dpctl ledger init'): the "
            "tables' owner runs 'dpctl ledger roles --execute' (with --config for team roles). Nothing was reserved"
        )
    if not code.startswith("DPL"):
        return None
    try:
        detail = json.loads(getattr(diag, "message_detail", None) or "{}")
    except ValueError:  # pragma: no cover - the functions write JSON
        detail = {}
    kind = detail.get("kind")
    if code == pg_functions.ACCOUNT_NOT_FOUND:
        if "parent" in detail:
            return AccountNotFoundError(_member_missing(detail["parent"], detail["account"]))
        return AccountNotFoundError(not_found(detail["account"]))
    if code == pg_functions.KEY_REFUSED:
        if kind == "spend_key":
            return _key_refused(detail["account"], detail["accepts"], detail["given"])
        if kind == "reconcile":
            return _reconcile_key_refused(detail["account"], detail["accepts"], detail["given"])
        return LedgerKeyError(message)
    if code == pg_functions.CHARGE_STATE:
        if kind == "missing":
            return ChargeStateError(f"{where} does not exist; nothing {action}")
        if kind == "not_owner":
            return _not_owned(where, action)
        if kind in ("held", "siblings"):  # dp_renew's hold limit; a member settled unlike its reservation's others
            return ChargeStateError(message)
        return _not_reserved(where, detail["state"], action)
    if code == pg_functions.LEASE_HELD and key is not None:
        return _lease_held(key, detail["attempt"], dt.datetime.fromisoformat(detail["expires_at"]))
    if code == pg_functions.CHAIN_BROKEN:
        if kind == "head":
            return head_mismatch(detail["account"])
        if kind == "seq_taken":
            return seq_taken(detail["account"], detail["id"], detail["seq"])
        if kind == "number":
            what = (f"budget account {detail['account']!r}: {detail['column']}" if "account" in detail
                    else f"charge {detail['charge']}: {detail['column']}")
            try:
                stored_fraction(detail["value"], what)
            except AuditChainError as refused:
                return refused
        return AuditChainError(message)
    if code == pg_functions.BAD_VALUE:
        if kind == "no_delta":
            return ValueError(f"account {detail['account']!r} is {detail['accountant']}: a charge on it has no delta "
                              "part")
        return ValueError(message)
    if code == pg_functions.ROLE_NOT_ALLOWED:
        return RoleNotAllowedError.of(detail["account"], detail["role"], detail["allowed"])
    return None
