"""The dashboard's JSON API (dp_operators/dashboard/app.py): authentication with real Airflow JWTs minted by
Airflow's simple auth manager (the ``auth_manager`` fixture of conftest.py), read-only routes, parameter validation
and 404s.

The data layer (:mod:`dp_operators.dashboard.queries`) is replaced by recording fakes here: these tests pin what
the app does (who gets in, what it asks the queries for, what it answers); the queries' JSON is tested with them.
"""

from __future__ import annotations

import base64
import datetime as dt
import gc
import html
import json
import sqlite3
from fractions import Fraction
from pathlib import Path

import jwt
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.dashboard import audit_status, queries
from dp_operators.dashboard.queries import LedgerUnavailableError
from dp_operators.ledger import ReleaseKey
from dashboard_auth import JWT_SECRET, bearer, mint
from dashboard_data import BAD_CHARGE_FILTERS
from ledger_backends import account_config, ledger_with
from support import spender

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
    """Replace the query functions with fakes that record their arguments (not the viewer's ``access``: the
    simple auth manager's viewer is a privacy officer); unknown names give ``None``."""
    calls: list[tuple] = []

    def accounts_overview(ledger, access=None):
        calls.append(("accounts_overview", ledger))
        return ACCOUNTS

    def account_detail(ledger, name, *, access=None):
        calls.append(("account_detail", ledger, name))
        return ACCOUNT if name == "census_adult" else None

    def account_charges(ledger, name, *, dag_id=None, state=None, since=None, until=None, after=None, limit=50,
                        access=None):
        calls.append(("account_charges", ledger, name,
                      dict(dag_id=dag_id, state=state, since=since, until=until, after=after, limit=limit)))
        return PAGE if name == "census_adult" else None

    def release_detail(ledger, charge_id, *, limit=None, access=None):
        calls.append(("release_detail", ledger, charge_id, limit))
        return RELEASE if charge_id == 7 else None

    def run_charges(ledger, dag_id, run_id, *, access=None):
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
        "/api/accounts", "/api/accounts/{name:path}", "/api/accounts/{name:path}/charges",
        "/api/releases/{charge_id}", "/api/runs/{dag_id}/{run_id:path}", "/api/audit-chain", "/api/approvals",
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
    assert fake_queries[3][2:] == (7, dashboard_app.DEFAULT_RELEASE_VALUES)


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


@pytest.mark.parametrize(
    "path, query, name",
    [
        pytest.param("/api/accounts/a/b", "account_detail", "a/b", id="slash"),
        pytest.param("/api/accounts/a%2Fb", "account_detail", "a/b", id="percent-encoded slash"),
        pytest.param("/api/accounts/a/b/c", "account_detail", "a/b/c", id="two slashes"),
        pytest.param("/api/accounts/a/b/charges", "account_charges", "a/b", id="charges of a/b"),
        pytest.param("/api/accounts/a%2Fb/charges", "account_charges", "a/b", id="charges of a%2Fb"),
        pytest.param("/api/accounts/x/charges", "account_charges", "x", id="x/charges is the charges of x"),
        pytest.param("/api/accounts/x%2Fcharges", "account_charges", "x", id="x%2Fcharges too: decoded first"),
        pytest.param("/api/accounts/x/charges/charges", "account_charges", "x/charges",
                     id="the charges of an account named x/charges"),
    ],
)
def test_account_names_may_hold_a_slash(client, token, fake_queries, path, query, name):
    """Names holding "/" reach the queries whole; a path ending in /charges is always the charges route."""
    response = client.get(path, headers=bearer(token))
    assert response.status_code == 404  # the fakes know only census_adult: the name reached the query
    assert response.json() == {"detail": "no such budget account"}
    assert fake_queries[-1][0] == query and fake_queries[-1][2] == name


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
        until=dt.datetime(2025, 2, 1, 11, tzinfo=dt.UTC),
        after=120,
        limit=500,
    )
    # the queries get aware UTC times, whatever offset the client gave
    assert fake_queries[-1][3]["since"].tzinfo is dt.UTC and fake_queries[-1][3]["until"].tzinfo is dt.UTC


