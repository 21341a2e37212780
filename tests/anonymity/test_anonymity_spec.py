"""The YAML anonymity spec: valid documents load, invalid ones name the file, the field path and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from .anonymity_tables import REPO_ROOT

from dp_operators.anonymity import AnonymitySpecError, load_anonymity_spec, parse_anonymity_spec

MINIMAL = """
version: 1
check: patients
quasi_identifiers: [zip, age]
sensitive_attributes:
  - {name: disease, type: categorical}
targets: {k: 3}
"""


def test_minimal_spec_defaults():
    spec = parse_anonymity_spec(MINIMAL)
    assert spec.on_failure == "fail"
    assert spec.suppression.max_fraction == 0.0
    assert spec.sensitive_attributes[0].distance == "equal"


def test_example_spec_loads():
    spec = load_anonymity_spec(REPO_ROOT / "config" / "anonymity" / "adult_microdata.yaml")
    assert spec.quasi_identifiers == ["age", "sex", "race", "native_country", "education"]
    distances = {a.name: a.distance for a in spec.sensitive_attributes}
    assert distances == {"income": "equal", "hours_per_week": "ordered", "occupation": "hierarchical"}


@pytest.mark.parametrize(
    ("replace", "by", "path", "reason"),
    [
        pytest.param("targets: {k: 3}", "targets: {k: 3, kk: 4}", "targets.kk",
                     "unknown field (check the spelling; see docs/anonymity.md)", id="unknown field"),
        pytest.param("targets: {k: 3}", "targets: {k: true}", "targets.k", "not a boolean", id="k is a boolean"),
        pytest.param("targets: {k: 3}", "targets: {l: {kind: distinct, l: true}}", "targets.l.l", "not a boolean",
                     id="l is a boolean"),
        pytest.param("targets: {k: 3}", "targets: {t: .nan}", "targets.t", "must be a finite number in [0, 1]",
                     id="t is NaN"),
        pytest.param("targets: {k: 3}", "targets: {t: true}", "targets.t", "not a boolean", id="t is a boolean"),
        pytest.param(
            "targets: {k: 3}", "targets: {k: 3}\nsuppression: {max_fraction: .nan}", "suppression.max_fraction",
            "must be a finite number in [0, 1]", id="NaN suppression",
        ),
        pytest.param("targets: {k: 3}", "targets: {k: 0}", "targets.k", "greater than or equal to 1", id="k below 1"),
        pytest.param("targets: {k: 3}", "targets: {}", "targets", "at least one target", id="no target"),
        pytest.param("targets: {k: 3}", "targets: {t: 1.5}", "targets.t", "less than or equal to 1", id="t above 1"),
        pytest.param(
            "targets: {k: 3}", "targets: {l: {kind: recursive, l: 2}}", "targets.l", "needs c", id="recursive without c"
        ),
        pytest.param(
            "targets: {k: 3}", "targets: {l: {kind: distinct, l: 2.5}}", "targets.l", "integer l", id="fractional l"
        ),
        pytest.param(
            "type: categorical}", "type: nominal}", "sensitive_attributes.0.type", "'ordered' or 'categorical'",
            id="bad attribute type",
        ),
        pytest.param("[zip, age]", "[zip, zip]", "quasi_identifiers", "more than once", id="duplicate QI"),
        pytest.param("[zip, age]", "[zip, disease]", "<document>", "both quasi-identifier", id="QI is also sensitive"),
        pytest.param("version: 1", "version: 2", "version", "Input should be 1", id="unknown version"),
        pytest.param(
            "type: categorical}", "type: ordered, hierarchy: {'*': [a]}}", "sensitive_attributes.0",
            "hierarchy applies to a categorical", id="hierarchy on ordered",
        ),
        pytest.param(
            "type: categorical}", "type: categorical, hierarchy: {'*': [a, a]}}", "sensitive_attributes.0",
            "more than once", id="duplicate hierarchy leaf",
        ),
        pytest.param(
            "targets: {k: 3}", "targets: {k: 3}\nsuppression: {max_fraction: -0.1}", "suppression.max_fraction",
            "greater than or equal to 0", id="negative suppression",
        ),
        pytest.param("targets: {k: 3}", "targets: {k: 3}\non_failure: ignore", "on_failure", "'fail' or 'warn'",
                     id="bad on_failure"),
    ],
)
def test_invalid_spec_names_file_path_and_reason(tmp_path: Path, replace, by, path, reason):
    assert replace in MINIMAL
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(MINIMAL.replace(replace, by, 1))
    with pytest.raises(AnonymitySpecError) as info:
        load_anonymity_spec(spec_file)
    message = str(info.value)
    assert message.startswith(f"{spec_file}: {path}: "), message
    assert reason in message


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("version: [1", "not valid YAML", id="broken YAML"),
        pytest.param("- a\n- b", "expected a mapping", id="not a mapping"),
    ],
)
def test_unparseable_document(text, reason):
    with pytest.raises(AnonymitySpecError, match=f"^spec.yaml: <document>: {reason}"):
        parse_anonymity_spec(text, source="spec.yaml")


def test_missing_file(tmp_path: Path):
    with pytest.raises(AnonymitySpecError, match="cannot read the spec file"):
        load_anonymity_spec(tmp_path / "absent.yaml")


def test_spec_error_is_a_value_error():
    assert issubclass(AnonymitySpecError, ValueError)
