"""Typed privacy parameters (dp_operators.accounting.values): what they refuse, what they keep, how they are read."""

from __future__ import annotations

import copy
import math
import pickle
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from dp_operators.accounting import Delta, Epsilon, Grid, NoiseScale, PositiveRational, Rho, Sensitivity
from dp_operators.mechanisms.calibration import (
    discrete_gaussian_sigma2,
    discrete_laplace_scale,
    epsilon_for_rho,
    rho_for_approx_dp,
)
from dp_operators.spec import parse_spec

POSITIVE_TYPES = [Epsilon, Rho, Grid, Sensitivity, NoiseScale]
ALL_TYPES = [*POSITIVE_TYPES, Delta]


def _ids(kinds):
    return [kind.__name__ for kind in kinds]


class TestConstruction:
    """The constructor takes exact numbers only and checks the range."""

    @pytest.mark.parametrize("kind", ALL_TYPES, ids=_ids(ALL_TYPES))
    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(float("nan"), id="NaN"),
            pytest.param(float("inf"), id="infinity"),
            pytest.param(float("-inf"), id="minus infinity"),
            pytest.param(Decimal("NaN"), id="Decimal NaN"),
            pytest.param(Decimal("Infinity"), id="Decimal infinity"),
        ],
    )
    def test_refuses_non_finite_values_naming_field_and_value(self, kind, value):
        """NaN and infinities are refused with ValueError naming the field and the value."""
        with pytest.raises(ValueError, match=rf"^{kind.field} must be a finite number, got .*(nan|inf|NaN|Infinity)"):
            kind(value)

    @pytest.mark.parametrize("kind", ALL_TYPES, ids=_ids(ALL_TYPES))
    @pytest.mark.parametrize("value", [True, False], ids=["true", "false"])
    def test_refuses_booleans(self, kind, value):
        """A bool is not a number here, though Python counts it as an int."""
        with pytest.raises(ValueError, match=rf"^{kind.field} must be a number, got the boolean {value}"):
            kind(value)

    @pytest.mark.parametrize("kind", POSITIVE_TYPES, ids=_ids(POSITIVE_TYPES))
    @pytest.mark.parametrize("value", [0, -1, Fraction(-1, 3), Decimal("-0.5")], ids=["zero", "-1", "-1/3", "-0.5"])
    def test_positive_types_refuse_zero_and_negatives(self, kind, value):
        """Epsilon, rho, grids, sensitivities and scales are > 0; the message gives the field and the value."""
        with pytest.raises(ValueError, match=rf"^{kind.field} must be > 0, got {value!r}".replace("(", r"\(")
                           .replace(")", r"\)")):
            kind(value)

    @pytest.mark.parametrize(
        "value",
        [0, 1, -1, Fraction(3, 2), Fraction(-1, 10**9), 10**300],
        ids=["zero", "one", "-1", "3/2", "-1e-9", "1e300"],
    )
    def test_delta_is_strictly_between_zero_and_one(self, value):
        """0 is pure DP (no delta field) and 1 promises nothing: both are refused, as is anything outside."""
        with pytest.raises(ValueError, match=r"^delta must be strictly between 0 and 1, got "):
            Delta(value)

    @pytest.mark.parametrize("kind", ALL_TYPES, ids=_ids(ALL_TYPES))
    @pytest.mark.parametrize("value", [0.5, np.float64(0.5)], ids=["float", "numpy float"])
    def test_refuses_floats_where_exactness_matters(self, kind, value):
        """Which rational a float stands for is the reader's decision: the constructor refuses it (TypeError)."""
        with pytest.raises(TypeError, match=rf"^{kind.field} must be exact .* got the float \S*0.5\)?: read it with "
                                            rf"{kind.__name__}.read\(\)"):
            kind(value)

    @pytest.mark.parametrize("kind", ALL_TYPES, ids=_ids(ALL_TYPES))
    def test_refuses_text(self, kind):
        """Text is read by ``read`` only."""
        with pytest.raises(TypeError, match=rf"^{kind.field} must be a number, got the text '1/2'"):
            kind("1/2")

    def test_caller_names_the_field_in_the_message(self):
        """A boundary that knows the field's path passes it, and the message uses it."""
        with pytest.raises(ValueError, match=r"^aggregates\[0\]\.budget\.epsilon must be > 0, got -2$"):
            Epsilon(-2, name="aggregates[0].budget.epsilon")

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            pytest.param(3, Fraction(3), id="int"),
            pytest.param(np.int64(3), Fraction(3), id="numpy int"),
            pytest.param(Fraction(1, 3), Fraction(1, 3), id="Fraction"),
            pytest.param(Decimal("0.1"), Fraction(1, 10), id="Decimal"),
        ],
    )
    def test_takes_exact_numbers_exactly(self, value, expected):
        """ints, Fractions and Decimals are taken as the exact rationals they are."""
        assert Epsilon(value) == expected

    def test_takes_a_numerator_and_a_denominator(self):
        """``Rho(1, 3)`` is 1/3, as ``Fraction(1, 3)``; both parts must be ints."""
        assert Rho(1, 3) == Fraction(1, 3)
        with pytest.raises(TypeError, match="numerator and denominator must be ints"):
            Rho(1.0, 3)


