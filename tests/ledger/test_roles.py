"""PostgreSQL roles (docs/adr/0020, docs/adr/0029): the database itself refuses governance to the spender role.

The ledger is initialised by the admin (``postgres``, the tables' owner); :func:`apply_roles` grants a spender and a
governor login role their privileges; then task code holding the spender connection tries, in raw SQL, everything
a task must not do. Each attempt must fail with PostgreSQL's ``insufficient_privilege`` (SQLSTATE 42501), not with a
Python check. Roles are cluster-wide: every role here has a unique name and is dropped afterwards.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction

import psycopg
import pytest
import sqlalchemy as sa

from dp_operators.ledger import (
    Ledger,
    LedgerConfig,
    LedgerGovernor,
    LeaseHeldError,
    LedgerAccessError,
    ReleaseKey,
)
from dp_operators.ledger import schema
from dp_operators.ledger.keys import Keyring
from dp_operators.ledger.roles import (
    LEDGER_FUNCTIONS,
    LEDGER_SEQUENCES,
    LEDGER_TABLES,
    SPEND_FUNCTIONS,
    apply_roles,
    role_statements,
)
from ledger_backends import account_config
from support import GOVERNOR_KEY, SPEND_KEY

NO_MECHANISMS: list[dict] = []
LEDGER_TABLE_OBJECTS = (schema.schema_version, schema.accounts, schema.charges, schema.audit_events)


def release_key(run: str, dag: str = "d") -> ReleaseKey:
    return ReleaseKey(dag, run, "t", -1, "r")


@dataclass
class Deployment:
    """A ledger schema owned by ``postgres``, with a spender, a governor and an outsider login role."""

    database: sa.URL
    schema: str
    spender_role: str
    governor_role: str
    outsider_role: str
    engines: list[sa.Engine] = field(default_factory=list)

    def url(self, role: str = "postgres") -> str:
        return (
            self.database.set(username=role)
            .update_query_dict({"options": f"-csearch_path={self.schema}"})
            .render_as_string(hide_password=False)
        )

    def raw(self, role: str) -> sa.Engine:
        """A plain engine connected as ``role`` (what task code could open with the same connection)."""
        engine = sa.create_engine(self.url(role))
        self.engines.append(engine)
        return engine

    def spender(self, **kwargs) -> Ledger:
        ledger = Ledger(self.url(self.spender_role), audit_key=SPEND_KEY, **kwargs)
        self.engines += [ledger.engine, ledger._reader]
        return ledger

    def governor(self, role: str | None = None) -> LedgerGovernor:
        officer = LedgerGovernor(self.url(role or self.governor_role), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
        self.engines += [officer.engine, officer._reader]
        return officer

    def owner_row(self, account: str) -> dict:
        with self.raw("postgres").connect() as conn:
            row = conn.execute(sa.text("SELECT * FROM dp_budget_accounts WHERE name = :n"), {"n": account}).one()
            return dict(row._mapping)

    def dispose(self) -> None:
        for engine in self.engines:
            engine.dispose()
        self.engines.clear()


def _admin(database: sa.URL) -> sa.Engine:
    return sa.create_engine(database, isolation_level="AUTOCOMMIT")


def _drop_roles(database: sa.URL, *roles: str) -> None:
    admin = _admin(database)
    try:
        with admin.connect() as conn:
            for role in roles:
                exists = conn.exec_driver_sql(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'").first()
                if exists:
                    conn.exec_driver_sql(f'REASSIGN OWNED BY "{role}" TO postgres')
                    conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
                    conn.exec_driver_sql(f'DROP ROLE "{role}"')
    finally:
        admin.dispose()


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def deployment(pg_database: sa.URL) -> Iterator[Deployment]:
    """Schema initialised as ``postgres``; roles applied; accounts ``a`` (spender tests) and ``g`` (governor tests)
    created by the governor role."""
    d = Deployment(
        pg_database, _unique("t_roles"), _unique("dp_spender"), _unique("dp_governor"), _unique("dp_outsider")
    )
    admin = _admin(pg_database)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{d.schema}"')
        for role in (d.spender_role, d.governor_role, d.outsider_role):
            conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        conn.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{d.schema}" TO "{d.outsider_role}"')
    admin.dispose()
    try:
        d.governor("postgres").init_schema()
        apply_roles(d.raw("postgres"), d.spender_role, d.governor_role)
        d.governor().apply_config(
            LedgerConfig(
                version=1,
                accounts={
                    "a": account_config("pure_dp", cap=10, dags=("d",)),
                    "g": account_config("pure_dp", cap=10, dags=("d",)),
                },
            )
        )
        yield d
    finally:
        d.dispose()
        admin = _admin(pg_database)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{d.schema}" CASCADE')
        admin.dispose()
        _drop_roles(pg_database, d.spender_role, d.governor_role, d.outsider_role)


def _denied(engine: sa.Engine, statement: str) -> tuple[str, str]:
    """Run ``statement`` in its own transaction; return ``(error class, message)`` of the database's refusal, or
    ``("ALLOWED", "")`` if it ran (then rolled back)."""
    try:
        with engine.connect() as conn:
            with conn.begin() as transaction:
                conn.exec_driver_sql(statement.replace("%", "%%"))
                transaction.rollback()
    except sa.exc.DBAPIError as error:
        original = error.orig
        return f"{type(original).__name__} ({original.sqlstate})", str(original).splitlines()[0]
    return "ALLOWED", ""


DENIED = "permission denied for table"

#: What task code with the spender connection tries (raw SQL), and the refusal expected (a regular expression).
SPENDER_ATTEMPTS = [
    ("raise a cap", "UPDATE dp_budget_accounts SET cap = '1000' WHERE name = 'a'", DENIED),
    ("add a DAG to an allowlist", """UPDATE dp_budget_accounts SET allowed_dags = '["d", "evil"]'""", DENIED),
    ("change an accountant", "UPDATE dp_budget_accounts SET accountant = 'approx_dp'", DENIED),
    ("re-key an account", "UPDATE dp_budget_accounts SET spend_key_id = '0000000000000000'", DENIED),
    ("change a delta cap", "UPDATE dp_budget_accounts SET delta = '0.5'", DENIED),
    ("change a privacy unit", "UPDATE dp_budget_accounts SET privacy_unit = 'household'", DENIED),
    ("rename an account", "UPDATE dp_budget_accounts SET name = 'b' WHERE name = 'a'", DENIED),
    (
        "create an account",
        "INSERT INTO dp_budget_accounts (name, accountant, cap, spent, delta_spent, privacy_unit, allowed_dags, "
        """audit_seq, created_at, updated_at) VALUES ('new', 'pure_dp', '100', '0', '0', 'person', '["d"]', 0, """
        "now(), now())",
        DENIED,
    ),
    ("delete an account", "DELETE FROM dp_budget_accounts", DENIED),
    ("delete charges", "DELETE FROM dp_charges", DENIED),
    ("truncate charges", "TRUNCATE dp_charges", DENIED),
    ("re-price a charge", "UPDATE dp_charges SET amount = '0'", DENIED),
    ("re-key a charge", "UPDATE dp_charges SET run_id = 'other'", DENIED),
    ("edit an audit event", "UPDATE dp_audit_events SET amount = '0'", DENIED),
    ("delete audit events", "DELETE FROM dp_audit_events", DENIED),
    ("record a schema version", "INSERT INTO dp_schema_version VALUES (99, now())", DENIED),
    ("disable the audit triggers", "ALTER TABLE dp_audit_events DISABLE TRIGGER USER", "must be owner of table"),
    ("disable the charge guard", "ALTER TABLE dp_charges DISABLE TRIGGER dp_charges_guard", "must be owner of table"),
    ("drop an audit trigger", "DROP TRIGGER dp_audit_no_update ON dp_audit_events", "must be owner of"),
    (
        "replace a trigger function",
        "CREATE OR REPLACE FUNCTION dp_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RETURN NEW; END $$",
        "permission denied for schema|must be owner of function",  # no CREATE on the schema, or not the owner
    ),
    ("drop a trigger function", "DROP FUNCTION dp_audit_append_only() CASCADE", "must be owner of function"),
    (
        "add a trigger",
        "CREATE TRIGGER dp_evil BEFORE INSERT ON dp_charges FOR EACH ROW EXECUTE FUNCTION dp_rows_kept()",
        DENIED,
    ),
    ("take the tables over", "ALTER TABLE dp_budget_accounts OWNER TO CURRENT_USER", "must be owner of table"),
    ("become the owner", "SET ROLE postgres", "permission denied to set role"),
]


def test_the_spender_role_is_refused_every_governance_change_by_the_database(deployment, capsys):
    engine = deployment.raw(deployment.spender_role)
    before = deployment.owner_row("a")
    outcomes = [(action, *_denied(engine, statement), expected) for action, statement, expected in SPENDER_ATTEMPTS]
    with capsys.disabled():
        print(f"\n{'attempt (spender role, raw SQL)':32} | {'database error':34} | message")
        for action, error, message, _ in outcomes:
            print(f"{action:32} | {error:34} | {message}")
    allowed = [action for action, error, _, _ in outcomes if error == "ALLOWED"]
    assert not allowed, f"the spender role was allowed to: {allowed}"
    wrong = [
        (action, error, message)
        for action, error, message, expected in outcomes
        if not error.startswith("InsufficientPrivilege (42501)") or not re.search(expected, message)
    ]
    assert not wrong, f"refused, but not for lack of privilege: {wrong}"
    assert deployment.owner_row("a") == before


def test_the_governor_api_with_the_spender_connection_is_refused_by_the_database(deployment):
    before = deployment.owner_row("a")
    officer = LedgerGovernor(
        deployment.url(deployment.spender_role), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY
    )
    deployment.engines += [officer.engine, officer._reader]
    raise_cap = LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=1000, dags=("d", "evil"))})
    with pytest.raises(sa.exc.ProgrammingError) as raised:
        officer.apply_config(raise_cap)
    assert isinstance(raised.value.orig, psycopg.errors.InsufficientPrivilege)
    assert "permission denied for table dp_budget_accounts" in str(raised.value.orig)
    create = LedgerConfig(version=1, accounts={"new": account_config("pure_dp", cap=1000)})
    with pytest.raises(sa.exc.ProgrammingError) as raised:
        officer.apply_config(create)
    assert isinstance(raised.value.orig, psycopg.errors.InsufficientPrivilege)
    with pytest.raises(sa.exc.ProgrammingError) as raised:  # init replaces the trigger functions: owner only
        officer.init_schema()
    assert isinstance(raised.value.orig, psycopg.errors.InsufficientPrivilege)
    assert deployment.owner_row("a") == before
    assert "new" not in [account.name for account in deployment.spender().accounts()]  # the module's others vary


def test_dpctl_apply_as_the_spender_role_says_which_role_to_use(deployment, tmp_path):
    from typer.testing import CliRunner

    from dp_operators.cli import app

    config = tmp_path / "ledgers.yaml"
    config.write_text(
        "version: 1\naccounts:\n  a:\n    accountant: pure_dp\n    cap: 1000\n    privacy_unit: person\n"
        "    allowed_dags: [d]\n"
    )
    result = CliRunner().invoke(
        app, ["ledger", "apply", str(config), "--url", deployment.url(deployment.spender_role)],
        env={"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text},
    )
    assert result.exit_code == 1, result.output
    assert "permission denied for table dp_budget_accounts" in result.stderr
    assert "'apply' and 'reconcile' as the governor role" in result.stderr
    assert "Traceback" not in result.output


def test_a_release_cycle_works_as_the_spender_role(deployment):
    ledger = deployment.spender()
    spent_before = ledger.account("a").spent

    def reserve(run: str, on: Ledger = ledger):
        return on.reserve(
            release_key(run), account="a", amount=Fraction(1, 4), mechanisms=NO_MECHANISMS, spec_hash="0" * 64
        )

    committed = reserve("cycle-1")
    renewed_until = ledger.renew(committed)
    assert renewed_until >= committed.lease_expires_at
    with ledger.lease(committed):
        ledger.commit(committed, {"count": 3})
    assert ledger.stored_output(release_key("cycle-1")) == {"count": 3}
    assert reserve("cycle-1") == {"count": 3}  # replay: nothing charged

    released = reserve("cycle-2")
    ledger.release(released)

    live = reserve("cycle-3")
    with pytest.raises(LeaseHeldError):
        reserve("cycle-3")
    ledger.commit(live, {"count": 4})

    short = deployment.spender(lease_seconds=0.05)
    expired = reserve("cycle-4", short)
    taken_over = reserve("cycle-5", short)
    time.sleep(0.3)
    retry = reserve("cycle-5")  # the expired attempt is abandoned (still spent), the retry is charged
    assert retry.attempt == taken_over.attempt + 1
    ledger.commit(retry, {"count": 5})
    abandoned = ledger.reconcile()
    assert expired.charge_id in [charge["id"] for charge in abandoned]

    states = {charge["id"]: charge["state"] for charge in ledger.charges(account="a")}
    assert states[committed.charge_id] == "committed"
    assert states[released.charge_id] == "released"
    assert states[expired.charge_id] == states[taken_over.charge_id] == "abandoned"
    # committed 1-cycle, 3-cycle and 5-cycle; abandoned 4-cycle and the first 5-cycle; the release gave its back
    assert ledger.account("a").spent == spent_before + 5 * Fraction(1, 4)
    assert [event["event"] for event in ledger.events("a")][-2:] == ["committed", "abandoned"]

    # the spend functions lock rows for it: the spender itself may not (row locks need UPDATE on some column)
    spender = deployment.raw(deployment.spender_role)
    for statement in ("SELECT name FROM dp_budget_accounts WHERE name = 'a' FOR UPDATE",
                      f"SELECT id FROM dp_charges WHERE id = {committed.charge_id} FOR UPDATE"):
        error, message = _denied(spender, statement)
        assert error == "InsufficientPrivilege (42501)" and DENIED in message, (statement, message)


#: What the governor role may not do either: it governs accounts, it does not own the tables or rewrite spend.
GOVERNOR_ATTEMPTS = [
    ("delete charges", "DELETE FROM dp_charges", DENIED),
    ("re-price a charge", "UPDATE dp_charges SET amount = '0'", DENIED),
    ("replace a stored output", "UPDATE dp_charges SET output = '{}'", DENIED),
    ("insert a charge", "INSERT INTO dp_charges (id) VALUES (-1)", DENIED),
    ("edit an audit event", "UPDATE dp_audit_events SET amount = '0'", DENIED),
    ("rename an account", "UPDATE dp_budget_accounts SET name = 'b' WHERE name = 'g'", DENIED),
    ("disable the audit triggers", "ALTER TABLE dp_audit_events DISABLE TRIGGER USER", "must be owner of table"),
    ("drop an audit trigger", "DROP TRIGGER dp_audit_no_delete ON dp_audit_events", "must be owner of"),
]


def test_the_governor_role_applies_and_reconciles_but_owns_nothing(deployment):
    officer = deployment.governor()
    raised = LedgerConfig(version=1, accounts={"g": account_config("pure_dp", cap=20, dags=("d", "e"))})
    assert officer.apply_config(raised) == ["updated account 'g': allowed_dags, cap"]
    created = LedgerConfig(version=1, accounts={"h": account_config("pure_dp", cap=1)})
    assert officer.apply_config(created)[0].startswith("created account 'h'")
    status = officer.account("g")
    assert (status.cap, status.allowed_dags) == (20, ("d", "e"))

    short = deployment.spender(lease_seconds=0.05)
    stale = short.reserve(
        release_key("gov-1"), account="g", amount=Fraction(1), mechanisms=NO_MECHANISMS, spec_hash="0" * 64
    )
    time.sleep(0.3)
    abandoned = officer.reconcile()
    assert [charge["id"] for charge in abandoned if charge["account"] == "g"] == [stale.charge_id]
    assert officer.account("g").spent == 1  # abandoned stays spent
    last = list(officer.events("g"))[-1]
    assert (last["event"], last["key_id"]) == ("abandoned", GOVERNOR_KEY.key_id)

    engine = deployment.raw(deployment.governor_role)
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT name FROM dp_budget_accounts WHERE name = 'g' FOR UPDATE").all()
        assert conn.exec_driver_sql(f"SELECT id FROM dp_charges WHERE id = {stale.charge_id} FOR UPDATE").all()
    outcomes = [(action, *_denied(engine, statement), expected) for action, statement, expected in GOVERNOR_ATTEMPTS]
    wrong = [
        (action, error, message)
        for action, error, message, expected in outcomes
        if not error.startswith("InsufficientPrivilege (42501)") or not re.search(expected, message)
    ]
    assert not wrong, f"the governor role was not refused for lack of privilege: {wrong}"
    with pytest.raises(sa.exc.ProgrammingError) as refused:
        officer.init_schema()
    assert isinstance(refused.value.orig, psycopg.errors.InsufficientPrivilege)


def test_a_role_without_grants_cannot_read_the_ledger(deployment):
    error, message = _denied(deployment.raw(deployment.outsider_role), "SELECT cap FROM dp_budget_accounts")
    assert error == "InsufficientPrivilege (42501)" and "permission denied for table dp_budget_accounts" in message


def test_verify_passes_as_the_governor_role_after_all_of_it(deployment):
    # after whichever tests of this module ran on this worker before it (xdist distributes them: file order is
    # not guaranteed), and after a commit, a release and an abandon of its own, so the ledger always holds charges
    ledger = deployment.spender()
    for run, end in (("verify-commit", "commit"), ("verify-release", "release"), ("verify-abandon", "abandon")):
        reservation = ledger.reserve(ReleaseKey("d", run, "t", -1, "r"), account="a", amount=Fraction(1, 100),
                                     mechanisms=[], spec_hash="0" * 64)
        ledger.commit(reservation, {"value": 1}) if end == "commit" else getattr(ledger, end)(reservation)
    report = deployment.governor().verify(Keyring([GOVERNOR_KEY, SPEND_KEY]))
    assert report.problems == []
    officer_view = deployment.governor()
    assert report.authenticated and report.accounts == len(officer_view.accounts()) and report.charges > 0


def test_created_roles_are_nologin_groups_whose_members_spend(deployment):
    spender_group, governor_group, worker = _unique("dp_sg"), _unique("dp_gg"), _unique("dp_worker")
    owner = deployment.raw("postgres")
    try:
        for _ in range(2):  # idempotent
            apply_roles(owner, spender_group, governor_group, create=True)
        with owner.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname IN ('{spender_group}', '{governor_group}')"
            ).all()
        assert sorted(rows) == sorted([(spender_group, False), (governor_group, False)])
        admin = _admin(deployment.database)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE ROLE "{worker}" LOGIN IN ROLE "{spender_group}"')
        admin.dispose()
        ledger = Ledger(deployment.url(worker), audit_key=SPEND_KEY)
        deployment.engines += [ledger.engine, ledger._reader]
        reservation = ledger.reserve(
            release_key("member-1"), account="a", amount=Fraction(1, 8), mechanisms=NO_MECHANISMS, spec_hash="0" * 64
        )
        ledger.commit(reservation, {"count": 1})
        error, message = _denied(deployment.raw(worker), "UPDATE dp_budget_accounts SET cap = '1000'")
        assert error == "InsufficientPrivilege (42501)", message
    finally:
        deployment.dispose()
        _drop_roles(deployment.database, worker, spender_group, governor_group)


@pytest.mark.parametrize(
    "spender_role",
    [
        pytest.param("postgres", id="a superuser (owns the tables)"),
        pytest.param("creator", id="a role that may create roles"),
        pytest.param("member", id="a member of the tables' owner"),
    ],
)
def test_grants_to_a_role_that_could_disable_the_triggers_are_refused(deployment, spender_role):
    names = {"creator": _unique("dp_creator"), "member": _unique("dp_member")}
    role = names.get(spender_role, spender_role)
    admin = _admin(deployment.database)
    with admin.connect() as conn:
        if spender_role == "creator":
            conn.exec_driver_sql(f'CREATE ROLE "{role}" CREATEROLE')
        if spender_role == "member":
            conn.exec_driver_sql(f'CREATE ROLE "{role}" IN ROLE postgres')
    admin.dispose()
    try:
        with pytest.raises(ValueError, match=rf"role {role} owns the ledger tables .* a role that is not"):
            apply_roles(deployment.raw("postgres"), role, deployment.governor_role)
    finally:
        deployment.dispose()
        if role != "postgres":
            _drop_roles(deployment.database, role)


@pytest.mark.parametrize(
    "spender_role, governor_role, message",
    [
        pytest.param("a; DROP TABLE dp_charges", "g", "not a plain role name", id="SQL in a name"),
        pytest.param('a"b', "g", "not a plain role name", id="a quote"),
        pytest.param("s", "g'", "not a plain role name", id="a quote in the governor"),
        pytest.param("", "g", "not a plain role name", id="empty"),
        pytest.param("1abc", "g", "not a plain role name", id="starts with a digit"),
        pytest.param("s" * 64, "g", "not a plain role name", id="longer than 63"),
        pytest.param("public", "g", "reserved", id="PUBLIC"),
        pytest.param("pg_monitor", "g", "reserved", id="pg_ prefix"),
        pytest.param("same", "same", "different roles", id="one role for both"),
    ],
)
def test_role_names_are_validated_before_any_sql(spender_role, governor_role, message):
    with pytest.raises(ValueError, match=message):
        role_statements(spender_role, governor_role)


def test_roles_are_refused_on_sqlite(tmp_path):
    with pytest.raises(ValueError, match="PostgreSQL feature"):
        apply_roles(f"sqlite:///{tmp_path / 'ledger.db'}", "s", "g")


def test_the_spender_is_granted_reads_and_the_spend_functions_only():
    """The spender's grants: SELECT on the tables and EXECUTE on the seven spend functions; no write, no sequence."""
    statements = role_statements("s", "g")
    spender_grants = [s for s in statements if s.startswith("GRANT") and s.endswith('TO "s"')]
    assert spender_grants == [
        f"GRANT SELECT ON TABLE {', '.join(LEDGER_TABLES)} TO \"s\"",
        f"GRANT EXECUTE ON FUNCTION {', '.join(SPEND_FUNCTIONS)} TO \"s\"",
    ]
    assert [signature.split("(")[0] for signature in SPEND_FUNCTIONS] == [
        "dp_reserve", "dp_commit", "dp_release", "dp_abandon", "dp_renew", "dp_reconcile", "dp_request_approval"]
    assert not [s for s in statements if "OWNER" in s or "DELETE" in s or "TRUNCATE" in s or "TRIGGER" in s]
    assert f"REVOKE ALL ON FUNCTION {', '.join(LEDGER_FUNCTIONS)} FROM PUBLIC, \"s\", \"g\"" in statements


# ---- the reader role (the budget dashboard reads the ledger and can change nothing) ------------------------------


@pytest.fixture(scope="module")
def reader(deployment) -> Iterator[str]:
    """A login role made the ledger's reader (with the deployment's spender and governor), dropped afterwards."""
    role = _unique("dp_reader")
    admin = _admin(deployment.database)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
    admin.dispose()
    try:
        apply_roles(deployment.raw("postgres"), deployment.spender_role, deployment.governor_role, reader_role=role)
        yield role
    finally:
        deployment.dispose()
        _drop_roles(deployment.database, role)


def _first_column(table: sa.Table) -> str:
    return next(column.name for column in table.columns if not column.primary_key)


#: Every write a reader might try, on every ledger table (raw SQL), and the refusal expected.
READER_ATTEMPTS = [
    *[(f"insert into {t.name}", f"INSERT INTO {t.name} DEFAULT VALUES", DENIED) for t in LEDGER_TABLE_OBJECTS],
    *[
        (f"update {t.name}", f"UPDATE {t.name} SET {_first_column(t)} = {_first_column(t)}", DENIED)
        for t in LEDGER_TABLE_OBJECTS
    ],
    *[(f"delete from {t.name}", f"DELETE FROM {t.name}", DENIED) for t in LEDGER_TABLE_OBJECTS],
    *[(f"truncate {t.name}", f"TRUNCATE {t.name}", DENIED) for t in LEDGER_TABLE_OBJECTS],
    ("raise a cap", "UPDATE dp_budget_accounts SET cap = '1000' WHERE name = 'a'", DENIED),
    ("zero the spend", "UPDATE dp_budget_accounts SET spent = '0' WHERE name = 'a'", DENIED),
    ("lock an account row", "SELECT name FROM dp_budget_accounts WHERE name = 'a' FOR UPDATE", DENIED),
    ("share-lock a charge row", "SELECT id FROM dp_charges FOR SHARE", DENIED),
    ("draw a charge id", "SELECT nextval('dp_charges_id_seq')", "permission denied for sequence"),
    ("draw an event id", "SELECT nextval('dp_audit_events_id_seq')", "permission denied for sequence"),
    ("disable the audit triggers", "ALTER TABLE dp_audit_events DISABLE TRIGGER USER", "must be owner of table"),
    ("drop a trigger function", "DROP FUNCTION dp_audit_append_only() CASCADE", "must be owner of function"),
    ("become the owner", "SET ROLE postgres", "permission denied to set role"),
]


def _counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar() for t in LEDGER_TABLES}


