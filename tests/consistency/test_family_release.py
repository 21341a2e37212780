"""A consistent family released through the engine: the charge and the mechanisms do not depend on
post-processing; integer families beyond 2^53 are rounded exactly and released (DESIGN.md 2.4: a data value never
raises mid-release); a member whose budget leaves almost no noise is refused before the reservation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dp_operators.release import ReleaseAbortedError, ReleaseConfigError, plan_release, run_release
from dp_operators.release.consistent import make_consistent, plan_families

from .family_models import ALPHA, aggregate, four_axis_spec, make_spec, new_ledger, release_key


def test_the_charge_and_the_mechanisms_do_not_depend_on_post_processing():
    """A four-axis family plans the same charge, delta and noise steps with and without ``consistent``."""
    with_it, without = four_axis_spec(), four_axis_spec(postprocess=False)
    for accountant in ("zcdp",):
        a, b = plan_release(with_it, accountant=accountant), plan_release(without, accountant=accountant)
        assert a.charge(accountant) == b.charge(accountant)
        assert a.delta(accountant) == b.delta(accountant)
        assert [s.describe() for s in a.steps] == [s.describe() for s in b.steps]


def test_an_integer_sum_family_with_sums_beyond_2_53_is_released_and_adds_up(tmp_path):
    """DESIGN 2.4: a data value never raises mid-release. A sum family with grid 1 and ``integer: true`` whose
    true cell sums exceed 2^53 (revenue in cents: 1.8e7 rows of up to 1e9) made controlled_rounding raise
    ValueError after the reservation (charge abandoned, spent). Now rounded exactly (up to the engine's 2^62): the
    release commits, post-processed, and the total is the exact integer sum of the cells."""
    bounds = [0, 10**9]
    spec = make_spec([aggregate("rev_by_x", {"x": [0, 1, 2, 3]}, "discrete_laplace", {"epsilon": 1}, "sum",
                                bounds=bounds, grid=1),
                      aggregate("rev", {}, "discrete_laplace", {"epsilon": 1}, "sum", bounds=bounds, grid=1)],
                     {"consistent": [["rev_by_x", "rev"]], "integer": True})
    ledger = new_ledger(tmp_path / "l.db", accountant="pure_dp")
    big = 2**54
    upstream = {"rev_by_x": [{"x": x, "sum": big} for x in range(4)], "rev": 4 * big}
    try:
        output = run_release(spec, upstream, ledger, release_key(), spec_hash="0" * 64).output
    except ReleaseAbortedError as error:
        states = [c["state"] for c in ledger.charges()]
        pytest.fail(f"aborted after the reservation ({error.__cause__!r}); budget returned: "
                    f"{error.budget_returned}; charge states {states}")
    cells = [row["value"] for row in output["aggregates"]["rev_by_x"]["rows"]]
    assert all(type(v) is int for v in cells) and max(cells) > 2**53
    assert sum(cells) == output["aggregates"]["rev"]["value"]
    assert output["aggregates"]["rev"]["consistency"]["applied"] is True
    assert [c["state"] for c in ledger.charges()] == ["committed"]


def test_integer_margins_add_up_exactly_for_cells_near_2_to_the_52():
    """``integer: true`` published the margins as float64 bincount sums of the int64 base: once a margin passed
    2^53 the float sum rounded, and the published integer total differed from the exact sum of the published
    integer cells. Margins are now exact integer sums."""
    bounds = [0, 10**9]
    spec = make_spec([aggregate("rev_by_x", {"x": list(range(7))}, "discrete_laplace", {"epsilon": 1}, "sum",
                                bounds=bounds, grid=1),
                      aggregate("rev", {}, "discrete_laplace", {"epsilon": 1}, "sum", bounds=bounds, grid=1)],
                     {"consistent": [["rev_by_x", "rev"]], "integer": True})
    plan = plan_release(spec, accountant="pure_dp")
    (planned,) = plan_families(plan)
    rng = np.random.default_rng(3)
    mismatches = []
    for _ in range(10):
        base = np.array([2**52 + 2 * int(rng.integers(0, 10**6)) + 1 for _ in range(7)], dtype=np.int64)
        noised = {("rev_by_x", "sum"): base,
                  ("rev", "sum"): np.array([int(base.sum()) + int(rng.integers(-10**9, 10**9))], dtype=np.int64)}
        result = make_consistent(plan, planned, noised, ALPHA)
        cells = [int(v) for v in result.cells["rev_by_x"].published]
        total = int(result.cells["rev"].published[0])
        assert total > 2**53
        if sum(cells) != total:
            mismatches.append(sum(cells) - total)
    assert mismatches == []


@pytest.mark.parametrize(("rho", "total_rho", "message"), [
    pytest.param(29, 1, r"'n_by_x' .* noise variance of 5\.\d+e-13 grid units squared .* give it a smaller budget",
                 id="rho 29: variance below 1e-12 grid units"),
    pytest.param(720, 1, r"'n_by_x' .* noise variance of 4\.\d+e-313 grid units squared .* smaller budget",
                 id="rho 720: variance subnormal (weights overflowed)"),
    pytest.param(5000, 1, r"'n_by_x' .* noise variance of 0 grid units squared .* smaller budget",
                 id="rho 5000: variance 0 in binary64"),
    pytest.param(20, "0.000001", r"mixes noise variances .*'n_by_x'.*'n'.* ratio above 1e\+12: 'n_by_x' is almost "
                 r"noiseless", id="rho 20 against rho 1e-6: variance ratio above 1e12"),
])
def test_a_member_with_a_very_large_budget_is_refused_before_the_reservation(tmp_path, rho, total_rho, message):
    """rho is accepted up to 5000 at spec load. With rho 720 the member's exact discrete Gaussian variance was a
    subnormal: fit produced NaN after the reservation (charge abandoned); from rho ~745 plan_families raised a bare
    ValueError. Now plan_families, run before the ledger reserves, refuses a variance below 1e-12 grid units squared
    or two variances more than 1e12 apart with ReleaseConfigError naming the aggregate: nothing is charged."""
    spec = make_spec([aggregate("n_by_x", {"x": [0, 1, 2]}, "discrete_gaussian", {"rho": rho}),
                      aggregate("n", {}, "discrete_gaussian", {"rho": total_rho})], {"consistent": True})
    ledger = new_ledger(tmp_path / "l.db")
    upstream = {"n_by_x": [{"x": x, "count": 1000} for x in range(3)], "n": 3000}
    with pytest.raises(ReleaseConfigError, match=message):
        run_release(spec, upstream, ledger, release_key(), spec_hash="0" * 64)
    assert list(ledger.charges()) == [] and ledger.account("acct").spent == 0
    with pytest.raises(ReleaseConfigError, match=message):  # the plan alone refuses it (dpctl spec plan prints it)
        plan_families(plan_release(spec, accountant="zcdp"))


@pytest.mark.parametrize(("rho", "total_rho"), [
    pytest.param(27, 1, id="rho 27 (variance 3.8e-12 grid units, ratio 1.3e11)"),
    pytest.param(18, "0.0001", id="rho 18 against 1e-4 (ratio 1.6e11)"),
])
def test_a_member_with_a_large_budget_within_the_limits_is_released_consistent(tmp_path, rho, total_rho):
    """Control for the refusals above: just inside the limits the family is made consistent, and its values
    add up."""
    spec = make_spec([aggregate("n_by_x", {"x": [0, 1, 2]}, "discrete_gaussian", {"rho": rho}),
                      aggregate("n", {}, "discrete_gaussian", {"rho": total_rho})], {"consistent": True})
    ledger = new_ledger(tmp_path / "l.db")
    upstream = {"n_by_x": [{"x": x, "count": 1000} for x in range(3)], "n": 3000}
    output = run_release(spec, upstream, ledger, release_key(), spec_hash="0" * 64).output
    assert output["aggregates"]["n"]["consistency"]["applied"] is True
    cells = [row["value"] for row in output["aggregates"]["n_by_x"]["rows"]]
    assert math.fsum(cells) == output["aggregates"]["n"]["value"]
    assert [c["state"] for c in ledger.charges()] == ["committed"]

