"""``dpctl ledger verify``: replay the ledger's legal state machine from its audit chains, in streaming passes.

What it proves (docs/adr/0020). With the keys (``keyring``), every audit row was written by a holder of a key of
the right role: governance events by a governor key, spend events by the account's authorised spend key (or a
governor key). Without keys only the structure is checked and :attr:`VerifyReport.authenticated` is ``False``.
In both cases every account's spend is rebuilt from its events under the legal transitions and compared with
every charge row and every account row, and the guard triggers are compared with their expected definitions.

The passes run in one read transaction (one snapshot: PostgreSQL ``REPEATABLE READ``, SQLite a deferred read
transaction in WAL mode), each streamed from the database in batches of :data:`ROW_BATCH` rows, so memory stays
flat in the number of charges:

1. events by ``(account, account_seq)``: each account's chain (sequence, links, MAC or legacy hash, signer's
   role, event positions, running totals, caps and allowlists at each reservation); O(accounts) memory;
2. charges by ``id`` merge-joined with the events naming a charge, by ``(charge_id, account_seq)``: each charge's
   life cycle (``reserved`` then exactly one of ``committed``, ``released``, ``abandoned``), its fixed columns
   against its ``reserved`` event, its output against the committed digest, and the reservation token's proof
   on ``committed`` and ``released``; O(1) memory;
3. account rows by name against the chains' ends and the last governance event (and optionally a
   ``ledgers.yaml``); then the triggers.

Before pass 1 the names of the accounts are read (O(accounts) memory). Audit events of an account that has no
``dp_budget_accounts`` row are not replayed: they are counted, and one problem names the first
:data:`FIRST_IDS_SHOWN` ids (the smallest) and a few of the accounts they name, so junk rows naming made-up
accounts cost no memory. So is an event naming one charge beyond the first :data:`MAX_EVENTS_PER_CHARGE`: each is
a problem of its own, none is kept.

A problem never raises: every value of every row read is checked against the bounds of
:mod:`dp_operators.ledger.bounded` (numbers in ``str(Fraction)`` form of at most 60 digits a side, JSON text of
bounded length and depth, text that fits its column, 64-bit integers, times), and an unreadable one becomes a
problem naming its table, row and column; the replay goes on without it. Problem texts show at most a few hundred
characters of any stored value (quoted, or with control and format characters escaped: a problem names rows by
what workers wrote, and is printed on an officer's terminal), and at most :data:`MAX_PROBLEMS` are kept.

Outputs. A committed output (up to 256 MiB of JSON) needs only two checks: that it is JSON the ledger's readers
accept and that it hashes to the digest its ``committed`` event signed. Its value is never built:
:func:`~dp_operators.ledger.bounded.check_json` parses a short one and drops it, and reads one with many values
(6 MB of ``[{},{},...]`` is two million objects, hundreds of MB as Python values) as a stream of parser events; the
digest is computed a slice at a time; and an output longer than :data:`OUTPUT_BATCH_CHARS` is not fetched with its
batch of charges but from a second stream, one row at a time, merged by charge id. So verify's memory is a constant
plus the one long output it holds, whatever the outputs hold, and the usual small outputs cost what they did (one
``json`` parse each).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dp_operators.accounting import round_down, round_up
from dp_operators.accounting.budget import MAX_DENOMINATOR
from dp_operators.ledger import schema
from dp_operators.ledger.chain import (
    GENESIS_HASH,
    GOVERNANCE_EVENTS,
    SPEND_EVENTS,
    audit_row_mac,
    canonical_json,
    legacy_row_hash,
    timestamp_text,
)
from dp_operators.ledger.approvals import APPROVAL_EVENTS
from dp_operators.ledger.bounded import BoundsError, read_json, read_number, shown, visible
from dp_operators.ledger.config import LedgerConfig
from dp_operators.ledger.errors import UnreadableValueError
from dp_operators.ledger.keys import Keyring
from dp_operators.ledger import structure
from dp_operators.ledger.structure import MEMBER_SEPARATOR, QUOTA_PREFIX, requires_enforced_bounding, structure_of
from dp_operators.ledger.store import (
    JSON_COLUMNS,
    NUMBER_COLUMNS,
    LedgerBase,
    ReadRow,
    lenient_sqlite_text,
    read_row,
    sqlite_timestamp,
    SERIES_RUN_PREFIX,
    series_step_of,
    timestamp_column,
    zero_amount_allowed,
)

#: At most this many problems are listed (the first broken audit rows are kept); the rest are counted.
MAX_PROBLEMS = 10_000
#: Longest problem text kept (each shows at most a few hundred characters of a stored value; this is a backstop).
MAX_PROBLEM_CHARS = 4000
#: Events naming one charge kept for its life-cycle check; the ledger writes two (``reserved`` and one terminal).
MAX_EVENTS_PER_CHARGE = 16
#: Ids (the smallest) and account names listed in the problem about events of accounts that do not exist.
FIRST_IDS_SHOWN = 5
#: Outputs longer than this (in characters) are not read with their charges' batch of :data:`ROW_BATCH` rows but
#: from a stream of their own, one row at a time, so a batch holds at most ``ROW_BATCH`` times this much output
#: (1.6 MiB) and verify at most one long output at a time.
OUTPUT_BATCH_CHARS = 2**14
#: A long output is hashed this many characters at a time (no whole encoded copy).
_HASH_SLICE = 2**20

_TERMINAL = ("committed", "released", "abandoned")
_CHARGE_EVENTS = frozenset({"reserved", *_TERMINAL})
_KNOWN_EVENTS = GOVERNANCE_EVENTS | SPEND_EVENTS | APPROVAL_EVENTS

#: Columns every event about a charge copies from it (:func:`~dp_operators.ledger.chain.charge_event_fields`).
_EVENT_CHARGE_COLUMNS = (
    "dag_id", "run_id", "task_id", "map_index", "release_name", "attempt", "try_number", "spec_hash", "amount",
    "delta_amount", "mechanisms",
)


@dataclass
class VerifyReport:
    """The result of :func:`verify_ledger`.

    Attributes:
        events, accounts, charges: rows read from each table.
        problems: one line per inconsistency, each naming its row; problems about audit rows come first, by row
            id (the first line is the first broken audit row), then chains left unkeyed, charges by id, accounts
            by name (and the given configuration), triggers. At most :data:`MAX_PROBLEMS` are listed (the first
            broken rows); a last line then counts the rest.
        heads: each account's chain head (``row_hash`` of its last event) as replayed; worth recording outside
            the database.
        authenticated: whether MACs were checked (``False`` when no keyring was given).
        hints: what the problems suggest beyond their rows; today one case: no governance event is signed by a
            governor key given, the mark of a wrong key file (or of a governance history signed by someone else,
            which is why the report stays inconsistent).
    """

    events: int = 0
    accounts: int = 0
    charges: int = 0
    problems: list[str] = field(default_factory=list)
    heads: dict[str, str] = field(default_factory=dict)
    authenticated: bool = False
    hints: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class _BadValue(Exception):
    """A stored value that is not what its column holds (caught and reported as a problem)."""


class _Problems:
    """Problems collected by the passes: audit-row problems sorted by row id, then the others in order found."""

    def __init__(self, limit: int = MAX_PROBLEMS) -> None:
        self.limit = limit
        self.rows: list[tuple[int, int, str]] = []
        self.other: list[str] = []
        self.dropped = 0
        self._order = itertools.count()

    def row(self, event_id: Any, text: str) -> None:
        text = _cut(text)
        key = event_id if isinstance(event_id, int) and not isinstance(event_id, bool) else -1
        self.rows.append((key, next(self._order), text))
        if len(self.rows) > 2 * self.limit:  # keep the earliest rows, count the rest
            self.rows.sort()
            self.dropped += len(self.rows) - self.limit
            del self.rows[self.limit :]

    def add(self, text: str) -> None:
        if len(self.other) >= self.limit:
            self.dropped += 1
        else:
            self.other.append(_cut(text))

    def ordered(self) -> list[str]:
        found = [text for _, _, text in sorted(self.rows)] + self.other
        dropped = self.dropped + max(len(found) - self.limit, 0)
        found = found[: self.limit]
        if dropped:
            found.append(f"... and {dropped} more problems not listed")
        return found


@dataclass
class _Chain:
    """One account's chain as replayed so far."""

    seq: int = 0
    head: str = GENESIS_HASH
    spent: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    stored: dict[str, Any] | None = None
    events: int = 0
    legacy: int = 0
    keyed: bool = False
    chain_keyed: bool = False
    migrated_last_charge: int = 0
    #: the account's charges not in state 'released', summed from the charge rows (pass 2): an independent total
    #: in whole units of 1/MAX_DENOMINATOR, each charge rounded down: a lower bound of the exact sum that stays a
    #: small integer whatever denominators a tampered row holds
    charged: int = 0
    charged_delta: int = 0
    #: governor key ids (of the given ones) that signed this chain's governance events, and those a rotation
    #: retired (an ``account_updated`` with ``details.governor_key_id``, signed by the new key, retires every other)
    governor_seen: set = field(default_factory=set)
    governor_retired: set = field(default_factory=set)
    #: series steps (ADR 33): the steps reserved, the series charges' (series, step, charged), the committed steps
    #: of each series (step -> whether it was charged)
    series_reserved: set = field(default_factory=set)
    series_charges: dict = field(default_factory=dict)
    series_committed: dict = field(default_factory=dict)
    #: whether the account's configuration in force (its last governance event's ``details.config``) requires
    #: enforced contribution bounding
    require_enforced: bool = False
    #: the configuration record (``details.config``) of the last governance event that recorded one, which the
    #: account row's ``config`` column must hold (checked once one does: a migrated chain's first events record none)
    config: Any = None
    config_recorded: bool = False


