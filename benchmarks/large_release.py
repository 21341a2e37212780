"""Large releases from Parquet (issue 11): wall time and peak RSS of a count and a bounded sum over N public keys,
through the engine and through the operator, beside the same vectors noised by OpenDP and by numpy.

For each N (10^4, 10^5, 10^6 by default; 10^7 with ``--sizes``) the parent process writes, in a temporary folder:

* a spec with two aggregates over the SAME public key domain, the product of ``x`` in ``range(N // 1000)`` and
  ``y`` in ``range(1000)`` (a YAML anchor, so the spec stays a few kB): ``cell_count`` (count, discrete Laplace,
  epsilon 1) and ``cell_sum`` (sum, bounds [0, 100], discrete Gaussian, rho 1/2); one contribution per person;
* one Parquet file per aggregate (pyarrow; int64 columns ``x``, ``y`` and ``count`` or ``sum``; one row per key).

Then two fresh subprocesses per N, so that each peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) belongs
to one run; the RSS just before the run (``psutil``) is the baseline (interpreter, imports, ledger, spec):

1. ``engine``: :func:`dp_operators.release.run_release` on the tables read with ``pyarrow.parquet.read_table``,
   with a fresh SQLite ledger (zCDP account). The engine is given each aggregate as a ``pyarrow.Table`` first; if
   it refuses that with ``ReleaseInputError`` (before anything is reserved), as a list of row dicts
   (``Table.to_pylist()``), and the form used is printed. If ``run_release`` takes a ``rows_store``, a local one
   is given (large outputs then go to Parquet rows files the ledger records by digest). Engine seconds = Parquet
   read + conversion + the release; peak RSS is read right after it. The same process then noises the same true
   vectors with OpenDP (``make_laplace`` / ``make_gaussian`` on ``vector_domain(atom_domain(T=int))``, the
   engine's planned scales; skipped above 10^6 keys unless ``--opendp-all``: about 14 s per 10^6 draws) and with
   numpy's float samplers (``Generator.laplace`` / ``normal``: not exact, not safe, the speed floor only);
2. ``operator``: :class:`dp_operators.operators.DPReleaseOperator` with ``aggregates_uri`` mapping each aggregate
   to its Parquet file and a Parquet sink (``output_formats=["parquet"]``), its ``execute`` called directly with
   the test suite's fake task instance (``tests/airflow_fakes.py``), the ledger behind an ``AIRFLOW_CONN_...``
   connection. Operator seconds = ``execute`` (read, release, publish).

Cells: keys per aggregate, and in total (both aggregates). Ratios are engine (and operator) seconds over OpenDP's
seconds for the same two vectors: OpenDP times the noise only, the engine the whole release. The goals of issue 11
are printed with whether each is met (a goal on a size not run is "not run"). "Memory that does not grow beyond the
arrays" is judged between the two largest sizes run: peak RSS per added key, against :data:`ARRAY_FACTOR` times
the input arrays' bytes per key (fixed costs, such as imports, the ledger and sampler tables, cancel out).

With the engine before issue 11 (commit 45abd3e: row dicts, Fractions per key) 10^6 keys took 145 s and 2.4 GB: 10^7
keys would need some 25 GB. Run 10^7 only with the vectorised engine.

Run:  .venv/bin/python benchmarks/large_release.py [--sizes 10000,100000,1000000,10000000] [--quick] [--opendp-all]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = (10**4, 10**5, 10**6)
OPENDP_CAP = 10**6
Y_KEYS = 1000
RELEASE = "large_release_benchmark"
DAG_ID = "large_release_benchmark"
ACCOUNT = "benchmark"
AGGREGATES = {"cell_count": "count", "cell_sum": "sum"}  # aggregate name -> its value column
LEDGER_CONN_ID = "large_release_ledger"

#: Issue 11's goals: seconds and MB of peak RSS for 10^6 keys; seconds for 10^7 keys.
GOAL_1E6_SECONDS, GOAL_1E6_MB, GOAL_1E7_SECONDS = 5.0, 1024.0, 60.0
#: "Memory that does not grow with the number of cells beyond the arrays themselves", made checkable: between the two
#: largest sizes run, peak RSS may grow per added key by at most this many times the input arrays (x, y and the value
#: as int64 for each aggregate: 48 bytes per key), i.e. an output of the input's size and one working copy of each.
ARRAY_FACTOR = 4


def spec_text(size: int) -> str:
    """The release spec for ``size`` keys: both aggregates over one key domain (x, y), written once (YAML anchor)."""
    ys = min(size, Y_KEYS)
    domain = f"{{x: {list(range(size // ys))}, y: {list(range(ys))}}}"
    return f"""version: 1
