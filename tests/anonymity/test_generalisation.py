"""Generalisation hierarchies for quasi-identifiers: ARX's files, trees, intervals, and the encoding contract.

Known answers come from outside the code under test: the ARX hierarchy files are re-read here with plain string
splitting, leaf counts and spans are recomputed by brute force over the column's values, and interval labels are
worked out by hand.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_operators.anonymity import (
    AnonymityInputError,
    AnonymitySpecError,
    GeneralisationHierarchy,
    encode_quasi_identifiers,
    parse_anonymity_spec,
)
from dp_operators.anonymity.anonymise import anonymise
from dp_operators.anonymity.errors import AnonymityError
from dp_operators.anonymity.generalisation import value_text

from .anonymity_tables import ARX_DIR, ARX_QIS, anonymity_spec, anonymity_spec_text
ARX_FILES = [*ARX_QIS, "salary-class"]
SECRET = "Zebediah-Quux"  # a value that must never appear in a message


def arx_file(name: str) -> Path:
    path = ARX_DIR / f"adult_hierarchy_{name}.csv"
    if not path.exists():
        pytest.skip(f"{path} is missing: the shared test data must sit beside the project (see PROVENANCE.md)")
    return path


def read_rows_by_hand(path: Path) -> dict[str, list[str]]:
    """The ARX file as {value: [label at level 0, 1, ...]}, read without the csv module or the code under test."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line]
    rows = [line.split(";") for line in lines]
    return {row[0]: row for row in rows}


def spec_for(quasi_identifiers: str, base_dir: Path | None = None):
    text = f"version: 1\ncheck: c\nquasi_identifiers: {quasi_identifiers}\ntargets: {{k: 2}}\n"
    return parse_anonymity_spec(text, "spec.yaml", base_dir=base_dir)


def brute_force_check(encoded, values: list[object], label_of, numeric: bool) -> None:
    """Compare an encoding with a recomputation from scratch: ``label_of(value, level)`` is the expected label.

    Checks every row's label at every level, that each level lists exactly the labels of present values, the leaf
    counts (distinct present values under each label) and the spans (Xu et al. 2006 NCP of each label)."""
    encoded.validate()
    assert encoded.rows == len(values)
    distinct = sorted(set(values), key=lambda v: (str(type(v)), v))
    assert encoded.domain_size == len(distinct)
    lo, hi = (min(values), max(values)) if numeric else (0, 0)
    for level in range(encoded.height + 1):
        labels = encoded.labels[level]
        codes = encoded.codes[level]
        assert codes.dtype == np.int32
        for row, value in enumerate(values):
            assert labels[codes[row]] == label_of(value, level), (level, row)
        under = {label: [v for v in distinct if label_of(v, level) == label] for label in labels}
        assert all(under.values()), f"level {level} lists a label no present value has"
        assert set(under) == {label_of(v, level) for v in distinct}
        for code, label in enumerate(labels):
            covered = under[label]
            assert encoded.leaf_counts[level][code] == len(covered)
            if numeric:
                expected = 0.0 if hi == lo else (max(covered) - min(covered)) / (hi - lo)
            else:
                expected = len(covered) / len(distinct) if len(covered) > 1 else 0.0
            assert encoded.spans[level][code] == pytest.approx(expected, abs=1e-12)


