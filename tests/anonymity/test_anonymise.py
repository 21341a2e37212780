"""anonymise(): the pure entry point of the anonymiser, end to end on small known-answer tables and on ARX's adult.

Known answers are computed here independently of the search: by hand for the small tables, and for ARX's adult by
reading the hierarchy CSV files with the csv module, generalising the original values, grouping with pandas and
recomputing the loss metric from its definition (Iyengar 2002).
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_operators.anonymity import AnonymityInputError, parse_anonymity_spec
from dp_operators.anonymity.anonymise import anonymise, generalise_to_node
from dp_operators.anonymity.generalisation import encode_quasi_identifiers
from dp_operators.anonymity.spec import load_anonymity_spec

from .anonymity_tables import ARX_DIR, ARX_QIS, outlier_table


def spec_of(text: str):
    return parse_anonymity_spec(text, source="test.yaml")


def report_strings(value) -> set[str]:
    """Every string in a JSON document: keys and values, recursively."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return {s for k, v in value.items() for s in {str(k)} | report_strings(v)}
    if isinstance(value, (list, tuple)):
        return {s for v in value for s in report_strings(v)}
    return set()


def assert_report_holds_no_cell(report: dict, *tables: pd.DataFrame, columns: list[str]) -> None:
    """No text cell of ``columns`` (input values or generalised labels) is a string of the report; the longer ones do
    not even occur inside its text. (Numbers are left out: class sizes are keys of the report's histograms.)"""
    cells = {str(v) for t in tables for c in columns for v in t[c].unique() if not str(v).isdigit()}
    text = json.dumps(report, allow_nan=False)
    assert not cells & report_strings(report)
    assert [c for c in cells if len(c) >= 5 and c in text] == []


# -- small tables with hand-computed answers ------------------------------------------------------------------------

# Ages 21..29 in two 5-year bands, four per band and two per sex in each; one 85-year-old man.
OUTLIER_TABLE = outlier_table()

SMALL_SPEC = """
version: 1
check: small
quasi_identifiers:
  - {{name: age, type: numeric, hierarchy: {{intervals: [5, 10]}}}}
  - sex
sensitive_attributes: [{{name: income, type: categorical}}]
targets: {targets}
suppression: {{max_fraction: {fraction}}}
anonymisation: {{algorithm: {algorithm}, metric: loss}}
"""


def small_spec(targets: str = "{k: 2}", fraction: float = 0.0, algorithm: str = "full_domain"):
    text = SMALL_SPEC.format(targets=targets, fraction=fraction, algorithm=algorithm)
    if algorithm == "mondrian":  # Mondrian refuses QI hierarchies (it builds its own intervals)
        text = text.replace(", hierarchy: {intervals: [5, 10]}", "")
    return spec_of(text)


def test_without_suppression_the_outlier_forces_age_to_the_top():
    """By hand: the 85-year-old is alone in every age band, so age must be * (node age 3, sex 0); the loss is
    9 rows x 1 (age cells) / 18 cells = 0.5; any node with sex * and age below * leaves him alone too."""
    result = anonymise(OUTLIER_TABLE, small_spec())
    assert result.passed
    section = result.report["anonymisation"]
    assert section["node"] == {"age": 3, "sex": 0}
    assert section["heights"] == {"age": 3, "sex": 1}
    assert section["lattice_size"] == 8
    assert section["information_loss"]["loss"] == pytest.approx(0.5)
    assert list(result.table["age"]) == ["*"] * 9
    assert list(result.table["sex"]) == list(OUTLIER_TABLE["sex"])
    assert result.report["suppression"]["suppressed_rows"] == 0
    assert result.report["class_size_histogram"]["released"] == {"4": 1, "5": 1}


