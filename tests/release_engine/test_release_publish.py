"""The published form: half-widths that cover the true, unrounded value (the grid rounding and the float error
bound are inside the interval), saturation that is never silent, and exact integers beyond int64 on the way out.
Expected values come from the OpenDP reference formulas, the discrete Gaussian's pmf (Canonne, Kamath, Steinke 2020)
and the reasoning in each docstring."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from dp_operators.ledger import ReleaseKey
from dp_operators.mechanisms import discrete_gaussian_pmf
from dp_operators.operators.release import release_csv
from dp_operators.release import (
    SATURATION,
    check_plain_json,
    draw_noise,
    plan_release,
    prepare_inputs,
    publish_aggregate,
    run_release,
)
from dp_operators.release.publish import _float_towards, _towards, count_or_sum_cells, grid_floats, grid_values
from dp_operators.release.run import add_exactly
from dp_operators.spec import ReleaseSpec

from support import make_ledger, spender

ALPHA = 0.05
U = Fraction(1, 2**53)


def spec_of(confidence: float = 0.95, **aggregate) -> ReleaseSpec:
    fields = {"name": "x", "kind": "sum", "bounds": [0, 1], "mechanism": "discrete_laplace", "budget": {"epsilon": 1}}
    fields.update(aggregate)
    if fields["kind"] == "count":
        fields.pop("bounds", None)
    return ReleaseSpec.model_validate({"version": 1, "release": "publish", "budget_account": "census_adult",
                                       "privacy_unit": "person", "confidence": confidence, "aggregates": [fields]})


def opendp_discrete_laplace_accuracy(scale: float, alpha: float) -> float:
    """OpenDP's ``discrete_laplacian_scale_to_accuracy``: s ln(2 / (alpha (1 + e^(-1/s))))."""
    return scale * math.log(2 / (alpha * (1 + math.exp(-1 / scale))))


def release(spec: ReleaseSpec, upstream: dict, tmp_path, accountant="pure_dp") -> dict:
    ledger = make_ledger(tmp_path / "publish.db", accountant=accountant, cap="100")
    key = ReleaseKey(dag_id="adult_census_release", run_id="r", task_id="t", map_index=-1, release_name="publish")
    return run_release(spec, upstream, ledger, key, spec_hash="0" * 64).output


# -- half-widths include the rounding and the float error --------------------------------------------------
@pytest.mark.parametrize(
    ("aggregate", "component", "expected"),
    [
        pytest.param({"kind": "count"}, "count", 3.3756, id="count: the noise alone (OpenDP 3.3756)"),
        pytest.param({}, "sum", 3.3756 + 0.5, id="sum, grid 1: 3.3756 + half a grid step"),
        pytest.param({"grid": 0.25}, "sum", (opendp_discrete_laplace_accuracy(4, ALPHA) + 0.5) * 0.25,
                     id="sum, grid 1/4: Linf 4, scale 4, (a + 1/2) * 1/4"),
        pytest.param({"kind": "variance", "bounds": [0, 2], "budget": {"epsilon": 3}}, "sum_squares",
                     (opendp_discrete_laplace_accuracy(1, ALPHA) + 0.5) * 1,
                     id="sum of squares: + grid^2 / 2"),
        pytest.param({"upstream": {"arithmetic": "binary64", "max_rows": 1000}, "grid": "1/1024"}, "sum",
                     None, id="binary64 sum: + E"),
    ],
)
def test_the_half_width_covers_the_rounding_and_the_float_error(aggregate, component, expected):
    spec = spec_of(**aggregate)
    step = plan_release(spec).step("x", component)
    if expected is None:  # Linf = ceil((1 + 2E) * 1024) = 1025: scale 1025; E = gamma_999 * 1000 * 1
        error = 999 * U / (1 - 999 * U) * 1000
        assert step.linf == 1025
        expected = (opendp_discrete_laplace_accuracy(1025, ALPHA) + 0.5 + float(error * 1024)) / 1024
    assert step.half_width(ALPHA) == pytest.approx(expected, abs=1e-4 * max(1, step.grid))
    assert step.half_width(ALPHA) >= expected - 1e-12


