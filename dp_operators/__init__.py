"""dp_operators: differentially private releases for Apache Airflow with a persisted privacy-budget ledger.

The Python API (no Airflow needed) is importable from here: ``laplace_mechanism``, ``gaussian_mechanism``,
``vector_release``, ``plan_release``, ``run_release``, ``check_aggregates`` (see :mod:`dp_operators.api` and
docs/python-api.md).
"""

from __future__ import annotations

__version__ = "0.1.0"

_API = ("NoisyValue", "NoisyVector", "check_aggregates", "gaussian_mechanism", "laplace_mechanism", "plan_release",
        "run_release", "vector_release")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    # imported on first use: loading the provider (get_provider_info) must not pull in numpy and SQLAlchemy
    if name in _API:
        from dp_operators import api

        return getattr(api, name)
    raise AttributeError(f"module 'dp_operators' has no attribute {name!r}")
