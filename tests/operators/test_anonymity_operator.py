"""AnonymityCheckOperator and AnonymiseOperator: called through ``execute(context)`` directly, without a running
Airflow (as Airflow's own provider tests do), with a fake task instance recording XCom pushes."""

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

from dp_operators.anonymity import AnonymitySpecError, load_anonymity_spec
from dp_operators.anonymity.anonymise import anonymise
from dp_operators.operators.anonymity import AnonymiseOperator, AnonymityCheckOperator

from airflow_fakes import FakeTaskInstance
from anonymity.anonymity_tables import ARX_DIR, ARX_QIS, li_patients_table, outlier_table

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


def make_context(ti: FakeTaskInstance | None = None) -> dict:
    context = {"outlet_events": defaultdict(lambda: SimpleNamespace(extra={}))}
    if ti is not None:
        context["ti"] = ti
    return context


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

    monkeypatch.setattr("dp_operators.operators.microdata_files.BaseHook", FakeBaseHook)
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


@pytest.mark.parametrize("module", ["dp_operators.operators.anonymity", "dp_operators.operators.microdata_files"])
def test_operator_imports_only_the_airflow_sdk(module):
    source = Path(__import__(module, fromlist=["x"]).__file__).read_text()
    airflow_imports = [line for line in source.splitlines() if line.startswith(("from airflow", "import airflow"))]
    assert airflow_imports
    allowed = ("from airflow.sdk import", "from airflow.sdk.exceptions import")
    assert all(line.startswith(allowed) for line in airflow_imports)




# -- the check operator's report file and failure report ------------------------------------------------------------

TWO_FAILURES_SPEC = """
version: 1
check: patients
quasi_identifiers: [zip, age]
sensitive_attributes:
  - {name: salary, type: ordered}
targets: {k: 4, t: 0.1}
on_failure: fail
"""


def test_check_writes_the_report_file_on_success(tmp_path, patients_csv):
    report_path = tmp_path / "reports" / "patients.json"  # the folder is created
    ti = FakeTaskInstance()
    op = AnonymityCheckOperator(
        task_id="check", spec=write_spec(tmp_path), source=str(patients_csv), report_path=str(report_path)
    )
    report = op.execute(make_context(ti))
    assert report["passed"] is True
    assert json.loads(report_path.read_text()) == report
    assert ti.pushed == {}  # the report is the return value; nothing else is pushed on success


def test_check_failure_writes_and_pushes_the_report_and_lists_every_failed_target(tmp_path, patients_csv):
    spec = tmp_path / "two_failures.yaml"
    spec.write_text(TWO_FAILURES_SPEC)
    report_path = tmp_path / "patients.json"
    ti = FakeTaskInstance()
    op = AnonymityCheckOperator(task_id="check", spec=spec, source=f"file://{patients_csv}", report_path=f"file://{report_path}")
    with pytest.raises(AirflowFailException) as caught:
        op.execute(make_context(ti))
    written = json.loads(report_path.read_text())
    assert written["passed"] is False
    assert ti.pushed == {"anonymity_report": written}
    message = str(caught.value)
    # Table 4 of Li et al.: three classes of 3 rows; salary's t is 1/6 (the paper's 0.167).
    assert "k: 3 vs target 4 (3 failing classes)" in message
    assert "t on salary: 0.1667 vs target 0.1" in message
    assert len(written["failed_targets"]) == 2 and all(line in message for line in written["failed_targets"])


def test_check_that_cannot_run_writes_an_error_report(tmp_path):
    path = tmp_path / "bad.csv"
    PATIENTS.drop(columns="zip").to_csv(path, index=False)
    report_path = tmp_path / "patients.json"
    ti = FakeTaskInstance()
    op = AnonymityCheckOperator(task_id="check", spec=write_spec(tmp_path), source=str(path), report_path=str(report_path))
    with pytest.raises(AirflowFailException, match="cannot run: .*unknown quasi-identifier column"):
        op.execute(make_context(ti))
    written = json.loads(report_path.read_text())
    assert written["passed"] is False and "zip" in written["error"]
    assert ti.pushed["anonymity_report"] == written


# -- AnonymiseOperator ------------------------------------------------------------------------------------------------

# Ages 21..29 (two 5-year bands, two people per (band, sex)) and one 85-year-old man; "record" is an identifier.
PEOPLE = outlier_table()
PEOPLE.insert(0, "record", [f"r{i}" for i in range(9)])

ANONYMISE_SPEC = """
version: 1
check: people
quasi_identifiers:
  - {{name: age, type: numeric, hierarchy: {{intervals: [5, 10]}}}}
  - {{name: sex, hierarchy: {{file: hierarchies/sex.csv}}}}
sensitive_attributes: [{{name: income, type: categorical}}]
targets: {targets}
suppression: {{max_fraction: 0.12}}
on_failure: {on_failure}
"""


