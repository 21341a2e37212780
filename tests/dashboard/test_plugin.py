"""The dashboard's plugin: registered by the provider (not the plugins folder), valid for Airflow's provider schema,
loaded by Airflow's plugins manager with its app, navigation entry and DAG-run tab, and the config options it
reads declared."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import jsonschema
from fastapi import FastAPI

from dp_operators.dashboard import app as dashboard_app
from dp_operators.dashboard.plugin import URL_PREFIX, DPBudgetDashboardPlugin
from dp_operators.get_provider_info import get_provider_info

PLUGIN_CLASS = "dp_operators.dashboard.plugin.DPBudgetDashboardPlugin"


def test_provider_info_is_valid_for_airflow_and_registers_the_plugin():
    info = get_provider_info()
    schema = json.loads(importlib.resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    assert info["plugins"] == [{"name": DPBudgetDashboardPlugin.name, "plugin-class": PLUGIN_CLASS}]
    options = info["config"]["dp_operators"]["options"]
    assert options[dashboard_app.CONN_ID_OPTION]["default"] == dashboard_app.DEFAULT_CONN_ID
    assert options[dashboard_app.VERIFY_INTERVAL_OPTION]["default"] == "300"


def test_airflow_loads_the_plugin_from_the_provider():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    manager.initialize_providers_plugins()
    ours = [plugin for plugin in manager.plugins if plugin.plugin_class == PLUGIN_CLASS]
    assert len(ours) == 1 and ours[0].provider_name == "dp-operators"


def test_nothing_in_the_plugins_folder_registers_it_twice():
    plugins = Path(__file__).parents[2] / "plugins"
    assert not [path for path in plugins.rglob("*.py")], "the provider registers the plugin; a copy here is a duplicate"


def test_the_plugin_serves_the_authenticated_app_and_its_views():
    (entry,) = DPBudgetDashboardPlugin.fastapi_apps
    assert entry["url_prefix"] == URL_PREFIX == "/dp-budget" and isinstance(entry["app"], FastAPI)
    routes = [route for route in entry["app"].routes if getattr(route, "methods", None)]
    assert routes and all(
        any(d.call is dashboard_app.require_dashboard_user for d in route.dependant.dependencies) for route in routes
    )
    nav, run_tab = DPBudgetDashboardPlugin.external_views
    assert (nav["destination"], nav["category"], nav["href"]) == ("nav", "browse", "/dp-budget/")
    assert run_tab["destination"] == "dag_run" and run_tab["href"] == "/dp-budget/runs/{DAG_ID}/{RUN_ID}"
    assert nav["url_route"] != run_tab["url_route"]  # Airflow drops a view whose url_route is taken


def test_airflow_serialises_the_views_for_its_ui():
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    for view in DPBudgetDashboardPlugin.external_views:
        assert ExternalViewResponse.model_validate(view).href == view["href"]


def test_airflow_loads_the_plugin_with_its_default_settings():
    """Airflow reads a provider's "plugins" only with lazy_discover_providers off (default on); the
    ``airflow.plugins`` entry point is loaded either way."""
    from airflow import plugins_manager, settings

    assert settings.LAZY_LOAD_PROVIDERS is True  # Airflow's default: the provider list alone would not load it
    loaded, errors = plugins_manager._load_entrypoint_plugins()
    ours = [plugin for plugin in loaded if isinstance(plugin, DPBudgetDashboardPlugin)]
    assert ours and not errors, (loaded, errors)
    # `python -m pytest` puts the checkout on sys.path, where the editable install's egg-info is a second copy of
    # the same distribution (Airflow keeps the first plugin of a name); an installed package has one
    assert {plugin.source.dist for plugin in ours} == {"dp-operators"}
