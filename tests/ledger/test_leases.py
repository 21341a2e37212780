"""Reservation leases and lock limits, on SQLite and PostgreSQL unless a test says otherwise.

A reservation's lease keeps other tries of the same release key out while its owner draws: renewing needs the
token, the lease keeper renews while the block runs, a commit after the lease lapsed still succeeds if nobody took
the key over, and reconcile abandons only expired reservations. SQLite readers never wait for the write lock;
PostgreSQL sessions give up a lock wait after ``lock_timeout`` and are ended when idle inside a transaction.

No test measures elapsed time: each waits for an event (a renewal, a lock timeout, a session ended) with a deadline
that only bounds a hang (:data:`HANG`), and counts what happened.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.ledger import ChargeStateError, LeaseHeldError, Ledger, ReleaseKey, Reservation
from dp_operators.ledger import spend, store
from ledger_backends import account_config, ledger_with
from support import governor, spender

AMOUNT = Fraction(1, 10)
#: Seconds after which a wait for an event counts as a hang (never the assertion itself).
HANG = 120


def key(run: str = "run-1") -> ReleaseKey:
    return ReleaseKey("d", run, "t", -1, "r")


def reserve(ledger: Ledger, run: str = "run-1") -> Reservation:
    reservation = ledger.reserve(key(run), account="a", amount=AMOUNT, mechanisms=[], spec_hash="0" * 64)
    assert isinstance(reservation, Reservation)
    return reservation


def stored(ledger: Ledger, charge_id: int) -> dict:
    (charge,) = [c for c in ledger.charges() if c["id"] == charge_id]
    return charge


def lease_end(ledger: Ledger, charge_id: int) -> dt.datetime:
    value = stored(ledger, charge_id)["lease_expires_at"]
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def wait_past(moment: dt.datetime) -> None:
    while dt.datetime.now(dt.timezone.utc) <= moment:
        time.sleep(0.02)
    time.sleep(0.05)


def events(ledger: Ledger) -> list[str]:
    return [e["event"] for e in ledger.events("a")]


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(lambda r: dataclasses.replace(r, token="x" * 43), id="wrong token"),
        pytest.param(lambda r: dataclasses.replace(r, token=""), id="no token"),
        pytest.param(lambda r: dataclasses.replace(r, attempt=2), id="wrong attempt"),
        pytest.param(lambda r: dataclasses.replace(r, key=key("run-2")), id="another key"),
        pytest.param(lambda r: dataclasses.replace(r, account="b"), id="another account"),
    ],
)
def test_only_the_owner_can_renew_a_lease(ledger_url, forged):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1), b=account_config("pure_dp", cap=1))
    reservation = reserve(ledger)
    before = lease_end(ledger, reservation.charge_id)
    with pytest.raises(ChargeStateError, match="is not this reservation's"):
        ledger.renew(forged(reservation))
    assert lease_end(ledger, reservation.charge_id) == before
    renewed = ledger.renew(reservation)  # the owner can
    assert renewed >= before and lease_end(ledger, reservation.charge_id) == renewed
    assert events(ledger) == ["account_created", "reserved"]  # renewals are not audit events


@pytest.mark.parametrize("ending", ["taken over", "reconciled", "committed", "released", "abandoned by its owner"])
def test_a_lease_cannot_be_renewed_once_the_charge_is_no_longer_reserved(ledger_url, ending):
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    ledger = spender(ledger_url, lease_seconds=0.2)
    reservation = reserve(ledger)
    if ending in ("taken over", "reconciled"):
        wait_past(lease_end(ledger, reservation.charge_id))
        if ending == "taken over":
            assert reserve(ledger).attempt == 2
        else:
            assert [c["id"] for c in ledger.reconcile()] == [reservation.charge_id]
    elif ending == "committed":
        ledger.commit(reservation, {"value": 1})
    elif ending == "released":
        ledger.release(reservation)
    else:
        ledger.abandon(reservation)
    state = stored(ledger, reservation.charge_id)["state"]
    with pytest.raises(ChargeStateError, match=f"is {state}, no longer reserved"):
        ledger.renew(reservation)


def test_a_second_try_is_refused_while_the_lease_is_live_and_charged_nothing(ledger_url):
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    first, second = spender(ledger_url), spender(ledger_url)
    reservation = reserve(first)
    running = r"attempt 1 of release 'r' \(run 'run-1', task 't'\) is still running"
    with pytest.raises(LeaseHeldError, match=running) as held:
        reserve(second)
    assert held.value.attempt == 1 and held.value.expires_at == lease_end(first, reservation.charge_id)
    assert "nothing was charged" in str(held.value)
    assert first.account("a").spent == AMOUNT and len(list(first.charges())) == 1
    assert events(first) == ["account_created", "reserved"]  # no refusal recorded: a live try is not a refusal
    first.commit(reservation, {"value": 1})
    assert reserve_or_replay(second) == {"value": 1}  # the next try replays


def reserve_or_replay(ledger: Ledger, run: str = "run-1"):
    return ledger.reserve(key(run), account="a", amount=AMOUNT, mechanisms=[], spec_hash="0" * 64)


def test_the_lease_keeper_renews_through_a_draw_longer_than_the_lease(ledger_url, monkeypatch):
    """While the block runs the lease is renewed past its length and other tries are refused; then renewals stop."""
    # Lease 1.5 s, renewed every 0.5 s: after each of 4 renewals (2 s, longer than the lease) a second try is
    # refused and the stored lease has moved. Once the block is left no renewal happens: the lease lapses and a
    # later try takes the key over.
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    owner, other = spender(ledger_url, lease_seconds=1.5), spender(ledger_url)
    reservation = reserve(owner)
    renewed, real_renew = threading.Semaphore(0), owner.renew

    def counted_renew(res):
        result = real_renew(res)
        renewed.release()
        return result

    monkeypatch.setattr(owner, "renew", counted_renew)
    ends, refusals = [lease_end(owner, reservation.charge_id)], 0
    with owner.lease(reservation):
        for _ in range(4):
            assert renewed.acquire(timeout=HANG)
            with pytest.raises(LeaseHeldError):
                reserve(other)
            refusals += 1
            ends.append(lease_end(owner, reservation.charge_id))
    assert refusals == 4
    assert len(set(ends)) == 5 and ends == sorted(ends)  # every renewal moved the lease on
    assert [c["state"] for c in owner.charges()] == ["reserved"] and owner.account("a").spent == AMOUNT
    final = lease_end(owner, reservation.charge_id)
    wait_past(final)
    assert not renewed.acquire(blocking=False)  # the keeper stopped with the block
    assert lease_end(owner, reservation.charge_id) == final
    taken = reserve(other)
    assert taken.attempt == 2
    with pytest.raises(ChargeStateError, match="is abandoned, no longer reserved"):
        owner.commit(reservation, {"value": 1})
    assert [(c["attempt"], c["state"]) for c in owner.charges()] == [(1, "abandoned"), (2, "reserved")]
    assert owner.account("a").spent == 2 * AMOUNT


def wait_for_log(caplog, text: str) -> None:
    """Until ``text`` has been logged (the lease keeper logs from its own thread)."""
    deadline = time.monotonic() + HANG
    while text not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.02)


def test_the_lease_keeper_stops_when_the_charge_is_no_longer_its_own(ledger_url, caplog):
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    ledger = spender(ledger_url, lease_seconds=0.3)
    reservation = reserve(ledger)
    with caplog.at_level(logging.WARNING, logger="dp_operators.ledger.spend"):
        with ledger.lease(reservation):
            ledger.release(reservation)  # the next renewal finds the charge released
            wait_for_log(caplog, "the reservation's lease is no longer renewed")
    assert caplog.text.count("the reservation's lease is no longer renewed: charge 1 ") == 1
    assert "is released, no longer reserved" in caplog.text
    assert reservation.token not in caplog.text


def test_the_lease_keeper_retries_a_transient_failure_and_logs_only_its_type(ledger_url, caplog, monkeypatch):
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    ledger = spender(ledger_url, lease_seconds=0.3)
    reservation = reserve(ledger)
    real_renew, failures, renewed = ledger.renew, [], threading.Event()

    def flaky(res):
        if len(failures) < 2:
            failures.append(1)
            raise ConnectionError(f"lost {res.token}")
        result = real_renew(res)
        renewed.set()
        return result

    monkeypatch.setattr(ledger, "renew", flaky)
    before = lease_end(ledger, reservation.charge_id)
    with caplog.at_level(logging.WARNING, logger="dp_operators.ledger.spend"):
        with ledger.lease(reservation):
            assert renewed.wait(HANG)  # the first renewal after the two failures
    assert len(failures) == 2
    assert "the reservation's lease could not be renewed (ConnectionError); retrying" in caplog.text
    assert reservation.token not in caplog.text
    assert lease_end(ledger, reservation.charge_id) > before  # renewed after the failures


def test_a_commit_after_the_own_lease_expired_succeeds_while_nobody_took_over(ledger_url):
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    ledger = spender(ledger_url, lease_seconds=0.2)
    late, renewed_late = reserve(ledger, "run-1"), reserve(ledger, "run-2")
    wait_past(max(lease_end(ledger, late.charge_id), lease_end(ledger, renewed_late.charge_id)))
    ledger.commit(late, {"value": 1})
    assert ledger.renew(renewed_late) > dt.datetime.now(dt.timezone.utc)  # a late renewal takes the lease back
    ledger.commit(renewed_late, {"value": 2})
    assert [c["state"] for c in ledger.charges()] == ["committed", "committed"]
    assert ledger.stored_output(key("run-1")) == {"value": 1}
    assert ledger.account("a").spent == 2 * AMOUNT and ledger.account("a").reserved == 0


def test_reconcile_abandons_only_expired_reservations(ledger_url):
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    short, long = spender(ledger_url, lease_seconds=0.2), spender(ledger_url, lease_seconds=120)
    expired = reserve(short, "expired")
    live = reserve(long, "live")
    committed = reserve(short, "committed")
    released = reserve(short, "released")
    wait_past(lease_end(short, released.charge_id))
    short.commit(committed, {"value": 1})  # expired first, then committed: not reconcile's business
    short.release(released)
    (abandoned,) = long.reconcile()
    assert (abandoned["id"], abandoned["run_id"], abandoned["attempt"]) == (expired.charge_id, "expired", 1)
    assert Fraction(abandoned["amount"]) == AMOUNT
    states = {c["run_id"]: c["state"] for c in long.charges()}
    assert states == {"expired": "abandoned", "live": "reserved", "committed": "committed", "released": "released"}
    assert long.reconcile() == []
    assert long.account("a").spent == 3 * AMOUNT  # the abandoned charge stays spent; only the released came back
    long.commit(live, {"value": 2})  # the live reservation's owner is untouched
    with pytest.raises(ChargeStateError, match="is abandoned"):
        short.commit(expired, {"value": 3})


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_sqlite_readers_do_not_wait_for_a_writer(ledger_url):
    """A writer holds the write lock (``BEGIN IMMEDIATE`` and an update, uncommitted) on a raw connection; a fresh
    ``Ledger``'s reads (its first call included: the schema check) finish while it holds it, seeing the committed
    state."""
    seeded = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    reservation = reserve(seeded)
    seeded.commit(reservation, {"value": 1})
    writer = sqlite3.connect(ledger_url.removeprefix("sqlite:///"), isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE dp_budget_accounts SET owner = 'writer' WHERE name = 'a'")
    results: dict = {}

    def read() -> None:
        fresh = Ledger(ledger_url)
        results["account"] = fresh.account("a")
        results["charges"] = list(fresh.charges())
        results["events"] = list(fresh.events("a"))
        results["output"] = fresh.stored_output(key())

    try:
        # the writer keeps its lock until the reader is done: a reader that waited for it would never finish
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout=HANG)
        assert not reader.is_alive(), "a reader waited for the writer's lock"
        assert "output" in results, "a reader failed while the writer held its lock"
    finally:
        writer.rollback()
        writer.close()
    assert results["account"].spent == AMOUNT and results["account"].owner is None  # committed state only
    assert [c["state"] for c in results["charges"]] == ["committed"] and results["output"] == {"value": 1}
    assert [e["event"] for e in results["events"]] == ["account_created", "reserved", "committed"]


class LockTimeouts:
    """Lock-timeout errors (SQLSTATE 55P03) raised by any engine's statements, counted as they happen."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def __call__(self, context) -> None:
        self.seen(context.original_exception)

    def seen(self, error: BaseException) -> None:
        if getattr(error, "sqlstate", None) == "55P03":
            with self._changed:
                self.count += 1
                self._changed.notify_all()

    def wait_for(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.count >= count, timeout=HANG), self.count


