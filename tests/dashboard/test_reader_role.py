"""The dashboard over PostgreSQL's read-only roles: the dashboard reads the ledger with the read-only (spender or
reader) role, and has no way to change a cap.

A ledger schema owned by ``postgres`` (who ran ``dpctl ledger init``) gets the three roles of
:mod:`dp_operators.ledger.roles`; the governor role creates the accounts and the spender role spends. Then, connected
as the reader login role and as the spender login role (each with no key, as :func:`dashboard_ledger` opens it),
every query of :mod:`dp_operators.dashboard.queries` must answer exactly what it answers connected as the owner, the
structural audit check must pass, and the app must answer its GET routes and refuse every writing method; the
ledger's rows are compared before and after. PostgreSQL only: without a server the module is skipped with the
reason (failed when ``CI`` is set), as ``ledger_backends.pg_database`` does.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction

import pytest
import sqlalchemy as sa
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.dashboard import queries
from dp_operators.dashboard.audit_status import AuditChainStatus
from dp_operators.ledger import Ledger, LedgerConfig, LedgerGovernor, ReleaseKey, schema
from dp_operators.ledger.roles import apply_roles
from dashboard_apps import wait_for_check
from dashboard_auth import bearer, mint
from dashboard_data import MECHANISMS, OUTPUT
from ledger_backends import account_config, pg_roles  # noqa: F401  (pg_roles: a fixture)
from support import GOVERNOR_KEY, SPEND_KEY

#: The forecast's reference time: fixed, so two calls of account_detail can be compared field by field.
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
ROLES = [pytest.param("reader", id="reader role"), pytest.param("spender", id="spender role")]
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Deployment:
    """A ledger schema owned by ``postgres`` with spender, governor and reader login roles, and its charges."""

    database: sa.URL
    schema: str
    roles: dict[str, str]
    charge_ids: list[int] = field(default_factory=list)
    engines: list[sa.Engine] = field(default_factory=list)

    def url(self, role: str = "postgres") -> str:
        return (
            self.database.set(username=self.roles.get(role, role))
            .update_query_dict({"options": f"-csearch_path={self.schema}"})
            .render_as_string(hide_password=False)
        )

    def ledger(self, role: str = "postgres") -> Ledger:
        """The ledger as the dashboard opens it (no key), connected as ``role``."""
        ledger = Ledger(self.url(role))
        self.engines += [ledger.engine, ledger._reader]
        return ledger

    def rows(self) -> dict[str, list[dict]]:
        """Every row of every ledger table, read as the owner (caps, totals, charges and the audit chain)."""
        engine = sa.create_engine(self.url())
        try:
            with engine.connect() as conn:
                return {
                    table.name: [
                        dict(row._mapping)
                        for row in conn.execute(sa.select(table).order_by(*table.primary_key.columns))
                    ]
                    for table in (schema.schema_version, schema.accounts, schema.charges, schema.audit_events)
                }
        finally:
            engine.dispose()


def _key(run: str, dag: str = "d") -> ReleaseKey:
    return ReleaseKey(dag, run, "t", -1, "r")


@pytest.fixture(scope="module")
def deployment(pg_database: sa.URL, pg_roles: tuple[str, str]) -> Iterator[Deployment]:  # noqa: F811
    """Accounts ``a`` (pure DP, DAGs ``d`` and ``e``) and ``z`` (zCDP), created by the governor role; charges
    committed (one with published values), released, abandoned and reserved, made by the spender role."""
    spender_role, governor_role = pg_roles
    reader_role = f"dp_reader_{uuid.uuid4().hex[:8]}"
    d = Deployment(pg_database, f"t_reader_{uuid.uuid4().hex[:10]}", {
        "spender": spender_role, "governor": governor_role, "reader": reader_role,
    })
    admin = sa.create_engine(pg_database, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{d.schema}"')
        conn.exec_driver_sql(f'CREATE ROLE "{reader_role}" LOGIN')
    try:
        owner = LedgerGovernor(d.url(), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
        d.engines += [owner.engine, owner._reader]
        owner.init_schema()
        apply_roles(owner.engine, spender_role, governor_role, reader_role=reader_role)
        officer = LedgerGovernor(d.url("governor"), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
        d.engines += [officer.engine, officer._reader]
        officer.apply_config(LedgerConfig(version=1, accounts={
            "a": account_config("pure_dp", epsilon="10", dags=("d", "e")),
            "z": account_config("zcdp", cap="1/2", delta="1e-6", dags=("d",)),
        }))
        tasks = Ledger(d.url("spender"), audit_key=SPEND_KEY)
        d.engines += [tasks.engine, tasks._reader]

        def reserve(run: str, amount: str, dag: str = "d", account: str = "a"):
            return tasks.reserve(_key(run, dag), account=account, amount=Fraction(amount), mechanisms=MECHANISMS,
                                 spec_hash="0" * 64)

        reservations = [reserve("r1", "1/3"), reserve("r2", "1/2"), reserve("r3", "2"), reserve("r4", "1/4"),
                        reserve("r5", "1/5", dag="e"), reserve("r6", "1/7"), reserve("r7", "1/30", account="z")]
        tasks.commit(reservations[0], OUTPUT)
        tasks.commit(reservations[1], {"run": "r2"})
        tasks.release(reservations[2])
        tasks.abandon(reservations[3])
        tasks.commit(reservations[4], {"run": "r5"})
        tasks.commit(reservations[6], {"run": "r7"})  # r6 stays reserved
        d.charge_ids = [r.charge_id for r in reservations]
        yield d
    finally:
        for engine in d.engines:
            engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{d.schema}" CASCADE')
            conn.exec_driver_sql(f'DROP OWNED BY "{reader_role}"')
            conn.exec_driver_sql(f'DROP ROLE "{reader_role}"')
        admin.dispose()


def _every_query(ledger: Ledger, charge_ids: list[int]) -> dict[str, str]:
    """Each dashboard query's answer (with filters, pages, unknown names), as the JSON the API would send."""
    answers = {
        "accounts_overview": queries.accounts_overview(ledger),
        "account_detail a": queries.account_detail(ledger, "a", now=NOW),
        "account_detail z": queries.account_detail(ledger, "z", now=NOW, max_points=2),
        "account_detail unknown": queries.account_detail(ledger, "nope", now=NOW),
        "account_charges a": queries.account_charges(ledger, "a"),
        "account_charges a page 2": queries.account_charges(ledger, "a", after=charge_ids[1], limit=2),
        "account_charges a committed in e": queries.account_charges(ledger, "a", dag_id="e", state="committed"),
        "account_charges a since": queries.account_charges(ledger, "a", since=NOW - dt.timedelta(days=3650)),
        "account_charges unknown": queries.account_charges(ledger, "nope"),
        "run_charges d r1": queries.run_charges(ledger, "d", "r1"),
        "run_charges unknown": queries.run_charges(ledger, "d", "never"),
        "release_detail unknown": queries.release_detail(ledger, max(charge_ids) + 1000),
    }
    answers |= {f"release_detail {i}": queries.release_detail(ledger, i) for i in charge_ids}
    return {name: json.dumps(answer, sort_keys=True) for name, answer in answers.items()}


