"""A separate OS process that uses the ledger, driven by tests/ledger/test_processes.py and the benchmark.

Usage:
    python ledger_worker.py race URL ACCOUNT WORKER ATTEMPTS AMOUNT GO_FILE
        wait for GO_FILE, then try ATTEMPTS releases (reserve, commit) with distinct keys; print one JSON line per
        attempt: {"outcome": "committed"|"refused"|"error", ...}
    python ledger_worker.py crash URL ACCOUNT RUN_ID AMOUNT STAGE
        reserve the release key (d, RUN_ID, t, -1, r); if STAGE is "drawn" also draw noise; print the STAGE and
        hang until killed.
"""

from __future__ import annotations

import json
import sys
import time
from fractions import Fraction
from pathlib import Path

from dp_operators.ledger import BudgetExhaustedError, Ledger, ReleaseKey

MECHANISMS = [{"mechanism": "discrete_laplace", "scale": 100.0, "l1_sensitivity": 1.0}]


def race(url: str, account: str, worker: str, attempts: str, amount: str, go_file: str) -> None:
    ledger = Ledger(url)
    ledger.check_schema()
    while not Path(go_file).exists():
        time.sleep(0.005)
    for attempt in range(int(attempts)):
        key = ReleaseKey("d", f"w{worker}-{attempt}", "t", -1, "r")
        started = time.perf_counter()
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
        outcome["seconds"] = time.perf_counter() - started
        outcome["finished_at"] = time.time()
        print(json.dumps(outcome), flush=True)


def crash(url: str, account: str, run_id: str, amount: str, stage: str) -> None:
    ledger = Ledger(url)
    reservation = ledger.reserve(
        ReleaseKey("d", run_id, "t", -1, "r"), account=account, amount=Fraction(amount), mechanisms=MECHANISMS,
        spec_hash="0" * 64, try_number=1,
    )
    if stage == "drawn":
        from dp_operators.mechanisms import sample_discrete_laplace_vector

        noise = sample_discrete_laplace_vector(Fraction(100), 3)
        assert len(noise) == 3
    print(f"{stage} {reservation.charge_id}", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    {"race": race, "crash": crash}[sys.argv[1]](*sys.argv[2:])
