"""The release operator waits for a privacy officer's approval of a large charge (docs/ledger.md, "Approval before a
large charge"): rescheduled, no try spent and nothing reserved, until the decision; a grant then releases, a
rejection fails the task without a retry."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException
from dp_operators.ledger import AccountConfig, LedgerConfig
from dp_operators.ledger.config import Approval
from dp_operators.operators.release import DPReleaseOperator

from airflow_fakes import FakeTaskInstance, context_for
from operator_ledgers import connect_ledger
from support import EXAMPLE_SPEC, example_charge, governor, spender


@pytest.fixture
def held_ledger(tmp_path: Path, monkeypatch):
    path = tmp_path / "ledger.db"
    officer = governor(f"sqlite:///{path}")
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"census_adult": AccountConfig(
        accountant="zcdp", cap=Fraction(2 * example_charge()), delta=Fraction(1, 10**6), privacy_unit="person",
        allowed_dags=["adult_census_release"], approval=Approval(above=example_charge() / 2))}))
    connect_ledger(monkeypatch, "dp_ledger_test", path)
    return officer, spender(f"sqlite:///{path}")


def _operator(tmp_path: Path) -> DPReleaseOperator:
    return DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="compute_aggregates",
                             output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_test")


@pytest.mark.parametrize("approve", [True, False])
def test_a_large_charge_waits_for_the_officer(tmp_path, held_ledger, adult_aggregates, approve):
    officer, ledger = held_ledger
    before = dt.datetime.now(dt.timezone.utc)
    with pytest.raises(AirflowRescheduleException) as waiting:
        _operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
    assert waiting.value.reschedule_date >= before + dt.timedelta(seconds=5)
    assert list(ledger.charges()) == []  # nothing reserved
    (request,) = officer.approval_requests(pending=True)
    plan = request["plan"]
    assert plan["charge"] == request["amount"] and Fraction(plan["remaining_after"]) == Fraction(
        2 * example_charge()) - Fraction(request["amount"])
    # each step with its expected half-width; a quantile's in ranks (records)
    assert plan["mechanisms"] and all(
        (step["rank_half_width"] if step["component"] == "quantile" else step["half_width"]) > 0
        for step in plan["mechanisms"])
    assert any(step["component"] == "quantile" for step in plan["mechanisms"])  # the example's median
    with pytest.raises(AirflowRescheduleException):  # still waiting: the same request, not a second one
        _operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
    assert len(officer.approval_requests()) == 1
    officer.decide_approval("census_adult", request["request"], approve=approve, reason="reviewed")
    if approve:
        output = _operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
        assert output and [c["state"] for c in ledger.charges()] == ["committed"]
    else:
        with pytest.raises(AirflowFailException, match="rejected"):
            _operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
        assert list(ledger.charges()) == []
    assert officer.verify().ok