def test_the_reader_role_reads_every_table(deployment, reader):
    owner_counts = _counts(deployment.raw("postgres"))
    assert owner_counts["dp_budget_accounts"] >= 2 and owner_counts["dp_audit_events"] > 0
    assert _counts(deployment.raw(reader)) == owner_counts
    with deployment.raw(reader).connect() as conn:
        cap = conn.exec_driver_sql("SELECT cap FROM dp_budget_accounts WHERE name = 'a'").scalar()
    assert cap == deployment.owner_row("a")["cap"]


def test_the_reader_role_is_refused_every_write_by_the_database(deployment, reader, capsys):
    engine = deployment.raw(reader)
    before = {name: deployment.owner_row(name) for name in ("a", "g")}
    counts = _counts(deployment.raw("postgres"))
    outcomes = [(action, *_denied(engine, statement), expected) for action, statement, expected in READER_ATTEMPTS]
    with capsys.disabled():
        print(f"\n{'attempt (reader role, raw SQL)':32} | {'database error':34} | message")
        for action, error, message, _ in outcomes:
            print(f"{action:32} | {error:34} | {message}")
    allowed = [action for action, error, _, _ in outcomes if error == "ALLOWED"]
    assert not allowed, f"the reader role was allowed to: {allowed}"
    wrong = [
        (action, error, message)
        for action, error, message, expected in outcomes
        if not error.startswith("InsufficientPrivilege (42501)") or not re.search(expected, message)
    ]
    assert not wrong, f"refused, but not for lack of privilege: {wrong}"
    assert {name: deployment.owner_row(name) for name in ("a", "g")} == before
    assert _counts(deployment.raw("postgres")) == counts


