"""The dashboard's audit-chain status: ``verify_ledger`` in the background, cached, refreshed when stale, a
tampered ledger shown as such, and one check at a time per app."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import time
from fractions import Fraction

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.dashboard import audit_status
from dp_operators.dashboard.audit_status import SHOWN_PROBLEMS, AuditChainStatus
from dp_operators.ledger import Ledger, ReleaseKey, schema
from dashboard_auth import bearer
from ledger_backends import account_config, ledger_with


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def spent_ledger(url):
    ledger = ledger_with(url, a=account_config("pure_dp", epsilon="10", dags=("d",)))
    for run in ("r1", "r2"):
        reservation = ledger.reserve(ReleaseKey("d", run, "t", -1, "r"), account="a", amount=Fraction(1, 3),
                                     mechanisms=[], spec_hash="0" * 64)
        ledger.commit(reservation, {"run": run})
    return ledger


def test_first_status_is_pending_then_the_check_lands(ledger_url):
    status = AuditChainStatus(lambda: spent_ledger(ledger_url), interval=60)
    first = status.status()
    assert first["state"] == "pending" and first["checked_at"] is None
    done = status.wait(timeout=60)
    assert done["state"] == "ok" and done["problem_count"] == 0 and done["problems"] == []
    assert done["authenticated"] is False  # the dashboard holds no key
    assert (done["accounts"], done["charges"]) == (1, 2) and done["events"] >= 5
    assert done["checked_at"] and done["seconds"] >= 0 and done["running"] is False


def test_a_fresh_result_is_reused_and_a_stale_one_rechecked(ledger_url):
    ledger = spent_ledger(ledger_url)
    calls = []

    def factory():
        calls.append(1)
        return ledger

    clock = Clock()
    status = AuditChainStatus(factory, interval=60, clock=clock)
    status.wait(timeout=60)
    clock.now = 59
    assert status.status()["running"] is False and len(calls) == 1
    clock.now = 61
    status.wait(timeout=60)
    assert len(calls) == 2


def test_a_tampered_charge_is_shown_as_problems(ledger_url):
    ledger = spent_ledger(ledger_url)
    engine = sa.create_engine(ledger_url)
    try:  # an owner of the database drops the guard trigger and edits a committed charge's output
        with engine.begin() as conn:
            table = " ON dp_charges" if engine.dialect.name == "postgresql" else ""
            conn.execute(sa.text(f"DROP TRIGGER dp_charges_guard{table}"))
            conn.execute(sa.update(schema.charges).where(schema.charges.c.id == 1).values(output='{"run": "x"}'))
    finally:
        engine.dispose()
    result = AuditChainStatus(lambda: ledger).wait(timeout=60)
    assert result["state"] == "problems" and 2 <= result["problem_count"]
    assert 1 <= len(result["problems"]) <= SHOWN_PROBLEMS
    shown = "\n".join(result["problems"])
    assert "dp_charges id=1" in shown and "does not hash to the digest" in shown and "dp_charges_guard" in shown


def test_an_unreadable_ledger_is_an_error_not_a_crash(tmp_path, caplog):
    def broken():
        raise RuntimeError("database is down\nsecond line with details")

    with caplog.at_level("ERROR"):
        result = AuditChainStatus(broken).wait(timeout=60)
    # an error of no known kind: its type and a fixed text; the message only in the log
    assert result["state"] == "error" and result["error"] == "RuntimeError: an unexpected error"
    assert "database is down" in caplog.text


SECRET = "Pw-" + "5a0b" * 6


@pytest.mark.parametrize(
    "url, error, logged",
    [
        pytest.param(f"postgresql+psycopg://secret_user_y:{SECRET}@secret-host-y.invalid/secret_db_y",
                     "OperationalError: the database refused or failed the read", "secret-host-y.invalid",
                     id="unknown host"),
        pytest.param(f"postgresql+psycopg://secret_user_y@127.0.0.1:1/secret_db_y?password={SECRET}",
                     "OperationalError: the database refused or failed the read", "Connection refused",
                     id="connection refused"),
        pytest.param("sqlite:///{tmp}/secret_dir_y/empty.db",
                     "LedgerNotInitialisedError: the database has no ledger schema", "has no schema", id="no schema"),
    ],
)
def test_a_failed_check_shows_the_error_type_and_a_fixed_hint_never_the_message(tmp_path, caplog, url, error,
                                                                                logged):
    """Database errors name the host, login and database, and the schema check the URL (with a password given as a
    query parameter): the status shows none of it; the child's traceback goes to the log."""
    url = url.format(tmp=tmp_path)
    if url.startswith("sqlite"):
        (tmp_path / "secret_dir_y").mkdir()
        sqlite3.connect(tmp_path / "secret_dir_y" / "empty.db").close()
    ledger = Ledger(url)
    with caplog.at_level("ERROR"):
        result = AuditChainStatus(lambda: ledger).wait(timeout=60)
    assert result["state"] == "error" and result["error"].startswith(error), result["error"]
    shown = json.dumps(result)
    assert not [s for s in (SECRET, "secret_user_y", "secret-host-y", "secret_db_y", "secret_dir_y") if s in shown]
    assert "details" not in result  # the traceback is for the log only
    assert logged in caplog.text


