"""Consistent releases end to end (issue 14): ``config/releases/adult_education_sex.yaml`` on the true UCI Adult
counts through :func:`run_release` with a real SQLite ledger. Every published margin is the sum of its cells exactly;
the post-processed half-widths shrink; the charge is the same with and without post-processing; a replay returns
the stored release; the post-processing sees noised values only, and what an observer sees besides them does not
depend on one person; a family that may be saturated, or whose post-processing fails after the noise is drawn, is
published as released; a large member's rows file adds up; a key hierarchy (age band > age) adds up the same way."""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import math
import random
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import dp_operators.release.consistent as consistent_module
from dp_operators.ledger import ReleaseKey
from dp_operators.consistency import half_widths
from dp_operators.release import LocalRowsStore, SATURATION, ReleasePlan, plan_release, run_release
from dp_operators.release.consistent import make_consistent
from dp_operators.spec import ReleaseSpec
from dp_operators.spec.families import consistent_families
from dp_operators.spec.yaml12 import load_yaml

from support import REPO, make_ledger

DAG = "adult_consistent_release"
ACCOUNT = "census_adult_tables"
SPEC_PATH = REPO / "config" / "releases" / "adult_education_sex.yaml"
BASE, BY_EDUCATION, BY_SEX, TOTAL = FAMILY = ("people_by_education_sex", "people_by_education", "people_by_sex",
                                             "people")
#: what the published consistency block of a post-processed member holds
DESCRIPTION = {"applied", "family", "base", "estimator", "variance", "nonnegative", "integer"}
NOISED = {"value", "released_at"}
VOLATILE = {"id", "created_at", "row_hash", "prev_hash", "output_digest", "context", "charge_id", "updated_at",
            "token_hash", "proof", "lease_expires_at"}


@cache
def _dag_module():
    """``dags/adult_consistent_release.py`` as a module (``dags/`` is loaded by path, as Airflow does)."""
    loaded = importlib.util.spec_from_file_location("adult_consistent_release_dag",
                                                    REPO / "dags" / "adult_consistent_release.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def counts(adult_csv) -> dict:
    """True counts of Adult by education x sex, education, sex and in total: the example DAG's upstream task."""
    return _dag_module().compute_education_sex_counts(adult_csv)


def spec_with(postprocess: Any = ...) -> ReleaseSpec:
    """The example spec; ``postprocess`` replaces its block (None removes it, ``...`` keeps it)."""
    document = load_yaml(SPEC_PATH.read_text())
    if postprocess is None:
        del document["postprocess"]
    elif postprocess is not ...:
        document["postprocess"] = postprocess
    return ReleaseSpec.model_validate(document)


EXAMPLE = {"consistent": True, "nonnegative": True, "integer": True}
CONSISTENT_ONLY = {"consistent": True}


def new_ledger(path, account: str = ACCOUNT):
    return make_ledger(path, cap="10", dags=(DAG,), account=account)


def key(run: str = "run-1", release: str = "adult_education_sex_table") -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run, task_id="release", map_index=-1, release_name=release)


def release(spec: ReleaseSpec, aggregates, ledger, run: str = "run-1", **kwargs) -> dict:
    return run_release(spec, aggregates, ledger, key(run, spec.release), spec_hash="0" * 64, **kwargs).output


def cells(output: dict, name: str) -> dict[tuple, tuple[Any, Any]]:
    """``{key tuple: (value, half_width)}`` of a published aggregate (``()`` for an ungrouped one)."""
    published = output["aggregates"][name]
    if not published["group_by"]:
        return {(): (published["value"], published["half_width"])}
    return {tuple(row[c] for c in published["group_by"]): (row["value"], row["half_width"])
            for row in published["rows"]}


def assert_adds_up(margin: dict[tuple, Any], base: dict[tuple, Any], project) -> None:
    """Every margin cell equals the sum of the base cells ``project`` maps to it: as exact rationals, and as the
    float (or int) sum in the published order, reversed, shuffled and by ``math.fsum``."""
    parts: dict[tuple, list] = {k: [] for k in margin}
    for key_, value in base.items():
        parts[project(key_)].append(value)
    shuffle = random.Random(14)
    for key_, value in margin.items():
        terms = parts[key_]
        assert terms, key_
        assert sum(Fraction(t) for t in terms) == Fraction(value), key_
        shuffled = list(terms)
        shuffle.shuffle(shuffled)
        for order in (terms, terms[::-1], shuffled):
            assert sum(order) == value, (key_, order)
        assert math.fsum(terms) == value


