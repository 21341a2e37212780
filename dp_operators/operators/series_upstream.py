"""For the upstream task of a series: where its running totals must count from (docs/continual.md).

A series step publishes the running totals its upstream returns. They must count from the first step of the series
the run belongs to: the series' first run, or, after the horizon with ``after_horizon: new_series``, the first run
of the new series. :func:`series_start` reads that from the ledger (public: the committed steps and the run's data
interval, never the data), so an upstream counts ``WHERE day >= series_start(...) AND day < data_interval_end``,
and returns :func:`series_totals` (the totals and that start), which the release checks.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from dp_operators.hooks.ledger import DPLedgerHook
from dp_operators.ledger import ReleaseKey


def series_start(*, release_task_id: str, spec_path: str | Path, ledger_conn_id: str = DPLedgerHook.default_conn_name,
                 map_index: int = -1, context: Any = None) -> dt.datetime:
    """The start (UTC) of the data interval of the first step of the series this run releases: its running totals
    count from there. Call it inside the upstream task of a :class:`~dp_operators.operators.release.DPReleaseOperator`
    whose spec is a series.

    Args:
        release_task_id: the task id of the release operator (the series is keyed by it).
        spec_path: the series spec the release operator reads.
        ledger_conn_id: the release operator's ledger connection (read only: no key is needed).
        map_index: the release task's map index (-1 when not mapped).
        context: the task context (default: Airflow's current one).

    Raises:
        SeriesOrderError: the run is not the series' next step (the release would refuse it too).
        SpecError: the spec is invalid or declares no series.
    """
    from dp_operators.continual.steps import series_start as start_of
    from dp_operators.operators.release import _step_run
    from dp_operators.spec import SpecError, load_spec

    if context is None:
        from airflow.sdk import get_current_context

        context = get_current_context()
    spec = load_spec(str(spec_path))
    if spec.series is None:
        raise SpecError(f"{spec_path}: release {spec.release!r} declares no series")
    ti = context["ti"]
    base = ReleaseKey(ti.dag_id, ti.run_id, release_task_id, map_index, spec.release)
    return start_of(spec, DPLedgerHook(ledger_conn_id=ledger_conn_id).get_ledger(), base, _step_run(context))


def series_totals(totals: dict[str, Any], counted_from: dt.datetime) -> dict[str, Any]:
    """``totals`` (the upstream's running totals, the release engine's shapes) with the start they count from, for
    the release to check against the series' own: a series that may start a new one (``after_horizon:
    new_series``) requires it, any series checks it when given, and a mismatch is refused before anything is
    charged. Return this from the upstream task."""
    from dp_operators.continual.checks import COUNTED_FROM_KEY

    return {**totals, COUNTED_FROM_KEY: counted_from.astimezone(dt.timezone.utc).isoformat()}
