"""``verify_ledger``: the replay of the ledger's state machine, on ledgers written through the real API.

Forged rows below are written the way someone with write access to the database would (raw SQL, or the chain
code with a key they hold), then :func:`~dp_operators.ledger.verify.verify_ledger` must name them. The tamper
suite, every attack with its outcome on both databases, is ``test_tamper.py``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
import time
import tracemalloc
from fractions import Fraction
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from dp_operators.ledger import (
    AuditKey,
    BudgetExhaustedError,
    Keyring,
    LedgerConfig,
    Ledger,
    LedgerGovernor,
    LedgerKeyError,
    ReleaseKey,
    schema,
)
from dp_operators.ledger.chain import (
    GENESIS_HASH,
    audit_row_mac,
    canonical_json,
    charge_event_fields,
    legacy_row_hash,
    timestamp_text,
)
from dp_operators.ledger.spend import token_hash
from dp_operators.ledger.verify import verify_ledger
from ledger_backends import account_config, ledger_with, old_schema_metadata
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender

KEYS = Keyring([GOVERNOR_KEY, SPEND_KEY])
GOVERNOR_IDS = {GOVERNOR_KEY.key_id}
CONFIG = LedgerConfig(
    version=1,
    accounts={"a": account_config("pure_dp", cap=1), "b": account_config("approx_dp", cap=1, delta="1e-6")},
)


def key(run: str, dag: str = "d") -> ReleaseKey:
    return ReleaseKey(dag, run, "t", -1, "r")


def spend(ledger, run: str, amount, account: str = "a", **kwargs):
    return ledger.reserve(key(run), account=account, amount=Fraction(amount), mechanisms=[{"mechanism": "m"}],
                          spec_hash="0" * 64, **kwargs)


def history(url: str) -> SimpleNamespace:
    """Two accounts with charges in every state, written through the API: committed, released (with a delta),
    refused, abandoned by a later attempt after its lease expired, abandoned by the officer's reconcile, and one
    live reservation."""
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(CONFIG)
    worker = spender(url)
    for run in ("r1", "r2"):
        worker.commit(spend(worker, run, "1/10"), {"value": run})
    worker.release(spend(worker, "r3", "1/100", account="b", delta=Fraction(1, 10**7)))
    with pytest.raises(BudgetExhaustedError):
        spend(worker, "r4", 2, account="b")
    short = spender(url, lease_seconds=0.001)
    spend(short, "r5", "1/10")
    time.sleep(0.01)
    worker.commit(spend(worker, "r5", "1/10"), {"value": "r5 again"})  # takes the expired r5 over
    spend(short, "r6", "1/10", account="b")
    time.sleep(0.01)
    assert len(officer.reconcile()) == 1
    live = spend(worker, "r7", "1/10")
    return SimpleNamespace(officer=officer, worker=worker, live=live)


def check(url: str, keyring: Keyring | None = KEYS, governor_ids: set[str] | None = GOVERNOR_IDS, config=None):
    return verify_ledger(governor(url), keyring, config, governor_key_ids=governor_ids)


def one(url: str, query):
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(query).first()
    finally:
        engine.dispose()


def charge_row(url: str, run: str):
    return one(url, sa.select(schema.charges).where(schema.charges.c.run_id == run))


def run_sql(url: str, *statements: str, bypass_triggers: bool = False) -> None:
    """Run ``statements`` as the tables' owner; ``bypass_triggers`` as an owner who can get past the guard
    triggers (SQLite: drop them and re-create them exactly; PostgreSQL: a superuser's replica session role)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            if bypass_triggers and engine.dialect.name == "sqlite":
                for (name,) in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'").all():
                    conn.exec_driver_sql(f"DROP TRIGGER {name}")
            elif bypass_triggers:
                conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            for statement in statements:
                conn.exec_driver_sql(statement)
            if bypass_triggers and engine.dialect.name == "sqlite":
                for statement in schema.trigger_ddl("sqlite"):
                    conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def append(url: str, account: str, event: str, *, key: AuditKey | None, row_hash: str | None = None,
           **fields) -> int:
    """Append ``event`` at the next sequence number of ``account``'s chain with a consistent link and running
    totals (a reservation adds its amount, a release returns it), signed with ``key`` (``None``: an unkeyed
    schema-2 row), and move the account's head and totals as the ledger would. Returns the new row's id."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            account_row = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == account)).one()
            spent, delta = Fraction(account_row.spent), Fraction(account_row.delta_spent)
            sign = {"reserved": 1, "released": -1}.get(event, 0)
            if sign:
                spent += sign * Fraction(fields.get("amount", "0"))
                delta += sign * Fraction(fields.get("delta_amount", "0"))
            values = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
            values.update(
                account=account, account_seq=account_row.audit_seq + 1, event=event, context="{}",
                created_at=timestamp_text(dt.datetime.now(dt.timezone.utc)),
                prev_hash=account_row.audit_head or GENESIS_HASH, spent_after=str(spent), delta_spent_after=str(delta),
                key_id=None if key is None else key.key_id,
            )
            values.update(fields)
            if row_hash is None:
                row_hash = legacy_row_hash(values) if key is None else audit_row_mac(values, key)
            values["row_hash"] = row_hash
            new_id = conn.execute(schema.audit_events.insert().values(**values)).inserted_primary_key[0]
            conn.execute(
                schema.accounts.update().where(schema.accounts.c.name == account).values(
                    audit_seq=values["account_seq"], audit_head=row_hash, spent=str(spent), delta_spent=str(delta)
                )
            )
            return new_id
    finally:
        engine.dispose()


def where(event_id: int) -> str:
    return f"dp_audit_events id={event_id} ("


# -- a ledger written through the API ----------------------------------------------------------------------------


def test_a_ledger_written_through_the_api_verifies_with_every_event_authenticated(ledger_url):
    history(ledger_url)
    report = check(ledger_url)
    assert report.ok, report.problems
    assert report.authenticated
    engine = sa.create_engine(ledger_url)
    with engine.connect() as conn:
        counts = [conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()
                  for table in (schema.audit_events, schema.accounts, schema.charges)]
        heads = dict(conn.execute(sa.select(schema.accounts.c.name, schema.accounts.c.audit_head)).all())
        events = [row.event for row in conn.execute(sa.select(schema.audit_events.c.event))]
    engine.dispose()
    assert [report.events, report.accounts, report.charges] == counts
    assert report.heads == heads
    assert {"committed", "released", "refused", "abandoned", "reserved", "account_created"} <= set(events)
    # the same through the governor's own entry point (its keys by default)
    assert governor(ledger_url).verify().ok


def test_without_a_keyring_every_check_but_authenticity_runs(ledger_url):
    history(ledger_url)
    # a well-formed row claiming the spend key, with a MAC made up without it
    forged = append(ledger_url, "a", "refused", key=SPEND_KEY, row_hash="f" * 64, dag_id="d", amount="1")
    unauthenticated = check(ledger_url, keyring=None)
    assert unauthenticated.ok and not unauthenticated.authenticated
    report = check(ledger_url)
    assert report.problems[0].startswith(where(forged))
    assert "MAC does not match" in report.problems[0]
    # an unkeyed row after the chain was keyed is caught even without keys
    legacy = append(ledger_url, "b", "refused", key=None, dag_id="d", amount="1")
    problems = check(ledger_url, keyring=None).problems
    assert problems[0].startswith(where(legacy)) and "has no key" in problems[0]


def test_a_key_missing_from_the_keyring_names_the_first_row_it_signed(ledger_url):
    history(ledger_url)
    report = check(ledger_url, keyring=Keyring([GOVERNOR_KEY]))
    first_spend = one(ledger_url, sa.select(sa.func.min(schema.audit_events.c.id)).where(
        schema.audit_events.c.key_id == SPEND_KEY.key_id))[0]
    assert report.problems[0].startswith(where(first_spend))
    assert f"signed with key id {SPEND_KEY.key_id!r}, which is not in the keyring" in report.problems[0]


def test_governance_signed_with_the_spend_key_is_caught_once_the_governor_key_is_known(ledger_url):
    history(ledger_url)
    before = one(ledger_url, sa.select(sa.func.max(schema.audit_events.c.id)))[0]
    raised = LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=100)})
    with pytest.raises(LedgerKeyError, match="is the spend key of account"):
        LedgerGovernor(ledger_url, governor_key=SPEND_KEY).apply_config(raised)
    unchecked = LedgerGovernor(ledger_url, governor_key=SPEND_KEY)  # the attacker's own copy, checks removed
    unchecked._check_governor_key = lambda *args: None
    unchecked.apply_config(raised)
    report = check(ledger_url)
    assert report.problems[0].startswith(where(before + 1))
    assert "a governance event signed with key id" in report.problems[0] and "not a governor key" in report.problems[0]
    # without knowing which key is the governor's, any key of the keyring may sign anything
    assert check(ledger_url, governor_ids=None).ok


def test_spend_key_rotation_is_a_governance_event(ledger_url):
    history(ledger_url)
    new_key = AuditKey.from_text("rotated-spend-key-" + "n" * 40)
    LedgerGovernor(ledger_url, governor_key=GOVERNOR_KEY, spend_key=new_key).apply_config(CONFIG)
    rotated = Ledger(ledger_url, audit_key=new_key)  # the workers' new key
    rotated.commit(spend(rotated, "after", "1/10"), {"value": 1})
    everything = Keyring([GOVERNOR_KEY, SPEND_KEY, new_key])
    assert check(ledger_url, keyring=everything).ok
    # a spend event signed with the retired key after the rotation
    forged = append(ledger_url, "a", "refused", key=SPEND_KEY, dag_id="d", amount="1")
    problems = check(ledger_url, keyring=everything).problems
    assert problems[0].startswith(where(forged))
    assert f"the account accepts spend key id {new_key.key_id!r}" in problems[0]


def test_problems_start_with_the_first_broken_audit_row(ledger_url):
    history(ledger_url)
    first = append(ledger_url, "b", "refused", key=SPEND_KEY, row_hash="e" * 64, dag_id="d", amount="1")
    second = append(ledger_url, "a", "refused", key=SPEND_KEY, row_hash="e" * 64, dag_id="d", amount="1")
    run_sql(ledger_url, "UPDATE dp_budget_accounts SET spent = '0' WHERE name = 'a'")
    problems = check(ledger_url).problems
    assert problems[0].startswith(where(first)) and problems[1].startswith(where(second))
    assert problems[2].startswith("dp_budget_accounts 'a': spent 0")
    assert "is below what its charges that were not released add up to" in problems[3]
    assert len(problems) == 4


# -- values that are not what their column holds: problems, never exceptions --------------------------------------


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        pytest.param(lambda url: run_sql(url, "UPDATE dp_budget_accounts SET spent = 'lots' WHERE name = 'a'"),
                     "dp_budget_accounts 'a': spent 'lots' is not a number", id="account spent"),
        pytest.param(lambda url: run_sql(url, "UPDATE dp_budget_accounts SET delta_spent = '1/0' WHERE name = 'b'"),
                     "dp_budget_accounts 'b': delta_spent '1/0' is not a number", id="account delta_spent"),
        pytest.param(lambda url: append(url, "a", "refused", key=SPEND_KEY, dag_id="d", amount="x"),
                     "amount 'x' is not a number", id="event amount"),
        pytest.param(lambda url: append(url, "a", "refused", key=SPEND_KEY, dag_id="d", spent_after="NaN"),
                     "spent_after 'NaN' is not a number", id="event spent_after"),
        pytest.param(lambda url: append(url, "a", "account_updated", key=GOVERNOR_KEY, details="{"),
                     "details is not JSON text", id="governance details"),
        pytest.param(lambda url: run_sql(url, "UPDATE dp_charges SET amount = 'ten' WHERE run_id = 'r1'",
                                         bypass_triggers=True),
                     "amount 'ten' is not a number", id="charge amount"),
    ],
)
def test_unreadable_values_are_problems_naming_their_row(ledger_url, tamper, expected):
    history(ledger_url)
    forged = tamper(ledger_url)
    problems = check(ledger_url, config=CONFIG).problems
    matching = [problem for problem in problems if expected in problem]
    assert matching, problems
    if forged is not None:
        assert matching[0].startswith(where(forged))
    elif expected.startswith("amount 'ten'"):
        assert matching[0].startswith(f"dp_charges id={charge_row(ledger_url, 'r1').id} (account 'a', d/r1/t/-1/r")


def test_an_unreadable_timestamp_on_sqlite_is_a_problem(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    history(url)
    charge_id = charge_row(url, "r2").id
    run_sql(url, "UPDATE dp_charges SET created_at = 'yesterday' WHERE run_id = 'r2'", bypass_triggers=True)
    problems = check(url).problems
    assert len(problems) == 1
    assert problems[0].startswith(f"dp_charges id={charge_id} (")
    assert "created_at holds 'yesterday', not a time" in problems[0]


# -- the per-account chain rules ------------------------------------------------------------------------------


def _over_cap(url):
    return append(url, "a", "reserved", key=SPEND_KEY, dag_id="d", amount="5", delta_amount="0", charge_id=999)


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        pytest.param(lambda url: append(url, "a", "renewed", key=SPEND_KEY), "unknown event 'renewed'",
                     id="unknown event"),
        pytest.param(lambda url: append(url, "a", "account_migrated", key=GOVERNOR_KEY, spent_after="0",
                                        details=json.dumps({"stored": {}})),
                     "'account_migrated' is legal only at the start of a chain", id="migration mid-chain"),
        pytest.param(lambda url: append(url, "a", "chain_keyed", key=GOVERNOR_KEY, details=json.dumps({"stored": {}})),
                     "'chain_keyed' is legal only right after the unkeyed", id="chain keyed twice"),
        pytest.param(_over_cap, "reserves 5 with only", id="reservation over the cap"),
        pytest.param(lambda url: append(url, "a", "reserved", key=SPEND_KEY, dag_id="other", amount="1/100",
                                        delta_amount="0", charge_id=999),
                     "reserves for DAG 'other', which the account did not allow", id="DAG not allowed"),
        pytest.param(lambda url: append(url, "a", "reserved", key=SPEND_KEY, dag_id="d", amount="-1/2",
                                        delta_amount="0", charge_id=999),
                     "a reservation must be > 0", id="negative reservation"),
        pytest.param(lambda url: append(url, "a", "reserved", key=SPEND_KEY, dag_id="d", amount="0",
                                        delta_amount="0", charge_id=999, attempt=2),
                     "0 only for the first attempt of a series step", id="a takeover reserving nothing"),
        pytest.param(lambda url: append(url, "a", "reserved", key=SPEND_KEY, dag_id="d", amount="0",
                                        delta_amount="0", charge_id=999, attempt=1, run_id="scheduled__1"),
                     "0 only for the first attempt of a series step", id="an ordinary release reserving nothing"),
        pytest.param(lambda url: append(url, "a", "reserved", key=SPEND_KEY, dag_id="d", amount="0",
                                        delta_amount="0", charge_id=999, attempt=1,
                                        run_id="__dp_series__/g0/step/000001"),
                     "but its step 0 was not committed with a charge", id="a free series step of an unpaid series"),
        pytest.param(lambda url: append(url, "a", "reserved", key=SPEND_KEY, dag_id="d", amount="1/100",
                                        delta_amount="0", charge_id=999, attempt=1,
                                        run_id="__dp_series__/g01/step/000000"),
                     "under the series prefix but no series step", id="a series step spelt another way"),
        pytest.param(lambda url: append(url, "a", "refused", key=SPEND_KEY, dag_id="d", spent_after="0"),
                     "spent_after 0 (delta 0) disagrees with the events before it", id="spend reset"),
    ],
)
def test_chain_rules(ledger_url, tamper, expected):
    history(ledger_url)
    forged = tamper(ledger_url)
    problems = check(ledger_url).problems
    assert problems[0].startswith(where(forged)), problems
    assert any(expected in problem for problem in problems if problem.startswith(where(forged))), problems


# -- the per-charge state machine ------------------------------------------------------------------------------


def _event_for(url: str, run: str, event: str, *, account: str | None = None, **fields) -> int:
    """A spend-key-signed event about the charge of ``run`` (by default in its own account's chain)."""
    charge = charge_row(url, run)
    return append(url, account or charge.account, event, key=SPEND_KEY, **{**charge_event_fields(charge), **fields})


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        pytest.param(lambda url: _event_for(url, "r1", "released", proof="x"), "'released' after 'committed'",
                     id="released after committed"),
        pytest.param(lambda url: _event_for(url, "r1", "reserved", token_hash="0" * 64), "a second 'reserved'",
                     id="second reservation"),
        pytest.param(lambda url: _event_for(url, "r7", "abandoned", account="b"), "(an event in the wrong chain)",
                     id="event in the wrong chain"),
        pytest.param(lambda url: _event_for(url, "r7", "released", proof="guess"),
                     "its proof does not hash to the reservation's token_hash", id="release without the token"),
        pytest.param(lambda url: _event_for(url, "r7", "refused"), "a 'refused' event names charge id=",
                     id="refused naming a charge"),
        pytest.param(lambda url: _event_for(url, "r7", "abandoned", amount="1/1000"),
                     "amount differs from the 'reserved' event id=", id="event amount differs from the charge"),
        pytest.param(lambda url: append(url, "a", "abandoned", key=SPEND_KEY, charge_id=4242, dag_id="d",
                                        amount="1/10"),
                     "names charge id=4242, which has no dp_charges row", id="event for a missing charge"),
    ],
)
def test_charge_state_machine(ledger_url, tamper, expected):
    history(ledger_url)
    forged = tamper(ledger_url)
    problems = check(ledger_url).problems
    assert problems[0].startswith(where(forged)), problems
    assert expected in " ".join(p for p in problems if p.startswith(where(forged))), problems


