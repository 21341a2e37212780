"""Shared fixtures: real data from ../shared/data, a temporary SQLite ledger, the example spec."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Airflow reads its home at first import: give the test session a throwaway one, never ~/airflow. A pytest-xdist
# worker inherits the controller's environment, so it always takes its own: two workers sharing one home would share
# its SQLite metadata database.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix=f"dp-operators-airflow-{_WORKER}-")
    # a worker starts with COLUMNS=80 and LINES=24 where a single pytest process has neither; the CLI folds its
    # tables at COLUMNS, and its tests set the width they check themselves
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
else:
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="dp-operators-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import pytest  # noqa: E402

from dp_operators.ledger import Ledger
from dp_operators.spec import load_spec

from support import EXAMPLE_SPEC, SHARED_DATA, make_ledger


@pytest.fixture(scope="session")
def adult_csv() -> Path:
    path = SHARED_DATA / "adult.csv"
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} not found: CI must have the team's data folder beside the repository")
        pytest.skip(f"{path} not found: the tests read the team's data folder beside the repository")
    return path


@pytest.fixture(scope="session")
def adult_aggregates(adult_csv: Path) -> dict:
    """True aggregates of UCI Adult, computed by the example DAG's own upstream function."""
    from dags_loader import example_dag_module

    return example_dag_module().compute_adult_aggregates(adult_csv)


@pytest.fixture
def example_spec():
    return load_spec(EXAMPLE_SPEC)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return make_ledger(tmp_path / "ledger.db")


def pytest_collection_modifyitems(config, items):
    """Run the real-Airflow and real-server modules (marked ``integration``) first, in their collected order.

    Each costs one worker minutes inside one module-scoped deployment. Started first, they run while the other
    workers share out the short tests (longest jobs first), and each module stays inside the first worker's
    contiguous share of the queue, so pytest-xdist's work stealing never splits it and sets its deployment up twice.
    """
    items.sort(key=lambda item: item.get_closest_marker("integration") is None)
