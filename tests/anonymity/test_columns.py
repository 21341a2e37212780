"""Type handling of quasi-identifier and sensitive columns (``columns.qi_kind``): every input fault of a column's
type is a clear AnonymityInputError naming the column, never a numpy or pandas error, and a value float64 cannot
hold is never published as another value."""

from __future__ import annotations

import io
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dp_operators.anonymity import AnonymityInputError, AnonymitySpec, check_table
from dp_operators.anonymity.anonymise import anonymise
from dp_operators.anonymity.columns import declared_qi_kinds, numeric_values, qi_kind
from dp_operators.anonymity.errors import AnonymityError
from dp_operators.anonymity.generalisation import encode_quasi_identifiers

from .anonymity_tables import anonymity_spec, anonymity_spec_text


def column(values, dtype=None, name="q") -> pd.Series:
    return pd.Series(values, dtype=dtype, name=name)


@pytest.mark.parametrize(
    ("series", "kind"),
    [
        pytest.param(column([True, False, True]), "categorical", id="bool dtype"),
        pytest.param(column([True, False], dtype="boolean"), "categorical", id="nullable boolean dtype"),
        pytest.param(column([True, np.bool_(False)], dtype=object), "categorical", id="object bools"),
        pytest.param(column([1, 2, 3]), "numeric", id="int64"),
        pytest.param(column([1, 2], dtype="Int64"), "numeric", id="nullable Int64"),
        pytest.param(column([1.5, 2.5]), "numeric", id="float64"),
        pytest.param(column([1, 2.5, np.int32(3), np.float32(4.5)], dtype=object), "numeric", id="object numbers"),
        pytest.param(column([Decimal("1.5"), Decimal("2")], dtype=object), "numeric", id="Decimal"),
        pytest.param(column([Fraction(1, 2), 3], dtype=object), "numeric", id="Fraction and int"),
        pytest.param(column(["01234", "98765"]), "categorical", id="numeric text (ZIP codes) stays text"),
        pytest.param(column(["inf", "1"]), "categorical", id="numeric text including inf stays text"),
        pytest.param(column(["a", "b"]), "categorical", id="text"),
        pytest.param(column(["a", True], dtype=object), "categorical", id="text and booleans"),
        pytest.param(column(pd.to_datetime(["2020-01-01", "2021-01-01"])), "categorical", id="datetimes"),
    ],
)
def test_inferred_kind(series, kind):
    assert qi_kind(series) == kind


@pytest.mark.parametrize(
    ("series", "declared", "kind"),
    [
        pytest.param(column([1, 2]), "categorical", "categorical", id="numbers declared categorical"),
        pytest.param(column([1.0, math.inf]), "categorical", "categorical", id="inf declared categorical is a label"),
        pytest.param(column(["01234", "98765"]), "numeric", "numeric", id="numeric text declared numeric"),
        pytest.param(column(["1", 2], dtype=object), "numeric", "numeric", id="numbers and numeric text"),
        pytest.param(column(["25", "x"]), "categorical", "categorical", id="stray text declared categorical"),
        pytest.param(column([True, False]), "categorical", "categorical", id="bool declared categorical"),
    ],
)
def test_declared_kind(series, declared, kind):
    assert qi_kind(series, declared) == kind


def test_csv_numeric_column_with_one_stray_string_is_refused_without_quoting_it():
    csv = "age\n" + "".join(f"{20 + i}\n" for i in range(9)) + "n/k\n"
    table = pd.read_csv(io.StringIO(csv))
    assert not pd.api.types.is_numeric_dtype(table["age"])  # what pandas leaves: a text column
    with pytest.raises(AnonymityInputError, match="'age' holds 9 numeric and 1 non-numeric value\\(s\\) as text") as error:
        qi_kind(table["age"])
    assert "n/k" not in str(error.value)
    with pytest.raises(AnonymityInputError, match="declared numeric but 1 of its 10 values are not numbers"):
        qi_kind(table["age"], "numeric")


@pytest.mark.parametrize(
    ("series", "match"),
    [
        pytest.param(column([1.0, math.inf, -math.inf]), "2 infinite value", id="inf in float64"),
        pytest.param(column([1, math.inf], dtype=object), "1 infinite value", id="inf in object"),
        pytest.param(column([Decimal("1"), Decimal("Infinity")], dtype=object), "1 infinite value", id="Decimal inf"),
        pytest.param(column([-1e308, 1e308]), "range wider than a float64", id="range overflows"),
        pytest.param(column([1 + 2j, 3 + 0j]), "complex numbers", id="complex dtype"),
        pytest.param(column([1, "a"], dtype=object), "mixes numbers \\(1 values\\) with text", id="number and text"),
        pytest.param(column([1, True], dtype=object), "mixes numbers \\(1 values\\) with text or booleans",
                     id="number and boolean"),
        pytest.param(column([1, "2"], dtype=object), "mixes numbers", id="number and numeric text undeclared"),
    ],
)
def test_refused(series, match):
    with pytest.raises(AnonymityInputError, match=match):
        qi_kind(series)