@pytest.mark.parametrize(
    ("column", "value"),
    [("run_id", "'other'"), ("spec_hash", "'" + "1" * 64 + "'"), ("context", "'{}'"), ("token_hash", "'" + "2" * 64 + "'"),
     ("try_number", "7"), ("state", "'released'"), ("output", "'{\"value\":42}'")],
)
def test_each_charge_column_is_checked_against_its_events(ledger_url, column, value):
    history(ledger_url)
    charge = charge_row(ledger_url, "r1")
    run_sql(ledger_url, f"UPDATE dp_charges SET {column} = {value} WHERE id = {charge.id}", bypass_triggers=True)
    problems = check(ledger_url).problems
    assert problems[0].startswith(f"dp_charges id={charge.id} (account 'a', d/"), problems
    assert column in problems[0] or (column == "output" and "does not hash" in problems[0])


def test_a_charge_inserted_without_events_is_named(ledger_url):
    history(ledger_url)
    now = dt.datetime.now(dt.timezone.utc)
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        new_id = conn.execute(schema.charges.insert().values(
            account="a", dag_id="d", run_id="ghost", task_id="t", map_index=-1, release_name="r", attempt=1,
            state="reserved", amount="1/10", delta_amount="0", mechanisms="[]", spec_hash="0" * 64,
            created_at=now, updated_at=now)).inserted_primary_key[0]
    engine.dispose()
    problems = check(ledger_url).problems
    assert problems == [
        f"dp_charges id={new_id} (account 'a', d/ghost/t/-1/r, attempt 1): has no audit events in its "
        "account's chain (inserted outside the ledger)",
        "dp_budget_accounts 'a': spent 1/2 (delta 0) is below what its charges that were not released add up to, "
        "3/5 (delta 0): spend was returned without its charge, or a charge's state or amount was changed",
    ]


