"""DPBudgetGateOperator called directly (``op.execute(context)``), against real ledgers (SQLite and PostgreSQL)
and the real release engine: the gate's answer must be the one the ledger's reservation then gives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from types import SimpleNamespace

import pytest

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException, DownstreamTasksSkipped
from dp_operators.accounting.budget import MAX_DENOMINATOR
from dp_operators.ledger import BudgetExhaustedError, ReleaseKey
from dp_operators.operators.gate import DPBudgetGateOperator
from dp_operators.release import run_release
from dp_operators.spec import SpecError, load_spec_with_hash

from ledger_backends import account_config, ledger_url, ledger_with, pg_database  # noqa: F401  (fixtures)
from support import EXAMPLE_SPEC, example_charge

DAG_ID = "adult_census_release"
CONN_ID = "dp_ledger_gate"
#: The ledger's resolution: one unit less than the charge must not fit.
TINY = Fraction(1, MAX_DENOMINATOR)


@dataclass
class FakeTaskInstance:
    """The slice of Airflow's RuntimeTaskInstance the gate and ShortCircuitOperator use."""

    run_id: str = "scheduled__2026-11-29T00:00:00+00:00"
    dag_id: str = DAG_ID
    task_id: str = "budget_gate"
    map_index: int = -1
    pushed: dict = field(default_factory=dict)

    def xcom_push(self, key, value):
        self.pushed[key] = value


def context_for(op, ti) -> dict:
    return {"ti": ti, "task": op, "dag_run": SimpleNamespace(run_id=ti.run_id)}


def use_ledger(monkeypatch, url: str) -> None:
    """Point the gate's connection at ``url``: no spend key, the gate only reads."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({"conn_type": "dp_ledger", "extra": {"url": url}}))


def gate(spec_path=EXAMPLE_SPEC, **kwargs) -> DPBudgetGateOperator:
    return DPBudgetGateOperator(task_id="budget_gate", spec_path=spec_path, ledger_conn_id=CONN_ID, **kwargs)


def release(ledger, aggregates, run_id: str, spec_path=EXAMPLE_SPEC, task_id: str = "release"):
    """One real release of ``spec_path`` by the engine (what DPReleaseOperator runs)."""
    spec, digest = load_spec_with_hash(spec_path)
    key = ReleaseKey(DAG_ID, run_id, task_id, -1, spec.release)
    return run_release(spec, aggregates, ledger, key, spec_hash=digest)


def ledger_state(ledger) -> tuple:
    """Everything the gate could write: charges, audit events, account rows."""
    return list(ledger.charges()), list(ledger.events()), ledger.accounts()


@pytest.mark.parametrize(
    ("cap_above_one_charge", "fits"),
    [
        pytest.param(Fraction(0), True, id="remaining exactly the charge: fits"),
        pytest.param(-TINY, False, id="remaining one ledger unit below the charge: does not fit"),
    ],
)
def test_the_boundary_agrees_with_the_reservation(
    ledger_url, monkeypatch, adult_aggregates, cap_above_one_charge, fits
):
    charge = example_charge()  # composed independently of the plan (tests/support.py)
    cap = 2 * charge + cap_above_one_charge
    ledger = ledger_with(ledger_url, census_adult=account_config("zcdp", cap=cap, delta="1e-6", dags=(DAG_ID,)))
    release(ledger, adult_aggregates, "earlier-run")  # spends one charge: remaining = cap - charge
    use_ledger(monkeypatch, ledger_url)
    before = ledger_state(ledger)

    answer = gate().execute(context_for(None, FakeTaskInstance()))

    assert ledger_state(ledger) == before, "the gate wrote to the ledger"
    assert answer["fits"] is fits and answer["reason"] == ("fits" if fits else "budget_exhausted")
    assert (answer["account"], answer["unit"], answer["release"]) == ("census_adult", "rho", "adult_census_statistics")
    assert Fraction(answer["charge_exact"]) == charge
    assert Fraction(answer["remaining_exact"]) == cap - charge
    assert answer["delta_charge"] is None and answer["delta_remaining"] is None  # zcdp spends no delta
    json.dumps(answer, allow_nan=False)
    if fits:
        output = release(ledger, adult_aggregates, FakeTaskInstance().run_id).output
        assert Fraction(output["charge"]["rho_exact"]) == charge
        assert ledger.account("census_adult").remaining == 0
    else:
        with pytest.raises(BudgetExhaustedError) as refused:
            release(ledger, adult_aggregates, FakeTaskInstance().run_id)
        assert (refused.value.requested, refused.value.remaining) == (charge, charge - TINY)


VISITS_SPEC = (
    "version: 1\nrelease: visits\nbudget_account: census_adult\nprivacy_unit: person\naggregates:\n"
    "  - {name: visits, kind: count, mechanism: discrete_gaussian, budget: {epsilon: 1, delta: 4e-7}}\n"
)


def test_on_an_approx_dp_account_the_delta_part_must_fit_too(tmp_path, monkeypatch):
    """epsilon 6 funds six runs at epsilon 1, the delta cap 1e-6 only two at delta 4e-7 (the Gaussian's exact
    profile): the third run is refused for delta, by the gate and by the reservation alike."""
    spec_path = tmp_path / "visits.yaml"
    spec_path.write_text(VISITS_SPEC)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = ledger_with(url, census_adult=account_config("approx_dp", cap=6, delta="1e-6", dags=(DAG_ID,)))
    use_ledger(monkeypatch, url)
    answers = []
    for run in ("run-1", "run-2", "run-3"):
        answers.append(gate(spec_path).execute(context_for(None, FakeTaskInstance(run_id=run))))
        if answers[-1]["fits"]:
            release(ledger, {"visits": 10}, run, spec_path)
    assert [answer["reason"] for answer in answers] == ["fits", "fits", "delta_exhausted"]
    third = answers[2]
    assert Fraction(third["charge_exact"]) == 1 and Fraction(third["remaining_exact"]) == 4  # epsilon still fits
    assert Fraction(third["delta_remaining_exact"]) == Fraction(1, 10**6) - 2 * Fraction(third["delta_charge_exact"])
    with pytest.raises(BudgetExhaustedError) as refused:
        release(ledger, {"visits": 10}, "run-3", spec_path)
    assert refused.value.unit == "delta"
    assert refused.value.requested == Fraction(third["delta_charge_exact"])


@pytest.fixture
def exhausted(tmp_path, monkeypatch, adult_aggregates):
    """A SQLite ledger whose account funds one run of the example spec, spent by run 'first'."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = ledger_with(url, census_adult=account_config("zcdp", cap=example_charge(), delta="1e-6", dags=(DAG_ID,)))
    release(ledger, adult_aggregates, "first")
    use_ledger(monkeypatch, url)
    return ledger


