"""The ledger's PostgreSQL functions as installed and as called (docs/adr/0029, docs/ledger.md "Spend functions").

* ``dpctl ledger init`` over a ledger whose functions had other arguments in an earlier version: ``CREATE OR
  REPLACE`` cannot change a function's arguments or return type, so the old overload would stay beside the
  current one; init drops it (in its transaction) and verify reports one it finds.
* The JSON the spend functions accept (mechanisms, outputs) holds only numbers the ledger's readers accept
  (``bounded.read_json``: finite doubles, integers of at most 4,300 digits), checked against the reader itself.
* Another team's call is refused (DPL07) before it takes or waits for any lock of the account it names: a login of
  team A calling the functions on team B's account or charges, in a transaction it leaves open, neither waits
  behind nor holds up team B's own calls.
* A release key's attempts are unique per account: team A's open reservation of a key on its own account does not
  make team B's reserve of that key wait; ``dpctl ledger init`` replaces the constraint of earlier versions (SQLite
  files keep theirs: the one test here that runs on SQLite).

PostgreSQL only (skipped when the server is unreachable, failed under ``CI=1``: tests/ledger_backends.py); roles
have unique names and are dropped afterwards.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from fractions import Fraction

import pytest
import sqlalchemy as sa
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import LedgerConfig, LedgerGovernor, ReleaseKey, schema
from dp_operators.ledger.bounded import MAX_OUTPUT_CHARS, BoundsError, read_json
from dp_operators.ledger.keys import GOVERNOR_KEY_ENV, SPEND_KEY_ENV
from dp_operators.ledger.pg_functions import (
    BAD_VALUE,
    MANAGED_NAMES,
    MAX_JSON_INTEGER_DIGITS,
    ROLE_NOT_ALLOWED,
    SPEND_FUNCTIONS,
)
from ledger_backends import account_config
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender
from team_deployment import Teams, team_deployment

#: Seconds after which a call that should return at once counts as waiting (a bound, never a sleep).
PROMPT = 20


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def _call(name: str) -> str:
    """``SELECT name(CAST(:arg AS type), ...)``: a spend function called by hand, every argument typed."""
    (function,) = [f for f in SPEND_FUNCTIONS if f.name == name]
    arguments = [arg.strip().split(" ", 1) for arg in function.args.split(",")]
    return f"SELECT {name}(" + ", ".join(f"CAST(:{n.removeprefix('p_')} AS {t})" for n, t in arguments) + ")"


def _overloads(engine: sa.Engine) -> dict[str, list[str]]:
    """The functions of the ledger's schema named as the ledger's: name -> signatures."""
    found: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for name, signature in conn.execute(sa.text(
                "SELECT p.proname, p.oid::regprocedure::text FROM pg_proc AS p WHERE p.pronamespace = "
                "(SELECT relnamespace FROM pg_class WHERE oid = 'dp_charges'::regclass) AND p.proname = ANY (:names) "
                "ORDER BY 2"), {"names": list(MANAGED_NAMES)}):
            found.setdefault(name, []).append(signature)
    return found


# ---- init drops the overloads an earlier version left, verify reports them ---------------------------------------

#: Functions of an earlier version of the ledger (or added by hand) under the ledger's names: statements run as the
#: tables' owner, and the signature verify must name.
STRAYS = [
    pytest.param(
        ["CREATE FUNCTION dp_check_lease(p_account text) RETURNS void LANGUAGE plpgsql AS $$ BEGIN END $$"],
        "dp_check_lease(p_account text)", id="a helper with fewer arguments"),
    pytest.param(
        ["CREATE FUNCTION dp_check_lease(p_dag_id text, p_run_id text, p_task_id text, p_map_index integer, "
         "p_release_name text, p_now timestamp with time zone) RETURNS void LANGUAGE plpgsql AS $$ BEGIN END $$"],
        "dp_check_lease(p_dag_id text, p_run_id text, p_task_id text, p_map_index integer, "
        "p_release_name text, p_now timestamp with time zone)",
        id="the helper before it took the account"),
    pytest.param(
        ["CREATE FUNCTION dp_reserve(p_key bytea, p_account text) RETURNS jsonb LANGUAGE sql SECURITY DEFINER "
         "AS $$ SELECT '{}'::jsonb $$", "GRANT EXECUTE ON FUNCTION dp_reserve(bytea, text) TO PUBLIC"],
        "dp_reserve(p_key bytea, p_account text)", id="a spend function granted to PUBLIC"),
    pytest.param(
        ["CREATE FUNCTION dp_rows_kept(p_table text) RETURNS void LANGUAGE sql AS ''"],
        "dp_rows_kept(p_table text)", id="a trigger function's name"),
    pytest.param(
        ["DROP FUNCTION dp_q_text(numeric[])",
         "CREATE FUNCTION dp_q_text(p_fraction numeric[]) RETURNS text LANGUAGE sql AS $$ SELECT '0' $$"],
        "dp_q_text(p_fraction numeric[])", id="other argument names"),
    pytest.param(
        ["DROP FUNCTION dp_unit(text)",
         "CREATE FUNCTION dp_unit(p_accountant text) RETURNS integer LANGUAGE sql AS $$ SELECT 0 $$"],
        "dp_unit(p_accountant text) returning integer", id="another return type"),
]


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("statements, stray", STRAYS)
def test_init_drops_an_overload_an_earlier_version_left_and_verify_reports_it(ledger_url, statements, stray):
    """A function of the ledger's schema under a ledger function's name, with other arguments (or argument names,
    or return type) than the current definition, fails verify naming it; dpctl ledger init drops it and
    (re)creates the current one; then verify passes and every name has one function."""
    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=1)}))
    engine = sa.create_engine(ledger_url)
    keys = {GOVERNOR_KEY_ENV: GOVERNOR_KEY.text, SPEND_KEY_ENV: SPEND_KEY.text}
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
        with engine.connect() as conn:
            problems = schema.trigger_problems(conn)
        assert any("not the ledger's" in problem and stray in problem for problem in problems), problems
        result = CliRunner().invoke(app, ["ledger", "verify", "--url", ledger_url], env=keys)
        assert result.exit_code == 3 and stray in result.stderr, result.output

        officer.init_schema()
        assert all(len(signatures) == 1 for signatures in _overloads(engine).values()), _overloads(engine)
        assert sorted(_overloads(engine)) == sorted(MANAGED_NAMES)
        with engine.connect() as conn:
            assert schema.trigger_problems(conn) == []
        report = officer.verify()
        assert report.ok and report.authenticated, report.problems
        ledger = spender(ledger_url)  # the current functions work (postgres owns them: no grant needed)
        reservation = ledger.reserve(ReleaseKey("d", "after", "t", -1, "r"), account="a", amount=Fraction(1, 10),
                                     mechanisms=[], spec_hash="0" * 64)
        ledger.commit(reservation, {"value": 1})
        ledger.engine.dispose()
        ledger._reader.dispose()
    finally:
        for used in (engine, officer.engine, officer._reader):
            used.dispose()


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_init_drops_nothing_when_it_fails(ledger_url):
    """The drops run in init's transaction: an init that fails (a stray overload something depends on) leaves the
    stray, and every other function, as they were."""
    officer = governor(ledger_url)
    officer.init_schema()
    engine = sa.create_engine(ledger_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE FUNCTION dp_check_lease(p_account text) RETURNS integer LANGUAGE sql "
                                 "IMMUTABLE AS $$ SELECT 1 $$")
            conn.exec_driver_sql("CREATE TABLE dp_stray_dependent (x integer DEFAULT dp_check_lease('a'))")
            for name in ("dp_q", "dp_reserve", "dp_unit"):
                conn.exec_driver_sql(f"CREATE FUNCTION {name}(p_x integer, p_y integer) RETURNS void LANGUAGE sql "
                                     "AS ''")
        before = _overloads(engine)
        with pytest.raises(sa.exc.DBAPIError, match="other objects depend on it"):
            officer.init_schema()
        assert _overloads(engine) == before
        for name in ("dp_q", "dp_reserve", "dp_unit"):
            assert f"{name}(integer,integer)" in before[name]
        assert "dp_check_lease(text)" in before["dp_check_lease"]
    finally:
        for used in (engine, officer.engine, officer._reader):
            used.dispose()


# ---- the JSON the spend functions accept is JSON the readers read ------------------------------------------------


@pytest.fixture(scope="module")
def pg_ledger(pg_database: sa.URL) -> Iterator[sa.Engine]:
    """A ledger schema initialised by ``postgres`` (who may call the helpers), as an engine; account ``a``."""
    name = _unique("t_fnj")
    admin = sa.create_engine(pg_database, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    url = pg_database.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(hide_password=False)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        officer = governor(url)
        officer.init_schema()
        officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=10)}))
        officer.engine.dispose()
        officer._reader.dispose()
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        admin.dispose()


def _function_accepts(engine: sa.Engine, text: str) -> bool:
    """Whether dp_check_json takes ``text`` as an output (False: refused with DPL06)."""
    with engine.connect() as conn:
        try:
            conn.execute(sa.text(f"SELECT dp_check_json(:t, 'output', {MAX_OUTPUT_CHARS}, 64, NULL)"), {"t": text})
        except sa.exc.DBAPIError as error:
            assert error.orig.sqlstate == BAD_VALUE, error
            return False
    return True


def _reader_accepts(text: str) -> bool:
    try:
        read_json(text, max_chars=MAX_OUTPUT_CHARS)
    except BoundsError:
        return False
    return True


def _digits(min_size: int, max_size: int) -> st.SearchStrategy[str]:
    return st.text("0123456789", min_size=min_size, max_size=max_size)


#: JSON number texts around every bound: integers near 4,300 digits, mantissas of hundreds of digits with leading
#: zeros, exponents near +-308, +-324 and beyond 10^18, in any case, sign and leading zeros.
_EXPONENTS = st.one_of(st.integers(-400, 400), st.integers(300, 330), st.integers(-340, -300),
                       st.integers(-(10**30), 10**30))
NUMBERS = st.builds(
    lambda sign, whole, fraction, exponent, e, plus, zeros: (
        sign + whole + (f".{fraction}" if fraction else "")
        + ("" if exponent is None else f"{e}{'-' if exponent < 0 else plus}{'0' * zeros}{abs(exponent)}")),
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.builds(lambda d, rest: d + rest, st.sampled_from("123456789"),
                                      st.one_of(_digits(0, 30), _digits(280, 320), _digits(4290, 4310)))),
    st.one_of(st.just(""), _digits(1, 30), _digits(300, 700).map(lambda d: "0" * len(d) + "1")),
    st.one_of(st.none(), _EXPONENTS),
    st.sampled_from("eE"),
    st.sampled_from(["", "+"]),
    st.integers(0, 3),
)

T = 2**1024 - 2**970  # Python's float() reads a smaller magnitude as a finite double, this one as inf
BOUNDARY = ["1e308", "1.7976931348623157e308", "1.7976931348623158e308", "1.7976931348623159e308", "1e309",
            str(T), f"{T}.0", f"{T - 1}.0", f"{T - 1}e0", f"-{T - 1}.0", f"{T // 10}.0e1", f"{T // 10 + 1}.0e1",
            "9" * MAX_JSON_INTEGER_DIGITS, "-" + "9" * MAX_JSON_INTEGER_DIGITS, "9" * (MAX_JSON_INTEGER_DIGITS + 1),
            "1e-400", "4e-324", "1e-99999999999999999999", "1e99999999999999999999", "0e99999999999999999999",
            "0.0000000000000000000000000001e336", "0.0000000000000000000000000001e337", "1E+0308", "1e0000000309"]


@settings(max_examples=400, deadline=None)
@given(number=NUMBERS, where=st.sampled_from(["[{}]", '{{"v": {}}}', '{{"s": "1e999999", "v": [0, {}, 1]}}']))
@example(number="1e999999", where="[{}]")
@example(number="9" * 5000, where="[{}]")
def test_dp_check_json_accepts_exactly_the_numbers_the_readers_read(pg_ledger, number, where):
    """Any JSON number, anywhere in a value: dp_check_json accepts it if and only if bounded.read_json reads it (a
    refusal is DPL06). So a spend function never stores a number that makes verify, history or the dashboard call
    the row unreadable, and refuses none they read."""
    text = where.format(number)
    assert _function_accepts(pg_ledger, text) == _reader_accepts(text), number


@pytest.mark.parametrize("number", BOUNDARY)
def test_dp_check_json_at_the_bounds_of_the_doubles_and_of_pythons_integers(pg_ledger, number):
    text = f"[{number}]"
    assert _function_accepts(pg_ledger, text) == _reader_accepts(text), number


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                 st.integers(-(10**MAX_JSON_INTEGER_DIGITS) + 1, 10**MAX_JSON_INTEGER_DIGITS - 1),
                                 st.text(max_size=20)), max_size=20))
@example(values=["\x00\U00010000"])  # a \u0000 escape beside a surrogate pair: jsonb refuses the former alone
def test_whatever_python_writes_as_json_the_function_accepts(pg_ledger, values):
    """json.dumps of finite floats, integers of up to 4,300 digits and strings is accepted."""
    assert _function_accepts(pg_ledger, json.dumps({"values": values}))


@pytest.mark.parametrize("number", ["1e999999", "1e-99999", "9" * 5000])
def test_a_context_number_beyond_what_jsonb_holds_is_a_bad_value(pg_ledger, number):
    """An audit context is read as jsonb, whose numbers cannot hold 1e999999: refused as a bad value (DPL06), like
    any other number a context may not hold, not with PostgreSQL's own overflow error."""
    with pg_ledger.connect() as conn, pytest.raises(sa.exc.DBAPIError) as refused:
        conn.execute(sa.text("SELECT dp_context(:t)"), {"t": f'{{"pid": {number}}}'})
    assert refused.value.orig.sqlstate == BAD_VALUE, refused.value


