"""DPReleaseOperator called directly (``op.execute(context)``), as Airflow's own provider tests do."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowRescheduleException
from dp_operators.operators.release import LEASE_WAIT_MARGIN, LEASE_WAIT_MIN, DPReleaseOperator, release_csv
from dp_operators.spec import SpecError

from airflow_fakes import FakeAssetEvents, FakeTaskInstance, context_for, emitted_events
from operator_ledgers import connect_ledger
from support import EXAMPLE_SPEC, example_charge, make_ledger, spender


#: where the fake task instance's files go: <release>/<dag_id>/<encoded run id>
RUN_FOLDER = Path("adult_census_statistics") / "adult_census_release" / "manual__2026-11-29T10%3A00%3A00%2B00%3A00"


@pytest.fixture
def ledger_conn(tmp_path: Path, monkeypatch):
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path, cap=str(2 * example_charge()))
    connect_ledger(monkeypatch, "dp_ledger_test", path)
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
    folder = tmp_path / "out" / RUN_FOLDER
    assert json.loads((folder / "release.json").read_text()) == output
    assert ti.pushed == {"release_location": (folder / "release.json").as_uri()}  # the folder's "%" as "%25"
    csv_lines = (folder / "release.csv").read_text().splitlines()
    assert csv_lines[0] == "aggregate,kind,key,value,half_width,confidence,mechanism,saturated,lower,upper"
    assert len(csv_lines) == 1 + 32 + 7 + 1 + 1  # header, the counts, the mean, the median
    assert (folder / "release.csv").read_text() == release_csv(output)
    ((asset, extra),) = emitted_events(context, op)
    assert asset == op.release_asset and asset.uri == "dp-release://adult_census_statistics/"
    assert extra["release"] == "adult_census_statistics"
    assert extra["charge"]["rho_exact"] == str(example_charge())
    json.dumps(extra, allow_nan=False)


def test_retry_returns_the_stored_release_byte_for_byte(tmp_path, ledger_conn, adult_aggregates):
    history = FakeAssetEvents()  # what Airflow records of the successful tries' events
    first_ti, first_op = FakeTaskInstance(adult_aggregates), operator(tmp_path)
    first_context = context_for(first_ti, history)
    first = first_op.execute(first_context)
    history.record(first_context, first_ti, first_op)
    folder = tmp_path / "out" / RUN_FOLDER
    first_bytes = {name: (folder / name).read_bytes() for name in ("release.json", "release.csv")}
    retry_op = operator(tmp_path)
    retry_context = context_for(FakeTaskInstance(adult_aggregates, try_number=2), history)
    retry = retry_op.execute(retry_context)
    assert json.dumps(retry) == json.dumps(first)  # same keys in the same order: the XCom is identical
    assert {name: (folder / name).read_bytes() for name in first_bytes} == first_bytes
    assert len(emitted_events(first_context, first_op)) == 1
    assert emitted_events(retry_context, retry_op) == []  # a replay of an announced release announces nothing
    assert len(list(ledger_conn.charges())) == 1


def test_exhaustion_fails_the_task_without_retry_and_publishes_nothing(tmp_path, ledger_conn, adult_aggregates):
    for run in ("a", "b"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates, run_id=run)))
    refused = FakeTaskInstance(adult_aggregates, run_id="c")
    with pytest.raises(AirflowFailException, match="remaining 0, short by"):
        operator(tmp_path).execute(context_for(refused))
    assert not (tmp_path / "out" / "adult_census_statistics" / "adult_census_release" / "c").exists()
    assert len(list(ledger_conn.charges())) == 2
    # the "DP release" link's key exists, empty: no link, and no "XCom not found" error when Airflow reads it
    assert refused.pushed == {"release_location": ""}


def test_missing_upstream_value_fails_clearly(tmp_path, ledger_conn):
    with pytest.raises(AirflowFailException, match="returned no aggregates"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(None)))
    with pytest.raises(AirflowFailException, match="did not provide"):
        operator(tmp_path).execute(context_for(FakeTaskInstance({"people_by_age_band": []})))
    assert list(ledger_conn.charges()) == []


def test_a_dag_not_allowed_on_the_account_is_refused(tmp_path, ledger_conn, adult_aggregates):
    ti = FakeTaskInstance(adult_aggregates, dag_id="someone_elses_dag")
    with pytest.raises(AirflowFailException, match="may not spend from budget account 'census_adult'"):
        operator(tmp_path).execute(context_for(ti))
    assert list(ledger_conn.charges()) == []


def test_bad_spec_fails_at_construction_with_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE_SPEC.read_text().replace("budget: {epsilon: 0.3}", "budget: {epsilon: .nan}"))
    with pytest.raises(SpecError) as caught:
        DPReleaseOperator(
            task_id="release", spec_path=bad, aggregates_task_id="x", output_uri=f"file://{tmp_path}"
        )
    assert str(bad) in str(caught.value)
    assert "aggregates[1](people_by_age_band).budget.epsilon" in str(caught.value)


def test_only_the_output_and_diagnostics_locations_are_templated():
    """Locations only: Airflow stores rendered fields in its database and shows them in the UI."""
    assert DPReleaseOperator.template_fields == ("aggregates_uri", "rows_uri", "output_uri", "diagnostics_uri")


def test_aggregates_can_be_passed_by_reference(tmp_path, ledger_conn, adult_aggregates):
    stored = tmp_path / "aggregates.json"
    stored.write_text(json.dumps(adult_aggregates))
    output = operator(tmp_path).execute(context_for(FakeTaskInstance(f"file://{stored}")))
    assert len(output["aggregates"]["people_by_education_sex"]["rows"]) == 32
    with pytest.raises(AirflowFailException, match="absent.json was not found; check the URI"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(f"file://{tmp_path}/absent.json", run_id="x")))
    assert len(list(ledger_conn.charges())) == 1


def test_retry_replays_even_when_the_upstream_value_is_gone(tmp_path, ledger_conn, adult_aggregates):
    first = operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
    ti = FakeTaskInstance(None, try_number=2)
    assert operator(tmp_path).execute(context_for(ti)) == first
    assert ti.pulls == []  # a replay never reads the true aggregates
    assert len(list(ledger_conn.charges())) == 1


def diagnosed_operator(tmp_path: Path) -> DPReleaseOperator:
    return DPReleaseOperator(
        task_id="release",
        spec_path=EXAMPLE_SPEC,
        aggregates_task_id="compute_aggregates",
        output_uri=f"file://{tmp_path / 'out'}",
        diagnostics_uri=f"file://{tmp_path / 'private'}",
        ledger_conn_id="dp_ledger_test",
    )



def task_log(capsys) -> list[str]:
    """The operator's log lines (Airflow's structlog writes them to stdout) less their timestamps."""
    return [re.sub(r"^\S+Z ", "", line) for line in capsys.readouterr().out.splitlines()]


def test_diagnostics_are_written_beside_the_release_path_and_only_their_location_is_logged(
    tmp_path, ledger_conn, adult_aggregates, capsys
):
    aggregates = json.loads(json.dumps(adult_aggregates))
    aggregates["people_by_age_band"].append({"age_band": "0-16", "count": 777})
    diagnosed_operator(tmp_path).execute(context_for(FakeTaskInstance(aggregates)))
    report = json.loads((tmp_path / "private" / RUN_FOLDER / "release~diagnostics.json").read_text())
    assert (tmp_path / "out" / RUN_FOLDER / "release.json").exists()
    seen = report["aggregates"]["people_by_age_band"]
    assert seen["rows_outside_domain"] == 1 and seen["outside_domain_examples"] == [["0-16"]]
    assert report["notice"].startswith("Exact, data-derived numbers")
    logged = "\n".join(task_log(capsys))
    assert "wrote the diagnostics report (exact, data-derived; not for publication) to file://" in logged
    assert "777" not in logged and "0-16" not in logged and "domain" not in logged


def test_no_diagnostics_without_a_location(tmp_path, ledger_conn, adult_aggregates):
    operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
    assert not (tmp_path / "private").exists()
    assert not list((tmp_path / "out").rglob("*diagnostics.json"))


def test_diagnostics_are_written_when_the_release_is_refused(tmp_path, ledger_conn, adult_aggregates):
    aggregates = json.loads(json.dumps(adult_aggregates))
    aggregates["people_by_age_band"].insert(3, {"age_band": "75+", "count": b"12"})
    with pytest.raises(AirflowFailException, match="a row's field 'count' holds a bytes, not a number"):
        diagnosed_operator(tmp_path).execute(context_for(FakeTaskInstance(aggregates)))
    (written,) = (tmp_path / "private").rglob("release~diagnostics.json")
    problems = json.loads(written.read_text())["aggregates"]["people_by_age_band"]["problems"]
    assert [(p["row"], p["field"]) for p in problems] == [(3, "count")]
    assert list(ledger_conn.charges()) == []


def test_a_failure_after_the_reservation_fails_the_task_without_retry_or_the_causes_text(
    tmp_path, ledger_conn, adult_aggregates, monkeypatch
):
    """Airflow retries any exception but AirflowFailException; a retry would charge again. The original
    exception's text is not audited for data, so it is not chained into the task log."""
    import dp_operators.release.run as engine

    def fails(*args, **kwargs):
        raise TypeError("rows[3].education: str_ 'Preschool' is not plain JSON")

    monkeypatch.setattr(engine, "publish_aggregate", fails)
    with pytest.raises(AirflowFailException) as failed:
        operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
    assert "failed after its budget was reserved (TypeError)" in str(failed.value)
    assert "Preschool" not in str(failed.value)
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
    # noise was drawn: the charge stays spent, and its lease is given up so a rerun need not wait for it
    assert [charge["state"] for charge in ledger_conn.charges()] == ["abandoned"]


