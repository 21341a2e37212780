"""The release plan: float-sum sensitivity allowance and plan-time refusals, saturation refused at plan time, L0
capped by the number of partitions, ``auto`` chosen by the cost on the account. Expected values come from the
reasoning in each docstring (Higham 2002 for float sums, the analytic Gaussian for sigma), never from the plan's own
output."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from dp_operators.accounting import IncompatibleAccountantError, PrivacyLoss, charge_in_account_unit
from dp_operators.ledger import ReleaseKey
from dp_operators.mechanisms import (
    analytic_gaussian_sigma,
    discrete_gaussian_delta,
    discrete_gaussian_variance,
    discrete_laplace_variance,
)
from dp_operators.release import ReleaseConfigError, plan_release, prepare_inputs, run_release
from dp_operators.spec import ReleaseSpec, SpecError, parse_spec

from support import make_ledger

U = Fraction(1, 2**53)  # unit roundoff of binary64


def gamma(k: int) -> Fraction:
    """Higham 2002, Lemma 3.1: gamma_k = k u / (1 - k u)."""
    return k * U / (1 - k * U)


def spec_of(**aggregate) -> ReleaseSpec:
    """A one-aggregate spec; the aggregate is named ``x`` and defaults to a Laplace sum over [0, 1] with grid 1."""
    fields = {"name": "x", "kind": "sum", "bounds": [0, 1], "mechanism": "discrete_laplace", "budget": {"epsilon": 1}}
    fields.update(aggregate)
    if fields["kind"] == "count":
        fields.pop("bounds", None)
    return ReleaseSpec.model_validate({"version": 1, "release": "plan", "budget_account": "census_adult",
                                       "privacy_unit": "person", "aggregates": [fields]})


def binary64(max_rows: int) -> dict:
    return {"arithmetic": "binary64", "max_rows": max_rows}


def left_to_right(values) -> float:
    """A float sum in the given row order, as a Python loop (or SQL's sequential SUM) computes it."""
    total = 0.0
    for value in values:
        total += float(value)
    return total


# -- item 2: float sums -------------------------------------------------------------------------------------------
def test_neighbours_one_unit_apart_round_two_grid_units_apart_and_the_binary64_plan_covers_it():
    """Bounds [0, 1], grid 1: D = {0.49999999999999994} and D' = D + {1.0}. The true sums differ by exactly 1, but
    the float sum of D' is 1.5 (1.5 - 2^-54 rounds to 1.5, where doubles are 2^-52 apart), so the two round to
    0 and 2 grid units: two apart where the exact plan charges Linf 1 (true epsilon twice the plan's)."""
    below_half = 0.49999999999999994
    assert Fraction(below_half) == Fraction(1, 2) - Fraction(1, 2**54)
    d_prime = below_half + 1.0
    assert d_prime == 1.5

    exact_plan = plan_release(spec_of())
    assert exact_plan.step("x", "sum").linf == 1
    spec = spec_of(upstream=binary64(2))
    units = [prepare_inputs(spec, {"x": total}).values[("x", "sum")][0] for total in (below_half, d_prime)]
    assert units == [0, 2]
    # Linf = ceil((Delta + 2E) / grid) with Delta = 1 and E = gamma_1 * 2 * 1 > 0: 2 units
    assert plan_release(spec).step("x", "sum").linf == 2 >= abs(units[1] - units[0])


@pytest.mark.parametrize(
    ("aggregate", "component", "linf"),
    [
        pytest.param({"bounds": [0, 1]}, "sum", 1, id="sum [0, 1] grid 1: 1"),
        pytest.param({"bounds": [0, 0.1], "grid": 0.01}, "sum", 10, id="sum [0, 0.1] grid 0.01: 10"),
        pytest.param({"bounds": [-3, 2], "contribution": {"max_contributions_per_partition": 2}}, "sum", 6,
                     id="sum [-3, 2], 2 per partition: 2 * 3"),
        pytest.param({"kind": "mean", "bounds": [1, 99]}, "sum", 49, id="mean [1, 99]: half range 49"),
        pytest.param({"kind": "variance", "bounds": [1, 99]}, "sum_squares", 49**2, id="variance [1, 99]: 49^2"),
    ],
)
def test_the_exact_path_keeps_todays_linf(aggregate, component, linf):
    """Exact upstream sums (integers, Decimal, Fraction) carry no float error: Linf = ceil(c * D / grid)
    (docs/mechanisms.md), with or without a declared row bound."""
    assert plan_release(spec_of(**aggregate)).step("x", component).linf == linf
    bounded = spec_of(**aggregate, upstream={"arithmetic": "exact", "max_rows": 10**6})
    assert plan_release(bounded).step("x", component).linf == linf


def test_a_decimal_bound_adds_the_gap_to_its_double_under_binary64():
    """An upstream clipping at 0.1 in binary64 clips at 0.1000000000000000055..., above the declared bound: with
    one row (E = 0) the widened bound alone moves Linf from exactly 10 grid units to 11."""
    spec = spec_of(bounds=[0, 0.1], grid=0.01, upstream=binary64(1))
    assert Fraction(0.1) > Fraction(1, 10)
    assert plan_release(spec).step("x", "sum").linf == 11
    exactly_representable = spec_of(bounds=[0, 0.5], grid=0.125, upstream=binary64(1))
    assert plan_release(exactly_representable).step("x", "sum").linf == 4


def test_sums_near_2_to_the_54_are_refused():
    """Doubles near 2^54 are 4 apart: a float sum there moves in steps of 4, so with sensitivity 1 one unit can
    move it 4 grid units (or none). Bounds [0, 1] cannot reach 2^54 with the at most 10^15 rows a spec may
    declare; declaring more is refused at load, and at 10^15 rows the summation error alone is far beyond the
    sensitivity. With bounds [0, 2^20] and 2^34 rows (totals up to 2^54) the float cannot carry grid 1."""
    assert math.ulp(2.0**54) == 4.0 and 2.0**54 + 1.0 == 2.0**54 and 2.0**54 + 3.0 == 2.0**54 + 4.0
    with pytest.raises(SpecError, match="max_rows"):
        parse_spec(json.dumps({"version": 1, "release": "r", "budget_account": "a", "privacy_unit": "p",
                               "aggregates": [{"name": "x", "kind": "sum", "bounds": [0, 1],
                                               "mechanism": "discrete_laplace", "budget": {"epsilon": 1},
                                               "upstream": binary64(2**54)}]}))
    with pytest.raises(ReleaseConfigError, match=r"aggregate 'x' \(sum\).*exceeds the sensitivity.*max_rows"):
        plan_release(spec_of(upstream=binary64(10**15)))
    with pytest.raises(ReleaseConfigError, match=r"cannot carry grid 1: .* consecutive doubles are 4 apart"):
        plan_release(spec_of(bounds=[0, 2**20], upstream=binary64(2**34)))


TIMESTAMP = 1_700_000_000_000  # 2023-11-14 in milliseconds since the epoch; a multiple of 32
DAY = 86_400_000


def adversarial_timestamp_orders(rows: int) -> tuple[list[int], list[int]]:
    """Half the rows at t0 + 47 (15 mod 32), half at t0 + 49 (17 mod 32). Once a left-to-right float sum passes
    2^57 doubles are 32 apart: adding 15 mod 32 rounds down by 15, adding 17 mod 32 rounds up by 15. Adding the
    15s last drifts the sum down, adding the 17s last drifts it up: same rows, different orders."""
    low, high = [TIMESTAMP + 47] * (rows // 2), [TIMESTAMP + 49] * (rows // 2)
    return high + low, low + high


def test_millisecond_timestamp_sums_drift_beyond_nine_times_todays_plan_and_such_specs_are_refused():
    """A mean of event times within [t0, t0 + 1000] ms, grid 1 ms: today's plan charges Linf = 500 (the half
    range) for the centred sum. Neighbours D (summed drifting down) and D' = D + {t0} (summed drifting up) land
    far more than 9 * 500 grid units apart. The binary64 plan refuses the spec: sums of 1e5 timestamps (1.7e17)
    are held in doubles 32 ms apart, coarser than the grid; and even on a 32 ms grid, 2E is thousands of times
    the sensitivity."""
    rows = 100_000
    aggregate = {"kind": "mean", "bounds": [TIMESTAMP, TIMESTAMP + 1000]}
    assert plan_release(spec_of(**aggregate)).step("x", "sum").linf == 500
    drifting_down, drifting_up = adversarial_timestamp_orders(rows)
    spec = spec_of(**aggregate, upstream=binary64(rows + 1))
    neighbour = {"sum": left_to_right([TIMESTAMP] + drifting_up), "count": rows + 1}
    original = {"sum": left_to_right(drifting_down), "count": rows}
    assert math.fsum(drifting_down) == sum(drifting_down)  # fsum is exact here: the drift is the loop's
    units = [prepare_inputs(spec, {"x": totals}).values[("x", "sum")][0] for totals in (original, neighbour)]
    assert abs(units[1] - units[0]) > 9 * 500
    with pytest.raises(ReleaseConfigError, match="cannot carry grid 1: .* 32 apart"):
        plan_release(spec)
    with pytest.raises(ReleaseConfigError, match=r"exceeds the sensitivity.*Lower upstream.max_rows \(at most \d+"):
        plan_release(spec_of(**aggregate, grid=32, upstream=binary64(rows + 1)))


def test_timestamp_sums_over_a_day_are_accepted_with_an_allowance_that_covers_adversarial_neighbours():
    """Event times within one day on a 32 ms grid (the spacing of doubles at 1e5 timestamps): half range
    h = 43,200,000 ms, today's Linf = h / 32. Neighbours D (drifting down) and D' = D + {t0 + day} (drifting up)
    are more than h / 32 grid units apart, and within the binary64 plan's Linf = ceil((h + 2 E) / 32),
    E = gamma_{n-1} n (t0 + day) for n = max_rows (Higham 2002, section 4.2)."""
    rows, grid = 100_000, 32
    aggregate = {"kind": "mean", "bounds": [TIMESTAMP, TIMESTAMP + DAY], "grid": grid}
    half = DAY // 2
    assert plan_release(spec_of(**aggregate)).step("x", "sum").linf == half // grid
    spec = spec_of(**aggregate, upstream=binary64(rows + 1))
    expected = math.ceil((half + 2 * gamma(rows) * (rows + 1) * (TIMESTAMP + DAY)) / grid)
    step = plan_release(spec).step("x", "sum")
    assert step.linf == expected
    drifting_down, drifting_up = adversarial_timestamp_orders(rows)
    original = {"sum": left_to_right(drifting_down), "count": rows}
    neighbour = {"sum": left_to_right(drifting_up + [TIMESTAMP + DAY]), "count": rows + 1}
    units = [prepare_inputs(spec, {"x": totals}).values[("x", "sum")][0] for totals in (original, neighbour)]
    assert half // grid < units[1] - units[0] <= step.linf


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled", "numpy pairwise", "fsum"])
@pytest.mark.parametrize(
    ("kind", "grid", "component"),
    [
        pytest.param("mean", Fraction(1, 10**12), "sum", id="mean sum, grid 1e-12"),
        pytest.param("variance", Fraction(1, 10**6), "sum_squares", id="centred sum of squares, grid 1e-6"),
    ],
)
def test_the_summation_error_bound_holds_for_every_order(order, kind, grid, component):
    """Values in [0, 0.1] summed in several orders: the engine's value before rounding is within the bound of the
    true sum of the same doubles, so the rounded integer is within bound + 1/2 grid units of the truth. The grids
    are fine enough that the float error is many grid units: ignoring it would fail."""
    rng = np.random.default_rng(2024)
    rows = 20_000
    values = np.minimum(rng.random(rows) * 0.11, 0.1)
    arranged = {"ascending": np.sort(values), "descending": np.sort(values)[::-1],
                "shuffled": rng.permutation(values), "numpy pairwise": values, "fsum": values}[order]
    squares = arranged * arranged
    if order == "numpy pairwise":
        total, total_squares = float(np.sum(arranged)), float(np.sum(squares))
    elif order == "fsum":
        total, total_squares = math.fsum(arranged), math.fsum(squares)
    else:
        total, total_squares = left_to_right(arranged), left_to_right(squares)
    spec = spec_of(kind=kind, bounds=[0, 0.1], grid=str(grid), upstream=binary64(rows))
    upstream = {"sum": total, "count": rows} | ({"sum_squares": total_squares} if kind == "variance" else {})
    engine = prepare_inputs(spec, {"x": upstream}).values[("x", component)][0]
    middle = Fraction(1, 20)
    true_sum = sum(Fraction(v) for v in values)
    if component == "sum":
        truth, resolution = true_sum - middle * rows, grid
    else:
        truth = sum(Fraction(v) ** 2 for v in values) - 2 * middle * true_sum + middle**2 * rows
        resolution = grid**2
    bound = plan_release(spec).step("x", component).bound
    assert abs(engine - truth / resolution) <= bound.interval_error / resolution + Fraction(1, 2)


def test_binary64_is_refused_where_the_float_cannot_carry_the_grid():
    """Bounds [0, 1e6], grid 1e-6 and 5e6 rows: totals up to 5e12, where doubles are 2^-10 apart, 977 grid steps."""
    spec = spec_of(bounds=[0, 10**6], grid="1e-6", upstream=binary64(5 * 10**6))
    with pytest.raises(ReleaseConfigError) as refused:
        plan_release(spec)
    assert "cannot carry grid 1e-06" in str(refused.value)
    assert f"{2.0**-10:.6g} apart" in str(refused.value) and "Make grid at least" in str(refused.value)


# -- item 3: saturation refused at plan time ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("aggregate", "refused"),
    [
        pytest.param({"bounds": [0, 10**6], "grid": "1e-6", "upstream": {"max_rows": 5 * 10**6}}, True,
                     id="5e12 in grid 1e-6 = 5e18 units > 2^62: refused"),
        pytest.param({"bounds": [0, 10**6], "grid": "1e-6", "upstream": {"max_rows": 4 * 10**6}}, False,
                     id="4e12 in grid 1e-6 = 4e18 units < 2^62: accepted"),
        pytest.param({"bounds": [0, 10**6], "grid": "1e-6"}, False,
                     id="no row bound: accepted, marked at publication if reached"),
        pytest.param({"kind": "variance", "bounds": [0, 2000], "grid": "1e-3", "upstream": {"max_rows": 5 * 10**6}},
                     True, id="variance: centred squares 1000^2 * 5e6 / 1e-6 = 5e18 grid^2 units: refused"),
        pytest.param({"kind": "mean", "bounds": [0, 2000], "grid": "1e-9", "upstream": {"max_rows": 5 * 10**6}},
                     True, id="mean: centred sum 1000 * 5e6 / 1e-9 = 5e18 units: refused"),
    ],
)
def test_values_that_can_reach_the_saturation_limit_are_refused_at_plan_time(aggregate, refused):
    spec = spec_of(**aggregate)
    if not refused:
        plan_release(spec)
        return
    with pytest.raises(ReleaseConfigError, match=r"aggregate 'x' .*saturation limit of 2\^62.*Make grid at least"):
        plan_release(spec)


def test_plan_time_refusals_come_before_any_budget_is_reserved(tmp_path):
    ledger = make_ledger(tmp_path / "refused.db", accountant="pure_dp", cap="5")
    spec = spec_of(upstream=binary64(10**15))
    key = ReleaseKey(dag_id="adult_census_release", run_id="r", task_id="t", map_index=-1, release_name="plan")
    with pytest.raises(ReleaseConfigError):
        run_release(spec, {"x": 0.5}, ledger, key, spec_hash="0" * 64)
    assert list(ledger.charges()) == [] and ledger.account("census_adult").spent == 0


# -- item 6: L0 capped by the number of partitions ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("aggregate", "l0"),
    [
        pytest.param({"group_by": ["k"], "keys": {"k": ["a", "b"]}}, 2, id="two public keys: L0 5 -> 2"),
        pytest.param({}, 1, id="ungrouped: one partition"),
        pytest.param({"group_by": ["k"], "keys": {"k": list("abcdefg")}}, 5, id="seven keys: L0 5 stands"),
        pytest.param({"group_by": ["k"], "partition_selection": {"budget": {"epsilon": 1, "delta": 1e-6}}}, 5,
                     id="partition selection: L0 as declared"),
    ],
)
def test_l0_is_capped_by_the_number_of_partitions(aggregate, l0):
    """One privacy unit touches at most as many partitions as exist: L1 = min(L0, n) * Linf, so the discrete
    Laplace scale is min(L0, n) / epsilon (today 5 / epsilon on two keys: 5/2 times too much noise)."""
    spec = spec_of(kind="count", contribution={"max_partitions_contributed": 5}, **aggregate)
    step = plan_release(spec).step("x", "count")
    assert step.l0 == l0 and step.scale == l0
    described = step.describe()
    assert described["max_partitions_contributed"] == l0
    assert described.get("max_partitions_contributed_declared", 5) == 5