class TestRead:
    """``read`` is the boundary's one parse: floats as typed, text as decimals or ratios."""

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            pytest.param(0.1, Fraction(1, 10), id="float 0.1 is 1/10"),
            pytest.param("1/3", Fraction(1, 3), id="ratio text"),
            pytest.param("1e-6", Fraction(1, 10**6), id="decimal text"),
            pytest.param(2, Fraction(2), id="int"),
        ],
    )
    def test_reads_a_written_number_as_typed(self, value, expected):
        """A float is the decimal it was typed as, never its binary expansion."""
        epsilon = Epsilon.read(value)
        assert type(epsilon) is Epsilon and epsilon == expected

    @pytest.mark.parametrize(
        ("kind", "value", "message"),
        [
            pytest.param(Epsilon, float("nan"), r"epsilon must be a finite number, got nan", id="NaN epsilon"),
            pytest.param(Rho, float("inf"), r"rho must be a finite number, got inf", id="infinite rho"),
            pytest.param(Epsilon, -0.5, r"epsilon must be > 0, got -0.5", id="negative epsilon"),
            pytest.param(Rho, 0.0, r"rho must be > 0, got 0.0", id="zero rho"),
            pytest.param(Delta, 1.0, r"delta must be strictly between 0 and 1, got 1.0", id="delta one"),
            pytest.param(Delta, "0", r"delta must be strictly between 0 and 1, got '0'", id="delta zero text"),
            pytest.param(Delta, True, r"delta must be a number, got the boolean True", id="boolean delta"),
            pytest.param(Epsilon, "abc", r"epsilon must be a decimal like '0.1'", id="unparsable text"),
        ],
    )
    def test_refuses_with_the_field_and_the_value_as_written(self, kind, value, message):
        """The message shows the value as the user wrote it, not its rational."""
        with pytest.raises(ValueError, match=f"^{message}"):
            kind.read(value)


class TestOf:
    """``of`` takes a typed value as it is and reads the rest."""

    def test_typed_value_is_returned_unchanged(self):
        """A typed value was checked when it was made: the same object comes back."""
        epsilon = Epsilon(1, 10)
        assert Epsilon.of(epsilon) is epsilon

    def test_float_is_read_and_exact_number_is_checked(self):
        """A float is read as typed; a Fraction is checked and typed; a negative one is refused."""
        assert Epsilon.of(0.1) == Fraction(1, 10) and type(Epsilon.of(0.1)) is Epsilon
        assert type(Delta.of(Fraction(1, 10**6))) is Delta
        with pytest.raises(ValueError, match="delta must be strictly between 0 and 1"):
            Delta.of(Fraction(2))


class TestSameNumber:
    """A typed value is the Fraction it holds: same arithmetic, hash, text and float, so no result moves."""

    @pytest.mark.parametrize("kind", ALL_TYPES, ids=_ids(ALL_TYPES))
    def test_equal_hash_text_and_float_as_the_fraction(self, kind):
        """Equality, hashing (caches keyed by the number hit), ``str`` and ``float`` are Fraction's."""
        value, plain = kind(1, 7), Fraction(1, 7)
        assert value == plain and hash(value) == hash(plain)
        assert str(value) == str(plain) and float(value) == float(plain)
        assert isinstance(value, Fraction) and isinstance(value, kind)

    def test_arithmetic_gives_plain_fractions(self):
        """A derived number is a plain Fraction until the code deriving it types it again (with the check)."""
        share = Epsilon(1, 2) / 3
        assert type(share) is Fraction and share == Fraction(1, 6)
        assert type(Delta(1, 2) - Delta(1, 4)) is Fraction

    @pytest.mark.parametrize("kind", ALL_TYPES, ids=_ids(ALL_TYPES))
    def test_pickle_and_copy_keep_the_type(self, kind):
        """Pickling rebuilds through the checking constructor; copies are the value itself (immutable)."""
        value = kind(2, 9)
        restored = pickle.loads(pickle.dumps(value))
        assert type(restored) is kind and restored == value
        assert copy.copy(value) is value and copy.deepcopy(value) is value

    def test_immutable(self):
        """No attribute can be set or added: the value is fixed once checked."""
        value = Rho(1, 2)
        with pytest.raises(AttributeError):
            value._numerator = -1  # type: ignore[misc]
        with pytest.raises(AttributeError):
            value.note = "x"  # type: ignore[attr-defined]


