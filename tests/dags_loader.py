"""Import the example DAG files as modules (``dags/`` is not a package: Airflow loads it by path)."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

DAGS = Path(__file__).resolve().parent.parent / "dags"


@cache
def dag_file_module(stem: str):
    """``dags/<stem>.py`` as a module named ``<stem>_dag``, imported once per process."""
    spec = importlib.util.spec_from_file_location(f"{stem}_dag", DAGS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example_dag_module():
    return dag_file_module("adult_census_release")
