"""A separate OS process that uses the ledger, driven by tests/ledger/test_processes.py.

Every mode spends with the spend key in ``DP_LEDGER_AUDIT_KEY`` (the test's SPEND_KEY).

Usage:
    python ledger_worker.py race URL ACCOUNT WORKER ATTEMPTS AMOUNT GO_FILE
        wait for GO_FILE, then try ATTEMPTS releases (reserve, commit) with distinct keys; print one JSON line per
        attempt: {"outcome": "committed"|"refused"|"error", ...}
    python ledger_worker.py retries URL ACCOUNT WORKER RUN_IDS AMOUNT DRAW_SECONDS LEASE_SECONDS GO_FILE
        a try of every release key (d, RUN_ID, t, -1, r) in RUN_IDS (comma-separated), in that order, as Airflow
        runs it while other tries of the same key may run at once: reserve; on LeaseHeldError wait a little and
        try again (Airflow's retry); on a replay stop; on a reservation "draw" for DRAW_SECONDS under
        ``Ledger.lease`` (leases of LEASE_SECONDS), then commit {"run_id", "worker", "attempt"}. Print "ready"
        once connected (before waiting for GO_FILE), then one JSON line per key: {"run_id", "by": this worker,
        "outcome": "committed"|"replayed"|"error", "lease_held": refusals seen, "worker"/"attempt": whose output
        this try published, "started"/"finished": epoch seconds, ...}
    python ledger_worker.py crash URL ACCOUNT RUN_ID AMOUNT STAGE [LEASE_SECONDS]
        reserve the release key (d, RUN_ID, t, -1, r) with leases of LEASE_SECONDS (default 120); STAGE
        "reserved": print at once; "drawn": draw noise, then print; "drawing": enter ``Ledger.lease`` (its keeper
        thread renews the lease) and print from inside it. Then hang until killed. The line printed is
        "STAGE CHARGE_ID TOKEN LEASE_EXPIRES_AT" (the token lets the test act as the killed attempt's zombie).
"""

from __future__ import annotations

import json
import random
import sys
import time
from fractions import Fraction
from pathlib import Path

from dp_operators.ledger import BudgetExhaustedError, LeaseHeldError, Ledger, ReleaseKey
from dp_operators.ledger.keys import SPEND_KEY_ENV, key_from_environment

MECHANISMS = [{"mechanism": "discrete_laplace", "scale": 100.0, "l1_sensitivity": 1.0}]

#: A try that keeps meeting a live lease gives up (outcome "error") after this long.
RETRY_DEADLINE_SECONDS = 120

#: How long a try that met a live lease waits before trying again (uniform; Airflow's retry_delay is minutes).
RETRY_WAIT_SECONDS = (0.1, 0.3)


def _ledger(url: str, lease_seconds: float | None = None) -> Ledger:
    extra = {} if lease_seconds is None else {"lease_seconds": lease_seconds}
    ledger = Ledger(url, audit_key=key_from_environment(SPEND_KEY_ENV), **extra)
    ledger.check_schema()
    return ledger


def _wait_for(go_file: str) -> None:
    while not Path(go_file).exists():
        time.sleep(0.005)


def race(url: str, account: str, worker: str, attempts: str, amount: str, go_file: str) -> None:
    ledger = _ledger(url)
    _wait_for(go_file)
    for attempt in range(int(attempts)):
        key = ReleaseKey("d", f"w{worker}-{attempt}", "t", -1, "r")
        try:
            reservation = ledger.reserve(
                key, account=account, amount=Fraction(amount), mechanisms=MECHANISMS, spec_hash="0" * 64,
                try_number=1, audit={"run_type": "manual", "triggering_user": f"worker-{worker}"},
            )
            ledger.commit(reservation, {"release": "r", "value": attempt})
            outcome = {"outcome": "committed", "charge_id": reservation.charge_id, "amount": str(reservation.amount)}
        except BudgetExhaustedError:
            outcome = {"outcome": "refused"}
        except Exception as error:  # reported to the parent, which fails the test
            outcome = {"outcome": "error", "error": f"{type(error).__name__}: {error}"}
        print(json.dumps(outcome), flush=True)


def _one_try(ledger: Ledger, account: str, worker: str, run_id: str, amount: Fraction, draw_seconds: float) -> dict:
    """One task try of the release key of ``run_id`` (see the module docstring)."""
    key = ReleaseKey("d", run_id, "t", -1, "r")
    started = time.time()
    held = 0
    while True:
        try:
            result = ledger.reserve(
                key, account=account, amount=amount, mechanisms=MECHANISMS, spec_hash="0" * 64,
                try_number=int(worker) + 1, audit={"run_type": "manual", "triggering_user": f"worker-{worker}"},
            )
        except LeaseHeldError as error:
            held += 1
            if time.time() - started > RETRY_DEADLINE_SECONDS:
                return {"outcome": "error", "error": f"lease held after {held} tries: {error}", "lease_held": held}
            time.sleep(random.uniform(*RETRY_WAIT_SECONDS))
            continue
        break
    if isinstance(result, dict):
        return {"outcome": "replayed", "worker": result["worker"], "attempt": result["attempt"], "lease_held": held,
                "started": started}
    with ledger.lease(result):
        time.sleep(draw_seconds)  # "drawing the noise": longer than a lease, so only the renewals keep it
    ledger.commit(result, {"release": "r", "run_id": run_id, "worker": int(worker), "attempt": result.attempt})
    return {"outcome": "committed", "worker": int(worker), "attempt": result.attempt, "charge_id": result.charge_id,
            "lease_held": held, "started": started}


def retries(
    url: str, account: str, worker: str, run_ids: str, amount: str, draw_seconds: str, lease_seconds: str,
    go_file: str,
) -> None:
    ledger = _ledger(url, float(lease_seconds))
    print("ready", flush=True)
    _wait_for(go_file)
    for run_id in run_ids.split(","):
        try:
            outcome = _one_try(ledger, account, worker, run_id, Fraction(amount), float(draw_seconds))
        except Exception as error:  # reported to the parent, which fails the test
            outcome = {"outcome": "error", "error": f"{type(error).__name__}: {error}"}
        outcome.update(run_id=run_id, by=int(worker), finished=time.time())
        print(json.dumps(outcome), flush=True)


def crash(url: str, account: str, run_id: str, amount: str, stage: str, lease_seconds: str = "120") -> None:
    ledger = _ledger(url, float(lease_seconds))
    reservation = ledger.reserve(
        ReleaseKey("d", run_id, "t", -1, "r"), account=account, amount=Fraction(amount), mechanisms=MECHANISMS,
        spec_hash="0" * 64, try_number=1,
    )
    line = f"{stage} {reservation.charge_id} {reservation.token} {reservation.lease_expires_at.isoformat()}"
    if stage == "drawn":
        from dp_operators.mechanisms import sample_discrete_laplace_vector

        noise = sample_discrete_laplace_vector(Fraction(100), 3)
        assert len(noise) == 3
    if stage == "drawing":
        with ledger.lease(reservation):
            print(line, flush=True)
            time.sleep(600)
    print(line, flush=True)
    time.sleep(600)


if __name__ == "__main__":
    {"race": race, "retries": retries, "crash": crash}[sys.argv[1]](*sys.argv[2:])
