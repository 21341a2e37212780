"""A series' steps: which step a run releases, read from the ledger's committed steps and the run's data interval
(public: Airflow's run and interval, never the data). ADR 33.

Identity. A series is ``(account, dag_id, task_id, map_index, release, generation)``; its step ``t`` is the ledger
release key whose run id is ``__dp_series__/g<generation>/step/<t>`` (:func:`step_key`). The key holds the step,
not the Airflow run, so the ledger's unique release key lets one step be measured by one committed attempt only.

Order. A step is its run's data interval: non-empty, starting where the last committed step's ended (a later start
is a missing step, an earlier one a run out of order; both refused, naming the step). A run of a released interval
replays that step. Past the horizon: refused, or step 0 of a new series (``after_horizon``), still without a gap.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dp_operators.ledger import AuditChainError, Ledger, ReleaseKey
from dp_operators.ledger.store import SERIES_RUN_PREFIX, SERIES_STEP_RUN_ID
from dp_operators.release.errors import ReleaseConfigError
from dp_operators.spec import ReleaseSpec


class SeriesOrderError(ReleaseConfigError):
    """A run that is not the series' next step: its data interval does not start where the last committed step's
    ended (a missing step, or a run out of order), or the series is past its horizon. Nothing was read or charged;
    a retry cannot fix it: run the missing step first (``depends_on_past``, ``max_active_runs=1``)."""


@dataclass(frozen=True)
class StepRun:
    """The Airflow run a step belongs to (public: Airflow's run id and data interval, never the data).

    Attributes:
        run_id: the Airflow run id.
        data_interval_start, data_interval_end: the run's data interval (timezone-aware).
    """

    run_id: str
    data_interval_start: dt.datetime
    data_interval_end: dt.datetime


def step_key(base: ReleaseKey, generation: int, step: int) -> ReleaseKey:
    """The ledger release key of step ``step`` (0-based) of generation ``generation`` of ``base``'s series
    (``base``: the task's release key; its run id is replaced)."""
    return ReleaseKey(base.dag_id, f"{SERIES_RUN_PREFIX}g{generation}/step/{step:06d}", base.task_id,
                      base.map_index, base.release_name)


def series_id(account: str, base: ReleaseKey, generation: int) -> str:
    """The series' name in its sealed state's associated data: a sealed step opens only in its own series."""
    return f"{account}/{base.dag_id}/{base.task_id}/{base.map_index}/{base.release_name}/g{generation}"


@dataclass(frozen=True)
class SeriesSteps:
    """The committed steps of a task's series, read from the ledger.

    Attributes:
        generation: the latest generation with a committed step (0 if none).
        steps: that generation's committed outputs, in step order (step ``i`` at index ``i``).
        by_run: Airflow run id -> the committed output of the step it released (any generation).
        by_interval: ``(start, end)`` of a step's data interval (UTC ISO 8601) -> its committed output.
    """

    generation: int
    steps: list[dict[str, Any]]
    by_run: dict[str, dict[str, Any]]
    by_interval: dict[tuple[str, str], dict[str, Any]]


def committed_steps(ledger: Ledger, base: ReleaseKey, account: str) -> SeriesSteps:
    """Read and authenticate the committed steps of ``base``'s series on ``account``.

    Raises:
        AuditChainError: a committed step fails authentication, or the steps of a generation are not ``0 .. n-1``
            (the ledger was altered: nothing is published).
    """
    outputs = ledger.authenticated_outputs(
        ReleaseKey(base.dag_id, SERIES_RUN_PREFIX, base.task_id, base.map_index, base.release_name), account)
    generations: dict[int, dict[int, dict[str, Any]]] = {}
    by_run: dict[str, dict[str, Any]] = {}
    by_interval: dict[tuple[str, str], dict[str, Any]] = {}
    for run_id, output in outputs.items():
        match = SERIES_STEP_RUN_ID.fullmatch(run_id)
        series = output.get("series") if isinstance(output, dict) else None
        if match is None or not isinstance(series, dict) or [series.get("generation"), series.get("step")] != [
                int(match[1]), int(match[2])]:
            raise AuditChainError(f"release {base.release_name!r}: the ledger holds a series step {run_id!r} whose "
                                  "output does not describe it; nothing is published. A privacy officer runs "
                                  "`dpctl ledger verify`")
        generations.setdefault(int(match[1]), {})[int(match[2])] = output
        by_run[str(series.get("run_id"))] = output
        by_interval[step_interval(series)] = output
    generation = max(generations, default=0)
    steps = generations.get(generation, {})
    if sorted(steps) != list(range(len(steps))):
        raise AuditChainError(f"release {base.release_name!r}: generation {generation} of the series holds steps "
                              f"{sorted(steps)[:5]}..., not 0 to {len(steps) - 1}; nothing is published")
    return SeriesSteps(generation, [steps[i] for i in range(len(steps))], by_run, by_interval)


def step_interval(series: Mapping[str, Any]) -> tuple[str, str]:
    start, end = series.get("data_interval") or (None, None)
    return str(start), str(end)


def utc_iso(moment: dt.datetime) -> str:
    if moment.tzinfo is None:
        raise ReleaseConfigError("a series step needs its run's data interval in a timezone-aware form")
    return moment.astimezone(dt.timezone.utc).isoformat()


def next_step(spec: ReleaseSpec, history: SeriesSteps, run: StepRun) -> tuple[int, int]:
    """``(generation, step)`` this run releases, from the committed steps and the run's data interval.

    Raises:
        SeriesOrderError: the run does not follow the last committed step, or the series is past its horizon
            and ``after_horizon`` is ``refuse``.
    """
    series = spec.series
    assert series is not None
    generation, steps = history.generation, history.steps
    start, end = utc_iso(run.data_interval_start), utc_iso(run.data_interval_end)
    if run.data_interval_end <= run.data_interval_start:
        raise SeriesOrderError(
            f"release {spec.release!r}: run {run.run_id!r} has an empty data interval ({start} to {end}): a series "
            "step is its run's data interval, and the steps' intervals must follow each other without a gap. "
            "Schedule the DAG with a data-interval timetable (airflow.sdk CronDataIntervalTimetable or "
            "DeltaDataIntervalTimetable); trigger timetables, Airflow 3's default for '@daily', give empty intervals")
    previous = steps[-1]["series"] if steps else None
    if len(steps) >= series.horizon:
        if series.after_horizon == "refuse":
            raise SeriesOrderError(
                f"release {spec.release!r}: the series has released all its {series.horizon} steps (the last for "
                f"run {previous['run_id']!r}); run {run.run_id!r} is past its horizon. Declare series.after_horizon: "
                "new_series to start a new series (charged again), or start one under another release name")
        generation, steps = generation + 1, []  # a new series: its step 0 follows the last one's last step
    if previous is not None:
        last_start, last_end = step_interval(previous)
        if start != last_end:
            later = dt.datetime.fromisoformat(start) > dt.datetime.fromisoformat(last_end)
            where = f"step {previous['step']} (run {previous['run_id']!r}, data interval {last_start} to {last_end})"
            raise SeriesOrderError(
                f"release {spec.release!r}: run {run.run_id!r} (data interval {start} to {end}) "
                + (f"leaves a gap after {where}: the steps between were not released. Run them first, in order (the "
                   "release task needs depends_on_past=True and the DAG max_active_runs=1); a series never skips a "
                   "step" if later else
                   f"is not after {where}: a series releases its steps in order, once each"))
    return generation, len(steps)


def series_start(spec: ReleaseSpec, ledger: Ledger, base: ReleaseKey, run: StepRun) -> dt.datetime:
    """Where the upstream's running totals for ``run`` must count from: the start of the data interval of the first
    step of the series (generation) that ``run`` releases or replays. Public: the ledger's committed steps and the
    run's interval, never the data. Each step records it (``series.counted_from``).

    Raises:
        SeriesOrderError: ``run`` is not the series' next step (as :func:`run_series_step` would refuse it).
        AuditChainError: the ledger's steps fail authentication.
    """
    history = committed_steps(ledger, base, spec.budget_account)
    stored = history.by_run.get(run.run_id) or history.by_interval.get(
        (utc_iso(run.data_interval_start), utc_iso(run.data_interval_end)))
    if stored is not None:
        return dt.datetime.fromisoformat(stored["series"]["counted_from"])
    generation, step = next_step(spec, history, run)
    if step == 0:
        return run.data_interval_start.astimezone(dt.timezone.utc)
    return dt.datetime.fromisoformat(history.steps[0]["series"]["counted_from"])