def test_a_capped_l0_also_calibrates_the_gaussian():
    capped = spec_of(kind="count", group_by=["k"], keys={"k": ["a", "b"]}, mechanism="discrete_gaussian",
                     budget={"rho": 1}, contribution={"max_partitions_contributed": 5})
    assert plan_release(capped).step("x", "count").scale == Fraction(2, 2)  # L2^2 = 2, sigma^2 = 2 / (2 rho)


# -- item 7: auto chooses by the cost on the account -------------------------------------------------------------
def one_count(budget: dict, keys: int = 1) -> ReleaseSpec:
    grouping = {"group_by": ["k"], "keys": {"k": list(range(keys))},
                "contribution": {"max_partitions_contributed": keys}} if keys > 1 else {}
    return spec_of(kind="count", mechanism="auto", budget=budget, **grouping)


def test_auto_on_a_zcdp_account_picks_the_gaussian_for_an_epsilon_delta_budget():
    """(epsilon 1, delta 1e-6) on one count: Laplace is charged its pure epsilon's zCDP conversion (0.46 with the
    tight conversion, 0.5 by epsilon^2 / 2), the exact Gaussian rho = 1 / (2 sigma^2) with sigma close to the
    analytic Gaussian's 4.2308 (Balle & Wang 2018): about 0.0279, 16 times less."""
    spec = one_count({"epsilon": 1, "delta": 1e-6})
    laplace_charge = charge_in_account_unit(PrivacyLoss("epsilon", Fraction(1)), "zcdp")
    written = plan_release(spec)
    assert written.steps[0].mechanism == "discrete_laplace" and written.charge("zcdp") == laplace_charge
    on_zcdp = plan_release(spec, accountant="zcdp")
    sigma = analytic_gaussian_sigma(1.0, 1e-6, 1.0)
    assert on_zcdp.steps[0].mechanism == "discrete_gaussian"
    assert float(on_zcdp.charge()) == pytest.approx(1 / (2 * sigma**2), rel=3e-3)
    assert laplace_charge / on_zcdp.charge() > 15
    assert discrete_gaussian_delta(on_zcdp.steps[0].scale, 1) <= 1e-6  # still within the written budget


