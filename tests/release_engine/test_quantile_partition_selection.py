"""Quantiles over groups found in the data (``partition_selection``): the groups are selected by the noised number of
privacy units in each, then each kept group's histogram over the public bins is released as over public groups.
The spec and plan, the reading of the group's units from every upstream type, the release on the UCI Adult table
by native country, and what an observer sees when one person adds a group or joins one."""

from __future__ import annotations

import logging
import re
import sqlite3
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pydantic import ValidationError

from dp_operators.accounting.accountants import IncompatibleAccountantError
from dp_operators.ledger import ReleaseKey
from dp_operators.release import ReleaseInputError, plan_release, prepare_inputs, run_release
from dp_operators.release.inputs import check_aggregates
from dp_operators.spec import ReleaseSpec
from support import SHARED_DATA, make_ledger

DAG = "quantiles"
SELECTION = {"budget": {"epsilon": 1, "delta": "1/1000000"}}


def _spec(l0: int = 1, linf: int = 1, **extra) -> ReleaseSpec:
    aggregate = {"name": "hours", "kind": "median", "group_by": ["country"], "partition_selection": SELECTION,
                 "bins": {"column": "hours_per_week", "edges": [1, 100], "width": 1}, "mechanism": "auto",
                 "budget": {"epsilon": 1}}
    aggregate.update(extra)
    return ReleaseSpec.model_validate({
        "version": 1, "release": "quantiles", "budget_account": "acct", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": l0, "max_contributions_per_partition": linf},
        "aggregates": [aggregate]})


def _key(run: str = "run-1") -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run, task_id="release", map_index=-1, release_name="quantiles")


def _ledger(path):
    return make_ledger(path, cap="1000", accountant="approx_dp", dags=(DAG,), account="acct", delta=Fraction(1, 10))


def _upstream(people: pd.DataFrame, with_units: bool = True) -> list[dict]:
    """What an honest upstream returns: per (country, bin) its records, and each row its country's distinct
    people (``COUNT(DISTINCT person)`` joined on the country)."""
    counts = people.groupby(["country", "hours_per_week"], dropna=False).size().rename("count").reset_index()
    units = people.groupby("country")["person"].nunique().rename("units")
    rows = counts.join(units, on="country")
    return [{"country": r.country, "hours_per_week": None if pd.isna(r.hours_per_week) else int(r.hours_per_week),
             "count": int(r.count), **({"units": int(r.units)} if with_units else {})} for r in rows.itertuples()]


@pytest.fixture(scope="module")
def adult() -> pd.DataFrame:
    table = pd.read_csv(SHARED_DATA / "adult.csv", usecols=["native_country", "hours_per_week"],
                        skipinitialspace=True)
    return pd.DataFrame({"person": np.arange(len(table)), "country": table["native_country"],
                         "hours_per_week": table["hours_per_week"].clip(1, 99)})


# -- the spec and the plan --------------------------------------------------------------------------------------

def test_only_the_groups_come_from_the_data_the_bins_stay_public():
    aggregate = _spec().aggregates[0]
    assert not aggregate.public_keys and aggregate.partition_count is None
    assert aggregate.group_by == ["country", "hours_per_week"]
    assert aggregate.keys == {"hours_per_week": list(range(1, 100))}
    assert aggregate.outer_group_by == ["country"]


