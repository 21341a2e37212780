"""Security review of the budget dashboard (issue 12): attacks on dp_operators/dashboard/, one test per attack.

Threat model: anonymous clients, any Airflow user (a viewer, or a user without UI access), DAG authors who choose
dag/run/task/release names and the values a release publishes, and anyone holding the ledger connection (who can
reserve and commit any plain JSON through the spender's API). The dashboard must let in only authenticated Airflow
users with UI access, never write the ledger, never leak the ledger URL's password, stay safe against XSS, path
tricks, SQL injection and oversized requests, answer no unhandled 500 to a client's input, redirect nowhere else,
and run at most one audit-chain check at a time.

Each test is a defence that holds. The tests whose docstrings begin "Was a hole" failed when the review was written
(each says what the hole was); they pin the fixes. Requests carry real Airflow JWTs from the simple auth manager
(``dashboard_auth.mint``); ledgers are real, on SQLite and PostgreSQL (``ledger_url``). The tests at the end
(``integration``) drive a real ``airflow api-server`` with Debian's Chromium.
"""

from __future__ import annotations

import html
import json
import multiprocessing
import re
import sqlite3
import threading
import time
import uuid
from fractions import Fraction
from urllib.parse import parse_qs, quote, urlsplit

import jwt
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.dashboard import audit_status
from dp_operators.ledger import Ledger, ReleaseKey
from dashboard_auth import JWT_SECRET, bearer, mint
from ledger_backends import account_config, ledger_with
from test_pages import Element, parse

PREFIX = "/dp-budget"
MECHANISMS = [{"mechanism": "discrete_laplace", "scale": 10.0}]

# ---- hostile names and values ------------------------------------------------------------------------------------
# Every string a DAG author (or a spender with the ledger connection) controls, each carrying HTML, attribute,
# script-closing, URL and plotly pseudo-HTML syntax. "PWN" marks them, so a test can find where they ended up.
HOSTILE_ACCOUNT = "acct\"'><img src=x onerror=window.PWN=1>&amp;</script>"
HOSTILE_DAG = "dag\"><svg onload=window.PWN=2>{{7*7}}%{y}"
HOSTILE_RUN = "run</script><script>window.PWN=3</script>/../../api/accounts?x=1#y javascript:PWN"
HOSTILE_TASK = "task<iframe srcdoc='<script>parent.PWN=4</script>'>"
HOSTILE_RELEASE = "<a href=\"javascript:window.PWN=5\">rel</a><!--"
HOSTILE_AGGREGATE = "agg<b onmouseover=window.PWN=6>bold</b>&lt;i&gt;entity&lt;/i&gt;"
HOSTILE_COLUMN = "col<style>*{display:none}</style>"
HOSTILE_KEYS = [
    "<a href=\"javascript:window.PWN=7\">click</a>",
    "&lt;img src=x onerror=window.PWN=8&gt;",  # entities plotly would decode if not escaped again
    "<br><span style=\"font-size:90px\">big</span>%{x}",
    "</script><script>window.PWN=9</script>",
]
HOSTILE_OUTPUT = {
    "release": "hostile",
    "confidence": 0.95,
    "aggregates": {
        HOSTILE_AGGREGATE: {
            "kind": "count<img src=x onerror=window.PWN=10>",
            "mechanism": "<script>window.PWN=11</script>",
            "group_by": [HOSTILE_COLUMN],
            "rows": [{HOSTILE_COLUMN: key, "value": i, "half_width": 1.5} for i, key in enumerate(HOSTILE_KEYS)],
        },
        "file<img src=x onerror=window.PWN=12>": {
            "kind": "count", "mechanism": "discrete_laplace", "group_by": ["k"],
            "rows_file": {"uri": "javascript:window.PWN=13//<img src=x onerror=window.PWN=14>",
                          "sha256": "<b>" + "a" * 61, "rows": 3, "format": "<svg onload=window.PWN=15>"},
        },
    },
}
HOSTILE_MECHANISMS = [{"mechanism": "<img src=x onerror=window.PWN=16>"}, {"mechanism": "discrete_laplace"}]


# ---- fixtures ----------------------------------------------------------------------------------------------------
@pytest.fixture
def token(auth_manager):
    return mint(auth_manager)


class AuditStandIn:
    """Stands for ``app.state.verify`` where a test is not about the audit check."""

    def status(self) -> dict:
        return {"state": "ok", "checked_at": "2025-03-01T12:00:00+00:00", "authenticated": False,
                "problem_count": 0, "problems": [], "events": 1, "charges": 1, "accounts": 1, "seconds": 0.1,
                "error": None, "running": False}


def dashboard(ledger, *, audit: bool = False, opened: list | None = None) -> FastAPI:
    """The dashboard app over ``ledger``; ``opened`` records each time the app opens the ledger."""
    def factory():
        if opened is not None:
            opened.append(ledger)
        return ledger

    app = dashboard_app.create_app(factory, verify_interval=3600)
    if not audit:
        app.state.verify = AuditStandIn()
    return app


def mounted(app: FastAPI) -> FastAPI:
    """``app`` mounted as Airflow's api-server mounts a plugin app (``init_plugins``: ``app.mount``)."""
    parent = FastAPI()
    parent.mount(PREFIX, app)
    return parent


def reserve(ledger: Ledger, account: str, run: str, amount: str = "1/100", *, dag: str = "d", task: str = "t",
            release: str = "r", mechanisms=MECHANISMS):
    return ledger.reserve(ReleaseKey(dag, run, task, -1, release), account=account, amount=Fraction(amount),
                          mechanisms=mechanisms, spec_hash="0" * 64)


@pytest.fixture
def hostile(ledger_url):
    """A ledger whose every DAG-author-controlled string is hostile: account ``census`` (and a hostile-named
    account) with a committed release publishing :data:`HOSTILE_OUTPUT`, and ordinary charges ``d``/``r1..r3``."""
    ledger = ledger_with(
        ledger_url,
        census=account_config("pure_dp", epsilon="10", dags=("d", HOSTILE_DAG)),
        **{HOSTILE_ACCOUNT: account_config("pure_dp", epsilon="3", dags=(HOSTILE_DAG,))},
    )
    for run in ("r1", "r2", "r3"):
        ledger.commit(reserve(ledger, "census", run), {"run": run})
    for number, account in enumerate(("census", HOSTILE_ACCOUNT)):  # two tasks of the same run
        ledger.commit(reserve(ledger, account, HOSTILE_RUN, dag=HOSTILE_DAG, task=HOSTILE_TASK + "#" * number,
                              release=HOSTILE_RELEASE, mechanisms=HOSTILE_MECHANISMS), HOSTILE_OUTPUT)
    return ledger


