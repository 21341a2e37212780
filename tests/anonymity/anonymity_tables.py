"""Known-answer tables and paths for the anonymity tests (imported by name; conftest.py holds the fixtures)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
KANON_DIR = SHARED_DATA / "kanon"
ADULT_CSV = SHARED_DATA / "adult.csv"
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
