"""A series sum with wide bounds is planned, and its half-widths published, from public parameters in bounded
time and memory: on the integer lattice of a sum its noise's sigma is large, where the exact lattice law by FFT
over the pmf's whole reach needs terms x 24 sigma points (tens of GB at bounds [0, 10^6], T = 365)."""

from __future__ import annotations

import math
from statistics import NormalDist

from dp_operators.continual.plan import plan_spec_series
from dp_operators.continual.run import check_releasable
from dp_operators.spec import parse_spec


def wide_sum(upper: str):
    return parse_spec(
        "version: 1\nrelease: r\nbudget_account: a\nprivacy_unit: person\n"
        "series: {horizon: 365, mechanism: auto}\n"
        "aggregates:\n  - {name: s, kind: sum, group_by: [k], keys: {k: [a, b]}, mechanism: auto, "
        f"budget: {{rho: 1}}, bounds: [0, {upper}], grid: 1}}\n", source="s.yaml")


def test_a_series_sum_with_wide_bounds_is_planned_at_dag_import():
    check_releasable(wide_sum("1000000"))  # what the DAG import runs


def test_the_summed_increments_half_width_of_a_wide_sum_covers_as_the_gaussian_does():
    (plan,) = plan_spec_series(wide_sum("1000000"))
    summed = next(c for c in plan.plan.candidates if c.mechanism == "summed_increments")
    gaussian = NormalDist().inv_cdf(0.975) * summed.worst_std
    # sigma is 10^6 lattice units: the lattice law is the Gaussian's to far below a unit
    assert math.isclose(plan.worst_half_width["summed_increments"], gaussian, rel_tol=1e-3)
