"""The columnar reader (dp_operators.release.columns) against the row-by-row reader: on random Arrow tables, with
repeated keys, keys outside the domain, NULL keys, negative and huge values, both give the same grid integers and
the same diagnostics. A table whose types the columnar reader does not take goes the row-by-row way."""

from __future__ import annotations

import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from dp_operators.release import SATURATION, DiagnosticsReport, check_aggregates, plan_release, prepare_inputs
from dp_operators.release import columns
from dp_operators.spec import parse_spec


def spec_text(kind: str, grid: str | None = None, xs=(0, 1, 2, 3), ys=("a", "b", "é", "d\"q")) -> str:
    bounds = "\n    bounds: [-50, 100]" if kind == "sum" else ""
    grid_line = f"\n    grid: {grid}" if grid else ""
    ys_yaml = "[" + ", ".join(f"'{y}'" for y in ys) + "]"
    return f"""
version: 1
release: columnar
budget_account: acct
privacy_unit: person
contribution: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
aggregates:
  - name: agg
    kind: {kind}{bounds}{grid_line}
    group_by: [x, y]
    keys: {{x: {list(xs)}, y: {ys_yaml}}}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
"""


def spec_with_policy(kind: str, grid: str | None, policy: str, ys=("a", "b", "c")):
    """A count or sum over x in 0..3 and ``ys`` whose NaN/NULL policy (``non_finite.nan``) is ``policy``."""
    return parse_spec(spec_text(kind, grid, ys=ys).replace(
        "    mechanism: discrete_laplace", f"    non_finite: {{nan: {policy}}}\n    mechanism: discrete_laplace"))


def random_table(rng, kind: str, rows: int, huge: bool = False, decimals: int | None = None) -> pa.Table:
    xs = rng.integers(-1, 5, rows)  # -1 and 4 lie outside the domain
    ys = rng.choice(np.array(["a", "b", "é", 'd"q', "zz"], dtype=object), rows)
    field = "count" if kind == "count" else "sum"
    scale = 2**61 if huge else 200
    values = rng.integers(-scale, scale, rows)
    if decimals is not None:  # NUMERIC(18, decimals): the same digits, scaled
        digits = rng.integers(-10**17, 10**17, rows) if huge else rng.integers(-9000, 9000, rows)
        column = pa.array([Decimal(int(d)).scaleb(-decimals) for d in digits], pa.decimal128(18, decimals))
        x_array = pa.array(xs, mask=rng.random(rows) < 0.05, type=pa.int32())
        return pa.table({"x": x_array, "y": pa.array(ys.tolist(), type=pa.string()), field: column})
    x_array = pa.array(xs, mask=rng.random(rows) < 0.05, type=pa.int32())  # some NULL keys
    return pa.table({"x": x_array, "y": pa.array(ys.tolist(), type=pa.string()), field: pa.array(values)})


def both_ways(spec, table):
    fast_report, slow_report = DiagnosticsReport("columnar"), DiagnosticsReport("columnar")
    assert columns.columnar_eligible(None, spec.aggregates[0], table.schema)
    fast = prepare_inputs(spec, {"agg": table}, diagnostics=fast_report)
    slow = prepare_inputs(spec, {"agg": table.to_pylist()}, diagnostics=slow_report)
    return fast, slow, fast_report, slow_report


@pytest.mark.parametrize("kind,grid", [("count", None), ("sum", None), ("sum", "0.25"), ("sum", "7"), ("sum", "1/3")])
@pytest.mark.parametrize("seed", range(4))
def test_columnar_and_row_readers_agree(kind, grid, seed):
    rng = np.random.default_rng(seed)
    spec = parse_spec(spec_text(kind, grid))
    table = random_table(rng, kind, 400, huge=seed == 3)
    fast, slow, fast_report, slow_report = both_ways(spec, table)
    component = spec.aggregates[0].components[0]
    got, want = fast.values[("agg", component)], slow.values[("agg", component)]
    assert got.dtype == np.int64 and want.dtype == np.int64
    assert np.array_equal(got, want)
    assert list(fast.keys["agg"]) == list(slow.keys["agg"])
    assert fast_report.as_dict() == slow_report.as_dict()