@pytest.mark.parametrize("charge_id", [None, "the reservation's"], ids=["charge_id NULL", "another charge's id"])
def test_a_released_event_that_returns_spend_without_its_charge_is_detected(ledger_url, charge_id):
    """A spend-key-signed 'released' that lowers the running totals, then more spend, is detected. The
    chain's own arithmetic is consistent; the charge rows are not."""
    from dp_operators.ledger.chain import AccountChain, audit_context

    ledger = ledger_with(ledger_url, c=account_config("pure_dp", cap=1))
    ledger.commit(ledger.reserve(ReleaseKey("d", "one", "t", -1, "r"), account="c", amount=Fraction(1),
                                 mechanisms=[], spec_hash="0" * 64), {"v": 1})
    committed = [c for c in ledger.charges(account="c")][0]
    with ledger.engine.begin() as conn:
        chain = AccountChain.lock(conn, "c", SPEND_KEY)
        chain.spent -= 1
        chain.append(conn, "released", audit_context(), amount=Fraction(1), delta_amount=Fraction(0),
                     charge_id=None if charge_id is None else committed["id"])
        chain.flush(conn)
    ledger.commit(ledger.reserve(ReleaseKey("d", "two", "t", -1, "r"), account="c", amount=Fraction(1),
                                 mechanisms=[], spec_hash="0" * 64), {"v": 2})
    problems = check(ledger_url).problems
    assert any("dp_budget_accounts 'c': spent 1 (delta 0) is below what its charges that were not released add up "
               "to, 2" in problem for problem in problems), problems
    assert "seq 4, released)" in problems[0]  # the forged row is named first


