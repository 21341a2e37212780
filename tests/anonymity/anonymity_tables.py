"""Known-answer tables and paths for the anonymity tests (imported by name; conftest.py holds the fixtures)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dp_operators.anonymity import parse_anonymity_spec
from dp_operators.anonymity.spec import AnonymitySpec

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
KANON_DIR = SHARED_DATA / "kanon"
ADULT_CSV = SHARED_DATA / "adult.csv"
#: ARX's adult example as ARX ships it: adult.csv (30,162 rows, ';'-separated) and adult_hierarchy_<column>.csv.
ARX_DIR = SHARED_DATA / "arx_adult"
ARX_QIS = ["sex", "age", "race", "marital-status", "education", "native-country", "workclass", "occupation"]
ADULT_QIS = ["age", "sex", "race", "native_country", "education"]
STUDENT_QIS = ["Teacher", "Gender", "Ethnic", "Freeredu", "wesson"]
HOSPITAL_QIS = ["name", "age", "gender", "city", "religion"]


def li_patients_table() -> pd.DataFrame:
    """Table 4 of Li, Li, Venkatasubramanian, "t-Closeness: Privacy Beyond k-Anonymity and l-Diversity" (ICDE 2007):
    the 3-anonymous patients table (ZIP and Age generalised; Salary in thousands, Disease)."""
    rows = [
        ("4767*", "<=40", 3, "gastric ulcer"),
        ("4767*", "<=40", 5, "stomach cancer"),
        ("4767*", "<=40", 9, "pneumonia"),
        ("4790*", ">=40", 6, "gastritis"),
        ("4790*", ">=40", 11, "flu"),
        ("4790*", ">=40", 8, "bronchitis"),
        ("4760*", "<=40", 4, "gastritis"),
        ("4760*", "<=40", 7, "bronchitis"),
        ("4760*", "<=40", 10, "stomach cancer"),
    ]
    return pd.DataFrame(rows, columns=["zip", "age", "salary", "disease"])


def outlier_table() -> pd.DataFrame:
    """Nine people, shape ``(9, 3)``: ages 21..29 in two 5-year bands, four per band and two per sex in each, and one
    85-year-old man, who is alone in every age band below ``*`` (the known answers of the anonymiser tests)."""
    return pd.DataFrame(
        {
            "age": [21, 22, 23, 24, 26, 27, 28, 29, 85],
            "sex": ["M", "M", "F", "F", "M", "M", "F", "F", "M"],
            "income": ["low", "high", "low", "high", "low", "high", "low", "high", "low"],
        }
    )


# Figure 1 of Li et al. 2007: the disease hierarchy (height 3).
DISEASE_HIERARCHY = {
    "Respiratory & digestive system diseases": {
        "Respiratory system diseases": {
            "Respiratory infection": ["flu", "pneumonia", "bronchitis"],
            "Vascular lung diseases": ["pulmonary edema", "pulmonary embolism"],
        },
        "Digestive system diseases": {
            "Stomach diseases": ["gastric ulcer", "gastritis", "stomach cancer"],
            "Colon diseases": ["colitis", "colon cancer"],
        },
    }
}


def anonymity_spec(qis, targets: dict, sensitive=(), max_fraction: float = 0.0,
                   algorithm: str = "full_domain") -> AnonymitySpec:
    """A spec built from Python values: ``qis`` as the spec lists them (names or mappings), ``sensitive`` as
    ``(name, type)`` pairs, the loss metric."""
    return AnonymitySpec.model_validate(
        {
            "version": 1,
            "check": "anonymity_tables",
            "quasi_identifiers": list(qis),
            "sensitive_attributes": [{"name": name, "type": kind} for name, kind in sensitive],
            "targets": targets,
            "suppression": {"max_fraction": max_fraction},
            "anonymisation": {"algorithm": algorithm, "metric": "loss"},
        }
    )


def anonymity_spec_text(qis: str, targets: str = "{k: 2}", algorithm: str = "full_domain", extra: str = ""):
    """A spec parsed from YAML text, as a user writes it: ``qis`` is the text inside the quasi-identifier list."""
    return parse_anonymity_spec(
        f"version: 1\ncheck: anonymity_tables\nquasi_identifiers: [{qis}]\ntargets: {targets}\n"
        f"anonymisation: {{algorithm: {algorithm}}}\n{extra}",
        source="anonymity_tables.yaml",
    )