@pytest.mark.parametrize("kind,grid", [("count", None), ("sum", None), ("sum", "0.25"), ("sum", "1/3"), ("sum", "1e-6")])
@pytest.mark.parametrize("decimals", [0, 2, 7])
@pytest.mark.parametrize("huge", [False, True])
def test_decimal_columns_agree_with_the_row_reader(kind, grid, decimals, huge):
    spec = parse_spec(spec_text(kind, grid))
    table = random_table(np.random.default_rng(decimals), kind, 300, huge=huge, decimals=decimals)
    fast, slow, fast_report, slow_report = both_ways(spec, table)
    component = spec.aggregates[0].components[0]
    assert np.array_equal(fast.values[("agg", component)], slow.values[("agg", component)])
    assert fast_report.as_dict() == slow_report.as_dict()


def test_saturation_and_clamping_agree():
    spec = parse_spec(spec_text("count"))
    table = pa.table({"x": pa.array([0, 0, 1, 2], pa.int64()), "y": ["a", "a", "b", "é"],
                      "count": pa.array([2**62, 2**62, -5, 3], pa.int64())})
    fast, slow, fast_report, slow_report = both_ways(spec, table)
    assert np.array_equal(fast.values[("agg", "count")], slow.values[("agg", "count")])
    seen = fast_report.as_dict()["aggregates"]["agg"]
    assert seen["saturated"] == {"count": 1} and seen["clamped"] == {"count": 1}
    assert fast_report.as_dict() == slow_report.as_dict()


def test_a_negative_control_the_comparison_can_fail():
    # the same comparison must see a difference when the data differ by one row
    spec = parse_spec(spec_text("count"))
    table = pa.table({"x": pa.array([0, 1], pa.int64()), "y": ["a", "b"], "count": pa.array([3, 4], pa.int64())})
    fast = prepare_inputs(spec, {"agg": table})
    neighbour = prepare_inputs(spec, {"agg": table.slice(0, 1).to_pylist()})
    assert not np.array_equal(fast.values[("agg", "count")], neighbour.values[("agg", "count")])


@pytest.mark.parametrize(
    "table, reason",
    [
        (pa.table({"x": pa.array([0], pa.int64()), "y": ["a"], "count": pa.array([1.0])}), "float value"),
        (pa.table({"x": pa.array([0], pa.int64()), "y": ["a"], "count": pa.array([Decimal(1)], pa.decimal128(19, 0))}),
         "decimal of 19 digits"),
        (pa.table({"x": pa.array([0], pa.uint64()), "y": ["a"], "count": pa.array([1], pa.int64())}), "uint64"),
        (pa.table({"x": ["0"], "y": ["a"], "count": pa.array([1], pa.int64())}), "text key for int domain"),
    ],
)
def test_other_types_go_the_row_by_row_way(table, reason):
    spec = parse_spec(spec_text("count"))
    assert not columns.columnar_eligible(None, spec.aggregates[0], table.schema), reason


@pytest.mark.parametrize("policy", ["replace", "drop"])
@pytest.mark.parametrize("kind", ["count", "sum"])
def test_a_null_value_follows_non_finite_in_the_columnar_reader_too(policy, kind):
    spec = spec_with_policy(kind, None, policy, ys=("a", "b", "é", 'd"q'))
    table = pa.table({"x": pa.array([0, 1, 1, 9], pa.int64()), "y": ["a", "b", "b", "a"],
                      kind: pa.array([3, None, 4, None], pa.int64())})
    assert columns.columnar_eligible(None, spec.aggregates[0], table.schema)  # the schema decides, not the NULL
    fast, slow, fast_report, slow_report = both_ways(spec, table)
    assert np.array_equal(fast.values[("agg", kind)], slow.values[("agg", kind)])
    assert fast_report.as_dict() == slow_report.as_dict()
    seen = fast_report.as_dict()["aggregates"]["agg"]
    assert seen["special_values"] == {kind: {"null": 1}}  # the NULL outside the domain is not counted
    assert seen["rows_dropped"] == (1 if policy == "drop" else 0)


