"""Consistent releases end to end: ``config/releases/adult_education_sex.yaml`` on the true UCI Adult
counts through :func:`run_release` with a real SQLite ledger. Every published margin is the sum of its cells exactly;
the post-processed half-widths shrink; the charge is the same with and without post-processing; a replay returns
the stored release; the post-processing sees noised values only, and what an observer sees besides them does not
depend on one person; a family that may be saturated, or whose post-processing fails after the noise is drawn, is
published as released; a large member's rows file adds up; a key hierarchy (age band > age) adds up the same way.
Upstream values of other types, many-way tables after the charge, and families refused before the reservation (and at
the DAG import) complete the user's view."""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import random
import re
from collections import Counter
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import dp_operators.consistency.rounding as rounding
import dp_operators.release.consistent as consistent_module
from dp_operators.cli import app
from dp_operators.ledger import ReleaseKey
from dp_operators.consistency import half_widths
from dp_operators.release import (
    SATURATION,
    LocalRowsStore,
    ReleaseAbortedError,
    ReleaseConfigError,
    ReleaseInputError,
    ReleasePlan,
    plan_release,
    run_release,
)
from dp_operators.release.consistent import make_consistent
from dp_operators.spec import ReleaseSpec, SpecError, load_spec
from dp_operators.spec.families import consistent_families
from dp_operators.spec.yaml12 import load_yaml

from adult_families import BANDS, consistent_dag_module, count, document, example_with, write
from adult_families import EXAMPLE as SPEC_PATH
from adult_families import age_spec as age_spec_file
from support import make_ledger

DAG = "adult_consistent_release"
ACCOUNT = "census_adult_tables"
BASE, BY_EDUCATION, BY_SEX, TOTAL = FAMILY = ("people_by_education_sex", "people_by_education", "people_by_sex",
                                             "people")
#: what the published consistency block of a post-processed member holds
DESCRIPTION = {"applied", "family", "base", "estimator", "variance", "nonnegative", "integer"}
NOISED = {"value", "released_at"}
VOLATILE = {"id", "created_at", "row_hash", "prev_hash", "output_digest", "context", "charge_id", "updated_at",
            "token_hash", "proof", "lease_expires_at"}


@pytest.fixture(scope="session")
def counts(adult_csv) -> dict:
    """True counts of Adult by education x sex, education, sex and in total: the example DAG's upstream task."""
    return consistent_dag_module().compute_education_sex_counts(adult_csv)


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


