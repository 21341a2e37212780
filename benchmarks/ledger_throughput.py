"""Ledger throughput and latency under concurrent OS processes, budget-check time against history size, and the CPU
one reserve + commit costs through the ledger against the same SQL through the raw driver.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/ledger_throughput.py [--charges 400] [--history 100000] [--pairs 2000]
        [--backends sqlite postgresql] [--sections throughput history cpu]

For each backend (SQLite file; PostgreSQL at ``DP_LEDGER_TEST_PG_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``, in a throwaway database) and 1, 4 and 16 processes:
``--charges`` releases (reserve + commit, each its own release key) split evenly over the processes, all starting
at once; reports committed charges per second (wall clock from start to last commit) and p50/p99 latency of one
reserve + commit. With 16 processes it also measures the raw ceiling in the same run: the same number of pairs of
commits through the bare driver, each updating the one row of a table (two commits being what a reserve and a commit
are, on one row as all charges of an account are on the account's row), and prints the ledger's rate as a fraction
of it. Then the time of a check-and-reserve on an account with ``--history`` prior committed charges
(and their audit events, written by the bulk loader of ``benchmarks/ledger_bulk.py``) against one with none, in the
same run: the ratio stays near 1 because the account row keeps running totals and the chain head.

CPU (``cpu`` section): ``--pairs`` reserve + commit pairs in this process through :class:`Ledger`, measured with
``time.process_time`` (this process's user and system CPU; waiting for the disk or the server is not CPU), against
the same SQL through the raw driver (``sqlite3`` or ``psycopg``) in the same run. "The same SQL" is literal: the
statements, parameters and transaction boundaries SQLAlchemy sent to the driver for the same pairs are recorded on a
copy of the ledger, then replayed through the driver on another copy that starts in the same state (same accounts,
ids and chain heads), so the triggers, constraints and commits are the same work on both sides. The difference is
what SQLAlchemy and the ledger's own Python (HMAC of each audit row, JSON, exact fractions) add per pair; on
PostgreSQL it includes the pool's pre-ping (``SELECT 1`` at each checkout, SQLAlchemy's own, not replayed).

The ledger is set up by a :class:`~dp_operators.ledger.LedgerGovernor` with fresh keys; the worker processes
(this file run as ``ledger_throughput.py worker ...``) spend with the spend key from ``DP_LEDGER_AUDIT_KEY``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
import unittest.mock
import uuid
from fractions import Fraction
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import sqlalchemy as sa  # noqa: E402

from dp_operators.ledger import AccountConfig, AuditKey, Ledger, ReleaseKey  # noqa: E402
from dp_operators.ledger.keys import SPEND_KEY_ENV, key_from_environment  # noqa: E402
from ledger_bulk import (  # noqa: E402
    PG_URL,
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


def raw_worker(url: str, number: str, attempts: str, go_file: str) -> None:
    """One process of the raw ceiling: wait for ``go_file``, then ``attempts`` times commit two updates of the one
    row of ``bench_ceiling`` through the bare driver: two commits, as a reserve and a commit are, serialised on one
    row as every charge of an account is on the account's row. One JSON line each, as :func:`worker` prints."""
    parts = sa.make_url(url)
    if parts.get_backend_name() == "sqlite":
        import sqlite3

        connection = sqlite3.connect(parts.database, timeout=60, isolation_level=None)

        def commit(value: int) -> None:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("UPDATE bench_ceiling SET value = value + 1, worker = ? WHERE id = 1", (number,))
            connection.execute("COMMIT")
    else:
        import psycopg

        connection = psycopg.connect(host=parts.host, port=parts.port, user=parts.username,
                                     password=parts.password, dbname=parts.database, autocommit=True)

        def commit(value: int) -> None:
            connection.execute("UPDATE bench_ceiling SET value = value + 1, worker = %s WHERE id = 1", (number,))
    while not Path(go_file).exists():
        time.sleep(0.005)
    for attempt in range(int(attempts)):
        started = time.perf_counter()
        commit(2 * attempt)
        commit(2 * attempt + 1)
        print(json.dumps({"outcome": "committed", "seconds": time.perf_counter() - started,
                          "finished_at": time.time()}), flush=True)


