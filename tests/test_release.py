"""The release engine on real data: key domains, charges, replay, refusals, coverage, no raw values out."""

from __future__ import annotations

import json
import logging
import math
from fractions import Fraction

import pytest
import yaml

from dp_operators.accounting import IncompatibleAccountantError
from dp_operators.ledger import BudgetExhaustedError, ReleaseKey
from dp_operators.release import (
    NoiseStep,
    ReleaseAbortedError,
    ReleaseConfigError,
    ReleaseInputError,
    check_plain_json,
    plan_release,
    run_release,
)
from dp_operators.spec import parse_spec

from support import (
    EXAMPLE_SPEC,
    EXAMPLE_SUM_LINF,
    discrete_laplace_kl_reference,
    example_charge,
    governor,
    make_ledger,
    spender,
)

DAG = "adult_census_release"


def key(run: str = "run-1", release: str = "adult_census_statistics") -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run, task_id="release", map_index=-1, release_name=release)


def release(spec, aggregates, ledger, run="run-1"):
    return run_release(spec, aggregates, ledger, key(run), spec_hash="0" * 64)


def committed(ledger) -> list[dict]:
    return [c for c in ledger.charges() if c["state"] == "committed"]


def test_release_publishes_every_public_key_and_charges_the_plan(example_spec, adult_aggregates, ledger):
    result = release(example_spec, adult_aggregates, ledger)
    output = result.output
    cells = output["aggregates"]["people_by_education_sex"]["rows"]
    assert len(cells) == 32
    assert {(c["education"], c["sex"]) for c in cells} == {
        (e, s) for e in example_spec.aggregates[0].keys["education"] for s in ("Female", "Male")
    }
    bands = [row["age_band"] for row in output["aggregates"]["people_by_age_band"]["rows"]]
    assert bands == ["17-24", "25-34", "35-44", "45-54", "55-64", "65-74", "75+"]
    assert all(isinstance(c["value"], int) and c["value"] >= 0 for c in cells)
    assert all(c["half_width"] > 0 for c in cells)
    charges = committed(ledger)
    assert len(charges) == 1
    assert Fraction(charges[0]["amount"]) == plan_release(example_spec, accountant="zcdp").charge("zcdp")
    assert Fraction(charges[0]["amount"]) == example_charge()
    assert output["charge"]["rho_exact"] == str(example_charge())
    json.dumps(output, allow_nan=False)
    check_plain_json(output)


def test_example_charge_is_the_composed_rho():
    """Reference: rho = 0.045 + 0.3 tanh(0.15) + 0.1 tanh(0.05) + KL of the 49-unit Laplace sum at 50 digits, plus
    the median's 0.4^2 / 8."""
    import mpmath

    # each charge is rounded up to 12 significant digits (the sum's also carries a 1e-9 relative margin)
    with mpmath.workdps(50):
        exact = (
            mpmath.mpf("0.045")
            + mpmath.mpf("0.3") * mpmath.tanh(mpmath.mpf("0.15"))
            + mpmath.mpf("0.1") * mpmath.tanh(mpmath.mpf("0.05"))
            + discrete_laplace_kl_reference(Fraction(1, 10), EXAMPLE_SUM_LINF)
            + mpmath.mpf("0.4") ** 2 / 8
        )
        charged = mpmath.mpf(example_charge().numerator) / example_charge().denominator
        assert exact <= charged < exact + mpmath.mpf("1e-11")
    # the Laplace parts below the old epsilon^2 / 2 conversion (which makes the counts and the mean rho 1/10)
    assert example_charge() < Fraction(1, 10) + Fraction(1, 50)


def test_missing_key_is_a_noised_zero_and_unknown_key_is_dropped(example_spec, adult_aggregates, ledger, caplog):
    aggregates = dict(adult_aggregates)
    rows = [r for r in aggregates["people_by_education_sex"] if r["education"] != "Preschool"]
    rows.append({"education": "Kindergarten", "sex": "Female", "count": 777_777})
    aggregates["people_by_education_sex"] = rows
    reports = []
    with caplog.at_level(logging.DEBUG):
        output = run_release(example_spec, aggregates, ledger, key(), spec_hash="0" * 64,
                             diagnostics=reports.append).output
    cells = output["aggregates"]["people_by_education_sex"]["rows"]
    preschool = [c for c in cells if c["education"] == "Preschool"]
    assert len(preschool) == 2 and all(abs(c["value"]) <= 40 for c in preschool)
    assert "Kindergarten" not in json.dumps(output)
    # the dropped row is counted in the opt-in report only: no log record at all, at any level
    assert caplog.records == []
    (report,) = reports
    seen = report.aggregates["people_by_education_sex"]
    assert seen.rows_outside_domain == 1 and seen.outside_domain_examples == [["Kindergarten", "Female"]]


