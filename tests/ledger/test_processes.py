"""The ledger under real OS processes: a 16-process race for the last of a budget, and SIGKILL mid-release."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from dp_operators.ledger import ChargeStateError, Ledger, ReleaseKey
from ledger_backends import account_config, ledger_with

WORKER = Path(__file__).with_name("ledger_worker.py")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}


def test_sixteen_processes_race_and_exactly_the_cap_is_committed(ledger_url, tmp_path):
    """400 attempts from 16 processes on a cap that fits exactly 100 charges of 1/100: exactly 100 commit, 300 are
    refused, nothing else goes wrong, and the committed charges add up to the cap."""
    ledger = ledger_with(ledger_url, race=account_config("pure_dp", cap=1))
    go = tmp_path / "go"
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "race", ledger_url, "race", str(n), "25", "1/100", str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        )
        for n in range(16)
    ]
    go.touch()
    outcomes: list[dict] = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr
        outcomes += [json.loads(line) for line in stdout.splitlines()]

    counts = Counter(o["outcome"] for o in outcomes)
    assert [o["error"] for o in outcomes if o["outcome"] == "error"] == []
    assert counts == {"committed": 100, "refused": 300}
    committed = ledger.charges(account="race", state="committed")
    assert len(committed) == 100 and ledger.charges(account="race", state="reserved") == []
    assert sum(Fraction(c["amount"]) for c in committed) == Fraction(1)
    status = ledger.account("race")
    assert status.spent == status.cap == 1 and status.remaining == 0
    report = ledger.verify()
    assert report.ok, report.problems
    assert report.events == 1 + 100 * 2 + 300  # created, reserved + committed per charge, one refusal each


def _start_and_kill(ledger_url: str, run_id: str, stage: str) -> int:
    """Run a worker that reserves (and, for ``drawn``, draws noise), then SIGKILL it; return its charge id."""
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), "crash", ledger_url, "crash", run_id, "1/10", stage],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )
    try:
        line = worker.stdout.readline()
        assert line.startswith(stage), worker.stderr.read()
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    return int(line.split()[1])


@pytest.mark.parametrize(
    "stage",
    [pytest.param("reserved", id="killed right after reserving"),
     pytest.param("drawn", id="killed after drawing noise, before commit")],
)
def test_a_killed_release_stays_spent_and_a_rerun_is_charged_again(ledger_url, stage):
    ledger = ledger_with(ledger_url, crash=account_config("pure_dp", cap=1))
    charge_id = _start_and_kill(ledger_url, "run-1", stage)

    status = ledger.account("crash")
    assert status.spent == Fraction(1, 10) and status.reserved == Fraction(1, 10)
    (charge,) = ledger.charges()
    assert (charge["id"], charge["state"]) == (charge_id, "reserved")

    # The rerun of the same key cannot know whether noise was drawn: the old charge becomes abandoned (still
    # spent) and the new attempt is charged before it may draw.
    key = ReleaseKey("d", "run-1", "t", -1, "r")
    rerun = ledger.reserve(key, account="crash", amount=Fraction(1, 10), mechanisms=[], spec_hash="0" * 64)
    assert rerun.attempt == 2
    assert ledger.account("crash").spent == Fraction(2, 10)
    ledger.commit(rerun, {"value": 1})
    states = {c["attempt"]: c["state"] for c in ledger.charges()}
    assert states == {1: "abandoned", 2: "committed"}
    assert ledger.account("crash").spent == Fraction(2, 10) and ledger.account("crash").reserved == 0

    # A zombie of the killed attempt could not publish: its charge is no longer reserved.
    from dp_operators.ledger import Reservation

    with pytest.raises(ChargeStateError):
        ledger.commit(Reservation(charge_id, key, "crash", Fraction(1, 10), 1), {"value": 0})
    events = [e["event"] for e in ledger.events("crash")]
    assert events == ["account_created", "reserved", "abandoned", "reserved", "committed"]
    report = ledger.verify()
    assert report.ok, report.problems


def test_ledger_objects_in_separate_processes_share_one_budget(ledger_url, tmp_path):
    """A reservation made by another process is visible at once to this one's budget check."""
    ledger = ledger_with(ledger_url, crash=account_config("pure_dp", cap="0.15"))
    _start_and_kill(ledger_url, "run-1", "reserved")
    fresh = Ledger(ledger_url)
    assert fresh.account("crash").remaining == Fraction(5, 100)
    assert ledger.verify().ok