def test_a_text_key_column_for_an_int_domain_is_refused_as_rows_are():
    from dp_operators.release import ReleaseInputError

    spec = parse_spec(spec_text("count"))
    table = pa.table({"x": ["0"], "y": ["a"], "count": pa.array([1], pa.int64())})
    with pytest.raises(ReleaseInputError, match="key column 'x' holds str keys"):
        prepare_inputs(spec, {"agg": table})


def test_the_key_domain_is_not_materialised():
    spec = parse_spec(spec_text("count", xs=tuple(range(3000)), ys=tuple(f"k{i}" for i in range(1000))))
    table = pa.table({"x": pa.array([2999], pa.int64()), "y": ["k999"], "count": pa.array([7], pa.int64())})
    prepared = prepare_inputs(spec, {"agg": table})
    keys = prepared.keys["agg"]
    assert len(keys) == 3_000_000 and keys[-1] == (2999, "k999") and keys[1001] == (1, "k1")
    assert prepared.values[("agg", "count")][-1] == 7


# -- NULLs in every layout -----------------------------------------------------------------------------------------

def _null_table(rng, kind: str, value_type: str, dictionary: bool, chunks: int, sliced: bool, huge: bool):
    """Random rows with NULLs in the value (20 %) and in both keys (10 % each), keys outside the domain too."""
    rows = 80
    field = "count" if kind == "count" else "sum"
    null_value = rng.random(rows) < 0.2
    if value_type.startswith("decimal"):
        scale = int(value_type.removeprefix("decimal"))
        digits = rng.integers(-10**17, 10**17, rows) if huge else rng.integers(-9000, 9000, rows)
        values = pa.array([None if n else Decimal(int(d)).scaleb(-scale) for d, n in zip(digits, null_value)],
                          pa.decimal128(18, scale))
    else:
        low, high = (-2**63, 2**63 - 1) if huge else (-100, 100)
        values = pa.array(rng.integers(low, high, rows, dtype=np.int64, endpoint=True), mask=null_value,
                          type=pa.int64()).cast(getattr(pa, value_type)(), safe=False)
    x = pa.array(rng.integers(-1, 5, rows), mask=rng.random(rows) < 0.1, type=pa.int32())
    y = pa.array(rng.choice(["a", "b", "c", "zz"], rows).tolist(), mask=rng.random(rows) < 0.1, type=pa.string())
    if dictionary:
        values, x, y = values.dictionary_encode(), x.dictionary_encode(), y.dictionary_encode()
    table = pa.table({"x": x, "y": y, field: values})
    if chunks > 1:
        cuts = sorted(rng.choice(range(1, rows), chunks - 1, replace=False).tolist())
        table = pa.concat_tables([table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, rows])])
    return table.slice(3, rows - 7) if sliced else table


@pytest.mark.parametrize("policy", ["replace", "drop"])
@pytest.mark.parametrize("kind,grid", [("count", None), ("sum", None), ("sum", "1/3")])
@pytest.mark.parametrize("value_type", ["int64", "int16", "decimal0", "decimal2", "decimal7"])
@pytest.mark.parametrize("layout", ["plain", "dictionary", "chunked+sliced", "dictionary+chunked+sliced"])
def test_columnar_nulls_agree_with_the_row_reader(policy, kind, grid, value_type, layout):
    """on random tables with NULL values and NULL keys, both ``non_finite.nan``
    policies, integer and decimal columns, dictionary-encoded, chunked and sliced, small and huge values, the
    columnar reader gives the row reader's vectors and diagnostics (``special_values[...]["null"]`` counted
    inside the domain only, ``rows_dropped`` under drop)."""
    spec = spec_with_policy(kind, grid, policy)
    component = spec.aggregates[0].components[0]
    for seed in range(3):
        rng = np.random.default_rng(seed)
        table = _null_table(rng, kind, value_type, "dictionary" in layout, 3 if "chunked" in layout else 1,
                            "sliced" in layout, huge=seed == 2)
        assert columns.columnar_eligible(None, spec.aggregates[0], table.schema)
        fast_report, slow_report = DiagnosticsReport("columnar"), DiagnosticsReport("columnar")
        fast = prepare_inputs(spec, {"agg": table}, diagnostics=fast_report)
        slow = prepare_inputs(spec, {"agg": table.to_pylist()}, diagnostics=slow_report)
        assert np.array_equal(fast.values[("agg", component)], slow.values[("agg", component)])
        assert fast_report.as_dict() == slow_report.as_dict()
        found = fast_report.as_dict()["aggregates"]["agg"]
        assert found["special_values"][component]["null"] > 0  # the NULLs were met inside the domain
        assert (found["rows_dropped"] > 0) == (policy == "drop")


