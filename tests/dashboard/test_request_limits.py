"""What a client's request costs the dashboard: oversized and unknown query parameters are refused before any
work (counted: SQL statements run, query parameters looked up), input at the edge of the database's and the
calendar's ranges is a 4xx and never a 500, and pages stay bounded whatever a DAG author publishes."""

from __future__ import annotations

from fractions import Fraction

import pytest
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.ledger import ReleaseKey
from dashboard_apps import JUNK_PARAMETERS, MECHANISMS, asgi_get, counted_work, dashboard, reserve
from dashboard_auth import bearer
from ledger_backends import SQLITE_FAST, account_config, ledger_with
from test_pages import parse


@pytest.mark.parametrize("query", [
    pytest.param("limit=501", id="limit over 500"), pytest.param(f"limit={10**30}", id="limit 10^30"),
    pytest.param("limit=-1", id="negative limit"), pytest.param("limit=1e9", id="limit 1e9"),
    pytest.param("dag_id=" + "d" * 1_000_000, id="1 MB dag_id"),
    pytest.param("since=" + "2" * 1_000_000, id="1 MB since"),
    pytest.param("after=" + "9" * 100_000, id="100,000-digit after"),
    pytest.param("state=" + "committed" * 100_000, id="900 KB state"),
])
@SQLITE_FAST  # no statement reaches the ledger
def test_oversized_parameters_are_refused_before_any_query(hostile, token, query):
    """A query string over the limit is refused whole (414), a bad value with 422, and the ledger is not queried."""
    app = dashboard(hostile)
    expected = 414 if len(query) > dashboard_app.MAX_QUERY_BYTES else 422
    for path in ("/api/accounts/census/charges", "/accounts/census"):
        with counted_work(hostile) as work:
            status, body = asgi_get(app, path, query, bearer(token))
        assert status == expected, (path, status, body[:200])
        assert work["ledger_statements"] == 0, (path, work)


@pytest.mark.parametrize("path", ["/accounts/census", "/api/accounts/census/charges"])
@SQLITE_FAST  # no statement reaches the ledger
def test_unknown_query_parameters_are_refused_before_fastapi_reads_them(hostile, token, path):
    """13,000 unknown parameters get 414 from a viewer before FastAPI looks up a single one."""
    # FastAPI's request_params_to_args collects undeclared parameters with Starlette's getlist, which scans the whole
    # list: quadratic, seconds of a worker holding the GIL. The limit must refuse them before.
    app = dashboard(hostile)
    with counted_work(hostile) as work:
        status, _ = asgi_get(app, path, JUNK_PARAMETERS, bearer(token))
    assert status == 414, (path, status)
    assert work == {"ledger_statements": 0, "parameter_lookups": 0}, (path, work)


def test_unknown_query_parameters_are_refused_before_authentication(hostile, auth_manager):
    """The query-string limit (414) runs before authentication, and nothing is looked up or queried."""
    app = dashboard(hostile)
    with counted_work(hostile) as work:
        status, _ = asgi_get(app, "/accounts/census", JUNK_PARAMETERS)
    assert status == 414
    assert work == {"ledger_statements": 0, "parameter_lookups": 0}, work


@pytest.mark.parametrize("path", [
    pytest.param("/api/accounts/census/charges?after=9223372036854775808", id="after beyond 64-bit"),
    pytest.param("/accounts/census?after=99999999999999999999999", id="page after beyond 64-bit"),
    pytest.param("/api/releases/9223372036854775808", id="release id beyond 64-bit"),
    pytest.param("/releases/99999999999999999999999", id="release page id beyond 64-bit"),
    pytest.param("/api/accounts/census/charges?dag_id=d%00x", id="NUL in dag_id filter"),
    pytest.param("/accounts/census?dag_id=%00", id="NUL in dag_id filter, page"),
    pytest.param("/api/accounts/a%00b", id="NUL in account name"),
    pytest.param("/accounts/a%00b", id="NUL in account name, page"),
    pytest.param("/api/runs/d/r%001", id="NUL in run id"),
    pytest.param("/runs/d%00/r1", id="NUL in DAG id, page"),
])
def test_ids_and_names_the_database_cannot_hold_are_not_a_500(hostile, token, path):
    """Ids beyond 2**63 - 1 and NUL characters in a name or filter get 404 or 422, never a 500."""
    # sqlite3 raises OverflowError on such an id; PostgreSQL text refuses NUL: both must stop at validation
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
    """``since``/``until`` whose offset moves them past the calendar's ends in UTC get 422, never a 500."""
    with TestClient(dashboard(hostile), headers=bearer(token), raise_server_exceptions=False) as client:
        for path in ("/api/accounts/census/charges", "/accounts/census"):
            response = client.get(path, params=params)
            assert response.status_code in (200, 422), (path, response.status_code, response.text[:200])


def test_a_run_page_lists_at_most_a_page_of_charges(tmp_path, token):
    """A run with any number of charges (mapped tasks) lists RUN_PAGE_CHARGES of them, and says the total."""
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
    """A committed value beyond the doubles, or whose interval overflows them, still gets its page and JSON."""
    ledger = ledger_with(ledger_url, census=account_config("pure_dp", epsilon="10", dags=("d",)))
    ledger.commit(reserve(ledger, "census", "big"),
                  {"release": "r", "confidence": 0.95,
                   "aggregates": {"a": {"kind": "sum", "mechanism": "discrete_laplace", "group_by": [], **row}}})
    release = next(c["id"] for c in ledger.charges(account="census"))
    with TestClient(dashboard(ledger), headers=bearer(token), raise_server_exceptions=False) as client:
        statuses = {path: client.get(path).status_code for path in (f"/releases/{release}", f"/api/releases/{release}")}
    assert set(statuses.values()) == {200}, statuses


def test_a_release_page_is_bounded_whatever_the_release_published(ledger_url, token):
    """300 aggregates of 200 values make a release page under 5 MB (charts capped, template set once)."""
    ledger = ledger_with(ledger_url, census=account_config("pure_dp", epsilon="10", dags=("d",)))
    aggregates = {f"a{i:04d}": {"kind": "count", "mechanism": "discrete_laplace", "group_by": ["k"],
                                "rows": [{"k": f"k{j}", "value": j, "half_width": 1.5} for j in range(200)]}
                  for i in range(300)}
    ledger.commit(reserve(ledger, "census", "big"), {"release": "big", "confidence": 0.95, "aggregates": aggregates})
    release = next(c["id"] for c in ledger.charges(account="census"))
    with TestClient(dashboard(ledger), headers=bearer(token)) as client:
        response = client.get(f"/releases/{release}", headers={"Accept-Encoding": "identity"})
    assert response.status_code == 200
    charts = response.text.count('data-chart-for="')
    assert len(response.content) < 5_000_000, f"{len(response.content) / 1e6:.1f} MB, {charts} charts"