# -- accounts and the configuration -----------------------------------------------------------------------------


def test_account_rows_are_compared_with_the_chain_and_an_optional_configuration(ledger_url):
    history(ledger_url)
    assert check(ledger_url, config=CONFIG).ok
    other = LedgerConfig(version=1, accounts={
        "a": account_config("pure_dp", cap=2), "z": account_config("pure_dp", cap=1)})
    problems = check(ledger_url, config=other).problems
    assert problems == [
        "dp_budget_accounts 'a': differs from the given configuration: cap '1' (configuration: '2')",
        "account 'z' is in the given configuration but not in the ledger ('dpctl ledger apply')",
    ]
    run_sql(ledger_url, "UPDATE dp_budget_accounts SET allowed_dags = '[\"d\", \"evil\"]', audit_seq = 99 "
                        "WHERE name = 'a'")
    problems = check(ledger_url).problems
    assert problems[0].startswith("dp_budget_accounts 'a': chain head is seq 99")
    assert problems[1].startswith("dp_budget_accounts 'a': allowed_dags differs from the last governance event")


# -- upgraded ledgers ---------------------------------------------------------------------------------------------


def _v2_ledger(url: str) -> None:
    """A schema-2 ledger as that version wrote it: no keys, plain SHA-256 chains; one account with a committed
    and a released charge."""
    v3_only = {"dp_budget_accounts": {"spend_key_id"}, "dp_charges": {"token_hash", "lease_expires_at"},
               "dp_audit_events": {"token_hash", "proof", "key_id"}}
    metadata = sa.MetaData()
    for table in (schema.schema_version, schema.accounts, schema.charges, schema.audit_events):
        sa.Table(table.name, metadata, *[c._copy() for c in table.columns if c.name not in v3_only.get(table.name, ())])
    engine = sa.create_engine(url)
    metadata.create_all(engine)
    now = dt.datetime.now(dt.timezone.utc)
    stored = {"accountant": "pure_dp", "cap": "1", "delta": None, "privacy_unit": "person",
              "allowed_dags": json.dumps(["d"])}
    with engine.begin() as conn:
        conn.execute(metadata.tables["dp_schema_version"].insert().values(version=2, applied_at=now))
        conn.execute(metadata.tables["dp_budget_accounts"].insert().values(
            name="a", spent="0", delta_spent="0", audit_seq=0, created_at=now, updated_at=now, config=None, **stored))
        head, seq, spent = GENESIS_HASH, 0, Fraction(0)
        events = [("account_created", None, {"details": json.dumps({"stored": stored})})]
        for run, final in (("old1", "committed"), ("old2", "released")):
            output = canonical_json({"value": run})
            charge_id = conn.execute(metadata.tables["dp_charges"].insert().values(
                account="a", dag_id="d", run_id=run, task_id="t", map_index=-1, release_name="r", attempt=1,
                state=final, amount="1/10", delta_amount="0", mechanisms="[]", spec_hash="0" * 64, context="{}",
                output=output if final == "committed" else None,
                output_digest=hashlib.sha256(output.encode()).hexdigest() if final == "committed" else None,
                created_at=now, updated_at=now)).inserted_primary_key[0]
            fields = {"charge_id": charge_id, "dag_id": "d", "run_id": run, "task_id": "t", "map_index": -1,
                      "release_name": "r", "attempt": 1, "try_number": None, "spec_hash": "0" * 64,
                      "amount": "1/10", "delta_amount": "0", "mechanisms": "[]"}
            events.append(("reserved", +1, fields))
            digest = {"output_digest": hashlib.sha256(output.encode()).hexdigest()} if final == "committed" else {}
            events.append((final, -1 if final == "released" else 0, {**fields, **digest}))
        for event, sign, fields in events:
            seq += 1
            spent += (sign or 0) * Fraction(1, 10)
            values = {name: None for name in schema.LEGACY_HASHED_COLUMNS}
            values.update(account="a", account_seq=seq, event=event, context="{}", spent_after=str(spent),
                          delta_spent_after="0", created_at=timestamp_text(now), prev_hash=head)
            values.update(fields)
            values["row_hash"] = head = legacy_row_hash(values)
            conn.execute(metadata.tables["dp_audit_events"].insert().values(**values))
        conn.execute(metadata.tables["dp_budget_accounts"].update().values(
            spent=str(spent), audit_seq=seq, audit_head=head))
    engine.dispose()


