"""The dashboard inside a real ``airflow api-server`` (one worker, SimpleAuthManager: ``admin`` and the viewer
``auditor``), driven with httpx and Debian's Chromium: logins, logouts, framing and oversized queries."""

from __future__ import annotations

import re
import threading
from urllib.parse import urlsplit

import pytest

from dashboard_apps import JUNK_PARAMETERS, PLOTLY_DRAWN, PREFIX, integration_support, reserve
from dashboard_auth import bearer
from hostile_names import HOSTILE_DAG, HOSTILE_MECHANISMS, HOSTILE_OUTPUT, HOSTILE_RELEASE, HOSTILE_RUN, HOSTILE_TASK
from ledger_backends import account_config, ledger_with

@pytest.fixture(scope="module")
def airflow_server(tmp_path_factory):
    """``airflow api-server`` (one worker, SimpleAuthManager: ``admin`` and the viewer ``auditor``) serving the
    dashboard over a SQLite ledger with hostile names (``dashboard_browser_support.DashboardServer``)."""
    support = integration_support()
    url = f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.db'}"
    ledger = ledger_with(url, census=account_config("pure_dp", epsilon="10", dags=("d", HOSTILE_DAG)))
    ledger.commit(reserve(ledger, "census", "r1"), {"run": "r1"})
    ledger.commit(reserve(ledger, "census", HOSTILE_RUN, dag=HOSTILE_DAG, task=HOSTILE_TASK,
                          release=HOSTILE_RELEASE, mechanisms=HOSTILE_MECHANISMS), HOSTILE_OUTPUT)
    with support.DashboardServer.running(tmp_path_factory.mktemp("airflow_home"), url) as server:
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
def test_the_login_cookie_opens_the_dashboard_in_airflows_iframe(airflow_server, chromium):
    """The UI's ``_token`` cookie opens /dp-budget in Airflow's iframe; charts draw under the CSP and the sandbox."""
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
def test_a_logged_out_token_no_longer_opens_the_dashboard(airflow_server):
    """A token revoked by Airflow's logout no longer opens the dashboard, by header or by cookie."""
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
def test_another_site_cannot_frame_the_dashboard(airflow_server, chromium):
    """A page on another origin framing /dp-budget/ shows nothing of the ledger (frame-ancestors, SameSite=Lax)."""
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
        # the load event waits for the frame's own load (or its refusal): no fixed wait needed
        tab.goto(attacker, wait_until="load", timeout=120_000)
        framed = [f for f in tab.frames if f.url.startswith(airflow_server.base)]
        shown = [f.evaluate("() => document.body ? document.body.innerText : ''") for f in framed]
        assert not any("census" in text for text in shown), (responses, shown)
    finally:
        context.close()


@pytest.mark.integration
def test_a_junk_query_is_refused_while_the_api_server_answers_its_health_check(airflow_server):
    """A 60 KB query of unknown parameters gets 414, and the api-server answers its health check meanwhile."""
    # The dashboard's limit protects its own routes only: Airflow's routes share FastAPI's quadratic parse of unknown
    # parameters, so a query-size limit in front of Airflow is still the deployment's to set.
    import http.client

    token = _api_token(airflow_server, "auditor")
    host, port = urlsplit(airflow_server.base).netloc.split(":")

    def get(path: str) -> int:
        connection = http.client.HTTPConnection(host, int(port), timeout=120)  # bounds a hang only
        connection.request("GET", path, headers=bearer(token))
        status = connection.getresponse().status
        connection.close()
        return status

    answers: list[int] = []
    attack = threading.Thread(target=lambda: answers.append(get(f"{PREFIX}/api/accounts/census/charges?"
                                                                f"{JUNK_PARAMETERS}")))
    attack.start()
    health_status = get("/api/v2/monitor/health")
    attack.join(120)
    assert answers == [414] and health_status == 200, (answers, health_status)