def test_one_check_at_a_time(ledger_url):
    ledger = spent_ledger(ledger_url)
    gate, started = threading.Event(), []

    def slow():
        started.append(1)
        gate.wait(30)
        return ledger

    status = AuditChainStatus(slow, interval=60)
    for _ in range(5):
        assert status.status()["running"] is True
    gate.set()
    assert status.wait(timeout=60)["state"] == "ok"
    assert len(started) == 1


def test_the_check_runs_in_another_process(ledger_url, monkeypatch):
    """In a thread it would hold the api-server's GIL for seconds; the child gets the URL, never a Ledger."""
    from dp_operators.dashboard import audit_status

    seen = []
    real = audit_status._verify_in_child

    def spy(url):
        seen.append(url)
        return real(url)

    monkeypatch.setattr(audit_status, "_verify_in_child", spy)
    ledger = spent_ledger(ledger_url)
    assert AuditChainStatus(lambda: ledger).wait(timeout=60)["state"] == "ok"
    assert seen == [ledger.engine.url.render_as_string(hide_password=False)]


def test_a_child_that_dies_is_an_error(monkeypatch):
    from dp_operators.dashboard import audit_status

    monkeypatch.setattr(audit_status, "_verify_url", _die)  # pickled by name: the child runs _die
    with pytest.raises(RuntimeError, match="ended without an answer"):
        audit_status._verify_in_child("sqlite:///nowhere.db")


def _die(connection):
    import os

    os._exit(3)


def test_a_failed_check_is_retried_after_the_error_interval_not_the_full_one():
    calls, clock = [], Clock()

    def broken():
        calls.append(clock.now)
        raise RuntimeError("database is down")

    status = AuditChainStatus(broken, interval=300, clock=clock, error_retry=30)
    assert status.wait(timeout=60)["state"] == "error" and calls == [0.0]
    clock.now = 29
    assert status.status()["running"] is False and calls == [0.0]
    clock.now = 31
    status.wait(timeout=60)
    assert calls == [0.0, 31]


def test_recheck_makes_a_failed_check_stale_at_once_but_not_a_passed_one(ledger_url):
    ledger, clock, calls = spent_ledger(ledger_url), Clock(), []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database is down")
        return ledger

    status = AuditChainStatus(flaky, interval=300, clock=clock, error_retry=30)
    assert status.wait(timeout=60)["state"] == "error"
    status.recheck()
    assert status.wait(timeout=60)["state"] == "ok" and len(calls) == 2  # no clock advance needed
    status.recheck()
    assert status.status()["running"] is False and len(calls) == 2


# ---- one check at a time, per app ------------------------------------------------------------------------------
def _verify_children() -> list[multiprocessing.Process]:
    """The audit-check child processes alive now."""
    return [p for p in multiprocessing.active_children() if p.name == "dp-budget-verify" and p.is_alive()]


def test_a_flood_of_requests_runs_one_audit_check_at_a_time(hostile, token, monkeypatch):
    """Requests from many clients while checks are stale start checks one after another, never two at once."""
    running, most, started = [0], [0], [0]
    lock = threading.Lock()
    real = audit_status._verify_in_child

    def counted(url):
        with lock:
            running[0] += 1
            started[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return real(url)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(audit_status, "_verify_in_child", counted)
    app = dashboard_app.create_app(lambda: hostile, verify_interval=0)
    children = []
    stop = threading.Event()
    earlier = _verify_children()  # checks other tests' apps left running are not this app's
    for child in earlier:
        child.join(120)

    def sample():
        while not stop.is_set():
            children.append(len(_verify_children()))
            time.sleep(0.01)

    with TestClient(app, headers=bearer(token)) as client:
        sampler = threading.Thread(target=sample)
        sampler.start()

        deadline = time.monotonic() + 120  # bounds a hang only

        def hammer():
            # at least 8 rounds, and on until checks have started again and again, however slow the machine
            rounds = 0
            while rounds < 8 or (started[0] < 3 and time.monotonic() < deadline):
                client.get("/api/audit-chain")
                client.get("/accounts/census")
                rounds += 1

        threads = [threading.Thread(target=hammer) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stop.set()
        sampler.join()
        status = app.state.verify._status
        status._interval = 3600  # no further check: the last one ends with the test
        status.wait(timeout=120)
    assert started[0] >= 3  # the flood did start checks again and again
    assert most[0] == 1, most[0]
    assert max(children) <= 1, max(children)


def test_each_app_instance_runs_its_own_check(hostile, token, monkeypatch):
    """The one-at-a-time lock is per app: four apps run four checks at once."""
    # A limit of the design, pinned: the api-server runs one app per worker process ([api] workers, 4 by default), so a
    # deployment runs up to that many checks at once.
    gate, inside, most = threading.Event(), [0], [0]
    entered = threading.Condition()

    def slow(url):
        with entered:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            entered.notify_all()
        gate.wait(120)
        with entered:
            inside[0] -= 1
        return {"state": "ok"}

    monkeypatch.setattr(audit_status, "_verify_in_child", slow)
    apps = [dashboard_app.create_app(lambda: hostile, verify_interval=0) for _ in range(4)]
    clients = [TestClient(app, headers=bearer(token)) for app in apps]
    for client in clients:
        client.get("/api/audit-chain")
    with entered:  # every app's check inside at once, or the deadline (which only bounds a hang) passes
        entered.wait_for(lambda: inside[0] == len(apps), timeout=120)
    gate.set()
    for app in apps:
        app.state.verify._status.wait(timeout=120)
    assert most[0] == len(apps)
