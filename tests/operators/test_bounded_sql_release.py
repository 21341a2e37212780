"""Releases whose contribution bounds the operator enforces from raw rows: ``DPSQLReleaseOperator(table=...)`` and
``rows_query=`` on SQLite and PostgreSQL, ``DPReleaseOperator(rows_uri=...)`` on a Parquet file; what the ledger and
the output record (enforced or declared, with the SQL's SHA-256); an account requiring enforced bounds refusing
hand-written queries before anything is read or charged; and the arguments refused when the DAG is parsed."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from dp_operators.ledger import AccountConfig, LedgerConfig
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sql import DPSQLReleaseOperator
from dp_operators.release.bounding import BoundedRowsSource, bounded_sql, bounded_sql_sha256
from dp_operators.spec import load_spec_with_hash

from airflow_fakes import NoXComTaskInstance, context_for
from ledger_backends import pg_database  # noqa: F401 - the PostgreSQL fixture (skips, or fails in CI, without PG)
from support import SPEND_KEY, governor, spender

DAG_ID = "clinic_visits_release"
SPEC = """\
version: 1
release: clinic_visits
budget_account: clinic
privacy_unit: patient
contribution: {max_partitions_contributed: 2, max_contributions_per_partition: 3}
aggregates:
  - name: visits_by_ward
    kind: count
    group_by: [ward]
    keys: {ward: [cardiology, oncology, surgery, paediatrics]}
    mechanism: discrete_gaussian
    budget: {rho: 0.05}
  - name: mean_bill
    kind: mean
    bounds: [0, 500]
    mechanism: discrete_gaussian
    budget: {rho: 0.05}
"""
VALUES = {"mean_bill": "bill"}


@pytest.fixture
def spec_path(tmp_path) -> Path:
    path = tmp_path / "clinic.yaml"
    path.write_text(SPEC)
    return path


def visits(seed: int = 5) -> list[tuple]:
    rng = random.Random(seed)
    wards = ["cardiology", "oncology", "surgery", "paediatrics", "dermatology"]
    return [(patient, rng.choice(wards), round(rng.uniform(-20, 900), 2))
            for patient in range(300) for _ in range(rng.randint(1, 12))]


def load_visits(engine: sa.Engine, rows: list[tuple]) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS visits")
        conn.exec_driver_sql("CREATE TABLE visits (patient integer, ward text, bill double precision)")
        conn.execute(sa.text("INSERT INTO visits VALUES (:p, :w, :b)"), [{"p": p, "w": w, "b": b} for p, w, b in rows])


@pytest.fixture(params=["sqlite", "postgresql"])
def warehouse(request, tmp_path, monkeypatch) -> tuple[str, sa.Engine]:
    """An Airflow connection id whose database holds ``visits`` (several rows per patient), and its engine."""
    if request.param == "sqlite":
        path = tmp_path / "warehouse.db"
        fields = {"conn_type": "sqlite", "host": str(path)}
        engine = sa.create_engine(f"sqlite:///{path}")
    else:
        url = request.getfixturevalue("pg_database")
        fields = {"conn_type": "postgres", "host": url.host, "port": url.port, "login": url.username,
                  "schema": url.database}
        engine = sa.create_engine(url)
    monkeypatch.setenv("AIRFLOW_CONN_CLINIC_WAREHOUSE", json.dumps(fields))
    load_visits(engine, visits())
    yield "clinic_warehouse", engine
    engine.dispose()


def clinic_ledger(tmp_path, monkeypatch, *, required: bool, **limits):
    """The clinic's SQLite ledger (a zCDP account of cap 1, or ``limits``: accountant, cap or epsilon, delta)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    officer = governor(url)
    officer.init_schema()
    limits = limits or {"accountant": "zcdp", "cap": Fraction(1), "delta": Fraction(1, 10**6)}
    officer.apply_config(LedgerConfig(version=1, accounts={"clinic": AccountConfig(
        **limits, privacy_unit="patient", allowed_dags=[DAG_ID], require_enforced_bounding=required)}))
    monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_CLINIC", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": url, "audit_key": SPEND_KEY.text}}))
    return spender(url)


