"""The budget dashboard never writes the ledger: only GET reaches a route, and neither the routes nor the
audit-chain check change a SQLite ledger or create one. (PostgreSQL's read-only roles: ``test_reader_role.py``.)"""

from __future__ import annotations

import json
import sqlite3

import pytest
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.ledger import Ledger
from dashboard_apps import PREFIX, dashboard, mount, reserve, wait_for_check
from dashboard_auth import bearer, mint
from hostile_names import hostile_release_id
from ledger_backends import account_config, ledger_with

def _sqlite_rows(url: str) -> list[str]:
    """The whole SQLite database as SQL text (schema and every row)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return list(conn.iterdump())


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND"])
def test_no_method_but_get_reaches_any_route(hostile, token, method):
    """Every method but GET answers 401 or 405 on every route."""
    release = hostile_release_id(hostile)
    with TestClient(mount(dashboard(hostile)), headers=bearer(token)) as client:
        for path in ("/", "/accounts/census", f"/releases/{release}", "/runs/d/r1", "/static/dashboard.js",
                     "/api/accounts/census", "/api/accounts/census/charges", "/api/audit-chain"):
            response = client.request(method, PREFIX + path, json={"cap": "1000", "spent": "0"})
            assert response.status_code in (401, 405), (method, path, response.status_code)


def test_every_route_and_the_audit_check_leave_a_sqlite_ledger_unchanged(tmp_path, auth_manager):
    """Every route and the audit-chain check leave a SQLite ledger unchanged, its in-flight reservation included."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = ledger_with(url, census=account_config("pure_dp", epsilon="10", dags=("d",)))
    ledger.commit(reserve(ledger, "census", "r1"), {"run": "r1"})
    reserve(ledger, "census", "r2")  # in flight: a reader must not abandon or expire it
    before = _sqlite_rows(url)
    reader = Ledger(url)
    app = dashboard_app.create_app(lambda: reader, verify_interval=0)
    with TestClient(app, headers=bearer(mint(auth_manager))) as client:
        for path in ("/", "/accounts/census", "/releases/1", "/releases/2", "/runs/d/r1", "/api/accounts",
                     "/api/accounts/census", "/api/accounts/census/charges?limit=500", "/api/releases/1",
                     "/api/runs/d/r2"):
            assert client.get(path).status_code == 200, path
        assert wait_for_check(client)["state"] == "ok"
        app.state.verify._status._interval = 3600  # no further check: the last one ends before the comparison
        app.state.verify._status.wait(timeout=60)
    reader.engine.dispose()
    reader._reader.dispose()
    assert _sqlite_rows(url) == before


def test_a_dashboard_pointed_at_a_missing_sqlite_ledger_creates_no_file(tmp_path, auth_manager, monkeypatch):
    """A dashboard pointed at a missing SQLite ledger answers 503 and creates no file, nor does its audit check."""
    # SQLite is opened read-only at the driver level (mode=ro): that is also what makes "the dashboard cannot write"
    # hold on SQLite, which has no reader role (PostgreSQL's: test_reader_role.py).
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("AIRFLOW_CONN_DP_DASHBOARD_MISSING",
                       json.dumps({"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{path}"}}))
    monkeypatch.setenv("AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID", "dp_dashboard_missing")
    app = dashboard_app.create_app(verify_interval=3600)
    with TestClient(app, headers=bearer(mint(auth_manager)), raise_server_exceptions=False) as client:
        assert client.get("/api/accounts").status_code == 503  # no ledger there: "ledger unavailable"
        assert wait_for_check(client)["state"] == "error"
    assert not path.exists(), f"the dashboard created {path} ({path.stat().st_size} bytes)"