def assert_family_adds_up(output: dict) -> None:
    base = {k: v for k, (v, _) in cells(output, BASE).items()}
    assert len(base) == 32
    by_education = {k: v for k, (v, _) in cells(output, BY_EDUCATION).items()}
    by_sex = {k: v for k, (v, _) in cells(output, BY_SEX).items()}
    total = {k: v for k, (v, _) in cells(output, TOTAL).items()}
    assert_adds_up(by_education, base, lambda k: (k[0],))
    assert_adds_up(by_sex, base, lambda k: (k[1],))
    assert_adds_up(total, base, lambda k: ())
    assert_adds_up(total, by_education, lambda k: ())
    assert_adds_up(total, by_sex, lambda k: ())


def true_vectors(spec: ReleaseSpec, counts: dict) -> dict[str, np.ndarray]:
    """The true counts of each aggregate in its key-domain order (row-major over ``group_by``; 0 where missing)."""
    vectors = {}
    for aggregate in spec.aggregates:
        rows = counts[aggregate.name]
        if not aggregate.group_by:
            vectors[aggregate.name] = np.array([rows], dtype=np.int64)
            continue
        found = {tuple(str(row[c]) for c in aggregate.group_by): row["count"] for row in rows}
        domain = [()]
        for column in aggregate.group_by:
            domain = [k + (str(v),) for k in domain for v in aggregate.keys[column]]
        vectors[aggregate.name] = np.array([found.get(k, 0) for k in domain], dtype=np.int64)
    return vectors


def without_one_person(counts: dict, education: str = "Bachelors", sex: str = "Female") -> dict:
    """Adult minus one person of ``education`` x ``sex``: that cell and its margins decremented."""
    removed = copy.deepcopy(counts)
    for name, match in ((BASE, {"education": education, "sex": sex}), (BY_EDUCATION, {"education": education}),
                        (BY_SEX, {"sex": sex})):
        (row,) = [r for r in removed[name] if all(r[c] == v for c, v in match.items())]
        row["count"] -= 1
    removed[TOTAL] -= 1
    return removed


# -- margins add up --------------------------------------------------------------------------------------------------


def test_the_example_publishes_non_negative_integers_whose_margins_add_up(counts, tmp_path):
    spec = spec_with()
    output = release(spec, counts, new_ledger(tmp_path / "ledger.db"))
    assert_family_adds_up(output)
    for name in FAMILY:
        for value, width in cells(output, name).values():
            assert type(value) is int and value >= 0
            assert type(width) is float and width > 0
    json.dumps(output, allow_nan=False)


def test_consistent_only_publishes_floats_that_add_up_exactly_in_any_order(counts, tmp_path):
    spec = spec_with(CONSISTENT_ONLY)
    output = release(spec, counts, new_ledger(tmp_path / "ledger.db"))
    assert_family_adds_up(output)
    values = [v for name in FAMILY for v, _ in cells(output, name).values()]
    assert all(type(v) is float for v in values)
    assert any(v != round(v) for v in values)  # least squares, not rounded: fractional values occur


def test_the_comparison_of_margins_catches_a_margin_off_by_one_ulp(counts, tmp_path):
    """Negative control: :func:`assert_family_adds_up` fails when one margin is moved by one float step."""
    output = release(spec_with(CONSISTENT_ONLY), counts, new_ledger(tmp_path / "ledger.db"))
    output["aggregates"][TOTAL]["value"] = math.nextafter(output["aggregates"][TOTAL]["value"], math.inf)
    with pytest.raises(AssertionError):
        assert_family_adds_up(output)


def test_without_postprocessing_the_margins_do_not_add_up(counts, tmp_path):
    """Negative control: independently noised margins disagree (the comparison can fail on real releases)."""
    output = release(spec_with(None), counts, new_ledger(tmp_path / "ledger.db"))
    with pytest.raises(AssertionError):
        assert_family_adds_up(output)


# -- what is published with the values --------------------------------------------------------------------------------


@pytest.mark.parametrize("postprocess", [pytest.param(EXAMPLE, id="nonnegative integer"),
                                         pytest.param(CONSISTENT_ONLY, id="consistent only")])
