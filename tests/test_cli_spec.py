"""``dpctl spec validate`` and ``dpctl spec plan``: public parameters only, nothing read, nothing spent."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

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


def test_validate_plans_the_spec_and_refuses_what_the_release_would(tmp_path):
    """A spec whose float sums cannot carry its grid is valid YAML and a valid model, but every release would be
    refused at plan time: validate says so now, with the aggregate's name."""
    spec = tmp_path / "float.yaml"
    spec.write_text(EXAMPLE_SPEC.read_text().replace(
        "    bounds: [1, 99]",
        "    bounds: [0, 1]\n    grid: 0.001\n    upstream: {arithmetic: binary64, max_rows: 1000000000000000}",
    ))
    result = runner.invoke(app, ["spec", "validate", str(spec)])
    assert result.exit_code != 0
    assert "the spec cannot be planned" in result.output and "mean_hours_per_week" in result.output


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
    # rho 0.045 (Gaussian) + Laplace epsilons 0.3, 0.1, 0.1 charged eps * tanh(eps / 2) (docs/adr/0015)
    expected = 0.045 + sum(eps * math.tanh(eps / 2) for eps in (0.3, 0.1, 0.1))
    assert float(Fraction(plan["charge_per_run"])) == pytest.approx(expected, rel=1e-9)
    assert plan["runs_remaining"] == 5  # floor(0.5 / 0.0997)
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


def _auto_spec(tmp_path, budget: str = "{epsilon: 1, delta: 1e-6}", extra: str = "") -> str:
    path = tmp_path / "auto.yaml"
    path.write_text(f"""
version: 1
release: auto_choice
budget_account: census_adult
privacy_unit: person
aggregates:
  - name: visits
    kind: count
    mechanism: auto
    budget: {budget}
{extra}""")
    return str(path)


def test_plan_chooses_auto_by_the_accountant_given_and_says_when_none_is(tmp_path, monkeypatch):
    """(epsilon 1, delta 1e-6) on one count: on a zCDP account the Gaussian costs rho ~0.028 where the Laplace
    costs ~0.46, so auto picks it; without an accountant auto compares at the written budget (the Laplace)."""
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    spec = _auto_spec(tmp_path)
    planned = json.loads(runner.invoke(app, ["spec", "plan", spec, "--accountant", "zcdp", "--json"]).output)
    assert planned["accountant"] == "zcdp" and planned["steps"][0]["mechanism"] == "discrete_gaussian"
    assert Fraction(planned["charge_per_run"]) < Fraction(3, 100) and "runs_remaining" not in planned
    unplanned = runner.invoke(app, ["spec", "plan", spec])
    assert unplanned.exit_code == 0 and "discrete_laplace" in unplanned.output
    assert "no accountant given" in unplanned.output and "written budgets" in unplanned.output


def test_plan_reads_the_accountant_from_the_ledger_configuration_or_the_ledger(tmp_path, monkeypatch):
    from support import REPO

    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    spec = _auto_spec(tmp_path)
    config = str(REPO / "config" / "ledgers.yaml")  # census_adult: zcdp, delta 1e-6
    result = runner.invoke(app, ["spec", "plan", spec, "--ledger-config", config, "--json"])
    assert result.exit_code == 0, result.output
    planned = json.loads(result.output)
    assert planned["accountant"] == "zcdp" and planned["steps"][0]["mechanism"] == "discrete_gaussian"
    assert planned["delta"] == 1e-6 and planned["charge_per_run_as_epsilon"] is not None
    clash = runner.invoke(app, ["spec", "plan", spec, "--ledger-config", config, "--accountant", "approx_dp"])
    assert clash.exit_code == 1 and "--accountant approx_dp disagrees" in clash.output
    make_ledger(tmp_path / "z.db", cap="1")
    table = runner.invoke(app, ["spec", "plan", spec, "--url", f"sqlite:///{tmp_path / 'z.db'}"])
    assert table.exit_code == 0 and "charge per run (zcdp): rho 0.0279" in table.output
    assert "35 more run(s)" in table.output  # floor(1 / 0.0279)


def test_plan_refuses_a_float_spec_that_cannot_be_released_as_planned(tmp_path, monkeypatch):
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    spec = tmp_path / "float.yaml"
    spec.write_text("""
version: 1
release: float_sum
budget_account: census_adult
privacy_unit: person
aggregates:
  - name: revenue
    kind: sum
    bounds: [0, 1]
    mechanism: discrete_laplace
    budget: {epsilon: 1}
    upstream: {arithmetic: binary64, max_rows: 1000000000000000}
""")
    result = runner.invoke(app, ["spec", "plan", str(spec)])
    assert result.exit_code == 1
    assert str(spec) in result.output and "aggregate 'revenue' (sum)" in result.output
    assert "Lower upstream.max_rows" in result.output


def test_plan_shows_l0_capped_by_the_partitions(tmp_path, monkeypatch):
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    spec = _auto_spec(tmp_path, "{epsilon: 1}", "    group_by: [k]\n    keys: {k: [a, b]}\n"
                                               "    contribution: {max_partitions_contributed: 5}\n")
    planned = json.loads(runner.invoke(app, ["spec", "plan", spec, "--json"]).output)
    step = planned["steps"][0]
    assert step["noise"]["max_partitions_contributed"] == 2 and step["scale"] == "b = 2"
    assert step["l0"].startswith("2 (declared 5")


def test_plan_on_an_approx_dp_account_shows_the_delta_each_run_spends(tmp_path):
    """Partition selection spends delta; on an approx_dp account the plan must say how much per run (basic
    composition adds it to the account's delta total), not only the account's configured delta."""
    spec = tmp_path / "selection.yaml"
    spec.write_text(
        "version: 1\nrelease: r\nbudget_account: a\nprivacy_unit: person\naggregates:\n"
        "  - {name: g, kind: count, group_by: [k], mechanism: discrete_laplace, budget: {epsilon: 1},\n"
        "     partition_selection: {budget: {epsilon: 1, delta: 1e-6}}}\n"
    )
    result = runner.invoke(app, ["spec", "plan", str(spec), "--accountant", "approx_dp", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    spent = Fraction(summary["delta_per_run"])
    assert 0 < spent <= Fraction(1, 10**6)  # the threshold's delta, at most the budget's (rounded threshold)