def test_auto_on_an_approx_dp_account_compares_variance_within_the_written_budget():
    """On approx_dp both candidates are within the written (epsilon, delta), epsilon is charged either way: the
    smaller variance wins (Laplace std 1.357 against the Gaussian's 4.23 for one value)."""
    plan = plan_release(one_count({"epsilon": 1, "delta": 1e-6}), accountant="approx_dp")
    assert plan.steps[0].mechanism == "discrete_laplace"
    assert (plan.charge(), plan.delta()) == (1, 0)
    assert plan_release(one_count({"epsilon": 1, "delta": 1e-6}, keys=50), accountant="approx_dp").steps[
        0].mechanism == "discrete_gaussian"


@pytest.mark.parametrize(
    ("budget", "accountant"),
    [
        pytest.param({"epsilon": 1, "delta": 1e-6}, "pure_dp", id="epsilon-delta on pure_dp"),
        pytest.param({"rho": Fraction(1, 2)}, "approx_dp", id="rho on approx_dp"),
    ],
)
def test_auto_never_picks_a_mechanism_the_account_cannot_be_charged_for(budget, accountant):
    """For 50 values the Gaussian has the smaller variance, but a pure_dp account cannot be charged an
    (epsilon, delta > 0) loss, and an approx_dp account cannot be charged a rho without a delta: today's plan is
    refused, the account-aware plan picks the Laplace."""
    spec = one_count(budget, keys=50)
    with pytest.raises(IncompatibleAccountantError):
        plan_release(spec).charge(accountant)
    plan = plan_release(spec, accountant=accountant)
    assert plan.steps[0].mechanism == "discrete_laplace" and plan.charge() > 0


