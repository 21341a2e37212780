"""The dashboard's pages and JSON routes over rows planted as the tables' owner (raw SQL, guard triggers bypassed):
each hostile row is shown as unreadable, by id (an account by name), and every other row as usual; no page fails
(500) or hangs, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import re
from fractions import Fraction

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from dp_operators.ledger import schema
from dashboard_apps import dashboard, reserve
from dashboard_auth import bearer
from ledger_backends import account_config, ledger_with

DEEP = "[" * 200_000 + "]" * 200_000


def _owner_sql(url: str, *statements: tuple[str, dict]) -> None:
    """Run ``statements`` as the tables' owner past the guard triggers (SQLite: dropped and re-created;
    PostgreSQL: a replica session)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            sqlite = engine.dialect.name == "sqlite"
            if sqlite:
                for (name,) in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'").all():
                    conn.exec_driver_sql(f"DROP TRIGGER {name}")
            else:
                conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            for statement, parameters in statements:
                conn.execute(sa.text(statement), parameters)
            if sqlite:
                for statement in schema.trigger_ddl("sqlite"):
                    conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


@pytest.fixture
def hostile_ledger(ledger_url):
    """Account ``census`` with five committed charges, then: charge 2's amount ``1e-99999999``, charge 3's
    mechanisms nested 200,000 deep, charge 4's output nested 200,000 deep; account ``other`` with spent of 400
    digits."""
    ledger = ledger_with(ledger_url, census=account_config("pure_dp", epsilon="10"),
                         other=account_config("pure_dp", epsilon="1"))
    ids = []
    for run in ("r1", "r2", "r3", "r4", "r5"):
        reservation = reserve(ledger, "census", run)
        ledger.commit(reservation, {"run": run})
        ids.append(reservation.charge_id)
    ledger.commit(reserve(ledger, "other", "o1"), {"run": "o1"})
    _owner_sql(
        ledger_url,
        ("UPDATE dp_charges SET amount = :value WHERE id = :id", {"value": "1e-99999999", "id": ids[1]}),
        ("UPDATE dp_charges SET mechanisms = :value WHERE id = :id", {"value": DEEP, "id": ids[2]}),
        ("UPDATE dp_charges SET output = :value WHERE id = :id", {"value": DEEP, "id": ids[3]}),
        ("UPDATE dp_budget_accounts SET spent = :value WHERE name = 'other'", {"value": "9" * 400}),
    )
    return ledger, ids


@pytest.fixture
def client(hostile_ledger, token):
    ledger, _ = hostile_ledger
    with TestClient(dashboard(ledger), headers=bearer(token)) as test_client:
        yield test_client


def test_the_overview_shows_an_unreadable_account_by_name_and_the_others_as_usual(client):
    """The account with a 400-digit spent is a row saying unreadable; the other account has its numbers."""
    accounts = client.get("/api/accounts").json()
    assert [a["name"] for a in accounts] == ["census", "other"]
    assert "unreadable" not in accounts[0] and accounts[0]["spent"] == "1/20"
    assert accounts[1]["spent"] is None
    assert accounts[1]["unreadable"][0].startswith("dp_budget_accounts 'other': spent '999")
    page = client.get("/")
    assert page.status_code == 200
    assert 'data-account="other" class="unreadable"' in page.text and "more than" not in page.text.split("other")[0]
    assert "is 400 characters long; a stored number has at most 122" in page.text


def test_the_account_page_lists_unreadable_charges_by_id_and_the_others_as_usual(client, hostile_ledger):
    """1e-99999999 and deep JSON in charges: their rows say unreadable (by id), the others show, nothing hangs."""
    _, ids = hostile_ledger
    charges = client.get("/api/accounts/census/charges").json()["charges"]
    assert [c["id"] for c in charges] == ids
    by_id = {c["id"]: c for c in charges}
    assert by_id[ids[1]]["unreadable"] == [
        "amount '1e-99999999' is not of the form p, -p or p/q in ASCII digits (str(Fraction))"]
    assert by_id[ids[2]]["unreadable"] == ["mechanisms nests deeper than 64 levels"]
    assert all("unreadable" not in by_id[i] for i in (ids[0], ids[3], ids[4]))
    page = client.get("/accounts/census")
    assert page.status_code == 200
    rows = re.findall(r'<tr data-charge-id="(\d+)" class="unreadable">', page.text)
    assert [int(i) for i in rows] == ids[1:3] and page.text.count("unreadable charge") == 2
    detail = client.get("/api/accounts/census").json()
    assert detail["charge_counts"]["total"] == 5 and detail["burn_down"]["points"]
    other = client.get("/accounts/other")
    assert other.status_code == 200 and 'id="account-unreadable"' in other.text
    assert client.get("/api/accounts/other").json()["forecast"] is None


def test_release_and_run_pages_show_unreadable_charges_without_failing(client, hostile_ledger):
    """A release whose output nests 200,000 deep, and one whose amount has a huge exponent, answer 200."""
    _, ids = hostile_ledger
    release = client.get(f"/api/releases/{ids[3]}").json()
    assert release["unreadable"] == ["output nests deeper than 64 levels"] and release["aggregates"] == []
    assert client.get(f"/releases/{ids[3]}").status_code == 200
    assert client.get(f"/api/releases/{ids[1]}").json()["amount"] is None
    assert "1e-99999999" in client.get(f"/releases/{ids[1]}").text
    run = client.get("/api/runs/d/r2").json()
    assert run["charges"][0]["unreadable"]
    page = client.get("/runs/d/r3")
    assert page.status_code == 200 and "unreadable charge" in page.text
    json.dumps(release, allow_nan=False)


def test_times_a_driver_cannot_return_are_unreadable_not_an_error(ledger_url, token):
    """A charge created at 'infinity' (PostgreSQL) or 'yesterday' (SQLite) is shown unreadable; the burn-down
    leaves it out."""
    ledger = ledger_with(ledger_url, census=account_config("pure_dp", epsilon="10"))
    first = reserve(ledger, "census", "r1")
    ledger.commit(first, {"run": "r1"})
    second = reserve(ledger, "census", "r2")
    ledger.commit(second, {"run": "r2"})
    value = "yesterday" if ledger.dialect == "sqlite" else "infinity"
    _owner_sql(ledger_url, ("UPDATE dp_charges SET created_at = :value WHERE id = :id",
                            {"value": value, "id": second.charge_id}))
    with TestClient(dashboard(ledger), headers=bearer(token)) as client:
        charges = client.get("/api/accounts/census/charges").json()["charges"]
        assert "unreadable" not in charges[0]
        assert charges[1]["created_at"] is None and charges[1]["unreadable"][0].startswith("created_at ")
        detail = client.get("/api/accounts/census").json()
        assert detail["burn_down"]["points"][-1]["charges"] == 1
        assert client.get("/accounts/census").status_code == 200
        assert client.get(f"/releases/{second.charge_id}").status_code == 200
    assert Fraction(detail["spent"]) == Fraction(2, 100)
    assert dt.datetime.fromisoformat(charges[0]["created_at"]).tzinfo is not None