def hostile_release_id(ledger: Ledger, account: str = "census") -> int:
    return next(c["id"] for c in ledger.charges(account=account) if c["run_id"] == HOSTILE_RUN)


def run_path(dag_id: str, run_id: str) -> str:
    """The DAG-run tab's path as Airflow's UI fills it (``encodeURIComponent``)."""
    unreserved = "-_.!~*'()"
    return f"/runs/{quote(dag_id, safe=unreserved)}/{quote(run_id, safe=unreserved)}"


def hostile_pages(ledger: Ledger) -> list[str]:
    release = hostile_release_id(ledger)
    return ["/", "/accounts/census", f"/accounts/{quote(HOSTILE_ACCOUNT, safe='')}",
            f"/accounts/census?dag_id={quote(HOSTILE_DAG, safe='')}", f"/releases/{release}",
            f"/releases/{hostile_release_id(ledger, HOSTILE_ACCOUNT)}", run_path(HOSTILE_DAG, HOSTILE_RUN),
            f"/accounts/{quote(HOSTILE_RUN, safe='')}", f"/releases/{release}?x=<script>",
            f"/accounts/census?state={quote(HOSTILE_TASK, safe='')}",
            f"/accounts/census?since={quote(HOSTILE_RELEASE, safe='')}&limit={quote(HOSTILE_DAG, safe='')}"]


# ---- 1. authentication -------------------------------------------------------------------------------------------
ANONYMOUS_PATHS = [
    "/", "/accounts/census", "/accounts/nope", "/releases/1", "/releases/0", "/releases/x", "/runs/d/r1",
    "/accounts/census?limit=0", "/accounts/census?since=garbage", "/api/accounts", "/api/accounts/census",
    "/api/accounts/census/charges?limit=99999", "/api/releases/1", "/api/runs/d/r1", "/api/audit-chain",
    "/static/plotly.min.js", "/static/dashboard.css", "/static/dashboard.js", "/static/missing.js",
    "/static/..%2Fpages.py", "/static/%2e%2e", "/accounts/..%2F..%2Fapi%2Faccounts", "/runs/d/..%2F..%2F",
]


ANONYMOUS_CREDENTIALS = {
    "no credentials": {}, "garbage bearer": {"Authorization": "Bearer x.y.z"},
    "garbage cookie": {"Cookie": "_token=x.y.z"}, "basic auth": {"Authorization": "Basic b2ZmaWNlcjpwYXNzd29yZA=="},
}


@pytest.mark.parametrize("path", ANONYMOUS_PATHS)
def test_anonymous_gets_401_on_every_route_and_never_reaches_the_ledger(hostile, auth_manager, path):
    # one ledger per path, every kind of missing or bad credential against it (the ledger is never opened)
    for how, headers in ANONYMOUS_CREDENTIALS.items():
        opened: list = []
        app = mounted(dashboard(hostile, audit=True, opened=opened))
        with TestClient(app, raise_server_exceptions=False) as client:
            response = client.get(PREFIX + path, headers=headers, follow_redirects=False)
        # a path no route matches gets the router's bare 404 (nothing served, nothing read)
        assert response.status_code == 401 or (response.status_code, response.text) == (
            404, '{"detail":"Not Found"}'), (how, path, response.status_code, response.text[:300])
        assert opened == [], how
        # a page's 401 links to Airflow's login with next = the requested path (as sent): the one echo allowed
        text = response.text
        login = re.search(r'<a id="login-link" href="([^"]*)"', text)
        if login is not None:
            next_url = parse_qs(urlsplit(html.unescape(login.group(1))).query)["next"]
            assert next_url == [PREFIX + path], (how, next_url, path)
            text = text.replace(login.group(0), "")
        assert "census" not in text and "PWN" not in text, how


def test_a_user_without_ui_access_gets_403_on_pages_api_and_assets(hostile, auth_manager):
    roleless = mint(auth_manager, role=None)
    opened: list = []
    with TestClient(dashboard(hostile, opened=opened), headers=bearer(roleless)) as client:
        for path in ("/", "/accounts/census", "/api/accounts", "/api/audit-chain", "/static/plotly.min.js"):
            response = client.get(path)
            assert response.status_code == 403, path
            assert "census" not in response.text
    assert opened == []


def _task_token(**extras) -> str:
    """A token as Airflow's executors mint them for the Execution API (the one a DAG author's task code holds):
    the same signing secret, the Execution API's audience."""
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    generator = JWTGenerator(secret_key=JWT_SECRET, valid_for=600, audience="urn:airflow.apache.org:task")
    return generator.generate(extras={"sub": str(uuid.uuid4()), **extras})


@pytest.mark.parametrize(
    "make_token",
    [
        pytest.param(lambda: _task_token(), id="a task's Execution API token"),
        pytest.param(lambda: _task_token(sub="officer", role="admin"), id="task token with a UI user's claims"),
        pytest.param(lambda: jwt.encode({"sub": "officer", "role": "admin", "exp": int(time.time()) + 600},
                                        key="", algorithm="none"), id="alg none"),
    ],
)
def test_tokens_that_are_not_ui_tokens_are_refused(hostile, auth_manager, make_token):
    """A DAG author's task holds an Execution API JWT signed with the same secret: it must not open the dashboard."""
    with TestClient(dashboard(hostile), raise_server_exceptions=False) as client:
        for carrier in ("bearer", "cookie"):
            client.cookies.clear()
            if carrier == "cookie":
                client.cookies.set("_token", make_token())
                response = client.get("/api/accounts")
            else:
                response = client.get("/api/accounts", headers=bearer(make_token()))
            assert response.status_code == 401, (carrier, response.status_code, response.text[:300])


@pytest.mark.parametrize("authenticated", [False, True])
def test_unknown_paths_and_the_generated_docs_reveal_nothing(hostile, token, authenticated):
    headers = bearer(token) if authenticated else {}
    with TestClient(mounted(dashboard(hostile)), headers=headers, raise_server_exceptions=False) as client:
        for path in ("/nothing", "/api", "/api/", "/api/nothing", "/openapi.json", "/docs", "/redoc",
                     "/static/", "/static"):
            response = client.get(PREFIX + path, follow_redirects=False)
            assert response.status_code in (307, 401, 404), (path, response.status_code)
            assert "census" not in response.text and "openapi" not in response.text.lower(), path


