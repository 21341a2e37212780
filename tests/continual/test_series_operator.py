"""DPReleaseOperator on a series spec, called directly: one step per run, files and XCom per step, a retry replays the
step's bytes, and the refusals no retry fixes fail the task at once."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowFailException
from dp_operators.continual.state import SeriesKey
from dp_operators.operators.release import DPReleaseOperator, release_csv

from airflow_fakes import FakeTaskInstance, context_for
from support import SPEND_KEY, make_ledger

SERIES_KEY = SeriesKey(bytes(range(32)))
SPEC = """version: 1
release: daily_flights
budget_account: flights
privacy_unit: person
series: {horizon: 30}
aggregates:
  - {name: flights, kind: count, group_by: [origin], keys: {origin: [EWR, JFK, LGA]}, mechanism: auto,
     budget: {rho: 1}}
"""
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch):
    make_ledger(tmp_path / "ledger.db", cap="2", dags=("flights_dag",), account="flights")
    spec = tmp_path / "series.yaml"
    spec.write_text(SPEC)

    def connect(series_key: str | None = SERIES_KEY.text) -> None:
        extra = {"url": f"sqlite:///{tmp_path / 'ledger.db'}", "audit_key": SPEND_KEY.text}
        if series_key is not None:
            extra["series_key"] = series_key
        monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_TEST", json.dumps({"conn_type": "dp_ledger", "extra": extra}))

    connect()
    return tmp_path, spec, connect


def run(tmp_path: Path, spec: Path, day: int, *, try_number: int = 1) -> tuple[dict, FakeTaskInstance]:
    op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="totals",
                           output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_test")
    ti = FakeTaskInstance({"flights": [{"origin": "EWR", "count": 5 * (day + 1)}]},
                          run_id=f"scheduled__{(START + dt.timedelta(days=day)).date()}", dag_id="flights_dag",
                          try_number=try_number)
    context = context_for(ti)
    context["data_interval_start"] = START + dt.timedelta(days=day)
    context["data_interval_end"] = START + dt.timedelta(days=day + 1)
    return op.execute(context), ti


def test_each_run_publishes_its_step_and_a_retry_replays_the_same_bytes(setup):
    tmp_path, spec, _ = setup
    outputs = [run(tmp_path, spec, day)[0] for day in range(3)]
    assert [o["series"]["step"] for o in outputs] == [0, 1, 2]
    assert [o["charge"]["rho_exact"] for o in outputs] == ["1", "0", "0"]
    assert all("series_state" not in o for o in outputs)
    files = sorted((tmp_path / "out").rglob("release.json"))
    assert len(files) == 3
    published = json.loads(files[1].read_text())
    assert published == outputs[1] and "series_state" not in files[1].read_text()
    before = files[1].read_bytes()
    again, ti = run(tmp_path, spec, 1, try_number=2)
    assert json.dumps(again) == json.dumps(outputs[1]) and files[1].read_bytes() == before
    assert ti.pulls == []  # a replay reads no upstream data
    assert release_csv(outputs[2]).splitlines()[1].startswith("flights,count,")


def test_a_run_after_a_gap_fails_at_once_naming_the_missing_step(setup):
    tmp_path, spec, _ = setup
    run(tmp_path, spec, 0)
    with pytest.raises(AirflowFailException, match="leaves a gap after step 0"):
        run(tmp_path, spec, 2)


@pytest.mark.parametrize(("key", "message"), [
    (None, "no series_key extra"),
    ("00" * 32, "sealed with series key"),
    ("not hex", "64 hex digits"),
])
def test_a_worker_without_the_series_key_fails_at_once(setup, key, message):
    tmp_path, spec, connect = setup
    run(tmp_path, spec, 0)
    connect(key)
    with pytest.raises(AirflowFailException, match=message):
        run(tmp_path, spec, 1)


def test_release_show_names_the_step_and_its_day_and_verify_matches_every_step(setup):
    from typer.testing import CliRunner

    from dp_operators.cli import app

    tmp_path, spec, _ = setup
    for day in range(2):
        run(tmp_path, spec, day)
    run(tmp_path, spec, 1, try_number=2)  # a retry rewrites the step's own files
    shown = CliRunner().invoke(app, ["release", "show", str(tmp_path / "out")], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "series step 1 of 30 (run scheduled__2013-01-02, data interval 2013-01-02T00:00:00+00:00" in shown.output
    verified = CliRunner().invoke(app, ["release", "verify", str(tmp_path / "out"), "--url",
                                        f"sqlite:///{tmp_path / 'ledger.db'}"], terminal_width=200)
    assert verified.exit_code == 0, verified.output
    assert "4 files: 4 match the ledger" in verified.output  # two steps, JSON and CSV each


def test_the_upstream_learns_where_its_running_totals_count_from(setup):
    from dp_operators.operators.series_upstream import series_start

    tmp_path, spec, _ = setup
    for day in range(2):
        run(tmp_path, spec, day)
    ti = FakeTaskInstance(None, run_id="scheduled__2013-01-03", dag_id="flights_dag", task_id="totals")
    context = context_for(ti)
    context["data_interval_start"], context["data_interval_end"] = START + 2 * dt.timedelta(days=1), \
        START + 3 * dt.timedelta(days=1)
    assert series_start(release_task_id="release", spec_path=spec, ledger_conn_id="dp_ledger_test",
                        context=context) == START


def test_a_steps_lineage_names_the_series_mechanism_and_the_steps_files(setup):
    tmp_path, spec, _ = setup
    op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="totals",
                           output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_test")
    ti = FakeTaskInstance({"flights": [{"origin": "EWR", "count": 5}]}, run_id="scheduled__2013-01-01",
                          dag_id="flights_dag")
    context = context_for(ti)
    context["data_interval_start"], context["data_interval_end"] = START, START + dt.timedelta(days=1)
    op.execute(context)
    facets = op.get_openlineage_facets_on_complete(task_instance=None)
    facet = facets.run_facets["dp_release"]
    assert facet.mechanisms == [{"aggregate": "flights", "component": "series_step", "mechanism": "sqrt_factorization"}]
    assert facet.charge["amountExact"] == "1"
    assert all("__dp_series__%2Fg0%2Fstep%2F000000" in dataset.name for dataset in facets.outputs)


def test_a_steps_rows_go_to_a_sql_table_as_any_release_s(setup, monkeypatch):
    import sqlalchemy as sa

    from dp_operators.operators.sinks import SQLTableSink
    from sql_targets import database_target

    tmp_path, spec, _ = setup
    targets = database_target("sqlite", tmp_path, monkeypatch, "series_sink")
    conn_id, table, engine = next(targets)
    op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="totals",
                           sql_sink=SQLTableSink(conn_id, table), ledger_conn_id="dp_ledger_test")
    ti = FakeTaskInstance({"flights": [{"origin": "EWR", "count": 5}]}, run_id="scheduled__2013-01-01",
                          dag_id="flights_dag")
    context = context_for(ti)
    context["data_interval_start"], context["data_interval_end"] = START, START + dt.timedelta(days=1)
    output = op.execute(context)
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT * FROM {table}")).mappings().all()
    published = {row["origin"]: row["value"] for row in output["aggregates"]["flights"]["rows"]}
    assert len(rows) == 3 and {row["value"] for row in rows} == set(published.values())
