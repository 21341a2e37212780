"""``dpctl spec validate`` and ``dpctl spec plan``: public parameters only, nothing read, nothing spent."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from typer.testing import CliRunner

from dp_operators.cli import app

from support import EXAMPLE_SPEC, EXAMPLE_SUM_LINF, discrete_laplace_kl_reference, make_ledger

runner = CliRunner()


@pytest.fixture(autouse=True)
def piped_output_without_columns(monkeypatch):
    """Plans print as to a pipe without COLUMNS (pytest-xdist workers have COLUMNS=80, which folds tables)."""
    _plan_console(monkeypatch, None)


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
    ledger = make_ledger(tmp_path / "plan.db", cap="3/5")  # the example account's cap (config/ledgers.yaml)
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    result = runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--url", url, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    # rho 0.045 (Gaussian) + Laplace counts at epsilons 0.3, 0.1 charged eps * tanh(eps / 2), + the mean's sum at
    # epsilon 0.1 over 49 grid units charged its own KL (docs/adr/0015), + the median's exponential mechanism at
    # epsilon 0.4 charged as bounded range, 0.4^2 / 8 (docs/mechanisms.md)
    expected = 0.045 + sum(eps * math.tanh(eps / 2) for eps in (0.3, 0.1))
    expected += float(discrete_laplace_kl_reference(Fraction(1, 10), EXAMPLE_SUM_LINF))
    expected += 0.4**2 / 8
    assert float(Fraction(plan["charge_per_run"])) == pytest.approx(expected, rel=1e-9)
    assert plan["runs_remaining"] == 5  # floor(0.6 / 0.1195)
    assert plan["charge_per_run_as_epsilon"] > 0
    assert all("charge_as_epsilon" in step for step in plan["steps"])
    table = runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--url", url])
    assert "5 more run(s)" in table.output
    assert ledger.account("census_adult").spent == 0 and list(ledger.charges()) == []


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


def _plan_console(monkeypatch, columns: str | None):
    """The plan's console as a fresh ``dpctl`` process would make it with output to a pipe and ``COLUMNS``."""
    from rich.console import Console

    from dp_operators.cli import common
    from dp_operators.cli import spec as spec_cli

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr(spec_cli, "console", Console(width=common._output_width(), markup=False))


def test_piped_plan_tables_keep_long_names_whole(tmp_path, monkeypatch):
    """Output that is not a terminal, without COLUMNS: the table is as wide as its cells, no name is cut."""
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    name = "people_by_education_and_sex_of_every_adult_in_the_census_table_" + "x" * 120
    spec = tmp_path / "long.yaml"
    spec.write_text(EXAMPLE_SPEC.read_text().replace("name: people_by_education_sex", f"name: {name}"))
    result = runner.invoke(app, ["spec", "plan", str(spec)])
    assert result.exit_code == 0, result.output
    assert name in result.output and "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) > 160


def test_piped_plan_tables_fold_long_names_at_the_columns_asked_for(tmp_path, monkeypatch):
    """With COLUMNS set, the table fits it and a long name folds onto more lines instead of being cut."""
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    _plan_console(monkeypatch, "100")
    name = "people_by_education_and_sex_of_every_adult_in_the_census_table"
    spec = tmp_path / "long.yaml"
    spec.write_text(EXAMPLE_SPEC.read_text().replace("name: people_by_education_sex", f"name: {name}"))
    result = runner.invoke(app, ["spec", "plan", str(spec)])
    assert result.exit_code == 0, result.output
    table = [line for line in result.output.splitlines() if line.startswith("│")]
    assert max(len(line) for line in table) <= 100 and "…" not in result.output
    first_column = "".join(line.split("│")[1].strip() for line in table)
    assert name in first_column


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