#: Events about one charge: each must name it.
_CHARGE_EVENTS = frozenset({"reserved", "committed", "released", "abandoned"})


def _units_below(value: Fraction) -> int:
    """``value`` in whole units of ``1/MAX_DENOMINATOR``, rounded down (a lower bound, exact for the ledger's own
    amounts, which :func:`~dp_operators.accounting.round_up` keeps on that grid)."""
    return value.numerator * MAX_DENOMINATOR // value.denominator


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM_CHARS else text[:MAX_PROBLEM_CHARS] + "… (cut)"


def _plain(value: Any) -> str:
    """A stored value inside a row's label: short text as it is (control and format characters escaped:
    :func:`~dp_operators.ledger.bounded.visible`), anything else as :func:`shown` gives it."""
    return visible(value) if isinstance(value, str) and len(value) <= 80 else shown(value, 80)


def _where(row: Mapping[str, Any]) -> str:
    return (
        f"dp_audit_events id={row['id']} (account {shown(row['account'], 80)}, seq {_plain(row['account_seq'])}, "
        f"{_plain(row['event'])})"
    )


def _charge_label(charge: Mapping[str, Any]) -> str:
    key = "/".join(_plain(charge[name]) if isinstance(charge[name], str) else shown(charge[name], 80)
                   for name in ("dag_id", "run_id", "task_id", "map_index", "release_name"))
    return (
        f"dp_charges id={charge['id']} (account {shown(charge['account'], 80)}, {key}, attempt "
        f"{_plain(charge['attempt'])})"
    )


class _Lazy:
    """A row's label, made the first time a message formats it (most rows are named by no message)."""

    __slots__ = ("_make", "_row", "_text")

    def __init__(self, make: Any, row: Mapping[str, Any]) -> None:
        self._make, self._row, self._text = make, row, None

    def __format__(self, spec: str) -> str:
        if self._text is None:
            self._text = self._make(self._row)
        return format(self._text, spec)

    __str__ = lambda self: format(self, "")  # noqa: E731


def _number(value: Any, what: str) -> Fraction:
    """An exact number stored as text, only in the form the ledger writes (``str(Fraction)``, at most 60 digits a
    side: :func:`~dp_operators.ledger.bounded.read_number`, which caches short texts); raises :class:`_BadValue`
    naming ``what``."""
    try:
        return read_number(value)
    except BoundsError as error:
        raise _BadValue(f"{what} {shown(value)} is not a number: it {error}") from None


def _json(value: Any, what: str) -> Any:
    """JSON text within :func:`~dp_operators.ledger.bounded.read_json`'s bounds (``None`` stays ``None``); raises
    :class:`_BadValue` naming ``what``."""
    if value is None:
        return None
    try:
        return read_json(value)
    except BoundsError as error:
        raise _BadValue(f"{what} is not JSON text the ledger writes: it {error}") from None


def _unreadable(problem: UnreadableValueError, value: Any) -> str:
    """An unreadable column of a row, as verify words it (the row is named by the caller)."""
    if problem.column in NUMBER_COLUMNS and problem.reason.startswith("is outside"):
        return f"{problem.column} {shown(value)} {problem.reason}"
    if problem.column in NUMBER_COLUMNS:
        return f"{problem.column} {shown(value)} is not a number: it {problem.reason}"
    if problem.column in JSON_COLUMNS or problem.column == "output":
        return f"{problem.column} is not JSON text the ledger writes: it {problem.reason}"
    return f"{problem.column} {problem.reason}"


