"""Quantiles and medians released from histograms over public bins: the spec, the plan and its charge, the release
end to end on the UCI Adult table, and what an observer sees on neighbouring histograms."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pydantic import ValidationError

from dp_operators.ledger import ReleaseKey
from dp_operators.release import ReleaseConfigError, plan_release, run_release
from dp_operators.release.quantiles import epsilon_for_rho
from dp_operators.spec.models import level_text
from dp_operators.spec import ReleaseSpec
from support import SHARED_DATA, make_ledger

DAG = "quantiles"


def _spec(*aggregates: dict, confidence: float = 0.95) -> ReleaseSpec:
    return ReleaseSpec.model_validate({"version": 1, "release": "quantiles", "budget_account": "acct",
                                       "privacy_unit": "person", "confidence": confidence,
                                       "aggregates": list(aggregates)})


def _median(**extra) -> dict:
    aggregate = {"name": "hours", "kind": "median", "bins": {"column": "hours_per_week", "edges": [1, 100],
                                                             "width": 1},
                 "mechanism": "exponential", "budget": {"epsilon": 1}}
    aggregate.update(extra)
    return aggregate


def _key(run: str = "run-1") -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run, task_id="release", map_index=-1, release_name="quantiles")


@pytest.fixture(scope="module")
def adult() -> pd.DataFrame:
    return pd.read_csv(SHARED_DATA / "adult.csv", usecols=["age", "sex", "hours_per_week"], skipinitialspace=True)


def _histogram(values: pd.Series, low: int, high: int) -> list[dict]:
    counts = values.clip(low, high - 1).value_counts()
    return [{"hours_per_week": int(value), "count": int(count)} for value, count in counts.items()]


def _true_quantile_bin(values: pd.Series, level: Fraction) -> int:
    ordered = np.sort(values.to_numpy())
    return int(ordered[math.ceil(level * len(ordered)) - 1])


# -- the spec ---------------------------------------------------------------------------------------------------

def test_a_median_is_read_as_counts_over_its_bins_appended_to_the_groups():
    spec = _spec(_median(group_by=["sex"], keys={"sex": ["Female", "Male"]}))
    aggregate = spec.aggregates[0]
    assert aggregate.group_by == ["sex", "hours_per_week"]
    assert aggregate.keys["hours_per_week"] == list(range(1, 100))
    assert aggregate.quantiles == [Fraction(1, 2)]
    assert aggregate.partition_count == 2 * 99
    assert aggregate.outer_group_by == ["sex"]
    again = ReleaseSpec.model_validate(spec.model_dump())  # a copy validates to the same aggregate
    assert again.aggregates[0].group_by == aggregate.group_by


def test_bins_labelled_by_index_take_fractional_edges():
    spec = _spec(_median(bins={"column": "b", "edges": [0, 0.5, 2, 7.25], "label": "index"}))
    assert spec.aggregates[0].keys["b"] == [1, 2, 3]


@pytest.mark.parametrize(("change", "message"), [
    ({"bounds": [0, 10]}, "takes no 'bounds'"),
    ({"group_by": ["hours_per_week"], "keys": {"hours_per_week": [1]}}, "do not list it in group_by"),
    ({"mechanism": "noised_cdf"}, "give budget {rho}"),
    ({"mechanism": "discrete_laplace"}, "exponential, noised_cdf or auto"),
    ({"quantiles": [0.1, 0.5]}, "use kind: quantile for quantiles [0.1, 0.5]"),
    ({"bins": {"column": "h", "edges": [0, 10], "width": 3}}, "whole number of bins"),
    ({"bins": {"column": "h", "edges": [0, 0.5, 1]}}, "label: index"),
    ({"bins": {"column": "h", "edges": [0, 2, 1], "label": "index"}}, "strictly increasing"),
    ({"partition_selection": {"budget": {"epsilon": 1, "delta": 1e-6}}}, "it needs group_by columns"),
    ({"group_by": ["sex"], "partition_selection": {"budget": {"epsilon": 1, "delta": 1e-6}},
      "mechanism": "noised_cdf", "budget": {"rho": 1}}, "use mechanism exponential (or auto"),
    ({"group_by": ["sex"], "keys": {"sex": ["F"]}, "partition_selection": {"budget": {"epsilon": 1, "delta": 1e-6}}},
     "not both"),
    ({"grid": 10}, "takes no 'grid'"),
    ({"group_by": ["quantile"], "keys": {"quantile": ["a", "b"]}}, "would be lost in the published rows"),
    ({"bins": {"column": "h", "edges": [17, 91]}}, "make one bin"),
    ({"mechanism": "noised_cdf", "budget": {"epsilon": 1, "delta": 1e-6}}, "got {epsilon, delta}"),
])
def test_a_quantile_spec_is_refused_with_its_fix(change, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        _spec(_median(**change))


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1])
def test_a_quantile_level_outside_the_open_interval_is_refused(level):
    with pytest.raises(ValidationError, match="strictly between 0 and 1"):
        _spec(_median(kind="quantile", quantiles=[level]))


def test_levels_are_published_as_written():
    assert [level_text(Fraction(q)) for q in ("1/2", "1/10", "1/8", "1/3")] == ["0.5", "0.1", "0.125", "1/3"]


# -- the plan and its charge -------------------------------------------------------------------------------------

def test_the_exponential_mechanism_is_charged_epsilon_squared_over_eight_on_zcdp_and_epsilon_on_pure_dp():
    spec = _spec(_median(kind="quantile", quantiles=[0.25, 0.75], budget={"epsilon": "2/5"}))
    assert plan_release(spec, accountant="zcdp").charge() == 2 * Fraction(1, 5) ** 2 / 8
    assert plan_release(spec, accountant="pure_dp").charge() == Fraction(2, 5)
    assert plan_release(spec, accountant="approx_dp").delta() == 0


def test_a_rho_budget_gives_the_exponential_mechanism_an_epsilon_within_it():
    assert epsilon_for_rho(Fraction(1, 50)) == Fraction(2, 5)  # a rational square root is exact
    for rho in (Fraction(1, 9), Fraction(1, 8), Fraction(7, 1000)):
        epsilon = epsilon_for_rho(rho)
        assert epsilon**2 / 8 <= rho < (epsilon + Fraction(1, 2**40)) ** 2 / 8
    spec = _spec(_median(budget={"rho": "1/9"}))
    assert plan_release(spec, accountant="zcdp").charge() <= Fraction(1, 9)


def test_the_noised_cdf_is_charged_its_rho_and_refused_where_zcdp_does_not_compose():
    spec = _spec(_median(kind="quantile", quantiles=[0.1, 0.9], mechanism="noised_cdf", budget={"rho": "1/2"}))
    assert plan_release(spec, accountant="zcdp").charge() == Fraction(1, 2)
    with pytest.raises(ReleaseConfigError, match="use mechanism exponential"):
        plan_release(spec, accountant="pure_dp")


def test_auto_takes_the_exponential_mechanism_for_a_median_and_the_cdf_for_nine_deciles():
    bins = {"column": "x", "edges": [0, 1000], "width": 1}
    median = _spec(_median(bins=bins, mechanism="auto", budget={"rho": 1}))
    deciles = _spec(_median(kind="quantile", quantiles=[Fraction(i, 10) for i in range(1, 10)], bins=bins,
                            mechanism="auto", budget={"rho": 1}))
    median_step = plan_release(median, accountant="zcdp").steps[0]
    decile_step = plan_release(deciles, accountant="zcdp").steps[0]
    assert median_step.mechanism == "exponential"
    assert decile_step.mechanism == "noised_cdf"
    # the choice is by the planned rank half-widths, which both record
    assert set(dict(decile_step.candidates)) == {"exponential", "noised_cdf"}
    assert dict(decile_step.candidates)["noised_cdf"] < dict(decile_step.candidates)["exponential"]
    # the exponential median's planned 95 % rank half-width: (ln m + ln 20) / epsilon ranks, epsilon = sqrt(8)
    assert median_step.rank_half_widths[0] == pytest.approx((math.log(1000) + math.log(20)) / math.sqrt(8),
                                                            rel=1e-6)


def test_a_unit_in_several_groups_is_charged_for_every_group_it_reaches():
    grouped = _median(group_by=["g"], keys={"g": ["a", "b", "c"]}, mechanism="noised_cdf", budget={"rho": 1},
                      bins={"column": "x", "edges": [0, 4], "width": 1})
    one = plan_release(_spec(grouped), accountant="zcdp").steps[0]
    spread = plan_release(_spec({**grouped, "contribution": {"max_partitions_contributed": 12}}),
                          accountant="zcdp").steps[0]
    # the charge is the budget in both cases; the noise grows with the groups the unit can reach (3 of 3)
    assert one.rho == spread.rho == 1
    assert spread.cdf_noise.noise_variance > 3 * one.cdf_noise.noise_variance


# -- the release ----------------------------------------------------------------------------------------------------

def test_the_median_of_adult_hours_per_week_is_released_within_its_rank_half_width(tmp_path, adult):
    spec = _spec(_median(budget={"epsilon": 1}))
    ledger = make_ledger(tmp_path / "l.db", cap="10", accountant="zcdp", dags=(DAG,), account="acct")
    output = run_release(spec, {"hours": _histogram(adult["hours_per_week"], 1, 100)}, ledger, _key(),
                         spec_hash="0" * 64).output
    published = output["aggregates"]["hours"]
    assert published["kind"] == "median" and published["mechanism"] == "exponential"
    assert published["group_by"] == ["quantile"]
    (row,) = published["rows"]
    assert row["quantile"] == "0.5"
    assert row["bin"] == [row["value"], row["value"] + 1]
    assert row["interval"] == [None, None] and row["half_width"] is None
    ordered = np.sort(adult["hours_per_week"].clip(1, 99).to_numpy())
    ranks = np.searchsorted(ordered, [row["value"], row["value"] + 1])
    target = len(ordered) / 2
    distance = max(0, ranks[0] - target, target - ranks[1])
    assert distance <= row["rank_half_width"]
    assert Fraction(list(ledger.charges())[0]["amount"]) == Fraction(1, 8)
    # a replay returns the committed output, charging nothing more
    again = run_release(spec, {}, ledger, _key(), spec_hash="0" * 64)
    assert again.replayed and again.output["aggregates"] == output["aggregates"]


def test_deciles_by_sex_from_one_noised_cdf_hold_the_true_deciles_in_their_intervals(tmp_path, adult):
    levels = [Fraction(i, 10) for i in range(1, 10)]
    spec = _spec(_median(kind="quantile", quantiles=levels, group_by=["sex"], keys={"sex": ["Female", "Male"]},
                         mechanism="noised_cdf", budget={"rho": "1/2"}))
    rows = []
    for sex, part in adult.groupby("sex"):
        rows += [{**row, "sex": sex} for row in _histogram(part["hours_per_week"], 1, 100)]
    ledger = make_ledger(tmp_path / "l.db", cap="10", accountant="zcdp", dags=(DAG,), account="acct")
    published = run_release(spec, {"hours": rows}, ledger, _key(), spec_hash="0" * 64).output["aggregates"]["hours"]
    assert published["mechanism"].startswith("noised_cdf:")
    assert published["group_by"] == ["sex", "quantile"]
    assert len(published["rows"]) == 18
    for row in published["rows"]:
        values = adult.loc[adult["sex"] == row["sex"], "hours_per_week"].clip(1, 99)
        truth = _true_quantile_bin(values, Fraction(row["quantile"]))
        low, high = row["interval"]
        assert low <= truth < high
        assert row["half_width"] == max(row["value"] - low, high - row["value"])


@pytest.mark.parametrize("form", ["list", "numpy", "decimal", "pandas", "arrow"])
def test_the_histogram_is_read_alike_from_every_upstream_type(tmp_path, form):
    rows = [{"x": 0, "count": 3}, {"x": 1, "count": 0}, {"x": 2, "count": 5}, {"x": 3, "count": 9}]
    if form == "numpy":
        rows = [{"x": np.int64(r["x"]), "count": np.int64(r["count"])} for r in rows]
    elif form == "decimal":
        rows = [{"x": r["x"], "count": Decimal(r["count"])} for r in rows]
    elif form == "pandas":
        rows = pd.DataFrame(rows).to_dict("records")
    elif form == "arrow":
        rows = pa.Table.from_pylist(rows)
    spec = _spec(_median(bins={"column": "x", "edges": [0, 4], "width": 1}, budget={"epsilon": 100}))
    ledger = make_ledger(tmp_path / "l.db", cap="10000", accountant="pure_dp", dags=(DAG,), account="acct")
    (row,) = run_release(spec, {"hours": rows}, ledger, _key(), spec_hash="0" * 64).output["aggregates"]["hours"][
        "rows"]
    assert row["value"] == 3  # 17 records: the target rank 8.5 lies in bin 3 (ranks 8..17); epsilon 100 is sure


@pytest.mark.parametrize("form", ["list", "pandas", "arrow"])
def test_labels_beyond_the_bins_are_counted_in_the_end_bins_on_every_upstream_type(tmp_path, form):
    """An unclipped histogram (a value below the first edge or beyond the last, width_bucket's 0 and m + 1) is
    read as the raw-row bounding reads the values: in the end bins, so its median is the clipped data's."""
    rows = [{"x": -5, "count": 3}, {"x": 0, "count": 2}, {"x": 2, "count": 5}, {"x": 9, "count": 20}]
    if form == "pandas":
        rows = pd.DataFrame(rows).to_dict("records")
    elif form == "arrow":  # the columnar reader
        rows = pa.Table.from_pylist(rows)
    spec = _spec(_median(bins={"column": "x", "edges": [0, 4], "width": 1}, budget={"epsilon": 100}))
    ledger = make_ledger(tmp_path / "l.db", cap="10000", accountant="pure_dp", dags=(DAG,), account="acct")
    (row,) = run_release(spec, {"hours": rows}, ledger, _key(), spec_hash="0" * 64).output["aggregates"]["hours"][
        "rows"]
    assert row["value"] == 3  # 5 + 5 + 20 records: the target rank 15 is in the last bin (2 if 9 were ignored)
    from dp_operators.release import check_aggregates

    seen = check_aggregates(spec, {"hours": rows}).as_dict()["aggregates"]["hours"]
    assert (seen["labels_beyond_bins"], seen["rows_outside_domain"]) == (2, 0)


def test_neighbouring_histograms_show_an_observer_the_same_run_but_for_the_released_bin(observe_quantiles):
    spec = _spec(_median(bins={"column": "x", "edges": [0, 8], "width": 1}, budget={"epsilon": 1}))
    base = [{"x": i, "count": c} for i, c in enumerate([0, 5, 0, 2, 9, 0, 0, 1])]
    neighbours = [base, base + [{"x": 7, "count": 1}], [dict(r, count=r["count"] + (r["x"] == 0)) for r in base]]
    seen = [observe_quantiles(spec, {"hours": rows}) for rows in neighbours]
    for error, records, charges, output in seen:
        assert error is None
    assert len({str(s[1]) for s in seen}) == 1  # the same log lines
    assert len({str([c["amount"] for c in s[2]]) for s in seen}) == 1  # the same charge
    shapes = [{name: sorted(row) for name, row in _rows(s[3]).items()} for s in seen]
    assert shapes[0] == shapes[1] == shapes[2]


def _rows(output: dict) -> dict:
    return {f"{name}:{i}": row for name, aggregate in output["aggregates"].items()
            for i, row in enumerate(aggregate["rows"])}


@pytest.fixture
def observe_quantiles(tmp_path, caplog):
    import logging

    runs = iter(range(10**6))

    def run(spec, aggregates):
        ledger = make_ledger(tmp_path / f"o{next(runs)}.db", cap="1000", accountant="zcdp", dags=(DAG,),
                             account="acct")
        caplog.clear()
        error = output = None
        with caplog.at_level(logging.DEBUG):
            try:
                output = run_release(spec, aggregates, ledger, _key(), spec_hash="0" * 64).output
            except Exception as caught:  # noqa: BLE001
                error = f"{type(caught).__name__}: {caught}"
        return error, [(r.name, r.levelname, r.getMessage()) for r in caplog.records], list(ledger.charges()), output

    return run


@pytest.mark.parametrize("mechanism", ["exponential", "noised_cdf"])
def test_neighbouring_histograms_cost_the_same_work(mechanism, tmp_path, monkeypatch):
    """The work of a draw is counted (never timed): the weights bounded, the noised prefixes decoded and compared
    are the same for a histogram and its neighbours."""
    from dp_operators.continual.noise import SeriesNoise
    from dp_operators.mechanisms import exponential
    from dp_operators.release import quantiles

    counted: dict[str, int] = {}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            counted[name] = counted.get(name, 0) + 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(exponential, "_weight_bounds", counting("weights", exponential._weight_bounds))
    monkeypatch.setattr(SeriesNoise, "total_noise", counting("decoded", SeriesNoise.total_noise))
    monkeypatch.setattr(quantiles, "_first_reaching", counting("searched", quantiles._first_reaching))
    budget = {"rho": "1/2"}
    spec = _spec(_median(kind="quantile", quantiles=[0.25, 0.5], bins={"column": "x", "edges": [0, 16], "width": 1},
                         mechanism=mechanism, budget=budget))
    base = [{"x": i, "count": c} for i, c in enumerate([0, 5, 0, 2, 9, 0, 0, 1, 40, 0, 0, 0, 3, 0, 0, 7])]
    neighbours = [base, base + [{"x": 15, "count": 1}], base + [{"x": 0, "count": 1}], []]
    work = []
    for run, rows in enumerate(neighbours):
        counted.clear()
        ledger = make_ledger(tmp_path / f"w{run}.db", cap="10", accountant="zcdp", dags=(DAG,), account="acct")
        run_release(spec, {"hours": rows}, ledger, _key(), spec_hash="0" * 64)
        work.append(dict(counted))
    assert work[0] and all(w == work[0] for w in work)
