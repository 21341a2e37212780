"""The dashboard's audit-chain status: ``verify_ledger`` in the background, cached, refreshed when stale, and a
tampered ledger shown as such."""

from __future__ import annotations

import json
import sqlite3
import threading
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.dashboard.audit_status import SHOWN_PROBLEMS, AuditChainStatus
from dp_operators.ledger import Ledger, ReleaseKey, schema
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
