"""Specs of consistent families on UCI Adult as a user writes them (YAML text in a file, from the example
``config/releases/adult_education_sex.yaml`` or from scratch): counts, age bands through a key hierarchy, and
edits of the example's ``postprocess`` flags. Imported by name by the spec and release-engine tests."""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path

from support import REPO

ACCOUNT = "census_adult_tables"
EXAMPLE = REPO / "config" / "releases" / "adult_education_sex.yaml"
#: Adult's ages 17..90 in seven bands: the groups of an ``age_band > age`` hierarchy.
BANDS = {"17-24": range(17, 25), "25-34": range(25, 35), "35-44": range(35, 45), "45-54": range(45, 55),
         "55-64": range(55, 65), "65-74": range(65, 75), "75+": range(75, 91)}


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    """``text`` written to ``tmp_path / name``; the path."""
    path = tmp_path / name
    path.write_text(text)
    return path


def count(name: str, keys: dict | None = None, budget: dict | None = None, **extra) -> dict:
    """A discrete Gaussian count (rho 0.01 unless ``budget``), grouped by ``keys``' columns over those keys."""
    aggregate = {"name": name, "kind": "count", "mechanism": "discrete_gaussian", "budget": budget or {"rho": 0.01}}
    if keys:
        aggregate.update(group_by=list(keys), keys=keys)
    aggregate.update(extra)
    return aggregate


def document(release_name: str, aggregates: list[dict], postprocess: dict) -> str:
    """A spec as YAML text (JSON is YAML 1.2) spending from ACCOUNT."""
    return json.dumps({"version": 1, "release": release_name, "budget_account": ACCOUNT, "privacy_unit": "person",
                       "aggregates": aggregates, "postprocess": postprocess}, indent=1)


def age_spec(tmp_path: Path, *, base_ages=range(17, 91), groups=None, child_column: str = "age",
             parent_column: str = "age_band") -> Path:
    """People by age (the base, over ``base_ages``), by age band and in total, consistent through the hierarchy
    ``parent_column > child_column`` with ``groups`` (BANDS unless given); the written file."""
    groups = groups if groups is not None else {band: list(ages) for band, ages in BANDS.items()}
    text = document("ages", [
        count("people_by_age", {"age": list(base_ages)}),
        count("people_by_age_band", {"age_band": list(BANDS)}),
        count("people"),
    ], {"consistent": True, "hierarchies": [{"parent": parent_column, "child": child_column, "groups": groups}]})
    return write(tmp_path, text, "ages.yaml")


def example_with(**flags: str) -> str:
    """The example spec's text with some of its postprocess flags written otherwise (``integer="yes"``)."""
    text = EXAMPLE.read_text()
    for flag, written in flags.items():
        old = f"\n  {flag}: true "
        assert text.count(old) == 1, flag
        text = text.replace(old, f"\n  {flag}: {written} ")
    return text


@cache
def consistent_dag_module():
    """``dags/adult_consistent_release.py`` as a module (``dags/`` is not a package: Airflow loads it by path); its
    ``compute_education_sex_counts`` is the example DAG's upstream task."""
    loaded = importlib.util.spec_from_file_location("adult_consistent_release_dag",
                                                    REPO / "dags" / "adult_consistent_release.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module
