"""Authenticated replays (DESIGN.md 2.2 and 3; ADR 0020): ``run_release`` publishes a stored output only after
``Ledger.authenticated_output`` has checked it against the signed audit events.

Threat model: whoever holds the ledger's spender connection (the PostgreSQL spender role, or the SQLite file), with
or without the workers' spend key, tries to make a replay publish something that is not the noised release the key
committed; each such attempt is refused. Legitimate replays (after a spend-key rotation, a reconcile, a governance
change, a race with the commit) keep working. Old charges without signed events are refused by decision, since they
look like inserted ones.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sqlite3
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.ledger import (
    AuditChainError,
    AuditKey,
    Ledger,
    LedgerConfig,
    LedgerError,
    LedgerKeyError,
    LedgerGovernor,
    ReleaseKey,
    schema,
)
from dp_operators.ledger.chain import (
    GENESIS_HASH,
    AccountChain,
    canonical_json,
    legacy_row_hash,
    timestamp_text,
)
from dp_operators.release import run_release
from dp_operators.spec import parse_spec
from ledger_backends import account_config, old_schema_metadata
from old_ledgers import version_2_ledger
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender


SPEC = parse_spec("""
version: 1
release: rel
budget_account: a
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: agg
    kind: count
    group_by: [x]
    keys: {x: [0, 1]}
    mechanism: discrete_laplace
    budget: {epsilon: 1}
""")
UPSTREAM = {"agg": [{"x": 0, "count": 5}, {"x": 1, "count": 7}]}
SPEC_HASH = "0" * 64
KEY = ReleaseKey("d", "r1", "t", -1, "rel")
FORGED_VALUE = 123_456_789


def release(ledger: Ledger, key: ReleaseKey = KEY):
    return run_release(SPEC, UPSTREAM, ledger, key, spec_hash=SPEC_HASH)


def first_value(output: dict) -> int:
    return output["aggregates"]["agg"]["rows"][0]["value"]


def forged_from(output: dict) -> tuple[dict, str, str]:
    """A copy of ``output`` with its first cell forged; returns it, its canonical text and that text's SHA-256."""
    forged = json.loads(json.dumps(output))
    forged["aggregates"]["agg"]["rows"][0]["value"] = FORGED_VALUE
    text = canonical_json(forged)
    return forged, text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def new_ledger(url: str) -> Ledger:
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=10)}))
    return spender(url)




def attacker_url(ledger_url: str, request) -> str:
    """Who can still write a forged row: SQLite, the file's writer; PostgreSQL, the tables' owner (the spender role
    writes no table: it executes the spend functions, which refuse these rows, tests/ledger/test_spend_functions.py).
    The replay must refuse what either forges."""
    return ledger_url


def insert_committed_charge(conn: sa.Connection, text: str, digest: str, *, attempt: int = 0,
                            key: ReleaseKey = KEY) -> int:
    """INSERT a charge row already ``committed`` (the guard trigger only watches UPDATEs), at an attempt below the
    ledger's first (1), so both ``reserve`` (ordered by attempt) and the index scan of ``authenticated_output``
    meet it first."""
    now = dt.datetime.now(dt.timezone.utc)
    return conn.execute(schema.charges.insert().values(
        account="a", attempt=attempt, state="committed", amount="1/1000000", delta_amount="0", mechanisms="[]",
        spec_hash=SPEC_HASH, output=text, output_digest=digest, created_at=now, updated_at=now, **key.as_dict(),
    )).inserted_primary_key[0]


def legacy_event(conn: sa.Connection, seq: int, event: str, charge_id: int, **fields) -> None:
    """INSERT a schema-2 style audit row (``key_id`` NULL, plain SHA-256): needs no key at all."""
    values = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
    values.update(account="a", account_seq=seq, event=event, charge_id=charge_id, context="{}",
                  created_at=timestamp_text(dt.datetime.now(dt.timezone.utc)), prev_hash=GENESIS_HASH,
                  spent_after="0", delta_spent_after="0", key_id=None, **KEY.as_dict(), attempt=0, **fields)
    values["row_hash"] = legacy_row_hash(values)
    conn.execute(schema.audit_events.insert().values(**values))


def assert_not_forged(ledger: Ledger, real: dict) -> None:
    """The replay either refuses (an AuditChainError / LedgerError) or publishes the real committed output."""
    try:
        again = release(ledger)
    except LedgerError:
        return
    assert first_value(again.output) != FORGED_VALUE, "a replay published a forged output"
    assert again.output == real