def test_suppressing_the_outlier_keeps_five_year_bands():
    """By hand, with 1 row allowed (floor(0.12 * 9)): node (age 1, sex 0) puts two people in each (band, sex) cell
    and suppresses the 85-year-old. Loss: 8 kept rows x (4 - 1) / (9 - 1) for age, 2 suppressed cells cost 1:
    (8 * 0.375 + 2) / 18 = 5/18, below the 0.5 of the release without suppression."""
    result = anonymise(OUTLIER_TABLE, small_spec(fraction=0.12))
    assert result.passed
    assert result.report["anonymisation"]["node"] == {"age": 1, "sex": 0}
    assert result.report["anonymisation"]["information_loss"]["loss"] == pytest.approx(5 / 18)
    assert result.report["suppression"] | {"max_fraction": None} == {
        "max_fraction": None, "allowed_rows": 1, "suppressed_rows": 1, "suppressed_classes": 1,
        "suppressed_fraction": 1 / 9, "applied": True,
    }
    assert list(result.table.index) == list(range(8))  # the outlier (row 8) is withheld, the others keep their index
    assert list(result.table["age"]) == ["[20, 25)"] * 4 + ["[25, 30)"] * 4
    pd.testing.assert_frame_equal(result.table[["sex", "income"]], OUTLIER_TABLE.iloc[:8][["sex", "income"]])
    assert result.report["released"] == {"rows": 8, "equivalence_classes": 4, "k": 2}


def test_report_holds_counts_only():
    result = anonymise(OUTLIER_TABLE, small_spec("{k: 2, l: {kind: distinct, l: 2}}", fraction=0.12))
    assert result.passed
    assert_report_holds_no_cell(result.report, OUTLIER_TABLE, result.table, columns=["age", "sex", "income"])
    assert json.loads(json.dumps(result.report, allow_nan=False)) == result.report


def test_impossible_targets_release_nothing_and_report_the_top_node():
    """Income has two values, so no class can be 3-diverse, even the whole table at the top node."""
    result = anonymise(OUTLIER_TABLE, small_spec("{k: 2, l: {kind: distinct, l: 3}}", fraction=0.12))
    assert result.passed is False
    assert result.table.empty and list(result.table.columns) == list(OUTLIER_TABLE.columns)
    report = result.report
    assert report["passed"] is False
    section = report["anonymisation"]
    assert section["node"] is None
    assert section["evaluated_node"] == {"age": 3, "sex": 1}  # every QI at its top level
    assert section["information_loss"] is None
    assert "l:income" in section["reason"]
    # The top node is one class of 9 rows with 2 incomes: the report says so.
    assert report["equivalence_classes"] == 1 and report["k"] == 9
    assert report["failed_targets"] == ["l_distinct on income: 2 vs target 3 (1 failing class)"]
    assert [t["measure"] for t in report["targets"] if not t["passed"]] == ["l_distinct"]
    assert_report_holds_no_cell(report, OUTLIER_TABLE, columns=["age", "sex", "income"])


def test_a_table_level_target_missed_everywhere_is_reported():
    """The marketer risk of a release is at least classes / n >= 1/9 here (one class at the top node), above 0.05."""
    result = anonymise(OUTLIER_TABLE, small_spec("{k: 2, marketer_risk: 0.05}", fraction=0.12))
    assert result.passed is False and result.table.empty
    assert "table-level target(s) marketer" in result.report["anonymisation"]["reason"]
    assert result.report["risk"]["marketer"]["average"] == pytest.approx(1 / 9)
    assert [t["measure"] for t in result.report["targets"] if not t["passed"]] == ["marketer_risk"]


def test_mondrian_failure_releases_nothing():
    result = anonymise(OUTLIER_TABLE, small_spec("{k: 2, l: {kind: distinct, l: 3}}", algorithm="mondrian"))
    assert result.passed is False and result.table.empty
    section = result.report["anonymisation"]
    assert section["algorithm"] == "mondrian" and section["information_loss"] is None
    assert section["reason"] == (
        "the generalised table misses the targets: l_distinct on income: 2 vs target 3 (1 failing class)"
    )


