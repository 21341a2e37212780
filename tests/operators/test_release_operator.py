"""DPReleaseOperator called directly (``op.execute(context)``), as Airflow's own provider tests do."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow.sdk.exceptions import AirflowFailException
from dp_operators.operators.release import DPReleaseOperator, release_csv
from dp_operators.spec import SpecError

from support import EXAMPLE_SPEC, make_ledger


@dataclass
class FakeTaskInstance:
    """The slice of Airflow's RuntimeTaskInstance the operator uses."""

    upstream: object
    run_id: str = "manual__2026-11-29T10:00:00+00:00"
    dag_id: str = "adult_census_release"
    task_id: str = "release"
    map_index: int = -1
    try_number: int = 1
    pulls: list = field(default_factory=list)

    def xcom_pull(self, task_ids, key="return_value"):
        self.pulls.append((task_ids, key))
        return self.upstream


def context_for(ti) -> dict:
    return {"ti": ti, "outlet_events": defaultdict(lambda: SimpleNamespace(extra={}))}


@pytest.fixture
def ledger_conn(tmp_path: Path, monkeypatch):
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path, cap="0.2")
    monkeypatch.setenv(
        "AIRFLOW_CONN_DP_LEDGER_TEST",
        json.dumps({"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{path}"}}),
    )
    return ledger


def operator(tmp_path: Path) -> DPReleaseOperator:
    return DPReleaseOperator(
        task_id="release",
        spec_path=EXAMPLE_SPEC,
        aggregates_task_id="compute_aggregates",
        output_uri=f"file://{tmp_path / 'out'}",
        ledger_conn_id="dp_ledger_test",
    )


def test_execute_publishes_xcom_files_and_asset_event(tmp_path, ledger_conn, adult_aggregates):
    op = operator(tmp_path)
    ti = FakeTaskInstance(adult_aggregates)
    context = context_for(ti)
    output = op.execute(context)
    assert ti.pulls == [("compute_aggregates", "return_value")]
    assert output["release_key"]["run_id"] == ti.run_id
    folder = tmp_path / "out" / "adult_census_statistics" / "manual__2026-11-29T10_00_00_00_00"
    assert json.loads((folder / "release.json").read_text()) == output
    csv_lines = (folder / "release.csv").read_text().splitlines()
    assert csv_lines[0] == "aggregate,kind,key,value,half_width,confidence,mechanism"
    assert len(csv_lines) == 1 + 32 + 7 + 1
    assert (folder / "release.csv").read_text() == release_csv(output)
    extra = context["outlet_events"][op.release_asset].extra
    assert extra["release"] == "adult_census_statistics"
    assert extra["charge"]["rho_exact"] == "1/10"
    json.dumps(extra, allow_nan=False)


def test_retry_returns_the_stored_release_byte_for_byte(tmp_path, ledger_conn, adult_aggregates):
    first = operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
    folder = tmp_path / "out" / "adult_census_statistics" / "manual__2026-11-29T10_00_00_00_00"
    first_bytes = (folder / "release.json").read_bytes()
    retry = operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates, try_number=2)))
    assert json.dumps(retry, sort_keys=True) == json.dumps(first, sort_keys=True)
    assert (folder / "release.json").read_bytes() == first_bytes
    assert len(ledger_conn.charges()) == 1


def test_exhaustion_fails_the_task_without_retry_and_publishes_nothing(tmp_path, ledger_conn, adult_aggregates):
    for run in ("a", "b"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates, run_id=run)))
    with pytest.raises(AirflowFailException, match="requested rho 0.1, remaining 0, short by 0.1"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates, run_id="c")))
    assert not (tmp_path / "out" / "adult_census_statistics" / "c").exists()
    assert len(ledger_conn.charges()) == 2


def test_missing_upstream_value_fails_clearly(tmp_path, ledger_conn):
    with pytest.raises(AirflowFailException, match="returned no aggregates"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(None)))
    with pytest.raises(AirflowFailException, match="did not provide"):
        operator(tmp_path).execute(context_for(FakeTaskInstance({"people_by_age_band": []})))
    assert ledger_conn.charges() == []


def test_a_dag_not_allowed_on_the_account_is_refused(tmp_path, ledger_conn, adult_aggregates):
    ti = FakeTaskInstance(adult_aggregates, dag_id="someone_elses_dag")
    with pytest.raises(AirflowFailException, match="may not spend from budget account 'census_adult'"):
        operator(tmp_path).execute(context_for(ti))
    assert ledger_conn.charges() == []


def test_bad_spec_fails_at_construction_with_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE_SPEC.read_text().replace("budget: {epsilon: 0.3}", "budget: {epsilon: .nan}"))
    with pytest.raises(SpecError) as caught:
        DPReleaseOperator(
            task_id="release", spec_path=bad, aggregates_task_id="x", output_uri=f"file://{tmp_path}"
        )
    assert str(bad) in str(caught.value)
    assert "aggregates[1](people_by_age_band).budget.epsilon" in str(caught.value)


def test_only_the_output_location_is_templated():
    assert DPReleaseOperator.template_fields == ("output_uri",)


def test_aggregates_can_be_passed_by_reference(tmp_path, ledger_conn, adult_aggregates):
    stored = tmp_path / "aggregates.json"
    stored.write_text(json.dumps(adult_aggregates))
    output = operator(tmp_path).execute(context_for(FakeTaskInstance(f"file://{stored}")))
    assert len(output["aggregates"]["people_by_education_sex"]["rows"]) == 32
    with pytest.raises(AirflowFailException, match="not a readable JSON file"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(f"file://{tmp_path}/absent.json", run_id="x")))
    assert len(ledger_conn.charges()) == 1


def test_retry_replays_even_when_the_upstream_value_is_gone(tmp_path, ledger_conn, adult_aggregates):
    first = operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
    ti = FakeTaskInstance(None, try_number=2)
    assert operator(tmp_path).execute(context_for(ti)) == first
    assert ti.pulls == []  # a replay never reads the true aggregates
    assert len(ledger_conn.charges()) == 1
