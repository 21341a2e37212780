"""The ledger URL's password never reaches a client of the dashboard, whether the ledger works or not, nor the
audit check's child process other than through its pipe."""

from __future__ import annotations

import json
import multiprocessing
import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.dashboard import audit_status
from dp_operators.ledger import Ledger
from dashboard_apps import reserve, wait_for_check
from dashboard_auth import bearer, mint
from ledger_backends import account_config, ledger_with

PASSWORD = "Pw-" + "9f3c" * 6  # not a word that appears in any page


@pytest.fixture
def pg_password_role(pg_database):
    """A PostgreSQL login role with :data:`PASSWORD` and the right to read a fresh schema (the server may trust
    local connections; the password is still in the URL the dashboard holds)."""
    role, schema_name = f"dp_pw_{uuid.uuid4().hex[:8]}", f"t_pw_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(pg_database, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{PASSWORD}'")
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema_name}"')
    try:
        yield pg_database, role, schema_name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema_name}" CASCADE')
            conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
            conn.exec_driver_sql(f'DROP ROLE "{role}"')
        admin.dispose()


def _all_text(client: TestClient, paths: list[str]) -> str:
    texts = []
    for path in paths:
        response = client.get(path)
        texts.append(f"{response.status_code} {dict(response.headers)} {response.text}")
    return "\n".join(texts)


@pytest.mark.parametrize("where", [
    pytest.param("netloc", id="password in the URL's user info"),
    pytest.param("query", id="password as a libpq query parameter"),
])
def test_a_broken_ledger_does_not_leak_the_ledger_password(pg_password_role, auth_manager, where):
    """A ledger without a schema fails the check without showing the password, in the URL or as a query parameter."""
    # The error's message held the ledger URL, whose hide_password masks only the user-info password; libpq also takes
    # ?password=.
    database, role, schema_name = pg_password_role
    url = database.set(username=role, password=PASSWORD if where == "netloc" else None).update_query_dict(
        {"options": f"-csearch_path={schema_name}", **({"password": PASSWORD} if where == "query" else {})})
    text_url = url.render_as_string(hide_password=False)
    assert PASSWORD in text_url
    ledger = Ledger(text_url)
    app = dashboard_app.create_app(lambda: ledger, verify_interval=3600)
    with TestClient(app, headers=bearer(mint(auth_manager)), raise_server_exceptions=False) as client:
        status = wait_for_check(client)
        assert status["state"] == "error"  # the ledger has no schema: the check fails
        seen = _all_text(client, ["/api/audit-chain", "/", "/accounts/x", "/api/accounts", "/api/accounts/x",
                                  "/releases/1", "/api/releases/1", "/runs/d/r"])
    ledger.engine.dispose()
    assert PASSWORD not in seen, [line[:400] for line in seen.splitlines() if PASSWORD in line]


def test_the_ledger_password_never_appears_in_any_answer(pg_password_role, auth_manager):
    """No page, JSON answer, header or asset of a working ledger holds the ledger URL's password."""
    database, role, schema_name = pg_password_role
    url = database.set(username=role, password=PASSWORD).update_query_dict(
        {"options": f"-csearch_path={schema_name}"}).render_as_string(hide_password=False)
    owner_url = database.update_query_dict({"options": f"-csearch_path={schema_name}"}).render_as_string(
        hide_password=False)
    owner = ledger_with(owner_url, census=account_config("pure_dp", epsilon="10", dags=("d",)))
    owner.commit(reserve(owner, "census", "r1"), {"run": "r1"})
    admin = sa.create_engine(database, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{schema_name}" TO "{role}"')
        conn.exec_driver_sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema_name}" TO "{role}"')
    admin.dispose()
    ledger = Ledger(url)
    app = dashboard_app.create_app(lambda: ledger, verify_interval=3600)
    with TestClient(app, headers=bearer(mint(auth_manager)), raise_server_exceptions=False) as client:
        assert wait_for_check(client)["state"] == "ok"
        seen = _all_text(client, ["/api/audit-chain", "/", "/accounts/census", "/api/accounts",
                                  "/api/accounts/census", "/api/accounts/census/charges", "/releases/1",
                                  "/api/releases/1", "/runs/d/r1", "/api/runs/d/r1", "/accounts/census?limit=0",
                                  "/api/releases/999", "/static/dashboard.js"])
    ledger.engine.dispose()
    owner.engine.dispose()
    assert "census" in seen and PASSWORD not in seen


def test_the_audit_check_hands_the_password_to_its_child_only_through_the_pipe(monkeypatch):
    """The ledger URL (password included) is not on the check's child command line or in its environment."""
    seen: dict = {}
    real = multiprocessing.get_context

    class Spy:
        def __init__(self, method):
            self.context = real(method)

        def Pipe(self):  # noqa: N802  (multiprocessing's name)
            return self.context.Pipe()

        def Process(self, target, args, **kwargs):  # noqa: N802
            seen["args"], seen["kwargs"] = args, kwargs
            return self.context.Process(target=target, args=args, **kwargs)

    monkeypatch.setattr(audit_status.multiprocessing, "get_context", Spy)
    url = f"postgresql+psycopg://u:{PASSWORD}@127.0.0.1:1/none"
    answer = audit_status._verify_in_child(url)
    assert answer["state"] == "error" and PASSWORD not in json.dumps(answer)
    assert PASSWORD not in repr(seen["args"]) + repr(seen["kwargs"])