@pytest.mark.parametrize("keys", [pytest.param(1, id="one value"), pytest.param(50, id="50 values")])
def test_auto_with_a_rho_budget_on_a_zcdp_account_charges_the_written_rho(keys):
    """A {rho} budget is written in the zCDP account's unit: every candidate costs at most rho, and the smaller
    variance wins: the Gaussian (variance 1 / (2 rho) per unit of L2^2 against the Laplace's ~1 / rho), charged
    exactly the written rho, not shaved to the Laplace's rounded-down conversion."""
    plan = plan_release(one_count({"rho": Fraction(1, 2)}, keys=keys), accountant="zcdp")
    assert plan.steps[0].mechanism == "discrete_gaussian" and plan.charge() == Fraction(1, 2)


def test_auto_recalibrates_the_dearer_candidate_to_the_cheaper_ones_cost():
    """(epsilon 0.1, delta 0.01) on zCDP: the Laplace costs its conversion of 0.1 (about 0.005), the Gaussian at
    the written budget a little more (sigma^2 near 91). Recalibrated to the Laplace's cost the Gaussian has
    sigma^2 = 1 / (2 C), about 100, still within (0.1, 0.01), and half the Laplace's variance 2 / 0.1^2 = 200:
    it wins at the Laplace's cost."""
    plan = plan_release(one_count({"epsilon": Fraction(1, 10), "delta": Fraction(1, 100)}), accountant="zcdp")
    step = plan.steps[0]
    laplace_cost = charge_in_account_unit(PrivacyLoss("epsilon", Fraction(1, 10)), "zcdp")
    assert step.mechanism == "discrete_gaussian"
    assert plan.charge() <= laplace_cost
    assert step.scale == 1 / (2 * laplace_cost)
    assert discrete_gaussian_delta(step.scale, Fraction(1, 10)) <= 0.01
    assert discrete_gaussian_variance(step.scale) < discrete_laplace_variance(10)


