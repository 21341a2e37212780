"""Who gets into the budget dashboard: only authenticated Airflow users with UI access, with real Airflow JWTs
from the simple auth manager (``dashboard_auth.mint``); everyone else gets 401 or 403 and the ledger is never
opened. No redirect leaves the dashboard. (The 401 page and its login link: ``test_pages.py``; the same inside a
real api-server: ``test_served_by_airflow.py``.)"""

from __future__ import annotations

import html
import re
import time
import uuid
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
from fastapi.testclient import TestClient

from dashboard_apps import PREFIX, dashboard, mount
from dashboard_auth import JWT_SECRET, bearer, mint
from ledger_backends import SQLITE_FAST

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
@SQLITE_FAST  # the ledger is never opened
def test_anonymous_gets_401_on_every_route_and_never_reaches_the_ledger(hostile, auth_manager, path):
    """Every route answers 401 (or a bare 404) to every missing or bad credential, without opening the ledger."""
    # one ledger per path, every kind of missing or bad credential against it (the ledger is never opened)
    for how, headers in ANONYMOUS_CREDENTIALS.items():
        opened: list = []
        app = mount(dashboard(hostile, opened=opened, own_audit_check=True))
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
    """A user without an Airflow role gets 403 on pages, API and assets, and the ledger is never opened."""
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
    """A task's Execution API JWT (same secret, other audience) or an unsigned JWT never opens the dashboard."""
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
    """Unknown paths and FastAPI's generated docs answer a redirect, 401 or 404 that names nothing."""
    headers = bearer(token) if authenticated else {}
    with TestClient(mount(dashboard(hostile)), headers=headers, raise_server_exceptions=False) as client:
        for path in ("/nothing", "/api", "/api/", "/api/nothing", "/openapi.json", "/docs", "/redoc",
                     "/static/", "/static"):
            response = client.get(PREFIX + path, follow_redirects=False)
            assert response.status_code in (307, 401, 404), (path, response.status_code)
            assert "census" not in response.text and "openapi" not in response.text.lower(), path


@pytest.mark.parametrize("path", [
    "/api/accounts/", "/api/audit-chain/", "/api/releases/1/", "/static/dashboard.js/", "//evil.example/",
    "/%2F%2Fevil.example/", "/\\evil.example/", "/accounts/census/", "/runs/d/r1/", "/api/runs/d/r1/",
    "/api/accounts/census/charges/",
])
@pytest.mark.parametrize("authenticated", [False, True])
@SQLITE_FAST  # redirects come from the routes, whatever the database
def test_no_redirect_leaves_the_dashboard(hostile, token, path, authenticated):
    """Every redirect the dashboard answers stays on this server, under the mount."""
    headers = bearer(token) if authenticated else {}
    with TestClient(mount(dashboard(hostile)), headers=headers, raise_server_exceptions=False) as client:
        response = client.get(PREFIX + path, follow_redirects=False)
    if response.is_redirect:
        location = urlsplit(response.headers["location"])
        assert location.netloc in ("", "testserver"), (path, response.headers["location"])
        assert location.path.startswith(f"{PREFIX}/") and not location.path.startswith("//"), (
            path, response.headers["location"])
