"""The package's pure folders import no Airflow (DESIGN.md 1): the engine, the ledger and the mechanisms run without a
scheduler, from the CLI and the Python API."""

from __future__ import annotations

import ast

import pytest

from support import REPO

#: The folders of dp_operators that must never import Airflow (README, "Repository layout").
PURE = ("mechanisms", "accounting", "spec", "ledger", "release", "consistency", "anonymity", "continual")


def airflow_imports(source: str) -> list[str]:
    """The modules an Airflow import statement of ``source`` names (``import airflow...``, ``from airflow...``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "airflow"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "airflow":
            found.append(node.module)
    return found


@pytest.mark.parametrize("folder", PURE)
def test_a_pure_folder_imports_no_airflow(folder):
    files = sorted((REPO / "dp_operators" / folder).rglob("*.py"))
    assert files
    offending = {str(path.relative_to(REPO)): airflow_imports(path.read_text()) for path in files}
    assert {path: names for path, names in offending.items() if names} == {}


def test_the_check_finds_an_airflow_import_anywhere_in_a_module():
    """Negative control: an import inside a function counts, as at the top."""
    assert airflow_imports("def f():\n    from airflow.sdk import BaseHook\n") == ["airflow.sdk"]
    assert airflow_imports("import airflow.models as m\nimport numpy\n") == ["airflow.models"]
    assert airflow_imports("from dp_operators import airflowish\n") == []