@pytest.mark.parametrize(
    "params",
    [
        *BAD_CHARGE_FILTERS,
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


def test_ids_up_to_the_databases_largest_integer_reach_the_query_and_beyond_get_422(client, token, fake_queries):
    assert client.get(f"/api/releases/{dashboard_app.MAX_ID}", headers=bearer(token)).status_code == 404
    assert fake_queries[-1][2] == dashboard_app.MAX_ID == 2**63 - 1
    page = client.get("/api/accounts/census_adult/charges", params={"after": dashboard_app.MAX_ID},
                      headers=bearer(token))
    assert page.status_code == 200 and fake_queries[-1][3]["after"] == dashboard_app.MAX_ID
    calls = len(fake_queries)
    assert client.get(f"/api/releases/{2**63}", headers=bearer(token)).status_code == 422
    assert client.get("/api/accounts/census_adult/charges", params={"after": 2**63},
                      headers=bearer(token)).status_code == 422
    assert len(fake_queries) == calls


@pytest.mark.parametrize("path", [
    "/api/accounts/a%00b", "/api/accounts/a%00b/charges", "/api/accounts/census_adult/charges?dag_id=d%00",
    "/api/runs/d%00/r", "/api/runs/d/r%00x",
])
def test_a_nul_in_any_name_or_filter_gets_422_and_no_query(client, token, fake_queries, path):
    response = client.get(path, headers=bearer(token))
    assert response.status_code == 422, response.text
    assert fake_queries == []


@pytest.mark.parametrize(
    "params, named",
    [
        pytest.param({"since": "9999-12-31T23:00:00-05:00"}, "since", id="since after year 9999 in UTC"),
        pytest.param({"until": "0001-01-01T00:00:00+05:00"}, "until", id="until before year 1 in UTC"),
    ],
)
def test_times_that_leave_the_calendar_in_utc_get_422_with_a_message(client, token, fake_queries, params, named):
    response = client.get("/api/accounts/census_adult/charges", params=params, headers=bearer(token))
    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{named} (") and "outside the years 1 to 9999 in UTC" in (
        response.json()["detail"])
    assert fake_queries == []


def test_time_window_gives_aware_utc_times():
    since, until = dashboard_app.time_window(
        dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 1, 5, tzinfo=dt.timezone(dt.timedelta(hours=5))))
    assert since == until == dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    assert since.tzinfo is dt.UTC and until.tzinfo is dt.UTC
    assert dashboard_app.time_window(None, None) == (None, None)
    with pytest.raises(ValueError, match="since .* is after until"):
        dashboard_app.time_window(dt.datetime(2025, 1, 2), dt.datetime(2025, 1, 1))


def test_the_release_route_lists_the_first_values_up_to_its_limit(client, token, fake_queries):
    for query, limit in [("", 200), ("?limit=1", 1), (f"?limit={queries.MAX_RELEASE_VALUES}", 10_000)]:
        assert client.get(f"/api/releases/7{query}", headers=bearer(token)).status_code == 200
        assert fake_queries[-1][2:] == (7, limit)
    calls = len(fake_queries)
    for bad in ("0", str(queries.MAX_RELEASE_VALUES + 1), "all"):
        assert client.get(f"/api/releases/7?limit={bad}", headers=bearer(token)).status_code == 422, bad
    assert len(fake_queries) == calls


# ---- request limits and caching -----------------------------------------------------------------------------
def _query(parameters: int, length: int | None = None) -> str:
    """``parameters`` distinct parameters (``p0=&p1=&...``), padded in the last one's value to ``length`` bytes."""
    query = "&".join(f"p{i}=" for i in range(parameters))
    return query if length is None else query + "x" * (length - len(query))


@pytest.mark.parametrize(
    "query, refused",
    [
        pytest.param(_query(1, dashboard_app.MAX_QUERY_BYTES), False, id="2048 bytes"),
        pytest.param(_query(1, dashboard_app.MAX_QUERY_BYTES + 1), True, id="2049 bytes"),
        pytest.param(_query(dashboard_app.MAX_QUERY_PARAMETERS), False, id="32 parameters"),
        pytest.param(_query(dashboard_app.MAX_QUERY_PARAMETERS + 1), True, id="33 parameters"),
        pytest.param(_query(dashboard_app.MAX_QUERY_PARAMETERS) + "&&&&", False, id="empty pieces do not count"),
        pytest.param("a&" * 1000, True, id="1000 bare keys"),
    ],
)
@pytest.mark.parametrize("authenticated", [True, False])
def test_an_oversized_query_string_gets_414_before_anything_else(client, token, fake_queries, opened, query,
                                                                  refused, authenticated):
    headers = bearer(token) if authenticated else {}
    response = client.get(f"/api/accounts/census_adult/charges?{query}", headers=headers)
    if refused:
        assert response.status_code == 414
        assert "the dashboard takes at most" in response.json()["detail"]
        assert response.headers["cache-control"] == "no-store"
        assert fake_queries == [] and opened == []
    else:
        assert response.status_code == (200 if authenticated else 401)


@pytest.mark.parametrize("path, signed_in, anonymous", [
    ("/api/accounts", 200, 401), ("/api/accounts/nope", 404, 401), ("/api/releases/x", 422, 401),
    ("/api/audit-chain", 200, 401), ("/api/accounts?" + "a&" * 40, 414, 414), ("/nothing", 404, 404),
])
def test_every_answer_but_the_assets_says_no_store(client, token, path, signed_in, anonymous):
    for headers, status in ((bearer(token), signed_in), ({}, anonymous)):
        response = client.get(path, headers=headers)
        assert response.status_code == status
        assert response.headers["cache-control"] == "no-store"


# ---- the ledger connection ----------------------------------------------------------------------------------


def _connection(monkeypatch, conn_id: str, extra: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "dp_ledger", "extra": extra}))


