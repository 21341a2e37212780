"""Review of three issue-11 changes (commits 5c3655e, b0c18e7, bb468c7): attacks and regressions.

1. ``Ledger.authenticated_output`` (dp_operators/ledger/spend.py), which ``run_release`` calls before every replay.
   Threat model (DESIGN.md 3, ADR 0020): whoever holds the ledger's spender connection (the PostgreSQL spender
   role, or the SQLite file), with or without the workers' spend key, tries to make a replay publish something that
   is not the noised release the key committed. Tests named ``test_attack_*`` demonstrated attacks (fixed since:
   they assert the refusal); ``test_legit_*`` are replays that must keep working (a rotated spend key is given to
   the connection as a retired key; a charge committed before the ledger kept signed events is refused, by
   decision, since it looks like an inserted one); ``test_guard_*`` guard what worked from the start.
2. NULLs in the columnar reader (dp_operators/release/columns.py) against the row reader: those tests live in
   tests/release_engine/test_columnar_inputs.py.
3. Rows-file refusals at DAG parse time (dp_operators/operators/release.py ``rows_files_problem``).
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
from dp_operators.ledger.roles import apply_roles
from dp_operators.release import run_release
from dp_operators.spec import parse_spec
from ledger_backends import account_config, old_schema_metadata
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender

# ------------------------------------------------------------------------------------------------------------------
# 1. Authenticated replays
# ------------------------------------------------------------------------------------------------------------------

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
    """SQLite: the file itself. PostgreSQL: the ledger's spender role (INSERT on charges and audit events, UPDATE of
    a charge's state/output/lease and the account totals; guard triggers it cannot drop)."""
    if ledger_url.startswith("sqlite"):
        return ledger_url
    spender_role, governor_role = request.getfixturevalue("pg_roles")
    apply_roles(ledger_url, spender_role, governor_role)
    return sa.make_url(ledger_url).set(username=spender_role).render_as_string(hide_password=False)


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
def test_attack_legacy_events_without_any_key_make_a_replay_publish_a_forged_output(ledger_url, request, when):
    """HIGH. ``_authenticate`` accepts any ``key_id`` NULL event by its plain SHA-256, and the token check is
    skipped when the reserved event has no ``token_hash`` and the committed event no ``key_id``. So the spender
    connection alone, with no key (PostgreSQL: INSERT on dp_charges and dp_audit_events, no trigger involved),
    inserts a ``committed`` charge for the key (attempt 0, so it is met first) and two unkeyed events at unused
    sequence numbers; the replay publishes the forged output. Legacy rows are legal only before the account's
    ``chain_keyed`` event (verify says so). Fix: accept an unkeyed event only when its ``account`` is the charge's
    and its ``account_seq`` lies in 1..(seq of the account's ``chain_keyed`` event) - 1; never otherwise."""
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


def test_attack_a_second_committed_charge_with_spend_key_events_is_replayed(ledger_url, request):
    """MEDIUM (in the brief's threat model: spender connection plus the spend key). The key already has a
    committed release. The attacker INSERTs a second ``committed`` charge for it (attempt 0) and appends, through
    the chain code and the spend key, a ``reserved`` event with a token hash of its own and a ``committed`` event
    proving that token: a well-linked chain, MACs valid, so ``authenticated_output`` (which takes whichever
    committed charge the query meets first, with no ORDER BY) replays the forgery. Fix: a release key has at most
    one committed charge: ``authenticated_output`` (and ``reserve``'s replay) refuse when more than one charge of
    the key is committed, and when the charge's ``attempt`` is not the one its ``reserved`` event states for the
    key's charges in order (attempts start at 1)."""
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


def test_attack_sqlite_owner_points_a_key_at_another_releases_charge_without_any_key(tmp_path):
    """MEDIUM (SQLite file, no key). The events are looked up by ``charge_id`` only and never compared with the
    charge row: the owner of the file (guard trigger dropped and recreated) moves release K2's committed charge
    under key K1 (and K1's own out of the way). K2's events authenticate it, so K1's replay publishes K2's output
    (another release's numbers, another spec's) as K1's. Fix: compare the events' account, release key
    (dag_id, run_id, task_id, map_index, release_name), attempt, amount, delta_amount, mechanisms and spec_hash with
    the charge row, and the ``reserved`` event's ``token_hash`` with the charge's."""
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


