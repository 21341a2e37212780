"""Array-at-a-time publication of counts and sums (dp_operators.release.publish.PublishedCells) against the
per-value definitions it replaces (``_number``, ``_near_limit``, ``published_interval``), and rows files against
the inline rows of the same noised vector: same values, same intervals, same saturation, same flat table."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow.parquet as pq
import pytest

from dp_operators.operators.sinks import release_table
from dp_operators.release import SATURATION, plan_release, prepare_inputs, publish_aggregate
from dp_operators.release.publish import (
    _near_limit,
    _number,
    _saturated_interval,
    count_or_sum_cells,
    grid_floats,
    grid_values,
    published_interval,
)
from dp_operators.release.rows_file import (
    LocalRowsStore,
    RowsFileError,
    cells_table,
    check_rows_files,
    local_path,
    write_rows_file,
)
from dp_operators.spec import parse_spec

GRIDS = [Fraction(1), Fraction(7), Fraction(1, 4), Fraction(1, 3), Fraction(10**9 + 7, 10**20), Fraction(3, 2**60)]


def awkward_units(rng) -> list[int]:
    near = [SATURATION - 1, SATURATION, -SATURATION, SATURATION + 5, 2**53 + 1, -(2**53) - 3, 0, -1, 1]
    return near + rng.integers(-10**6, 10**6, 200).tolist() + rng.integers(-2**62, 2**62, 50).tolist()


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("dtype", [np.int64, object])
def test_grid_values_are_the_exact_per_value_numbers(grid, dtype):
    units = awkward_units(np.random.default_rng(1))
    array = np.array(units, dtype=dtype)
    got = grid_values(array, grid).tolist()
    want = [_number(u * grid) for u in units]
    assert [type(v) for v in got] == [type(v) for v in want]
    assert got == want
    assert grid_floats(array, grid).tolist() == [float(v) for v in want]


def test_object_units_beyond_int64_stay_exact():
    units = np.array([2**70 + 1, -(2**65)], dtype=object)
    assert grid_values(units, Fraction(1, 3)).tolist() == [float(Fraction(2**70 + 1, 3)), float(Fraction(-(2**65), 3))]


class _Step:
    """A noise step stand-in with a chosen grid and half-widths (publication reads only these)."""

    mechanism = "discrete_laplace"

    def __init__(self, grid: Fraction, noise_width: float, half_width: float) -> None:
        self.grid, self._noise, self._half = grid, noise_width, half_width

    def noise_half_width_units(self, alpha):
        return self._noise

    def half_width(self, alpha):
        return self._half


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("clamp", [False, True])
def test_rows_match_the_per_value_definition(grid, clamp):
    units = awkward_units(np.random.default_rng(2))
    step = _Step(grid, 12.5, 0.1 + float(grid) * 13)
    cells = count_or_sum_cells(step, np.array(units, dtype=np.int64), 0.05, clamp)
    keys = [(i,) for i in range(len(units))]
    rows = cells.rows(["k"], keys)
    for (key,), u, row in zip(keys, units, rows):
        value = _number(u * grid)
        if clamp and value < 0:
            value = 0
        want = {"k": key, "value": value, "half_width": step._half}
        side = _near_limit(u, 12.5)
        if side:
            want.update(_saturated_interval(u, step, step._half, side))
        assert row == want
    lower, upper = cells.bounds(cells.value_floats())
    for row, low, high in zip(rows, lower.tolist(), upper.tolist()):
        want_low, want_high = published_interval(row)
        assert (low if not math.isnan(low) else None) == want_low
        assert (high if not math.isnan(high) else None) == want_high


def test_the_interval_comparison_can_fail():
    # negative control: a half-width one ulp off is seen
    step = _Step(Fraction(1, 3), 1.0, 0.7)
    cells = count_or_sum_cells(step, np.array([5, 7], dtype=np.int64), 0.05, False)
    lower, _ = cells.bounds(cells.value_floats())
    other = count_or_sum_cells(_Step(Fraction(1, 3), 1.0, math.nextafter(0.7, 1)), np.array([5, 7]), 0.05, False)
    assert lower.tolist() != other.bounds(other.value_floats())[0].tolist()


SPEC = """
version: 1
release: files
budget_account: census_adult
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: cells
    kind: sum
    bounds: [-5, 5]
    grid: 0.5
    group_by: [x, y]
    keys: {x: [0, 1, 2], y: [a, "é", 'q"uote', "3"]}
    mechanism: discrete_laplace
    budget: {epsilon: 1}