@pytest.mark.parametrize("neighbour", [
    pytest.param(lambda a: a["people_by_age_band"].append({"age_band": "0-16", "count": 1}), id="an unlisted key"),
    pytest.param(lambda a: a["people_by_age_band"].append({"age_band": "75+", "count": None}), id="a NULL count"),
    pytest.param(lambda a: a["people_by_education_sex"][0].update(count=a["people_by_education_sex"][0]["count"] + 1),
                 id="one more person in a cell"),
])
def test_the_task_log_is_the_same_on_neighbouring_inputs(tmp_path, ledger_conn, adult_aggregates, capsys, neighbour):
    logs = []
    for run, change in (("a", lambda a: None), ("b", neighbour)):
        aggregates = json.loads(json.dumps(adult_aggregates))
        change(aggregates)
        diagnosed_operator(tmp_path).execute(context_for(FakeTaskInstance(aggregates, run_id=run)))
        logs.append([line.replace(f"/{run}/", "/<run>/") for line in task_log(capsys)])
    assert logs[0] == logs[1] and logs[0]


def test_an_unexpected_error_is_retryable_and_carries_no_frames_or_text(tmp_path, ledger_conn, adult_aggregates,
                                                                          monkeypatch):
    """The engine's frames hold the true aggregates in their locals (error reporters capture them): an error that
    is not one of the engine's own reaches Airflow with its type only, no chained traceback, and stays retryable
    (it happened before any reservation)."""
    import dp_operators.release.run as engine

    def failing(*args, **kwargs):
        raise OSError("disk full at /secret/path with 12345 rows")

    monkeypatch.setattr(engine, "prepare_inputs", failing)
    with pytest.raises(AirflowException) as failed:
        operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
    assert not isinstance(failed.value, AirflowFailException)
    assert "OSError" in str(failed.value) and "12345" not in str(failed.value)
    assert failed.value.__suppress_context__ and failed.value.__cause__ is None
    assert list(ledger_conn.charges()) == []


