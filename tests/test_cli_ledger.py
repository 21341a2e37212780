"""``dpctl ledger ...``: init, apply, show, history, verify, export, on SQLite and PostgreSQL; exit codes."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import Ledger, ReleaseKey
from ledger_backends import ledger_url, pg_database  # noqa: F401  (fixtures)

DPCTL = Path(sys.executable).with_name("dpctl")

CONFIG = """\
version: 1
accounts:
  census:
    accountant: gaussian_dp
    epsilon: 1
    delta: 1e-6
    privacy_unit: person
    allowed_dags: [d]
  survey:
    accountant: approx_dp
    cap: 2
    delta: 1e-5
    privacy_unit: household
    allowed_dags: [d]
"""


def dpctl(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "ledgers.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def applied(ledger_url, config) -> str:
    assert dpctl("ledger", "init", "--url", ledger_url).exit_code == 0
    assert dpctl("ledger", "apply", str(config), "--url", ledger_url).exit_code == 0
    ledger = Ledger(ledger_url)
    for run in range(2):
        reservation = ledger.reserve(ReleaseKey("d", f"run-{run}", "t", -1, "r"), account="census",
                                     amount=Fraction(1, 400), mechanisms=[{"mechanism": "discrete_gaussian"}],
                                     spec_hash="0" * 64)
        ledger.commit(reservation, {"value": run})
    return ledger_url


def test_init_then_apply_then_apply_again_is_no_change(ledger_url, config):
    result = dpctl("ledger", "init", "--url", ledger_url)
    assert result.exit_code == 0 and "ledger schema version 2 ready" in result.output
    result = dpctl("ledger", "apply", str(config), "--url", ledger_url)
    assert result.exit_code == 0, result.output
    assert "created account 'census' (gaussian_dp" in result.output
    assert dpctl("ledger", "apply", str(config), "--url", ledger_url).output.strip() == "no change"


def test_show_reports_every_unit_and_epsilon(applied):
    result = dpctl("ledger", "show", "--url", applied, "--json")
    assert result.exit_code == 0, result.output
    rows = {row["account"]: row for row in json.loads(result.output)}
    census = rows["census"]
    assert census["unit"] == "mu_squared" and Fraction(census["spent"]) == Fraction(2, 400)
    assert census["spent_mu"] == pytest.approx((2 / 400) ** 0.5)
    assert census["cap_epsilon"] == pytest.approx(1, abs=1e-6)
    assert rows["survey"]["delta_spent"] == "0" and rows["survey"]["cap_epsilon"] == 2
    table = dpctl("ledger", "show", "--url", applied)
    assert table.exit_code == 0 and "census" in table.output and "gaussian_dp" in table.output


def test_history_filters_and_prints_json_lines(applied):
    result = dpctl("ledger", "history", "--url", applied, "--account", "census", "--json")
    assert result.exit_code == 0
    charges = [json.loads(line) for line in result.output.splitlines()]
    assert [c["run_id"] for c in charges] == ["run-0", "run-1"] and "output" not in charges[0]
    assert dpctl("ledger", "history", "--url", applied, "--since", "2999-01-01", "--json").output == ""
    bad = dpctl("ledger", "history", "--url", applied, "--since", "yesterday")
    assert bad.exit_code == 2


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_the_audit_log(applied, fmt, tmp_path):
    target = tmp_path / f"audit.{fmt}"
    result = dpctl("ledger", "export", "--url", applied, "--format", fmt, "--output", str(target))
    assert result.exit_code == 0, result.output
    text = target.read_text()
    rows = [json.loads(line) for line in text.splitlines()] if fmt == "jsonl" else list(csv.DictReader(io.StringIO(text)))
    assert [r["event"] for r in rows] == ["account_created", "account_created", "reserved", "committed",
                                          "reserved", "committed"]
    assert all(len(r["row_hash"]) == 64 for r in rows)
    charges = dpctl("ledger", "export", "--url", applied, "--what", "charges")
    assert len(charges.output.splitlines()) == 2


def test_verify_passes_on_an_untouched_ledger(applied):
    result = dpctl("ledger", "verify", "--url", applied)
    assert result.exit_code == 0 and "ledger consistent: 6 audit events" in result.output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        pytest.param(["ledger", "show"], 1, "say which ledger", id="no ledger named"),
        pytest.param(["ledger", "export", "--format", "xml", "--url", "sqlite://"], 2, "use jsonl or csv",
                     id="unknown export format"),
        pytest.param(["ledger", "frobnicate"], 2, "No such command", id="unknown command"),
    ],
)
def test_exit_codes(args, code, message, monkeypatch):
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    result = dpctl(*args)
    assert result.exit_code == code
    assert message in result.output + result.stderr


def test_uninitialised_ledger_and_bad_config_exit_1(ledger_url, tmp_path):
    result = dpctl("ledger", "show", "--url", ledger_url)
    assert result.exit_code == 1 and "dpctl ledger init" in result.stderr
    dpctl("ledger", "init", "--url", ledger_url)
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.replace("    epsilon: 1\n", ""))
    result = dpctl("ledger", "apply", str(bad), "--url", ledger_url)
    assert result.exit_code == 1 and "accounts.census" in result.stderr


def test_lowering_a_cap_below_spend_is_refused(applied, config):
    config.write_text(CONFIG.replace("    epsilon: 1\n", "    cap: 0.0001\n"))
    result = dpctl("ledger", "apply", str(config), "--url", applied)
    assert result.exit_code == 1 and "already spent" in result.stderr


@pytest.mark.parametrize("command", [[], ["ledger"], *[["ledger", c] for c in
                                     ("init", "apply", "show", "history", "verify", "export")]])
def test_every_command_has_help(command):
    result = dpctl(*command, "--help")
    assert result.exit_code == 0 and "Usage" in result.output


def test_conn_id_from_an_airflow_environment_connection_in_a_real_shell(applied):
    """``--conn-id`` resolves ``AIRFLOW_CONN_<ID>`` as Airflow does, from a plain shell (a real process)."""
    env = {**os.environ, "AIRFLOW_CONN_PRIVACY_LEDGER": json.dumps({"conn_type": "dp_ledger",
                                                                     "extra": {"url": applied}})}
    env.pop("DP_LEDGER_URL", None)
    done = subprocess.run([str(DPCTL), "ledger", "verify", "--conn-id", "privacy_ledger"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ledger consistent" in done.stdout
    missing = subprocess.run([str(DPCTL), "ledger", "show", "--conn-id", "nope"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "AIRFLOW_CONN_NOPE" in missing.stderr


def test_changing_the_privacy_unit_of_a_charged_account_is_refused(applied, config):
    config.write_text(CONFIG.replace("privacy_unit: person", "privacy_unit: household"))
    result = dpctl("ledger", "apply", str(config), "--url", applied)
    assert result.exit_code == 1
    assert "account 'census': the privacy unit is fixed" in result.stderr
    assert "Create a new account instead" in result.stderr
    assert Ledger(applied).account("census").privacy_unit == "person"


def test_a_changed_accountant_is_reported_before_the_delta_it_no_longer_takes(applied, config):
    # gaussian_dp -> pure_dp with the delta left in: the accountant change is the problem to fix.
    config.write_text(CONFIG.replace("accountant: gaussian_dp\n    epsilon: 1", "accountant: pure_dp\n    epsilon: 1"))
    result = dpctl("ledger", "apply", str(config), "--url", applied)
    assert result.exit_code == 1
    assert "account 'census': the accountant is fixed at creation (gaussian_dp)" in result.stderr
    assert "has no delta" not in result.stderr


def test_an_unknown_key_in_ledgers_yaml_is_named_as_such(ledger_url, config):
    dpctl("ledger", "init", "--url", ledger_url)
    config.write_text(CONFIG.replace("allowed_dags: [d]\n  survey", "alowed_dags: [d]\n  survey"))
    result = dpctl("ledger", "apply", str(config), "--url", ledger_url)
    assert result.exit_code == 1
    assert "accounts.census.alowed_dags: unknown field (check the spelling; see docs/ledger.md)" in result.stderr
    assert "Extra inputs" not in result.stderr


def test_history_state_must_be_a_known_state(applied):
    result = dpctl("ledger", "history", "--url", applied, "--state", "bogus")
    assert result.exit_code == 2
    for state in ("reserved", "committed", "released", "abandoned"):
        assert state in result.output
    result = dpctl("ledger", "history", "--url", applied, "--state", "committed", "--json")
    assert result.exit_code == 0 and len(result.output.splitlines()) == 2


@pytest.mark.parametrize(
    "command",
    [["ledger", "show"], ["ledger", "history"], ["ledger", "verify"], ["ledger", "export"], ["ledger", "apply", "X"],
     ["spec", "plan", "SPEC"]],
)
def test_commands_other_than_init_do_not_create_a_missing_sqlite_ledger(command, config, tmp_path):
    from support import EXAMPLE_SPEC

    path = tmp_path / "typo.db"
    args = [str(config) if a == "X" else str(EXAMPLE_SPEC) if a == "SPEC" else a for a in command]
    result = dpctl(*args, "--url", f"sqlite:///{path}")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: no ledger at {path}; run 'dpctl ledger init --url sqlite:///{path}' first"
    )
    assert not path.exists()
    assert dpctl("ledger", "init", "--url", f"sqlite:///{path}").exit_code == 0 and path.exists()


def test_error_messages_are_printed_verbatim_not_as_rich_markup(tmp_path):
    missing = tmp_path / "bounds: [lower, upper] [red]x[/red].json"
    result = dpctl("release", "show", str(missing))
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: no such file: {missing}"
