"""``dpctl spec plan``, ``dpctl ledger apply`` and ``dpctl ledger show`` on accounts with privacy blocks: which blocks
a run would charge and what each has left, before anything is read or spent; a year of blocks in one line."""

from __future__ import annotations

import datetime as dt
import json
from fractions import Fraction
from pathlib import Path

from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import ReleaseKey
from dp_operators.ledger.config import AccountConfig, Blocks, BlockOpening
from ledger_backends import ledger_with

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "config" / "releases" / "nyc_daily_blocks.yaml"


def _ledger(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    account = AccountConfig(
        accountant="zcdp", cap=Fraction(1, 8), delta=Fraction(1, 10**6), privacy_unit="flight",
        allowed_dags=["nycflights_daily_blocks"],
        blocks=Blocks(window="day", open=BlockOpening(**{"from": dt.date(2013, 1, 1), "until": dt.date(2013, 1, 10)})),
    )
    return url, ledger_with(url, nyc_flights_daily=account)


def test_plan_names_the_blocks_a_run_would_charge_and_refuses_a_spent_or_unopened_one(tmp_path):
    url, ledger = _ledger(tmp_path)
    key = ReleaseKey("nycflights_daily_blocks", "r", "t", -1, "x")
    ledger.commit(ledger.reserve(key, account="nyc_flights_daily", amount=Fraction(1, 8), mechanisms=[],
                                 spec_hash="0" * 64, windows=["2013-01-02"]), {"v": 1})
    funded = runner.invoke(app, ["spec", "plan", str(SPEC), "--url", url, "--json",
                                 "--data-interval", "2013-01-03T00:00:00+00:00/2013-01-04T00:00:00+00:00"])
    assert funded.exit_code == 0, funded.output
    structure = json.loads(funded.output)["structure"]
    assert structure["blocks_open"] == 10 and structure["blocks_charged"] == 1
    assert structure["run_charges"] == [{"window": "2013-01-03", "open": True, "remaining": "1/8", "funds_a_run": True}]
    assert structure["run_funded"] is True
    spent = runner.invoke(app, ["spec", "plan", str(SPEC), "--url", url, "--data-interval", "2013-01-02/2013-01-03"])
    assert "block 2013-01-02: rho 0 left: refused" in spent.output and "refused before anything is reserved" in spent.output
    unopened = runner.invoke(app, ["spec", "plan", str(SPEC), "--url", url, "--data-interval", "2013-02-01/2013-02-02"])
    assert "block 2013-02-01: not open: refused" in unopened.output
    bad = runner.invoke(app, ["spec", "plan", str(SPEC), "--url", url, "--data-interval", "yesterday"])
    assert bad.exit_code == 1 and "START/END in ISO 8601" in bad.output
    assert [c["run_id"] for c in ledger.charges()] == ["r"]  # planning charged nothing


def test_apply_and_show_fold_a_years_blocks_into_one_line_each(tmp_path):
    config = tmp_path / "ledgers.yaml"
    config.write_text(
        "version: 1\naccounts:\n  daily:\n    accountant: zcdp\n    cap: 0.5\n    privacy_unit: flight\n"
        "    allowed_dags: [d]\n    blocks: {window: day, open: {from: 2013-01-01, until: 2013-12-31}}\n"
    )
    url, _ = _ledger(tmp_path)
    from support import GOVERNOR_KEY, SPEND_KEY

    keys = tmp_path / "gov.key", tmp_path / "spend.key"
    keys[0].write_text(GOVERNOR_KEY.text)
    keys[1].write_text(SPEND_KEY.text)
    for key in keys:
        key.chmod(0o600)
    applied = runner.invoke(app, ["ledger", "apply", str(config), "--url", url, "--governor-key-file", str(keys[0]),
                                  "--audit-key-file", str(keys[1])])
    assert applied.exit_code == 0, applied.output
    assert "created 365 member account(s) of 'daily': daily@2013-01-01 .. 2013-12-31" in applied.output
    assert "daily@2013-01-02" not in applied.output
    shown = runner.invoke(app, ["ledger", "show", "--url", url])
    assert "daily@" not in shown.output.split("Privacy blocks")[0]
    assert "365" in shown.output.split("Privacy blocks")[1]
    listed = runner.invoke(app, ["ledger", "show", "--url", url, "--account", "daily", "--json"])
    assert len(json.loads(listed.output)) == 366