def _states(ledger) -> list[tuple[int, str]]:
    return [(charge["attempt"], charge["state"]) for charge in ledger.charges()]


def test_a_second_try_while_the_first_holds_the_lease_waits_without_spending_a_try_then_replays(
    tmp_path, ledger_conn, adult_aggregates, monkeypatch, capsys
):
    """Airflow can start try 2 while try 1 still draws (a zombie, a lost heartbeat). Try 2 must not be charged,
    must not fail, and must not spend a try: it is rescheduled to the lease's end (Airflow's reschedule keeps the
    try number) and says who holds the lease until when; once try 1 has committed, the same try 2 runs again and
    replays its output without reading the aggregates or charging. The lease is 3 s here (renewed every
    second, so a keeper stalled 2 s by a loaded machine still holds it) and try 1 draws until its first lease has
    ended: it holds the release only because the engine renews the lease while it draws."""
    import dp_operators.release.run as engine
    from dp_operators.hooks.ledger import DPLedgerHook

    connection_ledger = DPLedgerHook.get_ledger

    def short_lease(self):
        ledger = connection_ledger(self)
        ledger.lease_seconds = 3.0
        return ledger

    monkeypatch.setattr(DPLedgerHook, "get_ledger", short_lease)

    drawing, finish = threading.Event(), threading.Event()
    real_draw = engine.draw_noise
    calls = []

    def slow_first_draw(*args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:  # try 1 only: it holds its lease while "drawing"
            drawing.set()
            assert finish.wait(120)
        return real_draw(*args, **kwargs)

    monkeypatch.setattr(engine, "draw_noise", slow_first_draw)
    first: dict = {}

    def try_one() -> None:
        try:
            first["output"] = operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates)))
        except BaseException as error:  # reported by the assertion below
            first["error"] = error

    thread = threading.Thread(target=try_one, name="try-1")
    thread.start()
    try:
        assert drawing.wait(120), first
        (charge,) = ledger_conn.charges()
        first_end = charge["lease_expires_at"]
        first_end = first_end if first_end.tzinfo else first_end.replace(tzinfo=dt.timezone.utc)
        while dt.datetime.now(dt.timezone.utc) <= first_end:  # past the unrenewed lease's end
            time.sleep(0.05)
        before = dt.datetime.now(dt.timezone.utc)
        capsys.readouterr()
        with pytest.raises(AirflowRescheduleException) as waiting:
            operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates, try_number=2)))
        after = dt.datetime.now(dt.timezone.utc)
        [message] = [line for line in task_log(capsys) if "holds the budget lease" in line]
        assert "another try of release 'adult_census_statistics'" in message, message
        assert "ledger attempt 1) is still running" in message and "nothing was charged" in message
        assert "This task waits (rescheduled to " in message and "no try spent" in message
        until = dt.datetime.fromisoformat(re.search(r"holds the budget lease until (\S+);", message).group(1))
        assert until >= before.replace(microsecond=0)  # renewed: the unrenewed lease has ended
        # rescheduled past the renewed lease's end, within one lease (3 s) of now, but never sooner than
        # LEASE_WAIT_MIN (5 s)
        wake = waiting.value.reschedule_date
        assert wake.tzinfo is not None and wake > until
        assert before + LEASE_WAIT_MIN <= wake <= after + LEASE_WAIT_MIN
        assert waiting.value.__cause__ is None and waiting.value.__suppress_context__
        # nothing charged, refused or published for try 2; try 1 still holds its reservation
        assert _states(ledger_conn) == [(1, "reserved")]
        assert [e["event"] for e in ledger_conn.events("census_adult")] == ["account_created", "reserved"]
        assert ledger_conn.account("census_adult").spent == example_charge()
        assert not (tmp_path / "out").exists()
        assert calls == ["try-1"]
    finally:
        finish.set()
        thread.join(60)
    assert "error" not in first, first.get("error")

    ti = FakeTaskInstance(None, try_number=2)  # try 2 run again once try 1 committed: a replay
    assert operator(tmp_path).execute(context_for(ti)) == first["output"]
    assert ti.pulls == [] and calls == ["try-1"]
    assert _states(ledger_conn) == [(1, "committed")]
    assert ledger_conn.account("census_adult").spent == example_charge()