def test_every_member_describes_its_post_processing(counts, tmp_path, postprocess):
    output = release(spec_with(postprocess), counts, new_ledger(tmp_path / "ledger.db"))
    for name in FAMILY:
        block = output["aggregates"][name]["consistency"]
        assert DESCRIPTION <= set(block), block
        assert block["applied"] is True
        assert block["family"] == list(FAMILY) and block["base"] == BASE
        assert block["estimator"] == "weighted_least_squares"
        assert block["variance"] == "exact"
        assert block["nonnegative"] is bool(postprocess.get("nonnegative"))
        assert block["integer"] is bool(postprocess.get("integer"))
        if postprocess.get("integer"):
            assert set(block["controlled_rounding"]) <= set(FAMILY)
        else:
            assert "controlled_rounding" not in block
        assert output["aggregates"][name]["mechanism"] == "discrete_gaussian"


def test_a_spec_without_consistency_publishes_no_consistency_block(counts, tmp_path):
    output = release(spec_with(None), counts, new_ledger(tmp_path / "ledger.db"))
    assert not any("consistency" in output["aggregates"][name] for name in FAMILY)


def _least_squares_accuracy(spec: ReleaseSpec) -> dict[str, tuple[float, float]]:
    """Reference: per member, the standard deviation of its first cell under the least-squares fit, from the dense
    Gauss-Markov covariance C = (A^T W A)^-1 (every member's cells as rows of A, W the inverse noise variances), and
    the largest absolute weight of one noised value in that cell (the row of P = A C A^T W): the lattice spacing of
    its error in grid units."""
    plan = plan_release(spec, accountant="zcdp")
    (layout,) = consistent_families(spec)
    family = consistent_module.build_family(plan, layout)
    design = []
    weights = []
    for member in family.members:
        block = np.zeros((member.cells, family.base_cells))
        block[member.to_base, np.arange(family.base_cells)] = 1
        design.append(block)
        weights += [1 / member.variance] * member.cells
    a = np.vstack(design)
    covariance = np.linalg.inv(a.T @ (np.array(weights)[:, None] * a))
    return {m.name: (math.sqrt(float(b[0] @ covariance @ b[0])),
                     float(np.abs(b[0] @ covariance @ a.T * np.array(weights)).max()))
            for m, b in zip(family.members, design)}


def test_half_widths_shrink_to_the_least_squares_values(counts, tmp_path):
    """docs/consistency.md: half_width = q sd + L grid / 2 (a continuity correction for the integer noise, L the
    largest weight of one noised value in the published value), plus the rounding allowances (here the exact-sums
    step only, below 1e-9)."""
    spec = spec_with(CONSISTENT_ONLY)
    plain = release(spec_with(None), counts, new_ledger(tmp_path / "plain.db"))
    output = release(spec, counts, new_ledger(tmp_path / "consistent.db"))
    z = 1.959963984540054  # the normal quantile at 97.5 %: every member is discrete Gaussian
    expected = _least_squares_accuracy(spec)
    for name in FAMILY:
        raw = {w for _, w in cells(plain, name).values()}
        (raw_width,) = raw
        widths = [w for _, w in cells(output, name).values()]
        sd, lattice = expected[name]
        assert all(w == pytest.approx(z * sd + lattice / 2, rel=1e-9, abs=1e-6) for w in widths), (name, widths[:3])
        assert max(widths) < raw_width, name
    # the total is observed four times, as itself and as sums of 2, 16 and 32 cells of equal noise variance v:
    # the best linear unbiased estimate is their average weighted 32 : 16 : 2 : 1 (per noised value of each), of
    # variance 1 / (1/v + 1/2v + 1/16v + 1/32v) = 32 v / 51, its own noised value weighing 32/51 in it
    sigma = plan_release(spec, accountant="zcdp").step(TOTAL, "count").standard_deviation
    assert expected[TOTAL][1] == pytest.approx(32 / 51, rel=1e-12)
    assert cells(output, TOTAL)[()][1] == pytest.approx(z * sigma * math.sqrt(32 / 51) + 16 / 51, rel=1e-9)


def test_the_example_margins_have_narrower_intervals_than_released_alone(counts, tmp_path):
    """With nonnegative and integer the half-widths carry the rounding allowance, and margins still gain."""
    plain = release(spec_with(None), counts, new_ledger(tmp_path / "plain.db"))
    output = release(spec_with(), counts, new_ledger(tmp_path / "example.db"))
    for name in (BY_EDUCATION, BY_SEX, TOTAL):
        (raw_width,) = {w for _, w in cells(plain, name).values()}
        assert max(w for _, w in cells(output, name).values()) < raw_width, name