@pytest.fixture
def lock_timeouts(monkeypatch) -> Iterator[LockTimeouts]:
    """Counts the lock timeouts of the test: a ``handle_error`` listener on every engine, and the spend calls'
    errors (they go to the driver directly, past SQLAlchemy's events: ``Ledger._driver_call``)."""
    counter = LockTimeouts()
    sa.event.listen(sa.engine.Engine, "handle_error", counter)
    call = spend.Ledger._driver_call

    def counted(self, name, params):
        try:
            return call(self, name, params)
        except sa.exc.DBAPIError as error:
            counter.seen(error.orig)
            raise

    monkeypatch.setattr(spend.Ledger, "_driver_call", counted)
    yield counter
    sa.event.remove(sa.engine.Engine, "handle_error", counter)


def wait_until_session_ended(url: str, pid: int) -> None:
    """Until the PostgreSQL session ``pid`` is gone from ``pg_stat_activity``."""
    engine = sa.create_engine(url)
    deadline = time.monotonic() + HANG
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if not conn.exec_driver_sql(f"SELECT 1 FROM pg_stat_activity WHERE pid = {int(pid)}").first():
                    return
            time.sleep(0.05)
        raise AssertionError(f"session {pid} still open after {HANG} s")
    finally:
        engine.dispose()