def test_a_schema_2_chain_is_legal_as_a_prefix_closed_by_chain_keyed(ledger_url):
    _v2_ledger(ledger_url)
    officer = governor(ledger_url)
    officer.init_schema()
    worker = spender(ledger_url)
    worker.commit(spend(worker, "new", "1/10"), {"value": 1})
    report = check(ledger_url)
    assert report.ok, report.problems
    events = [(row.event, row.key_id) for row in
              sa.create_engine(ledger_url).connect().execute(sa.select(schema.audit_events).order_by("id"))]
    assert events[5] == ("chain_keyed", GOVERNOR_KEY.key_id) and all(k is None for _, k in events[:5])
    # rewriting the unkeyed prefix consistently (row and hash) breaks the link the governor signed
    last_legacy = one(ledger_url, sa.select(schema.audit_events).where(schema.audit_events.c.account_seq == 5))
    rewritten = {**last_legacy._mapping, "created_at": "2000-01-01T00:00:00.000000+00:00"}
    run_sql(ledger_url, f"UPDATE dp_audit_events SET created_at = '{rewritten['created_at']}', "
                        f"row_hash = '{legacy_row_hash(rewritten)}' WHERE id = {last_legacy.id}",
            bypass_triggers=True)
    problems = check(ledger_url, keyring=None).problems
    keyed = one(ledger_url, sa.select(schema.audit_events.c.id).where(schema.audit_events.c.event == "chain_keyed"))
    assert problems[0].startswith(where(keyed.id)) and "prev_hash does not match" in problems[0], problems


