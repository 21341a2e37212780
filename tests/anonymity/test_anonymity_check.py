"""``check_table`` / ``evaluate_table``: targets, suppression of classes failing any class-level target, risk, and the
JSON report (counts only, no row contents)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_operators.anonymity import AnonymityInputError, AnonymitySpec, check_table, equivalence_classes
from dp_operators.anonymity.check import evaluate_table
from dp_operators.anonymity.criteria import Criteria

from .anonymity_tables import DISEASE_HIERARCHY, HOSPITAL_QIS


def make_spec(**overrides) -> AnonymitySpec:
    document = {
        "version": 1,
        "check": "test",
        "quasi_identifiers": ["zip", "age"],
        "sensitive_attributes": [
            {"name": "salary", "type": "ordered"},
            {"name": "disease", "type": "categorical", "hierarchy": DISEASE_HIERARCHY},
        ],
        "targets": {"k": 3, "l": {"kind": "distinct", "l": 3}, "t": 0.3},
    }
    document.update(overrides)
    return AnonymitySpec.model_validate(document)


def test_li_table4_passes_k3_l3_t03(li_patients):
    report = check_table(li_patients, make_spec())
    assert report["passed"] is True
    assert report["k"] == 3
    assert report["sensitive_attributes"]["salary"]["t"] == pytest.approx(1 / 6)
    assert report["sensitive_attributes"]["disease"]["t"] == pytest.approx(8 / 27)
    assert report["sensitive_attributes"]["disease"]["distance"] == "hierarchical"
    assert [t["measure"] for t in report["targets"]] == ["k", "l_distinct", "t", "l_distinct", "t"]


def test_report_is_json_and_holds_no_row_contents(li_patients):
    report = check_table(li_patients, make_spec(targets={"k": 4, "t": 0.1}))
    text = json.dumps(report, allow_nan=False)
    for value in ("4767*", "<=40", "gastritis", "flu"):
        assert value not in text
    assert json.loads(text) == report


def test_failing_targets_are_counted(li_patients):
    report = check_table(li_patients, make_spec(targets={"k": 4, "l": {"kind": "entropy", "l": 3.5}, "t": 0.1}))
    assert report["passed"] is False
    k_target = report["targets"][0]
    assert k_target == {"measure": "k", "target": 4, "value": 3, "passed": False, "failing_classes": 3}
    assert report["violating_classes"] == {"target_k": 4, "classes": 3, "rows": 9, "size_counts": {"3": 3}}
    t_salary = next(t for t in report["targets"] if t["measure"] == "t" and t["attribute"] == "salary")
    assert t_salary["failing_classes"] == 2  # the classes at 1/6 (the third is at 1/12)
    assert report["failed_targets"][0] == "k: 3 vs target 4 (3 failing classes)"
    assert "t on salary: 0.1667 vs target 0.1 (2 failing classes)" in report["failed_targets"]
    assert len(report["failed_targets"]) == sum(not t["passed"] for t in report["targets"]) == 5


def test_entropy_target_exactly_met_passes(li_patients):
    # Every class has entropy ln 3 exactly; float round-off must not fail l = 3.
    report = check_table(li_patients, make_spec(targets={"l": {"kind": "entropy", "l": 3}}))
    assert report["passed"] is True
    assert report["sensitive_attributes"]["disease"]["entropy_l"] == pytest.approx(3)


def test_entropy_l_of_three_equally_common_values_is_reported_as_exactly_three():
    """The report's entropy_l is exactly 3.0 for three equally common values, and the target l = 3 is met."""
    table = pd.DataFrame({"zip": ["4767*"] * 6, "age": ["<=40"] * 6, "disease": ["flu", "gastritis", "cancer"] * 2})
    spec = make_spec(
        sensitive_attributes=[{"name": "disease", "type": "categorical"}],
        targets={"l": {"kind": "entropy", "l": 3}},
    )
    report = check_table(table, spec)
    assert report["sensitive_attributes"]["disease"]["entropy_l"] == 3.0
    assert report["passed"] is True


