"""Inline publication against rows files: a release of 10^5 inline cells beside one of 10^6 rows-file cells, in one
process, as a ratio.

Both releases are one count over the public domain ``x`` in ``range(N // 1000)`` times ``y`` in ``range(1000)``
(discrete Laplace, epsilon 1), read from an int64 ``pyarrow.Table``, through
:func:`dp_operators.release.run_release` with a fresh SQLite ledger each (pure-DP account):

* ``inline``: N = 10^5 (the default ``inline_rows_limit``, so every row goes into the output, the ledger row and
  XCom);
* ``rows file``: N = 10^6, its rows written to a Parquet rows file (``LocalRowsStore``) the ledger records by
  digest.

Each release's output is then written as the operator's JSON sink writes it (``sinks.release_json``; small for the
rows file, which holds a reference). Each is run ``--runs`` times, interleaved (drift on a shared machine touches
both alike); the medians of the engine alone and of engine plus JSON file, and the ratios, are printed. Times are
CPU seconds of this process (``time.process_time``, every thread): on a shared, loaded machine wall time measures
the neighbours. The goal (issue 23): inline 10^5 cells no slower than 10^6 rows-file cells (ratio <= 1).
``--profile`` prints the top functions of one inline release (cProfile), to see what publication spends.

Run:  .venv/bin/python benchmarks/inline_publication.py [--runs 5] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from bench_ledgers import pure_dp_ledger

REPO = Path(__file__).resolve().parent.parent

ACCOUNT = "publication_benchmark"
DAG_ID = "publication_benchmark"
Y_KEYS = 1000


def make_ledger(path: Path):
    """A fresh SQLite ledger with one pure-DP account allowing :data:`DAG_ID`; returns the spender's view."""
    return pure_dp_ledger(path, account=ACCOUNT, dag_id=DAG_ID, cap=Fraction(10**6))


def release_of(cells: int):
    """The spec and the true table of a count over ``cells`` public keys."""
    import numpy as np
    import pyarrow as pa

    from dp_operators.spec import ReleaseSpec

    xs = list(range(cells // Y_KEYS))
    spec = ReleaseSpec.model_validate({
        "version": 1, "release": f"count_{cells}", "budget_account": ACCOUNT, "privacy_unit": "person",
        "aggregates": [{"name": "cell_count", "kind": "count", "group_by": ["x", "y"],
                        "keys": {"x": xs, "y": list(range(Y_KEYS))}, "mechanism": "discrete_laplace",
                        "budget": {"epsilon": 1}}],
    })
    x, y = np.divmod(np.arange(cells, dtype=np.int64), Y_KEYS)
    counts = np.random.default_rng(cells).integers(0, 1000, cells)
    return spec, pa.table({"x": x, "y": y, "count": counts})


def run(spec, table, folder: Path, index: int, rows_file: bool) -> tuple[float, float]:
    """CPU seconds of one release, and of the release plus writing its JSON file as the sink does."""
    from dp_operators.ledger import ReleaseKey
    from dp_operators.operators.sinks import release_json
    from dp_operators.release import run_release
    from dp_operators.release.rows_file import LocalRowsStore

    ledger = make_ledger(folder / f"ledger-{spec.release}-{index}.db")
    key = ReleaseKey(dag_id=DAG_ID, run_id=f"run-{index}", task_id="release", map_index=-1,
                     release_name=spec.release)
    extra = {"rows_store": LocalRowsStore(folder / f"rows-{index}")} if rows_file else {}
    started = time.process_time()
    result = run_release(spec, {"cell_count": table}, ledger, key, spec_hash="0" * 64, **extra)
    engine = time.process_time() - started
    (folder / f"release-{spec.release}-{index}.json").write_text(release_json(result.output))
    return engine, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    inline, filed = release_of(10**5), release_of(10**6)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        run(*inline, folder, -1, False)  # warm: imports, sampler tables
        run(*filed, folder, -2, True)
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(run, *inline, folder, -3, False)
            pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(20)
        times: dict[str, list[tuple[float, float]]] = {"inline 10^5 cells": [], "rows file 10^6 cells": []}
        for index in range(args.runs):
            times["inline 10^5 cells"].append(run(*inline, folder, index, False))
            times["rows file 10^6 cells"].append(run(*filed, folder, index, True))
    medians = {name: [statistics.median(part) for part in zip(*seconds)] for name, seconds in times.items()}
    print(f"{args.runs} runs each, interleaved\n")
    print("| release | engine median CPU s | engine min CPU s | engine + JSON file median CPU s |\n|---|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {medians[name][0]:.3f} | {min(s[0] for s in seconds):.3f} | {medians[name][1]:.3f} |")
    for part, label in enumerate(("engine", "engine + JSON file")):
        ratio = medians["inline 10^5 cells"][part] / medians["rows file 10^6 cells"][part]
        print(f"\n{label}: inline 10^5 / rows file 10^6 = {ratio:.2f} (goal <= 1: "
              f"{'met' if ratio <= 1 else 'not met'})")


if __name__ == "__main__":
    main()
