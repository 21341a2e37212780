"""A release large enough for rows files, shared by the rows-file tests (``tests/operators/test_rows_files.py``,
``tests/operators/test_rows_file_attacks.py``): a count and a bounded sum over an ``XS x YS`` public key domain
(1,200 cells: rows files above an ``inline_rows_limit`` of 1,000), and their Parquet inputs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

XS, YS = 40, 30


def rows_spec(release: str, account: str, extra: str = "") -> str:
    """The spec text: aggregates ``cells`` (count) and ``sums`` (bounded sum), then ``extra`` aggregates."""
    keys = f"{{x: {list(range(XS))}, y: {[f'y{i}' for i in range(YS)]}}}"
    return f"""\
version: 1
release: {release}
budget_account: {account}
privacy_unit: person
contribution: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
aggregates:
  - name: cells
    kind: count
    group_by: [x, y]
    keys: {keys}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
  - name: sums
    kind: sum
    bounds: [0, 100]
    group_by: [x, y]
    keys: {keys}
    mechanism: discrete_gaussian
    budget: {{epsilon: 1, delta: 1e-7}}
{extra}"""


def write_tables(folder: Path) -> dict[str, str]:
    """``cells.parquet`` and ``sums.parquet`` in ``folder``, one row per key; the reference mapping (file URIs)."""
    n = XS * YS
    xs = [i // YS for i in range(n)]
    ys = [f"y{i % YS}" for i in range(n)]
    pq.write_table(pa.table({"x": xs, "y": ys, "count": [i % 7 for i in range(n)]}), folder / "cells.parquet")
    pq.write_table(pa.table({"x": xs, "y": ys, "sum": [i % 50 for i in range(n)]}), folder / "sums.parquet")
    return {name: f"file://{folder / f'{name}.parquet'}" for name in ("cells", "sums")}