def _terminate_pooled_session(ledger: Ledger, url: str) -> int:
    """End, from another session, the server session of the connection ``ledger``'s pool holds; returns its pid."""
    pooled = ledger.engine.raw_connection()
    pid = pooled.driver_connection.info.backend_pid
    pooled.close()
    admin = sa.create_engine(url)
    try:
        with admin.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})").scalar()
    finally:
        admin.dispose()
    wait_until_session_ended(url, pid)
    return pid


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("ping_after_idle", [3600.0, 0.0], ids=["retried", "pinged"])
def test_postgresql_a_spend_call_on_a_dead_pooled_connection_reconnects(ledger_url, monkeypatch, ping_after_idle):
    """A spend call sends one statement, without the pool's ping, when its connection was used less than
    PG_PING_AFTER_IDLE_S ago. If the server ended that session meanwhile, the call is retried on a new connection
    (one statement in autocommit: safe to send again); a connection idle longer is pinged and replaced before use.
    Either way the commit lands once."""
    monkeypatch.setattr(store, "PG_PING_AFTER_IDLE_S", ping_after_idle)
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    reservation = reserve(ledger)
    pid = _terminate_pooled_session(ledger, ledger_url)
    ledger.commit(reservation, {"value": 1})
    pooled = ledger.engine.raw_connection()
    try:
        assert pooled.driver_connection.info.backend_pid != pid
    finally:
        pooled.close()
    assert [(c["attempt"], c["state"]) for c in ledger.charges()] == [(1, "committed")]
    assert ledger.account("a").spent == AMOUNT


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_postgresql_a_commit_whose_reply_was_lost_is_not_reported_as_taken_over(ledger_url, monkeypatch):
    """dp_commit lands, then its reply is lost with the connection: the retry is refused (the charge is no longer
    reserved), and the commit must still report success, not "another attempt took over", so the release publishes
    what the ledger holds. A reservation whose charge another attempt committed is still refused."""
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    reservation = reserve(ledger)
    call = spend.Ledger._driver_call
    lost = []

    def reply_lost_once(self, name, params):
        result = call(self, name, params)
        if name == "dp_commit" and not lost:
            lost.append(result)
            raise sa.exc.OperationalError("SELECT dp_commit(...)", {}, Exception("server closed the connection"),
                                          connection_invalidated=True)
        return result

    monkeypatch.setattr(spend.Ledger, "_driver_call", reply_lost_once)
    digest = ledger.commit(reservation, {"value": 1})
    assert lost and lost[0]["output_digest"] == digest
    assert [(c["attempt"], c["state"]) for c in ledger.charges()] == [(1, "committed")]
    stale = dataclasses.replace(reservation, token="not-this-reservations-token")
    with pytest.raises(ChargeStateError):
        ledger.commit(stale, {"value": 1})


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_postgresql_sessions_set_the_lock_and_idle_timeouts(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    with ledger.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "10s"
        assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "1min"


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_postgresql_a_held_account_lock_makes_reserve_time_out_and_retry_not_hang(ledger_url, monkeypatch,
                                                                                   lock_timeouts):
    """A held account row makes reserve give up after its retries (55P03), or wait through lock timeouts for it."""
    # Another session holds the account row (FOR UPDATE in an open transaction). With a lock timeout of 200 ms, a
    # reserve with 2 retries fails after 3 lock timeouts, nothing charged; a reserve with the usual retries meets
    # timeouts while the lock is held and succeeds once it is released. Counted: lock timeouts, not seconds.
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    monkeypatch.setattr(store, "PG_LOCK_TIMEOUT_MS", 200)
    blocker = sa.create_engine(ledger_url)
    timeouts = lock_timeouts
    try:
        with blocker.connect() as holding:
            holding.begin()
            holding.exec_driver_sql("SELECT name FROM dp_budget_accounts WHERE name = 'a' FOR UPDATE")
            impatient = spender(ledger_url, max_retries=2)
            with impatient.engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "200ms"
            with pytest.raises(sa.exc.OperationalError) as timed_out:
                reserve(impatient)
            assert timed_out.value.orig.sqlstate == "55P03"  # lock_not_available
            assert timeouts.count == 3  # the first try and its 2 retries

            patient: dict = {}

            def reserve_patiently() -> None:
                patient["reservation"] = reserve(spender(ledger_url))

            waiting = threading.Thread(target=reserve_patiently, daemon=True)
            waiting.start()
            timeouts.wait_for(3 + 2)  # two lock timeouts of the patient reserve, each retried
            assert waiting.is_alive()
            holding.rollback()
        waiting.join(timeout=HANG)
        assert not waiting.is_alive()
        assert patient["reservation"].attempt == 1 and timeouts.count >= 3 + 2
    finally:
        blocker.dispose()
    ledger = spender(ledger_url)
    assert [(c["attempt"], c["state"]) for c in ledger.charges()] == [(1, "reserved")]
    assert ledger.account("a").spent == AMOUNT


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_postgresql_a_session_idle_in_its_transaction_is_ended_and_frees_the_account(ledger_url, monkeypatch,
                                                                                     lock_timeouts):
    """A hung worker (idle inside a transaction holding the account row) is ended by the server after
    ``idle_in_transaction_session_timeout``, so other workers can reserve again."""
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    monkeypatch.setattr(store, "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS", 300)
    hung_engine = store.create_ledger_engine(ledger_url)
    try:
        with hung_engine.connect() as hung:
            # the SHOW begins the transaction (SQLAlchemy's autobegin), the lock is taken in it
            assert hung.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "300ms"
            hung.exec_driver_sql("SELECT name FROM dp_budget_accounts WHERE name = 'a' FOR UPDATE")
            pid = hung.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            wait_until_session_ended(ledger_url, pid)  # idle inside the transaction: the server ends it
            reservation = reserve(spender(ledger_url))
            assert lock_timeouts.count == 0  # the account row was free: no lock wait at all
            with pytest.raises(sa.exc.DBAPIError, match="idle-in-transaction timeout"):
                hung.exec_driver_sql("SELECT 1")  # the hung worker's session is gone (its transaction rolled back)
    finally:
        hung_engine.dispose()
    assert reservation.attempt == 1


def test_a_retry_charged_to_another_account_leaves_the_dead_reservation_to_its_own_accounts_reconcile(ledger_url):
    """The spec's budget account changed between tries: the retry on the new account neither replays, waits for nor
    takes over the other account's charge of the key (another team could hold one); the dead try stays spent on its
    own account until its reconcile abandons it in that account's chain, and verify passes."""
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1), b=account_config("pure_dp", cap=1))
    ledger = spender(ledger_url, lease_seconds=0.2)
    dead = reserve(ledger)
    wait_past(lease_end(ledger, dead.charge_id))
    retry = ledger.reserve(key(), account="b", amount=AMOUNT, mechanisms=[], spec_hash="0" * 64)
    ledger.commit(retry, {"value": 1})
    assert [(e["account"], e["event"]) for e in ledger.events() if e["charge_id"] == dead.charge_id] == [
        ("a", "reserved")]
    assert [done["id"] for done in ledger.reconcile()] == [dead.charge_id]
    assert [(e["account"], e["event"]) for e in ledger.events() if e["charge_id"] == dead.charge_id] == [
        ("a", "reserved"), ("a", "abandoned")]
    assert ledger.account("a").spent == AMOUNT and ledger.account("b").spent == AMOUNT
    report = governor(ledger_url).verify()
    assert report.ok, report.problems


