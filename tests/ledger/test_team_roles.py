"""Team roles: an account's ``allowed_roles`` names the database roles whose members may spend from it.

The configuration refuses names that are not plain PostgreSQL role names; ``apply`` stores the roles as sorted
canonical JSON and signs them in the account's governance events (a change is an ``account_updated``) on both
databases, and verify stays clean; the SQL of ``dpctl ledger roles --config`` makes the team roles members of the
spender role on PostgreSQL, so a team's login spends through the spender's privileges and is a member of its own
team role only. PostgreSQL cases skip when the server is unreachable and fail under ``CI=1`` (ledger_backends.py).
Roles are cluster-wide: every role here has a unique name and is dropped afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import (
    AccountConfig,
    Ledger,
    LedgerConfig,
    LedgerConfigError,
    LedgerGovernor,
    ReleaseKey,
    load_ledger_config,
)
from dp_operators.ledger.errors import RoleNotAllowedError
from dp_operators.ledger.govern import account_values
from dp_operators.ledger.keys import Keyring
from dp_operators.ledger.roles import LEDGER_FUNCTIONS, SPEND_FUNCTIONS, apply_roles
from dp_operators.ledger.team_roles import apply_team_roles, team_role_statements, team_roles
from ledger_backends import account_config
from support import GOVERNOR_KEY, SPEND_KEY, governor

ACCOUNT_YAML = """\
version: 1
accounts:
  census:
    accountant: pure_dp
    cap: 1
    privacy_unit: person
    allowed_dags: [d]
    allowed_roles: {roles}
"""


def _config_file(tmp_path: Path, roles: str) -> Path:
    path = tmp_path / "ledgers.yaml"
    path.write_text(ACCOUNT_YAML.format(roles=roles))
    return path


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


# ---- the configuration -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "roles, problem",
    [
        pytest.param("['team a']", "is not a plain PostgreSQL role name", id="a space"),
        pytest.param("[team-a]", "is not a plain PostgreSQL role name", id="a hyphen"),
        pytest.param("""['a"b']""", "is not a plain PostgreSQL role name", id="a double quote"),
        pytest.param("['x; DROP TABLE dp_charges']", "is not a plain PostgreSQL role name", id="SQL in a name"),
        pytest.param("[1team]", "is not a plain PostgreSQL role name", id="starts with a digit"),
        pytest.param(f"[{'t' * 64}]", "is not a plain PostgreSQL role name", id="longer than 63"),
        pytest.param("[public]", "is reserved by PostgreSQL", id="public"),
        pytest.param("[None_]", None, id="none_ is a plain name"),
        pytest.param("[NONE]", "is reserved by PostgreSQL", id="none"),
        pytest.param("[session_user]", "is reserved by PostgreSQL", id="session_user"),
        pytest.param("[pg_read_all_data]", "is reserved by PostgreSQL", id="pg_ prefix"),
    ],
)
def test_allowed_roles_refuses_names_that_are_not_plain_role_names_naming_the_account(tmp_path, roles, problem):
    """A bad role name is refused with the account's field path, the name, what is wrong and what to write."""
    path = _config_file(tmp_path, roles)
    if problem is None:
        assert load_ledger_config(path).accounts["census"].allowed_roles == ["None_"]
        return
    with pytest.raises(LedgerConfigError) as raised:
        load_ledger_config(path)
    message = str(raised.value)
    assert f"{path}: invalid ledger configuration:" in message
    assert "accounts.census.allowed_roles: role " in message and problem in message
    assert "e.g. team_census" in message


def test_an_empty_allowed_roles_is_refused_saying_to_leave_it_out(tmp_path):
    """An empty list would let nobody spend: the message says to name team roles or leave the field out."""
    with pytest.raises(LedgerConfigError, match=r"accounts\.census\.allowed_roles: an empty list would let nobody "
                       r"spend: .* or leave allowed_roles out"):
        load_ledger_config(_config_file(tmp_path, "[]"))