class TestSpecBoundary:
    """The spec is where budgets, grids and bounds are read, once, into typed values."""

    SPEC = """
version: 1
release: typed
budget_account: acct
privacy_unit: person
aggregates:
  - name: hours
    kind: mean
    bounds: [0.5, 99]
    grid: 0.25
    mechanism: discrete_gaussian
    budget: {epsilon: 0.3, delta: 1e-6}
  - name: places
    kind: count
    group_by: [place]
    mechanism: discrete_laplace
    budget: {epsilon: '1/3'}
    partition_selection: {budget: {epsilon: 1, delta: 1e-7}}
  - name: people
    kind: count
    mechanism: discrete_gaussian
    budget: {rho: 0.02}
"""

    def test_budget_grid_and_bounds_are_typed_after_load(self):
        """epsilon, rho, delta and grid hold typed exact values; bounds are exact fractions (0.5 is 1/2)."""
        spec = parse_spec(self.SPEC)
        hours, places, people = spec.aggregates
        assert type(hours.budget.epsilon) is Epsilon and hours.budget.epsilon == Fraction(3, 10)
        assert type(hours.budget.delta) is Delta and hours.budget.delta == Fraction(1, 10**6)
        assert type(hours.grid) is Grid and hours.grid == Fraction(1, 4)
        assert hours.exact_bounds == (Fraction(1, 2), Fraction(99))
        assert type(places.budget.epsilon) is Epsilon and places.budget.epsilon == Fraction(1, 3)
        assert type(places.partition_selection.budget.delta) is Delta
        assert type(people.budget.rho) is Rho and type(people.grid) is Grid
        assert people.exact_bounds is None

    @pytest.mark.parametrize(
        ("budget", "message"),
        [
            pytest.param("{epsilon: .nan}", "epsilon must be a finite number", id="NaN epsilon"),
            pytest.param("{epsilon: -1}", "must be > 0, got -1", id="negative epsilon"),
            pytest.param("{rho: 0}", "must be > 0, got 0", id="zero rho"),
            pytest.param("{epsilon: 1, delta: 1}", "delta must be in (0, 1), got 1", id="delta one"),
            pytest.param("{epsilon: true}", "epsilon must be a number, got the boolean True", id="boolean epsilon"),
        ],
    )
    def test_spec_refuses_bad_budgets_at_load(self, budget, message):
        """A bad budget is refused when the spec is read, with the field path and the value."""
        text = self.SPEC.replace("{rho: 0.02}", budget)
        with pytest.raises(Exception, match="budget") as refused:
            parse_spec(text)
        assert message in str(refused.value)


class TestCalibrationTakesTypedValues:
    """Calibration takes typed values as they are, types its results, and still reads a direct caller's numbers."""

    def test_results_are_typed(self):
        """Scales are NoiseScale, calibrated budgets Epsilon or Rho, with the same numbers as before."""
        scale = discrete_laplace_scale(Sensitivity(3), Epsilon(1, 2))
        assert type(scale) is NoiseScale and scale == 6
        sigma2 = discrete_gaussian_sigma2(Sensitivity(2), Rho(1, 4))
        assert type(sigma2) is NoiseScale and sigma2 == 4
        assert type(epsilon_for_rho(Rho(1, 2))) is Epsilon
        assert type(rho_for_approx_dp(Epsilon(1), Delta(1, 10**6))) is Rho

    def test_direct_callers_may_pass_plain_numbers(self):
        """A float or int argument is read at the call (a float as typed); a bad one names the parameter."""
        assert discrete_laplace_scale(1, 0.1) == 10
        with pytest.raises(ValueError, match=r"^epsilon must be > 0, got -0.1$"):
            discrete_laplace_scale(1, -0.1)
        with pytest.raises(ValueError, match=r"^rho must be > 0, got nan|^rho must be a finite number"):
            discrete_gaussian_sigma2(1, math.nan)

    def test_sensitivity_type_refuses_zero(self):
        """A zero sensitivity would make any scale 'valid': the type refuses it before any calibration."""
        with pytest.raises(ValueError, match=r"^l1_sensitivity must be > 0, got 0$"):
            discrete_laplace_scale(0, Epsilon(1))

    def test_positive_rational_base_is_the_common_check(self):
        """Every positive type is a PositiveRational, the check the mechanisms' readers recognise."""
        assert all(issubclass(kind, PositiveRational) for kind in POSITIVE_TYPES)
        assert not issubclass(Delta, PositiveRational)


def test_a_typed_value_built_around_its_constructor_is_still_refused_by_the_mechanisms():
    """A value made with Fraction.__new__ (skipping the range check) is caught where the mechanisms take it."""
    from dp_operators.mechanisms._rational import as_open_unit_interval, as_positive_rational

    with pytest.raises(ValueError, match="epsilon must be > 0"):
        as_positive_rational(Fraction.__new__(Epsilon, -1, 3), "epsilon")
    with pytest.raises(ValueError, match="delta must be strictly between 0 and 1"):
        as_open_unit_interval(Fraction.__new__(Delta, 3, 2), "delta")
