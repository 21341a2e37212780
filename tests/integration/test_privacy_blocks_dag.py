"""The privacy-blocks example DAG (dags/nycflights_daily_blocks.py) under real Airflow: ``airflow dags test`` on a
temporary Airflow home and the repository's ledger configuration (config/ledgers.yaml, applied by ``dpctl ledger
apply`` as ``make demo`` does): the run of 2 January releases 1 January, its data interval, charged on that day's
block alone."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from dp_operators.ledger import Ledger

from airflow_home import airflow_environment, migrate_metadata, run
from support import REPO, SPEND_KEY

# slow: its own Airflow home and metadata database (about 70 s) for one `airflow dags test` of the example
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = airflow_environment(home)
    migrate_metadata(env)
    for command in (["dpctl", "ledger", "init"], ["dpctl", "ledger", "apply", str(REPO / "config" / "ledgers.yaml")]):
        run(env, *command, check=True, timeout=300)
    return {"home": home, "env": env, "ledger": Ledger(f"sqlite:///{home / 'ledger.db'}", audit_key=SPEND_KEY)}


@pytest.fixture(scope="module")
def dags_test(airflow_env) -> str:
    """The log of ``airflow dags test nycflights_daily_blocks 2013-01-02`` (a manual run: its interval is 1 January)."""
    done = run(airflow_env["env"], "airflow", "dags", "test", "nycflights_daily_blocks", "2013-01-02")
    return done.stdout + done.stderr


def test_a_run_releases_its_day_on_that_day_s_block(airflow_env, dags_test):
    """The run succeeds; the release reads 1 January's flights and is charged rho 1/8 on block
    ``nyc_flights_daily@2013-01-01`` only, never on the parent account."""
    assert "state=success" in dags_test, dags_test[-3000:]
    [path] = (airflow_env["home"] / "releases").rglob("release.json")
    output = json.loads(path.read_text())
    assert output["privacy_blocks"] == ["2013-01-01"] and output["budget_account"] == "nyc_flights_daily"
    ewr = next(row for row in output["aggregates"]["flights_by_origin"]["rows"] if row["origin"] == "EWR")
    assert abs(ewr["value"] - 305) < 4 * ewr["half_width"]  # 305 flights left EWR on 1 January 2013
    ledger = airflow_env["ledger"]
    assert ledger.account("nyc_flights_daily@2013-01-01").spent == Fraction(1, 8)
    assert ledger.account("nyc_flights_daily@2013-01-02").spent == 0
    assert ledger.account("nyc_flights_daily").spent == 0


def test_release_verify_matches_the_published_files_with_the_ledger(airflow_env, dags_test):
    assert "state=success" in dags_test, dags_test[-3000:]
    verified = run(airflow_env["env"], "dpctl", "release", "verify", str(airflow_env["home"] / "releases"))
    assert verified.returncode == 0, verified.stdout + verified.stderr
