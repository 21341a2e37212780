"""The series example DAG under real Airflow: ``airflow dags test`` of its first days, in order, on a temporary
Airflow home and the example's ledger configuration: each run's data interval is its step, the series is charged
once, a day out of order fails without a retry, and a run again of a released day replays it."""

from __future__ import annotations

import json
import subprocess

import pytest

from dp_operators.continual.state import SeriesKey
from dp_operators.ledger import Ledger

from airflow_home import airflow_environment, migrate_metadata, run
from support import REPO, SPEND_KEY

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = airflow_environment(home)
    connection = json.loads(env["AIRFLOW_CONN_DP_LEDGER_DEFAULT"])
    connection["extra"]["series_key"] = SeriesKey.generate().text
    env["AIRFLOW_CONN_DP_LEDGER_DEFAULT"] = json.dumps(connection)
    migrate_metadata(env)
    for command in (["dpctl", "ledger", "init"], ["dpctl", "ledger", "apply", str(REPO / "config" / "ledgers.yaml")]):
        run(env, *command, check=True, timeout=300)
    return {"home": home, "env": env, "ledger": Ledger(f"sqlite:///{home / 'ledger.db'}", audit_key=SPEND_KEY)}


def dags_test(airflow_env, date: str) -> str:
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "airflow"), "dags", "test", "nycflights_series_release", date],
        env=airflow_env["env"], capture_output=True, text=True, timeout=600,
    )
    return done.stdout + done.stderr


def released(airflow_env) -> list[dict]:
    found = (airflow_env["home"] / "releases").rglob("release.json")
    return sorted((json.loads(path.read_text()) for path in found), key=lambda o: o["series"]["step"])


def test_the_first_days_are_steps_in_order_and_a_day_out_of_order_fails(airflow_env):
    # a manual run of a date releases the day that ends there (its data interval)
    for date in ("2013-01-02", "2013-01-03"):
        assert "state=success" in dags_test(airflow_env, date)
    steps = released(airflow_env)
    assert [(s["series"]["step"], s["series"]["data_interval"][0][:10]) for s in steps] == [
        (0, "2013-01-01"), (1, "2013-01-02")]
    origin = {row["origin"]: row for row in steps[0]["aggregates"]["flights_by_origin"]["rows"]}
    assert abs(origin["EWR"]["value"] - 305) < 4 * origin["EWR"]["half_width"]  # 305 flights left EWR on 1 January
    ledger = airflow_env["ledger"]
    assert ledger.account("nyc_flights").spent == 1
    skipped = dags_test(airflow_env, "2013-01-05")
    assert "state=failed" in skipped and "leaves a gap after step 1" in skipped
    again = dags_test(airflow_env, "2013-01-03")  # a new run of a released day: its step replays, nothing charged
    assert "state=success" in again and "replaying it, nothing charged" in again
    steps = released(airflow_env)  # the replay rewrote the step's own files (a step's, not a run's, location)
    assert ledger.account("nyc_flights").spent == 1 and [s["series"]["step"] for s in steps] == [0, 1]
    verified = run(airflow_env["env"], "dpctl", "release", "verify", str(airflow_env["home"] / "releases"))
    assert verified.returncode == 0, verified.stdout + verified.stderr
