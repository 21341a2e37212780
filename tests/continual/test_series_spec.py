"""A spec declared as a series: what it may hold, its plan from public parameters, `dpctl spec plan`, and the
refusal to release it as one release."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.continual.plan import plan_spec_series, step_sensitivity_squared
from dp_operators.continual.strategies import MAX_STEPS
from dp_operators.release import ReleaseConfigError, plan_release
from dp_operators.spec import SpecError, parse_spec
from dp_operators.spec.models import MAX_SERIES_STEPS

runner = CliRunner()

COUNT = "{name: flights, kind: count, group_by: [carrier], keys: {carrier: [AA, UA, DL]}, mechanism: auto, " \
        "budget: {rho: 1}}"
SUM = "{name: delay, kind: sum, bounds: [0, 100], group_by: [carrier], keys: {carrier: [AA, UA, DL]}, " \
      "mechanism: auto, budget: {rho: 1}}"


def series_spec(*aggregates: str, series: str = "{horizon: 365}", extra: str = "") -> str:
    listed = "\n".join(f"  - {aggregate}" for aggregate in aggregates or (COUNT,))
    return (f"version: 1\nrelease: daily_flights\nbudget_account: flights\nprivacy_unit: flight\n{extra}"
            f"series: {series}\naggregates:\n{listed}\n")


def refusal(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="s.yaml")
    return str(caught.value)


def test_a_series_plans_each_aggregate_from_its_rho_and_step_sensitivity():
    plans = plan_spec_series(parse_spec(series_spec(COUNT, SUM), source="s.yaml"))
    assert [(p.aggregate, p.plan.chosen.mechanism) for p in plans] == [
        ("flights", "sqrt_factorization"), ("delay", "sqrt_factorization")]
    count, total = plans
    # one flight in one carrier's count at one step: rho 1, T = 365 -> 1.96 * 2.08
    assert round(count.worst_half_width["sqrt_factorization"], 2) == 4.08
    assert count.worst_half_width["summed_increments"] == 26  # a lattice point of the exact law (z * std: 26.48)
    assert round(total.worst_half_width["sqrt_factorization"], 1) == 408.0  # a delay of up to 100 minutes


def test_the_step_sensitivity_follows_the_contribution_bounds_and_the_public_keys():
    spec = parse_spec(series_spec(
        COUNT, "{name: one, kind: count, mechanism: auto, budget: {rho: 1}}",
        extra="contribution: {max_partitions_contributed: 2, max_contributions_per_partition: 3}\n"), source="s.yaml")
    grouped, ungrouped = spec.aggregates
    assert step_sensitivity_squared(spec, grouped) == 2 * 3**2
    assert step_sensitivity_squared(spec, ungrouped) == 1 * 3**2  # one key: L0 is 1 whatever the bound says


@pytest.mark.parametrize(("aggregate", "series", "message"), [
    ("{name: m, kind: mean, bounds: [0, 1], mechanism: auto, budget: {rho: 1}}", "{horizon: 10}",
     "a series releases running counts and sums, not a mean"),
    ("{name: c, kind: count, group_by: [g], partition_selection: {budget: {epsilon: 1, delta: 1e-6}}, "
     "mechanism: auto, budget: {rho: 1}}",
     "{horizon: 10}", "a series needs public keys"),
    ("{name: c, kind: count, mechanism: auto, budget: {epsilon: 1}}", "{horizon: 10}",
     "a series' budget is zCDP: give {rho}"),
    ("{name: c, kind: count, mechanism: discrete_laplace, budget: {epsilon: 1}}", "{horizon: 10}",
     "use mechanism discrete_gaussian or auto"),
    (COUNT, "{horizon: 10, participation: {max_steps: 11}}", "participation.max_steps (11) exceeds the horizon (10)"),
    (COUNT, "{horizon: 0}", "must be from 1 to 10,000, got 0"),
    (COUNT, "{horizon: 365, mechanism: fft}", "series.mechanism"),
])
def test_what_a_series_cannot_release_is_refused_when_the_spec_is_loaded(aggregate, series, message):
    assert message in refusal(series_spec(aggregate, series=series))


def test_the_spec_limit_is_the_strategies_limit():
    assert MAX_SERIES_STEPS == MAX_STEPS


def test_a_series_spec_is_released_step_by_step_not_as_one_release(tmp_path: Path):
    spec = parse_spec(series_spec(), source="s.yaml")
    with pytest.raises(ReleaseConfigError, match="released one step per run"):
        plan_release(spec)
    path = tmp_path / "s.yaml"
    path.write_text(series_spec())
    from dp_operators.operators.release import DPReleaseOperator

    assert DPReleaseOperator(task_id="release", spec_path=path, aggregates_task_id="x").release_spec.series


def test_a_series_sum_off_grid_1_fails_the_dag_import_naming_why(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text(series_spec(SUM.replace("bounds: [0, 100]", "bounds: [0, 100], grid: 0.5")))
    from dp_operators.operators.release import DPReleaseOperator

    with pytest.raises(SpecError, match="released on grid 1, with integer bounds"):
        DPReleaseOperator(task_id="release", spec_path=path, aggregates_task_id="x")


def test_spec_plan_prints_every_candidate_and_the_choice(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text(series_spec(COUNT, series="{horizon: 1000, participation: {max_steps: 7}}"))
    table = runner.invoke(app, ["spec", "plan", str(path)], terminal_width=200)
    assert table.exit_code == 0, table.output
    assert "Plan of series 'daily_flights': 1000 steps, a unit in at most 7 step(s)" in table.output
    assert "rho 1, once for all 1000 steps" in table.output
    as_json = runner.invoke(app, ["spec", "plan", str(path), "--json"])
    summary = json.loads(as_json.output)
    [flights] = summary["aggregates"]
    assert flights["chosen"] == "sqrt_factorization"
    stds = {c["mechanism"]: round(c["worst_step_std"], 2) for c in flights["candidates"]}
    assert stds["sqrt_factorization"] == 14.15 and stds["summed_increments"] == 59.16  # the k = 7, T = 1000
    assert Fraction(summary["charge_per_series"]["amount"]) == 1


def test_the_guides_example_series_plans_as_the_guide_says():
    """docs/continual.md's spec, as written: its plan chooses the square root at ± 4.08 (1.96 x 2.08)."""
    from support import REPO

    text = (REPO / "docs" / "continual.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    [flights] = plan_spec_series(parse_spec(example, source="docs/continual.md"))
    assert flights.plan.chosen.mechanism == "sqrt_factorization"
    assert round(flights.worst_half_width["sqrt_factorization"], 2) == 4.08


@pytest.mark.parametrize(("aggregate", "series", "reason"), [
    pytest.param(SUM.replace("bounds: [0, 100]", "bounds: [0, 100], grid: 0.5"), "{horizon: 365}",
                 "released on grid 1", id="a sum off grid 1"),
])
def test_spec_plan_prints_the_plan_and_fails_on_a_series_this_version_does_not_release(tmp_path: Path, aggregate,
                                                                                       series, reason):
    path = tmp_path / "s.yaml"
    path.write_text(series_spec(aggregate, series=series))
    result = runner.invoke(app, ["spec", "plan", str(path)], terminal_width=200)
    assert result.exit_code == 1
    assert "Plan of series" in result.output and "planned, but not releasable by this version" in result.output
    assert reason in result.output