def sql_release(spec_path, conn_id, tmp_path, **source) -> DPSQLReleaseOperator:
    return DPSQLReleaseOperator(task_id="release", spec_path=spec_path, conn_id=conn_id,
                                output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_clinic", **source)


def ti(**fields) -> NoXComTaskInstance:
    return NoXComTaskInstance(**{"dag_id": DAG_ID, **fields})


def test_a_table_release_is_enforced_and_records_the_generated_sql(spec_path, warehouse, tmp_path, monkeypatch):
    conn_id, engine = warehouse
    ledger = clinic_ledger(tmp_path, monkeypatch, required=True)
    output = sql_release(spec_path, conn_id, tmp_path, table="visits", privacy_unit_column="patient",
                         value_columns=VALUES).execute(context_for(ti()))
    spec, _ = load_spec_with_hash(spec_path)
    source = BoundedRowsSource(privacy_unit_column="patient", table="visits", value_columns=VALUES)
    for aggregate in spec.aggregates:
        expected = bounded_sql_sha256(bounded_sql(spec, aggregate, source, engine.dialect.name))
        assert output["contribution_bounding"][aggregate.name] == {
            "mode": "enforced", "source": "table", "privacy_unit_column": "patient", "sql_sha256": expected,
            "max_partitions_contributed": 2, "max_contributions_per_partition": 3}
    (charge,) = list(ledger.charges())
    assert {m["contribution_bounding"]["mode"] for m in json.loads(charge["mechanisms"])} == {"enforced"}
    assert len(output["aggregates"]["visits_by_ward"]["rows"]) == 4  # the public wards; dermatology is dropped
    # a retry replays the committed release without reading the table
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE visits")
    again = sql_release(spec_path, conn_id, tmp_path, table="visits", privacy_unit_column="patient",
                        value_columns=VALUES).execute(context_for(ti(try_number=2)))
    assert again == output and len(list(ledger.charges())) == 1


def test_hand_written_queries_are_recorded_as_declared(spec_path, warehouse, tmp_path, monkeypatch):
    conn_id, _ = warehouse
    ledger = clinic_ledger(tmp_path, monkeypatch, required=False)
    queries = {"visits_by_ward": "SELECT ward, COUNT(*) AS count FROM visits GROUP BY ward",
               "mean_bill": "SELECT SUM(CAST(bill AS INTEGER)) AS sum, COUNT(*) AS count FROM visits"}
    output = sql_release(spec_path, conn_id, tmp_path, queries=queries).execute(context_for(ti()))
    assert output["contribution_bounding"]["visits_by_ward"] == {
        "mode": "declared", "source": "query", "privacy_unit_column": None,
        "sql_sha256": bounded_sql_sha256(queries["visits_by_ward"])}
    (charge,) = list(ledger.charges())
    assert {m["contribution_bounding"]["mode"] for m in json.loads(charge["mechanisms"])} == {"declared"}


def test_an_account_requiring_enforced_bounds_refuses_queries_before_reading_or_charging(
        spec_path, tmp_path, monkeypatch):
    ledger = clinic_ledger(tmp_path, monkeypatch, required=True)
    monkeypatch.setenv("AIRFLOW_CONN_EMPTY_WAREHOUSE",
                       json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "empty.db")}))
    queries = {"visits_by_ward": "SELECT ward, COUNT(*) AS count FROM no_such_table GROUP BY ward",
               "mean_bill": "SELECT SUM(bill) AS sum, COUNT(*) AS count FROM no_such_table"}
    with pytest.raises(AirflowFailException, match=r"requires enforced contribution bounding.*\['mean_bill', "
                                                   r"'visits_by_ward'\].*Nothing was read or charged"):
        sql_release(spec_path, "empty_warehouse", tmp_path, queries=queries).execute(context_for(ti()))
    assert list(ledger.charges()) == []
    assert ledger.account("clinic").spent == 0