def test_retry_of_the_same_key_replays_without_charging(example_spec, adult_aggregates, ledger):
    first = release(example_spec, adult_aggregates, ledger)
    second = release(example_spec, adult_aggregates, ledger)
    assert not first.replayed and second.replayed
    assert json.dumps(first.output, sort_keys=True) == json.dumps(second.output, sort_keys=True)
    assert len(list(ledger.charges())) == 1
    assert ledger.account("census_adult").spent == example_charge()


def test_exhaustion_refuses_the_third_run_before_anything_is_reserved(example_spec, adult_aggregates, tmp_path):
    ledger = make_ledger(tmp_path / "two-runs.db", cap=str(2 * example_charge()))
    release(example_spec, adult_aggregates, ledger, run="a")
    release(example_spec, adult_aggregates, ledger, run="b")
    with pytest.raises(BudgetExhaustedError) as refused:
        release(example_spec, adult_aggregates, ledger, run="c")
    assert "remaining 0, short by" in str(refused.value)
    assert len(list(ledger.charges())) == 2 and len(committed(ledger)) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(lambda a: a.pop("mean_hours_per_week"), "did not provide ['mean_hours_per_week']",
                     id="missing aggregate"),
        pytest.param(lambda a: a.update(mean_hours_per_week=[1, 2]), "a mean expects", id="mean not a mapping"),
        pytest.param(lambda a: a.update(people_by_age_band="17-24"), "expected a list of rows", id="rows a string"),
        pytest.param(lambda a: a["people_by_age_band"].append({"age_band": "17-24"}), "missing field(s) ['count']",
                     id="row without count"),
        pytest.param(lambda a: a["people_by_age_band"].append({"count": 3}), "missing field(s) ['age_band']",
                     id="row without key column"),
        pytest.param(lambda a: a["people_by_age_band"].append({"age_band": "75+", "count": "12"}),
                     "a row's field 'count' holds a str, not a number", id="count is a string"),
        pytest.param(lambda a: a["people_by_age_band"].append({"age_band": "75+", "count": [3]}),
                     "a row's field 'count' holds a list, not a number", id="count is a list"),
    ],
)
def test_malformed_upstream_is_refused_before_any_budget_is_spent(
    example_spec, adult_aggregates, ledger, change, message
):
    aggregates = json.loads(json.dumps(adult_aggregates))
    change(aggregates)
    with pytest.raises(ReleaseInputError) as refused:
        release(example_spec, aggregates, ledger)
    assert message in str(refused.value)
    assert "row 7" not in str(refused.value)  # a row index counts the rows before it: data-derived
    assert list(ledger.charges()) == []
    assert ledger.account("census_adult").spent == 0


def test_non_finite_and_huge_values_never_raise(example_spec, adult_aggregates, ledger, caplog):
    from decimal import Decimal

    aggregates = json.loads(json.dumps(adult_aggregates))
    aggregates["people_by_age_band"][0]["count"] = float("nan")
    aggregates["people_by_age_band"][1]["count"] = float("inf")
    aggregates["people_by_age_band"][2]["count"] = 2**31 + 5
    aggregates["mean_hours_per_week"]["sum"] = Decimal("-Infinity")  # an exact type: a float sum is refused
    reports = []
    with caplog.at_level(logging.DEBUG):
        output = run_release(example_spec, aggregates, ledger, key(), spec_hash="0" * 64,
                             diagnostics=reports.append).output
    check_plain_json(output)
    rows = {r["age_band"]: r["value"] for r in output["aggregates"]["people_by_age_band"]["rows"]}
    assert rows[aggregates["people_by_age_band"][2]["age_band"]] > 2**31 - 1000  # saturates nothing, wraps nothing
    assert caplog.records == []  # counted in the report only
    (report,) = reports
    assert report.aggregates["people_by_age_band"].special_values == {"count": {"nan": 1, "infinity": 1}}
    assert report.aggregates["mean_hours_per_week"].special_values == {"sum": {"infinity": 1}}


