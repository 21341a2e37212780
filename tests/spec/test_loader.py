"""Release spec validation: every bad input is a clear error naming the file, the field path and the reason."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from yamlcore import CoreDumper

from dp_operators.spec import SpecError, load_spec, parse_spec
from dp_operators.spec.yaml12 import load_yaml

from support import EXAMPLE_SPEC


def example_document() -> dict:
    return load_yaml(EXAMPLE_SPEC.read_text())


def dump(document: dict) -> str:
    """YAML 1.2 text of ``document`` (strings that would read as numbers are quoted)."""
    return yaml.dump(document, Dumper=CoreDumper, sort_keys=False)


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
    return dump(document)


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
        pytest.param("aggregates.0.groupby", ["sex"], "aggregates[0](people_by_education_sex).groupby",
                     "unknown field (did you mean 'group_by'?", id="misspelt key named"),
        pytest.param("contributon", {"max_partitions_contributed": 1}, "contributon",
                     "unknown field (did you mean 'contribution'?", id="misspelt top-level key named"),
        pytest.param("aggregates.0.keys.sex", [], "people_by_education_sex", "keys.sex is empty",
                     id="empty key domain"),
        pytest.param("aggregates.0.group_by", ["education"], "people_by_education_sex", "keys must give",
                     id="keys and group_by disagree"),
        pytest.param("aggregates.0.kind", "mode", "aggregates[0](people_by_education_sex).kind", "count",
                     id="unknown kind"),
        pytest.param("aggregates.0.mechanism", "laplace", "mechanism", "discrete_laplace", id="float mechanism"),
        pytest.param("contribution.max_partitions_contributed", 0, "contribution.max_partitions_contributed",
                     "must be from 1 to 10,000", id="zero contribution bound"),
        pytest.param("confidence", 1.0, "confidence", "less than 1", id="confidence one"),
        pytest.param("version", 2, "version", "1", id="unknown version"),
        pytest.param("aggregates", [], "aggregates", "at least 1", id="no aggregates"),
        pytest.param("aggregates.2.bounds", [1], "aggregates[2](mean_hours_per_week).bounds[1]", "Field required",
                     id="one bound only"),
        pytest.param("aggregates.1.budget.epsilon", "1e-400", "budget.epsilon", "between 0.0001 and 100",
                     id="epsilon underflows"),
        pytest.param("aggregates.1.budget.epsilon", "1e400", "budget.epsilon", "between 0.0001 and 100",
                     id="epsilon overflows"),
        pytest.param("aggregates.2.bounds", [1, 1e300], "bounds", "at most 1e15", id="huge bound"),
        pytest.param("confidence", float("nan"), "confidence", "finite number", id="confidence NaN"),
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
        parse_spec(dump(document))


def test_budgets_are_read_exactly():
    document = example_document()
    document["aggregates"][1]["budget"] = {"epsilon": 0.1}
    document["aggregates"][2]["budget"] = {"epsilon": "1/3"}
    spec = parse_spec(dump(document))
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


def aggregate_spec(aggregate: dict) -> str:
    document = {"version": 1, "release": "r", "budget_account": "a", "privacy_unit": "person",
                "aggregates": [aggregate]}
    return dump(document)


@pytest.mark.parametrize(
    ("aggregate", "reason"),
    [
        pytest.param({"name": "v", "kind": "variance", "mechanism": "auto", "budget": {"epsilon": 1}},
                     "needs clipping 'bounds", id="variance without bounds"),
        pytest.param({"name": "s", "kind": "sum", "bounds": [3, 3], "mechanism": "auto", "budget": {"epsilon": 1}},
                     "sensitivity 0", id="equal bounds: sensitivity 0"),
        pytest.param({"name": "s", "kind": "sum", "bounds": [0, 1], "grid": 0, "mechanism": "auto",
                      "budget": {"epsilon": 1}}, "> 0", id="zero grid"),
        pytest.param({"name": "c", "kind": "count", "group_by": ["city"], "mechanism": "auto",
                      "budget": {"epsilon": 1}}, "partition_selection", id="private keys without selection"),
        pytest.param({"name": "c", "kind": "count", "group_by": ["city"], "keys": {"city": ["x"]},
                      "partition_selection": {"budget": {"epsilon": 1, "delta": 1e-6}}, "mechanism": "auto",
                      "budget": {"epsilon": 1}}, "not both", id="keys and selection"),
        pytest.param({"name": "c", "kind": "count", "group_by": ["city"],
                      "partition_selection": {"budget": {"epsilon": 1}}, "mechanism": "auto",
                      "budget": {"epsilon": 1}}, "approximate budget", id="selection without delta"),
        pytest.param({"name": "c", "kind": "count", "mechanism": "discrete_gaussian", "budget": {"epsilon": 1}},
                     "mechanism: auto", id="gaussian with pure epsilon"),
        pytest.param({"name": "c", "kind": "count", "mechanism": "auto", "budget": {"epsilon": 1},
                      "non_finite": {"nan": "clamp"}}, "non_finite.nan", id="NaN cannot be clamped"),
        pytest.param({"name": "c", "kind": "count", "mechanism": "auto", "budget": {"epsilon": 1},
                      "out_of_range": "ignore"}, "out_of_range", id="unknown out_of_range policy"),
    ],
)
def test_new_aggregate_fields_are_validated(aggregate, reason):
    with pytest.raises(SpecError) as caught:
        parse_spec(aggregate_spec(aggregate), source="r.yaml")
    assert reason in str(caught.value)


def test_auto_variance_and_partition_selection_specs_load():
    spec = parse_spec(aggregate_spec({
        "name": "hours", "kind": "variance", "group_by": ["city"], "bounds": [0, 99], "grid": 0.5,
        "partition_selection": {"mechanism": "discrete_gaussian", "budget": {"epsilon": 0.5, "delta": 1e-6}},
        "mechanism": "auto", "budget": {"epsilon": 1, "delta": 1e-6},
        "non_finite": {"nan": "drop", "infinity": "clamp"}, "out_of_range": "clamp",
    }))
    aggregate = spec.aggregates[0]
    assert aggregate.components == ("sum", "count", "sum_squares")
    assert aggregate.partition_count is None and not aggregate.public_keys


@pytest.mark.parametrize("kind", ["count", "sum", "mean", "variance"])
def test_null_is_replaced_by_zero_only(kind):
    """An empty group's SQL NULL is a true 0: the neighbour with one person there is within the sensitivity of 0,
    not of 50 (a sum on [0, 1]: 50 vs 1 is 49 grid units with Linf 1; a mean's replaced count moves by 49 with a
    sensitivity of 1, and the clamp range of its centred sum with it)."""
    bounds = "" if kind == "count" else ", bounds: [0, 1]"
    text = (
        "version: 1\nrelease: r\nbudget_account: a\nprivacy_unit: person\naggregates:\n"
        f"  - {{name: x, kind: {kind}{bounds}, mechanism: discrete_laplace, budget: {{epsilon: 1}},\n"
        "     non_finite: {nan: replace, replace_with: 50}}\n"
    )
    with pytest.raises(SpecError, match=r"non_finite.replace_with must be 0 \("):
        parse_spec(text)
    parse_spec(text.replace("replace_with: 50", "replace_with: 0"))