LEGIT = [1e-300, 1.5e308, -1.5e308, -0.0, 5e-324, sys.float_info.max, sys.float_info.min, 10**300 - 7,
         -(10**299), "1e999999", "9" * 5000, {"1e999999": [1e100, 1e-100]}, 123456789012345678901234567890]


@pytest.mark.parametrize("value", LEGIT, ids=lambda v: repr(v)[:30])
def test_the_spend_functions_store_legitimate_outputs_and_mechanisms_that_verify_reads(pg_ledger, value):
    """Through dp_reserve (mechanisms) and dp_commit (output): extreme but finite floats, big integers and numbers
    inside strings are stored, replayed as written, and verify reads them."""
    url = pg_ledger.url.render_as_string(hide_password=False)
    ledger = spender(url)
    officer = governor(url)
    try:
        key = ReleaseKey("d", _unique("legit"), "t", -1, "r")
        reservation = ledger.reserve(key, account="a", amount=Fraction(1, 10**6), spec_hash="0" * 64,
                                     mechanisms=[{"kind": "laplace", "values": [value]}])
        ledger.commit(reservation, {"v": [value]})
        assert ledger.reserve(key, account="a", amount=Fraction(1, 10**6), spec_hash="0" * 64,
                              mechanisms=[]) == json.loads(json.dumps({"v": [value]}))
        report = officer.verify()
        assert report.ok, report.problems
    finally:
        for engine in (ledger.engine, ledger._reader, officer.engine, officer._reader):
            engine.dispose()