release: {RELEASE}
budget_account: {ACCOUNT}
privacy_unit: person
contribution: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
aggregates:
  - name: cell_count
    kind: count
    group_by: [x, y]
    keys: &domain {domain}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
  - name: cell_sum
    kind: sum
    group_by: [x, y]
    keys: *domain
    bounds: [0, 100]
    mechanism: discrete_gaussian
    budget: {{rho: 0.5}}
"""


def write_inputs(folder: Path, size: int) -> None:
    """``spec.yaml`` and one Parquet file per aggregate (``<name>.parquet``) for ``size`` keys, in key order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    ys = min(size, Y_KEYS)
    rng = np.random.default_rng()
    x = np.repeat(np.arange(size // ys, dtype=np.int64), ys)
    y = np.tile(np.arange(ys, dtype=np.int64), size // ys)
    counts = rng.integers(0, 1000, size, dtype=np.int64)
    sums = rng.integers(0, 100_000, size, dtype=np.int64)
    (folder / "spec.yaml").write_text(spec_text(size))
    for name, column, values in (("cell_count", "count", counts), ("cell_sum", "sum", sums)):
        pq.write_table(pa.table({"x": x, "y": y, column: values}), folder / f"{name}.parquet")


# -- measurements inside a child process ---------------------------------------------------------------------------

def rss_mb() -> float:
    """This process's resident set now, MB."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """This process's peak resident set so far, MB (``ru_maxrss`` is KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def make_ledger(path: Path):
    """A fresh SQLite ledger at ``path`` with one zCDP account allowing :data:`DAG_ID`; returns the spender's
    :class:`~dp_operators.ledger.Ledger` and the spend key's text (as ``tests/support.py`` builds one)."""
    from dp_operators.ledger import AccountConfig, AuditKey, Ledger, LedgerConfig, LedgerGovernor

    spend_key = AuditKey.generate()
    url = f"sqlite:///{path}"
    officer = LedgerGovernor(url, governor_key=AuditKey.generate(), spend_key=spend_key)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={ACCOUNT: AccountConfig(
        accountant="zcdp", cap=Fraction(1000), delta=Fraction(1, 10**6), privacy_unit="person",
        allowed_dags=[DAG_ID],
    )}))
    return Ledger(url, audit_key=spend_key), spend_key.text


def published_cells(output: dict) -> dict[str, int | None]:
    """Rows published per aggregate: inline ``rows``, or the count a ``rows_file`` records (None if neither)."""
    cells = {}
    for name in AGGREGATES:
        published = output.get("aggregates", {}).get(name, {})
        if isinstance(published.get("rows"), list):
            cells[name] = len(published["rows"])
        else:
            cells[name] = (published.get("rows_file") or {}).get("rows")
    return cells


def rows_store_argument(run_release, folder: Path) -> dict:
    """``{"rows_store": a local store under folder}`` if the engine takes one (large outputs go to a Parquet file
    the ledger records by digest), else ``{}``."""
    import inspect

    if "rows_store" not in inspect.signature(run_release).parameters:
        return {}
    from dp_operators.release.rows_file import LocalRowsStore

    return {"rows_store": LocalRowsStore(folder / "rows")}


def engine_child(folder: Path, opendp: bool) -> dict:
    """Run 1 (module docstring): the engine, then OpenDP and numpy on the same vectors, in this process."""
    import numpy as np
    import pyarrow.dataset  # noqa: F401 - read_table imports it on first use: keep that out of the read time
    import pyarrow.parquet as pq

    from dp_operators.ledger import ReleaseKey
    from dp_operators.release import ReleaseInputError, plan_release, run_release
    from dp_operators.spec import load_spec_with_hash

    spec, spec_hash = load_spec_with_hash(str(folder / "spec.yaml"))
    ledger, _ = make_ledger(folder / "engine-ledger.db")
    key = ReleaseKey(dag_id=DAG_ID, run_id="engine", task_id="release", map_index=-1, release_name=spec.release)
    store = rows_store_argument(run_release, folder)
    result = {"baseline_mb": rss_mb()}

    start = time.perf_counter()
    tables = {name: pq.read_table(folder / f"{name}.parquet") for name in AGGREGATES}
    result["read_s"] = time.perf_counter() - start
    result["input_mb"] = sum(table.nbytes for table in tables.values()) / 2**20
    try:
        start = time.perf_counter()
        released = run_release(spec, dict(tables), ledger, key, spec_hash=spec_hash, **store)
        result["release_s"] = time.perf_counter() - start
        result["input_form"] = "pyarrow.Table"
        result["convert_s"] = 0.0
    except ReleaseInputError:  # refused before anything was reserved: give the rows instead
        start = time.perf_counter()
        rows = {name: table.to_pylist() for name, table in tables.items()}
        result["convert_s"] = time.perf_counter() - start
        start = time.perf_counter()
        released = run_release(spec, rows, ledger, key, spec_hash=spec_hash, **store)
        result["release_s"] = time.perf_counter() - start
        result["input_form"] = "rows (Table.to_pylist())"
        del rows
    result["engine_s"] = result["read_s"] + result["convert_s"] + result["release_s"]
    result["engine_peak_mb"] = peak_rss_mb()
    result["cells"] = published_cells(released.output)
    filed = any("rows_file" in released.output.get("aggregates", {}).get(name, {}) for name in AGGREGATES)
    result["output"] = "Parquet rows files" if filed else "inline rows"
    del released

    plan = plan_release(spec, accountant="zcdp")
    steps = {name: plan.step(name, column) for name, column in AGGREGATES.items()}
    truth = {name: tables[name].column(column).to_numpy() for name, column in AGGREGATES.items()}
    floats = {name: float(step.scale) if step.mechanism == "discrete_laplace" else math.sqrt(step.scale)
              for name, step in steps.items()}  # OpenDP and numpy: Laplace scale t, Gaussian sigma
    result["scales"] = {name: f"{step.mechanism} {'t' if step.mechanism == 'discrete_laplace' else 'sigma^2'}="
                        f"{step.scale}" for name, step in steps.items()}

    rng = np.random.default_rng()
    start = time.perf_counter()
    for name, step in steps.items():
        sampler = rng.laplace if step.mechanism == "discrete_laplace" else rng.normal
        truth[name] + sampler(0.0, floats[name], truth[name].size)
    result["numpy_s"] = time.perf_counter() - start

    result["opendp_s"] = None
    if opendp:
        import opendp.prelude as dp

        dp.enable_features("contrib")
        vectors = {name: values.tolist() for name, values in truth.items()}  # OpenDP's T=int takes a list
        domain = dp.vector_domain(dp.atom_domain(T=int))
        start = time.perf_counter()
        for name, step in steps.items():
            if step.mechanism == "discrete_laplace":
                measurement = dp.m.make_laplace(domain, dp.l1_distance(T=int), scale=floats[name])
            else:
                measurement = dp.m.make_gaussian(domain, dp.l2_distance(T=int), scale=floats[name])
            measurement(vectors[name])
        result["opendp_s"] = time.perf_counter() - start
    return result


def operator_child(folder: Path) -> dict:
    """Run 2 (module docstring): ``DPReleaseOperator.execute`` from Parquet files to a Parquet sink."""
    os.environ["AIRFLOW_HOME"] = str(folder / "airflow")  # before Airflow is imported: never ~/airflow
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    _, spend_key = make_ledger(folder / "operator-ledger.db")
    os.environ[f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}"] = json.dumps({"conn_type": "dp_ledger", "extra": {
        "url": f"sqlite:///{folder / 'operator-ledger.db'}", "audit_key": spend_key}})

    import pyarrow.parquet as pq

    sys.path.insert(0, str(REPO / "tests"))
    from airflow_fakes import NoXComTaskInstance, context_for

    from dp_operators.operators.locations import storage_path_of
    from dp_operators.operators.release import DPReleaseOperator

    operator = DPReleaseOperator(
        task_id="release", spec_path=folder / "spec.yaml", ledger_conn_id=LEDGER_CONN_ID,
        aggregates_uri={name: f"file://{folder / name}.parquet" for name in AGGREGATES},
        output_uri=f"file://{folder / 'out'}", output_formats=["parquet"],
    )
    ti = NoXComTaskInstance(dag_id=DAG_ID, task_id="release", run_id="operator")
    result = {"baseline_mb": rss_mb()}
    start = time.perf_counter()
    operator.execute(context_for(ti))
    result["operator_s"] = time.perf_counter() - start
    result["operator_peak_mb"] = peak_rss_mb()
    sink = storage_path_of(operator.published.locations["parquet"]).path  # a published URI, percent-encoded
    result["sink_rows"] = pq.read_metadata(sink).num_rows
    result["sink_mb"] = Path(sink).stat().st_size / 2**20
    return result