@pytest.mark.parametrize(
    ("series", "match"),
    [
        pytest.param(column([True, False]), "boolean and cannot be numeric", id="bool dtype"),
        pytest.param(column([True, False], dtype=object), "boolean and cannot be numeric", id="object bools"),
        pytest.param(column(["1", "inf"]), "1 infinite value", id="inf as text"),
        pytest.param(column(["1", "nan"]), "1 NaN value", id="nan as text"),
        pytest.param(column(["a", "b"]), "2 of its 2 values are not numbers", id="text"),
    ],
)
def test_refused_as_declared_numeric(series, match):
    with pytest.raises(AnonymityInputError, match=match):
        qi_kind(series, "numeric")


def test_decimal_nan_is_refused_even_if_the_missing_value_check_was_skipped():
    series = column([Decimal("1"), Decimal("NaN")], dtype=object)
    with pytest.raises(AnonymityInputError, match="1 NaN value"):
        qi_kind(series)


def test_unknown_declaration_is_a_programming_error():
    with pytest.raises(ValueError, match="declared must be"):
        qi_kind(column([1]), "ordinal")  # type: ignore[arg-type]


def test_messages_never_quote_cells():
    for series in (column([1, "Jane Doe"], dtype=object), column(["12", "Jane Doe"])):
        with pytest.raises(AnonymityInputError) as error:
            qi_kind(series)
        assert "Jane" not in str(error.value)


def test_numeric_values():
    np.testing.assert_array_equal(numeric_values(column([Decimal("1.5"), 2], dtype=object)), [1.5, 2.0])
    np.testing.assert_array_equal(numeric_values(column(["039", "4"])), [39.0, 4.0])
    assert numeric_values(column([1, 2])).dtype == np.float64
    with pytest.raises(AnonymityInputError, match="'q' is not numeric: some of its values are not numbers"):
        numeric_values(column(["1", "x"]))


@pytest.mark.parametrize(
    ("series", "inexact"),
    [
        pytest.param(column(np.array([2**53, 2**53 + 1] * 2, dtype=np.int64)), 1, id="int64 2**53 + 1"),
        pytest.param(column(np.array([-(2**53) - 1, 5], dtype=np.int64)), 1, id="int64 -2**53 - 1"),
        pytest.param(column(np.array([2**64 - 1, 2**64 - 2], dtype=np.uint64)), 2, id="uint64 near 2**64"),
        pytest.param(column([2**53 + 1, 2**64 + 3, 1], dtype=object), 2, id="Python ints"),
        pytest.param(column([Decimal("0.1"), Decimal("0.10000000000000000001")], dtype=object), 1, id="Decimal"),
        pytest.param(column([Fraction(1, 3), Fraction(1, 2)], dtype=object), 1, id="Fraction 1/3"),
        pytest.param(
            column(np.array([1, 2**60 + 1], dtype=np.longdouble)),
            1,
            id="long double",
            marks=pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="long double is float64 here"),
        ),
        pytest.param(column(["9007199254740993", "1"]), 1, id="numeric text"),
    ],
)
def test_numbers_a_float64_cannot_hold_are_refused(series, inexact):
    # By hand: 2**53 + 1, 2**60 + 1, 2**64 - 1, 2**64 - 2, 2**64 + 3, 0.1 + 1e-20 and 1/3 round to another
    # float64; 2**53, 1, 5, 1/2 and Decimal("0.1") (the float 0.1 prints as 0.1) do not.
    message = f"'q' has {inexact} distinct value\\(s\\) that a 64-bit float cannot"
    with pytest.raises(AnonymityInputError, match=message):
        numeric_values(series)
    with pytest.raises(AnonymityInputError, match="declare it type: categorical") as error:
        qi_kind(series, "numeric")
    assert "9007199254740993" not in str(error.value) and "18446744073709551615" not in str(error.value)
    assert qi_kind(series, "categorical") == "categorical"


@pytest.mark.parametrize(
    "series",
    [
        pytest.param(column(np.array([2**53, -(2**53), 2**60], dtype=np.int64)), id="int64 powers of two"),
        pytest.param(column(np.array([2**63, 2**64 - 2**11], dtype=np.uint64)), id="uint64 multiples of 2**11"),
        pytest.param(column([Decimal("0.1"), Decimal("2.50"), Decimal("1e20")], dtype=object), id="Decimal"),
        pytest.param(column([Fraction(1, 2), Fraction(3, 4)], dtype=object), id="dyadic Fraction"),
        pytest.param(column([0.1, 1e300, np.float32(0.1)], dtype=object), id="floats"),
    ],
)
def test_numbers_a_float64_holds_are_kept(series):
    expected = np.array([float(v) for v in series], dtype=np.float64)
    np.testing.assert_array_equal(numeric_values(series), expected)
    assert qi_kind(series) == "numeric"