# ---- another team is refused before any lock of the account ------------------------------------------------------


@pytest.fixture(scope="module")
def teams(pg_database: sa.URL) -> Iterator[Teams]:
    """Accounts ``a`` (team A's logins only) and ``b`` (team B's), both allowing the DAG ``d``."""
    with team_deployment(pg_database, "lk", _team_accounts) as t:
        yield t


def _team_accounts(t: Teams) -> dict:
    return {"a": account_config("pure_dp", cap=10, allowed_roles=[t.team_a]),
            "b": account_config("pure_dp", cap=10, allowed_roles=[t.team_b])}


def _key() -> ReleaseKey:
    return ReleaseKey("d", _unique("run"), "t", -1, "r")


def _reserve_params(account: str, key: ReleaseKey, token: str) -> dict:
    return {"key": SPEND_KEY.secret, "account": account, "windows": [], **key.as_dict(), "amount": "1/100", "takeover": "1/100", "delta": "0",
            "mechanisms": "[]", "spec_hash": "0" * 64, "try_number": None, "context": "{}",
            "token_hash": hashlib.sha256(token.encode()).hexdigest(), "lease_seconds": 120.0}


def _owner_params(charge_id: int, account: str, key: ReleaseKey, **extra) -> dict:
    return {"key": SPEND_KEY.secret, "charge_id": charge_id, "account": account, **key.as_dict(), "attempt": 1,
            "token": "a guess", **extra}