def _sha256(text: Any) -> str | None:
    """The SHA-256 of ``text`` as UTF-8; a long text is encoded a slice at a time (UTF-8 encodes each character on
    its own, so the digest is the same)."""
    if not isinstance(text, str):
        return None
    if len(text) <= _HASH_SLICE:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    digest = hashlib.sha256()
    for start in range(0, len(text), _HASH_SLICE):
        digest.update(text[start : start + _HASH_SLICE].encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _show(value: Fraction) -> str:
    """A number for a problem message: exact (``str(Fraction)``) unless it would run to hundreds of digits, then
    its magnitude (never a float conversion that could overflow)."""
    if value.numerator.bit_length() + value.denominator.bit_length() < 1000:
        return str(value)
    digits = len(str(abs(value.numerator) // value.denominator)) if value.numerator.bit_length() < 10_000 else None
    return f"a number of {digits:,} digits" if digits else "a number of thousands of digits"


def _differ(names: list[str]) -> str:
    return f"{', '.join(names)} {'differs' if len(names) == 1 else 'differ'}"


#: Rows verify fetches per round trip: an event or charge row may hold 64 KiB of mechanisms a worker wrote (and
#: 16 KiB of context), so a thousand of them from two streams at once took hundreds of MB; a hundred keep a batch
#: to a few MB, for about one round trip more per hundred rows.
ROW_BATCH = 100


def _stream(conn: Connection, query: Any, batch: int = ROW_BATCH) -> Iterator[Mapping[str, Any]]:
    result = conn.execution_options(stream_results=True, yield_per=batch).execute(query)
    for row in result:
        yield row._mapping


def _with_long_outputs(
    charges: Iterable[Mapping[str, Any]], long_outputs: Iterable[Mapping[str, Any]]
) -> Iterator[Mapping[str, Any]]:
    """The charges (by id, each output longer than :data:`OUTPUT_BATCH_CHARS` read as ``''``) with those outputs
    put back from ``long_outputs`` (``id``, ``output`` of those charges by id, fetched one row at a time): a batch of
    charge rows never holds a long output, and verify holds one at a time."""
    found = iter(long_outputs)
    pending = next(found, None)
    for charge in charges:
        if charge["output"] == "" and pending is not None and pending["id"] == charge["id"]:
            charge = {**charge, "output": pending["output"]}
            pending = next(found, None)
        yield charge


class _Strays:
    """Audit events of accounts that have no ``dp_budget_accounts`` row, counted in O(1) memory: how many, how many
    accounts (the events arrive ordered by account), the smallest :data:`FIRST_IDS_SHOWN` ids and the first
    account names seen."""

    def __init__(self) -> None:
        self.events = 0
        self.accounts = 0
        self._last: Any = None
        self._ids: list[int] = []  # a max-heap (negated) of the smallest ids
        self.names: list[str] = []

    def add(self, row: Mapping[str, Any]) -> None:
        self.events += 1
        if self.events == 1 or row["account"] != self._last:
            self.accounts += 1
            self._last = row["account"]
            if len(self.names) < FIRST_IDS_SHOWN:
                self.names.append(shown(row["account"], 80))
        event_id = row["id"]
        if isinstance(event_id, int):
            if len(self._ids) < FIRST_IDS_SHOWN:
                heapq.heappush(self._ids, -event_id)
            elif -self._ids[0] > event_id:
                heapq.heapreplace(self._ids, -event_id)

    def problem(self) -> tuple[int, str] | None:
        if not self.events:
            return None
        ids = sorted(-negated for negated in self._ids)
        more = f" and {self.accounts - len(self.names):,} more" if self.accounts > len(self.names) else ""
        return ids[0] if ids else -1, (
            f"dp_audit_events id={', '.join(map(str, ids))}{' ...' if self.events > len(ids) else ''}: "
            f"{self.events:,} audit event{'s' if self.events != 1 else ''} name{'' if self.events != 1 else 's'} "
            f"{self.accounts:,} account{'s' if self.accounts != 1 else ''} that {'have' if self.accounts != 1 else 'has'} "
            f"no dp_budget_accounts row ({', '.join(self.names)}{more}): the account row was deleted, or the events "
            "were written outside the ledger; they were not replayed"
        )


class _Verifier:
    def __init__(
        self, keyring: Keyring | None, config: LedgerConfig | None, governor_key_ids: set[str] | None
    ) -> None:
        self.keyring = keyring
        self.config = config
        self.governor_ids = None if governor_key_ids is None else set(governor_key_ids)
        self.problems = _Problems()
        self.report = VerifyReport(authenticated=keyring is not None)
        self.chains: dict[Any, _Chain] = {}
        #: the names of the accounts (rows of dp_budget_accounts): events of any other are counted, not replayed
        self.accounts: set[Any] = set()
        self.strays = _Strays()
        #: governance events read, how many a governor key given signed, and a few of the key ids that signed them
        self.governance_events = 0
        self.governance_by_given = 0
        self.governance_signers: set[str] = set()

    # -- pass 1: chains ------------------------------------------------------------------------------------------
    def replay_chains(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.report.events += 1
            if row["account"] not in self.accounts:
                self.strays.add(row)
                continue
            chain = self.chains.setdefault(row["account"], _Chain())
            self._replay(chain, row)
            chain.events += 1
        stray = self.strays.problem()
        if stray is not None:
            self.problems.row(*stray)
        for name, chain in self.chains.items():
            if chain.legacy and not chain.chain_keyed:
                self.problems.add(
                    f"account {shown(name)}: its audit chain ends in {chain.legacy} unkeyed (schema 2) rows without a "
                    "'chain_keyed' event; a privacy officer runs 'dpctl ledger init' with the governor key"
                )

    def _replay(self, chain: _Chain, row: Mapping[str, Any]) -> None:
        flag = lambda text: self.problems.row(row["id"], f"{_where(row)}: {text}")  # noqa: E731
        read = read_row(schema.audit_events, row)
        for problem in read.problems:
            flag(_unreadable(problem, row[problem.column]))
        unreadable = {problem.column for problem in read.problems}
        event, seq, key_id = row["event"], row["account_seq"], row["key_id"]
        first = chain.events == 0

        # links
        if seq != chain.seq + 1:
            flag(
                f"expected seq {chain.seq + 1}; the rows in between were deleted"
                if isinstance(seq, int) and seq > chain.seq + 1
                else f"expected seq {chain.seq + 1} (sequence numbers out of order)"
            )
        elif row["prev_hash"] != chain.head:
            flag("prev_hash does not match the previous row's row_hash (a row before it was changed or removed)")
        chain.seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else chain.seq + 1
        chain.head = row["row_hash"]

        # authenticity and the signer's role
        if event not in _KNOWN_EVENTS:
            flag(f"unknown event {shown(event)} (not written by the ledger)")
        if key_id is None:
            if chain.keyed:
                flag(
                    "has no key (key_id NULL) after the chain was keyed: unkeyed rows are legal only before the "
                    "chain's 'chain_keyed' event (written without the key)"
                )
            else:
                try:
                    intact = legacy_row_hash(row) == row["row_hash"]
                except (TypeError, ValueError):
                    intact = False
                if not intact:
                    flag("content does not match its row_hash (an unkeyed row was edited)")
            if row["token_hash"] is not None or row["proof"] is not None:
                flag("an unkeyed (schema 2) row cannot carry token_hash or proof")
            if event == "chain_keyed":
                flag("'chain_keyed' must be signed with the governor key")
            chain.legacy += 1
        else:
            if chain.legacy and not chain.keyed and event != "chain_keyed":
                flag("follows unkeyed (schema 2) rows without a governor-signed 'chain_keyed' event")
            self._check_signature(chain, row, flag)

        # positions
        if first and event not in ("account_created", "account_migrated"):
            flag("an account's chain must start with 'account_created' or 'account_migrated'")
        if not first and event in ("account_created", "account_migrated"):
            flag(f"{shown(event)} is legal only at the start of a chain (seq 1)")
        keyed_here = event == "chain_keyed" and key_id is not None and not first
        if event == "chain_keyed":
            if chain.chain_keyed:
                flag("a chain is keyed once: a second 'chain_keyed'")
                keyed_here = False
            elif chain.keyed:
                flag("'chain_keyed' is legal only right after the unkeyed (schema 2) rows of a chain")
                keyed_here = False
        if row["charge_id"] is None and event in _CHARGE_EVENTS:
            flag(f"a {shown(event)} event must name its charge (charge_id is NULL: forged)")
        if key_id is not None:
            chain.keyed = True

        # parsed values (an unreadable one was named above)
        details = read.values["details"] if event in GOVERNANCE_EVENTS else None
        amount = read.values["amount"] or Fraction(0)
        delta_amount = read.values["delta_amount"] or Fraction(0)

        # governance: the configuration in force from here on
        if event in GOVERNANCE_EVENTS:
            stored = details.get("stored") if isinstance(details, dict) else None
            if isinstance(stored, dict):
                chain.stored = stored
                self._check_cap_covers_spend(chain, stored, flag)
            else:
                flag("a governance event must record the stored configuration (details.stored)")
            rotated = details.get("governor_key_id") if isinstance(details, dict) else None
            if isinstance(rotated, str) and rotated == key_id:
                chain.governor_retired |= chain.governor_seen - {key_id}
            if self.governor_ids is not None and key_id in self.governor_ids:  # bounded by the keys given
                chain.governor_seen.add(key_id)
            if event == "account_migrated" and first and isinstance(details, dict):
                last = details.get("last_charge_id", 0)
                if isinstance(last, int) and not isinstance(last, bool):
                    chain.migrated_last_charge = last
                else:
                    flag(f"details.last_charge_id {shown(last)} is not an integer")

        self._check_approvals(chain, row, read.values, flag)
        self._check_bounding(chain, row, read.values, flag)

        # running totals: what the events before imply, against what the row states
        spent, delta = chain.spent, chain.delta
        if event == "reserved":
            self._check_reservation(chain, row, amount, delta_amount, flag)
            spent, delta = round_up(spent + amount), round_up(delta + delta_amount)
        elif event == "committed" and row["charge_id"] in chain.series_charges:
            series, index, charged = chain.series_charges.pop(row["charge_id"])
            chain.series_committed.setdefault(series, {})[index] = charged
        elif event == "released":
            if row["amount"] is None and "amount" not in unreadable:
                flag("a 'released' event must state the amount returned")
            spent, delta = spent - amount, delta - delta_amount
            # since this version a release rounds the totals up to the ledger's resolution (never below the exact
            # difference, which ledgers written before state): either is sound
            if (read.values["spent_after"], read.values["delta_spent_after"]) == (round_up(spent), round_up(delta)):
                spent, delta = round_up(spent), round_up(delta)
            if spent < 0 or delta < 0:
                flag(
                    f"spend goes negative: {_show(spent)} (delta {_show(delta)}) after returning {_show(amount)} "
                    f"(delta {_show(delta_amount)})"
                )
        if unreadable & {"spent_after", "delta_spent_after"}:
            # go on from what the events before imply; rounded as the ledger rounds totals, so forged amounts
            # cannot grow its denominator event after event
            chain.spent, chain.delta = round_up(spent), round_up(delta)
            return
        spent_after, delta_after = read.values["spent_after"], read.values["delta_spent_after"]
        if event == "account_migrated" and first:
            pass  # a migration from schema 1 states the totals of the charges made before it
        elif keyed_here:
            if (spent_after, delta_after) != (spent, delta):
                flag(
                    f"states spent {_show(spent_after)} (delta {_show(delta_after)}) but its unkeyed rows add up "
                    f"to {_show(spent)} (delta {_show(delta)})"
                )
            chain.chain_keyed = True
        elif (spent_after, delta_after) != (spent, delta):
            flag(
                f"spent_after {_show(spent_after)} (delta {_show(delta_after)}) disagrees with the events before "
                f"it, which add up to {_show(spent)} (delta {_show(delta)})"
            )
        chain.spent, chain.delta = spent_after, delta_after

    def _check_approvals(self, chain: _Chain, row: Mapping[str, Any], values: Mapping[str, Any], flag: Any) -> None:
        """Approval before a large charge (:mod:`dp_operators.ledger.approvals`): a decision must be signed with a
        governor key (with the governor key ids known; else at least not with the account's spend key), a request
        with the account's spend key; a ``reserved`` charge its account's policy (as the governance events before
        it set it) holds back needs an earlier grant of its release key and spec hash covering its amount."""
        from dp_operators.ledger import approvals

        states = self.__dict__.setdefault("_approvals", {})
        mine = states.setdefault(row["account"], {"policy": None, "grants": [], "last": {}})
        event, key_id = row["event"], row["key_id"]
        details = values.get("details")
        spend_key_id = (chain.stored or {}).get("spend_key_id")
        if event in ("account_created", "account_updated") and isinstance(details, dict):
            mine["policy"] = approvals.policy_of(details.get("config"))
            mine["where"] = approvals.approval_account(row["account"], details.get("config"))
        release = (row["dag_id"], row["run_id"], row["task_id"], row["map_index"], row["release_name"])
        if event in approvals.APPROVAL_DECISIONS:
            if self.governor_ids is not None:
                legit = key_id in self.governor_ids
            else:
                legit = key_id is not None and key_id != spend_key_id
            if not legit:
                flag(f"an {shown(event)} event signed with key id {shown(key_id)}, which is not a governor key: only "
                     "a privacy officer decides approvals (forged by a worker?)")
            elif event == approvals.APPROVAL_GRANTED and values.get("amount") is not None:
                mine["grants"].append((release, row["spec_hash"], values["amount"]))
        elif event == approvals.APPROVAL_REQUESTED and self.governor_ids is not None:
            if key_id != spend_key_id and key_id not in self.governor_ids:
                flag(f"an approval request signed with key id {shown(key_id)}, but the account accepts spend key id "
                     f"{shown(spend_key_id)} at this point")
        family = (row["dag_id"], row["task_id"], row["map_index"], row["release_name"])
        if event == "committed":
            last = mine["last"].get(family)
            charge_id = row["charge_id"] if isinstance(row["charge_id"], int) else -1
            if last is None or charge_id > last[0]:
                mine["last"][family] = (charge_id, approvals.mechanism_kinds(row["mechanisms"]))
        if event != "reserved" or not mine["policy"] or values.get("amount") is None:
            return
        try:
            cap = _number((chain.stored or {}).get("cap"), "the cap")
            reasons = approvals.approval_reasons(
                mine["policy"], values["amount"], max(round_down(cap - chain.spent), Fraction(0)),
                approvals.mechanism_kinds(row["mechanisms"]),
                # a block's mechanism change is against the last release on any block of its account, which the
                # database decides; chains are replayed one by one here, so verify does not order them across blocks
                None if family not in mine["last"] or mine.get("where", row["account"]) != row["account"]
                else mine["last"][family][1],
            )
        except (_BadValue, UnreadableValueError, TypeError, ValueError, ZeroDivisionError):
            return  # an unreadable cap or policy is reported where it is read
        # a block's charge is approved on its account (the parent's chain, replayed before its members': name order)
        parent = mine.get("where", row["account"])
        grants = mine["grants"] if parent == row["account"] else states.get(parent, {}).get("grants", [])
        granted = any(release == g[0] and row["spec_hash"] == g[1] and g[2] >= values["amount"] for g in grants)
        if reasons and not granted:
            flag(f"reserves {_show(values['amount'])} without the privacy officer's approval its account's policy "
                 f"requires ({', '.join(reasons)}): no 'approval_granted' of its release key and spec hash, signed "
                 "with a governor key, covers it")

    @staticmethod
    def _check_bounding(chain: _Chain, row: Mapping[str, Any], values: Mapping[str, Any], flag: Any) -> None:
        """Required contribution bounding (``require_enforced_bounding``; docs/ledger.md, "Requiring enforced
        contribution bounding"): a ``reserved`` charge on an account whose configuration, as the governance events
        before it on its chain set it, required enforced bounding must have every step's bounding ``enforced``
        (the ledger refuses it otherwise, so such a row was written around it). A requirement set after a charge
        does not apply to it."""
        from dp_operators.ledger.structure import declared_aggregates, requires_enforced_bounding

        event, details = row["event"], values.get("details")
        if event in ("account_created", "account_updated", "account_migrated", "chain_keyed") and isinstance(
                details, dict) and "config" in details:
            chain.require_enforced = requires_enforced_bounding(details.get("config"))
            chain.config, chain.config_recorded = details.get("config"), True
        if event != "reserved" or not chain.require_enforced:
            return
        steps = values.get("mechanisms")
        if steps is None:
            return  # unreadable (reported where it is read)
        declared = declared_aggregates(steps)
        if declared is None or declared:
            which = (f"the contribution bounds of {', '.join(shown(name) for name in declared[:5])} were only declared"
                     if declared else "its mechanisms list no step whose contribution bounds were enforced")
            flag(f"reserved on an account that required enforced contribution bounding when it was charged, but "
                 f"{which}: the ledger refuses such a charge (written around it)")

    def _check_signature(self, chain: _Chain, row: Mapping[str, Any], flag: Any) -> None:
        key_id, event = row["key_id"], row["event"]
        if self.keyring is not None:
            key = self.keyring.get(key_id) if isinstance(key_id, str) else None
            if key is None:
                flag(f"signed with key id {shown(key_id)}, which is not in the keyring (a retired key not given, or forged)")
            else:
                try:
                    intact = audit_row_mac(row, key) == row["row_hash"]
                except (TypeError, ValueError):
                    intact = False
                if not intact:
                    flag(f"MAC does not match under key id {shown(key_id)} (the row was edited, or written without the key)")
        if event in GOVERNANCE_EVENTS:
            self.governance_events += 1
            if self.governor_ids is not None and key_id in self.governor_ids:
                self.governance_by_given += 1
            elif len(self.governance_signers) < 8:
                self.governance_signers.add(shown(key_id))
        if self.governor_ids is None:
            return  # governor and spend keys cannot be told apart: any key of the keyring may sign anything
        if event in GOVERNANCE_EVENTS and key_id not in self.governor_ids:
            flag(f"a governance event signed with key id {shown(key_id)}, which is not a governor key")
        elif event in GOVERNANCE_EVENTS and key_id in chain.governor_retired:
            flag(f"a governance event signed with key id {shown(key_id)}, a governor key this chain's rotation retired")
        elif event in SPEND_EVENTS:
            authorised = (chain.stored or {}).get("spend_key_id")
            if key_id != authorised and key_id not in self.governor_ids:
                flag(
                    f"signed with key id {shown(key_id)}, but the account accepts spend key id {shown(authorised)} (or a "
                    "governor key) at this point"
                )

    @staticmethod
    def _check_cap_covers_spend(chain: _Chain, stored: Mapping[str, Any], flag: Any) -> None:
        """A governance event may not set a cap (or delta cap) below what the account has already spent: ``apply``
        refuses it, so such an event was written around the ledger."""
        try:
            cap = _number(stored.get("cap"), "the cap set")
            if cap < chain.spent:
                flag(f"sets the cap {_show(cap)} below the {_show(chain.spent)} already spent")
            if stored.get("accountant") == "approx_dp" and stored.get("delta") is not None:
                delta_cap = _number(stored.get("delta"), "the delta cap set")
                if delta_cap < chain.delta:
                    flag(f"sets the delta cap {_show(delta_cap)} below the {_show(chain.delta)} already spent")
        except _BadValue as error:
            flag(str(error))

    @staticmethod
    def _check_series_step(chain: _Chain, row: Mapping[str, Any], amount: Fraction, flag: Any) -> None:
        """A reservation of a series step (ADR 33), replaying what ``dp_reserve`` refuses: its run id a canonical
        step's; after step 0, its predecessor committed on the account; reserving 0 only as the key's first charge
        on the account, in a series whose step 0 was committed with a charge."""
        run_id = row["run_id"]
        if not isinstance(run_id, str) or not run_id.startswith(SERIES_RUN_PREFIX):
            return
        found = series_step_of(run_id)
        if found is None:
            flag(f"reserves run id {shown(run_id)}, under the series prefix but no series step")
            return
        generation, step = found
        series = (row["dag_id"], row["task_id"], row["map_index"], row["release_name"], generation)
        committed = chain.series_committed.get(series, {})
        if step > 0 and step - 1 not in committed:
            flag(f"reserves series step {step} before step {step - 1} was committed: steps run in order")
        if amount == 0:
            if (series, step) in chain.series_reserved:
                flag(f"reserves 0 for series step {step} again: a later attempt of a step pays its redraw")
            if not committed.get(0):
                flag(f"reserves 0 for series step {step}, but its step 0 was not committed with a charge")
        chain.series_reserved.add((series, step))
        if row["charge_id"] is not None:
            chain.series_charges[row["charge_id"]] = (series, step, amount > 0)

    def _check_reservation(
        self, chain: _Chain, row: Mapping[str, Any], amount: Fraction, delta_amount: Fraction, flag: Any
    ) -> None:
        """A ``reserved`` event is legal only within the cap, delta cap and allowlist in force at that point."""
        if row["amount"] is None or amount < 0 or (amount == 0 and not zero_amount_allowed(row["run_id"])):
            flag(f"a reservation must be > 0 (0 only for the first attempt of a series step after step 0), got "
                 f"{shown(row['amount'])}")
        self._check_series_step(chain, row, amount, flag)
        if delta_amount < 0:
            flag(f"a reservation's delta must be >= 0, got {shown(row['delta_amount'])}")
        stored = chain.stored
        if stored is None:
            return
        try:
            cap = _number(stored.get("cap"), "the cap in force")
            remaining = round_down(cap - chain.spent)
            if amount > remaining:
                flag(f"reserves {_show(amount)} with only {_show(remaining)} left under the cap {_show(cap)}")
            if stored.get("accountant") == "approx_dp":
                delta_cap = _number(stored.get("delta"), "the delta cap in force")
                left = round_down(delta_cap - chain.delta)
                if delta_amount > left:
                    flag(f"reserves delta {_show(delta_amount)} with only {_show(left)} left under the delta cap")
            elif delta_amount != 0:
                flag(f"a {shown(stored.get('accountant'))} account takes no delta, got {_show(delta_amount)}")
            allowed = _json(stored.get("allowed_dags"), "the allowed DAGs in force")
        except _BadValue as error:
            flag(str(error))
            return
        if not isinstance(allowed, list) or row["dag_id"] not in allowed:
            flag(f"reserves for DAG {shown(row['dag_id'])}, which the account did not allow at this point ({allowed})")

    # -- pass 2: charges --------------------------------------------------------------------------------------
    def check_charges(self, charges: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]) -> None:
        # events of accounts without a row were counted in pass 1; an id that is no integer was named there
        integral = (row for row in events if type(row["charge_id"]) is int and row["account"] in self.accounts)
        groups = itertools.groupby(integral, key=lambda row: row["charge_id"])
        pending = next(groups, None)
        for charge in charges:
            self.report.charges += 1
            while pending is not None and pending[0] < charge["id"]:
                self._orphans(pending[1])
                pending = next(groups, None)
            found: list[Mapping[str, Any]] = []
            if pending is not None and pending[0] == charge["id"]:
                found = self._first_events(charge["id"], pending[1])
                pending = next(groups, None)
            self._check_charge(charge, found)
        while pending is not None:
            self._orphans(pending[1])
            pending = next(groups, None)

    def _first_events(self, charge_id: int, rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The first :data:`MAX_EVENTS_PER_CHARGE` events naming charge ``charge_id``; each one beyond is a problem
        of its own and is not kept (a charge has two events)."""
        found: list[Mapping[str, Any]] = []
        for row in rows:
            if len(found) < MAX_EVENTS_PER_CHARGE:
                found.append(row)
            else:
                self.problems.row(
                    row["id"],
                    f"{_where(row)}: one of more than {MAX_EVENTS_PER_CHARGE} events naming charge id={charge_id} (a "
                    "charge has a 'reserved' event and one that ends it; the rest were written outside the ledger)",
                )
        return found

    def _orphans(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.problems.row(
                row["id"],
                f"{_where(row)}: names charge id={row['charge_id']}, which has no dp_charges row (deleted, or the "
                "event was forged)",
            )

    def _check_charge(self, charge: Mapping[str, Any], found: list[Mapping[str, Any]]) -> None:
        label = _Lazy(_charge_label, charge)
        read = read_row(schema.charges, {**charge, "created_at": self._created_time(charge["created_at"])})
        if read.problems:
            self.problems.add(
                f"{label}: " + "; ".join(_unreadable(problem, charge[problem.column]) for problem in read.problems)
            )
        unreadable = {problem.column for problem in read.problems}
        chain = self.chains.get(charge["account"])
        if chain is not None and charge["state"] != "released":
            chain.charged += _units_below(read.values["amount"] or Fraction(0))
            chain.charged_delta += _units_below(read.values["delta_amount"] or Fraction(0))
        predates = chain is not None and charge["id"] <= chain.migrated_last_charge
        state: str | None = None
        reserved: Mapping[str, Any] | None = None
        terminal: Mapping[str, Any] | None = None
        # the reference for the columns every event copies: the reservation (a MAC'd row), else the charge
        reference = next(
            (row for row in found if row["event"] == "reserved" and row["account"] == charge["account"]), None
        )
        for row in found:
            where = _Lazy(_where, row)
            event = row["event"]
            if row["account"] != charge["account"]:
                self.problems.row(
                    row["id"],
                    f"{where}: is in the chain of account {shown(row['account'])}, but charge id={charge['id']} belongs "
                    f"to account {shown(charge['account'])} (an event in the wrong chain)",
                )
                continue
            if event not in _CHARGE_EVENTS:
                self.problems.row(row["id"], f"{where}: a {shown(event)} event names charge id={charge['id']}")
                continue
            if reference is None:
                differ = [name for name in _EVENT_CHARGE_COLUMNS if row[name] != charge[name]]
                if differ:
                    self.problems.add(
                        f"{label}: {_differ(differ)} from its {shown(event)} event id={row['id']} ("
                        + "; ".join(f"{name} {shown(charge[name])} vs {shown(row[name])}" for name in differ)
                        + ")"
                    )
            elif row is not reference:
                differ = [name for name in _EVENT_CHARGE_COLUMNS if row[name] != reference[name]]
                if differ:
                    self.problems.row(
                        row["id"],
                        f"{where}: {_differ(differ)} from the 'reserved' event id={reference['id']} of "
                        f"charge id={charge['id']} ("
                        + "; ".join(f"{name} {shown(row[name])} vs {shown(reference[name])}" for name in differ)
                        + ")",
                    )
            if event == "reserved":
                if state is not None:
                    self.problems.row(row["id"], f"{where}: a second 'reserved' for charge id={charge['id']}")
                    continue
                state, reserved = "reserved", row
            elif state is None or state == "reserved":
                if state is None and not predates:
                    self.problems.row(
                        row["id"], f"{where}: {shown(event)} without a 'reserved' event for charge id={charge['id']}"
                    )
                state, terminal = event, row
            else:
                self.problems.row(
                    row["id"],
                    f"{where}: {shown(event)} after {shown(state)}: a charge ends once (reserved, then one of committed, "
                    "released or abandoned)",
                )

        if state is None:
            if not predates:
                self.problems.add(f"{label}: has no audit events in its account's chain (inserted outside the ledger)")
            return
        if charge["state"] != state:
            self.problems.add(f"{label}: state {shown(charge['state'])}, but its audit events end in {shown(state)}")
        if reserved is not None:
            self._check_fixed_columns(charge, reserved, label, read)
        elif not predates:
            self.problems.add(f"{label}: has no 'reserved' event")
        if terminal is None:
            return
        if terminal["event"] == "committed":
            digest = terminal["output_digest"]
            if charge["output_digest"] != digest:
                self.problems.add(
                    f"{label}: output_digest {shown(charge['output_digest'])} differs from its 'committed' event's {shown(digest)}"
                )
            elif digest is None or _sha256(charge["output"]) != digest:
                self.problems.add(f"{label}: the stored output does not hash to the digest in its 'committed' event")
        if terminal["event"] in ("committed", "released") and terminal["key_id"] is not None:
            expected = reserved["token_hash"] if reserved is not None else charge["token_hash"]
            where = _where(terminal)
            if expected is None:
                self.problems.row(
                    terminal["id"],
                    f"{where}: charge id={charge['id']} was reserved without a token, so nothing can prove this "
                    f"{shown(terminal['event'])}",
                )
            elif _sha256(terminal["proof"]) != expected:
                self.problems.row(
                    terminal["id"],
                    f"{where}: its proof does not hash to the reservation's token_hash (written without the "
                    "reservation's token)",
                )

    def _check_fixed_columns(
        self, charge: Mapping[str, Any], reserved: Mapping[str, Any], label: Any, read: ReadRow
    ) -> None:
        differ = []
        for name in schema.CHARGE_FIXED_COLUMNS:
            if name in ("id", "account") or name in read.unreadable:
                continue  # the merge key, checked per event; or named unreadable already
            if name == "created_at" and reserved["key_id"] is None:
                continue  # schema-2 events took their own timestamp, not the charge's
            if name == "created_at":
                stored, expected = self._created_text(charge["created_at"]), reserved["created_at"]
            elif name == "context":
                stored = read.values["context"]  # parsed (readable: else skipped above)
                try:
                    expected = _json(reserved["context"], "context")
                except _BadValue:
                    stored, expected = charge["context"], reserved["context"]
            else:
                stored, expected = charge[name], reserved[name]
            if stored != expected:
                value = stored if name == "created_at" else charge[name]
                differ.append(f"{name} {shown(value)} (its 'reserved' event id={reserved['id']} says {shown(expected)})")
        if differ:
            self.problems.add(f"{label}: " + "; ".join(differ))

    @staticmethod
    def _created_time(value: Any) -> Any:
        """A charge's ``created_at`` as read (SQLite: its text) as a datetime where it holds one."""
        return sqlite_timestamp(value) if isinstance(value, str) else value

    @staticmethod
    def _created_text(value: Any) -> Any:
        if isinstance(value, str):  # SQLite: read as text, so an edited value cannot fail the read
            try:
                value = dt.datetime.fromisoformat(value)
            except ValueError:
                return value
        if isinstance(value, dt.datetime):
            return timestamp_text(value)
        return value

    # -- pass 4: budget structure (privacy blocks, team quotas) ---------------------------------------------------
    def check_structure(self, conn: Connection) -> None:
        """What the spend functions enforce on structured accounts (dp_operators.ledger.structure), replayed: no
        charge on an account with privacy blocks (its members are charged); every charge on an account with team
        quotas has a twin on its team's quota member, and every charge on a quota member one on its account (the
        two of one reservation share its token's hash). Memory: the structured accounts and one token's charges."""
        c, a = schema.charges.c, schema.accounts.c
        parents: dict[str, str] = {}
        for row in conn.execute(sa.select(a.name, a.config).where(a.config.is_not(None))):
            try:
                config = _json(row.config, "config")
            except _BadValue:
                continue  # named by pass 3
            kind, _ = structure_of(config if isinstance(config, dict) else None)
            if kind in ("blocks", "quotas"):
                parents[row.name] = kind
        # one reservation on several members settles whole: never one member committed and another released, and
        # every committed member with the same output (what dp_commit and dp_release refuse otherwise)
        if parents:
            member_or_parent = sa.or_(*[sa.or_(c.account == name, c.account.startswith(name + MEMBER_SEPARATOR,
                                                                                          autoescape=True))
                                        for name in sorted(parents)])
            rows = _stream(conn, sa.select(c.id, c.token_hash, c.state, c.output_digest)
                           .where(member_or_parent, c.token_hash.is_not(None)).order_by(c.token_hash, c.id))
            for _, group in itertools.groupby(rows, key=lambda row: row["token_hash"]):
                members = list(itertools.islice(group, structure.MAX_WINDOWS + 1))
                states = {row["state"] for row in members}
                digests = {row["output_digest"] for row in members if row["state"] == "committed"}
                if ("committed" in states and "released" in states) or len(digests) > 1:
                    ids = ", ".join(str(row["id"]) for row in members[:10])
                    self.problems.add(
                        f"charges id={ids} are one reservation on several member accounts, settled unlike each other "
                        f"({', '.join(sorted(states))}{'; different outputs' if len(digests) > 1 else ''}): a "
                        "reservation is committed whole with one output, or released whole"
                    )
        for name, kind in sorted(parents.items()):
            if kind == "blocks":
                for charge in conn.execute(sa.select(c.id, c.account).where(c.account == name).limit(MAX_PROBLEMS)):
                    self.problems.add(f"charge id={charge.id} is on account {shown(name)}, which has privacy blocks: "
                                      "a charge there is on its blocks (written outside the spend functions)")
                continue
            members = sa.or_(c.account == name, c.account.startswith(name + MEMBER_SEPARATOR + QUOTA_PREFIX,
                                                                      autoescape=True))
            rows = _stream(conn, sa.select(c.id, c.account, c.token_hash).where(members).order_by(c.token_hash, c.id))
            for token, group in itertools.groupby(rows, key=lambda row: row["token_hash"]):
                accounts = [(row["id"], row["account"]) for row in itertools.islice(group, 3)]
                on_parent = [i for i, account in accounts if account == name]
                on_quota = [i for i, account in accounts if account != name]
                if token is None or len(on_parent) != 1 or len(on_quota) != 1:
                    ids = ", ".join(str(i) for i, _ in accounts)
                    self.problems.add(
                        f"charges id={ids} of account {shown(name)} (team quotas): a charge is on the account and on "
                        "its team's quota member, one each, under one reservation token; these are not"
                    )

    # -- pass 3: accounts -------------------------------------------------------------------------------------
    def check_accounts(self, accounts: Iterable[Mapping[str, Any]]) -> None:
        seen: set[Any] = set()
        # members (blocks, quotas) are checked against the configuration where they exist; blocks opened 'ahead'
        # of today may not be yet, so only the accounts themselves must all be in the ledger
        configured = self.config.all_accounts() if self.config is not None else {}
        required = set(self.config.accounts) if self.config is not None else set()
        for account in accounts:
            self.report.accounts += 1
            name = account["name"]
            seen.add(name)
            label = f"dp_budget_accounts {shown(name, 80)}"
            read = read_row(schema.accounts, account)
            for problem in read.problems:
                self.problems.add(f"{label}: {_unreadable(problem, account[problem.column])}")
            chain = self.chains.get(name)
            if chain is None:
                self.problems.add(f"{label}: has no audit events (created outside 'dpctl ledger apply')")
            else:
                self._check_account(account, read.values, chain, label)
            if name in configured:
                self._check_configured(account, configured[name], label)
        for name in sorted(required - seen):
            self.problems.add(f"account {shown(name)} is in the given configuration but not in the ledger ('dpctl ledger apply')")

    def _check_account(
        self, account: Mapping[str, Any], values: Mapping[str, Any], chain: _Chain, label: str
    ) -> None:
        self.report.heads[account["name"]] = chain.head
        if account["audit_seq"] != chain.seq or account["audit_head"] != chain.head:
            self.problems.add(
                f"{label}: chain head is seq {_plain(account['audit_seq'])} but the last event is seq {chain.seq} "
                "(events at the end of the chain were deleted, or the head was edited)"
            )
        spent, delta_spent = values["spent"], values["delta_spent"]
        if spent is not None and delta_spent is not None:  # else named unreadable
            if (spent, delta_spent) != (chain.spent, chain.delta):
                self.problems.add(
                    f"{label}: spent {account['spent']} (delta {account['delta_spent']}) but the audit events add up "
                    f"to {_show(chain.spent)} (delta {_show(chain.delta)})"
                )
            # Totals are rounded up after each charge, so they may exceed the plain sum of the charges, never
            # fall below it.
            if spent * MAX_DENOMINATOR < chain.charged or delta_spent * MAX_DENOMINATOR < chain.charged_delta:
                self.problems.add(
                    f"{label}: spent {account['spent']} (delta {account['delta_spent']}) is below what its charges "
                    f"that were not released add up to, {_show(Fraction(chain.charged, MAX_DENOMINATOR))} "
                    f"(delta {_show(Fraction(chain.charged_delta, MAX_DENOMINATOR))}): spend was returned without "
                    "its charge, or a charge's state or amount was changed"
                )
            cap = values["cap"]  # None: named unreadable
            if cap is not None and spent > cap:
                self.problems.add(f"{label}: spent {_show(spent)} exceeds the cap {_show(cap)}")
        # the configuration record (blocks, quotas, approval policy, require_enforced_bounding): what the last
        # governance event that recorded one wrote (an unreadable one is named where it is read)
        config = values.get("config")
        if chain.config_recorded and (config is not None or account["config"] is None) and config != chain.config:
            if isinstance(config, dict) and isinstance(chain.config, dict):
                keys = sorted((k for k in {*config, *chain.config} if config.get(k) != chain.config.get(k)), key=str)
                which = "; ".join(
                    f"{shown(k)} {shown(canonical_json(config[k])) if k in config else 'absent'} vs "
                    f"{shown(canonical_json(chain.config[k])) if k in chain.config else 'absent'}" for k in keys[:5]
                ) + (f"; and {len(keys) - 5} more" if len(keys) > 5 else "")
            else:
                which = (f"{shown(account['config'])} vs "
                         f"{shown(canonical_json(chain.config) if chain.config is not None else None)}")
            self.problems.add(
                f"{label}: config differs from the last governance event in its audit chain ({which}): changed "
                "outside 'dpctl ledger apply'"
            )
        stored = chain.stored or {}
        differ = [name for name in schema.ACCOUNT_GOVERNED_COLUMNS if account[name] != stored.get(name)]
        if differ:
            self.problems.add(
                f"{label}: {_differ(differ)} from the last governance event in its audit chain ("
                + "; ".join(f"{name} {shown(account[name])} vs {shown(stored.get(name))}" for name in differ)
                + "): changed outside 'dpctl ledger apply'"
            )

    def _check_configured(self, account: Mapping[str, Any], wanted: Any, label: str) -> None:
        from dp_operators.ledger.govern import account_values

        values = account_values(wanted)
        differ = []
        for name in ("accountant", "privacy_unit"):
            if account[name] != values[name]:
                differ.append(f"{name} {shown(account[name])} (configuration: {shown(values[name])})")
        for name in ("cap", "delta"):
            try:
                stored = None if account[name] is None else _number(account[name], name)
            except _BadValue:
                stored = account[name]
            expected = None if values[name] is None else Fraction(values[name])
            if stored != expected:
                differ.append(f"{name} {shown(account[name])} (configuration: {shown(values[name])})")
        try:
            allowed = _json(account["allowed_dags"], "allowed_dags")
        except _BadValue:
            allowed = account["allowed_dags"]
        if not isinstance(allowed, list) or sorted(map(str, allowed)) != sorted(wanted.allowed_dags):
            differ.append(f"allowed_dags {shown(account['allowed_dags'])} (configuration: {shown(values['allowed_dags'])})")
        try:
            record = _json(account["config"], "config") if account["config"] is not None else None
        except _BadValue:
            record = None
        required = requires_enforced_bounding(record if isinstance(record, dict) else None)
        if required != bool(getattr(wanted, "require_enforced_bounding", False)):
            differ.append(f"require_enforced_bounding {str(required).lower()} (configuration: "
                          f"{str(bool(getattr(wanted, 'require_enforced_bounding', False))).lower()})")
        if differ:
            self.problems.add(f"{label}: differs from the given configuration: " + "; ".join(differ))


def verify_ledger(
    base: LedgerBase,
    keyring: Keyring | None = None,
    config: LedgerConfig | None = None,
    governor_key_ids: set[str] | None = None,
) -> VerifyReport:
    """Replay every account's audit chain under the ledger's legal state machine and cross-check it with every
    charge row, every account row and the guard triggers (see the module docstring for the passes).

    Args:
        base: the ledger (either role's view; only its read engine is used).
        keyring: keys to check each row's MAC with (current and retired keys of both roles). ``None``: no MAC is
            checked (:attr:`VerifyReport.authenticated` is ``False``); unkeyed rows' plain hashes still are.
        config: optionally, a ledger configuration; each of its accounts must exist with the accountant, cap,
            delta, privacy unit, allowed DAGs and ``require_enforced_bounding`` ``dpctl ledger apply`` would store.
        governor_key_ids: ids of the governor keys. Governance events must be signed by one; spend events by the
            account's authorised spend key (``spend_key_id`` of the last governance event) or one. ``None``: the
            roles are not checked (any key of ``keyring`` may sign any event).

    Returns:
        A :class:`VerifyReport`; it never raises for what it reads (every oddity is a problem naming its row).

    Raises:
        LedgerNotInitialisedError: no schema, or another schema version.
        sqlalchemy.exc.DBAPIError: the database cannot be read.
    """
    base.check_schema()
    try:
        verifier = _verify(base, keyring, config, governor_key_ids, lenient=False)
    except sa.exc.OperationalError as error:
        # SQLite text that is not UTF-8 fails the read; read it all again decoding it with replacement characters
        # (every read pays for that decoding, so only a ledger holding such text does)
        if "decode" not in str(error.orig).lower():
            raise
        verifier = _verify(base, keyring, config, governor_key_ids, lenient=True)
    report = verifier.report
    report.problems = verifier.problems.ordered()
    given = verifier.governor_ids
    if report.problems and given and verifier.governance_events and not verifier.governance_by_given:
        signers = ", ".join(sorted(verifier.governance_signers))
        report.hints.append(
            f"none of the {verifier.governance_events} governance events is signed by the governor key given (key "
            f"id {', '.join(shown(k) for k in sorted(given))}); they are signed with key id {signers}. If the key file is not this "
            "ledger's governor key, run verify again with the right one; if it is, the governance history was "
            "signed by someone else"
        )
    return report


def _verify(
    base: LedgerBase,
    keyring: Keyring | None,
    config: LedgerConfig | None,
    governor_key_ids: set[str] | None,
    *,
    lenient: bool,
) -> _Verifier:
    """The passes of :func:`verify_ledger` in one read transaction; ``lenient``: SQLite text that is not UTF-8 is
    read with replacement characters (:func:`~dp_operators.ledger.store.lenient_sqlite_text`)."""
    verifier = _Verifier(keyring, config, governor_key_ids)
    e, c, a = schema.audit_events.c, schema.charges.c, schema.accounts.c
    sqlite = base._reader.dialect.name == "sqlite"
    # SQLite stores timestamps as text: read as text, an edited value becomes a problem, not an exception; on
    # PostgreSQL one outside the years 1 to 9999, which the driver cannot return, is read as NULL (timestamp_column)
    created = timestamp_column(c.created_at, base._reader.dialect.name)
    charge_columns = [c[name] for name in schema.CHARGE_FIXED_COLUMNS if name != "created_at"]
    # an output longer than OUTPUT_BATCH_CHARS comes as '' and is read from a stream of its own (_with_long_outputs)
    output = sa.case((sa.func.length(c.output) > OUTPUT_BATCH_CHARS, sa.literal("")), else_=c.output).label("output")
    charge_columns += [created, c.state, output, c.output_digest]
    account_columns = [column for column in a if column.name not in ("created_at", "updated_at")]

    with base._reader.connect() as conn:
        if not sqlite:  # one snapshot for every pass, so concurrent spending cannot look inconsistent
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            lenient_sqlite_text(conn, lenient)
            verifier.accounts = set(conn.execute(sa.select(a.name)).scalars())
            verifier.replay_chains(_stream(conn, sa.select(schema.audit_events).order_by(e.account, e.account_seq)))
            long_outputs = sa.select(c.id, c.output).where(sa.func.length(c.output) > OUTPUT_BATCH_CHARS).order_by(c.id)
            verifier.check_charges(
                _with_long_outputs(_stream(conn, sa.select(*charge_columns).order_by(c.id)),
                                   _stream(conn, long_outputs, batch=1)),
                _stream(
                    conn,
                    sa.select(schema.audit_events).where(e.charge_id.is_not(None)).order_by(e.charge_id, e.account_seq, e.id),
                ),
            )
            verifier.check_accounts(_stream(conn, sa.select(*account_columns).order_by(a.name)))
            verifier.check_structure(conn)
            for problem in schema.trigger_problems(conn):
                verifier.problems.add(problem)
    return verifier

