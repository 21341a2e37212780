"""Provider registration for Airflow's ``apache_airflow_provider`` entry point.

Airflow's ProvidersManager calls :func:`get_provider_info` to learn the connection types, hooks and operators this
package contributes (https://airflow.apache.org/docs/apache-airflow-providers/howto/create-custom-providers.html).
"""

from __future__ import annotations

from dp_operators import __version__


def get_provider_info() -> dict:
    """Return the provider metadata dictionary that Airflow validates against its provider schema."""
    return {
        "package-name": "dp-operators",
        "name": "Differential Privacy Operators",
        "description": "Differentially private releases with a persisted privacy-budget ledger.",
        "versions": [__version__],
        "connection-types": [
            {
                "hook-class-name": "dp_operators.hooks.ledger.DPLedgerHook",
                "connection-type": "dp_ledger",
            }
        ],
        "operators": [
            {
                "integration-name": "Differential Privacy",
                "python-modules": [
                    "dp_operators.operators.release",
                    "dp_operators.operators.anonymity",
                    "dp_operators.operators.gate",
                ],
            }
        ],
        "extra-links": ["dp_operators.operators.lineage.DPReleaseLink"],
        "hooks": [
            {"integration-name": "Differential Privacy", "python-modules": ["dp_operators.hooks.ledger"]}
        ],
        "plugins": [
            {"name": "dp_budget_dashboard", "plugin-class": "dp_operators.dashboard.plugin.DPBudgetDashboardPlugin"}
        ],
        "config": {
            "dp_operators": {
                "description": "The budget dashboard (Airflow UI plugin) of dp-operators.",
                "options": {
                    "dashboard_ledger_conn_id": {
                        "description": "The connection the budget dashboard reads the ledger through: a "
                        "spender's or reader's connection (never the privacy officer's; a connection holding a "
                        "governor_key is refused).",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "dp_ledger_readonly",
                        "default": "dp_ledger_default",
                    },
                    "dashboard_verify_interval": {
                        "description": "Seconds between the dashboard's background checks of the audit chain "
                        "(structure only: the dashboard holds no key).",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": "600",
                        "default": "300",
                    },
                },
            }
        },
        "integrations": [
            {
                "integration-name": "Differential Privacy",
                "external-doc-url": "https://github.com/dp-operators/dp-operators",
                "tags": ["software"],
            }
        ],
    }