def test_an_account_without_allowed_roles_keeps_its_recorded_configuration():
    """Leaving allowed_roles out stores NULL and adds nothing to the configuration as written."""
    account = account_config(cap=1)
    assert account.allowed_roles is None and "allowed_roles" not in account.as_record()
    assert account_values(account)["allowed_roles"] is None


def test_allowed_roles_are_recorded_sorted_and_distinct():
    """The record and the stored column hold the sorted, distinct names; the stored text is canonical JSON."""
    account = account_config(cap=1, allowed_roles=["team_b", "team_a", "team_b"])
    assert account.as_record()["allowed_roles"] == ["team_a", "team_b"]
    assert account_values(account)["allowed_roles"] == '["team_a","team_b"]'


def test_team_roles_lists_each_role_with_the_accounts_that_name_it():
    """Each team role maps to the accounts whose allowed_roles name it, both sorted."""
    config = LedgerConfig(
        version=1,
        accounts={
            "survey": account_config(cap=1, allowed_roles=["team_b", "team_a"]),
            "census": account_config(cap=1, allowed_roles=["team_a"]),
            "open": account_config(cap=1),
        },
    )
    assert team_roles(config) == {"team_a": ("census", "survey"), "team_b": ("survey",)}


# ---- apply, events and verify (both databases) ---------------------------------------------------------------------


def _apply(url: str, **accounts: AccountConfig) -> list[str]:
    return governor(url).apply_config(LedgerConfig(version=1, accounts=accounts))


def _governance(url: str, account: str) -> list[tuple[str, dict]]:
    return [
        (event["event"], json.loads(event["details"]))
        for event in governor(url).events(account)
        if event["event"] in ("account_created", "account_updated")
    ]


def test_apply_stores_allowed_roles_and_signs_them_in_account_created(ledger_url):
    """A new account's allowed_roles is stored as sorted JSON and recorded in its signed account_created event."""
    governor(ledger_url).init_schema()
    assert _apply(ledger_url, census=account_config(cap=1, allowed_roles=["team_b", "team_a"])) == [
        "created account 'census' (pure_dp, cap 1 epsilon)"
    ]
    with governor(ledger_url).engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT allowed_roles FROM dp_budget_accounts WHERE name = 'census'")
        ).scalar()
    assert stored == '["team_a","team_b"]'
    [(event, details)] = _governance(ledger_url, "census")
    assert event == "account_created"
    assert details["stored"]["allowed_roles"] == stored
    assert details["config"]["allowed_roles"] == ["team_a", "team_b"]
    report = governor(ledger_url).verify(Keyring([GOVERNOR_KEY, SPEND_KEY]))
    assert report.problems == [] and report.authenticated


