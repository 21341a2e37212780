"""Neighbouring tables through the whole bounded path, as the engine reads it: the generated SQL (SQLite,
PostgreSQL) or the pandas bounding of a file, then ``prepare_inputs``. Adding one privacy unit (any rows, any
column values and types the database or the file reader can hold) must move the engine's vectors by at most the
planned sensitivity: at most L0 partitions, each by at most Linf rows of values in the bounds, the unit count of a
partition by at most 1. A negative control shows the checker catches an unbounded ``GROUP BY``."""

from __future__ import annotations

import io
from fractions import Fraction

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from dp_operators.operators.sources import _aggregate_value
from dp_operators.release.bounding import BoundedRowsSource, bound_frame, bounded_rows, bounded_sql
from dp_operators.release.inputs import prepare_inputs
from dp_operators.spec import ReleaseSpec

from ledger_backends import pg_database  # noqa: F401 - the PostgreSQL fixture

L0, LINF, UPPER = 2, 3, 10
BUDGET = {"mechanism": "discrete_laplace", "budget": {"epsilon": 1}}
SELECTION = {"partition_selection": {"budget": {"epsilon": 1, "delta": 1e-6}}}


def one_aggregate(aggregate: dict, l0: int = L0, linf: int = LINF) -> ReleaseSpec:
    return ReleaseSpec.model_validate({
        "version": 1, "release": "r", "budget_account": "a", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": l0, "max_contributions_per_partition": linf},
        "aggregates": [{"name": "a", **BUDGET, **aggregate}],
    })


def engine_vectors(spec: ReleaseSpec, rows: list[dict]) -> dict[str, dict[tuple, int]]:
    """What the engine noises: component -> {key: grid integer}."""
    aggregate = spec.aggregates[0]
    prepared = prepare_inputs(spec, {"a": _aggregate_value(aggregate, spec, rows, "test")})
    keys = list(prepared.keys["a"])
    return {component: dict(zip(keys, values.tolist()))
            for (_, component), values in prepared.values.items()}


def moved_within_sensitivity(spec: ReleaseSpec, before: dict, after: dict) -> list[str]:
    """The ways ``after`` (one unit added) moved beyond the plan's sensitivity (empty: within it)."""
    aggregate = spec.aggregates[0]
    contribution = spec.contribution_for(aggregate)
    l0, linf = contribution.max_partitions_contributed, contribution.max_contributions_per_partition
    per_row = {"count": 1, "selection": 1 / linf}
    if aggregate.kind != "count":
        lower, upper = aggregate.exact_bounds
        per_row["sum"] = max(abs(lower), abs(upper)) / aggregate.grid
    problems = []
    for component, values in after.items():
        old = before.get(component, {})
        changed = {key: values.get(key, 0) - old.get(key, 0) for key in set(values) | set(old)
                   if values.get(key, 0) != old.get(key, 0)}
        if len(changed) > l0:
            problems.append(f"{component}: {len(changed)} partitions moved (L0 = {l0})")
        for key, delta in changed.items():
            if abs(delta) > linf * per_row[component]:
                problems.append(f"{component}[{key}] moved by {delta} (at most {linf * per_row[component]})")
    return problems


def run_sql(engine: sa.Engine, ddl: str, rows: list[tuple], spec: ReleaseSpec, source: BoundedRowsSource,
            sql: str | None = None) -> list[dict]:
    aggregate = spec.aggregates[0]
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS t")
        conn.exec_driver_sql(ddl)
        for row in rows:
            conn.exec_driver_sql(f"INSERT INTO t VALUES ({', '.join(row)})")
        result = conn.exec_driver_sql(sql or bounded_sql(spec, aggregate, source, engine.dialect.name))
        if sql is not None:  # a hand-written aggregation: its rows as they are
            return [dict(row._mapping) for row in result]
        return bounded_rows(aggregate, list(result.keys()), result.fetchall())


def test_the_checker_catches_an_unbounded_group_by(tmp_path):
    """Negative control: the same neighbours through a plain GROUP BY move the engine's vectors beyond the
    sensitivity, and through the generated SQL they do not."""
    spec = one_aggregate({"kind": "sum", "group_by": ["k"], "keys": {"k": ["a", "b", "c"]}, "bounds": [0, UPPER],
                          "grid": "1"})
    source = BoundedRowsSource(privacy_unit_column="u", table="t", value_columns={"a": "v"})
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'control.db'}")
    ddl = "CREATE TABLE t (u integer, k text, v integer)"
    base = [(str(u), f"'{k}'", "1") for u in range(20) for k in "ab"]
    heavy = [("999", f"'{k}'", "1000") for k in "abc" for _ in range(10)]
    naive = "SELECT k, COUNT(*) AS count, SUM(MIN(MAX(v, 0), 10)) AS sum FROM t GROUP BY k"
    for sql, within in ((naive, False), (None, True)):
        before = engine_vectors(spec, run_sql(engine, ddl, base, spec, source, sql))
        after = engine_vectors(spec, run_sql(engine, ddl, base + heavy, spec, source, sql))
        assert (not moved_within_sensitivity(spec, before, after)) is within, sql