def write_anonymise_spec(tmp_path: Path, targets: str = "{k: 2}", on_failure: str = "fail") -> Path:
    (tmp_path / "hierarchies").mkdir(exist_ok=True)
    (tmp_path / "hierarchies" / "sex.csv").write_text("M;*\nF;*\n")  # relative to the spec's folder
    path = tmp_path / f"people_{on_failure}.yaml"
    path.write_text(ANONYMISE_SPEC.format(targets=targets, on_failure=on_failure))
    return path


@pytest.fixture()
def people_csv(tmp_path: Path) -> Path:
    path = tmp_path / "people.csv"
    PEOPLE.to_csv(path, index=False)
    return path


def expected_release(tmp_path: Path, source: Path, **spec_options) -> pd.DataFrame:
    """What anonymise() releases for the table as the operator reads it, index dropped (the files hold none)."""
    spec = load_anonymity_spec(write_anonymise_spec(tmp_path, **spec_options))
    return anonymise(pd.read_csv(source), spec).table.reset_index(drop=True)


def test_anonymise_publishes_csv_and_report(tmp_path, people_csv):
    asset = Asset("people_anonymised")
    output, report_path = tmp_path / "out" / "people.csv", tmp_path / "out" / "people.json"
    ti = FakeTaskInstance()
    op = AnonymiseOperator(
        task_id="anonymise", spec=write_anonymise_spec(tmp_path), source=str(people_csv), output_path=str(output),
        report_path=str(report_path), columns=["age", "sex", "income"], outlets=[asset],
    )
    context = make_context(ti)
    report = op.execute(context)
    assert report["passed"] is True
    # By hand: 5-year bands with sex kept, the 85-year-old suppressed (1 row allowed: floor(0.12 * 9)).
    assert report["anonymisation"]["node"] == {"age": 1, "sex": 0}
    assert report["suppression"]["suppressed_rows"] == 1
    published = pd.read_csv(output, dtype=str)
    assert list(published.columns) == ["age", "sex", "income"]  # the identifier is not published
    assert list(published["age"]) == ["[20, 25)"] * 4 + ["[25, 30)"] * 4
    assert list(published["sex"]) == list(PEOPLE["sex"][:8])
    assert list(published["income"]) == list(PEOPLE["income"][:8])
    assert json.loads(report_path.read_text()) == report
    assert context["outlet_events"][asset].extra == report
    assert ti.pushed == {}
    assert output.read_bytes().count(b"\n") == 9  # header and 8 rows, "\n" line ends


def test_anonymise_parquet_round_trips(tmp_path, people_csv):
    output = tmp_path / "people.parquet"
    op = AnonymiseOperator(
        task_id="anonymise", spec=write_anonymise_spec(tmp_path), source=str(people_csv), output_path=f"file://{output}"
    )
    op.execute(make_context())
    published = pd.read_parquet(output)
    pd.testing.assert_frame_equal(published, expected_release(tmp_path, people_csv))
    assert published["record"].tolist() == [f"r{i}" for i in range(8)]  # undeclared columns pass unchanged


def test_explicit_output_format_overrides_the_suffix(tmp_path, people_csv):
    output = tmp_path / "people.dat"
    op = AnonymiseOperator(
        task_id="anonymise", spec=write_anonymise_spec(tmp_path), source=str(people_csv), output_path=str(output),
        output_format="parquet",
    )
    op.execute(make_context())
    pd.testing.assert_frame_equal(pd.read_parquet(output), expected_release(tmp_path, people_csv))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"output_path": "out/people.txt"}, "cannot tell the format of output_path", id="unknown suffix"),
        pytest.param({"output_path": "out/people"}, "cannot tell the format of output_path", id="no suffix"),
        pytest.param({"output_path": "out/people.csv", "output_format": "xlsx"}, "output_format", id="unknown format"),
        pytest.param({"output_path": "out/people.csv", "columns": ["age", "income"]}, r"add \['sex'\]",
                     id="QI left out"),
        pytest.param({"output_path": "out/people.csv", "columns": "age"}, "not a string", id="columns as a string"),
        pytest.param({"output_path": "out/people.csv", "sql": "SELECT 1"}, "exactly one of source", id="two sources"),
    ],
)
def test_anonymise_arguments_are_checked_at_construction(tmp_path, kwargs, match):
    arguments = {"source": "people.csv"} | kwargs
    if "sql" in kwargs:
        arguments["conn_id"] = "db"
    with pytest.raises(ValueError, match=match):
        AnonymiseOperator(task_id="anonymise", spec=write_anonymise_spec(tmp_path), **arguments)


