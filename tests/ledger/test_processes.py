"""The ledger under real OS processes: a 16-process race for the last of a budget, 16 processes retrying the same
release keys at once (live tries are never charged twice), and SIGKILL mid-release (a dead try is taken over only
once its lease has expired, and its charge stays counted)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from fractions import Fraction
from pathlib import Path

import pytest

from dp_operators.ledger import ChargeStateError, Ledger, ReleaseKey, Reservation
from dp_operators.ledger.keys import SPEND_KEY_ENV
from ledger_backends import SQLITE_FAST, account_config, ledger_with
from support import SPEND_KEY, governor

WORKER = Path(__file__).with_name("ledger_worker.py")
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
    SPEND_KEY_ENV: SPEND_KEY.text,
}

#: Charge states that count as spent (``released`` returns the budget).
COUNTED = ("reserved", "committed", "abandoned")


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
    )


def _ready(workers: list[subprocess.Popen]) -> None:
    """Wait until every ``retries`` worker has imported and connected (its "ready" line)."""
    for worker in workers:
        line = worker.stdout.readline()
        assert line == "ready\n", worker.stderr.read()


def _collect(workers: list[subprocess.Popen], timeout: float = 300) -> list[dict]:
    outcomes: list[dict] = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=timeout)
        assert worker.returncode == 0, stderr
        outcomes += [json.loads(line) for line in stdout.splitlines()]
    return outcomes


def _verify(url: str) -> None:
    report = governor(url).verify()
    assert report.ok, report.problems


def _counted_per_key(ledger: Ledger, account: str) -> dict[str, list[tuple[int, str]]]:
    """``{run_id: [(attempt, state), ...]}`` of the charges that count as spent."""
    per_key: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for charge in ledger.charges(account=account):
        if charge["state"] in COUNTED:
            per_key[charge["run_id"]].append((charge["attempt"], charge["state"]))
    return dict(per_key)


def test_sixteen_processes_race_and_exactly_the_cap_is_committed(ledger_url, tmp_path):
    """400 attempts from 16 processes on a cap that fits exactly 100 charges of 1/100: exactly 100 commit, 300 are
    refused, nothing else goes wrong, and the committed charges add up to the cap."""
    ledger = ledger_with(ledger_url, race=account_config("pure_dp", cap=1))
    go = tmp_path / "go"
    workers = [_spawn("race", ledger_url, "race", str(n), "25", "1/100", str(go)) for n in range(16)]
    go.touch()
    outcomes = _collect(workers)

    counts = Counter(o["outcome"] for o in outcomes)
    assert [o["error"] for o in outcomes if o["outcome"] == "error"] == []
    assert counts == {"committed": 100, "refused": 300}
    committed = list(ledger.charges(account="race", state="committed"))
    assert len(committed) == 100 and list(ledger.charges(account="race", state="reserved")) == []
    assert sum(Fraction(c["amount"]) for c in committed) == Fraction(1)
    status = ledger.account("race")
    assert status.spent == status.cap == 1 and status.remaining == 0
    report = governor(ledger_url).verify()
    assert report.ok, report.problems
    assert report.events == 1 + 100 * 2 + 300  # created, reserved + committed per charge, one refusal each


#: The same-key race: PROCESSES processes in groups of TRIES; a group tries the same KEYS // (PROCESSES // TRIES)
#: release keys in the same order, so every key has TRIES tries running at once. Each try that reserves "draws"
#: for DRAW_SECONDS, longer than a lease of LEASE_SECONDS: only the lease keeper's renewals keep the others out.
PROCESSES, TRIES, KEYS = 16, 4, 16
DRAW_SECONDS, LEASE_SECONDS = 3.5, 3.0  # renewals every second: a keeper may stall 2 s


@pytest.mark.slow  # 64 tries in 16 processes, each drawing 3.5 s: a scale test (ADR 30); two live tries: test_leases.py
def test_live_tries_of_the_same_release_keys_are_charged_once(ledger_url, tmp_path):
    """16 processes, 16 release keys, 4 live tries of every key at once (Airflow running try 2 while try 1 still
    draws), on a cap that fits exactly one charge per key: every key is charged once; the other tries are refused
    with LeaseHeldError (nothing charged, no audit event) until the holder commits, then replay its output."""
    amount = Fraction(1, 100)
    ledger = ledger_with(ledger_url, retry=account_config("pure_dp", cap=str(KEYS * amount)))
    groups = PROCESSES // TRIES
    go = tmp_path / "go"
    workers = [
        _spawn(
            "retries", ledger_url, "retry", str(n),
            ",".join(f"key-{k}" for k in range(KEYS) if k % groups == n % groups),
            str(amount), str(DRAW_SECONDS), str(LEASE_SECONDS), str(go),
        )
        for n in range(PROCESSES)
    ]
    _ready(workers)  # every process imported and connected: the tries of a key really start together
    go.touch()
    outcomes = _collect(workers)

    assert [o["error"] for o in outcomes if o["outcome"] == "error"] == []
    by_key: dict[str, list[dict]] = defaultdict(list)
    for outcome in outcomes:
        by_key[outcome["run_id"]].append(outcome)
    assert sorted(by_key) == sorted(f"key-{k}" for k in range(KEYS))
    for run_id, tries in by_key.items():
        assert len(tries) == TRIES, run_id
        assert Counter(t["outcome"] for t in tries) == {"committed": 1, "replayed": TRIES - 1}, (run_id, tries)
        (holder,) = [t for t in tries if t["outcome"] == "committed"]
        # every try published the holder's output, and some try of the key met the live lease
        assert {(t["worker"], t["attempt"]) for t in tries} == {(holder["by"], 1)}, (run_id, tries)
        assert sum(t["lease_held"] for t in tries) >= 1, (run_id, tries)

    per_key = _counted_per_key(ledger, "retry")
    assert per_key == {f"key-{k}": [(1, "committed")] for k in range(KEYS)}
    status = ledger.account("retry")
    assert status.spent == status.cap == KEYS * amount and status.reserved == 0
    events = Counter(e["event"] for e in ledger.events("retry"))
    assert events == {"account_created": 1, "reserved": KEYS, "committed": KEYS}
    assert ledger.reconcile() == []
    _verify(ledger_url)
    refusals = sum(o["lease_held"] for o in outcomes)
    print(
        f"\n[{ledger.dialect}] same-key live tries: {PROCESSES} processes, {KEYS} keys, {len(outcomes)} tries "
        f"({TRIES} per key at once), {refusals} LeaseHeldError refusals, charges per key: "
        f"{sorted(Counter(len(v) for v in per_key.values()).items())}, draw {DRAW_SECONDS} s > lease "
        f"{LEASE_SECONDS} s"
    )


def _start_and_kill(
    ledger_url: str, run_id: str, stage: str, lease_seconds: float = 120
) -> tuple[int, str, dt.datetime]:
    """Run a worker that reserves (``drawn``: and draws noise; ``drawing``: and renews its lease), then SIGKILL
    it; return its charge id, token and first lease end."""
    worker = _spawn("crash", ledger_url, "crash", run_id, "1/10", stage, str(lease_seconds))
    try:
        line = worker.stdout.readline()
        assert line.startswith(stage), worker.stderr.read()
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    _, charge_id, token, lease_end = line.split()
    return int(charge_id), token, dt.datetime.fromisoformat(lease_end)


def _wait_past(moment: dt.datetime) -> None:
    while dt.datetime.now(dt.timezone.utc) <= moment:
        time.sleep(0.05)
    time.sleep(0.05)


@pytest.mark.parametrize(
    "stage",
    [pytest.param("reserved", id="killed right after reserving"),
     pytest.param("drawn", id="killed after drawing noise, before commit")],
)
def test_a_killed_release_stays_spent_and_a_rerun_is_charged_again(ledger_url, stage):
    ledger = ledger_with(ledger_url, crash=account_config("pure_dp", cap=1))
    charge_id, token, lease_end = _start_and_kill(ledger_url, "run-1", stage, lease_seconds=0.5)

    status = ledger.account("crash")
    assert status.spent == Fraction(1, 10) and status.reserved == Fraction(1, 10)
    (charge,) = ledger.charges()
    assert (charge["id"], charge["state"]) == (charge_id, "reserved")

    # Once its lease has expired, a rerun of the same key cannot know whether noise was drawn: the old charge
    # becomes abandoned (still spent) and the new attempt is charged before it may draw.
    _wait_past(lease_end)
    key = ReleaseKey("d", "run-1", "t", -1, "r")
    rerun = ledger.reserve(key, account="crash", amount=Fraction(1, 10), mechanisms=[], spec_hash="0" * 64)
    assert rerun.attempt == 2
    assert ledger.account("crash").spent == Fraction(2, 10)
    ledger.commit(rerun, {"value": 1})
    states = {c["attempt"]: c["state"] for c in ledger.charges()}
    assert states == {1: "abandoned", 2: "committed"}
    assert ledger.account("crash").spent == Fraction(2, 10) and ledger.account("crash").reserved == 0

    # A zombie of the killed attempt, even holding its token, cannot publish: its charge is no longer reserved.
    with pytest.raises(ChargeStateError, match="is abandoned, no longer reserved"):
        ledger.commit(Reservation(charge_id, key, "crash", Fraction(1, 10), 1, token=token), {"value": 0})
    events = [e["event"] for e in ledger.events("crash")]
    assert events == ["account_created", "reserved", "abandoned", "reserved", "committed"]
    _verify(ledger_url)


def test_ledger_objects_in_separate_processes_share_one_budget(ledger_url, tmp_path):
    """A reservation made by another process is visible at once to this one's budget check."""
    ledger_with(ledger_url, crash=account_config("pure_dp", cap="0.15"))
    _start_and_kill(ledger_url, "run-1", "reserved")
    fresh = Ledger(ledger_url)  # reading needs no key
    assert fresh.account("crash").remaining == Fraction(5, 100)
    _verify(ledger_url)


