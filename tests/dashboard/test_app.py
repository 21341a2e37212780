"""The dashboard's JSON API (dp_operators/dashboard/app.py): authentication with real Airflow JWTs minted by
Airflow's simple auth manager (the ``auth_manager`` fixture of conftest.py), read-only routes, parameter validation
and 404s.

The data layer (:mod:`dp_operators.dashboard.queries`) is replaced by recording fakes here: these tests pin what
the app does (who gets in, what it asks the queries for, what it answers); the queries' JSON is tested with them.
"""

from __future__ import annotations

import base64
import datetime as dt
import json

import jwt
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.dashboard import queries
from dashboard_auth import JWT_SECRET, bearer, mint

ACCOUNTS = [{"name": "census_adult", "unit": "rho", "cap": "1/2", "spent": "0.1", "remaining": "0.4"}]
ACCOUNT = {"name": "census_adult", "unit": "rho", "cap": "1/2", "spent": "0.1", "burn_down": []}
PAGE = {"charges": [{"id": 7, "dag_id": "adult_census_release", "state": "committed"}], "next_after": None}
RELEASE = {"charge_id": 7, "release_name": "adult", "values": []}

ROUTES = [
    "/api/accounts", "/api/accounts/census_adult", "/api/accounts/census_adult/charges", "/api/releases/7",
    "/api/runs/adult_census_release/manual__2026-01-01T00%3A00%3A00%2B00%3A00", "/api/audit-chain",
]
RUN = {"dag_id": "adult_census_release", "run_id": "?", "charges": [], "total": 0, "limit": 500}


@pytest.fixture
def fake_queries(monkeypatch):
    """Replace the four query functions with fakes that record their arguments; unknown names give ``None``."""
    calls: list[tuple] = []

    def accounts_overview(ledger):
        calls.append(("accounts_overview", ledger))
        return ACCOUNTS

    def account_detail(ledger, name):
        calls.append(("account_detail", ledger, name))
        return ACCOUNT if name == "census_adult" else None

    def account_charges(ledger, name, *, dag_id=None, state=None, since=None, until=None, after=None, limit=50):
        calls.append(("account_charges", ledger, name,
                      dict(dag_id=dag_id, state=state, since=since, until=until, after=after, limit=limit)))
        return PAGE if name == "census_adult" else None

    def release_detail(ledger, charge_id):
        calls.append(("release_detail", ledger, charge_id))
        return RELEASE if charge_id == 7 else None

    def run_charges(ledger, dag_id, run_id):
        calls.append(("run_charges", ledger, dag_id, run_id))
        return {**RUN, "run_id": run_id}

    for function in (accounts_overview, account_detail, account_charges, release_detail, run_charges):
        monkeypatch.setattr(queries, function.__name__, function)
    return calls


class FakeLedger:
    """Stands for the Ledger: the fakes only check it is the one the factory made."""


@pytest.fixture
def opened():
    return []


@pytest.fixture
def client(auth_manager, fake_queries, opened):
    def factory():
        opened.append(FakeLedger())
        return opened[-1]

    with TestClient(dashboard_app.create_app(factory)) as test_client:
        yield test_client


@pytest.fixture
def token(auth_manager):
    return mint(auth_manager)


# ---- authentication -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ROUTES)
def test_anonymous_requests_get_401_and_never_reach_the_ledger(client, fake_queries, opened, path):
    response = client.get(path)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert fake_queries == [] and opened == []


def _reencode(token: str, **claims) -> str:
    """``token`` with ``claims`` changed, signed again with the test secret (what Airflow would accept but for
    the changed claims)."""
    header = jwt.get_unverified_header(token)
    payload = jwt.decode(token, options={"verify_signature": False})
    return jwt.encode({**payload, **claims}, JWT_SECRET, algorithm=header["alg"], headers={"kid": header.get("kid")})


def _tampered(token: str) -> str:
    """``token`` with its payload's role raised to admin and the original signature kept."""
    head, body, signature = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["role"] = "admin"
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return f"{head}.{forged}.{signature}"


@pytest.mark.parametrize(
    "make_token",
    [
        pytest.param(_tampered, id="payload changed, signature kept"),
        pytest.param(
            lambda t: jwt.encode(jwt.decode(t, options={"verify_signature": False}), "other-" + "k" * 58,
                                 algorithm="HS512"),
            id="signed with another key",
        ),
        pytest.param(lambda t: _reencode(t, exp=int(dt.datetime.now(dt.UTC).timestamp()) - 60), id="expired"),
        pytest.param(lambda t: _reencode(t, aud="some-other-service"), id="wrong audience"),
        pytest.param(lambda t: "not-a-jwt", id="garbage"),
    ],
)
@pytest.mark.parametrize("carrier", ["bearer", "cookie"])
def test_bad_tokens_get_401(client, token, fake_queries, make_token, carrier):
    bad = make_token(token)
    if carrier == "bearer":
        response = client.get("/api/accounts", headers=bearer(bad))
    else:
        client.cookies.set("_token", bad)
        response = client.get("/api/accounts")
    assert response.status_code == 401, response.text
    assert fake_queries == []


