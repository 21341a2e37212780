"""The dashboard's HTML pages (dp_operators/dashboard/pages.py) on real ledgers, SQLite and PostgreSQL: the numbers
in the pages' data-field/data-exact cells are the queries' JSON and the ledger's exact values; filters and keyset
paging; 404 and 422 pages; names full of HTML, quotes and URL syntax escaped in the HTML and in the embedded chart
JSON, with links that still resolve; plotly.js served from the plotly package; links under Airflow's /dp-budget
mount. Requests carry real Airflow JWTs (``dashboard_auth.mint``, the ``auth_manager`` fixture of conftest.py).
"""

from __future__ import annotations

import datetime as dt
import functools
import html
import json
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from html.parser import HTMLParser
from urllib.parse import parse_qs, quote, urlsplit

import markupsafe
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.dashboard import charts, pages, queries
from dp_operators.ledger import ReleaseKey
from dashboard_apps import PREFIX, AuditStandIn, dashboard
from dashboard_auth import bearer, mint
from dashboard_data import BAD_CHARGE_FILTERS
from ledger_backends import account_config, ledger_with

# Names with markup, quotes and URL syntax. No "%" followed by two hex digits: Starlette's TestClient decodes the
# path twice (https://github.com/Kludex/starlette/issues/2587), which a real server does not.
WEIRD_ACCOUNT = "acct <script>alert(\"a\")</script> 'q' + : / % 50% é ✓ ?x=1#top"
# Airflow's DAG ids cannot hold "/" (airflow.utils.helpers.KEY_REGEX): the run route takes the DAG id as one segment
WEIRD_DAG = "dag <b>\"x\" ' + : % é ?#"
WEIRD_RUN = "manual__2025-01-01T00:00:00+00:00 </script><script>alert(1)</script> / % 20 é ✓ \"q\" ?a=b#c"
WEIRD_AGGREGATE = "by </script><b>kind</b> & co"

MECHANISMS = [{"mechanism": "discrete_laplace", "scale": 10.0}, {"mechanism": "discrete_gaussian", "sigma": 3.0}]
MANY = 250  # more than pages.MAX_SHOWN_VALUES
OUTPUT = {
    "release": "r",
    "confidence": 0.95,
    "aggregates": {
        "by_sex": {
            "kind": "count", "mechanism": "discrete_laplace", "group_by": ["sex"],
            "rows": [{"sex": "F", "value": 10, "half_width": 3.0}, {"sex": "M", "value": 12, "half_width": 2.5}],
        },
        "capped": {
            "kind": "sum", "mechanism": "discrete_laplace", "group_by": ["k"],
            "rows": [{"k": "a", "value": 100, "half_width": None, "saturated": True, "interval": [90.0, None]}],
        },
        "large": {
            "kind": "count", "mechanism": "discrete_laplace", "group_by": ["k"],
            "rows_file": {"uri": "file:///x~rows/abc.parquet", "sha256": "ab" * 32, "rows": 10**6,
                          "format": "parquet"},
        },
        "many": {
            "kind": "count", "mechanism": "discrete_laplace", "group_by": ["k"],
            "rows": [{"k": f"k{i:03d}", "value": i, "half_width": 1.5} for i in range(MANY)],
        },
    },
}
WEIRD_OUTPUT = {
    "release": "w",
    "confidence": 0.9,
    "aggregates": {
        WEIRD_AGGREGATE: {
            "kind": "count", "mechanism": "discrete_laplace", "group_by": ["name"],
            "rows": [{"name": "</script><script>alert(2)</script>", "value": 5, "half_width": 1.0},
                     {"name": "O'Brien & \"Sons\" <3", "value": 7, "half_width": 1.0}],
        },
    },
}