postprocess: {clamp_nonnegative: false}
"""


def test_a_rows_file_holds_the_flat_table_of_the_inline_rows(tmp_path):
    spec = parse_spec(SPEC)
    plan = plan_release(spec, accountant="pure_dp")
    prepared = prepare_inputs(spec, {"cells": [{"x": 1, "y": "é", "sum": 3}]})
    noised = {("cells", "sum"): np.array([0, -3, 7, SATURATION, 5, 1, 2, -SATURATION, 4, 9, 11, -2], dtype=np.int64)}
    aggregate = spec.aggregates[0]
    inline = publish_aggregate(spec, aggregate, plan, noised, prepared.keys["cells"])
    store = LocalRowsStore(tmp_path / "rows")

    def to_file(agg, cells, keys):
        return write_rows_file(store, agg, cells_table(agg, cells, keys, spec.confidence))

    filed = publish_aggregate(spec, aggregate, plan, noised, prepared.keys["cells"], to_file)
    assert "rows" not in filed and filed["rows_file"]["rows"] == 12
    header = {"confidence": spec.confidence, "aggregates": {"cells": inline},
              "mechanisms": [step.describe() for step in plan.steps]}  # the value column's type comes from them
    expected = release_table(header)
    got = pq.read_table(filed["rows_file"]["uri"])
    assert got.schema.equals(expected.schema) and got.equals(expected)
    check_rows_files({"aggregates": {"cells": filed}}, store)
    # a second write of the same content is the same file (its name is its digest)
    again = publish_aggregate(spec, aggregate, plan, noised, prepared.keys["cells"], to_file)
    assert again["rows_file"] == filed["rows_file"]


def test_an_altered_or_missing_rows_file_is_refused(tmp_path):
    spec = parse_spec(SPEC)
    aggregate = spec.aggregates[0]
    plan = plan_release(spec, accountant="pure_dp")
    prepared = prepare_inputs(spec, {"cells": []})
    store = LocalRowsStore(tmp_path / "rows")
    filed = publish_aggregate(spec, aggregate, plan, {("cells", "sum"): np.arange(12, dtype=np.int64)},
                              prepared.keys["cells"],
                              lambda a, c, k: write_rows_file(store, a, cells_table(a, c, k, 0.95)))
    output = {"aggregates": {"cells": filed}}
    path = local_path(filed["rows_file"]["uri"])
    data = bytearray(open(path, "rb").read())
    data[100] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(RowsFileError, match="does not hold the committed bytes"):
        check_rows_files(output, store)
    import os

    os.unlink(path)
    with pytest.raises(RowsFileError, match="cannot be read"):
        check_rows_files(output, store)


# -- the statistics of a large release, on its rows files -----------------------------------------------------------

COVERAGE_SPEC = """
version: 1
release: coverage
budget_account: census_adult
privacy_unit: person
confidence: 0.95
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: cells
    kind: count
    group_by: [x, y]
    keys: {x: &x %(xs)s, y: &y %(ys)s}
    mechanism: discrete_laplace
    budget: {epsilon: 1}
  - name: sums
    kind: sum
    bounds: [0, 10]
    grid: 0.5
    group_by: [x, y]
    keys: {x: *x, y: *y}
    mechanism: discrete_gaussian
    budget: {rho: 0.5}