def test_anonymise_failure_publishes_only_the_report(tmp_path, people_csv):
    """Income has two values: no class can be 3-diverse, even the whole table."""
    output, report_path = tmp_path / "released.csv", tmp_path / "released.json"
    ti = FakeTaskInstance()
    op = AnonymiseOperator(
        task_id="anonymise", spec=write_anonymise_spec(tmp_path, "{k: 2, l: {kind: distinct, l: 3}}"),
        source=str(people_csv), output_path=str(output), report_path=str(report_path),
    )
    with pytest.raises(AirflowFailException, match=r"l_distinct on income: 2 vs target 3 \(1 failing class\)") as raised:
        op.execute(make_context(ti))
    assert not output.exists()
    written = json.loads(report_path.read_text())
    assert ti.pushed == {"anonymity_report": written}
    assert written["passed"] is False
    assert written["anonymisation"]["node"] is None
    # the message ends with the search's reason (the anonymiser's anonymisation.reason), which says what to change
    reason = written["anonymisation"]["reason"]
    assert reason.startswith("no node of the 8-node generalisation lattice meets the targets")
    assert str(raised.value).endswith(f"({reason})")
    assert written["anonymisation"]["evaluated_node"] == {"age": 3, "sex": 1}
    assert written["failed_targets"] == ["l_distinct on income: 2 vs target 3 (1 failing class)"]
    text = report_path.read_text()
    assert not any(value in text for value in ('"low"', '"high"', '"M"', '"F"', "[20, 25)", "r0"))


def test_anonymise_warn_publishes_nothing_and_succeeds(tmp_path, people_csv):
    asset = Asset("people_anonymised")
    output = tmp_path / "released.csv"
    ti = FakeTaskInstance()
    op = AnonymiseOperator(
        task_id="anonymise", spec=write_anonymise_spec(tmp_path, "{k: 2, l: {kind: distinct, l: 3}}", "warn"),
        source=str(people_csv), output_path=str(output), outlets=[asset],
    )
    context = make_context(ti)
    report = op.execute(context)
    assert report["passed"] is False
    assert not output.exists()
    assert ti.pushed == {"anonymity_report": report}
    assert context["outlet_events"][asset].extra["passed"] is False


def test_anonymise_input_error_fails_without_writing_the_table(tmp_path):
    source = tmp_path / "people.csv"
    PEOPLE.assign(sex=["M", "F", "X", "M", "F", "M", "F", "M", "F"]).to_csv(source, index=False)
    output, report_path = tmp_path / "out.csv", tmp_path / "out.json"
    ti = FakeTaskInstance()
    op = AnonymiseOperator(
        task_id="anonymise", spec=write_anonymise_spec(tmp_path), source=str(source), output_path=str(output),
        report_path=str(report_path),
    )
    with pytest.raises(AirflowFailException, match="anonymisation 'people' cannot run: .*sex"):
        op.execute(make_context(ti))
    assert not output.exists()
    written = json.loads(report_path.read_text())
    assert written["passed"] is False and "sex" in written["error"]
    assert ti.pushed["anonymity_report"] == written


def test_anonymise_refuses_a_source_without_the_named_columns(tmp_path, people_csv):
    report_path = tmp_path / "out.json"
    ti = FakeTaskInstance()
    op = AnonymiseOperator(
        task_id="anonymise", spec=write_anonymise_spec(tmp_path), source=str(people_csv),
        output_path=str(tmp_path / "out.csv"), columns=["age", "sex", "income", "zip"], report_path=str(report_path),
    )
    with pytest.raises(AirflowFailException, match=r"cannot run: the source has no column\(s\) \['zip'\]"):
        op.execute(make_context(ti))
    assert not (tmp_path / "out.csv").exists()
    assert ti.pushed["anonymity_report"] == json.loads(report_path.read_text())


def test_anonymise_reads_sql_through_the_connection_hook(tmp_path, monkeypatch):
    class FrameHook:
        def get_df(self, sql, df_type="pandas"):
            assert sql == "SELECT * FROM people"
            return PEOPLE.copy()

    monkeypatch.setattr(
        "dp_operators.operators.microdata_files.BaseHook",
        SimpleNamespace(get_connection=lambda conn_id: SimpleNamespace(get_hook=FrameHook)),
    )
    output = tmp_path / "people.parquet"
    op = AnonymiseOperator(
        task_id="anonymise", spec=write_anonymise_spec(tmp_path), sql="SELECT * FROM people", conn_id="db",
        output_path=str(output),
    )
    assert op.execute(make_context())["released"]["rows"] == 8
    assert len(pd.read_parquet(output)) == 8


# -- publishing: the report before the table, never over the source ----------------------------------------------