# -- the charge ------------------------------------------------------------------------------------------------------


def _charge_fields(ledger) -> list[dict]:
    return [{k: row[k] for k in ("account", "state", "amount", "delta_amount", "mechanisms")}
            for row in ledger.charges()]


def test_the_budget_charged_is_identical_with_and_without_post_processing(counts, tmp_path):
    """Issue 14's acceptance test: post-processing spends nothing."""
    charged = {}
    outputs = {}
    for label, postprocess in (("plain", None), ("consistent", CONSISTENT_ONLY), ("example", ...)):
        ledger = new_ledger(tmp_path / f"{label}.db")
        outputs[label] = release(spec_with(postprocess), counts, ledger)
        charged[label] = (_charge_fields(ledger), ledger.account(ACCOUNT).spent)
    assert charged["plain"] == charged["consistent"] == charged["example"]
    ((row,), spent) = charged["plain"]
    assert row["state"] == "committed"
    assert Fraction(row["amount"]) == spent == Fraction(4, 100)  # four counts at rho 0.01
    assert outputs["plain"]["charge"] == outputs["consistent"]["charge"] == outputs["example"]["charge"]
    assert outputs["plain"]["mechanisms"] == outputs["example"]["mechanisms"]


def test_two_accounts_of_one_ledger_are_charged_the_same(counts, tmp_path):
    from dp_operators.ledger import AccountConfig, LedgerConfig
    from support import governor, spender

    url = f"sqlite:///{tmp_path / 'two.db'}"
    governor(url).init_schema()
    config = {name: AccountConfig(accountant="zcdp", cap=Fraction(1), delta=Fraction(1, 10**6),
                                  privacy_unit="person", allowed_dags=[DAG]) for name in ("plain", "post")}
    governor(url).apply_config(LedgerConfig(version=1, accounts=config))
    ledger = spender(url)
    for account, postprocess in (("plain", None), ("post", ...)):
        document = load_yaml(SPEC_PATH.read_text())
        document["budget_account"] = account
        document["release"] = f"tables_{account}"
        if postprocess is None:
            del document["postprocess"]
        release(ReleaseSpec.model_validate(document), counts, ledger)
    rows = {row["account"]: row for row in ledger.charges()}
    assert (rows["plain"]["amount"], rows["plain"]["delta_amount"]) == (rows["post"]["amount"],
                                                                         rows["post"]["delta_amount"])
    assert ledger.account("plain").spent == ledger.account("post").spent > 0


# -- replay ----------------------------------------------------------------------------------------------------------


def test_a_replay_returns_the_stored_release_and_charges_nothing(counts, tmp_path, monkeypatch):
    spec = spec_with()
    ledger = new_ledger(tmp_path / "ledger.db")
    first = run_release(spec, counts, ledger, key(), spec_hash="0" * 64)
    spent = ledger.account(ACCOUNT).spent

    def never(*args, **kwargs):
        raise AssertionError("a replay must not post-process again")

    monkeypatch.setattr(consistent_module, "consistent_cells", never)
    second = run_release(spec, lambda: pytest.fail("a replay reads no aggregates"), ledger, key(),
                         spec_hash="0" * 64)
    assert not first.replayed and second.replayed
    assert json.dumps(second.output, sort_keys=True) == json.dumps(first.output, sort_keys=True)
    assert len(list(ledger.charges())) == 1 and ledger.account(ACCOUNT).spent == spent


# -- public parameters only ------------------------------------------------------------------------------------------