def test_mondrian_algorithm_releases_a_k_anonymous_partition():
    table = pd.DataFrame({"age": list(range(20, 40)), "sex": ["M", "F"] * 10, "income": ["low", "high"] * 10})
    result = anonymise(table, small_spec("{k: 4}", algorithm="mondrian"))
    assert result.passed
    assert result.report["anonymisation"]["algorithm"] == "mondrian"
    assert result.report["anonymisation"]["metric"] is None
    assert len(result.table) == 20
    sizes = result.table.groupby(["age", "sex"]).size()
    assert sizes.min() >= 4 and sizes.sum() == 20
    assert result.report["released"]["k"] == int(sizes.min())
    assert result.report["equivalence_classes"] == len(sizes)
    for label, age in zip(result.table["age"], table["age"]):  # every generalised cell covers the original value
        low, high = (int(x) for x in label.strip("[]").split(", ")) if label.startswith("[") else (int(label),) * 2
        assert low <= age <= high


@pytest.mark.parametrize(
    ("table", "match"),
    [
        pytest.param(OUTLIER_TABLE.drop(columns="sex"), "unknown quasi-identifier column", id="unknown column"),
        pytest.param(OUTLIER_TABLE.iloc[:0], "empty", id="empty table"),
        pytest.param(OUTLIER_TABLE.assign(age=[None] + [30.0] * 8), "missing value", id="missing QI value"),
        pytest.param(OUTLIER_TABLE.iloc[:1], "larger than the table", id="k above the row count"),
        pytest.param(OUTLIER_TABLE.assign(age=["x"] + [30] * 8), "declared numeric but 1 of its 9 values", id="text in a numeric QI"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_no_cell(table, match):
    with pytest.raises(AnonymityInputError, match=match) as caught:
        anonymise(table, small_spec())
    assert "85" not in str(caught.value) and "'x'" not in str(caught.value)


BIG = 2**53  # beyond, not every integer is a float64


@pytest.mark.parametrize("algorithm", ["full_domain", "mondrian"])
@pytest.mark.parametrize(
    ("table", "match"),
    [
        pytest.param(
            OUTLIER_TABLE.assign(age=np.array([BIG, BIG + 1] * 4 + [BIG + 3], dtype=np.int64)),
            "'age' has 2 distinct value\\(s\\) that a 64-bit float cannot hold exactly",
            id="integers a float64 would merge",
        ),
        pytest.param(
            pd.concat([OUTLIER_TABLE, OUTLIER_TABLE[["sex"]]], axis=1),
            "\\['sex'\\] appear more than once",
            id="repeated column name",
        ),
    ],
)
def test_inputs_both_algorithms_refuse(table, match, algorithm):
    with pytest.raises(AnonymityInputError, match=match):
        anonymise(table, small_spec(algorithm=algorithm))


def test_large_integers_a_float64_holds_are_released_exactly():
    # Multiples of 2**11 near 2**62 are float64s: published level-0 cells are the exact integers (by hand: str(v)).
    ages = [2**62 + 2048 * i for i in (0, 0, 1, 1, 2, 2, 3, 3, 4)]
    table = OUTLIER_TABLE.assign(age=np.array(ages, dtype=np.int64), sex="M")
    spec = spec_of(
        "version: 1\ncheck: big\nquasi_identifiers: [age]\ntargets: {k: 2}\nsuppression: {max_fraction: 0.2}\n"
    )
    result = anonymise(table, spec)
    assert result.passed
    assert list(result.table["age"]) == [str(v) for v in ages[:8]]


def test_a_value_outside_the_hierarchy_is_refused():
    spec = spec_of(
        "version: 1\ncheck: c\nquasi_identifiers:\n"
        "  - {name: sex, hierarchy: {tree: {'*': {Person: [M, F]}}}}\ntargets: {k: 2}\n"
    )
    with pytest.raises(AnonymityInputError, match="sex"):
        anonymise(pd.DataFrame({"sex": ["M", "F", "X", "M"]}), spec)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 39), st.sampled_from("ab"), st.sampled_from("xyz")), min_size=3,
                  max_size=40),
    k=st.integers(1, 4),
    fraction=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_every_release_meets_k_keeps_rows_whole_and_covers_the_originals(rows, k, fraction):
    table = pd.DataFrame(rows, columns=["age", "sex", "income"])
    if k > len(table):
        return
    spec = small_spec(f"{{k: {k}}}", fraction=fraction)
    result = anonymise(table, spec)
    report = result.report
    if not result.passed:
        assert result.table.empty
        return
    released = result.table
    suppressed = report["suppression"]["suppressed_rows"]
    assert len(released) + suppressed == len(table)
    assert suppressed <= math.floor(fraction * len(table))
    assert released.index.is_unique and set(released.index) <= set(table.index)
    assert released.groupby(["age", "sex"]).size().min() >= k
    original = table.loc[released.index]
    pd.testing.assert_series_equal(released["income"], original["income"])
    for label, age in zip(released["age"], original["age"]):
        if label == "*":
            continue
        if label.startswith("["):
            low, high = (float(x) for x in label.strip("[)").split(", "))
            assert low <= age < high
        else:
            assert label == str(age)
    level = report["anonymisation"]["node"]["sex"]
    assert list(released["sex"]) == (list(original["sex"]) if level == 0 else ["*"] * len(released))