# ---- a small HTML tree (the standard library's parser) --------------------------------------------------------
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter()

    def all(self, tag: str | None = None, **attrs: str) -> list[Element]:
        """Descendants (and self) with ``tag`` and attributes (``data_field=`` matches ``data-field``, ``class_=``
        the whole ``class``)."""
        wanted = {name.rstrip("_").replace("_", "-"): value for name, value in attrs.items()}
        return [e for e in self.iter() if (tag is None or e.tag == tag)
                and all(e.attrs.get(name) == value for name, value in wanted.items())]

    def one(self, tag: str | None = None, **attrs: str) -> Element:
        found = self.all(tag, **attrs)
        assert len(found) == 1, f"{len(found)} <{tag or '*'} {attrs}> elements"
        return found[0]


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack = [Element("#document", {})]

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {name: value or "" for name, value in attrs})
        self.stack[-1].children.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Element(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag):
        assert any(e.tag == tag for e in self.stack), f"</{tag}> closes nothing"
        while self.stack.pop().tag != tag:
            pass

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(text: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(text)
    builder.close()
    assert [e.tag for e in builder.stack] == ["#document"], "unclosed elements"
    return builder.stack[0]


def figure_of(document: Element, chart_id: str) -> dict:
    """The plotly figure embedded for the chart drawn in ``#chart_id``."""
    return json.loads(document.one("script", type="application/json", data_chart_for=chart_id).text())


def links(document: Element) -> list[str]:
    return [e.attrs["href"] for e in document.all("a") if "href" in e.attrs]


# ---- ledgers and clients --------------------------------------------------------------------------------------
def reserve(ledger, account: str, run: str, amount: str, *, dag: str = "d", release: str = "r"):
    return ledger.reserve(ReleaseKey(dag, run, "t", -1, release), account=account, amount=Fraction(amount),
                          mechanisms=MECHANISMS, spec_hash="0" * 64)


@pytest.fixture
def filled(ledger_url):
    """Account ``census`` (zCDP, cap 1/2): charges 1-6 committed (with OUTPUT), committed, released, abandoned,
    committed (the weird DAG and run), reserved; the weird account (pure DP, cap 3): charge 7, committed in the
    same weird run (WEIRD_OUTPUT)."""
    ledger = ledger_with(
        ledger_url,
        census=account_config("zcdp", cap="1/2", delta="1e-6", dags=("d", WEIRD_DAG)),
        **{WEIRD_ACCOUNT: account_config("pure_dp", epsilon="3", dags=(WEIRD_DAG,))},
    )
    ledger.commit(reserve(ledger, "census", "r1", "1/100"), OUTPUT)
    ledger.commit(reserve(ledger, "census", "r2", "1/50"), {"run": "r2"})
    ledger.release(reserve(ledger, "census", "r3", "1/10"))
    ledger.abandon(reserve(ledger, "census", "r4", "1/200"))
    ledger.commit(reserve(ledger, "census", WEIRD_RUN, "1/300", dag=WEIRD_DAG), {"run": "weird"})
    reserve(ledger, "census", "r6", "1/70")
    ledger.commit(reserve(ledger, WEIRD_ACCOUNT, WEIRD_RUN, "1/3", dag=WEIRD_DAG, release="w"), WEIRD_OUTPUT)
    return ledger


@pytest.fixture
def client(filled, token):
    with TestClient(dashboard(filled), headers=bearer(token)) as test_client:
        yield test_client


@pytest.fixture
def mounted(filled, token):
    """The app as Airflow's api-server mounts it (init_plugins: ``app.mount(url_prefix, subapp)``)."""
    parent = FastAPI()
    parent.mount(PREFIX, dashboard(filled))
    with TestClient(parent, headers=bearer(token)) as test_client:
        yield test_client


def get_page(client: TestClient, path: str, status: int = 200, **params) -> Element:
    response = client.get(path, params=params or None)
    assert response.status_code == status, (path, response.text[:2000])
    assert response.headers["content-type"].startswith("text/html")
    document = parse(response.text)
    assert document.one("h1").text().strip()
    assert document.one("a", id="overview-link").attrs["href"] in ("/", f"{PREFIX}/")
    return document


def charge_id(ledger, account: str, run: str) -> int:
    return next(c["id"] for c in ledger.charges(account=account) if c["run_id"] == run)


def utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value


# ---- authentication -------------------------------------------------------------------------------------------
ROUTES = ["/", "/accounts/census", "/releases/1", "/runs/d/r1", "/static/plotly.min.js", "/static/dashboard.css",
          "/static/dashboard.js", "/static/nothing.js", "/accounts/census?limit=0"]


@pytest.mark.parametrize("path", ROUTES)
def test_anonymous_requests_get_401_and_never_open_the_ledger(ledger, auth_manager, path):
    opened: list = []
    with TestClient(dashboard(ledger, opened=opened)) as anonymous:
        response = anonymous.get(path)
    assert response.status_code == 401
    assert opened == []


@pytest.mark.parametrize(
    "path, next_url",
    [
        pytest.param("/", "/", id="overview"),
        pytest.param("/accounts/a%2Fb?state=committed&limit=5", "/accounts/a%2Fb?state=committed&limit=5",
                     id="account page with filters, as sent"),
        pytest.param("/releases/1", "/releases/1", id="release"),
        pytest.param("/runs/d/r%201", "/runs/d/r%201", id="run"),
        pytest.param("/accounts//evil.example/x", "/accounts//evil.example/x", id="inner slashes stay"),
    ],
)
def test_an_anonymous_page_request_gets_a_401_page_linking_to_the_login(ledger, auth_manager, path, next_url):
    with TestClient(dashboard(ledger)) as anonymous:
        response = anonymous.get(path)
    assert response.status_code == 401 and response.headers["content-type"].startswith("text/html")
    assert response.headers["WWW-Authenticate"] == "Bearer"
    document = parse(response.text)
    assert document.one("h1").text() == "Log in to Airflow to see the privacy budget"
    login = document.one("a", id="login-link").attrs["href"]
    assert login == auth_manager.get_url_login(next_url=next_url)
    assert urlsplit(login).path == "/auth/login" and parse_qs(urlsplit(login).query)["next"] == [next_url]


def test_an_expired_session_on_a_page_gets_the_401_page_and_json_keeps_json(ledger, auth_manager):
    expired = mint(auth_manager, expiration_time_in_seconds=-60)
    with TestClient(dashboard(ledger), cookies={"_token": expired}) as client:
        page = client.get("/accounts/census")
        api = client.get("/api/accounts/census", headers={"Accept": "text/html"})
    assert page.status_code == 401 and "Log in to Airflow" in page.text
    assert api.status_code == 401 and api.headers["content-type"] == "application/json"
    assert api.headers["WWW-Authenticate"] == "Bearer" and "detail" in api.json()


def test_the_401_page_links_back_under_the_mount_and_only_to_this_server(ledger, auth_manager, monkeypatch):
    from airflow.api_fastapi import app as airflow_app

    def uninitialised():
        raise RuntimeError("Auth Manager has not been initialized yet")

    parent = FastAPI()
    parent.mount(PREFIX, dashboard(ledger))
    with TestClient(parent) as anonymous:
        mounted = parse(anonymous.get(f"{PREFIX}/accounts/census?limit=5").text)
        # the auth manager cannot say: Airflow's /auth/login, still with next
        monkeypatch.setattr(airflow_app, "get_auth_manager", uninitialised)
        fallback = parse(anonymous.get(f"{PREFIX}/accounts/census").text)
    assert parse_qs(urlsplit(mounted.one("a", id="login-link").attrs["href"]).query)["next"] == [
        f"{PREFIX}/accounts/census?limit=5"]
    assert fallback.one("a", id="login-link").attrs["href"] == "/auth/login?next=%2Fdp-budget%2Faccounts%2Fcensus"


def test_a_protocol_relative_next_is_made_a_path(ledger, auth_manager):
    """Only a path on this server: "//host" or "/\\host" in next would send the browser to another origin."""
    scope = {"type": "http", "path": "//evil.example/", "raw_path": b"/\\/evil.example/", "query_string": b"",
             "headers": [], "root_path": ""}
    next_url = parse_qs(urlsplit(pages._login_url(pages.Request(scope))).query)["next"][0]
    assert next_url == "/evil.example/"


def test_every_page_and_asset_route_carries_the_auth_dependency(ledger):
    from fastapi.routing import APIRoute

    routes = {r.path: r for r in dashboard(ledger).routes if isinstance(r, APIRoute)}
    for path in ("/", "/accounts/{name:path}", "/releases/{charge_id}", "/runs/{dag_id}/{run_id:path}",
                 "/static/{name}"):
        assert routes[path].methods == {"GET"}
        assert any(d.call is dashboard_app.require_dashboard_user for d in routes[path].dependant.dependencies)


# ---- overview -------------------------------------------------------------------------------------------------
NUMBER_FIELDS = ("cap", "spent", "reserved", "remaining", "spent_epsilon", "cap_epsilon", "delta")


def assert_account_cells(container: Element, row: dict, status) -> None:
    """The data-field cells in ``container`` hold the JSON row's values exactly, shown with 6 digits, and equal the
    ledger's exact account status."""
    for name in NUMBER_FIELDS:
        cell = container.one("td", data_field=name)
        value = row[name]
        if value is None:
            assert (cell.attrs["data-exact"], cell.text()) == ("", "-")
            continue
        exact = value if isinstance(value, str) else json.dumps(value)
        assert cell.attrs["data-exact"] == exact, name
        assert cell.text() == f"{float(Fraction(value) if isinstance(value, str) else value):.6g}", name
    assert container.one("td", data_field="unit").attrs["data-exact"] == status.unit
    for name in ("cap", "spent", "reserved", "remaining"):
        assert Fraction(container.one("td", data_field=name).attrs["data-exact"]) == getattr(status, name)
    assert float(container.one("td", data_field="spent_epsilon").attrs["data-exact"]) == status.as_epsilon(
        status.spent)


def test_overview_shows_every_account_with_the_ledger_numbers_and_bars(client, filled):
    document = get_page(client, "/")
    api = client.get("/api/accounts").json()
    table = document.one("table", id="accounts")
    assert [tr.attrs["data-account"] for tr in table.all("tr") if "data-account" in tr.attrs] == [
        row["name"] for row in api] == sorted(["census", WEIRD_ACCOUNT])
    for row in api:
        assert_account_cells(table.one("tr", data_account=row["name"]), row, filled.account(row["name"]))
    census = filled.account("census")
    assert census.reserved == Fraction(1, 70) and census.spent > census.reserved  # both bars have a length
    bars = figure_of(document, "overview-chart")["data"]
    assert [bar["orientation"] for bar in bars] == ["h", "h"]
    settled, reserved = (dict(zip(bar["y"], bar["x"])) for bar in bars)
    assert settled["census"] == float((census.spent - census.reserved) / census.cap)
    assert reserved["census"] == float(census.reserved / census.cap)


# ---- account page ---------------------------------------------------------------------------------------------
@pytest.fixture
def frozen_now(filled, monkeypatch):
    """Pages and the JSON API compute the forecast at one fixed time, ten days after the first settled charge."""
    first = min(utc(c["created_at"]) for c in filled.charges(account="census") if c["state"] != "reserved")
    now = first + dt.timedelta(days=10)
    monkeypatch.setattr(queries, "account_detail", functools.partial(queries.account_detail, now=now))
    return now


def test_account_page_summary_burn_down_forecast_and_counts(client, filled, frozen_now):
    document = get_page(client, "/accounts/census")
    detail = client.get("/api/accounts/census").json()
    assert_account_cells(document.one("section", id="summary"), detail, filled.account("census"))

    forecast = document.one("section", id="forecast")
    expected = detail["forecast"]
    assert expected["rate_per_day"] and expected["exhausts_at"]  # the fixture makes a real forecast
    for name in ("rate_per_day", "days_left"):
        cell = forecast.one(data_field=name)
        assert cell.attrs["data-exact"] == json.dumps(expected[name]) and cell.text() == f"{expected[name]:.6g}"
    assert forecast.one(data_field="exhausts_at").attrs["data-exact"] == expected["exhausts_at"]
    settled = sum(Fraction(c["amount"]) for c in filled.charges(account="census")
                  if c["state"] in queries.SETTLED_STATES)
    assert expected["rate_per_day"] == pytest.approx(float(settled) / 10, rel=1e-9)

    counts = {state: int(document.one("td", data_field=f"charge_counts.{state}").attrs["data-exact"])
              for state in (*queries.CHARGE_STATES, "total")}
    assert counts == detail["charge_counts"] == {"reserved": 1, "committed": 3, "released": 1, "abandoned": 1,
                                                 "total": 6}

    document.one("div", id="burn-down")
    figure = figure_of(document, "burn-down")
    spend, projection, cap = figure["data"]
    points = detail["burn_down"]["points"]
    assert spend["y"] == [p["cumulative"] for p in points] + [points[-1]["cumulative"]]
    assert spend["y"][-1] == pytest.approx(float(settled), rel=1e-12)
    assert spend["x"][-1] == projection["x"][0] == expected["window_end"] == frozen_now.isoformat()
    assert projection["line"]["dash"] == "dash"
    assert (projection["x"][1], projection["y"][1]) == (expected["exhausts_at"], 0.5)
    assert projection["y"][0] == pytest.approx(float(filled.account("census").spent), rel=1e-12)
    assert (cap["x"], cap["y"]) == ([points[0]["time"], expected["exhausts_at"]], [0.5, 0.5])


def test_a_short_history_gives_no_forecast_and_says_why(client, filled, monkeypatch):
    """Two charges minutes apart made the page forecast exhaustion "in 10 minutes": under a day of settled
    history the page says so in words, and the window is labelled as starting at the first settled charge."""
    first = min(utc(c["created_at"]) for c in filled.charges(account="census") if c["state"] != "reserved")
    now = first + dt.timedelta(minutes=6)
    monkeypatch.setattr(queries, "account_detail", functools.partial(queries.account_detail, now=now))
    document = get_page(client, "/accounts/census")
    forecast = document.one("section", id="forecast")
    text = " ".join(forecast.text().split())
    assert "No forecast: not enough history: settled spend spans less than 1 day" in text
    assert "a forecast needs at least 1 day of history" in text
    assert [forecast.one(data_field=f).attrs["data-exact"] for f in ("rate_per_day", "days_left", "exhausts_at")] \
        == ["", "", ""]
    assert "since the first settled charge: " in text and "the last 30 days: " not in text
    assert len(figure_of(document, "burn-down")["data"]) == 2  # spend and cap, no forecast line
    assert client.get("/api/accounts/census").json()["forecast"]["reason"].startswith("not enough history")


def test_a_full_window_is_labelled_the_last_days(client, filled, monkeypatch):
    first = min(utc(c["created_at"]) for c in filled.charges(account="census") if c["state"] != "reserved")
    monkeypatch.setattr(queries, "account_detail",
                        functools.partial(queries.account_detail, now=first + dt.timedelta(days=3), window_days=2))
    text = " ".join(get_page(client, "/accounts/census").one("section", id="forecast").text().split())
    assert "the last 2 days: " in text and "since the first settled charge: " not in text


def test_an_account_without_settled_spend_has_no_forecast(ledger_url, token):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", epsilon="1"))
    ledger.release(reserve(ledger, "a", "r1", "1/2"))
    with TestClient(dashboard(ledger), headers=bearer(token)) as test_client:
        document = get_page(test_client, "/accounts/a")
    forecast = document.one("section", id="forecast")
    assert "no rate to forecast from" in forecast.text()
    assert [forecast.one(data_field=f).attrs["data-exact"] for f in ("rate_per_day", "days_left", "exhausts_at")] \
        == ["", "", ""]
    [cap] = figure_of(document, "burn-down")["data"]  # no spend, no forecast: the cap alone
    assert cap["y"] == [1.0, 1.0] and cap["name"] == "cap 1 epsilon"


@pytest.mark.parametrize(
    "audit, shown, hidden",
    [
        pytest.param(AuditStandIn(state="pending", checked_at=None, events=0), ["is running"], ["Checked"],
                     id="pending"),
        pytest.param(AuditStandIn(), ["found no problems", "14 audit events, 7 charges and 2 accounts",
                                      "dpctl ledger verify"], [], id="ok, unauthenticated"),
        pytest.param(AuditStandIn(authenticated=True), ["found no problems"], ["dpctl ledger verify"],
                     id="ok, authenticated"),
        pytest.param(AuditStandIn(state="problems", problem_count=31,
                                  problems=["account census: seq 4: <b>broken</b> chain"] * 20),
                     ["31 problems", "the first 20", "account census: seq 4: <b>broken</b> chain"], [],
                     id="problems"),
        pytest.param(AuditStandIn(state="error", error="connection refused"), ["connection refused"], [],
                     id="error"),
        pytest.param(AuditStandIn(events=1, charges=1, accounts=1, state="problems", problem_count=1,
                                  problems=["x"]),
                     ["found 1 problem:", "1 audit event, 1 charge and 1 account read"],
                     ["1 accounts", "1 charges", "1 audit events", "1 problems"], id="singulars"),
    ],
)
def test_account_page_shows_the_audit_chain_status(filled, token, audit, shown, hidden):
    with TestClient(dashboard(filled, audit), headers=bearer(token)) as test_client:
        response = test_client.get("/accounts/census")
    section = parse(response.text).one("section", id="audit-chain")
    assert section.attrs["data-state"] == audit.result["state"]
    text = " ".join(section.text().split())
    for words in shown:
        assert words in text
    for words in hidden:
        assert words not in text
    assert "<b>broken</b>" not in response.text  # problem lines are text, escaped


@pytest.mark.parametrize(
    "audit, shown",
    [
        pytest.param(AuditStandIn(state="pending", checked_at=None), "Audit chain: the first check is running",
                     id="pending"),
        pytest.param(AuditStandIn(), "Audit chain: no problems (structural check of the whole ledger, "
                     "2025-03-01 12:00:00 UTC); details on each account's page.", id="ok"),
        pytest.param(AuditStandIn(state="problems", problem_count=1, problems=["x"]), "Audit chain: 1 problem (",
                     id="one problem"),
        pytest.param(AuditStandIn(state="error", error="connection refused"),
                     "Audit chain: the check could not read the ledger", id="error"),
    ],
)
def test_overview_shows_the_audit_chain_status_line(filled, token, audit, shown):
    with TestClient(dashboard(filled, audit), headers=bearer(token)) as test_client:
        document = get_page(test_client, "/")
        line = document.one("p", id="audit-chain-status")
        assert line.attrs["data-state"] == audit.result["state"]
        assert shown in " ".join(line.text().split())
        if audit.result["state"] != "pending":
            details = line.one("a", id="audit-chain-link").attrs["href"]
            target = parse(test_client.get(details.split("#")[0]).text)
            assert details.endswith("#audit-chain") and target.one("section", id="audit-chain")


def test_account_page_reads_the_apps_own_audit_status(filled, token):
    """Without the stand-in: the status the app checks in the background (pending until the first check ends)."""
    with TestClient(dashboard_app.create_app(lambda: filled), headers=bearer(token)) as test_client:
        section = get_page(test_client, "/accounts/census").one("section", id="audit-chain")
    assert section.attrs["data-state"] in ("pending", "ok")
    assert "dpctl ledger verify" in section.text()


def walk(client: TestClient, path: str, **params) -> tuple[list[int], list[Element]]:
    """Follow the next-page links from the first page; the charge ids in order and every page."""
    documents, ids = [], []
    url = client.get(path, params=params).url
    while True:
        documents.append(parse(client.get(str(url)).text))
        table = documents[-1].all("table", id="charges")
        ids += [int(tr.attrs["data-charge-id"]) for t in table for tr in t.all("tr") if "data-charge-id" in tr.attrs]
        nxt = documents[-1].all("a", id="next-page")
        if not nxt:
            return ids, documents
        assert len(documents) < 20
        url = nxt[0].attrs["href"]


@pytest.mark.parametrize(
    "filters",
    [
        pytest.param({}, id="no filter"),
        pytest.param({"state": "committed"}, id="state"),
        pytest.param({"dag_id": "d", "state": "committed"}, id="dag and state"),
        pytest.param({"dag_id": WEIRD_DAG}, id="weird dag"),
    ],
)
def test_charges_pages_walk_every_matching_charge_once(client, filled, filters):
    ids, documents = walk(client, "/accounts/census", limit="2", **filters)
    expected = [c["id"] for c in filled.charges(account="census", **filters)]
    assert ids == expected and len(set(ids)) == len(ids)
    assert len(documents) == max(1, -(-len(expected) // 2))
    for number, document in enumerate(documents):
        assert document.one("span", id="charges-total").text() == str(len(expected))
        first = document.all("a", id="first-page")
        assert bool(first) == (number > 0)
        for link in first + document.all("a", id="next-page"):
            query = parse_qs(urlsplit(link.attrs["href"]).query)
            assert {k: v for k, v in query.items() if k != "after"} == {
                **{k: [v] for k, v in filters.items()}, "limit": ["2"]}
        form = document.one("form", id="charge-filters")
        assert form.attrs["method"] == "get"
        assert {e.attrs["name"]: e.attrs.get("value") for e in form.all("input")}["dag_id"] == filters.get(
            "dag_id", "")


def test_charge_rows_hold_the_jsons_values(client):
    document = get_page(client, "/accounts/census", limit="500")
    rows = client.get("/api/accounts/census/charges", params={"limit": 500}).json()["charges"]
    table = document.one("table", id="charges")
    for charge in rows:
        tr = table.one("tr", data_charge_id=str(charge["id"]))
        for name in ("dag_id", "run_id", "task_id", "release_name", "state"):
            assert tr.one("td", data_field=name).text() == charge[name]
        assert tr.one("td", data_field="map_index").text() == str(charge["map_index"])
        assert tr.one("td", data_field="mechanisms").text() == ", ".join(charge["mechanisms"])
        amount = tr.one("td", data_field="amount")
        assert amount.attrs["data-exact"] == charge["amount"]
        assert amount.text() == f"{float(Fraction(charge['amount'])):.6g}"
        created = tr.one("td", data_field="created_at")
        assert created.attrs["data-exact"] == charge["created_at"]
        # to the minute in the table (the column is headed UTC); the seconds in the <time> element and its tooltip
        moment = dt.datetime.fromisoformat(charge["created_at"]).astimezone(dt.timezone.utc)
        assert created.text() == moment.strftime("%Y-%m-%d %H:%M")
        assert created.one("time").attrs == {"datetime": charge["created_at"],
                                             "title": moment.strftime("%Y-%m-%d %H:%M:%S UTC")}
        # names may wrap after their separators only, and keep their text; run ids wrap anywhere (CSS)
        for name in ("dag_id", "task_id", "release_name"):
            cell = tr.one("td", data_field=name)
            assert len(cell.all("wbr")) == sum(charge[name].count(sep) for sep in "_./:-"), name
    assert "Created (UTC)" in [th.text() for th in table.one("thead").all("th")]


def test_time_filters_and_blank_form_fields(client, filled):
    charges = list(filled.charges(account="census"))
    middle = utc(charges[2]["created_at"]).astimezone(dt.timezone(dt.timedelta(hours=5))).isoformat()
    ids, _ = walk(client, "/accounts/census", since=middle)
    assert ids == [c["id"] for c in filled.charges(account="census", since=charges[2]["created_at"])]
    before, _ = walk(client, "/accounts/census", until=middle)
    assert sorted(before + ids) == [c["id"] for c in charges]
    # the form submits every field, empty ones as "": no filter, default page size
    blank, documents = walk(client, "/accounts/census", dag_id="", state="", since="", until="", limit="")
    assert blank == [c["id"] for c in charges]
    assert documents[0].one("form", id="charge-filters").one("input", name="limit").attrs["value"] == "50"


@pytest.mark.parametrize(
    "params",
    [
        *BAD_CHARGE_FILTERS,
        pytest.param({"dag_id": "x" * 251}, id="dag_id too long"),
    ],
)
def test_invalid_filters_get_a_422_page(ledger, token, params):
    with TestClient(dashboard(ledger), headers=bearer(token)) as test_client:
        document = get_page(test_client, "/accounts/census_adult", 422, **params)
        problems = document.one("ul", class_="problems").text()
        assert any(name in problems for name in params), problems
        # the refused value, and the format the parameter takes
        if len(params) == 1:
            [(field, value)] = params.items()
            assert repr(value) in problems and pages.FILTER_FORMATS[field] in problems, problems
        # the form again with the values as given, and the way back to the account's page
        form = document.one("form", id="charge-filters")
        for name in ("dag_id", "since", "until", "limit"):
            assert form.one("input", name=name).attrs["value"] == params.get(name, ""), name
        assert document.one("a", id="account-link").attrs["href"] == "/accounts/census_adult"
        # the JSON API keeps FastAPI's JSON answer
        api = test_client.get("/api/accounts/census_adult/charges", params=params)
        assert api.status_code == 422 and api.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    "params, said",
    [
        pytest.param({"since": "last tuesday"}, "since: 'last tuesday' is not valid (Input should be a valid "
                     "datetime", id="since"),
        pytest.param({"since": "last tuesday"}, "give an ISO 8601 time such as 2025-01-31T00:00Z or a date "
                     "2025-01-31", id="since's format"),
        pytest.param({"after": "x"}, "after: 'x' is not valid", id="after"),
        pytest.param({"after": "x"}, "give the previous page's next_after id", id="after's meaning"),
        pytest.param({"limit": "501"}, "give a whole number from 1 to 500", id="limit's range"),
        pytest.param({"since": "2025-02-01", "until": "2025-01-01"}, "since (2025-02-01T00:00:00+00:00) is after "
                     "until (2025-01-01T00:00:00+00:00)", id="since after until"),
    ],
)
def test_the_422_page_says_what_was_wrong_and_the_format(ledger, token, params, said):
    with TestClient(dashboard(ledger), headers=bearer(token)) as test_client:
        document = get_page(test_client, "/accounts/census_adult", 422, **params)
    assert said in " ".join(document.one("ul", class_="problems").text().split())


def test_a_refused_account_name_gets_no_form_or_link_back(ledger, token):
    with TestClient(dashboard(ledger), headers=bearer(token)) as test_client:
        document = get_page(test_client, "/accounts/" + "n" * 201, 422)
    assert "name:" in document.one("ul", class_="problems").text()
    assert not document.all("form") and not document.all("a", id="account-link")


def test_unknown_account_release_and_bad_ids_get_error_pages(client):
    assert "no budget account 'nope'" in get_page(client, "/accounts/nope", 404).text()
    assert "no charge 999999" in get_page(client, "/releases/999999", 404).text()
    get_page(client, "/releases/seven", 422)
    get_page(client, "/releases/0", 422)


# ---- release page ---------------------------------------------------------------------------------------------
def test_release_page_draws_values_with_their_intervals(client, filled):
    release_id = charge_id(filled, "census", "r1")
    document = get_page(client, f"/releases/{release_id}")
    api = client.get(f"/api/releases/{release_id}").json()
    fields = document.one("section", id="release")
    assert fields.one("td", data_field="amount").attrs["data-exact"] == api["amount"] == "1/100"
    assert fields.one("td", data_field="output_digest").attrs["data-exact"] == api["output_digest"]
    sections = {s.one("h2").text(): s for s in document.all("section", class_="aggregate")}
    assert list(sections) == [a["name"] for a in api["aggregates"]] == list(OUTPUT["aggregates"])
    for number, aggregate in enumerate(api["aggregates"], start=1):
        section = sections[aggregate["name"]]
        if "rows_file" in aggregate:
            assert section.all("div", class_="release-chart") == []
            assert section.all("table", class_="published-values") == []
            text = section.text()
            assert all(str(aggregate["rows_file"][k]) in text for k in ("uri", "rows", "sha256"))
            continue
        values = aggregate["values"][:pages.MAX_SHOWN_VALUES]
        section.one("div", class_="release-chart", id=f"release-chart-{number}")
        figure = figure_of(section, f"release-chart-{number}")
        [trace] = figure["data"]
        # up to charts.MAX_COLUMNS values the categories are on x; "many" (200 shown) is drawn horizontally
        horizontal = len(values) > charts.MAX_COLUMNS
        assert horizontal == (aggregate["name"] == "many")
        category, value, error_axis = ("y", "x", "error_x") if horizontal else ("x", "y", "error_y")
        assert trace[category] == [" · ".join(v["key"].values()) for v in values]
        assert figure["layout"][f"{category}axis"]["title"]["text"] == " · ".join(aggregate["group_by"])
        assert trace[value] == [v["value"] for v in values]
        error = trace[error_axis]
        assert error["array"] == [None if v["upper"] is None else v["upper"] - v["value"] for v in values]
        assert error["arrayminus"] == [None if v["lower"] is None else v["value"] - v["lower"] for v in values]
        rows = section.one("table", class_="published-values").one("tbody").all("tr")
        assert len(rows) == len(values)
        assert [row.one("td", data_field="value").text() for row in rows] == [str(v["value"]) for v in values]
    by_sex = sections["by_sex"].one("tbody").all("tr")
    assert [[td.text() for td in tr.all("td")][:4] for tr in by_sex] == [["F", "10", "7", "13"],
                                                                         ["M", "12", "9.5", "14.5"]]
    capped = sections["capped"].one("tbody").one("tr")
    upper = capped.one("td", data_field="upper")
    assert (upper.text(), upper.attrs["data-exact"]) == ("-", "")
    assert "A bound shown as - is open" in sections["capped"].text()
    assert "A bound shown as - is open" not in sections["by_sex"].text()
    assert figure_of(sections["capped"], "release-chart-2")["data"][0]["marker"]["symbol"] == ["triangle-up"]
    assert f"The first {pages.MAX_SHOWN_VALUES} of {MANY} values" in sections["many"].text()
    many = figure_of(sections["many"], "release-chart-4")["layout"]
    assert many["yaxis"]["autorange"] == "reversed"  # the first value at the top, as in the table below
    assert many["height"] > charts.ROW_HEIGHT * pages.MAX_SHOWN_VALUES  # a row per value, not a squeezed strip


def release_values(count: int, group_by: tuple[str, ...] = ("education", "sex")) -> dict:
    """An aggregate of ``count`` values as release_detail gives it, keyed by ``group_by``."""
    return {"name": "people", "group_by": list(group_by), "confidence": 0.95, "values": [
        {"key": {column: f"{column}{i}" for column in group_by}, "value": float(i), "lower": i - 1.5,
         "upper": i + 1.5} for i in range(count)]}


@pytest.mark.parametrize(
    "count, horizontal",
    [pytest.param(charts.MAX_COLUMNS, False, id="12 values: columns"),
     pytest.param(charts.MAX_COLUMNS + 1, True, id="13 values: rows")],
)
def test_release_chart_labels_are_key_values_and_many_values_lie_in_rows(count, horizontal):
    figure = charts.release_figure(release_values(count))
    [trace], layout = figure["data"], figure["layout"]
    labels = [f"education{i} · sex{i}" for i in range(count)]  # no "education=": the names are the axis title
    if horizontal:
        assert (trace["y"], trace["x"]) == (labels, [float(i) for i in range(count)])
        assert "error_y" not in trace and trace["error_x"]["array"] == [1.5] * count
        assert layout["yaxis"]["title"]["text"] == "education · sex" and layout["yaxis"]["automargin"]
        taller = charts.release_figure(release_values(count + 10))["layout"]["height"]
        assert taller == layout["height"] + 10 * charts.ROW_HEIGHT
    else:
        assert (trace["x"], trace["y"]) == (labels, [float(i) for i in range(count)])
        assert "error_x" not in trace and trace["error_y"]["array"] == [1.5] * count
        assert layout["xaxis"]["title"]["text"] == "education · sex" and layout["height"] == 340


@pytest.mark.parametrize(
    "count, symbols",
    [pytest.param(3, ["triangle-up", "triangle-down", "diamond"], id="columns: up is open"),
     pytest.param(charts.MAX_COLUMNS + 3, ["triangle-right", "triangle-left", "diamond"], id="rows: right is open")],
)
def test_release_chart_markers_point_to_the_open_side(count, symbols):
    aggregate = release_values(count, group_by=("k",))
    aggregate["values"][0]["upper"] = None
    aggregate["values"][1]["lower"] = None
    aggregate["values"][2]["lower"] = aggregate["values"][2]["upper"] = None
    marker = charts.release_figure(aggregate)["data"][0]["marker"]["symbol"]
    assert marker[:3] == symbols and set(marker[3:]) <= {"circle"}


def commit_release(ledger, aggregates: dict, confidence=0.95) -> int:
    """Commit a release of ``aggregates`` in account ``census`` of ``ledger`` (run ``big``); its charge id."""
    ledger.commit(reserve(ledger, "census", "big", "1/1000"),
                  {"release": "big", "confidence": confidence, "aggregates": aggregates})
    return charge_id(ledger, "census", "big")


def test_a_release_page_draws_its_first_aggregates_and_links_the_others(filled, token):
    count = pages.MAX_SHOWN_AGGREGATES + 5
    aggregates = {f"a{i:02d} <{i}>": {"kind": "count", "mechanism": "discrete_laplace", "group_by": ["k"],
                                      "rows": [{"k": f"k{j}", "value": j, "half_width": 1.5} for j in range(3)]}
                  for i in range(count)}
    release = commit_release(filled, aggregates)
    names = sorted(aggregates)  # the ledger stores canonical JSON: keys sorted
    with TestClient(dashboard(filled), headers=bearer(token)) as client:
        document = get_page(client, f"/releases/{release}")
        shown = [section.one("h2").text() for section in document.all("section", class_="aggregate")]
        assert shown == names[:pages.MAX_SHOWN_AGGREGATES]
        assert len(document.all("script", type="application/json")) == pages.MAX_SHOWN_AGGREGATES
        more = document.one("section", id="more-aggregates")
        assert f"published {count} aggregates; this page draws the first {pages.MAX_SHOWN_AGGREGATES}" in (
            " ".join(more.text().split()))
        listed = more.all("a")
        assert [a.text() for a in listed] == names[pages.MAX_SHOWN_AGGREGATES:]
        # each link opens that aggregate alone, drawn, with a link back to the whole release
        alone = get_page(client, listed[-1].attrs["href"])
        assert [s.one("h2").text() for s in alone.all("section", class_="aggregate")] == [names[-1]]
        assert figure_of(alone, "release-chart-1")["data"][0]["x"] == ["k0", "k1", "k2"]
        assert alone.one(id="one-aggregate").one("a").attrs["href"] == f"/releases/{release}"
        assert alone.all("section", id="more-aggregates") == []
        assert "has no aggregate 'nope'" in get_page(client, f"/releases/{release}", 404, aggregate="nope").text()
        blank = get_page(client, f"/releases/{release}", aggregate="")
        assert len(blank.all("section", class_="aggregate")) == pages.MAX_SHOWN_AGGREGATES


@pytest.mark.parametrize(
    "row, value_shown",
    [
        pytest.param({"value": 10**400, "half_width": 1.5}, str(10**400), id="an integer beyond the doubles"),
        pytest.param({"value": 1.7e308, "half_width": 1e308}, "1.7e+308", id="a double whose interval overflows"),
    ],
)
def test_huge_published_values_are_shown_exactly_and_left_out_of_the_chart(filled, token, row, value_shown):
    release = commit_release(filled, {"huge": {"kind": "sum", "group_by": ["k"], "rows": [
        {"k": "big", **row}, {"k": "small", "value": 5, "half_width": 1.5}]}})
    with TestClient(dashboard(filled), headers=bearer(token)) as client:
        api = client.get(f"/api/releases/{release}")
        document = get_page(client, f"/releases/{release}")
    assert api.status_code == 200
    big, small = api.json()["aggregates"][0]["values"]
    assert big["value"] == row["value"] and big["upper"] is None  # exact as stored; the bound is open
    assert json.loads(api.text)["output"]["aggregates"]["huge"]["rows"][0]["value"] == row["value"]
    cells = document.one("table", class_="published-values").one("tbody").all("tr")[0]
    assert (cells.one("td", data_field="value").text(), cells.one("td", data_field="upper").text()) == (
        value_shown, "-")
    assert cells.one("td", data_field="value").attrs["data-exact"] == json.dumps(row["value"])
    figure = figure_of(document, "release-chart-1")
    # beyond what plotly.js plots: not drawn, and the chart says so
    assert figure["data"][0]["x"] == ["small"]
    assert [a["text"] for a in figure["layout"]["annotations"]] == [
        "1 of 2 values not drawn: no number, or beyond ±1.8e+304, which a chart cannot plot (the table shows them)"]


@pytest.mark.parametrize(
    "value, lower, upper, drawn",
    [
        pytest.param(1e300, 1e300 - 1e298, None, True, id="large, open above: drawn, pointing up"),
        pytest.param(-charts.PLOTTABLE, None, 0.0, True, id="at the plottable limit"),
        pytest.param(2e304, 1e304, None, False, id="beyond plotly.js's limit"),
        pytest.param(1.0, -1e305, 2.0, False, id="a closed bound beyond the limit"),
        pytest.param(10**400, None, None, False, id="an integer beyond the doubles"),
        pytest.param("12", 11.0, 13.0, False, id="a text value"),
        pytest.param(True, 0.0, 2.0, False, id="a boolean"),
    ],
)
def test_release_charts_leave_out_what_plotly_cannot_plot_and_say_so(value, lower, upper, drawn):
    aggregate = {"name": "x", "group_by": ["k"], "confidence": 0.95, "values": [
        {"key": {"k": "odd"}, "value": value, "lower": lower, "upper": upper},
        {"key": {"k": "plain"}, "value": 5, "lower": 4.0, "upper": 6.0}]}
    figure = charts.release_figure(aggregate)
    [trace] = figure["data"]
    json.dumps(figure, allow_nan=False)  # JSON a browser parses: no Infinity, no NaN
    if drawn:
        assert trace["x"] == ["odd", "plain"] and "annotations" not in figure["layout"]
        above = None if upper is None else upper - value
        assert trace["error_y"]["array"] == [above, 1.0]
        assert trace["marker"]["symbol"][0] == {(False, True): "triangle-up", (True, False): "triangle-down"}[
            (lower is None, upper is None)]
    else:
        assert trace["x"] == ["plain"] and trace["y"] == [5]
        assert figure["layout"]["annotations"][0]["text"].startswith("1 of 2 values not drawn")


def test_a_release_of_any_shape_has_a_page(filled, token):
    """What no release engine writes but a spender can commit: the page and the JSON answer, showing what is
    stored as text."""
    release = commit_release(filled, {
        "text_values": {"kind": {"not": "a kind"}, "group_by": ["k"], "rows": [
            {"k": "a", "value": "<b>12</b>", "half_width": "wide"}, {"k": "b", "value": None}, 5,
            {"k": "c", "value": 1, "half_width": 1, "interval": "open"}]},
        "rows_not_a_list": {"group_by": ["k"], "rows": 5},
        "rows_file_not_a_dict": {"group_by": [], "rows_file": "somewhere"},
        "not_a_dict": [1, 2],
    }, confidence="high")
    with TestClient(dashboard(filled), headers=bearer(token)) as client:
        assert client.get(f"/api/releases/{release}").status_code == 200
        document = get_page(client, f"/releases/{release}")
    assert [td.text() for td in document.all("td", data_field="value")] == ["<b>12</b>", "-", "-", "1"]
    figure = figure_of(document, "release-chart-4")  # text_values (last, keys sorted): only the number drawn
    assert figure["data"][0]["x"] == ["c"] and "3 of 4 values not drawn" in figure["layout"]["annotations"][0]["text"]
    assert "% confidence" not in document.text()


def test_figures_carry_no_template_and_the_script_sets_one(client, filled):
    from pathlib import Path

    document = get_page(client, f"/releases/{charge_id(filled, 'census', 'r1')}")
    for script in document.all("script", type="application/json"):
        assert "template" not in json.loads(script.text())["layout"]
    overview = json.loads(get_page(client, "/").one("script", type="application/json").text())
    assert "template" not in overview["layout"]
    script = (Path(pages.__file__).parent / "static" / "dashboard.js").read_text()
    assert "template: TEMPLATE" in script and '"#EBF0F8"' in script  # plotly_white's grid, set once


def test_pages_and_json_say_no_store_and_the_assets_keep_their_caching(client, filled):
    for path in ("/", "/accounts/census", f"/releases/{charge_id(filled, 'census', 'r1')}", "/runs/d/r1",
                 "/accounts/nope", "/accounts/census?limit=0", "/api/accounts", "/static/nothing.js"):
        assert client.get(path).headers["cache-control"] == "no-store", path
    for name in ("plotly.min.js", "dashboard.js", "dashboard.css"):
        assert client.get(f"/static/{name}").headers["cache-control"] == "private, max-age=86400"


@pytest.mark.parametrize("state", ["released", "abandoned", "reserved"])
def test_a_charge_that_published_nothing_says_so(client, filled, state):
    run = {"released": "r3", "abandoned": "r4", "reserved": "r6"}[state]
    document = get_page(client, f"/releases/{charge_id(filled, 'census', run)}")
    said = " ".join(document.one(id="not-published").text().split())
    assert said == f"This charge is {state}: nothing was published."
    assert document.all("script", type="application/json") == [] and document.all(class_="aggregate") == []


# ---- run page -------------------------------------------------------------------------------------------------
def airflow_run_path(dag_id: str, run_id: str) -> str:
    """The DAG-run tab's URL as Airflow's UI fills {DAG_ID} and {RUN_ID}: JavaScript's encodeURIComponent."""
    unreserved = "-_.!~*'()"
    return f"/runs/{quote(dag_id, safe=unreserved)}/{quote(run_id, safe=unreserved)}"


def test_run_page_lists_the_runs_charges_across_accounts_with_working_links(client, filled):
    document = get_page(client, airflow_run_path(WEIRD_DAG, WEIRD_RUN))
    api = client.get(f"/api{airflow_run_path(WEIRD_DAG, WEIRD_RUN)}").json()
    table = document.one("table", id="run-charges")
    rows = [tr for tr in table.all("tr") if "data-charge-id" in tr.attrs]
    assert [int(tr.attrs["data-charge-id"]) for tr in rows] == [c["id"] for c in api["charges"]]
    assert [tr.one("td", data_field="account").text() for tr in rows] == ["census", WEIRD_ACCOUNT]
    for tr, charge in zip(rows, api["charges"]):
        assert tr.one("td", data_field="amount").attrs["data-exact"] == charge["amount"]
        account = get_page(client, tr.one("td", data_field="account").one("a").attrs["href"])
        assert account.one("h1").text() == f"Budget account {charge['account']}"
        release = get_page(client, tr.one("td", data_field="id").one("a").attrs["href"])
        assert release.one("section", id="release").one("td", data_field="run_id").text() == WEIRD_RUN


def test_a_run_that_spent_nothing_says_so(client):
    document = get_page(client, airflow_run_path("d", "scheduled__2025-01-01T00:00:00+00:00"))
    assert document.one(id="no-spend").text() == "This run spent no privacy budget."
    assert document.all("table", id="run-charges") == []


# ---- names full of HTML and URL syntax ------------------------------------------------------------------------
def test_weird_names_are_escaped_in_html_and_chart_json(client, filled):
    release_id = charge_id(filled, WEIRD_ACCOUNT, WEIRD_RUN)
    responses = [client.get(path) for path in
                 ("/", f"/accounts/{quote(WEIRD_ACCOUNT, safe='')}", f"/releases/{release_id}",
                  airflow_run_path(WEIRD_DAG, WEIRD_RUN))]
    for response in responses:
        assert response.status_code == 200
        text = response.text
        for raw in ("<script>alert", "<b>\"x\"", "<b>kind</b>"):
            assert raw not in text
        document = parse(text)
        for script in document.all("script"):  # scripts are files or JSON data, nothing inline
            assert "src" in script.attrs or script.attrs.get("type") == "application/json"
            assert "</" not in script.text()
        assert not any(name.startswith("on") for e in document.iter() for name in e.attrs)
    overview, account, release, run = (parse(r.text) for r in responses)
    assert overview.one("tr", data_account=WEIRD_ACCOUNT).one("a").text() == WEIRD_ACCOUNT
    assert markupsafe.escape(WEIRD_ACCOUNT) in responses[0].text
    bars = figure_of(overview, "overview-chart")["data"][0]["y"]
    assert html.escape(WEIRD_ACCOUNT, quote=False) in bars  # plotly shows the name as written
    assert account.one("h1").text() == f"Budget account {WEIRD_ACCOUNT}"
    assert account.one("tr", data_charge_id=str(release_id)).one("td", data_field="run_id").text() == WEIRD_RUN
    assert release.one("h2").text() == WEIRD_AGGREGATE
    [trace] = figure_of(release, "release-chart-1")["data"]
    assert trace["x"] == [html.escape("</script><script>alert(2)</script>", quote=False),
                          html.escape("O'Brien & \"Sons\" <3", quote=False)]
    assert [td.text() for td in release.one("tbody").all("td", data_field="key")] == [
        "</script><script>alert(2)</script>", "O'Brien & \"Sons\" <3"]
    assert run.one("table", id="run").one("td", data_field="run_id").text() == WEIRD_RUN
    # every link on these pages resolves to a page about the same names
    assert get_page(client, overview.one("tr", data_account=WEIRD_ACCOUNT).one("a").attrs["href"]).one(
        "h1").text() == f"Budget account {WEIRD_ACCOUNT}"
    run_link = account.one("tr", data_charge_id=str(release_id)).one("td", data_field="run_id").one("a")
    assert get_page(client, run_link.attrs["href"]).one("table", id="run").one("td", data_field="run_id").text() \
        == WEIRD_RUN
    filtered, _ = walk(client, f"/accounts/{quote(WEIRD_ACCOUNT, safe='')}", dag_id=WEIRD_DAG, limit="1")
    assert filtered == [release_id]


# ---- the mount, the static files ------------------------------------------------------------------------------
def test_every_link_resolves_under_the_airflow_mount(mounted, filled):
    """Crawl from the overview: every link and asset stays under /dp-budget and answers 200."""
    seen, queue, pages_seen = set(), deque([f"{PREFIX}/"]), 0
    while queue:
        url = queue.popleft()
        response = mounted.get(url)
        assert response.status_code == 200, url
        if not response.headers["content-type"].startswith("text/html"):
            continue
        pages_seen += 1
        document = get_page(mounted, url)
        targets = links(document) + [e.attrs["src"] for e in document.all("script") if "src" in e.attrs] + [
            e.attrs["href"] for e in document.all("link") if e.attrs.get("rel") == "stylesheet"]
        form = document.all("form", id="charge-filters")
        targets += [f.attrs["action"] for f in form]
        for target in targets:
            assert target.startswith(f"{PREFIX}/"), (url, target)
            if target not in seen:
                seen.add(target)
                queue.append(target)
    assert pages_seen >= 2 + 7 + 3  # overview, both accounts, every release, the runs


def test_plotly_is_the_packages_own_bytes_cached_and_gzipped(client):
    from plotly.offline import get_plotlyjs

    document = get_page(client, "/accounts/census")
    src = next(e.attrs["src"] for e in document.all("script") if "plotly.min.js" in e.attrs.get("src", ""))
    plain = client.get(src, headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and plain.content == get_plotlyjs().encode("utf-8")
    assert plain.headers["content-type"].startswith("text/javascript")
    assert "content-encoding" not in plain.headers
    zipped = client.get(src, headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert int(zipped.headers["content-length"]) < len(plain.content) / 2
    assert zipped.content == plain.content  # httpx decodes
    assert zipped.headers["etag"] == plain.headers["etag"] and "max-age" in plain.headers["cache-control"]
    again = client.get(src, headers={"If-None-Match": plain.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


@pytest.mark.parametrize("name", ["dashboard.css", "dashboard.js"])
def test_page_assets_are_the_package_files(client, name):
    from pathlib import Path

    response = client.get(f"/static/{name}")
    assert response.status_code == 200
    assert response.content == (Path(pages.__file__).parent / "static" / name).read_bytes()
    assert client.get("/static/nothing.js").status_code == 404


def test_pages_send_a_content_security_policy(client):
    policy = client.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