def test_columnar_ignores_garbage_under_a_null_decimal_slot():
    """Arrow leaves the bytes under a NULL slot unspecified; a decimal NULL whose data
    words are garbage (not a sign extension: the "wide" path) reads as the NULL it is."""
    import struct

    words = [(125, 0), (0x1234567890ABCDEF, 0x7EDCBA0987654321), (-300, -1)]
    data = pa.py_buffer(b"".join(struct.pack("<qq", low, high) for low, high in words))
    values = pa.Array.from_buffers(pa.decimal128(10, 2), 3, [pa.py_buffer(bytes([0b101])), data])
    for policy in ("replace", "drop"):
        spec = spec_with_policy("sum", None, policy)
        table = pa.table({"x": pa.array([0, 1, 2], pa.int32()), "y": pa.array(["a"] * 3), "sum": values})
        fast_report, slow_report = DiagnosticsReport("c"), DiagnosticsReport("c")
        fast = prepare_inputs(spec, {"agg": table}, diagnostics=fast_report)
        slow = prepare_inputs(spec, {"agg": table.to_pylist()}, diagnostics=slow_report)
        assert np.array_equal(fast.values[("agg", "sum")], slow.values[("agg", "sum")])
        assert fast_report.as_dict() == slow_report.as_dict()


# -- edge values and layouts: the columnar reader reads what the row reader reads -------------------------------------


def read_both(spec, table: pa.Table, columnar: bool = True):
    """``(columnar vector, row vector, columnar diagnostics, row diagnostics)`` of ``table``: the table as given
    (the columnar reader, asserted to be the one chosen unless ``columnar`` is False) against the row reader on
    ``table.to_pylist()`` (the reference)."""
    aggregate = spec.aggregates[0]
    assert columns.columnar_eligible(None, aggregate, table.schema) == columnar
    component = aggregate.components[0]
    fast_report, slow_report = DiagnosticsReport(spec.release), DiagnosticsReport(spec.release)
    fast = prepare_inputs(spec, {"agg": table}, diagnostics=fast_report).values[("agg", component)]
    slow = prepare_inputs(spec, {"agg": table.to_pylist()}, diagnostics=slow_report).values[("agg", component)]
    return fast, slow, fast_report.as_dict()["aggregates"]["agg"], slow_report.as_dict()["aggregates"]["agg"]


def keyed(values: pa.Array, xs=None, ys=None) -> pa.Table:
    """A table of ``sum`` values keyed by ``x`` (default 0) and ``y`` (default "a")."""
    n = len(values)
    xs = [0] * n if xs is None else xs
    ys = ["a"] * n if ys is None else ys
    return pa.table({"x": pa.array(xs, pa.int64()), "y": pa.array(ys, pa.string()), "sum": values})


@pytest.mark.parametrize(
    "values, want",
    [
        pytest.param([-(2**63)], -SATURATION, id="INT64_MIN alone: abs() wraps, 2*t wraps to 0"),
        pytest.param([-(2**63), -5], -SATURATION, id="INT64_MIN plus -5: the int64 total wraps to +2^63-5"),
    ],
)
def test_int64_min_is_read_as_the_row_reader_reads_it(values, want, xy_spec):
    """-2^63 (where ``np.abs`` wraps) saturates at -2^62 in both readers: never published near 0 or with its sign
    flipped by an int64 wrap."""
    fast, slow, fast_seen, slow_seen = read_both(xy_spec("sum"), keyed(pa.array(values, pa.int64())))
    assert slow[0] == want
    assert fast[0] == slow[0]
    assert fast_seen == slow_seen


