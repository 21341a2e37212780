"""The SQLite spend path sends the ledger's statements to ``sqlite3`` directly (``ledger/sqlite_driver.py``): the
files it writes must be byte for byte those SQLAlchemy's ``Connection`` writes for the same calls, refusals and
errors included, and a driver error must look the same to callers (its class, the statement named, the
parameters hidden)."""

from __future__ import annotations

import datetime as dt
import itertools
import sqlite3
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.ledger import (
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    LeaseHeldError,
    ReleaseKey,
    chain,
    spend,
    store,
)
from dp_operators.ledger.chain import seq_taken
from dp_operators.ledger.errors import AuditChainError
from dp_operators.ledger.sqlite_driver import DriverConnection
from ledger_backends import account_config, ledger_with
from support import governor, spender

TABLES = ("dp_budget_accounts", "dp_charges", "dp_audit_events")


def _frozen_clock(monkeypatch) -> None:
    """Every timestamp and token the spend path makes, deterministic (one tick of a microsecond per reading)."""
    ticks = itertools.count()
    start = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)

    def now() -> dt.datetime:
        return start + dt.timedelta(microseconds=next(ticks))

    tokens = itertools.count()
    monkeypatch.setattr(chain, "now", now)
    monkeypatch.setattr(spend, "_utcnow", now)
    monkeypatch.setattr(store.LedgerBase, "_db_now", lambda self, conn: now())
    monkeypatch.setattr(spend.secrets, "token_urlsafe", lambda _: f"token-{next(tokens)}")


def _session(url: str) -> list[str]:
    """Reserve, commit, release, abandon, refusals of both kinds and a replay on a fresh ledger at ``url``; returns
    the outcomes in order."""
    ledger = spender(url, lease_seconds=60)
    outcomes = []

    def key(n: int, dag: str = "d") -> ReleaseKey:
        return ReleaseKey(dag, f"run-{n}", "t", -1, "r")

    def reserve(n: int, amount: str = "1/10", dag: str = "d"):
        return ledger.reserve(key(n, dag), account="a", amount=Fraction(amount), mechanisms=[{"m": n}],
                              spec_hash="0" * 64, try_number=1, audit={"run_type": "scheduled"})

    first = reserve(1)
    outcomes.append(ledger.commit(first, {"value": 1, "name": "é"}))
    outcomes.append(reserve(1))  # replay: the stored output
    ledger.release(reserve(2), audit={"triggering_user": "u"})
    ledger.abandon(reserve(3))
    held = reserve(4)
    with pytest.raises(LeaseHeldError):
        reserve(4)
    outcomes.append(ledger.renew(held).isoformat())
    for refused, error in (({"dag": "other"}, DagNotAllowedError), ({"amount": "5"}, BudgetExhaustedError)):
        with pytest.raises(error) as raised:
            reserve(5, **refused)
        outcomes.append(str(raised.value))
    with pytest.raises(ChargeStateError) as stale:
        ledger.commit(first, {"value": 2})
    outcomes.append(str(stale.value))
    return outcomes


def _copy(source, target) -> None:
    """A copy of the SQLite ledger ``source`` (its write-ahead log included: sqlite3's backup)."""
    with sqlite3.connect(source) as origin, sqlite3.connect(target) as copy:
        origin.backup(copy)
    origin.close()
    copy.close()


def _contents(path) -> dict[str, list[tuple]]:
    connection = sqlite3.connect(path)
    try:
        return {table: connection.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in TABLES}
    finally:
        connection.close()


