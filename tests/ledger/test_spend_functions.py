"""The spend functions on PostgreSQL (docs/adr/0029): the spender role executes them and writes no table.

A ledger schema owned by ``postgres`` (the tables' owner); a spender role, a governor role, two team roles made
members of the spender (``team_a``, ``team_b``) and a login in each; accounts ``a`` (pure DP), ``b`` (approx DP)
and ``teamb`` (``allowed_roles: [team_b]``). Task code holding a spender login and the workers' spend key tries,
in raw SQL and through the functions with forged arguments, every write the ledger must not make; each is refused
by the database and changes nothing. The functions' arithmetic, JSON and MAC are checked against the Python path
(property tests), ``dpctl ledger verify`` passes on what they write, and a schema-3 ledger upgrades in place.
PostgreSQL cases skip when the server is unreachable and fail under ``CI=1`` (tests/ledger_backends.py). Roles are
cluster-wide: every role here has a unique name and is dropped afterwards.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dp_operators.accounting import round_down, round_up
from dp_operators.cli import app
from dp_operators.ledger import (
    AuditChainError,
    AuditKey,
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    LeaseHeldError,
    Ledger,
    LedgerConfig,
    LedgerGovernor,
    LedgerKeyError,
    ReleaseKey,
    Reservation,
    schema,
    store,
)
from dp_operators.ledger.chain import AUDIT_CONTEXT_KEYS, audit_row_mac, canonical_json, timestamp_text
from dp_operators.ledger.errors import RoleNotAllowedError, stored_fraction
from dp_operators.ledger.keys import GOVERNOR_KEY_ENV, SPEND_KEY_ENV
from dp_operators.ledger.pg_functions import FUNCTIONS, MAX_MECHANISMS_CHARS, SPEND_FUNCTIONS
from dp_operators.ledger.roles import LEDGER_SEQUENCES
from dp_operators.ledger.team_roles import apply_team_roles
from ledger_backends import account_config, drop_scratch
from old_ledgers import version_3_ledger
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender

TABLES = (schema.schema_version, schema.accounts, schema.charges, schema.audit_events)
INSUFFICIENT_PRIVILEGE = "42501"
#: Seconds after which a wait for an event counts as a hang (never the assertion itself).
HANG = 120


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def key(run: str, dag: str = "d") -> ReleaseKey:
    return ReleaseKey(dag, run, "t", -1, "r")


@dataclass
class Deployment:
    """A ledger schema owned by ``postgres``, with the ledger's roles, two teams and their logins."""

    database: sa.URL
    schema: str
    spender_role: str = field(default_factory=lambda: _unique("dp_sp"))
    governor_role: str = field(default_factory=lambda: _unique("dp_gov"))
    team_a: str = field(default_factory=lambda: _unique("team_a"))
    team_b: str = field(default_factory=lambda: _unique("team_b"))
    login_a: str = field(default_factory=lambda: _unique("login_a"))
    login_b: str = field(default_factory=lambda: _unique("login_b"))
    outsider: str = field(default_factory=lambda: _unique("dp_out"))
    engines: list[sa.Engine] = field(default_factory=list)
    raw_engines: dict[str, sa.Engine] = field(default_factory=dict)

    @property
    def roles(self) -> tuple[str, ...]:
        return (self.login_a, self.login_b, self.outsider, self.team_a, self.team_b, self.spender_role,
                self.governor_role)

    def url(self, role: str = "postgres") -> str:
        return (self.database.set(username=role).update_query_dict({"options": f"-csearch_path={self.schema}"})
                .render_as_string(hide_password=False))

    def raw(self, role: str = "postgres") -> sa.Engine:
        """A plain engine connected as ``role`` (one per role until :meth:`dispose`)."""
        if role not in self.raw_engines:
            self.raw_engines[role] = sa.create_engine(self.url(role))
        return self.raw_engines[role]

    def spender(self, role: str | None = None, **kwargs) -> Ledger:
        ledger = Ledger(self.url(role or self.spender_role), **{"audit_key": SPEND_KEY, **kwargs})
        self.engines += [ledger.engine, ledger._reader]
        return ledger

    def snapshot(self) -> dict[str, list[tuple]]:
        """Every row of every ledger table, as the owner reads it."""
        with self.raw().connect() as conn:
            return {table.name: [tuple(row) for row in conn.execute(sa.select(table).order_by(
                *table.primary_key.columns))] for table in TABLES}

    def dispose(self) -> None:
        for engine in [*self.engines, *self.raw_engines.values()]:
            engine.dispose()
        self.engines.clear()
        self.raw_engines.clear()


def _admin(database: sa.URL) -> sa.Engine:
    return sa.create_engine(database, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="module")