def test_a_release_key_committed_on_another_account_is_not_replayed_or_waited_for(ledger_url):
    """Another account's charges of the same release key (another team whose DAG id is allowed on an account of
    its own) are neither replayed nor waited for: this account charges its own reservation and replays only it."""
    from dp_operators.ledger import Reservation

    ledger_with(ledger_url, a=account_config("pure_dp", cap=1), b=account_config("pure_dp", cap=1))
    ledger = spender(ledger_url)
    other = ledger.reserve(key(), account="a", amount=AMOUNT, mechanisms=[], spec_hash="0" * 64)
    live = ledger.reserve(key(), account="b", amount=AMOUNT, mechanisms=[], spec_hash="0" * 64)
    assert isinstance(live, Reservation) and live.attempt == other.attempt + 1  # not LeaseHeldError
    ledger.commit(other, {"chosen_by": "a"})
    assert ledger.authenticated_output(key(), "b") is None
    ledger.commit(live, {"chosen_by": "b"})
    assert ledger.authenticated_output(key(), "b") == {"chosen_by": "b"}
    assert ledger.reserve(key(), account="b", amount=AMOUNT, mechanisms=[], spec_hash="0" * 64) == {"chosen_by": "b"}
    assert ledger.account("a").spent == AMOUNT and ledger.account("b").spent == AMOUNT
    assert governor(ledger_url).verify().ok


