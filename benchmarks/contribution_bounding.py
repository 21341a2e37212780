"""Contribution bounding from raw rows: the bounded aggregation the operator generates against a plain GROUP BY over
the same table, in the same run, on PostgreSQL, SQLite and pandas.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/contribution_bounding.py [--rows 10000000] [--units 10000] [--keys 20]
        [--repeat 3] [--sqlite-rows 1000000] [--pandas-rows 1000000] [--l0 5] [--linf 100]
        [--settings default work_mem=256MB ...] [--backends postgresql sqlite pandas] [--explain]

The table is shaped like the 2013 NYC flights with the aircraft as the privacy unit: ``--rows`` rows of
``(unit bigint, key text, v double precision)``, ``--units`` units (aircraft) with skewed activity (unit
floor(U u1 u2) for two uniforms: about ``rows / units`` rows each on average, ten times that for the busiest), each
unit's rows spread over 8 neighbouring keys of ``--keys`` (destinations), v a delay-like value in [-15, 305]
(minutes; -15 + 320 u1 u2); 0.5 % of the rows have no unit and 1 % no value, as the bounding drops. It is built by
the database itself (PostgreSQL: ``INSERT ... SELECT ... FROM generate_series`` into an unlogged table in a
throwaway schema, then ``VACUUM ANALYZE``; SQLite: a recursive CTE), never through Python.

The spec has a count and a mean (bounds [-30, 300]) over the public keys, with L0 = ``--l0`` keys per unit (below
``--keys``, so the random choice of partitions runs) and Linf = ``--linf`` rows per key. Timed, each the median of
``--repeat`` runs after one warm-up, executing and fetching the per-key rows only:

* ``plain count``: ``SELECT key, COUNT(*) AS count FROM t GROUP BY key`` (the baseline of the bounded count);
* ``plain count + sum``: ``SELECT key, COUNT(*), SUM(v) FROM t GROUP BY key`` (the baseline of the bounded mean);
* ``two-level GROUP BY``: ``SELECT key, COUNT(*) FROM (SELECT unit, key FROM t GROUP BY unit, key) GROUP BY key``,
  the least work any per-unit bound needs (for reference, not a baseline);
* ``bounded count`` and ``bounded mean``: :func:`dp_operators.release.bounding.bounded_sql` for the dialect.

Each fetched result is asserted to have exactly ``--keys`` rows: no raw row reaches Python. PostgreSQL runs under
each of ``--settings`` (``default`` is the server's configuration; ``name=value[,name=value]`` is ``SET`` on the
session, e.g. ``work_mem=256MB`` or ``max_parallel_workers_per_gather=0``); ``--explain`` prints, per setting, the
plan nodes of the bounded mean under ``EXPLAIN (ANALYZE, BUFFERS)`` with their inclusive and own times. PostgreSQL
at ``DP_LEDGER_TEST_PG_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``); skipped with a message
when unreachable. The pandas section builds the frame with numpy (``--pandas-rows``) and times
:func:`~dp_operators.release.bounding.bound_frame` against ``groupby`` on the same frame.

Times are wall clock on whatever else the machine is running: compare ratios within one run, not seconds across
runs.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dp_operators.release.bounding import BoundedRowsSource, bound_frame, bounded_sql
from dp_operators.spec import load_spec

PG_URL = os.environ.get("DP_LEDGER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
#: Keys a unit spreads its rows over (neighbouring destinations), of ``--keys``.
KEYS_PER_UNIT = 8
BOUNDS = (-30, 300)
COUNT, MEAN = "flights_by_dest", "mean_delay_by_dest"


def key_names(keys: int) -> list[str]:
    return [f"D{k:02d}" for k in range(keys)]


def spec_text(keys: int, l0: int, linf: int) -> str:
    names = ", ".join(key_names(keys))
    return f"""version: 1
release: bounding_benchmark
budget_account: bench
privacy_unit: aircraft
contribution: {{max_partitions_contributed: {l0}, max_contributions_per_partition: {linf}}}
aggregates:
  - name: {COUNT}
    kind: count
    group_by: [key]
    keys: {{key: [{names}]}}
    mechanism: discrete_gaussian
    budget: {{rho: 0.1}}
  - name: {MEAN}
    kind: mean
    group_by: [key]
    keys: {{key: [{names}]}}
    bounds: [{BOUNDS[0]}, {BOUNDS[1]}]
    mechanism: discrete_gaussian
    budget: {{rho: 0.1}}