def test_entropy_l_in_the_report_is_over_the_released_classes_only():
    """After suppression the report's entropy_l is the least diverse released class's, exact."""
    # Class 1 holds three equally common diseases (exp(H) = 3); class 2 a single one, so it fails l = 2 and,
    # a third of the table, is suppressed under a one-half allowance.
    table = pd.DataFrame(
        {
            "zip": ["1"] * 6 + ["2"] * 3,
            "age": ["a"] * 9,
            "disease": ["flu", "gastritis", "cancer"] * 2 + ["flu"] * 3,
        }
    )
    spec = make_spec(
        sensitive_attributes=[{"name": "disease", "type": "categorical"}],
        targets={"l": {"kind": "entropy", "l": 2}},
        suppression={"max_fraction": 0.5},
    )
    report = check_table(table, spec)
    assert report["suppression"]["suppressed_rows"] == 3
    assert report["sensitive_attributes"]["disease"]["entropy_l"] == 3.0
    assert report["passed"] is True


def test_recursive_target(li_patients):
    passing = check_table(li_patients, make_spec(targets={"l": {"kind": "recursive", "l": 2, "c": 0.6}}))
    assert passing["passed"] is True
    assert passing["sensitive_attributes"]["disease"]["recursive_c_bound"] == pytest.approx(0.5)
    failing = check_table(li_patients, make_spec(targets={"l": {"kind": "recursive", "l": 2, "c": 0.5}}))
    assert failing["passed"] is False  # r_1 < c * tail is strict: 1 < 0.5 * 2 is false


def test_recursive_bound_is_null_when_a_class_is_too_uniform(hospital):
    spec = AnonymitySpec.model_validate(
        {
            "version": 1,
            "check": "hospital",
            "quasi_identifiers": HOSPITAL_QIS,
            "sensitive_attributes": [{"name": "disease", "type": "categorical"}],
            "targets": {"l": {"kind": "recursive", "l": 2, "c": 3}},
        }
    )
    report = check_table(hospital, spec)
    assert report["sensitive_attributes"]["disease"]["recursive_c_bound"] is None
    assert report["targets"][0]["failing_classes"] == 1
    json.dumps(report, allow_nan=False)


def hospital_spec(max_fraction: float) -> AnonymitySpec:
    return AnonymitySpec.model_validate(
        {
            "version": 1,
            "check": "hospital",
            "quasi_identifiers": HOSPITAL_QIS,
            "sensitive_attributes": [{"name": "disease", "type": "categorical"}],
            "targets": {"k": 3},
            "suppression": {"max_fraction": max_fraction},
        }
    )


def test_suppression_within_allowance_releases_the_rest(hospital):
    """The two female classes (2 rows each) violate k = 3; 4 of 13 rows fit in 31 %."""
    report = check_table(hospital, hospital_spec(0.31))
    assert report["passed"] is True
    assert report["k"] == 2
    assert report["suppression"]["suppressed_rows"] == 4
    assert report["suppression"]["suppressed_fraction"] == pytest.approx(4 / 13)
    assert report["released"] == {"rows": 9, "equivalence_classes": 3, "k": 3}
    assert report["class_size_histogram"] == {"released": {"3": 3}, "before_suppression": {"2": 2, "3": 3}}
    # t compares the released classes with P over the whole input table (13 rows: Cancer 5, Heart-related 3, TB 2,
    # Viral infection 2, No illness 1), not over the released rows. The worst class is male Tamil Nadu (Cancer x3):
    # total variation (|5/13 - 1| + 8/13) / 2 = 8/13.
    assert report["sensitive_attributes"]["disease"]["t"] == pytest.approx(8 / 13)


def test_suppression_beyond_allowance_fails(hospital):
    report = check_table(hospital, hospital_spec(0.30))
    assert report["passed"] is False
    assert report["suppression"]["applied"] is False
    assert report["suppression"]["allowed_rows"] == math.floor(0.30 * 13)


