"""What workers write reaches the privacy officer's terminal only as visible text.

Run ids, task ids, release names and DAG ids are the workers' text (and account names, key ids and every other
column are whoever writes the ledger's rows). Every ``dpctl`` command that prints ledger text (``ledger history`` as
a table, as aligned lines and as JSON, ``ledger show`` and ``--json``, ``ledger verify``'s problems and chain heads,
``ledger reconcile``, ``ledger export``, ``ledger apply``'s changes, ``release show`` and ``release verify``) must
print control characters (C0, DEL, C1 such as ``ESC`` and ``CSI``) and format characters (the bidirectional override
U+202E) as visible escapes, never as themselves, and a plain name (letters of any script, digits, spaces) as it is:
the negative control. A SQLite ledger written through the API with both kinds of names; the rows verify must name
are made by editing it as the file's owner.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from fractions import Fraction
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import LedgerConfig, ReleaseKey
from dp_operators.ledger.bounded import visible
from ledger_backends import account_config
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender

#: A name a hostile worker writes: clear the screen, a CSI (C1) sequence, a carriage return, a right-to-left override.
HOSTILE = "run\x1b[2J\x9b31m\r\u202eok"
#: What must never reach the terminal as itself.
RAW = ("\x1b", "\x9b", "\r", "\u202e")
#: A plain name, printed as it is.
PLAIN = "plain run é 日本 7"
HOSTILE_DAG = "dag\x1b]0;title\x07"
HOSTILE_ACCOUNT = "acct\x1b[8m\u202e"
PLAIN_ACCOUNT = "compte é 日本"
ENV = {"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text, "COLUMNS": "100000"}


def test_visible_escapes_controls_and_format_characters_and_keeps_plain_text():
    assert visible(PLAIN) == PLAIN
    assert visible(HOSTILE) == "run\\x1b[2J\\x9b31m\\r\\u202eok"
    assert visible("a\x7fb\u200b\u2028\U000e0001\n") == "a\\x7fb\\u200b\\u2028\\U000e0001\\n"
    assert visible(12) == "12" and visible(None) == "None"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> str:
    """A SQLite ledger: accounts ``census`` and a hostile name; a committed charge under a hostile release key,
    one under a plain key, and an expired reservation under a hostile key (for reconcile)."""
    path = tmp_path_factory.mktemp("terminal") / "ledger.db"
    url = f"sqlite:///{path}"
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={
        "census": account_config("pure_dp", cap=10, dags=("d", HOSTILE_DAG)),
        HOSTILE_ACCOUNT: account_config("pure_dp", cap=10, dags=("d",)),
        PLAIN_ACCOUNT: account_config("pure_dp", cap=10, dags=("d",)),
    }))
    worker = spender(url)
    for key, account in ((ReleaseKey(HOSTILE_DAG, HOSTILE, HOSTILE, -1, HOSTILE), "census"),
                         (ReleaseKey("d", PLAIN, "t", -1, "r"), HOSTILE_ACCOUNT)):
        reservation = worker.reserve(key, account=account, amount=Fraction(1, 100), mechanisms=[], spec_hash="0" * 64)
        worker.commit(reservation, {"value": 1, "note": HOSTILE})
    spender(url, lease_seconds=0.001).reserve(ReleaseKey("d", HOSTILE + "-expired", "t", -1, "r"), account="census",
                                               amount=Fraction(1, 100), mechanisms=[], spec_hash="0" * 64)
    time.sleep(0.01)
    officer.engine.dispose()
    return url


def _tampered(url: str, tmp_path: Path) -> str:
    """A copy of the ledger whose hostile charge's output was edited (verify names the charge by its key)."""
    source = Path(url.removeprefix("sqlite:///"))
    target = tmp_path / "tampered.db"
    with contextlib.closing(sqlite3.connect(source)) as db, contextlib.closing(sqlite3.connect(target)) as copy:
        db.backup(copy)
        triggers = [name for (name,) in copy.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
        for name in triggers:
            copy.execute(f"DROP TRIGGER {name}")
        copy.execute("UPDATE dp_charges SET output = '{\"value\": 2}' WHERE run_id IN (?, ?)", (HOSTILE, PLAIN))
        copy.commit()
    return f"sqlite:///{target}"


def _release_file(folder: Path) -> Path:
    release = {"release": HOSTILE, "release_key": {"run_id": HOSTILE}, "charge": {"epsilon": 0.5},
               "confidence": 0.95, "aggregates": {HOSTILE: {"kind": HOSTILE, "mechanism": "laplace",
                                                             "group_by": [HOSTILE],
                                                             "rows": [{HOSTILE: PLAIN, "value": HOSTILE,
                                                                       "half_width": 1.0}]}}}
    path = folder / "release.json"
    path.write_text(json.dumps(release), encoding="utf-8")
    return path


#: Each command, and the plain name it must print as it is (the negative control).
COMMANDS = {
    "history": (["ledger", "history"], PLAIN),
    "history-lines": (["ledger", "history"], PLAIN),  # aligned lines, not a table (HISTORY_TABLE_ROWS made 0)
    "history-json": (["ledger", "history", "--json"], PLAIN),
    "show": (["ledger", "show"], PLAIN_ACCOUNT),
    "show-json": (["ledger", "show", "--json"], PLAIN_ACCOUNT),
    "verify-consistent": (["ledger", "verify"], PLAIN_ACCOUNT),  # the chain heads, by account
    "verify-problems": (["ledger", "verify"], PLAIN),
    "export-jsonl": (["ledger", "export", "--what", "charges"], PLAIN),
    "export-events": (["ledger", "export"], PLAIN_ACCOUNT),
    "reconcile": (["ledger", "reconcile"], "census"),
    "apply": (["ledger", "apply", "--dry-run"], "census"),
    "release-show": (["release", "show"], PLAIN),
    "release-verify": (["release", "verify"], PLAIN),
}


def _strings(value) -> list[str]:
    """Every string in a JSON value, keys too."""
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (key, *_strings(item))]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return [value] if isinstance(value, str) else []


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_prints_worker_text_visibly_and_plain_text_as_it_is(ledger, command, tmp_path, monkeypatch):
    url = ledger
    args, plain = list(COMMANDS[command][0]), COMMANDS[command][1]
    if command == "history-lines":
        monkeypatch.setattr("dp_operators.cli.charges.HISTORY_TABLE_ROWS", 0)
    if command == "verify-problems":
        url = _tampered(ledger, tmp_path)
    if command == "reconcile":  # on a copy: the reservation stays expired for the other commands
        url = _tampered(ledger, tmp_path)
    if command == "apply":  # the ledger's allowlist, quoted in the change apply would make
        config = tmp_path / "ledgers.yaml"
        config.write_text("version: 1\naccounts:\n  census:\n    accountant: pure_dp\n    cap: 10\n"
                          "    privacy_unit: person\n    allowed_dags: [d]\n")
        args.append(str(config))
    if command.startswith("release"):
        folder = tmp_path / "releases"
        folder.mkdir()
        path = _release_file(folder)
        (folder / f"{HOSTILE}.json").write_text("{}", encoding="utf-8")  # a file name a worker chose
        (folder / f"{PLAIN}.json").write_text("{}", encoding="utf-8")
        args.append(str(path if command == "release-show" else folder))
    result = CliRunner(env=ENV).invoke(app, [*args, "--url", url] if command != "release-show" else args)
    printed = result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert not [char for char in RAW if char in printed], [line for line in printed.splitlines()
                                                          if any(char in line for char in RAW)][:5]
    assert "\\x1b" in printed or "\\u001b" in printed, printed[-2000:]  # shown, as an escape
    assert plain in printed, printed[-2000:]  # the negative control: a plain name prints as it is
    if command.endswith("json") or command.startswith("export"):  # JSON escapes: the same values, read back
        rows = json.loads(result.stdout) if command == "show-json" else [
            json.loads(line) for line in result.stdout.splitlines()]
        assert {HOSTILE, HOSTILE_ACCOUNT} & set(_strings(rows))


def test_verify_problems_name_the_charge_by_its_escaped_key(ledger, tmp_path):
    result = CliRunner(env=ENV).invoke(app, ["ledger", "verify", "--url", _tampered(ledger, tmp_path)])
    assert result.exit_code == 3
    assert visible(HOSTILE) in result.stderr and visible(HOSTILE_DAG) in result.stderr
    assert f"/{PLAIN}/" in result.stderr  # the plain charge's key as it is


def test_verify_report_problems_hold_no_raw_control_characters(ledger, tmp_path):
    """The API's problems (logged by the dashboard's check, printed by scripts) are already visible."""
    report = governor(_tampered(ledger, tmp_path)).verify()
    assert report.problems and not [p for p in report.problems if any(char in p for char in RAW)]