def test_privacy_unit_and_accountant_mismatches_are_refused_before_reserving(example_spec, adult_aggregates, tmp_path):
    pure = make_ledger(tmp_path / "pure.db", accountant="pure_dp", cap="5")
    with pytest.raises(IncompatibleAccountantError, match="cannot be charged to a 'pure_dp' account"):
        release(example_spec, adult_aggregates, pure)
    assert list(pure.charges()) == []
    households = parse_spec(EXAMPLE_SPEC.read_text().replace("privacy_unit: person", "privacy_unit: household"))
    with pytest.raises(ReleaseConfigError, match="privacy unit 'household'"):
        release(households, adult_aggregates, make_ledger(tmp_path / "z.db"))


def test_budget_comes_back_only_when_no_sampler_was_entered(example_spec, adult_aggregates, ledger, monkeypatch):
    import dp_operators.release.run as engine

    def fails_before_drawing(plan, prepared, drawn):
        raise MemoryError("could not allocate the noise vectors")

    monkeypatch.setattr(engine, "draw_noise", fails_before_drawing)
    with pytest.raises(ReleaseAbortedError, match=r"\(MemoryError\); no noise had been drawn") as aborted:
        release(example_spec, adult_aggregates, ledger)
    assert aborted.value.budget_returned and isinstance(aborted.value.__cause__, MemoryError)
    (charge,) = ledger.charges()
    assert charge["state"] == "released"
    assert ledger.account("census_adult").spent == 0


def test_a_failure_inside_a_sampler_keeps_the_budget_spent(example_spec, adult_aggregates, ledger, monkeypatch):
    def broken(self, size=None):
        raise MemoryError("sampler failed part-way")

    monkeypatch.setattr(NoiseStep, "draw", broken)
    with pytest.raises(ReleaseAbortedError, match="noise may have been drawn, so the charge stays spent") as aborted:
        release(example_spec, adult_aggregates, ledger)
    assert not aborted.value.budget_returned and isinstance(aborted.value.__cause__, MemoryError)
    (charge,) = ledger.charges()
    assert charge["state"] == "abandoned"  # noise may exist: counted as spent, and the lease is given up
    assert ledger.account("census_adult").spent == Fraction(charge["amount"]) > 0
    monkeypatch.undo()
    output = release(example_spec, adult_aggregates, ledger)  # a rerun charges again, never for free
    assert not output.replayed
    assert [c["state"] for c in ledger.charges()] == ["abandoned", "committed"]
    assert ledger.account("census_adult").spent == 2 * Fraction(charge["amount"])


def test_raw_aggregates_never_reach_the_ledger(example_spec, adult_aggregates, tmp_path):
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path)
    release(example_spec, adult_aggregates, ledger)
    content = path.read_bytes()
    mean = adult_aggregates["mean_hours_per_week"]
    for true_value in (mean["sum"], mean["count"]):  # neither is published, noised or not
        assert str(true_value).encode() not in content


@pytest.mark.slow
def test_mean_is_within_its_half_width_in_at_least_85_of_100_releases(example_spec, adult_aggregates, tmp_path):
    """The example's mean lies within its 95 % half-width in at least 85 of 100 releases through the whole engine
    (an exact interval falls below 85 with probability 4e-5; a 80 % one passes it with probability 0.13)."""
    ledger = make_ledger(tmp_path / "many.db", cap="100")
    truth = adult_aggregates["mean_hours_per_week"]
    true_mean = truth["sum"] / truth["count"]
    covered = 0
    for run in range(100):
        published = release(example_spec, adult_aggregates, ledger, run=f"run-{run}").output
        mean = published["aggregates"]["mean_hours_per_week"]
        covered += abs(mean["value"] - true_mean) <= mean["half_width"]
    assert covered >= 85


