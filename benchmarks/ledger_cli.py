"""Wall time and peak memory of ``dpctl ledger history``, ``verify`` and ``export`` on a ledger of 10^5 charges.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/ledger_cli.py [--charges 100000] [--baseline-charges 1000] [--backend both]

For each backend (a SQLite file; PostgreSQL at ``DP_LEDGER_TEST_PG_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``, in a throwaway database dropped afterwards) two ledgers are
built: ``--baseline-charges`` and ``--charges`` committed releases on one account, written by the bulk loader
(``benchmarks/ledger_bulk.py``: the rows ``Ledger.reserve`` + ``commit`` would write, signed with a fresh spend key,
5,000 releases per transaction). The loader's rate is printed beside the API's, measured on a few hundred releases.

Then each command runs as a subprocess, the real ``dpctl`` of the virtualenv, with the keys in
``DP_LEDGER_GOVERNOR_KEY`` / ``DP_LEDGER_AUDIT_KEY``:

* ``dpctl ledger history --limit 50`` (the first page) and ``--limit 50 --after <middle id>`` (a page far in);
* ``dpctl ledger verify`` (must exit 0 with every event authenticated: the loader's ledgers verify);
* ``dpctl ledger export -o FILE`` (the audit log; the file must hold every event).

Wall time is measured around the subprocess and peak RSS is the child's own ``ru_maxrss`` (``os.wait4`` in a small
launcher process: a child forked from the benchmark itself would report the benchmark's memory). The baseline is
``dpctl --help`` (interpreter and imports) and the same commands on the small ledger, so the table shows the ratio
of times (large ledger over small) and the time and memory above the baseline, beside the absolute figures and
issue 9's targets at 10^5 charges: ``history --limit 50`` under 1 s, ``verify`` under 30 s and 200 MB. Other load
on the machine inflates every time alike; the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from dp_operators.ledger import AuditKey, Ledger  # noqa: E402
from ledger_bulk import (  # noqa: E402
    RELEASES_PER_TRANSACTION,
    bench_account,
    bulk_load,
    init_ledger,
    synthetic_releases,
    throwaway_database,
)

DPCTL = REPO / ".venv" / "bin" / "dpctl"
ACCOUNT = "bench"

#: Issue 9's targets at 10^5 charges: (command, seconds, MB of peak RSS or None).
TARGETS = {"history --limit 50": (1.0, None), "verify": (30.0, 200.0)}


@dataclass
class Run:
    """One subprocess: wall seconds, peak RSS (MB), exit code, and the tail of its stdout and stderr."""

    seconds: float
    rss_mb: float
    returncode: int
    stdout: str
    stderr: str


#: Runs a command and reports its wall time, peak RSS and exit code. A child's ``ru_maxrss`` counts the image it
#: was forked from (the high-water mark survives ``exec``), so the command is started from this small process and
#: not from the benchmark, which holds the loader's batches.
_LAUNCHER = """
import os, subprocess, sys, time
started = time.perf_counter()
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
seconds = time.perf_counter() - started
child.returncode = os.waitstatus_to_exitcode(status)
with open(sys.argv[1], "w") as out:
    out.write(f"{seconds} {usage.ru_maxrss} {child.returncode}")
