"""Fixtures for the anonymity tests: the shared public tables beside the project (``../shared/data``)."""

from __future__ import annotations

import pandas as pd
import pytest
from .anonymity_tables import ADULT_CSV, ARX_DIR, KANON_DIR, li_patients_table


def read_kanon(name: str) -> pd.DataFrame:
    path = KANON_DIR / name
    if not path.exists():
        pytest.skip(f"{path} is missing: the shared test data must sit beside the project (see PROVENANCE.md)")
    return pd.read_csv(path)


@pytest.fixture(scope="session")
def adult() -> pd.DataFrame:
    if not ADULT_CSV.exists():
        pytest.skip(f"{ADULT_CSV} is missing: the shared test data must sit beside the project")
    return pd.read_csv(ADULT_CSV)


@pytest.fixture(scope="module")
def arx_adult() -> pd.DataFrame:
    """ARX's adult example as ARX ships it (30,162 rows, ``;``-separated)."""
    path = ARX_DIR / "adult.csv"
    if not path.exists():
        pytest.skip(f"{path} is missing: the shared test data must sit beside the project")
    return pd.read_csv(path, sep=";")


@pytest.fixture()
def hospital() -> pd.DataFrame:
    return read_kanon("hospital_anonymized.csv")


@pytest.fixture()
def arx_age_gender_zip() -> pd.DataFrame:
    return read_kanon("arx_test_age_gender_zip.csv")


@pytest.fixture()
def students_k5() -> pd.DataFrame:
    return read_kanon("StudentsMath_Score_k5.csv")


@pytest.fixture()
def li_patients() -> pd.DataFrame:
    return li_patients_table()
