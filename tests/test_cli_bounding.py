"""What ``dpctl`` says about contribution bounding (docs/ledger.md, "Requiring enforced contribution bounding"):
``ledger apply`` records ``require_enforced_bounding`` and says when it changes, ``ledger show`` names the accounts
that require it, ``ledger history`` each charge's bounding (enforced, declared, mixed), ``release show`` each
aggregate's (with its source, unit column and SQL digest; a release from before bounding was recorded: declared).
On SQLite and PostgreSQL where a ledger is involved."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from cli_ledger_support import config, dpctl, officer_keys  # noqa: F401  (fixtures)
from dp_operators.ledger import BoundingNotEnforcedError, ReleaseKey
from ledger_backends import ledger_url, pg_database  # noqa: F401  (fixtures)
from support import spender
from test_cli_release import RELEASE

CONFIG = """\
version: 1
accounts:
  census:
    accountant: zcdp
    cap: 1
    privacy_unit: person
    allowed_dags: [d]{extra}
  survey:
    accountant: zcdp
    cap: 1
    privacy_unit: household
    allowed_dags: [d]
"""
ENFORCED = {"mode": "enforced", "source": "table", "privacy_unit_column": "person_id", "sql_sha256": "0a1b" * 16}
DECLARED = {"mode": "declared", "source": "query", "privacy_unit_column": None, "sql_sha256": None}


def _apply(url: str, path: Path, required: bool):
    path.write_text(CONFIG.format(extra="\n    require_enforced_bounding: true" if required else ""))
    return dpctl("ledger", "apply", str(path), "--url", url)


def _charge(url: str, run: str, *bounding: dict | None) -> None:
    ledger = spender(url)
    mechanisms = [{"aggregate": f"a{i}", "mechanism": "discrete_gaussian",
                   **({} if b is None else {"contribution_bounding": b})} for i, b in enumerate(bounding)]
    ledger.commit(ledger.reserve(ReleaseKey("d", run, "t", -1, "r"), account="census", amount=Fraction(1, 10),
                                 mechanisms=mechanisms, spec_hash="0" * 64), {"v": 1})


def test_apply_show_and_history_say_which_accounts_require_enforced_bounding_and_how_each_charge_was_bounded(
        ledger_url, config):
    assert dpctl("ledger", "init", "--url", ledger_url).exit_code == 0
    assert _apply(ledger_url, config, False).exit_code == 0
    _charge(ledger_url, "before", DECLARED)  # allowed: not required yet
    applied = _apply(ledger_url, config, True)
    assert applied.exit_code == 0, applied.output
    assert "updated account 'census': require_enforced_bounding false -> true" in applied.output
    with pytest.raises(BoundingNotEnforcedError):
        _charge(ledger_url, "refused", ENFORCED, DECLARED)
    _charge(ledger_url, "after", ENFORCED, ENFORCED)

    shown = dpctl("ledger", "show", "--url", ledger_url)
    assert shown.exit_code == 0, shown.output
    assert "bounding: enforced required on census: a charge whose contribution bounds were only declared is " \
           "refused" in " ".join(shown.stdout.split())
    rows = {row["account"]: row for row in json.loads(dpctl("ledger", "show", "--url", ledger_url, "--json").stdout)}
    assert rows["census"]["require_enforced_bounding"] is True and "require_enforced_bounding" not in rows["survey"]

    table = dpctl("ledger", "history", "--url", ledger_url)
    assert table.exit_code == 0, table.output
    assert "bounding declared" in table.stdout and "bounding enforced" in table.stdout
    assert "refused" not in table.stdout
    verified = dpctl("ledger", "verify", "--url", ledger_url)
    assert verified.exit_code == 0, verified.output  # the declared charge came before the requirement


def test_history_lines_have_a_bounding_column(ledger_url, config, monkeypatch):
    from dp_operators.cli import charges as charges_cli

    assert dpctl("ledger", "init", "--url", ledger_url).exit_code == 0
    assert _apply(ledger_url, config, False).exit_code == 0
    _charge(ledger_url, "mixed", ENFORCED, None)
    _charge(ledger_url, "older", None)
    monkeypatch.setattr(charges_cli, "HISTORY_TABLE_ROWS", 1)
    header, *lines = dpctl("ledger", "history", "--url", ledger_url).stdout.splitlines()
    column = header.split().index("bounding")
    assert [line.split()[column] for line in lines] == ["mixed", "declared"]


def test_release_show_prints_each_aggregates_contribution_bounding(tmp_path: Path):
    release = {**RELEASE, "contribution_bounding": {"people_by_sex": ENFORCED, "mean_hours": DECLARED}}
    path = tmp_path / "release.json"
    path.write_text(json.dumps(release))
    result = dpctl("release", "show", str(path))
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "contribution bounding: enforced (table, unit column person_id, SQL sha256 0a1b0a1b0a1b…)" in text
    assert "contribution bounding: declared (query)" in text
    # from the mechanisms when the release has no contribution_bounding; none recorded: declared
    steps = {**RELEASE, "mechanisms": [{"aggregate": "people_by_sex", "contribution_bounding": ENFORCED},
                                       {"aggregate": "mean_hours"}]}
    path.write_text(json.dumps(steps))
    text = " ".join(dpctl("release", "show", str(path)).output.split())
    assert "people_by_sex (count, discrete_gaussian) contribution bounding: enforced (table" in text
    assert "mean_hours (mean, discrete_laplace) contribution bounding: declared" in text
    path.write_text(json.dumps(RELEASE))  # published before bounding was recorded
    assert " ".join(dpctl("release", "show", str(path)).output.split()).count("contribution bounding: declared") == 2