@pytest.mark.parametrize("role", ROLES)
def test_every_query_answers_as_the_owner_does(deployment, role):
    before = deployment.rows()
    as_owner = _every_query(deployment.ledger(), deployment.charge_ids)
    as_role = _every_query(deployment.ledger(role), deployment.charge_ids)
    differ = [name for name in as_owner if as_role[name] != as_owner[name]]
    assert not differ, f"connected as the {role} role these answers differ from the owner's: {differ}"
    # the answers are about the charges made above (not empty pages equal by accident)
    overview = json.loads(as_role["accounts_overview"])
    assert [(row["name"], row["reserved"]) for row in overview] == [("a", "1/7"), ("z", "0")]
    assert json.loads(as_role["account_charges a"])["total"] == 6
    release = json.loads(as_role[f"release_detail {deployment.charge_ids[0]}"])
    assert [value["value"] for value in release["aggregates"][0]["values"]] == [10, 12]
    assert deployment.rows() == before


@pytest.mark.parametrize("role", ROLES)
def test_the_audit_check_passes_with_the_role(deployment, role):
    before = deployment.rows()
    ledger = deployment.ledger(role)
    result = AuditChainStatus(lambda: ledger).wait(timeout=60)
    assert (result["state"], result["error"], result["problems"]) == ("ok", None, [])
    assert result["authenticated"] is False  # the dashboard holds no key
    assert (result["accounts"], result["charges"], result["events"]) == (
        2, len(deployment.charge_ids), len(before["dp_audit_events"])
    )
    assert deployment.rows() == before


def _concrete(route: APIRoute, charge_id: int) -> str:
    """The route's path with its parameters filled with names the ledger holds."""
    values = {"name": "a", "charge_id": str(charge_id), "dag_id": "d", "run_id": "r1"}
    path = route.path
    for name, value in values.items():
        path = path.replace(f"{{{name}}}", value).replace(f"{{{name}:path}}", value)
    assert "{" not in path, f"no value for a parameter of {route.path}: add it to _concrete"
    return path


@pytest.mark.parametrize("role", ROLES)
def test_the_app_answers_reads_and_has_no_write(deployment, auth_manager, role):
    before = deployment.rows()
    ledger = deployment.ledger(role)
    app = dashboard_app.create_app(lambda: ledger)
    routes = [route for route in app.routes if isinstance(route, APIRoute)]
    assert {method for route in routes for method in route.methods} == {"GET"}  # no route writes
    committed = deployment.charge_ids[0]
    # static assets come from the package, not the ledger; every other GET route reads the ledger
    reading = [_concrete(route, committed) for route in routes if not route.path.startswith("/static/")]
    assert {"/api/accounts", "/api/accounts/a", "/api/releases/" + str(committed)} <= set(reading)
    headers = bearer(mint(auth_manager))
    with TestClient(app) as client:
        answers = {path: client.get(path, headers=headers) for path in reading}
        failed = {path: (r.status_code, r.text[:200]) for path, r in answers.items() if r.status_code != 200}
        assert not failed, f"GET as the {role} role failed: {failed}"
        owner = deployment.ledger()
        assert answers["/api/accounts"].json() == queries.accounts_overview(owner)
        assert answers["/api/accounts/a/charges"].json() == queries.account_charges(owner, "a")
        assert answers[f"/api/releases/{committed}"].json() == queries.release_detail(owner, committed)
        chain = wait_for_check(client, headers)
        assert (chain["state"], chain["error"]) == ("ok", None)

        writes = {}
        for path in ["/api/accounts/a", *(_concrete(route, committed) for route in routes)]:
            for method in WRITE_METHODS:
                response = client.request(method, path, headers=headers, json={"cap": "1000", "spent": "0"})
                writes[f"{method} {path}"] = response.status_code
        assert writes["PATCH /api/accounts/a"] == writes["PUT /api/accounts/a"] == 405
        assert {code for code in writes.values()} == {405}, writes
    after = deployment.rows()
    assert [(row["name"], row["cap"], row["spent"], row["audit_head"]) for row in after["dp_budget_accounts"]] == [
        (row["name"], row["cap"], row["spent"], row["audit_head"]) for row in before["dp_budget_accounts"]
    ]
    assert after == before