@pytest.mark.parametrize("when", ["after the real commit", "before the first run"])
def test_unkeyed_legacy_events_never_make_a_replay_publish_a_forged_output(ledger_url, request, when):
    """A committed charge with unkeyed events inserted by the spender connection is never replayed as the release."""
    # Unkeyed events are legal only before the account's chain_keyed event; the spender connection alone (INSERT on
    # charges and audit events, no key) must not be able to forge one, before or after the real commit.
    ledger = new_ledger(ledger_url)
    real = release(ledger).output if when == "after the real commit" else None
    template = real or {"aggregates": {"agg": {"rows": [{"value": 0, "x": 0, "half_width": 1.0}]}},
                        "release": "rel", "spec_hash": SPEC_HASH}
    forged, text, digest = forged_from(template)
    engine = sa.create_engine(attacker_url(ledger_url, request))
    with engine.begin() as conn:
        charge_id = insert_committed_charge(conn, text, digest)
        legacy_event(conn, 10**6, "reserved", charge_id, amount="1/1000000", delta_amount="0", mechanisms="[]")
        legacy_event(conn, 10**6 + 1, "committed", charge_id, output_digest=digest)
    engine.dispose()
    if real is not None:
        assert_not_forged(ledger, real)
        return
    # before the first run: the task's first try "replays" a release that was never noised nor charged
    try:
        result = release(ledger)
    except LedgerError:
        return
    assert first_value(result.output) != FORGED_VALUE, "the first run published a release nobody noised"


def test_a_second_committed_charge_of_a_key_is_never_replayed(ledger_url, request):
    """A second committed charge of a key, with well-linked spend-key events of its own, is never replayed."""
    # A release key has at most one committed charge, at the attempt its reserved event states; the threat model here is
    # the spender connection plus the spend key.
    ledger = new_ledger(ledger_url)
    real = release(ledger).output
    _, text, digest = forged_from(real)
    token = "attacker-token"
    engine = sa.create_engine(attacker_url(ledger_url, request))
    with engine.begin() as conn:
        charge_id = insert_committed_charge(conn, text, digest)
        chain = AccountChain.lock(conn, "a", SPEND_KEY)
        fields = dict(charge_id=charge_id, **KEY.as_dict(), attempt=0, try_number=None, spec_hash=SPEC_HASH,
                      amount="1/1000000", delta_amount="0", mechanisms="[]")
        chain.append(conn, "reserved", {"host": "attacker"}, token_hash=hashlib.sha256(token.encode()).hexdigest(),
                     **fields)
        chain.append(conn, "committed", {"host": "attacker"}, output_digest=digest, proof=token, **fields)
        chain.flush(conn)
    engine.dispose()
    assert_not_forged(ledger, real)


def test_a_charge_moved_under_another_key_is_not_replayed_as_that_keys_output(tmp_path):
    """Release K2's committed charge moved under key K1 (SQLite, no key) is not replayed as K1's output."""
    # The events are compared with the charge row (account, release key, attempt, amounts, mechanisms, spec hash), not
    # looked up by charge id alone.
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = new_ledger(url)
    real = release(ledger).output
    other_key = ReleaseKey("d", "r2", "t", -1, "rel")
    other = release(ledger, other_key).output
    while other == real:  # pragma: no cover - two draws agreeing on every cell and timestamp
        other_key = ReleaseKey("d", other_key.run_id + "x", "t", -1, "rel")
        other = release(ledger, other_key).output
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        conn.execute("DROP TRIGGER dp_charges_guard")
        conn.execute("UPDATE dp_charges SET run_id = 'r1-old' WHERE run_id = 'r1'")
        conn.execute("UPDATE dp_charges SET run_id = 'r1' WHERE run_id = ?", (other_key.run_id,))
        for statement in schema.trigger_ddl("sqlite"):
            if "dp_charges_guard" in statement:
                conn.execute(statement)
    try:
        again = release(ledger)
    except LedgerError:
        return
    assert again.output != other, "K1's replay published another release's output as K1's"