def anonymise_operator(tmp_path: Path, source: Path, **kwargs) -> AnonymiseOperator:
    arguments = {"output_path": str(tmp_path / "out" / "people.csv"), "report_path": str(tmp_path / "out" / "r.json")}
    return AnonymiseOperator(task_id="anonymise", spec=write_anonymise_spec(tmp_path), source=str(source),
                             **(arguments | kwargs))


def test_a_report_path_that_is_a_folder_fails_before_anything_is_published(tmp_path, people_csv):
    folder = tmp_path / "out" / "report.json"
    folder.mkdir(parents=True)
    op = anonymise_operator(tmp_path, people_csv, report_path=str(folder))
    ti = FakeTaskInstance()
    with pytest.raises(AirflowFailException, match=rf"report_path {folder} is a folder: make report_path= name a fil"):
        op.execute(make_context(ti))
    assert not (tmp_path / "out" / "people.csv").exists()
    assert list(folder.iterdir()) == [] and ti.pushed == {}


@pytest.mark.parametrize(
    ("fault", "match"),
    [
        pytest.param(PermissionError(13, "Permission denied"), "write access", id="no permission"),
        pytest.param(FileNotFoundError(2, "NoSuchBucket"), "its folder or bucket does not exist", id="no bucket"),
        pytest.param(NotADirectoryError(20, "Not a directory"), "a part of its path is a file", id="through a file"),
    ],
)
def test_a_report_that_cannot_be_written_fails_without_retry_and_publishes_no_table(
    tmp_path, people_csv, monkeypatch, fault, match
):
    def refuse(path, report):
        raise fault

    monkeypatch.setattr("dp_operators.operators.microdata_files.write_report", refuse)
    report_path = tmp_path / "out" / "r.json"
    with pytest.raises(AirflowFailException, match=rf"cannot write its report to {report_path} .*{match}"):
        anonymise_operator(tmp_path, people_csv).execute(make_context())
    assert not (tmp_path / "out" / "people.csv").exists()


def test_a_storage_fault_on_the_report_is_retried_before_the_table_is_written(tmp_path, people_csv, monkeypatch):
    def flaky(path, report):
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr("dp_operators.operators.microdata_files.write_report", flaky)
    with pytest.raises(ConnectionResetError):  # not AirflowFailException: Airflow retries it
        anonymise_operator(tmp_path, people_csv).execute(make_context())
    assert not (tmp_path / "out" / "people.csv").exists()


def test_a_retry_after_a_storage_fault_on_the_table_converges(tmp_path, people_csv, monkeypatch):
    """First try: report written, then the table's upload fails (a transient fault, left to Airflow's retry). The
    retry rewrites the report and publishes the table: the pair on disk is the retry's, consistent."""
    from dp_operators.operators import microdata_files as module

    real_write_table, calls = module.write_table, []

    def flaky(path, table, file_format):
        calls.append(str(path))
        if len(calls) == 1:
            raise ConnectionResetError("connection reset by peer")
        return real_write_table(path, table, file_format)

    monkeypatch.setattr(module, "write_table", flaky)
    op = anonymise_operator(tmp_path, people_csv)
    output, report_path = tmp_path / "out" / "people.csv", tmp_path / "out" / "r.json"
    with pytest.raises(ConnectionResetError):
        op.execute(make_context())
    assert not output.exists() and json.loads(report_path.read_text())["passed"] is True
    report = op.execute(make_context())  # the retry
    assert len(calls) == 2
    assert json.loads(report_path.read_text()) == report
    pd.testing.assert_frame_equal(pd.read_csv(output), expected_release(tmp_path, people_csv))
    assert report["released"]["rows"] == len(pd.read_csv(output)) == 8


def test_a_table_that_cannot_be_written_replaces_the_passed_report(tmp_path, people_csv, monkeypatch):
    """The report went out first; the table then fails for good: the report on disk must not claim a release."""

    def refuse(path, table, file_format):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("dp_operators.operators.microdata_files.write_table", refuse)
    ti = FakeTaskInstance()
    output, report_path = tmp_path / "out" / "people.csv", tmp_path / "out" / "r.json"
    with pytest.raises(AirflowFailException, match=rf"cannot write the table to {output} \(PermissionError\)"):
        anonymise_operator(tmp_path, people_csv).execute(make_context(ti))
    written = json.loads(report_path.read_text())
    assert written["passed"] is False and "nothing was published" in written["error"]
    assert ti.pushed == {"anonymity_report": written}
    assert not output.exists()


def test_an_output_path_that_is_a_folder_fails_before_the_report_is_written(tmp_path, people_csv):
    output = tmp_path / "out" / "people.csv"
    output.mkdir(parents=True)
    with pytest.raises(AirflowFailException, match=rf"output_path {output} is a folder"):
        anonymise_operator(tmp_path, people_csv).execute(make_context())
    assert not (tmp_path / "out" / "r.json").exists()