def test_charges_before_a_schema_1_migration_need_no_events(ledger_url):
    metadata = old_schema_metadata(1)
    engine = sa.create_engine(ledger_url)
    metadata.create_all(engine)
    now = dt.datetime.now(dt.timezone.utc)
    with engine.begin() as conn:
        conn.execute(metadata.tables["dp_schema_version"].insert().values(version=1, applied_at=now))
        conn.execute(metadata.tables["dp_budget_accounts"].insert().values(
            name="a", accountant="pure_dp", cap="1", spent="3/10", delta=None, privacy_unit="person",
            allowed_dags=json.dumps(["d"]), created_at=now, updated_at=now))
        for run, state in (("old1", "committed"), ("old2", "reserved")):
            conn.execute(metadata.tables["dp_charges"].insert().values(
                account="a", dag_id="d", run_id=run, task_id="t", map_index=-1, release_name="r", attempt=1,
                state=state, amount="3/20", mechanisms="[]", spec_hash="0" * 64, created_at=now, updated_at=now))
    engine.dispose()
    governor(ledger_url).init_schema()
    worker = spender(ledger_url)
    worker.commit(spend(worker, "old2", "1/10"), {"value": 1})  # abandons the old reservation, charges anew
    report = check(ledger_url)
    assert report.ok, report.problems
    assert report.charges == 3


