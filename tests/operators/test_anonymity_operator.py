"""AnonymityCheckOperator: called through ``execute(context)`` directly, without a running Airflow."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException

from dp_operators.anonymity import AnonymitySpecError
from dp_operators.operators.anonymity import AnonymityCheckOperator

from anonymity.anonymity_tables import li_patients_table

PATIENTS = li_patients_table()  # Li, Li, Venkatasubramanian 2007, Table 4

SPEC = """
version: 1
check: patients
quasi_identifiers: [zip, age]
sensitive_attributes:
  - {{name: salary, type: ordered}}
  - {{name: disease, type: categorical}}
targets: {{k: {k}, l: {{kind: distinct, l: 3}}, t: 0.6}}
on_failure: {on_failure}
"""


def write_spec(tmp_path: Path, k: int = 3, on_failure: str = "fail") -> Path:
    path = tmp_path / f"spec_{k}_{on_failure}.yaml"
    path.write_text(SPEC.format(k=k, on_failure=on_failure))
    return path


def make_context() -> dict:
    return {"outlet_events": defaultdict(lambda: SimpleNamespace(extra={}))}


@pytest.fixture()
def patients_csv(tmp_path: Path) -> Path:
    path = tmp_path / "patients.csv"
    PATIENTS.to_csv(path, index=False)
    return path


def test_csv_source_returns_report_and_sets_asset_event(tmp_path, patients_csv):
    asset = Asset("patients_microdata")
    op = AnonymityCheckOperator(
        task_id="check", spec=write_spec(tmp_path), source=str(patients_csv), outlets=[asset]
    )
    context = make_context()
    report = op.execute(context)
    assert report["passed"] is True
    assert report["k"] == 3
    assert report["sensitive_attributes"]["salary"]["t"] == pytest.approx(1 / 6)
    assert context["outlet_events"][asset].extra == report
    text = json.dumps(report, allow_nan=False)  # XCom- and asset-event-safe
    assert "gastritis" not in text and "4767*" not in text


def test_file_url_and_parquet_source(tmp_path):
    path = tmp_path / "patients.parquet"
    PATIENTS.to_parquet(path)
    op = AnonymityCheckOperator(task_id="check", spec=write_spec(tmp_path), source=f"file://{path}")
    assert op.execute(make_context())["rows"] == 9


def test_explicit_format_overrides_suffix(tmp_path):
    path = tmp_path / "patients.txt"
    PATIENTS.to_csv(path, index=False)
    op = AnonymityCheckOperator(task_id="check", spec=write_spec(tmp_path), source=str(path), source_format="csv")
    assert op.execute(make_context())["passed"] is True


def test_unknown_suffix_fails_clearly(tmp_path):
    path = tmp_path / "patients.txt"
    PATIENTS.to_csv(path, index=False)
    op = AnonymityCheckOperator(task_id="check", spec=write_spec(tmp_path), source=str(path))
    with pytest.raises(AirflowFailException, match="cannot tell the format"):
        op.execute(make_context())


def test_sql_source_through_the_connection_hook(tmp_path, monkeypatch):
    database = tmp_path / "patients.db"
    with sqlite3.connect(database) as connection:
        PATIENTS.to_sql("patients", connection, index=False)

    class SqliteFrameHook:
        def get_df(self, sql, df_type="pandas"):
            assert df_type == "pandas"
            with sqlite3.connect(database) as connection:
                return pd.read_sql_query(sql, connection)

    requested = []

    class FakeBaseHook:
        @staticmethod
        def get_connection(conn_id):
            requested.append(conn_id)
            return SimpleNamespace(get_hook=SqliteFrameHook)

    monkeypatch.setattr("dp_operators.operators.anonymity.BaseHook", FakeBaseHook)
    op = AnonymityCheckOperator(
        task_id="check", spec=write_spec(tmp_path), sql="SELECT * FROM patients", conn_id="patients_db"
    )
    assert op.execute(make_context())["rows"] == 9
    assert requested == ["patients_db"]


def test_failure_raises_airflow_fail_exception(tmp_path, patients_csv):
    op = AnonymityCheckOperator(task_id="check", spec=write_spec(tmp_path, k=4), source=str(patients_csv))
    with pytest.raises(AirflowFailException, match=r"anonymity check 'patients' failed: k: 3 vs target 4"):
        op.execute(make_context())


def test_warn_returns_failed_report(tmp_path, patients_csv, capsys):
    asset = Asset("patients_microdata")
    op = AnonymityCheckOperator(
        task_id="check", spec=write_spec(tmp_path, k=4, on_failure="warn"), source=str(patients_csv), outlets=[asset]
    )
    context = make_context()
    report = op.execute(context)
    assert report["passed"] is False
    assert context["outlet_events"][asset].extra["passed"] is False
    logged = capsys.readouterr()
    assert "k: 3 vs target 4" in logged.out + logged.err  # the task logger writes through structlog


@pytest.mark.parametrize(
    ("table", "match"),
    [
        pytest.param(PATIENTS.drop(columns="zip"), "unknown quasi-identifier column", id="unknown column"),
        pytest.param(PATIENTS.iloc[:0], "empty", id="empty table"),
        pytest.param(PATIENTS.assign(age=[None] + ["<=40"] * 8), "missing value", id="NaN in a QI"),
        pytest.param(PATIENTS.iloc[:2], "larger than the table", id="k larger than the table"),
    ],
)
def test_bad_input_fails_without_retry(tmp_path, table, match):
    path = tmp_path / "bad.csv"
    table.to_csv(path, index=False)
    op = AnonymityCheckOperator(task_id="check", spec=write_spec(tmp_path), source=str(path))
    with pytest.raises(AirflowFailException, match=match):
        op.execute(make_context())


def test_invalid_spec_fails_at_construction(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(SPEC.format(k=0, on_failure="fail"))
    with pytest.raises(AnonymitySpecError, match=rf"^{path}: targets.k: "):
        AnonymityCheckOperator(task_id="check", spec=path, source="x.csv")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({}, "exactly one of source", id="no source"),
        pytest.param({"source": "a.csv", "sql": "SELECT 1", "conn_id": "db"}, "exactly one of source", id="both"),
        pytest.param({"sql": "SELECT 1"}, "needs conn_id", id="sql without conn_id"),
        pytest.param({"source": "a.csv", "source_format": "xlsx"}, "source_format", id="unknown format"),
    ],
)
def test_source_arguments_are_checked_at_construction(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        AnonymityCheckOperator(task_id="check", spec=write_spec(tmp_path), **kwargs)


def test_operator_imports_only_the_airflow_sdk():
    source = Path(__import__("dp_operators.operators.anonymity", fromlist=["x"]).__file__).read_text()
    airflow_imports = [line for line in source.splitlines() if line.startswith(("from airflow", "import airflow"))]
    assert airflow_imports
    allowed = ("from airflow.sdk import", "from airflow.sdk.exceptions import")
    assert all(line.startswith(allowed) for line in airflow_imports)


def test_example_dag_generalises_and_checks_adult(tmp_path, monkeypatch):
    """Runs the example DAG's two tasks in order, by hand (no scheduler): Mondrian to k = 10, then the check."""
    import importlib.util

    repo_root = Path(__file__).resolve().parents[2]
    adult = repo_root.parent / "shared" / "data" / "adult.csv"
    if not adult.exists():
        pytest.skip(f"{adult} is missing: the shared test data must sit beside the project")
    monkeypatch.setenv("DP_OPERATORS_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("DP_OPERATORS_ADULT_CSV", str(adult))
    dag_file = repo_root / "dags" / "adult_anonymity_check.py"
    spec = importlib.util.spec_from_file_location("adult_anonymity_check_dag", dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    dag = module.adult_anonymity_check_dag
    assert dag.dag_id == "adult_anonymity_check"
    assert set(dag.task_dict) == {"generalise_adult", "check_adult_microdata"}
    loss = dag.task_dict["generalise_adult"].python_callable()
    assert loss["k"] >= 10 and loss["suppressed_fraction"] <= 0.01
    context = make_context()
    report = dag.task_dict["check_adult_microdata"].execute(context)
    assert report["k"] >= 10
    assert context["outlet_events"][module.adult_extract].extra["check"] == "adult_microdata"
