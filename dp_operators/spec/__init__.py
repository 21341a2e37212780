"""Release specs: YAML documents validated by pydantic models (no Airflow import)."""

from __future__ import annotations

from dp_operators.spec.loader import SpecError, load_spec, load_spec_with_hash, parse_spec, spec_hash
from dp_operators.spec.models import (
    Aggregate,
    Budget,
    ContributionBounds,
    NonFinitePolicy,
    PartitionSelection,
    ReleaseSpec,
    UpstreamSums,
)

__all__ = [
    "Aggregate",
    "Budget",
    "ContributionBounds",
    "NonFinitePolicy",
    "PartitionSelection",
    "ReleaseSpec",
    "UpstreamSums",
    "SpecError",
    "load_spec",
    "load_spec_with_hash",
    "parse_spec",
    "spec_hash",
]