def test_the_spend_api_with_the_reader_connection_spends_nothing(deployment, reader):
    before, counts = deployment.owner_row("a"), _counts(deployment.raw("postgres"))
    ledger = Ledger(deployment.url(reader), audit_key=SPEND_KEY)  # the spend key too: only the database refuses
    deployment.engines += [ledger.engine, ledger._reader]
    assert ledger.account("a").cap == Fraction(before["cap"])  # reading works
    with pytest.raises(LedgerAccessError, match="dpctl ledger roles") as refused:
        ledger.reserve(
            release_key("reader-1"), account="a", amount=Fraction(1, 4), mechanisms=NO_MECHANISMS, spec_hash="0" * 64
        )
    assert isinstance(refused.value.__context__.orig, psycopg.errors.InsufficientPrivilege)
    assert "permission denied for function dp_reserve" in str(refused.value)
    officer = LedgerGovernor(deployment.url(reader), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
    deployment.engines += [officer.engine, officer._reader]
    with pytest.raises(sa.exc.ProgrammingError) as refused:
        officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=1000)}))
    assert isinstance(refused.value.orig, psycopg.errors.InsufficientPrivilege)
    assert deployment.owner_row("a") == before
    assert _counts(deployment.raw("postgres")) == counts


#: Table privileges PostgreSQL knows (has_table_privilege), and sequence privileges (has_sequence_privilege).
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")


