"""The account page's Series section and ``series`` in ``/api/accounts/NAME`` (:func:`queries.account_detail`):
series released step by step through the ledger (:mod:`dp_operators.continual.run`), on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import time
from fractions import Fraction

import pytest
from fastapi.testclient import TestClient

from dp_operators.continual.plan import plan_spec_series
from dp_operators.continual.run import StepRun, redraw_charge, run_series_step, step_key
from dp_operators.continual.state import SeriesKey
from dp_operators.dashboard import queries
from dp_operators.ledger import ReleaseKey
from dp_operators.spec import parse_spec
from dashboard_apps import dashboard, reserve
from dashboard_auth import bearer
from hostile_names import HOSTILE_DAG, HOSTILE_RELEASE, HOSTILE_TASK
from ledger_backends import account_config, ledger_with
from support import spender
from test_hostile_rows_pages import DEEP, _owner_sql
from test_pages import Element, get_page, parse

KEY = SeriesKey(bytes(range(32)))
BASE = ReleaseKey("d", "unused", "release", -1, "daily_flights")
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)


def spec(horizon: int = 8, after: str = "refuse"):
    return parse_spec(
        "version: 1\nrelease: daily_flights\nbudget_account: a\nprivacy_unit: person\n"
        f"series: {{horizon: {horizon}, after_horizon: {after}, mechanism: auto}}\n"
        "aggregates:\n  - {name: flights, kind: count, group_by: [origin], keys: {origin: [EWR, JFK, LGA]}, "
        "mechanism: auto, budget: {rho: 1}}\n", source="s.yaml")


def step(ledger, index: int, base: ReleaseKey = BASE, the_spec=None):
    """Day ``index`` of the series of ``base`` (running totals: EWR 10 a day, JFK 3)."""
    totals = {"flights": [{"origin": "EWR", "count": 10 * (index + 1)}, {"origin": "JFK", "count": 3 * (index + 1)}]}
    run = StepRun(f"scheduled__{(START + index * DAY).date()}", START + index * DAY, START + (index + 1) * DAY)
    return run_series_step(the_spec or spec(), lambda: totals, ledger, base, run, series_key=KEY,
                           spec_hash="0" * 64)


@pytest.fixture
def ledger(ledger_url):
    """Account ``a`` (zCDP, cap 3) and account ``plain`` (ordinary charges only, no series)."""
    return ledger_with(ledger_url, a=account_config("zcdp", cap=3, dags=("d", HOSTILE_DAG)),
                       plain=account_config("zcdp", cap=3))


@pytest.fixture
def client(ledger, token):
    with TestClient(dashboard(ledger), headers=bearer(token)) as test_client:
        yield test_client


def series_rows(document: Element) -> list[Element]:
    return [tr for tr in document.one("table", id="series-table").all("tr") if "data-series" in tr.attrs]


def cells(row: Element) -> dict[str, tuple[str, str]]:
    """``data-field: (data-exact, text)`` of a series row."""
    return {e.attrs["data-field"]: (e.attrs["data-exact"], e.text()) for e in row.all() if "data-field" in e.attrs}


def test_the_account_page_lists_a_series_with_its_steps_charge_and_redraws(client, ledger):
    """Three steps of a horizon-8 series: 3 done, 5 left, charged 1 (rho, once), no redraws; the JSON says the
    same, and the release links to the last committed step."""
    for index in range(3):
        step(ledger, index)
    ledger.commit(reserve(ledger, "a", "r1"), {"run": "r1"})  # an ordinary charge is no series
    [series] = client.get("/api/accounts/a").json()["series"]
    last = next(c["id"] for c in ledger.charges(account="a") if c["run_id"] == step_key(BASE, 0, 2).run_id)
    assert series == {
        "dag_id": "d", "task_id": "release", "map_index": -1, "release_name": "daily_flights", "generation": 0,
        "steps_committed": 3, "last_step": 2, "horizon": 8, "steps_left": 5, "charged": "1", "charged_float": 1.0,
        "redraws": 0, "last_charge_id": last,
    }
    assert client.get("/api/accounts/a").json()["series_total"] == 1
    document = get_page(client, "/accounts/a")
    [row] = series_rows(document)
    assert cells(row) == {
        "release_name": ("daily_flights", "daily_flights"), "dag_id": ("d", "d"), "task_id": ("release", "release"),
        "generation": ("0", "0"), "steps_committed": ("3", "3 of 8"), "steps_left": ("5", "5"),
        "charged": ("1", "1"), "redraws": ("0", "0"),
    }
    assert row.one("a").attrs["href"] == f"/releases/{last}"
    assert get_page(client, f"/releases/{last}").one("h1").text()
    assert "dpctl ledger show" not in document.one("section", id="series").text()  # every series is listed


def test_an_account_without_a_series_has_no_series_section(client, ledger):
    ledger.commit(reserve(ledger, "plain", "r1"), {"run": "r1"})
    step(ledger, 0)  # a series on another account
    detail = client.get("/api/accounts/plain").json()
    assert (detail["series"], detail["series_total"]) == ([], 0)
    document = get_page(client, "/accounts/plain")
    assert document.all("section", id="series") == [] and document.all("table", id="series-table") == []


def test_a_new_generation_is_a_series_of_its_own_charged_again(client, ledger):
    for index in range(2):
        step(ledger, index, the_spec=spec(horizon=2))
    # generation 1 (the engine does not open one yet: after_horizon new_series is refused; the ledger holds it)
    ledger.commit(ledger.reserve(step_key(BASE, 1, 0), account="a", amount=1, takeover_amount=1,
                                 mechanisms=[{"kind": "series_step", "horizon": 2}], spec_hash="0" * 64),
                  {"series": {"generation": 1, "step": 0}})
    series = client.get("/api/accounts/a").json()["series"]
    assert [(s["generation"], s["steps_committed"], s["steps_left"], s["charged"]) for s in series] == [
        (0, 2, 0, "1"), (1, 1, 1, "1")]
    assert ledger.account("a").spent == 2


def test_names_a_spender_writes_are_escaped(client, ledger, token):
    """A DAG id, task id and release name full of markup (the ledger stores what a spender writes) show as text."""
    base = ReleaseKey(HOSTILE_DAG, "unused", HOSTILE_TASK, 3, HOSTILE_RELEASE)
    step(ledger, 0, base)
    response = client.get("/accounts/a")
    assert response.status_code == 200
    for raw in ("<svg", "<iframe", "<a href=\"javascript", "<!--"):
        assert raw not in response.text
    document = parse(response.text)
    assert not any(name.startswith("on") for e in document.iter() for name in e.attrs)  # no event handlers
    [row] = series_rows(document)
    found = cells(row)
    assert found["dag_id"] == (HOSTILE_DAG, HOSTILE_DAG)
    assert found["task_id"] == (HOSTILE_TASK, HOSTILE_TASK)
    assert found["release_name"] == (HOSTILE_RELEASE, HOSTILE_RELEASE)
    assert found["map_index"] == ("3", "[3]")


def test_a_released_attempt_is_not_charged_and_a_taken_over_step_counts_a_redraw(ledger_url, token):
    """Step 0's first attempt released (its budget came back), then taken over; step 1's first attempt dies
    holding its lease and the next one pays the redraw: the series' charge is what the account spent."""
    ledger = ledger_with(ledger_url, a=account_config("zcdp", cap=3))
    ledger.release(ledger.reserve(step_key(BASE, 0, 0), account="a", amount=1, takeover_amount=1,
                                  mechanisms=[], spec_hash="0" * 64))
    step(ledger, 0)
    dying = spender(ledger_url, lease_seconds=0.3)
    dying.reserve(step_key(BASE, 0, 1), account="a", amount=0, takeover_amount=redraw_charge(plan_spec_series(spec())),
                  mechanisms=[], spec_hash="0" * 64)
    time.sleep(0.5)
    step(ledger, 1)
    spent = ledger.account("a").spent
    assert spent == 1 + redraw_charge(plan_spec_series(spec()))
    with TestClient(dashboard(ledger), headers=bearer(token)) as client:
        [series] = client.get("/api/accounts/a").json()["series"]
        assert (series["steps_committed"], series["horizon"], series["redraws"]) == (2, 8, 2)
        assert Fraction(series["charged"]) == spent
        [row] = series_rows(get_page(client, "/accounts/a"))
    assert cells(row)["charged"] == (str(spent), f"{float(spent):.6g}")