def deployment(pg_database: sa.URL) -> Iterator[Deployment]:
    """The schema initialised as ``postgres``; the ledger's roles and the team roles granted; accounts created by
    the governor role."""
    d = Deployment(pg_database, _unique("t_fn"))
    admin = _admin(pg_database)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{d.schema}"')
        for role in (d.spender_role, d.governor_role, d.outsider):
            conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
    admin.dispose()
    try:
        LedgerGovernor(d.url(), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY).init_schema()
        apply_team_roles(d.raw(), [d.team_a, d.team_b], d.spender_role, d.governor_role, create=True)
        admin = _admin(pg_database)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE ROLE "{d.login_a}" LOGIN IN ROLE "{d.team_a}"')
            conn.exec_driver_sql(f'CREATE ROLE "{d.login_b}" LOGIN IN ROLE "{d.team_b}"')
        admin.dispose()
        officer = LedgerGovernor(d.url(d.governor_role), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
        d.engines += [officer.engine, officer._reader]
        officer.apply_config(LedgerConfig(version=1, accounts={
            "a": account_config("pure_dp", cap=10),
            "b": account_config("approx_dp", cap=1, delta="1e-6"),
            "teamb": account_config("pure_dp", cap=10, allowed_roles=[d.team_b]),
        }))
        yield d
    finally:
        d.dispose()
        admin = _admin(pg_database)
        with admin.connect() as conn:
            drop_scratch(conn, d.schema, d.roles)
        admin.dispose()


@pytest.fixture(autouse=True)
def _close_connections(request) -> Iterator[None]:
    """Each test's connections are closed after it (the server's connection slots are shared)."""
    yield
    if "deployment" in request.fixturenames:
        request.getfixturevalue("deployment").dispose()


def refused(engine: sa.Engine, statement: str, params: dict | None = None) -> tuple[str, str]:
    """Run ``statement`` (raw SQL, or a ``SELECT`` with bind parameters ``params``) in its own transaction, rolled
    back; return ``(sqlstate, message)`` of the database's refusal, or ``("ALLOWED", "")``."""
    try:
        with engine.connect() as conn:
            with conn.begin() as transaction:
                if params is None:
                    conn.exec_driver_sql(statement.replace("%", "%%"))
                else:
                    conn.execute(sa.text(statement), params)
                transaction.rollback()
    except sa.exc.DBAPIError as error:
        return error.orig.sqlstate, str(error.orig).splitlines()[0]
    return "ALLOWED", ""


def call_sql(name: str) -> str:
    """``SELECT name(CAST(:arg AS type), ...)``: a spend function called by hand, every argument typed."""
    (function,) = [f for f in SPEND_FUNCTIONS if f.name == name]
    arguments = [arg.strip().split(" ", 1) for arg in function.args.split(",")]
    return f"SELECT {name}(" + ", ".join(f"CAST(:{n.removeprefix('p_')} AS {t})" for n, t in arguments) + ")"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def reserve_params(run: str, **changes) -> dict:
    """Valid arguments of ``dp_reserve`` (account ``a``, 1/10), with ``changes``."""
    return {"key": SPEND_KEY.secret, "account": "a", "windows": [], **key(run).as_dict(), "amount": "1/10", "takeover": "1/10", "delta": "0",
            "mechanisms": "[]", "spec_hash": "0" * 64, "try_number": None, "context": "{}",
            "token_hash": sha256("token"), "lease_seconds": 120.0, **changes}


def owner_params(reservation: Reservation, **changes) -> dict:
    """The owner's proof a function acting on ``reservation`` takes, with ``changes``."""
    return {"key": SPEND_KEY.secret, "charge_id": reservation.charge_id, "account": reservation.account,
            **reservation.key.as_dict(), "attempt": reservation.attempt, "token": reservation.token, **changes}


def reserve(ledger: Ledger, run: str, account: str = "a", amount: Fraction = Fraction(1, 10), **kwargs):
    return ledger.reserve(key(run), account=account, amount=amount, mechanisms=[], spec_hash="0" * 64, **kwargs)


def _first_column(table: sa.Table) -> str:
    return next(column.name for column in table.columns if not column.primary_key)


# ---- the spender writes no table ---------------------------------------------------------------------------------

#: Every write a spender might try on every ledger table (raw SQL).
TABLE_WRITES = [
    *[(f"insert into {t.name}", f"INSERT INTO {t.name} DEFAULT VALUES") for t in TABLES],
    *[(f"update {t.name}", f"UPDATE {t.name} SET {_first_column(t)} = {_first_column(t)}") for t in TABLES],
    *[(f"delete from {t.name}", f"DELETE FROM {t.name}") for t in TABLES],
    *[(f"truncate {t.name}", f"TRUNCATE {t.name}") for t in TABLES],
    *[(f"lock a row of {t.name}", f"SELECT 1 FROM {t.name} FOR UPDATE") for t in TABLES],
    *[(f"draw from {s}", f"SELECT nextval('{s}')") for s in LEDGER_SEQUENCES],
    *[(f"move {s}", f"SELECT setval('{s}', 10000)") for s in LEDGER_SEQUENCES],
    ("create a table in the ledger's schema", "CREATE TABLE dp_shadow (id int)"),
    ("shadow a helper in the ledger's schema",
     "CREATE FUNCTION dp_q_text(p_q text) RETURNS text LANGUAGE sql AS 'SELECT p_q'"),
]


@pytest.mark.parametrize("login", ["spender", "team login"])
def test_the_spender_role_writes_no_ledger_table(deployment, login):
    """Every INSERT, UPDATE, DELETE, TRUNCATE, row lock, sequence draw and CREATE of a spender login is refused."""
    role = deployment.spender_role if login == "spender" else deployment.login_a
    engine = deployment.raw(role)
    before = deployment.snapshot()
    outcomes = {action: refused(engine, statement) for action, statement in TABLE_WRITES}
    allowed = [action for action, (code, _) in outcomes.items() if code != INSUFFICIENT_PRIVILEGE]
    assert not allowed, {action: outcomes[action] for action in allowed}
    assert deployment.snapshot() == before


def test_the_spender_may_execute_the_spend_functions_and_no_helper(deployment):
    """EXECUTE: the six spend functions for the spender (and its team logins), none of the helpers; PUBLIC none."""
    with deployment.raw().connect() as conn:
        def may(role: str, signature: str) -> bool:
            return conn.execute(sa.text("SELECT has_function_privilege(:role, :fn, 'EXECUTE')"),
                                {"role": role, "fn": signature}).scalar()

        for function in FUNCTIONS:
            expected = function in SPEND_FUNCTIONS
            for role in (deployment.spender_role, deployment.login_a):
                assert may(role, function.signature) == expected, (role, function.signature)
            assert not may("public", function.signature) and not may(deployment.governor_role, function.signature)
    code, message = refused(deployment.raw(deployment.spender_role),
                            "SELECT dp_flush(a) FROM dp_budget_accounts AS a")
    assert (code, message) == (INSUFFICIENT_PRIVILEGE, "permission denied for function dp_flush")


def test_the_functions_are_security_definer_and_pin_their_search_path(deployment):
    """Spend functions run as the tables' owner with search_path pinned to the ledger's schema, then pg_temp."""
    with deployment.raw().connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT p.proname, p.prosecdef, p.proconfig, pg_get_userbyid(p.proowner) FROM pg_proc p "
            f"WHERE p.pronamespace = '\"{deployment.schema}\"'::regnamespace").all()
        assert schema.trigger_problems(conn) == []
    found = {name: (definer, config, owner) for name, definer, config, owner in rows}
    for function in FUNCTIONS:
        assert found[function.name] == (function.definer, [f'search_path={deployment.schema}, pg_temp'], "postgres")
    for trigger_function in ("dp_audit_append_only", "dp_rows_kept", "dp_charges_guard"):
        assert found[trigger_function][1] == [f"search_path={deployment.schema}, pg_temp"]