# ---- 2. read-only ------------------------------------------------------------------------------------------------
def _sqlite_rows(url: str) -> list[str]:
    """The whole SQLite database as SQL text (schema and every row)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return list(conn.iterdump())


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND"])
def test_no_method_but_get_reaches_any_route(hostile, token, method):
    release = hostile_release_id(hostile)
    with TestClient(mounted(dashboard(hostile)), headers=bearer(token)) as client:
        for path in ("/", "/accounts/census", f"/releases/{release}", "/runs/d/r1", "/static/dashboard.js",
                     "/api/accounts/census", "/api/accounts/census/charges", "/api/audit-chain"):
            response = client.request(method, PREFIX + path, json={"cap": "1000", "spent": "0"})
            assert response.status_code in (401, 405), (method, path, response.status_code)


def test_every_route_and_the_audit_check_leave_a_sqlite_ledger_unchanged(tmp_path, auth_manager):
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
        assert _wait_for_check(client)["state"] == "ok"
        app.state.verify._status._interval = 3600  # no further check: the last one ends before the comparison
        app.state.verify._status.wait(timeout=60)
    reader.engine.dispose()
    reader._reader.dispose()
    assert _sqlite_rows(url) == before


def test_a_dashboard_pointed_at_a_missing_sqlite_ledger_creates_no_file(tmp_path, auth_manager, monkeypatch):
    """Was a hole (a write, minor): the dashboard opens SQLite ledgers with a plain read-write connection, so the first
    request, and the audit check's child, create an empty database file at the configured path when there is none
    (a wrong path, or a ledger not yet created). Fix: open SQLite for the dashboard read-only at the driver level
    (``sqlite:///file:<path>?mode=ro&uri=true``, or ``create_ledger_engine(read_only=True)`` connecting with
    ``mode=ro``); that also makes "the dashboard cannot write" hold on SQLite, which has no reader role."""
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("AIRFLOW_CONN_DP_DASHBOARD_MISSING",
                       json.dumps({"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{path}"}}))
    monkeypatch.setenv("AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID", "dp_dashboard_missing")
    app = dashboard_app.create_app(verify_interval=3600)
    with TestClient(app, headers=bearer(mint(auth_manager)), raise_server_exceptions=False) as client:
        assert client.get("/api/accounts").status_code == 503  # no ledger there: "ledger unavailable"
        assert _wait_for_check(client)["state"] == "error"
    assert not path.exists(), f"the dashboard created {path} ({path.stat().st_size} bytes)"


# ---- 3. XSS ------------------------------------------------------------------------------------------------------
ALLOWED_TAGS = {
    "#document", "html", "head", "meta", "title", "link", "script", "body", "nav", "main", "h1", "h2", "section",
    "p", "table", "thead", "tbody", "tr", "th", "td", "a", "div", "span", "time", "code", "strong", "ul", "li",
    "form", "label", "input", "select", "option", "button", "wbr",
}


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def assert_inert(document: Element, text: str, path: str) -> None:
    """No element, attribute, script or link the page did not mean to have; embedded figures hold no markup that
    plotly would interpret."""
    tags = {e.tag for e in document.iter()}
    assert tags <= ALLOWED_TAGS, (path, tags - ALLOWED_TAGS)
    for e in document.iter():
        assert not any(name.startswith("on") or name in ("srcdoc", "formaction", "style") for name in e.attrs), (
            path, e.tag, e.attrs)
        for name in ("href", "src", "action"):
            if name in e.attrs and (e.tag, e.attrs.get("rel"), e.attrs[name]) != ("link", "icon", "data:,"):
                target = e.attrs[name]
                # a path on this server: no scheme (javascript:, data:), no other host (//host)
                assert target.startswith("/") and not target.startswith("//"), (path, e.tag, target)
    assert "<!--" not in text
    for script in document.all("script"):
        if "src" in script.attrs:
            assert script.attrs["src"].startswith(("/static/", f"{PREFIX}/static/")), (path, script.attrs)
            assert script.text() == ""
            continue
        assert script.attrs.get("type") == "application/json", (path, script.attrs)
        body = script.text()
        assert "</" not in body and "<!--" not in body and "<script" not in body.lower(), path
        figure = json.loads(body)
        for s in _strings(figure.get("data", [])) + _strings(figure.get("layout", {})):
            if "PWN" in s:  # a hostile name in a chart: plotly must see no tag and no entity of it
                markup = s.replace("<br>", "").replace("<extra>", "").replace("</extra>", "")
                assert "<" not in markup and ">" not in markup, (path, s)


def test_hostile_names_and_values_are_inert_in_every_page(hostile, token):
    with TestClient(mounted(dashboard(hostile)), headers=bearer(token)) as client:
        for path in hostile_pages(hostile):
            response = client.get(PREFIX + path)
            assert response.status_code in (200, 404, 422), (path, response.status_code)
            assert response.headers["content-type"].startswith("text/html")
            assert_inert(parse(response.text), response.text, path)


def test_hostile_strings_are_shown_as_written(hostile, token):
    """Escaping must not mangle: the names are readable as the DAG author wrote them."""
    release = hostile_release_id(hostile)
    with TestClient(dashboard(hostile), headers=bearer(token)) as client:
        page = parse(client.get(f"/releases/{release}").text)
        fields = page.one("section", id="release")
        assert fields.one("td", data_field="dag_id").text() == HOSTILE_DAG
        assert fields.one("td", data_field="run_id").text() == HOSTILE_RUN
        assert fields.one("td", data_field="task_id").text() == HOSTILE_TASK
        assert fields.one("td", data_field="release_name").text() == HOSTILE_RELEASE
        assert [td.text() for td in page.all("td", data_field="key")] == HOSTILE_KEYS
        assert page.all("h2")[0].text() == HOSTILE_AGGREGATE


def test_the_json_api_answers_json_never_html(hostile, token):
    release = hostile_release_id(hostile)
    with TestClient(dashboard(hostile), headers=bearer(token)) as client:
        for path in ("/api/accounts", f"/api/accounts/{quote(HOSTILE_ACCOUNT, safe='')}", f"/api/releases/{release}",
                     f"/api{run_path(HOSTILE_DAG, HOSTILE_RUN)}",
                     f"/api/accounts/{quote('<script>x</script>', safe='')}",
                     "/api/accounts/census/charges?state=<script>x</script>"):
            response = client.get(path)
            assert response.headers["content-type"] == "application/json", path
            assert response.status_code in (200, 404, 422), path


def test_pages_forbid_inline_scripts_framing_by_others_and_plugins(hostile, token):
    with TestClient(dashboard(hostile), headers=bearer(token)) as client:
        for path in ("/", "/accounts/census", "/accounts/nope", "/accounts/census?limit=0",
                     f"/releases/{hostile_release_id(hostile)}"):
            policy = client.get(path).headers["content-security-policy"]
            directives = dict((d.strip().split(" ", 1) + [""])[:2] for d in policy.split(";") if d.strip())
            assert directives["script-src"] == "'self'", path
            assert directives["object-src"] == "'none'" and directives["base-uri"] == "'none'", path
            assert directives["frame-ancestors"] == "'self'", path


# ---- 4. path tricks ----------------------------------------------------------------------------------------------
ASSETS = {"plotly.min.js", "dashboard.css", "dashboard.js"}


@pytest.mark.parametrize("name", [
    "..%2Fpages.py", "..%2F..%2F..%2Fpyproject.toml", "%2e%2e%2fapp.py", "..%5Capp.py", "dashboard.js%00.png",
    "dashboard.js%2500", "DASHBOARD.JS", "dashboard.js.", "dashboard.js%20", "..", ".", "%2e%2e",
    "static%2Fdashboard.js", "__init__.py", "..%252Fapp.py", "dashboard.css%3F", "plotly.min.js%23",
])
def test_the_static_route_serves_its_three_assets_only(hostile, token, name):
    with TestClient(mounted(dashboard(hostile)), headers=bearer(token)) as client:
        response = client.get(f"{PREFIX}/static/{name}", follow_redirects=False)
    assert response.status_code in (404, 307), (name, response.status_code)
    if response.status_code == 404:
        assert response.headers["content-type"].startswith(("text/plain", "application/json")), name
        assert b"import" not in response.content and b"[project]" not in response.content


def test_dot_segments_in_names_stay_names(hostile, token):
    """``..`` in an account, DAG or run name is data: it must not reach another route."""
    with TestClient(mounted(dashboard(hostile)), headers=bearer(token)) as client:
        for path, status in [("/accounts/..%2F..%2Fapi%2Faccounts", 404), ("/accounts/%2E%2E%2Fapi%2Faccounts", 404),
                             ("/api/accounts/..%2Fcensus", 404), ("/runs/d/..%2F..%2Faccounts%2Fcensus", 200)]:
            response = client.get(PREFIX + path, follow_redirects=False)
            assert response.status_code == status, (path, response.status_code)
            assert response.headers["content-type"].startswith(("text/html", "application/json")), path


# ---- 5. SQL injection --------------------------------------------------------------------------------------------
INJECTIONS = ["' OR '1'='1", "d' --", "d'; DROP TABLE dp_charges; --", "%", "_", "d%", "\\", "1) OR (1=1",
              "census' UNION SELECT * FROM dp_budget_accounts --", "d\"", "$1", ":account"]


@pytest.mark.parametrize("injection", INJECTIONS)
def test_filters_and_names_are_values_never_sql(hostile, token, injection):
    with TestClient(dashboard(hostile), headers=bearer(token), raise_server_exceptions=False) as client:
        page = client.get("/api/accounts/census/charges", params={"dag_id": injection})
        assert page.status_code == 200, page.text[:300]
        assert (page.json()["total"], page.json()["charges"]) == (0, [])
        assert client.get(f"/api/accounts/{quote(injection, safe='')}").status_code == 404
        assert client.get(f"/api/accounts/{quote(injection, safe='')}/charges").status_code == 404
        run = client.get(f"/api/runs/{quote(injection, safe='')}/{quote(injection, safe='')}")
        assert run.status_code == 200 and run.json()["total"] == 0
        assert client.get(f"/accounts/census?dag_id={quote(injection, safe='')}").status_code == 200
    assert len(list(hostile.charges(account="census"))) == 4  # nothing dropped


# ---- 6. sizes, limits and client input that must not crash the server ------------------------------------------
def asgi_get(app: FastAPI, path: str, query: str = "", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET ``path?query`` straight through the ASGI interface, as a server hands it over (httpx refuses URLs over
    64 KB on the client side; uvicorn with httptools, Airflow's api-server, does not). Returns status and body."""
    import asyncio

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
             "server": ("testserver", 80), "client": ("127.0.0.1", 50000)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        asyncio.run(app(scope, receive, send))
    except Exception:  # noqa: BLE001  (Starlette re-raises after sending its 500)
        pass
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.mark.parametrize("query", [
    pytest.param("limit=501", id="limit over 500"), pytest.param(f"limit={10**30}", id="limit 10^30"),
    pytest.param("limit=-1", id="negative limit"), pytest.param("limit=1e9", id="limit 1e9"),
    pytest.param("dag_id=" + "d" * 1_000_000, id="1 MB dag_id"),
    pytest.param("since=" + "2" * 1_000_000, id="1 MB since"),
    pytest.param("after=" + "9" * 100_000, id="100,000-digit after"),
    pytest.param("state=" + "committed" * 100_000, id="900 KB state"),
])
def test_oversized_parameters_are_refused_quickly(hostile, token, query):
    app = dashboard(hostile)
    # a query string over the app's limit is refused whole (414) before any parameter is read
    expected = 414 if len(query) > dashboard_app.MAX_QUERY_BYTES else 422
    for path in ("/api/accounts/census/charges", "/accounts/census"):
        started = time.perf_counter()
        status, body = asgi_get(app, path, query, bearer(token))
        elapsed = time.perf_counter() - started
        assert status == expected, (path, status, body[:200])
        assert elapsed < 1.0, (path, elapsed)