# -- ARX's adult hierarchies ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ARX_FILES)
def test_arx_hierarchy_files_load_with_their_heights_and_values(name):
    path = arx_file(name)
    by_hand = read_rows_by_hand(path)
    hierarchy = GeneralisationHierarchy.from_arx_csv(path)
    assert hierarchy.kind == "table"
    assert hierarchy.height == len(next(iter(by_hand.values()))) - 1
    assert list(hierarchy.values) == list(by_hand)
    for value, row in list(by_hand.items())[:: max(1, len(by_hand) // 7)]:
        assert [hierarchy.generalise(value, level) for level in range(hierarchy.height + 1)] == row


def test_arx_adult_quasi_identifiers_encode_as_the_files_say(arx_adult, tmp_path, monkeypatch):
    """ARX's adult table encodes as its hierarchy files say, and each distinct value is turned into text once (the
    encoding works on the column's distinct values, not row by row)."""
    from dp_operators.anonymity import generalisation

    for name in ARX_QIS:
        arx_file(name)
    entries = ", ".join(f"{{name: {q}, hierarchy: {{file: adult_hierarchy_{q}.csv}}}}" for q in ARX_QIS)
    spec = spec_for(f"[{entries}]", base_dir=ARX_DIR)
    texts = []
    real_value_text = generalisation.value_text
    monkeypatch.setattr(generalisation, "value_text", lambda value: texts.append(1) or real_value_text(value))
    encoded = encode_quasi_identifiers(arx_adult, spec)
    distinct = sum(arx_adult[name].nunique(dropna=False) for name in ARX_QIS)
    assert 0 < len(texts) <= distinct, f"{len(texts)} value texts for {distinct} distinct values"
    assert [e.name for e in encoded] == ARX_QIS
    sample = np.random.default_rng(13).choice(len(arx_adult), size=400, replace=False)
    for qi in encoded:
        by_hand = read_rows_by_hand(arx_file(qi.name))
        qi.validate()
        assert qi.height == len(next(iter(by_hand.values()))) - 1
        assert qi.numeric == (qi.name == "age")
        column = arx_adult[qi.name]
        for row in sample:
            value = str(column.iloc[row])
            assert [qi.labels[level][qi.codes[level][row]] for level in range(qi.height + 1)] == by_hand[value]
        # Leaf counts and spans for every label, from the file and the distinct values alone.
        present = sorted({str(v) for v in column})
        assert qi.domain_size == len(present)
        numbers = {v: float(v) for v in present} if qi.numeric else {}
        for level in range(qi.height + 1):
            for code, label in enumerate(qi.labels[level]):
                covered = [v for v in present if by_hand[v][level] == label]
                assert qi.leaf_counts[level][code] == len(covered)
                if qi.numeric:
                    values = [numbers[v] for v in covered]
                    span = (max(values) - min(values)) / (column.max() - column.min())
                else:
                    span = len(covered) / len(present) if len(covered) > 1 else 0.0
                assert qi.spans[level][code] == pytest.approx(span)
        # Level 0 partitions the rows exactly as the raw values do.
        assert pd.crosstab(qi.codes[0], column).astype(bool).sum(axis=1).eq(1).all()
        assert len(set(qi.codes[0].tolist())) == column.nunique()


def test_arx_age_hierarchy_known_answers(arx_adult):
    encoded = GeneralisationHierarchy.from_arx_csv(arx_file("age")).encode(arx_adult["age"], "numeric")
    # Ages 17..90 are present except 87 and 89 (72 values). ARX's file puts a band's upper end in the band labelled
    # below it (16..20 -> "15-19", 86..90 -> "85-89"), so the present ages fall in 15 five-year labels 15-19..85-89,
    # 8 ten-year labels 10-19..80-89 and 5 twenty-year labels 0-19..80-99.
    assert sorted(set(range(17, 91)) - set(arx_adult["age"])) == [87, 89]
    assert [len(labels) for labels in encoded.labels] == [72, 15, 8, 5, 1]
    assert encoded.labels[1][0] == "15-19" and encoded.leaf_counts[1][0] == 4  # 17, 18, 19, 20
    assert encoded.spans[1][0] == pytest.approx(3 / 73)
    assert encoded.labels[1][-1] == "85-89" and encoded.leaf_counts[1][-1] == 3  # 86, 88, 90
    assert encoded.spans[4].tolist() == [1.0]


# -- matching values to the hierarchy -------------------------------------------------------------------------------


def test_floats_match_integral_labels_and_domain_is_what_the_column_holds():
    hierarchy = GeneralisationHierarchy.from_rows([[39, "30-39", "*"], ["40", "40-49", "*"], ["39.5", "30-39", "*"],
                                                    ["41", "40-49", "*"], ["99", "90-99", "*"]])
    column = pd.Series([39.0, 40.0, 39.5, 40.0], name="age")
    encoded = hierarchy.encode(column, "numeric")
    assert encoded.labels[0] == ("39", "39.5", "40")
    assert encoded.labels[1] == ("30-39", "40-49")  # 90-99 holds no present value
    assert encoded.leaf_counts[1].tolist() == [2, 1]  # 41 and 99 are in the hierarchy, not in the column
    assert encoded.spans[1].tolist() == [0.5, 0.0]
    brute_force_check(encoded, column.tolist(), lambda v, level: hierarchy.generalise(v, level), numeric=True)
    # The same values as integers, and as a categorical integer column.
    assert hierarchy.encode(pd.Series([39, 40], name="age"), "categorical").labels[1] == ("30-39", "40-49")


def test_levels_that_merge_nothing_are_kept():
    hierarchy = GeneralisationHierarchy.from_rows([["a", "a", "A", "*"], ["b", "b", "A", "*"]])
    encoded = hierarchy.encode(pd.Series(["a", "b", "a"], name="q"), "categorical")
    assert encoded.height == 3
    assert encoded.codes[1].tolist() == encoded.codes[0].tolist()
    assert encoded.spans[2].tolist() == [1.0]


def test_uncovered_values_are_counted_not_quoted():
    hierarchy = GeneralisationHierarchy.from_rows([["a", "*"], ["b", "*"]], source="h.csv")
    column = pd.Series(["a", SECRET, "b", SECRET, "c"], name="town")
    with pytest.raises(AnonymityInputError) as caught:
        hierarchy.encode(column, "categorical")
    message = str(caught.value)
    assert "'town'" in message and "2 distinct value(s) in 3 row(s)" in message and "h.csv" in message
    assert SECRET not in message and "'c'" not in message


def test_numeric_values_are_matched_by_number_text_not_by_label_text():
    hierarchy = GeneralisationHierarchy.from_rows([["039", "*"]])
    with pytest.raises(AnonymityInputError, match="1 distinct value"):
        hierarchy.encode(pd.Series([39], name="age"), "numeric")
    # As text, "039" is its own value.
    assert hierarchy.encode(pd.Series(["039"], name="age"), "categorical").labels[0] == ("039",)


def test_object_column_keeps_true_apart_from_one():
    column = pd.Series([1, True, 1.0, "x"], dtype=object, name="q")
    encoded = GeneralisationHierarchy.flat().encode(column, "categorical")
    assert sorted(encoded.labels[0]) == ["1", "True", "x"]
    assert encoded.codes[0][0] == encoded.codes[0][2] != encoded.codes[0][1]


def test_flat_hierarchy_default():
    flat = GeneralisationHierarchy.flat()
    assert flat.height == 1
    encoded = flat.encode(pd.Series(["b", "a", "b"], name="q"), "categorical")
    brute_force_check(encoded, ["b", "a", "b"], lambda v, level: "*" if level else v, numeric=False)
    assert encoded.labels[0] == ("a", "b")
    numeric = flat.encode(pd.Series([3.0, 1.0, 2.5], name="x"), "numeric")
    assert numeric.labels[0] == ("1", "2.5", "3") and numeric.spans[1].tolist() == [1.0]
    single = flat.encode(pd.Series([7, 7], name="x"), "numeric")
    assert single.spans[1].tolist() == [0.0] and single.leaf_counts[1].tolist() == [1]
    assert flat.encode(pd.Series(["z"], name="q"), "categorical").spans[1].tolist() == [0.0]


# -- trees ----------------------------------------------------------------------------------------------------------

EDUCATION_TREE = {
    "*": {
        "Higher education": {"Undergraduate": ["Bachelors", "Some-college"], "Graduate": ["Masters", "Doctorate"]},
        "Secondary education": {"High School": ["HS-grad", "11th"]},
    }
}


def test_tree_hierarchy_levels_leaf_counts_and_spans():
    hierarchy = GeneralisationHierarchy.from_tree(EDUCATION_TREE)
    assert hierarchy.height == 3
    parent = {"Bachelors": "Undergraduate", "Some-college": "Undergraduate", "Masters": "Graduate",
              "Doctorate": "Graduate", "HS-grad": "High School", "11th": "High School"}
    grandparent = {"Undergraduate": "Higher education", "Graduate": "Higher education",
                   "High School": "Secondary education"}

    def label_of(value, level):
        return [value, parent[value], grandparent[parent[value]], "*"][level]

    values = ["Bachelors", "HS-grad", "Masters", "Bachelors", "11th", "Some-college"]
    encoded = hierarchy.encode(pd.Series(values, name="education"), "categorical")
    brute_force_check(encoded, values, label_of, numeric=False)
    assert encoded.labels[0] == ("Bachelors", "Some-college", "Masters", "HS-grad", "11th")  # the tree's order


def test_tree_without_a_single_root_gets_no_implicit_star():
    hierarchy = GeneralisationHierarchy.from_tree({"young": [17, 18], "old": [80.0, 81]})
    assert hierarchy.height == 1
    encoded = hierarchy.encode(pd.Series([17.0, 81, 18], name="age"), "numeric")
    assert encoded.labels[1] == ("young", "old") and encoded.spans[1].tolist() == [pytest.approx(1 / 64), 0.0]


@pytest.mark.parametrize(
    ("tree", "reason"),
    [
        pytest.param({"*": {"A": ["a", "b"], "B": {"C": ["c"]}}}, "values sit at different depths (2 value(s) at "
                     "depth 2, 1 value(s) at depth 3)", id="uneven depth"),
        pytest.param({"*": {"A": [SECRET], "B": [SECRET]}}, "value #2 (depth-first order): the value in column 1 is "
                     "listed again (first on value #1", id="value twice"),
        pytest.param({"*": {"A": {"X": ["a"]}, "B": {"X": ["b"]}}}, "value #2 (depth-first order): the level-1 label",
                     id="label with two parents"),
        pytest.param({"*": {"A": []}}, "a node at depth 2 has no values", id="empty list"),
        pytest.param({"*": {}}, "a node at depth 1 has no children", id="empty mapping"),
        pytest.param({"*": {"A": "a"}}, "a single value still needs a list", id="bare value"),
        pytest.param({"*": {"A": [["a"]]}}, "holds something other than values", id="nested list"),
        pytest.param({}, "expected a non-empty mapping", id="empty tree"),
        pytest.param(["a", "b"], "expected a non-empty mapping", id="bare list"),
    ],
)
def test_tree_errors(tree, reason):
    with pytest.raises(AnonymitySpecError) as caught:
        GeneralisationHierarchy.from_tree(tree)
    message = str(caught.value)
    assert message.startswith("tree: ") and reason in message, message
    assert SECRET not in message


# -- ARX CSV validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        pytest.param(f"a;A;*\n{SECRET};A;*\nc;B\n", 3, "2 columns, but line 1 has 3", id="short row"),
        pytest.param(f"a;A;*\n{SECRET};A;*;x\n", 2, "4 columns, but line 1 has 3", id="long row"),
        pytest.param(f"a;A;*\nb;;*\n{SECRET};B;*\n", 2, "column 2 (level 1) is empty", id="empty cell"),
        pytest.param(f"a;A;*\n{SECRET};A;*\nb; ;*\n", 3, "column 2 (level 1) is empty", id="blank cell"),
        pytest.param(f"{SECRET};A;*\nb;A;*\n{SECRET};B;*\n", 3, "listed again (first on line 1)", id="value twice"),
        pytest.param(f"a;A;*\n{SECRET};A;*\nc;B;*\nd;A;X\n", 4,
                     "level-1 label (column 2) generalises to a different level-2 label than on line 1",
                     id="inconsistent levels"),
        pytest.param(f"a;A;*\n\n\n{SECRET};A;*\nc;B\n", 5, "2 columns", id="blank lines keep line numbers"),
        pytest.param(f"{SECRET}\nb\n", 1, "only one column", id="one column"),
        pytest.param(f"{SECRET},A,*\nb,A,*\n", 1, "check the separator", id="wrong separator"),
        pytest.param(f'a;A;*\n"{SECRET}"x;A;*\n', 2, "malformed CSV", id="malformed quoting"),
    ],
)
def test_arx_csv_errors_name_file_line_and_reason(tmp_path, content, line, reason):
    path = tmp_path / "hierarchy.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(AnonymitySpecError) as caught:
        GeneralisationHierarchy.from_arx_csv(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: line {line}: "), message
    assert reason in message
    assert SECRET not in message


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        pytest.param(lambda p: p.write_text(""), "the hierarchy is empty", id="empty file"),
        pytest.param(lambda p: p.write_text("\n\n"), "the hierarchy is empty", id="blank lines only"),
        pytest.param(lambda p: None, "cannot read the hierarchy file", id="missing file"),
        pytest.param(lambda p: p.mkdir(), "cannot read the hierarchy file", id="a folder"),
        pytest.param(lambda p: p.write_bytes(b"a;\xff\xfe;*\n"), "not UTF-8", id="not UTF-8"),
    ],
)
def test_arx_csv_file_level_errors(tmp_path, setup, reason):
    path = tmp_path / "hierarchy.csv"
    setup(path)
    with pytest.raises(AnonymitySpecError) as caught:
        GeneralisationHierarchy.from_arx_csv(path)
    assert str(caught.value).startswith(f"{path}: ") and reason in str(caught.value)


