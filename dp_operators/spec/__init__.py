"""Release specs: YAML documents, read as YAML 1.2 (:mod:`.yaml12`), validated by pydantic models (no Airflow
import)."""

from __future__ import annotations

from dp_operators.spec.loader import SpecError, load_spec, load_spec_with_hash, parse_spec, spec_hash
from dp_operators.spec.models import (
    Aggregate,
    Budget,
    ContributionBounds,
    KeyHierarchy,
    NonFinitePolicy,
    PartitionSelection,
    Postprocess,
    ReleaseSpec,
    UpstreamSums,
)
from dp_operators.spec.yaml12 import YAMLDocumentError, load_yaml

__all__ = [
    "Aggregate",
    "Budget",
    "ContributionBounds",
    "KeyHierarchy",
    "NonFinitePolicy",
    "PartitionSelection",
    "Postprocess",
    "ReleaseSpec",
    "UpstreamSums",
    "SpecError",
    "YAMLDocumentError",
    "load_spec",
    "load_spec_with_hash",
    "load_yaml",
    "parse_spec",
    "spec_hash",
]