def test_integers_too_large_for_a_float_are_refused():
    with pytest.raises(AnonymityInputError, match="'q' has value\\(s\\) too large for a 64-bit float"):
        numeric_values(column([10**400, 1], dtype=object))


def test_declared_kinds_from_the_spec():
    spec = AnonymitySpec.model_validate(
        {
            "version": 1,
            "check": "c",
            "quasi_identifiers": [
                "sex",
                {"name": "zip", "type": "categorical"},
                {"name": "income", "type": "numeric"},
                {"name": "age", "hierarchy": {"intervals": [5, 10]}},
            ],
            "targets": {"k": 2},
        }
    )
    assert declared_qi_kinds(spec) == {"sex": None, "zip": "categorical", "income": "numeric", "age": "numeric"}


# -- columns whose cells or names the tools cannot take -------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["full_domain", "mondrian"])
def test_unhashable_cells_raise_anonymity_input_error(algorithm):
    """Dict cells (what ``pandas.read_parquet`` returns for a Parquet struct column) in a quasi-identifier or a
    sensitive column raise AnonymityError in ``anonymise`` and ``check_table`` alike, never a bare TypeError (the
    operators turn AnonymityError into a failed task with a report, without retry)."""
    table = pd.DataFrame({"q": [{"a": 1}, {"b": 2}] * 3, "s": list("pqpqpq")})
    spec = anonymity_spec(["q"], {"k": 2}, algorithm=algorithm)
    with pytest.raises(AnonymityError):
        anonymise(table, spec)
    with pytest.raises(AnonymityError):
        check_table(table, spec)
    sensitive = pd.DataFrame({"q": list("aabbcc"), "s": [{"a": 1}, {"b": 2}] * 3})
    with pytest.raises(AnonymityError):
        check_table(sensitive, anonymity_spec(["q"], {"k": 2, "t": 0.9}, sensitive=[("s", "categorical")]))


def test_encode_refuses_unhashable_quasi_identifier_cells():
    """``encode_quasi_identifiers`` on a dict-valued quasi-identifier raises AnonymityError naming the column."""
    table = pd.DataFrame({"q": [{"a": 1}, {"b": 2}] * 3})
    with pytest.raises(AnonymityError, match="'q'"):
        encode_quasi_identifiers(table, anonymity_spec(["q"], {"k": 2}))


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(np.array([2**53, 2**53 + 1] * 2, dtype=np.int64), id="int64-above-2**53"),
        pytest.param(np.array([2**64 - 1, 2**64 - 2] * 2, dtype=np.uint64), id="uint64-near-2**64"),
        pytest.param([2**64 + 1, 2**64 + 3] * 2, id="python-int-above-2**63"),
        pytest.param([Decimal("0.1"), Decimal("0.10000000000000000001")] * 2, id="decimal-beyond-float"),
    ],
)
def test_full_domain_publishes_only_the_original_values_or_refuses_the_column(values):
    """A numeric quasi-identifier whose values float64 cannot tell apart (integers above 2**53, uint64 near 2**64,
    exact Decimals) is never collapsed through float64: every released cell is the row's original value (or ``*``),
    or the column is refused with AnonymityInputError."""
    table = pd.DataFrame({"x": values})
    try:
        result = anonymise(table, anonymity_spec_text("x"))
    except AnonymityInputError:
        return
    originals = table["x"].loc[result.table.index]
    wrong = [(str(o), label) for o, label in zip(originals, result.table["x"]) if label not in (str(o), "*")]
    assert wrong == [], f"released cells that do not cover their original value: {wrong}"


def test_mondrian_anonymises_or_refuses_integers_float64_cannot_separate():
    """Mondrian on a quasi-identifier holding 2**53 and 2**53 + 1 (distinct, equal as float64) anonymises or
    refuses the column with AnonymityError, never a ZeroDivisionError."""
    table = pd.DataFrame({"x": np.array([2**53, 2**53 + 1] * 2, dtype=np.int64)})
    try:
        anonymise(table, anonymity_spec_text("x", algorithm="mondrian"))
    except AnonymityError:
        pass


@pytest.mark.parametrize("algorithm", ["full_domain", "mondrian"])
def test_duplicate_column_names_are_refused_by_name(algorithm):
    """A table with two columns of the quasi-identifier's name (a SQL join selecting ``a.x, b.x``) is refused with
    an AnonymityInputError naming the repeated column, never a pandas TypeError."""
    table = pd.DataFrame([["a", "a"], ["a", "a"], ["b", "b"], ["b", "b"]], columns=["x", "x"])
    with pytest.raises(AnonymityInputError, match="'x'"):
        anonymise(table, anonymity_spec_text("x", algorithm=algorithm))