@pytest.mark.parametrize("argument", ["output_path", "report_path"])
def test_a_url_naming_no_known_storage_fails_without_retry(tmp_path, people_csv, argument):
    op = anonymise_operator(tmp_path, people_csv, **{argument: "bogus://bucket/people.csv"})
    with pytest.raises(AirflowFailException, match=rf"{argument} bogus://bucket/people.csv is not a path or URL"):
        op.execute(make_context())
    assert not (tmp_path / "out").exists()


def _same_place_cases(tmp_path: Path, source: Path) -> dict[str, dict]:
    (tmp_path / "link.csv").symlink_to(source)
    return {
        "output is the source": {"output_path": str(source)},
        "output as a Path": {"output_path": source},
        "output as a file:// URL": {"output_path": f"file://{source}"},
        "output through ..": {"output_path": str(tmp_path / "out" / ".." / source.name)},
        "output through a symbolic link": {"output_path": str(tmp_path / "link.csv")},
        "report is the source": {"report_path": str(source)},
        "report is the output": {"report_path": str(tmp_path / "out" / "people.csv")},
    }


SAME_PLACE_IDS = ["output is the source", "output as a Path", "output as a file:// URL", "output through ..",
                  "output through a symbolic link", "report is the source", "report is the output"]


@pytest.mark.parametrize("case", SAME_PLACE_IDS)
def test_a_destination_equal_to_the_source_or_the_other_is_refused_at_construction(tmp_path, people_csv, case):
    kwargs = _same_place_cases(tmp_path, people_csv)[case]
    with pytest.raises(ValueError, match=r"are the same location .*give (output|report)_path= a location of its own"):
        anonymise_operator(tmp_path, people_csv, **kwargs)


@pytest.mark.parametrize("case", SAME_PLACE_IDS)
def test_a_rendered_destination_equal_to_the_source_fails_without_touching_it(tmp_path, people_csv, case):
    """As built from templates (not comparable when the DAG is parsed), then rendered to the same place."""
    before = people_csv.read_bytes()
    (name, value), = _same_place_cases(tmp_path, people_csv)[case].items()
    op = anonymise_operator(tmp_path, people_csv, **{name: "{{ params.where }}.csv"})
    setattr(op, name, value)  # what rendering the template gives
    ti = FakeTaskInstance()
    with pytest.raises(AirflowFailException, match="are the same location .*would overwrite"):
        op.execute(make_context(ti))
    assert people_csv.read_bytes() == before
    assert not (tmp_path / "out").exists() and ti.pushed == {}


def test_a_hard_link_to_the_source_is_refused_at_run_time(tmp_path, people_csv):
    before = people_csv.read_bytes()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "people.csv").hardlink_to(people_csv)  # another name of the same file
    with pytest.raises(AirflowFailException, match="output_path and source are the same location"):
        anonymise_operator(tmp_path, people_csv).execute(make_context())
    assert people_csv.read_bytes() == before


@pytest.mark.parametrize(
    ("source", "output"),
    [
        pytest.param("s3://bucket/raw/people.csv", "s3://aws_default@bucket/raw/people.csv", id="connection id"),
        pytest.param("s3://bucket/raw/people.csv", "s3://bucket//raw/./people.csv", id="redundant separators"),
        pytest.param("people.csv", "./people.csv", id="relative paths"),
    ],
)
def test_spellings_of_one_location_are_refused_at_construction(tmp_path, source, output):
    with pytest.raises(ValueError, match="output_path and source are the same location"):
        AnonymiseOperator(task_id="a", spec=write_anonymise_spec(tmp_path), source=source, output_path=output)


def test_different_locations_are_accepted(tmp_path):
    spec = write_anonymise_spec(tmp_path)
    AnonymiseOperator(task_id="a", spec=spec, source="s3://bucket/raw/people.csv",
                      output_path="s3://bucket/public/people.csv", report_path="s3://other/raw/people.csv")
    AnonymiseOperator(task_id="b", spec=spec, sql="SELECT 1", conn_id="db", output_path="people.csv")


def test_the_check_refuses_a_report_path_equal_to_its_source(tmp_path, patients_csv):
    with pytest.raises(ValueError, match="report_path and source are the same location"):
        AnonymityCheckOperator(task_id="t", spec=write_spec(tmp_path), source=str(patients_csv),
                               report_path=str(patients_csv))
    before = patients_csv.read_bytes()
    op = AnonymityCheckOperator(task_id="t", spec=write_spec(tmp_path), source=str(patients_csv),
                                report_path="{{ params.report }}")
    op.report_path = f"file://{patients_csv}"
    with pytest.raises(AirflowFailException, match="report_path and source are the same location"):
        op.execute(make_context())
    assert patients_csv.read_bytes() == before