# -- streaming ------------------------------------------------------------------------------------------------------


def bulk_charges(url: str, count: int, first_run: int = 0) -> None:
    """Write ``count`` committed charges on account 'a' directly, each with its signed ``reserved`` and
    ``committed`` events, as the ledger would (fast: one transaction)."""
    engine = sa.create_engine(url)
    now = dt.datetime.now(dt.timezone.utc)
    context = canonical_json({"host": "h", "package_version": "0", "pid": 1})
    with engine.begin() as conn:
        account = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == "a")).one()
        seq, head, spent = account.audit_seq, account.audit_head, Fraction(account.spent)
        next_id = (conn.execute(sa.select(sa.func.max(schema.charges.c.id))).scalar() or 0) + 1
        charges, events = [], []
        for number in range(first_run, first_run + count):
            token = f"token-{number}"
            output = canonical_json({"value": number})
            digest = hashlib.sha256(output.encode()).hexdigest()
            fields = dict(dag_id="d", run_id=f"bulk-{number}", task_id="t", map_index=-1, release_name="r",
                          attempt=1, try_number=1, spec_hash="0" * 64, amount="1/100000", delta_amount="0",
                          mechanisms="[]")
            charges.append(dict(id=next_id, account="a", state="committed", context=context, output=output,
                                output_digest=digest, token_hash=token_hash(token), created_at=now, updated_at=now,
                                **fields))
            for event in ("reserved", "committed"):
                seq += 1
                if event == "reserved":
                    spent += Fraction(1, 100000)
                row = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
                row.update(fields, account="a", account_seq=seq, event=event, charge_id=next_id,
                           spent_after=str(spent), delta_spent_after="0", context=context,
                           created_at=timestamp_text(now), key_id=SPEND_KEY.key_id, prev_hash=head)
                if event == "reserved":
                    row["token_hash"] = token_hash(token)
                else:
                    row.update(proof=token, output_digest=digest)
                row["row_hash"] = head = audit_row_mac(row, SPEND_KEY)
                events.append(row)
            next_id += 1
        conn.execute(schema.charges.insert(), charges)
        conn.execute(schema.audit_events.insert(), events)
        conn.execute(schema.accounts.update().where(schema.accounts.c.name == "a").values(
            spent=str(spent), audit_seq=seq, audit_head=head))
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT setval(pg_get_serial_sequence('dp_charges', 'id'), "
                                 "(SELECT max(id) FROM dp_charges))")
    engine.dispose()


def _peak_bytes(url: str) -> int:
    tracemalloc.start()
    try:
        report = check(url)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.ok, report.problems[:3]
    return peak


@pytest.mark.slow
def test_verify_memory_does_not_grow_with_the_number_of_charges(ledger_url):
    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=1)}))
    bulk_charges(ledger_url, 1500)
    small = _peak_bytes(ledger_url)
    bulk_charges(ledger_url, 6000, first_run=1500)
    large = _peak_bytes(ledger_url)
    assert large < 1.3 * small, (small, large)


def test_verify_reads_one_snapshot_while_workers_spend(ledger_url):
    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=1)}))
    bulk_charges(ledger_url, 3000)
    stop = threading.Event()
    failures: list[BaseException] = []

    def keep_spending() -> None:
        worker = spender(ledger_url)
        number = 0
        try:
            while not stop.is_set():
                worker.commit(spend(worker, f"live-{number}", "1/100000"), {"value": number})
                number += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test
            failures.append(error)

    thread = threading.Thread(target=keep_spending)
    thread.start()
    try:
        reports = [check(ledger_url) for _ in range(2)]
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    for report in reports:
        assert report.ok, report.problems[:5]
    assert check(ledger_url).charges > 3000


def fraction_parses(monkeypatch, poison: str) -> list[str]:
    """The texts holding ``poison`` that ``Fraction`` is asked to parse from now on; each gets 0 back at once, so a
    parse that would never return is recorded instead of hanging the test."""
    parsed: list[str] = []
    original = Fraction.__new__

    def spy(cls, numerator=0, *args, **kwargs):
        if isinstance(numerator, str) and poison in numerator:
            parsed.append(numerator)
            return original(cls, 0)
        return original(cls, numerator, *args, **kwargs)

    monkeypatch.setattr(Fraction, "__new__", staticmethod(spy))
    return parsed