def test_changing_allowed_roles_is_a_signed_account_updated_event_and_verify_stays_clean(ledger_url):
    """Adding, changing and removing allowed_roles are each one signed account_updated; re-applying is no change."""
    governor(ledger_url).init_schema()
    _apply(ledger_url, census=account_config(cap=1))
    assert _apply(ledger_url, census=account_config(cap=1)) == []
    steps = [
        (["team_a"], "updated account 'census': allowed_roles (any spender -> team_a)"),
        (["team_b", "team_a"], "updated account 'census': allowed_roles (team_a -> team_a, team_b)"),
        (None, "updated account 'census': allowed_roles (team_a, team_b -> any spender)"),
    ]
    for roles, line in steps:
        assert _apply(ledger_url, census=account_config(cap=1, allowed_roles=roles)) == [line]
        assert _apply(ledger_url, census=account_config(cap=1, allowed_roles=roles)) == []
    updates = [details for event, details in _governance(ledger_url, "census") if event == "account_updated"]
    assert [(u["before"]["allowed_roles"], u["stored"]["allowed_roles"]) for u in updates] == [
        (None, '["team_a"]'),
        ('["team_a"]', '["team_a","team_b"]'),
        ('["team_a","team_b"]', None),
    ]
    assert all("allowed_roles" in update["changed"] for update in updates)
    report = governor(ledger_url).verify(Keyring([GOVERNOR_KEY, SPEND_KEY]))
    assert report.problems == [] and report.authenticated
    verified = CliRunner().invoke(
        app, ["ledger", "verify", "--url", ledger_url],
        env={"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text},
    )
    assert verified.exit_code == 0, verified.output
    assert "every event authenticated" in verified.stdout


def test_a_dry_run_reports_an_allowed_roles_change_and_stores_nothing(ledger_url):
    """apply --dry-run names the allowed_roles change, and the account keeps its old value and chain."""
    officer = governor(ledger_url)
    officer.init_schema()
    _apply(ledger_url, census=account_config(cap=1))
    events = len(list(officer.events("census")))
    changes = officer.apply_config(
        LedgerConfig(version=1, accounts={"census": account_config(cap=1, allowed_roles=["team_a"])}), dry_run=True
    )
    assert changes == ["updated account 'census': allowed_roles (any spender -> team_a)"]
    assert len(list(officer.events("census"))) == events
    with officer.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT allowed_roles FROM dp_budget_accounts")).scalar() is None


# ---- the statements (no database) --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "team, message",
    [
        pytest.param("dp_ledger_spender", "is the spender role: every worker's login is a member", id="the spender"),
        pytest.param("dp_ledger_governor", "is the governor role", id="the governor"),
        pytest.param("dp_ledger_reader", "is the reader role", id="the reader"),
        pytest.param("team a", "is not a plain PostgreSQL role name", id="not a plain name"),
        pytest.param("pg_monitor", "is reserved by PostgreSQL", id="reserved"),
    ],
)
def test_team_role_statements_refuse_the_ledgers_own_roles_and_bad_names(team, message):
    """A team role may not be the spender, governor or reader role, nor a name that is not plain."""
    with pytest.raises(ValueError, match=message):
        team_role_statements(
            [team], "dp_ledger_spender", governor_role="dp_ledger_governor", reader_role="dp_ledger_reader"
        )


def test_team_role_statements_grant_the_spender_role_and_revoke_direct_privileges():
    """Each team role is checked, loses any direct ledger privilege and becomes a member of the spender role."""
    statements = team_role_statements(["team_b", "team_a", "team_a"], "s", governor_role="g", create=True)
    assert statements[:2] == [
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'team_a') THEN "
        'CREATE ROLE "team_a" NOLOGIN; END IF; END $$',
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'team_b') THEN "
        'CREATE ROLE "team_b" NOLOGIN; END IF; END $$',
    ]
    assert statements[-4:] == [
        'REVOKE ALL ON TABLE dp_schema_version, dp_budget_accounts, dp_charges, dp_audit_events FROM "team_a", '
        '"team_b"',
        'REVOKE ALL ON SEQUENCE dp_charges_id_seq, dp_audit_events_id_seq, dp_schema_version_version_seq FROM '
        '"team_a", "team_b"',
        f'REVOKE ALL ON FUNCTION {", ".join(LEDGER_FUNCTIONS)} FROM "team_a", "team_b"',
        'GRANT "s" TO "team_a", "team_b"',
    ]
    assert not [s for s in statements if "OWNER" in s or "DELETE" in s or "TRUNCATE" in s or "TRIGGER" in s]
    assert team_role_statements([], "s") == []


# ---- PostgreSQL: the roles the statements make ---------------------------------------------------------------------


