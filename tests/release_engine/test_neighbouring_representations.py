"""Neighbouring inputs through every upstream representation and summation order (tests/neighbour_harness.py): the
grid integers the engine reads stay within the plan's sensitivities in every partition, touched or not, and a
refusal never depends on one person (DESIGN.md 2.4)."""

from __future__ import annotations

from decimal import Decimal

import pytest
import yaml

from dp_operators.release.errors import ReleaseConfigError
from dp_operators.release.plan import plan_release
from dp_operators.spec import parse_spec

from neighbour_harness import SUMMATION_ORDERS, Case, assert_same_outcome, assert_within_plan, distance, outcome

FLOAT_REPRESENTATIONS = ["float", "numpy", "pandas", "arrow", "sql", "parquet"]
ORDERS = list(SUMMATION_ORDERS)
#: Five doubles whose left-to-right sum is 2.4999999999999996, 2.5 or 2.5000000000000004 by row order: a partition
#: the new person never touches still moves one grid unit at grid 1 (docs/adr/0017).
BOUNDARY = [0.35, 0.35, 0.2, 0.9, 0.7]
KEYS = ["w", "x", "y", "z"]


def spec(kind: str, *, bounds=(0, 1), grid=1, upstream=None, keys=KEYS, budget=None) -> object:
    entry = {"name": "a", "kind": kind, "mechanism": "discrete_laplace", "budget": budget or {"epsilon": 1}}
    if kind != "count":
        entry["bounds"] = list(bounds)
        entry["grid"] = grid
    if keys:
        entry["group_by"] = ["g"]
        entry["keys"] = {"g": list(keys)}
    if upstream:
        entry["upstream"] = upstream
    document = {"version": 1, "release": "neighbours", "budget_account": "acct", "privacy_unit": "person",
                "aggregates": [entry]}
    return parse_spec(yaml.safe_dump(document, sort_keys=False), source="neighbours")


BINARY64 = {"arithmetic": "binary64", "max_rows": 10}


def boundary_case(kind: str = "sum") -> Case:
    base = [(key, value) for key in KEYS for value in BOUNDARY]
    return Case(spec(kind, upstream=BINARY64), base, base + [("x", 1.0)])


@pytest.mark.parametrize("kind", ["sum", "mean", "variance"])
def test_float_sums_stay_within_the_plan_in_every_partition(tmp_path, kind):
    """Under binary64, any summation order of every partition (touched or not) keeps the neighbours' grid integers
    within the plan's Linf, L1 and L2, in every representation an upstream hands floats over."""
    largest = assert_within_plan(boundary_case(kind), FLOAT_REPRESENTATIONS, ORDERS, tmp_path)
    assert largest["sum"].l1 >= 1  # the search found movement: the check is not vacuous


def test_adversarial_orders_exceed_a_plan_that_ignores_untouched_partitions(tmp_path):
    """Negative control: the orders found move all four partitions, beyond L0 * Linf (the touched partition only),
    so a plan without the untouched partitions' allowance would be exceeded."""
    case = boundary_case()
    first = outcome(case, case.base, "float", "smallest over row orders", tmp_path)
    second = outcome(case, case.neighbour, "float", "largest over row orders", tmp_path)
    gap = distance(first[1]["sum"], second[1]["sum"])
    step = plan_release(case.spec).step("a", "sum")
    assert gap.l1 > step.l0 * step.linf
    assert sum(1 for key in first[1]["sum"] if first[1]["sum"][key] != second[1]["sum"][key]) == len(KEYS)


@pytest.mark.parametrize(("base", "added"), [([0.5, 0.5], 0.7), ([30.0], 0.5), ([2.0**53], 2.0)],
                         ids=["two halves then 0.7", "integral then not", "2^53 then 2^53 + 2"])
def test_an_exact_spec_refuses_every_float_sum_alike(tmp_path, base, added):
    """Under exact arithmetic a float sum is refused by its type: whether the sum happens to be integral (one
    person's value decides that) never changes the outcome, in any representation."""
    case = Case(spec("sum", bounds=(0, 10**15), grid=1000, keys=["x"]), [("x", v) for v in base],
                [("x", v) for v in base] + [("x", added)])
    assert assert_same_outcome(case, FLOAT_REPRESENTATIONS, ["left to right", "reversed"], tmp_path) == "refused"


@pytest.mark.parametrize("representation", ["decimal", "int"])
def test_exact_sums_stay_within_the_plan(tmp_path, representation):
    """Exact sums (Decimal from SQL NUMERIC, integers) are read exactly: the neighbours differ by the plan's Linf
    at most, in the touched partition only."""
    if representation == "decimal":
        base = [(key, Decimal(str(v))) for key in KEYS for v in BOUNDARY]
        added = ("x", Decimal("1.0"))
        case = Case(spec("sum", grid="0.05"), base, base + [added])
    else:
        base = [(key, v) for key in KEYS for v in (3, 1, 4, 1, 5)]
        case = Case(spec("sum", bounds=(0, 9)), base, base + [("x", 9)])
    largest = assert_within_plan(case, [representation], ["left to right"], tmp_path)
    step = plan_release(case.spec).step("a", "sum")
    assert largest["sum"].l1 == step.linf  # one partition moved, by exactly Linf: the bound is tight here


def test_a_timestamp_mean_under_binary64_is_refused_by_the_plan():
    """Epoch-millisecond timestamps over a one-second window: doubles summed over 5,300 rows cannot carry a 1 ms
    grid; the plan refuses before any data is read, whatever the data (the refusal is the spec's)."""
    t0 = 1_700_000_000_000
    text_spec = spec("mean", bounds=(t0, t0 + 1000), grid=1, upstream={"arithmetic": "binary64", "max_rows": 5300},
                     keys=None)
    with pytest.raises(ReleaseConfigError, match="binary64"):
        plan_release(text_spec)


def test_integer_timestamps_are_read_exactly_in_every_order(tmp_path):
    """The same timestamps as integers (an exact upstream) stay within the plan in every representation that keeps
    them integers."""
    t0 = 1_700_000_000_000
    base = [(None, t0 + (i * 37) % 1000) for i in range(200)]
    case = Case(spec("mean", bounds=(t0, t0 + 1000), keys=None), base, base + [(None, t0 + 999)])
    assert_within_plan(case, ["int", "sql", "arrow"], ["left to right"], tmp_path)