def test_a_zcdp_release_is_charged_the_cheaper_gaussian(tmp_path):
    ledger = make_ledger(tmp_path / "z.db", cap="1")
    spec = one_count({"epsilon": 1, "delta": 1e-6})
    key = ReleaseKey(dag_id="adult_census_release", run_id="r", task_id="t", map_index=-1, release_name="plan")
    output = run_release(spec, {"x": 10}, ledger, key, spec_hash="0" * 64).output
    assert output["mechanisms"][0]["mechanism"] == "discrete_gaussian"
    assert ledger.account("census_adult").spent == plan_release(spec, accountant="zcdp").charge() < Fraction(3, 100)


# -- describe(): public, and records the allowance -----------------------------------------------------------------
def test_the_description_is_data_free_and_records_the_allowance(tmp_path):
    """The description recorded in the ledger and published depends on the spec only: identical for neighbouring
    inputs; for binary64 it carries the declared arithmetic, the row bound, E = gamma_{n-1} n M and the grid units
    it adds to Linf."""
    spec = spec_of(bounds=[0, 10], grid="1/4", upstream=binary64(1000),
                   group_by=["k"], keys={"k": ["a", "b"]}, contribution={"max_partitions_contributed": 3})
    described = plan_release(spec).step("x", "sum").describe()
    error = gamma(999) * 1000 * 10
    assert described["upstream"] == {
        "arithmetic": "binary64", "max_rows": 1000, "summation_error": float(error),
        "summation_error_exact": str(error), "linf_allowance_grid_units": 41 - 40,
    }
    assert described["linf_grid_units"] == math.ceil((10 + 2 * error) * 4) == 41
    assert described["max_partitions_contributed"] == 2 and described["max_partitions_contributed_declared"] == 3
    assert described["half_width_allowance"] == pytest.approx(float(Fraction(1, 8) + error))
    json.dumps(described, allow_nan=False)
    outputs = []
    for run, rows in enumerate(([{"k": "a", "sum": 3.5}], [{"k": "a", "sum": 3.5}, {"k": "b", "sum": 9.75}])):
        ledger = make_ledger(tmp_path / f"d{run}.db", accountant="pure_dp", cap="10")
        key = ReleaseKey(dag_id="adult_census_release", run_id="r", task_id="t", map_index=-1, release_name="plan")
        outputs.append(run_release(spec, {"x": rows}, ledger, key, spec_hash="0" * 64).output)
    assert outputs[0]["mechanisms"] == outputs[1]["mechanisms"]