def _called(engine: sa.Engine, function: str, params: dict) -> dict:
    with engine.connect() as conn:
        return conn.execute(sa.text(_call(function)), params).scalar_one()


def _within(seconds: float, work: Callable[[], object]) -> dict:
    """Run ``work`` in a thread and wait at most ``seconds`` for it: ``{"result": ...}`` or ``{"error": ...}``, or
    ``{}`` while it still waits."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as error:  # noqa: BLE001 - reported to the test
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    outcome["thread"] = thread
    return outcome


#: Team A's calls naming team B's account, or a charge on it (its own account as the claimed one, or B's).
CALLS = [
    pytest.param("dp_reserve", "b", id="reserve on B's account"),
    pytest.param("dp_commit", "b", id="commit B's charge"),
    pytest.param("dp_commit", "a", id="commit B's charge claiming account a"),
    pytest.param("dp_renew", "b", id="renew B's charge"),
    pytest.param("dp_renew", "a", id="renew B's charge claiming account a"),
    pytest.param("dp_release", "b", id="release B's charge"),
    pytest.param("dp_abandon", "b", id="abandon B's charge"),
]


@pytest.mark.parametrize("function, claimed", CALLS)
def test_another_teams_call_takes_no_lock_of_the_account_and_waits_for_none(teams, function, claimed):
    """Team A's login, in a transaction it leaves open, calls a spend function on team B's account or charge while
    B's own worker holds the account's lock: A is refused at once (DPL07, not after waiting for B), its
    transaction is aborted, and B's reserves on its own account go on (promptly) while A's connection stays
    open."""
    team_b = teams.engine(teams.login_b, isolation_level="AUTOCOMMIT")
    with team_b.connect() as conn:
        key_b = _key()
        charge = conn.execute(sa.text(_call("dp_reserve")), _reserve_params("b", key_b, "token-b")).scalar_one()
    assert charge["status"] == "reserved"
    if function == "dp_reserve":
        params = _reserve_params(claimed, _key(), "token-a")
    else:
        extra = {"dp_commit": {"output": '{"v": 1}', "defaults": "{}", "audit": "{}"},
                 "dp_renew": {"lease_seconds": 60.0}}.get(function, {"defaults": "{}", "audit": "{}"})
        params = _owner_params(charge["charge_id"], claimed, key_b, **extra)

    holder = teams.engine(teams.login_b).connect()  # B's worker, mid-transaction: it holds b's row lock
    team_a = teams.engine(teams.login_a).connect()  # not autocommit: A's call opens a transaction
    try:
        held = holder.execute(sa.text(_call("dp_reserve")), _reserve_params("b", _key(), "token-held")).scalar_one()
        assert held["status"] == "reserved"
        refused = _within(PROMPT, lambda: team_a.execute(sa.text(_call(function)), params))
        waited = refused["thread"].is_alive()
        holder.rollback()  # in any case: a call of A still waiting goes on
        refused["thread"].join(PROMPT)
        assert not waited, f"{function} of team A waited for team B's lock"
        assert isinstance(refused.get("error"), sa.exc.DBAPIError), refused
        assert refused["error"].orig.sqlstate == ROLE_NOT_ALLOWED, refused["error"]
        with teams.engine("postgres").connect() as conn:  # A's session idles in its aborted transaction
            state = conn.execute(sa.text("SELECT state FROM pg_stat_activity WHERE usename = :u"),
                                 {"u": teams.login_a}).scalars().all()
        assert state == ["idle in transaction (aborted)"], state

        # B's reserves on its own account, and its owner's calls on its charge, are not held up by A
        for name, arguments in (
            ("dp_reserve", _reserve_params("b", _key(), "token-b2")),
            ("dp_renew", {**_owner_params(charge["charge_id"], "b", key_b), "token": "token-b",
                          "lease_seconds": 60.0}),
        ):
            done = _within(PROMPT, lambda: _called(team_b, name, arguments))
            assert "result" in done, done.get("error") or f"team B's {name} waited while team A's transaction was open"
            assert done["result"]["status"] in ("reserved", "renewed")
    finally:
        holder.rollback()
        holder.close()
        team_a.close()
        teams.dispose()


def test_a_reserve_refused_for_its_role_never_read_the_accounts_leases(teams):
    """DPL07 comes before the lease check too: team A's reserve under a key team B holds a live lease for, on B's
    account, is refused for its role, not told about B's lease (DPL04)."""
    team_b = teams.engine(teams.login_b, isolation_level="AUTOCOMMIT")
    team_a = teams.engine(teams.login_a, isolation_level="AUTOCOMMIT")
    key = _key()
    try:
        with team_b.connect() as conn:
            assert conn.execute(sa.text(_call("dp_reserve")),
                                _reserve_params("b", key, "token-b")).scalar_one()["status"] == "reserved"
        with team_a.connect() as conn, pytest.raises(sa.exc.DBAPIError) as refused:
            conn.execute(sa.text(_call("dp_reserve")), _reserve_params("b", key, "token-a"))
        assert refused.value.orig.sqlstate == ROLE_NOT_ALLOWED
    finally:
        teams.dispose()


