"""A bad release spec is a DAG import error naming file, field and reason (the example DAGs: test_dag_integrity)."""

from __future__ import annotations

from pathlib import Path

from airflow.dag_processing.dagbag import DagBag

from support import EXAMPLE_SPEC


def import_error_of_a_dag_with(spec_text: str, folder: Path) -> tuple[Path, str]:
    """Write ``spec_text`` and a DAG releasing it into ``folder``; return the spec's path and the DagBag's one import
    error."""
    spec = folder / "spec.yaml"
    spec.write_text(spec_text)
    (folder / "one_dag.py").write_text(
        "from airflow.sdk import dag\n"
        "from dp_operators.operators.release import DPReleaseOperator\n"
        "@dag(schedule=None)\n"
        "def one():\n"
        f"    DPReleaseOperator(task_id='release', spec_path={str(spec)!r}, aggregates_task_id='x',\n"
        "                      output_uri='file:///tmp/out')\n"
        "one()\n"
    )
    (error,) = DagBag(dag_folder=str(folder)).import_errors.values()
    return spec, error


def test_bad_spec_is_an_import_error_with_file_field_and_reason(tmp_path: Path):
    spec, error = import_error_of_a_dag_with(
        EXAMPLE_SPEC.read_text().replace("bounds: [1, 99]", "bounds: [99, 1]"), tmp_path
    )
    assert f"{spec}: invalid release spec" in error
    assert "aggregates[2](mean_hours_per_week): bounds must have lower < upper, got [99, 1]" in error


def test_a_spec_that_cannot_be_planned_is_an_import_error(tmp_path: Path):
    """Float sums of up to 10^15 values of [0, 1] cannot carry grid 0.001 (doubles near 10^15 are 0.125 apart): a
    public fact of the spec, so the DAG import fails, not the release at run time."""
    spec, error = import_error_of_a_dag_with(EXAMPLE_SPEC.read_text().replace(
        "    bounds: [1, 99]",
        "    bounds: [0, 1]\n    grid: 0.001\n    upstream: {arithmetic: binary64, max_rows: 1000000000000000}",
    ), tmp_path)
    assert f"{spec}: the spec cannot be planned:" in error
    assert "mean_hours_per_week" in error