def test_command_line_options_win_over_the_ledger_in_the_environment(tmp_path, monkeypatch):
    """--accountant, --ledger-config and --url win over DP_LEDGER_URL (as scripts/demo_env.sh exports it)."""
    from support import REPO

    make_ledger(tmp_path / "env.db", cap="1")  # census_adult: zcdp
    monkeypatch.setenv("DP_LEDGER_URL", f"sqlite:///{tmp_path / 'env.db'}")
    spec = _auto_spec(tmp_path)
    given = runner.invoke(app, ["spec", "plan", spec, "--accountant", "approx_dp", "--json"])
    assert given.exit_code == 0, given.output
    planned = json.loads(given.output)
    assert planned["accountant"] == "approx_dp" and "runs_remaining" not in planned
    config = tmp_path / "ledgers.yaml"
    config.write_text((REPO / "config" / "ledgers.yaml").read_text().replace("accountant: zcdp", "accountant: pure_dp")
                      .replace("delta: 1e-6", "").replace("cap: 0.5 ", "cap: 5 "))
    from_config = runner.invoke(app, ["spec", "plan", spec, "--ledger-config", str(config), "--json"])
    assert from_config.exit_code == 0, from_config.output
    assert json.loads(from_config.output)["accountant"] == "pure_dp"
    make_ledger(tmp_path / "url.db", cap="3", accountant="pure_dp")
    from_url = runner.invoke(app, ["spec", "plan", spec, "--url", f"sqlite:///{tmp_path / 'url.db'}", "--json"])
    assert json.loads(from_url.output)["accountant"] == "pure_dp" and json.loads(from_url.output)["remaining"] == "3"
    from_environment = json.loads(runner.invoke(app, ["spec", "plan", spec, "--json"]).output)
    assert from_environment["accountant"] == "zcdp" and from_environment["runs_remaining"] == 35


def test_plan_shows_a_means_half_width_as_a_function_of_its_private_count(monkeypatch):
    """A mean's half-width is planned as W / n (its count is private), and bounds what publication computes."""
    from dp_operators.release import plan_release
    from dp_operators.release.publish import _fieller_mean_interval, _half_width_around, fieller_table
    from dp_operators.spec import load_spec

    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    plan = json.loads(runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--json"]).output)
    [mean] = plan["means"]
    assert mean["aggregate"] == "mean_hours_per_week" and mean["half_width"] is None
    width = mean["half_width_times_rows"]
    at_rows = json.loads(runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--rows", "1000", "--json"]).output)
    assert at_rows["means"][0]["half_width"] == pytest.approx(width / 1000)
    engine = plan_release(load_spec(EXAMPLE_SPEC))
    table = fieller_table("mean", [engine.step("mean_hours_per_week", c) for c in ("sum", "count")], 49.0, 0.05)
    for centred_mean in (-49.0, -10.0, 0.0, 30.0):  # bounds [1, 99]: centred at 50, half-range 49
        published = _half_width_around(centred_mean, *_fieller_mean_interval(centred_mean * 1000, 1000, table))
        assert published <= width / 1000
    text = runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC)]).output
    assert "a mean's for n rows" in text and f"{width:.4g} / n" in text and "--rows n" in text
    rows_text = runner.invoke(app, ["spec", "plan", str(EXAMPLE_SPEC), "--rows", "48842"]).output
    assert "a mean's for n = 48842 rows" in rows_text and f"{width / 48842:.4g}" in rows_text


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


GAUSSIAN = "mechanism: discrete_gaussian, budget: {epsilon: 1, delta: 4e-7}"


def _count_spec(tmp_path, noise: str = GAUSSIAN, name: str = "gaussian.yaml") -> str:
    """One count on census_adult. By default the discrete Gaussian at (epsilon 1, delta 4e-7): on an approx_dp
    account each run is charged epsilon 1 and delta 4e-7 (the exact profile's delta)."""
    path = tmp_path / name
    path.write_text(
        "version: 1\nrelease: visits\nbudget_account: census_adult\nprivacy_unit: person\naggregates:\n"
        f"  - {{name: visits, kind: count, {noise}}}\n"
    )
    return str(path)


def _reserve_run(ledger, run: int, amount, delta):
    """Reserve one run of the count spec on census_adult, as a release would (the spender's real reserve)."""
    from dp_operators.ledger import ReleaseKey

    return ledger.reserve(ReleaseKey("adult_census_release", f"run-{run}", "t", -1, "visits"), account="census_adult",
                          amount=amount, delta=delta, mechanisms=[{"mechanism": "discrete_gaussian"}],
                          spec_hash="0" * 64)