def test_the_check_fails_without_retry_when_its_report_path_is_a_folder(tmp_path, patients_csv):
    folder = tmp_path / "report.json"
    folder.mkdir()
    op = AnonymityCheckOperator(task_id="t", spec=write_spec(tmp_path), source=str(patients_csv),
                                report_path=str(folder))
    with pytest.raises(AirflowFailException, match=rf"cannot write its report to {folder} \(IsADirectoryError\): it "
                                                   "is a folder"):
        op.execute(make_context())


# -- reading the source ----------------------------------------------------------------------------------------------


def _raises_with_report(op, match: str) -> dict:
    """Run ``op``, expect a no-retry failure matching ``match``; return the report it wrote and pushed."""
    ti = FakeTaskInstance()
    with pytest.raises(AirflowFailException, match=match):
        op.execute(make_context(ti))
    written = json.loads(Path(op.report_path).read_text())
    assert ti.pushed == {"anonymity_report": written}
    assert set(written) == {"check", "passed", "on_failure", "error"} and written["passed"] is False
    return written


@pytest.mark.parametrize("operator", ["check", "anonymise"])
def test_a_missing_source_fails_without_retry_and_reports_why(tmp_path, operator):
    absent = tmp_path / "absent" / "people.csv"
    report_path, output = tmp_path / "report.json", tmp_path / "out.csv"
    if operator == "check":
        op = AnonymityCheckOperator(task_id="t", spec=write_spec(tmp_path), source=str(absent),
                                    report_path=str(report_path))
    else:
        op = AnonymiseOperator(task_id="t", spec=write_anonymise_spec(tmp_path), source=f"file://{absent}",
                               output_path=str(output), report_path=str(report_path))
    written = _raises_with_report(op, rf"cannot run: the source .*{absent.name} does not exist: check source=")
    assert str(absent) in written["error"]
    assert not output.exists()


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(lambda d: (d / "folder.csv").mkdir() or d / "folder.csv", r"cannot be read \(IsADirectoryError\)",
                     id="a folder"),
        pytest.param(lambda d: _write_bytes(d / "latin1.csv", "zip,age\n4767\xe9,29\n".encode("latin-1")),
                     r"not UTF-8 text: re-encode it", id="not UTF-8"),
        pytest.param(lambda d: _write_bytes(d / "empty.csv", b""), "is empty", id="empty file"),
        pytest.param(lambda d: _write_bytes(d / "ragged.csv", b"zip,age\n1,2\n1,2,3,4\n"),
                     r"not valid CSV with separator ',' \(line 3\)", id="ragged CSV"),
        pytest.param(lambda d: _write_bytes(d / "fake.parquet", b"zip,age\n1,2\n"), "not a readable Parquet file",
                     id="CSV named parquet"),
        pytest.param(lambda d: _write_bytes(d / "people.txt", b"zip,age\n1,2\n"), "cannot tell the format",
                     id="unknown suffix"),
    ],
)
def test_an_unreadable_source_fails_without_retry_and_reports_why(tmp_path, make, match):
    source, report_path = make(tmp_path), tmp_path / "report.json"
    op = AnonymityCheckOperator(task_id="t", spec=write_spec(tmp_path), source=str(source),
                                report_path=str(report_path))
    written = _raises_with_report(op, "cannot run: .*" + match)
    assert source.name in written["error"]
    assert "4767" not in written["error"]  # no cell of the file


def test_a_storage_fault_is_left_to_retry(tmp_path, monkeypatch):
    """An OSError other than missing / unreadable (a network fault) is not turned into a no-retry failure."""

    class FlakyPath:
        suffix = ".csv"

        def open(self, mode):
            raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr("dp_operators.operators.microdata_files._storage_path", lambda location: FlakyPath())
    op = AnonymityCheckOperator(task_id="t", spec=write_spec(tmp_path), source="s3://bucket/people.csv")
    with pytest.raises(ConnectionResetError):
        op.execute(make_context())


def test_csv_separator_reads_a_semicolon_file(tmp_path):
    source = tmp_path / "patients.csv"
    PATIENTS.to_csv(source, index=False, sep=";")
    spec = write_spec(tmp_path)
    with pytest.raises(AirflowFailException, match="unknown quasi-identifier column"):  # one column "zip;age;..."
        AnonymityCheckOperator(task_id="t", spec=spec, source=str(source)).execute(make_context())
    report = AnonymityCheckOperator(task_id="t", spec=spec, source=str(source), csv_separator=";").execute(
        make_context())
    assert report["passed"] is True and report["rows"] == len(PATIENTS) and report["k"] == 3


