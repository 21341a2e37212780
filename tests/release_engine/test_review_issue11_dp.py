"""Review of issue 11's array-at-a-time release path (commit 4a6431a) from the differential-privacy side.

Each test states what it checks. Tests marked ``FINDING`` failed on 4a6431a (they pass since the fixes) and
demonstrated a defect: the columnar
reader (dp_operators.release.columns) disagreeing with the row reader (the reference semantics), a wrap in int64
arithmetic, a float on the grid path, or an exception whose occurrence depends on the data. The others are
regression guards and pass.
"""

from __future__ import annotations

import math
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from dp_operators.ledger import ReleaseKey
from dp_operators.release import DiagnosticsReport, SATURATION, check_aggregates, plan_release, prepare_inputs
from dp_operators.release import columns
from dp_operators.release.publish import _float_towards, _towards, count_or_sum_cells, grid_floats, grid_values
from dp_operators.release.run import add_exactly
from dp_operators.spec import ReleaseSpec

# -- helpers --------------------------------------------------------------------------------------------------------


def spec_of(kind: str = "sum", *, grid: str | None = None, bounds=(-50, 100), non_finite: dict | None = None,
            selection: bool = False, sampler: str | None = None, release: str = "review") -> ReleaseSpec:
    """One aggregate ``agg`` grouped by an int column ``x`` (0..3) and a text column ``y`` (a, b), or under
    partition selection; discrete Laplace at epsilon 1."""
    aggregate: dict = {"name": "agg", "kind": kind, "group_by": ["x", "y"], "mechanism": "discrete_laplace",
                       "budget": {"epsilon": 1}}
    if kind != "count":
        aggregate["bounds"] = list(bounds)
    if grid is not None:
        aggregate["grid"] = grid
    if non_finite is not None:
        aggregate["non_finite"] = non_finite
    if selection:
        aggregate["partition_selection"] = {"mechanism": "discrete_laplace", "budget": {"epsilon": 1, "delta": 1e-6}}
    else:
        aggregate["keys"] = {"x": [0, 1, 2, 3], "y": ["a", "b"]}
    document = {"version": 1, "release": release, "budget_account": "acct", "privacy_unit": "person",
                "contribution": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                "aggregates": [aggregate]}
    if sampler is not None:
        document["sampler"] = sampler
    return ReleaseSpec.model_validate(document)


def read_both(spec: ReleaseSpec, table: pa.Table, columnar: bool = True):
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
    n = len(values)
    xs = [0] * n if xs is None else xs
    ys = ["a"] * n if ys is None else ys
    return pa.table({"x": pa.array(xs, pa.int64()), "y": pa.array(ys, pa.string()), "sum": values})


# -- (1) the columnar reader against the row reader --------------------------------------------------------------


@pytest.mark.parametrize(
    "values, want",
    [
        pytest.param([-(2**63)], -SATURATION, id="INT64_MIN alone: abs() wraps, 2*t wraps to 0"),
        pytest.param([-(2**63), -5], -SATURATION, id="INT64_MIN plus -5: the int64 total wraps to +2^63-5"),
    ],
)
def test_finding_int64_min_is_read_as_the_row_reader_reads_it(values, want):
    """FINDING (high for the 'identical integers' claim): ``np.abs(INT64_MIN)`` is INT64_MIN, so ``largest`` in
    ``_exact_totals`` and ``_on_grid`` is negative or small, the int64 branch is taken, and the total wraps: a value of
    -2^63 is published near 0, and -2^63 - 5 comes out as +2^62 (the sign flips). The row reader saturates at -2^62."""
    spec = spec_of("sum")
    fast, slow, fast_seen, slow_seen = read_both(spec, keyed(pa.array(values, pa.int64())))
    assert slow[0] == want
    assert fast[0] == slow[0]
    assert fast_seen == slow_seen