# 9-11 s of real leases: SQLITE_FAST; PostgreSQL's takeovers and dead sessions are in test_leases.py and
# test_takeover_amount.py, a killed release on both databases above
@SQLITE_FAST
def test_a_try_killed_mid_draw_is_taken_over_only_after_its_lease_expires(ledger_url, tmp_path):
    """Five tries are SIGKILLed while "drawing" under a renewed lease of 3 s. While they live (past the end of their
    first lease), two more tries of each of four of their keys are refused and reconcile finds nothing; after the
    kill, one of the two
    takes the key over (the dead try's charge abandoned, still counted: 2 charges) and the other replays it. The
    fifth key has no retry: it stays reserved until reconcile lists and abandons it."""
    # a lease of 3 s is renewed every second: a keeper stalled up to 2 s by a loaded machine still holds its key
    amount, lease = Fraction(1, 10), 3.0
    ledger = ledger_with(ledger_url, crash=account_config("pure_dp", cap=1))
    keys = [f"run-{k}" for k in range(4)]
    victims: dict[str, subprocess.Popen] = {}
    held: dict[str, tuple[int, str]] = {}
    first_lease_ends: list[dt.datetime] = []
    go = tmp_path / "go"
    retries: list[subprocess.Popen] = []
    try:
        for run_id in [*keys, "orphan"]:
            victims[run_id] = _spawn("crash", ledger_url, "crash", run_id, str(amount), "drawing", str(lease))
        for run_id, victim in victims.items():
            line = victim.stdout.readline()
            assert line.startswith("drawing"), victim.stderr.read()
            _, charge_id, token, lease_end = line.split()
            held[run_id] = (int(charge_id), token)
            first_lease_ends.append(dt.datetime.fromisoformat(lease_end))
        retries = [
            _spawn("retries", ledger_url, "crash", str(n), ",".join(keys), str(amount), "0.2", str(lease), str(go))
            for n in range(2)
        ]
        _ready(retries)
        go.touch()
        # past the end of every first lease: only the victims' keepers' renewals hold the keys now
        _wait_past(max(_aware(end) for end in first_lease_ends))
        assert ledger.reconcile() == []  # nothing has expired
        renewed = {c["id"]: _aware(c["lease_expires_at"]) for c in ledger.charges(account="crash")}
        assert all(renewed[charge_id] > max(_aware(e) for e in first_lease_ends) for charge_id, _ in held.values())
        assert Counter(c["state"] for c in ledger.charges(account="crash")) == {"reserved": 5}
        assert all(retry.poll() is None for retry in retries)  # still waiting on the first key
    finally:
        killed_at = dt.datetime.now(dt.timezone.utc)
        for victim in victims.values():
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=30)
    outcomes = _collect(retries)

    assert [o["error"] for o in outcomes if o["outcome"] == "error"] == []
    for run_id in keys:
        tries = [o for o in outcomes if o["run_id"] == run_id]
        assert Counter(t["outcome"] for t in tries) == {"committed": 1, "replayed": 1}, tries
        assert {(t["worker"], t["attempt"]) for t in tries} == {
            (t["by"], 2) for t in tries if t["outcome"] == "committed"
        }
    assert sum(outcome["lease_held"] for outcome in outcomes if outcome["run_id"] == keys[0]) >= 2
    charges = {c["run_id"]: c for c in ledger.charges(account="crash", state="committed")}
    assert all(_aware(charges[run_id]["created_at"]) >= killed_at for run_id in keys)  # no takeover while alive
    per_key = _counted_per_key(ledger, "crash")
    assert per_key == {**{run_id: [(1, "abandoned"), (2, "committed")] for run_id in keys}, "orphan": [(1, "reserved")]}
    assert ledger.account("crash").spent == (2 * len(keys) + 1) * amount

    # nobody retried the orphan: reconcile abandons it once its lease is over (it stays spent), and only it
    (orphan,) = ledger.charges(account="crash", state="reserved")
    _wait_past(_aware(orphan["lease_expires_at"]))
    (reconciled,) = ledger.reconcile()
    assert (reconciled["id"], reconciled["run_id"], reconciled["attempt"]) == (held["orphan"][0], "orphan", 1)
    assert ledger.reconcile() == []
    assert ledger.account("crash").spent == (2 * len(keys) + 1) * amount and ledger.account("crash").reserved == 0

    # a zombie of a killed try, holding its token, cannot publish
    charge_id, token = held[keys[0]]
    zombie = Reservation(charge_id, ReleaseKey("d", keys[0], "t", -1, "r"), "crash", amount, 1, token=token)
    with pytest.raises(ChargeStateError, match="is abandoned"):
        ledger.commit(zombie, {"value": 0})
    reasons = Counter(json.loads(e["details"])["reason"] for e in ledger.events("crash") if e["event"] == "abandoned")
    assert reasons == {
        "lease expired; a later attempt of the same release key took over": len(keys),
        "lease expired (reconcile)": 1,
    }
    _verify(ledger_url)


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
