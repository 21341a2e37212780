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


def test_a_message_with_square_brackets_is_printed_verbatim(tmp_path):
    bad = tmp_path / "no_bounds.yaml"
    text = EXAMPLE_SPEC.read_text()
    assert "    bounds: [1, 99]" in text
    bad.write_text(text.replace("    bounds: [1, 99]", ""))
    result = runner.invoke(app, ["spec", "validate", str(bad)])
    assert result.exit_code == 1
    assert "needs clipping 'bounds: [lower, upper]'" in result.output


def test_plan_reports_a_privacy_unit_the_account_does_not_protect(tmp_path):
    make_ledger(tmp_path / "unit.db")
    spec = tmp_path / "household.yaml"
    spec.write_text(EXAMPLE_SPEC.read_text().replace("privacy_unit: person", "privacy_unit: household", 1))
    for extra in ([], ["--json"]):
        result = runner.invoke(app, ["spec", "plan", str(spec), "--url", f"sqlite:///{tmp_path / 'unit.db'}", *extra])
        assert result.exit_code == 1, result.output
        assert "budget account 'census_adult' is for privacy unit 'person' but the spec protects 'household'" in (
            result.output
        )
        assert "ReleaseConfigError" in result.output and "more run" not in result.output


def test_piped_tables_use_columns_and_default_wider_than_120(tmp_path):
    """Not a terminal: COLUMNS sets the width (a long release name is not truncated); without it, 160."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    dpctl = Path(sys.executable).with_name("dpctl")
    name = "people_by_education_and_sex_of_every_adult_in_the_census_table"
    spec = tmp_path / "long.yaml"
    spec.write_text(EXAMPLE_SPEC.read_text().replace("name: people_by_education_sex", f"name: {name}"))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "DP_LEDGER_URL")}
    wide = subprocess.run([dpctl, "spec", "plan", str(spec)], env={**env, "COLUMNS": "300"}, capture_output=True,
                          text=True, check=True)
    assert name in wide.stdout
    assert max(len(line) for line in wide.stdout.splitlines()) > 160
    default = subprocess.run([dpctl, "spec", "plan", str(spec)], env=env, capture_output=True, text=True, check=True)
    assert max(len(line) for line in default.stdout.splitlines()) == 160
