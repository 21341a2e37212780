"""The spec's ``sampler`` option: the vectorised exact samplers are the default noise source of
releases, ``scalar`` and ``opendp`` route to the CKS 2020 rejection samplers and to OpenDP's, OpenDP's float scale
is never below the planned exact one, and a spec that OpenDP cannot serve is refused before any budget is spent
(docs/adr/0022)."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import numpy as np
import pytest
from pydantic import ValidationError
from scipy.stats import chi2_contingency

import dp_operators.release.plan as plan_module
from dp_operators.ledger import ReleaseKey
from dp_operators.mechanisms import opendp_samplers, sample_discrete_laplace_array
from dp_operators.release import ReleaseConfigError, plan_release, run_release
from dp_operators.release.plan import NoiseStep
from dp_operators.spec import Budget, ReleaseSpec, SpecError, parse_spec

from support import make_ledger

ACCEPT_P = 1e-4  # a correct pair of samplers fails one such test in 10^4 runs
REJECT_P = 1e-6
SAMPLERS = ["vectorised", "scalar", "opendp"]
KEYS = ["a", "b", "c"]
_UNSET = object()


def spec_with(sampler: object = _UNSET, *, mechanism: str = "discrete_laplace", budget: dict | None = None,
              **aggregate) -> ReleaseSpec:
    """A grouped count over KEYS (or ``aggregate``'s override), with ``sampler`` set if given."""
    fields = {"name": "x", "kind": "count", "group_by": ["k"], "keys": {"k": KEYS}, "mechanism": mechanism,
              "budget": budget or ({"epsilon": 1} if mechanism == "discrete_laplace" else {"rho": "1/2"})}
    fields.update(aggregate)
    document = {"version": 1, "release": "sampler", "budget_account": "census_adult", "privacy_unit": "person",
                "aggregates": [fields]}
    if sampler is not _UNSET:
        document["sampler"] = sampler
    return ReleaseSpec.model_validate(document)


def step_at(mechanism: str, scale: Fraction, sampler: str) -> NoiseStep:
    """A count step with the given exact scale (Laplace t, Gaussian sigma^2) and sampler."""
    budget = Budget.model_construct(epsilon=Fraction(1)) if mechanism == "discrete_laplace" else \
        Budget.model_construct(rho=Fraction(1, 2))
    return NoiseStep("x", "count", mechanism, budget, 1, 1, scale, Fraction(1), 5, sampler=sampler)


def _key(run: str = "r") -> ReleaseKey:
    return ReleaseKey(dag_id="adult_census_release", run_id=run, task_id="t", map_index=-1, release_name="sampler")


# -- the default -----------------------------------------------------------------------------------------------------
def test_the_default_sampler_is_the_vectorised_one(monkeypatch):
    spec = spec_with()
    assert spec.sampler == "vectorised"
    step = plan_release(spec).step("x", "count")
    assert step.sampler == "vectorised"
    # an older caller that builds a step without naming a sampler gets the default too
    old_style = NoiseStep("x", "count", "discrete_laplace", step.budget, 1, 1, Fraction(1), Fraction(1), 3)
    assert old_style.sampler == "vectorised"
    calls = []

    def spy(scale, size):
        calls.append((scale, size))
        return sample_discrete_laplace_array(scale, size)

    monkeypatch.setattr(plan_module, "sample_discrete_laplace_array", spy)
    noise = step.draw()
    assert calls == [(Fraction(1), len(KEYS))] and noise.dtype == np.int64 and noise.shape == (len(KEYS),)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize(
    "mechanism,scale",
    [("discrete_laplace", Fraction(7, 3)), ("discrete_gaussian", Fraction(9))],
    ids=["laplace 7/3", "gaussian sigma2 9"],
)
def test_every_sampler_returns_an_int64_array_of_the_asked_size(sampler, mechanism, scale):
    step = step_at(mechanism, scale, sampler)
    for size in (0, 1, 1000):
        noise = step.draw(size)
        assert isinstance(noise, np.ndarray) and noise.dtype == np.int64 and noise.shape == (size,)
    assert step.draw().shape == (5,)  # default: one per partition
    # noise, not a constant: 1000 draws at these scales take well over 3 distinct values
    assert len(np.unique(step.draw(1000))) > 3


# -- routing ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mechanism,name",
    [("discrete_laplace", "sample_discrete_laplace_vector"), ("discrete_gaussian", "sample_discrete_gaussian_vector")],
)
def test_scalar_routes_to_the_rejection_samplers_and_returns_an_array(monkeypatch, mechanism, name):
    real, calls = getattr(plan_module, name), []

    def spy(scale, size):
        calls.append((scale, size))
        return real(scale, size)

    monkeypatch.setattr(plan_module, name, spy)
    for other in ("sample_discrete_laplace_array", "sample_discrete_gaussian_array"):
        monkeypatch.setattr(plan_module, other, lambda *a: pytest.fail("the vectorised sampler was called"))
    step = plan_release(spec_with("scalar", mechanism=mechanism)).step("x", "count")
    noise = step.draw(7)
    assert calls == [(step.scale, 7)] and noise.dtype == np.int64 and noise.shape == (7,)