# 13,000 distinct parameters no route reads ("0&1&...&32c7"): 60 KB, under the 64 KB query that uvicorn with
# httptools (the api-server's HTTP parser) accepts
JUNK_PARAMETERS = "&".join(format(i, "x") for i in range(13_000))


@pytest.mark.parametrize("path", ["/accounts/census", "/api/accounts/census/charges"])
def test_unknown_query_parameters_cost_a_viewer_no_more_than_a_second(hostile, token, path):
    """Was a hole (DoS by any viewer): FastAPI's ``request_params_to_args`` (fastapi/dependencies/utils.py) collects
    every query parameter a route does not declare with ``received_params.getlist(key)``, and Starlette's ``getlist``
    scans the whole list: quadratic in the number of parameters. 13,000 distinct unknown parameters in a 60 KB
    query string (the api-server's uvicorn/httptools accepts up to 64 KB) keep a worker busy for seconds (5 to 10
    s here) holding the GIL, so the whole api-server worker stalls; a few such requests at once stall Airflow. Only
    routes with query parameters are hit (the charges JSON and the
    account page); anonymous requests stop at the auth dependency first. Fix: a small middleware on the dashboard
    app that answers 414 to a query string over a few KB (the longest legitimate one is ``dag_id`` of 250
    characters plus five short filters), or to more than, say, 20 parameters."""
    app = dashboard(hostile)
    started = time.perf_counter()
    status, _ = asgi_get(app, path, JUNK_PARAMETERS, bearer(token))
    elapsed = time.perf_counter() - started
    assert status in (200, 414, 422, 431) and elapsed < 1.0, (path, status, f"{elapsed:.1f} s")