def test_a_published_sum_carries_the_widened_half_width(tmp_path):
    published = release(spec_of(), {"x": Decimal("0.49")}, tmp_path)["aggregates"]["x"]
    assert published["half_width"] == pytest.approx(3.3756 + 0.5, abs=1e-4)
    assert "saturated" not in published


def coverage(spec: ReleaseSpec, truth: Fraction, keys: int, repetitions: int) -> tuple[float, float]:
    """Share of released values within their published half-width of ``truth``, and within the noise's half-width
    alone (without the rounding and the float error: the negative control)."""
    plan = plan_release(spec)
    prepared = prepare_inputs(spec, {"x": [{"k": k, "sum": truth} for k in range(keys)]})
    step = plan.step("x", "sum")
    old = step.noise_half_width_units(ALPHA) * float(step.grid)
    new = old_hits = 0
    for _ in range(repetitions):
        noised, _ = draw_noise(plan, prepared, [])
        published = publish_aggregate(spec, spec.aggregates[0], plan, noised, prepared.keys["x"])
        for row in published["rows"]:
            error = abs(Fraction(row["value"]) - truth)
            new += error <= Fraction(row["half_width"])
            old_hits += error <= Fraction(old)
    draws = keys * repetitions
    return new / draws, old_hits / draws


def test_intervals_of_rounded_sums_cover_at_small_noise_and_the_old_half_width_does_not():
    """A sum of 0.49 on grid 1 rounds to 0 (bounds [-1, 1], so no clamping at 0 helps); discrete Gaussian noise
    with sigma^2 = 1/4 has a 95 % half-width of 1 unit (P(|Z| > 1) = 0.0005). The old interval [Z - 1, Z + 1]
    holds 0.49 iff Z in {0, 1}: probability P(0) + P(1) = 0.893 (the pmf), below 0.95. With half a grid step
    added it holds iff |Z| <= 1: 0.9995. 10,000 draws: a 95 % interval's coverage is >= 0.941 with 4 standard
    errors to spare (negative control: the old half-width must fall below it)."""
    spec = spec_of(bounds=[-1, 1], group_by=["k"], keys={"k": list(range(2000))}, mechanism="discrete_gaussian",
                   budget={"rho": 2})
    assert plan_release(spec).step("x", "sum").scale == Fraction(1, 4)
    expected_old = discrete_gaussian_pmf(0, 0.25) + discrete_gaussian_pmf(1, 0.25)
    assert expected_old == pytest.approx(0.893, abs=1e-3)
    floor = 0.95 - 4 * math.sqrt(0.95 * 0.05 / 10_000)
    new, old = coverage(spec, Fraction(49, 100), keys=2000, repetitions=5)
    assert new >= floor
    assert old < floor and old == pytest.approx(expected_old, abs=0.02)


# -- item 3: saturation is never silent ----------------------------------------------------------------------------
# A saturated value is flagged when its noised integer is within one noise half-width of the limit, which misses
# with probability <= alpha (as every interval does). The tests publish at confidence 1 - 1e-9, so that they fail
# by chance less than once in a billion runs.
SURE = 1 - 1e-9
SURE_WIDTH = opendp_discrete_laplace_accuracy(1, 1 - SURE)  # discrete Laplace, scale 1: 20.3
def test_a_count_beyond_the_limit_is_published_as_saturated_with_an_unbounded_upper_side(tmp_path, caplog):
    """2^63 - 1 (as numpy returns an overflowed int64 count) is held at 2^62 by the engine: published with the
    noise's half-width it would miss the truth by about 1e17 half-widths. It is published with
    ``saturated: true``, no half-width and an interval [2^62 - a, unbounded), which holds the truth."""
    truth = 2**63 - 1
    spec = spec_of(SURE, kind="count", group_by=["k"], keys={"k": ["big", "small"]})
    with caplog.at_level(logging.DEBUG):
        output = release(spec, {"x": [{"k": "big", "count": np.int64(truth)}, {"k": "small", "count": 7}]}, tmp_path)
    big, small = output["aggregates"]["x"]["rows"]
    assert (truth - big["value"]) / SURE_WIDTH > 10**17  # the confident interval it replaces
    assert big["saturated"] is True and big["half_width"] is None
    lower, upper = big["interval"]
    assert upper is None and lower <= SATURATION - 20 and lower <= truth
    assert "saturated" not in small and small["half_width"] == pytest.approx(SURE_WIDTH, rel=1e-9)
    check_plain_json(output)
    json.dumps(output, allow_nan=False)
    assert not [r for r in caplog.records if "satur" in r.getMessage().lower()]  # post-processing, no log line