@pytest.mark.parametrize("separator", ["", ";;", '"', "\n", 59, None])
def test_csv_separator_is_checked_at_construction(tmp_path, separator):
    with pytest.raises(ValueError, match="csv_separator must be one character"):
        AnonymityCheckOperator(task_id="t", spec=write_spec(tmp_path), source="x.csv", csv_separator=separator)
    with pytest.raises(ValueError, match="csv_separator must be one character"):
        AnonymiseOperator(task_id="t", spec=write_anonymise_spec(tmp_path), source="x.csv", output_path="o.csv",
                          csv_separator=separator)


def test_anonymise_reads_arx_adult_with_its_own_hierarchies(tmp_path):
    """ARX's adult example as ARX ships it (``;``-separated, 30,162 rows) through the operator, with ARX's hierarchy
    files: the published table is what ``anonymise()`` releases for the same rows, and each cell is its value's label
    at the chosen level of ARX's hierarchy."""
    import os

    source = ARX_DIR / "adult.csv"
    if not source.exists():
        pytest.skip(f"{source} is missing: the shared test data must sit beside the project")
    lines = ["version: 1", "check: arx_adult", "quasi_identifiers:"]
    for qi in ARX_QIS:
        relative = os.path.relpath(ARX_DIR / f"adult_hierarchy_{qi}.csv", tmp_path)
        lines.append(f"  - {{name: {qi}, hierarchy: {{file: {json.dumps(relative)}}}}}")
    lines += ["sensitive_attributes: [{name: salary-class, type: categorical}]", "targets: {k: 5}",
              "suppression: {max_fraction: 0.01}"]
    spec_path = tmp_path / "arx_adult.yaml"
    spec_path.write_text("\n".join(lines) + "\n")
    output, report_path = tmp_path / "arx_adult_anonymised.csv", tmp_path / "arx_adult_report.json"
    op = AnonymiseOperator(task_id="anonymise", spec=str(spec_path), source=str(source), csv_separator=";",
                           output_path=str(output), report_path=str(report_path))
    report = op.execute(make_context())
    assert report["passed"] is True and report["rows"] == 30162

    original = pd.read_csv(source, sep=";")
    expected = anonymise(original, load_anonymity_spec(spec_path))
    published = pd.read_csv(output, dtype=str)
    pd.testing.assert_frame_equal(published, expected.table.reset_index(drop=True).astype(str))
    assert report == expected.report | {"anonymisation": report["anonymisation"]}  # timing aside
    node = report["anonymisation"]["node"]
    kept = original.loc[expected.table.index]
    for qi in ARX_QIS:  # each cell is the original value's label at the chosen level of ARX's file
        rows = [line.split(";") for line in (ARX_DIR / f"adult_hierarchy_{qi}.csv").read_text().splitlines() if line]
        label = {row[0]: row[node[qi]] for row in rows}
        assert list(published[qi]) == [label[str(v)] for v in kept[qi]], qi
    sizes = published.groupby(ARX_QIS).size()
    assert sizes.min() >= 5 and len(published) + report["suppression"]["suppressed_rows"] == 30162


def test_report_file_sorts_numeric_keys_as_numbers(tmp_path):
    from dp_operators.operators.anonymity import write_report

    report = {"b": {"10": 1, "2": 3, "100": 1}, "a": [{"z": 1, "y": {"3": 0, "21": 1}}], "c": {"x1": 0, "10": 1}}
    path = write_report(str(tmp_path / "r.json"), report)
    pairs = json.loads(Path(path.path).read_text(), object_pairs_hook=lambda p: p)
    assert [k for k, _ in pairs] == ["a", "b", "c"]
    assert [k for k, _ in dict(pairs)["b"]] == ["2", "10", "100"]  # a histogram: ascending sizes
    assert [k for k, _ in dict(dict(pairs)["a"][0][0:2])["y"]] == ["3", "21"]
    assert [k for k, _ in dict(pairs)["c"]] == ["10", "x1"]  # mixed keys: as text
    assert json.loads(Path(path.path).read_text()) == report


def test_templated_fields():
    assert set(AnonymiseOperator.template_fields) == {"source", "sql", "conn_id", "output_path", "report_path"}
    assert "report_path" in AnonymityCheckOperator.template_fields


# -- the example DAG ------------------------------------------------------------------------------------------------


def read_hierarchy_labels(path: Path) -> list[set[str]]:
    """The labels of each level of an ARX-format hierarchy file."""
    rows = [line.split(";") for line in path.read_text().splitlines() if line]
    return [{row[level] for row in rows} for level in range(len(rows[0]))]


