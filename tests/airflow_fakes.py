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


def emitted_events(context, operator) -> list[tuple]:
    """The asset events Airflow emits when ``operator``'s ``execute`` returns: one per ``Asset`` among the
    operator's outlets *as they are then* (with the ``extra`` set on its accessor), plus every event added to an
    alias (as ``task_runner.finalize`` builds them: ``task_outlets`` from ``ti.task.outlets``). As (asset, extra)."""
    from airflow.sdk import Asset

    events = [(outlet, getattr(context["outlet_events"][outlet], "extra", None) or {})
              for outlet in operator.outlets or [] if isinstance(outlet, Asset)]
    for accessor in list(context["outlet_events"].values()):
        events += getattr(accessor, "added", [])
    return events


class FakeAssetEvents:
    """What Airflow records of a release's asset events, read back by the operator through ``inlet_events``: the
    events of tries that succeeded (call :meth:`record` after a successful ``execute``)."""

    def __init__(self):
        self.events = []

    def record(self, context, ti, operator) -> None:
        for _asset, extra in emitted_events(context, operator):
            self.events.append(SimpleNamespace(
                source_dag_id=ti.dag_id, source_run_id=ti.run_id, source_task_id=ti.task_id,
                source_map_index=ti.map_index, extra=extra,
            ))

    def __getitem__(self, asset):  # inlet_events[asset]: the accessor, read oldest first
        return self

    def after(self, timestamp):
        return self

    def ascending(self, ascending=True):
        return self

    def limit(self, limit):
        return self

    def __iter__(self):
        return iter(list(self.events))


def context_for(ti, history: FakeAssetEvents | None = None) -> dict:
    """The task context ``execute`` reads: the task instance, outlet events, and the recorded asset events."""
    return {"ti": ti, "outlet_events": defaultdict(AliasEvents), "inlet_events": history or FakeAssetEvents()}


@dataclass
class NoXComTaskInstance(FakeTaskInstance):
    """A task instance for operators that must not read XCom (SQL and file sources): pulling fails the test."""

    def xcom_pull(self, task_ids=None, key="return_value", map_indexes=None):
        raise AssertionError(f"the operator read XCom ({task_ids!r}, {key!r}); its source is not XCom")


def run_tries(operator, ti, tries: int = 3, history: FakeAssetEvents | None = None) -> list[str]:
    """Execute ``operator`` as Airflow's retries would, up to ``tries`` tries until one succeeds; the outcomes
    (``"success"`` or the error's type and text)."""
    from airflow.sdk.exceptions import AirflowException

    outcomes = []
    for number in range(1, tries + 1):
        ti.try_number = number
        try:
            operator.execute(context_for(ti, history))
            outcomes.append("success")
            break
        except AirflowException as error:
            outcomes.append(f"{type(error).__name__}: {error}")
    return outcomes