def test_unknown_query_parameters_cost_an_anonymous_client_nothing(hostile, auth_manager):
    """The query-string limit runs before authentication (414), and the auth dependency before the route's
    parameters are read: the quadratic parsing above is reached by no one."""
    app = dashboard(hostile)
    started = time.perf_counter()
    status, _ = asgi_get(app, "/accounts/census", JUNK_PARAMETERS)
    assert status == 414 and time.perf_counter() - started < 1.0


@pytest.mark.parametrize("path", [
    pytest.param("/api/accounts/census/charges?after=9223372036854775808", id="after beyond 64-bit"),
    pytest.param("/accounts/census?after=99999999999999999999999", id="page after beyond 64-bit"),
    pytest.param("/api/releases/9223372036854775808", id="release id beyond 64-bit"),
    pytest.param("/releases/99999999999999999999999", id="release page id beyond 64-bit"),
])
def test_ids_beyond_the_databases_integers_are_not_a_500(hostile, token, path):
    """Was a hole (SQLite): ``after`` and ``charge_id`` are validated ``ge=1`` but have no upper bound; a value above
    2**63 - 1 reaches sqlite3, which raises OverflowError ("Python int too large to convert to SQLite INTEGER"): an
    unhandled 500 from one query parameter. Fix: ``le=2**63 - 1`` on ``AfterCursor`` and both ``charge_id`` path
    parameters (app.py, pages.py), so the client gets 422 (or 404 for an id)."""
    with TestClient(dashboard(hostile), headers=bearer(token), raise_server_exceptions=False) as client:
        response = client.get(path)
    assert response.status_code in (200, 404, 422), (path, response.status_code, response.text[:200])


@pytest.mark.parametrize("params", [
    pytest.param({"since": "9999-12-31T23:00:00-05:00"}, id="since beyond year 9999 in UTC"),
    pytest.param({"until": "0001-01-01T00:00:00+05:00"}, id="until before year 1 in UTC"),
    pytest.param({"since": "0001-01-01T00:30:00+01:00", "until": "9999-12-31T23:00:00-01:00"},
                 id="both out of range in UTC"),
])
def test_times_at_the_edge_of_the_calendar_are_not_a_500(hostile, token, params):
    """Was a hole: ``since``/``until`` with an offset that moves them past 9999-12-31 or before 0001-01-01 in UTC pass
    pydantic's validation and ``time_window``; ``queries.as_utc`` then calls ``astimezone(timezone.utc)``, which
    raises OverflowError: an unhandled 500 (JSON API and account page). Fix: convert to UTC in ``app.time_window``
    and turn the OverflowError into the same 422 as "since after until"."""
    with TestClient(dashboard(hostile), headers=bearer(token), raise_server_exceptions=False) as client:
        for path in ("/api/accounts/census/charges", "/accounts/census"):
            response = client.get(path, params=params)
            assert response.status_code in (200, 422), (path, response.status_code, response.text[:200])


@pytest.mark.parametrize("path", [
    pytest.param("/api/accounts/census/charges?dag_id=d%00x", id="NUL in dag_id filter"),
    pytest.param("/accounts/census?dag_id=%00", id="NUL in dag_id filter, page"),
    pytest.param("/api/accounts/a%00b", id="NUL in account name"),
    pytest.param("/accounts/a%00b", id="NUL in account name, page"),
    pytest.param("/api/runs/d/r%001", id="NUL in run id"),
    pytest.param("/runs/d%00/r1", id="NUL in DAG id, page"),
])
def test_nul_characters_in_names_are_not_a_500(hostile, token, path):
    """Was a hole (PostgreSQL): a NUL character (``%00``) in any name or filter reaches psycopg, which refuses it
    ("PostgreSQL text fields cannot contain NUL (0x00) bytes"): an unhandled 500 from one request. Fix: refuse
    ``\\x00`` in the string parameters (a ``pattern=r"^[^\\x00]*$"`` on AccountName, DagId, RunId and
    DagIdFilter in app.py) for a 422, or answer 404/empty since no ledger name can hold one."""
    with TestClient(dashboard(hostile), headers=bearer(token), raise_server_exceptions=False) as client:
        response = client.get(path)
    assert response.status_code in (200, 404, 422), (path, response.status_code, response.text[:200])


def test_a_run_page_lists_at_most_a_page_of_charges(tmp_path, token):
    """A DAG author can make a run with any number of charges (mapped tasks): the run page lists 500 at most."""
    from dp_operators.dashboard import pages

    ledger = ledger_with(f"sqlite:///{tmp_path / 'ledger.db'}", census=account_config("pure_dp", epsilon="100"))
    for index in range(pages.RUN_PAGE_CHARGES + 20):
        ledger.reserve(ReleaseKey("d", "big", "t", index, "r"), account="census", amount=Fraction(1, 1000),
                       mechanisms=MECHANISMS, spec_hash="0" * 64)
    with TestClient(dashboard(ledger), headers=bearer(token)) as client:
        page = parse(client.get("/runs/d/big").text)
        api = client.get("/api/runs/d/big").json()
    rows = [tr for tr in page.one("table", id="run-charges").all("tr") if "data-charge-id" in tr.attrs]
    assert len(rows) == pages.RUN_PAGE_CHARGES and len(api["charges"]) <= pages.RUN_PAGE_CHARGES
    assert page.one("span", id="run-total").text() == str(pages.RUN_PAGE_CHARGES + 20) == str(api["total"])


@pytest.mark.parametrize("row", [
    pytest.param({"value": 10**400, "half_width": 1.5}, id="an integer beyond the doubles"),
    pytest.param({"value": 1.7e308, "half_width": 1e308}, id="a double whose interval overflows"),
])
def test_a_release_with_huge_finite_values_still_has_a_page(ledger_url, token, row):
    """Was a hole (minor, one release's page): the ledger commits any plain finite JSON (``canonical_json``), and a DAG
    author's task holds the spender connection, so it can commit a value beyond the doubles or one whose interval
    overflows them. ``release.publish.published_interval`` then raises OverflowError (its Fraction-to-float
    rounding), as does ``charts.release_figure``: the release page and ``/api/releases/{id}`` answer 500. Fix: in
    ``queries._published_values`` catch OverflowError per row and show the bound as open (None), and in
    ``charts.release_figure`` skip values that are not finite doubles (or convert with a guard)."""
    ledger = ledger_with(ledger_url, census=account_config("pure_dp", epsilon="10", dags=("d",)))
    ledger.commit(reserve(ledger, "census", "big"),
                  {"release": "r", "confidence": 0.95,
                   "aggregates": {"a": {"kind": "sum", "mechanism": "discrete_laplace", "group_by": [], **row}}})
    release = next(c["id"] for c in ledger.charges(account="census"))
    with TestClient(dashboard(ledger), headers=bearer(token), raise_server_exceptions=False) as client:
        statuses = {path: client.get(path).status_code for path in (f"/releases/{release}", f"/api/releases/{release}")}
    assert set(statuses.values()) == {200}, statuses


