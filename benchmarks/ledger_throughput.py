"""Ledger throughput and latency under concurrent OS processes, and budget-check time against history size.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/ledger_throughput.py [--charges 400] [--history 100000] [--backends sqlite postgresql]

For each backend (SQLite file; PostgreSQL at ``DP_LEDGER_TEST_PG_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``, in a throwaway database) and 1, 4 and 16 processes:
``--charges`` releases (reserve + commit, each its own release key) split evenly over the processes, all starting
at once; reports committed charges per second (wall clock from start to last commit) and p50/p99 latency of one
reserve + commit. Then the time of a check-and-reserve on an account with ``--history`` prior committed charges
(and their audit events, written by the bulk loader of ``benchmarks/ledger_bulk.py``) against one with none, in the
same run: the ratio stays near 1 because the account row keeps running totals and the chain head.

The ledger is set up by a :class:`~dp_operators.ledger.LedgerGovernor` with fresh keys; the worker processes
(this file run as ``ledger_throughput.py worker ...``) spend with the spend key from ``DP_LEDGER_AUDIT_KEY``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from fractions import Fraction
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from dp_operators.ledger import AccountConfig, AuditKey, Ledger, ReleaseKey  # noqa: E402
from dp_operators.ledger.keys import SPEND_KEY_ENV, key_from_environment  # noqa: E402
from ledger_bulk import (  # noqa: E402
    bench_account,
    bulk_load,
    init_ledger,
    synthetic_releases,
    throwaway_database,
)

MECHANISMS = [{"mechanism": "discrete_laplace", "scale": 100.0, "l1_sensitivity": 1.0}]


def new_ledger(url: str, keys: tuple[AuditKey, AuditKey], **accounts: AccountConfig) -> Ledger:
    """Initialise the ledger at ``url`` with ``accounts`` (``keys``: the governor key and the spend key); returns the
    spender's view."""
    init_ledger(url, *keys, **accounts)
    return Ledger(url, audit_key=keys[1])


def worker(url: str, account_name: str, number: str, attempts: str, amount: str, go_file: str) -> None:
    """One worker process: wait for ``go_file``, then reserve and commit ``attempts`` releases with distinct keys
    (spend key from ``DP_LEDGER_AUDIT_KEY``); print one JSON line per release (outcome, seconds, finish time)."""
    ledger = Ledger(url, audit_key=key_from_environment(SPEND_KEY_ENV))
    ledger.check_schema()
    while not Path(go_file).exists():
        time.sleep(0.005)
    for attempt in range(int(attempts)):
        key = ReleaseKey("d", f"w{number}-{attempt}", "t", -1, "r")
        started = time.perf_counter()
        try:
            reservation = ledger.reserve(
                key, account=account_name, amount=Fraction(amount), mechanisms=MECHANISMS, spec_hash="0" * 64,
                try_number=1, audit={"run_type": "manual", "triggering_user": f"worker-{number}"},
            )
            ledger.commit(reservation, {"release": "r", "value": attempt})
            outcome = {"outcome": "committed", "charge_id": reservation.charge_id}
        except Exception as error:  # reported to the parent, which stops the benchmark
            outcome = {"outcome": "error", "error": f"{type(error).__name__}: {error}"}
        outcome["seconds"] = time.perf_counter() - started
        outcome["finished_at"] = time.time()
        print(json.dumps(outcome), flush=True)


def throughput(url: str, keys: tuple[AuditKey, AuditKey], processes: int, charges: int, workdir: Path) -> dict:
    new_ledger(url, keys, bench=bench_account()).engine.dispose()
    go = workdir / f"go-{uuid.uuid4().hex[:8]}"
    per_process = charges // processes
    env = {**os.environ, "PYTHONPATH": str(REPO), SPEND_KEY_ENV: keys[1].text}
    script = str(Path(__file__).resolve())
    workers = [
        subprocess.Popen(
            [sys.executable, script, "worker", url, "bench", str(n), str(per_process), "1/1000", str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for n in range(processes)
    ]
    time.sleep(3 + processes * 0.3)  # let every process import and connect before the start signal
    started = time.time()
    go.touch()
    outcomes = []
    for process in workers:
        stdout, stderr = process.communicate(timeout=600)
        if process.returncode:
            raise RuntimeError(stderr)
        outcomes += [json.loads(line) for line in stdout.splitlines()]
    bad = [o for o in outcomes if o["outcome"] != "committed"]
    if bad:
        raise RuntimeError(f"unexpected outcomes: {bad[:3]}")
    wall = max(o["finished_at"] for o in outcomes) - started
    latencies = sorted(o["seconds"] for o in outcomes)
    return {
        "processes": processes,
        "committed": len(outcomes),
        "charges_per_second": len(outcomes) / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def budget_check(url: str, keys: tuple[AuditKey, AuditKey], history: int, repeats: int = 200) -> dict:
    ledger = new_ledger(url, keys, empty=bench_account(), full=bench_account())
    loaded = bulk_load(url, synthetic_releases(history, ("full",), prefix="history"), spend_key=keys[1]).seconds
    timings: dict[str, list[float]] = {"empty": [], "full": []}
    for i in range(repeats):
        for account in ("empty", "full"):  # interleaved, so drift affects both alike
            t0 = time.perf_counter()
            ledger.reserve(ReleaseKey("d", f"check-{account}-{i}", "t", -1, "r"), account=account,
                           amount=Fraction(1, 10**6), mechanisms=[], spec_hash="0" * 64)
            timings[account].append(time.perf_counter() - t0)
    empty, full = statistics.median(timings["empty"]), statistics.median(timings["full"])
    return {"history": history, "load_seconds": loaded, "empty_ms": 1000 * empty, "full_ms": 1000 * full,
            "ratio": full / empty}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=400)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    args = parser.parse_args()
    keys = (AuditKey.generate(), AuditKey.generate())
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for backend in args.backends:
            print(f"\n## {backend}")
            print("| processes | committed | charges/s | p50 ms | p99 ms |\n|---|---|---|---|---|")
            for processes in (1, 4, 16):
                url, dispose = throwaway_database(backend, workdir)
                try:
                    r = throughput(url, keys, processes, args.charges, workdir)
                finally:
                    dispose()
                print(f"| {r['processes']} | {r['committed']} | {r['charges_per_second']:.0f} | {r['p50_ms']:.1f} "
                      f"| {r['p99_ms']:.1f} |", flush=True)
            url, dispose = throwaway_database(backend, workdir)
            try:
                b = budget_check(url, keys, args.history)
            finally:
                dispose()
            print(f"\nbudget check (reserve) median: {b['empty_ms']:.2f} ms with 0 prior charges, {b['full_ms']:.2f} ms "
                  f"with {b['history']:,} prior charges: ratio {b['ratio']:.2f} (history loaded in "
                  f"{b['load_seconds']:.1f} s)", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(*sys.argv[2:])
    else:
        main()