def test_scalar_values_beyond_int64_come_back_as_python_ints(monkeypatch):
    monkeypatch.setattr(plan_module, "sample_discrete_laplace_vector", lambda scale, size: [2**70, -3, -(2**64)])
    noise = step_at("discrete_laplace", Fraction(10), "scalar").draw(3)
    assert noise.dtype == object and list(noise) == [2**70, -3, -(2**64)]
    assert all(type(v) is int for v in noise)


@pytest.mark.parametrize(
    "mechanism,maker,scale,expected",
    [
        ("discrete_laplace", "make_laplace", Fraction(7, 3), 2.3333333333333335),  # the float just above 7/3
        ("discrete_gaussian", "make_gaussian", Fraction(9), 3.0),  # sqrt(9) is a float: no rounding
    ],
)
def test_opendp_routes_to_opendps_measurement_with_the_rounded_up_scale(monkeypatch, mechanism, maker, scale, expected):
    dp = opendp_samplers.load_opendp()
    real, calls = getattr(dp.m, maker), []

    def spy(domain, metric, scale):
        calls.append((str(domain), str(metric), scale))
        return real(domain, metric, scale=scale)

    monkeypatch.setattr(dp.m, maker, spy)
    opendp_samplers._measurement.cache_clear()  # a cached measurement would bypass the spy
    try:
        noise = step_at(mechanism, scale, "opendp").draw(2000)
    finally:
        opendp_samplers._measurement.cache_clear()
    assert len(calls) == 1
    domain, metric, used = calls[0]
    assert "i64" in domain and "i64" in metric and used == expected
    assert noise.dtype == np.int64 and noise.shape == (2000,)


def _homogeneity_p(a: np.ndarray, b: np.ndarray, bins: int = 40) -> float:
    """Chi-square test that two integer samples come from one law, on about ``bins`` groups of consecutive
    integers of roughly equal mass in ``a`` (empty groups dropped)."""
    edges = np.unique(np.quantile(a, np.linspace(0, 1, bins + 1)[1:-1], method="lower"))
    counts = np.vstack([np.bincount(np.searchsorted(edges, s, side="right"), minlength=len(edges) + 1) for s in (a, b)])
    counts = counts[:, counts.sum(axis=0) > 0]
    return float(chi2_contingency(counts).pvalue)


# Sizes: the noncentrality of the test against the 5 % off control is about 220 (Laplace, 2e5 draws each) and 215
# (Gaussian, 1e5), so the control escapes rejection at p < 1e-6 with probability below 1e-11.
@pytest.mark.parametrize(
    "mechanism,scale,off,n",
    [
        ("discrete_laplace", Fraction(10), Fraction(105, 100), 2 * 10**5),  # b 5 % larger
        ("discrete_gaussian", Fraction(100), Fraction(105, 100) ** 2, 10**5),  # sigma 5 % larger
    ],
    ids=["laplace 10", "gaussian sigma 10"],
)
def test_opendp_and_vectorised_draw_the_same_law(mechanism, scale, off, n):
    ours = step_at(mechanism, scale, "vectorised").draw(n)
    theirs = step_at(mechanism, scale, "opendp").draw(n)
    assert _homogeneity_p(ours, theirs) > ACCEPT_P
    # negative control: OpenDP 5 % off in scale must be told apart at the same sample size
    assert _homogeneity_p(ours, step_at(mechanism, scale * off, "opendp").draw(n)) < REJECT_P


# -- OpenDP's float scale --------------------------------------------------------------------------------------------
AWKWARD = [Fraction(7, 3), Fraction(3 * 10**20 + 1, 3), Fraction(1, 3), Fraction(2**53 + 1), Fraction(10)]


