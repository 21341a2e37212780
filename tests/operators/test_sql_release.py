"""SQL sources: ``query_aggregates`` and ``DPSQLReleaseOperator`` on real databases holding UCI Adult (SQLite through
the sqlite provider's ``SqliteHook``; PostgreSQL, where ``SUM`` returns ``NUMERIC``, read as exact ``Decimal``),
compared with the same aggregates computed in memory; and every refusal, raised before any budget is spent."""

from __future__ import annotations

import importlib.util
import json
import logging
import sqlite3
from decimal import Decimal
from functools import cache
from pathlib import Path

import jinja2
import pytest

from airflow.providers.sqlite.hooks.sqlite import SqliteHook
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from dp_operators.operators.sources import query_aggregates
from dp_operators.operators.sql import DPSQLReleaseOperator
from dp_operators.release import ReleaseInputError
from dp_operators.release.inputs import prepare_inputs

from ledger_backends import pg_database  # noqa: F401 - the PostgreSQL fixture (skips, or fails in CI, without PG)
from source_tables import adult_table, assert_same_inputs, hours_per_day_by_sex, hours_spec
from airflow_fakes import NoXComTaskInstance, context_for
from support import EXAMPLE_SPEC, REPO, SPEND_KEY, make_ledger

DAG_ID = "adult_sql_release"


@cache
def sql_dag_module():
    """``dags/adult_sql_release.py`` as a module (its queries and loader are what the tests run)."""
    spec = importlib.util.spec_from_file_location("adult_sql_release_dag", REPO / "dags" / "adult_sql_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def set_connection(monkeypatch, conn_id: str, **fields) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    return conn_id


@pytest.fixture
def adult_sqlite(tmp_path, monkeypatch, adult_csv) -> str:
    """A connection id whose SQLite database holds the table ``adult``, loaded by the example DAG's loader."""
    conn_id = set_connection(monkeypatch, "adult_test_sqlite", conn_type="sqlite", host=str(tmp_path / "adult.db"))
    sql_dag_module().load_adult_table(adult_csv, conn_id)
    return conn_id


@pytest.fixture
def adult_postgres(pg_database, monkeypatch, adult_csv):  # noqa: F811
    """A PostgreSQL connection id whose database holds ``adult`` (the example DAG's loader) and ``adult_hours``
    (``hours_per_day NUMERIC(6, 2)``); both tables are dropped afterwards."""
    conn_id = set_connection(
        monkeypatch, "adult_test_postgres", conn_type="postgres", host=pg_database.host, port=pg_database.port,
        login=pg_database.username, schema=pg_database.database,
    )
    sql_dag_module().load_adult_table(adult_csv, conn_id)
    table = adult_table(adult_csv)
    hook = BaseHook.get_hook(conn_id)
    with hook.get_conn() as connection:  # one transaction, committed on exit
        connection.execute("CREATE TABLE adult_hours (sex text NOT NULL, hours_per_day numeric(6, 2) NOT NULL)")
        with connection.cursor() as cursor:
            cursor.executemany("INSERT INTO adult_hours VALUES (%s, %s)",
                               list(zip(table["sex"], table["hours_per_day"])))
    try:
        yield conn_id
    finally:
        with hook.get_conn() as connection:
            connection.execute("DROP TABLE IF EXISTS adult_hours")
            connection.execute("DROP TABLE IF EXISTS adult")


def test_sqlite_queries_read_as_the_in_memory_aggregates(adult_sqlite, example_spec, adult_aggregates):
    read = query_aggregates(SqliteHook(sqlite_conn_id=adult_sqlite), sql_dag_module().QUERIES, example_spec)
    assert_same_inputs(example_spec, read, adult_aggregates)


@pytest.mark.parametrize(
    "nobody",
    [pytest.param("WHERE age > 200 GROUP BY sex", id="WHERE ... GROUP BY"),
     pytest.param("GROUP BY sex HAVING COUNT(*) > 1000000", id="HAVING")],
)
def test_an_ungrouped_query_without_a_row_is_the_empty_aggregate(adult_sqlite, example_spec, nobody):
    """A query returning no row (whether it does can depend on one person) reads as what SQL computes over no row
    without GROUP BY: COUNT 0, SUM NULL; never a refusal. With rows, it reads as usual (and two rows are refused)."""
    hook = SqliteHook(sqlite_conn_id=adult_sqlite)
    sql = "SELECT SUM(hours_per_week) AS sum, COUNT(*) AS count FROM adult "
    queries = dict(sql_dag_module().QUERIES, mean_hours_per_week=sql + nobody)
    read = query_aggregates(hook, queries, example_spec)
    over_nobody = query_aggregates(hook, dict(queries, mean_hours_per_week=sql + "WHERE age > 200"), example_spec)
    assert read["mean_hours_per_week"] == over_nobody["mean_hours_per_week"]
    assert read["mean_hours_per_week"]["count"] == 0  # the comparison above is of an empty aggregate
    assert_same_inputs(example_spec, read, over_nobody)


def test_postgresql_sums_are_exact_decimals(adult_postgres, example_spec, adult_aggregates, adult_csv):
    hook = BaseHook.get_hook(adult_postgres)
    # the example DAG's portable queries: PostgreSQL's SUM over an integer column is a NUMERIC
    read = query_aggregates(hook, sql_dag_module().QUERIES, example_spec)
    assert type(read["mean_hours_per_week"]["sum"]) is Decimal
    assert_same_inputs(example_spec, read, adult_aggregates)
    # a NUMERIC column with cents: SUM is an exact Decimal with a fraction, which a binary float could not carry
    spec = hours_spec()
    query = {"hours_per_day_by_sex": "SELECT sex, SUM(hours_per_day) AS sum, COUNT(*) AS count FROM adult_hours "
                                     "GROUP BY sex"}
    read = query_aggregates(hook, query, spec)
    assert all(type(row["sum"]) is Decimal for row in read["hours_per_day_by_sex"])
    assert_same_inputs(spec, read, hours_per_day_by_sex(adult_csv))
    as_floats = {"hours_per_day_by_sex": [dict(row, sum=float(row["sum"])) for row in read["hours_per_day_by_sex"]]}
    with pytest.raises(ReleaseInputError, match="upstream.arithmetic is 'exact'"):  # negative control
        prepare_inputs(spec, as_floats)


def test_postgresql_errors_withhold_the_database_message(adult_postgres, example_spec):
    """PostgreSQL quotes the offending value in a cast error; the task error names the class only."""
    queries = dict(sql_dag_module().QUERIES)
    queries["people_by_education_sex"] = (
        "SELECT education, sex, CAST(education AS integer) AS count FROM adult GROUP BY education, sex"
    )
    with pytest.raises(AirflowFailException, match="failed with InvalidTextRepresentation") as caught:
        query_aggregates(BaseHook.get_hook(adult_postgres), queries, example_spec)
    assert "Bachelors" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    queries["people_by_education_sex"] = "SELEC education"
    with pytest.raises(AirflowFailException, match="failed with SyntaxError"):
        query_aggregates(BaseHook.get_hook(adult_postgres), queries, example_spec)


class NoConnection:
    """A hook that fails the test if a query is run."""

    def get_conn(self):
        raise AssertionError("a query ran although the queries do not match the spec")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(lambda q: q.pop("people_by_age_band"), r"queries misses \['people_by_age_band'\]",
                     id="missing query"),
        pytest.param(lambda q: q.update(people_by_race="SELECT 1"), r"queries names \['people_by_race'\] that the "
                     "spec does not release", id="extra query"),
    ],
)
def test_queries_must_match_the_spec_before_anything_runs(example_spec, change, message):
    queries = dict(sql_dag_module().QUERIES)
    change(queries)
    with pytest.raises(AirflowFailException, match=message):
        query_aggregates(NoConnection(), queries, example_spec)


