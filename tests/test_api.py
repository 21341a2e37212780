"""The Python API without Airflow: single-call mechanisms, validation, ledger charging and replay."""

from __future__ import annotations

from fractions import Fraction

import pytest

import dp_operators
from dp_operators import gaussian_mechanism, laplace_mechanism, vector_release
from dp_operators.ledger import BudgetExhaustedError, ReleaseKey

from support import make_ledger

KEY = ReleaseKey(dag_id="adult_census_release", run_id="notebook-1", task_id="api", map_index=-1,
                 release_name="weekly_total")


def test_the_api_is_exported_from_the_package():
    assert dp_operators.run_release is dp_operators.api.run_release
    assert dp_operators.vector_release is vector_release


def test_laplace_mechanism_returns_a_grid_value_with_its_published_half_width():
    result = laplace_mechanism(42, sensitivity=1, epsilon=1)
    assert isinstance(result.value, int)
    # OpenDP's discrete Laplace accuracy at scale 1, alpha 0.05 (3.3756) plus half a grid step for the rounding
    assert result.half_width == pytest.approx(3.3756 + 0.5, abs=1e-4)
    assert result.mechanism["mechanism"] == "discrete_laplace" and result.mechanism["scale"] == 1
    assert result.charge is None


def test_gaussian_mechanism_is_tight_for_any_epsilon():
    result = gaussian_mechanism(0, sensitivity=1, epsilon=1, delta=1e-6)
    assert result.mechanism["sigma"] == pytest.approx(4.225, rel=0.01)
    large = gaussian_mechanism(0, sensitivity=1, epsilon=8, delta=1e-6)  # the classical rule is invalid here
    assert large.mechanism["sigma"] < 1


def test_vector_release_uses_the_l2_sensitivity_for_gaussian_and_l1_for_laplace():
    gaussian = vector_release([0] * 100, sensitivity=1, epsilon=1, delta=1e-6, mechanism="discrete_gaussian")
    laplace = vector_release([0] * 100, sensitivity=1, epsilon=1, mechanism="discrete_laplace")
    assert gaussian.mechanism["l2_sensitivity"] == 10 and gaussian.mechanism["sigma"] == pytest.approx(42.25, rel=0.01)
    assert laplace.mechanism["l1_sensitivity"] == 100 and laplace.mechanism["scale"] == 100
    auto = vector_release([0] * 100, sensitivity=1, epsilon=1, delta=1e-6)
    assert auto.mechanism["mechanism"] == "discrete_gaussian"
    assert len(auto.values) == 100


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(lambda: laplace_mechanism(1, sensitivity=1, epsilon=float("nan")), "epsilon", id="epsilon NaN"),
        pytest.param(lambda: laplace_mechanism(1, sensitivity=1, epsilon=0), "epsilon: must be > 0", id="epsilon 0"),
        pytest.param(lambda: laplace_mechanism(1, sensitivity=1, epsilon=-1), "epsilon: must be > 0", id="negative"),
        pytest.param(lambda: laplace_mechanism(1, sensitivity=1, epsilon=float("inf")), "finite", id="epsilon inf"),
        pytest.param(lambda: gaussian_mechanism(1, sensitivity=1, epsilon=1, delta=0), "delta", id="delta 0"),
        pytest.param(lambda: gaussian_mechanism(1, sensitivity=1, epsilon=1, delta=1), "delta", id="delta 1"),
        pytest.param(lambda: gaussian_mechanism(1, sensitivity=1, epsilon=1), "epsilon and delta", id="no delta"),
        pytest.param(lambda: laplace_mechanism(1, sensitivity=0, epsilon=1), "sensitivity must be > 0", id="sens 0"),
        pytest.param(lambda: laplace_mechanism(1, sensitivity=float("inf"), epsilon=1), "finite", id="sens inf"),
        pytest.param(lambda: vector_release([], sensitivity=1, epsilon=1), "empty", id="empty vector"),
        pytest.param(lambda: vector_release([1], sensitivity=1, epsilon=1, mechanism="laplace"), "mechanism",
                     id="unknown mechanism"),
    ],
)
def test_bad_parameters_are_refused_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_special_values_never_raise_and_huge_values_saturate():
    import numpy as np

    for special in (float("nan"), float("inf"), float("-inf")):  # replaced by 0: the spec default
        assert abs(laplace_mechanism(special, sensitivity=1, epsilon=1).value) < 100
    assert 2**62 - 100 < laplace_mechanism(1e300, sensitivity=1, epsilon=1).value < 2**62 + 100
    # numpy integers are read as Python ints: nothing wraps
    assert laplace_mechanism(np.int64(2**62), sensitivity=1, epsilon=1).value > 2**61
    assert laplace_mechanism(np.int32(2**31 - 1), sensitivity=1, epsilon=1).value > 2**30