@pytest.mark.parametrize("end", ["9999-12-31 00:00:00", "infinity"])
def test_a_lease_pushed_into_the_far_future_is_refused_by_the_database(ledger_url, end):
    """The spender's column grant covers the lease: the guard trigger refuses a lease end more than
    MAX_LEASE_SECONDS ahead, so nobody can block a release key for ever."""
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    ledger = spender(ledger_url)
    reservation = reserve(ledger)
    engine = sa.create_engine(ledger_url)
    with pytest.raises(sa.exc.DatabaseError, match="at most MAX_LEASE_SECONDS ahead"):
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE dp_charges SET lease_expires_at = '{end}' WHERE id = {reservation.charge_id}")
    engine.dispose()


def test_a_lease_beyond_the_maximum_counts_as_expired(ledger_url, monkeypatch):
    """A lease end the ledger never grants (written with the trigger out of the way) does not hold the key."""
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    ledger = spender(ledger_url)
    reservation = reserve(ledger)
    far = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=30)
    with ledger.engine.begin() as conn:
        if ledger.dialect == "sqlite":
            conn.exec_driver_sql("DROP TRIGGER dp_charges_guard")
        else:
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        conn.execute(sa.update(store.schema.charges).where(store.schema.charges.c.id == reservation.charge_id)
                     .values(lease_expires_at=far))
    reconciled = ledger.reconcile()
    assert [row["id"] for row in reconciled] == [reservation.charge_id]
    assert ledger.account("a").spent == AMOUNT  # abandoned, still spent