def test_finding_negative_scale_decimals_stay_exact():
    """FINDING (medium): a decimal128 of negative scale (Arrow allows it; a Python caller may hand such a table)
    makes ``D = 10**scale`` a float (0.01), so ``_on_grid`` rounds in binary64: 10^17 + 100 becomes
    100000000000000096, and a count's non-integer test ``total % 0.01`` flags whole counts."""
    spec = spec_of("sum")
    column = pa.array([Decimal(10**15 + 1).scaleb(2)], pa.decimal128(18, -2))  # 100000000000000100
    # fixed: negative scales are not eligible for the columnar reader (the row reader reads them exactly)
    fast, slow, fast_seen, slow_seen = read_both(spec, keyed(column), columnar=False)
    assert slow[0] == 10**17 + 100
    assert fast.dtype == np.int64 and fast[0] == slow[0]

    counts = spec_of("count")
    table = pa.table({"x": pa.array([0, 1], pa.int64()), "y": ["a", "a"],
                      "count": pa.array([Decimal("1E+2"), Decimal("3E+2")], pa.decimal128(5, -2))})
    fast, slow, fast_seen, slow_seen = read_both(counts, table, columnar=False)
    assert np.array_equal(fast, slow)
    assert fast_seen["non_integer_counts"] == slow_seen["non_integer_counts"] == {}


def _dictionary_with_null(values: list, kind: pa.DataType) -> pa.DictionaryArray:
    """Indices 0..n-1 into ``values``, one of which is NULL *in the dictionary*: the array's null_count is 0."""
    return pa.DictionaryArray.from_arrays(pa.array(range(len(values)), pa.int32()), pa.array(values, kind))