def test_a_sum_of_5e12_on_a_micro_grid_is_marked_saturated(tmp_path):
    """5e12 with grid 1e-6 is 5e18 grid units, beyond 2^62 = 4.6e18: without a declared row bound the plan cannot
    refuse it, so the published value says it is saturated, with a lower end below 2^62 * 1e-6 = 4.6e12."""
    spec = spec_of(SURE, bounds=[0, 10**6], grid="1e-6")
    published = release(spec, {"x": Decimal("5e12")}, tmp_path)["aggregates"]["x"]
    assert published["saturated"] is True and published["half_width"] is None
    lower, upper = published["interval"]
    assert upper is None and lower <= SATURATION * 1e-6 <= 5e12


def test_a_mean_with_a_saturated_component_is_published_with_the_whole_range_of_its_bounds(tmp_path):
    """10^7 values all at the upper bound 10^6, grid 1e-6: the centred sum 5e5 * 1e7 = 5e12 is 5e18 grid units and
    saturates, so the released mean (about 9.6e5) is not what the data say (10^6). The only interval still valid
    is the bounds themselves: [0, 10^6], finite, with saturated: true."""
    spec = spec_of(SURE, kind="mean", bounds=[0, 10**6], grid="1e-6")
    published = release(spec, {"x": {"sum": 10**13, "count": 10**7}}, tmp_path)["aggregates"]["x"]
    assert published["saturated"] is True and published["interval"] == [0.0, 1e6]
    value, width = published["value"], published["half_width"]
    assert value - width <= 0 and value + width >= 1e6 and math.isfinite(width)


def test_the_csv_marks_saturated_rows_and_leaves_the_unbounded_side_empty(tmp_path):
    spec = spec_of(SURE, kind="count", group_by=["k"], keys={"k": ["big", "small"]})
    output = release(spec, {"x": [{"k": "big", "count": 2**63 - 1}, {"k": "small", "count": 7}]}, tmp_path)
    rows = list(csv.DictReader(io.StringIO(release_csv(output))))
    big, small = rows
    assert big["saturated"] == "true" and big["half_width"] == "" and big["upper"] == ""
    assert float(big["lower"]) <= SATURATION - 20
    assert small["saturated"] == "false"
    value = float(small["value"])
    assert float(small["lower"]) <= value - SURE_WIDTH < value + SURE_WIDTH <= float(small["upper"])


# -- exact integers beyond int64 on the way to publication -------------------------------------------------------------


def test_add_exactly_does_not_wrap_on_an_int64_min_noise_value():
    """A noise value of -2^63 (an int64 the array samplers may return, with probability about 1e-19 per draw at
    the largest scales) is added exactly: -5 + -2^63 is -5 - 2^63, never wrapped to 2^63 - 5."""
    values = np.array([-5, 7], dtype=np.int64)
    noise = np.array([-(2**63), 1], dtype=np.int64)
    got = add_exactly(values, noise)
    assert [int(v) for v in got] == [-5 - 2**63, 8]


HUGE_NUMERATOR = Fraction(2**63 + 1, 2**63 - 1)  # a grid of about 1: numerator and denominator beyond int64


@pytest.mark.parametrize(
    "units", [pytest.param(np.zeros(0, dtype=np.int64), id="no cell"), pytest.param(np.zeros(3, dtype=np.int64),
                                                                                  id="all cells 0")],
)
def test_publication_with_a_grid_numerator_beyond_int64(units):
    """``grid_values`` and ``grid_floats`` publish cells on a grid whose numerator is beyond int64 when there is
    no cell or every cell is 0, never an OverflowError (which under partition selection comes after the draw)."""
    assert HUGE_NUMERATOR.numerator > 2**63
    assert grid_values(units, HUGE_NUMERATOR).tolist() == [0] * len(units)
    assert grid_floats(units, HUGE_NUMERATOR).tolist() == [0.0] * len(units)