def _age(ledger_url: str, charge_id: int, monkeypatch, hours: float) -> None:
    """Make charge ``charge_id`` ``hours`` old on the ledger's clock: on PostgreSQL its created_at moved back (the
    guard triggers skipped, as the server's superuser may), on SQLite the clock the ledger reads moved ahead."""
    if ledger_url.startswith("sqlite"):
        real = Ledger._db_now
        monkeypatch.setattr(Ledger, "_db_now", lambda self, conn: real(self, conn) + dt.timedelta(hours=hours))
        return
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        conn.execute(sa.text("UPDATE dp_charges SET created_at = created_at - make_interval(secs => :s) "
                             "WHERE id = :id"), {"s": hours * 3600, "id": charge_id})
    engine.dispose()


def test_a_reservation_holds_its_key_for_six_hours_at_most(ledger_url, monkeypatch):
    """A try hung with its keeper thread alive, or a reservation of another task's release key, keeps renewing its
    lease: past MAX_RESERVATION_HOLD_SECONDS the ledger refuses the renewal, so the lease runs out and another
    attempt may take the release over. A younger reservation renews as before."""
    from dp_operators.ledger.schema import MAX_RESERVATION_HOLD_SECONDS

    assert MAX_RESERVATION_HOLD_SECONDS == 6 * 3600
    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    holder = spender(ledger_url, lease_seconds=1)
    young, old = reserve(holder, "young"), reserve(holder, "old")
    holder.renew(young)  # a young reservation renews
    _age(ledger_url, old.charge_id, monkeypatch, 6.1)
    with pytest.raises(ChargeStateError, match=rf"charge {old.charge_id} has held its release key since .*longer than "
                       r"the ledger allows \(21600 s\): its lease is not renewed"):
        holder.renew(old)
    assert stored(holder, old.charge_id)["state"] == "reserved"  # nothing changed: the lease simply runs out