def test_an_output_reserve_returns_is_published_only_once_authenticated(tmp_path, monkeypatch):
    """An output ``reserve`` returns is published only if ``authenticated_output`` vouches for it."""
    # The file owner inserts a committed charge after the first authentication and deletes it before the second; the
    # race is simulated by wrapping reserve.
    path = tmp_path / "ledger.db"
    ledger = new_ledger(f"sqlite:///{path}")
    template = {"aggregates": {"agg": {"rows": [{"value": 0, "x": 0, "half_width": 1.0}]}}, "release": "rel",
                "spec_hash": SPEC_HASH}
    _, text, digest = forged_from(template)
    original = ledger.reserve

    def raced_reserve(*args, **kwargs):
        engine = sa.create_engine(f"sqlite:///{path}")
        with engine.begin() as conn:
            insert_committed_charge(conn, text, digest)
        engine.dispose()
        try:
            return original(*args, **kwargs)
        finally:
            with sqlite3.connect(path) as conn:
                conn.execute("DROP TRIGGER dp_charges_no_delete")
                conn.execute("DELETE FROM dp_charges WHERE attempt = 0")
                for statement in schema.trigger_ddl("sqlite"):
                    if "dp_charges_no_delete" in statement:
                        conn.execute(statement)

    monkeypatch.setattr(ledger, "reserve", raced_reserve)
    try:
        result = release(ledger)
    except LedgerError:
        return
    assert first_value(result.output) != FORGED_VALUE, "an output reserve() returned was published unauthenticated"


def test_a_committed_charge_with_a_null_output_is_refused_as_a_ledger_error(tmp_path):
    """A committed charge with a NULL output and the digest of the empty string raises a LedgerError."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = new_ledger(url)
    engine = sa.create_engine(url)
    digest = hashlib.sha256(b"").hexdigest()
    with engine.begin() as conn:
        charge_id = insert_committed_charge(conn, None, digest)  # type: ignore[arg-type]
        legacy_event(conn, 10**6, "reserved", charge_id, amount="1/1000000", delta_amount="0", mechanisms="[]")
        legacy_event(conn, 10**6 + 1, "committed", charge_id, output_digest=digest)
    engine.dispose()
    with pytest.raises(LedgerError):
        ledger.authenticated_output(KEY)


# -- legitimate replays keep working -----------------------------------------------------------------------------------


def test_a_release_committed_before_a_spend_key_rotation_replays_with_the_retired_key(ledger_url):
    """After a spend-key rotation, a retry replays once the connection holds the retired key, and not before."""
    ledger = new_ledger(ledger_url)
    real = release(ledger).output
    new_key = AuditKey.from_text("rotated-spend-key-" + "n" * 46)
    LedgerGovernor(ledger_url, governor_key=GOVERNOR_KEY, spend_key=new_key).apply_config(
        LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=10)}))
    worker = Ledger(ledger_url, audit_key=new_key)
    assert worker.account("a").spend_key_id == new_key.key_id
    release(worker, ReleaseKey("d", "after-rotation", "t", -1, "rel"))  # new releases work with the new key
    with pytest.raises(LedgerKeyError, match="retired_audit_keys"):  # the old events cannot be checked ...
        release(worker)
    # ... until the connection is given the retired key (fixed: Ledger(retired_audit_keys=...), connection extra
    # "retired_audit_keys")
    worker = Ledger(ledger_url, audit_key=new_key, retired_audit_keys=[SPEND_KEY])
    again = release(worker)  # the retry of the release committed before the rotation
    assert again.replayed and again.output == real


def test_a_schema_1_release_passes_verify_but_is_not_replayed_unauthenticated(ledger_url):
    """A schema-1 charge (no audit events) passes verify but is refused by ``authenticated_output``, saying why."""
    # Decided: a charge with no signed events looks like an inserted one, so it is not replayed; the officer checks it
    # with `dpctl ledger verify`.
    metadata = old_schema_metadata(1)
    engine = sa.create_engine(ledger_url)
    metadata.create_all(engine)
    now = dt.datetime.now(dt.timezone.utc)
    output = canonical_json({"release": "rel", "value": 1})
    with engine.begin() as conn:
        conn.execute(metadata.tables["dp_schema_version"].insert().values(version=1, applied_at=now))
        conn.execute(metadata.tables["dp_budget_accounts"].insert().values(
            name="a", accountant="pure_dp", cap="1", spent="1/4", delta=None, privacy_unit="person",
            allowed_dags=json.dumps(["d"]), created_at=now, updated_at=now))
        conn.execute(metadata.tables["dp_charges"].insert().values(
            account="a", attempt=1, state="committed", amount="1/4", mechanisms="[]", spec_hash=SPEC_HASH,
            output=output, created_at=now, updated_at=now, **KEY.as_dict()))
    engine.dispose()
    governor(ledger_url).init_schema()
    assert governor(ledger_url).verify().ok
    worker = spender(ledger_url)
    assert worker.stored_output(KEY) == json.loads(output)
    # decided: a charge with no signed events cannot be authenticated, so it is not replayed (an inserted charge
    # looks the same); the officer checks it with `dpctl ledger verify`
    with pytest.raises(LedgerKeyError, match="no audit events: it was committed before the ledger kept them"):
        worker.authenticated_output(KEY)


def test_a_schema_2_release_is_not_replayed_unauthenticated(ledger_url):
    """A schema-2 release (unkeyed events) is refused on replay, charging nothing; verify still accepts the ledger."""
    version_2_ledger(ledger_url, cap="10", key=KEY, output={"release": "rel", "spec_hash": SPEC_HASH, "value": 1})
    governor(ledger_url).init_schema()
    assert governor(ledger_url).verify().ok
    worker = spender(ledger_url)
    spent = worker.account("a").spent
    with pytest.raises(LedgerKeyError, match="written before the ledger's chain was keyed"):
        release(worker)
    assert worker.account("a").spent == spent


def test_a_replay_after_reconcile_and_a_takeover_authenticates_the_committing_attempt(ledger_url):
    """After reconciles abandon dead attempts, the replay authenticates the committing attempt's events only."""
    ledger = new_ledger(ledger_url)
    short = spender(ledger_url, lease_seconds=0.05)
    short.reserve(KEY, account="a", amount=Fraction(1), mechanisms=[], spec_hash=SPEC_HASH)
    other = ReleaseKey("d", "r-other", "t", -1, "rel")
    short.reserve(other, account="a", amount=Fraction(1), mechanisms=[], spec_hash=SPEC_HASH)
    import time

    time.sleep(0.1)
    assert len(ledger.reconcile()) == 2
    first = release(ledger)
    assert not first.replayed
    assert release(ledger).output == first.output
    short.reserve(ReleaseKey("d", "r3", "t", -1, "rel"), account="a", amount=Fraction(1), mechanisms=[],
                  spec_hash=SPEC_HASH)
    time.sleep(0.1)
    assert len(governor(ledger_url).reconcile()) == 1
    again = release(ledger)
    assert again.replayed and again.output == first.output
    assert governor(ledger_url).verify().ok


