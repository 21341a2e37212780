"""How a release announces itself: one asset event per release, none on a replay (ADR 0021).

The operator declares its release's asset as an outlet (registered when the DAG is parsed) and Airflow emits its
event when the task succeeds; on a replay the operator drops the asset from the running task's outlets, which
Airflow reads to build the events (``task_runner.finalize``). Where the asset cannot be declared at parse time (a
spec expanded at run time, outlets the DAG author lists), events go through :data:`RELEASE_ALIAS`. A replay whose
task instance never announced the release (its first try died between the commit and its success) announces once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Asset, AssetAlias

from dp_operators.ledger import ReleaseKey

#: The alias every release operator declares beside its asset, through which it announces when its asset is not a
#: declared outlet (a spec expanded at run time, outlets given by the DAG author); ADR 0021. One alias for all
#: releases. Schedule consumers on the release's asset, not on this alias (which carries every release's events).
RELEASE_ALIAS = AssetAlias(name="dp-release")

#: How far before a release's ``released_at`` (worker clock) a replay looks for its earlier asset event (API
#: server clock): tolerates that much clock skew between workers and the API server.
CLOCK_MARGIN = dt.timedelta(hours=1)
#: Asset events read per request when a replay looks for its earlier announcement.
ANNOUNCEMENT_PAGE = 100


def default_asset(release: str) -> Asset:
    """The asset announcing ``release``: ``dp-release://<release>``, independent of the budget account."""
    return Asset(name=release, uri=f"dp-release://{release}")


def release_outlets(outlets: Any, asset: Asset | None) -> list[Any]:
    """The outlets of a release operator: the DAG author's ``outlets`` if given (plus :data:`RELEASE_ALIAS`, so
    they never silence a new release), else the release's ``asset`` (registered when the DAG is parsed) and the
    alias."""
    if outlets is not None:
        declared = list(outlets)
        return declared if RELEASE_ALIAS in declared else [*declared, RELEASE_ALIAS]
    return [outlet for outlet in (asset, RELEASE_ALIAS) if outlet is not None]


def announce(operator: Any, context: Any, output: dict[str, Any], *, emit: bool) -> None:
    """Emit the release's one asset event (``emit``), or none (ADR 0021). When the asset is a declared outlet
    (registered at parse time), Airflow emits its event at the task's success: set its ``extra``, or, to stay
    silent, drop it from this instance's outlets (Airflow builds the event list from the running task's outlets).
    Otherwise (an outlet list of the DAG author's, a spec expanded at run time) add the event through the alias."""
    extra = {
        "release": output["release"],
        "release_key": output["release_key"],
        "budget_account": output["budget_account"],
        "charge": output["charge"],
        "location": operator.published.locations.get("json") if operator.published else None,
    }
    if operator.release_asset in (operator.outlets or []):
        if emit:
            context["outlet_events"][operator.release_asset].extra = extra
        else:
            operator.outlets = [outlet for outlet in operator.outlets if outlet != operator.release_asset]
    elif emit:
        context["outlet_events"][RELEASE_ALIAS].add(operator.release_asset, extra=extra)


def announced_before(operator: Any, context: Any, key: ReleaseKey, output: dict[str, Any]) -> bool:
    """Whether an earlier try of this task instance already announced the committed release: an event of the
    release's asset (read through the inlet the operator declares) from this dag run, task and map index. A
    replay after a successful try (a cleared task) finds it and stays silent; a replay after a try that died
    between the commit and its success finds none and announces the release once.

    Events are read oldest first in pages of :data:`ANNOUNCEMENT_PAGE`, from :data:`CLOCK_MARGIN` before the
    release's ``released_at`` (the worker's clock; the event's timestamp is the API server's), and the search
    stops at the first match. If Airflow cannot answer, the answer is True: stay silent (logged).
    """
    identity = (key.dag_id, key.run_id, key.task_id, key.map_index)
    try:
        accessor = context["inlet_events"][operator.release_asset]
        cursor: Any = dt.datetime.fromisoformat(output["released_at"]) - CLOCK_MARGIN
        while True:
            page = list(accessor.after(cursor.isoformat()).ascending(True).limit(ANNOUNCEMENT_PAGE))
            if any((e.source_dag_id, e.source_run_id, e.source_task_id, e.source_map_index) == identity
                   for e in page):
                return True
            if len(page) < ANNOUNCEMENT_PAGE or page[-1].timestamp <= cursor:
                return False
            cursor = page[-1].timestamp
    except Exception as error:  # noqa: BLE001 - any failure to ask means: do not announce twice
        operator.log.warning("could not read this release's earlier asset events (%s): this replay announces "
                         "nothing", type(error).__name__)
        return True
