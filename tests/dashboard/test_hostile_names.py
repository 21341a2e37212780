"""Names and values a DAG author controls (``hostile_names``) are data on every page: no markup, no script, no
link of theirs, no path that reaches another route, no SQL; charts draw them as text, in Chromium too."""

from __future__ import annotations

import json
import threading
import time
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from dashboard_apps import PLOTLY_DRAWN, PREFIX, dashboard, integration_support, mount
from dashboard_auth import bearer
from hostile_names import (
    HOSTILE_ACCOUNT,
    HOSTILE_AGGREGATE,
    HOSTILE_DAG,
    HOSTILE_KEYS,
    HOSTILE_RELEASE,
    HOSTILE_RUN,
    HOSTILE_TASK,
    hostile_pages,
    hostile_release_id,
    run_path,
)
from ledger_backends import SQLITE_FAST
from test_pages import Element, parse

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
    """No page holds an element, attribute, script or link that a hostile name or value put there."""
    with TestClient(mount(dashboard(hostile)), headers=bearer(token)) as client:
        for path in hostile_pages(hostile):
            response = client.get(PREFIX + path)
            assert response.status_code in (200, 404, 422), (path, response.status_code)
            assert response.headers["content-type"].startswith("text/html")
            assert_inert(parse(response.text), response.text, path)


def test_hostile_strings_are_shown_as_written(hostile, token):
    """Escaping does not mangle: the names read as the DAG author wrote them."""
    release = hostile_release_id(hostile)
    with TestClient(dashboard(hostile), headers=bearer(token)) as client:
        page = parse(client.get(f"/releases/{release}").text)
        fields = page.one("section", id="release")
        assert fields.one("td", data_field="dag_id").text() == HOSTILE_DAG
        assert fields.one("td", data_field="run_id").text() == HOSTILE_RUN
        assert fields.one("td", data_field="task_id").text() == HOSTILE_TASK
        assert fields.one("td", data_field="release_name").text() == HOSTILE_RELEASE
        assert [td.text() for td in page.all("td", data_field="key")] == HOSTILE_KEYS
        assert page.all("section", class_="aggregate")[0].one("h2").text() == HOSTILE_AGGREGATE
        # the charge's split names the aggregate as written too
        assert page.one("section", id="charge-split").one("td", data_field="aggregate").text() == HOSTILE_AGGREGATE


def test_the_json_api_answers_json_never_html(hostile, token):
    """The JSON API answers application/json to hostile names, never HTML."""
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
    """Every page's CSP forbids inline scripts, plugins, base changes and framing by other origins."""
    with TestClient(dashboard(hostile), headers=bearer(token)) as client:
        for path in ("/", "/accounts/census", "/accounts/nope", "/accounts/census?limit=0",
                     f"/releases/{hostile_release_id(hostile)}"):
            policy = client.get(path).headers["content-security-policy"]
            directives = dict((d.strip().split(" ", 1) + [""])[:2] for d in policy.split(";") if d.strip())
            assert directives["script-src"] == "'self'", path
            assert directives["object-src"] == "'none'" and directives["base-uri"] == "'none'", path
            assert directives["frame-ancestors"] == "'self'", path


@pytest.mark.parametrize("name", [
    "..%2Fpages.py", "..%2F..%2F..%2Fpyproject.toml", "%2e%2e%2fapp.py", "..%5Capp.py", "dashboard.js%00.png",
    "dashboard.js%2500", "DASHBOARD.JS", "dashboard.js.", "dashboard.js%20", "..", ".", "%2e%2e",
    "static%2Fdashboard.js", "__init__.py", "..%252Fapp.py", "dashboard.css%3F", "plotly.min.js%23",
])
@SQLITE_FAST  # static files, never the ledger
def test_the_static_route_serves_its_three_assets_only(hostile, token, name):
    """Encoded dot segments, NULs, case and suffix tricks never reach a file beyond the three static assets."""
    with TestClient(mount(dashboard(hostile)), headers=bearer(token)) as client:
        response = client.get(f"{PREFIX}/static/{name}", follow_redirects=False)
    assert response.status_code in (404, 307), (name, response.status_code)
    if response.status_code == 404:
        assert response.headers["content-type"].startswith(("text/plain", "application/json")), name
        assert b"import" not in response.content and b"[project]" not in response.content


def test_dot_segments_in_names_stay_names(hostile, token):
    """``..`` in an account, DAG or run name is data: it never reaches another route."""
    with TestClient(mount(dashboard(hostile)), headers=bearer(token)) as client:
        for path, status in [("/accounts/..%2F..%2Fapi%2Faccounts", 404), ("/accounts/%2E%2E%2Fapi%2Faccounts", 404),
                             ("/api/accounts/..%2Fcensus", 404), ("/runs/d/..%2F..%2Faccounts%2Fcensus", 200)]:
            response = client.get(PREFIX + path, follow_redirects=False)
            assert response.status_code == status, (path, response.status_code)
            assert response.headers["content-type"].startswith(("text/html", "application/json")), path


INJECTIONS = ["' OR '1'='1", "d' --", "d'; DROP TABLE dp_charges; --", "%", "_", "d%", "\\", "1) OR (1=1",
              "census' UNION SELECT * FROM dp_budget_accounts --", "d\"", "$1", ":account"]


@pytest.mark.parametrize("injection", INJECTIONS)
def test_filters_and_names_are_values_never_sql(hostile, token, injection):
    """SQL syntax in a filter or a name is a value: it matches nothing and drops nothing."""
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


@pytest.fixture
def served(hostile):
    """The dashboard over the hostile ledger, mounted at /dp-budget and served by uvicorn in a thread."""
    import uvicorn

    integration_support()
    from airflow_services import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(mount(dashboard(hostile)), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # bounds a hang only
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


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
    """In Chromium, with charts drawn and hovered, no hostile string runs a script or injects an element."""
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
