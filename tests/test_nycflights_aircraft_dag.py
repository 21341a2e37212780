"""The example DAG dags/nycflights_aircraft_release.py: the 2013 NYC flights with the aircraft (``tailnum``) as the
privacy unit, read as raw rows by ``DPSQLReleaseOperator(table=..., privacy_unit_column=...)``, which bounds each
aircraft's contributions itself in SQLite. Its release task is executed in-process (the slice of Airflow's context
it reads: tests/airflow_fakes.py) on a SQLite ledger holding the example account ``nyc_aircraft`` of
config/ledgers.yaml, which requires enforced bounding: the release is charged with every aggregate ``enforced``,
while the same spec with hand-written ``queries=`` is refused before any charge."""

from __future__ import annotations

import json
import sqlite3
from fractions import Fraction

import pytest

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowFailException
from dp_operators.ledger import LedgerConfig, load_ledger_config
from dp_operators.operators.sources import query_aggregates
from dp_operators.operators.sql import DPSQLReleaseOperator
from dp_operators.release.bounding import bounded_sql, bounded_sql_sha256

from airflow_fakes import NoXComTaskInstance, context_for
from dags_loader import dag_file_module
from support import REPO, SPEND_KEY, governor, spender

DAG_ID = "nycflights_aircraft_release"
ACCOUNT = "nyc_aircraft"
CONN_ID = "nycflights_aircraft_test"
CHARGE = Fraction(1, 5)  # the spec's rho: 0.05 + 0.1 (the mean's two halves) + 0.05

#: The spec's aggregates computed by hand-written queries, as an author declaring the bounds would write them.
HAND_WRITTEN = {
    "flights_by_origin": "SELECT origin, COUNT(*) AS count FROM flights GROUP BY origin",
    "mean_dep_delay_by_origin": (
        "SELECT origin, SUM(MIN(MAX(dep_delay, -30), 300)) AS sum, COUNT(*) AS count FROM flights "
        "WHERE dep_delay IS NOT NULL GROUP BY origin"
    ),
    "flights_by_carrier": "SELECT carrier, COUNT(*) AS count FROM flights GROUP BY carrier",
}


def dag_module():
    """``dags/nycflights_aircraft_release.py`` as a module (``dags/`` is not a package: Airflow loads it by path)."""
    return dag_file_module("nycflights_aircraft_release")


@pytest.fixture(scope="module")
def flights_db(tmp_path_factory):
    """A connection id whose SQLite database holds the 336,776 flights, loaded once per module by the example
    DAG's own loader; yields (connection id, database path)."""
    database = tmp_path_factory.mktemp("nycflights-aircraft") / "nycflights.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({"conn_type": "sqlite", "host": str(database)}))
        dag_module().load_flights_table(CONN_ID)
        yield CONN_ID, database