def test_a_try_after_a_dead_tries_lease_expired_takes_the_release_over(tmp_path, ledger_conn, adult_aggregates):
    """Try 1 reserved and died (its lease was not renewed): the next try abandons its charge (still spent) and is
    charged again, as a try that cannot know whether noise was drawn must be."""
    from dp_operators.ledger import ReleaseKey

    dead = spender(str(ledger_conn.engine.url), lease_seconds=0.2)
    ti = FakeTaskInstance(adult_aggregates, try_number=2)
    key = ReleaseKey(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, "adult_census_statistics")
    dead.reserve(key, account="census_adult", amount=example_charge(), mechanisms=[], spec_hash="0" * 64)
    time.sleep(0.3)
    output = operator(tmp_path).execute(context_for(ti))
    assert output["release_key"]["run_id"] == ti.run_id
    assert _states(ledger_conn) == [(1, "abandoned"), (2, "committed")]
    assert ledger_conn.account("census_adult").spent == 2 * example_charge()


def test_run_ids_that_used_to_collide_or_escape_publish_to_their_own_files(tmp_path, ledger_conn, adult_aggregates):
    """`2026-01:eu` and `2026-01+eu` once shared a folder, `..` wrote outside the release folder."""
    outputs = {}
    for run_id in ("2026-01:eu", "2026-01+eu"):
        outputs[run_id] = operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates, run_id=run_id)))
    written = sorted((tmp_path / "out").rglob("release.json"))
    assert len(written) == 2
    assert {json.loads(p.read_text())["release_key"]["run_id"] for p in written} == set(outputs)
    assert all((tmp_path / "out" / "adult_census_statistics" / "adult_census_release") in p.parents for p in written)