def test_attack_reserve_returns_an_output_the_second_authentication_never_sees(tmp_path, monkeypatch):
    """LOW-MEDIUM (SQLite file owner, no key, a race). ``run_release`` publishes
    ``ledger.authenticated_output(key) or reservation``: when ``reserve`` returns a stored output but the second
    authentication finds no committed charge, the unauthenticated ``reserve`` dict is published. The owner of the
    file inserts a committed charge (no events) for a key about to run, after the first authentication and before
    ``reserve``, and deletes it (guard trigger dropped) before the second; the timing is simulated by wrapping
    ``reserve``. (On PostgreSQL a committed row cannot be deleted or un-committed.) Fix: on a dict from
    ``reserve``, publish only what ``authenticated_output`` returns and raise :class:`AuditChainError` when it
    returns ``None`` (or authenticate inside ``reserve``'s transaction, from the same rows)."""
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


def test_attack_null_output_with_the_digest_of_nothing_raises_a_type_error_not_audit_chain_error(tmp_path):
    """LOW. ``authenticated_output`` hashes ``charge.output or ""``: a committed charge with a NULL output whose
    committed event records SHA-256("") passes the digest check and ``json.loads(None)`` raises ``TypeError`` (not
    the documented :class:`AuditChainError`; nothing is published). Reached by the legacy-event hole above with no
    key. Fix: refuse a NULL output explicitly (AuditChainError)."""
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


# -- legitimate replays -----------------------------------------------------------------------------------------------


def test_legit_replay_after_a_spend_key_rotation_by_ledger_apply(ledger_url):
    """MEDIUM (availability; DESIGN.md 2.2). ``dpctl ledger apply`` with a new spend key (a rotation) makes every
    account accept only the new key, so the workers get the new key; a retry or a cleared task of a release
    committed before the rotation then replays through ``authenticated_output``, whose events carry the old key id:
    ``LedgerKeyError``, for ever (the connection holds one key, and ``reserve`` needs the new one). Before the change
    ``stored_output`` replayed it. Fix: let the ledger connection hold retired spend keys for checking only (a
    ``Keyring``, as ``verify`` takes), or have the rotation's governor-signed ``account_updated`` event vouch for
    the chain head it rotates at, and accept old-key events up to that sequence number."""
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


def test_legit_replay_of_a_release_committed_under_schema_1(ledger_url):
    """LOW-MEDIUM (availability of old ledgers). A schema-1 ledger had no audit log: its committed charges have no
    events. ``verify`` accepts them (they predate the governor-signed ``account_migrated`` event), but
    ``authenticated_output`` finds 0 ``reserved`` and 0 ``committed`` events and raises ``AuditChainError``, so a
    rerun of such a release no longer replays. Fix: accept a charge without events when its id is at most the
    ``last_charge`` of the account's first (``account_migrated``) event, as verify does, checking the digest the
    migration records if any; refuse otherwise."""
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