@pytest.mark.parametrize("policy", [None, {"nan": "drop"}], ids=["nan: replace", "nan: drop"])
def test_finding_a_null_inside_a_dictionary_follows_non_finite(policy):
    """FINDING (medium): ``has_nulls`` reads ``null_count``, which for a dictionary array counts NULL indices only.
    A NULL held in the dictionary passes as no NULL: the int64 cast turns it into NaN, numpy casts NaN to INT64_MIN
    (with a RuntimeWarning: a data-dependent log line), and the partition total wraps to about -2^62. The row
    reader applies ``non_finite`` (replace by 0, or drop the row) and counts the special value."""
    spec = spec_of("sum", non_finite=policy)
    table = keyed(_dictionary_with_null([5, None], pa.int64()), xs=[0, 0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast, slow, fast_seen, slow_seen = read_both(spec, table)
    assert slow[0] == 5
    assert fast[0] == slow[0]
    assert fast_seen == slow_seen
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], "a warning that depends on a value"


def test_finding_a_null_inside_a_decimal_dictionary_follows_non_finite():
    """FINDING (medium): the same for a dictionary of decimals: the NULL slot's zero bytes are read as 0, so under
    ``nan: drop`` the row is kept (and its partition counted as found) where the row reader drops it."""
    spec = spec_of("sum", non_finite={"nan": "drop"})
    table = keyed(_dictionary_with_null([Decimal("5.5"), None], pa.decimal128(10, 1)), xs=[0, 1])
    fast, slow, fast_seen, slow_seen = read_both(spec, table)
    assert np.array_equal(fast, slow)
    assert fast_seen == slow_seen  # rows_dropped 1, partitions 1, special_values {"sum": {"null": 1}}


def test_finding_a_decimal_beyond_its_declared_precision_is_read_in_full():
    """FINDING (low): a decimal128(18, s) array is not validated on construction; one holding more than 18 digits
    (a Parquet writer cannot produce it, a Python caller can) is read from its low 64 bits only: 2^64 + 5 becomes 5.
    The row reader sees Decimal(2^64 + 5) and saturates."""
    spec = spec_of("sum")
    data = b"".join(v.to_bytes(16, "little", signed=True) for v in (2**64 + 5,))
    column = pa.Array.from_buffers(pa.decimal128(18, 0), 1, [None, pa.py_buffer(data)])
    fast, slow, fast_seen, slow_seen = read_both(spec, keyed(column))
    assert slow[0] == SATURATION
    assert fast[0] == slow[0]


def test_finding_duplicate_column_names_are_a_shape_problem_not_a_crash():
    """A table with two columns named ``sum`` is a shape problem found from its schema (never a bare KeyError, and
    never decided by a row: the same table without rows gets the same problem)."""
    spec = spec_of("sum")

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


def _huge_denominator_spec(**kwargs) -> ReleaseSpec:
    # a grid of about 1e-10 whose reduced denominator is above 2^62 (any exact grid in the spec's range is allowed)
    grid = "500000001/5000000000000000003"
    assert Fraction(grid).denominator > 2**62
    return spec_of("sum", grid=grid, bounds=(-1, 1), **kwargs)


@pytest.mark.parametrize(
    "values",
    [pytest.param([], id="empty table"), pytest.param([0, 0], id="all sums 0"), pytest.param([0, 1], id="a sum of 1")],
)
def test_finding_a_huge_grid_denominator_never_raises_depending_on_the_data(values):
    """FINDING (medium: a data-dependent error before the reservation): in ``columns._on_grid`` the int64 branch is
    guarded by ``2*q*largest + p*D < 2^62``, which holds for any q when every partition total is 0; then
    ``2 * q * totals`` raises OverflowError (q > 2^62 does not fit int64). So the release fails (an unexpected
    exception type, no ReleaseInputError) exactly when all sums are 0 or the table is empty, and runs otherwise:
    whether it errors tells an observer something about the data."""
    spec = _huge_denominator_spec()
    plan_release(spec)  # the spec is valid
    table = keyed(pa.array(values, pa.int64()), xs=list(range(len(values))))
    fast, slow, _, _ = read_both(spec, table)
    assert np.array_equal(fast, slow)


def test_finding_add_exactly_does_not_wrap_on_an_int64_min_noise_value():
    """FINDING (low: probability about 1e-19 per draw, at the largest scales only): the array samplers return int64
    when every value fits, and -2^63 fits (``vectorised._fallback`` allows it). ``add_exactly`` then guards with
    ``np.abs(noise).max() < 2^62``, but ``np.abs(-2^63)`` is -2^63, so the int64 sum wraps: -5 + -2^63 becomes
    2^63 - 5, a huge positive release."""
    values = np.array([-5, 7], dtype=np.int64)
    noise = np.array([-(2**63), 1], dtype=np.int64)
    got = add_exactly(values, noise)
    assert [int(v) for v in got] == [-5 - 2**63, 8]


# -- (5) which reader runs ------------------------------------------------------------------------------------


def test_finding_one_null_value_does_not_change_the_reader(monkeypatch):
    """FINDING (medium, item 5; ADR 0023 accepts it as a timing channel): one NULL in a value column sends the whole
    table to ``to_pylist()`` and the row reader. Measured here on 10^6 public cells: 0.65 s and +100 MB without a
    NULL, 35 s and +900 MB with one; at 10^7 cells that is minutes and ~9 GB, so whether the release finishes
    (or is OOM-killed or times out) before its reservation depends on one value: the release's existence is then a
    function of the data, which no noise covers. The reader should take NULLs array-at-a-time (``non_finite``
    as a mask), so the path depends on the schema only."""
    calls = []
    real = columns.read_table
    monkeypatch.setattr(columns, "read_table", lambda *a, **k: calls.append(1) or real(*a, **k))
    spec = spec_of("sum")
    for values in ([3, 4], [3, None]):
        calls.clear()
        prepare_inputs(spec, {"agg": keyed(pa.array(values, pa.int64()), xs=[0, 1])})
        assert calls, f"the row reader ran for {values}"


# -- (4) publication ---------------------------------------------------------------------------------------------

HUGE_NUMERATOR = Fraction(2**63 + 1, 2**63 - 1)  # a grid of about 1: numerator and denominator beyond int64


@pytest.mark.parametrize(
    "units", [pytest.param(np.zeros(0, dtype=np.int64), id="no cell"), pytest.param(np.zeros(3, dtype=np.int64),
                                                                                  id="all cells 0")],
)
def test_finding_publication_with_a_grid_numerator_beyond_int64(units):
    """FINDING (low-medium): ``grid_values`` and ``grid_floats`` guard ``units * p`` with ``max|units| * p < 2^63``,
    which holds for any p when there is no cell or every cell is 0; numpy then refuses the Python int p > 2^63
    (OverflowError). Under partition selection with no key selected this is after the noise is drawn: the release
    aborts with its charge spent. The per-value code (``_number(units * grid)``) never failed."""
    assert HUGE_NUMERATOR.numerator > 2**63
    assert grid_values(units, HUGE_NUMERATOR).tolist() == [0] * len(units)
    assert grid_floats(units, HUGE_NUMERATOR).tolist() == [0.0] * len(units)


def test_finding_no_key_selected_with_a_grid_numerator_beyond_int64_publishes_an_empty_aggregate(tmp_path):
    """FINDING (low-medium), end to end: a sum under partition selection, grid (2^63+1)/(2^63-1), no row upstream:
    nothing is selected, and publication raises after the draw (ReleaseAbortedError, budget spent)."""
    from dp_operators.release import run_release
    from support import make_ledger

    spec = spec_of("sum", grid=f"{HUGE_NUMERATOR.numerator}/{HUGE_NUMERATOR.denominator}", bounds=(0, 10),
                   selection=True, release="review")
    spec = spec.model_copy(update={"budget_account": "census_adult"})
    ledger = make_ledger(tmp_path / "ledger.db", cap="100", accountant="approx_dp")
    key = ReleaseKey("adult_census_release", "r", "t", -1, "review")
    output = run_release(spec, {"agg": []}, ledger, key, spec_hash="0" * 64).output
    assert output["aggregates"]["agg"]["rows"] == []


def test_interval_ends_are_the_exact_outward_roundings():
    """Guard: ``_towards`` (TwoSum) equals ``_float_towards`` on the exact Fraction for random doubles of many
    magnitudes and half-widths, including ties and widths far below one ulp of the value."""
    rng = np.random.default_rng(7)
    exponents = rng.integers(-30, 60, 4000)
    values = rng.standard_normal(4000) * np.exp2(exponents.astype(float))
    values[:50] = np.round(values[:50])
    widths = np.concatenate([np.exp2(rng.integers(-60, 40, 40).astype(float)), [0.5, 0.1, 1e-300, 3.0]])
    for width in widths.tolist():
        lower = _towards(values, width, -math.inf).tolist()
        upper = _towards(values, width, math.inf).tolist()
        for value, low, high in zip(values.tolist(), lower, upper):
            assert low == _float_towards(Fraction(value) - Fraction(width), -math.inf)
            assert high == _float_towards(Fraction(value) + Fraction(width), math.inf)


def test_saturation_flags_come_from_noised_integers_and_public_widths_only():
    """Guard: the side of a cell is a function of its noised integer and the public noise width (the per-value
    ``_near_limit``), on int64 and object arrays alike."""
    from dp_operators.release.publish import _near_limit

    class Step:
        grid = Fraction(1, 3)
        mechanism = "discrete_laplace"

        def noise_half_width_units(self, alpha):
            return 1e6

        def half_width(self, alpha):
            return 3.0

    units = [SATURATION - 10**6, SATURATION - 10**6 - 1, -SATURATION + 10**6, 0, SATURATION, -SATURATION - 7]
    for dtype in (np.int64, object):
        cells = count_or_sum_cells(Step(), np.array(units, dtype=dtype), 0.05, False)
        assert cells.side.tolist() == [_near_limit(u, 1e6) for u in units]


# -- (2) sensitivity: one privacy unit moves a grid integer by at most the planned L-inf ---------------------------


@pytest.mark.parametrize("grid", ["1", "0.25", "7", "1/3"])
def test_neighbouring_tables_move_each_grid_integer_by_at_most_linf(grid):
    """Guard: adding one privacy unit's row (one value within the bounds) to random decimal tables moves every
    columnar grid integer by at most the plan's Linf, and each partition is rounded once (rows of one key are added
    exactly before rounding: per-row rounding would move by more)."""
    spec = spec_of("sum", grid=grid, bounds=(-50, 100))
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


def test_each_partition_is_rounded_once():
    """Guard: two rows of 0.5 in one partition on grid 1 give 1 (the total rounded), not 2 (each row rounded)."""
    spec = spec_of("sum", bounds=(0, 1))
    fast, slow, _, _ = read_both(spec, keyed(pa.array([Decimal("0.5"), Decimal("0.5")], pa.decimal128(3, 1))))
    assert fast[0] == slow[0] == 1


# -- (1) layouts the columnar reader must take as the row reader does (guards) -----------------------------------


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
def test_layouts_read_as_the_row_reader_reads_them(name, table):
    fast, slow, fast_seen, slow_seen = read_both(spec_of("sum"), table)
    assert np.array_equal(fast, slow), name
    assert fast_seen == slow_seen, name


# -- (7) empty partitions, nothing selected, zero-size draws (guards) ----------------------------------------------


@pytest.mark.parametrize("sampler", ["vectorised", "scalar", "opendp"])
def test_nothing_selected_publishes_an_empty_aggregate_with_every_sampler(tmp_path, sampler):
    from dp_operators.release import run_release
    from support import make_ledger

    if sampler == "opendp":
        pytest.importorskip("opendp")
    spec = spec_of("count", selection=True, sampler=sampler).model_copy(update={"budget_account": "census_adult"})
    ledger = make_ledger(tmp_path / "ledger.db", cap="100", accountant="approx_dp")
    key = ReleaseKey("adult_census_release", "r", "t", -1, "review")
    output = run_release(spec, {"agg": [{"x": 0, "y": "a", "count": 1}]}, ledger, key, spec_hash="0" * 64).output
    assert output["aggregates"]["agg"]["rows"] == []
    assert all(step.draw(0).shape == (0,) for step in plan_release(spec, "approx_dp").steps)


# -- (6) the OpenDP route (guards) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["discrete_laplace", "discrete_gaussian"])
def test_opendp_scales_are_never_below_the_plan(mechanism):
    """Guard: for every step of an opendp plan (selection included), the float OpenDP draws with is at least the
    planned scale (Laplace b >= t; Gaussian sigma^2 >= planned sigma^2), at most one ulp above it, and is the
    one the ledger description records."""
    pytest.importorskip("opendp")
    document = spec_of("sum", selection=True, sampler="opendp").model_dump(mode="json")
    aggregate = document["aggregates"][0]
    aggregate["mechanism"] = mechanism
    aggregate["budget"] = {"epsilon": 1} if mechanism == "discrete_laplace" else {"epsilon": 1, "delta": 1e-7}
    aggregate["partition_selection"]["mechanism"] = mechanism
    spec = ReleaseSpec.model_validate(document)
    for step in plan_release(spec, "approx_dp").steps:
        scale = step.opendp_scale
        exact = Fraction(scale) if step.mechanism == "discrete_laplace" else Fraction(scale) ** 2
        assert exact >= step.scale
        below = math.nextafter(scale, 0.0)
        assert (Fraction(below) if step.mechanism == "discrete_laplace" else Fraction(below) ** 2) < step.scale
        assert step.describe()["opendp_scale_grid_units"] == scale
