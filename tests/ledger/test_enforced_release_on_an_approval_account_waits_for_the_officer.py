"""An account with ``approval:`` thresholds and ``require_enforced_bounding: true``: a release whose contribution
bounds the operator enforces from raw rows (here a median from a Parquet file of raw rows, ``rows_uri=``) files its
approval request with the mechanisms the reservation will record, each with its ``contribution_bounding`` record,
so the ledger accepts the request, the officer sees the bounding, and the task waits (rescheduled, no try spent).
A request whose steps are declared is still refused by the database (the worker login on PostgreSQL)."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pandas as pd
import pytest

from airflow.sdk.exceptions import AirflowRescheduleException
from dp_operators.ledger import AccountConfig, LedgerConfig
from dp_operators.ledger.config import Approval
from dp_operators.operators.release import DPReleaseOperator

from airflow_fakes import NoXComTaskInstance, context_for
from support import SPEND_KEY, governor, spender

DAG_ID = "clinic_median_release"
SPEC = """\
version: 1
release: clinic_median
budget_account: clinic
privacy_unit: patient
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: median_bill
    kind: median
    bins: {column: bill, edges: [0, 500], width: 10}
    mechanism: exponential
    budget: {epsilon: 0.4}
"""


def _operator(tmp_path):
    spec = tmp_path / "clinic_median.yaml"
    spec.write_text(SPEC)
    rng = random.Random(3)
    rows = tmp_path / "visits.parquet"
    pd.DataFrame([(p, round(rng.uniform(0, 600), 2)) for p in range(200) for _ in range(rng.randint(1, 4))],
                 columns=["patient", "bill"]).to_parquet(rows)
    return DPReleaseOperator(task_id="release", spec_path=spec, rows_uri=f"file://{rows}",
                             privacy_unit_column="patient", output_uri=f"file://{tmp_path / 'out'}",
                             ledger_conn_id="dp_ledger_clinic_median")


def _ledger(tmp_path, monkeypatch, *, required: bool):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"clinic": AccountConfig(
        accountant="zcdp", cap=Fraction(1), delta=Fraction(1, 10**6), privacy_unit="patient",
        allowed_dags=[DAG_ID], require_enforced_bounding=required, approval=Approval(above=Fraction(1, 1000)))}))
    monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_CLINIC_MEDIAN", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": url, "audit_key": SPEND_KEY.text}}))
    return officer, spender(url)


def _requested_steps(ledger) -> list[dict]:
    (event,) = [e for e in ledger.events(account="clinic") if e["event"] == "approval_requested"]
    return event["mechanisms"] if isinstance(event["mechanisms"], list) else json.loads(event["mechanisms"])


def test_without_the_requirement_the_officer_reviews_the_bounding_the_charge_will_record(tmp_path, monkeypatch):
    officer, ledger = _ledger(tmp_path, monkeypatch, required=False)
    with pytest.raises(AirflowRescheduleException):
        _operator(tmp_path).execute(context_for(NoXComTaskInstance(dag_id=DAG_ID)))
    assert len(officer.approval_requests(pending=True)) == 1
    steps = _requested_steps(ledger)
    assert steps and all(step["contribution_bounding"]["mode"] == "enforced" for step in steps)


def test_with_the_requirement_the_enforced_median_waits_for_the_officer(tmp_path, monkeypatch):
    officer, ledger = _ledger(tmp_path, monkeypatch, required=True)
    for _ in range(2):  # a second look finds the same request: nothing charged, no try spent
        with pytest.raises(AirflowRescheduleException):
            _operator(tmp_path).execute(context_for(NoXComTaskInstance(dag_id=DAG_ID)))
    assert len(officer.approval_requests(pending=True)) == 1 and list(ledger.charges()) == []
    assert officer.verify().ok


def test_a_worker_login_on_postgresql_is_refused_the_request_the_operator_files(pg_database, tmp_path):
    """On PostgreSQL (``dp_request_approval``), with the team login: the reservation with the operator's enforced
    records is held for approval; the request with the same records is filed, one with declared steps refused."""
    from dp_operators.ledger import BoundingNotEnforcedError, ReleaseKey
    from dp_operators.ledger.errors import ApprovalRequiredError
    from dp_operators.operators.approval_wait import approval_plan
    from dp_operators.release import plan_release
    from dp_operators.spec import load_spec_with_hash
    from ledger_backends import account_config
    from team_deployment import team_deployment

    spec_file = tmp_path / "clinic_median.yaml"
    spec_file.write_text(SPEC)
    spec, spec_hash = load_spec_with_hash(spec_file)
    enforced = {"mode": "enforced", "source": "file", "privacy_unit_column": "patient", "sql_sha256": None}
    with team_deployment(pg_database, "qappr", lambda t: {"clinic": account_config(
            "zcdp", cap=1, delta="1e-6", dags=(DAG_ID,), allowed_roles=[t.team_a], require_enforced_bounding=True,
            approval=Approval(above=Fraction(1, 1000)))}) as t:
        worker = t.ledger(t.login_a)
        plan = plan_release(spec, accountant="zcdp")
        key = ReleaseKey(DAG_ID, "scheduled__1", "release", -1, spec.release)
        with pytest.raises(ApprovalRequiredError) as held:  # what run_release reserves: enforced records
            worker.reserve(key, account="clinic", amount=plan.charge("zcdp"), spec_hash=spec_hash,
                           mechanisms=[{**s.describe(), "contribution_bounding": enforced} for s in plan.steps])
        declared_plan, declared = approval_plan(spec, "zcdp", held.value)  # no bounding given: declared
        with pytest.raises(BoundingNotEnforcedError):
            worker.request_approval(key, account="clinic", amount=held.value.amount, mechanisms=declared,
                                    spec_hash=spec_hash, plan=declared_plan)
        shown, mechanisms = approval_plan(spec, "zcdp", held.value, bounding={"median_bill": enforced})
        state = worker.request_approval(key, account="clinic", amount=held.value.amount, mechanisms=mechanisms,
                                        spec_hash=spec_hash, plan=shown)
        assert state["state"] == "pending"
        t.dispose()
