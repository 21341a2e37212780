"""``dpctl`` starts light: importing the command line, and running the commands that open no ledger, load neither
SQLAlchemy, Airflow, numpy nor the ledger's database code.

Each case runs in a fresh interpreter (this one already holds everything) and asserts on ``sys.modules``, never on
time; ``benchmarks/startup.py`` measures the time. A control case opens a ledger and must load SQLAlchemy, so the
probe is shown to see an import when there is one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dp_operators.ledger

REPO = Path(__file__).resolve().parent.parent

#: Modules no light command may load: the ledger's database layer, the release engine, Airflow and the numeric stack.
HEAVY = (
    "sqlalchemy",
    "airflow",
    "numpy",
    "pandas",
    "pyarrow",
    "dp_operators.ledger.chain",
    "dp_operators.ledger.config",
    "dp_operators.ledger.govern",
    "dp_operators.ledger.schema",
    "dp_operators.ledger.spend",
    "dp_operators.ledger.store",
    "dp_operators.ledger.verify",
    "dp_operators.hooks",
    "dp_operators.operators",
    "dp_operators.release",
    "dp_operators.spec",
)

#: Runs ``setup`` (stdout and stderr of the command go to stderr), then prints the loaded modules as JSON.
PROBE = """
import contextlib, json, sys
with contextlib.redirect_stdout(sys.stderr):
    {setup}
print(json.dumps(sorted(sys.modules)))
"""

DPCTL = """from dp_operators.cli import app
    try:
        app({args!r}, prog_name="dpctl")
    except SystemExit as done:
        assert done.code in (0, None), done.code"""


def loaded_modules(setup: str) -> set[str]:
    """The modules loaded after running ``setup`` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(name for name in modules if name.split(".")[0] in HEAVY or name.startswith(HEAVY))


@pytest.mark.parametrize(
    "setup",
    [
        pytest.param("import dp_operators.cli", id="import dp_operators.cli"),
        pytest.param("import dp_operators.ledger", id="import dp_operators.ledger"),
        pytest.param(DPCTL.format(args=["--help"]), id="dpctl --help"),
        pytest.param(DPCTL.format(args=["ledger", "--help"]), id="dpctl ledger --help"),
        pytest.param(DPCTL.format(args=["spec", "--help"]), id="dpctl spec --help"),
        pytest.param(DPCTL.format(args=["spec", "plan", "--help"]), id="dpctl spec plan --help"),
        pytest.param(DPCTL.format(args=["release", "--help"]), id="dpctl release --help"),
        pytest.param(DPCTL.format(args=["ledger", "keygen"]), id="dpctl ledger keygen"),
    ],
)
def test_light_commands_load_no_database_airflow_or_numeric_code(setup):
    assert heavy(loaded_modules(setup)) == []


def test_the_probe_sees_sqlalchemy_when_a_command_opens_a_ledger(tmp_path):
    """Control: ``ledger show`` on a ledger opens it through SQLAlchemy (an uninitialised one: it fails with exit 1
    after loading the ledger code)."""
    ledger = tmp_path / "ledger.db"
    ledger.touch()
    setup = f"""from dp_operators.cli import app
    try:
        app(["ledger", "show", "--url", "sqlite:///{ledger}"], prog_name="dpctl")
    except SystemExit as done:
        assert done.code == 1, done.code"""
    found = heavy(loaded_modules(setup))
    assert "sqlalchemy" in found and "dp_operators.ledger.spend" in found


@pytest.mark.parametrize("name", dp_operators.ledger.__all__)
def test_every_public_ledger_name_resolves_to_its_defining_object(name):
    value = getattr(dp_operators.ledger, name)
    module = sys.modules[value.__module__]
    assert getattr(module, name) is value
    assert name in dir(dp_operators.ledger)


def test_submodules_still_import_from_the_package_and_unknown_names_fail():
    from dp_operators.ledger import schema

    assert schema.__name__ == "dp_operators.ledger.schema"
    with pytest.raises(AttributeError, match="no attribute 'Ledgr'"):
        dp_operators.ledger.Ledgr  # noqa: B018


#: What only the dashboard needs: a task process never serves it.
DASHBOARD = ("dp_operators.dashboard.app", "dp_operators.dashboard.pages", "dp_operators.dashboard.charts",
             "dp_operators.dashboard.queries", "dp_operators.dashboard.audit_status", "fastapi", "starlette",
             "plotly")


def task_process(*options: str) -> dict:
    """The modules a fresh task process loads, and its CPU seconds, from ``tests/task_process_probe.py``."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "task_process_probe.py"), *options], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def dashboard_modules(modules: list[str]) -> list[str]:
    return sorted(name for name in modules if name.split(".")[0] in DASHBOARD or name.startswith(DASHBOARD))


def test_a_task_process_running_a_release_loads_none_of_the_dashboard():
    """Loading Airflow's plugins as the task runner does, then executing a release, imports the dashboard plugin's
    small module but not the dashboard app, FastAPI, Starlette or plotly."""
    modules = task_process()["modules"]
    assert "dp_operators.dashboard.plugin" in modules and "dp_operators.operators.release" in modules
    assert dashboard_modules(modules) == []


def test_the_api_server_still_gets_the_dashboard_app():
    """Control: reading the plugin's ``fastapi_apps`` (what the api-server does) builds the app, so the probe sees
    the dashboard's modules when they are loaded."""
    setup = """from airflow.sdk.plugins_manager import integrate_macros_plugins
    integrate_macros_plugins()
    from dp_operators.dashboard.plugin import DPBudgetDashboardPlugin, URL_PREFIX
    (app,) = DPBudgetDashboardPlugin().fastapi_apps
    assert app["url_prefix"] == URL_PREFIX and DPBudgetDashboardPlugin.fastapi_apps[0] is app"""
    found = dashboard_modules(list(loaded_modules(setup)))
    assert "dp_operators.dashboard.app" in found and "fastapi" in found
