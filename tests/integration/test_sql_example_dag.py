"""The SQL example DAG (dags/adult_sql_release.py) under real Airflow: ``airflow dags test`` loads UCI Adult into
SQLite, the release runs the GROUP BY queries itself and publishes files and a SQL table; a replay with
``airflow tasks test`` rewrites the same files and rows, charges nothing and announces nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from dp_operators.operators.sinks import release_rows

from airflow_home import BIN, airflow_environment, migrate_metadata
from support import example_charge, make_ledger

# slow: one more real `airflow dags test` deployment (the main example DAG runs in `make test`; ADR 30)
pytestmark = [pytest.mark.integration, pytest.mark.slow]
DAG_ID = "adult_sql_release"


def table_rows(database: Path) -> list[tuple]:
    with sqlite3.connect(database) as db:
        return sorted(db.execute(
            "SELECT dag_id, run_id, task_id, map_index, release_name, aggregate, key, value, half_width FROM dp_releases"
        ))


def asset_events(home: Path) -> list[tuple]:
    with sqlite3.connect(home / "airflow.db") as db:
        return list(db.execute("SELECT a.uri, e.source_run_id FROM asset_event e JOIN asset a ON a.id = e.asset_id"))


@pytest.fixture(scope="module")
def sql_run(tmp_path_factory, adult_csv):
    home = tmp_path_factory.mktemp("airflow_sql")
    ledger = make_ledger(home / "ledger.db", dags=(DAG_ID,))
    database = home / "adult.db"
    env = airflow_environment(
        home, DP_OPERATORS_ADULT_CSV=str(adult_csv),
        AIRFLOW_CONN_ADULT_SQLITE=json.dumps({"conn_type": "sqlite", "host": str(database)}),
    )
    migrate_metadata(env)
    run = subprocess.run([str(BIN / "airflow"), "dags", "test", DAG_ID], env=env, capture_output=True, text=True,
                         timeout=600)
    assert "state=success, run_type" in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
    files = sorted(p for p in (home / "releases").rglob("*") if p.is_file())
    first = {"files": {p: p.read_bytes() for p in files}, "rows": table_rows(database), "events": asset_events(home)}
    output = json.loads(next(p for p in files if p.suffix == ".json").read_text())
    replay = subprocess.run(
        [str(BIN / "airflow"), "tasks", "test", DAG_ID, "release", output["release_key"]["run_id"]],
        env=env, capture_output=True, text=True, timeout=600,
    )
    after = {"files": {p: p.read_bytes() for p in files}, "rows": table_rows(database), "events": asset_events(home)}
    return {"run": run, "replay": replay, "first": first, "after": after, "output": output, "ledger": ledger,
            "home": home, "database": database}


def test_the_release_reads_sql_and_publishes_files_and_a_sql_table(sql_run):
    output = sql_run["output"]
    assert len(output["aggregates"]["people_by_education_sex"]["rows"]) == 32
    assert output["charge"]["rho_exact"] == str(example_charge())
    expected = sorted(
        (key["dag_id"], key["run_id"], key["task_id"], key["map_index"], key["release_name"], row["aggregate"],
         row["key"], row["value"], row["half_width"])
        for key in [output["release_key"]] for row in release_rows(output)
    )
    assert sql_run["first"]["rows"] == expected
    assert {p.suffix for p in sql_run["first"]["files"]} == {".json", ".csv"}


def test_the_true_aggregates_never_enter_xcom(sql_run):
    with sqlite3.connect(sql_run["home"] / "airflow.db") as db:
        xcoms = list(db.execute("SELECT task_id, key, value FROM xcom"))
    allowed = {("release", "return_value"), ("release", "release_location"), ("release", "_link_DPReleaseLink")}
    assert {(task, key) for task, key, _ in xcoms} <= allowed


def test_a_replay_rewrites_identical_files_and_rows_charges_nothing_and_emits_no_event(sql_run):
    log = sql_run["replay"].stdout + sql_run["replay"].stderr
    assert "already committed for this task instance: replaying it" in log, log[-3000:]
    assert sql_run["after"]["files"] == sql_run["first"]["files"]
    assert sql_run["after"]["rows"] == sql_run["first"]["rows"]
    assert sql_run["after"]["events"] == sql_run["first"]["events"]
    assert len(sql_run["first"]["events"]) == 1
    assert len(list(sql_run["ledger"].charges())) == 1