def test_a_release_page_is_bounded_whatever_the_release_published(ledger_url, token):
    """Was a hole (oversized page): a DAG author decides how many aggregates a release publishes (the spec has no
    bound, and the task can commit any JSON); the release page shows at most ``MAX_SHOWN_VALUES`` (200) values per
    aggregate but one table and one chart per aggregate with no bound on aggregates, and every chart embeds the
    whole ``plotly_white`` template (about 7 KB). 300 aggregates of 200 values make a 29 MB page with 300 plotly
    charts, which stalls a viewer's browser. Fix: cap the aggregates drawn on a page (e.g. the first 20 charts,
    the rest as tables or a list linking to ``?aggregate=`` pages), and set the template once in dashboard.js
    instead of in every figure."""
    ledger = ledger_with(ledger_url, census=account_config("pure_dp", epsilon="10", dags=("d",)))
    aggregates = {f"a{i:04d}": {"kind": "count", "mechanism": "discrete_laplace", "group_by": ["k"],
                                "rows": [{"k": f"k{j}", "value": j, "half_width": 1.5} for j in range(200)]}
                  for i in range(300)}
    ledger.commit(reserve(ledger, "census", "big"), {"release": "big", "confidence": 0.95, "aggregates": aggregates})
    release = next(c["id"] for c in ledger.charges(account="census"))
    with TestClient(dashboard(ledger), headers=bearer(token)) as client:
        started = time.perf_counter()
        response = client.get(f"/releases/{release}", headers={"Accept-Encoding": "identity"})
        elapsed = time.perf_counter() - started
    assert response.status_code == 200
    charts = response.text.count('data-chart-for="')
    print(f"release page: {len(response.content) / 1e6:.1f} MB, {charts} charts, {elapsed:.2f} s")
    assert len(response.content) < 5_000_000, f"{len(response.content) / 1e6:.1f} MB, {charts} charts"


# ---- 7. secrets --------------------------------------------------------------------------------------------------
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


def _wait_for_check(client: TestClient) -> dict:
    deadline = time.monotonic() + 60
    answer = client.get("/api/audit-chain").json()
    while answer["state"] == "pending" and time.monotonic() < deadline:
        time.sleep(0.05)
        answer = client.get("/api/audit-chain").json()
    return answer


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
    """Was a hole (query form): when the ledger has no schema (dashboard connection pointed at an empty database or a
    wrong search_path, or before ``dpctl ledger init``) every check fails with LedgerNotInitialisedError, whose
    message holds ``LedgerBase.url``; ``hide_password=True`` masks only the URL's user-info password, so a password
    given as ``?password=...`` (libpq accepts it; so do ``sslpassword`` etc.) is shown to every viewer by
    ``/api/audit-chain`` and the account page's audit section. Fix: never put the URL in a message a client sees
    (audit_status: report ``type(error).__name__`` and a fixed hint), or mask every query value in
    ``LedgerBase.url``."""
    database, role, schema_name = pg_password_role
    url = database.set(username=role, password=PASSWORD if where == "netloc" else None).update_query_dict(
        {"options": f"-csearch_path={schema_name}", **({"password": PASSWORD} if where == "query" else {})})
    text_url = url.render_as_string(hide_password=False)
    assert PASSWORD in text_url
    ledger = Ledger(text_url)
    app = dashboard_app.create_app(lambda: ledger, verify_interval=3600)
    with TestClient(app, headers=bearer(mint(auth_manager)), raise_server_exceptions=False) as client:
        status = _wait_for_check(client)
        assert status["state"] == "error"  # the ledger has no schema: the check fails
        seen = _all_text(client, ["/api/audit-chain", "/", "/accounts/x", "/api/accounts", "/api/accounts/x",
                                  "/releases/1", "/api/releases/1", "/runs/d/r"])
    ledger.engine.dispose()
    assert PASSWORD not in seen, [line[:400] for line in seen.splitlines() if PASSWORD in line]


def test_the_ledger_password_never_appears_in_any_answer(pg_password_role, auth_manager):
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
        assert _wait_for_check(client)["state"] == "ok"
        seen = _all_text(client, ["/api/audit-chain", "/", "/accounts/census", "/api/accounts",
                                  "/api/accounts/census", "/api/accounts/census/charges", "/releases/1",
                                  "/api/releases/1", "/runs/d/r1", "/api/runs/d/r1", "/accounts/census?limit=0",
                                  "/api/releases/999", "/static/dashboard.js"])
    ledger.engine.dispose()
    owner.engine.dispose()
    assert "census" in seen and PASSWORD not in seen


def test_the_audit_check_hands_the_password_to_its_child_only_through_the_pipe(monkeypatch):
    """The ledger URL (password included) must not be on the child's command line or in its environment."""
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


# ---- 8. the audit-chain check: one process at a time --------------------------------------------------------------
def _verify_children() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.name == "dp-budget-verify" and p.is_alive()]