@pytest.mark.parametrize(
    ("table", "spec", "match"),
    [
        pytest.param(
            pd.DataFrame({"zip": ["1"], "age": [1], "salary": [1]}),
            make_spec(),
            "unknown sensitive attribute column\\(s\\) \\['disease'\\]",
            id="unknown column",
        ),
        pytest.param(
            pd.DataFrame({"zip": [], "age": [], "salary": [], "disease": []}), make_spec(), "empty", id="empty table"
        ),
        pytest.param(
            pd.DataFrame({"zip": ["1", None], "age": [1, 2], "salary": [1, 2], "disease": ["flu", "flu"]}),
            make_spec(),
            "'zip' has 1 missing value",
            id="NaN in a QI",
        ),
        pytest.param(
            pd.DataFrame({"zip": ["1", "1"], "age": [1, 1], "salary": [1, 2], "disease": ["flu", "flu"]}),
            make_spec(targets={"k": 3}),
            "target k = 3 is larger than the table \\(2 rows\\)",
            id="k larger than the table",
        ),
        pytest.param(
            pd.DataFrame({"zip": ["1", "1"], "age": [1, 1], "salary": [1, 2], "disease": ["flu", "measles"]}),
            make_spec(targets={"k": 2}),
            "1 value\\(s\\) are not leaves",
            id="value outside the hierarchy",
        ),
    ],
)
def test_bad_input_is_a_clear_error(table, spec, match):
    with pytest.raises(AnonymityInputError, match=match):
        check_table(table, spec)


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        pytest.param(["zip", "age", "zip", "salary", "disease"], "column\\(s\\) \\['zip'\\] appear more than once",
                     id="repeated QI"),
        pytest.param(["zip", "age", "salary", "salary", "disease"],
                     "sensitive attribute column\\(s\\) \\['salary'\\] appear more than once", id="repeated SA"),
    ],
)
def test_repeated_column_names_are_refused(columns, match):
    # A SQL join selecting a.zip, b.zip: pandas returns a frame for table["zip"], which nothing can group.
    table = pd.DataFrame([["1", 30, "1", 5, "flu"]] * 3, columns=columns)
    with pytest.raises(AnonymityInputError, match=match):
        check_table(table, make_spec(targets={"k": 2}))


def test_repeated_column_outside_the_spec_is_allowed():
    table = pd.DataFrame([["1", 30, 5, "flu", "a", "b"]] * 3, columns=["zip", "age", "salary", "disease", "x", "x"])
    assert check_table(table, make_spec(targets={"k": 3}))["k"] == 3


def test_column_named_by_a_number_is_explained():
    table = pd.DataFrame({5: ["1", "1"], "age": [1, 1]})
    spec = make_spec(quasi_identifiers=["5", "age"], sensitive_attributes=[], targets={"k": 2})
    message = "the table's column\\(s\\) 5 \\(int\\) are not named by text"
    with pytest.raises(AnonymityInputError, match=message) as error:
        check_table(table, spec)
    assert "table.columns = table.columns.map(str)" in str(error.value)
    table.columns = table.columns.map(str)
    assert check_table(table, spec)["k"] == 2


def test_adult_example_spec_runs(adult):
    from .anonymity_tables import REPO_ROOT

    from dp_operators.anonymity import load_anonymity_spec

    report = check_table(adult, load_anonymity_spec(REPO_ROOT / "config" / "anonymity" / "adult_microdata.yaml"))
    assert report["rows"] == 48_842
    assert report["k"] == 1  # raw Adult is not k-anonymous on these QIs
    json.dumps(report, allow_nan=False)


# --- suppression of classes failing any class-level target, risk, histogram ----------------------------------------


def hospital_targets(targets: dict, max_fraction: float = 0.0, **extra) -> AnonymitySpec:
    document = {
        "version": 1,
        "check": "hospital",
        "quasi_identifiers": HOSPITAL_QIS,
        "sensitive_attributes": [{"name": "disease", "type": "categorical"}],
        "targets": targets,
        "suppression": {"max_fraction": max_fraction},
    }
    return AnonymitySpec.model_validate(document | extra)


# The hospital table's classes: female Kerala (2 rows: Viral infection, Heart-related), female Tamil Nadu (2: Cancer,
# TB), male Karnataka (3: No illness, TB, Heart-related), male Kerala (3: Cancer, Heart-related, Viral infection),
# male Tamil Nadu (3: Cancer x3).
FEMALE = slice(0, 4)
MALE_TAMIL_NADU = slice(10, 13)