def throughput(url: str, keys: tuple[AuditKey, AuditKey], processes: int, charges: int, workdir: Path,
               raw: bool = False) -> dict:
    """Charges per second and latency of ``processes`` processes committing ``charges`` in all through the ledger
    at ``url``, or (``raw``) the ceiling: the same number of pairs of single-row commits through the bare
    driver."""
    if raw:
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE bench_ceiling (id INTEGER PRIMARY KEY, worker TEXT, value INTEGER)")
            conn.exec_driver_sql("INSERT INTO bench_ceiling (id, worker, value) VALUES (1, NULL, 0)")
        engine.dispose()
    else:
        new_ledger(url, keys, bench=bench_account()).engine.dispose()
    go = workdir / f"go-{uuid.uuid4().hex[:8]}"
    per_process = charges // processes
    env = {**os.environ, "PYTHONPATH": str(REPO), SPEND_KEY_ENV: keys[1].text}
    script = str(Path(__file__).resolve())
    arguments = [
        ["raw", url, str(n), str(per_process), str(go)] if raw
        else ["worker", url, "bench", str(n), str(per_process), "1/1000", str(go)]
        for n in range(processes)
    ]
    workers = [
        subprocess.Popen([sys.executable, script, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
        for argv in arguments
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


def copy_database(backend: str, url: str, workdir: Path):
    """A copy of the (idle) ledger at ``url`` in the same state, and a function that disposes of it: the SQLite file
    copied, or a PostgreSQL database created from it as a template."""
    if backend == "sqlite":
        copy = workdir / f"copy-{uuid.uuid4().hex[:8]}.db"
        original = Path(sa.make_url(url).database)
        shutil.copyfile(original, copy)
        wal = original.with_name(original.name + "-wal")  # committed pages not yet checkpointed into the file
        if wal.exists():
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
        return f"sqlite:///{copy}", lambda: None
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = f"dp_ledger_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{sa.make_url(url).database}"')

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return sa.make_url(url).set(database=name).render_as_string(hide_password=False), drop


def reserve_commit(ledger: Ledger, i: int) -> None:
    """One release through the ledger: reserve, then commit its output (release key ``("d", f"cpu-{i}", ...)``)."""
    reservation = ledger.reserve(
        ReleaseKey("d", f"cpu-{i}", "t", -1, "r"), account="bench", amount=Fraction(1, 1000), mechanisms=MECHANISMS,
        spec_hash="0" * 64, try_number=1, audit={"run_type": "scheduled", "triggering_user": None},
    )
    ledger.commit(reservation, {"release": "r", "value": i})


def close(ledger: Ledger) -> None:
    ledger.engine.dispose()
    if ledger._reader is not ledger.engine:
        ledger._reader.dispose()


def record_driver_calls(url: str, key: AuditKey, pairs: int) -> list[list[tuple]]:
    """Run ``pairs`` reserve + commit pairs through :class:`Ledger` at ``url`` and return, per pair, what reached
    the driver, in order: ``(engine, "execute", SQL, parameters)``, ``(engine, "commit")`` or ``(engine,
    "rollback")``, where ``engine`` is ``"writer"`` or ``"reader"`` (SQLite's deferred-transaction reader; on
    PostgreSQL both are one engine). On SQLite SQLAlchemy's events record it; on PostgreSQL, whose spend calls go
    to psycopg directly, psycopg's ``Cursor.execute`` (the calls run in autocommit: nothing to commit)."""
    ledger = Ledger(url, audit_key=key)
    ledger.check_schema()
    calls: list[tuple] = []

    def record(name: str, engine: sa.Engine) -> None:
        def execute(conn, cursor, sql, params, context, executemany) -> None:
            calls.append((name, "execute", sql, params))

        sa.event.listen(engine, "before_cursor_execute", execute)
        sa.event.listen(engine, "commit", lambda conn: calls.append((name, "commit")))
        sa.event.listen(engine, "rollback", lambda conn: calls.append((name, "rollback")))

    patched = contextlib.nullcontext()
    if ledger.dialect == "sqlite":  # SQLAlchemy's statements, and the spend path's sent to sqlite3 directly
        record("writer", ledger.engine)
        record("reader", ledger._reader)
        for name, engine in (("writer", ledger.engine), ("reader", ledger._reader)):
            engine.raw_connection = recording_raw_connection(name, engine.raw_connection, calls)
    else:  # the spend calls go to psycopg directly (Ledger._driver_call): record what reaches psycopg's cursors
        import psycopg

        def execute(cursor, query, params=None, **kwargs):
            calls.append(("writer", "execute", query, params))
            return original(cursor, query, params, **kwargs)

        original = psycopg.Cursor.execute
        patched = unittest.mock.patch.object(psycopg.Cursor, "execute", execute)
    per_pair = []
    with patched:
        for i in range(pairs):
            reserve_commit(ledger, i)
            per_pair.append(calls[:])
            calls.clear()
    close(ledger)
    return per_pair


class _Recorded:
    """A ``sqlite3`` connection whose ``execute`` calls are appended to ``calls`` (a pooled connection's proxy)."""

    def __init__(self, name: str, connection, calls: list) -> None:
        self._name, self._connection, self._calls = name, connection, calls

    def execute(self, sql, parameters=()):
        self._calls.append((self._name, "execute", sql, tuple(parameters)))
        return self._connection.execute(sql, parameters)

    def __getattr__(self, attribute):
        return getattr(self._connection, attribute)


def recording_raw_connection(name: str, raw_connection, calls: list):
    """``Engine.raw_connection`` whose connections record what the ledger sends them directly."""

    def connect():
        pooled = raw_connection()
        return types.SimpleNamespace(driver_connection=_Recorded(name, pooled.driver_connection, calls),
                                     close=pooled.close, info=pooled.info, invalidate=pooled.invalidate)

    return connect


def driver_connections(backend: str, url: str) -> dict:
    """Raw driver connections to the ledger at ``url``, set up as :func:`~dp_operators.ledger.store.
    create_ledger_engine` sets up its pool's: SQLite without implicit transactions and with foreign keys on (a
    writer and a reader); PostgreSQL with the same session limits."""
    if backend == "sqlite":
        import sqlite3

        connections = {}
        for name in ("writer", "reader"):
            connection = sqlite3.connect(sa.make_url(url).database, timeout=60, isolation_level=None)
            connection.execute("PRAGMA foreign_keys = ON")
            connections[name] = connection
        return connections
    import psycopg

    from dp_operators.ledger.store import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS, PG_LOCK_TIMEOUT_MS

    parts = sa.make_url(url)
    connection = psycopg.connect(
        host=parts.host, port=parts.port, user=parts.username, password=parts.password, dbname=parts.database,
        autocommit=True,
    )
    connection.execute(f"SET lock_timeout = {PG_LOCK_TIMEOUT_MS}")
    connection.execute(f"SET idle_in_transaction_session_timeout = {PG_IDLE_IN_TRANSACTION_TIMEOUT_MS}")
    # the ledger sends each spend call in autocommit (one round trip, the server commits); its recorded
    # ``commit`` sends nothing there, nor here (psycopg's commit() outside a transaction is a no-op)
    return {"writer": connection, "reader": connection}


def replay(connections: dict, calls: list[tuple]) -> None:
    """Send one pair's recorded driver calls again, fetching every result set as SQLAlchemy does."""
    for call in calls:
        connection = connections[call[0]]
        if call[1] == "execute":
            cursor = connection.cursor()
            cursor.execute(call[2], call[3])
            if cursor.description is not None:
                cursor.fetchall()
            cursor.close()
        elif call[1] == "commit":
            connection.commit()
        else:
            connection.rollback()


def cpu_per_release(
    backend: str, keys: tuple[AuditKey, AuditKey], pairs: int, workdir: Path, warmup: int = 50, rounds: int = 5
) -> dict:
    """CPU seconds per reserve + commit through :class:`Ledger` and through the raw driver (same SQL), measured
    with ``time.process_time`` over ``pairs`` pairs after ``warmup`` pairs, in ``rounds`` alternating rounds (the
    median round of each side; see the module docstring)."""
    url, dispose = throwaway_database(backend, workdir)
    copies = []
    try:
        init_ledger(url, *keys, bench=bench_account())
        copies = [copy_database(backend, url, workdir) for _ in range(2)]
        recorded = record_driver_calls(copies[0][0], keys[1], warmup + pairs)
        statements = sum(call[1] == "execute" for call in recorded[-1])
        ledger = Ledger(url, audit_key=keys[1])
        connections = driver_connections(backend, copies[1][0])
        for i in range(warmup):
            reserve_commit(ledger, i)
            replay(connections, recorded[i])
        # alternating rounds, so that a burst of load elsewhere on the machine falls on both sides alike
        ledger_rounds, driver_rounds = [], []
        bounds = [warmup + pairs * r // rounds for r in range(rounds + 1)]
        for start, stop in zip(bounds, bounds[1:]):
            started = time.process_time()
            for i in range(start, stop):
                reserve_commit(ledger, i)
            ledger_rounds.append((time.process_time() - started) / (stop - start))
            started = time.process_time()
            for calls in recorded[start:stop]:
                replay(connections, calls)
            driver_rounds.append((time.process_time() - started) / (stop - start))
        through_ledger = statistics.median(ledger_rounds)
        through_driver = statistics.median(driver_rounds)
        close(ledger)
        for connection in set(connections.values()):
            connection.close()
    finally:
        for _, drop in copies:
            drop()
        dispose()
    return {"pairs": pairs, "statements": statements, "ledger_ms": 1000 * through_ledger,
            "driver_ms": 1000 * through_driver, "ratio": through_ledger / through_driver}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=400)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--sections", nargs="+", choices=["throughput", "history", "cpu"],
                        default=["throughput", "history", "cpu"])
    args = parser.parse_args()
    keys = (AuditKey.generate(), AuditKey.generate())
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for backend in args.backends:
            print(f"\n## {backend}")
            if "cpu" in args.sections:
                c = cpu_per_release(backend, keys, args.pairs, workdir)
                print(f"\nCPU per reserve + commit ({c['pairs']} pairs, {c['statements']} statements each): "
                      f"{c['ledger_ms']:.3f} ms through the ledger, {c['driver_ms']:.3f} ms for the same SQL through "
                      f"the driver: ratio {c['ratio']:.1f}", flush=True)
            if "throughput" in args.sections:
                print("\n| processes | through | committed | charges/s | p50 ms | p99 ms |\n|---|---|---|---|---|---|")
                rates = {}
                for processes, raw in ((1, False), (4, False), (16, True), (16, False)):
                    url, dispose = throwaway_database(backend, workdir)
                    try:
                        r = throughput(url, keys, processes, args.charges, workdir, raw=raw)
                    finally:
                        dispose()
                    rates[processes, raw] = r["charges_per_second"]
                    through = "raw driver: two commits on one row" if raw else "the ledger"
                    print(f"| {r['processes']} | {through} | {r['committed']} | {r['charges_per_second']:.0f} | "
                          f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |", flush=True)
                print(f"\n16 processes: the ledger reaches {rates[16, False] / rates[16, True]:.0%} of the raw "
                      "ceiling measured in this run", flush=True)
            if "history" in args.sections:
                url, dispose = throwaway_database(backend, workdir)
                try:
                    b = budget_check(url, keys, args.history)
                finally:
                    dispose()
                print(f"\nbudget check (reserve) median: {b['empty_ms']:.2f} ms with 0 prior charges, "
                      f"{b['full_ms']:.2f} ms with {b['history']:,} prior charges: ratio {b['ratio']:.2f} (history "
                      f"loaded in {b['load_seconds']:.1f} s)", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(*sys.argv[2:])
    elif sys.argv[1:2] == ["raw"]:
        raw_worker(*sys.argv[2:])
    else:
        main()