def test_charged_to_a_ledger_account_once_and_replayed_by_key(tmp_path):
    ledger = make_ledger(tmp_path / "api.db", accountant="pure_dp", cap="1")
    first = laplace_mechanism(100, sensitivity=1, epsilon=Fraction(1, 2), ledger=ledger, account="census_adult", key=KEY)
    again = laplace_mechanism(100, sensitivity=1, epsilon=Fraction(1, 2), ledger=ledger, account="census_adult", key=KEY)
    assert not first.replayed and again.replayed and again.value == first.value
    assert first.charge["epsilon_exact"] == "1/2"
    assert ledger.account("census_adult").spent == Fraction(1, 2)


def test_bad_parameters_or_exhausted_budget_spend_nothing(tmp_path):
    ledger = make_ledger(tmp_path / "api.db", accountant="pure_dp", cap="1")
    with pytest.raises(ValueError):
        laplace_mechanism(1, sensitivity=1, epsilon=0, ledger=ledger, account="census_adult", key=KEY)
    with pytest.raises(BudgetExhaustedError):
        laplace_mechanism(1, sensitivity=1, epsilon=2, ledger=ledger, account="census_adult", key=KEY)
    assert ledger.account("census_adult").spent == 0 and list(ledger.charges()) == []


def test_ledger_needs_account_and_key():
    with pytest.raises(ValueError, match="ledger, account and key together"):
        laplace_mechanism(1, sensitivity=1, epsilon=1, account="census_adult")


def test_numpy_scalars_and_arrays_are_accepted():
    import numpy as np

    from dp_operators import laplace_mechanism, vector_release

    single = laplace_mechanism(np.int64(10), sensitivity=np.int64(1), epsilon=np.float64(0.5))
    assert isinstance(single.value, int)
    assert single.mechanism["epsilon_exact"] == "1/2"
    assert len(vector_release(np.array([1, 2, 3]), sensitivity=1, epsilon=1).values) == 3


@pytest.mark.parametrize("bound", [pytest.param(0, id="zero"), pytest.param(4, id="more than the values"),
                                   pytest.param(True, id="boolean")])
def test_max_partitions_contributed_must_fit_the_vector(bound):
    from dp_operators import vector_release

    with pytest.raises(ValueError, match="max_partitions_contributed must be a whole number from 1 to"):
        vector_release([1, 2, 3], sensitivity=1, epsilon=1, max_partitions_contributed=bound)


def test_a_decimal_sensitivity_is_accepted():
    from dp_operators import laplace_mechanism

    result = laplace_mechanism(1.0, sensitivity=0.1, epsilon=1)
    assert result.mechanism["l1_sensitivity"] == pytest.approx(0.1, rel=0.01)