def test_a_class_failing_l_is_suppressed_not_only_classes_failing_k(hospital):
    spec = hospital_targets({"l": {"kind": "distinct", "l": 2}}, max_fraction=3 / 13)
    report, released = evaluate_table(hospital, spec)
    assert report["passed"] is True
    assert report["failing_classes"] == {"classes": 1, "rows": 3, "by_target": {"l:disease": 1}}
    assert report["suppression"]["suppressed_rows"] == 3
    assert report["suppression"]["suppressed_classes"] == 1
    expected = np.ones(13, dtype=bool)
    expected[MALE_TAMIL_NADU] = False
    np.testing.assert_array_equal(released, expected)
    assert report["sensitive_attributes"]["disease"]["distinct_l"] == 2


def test_rows_failing_k_and_l_together_must_fit_the_allowance(hospital):
    targets = {"k": 3, "l": {"kind": "distinct", "l": 2}}
    within = check_table(hospital, hospital_targets(targets, max_fraction=7 / 13))  # 4 rows fail k, 3 fail l
    assert within["passed"] is True
    assert within["released"] == {"rows": 6, "equivalence_classes": 2, "k": 3}
    beyond = check_table(hospital, hospital_targets(targets, max_fraction=6 / 13))
    assert beyond["passed"] is False
    assert beyond["suppression"]["applied"] is False
    assert beyond["failing_classes"]["by_target"] == {"k": 2, "l:disease": 1}
    assert beyond["failed_targets"] == ["k: 2 vs target 3 (2 failing classes)", "l_distinct on disease: 1 vs target 2 (1 failing class)"]


def test_every_class_failing_is_never_suppressed(hospital):
    # Every class has fewer than 4 rows: suppressing all 13 would release nothing, so nothing is suppressed.
    report = check_table(hospital, hospital_targets({"k": 4}, max_fraction=1.0))
    assert report["suppression"]["applied"] is False
    assert report["released"]["rows"] == 13
    assert report["passed"] is False


def test_risk_figures_and_targets_by_hand(hospital):
    # Sizes 2, 2, 3, 3, 3 (13 rows). Prosecutor: highest 1/2, average 5 classes / 13 rows; at threshold 0.4 the
    # 4 rows of size-2 classes are at risk (1/3 <= 0.4). Without a population the journalist figures are the
    # prosecutor's and the marketer risk is 5/13.
    spec = hospital_targets(
        {
            "prosecutor_risk": {"highest": 0.4, "average": 0.38, "records_at_risk": 0.4},
            "journalist_risk": {"average": 0.39},
            "marketer_risk": 0.4,
        },
        risk_threshold=0.4,
    )
    report = check_table(hospital, spec)
    risk = report["risk"]
    assert risk["threshold"] == 0.4
    assert risk["prosecutor"] == pytest.approx({"highest": 0.5, "average": 5 / 13, "records_at_risk": 4 / 13})
    assert risk["journalist"] == pytest.approx(risk["prosecutor"])
    assert risk["marketer"]["average"] == pytest.approx(5 / 13)
    by_measure = {t["measure"]: t for t in report["targets"]}
    assert by_measure["prosecutor_risk.highest"] == {
        "measure": "prosecutor_risk.highest", "target": 0.4, "value": 0.5, "passed": False, "failing_classes": 2
    }
    assert by_measure["prosecutor_risk.average"]["passed"] is False  # 0.3846 > 0.38
    assert by_measure["prosecutor_risk.records_at_risk"]["passed"] is True  # 0.3077 <= 0.4
    assert by_measure["journalist_risk.average"]["passed"] is True  # 0.3846 <= 0.39
    assert by_measure["marketer_risk"] == {"measure": "marketer_risk", "target": 0.4, "value": pytest.approx(5 / 13), "passed": True}
    assert report["passed"] is False
    assert report["failed_targets"] == [
        "prosecutor_risk.highest: 0.5 vs target 0.4 (2 failing classes)",
        "prosecutor_risk.average: 0.3846 vs target 0.38",
    ]