def new_ledger(path, account: str = ACCOUNT, cap: str = "10"):
    return make_ledger(path, cap=cap, dags=(DAG,), account=account)


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
    """Post-processing spends nothing: the ledger charges the same with and without it."""
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
    def age_count(name, **keys):
        entry = {"name": name, "kind": "count", "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}}
        if keys:
            entry.update(group_by=list(keys), keys=keys)
        return entry

    spec = {"version": 1, "release": "adult_age_bands", "budget_account": ACCOUNT, "privacy_unit": "person",
                "aggregates": [age_count("people_by_age", age=AGES),
                               age_count("people_by_age_band", age_band=list(BANDS)),
                               age_count("people")]}
    if postprocess is not None:
        hierarchy = {"parent": "age_band", "child": "age", "groups": {b: list(a) for b, a in BANDS.items()}}
        spec["postprocess"] = {**postprocess, "hierarchies": [hierarchy]}
    return ReleaseSpec.model_validate(spec)


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


# -- the example and other families as a user writes them -------------------------------------------------------

runner = CliRunner()


@pytest.fixture(scope="session")
def adult(adult_csv) -> pd.DataFrame:
    return pd.read_csv(adult_csv, skipinitialspace=True)


def states(ledger) -> list[str]:
    return [charge["state"] for charge in ledger.charges()]


def assert_example_adds_up(output: dict) -> None:
    """The example's margins are the exact (Python int) sums of its cells, however large."""
    base = {k: v for k, (v, _) in cells(output, BASE).items()}
    education, sex = Counter(), Counter()
    for (e, s_), value in base.items():
        education[e] += value
        sex[s_] += value
    assert {k[0]: v for k, (v, _) in cells(output, BY_EDUCATION).items()} == dict(education)
    assert {k[0]: v for k, (v, _) in cells(output, BY_SEX).items()} == dict(sex)
    assert output["aggregates"][TOTAL]["value"] == sum(base.values())


def beyond_2_53(counts: dict) -> dict:
    """The example's counts with 10^16 more people in HS-grad x Male (and in its margins): a data value."""
    big = 10**16

    def more(rows: list[dict], **where) -> list[dict]:
        return [dict(r, count=r["count"] + (big if all(r[c] == v for c, v in where.items()) else 0)) for r in rows]

    return {BASE: more(counts[BASE], education="HS-grad", sex="Male"),
            BY_EDUCATION: more(counts[BY_EDUCATION], education="HS-grad"),
            BY_SEX: more(counts[BY_SEX], sex="Male"),
            TOTAL: counts[TOTAL] + big}


def _underflowing_spec(tmp_path):
    """The example with rho 1000 on people_by_sex: a valid document whose member's noise variance is 0."""
    text = SPEC_PATH.read_text()
    tail = text[text.index("  - name: people_by_sex"):]
    return write(tmp_path, text.replace(tail, tail.replace("budget: {rho: 0.01}", "budget: {rho: 1000}"), 1))


def test_the_example_is_charged_its_planned_rho_and_publishes_the_documented_half_width(counts, tmp_path):
    """The example publishes non-negative integer cells that add up, is charged rho 4/100 exactly, keeps every
    member's controlled-rounding guarantee, and publishes the total's half-width 12.29 of README and
    docs/consistency.md."""
    ledger = new_ledger(tmp_path / "ledger.db")
    spec = load_spec(SPEC_PATH)
    output = release(spec, counts, ledger)
    assert_example_adds_up(output)
    values = [r["value"] for r in output["aggregates"]["people_by_education_sex"]["rows"]]
    assert all(type(v) is int and v >= 0 for v in values)
    assert Fraction(output["charge"]["rho_exact"]) == Fraction(4, 100) == ledger.account(ACCOUNT).spent
    block = output["aggregates"]["people"]["consistency"]
    assert block["applied"] and block["base"] == "people_by_education_sex" and block["variance"] == "exact"
    assert block["controlled_rounding"] == list(block["family"])  # a two-way table: every member keeps its guarantee
    # least squares 11.29 (q sd = 10.98 plus the continuity correction), plus 1 for the controlled rounding: 12.29
    # (README, docs/consistency.md)
    assert output["aggregates"]["people"]["half_width"] == pytest.approx(12.2917, abs=1e-4)


@pytest.mark.parametrize("convert", [
    pytest.param(lambda c: {**c, "people": np.int64(c["people"]),
                            "people_by_sex": [dict(r, count=np.int64(r["count"])) for r in c["people_by_sex"]]},
                 id="numpy ints"),
    pytest.param(lambda c: {name: ([dict(r, count=Decimal(r["count"])) for r in value] if isinstance(value, list)
                                   else Decimal(value)) for name, value in c.items()}, id="Decimal"),
])
def test_upstream_numpy_ints_and_decimals_are_released_consistent(counts, tmp_path, convert):
    """Upstream counts given as numpy ints or Decimals are released like Python ints, margins adding up."""
    output = release(load_spec(SPEC_PATH), convert(counts), new_ledger(tmp_path / "ledger.db"))
    assert_example_adds_up(output)


@pytest.mark.parametrize(("convert", "message"), [
    pytest.param(lambda c, t: {**c, "people_by_sex": t["sex"].value_counts()}, "got Series", id="a pandas Series"),
    pytest.param(lambda c, t: {**c, "people": pd.Series([len(t)])}, "holds a pandas.Series", id="a Series total"),
    pytest.param(lambda c, t: {**c, "people_by_sex": t.groupby("sex").size().rename("count").reset_index()},
                 "to_dict('records')", id="a DataFrame"),
])
def test_upstream_pandas_objects_are_refused_before_any_charge(counts, adult, tmp_path, convert, message):
    """A pandas Series or DataFrame given as upstream counts is refused with the conversion to use, before any
    reservation."""
    ledger = new_ledger(tmp_path / "ledger.db")
    with pytest.raises(ReleaseInputError, match=re.escape(message)):
        release(load_spec(SPEC_PATH), convert(counts, adult), ledger)
    assert states(ledger) == []


def test_hours_per_week_by_sex_and_in_total_add_up_as_whole_non_negative_hours(adult, tmp_path):
    """A sum family (hours per week by sex and in total) with ``nonnegative`` and ``integer`` publishes whole
    non-negative hours that add up, charged rho 2/100."""
    aggregates = [{"name": "hours_by_sex", "kind": "sum", "group_by": ["sex"], "keys": {"sex": ["Female", "Male"]},
                   "bounds": [1, 99], "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}},
                  {"name": "hours_total", "kind": "sum", "bounds": [1, 99], "mechanism": "discrete_gaussian",
                   "budget": {"rho": 0.01}}]
    spec = load_spec(write(tmp_path, document("hours", aggregates, {
        "consistent": [["hours_by_sex", "hours_total"]], "nonnegative": True, "integer": True})))
    hours = adult["hours_per_week"].clip(1, 99)
    upstream = {"hours_by_sex": [{"sex": s, "sum": int(v)} for s, v in hours.groupby(adult["sex"]).sum().items()],
                "hours_total": int(hours.sum())}
    output = release(spec, upstream, new_ledger(tmp_path / "ledger.db"))
    rows = output["aggregates"]["hours_by_sex"]["rows"]
    assert all(type(r["value"]) is int and r["value"] >= 0 for r in rows)
    assert output["aggregates"]["hours_total"]["value"] == sum(r["value"] for r in rows)
    assert Fraction(output["charge"]["rho_exact"]) == Fraction(2, 100)


def test_odd_keys_unicode_huge_ints_and_empty_text_round_trip_and_add_up(tmp_path):
    """Keys 1, unicode text, 10**30, empty and blank text come back with their types and the margin adds up."""
    keys = [1, "ü", "日本", 10**30, "", " "]
    spec = load_spec(write(tmp_path, document("odd", [
        count("by_k_s", {"k": keys, "s": ["F", "M"]}), count("by_k", {"k": keys}), count("total")],
        {"consistent": True, "integer": True})))
    true = {(k, s): 1000 * (i + 1) + 7 * j for i, k in enumerate(keys) for j, s in enumerate("FM")}
    upstream = {"by_k_s": [{"k": k, "s": s, "count": c} for (k, s), c in true.items()],
                "by_k": [{"k": k, "count": true[(k, "F")] + true[(k, "M")]} for k in keys],
                "total": sum(true.values())}
    output = release(spec, upstream, new_ledger(tmp_path / "ledger.db"))
    base = cells(output, "by_k_s")
    margin = cells(output, "by_k")
    assert list(margin) == [(k,) for k in keys]  # types kept: 1 and 10**30 stay ints
    for (k,), (value, _) in margin.items():
        assert value == base[(k, "F")][0] + base[(k, "M")][0]


@pytest.mark.slow
def test_a_hundred_thousand_cell_table_with_margins_through_the_python_api(tmp_path):
    """A 500 x 200 table with its margins and total is released consistent through ``run_release``."""
    a_keys, b_keys = [f"a{i}" for i in range(500)], list(range(200))
    spec = load_spec(write(tmp_path, document("big", [
        count("by_ab", {"a": a_keys, "b": b_keys}), count("by_a", {"a": a_keys}), count("by_b", {"b": b_keys}),
        count("total")], {"consistent": True})))
    cells = np.random.default_rng(14).poisson(3, size=(500, 200))
    upstream = {"by_ab": [{"a": a, "b": b, "count": int(cells[i, j])} for i, a in enumerate(a_keys)
                          for j, b in enumerate(b_keys)],
                "by_a": [{"a": a, "count": int(cells[i].sum())} for i, a in enumerate(a_keys)],
                "by_b": [{"b": b, "count": int(cells[:, j].sum())} for j, b in enumerate(b_keys)],
                "total": int(cells.sum())}
    output = release(spec, upstream, new_ledger(tmp_path / "ledger.db"))
    base = np.array([r["value"] for r in output["aggregates"]["by_ab"]["rows"]]).reshape(500, 200)
    assert [r["value"] for r in output["aggregates"]["by_a"]["rows"]] == [sum(row.tolist()) for row in base]
    assert output["aggregates"]["total"]["consistency"]["applied"] is True


@pytest.mark.parametrize("case", ["example counts", "revenue sums"])
def test_an_integer_family_with_a_cell_beyond_2_53_is_released_with_exact_integer_margins(counts, tmp_path, case):
    """An ``integer: true`` family (the example's counts, or revenue sums) with a cell beyond 2^53 is rounded
    exactly and released, committed, margins adding up as integers (DESIGN.md 2.4: a data value never raises
    after the charge)."""
    if case == "example counts":
        spec, upstream = load_spec(SPEC_PATH), beyond_2_53(counts)
    else:
        bounds = [0, 10**9]  # e.g. revenue per person in cents; Linf 1e9 grid units is within the limits
        spec = load_spec(write(tmp_path, document("revenue", [
            {"name": "revenue_by_sex", "kind": "sum", "group_by": ["sex"], "keys": {"sex": ["Female", "Male"]},
             "bounds": bounds, "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}},
            {"name": "revenue_total", "kind": "sum", "bounds": bounds, "mechanism": "discrete_gaussian",
             "budget": {"rho": 0.01}}], {"consistent": [["revenue_by_sex", "revenue_total"]], "integer": True})))
        upstream = {"revenue_by_sex": [{"sex": "Female", "sum": 10**16}, {"sex": "Male", "sum": 7 * 10**15}],
                    "revenue_total": 17 * 10**15}
    ledger = new_ledger(tmp_path / "ledger.db")
    try:
        output = release(spec, upstream, ledger)
    except ReleaseAbortedError as aborted:
        pytest.fail(f"the release was charged ({states(ledger)}; spent {ledger.account(ACCOUNT).spent}) and then "
                    f"failed on a data value: {aborted.__cause__!r}")
    assert states(ledger) == ["committed"]
    for aggregate in spec.aggregates:
        assert output["aggregates"][aggregate.name]["consistency"]["applied"] is True, aggregate.name
    if case == "example counts":
        assert_example_adds_up(output)  # Python ints: exact, however large
        assert max(r["value"] for r in output["aggregates"]["people_by_education_sex"]["rows"]) > 2**53
    else:
        rows = output["aggregates"]["revenue_by_sex"]["rows"]
        assert all(type(r["value"]) is int for r in rows) and max(r["value"] for r in rows) > 2**53
        assert output["aggregates"]["revenue_total"]["value"] == sum(r["value"] for r in rows)


def test_a_band_is_published_near_its_true_count_and_a_base_missing_one_of_its_ages_is_refused(age_counts, tmp_path):
    """With every age listed, the 45-54 band's interval holds its true count; with age 50 missing from the base
    (the miss that put the band ~6 half-widths off) the spec is refused at load: no release, no charge."""
    truth = {r["age_band"]: r["count"] for r in age_counts["people_by_age_band"]}
    output = release(load_spec(age_spec_file(tmp_path)), age_counts, new_ledger(tmp_path / "ledger.db"))
    value, width = cells(output, "people_by_age_band")[("45-54",)]
    # 3 half-widths: a correct release misses by that much with probability ~1e-9
    assert abs(value - truth["45-54"]) <= 3 * width, (value, width, truth["45-54"])
    with pytest.raises(SpecError, match=r"\b50\b"):
        load_spec(age_spec_file(tmp_path, base_ages=[a for a in range(17, 91) if a != 50]))


def _underflowing_spec(tmp_path: Path) -> Path:
    text = SPEC_PATH.read_text()
    tail = text[text.index("  - name: people_by_sex"):]
    return write(tmp_path, text.replace(tail, tail.replace("budget: {rho: 0.01}", "budget: {rho: 1000}"), 1))


def test_a_member_whose_noise_variance_underflows_is_refused_before_any_reservation(counts, tmp_path):
    """rho 1000 on people_by_sex: its variance is 0 in binary64. The document is valid (spec load checks the
    document); planning the families refuses it with ReleaseConfigError naming the aggregate and the fix, before the
    ledger reserves anything."""
    ledger = new_ledger(tmp_path / "ledger.db", cap="10000")
    spec = load_spec(_underflowing_spec(tmp_path))
    with pytest.raises(ReleaseConfigError) as refused:
        release(spec, counts, ledger)
    message = str(refused.value)
    assert "'people_by_sex'" in message and "noise variance" in message and "smaller budget" in message, message
    assert states(ledger) == [] and ledger.account(ACCOUNT).spent == 0
    # control: the example, with rho 0.01 everywhere, is released from the same ledger
    release(load_spec(SPEC_PATH), counts, ledger)
    assert states(ledger) == ["committed"]


def test_dpctl_plan_prints_the_refusal_of_such_a_spec_without_a_traceback(tmp_path):
    """``dpctl spec plan`` and ``spec validate`` refuse a family member whose noise variance underflows with the
    aggregate and the fix, without a traceback; the example plans."""
    path = _underflowing_spec(tmp_path)
    planned = runner.invoke(app, ["spec", "plan", str(path), "--accountant", "zcdp"])
    assert planned.exception is None or isinstance(planned.exception, SystemExit), repr(planned.exception)
    assert planned.exit_code != 0, planned.output
    text = " ".join(planned.output.split())
    assert "Traceback" not in text and "'people_by_sex'" in text and "smaller budget" in text, text
    # validate plans the families too (dp_operators/cli/spec.py), refusing what the release would
    validated = runner.invoke(app, ["spec", "validate", str(path)])
    text = " ".join(validated.output.split())
    assert validated.exit_code != 0 and "'people_by_sex'" in text and "smaller budget" in text, validated.output
    # control: plan prints the example's families
    assert runner.invoke(app, ["spec", "plan", str(SPEC_PATH), "--accountant", "zcdp"]).exit_code == 0


@pytest.mark.parametrize("integer", [pytest.param(True, id="integer: +1"), pytest.param(False, id="no integer: +0")])
def test_plan_half_widths_are_the_least_squares_part_of_the_published_ones(counts, tmp_path, integer):
    """``dpctl spec plan --json`` prints the least-squares half-widths; the release publishes them plus 1 where
    controlled rounding holds (``integer: true``), and the plan's text says so."""
    path = SPEC_PATH if integer else write(tmp_path, example_with(integer="false"))
    planned = runner.invoke(app, ["spec", "plan", str(path), "--accountant", "zcdp", "--json"])
    assert planned.exit_code == 0, planned.output
    family = json.loads(planned.output)["consistent_families"][0]["half_widths"]
    output = release(load_spec(path), counts, new_ledger(tmp_path / "ledger.db"))
    for name, width in family.items():
        published = output["aggregates"][name]
        rows = published["rows"] if published["group_by"] else [published]
        if integer:  # every member keeps its controlled-rounding guarantee here: exactly 1 more
            assert name in published["consistency"]["controlled_rounding"]
        assert max(r["half_width"] for r in rows) == pytest.approx(width + (1 if integer else 0), abs=1e-6), name
    text = " ".join(runner.invoke(app, ["spec", "plan", str(path), "--accountant", "zcdp"]).output.split())
    assert ("integer rounding adds up to 1 more" in text) is integer, text


# -- many-way tables after the charge, and families every run refuses ----------------------------------------------


def _count_of(name: str, group_by: list[str], keys: dict | None, rho: float | str = "1/100") -> dict:
    aggregate = {"name": name, "kind": "count", "mechanism": "discrete_gaussian", "budget": {"rho": rho}}
    if group_by:
        aggregate.update(group_by=group_by, keys=keys)
    return aggregate


def _many_way(size: int, columns: int, postprocess: dict) -> dict:
    """A ``size``^``columns`` table of counts and every one of its margins down to the total (2^columns counts)."""
    names = "abcdefgh"[:columns]
    keys = {c: [f"{c}{i}" for i in range(size)] for c in names}
    aggregates = [_count_of("by_" + "".join(kept) if kept else "total", list(kept), {c: keys[c] for c in kept})
                  for r in range(columns, -1, -1) for kept in itertools.combinations(names, r)]
    return {"version": 1, "release": "many_way", "budget_account": ACCOUNT, "privacy_unit": "person",
            "aggregates": aggregates, "postprocess": postprocess}


def _true_counts(spec: ReleaseSpec, seed: int = 1) -> dict:
    """Upstream counts of the table and its margins, consistent (every margin the sum of the table's cells)."""
    rng = np.random.default_rng(seed)
    base = spec.aggregates[0]
    table = list(itertools.product(*(base.keys[c] for c in base.group_by)))
    values = dict(zip(table, rng.integers(0, 30, len(table)).tolist()))
    upstream = {}
    for aggregate in spec.aggregates:
        positions = [base.group_by.index(c) for c in aggregate.group_by]
        sums: dict[tuple, int] = {}
        for cell, value in values.items():
            projected = tuple(cell[p] for p in positions)
            sums[projected] = sums.get(projected, 0) + value
        if not aggregate.group_by:
            upstream[aggregate.name] = sums[()]
        else:
            upstream[aggregate.name] = [dict(zip(aggregate.group_by, k), count=v) for k, v in sums.items()]
    return upstream


def _recording_milp(monkeypatch, ledger=None) -> list[dict]:
    """Record every integer program of the controlled rounding: the charge states when it ran, HiGHS's message,
    the branch-and-bound nodes it used and whether it found a solution."""
    programs: list[dict] = []
    solve = rounding.milp

    def recording(*args, **kwargs):
        states_ = [row["state"] for row in ledger.charges()] if ledger is not None else None
        result = solve(*args, **kwargs)
        programs.append({"charge": states_, "message": result.message, "solved": result.x is not None,
                         "nodes": getattr(result, "mip_node_count", 0)})
        return result

    monkeypatch.setattr(rounding, "milp", recording)
    return programs


def test_controlled_rounding_after_the_charge_is_decided_by_the_node_limit_not_the_clock(tmp_path, monkeypatch):
    """A 3^5 table of counts with its 31 margins (``integer: true``), with the real limits: every integer program
    runs after the reservation and ends within MILP_NODE_LIMIT branch-and-bound nodes, none on the time limit, so
    the published values do not depend on the machine's speed (rounding.py). Counted: at most two programs (two
    chains of nested margins), where one program after another ran to the time limit before."""
    spec = ReleaseSpec.model_validate(_many_way(3, 5, EXAMPLE))
    ledger = new_ledger(tmp_path / "ledger.db", cap="1000")
    programs = _recording_milp(monkeypatch, ledger)
    output = release(spec, _true_counts(spec), ledger)
    assert output["aggregates"]["total"]["consistency"]["applied"] is True
    assert programs and all(p["charge"] == ["reserved"] for p in programs)  # all of it after the reservation
    clocked = [p["message"][:40] for p in programs if "Time limit" in p["message"]]
    assert clocked == [], f"{len(clocked)} of {len(programs)} rounding programs stopped on the time limit"
    assert all(p["nodes"] <= rounding.MILP_NODE_LIMIT for p in programs), programs
    assert len(programs) <= 2, [p["message"][:40] for p in programs]


def test_post_processing_a_six_way_table_with_its_margins_solves_at_most_two_integer_programs(monkeypatch):
    """A 3^6 table (729 cells) with its 63 margins, noised like a release, post-processed with the real limits:
    at most two integer programs, each solved within the node limit (before: 36 programs, each to the 120 s time
    limit, over an hour after the charge)."""
    spec = ReleaseSpec.model_validate(_many_way(3, 6, EXAMPLE))
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = consistent_module.plan_families(plan)
    rng = np.random.default_rng(1)
    base = rng.integers(0, 30, planned.family.base_cells)
    noised = {(m.name, "count"): (np.bincount(m.to_base, weights=base, minlength=m.cells)
                                  + rng.normal(0, 7, m.cells)).round().astype(np.int64)
              for m in planned.family.members}
    programs = _recording_milp(monkeypatch)
    result = make_consistent(plan, planned, noised, 0.05)
    assert result.description["integer"] is True
    assert 0 < len(programs) <= 2 and all(p["solved"] and "Time limit" not in p["message"] for p in programs)
    assert all(p["nodes"] <= rounding.MILP_NODE_LIMIT for p in programs), programs


def test_a_family_that_every_run_refuses_fails_the_dag_import(tmp_path):
    """A member at rho 30 (noise variance 1.9e-13 grid units^2, below the floor) is refused before the reservation
    by every run, and so the operator's ``load_planned_spec`` (the DAG import) refuses the spec too."""
    from dp_operators.operators.gate import load_planned_spec

    document_ = _many_way(2, 1, {"consistent": True})
    document_["aggregates"][0]["budget"] = {"rho": 30}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(document_))  # JSON is YAML
    spec = ReleaseSpec.model_validate(document_)
    ledger = new_ledger(tmp_path / "ledger.db", cap="1000")
    with pytest.raises(ReleaseConfigError, match="noise variance"):
        release(spec, {"by_a": [{"a": "a0", "count": 1}], "total": 1}, ledger)
    assert not list(ledger.charges())  # refused before anything was reserved
    with pytest.raises(SpecError, match="noise variance"):
        load_planned_spec(str(path))


def test_the_refused_family_is_a_budget_question_not_a_structure_one():
    """The control of the test above: the same family at rho 1/100 is planned, so the refusal is about the budget
    alone, which the DAG import knows."""
    spec = ReleaseSpec.model_validate(_many_way(2, 1, {"consistent": True}))
    (planned,) = consistent_module.plan_families(plan_release(spec, accountant="zcdp"))
    assert planned.family.names == ("by_a", "total")
    assert Fraction(spec.aggregates[0].budget.rho) == Fraction(1, 100)