@pytest.fixture
def aircraft_ledger(tmp_path, monkeypatch):
    """An empty SQLite ledger with the example account ``nyc_aircraft`` as config/ledgers.yaml defines it, and the
    operators' connection ``dp_ledger_test`` to it; returns the spender's view."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    officer = governor(url)
    officer.init_schema()
    account = load_ledger_config(REPO / "config" / "ledgers.yaml").accounts[ACCOUNT]
    officer.apply_config(LedgerConfig(version=1, accounts={ACCOUNT: account}))
    monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_TEST", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": url, "audit_key": SPEND_KEY.text}}))
    return spender(url)


def release_operator(tmp_path, conn_id: str, **overrides) -> DPSQLReleaseOperator:
    """The example DAG's release task, with the test's connection, output folder and ledger connection."""
    module = dag_module()
    arguments = {"task_id": "release", "spec_path": module.SPEC, "conn_id": conn_id, "table": module.TABLE,
                 "privacy_unit_column": module.PRIVACY_UNIT_COLUMN, "value_columns": module.VALUE_COLUMNS,
                 "output_uri": f"file://{tmp_path / 'out'}", "ledger_conn_id": "dp_ledger_test", **overrides}
    return DPSQLReleaseOperator(**arguments)


def test_the_example_dag_reads_raw_rows_with_the_aircraft_as_privacy_unit():
    module = dag_module()
    dag = module.nycflights_aircraft_release()
    release = dag.get_task("release")
    assert isinstance(release, DPSQLReleaseOperator)
    assert release.queries is None
    assert (release.conn_id, release.table, release.privacy_unit_column) == ("nycflights_sqlite", "flights", "tailnum")
    assert release.value_columns == {"mean_dep_delay_by_origin": "dep_delay"}
    assert dag.get_task("load_flights").downstream_task_ids == {"release"}
    # the example account: the spec's unit, this DAG only, enforced bounding required, five runs of the spec
    account = load_ledger_config(REPO / "config" / "ledgers.yaml").accounts[ACCOUNT]
    assert release.release_spec.budget_account == ACCOUNT
    assert account.privacy_unit == release.release_spec.privacy_unit == "aircraft"
    assert account.allowed_dags == [DAG_ID] and account.require_enforced_bounding is True
    assert account.cap / CHARGE == 5


def test_the_release_bounds_every_aircraft_in_the_database_and_records_it_as_enforced(
        tmp_path, flights_db, aircraft_ledger):
    conn_id, database = flights_db
    operator = release_operator(tmp_path, conn_id)
    output = operator.execute(context_for(NoXComTaskInstance(dag_id=DAG_ID)))

    spec = operator.release_spec
    names = [aggregate.name for aggregate in spec.aggregates]
    # the SQL an auditor re-creates from the spec and the operator's arguments is the SQL whose hash was recorded
    source = operator.rows_source()
    expected = {aggregate.name: bounded_sql_sha256(bounded_sql(spec, aggregate, source, "sqlite"))
                for aggregate in spec.aggregates}
    bounds = {aggregate.name: spec.contribution_for(aggregate) for aggregate in spec.aggregates}
    assert output["contribution_bounding"] == {
        name: {"mode": "enforced", "source": "table", "privacy_unit_column": "tailnum", "sql_sha256": expected[name],
               "max_partitions_contributed": bounds[name].max_partitions_contributed,
               "max_contributions_per_partition": bounds[name].max_contributions_per_partition}
        for name in names
    }
    assert output["contribution_bounding"]["mean_dep_delay_by_origin"]["max_contributions_per_partition"] == 25
    steps = output["mechanisms"]
    assert sorted({step["aggregate"] for step in steps}) == sorted(names)
    assert len(steps) == 4  # two counts and a mean's sum and count
    for step in steps:
        assert step["contribution_bounding"]["mode"] == "enforced"
        assert step["contribution_bounding"]["sql_sha256"] == expected[step["aggregate"]]

    charges = list(aircraft_ledger.charges())
    assert [(c["account"], c["state"], Fraction(c["amount"])) for c in charges] == [(ACCOUNT, "committed", CHARGE)]
    assert aircraft_ledger.account(ACCOUNT).spent == CHARGE

    # the counts by origin: every aircraft departs from at most the 3 airports (L0 = 3 leaves no choice), and at most
    # 250 of its departures from one are counted, a fixed number; the release is noised around it
    with sqlite3.connect(database) as db:
        bounded = dict(db.execute(
            "SELECT origin, SUM(MIN(n, 250)) FROM (SELECT tailnum, origin, COUNT(*) AS n FROM flights "
            "WHERE tailnum IS NOT NULL GROUP BY tailnum, origin) GROUP BY origin"))
    rows = output["aggregates"]["flights_by_origin"]["rows"]
    assert {row["origin"] for row in rows} == {"EWR", "JFK", "LGA"}
    for row in rows:
        assert abs(row["value"] - bounded[row["origin"]]) < 4 * row["half_width"]
    assert len(output["aggregates"]["flights_by_carrier"]["rows"]) == 16
    delays = {row["origin"]: row["value"] for row in output["aggregates"]["mean_dep_delay_by_origin"]["rows"]}
    assert all(-30 <= delay <= 300 for delay in delays.values())


def test_hand_written_queries_on_the_account_requiring_enforced_bounding_are_refused_before_any_charge(
        tmp_path, flights_db, aircraft_ledger):
    conn_id, _ = flights_db
    operator = release_operator(tmp_path, conn_id, table=None, privacy_unit_column=None, value_columns=None,
                                queries=HAND_WRITTEN)
    assert set(operator.contribution_bounding()) == set(HAND_WRITTEN)
    assert {record["mode"] for record in operator.contribution_bounding().values()} == {"declared"}
    read = []
    operator.read_aggregates = lambda context: read.append(context) or pytest.fail("the queries ran")
    with pytest.raises(AirflowFailException, match="requires enforced contribution bounding") as caught:
        operator.execute(context_for(NoXComTaskInstance(dag_id=DAG_ID)))
    assert "require_enforced_bounding" in str(caught.value)
    assert read == []  # refused before anything was read
    assert list(aircraft_ledger.charges()) == []
    account = aircraft_ledger.account(ACCOUNT)
    assert (account.spent, account.reserved) == (0, 0)
    assert not (tmp_path / "out").exists()  # nothing published
    # the negative control: the queries are good ones, so the refusal is the account's policy, not a broken query
    aggregates = query_aggregates(BaseHook.get_hook(conn_id), HAND_WRITTEN, operator.release_spec)
    assert set(aggregates) == set(HAND_WRITTEN)
