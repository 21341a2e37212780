"""An invalid release spec is visible where Airflow users look: ``airflow dags list-import-errors`` names the spec
file and the field path.

Real Airflow, as a user runs it: a throwaway AIRFLOW_HOME with SQLite metadata (``airflow db migrate``), a DAGs
folder with one DAG of a broken spec and one of a valid spec, ``airflow dags reserialize`` (parses the folder and
records its import errors in the metadata database, as the DAG processor does) and ``airflow dags
list-import-errors -o json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_home import migrate_metadata
from support import EXAMPLE_SPEC

pytestmark = pytest.mark.integration

AIRFLOW = Path(sys.executable).with_name("airflow")

DAG_FILE = """\
from airflow.sdk import dag
from dp_operators.operators.release import DPReleaseOperator


@dag(schedule=None, tags=["test"], doc_md="A release of {spec}")
def {dag_id}():
    DPReleaseOperator(task_id="release", spec_path={spec!r}, aggregates_task_id="compute_aggregates")


{dag_id}()
"""


def airflow_env(home: Path, dags: Path) -> dict[str, str]:
    """The environment of Airflow commands on the home ``home`` and the DAGs folder ``dags``: none of this session's
    AIRFLOW_* settings (a CI's metadata database, say) reaches it, so the metadata is the home's SQLite file."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW_")}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    return env


def airflow(home: Path, dags: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``airflow *args`` in :func:`airflow_env`."""
    return subprocess.run([str(AIRFLOW), *args], env=airflow_env(home, dags), capture_output=True, text=True,
                          timeout=180)


def json_printed(stdout: str):
    """The JSON document Airflow printed; Airflow's log lines (a missing graphviz, say) may come before it when
    stdout is not a terminal."""
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("[", "{"))), None)
    assert start is not None, f"no JSON in: {stdout[-3000:]}"
    return json.loads("\n".join(lines[start:]))


def test_an_invalid_spec_is_listed_by_airflow_with_its_file_and_field_path(tmp_path):
    valid = EXAMPLE_SPEC.read_text()
    broken = valid.replace("budget: {epsilon: 0.3}", "budget: {epsilon: -1}")
    assert broken != valid, "the example spec changed: break another field"
    spec = tmp_path / "broken_adult_census.yaml"
    spec.write_text(broken)
    dags, home = tmp_path / "dags", tmp_path / "airflow"
    dags.mkdir()
    home.mkdir()
    (dags / "broken_spec.py").write_text(DAG_FILE.format(dag_id="broken_spec", spec=str(spec)))
    (dags / "valid_spec.py").write_text(DAG_FILE.format(dag_id="valid_spec", spec=str(EXAMPLE_SPEC)))

    migrate_metadata(airflow_env(home, dags))  # the home's SQLite metadata, as `airflow db migrate` leaves it
    done = airflow(home, dags, "dags", "reserialize")
    assert done.returncode == 0, f"airflow dags reserialize: {done.stderr[-3000:]}"
    listed = airflow(home, dags, "dags", "list-import-errors", "-o", "json")
    assert listed.returncode == 1, listed.stderr[-3000:]  # Airflow exits 1 when it lists import errors
    (error,) = json_printed(listed.stdout)

    assert error["filepath"] == "broken_spec.py"
    assert f"{spec}: invalid release spec (1 problem(s))" in error["error"]
    assert "aggregates[1](people_by_age_band).budget.epsilon: must be > 0, got -1" in error["error"]