# ---- forged rows, through raw SQL and through the functions ------------------------------------------------------


def test_a_forged_chain_head_lowering_spent_is_refused(deployment):
    """A spend-key-signed head event stating spent 0, and the account row moved to it, are both refused."""
    ledger = deployment.spender()
    ledger.commit(reserve(ledger, "head-1"), {"value": 1})
    engine = deployment.raw(deployment.spender_role)
    before = deployment.snapshot()
    account = deployment.snapshot()["dp_budget_accounts"]
    row = dict(zip([c.name for c in schema.accounts.c], [r for r in account if r[0] == "a"][0]))
    forged = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
    forged.update(account="a", account_seq=row["audit_seq"] + 1, event="refused", dag_id="d", context="{}",
                  created_at=timestamp_text(dt.datetime.now(dt.timezone.utc)), spent_after="0",
                  delta_spent_after="0", key_id=SPEND_KEY.key_id, prev_hash=row["audit_head"])
    forged["row_hash"] = audit_row_mac(forged, SPEND_KEY)
    columns = ", ".join(forged)
    values = ", ".join("NULL" if v is None else str(v) if isinstance(v, int) else f"'{v}'" for v in forged.values())
    assert refused(engine, f"INSERT INTO dp_audit_events ({columns}) VALUES ({values})")[0] == INSUFFICIENT_PRIVILEGE
    assert refused(engine, f"UPDATE dp_budget_accounts SET spent = '0', audit_seq = audit_seq + 1, audit_head = "
                           f"'{forged['row_hash']}' WHERE name = 'a'")[0] == INSUFFICIENT_PRIVILEGE
    assert deployment.snapshot() == before
    assert ledger.account("a").spent == Fraction(row["spent"]) and reserve(ledger, "head-2").attempt == 1


def test_a_committed_release_key_never_gets_a_second_committed_charge(deployment):
    """After a commit: no raw insert, no reserve (it replays), no commit of an older attempt adds a committed
    charge."""
    short = deployment.spender(lease_seconds=0.05)
    stale = reserve(short, "twice")
    time.sleep(0.2)
    ledger = deployment.spender()
    taken_over = reserve(ledger, "twice")
    ledger.commit(taken_over, {"value": 2})
    before = deployment.snapshot()
    engine = deployment.raw(deployment.spender_role)
    insert = ("INSERT INTO dp_charges (account, dag_id, run_id, task_id, map_index, release_name, attempt, state, "
              "amount, mechanisms, spec_hash, output, created_at, updated_at) VALUES ('a', 'd', 'twice', 't', -1, "
              "'r', 9, 'committed', '1/10', '[]', '', '{\"value\":9}', now(), now())")
    assert refused(engine, insert)[0] == INSUFFICIENT_PRIVILEGE
    assert reserve(ledger, "twice") == {"value": 2}  # a replay: nothing charged
    with pytest.raises(ChargeStateError, match="is abandoned, no longer reserved"):
        short.commit(stale, {"value": 1})  # the zombie holds its own token: its charge is no longer reserved
    assert refused(engine, call_sql("dp_commit"), owner_params(
        stale, output='{"value":1}', defaults="{}", audit="{}"))[0] == "DPL03"
    assert deployment.snapshot() == before
    assert [c["state"] for c in ledger.charges(account="a") if c["run_id"] == "twice"] == ["abandoned", "committed"]


@pytest.mark.parametrize("action", ["commit", "release", "abandon", "renew"])
def test_another_workers_reservation_cannot_be_ended_or_renewed_without_its_token(deployment, action):
    """Another worker's reservation, known but for its token, cannot be committed, released, abandoned or renewed:
    not through the API, not by calling the function by hand, not by raw UPDATE."""
    owner = deployment.spender(deployment.login_a)
    victim = reserve(owner, f"victim-{action}")
    attacker = deployment.spender()
    engine = deployment.raw(deployment.spender_role)
    before = deployment.snapshot()
    stolen = dataclasses.replace(victim, token="guess")
    calls = {"commit": lambda: attacker.commit(stolen, {"value": 666}), "release": lambda: attacker.release(stolen),
             "abandon": lambda: attacker.abandon(stolen), "renew": lambda: attacker.renew(stolen)}
    with pytest.raises(ChargeStateError, match="is not this reservation's"):
        calls[action]()
    extra = {"commit": {"output": "{}", "defaults": "{}", "audit": "{}"}, "renew": {"lease_seconds": 3600.0}}.get(
        action, {"defaults": "{}", "audit": "{}"})
    for forged in ({"token": "guess"}, {"token": None}, {"token": "x" * 10_000}):
        assert refused(engine, call_sql(f"dp_{action}"), owner_params(victim, **extra, **forged))[0] == "DPL03"
    state = {"commit": "committed", "release": "released", "abandon": "abandoned", "renew": "reserved"}[action]
    assert refused(engine, f"UPDATE dp_charges SET state = '{state}', lease_expires_at = now() + interval '1 hour' "
                           f"WHERE id = {victim.charge_id}")[0] == INSUFFICIENT_PRIVILEGE
    assert deployment.snapshot() == before
    owner.commit(victim, {"value": 1})  # its owner still can


