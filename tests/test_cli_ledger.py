"""``dpctl ledger ...``: keygen, init, apply, show, verify, reconcile, export, roles, on SQLite and PostgreSQL; keys
from files, the environment and the Airflow connection; exit codes. ``history``: test_cli_ledger_history.py."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import time
import uuid
from fractions import Fraction

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from cli_ledger_support import (  # noqa: F401  (fixtures)
    CONFIG,
    DPCTL,
    NO_KEYS,
    applied,
    charge,
    config,
    dpctl,
    key_file,
    no_keys,
    officer_keys,
)
from dp_operators.cli import app
from dp_operators.ledger import AuditKey, Ledger
from ledger_backends import SQLITE_FAST
from ledger_backends import ledger_url, pg_database  # noqa: F401  (fixtures)
from support import GOVERNOR_KEY, SPEND_KEY, spender


def test_init_then_apply_then_apply_again_is_no_change(ledger_url, config):
    result = dpctl("ledger", "init", "--url", ledger_url)
    assert result.exit_code == 0 and "ledger schema version 4 ready" in result.output
    result = dpctl("ledger", "apply", str(config), "--url", ledger_url)
    assert result.exit_code == 0, result.output
    assert "created account 'census' (gaussian_dp" in result.output
    assert dpctl("ledger", "apply", str(config), "--url", ledger_url).output.strip() == "no change"
    assert Ledger(ledger_url).account("census").spend_key_id == SPEND_KEY.key_id


def test_keygen_prints_a_fresh_key_and_where_each_role_keeps_it():
    first, second = dpctl("ledger", "keygen"), dpctl("ledger", "keygen")
    assert first.exit_code == 0
    key = first.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", key) and key != second.stdout.strip()
    assert AuditKey.from_text(key).text == key
    assert len(first.stderr.strip().splitlines()) == 1
    assert "governor" in first.stderr and '"audit_key"' in first.stderr


def test_apply_without_the_governor_key_is_refused(ledger_url, config, monkeypatch):
    dpctl("ledger", "init", "--url", ledger_url)
    monkeypatch.delenv("DP_LEDGER_GOVERNOR_KEY")
    result = dpctl("ledger", "apply", str(config), "--url", ledger_url)
    assert result.exit_code == 1
    assert "governor key: give --governor-key-file FILE or set DP_LEDGER_GOVERNOR_KEY" in result.stderr
    assert Ledger(ledger_url).accounts() == []


def test_creating_an_account_needs_the_spend_key(ledger_url, config, monkeypatch):
    dpctl("ledger", "init", "--url", ledger_url)
    monkeypatch.delenv("DP_LEDGER_AUDIT_KEY")
    result = dpctl("ledger", "apply", str(config), "--url", ledger_url)
    assert result.exit_code == 1
    assert "account 'census' is new: give the spend key" in result.stderr
    assert Ledger(ledger_url).accounts() == []


def test_key_files_give_the_keys_and_a_loose_file_is_warned_about(ledger_url, config, tmp_path, monkeypatch):
    no_keys(monkeypatch)
    governor = key_file(tmp_path / "governor.key", GOVERNOR_KEY)
    spend = key_file(tmp_path / "spend.key", SPEND_KEY)
    keys = ["--governor-key-file", str(governor), "--audit-key-file", str(spend)]
    assert dpctl("ledger", "init", "--url", ledger_url).exit_code == 0
    result = dpctl("ledger", "apply", str(config), "--url", ledger_url, *keys)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    charge(spender(ledger_url), "run-0")
    result = dpctl("ledger", "verify", "--url", ledger_url, *keys)
    assert result.exit_code == 0, result.output
    assert "ledger consistent: 4 audit events, 2 accounts, 1 charges; every event authenticated" in result.stdout
    spend.chmod(0o644)
    result = dpctl("ledger", "verify", "--url", ledger_url, *keys)
    assert result.exit_code == 0 and f"warning: {spend} can be read by other users" in result.stderr


def test_apply_with_another_spend_key_prints_both_key_ids_and_what_the_workers_need(applied, config, monkeypatch):
    """Re-keying an account is never silent: apply names the old and new spend key ids and what workers must hold."""
    other = AuditKey.generate()
    monkeypatch.setenv("DP_LEDGER_AUDIT_KEY", other.text)
    result = dpctl("ledger", "apply", str(config), "--url", applied)
    assert result.exit_code == 0, result.output
    assert (f"updated account 'census': spend key id {SPEND_KEY.key_id} -> {other.key_id} (workers' charges need "
            "the new spend key in their ledger connection") in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("", "holds no key (make one with 'dpctl ledger keygen')", id="empty file"),
        pytest.param("short\n", "line 1: an audit key needs at least 32 characters", id="a key too short"),
    ],
)
def test_a_bad_key_file_exits_1_without_showing_the_key(ledger_url, tmp_path, content, message):
    dpctl("ledger", "init", "--url", ledger_url)
    path = tmp_path / "governor.key"
    path.write_text(content)
    result = dpctl("ledger", "verify", "--url", ledger_url, "--governor-key-file", str(path))
    assert result.exit_code == 1 and message in result.stderr
    missing = dpctl("ledger", "verify", "--url", ledger_url, "--governor-key-file", str(tmp_path / "nope"))
    assert missing.exit_code == 1 and "cannot read --governor-key-file" in missing.stderr


def test_a_short_key_in_the_environment_is_named_by_its_variable(applied, monkeypatch):
    monkeypatch.setenv("DP_LEDGER_AUDIT_KEY", "too-short")
    result = dpctl("ledger", "reconcile", "--url", applied)
    assert result.exit_code == 1 and "$DP_LEDGER_AUDIT_KEY: an audit key needs at least 32" in result.stderr
    assert "too-short" not in result.stderr


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


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_show_lists_the_readable_accounts_and_names_an_unreadable_one_then_exits_3(applied, as_json):
    """One account holding a value the ledger never writes does not hide the others: they are shown, the bad one is
    named with its column, and the exit status says the ledger is inconsistent."""
    engine = sa.create_engine(applied)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE dp_budget_accounts SET spent = '1e-99999999' WHERE name = 'census'")
    engine.dispose()
    result = dpctl("ledger", "show", "--url", applied, *(["--json"] if as_json else []))
    assert result.exit_code == 3
    assert "account 'census' is unreadable: spent" in " ".join(result.stderr.split())
    if as_json:
        rows = {row["account"]: row for row in json.loads(result.stdout)}
        assert set(rows) == {"census", "survey"} and "unreadable" in rows["census"]
        assert Fraction(rows["survey"]["cap"]) == 2
    else:
        assert "survey" in result.stdout and "approx_dp" in result.stdout and "unreadable" in result.stdout


@pytest.mark.parametrize(
    "args", [pytest.param(["history", "--json"], id="history"), pytest.param(["export"], id="export")]
)
def test_history_and_export_write_rows_as_they_stream(applied, monkeypatch, args):
    """Rows reach stdout before the stream ends: a failure after two rows leaves those two printed (a command that
    collected every row first would print nothing)."""
    stream = "charges" if args[0] == "history" else "events"
    real = getattr(Ledger, stream)

    def failing(self, *a, **k):
        yield from list(real(self, *a, **k))[:2]
        raise sa.exc.OperationalError("SELECT", {}, Exception("connection lost"))

    monkeypatch.setattr(Ledger, stream, failing)
    result = dpctl("ledger", *args, "--url", applied)
    assert result.exit_code == 1 and "ledger database error: connection lost" in result.stderr
    assert len(result.stdout.splitlines()) == 2


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_the_audit_log(applied, fmt, tmp_path):
    target = tmp_path / f"audit.{fmt}"
    result = dpctl("ledger", "export", "--url", applied, "--format", fmt, "--output", str(target))
    assert result.exit_code == 0, result.output
    assert f"wrote 6 events to {target}" in result.stderr
    text = target.read_text()
    rows = [json.loads(line) for line in text.splitlines()] if fmt == "jsonl" else list(csv.DictReader(io.StringIO(text)))
    assert [r["event"] for r in rows] == ["account_created", "account_created", "reserved", "committed",
                                          "reserved", "committed"]
    assert all(len(r["row_hash"]) == 64 for r in rows)
    charges = dpctl("ledger", "export", "--url", applied, "--what", "charges", "--format", fmt)
    assert len(charges.stdout.splitlines()) == 2 + (fmt == "csv")
    assert "token_hash" not in charges.stdout


def test_exported_events_are_the_ledgers_events(applied):
    result = dpctl("ledger", "export", "--url", applied)
    assert result.exit_code == 0
    exported = [json.loads(line) for line in result.stdout.splitlines()]
    assert exported == [json.loads(json.dumps(row, default=str)) for row in Ledger(applied).events()]


def test_verify_with_both_keys_authenticates_every_event(applied):
    result = dpctl("ledger", "verify", "--url", applied)
    assert result.exit_code == 0, result.output
    assert "ledger consistent: 6 audit events, 2 accounts, 2 charges; every event authenticated" in result.stdout
    assert "census: chain head" in result.stdout and result.stderr == ""


def test_verify_without_keys_checks_the_rest_and_says_so(applied, monkeypatch):
    no_keys(monkeypatch)
    result = dpctl("ledger", "verify", "--url", applied)
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == NO_KEYS
    assert "ledger consistent: 6 audit events, 2 accounts, 2 charges" in result.stdout
    assert "authenticated" not in result.stdout


def test_verify_with_only_the_spend_key_says_governance_was_not_authenticated(applied, monkeypatch):
    monkeypatch.delenv("DP_LEDGER_GOVERNOR_KEY")
    result = dpctl("ledger", "verify", "--url", applied)
    assert result.exit_code == 0
    assert result.stderr.startswith("authenticity not checked: no governor key given")


def test_verify_with_only_the_governor_key_asks_for_the_spend_key(applied, monkeypatch):
    monkeypatch.delenv("DP_LEDGER_AUDIT_KEY")
    result = dpctl("ledger", "verify", "--url", applied)
    assert result.exit_code == 1 and "verify checks spend events with the spend key" in result.stderr


def test_verify_exits_3_naming_the_first_broken_row(applied):
    engine = sa.create_engine(applied)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE dp_budget_accounts SET cap = '100' WHERE name = 'census'")
    engine.dispose()
    result = dpctl("ledger", "verify", "--url", applied)
    assert result.exit_code == 3
    first = result.stderr.splitlines()[0]
    assert first.startswith("ledger inconsistent: first broken: ") and "'census'" in first
    assert "hint:" not in result.stderr  # the right keys: nothing suggests a wrong key file


def test_verify_with_a_wrong_governor_key_exits_3_and_says_the_key_may_be_the_wrong_one(applied, monkeypatch):
    """A wrong governor key file is an inconsistency (a re-signed history looks the same), with a hint naming the key
    id given and the key id that signed the governance events."""
    wrong = AuditKey.generate()
    monkeypatch.setenv("DP_LEDGER_GOVERNOR_KEY", wrong.text)
    result = dpctl("ledger", "verify", "--url", applied)
    assert result.exit_code == 3
    assert "dp_audit_events id=1" in result.stderr.splitlines()[0]
    [hint] = [line for line in result.stderr.splitlines() if line.startswith("hint: ")]
    assert f"signed by the governor key given (key id {wrong.key_id!r})" in hint
    assert f"they are signed with key id {GOVERNOR_KEY.key_id!r}." in hint


def test_verify_accepts_retired_keys_from_later_lines_and_keys_files(applied, config, tmp_path):
    new_spend = AuditKey.generate()
    rotated = key_file(tmp_path / "spend.key", new_spend)
    assert dpctl("ledger", "apply", str(config), "--url", applied, "--audit-key-file", str(rotated)).exit_code == 0
    charge(Ledger(applied, audit_key=new_spend), "run-9")
    current_only = dpctl("ledger", "verify", "--url", applied, "--audit-key-file", str(rotated))
    assert current_only.exit_code == 3 and "not in the keyring" in current_only.stderr
    with_retired = key_file(tmp_path / "spend-all.key", new_spend, SPEND_KEY)
    result = dpctl("ledger", "verify", "--url", applied, "--audit-key-file", str(with_retired))
    assert result.exit_code == 0, result.output
    retired = key_file(tmp_path / "retired.key", SPEND_KEY)
    result = dpctl("ledger", "verify", "--url", applied, "--audit-key-file", str(rotated), "--keys", str(retired))
    assert result.exit_code == 0, result.output


def test_verify_compares_accounts_with_a_configuration(applied, config, tmp_path):
    assert dpctl("ledger", "verify", "--url", applied, "--config", str(config)).exit_code == 0
    other = tmp_path / "other.yaml"
    other.write_text(CONFIG.replace("cap: 2", "cap: 3"))
    result = dpctl("ledger", "verify", "--url", applied, "--config", str(other))
    assert result.exit_code == 3 and "differs from the given configuration" in result.stderr


def expire_one(url: str) -> int:
    """Reserve with a lease that ends at once and let it lapse, as a killed worker would; returns the charge id."""
    reservation = charge(spender(url, lease_seconds=0.001), "dead-run", commit=False)
    time.sleep(0.05)
    return reservation.charge_id


@pytest.mark.parametrize(
    "keep",
    [pytest.param("DP_LEDGER_AUDIT_KEY", id="spend key"), pytest.param("DP_LEDGER_GOVERNOR_KEY", id="governor key")],
)
def test_reconcile_abandons_expired_reservations_and_lists_them(applied, monkeypatch, keep):
    monkeypatch.delenv("DP_LEDGER_AUDIT_KEY" if keep == "DP_LEDGER_GOVERNOR_KEY" else "DP_LEDGER_GOVERNOR_KEY")
    live = charge(spender(applied), "live-run", commit=False)
    expired = expire_one(applied)
    spent = Ledger(applied).account("census").spent
    result = dpctl("ledger", "reconcile", "--url", applied, "--json")
    assert result.exit_code == 0, result.output
    (listed,) = json.loads(result.stdout)
    assert listed["id"] == expired and listed["run_id"] == "dead-run" and listed["account"] == "census"
    states = {c["id"]: c["state"] for c in Ledger(applied).charges()}
    assert states[expired] == "abandoned" and states[live.charge_id] == "reserved"
    assert Ledger(applied).account("census").spent == spent  # still counted as spent
    again = dpctl("ledger", "reconcile", "--url", applied)
    assert again.exit_code == 0 and again.stdout.strip() == "no expired reservations"
    monkeypatch.setenv("DP_LEDGER_GOVERNOR_KEY", GOVERNOR_KEY.text)
    monkeypatch.setenv("DP_LEDGER_AUDIT_KEY", SPEND_KEY.text)
    assert dpctl("ledger", "verify", "--url", applied).exit_code == 0


def test_reconcile_prints_a_table_and_needs_a_key(applied, monkeypatch):
    expire_one(applied)
    no_keys(monkeypatch)
    refused = dpctl("ledger", "reconcile", "--url", applied)
    assert refused.exit_code == 1 and "reconcile signs the 'abandoned' events" in refused.stderr
    monkeypatch.setenv("DP_LEDGER_AUDIT_KEY", SPEND_KEY.text)
    result = dpctl("ledger", "reconcile", "--url", applied)
    assert result.exit_code == 0
    assert "Abandoned 1 expired reservation(s)" in result.stdout and "dead-run" in result.stdout


def test_roles_prints_the_grants_without_a_ledger(monkeypatch):
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    result = dpctl("ledger", "roles", "--spender-role", "tasks", "--governor-role", "officer")
    assert result.exit_code == 0, result.output
    statements = result.stdout.strip().splitlines()
    assert all(s.endswith(";") for s in statements)
    assert any(s.startswith("GRANT EXECUTE ON FUNCTION dp_reserve(") and s.endswith('TO "tasks";') for s in statements)
    assert not any(s.startswith("GRANT INSERT") and s.endswith('TO "tasks";') for s in statements)
    bad = dpctl("ledger", "roles", "--spender-role", "same", "--governor-role", "same")
    assert bad.exit_code == 1 and "must be different roles" in bad.stderr


def test_roles_refuses_a_sqlite_ledger(applied):
    if not applied.startswith("sqlite"):
        pytest.skip("the SQLite case")
    result = dpctl("ledger", "roles", "--url", applied, "--execute")
    assert result.exit_code == 1 and "database roles are a PostgreSQL feature" in result.stderr


def test_roles_execute_grants_on_postgresql(applied):
    if not applied.startswith("postgresql"):
        pytest.skip("the PostgreSQL case")
    suffix = uuid.uuid4().hex[:8]
    tasks, officer = f"dp_test_tasks_{suffix}", f"dp_test_officer_{suffix}"
    engine = sa.create_engine(applied)
    try:
        result = dpctl("ledger", "roles", "--url", applied, "--spender-role", tasks, "--governor-role", officer,
                       "--create", "--execute")
        assert result.exit_code == 0, result.output
        assert f"granted the ledger privileges to {tasks!r} (spender)" in result.stdout
        with engine.connect() as conn:
            def may(role: str, table: str, privilege: str) -> bool:
                return conn.exec_driver_sql(
                    f"SELECT has_table_privilege('{role}', '{table}', '{privilege}')"
                ).scalar()

            assert may(tasks, "dp_charges", "SELECT") and not may(tasks, "dp_charges", "INSERT")
            assert not may(tasks, "dp_budget_accounts", "INSERT")
            assert conn.exec_driver_sql(
                f"SELECT has_function_privilege('{tasks}', 'dp_reserve(bytea, text, text[], text, text, text, integer, "
                "text, text, text, text, text, text, integer, text, text, double precision)', 'EXECUTE')"
            ).scalar()
            assert may(officer, "dp_budget_accounts", "INSERT")
    finally:
        with engine.begin() as conn:
            for role in (tasks, officer):
                conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
                conn.exec_driver_sql(f'DROP ROLE "{role}"')
        engine.dispose()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        pytest.param(["ledger", "show"], 1, "say which ledger", id="no ledger named"),
        pytest.param(["ledger", "export", "--format", "xml", "--url", "sqlite://"], 2, "use jsonl or csv",
                     id="unknown export format"),
        pytest.param(["ledger", "history", "--limit", "0", "--url", "sqlite://"], 2, "--limit",
                     id="an empty page"),
        pytest.param(["ledger", "frobnicate"], 2, "No such command", id="unknown command"),
    ],
)
def test_exit_codes(args, code, message, monkeypatch):
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    result = dpctl(*args)
    assert result.exit_code == code
    assert message in result.output


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
                                     ("keygen", "init", "apply", "show", "history", "verify", "reconcile", "export",
                                      "roles")]])
def test_every_command_has_help(command):
    result = dpctl(*command, "--help")
    assert result.exit_code == 0 and "Usage" in result.output


@SQLITE_FAST  # two dpctl processes (9 s); --conn-id on both databases: the tests below
def test_conn_id_from_an_airflow_environment_connection_in_a_real_shell(applied):
    """``--conn-id`` resolves ``AIRFLOW_CONN_<ID>`` as Airflow does, from a plain shell (a real process); the
    connection's extras give the keys (the spend key as the workers' connection holds it)."""
    extra = {"url": applied, "audit_key": SPEND_KEY.text, "governor_key": GOVERNOR_KEY.text}
    env = {**os.environ, "AIRFLOW_CONN_PRIVACY_LEDGER": json.dumps({"conn_type": "dp_ledger", "extra": extra})}
    for variable in ("DP_LEDGER_URL", "DP_LEDGER_GOVERNOR_KEY", "DP_LEDGER_AUDIT_KEY"):
        env.pop(variable, None)
    done = subprocess.run([str(DPCTL), "ledger", "verify", "--conn-id", "privacy_ledger"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ledger consistent" in done.stdout and "every event authenticated" in done.stdout
    missing = subprocess.run([str(DPCTL), "ledger", "show", "--conn-id", "nope"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "AIRFLOW_CONN_NOPE" in missing.stderr


def test_the_connections_audit_key_signs_reconcile(applied, monkeypatch):
    expired = expire_one(applied)
    no_keys(monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_WORKERS", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": applied, "audit_key": SPEND_KEY.text}}
    ))
    result = dpctl("ledger", "reconcile", "--conn-id", "workers", "--json")
    assert result.exit_code == 0, result.output
    assert [c["id"] for c in json.loads(result.stdout)] == [expired]


def test_the_keys_of_a_connection_named_on_the_command_line_win_over_the_environment(applied, monkeypatch):
    """With --conn-id, the connection's keys are used, not other keys the shell exports (as scripts/demo_env.sh)."""
    other = AuditKey.from_text("another-ledger-key-" + "x" * 45)
    monkeypatch.setenv("DP_LEDGER_GOVERNOR_KEY", other.text)
    monkeypatch.setenv("DP_LEDGER_AUDIT_KEY", other.text)
    monkeypatch.setenv("AIRFLOW_CONN_OFFICER", json.dumps({"conn_type": "dp_ledger", "extra": {
        "url": applied, "audit_key": SPEND_KEY.text, "governor_key": GOVERNOR_KEY.text}}))
    result = dpctl("ledger", "verify", "--conn-id", "officer")
    assert result.exit_code == 0, result.output
    assert "every event authenticated" in result.output


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