# -- the parent: inputs, children, table, goals ---------------------------------------------------------------------

@dataclass
class Size:
    """What the children measured for one N (None where a run failed or was skipped)."""

    keys: int
    engine: dict | None = None
    operator: dict | None = None
    failures: list[str] | None = None


def run_child(phase: str, folder: Path, extra: list[str]) -> tuple[dict | None, str | None]:
    """Run one phase in a fresh interpreter; its result, or None and the tail of its stderr."""
    result_file = folder / f"{phase}.json"
    command = [sys.executable, __file__, "--child", phase, "--folder", str(folder), *extra]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0 or not result_file.exists():
        tail = "\n".join(done.stderr.strip().splitlines()[-6:])
        return None, f"{phase} exited with {done.returncode}:\n{tail}"
    return json.loads(result_file.read_text()), None


def measure(size: int, opendp_all: bool) -> Size:
    with tempfile.TemporaryDirectory(prefix="large-release-") as name:
        folder = Path(name)
        write_inputs(folder, size)
        opendp = opendp_all or size <= OPENDP_CAP
        engine, failed_engine = run_child("engine", folder, ["--opendp"] if opendp else [])
        operator, failed_operator = run_child("operator", folder, [])
    failures = [f for f in (failed_engine, failed_operator) if f]
    return Size(size, engine, operator, failures or None)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or not denominator:
        return "-"
    ratio = numerator / denominator
    return f"{ratio:.1f}" if ratio >= 1 else f"{ratio:.2g}"


