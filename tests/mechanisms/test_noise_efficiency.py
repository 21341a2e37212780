"""The acceptance figures of benchmarks/noise_efficiency.py, asserted."""

from __future__ import annotations

import importlib.util

import pytest

from support import REPO

OPTIMUM = {1: 4.225, 10: 13.36, 100: 42.25, 1000: 133.6}


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("noise_efficiency", REPO / "benchmarks" / "noise_efficiency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {row["k"]: row for row in module.rows()}


@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_project_gaussian_is_within_one_percent_of_the_analytic_optimum(table, k):
    row = table[k]
    assert row["analytic_gaussian"] == pytest.approx(OPTIMUM[k], rel=1e-3)
    assert row["analytic_gaussian"] * 0.999 <= row["discrete_gaussian"] <= row["analytic_gaussian"] * 1.01
    assert row["discrete_gaussian"] < row["seed_formula"]


@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_auto_is_never_worse_than_the_better_of_laplace_and_gaussian(table, k):
    row = table[k]
    assert row["auto"] <= min(row["discrete_laplace"], row["discrete_gaussian"])
