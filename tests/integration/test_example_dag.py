"""The example DAG under real Airflow: ``airflow dags test`` on UCI Adult, a temporary Airflow home and ledger.

``make test`` runs the DAG once (a release, its charge, no raw value in the logs, rendered fields or ledger); the
second and third runs, the third refused by a cap that fits two, are ``slow`` (ADR 30)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from fractions import Fraction

import pytest

from dp_operators.ledger import Ledger, load_ledger_config
from dp_operators.release import plan_release

from airflow_home import BIN, airflow_environment, migrate_metadata, run
from support import EXAMPLE_SPEC, REPO, SPEND_KEY, example_charge

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, adult_csv):
    home = tmp_path_factory.mktemp("airflow")
    ledger_path = home / "ledger.db"
    config = home / "ledgers.yaml"
    # the repository's account, with a cap that fits exactly two runs of the example spec
    config.write_text(
        (REPO / "config" / "ledgers.yaml").read_text().replace("cap: 0.6 ", f"cap: {2 * example_charge()} ")
    )
    env = airflow_environment(home, DP_OPERATORS_ADULT_CSV=str(adult_csv))
    migrate_metadata(env)
    for command in (["dpctl", "ledger", "init"], ["dpctl", "ledger", "apply", str(config)]):
        run(env, *command, check=True, timeout=300)
    assert load_ledger_config(config).accounts["census_adult"].cap == 2 * example_charge()
    return {"home": home, "env": env, "ledger": Ledger(f"sqlite:///{ledger_path}", audit_key=SPEND_KEY), "ledger_path": ledger_path}


def dags_test(airflow_env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "airflow"), "dags", "test", "adult_census_release"],
        env=airflow_env["env"], capture_output=True, text=True, timeout=600,
    )


@pytest.fixture(scope="module")
def runs(airflow_env) -> list[subprocess.CompletedProcess]:
    """The runs of the DAG so far, against a cap that fits two: the first; ``three_runs`` adds two more."""
    return [dags_test(airflow_env)]


@pytest.fixture(scope="module")
def three_runs(runs, airflow_env) -> list[subprocess.CompletedProcess]:
    """Three runs of the DAG against a cap that fits two."""
    while len(runs) < 3:
        runs.append(dags_test(airflow_env))
    return runs


def releases(airflow_env) -> list[dict]:
    found = sorted((airflow_env["home"] / "releases").rglob("release.json"), key=lambda p: p.stat().st_mtime)
    return [json.loads(path.read_text()) for path in found]


def test_first_run_releases_every_cell_and_charges_the_spec_total(runs, airflow_env):
    assert "state=success" in runs[0].stdout + runs[0].stderr
    first = releases(airflow_env)[0]
    assert len(first["aggregates"]["people_by_education_sex"]["rows"]) == 32
    assert [r["age_band"] for r in first["aggregates"]["people_by_age_band"]["rows"]] == [
        "17-24", "25-34", "35-44", "45-54", "55-64", "65-74", "75+"
    ]
    # the median: one of the 99 one-hour bins, its guarantee in ranks (no value interval)
    (median,) = first["aggregates"]["median_hours_per_week"]["rows"]
    assert median["quantile"] == "0.5" and median["bin"] == [median["value"], median["value"] + 1]
    assert 1 <= median["value"] <= 99 and median["rank_half_width"] > 0 and median["interval"] == [None, None]
    charge = next(c for c in airflow_env["ledger"].charges() if c["run_id"] == first["release_key"]["run_id"])
    from dp_operators.spec import load_spec

    assert charge["state"] == "committed"
    assert Fraction(charge["amount"]) == plan_release(load_spec(EXAMPLE_SPEC), accountant="zcdp").charge("zcdp") == example_charge()


@pytest.mark.slow  # two more runs of the DAG; the refusal of an exhausted account: test_release_operator.py
def test_third_run_is_refused_and_the_ledger_holds_two_charges(three_runs, airflow_env, adult_aggregates):
    runs = three_runs
    assert "state=success" in runs[1].stdout + runs[1].stderr
    third = runs[2].stdout + runs[2].stderr
    assert "state=failed" in third
    charge = example_charge()
    assert f"budget account 'census_adult' is exhausted: requested rho {charge} (~{float(charge):.6g}), remaining 0" in third
    charges = list(airflow_env["ledger"].charges())
    assert len(charges) == 2 and all(c["state"] == "committed" for c in charges)
    assert len(releases(airflow_env)) == 2
    assert_no_raw_aggregates(runs, airflow_env, adult_aggregates)  # the refused run's logs too


def test_raw_aggregates_appear_in_no_log_ledger_or_rendered_field(runs, airflow_env, adult_aggregates):
    """In the runs so far (the first; all three after the slow test above)."""
    assert_no_raw_aggregates(runs, airflow_env, adult_aggregates)


def assert_no_raw_aggregates(runs, airflow_env, adult_aggregates) -> None:
    true_values = {adult_aggregates["mean_hours_per_week"]["sum"], adult_aggregates["mean_hours_per_week"]["count"]}
    for aggregate in ("people_by_education_sex", "people_by_age_band", "median_hours_per_week"):
        true_values |= {row["count"] for row in adult_aggregates[aggregate] if row["count"] >= 1000}
    pattern = re.compile(r"(?<![\w.:=/+-])(" + "|".join(map(str, sorted(true_values))) + r")(?![\w.:])")

    logs = "".join(run.stdout + run.stderr for run in runs)
    logs += "".join(p.read_text(errors="replace") for p in (airflow_env["home"] / "logs").rglob("*") if p.is_file())
    assert len(logs) > 10_000
    assert pattern.findall(logs) == []

    with sqlite3.connect(airflow_env["home"] / "airflow.db") as db:
        rendered = " ".join(str(row) for row in db.execute("SELECT rendered_fields FROM rendered_task_instance_fields"))
    assert "output_uri" in rendered
    assert pattern.findall(rendered) == []

    ledger_bytes = airflow_env["ledger_path"].read_bytes().decode("latin-1")
    # noised counts are published and may equal a true count by chance; the sum and row count never are
    unpublished = {adult_aggregates["mean_hours_per_week"]["sum"], adult_aggregates["mean_hours_per_week"]["count"]}
    assert [v for v in unpublished if str(v) in ledger_bytes] == []
