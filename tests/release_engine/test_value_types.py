"""The type of a published value column, from public parameters (dp_operators/release/value_types.py)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pyarrow as pa
import pytest

from dp_operators.release.value_types import (
    FLOAT64,
    INT64,
    ValueType,
    aggregate_value_type,
    grid_problem,
    join,
    value_columns,
)


def laplace(grid: float, scale: str | None = "1") -> dict:
    """A published description of a discrete Laplace step (``scale``: t in grid units, exact; None: an older
    description without it)."""
    return {"mechanism": "discrete_laplace", "grid": grid, **({"scale_grid_units_exact": scale} if scale else {})}


class TestAggregateValueType:
    @pytest.mark.parametrize(("kind", "described", "family", "expected"), [
        pytest.param("count", laplace(1.0), False, INT64, id="count: int64"),
        pytest.param("sum", laplace(1.0, "10000000000000000"), False, INT64,
                     id="sum on grid 1, noise tail 9e17 within int64"),
        pytest.param("count", laplace(1.0, "100000000000000000"), False, ValueType("decimal", 20, 0),
                     id="count whose noise tail passes int64: decimal"),
        pytest.param("count", laplace(1.0, None), False, ValueType("decimal", 21, 0),
                     id="older description: the largest scale a plan allows"),
        pytest.param("sum", laplace(0.001, "1000000"), False, ValueType("decimal", 19, 3), id="grid 0.001"),
        pytest.param("sum", laplace(1 / 1024, "1000000"), False, ValueType("decimal", 26, 10), id="grid 1/1024"),
        pytest.param("sum", laplace(1000.0, "1000"), False, ValueType("decimal", 22, 0), id="grid 1000"),
        pytest.param("sum", {"mechanism": "discrete_gaussian", "grid": 1.0, "sigma2_grid_units_exact": "100"},
                     False, INT64, id="discrete Gaussian on grid 1"),
        pytest.param("mean", None, False, FLOAT64, id="mean: a binary float"),
        pytest.param("variance", None, False, FLOAT64, id="variance: a binary float"),
        pytest.param("count", laplace(1.0), True, FLOAT64, id="consistent family member: doubles"),
    ])
    def test_type_from_public_parameters(self, kind, described, family, expected):
        """Each aggregate gets the narrowest type holding every value it may publish (below a 2^-127 tail)."""
        assert aggregate_value_type(kind, described, family) == expected


class TestColumnValue:
    def test_a_fractional_grid_double_reads_as_its_grid_value(self):
        """The JSON's double of 24.751 is the decimal 24.751 in a decimal(19, 3) column."""
        assert ValueType("decimal", 19, 3).column_value(24.751) == Decimal("24.751")

    def test_integers_beyond_doubles_stay_exact(self):
        """2^53 + 1 stays 2^53 + 1 in int64 and in a decimal column."""
        assert INT64.column_value(2**53 + 1) == 2**53 + 1
        assert ValueType("decimal", 22, 0).column_value(2**70) == Decimal(2**70)

    @pytest.mark.parametrize(("column", "value"), [
        pytest.param(INT64, 2**63, id="2^63 in int64"),
        pytest.param(INT64, 0.5, id="a fraction in int64"),
        pytest.param(ValueType("decimal", 19, 3), 10.0**17, id="beyond decimal(19, 3)"),
        pytest.param(ValueType("decimal", 19, 3), 1e300, id="far beyond"),
    ])
    def test_a_value_beyond_the_column_is_refused_not_rounded(self, column, value):
        """A value the column cannot hold raises (a noise tail event), never rounds."""
        with pytest.raises(ValueError, match="does not fit"):
            column.column_value(value)


class TestJoin:
    def test_exact_types_join_to_the_widest_integer_part_and_scale(self):
        """int64 (19 digits), decimal(19, 3) and decimal(22, 0) join to decimal(25, 3), a decimal128."""
        joined = join([INT64, ValueType("decimal", 19, 3), ValueType("decimal", 22, 0)])
        assert joined == ValueType("decimal", 25, 3) and joined.arrow() == pa.decimal128(25, 3)

    def test_a_join_beyond_38_digits_is_a_decimal256(self):
        """36 integer digits beside 27 decimal places need 63 digits: Parquet's decimal256."""
        assert join([ValueType("decimal", 36, 0), ValueType("decimal", 29, 27)]).arrow() == pa.decimal256(63, 27)

    def test_binary_floats_beside_exact_values_get_their_own_column(self):
        """Counts beside a mean: value int64 and float_value; all binary floats: value float64 alone."""
        assert value_columns([INT64, FLOAT64]) == (INT64, True)
        assert value_columns([FLOAT64, FLOAT64]) == (FLOAT64, False)
        assert value_columns([INT64, INT64]) == (INT64, False)


@pytest.mark.parametrize(("grid", "refused"), [
    pytest.param(Fraction(1, 1000), False, id="0.001"),
    pytest.param(Fraction(1, 1024), False, id="1/1024"),
    pytest.param(Fraction(10**12), False, id="1e12"),
    pytest.param(Fraction(1, 3), True, id="1/3"),
    pytest.param(Fraction(1, 2**60), True, id="2^-60: 42 significant digits"),
])
def test_grid_problem_names_grids_without_a_short_decimal_form(grid, refused):
    """A grid is published as a double; only a grid that double's shortest decimal gives back exactly is usable."""
    assert (grid_problem(grid) is not None) == refused