def test_negative_scale_decimals_stay_exact(xy_spec):
    """A decimal128 of negative scale (Arrow allows it) goes the row way and is read exactly (10^17 + 100 stays
    10^17 + 100, not a binary64 rounding), and whole counts of negative scale are not flagged as non-integer."""
    column = pa.array([Decimal(10**15 + 1).scaleb(2)], pa.decimal128(18, -2))  # 100000000000000100
    fast, slow, fast_seen, slow_seen = read_both(xy_spec("sum"), keyed(column), columnar=False)
    assert slow[0] == 10**17 + 100
    assert fast.dtype == np.int64 and fast[0] == slow[0]

    table = pa.table({"x": pa.array([0, 1], pa.int64()), "y": ["a", "a"],
                      "count": pa.array([Decimal("1E+2"), Decimal("3E+2")], pa.decimal128(5, -2))})
    fast, slow, fast_seen, slow_seen = read_both(xy_spec("count"), table, columnar=False)
    assert np.array_equal(fast, slow)
    assert fast_seen["non_integer_counts"] == slow_seen["non_integer_counts"] == {}


def _dictionary_with_null(values: list, kind: pa.DataType) -> pa.DictionaryArray:
    """Indices 0..n-1 into ``values``, one of which is NULL *in the dictionary*: the array's null_count is 0."""
    return pa.DictionaryArray.from_arrays(pa.array(range(len(values)), pa.int32()), pa.array(values, kind))


