"""The authenticated audit chain: one chain of events per budget account, each row MAC'd with a key.

Each row of ``dp_audit_events`` holds ``prev_hash`` (the previous row's ``row_hash`` in its account's chain; the
first row holds :data:`GENESIS_HASH`) and ``row_hash`` = HMAC-SHA256(key, canonical JSON of every column but
``id`` and ``row_hash``), the key's id included (:func:`audit_row_mac`). Rows written by schema 2 and older have no
key (``key_id`` NULL) and a plain SHA-256 over the schema-2 columns (:func:`legacy_row_hash`); they are legal only
before a governor-signed ``chain_keyed`` event.

Which key signs what (docs/adr/0020): governance events need the governor key; spend events the account's spend
key (or the governor key). Events carry who/what/when, mechanisms, charges and output digests; never data values.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import operator
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dp_operators import __version__
from dp_operators.ledger import schema
from dp_operators.ledger.errors import AuditChainError, stored_fraction
from dp_operators.ledger.keys import AuditKey
from dp_operators.ledger.sqlite_driver import DriverConnection

#: ``prev_hash`` of the first event of every account's chain.
GENESIS_HASH = "0" * 64

#: Events only a governor key may sign.
GOVERNANCE_EVENTS = frozenset({"account_created", "account_updated", "account_migrated", "chain_keyed"})

#: Events a spend key may sign.
SPEND_EVENTS = frozenset({"reserved", "committed", "released", "abandoned", "refused"})

#: Keys an ``audit`` context may carry (anything else is refused, so no data value can slip into the log).
AUDIT_CONTEXT_KEYS = frozenset(
    {"run_type", "triggering_user", "host", "package_version", "user", "pid", "db_role", "command"}
)

# The statements of the release path, built once with named bind parameters: a statement object is reused, so
# SQLAlchemy computes its cache key once and finds its compiled form in the engine's compiled cache on every call
# (SQLAlchemy docs, "SQL Compilation Caching"); building them per call cost more CPU than the database's own work.
_e = schema.audit_events.c
_ACCOUNT_FOR_UPDATE = (
    sa.select(schema.accounts).where(schema.accounts.c.name == sa.bindparam("account")).with_for_update()
)
_EVENT_AT_SEQ = sa.select(schema.audit_events).where(
    _e.account == sa.bindparam("account"), _e.account_seq == sa.bindparam("seq")
)
_EVENT_ID_AT_SEQ = sa.select(_e.id).where(_e.account == sa.bindparam("account"), _e.account_seq == sa.bindparam("seq"))
_NEWEST_EVENT_SIGNED_BY = (
    sa.select(schema.audit_events)
    .where(_e.account == sa.bindparam("account"), _e.key_id == sa.bindparam("key_id"))
    .order_by(_e.account_seq.desc())
    .limit(1)
)
_INSERT_EVENT = schema.audit_events.insert()
#: SET columns come from the parameters (each distinct set of columns is compiled once); ``account`` names the row.
_UPDATE_ACCOUNT = schema.accounts.update().where(schema.accounts.c.name == sa.bindparam("account"))


def canonical_json(value: Any) -> str:
    """The canonical JSON text stored for outputs and MAC'd in events: sorted keys, no whitespace, NaN refused."""
    return _CANONICAL.encode(value)


#: One encoder for :func:`canonical_json` (``json.dumps`` with these options builds a new one per call).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


class CanonicalOutput(str):
    """A release output's :func:`canonical_json` text, made only by :meth:`encode`: :meth:`Ledger.commit` stores it
    as given (a large output is encoded once), and refuses any other text, so what a commit stores is canonical,
    plain, finite JSON by construction rather than by the caller's word."""

    __slots__ = ()

    @classmethod
    def encode(cls, output: Any) -> CanonicalOutput:
        """``canonical_json(output)``, marked as such. Raises ``ValueError`` for NaN or infinities and ``TypeError``
        for values JSON cannot hold."""
        return cls(canonical_json(output))


def _canonical_row(row: Mapping[str, Any], columns: tuple[str, ...]) -> bytes:
    return canonical_json({name: row[name] for name in columns}).encode("utf-8")


def audit_row_mac(row: Mapping[str, Any], key: AuditKey) -> str:
    """HMAC-SHA256 (hex) under ``key`` of an audit row's canonical form: the canonical JSON of every column but
    ``id`` and ``row_hash`` (:data:`~dp_operators.ledger.schema.AUDIT_HASHED_COLUMNS`, ``prev_hash`` and
    ``key_id`` included). Values are text, integers or null, so the form is the same on either database."""
    return key.mac(_canonical_row(row, schema.AUDIT_HASHED_COLUMNS))