def test_only_the_first_series_are_listed_and_the_page_says_so(client, ledger, monkeypatch):
    """More series than MAX_SERIES: the first by key, each with its own exact charge, and how many there are."""
    for task in ("t1", "t2", "t3"):
        step(ledger, 0, ReleaseKey("d", "unused", task, -1, "daily_flights"))
    step(ledger, 1, ReleaseKey("d", "unused", "t1", -1, "daily_flights"))
    monkeypatch.setattr(queries, "MAX_SERIES", 2)
    detail = client.get("/api/accounts/a").json()
    assert [(s["task_id"], s["steps_committed"], s["charged"]) for s in detail["series"]] == [
        ("t1", 2, "1"), ("t2", 1, "1")]
    assert detail["series_total"] == 3
    section = get_page(client, "/accounts/a").one("section", id="series")
    assert "The first 2 of 3 series" in section.text() and "dpctl ledger show" in section.text()


@pytest.mark.parametrize(("groups", "listed", "charged"), [
    pytest.param(2, 1, "1", id="the cut after a series: the next is not listed"),
    pytest.param(3, 1, "1", id="the cut within the second series: it is not listed"),
    pytest.param(1, 1, None, id="the cut within the first series: listed without a charge"),
])
def test_a_bounded_read_of_amounts_lists_only_whole_series(client, ledger, monkeypatch, groups, listed, charged):
    """At most MAX_SERIES_AMOUNTS (series, amount) groups are read: a series cut short is left out, or, when it is
    the first, listed without a charge and saying why; ``series_total`` still counts them all."""
    for task in ("t1", "t2"):
        for index in range(2):  # two amounts: 1 (step 0) and 0 (step 1)
            step(ledger, index, ReleaseKey("d", "unused", task, -1, "daily_flights"))
    monkeypatch.setattr(queries, "MAX_SERIES_AMOUNTS", groups)
    detail = client.get("/api/accounts/a").json()
    assert (len(detail["series"]), detail["series_total"]) == (listed, 2)
    [first] = detail["series"]
    assert first["task_id"] == "t1" and first["charged"] == charged
    if charged is None:
        assert "so its charge is not shown" in first["unreadable"][0]
    assert "The first 1 of 2 series" in get_page(client, "/accounts/a").one("section", id="series").text()