def test_an_exact_decimal_upstream_is_described_as_exact():
    described = plan_release(spec_of(upstream={"max_rows": 10})).step("x", "sum").describe()
    assert described["upstream"] == {"arithmetic": "exact", "max_rows": 10}
    assert prepare_inputs(spec_of(), {"x": Decimal("0.5")}).values[("x", "sum")] == [1]  # floor(0.5 + 1/2)


def test_an_incompatible_accountant_error_names_the_aggregate():
    """A spec with several aggregates: the refusal must say which one cannot be charged to the account."""
    from dp_operators.accounting import IncompatibleAccountantError
    from dp_operators.spec import ReleaseSpec

    spec = ReleaseSpec.model_validate({"version": 1, "release": "r", "budget_account": "a", "privacy_unit": "person",
                                       "aggregates": [
                                           {"name": "fine", "kind": "count", "mechanism": "discrete_laplace",
                                            "budget": {"epsilon": 1}},
                                           {"name": "zcdp_only", "kind": "count", "mechanism": "discrete_gaussian",
                                            "budget": {"rho": "0.01"}}]})
    with pytest.raises(IncompatibleAccountantError, match=r"aggregate 'zcdp_only' \(count, discrete_gaussian\)"):
        plan_release(spec).charge("approx_dp")