def test_example_dag_anonymises_gates_and_publishes_adult(tmp_path, monkeypatch):
    """Runs the example DAG's two tasks in order, by hand (no scheduler): the anonymiser, then the check of the
    published file."""
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
    assert set(dag.task_dict) == {"anonymise_adult", "check_published_adult"}
    ti = FakeTaskInstance()
    context = make_context(ti)
    report = dag.task_dict["anonymise_adult"].execute(context)
    assert report["passed"] is True and ti.pushed == {}
    assert context["outlet_events"][module.adult_anonymised].extra == report
    assert json.loads((tmp_path / "adult_anonymised_report.json").read_text()) == report

    published = pd.read_csv(tmp_path / "adult_anonymised.csv", dtype=str)
    qis = ["age", "sex", "race", "marital_status", "education", "native_country", "workclass", "occupation"]
    assert list(published.columns) == [*qis, "income"]
    suppressed = report["suppression"]["suppressed_rows"]
    assert len(published) + suppressed == 48842 and suppressed <= 488  # 1 % of 48,842
    sizes = published.groupby(qis).size()
    assert sizes.min() >= 5
    assert published.groupby(qis)["income"].nunique().min() == 2
    node = report["anonymisation"]["node"]
    hierarchies = repo_root / "config" / "anonymity" / "hierarchies"
    for qi in qis[1:]:  # each column holds labels of the chosen level of our hierarchy file
        assert set(published[qi]) <= read_hierarchy_labels(hierarchies / f"{qi}.csv")[node[qi]], qi
    if node["age"] == 4:
        assert set(published["age"]) == {"*"}
    assert report["released"] == {"rows": len(published), "equivalence_classes": len(sizes), "k": int(sizes.min())}

    check = dag.task_dict["check_published_adult"].execute(context)
    assert check["passed"] is True and check["rows"] == len(published)
    assert json.loads((tmp_path / "adult_anonymised_check.json").read_text()) == check


def test_a_source_url_naming_no_known_storage_fails_without_retry_and_reports_why(tmp_path):
    op = AnonymiseOperator(task_id="t", spec=write_anonymise_spec(tmp_path), source="bogus://bucket/people.csv",
                           output_path=str(tmp_path / "out.csv"), report_path=str(tmp_path / "report.json"))
    written = _raises_with_report(op, r"cannot run: the source bogus://bucket/people.csv is not a path or URL")
    assert "fix source=" in written["error"]
    assert not (tmp_path / "out.csv").exists()


def test_the_check_report_file_lists_class_sizes_in_ascending_order(tmp_path):
    """Through the check operator, the report file's ``class_size_histogram`` lists sizes as numbers ascending
    (classes of 2 and 10 rows: 2 first, although "10" sorts first as text)."""
    source = tmp_path / "table.csv"
    pd.DataFrame({"zone": ["n"] * 2 + ["s"] * 10, "outcome": ["a", "b"] * 6}).to_csv(source, index=False)
    spec = tmp_path / "zones.yaml"
    spec.write_text("version: 1\ncheck: zones\nquasi_identifiers: [zone]\n"
                    "sensitive_attributes: [{name: outcome, type: categorical}]\ntargets: {k: 2}\n")
    report_path = tmp_path / "report.json"
    AnonymityCheckOperator(task_id="check", spec=str(spec), source=str(source),
                           report_path=str(report_path)).execute(make_context(FakeTaskInstance()))
    report = json.loads(report_path.read_text(encoding="utf-8"), object_pairs_hook=lambda pairs: pairs)
    sizes = [size for size, _ in dict(dict(report)["class_size_histogram"])["released"]]
    assert sizes == sorted(sizes, key=int), f"sizes in the file in this order: {sizes}"


def test_the_demo_environment_lets_the_example_dag_find_adult_on_a_clean_clone(tmp_path):
    """After ``source scripts/demo_env.sh`` on a clean clone (no ``.data/adult.csv``), the example DAG
    ``adult_anonymity_check`` reads an Adult file that exists (``../shared/data/adult.csv``)."""
    import os
    import subprocess
    import sys

    from anonymity.anonymity_tables import REPO_ROOT, SHARED_DATA

    if not (SHARED_DATA / "adult.csv").exists():
        pytest.skip(f"{SHARED_DATA / 'adult.csv'} is missing: the shared test data must sit beside the project")
    if (REPO_ROOT / ".data" / "adult.csv").exists():
        pytest.skip(".data/adult.csv exists here (make demo ran): not a clean clone")
    probe = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('dag_probe', {str(REPO_ROOT / 'dags' / 'adult_anonymity_check.py')!r}); "
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
        "print(module.ADULT_CSV.exists())"
    )
    command = (
        f"source scripts/demo_env.sh && export AIRFLOW_HOME={tmp_path / 'airflow'} && "
        f"{sys.executable} -c \"{probe}\""
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DP_OPERATORS_", "AIRFLOW"))}
    done = subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True", "the example DAG's ADULT_CSV does not exist"