def _version_2_ledger(url: str) -> dict:
    """A schema-2 ledger (as tests/ledger/test_audit.py builds one): account 'a', KEY committed, chain unkeyed."""
    engine = sa.create_engine(url)
    v2 = old_schema_metadata(2)
    v2.create_all(engine)
    now = dt.datetime.now(dt.timezone.utc)
    stored = {"accountant": "pure_dp", "cap": "10", "delta": None, "privacy_unit": "person",
              "allowed_dags": json.dumps(["d"])}
    output = {"release": "rel", "spec_hash": SPEC_HASH, "value": 1}
    text = canonical_json(output)
    digest = hashlib.sha256(text.encode()).hexdigest()
    chain = {"seq": 0, "head": GENESIS_HASH, "spent": Fraction(0)}
    events = v2.tables["dp_audit_events"]

    def append(conn, **fields):
        values = {name: None for name in schema.LEGACY_HASHED_COLUMNS}
        values.update(fields)
        chain["seq"] += 1
        values.update(account="a", account_seq=chain["seq"], spent_after=str(chain["spent"]), delta_spent_after="0",
                      context=canonical_json({"host": "old"}), prev_hash=chain["head"],
                      created_at=timestamp_text(dt.datetime.now(dt.timezone.utc)))
        values["row_hash"] = chain["head"] = legacy_row_hash(values)
        conn.execute(events.insert().values(**values))

    charge = {"charge_id": 1, **KEY.as_dict(), "attempt": 1, "try_number": None, "spec_hash": SPEC_HASH,
              "amount": "1/4", "delta_amount": "0", "mechanisms": "[]"}
    with engine.begin() as conn:
        conn.execute(v2.tables["dp_schema_version"].insert().values(version=2, applied_at=now))
        conn.execute(v2.tables["dp_budget_accounts"].insert().values(
            name="a", spent="0", delta_spent="0", audit_seq=0, owner=None, description=None, config="{}",
            created_at=now, updated_at=now, **stored))
        append(conn, event="account_created", details=canonical_json({"stored": stored}))
        conn.execute(v2.tables["dp_charges"].insert().values(
            account="a", attempt=1, state="committed", amount="1/4", delta_amount="0", mechanisms="[]",
            spec_hash=SPEC_HASH, context=canonical_json({"host": "old"}), output=text, output_digest=digest,
            created_at=now, updated_at=now, **KEY.as_dict()))
        chain["spent"] = Fraction(1, 4)
        append(conn, event="reserved", **charge)
        append(conn, event="committed", output_digest=digest, **charge)
        conn.execute(v2.tables["dp_budget_accounts"].update().values(
            spent="1/4", audit_seq=chain["seq"], audit_head=chain["head"]))
    engine.dispose()
    return output


def test_a_schema_2_release_is_not_replayed_unauthenticated(ledger_url):
    """A schema-2 release (unkeyed events, no token) after ``dpctl ledger init`` upgrades the ledger: its events
    carry no MAC, exactly what an inserted forgery carries (see the legacy-events attack above), so a replay
    refuses it, charging nothing, and says why; ``verify`` still accepts the ledger."""
    _version_2_ledger(ledger_url)
    governor(ledger_url).init_schema()
    assert governor(ledger_url).verify().ok
    worker = spender(ledger_url)
    spent = worker.account("a").spent
    with pytest.raises(LedgerKeyError, match="written before the ledger's chain was keyed"):
        release(worker)
    assert worker.account("a").spent == spent


def test_guard_replay_after_reconcile_and_a_takeover(ledger_url):
    """A dead attempt's reservation abandoned by ``reconcile`` (spend key) and by the governor's reconcile, then a
    later attempt commits: the replay authenticates the committing attempt's events only."""
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


def test_guard_replay_after_a_governance_change_and_a_released_attempt(ledger_url):
    """``dpctl ledger apply`` changing the cap (same spend key) appends governor-signed events between the
    charge's; an earlier attempt of the key released (noise never drawn): the replay still authenticates the
    committed attempt."""
    ledger = new_ledger(ledger_url)
    ledger.release(ledger.reserve(KEY, account="a", amount=Fraction(1), mechanisms=[], spec_hash=SPEC_HASH))
    first = release(ledger)
    governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=20)}))
    again = release(ledger)
    assert again.replayed and again.output == first.output


def test_guard_replay_racing_a_commit_publishes_the_committed_output(ledger_url, monkeypatch):
    """Try 2 starts while try 1 draws: the first authentication finds nothing, try 1 commits just before try 2's
    ``reserve``, which then returns the stored output; the second authentication checks it and it is published."""
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


def test_guard_edited_outputs_and_a_sql_commit_are_refused_on_postgresql_as_the_spender(ledger_url, request):
    """The attacks the change targets, as the PostgreSQL spender role / SQLite file with no key: a reserved charge
    committed by SQL (no token), a committed event's forged twin signed with the spend key but no token, and
    (SQLite, trigger dropped) an edited committed output: each replay refuses."""
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


# 2. NULLs in the columnar reader against the row reader: tests/release_engine/test_columnar_inputs.py


# ------------------------------------------------------------------------------------------------------------------
# 3. Rows-file refusals when the DAG is parsed
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def large_spec(tmp_path):
    from rows_files_support import rows_spec

    path = tmp_path / "rows.yaml"
    path.write_text(rows_spec("rows_review", "rows_account"))
    return path