def test_highest_risk_target_suppresses_small_classes_then_table_risk_is_measured_on_the_release(hospital):
    # highest 1/3: the two female classes (risk 1/2) fail and 4 rows fit 4/13; the release has 3 classes of 3.
    spec = hospital_targets({"prosecutor_risk": {"highest": 1 / 3, "average": 1 / 3}}, max_fraction=4 / 13)
    report = check_table(hospital, spec)
    assert report["suppression"]["suppressed_rows"] == 4
    assert report["risk"]["prosecutor"]["highest"] == pytest.approx(1 / 3)
    assert report["risk"]["prosecutor"]["average"] == pytest.approx(3 / 9)  # exactly at the target: passes
    assert report["passed"] is True


def test_table_risk_target_alone_never_suppresses(hospital):
    report = check_table(hospital, hospital_targets({"marketer_risk": 0.2}, max_fraction=0.5))
    assert report["suppression"]["applied"] is False
    assert report["failed_targets"] == ["marketer_risk: 0.3846 vs target 0.2"]


@pytest.mark.parametrize(
    ("max_fraction", "passed", "released_rows"),
    [
        pytest.param(10 / 13, True, 3, id="the 10 failing rows fit: male Kerala alone is released"),
        pytest.param(9 / 13, False, 13, id="they do not fit: nothing is suppressed and the release fails"),
    ],
)
def test_check_table_equals_criteria_evaluation(hospital, max_fraction, passed, released_rows):
    """The report's verdict is the criteria's on the released rows: no class fails, no table-level target fails.

    Against P over the 13 rows, t (total variation) per class: female Kerala 8/13, female Tamil Nadu 6/13, male
    Karnataka 7/13, male Kerala 11/39, male Tamil Nadu 8/13; so t = 0.5 fails three classes, k = 3 the two female
    ones: four failing classes, 10 rows. Released alone, male Kerala has average risk 1/3 <= 0.35; all 13 rows
    have 5/13 > 0.35."""
    spec = hospital_targets({"k": 3, "t": 0.5, "prosecutor_risk": {"average": 0.35}}, max_fraction=max_fraction)
    report, released = evaluate_table(hospital, spec)
    assert report["failing_classes"] == {"classes": 4, "rows": 10, "by_target": {"k": 2, "t:disease": 3}}
    assert int(released.sum()) == released_rows == report["released"]["rows"]
    criteria = Criteria(spec, hospital)
    classes = equivalence_classes(hospital.loc[released], HOSPITAL_QIS)
    failing = criteria.class_failures(classes.class_ids, classes.n_classes, np.flatnonzero(released))
    table_failures = criteria.table_failures(classes.sizes)
    assert report["passed"] is passed is (not failing.any() and not table_failures)
    if not passed:
        assert table_failures == ["prosecutor_risk.average"]
        assert next(t for t in report["targets"] if t["measure"] == "t")["failing_classes"] == 3


# --- the report holds counts only ----------------------------------------------------------------------------------


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    else:
        yield path, value


def _assert_counts_only(report: dict, table: pd.DataFrame, columns: list[str]) -> None:
    text = json.dumps(report, allow_nan=False)
    for column in columns:
        for cell in table[column].astype(str).unique():
            assert cell not in text, f"a cell of {column} appears in the report"


NEIGHBOUR_SPEC = {
    "version": 1,
    "check": "neighbours",
    "quasi_identifiers": ["city", "band"],
    "sensitive_attributes": [{"name": "diagnosis", "type": "categorical"}],
    "targets": {"k": 2, "l": {"kind": "distinct", "l": 2}, "t": 0.4, "prosecutor_risk": {"average": 0.5}},
    "suppression": {"max_fraction": 0.2},
}
CITIES = ["Zqx-Aberdeen", "Zqx-Bergen", "Zqx-Cork"]
BANDS = ["Zqy-young", "Zqy-old"]
DIAGNOSES = ["Zqz-asthma", "Zqz-gout", "Zqz-flu"]