def test_a_replay_after_a_governance_change_and_a_released_attempt_authenticates_the_committed_one(ledger_url):
    """Governor-signed events and a released attempt between the charge's events do not stop the replay."""
    ledger = new_ledger(ledger_url)
    ledger.release(ledger.reserve(KEY, account="a", amount=Fraction(1), mechanisms=[], spec_hash=SPEC_HASH))
    first = release(ledger)
    governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=20)}))
    again = release(ledger)
    assert again.replayed and again.output == first.output


def test_a_replay_racing_a_commit_publishes_the_committed_output(ledger_url, monkeypatch):
    """Try 2 meeting try 1's commit between its two authentications publishes the committed output."""
    ledger = new_ledger(ledger_url)
    first_try = spender(ledger_url)
    reservation = first_try.reserve(KEY, account="a", amount=Fraction(1), mechanisms=[], spec_hash=SPEC_HASH)
    committed = {"release": "rel", "spec_hash": SPEC_HASH, "value": 42}
    original = ledger.reserve

    def reserve_after_the_commit(*args, **kwargs):
        first_try.commit(reservation, committed)
        return original(*args, **kwargs)

    monkeypatch.setattr(ledger, "reserve", reserve_after_the_commit)
    result = release(ledger)
    assert result.replayed and result.output == committed


def test_a_charge_committed_by_sql_without_the_token_is_refused_on_replay(ledger_url, request):
    """A reserved charge committed by SQL, with a spend-key-signed event but no token, is refused on replay."""
    ledger = new_ledger(ledger_url)
    reservation = ledger.reserve(KEY, account="a", amount=Fraction(1), mechanisms=[], spec_hash=SPEC_HASH)
    forged = {"release": "rel", "spec_hash": SPEC_HASH, "value": FORGED_VALUE}
    text = canonical_json(forged)
    digest = hashlib.sha256(text.encode()).hexdigest()
    engine = sa.create_engine(attacker_url(ledger_url, request))
    with engine.begin() as conn:
        conn.execute(schema.charges.update().where(schema.charges.c.id == reservation.charge_id).values(
            state="committed", output=text, output_digest=digest))
        charge = conn.execute(sa.select(schema.charges).where(schema.charges.c.id == reservation.charge_id)).one()
        chain = AccountChain.lock(conn, "a", SPEND_KEY)
        from dp_operators.ledger.chain import charge_event_fields

        chain.append(conn, "committed", {"host": "attacker"}, output_digest=digest, proof="guessed",
                     **charge_event_fields(charge))
        chain.flush(conn)
    engine.dispose()
    with pytest.raises(AuditChainError, match="token"):
        release(ledger)
