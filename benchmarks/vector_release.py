"""``vector_release`` against the engine and numpy: time and peak memory of one release of N integer values.

Each variant runs in a fresh subprocess (its peak RSS, ``ru_maxrss``, belongs to it alone), on the same values
(``numpy`` int64 counts in [0, 1000), fixed seed), discrete Laplace at epsilon 1, sensitivity 1, one contribution
per person (``max_partitions_contributed=1``):

* ``vector_release``: :func:`dp_operators.vector_release` on the array, no ledger (values returned, nothing
  recorded);
* ``vector_release + ledger``: the same, charged to a fresh SQLite ledger (every value inline in the committed
  output, as ``vector_release`` always keeps them);
* ``run_release, rows file`` (the baseline): :func:`dp_operators.release.run_release` on the spec
  ``vector_release`` stands for and an int64 ``pyarrow.Table`` (``index``, ``sum``), with a fresh SQLite ledger and
  a local rows store (the values go to a Parquet rows file the ledger records by digest);
* ``run_release, inline``: the same with ``inline_rows_limit=None`` (the ledger comparison of ``vector_release +
  ledger``);
* ``numpy``: ``Generator.laplace`` on N values (float noise: not exact, not safe; the speed floor only).

The engine variants include building and validating their spec (a user loads one too). Times are wall and CPU
seconds of the call (``time.perf_counter``, ``time.process_time``) after the imports; the variants are run
``--runs`` times, interleaved. Printed: medians, peak RSS, and each variant over the baseline and over numpy. The
goal (issue 23): ``vector_release`` within 2x of ``run_release`` on the same data, under 1 GB peak RSS.

Run:  .venv/bin/python benchmarks/vector_release.py [--size 1000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from bench_ledgers import pure_dp_ledger

REPO = Path(__file__).resolve().parent.parent

ACCOUNT = "vector_benchmark"
DAG_ID = "vector_benchmark"
VARIANTS = ("vector_release", "vector_release + ledger", "run_release, rows file", "run_release, inline", "numpy")
BASELINE = "run_release, rows file"


def make_ledger(path: Path):
    """A fresh SQLite ledger with one pure-DP account allowing :data:`DAG_ID`; returns the spender's view."""
    return pure_dp_ledger(path, account=ACCOUNT, dag_id=DAG_ID, cap=Fraction(10))


def child(variant: str, size: int, folder: Path) -> dict:
    """Run one variant in this (fresh) process; returns its seconds and peak RSS."""
    import numpy as np
    import pyarrow as pa

    from dp_operators import api
    from dp_operators.ledger import ReleaseKey
    from dp_operators.release import run_release
    from dp_operators.release.rows_file import LocalRowsStore

    values = np.random.default_rng(7).integers(0, 1000, size)
    key = ReleaseKey(dag_id=DAG_ID, run_id="run", task_id="release", map_index=-1, release_name="vector")
    ledger = make_ledger(folder / "ledger.db") if variant != "numpy" else None
    before = peak_rss_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    if variant == "vector_release":
        result = api.vector_release(values, sensitivity=1, epsilon=1, mechanism="discrete_laplace",
                                    max_partitions_contributed=1)
        assert len(result.values) == size
    elif variant == "vector_release + ledger":
        result = api.vector_release(values, sensitivity=1, epsilon=1, mechanism="discrete_laplace",
                                    max_partitions_contributed=1, ledger=ledger, account=ACCOUNT, key=key)
        assert len(result.values) == size
    elif variant.startswith("run_release"):
        spec = api._spec(release="vector", account=ACCOUNT, privacy_unit="person", size=size,
                         sensitivity=Fraction(1), grid=Fraction(1), mechanism="discrete_laplace",
                         budget={"epsilon": 1}, max_partitions_contributed=1, confidence=0.95)
        table = pa.table({"index": np.arange(size, dtype=np.int64), "sum": values})
        extra = ({"rows_store": LocalRowsStore(folder / "rows"), "inline_rows_limit": 100_000}
                 if variant.endswith("rows file") else {"inline_rows_limit": None})
        run_release(spec, {"value": table}, ledger, key, spec_hash="0" * 64, **extra)
    else:
        np.random.default_rng().laplace(0.0, 1.0, size)
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "rss_before_mb": before,
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def run_child(variant: str, size: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, __file__, "--child", variant, "--size", str(size), "--folder", folder],
                              cwd=REPO, capture_output=True, text=True, check=True, timeout=3600)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10**6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", choices=VARIANTS)
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.size, Path(args.folder))))
        return
    found: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for _ in range(args.runs):
        for variant in VARIANTS:
            found[variant].append(run_child(variant, args.size))
    median = {v: {m: statistics.median(r[m] for r in runs) for m in runs[0]} for v, runs in found.items()}
    print(f"N = {args.size:,} values, {args.runs} runs each, interleaved; medians\n")
    print("| variant | wall s | CPU s | peak RSS MB | wall / baseline | CPU / baseline | wall / numpy |")
    print("|---|---|---|---|---|---|---|")
    for variant, m in median.items():
        print(f"| {variant} | {m['wall']:.3f} | {m['cpu']:.3f} | {m['peak_rss_mb']:.0f} | "
              f"{m['wall'] / median[BASELINE]['wall']:.2f} | {m['cpu'] / median[BASELINE]['cpu']:.2f} | "
              f"{m['wall'] / median['numpy']['wall']:.0f} |")
    ratio = median["vector_release"]["wall"] / median[BASELINE]["wall"]
    memory = median["vector_release"]["peak_rss_mb"]
    print(f"\nvector_release / run_release (rows file): {ratio:.2f} (goal <= 2: {'met' if ratio <= 2 else 'not met'}); "
          f"peak RSS {memory:.0f} MB (goal < 1024: {'met' if memory < 1024 else 'not met'})")


if __name__ == "__main__":
    main()