def _privileges(engine: sa.Engine, role: str) -> set[str]:
    """Every privilege ``role`` holds on the ledger's tables (``table:PRIVILEGE``; column UPDATE as
    ``table:UPDATE(column)``) and sequences (``sequence:PRIVILEGE``), directly or through PUBLIC."""
    held = set()
    with engine.connect() as conn:
        def has(query: str) -> bool:
            return conn.exec_driver_sql(query).scalar()

        for table in LEDGER_TABLE_OBJECTS:
            held |= {f"{table.name}:{p}" for p in TABLE_PRIVILEGES
                     if has(f"SELECT has_table_privilege('{role}', '{table.name}', '{p}')")}
            held |= {f"{table.name}:UPDATE({c.name})" for c in table.columns
                     if has(f"SELECT has_column_privilege('{role}', '{table.name}', '{c.name}', 'UPDATE')")}
        for sequence in LEDGER_SEQUENCES:
            held |= {f"{sequence}:{p}" for p in SEQUENCE_PRIVILEGES
                     if has(f"SELECT has_sequence_privilege('{role}', '{sequence}', '{p}')")}
    return held


def test_re_running_the_roles_converges_on_select_only_for_the_reader(deployment, reader):
    owner = deployment.raw("postgres")
    spender_before = _privileges(owner, deployment.spender_role)
    reader_grants = {f"{table}:SELECT" for table in LEDGER_TABLES}
    assert _privileges(owner, reader) == reader_grants
    with owner.begin() as conn:  # privileges a reader must not keep, granted by hand
        conn.exec_driver_sql(f'GRANT INSERT, DELETE ON dp_charges TO "{reader}"')
        conn.exec_driver_sql(f'GRANT UPDATE (cap) ON dp_budget_accounts TO "{reader}"')
        conn.exec_driver_sql(f'GRANT USAGE ON SEQUENCE dp_charges_id_seq TO "{reader}"')
    assert _privileges(owner, reader) > reader_grants  # the negative control: the check sees extra grants
    for _ in range(2):
        apply_roles(owner, deployment.spender_role, deployment.governor_role, reader_role=reader)
        assert _privileges(owner, reader) == reader_grants
    assert _privileges(owner, deployment.spender_role) == spender_before