def test_a_null_and_a_nan_key_are_one_partition_for_the_unit_bounds(pg_database):
    """PostgreSQL groups a double key's NULL and NaN apart; the engine reads both as the key None. One unit with
    rows at both must still add at most 1 to that partition's unit count and Linf rows to its count."""
    spec = one_aggregate({"kind": "sum", "group_by": ["k"], "bounds": [0, UPPER], "grid": "1", **SELECTION})
    source = BoundedRowsSource(privacy_unit_column="u", table="t", value_columns={"a": "v"})
    engine = sa.create_engine(pg_database)
    ddl = "CREATE TABLE t (u integer, k double precision, v double precision)"
    base = [(str(u), "1", "1") for u in range(20)]
    person = [("999", "NULL", "10")] * 5 + [("999", "'NaN'", "10")] * 5
    try:
        before = engine_vectors(spec, run_sql(engine, ddl, base, spec, source))
        after = engine_vectors(spec, run_sql(engine, ddl, base + person, spec, source))
    finally:
        engine.dispose()
    assert moved_within_sensitivity(spec, before, after) == []


@pytest.mark.parametrize("column", ["sum_hi", "sum_lo"])
def test_a_key_column_named_like_a_split_sum_keeps_its_keys_on_sqlite(tmp_path, column):
    """SQLite returns each sum as ``sum_hi`` and ``sum_lo``; a group_by column of either name must still come back
    as the key (else the key is replaced by a half of the true sum, and one unit's partitions merge)."""
    spec = one_aggregate({"kind": "sum", "group_by": [column], "keys": {column: [0, 1, 2]}, "bounds": [0, UPPER],
                          "grid": "1"}, l0=3, linf=1)
    source = BoundedRowsSource(privacy_unit_column="u", table="t", value_columns={"a": "v"})
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'split.db'}")
    ddl = f'CREATE TABLE t (u integer, "{column}" integer, v integer)'
    person = [("1", str(key), "10") for key in (0, 1, 2)]  # one unit, one row in each partition
    rows = run_sql(engine, ddl, person, spec, source)
    assert sorted(row[column] for row in rows) == [0, 1, 2]
    assert moved_within_sensitivity(spec, engine_vectors(spec, []), engine_vectors(spec, rows)) == []


def test_a_sqlite_column_without_affinity_holding_1_and_text_1_is_one_partition(tmp_path):
    """A column without type affinity keeps 1 and '1' apart in GROUP BY; over a public domain listing 1 and '2'
    both pass the text filter, and the engine reads both as the partition '1'."""
    spec = one_aggregate({"kind": "count", "group_by": ["k"], "keys": {"k": [1, "2"]}}, l0=2, linf=1)
    source = BoundedRowsSource(privacy_unit_column="u", table="t")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'typeless.db'}")
    person = [("1", "1"), ("1", "'1'"), ("1", "2"), ("1", "'2'")]
    rows = run_sql(engine, "CREATE TABLE t (u integer, k)", person, spec, source)
    assert moved_within_sensitivity(spec, engine_vectors(spec, []), engine_vectors(spec, rows)) == []


def csv_rows(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text))


def parquet_rows(text: str) -> pd.DataFrame:
    frame = pd.read_csv(io.StringIO(text), dtype={"k": "Int64"})
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None), buffer)
    buffer.seek(0)
    return pd.read_parquet(buffer)


@pytest.mark.parametrize("read", [csv_rows, parquet_rows], ids=["csv", "parquet"])
def test_one_unit_with_a_missing_key_moves_a_file_release_within_the_sensitivity(read):
    """An integer key column becomes float64 when one row's key is missing (CSV inference; Arrow's to_pandas of
    an int column with nulls): the type of every other unit's key must not depend on that one row."""
    spec = one_aggregate({"kind": "count", "group_by": ["k"], "keys": {"k": [1, 2, 3]}}, l0=1, linf=1)
    table = "u,k\n" + "".join(f"{u},{u % 3 + 1}\n" for u in range(100))
    vectors = []
    for text in (table, table + "999,\n"):
        frame = read(text)
        vectors.append(engine_vectors(spec, bound_frame(spec, spec.aggregates[0], frame, "u", None)))
    assert moved_within_sensitivity(spec, *vectors) == []


@pytest.mark.parametrize("dtype", ["string", "Int64"])
def test_a_missing_key_in_a_nullable_column_is_dropped_not_raised(dtype):
    """pandas' nullable dtypes (restored from a Parquet file's pandas metadata) hold missing keys as pd.NA: its
    row is outside the public domain, as None and NaN are; no exception that only a missing key triggers."""
    keys = ["1", None, "2"] if dtype == "string" else [1, None, 2]
    spec = one_aggregate({"kind": "count", "group_by": ["k"],
                          "keys": {"k": ["1", "2"] if dtype == "string" else [1, 2]}}, l0=1, linf=1)
    frame = pd.DataFrame({"u": [1, 2, 3], "k": pd.array(keys, dtype=dtype)})
    rows = bound_frame(spec, spec.aggregates[0], frame, "u", None)
    assert sorted((str(row["k"]), row["count"]) for row in rows) == [("1", 1), ("2", 1)]
    assert Fraction(sum(row["units"] for row in rows)) == 2