def gate_in_dag(**kwargs) -> DPBudgetGateOperator:
    """The gate in a DAG: gate >> compute >> release, and gate >> notify (trigger rule all_done)."""
    with DAG(DAG_ID, schedule=None):
        op = gate(**kwargs)
        compute, release_task = EmptyOperator(task_id="compute"), EmptyOperator(task_id="release")
        notify = EmptyOperator(task_id="notify", trigger_rule="all_done")
        op >> compute >> release_task
        op >> notify
        compute >> notify
    return op


@pytest.mark.parametrize(
    ("ignore_downstream_trigger_rules", "skipped"),
    [
        pytest.param(True, {"compute", "release", "notify"}, id="every downstream task skipped"),
        pytest.param(False, {"compute", "notify"}, id="direct downstream only, trigger rules respected"),
    ],
)
def test_a_charge_that_does_not_fit_skips_downstream_as_short_circuit_does(
    exhausted, ignore_downstream_trigger_rules, skipped
):
    op = gate_in_dag(ignore_downstream_trigger_rules=ignore_downstream_trigger_rules)
    ti = FakeTaskInstance(run_id="second")
    before = ledger_state(exhausted)
    with pytest.raises(DownstreamTasksSkipped) as skip:  # Airflow 3's SkipMixin: the task runner skips them
        op.execute(context_for(op, ti))
    assert set(skip.value.tasks) == skipped
    assert set(ti.pushed["skipmixin_key"]["skipped"]) == skipped  # what NotPreviouslySkippedDep reads on a clear
    answer = ti.pushed["return_value"]  # pushed before the skip ends execute
    assert answer["fits"] is False and answer["reason"] == "budget_exhausted"
    assert Fraction(answer["remaining_exact"]) == 0 and Fraction(answer["charge_exact"]) == example_charge()
    assert ledger_state(exhausted) == before