def test_two_dags_sharing_a_spec_and_a_run_id_keep_their_own_files(tmp_path, tmp_path_factory, adult_aggregates,
                                                                     monkeypatch):
    path = tmp_path / "ledger.db"
    make_ledger(path, cap=str(2 * example_charge()), dags=("dag_a", "dag_b"))
    connect_ledger(monkeypatch, "dp_ledger_test", path)
    scheduled = "scheduled__2026-01-01T00:00:00+00:00"
    for dag_id in ("dag_a", "dag_b"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates, dag_id=dag_id, run_id=scheduled)))
    files = {p.parent.parent.name: json.loads(p.read_text()) for p in (tmp_path / "out").rglob("release.json")}
    assert {name: output["release_key"]["dag_id"] for name, output in files.items()} == {"dag_a": "dag_a",
                                                                                         "dag_b": "dag_b"}


def test_outlets_of_the_dag_author_announce_through_the_alias_once(tmp_path, ledger_conn, adult_aggregates):
    """With outlets of its own the release asset is not a declared outlet: the event goes through the alias."""
    from airflow.sdk import Asset

    extra_asset = Asset("elsewhere", uri="file:///elsewhere")
    op = DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="compute_aggregates",
                           output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_test",
                           outlets=[extra_asset])
    context = context_for(FakeTaskInstance(adult_aggregates))
    op.execute(context)
    announced = [asset for asset, _ in emitted_events(context, op)]
    assert sorted(a.name for a in announced) == ["adult_census_statistics", "elsewhere"]


def test_a_diagnostics_location_inside_the_published_one_is_refused_before_the_charge(tmp_path, ledger_conn,
                                                                                       adult_aggregates):
    op = DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="compute_aggregates",
                           output_uri=f"file://{tmp_path / 'out'}", diagnostics_uri=f"file://{tmp_path / 'out' / 'd'}",
                           ledger_conn_id="dp_ledger_test")
    with pytest.raises(AirflowFailException, match="must never sit beside published files"):
        op.execute(context_for(FakeTaskInstance(adult_aggregates)))
    assert list(ledger_conn.charges()) == []
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.json"))


def test_the_temporary_run_of_tasks_test_is_refused_before_the_charge(tmp_path, ledger_conn, adult_aggregates):
    """`airflow tasks test DAG release <mistyped run id>` runs the task in `__airflow_temporary_run_<now>__`: each
    call would be a new release, charged; a replay needs the real run's id."""
    ti = FakeTaskInstance(adult_aggregates, run_id="__airflow_temporary_run_2026-11-30T16:00:00+00:00__")
    with pytest.raises(AirflowFailException, match="temporary run `airflow tasks test` makes"):
        operator(tmp_path).execute(context_for(ti))
    with pytest.raises(AirflowFailException, match="cannot be released"):
        operator(tmp_path).execute(context_for(FakeTaskInstance(adult_aggregates, run_id=".")))
    assert list(ledger_conn.charges()) == []


@pytest.mark.parametrize("location", ["relout", "releases/adult", "./out"])
def test_a_relative_output_location_is_refused_at_construction(tmp_path, location):
    with pytest.raises(ValueError, match="is a relative path; give a URI"):
        DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="x", output_uri=location)


@pytest.mark.parametrize("location", ["file://relout", "file://releases/adult", "local://out"])
def test_a_file_uri_with_two_slashes_is_refused_at_construction(tmp_path, location):
    with pytest.raises(ValueError, match="as a host, and the files would land under whichever directory"):
        DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="x", output_uri=location)
    DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="x",
                      output_uri=f"file://localhost{tmp_path}")  # a local host is this machine


def _held(expires_at: dt.datetime | None):
    from dp_operators.ledger import LeaseHeldError

    return LeaseHeldError("held", attempt=1, expires_at=expires_at)


NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(("expires_in", "waits"), [
    pytest.param(60.0, 61.0, id="the lease's end and the margin"),
    pytest.param(4.5, 5.5, id="a lease ending soon: its end and the margin"),
    pytest.param(0.5, 5.0, id="a lease ending now: the least wait"),
    pytest.param(-30.0, 5.0, id="a lease already over on the ledger's clock: the least wait, not the past"),
    pytest.param(7200.0, 121.0, id="a lease beyond one lease from now (a clock ahead): one lease and the margin"),
    pytest.param(None, 121.0, id="no lease end known: one lease and the margin"),
])
def test_a_held_lease_reschedules_to_its_end_within_one_lease(expires_in, waits):
    from dp_operators.operators.release import lease_wait_until

    end = None if expires_in is None else NOW + dt.timedelta(seconds=expires_in)
    assert lease_wait_until(_held(end), 120.0, now=NOW) == NOW + dt.timedelta(seconds=waits)


def test_a_lease_shorter_than_the_least_wait_still_waits_the_least():
    from dp_operators.operators.release import lease_wait_until

    assert lease_wait_until(_held(NOW + dt.timedelta(seconds=1)), 1.0, now=NOW) == NOW + LEASE_WAIT_MIN


class _WaitingTaskInstance(FakeTaskInstance):
    """A task instance rescheduled before, first at ``first_wait`` (what Airflow's supervisor reports)."""

    first_wait: dt.datetime | None = None

    def get_first_reschedule_date(self, context):
        return self.first_wait


@pytest.mark.parametrize(("waited", "fails"), [(dt.timedelta(hours=2), True), (dt.timedelta(minutes=30), False)])
def test_a_task_waiting_for_a_lease_past_its_timeout_fails_without_retry(tmp_path, ledger_conn, adult_aggregates,
                                                                          waited, fails):
    """A holder renewing its lease for ever (a hung try whose keeper thread lives, or a reservation of this key
    made by someone else) must not park the task in up_for_reschedule for ever."""
    from dp_operators.ledger import ReleaseKey

    holder = spender(str(ledger_conn.engine.url), lease_seconds=600)
    ti = _WaitingTaskInstance(adult_aggregates, try_number=2)
    ti.first_wait = dt.datetime.now(dt.timezone.utc) - waited
    key = ReleaseKey(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, "adult_census_statistics")
    holder.reserve(key, account="census_adult", amount=example_charge(), mechanisms=[], spec_hash="0" * 64)
    op = DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="compute_aggregates",
                           output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_test",
                           lease_wait_timeout=dt.timedelta(hours=1))
    expected = AirflowFailException if fails else AirflowRescheduleException
    with pytest.raises(expected) as raised:
        op.execute(context_for(ti))
    if fails:
        assert "longer than lease_wait_timeout (1:00:00)" in str(raised.value)
        assert "ledger attempt 1's lease" in str(raised.value) and "nothing was charged" in str(raised.value)
    assert _states(ledger_conn) == [(1, "reserved")]


def test_a_lease_wait_timeout_that_is_not_a_positive_timedelta_is_refused_at_construction():
    with pytest.raises(ValueError, match="lease_wait_timeout must be a positive timedelta, got 3600"):
        DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="x",
                          lease_wait_timeout=3600)


def test_a_naive_lease_end_is_read_as_utc():
    from dp_operators.operators.release import lease_wait_until

    naive = (NOW + dt.timedelta(seconds=60)).replace(tzinfo=None)
    assert lease_wait_until(_held(naive), 120.0, now=NOW) == NOW + dt.timedelta(seconds=61)


def test_a_value_past_its_column_fails_the_publication_without_retry(tmp_path, ledger_conn, adult_aggregates,
                                                                       monkeypatch):
    """A noised value beyond its Parquet column's range (a tail of probability below 2^-127 per value) fails every
    replay alike: the committed release's publication fails for good, naming the column and not the value."""
    from dp_operators.release.value_types import ColumnRangeError, ValueType

    def out_of_range(self, value):
        raise ColumnRangeError("a value does not fit the int64 value column")

    monkeypatch.setattr(ValueType, "column_value", out_of_range)
    op = DPReleaseOperator(task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="compute_aggregates",
                           output_uri=f"file://{tmp_path / 'out'}", output_formats=["json", "parquet"],
                           ledger_conn_id="dp_ledger_test")
    with pytest.raises(AirflowFailException, match="is committed in the ledger but cannot be published as asked: "
                                                   "aggregate '\\w+': a value does not fit the int64 value column"):
        op.execute(context_for(FakeTaskInstance(adult_aggregates)))
    assert [charge["state"] for charge in ledger_conn.charges()] == ["committed"]