# -- item 5: noise beyond the engine's value range is refused at plan time ----------------------------------------
def selected_sum(bounds, budget: dict, l0: int, mechanism: str = "discrete_laplace", grid=1) -> ReleaseSpec:
    """A sum under partition selection (L0 is not capped by a key domain there)."""
    return spec_of(bounds=bounds, grid=grid, mechanism=mechanism, budget=budget, group_by=["k"],
                   partition_selection={"budget": {"epsilon": 1, "delta": 1e-6}},
                   contribution={"max_partitions_contributed": l0})


def test_a_laplace_scale_of_exactly_2_to_the_62_grid_units_is_planned_and_one_above_is_refused():
    """t = L0 Linf / epsilon = 2^13 * 2^39 / 2^-10 = 2^62 grid units, the engine's value range (SATURATION):
    representable. A smaller epsilon makes t larger than 2^62: refused before any budget, naming the aggregate,
    the component and the grid that fits."""
    at_the_range = plan_release(selected_sum([0, 2**39], {"epsilon": "0.0009765625"}, 2**13))
    assert at_the_range.step("x", "sum").scale == 2**62
    beyond = selected_sum([0, 2**39], {"epsilon": "0.0009765624"}, 2**13)
    refusal = (r"aggregate 'x' \(sum\): its discrete_laplace noise would have scale 4\.61e\+18 grid units, "
               r"beyond .* 2\^62.*make grid at least 1\.1")
    with pytest.raises(ReleaseConfigError, match=refusal):
        plan_release(beyond)


