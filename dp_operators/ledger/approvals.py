"""An officer's approval before a large charge (docs/ledger.md, "Approval before a large charge").

An account's ``approval`` policy (:class:`~dp_operators.ledger.config.Approval`, stored in the account's ``config``,
which only the governor writes) says which charges need a privacy officer's approval: above an amount, above a
fraction of the budget left, or whose mechanisms differ from the last committed charge of the same DAG, task, map
index and release name. Such a charge is reserved only when an ``approval_granted`` event on the account names its
release key and spec hash with an amount at least the charge, signed with a key that is not the account's spend key
(the governor key: :meth:`~dp_operators.ledger.govern.LedgerGovernor.decide_approval`). Otherwise the reservation
writes nothing and returns ``approval_required`` (:class:`~dp_operators.ledger.errors.ApprovalRequiredError`), or
``approval_rejected`` after a rejection or once the request is ``timeout_hours`` old
(:class:`~dp_operators.ledger.errors.ApprovalRejectedError`).

Three audit events, each on the account's chain:

- ``approval_requested``: the spender (spend key; on PostgreSQL the function ``dp_request_approval``), with the
  release key, the amount, the spec hash, the mechanisms and ``details.plan`` (what the officer sees).
- ``approval_granted`` / ``approval_rejected``: the governor (governor key; on PostgreSQL written by the governor
  role, which may insert audit events: the spender may not, and no spend function writes these kinds), naming the
  request (``details.request``: its sequence number on the account) and copying its release key, amount and spec
  hash; ``details.reason`` and ``details.decided_by``; the event's ``created_at`` is when.

The same rules run here (SQLite; Python) and in ``dp_reserve_member`` / ``dp_request_approval`` (PostgreSQL;
:mod:`~dp_operators.ledger.pg_functions`); ``dpctl ledger verify`` replays them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dp_operators.ledger import schema
from dp_operators.ledger.errors import ApprovalRejectedError, ApprovalRequiredError
from dp_operators.ledger.structure import config_record

APPROVAL_REQUESTED = "approval_requested"
APPROVAL_GRANTED = "approval_granted"
APPROVAL_REJECTED = "approval_rejected"
#: Events only a governor key may sign.
APPROVAL_DECISIONS = frozenset({APPROVAL_GRANTED, APPROVAL_REJECTED})
APPROVAL_EVENTS = frozenset({APPROVAL_REQUESTED, *APPROVAL_DECISIONS})
#: Bounds of a request's plan (JSON object) and of a decision's reason.
MAX_PLAN_CHARS = 64 * 1024
MAX_REASON_CHARS = 1000

_e = schema.audit_events.c
_c = schema.charges.c


def policy_of(config: Any) -> dict | None:
    """The ``approval`` policy recorded in an account's stored ``config`` (text or dict), or ``None``."""
    policy = (config_record(config) or {}).get("approval")
    return policy if isinstance(policy, dict) else None


def approval_account(name: str, config: Any) -> str:
    """The account whose chain holds the approvals of a charge on account ``name``: a privacy block's are on its
    account (one request and one grant for every block a release reads), any other account's on itself."""
    part_of = (config_record(config) or {}).get("part_of")
    if isinstance(part_of, dict) and "block" in part_of and isinstance(part_of.get("account"), str):
        return part_of["account"]
    return name


def mechanism_kinds(mechanisms: Any) -> list[str]:
    """The sorted ``mechanism`` names of a charge's mechanisms (a list or its JSON text): what
    ``on_mechanism_change`` compares."""
    if isinstance(mechanisms, str):
        try:
            mechanisms = json.loads(mechanisms)
        except ValueError:
            return []
    if not isinstance(mechanisms, list):
        return []
    return sorted(str(m.get("mechanism") or "") if isinstance(m, dict) else "" for m in mechanisms)


