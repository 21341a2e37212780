"""Reading upstream values: unit counts rounded down under partition selection, binary float sums refused or
read exactly, and no data-derived number in logs or exception texts on neighbouring inputs."""

from __future__ import annotations

import copy
import math
from decimal import Decimal
from fractions import Fraction

import pytest

from dp_operators.release import ReleaseInputError, plan_release, prepare_inputs
from dp_operators.release.upstream_types import FLOAT_SUM_ADVICE


def selection_units(spec, rows) -> dict:
    prepared = prepare_inputs(spec, {"x": rows})
    keys = prepared.keys["x"]
    return {key[0]: units for key, units in zip(keys, prepared.values[("x", "selection")])}


@pytest.mark.parametrize(("reported", "floored"), [
    pytest.param(37.5, 37, id="37.5 -> 37, never 38"),
    pytest.param(Decimal("37.5"), 37, id="Decimal 37.5 -> 37"),
    pytest.param(Fraction(75, 2), 37, id="Fraction 75/2 -> 37"),
    pytest.param(1.5, 1, id="a single unit's key reported as 1.5 stays 1"),
    pytest.param(0.9999999999999999, 0, id="just below 1 -> 0"),
    pytest.param(37, 37, id="an integer is unchanged"),
    pytest.param(-2.5, 0, id="negative -> 0"),
])
def test_unit_counts_under_partition_selection_are_rounded_down(reported, floored, build_spec):
    """The threshold's delta bounds P[1 + Z >= threshold] for a key only one privacy unit holds. A unit count in
    [1, 2) must therefore reach the comparison as 1: rounding 1.5 up to 2 would release such a key with
    P[2 + Z >= threshold], more than the planned delta. Flooring never exceeds the true count."""
    spec = build_spec("sum", selection=True)
    assert selection_units(spec, [{"k": "a", "sum": 1, "units": reported}]) == {"a": floored}


def test_a_count_that_is_its_own_unit_count_is_rounded_to_nearest_as_a_value_and_down_as_a_unit_count(build_spec):
    """A count with one contribution per partition is both the noised value (rounded to nearest, as every count)
    and the unit count compared with the threshold (rounded down)."""
    spec = build_spec(selection=True)
    prepared = prepare_inputs(spec, {"x": [{"k": "a", "count": 37.5}]})
    assert prepared.values[("x", "count")] == [38]
    assert prepared.values[("x", "selection")] == [37]


def test_rounded_down_unit_counts_keep_the_thresholds_delta(build_spec):
    """Numerically: with discrete Laplace scale 1 and threshold T, a key of 1 unit is released with probability
    P[Z >= T - 1] <= delta; reporting it as 1.5 must not raise that to P[Z >= T - 2]."""
    spec = build_spec(selection=True)
    step = plan_release(spec).step("x", "selection")
    units = selection_units(spec, [{"k": "lonely", "count": 1.5}])["lonely"]
    t = step.scale  # P[Z >= m] = exp(-m / t) / (1 + exp(-1 / t)) for m >= 1 (discrete Laplace, CKS 2020)

    def tail(m: int) -> float:
        return math.exp(-m / float(t)) / (1 + math.exp(-1 / float(t)))

    assert units == 1
    assert tail(step.threshold - units) <= 1e-6 < tail(step.threshold - 2)


@pytest.mark.parametrize("total", [
    pytest.param(0.49999999999999994, id="0.49999999999999994 (rounds to 0)"),
    pytest.param(1.5, id="1.5 (rounds to 2)"),
])
def test_float_neighbours_two_grid_units_apart_are_refused_alike_under_exact_arithmetic(total, build_spec, observe):
    """Casacuberta et al. (CCS 2022): bounds [0, 1], grid 1, neighbouring float sums 0.49999999999999994 and 1.5
    are 2 grid units apart when 1 is planned. Under the default exact arithmetic both are refused before any
    reservation, with the same text: the refusal depends on the type only."""
    spec = build_spec("sum", bounds=[0, 1], grid=1)
    error, records, charges, _ = observe(spec, {"x": [{"k": "a", "sum": total}]})
    assert error == (
        "ReleaseInputError: aggregate 'x': a row's field 'sum' holds a float but upstream.arithmetic is 'exact': "
        + FLOAT_SUM_ADVICE
    )
    assert records == [] and charges == []


def test_the_missing_aggregate_message_names_only_spec_names(build_spec):
    """An upstream may key its mapping by data; the refusal names what the spec wants, not what was given."""
    with pytest.raises(ReleaseInputError) as refused:
        prepare_inputs(build_spec(), {"Oslo": 3, "Bergen": 4})
    assert str(refused.value) == (
        "the upstream task did not provide ['x']; return a mapping with one entry per aggregate in the spec"
    )


