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
        "integrations": [
            {
                "integration-name": "Differential Privacy",
                "external-doc-url": "https://github.com/dp-operators/dp-operators",
                "tags": ["software"],
            }
        ],
    }