# ---- charges of one release key on two accounts never wait for each other ----------------------------------------


def _squat_and_reserve(teams: Teams) -> dict:
    """Team A's login, in a transaction it leaves open, reserves a release key (DAG ``d``, allowed on both accounts)
    on its OWN account ``a`` and idles; meanwhile team B's login reserves that key on ``b`` (``same_key``), then
    another key on ``b`` (``other_key``). Returns B's two outcomes (:func:`_within`) and ``waited``, whether each
    still waited after :data:`PROMPT` seconds, read while A's transaction was open; then A commits (or, if B
    waited, rolls back, so B's call goes on)."""
    team_b = teams.engine(teams.login_b, isolation_level="AUTOCOMMIT")
    team_a = teams.engine(teams.login_a).connect()  # not autocommit: A's call opens a transaction
    key = _key()
    try:
        squat = team_a.execute(sa.text(_call("dp_reserve")), _reserve_params("a", key, "token-a")).scalar_one()
        assert squat["status"] == "reserved" and squat["attempt"] == 1, squat
        same_key = _within(PROMPT, lambda: _called(team_b, "dp_reserve", _reserve_params("b", key, "token-b")))
        other_key = {"thread": same_key["thread"]}  # not started while B's first call still waits
        if not same_key["thread"].is_alive():
            other_key = _within(PROMPT, lambda: _called(team_b, "dp_reserve", _reserve_params("b", _key(), "token-c")))
        waited = {"same key": same_key["thread"].is_alive(), "other key": other_key["thread"].is_alive()}
        if any(waited.values()):
            team_a.rollback()
        else:
            team_a.commit()
        for outcome in (same_key, other_key):
            outcome["thread"].join(PROMPT)
        return {"waited": waited, "same_key": same_key, "other_key": other_key}
    finally:
        team_a.close()
        teams.dispose()


