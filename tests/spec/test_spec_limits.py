"""Every spec number that drives sensitivity is range-checked at load, before any planning.

Without the check, ``max_contributions_per_partition: 1e300`` validated, then planning raised a raw ZeroDivisionError or
OverflowError, or ran for minutes; the same for ``max_partitions_contributed``. The limits and why they hold are in
docs/spec-reference.md ("Numeric limits"); the expected sensitivities below are worked out by hand from
Linf = ceil(max_contributions_per_partition * D / grid) (D = max(|lower|, |upper|) for a sum, half the width of the
bounds for the centred sum of a mean or variance, its square for the sum of squares; docs/adr/0010).
"""

from __future__ import annotations

import json
import math

import pytest

from dp_operators.release import ReleaseConfigError, plan_release
from dp_operators.spec import SpecError, parse_spec


def spec_text(aggregate: str, *, contribution: str = "") -> str:
    return f"""\
version: 1
release: limits
budget_account: census_adult
privacy_unit: person
{contribution}aggregates:
  - name: agg
{aggregate}"""


COUNT = """\
    kind: count
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""


def sum_of(bounds: str, grid: str, kind: str = "sum", extra: str = "") -> str:
    return f"""\
    kind: {kind}
    bounds: {bounds}
    grid: {grid}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
{extra}"""


def refusal(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="r.yaml")
    message = str(caught.value)
    assert message.startswith("r.yaml: ")
    return message


# -- contribution bounds: integers in range, at the spec level and per aggregate ---------------------------------
@pytest.mark.parametrize(
    ("field", "largest"),
    [
        pytest.param("max_partitions_contributed", 10_000, id="L0"),
        pytest.param("max_contributions_per_partition", 1_000_000, id="Linf of a count"),
    ],
)
@pytest.mark.parametrize("level", ["spec", "aggregate"])
def test_contribution_bounds_are_in_range(field, largest, level):
    def text(value: str) -> str:
        if level == "spec":
            return spec_text(COUNT, contribution=f"contribution: {{{field}: {value}}}\n")
        return spec_text(COUNT + f"    contribution: {{{field}: {value}}}\n")

    where = f"contribution.{field}" if level == "spec" else f"aggregates[0](agg).contribution.{field}"
    assert parse_spec(text(str(largest))) and parse_spec(text("1"))
    for value in (largest + 1, 0, -1, 10**400):
        message = refusal(text(str(value)))
        assert f"{where}: must be from 1 to {largest:,}" in message


@pytest.mark.parametrize(
    ("written", "got"),
    [
        pytest.param("1e300", "float 1e+300", id="1e300"),
        pytest.param("1.0e+300", "float 1e+300", id="1.0e+300"),
        pytest.param("1.5", "float 1.5", id="fractional"),
        pytest.param("3.0", "float 3.0", id="integral float is not silently taken"),
        pytest.param("1e3", "float 1000.0", id="exponent"),
        pytest.param("true", "a boolean", id="boolean"),
        pytest.param("'3'", "str '3'", id="text"),
        pytest.param(".inf", "float inf", id="infinity"),
        pytest.param(".nan", "float nan", id="NaN"),
    ],
)
@pytest.mark.parametrize("field", ["max_partitions_contributed", "max_contributions_per_partition"])
def test_contribution_bounds_refuse_non_integers_with_a_clear_message(field, written, got):
    message = refusal(spec_text(COUNT, contribution=f"contribution: {{{field}: {written}}}\n"))
    assert f"contribution.{field}: must be a whole number from 1 to" in message
    assert "written as an integer" in message and got in message


@pytest.mark.parametrize(
    ("written", "where"),
    [
        pytest.param("max_contributions_per_partition: 1e300", "max_contributions_per_partition", id="Linf 1e300"),
        pytest.param("max_partitions_contributed: 1e300", "max_partitions_contributed", id="L0 1e300"),
        pytest.param(f"max_contributions_per_partition: {10**300}", "max_contributions_per_partition",
                     id="Linf 10^300 as an integer"),
        pytest.param(f"max_partitions_contributed: {10**300}", "max_partitions_contributed",
                     id="L0 10^300 as an integer"),
    ],
)
@pytest.mark.parametrize("kind", ["count", "sum"])
def test_huge_contribution_bounds_are_spec_errors_not_raw_python_errors(written, where, kind):
    """Contribution bounds of 1e300 or 10^300 are refused at load with the field path, never a raw Python error."""
    aggregate = COUNT if kind == "count" else sum_of("[0, 10]", "1")
    message = refusal(spec_text(aggregate, contribution=f"contribution: {{{written}}}\n"))
    assert f"contribution.{where}: must be" in message


# -- bounds with grid: Linf in grid units ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("aggregate", "linf", "smallest_grid"),
    [
        # sum: ceil(1 * 10^12 / 1) = 10^12 fits; grid 1/2 gives 2 * 10^12
        pytest.param(sum_of("[0, 1000000000000]", "{grid}"), 2 * 10**12, "1", id="sum: max |bound| / grid"),
        pytest.param(sum_of("[-1000000000000, 5]", "{grid}"), 2 * 10**12, "1", id="sum: a negative bound counts"),
        # mean: centred, D = (upper - lower) / 2 = 10^12
        pytest.param(sum_of("[0, 2000000000000]", "{grid}", "mean"), 2 * 10**12, "1", id="mean: half the width"),
        # variance: the sum of squares moves by ((upper - lower)/2)^2 / grid^2: (10^6)^2 = 10^12 fits at grid 1, and
        # is 4 * 10^12 grid^2 units at grid 1/2
        pytest.param(sum_of("[0, 2000000]", "{grid}", "variance"), 4 * 10**12, "1",
                     id="variance: squares in grid^2 units"),
    ],
)
def test_per_contribution_sensitivity_in_grid_units_is_at_most_1e12(aggregate, linf, smallest_grid):
    assert parse_spec(spec_text(aggregate.replace("{grid}", "1")))
    message = refusal(spec_text(aggregate.replace("{grid}", "0.5")))
    assert "aggregates[0](agg).grid: with bounds" in message
    assert f"by up to {linf:.3g} grid" in message and "at most 1e+12 are supported" in message
    assert f"use a grid of at least {smallest_grid}," in message


def test_the_suggested_grid_loads():
    """The grid the message suggests is coarse enough (rounded up, never down)."""
    message = refusal(spec_text(sum_of("[0, 123456789012345]", "1")))
    suggested = message.split("use a grid of at least ")[1].split(",")[0]
    assert suggested == "130"  # 123456789012345 / 1e12 = 123.46..., two significant digits rounded up
    assert parse_spec(spec_text(sum_of("[0, 123456789012345]", suggested)))


def test_the_contribution_bound_that_applies_is_used():
    """Linf multiplies by the aggregate's own max_contributions_per_partition, else the spec's."""
    aggregate = sum_of("[0, 1000000]", "1")  # D / grid = 10^6, times 10^6 contributions: 10^12
    assert parse_spec(spec_text(aggregate, contribution="contribution: {max_contributions_per_partition: 1000000}\n"))
    message = refusal(spec_text(
        aggregate + "    contribution: {max_contributions_per_partition: 1000000}\n",
        contribution="contribution: {max_contributions_per_partition: 1}\n",
    ).replace("grid: 1\n", "grid: 0.5\n"))
    assert "max_contributions_per_partition 1000000 (the aggregate's contribution)" in message
    spec_level = refusal(spec_text(aggregate.replace("grid: 1\n", "grid: 0.5\n"),
                                   contribution="contribution: {max_contributions_per_partition: 1000000}\n"))
    assert "(the spec's contribution)" in spec_level


def test_every_aggregate_out_of_range_is_reported():
    text = spec_text(sum_of("[0, 1e13]", "1")) + "  - name: second\n" + sum_of("[0, 1e13]", "1", "mean")
    message = refusal(text)
    assert "invalid release spec (2 problem(s))" in message
    assert "aggregates[0](agg).grid" in message and "aggregates[1](second).grid" in message


# -- upstream.max_rows -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("written", "reason"),
    [
        pytest.param("1000000000000000", None, id="10^15 loads"),
        pytest.param("1000000000000001", "must be from 1 to 1,000,000,000,000,000", id="above 10^15"),
        pytest.param("0", "must be from 1 to", id="zero"),
        pytest.param("1e6", "got float 1000000.0", id="float"),
        pytest.param("1.5", "got float 1.5", id="fractional"),
    ],
)
def test_max_rows_is_an_integer_in_range(written, reason):
    text = spec_text(sum_of("[0, 10]", "1", extra=f"    upstream: {{arithmetic: binary64, max_rows: {written}}}\n"))
    if reason is None:
        assert parse_spec(text).aggregates[0].upstream.max_rows == 10**15
        return
    message = refusal(text)
    assert "aggregates[0](agg).upstream.max_rows: must be" in message and reason in message


# -- budgets ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("budget", "where", "reason"),
    [
        pytest.param("{epsilon: 0.00009}", "budget.epsilon", "between 0.0001 and 100", id="epsilon below 1e-4"),
        pytest.param("{epsilon: 101}", "budget.epsilon", "between 0.0001 and 100", id="epsilon above 100"),
        pytest.param("{epsilon: 1e12}", "budget.epsilon", "between 0.0001 and 100", id="epsilon 1e12"),
        pytest.param("{rho: 9.0e-10}", "budget.rho", "between 1e-09 and 5000", id="rho below 1e-9"),
        pytest.param("{rho: 5001}", "budget.rho", "between 1e-09 and 5000", id="rho above 5000"),
    ],
)
def test_budgets_are_in_range(budget, where, reason):
    aggregate = COUNT.replace("budget: {epsilon: 1}", f"budget: {budget}").replace("discrete_laplace", "auto")
    message = refusal(spec_text(aggregate))
    assert f"aggregates[0](agg).{where}: must be {reason}" in message


# -- planning at the limits: no raw Python error, only plain finite numbers ---------------------------------------
# Linf at its limit for every component kind (10^12 grid units; a count's 10^6 contributions); L0 at its limit of 10^4
# under partition selection, where the number of partitions does not cap it.
AT_THE_LIMITS = {
    "count": ("    kind: count\n", 1_000_000),
    "sum": ("    kind: sum\n    bounds: [0, 1000000000000]\n", 1),
    "mean": ("    kind: mean\n    bounds: [-1000000000000, 1000000000000]\n", 1),
    "variance": ("    kind: variance\n    bounds: [0, 2000000]\n", 1),
}
FORMS = {
    "laplace epsilon": ("discrete_laplace", "{epsilon: 1}"),
    "laplace smallest epsilon": ("discrete_laplace", "{epsilon: 0.0001}"),
    "gaussian rho": ("discrete_gaussian", "{rho: 0.5}"),
    "gaussian smallest rho": ("discrete_gaussian", "{rho: 1.0e-9}"),
    "gaussian epsilon delta": ("discrete_gaussian", "{epsilon: 1, delta: 1e-6}"),
    "gaussian smallest epsilon delta": ("discrete_gaussian", "{epsilon: 0.0001, delta: 1.0e-300}"),
    "auto smallest rho": ("auto", "{rho: 1.0e-9}"),
    "auto smallest epsilon delta": ("auto", "{epsilon: 0.0001, delta: 1.0e-300}"),
    "auto rho": ("auto", "{rho: 0.5}"),
    "auto epsilon delta": ("auto", "{epsilon: 1, delta: 1e-6}"),
}


def plan_at_the_limits(kind: str, form: str, grouping: str, accountant: str | None):
    text, per_partition = AT_THE_LIMITS[kind]
    mechanism, budget = FORMS[form]
    if grouping == "selection":
        text += "    group_by: [city]\n    partition_selection: {budget: {epsilon: 1, delta: 1e-6}}\n"
    spec = parse_spec(spec_text(text + f"    mechanism: {mechanism}\n    budget: {budget}\n", contribution=(
        f"contribution: {{max_partitions_contributed: 10000, max_contributions_per_partition: {per_partition}}}\n"
    )))
    return spec, plan_release(spec, accountant)


def assert_plain_finite(spec, plan, accountant: str | None) -> None:
    for step in plan.steps:
        assert step.linf <= 10**12
        numbers = [step.half_width(1 - spec.confidence), step.standard_deviation]
        assert all(isinstance(n, float) and math.isfinite(n) for n in numbers)
        json.dumps(step.describe(), allow_nan=False)
    if accountant is not None:
        assert plan.charge(accountant) > 0


@pytest.mark.parametrize(
    ("kind", "form", "accountant"),
    [
        pytest.param(kind, form, accountant, id=f"{kind}-{form}-{accountant}")
        for kind in AT_THE_LIMITS for form in FORMS for accountant in ("zcdp", "approx_dp")
        if not (accountant == "approx_dp" and "rho" in form)  # rho cannot be charged to approx_dp
    ],
)
def test_planning_ungrouped_aggregates_at_the_limits_gives_plain_finite_numbers(kind, form, accountant):
    spec, plan = plan_at_the_limits(kind, form, "ungrouped", accountant)
    assert_plain_finite(spec, plan, accountant)


@pytest.mark.parametrize("form", ["laplace epsilon", "laplace smallest epsilon", "gaussian rho",
                                  "gaussian smallest rho", "auto rho"])
@pytest.mark.parametrize("kind", AT_THE_LIMITS)
def test_planning_at_the_largest_l0_gives_plain_finite_numbers(kind, form):
    """Under partition selection (charged as (epsilon, delta), so on approx_dp accounts) L0 is not capped. The
    {epsilon, delta} Gaussian forms are left out: their exact-profile calibration is slow at L0 = 10^4 whatever
    the other numbers (docs/adr/0019, "What the limits do not cover")."""
    if kind != "count" and form == "laplace smallest epsilon":
        # scale L0 Linf / epsilon >= 10^4 * 10^12 / 10^-4 = 10^20 grid units, beyond the engine's 2^62: refused
        # at plan time, before any budget (release/plan.py, check_noise_scale)
        with pytest.raises(ReleaseConfigError, match=r"aggregate 'agg' .* 2\^62"):
            plan_at_the_limits(kind, form, "selection", None)
        return
    spec, plan = plan_at_the_limits(kind, form, "selection", None)
    assert all(step.l0 == 10_000 for step in plan.steps)
    assert_plain_finite(spec, plan, "approx_dp" if "epsilon" in form else None)


@pytest.mark.parametrize(
    ("mechanism", "budget"),
    [
        *(pytest.param("discrete_laplace", budget, id=f"laplace {budget}") for budget in
          ("{epsilon: 1, delta: 1e-6}", "{epsilon: 100, delta: 0.5}", "{epsilon: 0.0001, delta: 1.0e-300}")),
        pytest.param("discrete_gaussian", "{epsilon: 100, delta: 0.5}", id="gaussian (100, 0.5)"),
        pytest.param("discrete_gaussian", "{epsilon: 1, delta: 1.0e-300}", id="gaussian (1, 1e-300)"),
        # about 6 s: the exact-profile calibration's FFT at L0 = 10^4 (docs/adr/0019)
        pytest.param("discrete_gaussian", "{epsilon: 1, delta: 1e-6}", id="gaussian (1, 1e-6)",
                     marks=pytest.mark.slow),
    ],
)
def test_partition_selection_at_the_largest_l0_plans(mechanism, budget):
    aggregate = (
        "    kind: count\n    group_by: [city]\n"
        f"    partition_selection: {{mechanism: {mechanism}, budget: {budget}}}\n"
        "    mechanism: discrete_laplace\n    budget: {epsilon: 1}\n"
    )
    spec = parse_spec(spec_text(aggregate, contribution="contribution: {max_partitions_contributed: 10000}\n"))
    selection = plan_release(spec).step("agg", "selection")
    assert selection.l0 == 10_000 and selection.threshold >= 1
    assert 0 < selection.delta <= spec.aggregates[0].partition_selection.budget.delta


@pytest.mark.parametrize(
    "aggregate",
    [
        pytest.param(COUNT, id="count"),
        pytest.param(sum_of("[-3, 7]", "0.5"), id="sum"),
        pytest.param(sum_of("[-3, 7]", "0.3", "mean"), id="mean"),
        pytest.param(sum_of("[1, 100]", "0.25", "variance"), id="variance"),
    ],
)
def test_the_load_time_sensitivity_is_the_one_the_plan_uses(aggregate):
    """The limit is checked on the same Linf the exact path plans (one definition, checked in two places)."""
    from dp_operators.release.float_sums import component_bound

    spec = parse_spec(spec_text(aggregate, contribution="contribution: {max_contributions_per_partition: 7}\n"))
    checked = spec.aggregates[0].linf_grid_units(7)
    planned = {c: component_bound(spec.aggregates[0], c, 7).declared_linf for c in spec.aggregates[0].components}
    assert checked == planned
    if "variance" in aggregate:  # by hand: h = 49.5, ceil(7 * 49.5 / 0.25) = 1386, ceil(7 * 49.5^2 / 0.0625) = 274428
        assert checked == {"sum": 1386, "count": 7, "sum_squares": 274428}