def test_no_key_selected_with_a_grid_numerator_beyond_int64_publishes_an_empty_aggregate(tmp_path, xy_spec):
    """End to end: a sum under partition selection on grid (2^63+1)/(2^63-1) with no row upstream selects
    nothing and publishes an empty aggregate (no ReleaseAbortedError after the draw, budget spent)."""
    spec = xy_spec("sum", grid=f"{HUGE_NUMERATOR.numerator}/{HUGE_NUMERATOR.denominator}", bounds=(0, 10),
                   selection=True)
    spec = spec.model_copy(update={"budget_account": "census_adult"})
    ledger = make_ledger(tmp_path / "ledger.db", cap="100", accountant="approx_dp")
    key = ReleaseKey("adult_census_release", "r", "t", -1, spec.release)
    output = run_release(spec, {"agg": []}, ledger, key, spec_hash="0" * 64).output
    assert output["aggregates"]["agg"]["rows"] == []


def test_interval_ends_are_the_exact_outward_roundings():
    """``_towards`` (TwoSum) equals ``_float_towards`` on the exact Fraction for random doubles of many magnitudes
    and half-widths, including ties and widths far below one ulp of the value."""
    rng = np.random.default_rng(7)
    exponents = rng.integers(-30, 60, 4000)
    values = rng.standard_normal(4000) * np.exp2(exponents.astype(float))
    values[:50] = np.round(values[:50])
    widths = np.concatenate([np.exp2(rng.integers(-60, 40, 40).astype(float)), [0.5, 0.1, 1e-300, 3.0]])
    for width in widths.tolist():
        lower = _towards(values, width, -math.inf).tolist()
        upper = _towards(values, width, math.inf).tolist()
        for value, low, high in zip(values.tolist(), lower, upper):
            assert low == _float_towards(Fraction(value) - Fraction(width), -math.inf)
            assert high == _float_towards(Fraction(value) + Fraction(width), math.inf)


def test_saturation_flags_come_from_noised_integers_and_public_widths_only():
    """The side of a cell is a function of its noised integer and the public noise width (the per-value
    ``_near_limit``), on int64 and object arrays alike."""
    from dp_operators.release.publish import _near_limit

    class Step:
        grid = Fraction(1, 3)
        mechanism = "discrete_laplace"

        def noise_half_width_units(self, alpha):
            return 1e6

        def half_width(self, alpha):
            return 3.0

    units = [SATURATION - 10**6, SATURATION - 10**6 - 1, -SATURATION + 10**6, 0, SATURATION, -SATURATION - 7]
    for dtype in (np.int64, object):
        cells = count_or_sum_cells(Step(), np.array(units, dtype=dtype), 0.05, False)
        assert cells.side.tolist() == [_near_limit(u, 1e6) for u in units]


class TestPlainJsonCheck:
    """Invariant 9: a published document holds built-in JSON only (dict with str keys, list, str, bool, None, int,
    finite float), checked before the ledger commit, with the path of the first offending element."""

    @pytest.mark.parametrize(
        ("document", "message"),
        [
            pytest.param({"rows": [{"value": 1}, {"value": np.float64(2.0)}]},
                         r"release\.rows\[1\]\.value: float64 is not", id="numpy float in a row"),
            pytest.param({"rows": [{"value": np.int64(3)}]}, r"release\.rows\[0\]\.value: int64 is not",
                         id="numpy int"),
            pytest.param({"flag": np.bool_(True)}, r"release\.flag: bool is not", id="numpy bool"),
            pytest.param({"rows": [{"value": 1.5}, {"value": math.nan}]}, r"release\.rows\[1\]\.value: non-finite",
                         id="NaN"),
            pytest.param({"rows": [[1, [2.0, -math.inf]]]}, r"release\.rows\[0\]\[1\]\[1\]: non-finite",
                         id="-inf nested in lists"),
            pytest.param({"a": {"b": {"c": [{"d": math.inf}]}}}, r"release\.a\.b\.c\[0\]\.d: non-finite",
                         id="inf in nested objects"),
            pytest.param({"rows": [{"k": 1}, {2: 1}]}, r"release\.rows\[1\]: key of type int", id="int key"),
            pytest.param({"interval": (1.0, 2.0)}, r"release\.interval: tuple is not", id="tuple"),
            pytest.param({"value": Fraction(1, 3)}, r"release\.value: Fraction is not", id="Fraction"),
            pytest.param({"rows": [{"value": 10**400}, {"value": math.inf}]}, r"release\.rows\[1\]\.value: non-finite",
                         id="inf beside an int beyond the doubles"),
        ],
    )
    def test_an_element_that_is_not_plain_json_is_named_by_its_path(self, document, message):
        """Each kind of element outside plain JSON is refused, wherever it is nested, naming its path."""
        with pytest.raises(TypeError, match=message):
            check_plain_json(document)

    def test_plain_documents_pass_whatever_their_nesting(self):
        """Every built-in JSON type passes, nested, with empty containers and ints beyond the doubles."""
        check_plain_json({"a": [1, 2.5, -0.0, 10**400, None, True, "x", {"b": [[1.0, None], []]}], "c": {}})
        check_plain_json([])

    def test_a_large_plain_release_is_checked_without_walking_it_value_by_value(self, monkeypatch):
        """10^4 published rows are checked by columns: the value-by-value walk, which names an offending path,
        runs only for a document that fails."""
        from dp_operators.release import publish

        walked = []
        checker = publish._check_each
        monkeypatch.setattr(publish, "_check_each", lambda value, path: walked.append(path) or checker(value, path))
        rows = [{"k": i, "name": str(i), "value": i * 0.5, "half_width": 3.0} for i in range(10**4)]
        check_plain_json({"aggregates": {"x": {"rows": rows}}})
        assert walked == []
        rows[-1]["value"] = math.nan
        with pytest.raises(TypeError, match=r"rows\[9999\]\.value: non-finite"):
            check_plain_json({"aggregates": {"x": {"rows": rows}}})
        assert walked


