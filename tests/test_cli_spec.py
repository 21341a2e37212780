"""``dpctl spec validate`` and ``dpctl spec plan``: public parameters only, nothing read, nothing spent."""

from __future__ import annotations

import json
from fractions import Fraction

from typer.testing import CliRunner

from dp_operators.cli import app

from support import EXAMPLE_SPEC, make_ledger

runner = CliRunner()


def test_validate_accepts_the_example_and_names_the_field_of_a_bad_spec(tmp_path):
    assert runner.invoke(app, ["spec", "validate", str(EXAMPLE_SPEC)]).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE_SPEC.read_text().replace("budget: {epsilon: 0.3}", "budget: {epsilon: 0}"))
    result = runner.invoke(app, ["spec", "validate", str(bad)])
    assert result.exit_code == 1
    assert "people_by_age_band).budget.epsilon" in result.output and "> 0" in result.output


def test_plan_without_a_ledger_shows_mechanisms_scales_and_half_widths(monkeypatch):
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    result = runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    steps = {(s["aggregate"], s["component"]): s for s in plan["steps"]}
    assert steps[("people_by_age_band", "count")]["scale"] == "b = 3.33333"
    assert steps[("people_by_education_sex", "count")]["half_width"] == 7
    assert "runs_remaining" not in plan


def test_plan_with_a_ledger_reports_charges_and_runs_left_without_spending(tmp_path):
    ledger = make_ledger(tmp_path / "plan.db", cap="1/2")
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    result = runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--url", url, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["charge_per_run"] == "1/10" and plan["runs_remaining"] == 5
    assert plan["charge_per_run_as_epsilon"] > 0
    assert all("charge_as_epsilon" in step for step in plan["steps"])
    table = runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--url", url])
    assert "5 more run(s)" in table.output
    assert ledger.account("census_adult").spent == 0 and ledger.charges() == []


def test_plan_refuses_a_spec_the_account_cannot_be_charged_for(tmp_path):
    make_ledger(tmp_path / "pure.db", accountant="pure_dp", cap="5")
    result = runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--url", f"sqlite:///{tmp_path / 'pure.db'}"])
    assert result.exit_code == 1 and "pure_dp" in result.output