def test_a_flood_of_requests_runs_one_audit_check_at_a_time(hostile, token, monkeypatch):
    """Requests from many clients while checks are stale (interval 0) start checks one after another, never two
    child processes at once."""
    running, most, started = [0], [0], [0]
    lock = threading.Lock()
    real = audit_status._verify_in_child

    def counted(url):
        with lock:
            running[0] += 1
            started[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return real(url)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(audit_status, "_verify_in_child", counted)
    app = dashboard_app.create_app(lambda: hostile, verify_interval=0)
    children = []
    stop = threading.Event()
    earlier = _verify_children()  # checks other tests' apps left running are not this app's
    for child in earlier:
        child.join(60)

    def sample():
        while not stop.is_set():
            children.append(len(_verify_children()))
            time.sleep(0.01)

    with TestClient(app, headers=bearer(token)) as client:
        sampler = threading.Thread(target=sample)
        sampler.start()

        def hammer():
            for _ in range(15):
                client.get("/api/audit-chain")
                client.get("/accounts/census")

        threads = [threading.Thread(target=hammer) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stop.set()
        sampler.join()
        status = app.state.verify._status
        status._interval = 3600  # no further check: the last one ends with the test
        status.wait(timeout=60)
    assert started[0] >= 2  # the flood did start checks again and again
    assert most[0] == 1, most[0]
    assert max(children) <= 1, max(children)


def test_each_app_instance_runs_its_own_check(hostile, token, monkeypatch):
    """Not a hole in the code, a limit of the design: the one-at-a-time lock is per app, and the api-server runs one
    app per worker process (``[api] workers``, 4 by default), so a deployment runs up to that many checks at once.
    This pins the per-app behaviour the report describes."""
    gate, inside, most = threading.Event(), [0], [0]
    lock = threading.Lock()

    def slow(url):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        gate.wait(10)
        with lock:
            inside[0] -= 1
        return {"state": "ok"}

    monkeypatch.setattr(audit_status, "_verify_in_child", slow)
    apps = [dashboard_app.create_app(lambda: hostile, verify_interval=0) for _ in range(4)]
    clients = [TestClient(app, headers=bearer(token)) for app in apps]
    for client in clients:
        client.get("/api/audit-chain")
    time.sleep(0.2)
    gate.set()
    for app in apps:
        app.state.verify._status.wait(timeout=10)
    assert most[0] == len(apps)


# ---- 9. redirects ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [
    "/api/accounts/", "/api/audit-chain/", "/api/releases/1/", "/static/dashboard.js/", "//evil.example/",
    "/%2F%2Fevil.example/", "/\\evil.example/", "/accounts/census/", "/runs/d/r1/", "/api/runs/d/r1/",
    "/api/accounts/census/charges/",
])
@pytest.mark.parametrize("authenticated", [False, True])
def test_no_redirect_leaves_the_dashboard(hostile, token, path, authenticated):
    headers = bearer(token) if authenticated else {}
    with TestClient(mounted(dashboard(hostile)), headers=headers, raise_server_exceptions=False) as client:
        response = client.get(PREFIX + path, follow_redirects=False)
    if response.is_redirect:
        location = urlsplit(response.headers["location"])
        assert location.netloc in ("", "testserver"), (path, response.headers["location"])
        assert location.path.startswith(f"{PREFIX}/") and not location.path.startswith("//"), (
            path, response.headers["location"])


# ---- 10. in a real browser: Debian's Chromium, the dashboard served by uvicorn ---------------------------------
def _integration_support():
    """``tests/integration``'s helpers (the browser's path and flags, a free port, the api-server runner)."""
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parents[1] / "integration")
    if folder not in sys.path:
        sys.path.append(folder)
    import dashboard_browser_support

    dashboard_browser_support.require_browser()
    return dashboard_browser_support