def sqlite_url(path: Path) -> str:
    """A SQLite URL naming ``path`` whatever characters it holds (SQLAlchemy escapes them)."""
    return sa.URL.create("sqlite", database=str(path)).render_as_string()


def _reserve(ledger, run: str):
    return ledger.reserve(ReleaseKey("d", run, "t", -1, "r"), account="census", amount=Fraction(1, 100),
                          mechanisms=[], spec_hash="0" * 64)


def test_dashboard_ledger_reads_without_any_key(monkeypatch, tmp_path, ledger):
    _connection(monkeypatch, "dp_dashboard_test", {"url": ledger.url, "audit_key": "s" * 64})
    monkeypatch.setenv("AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID", "dp_dashboard_test")
    opened = dashboard_app.dashboard_ledger()
    # the same file, through SQLite's read-only mode
    url = sa.make_url(opened.url)
    assert (url.database, dict(url.query)) == (f"file:{ledger.engine.url.database}", {"mode": "ro", "uri": "true"})
    assert opened._key is None  # the spend key in the connection is not taken: the dashboard signs nothing
    opened.check_schema()


def test_dashboard_ledger_refuses_a_governor_connection(monkeypatch, ledger):
    _connection(monkeypatch, "dp_officer_test", {"url": ledger.url, "governor_key": "g" * 64})
    with pytest.raises(LedgerUnavailableError, match="governor_key") as refused:
        dashboard_app.dashboard_ledger("dp_officer_test")
    assert "governor_key" in refused.value.hint and "dashboard_ledger_conn_id" in refused.value.hint


def _drop_wal_files(ledger) -> Path:
    """Close every connection of ``ledger`` (SQLite then folds the WAL back and deletes -wal and -shm); the path."""
    path = Path(ledger.engine.url.database)
    ledger.engine.dispose()
    ledger._reader.dispose()
    gc.collect()  # the governor that initialised the file: its pool's connections close when it is collected
    assert path.exists() and not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    return path


def test_a_sqlite_ledger_is_read_in_wal_mode_with_no_writer_and_never_written(monkeypatch, tmp_path, auth_manager,
                                                                              token):
    """SQLite's read-only mode (mode=ro) reads a WAL ledger whose -wal and -shm files are gone (no writer
    connected), refuses every write, and leaves the file usable by the writers; the audit check's child gets the
    same read-only URL."""
    writer = ledger_with(f"sqlite:///{tmp_path / 'ledger.db'}", census=account_config("pure_dp", epsilon="10",
                                                                                     dags=("d",)))
    writer.commit(_reserve(writer, "r1"), {"run": "r1"})
    path = _drop_wal_files(writer)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    _connection(monkeypatch, "dp_dashboard_wal", {"url": f"sqlite:///{path}"})
    monkeypatch.setenv("AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID", "dp_dashboard_wal")
    checked: list[str] = []
    real = audit_status._verify_in_child
    monkeypatch.setattr(audit_status, "_verify_in_child", lambda url: checked.append(url) or real(url))
    app = dashboard_app.create_app(verify_interval=3600)
    with TestClient(app, headers=bearer(token)) as client:
        assert client.get("/api/accounts").json()[0]["spent"] == "1/100"
        # a writer commits while the dashboard is connected: the dashboard sees it (WAL: readers and a writer)
        writer = spender(f"sqlite:///{path}")
        writer.commit(_reserve(writer, "r2"), {"run": "r2"})
        assert client.get("/api/accounts/census/charges").json()["total"] == 2
        client.get("/api/audit-chain")
        assert app.state.verify._status.wait(timeout=60)["state"] == "ok"
        reader = app.state.ledger()
        for engine in (reader.engine, reader._reader):
            with pytest.raises(sa.exc.OperationalError, match="readonly database"), engine.begin() as conn:
                conn.exec_driver_sql("UPDATE dp_budget_accounts SET cap = '1000'")
    assert checked == [reader.engine.url.render_as_string(hide_password=False)]
    assert sa.make_url(checked[0]).query == {"mode": "ro", "uri": "true"}
    assert writer.account("census").cap == Fraction(10)


