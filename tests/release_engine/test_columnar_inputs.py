"""The columnar reader (dp_operators.release.columns) against the row-by-row reader: on random Arrow tables, with
repeated keys, keys outside the domain, NULL keys, negative and huge values, both give the same grid integers and
the same diagnostics. A table whose types the columnar reader does not take goes the row-by-row way."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from dp_operators.release import DiagnosticsReport, prepare_inputs
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


# -- NULLs in every layout (from the review of the replay authentication and NULL fixes) ---------------------------

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