def test_mean_half_width_is_a_box_bound_from_public_values():
    from dp_operators.release.publish import _mean_with_half_width

    mean, half_width = _mean_with_half_width(4000.0, 100, 100.0, 10, lower=1, upper=99)
    assert mean == 40.0
    # extremes: 4100/90 = 45.56 and 3900/110 = 35.45
    assert math.isclose(half_width, 4100 / 90 - 40)
    # a noised count at or below 0 still gives a finite, bounded answer
    mean, half_width = _mean_with_half_width(-5.0, -3, 10.0, 10, lower=1, upper=99)
    assert mean == 1 and 0 <= half_width <= 98


def test_epsilon_delta_budget_calibrates_a_discrete_gaussian_by_its_exact_profile(example_spec):
    from dp_operators.mechanisms import discrete_gaussian_delta, rho_for_approx_dp

    document = yaml.safe_load(EXAMPLE_SPEC.read_text())
    document["aggregates"][0]["budget"] = {"epsilon": 1, "delta": 1e-6}
    plan = plan_release(parse_spec(yaml.safe_dump(document)))
    step = plan.step("people_by_education_sex", "count")
    assert step.mechanism == "discrete_gaussian"
    assert discrete_gaussian_delta(step.scale, 1) <= 1e-6
    # tighter than calibrating through zCDP, and charged on a zCDP account as the exact rho of the same noise
    assert step.scale < 1 / (2 * rho_for_approx_dp(1, Fraction(1, 10**6)))
    assert step.privacy_loss("zcdp").amount == step.rho == 1 / (2 * step.scale)
    described = step.describe()
    assert described["sigma"] == pytest.approx(4.2308, abs=1e-3) and described["delta"] == 1e-6
    loss = step.privacy_loss("approx_dp")
    assert (loss.unit, loss.amount, loss.delta) == ("epsilon", 1, Fraction(1, 10**6))


def simple_spec(aggregate: dict, account: str = "census_adult") -> object:
    document = {"version": 1, "release": "adult_census_statistics", "budget_account": account,
                "privacy_unit": "person", "aggregates": [aggregate]}
    return parse_spec(yaml.safe_dump(document))


def test_every_component_of_a_variance_is_noised_and_charged(tmp_path):
    """A variance is three noised sums (sum, count, sum of squares), each charged its third of the budget."""
    spec = simple_spec({"name": "hours", "kind": "variance", "bounds": [0, 10], "mechanism": "discrete_laplace",
                        "budget": {"epsilon": 0.9}})
    plan = plan_release(spec)
    assert [s.component for s in plan.steps] == ["sum", "count", "sum_squares"]
    assert [s.epsilon for s in plan.steps] == [Fraction(3, 10)] * 3
    # centred at 5: a unit moves the sum by 5 and the sum of squares by 25
    assert [s.linf for s in plan.steps] == [5, 1, 25]
    ledger = make_ledger(tmp_path / "v.db", accountant="pure_dp", cap="1")
    values = [3] * 500 + [7] * 500  # variance 4; integer values: exact sums
    upstream = {"hours": {"sum": sum(values), "count": len(values), "sum_squares": sum(v * v for v in values)}}
    published = release(spec, upstream, ledger).output["aggregates"]["hours"]
    assert 0 <= published["value"] <= 25 and published["half_width"] > 0
    # one draw lies outside its own 95 % interval one time in twenty; six half-widths bound a wrong scale, not chance
    assert abs(published["value"] - 4) <= 6 * published["half_width"]
    assert ledger.account("census_adult").spent == Fraction(9, 10)


def test_mean_is_noised_on_values_centred_in_the_bounds():
    spec = simple_spec({"name": "m", "kind": "mean", "bounds": [1, 99], "mechanism": "discrete_laplace",
                        "budget": {"epsilon": 0.2}})
    assert plan_release(spec).step("m", "sum").linf == 49  # (99 - 1) / 2, not 99


def test_auto_picks_laplace_or_gaussian_by_noise_variance():
    one = plan_release(simple_spec({"name": "c", "kind": "count", "mechanism": "auto",
                                    "budget": {"epsilon": 1, "delta": 1e-6}})).steps[0]
    assert one.mechanism == "discrete_laplace"  # one value: Laplace's std 1.36 beats the Gaussian's 4.23
    many = simple_spec({"name": "c", "kind": "count", "mechanism": "auto", "group_by": ["k"],
                        "keys": {"k": list(range(50))}, "contribution": {"max_partitions_contributed": 50},
                        "budget": {"epsilon": 1, "delta": 1e-6}})
    assert plan_release(many).steps[0].mechanism == "discrete_gaussian"