def test_another_reservations_lease_cannot_be_pushed_ahead(deployment):
    """A lease moves only by its owner's renewal, by at most MAX_LEASE_SECONDS: raw UPDATEs, renewals without the
    token and renewals past the bound are refused."""
    owner = deployment.spender()
    held = reserve(owner, "lease-push")
    engine = deployment.raw(deployment.spender_role)
    before = deployment.snapshot()
    for end in ("now() + interval '1 hour'", "'infinity'"):
        statement = f"UPDATE dp_charges SET lease_expires_at = {end} WHERE id = {held.charge_id}"
        assert refused(engine, statement)[0] == INSUFFICIENT_PRIVILEGE
    assert refused(engine, call_sql("dp_renew"), owner_params(held, token="guess", lease_seconds=60.0))[0] == "DPL03"
    for seconds in (3601.0, 10.0**9, 0.0, -1.0, math.nan, math.inf):
        assert refused(engine, call_sql("dp_renew"), owner_params(held, lease_seconds=seconds))[0] == "DPL06", seconds
    assert deployment.snapshot() == before


def test_the_database_stamps_time_and_caller(deployment):
    """created_at comes from the database clock and db_role from session_user, whatever the worker claims."""
    engine = deployment.raw(deployment.spender_role)
    insert = ("INSERT INTO dp_charges (account, dag_id, run_id, task_id, map_index, release_name, attempt, state, "
              "amount, mechanisms, spec_hash, created_at, updated_at) VALUES ('a', 'd', 'old', 't', -1, 'r', 1, "
              "'reserved', '1/10', '[]', '', '2000-01-01', '2000-01-01')")
    assert refused(engine, insert)[0] == INSUFFICIENT_PRIVILEGE
    ledger = deployment.spender(deployment.login_a)
    with deployment.raw().connect() as conn:
        start = conn.exec_driver_sql("SELECT clock_timestamp()").scalar()
    reservation = reserve(ledger, "stamped", audit={"db_role": "postgres", "user": "someone"})
    with deployment.raw().connect() as conn:
        end = conn.exec_driver_sql("SELECT clock_timestamp()").scalar()
    (charge,) = [c for c in ledger.charges(account="a") if c["id"] == reservation.charge_id]
    assert start < charge["created_at"] < end
    (event,) = [e for e in ledger.events("a") if e["charge_id"] == reservation.charge_id]
    assert event["created_at"] == timestamp_text(charge["created_at"])
    context = json.loads(event["context"])
    assert context["db_role"] == deployment.login_a and context["user"] == "someone"
    assert event["context"] == charge["context"] == canonical_json(context)


def test_squatting_the_next_audit_seq_or_ids_is_refused_and_reserves_go_on(deployment):
    """The spender can neither insert the next event of a chain nor move the id sequences; reserves still work."""
    engine = deployment.raw(deployment.spender_role)
    with deployment.raw().connect() as conn:
        seq = conn.exec_driver_sql("SELECT audit_seq FROM dp_budget_accounts WHERE name = 'a'").scalar()
    squat = ("INSERT INTO dp_audit_events (account, account_seq, event, spent_after, delta_spent_after, context, "
             f"created_at, prev_hash, row_hash) VALUES ('a', {seq + 1}, 'junk', '0', '0', '{{}}', 'x', 'x', 'x')")
    assert refused(engine, squat)[0] == INSUFFICIENT_PRIVILEGE
    for sequence in LEDGER_SEQUENCES:
        assert refused(engine, f"SELECT setval('{sequence}', nextval('{sequence}') + 1)")[0] == INSUFFICIENT_PRIVILEGE
    ledger = deployment.spender()
    ledger.commit(reserve(ledger, "after-squat"), {"value": 1})
    assert [e["account_seq"] for e in ledger.events("a")][-2:] == [seq + 1, seq + 2]


# ---- bounds on every input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"amount": "1" + "0" * 399}, id="a 400-digit amount"),
        pytest.param({"amount": "1" + "0" * 40}, id="a 41-digit amount"),
        pytest.param({"amount": "1/" + "1" + "0" * 18 + "1"}, id="a denominator over 10**18"),
        pytest.param({"amount": "-1/10"}, id="a negative amount"),
        pytest.param({"amount": "0", "takeover": "0"}, id="a zero amount and takeover amount"),
        pytest.param({"takeover": "0"}, id="a zero takeover amount"),
        pytest.param({"amount": "0"}, id="a zero amount outside a series step"),
        pytest.param({"amount": "0", "run_id": "__dp_series__/g0/step/000000"}, id="a zero amount at step 0"),
        pytest.param({"takeover": "-1/10"}, id="a negative takeover amount"),
        pytest.param({"amount": "2/20"}, id="not in lowest terms"),
        pytest.param({"amount": "1/0"}, id="a zero denominator"),
        pytest.param({"amount": "0.1"}, id="a decimal"),
        pytest.param({"amount": "1e-3"}, id="an exponent"),
        pytest.param({"amount": None}, id="no amount"),
        pytest.param({"delta": "-1/10"}, id="a negative delta"),
        pytest.param({"mechanisms": "[" * 17 + "]" * 17}, id="mechanisms nested 17 deep"),
        pytest.param({"mechanisms": '[{"a":' * 9 + "1" + "}]" * 9}, id="mechanisms nested 18 deep"),
        pytest.param({"mechanisms": "[" + ",".join(['"' + "m" * 1000 + '"'] * 70) + "]"}, id="mechanisms over 64 KiB"),
        pytest.param({"mechanisms": "[1,"}, id="mechanisms not JSON"),
        pytest.param({"mechanisms": "{}"}, id="mechanisms not a list"),
        pytest.param({"spec_hash": "0" * 65}, id="a long spec hash"),
        pytest.param({"token_hash": "not hex"}, id="a token hash that is not one"),
        pytest.param({"run_id": "r" * 251}, id="a long run id"),
        pytest.param({"map_index": None}, id="no map index"),
        pytest.param({"lease_seconds": 3601.0}, id="a lease over the maximum"),
        pytest.param({"lease_seconds": 0.0}, id="a zero lease"),
        pytest.param({"lease_seconds": math.nan}, id="a NaN lease"),
        pytest.param({"context": '{"host": {"nested": 1}}'}, id="a nested context value"),
        pytest.param({"context": '{"host": true}'}, id="a boolean context value"),
        pytest.param({"context": '{"pid": 1.5}'}, id="a fractional context value"),
        pytest.param({"context": '{"raw_value": 1}'}, id="a context key outside the list"),
        pytest.param({"context": json.dumps({"host": "h" * 1001})}, id="a long context value"),
        pytest.param({"context": "[]"}, id="a context that is not an object"),
        pytest.param({"context": '{"host": "\\u0000"}'}, id="a NUL in the context"),
    ],
)
def test_a_reservation_with_an_out_of_bounds_argument_is_refused_and_writes_nothing(deployment, changes):
    """Each argument is bounded (amount grammar and digits, JSON size and depth, text lengths, lease, context)."""
    engine = deployment.raw(deployment.spender_role)
    before = deployment.snapshot()
    code, message = refused(engine, call_sql("dp_reserve"), reserve_params("bounds", **changes))
    assert code == "DPL06", message
    assert deployment.snapshot() == before