# -- ARX's adult example ---------------------------------------------------------------------------------------------


def read_arx_hierarchy(name: str) -> dict[str, list[str]]:
    """value -> its labels at levels 0..height, read with the csv module (independently of the loader)."""
    with (ARX_DIR / f"adult_hierarchy_{name}.csv").open(newline="", encoding="utf-8") as handle:
        return {row[0]: row for row in csv.reader(handle, delimiter=";") if row}


def write_arx_spec(folder: Path, fraction: float, extra: str = "") -> Path:
    """The spec in ``folder``, naming ARX's hierarchy files by paths relative to it (resolved against its folder)."""
    lines = ["version: 1", "check: arx_adult", "quasi_identifiers:"]
    for qi in ARX_QIS:
        relative = os.path.relpath(ARX_DIR / f"adult_hierarchy_{qi}.csv", folder)
        lines.append(f"  - {{name: {qi}, hierarchy: {{file: {json.dumps(relative)}}}}}")
    lines += ["targets: {k: 5}", f"suppression: {{max_fraction: {fraction}}}", extra]
    path = folder / f"arx_adult_{fraction}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fraction", [pytest.param(0.0, id="no suppression"), pytest.param(0.01, id="1% suppression")])
def test_arx_adult_release_is_checked_against_the_hierarchy_files(arx_adult, tmp_path, fraction):
    spec = load_anonymity_spec(write_arx_spec(tmp_path, fraction))
    result = anonymise(arx_adult, spec)
    assert result.passed
    report, released = result.report, result.table
    n = len(arx_adult)
    suppressed = report["suppression"]["suppressed_rows"]
    assert len(released) + suppressed == n == 30162
    assert suppressed <= math.floor(fraction * n)
    node = report["anonymisation"]["node"]
    assert set(node) == set(ARX_QIS)
    assert report["anonymisation"]["lattice_size"] == math.prod(h + 1 for h in report["anonymisation"]["heights"].values())
    assert 1 <= report["anonymisation"]["nodes_checked"] <= report["anonymisation"]["lattice_size"]

    # Every released cell is the original value's label at the chosen level, per the hierarchy file.
    original = arx_adult.loc[released.index]
    loss_cells = 0.0
    for qi in ARX_QIS:
        hierarchy = read_arx_hierarchy(qi)
        expected = [hierarchy[str(v)][node[qi]] for v in original[qi]]
        assert list(released[qi]) == expected, qi
        # Iyengar's loss from its definition: a label covering c of the column's d present values costs (c-1)/(d-1).
        present = {str(v) for v in arx_adult[qi].unique()}
        covered = pd.Series([hierarchy[v][node[qi]] for v in present]).value_counts()
        d = len(present)
        loss_cells += sum((covered[label] - 1) / (d - 1) for label in released[qi]) + suppressed
    assert report["anonymisation"]["information_loss"]["loss"] == pytest.approx(loss_cells / (n * len(ARX_QIS)))
    pd.testing.assert_series_equal(released["salary-class"], original["salary-class"])

    # k, classes and the histogram from an independent grouping of the release.
    sizes = released.groupby(ARX_QIS).size()
    assert sizes.min() >= 5
    assert report["released"] == {"rows": len(released), "equivalence_classes": len(sizes), "k": int(sizes.min())}
    histogram = sizes.value_counts().sort_index()
    assert report["class_size_histogram"]["released"] == {str(s): int(c) for s, c in histogram.items()}
    assert report["risk"]["prosecutor"]["highest"] == pytest.approx(1 / sizes.min())
    assert_report_holds_no_cell(report, arx_adult, released, columns=[*ARX_QIS, "salary-class"])


