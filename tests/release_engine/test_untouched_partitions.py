"""Binary64 sums move partitions the added person never touches: the plan's L1 and L2 cover every partition
(docs/adr/0017, "Untouched partitions"), and partition selection, whose partitions are private, refuses binary64.

The adversary of ADR 0017 picks the summation order of every partition on each side. The search below plays it:
for each partition it collects every float sum its values can have (every row order added left to right, numpy's
pairwise sum of every order, partial sums in chunks, ``math.fsum`` as the correctly rounded reference), reads each
through the engine's reader onto the grid, and pairs the two neighbours' extremes partition by partition.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest
import yaml

from dp_operators.mechanisms import discrete_gaussian_delta
from dp_operators.mechanisms.calibration import rho_to_epsilon
from dp_operators.release.errors import ReleaseConfigError
from dp_operators.release.inputs import key_domain, prepare_inputs
from dp_operators.release.plan import plan_release
from dp_operators.spec import parse_spec

KEYS = ["w", "x", "y", "z"]
#: Five doubles whose float sum is 2.4999999999999996, 2.5 or 2.5000000000000004 by row order: at grid 1 the
#: partition rounds to 2 or 3 whatever the new person does elsewhere.
SUM_BOUNDARY = [0.35, 0.35, 0.2, 0.9, 0.7]
#: Centred at 0.5 (bounds [0, 1]) these sum to -0.5 or -0.5000000000000002: a mean's centred sum rounds to 0 or -1.
MEAN_BOUNDARY = [0.65, 0.05, 0.3, 0.35, 0.65]
#: Their centred sum of squares Q - S + N/4 lands on both sides of 1/2 by the orders of Q and S.
VARIANCE_BOUNDARY = [0.95, 0.95, 0.55, 0.2, 0.55]
BINARY64 = {"arithmetic": "binary64", "max_rows": 10}


def spec(kind, *, keys=KEYS, bounds=(0, 1), grid=1, upstream=BINARY64, mechanism="discrete_laplace", budget=None,
         l0=1, selection=False):
    entry = {"name": "a", "kind": kind, "mechanism": mechanism, "budget": budget or {"epsilon": 1},
             "group_by": ["g"]}
    if kind != "count":
        entry.update(bounds=list(bounds), grid=grid)
    if selection:
        entry["partition_selection"] = {"mechanism": "discrete_laplace", "budget": {"epsilon": 1, "delta": 1e-8}}
    else:
        entry["keys"] = {"g": list(keys)}
    if upstream is not None:
        entry["upstream"] = upstream
    document = {"version": 1, "release": "untouched", "budget_account": "acct", "privacy_unit": "person",
                "contribution": {"max_partitions_contributed": l0}, "aggregates": [entry]}
    return parse_spec(yaml.safe_dump(document, sort_keys=False), source="untouched partitions")


def _left_to_right(values) -> float:
    total = 0.0
    for value in values:
        total += value
    return total


def _orders(values: list[float], limit: int = 2000):
    """Every row order (up to 7 values), else seeded shuffles: the adversary's choices."""
    if len(values) <= 7:
        yield from set(itertools.permutations(values))
        return
    generator = random.Random(len(values))
    for _ in range(limit):
        yield tuple(generator.sample(values, len(values)))


def float_sums(values: list[float]) -> set[float]:
    """Every float sum of ``values`` the search finds: left to right and numpy pairwise over row orders, chunked
    partial sums, and math.fsum (correctly rounded: the reference the others scatter around)."""
    sums = {math.fsum(values)} if values else {0.0}
    for order in _orders(values):
        sums.add(_left_to_right(order))
        sums.add(float(np.sum(np.array(order, dtype=np.float64))))
        sums.add(_left_to_right(_left_to_right(order[i:i + 2]) for i in range(0, len(order), 2)))
    return sums


