"""The budget dashboard in a real browser: Debian's Chromium, headless, driven by Playwright
against a running ``airflow api-server`` that loads the dashboard plugin the way an installed provider does.

One api-server per module (SQLite metadata database, SimpleAuthManager with a passwords file, the ledger connection
as ``AIRFLOW_CONN_DP_LEDGER_DEFAULT``), over a SQLite ledger of real releases on UCI Adult and the PUMS extract
(``dashboard_browser_support.build_ledger``). A user signs in on Airflow's login page; the test finds the plugin's
entry in Airflow's Browse menu and opens it, then opens the overview, an account page, a release page and a DAG
run's page, waits for the plotly charts to be drawn, and checks every number shown against the ledger read with
the Python API (``Ledger.account(...).summary()``, ``Ledger.charges``, ``Ledger.stored_output``): the exact value
in ``data-exact`` and the 6-significant-digit text. A browser without Airflow's cookie gets 401. Full-page
screenshots go to ``screenshots/`` at the repository root (git-ignored, overwritten by every run).

Without Playwright or ``/usr/bin/chromium`` the module is skipped, except under ``CI``, where it fails.
"""

from __future__ import annotations

import json
import os
import re
from fractions import Fraction
from pathlib import Path
from urllib.parse import quote

import pytest

from dp_operators.ledger import ReleaseKey
from dp_operators.release.publish import published_interval

from dashboard_browser_support import (
    CENSUS_DAG, CENSUS_RUNS, CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, USERS, VIEWPORT, DashboardServer, build_ledger,
    require_browser,
)

pytestmark = pytest.mark.integration

#: A plotly chart is drawn once its root ``svg.main-svg`` exists inside the chart's div.
DRAWN = "svg.main-svg"
TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def browser_ready():
    require_browser()


@pytest.fixture(scope="module")
def ledger(browser_ready, tmp_path_factory, adult_aggregates, adult_csv):
    return build_ledger(tmp_path_factory.mktemp("dashboard_ledger") / "ledger.db", adult_aggregates, adult_csv)


#: A third user (ADR 0035): an Airflow viewer whom the auth manager lets read only the census DAG.
ANALYST, ANALYST_PASSWORD = "census_analyst", "analyst-password"
#: DAG grants of ``dashboard_auth.PerDagAuthManager``: the admin and the auditor may read every DAG (privacy
#: officers), the analyst only the census DAG.
GRANTS = {"admin": "*", "auditor": "*", ANALYST: [CENSUS_DAG]}


@pytest.fixture(scope="module")
def server(ledger, tmp_path_factory):
    """The api-server with ``dashboard_auth.PerDagAuthManager`` (the simple auth manager with per-user DAG grants,
    :data:`GRANTS`) and the analyst as a third user."""
    import dashboard_browser_support
    from dashboard_auth import GRANTS_VARIABLE, PER_DAG_AUTH_MANAGER

    plain_env = dashboard_browser_support.airflow_env

    def per_dag_env(home, ledger_url, port):
        env = plain_env(home, ledger_url, port)
        passwords = json.loads((home / "passwords.json").read_text())
        (home / "passwords.json").write_text(json.dumps({**passwords, ANALYST: ANALYST_PASSWORD}))
        tests = str(Path(__file__).resolve().parents[1])
        return {**env, "AIRFLOW__CORE__AUTH_MANAGER": PER_DAG_AUTH_MANAGER, GRANTS_VARIABLE: json.dumps(GRANTS),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS":
                    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] + f",{ANALYST}:viewer",
                "PYTHONPATH": os.pathsep.join(filter(None, [tests, env.get("PYTHONPATH")]))}

    patch = pytest.MonkeyPatch()
    patch.setattr(dashboard_browser_support, "airflow_env", per_dag_env)
    try:
        with DashboardServer.running(tmp_path_factory.mktemp("airflow_dashboard"), ledger.url) as server:
            yield server
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def browser(browser_ready):
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        # the system's Chromium: Playwright must never download a browser (CI may have no internet)
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def admin(browser, server):
    """A browser context signed in to Airflow as ``admin`` through the login page."""
    context = browser.new_context(viewport=VIEWPORT, base_url=server.base)
    context.set_default_timeout(TIMEOUT_MS)
    sign_in(context.new_page(), server, "admin")
    yield context
    context.close()


