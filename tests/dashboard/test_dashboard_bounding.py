"""The dashboard shows, per charge, whether its contribution bounding was enforced by the operator or declared by
the spec's author (docs/ledger.md, "Requiring enforced contribution bounding"), from the mechanisms recorded with
the charge: the account's and the run's charges tables (a "Bounding" column), and the release page (the charge's
summary, and per aggregate with its source, unit column and SQL digest). A charge recorded before bounding was
recorded shows as declared. On SQLite and PostgreSQL."""

from __future__ import annotations

from fractions import Fraction

import pytest
from fastapi.testclient import TestClient

from dp_operators.ledger import ReleaseKey
from dashboard_apps import dashboard
from dashboard_auth import bearer
from ledger_backends import account_config, ledger_with
from test_pages import get_page

ENFORCED = {"mode": "enforced", "source": "table", "privacy_unit_column": "person_id", "sql_sha256": "cd" * 32}
DECLARED = {"mode": "declared", "source": "query", "privacy_unit_column": None, "sql_sha256": None}


def step(aggregate: str, bounding: dict | None) -> dict:
    described = {"aggregate": aggregate, "component": "value", "mechanism": "discrete_gaussian", "rho_exact": "1/20"}
    return described if bounding is None else {**described, "contribution_bounding": bounding}


RUNS = {
    "enforced": [step("by_origin", ENFORCED), step("by_carrier", ENFORCED)],
    "declared": [step("by_origin", DECLARED), step("by_carrier", DECLARED)],
    "mixed": [step("by_origin", ENFORCED), step("by_carrier", DECLARED)],
    "older": [step("by_origin", None)],  # recorded before contribution bounding was: declared
}


@pytest.fixture
def ledger(ledger_url):
    return ledger_with(ledger_url, plain=account_config("zcdp", cap=1, dags=("d",)))


@pytest.fixture
def charged(ledger) -> dict[str, int]:
    ids = {}
    for run, mechanisms in RUNS.items():
        reservation = ledger.reserve(ReleaseKey("d", run, "t", -1, "r"), account="plain", amount=Fraction(1, 10),
                                     mechanisms=mechanisms, spec_hash="0" * 64)
        ledger.commit(reservation, {"run": run})
        ids[run] = reservation.charge_id
    return ids


@pytest.fixture
def client(ledger, token):
    with TestClient(dashboard(ledger), headers=bearer(token)) as test_client:
        yield test_client


def _bounding_cells(table) -> dict[str, str]:
    return {tr.attrs["data-charge-id"]: tr.one("td", data_field="bounding").attrs["data-exact"]
            for tr in table.all("tr") if "data-charge-id" in tr.attrs}


def test_the_charges_tables_show_each_charges_bounding(client, charged):
    expected = {str(charged[run]): run if run != "older" else "declared" for run in RUNS}
    account = get_page(client, "/accounts/plain").one("table", id="charges")
    assert "Bounding" in account.one("thead").text()
    assert _bounding_cells(account) == expected
    for run in RUNS:
        table = get_page(client, f"/runs/d/{run}").one("table", id="run-charges")
        assert _bounding_cells(table) == {str(charged[run]): expected[str(charged[run])]}
    rows = client.get("/api/accounts/plain/charges").json()
    rows = rows["charges"] if isinstance(rows, dict) else rows
    assert {str(row["id"]): row["bounding"] for row in rows} == expected


def test_the_release_page_shows_the_bounding_of_each_aggregate(client, charged):
    mixed = client.get(f"/api/releases/{charged['mixed']}").json()
    assert mixed["bounding"] == "mixed"
    by_aggregate = {a["aggregate"]: (a["bounding_mode"], a["bounding"]) for a in mixed["charge_split"]["aggregates"]}
    assert by_aggregate == {
        "by_origin": ("enforced", "enforced (table, unit column person_id, SQL sha256 cdcdcdcdcdcd…)"),
        "by_carrier": ("declared", "declared (query)"),
    }
    document = get_page(client, f"/releases/{charged['mixed']}")
    assert document.one("section", id="release").one("td", data_field="bounding").attrs["data-exact"] == "mixed"
    table = document.one("table", id="charge-split-table")
    assert "Bounding" in table.one("thead").text()
    cells = {tr.attrs["data-aggregate"]: tr.one("td", data_field="bounding") for tr in table.all("tr")
             if "data-aggregate" in tr.attrs}
    assert cells["by_origin"].attrs["data-exact"] == "enforced" and "person_id" in cells["by_origin"].text()
    assert cells["by_carrier"].attrs["data-exact"] == "declared"
    older = get_page(client, f"/releases/{charged['older']}")
    assert older.one("section", id="release").one("td", data_field="bounding").attrs["data-exact"] == "declared"
