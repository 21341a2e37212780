"""DAG integrity: every file in ``dags/`` parses with Airflow's DagBag, with every deprecation warning (Python's and
Airflow's own) an error, defines a DAG with tags and a doc_md, and every spec file its tasks name exists and (for a
release) is a valid release spec. Whatever files are in ``dags/`` are covered: one case per file.

The DAGs are parsed in a fresh interpreter (dag_integrity_probe.py), so that a deprecated import in dp_operators or a
provider counts too (in this session those modules were imported before any filter was set).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import EXAMPLE_SPEC, REPO

DAGS = REPO / "dags"
PROBE = Path(__file__).with_name("dag_integrity_probe.py")
DAG_FILES = sorted(path.relative_to(DAGS).as_posix() for path in DAGS.rglob("*.py") if "__pycache__" not in path.parts)


def parse_folder(folder: Path, out: Path) -> dict:
    """What dag_integrity_probe.py found in ``folder`` (see its docstring for the shape)."""
    done = subprocess.run([sys.executable, str(PROBE), str(folder), str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    return parse_folder(DAGS, tmp_path_factory.mktemp("dag-integrity") / "dags.json")


def dags_of(parsed: dict, file: str) -> list[dict]:
    return [parsed["dags"][dag_id] for dag_id in parsed["files"].get(file, [])]


def test_the_dags_folder_holds_the_example_dags():
    assert "adult_census_release.py" in DAG_FILES


@pytest.mark.parametrize("file", DAG_FILES)
def test_the_dag_file_imports_without_errors_or_deprecation_warnings(parsed, file):
    assert parsed["import_errors"].get(file) is None, parsed["import_errors"][file]
    assert dags_of(parsed, file), f"dags/{file} defines no DAG (or Airflow's safe mode skipped it)"


@pytest.mark.parametrize("file", DAG_FILES)
def test_every_dag_has_tags_and_a_doc_md(parsed, file):
    for dag in dags_of(parsed, file):
        assert dag["tags"], f"dags/{file}: give the DAG tags=[...]"
        assert (dag["doc_md"] or "").strip(), f"dags/{file}: give the DAG doc_md=__doc__ (or a docstring)"


@pytest.mark.parametrize("file", DAG_FILES)
def test_every_spec_file_a_task_names_exists_and_is_valid(parsed, file):
    for dag in dags_of(parsed, file):
        problems = {f"{spec['task_id']} ({spec['spec_path']})": spec["problem"] for spec in dag["spec_files"]}
        assert not any(problems.values()), problems


BAD_DAGS = {
    "moved_airflow_import.py": """
        from airflow.decorators import dag   # Airflow 3 moved it to airflow.sdk: a DeprecatedImportWarning
        @dag(schedule=None, tags=["t"], doc_md="d")
        def moved_airflow_import():
            pass
        moved_airflow_import()
    """,
    "python_deprecation.py": """
        import warnings
        from airflow.sdk import dag
        warnings.warn("this helper is deprecated", DeprecationWarning)
        @dag(schedule=None, tags=["t"], doc_md="d")
        def python_deprecation():
            pass
        python_deprecation()
    """,
    "undocumented.py": """
        from airflow.sdk import dag
        @dag(schedule=None)
        def undocumented():
            pass
        undocumented()
    """,
    "mapped_release_of_a_missing_spec.py": """
        from airflow.sdk import dag
        from dp_operators.operators.release import DPReleaseOperator
        @dag(schedule=None, tags=["t"], doc_md="d")
        def mapped_release_of_a_missing_spec():
            DPReleaseOperator.partial(task_id="release", aggregates_task_id="x").expand(
                spec_path=["/nonexistent/spec.yaml"])
        mapped_release_of_a_missing_spec()
    """,
    "good.py": f"""
        from airflow.sdk import dag
        from dp_operators.operators.release import DPReleaseOperator
        @dag(schedule=None, tags=["t"], doc_md="d")
        def good():
            DPReleaseOperator(task_id="release", spec_path={str(EXAMPLE_SPEC)!r}, aggregates_task_id="x")
        good()
    """,
}


def test_the_checks_catch_each_fault(tmp_path):
    """The negative control: a folder of DAG files with one fault each, and one without."""
    folder = tmp_path / "dags"
    folder.mkdir()
    for name, text in BAD_DAGS.items():
        (folder / name).write_text(textwrap.dedent(text))
    found = parse_folder(folder, tmp_path / "found.json")
    errors = found["import_errors"]
    # a missing spec is caught, at import by the operator itself or else by the spec check
    missing_spec = errors.pop("mapped_release_of_a_missing_spec.py", None)
    assert sorted(errors) == ["moved_airflow_import.py", "python_deprecation.py"]
    assert "DeprecatedImportWarning: The `airflow.decorators.dag` attribute is deprecated" in errors[
        "moved_airflow_import.py"]
    assert "DeprecationWarning: this helper is deprecated" in errors["python_deprecation.py"]
    assert found["dags"]["undocumented"]["tags"] == [] and not found["dags"]["undocumented"]["doc_md"]
    if missing_spec is None:
        (missing,) = found["dags"]["mapped_release_of_a_missing_spec"]["spec_files"]
        assert missing["problem"].startswith("no such file: /nonexistent/spec.yaml")
    else:
        assert "/nonexistent/spec.yaml" in missing_spec
    good = found["dags"]["good"]
    assert good["tags"] == ["t"] and good["doc_md"] == "d"
    assert good["spec_files"] == [{"task_id": "release", "spec_path": str(EXAMPLE_SPEC), "problem": None}]