@pytest.mark.parametrize("exact", AWKWARD, ids=str)
def test_opendps_laplace_scale_is_the_smallest_float_not_below_the_exact_one(exact):
    b = opendp_samplers.opendp_laplace_scale(exact)
    assert Fraction(b) >= exact
    assert Fraction(math.nextafter(b, 0.0)) < exact  # and no smaller float would do
    if exact == 10:
        assert b == 10.0  # a float scale is passed unchanged


@pytest.mark.parametrize("exact", AWKWARD + [Fraction(9), Fraction(2, 10**7)], ids=str)
def test_opendps_gaussian_sigma_squared_is_never_below_the_planned_sigma2(exact):
    sigma = opendp_samplers.opendp_gaussian_scale(exact)
    assert Fraction(sigma) ** 2 >= exact
    assert Fraction(math.nextafter(sigma, 0.0)) ** 2 < exact
    if exact == 9:
        assert sigma == 3.0


def test_the_opendp_scale_is_described_with_the_sampler():
    for sampler in SAMPLERS:
        described = plan_release(spec_with(sampler)).step("x", "count").describe()
        assert described["sampler"] == sampler
        assert ("opendp_scale_grid_units" in described) == (sampler == "opendp")
    step = plan_release(spec_with("opendp", budget={"epsilon": 3})).step("x", "count")
    described = step.describe()
    assert step.scale == Fraction(1, 3) and described["scale_grid_units_exact"] == "1/3"
    assert described["opendp_scale_grid_units"] == math.nextafter(1 / 3, 1.0)  # 1/3 as a float is below 1/3


# -- refusals --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "written,read", [("numpy", "numpy"), ("OpenDP", "OpenDP"), ("''", ""), ("1", 1), ("null", None)]
)
def test_an_unknown_sampler_is_a_spec_error_naming_the_allowed_values(written, read):
    text = "\n".join([
        "version: 1", "release: r", "budget_account: a", "privacy_unit: person", f"sampler: {written}",
        "aggregates: [{name: x, kind: count, mechanism: discrete_laplace, budget: {epsilon: 1}}]",
    ])
    with pytest.raises(SpecError) as refused:
        parse_spec(text, source="bad.yaml")
    message = str(refused.value)
    assert "bad.yaml" in message and f"sampler: unknown sampler {read!r}: use 'vectorised'" in message
    assert all(f"'{name}'" in message for name in SAMPLERS)
    assert message.count("\n") == 1  # one problem, one line: no second error from the Literal behind it
    with pytest.raises(ValidationError, match="unknown sampler"):
        spec_with(read)  # type: ignore[arg-type]
    if isinstance(read, str):  # a step built in code with a bad name refuses to draw, even nothing
        with pytest.raises(ValueError, match=r"unknown sampler .*vectorised, scalar, opendp"):
            step_at("discrete_laplace", Fraction(1), read).draw(0)


def test_without_opendp_installed_an_opendp_spec_is_refused_before_any_budget(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "opendp", None)  # import opendp now raises ImportError
    monkeypatch.setitem(sys.modules, "opendp.prelude", None)
    spec = spec_with("opendp")
    with pytest.raises(ReleaseConfigError, match=r"pip install 'opendp>=0.12'"):
        plan_release(spec)
    ledger = make_ledger(tmp_path / "l.db", accountant="pure_dp", cap="10")
    called = []
    with pytest.raises(ReleaseConfigError, match="needs the opendp package"):
        run_release(spec, lambda: called.append(1) or {}, ledger, _key(), spec_hash="0" * 64)
    assert called == [] and list(ledger.charges()) == [] and ledger.account("census_adult").spent == 0
    plan_release(spec_with("vectorised"))  # the other samplers do not need it
    plan_release(spec_with("scalar"))


def test_a_scale_opendps_int64_output_would_saturate_is_refused_at_plan_time():
    # a sum over [0, 1e6] on grid 1e-6 (Linf 1e12) in 100 partitions at epsilon 1e-4: b = 1e18 grid units,
    # within the engine's 2^62 but above OpenDP's 2^56
    keys = list(range(100))
    fields = dict(kind="sum", bounds=[0, 10**6], grid=1e-6, keys={"k": keys}, budget={"epsilon": 1e-4},
                  contribution={"max_partitions_contributed": 100})
    step = plan_release(spec_with("vectorised", **fields)).step("x", "sum")
    assert step.scale > 2**56
    with pytest.raises(ReleaseConfigError, match=r"aggregate 'x' \(sum\): sampler 'opendp': .*2\^56.*vectorised"):
        plan_release(spec_with("opendp", **fields))
    with pytest.raises(ValueError, match="2\\^56"):
        opendp_samplers.sample_discrete_laplace_opendp(step.scale, 3)