@pytest.fixture(autouse=True)
def server_log_on_failure(request, server):
    """After a failed test, print the api-server's log tail (the server's side of the failure) past pytest's
    output capture: the call's report is already made when this teardown runs."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
            print(f"\n{request.node.nodeid} failed\n{server.tail(120)}")


@pytest.fixture
def page(admin):
    """A new tab of the signed-in context; records every request it makes and every script error."""
    tab = admin.new_page()
    tab.requested, tab.script_errors = [], []
    tab.on("request", lambda r: tab.requested.append(r.url))
    tab.on("pageerror", lambda error: tab.script_errors.append(str(error)))
    yield tab
    tab.close()


def sign_in(tab, server: DashboardServer, user: str) -> None:
    """Sign in on Airflow's login page as a user does: open Airflow, get sent to the login form, fill it in."""
    password = ANALYST_PASSWORD if user == ANALYST else USERS[user][1]
    tab.goto("/")
    tab.wait_for_url(re.compile(r"/auth/login"))
    tab.get_by_label("Username").fill(user)
    tab.get_by_label("Password").fill(password)
    tab.get_by_role("button", name="Sign in").click()
    tab.wait_for_url(f"{server.base}/")
    cookies = {cookie["name"] for cookie in tab.context.cookies()}
    assert "_token" in cookies, f"no Airflow token cookie after signing in as {user}: {cookies}"
    tab.close()


def open_page(tab, path: str, server: DashboardServer, *, charts: list[str]) -> None:
    """Open a dashboard page, wait for the listed chart divs to be drawn, and check it loaded nothing from
    elsewhere (plotly.js is served by the dashboard itself) and raised no script error."""
    response = tab.goto(path)
    assert response.status == 200, f"GET {path}: {response.status}\n{response.text()[:2000]}"
    for chart in charts:
        tab.locator(f"{chart} {DRAWN}").first.wait_for(state="visible")
    assert tab.script_errors == [], f"{path}: script errors {tab.script_errors}"
    foreign = [url for url in tab.requested if not url.startswith(server.base)]
    assert foreign == [], f"{path} loaded resources from elsewhere: {foreign}"
    if charts:
        assert any(url.startswith(f"{server.base}/dp-budget/static/plotly.min.js") for url in tab.requested)


def screenshot(tab, name: str, focus: str | None = None) -> None:
    """The whole page, and one screen of it (from the element ``focus`` if given): docs/images/
    holds copies of the ``-small`` ones."""
    tab.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    if focus is not None:
        tab.locator(focus).first.scroll_into_view_if_needed()
    tab.screenshot(path=str(SCREENSHOTS / f"{name}-small.png"), scale="css")


def shown(value) -> str:
    """What a page shows for a number: ``-`` for None, an int as it is, anything else (an exact fraction
    string or a float) to 6 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{float(Fraction(value)) if isinstance(value, str) else value:.6g}"


def exact(value) -> str:
    """The ``data-exact`` of a value: a string as it is, a number as JSON writes it, empty for None."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def assert_cells(scope, expected: dict) -> None:
    """Each ``[data-field=<name>]`` cell in ``scope`` carries the exact value and shows its text."""
    for field, (value_exact, value_text) in expected.items():
        cell = scope.locator(f"[data-field='{field}']")
        assert cell.count() == 1, f"{field}: {cell.count()} cells in {scope}"
        assert (cell.get_attribute("data-exact"), cell.inner_text().strip()) == (value_exact, value_text), (
            f"{field} in {scope}")


def account_cells(summary: dict) -> dict:
    """The cells the overview and the account page show for an account, from ``AccountStatus.summary()``."""
    cells = {field: (exact(summary[field]), shown(summary[field]))
             for field in ("cap", "spent", "reserved", "remaining", "spent_epsilon", "cap_epsilon", "delta")}
    cells["unit"] = (summary["unit"], summary["unit"])
    return cells


def census_key(run_id: str) -> ReleaseKey:
    return ReleaseKey(CENSUS_DAG, run_id, "release", -1, "adult_census_statistics")


def test_airflow_lists_the_dashboard_in_its_browse_menu(page, server):
    plugins = page.request.get("/api/v2/plugins")
    assert plugins.status == 200, plugins.text()
    [plugin] = [p for p in plugins.json()["plugins"] if p["name"] == "dp_budget_dashboard"]
    views = {view["destination"]: view for view in plugin["external_views"]}
    assert {k: views["nav"][k] for k in ("name", "href", "url_route", "category")} == {
        "name": "Privacy budget", "href": "/dp-budget/", "url_route": "dp-budget", "category": "browse"}
    assert views["dag_run"]["href"] == "/dp-budget/runs/{DAG_ID}/{RUN_ID}"

    page.goto("/")
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Privacy budget").click()
    page.wait_for_url(f"{server.base}/plugin/dp-budget")
    frame = page.frame_locator("iframe")
    frame.locator("table#accounts tr[data-account]").first.wait_for()
    frame.locator(f"#overview-chart {DRAWN}").first.wait_for()
    screenshot(page, "airflow-nav")