@pytest.mark.parametrize("policy", [None, {"nan": "drop"}], ids=["nan: replace", "nan: drop"])
def test_a_null_inside_a_dictionary_follows_non_finite(policy, xy_spec):
    """A NULL held in an int dictionary (not counted by ``null_count``) follows ``non_finite`` as the row reader
    does (replaced by 0, or the row dropped), never cast to INT64_MIN, and without a RuntimeWarning (a log line
    that would depend on a value)."""
    table = keyed(_dictionary_with_null([5, None], pa.int64()), xs=[0, 0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast, slow, fast_seen, slow_seen = read_both(xy_spec("sum", non_finite=policy), table)
    assert slow[0] == 5
    assert fast[0] == slow[0]
    assert fast_seen == slow_seen
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], "a warning that depends on a value"


def test_a_null_inside_a_decimal_dictionary_follows_non_finite(xy_spec):
    """A NULL held in a decimal dictionary is dropped under ``nan: drop`` as the row reader drops it (its slot's
    zero bytes are never read as 0)."""
    table = keyed(_dictionary_with_null([Decimal("5.5"), None], pa.decimal128(10, 1)), xs=[0, 1])
    fast, slow, fast_seen, slow_seen = read_both(xy_spec("sum", non_finite={"nan": "drop"}), table)
    assert np.array_equal(fast, slow)
    assert fast_seen == slow_seen  # rows_dropped 1, partitions 1, special_values {"sum": {"null": 1}}


def test_a_decimal_beyond_its_declared_precision_is_read_in_full(xy_spec):
    """A decimal128(18, 0) array holding 2^64 + 5 (unvalidated; a Python caller can build it) is read in full and
    saturates, as the row reader's Decimal does, never read from its low 64 bits as 5."""
    data = b"".join(v.to_bytes(16, "little", signed=True) for v in (2**64 + 5,))
    column = pa.Array.from_buffers(pa.decimal128(18, 0), 1, [None, pa.py_buffer(data)])
    fast, slow, fast_seen, slow_seen = read_both(xy_spec("sum"), keyed(column))
    assert slow[0] == SATURATION
    assert fast[0] == slow[0]


def test_duplicate_column_names_are_a_shape_problem_not_a_crash(xy_spec):
    """A table with two columns named ``sum`` is a shape problem found from its schema (never a bare KeyError, and
    never decided by a row: the same table without rows gets the same problem)."""
    spec = xy_spec("sum")

    def table(rows: int):
        return pa.Table.from_arrays([pa.array([0] * rows, pa.int64()), pa.array(["a"] * rows),
                                     pa.array([3] * rows, pa.int64()), pa.array([9] * rows, pa.int64())],
                                    names=["x", "y", "sum", "sum"])

    report = check_aggregates(spec, {"agg": table(1)})  # must not raise
    empty = check_aggregates(spec, {"agg": table(0)})
    found = report.aggregates["agg"].problems
    assert not report.ok
    assert "sum" in found[0].message
    assert [p.message for p in found] == [p.message for p in empty.aggregates["agg"].problems]


@pytest.mark.parametrize(
    "values",
    [pytest.param([], id="empty table"), pytest.param([0, 0], id="all sums 0"), pytest.param([0, 1], id="a sum of 1")],
)
def test_a_huge_grid_denominator_never_raises_depending_on_the_data(values, xy_spec):
    """A grid whose reduced denominator is above 2^62 (about 1e-10, allowed by the spec) is read alike by both
    readers whatever the sums: an empty table or all-zero sums must not raise where other data does not (whether a
    release errors would tell an observer something about the data)."""
    grid = "500000001/5000000000000000003"
    assert Fraction(grid).denominator > 2**62
    spec = xy_spec("sum", grid=grid, bounds=(-1, 1))
    plan_release(spec)  # the spec is valid
    table = keyed(pa.array(values, pa.int64()), xs=list(range(len(values))))
    fast, slow, _, _ = read_both(spec, table)
    assert np.array_equal(fast, slow)


def test_one_null_value_does_not_change_the_reader(monkeypatch, xy_spec):
    """The reader is chosen by the schema alone (ADR 0023): a table with one NULL value is read array-at-a-time
    like the same table without it, never sent to ``to_pylist()`` and the row reader (at 10^6 cells: 35 s and
    +900 MB against 0.65 s, so whether a release finishes would depend on one value)."""
    calls = []
    real = columns.read_table
    monkeypatch.setattr(columns, "read_table", lambda *a, **k: calls.append(1) or real(*a, **k))
    spec = xy_spec("sum")
    for values in ([3, 4], [3, None]):
        calls.clear()
        prepare_inputs(spec, {"agg": keyed(pa.array(values, pa.int64()), xs=[0, 1])})
        assert calls, f"the row reader ran for {values}"


@pytest.mark.parametrize("grid", ["1", "0.25", "7", "1/3"])
def test_neighbouring_tables_move_each_grid_integer_by_at_most_linf(grid, xy_spec):
    """Adding one privacy unit's row (one value within the bounds) to random decimal tables moves every columnar
    grid integer by at most the plan's Linf, and each partition is rounded once (rows of one key are added exactly
    before rounding: per-row rounding would move by more)."""
    spec = xy_spec("sum", grid=grid, bounds=(-50, 100))
    linf = next(s for s in plan_release(spec).steps if s.component == "sum").linf
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(1, 40))
        digits = rng.integers(-5000, 10000, n)  # values in [-50, 100) at 2 decimals
        xs, ys = rng.integers(0, 4, n).tolist(), rng.choice(["a", "b"], n).tolist()
        base = keyed(pa.array([Decimal(int(d)).scaleb(-2) for d in digits], pa.decimal128(18, 2)), xs, ys)
        extra = int(rng.integers(-5000, 10001))
        plus = pa.concat_tables([base, keyed(pa.array([Decimal(extra).scaleb(-2)], pa.decimal128(18, 2)),
                                             [int(rng.integers(0, 4))], [str(rng.choice(["a", "b"]))])])
        before, slow_before, _, _ = read_both(spec, base)
        after, slow_after, _, _ = read_both(spec, plus)
        assert np.array_equal(before, slow_before) and np.array_equal(after, slow_after)
        assert int(np.abs(after - before).max()) <= linf