def test_a_charge_that_fits_lets_the_run_through(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger_with(url, census_adult=account_config("zcdp", cap="0.5", delta="1e-6", dags=(DAG_ID,)))
    use_ledger(monkeypatch, url)
    op = gate_in_dag()
    ti = FakeTaskInstance()
    answer = op.execute(context_for(op, ti))  # no DownstreamTasksSkipped
    assert answer["fits"] is True and Fraction(answer["remaining_exact"]) == Fraction(1, 2)
    assert ti.pushed == {}  # the task runner pushes the returned answer; nothing skipped


def test_a_mapped_gate_that_does_not_fit_returns_its_answer(exhausted):
    """A mapped instance (map_index >= 0) records the skip in XCom instead of raising (SkipMixin), and returns."""
    op = gate_in_dag()
    ti = FakeTaskInstance(run_id="second", map_index=3)
    answer = op.execute(context_for(op, ti))
    assert answer["fits"] is False and ti.pushed["return_value"] == answer
    assert set(ti.pushed["skipmixin_key"]["skipped"]) == {"compute", "release", "notify"}


def test_a_committed_release_is_a_replay_and_fits_whatever_the_budget(exhausted):
    def answer(ti):  # a fresh operator per task instance, as Airflow runs them (PythonOperator keeps op_kwargs)
        return gate(release_task_id="release").execute(context_for(None, ti))

    replay = answer(FakeTaskInstance(run_id="first"))
    assert (replay["fits"], replay["reason"], replay["charge"]) == (True, "replay", 0)
    assert (replay["unit"], replay["remaining"]) == (None, None)  # the account is not read
    fresh = answer(FakeTaskInstance(run_id="second"))
    assert (fresh["fits"], fresh["reason"]) == (False, "budget_exhausted")
    mapped_elsewhere = answer(FakeTaskInstance(run_id="first", map_index=0))
    assert mapped_elsewhere["reason"] == "budget_exhausted"  # another release key: not committed
    without_task_id = gate().execute(context_for(None, FakeTaskInstance(run_id="first")))
    assert without_task_id["reason"] == "budget_exhausted"  # the gate cannot know the release's key


def test_the_decision_is_logged_with_public_numbers(exhausted, capfd):
    op = gate()  # in no DAG: no downstream task to skip, execute returns
    capfd.readouterr()
    op.execute(context_for(op, FakeTaskInstance(run_id="second")))
    logged = capfd.readouterr().out  # Airflow's task logger (structlog) writes to the process's stdout
    assert "budget gate: release 'adult_census_statistics' on account 'census_adult'" in logged
    assert "remaining 0" in logged and "does not fit (budget_exhausted)" in logged


@pytest.mark.parametrize(
    ("case", "message"),
    [
        pytest.param("unknown account", "budget account 'census_adult' is not in the ledger", id="unknown account"),
        pytest.param("dag not allowed", "DAG 'someone_elses_dag' may not spend from budget account", id="dag"),
        pytest.param("other privacy unit", "is for 'household'; a budget only composes over one", id="unit"),
    ],
)
def test_configuration_errors_fail_the_task_instead_of_skipping(tmp_path, monkeypatch, case, message):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    name = "other_account" if case == "unknown account" else "census_adult"
    config = account_config("zcdp", cap="0.5", delta="1e-6", dags=(DAG_ID,))
    if case == "other privacy unit":
        config = config.model_copy(update={"privacy_unit": "household"})
    ledger = ledger_with(url, **{name: config})
    use_ledger(monkeypatch, url)
    ti = FakeTaskInstance(dag_id="someone_elses_dag" if case == "dag not allowed" else DAG_ID)
    before = ledger_state(ledger)
    op = gate_in_dag()
    with pytest.raises(AirflowFailException, match=message):
        op.execute(context_for(op, ti))
    assert ti.pushed == {} and ledger_state(ledger) == before


def test_a_bad_spec_fails_at_construction_with_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE_SPEC.read_text().replace("budget: {epsilon: 0.3}", "budget: {epsilon: .nan}"))
    with pytest.raises(SpecError) as caught:
        gate(bad)
    assert str(bad) in str(caught.value)
    assert "aggregates[1](people_by_age_band).budget.epsilon" in str(caught.value)


def test_repeated_gates_leave_the_ledger_as_it_was(exhausted):
    """The gate's connection has no spend key (use_ledger): it could not sign a write, and it needs none."""
    before = ledger_state(exhausted)
    for run in ("a", "b", "c"):
        assert gate().execute(context_for(None, FakeTaskInstance(run_id=run)))["fits"] is False
    assert ledger_state(exhausted) == before
