"""The slice of Airflow's task runtime an operator's ``execute`` uses, for tests that call it directly (as Airflow's
own provider tests do): a task instance, the outlet-event accessor of an asset alias, and the asset events Airflow
recorded, read back through ``inlet_events``."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace


@dataclass
class FakeTaskInstance:
    """The slice of Airflow's RuntimeTaskInstance the release operators use; ``upstream`` is what XCom returns."""

    upstream: object = None
    run_id: str = "manual__2026-11-29T10:00:00+00:00"
    dag_id: str = "adult_census_release"
    task_id: str = "release"
    map_index: int = -1
    try_number: int = 1
    pulls: list = field(default_factory=list)
    pushed: dict = field(default_factory=dict)

    def xcom_pull(self, task_ids, key="return_value", map_indexes=None):
        self.pulls.append((task_ids, key))
        return self.upstream

    def xcom_push(self, key, value):
        self.pushed[key] = value


class AliasEvents:
    """The outlet-event accessor of an AssetAlias: the events a task adds to it."""

    def __init__(self):
        self.added = []

    def add(self, asset, extra=None):
        self.added.append((asset, extra or {}))


class FakeAssetEvents:
    """What Airflow records of a release's asset events, read back by the operator through ``inlet_events``: the
    events added by tries that succeeded (call :meth:`record` after a successful ``execute``)."""

    def __init__(self):
        self.events = []

    def record(self, context, ti) -> None:
        for accessor in context["outlet_events"].values():
            for _asset, extra in accessor.added:
                self.events.append(SimpleNamespace(
                    source_dag_id=ti.dag_id, source_run_id=ti.run_id, source_task_id=ti.task_id,
                    source_map_index=ti.map_index, extra=extra,
                ))

    def __getitem__(self, asset):  # inlet_events[asset]
        return self

    def after(self, timestamp):
        return list(self.events)


def context_for(ti, history: FakeAssetEvents | None = None) -> dict:
    """The task context ``execute`` reads: the task instance, outlet events, and the recorded asset events."""
    return {"ti": ti, "outlet_events": defaultdict(AliasEvents), "inlet_events": history or FakeAssetEvents()}