def test_plan_counts_runs_in_delta_when_the_delta_cap_admits_fewer(tmp_path):
    """Epsilon 6 left funds 6 runs at epsilon 1, but the delta cap 1e-6 funds only 2 at 4e-7 each;
    the plan says 2, names delta as the limit, prints the run's delta (not the cap), and the ledger agrees: two
    reservations of the planned charge go through and the third is refused for delta."""
    from dp_operators.ledger import BudgetExhaustedError

    ledger = make_ledger(tmp_path / "approx.db", accountant="approx_dp", cap="6")
    url = f"sqlite:///{tmp_path / 'approx.db'}"
    spec = _count_spec(tmp_path)
    result = runner.invoke(app, ["spec", "plan", spec, "--url", url, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    charge, delta = Fraction(plan["charge_per_run"]), Fraction(plan["delta_per_run"])
    assert (charge, delta) == (1, Fraction(4, 10**7))
    assert Fraction(plan["remaining"]) // charge == 6  # epsilon alone would promise 6
    assert plan["runs_remaining"] == 2 and plan["runs_limited_by"] == "delta"
    assert plan["delta"] == 4e-7 and Fraction(plan["delta_remaining"]) == Fraction(1, 10**6)
    table = runner.invoke(app, ["spec", "plan", spec, "--url", url])
    assert table.exit_code == 0, table.output
    assert "charge per run (approx_dp): epsilon 1, delta 4e-07;" in table.output
    assert "has epsilon 6 and delta 1e-06 left: 2 more run(s) (limited by delta)" in table.output
    assert "6 more run(s)" not in table.output
    for run in range(2):
        _reserve_run(ledger, run, charge, delta)
    with pytest.raises(BudgetExhaustedError, match="delta"):
        _reserve_run(ledger, 2, charge, delta)
    after = json.loads(runner.invoke(app, ["spec", "plan", spec, "--url", url, "--json"]).output)
    assert (after["runs_remaining"], after["runs_limited_by"], after["remaining"]) == (0, "delta", "4")


def test_plan_counts_runs_in_epsilon_when_epsilon_admits_fewer(tmp_path):
    """Negative control: the same spec on an account with epsilon 1.5 left: epsilon funds 1 run, delta 2; the plan
    says 1 and does not blame delta."""
    make_ledger(tmp_path / "approx.db", accountant="approx_dp", cap="3/2")
    url = f"sqlite:///{tmp_path / 'approx.db'}"
    spec = _count_spec(tmp_path)
    plan = json.loads(runner.invoke(app, ["spec", "plan", spec, "--url", url, "--json"]).output)
    assert Fraction(plan["delta_remaining"]) // Fraction(plan["delta_per_run"]) == 2
    assert plan["runs_remaining"] == 1 and plan["runs_limited_by"] == "epsilon"
    table = runner.invoke(app, ["spec", "plan", spec, "--url", url])
    assert table.exit_code == 0, table.output
    assert "left: 1 more run(s)" in table.output and "limited by" not in table.output


def test_plan_a_pure_spec_is_not_limited_by_spent_delta(tmp_path):
    """A dimension a run does not charge does not limit: with the whole delta cap spent, a Laplace-only spec (delta 0
    per run) still has its epsilon runs, while a spec that spends delta has none."""
    ledger = make_ledger(tmp_path / "approx.db", accountant="approx_dp", cap="6")
    url = f"sqlite:///{tmp_path / 'approx.db'}"
    _reserve_run(ledger, 0, Fraction(1), Fraction(1, 10**6))
    pure = _count_spec(tmp_path, "mechanism: discrete_laplace, budget: {epsilon: 1}", "laplace.yaml")
    plan = json.loads(runner.invoke(app, ["spec", "plan", pure, "--url", url, "--json"]).output)
    assert (plan["delta_per_run"], plan["delta_remaining"]) == ("0", "0")
    assert plan["runs_remaining"] == 5 and plan["runs_limited_by"] == "epsilon"
    spending = json.loads(runner.invoke(app, ["spec", "plan", _count_spec(tmp_path), "--url", url, "--json"]).output)
    assert spending["runs_remaining"] == 0 and spending["runs_limited_by"] == "delta"


BINARY64_SPEC = """
version: 1
release: binary64_hours
budget_account: acct
privacy_unit: person
aggregates:
  - name: hours
    kind: sum
    group_by: [band]
    keys: {band: [a, b, c, d, e, f, g, h, i, j]}
    bounds: [0, 100]
    grid: 0.01
    upstream: {arithmetic: binary64, max_rows: 1000000}
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""


def test_plan_table_states_the_binary64_allowance_of_untouched_partitions(tmp_path):
    """The plan's table says what the binary64 allowance adds: Linf per touched partition and the allowance in each
    of the P - L0 untouched partitions that L1 and L2 include, as --json records it."""
    spec = tmp_path / "binary64.yaml"
    spec.write_text(BINARY64_SPEC)
    table = runner.invoke(app, ["spec", "plan", str(spec), "--accountant", "zcdp"])
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())
    assert "+3 grid unit(s) of Linf in each touched partition, +3 in each of the 9 untouched partitions" in text
    described = json.loads(runner.invoke(app, ["spec", "plan", str(spec), "--json"]).output)["steps"][0]["noise"]
    assert (described["untouched_partition_allowance_grid_units"], described["untouched_partitions"]) == (3, 9)
    assert described["l1_sensitivity"] == pytest.approx((10003 + 9 * 3) * 0.01)
