"""Information-loss metrics of full-domain generalisation (dp_operators.anonymity.loss), against answers by hand."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_operators.anonymity.encoding import EncodedQuasiIdentifier
from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.loss import METRICS, information_loss, separable_lower_bounds


def encode(name: str, values: list, levels: list[dict], numeric: bool = False) -> EncodedQuasiIdentifier:
    """Encode a column from explicit level mappings (``levels[i]``: original value -> label at level ``i + 1``),
    computing leaf counts and spans from their definitions (independent of the hierarchy module)."""
    column = pd.Series(values)
    domain = sorted(column.unique().tolist())
    position = {v: i for i, v in enumerate(domain)}
    codes0 = np.array([position[v] for v in values], dtype=np.int32)
    codes, labels, leaf_counts, spans = [codes0], [tuple(str(v) for v in domain)], [np.ones(len(domain), np.int64)], [
        np.zeros(len(domain))
    ]
    value_range = (max(domain) - min(domain)) if numeric else 0
    for mapping in levels:
        level_labels = list(dict.fromkeys(mapping[v] for v in domain))
        index = {label: i for i, label in enumerate(level_labels)}
        codes.append(np.array([index[mapping[v]] for v in values], dtype=np.int32))
        labels.append(tuple(level_labels))
        covered = [[v for v in domain if mapping[v] == label] for label in level_labels]
        leaf_counts.append(np.array([len(c) for c in covered], dtype=np.int64))
        if numeric:
            spans.append(np.array([(max(c) - min(c)) / value_range if value_range else 0.0 for c in covered]))
        else:
            spans.append(np.array([len(c) / len(domain) if len(c) > 1 else 0.0 for c in covered]))
    encoded = EncodedQuasiIdentifier(name, numeric, tuple(codes), tuple(labels), tuple(leaf_counts), tuple(spans),
                                     len(domain))
    encoded.validate()
    return encoded


def letters() -> EncodedQuasiIdentifier:
    """Four rows a, a, b, c; level 1 merges a and b; level 2 is ``*``."""
    return encode("x", ["a", "a", "b", "c"], [{"a": "ab", "b": "ab", "c": "c"}, dict.fromkeys("abc", "*")])


def test_known_values_at_level_one():
    result = information_loss([letters()], [1])
    assert result["loss"] == pytest.approx((0.5 + 0.5 + 0.5 + 0) / 4)  # "ab" covers 2 of 3 values: (2-1)/(3-1)
    assert result["ncp"] == pytest.approx((3 * 2 / 3) / 4)  # 2 of 3 values -> 2/3, a single value -> 0
    assert result["discernibility"] == 3**2 + 1**2
    # count("ab") = 3: a -> log2(3/2) twice, b -> log2(3/1); c stays c: log2(1/1) = 0
    assert result["entropy"] == pytest.approx(2 * math.log2(3 / 2) + math.log2(3))
    assert result["suppressed_rows"] == 0 and result["equivalence_classes"] == 2


def test_suppressed_row_costs_the_top_of_each_column():
    kept = np.array([True, True, True, False])  # c suppressed
    result = information_loss([letters()], [1], kept)
    assert result["loss"] == pytest.approx((1.5 + 1) / 4)
    assert result["ncp"] == pytest.approx((2 + 1) / 4)
    assert result["discernibility"] == 3**2 + 1 * 4  # the suppressed row costs n
    assert result["entropy"] == pytest.approx(2 * math.log2(3 / 2) + math.log2(3) + math.log2(4 / 1))
    assert result["suppressed_rows"] == 1 and result["equivalence_classes"] == 1


def test_numeric_spans_are_ranges_over_the_column_range():
    age = encode("age", [1, 2, 4, 10], [{1: "low", 2: "low", 4: "low", 10: "high"}, dict.fromkeys([1, 2, 4, 10], "*")],
                 numeric=True)
    result = information_loss([age], [1])
    assert result["ncp"] == pytest.approx((3 * (4 - 1) / (10 - 1)) / 4)
    assert result["loss"] == pytest.approx((3 * (3 - 1) / (4 - 1)) / 4)  # "low" covers 3 of 4 values


@pytest.mark.parametrize(
    "kept", [pytest.param(None, id="top node, nothing suppressed"), pytest.param("none", id="every row suppressed")]
)
def test_worst_release_normalises_to_one(kept):
    columns = [letters(), encode("y", [1, 1, 2, 2], [{1: "*", 2: "*"}])]
    mask = None if kept is None else np.zeros(4, dtype=bool)
    result = information_loss(columns, [2, 1], mask)
    assert result["normalised"] == pytest.approx({"loss": 1.0, "ncp": 1.0, "discernibility": 1.0, "entropy": 1.0})
    json.dumps(result, allow_nan=False)


def test_original_table_costs_nothing():
    result = information_loss([letters()], [0])
    assert result["loss"] == result["ncp"] == result["entropy"] == 0
    assert result["discernibility"] == 1 + 1 + 4  # classes {a, a}, {b}, {c}
    assert result["normalised"]["discernibility"] == pytest.approx((6 - 4) / (16 - 4))


@st.composite
def tables(draw):
    n = draw(st.integers(1, 25))
    columns = []
    for j in range(draw(st.integers(1, 3))):
        values = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
        levels, current = [], {v: v for v in range(6)}
        for _ in range(draw(st.integers(1, 3))):
            merge = draw(st.integers(1, 3))
            current = {v: current[v] // (merge + 1) for v in range(6)}
            levels.append({v: f"g{len(levels)}_{current[v]}" for v in range(6)})
        columns.append(encode(f"c{j}", values, levels, numeric=draw(st.booleans())))
    return columns


@settings(max_examples=30, deadline=None)
@given(tables(), st.data())
def test_lower_bounds_are_the_unsuppressed_value_and_bound_any_suppression(columns, data):
    bounds = {m: separable_lower_bounds(columns, m) for m in ("loss", "ncp", "entropy")}
    for terms in bounds.values():
        assert all(np.all(np.diff(t) >= 0) for t in terms)  # monotone in the level
    for node in itertools.product(*[range(e.height + 1) for e in columns]):
        # Suppress whole equivalence classes, as the search does (a partial class could lower discernibility).
        classes = pd.DataFrame({e.name: e.codes[level] for e, level in zip(columns, node)}).groupby(
            [e.name for e in columns]).ngroup().to_numpy()
        count = int(classes.max()) + 1
        released = data.draw(st.lists(st.booleans(), min_size=count, max_size=count))
        kept = np.array(released, dtype=bool)[classes]
        plain = information_loss(columns, node)
        suppressed = information_loss(columns, node, kept)
        top = information_loss(columns, [e.height for e in columns])
        for metric, terms in bounds.items():
            bound = sum(t[level] for t, level in zip(terms, node))
            assert plain[metric] == pytest.approx(bound, abs=1e-9)
            assert suppressed[metric] >= bound - 1e-9
            assert top[metric] >= bound - 1e-9  # the lower bound never decreases up the lattice
        for metric in METRICS:
            assert 0 <= suppressed["normalised"][metric] <= 1 + 1e-12
        assert suppressed["discernibility"] >= plain["discernibility"]


def test_bad_arguments_are_refused():
    with pytest.raises(AnonymityInputError, match="unknown information-loss metric"):
        separable_lower_bounds([letters()], "precision")
    with pytest.raises(AnonymityInputError, match="not separable"):
        separable_lower_bounds([letters()], "discernibility")
    with pytest.raises(AnonymityInputError, match="2 levels for 1 quasi-identifiers"):
        information_loss([letters()], [1, 0])
    with pytest.raises(AnonymityInputError, match=r"level 3 of quasi-identifier 'x' is outside \[0, 2\]"):
        information_loss([letters()], [3])
    with pytest.raises(AnonymityInputError, match=r"boolean mask of shape \(4,\)"):
        information_loss([letters()], [1], np.ones(3, dtype=bool))
    with pytest.raises(AnonymityInputError, match="no quasi-identifier"):
        information_loss([], [])