@pytest.mark.parametrize(("change", "message"), [
    ({"group_by": []}, "it needs group_by columns"),
    ({"mechanism": "noised_cdf", "budget": {"rho": 1}}, "use mechanism exponential (or auto"),
    ({"keys": {"country": ["a"]}}, "not both"),
    ({"partition_selection": {"budget": {"epsilon": 1}}}, "needs an approximate budget"),
])
def test_a_quantile_over_selected_groups_is_refused_with_its_fix(change, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        _spec(**change)


def test_the_groups_are_selected_by_units_then_each_kept_groups_median_drawn_and_both_charged():
    plan = plan_release(_spec(), accountant="approx_dp")
    selection, quantile = plan.steps
    assert selection.component == "selection" and selection.linf == 1 and selection.l0 == 1
    assert quantile.mechanism == "exponential"  # auto: the CDF cannot be charged beside the selection
    assert quantile.groups is None and quantile.partitions is None
    assert plan.charge() == 2  # epsilon 1 for the selection, 1 for the median
    assert plan.delta() == selection.threshold_delta
    described = quantile.describe()
    assert described["partitions"] is None and described["records_per_unit"] == 1


def test_a_units_reach_over_groups_is_the_declared_l0_since_the_groups_are_not_public():
    plan = plan_release(_spec(l0=3, linf=2), accountant="approx_dp")
    selection, quantile = plan.steps
    assert selection.l0 == 3 and selection.linf == 1  # a unit is one of each group's units, in up to 3 groups
    assert quantile.l0 == 3 and quantile.records_per_unit == 6  # up to 6 records over the groups' histograms


def test_a_zcdp_account_cannot_hold_the_selection_and_says_which_account_can():
    with pytest.raises(IncompatibleAccountantError, match="approx_dp"):
        plan_release(_spec(budget={"rho": "1/8"}), accountant="zcdp").charge()


# -- reading the groups' units ------------------------------------------------------------------------------------

ROWS = [
    {"country": "b", "hours_per_week": 40, "count": 3, "units": 4},
    {"country": "a", "hours_per_week": 10, "count": 2, "units": 5},
    {"country": "a", "hours_per_week": 99, "count": 3, "units": 5},
    {"country": "b", "hours_per_week": 41, "count": 1, "units": 4},
    {"country": "a", "hours_per_week": 10, "count": 1, "units": 5},  # a cell repeated: its counts add up
    {"country": "a", "hours_per_week": 100, "count": 7, "units": 5},  # beyond the last bin: counted in it
    {"country": "b", "hours_per_week": None, "count": 2, "units": 4},  # no bin: outside the histogram
]


def _as(form: str, rows: list[dict], spec: ReleaseSpec):
    if form == "numpy":
        return [{k: (np.int64(v) if isinstance(v, int) else v) for k, v in r.items()} for r in rows]
    if form == "decimal":
        return [{**r, "count": Decimal(r["count"]), "units": Decimal(r["units"])} for r in rows]
    if form == "pandas":
        return pd.DataFrame(rows).to_dict("records")
    if form == "arrow":
        return pa.Table.from_pylist(rows)
    if form == "sql":
        from dp_operators.operators.sources import query_aggregates

        connection = sqlite3.connect(":memory:")
        connection.execute("CREATE TABLE h (country TEXT, hours_per_week INTEGER, count INTEGER, units INTEGER)")
        connection.executemany("INSERT INTO h VALUES (?, ?, ?, ?)", [tuple(r.values()) for r in rows])

        class Hook:
            def get_conn(self):
                return connection

        query = "SELECT country, hours_per_week, count, units FROM h"
        return query_aggregates(Hook(), {"hours": query}, spec)["hours"]
    return rows


@pytest.mark.parametrize("form", ["list", "numpy", "decimal", "pandas", "arrow", "sql"])
def test_each_groups_bins_and_units_are_read_alike_from_every_upstream_type(form):
    spec = _spec(l0=2, linf=3)
    prepared = prepare_inputs(spec, {"hours": _as(form, ROWS, spec)})
    assert prepared.keys["hours"] == [("a",), ("b",)]
    # the bins with rows, sparse until the groups are selected: position g * m + i, i the bin's index
    cells = dict(zip(prepared.values[("hours", "cells")].tolist(), prepared.values[("hours", "count")].tolist()))
    assert cells == {10 - 1: 3, 99 - 1: 3 + 7, 99 + 40 - 1: 3, 99 + 41 - 1: 1}
    # a group's units are the number its rows repeat, not their sum
    assert prepared.values[("hours", "selection")].tolist() == [5, 4]


def test_one_record_per_person_makes_a_groups_records_its_units():
    rows = [{k: v for k, v in r.items() if k != "units"} for r in ROWS]
    prepared = prepare_inputs(_spec(), {"hours": rows})
    # a's 3 + 3 + 7, b's 3 + 1 in its bins and 2 in none
    assert prepared.values[("hours", "selection")].tolist() == [13, 6]


def test_rows_without_the_groups_units_are_refused_before_any_budget_when_a_person_has_several_records(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "units"} for r in ROWS]
    ledger = _ledger(tmp_path / "l.db")
    with pytest.raises(ReleaseInputError, match=r"missing field\(s\) \['units'\]: under partition_selection each "
                       r"row carries 'units', its group's number of distinct privacy units .*"
                       r"max_contributions_per_partition 2\); e\.g\. join COUNT\(DISTINCT unit\) \.\.\. "
                       r"GROUP BY country"):
        run_release(_spec(linf=2), {"hours": rows}, ledger, _key(), spec_hash="0" * 64)
    assert list(ledger.charges()) == []


def test_a_bin_label_of_another_type_is_refused_by_its_type():
    rows = [dict(r, hours_per_week=str(r["hours_per_week"])) for r in ROWS]
    with pytest.raises(ReleaseInputError, match="histogram column 'hours_per_week' holds str labels"):
        prepare_inputs(_spec(), {"hours": rows})