def print_table(results: list[Size]) -> None:
    header = (f"{'keys N':>11}{'cells/agg':>11}{'cells':>11}{'engine s':>10}{'operator s':>11}{'base MB':>9}"
              f"{'peak eng MB':>12}{'peak op MB':>11}{'OpenDP s':>10}{'numpy s':>9}{'eng/OpenDP':>11}"
              f"{'op/OpenDP':>10}")
    print("\n" + header)
    print("-" * len(header))
    for r in results:
        e, o = r.engine or {}, r.operator or {}
        cells = e.get("cells") or {}
        per = {v for v in cells.values() if v is not None}
        per_agg = f"{per.pop():,}" if len(per) == 1 else "?"
        total = f"{sum(cells.values()):,}" if cells and None not in cells.values() else "?"
        print(f"{r.keys:>11,}{per_agg:>11}{total:>11}{_fmt(e.get('engine_s'), '.2f'):>10}"
              f"{_fmt(o.get('operator_s'), '.2f'):>11}{_fmt(e.get('baseline_mb'), '.0f'):>9}"
              f"{_fmt(e.get('engine_peak_mb'), '.0f'):>12}{_fmt(o.get('operator_peak_mb'), '.0f'):>11}"
              f"{_fmt(e.get('opendp_s'), '.2f'):>10}{_fmt(e.get('numpy_s'), '.3f'):>9}"
              f"{_ratio(e.get('engine_s'), e.get('opendp_s')):>11}{_ratio(o.get('operator_s'), e.get('opendp_s')):>10}")
    print("\ncells: published rows per aggregate and in total (2 aggregates); engine s = Parquet read + input "
          "conversion + run_release; operator s = execute (read, release, Parquet sink); base MB: RSS before the "
          "engine's run (operator's in the details); OpenDP and numpy noise both vectors (skipped OpenDP: -)")


def print_details(r: Size) -> None:
    e, o = r.engine, r.operator
    if e:
        print(f"  engine: input {e['input_form']}, output {e['output']}; read {e['read_s']:.2f} s, conversion "
              f"{e['convert_s']:.2f} s, run_release {e['release_s']:.2f} s; RSS {e['baseline_mb']:.0f} MB before, peak "
              f"{e['engine_peak_mb']:.0f} MB; input tables {e['input_mb']:.1f} MB; noise "
              f"{', '.join(e['scales'].values())}")
    if o:
        print(f"  operator: execute {o['operator_s']:.2f} s; RSS {o['baseline_mb']:.0f} MB before, peak "
              f"{o['operator_peak_mb']:.0f} MB; Parquet sink {o['sink_rows']:,} rows, {o['sink_mb']:.1f} MB")
    for failure in r.failures or []:
        print("  FAILED " + failure.replace("\n", "\n    "))


