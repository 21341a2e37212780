"""``check_table``: targets, suppression and the JSON report (no row contents)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from .anonymity_tables import DISEASE_HIERARCHY, HOSPITAL_QIS

from dp_operators.anonymity import AnonymityInputError, AnonymitySpec, check_table


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
    assert k_target == {"measure": "k", "target": 4, "value": 3, "passed": False}
    assert report["violating_classes"] == {"target_k": 4, "classes": 3, "rows": 9, "size_counts": {"3": 3}}
    t_salary = next(t for t in report["targets"] if t["measure"] == "t" and t["attribute"] == "salary")
    assert t_salary["failing_classes"] == 2  # the classes at 1/6 (the third is at 1/12)


def test_entropy_target_exactly_met_passes(li_patients):
    # Every class has entropy ln 3 exactly; float round-off must not fail l = 3.
    report = check_table(li_patients, make_spec(targets={"l": {"kind": "entropy", "l": 3}}))
    assert report["passed"] is True
    assert report["sensitive_attributes"]["disease"]["entropy_l"] == pytest.approx(3)


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
    # l and t are measured on the released rows: male Karnataka/Kerala/Tamil Nadu; P = Cancer 4/9, ...
    assert report["sensitive_attributes"]["disease"]["t"] == pytest.approx(5 / 9)


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


def test_adult_example_spec_runs(adult):
    from .anonymity_tables import REPO_ROOT

    from dp_operators.anonymity import load_anonymity_spec

    report = check_table(adult, load_anonymity_spec(REPO_ROOT / "config" / "anonymity" / "adult_microdata.yaml"))
    assert report["rows"] == 48_842
    assert report["k"] == 1  # raw Adult is not k-anonymous on these QIs
    json.dumps(report, allow_nan=False)