def test_a_created_reader_is_a_nologin_group_whose_members_only_read(deployment):
    spender_group, governor_group, reader_group = _unique("dp_sg"), _unique("dp_gg"), _unique("dp_rg")
    viewer = _unique("dp_viewer")
    owner = deployment.raw("postgres")
    try:
        for _ in range(2):  # idempotent
            apply_roles(owner, spender_group, governor_group, create=True, reader_role=reader_group)
        with owner.connect() as conn:
            login = conn.exec_driver_sql(f"SELECT rolcanlogin FROM pg_roles WHERE rolname = '{reader_group}'").scalar()
        assert login is False
        admin = _admin(deployment.database)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE ROLE "{viewer}" LOGIN IN ROLE "{reader_group}"')
        admin.dispose()
        assert _counts(deployment.raw(viewer)) == _counts(owner)
        error, message = _denied(deployment.raw(viewer), "UPDATE dp_budget_accounts SET cap = '1000'")
        assert error == "InsufficientPrivilege (42501)", message
    finally:
        deployment.dispose()
        _drop_roles(deployment.database, viewer, spender_group, governor_group, reader_group)


@pytest.mark.parametrize(
    "reader_role",
    [
        pytest.param("postgres", id="a superuser (owns the tables)"),
        pytest.param("member", id="a member of the tables' owner"),
    ],
)
def test_a_reader_that_could_write_anyway_is_refused(deployment, reader, reader_role):
    role = _unique("dp_member") if reader_role == "member" else reader_role
    owner = deployment.raw("postgres")
    if reader_role == "member":
        admin = _admin(deployment.database)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE ROLE "{role}" IN ROLE postgres')
        admin.dispose()
    before = _privileges(owner, reader)
    try:
        with pytest.raises(ValueError, match=rf"role {role} owns the ledger tables .* a role that is not"):
            apply_roles(owner, deployment.spender_role, deployment.governor_role, reader_role=role)
        assert _privileges(owner, reader) == before  # one transaction: the refusal changed nothing
    finally:
        deployment.dispose()
        if role != "postgres":
            _drop_roles(deployment.database, role)