SELECTION = {"name": "people_by_city", "kind": "count", "group_by": ["city"], "mechanism": "discrete_laplace",
             "budget": {"epsilon": 0.5},
             "partition_selection": {"mechanism": "discrete_laplace", "budget": {"epsilon": 0.5, "delta": 1e-6}}}


def test_partition_selection_releases_only_keys_above_the_threshold_and_charges_its_delta(tmp_path):
    spec = simple_spec(SELECTION)
    plan = plan_release(spec)
    selection = plan.step("people_by_city", "selection")
    assert selection.threshold == 28  # scale 2: P(Z >= 27) <= 1e-6 < P(Z >= 26); released iff 1 + Z >= 28
    from dp_operators.ledger import AccountConfig, LedgerConfig

    url = f"sqlite:///{tmp_path / 'sel.db'}"
    governor(url).init_schema()
    governor(url).apply_config(LedgerConfig(version=1, accounts={"census_adult": AccountConfig(
        accountant="approx_dp", cap=Fraction(5), delta=Fraction(1, 10**5), privacy_unit="person",
        allowed_dags=[DAG])}))
    ledger = spender(url)
    rows = [{"city": "Big", "count": 10_000}, {"city": "Lonely", "count": 1}, {"city": 7, "count": 5_000}]
    output = release(spec, {"people_by_city": rows}, ledger).output
    published = output["aggregates"]["people_by_city"]
    assert {r["city"] for r in published["rows"]} == {"Big", 7}
    assert published["partition_selection"]["threshold"] == 28
    assert Fraction(output["charge"]["epsilon_exact"]) == 1
    assert 0 < Fraction(output["charge"]["delta_spent_exact"]) <= Fraction(1, 10**6)
    assert plan.delta("approx_dp") == selection.threshold_delta


def test_partition_selection_needs_an_approx_dp_account_and_is_refused_before_reserving(tmp_path, ledger):
    from dp_operators.accounting import IncompatibleAccountantError

    with pytest.raises(IncompatibleAccountantError):
        release(simple_spec(SELECTION), {"people_by_city": [{"city": "Big", "count": 10}]}, ledger)
    assert list(ledger.charges()) == []


def test_numpy_integers_neither_wrap_nor_overflow_and_drop_policies_apply(tmp_path):
    import numpy as np

    spec = simple_spec({"name": "c", "kind": "count", "group_by": ["k"], "keys": {"k": ["a", "b", "c"]},
                        "mechanism": "discrete_laplace", "budget": {"epsilon": 1},
                        "non_finite": {"nan": "drop"}})
    ledger = make_ledger(tmp_path / "np.db", accountant="pure_dp", cap="5")
    rows = [{"k": "a", "count": np.int32(2**31 - 1)}, {"k": "a", "count": np.int32(6)},
            {"k": "b", "count": float("nan")}, {"k": "b", "count": 3}, {"k": "c", "count": -4}]
    values = {r["k"]: r["value"] for r in release(spec, {"c": rows}, ledger).output["aggregates"]["c"]["rows"]}
    assert abs(values["a"] - (2**31 + 5)) < 100  # added as Python ints: 2**31 + 5, not wrapped
    assert abs(values["b"] - 3) < 100 and abs(values["c"]) < 100  # NaN row dropped, negative count clamped to 0
    huge = {"c": [{"k": "a", "count": np.int64(2**63 - 1)}, {"k": "a", "count": np.int64(2**63 - 1)}]}
    assert release(spec, huge, ledger, run="huge").output["aggregates"]["c"]["rows"][0]["value"] > 2**61


def test_discrete_gaussian_is_refused_on_a_gaussian_dp_account_before_reserving(example_spec, adult_aggregates, tmp_path):
    from dp_operators.ledger import AccountConfig, LedgerConfig

    url = f"sqlite:///{tmp_path / 'gdp.db'}"
    governor(url).init_schema()
    account = AccountConfig(
        accountant="gaussian_dp", epsilon=1, delta=Fraction(1, 10**6), privacy_unit="person",
        allowed_dags=[DAG],
    )
    governor(url).apply_config(LedgerConfig(version=1, accounts={"census_adult": account}))
    ledger = spender(url)
    with pytest.raises(IncompatibleAccountantError, match="cannot be charged a discrete Gaussian"):
        release(example_spec, adult_aggregates, ledger)
    assert list(ledger.charges()) == []