"""


def run(argv: list[str], env: dict[str, str], workdir: Path) -> Run:
    """Run ``argv``; wall time around the child and its own peak RSS (``os.wait4``), measured by a small launcher."""
    out, err, measured = workdir / "stdout.txt", workdir / "stderr.txt", workdir / "measured.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        subprocess.run([sys.executable, "-c", _LAUNCHER, str(measured), *argv], stdout=stdout, stderr=stderr, env=env,
                       check=True)
    seconds, rss_kb, returncode = measured.read_text().split()
    tail = lambda path: path.read_text(errors="replace")[-2000:]  # noqa: E731
    return Run(float(seconds), int(rss_kb) / 1024, int(returncode), tail(out), tail(err))


def measure(argv: list[str], env: dict[str, str], workdir: Path, repeat: int, check: Callable[[Run], None]) -> Run:
    """The median run of ``repeat`` (by wall time); each must pass ``check``."""
    runs = []
    for _ in range(repeat):
        result = run(argv, env, workdir)
        check(result)
        runs.append(result)
    runs.sort(key=lambda r: r.seconds)
    return runs[len(runs) // 2]


def new_ledger(url: str, governor_key: AuditKey, spend_key: AuditKey) -> None:
    init_ledger(url, governor_key, spend_key, **{ACCOUNT: bench_account()})


def api_rate(url: str, governor_key: AuditKey, spend_key: AuditKey, count: int) -> float:
    """Releases per second through ``Ledger.reserve`` + ``Ledger.commit`` (one process), on a fresh ledger."""
    new_ledger(url, governor_key, spend_key)
    ledger = Ledger(url, audit_key=spend_key)
    started = time.perf_counter()
    for release in synthetic_releases(count, (ACCOUNT,), prefix="api"):
        reservation = ledger.reserve(
            release.key, account=release.account, amount=release.amount, mechanisms=release.mechanisms,
            spec_hash=release.spec_hash, try_number=release.try_number, audit=release.audit,
        )
        ledger.commit(reservation, release.output)
    rate = count / (time.perf_counter() - started)
    ledger.engine.dispose()
    return rate


def measure_ledger(url: str, charges: int, env: dict[str, str], workdir: Path, repeat: int) -> dict[str, Run]:
    """Run the commands on the ledger at ``url`` (holding ``charges`` charges) and check what they print."""
    dpctl = [str(DPCTL), "ledger"]
    events = 2 * charges + 1

    def ok(result: Run) -> None:
        if result.returncode:
            raise RuntimeError(f"exit {result.returncode}: {result.stderr or result.stdout}")

    def verified(result: Run) -> None:
        ok(result)
        expected = f"ledger consistent: {events} audit events, 1 accounts, {charges} charges; every event authenticated"
        if expected not in result.stdout:
            raise RuntimeError(f"verify did not report {expected!r}: {result.stdout} {result.stderr}")

    export_file = workdir / "events.jsonl"

    def exported(result: Run) -> None:
        ok(result)
        with export_file.open("rb") as lines:
            written = sum(1 for _ in lines)
        if written != events:
            raise RuntimeError(f"export wrote {written} lines, expected {events}")

    middle = charges // 2  # ids start at 1 in a fresh database
    return {
        "history --limit 50": measure([*dpctl, "history", "--limit", "50", "--url", url], env, workdir, repeat, ok),
        "history --limit 50 --after N/2": measure(
            [*dpctl, "history", "--limit", "50", "--after", str(middle), "--url", url], env, workdir, repeat, ok
        ),
        "verify": measure([*dpctl, "verify", "--url", url], env, workdir, repeat, verified),
        "export -o FILE": measure(
            [*dpctl, "export", "-o", str(export_file), "--url", url], env, workdir, repeat, exported
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=100_000, help="charges in the measured ledger")
    parser.add_argument("--baseline-charges", type=int, default=1_000, help="charges in the baseline ledger")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each command (the median is shown)")
    parser.add_argument("--api-sample", type=int, default=300, help="releases through the API, to compare rates")
    parser.add_argument(
        "--per-transaction", type=int, default=RELEASES_PER_TRANSACTION, help="bulk loader releases per transaction"
    )
    args = parser.parse_args()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    governor_key, spend_key = AuditKey.generate(), AuditKey.generate()
    with tempfile.TemporaryDirectory(prefix="dp-ledger-cli-bench-") as tmp:
        workdir = Path(tmp)
        env = {key: value for key, value in os.environ.items() if not key.startswith("DP_LEDGER")}
        env.update(
            DP_LEDGER_GOVERNOR_KEY=governor_key.text,
            DP_LEDGER_AUDIT_KEY=spend_key.text,
            AIRFLOW_HOME=str(workdir / "airflow"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
        )
        help_runs = [run([str(DPCTL), "--help"], env, workdir) for _ in range(3)]
        baseline = Run(
            statistics.median(r.seconds for r in help_runs), max(r.rss_mb for r in help_runs), 0, "", ""
        )
        print(f"baseline `dpctl --help`: {baseline.seconds:.2f} s, peak RSS {baseline.rss_mb:.0f} MB", flush=True)
        results: dict[str, dict[int, dict[str, Run]]] = {}
        for backend in backends:
            url, dispose = throwaway_database(backend, workdir)
            try:
                rate = api_rate(url, governor_key, spend_key, args.api_sample)
            finally:
                dispose()
            results[backend] = {}
            for charges in (args.baseline_charges, args.charges):
                url, dispose = throwaway_database(backend, workdir)
                try:
                    new_ledger(url, governor_key, spend_key)
                    summary = bulk_load(
                        url, synthetic_releases(charges, (ACCOUNT,)), spend_key=spend_key,
                        per_transaction=args.per_transaction,
                    )
                    loader_rate = summary.charges / summary.seconds
                    print(
                        f"{backend}: loaded {summary.charges:,} charges ({summary.events:,} events) in "
                        f"{summary.transactions} transactions, {summary.seconds:.1f} s: {loader_rate:,.0f} "
                        f"releases/s (the API: {rate:,.0f}/s, loader {loader_rate / rate:.0f}x faster)",
                        flush=True,
                    )
                    results[backend][charges] = measure_ledger(url, charges, env, workdir, args.repeat)
                finally:
                    dispose()
        print_table(results, baseline, args.baseline_charges, args.charges)


def print_table(results: dict, baseline: Run, small: int, large: int) -> None:
    columns = [
        "backend", "command", f"{small:,}: s", f"{small:,}: MB", f"{large:,}: s", f"{large:,}: MB", "time ratio",
        "s over `--help`", "MB over `--help`", f"target at {large:,}", "met",
    ]
    print("\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for backend, by_size in results.items():
        for command in by_size[large]:
            a, b = by_size[small][command], by_size[large][command]
            seconds, megabytes = TARGETS.get(command, (None, None))
            target, met = "-", "-"
            if seconds is not None:
                target = f"< {seconds:g} s" + (f" and < {megabytes:g} MB" if megabytes else "")
                met = "yes" if b.seconds < seconds and (megabytes is None or b.rss_mb < megabytes) else "NO"
            cells = [
                backend, f"`dpctl ledger {command}`", f"{a.seconds:.2f}", f"{a.rss_mb:.0f}", f"{b.seconds:.2f}",
                f"{b.rss_mb:.0f}", f"{b.seconds / a.seconds:.1f}", f"{b.seconds - baseline.seconds:+.2f}",
                f"{b.rss_mb - baseline.rss_mb:+.0f}", target, met,
            ]
            print("| " + " | ".join(cells) + " |")
    print(f"\nbaseline `dpctl --help`: {baseline.seconds:.2f} s, {baseline.rss_mb:.0f} MB (interpreter + imports)")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