def test_a_rows_query_is_bounded_per_value_of_its_unit_column(spec_path, warehouse, tmp_path, monkeypatch):
    conn_id, _ = warehouse
    clinic_ledger(tmp_path, monkeypatch, required=True)
    rows_query = "SELECT patient, ward, bill FROM visits WHERE bill >= 0"
    output = sql_release(spec_path, conn_id, tmp_path, rows_query=rows_query, privacy_unit_column="patient",
                         value_columns=VALUES).execute(context_for(ti()))
    recorded = output["contribution_bounding"]["mean_bill"]
    assert (recorded["mode"], recorded["source"]) == ("enforced", "query")
    # the bound parameters are part of what is hashed: another value, another hash
    spec, _ = load_spec_with_hash(spec_path)
    source = BoundedRowsSource(privacy_unit_column="patient", query=rows_query, value_columns=VALUES)
    mean = next(a for a in spec.aggregates if a.name == "mean_bill")
    assert recorded["sql_sha256"] == bounded_sql_sha256(bounded_sql(spec, mean, source, warehouse[1].dialect.name))
    parameterised = sql_release(spec_path, conn_id, tmp_path, rows_query=rows_query + " AND bill < :limit",
                                parameters={"limit": 400}, privacy_unit_column="patient", value_columns=VALUES)
    first = parameterised.contribution_bounding()["mean_bill"]["sql_sha256"]
    parameterised.parameters = {"limit": 800}
    assert parameterised.contribution_bounding()["mean_bill"]["sql_sha256"] != first


def test_a_missing_table_fails_without_retry_before_any_charge(spec_path, tmp_path, monkeypatch):
    ledger = clinic_ledger(tmp_path, monkeypatch, required=False)
    monkeypatch.setenv("AIRFLOW_CONN_EMPTY_WAREHOUSE",
                       json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "empty.db")}))
    with pytest.raises(AirflowFailException, match="table 'visits' does not exist"):
        sql_release(spec_path, "empty_warehouse", tmp_path, table="visits", privacy_unit_column="patient",
                    value_columns=VALUES).execute(context_for(ti()))
    assert list(ledger.charges()) == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param({"privacy_unit_column": "patient_id", "value_columns": VALUES},
                     r"no column 'patient_id' \(aggregate 'visits_by_ward'; it has \['bill', 'note', 'patient', "
                     r"'ward'\]\)", id="a unit column the table lacks"),
        pytest.param({"privacy_unit_column": "patient", "value_columns": {"mean_bill": "amount"}},
                     "no column 'amount'", id="a value column the table lacks"),
        pytest.param({"privacy_unit_column": "patient", "value_columns": {"mean_bill": "note"}},
                     "the value column 'note' of aggregate 'mean_bill' in table 'visits' is TEXT, not a number",
                     id="a text value column"),
    ],
)
def test_the_table_schema_is_checked_before_any_charge(spec_path, warehouse, tmp_path, monkeypatch, arguments,
                                                      message):
    conn_id, engine = warehouse
    ledger = clinic_ledger(tmp_path, monkeypatch, required=False)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE visits ADD COLUMN note text")
    with pytest.raises(AirflowFailException, match=message):
        sql_release(spec_path, conn_id, tmp_path, table="visits", **arguments).execute(context_for(ti()))
    assert list(ledger.charges()) == []


def test_a_parquet_file_of_raw_rows_is_bounded_with_pandas(spec_path, tmp_path, monkeypatch):
    ledger = clinic_ledger(tmp_path, monkeypatch, required=True)
    rows = tmp_path / "visits.parquet"
    pd.DataFrame(visits(), columns=["patient", "ward", "bill"]).to_parquet(rows)
    output = DPReleaseOperator(task_id="release", spec_path=spec_path, rows_uri=f"file://{rows}",
                               privacy_unit_column="patient", value_columns=VALUES,
                               output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_clinic",
                               ).execute(context_for(ti()))
    assert output["contribution_bounding"]["mean_bill"] == {
        "mode": "enforced", "source": "file", "privacy_unit_column": "patient", "sql_sha256": None,
        "max_partitions_contributed": 2, "max_contributions_per_partition": 3,
        "rows_uri": f"file://{rows}"}
    assert len(list(ledger.charges())) == 1