def upstream_fields(kind: str, values: list[float]) -> list[dict]:
    """Every upstream row the search finds for one partition: each float sum (and sum of squares, in its own
    order) with the exact count."""
    sums = float_sums(values)
    rows = [{"sum": total} for total in sums]
    if kind in ("mean", "variance"):
        rows = [{**row, "count": len(values)} for row in rows]
    if kind == "variance":
        squares = float_sums([value * value for value in values])
        rows = [{**row, "sum_squares": q} for row in rows for q in squares]
    return rows


def reachable_units(release_spec, partitions: dict[str, list[float]]) -> dict[str, dict[str, set[int]]]:
    """``{component: {key: grid integers}}``: what the engine's reader makes of every row the search finds."""
    aggregate = release_spec.aggregates[0]
    domain = [key for (key,) in key_domain(aggregate)]
    reached: dict[str, dict[str, set[int]]] = {c: {k: set() for k in domain} for c in aggregate.components}
    for key in domain:
        values = partitions.get(key, [])
        rows = upstream_fields(aggregate.kind, values) if values else [{}]
        for row in rows:
            prepared = prepare_inputs(release_spec, {"a": [{"g": key, **row}] if row else []})
            position = list(prepared.keys["a"]).index((key,))
            for component in aggregate.components:
                reached[component][key].add(int(prepared.values[("a", component)][position]))
    return reached


def adversarial_distance(release_spec, base: dict, neighbour: dict) -> dict[str, tuple[list[int], int, int]]:
    """Per component: the largest change of each partition's grid integer over the adversary's orders, and the
    L1 and L2^2 distances of the neighbours those orders give (each partition at its largest change)."""
    first, second = reachable_units(release_spec, base), reachable_units(release_spec, neighbour)
    out = {}
    for component in first:
        gaps = [max(abs(a - b) for a in first[component][key] for b in second[component][key])
                for key in first[component]]
        out[component] = (gaps, sum(gaps), sum(g * g for g in gaps))
    return out


def boundary_case(values: list[float], added: dict[str, list[float]]) -> tuple[dict, dict]:
    base = {key: list(values) for key in KEYS}
    neighbour = {key: list(values) + added.get(key, []) for key in KEYS}
    return base, neighbour


class TestAdversarialSummationOrders:
    @pytest.mark.parametrize(("kind", "values", "moving"), [
        pytest.param("sum", SUM_BOUNDARY, "sum", id="sum"),
        pytest.param("mean", MEAN_BOUNDARY, "sum", id="mean"),
        pytest.param("variance", VARIANCE_BOUNDARY, "sum_squares", id="variance"),
    ])
    def test_every_partition_stays_within_the_planned_l1_and_l2(self, kind, values, moving):
        """Over every order found, each partition moves within its bound and the neighbours within L1 and L2."""
        release_spec = spec(kind)
        base, neighbour = boundary_case(values, {"x": [1.0]})
        plan = plan_release(release_spec)
        found = adversarial_distance(release_spec, base, neighbour)
        for component, (gaps, l1, l2_squared) in found.items():
            step = plan.step("a", component)
            for key, gap in zip(KEYS, gaps):
                assert gap <= (step.linf if key == "x" else step.untouched_allowance), (component, key)
            assert l1 <= step.l1_sensitivity, component
            assert l2_squared <= step.l2_sensitivity_squared, component
        assert all(found[moving][0])  # the search moved every partition, untouched ones too: not vacuous

    def test_the_plan_without_untouched_partitions_is_exceeded(self):
        """Negative control: the found pair exceeds the old L1 = L0 * Linf (epsilon 2.5 for 1), not the new L1."""
        release_spec = spec("sum")
        base, neighbour = boundary_case(SUM_BOUNDARY, {"x": [1.0]})
        assert {2.4999999999999996, 2.5} <= float_sums(SUM_BOUNDARY)
        gaps, l1, l2_squared = adversarial_distance(release_spec, base, neighbour)["sum"]
        step = plan_release(release_spec).step("a", "sum")
        old_l1 = step.l0 * step.linf
        assert (old_l1, step.l1_sensitivity) == (2, 5)
        assert l1 > old_l1 and l2_squared > step.l0 * step.linf**2
        assert Fraction(l1) / (Fraction(old_l1) / step.budget.epsilon) == Fraction(5, 2)  # epsilon spent at t = 2
        assert Fraction(l1) / step.scale <= step.budget.epsilon

    def test_random_values_next_to_a_rounding_boundary_stay_within_the_plan(self):
        """Random doubles on a rounding boundary move each partition within its bound, and untouched ones do move."""
        generator = random.Random(2017)
        release_spec = spec("sum", keys=["w", "x", "y"], l0=2)
        step = plan_release(release_spec).step("a", "sum")
        untouched_moved = 0
        for _ in range(20):
            base = {key: _next_to_a_boundary(generator) for key in ("w", "x", "y")}
            neighbour = {key: values + ([round(generator.random(), 2)] if key != "y" else [])
                         for key, values in base.items()}
            gaps, l1, l2_squared = adversarial_distance(release_spec, base, neighbour)["sum"]
            assert max(gaps[:2]) <= step.linf and gaps[2] <= step.untouched_allowance
            assert l1 <= step.l1_sensitivity and l2_squared <= step.l2_sensitivity_squared
            untouched_moved += gaps[2]
        assert untouched_moved  # the search found orders that move the untouched partition: not vacuous