def test_a_saturated_value_anywhere_in_a_vector_is_flagged():
    """1e30 is beyond the 2^62-grid-unit limit at grid 1, so its released value sits at the limit
    and no finite interval holds; the flag must say so for that value, wherever it stands, and for no other."""
    result = vector_release([1, 1e30, 3], sensitivity=1, epsilon=1, confidence=1 - 1e-9)
    assert result.saturated == [False, True, False]
    assert result.half_width is not None and result.half_width > 0
    single = laplace_mechanism(1e30, sensitivity=1, epsilon=1, confidence=1 - 1e-9)
    assert single.saturated and single.half_width is None
    assert not laplace_mechanism(5, sensitivity=1, epsilon=1).saturated


def _vector_spec(size: int, grid: Fraction = Fraction(1)):
    from dp_operators.api import _spec

    return _spec(release="api", account="none", privacy_unit="unspecified", size=size, sensitivity=Fraction(1),
                 grid=grid, mechanism="discrete_laplace", budget={"epsilon": 1}, max_partitions_contributed=1,
                 confidence=0.95)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(lambda np: np.array([0, -5, 2**62 - 1, -(2**63), 2**63 - 1, 7]), id="int64 array, edges"),
        pytest.param(lambda np: np.array([0, 255, 3], dtype=np.uint8), id="uint8 array"),
        pytest.param(lambda np: np.array([-(2**31), 2**31 - 1, 3], dtype=np.int32), id="int32 array"),
        pytest.param(lambda np: [1, -2, 2**62 + 5, -(2**63)], id="list of Python ints"),
    ],
)
def test_integer_vectors_are_read_as_a_table_with_the_row_readers_integers(values):
    """An integer vector reaches the engine as an int64 table, read array-at-a-time into the same grid integers
    (saturation included) and the same diagnostics as the row-by-row reader gives for the same exact values."""
    import numpy as np

    from dp_operators.api import _exact_value, _vector_upstream
    from dp_operators.release import prepare_inputs
    from dp_operators.release.diagnostics import DiagnosticsReport
    from dp_operators.release.columns import is_table

    values = values(np)
    spec = _vector_spec(len(values))
    upstream = _vector_upstream(values, Fraction(1))
    assert is_table(upstream)
    rows = [{"index": i, "sum": _exact_value(v)} for i, v in enumerate(np.asarray(values).tolist())]
    columnar, by_rows = DiagnosticsReport("api"), DiagnosticsReport("api")
    fast = prepare_inputs(spec, {"value": upstream}, diagnostics=columnar)
    slow = prepare_inputs(spec, {"value": rows}, diagnostics=by_rows)
    assert fast.values[("value", "sum")].tolist() == slow.values[("value", "sum")].tolist()
    assert list(fast.keys["value"]) == list(slow.keys["value"])
    assert columnar.as_dict() == by_rows.as_dict()


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(lambda np: np.array([1.5, 2.0]), id="float64 array"),
        pytest.param(lambda np: np.array([1, 2], dtype=np.uint64), id="uint64 array"),
        pytest.param(lambda np: np.array([True, False]), id="bool array"),
        pytest.param(lambda np: [1, True], id="list with a bool"),
        pytest.param(lambda np: [1, np.int64(2)], id="list with a numpy int"),
    ],
)
def test_other_vectors_take_the_row_reader(values):
    """Vectors that are not integers int64 holds go to the row-by-row reader as exact values."""
    import numpy as np

    from dp_operators.api import _vector_upstream

    assert isinstance(_vector_upstream(values(np), Fraction(1)), list)


@pytest.mark.parametrize("grid", [Fraction(1), Fraction(1, 7), Fraction(3, 2)])
@pytest.mark.parametrize("edge", [2**63 - 1, 2**63, 10**40, -(2**63) - 1, -(10**40)])
def test_a_list_of_ints_takes_one_reader_whatever_its_values(edge, grid):
    """Neighbouring int lists (one value beyond int64 or not) take the same array reader and give the same saturated
    grid integers as the exact row reader: the reader follows the type and the public grid, never a value."""
    import numpy as np

    from dp_operators.api import _exact_value, _vector_upstream
    from dp_operators.release import prepare_inputs
    from dp_operators.release.columns import is_table

    values = [3, -4, edge]
    neighbour = [3, -4, edge - 1 if edge > 0 else edge + 1]
    spec = _vector_spec(len(values), grid=grid)
    for vector in (values, neighbour):
        upstream = _vector_upstream(vector, grid)
        assert is_table(upstream)
        rows = [{"index": i, "sum": _exact_value(v)} for i, v in enumerate(vector)]
        fast = prepare_inputs(spec, {"value": upstream})
        slow = prepare_inputs(spec, {"value": rows})
        assert fast.values[("value", "sum")].tolist() == slow.values[("value", "sum")].tolist()


