"""A throwaway Airflow home for tests that run Airflow's own CLI (``airflow dags test``, ``tasks test``): SQLite
metadata, a SQLite ledger connection with the test spend key, and the officer's keys for ``dpctl``."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from support import GOVERNOR_KEY, REPO, SPEND_KEY

BIN = Path(sys.executable).parent
_migrated: Path | None = None  # the metadata database this test process migrated (one per pytest-xdist worker)


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


def migrate_metadata(env: dict[str, str]) -> None:
    """Give the Airflow home of ``env`` a migrated SQLite metadata database, as ``airflow db migrate`` would: a copy
    of one this test process migrated once. A migration imports Airflow and runs every Alembic step (seconds of
    CPU) and its result is the same database for every home, timestamps aside. A home whose ``env`` names its own
    database (``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``) is migrated in place.

    Raises:
        subprocess.CalledProcessError: the migration failed (its output captured).
    """
    global _migrated
    if "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in env:
        run(env, "airflow", "db", "migrate", check=True, timeout=900)
        return
    if _migrated is None:
        template = Path(tempfile.mkdtemp(prefix="dp-operators-metadata-"))
        atexit.register(shutil.rmtree, template, ignore_errors=True)
        run({**env, "AIRFLOW_HOME": str(template)}, "airflow", "db", "migrate", check=True, timeout=900)
        _migrated = template / "airflow.db"
    shutil.copyfile(_migrated, Path(env["AIRFLOW_HOME"]) / "airflow.db")