def test_check_aggregates_reports_a_label_outside_the_bins_and_groups_whose_rows_disagree_on_units():
    report = check_aggregates(_spec(l0=2, linf=3), {"hours": ROWS})
    assert report.ok
    seen = report.as_dict()["aggregates"]["hours"]
    assert (seen["labels_beyond_bins"], seen["rows_outside_domain"], seen["groups_with_differing_units"]) == (1, 1, 0)
    disagreeing = [*ROWS, {"country": "b", "hours_per_week": 7, "count": 1, "units": 9}]
    report = check_aggregates(_spec(l0=2, linf=3), {"hours": disagreeing})
    assert report.ok and report.as_dict()["aggregates"]["hours"]["groups_with_differing_units"] == 1


def test_a_group_whose_rows_all_miss_the_bins_is_a_candidate_with_its_units():
    """Were rows outside the bins to make no candidate, one unit's record in a bin would turn a group of a hundred
    units outside them (no value: a NULL bin) into a candidate of 101: a release with probability 1, not delta."""
    outside = [{"country": "x", "hours_per_week": None, "count": 100, "units": 100}]
    prepared = prepare_inputs(_spec(l0=2, linf=3), {"hours": outside})
    assert prepared.keys["hours"] == [("x",)] and prepared.values[("hours", "selection")].tolist() == [100]
    assert prepared.values[("hours", "cells")].tolist() == []
    joined = [{**outside[0], "units": 101}, {"country": "x", "hours_per_week": 40, "count": 1, "units": 101}]
    neighbour = prepare_inputs(_spec(l0=2, linf=3), {"hours": joined})
    assert neighbour.keys["hours"] == [("x",)] and neighbour.values[("hours", "selection")].tolist() == [101]


def test_only_the_kept_groups_histograms_are_filled():
    """The m bins of a candidate that is not kept cost nothing: the work of a group of one is its row, not m bins."""
    from dp_operators.release.run import select_groups

    class Kept:  # a selection step whose noise is 0: keeps the groups of at least 2 units
        component, threshold = "selection", 2

        @staticmethod
        def draw(size):
            return np.zeros(size, dtype=np.int64)

    units = np.array([5, 1, 3], dtype=np.int64)
    cells, counts = np.array([0, 3, 4 + 1, 8 + 2], dtype=np.int64), np.array([7, 2, 9, 4], dtype=np.int64)
    dense, groups = select_groups(Kept(), units, [("a",), ("b",), ("c",)], cells, counts, 4, drawn := [])
    assert groups == [("a",), ("c",)] and drawn == ["selection"]
    assert dense.tolist() == [7, 0, 0, 2, 0, 0, 4, 0]


# -- the release ----------------------------------------------------------------------------------------------------

def test_the_median_hours_of_adult_by_native_country_is_released_for_the_populous_countries_only(tmp_path, adult):
    ledger = _ledger(tmp_path / "l.db")
    output = run_release(_spec(), {"hours": _upstream(adult, with_units=False)}, ledger, _key(),
                         spec_hash="0" * 64).output
    published = output["aggregates"]["hours"]
    assert published["group_by"] == ["country", "quantile"]
    assert published["partition_selection"]["threshold"] == plan_release(_spec(), "approx_dp").steps[0].threshold
    released = {row["country"]: row for row in published["rows"]}
    people = adult["country"].value_counts()
    # the threshold (15 at epsilon 1, delta 1e-6) keeps countries of thousands and drops those of a few people;
    # either way fails with probability below 1e-6 here
    assert {"United-States", "Mexico", "?", "Philippines"} <= set(released)
    assert not set(released) & set(people[people <= 3].index)
    for country, row in released.items():
        ordered = np.sort(adult.loc[adult["country"] == country, "hours_per_week"].to_numpy())
        ranks = np.searchsorted(ordered, [row["value"], row["value"] + 1])
        target = len(ordered) / 2
        assert max(0, ranks[0] - target, target - ranks[1]) <= row["rank_half_width"]
    charge = list(ledger.charges())[0]
    assert Fraction(charge["amount"]) == 2
    again = run_release(_spec(), {}, ledger, _key(), spec_hash="0" * 64)
    assert again.replayed and again.output["aggregates"] == output["aggregates"]


# -- neighbouring inputs --------------------------------------------------------------------------------------------

