"""``DPReleaseOperator._announced`` (release.py:247-266): a replay reads the release asset's events through
Airflow's real ``InletEventsAccessors`` (the object the task runner puts in ``context["inlet_events"]``), answered by
a fake supervisor with the execution API's semantics (``routes/asset_events.py``: ``timestamp >= after``, ascending,
optional ``limit``; the timestamp is the API server's clock when it records the successful try, not the worker's).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path

import pytest

import airflow.sdk.execution_time.task_runner as task_runner
from airflow.sdk import Asset
from airflow.sdk.api.datamodels._generated import AssetEventResponse, AssetResponse
from airflow.sdk.exceptions import AirflowException
from airflow.sdk.execution_time.comms import AssetEventsResult, GetAssetEventByAsset
from airflow.sdk.execution_time.context import InletEventsAccessors
from dp_operators.operators.release import DPReleaseOperator

from airflow_fakes import AliasEvents, FakeTaskInstance
from operator_ledgers import connect_ledger
from operator_specs import CITY_COUNTS, city_count_spec
from support import make_ledger

DAG = "announce_dag"
ACCOUNT = "announce_account"
RELEASE = "announce_release"
SPEC = city_count_spec(RELEASE, ACCOUNT)
AGGREGATES = CITY_COUNTS


class ApiServer:
    """The asset-event table of Airflow's metadata DB and the execution API's ``GET asset-events/by-asset``."""

    def __init__(self, clock_offset: dt.timedelta = dt.timedelta(0)):
        self.events: list[AssetEventResponse] = []
        self.clock_offset = clock_offset  # API server clock minus worker clock
        self.shipped = 0  # events sent to tasks
        self.requests: list[GetAssetEventByAsset] = []

    def record(self, context, ti, op) -> None:
        """A try succeeded: the API server stores its events, stamped with its own clock."""
        stamp = dt.datetime.now(dt.timezone.utc) + self.clock_offset
        for asset, extra in emitted(context, op):
            self.add(asset, ti.dag_id, ti.run_id, ti.task_id, ti.map_index, stamp, extra)

    def add(self, asset, dag_id, run_id, task_id, map_index, stamp, extra=None) -> None:
        self.events.append(AssetEventResponse(
            id=len(self.events) + 1, timestamp=stamp, extra=extra or {},
            asset=AssetResponse(name=asset.name, uri=asset.uri, group="asset"), created_dagruns=[],
            source_dag_id=dag_id, source_run_id=run_id, source_task_id=task_id, source_map_index=map_index,
        ))

    def send(self, msg):  # SUPERVISOR_COMMS.send
        assert isinstance(msg, GetAssetEventByAsset)
        self.requests.append(msg)
        found = [e for e in self.events if e.asset.name == msg.name and e.asset.uri == msg.uri
                 and (msg.after is None or e.timestamp >= msg.after)
                 and (msg.before is None or e.timestamp <= msg.before)]
        found.sort(key=lambda e: e.timestamp, reverse=not msg.ascending)
        if msg.limit:
            found = found[: msg.limit]
        self.shipped += len(found)
        return AssetEventsResult(asset_events=found)


@pytest.fixture
def env(tmp_path: Path, monkeypatch):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path, cap="100", accountant="pure_dp", dags=(DAG,), account=ACCOUNT)
    connect_ledger(monkeypatch, "dp_ledger_announce", path)
    return spec, ledger


def operator(spec: Path, out: Path, **kwargs) -> DPReleaseOperator:
    return DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="compute",
                             output_uri=f"file://{out}", ledger_conn_id="dp_ledger_announce", **kwargs)


def real_context(op: DPReleaseOperator, ti) -> dict:
    """What the task runner gives ``execute``: ``inlet_events`` built from the task's declared inlets."""
    return {"ti": ti, "outlet_events": defaultdict(AliasEvents), "inlet_events": InletEventsAccessors(op.inlets)}


def emitted(context, op) -> list[tuple]:
    """The events Airflow emits at the try's success (task_runner.finalize): one per Asset among the task's outlets
    as they are when execute returns, plus those added through an alias."""
    events = [(o, getattr(context["outlet_events"][o], "extra", None) or {})
              for o in op.outlets or [] if isinstance(o, Asset)]
    for accessor in list(context["outlet_events"].values()):
        events += getattr(accessor, "added", [])
    return [(asset, extra) for asset, extra in events if asset == op.release_asset]


def announced(context, op) -> int:
    return len(emitted(context, op))


# -- 1. released_at is the worker's clock; the event's timestamp is the API server's --------------------------------