def test_the_api_maps_bound_refusals_to_value_errors(deployment):
    """Through Ledger.reserve, amounts and mechanisms out of bounds raise ValueError and write nothing."""
    ledger = deployment.spender()
    before = deployment.snapshot()
    with pytest.raises(ValueError, match="out of bounds: at most 40 digits"):
        reserve(ledger, "api-bounds", amount=Fraction(10**399))
    deep: list = []
    for _ in range(20):
        deep = [deep]
    with pytest.raises(ValueError, match="mechanisms nests deeper than 16 levels"):
        ledger.reserve(key("api-bounds"), account="a", amount=Fraction(1, 10), mechanisms=deep, spec_hash="0" * 64)
    with pytest.raises(ValueError, match=f"mechanisms must be JSON text of at most {MAX_MECHANISMS_CHARS} characters"):
        ledger.reserve(key("api-bounds"), account="a", amount=Fraction(1, 10), mechanisms=[{"m": "x" * 70_000}],
                       spec_hash="0" * 64)
    assert deployment.snapshot() == before


def test_an_output_the_readers_would_refuse_is_not_committed(deployment):
    """A commit whose output is not JSON, or nests deeper than the readers accept, is refused (ValueError) and the
    reservation stays reserved; its owner then commits a readable output."""
    ledger = deployment.spender()
    held = reserve(ledger, "unreadable-output")
    before = deployment.snapshot()
    deep: dict = {"value": 1}
    for _ in range(70):
        deep = {"d": deep}
    with pytest.raises(ValueError, match="output nests deeper than 64 levels"):
        ledger.commit(held, deep)
    engine = deployment.raw(deployment.spender_role)
    for output in ('{"v": 1', "{\"v\": NaN}", "[" * 65 + "]" * 65):
        params = owner_params(held, output=output, defaults="{}", audit="{}")
        assert refused(engine, call_sql("dp_commit"), params)[0] == "DPL06", output
    assert deployment.snapshot() == before
    ledger.commit(held, {"value": 1})


def test_a_wrong_spend_key_is_refused_and_writes_nothing(deployment):
    """A key the account does not accept, or no key worth the name, is refused before anything is written."""
    ledger = deployment.spender()
    held = reserve(ledger, "wrong-key")
    reserve(deployment.spender(lease_seconds=0.05), "wrong-key-expired")
    time.sleep(0.2)
    before = deployment.snapshot()
    wrong = deployment.spender(audit_key=AuditKey.from_text("w" * 40))
    with pytest.raises(LedgerKeyError, match="accepts spend key id"):
        reserve(wrong, "wrong-key-2")
    with pytest.raises(LedgerKeyError, match="accepts spend key id"):
        wrong.commit(held, {"value": 1})  # even with the reservation's token
    with pytest.raises(LedgerKeyError, match="accepts spend key id"):
        wrong.reconcile()
    engine = deployment.raw(deployment.spender_role)
    assert refused(engine, call_sql("dp_reserve"), reserve_params("k", key=b"short"))[0] == "DPL02"
    assert refused(engine, call_sql("dp_reserve"), reserve_params("k", key=GOVERNOR_KEY.secret))[0] == "DPL02"
    assert deployment.snapshot() == before


@pytest.mark.parametrize("stored", ["0e-999999999", "1" * 61, "1/" + "3" * 61, "2/4", "-0", "5/1", "007", "1.5", ""])
def test_a_stored_total_the_ledger_never_writes_stops_reserves_with_the_same_message_on_both_paths(ledger_url, stored):
    """A running total edited into a number the ledger never writes is refused by reserve (AuditChainError, nothing
    written) with the message the Python reader gives, on SQLite (Python) and PostgreSQL (the functions)."""
    ledger = spender(ledger_url)
    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=1)}))
    engine = sa.create_engine(ledger_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.update(schema.accounts).values(spent=stored))
        with pytest.raises(AuditChainError) as refused_by_ledger:
            reserve(ledger, "edited")
        with pytest.raises(AuditChainError) as refused_by_reader:
            stored_fraction(stored, "budget account 'a': spent")
        assert str(refused_by_ledger.value) == str(refused_by_reader.value)
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(schema.charges)).scalar() == 0
    finally:
        engine.dispose()


# ---- team roles --------------------------------------------------------------------------------------------------