def test_one_units_text_cell_in_a_csv_rows_file_changes_no_other_units_values(spec_path, tmp_path):
    """A CSV file is read cell by cell: one unit's stray text in the value column is that row's missing value, not
    a reason to read every value of the column as text."""
    from dp_operators.operators.raw_rows import bounded_file_aggregates

    spec, _ = load_spec_with_hash(spec_path)
    rows = list({p: (p, w, b) for p, w, b in visits()}.values())  # one visit a patient: no row is chosen
    base, neighbour = tmp_path / "base.csv", tmp_path / "neighbour.csv"
    pd.DataFrame(rows, columns=["patient", "ward", "bill"]).to_csv(base, index=False)
    pd.DataFrame(rows + [(999, "oncology", "unknown")], columns=["patient", "ward", "bill"]).to_csv(neighbour,
                                                                                                index=False)
    means = [bounded_file_aggregates(f"file://{path}", spec, "patient", VALUES)["mean_bill"]
             for path in (base, neighbour)]
    assert means[0] == means[1] and means[0]["count"] == len(rows)  # the text cell's row alone is dropped


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param({"table": "visits", "privacy_unit_column": "patient"}, "give the column whose values it adds",
                     id="a mean without its value column"),
        pytest.param({"table": "visits", "value_columns": VALUES}, "needs privacy_unit_column", id="no unit column"),
        pytest.param({"table": "visits", "privacy_unit_column": "patient",
                      "value_columns": {**VALUES, "visits_by_ward": "bill"}}, "is a count: it takes no value column",
                     id="a value column for a count"),
        pytest.param({"table": "visits", "privacy_unit_column": "patient",
                      "value_columns": {**VALUES, "median_bill": "bill"}}, r"names \['median_bill'\], which the spec",
                     id="an aggregate the spec does not release"),
        pytest.param({"table": "visits", "queries": {}, "privacy_unit_column": "patient"}, "exactly one of table=",
                     id="a table and queries"),
        pytest.param({"queries": {"visits_by_ward": "SELECT 1", "mean_bill": "SELECT 1"},
                      "privacy_unit_column": "patient"}, "describe raw rows", id="a unit column with queries"),
        pytest.param({}, "exactly one of table=", id="no source"),
    ],
)
def test_raw_rows_arguments_are_checked_when_the_dag_is_parsed(spec_path, tmp_path, arguments, message):
    with pytest.raises(ValueError, match=message):
        sql_release(spec_path, "any", tmp_path, **arguments)


def test_a_file_release_takes_its_unit_column_with_rows_uri_only(spec_path, tmp_path):
    with pytest.raises(ValueError, match="give them with rows_uri"):
        DPReleaseOperator(task_id="release", spec_path=spec_path, aggregates_uri="file:///a.json",
                          privacy_unit_column="patient")


def test_a_connection_without_a_known_dialect_is_refused_before_any_charge(spec_path, tmp_path, monkeypatch):
    ledger = clinic_ledger(tmp_path, monkeypatch, required=False)
    op = sql_release(spec_path, "clinic_unknown", tmp_path, table="visits", privacy_unit_column="patient",
                     value_columns=VALUES)
    monkeypatch.setattr(op, "get_db_hook", lambda: type("Hook", (), {"dialect_name": "default"})())
    with pytest.raises(AirflowFailException, match="no SQLAlchemy dialect"):
        op.execute(context_for(ti()))
    assert list(ledger.charges()) == []


MEDIAN_BY_WARD = """\
version: 1
release: clinic_bills
budget_account: clinic
privacy_unit: patient
contribution: {max_partitions_contributed: 2, max_contributions_per_partition: 3}
aggregates:
  - name: median_bill
    kind: median
    group_by: [ward]
    partition_selection: {budget: {epsilon: 1, delta: 1.0e-6}}
    bins: {column: bill, edges: [0, 1000], width: 50}
    mechanism: auto
    budget: {epsilon: 1}
"""


def test_a_median_over_wards_found_in_a_table_selects_them_by_their_patients(warehouse, tmp_path, monkeypatch):
    conn_id, _ = warehouse
    path = tmp_path / "bills.yaml"
    path.write_text(MEDIAN_BY_WARD)
    ledger = clinic_ledger(tmp_path, monkeypatch, required=True, accountant="approx_dp", epsilon=Fraction(10),
                           delta=Fraction(1, 10**4))
    output = sql_release(path, conn_id, tmp_path, table="visits", privacy_unit_column="patient").execute(
        context_for(ti()))
    published = output["aggregates"]["median_bill"]
    # every ward has about a hundred patients: far above the threshold, so all five are found and released
    assert [row["ward"] for row in published["rows"]] == ["cardiology", "dermatology", "oncology", "paediatrics",
                                                          "surgery"]
    assert published["partition_selection"]["threshold"] > 1
    assert output["contribution_bounding"]["median_bill"]["mode"] == "enforced"
    (charge,) = list(ledger.charges())
    assert Fraction(charge["amount"]) == 2
    assert [m["component"] for m in json.loads(charge["mechanisms"])] == ["selection", "quantile"]
