"""Import the example DAG files as modules (``dags/`` is not a package: Airflow loads it by path)."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

DAGS = Path(__file__).resolve().parent.parent / "dags"


@cache
def example_dag_module():
    spec = importlib.util.spec_from_file_location("adult_census_release_dag", DAGS / "adult_census_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
