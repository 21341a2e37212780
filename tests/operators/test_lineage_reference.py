"""docs/operators.md, "Lineage": 'the release operators report the input (the reference's files,
or the SQL connection's tables ...)'. Its first source row is a task returning a URI (aggregates_task_id);
lineage.py reads only ``aggregates_uri`` and ``queries``, so that input is never reported."""

from __future__ import annotations

import json

import pytest

from dp_operators.operators.release import DPReleaseOperator

from airflow_fakes import FakeTaskInstance, context_for
from operator_ledgers import connect_ledger
from support import make_ledger

DAG = "lineage_ref_lineage"
SPEC = """
version: 1
release: lineage_ref_lineage
budget_account: acct
privacy_unit: person
aggregates:
  - name: people
    kind: count
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""


def test_a_reference_returned_by_the_upstream_task_is_reported_as_an_input(tmp_path, monkeypatch):
    pytest.importorskip("airflow.providers.openlineage")
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    data = tmp_path / "aggregates.json"
    data.write_text(json.dumps({"people": 120}))
    make_ledger(tmp_path / "l.db", cap="100", accountant="pure_dp", dags=(DAG,), account="acct")
    connect_ledger(monkeypatch, "lineage_ref_l", tmp_path / 'l.db')
    op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="compute",
                           output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="lineage_ref_l")
    ti = FakeTaskInstance(upstream=f"file://{data}", dag_id=DAG)
    op.execute(context_for(ti))
    lineage = op.get_openlineage_facets_on_complete(ti)
    assert lineage.outputs, "outputs are reported"
    names = [f"{d.namespace}/{d.name}" for d in lineage.inputs]
    assert any("aggregates.json" in n for n in names), f"inputs reported: {names}"