def test_the_post_processing_receives_noised_values_only(counts, tmp_path, monkeypatch):
    spec = spec_with()
    seen = []
    original = consistent_module.consistent_cells

    def recording(*args, **kwargs):
        seen.append((args, kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(consistent_module, "consistent_cells", recording)
    release(spec, counts, new_ledger(tmp_path / "ledger.db"))
    ((args, kwargs),) = seen
    assert kwargs == {}
    plan, noised, alpha, planned = args
    assert isinstance(plan, ReleasePlan) and plan.spec is spec
    # the planned families hold public structure only: cell maps, variances, allowances, accuracies
    assert [p.family.names for p in planned] == [tuple(FAMILY)]
    assert alpha == pytest.approx(0.05)
    assert set(noised) == {(name, "count") for name in FAMILY}
    truth = true_vectors(spec, counts)
    for name in FAMILY:
        vector = noised[(name, "count")]
        assert isinstance(vector, np.ndarray) and vector.dtype.kind in "iO" and vector.shape == truth[name].shape
    # the noised vectors are not the true counts (discrete Gaussian sigma ~7 on 51 values: all equal has
    # probability below 1e-50)
    assert any(not np.array_equal(noised[(name, "count")], truth[name]) for name in FAMILY)
    assert not np.array_equal(noised[(BASE, "count")], truth[BASE])
    # nothing else reaches it: no argument is, or holds, the upstream aggregates
    assert all(arg is not counts for arg in args)


def _hand_noised(truth: dict[str, np.ndarray], noise: dict[str, np.ndarray]):
    return {(name, "count"): truth[name] + noise[name] for name in truth}


@pytest.mark.parametrize("postprocess", [pytest.param(EXAMPLE, id="nonnegative integer"),
                                         pytest.param(CONSISTENT_ONLY, id="consistent only")])
def test_two_true_tables_with_the_same_noised_values_publish_the_same(counts, postprocess):
    """make_consistent is a function of the noised values: Adult and Adult minus one person, with noise drawn so
    that both give the same noised vectors, yield identical published cells, half-widths and descriptions."""
    spec = spec_with(postprocess)
    plan = plan_release(spec, accountant="zcdp")
    (layout,) = consistent_module.plan_families(plan)
    first = true_vectors(spec, counts)
    second = true_vectors(spec, without_one_person(counts))
    assert any(not np.array_equal(first[n], second[n]) for n in FAMILY)
    noise = {name: plan.step(name, "count").draw() for name in FAMILY}
    noise_for_second = {name: noise[name] + first[name] - second[name] for name in FAMILY}
    results = [make_consistent(plan, layout, _hand_noised(truth, n), 0.05)
               for truth, n in ((first, noise), (second, noise_for_second))]
    assert results[0] is not None
    assert results[0].description == results[1].description
    for name in FAMILY:
        a, b = results[0].cells[name], results[1].cells[name]
        assert a.published.dtype == b.published.dtype
        assert np.array_equal(a.published, b.published) and np.array_equal(a.half_width, b.half_width)
    # negative control: other noised values give other published values
    other = make_consistent(plan, layout, _hand_noised(first, {n: v + 50 for n, v in noise.items()}), 0.05)
    assert not np.array_equal(other.cells[BASE].published, results[0].cells[BASE].published)


def _seen(output: dict | None, ledger) -> dict:
    """What an observer sees of a release besides the noised values: the output without ``value`` (and the
    release time), every charge and audit event without volatile fields."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(json.loads(v) if k in ("mechanisms", "details") and isinstance(v, str) else v)
                    for k, v in value.items() if k not in NOISED and k not in VOLATILE}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return {"output": strip(output), "charges": strip(list(ledger.charges())), "events": strip(list(ledger.events()))}


@pytest.mark.parametrize("postprocess", [pytest.param(EXAMPLE, id="nonnegative integer"),
                                         pytest.param(CONSISTENT_ONLY, id="consistent only")])
def test_neighbouring_inputs_look_the_same_except_the_values(counts, tmp_path, postprocess):
    spec = spec_with(postprocess)
    seen = []
    for label, aggregates in (("adult", counts), ("minus_one", without_one_person(counts))):
        ledger = new_ledger(tmp_path / f"{label}.db")
        seen.append(_seen(release(spec, aggregates, ledger), ledger))
    assert seen[0]["output"]["aggregates"][TOTAL]["consistency"]["applied"] is True
    assert "half_width" in seen[0]["output"]["aggregates"][TOTAL]  # kept: half-widths are public
    assert seen[0] == seen[1]


def test_the_neighbour_comparison_catches_a_value_in_the_consistency_block(counts, tmp_path, monkeypatch):
    """Negative control: a description that carried a (noised) value would differ between the two runs."""
    original = consistent_module.make_consistent

    def leaky(plan, layout, noised, alpha):
        result = original(plan, layout, noised, alpha)
        result.description["noised_base"] = noised[(BASE, "count")].tolist()
        return result

    monkeypatch.setattr(consistent_module, "make_consistent", leaky)
    spec = spec_with()
    seen = []
    for label, aggregates in (("adult", counts), ("minus_one", without_one_person(counts))):
        ledger = new_ledger(tmp_path / f"{label}.db")
        seen.append(_seen(release(spec, aggregates, ledger), ledger))
    assert seen[0]["output"] != seen[1]["output"]


# -- saturation ------------------------------------------------------------------------------------------------------


def _huge_sums_spec() -> ReleaseSpec:
    """A sum over 200 keys (each person in up to 200 of them) and its total, with the widest bounds and smallest
    budget the spec allows: the sum's discrete Laplace scale is 200 * 1e12 / 1e-4 = 2e18 grid units, so its
    half-width passes the engine's value limit (2^62, about 4.6e18) and every noised value of it may be saturated
    (publish.py), whatever the data."""
    def aggregate(name, **keys):
        entry = {"name": name, "kind": "sum", "bounds": [0, 10**12], "mechanism": "discrete_laplace",
                 "budget": {"epsilon": "1e-4"}}
        if keys:
            entry.update(group_by=list(keys), keys=keys)
        return entry

    return ReleaseSpec.model_validate({
        "version": 1, "release": "huge_sums", "budget_account": "sums", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": 200},
        "aggregates": [aggregate("income_by_x", x=list(range(200))), aggregate("income")],
        "postprocess": {"consistent": [["income_by_x", "income"]], "nonnegative": True},
    })


def test_a_family_that_may_be_saturated_is_published_as_released(tmp_path):
    spec = _huge_sums_spec()
    plan = plan_release(spec, accountant="pure_dp")
    assert plan.step("income_by_x", "sum").noise_half_width_units(0.05) > SATURATION  # the premise
    ledger = make_ledger(tmp_path / "sums.db", cap="1", accountant="pure_dp", dags=(DAG,), account="sums")
    upstream = {"income_by_x": [{"x": x, "sum": 10} for x in range(200)], "income": 2000}
    output = run_release(spec, upstream, ledger, ReleaseKey(dag_id=DAG, run_id="r", task_id="release", map_index=-1,
                                                            release_name="huge_sums"), spec_hash="0" * 64).output
    for name in ("income_by_x", "income"):
        assert output["aggregates"][name]["consistency"] == {
            "family": ["income_by_x", "income"], "applied": False,
            "reason": "a member may be saturated: published as released"}
    rows = output["aggregates"]["income_by_x"]["rows"]
    assert len(rows) == 200 and all(row["saturated"] is True and row["half_width"] is None for row in rows)
    total = output["aggregates"]["income"]
    assert total.get("saturated") or total["half_width"] == plan.step("income", "sum").half_width(1 - spec.confidence)
    assert len(list(ledger.charges())) == 1


def test_make_consistent_declines_counts_near_the_value_limit():
    """A count family whose noised total lies within one noise half-width of 2^62 is not post-processed."""
    spec = spec_with()
    plan = plan_release(spec, accountant="zcdp")
    (layout,) = consistent_module.plan_families(plan)
    noised = {(name, "count"): np.full(plan.step(name, "count").partitions, 10, dtype=np.int64) for name in FAMILY}
    assert make_consistent(plan, layout, noised, 0.05) is not None  # control: ordinary values are post-processed
    noised[(TOTAL, "count")] = np.array([SATURATION - 3], dtype=np.int64)
    assert make_consistent(plan, layout, noised, 0.05) is None
    assert consistent_module._may_saturate(plan, layout.family, noised, 0.05)
    described = consistent_module.consistent_cells(plan, noised, 0.05)
    assert described[0] == {} and described[1][BASE]["applied"] is False


class _PostProcessingFault(Exception):
    """Raised inside the post-processing by the tests below; its message stands for data that must not be logged."""


FAULT_MARKER = "DATA-IN-THE-MESSAGE-4242"


@pytest.mark.parametrize(("target", "error"), [
    pytest.param("least squares", RuntimeError, id="the least-squares fit raises RuntimeError"),
    pytest.param("non-negative fit", ValueError, id="the non-negative fit raises ValueError"),
    pytest.param("controlled rounding", _PostProcessingFault, id="the controlled rounding raises another Exception"),
])
def test_a_family_whose_post_processing_fails_after_the_noise_is_published_as_released(counts, tmp_path,
                                                                                       monkeypatch, caplog, target,
                                                                                       error):
    """docs/consistency.md, ADR 0027: a failure after the noise is drawn does not abort the release (the charge is
    spent): the family is published as released, ``applied: false`` with the exception's type as the reason, values
    the raw noised ones (neither clamped nor made non-negative: the example asks for both), intervals the raw ones;
    the warning names only the exception's type. True counts of 0 make about half the noised base cells negative."""
    from dp_operators.consistency import rounding

    def fails(*args, **kwargs):
        raise error(f"{FAULT_MARKER}: a message that could hold data")

    if target == "least squares":
        monkeypatch.setattr(consistent_module, "fit", fails)
    elif target == "non-negative fit":
        monkeypatch.setattr(rounding, "nonnegative_fit", fails)
    else:
        monkeypatch.setattr(rounding, "controlled_rounding", fails)
    seen = []
    original = consistent_module.consistent_cells

    def recording(plan, noised, *args, **kwargs):
        seen.append({name: vector.copy() for name, vector in noised.items()})
        return original(plan, noised, *args, **kwargs)

    monkeypatch.setattr(consistent_module, "consistent_cells", recording)
    zeros = copy.deepcopy(counts)
    for name in (BASE, BY_EDUCATION, BY_SEX):
        for row in zeros[name]:
            row["count"] = 0
    zeros[TOTAL] = 0
    spec = spec_with()
    assert spec.postprocess.clamp_nonnegative and spec.postprocess.nonnegative  # both would lift negatives
    ledger = new_ledger(tmp_path / "ledger.db")
    with caplog.at_level(logging.DEBUG):
        output = release(spec, zeros, ledger)
    assert [c["state"] for c in ledger.charges()] == ["committed"] and ledger.account(ACCOUNT).spent == Fraction(4, 100)
    (noised,) = seen
    plan = plan_release(spec, accountant="zcdp")
    reason = f"post-processing failed ({error.__name__}): published as released"
    for name in FAMILY:
        published = output["aggregates"][name]
        assert published["consistency"] == {"family": list(FAMILY), "applied": False, "reason": reason}
        rows = published["rows"] if published["group_by"] else [published]
        assert [r["value"] for r in rows] == noised[(name, "count")].tolist(), name
        assert {r["half_width"] for r in rows} == {plan.step(name, "count").half_width(1 - spec.confidence)}, name
    assert min(r["value"] for r in output["aggregates"][BASE]["rows"]) < 0  # not clamped
    warnings = [r for r in caplog.records if r.name == consistent_module.log.name and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and error.__name__ in warnings[0].getMessage()
    assert all(FAULT_MARKER not in r.getMessage() and r.exc_info is None for r in caplog.records)
    assert FAULT_MARKER not in json.dumps(output) + json.dumps(list(ledger.events()), default=str)


# -- rows files ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("postprocess", [pytest.param(EXAMPLE, id="nonnegative integer"),
                                         pytest.param(CONSISTENT_ONLY, id="consistent only")])
def test_a_large_member_writes_a_rows_file_whose_values_add_up(counts, tmp_path, postprocess):
    spec = spec_with(postprocess)
    store = LocalRowsStore(tmp_path / "rows")
    output = release(spec, counts, new_ledger(tmp_path / "ledger.db"), rows_store=store, inline_rows_limit=10)
    plain = release(spec_with(None), counts, new_ledger(tmp_path / "plain.db"))
    filed = {}
    for name in (BASE, BY_EDUCATION):  # 32 and 16 cells: above the limit of 10
        published = output["aggregates"][name]
        assert "rows" not in published and published["consistency"]["applied"] is True
        table = pq.read_table(published["rows_file"]["uri"]).to_pylist()
        assert len(table) == published["rows_file"]["rows"]
        filed[name] = {tuple(json.loads(row["key"]).values()): (row["value"], row["half_width"]) for row in table}
        assert all(row["aggregate"] == name and row["saturated"] is False for row in table)
        assert all(row["lower"] <= row["value"] - row["half_width"] and row["upper"] >= row["value"] + row["half_width"]
                   for row in table)
    assert len(filed[BASE]) == 32 and len(filed[BY_EDUCATION]) == 16
    base = {k: v for k, (v, _) in filed[BASE].items()}
    if postprocess.get("integer"):
        assert all(v == int(v) and v >= 0 for v in base.values())
    assert_adds_up({k: v for k, (v, _) in filed[BY_EDUCATION].items()}, base, lambda k: (k[0],))
    assert_adds_up({k: v for k, (v, _) in cells(output, BY_SEX).items()}, base, lambda k: (k[1],))
    assert_adds_up({k: v for k, (v, _) in cells(output, TOTAL).items()}, base, lambda k: ())
    # per-row half-widths, each narrower than the margin's half-width released alone
    (raw_width,) = {w for _, w in cells(plain, BY_EDUCATION).values()}
    assert all(0 < w < raw_width for _, w in filed[BY_EDUCATION].values())
    assert all(w > 0 for _, w in filed[BASE].values())


# -- a key hierarchy: age band > age ---------------------------------------------------------------------------------

AGES = list(range(17, 91))
BANDS = {"17-24": range(17, 25), "25-34": range(25, 35), "35-44": range(35, 45), "45-54": range(45, 55),
         "55-64": range(55, 65), "65-74": range(65, 75), "75+": range(75, 91)}


@pytest.fixture(scope="session")
def age_counts(adult_csv) -> dict:
    import pandas as pd

    ages = pd.read_csv(adult_csv, usecols=["age"])["age"]
    by_age = ages.value_counts()
    band_of = {a: band for band, members in BANDS.items() for a in members}
    by_band = ages.map(band_of).value_counts()
    return {"people_by_age": [{"age": int(a), "count": int(c)} for a, c in by_age.items()],
            "people_by_age_band": [{"age_band": b, "count": int(c)} for b, c in by_band.items()],
            "people": int(len(ages))}


def age_spec(postprocess: dict | None) -> ReleaseSpec:
    def count(name, **keys):
        entry = {"name": name, "kind": "count", "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}}
        if keys:
            entry.update(group_by=list(keys), keys=keys)
        return entry

    document = {"version": 1, "release": "adult_age_bands", "budget_account": ACCOUNT, "privacy_unit": "person",
                "aggregates": [count("people_by_age", age=AGES), count("people_by_age_band", age_band=list(BANDS)),
                               count("people")]}
    if postprocess is not None:
        hierarchy = {"parent": "age_band", "child": "age", "groups": {b: list(a) for b, a in BANDS.items()}}
        document["postprocess"] = {**postprocess, "hierarchies": [hierarchy]}
    return ReleaseSpec.model_validate(document)


@pytest.mark.parametrize("postprocess", [pytest.param(EXAMPLE, id="nonnegative integer"),
                                         pytest.param(CONSISTENT_ONLY, id="consistent only")])
def test_a_hierarchy_family_publishes_bands_that_are_sums_of_ages(age_counts, tmp_path, postprocess):
    assert sum(r["count"] for r in age_counts["people_by_age"]) == age_counts["people"]  # every age is in 17..90
    spec = age_spec(postprocess)
    output = release(spec, age_counts, new_ledger(tmp_path / "ages.db"))
    plain = release(age_spec(None), age_counts, new_ledger(tmp_path / "plain.db"))
    ages = {k: v for k, (v, _) in cells(output, "people_by_age").items()}
    bands = {k: v for k, (v, _) in cells(output, "people_by_age_band").items()}
    band_of = {a: band for band, members in BANDS.items() for a in members}
    assert len(ages) == 74 and list(bands) == [(b,) for b in BANDS]
    assert_adds_up(bands, ages, lambda k: (band_of[k[0]],))
    assert_adds_up({k: v for k, (v, _) in cells(output, "people").items()}, ages, lambda k: ())
    assert_adds_up({k: v for k, (v, _) in cells(output, "people").items()}, bands, lambda k: ())
    block = output["aggregates"]["people_by_age_band"]["consistency"]
    assert block["applied"] is True and block["base"] == "people_by_age" and block["variance"] == "exact"
    if postprocess.get("integer"):
        assert all(type(v) is int and v >= 0 for v in [*ages.values(), *bands.values()])
    # published = least squares + rounding: 1 for a member whose controlled rounding held (integer), the exact-sums
    # step otherwise; the least-squares part is narrower than the raw half-width (with integer the published one
    # of the total may not be: 13.3 + 1 against 14.0)
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = consistent_module.plan_families(plan)
    least_squares = dict(zip(planned.family.names, half_widths(planned.family, planned.accuracies, 0.05)))
    for name in ("people_by_age", "people_by_age_band", "people"):
        published = np.array([w for _, w in cells(output, name).values()])
        rounding = 1.0 if name in output["aggregates"][name]["consistency"].get("controlled_rounding", ()) else 0.0
        np.testing.assert_allclose(published, least_squares[name] + rounding, rtol=0, atol=1e-9)
    if postprocess.get("integer"):
        assert block["controlled_rounding"] == ["people_by_age", "people_by_age_band", "people"]  # a laminar chain
    for name in ("people_by_age_band", "people"):
        (raw_width,) = {w for _, w in cells(plain, name).values()}
        assert float(least_squares[name].max()) < raw_width, name