@pytest.mark.parametrize("name", ["ledger.db", "a dir/led ger?#%41.db"])
def test_a_missing_sqlite_ledger_is_an_error_and_never_created(monkeypatch, tmp_path, name):
    path = tmp_path / name
    _connection(monkeypatch, "dp_dashboard_nofile", {"url": sqlite_url(path)})
    with pytest.raises(LedgerUnavailableError, match="no ledger at .*: run 'dpctl ledger init'") as missing:
        dashboard_app.dashboard_ledger("dp_dashboard_nofile")
    assert str(path) in str(missing.value) and str(path) not in missing.value.hint
    assert "dp_dashboard_nofile" in missing.value.hint and "dpctl ledger init" in missing.value.hint
    assert not path.exists()
    assert not path.parent.exists() or list(path.parent.iterdir()) == []


def test_a_path_with_uri_syntax_is_read_as_that_file(monkeypatch, tmp_path):
    """The path goes into the file: URI percent-encoded: spaces, ?, # and % in it name the file, not URI parts."""
    path = tmp_path / "a dir" / "led ger?#%41.db"
    path.parent.mkdir()
    writer = ledger_with(sqlite_url(path), census=account_config("pure_dp", epsilon="10", dags=("d",)))
    _connection(monkeypatch, "dp_dashboard_odd", {"url": sqlite_url(path)})
    assert [a.name for a in dashboard_app.dashboard_ledger("dp_dashboard_odd").accounts()] == ["census"]
    assert [p.name for p in path.parent.iterdir() if not p.name.startswith(path.name)] == []  # no other file
    writer.engine.dispose()


# ---- the ledger cannot be opened or read: 503, the details in the log only --------------------------------------
SECRET_PASSWORD = "Pw-" + "7e1d" * 6


def _no_connection(monkeypatch, tmp_path) -> list[str]:
    return []  # the configured connection is simply not defined


def _governor_connection(monkeypatch, tmp_path) -> list[str]:
    path = tmp_path / "secret_dir_gov" / "ledger.db"
    _connection(monkeypatch, "dp_dashboard_broken", {"url": sqlite_url(path), "governor_key": "g" * 64})
    return ["secret_dir_gov"]


def _missing_file(monkeypatch, tmp_path) -> list[str]:
    _connection(monkeypatch, "dp_dashboard_broken", {"url": sqlite_url(tmp_path / "secret_dir_nofile" / "l.db")})
    return ["secret_dir_nofile"]


def _no_schema(monkeypatch, tmp_path) -> list[str]:
    path = tmp_path / "secret_dir_empty" / "l.db"
    path.parent.mkdir()
    sqlite3.connect(path).close()  # a database file without the ledger's tables
    _connection(monkeypatch, "dp_dashboard_broken", {"url": sqlite_url(path)})
    return ["secret_dir_empty"]


def _unknown_host(monkeypatch, tmp_path) -> list[str]:
    url = f"postgresql+psycopg://secret_user_x:{SECRET_PASSWORD}@secret-host-x.invalid:5432/secret_db_x"
    _connection(monkeypatch, "dp_dashboard_broken", {"url": url})
    return ["secret_user_x", SECRET_PASSWORD, "secret-host-x", "secret_db_x"]


def _refused_with_query_password(monkeypatch, tmp_path) -> list[str]:
    url = f"postgresql+psycopg://secret_user_x@127.0.0.1:1/secret_db_x?password={SECRET_PASSWORD}"
    _connection(monkeypatch, "dp_dashboard_broken", {"url": url})
    return ["secret_user_x", SECRET_PASSWORD, "127.0.0.1", "secret_db_x"]


BROKEN_PAGES = ["/", "/accounts/x", "/releases/1", "/runs/d/r"]
BROKEN_JSON = ["/api/accounts", "/api/accounts/x", "/api/accounts/x/charges", "/api/releases/1", "/api/runs/d/r"]


