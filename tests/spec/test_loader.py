"""Release spec validation: every bad input is a clear error naming the file, the field path and the reason."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_operators.spec import SpecError, load_spec, parse_spec

from support import EXAMPLE_SPEC


def example_document() -> dict:
    return yaml.safe_load(EXAMPLE_SPEC.read_text())


def with_change(path: str, value) -> str:
    """The example spec with the value at dotted ``path`` (list indices as numbers) replaced; ``...`` deletes."""
    document = example_document()
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = document
    for part in parents:
        node = node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return yaml.safe_dump(document)


def test_example_spec_is_valid():
    spec = load_spec(EXAMPLE_SPEC)
    assert spec.release == "adult_census_statistics"
    education = spec.aggregates[0]
    assert education.partition_count == 32
    assert education.budget.rho == Fraction(9, 200)


@pytest.mark.parametrize(
    ("path", "value", "where", "reason"),
    [
        pytest.param("aggregates.1.budget.epsilon", float("nan"), "aggregates[1](people_by_age_band).budget.epsilon",
                     "finite", id="epsilon NaN"),
        pytest.param("aggregates.1.budget.epsilon", 0, "budget.epsilon", "> 0", id="epsilon zero"),
        pytest.param("aggregates.1.budget.epsilon", -0.5, "budget.epsilon", "> 0", id="epsilon negative"),
        pytest.param("aggregates.1.budget.epsilon", float("inf"), "budget.epsilon", "finite", id="epsilon infinite"),
        pytest.param("aggregates.1.budget.epsilon", "lots", "budget.epsilon", "decimal", id="epsilon not a number"),
        pytest.param("aggregates.1.budget.epsilon", True, "budget.epsilon", "boolean", id="epsilon boolean"),
        pytest.param("aggregates.0.budget", {"epsilon": 1, "delta": 1}, "budget.delta", "(0, 1)", id="delta one"),
        pytest.param("aggregates.0.budget", {"epsilon": 1, "delta": 1.5}, "budget.delta", "(0, 1)",
                     id="delta above one"),
        pytest.param("aggregates.0.budget", {"epsilon": 1, "delta": 0}, "budget.delta", "(0, 1)", id="delta zero"),
        pytest.param("aggregates.0.budget", {"rho": 0.1, "epsilon": 1}, "budget", "give", id="two budget forms"),
        pytest.param("aggregates.1.budget", {"rho": 0.1}, "people_by_age_band", "calibrated from epsilon",
                     id="laplace with rho"),
        pytest.param("aggregates.2.bounds", [99, 1], "mean_hours_per_week", "lower < upper", id="reversed bounds"),
        pytest.param("aggregates.2.bounds", [1, float("inf")], "bounds", "finite", id="infinite bound"),
        pytest.param("aggregates.2.bounds", ..., "mean_hours_per_week", "needs clipping 'bounds", id="mean no bounds"),
        pytest.param("aggregates.2.bounds", [0, 0], "mean_hours_per_week", "lower < upper",
                     id="zero-width bounds"),
        pytest.param("aggregates.0.epsilion", 1, "aggregates[0](people_by_education_sex).epsilion", "unknown field",
                     id="unknown key"),
        pytest.param("aggregates.0.keys.sex", [], "people_by_education_sex", "keys.sex is empty",
                     id="empty key domain"),
        pytest.param("aggregates.0.group_by", ["education"], "people_by_education_sex", "keys must give",
                     id="keys and group_by disagree"),
        pytest.param("aggregates.0.kind", "median", "aggregates[0](people_by_education_sex).kind", "count",
                     id="unknown kind"),
        pytest.param("aggregates.0.mechanism", "laplace", "mechanism", "discrete_laplace", id="float mechanism"),
        pytest.param("contribution.max_partitions_contributed", 0, "contribution.max_partitions_contributed",
                     "greater than or equal to 1", id="zero contribution bound"),
        pytest.param("confidence", 1.0, "confidence", "less than 1", id="confidence one"),
        pytest.param("version", 2, "version", "1", id="unknown version"),
        pytest.param("aggregates", [], "aggregates", "at least 1", id="no aggregates"),
    ],
)
def test_bad_spec_names_file_field_and_reason(path, value, where, reason):
    with pytest.raises(SpecError) as caught:
        parse_spec(with_change(path, value), source="releases/bad.yaml")
    message = str(caught.value)
    assert message.startswith("releases/bad.yaml: ")
    assert where in message
    assert reason in message


def test_duplicate_aggregate_names_are_refused():
    document = example_document()
    document["aggregates"][1]["name"] = document["aggregates"][0]["name"]
    with pytest.raises(SpecError, match="unique"):
        parse_spec(yaml.safe_dump(document))


def test_budgets_are_read_exactly():
    document = example_document()
    document["aggregates"][1]["budget"] = {"epsilon": 0.1}
    document["aggregates"][2]["budget"] = {"epsilon": "1/3"}
    spec = parse_spec(yaml.safe_dump(document))
    assert spec.aggregates[1].budget.epsilon == Fraction(1, 10)
    assert spec.aggregates[2].budget.epsilon == Fraction(1, 3)


def test_missing_file_and_bad_yaml(tmp_path: Path):
    with pytest.raises(SpecError, match="cannot read release spec"):
        load_spec(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\naggregates: [\n")
    with pytest.raises(SpecError, match=f"{broken}: not valid YAML"):
        load_spec(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="YAML mapping"):
        load_spec(listed)