def test_a_cleared_task_stays_silent_when_the_worker_clock_runs_ahead(env, tmp_path, monkeypatch):
    """Try 1 releases and succeeds; the API server (whose clock is 3 s behind the worker's: ordinary drift between
    a Celery/Kubernetes worker and the API server) stamps its event 3 s before the worker's ``released_at``. The task
    is cleared: the replay asks for events ``after(released_at)``, misses try 1's, and announces the same release a
    second time, re-triggering every asset-scheduled consumer; it must not."""
    spec, ledger = env
    server = ApiServer(clock_offset=dt.timedelta(seconds=-3))
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", server, raising=False)
    op = operator(spec, tmp_path / "out")
    ti = FakeTaskInstance(upstream=AGGREGATES, dag_id=DAG)
    context = real_context(op, ti)
    op.execute(context)
    assert announced(context, op) == 1
    server.record(context, ti, op)  # try 1 succeeded

    ti.try_number = 2  # cleared and rerun: a replay (Airflow builds a fresh operator per try)
    op = operator(spec, tmp_path / "out")
    context = real_context(op, ti)
    op.execute(context)
    assert announced(context, op) == 0, (
        "the replay announced the release again: try 1's event is stamped by the API server's clock, earlier than the "
        "worker's released_at, so after(released_at) does not return it"
    )


# -- 2. the replay reads every event of the asset since the release -------------------------------------------------

def test_a_replay_of_an_old_run_does_not_download_the_assets_whole_history(env, tmp_path, monkeypatch):
    """A release shared by many map indexes / DAGs / runs (one asset per release name): 5000 events follow the one
    this task instance added. Clearing that old run makes its replay fetch all 5000 (each with its created_dagruns,
    loaded one query per event by the API server) in one response, to find the first one."""
    spec, ledger = env
    server = ApiServer()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", server, raising=False)
    op = operator(spec, tmp_path / "out")
    ti = FakeTaskInstance(upstream=AGGREGATES, dag_id=DAG)
    context = real_context(op, ti)
    op.execute(context)
    server.record(context, ti, op)
    start = server.events[0].timestamp
    for n in range(5000):  # later releases of the same release name (other map indexes, runs, DAGs)
        server.add(op.release_asset, DAG, f"later_{n}", "release", n % 50, start + dt.timedelta(seconds=1 + n))

    ti.try_number = 2
    op = operator(spec, tmp_path / "out")
    context = real_context(op, ti)
    op.execute(context)
    assert announced(context, op) == 0
    assert server.shipped <= 100, (
        f"the replay fetched {server.shipped} asset events in {len(server.requests)} request(s) "
        f"(after={server.requests[-1].after}, limit={server.requests[-1].limit}) to find one"
    )


# -- 3. inlets given by the DAG author drop the release asset -------------------------------------------------------

def test_inlets_given_by_the_dag_author_keep_the_release_asset(env, tmp_path):
    """``inlets`` is only defaulted (``kwargs.setdefault``), like ``outlets``. A DAG author
    declaring their input for lineage (``inlets=[Asset("raw_census")]``) drops the release asset: it is no longer
    registered at parse time (the concurrent-creation race the comment in __init__ describes returns) and
    ``_announced`` gets a KeyError, answers True, so a release whose first try died after the commit is never
    announced."""
    spec, _ = env
    op = operator(spec, tmp_path / "out", inlets=[Asset(name="raw_census", uri="s3://lake/census")])
    assert op.release_asset in op.inlets


def test_a_release_first_published_by_a_retry_is_announced_despite_author_inlets(env, tmp_path, monkeypatch):
    spec, ledger = env
    server = ApiServer()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", server, raising=False)
    out = tmp_path / "out"
    out.mkdir()
    (out / RELEASE).write_text("not a folder")  # storage refuses try 1's write, after the commit
    op = operator(spec, out, inlets=[Asset(name="raw_census", uri="s3://lake/census")])
    ti = FakeTaskInstance(upstream=AGGREGATES, dag_id=DAG)
    with pytest.raises(AirflowException, match="committed in the ledger"):
        op.execute(real_context(op, ti))
    (out / RELEASE).unlink()
    ti.try_number = 2
    op = operator(spec, out, inlets=[Asset(name="raw_census", uri="s3://lake/census")])
    context = real_context(op, ti)
    op.execute(context)
    assert ledger.account(ACCOUNT).spent > 0
    assert announced(context, op) == 1, "a new, charged release was published by try 2 but never announced"


def test_a_release_mapped_over_its_spec_reads_its_own_asset_events(env, tmp_path):
    """The docstring of RELEASE_ALIAS supports 'mapped operators (whose spec may be an expanded argument)'.
    ``.partial(aggregates_task_id=...).expand(spec_path=[...])``: ``partial()`` cannot know the release, so it adds no
    inlet; Airflow's partial defaults hold ``inlets: []``, so the unmapped task's ``__init__`` ``setdefault`` keeps
    ``[]``. At run time ``inlet_events`` has no entry for the release asset: ``_announced`` answers True on the
    KeyError and a release first published by a retry is never announced (and the asset is not registered at parse
    time)."""
    import datetime

    from airflow.sdk import DAG as Dag

    spec, _ = env
    with Dag("announce_mapped", schedule=None, start_date=datetime.datetime(2026, 1, 1)):
        mapped = DPReleaseOperator.partial(task_id="release", aggregates_task_id="compute",
                                           ledger_conn_id="dp_ledger_announce").expand(spec_path=[str(spec)])
    runtime = mapped.unmap({"spec_path": str(spec)})  # what the task runner executes for map index 0
    assert runtime.release_asset in runtime.inlets, f"runtime inlets: {runtime.inlets}"