"""


def load_bench_spec(keys: int, l0: int, linf: int, workdir: Path):
    path = workdir / "bounding_benchmark.yaml"
    path.write_text(spec_text(keys, l0, linf))
    return load_spec(path)


def median_seconds(run: Callable[[], Any], repeat: int, check: Callable[[Any], None]) -> float:
    check(run())  # warm-up (and the check: the per-key rows only)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
        check(result)
    return statistics.median(times)


def sql_queries(spec, table: str, dialect: str) -> dict[str, tuple[str, str | None]]:
    """name -> (SQL, the name of its baseline)."""
    source = BoundedRowsSource(privacy_unit_column="unit", table=table, value_columns={MEAN: "v"})
    count, mean = (next(a for a in spec.aggregates if a.name == name) for name in (COUNT, MEAN))
    return {
        "plain count": (f"SELECT key, COUNT(*) AS count FROM {table} GROUP BY key", None),
        "plain count + sum": (f"SELECT key, COUNT(*) AS count, SUM(v) AS sum FROM {table} GROUP BY key", None),
        "two-level GROUP BY (unit, key), then key": (
            f"SELECT key, COUNT(*) AS units FROM (SELECT unit, key FROM {table} GROUP BY unit, key) AS g GROUP BY key",
            "plain count"),
        "bounded count": (bounded_sql(spec, count, source, dialect), "plain count"),
        "bounded mean": (bounded_sql(spec, mean, source, dialect), "plain count + sum"),
    }


def print_table(title: str, rows: list[tuple[str, str, float, str | None]], keys: int) -> None:
    """rows: (setting, query, seconds, baseline name)."""
    print(f"\n## {title}\n")
    print(f"Median of the timed runs; every result fetched is the {keys} per-key rows only (asserted): no raw row "
          "reaches Python.\n")
    print("| setting | query | seconds | ratio to its plain GROUP BY |\n|---|---|---|---|")
    seconds = {(setting, query): s for setting, query, s, _ in rows}
    for setting, query, s, baseline in rows:
        ratio = "1 (baseline)" if baseline is None else f"{s / seconds[setting, baseline]:.2f}"
        print(f"| {setting} | {query} | {s:.3f} | {ratio} |")


def expect_rows(keys: int) -> Callable[[Any], None]:
    def check(rows: Any) -> None:
        assert len(rows) == keys, f"fetched {len(rows)} rows, expected the {keys} keys"
    return check


# ----------------------------------------------------------------------------------------------------- PostgreSQL


def pg_build(connection, table: str, rows: int, units: int, keys: int) -> float:
    start = time.perf_counter()
    connection.exec_driver_sql(f"CREATE UNLOGGED TABLE {table} (unit bigint, key text, v double precision)")
    connection.exec_driver_sql(f"""
        INSERT INTO {table}
        SELECT CASE WHEN random() < 0.005 THEN NULL ELSE u END,
               'D' || lpad(mod(u + floor(random() * {KEYS_PER_UNIT})::bigint, {keys})::text, 2, '0'),
               CASE WHEN random() < 0.01 THEN NULL ELSE -15 + 320 * random() * random() END
        FROM (SELECT floor({units} * random() * random())::bigint AS u FROM generate_series(1, {rows})) AS g""")
    connection.exec_driver_sql(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - start


def pg_settings(connection, setting: str) -> None:
    connection.exec_driver_sql("RESET ALL")
    if setting != "default":
        for assignment in setting.split(","):
            name, _, value = assignment.partition("=")
            connection.exec_driver_sql(f"SET {name.strip()} = '{value.strip()}'")


def explain_nodes(plan: dict, depth: int = 0) -> list[tuple[int, dict, float]]:
    """(depth, node, own ms): a node's own time is its total time (times loops) less its children's."""
    children = plan.get("Plans", [])
    total = plan.get("Actual Total Time", 0.0) * plan.get("Actual Loops", 1)
    own = total - sum(c.get("Actual Total Time", 0.0) * c.get("Actual Loops", 1) for c in children)
    out = [(depth, plan, own)]
    for child in children:
        out.extend(explain_nodes(child, depth + 1))
    return out


def print_explain(connection, sql: str, setting: str, top: int = 12) -> None:
    import json

    (plan,) = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}").one()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    root = plan[0]["Plan"]
    jit = plan[0].get("JIT", {}).get("Timing", {}).get("Total")
    print(f"\n### EXPLAIN ANALYZE of the bounded mean ({setting}): {root['Actual Total Time']:.0f} ms"
          f"{f', of which JIT compilation {jit:.0f} ms' if jit else ''}\n")
    print("| node | rows | total ms | own ms | detail |\n|---|---|---|---|---|")
    nodes = explain_nodes(root)
    for depth, node, own in nodes[:top]:
        detail = []
        if "Sort Method" in node:
            space = f"{node.get('Sort Space Used', '?')} kB {node.get('Sort Space Type', '')}"
            detail.append(f"{node['Sort Method']}, {space}")
        if "Sort Key" in node:
            detail.append("key " + ", ".join(node["Sort Key"]))
        if node.get("Workers Launched"):
            detail.append(f"{node['Workers Launched']} workers")
        if node.get("Temp Written Blocks"):
            detail.append(f"temp written {node['Temp Written Blocks'] * 8 // 1024} MB")
        if "Strategy" in node:
            detail.append(node["Strategy"])
        name = "&nbsp;" * 2 * depth + node["Node Type"]
        total = node.get("Actual Total Time", 0.0) * node.get("Actual Loops", 1)
        print(f"| {name} | {node.get('Actual Rows', 0):,} | {total:.0f} | {own:.0f} | {'; '.join(detail)} |")


def measure_postgresql(args, spec) -> None:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    table = f"{schema}.flights_like"
    try:
        engine = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except Exception as error:  # noqa: BLE001 - any failure to reach the server: skip the section, say why
        print(f"\n## PostgreSQL: skipped ({sa.make_url(PG_URL).render_as_string()} unreachable: "
              f"{type(error).__name__})")
        return
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
            built = pg_build(connection, table, args.rows, args.units, args.keys)
            size = connection.exec_driver_sql(f"SELECT pg_size_pretty(pg_table_size('{table}'))").scalar()
            version = connection.exec_driver_sql("SHOW server_version").scalar()
            queries = sql_queries(spec, table, "postgresql")
            measured = []
            for setting in args.settings:
                pg_settings(connection, setting)
                shown = connection.exec_driver_sql("SHOW work_mem").scalar()
                label = setting if setting != "default" else f"default (work_mem {shown})"
                for name, (sql, baseline) in queries.items():
                    seconds = median_seconds(lambda sql=sql: connection.exec_driver_sql(sql).fetchall(), args.repeat,
                                             expect_rows(args.keys))
                    measured.append((label, name, seconds, baseline))
            print_table(f"PostgreSQL {version}: {args.rows:,} rows ({size}, built server-side in {built:.0f} s), "
                        f"{args.units:,} units, {args.keys} keys, L0 {args.l0}, Linf {args.linf}", measured, args.keys)
            if args.explain:
                for setting in args.settings:
                    pg_settings(connection, setting)
                    print_explain(connection, queries["bounded mean"][0], setting)
            connection.exec_driver_sql("RESET ALL")
    finally:
        with engine.connect() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


# ---------------------------------------------------------------------------------------------------------- SQLite


def measure_sqlite(args, spec, workdir: Path) -> None:
    path = workdir / "bounding.db"
    rows, units, keys = args.sqlite_rows, args.units, args.keys
    with sqlite3.connect(path) as db:
        start = time.perf_counter()
        db.execute("CREATE TABLE flights_like (unit INTEGER, key TEXT, v REAL)")
        # u1 u2 from two uniform integers in [0, 10^6); random() is a 64-bit integer
        db.execute(f"""
            INSERT INTO flights_like
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}),
                 g(u) AS (SELECT (abs(random()) % 1000000) * (abs(random()) % 1000000) * {units} / 1000000000000
                          FROM n)
            SELECT CASE WHEN abs(random()) % 1000 < 5 THEN NULL ELSE u END,
                   printf('D%02d', (u + abs(random()) % {KEYS_PER_UNIT}) % {keys}),
                   CASE WHEN abs(random()) % 100 < 1 THEN NULL
                        ELSE -15 + 320 * (abs(random()) % 1000000) / 1e6 * (abs(random()) % 1000000) / 1e6 END
            FROM g""")
        db.commit()
        built = time.perf_counter() - start
    measured = []
    with sqlite3.connect(path) as db:
        for name, (sql, baseline) in sql_queries(spec, "flights_like", "sqlite").items():
            seconds = median_seconds(lambda sql=sql: db.execute(sql).fetchall(), args.repeat, expect_rows(keys))
            measured.append(("default", name, seconds, baseline))
    print_table(f"SQLite {sqlite3.sqlite_version}: {rows:,} rows (built in-database in {built:.1f} s), "
                f"{units:,} units, {keys} keys, L0 {args.l0}, Linf {args.linf}", measured, keys)


# ---------------------------------------------------------------------------------------------------------- pandas


def measure_pandas(args, spec) -> None:
    import numpy as np
    import pandas as pd

    rows, units, keys = args.pandas_rows, args.units, args.keys
    rng = np.random.default_rng(12345)
    unit = np.floor(units * rng.random(rows) * rng.random(rows)).astype(np.int64)
    key = (unit + rng.integers(0, KEYS_PER_UNIT, rows)) % keys
    value = -15 + 320 * rng.random(rows) * rng.random(rows)
    value[rng.random(rows) < 0.01] = np.nan
    frame = pd.DataFrame({"unit": pd.array(unit, dtype="Int64"), "key": np.array(key_names(keys), dtype=object)[key],
                          "v": value})
    frame.loc[rng.random(rows) < 0.005, "unit"] = pd.NA
    count, mean = (next(a for a in spec.aggregates if a.name == name) for name in (COUNT, MEAN))
    runs = {
        "plain count": (lambda: frame.groupby("key").size(), None),
        "plain count + sum": (lambda: frame.groupby("key")["v"].agg(["count", "sum"]), None),
        "bounded count (bound_frame)": (lambda: bound_frame(spec, count, frame, "unit", None), "plain count"),
        "bounded mean (bound_frame)": (lambda: bound_frame(spec, mean, frame, "unit", "v"), "plain count + sum"),
    }
    measured = [("default", name, median_seconds(run, args.repeat, expect_rows(keys)), baseline)
                for name, (run, baseline) in runs.items()]
    print_table(f"pandas {pd.__version__}: {rows:,} rows in memory, {units:,} units, {keys} keys, L0 {args.l0}, "
                f"Linf {args.linf}", measured, keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10**7, help="PostgreSQL rows")
    parser.add_argument("--sqlite-rows", type=int, default=10**6)
    parser.add_argument("--pandas-rows", type=int, default=10**6)
    parser.add_argument("--units", type=int, default=10**4)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--l0", type=int, default=5)
    parser.add_argument("--linf", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=["default", "work_mem=256MB"],
                        help="PostgreSQL session settings to measure under: default, or name=value[,name=value]")
    parser.add_argument("--backends", nargs="+", default=["postgresql", "sqlite", "pandas"],
                        choices=["postgresql", "sqlite", "pandas"])
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the bounded mean on PostgreSQL")
    args = parser.parse_args()
    if not 1 <= args.l0 < args.keys or args.keys > 100:
        parser.error("--l0 must be at least 1 and below --keys (so the partition choice runs); --keys at most 100")
    print(f"# Contribution bounding from raw rows vs a plain GROUP BY ({os.cpu_count()} cores; wall clock, median of "
          f"{args.repeat}; other processes on the machine count too)")
    with tempfile.TemporaryDirectory() as tmp:
        spec = load_bench_spec(args.keys, args.l0, args.linf, Path(tmp))
        for backend in args.backends:
            if backend == "postgresql":
                measure_postgresql(args, spec)
            elif backend == "sqlite":
                measure_sqlite(args, spec, Path(tmp))
            else:
                measure_pandas(args, spec)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