@pytest.mark.parametrize(
    "reader_role, message",
    [
        pytest.param("s", "reader role 's' is also the spender role", id="the spender"),
        pytest.param("g", "reader role 'g' is also the governor role", id="the governor"),
        pytest.param("r; GRANT ALL ON dp_charges TO r", "reader role .* is not a plain role name", id="SQL in a name"),
        pytest.param("pg_read_all_data", "reader role .* is reserved", id="pg_ prefix"),
    ],
)
def test_reader_names_are_validated_before_any_sql(reader_role, message):
    with pytest.raises(ValueError, match=message):
        role_statements("s", "g", reader_role=reader_role)


def test_the_reader_statements_add_select_and_nothing_else():
    two, three = role_statements("s", "g"), role_statements("s", "g", reader_role="r")
    tables = ", ".join(LEDGER_TABLES)
    added = [s for s in three if s not in two]
    assert added[0].startswith("DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = 'r' ")
    assert added[0] == [s for s in two if "rolname = 's'" in s][0].replace("'s'", "'r'")  # the same refusal check
    assert added[1:] == [
        f'REVOKE ALL ON TABLE {tables} FROM PUBLIC, "s", "g", "r"',
        f'REVOKE ALL ON SEQUENCE {", ".join(LEDGER_SEQUENCES)} FROM PUBLIC, "s", "g", "r"',
        f'REVOKE ALL ON FUNCTION {", ".join(LEDGER_FUNCTIONS)} FROM PUBLIC, "s", "g", "r"',
        "DO $$ BEGIN IF current_schema() IS NULL THEN RAISE EXCEPTION 'no schema on the search_path: set the "
        "search_path of the ledger''s connection'; END IF; EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I, %I, %I', "
        "current_schema(), 's', 'g', 'r'); EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC, %I, %I, %I', "
        "current_schema(), 's', 'g', 'r'); END $$",
        f'GRANT SELECT ON TABLE {tables} TO "r"',
    ]
    created = role_statements("s", "g", reader_role="r", create=True)
    assert 'CREATE ROLE "r" NOLOGIN' in created[2]


