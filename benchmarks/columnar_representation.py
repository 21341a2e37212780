"""Work that must not grow with a private quantity: the columnar reader's cost with and without one large value.

The engine reads an Arrow table of 10^6 rows over 1,000 public keys (an int64 ``sum`` column, bounds [0, 10^13],
grid 1) twice: once with every value small, once with one in-bounds value of 5e12. Before, one large value switched
the reader to Python ints (0.25 s became 0.77 s); now the representation is chosen from the spec and the column's
type (``dp_operators.release.columns.grid_arithmetic``), so the two must cost the same. Printed: the median of
``--repeats`` reads of each, and their ratio (large / small; 1.0 is the goal, within timing noise), plus which
arithmetic path each took.

Run:  .venv/bin/python benchmarks/columnar_representation.py [--rows 1000000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pyarrow as pa
import yaml

from dp_operators.release import columns
from dp_operators.release.inputs import prepare_inputs
from dp_operators.spec import parse_spec

KEYS = 1000


def spec():
    document = {
        "version": 1, "release": "bench", "budget_account": "acct", "privacy_unit": "person",
        "aggregates": [{"name": "a", "kind": "sum", "group_by": ["g"], "keys": {"g": list(range(KEYS))},
                        "bounds": [0, 10**13], "grid": 1000, "mechanism": "discrete_laplace", "budget": {"epsilon": 1}}],
    }
    return parse_spec(yaml.safe_dump(document), source="bench")


def table(rows: int, large: bool) -> pa.Table:
    generator = np.random.default_rng(7)
    values = generator.integers(0, 1000, rows, dtype=np.int64)
    if large:
        values[rows // 2] = 5 * 10**12
    return pa.table({"g": np.arange(rows, dtype=np.int64) % KEYS, "sum": values})


def timed(release_spec, data: pa.Table, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        prepare_inputs(release_spec, {"a": data})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10**6)
    parser.add_argument("--repeats", type=int, default=7)
    arguments = parser.parse_args()
    release_spec = spec()
    aggregate = release_spec.aggregates[0]
    small, large = table(arguments.rows, False), table(arguments.rows, True)
    path = columns.grid_arithmetic(aggregate, "sum", small.schema.field("sum").type)
    small_seconds = timed(release_spec, small, arguments.repeats)
    large_seconds = timed(release_spec, large, arguments.repeats)
    print(f"rows {arguments.rows}, keys {KEYS}, arithmetic path (from the spec and column type): {path}")
    print(f"all values small : {small_seconds:.3f} s (median of {arguments.repeats})")
    print(f"one value of 5e12: {large_seconds:.3f} s")
    print(f"ratio large / small: {large_seconds / small_seconds:.2f} (goal: 1.0 within timing noise)")


if __name__ == "__main__":
    main()
