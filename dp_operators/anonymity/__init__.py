"""k-anonymity, l-diversity and t-closeness checks for microdata tables, and Mondrian generalisation.

Pure pandas/numpy (no Airflow import). Sources: Sweeney 2002 (k-anonymity); Machanavajjhala et al. 2006
(l-diversity); Li, Li, Venkatasubramanian 2007 (t-closeness); LeFevre, DeWitt, Ramakrishnan 2006 (Mondrian).
User documentation: ``docs/anonymity.md``.
"""

from __future__ import annotations

from dp_operators.anonymity.check import check_table
from dp_operators.anonymity.errors import AnonymityError, AnonymityInputError, AnonymitySpecError
from dp_operators.anonymity.hierarchy import ValueHierarchy
from dp_operators.anonymity.measures import (
    EquivalenceClasses,
    SensitiveDistribution,
    ViolatingClasses,
    distinct_l_diversity,
    entropy_l_diversity,
    equivalence_classes,
    k_anonymity,
    recursive_cl_diversity,
    sensitive_distribution,
    t_closeness,
    violating_classes,
)
from dp_operators.anonymity.mondrian import MondrianResult, mondrian
from dp_operators.anonymity.spec import (
    AnonymitySpec,
    LDiversityTarget,
    SensitiveAttribute,
    Suppression,
    Targets,
    load_anonymity_spec,
    parse_anonymity_spec,
)

__all__ = [
    "AnonymityError",
    "AnonymityInputError",
    "AnonymitySpec",
    "AnonymitySpecError",
    "EquivalenceClasses",
    "LDiversityTarget",
    "MondrianResult",
    "SensitiveAttribute",
    "SensitiveDistribution",
    "Suppression",
    "Targets",
    "ValueHierarchy",
    "ViolatingClasses",
    "check_table",
    "distinct_l_diversity",
    "entropy_l_diversity",
    "equivalence_classes",
    "k_anonymity",
    "load_anonymity_spec",
    "mondrian",
    "parse_anonymity_spec",
    "recursive_cl_diversity",
    "sensitive_distribution",
    "t_closeness",
    "violating_classes",
]
