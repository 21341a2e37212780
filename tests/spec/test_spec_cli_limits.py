"""``dpctl spec validate`` / ``dpctl spec plan`` on YAML 1.1 traps and out-of-range
sensitivity numbers end as a one-line-per-problem message and exit code 1, never a Python traceback."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dp_operators.cli import app

runner = CliRunner()

HEADER = """\
version: 1
release: cli_limits
budget_account: census_adult
privacy_unit: person
"""


def write(tmp_path, body: str):
    path = tmp_path / "spec.yaml"
    path.write_text(HEADER + body)
    return path


def test_validate_refuses_the_1e300_contribution_bound_without_a_traceback(tmp_path):
    path = write(tmp_path, """\
contribution: {max_contributions_per_partition: 1e300}
aggregates:
  - {name: visits, kind: count, mechanism: discrete_laplace, budget: {epsilon: 1}}
""")
    for command in ("validate", "plan"):
        result = runner.invoke(app, ["spec", command, str(path)])
        assert result.exit_code == 1, result.output
        assert "contribution.max_contributions_per_partition: must be a whole number from 1 to 1,000,000" in (
            result.output
        )
        assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output


def test_validate_names_the_grid_that_fits(tmp_path):
    path = write(tmp_path, """\
aggregates:
  - {name: revenue, kind: sum, bounds: [0, 1e12], grid: 0.01, mechanism: auto, budget: {epsilon: 1}}
""")
    result = runner.invoke(app, ["spec", "validate", str(path)])
    assert result.exit_code == 1
    assert "aggregates[0](revenue).grid:" in result.output and "use a grid of at least 1," in result.output


def test_validate_refuses_a_zip_code_written_as_a_number(tmp_path):
    path = write(tmp_path, """\
aggregates:
  - name: people
    kind: count
    group_by: [zip]
    keys: {zip: [02139, '02140']}
    mechanism: discrete_laplace
    budget: {epsilon: 1}
""")
    result = runner.invoke(app, ["spec", "validate", str(path)])
    assert result.exit_code == 1
    assert "aggregates[0](people).keys.zip[0]: 02139 is ambiguous" in result.output
    assert "quote it ('02139')" in result.output


def test_plan_at_the_limits_and_with_yes_no_keys(tmp_path, monkeypatch):
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    path = write(tmp_path, """\
contribution: {max_partitions_contributed: 10000, max_contributions_per_partition: 1000000}
aggregates:
  - name: married
    kind: count
    group_by: [married]
    keys: {married: [yes, no]}
    mechanism: discrete_gaussian
    budget: {rho: 0.5}
  - {name: total, kind: sum, bounds: [0, 1000], grid: 1, mechanism: auto, budget: {epsilon: 1, delta: 1e-6}}
""")
    result = runner.invoke(app, ["spec", "plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    steps = {step["aggregate"]: step for step in json.loads(result.output)["steps"]}
    assert steps["married"]["partitions"] == 2  # the two text keys, each released
    assert steps["total"]["l1_sensitivity"] == 10**9  # 10^6 contributions of at most 1000, L0 capped at 1