def test_the_reencoding_helper_keeps_a_valid_token_valid(client, token):
    """The negative control of the 'expired' and 'wrong audience' cases: re-signing alone is accepted."""
    response = client.get("/api/accounts", headers=bearer(_reencode(token)))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ROUTES)
def test_a_valid_bearer_token_gets_200(client, token, path):
    assert client.get(path, headers=bearer(token)).status_code == 200


def test_the_ui_login_cookie_authenticates(client, token):
    client.cookies.set("_token", token)
    assert client.get("/api/accounts").json() == ACCOUNTS


def test_an_explicit_bad_bearer_wins_over_a_good_cookie(client, token):
    """Airflow's precedence (get_user): a supplied Authorization header is the caller's identity."""
    client.cookies.set("_token", token)
    assert client.get("/api/accounts", headers=bearer(_tampered(token))).status_code == 401


def test_a_logged_out_token_gets_401(client, auth_manager):
    """Logging out revokes the token's jti in Airflow's database (RevokedToken); the dashboard honours it."""
    from airflow.models.revoked_token import RevokedToken

    token = mint(auth_manager)
    assert client.get("/api/accounts", headers=bearer(token)).status_code == 200
    claims = jwt.decode(token, options={"verify_signature": False})
    RevokedToken.revoke(claims["jti"], dt.datetime.fromtimestamp(claims["exp"], dt.UTC))
    assert client.get("/api/accounts", headers=bearer(token)).status_code == 401


def test_a_user_the_auth_manager_denies_the_ui_gets_403(client, auth_manager):
    roleless = mint(auth_manager, role=None)
    assert client.get("/api/accounts", headers=bearer(roleless)).status_code == 403


def test_every_route_carries_the_auth_dependency():
    app = dashboard_app.create_app(FakeLedger)
    routes = [route for route in app.routes if isinstance(route, APIRoute)]
    api = {route.path for route in routes if route.path.startswith("/api/")}
    assert api == {
        "/api/accounts", "/api/accounts/{name}", "/api/accounts/{name}/charges", "/api/releases/{charge_id}",
        "/api/runs/{dag_id}/{run_id:path}", "/api/audit-chain",
    }
    for route in routes:
        assert route.methods == {"GET"}
        assert any(d.call is dashboard_app.require_dashboard_user for d in route.dependant.dependencies), route.path
    # nothing else is served: no unauthenticated OpenAPI schema or docs
    assert {getattr(route, "path", None) for route in app.routes} == {route.path for route in routes}


def test_mounted_like_an_airflow_plugin_app_it_still_authenticates(auth_manager, fake_queries, token):
    """Airflow's init_plugins does ``app.mount(url_prefix, subapp)``; the parent's dependencies do not reach it."""
    parent = FastAPI()
    parent.mount("/dp-budget", dashboard_app.create_app(FakeLedger))
    with TestClient(parent) as test_client:
        assert test_client.get("/dp-budget/api/accounts").status_code == 401
        assert test_client.get("/dp-budget/api/accounts", headers=bearer(token)).json() == ACCOUNTS


# ---- read-only ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("path", ROUTES)
def test_no_write_methods(client, token, fake_queries, method, path):
    assert client.request(method, path, headers=bearer(token), json={"cap": "10"}).status_code == 405
    assert fake_queries == []


# ---- data, 404 and validation -------------------------------------------------------------------------------


def test_routes_answer_the_queries_json_from_one_ledger(client, token, fake_queries, opened):
    assert client.get("/api/accounts", headers=bearer(token)).json() == ACCOUNTS
    assert client.get("/api/accounts/census_adult", headers=bearer(token)).json() == ACCOUNT
    assert client.get("/api/accounts/census_adult/charges", headers=bearer(token)).json() == PAGE
    assert client.get("/api/releases/7", headers=bearer(token)).json() == RELEASE
    assert len(opened) == 1  # the factory ran once; every query got that ledger
    assert all(call[1] is opened[0] for call in fake_queries)
    assert fake_queries[2][3] == dict(dag_id=None, state=None, since=None, until=None, after=None, limit=50)
    assert fake_queries[3][2] == 7


@pytest.mark.parametrize(
    "encoded, run_id",
    [
        pytest.param("manual__2026-01-01T00%3A00%3A00%2B00%3A00", "manual__2026-01-01T00:00:00+00:00", id="encoded"),
        pytest.param("manual__2026-01-01T00:00:00+00:00", "manual__2026-01-01T00:00:00+00:00", id="raw plus"),
        pytest.param("a%2Fb%20%25%3Cx%3E", "a/b %<x>", id="slash percent markup"),
    ],
)
def test_the_run_route_decodes_the_run_id_as_airflow_encodes_it(client, token, fake_queries, encoded, run_id):
    """Airflow's UI fills {RUN_ID} with encodeURIComponent(run_id)."""
    response = client.get(f"/api/runs/adult_census_release/{encoded}", headers=bearer(token))
    assert response.status_code == 200 and response.json() == {**RUN, "run_id": run_id}
    assert fake_queries[-1][2:] == ("adult_census_release", run_id)