def _next_to_a_boundary(generator: random.Random, size: int = 5) -> list[float]:
    """``size`` two-decimal doubles in [0, 1] whose exact decimal sum is a half-integer (a grid-1 rounding
    boundary): their float sums fall on either side of it by order."""
    while True:
        values = [round(generator.random(), 2) for _ in range(size - 1)]
        last = Fraction(math.floor(sum(map(Fraction, map(str, values)))) * 2 + 1, 2) - sum(
            Fraction(str(v)) for v in values)
        if 0 <= last <= 1:
            return [*values, float(last)]


class TestPlannedSensitivities:
    def test_public_keys_add_the_allowance_for_each_untouched_partition(self):
        """Binary64 over P public keys: L1 = L0 Linf + (P - L0) a and L2^2 = L0 Linf^2 + (P - L0) a^2."""
        step = plan_release(spec("sum", keys=[str(i) for i in range(10)], l0=3)).step("a", "sum")
        a = step.bound.untouched_allowance
        assert a == math.ceil(2 * step.bound.summation_error / step.bound.grid) >= 1
        assert (step.untouched_partitions, step.untouched_allowance) == (7, a)
        assert step.l1_sensitivity == 3 * step.linf + 7 * a
        assert step.l2_sensitivity_squared == 3 * step.linf**2 + 7 * a * a

    @pytest.mark.parametrize(("kind", "upstream", "component"), [
        pytest.param("sum", None, "sum", id="exact sum"),
        pytest.param("mean", BINARY64, "count", id="the count of a binary64 mean"),
        pytest.param("count", None, "count", id="count"),
    ])
    def test_exact_values_carry_no_untouched_allowance(self, kind, upstream, component):
        """Exact sums and counts do not move where the privacy unit is absent: L1 stays L0 Linf."""
        step = plan_release(spec(kind, upstream=upstream)).step("a", component)
        assert step.untouched_allowance == 0
        assert step.l1_sensitivity == step.l0 * step.linf and step.l2_sensitivity_squared == step.l0 * step.linf**2

    def test_a_mean_and_a_variance_carry_the_allowance_on_their_float_components(self):
        """A mean's centred sum and a variance's sum of squares carry a = ceil(2E / grid); their count does not."""
        plan = plan_release(spec("variance"))
        assert plan.step("a", "sum").untouched_allowance >= 1
        assert plan.step("a", "sum_squares").untouched_allowance >= 1
        assert plan.step("a", "count").untouched_allowance == 0

    @pytest.mark.parametrize("budget", [{"epsilon": 1, "delta": 1e-6}, {"epsilon": 4, "delta": 1e-9}])
    def test_an_approximate_gaussian_is_valid_for_the_heterogeneous_vector(self, budget):
        """An (epsilon, delta) discrete Gaussian meets its budget for the unequal worst-case shift vector."""
        release_spec = spec("sum", keys=[str(i) for i in range(6)], mechanism="discrete_gaussian", budget=budget)
        step = plan_release(release_spec, accountant="approx_dp").step("a", "sum")
        assert 0 < step.untouched_allowance < step.linf  # a heterogeneous vector
        epsilon, delta = Fraction(budget["epsilon"]), Fraction(budget["delta"])
        rho = Fraction(step.l2_sensitivity_squared) / (2 * step.scale)
        dominating = discrete_gaussian_delta(step.scale, epsilon, linf=step.linf, l0=6)
        assert rho_to_epsilon(rho, delta) <= epsilon or dominating <= delta
        # more noise than the same plan ignoring the untouched partitions needed
        single = plan_release(spec("sum", keys=["0"], mechanism="discrete_gaussian", budget=budget),
                              accountant="approx_dp").step("a", "sum")
        assert step.scale > single.scale

    def test_an_allowance_equal_to_linf_is_calibrated_by_the_exact_profile_of_every_partition(self):
        """When a = Linf every partition may move by Linf: the exact profile of P equal shifts is used."""
        release_spec = spec("mean", mechanism="discrete_gaussian", budget={"epsilon": 1, "delta": 1e-6})
        step = plan_release(release_spec, accountant="approx_dp").step("a", "sum")
        assert step.untouched_allowance == step.linf == 1
        assert discrete_gaussian_delta(step.scale, Fraction(1, 2), linf=1, l0=len(KEYS)) <= Fraction(1, 2 * 10**6)