def _neighbour_table(rows: list[tuple[int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [(CITIES[c], BANDS[b], DIAGNOSES[d]) for c, b, d in rows], columns=["city", "band", "diagnosis"]
    )


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 2)), min_size=3, max_size=30
    ),
    changed=st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 2)),
    where=st.integers(0, 29),
)
def test_neighbouring_tables_give_reports_differing_only_in_counts(rows, changed, where):
    """Two tables differing in one row: the reports have the same structure and text; only numbers (and the
    class sizes used as histogram keys) may differ, and no cell of either table appears in either report."""
    spec = AnonymitySpec.model_validate(NEIGHBOUR_SPEC)
    first = _neighbour_table(rows)
    second_rows = list(rows)
    second_rows[where % len(rows)] = changed
    second = _neighbour_table(second_rows)
    reports = [check_table(table, spec) for table in (first, second)]
    for report, table in zip(reports, (first, second)):
        _assert_counts_only(report, table, ["city", "band", "diagnosis"])
    leaves = [
        {path: value for path, value in _leaves(report) if "class_size_histogram" not in path and "size_counts" not in path}
        for report in reports
    ]
    # failed_targets lines carry numbers; compare their text with the digits taken out
    for leaf in leaves:
        for path in [p for p in leaf if p and p[0] == "failed_targets"]:
            del leaf[path]
    common = leaves[0].keys() & leaves[1].keys()
    for path in common:
        a, b = leaves[0][path], leaves[1][path]
        if isinstance(a, str) or isinstance(b, str):
            assert a == b, path
    # keys differ only where a target's presence depends on the data: never (targets are declared, not measured)
    assert leaves[0].keys() == leaves[1].keys()
    for report in reports:
        for line in report["failed_targets"]:
            assert line.split(":")[0] in {
                "k", "l_distinct on diagnosis", "t on diagnosis", "prosecutor_risk.average"
            }


SECRET_CELL = {"name": "Ada Lovelace"}


@pytest.mark.parametrize(
    "cells",
    [
        pytest.param([SECRET_CELL, {"name": "x"}, "1", "1"], id="dicts (Parquet struct)"),
        pytest.param([["Ada Lovelace"], ["x"], "1", "1"], id="lists"),
        pytest.param([{"Ada Lovelace"}, {"x"}, "1", "1"], id="sets"),
        pytest.param([np.array(["Ada Lovelace"]), np.array([1]), "1", "1"], id="arrays"),
        pytest.param([("Ada Lovelace", ["x"]), ("y", []), "1", "1"], id="tuples holding lists"),
    ],
)
@pytest.mark.parametrize("role", ["quasi-identifier", "sensitive attribute"])
def test_unhashable_cells_are_refused_with_column_and_count(cells, role):
    column = pd.Series(cells, dtype=object)
    table = pd.DataFrame({"zip": ["1"] * 4, "age": [1] * 4, "salary": [1, 2, 3, 4], "disease": ["flu"] * 4})
    table["zip" if role == "quasi-identifier" else "disease"] = column
    spec = make_spec(targets={"k": 2})
    with pytest.raises(AnonymityInputError) as caught:
        check_table(table, spec)
    message = str(caught.value)
    name = "zip" if role == "quasi-identifier" else "disease"
    assert message.startswith(f"{role} column {name!r} has 2 cell(s) holding a list, dict, set or array"), message
    assert "Ada" not in message and "name" not in message


def test_nested_arrow_columns_are_refused():
    pa = pytest.importorskip("pyarrow")
    struct = pd.Series([{"a": 1}, {"a": 2}, None], dtype=pd.ArrowDtype(pa.struct([("a", pa.int64())])))
    table = pd.DataFrame({"zip": struct, "age": [1, 2, 3]})
    with pytest.raises(AnonymityInputError, match="'zip' has 1 missing value"):
        equivalence_classes(table, ["zip", "age"])
    table["zip"] = pd.Series([{"a": 1}, {"a": 2}, {"a": 2}], dtype=struct.dtype)
    with pytest.raises(AnonymityInputError, match=r"'zip' has 3 cell\(s\) holding a list, dict, set or array"):
        equivalence_classes(table, ["zip", "age"])
    flat = pd.Series(["a", "b", "b"], dtype=pd.ArrowDtype(pa.string()))
    assert equivalence_classes(table.assign(zip=flat), ["zip", "age"]).n_classes == 3