def test_overview_shows_every_account_as_the_ledger_has_it(page, server, ledger):
    open_page(page, "/dp-budget/", server, charts=["#overview-chart"])
    accounts = ledger.reader().accounts()
    rows = page.locator("table#accounts tr[data-account]")
    assert [rows.nth(i).get_attribute("data-account") for i in range(rows.count())] == [a.name for a in accounts]
    for account in accounts:
        assert_cells(page.locator(f"table#accounts tr[data-account='{account.name}']"),
                     account_cells(account.summary()))
    screenshot(page, "overview")


def test_account_page_shows_summary_burn_down_audit_and_charges(page, server, ledger):
    reader = ledger.reader()
    account = reader.account("census_adult")
    open_page(page, "/dp-budget/accounts/census_adult", server, charts=["#burn-down"])
    assert_cells(page.locator("#summary"), account_cells(account.summary()))

    # the chart's series end at the ledger's settled spend (committed and abandoned: spent less what is in
    # flight) and at the cap (plotly keeps each trace's data on the chart's div)
    plotted = page.evaluate("() => document.getElementById('burn-down').data.map(t => (t.y || []).slice(-1)[0])")
    for total in (account.spent - account.reserved, account.cap):
        assert any(y == pytest.approx(float(total), rel=1e-9) for y in plotted), (float(total), plotted)
    assert page.locator("#forecast").inner_text().strip()

    # the audit check runs in the background: the first page may say pending; a reload shows its result
    for _ in range(20):
        state = page.locator("#audit-chain").get_attribute("data-state")
        if state != "pending":
            break
        page.wait_for_timeout(500)
        page.reload()
    assert state == "ok", page.locator("#audit-chain").inner_text()

    charges = list(reader.charges(account="census_adult"))
    assert page.locator("#charges-total").inner_text().strip() == str(len(charges))
    rows = page.locator("table#charges tr[data-charge-id]")
    assert [int(rows.nth(i).get_attribute("data-charge-id")) for i in range(rows.count())] == [
        c["id"] for c in charges]
    assert [c["state"] for c in charges] == ["committed"] * 3 + ["abandoned", "reserved"]
    for charge in charges:
        row = page.locator(f"table#charges tr[data-charge-id='{charge['id']}']")
        assert_cells(row, {
            **{field: (charge[field], charge[field]) for field in ("dag_id", "run_id", "task_id", "release_name",
                                                                   "state")},
            "amount": (charge["amount"], shown(charge["amount"])),
        })
        assert row.locator("[data-field='mechanisms']").inner_text().strip() == \
            "discrete_gaussian, discrete_laplace, exponential"  # the example's median: the exponential mechanism
    assert page.locator("#next-page").count() == 0
    # the charges' header names the accountant's unit; the refused attempts have their section
    unit = {"mu_squared": "mu^2"}.get(account.unit, account.unit)
    assert f"Charge ({unit})" in page.locator("table#charges thead").inner_text()
    assert page.locator("#refusals").count() == 1
    screenshot(page, "account", focus="#burn-down")


def test_account_page_filters_and_pages_charges(page, server, ledger):
    charges = list(ledger.reader().charges(account="census_adult"))

    def shown_ids() -> list[int]:
        rows = page.locator("table#charges tr[data-charge-id]")
        return [int(rows.nth(i).get_attribute("data-charge-id")) for i in range(rows.count())]

    open_page(page, "/dp-budget/accounts/census_adult?state=committed", server, charts=[])
    assert shown_ids() == [c["id"] for c in charges if c["state"] == "committed"]
    assert page.locator("#charges-total").inner_text().strip() == "3"

    open_page(page, "/dp-budget/accounts/census_adult?limit=2", server, charts=[])
    pages = [shown_ids()]
    while page.locator("#next-page").count():
        page.locator("#next-page").click()
        page.wait_for_load_state()
        pages.append(shown_ids())
    assert pages == [[c["id"] for c in charges[i:i + 2]] for i in range(0, len(charges), 2)]


def test_release_page_shows_the_published_values(page, server, ledger):
    charge_id = ledger.census_releases[0]
    output = ledger.reader().stored_output(census_key(CENSUS_RUNS[0]))
    aggregates = output["aggregates"]
    open_page(page, f"/dp-budget/releases/{charge_id}", server, charts=[".release-chart"])
    charts = page.locator(".release-chart")
    assert charts.count() == len(aggregates)
    for i in range(charts.count()):
        charts.nth(i).locator(DRAWN).first.wait_for()
    sections = page.locator("section.aggregate")
    assert [sections.nth(i).locator("h2").inner_text() for i in range(sections.count())] == list(aggregates)
    for i, aggregate in enumerate(aggregates.values()):
        published = aggregate.get("rows") or [aggregate]
        rows = sections.nth(i).locator("table.published-values tbody tr")
        assert rows.count() == len(published)
        for j, row in enumerate(published):
            cells = rows.nth(j)
            keys = cells.locator("[data-field='key']")
            assert [keys.nth(k).inner_text() for k in range(keys.count())] == [
                str(row[column]) for column in aggregate["group_by"]]
            lower, upper = published_interval(row)
            assert_cells(cells, {"value": (exact(row["value"]), shown(row["value"])),
                                 "half_width": (exact(row["half_width"]), shown(row["half_width"])),
                                 "lower": (exact(lower), shown(lower)), "upper": (exact(upper), shown(upper))})
    screenshot(page, "release", focus="#release-chart-2")