def test_a_team_login_is_refused_an_account_of_another_team_and_nothing_is_written(deployment):
    """On an account with allowed_roles [team_b], team A's login (and the bare spender) is refused with
    RoleNotAllowedError and no event; team B's login spends."""
    before = deployment.snapshot()
    for role in (deployment.login_a, deployment.spender_role):
        with pytest.raises(RoleNotAllowedError) as raised:
            reserve(deployment.spender(role), "team", account="teamb")
        assert (raised.value.account, raised.value.role, raised.value.allowed) == ("teamb", role, [deployment.team_b])
        message = str(raised.value)
        assert "'teamb'" in message and repr(role) in message and deployment.team_b in message
        assert "login role that is a member of one of those roles" in message
    assert deployment.snapshot() == before
    team_b = deployment.spender(deployment.login_b)
    reservation = reserve(team_b, "team", account="teamb")
    with pytest.raises(RoleNotAllowedError):  # even holding the token, team A cannot end team B's reservation
        deployment.spender(deployment.login_a).release(reservation)
    team_b.commit(reservation, {"value": 1})
    assert isinstance(reserve(deployment.spender(deployment.login_a), "team-a-own"), Reservation)  # no allowed_roles
    events = [e for e in team_b.events("teamb") if e["event"] != "account_created"]
    assert [(e["event"], json.loads(e["context"])["db_role"]) for e in events] == [
        ("reserved", deployment.login_b), ("committed", deployment.login_b)]


# ---- what the functions write verifies ---------------------------------------------------------------------------

#: Text a worker controls that reaches the MAC'd JSON: quotes, backslashes, controls, non-ASCII, separators.
HOSTILE = ['q"uo\\te', "line\nbreak\ttab\r\b\f", "\x01\x1f\x7f", "é ü 漢字 🎲", "\u2028\u2029", "}{\":,[]"]


def test_verify_passes_on_every_kind_of_event_the_functions_write(deployment):
    """Reserved, committed, released, abandoned (owner, takeover, reconcile) and refused events, with hostile
    text, written by a spender login through the functions, pass dpctl ledger verify (the SQL MAC is Python's)."""
    ledger = deployment.spender(deployment.login_a)
    short = deployment.spender(deployment.login_a, lease_seconds=0.05)
    for i, text in enumerate(HOSTILE):
        audit = {"triggering_user": text, "run_type": "manual", "pid": -i}
        reservation = ledger.reserve(ReleaseKey("d", f"run {text}", text, i, f"rel{text}"), account="a",
                                     amount=Fraction(1, 3 * 10**18 + i), mechanisms=[{"m": text, "n": [i, None]}],
                                     spec_hash=text, try_number=i, audit=audit)
        ledger.commit(reservation, {"value": text, "i": i}, audit={"user": text})
    ledger.release(reserve(ledger, "released", account="b", delta=Fraction(1, 10**7)))
    ledger.abandon(reserve(ledger, "abandoned"))
    reserve(short, "taken-over")
    reserve(short, "reconciled")
    time.sleep(0.2)
    reserve(ledger, "taken-over")
    assert "reconciled" in [c["run_id"] for c in ledger.reconcile()]
    with pytest.raises(DagNotAllowedError):
        ledger.reserve(key("refused", dag="other"), account="a", amount=Fraction(1, 10), mechanisms=[],
                       spec_hash="0" * 64)
    with pytest.raises(BudgetExhaustedError):
        reserve(ledger, "too-much", amount=Fraction(100))
    result = CliRunner().invoke(app, ["ledger", "verify", "--url", deployment.url()],
                                env={GOVERNOR_KEY_ENV: GOVERNOR_KEY.text, SPEND_KEY_ENV: SPEND_KEY.text})
    assert result.exit_code == 0, result.output
    for i, text in enumerate(HOSTILE):
        assert ledger.authenticated_output(ReleaseKey("d", f"run {text}", text, i, f"rel{text}")) == {
            "value": text, "i": i}


# ---- the SQL computes what the Python path computes --------------------------------------------------------------

TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strings=st.lists(TEXT, min_size=1, max_size=8))
@example(strings=["".join(chr(c) for c in range(1, 128))])
@example(strings=HOSTILE)
def test_sql_json_strings_escape_exactly_as_python_without_ensure_ascii(deployment, strings):
    """to_json(text)::text is json.dumps(text, ensure_ascii=False), for any text PostgreSQL can hold."""
    with deployment.raw().connect() as conn:
        found = conn.execute(sa.text("SELECT array_agg(to_json(s)::text ORDER BY n) FROM unnest(CAST(:s AS text[])) "
                                     "WITH ORDINALITY AS u(s, n)"), {"s": strings}).scalar()
    assert found == [json.dumps(s, ensure_ascii=False) for s in strings]


def _event_values() -> st.SearchStrategy[dict]:
    columns = {}
    for column in schema.audit_events.c:
        if column.name in ("id", "row_hash"):
            continue
        if column.type.python_type is int:
            columns[column.name] = st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))
        else:
            length = getattr(column.type, "length", None) or 60
            columns[column.name] = st.one_of(st.none(), TEXT.map(lambda s, n=length: s[:n]))
    return st.fixed_dictionaries(columns)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=_event_values(), secret=st.binary(min_size=32, max_size=100))
def test_the_sql_event_mac_is_audit_row_mac(deployment, values, secret):
    """dp_event_mac of any event row equals chain.audit_row_mac (HMAC-SHA256 of the same canonical JSON)."""
    with deployment.raw().connect() as conn:
        found = conn.execute(sa.text("SELECT dp_event_mac(jsonb_populate_record(NULL::dp_audit_events, "
                                     "CAST(:row AS jsonb)), CAST(:key AS bytea))"),
                             {"row": json.dumps(values), "key": secret}).scalar()
    assert found == audit_row_mac(values, AuditKey(secret))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(context=st.dictionaries(st.sampled_from(sorted(AUDIT_CONTEXT_KEYS)),
                               st.one_of(st.none(), TEXT, st.integers(-(10**18) + 1, 10**18 - 1))))
def test_the_sql_context_is_canonical_json(deployment, context):
    """dp_context_text(dp_context(text)) is canonical_json of the context Python would record."""
    with deployment.raw().connect() as conn:
        found = conn.execute(sa.text("SELECT dp_context_text(dp_context(CAST(:c AS text)))"),
                             {"c": json.dumps(context)}).scalar()
    assert found == canonical_json(context)