def test_dpctl_roles_grants_the_reader(deployment, reader):
    from typer.testing import CliRunner

    from dp_operators.cli import app

    printed = CliRunner().invoke(
        app, ["ledger", "roles", "--spender-role", "s", "--governor-role", "g", "--reader-role", "r"]
    )
    assert printed.exit_code == 0, printed.output
    assert f'GRANT SELECT ON TABLE {", ".join(LEDGER_TABLES)} TO "r";' in printed.stdout.splitlines()
    owner = deployment.raw("postgres")
    with owner.begin() as conn:
        conn.exec_driver_sql(f'GRANT DELETE ON dp_charges TO "{reader}"')
    executed = CliRunner().invoke(
        app,
        ["ledger", "roles", "--url", deployment.url(), "--spender-role", deployment.spender_role,
         "--governor-role", deployment.governor_role, "--reader-role", reader, "--execute"],
    )
    assert executed.exit_code == 0, executed.output
    assert f"and {reader!r} (reader):" in executed.stdout
    assert _privileges(owner, reader) == {f"{table}:SELECT" for table in LEDGER_TABLES}
    refused = CliRunner().invoke(
        app, ["ledger", "roles", "--spender-role", "s", "--governor-role", "g", "--reader-role", "s"]
    )
    assert refused.exit_code == 1 and "is also the spender role" in refused.stderr