def largest_fraction_sum(monkeypatch) -> list[int]:
    """A one-item list holding, from now on, the largest denominator of any sum of two ``Fraction``s."""
    largest = [1]
    add, radd = Fraction.__add__, Fraction.__radd__

    def record(result):
        if isinstance(result, Fraction):
            largest[0] = max(largest[0], result.denominator)
        return result

    monkeypatch.setattr(Fraction, "__add__", lambda a, b: record(add(a, b)))
    monkeypatch.setattr(Fraction, "__radd__", lambda a, b: record(radd(a, b)))
    return largest


def test_the_problem_list_keeps_the_first_broken_rows_and_counts_the_rest():
    from dp_operators.ledger.verify import _Problems

    problems = _Problems(limit=3)
    for event_id in (9, 8, 7, 6, 5, 4, 3):
        problems.row(event_id, f"row {event_id}")
    problems.add("account")
    assert problems.ordered() == ["row 3", "row 4", "row 5", "... and 5 more problems not listed"]


@pytest.mark.parametrize("column", ["spent", "cap"])
def test_a_number_that_would_take_for_ever_to_parse_is_named_not_parsed(ledger_url, column, monkeypatch):
    """A stored number not in the ledger's form is named and never handed to ``Fraction`` (which never returns)."""
    from dp_operators.ledger import AuditChainError

    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE dp_budget_accounts SET {column} = '0e-999999999' WHERE name = 'a'")
    engine.dispose()
    parsed = fraction_parses(monkeypatch, "0e-999999999")
    with pytest.raises(AuditChainError, match=f"{column} (is )?'0e-999999999',? (is )?not "):
        if column == "spent":
            ledger.reserve(ReleaseKey("d", "r", "t", -1, "r"), account="a", amount=Fraction(1, 10), mechanisms=[],
                           spec_hash="0" * 64)
        else:
            ledger.account("a")
    problems = check(ledger_url).problems
    assert any("dp_budget_accounts 'a'" in problem and f"{column} '0e-999999999'" in problem for problem in problems)
    assert parsed == []


def test_json_nested_deeper_than_the_parser_is_a_problem_not_a_crash(ledger_url):
    history(ledger_url)
    forged = append(ledger_url, "a", "account_updated", key=SPEND_KEY, details="[" * 200_000 + "]" * 200_000)
    problems = check(ledger_url).problems
    assert problems[0].startswith(where(forged)), problems[:2]
    assert any("details is not JSON text" in problem for problem in problems)


def test_charges_with_huge_denominators_neither_crash_nor_grow_an_exact_sum(ledger_url, monkeypatch):
    """300 charges of 1/<400-digit odd number> are all named, and verify never adds two such fractions."""
    # An exact sum would grow past Python's int-to-text limit, its denominator to 120,000 digits, and its time
    # quadratically; verify bounds it from below in integer units instead. Counted: the largest sum's denominator.
    history(ledger_url)
    now = dt.datetime.now(dt.timezone.utc)
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(schema.charges.insert(), [
            dict(account="a", dag_id="d", run_id=f"huge-{i}", task_id="t", map_index=-1, release_name="r", attempt=1,
                 state="abandoned", amount=f"1/{10**399 + 2 * i + 1}", delta_amount="0", mechanisms="[]",
                 spec_hash="0" * 64, created_at=now, updated_at=now)
            for i in range(300)])
    engine.dispose()
    largest = largest_fraction_sum(monkeypatch)
    problems = check(ledger_url).problems
    assert sum("has no audit events" in problem for problem in problems) == 300
    assert len(str(largest[0])) <= 401, f"a sum's denominator reached {len(str(largest[0]))} digits"


def test_a_governance_event_setting_the_cap_below_the_spend_is_named(ledger_url):
    history(ledger_url)
    spent = one(ledger_url, sa.select(schema.accounts.c.spent).where(schema.accounts.c.name == "a"))[0]
    stored = {"accountant": "pure_dp", "cap": "1/100", "delta": None, "privacy_unit": "person",
              "allowed_dags": json.dumps(["d"]), "spend_key_id": SPEND_KEY.key_id}
    forged = append(ledger_url, "a", "account_updated", key=GOVERNOR_KEY, details=json.dumps({"stored": stored}))
    run_sql(ledger_url, "UPDATE dp_budget_accounts SET cap = '1/100' WHERE name = 'a'")
    problems = check(ledger_url).problems
    assert problems[0].startswith(where(forged)) and f"below the {spent} already spent" in problems[0], problems
    assert any(f"spent {spent} exceeds the cap 1/100" in problem for problem in problems), problems