def test_the_driver_path_writes_what_sqlalchemy_writes(tmp_path, monkeypatch):
    paths = {name: tmp_path / f"{name}.db" for name in ("driver", "sqlalchemy")}
    ledger_with(f"sqlite:///{paths['driver']}", a=account_config("pure_dp", cap=1)).engine.dispose()
    _copy(paths["driver"], paths["sqlalchemy"])  # the same start, governance events included
    _frozen_clock(monkeypatch)
    driver = _session(f"sqlite:///{paths['driver']}")
    with monkeypatch.context() as patched:  # the same calls through SQLAlchemy's Connection
        patched.setattr(store.LedgerBase, "_write_driver",
                        lambda self, work, retries=None, before=None: store.LedgerBase._write(
                            self, lambda conn: (before and before(conn)) or work(conn), retries=retries))
        _frozen_clock(patched)
        through_sqlalchemy = _session(f"sqlite:///{paths['sqlalchemy']}")
    assert driver == through_sqlalchemy
    written, expected = _contents(paths["driver"]), _contents(paths["sqlalchemy"])
    assert {table: len(rows) for table, rows in written.items()} == {
        "dp_budget_accounts": 1, "dp_charges": 4, "dp_audit_events": 10}
    for table in TABLES:
        for row, other in zip(written[table], expected[table]):
            assert row == other, [(i, a, b) for i, (a, b) in enumerate(zip(row, other)) if a != b]
    assert governor(f"sqlite:///{paths['driver']}").verify().ok


def test_a_changed_value_makes_the_files_differ(tmp_path, monkeypatch):
    """Negative control of the comparison above: a session with one different output does not compare equal."""
    paths = [tmp_path / "one.db", tmp_path / "two.db"]
    ledger_with(f"sqlite:///{paths[0]}", a=account_config("pure_dp", cap=1)).engine.dispose()
    _copy(paths[0], paths[1])
    _frozen_clock(monkeypatch)
    _session(f"sqlite:///{paths[0]}")
    _frozen_clock(monkeypatch)
    original = spend.Ledger.commit
    monkeypatch.setattr(spend.Ledger, "commit", lambda self, reservation, output, **kw: original(
        self, reservation, {**output, "value": -1} if output.get("value") == 1 else output, **kw))
    _session(f"sqlite:///{paths[1]}")
    assert _contents(paths[0])["dp_charges"] != _contents(paths[1])["dp_charges"]


def test_a_driver_error_names_its_statement_and_hides_its_parameters(tmp_path):
    path = tmp_path / "ledger.db"
    ledger_with(f"sqlite:///{path}", a=account_config("pure_dp", cap=1))
    ledger = spender(f"sqlite:///{path}")
    plans: dict = {}
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        driver = DriverConnection(connection, ledger.engine.dialect, plans)
        with pytest.raises(sa.exc.IntegrityError) as failed:
            driver.execute(spend._INSERT_CHARGE, {"account": "no-such-account-secret-value", "dag_id": "d"})
    finally:
        connection.close()
    text = str(failed.value)
    assert "INSERT INTO dp_charges" in text and "hidden due to hide_parameters" in text
    assert "no-such-account-secret-value" not in text


def test_a_sequence_number_taken_outside_the_ledger_is_named_and_nothing_is_written(tmp_path):
    """On SQLite the unique (account, account_seq) constraint finds a number a row the ledger did not write already
    holds (no read before each append); the refusal names that row, and the reservation is rolled back."""
    path = tmp_path / "ledger.db"
    ledger = ledger_with(f"sqlite:///{path}", a=account_config("pure_dp", cap=1))
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        seq = connection.execute("SELECT audit_seq FROM dp_budget_accounts WHERE name = 'a'").fetchone()[0]
        connection.execute(
            "INSERT INTO dp_audit_events (account, account_seq, event, spent_after, delta_spent_after, context, "
            "created_at, prev_hash, row_hash) VALUES ('a', ?, 'squat', '0', '0', '{}', 'x', 'p', 'h')", (seq + 1,))
        squatter = connection.execute("SELECT max(id) FROM dp_audit_events").fetchone()[0]
        before = _contents(path)
    finally:
        connection.close()
    with pytest.raises(AuditChainError) as refused:
        ledger.reserve(ReleaseKey("d", "r", "t", -1, "x"), account="a", amount=Fraction(1, 10), mechanisms=[],
                       spec_hash="0" * 64)
    assert str(refused.value) == str(seq_taken("a", squatter, seq + 1))
    assert _contents(path) == before