@pytest.fixture
def chromium():
    support = _integration_support()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(support.CHROMIUM), args=support.CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def served(hostile):
    """The dashboard over the hostile ledger, mounted at /dp-budget and served by uvicorn in a thread."""
    import uvicorn

    _integration_support()
    from airflow_services import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(mounted(dashboard(hostile)), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


PLOTLY_DRAWN = "svg.main-svg"
# what the hostile strings would do if a browser took them for markup
_EVIDENCE = """() => ({
  pwned: window.PWN === undefined ? null : window.PWN,
  images: document.querySelectorAll('img, iframe, object, embed').length,
  handlers: [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on')))
              .map(e => e.outerHTML.slice(0, 120)),
  svgLinks: [...document.querySelectorAll('svg a')].map(a => a.outerHTML.slice(0, 120)),
  ticks: [...document.querySelectorAll('.xtick text, .ytick text')].map(t => t.textContent),
  hover: [...document.querySelectorAll('.hoverlayer text')].map(t => t.textContent).join(' | '),
})"""


def test_hostile_names_run_no_script_in_chromium(hostile, served, chromium, token):
    """Pages with every hostile string, charts drawn and hovered: no script runs, no element is injected, plotly
    draws the names as text (its pseudo-HTML, links and entities included)."""
    context = chromium.new_context(extra_http_headers=bearer(token), viewport={"width": 1400, "height": 900})
    tab = context.new_page()
    dialogs, errors, violations = [], [], []
    tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    release = hostile_release_id(hostile)
    try:
        for path, charts in [("/", 1), ("/accounts/census", 1), (f"/accounts/{quote(HOSTILE_ACCOUNT, safe='')}", 1),
                             (f"/releases/{release}", 1), (run_path(HOSTILE_DAG, HOSTILE_RUN), 0)]:
            response = tab.goto(served + PREFIX + path)
            assert response.status == 200, path
            if charts:
                tab.locator(f".chart {PLOTLY_DRAWN}, .release-chart {PLOTLY_DRAWN}").first.wait_for()
                for point in tab.locator(".scatterlayer .point, .barlayer .point").all()[:8]:
                    point.hover(force=True)
                    tab.wait_for_timeout(100)
            evidence = tab.evaluate(_EVIDENCE)
            assert evidence["pwned"] is None and dialogs == [], (path, evidence["pwned"], dialogs)
            assert evidence["images"] == 0 and evidence["handlers"] == [], (path, evidence)
            assert evidence["svgLinks"] == [], (path, evidence["svgLinks"])
            if path.startswith("/releases/"):
                ticks = " ".join(evidence["ticks"])
                # the group-by keys are drawn as written: markup and entities stay text
                assert '<a href="javascript:window.PWN=7">click</a>' in ticks, ticks
                assert "&lt;img src=x onerror=window.PWN=8&gt;" in ticks, ticks
        assert errors == [] and violations == [], (errors, violations)
    finally:
        context.close()


# ---- 11. a real `airflow api-server` with the plugin -----------------------------------------------------------
@pytest.fixture(scope="module")
def airflow_server(tmp_path_factory):
    """``airflow api-server`` (one worker, SimpleAuthManager: ``admin`` and the viewer ``auditor``) serving the
    dashboard over a SQLite ledger with hostile names (``dashboard_browser_support.DashboardServer``)."""
    support = _integration_support()
    url = f"sqlite:///{tmp_path_factory.mktemp('review_ledger') / 'ledger.db'}"
    ledger = ledger_with(url, census=account_config("pure_dp", epsilon="10", dags=("d", HOSTILE_DAG)))
    ledger.commit(reserve(ledger, "census", "r1"), {"run": "r1"})
    ledger.commit(reserve(ledger, "census", HOSTILE_RUN, dag=HOSTILE_DAG, task=HOSTILE_TASK,
                          release=HOSTILE_RELEASE, mechanisms=HOSTILE_MECHANISMS), HOSTILE_OUTPUT)
    with support.DashboardServer.running(tmp_path_factory.mktemp("review_airflow"), url) as server:
        server.users = support.USERS
        yield server


def _sign_in(context, server, user: str) -> None:
    """Airflow's login page, as a person uses it."""
    _, password = server.users[user]
    tab = context.new_page()
    tab.goto(f"{server.base}/")
    tab.wait_for_url(re.compile(r"/auth/login"))
    tab.get_by_label("Username").fill(user)
    tab.get_by_label("Password").fill(password)
    tab.get_by_role("button", name="Sign in").click()
    tab.wait_for_url(f"{server.base}/")
    tab.close()


def _api_token(server, user: str) -> str:
    import httpx

    _, password = server.users[user]
    response = httpx.post(f"{server.base}/auth/token", json={"username": user, "password": password}, timeout=10)
    assert response.status_code in (200, 201), response.text
    return response.json()["access_token"]


@pytest.mark.integration
def test_real_server_the_login_cookie_opens_the_dashboard_in_airflows_iframe(airflow_server, chromium):
    """The UI's ``_token`` cookie (SameSite=Lax, path /) reaches /dp-budget inside the iframe Airflow
    draws for the "Privacy budget" entry; charts draw under both the page's CSP and the iframe's sandbox."""
    context = chromium.new_context(viewport={"width": 1300, "height": 900})
    violations, errors = [], []
    try:
        _sign_in(context, airflow_server, "auditor")
        [cookie] = [c for c in context.cookies() if c["name"] == "_token"]
        # Airflow's UI sets the cookie from script after POST /auth/token: SameSite=Lax but not HttpOnly, so a
        # script running in Airflow's origin (the dashboard's included) could read the JWT
        print(f"_token cookie: httpOnly={cookie['httpOnly']} sameSite={cookie['sameSite']} path={cookie['path']}")
        assert (cookie["sameSite"], cookie["path"]) == ("Lax", "/"), cookie
        tab = context.new_page()
        tab.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        tab.on("pageerror", lambda error: errors.append(str(error)))
        tab.goto(f"{airflow_server.base}/plugin/dp-budget")
        frame = tab.frame_locator("iframe")
        frame.locator("table#accounts tr[data-account='census']").wait_for()
        frame.locator(f"#overview-chart {PLOTLY_DRAWN}").first.wait_for()
        sandbox = tab.locator("iframe").get_attribute("sandbox")
        inner = next(f for f in tab.frames if "/dp-budget/" in f.url)
        # allow-scripts with allow-same-origin: the dashboard's document can reach Airflow's own window, so the
        # iframe is no isolation; the dashboard's CSP and escaping are the only defence of the Airflow session
        reaches_parent = inner.evaluate(
            "() => { try { return window.parent.location.pathname } catch (e) { return null } }"
        )
        print(f"iframe sandbox={sandbox!r}; the framed dashboard reads the parent's location: {reaches_parent!r}")
        assert "allow-same-origin" in sandbox and "allow-scripts" in sandbox
        assert violations == [] and errors == [], (violations, errors)
    finally:
        context.close()


@pytest.mark.integration
def test_real_server_a_logged_out_token_no_longer_opens_the_dashboard(airflow_server):
    import httpx

    token = _api_token(airflow_server, "auditor")
    base = airflow_server.base
    assert httpx.get(f"{base}/dp-budget/api/accounts", headers=bearer(token), timeout=10).status_code == 200
    with httpx.Client(base_url=base, cookies={"_token": token}, timeout=10) as client:
        assert client.get("/dp-budget/").status_code == 200
        client.get("/api/v2/auth/logout", follow_redirects=False)
    assert httpx.get(f"{base}/dp-budget/api/accounts", headers=bearer(token), timeout=10).status_code == 401
    assert httpx.get(f"{base}/dp-budget/", cookies={"_token": token}, timeout=10).status_code == 401


@pytest.mark.integration
def test_real_server_another_site_cannot_frame_the_dashboard(airflow_server, chromium):
    """Clickjacking: a page on another origin framing /dp-budget/ gets nothing (frame-ancestors 'self', and the
    SameSite=Lax cookie is not sent to a cross-site frame)."""
    context = chromium.new_context()
    try:
        _sign_in(context, airflow_server, "auditor")
        tab = context.new_page()
        attacker = "http://attacker.invalid/"
        tab.route(attacker, lambda route: route.fulfill(
            status=200, content_type="text/html",
            body=f'<iframe id="x" src="{airflow_server.base}/dp-budget/" width="900" height="600"></iframe>'))
        responses = []
        tab.on("response", lambda r: responses.append((r.url, r.status)) if "/dp-budget/" in r.url else None)
        tab.goto(attacker)
        tab.wait_for_timeout(2000)
        framed = [f for f in tab.frames if f.url.startswith(airflow_server.base)]
        shown = [f.evaluate("() => document.body ? document.body.innerText : ''") for f in framed]
        assert not any("census" in text for text in shown), (responses, shown)
    finally:
        context.close()


@pytest.mark.integration
def test_real_server_unknown_query_parameters_stall_the_worker(airflow_server):
    """Was a hole (see test_unknown_query_parameters_cost_a_viewer_no_more_than_a_second), on the real server: uvicorn
    accepts the 60 KB query string, and while the dashboard parses it the api-server's only worker does not answer
    its own health check (measured: 7.1 s for the request, 6.7 s for the health check sent meanwhile). Airflow's own
    routes share the FastAPI code: the same query on ``/api/v2/dags`` took 178 s, so a cap in the dashboard alone
    does not protect the server; the fix belongs in FastAPI (or a query-size limit in front of Airflow)."""
    import http.client

    token = _api_token(airflow_server, "auditor")
    host, port = urlsplit(airflow_server.base).netloc.split(":")
    junk = JUNK_PARAMETERS

    def timed_get(path: str) -> tuple[int, float]:
        connection = http.client.HTTPConnection(host, int(port), timeout=300)
        started = time.perf_counter()
        connection.request("GET", path, headers=bearer(token))
        status = connection.getresponse().status
        connection.close()
        return status, time.perf_counter() - started

    health: list[float] = []
    attack = threading.Thread(target=lambda: health.append(timed_get(f"{PREFIX}/api/accounts/census/charges?{junk}")))
    attack.start()
    time.sleep(0.5)
    health_status, health_seconds = timed_get("/api/v2/monitor/health")
    attack.join(300)
    (status, seconds), = health
    print(f"dashboard: {status} in {seconds:.1f} s; health check meanwhile: {health_status} in {health_seconds:.1f} s")
    assert seconds < 2.0 and health_seconds < 2.0, (seconds, health_seconds)