def test_rows_files_templated_output_uri_still_refuses_csv_and_sql_sink_at_parse_time(large_spec):
    """LOW. ``__init__`` skips ``rows_files_problem`` entirely when ``output_uri`` is templated, although only the
    "no output_uri" refusal depends on it: ``output_formats`` with csv (the default is json+csv), a ``sql_sink``, or
    a mean over too many cells are refused only when the task runs (before the ledger: nothing is charged, but
    the DAG imports and the run fails). Fix: when ``output_uri`` is templated, call ``rows_files_problem`` with a
    placeholder output_uri (e.g. the template text itself), so every other refusal stays a DAG import error."""
    from dp_operators.operators.release import DPReleaseOperator

    with pytest.raises(ValueError, match="csv"):
        DPReleaseOperator(task_id="release", spec_path=large_spec, aggregates_uri="file:///in/cells.parquet",
                          output_uri="{{ var.value.release_root }}", output_formats=("json", "csv"),
                          inline_rows_limit=1000)


def test_rows_files_partial_expand_refused_at_parse_time(large_spec):
    """LOW. ``.partial(...).expand(...)`` never calls ``__init__`` while the DAG is parsed (Airflow builds the
    operator when a mapped instance runs), so a mapped release whose partial arguments (spec_path, output_formats
    with csv, no output_uri, a sql_sink, a bad inline_rows_limit) already rule out rows files imports fine and
    every mapped instance fails at run time. Fix: in ``DPReleaseOperator.partial``, when ``spec_path`` is a
    partial (not expanded) argument and none of output_uri / output_formats / sql_sink / inline_rows_limit is
    expanded, call ``check_inline_rows_limit`` and ``rows_files_problem`` with the partial values (defaults
    otherwise) and raise ``ValueError``."""
    import datetime

    from airflow.sdk import DAG as Dag

    from dp_operators.operators.release import DPReleaseOperator

    with pytest.raises(ValueError, match="csv"):
        with Dag("review_rows_partial", schedule=None, start_date=datetime.datetime(2026, 1, 1)):
            DPReleaseOperator.partial(task_id="release", spec_path=str(large_spec), output_uri="file:///out",
                                      output_formats=("json", "csv"), inline_rows_limit=1000).expand(
                aggregates_uri=["file:///in/a.parquet", "file:///in/b.parquet"])


def test_guard_rows_files_mapped_instance_refused_when_unmapped_before_the_ledger(large_spec):
    """Regression guard (passes): the mapped instance itself (what the task runner builds) is refused by
    ``__init__`` before anything runs, so nothing can be charged."""
    import datetime

    from airflow.sdk import DAG as Dag

    from dp_operators.operators.release import DPReleaseOperator

    with Dag("review_rows_unmap", schedule=None, start_date=datetime.datetime(2026, 1, 1)):
        # the formats are expanded, so parsing cannot know them: the instance is refused when built
        mapped = DPReleaseOperator.partial(task_id="release", spec_path=str(large_spec), output_uri="file:///out",
                                           aggregates_uri="file:///in/a.parquet", inline_rows_limit=1000).expand(
            output_formats=[("json", "csv")])
    with pytest.raises(ValueError, match="csv"):
        mapped.unmap({"output_formats": ("json", "csv")})


@pytest.mark.parametrize("arguments, match", [
    ({"output_uri": "file:///out", "output_formats": ("json", "csv")}, "csv"),
    ({"output_formats": ("json", "parquet")}, "no output_uri"),
    ({"output_uri": "file:///out", "output_formats": ("json", "parquet"), "sql_sink": "SINK"}, "SQL sink"),
])
def test_guard_rows_files_sql_release_operator_subclass_refused_at_parse_time(large_spec, arguments, match):
    """Regression guard (passes): ``DPSQLReleaseOperator`` passes its arguments to ``DPReleaseOperator.__init__``,
    so its rows-file refusals are DAG import errors too."""
    from dp_operators.operators.sinks import SQLTableSink
    from dp_operators.operators.sql import DPSQLReleaseOperator

    if arguments.get("sql_sink") == "SINK":
        arguments = {**arguments, "sql_sink": SQLTableSink(conn_id="warehouse", table="dp_releases")}
    with pytest.raises(ValueError, match=match):
        DPSQLReleaseOperator(task_id="release", spec_path=large_spec, conn_id="warehouse",
                             queries={"cells": "SELECT 1", "sums": "SELECT 1"}, inline_rows_limit=1000,
                             **arguments)
