"""The dashboard over budget structure (dp_operators/ledger/structure.py) on SQLite and PostgreSQL: privacy blocks
and team quotas grouped under their parent account (overview, account page, JSON), refused attempts with their
reasons, an account flagged when it cannot fund another run of a release it ran, a release's charge split per
aggregate, and the accountant's unit in the charges tables' headers."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction

import pytest
from fastapi.testclient import TestClient

from dp_operators.dashboard import queries
from dp_operators.ledger import BudgetExhaustedError, DagNotAllowedError, ReleaseKey
from dp_operators.ledger.config import BlockOpening, Blocks, Quota
from dashboard_apps import dashboard
from dashboard_auth import bearer
from ledger_backends import account_config, ledger_with
from test_pages import Element, get_page

DAYS = ["2013-01-01", "2013-01-02", "2013-01-03", "2013-01-04", "2013-01-05"]
#: A release of two aggregates on a zCDP account: the steps record their own rho.
SPLIT_MECHANISMS = [
    {"aggregate": "by_origin", "component": "value", "mechanism": "discrete_gaussian", "rho": 0.05,
     "rho_exact": "1/20"},
    {"aggregate": "by_carrier", "component": "value", "mechanism": "discrete_gaussian", "rho": 0.03,
     "rho_exact": "3/100"},
    {"aggregate": "by_carrier", "component": "selection", "mechanism": "discrete_gaussian", "rho": 0.02,
     "rho_exact": "1/50"},
]


def spend(ledger, account: str, run: str, amount: str, *, dag: str = "d", release: str = "r",
          windows: list[str] | None = None, mechanisms=None, commit: bool = True):
    """Reserve ``amount`` on ``account`` for (dag, run, "t", -1, release) and commit it (returns the reservation)."""
    reservation = ledger.reserve(ReleaseKey(dag, run, "t", -1, release), account=account, amount=Fraction(amount),
                                 mechanisms=mechanisms or [{"mechanism": "discrete_gaussian"}], spec_hash="0" * 64,
                                 windows=windows)
    if commit:
        ledger.commit(reservation, {"run": run})
    return reservation


@pytest.fixture
def ledger(ledger_url):
    """``flights``: zCDP, cap 1 per day block, five day blocks; ``census``: zCDP with a shared cap 1 and quotas
    team_a (1/2, DAG a) and team_b (1/4, DAG b); ``plain``: zCDP, cap 1, no structure."""
    blocks = Blocks(window="day", open=BlockOpening(**{"from": dt.date(2013, 1, 1), "until": dt.date(2013, 1, 5)}))
    quotas = {"team_a": Quota(cap=Fraction(1, 2), dags=["a"]), "team_b": Quota(cap=Fraction(1, 4), dags=["b"])}
    return ledger_with(
        ledger_url,
        flights=account_config("zcdp", cap=1, dags=("d",), blocks=blocks),
        census=account_config("zcdp", cap=1, dags=("a", "b"), quotas=quotas),
        plain=account_config("zcdp", cap=1, dags=("d",)),
    )


@pytest.fixture
def client(ledger, token):
    with TestClient(dashboard(ledger), headers=bearer(token)) as test_client:
        yield test_client


def fields(row: Element) -> dict[str, str]:
    """``data-field: data-exact`` of the cells of a table row."""
    return {e.attrs["data-field"]: e.attrs.get("data-exact") for e in row.all() if "data-field" in e.attrs}


def test_the_overview_lists_each_parent_once_with_its_blocks_and_quotas_counted(client, ledger):
    spend(ledger, "flights", "r1", "1", windows=["2013-01-01"])  # exhausts the first day's block
    spend(ledger, "flights", "r2", "1/4", windows=["2013-01-02", "2013-01-03"])
    rows = client.get("/api/accounts").json()
    assert [row["name"] for row in rows] == ["census", "flights", "plain"]  # no member is a row of its own
    flights, census, plain = (next(r for r in rows if r["name"] == name) for name in ("flights", "census", "plain"))
    assert flights["structure"] == "blocks" and flights["members"]["count"] == 5
    assert flights["members"]["exhausted"] == 1 and flights["members"]["least_remaining"] == "0"
    assert flights["members"]["window"] == "day"
    assert census["structure"] == "quotas" and census["members"]["count"] == 2
    assert census["members"]["teams"] == ["team_a", "team_b"]
    assert plain["structure"] == "plain" and plain["members"] is None
    document = get_page(client, "/")
    listed = [tr.attrs["data-account"] for tr in document.one("table", id="accounts").all("tr")
              if "data-account" in tr.attrs]
    assert listed == ["census", "flights", "plain"]
    row = next(tr for tr in document.one("table", id="accounts").all("tr") if tr.attrs.get("data-account") == "flights")
    assert fields(row)["structure"] == "blocks" and fields(row)["members.exhausted"] == "1"
    # a member still has its page and JSON, which names its parent
    assert client.get("/api/accounts/flights@2013-01-01").json()["parent"] == "flights"
    member = get_page(client, "/accounts/flights@2013-01-01")
    assert member.one("td", data_field="parent").attrs["data-exact"] == "flights"


def test_a_blocks_parent_lists_its_blocks_latest_first_with_spent_remaining_and_cap(client, ledger):
    spend(ledger, "flights", "r1", "1", windows=["2013-01-01"])
    spend(ledger, "flights", "r2", "1/4", windows=["2013-01-02", "2013-01-03"])
    detail = client.get("/api/accounts/flights").json()
    assert [b["window"] for b in detail["blocks"]] == list(reversed(DAYS))
    by_window = {b["window"]: b for b in detail["blocks"]}
    assert (by_window["2013-01-01"]["spent"], by_window["2013-01-01"]["remaining"]) == ("1", "0")
    assert (by_window["2013-01-03"]["spent"], by_window["2013-01-03"]["remaining"]) == ("1/4", "3/4")
    assert by_window["2013-01-05"]["cap"] == "1" and by_window["2013-01-05"]["spent"] == "0"
    assert detail["spent"] == "0"  # the parent itself is never charged
    assert detail["members"]["exhausted"] == 1 and detail["cannot_fund_next_run"] is None
    # the day that spent its whole cap cannot fund the same release again; the others can
    assert by_window["2013-01-01"]["cannot_fund_next_run"] is True
    assert by_window["2013-01-03"]["cannot_fund_next_run"] is False
    document = get_page(client, "/accounts/flights")
    table = document.one("table", id="blocks-table")
    assert [tr.attrs["data-block"] for tr in table.all("tr") if "data-block" in tr.attrs] == list(reversed(DAYS))
    first_day = table.one("tr", data_block="2013-01-01")
    assert {k: fields(first_day)[k] for k in ("spent", "remaining", "cap")} == {"spent": "1", "remaining": "0",
                                                                                   "cap": "1"}
    assert "Spent (rho)" in table.one("thead").text()


def test_blocks_are_paged_by_the_window_of_the_previous_pages_last_block(client, ledger):
    first = queries.account_detail(ledger, "flights", blocks_limit=2)
    assert [b["window"] for b in first["blocks"]] == ["2013-01-05", "2013-01-04"]
    assert first["blocks_next_before"] == "2013-01-04"
    second = queries.account_detail(ledger, "flights", blocks_limit=2, blocks_before=first["blocks_next_before"])
    assert [b["window"] for b in second["blocks"]] == ["2013-01-03", "2013-01-02"]
    last = queries.account_detail(ledger, "flights", blocks_limit=2, blocks_before="2013-01-02")
    assert [b["window"] for b in last["blocks"]] == ["2013-01-01"] and last["blocks_next_before"] is None
    document = get_page(client, "/accounts/flights", blocks_before="2013-01-03")
    shown = [tr.attrs["data-block"] for tr in document.one("table", id="blocks-table").all("tr")
             if "data-block" in tr.attrs]
    assert shown == ["2013-01-02", "2013-01-01"]
    assert document.one("a", id="latest-blocks")


def test_a_quotas_parent_shows_each_teams_quota_spent_and_remaining_next_to_the_shared_cap(client, ledger):
    spend(ledger, "census", "r1", "1/5", dag="a")
    spend(ledger, "census", "r2", "1/10", dag="b")
    detail = client.get("/api/accounts/census").json()
    assert (detail["cap"], detail["spent"], detail["remaining"]) == ("1", "3/10", "7/10")  # charged with each team
    teams = {q["team"]: q for q in detail["quotas"]}
    assert (teams["team_a"]["cap"], teams["team_a"]["spent"], teams["team_a"]["remaining"]) == ("1/2", "1/5", "3/10")
    assert (teams["team_b"]["cap"], teams["team_b"]["spent"], teams["team_b"]["remaining"]) == ("1/4", "1/10",
                                                                                                 "3/20")
    document = get_page(client, "/accounts/census")
    section = document.one("section", id="quotas")
    row = section.one("tr", data_team="team_a")
    assert {k: fields(row)[k] for k in ("cap", "spent", "remaining")} == {"cap": "1/2", "spent": "1/5",
                                                                           "remaining": "3/10"}
    assert "Quota (rho)" in section.one("thead").text()


def test_refused_attempts_are_listed_with_their_reason(client, ledger):
    spend(ledger, "plain", "r1", "9/10")
    with pytest.raises(BudgetExhaustedError):
        spend(ledger, "plain", "r2", "1/2")
    with pytest.raises(DagNotAllowedError):
        spend(ledger, "plain", "r3", "1/100", dag="not_allowed")
    detail = client.get("/api/accounts/plain").json()
    assert detail["refusals_total"] == 2
    latest, earlier = detail["refusals"]
    assert (latest["reason"], latest["dag_id"], latest["run_id"]) == ("dag_not_allowed", "not_allowed", "r3")
    assert (earlier["reason"], earlier["amount"], earlier["remaining"]) == ("budget_exhausted", "1/2", "1/10")
    document = get_page(client, "/accounts/plain")
    table = document.one("table", id="refusals-table")
    reasons = [fields(tr)["reason"] for tr in table.all("tr") if "data-event-id" in tr.attrs]
    assert reasons == ["dag_not_allowed", "budget_exhausted"]
    assert "Asked (rho)" in table.one("thead").text()
    assert get_page(client, "/accounts/census").one("p", id="no-refusals")


def test_a_refusal_on_a_block_is_listed_on_its_parents_page(client, ledger):
    spend(ledger, "flights", "r1", "1", windows=["2013-01-01"])
    with pytest.raises(BudgetExhaustedError):
        spend(ledger, "flights", "r2", "1/2", windows=["2013-01-01", "2013-01-02"])
    [refusal] = client.get("/api/accounts/flights").json()["refusals"]
    assert (refusal["account"], refusal["reason"]) == ("flights@2013-01-01", "budget_exhausted")
    row = next(tr for tr in get_page(client, "/accounts/flights").one("table", id="refusals-table").all("tr")
               if "data-event-id" in tr.attrs)
    assert fields(row)["account"] == "flights@2013-01-01"


def test_an_account_that_cannot_fund_another_run_is_flagged_though_not_exhausted(client, ledger):
    # census_adult of the trial: 99.7 % spent, one run costs about 0.0997
    spend(ledger, "plain", "r1", "897/1000", release="census_adult")
    spend(ledger, "plain", "r2", "1/10", release="census_adult")
    spend(ledger, "plain", "r3", "1/1000", release="tiny")
    detail = client.get("/api/accounts/plain").json()
    assert detail["remaining"] == "1/500" and detail["forecast"]["exhausted"] is False
    assert detail["cannot_fund_next_run"] is True and detail["forecast"]["cannot_fund_next_run"] is True
    runs = {run["release_name"]: run for run in detail["next_run"]["runs"]}
    assert (runs["census_adult"]["amount"], runs["census_adult"]["fundable"]) == ("1/10", False)  # its last charge
    assert (runs["tiny"]["amount"], runs["tiny"]["fundable"]) == ("1/1000", True)
    overview = {row["name"]: row for row in client.get("/api/accounts").json()}
    assert overview["plain"]["cannot_fund_next_run"] is True and overview["census"]["cannot_fund_next_run"] is False
    document = get_page(client, "/accounts/plain")
    flag = document.one("p", id="cannot-fund-next-run")
    assert "census_adult" in flag.text() and "rho" in flag.text()
    fundable = {fields(tr)["release_name"]: fields(tr)["fundable"]
                for tr in document.one("table", id="next-run-table").all("tr") if "data-run-charge-id" in tr.attrs}
    assert fundable == {"census_adult": "false", "tiny": "true"}
    overview_row = next(tr for tr in get_page(client, "/").one("table", id="accounts").all("tr")
                        if tr.attrs.get("data-account") == "plain")
    assert fields(overview_row)["cannot_fund_next_run"] == "true"


def test_an_account_that_can_fund_its_next_run_is_not_flagged(client, ledger):
    spend(ledger, "plain", "r1", "1/10")
    detail = client.get("/api/accounts/plain").json()
    assert detail["cannot_fund_next_run"] is False
    assert not get_page(client, "/accounts/plain").all("p", id="cannot-fund-next-run")


def test_a_quota_that_cannot_fund_its_teams_next_run_is_flagged_on_its_row(client, ledger):
    spend(ledger, "census", "r1", "1/5", dag="b")  # team_b: 1/4 quota, 1/20 left
    teams = {q["team"]: q for q in client.get("/api/accounts/census").json()["quotas"]}
    assert teams["team_b"]["cannot_fund_next_run"] is True and teams["team_a"]["cannot_fund_next_run"] is False
    row = get_page(client, "/accounts/census").one("section", id="quotas").one("tr", data_team="team_b")
    assert fields(row)["cannot_fund_next_run"] == "true"


def test_a_releases_charge_is_split_per_aggregate_in_the_accounts_unit(client, ledger):
    reservation = spend(ledger, "plain", "r1", "1/10", mechanisms=SPLIT_MECHANISMS)
    release = client.get(f"/api/releases/{reservation.charge_id}").json()
    assert release["unit"] == "rho"
    split = release["charge_split"]
    assert [(a["aggregate"], a["loss"]) for a in split["aggregates"]] == [("by_origin", "1/20"), ("by_carrier", "1/20")]
    assert split["total"] == "1/10" and split["complete"] is True
    document = get_page(client, f"/releases/{reservation.charge_id}")
    table = document.one("table", id="charge-split-table")
    losses = {fields(tr)["aggregate"]: fields(tr)["loss"] for tr in table.all("tr") if "data-aggregate" in tr.attrs}
    assert losses == {"by_origin": "1/20", "by_carrier": "1/20"}
    assert "Loss (rho)" in table.one("thead").text()
    assert document.one("section", id="release").one("td", data_field="amount").attrs["data-exact"] == "1/10"
    assert "Charge (rho)" in document.one("section", id="release").text()


def test_a_step_recorded_in_another_unit_has_no_share(ledger):
    split = queries._charge_split([{"aggregate": "x", "mechanism": "discrete_laplace", "epsilon_exact": "1/2"}], "rho")
    assert split["aggregates"][0]["loss"] is None and split["total"] is None
    assert split["aggregates"][0]["steps"][0]["epsilon"] == "1/2"


def test_every_charges_table_names_the_accountants_unit(client, ledger):
    spend(ledger, "plain", "r1", "1/10")
    header = get_page(client, "/accounts/plain").one("table", id="charges").one("thead")
    assert "Charge (rho)" in header.text()
    run = get_page(client, "/runs/d/r1").one("table", id="run-charges").one("thead")
    assert "Charge (rho)" in run.text()
    assert client.get("/api/accounts/plain/charges").json()["unit"] == "rho"