def test_a_gaussian_calibrated_to_its_profile_is_checked_again_at_opendps_sigma(monkeypatch):
    spec = spec_with("opendp", mechanism="discrete_gaussian", budget={"epsilon": 1, "delta": 1e-6})
    step = plan_release(spec).step("x", "count")
    assert step.noise_delta == Fraction(1, 10**6)  # calibrated to the exact profile, not to rho
    checked = []

    def refuses(sigma2, rho, written, shift):
        checked.append((sigma2, written.epsilon, written.delta))
        return False

    monkeypatch.setattr(plan_module, "_within_written", refuses)
    with pytest.raises(ReleaseConfigError, match=r"aggregate 'x' \(count\): sampler 'opendp' draws with the float"):
        plan_release(spec)
    sigma2, epsilon, delta = checked[0]
    assert sigma2 == Fraction(step.opendp_scale) ** 2 >= step.scale and (epsilon, delta) == (1, Fraction(1, 10**6))


def test_a_saturated_opendp_draw_raises_instead_of_being_returned(monkeypatch):
    def saturating(kind, scale):
        return lambda zeros: [3, 2**63 - 1, -1][: len(zeros)]  # OpenDP's saturating cast at the int64 top

    monkeypatch.setattr(opendp_samplers, "_measurement", saturating)
    with pytest.raises(OverflowError, match="saturated"):
        step_at("discrete_laplace", Fraction(10), "opendp").draw(3)


# -- end to end ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_release_records_its_sampler_in_the_ledger_and_the_output(tmp_path, sampler):
    ledger = make_ledger(tmp_path / "l.db", accountant="pure_dp", cap="10")
    spec = spec_with(sampler)
    output = run_release(spec, {"x": [{"k": k, "count": 10} for k in KEYS]}, ledger, _key(), spec_hash="0" * 64).output
    assert [m["sampler"] for m in output["mechanisms"]] == [sampler]
    (charge,) = ledger.charges()
    assert charge["state"] == "committed"
    assert ledger.account("census_adult").spent == plan_release(spec, accountant="pure_dp").charge() == 1


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_nothing_selected_publishes_an_empty_aggregate_with_every_sampler(tmp_path, sampler, xy_spec):
    """A count under partition selection whose only key is not selected publishes no row with every sampler, and
    every step draws an empty array when asked for zero values."""
    if sampler == "opendp":
        pytest.importorskip("opendp")
    spec = xy_spec("count", selection=True, sampler=sampler).model_copy(update={"budget_account": "census_adult"})
    ledger = make_ledger(tmp_path / "ledger.db", cap="100", accountant="approx_dp")
    key = ReleaseKey("adult_census_release", "r", "t", -1, spec.release)
    output = run_release(spec, {"agg": [{"x": 0, "y": "a", "count": 1}]}, ledger, key, spec_hash="0" * 64).output
    assert output["aggregates"]["agg"]["rows"] == []
    assert all(step.draw(0).shape == (0,) for step in plan_release(spec, "approx_dp").steps)


@pytest.mark.parametrize("mechanism", ["discrete_laplace", "discrete_gaussian"])
def test_opendp_scales_are_never_below_the_plan(mechanism, xy_spec):
    """For every step of an opendp plan (selection included), the float OpenDP draws with is at least the planned
    scale (Laplace b >= t; Gaussian sigma^2 >= planned sigma^2), at most one ulp above it, and is the one the
    ledger description records."""
    pytest.importorskip("opendp")
    document = xy_spec("sum", selection=True, sampler="opendp").model_dump(mode="json")
    aggregate = document["aggregates"][0]
    aggregate["mechanism"] = mechanism
    aggregate["budget"] = {"epsilon": 1} if mechanism == "discrete_laplace" else {"epsilon": 1, "delta": 1e-7}
    aggregate["partition_selection"]["mechanism"] = mechanism
    spec = ReleaseSpec.model_validate(document)
    for step in plan_release(spec, "approx_dp").steps:
        scale = step.opendp_scale
        exact = Fraction(scale) if step.mechanism == "discrete_laplace" else Fraction(scale) ** 2
        assert exact >= step.scale
        below = math.nextafter(scale, 0.0)
        assert (Fraction(below) if step.mechanism == "discrete_laplace" else Fraction(below) ** 2) < step.scale
        assert step.describe()["opendp_scale_grid_units"] == scale