def test_another_teams_open_reservation_of_a_release_key_on_its_own_account_blocks_no_call_of_ours(teams):
    """A release key's attempts are unique per account (``uq_release_attempt_account``): team A's login reserves team
    B's next release key (a DAG id both accounts allow) on A's own account in a transaction it leaves open; B's
    reserve of that key on B's account, and B's next reserve, finish promptly. Under the constraint of earlier
    versions (release key and attempt, not the account) B's INSERT of attempt 1 waited on A's uncommitted row
    while holding b's row lock, so every call on b queued behind it for as long as A idled. Both charges are attempt
    1 of the key, and verify accepts the ledger."""
    outcome = _squat_and_reserve(teams)
    assert not any(outcome["waited"].values()), f"team B's reserve waited on team A's open transaction: {outcome}"
    for name in ("same_key", "other_key"):
        assert "result" in outcome[name], outcome[name].get("error")
        assert outcome[name]["result"]["status"] == "reserved", outcome[name]["result"]
    assert outcome["same_key"]["result"]["attempt"] == 1
    officer = LedgerGovernor(teams.url(teams.governor_role), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
    try:
        report = officer.verify()
        assert report.ok and report.authenticated, report.problems
    finally:
        officer.engine.dispose()
        officer._reader.dispose()


_UNIQUE_CONSTRAINTS = ("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                       "WHERE conrelid = 'dp_charges'::regclass AND contype = 'u' ORDER BY 1")
_OLD_CONSTRAINT = "UNIQUE (dag_id, run_id, task_id, map_index, release_name, attempt)"
_NEW_CONSTRAINT = "UNIQUE (dag_id, run_id, task_id, map_index, release_name, account, attempt)"


def _b_waits_for_a_lock(admin: sa.Engine, login: str, thread: threading.Thread) -> bool:
    """Whether ``login``'s session comes to wait for a lock (a transaction's, or a row's) while ``thread`` runs its
    call: polled in pg_stat_activity until it does, or the call ends, or :data:`PROMPT` seconds pass."""
    deadline = time.monotonic() + PROMPT
    with admin.connect() as conn:
        while thread.is_alive() and time.monotonic() < deadline:
            if conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE usename = :u AND "
                                    "wait_event_type = 'Lock'"), {"u": login}).scalar_one():
                return True
            thread.join(0.05)
    return False


