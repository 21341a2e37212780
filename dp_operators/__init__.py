"""dp_operators: differentially private releases for Apache Airflow with a persisted privacy-budget ledger."""

from __future__ import annotations

__version__ = "0.1.0"