FRACTIONS = st.builds(Fraction, st.integers(-(10**40), 10**40), st.integers(1, 10**40))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=FRACTIONS, b=FRACTIONS)
@example(a=Fraction(1, 3 * 10**18), b=Fraction(-1, 3 * 10**18))
@example(a=Fraction(10**18 + 1, 10**18 + 7), b=Fraction(0))
def test_sql_fraction_arithmetic_and_rounding_match_the_accounting_module(deployment, a, b):
    """dp_q_add/sub/cmp/text and dp_q_round are Fraction's +, -, comparison, str and round_up/round_down."""
    query = sa.text(
        "WITH q AS (SELECT dp_q(CAST(:an AS numeric), CAST(:ad AS numeric)) AS a, "
        "dp_q(CAST(:bn AS numeric), CAST(:bd AS numeric)) AS b) "
        "SELECT dp_q_text(dp_q_add(a, b)), dp_q_text(dp_q_sub(a, b)), dp_q_cmp(a, b), dp_q_text(a), "
        "dp_q_text(dp_q_round(a, true)), dp_q_text(dp_q_round(a, false)) FROM q")
    with deployment.raw().connect() as conn:
        row = conn.execute(query, {"an": str(a.numerator), "ad": str(a.denominator), "bn": str(b.numerator),
                                   "bd": str(b.denominator)}).one()
    assert tuple(row) == (str(a + b), str(a - b), (a > b) - (a < b), str(a), str(round_up(a)), str(round_down(a)))


@pytest.mark.parametrize("text", ["k" * 32, "é" * 32, "test-spend-key-" + "s" * 49, "x" * 500])
def test_the_sql_spend_key_id_is_the_key_id_of_keys_py(deployment, text):
    """dp_spend_key_id(secret) is AuditKey.key_id (first 16 hex of the domain-separated SHA-256)."""
    key_ = AuditKey.from_text(text)
    with deployment.raw().connect() as conn:
        found = conn.execute(sa.text("SELECT dp_spend_key_id(CAST(:k AS bytea))"), {"k": key_.secret}).scalar()
    assert found == key_.key_id


# ---- concurrency, locks and the key's visibility ------------------------------------------------------------------

WORKER = Path(__file__).with_name("ledger_worker.py")