class TestDescription:
    def test_the_mechanism_description_states_the_untouched_allowance(self):
        """The published mechanism states a and P - L0, from which L1 = L0 Linf + (P - L0) a is re-derived."""
        described = plan_release(spec("sum")).step("a", "sum").describe()
        assert described["untouched_partition_allowance_grid_units"] == 1
        assert described["untouched_partitions"] == len(KEYS) - 1
        assert described["l1_sensitivity"] == (
            described["max_partitions_contributed"] * described["linf_grid_units"]
            + described["untouched_partitions"] * described["untouched_partition_allowance_grid_units"]
        ) * described["grid"]
        assert described["l2_sensitivity"] == pytest.approx(math.sqrt(2**2 + 3))

    def test_an_exact_description_has_no_untouched_allowance(self):
        """Exact sums publish no allowance for untouched partitions (there is none)."""
        described = plan_release(spec("sum", upstream=None)).step("a", "sum").describe()
        assert "untouched_partition_allowance_grid_units" not in described


class TestPartitionSelection:
    @pytest.mark.parametrize("kind", ["sum", "mean", "variance"])
    def test_binary64_under_partition_selection_is_refused_by_the_plan(self, kind):
        """Binary64 under partition selection is refused by the plan, saying what, where and how to fix it."""
        with pytest.raises(ReleaseConfigError) as refused:
            plan_release(spec(kind, selection=True))
        message = str(refused.value)
        assert "aggregate 'a'" in message and "binary64" in message and "partition_selection" in message
        assert "upstream.arithmetic: exact" in message and "'keys'" in message

    def test_exact_sums_under_partition_selection_are_planned(self):
        """Exact sums under partition selection are planned as before (no untouched partition moves)."""
        step = plan_release(spec("sum", upstream=None, selection=True)).step("a", "sum")
        assert step.untouched_allowance == 0 and step.l1_sensitivity == step.l0 * step.linf
