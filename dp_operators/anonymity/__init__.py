"""Anonymisation of microdata tables: generalisation hierarchies, optimal full-domain search and Mondrian, and the
k-anonymity, l-diversity, t-closeness and re-identification-risk checks that gate a release.

Pure pandas/numpy (no Airflow import). Sources: Sweeney 2002 (k-anonymity); Machanavajjhala et al. 2006
(l-diversity); Li, Li, Venkatasubramanian 2007 (t-closeness); LeFevre, DeWitt, Ramakrishnan 2006 (Mondrian);
El Emam et al. 2009 (OLA) and Kohlmayer et al. 2012 (Flash) (full-domain search); El Emam & Dankar 2008 (risk).
User documentation: ``docs/anonymity.md``.
"""

from __future__ import annotations

from dp_operators.anonymity.anonymise import AnonymisationResult, anonymise
from dp_operators.anonymity.check import check_table, evaluate_table
from dp_operators.anonymity.criteria import Criteria
from dp_operators.anonymity.encoding import EncodedQuasiIdentifier
from dp_operators.anonymity.errors import AnonymityError, AnonymityInputError, AnonymitySpecError
from dp_operators.anonymity.generalisation import GeneralisationHierarchy, encode_quasi_identifiers
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
from dp_operators.anonymity.lattice import FullDomainResult, full_domain_search
from dp_operators.anonymity.loss import METRICS, information_loss
from dp_operators.anonymity.mondrian import MondrianResult, mondrian, mondrian_spec
from dp_operators.anonymity.risk import risk_summary
from dp_operators.anonymity.spec import (
    Anonymisation,
    AnonymitySpec,
    LDiversityTarget,
    QuasiIdentifier,
    QuasiIdentifierHierarchy,
    SensitiveAttribute,
    Suppression,
    Targets,
    load_anonymity_spec,
    parse_anonymity_spec,
)

__all__ = [
    "METRICS",
    "Anonymisation",
    "AnonymisationResult",
    "AnonymityError",
    "AnonymityInputError",
    "AnonymitySpec",
    "AnonymitySpecError",
    "Criteria",
    "EncodedQuasiIdentifier",
    "EquivalenceClasses",
    "FullDomainResult",
    "GeneralisationHierarchy",
    "LDiversityTarget",
    "MondrianResult",
    "QuasiIdentifier",
    "QuasiIdentifierHierarchy",
    "SensitiveAttribute",
    "SensitiveDistribution",
    "Suppression",
    "Targets",
    "ValueHierarchy",
    "ViolatingClasses",
    "anonymise",
    "check_table",
    "distinct_l_diversity",
    "encode_quasi_identifiers",
    "entropy_l_diversity",
    "equivalence_classes",
    "evaluate_table",
    "full_domain_search",
    "information_loss",
    "k_anonymity",
    "load_anonymity_spec",
    "mondrian",
    "mondrian_spec",
    "parse_anonymity_spec",
    "recursive_cl_diversity",
    "risk_summary",
    "sensitive_distribution",
    "t_closeness",
    "violating_classes",
]