def test_each_partition_is_rounded_once(xy_spec):
    """Two rows of 0.5 in one partition on grid 1 give 1 (the total rounded), not 2 (each row rounded)."""
    spec = xy_spec("sum", bounds=(0, 1))
    fast, slow, _, _ = read_both(spec, keyed(pa.array([Decimal("0.5"), Decimal("0.5")], pa.decimal128(3, 1))))
    assert fast[0] == slow[0] == 1


def _layouts():
    values = pa.array([3, -2, 7, 11, 2**61, 5], pa.int64())
    xs, ys = [0, 0, 3, 9, 1, 2], ["a", "a", "b", "a", "b", None]
    whole = keyed(values, xs, ys)
    yield "sliced table", pa.concat_tables([whole, whole]).slice(3, 7)
    yield "chunked with empty chunks", pa.concat_tables([whole.slice(0, 0), whole.slice(0, 2), whole.slice(2, 0),
                                                        whole.slice(2)])
    yield "dictionary keys", whole.set_column(1, "y", whole.column("y").dictionary_encode())
    yield "large_string keys", whole.set_column(1, "y", whole.column("y").cast(pa.large_string()))
    yield "uint32 keys and values", whole.set_column(0, "x", whole.column("x").cast(pa.uint32())).set_column(
        2, "sum", pa.array([3, 2, 7, 11, 5, 5], pa.uint32()))
    yield "extra columns", whole.append_column("note", pa.array(["z"] * 6)).append_column(
        "other", pa.array([1.5] * 6))
    yield "empty table", whole.slice(0, 0)
    yield "decimal slice with offset", keyed(pa.array([Decimal(i).scaleb(-3) for i in range(-40, 40)],
                                                       pa.decimal128(9, 3)), [i % 5 for i in range(80)],
                                             ["a", "b"] * 40).slice(17, 31)
    yield "int keys outside int32", keyed(pa.array([1, 2], pa.int64()), [2**40, 0])
    decimals = keyed(pa.array([Decimal(i).scaleb(-2) for i in range(50)], pa.decimal128(10, 2)),
                     [i % 4 for i in range(50)], ["a", "b"] * 25)
    yield "decimal chunks with offsets", pa.concat_tables([decimals.slice(3, 10), decimals.slice(20, 7),
                                                          decimals.slice(40)]).slice(5, 15)


@pytest.mark.parametrize("name, table", list(_layouts()), ids=[name for name, _ in _layouts()])
def test_layouts_read_as_the_row_reader_reads_them(name, table, xy_spec):
    """Sliced, chunked, dictionary, large_string, uint32, extra-column, empty and offset decimal tables give the
    row reader's grid integers and diagnostics."""
    fast, slow, fast_seen, slow_seen = read_both(xy_spec("sum"), table)
    assert np.array_equal(fast, slow), name
    assert fast_seen == slow_seen, name


@pytest.mark.parametrize("low", [0, -5, 2**62, -(2**63), 2**63 - 20], ids=lambda low: f"from {low}")
def test_a_range_of_integer_keys_gives_the_positions_a_lookup_in_the_domain_gives(low):
    """Keys listed as a range (``vector_release``'s index) are positioned by offset, without a hash table of the
    domain: every value, NULL and value outside the range gets the position ``pyarrow.compute.index_in`` gives."""
    import pyarrow.compute as pc

    rng = np.random.default_rng(abs(low) % 1000)
    domain = list(range(low, low + 15))
    values = [None if rng.random() < 0.2 else low + int(rng.integers(-3, 18)) for _ in range(40)]
    values = [v if v is None or -(2**63) <= v < 2**63 else None for v in values]
    column = pa.chunked_array([pa.array(values[:15], type=pa.int64()), pa.array(values[15:], type=pa.int64())])
    expected = pc.index_in(column, value_set=pa.array(domain, type=pa.int64())).fill_null(-1).to_numpy()
    assert columns._codes(column, domain).tolist() == expected.tolist()
    assert columns._codes(column, domain[::-1]).tolist() == pc.index_in(  # not a rising range: the lookup itself
        column, value_set=pa.array(domain[::-1], type=pa.int64())).fill_null(-1).to_numpy().tolist()