def test_arx_csv_other_separator_and_byte_order_mark(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("\ufeffa,A,*\nb,A,*\n", encoding="utf-8")
    hierarchy = GeneralisationHierarchy.from_arx_csv(path, separator=",")
    assert hierarchy.values == ("a", "b") and hierarchy.height == 2
    with pytest.raises(AnonymitySpecError, match="one character"):
        GeneralisationHierarchy.from_arx_csv(path, separator=";;")


def test_from_rows_errors_use_row_numbers():
    with pytest.raises(AnonymitySpecError, match=r"^<rows>: line 2: column 3 \(level 2\) is empty"):
        GeneralisationHierarchy.from_rows([["a", "A", "*"], ["b", "A", None]])
    with pytest.raises(AnonymitySpecError, match=r"^<rows>: the hierarchy is empty"):
        GeneralisationHierarchy.from_rows([])


# -- intervals ------------------------------------------------------------------------------------------------------


def test_interval_labels_and_spans_by_hand():
    hierarchy = GeneralisationHierarchy.intervals([5, 10, 20])
    assert hierarchy.height == 4
    ages = [17, 20, 24, 25, 39, 90, 24]
    expected = {
        17: ["17", "[15, 20)", "[10, 20)", "[0, 20)", "*"],
        20: ["20", "[20, 25)", "[20, 30)", "[20, 40)", "*"],
        24: ["24", "[20, 25)", "[20, 30)", "[20, 40)", "*"],
        25: ["25", "[25, 30)", "[20, 30)", "[20, 40)", "*"],
        39: ["39", "[35, 40)", "[30, 40)", "[20, 40)", "*"],
        90: ["90", "[90, 95)", "[90, 100)", "[80, 100)", "*"],
    }
    encoded = hierarchy.encode(pd.Series(ages, name="age"), "numeric")
    brute_force_check(encoded, ages, lambda v, level: expected[v][level], numeric=True)
    assert encoded.labels[3] == ("[0, 20)", "[20, 40)", "[80, 100)")
    assert encoded.spans[3].tolist() == [0.0, pytest.approx(19 / 73), 0.0]
    assert encoded.spans[1][encoded.labels[1].index("[20, 25)")] == pytest.approx(4 / 73)


def test_interval_negative_float_and_origin_by_hand():
    hierarchy = GeneralisationHierarchy.intervals([2.5, 5])
    values = [-7.5, -2.5, -0.1, 0.0, 2.5]
    expected = {
        -7.5: ["-7.5", "[-7.5, -5)", "[-10, -5)", "*"],
        -2.5: ["-2.5", "[-2.5, 0)", "[-5, 0)", "*"],
        -0.1: ["-0.1", "[-2.5, 0)", "[-5, 0)", "*"],
        0.0: ["0", "[0, 2.5)", "[0, 5)", "*"],
        2.5: ["2.5", "[2.5, 5)", "[0, 5)", "*"],
    }
    encoded = hierarchy.encode(pd.Series(values, name="x"), "numeric")
    brute_force_check(encoded, values, lambda v, level: expected[v][level], numeric=True)
    shifted = GeneralisationHierarchy.intervals([10], origin=1)
    labels = [shifted.generalise(v, 1) for v in (0, 1, 10.99, 11)]
    assert labels == ["[-9, 1)", "[1, 11)", "[1, 11)", "[11, 21)"]


def test_interval_boundaries_follow_decimal_not_float_rounding():
    hierarchy = GeneralisationHierarchy.intervals([0.1, 0.3])
    assert [hierarchy.generalise(0.3, level) for level in (1, 2)] == ["[0.3, 0.4)", "[0.3, 0.6)"]
    assert [hierarchy.generalise(0.6, level) for level in (1, 2)] == ["[0.6, 0.7)", "[0.6, 0.9)"]
    assert [hierarchy.generalise(0.29999999999, level) for level in (1, 2)] == ["[0.2, 0.3)", "[0, 0.3)"]


def _bounds(label: str) -> tuple[Fraction, Fraction]:
    low, high = re.fullmatch(r"\[(\S+), (\S+)\)", label).groups()
    return Fraction(low), Fraction(high)


@settings(max_examples=60, deadline=None)
@given(
    finest=st.sampled_from([0.5, 1, 2.5, 3, 5]),
    multiples=st.lists(st.integers(2, 4), min_size=0, max_size=3),
    origin=st.integers(-20, 20),
    values=st.lists(st.integers(-4000, 4000).map(lambda v: v / 4), min_size=1, max_size=40),
)
def test_interval_bands_nest_and_cover_their_values(finest, multiples, origin, values):
    widths = [finest]
    for multiple in multiples:
        widths.append(widths[-1] * multiple)
    hierarchy = GeneralisationHierarchy.intervals(widths, origin=origin)
    encoded = hierarchy.encode(pd.Series(values, name="x"), "numeric")
    encoded.validate()  # nesting: each band maps to one band of the next level
    for level, width in enumerate(widths, start=1):
        for row, value in enumerate(values):
            low, high = _bounds(encoded.labels[level][encoded.codes[level][row]])
            assert high - low == Fraction(width)
            assert low <= Fraction(value) < high
            assert (low - origin) % Fraction(width) == 0  # aligned at the origin
    assert encoded.labels[-1] == ("*",)


def _decimal(text: str) -> Fraction:
    return Fraction(text)


@settings(max_examples=80, deadline=None)
@given(
    width_digits=st.integers(1, 99),
    width_exponent=st.integers(-20, 20),
    multiples=st.lists(st.integers(2, 5), min_size=0, max_size=2),
    origin_digits=st.integers(-999, 999),
    origin_exponent=st.integers(-20, 20),
    offsets=st.lists(st.tuples(st.integers(-30, 30), st.sampled_from(["0", "0.5", "0.999", "1e-9", "-1e-9"])),
                     min_size=1, max_size=20),
)
def test_interval_labels_are_exact_distinct_and_cover_the_printed_values(
    width_digits, width_exponent, multiples, origin_digits, origin_exponent, offsets
):
    """Any finite widths and origin: each label's edges are the exact decimals origin + j * width (from the texts the
    spec gives), every value's printed text (level 0) lies in its label, and different bands never share a label."""
    width_text, origin_text = f"{width_digits}e{width_exponent}", f"{origin_digits}e{origin_exponent}"
    widths = [float(width_text)]
    for multiple in multiples:
        widths.append(widths[-1] * multiple)
    factors = [1]
    for multiple in multiples:
        factors.append(factors[-1] * multiple)
    # A number's decimal is its printed text (an integral float prints exactly: 9.5e21 is 9499999999999999475712).
    origin, width = _decimal(value_text(float(origin_text))), _decimal(value_text(float(width_text)))
    # Values on, just off and between band edges, as decimals first (the edges themselves included).
    values = [float(str(Decimal(origin_text) + Decimal(band) * Decimal(width_text)
                        + Decimal(fraction) * Decimal(width_text))) for band, fraction in offsets]
    hierarchy = GeneralisationHierarchy.intervals(widths, origin=float(origin_text))
    encoded = hierarchy.encode(pd.Series(values, name="x"), "numeric")
    encoded.validate()
    for level, factor in enumerate(factors, start=1):
        band_width = width * factor
        labels = encoded.labels[level]
        assert len(set(labels)) == len(labels)
        for row in range(len(values)):
            printed = _decimal(encoded.labels[0][encoded.codes[0][row]])
            low, high = _bounds(labels[encoded.codes[level][row]])
            band = math.floor((printed - origin) / band_width)
            assert (low, high) == (origin + band * band_width, origin + (band + 1) * band_width), (level, row)
            assert low <= printed < high


def test_fine_bands_far_from_the_origin_keep_exact_labels():
    hierarchy = GeneralisationHierarchy.intervals([1e-13], origin=1e6)
    # 1e6 + 1.2e-10 prints as 1000000.0000000001 (its shortest round-trip text): the band starting there.
    assert repr(1e6 + 1.2e-10) == "1000000.0000000001"
    labels = [hierarchy.generalise(v, 1) for v in (1e6, 1e6 + 1.2e-10)]
    assert labels == ["[1000000, 1000000.0000000000001)", "[1000000.0000000001, 1000000.0000000001001)"]


@pytest.mark.parametrize(
    ("widths", "origin", "reason"),
    [
        pytest.param([], 0, "non-empty list", id="no widths"),
        pytest.param("5", 0, "non-empty list", id="text"),
        pytest.param([0], 0, "positive finite", id="zero"),
        pytest.param([-5], 0, "positive finite", id="negative"),
        pytest.param([math.nan], 0, "positive finite", id="NaN"),
        pytest.param([5, math.inf], 0, "positive finite", id="infinite"),
        pytest.param([True], 0, "must be a number", id="boolean"),
        pytest.param([5, 5], 0, "whole multiple", id="not increasing"),
        pytest.param([10, 5], 0, "whole multiple", id="decreasing"),
        pytest.param([5, 12], 0, "whole multiple", id="not nested"),
        pytest.param([5], math.nan, "origin: must be a finite number", id="NaN origin"),
        pytest.param([5], True, "origin: must be a finite number", id="boolean origin"),
    ],
)
def test_interval_width_errors(widths, origin, reason):
    with pytest.raises(AnonymitySpecError, match=re.escape(reason)):
        GeneralisationHierarchy.intervals(widths, origin=origin)


def test_interval_widths_beyond_2_52_finest_bands_are_refused():
    GeneralisationHierarchy.intervals([5, 5 * 2**52])  # the bound itself is accepted
    with pytest.raises(AnonymitySpecError, match=r"interval width 1: 1e\+300 is more than 2\*\*52 times the finest"):
        GeneralisationHierarchy.intervals([5, 1e300])
    with pytest.raises(AnonymitySpecError, match="interval width 2: .* more than 2\\*\\*52 times the finest width 1"):
        GeneralisationHierarchy.intervals([1, 2**30, 2**60])


def test_a_huge_interval_width_in_a_spec_is_refused_not_overflowed():
    """``intervals: [5, 1e300]`` written in a spec is refused at load (AnonymitySpecError) or at run time
    (AnonymityInputError), never an OverflowError while grouping the bands."""
    table = pd.DataFrame({"x": [1, 2, 3, 4]})
    with pytest.raises((AnonymitySpecError, AnonymityInputError)):
        anonymise(table, anonymity_spec_text("{name: x, hierarchy: {intervals: [5, 1e300]}}"))


def test_fine_interval_bands_get_distinct_labels_that_cover_their_values():
    """Bands narrower than 1e-12 ([0, 1e-13) and [1e-13, 2e-13)) get distinct labels, each covering its values
    (docs/anonymity.md: intervals are labelled like [20, 25); every generalised cell covers the original value)."""
    hierarchy = GeneralisationHierarchy.intervals([1e-13, 1e-12], 0)
    column = pd.Series([0.0, 1.5e-13], name="x")
    encoded = hierarchy.encode(column, "numeric")
    labels = [encoded.labels[1][code] for code in encoded.codes[1]]
    assert len(set(encoded.codes[1].tolist())) == 2  # two bands
    assert labels[0] != labels[1], f"two different bands are both published as {labels[0]!r}"


def test_fine_interval_bands_are_anonymised_as_published_or_refused():
    """With bands narrower than 1e-12 and k = 2 under a 1-row allowance, ``anonymise`` either refuses the hierarchy
    (AnonymityError) or releases classes that are k-anonymous as published: the gate, which groups the published
    text, never sees other classes than the search kept apart (no internal consistency failure)."""
    table = pd.DataFrame({"x": [0.0, 0.5e-13, 1e-13, 1.5e-13, 2.5e-13]})
    spec = anonymity_spec([{"name": "x", "hierarchy": {"intervals": [1e-13, 1e-12]}}], {"k": 2}, max_fraction=0.2)
    try:
        result = anonymise(table, spec)
    except AnonymityError:
        return  # refusing the hierarchy is an acceptable outcome
    except (AssertionError, RuntimeError) as exc:
        pytest.fail(f"anonymise failed on its internal consistency check: {exc}")
    sizes = result.table.groupby("x").size()
    assert result.passed and sizes.min() >= 2


def test_encode_never_lets_an_overflow_escape():
    # Built directly, bypassing the constructor's bound: encode refuses it instead of raising OverflowError.
    unchecked = GeneralisationHierarchy(kind="intervals", height=3, widths=(5.0, 1e300))
    with pytest.raises(AnonymityInputError, match="'x': its interval hierarchy"):
        unchecked.encode(pd.Series([1, 2, 3], name="x"), "numeric")


def test_interval_bands_contain_large_exact_integers():
    # Integers above 2**53 that a float64 holds (multiples of 256 near 2**60): each label is checked against the
    # exact value with Python integers, not floats; 2**60 + 1 is refused rather than published as 2**60.
    values = [2**60 + 256 * i for i in range(40)] + [-(2**60) - 256 * i for i in range(40)]
    hierarchy = GeneralisationHierarchy.intervals([1000, 3000])
    encoded = hierarchy.encode(pd.Series(np.array(values, dtype=np.int64), name="x"), "numeric")
    for level in (1, 2):
        for value, code in zip(values, encoded.codes[level].tolist()):
            low, high = (int(edge) for edge in encoded.labels[level][code][1:-1].split(", "))
            assert low <= value < high and high - low == (1000 if level == 1 else 3000)
            assert low % (high - low) == 0
    assert [encoded.labels[0][c] for c in encoded.codes[0]] == [str(v) for v in values]
    with pytest.raises(AnonymityInputError, match="cannot hold exactly"):
        hierarchy.encode(pd.Series(np.array([2**60, 2**60 + 1], dtype=np.int64), name="x"), "numeric")


def test_value_text_keeps_numbers_a_float_would_change():
    assert value_text(Fraction(1, 2)) == "0.5"
    assert value_text(Fraction(1, 3)) == "1/3"  # not 0.3333333333333333, which two Fractions could share
    assert value_text(Decimal("0.10000000000000000001")) == "0.10000000000000000001"
    assert value_text(2**53 + 1) == "9007199254740993"
    assert value_text(np.uint64(2**64 - 1)) == "18446744073709551615"


def test_intervals_refuse_non_numeric_columns():
    hierarchy = GeneralisationHierarchy.intervals([5])
    with pytest.raises(AnonymityInputError, match="'town' has an interval hierarchy but is categorical"):
        hierarchy.encode(pd.Series(["a", "b"], name="town"), "categorical")
    with pytest.raises(AnonymityInputError, match="'town' is not numeric"):
        hierarchy.encode(pd.Series(["a", "b"], name="town"), "numeric")
    with pytest.raises(AnonymityInputError, match="1 infinite value"):
        hierarchy.encode(pd.Series([1.0, math.inf], name="x"), "numeric")


# -- encode_quasi_identifiers: the spec's QIs, their kinds and hierarchies --------------------------------------------


def test_encode_quasi_identifiers_follows_the_spec(tmp_path):
    (tmp_path / "town.csv").write_text("north;N;*\nsouth;S;*\neast;E;*\n")
    spec = spec_for("[sex, {name: age, hierarchy: {intervals: [10]}}, {name: town, hierarchy: {file: town.csv}}]",
                    base_dir=tmp_path)
    table = pd.DataFrame({"town": ["north", "south"], "age": [31, 45], "sex": ["F", "M"]})
    encoded = encode_quasi_identifiers(table, spec)
    assert [e.name for e in encoded] == ["sex", "age", "town"]
    assert [e.height for e in encoded] == [1, 2, 2]
    assert encoded[1].labels[1] == ("[30, 40)", "[40, 50)") and encoded[1].numeric
    assert encoded[2].labels[1] == ("N", "S") and not encoded[2].numeric
    assert encoded[0].labels == (("F", "M"), ("*",))


def test_declared_type_overrides_inference():
    spec = spec_for("[{name: zip, type: numeric, hierarchy: {intervals: [100]}}, {name: code, type: categorical}]")
    table = pd.DataFrame({"zip": ["4767", "4790"], "code": [3, 5]})
    zip_code, code = encode_quasi_identifiers(table, spec)
    assert zip_code.numeric and zip_code.labels[1] == ("[4700, 4800)",)
    assert not code.numeric and code.spans[1].tolist() == [1.0]


@pytest.mark.parametrize(
    ("quasi_identifiers", "column", "reason"),
    [
        pytest.param("[{name: q, type: numeric}]", [True, False], "is boolean and cannot be numeric", id="boolean"),
        pytest.param("[q]", pd.Series([1, 2, SECRET], dtype=object), "mixes numbers (2 values) with text",
                     id="stray text"),
        pytest.param("[q]", [1.0, math.inf], "1 infinite value", id="infinite"),
        pytest.param("[{name: q, hierarchy: {intervals: [5]}}]", ["a", SECRET], "declare it type: numeric",
                     id="intervals on text"),
        pytest.param("[{name: q, hierarchy: {tree: {'*': [a]}}}]", ["a", SECRET], "1 distinct value(s) in 1 row(s)",
                     id="uncovered"),
        pytest.param("[q]", [1.0, None], "1 missing value", id="missing value"),
        pytest.param("[r]", [1, 2], "unknown quasi-identifier column", id="unknown column"),
    ],
)
def test_encode_quasi_identifiers_refuses_bad_columns(quasi_identifiers, column, reason):
    table = pd.DataFrame({"q": column})
    with pytest.raises(AnonymityInputError) as caught:
        encode_quasi_identifiers(table, spec_for(quasi_identifiers))
    assert reason in str(caught.value) and SECRET not in str(caught.value)


def test_boolean_column_is_categorical():
    (encoded,) = encode_quasi_identifiers(pd.DataFrame({"q": [True, False, True]}), spec_for("[q]"))
    assert not encoded.numeric and encoded.labels[0] == ("False", "True") and encoded.spans[1].tolist() == [1.0]


def test_empty_table_is_refused():
    with pytest.raises(AnonymityInputError, match="empty"):
        encode_quasi_identifiers(pd.DataFrame({"q": []}), spec_for("[q]"))