postprocess: {clamp_nonnegative: false}
"""


def test_a_large_release_covers_its_true_values_and_a_shrunk_interval_does_not(tmp_path):
    """2 x 200,000 cells from Arrow tables through run_release to rows files: the share of cells whose published
    interval holds the true value is at least the confidence (a binomial lower bound, 5 sigma); the same intervals
    shrunk by 20 % fall short (negative control)."""
    import pyarrow as pa

    from dp_operators.ledger import ReleaseKey
    from dp_operators.release import LocalRowsStore, run_release
    from support import make_ledger

    xs, ys = 200, 1000
    spec = parse_spec(COVERAGE_SPEC % {"xs": list(range(xs)), "ys": list(range(ys))})
    rng = np.random.default_rng(11)
    n = xs * ys
    counts = rng.integers(0, 50, n)
    sums = rng.integers(0, 21, n)  # halves: true sums 0, 0.5, ..., 10 are on the grid
    grid_x, grid_y = np.repeat(np.arange(xs), ys), np.tile(np.arange(ys), xs)
    aggregates = {
        "cells": pa.table({"x": grid_x, "y": grid_y, "count": counts}),
        "sums": pa.table({"x": grid_x, "y": grid_y, "sum": pa.array([Decimal(int(s)) / 2 for s in sums],
                                                                   pa.decimal128(18, 1))}),
    }
    ledger = make_ledger(tmp_path / "ledger.db", cap="10")
    key = ReleaseKey("adult_census_release", "coverage", "t", -1, "coverage")
    output = run_release(spec, aggregates, ledger, key, spec_hash="0" * 64,
                         rows_store=LocalRowsStore(tmp_path / "rows")).output
    floor = 0.95 - 5 * math.sqrt(0.95 * 0.05 / n)
    for name, truth in (("cells", counts.astype(float)), ("sums", sums / 2)):
        table = pq.read_table(output["aggregates"][name]["rows_file"]["uri"])
        value = table.column("value").cast(pa.float64()).to_numpy()  # int64, or decimal on grid 0.5
        low, high = table.column("lower").to_numpy(), table.column("upper").to_numpy()
        assert not table.column("saturated").to_numpy().any()
        covered = np.mean((low <= truth) & (truth <= high))
        assert covered >= floor, (name, covered)
        width = (high - low) / 2 * 0.8
        shrunk = np.mean((value - width <= truth) & (truth <= value + width))
        assert shrunk < floor, (name, shrunk)


def test_no_float_touches_a_grid_integer_or_a_noise_value(tmp_path, monkeypatch):
    """dtypes along the release path: prepared grid integers, noise draws and noised sums are int64 (or Python
    ints in object arrays), never floats; only publication turns them into values."""
    import pyarrow as pa

    from dp_operators.ledger import ReleaseKey
    from dp_operators.release import LocalRowsStore, run_release
    from dp_operators.release import plan as plan_module
    from dp_operators.release import run as run_module
    from support import make_ledger

    seen: list[np.ndarray] = []
    real_prepare, real_draw, real_add = run_module.prepare_inputs, plan_module.NoiseStep.draw, run_module.add_exactly

    def prepare(*args, **kwargs):
        prepared = real_prepare(*args, **kwargs)
        seen.extend(prepared.values.values())
        return prepared

    def draw(self, size=None):
        noise = real_draw(self, size)
        seen.append(noise)
        return noise

    def add(values, noise):
        total = real_add(values, noise)
        seen.append(total)
        return total

    monkeypatch.setattr(run_module, "prepare_inputs", prepare)
    monkeypatch.setattr(plan_module.NoiseStep, "draw", draw)
    monkeypatch.setattr(run_module, "add_exactly", add)
    spec = parse_spec(COVERAGE_SPEC % {"xs": [0, 1, 2], "ys": [0, 1]})
    table = pa.table({"x": [0, 1, 2], "y": [0, 1, 0], "count": [4, 5, 6]})
    sums = pa.table({"x": [0], "y": [1], "sum": pa.array([Decimal("2.5")], pa.decimal128(5, 1))})
    run_release(spec, {"cells": table, "sums": sums}, make_ledger(tmp_path / "l.db", cap="10"),
                ReleaseKey("adult_census_release", "r", "t", -1, "coverage"), spec_hash="0" * 64,
                rows_store=LocalRowsStore(tmp_path / "rows"))
    assert len(seen) == 2 + 2 + 2
    for array in seen:
        assert array.dtype == np.int64 or (array.dtype == object and all(type(v) is int for v in array.tolist()))


def test_the_scalar_interval_ends_are_the_exact_outward_roundings():
    """published_interval's TwoSum route against the rational one it shortcuts, on awkward values and widths;
    a width one ulp off gives other ends (negative control)."""
    from dp_operators.release.publish import _float_towards

    rng = np.random.default_rng(5)
    values = [0, 1, -1, 2**53 - 1, -(2**53) + 1, 0.1, -0.3, 1e300, 5e-324, 123456.789] + rng.normal(0, 1e6, 300).tolist()
    widths = [0.1, 1e-17, 30.444827940403645, 2.0**-1074, 1e300, 7.5] + rng.exponential(10, 50).tolist()
    for value in values:
        for width in widths:
            exact_low = _float_towards(Fraction(value) - Fraction(width), -math.inf)
            exact_high = _float_towards(Fraction(value) + Fraction(width), math.inf)
            assert published_interval({"value": value, "half_width": width}) == (exact_low, exact_high)
    shifted = published_interval({"value": 0.1, "half_width": math.nextafter(0.1, 1)})
    assert shifted != published_interval({"value": 0.1, "half_width": 0.1})


def test_flat_keys_are_the_json_objects_they_stand_for():
    import json as json_module

    from dp_operators.operators.flat_rows import release_rows

    keys = [("a", 1), ("é\x00\"", None), ("1", 1), ("None", -7), ("x", 2**70)]
    output = {"confidence": 0.95, "aggregates": {"agg": {
        "kind": "count", "mechanism": "discrete_laplace", "group_by": ["g", "h"],
        "rows": [{"g": g, "h": h, "value": 1, "half_width": 2.0} for g, h in keys]}}}
    got = [row["key"] for row in release_rows(output)]
    assert got == [json_module.dumps({"g": g, "h": h}, ensure_ascii=False, separators=(",", ":")) for g, h in keys]


def test_a_sum_with_a_large_laplace_scale_covers_its_true_values(tmp_path):
    """A sum bounded by 10^6 at epsilon 0.1: noise scale 10^7 grid units, drawn by ``vectorised_envelope``; 50,000
    cells cover their true values at the confidence level, and shrunk intervals do not (negative control)."""
    import pyarrow as pa

    from dp_operators.ledger import ReleaseKey
    from dp_operators.release import LocalRowsStore, run_release
    from support import make_ledger

    spec = parse_spec(f"""