def test_the_audit_chain_route_answers_the_background_status(client, token, opened):
    first = client.get("/api/audit-chain", headers=bearer(token)).json()
    assert first["authenticated"] is False and first["state"] in ("pending", "error")


@pytest.mark.parametrize(
    "path",
    ["/api/accounts/nope", "/api/accounts/nope/charges", "/api/releases/8"],
)
def test_unknown_names_get_404(client, token, path):
    response = client.get(path, headers=bearer(token))
    assert response.status_code == 404
    assert "no such" in response.json()["detail"]


def test_charges_query_parameters_reach_the_query(client, token, fake_queries):
    response = client.get(
        "/api/accounts/census_adult/charges",
        headers=bearer(token),
        params={"dag_id": "adult_census_release", "state": "committed", "since": "2025-01-01T00:00:00",
                "until": "2025-02-01T12:00:00+01:00", "after": "120", "limit": "500"},
    )
    assert response.status_code == 200
    assert fake_queries[-1][3] == dict(
        dag_id="adult_census_release",
        state="committed",
        since=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),  # no offset: taken as UTC
        until=dt.datetime(2025, 2, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=1))),
        after=120,
        limit=500,
    )


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"limit": "0"}, id="limit 0"),
        pytest.param({"limit": "501"}, id="limit over 500"),
        pytest.param({"limit": "ten"}, id="limit not a number"),
        pytest.param({"state": "spent"}, id="unknown state"),
        pytest.param({"since": "last tuesday"}, id="since not ISO 8601"),
        pytest.param({"since": "2025-02-01T00:00:00Z", "until": "2025-01-01T00:00:00Z"}, id="since after until"),
        pytest.param({"after": "0"}, id="after not a charge id"),
        pytest.param({"after": "abc"}, id="after not a number"),
        pytest.param({"dag_id": ""}, id="empty dag_id"),
    ],
)
def test_invalid_charges_parameters_get_422(client, token, fake_queries, params):
    response = client.get("/api/accounts/census_adult/charges", headers=bearer(token), params=params)
    assert response.status_code == 422, response.text
    assert fake_queries == []


def test_a_non_integer_charge_id_gets_422(client, token):
    assert client.get("/api/releases/seven", headers=bearer(token)).status_code == 422


# ---- the ledger connection ----------------------------------------------------------------------------------


def _connection(monkeypatch, conn_id: str, extra: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "dp_ledger", "extra": extra}))


def test_dashboard_ledger_reads_without_any_key(monkeypatch, tmp_path, ledger):
    url = ledger.url
    _connection(monkeypatch, "dp_dashboard_test", {"url": url, "audit_key": "s" * 64})
    monkeypatch.setenv("AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID", "dp_dashboard_test")
    opened = dashboard_app.dashboard_ledger()
    assert opened.url == url
    assert opened._key is None  # the spend key in the connection is not taken: the dashboard signs nothing
    opened.check_schema()


def test_dashboard_ledger_refuses_a_governor_connection(monkeypatch, ledger):
    _connection(monkeypatch, "dp_officer_test", {"url": ledger.url, "governor_key": "g" * 64})
    with pytest.raises(ValueError, match="governor_key"):
        dashboard_app.dashboard_ledger("dp_officer_test")


# ---- end to end: the real queries on a real ledger, opened from an Airflow connection ---------------------------


def test_real_ledger_through_the_connection(monkeypatch, auth_manager, ledger, token):
    """No fakes: the app opens the ledger from the dashboard connection (no key) and answers the queries' JSON."""
    _connection(monkeypatch, "dp_dashboard_e2e", {"url": ledger.url})
    monkeypatch.setenv("AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID", "dp_dashboard_e2e")
    with TestClient(dashboard_app.create_app()) as test_client:
        assert test_client.get("/api/accounts").status_code == 401
        overview = test_client.get("/api/accounts", headers=bearer(token)).json()
        assert [(row["name"], row["unit"], row["cap"], row["spent"], row["remaining"]) for row in overview] == [
            ("census_adult", "rho", "1/2", "0", "1/2")
        ]
        detail = test_client.get("/api/accounts/census_adult", headers=bearer(token))
        assert detail.status_code == 200 and detail.json()["name"] == "census_adult"
        page = test_client.get("/api/accounts/census_adult/charges", headers=bearer(token)).json()
        assert (page["charges"], page["total"], page["next_after"]) == ([], 0, None)
        assert test_client.get("/api/accounts/nope/charges", headers=bearer(token)).status_code == 404
        assert test_client.get("/api/releases/1", headers=bearer(token)).status_code == 404