def legacy_row_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a schema-2 audit row (no key): the form rows written before schema 3 carry."""
    return hashlib.sha256(_canonical_row(row, schema.LEGACY_HASHED_COLUMNS)).hexdigest()


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


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def timestamp_text(value: dt.datetime) -> str:
    """The text form of a timestamp in an audit row (UTC, microseconds), also used to compare a charge's
    ``created_at`` with its ``reserved`` event whichever database stored it."""
    if value.tzinfo is None:  # SQLite returns naive datetimes; the ledger only writes UTC
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc).isoformat(timespec="microseconds")


@dataclass
class AccountChain:
    """An account row locked for this transaction: running totals and the head of its audit chain.

    Appending signs each event with ``key``; :meth:`flush` writes the totals and the head back in the same
    transaction.
    """

    row: Any
    spent: Fraction
    delta_spent: Fraction
    seq: int
    head: str
    key: AuditKey
    dirty: bool = False

    @classmethod
    def lock(cls, conn: Connection, name: str, key: AuditKey) -> AccountChain | None:
        """Lock account ``name`` (``SELECT ... FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already holds the file)
        and read its totals; ``None`` if there is no such account.

        Raises:
            AuditChainError: the account's totals are not numbers (edited outside the ledger).
        """
        row = conn.execute(_ACCOUNT_FOR_UPDATE, {"account": name}).first()
        if row is None:
            return None
        spent = stored_fraction(row.spent, f"budget account {name!r}: spent")
        delta_spent = stored_fraction(row.delta_spent, f"budget account {name!r}: delta_spent")
        _check_head(conn, row, key)
        return cls(row, spent, delta_spent, row.audit_seq, row.audit_head or GENESIS_HASH, key)

    def signed_row(self, event: str, context: Mapping[str, Any] | str, **fields: Any) -> dict[str, Any]:
        """The next row of this chain for ``event``, signed, with the chain's head and sequence advanced to it
        (not inserted: :meth:`append` inserts one; a bulk writer may insert many at once). ``context`` is a mapping
        or its canonical JSON text; ``fields`` are the event's other columns (amounts as Fractions or text)."""
        values: dict[str, Any] = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
        values.update(fields)
        if isinstance(values.get("mechanisms"), (list, dict)):
            values["mechanisms"] = canonical_json(values["mechanisms"])
        if isinstance(values.get("details"), dict):
            values["details"] = canonical_json(values["details"])
        for name in ("amount", "delta_amount"):
            if values[name] is not None:
                values[name] = str(values[name])
        if isinstance(values.get("created_at"), dt.datetime):
            values["created_at"] = timestamp_text(values["created_at"])
        values.update(
            account=self.row.name,
            account_seq=self.seq + 1,
            event=event,
            spent_after=str(self.spent),
            delta_spent_after=str(self.delta_spent),
            context=context if isinstance(context, str) else canonical_json(dict(context)),
            created_at=values["created_at"] or timestamp_text(now()),
            key_id=self.key.key_id,
            prev_hash=self.head,
        )
        values["row_hash"] = audit_row_mac(values, self.key)
        _remember_signed(values, self.key)
        self.seq += 1
        self.head = values["row_hash"]
        self.dirty = True
        return values

    def append(self, conn: Connection, event: str, context: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
        """Append ``event`` to this account's chain (same transaction as the change it records); returns the row.

        Raises:
            AuditChainError: a row already holds the next sequence number (inserted outside the ledger).
        """
        seq = {"account": self.row.name, "seq": self.seq + 1}
        if not isinstance(conn, DriverConnection):
            taken = conn.execute(_EVENT_ID_AT_SEQ, seq).first()
            if taken is not None:
                raise seq_taken(self.row.name, taken.id, self.seq + 1)
        values = self.signed_row(event, context, **fields)
        try:
            conn.execute(_INSERT_EVENT, values)
        except sa.exc.IntegrityError:
            # SQLite's spend path lets the unique (account, account_seq) constraint find a taken number: a failed
            # statement there leaves the transaction usable, so the row can be named (PostgreSQL checks first)
            taken = conn.execute(_EVENT_ID_AT_SEQ, seq).first() if isinstance(conn, DriverConnection) else None
            if taken is None:
                raise
            raise seq_taken(seq["account"], taken.id, seq["seq"]) from None
        return values

    def flush(self, conn: Connection, **extra: Any) -> None:
        """Write the running totals and chain head back to the account row."""
        if self.dirty or extra:
            conn.execute(
                _UPDATE_ACCOUNT,
                {
                    "spent": str(self.spent),
                    "delta_spent": str(self.delta_spent),
                    "audit_seq": self.seq,
                    "audit_head": self.head,
                    "updated_at": now(),
                    **extra,
                    "account": self.row.name,
                },
            )


def _check_head(conn: Connection, row: Any, key: AuditKey) -> None:
    """Refuse to work on an account whose row disagrees with the head of its chain: the head event must exist, be
    the row's ``audit_head`` and state the row's running totals; for the account's own spend key, so must the newest
    event that key signed, whose MAC is checked. Indexed reads, so a budget check stays constant-time (the newest
    own event is the head or a few governance events before it); ``dpctl ledger verify`` checks everything else.
    Someone holding the spend key can still forge a consistent head; verify's replay catches that.

    Raises:
        AuditChainError: the running totals or the head were edited outside the ledger (e.g. ``spent`` lowered).
    """
    if not row.audit_seq:
        return
    head = conn.execute(_EVENT_AT_SEQ, {"account": row.name, "seq": row.audit_seq}).first()
    intact = (
        head is not None
        and head.row_hash == row.audit_head
        and head.spent_after == row.spent
        and head.delta_spent_after == row.delta_spent
    )
    if intact and row.spend_key_id == key.key_id:
        # Only spend-key events change the totals (governance and reconcile events restate them), so the newest
        # event this key signed, checked with the key, must state them too: a head forged under another key id
        # cannot lower them.
        own = head if head.key_id == key.key_id else conn.execute(
            _NEWEST_EVENT_SIGNED_BY, {"account": row.name, "key_id": key.key_id}
        ).first()
        intact = own is None or (
            _signed_by(own._mapping, key)
            and own.spent_after == row.spent
            and own.delta_spent_after == row.delta_spent
        )
    if not intact:
        raise head_mismatch(row.name)


#: Audit rows (their signed columns and ``row_hash``, under a key id) this process signed or checked with that key:
#: the head check of the next transaction on an account then finds its head here instead of computing its MAC
#: again. Only an exact match counts, so a row changed in any column is checked afresh. Bounded: cleared when full.
_SIGNED: dict[tuple, None] = {}
_SIGNED_LIMIT = 1024
_SIGNED_COLUMNS = (*schema.AUDIT_HASHED_COLUMNS, "row_hash")


_signed_values = operator.itemgetter(*_SIGNED_COLUMNS)


def _signed_key(row: Mapping[str, Any], key: AuditKey) -> tuple:
    return (key.key_id, _signed_values(row))


def _remember_signed(row: Mapping[str, Any], key: AuditKey) -> None:
    if len(_SIGNED) >= _SIGNED_LIMIT:
        _SIGNED.clear()
    _SIGNED[_signed_key(row, key)] = None


def _signed_by(row: Mapping[str, Any], key: AuditKey) -> bool:
    """Whether ``row_hash`` of the audit row ``row`` is its MAC under ``key`` (a row this process signed or checked
    before is not hashed again)."""
    remembered = _signed_key(row, key)
    if remembered in _SIGNED:
        return True
    if audit_row_mac(row, key) != row["row_hash"]:
        return False
    _remember_signed(row, key)
    return True


def head_mismatch(account: str) -> AuditChainError:
    """The refusal of an account whose row disagrees with the head of its audit chain (both paths: the Python
    chain's and the PostgreSQL functions')."""
    return AuditChainError(
        f"budget account {account!r}: its running totals or chain head disagree with the last event of its "
        "audit chain (edited outside the ledger); nothing was changed. A privacy officer runs 'dpctl ledger "
        "verify' and restores the account row from the chain (docs/ledger.md, 'Repairing an account')"
    )


def seq_taken(account: str, event_id: int, seq: int) -> AuditChainError:
    """The refusal of an append whose sequence number a row the ledger did not write already holds."""
    return AuditChainError(
        f"budget account {account!r}: audit row id={event_id} already holds sequence number {seq}, which the "
        f"ledger did not write (the account row says the chain ends at {seq - 1}); nothing was changed. A privacy "
        "officer runs 'dpctl ledger verify'"
    )


def charge_event_fields(charge: Any) -> dict[str, Any]:
    """The columns an event about ``charge`` copies from it."""
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
