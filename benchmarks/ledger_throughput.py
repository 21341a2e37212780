"""Ledger throughput and latency under concurrent OS processes, and budget-check time against history size.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/ledger_throughput.py [--charges 400] [--history 100000] [--backends sqlite postgresql]

For each backend (SQLite file; PostgreSQL at ``DP_LEDGER_TEST_PG_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``, in a throwaway database) and 1, 4 and 16 processes:
``--charges`` releases (reserve + commit, each its own release key) split evenly over the processes, all starting
at once; reports committed charges per second (wall clock from start to last commit) and p50/p99 latency of one
reserve + commit. Then the time of a check-and-reserve on an account with ``--history`` prior committed charges
(and their audit events) against one with none, in the same run: the ratio stays near 1 because the account row
keeps running totals and the chain head.
"""

from __future__ import annotations

import argparse
import datetime as dt
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

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from dp_operators.ledger import Ledger, LedgerConfig, ReleaseKey, schema  # noqa: E402
from dp_operators.ledger.store import GENESIS_HASH, audit_row_hash, canonical_json  # noqa: E402
from ledger_backends import account_config  # noqa: E402

WORKER = REPO / "tests" / "ledger" / "ledger_worker.py"
PG_URL = os.environ.get("DP_LEDGER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def fresh_url(backend: str, workdir: Path) -> tuple[str, callable]:
    """A URL of an empty database and a function that disposes of it."""
    if backend == "sqlite":
        path = workdir / f"ledger-{uuid.uuid4().hex[:8]}.db"
        return f"sqlite:///{path}", lambda: None
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = f"dp_ledger_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False), drop


def new_ledger(url: str, **accounts) -> Ledger:
    ledger = Ledger(url)
    ledger.init_schema()
    ledger.apply_config(LedgerConfig(version=1, accounts=accounts))
    return ledger


def throughput(url: str, processes: int, charges: int, workdir: Path) -> dict:
    new_ledger(url, bench=account_config("pure_dp", cap=10**9))
    go = workdir / f"go-{uuid.uuid4().hex[:8]}"
    per_process = charges // processes
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "race", url, "bench", str(n), str(per_process), "1/1000", str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for n in range(processes)
    ]
    time.sleep(3 + processes * 0.3)  # let every process import and connect before the start signal
    started = time.time()
    go.touch()
    outcomes = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=600)
        if worker.returncode:
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


def load_history(url: str, account: str, count: int) -> None:
    """Insert ``count`` committed charges of ``account`` with a valid audit chain, in bulk."""
    engine = sa.create_engine(url)
    stamp = dt.datetime.now(dt.timezone.utc)
    now = stamp.isoformat(timespec="microseconds")
    with engine.begin() as conn:
        row = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == account)).one()
        seq, head, spent = row.audit_seq, row.audit_head, Fraction(row.spent)
        first_id = (conn.execute(sa.select(sa.func.max(schema.charges.c.id))).scalar() or 0) + 1
        charges, events = [], []
        amount = Fraction(1, 10**6)
        for i in range(count):
            charge_id = first_id + i
            key = {"dag_id": "d", "run_id": f"history-{i}", "task_id": "t", "map_index": -1, "release_name": "r"}
            charges.append({"id": charge_id, "account": account, "attempt": 1, "state": "committed",
                            "amount": str(amount), "delta_amount": "0", "mechanisms": "[]", "spec_hash": "0" * 64,
                            "try_number": 1, "context": "{}", "output": "{}", "output_digest": "0" * 64,
                            "created_at": stamp, "updated_at": stamp, **key})
            spent += amount
            seq += 1
            event = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
            event.update(key, account=account, account_seq=seq, event="reserved", charge_id=charge_id, attempt=1,
                         try_number=1, spec_hash="0" * 64, amount=str(amount), delta_amount="0",
                         spent_after=str(spent), delta_spent_after="0", mechanisms="[]",
                         context=canonical_json({}), created_at=now, prev_hash=head)
            event["row_hash"] = head = audit_row_hash(event)
            events.append(event)
        for start in range(0, count, 10_000):
            conn.execute(schema.charges.insert(), charges[start:start + 10_000])
            conn.execute(schema.audit_events.insert(), events[start:start + 10_000])
        if conn.dialect.name == "postgresql":  # explicit ids do not advance the sequence
            conn.exec_driver_sql("SELECT setval(pg_get_serial_sequence('dp_charges', 'id'), max(id)) FROM dp_charges")
        conn.execute(schema.accounts.update().where(schema.accounts.c.name == account).values(
            spent=str(spent), audit_seq=seq, audit_head=head))
    engine.dispose()


def budget_check(url: str, history: int, repeats: int = 200) -> dict:
    ledger = new_ledger(url, empty=account_config("pure_dp", cap=10**9), full=account_config("pure_dp", cap=10**9))
    started = time.perf_counter()
    load_history(url, "full", history)
    loaded = time.perf_counter() - started
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
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for backend in args.backends:
            print(f"\n## {backend}")
            print("| processes | committed | charges/s | p50 ms | p99 ms |\n|---|---|---|---|---|")
            for processes in (1, 4, 16):
                url, dispose = fresh_url(backend, workdir)
                try:
                    r = throughput(url, processes, args.charges, workdir)
                finally:
                    dispose()
                print(f"| {r['processes']} | {r['committed']} | {r['charges_per_second']:.0f} | {r['p50_ms']:.1f} "
                      f"| {r['p99_ms']:.1f} |", flush=True)
            url, dispose = fresh_url(backend, workdir)
            try:
                b = budget_check(url, args.history)
            finally:
                dispose()
            print(f"\nbudget check (reserve) median: {b['empty_ms']:.2f} ms with 0 prior charges, {b['full_ms']:.2f} ms "
                  f"with {b['history']:,} prior charges: ratio {b['ratio']:.2f} (history loaded in "
                  f"{b['load_seconds']:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