# -- neighbouring inputs: the same logs, exception texts and non-noise outputs ---------------------------------------
KINDS = {
    "count": {"count": 40},
    "sum": {"sum": 7, "units": 40},
    "mean": {"sum": Decimal("12.5"), "count": 40, "units": 40},
    "variance": {"sum": 12, "count": 40, "sum_squares": Decimal("30.5"), "units": 40},
}
#: (name, spec extras, the row one more person adds)
NEIGHBOURS = [
    pytest.param({}, {"k": "unlisted"}, id="a row outside the public domain"),
    pytest.param({}, {"k": None}, id="a NULL key"),
    pytest.param({}, {"k": "b", "__value__": None}, id="a None value (replace)"),
    pytest.param({"non_finite": {"nan": "drop"}}, {"k": "b", "__value__": Decimal("NaN")}, id="a NaN value (drop)"),
    pytest.param({"non_finite": {"infinity": "clamp"}}, {"k": "b", "__value__": Decimal("Infinity")},
                 id="an infinite value (clamp)"),
    pytest.param({}, {"k": "b", "__value__": Decimal("1E+999999999")}, id="a huge Decimal (saturates)"),
    pytest.param({}, {"k": "b", "__value__": -3}, id="a negative value (clamped)"),
    pytest.param({}, {"k": "b", "__value__": Decimal("2.5")}, id="a non-integer value"),
]


def without_noise(output: dict | None, selection: bool) -> dict | None:
    """The output less what the noise decides: values, the half-widths of means and variances (computed from
    their noised components), and under partition selection which keys are released."""
    if output is None:
        return None
    output = copy.deepcopy(output)
    output.pop("released_at")
    for aggregate in output["aggregates"].values():
        noised = ("value", "half_width") if aggregate["kind"] in ("mean", "variance") else ("value",)
        if selection:
            aggregate.pop("rows")
        for row in aggregate.get("rows", []):
            for name in noised:
                row.pop(name)
        for name in noised:
            aggregate.pop(name, None)
    return output


def ledger_rows(charges: list[dict]) -> list[dict]:
    """The ledger's charge rows less the digest of the noised output and the clock."""
    return [{k: v for k, v in c.items() if k not in ("output_digest", "created_at", "updated_at", "lease_expires_at")} for c in charges]


def neighbour_row(kind: str, added: dict) -> dict:
    row = {"k": added["k"], **KINDS[kind]}
    if "__value__" in added:
        for field in ("count", "sum", "sum_squares", "units"):
            if field in row and field != "units":
                row[field] = added["__value__"]
    return row


@pytest.mark.parametrize("selection", [pytest.param(False, id="public keys"), pytest.param(True, id="selection")])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("extras", "added"), NEIGHBOURS)
def test_neighbouring_inputs_give_the_same_logs_errors_and_outputs_but_noise(kind, selection, extras, added,
                                                                              build_spec, observe):
    spec = build_spec(kind, selection=selection, **extras)
    base = [{"k": "a", **KINDS[kind]}]
    first = observe(spec, {"x": base})
    second = observe(spec, {"x": base + [neighbour_row(kind, added)]})
    assert first[0] is None and second[0] is None  # both released
    assert first[1] == second[1] == []  # no log record at all, at DEBUG, from any logger
    assert ledger_rows(first[2]) == ledger_rows(second[2])
    assert without_noise(first[3], selection) == without_noise(second[3], selection)


@pytest.mark.parametrize("problem", [
    pytest.param({"k": "a", "count": "3"}, id="a str count"),
    pytest.param({"k": b"a", "count": 3}, id="a bytes key"),
    pytest.param({"k": "a"}, id="a missing field"),
    pytest.param(["a", 3], id="a row that is not a mapping"),
])
@pytest.mark.parametrize("selection", [pytest.param(False, id="public keys"), pytest.param(True, id="selection")])
def test_a_shape_refusal_reads_the_same_on_neighbouring_inputs(problem, selection, build_spec, observe):
    """The malformed row comes after 1 or 2 good rows: the text must not count them (no row index)."""
    spec = build_spec(selection=selection)
    first = observe(spec, {"x": [{"k": "a", "count": 40}, problem]})
    second = observe(spec, {"x": [{"k": "a", "count": 40}, {"k": "b", "count": 1}, problem]})
    assert first[0] is not None and first[0].startswith("ReleaseInputError: aggregate 'x': a row")
    assert first[:3] == second[:3] and first[2] == []
