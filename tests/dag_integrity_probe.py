"""Parse a DAG folder as Airflow does, with every deprecation warning an error, and write what was found as JSON.

Run in a fresh interpreter (``python dag_integrity_probe.py DAGS_FOLDER OUT.json``) so that every module a DAG
imports (dp_operators, the providers) is imported under the warning filters, not found already imported by the test
session. Used by test_dag_integrity.py.

The JSON: ``{"import_errors": {file: message}, "files": {file: [dag_id, ...]}, "dags": {dag_id: {"file", "tags",
"doc_md", "spec_files": [{"task_id", "spec_path", "problem"}]}}}``, files relative to the folder. ``problem`` is
None when the spec file exists (and, for a release task, is a valid release spec), else what is wrong.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any


def deprecation_categories() -> tuple[type[Warning], ...]:
    """Python's deprecation warnings and Airflow's own (``DeprecatedImportWarning`` is a ``FutureWarning``, so a
    filter on ``DeprecationWarning`` alone would let an import from a moved Airflow module through)."""
    from airflow.exceptions import AirflowProviderDeprecationWarning, RemovedInAirflow4Warning
    from airflow.sdk.exceptions import RemovedInAirflow4Warning as SdkRemovedInAirflow4Warning
    from airflow.utils.deprecation_tools import DeprecatedImportWarning

    return (
        DeprecationWarning,
        PendingDeprecationWarning,
        RemovedInAirflow4Warning,
        SdkRemovedInAirflow4Warning,
        AirflowProviderDeprecationWarning,
        DeprecatedImportWarning,
    )


def spec_paths(task: Any) -> list[Any]:
    """The spec file(s) a task names: its ``spec_path``; for a mapped task, the partial or expanded values."""
    from airflow.sdk.definitions._internal.expandinput import DictOfListsExpandInput, ListOfDictsExpandInput
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    if not isinstance(task, MappedOperator):
        found = getattr(task, "spec_path", None)
        return [] if found is None else [found]
    if "spec_path" in task.partial_kwargs:
        return [task.partial_kwargs["spec_path"]]
    expanded = task.expand_input
    if isinstance(expanded, DictOfListsExpandInput) and "spec_path" in expanded.value:
        value = expanded.value["spec_path"]
        return list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(expanded, ListOfDictsExpandInput):
        if not isinstance(expanded.value, (list, tuple)):
            return [expanded.value]  # kwargs from an XCom: not known until the run
        return [kwargs["spec_path"] for kwargs in expanded.value if "spec_path" in kwargs]
    return []


def spec_problem(path: Any, release: bool) -> str | None:
    """What is wrong with a spec file a task names, or None."""
    if not isinstance(path, (str, Path)):
        return f"the spec path is {type(path).__name__}, known only at run time: give a file path at parse time"
    if not Path(path).is_file():
        return f"no such file: {path} (relative paths are read from the working directory)"
    if release:
        from dp_operators.spec import SpecError, load_spec

        try:
            load_spec(path)
        except SpecError as error:
            return str(error)
    return None


def is_release_task(task: Any) -> bool:
    try:
        from dp_operators.operators.release import DPReleaseOperator
    except ImportError:  # reported as the import error of every DAG file that uses it
        return False
    return issubclass(getattr(task, "operator_class", type(task)), DPReleaseOperator)


def parse(folder: Path) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    with warnings.catch_warnings():
        for category in deprecation_categories():
            warnings.simplefilter("error", category)
        bag = DagBag(dag_folder=str(folder))

    def relative(path: str) -> str:
        return Path(path).resolve().relative_to(folder.resolve()).as_posix() if Path(path).is_absolute() else path

    files: dict[str, list[str]] = {
        path.relative_to(folder).as_posix(): [] for path in sorted(folder.rglob("*.py")) if "__pycache__" not in path.parts
    }
    dags: dict[str, Any] = {}
    for dag_id, dag in sorted(bag.dags.items()):
        file = relative(dag.fileloc)
        files.setdefault(file, []).append(dag_id)
        dags[dag_id] = {
            "file": file,
            "tags": sorted(dag.tags or ()),
            "doc_md": dag.doc_md,
            "spec_files": [
                {"task_id": task.task_id, "spec_path": str(path), "problem": spec_problem(path, is_release_task(task))}
                for task in dag.tasks
                for path in spec_paths(task)
            ],
        }
    return {
        "import_errors": {relative(file): message for file, message in bag.import_errors.items()},
        "files": files,
        "dags": dags,
    }


if __name__ == "__main__":
    dags_folder, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    out.write_text(json.dumps(parse(dags_folder), indent=1, default=str))
