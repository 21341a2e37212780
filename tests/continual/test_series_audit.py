"""A privacy officer's check of a series with its key (dp_operators.continual.audit): every published total is a
whole running total plus the noise sealed for it; a step published from other noise, or with another key, fails."""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa

from dp_operators.continual.audit import audit_series
from dp_operators.continual.state import SeriesKey
from ledger_backends import account_config, ledger_with
from test_series_steps import KEY, step


def test_every_step_checks_against_its_sealed_noise(tmp_path):
    ledger = ledger_with(f"sqlite:///{tmp_path / 'ledger.db'}", a=account_config("zcdp", cap=3))
    for index in range(6):
        step(ledger, index)
    assert audit_series(ledger, KEY) == (6, [])


def test_a_value_moved_after_commit_and_another_key_are_named(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = ledger_with(url, a=account_config("zcdp", cap=3))
    for index in range(3):
        step(ledger, index)
    checked, problems = audit_series(ledger, SeriesKey(bytes(32)))
    assert checked == 0 and "does not open with this series key" in problems[0]
    # the negative control: step 1's EWR total published 0.5 away from what its sealed noise gives
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER dp_charges_guard")  # written around the ledger, as an attacker would
        charge_id, text = conn.exec_driver_sql(
            "SELECT id, output FROM dp_charges WHERE run_id LIKE '%step/000001'").one()
        output = json.loads(text)
        output["aggregates"]["flights"]["rows"][0]["value"] += 0.5
        moved = json.dumps(output, sort_keys=True, separators=(",", ":"))
        conn.exec_driver_sql("UPDATE dp_charges SET output = ?, output_digest = ? WHERE id = ?",
                             (moved, hashlib.sha256(moved.encode()).hexdigest(), charge_id))
    engine.dispose()
    checked, problems = audit_series(ledger, KEY)
    assert checked == 3 and problems == [
        "series 'a/d/release/-1/daily_flights/g0' step 1: 1 published value(s) are not a whole running total plus "
        "the noise sealed for them"]


def test_dpctl_ledger_verify_checks_the_series_with_their_key(tmp_path):
    from typer.testing import CliRunner

    from dp_operators.cli import app
    from support import GOVERNOR_KEY, SPEND_KEY

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = ledger_with(url, a=account_config("zcdp", cap=3))
    for index in range(2):
        step(ledger, index)
    env = {"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text}
    right, wrong = tmp_path / "series.key", tmp_path / "other.key"
    right.write_text(KEY.text + "\n")
    wrong.write_text(SeriesKey(bytes(32)).text + "\n")
    ok = CliRunner().invoke(app, ["ledger", "verify", "--url", url, "--series-key-file", str(right)], env=env)
    assert ok.exit_code == 0, ok.output
    assert "series: 2 step(s) match the noise sealed for them" in ok.output
    refused = CliRunner().invoke(app, ["ledger", "verify", "--url", url, "--series-key-file", str(wrong)], env=env)
    assert refused.exit_code == 3 and "does not open with this series key" in refused.output
