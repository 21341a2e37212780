"""Half-widths of integer consistent families are functions of the family's structure and spec only: the same on
every draw, whichever members the controlled rounding of that draw happened to keep."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dp_operators.consistency.rounding import controlled_rounding, guaranteed_rounding
from dp_operators.release import plan_release
from dp_operators.release.consistent import _rounding_allowance, make_consistent, plan_families
from dp_operators.spec import ReleaseSpec

ALPHA = 0.05
DRAWS = 120


def cube_spec(sizes: tuple[int, ...], integer: bool = True) -> ReleaseSpec:
    """Counts over every margin of a table with the given axis sizes (the base, every sub-table, the total)."""
    columns = [f"c{i}" for i in range(len(sizes))]
    keys = {c: list(range(n)) for c, n in zip(columns, sizes)}
    aggregates = []
    for size in range(len(columns), -1, -1):
        for kept in itertools.combinations(columns, size):
            entry = {"name": "by_" + "_".join(kept) if kept else "total", "kind": "count",
                     "mechanism": "discrete_gaussian", "budget": {"rho": "1/50"}}
            if kept:
                entry.update(group_by=list(kept), keys={c: keys[c] for c in kept})
            aggregates.append(entry)
    postprocess = {"consistent": True, "nonnegative": True, "integer": integer}
    return ReleaseSpec.model_validate({"version": 1, "release": "cube", "budget_account": "acct",
                                       "privacy_unit": "person", "aggregates": aggregates,
                                       "postprocess": postprocess})


def draws(sizes: tuple[int, ...], seed: int):
    """The plan, the planned family, and ``DRAWS`` results of make_consistent on noised values of one table."""
    plan = plan_release(cube_spec(sizes), accountant="zcdp")
    (planned,) = plan_families(plan)
    family = planned.family
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 30, family.base_cells)
    results = []
    for _ in range(DRAWS):
        noised = {(m.name, "count"): np.bincount(m.to_base, weights=truth, minlength=m.cells).astype(np.int64)
                  + rng.integers(-8, 9, m.cells) for m in family.members}
        results.append(make_consistent(plan, planned, noised, ALPHA))
    return plan, planned, results


@pytest.mark.parametrize("sizes", [pytest.param((2, 2, 2), id="2x2x2 with its 7 margins (full program)"),
                                   pytest.param((2, 2, 2, 2), id="2x2x2x2 with its 15 margins (chains only)")])
def test_integer_half_widths_are_the_same_on_every_draw(sizes):
    """Every member's published half-widths are identical across draws of the same integer family."""
    _, planned, results = draws(sizes, seed=3)
    for member in planned.family.members:
        widths = {tuple(r.cells[member.name].half_width.tolist()) for r in results}
        assert len(widths) == 1, (member.name, widths)
    assert all(r.description["half_widths"] == "public" for r in results)


def test_the_rounding_that_each_draw_kept_would_give_draw_dependent_widths():
    """Negative control: the former rule (1 where this draw's rounding kept the member, else the worst case)
    gives members of the 2x2x2x2 family different half-widths on different draws, which the test above rejects."""
    _, planned, results = draws((2, 2, 2, 2), seed=3)
    family = planned.family
    varying = []
    for member in family.members:
        old = {1.0 if member.name in r.description["controlled_rounding"] else _rounding_allowance(family, member, 1.0)
               for r in results}
        if len(old) > 1:
            varying.append(member.name)
    assert varying, "the draws never changed which members the rounding kept: the test above proves nothing"


def test_allowances_of_a_three_way_table_come_from_its_structure():
    """In a 2x2x2 table the base and the members of the two chains get 1; a margin outside the chains gets the
    fewest cells of a guaranteed member its cells are unions of (2 here, not its 4 base cells)."""
    plan = plan_release(cube_spec((2, 2, 2)), accountant="zcdp")
    (planned,) = plan_families(plan)
    allowances = guaranteed_rounding(planned.family)
    assert allowances[planned.family.base.name] == 1 and allowances["total"] == 1
    assert sorted(allowances.values()) == [1, 1, 1, 1, 1, 1, 2, 2]


def test_every_rounding_stays_within_the_public_allowances():
    """Whatever the real base, controlled rounding moves each member cell by less than its public allowance."""
    plan = plan_release(cube_spec((3, 2, 2, 2)), accountant="zcdp")
    (planned,) = plan_families(plan)
    family = planned.family
    allowances = guaranteed_rounding(family)
    rng = np.random.default_rng(8)
    for _ in range(40):
        real = rng.gamma(0.7, 3.0, family.base_cells)
        rounded, _ = controlled_rounding(family, real)
        for member in family.members:
            moved = np.abs(family.margin(member, rounded.astype(float)) - family.margin(member, real))
            assert np.all(moved < allowances[member.name]), member.name
