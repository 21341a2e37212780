"""What the ``dpctl ledger`` tests share: the ledger configuration, the CLI runner, keys in the environment, a
charge, an initialised ledger with two charges (``applied``).

Import the fixtures into a test module (``from cli_ledger_support import applied, config, officer_keys``).
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import AuditKey, Ledger, ReleaseKey
from support import GOVERNOR_KEY, SPEND_KEY, spender

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

NO_KEYS = (
    "authenticity not checked: no keys given (--governor-key-file/--audit-key-file or "
    "DP_LEDGER_GOVERNOR_KEY/DP_LEDGER_AUDIT_KEY)"
)


#: What :func:`charge` records as the charge's mechanisms.
MECHANISMS = [{"mechanism": "discrete_gaussian", "sigma2": "9/200"}]


def dpctl(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(autouse=True)
def officer_keys(monkeypatch):
    """Both test keys in the environment, as the privacy officer's shell has them; tests that need fewer unset them."""
    monkeypatch.setenv("DP_LEDGER_GOVERNOR_KEY", GOVERNOR_KEY.text)
    monkeypatch.setenv("DP_LEDGER_AUDIT_KEY", SPEND_KEY.text)


def no_keys(monkeypatch) -> None:
    monkeypatch.delenv("DP_LEDGER_GOVERNOR_KEY")
    monkeypatch.delenv("DP_LEDGER_AUDIT_KEY")


def key_file(path: Path, *keys: AuditKey) -> Path:
    path.write_text("".join(f"{key.text}\n" for key in keys))
    path.chmod(0o600)
    return path


def charge(ledger: Ledger, run: str, *, commit: bool = True, account: str = "census", dag: str = "d",
           task: str = "t", map_index: int = -1, release: str = "r", delta: Fraction = Fraction(0)):
    """Reserve (and unless ``commit`` is false, commit) 1/400 on ``account`` for the release key of ``run``."""
    reservation = ledger.reserve(ReleaseKey(dag, run, task, map_index, release), account=account,
                                 amount=Fraction(1, 400), delta=delta, mechanisms=MECHANISMS, spec_hash="0" * 64)
    if commit:
        ledger.commit(reservation, {"value": run})
    return reservation


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "ledgers.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def applied(ledger_url, config) -> str:
    assert dpctl("ledger", "init", "--url", ledger_url).exit_code == 0
    result = dpctl("ledger", "apply", str(config), "--url", ledger_url)
    assert result.exit_code == 0, result.output
    ledger = spender(ledger_url)
    for run in range(2):
        charge(ledger, f"run-{run}")
    return ledger_url
