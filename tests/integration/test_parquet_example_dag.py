"""The Parquet example DAG (dags/adult_parquet_release.py) under real Airflow: ``airflow dags test`` on UCI Adult,
then a replay of its release task with ``airflow tasks test``; a temporary Airflow home, ledger and folders."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from fractions import Fraction

import pyarrow.parquet as pq
import pytest

from airflow.sdk import ObjectStoragePath
from dp_operators.operators.sinks import COLUMNS, release_rows
from dp_operators.operators.sources import read_reference
from dp_operators.release.columns import is_table
from dp_operators.spec import load_spec

from airflow_home import BIN, airflow_environment, migrate_metadata
from support import EXAMPLE_SPEC, example_charge, make_ledger

# slow: one more real `airflow dags test` deployment (the main example DAG runs in `make test`; ADR 30)
pytestmark = [pytest.mark.integration, pytest.mark.slow]
DAG_ID = "adult_parquet_release"


@pytest.fixture(scope="module")
def airflow_run(tmp_path_factory, adult_csv):
    """One ``dags test`` run of the DAG and one ``tasks test`` replay of its release task; the published files'
    bytes after each."""
    home = tmp_path_factory.mktemp("airflow")
    ledger = make_ledger(home / "ledger.db", dags=(DAG_ID,))
    env = airflow_environment(home, DP_OPERATORS_ADULT_CSV=str(adult_csv),
                              DP_OPERATORS_STAGING_URI=f"file://{home / 'staging'}")
    migrate_metadata(env)
    run = subprocess.run([str(BIN / "airflow"), "dags", "test", DAG_ID], env=env, capture_output=True, text=True,
                         timeout=600)
    log = run.stdout + run.stderr
    assert "state=success, run_type" in log, log[-3000:]
    published = sorted(p for p in (home / "releases").rglob("*") if p.is_file())
    first_bytes = {p.name: p.read_bytes() for p in published}
    output = json.loads(next(p for p in published if p.suffix == ".json").read_text())
    replay = subprocess.run(
        [str(BIN / "airflow"), "tasks", "test", DAG_ID, "release", output["release_key"]["run_id"]],
        env=env, capture_output=True, text=True, timeout=600,
    )
    return {"home": home, "ledger": ledger, "log": log, "replay_log": replay.stdout + replay.stderr,
            "published": published, "first_bytes": first_bytes, "output": output}


def test_published_as_json_and_parquet_only(airflow_run):
    assert [p.name for p in airflow_run["published"]] == ["release.json", "release.parquet"]
    output = airflow_run["output"]
    assert output["release_key"]["dag_id"] == DAG_ID
    assert len(output["aggregates"]["people_by_education_sex"]["rows"]) == 32
    parquet = next(p for p in airflow_run["published"] if p.suffix == ".parquet")
    # the counts' exact value column, the mean's float_value (parquet_schema): each row's value in one of them
    found = [{c: row["float_value"] if c == "value" and row["value"] is None else row[c] for c in COLUMNS}
             for row in pq.read_table(parquet).to_pylist()]
    assert found == release_rows(output)


def test_the_staged_files_hold_the_true_aggregates_and_xcom_only_their_uris(airflow_run, adult_aggregates):
    with sqlite3.connect(airflow_run["home"] / "airflow.db") as db:
        (value,) = db.execute(
            "SELECT value FROM xcom WHERE task_id = 'stage_aggregates' AND key = 'return_value'").fetchone()
        everything = " ".join(str(row) for row in db.execute("SELECT value FROM xcom"))
    uris = json.loads(value)
    assert sorted(uris) == sorted(adult_aggregates)
    assert all(uri.startswith(f"file://{airflow_run['home'] / 'staging'}") and uri.endswith(".parquet")
               for uri in uris.values())
    read = read_reference(uris, load_spec(EXAMPLE_SPEC))  # grouped int columns come as Arrow tables
    assert {name: value.to_pylist() if is_table(value) else value for name, value in read.items()} == adult_aggregates
    assert all(ObjectStoragePath(uri).exists() for uri in uris.values())
    mean = adult_aggregates["mean_hours_per_week"]
    true_values = {mean["sum"], mean["count"]}  # never published, not even by chance as a noised value
    assert [v for v in true_values if re.search(rf"(?<![\d.]){v}(?![\d.])", everything)] == []


def test_a_replay_charges_nothing_and_rewrites_nothing(airflow_run):
    assert "already committed for this task instance: replaying it" in airflow_run["replay_log"]
    assert {p.name: p.read_bytes() for p in airflow_run["published"]} == airflow_run["first_bytes"]
    (charge,) = airflow_run["ledger"].charges()
    assert charge["state"] == "committed"
    assert charge["run_id"] == airflow_run["output"]["release_key"]["run_id"]
    assert Fraction(charge["amount"]) == example_charge()
