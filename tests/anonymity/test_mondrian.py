"""Mondrian multidimensional generalisation (LeFevre, DeWitt, Ramakrishnan 2006)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from .anonymity_tables import ADULT_QIS

from dp_operators.anonymity import AnonymityInputError, equivalence_classes, k_anonymity, mondrian


def test_adult_reaches_k10_within_suppression_allowance(adult):
    result = mondrian(adult, ADULT_QIS, k=10, max_suppression=0.01)
    assert result.k >= 10
    assert k_anonymity(result.table, ADULT_QIS) >= 10  # measured independently on the released table
    assert result.suppressed_rows <= 0.01 * len(adult)
    assert len(result.table) + result.suppressed_rows == len(adult)
    loss = result.information_loss()
    assert 0 < loss["ncp"] < 1
    assert loss["discernibility"] >= len(result.table) * 10
    assert loss["average_class_size"] >= 1
    json.dumps(loss, allow_nan=False)


def test_partitions_are_equivalence_classes_and_generalise_the_original(adult):
    sample = adult.sample(3000, random_state=1)
    result = mondrian(sample, ADULT_QIS, k=5)
    assert equivalence_classes(result.table, ADULT_QIS).n_classes == result.equivalence_classes
    original = sample.loc[result.table.index]
    for label, age in zip(result.table["age"], original["age"]):
        match = re.fullmatch(r"\[(\d+), (\d+)\]", label)
        assert (int(match[1]) <= age <= int(match[2])) if match else int(label) == age
    for label, sex in zip(result.table["sex"], original["sex"]):
        assert label in (sex, "*") or (label.startswith("{") and sex in label)


def test_no_split_below_k_gives_one_class_of_stars():
    table = pd.DataFrame({"age": [30, 40, 50], "sex": ["F", "M", "F"]})
    result = mondrian(table, ["age", "sex"], k=2)
    assert result.equivalence_classes == 1
    assert list(result.table["age"]) == ["[30, 50]"] * 3
    assert list(result.table["sex"]) == ["*"] * 3
    assert result.ncp == pytest.approx(1.0)
    assert result.discernibility == 9


def test_k1_keeps_distinct_rows_apart():
    table = pd.DataFrame({"age": [30, 40, 50, 60]})
    result = mondrian(table, ["age"], k=1)
    assert result.equivalence_classes == 4
    assert result.ncp == 0.0


def test_rare_categorical_values_are_suppressed_within_budget():
    table = pd.DataFrame({"country": ["US"] * 8 + ["NL"], "age": list(range(20, 29))})
    without = mondrian(table, ["country", "age"], k=4)
    with_suppression = mondrian(table, ["country", "age"], k=4, max_suppression=0.2)
    assert without.suppressed_rows == 0
    assert with_suppression.suppressed_rows == 1
    assert set(with_suppression.table["country"]) == {"US"}
    assert mondrian(table, ["country", "age"], k=4, max_suppression=0.1).suppressed_rows == 0  # budget 0 rows


@pytest.mark.parametrize(
    ("table", "qis", "k", "error", "match"),
    [
        pytest.param(pd.DataFrame({"a": [1, 2]}), ["b"], 1, AnonymityInputError, "unknown", id="unknown column"),
        pytest.param(pd.DataFrame({"a": pd.Series([], dtype=int)}), ["a"], 1, AnonymityInputError, "empty",
                     id="empty table"),
        pytest.param(pd.DataFrame({"a": [1.0, None]}), ["a"], 1, AnonymityInputError, "missing", id="NaN in a QI"),
        pytest.param(pd.DataFrame({"a": [1, 2]}), ["a"], 3, AnonymityInputError, "larger than the table",
                     id="k larger than the table"),
        pytest.param(pd.DataFrame({"a": [1, 2]}), ["a"], 0, ValueError, "k must be >= 1", id="k zero"),
    ],
)
def test_bad_input(table, qis, k, error, match):
    with pytest.raises(error, match=match):
        mondrian(table, qis, k)