@pytest.fixture
def observe(tmp_path, caplog):
    runs = iter(range(10**6))

    def run(spec, rows):
        ledger = _ledger(tmp_path / f"o{next(runs)}.db")
        caplog.clear()
        error = output = None
        with caplog.at_level(logging.DEBUG):
            try:
                output = run_release(spec, {"hours": rows}, ledger, _key(), spec_hash="0" * 64).output
            except Exception as caught:  # noqa: BLE001
                error = f"{type(caught).__name__}: {caught}"
        charges = [(c["amount"], c.get("delta_amount")) for c in ledger.charges()]
        return error, [(r.name, r.levelname, r.getMessage()) for r in caplog.records], charges, output

    return run


def _people(groups: dict[str, list[int]]) -> pd.DataFrame:
    records = [(country, hours) for country, hours_list in groups.items() for hours in hours_list]
    return pd.DataFrame({"person": range(len(records)), "country": [c for c, _ in records],
                         "hours_per_week": [h for _, h in records]})


BASE = {"A": [40] * 30 + [50] * 20 + [30] * 10, "B": [20] * 25 + [60] * 25}


@pytest.mark.parametrize("spec", [_spec(), _spec(l0=2, linf=2)], ids=["one record", "two groups, two records"])
def test_a_person_who_adds_a_group_or_joins_one_shows_an_observer_the_same_release_but_for_the_drawn_bins(
        observe, spec):
    base = _people(BASE)
    with_units = spec.contribution.max_partitions_contributed > 1
    neighbours = [
        base,
        pd.concat([base, _people({"C": [99]}).assign(person=10**6)]),  # a group of one: never released
        pd.concat([base, _people({"A": [1]}).assign(person=10**6)]),  # one more in a kept group
        base.iloc[1:],  # one fewer
    ]
    if with_units:  # one person in two groups, one of them new, with two records in it
        neighbours.append(pd.concat([base, _people({"B": [99], "D": [5, 6]}).assign(person=10**6)]))
    seen = [observe(spec, _upstream(people, with_units)) for people in neighbours]
    for error, _, _, output in seen:
        assert error is None
        assert [row["country"] for row in output["aggregates"]["hours"]["rows"]] == ["A", "B"]
    assert len({str(s[1]) for s in seen}) == 1  # the same log lines
    assert len({str(s[2]) for s in seen}) == 1  # the same charges
    shapes = [[sorted(row) for row in s[3]["aggregates"]["hours"]["rows"]] for s in seen]
    assert all(shape == shapes[0] for shape in shapes)
    published = [{k: v for k, v in s[3]["aggregates"]["hours"].items() if k != "rows"} for s in seen]
    assert all(p == published[0] for p in published)


def test_a_person_who_puts_a_group_of_records_outside_the_bins_into_one_does_not_change_whether_it_is_released(
        observe):
    base = _people({**BASE, "X": [None] * 100})  # a hundred people whose hours are not known: in no bin
    joined = pd.concat([base, _people({"X": [40]}).assign(person=10**6)])
    seen = [observe(_spec(l0=2, linf=2), _upstream(people)) for people in (base, joined)]
    for error, _, _, output in seen:
        assert error is None
        assert [row["country"] for row in output["aggregates"]["hours"]["rows"]] == ["A", "B", "X"]


def test_neighbouring_inputs_draw_the_same_work_for_the_groups_they_release(tmp_path, monkeypatch):
    """Work is counted (never timed): the bins scored and the units noised are those of the kept groups and the
    candidates, the same for a neighbour who adds a group of one (one more candidate, noised and dropped) but for
    that candidate's one selection draw."""
    from dp_operators.mechanisms import exponential
    from dp_operators.release import plan as plan_module

    counted = {"weights": 0, "noised": 0}
    weights = exponential._weight_bounds

    def counting_weights(*args, **kwargs):
        counted["weights"] += 1
        return weights(*args, **kwargs)

    draw = plan_module.NoiseStep.draw

    def counting_draw(self, size, *args, **kwargs):
        counted["noised"] += size
        return draw(self, size, *args, **kwargs)

    monkeypatch.setattr(exponential, "_weight_bounds", counting_weights)
    monkeypatch.setattr(plan_module.NoiseStep, "draw", counting_draw)
    base = _people(BASE)
    work = []
    for run, people in enumerate([base, pd.concat([base, _people({"A": [1]}).assign(person=10**6)]),
                                  pd.concat([base, _people({"C": [99]}).assign(person=10**6)])]):
        counted.update(weights=0, noised=0)
        run_release(_spec(), {"hours": _upstream(people, False)}, _ledger(tmp_path / f"w{run}.db"), _key(),
                    spec_hash="0" * 64)
        work.append(dict(counted))
    assert work[0]["weights"] > 0 and work[0] == work[1]
    assert work[2] == {"weights": work[0]["weights"], "noised": work[0]["noised"] + 1}