def test_dag_run_view_lists_the_runs_charges(page, server, ledger):
    run_id = CENSUS_RUNS[1]
    open_page(page, f"/dp-budget/runs/{CENSUS_DAG}/{quote(run_id, safe='')}", server, charts=[])
    rows = page.locator("table#run-charges tr[data-charge-id]")
    assert [int(rows.nth(i).get_attribute("data-charge-id")) for i in range(rows.count())] == [
        ledger.census_releases[1]]
    assert_cells(rows.first, {"run_id": (run_id, run_id), "account": ("census_adult", "census_adult")})
    screenshot(page, "run")


def test_an_airflow_viewer_sees_the_dashboard(browser, server, ledger):
    context = browser.new_context(viewport=VIEWPORT, base_url=server.base)
    try:
        sign_in(context.new_page(), server, "auditor")
        tab = context.new_page()
        assert tab.goto("/dp-budget/").status == 200
        assert tab.locator("table#accounts tr[data-account]").count() == len(ledger.reader().accounts())
    finally:
        context.close()


@pytest.mark.parametrize("path", ["/dp-budget/", "/dp-budget/accounts/census_adult", "/dp-budget/releases/1",
                                  "/dp-budget/runs/adult_census_release/x", "/dp-budget/api/accounts"])
def test_a_browser_without_airflow_sign_in_gets_401(browser, server, path):
    context = browser.new_context(viewport=VIEWPORT, base_url=server.base)
    try:
        response = context.new_page().goto(path)
        assert response.status == 401, f"{path}: {response.status}"
        assert "adult_demographics" not in response.text()  # nothing of the ledger
    finally:
        context.close()


def test_two_users_see_what_their_dags_allow(browser, server, ledger):
    """ADR 0035 in the browser: the admin (a privacy officer) and the census analyst, each signed in through
    Airflow's login page. The analyst sees only the census account, its releases and runs; the PUMS and
    demographics accounts, a PUMS release and a PUMS run answer 404 to it, by page and by API, as unknown ones do."""
    reader = ledger.reader()
    pums_release = next(c["id"] for c in reader.charges(account="pums_income"))
    census_release = ledger.census_releases[0]
    hidden = ("/dp-budget/accounts/pums_income", "/dp-budget/accounts/adult_demographics",
              f"/dp-budget/releases/{pums_release}", "/dp-budget/runs/pums_income_release/2026-01-31",
              "/dp-budget/api/accounts/pums_income", f"/dp-budget/api/releases/{pums_release}",
              "/dp-budget/api/runs/pums_income_release/2026-01-31")
    shown = ("/dp-budget/accounts/census_adult", f"/dp-budget/releases/{census_release}",
             f"/dp-budget/runs/{CENSUS_DAG}/{quote(CENSUS_RUNS[0], safe='')}")
    pages = {}
    for user in ("admin", ANALYST):
        context = browser.new_context(viewport=VIEWPORT, base_url=server.base)
        context.set_default_timeout(TIMEOUT_MS)
        try:
            sign_in(context.new_page(), server, user)
            tab = context.new_page()
            assert tab.goto("/dp-budget/").status == 200
            rows = tab.locator("table#accounts tr[data-account]")
            listed = [rows.nth(i).get_attribute("data-account") for i in range(rows.count())]
            answers = {path: tab.goto(path).status for path in (*hidden, *shown)}
            api = tab.goto("/dp-budget/api/accounts")
            pages[user] = {"listed": listed, "answers": answers,
                           "api": sorted(row["name"] for row in json.loads(api.text()))}
            if user == ANALYST:
                tab.goto("/dp-budget/accounts/census_adult")
                assert tab.locator("#restricted-note").count() == 1
                screenshot(tab, "account-restricted")
        finally:
            context.close()
    everything = sorted(account.name for account in reader.accounts())
    assert sorted(pages["admin"]["listed"]) == everything == pages["admin"]["api"]
    assert pages["admin"]["answers"] == dict.fromkeys(pages["admin"]["answers"], 200)
    assert pages[ANALYST]["listed"] == ["census_adult"] == pages[ANALYST]["api"]
    assert pages[ANALYST]["answers"] == {**dict.fromkeys(hidden, 404), **dict.fromkeys(shown, 200)}