def approval_reasons(policy: Mapping[str, Any], charged: Fraction, remaining: Fraction,
                     kinds: list[str] | None = None, last_kinds: list[str] | None = None) -> list[str]:
    """Why ``policy`` requires approval of a charge of ``charged`` with ``remaining`` left before it (empty: it
    does not). ``kinds``/``last_kinds``: the mechanism kinds of this charge and of the last committed charge of the
    same DAG, task, map index and release name on the account (``None``: there is none)."""
    reasons = []
    if policy.get("above") is not None and charged > Fraction(policy["above"]):
        reasons.append("above")
    fraction = policy.get("above_fraction_of_remaining")
    if fraction is not None and charged > Fraction(fraction) * max(remaining, Fraction(0)):
        reasons.append("above_fraction_of_remaining")
    if policy.get("on_mechanism_change") and last_kinds is not None and kinds != last_kinds:
        reasons.append("mechanism_change")
    return reasons


def timeout_of(policy: Mapping[str, Any] | None) -> dt.timedelta:
    hours = Fraction((policy or {}).get("timeout_hours") or 24)
    return dt.timedelta(seconds=float(hours * 3600))


def _when(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def _key_events(conn: Connection, account: str, key: Any, spec_hash: str | None = None) -> list[Any]:
    # every event kind starting "approval_" is one of APPROVAL_EVENTS (filtered below); no expanding IN: SQLite's
    # spend path runs on the bare driver
    where = [_e.account == account, _e.event.startswith("approval_"), _e.dag_id == key.dag_id,
             _e.run_id == key.run_id, _e.task_id == key.task_id, _e.map_index == key.map_index,
             _e.release_name == key.release_name]
    if spec_hash is not None:
        where.append(_e.spec_hash == spec_hash)
    rows = conn.execute(sa.select(schema.audit_events).where(*where).order_by(_e.account_seq)).all()
    return [row for row in rows if row.event in APPROVAL_EVENTS]


def _amount(text: Any) -> Fraction | None:
    try:
        return Fraction(str(text))
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def block_of(config: Any) -> str | None:
    """The window of a privacy block's account (its stored ``config``), or ``None`` for any other account."""
    part_of = (config_record(config) or {}).get("part_of")
    block = part_of.get("block") if isinstance(part_of, dict) else None
    return block if isinstance(block, str) else None


def _plans_window(events: list[Any], request: Any, window: str) -> bool:
    """Whether request number ``request``'s plan lists block ``window`` (what the officer approved)."""
    for event in events:
        if event.event == APPROVAL_REQUESTED and event.account_seq == request:
            blocks = (_details(event).get("plan") or {}).get("blocks")
            return isinstance(blocks, list) and any(isinstance(b, dict) and b.get("window") == window for b in blocks)
    return False


def approval_state(events: Iterable[Any], spend_key_id: str | None, charged: Fraction, timeout: dt.timedelta,
                   now: dt.datetime, window: str | None = None) -> dict[str, Any]:
    """The approval state of a charge of ``charged`` from the approval events of its release key and spec hash:
    ``{"state": "granted" | "rejected" | "pending" | "none", ...}`` with the request (``request``: its sequence
    number, ``requested_at``, ``expires_at``) and, when rejected, ``reason`` (``rejected`` or ``timeout``) and
    ``note``. A grant counts only when it covers ``charged`` and is not signed with the spend key; a rejection of
    the key and spec hash is final; an undecided request older than ``timeout`` is rejected by timeout."""
    events = list(events)
    for event in events:
        amount = _amount(event.amount)
        if (event.event == APPROVAL_GRANTED and event.key_id is not None and event.key_id != spend_key_id
                and amount is not None and amount >= charged
                # a block's charge: the request the officer granted lists its window
                and (window is None or _plans_window(events, _details(event).get("request"), window))):
            return {"state": "granted", "request": _details(event).get("request"), "decision": event.account_seq}
    for event in events:
        if event.event == APPROVAL_REJECTED and event.key_id != spend_key_id:
            details = _details(event)
            return {"state": "rejected", "reason": "rejected", "request": details.get("request"),
                    "note": details.get("reason")}
    filed = [e for e in events if e.event == APPROVAL_REQUESTED]
    if filed and now >= _when(filed[0].created_at) + timeout:
        # the key's first request timed out undecided: final, whatever amount a later request names
        first = _when(filed[0].created_at)
        return {"state": "rejected", "reason": "timeout", "note": None, "request": filed[0].account_seq,
                "requested_at": first.isoformat(), "expires_at": (first + timeout).isoformat()}
    requests = [e for e in filed if (_amount(e.amount) or 0) >= charged]
    if not requests:
        return {"state": "none"}
    request = requests[-1]
    requested = _when(request.created_at)
    expires = requested + timeout
    found = {"request": request.account_seq, "requested_at": requested.isoformat(),
             "expires_at": expires.isoformat()}
    if now >= expires:
        return {"state": "rejected", "reason": "timeout", "note": None, **found}
    return {"state": "pending", **found}


def _details(event: Any) -> dict:
    try:
        details = json.loads(event.details) if event.details else {}
    except ValueError:
        return {}
    return details if isinstance(details, dict) else {}


def last_committed_kinds(conn: Connection, account: str, key: Any, blocks_of: str | None = None) -> list[str] | None:
    """The mechanism kinds of the last committed charge of ``key``'s DAG, task, map index and release name on
    ``account`` (any run), or ``None``; with ``blocks_of`` (a privacy block's account), on any block of that
    account: yesterday's release is the one a changed mechanism differs from."""
    on = (_c.account == account if blocks_of is None
          else _c.account.startswith(blocks_of + "@", autoescape=True))
    row = conn.execute(
        sa.select(_c.mechanisms).where(
            on, _c.dag_id == key.dag_id, _c.task_id == key.task_id,
            _c.map_index == key.map_index, _c.release_name == key.release_name, _c.state == "committed",
        ).order_by(_c.id.desc()).limit(1)
    ).first()
    return None if row is None else mechanism_kinds(row.mechanisms)


def refusal(account: str, key: Any, charged: Fraction, remaining: Fraction, reasons: list[str],
            state: Mapping[str, Any]) -> ApprovalRequiredError | ApprovalRejectedError:
    """The exception of a charge the policy holds back (``state``: :func:`approval_state`'s)."""
    where = f"release {key.release_name!r} (DAG {key.dag_id!r}, run {key.run_id!r}, task {key.task_id!r})"
    if state["state"] == "rejected":
        if state.get("reason") == "grant_used":
            text = (f"the officer's approval (request {state.get('request')}) of a charge on budget account "
                    f"{account!r} for {where} was used by an earlier attempt, which reserved under it and may have "
                    "drawn noise; a grant approves one charge, so this attempt is refused and nothing was reserved. "
                    "Run the release again as a new run for a new request")
        elif state.get("reason") == "timeout":
            text = (f"the charge of {charged} on budget account {account!r} for {where} was rejected by timeout: "
                    f"approval request {state.get('request')} was not decided before {state.get('expires_at')}; "
                    "nothing was reserved")
        else:
            note = state.get("note")
            text = (f"a privacy officer rejected the charge of {charged} on budget account {account!r} for {where} "
                    f"(request {state.get('request')}{': ' + str(note) if note else ''}); nothing was reserved")
        return ApprovalRejectedError(text, account=account, request=state.get("request"),
                                     reason=str(state.get("reason") or "rejected"), note=state.get("note"))
    request = None if state["state"] != "pending" else {
        k: state[k] for k in ("request", "requested_at", "expires_at")}
    text = (f"budget account {account!r} requires a privacy officer's approval of the charge of {charged} for "
            f"{where} ({', '.join(reasons)}; {remaining} remaining); nothing was reserved. "
            + (f"Approval request {request['request']} waits until {request['expires_at']}: a privacy officer runs "
               f"'dpctl ledger approve {account} {request['request']}'" if request else
               "No request is filed yet (the release operator files one)"))
    return ApprovalRequiredError(text, account=account, amount=charged, reasons=reasons, remaining=remaining,
                                 request=request)


def check_charge(conn: Connection, row: Any, key: Any, spec_hash: str, charged: Fraction, remaining: Fraction,
                 mechanisms: Any, now: dt.datetime) -> ApprovalRequiredError | ApprovalRejectedError | None:
    """SQLite's ``reserve_on``: the refusal of a charge the account's policy holds back, or ``None`` (no policy,
    not needed, or granted). Reads only."""
    policy = policy_of(row.config)
    if policy is None:
        return None
    where = approval_account(row.name, row.config)
    last = last_committed_kinds(conn, row.name, key, None if where == row.name else where) \
        if policy.get("on_mechanism_change") else None
    reasons = approval_reasons(policy, charged, remaining, mechanism_kinds(mechanisms), last)
    if not reasons:
        return None
    state = approval_state(_key_events(conn, where, key, spec_hash), row.spend_key_id, charged,
                           timeout_of(policy), now, block_of(row.config))
    if state["state"] == "granted":
        # a grant approves one charge: an attempt after one that reserved under it (and may have drawn) needs another
        earlier = conn.execute(sa.select(_c.id).where(
            _c.account == row.name, _c.dag_id == key.dag_id, _c.run_id == key.run_id, _c.task_id == key.task_id,
            _c.map_index == key.map_index, _c.release_name == key.release_name, _c.state != "released",
        ).limit(1)).first()
        if earlier is None:
            return None
        state = {**state, "state": "rejected", "reason": "grant_used"}
    return refusal(where, key, charged, remaining, reasons, state)


def from_status(result: Mapping[str, Any], key: Any) -> ApprovalRequiredError | ApprovalRejectedError:
    """PostgreSQL: the exception of ``dp_reserve``'s ``approval_required`` / ``approval_rejected`` status."""
    state = dict(result.get("approval") or {})
    return refusal(state.get("account") or result["account"], key, Fraction(result["requested"]), Fraction(result["remaining"]),
                   list(result.get("reasons") or []), state)


def check_plan(plan: Any) -> str:
    """The canonical JSON of a request's ``plan`` (an object), bounded like the mechanisms."""
    from dp_operators.ledger.chain import canonical_json

    if not isinstance(plan, dict):
        raise ValueError(f"an approval request's plan is a JSON object, got {type(plan).__name__}")
    text = canonical_json(plan)
    if len(text) > MAX_PLAN_CHARS:
        raise ValueError(f"an approval request's plan is at most {MAX_PLAN_CHARS} characters of JSON")
    return text


def requests(conn: Connection, account: str | None = None) -> list[dict[str, Any]]:
    """Every approval request (oldest first) with its decision: ``account``, ``request`` (sequence number), the
    release key, ``amount``, ``spec_hash``, ``plan``, ``requested_at``, ``decision`` (``granted``, ``rejected`` or
    ``None``), ``decided_at``, ``decided_by``, ``reason``, ``signed_by`` (key id)."""
    where = [_e.event.in_(sorted(APPROVAL_EVENTS))]
    if account is not None:
        where.append(_e.account == account)
    rows = conn.execute(sa.select(schema.audit_events).where(*where).order_by(_e.account, _e.account_seq)).all()
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        details = _details(row)
        if row.event == APPROVAL_REQUESTED:
            found[(row.account, row.account_seq)] = {
                "account": row.account, "request": row.account_seq, "dag_id": row.dag_id, "run_id": row.run_id,
                "task_id": row.task_id, "map_index": row.map_index, "release_name": row.release_name,
                "amount": row.amount, "spec_hash": row.spec_hash, "plan": details.get("plan"),
                "requested_at": row.created_at, "decision": None, "decided_at": None, "decided_by": None,
                "reason": None, "signed_by": None,
            }
        else:
            request = found.get((row.account, details.get("request")))
            if request is not None and request["decision"] is None:
                request.update(decision="granted" if row.event == APPROVAL_GRANTED else "rejected",
                               decided_at=row.created_at, decided_by=details.get("decided_by"),
                               reason=details.get("reason"), signed_by=row.key_id)
    return list(found.values())


__all__ = [
    "APPROVAL_DECISIONS", "APPROVAL_EVENTS", "APPROVAL_GRANTED", "APPROVAL_REJECTED", "APPROVAL_REQUESTED",
    "approval_reasons", "approval_state", "check_charge", "mechanism_kinds", "policy_of", "requests",
]