@pytest.fixture
def old_teams(pg_database: sa.URL) -> Iterator[Teams]:
    """As ``teams``, in a schema of its own whose ``dp_charges`` has the release key's constraint of earlier
    versions (``uq_release_attempt``: the release key and attempt, not the account), as a ledger initialised before
    the change has it; no charge yet."""

    def old_constraint(t: Teams) -> None:
        with t.engine("postgres").begin() as conn:
            conn.exec_driver_sql("ALTER TABLE dp_charges DROP CONSTRAINT uq_release_attempt_account, "
                                 f"ADD CONSTRAINT uq_release_attempt {_OLD_CONSTRAINT}")

    with team_deployment(pg_database, "uq", _team_accounts, after_init=old_constraint) as t:
        yield t


def test_init_replaces_the_release_key_constraint_of_an_earlier_version(old_teams):
    """A ledger initialised before the constraint took the account (``uq_release_attempt``, the release key and
    attempt): team B's reserve of a key team A holds open on its own account waits. ``dpctl ledger init`` replaces
    the constraint with ``uq_release_attempt_account`` in its transaction (the catalog then holds that one only;
    a second init changes nothing), verify reports the old one until then, and B's reserves no longer wait."""
    admin = old_teams.engine("postgres", isolation_level="AUTOCOMMIT")
    officer = LedgerGovernor(old_teams.url(), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
    old_teams.engines += [officer.engine, officer._reader]
    try:
        with admin.connect() as conn:
            assert conn.execute(sa.text(_UNIQUE_CONSTRAINTS)).all() == [("uq_release_attempt", _OLD_CONSTRAINT)]
            assert [p for p in schema.trigger_problems(conn) if "dp_charges" in p] == [
                f"constraint uq_release_attempt on dp_charges is an earlier version's ({_OLD_CONSTRAINT}: one "
                "account's open reservation of a release key stalls another account's reserves of it); 'dpctl "
                "ledger init' replaces it with uq_release_attempt_account"]

        # the old shape: B's reserve of the key A holds open waits for A's transaction
        team_a = old_teams.engine(old_teams.login_a).connect()
        team_b = old_teams.engine(old_teams.login_b, isolation_level="AUTOCOMMIT")
        key = _key()
        try:
            team_a.execute(sa.text(_call("dp_reserve")), _reserve_params("a", key, "token-a")).scalar_one()
            blocked = _within(0, lambda: _called(team_b, "dp_reserve", _reserve_params("b", key, "token-b")))
            assert _b_waits_for_a_lock(admin, old_teams.login_b, blocked["thread"]), blocked
        finally:
            team_a.rollback()  # B's call goes on (attempt 1 is free again)
            team_a.close()
        blocked["thread"].join(PROMPT)
        assert blocked.get("result", {}).get("status") == "reserved", blocked

        for _ in range(2):  # idempotent
            officer.init_schema()
            with admin.connect() as conn:
                assert conn.execute(sa.text(_UNIQUE_CONSTRAINTS)).all() == [
                    ("uq_release_attempt_account", _NEW_CONSTRAINT)]
                assert schema.trigger_problems(conn) == []
        outcome = _squat_and_reserve(old_teams)
        assert not any(outcome["waited"].values()), f"team B's reserve waited after the upgrade: {outcome}"
        assert outcome["same_key"]["result"]["status"] == "reserved", outcome
        report = officer.verify()
        assert report.ok and report.authenticated, report.problems
    finally:
        old_teams.dispose()


def _release_key_constraints(url: str) -> dict[str, list[str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {c["name"]: c["column_names"] for c in sa.inspect(conn).get_unique_constraints("dp_charges")}
    finally:
        engine.dispose()


def test_a_sqlite_file_keeps_the_constraint_it_was_created_with(tmp_path):
    """SQLite (no team roles; one writer at a time in any case) is not rebuilt: a new file takes the per-account
    constraint, an older file keeps ``uq_release_attempt`` through ``dpctl ledger init`` and works as before (a
    release key's attempts are numbered across accounts, so both shapes admit the same charges), and verify
    accepts both."""
    from old_ledgers import version_3_ledger

    new, old = f"sqlite:///{tmp_path / 'new.db'}", f"sqlite:///{tmp_path / 'old.db'}"
    version_3_ledger(old)
    for url in (new, old):
        officer = governor(url)
        try:
            officer.init_schema()
            officer.apply_config(LedgerConfig(version=1, accounts={
                "a": account_config("pure_dp", cap=1), "b": account_config("pure_dp", cap=1)}))
            ledger = spender(url)
            key = ReleaseKey("d", "shared", "t", -1, "r")
            attempts = [ledger.reserve(key, account=account, amount=Fraction(1, 100), mechanisms=[],
                                       spec_hash="0" * 64).attempt for account in ("a", "b")]
            assert attempts == [1, 2]
            report = officer.verify()
            assert report.ok and report.authenticated, report.problems
        finally:
            for engine in (officer.engine, officer._reader):
                engine.dispose()
    assert _release_key_constraints(new) == {"uq_release_attempt_account": list(schema.RELEASE_ATTEMPT_COLUMNS)}
    assert _release_key_constraints(old) == {
        "uq_release_attempt": ["dag_id", "run_id", "task_id", "map_index", "release_name", "attempt"]}