@pytest.mark.parametrize(
    ("aggregate", "query", "error", "message"),
    [
        pytest.param("people_by_education_sex", "SELECT education, sex, COUNT(*) AS n FROM adult GROUP BY 1, 2",
                     AirflowFailException, r"has no column 'count' \(it has \['education', 'sex', 'n'\]\)",
                     id="missing column"),
        pytest.param("people_by_education_sex",
                     "SELECT education, sex, COUNT(*) AS count, SUM(age) AS count FROM adult GROUP BY 1, 2",
                     AirflowFailException, "has 2 columns named 'count'", id="ambiguous column"),
        pytest.param("people_by_age_band", "CREATE TEMP TABLE scratch (a)", AirflowFailException,
                     "returned no result set", id="no result set"),
        pytest.param("people_by_age_band", "SELECT age_band, COUNT(*) AS count FROM absent_table GROUP BY 1",
                     AirflowException, r"failed with OperationalError \(the database's message is withheld",
                     id="missing table (SQLite: retryable OperationalError)"),
    ],
)
def test_query_refusals(adult_sqlite, example_spec, aggregate, query, error, message):
    queries = dict(sql_dag_module().QUERIES, **{aggregate: query})
    with pytest.raises(error, match=message) as caught:
        query_aggregates(SqliteHook(sqlite_conn_id=adult_sqlite), queries, example_spec)
    assert "absent_table" not in str(caught.value)  # the driver's own text is withheld
    if error is AirflowException:
        assert not isinstance(caught.value, AirflowFailException)


def test_columns_match_case_insensitively_and_text_values_are_refused_by_the_engine(adult_sqlite, example_spec):
    queries = dict(sql_dag_module().QUERIES)
    queries["people_by_education_sex"] = "SELECT education AS EDUCATION, sex AS Sex, COUNT(*) AS COUNT FROM adult " \
                                         "GROUP BY 1, 2"
    read = query_aggregates(SqliteHook(sqlite_conn_id=adult_sqlite), queries, example_spec)
    assert set(read["people_by_education_sex"][0]) == {"education", "sex", "count"}
    queries["people_by_education_sex"] = "SELECT education, sex, 'many' AS count FROM adult GROUP BY 1, 2"
    read = query_aggregates(SqliteHook(sqlite_conn_id=adult_sqlite), queries, example_spec)
    with pytest.raises(ReleaseInputError, match="field 'count' holds a str, not a number") as caught:
        prepare_inputs(example_spec, read)
    assert "many" not in str(caught.value)


