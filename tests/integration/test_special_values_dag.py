"""NaN and infinities from an upstream task through XCom under real Airflow (``airflow dags test``; docs/adr/0014):
wrapped with ``aggregates_for_xcom`` they reach the release, which handles them by the spec's ``non_finite``
policies and behaves as on a finite neighbour; returned raw, Airflow's XCom push fails the upstream task."""

from __future__ import annotations

import json
import re
import sqlite3
from fractions import Fraction
from pathlib import Path

import pytest

from airflow_home import airflow_environment, migrate_metadata, run
from support import REPO, make_ledger

# slow: a further real Airflow deployment beyond the main example DAG's (ADR 30)
pytestmark = [pytest.mark.integration, pytest.mark.slow]
DAGS = Path(__file__).with_name("special_values_dags")
DAG_IDS = ("special_values_xcom", "special_values_finite", "special_values_raw")


@pytest.fixture(scope="module")
def special_run(tmp_path_factory):
    """One ``dags test`` run of each DAG in one Airflow home: logs, task states, outputs, diagnostics, charges."""
    home = tmp_path_factory.mktemp("airflow_special_values")
    ledger = make_ledger(home / "ledger.db", cap="100", accountant="pure_dp", dags=DAG_IDS,
                         account="special_values_test")
    env = airflow_environment(home, dags_folder=DAGS, DP_OPERATORS_DIAGNOSTICS_URI=f"file://{home / 'private'}")
    migrate_metadata(env)
    logs = {dag_id: run(env, "airflow", "dags", "test", dag_id) for dag_id in DAG_IDS}
    with sqlite3.connect(home / "airflow.db") as db:
        states = {(dag_id, task): state for dag_id, task, state in
                  db.execute("SELECT dag_id, task_id, state FROM task_instance")}
    outputs, diagnostics = {}, {}
    for dag_id in DAG_IDS:
        published = list((home / "releases" / "special_values" / dag_id).rglob("release.json"))
        outputs[dag_id] = json.loads(published[0].read_text()) if published else None
        reports = list((home / "private" / "special_values" / dag_id).rglob("release~diagnostics.json"))
        diagnostics[dag_id] = json.loads(reports[0].read_text())["aggregates"] if reports else None
    return {"logs": {d: r.stdout + r.stderr for d, r in logs.items()}, "states": states, "outputs": outputs,
            "diagnostics": diagnostics, "charges": list(ledger.charges())}


def schema(output: dict) -> dict:
    """What a release publishes, less its noised numbers: aggregates, keys, fields, mechanisms."""
    return {name: {"fields": sorted(aggregate), "rows": [
        ([row[column] for column in aggregate["group_by"]], sorted(row)) for row in aggregate.get("rows", [])
    ]} for name, aggregate in output["aggregates"].items()}


def test_nan_and_infinities_wrapped_for_xcom_reach_the_release_and_follow_the_spec_policies(special_run):
    """The float and Decimal NaN counts become 0, the infinite binary64 sums are dropped (``infinity: drop``)
    and the Decimal NaN sum becomes 0 (``nan: replace``), as the diagnostics of the release record."""
    states = special_run["states"]
    assert states[("special_values_xcom", "compute_aggregates")] == "success"
    assert states[("special_values_xcom", "release")] == "success", special_run["logs"]["special_values_xcom"][-3000:]
    seen = special_run["diagnostics"]["special_values_xcom"]
    assert seen["people"]["special_values"] == {"count": {"nan": 2}}
    assert seen["income"]["special_values"] == {"sum": {"infinity": 2}} and seen["income"]["rows_dropped"] == 2
    assert seen["hours"]["special_values"] == {"sum": {"nan": 1}}
    output = special_run["outputs"]["special_values_xcom"]
    assert [row["city"] for row in output["aggregates"]["people"]["rows"]] == ["a", "b", "c"]


def test_a_finite_neighbour_publishes_the_same_schema_at_the_same_charge(special_run):
    """Replacing each special value by a finite one of the same type changes no refusal, no published field and no
    charge (DESIGN.md 2.4)."""
    states, outputs = special_run["states"], special_run["outputs"]
    assert states[("special_values_finite", "release")] == states[("special_values_xcom", "release")] == "success"
    assert special_run["diagnostics"]["special_values_finite"]["people"]["special_values"] == {}
    assert schema(outputs["special_values_finite"]) == schema(outputs["special_values_xcom"])
    amounts = {charge["dag_id"]: (charge["state"], Fraction(charge["amount"])) for charge in special_run["charges"]}
    assert amounts["special_values_finite"] == amounts["special_values_xcom"] == ("committed", Fraction(3))


def test_a_raw_nan_fails_the_upstream_task_with_the_message_the_operator_docs_explain(special_run):
    """Returned unwrapped, the NaN fails Airflow's XCom push in the upstream task: the release never runs and
    nothing is charged. docs/operators.md quotes Airflow's message next to the fix, so a search for it finds it."""
    states = special_run["states"]
    assert states[("special_values_raw", "compute_aggregates")] == "failed"
    assert states[("special_values_raw", "release")] == "upstream_failed"
    assert [c for c in special_run["charges"] if c["dag_id"] == "special_values_raw"] == []
    message = "Out of range float values are not JSON compliant"
    assert message in special_run["logs"]["special_values_raw"]
    docs = " ".join((REPO / "docs" / "operators.md").read_text().split())  # lines folded as a reader sees them
    hint = docs[docs.index(message):][:1500]
    assert re.search(r"aggregates_for_xcom\(", hint), "docs/operators.md names the error but not the fix"