def test_sixteen_spender_processes_race_and_exactly_the_cap_is_committed(deployment, tmp_path):
    """400 attempts from 16 processes logged in as the spender on a cap of exactly 100 charges: 100 commit, 300
    are refused, the committed amounts add up to the cap, and verify passes."""
    officer = LedgerGovernor(deployment.url(deployment.governor_role), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
    deployment.engines += [officer.engine, officer._reader]
    officer.apply_config(LedgerConfig(version=1, accounts={"race": account_config("pure_dp", cap=1)}))
    env = {**os.environ, SPEND_KEY_ENV: SPEND_KEY.text,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    go = tmp_path / "go"
    url = deployment.url(deployment.spender_role)
    workers = [subprocess.Popen([sys.executable, str(WORKER), "race", url, "race", str(n), "25", "1/100", str(go)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for n in range(16)]
    go.touch()
    outcomes = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr
        outcomes += [json.loads(line) for line in stdout.splitlines()]
    assert [o["error"] for o in outcomes if o["outcome"] == "error"] == []
    assert Counter(o["outcome"] for o in outcomes) == {"committed": 100, "refused": 300}
    ledger = deployment.spender()
    committed = list(ledger.charges(account="race", state="committed"))
    assert len(committed) == 100 and sum(Fraction(c["amount"]) for c in committed) == 1
    assert ledger.account("race").spent == 1
    assert Counter(e["event"] for e in ledger.events("race")) == {
        "account_created": 1, "reserved": 100, "committed": 100, "refused": 300}
    report = officer.verify()
    assert report.ok, report.problems


def test_a_try_of_a_leased_key_is_refused_without_queueing_on_the_account_lock(deployment, monkeypatch):
    """While the account row is locked, a second try of a key whose lease is live gets LeaseHeldError at once
    (checked before the lock), not a lock timeout."""
    ledger = deployment.spender()
    held = reserve(ledger, "no-queue")
    monkeypatch.setattr(store, "PG_LOCK_TIMEOUT_MS", 200)
    impatient = deployment.spender(max_retries=0)
    with deployment.raw().connect() as holding:
        holding.begin()
        holding.exec_driver_sql("SELECT name FROM dp_budget_accounts WHERE name = 'a' FOR UPDATE")
        with pytest.raises(LeaseHeldError) as raised:
            reserve(impatient, "no-queue")
        with pytest.raises(sa.exc.OperationalError, match="lock"):  # the control: a free key does wait for it
            reserve(impatient, "no-queue-free")
        holding.rollback()
    assert (raised.value.attempt, raised.value.expires_at) == (1, held.lease_expires_at)


def test_the_spend_key_is_not_in_the_query_text_other_sessions_see(deployment):
    """A spend call in progress shows its statement with $n placeholders in pg_stat_activity (the key is a bound
    parameter), and to a role that is not a member of the caller's, not even that."""
    ledger = deployment.spender()
    done: dict = {}
    with deployment.raw().connect() as holding:
        holding.begin()
        holding.exec_driver_sql("SELECT name FROM dp_budget_accounts WHERE name = 'a' FOR UPDATE")
        waiting = threading.Thread(target=lambda: done.update(r=reserve(ledger, "visible")), daemon=True)
        waiting.start()
        query = "SELECT query FROM pg_stat_activity WHERE usename = :u AND state = 'active' AND query LIKE '%dp_reserve%'"
        deadline = time.monotonic() + HANG
        seen = None
        with deployment.raw().connect() as owner, deployment.raw(deployment.outsider).connect() as outsider:
            while seen is None and time.monotonic() < deadline:
                seen = owner.execute(sa.text(query), {"u": deployment.spender_role}).scalar()
                owner.rollback()  # pg_stat_activity is read once per transaction
                time.sleep(0.02)
            hidden = outsider.execute(sa.text("SELECT query FROM pg_stat_activity WHERE usename = :u"),
                                      {"u": deployment.spender_role}).scalars().all()
        holding.rollback()
    waiting.join(HANG)
    assert seen is not None and "CAST($1 AS bytea)" in seen
    assert SPEND_KEY.text not in seen and SPEND_KEY.secret.hex() not in seen
    assert hidden and set(hidden) == {"<insufficient privilege>"}
    assert isinstance(done["r"], Reservation)


# ---- the ledger's functions are checked by verify, and restored by init ------------------------------------------


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize(
    "tamper, problem",
    [
        pytest.param("CREATE OR REPLACE FUNCTION dp_q_cmp(p_a numeric[], p_b numeric[]) RETURNS integer "
                     "LANGUAGE sql IMMUTABLE STRICT SET search_path = @S@, pg_temp AS $$ SELECT -1 $$",
                     "ledger function dp_q_cmp(numeric[], numeric[]) was replaced", id="a replaced body"),
        pytest.param("ALTER FUNCTION dp_commit(" + next(f for f in SPEND_FUNCTIONS if f.name == "dp_commit").identity
                     + ") RESET search_path", "does not pin its search_path", id="an unpinned search_path"),
        pytest.param("ALTER FUNCTION dp_renew(" + next(f for f in SPEND_FUNCTIONS if f.name == "dp_renew").identity
                     + ") SECURITY INVOKER", "is not SECURITY DEFINER", id="SECURITY INVOKER"),
        pytest.param("GRANT EXECUTE ON FUNCTION dp_flush(dp_budget_accounts) TO PUBLIC",
                     "may be executed by PUBLIC", id="a helper granted to PUBLIC"),
        pytest.param("GRANT EXECUTE ON FUNCTION dp_append(dp_budget_accounts, dp_audit_events, bytea, text) TO "
                     "pg_monitor", "may be executed by pg_monitor: only the spend functions are granted",
                     id="a helper granted to a role"),
        pytest.param("DROP FUNCTION dp_abandon(" + next(f for f in SPEND_FUNCTIONS if f.name == "dp_abandon").identity
                     + ")", "is missing (run 'dpctl ledger init')", id="a dropped function"),
        pytest.param("ALTER FUNCTION dp_rows_kept() RESET search_path", "trigger function dp_rows_kept() of",
                     id="an unpinned trigger function"),
    ],
)
def test_a_tampered_ledger_function_is_reported_by_verify_and_restored_by_init(ledger_url, tamper, problem):
    """The tables' owner replacing, unpinning, re-granting or dropping a ledger function fails verify, naming it;
    dpctl ledger init restores it."""
    officer = governor(ledger_url)
    officer.init_schema()
    engine = sa.create_engine(ledger_url)
    try:
        with engine.begin() as conn:
            current = conn.exec_driver_sql("SELECT format('%%I', current_schema())").scalar()
            conn.exec_driver_sql(tamper.replace("@S@", current))
        keys = {GOVERNOR_KEY_ENV: GOVERNOR_KEY.text, SPEND_KEY_ENV: SPEND_KEY.text}
        result = CliRunner().invoke(app, ["ledger", "verify", "--url", ledger_url], env=keys)
        assert result.exit_code == 3 and problem in result.stderr, result.output
        officer.init_schema()
        with engine.connect() as conn:
            assert schema.trigger_problems(conn) == []
    finally:
        engine.dispose()


# ---- the upgrade from schema 3 -----------------------------------------------------------------------------------


def test_init_upgrades_a_schema_3_ledger_whose_charges_verify_and_replay_after_it(ledger_url):
    """A schema-3 ledger (a committed, a released and an open reservation) upgrades in place: verify passes, the
    committed output replays, the open reservation's owner commits it, and new charges add to the same totals."""
    old = version_3_ledger(ledger_url)
    officer = governor(ledger_url)
    assert officer.init_schema() == schema.SCHEMA_VERSION == 4
    assert officer.init_schema() == 4  # idempotent
    report = officer.verify()
    assert report.ok and report.authenticated, report.problems
    ledger = spender(ledger_url)
    assert ledger.account("a").spent == Fraction(1, 4) + Fraction(1, 10)
    assert reserve(ledger, old.committed.run_id) == old.output  # a replay: nothing charged
    assert ledger.authenticated_output(old.committed) == old.output
    ledger.commit(Reservation(old.open_charge_id, old.open_key, "a", Fraction(1, 10), 1, token=old.open_token),
                  {"value": 3})
    ledger.commit(reserve(ledger, "after-upgrade"), {"value": 4})
    assert ledger.account("a").spent == Fraction(1, 4) + Fraction(1, 10) + Fraction(1, 10)
    assert [e["event"] for e in ledger.events("a")] == [
        "account_created", "reserved", "committed", "reserved", "released", "reserved", "committed", "reserved",
        "committed"]
    report = officer.verify()
    assert report.ok and report.authenticated, report.problems
    engine = sa.create_engine(ledger_url)
    try:
        with engine.connect() as conn:
            assert "allowed_roles" in {c["name"] for c in sa.inspect(conn).get_columns("dp_budget_accounts")}
            assert schema.trigger_problems(conn) == []
    finally:
        engine.dispose()


def test_a_login_without_the_spender_role_is_told_so_and_its_error_never_carries_the_spend_key(deployment):
    """A login outside the spender role is refused by the database; the ledger says which grant is missing and
    how to give it, and neither its message nor the driver error it chains holds the spend key."""
    from dp_operators.ledger import LedgerAccessError

    outsider = deployment.spender(deployment.outsider)
    before = deployment.snapshot()
    with pytest.raises(LedgerAccessError, match="dpctl ledger roles") as refused:
        reserve(outsider, "outsider-1")
    assert "Nothing was reserved" in str(refused.value)
    for text in (str(refused.value), repr(refused.value.__cause__), str(refused.value.__context__)):
        assert SPEND_KEY.text not in text and SPEND_KEY.secret.hex() not in text
    assert deployment.snapshot() == before