def test_a_release_encodes_its_output_once_for_the_ledger_and_the_returned_form(tmp_path, monkeypatch):
    """The output is encoded to JSON once: the same text is the ledger's row, its digest and the returned form
    (decoded, so the first run returns what every replay returns)."""
    encoded = []
    encode = json.JSONEncoder.encode  # what json.dumps and the ledger's canonical encoder both call

    def counting(self, value):
        if isinstance(value, dict) and "aggregates" in value:
            encoded.append(value["release"])
        return encode(self, value)

    monkeypatch.setattr(json.JSONEncoder, "encode", counting)
    spec = spec_of(kind="count", group_by=["k"], keys={"k": list(range(1000))})
    output = release(spec, {"x": [{"k": 3, "count": 5}]}, tmp_path)
    assert encoded == ["publish"]
    ledger = spender(f"sqlite:///{tmp_path / 'publish.db'}")  # the same ledger: a replay
    key = ReleaseKey(dag_id="adult_census_release", run_id="r", task_id="t", map_index=-1, release_name="publish")
    assert run_release(spec, {}, ledger, key, spec_hash="0" * 64).output == output


def _key_orders(value) -> list:
    """Every dict's key order, depth first: what tells two equal documents' encodings apart."""
    if type(value) is dict:
        return [list(value), *[o for v in value.values() for o in _key_orders(v)]]
    if type(value) is list:
        return [o for v in value for o in _key_orders(v)]
    return []


def test_a_first_run_returns_the_document_a_replay_decodes_key_order_included():
    """``in_key_order`` gives ``json.loads(canonical_json(v))`` exactly, key orders included, for rows built in any
    key order, mixed rows, nested containers and empty ones; a document left in its built order does not."""
    from dp_operators.ledger.chain import canonical_json
    from dp_operators.release.publish import in_key_order

    document = {
        "zeta": 1, "alpha": {"y": [1, 2.5, None], "b": {"d": [], "c": {}}},
        "rows": [{"x": 1, "value": 2.0, "half_width": 0.5}, {"half_width": 0.5, "value": 3.0, "x": 2},
                 {"x": 3, "value": -0.0, "half_width": 0.5, "saturated": True, "interval": "high"}],
        "mixed": [{"b": [1], "a": 2}, 3, "s", [{"z": 1, "a": {"k": 0, "j": 1}}]],
        "text": "\u00e9\n\"",
    }
    decoded = json.loads(canonical_json(document))
    ordered = in_key_order(document)
    assert ordered == decoded and _key_orders(ordered) == _key_orders(decoded)
    assert json.dumps(ordered) == json.dumps(decoded)
    assert json.dumps(document) != json.dumps(decoded)  # negative control: the built order differs