# --- the operator ----------------------------------------------------------------------------------------------


def FakeTaskInstance(**fields) -> NoXComTaskInstance:  # noqa: N802 - DPSQLReleaseOperator must not read XCom
    return NoXComTaskInstance(**{"dag_id": DAG_ID, **fields})



@pytest.fixture
def ledger_conn(tmp_path, monkeypatch):
    ledger = make_ledger(tmp_path / "ledger.db", dags=(DAG_ID,))
    set_connection(monkeypatch, "dp_ledger_test", conn_type="dp_ledger",
                   extra={"url": f"sqlite:///{tmp_path / 'ledger.db'}", "audit_key": SPEND_KEY.text})
    return ledger


def sql_operator(tmp_path: Path, conn_id: str, **overrides) -> DPSQLReleaseOperator:
    arguments = {"task_id": "release", "spec_path": EXAMPLE_SPEC, "conn_id": conn_id,
                 "queries": sql_dag_module().QUERIES, "output_uri": f"file://{tmp_path / 'out'}",
                 "ledger_conn_id": "dp_ledger_test", **overrides}
    return DPSQLReleaseOperator(**arguments)


def test_operator_releases_from_sql_and_a_retry_runs_no_query(tmp_path, adult_sqlite, ledger_conn, capsys):
    ti = FakeTaskInstance()
    output = sql_operator(tmp_path, adult_sqlite).execute(context_for(ti))
    assert len(output["aggregates"]["people_by_education_sex"]["rows"]) == 32
    assert len(list(ledger_conn.charges())) == 1
    # the table is gone: a retry of the committed release replays it without querying
    with sqlite3.connect(BaseHook.get_connection(adult_sqlite).host) as connection:
        connection.execute("DROP TABLE adult")
    assert sql_operator(tmp_path, adult_sqlite).execute(context_for(FakeTaskInstance(try_number=2))) == output
    assert len(list(ledger_conn.charges())) == 1
    assert "reading the aggregates of 4 queries on connection 'adult_test_sqlite'" in capsys.readouterr().out


def test_operator_logs_no_true_aggregate(tmp_path, adult_sqlite, ledger_conn, adult_aggregates, capsys, caplog):
    with caplog.at_level(logging.DEBUG):
        sql_operator(tmp_path, adult_sqlite).execute(context_for(FakeTaskInstance()))
    logged = capsys.readouterr().out + caplog.text
    total = adult_aggregates["mean_hours_per_week"]
    assert str(total["sum"]) not in logged and str(total["count"]) not in logged


def test_a_connection_without_a_sql_hook_is_refused_before_any_charge(tmp_path, ledger_conn):
    with pytest.raises(AirflowFailException, match="gives a DPLedgerHook, not a common.sql DbApiHook"):
        sql_operator(tmp_path, "dp_ledger_test").execute(context_for(FakeTaskInstance()))
    assert list(ledger_conn.charges()) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param({"queries": {"people_by_age_band": "SELECT 1"}},
                     r"missing \['people_by_education_sex', 'mean_hours_per_week', 'median_hours_per_week'\]",
                     id="missing queries"),
        pytest.param({"queries": dict(sql_dag_module().QUERIES, people_by_race="SELECT 1")},
                     r"not in the spec: \['people_by_race'\]", id="extra query"),
        pytest.param({"aggregates_task_id": "compute"}, "drop aggregates_task_id", id="an XCom source too"),
    ],
)
def test_construction_refuses_queries_that_do_not_match_the_spec(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        sql_operator(tmp_path, "any", **overrides)


def test_queries_and_parameters_are_templated_like_sql_execute_query(tmp_path):
    assert {"queries", "parameters"} <= set(DPSQLReleaseOperator.template_fields)
    (tmp_path / "bands.sql").write_text("SELECT '{{ params.band }}' AS age_band, COUNT(*) AS count FROM adult")
    queries = dict(sql_dag_module().QUERIES, people_by_age_band="bands.sql")
    op = sql_operator(tmp_path, "any", queries=queries, parameters={"day": "{{ ds }}"})
    op.render_template_fields({"ds": "2026-01-05", "params": {"band": "17-24"}},
                              jinja_env=jinja2.Environment(loader=jinja2.FileSystemLoader(tmp_path)))
    assert op.queries["people_by_age_band"] == "SELECT '17-24' AS age_band, COUNT(*) AS count FROM adult"
    assert op.parameters == {"day": "2026-01-05"}


def test_the_example_dag_releases_the_example_spec_from_sql():
    module = sql_dag_module()
    dag = module.adult_sql_release()
    release = dag.get_task("release")
    assert isinstance(release, DPSQLReleaseOperator)
    assert release.conn_id == "adult_sqlite" and release.queries == module.QUERIES
    assert {a.name for a in release.release_spec.aggregates} == set(module.QUERIES)
    assert dag.get_task("load_adult").downstream_task_ids == {"release"}