def test_a_grid_too_coarse_for_int64_clipping_sends_every_int_list_to_the_row_reader():
    """Above the grid where +-(2**62 + 1) grid steps leave int64, every int list is read row by row, small or not."""
    from dp_operators.api import _vector_upstream

    assert isinstance(_vector_upstream([1, 2, 3], Fraction(4)), list)
    assert isinstance(_vector_upstream([1, 2, 10**40], Fraction(4)), list)


def test_a_bool_array_is_refused_as_the_row_reader_refuses_a_bool():
    """A boolean array is not taken for integers: it is refused by its type, before anything is charged."""
    import numpy as np

    from dp_operators.release import ReleaseInputError

    with pytest.raises(ReleaseInputError, match="bool"):
        vector_release(np.array([True, False]), sensitivity=1, epsilon=1)


def test_an_integer_array_and_its_list_release_the_same_vector_description(tmp_path):
    """The published shape of a vector (values, half-width, flags, mechanism) does not depend on whether it was
    given as an array (read array-at-a-time) or as a list of Decimals (read row by row), with or without a
    ledger."""
    import numpy as np
    from decimal import Decimal

    values = np.array([3, 2**62 + 10, -4])
    array = vector_release(values, sensitivity=1, epsilon=1, mechanism="discrete_laplace")
    rows = vector_release([Decimal(int(v)) for v in values], sensitivity=1, epsilon=1, mechanism="discrete_laplace")
    assert array.saturated == rows.saturated == [False, True, False]
    assert array.half_width == rows.half_width and array.mechanism == rows.mechanism
    assert [type(v) for v in array.values] == [type(v) for v in rows.values] == [int, int, int]
    ledger = make_ledger(tmp_path / "api.db", accountant="pure_dp", cap="10", dags=("pipeline",))
    key = ReleaseKey(dag_id="pipeline", run_id="r", task_id="t", map_index=-1, release_name="vector")
    charged = vector_release(values, sensitivity=1, epsilon=1, mechanism="discrete_laplace", ledger=ledger,
                             account="census_adult", key=key)
    assert charged.saturated == [False, True, False] and charged.half_width == array.half_width
    replayed = vector_release(values, sensitivity=1, epsilon=1, mechanism="discrete_laplace", ledger=ledger,
                              account="census_adult", key=key)
    assert replayed.replayed and replayed.values == charged.values


def test_a_scalar_mechanism_given_an_array_refuses_it_by_its_type():
    """Only ``vector_release`` takes a 1-D array as a vector: ``laplace_mechanism`` refuses one as not a number."""
    import numpy as np

    from dp_operators.release import ReleaseInputError

    with pytest.raises(ReleaseInputError, match="ndarray, not a number"):
        laplace_mechanism(np.array([1, 2]), sensitivity=1, epsilon=1)


def test_a_long_vector_without_a_contribution_bound_is_refused_with_the_fix():
    """Above 10,000 values the default bound (all of them) is refused naming the default and how to set it."""
    import numpy as np

    with pytest.raises(ValueError, match=r"defaults to the number of values \(10,001\).*max_partitions_contributed=k"):
        vector_release(np.arange(10_001), sensitivity=1, epsilon=1)
    assert len(vector_release(np.arange(10_001), sensitivity=1, epsilon=1, max_partitions_contributed=1).values) == 10_001