def test_arx_adult_loss_does_not_rise_with_the_allowance(arx_adult, tmp_path):
    losses = []
    for fraction in (0.0, 0.01, 0.05):
        result = anonymise(arx_adult, load_anonymity_spec(write_arx_spec(tmp_path, fraction)))
        losses.append(result.report["anonymisation"]["information_loss"]["loss"])
    assert losses == sorted(losses, reverse=True)
    assert losses[1] < losses[0]  # on adult the 1 % allowance buys a strictly better node


def test_arx_adult_with_l_diversity_on_salary(arx_adult, tmp_path):
    text = (write_arx_spec(tmp_path, 0.01).read_text()
            .replace("targets: {k: 5}", "targets: {k: 5, l: {kind: distinct, l: 2}}")
            + "sensitive_attributes: [{name: salary-class, type: categorical}]\n")
    path = tmp_path / "arx_l.yaml"
    path.write_text(text)
    result = anonymise(arx_adult, load_anonymity_spec(path))
    assert result.passed
    released = result.table
    per_class = released.groupby(ARX_QIS)["salary-class"].nunique()
    assert per_class.min() == 2
    assert result.report["sensitive_attributes"]["salary-class"]["distinct_l"] == 2


def test_generalise_to_node_checks_the_node(arx_adult):
    table = arx_adult.head(50)
    spec = spec_of(
        "version: 1\ncheck: c\nquasi_identifiers:\n"
        f"  - {{name: race, hierarchy: {{file: {ARX_DIR / 'adult_hierarchy_race.csv'}}}}}\ntargets: {{k: 1}}\n"
    )
    encoded = encode_quasi_identifiers(table, spec)
    assert set(generalise_to_node(table, encoded, [1])["race"]) == {"*"}
    pd.testing.assert_series_equal(
        generalise_to_node(table, encoded, [0])["race"], table["race"].astype(str), check_dtype=False
    )
    with pytest.raises(ValueError, match="outside"):
        generalise_to_node(table, encoded, [2])
    with pytest.raises(ValueError, match="levels for 1"):
        generalise_to_node(table, encoded, [0, 0])
    assert np.all(table.index == generalise_to_node(table, encoded, [0]).index)


def test_a_gate_that_disagrees_with_the_search_stops_the_release(monkeypatch):
    """The released rows must be the ones the search chose: a disagreement (a bug) raises instead of publishing,
    also under ``python -O`` (no assert). Control: the same run without the fault releases the table."""
    import sys

    module = sys.modules["dp_operators.anonymity.anonymise"]  # the package re-exports the function by that name
    assert anonymise(OUTLIER_TABLE, small_spec(fraction=0.2)).passed  # control
    real = module.evaluate_table

    def disagreeing(table, spec, criteria=None):
        report, kept = real(table, spec, criteria)
        return report, ~kept

    monkeypatch.setattr(module, "evaluate_table", disagreeing)
    with pytest.raises(RuntimeError, match="differ from the search"):
        anonymise(OUTLIER_TABLE, small_spec(fraction=0.2))