@dataclass
class Cluster:
    """A ledger schema owned by ``postgres`` with unique spender and governor roles; every role made is dropped."""

    database: sa.URL
    schema: str
    spender_role: str
    governor_role: str
    roles: list[str] = field(default_factory=list)
    engines: list[sa.Engine] = field(default_factory=list)

    def url(self, role: str = "postgres") -> str:
        return (
            self.database.set(username=role)
            .update_query_dict({"options": f"-csearch_path={self.schema}"})
            .render_as_string(hide_password=False)
        )

    def engine(self, role: str = "postgres") -> sa.Engine:
        engine = sa.create_engine(self.url(role))
        self.engines.append(engine)
        return engine

    def role(self, prefix: str, ddl: str = "NOLOGIN") -> str:
        """A new role (``CREATE ROLE <name> <ddl>``; ``{spender}`` etc. in ``ddl`` are filled in)."""
        name = _unique(prefix)
        self.roles.append(name)
        self.admin(f'CREATE ROLE "{name}" {ddl}')
        return name

    def admin(self, *statements: str) -> None:
        engine = sa.create_engine(self.database, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                for statement in statements:
                    conn.exec_driver_sql(statement)
        finally:
            engine.dispose()

    def scalar(self, sql: str):
        with self.engine().connect() as conn:
            return conn.exec_driver_sql(sql).scalar()


@pytest.fixture
def cluster(pg_database: sa.URL) -> Iterator[Cluster]:
    """Schema initialised by ``postgres`` and the spender and governor roles granted (NOLOGIN, unique names)."""
    c = Cluster(pg_database, _unique("t_teams"), _unique("dp_spender"), _unique("dp_governor"))
    c.roles += [c.spender_role, c.governor_role]
    c.admin(f'CREATE SCHEMA "{c.schema}"')
    try:
        governor(c.url()).init_schema()
        apply_roles(c.engine(), c.spender_role, c.governor_role, create=True)
        yield c
    finally:
        for engine in c.engines:
            engine.dispose()
        c.admin(f'DROP SCHEMA IF EXISTS "{c.schema}" CASCADE')
        for role in reversed(c.roles):
            if c.scalar(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'"):
                c.admin(f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"')


#: Whether ``worker`` holds exactly the spender's privileges on every table and function of the ledger's schema.
_SAME_PRIVILEGES = """
SELECT coalesce(bool_and(has_table_privilege('{worker}', c.oid, p) = has_table_privilege('{spender}', c.oid, p)), false)
   AND coalesce((SELECT bool_and(has_function_privilege('{worker}', f.oid, 'EXECUTE')
                                 = has_function_privilege('{spender}', f.oid, 'EXECUTE'))
                 FROM pg_proc f WHERE f.pronamespace = '"{schema}"'::regnamespace), true)
FROM pg_class c CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS p
WHERE c.relnamespace = '"{schema}"'::regnamespace AND c.relkind = 'r'
"""


def _roles_command(c: Cluster, config: Path, *more: str):
    return CliRunner().invoke(
        app,
        ["ledger", "roles", "--url", c.url(), "--config", str(config), "--spender-role", c.spender_role,
         "--governor-role", c.governor_role, *more],
    )


def test_dpctl_roles_creates_team_roles_whose_logins_spend_only_through_the_spender_role(cluster, tmp_path):
    """--config --create --execute makes each team role a NOLOGIN member of the spender (idempotently); a team's
    login then holds the spender's privileges, is a member of its own team role only, and spends."""
    c = cluster
    team_a, team_b = _unique("team_a"), _unique("team_b")
    c.roles += [team_a, team_b]
    config = tmp_path / "ledgers.yaml"
    config.write_text(
        "version: 1\naccounts:\n"
        f"  census:\n    accountant: pure_dp\n    cap: 1\n    privacy_unit: person\n    allowed_dags: [d]\n"
        f"    allowed_roles: [{team_a}]\n"
        f"  survey:\n    accountant: pure_dp\n    cap: 1\n    privacy_unit: person\n    allowed_dags: [d]\n"
        f"    allowed_roles: [{team_b}, {team_a}]\n"
        f"  open:\n    accountant: pure_dp\n    cap: 1\n    privacy_unit: person\n    allowed_dags: [d]\n"
    )
    printed = _roles_command(c, config, "--create")
    assert printed.exit_code == 0, printed.output
    assert f"--   {team_a}: 'census', 'survey'" in printed.stdout.splitlines()
    assert f'GRANT "{c.spender_role}" TO "{team_a}", "{team_b}";' in printed.stdout.splitlines()
    assert not c.scalar(f"SELECT 1 FROM pg_roles WHERE rolname = '{team_a}'")  # printing changes nothing
    for _ in range(2):  # idempotent
        done = _roles_command(c, config, "--create", "--execute")
        assert done.exit_code == 0, done.output
        assert f"made the team roles {team_a!r}, {team_b!r} members of {c.spender_role!r}" in done.stdout
    for team in (team_a, team_b):
        assert c.scalar(f"SELECT rolcanlogin FROM pg_roles WHERE rolname = '{team}'") is False
        assert c.scalar(f"SELECT pg_has_role('{team}', '{c.spender_role}', 'MEMBER')") is True
    worker = c.role("team_a_worker", f'LOGIN IN ROLE "{team_a}"')
    assert c.scalar(f"SELECT pg_has_role('{worker}', '{c.spender_role}', 'MEMBER')") is True
    assert c.scalar(f"SELECT pg_has_role('{worker}', '{team_b}', 'MEMBER')") is False
    assert c.scalar(_SAME_PRIVILEGES.format(worker=worker, spender=c.spender_role, schema=c.schema)) is True
    assert c.scalar(f"SELECT has_column_privilege('{worker}', 'dp_budget_accounts', 'cap', 'UPDATE')") is False

    officer = c.role("officer", f'LOGIN IN ROLE "{c.governor_role}"')
    applied = CliRunner().invoke(
        app, ["ledger", "apply", str(config), "--url", c.url(officer)],
        env={"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text},
    )
    assert applied.exit_code == 0, applied.output
    assert "does not exist" not in applied.stderr  # every team role named exists
    ledger = Ledger(c.url(worker), audit_key=SPEND_KEY)
    c.engines += [ledger.engine, ledger._reader]
    reservation = ledger.reserve(
        ReleaseKey("d", "run-1", "t", -1, "r"), account="open", amount=Fraction(1, 4), mechanisms=[],
        spec_hash="0" * 64,
    )
    ledger.commit(reservation, {"count": 1})
    assert ledger.account("open").spent == Fraction(1, 4)


def test_rerunning_the_team_roles_revokes_privileges_granted_to_them_directly(cluster):
    """A team role granted a governed column or a function the spender may not run loses it when the statements
    run again."""
    c = cluster
    team = c.role("team_direct")
    apply_team_roles(c.engine(), [team], c.spender_role, c.governor_role)
    [function, *_] = sorted(set(LEDGER_FUNCTIONS) - set(SPEND_FUNCTIONS))
    may_run = f"SELECT has_function_privilege('{team}', '{function}', 'EXECUTE')"
    with c.engine().begin() as conn:
        conn.exec_driver_sql(f'GRANT UPDATE (cap) ON dp_budget_accounts TO "{team}"')
        conn.exec_driver_sql(f'GRANT EXECUTE ON FUNCTION {function} TO "{team}"')
    assert c.scalar(f"SELECT has_column_privilege('{team}', 'dp_budget_accounts', 'cap', 'UPDATE')") is True
    assert c.scalar(may_run) is True
    apply_team_roles(c.engine(), [team], c.spender_role, c.governor_role)
    assert c.scalar(f"SELECT has_column_privilege('{team}', 'dp_budget_accounts', 'cap', 'UPDATE')") is False
    assert c.scalar(may_run) is False
    assert c.scalar(f"SELECT pg_has_role('{team}', '{c.spender_role}', 'MEMBER')") is True


#: The refusal of a team role whose members could drop or disable the guard triggers.
OWNS = r"owns the ledger tables \(or is a member of their owner, a superuser, or may create roles\)"


@pytest.mark.parametrize(
    "kind, message",
    [
        pytest.param("missing", "does not exist: create it as a NOLOGIN role", id="a missing role"),
        pytest.param("superuser", OWNS, id="a superuser"),
        pytest.param("creator", OWNS, id="a role that may create roles"),
        pytest.param("owner member", OWNS, id="a member of the tables' owner"),
        pytest.param("inside a team", "is a member of another team role", id="inside another team role"),
        pytest.param("inside the governor", "is a member of the governor role", id="inside the governor role"),
    ],
)
def test_the_database_refuses_a_team_role_that_could_escape_its_team(cluster, kind, message):
    """A team role missing (without --create), a superuser, a creator of roles, a member of the tables' owner, or
    inside another team role or the governor is refused, and nothing is granted."""
    c = cluster
    other = c.role("team_other")
    if kind == "missing":
        team = _unique("team_missing")
    elif kind == "superuser":
        team = c.role("team_super", "NOLOGIN SUPERUSER")
    elif kind == "creator":
        team = c.role("team_creator", "NOLOGIN CREATEROLE")
    elif kind == "owner member":
        team = c.role("team_owner", "NOLOGIN IN ROLE postgres")
    elif kind == "inside a team":
        team = c.role("team_nested", f'NOLOGIN IN ROLE "{other}"')
    else:
        team = c.role("team_governs", f'NOLOGIN IN ROLE "{c.governor_role}"')
    with pytest.raises(ValueError, match=rf"team role {team} {message}"):
        apply_team_roles(c.engine(), [team, other], c.spender_role, c.governor_role)
    assert c.scalar(f"SELECT pg_has_role('{other}', '{c.spender_role}', 'MEMBER')") is False


def test_apply_names_a_team_role_missing_from_the_database(cluster, tmp_path):
    """apply on PostgreSQL says which named role does not exist yet and the command that creates it."""
    c = cluster
    team = _unique("team_later")
    config = _config_file(tmp_path, f"[{team}]")
    applied = CliRunner().invoke(
        app, ["ledger", "apply", str(config), "--url", c.url()],
        env={"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text},
    )
    assert applied.exit_code == 0, applied.output
    assert f"note: role {team!r} (allowed_roles of 'census') does not exist in this database" in applied.stderr
    assert f"dpctl ledger roles --config {config} --create --execute" in applied.stderr


def test_a_team_login_cannot_spend_another_teams_account_whatever_dag_it_claims(cluster):
    """The spend functions refuse team A's login on team B's account, even under team B's DAG id, and charge
    nothing; it spends its own account, and verify stays clean."""
    c = cluster
    team_a, team_b = _unique("team_a"), _unique("team_b")
    c.roles += [team_a, team_b]
    config = LedgerConfig(
        version=1,
        accounts={
            "a": account_config(cap=1, dags=("dag_a",), allowed_roles=[team_a]),
            "b": account_config(cap=1, dags=("dag_b",), allowed_roles=[team_b]),
        },
    )
    apply_team_roles(c.engine(), team_roles(config), c.spender_role, c.governor_role, create=True)
    officer = LedgerGovernor(
        c.url(c.role("officer", f'LOGIN IN ROLE "{c.governor_role}"')), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY
    )
    c.engines += [officer.engine, officer._reader]
    officer.apply_config(config)
    worker_a = c.role("worker_a", f'LOGIN IN ROLE "{team_a}"')
    ledger = Ledger(c.url(worker_a), audit_key=SPEND_KEY)
    c.engines += [ledger.engine, ledger._reader]

    def reserve(dag: str, account: str):
        return ledger.reserve(
            ReleaseKey(dag, "run-1", "t", -1, "r"), account=account, amount=Fraction(1, 4), mechanisms=[],
            spec_hash="0" * 64,
        )

    ledger.commit(reserve("dag_a", "a"), {"count": 1})
    with pytest.raises(RoleNotAllowedError) as refused:
        reserve("dag_b", "b")
    assert refused.value.account == "b" and refused.value.role == worker_a
    assert ledger.account("a").spent == Fraction(1, 4)
    assert ledger.account("b").spent == 0 and list(ledger.charges(account="b")) == []
    report = officer.verify(Keyring([GOVERNOR_KEY, SPEND_KEY]))
    assert report.problems == [] and report.authenticated