@pytest.mark.parametrize(
    "setup, hint, logged",
    [
        pytest.param(_no_connection, "there is no Airflow connection 'dp_dashboard_broken': create it",
                     "isn't defined", id="no connection"),
        pytest.param(_governor_connection, "holds a governor_key", "holds a governor_key", id="governor connection"),
        pytest.param(_missing_file, "does not exist: run 'dpctl ledger init'", "secret_dir_nofile",
                     id="no SQLite file"),
        pytest.param(_no_schema, "no ledger schema, or one of another version: a privacy officer runs 'dpctl ledger "
                     "init'", "has no schema", id="no schema"),
        pytest.param(_unknown_host, "the database refused or failed the read", "secret-host-x.invalid",
                     id="unknown PostgreSQL host, password in the URL"),
        pytest.param(_refused_with_query_password, "the database refused or failed the read", "Connection refused",
                     id="connection refused, password as a query parameter"),
    ],
)
def test_a_ledger_that_cannot_be_read_is_a_503_that_names_the_connection_and_the_fix(
    monkeypatch, tmp_path, auth_manager, token, caplog, setup, hint, logged
):
    monkeypatch.setenv("AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID", "dp_dashboard_broken")
    secrets = setup(monkeypatch, tmp_path)
    app = dashboard_app.create_app(verify_interval=3600)
    seen = []
    with caplog.at_level("ERROR"), TestClient(app, headers=bearer(token)) as client:
        for path in BROKEN_PAGES + BROKEN_JSON:
            response = client.get(path)
            seen.append(f"{response.headers} {response.text}")
            assert response.status_code == 503, (path, response.status_code, response.text[:300])
            assert response.headers["cache-control"] == "no-store"
            if path in BROKEN_JSON:
                message = response.json()["detail"]
            else:
                assert response.headers["content-type"].startswith("text/html")
                message = html.unescape(response.text)
            assert "Airflow connection 'dp_dashboard_broken' (set by [dp_operators] dashboard_ledger_conn_id)" in (
                message), path
            assert hint in message, (path, message)
        client.get("/api/audit-chain")
        audit = app.state.verify._status.wait(timeout=60)
        seen.append(json.dumps(audit))
    assert audit["state"] == "error" and hint.split(":")[0] in audit["error"], audit["error"]
    assert not [secret for secret in secrets if any(secret in text for text in seen)]
    # the whole exception went to the api-server's log
    assert logged in caplog.text, caplog.text[-2000:]
    assert not tmp_path.joinpath("secret_dir_nofile").exists()


def test_a_503_drops_the_kept_ledger_so_a_fixed_connection_works_without_a_restart(
    monkeypatch, tmp_path, auth_manager, token, ledger
):
    """The first opening succeeds (the file exists) but reading fails (no schema): the 503 drops that ledger and
    closes its engines; once the connection points at a good ledger the next request of the same app reads it."""
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    _connection(monkeypatch, "dp_dashboard_fixed", {"url": sqlite_url(empty)})
    monkeypatch.setenv("AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID", "dp_dashboard_fixed")
    opened, disposed = [], []

    def factory():
        opened.append(dashboard_app.dashboard_ledger())
        return opened[-1]

    monkeypatch.setattr(sa.engine.Engine, "dispose", lambda engine, close=True: disposed.append(engine))
    app = dashboard_app.create_app(factory, verify_interval=3600)
    with TestClient(app, headers=bearer(token)) as client:
        for path in ("/api/accounts", "/"):
            assert client.get(path).status_code == 503
        assert len(opened) == 2  # the page's request reopened after the JSON route's 503
        assert {id(e) for e in disposed} >= {id(opened[0].engine), id(opened[0]._reader)}
        _connection(monkeypatch, "dp_dashboard_fixed", {"url": ledger.url})
        response = client.get("/api/accounts")
        assert response.status_code == 200 and [row["name"] for row in response.json()] == ["census_adult"]
        assert client.get("/").status_code == 200
    assert len(opened) == 3  # the good ledger is kept


def test_a_503_lets_a_failed_audit_check_retry_at_the_next_status(monkeypatch, auth_manager, token):
    def broken():
        raise LedgerUnavailableError("down", "the ledger is down")

    app = dashboard_app.create_app(broken, verify_interval=3600)
    with TestClient(app, headers=bearer(token)) as client:
        client.get("/api/audit-chain")
        first = app.state.verify._status.wait(timeout=60)
        assert first["state"] == "error"
        assert client.get("/api/audit-chain").json()["running"] is False  # fresh for 30 s
        assert client.get("/api/accounts").status_code == 503
        # wait() starts a check only when the last one is stale: without the 503's recheck it would be fresh
        assert app.state.verify._status.wait(timeout=60)["checked_at"] != first["checked_at"]


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