def test_replay_under_a_changed_spec_warns_and_returns_the_stored_release(example_spec, adult_aggregates, ledger,
                                                                          caplog):
    first = run_release(example_spec, adult_aggregates, ledger, key(), spec_hash="a" * 64)
    with caplog.at_level(logging.WARNING):
        again = run_release(example_spec, adult_aggregates, ledger, key(), spec_hash="b" * 64)
    assert again.replayed and again.output == first.output
    assert "another version of the spec" in caplog.text


def test_upstream_aggregates_the_spec_does_not_release_are_ignored_and_reported(example_spec, adult_aggregates,
                                                                               ledger, caplog):
    """An upstream may key its mapping by data (one entry per city): its names go to the opt-in report only."""
    reports = []
    with caplog.at_level(logging.DEBUG):
        output = run_release(example_spec, {**adult_aggregates, "median_income": 45_000}, ledger, key(),
                             spec_hash="0" * 64, diagnostics=reports.append).output
    assert "median_income" not in output["aggregates"]
    assert "median_income" not in caplog.text and "45000" not in caplog.text
    assert reports[0].unused_aggregates == ["median_income"]


def test_rows_of_one_key_are_added_exactly_and_rounded_once():
    """Rounding each row would let one unit's two rows of 0.5 move the partition by 2 grid steps, twice the plan."""
    from decimal import Decimal

    from dp_operators.release import prepare_inputs

    spec = simple_spec({"name": "s", "kind": "sum", "group_by": ["k"], "keys": {"k": ["a"]}, "bounds": [0, 0.5],
                        "grid": 1, "contribution": {"max_contributions_per_partition": 2},
                        "mechanism": "discrete_laplace", "budget": {"epsilon": 1}})
    assert plan_release(spec).step("s", "sum").l1_sensitivity == 1
    half = Decimal("0.5")
    before = prepare_inputs(spec, {"s": []}).values[("s", "sum")]
    after = prepare_inputs(spec, {"s": [{"k": "a", "sum": half}, {"k": "a", "sum": half}]}).values[("s", "sum")]
    assert after[0] - before[0] <= 1


@pytest.mark.parametrize("n", [pytest.param(n, id=f"{n} values of 0.1") for n in (1, 5, 12, 13, 40)])
def test_float_sums_of_clipped_values_are_clamped_never_dropped(n):
    """Summing 0.1 in binary floating point lands a hair outside [lower*N, upper*N]; the count must survive."""
    from dp_operators.release import prepare_inputs

    spec = simple_spec({"name": "m", "kind": "mean", "bounds": [0, 0.1], "grid": 0.01,
                        "upstream": {"arithmetic": "binary64", "max_rows": 40},
                        "mechanism": "discrete_laplace", "budget": {"epsilon": 1}})
    total = 0.0
    for _ in range(n):
        total += 0.1
    prepared = prepare_inputs(spec, {"m": {"sum": total, "count": n}})
    assert prepared.values[("m", "count")].tolist() == [n]
    assert prepared.values[("m", "sum")].tolist() == [5 * n]  # centred at 0.05: 0.05 per value, 5 grid steps


def test_null_values_follow_the_nan_policy_and_null_keys_are_keys():
    from dp_operators.release import DiagnosticsReport, prepare_inputs

    spec = simple_spec({"name": "total", "kind": "sum", "bounds": [0, 10], "mechanism": "discrete_laplace",
                        "budget": {"epsilon": 1}})
    report = DiagnosticsReport(spec.release)
    prepared = prepare_inputs(spec, {"total": None}, diagnostics=report)  # SQL SUM over no rows
    assert prepared.values[("total", "sum")].tolist() == [0]
    assert report.aggregates["total"].special_values == {"sum": {"null": 1}}
    selection = simple_spec(SELECTION)
    rows = [{"city": None, "count": 5}, {"city": "Big", "count": 7}]
    assert prepare_inputs(selection, {"people_by_city": rows}).keys["people_by_city"] == [(None,), ("Big",)]
