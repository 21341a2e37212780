"""A throwaway Airflow home for tests that run Airflow's own CLI (``airflow dags test``, ``tasks test``): SQLite
metadata, a SQLite ledger connection with the test spend key, and the officer's keys for ``dpctl``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import GOVERNOR_KEY, REPO, SPEND_KEY

BIN = Path(sys.executable).parent


def airflow_environment(home: Path, *, dags_folder: Path = REPO / "dags", **extra: str) -> dict[str, str]:
    """The environment of an Airflow CLI run in ``home``: its ledger is ``home/ledger.db`` (connection
    ``dp_ledger_default`` with the test spend key; ``dpctl`` gets both keys), files go to ``home/releases``.
    ``extra`` adds or overrides variables."""
    ledger_url = f"sqlite:///{home / 'ledger.db'}"
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_DP_LEDGER_DEFAULT": json.dumps(
            {"conn_type": "dp_ledger", "extra": {"url": ledger_url, "audit_key": SPEND_KEY.text}}
        ),
        "DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text,
        "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text,
        "DP_LEDGER_URL": ledger_url,
        "DP_OPERATORS_OUTPUT_URI": f"file://{home / 'releases'}",
        **extra,
    }


def run(env: dict[str, str], *command: str, check: bool = False, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``airflow ...`` or ``dpctl ...`` from this venv in ``env``; output captured as text."""
    return subprocess.run([str(BIN / command[0]), *command[1:]], env=env, capture_output=True, text=True,
                          check=check, timeout=timeout)
