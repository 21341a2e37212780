"""Release specs: YAML documents validated by pydantic models (no Airflow import)."""

from __future__ import annotations

from dp_operators.spec.loader import SpecError, load_spec, parse_spec, spec_hash
from dp_operators.spec.models import Aggregate, Budget, ContributionBounds, ReleaseSpec

__all__ = [
    "Aggregate",
    "Budget",
    "ContributionBounds",
    "ReleaseSpec",
    "SpecError",
    "load_spec",
    "parse_spec",
    "spec_hash",
]
