"""Hostile rows: values the ledger never writes, planted as the tables' owner in raw SQL on SQLite and PostgreSQL,
must never make a reader crash, hang or grow its memory with the rows.

Readers: ``verify_ledger`` and ``dpctl ledger verify`` (exit 3 naming each hostile row by table, id and column),
``dpctl ledger history`` as a table and as ``--json`` (every charge printed, a hostile one marked unreadable), and the
dashboard's queries (accounts overview, account detail, charge pages, run and release). A hypothesis fuzz plants
huge digit strings, exponents, ``1e-99999999``, ``nan``, ``inf``, empty and blank text, Unicode digits, negative
zero, non-canonical fractions, deeply nested and non-finite JSON, outputs of hundreds of thousands of values
unreadable only at their end, 10 MB texts, junk accounts and (SQLite, which
holds any value anywhere) wrong types and undecodable text. ``Fraction`` is watched throughout: a reader that handed
it a stored text it would take for ever to parse fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import sqlite3
import tracemalloc
import uuid
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.dashboard import queries
from dp_operators.ledger import Keyring, LedgerConfig, ReleaseKey, schema
from dp_operators.ledger.bounded import MAX_DIGITS, number_problem, read_json, read_number
from dp_operators.ledger.chain import canonical_json, timestamp_text
from dp_operators.ledger.errors import AuditChainError, UnreadableValueError, stored_fraction
from dp_operators.ledger.verify import verify_ledger
from ledger_backends import PG_URL, account_config
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender

KEYS = Keyring([GOVERNOR_KEY, SPEND_KEY])
CONFIG = LedgerConfig(
    version=1,
    accounts={"a": account_config("zcdp", cap="1/2", delta="1e-6"), "b": account_config("approx_dp", cap=1, delta="1e-6")},
)


class Hostile(str):
    """A hostile text that hypothesis reports by a short label, not by its megabytes."""

    def __repr__(self) -> str:
        return f"<{len(self):,} characters: {str.__repr__(self[:24])}{'…' if len(self) > 24 else ''}>"


def hostile(*texts: str) -> list[Hostile]:
    return [Hostile(text) for text in texts]


#: Texts that are not a number as the ledger stores it (``str(Fraction)``, at most 60 digits a side).
HOSTILE_NUMBERS = hostile(
    "9" * 400, "1/" + "9" * 400, "9" * (MAX_DIGITS + 1), "1e-99999999", "0e-999999999", "1e999999999", "nan", "NaN",
    "inf", "-inf", "Infinity", "", " ", "\t\n", " 1/2", "1/2 ", "١٢", "１/２", "-0", "1/0", "0/5", "2/4", "3/1",
    "+1", "1.5", ".5", "1_000", "0x10", "01", "--1", "1/-2", "1//2", "7" * (10 * 2**20),
)
#: Texts that are not JSON within the bounds (length, nesting, finite numbers).
HOSTILE_JSON = hostile(
    "[" * 200_000 + "]" * 200_000, "[" * 65 + "]" * 65, '{"a":' * 500 + "1" + "}" * 500, "[0," * 800 + "0" + "]" * 800,
    "NaN", "[Infinity]", "[1e999]", "{", "", " ", "[" + "1" * 5000 + "]", '"' + "x" * (10 * 2**20) + '"',
)
#: Outputs of hundreds of thousands of values, unreadable only at their end: readers check these as a stream of
#: parser events, not with ``json.loads`` (bounded.MAX_PARSED_VALUES).
HOSTILE_LONG_OUTPUTS = hostile(
    "[" + "{}," * 150_000 + "NaN]", "[" + "[]," * 150_000 + "[" * 65 + "]" * 65 + "]", "[" + "0," * 150_000 + "1e999]",
    '{"aggregates": {"n": {"rows": [' + "0," * 150_000 + "9" * 5000 + "]}}}", "[" + "{}," * 150_000 + "{}",
)

# -- a legitimate ledger -------------------------------------------------------------------------------------------


def legitimate_ledger(url: str) -> None:
    """Accounts ``a`` (zCDP) and ``b`` (approx DP) with committed, released, abandoned and reserved charges,
    written through the API."""
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(CONFIG)
    worker = spender(url)
    mechanisms = [{"mechanism": "discrete_gaussian", "sigma2": "9/200"}]

    def reserve(run: str, account: str = "a", amount: str = "1/400", **kwargs):
        return worker.reserve(ReleaseKey("d", run, "t", -1, "r"), account=account, amount=Fraction(amount),
                              mechanisms=mechanisms, spec_hash="0" * 64, **kwargs)

    worker.commit(reserve("r1"), {"aggregates": {"n": {"kind": "count", "value": 12, "half_width": 3.5}}})
    worker.commit(reserve("r2", amount="1/300"), {"value": 2})
    worker.release(reserve("r3", account="b", amount="1/100", delta=Fraction(1, 10**7)))
    worker.abandon(reserve("r4", amount="1/7"))
    reserve("r5", account="b", amount="1/9")


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "template.db"
    legitimate_ledger(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_copies(sqlite_template, tmp_path) -> Iterator[callable]:
    """A function returning the URL of a fresh copy of the legitimate SQLite ledger (SQLite's backup, which
    includes what is still in the write-ahead log)."""
    def copy() -> str:
        target = tmp_path / f"{uuid.uuid4().hex}.db"
        with contextlib.closing(sqlite3.connect(sqlite_template)) as source:
            with contextlib.closing(sqlite3.connect(target)) as copied:
                source.backup(copied)
        return f"sqlite:///{target}"

    yield copy


def _admin() -> sa.Engine:
    return sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})


@pytest.fixture(scope="module")
def pg_template() -> Iterator[str]:
    """A PostgreSQL database holding the legitimate ledger, used as a template (skipped without a server)."""
    admin = _admin()
    try:
        with admin.connect():
            pass
    except sa.exc.OperationalError as error:
        admin.dispose()
        pytest.skip(f"PostgreSQL not reachable: {str(error.orig).strip()[:200]}")
    name = f"dp_hostile_tmpl_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    try:
        legitimate_ledger(url)
        yield name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def pg_copies(pg_template) -> Iterator[callable]:
    """A function returning the URL of a fresh copy of the legitimate PostgreSQL ledger (CREATE DATABASE ...
    TEMPLATE); the copies are dropped afterwards."""
    admin = _admin()
    made: list[str] = []

    def copy() -> str:
        name = f"dp_hostile_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            # the template's connections (the ledger's pools) must be gone for a copy; they are, but a backend
            # may still be closing
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (pg_template,),
            )
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
        made.append(name)
        return sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)

    yield copy
    with admin.connect() as conn:
        for name in made:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


# -- planting, as the tables' owner -----------------------------------------------------------------------------


def plant(url: str, plantings: list[tuple[str, str, str, object]]) -> list[tuple[str, object, str]]:
    """Write each planting ``(kind, table, column, value)`` in raw SQL as the owner (guard triggers bypassed where
    they refuse the write: SQLite drops and re-creates them, PostgreSQL uses a replica session). Kinds: ``new`` (a
    new charge, or a new audit event of account 'a', whose ``column`` holds ``value``), ``account`` (account
    'a''s ``column`` set to ``value``), ``junk`` (``value`` audit events naming made-up accounts), ``raw`` (SQLite:
    a new charge whose ``column`` holds the SQL expression ``value``). Returns what each hostile row must be named
    by: ``(table, id or account name, column)``."""
    engine = sa.create_engine(url)
    sqlite = engine.dialect.name == "sqlite"
    named: list[tuple[str, object, str]] = []
    try:
        with engine.begin() as conn:
            if sqlite:
                triggers = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'").all()
                for (trigger,) in triggers:
                    conn.exec_driver_sql(f"DROP TRIGGER {trigger}")
            else:
                conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            seq = 1000 + (conn.execute(sa.select(sa.func.count()).select_from(schema.audit_events)).scalar() or 0)
            for number, (kind, table, column, value) in enumerate(plantings):
                if kind == "account":
                    conn.execute(schema.accounts.update().where(schema.accounts.c.name == "a").values({column: value}))
                    named.append(("dp_budget_accounts", "a", column))
                elif kind == "junk":
                    conn.execute(schema.audit_events.insert(), [
                        dict(account=f"junk-{uuid.uuid4().hex[:6]}-{i}", account_seq=1, event="reserved",
                             spent_after="0", delta_spent_after="0", context="{}", created_at="x", prev_hash="0" * 64,
                             row_hash="0" * 64, amount="1")
                        for i in range(int(value))])
                    named.append(("junk", int(value), ""))
                elif table == "dp_charges":
                    values = dict(account="a", dag_id="d", run_id=f"hostile-{uuid.uuid4().hex}", task_id="t",
                                  map_index=-1, release_name="r", attempt=1, state="committed", amount="1/400",
                                  delta_amount="0", mechanisms="[]", spec_hash="0" * 64, context="{}",
                                  output='{"value":1}', output_digest="0" * 64, created_at=dt.datetime.now(dt.timezone.utc),
                                  updated_at=dt.datetime.now(dt.timezone.utc))
                    if kind == "raw":
                        values[column] = sa.literal_column(str(value))
                    else:
                        values[column] = value
                    statement = schema.charges.insert().values(values)
                    new_id = conn.execute(statement).inserted_primary_key[0]
                    named.append(("dp_charges", new_id, column))
                else:
                    values = dict(account="a", account_seq=seq + number, event="refused", dag_id="d", amount="1/400",
                                  delta_amount="0", spent_after="0", delta_spent_after="0", mechanisms="[]",
                                  context="{}", details='{"reason":"x"}', created_at=timestamp_text(dt.datetime.now(
                                      dt.timezone.utc)), prev_hash="0" * 64, row_hash="0" * 64)
                    values[column] = value
                    new_id = conn.execute(schema.audit_events.insert().values(values)).inserted_primary_key[0]
                    named.append(("dp_audit_events", new_id, column))
            if sqlite:
                for statement in schema.trigger_ddl("sqlite"):
                    conn.exec_driver_sql(statement)
    finally:
        engine.dispose()
    return named


NUMBER_TARGETS = st.one_of(
    st.tuples(st.just("new"), st.just("dp_charges"), st.sampled_from(["amount", "delta_amount"]),
              st.sampled_from(HOSTILE_NUMBERS)),
    st.tuples(st.just("new"), st.just("dp_audit_events"),
              st.sampled_from(["amount", "delta_amount", "spent_after", "delta_spent_after"]),
              st.sampled_from(HOSTILE_NUMBERS)),
    st.tuples(st.just("account"), st.just("dp_budget_accounts"),
              st.sampled_from(["cap", "spent", "delta", "delta_spent"]), st.sampled_from(HOSTILE_NUMBERS)),
)
JSON_TARGETS = st.one_of(
    st.tuples(st.just("new"), st.just("dp_charges"), st.sampled_from(["mechanisms", "context"]),
              st.sampled_from(HOSTILE_JSON)),
    # an output may be longer (256 MiB): a 10 MB JSON string is a legitimate one
    st.tuples(st.just("new"), st.just("dp_charges"), st.just("output"),
              st.sampled_from([text for text in HOSTILE_JSON if len(text) < 2**20] + HOSTILE_LONG_OUTPUTS)),
    st.tuples(st.just("new"), st.just("dp_audit_events"), st.sampled_from(["mechanisms", "context", "details"]),
              st.sampled_from(HOSTILE_JSON)),
    st.tuples(st.just("account"), st.just("dp_budget_accounts"), st.sampled_from(["allowed_dags", "config"]),
              st.sampled_from(HOSTILE_JSON)),
)
JUNK = st.tuples(st.just("junk"), st.just("dp_audit_events"), st.just(""), st.integers(1, 300))
#: SQLite holds any value in any column (SQL expressions): wrong types, times that are none, undecodable text
#: (read back as U+FFFD), 10 MB names; each pair is one the column never holds.
TEN_MB_SQL = "'" + "q" * (10 * 2**20) + "'"
SQLITE_RAW = [
    ("created_at", "'yesterday'"), ("created_at", "X'00ff'"), ("created_at", "CAST(X'ff' AS TEXT)"),
    ("created_at", "1e308"), ("created_at", TEN_MB_SQL), ("map_index", "'bogus'"), ("map_index", "X'00ff'"),
    ("map_index", "-9.5"), ("attempt", "1e308"), ("attempt", TEN_MB_SQL), ("dag_id", TEN_MB_SQL),
    ("run_id", "X'00ff'"), ("state", "'bogus'"), ("state", TEN_MB_SQL), ("amount", "1e308"),
    ("amount", "CAST(X'ff' AS TEXT)"), ("amount", "X'31'"), ("mechanisms", "1e308"),
    ("mechanisms", "CAST(X'ff' AS TEXT)"), ("context", "X'7b7d'"),
]
SQLITE_ONLY = st.sampled_from(SQLITE_RAW).map(lambda pair: ("raw", "dp_charges", pair[0], Hostile(pair[1])))


# -- what every reader must do --------------------------------------------------------------------------------------


@pytest.fixture
def no_slow_fractions(monkeypatch):
    """From now on ``Fraction`` refuses (fails the test on) a text that is not a number in the ledger's form, and a
    ``Decimal`` with a huge exponent: parsing either can take for ever, so no reader may ask for one."""
    original = Fraction.__new__

    def watched(cls, numerator=0, denominator=None, **kwargs):
        if isinstance(numerator, str) and number_problem(numerator) is not None and len(numerator) > 30:
            raise AssertionError(f"Fraction asked to parse stored text {numerator[:40]!r}")
        if isinstance(numerator, str) and ("e" in numerator.lower() and "-" in numerator):
            raise AssertionError(f"Fraction asked to parse an exponent: {numerator[:40]!r}")
        if isinstance(numerator, Decimal) and numerator.is_finite() and abs(numerator.as_tuple().exponent) > 1000:
            raise AssertionError(f"Fraction asked to expand {numerator!r}")
        return original(cls, numerator, denominator, **kwargs)

    monkeypatch.setattr(Fraction, "__new__", staticmethod(watched))


def dpctl(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=True)


def check_every_reader(url: str, named: list[tuple[str, object, str]]) -> None:
    """Verify (API and CLI), history (table and JSON) and the dashboard's queries finish on ``url`` without an
    exception, and name every hostile row of ``named``."""
    # verify: a report naming each row, never an exception
    report = verify_ledger(governor(url), KEYS, governor_key_ids={GOVERNOR_KEY.key_id})
    assert not report.ok
    junk = sum(row for table, row, _ in named if table == "junk")  # every junk planting is counted in one problem
    if junk:
        assert any(f"{junk} audit event{'s' if junk > 1 else ''} name" in p and "no dp_budget_accounts row" in p
                   for p in report.problems), report.problems[:5]
    for table, row, column in named:
        if table == "junk":
            continue
        where = f"{table} id={row}" if table != "dp_budget_accounts" else f"dp_budget_accounts {row!r}"
        assert any(p.startswith(where) and column in p for p in report.problems), (where, column, report.problems[:8])
    assert all(len(p) <= 4100 for p in report.problems)
    env = {"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text}
    result = CliRunner(env=env).invoke(app, ["ledger", "verify", "--url", url])
    assert result.exit_code == 3, (result.exit_code, result.output[-2000:], result.exception)
    assert "ledger inconsistent: first broken:" in result.output

    # history: every charge printed; a hostile one marked unreadable, naming its column
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        charge_ids = sorted(conn.execute(sa.select(schema.charges.c.id)).scalars())
    engine.dispose()
    result = dpctl("ledger", "history", "--url", url, "--json")
    assert result.exit_code == 0, (result.output[-2000:], result.exception)
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [c["id"] for c in printed] == charge_ids
    hostile_charges = {row: column for table, row, column in named if table == "dp_charges"}
    for charge in printed:
        column = hostile_charges.get(charge["id"])
        if column is not None and column != "output":  # history leaves the output out
            assert any(problem.startswith(column) for problem in charge.get("unreadable", [])), charge
    for table_text in (dpctl("ledger", "history", "--url", url), dpctl("ledger", "history", "--url", url, "--limit", "3")):
        assert table_text.exit_code == 0, (table_text.output[-2000:], table_text.exception)
    result = dpctl("ledger", "history", "--url", url)
    if any(column != "output" for column in hostile_charges.values()):
        assert "UNREADABLE ROW" in result.stdout

    # the dashboard's queries
    overview = queries.accounts_overview(url)
    assert [row["name"] for row in overview] == ["a", "b"]
    account_hostile = any(table == "dp_budget_accounts" for table, _, _ in named)
    assert bool(overview[0].get("unreadable")) == account_hostile, overview[0]
    assert not overview[1].get("unreadable")
    detail = queries.account_detail(url, "a")
    assert detail["charge_counts"]["total"] == sum(1 for c in printed if c["account"] == "a")
    page = queries.account_charges(url, "a", limit=500)
    shown = {charge["id"]: charge for charge in page["charges"]}
    page_columns = {"dag_id", "run_id", "task_id", "map_index", "release_name", "attempt", "state", "amount",
                    "delta_amount", "mechanisms", "created_at", "updated_at"}
    for row, column in hostile_charges.items():
        if row in shown and column in page_columns:
            assert any(problem.startswith(column) for problem in shown[row].get("unreadable", [])), shown[row]
    queries.run_charges(url, "d", "r1")
    release_columns = {"account", "dag_id", "run_id", "task_id", "map_index", "release_name", "attempt", "state",
                       "amount", "output", "output_digest", "created_at", "updated_at"}
    for row, column in hostile_charges.items():
        release = queries.release_detail(url, row, limit=10)
        assert release is not None
        if column in release_columns:
            assert any(problem.startswith(column) for problem in release.get("unreadable", [])), release
        json.dumps(release, default=str, allow_nan=False)  # what the API answers: plain, finite JSON


#: Examples run in full (every reader on a fresh ledger each); a failure is reported as found, not shrunk.
FUZZ = dict(deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                   HealthCheck.data_too_large])


SQLITE_PLANTINGS = st.lists(st.one_of(NUMBER_TARGETS, JSON_TARGETS, JUNK, SQLITE_ONLY), min_size=1, max_size=4)
PG_PLANTINGS = st.lists(st.one_of(NUMBER_TARGETS, JSON_TARGETS, JUNK), min_size=1, max_size=3)
# ``make test`` runs the explicit examples and a few drawn ones; the tests marked slow draw more (ADR 30).


@settings(max_examples=5, **FUZZ)
@given(plantings=SQLITE_PLANTINGS)
@example(plantings=[("junk", "dp_audit_events", "", 172), ("junk", "dp_audit_events", "", 1)])  # one problem counts both
@example(plantings=[("new", "dp_charges", "output", text) for text in HOSTILE_LONG_OUTPUTS[:3]])
def test_hostile_rows_on_sqlite_are_named_and_never_crash_or_hang_a_reader(sqlite_copies, no_slow_fractions, plantings):
    """On SQLite every reader finishes and names each planted row by table, id and column."""
    url = sqlite_copies()
    check_every_reader(url, plant(url, plantings))


@pytest.mark.slow
@settings(max_examples=14, **FUZZ)
@given(plantings=SQLITE_PLANTINGS)
def test_more_hostile_rows_on_sqlite_are_named_and_never_crash_or_hang_a_reader(sqlite_copies, no_slow_fractions,
                                                                                plantings):
    """The test above on 14 more drawn ledgers."""
    url = sqlite_copies()
    check_every_reader(url, plant(url, plantings))


@settings(max_examples=2, **FUZZ)
@given(plantings=PG_PLANTINGS)
@example(plantings=[("new", "dp_charges", "output", text) for text in HOSTILE_LONG_OUTPUTS[3:]])
def test_hostile_rows_on_postgresql_are_named_and_never_crash_or_hang_a_reader(pg_copies, no_slow_fractions,
                                                                                plantings):
    """On PostgreSQL (raw SQL as the tables' owner) every reader finishes and names each planted row."""
    url = pg_copies()
    check_every_reader(url, plant(url, plantings))


@pytest.mark.slow
@settings(max_examples=6, **FUZZ)
@given(plantings=PG_PLANTINGS)
def test_more_hostile_rows_on_postgresql_are_named_and_never_crash_or_hang_a_reader(pg_copies, no_slow_fractions,
                                                                                     plantings):
    """The test above on 6 more drawn ledgers."""
    url = pg_copies()
    check_every_reader(url, plant(url, plantings))


# -- the negative control -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_legitimate_ledger_reads_clean_everywhere(backend, request, no_slow_fractions):
    """A ledger written through the API verifies clean (exit 0), and history and the dashboard mark nothing."""
    url = request.getfixturevalue(f"{'sqlite' if backend == 'sqlite' else 'pg'}_copies")()
    report = verify_ledger(governor(url), KEYS, governor_key_ids={GOVERNOR_KEY.key_id})
    assert report.ok, report.problems
    env = {"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text}
    result = CliRunner(env=env).invoke(app, ["ledger", "verify", "--url", url])
    assert result.exit_code == 0, result.output
    printed = [json.loads(line) for line in dpctl("ledger", "history", "--url", url, "--json").stdout.splitlines()]
    assert len(printed) == 5 and not any("unreadable" in charge for charge in printed)
    assert "UNREADABLE" not in dpctl("ledger", "history", "--url", url).stdout
    overview = queries.accounts_overview(url)
    assert [row["name"] for row in overview] == ["a", "b"] and not any("unreadable" in row for row in overview)
    assert overview[0]["spent"] == str(Fraction(1, 400) + Fraction(1, 300) + Fraction(1, 7))
    pages = [queries.account_charges(url, name) for name in ("a", "b")] + [queries.run_charges(url, "d", "r1")]
    assert not any("unreadable" in charge for page in pages for charge in page["charges"])
    for charge in printed:
        assert "unreadable" not in queries.release_detail(url, charge["id"])
    assert queries.account_detail(url, "a")["burn_down"]["points"]


# -- the reported cases, one by one ---------------------------------------------------------------------------------


def test_huge_digits_in_an_event_and_in_spent_are_named_by_verify_which_exits_3(sqlite_copies):
    """A 400-digit event amount and a 400-digit spent are problems naming their rows; verify goes on and exits 3."""
    url = sqlite_copies()
    named = plant(url, [("new", "dp_audit_events", "amount", "9" * 400),
                        ("account", "dp_budget_accounts", "spent", "9" * 400)])
    report = verify_ledger(governor(url), KEYS, governor_key_ids={GOVERNOR_KEY.key_id})
    event_id = named[0][1]
    assert any(p.startswith(f"dp_audit_events id={event_id} (") and "amount '999" in p
               and "is 400 characters long; a stored number has at most 122" in p for p in report.problems), report.problems
    assert any(p.startswith("dp_budget_accounts 'a': spent '999") and "is not a number" in p for p in report.problems)
    assert report.charges == 5 and report.accounts == 2  # it read to the end
    env = {"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text}
    assert CliRunner(env=env).invoke(app, ["ledger", "verify", "--url", url]).exit_code == 3
    overview = queries.accounts_overview(url)
    assert overview[0]["unreadable"] == [
        "dp_budget_accounts 'a': spent '" + "9" * 60 + "'… (400 characters) is 400 characters long; a stored number "
        "has at most 122"]
    with pytest.raises(UnreadableValueError, match="dp_budget_accounts 'a': spent"):
        spender(url).account("a")


def test_an_amount_with_a_huge_exponent_is_shown_unreadable_without_parsing(sqlite_copies, no_slow_fractions):
    """``1e-99999999`` as a charge's amount: history (table and JSON) and the charge pages show the row unreadable,
    every other row as usual, and nothing asks ``Fraction`` to parse it."""
    url = sqlite_copies()
    (_, charge_id, _), = plant(url, [("new", "dp_charges", "amount", "1e-99999999")])
    lines = [json.loads(line) for line in dpctl("ledger", "history", "--url", url, "--json").stdout.splitlines()]
    hostile_line = next(line for line in lines if line["id"] == charge_id)
    assert hostile_line["amount"] is None
    assert hostile_line["unreadable"] == ["amount '1e-99999999' is not of the form p, -p or p/q in ASCII digits "
                                          "(str(Fraction))"]
    assert sum("unreadable" in line for line in lines) == 1
    table = dpctl("ledger", "history", "--url", url).stdout
    assert "UNREADABLE ROW: amount '1e-99999999'" in table and table.count("committed") == 3
    page = queries.account_charges(url, "a")
    hostile_charge = next(charge for charge in page["charges"] if charge["id"] == charge_id)
    assert hostile_charge["amount"] is None and hostile_charge["amount_float"] is None
    assert hostile_charge["unreadable"][0].startswith("amount '1e-99999999'")
    assert queries.release_detail(url, charge_id)["unreadable"][0].startswith("amount '1e-99999999'")
    assert queries.account_detail(url, "a")["burn_down"]["points"]  # left out of the sums, not an error


@pytest.mark.parametrize("column", ["mechanisms", "context", "output"])
def test_deeply_nested_json_is_unreadable_not_a_recursion_error(sqlite_copies, column):
    """JSON nested 200,000 deep in a charge's JSON columns is named unreadable by history, the dashboard and
    verify."""
    url = sqlite_copies()
    (_, charge_id, _), = plant(url, [("new", "dp_charges", column, "[" * 200_000 + "]" * 200_000)])
    result = dpctl("ledger", "history", "--url", url, "--json")
    assert result.exit_code == 0
    line = next(json.loads(text) for text in result.stdout.splitlines() if json.loads(text)["id"] == charge_id)
    if column != "output":
        assert line["unreadable"] == [f"{column} nests deeper than 64 levels"] and line[column] is None
    if column == "output":
        assert queries.release_detail(url, charge_id)["unreadable"] == ["output nests deeper than 64 levels"]
    report = verify_ledger(governor(url), KEYS, governor_key_ids={GOVERNOR_KEY.key_id})
    assert any(p.startswith(f"dp_charges id={charge_id} (") and f"{column} is not JSON text the ledger writes: it "
               "nests deeper than 64 levels" in p for p in report.problems), report.problems


def test_events_of_accounts_that_do_not_exist_are_counted_with_the_first_ids(sqlite_copies):
    """Junk events naming made-up accounts are one problem: how many, how many accounts, the smallest ids."""
    url = sqlite_copies()
    plant(url, [("junk", "dp_audit_events", "", 12)])
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        junk_ids = sorted(conn.execute(sa.select(schema.audit_events.c.id).where(
            schema.audit_events.c.account.like("junk-%"))).scalars())
    engine.dispose()
    report = verify_ledger(governor(url), KEYS, governor_key_ids={GOVERNOR_KEY.key_id})
    assert len(report.problems) == 1, report.problems
    first_five = ", ".join(map(str, junk_ids[:5]))
    assert report.problems[0].startswith(f"dp_audit_events id={first_five} ...: 12 audit events name 12 accounts that "
                                         "have no dp_budget_accounts row ('junk-")
    assert "and 7 more): the account row was deleted, or the events were written outside the ledger" in report.problems[0]


# -- memory: bounded by the real accounts, not by junk rows -----------------------------------------------------------


def _verify_peak(url: str) -> tuple[int, object]:
    tracemalloc.start()
    try:
        report = verify_ledger(governor(url), KEYS, governor_key_ids={GOVERNOR_KEY.key_id})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, report


@pytest.mark.slow
def test_verify_memory_does_not_grow_with_junk_audit_rows(sqlite_copies):
    """200,000 audit events naming 200,000 made-up accounts (half naming a charge) raise verify's peak memory by
    less than a constant over the clean ledger's (counted with tracemalloc, not timed)."""
    url = sqlite_copies()
    clean_peak, clean = _verify_peak(url)
    assert clean.ok, clean.problems
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(schema.audit_events.insert(), [
            dict(account=f"made-up-account-{i:06d}", account_seq=1, event="reserved", charge_id=i % 2 or None,
                 amount="1/400", delta_amount="0", spent_after="1/400", delta_spent_after="0", mechanisms="[]",
                 context=canonical_json({"host": "junk", "pid": i}), created_at="2026-01-01T00:00:00.000000+00:00",
                 prev_hash="0" * 64, row_hash=f"{i:064x}")
            for i in range(200_000)])
    engine.dispose()
    junk_peak, junk = _verify_peak(url)
    assert junk.problems[0].startswith("dp_audit_events id=")
    assert "200,000 audit events name 200,000 accounts that have no dp_budget_accounts row" in junk.problems[0]
    assert junk.events == clean.events + 200_000
    print(f"verify peak: clean ledger {clean_peak / 2**20:.2f} MiB, with 200,000 junk rows {junk_peak / 2**20:.2f} MiB")
    assert junk_peak < clean_peak + 2 * 2**20, (clean_peak, junk_peak)


# -- the bounds: every value the ledger writes passes, nothing else does ----------------------------------------------


@settings(max_examples=300, deadline=None, database=None)
@given(numerator=st.integers(-(10**MAX_DIGITS) + 1, 10**MAX_DIGITS - 1), denominator=st.integers(1, 10**MAX_DIGITS - 1))
def test_every_fraction_within_the_digit_bound_reads_back_exactly(numerator, denominator):
    """``read_number(str(f)) == f`` for every fraction of at most 60 digits above and below the line."""
    value = Fraction(numerator, denominator)
    assert read_number(str(value)) == value


@settings(max_examples=200, deadline=None, database=None)
@given(cap=st.fractions(min_value=Fraction(1, 10**18), max_value=Fraction(10**42)),
       charges=st.lists(st.fractions(min_value=Fraction(1, 10**30), max_value=Fraction(10**6)), max_size=20))
def test_what_the_ledger_writes_for_sane_caps_and_charges_is_within_the_bounds(cap, charges):
    """Charges and running totals rounded onto the 10^-18 grid, and caps up to 10^42, all read back."""
    from dp_operators.accounting import round_down, round_up

    spent = Fraction(0)
    for charge in charges:
        amount = round_up(charge)
        spent = round_up(spent + amount)
        for value in (amount, spent, round_down(cap - spent)):
            if abs(value) < 10**42:
                assert read_number(str(value)) == value
    assert read_number(str(cap.limit_denominator(10**18))) == cap.limit_denominator(10**18)


@pytest.mark.parametrize("written", ["1e-6", "1e-5", "0.5", "2", "1e-59", "0.123456789012", "100"])
def test_an_officers_decimal_cap_or_delta_reads_back(written):
    """What ``ledgers.yaml`` decimals become (``str`` of their exact fraction) reads back, down to 1e-59."""
    from dp_operators.accounting import exact_number

    value = exact_number(written)
    assert read_number(str(value)) == value


def test_every_number_an_older_ledger_wrote_reads_back(tmp_path):
    """The numbers of a schema-2 ledger, as that version wrote them, are all in the accepted form."""
    from old_ledgers import version_2_ledger

    url = f"sqlite:///{tmp_path / 'old.db'}"
    version_2_ledger(url, cap="1/2", key=ReleaseKey("d", "r", "t", -1, "r"), output={"value": 1})
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        texts = [value for table, columns in (("dp_budget_accounts", ("cap", "spent", "delta_spent")),
                                               ("dp_charges", ("amount", "delta_amount")),
                                               ("dp_audit_events", ("amount", "delta_amount", "spent_after",
                                                                    "delta_spent_after")))
                 for row in conn.exec_driver_sql(f"SELECT {', '.join(columns)} FROM {table}") for value in row
                 if value is not None]
    engine.dispose()
    assert len(texts) > 10 and all(number_problem(text) is None for text in texts), texts


@pytest.mark.parametrize("text", HOSTILE_NUMBERS, ids=repr)
def test_hostile_number_texts_are_refused_before_any_number_is_built(text, no_slow_fractions):
    """Each hostile text is refused by its grammar and digit bound; the write path's reader refuses it too."""
    assert number_problem(text) is not None
    with pytest.raises(AuditChainError, match="budget account 'a': spent is .*, not a number the ledger writes"):
        stored_fraction(text, "budget account 'a': spent")


def test_json_is_bounded_in_depth_length_and_numbers():
    """Depth 64 reads and 65 does not (iteratively up to the parser's own limit, then by its RecursionError);
    texts over their column's length, NaN, infinities and integers over 4,300 digits are refused."""
    from dp_operators.ledger.bounded import MAX_JSON_CHARS, MAX_JSON_DEPTH, BoundsError

    assert read_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    for depth in (MAX_JSON_DEPTH + 1, 900, 200_000):
        with pytest.raises(BoundsError, match="nests deeper than 64 levels"):
            read_json("[" * depth + "]" * depth)
    assert read_json('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    long_text = '"' + "x" * MAX_JSON_CHARS + '"'
    with pytest.raises(BoundsError, match="characters long"):
        read_json(long_text)
    assert read_json(long_text, max_chars=len(long_text)) == "x" * MAX_JSON_CHARS
    for text, reason in (("NaN", "NaN"), ("[-Infinity]", "-Infinity"), ("[1e400]", "beyond the doubles"),
                         ("[" + "9" * 4301 + "]", "more than 4,300 digits"), ("{", "not JSON text")):
        with pytest.raises(BoundsError, match=reason):
            read_json(text)


def test_sqlite_text_that_is_not_utf8_is_read_with_replacement_characters(sqlite_copies):
    """Bytes that are not UTF-8 stored as text (SQLite stores anything) fail no read: verify, history and the
    dashboard see U+FFFD and name the value."""
    url = sqlite_copies()
    (_, charge_id, _), = plant(url, [("raw", "dp_charges", "amount", "CAST(X'31ff' AS TEXT)")])
    report = verify_ledger(governor(url), KEYS, governor_key_ids={GOVERNOR_KEY.key_id})
    assert any(p.startswith(f"dp_charges id={charge_id} (") and "amount '1\ufffd' is not a number" in p
               for p in report.problems), report.problems
    lines = [json.loads(line) for line in dpctl("ledger", "history", "--url", url, "--json").stdout.splitlines()]
    assert next(line for line in lines if line["id"] == charge_id)["unreadable"][0].startswith("amount '1\ufffd'")
    page = queries.account_charges(url, "a")
    assert next(c for c in page["charges"] if c["id"] == charge_id)["unreadable"][0].startswith("amount '1\ufffd'")
    assert verify_ledger(governor(sqlite_copies()), KEYS, governor_key_ids={GOVERNOR_KEY.key_id}).ok
