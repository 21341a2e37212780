"""The Airflow plugin that puts the budget dashboard in Airflow's UI (Airflow 3.1+ plugin interface).

Registered by the package, as Airflow's own providers register theirs (OpenLineage): the ``airflow.plugins`` entry
point, which Airflow always loads, and the provider's ``"plugins"`` list (:func:`dp_operators.get_provider_info.
get_provider_info`), which Airflow reads only with ``[core] lazy_discover_providers = False`` and which lists the
plugin in ``airflow providers plugins``. Installing ``dp-operators`` is enough: nothing goes in Airflow's plugins
folder (docs/adr/0025).

What it adds (https://airflow.apache.org/docs/apache-airflow/stable/administration-and-deployment/plugins.html):

* ``fastapi_apps``: the dashboard app (:func:`dp_operators.dashboard.app.create_app`), which the api-server mounts
  at :data:`URL_PREFIX`. Airflow does not authenticate a mounted app; every route of this one requires an Airflow
  user (:func:`~dp_operators.dashboard.app.require_dashboard_user`).
* ``external_views``: a "Privacy budget" entry in the Browse menu, shown in an iframe at ``/plugin/dp-budget``, and
  a "Privacy budget" tab on every DAG run (destination ``dag_run``; the UI fills ``{DAG_ID}`` and ``{RUN_ID}``,
  percent-encoded) showing that run's charges. The hrefs are absolute paths, so the api-server must be served at
  the root of its host (``[api] base_url`` without a path).

Airflow's plugin manager also imports this module in every task process (the ``airflow.plugins`` entry point is
loaded there for macros and listeners). A task never serves the dashboard, so the module imports nothing of it:
the app (FastAPI, plotly, the ledger queries) is built on the first read of ``fastapi_apps``, which only the
api-server does. ``tests/test_lazy_imports.py`` checks what loading the plugins imports.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.plugins_manager import AirflowPlugin

#: Where the api-server mounts the dashboard app.
URL_PREFIX = "/dp-budget"
PLUGIN_NAME = "dp_budget_dashboard"


class _DashboardApps:
    """The plugin's ``fastapi_apps``: built on first access (from the class or an instance) and kept, so the
    api-server mounts one app and a task process, which never reads it, imports none of the dashboard."""

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._apps is None:
            from dp_operators.dashboard.app import create_app

            self._apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "DP budget dashboard"}]
        return self._apps


class DPBudgetDashboardPlugin(AirflowPlugin):
    """The budget dashboard: a read-only FastAPI app plus its navigation entry and DAG-run tab."""

    name = PLUGIN_NAME
    fastapi_apps = _DashboardApps()
    external_views = [
        {
            "name": "Privacy budget",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "dp-budget",
        },
        {
            "name": "Privacy budget",
            "href": f"{URL_PREFIX}/runs/{{DAG_ID}}/{{RUN_ID}}",
            "destination": "dag_run",
            "url_route": "dp-budget-run",
        },
    ]
