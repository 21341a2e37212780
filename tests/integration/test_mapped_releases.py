"""DPReleaseOperator in mapped task groups, ``.expand()``, ``.partial()`` and ``.expand_kwargs()`` under real
Airflow (``airflow dags test``): each instance releases its own upstream instance's aggregates, or fails clearly and
charges nothing."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from dp_operators.ledger import Ledger, ReleaseKey

from airflow_home import airflow_environment, migrate_metadata, run
from support import SPEND_KEY

pytestmark = pytest.mark.integration
DAGS = Path(__file__).with_name("mapped_dags")
LEDGERS = """version: 1
accounts:
  mapped_test:
    accountant: pure_dp
    cap: 100
    privacy_unit: person
    allowed_dags: [mapped_releases]
"""


@pytest.fixture(scope="module")
def mapped_run(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_mapped")
    ledger_path = home / "ledger.db"
    (home / "ledgers.yaml").write_text(LEDGERS)
    env = airflow_environment(home, dags_folder=DAGS)
    migrate_metadata(env)
    for command in (["dpctl", "ledger", "init"], ["dpctl", "ledger", "apply", str(home / "ledgers.yaml")]):
        run(env, *command, check=True, timeout=300)
    dag_run = run(env, "airflow", "dags", "test", "mapped_releases")
    with sqlite3.connect(home / "airflow.db") as db:
        states = {(task, index): state for task, index, state in
                  db.execute("SELECT task_id, map_index, state FROM task_instance WHERE dag_id = 'mapped_releases'")}
    # `dags test` runs every task in its own process and prints each task's log between these markers
    logs: dict[tuple[str, int], str] = {}
    for section in re.split(r"\[DAG TEST\] starting ", dag_run.stdout + dag_run.stderr)[1:]:
        found = re.match(r"task_id=(\S+) map_index=(-?\d+)", section)
        logs[(found[1], int(found[2]))] = section
    ledger = Ledger(f"sqlite:///{ledger_path}", audit_key=SPEND_KEY)
    return {"run": dag_run, "states": states, "logs": logs, "ledger": ledger, "home": home}


def charges(mapped_run) -> list[dict]:
    return list(mapped_run["ledger"].charges())


def committed(mapped_run) -> dict[tuple[str, int], dict]:
    ledger = mapped_run["ledger"]
    return {(c["task_id"], c["map_index"]): ledger.stored_output(ReleaseKey(
        dag_id=c["dag_id"], run_id=c["run_id"], task_id=c["task_id"], map_index=c["map_index"],
        release_name=c["release_name"])) for c in charges(mapped_run) if c["state"] == "committed"}


def value(mapped_run, task_id: str, map_index: int) -> float:
    return committed(mapped_run)[(task_id, map_index)]["aggregates"]["people"]["value"]


def log_of(mapped_run, task_id: str, map_index: int) -> str:
    return mapped_run["logs"].get((task_id, map_index), "")


def near(value: float, true: int) -> bool:
    return abs(value - true) < 60  # Laplace scale 1: exceeded with probability e^-60


def test_each_mapped_group_publishes_its_own_group_s_count(mapped_run):
    states = mapped_run["states"]
    assert states[("region.release", 0)] == "success" and near(value(mapped_run, "region.release", 0), 1000)
    assert states[("region.release", 1)] == "success" and near(value(mapped_run, "region.release", 1), 2000)


def test_a_group_whose_upstream_returned_nothing_fails_clearly_and_is_not_charged(mapped_run):
    assert mapped_run["states"][("region.release", 2)] == "failed"
    assert "task 'region.compute' (map index 2) returned no aggregates" in log_of(mapped_run, "region.release", 2)
    assert all((c["task_id"], c["map_index"]) != ("region.release", 2) for c in charges(mapped_run))


def test_an_expanded_release_pairs_map_index_with_map_index(mapped_run):
    for index in range(3):
        assert mapped_run["states"][("release_expanded", index)] == "success"
        assert near(value(mapped_run, "release_expanded", index), 100_000 * (index + 1))


def test_expand_kwargs_over_unmapped_upstreams(mapped_run):
    assert near(value(mapped_run, "release_each", 0), 7_000_000)
    assert near(value(mapped_run, "release_each", 1), 8_000_000)


def test_an_unmapped_release_of_a_mapped_upstream_is_refused(mapped_run):
    assert mapped_run["states"][("release_unmapped", -1)] == "failed"
    assert "task 'expanded' is mapped (.expand()) but this release is not" in log_of(mapped_run, "release_unmapped", -1)


def test_a_release_mapped_differently_from_its_upstream_is_refused(mapped_run):
    for index in (0, 1):
        assert mapped_run["states"][("release_mismatched", index)] == "failed"
        assert "mapped into 3 instances but this release into 2" in log_of(mapped_run, "release_mismatched", index)


def test_refused_releases_charge_nothing_and_files_match_the_ledger(mapped_run):
    by_key = committed(mapped_run)
    assert sorted((c["task_id"], c["map_index"]) for c in charges(mapped_run)) == sorted(by_key)
    assert len(by_key) == 2 + 3 + 2
    files = sorted((mapped_run["home"] / "releases").rglob("*.json"))
    assert len(files) == len(by_key)
    for path in files:
        output = json.loads(path.read_text())
        key = output["release_key"]
        assert by_key[(key["task_id"], key["map_index"])] == output


def test_one_asset_event_per_committed_release(mapped_run):
    """Every successful release, mapped or not, announces itself once (the outlet is an AssetAlias)."""
    with sqlite3.connect(mapped_run["home"] / "airflow.db") as db:
        events = sorted(db.execute(
            "SELECT e.source_task_id, e.source_map_index, a.uri FROM asset_event e JOIN asset a ON a.id = e.asset_id"
        ))
    assert events == sorted((task, index, "dp-release://mapped_count/") for task, index in committed(mapped_run))