@pytest.mark.parametrize(
    "command",
    [["ledger", "show"], ["ledger", "history"], ["ledger", "verify"], ["ledger", "export"], ["ledger", "reconcile"],
     ["ledger", "apply", "X"], ["spec", "plan", "SPEC"]],
)
def test_commands_other_than_init_do_not_create_a_missing_sqlite_ledger(command, config, tmp_path):
    from support import EXAMPLE_SPEC

    path = tmp_path / "typo.db"
    args = [str(config) if a == "X" else str(EXAMPLE_SPEC) if a == "SPEC" else a for a in command]
    result = dpctl(*args, "--url", f"sqlite:///{path}")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: no ledger at {path}; 'dpctl ledger init --url sqlite:///{path}' makes a new, empty ledger there: if "
        "the ledger exists elsewhere, point at it instead"
    )
    assert not path.exists()
    assert dpctl("ledger", "init", "--url", f"sqlite:///{path}").exit_code == 0 and path.exists()


def test_error_messages_are_printed_verbatim_not_as_rich_markup(tmp_path):
    missing = tmp_path / "bounds: [lower, upper] [red]x[/red].json"
    result = dpctl("release", "show", str(missing))
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: no such file: {missing}"


def test_apply_dry_run_prints_the_changes_and_changes_nothing(tmp_path):
    from support import GOVERNOR_KEY, SPEND_KEY, governor

    url = f"sqlite:///{tmp_path / 'l.db'}"
    governor(url).init_schema()
    config = tmp_path / "ledgers.yaml"
    config.write_text("version: 1\naccounts:\n  survey:\n    accountant: pure_dp\n    cap: 1\n"
                      "    privacy_unit: person\n    allowed_dags: [d]\n")
    env = {"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text}
    result = CliRunner().invoke(app, ["ledger", "apply", str(config), "--url", url, "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    assert "would have created account 'survey'" in result.stdout and "dry run: nothing was changed" in result.stdout
    assert governor(url).accounts() == [] and list(governor(url).events()) == []
    assert CliRunner().invoke(app, ["ledger", "apply", str(config), "--url", url], env=env).exit_code == 0
    config.write_text(config.read_text().replace("survey:", "survy:"))  # a misspelt name
    result = CliRunner().invoke(app, ["ledger", "apply", str(config), "--url", url, "--dry-run"], env=env)
    assert "would have created account 'survy'" in result.stdout
    assert "note: account 'survey' is in the ledger but not in" in result.stderr
    assert [a.name for a in governor(url).accounts()] == ["survey"]


def test_a_relative_sqlite_path_whose_absolute_twin_exists_is_named_with_four_slashes(tmp_path):
    """sqlite:///tmp/x.db (three slashes: relative) beside an existing /tmp/x.db says so, and creates nothing."""
    path = tmp_path / "ledger.db"
    assert dpctl("ledger", "init", "--url", f"sqlite:///{path}").exit_code == 0
    relative = str(path).lstrip("/")
    result = dpctl("ledger", "show", "--url", f"sqlite:///{relative}")
    assert result.exit_code == 1
    assert f"did you mean the file /{relative}? An absolute path takes four slashes: sqlite:////{relative}" in (
        result.stderr)


def test_an_unknown_url_scheme_names_the_urls_a_ledger_takes():
    """A URL no installed dialect opens gets the URL forms a ledger takes, not a raw SQLAlchemy plugin error."""
    result = dpctl("ledger", "show", "--url", "htp://foo")
    assert result.exit_code == 1
    assert "'htp://foo' is not a ledger database URL" in result.stderr and "sqlite:///PATH" in result.stderr


TEAM_CONFIG = CONFIG.replace(
    "    privacy_unit: household\n    allowed_dags: [d]\n",
    "    privacy_unit: household\n    allowed_dags: [d]\n    allowed_roles: [team_survey, team_methods]\n",
)


def test_roles_with_a_config_prints_the_team_roles_after_the_grants(tmp_path, monkeypatch):
    """--config adds, after the ledger's grants, each team role with its accounts and its membership of the spender;
    a team role that is the spender role is refused."""
    monkeypatch.delenv("DP_LEDGER_URL", raising=False)
    path = tmp_path / "ledgers.yaml"
    path.write_text(TEAM_CONFIG)
    result = dpctl("ledger", "roles", "--spender-role", "tasks", "--governor-role", "officer", "--config", str(path))
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    comments = [line for line in lines if line.startswith("--")]
    assert comments == [
        "-- team roles (members of 'tasks') and the accounts they may spend from:",
        "--   team_methods: 'survey'",
        "--   team_survey: 'survey'",
    ]
    assert lines[-1] == 'GRANT "tasks" TO "team_methods", "team_survey";'
    assert lines.index(comments[0]) > max(i for i, line in enumerate(lines) if line.endswith('TO "officer";'))
    assert all(line.endswith(";") for line in lines if not line.startswith("--"))
    path.write_text(TEAM_CONFIG.replace("team_methods", "tasks"))
    refused = dpctl("ledger", "roles", "--spender-role", "tasks", "--governor-role", "officer", "--config", str(path))
    assert refused.exit_code == 1 and "team role 'tasks' is the spender role" in refused.stderr


def test_apply_refuses_an_allowed_role_that_is_not_a_plain_role_name(ledger_url, tmp_path):
    """A bad role name exits 1 naming the account's field, the name and the rule, and changes nothing."""
    assert dpctl("ledger", "init", "--url", ledger_url).exit_code == 0
    path = tmp_path / "ledgers.yaml"
    path.write_text(TEAM_CONFIG.replace("team_methods", "team-methods"))
    result = dpctl("ledger", "apply", str(path), "--url", ledger_url)
    assert result.exit_code == 1
    assert "accounts.survey.allowed_roles: role 'team-methods' is not a plain PostgreSQL role name" in result.stderr
    assert Ledger(ledger_url).accounts() == []


def test_apply_and_show_on_sqlite_say_allowed_roles_are_recorded_but_not_enforced(tmp_path):
    """On SQLite apply records the roles and says nothing enforces them; show lists them with the same warning."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "ledgers.yaml"
    path.write_text(TEAM_CONFIG)
    assert dpctl("ledger", "init", "--url", url).exit_code == 0
    applied = dpctl("ledger", "apply", str(path), "--url", url)
    assert applied.exit_code == 0, applied.output
    assert (
        "note: the allowed_roles of 'survey' are recorded and signed, but SQLite has no database roles to enforce "
        "them: whoever can write the ledger file governs it" in applied.stderr
    )
    shown = dpctl("ledger", "show", "--url", url)
    assert shown.exit_code == 0, shown.output
    rows = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines() if line.startswith("│")}
    assert "team_methods, team_survey" in rows["survey"] and "any spender" in rows["census"]
    assert "allowed roles are recorded but not enforced on SQLite" in shown.stderr
    changed = dpctl("ledger", "apply", str(path), "--url", url, "--dry-run")
    assert changed.stdout.splitlines()[0] == "no change"
    path.write_text(CONFIG)
    removed = dpctl("ledger", "apply", str(path), "--url", url)
    assert "updated account 'survey': allowed_roles (team_methods, team_survey -> any spender)" in removed.stdout
    assert "not enforced" not in removed.stderr