def print_goals(results: list[Size]) -> None:
    by_size = {r.keys: r for r in results}

    def verdict(ok: bool | None) -> str:
        return "not run" if ok is None else ("met" if ok else "NOT met")

    print("\nGoals (issue 11; its cells are taken as keys per aggregate: each release holds twice as many cells):")
    million = by_size.get(10**6)
    for label, run, seconds_field, peak_field in (("engine", "engine", "engine_s", "engine_peak_mb"),
                                                  ("operator", "operator", "operator_s", "operator_peak_mb")):
        measured = getattr(million, run) if million else None
        ok = None if measured is None else (measured[seconds_field] < GOAL_1E6_SECONDS
                                            and measured[peak_field] < GOAL_1E6_MB)
        figures = "" if measured is None else f" ({measured[seconds_field]:.1f} s, {measured[peak_field]:.0f} MB)"
        print(f"  10^6 keys (2 x 10^6 cells) in < {GOAL_1E6_SECONDS:g} s and < {GOAL_1E6_MB / 1024:g} GB peak, "
              f"{label}: {verdict(ok)}{figures}")
    ten_million = by_size.get(10**7)
    for label, run, seconds_field in (("engine", "engine", "engine_s"), ("operator", "operator", "operator_s")):
        measured = getattr(ten_million, run) if ten_million else None
        ok = None if measured is None else measured[seconds_field] < GOAL_1E7_SECONDS
        figures = "" if measured is None else f" ({measured[seconds_field]:.1f} s)"
        print(f"  10^7 keys (2 x 10^7 cells) in < {GOAL_1E7_SECONDS:g} s, {label}: {verdict(ok)}{figures}")
    # the marginal memory per key between the two largest sizes run: fixed costs (lazy imports, sampler tables,
    # the ledger) cancel, what is left grows with the number of keys
    for label, run, peak_field in (("engine", "engine", "engine_peak_mb"),
                                   ("operator", "operator", "operator_peak_mb")):
        ran = sorted((r for r in results if r.engine and getattr(r, run)), key=lambda r: r.keys)
        if len(ran) < 2:
            print(f"  memory grows with the arrays only, {label}: not run (needs two sizes)")
            continue
        small, large = ran[-2], ran[-1]
        keys = large.keys - small.keys
        arrays = (large.engine["input_mb"] - small.engine["input_mb"]) * 2**20 / keys
        grown = (getattr(large, run)[peak_field] - getattr(small, run)[peak_field]) * 2**20 / keys
        print(f"  memory grows with the arrays only, {label}: {verdict(grown <= ARRAY_FACTOR * arrays)} (peak RSS "
              f"{grown:,.0f} B per added key from {small.keys:,} to {large.keys:,} keys; limit {ARRAY_FACTOR} x "
              f"the input arrays' {arrays:,.0f} B/key)")


def parse_sizes(text: str) -> list[int]:
    sizes = [int(float(part)) for part in text.split(",") if part.strip()]
    for size in sizes:
        ys = min(size, Y_KEYS)
        if size < 1 or size % ys:
            raise argparse.ArgumentTypeError(f"size {size}: give a multiple of {Y_KEYS} (or a size below it)")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=list(DEFAULT_SIZES),
                        help="comma-separated numbers of keys (default 10000,100000,1000000; add 10000000)")
    parser.add_argument("--quick", action="store_true", help="10^4 keys only")
    parser.add_argument("--opendp-all", action="store_true", help=f"run OpenDP above {OPENDP_CAP:,} keys too")
    parser.add_argument("--child", choices=("engine", "operator"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--opendp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = engine_child(args.folder, args.opendp) if args.child == "engine" else operator_child(args.folder)
        (args.folder / f"{args.child}.json").write_text(json.dumps(result))
        return
    sizes = [10**4] if args.quick else args.sizes
    print(f"large release: count (discrete Laplace) + bounded sum (discrete Gaussian) over N keys, sizes "
          f"{', '.join(f'{n:,}' for n in sizes)}; each run in a fresh subprocess", flush=True)
    results = []
    for size in sizes:
        start = time.perf_counter()
        measured = measure(size, args.opendp_all)
        results.append(measured)
        print(f"N = {size:,} ({time.perf_counter() - start:.0f} s in all)", flush=True)
        print_details(measured)
    print_table(results)
    print_goals(results)


if __name__ == "__main__":
    main()