def test_a_gaussian_beyond_2_to_the_62_grid_units_is_refused_and_the_suggested_grid_plans():
    """{epsilon 1e-4, delta 1e-300} on a sum of [0, 1e12] at L0 10^4: sigma is about sqrt(L0) Linf
    sqrt(2 ln(1/delta)) / epsilon = 100 * 1e12 * 37 / 1e-4 = 3.7e19 grid units, 8 times 2^62. With the suggested
    grid the noise (in value units, the same) fits."""
    spec = selected_sum([0, 10**12], {"epsilon": 1e-4, "delta": 1e-300}, 10**4, mechanism="discrete_gaussian")
    with pytest.raises(ReleaseConfigError, match=r"aggregate 'x' \(sum\): its discrete_gaussian noise would have "
                                                 r"sigma 3\.\d+e\+19 grid units") as refused:
        plan_release(spec)
    grid = float(str(refused.value).split("make grid at least ")[1].split(";")[0])
    assert 8 <= grid <= 8.1  # 3.7e19 / 4.6e18, rounded up to two digits
    step = plan_release(selected_sum([0, 10**12], {"epsilon": 1e-4, "delta": 1e-300}, 10**4,
                                     mechanism="discrete_gaussian", grid=grid)).step("x", "sum")
    assert step.scale <= 2**124  # sigma <= 2^62


def test_unrepresentable_noise_is_refused_before_any_budget_is_reserved(tmp_path):
    ledger = make_ledger(tmp_path / "range.db", accountant="approx_dp", cap="5")
    spec = selected_sum([0, 10**12], {"epsilon": 1e-4}, 10**4)
    key = ReleaseKey(dag_id="adult_census_release", run_id="r", task_id="t", map_index=-1, release_name="plan")
    with pytest.raises(ReleaseConfigError, match=r"2\^62"):
        run_release(spec, {"x": [{"k": "a", "sum": 1}]}, ledger, key, spec_hash="0" * 64)
    assert list(ledger.charges()) == [] and ledger.account("census_adult").spent == 0


@pytest.mark.parametrize(
    "aggregate",
    [
        pytest.param({"bounds": [-3, 0.1], "grid": "0.05"}, id="sum"),
        pytest.param({"kind": "mean", "bounds": [0.1, 7], "grid": "0.3"}, id="mean"),
        pytest.param({"kind": "variance", "bounds": [0.1, 100], "grid": "0.25"}, id="variance"),
    ],
)
def test_the_binary64_plan_declares_the_linf_the_spec_checks(aggregate):
    """One definition of the declared Linf (Aggregate.largest_change): the binary64 plan's declared_linf is the
    load-time one, and its Linf only adds the float allowance (bounds widened to the doubles nearest them, 2E)."""
    from dp_operators.release.float_sums import component_bound

    spec = spec_of(upstream=binary64(100), contribution={"max_contributions_per_partition": 7}, **aggregate)
    checked = spec.aggregates[0].linf_grid_units(7)
    for component, linf in checked.items():
        bound = component_bound(spec.aggregates[0], component, 7)
        change, _ = spec.aggregates[0].largest_change(component)
        assert bound.declared_linf == linf and bound.declared_sensitivity == 7 * change
        assert bound.linf >= linf and bound.sensitivity >= bound.declared_sensitivity