def test_hostile_step_rows_are_unreadable_not_an_error(ledger_url, ledger, token):
    """A step's amount and mechanisms rewritten around the ledger: the series says unreadable, the page answers
    200; a run id that only looks like a step's is refused by the ledger."""
    for index in range(2):
        step(ledger, index)
    first, second = sorted(c["id"] for c in ledger.charges(account="a"))
    for look_alike in ("__dp_series__/g0/step/00000x", "__dp_series__/g0/step/0000001", "__dp_series__/g00/step/000002"):
        with pytest.raises(ValueError, match="no series step"):  # the ledger never holds one: it refuses it
            reserve(ledger, "a", look_alike)
    _owner_sql(ledger_url,
               ("UPDATE dp_charges SET amount = :value WHERE id = :id", {"value": "1e-99999999", "id": first}),
               ("UPDATE dp_charges SET mechanisms = :value WHERE id = :id", {"value": DEEP, "id": second}))
    with TestClient(dashboard(ledger), headers=bearer(token)) as client:
        [series] = client.get("/api/accounts/a").json()["series"]
        assert (series["steps_committed"], series["charged"], series["horizon"], series["steps_left"]) == (
            2, None, None, None)
        assert any(problem.startswith("amount '1e-99999999'") for problem in series["unreadable"])
        assert "mechanisms nests deeper than 64 levels" in series["unreadable"]
        response = client.get("/accounts/a")
    assert response.status_code == 200
    [row] = series_rows(parse(response.text))
    assert row.attrs["class"] == "unreadable" and cells(row)["steps_left"] == ("", "?")
    assert "unreadable series" in response.text


def test_a_steps_release_page_never_shows_its_sealed_noise_state(client, ledger):
    step(ledger, 0)
    (charge,) = [c for c in ledger.charges(account="a")]
    detail = client.get(f"/api/releases/{charge['id']}").json()
    assert "series_state" not in detail["output"] and detail["output"]["series"]["step"] == 0
    assert "series_state" not in client.get(f"/releases/{charge['id']}").text