version: 1
release: big_scale
budget_account: census_adult
privacy_unit: person
contribution: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
aggregates:
  - name: incomes
    kind: sum
    bounds: [0, 1000000]
    group_by: [x, y]
    keys: {{x: {list(range(50))}, y: {list(range(1000))}}}
    mechanism: discrete_laplace
    budget: {{epsilon: 0.1}}
postprocess: {{clamp_nonnegative: false}}
""")
    assert spec.aggregates[0].partition_count == 50_000
    rng = np.random.default_rng(3)
    truth = rng.integers(0, 10**9, 50_000)
    table = pa.table({"x": np.repeat(np.arange(50), 1000), "y": np.tile(np.arange(1000), 50), "sum": truth})
    output = run_release(spec, {"incomes": table}, make_ledger(tmp_path / "l.db", cap="10"),
                         ReleaseKey("adult_census_release", "r", "t", -1, "big_scale"), spec_hash="0" * 64,
                         rows_store=LocalRowsStore(tmp_path / "rows"), inline_rows_limit=10_000).output
    (step,) = output["mechanisms"]
    assert step["scale"] == 10**7 and step["sampler"] == "vectorised"
    flat = pq.read_table(output["aggregates"]["incomes"]["rows_file"]["uri"])
    value, low, high = (flat.column(c).to_numpy() for c in ("value", "lower", "upper"))
    floor = 0.95 - 5 * math.sqrt(0.95 * 0.05 / len(truth))
    assert np.mean((low <= truth) & (truth <= high)) >= floor
    width = (high - low) / 2 * 0.8
    assert np.mean((value - width <= truth) & (truth <= value + width)) < floor
