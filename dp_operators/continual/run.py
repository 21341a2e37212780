"""One step of a series: the running totals of one DAG run, noised so that the whole series costs its budget once
(ADR 32 for the mechanism, ADR 33 for the ledger). No Airflow import.

Identity. A series is ``(account, dag_id, task_id, map_index, release, generation)``; its step ``t`` is the ledger
release key whose run id is ``__dp_series__/g<generation>/step/<t>`` (:func:`step_key`). The key holds the step,
not the Airflow run, so the ledger's unique release key lets one step be measured by one committed attempt only,
whichever runs race for it, and its existing lease, replay and takeover rules apply to steps unchanged.

Order of one step (:func:`run_series_step`):

1. read the series' committed steps (authenticated, :meth:`Ledger.authenticated_outputs
   <dp_operators.ledger.Ledger.authenticated_outputs>`); if this Airflow run, or another run of the same data
   interval, committed one, replay it (nothing charged, nothing drawn, the data not read);
2. the step is the next one: ``len(committed)`` (past the horizon: refused, or step 0 of a new series,
   ``after_horizon``). Its run's data interval must be non-empty and start where the
   last step's ended (a later start is a missing step, an earlier one a run out of order: both refused, naming the
   step; an empty interval, as trigger timetables give, is refused: the steps could not be checked to follow);
3. plan from public parameters (:func:`~dp_operators.continual.plan.plan_spec_series`) and open the sealed noise of
   every earlier step with the series key (a missing or wrong key fails here, before anything is read or charged);
4. read and check the upstream's running totals (:func:`~dp_operators.release.inputs.prepare_inputs`: counts, and
   integer sums on grid 1, over the public keys; errors spend nothing);
5. reserve the step: step 0 is charged the series' ``rho``; later steps 0, and any attempt after a step's first
   (an earlier attempt may have drawn and published noise) the price of measuring that step again
   (:func:`redraw_charge`), which the ledger decides from the attempt number (``takeover_amount``);
6. draw the step's fresh noise, seal it (:mod:`.state`), and publish ``X_t + (B z)_t`` for every cell: the true
   running total plus the exact noise of the decoded total (:class:`~.noise.SeriesNoise`), which equals ``(B y)_t``
   (post-processing of the measurements); commit the output with the sealed state.

The published form drops the sealed state (:func:`published_form`); the ledger keeps it in the committed output,
where the reader role sees ciphertext it cannot open (ADR 33).

Input: the upstream returns each step's **running totals** (counts up to the end of the run's data interval), as
for any grouped count. The increments ``x_t`` are never formed, and no true total is stored (DESIGN.md 2.8).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dp_operators import __version__
from dp_operators.accounting import IncompatibleAccountantError
from dp_operators.continual.noise import SeriesNoise
from dp_operators.continual.plan import AggregateSeriesPlan, plan_spec_series, strategy_of
from dp_operators.continual.state import SeriesKey, SeriesKeyError, open_sealed, seal, state_digest
from dp_operators.ledger import AuditChainError, BudgetExhaustedError, Ledger, ReleaseKey
from dp_operators.ledger.chain import CanonicalOutput
from dp_operators.ledger.store import SERIES_RUN_PREFIX, SERIES_STATE_FIELD, SERIES_STEP_RUN_ID
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array
from dp_operators.release.diagnostics import DiagnosticsReport
from dp_operators.release.errors import ReleaseAbortedError, ReleaseConfigError, ReleaseInputError
from dp_operators.release import columns
from dp_operators.release.inputs import prepare_inputs
from dp_operators.release.upstream_types import SATURATION
from dp_operators.release.publish import check_plain_json, in_key_order, release_header
from dp_operators.release.rows_file import INLINE_ROWS_LIMIT
from dp_operators.release.run import ReleaseResult, check_privacy_unit, give_up
from dp_operators.spec import ReleaseSpec

#: The output field holding the sealed noise (never published).
STATE_FIELD = SERIES_STATE_FIELD


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
        by_interval[_interval(series)] = output
    generation = max(generations, default=0)
    steps = generations.get(generation, {})
    if sorted(steps) != list(range(len(steps))):
        raise AuditChainError(f"release {base.release_name!r}: generation {generation} of the series holds steps "
                              f"{sorted(steps)[:5]}..., not 0 to {len(steps) - 1}; nothing is published")
    return SeriesSteps(generation, [steps[i] for i in range(len(steps))], by_run, by_interval)


def noise_of(plans: list[AggregateSeriesPlan]) -> dict[str, SeriesNoise]:
    """Each aggregate's :class:`SeriesNoise` (counts: grid 1)."""
    return {p.aggregate: SeriesNoise(strategy_of(p.plan.chosen.mechanism, p.plan.horizon), p.plan.chosen)
            for p in plans}


def series_charge(plans: list[AggregateSeriesPlan]) -> Fraction:
    """The whole series' ``rho``: the sum of its aggregates' (charged at step 0)."""
    return sum((p.plan.rho for p in plans), Fraction(0))


def redraw_charge(plans: list[AggregateSeriesPlan]) -> Fraction:
    """What measuring one step again costs (zCDP ``rho``): for each aggregate its ``rho`` times the worst step's
    redraw sensitivity over the series' (:meth:`Strategy.redraw_sensitivity_squared`); at most the series'
    charge. Exact, from public parameters."""
    total = Fraction(0)
    for p in plans:
        strategy = strategy_of(p.plan.chosen.mechanism, p.plan.horizon)
        total += p.plan.rho * strategy.redraw_sensitivity_squared(p.plan.participation) / \
            p.plan.chosen.sensitivity_squared
    return total


def series_parameters(spec: ReleaseSpec, plans: list[AggregateSeriesPlan], account: str) -> str:
    """SHA-256 (hex) of the public parameters a series is charged and noised for: the account, and per aggregate
    its kind, mechanism, horizon, participation, rho, sensitivities, noise variance, ``group_by`` and its key lists
    in order. Step 0 records it; every later step must plan the same (a spec edited mid-series would noise the
    later steps for a budget nobody paid, or decode earlier steps' noise under another strategy or key)."""
    described = {"account": account, "aggregates": [{
        "name": p.aggregate, "kind": a.kind, "mechanism": p.plan.chosen.mechanism, "horizon": p.plan.horizon,
        "max_steps": p.plan.participation.max_steps, "min_separation": p.plan.participation.min_separation,
        "rho": str(p.plan.rho), "sensitivity_squared": str(p.plan.chosen.sensitivity_squared),
        "step_sensitivity_squared": str(p.plan.step_sensitivity_squared),
        "noise_variance": str(p.plan.chosen.noise_variance), "group_by": list(a.group_by),
        "keys": [[repr(k) for k in a.keys[column]] for column in a.group_by] if a.group_by else [],
    } for p, a in zip(plans, spec.aggregates)]}
    return hashlib.sha256(json.dumps(described, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def published_form(output: Mapping[str, Any]) -> dict[str, Any]:
    """The committed output without its sealed state: what is published, returned and replayed."""
    return {name: value for name, value in output.items() if name != STATE_FIELD}


def _interval(series: Mapping[str, Any]) -> tuple[str, str]:
    start, end = series.get("data_interval") or (None, None)
    return str(start), str(end)


def _iso(moment: dt.datetime) -> str:
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
    start, end = _iso(run.data_interval_start), _iso(run.data_interval_end)
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
        last_start, last_end = _interval(previous)
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
        (_iso(run.data_interval_start), _iso(run.data_interval_end)))
    if stored is not None:
        return dt.datetime.fromisoformat(stored["series"]["counted_from"])
    generation, step = next_step(spec, history, run)
    if step == 0:
        return run.data_interval_start.astimezone(dt.timezone.utc)
    return dt.datetime.fromisoformat(history.steps[0]["series"]["counted_from"])


def wipe(history: dict[str, list[list[list[int]]]]) -> None:
    """Empty, in place, every list of a series' opened noise (:func:`_history_draws`): a frame an error reporter
    captures (a task timeout or SIGTERM arrives as a BaseException, re-raised as it is) then holds no earlier draw,
    which with a published total would give the true total."""
    for cells in history.values():
        for steps in cells:
            for draws in steps:
                draws.clear()
            steps.clear()
        cells.clear()
    history.clear()


def _history_draws(noise: Mapping[str, SeriesNoise], steps: list[dict[str, Any]], key: SeriesKey | None,
                   sid: str, cells: Mapping[str, int]) -> dict[str, list[list[list[int]]]]:
    """Per aggregate, per cell, the draws of every committed step (opened with the series key)."""
    draws: dict[str, list[list[list[int]]]] = {name: [[] for _ in range(count)] for name, count in cells.items()}
    for index, output in enumerate(steps):
        series = output["series"]
        if key is not None and series.get("key_id") != key.key_id:
            raise SeriesKeyError(
                f"series {sid!r} step {index} was sealed with series key {series.get('key_id')!r}, this worker "
                f"holds {key.key_id!r}: restore the series' key (a series never goes on with fresh noise)")
        sealed = base64.b64decode(output[STATE_FIELD]["sealed"])
        flat = open_sealed(key, sid, index, series["attempt"], sealed)
        position = 0
        for name, count in cells.items():
            width = len(noise[name].measurements_at(index))
            for cell in range(count):
                draws[name][cell].append(flat[position:position + width])
                position += width
        if position != len(flat):
            raise SeriesKeyError(f"series {sid!r} step {index}: the opened state holds {len(flat)} draws, not "
                                 f"{position}")
    return draws


def _is_integer(value: Any) -> bool:
    return value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)))


def _integer_column(field_type: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_integer(field_type) or pa.types.is_null(field_type)
            or (pa.types.is_decimal(field_type) and field_type.scale <= 0))


def check_integer_sums(spec: ReleaseSpec, upstream: Any) -> None:
    """Refuse, by type, a series sum whose upstream running sums are not integers, in every shape the engine reads:
    a table's ``sum`` column must be an integer type (or a decimal of scale 0), each row's ``sum`` (a list of rows,
    several ungrouped rows) and an ungrouped value an ``int`` or numpy integer (``None`` follows ``non_finite``). On
    grid 1 they are then read exactly, never rounded. Types only: no value decides it.

    Raises:
        ReleaseInputError: a sum's value of another type (the message names the aggregate and the type).
    """
    if not isinstance(upstream, Mapping):
        return  # prepare_inputs names the shape problem

    def refuse(aggregate: str, found: str) -> ReleaseInputError:
        return ReleaseInputError(
            f"aggregate {aggregate!r}: a series sum's running sum holds {found}, not an integer: a series reads its "
            "sums exactly on grid 1. Round each value to an integer and keep it within the (integer) bounds before "
            "summing, e.g. SUM(LEAST(GREATEST(ROUND(x), lo), hi)), and return the sums as integers (docs/continual.md)")

    for aggregate in spec.aggregates:
        if aggregate.kind != "sum" or aggregate.name not in upstream:
            continue
        given = upstream[aggregate.name]
        if columns.is_table(given):
            if "sum" in given.schema.names and not _integer_column(given.schema.field("sum").type):
                raise refuse(aggregate.name, f"a column of type {given.schema.field('sum').type}")
        elif isinstance(given, Sequence) and not isinstance(given, (str, bytes)):
            for row in given:
                if isinstance(row, Mapping) and not _is_integer(row.get("sum")):
                    raise refuse(aggregate.name, f"a {type(row.get('sum')).__name__}")
        elif not isinstance(given, Mapping) and not _is_integer(given):
            raise refuse(aggregate.name, f"a {type(given).__name__}")


#: The entry of the upstream's mapping saying where its running totals count from
#: (:func:`dp_operators.operators.series_upstream.series_totals`); ``__dp_`` names are the project's own.
COUNTED_FROM_KEY = "__dp_series_counted_from__"


def _counted_as_declared(spec: ReleaseSpec, upstream: Any, counted_from: str) -> Any:
    """The upstream's totals without :data:`COUNTED_FROM_KEY`, once the start it declares is the series' (public
    metadata, never data). Required when the spec may start a new series (``after_horizon: new_series``), whose
    totals must restart at its first step; checked whenever given.

    Raises:
        ReleaseInputError: the declaration is missing where required, or names another start (a hand-written
            upstream counting from a fixed date, or a stale one).
    """
    declared = upstream.get(COUNTED_FROM_KEY) if isinstance(upstream, Mapping) else None
    if declared is None:
        if spec.series is not None and spec.series.after_horizon == "new_series":
            raise ReleaseInputError(
                f"release {spec.release!r} may start a new series (after_horizon: new_series), so its upstream must "
                f"say where its running totals count from: return series_totals(totals, series_start(...)) "
                f"(dp_operators.operators.series_upstream); this step's series counts from {counted_from}")
        return upstream
    try:
        same = dt.datetime.fromisoformat(str(declared)) == dt.datetime.fromisoformat(counted_from)
    except ValueError:
        same = False
    if not same:
        raise ReleaseInputError(
            f"release {spec.release!r}: the upstream's running totals count from {str(declared)[:40]!r}, but this "
            f"step's series counts from {counted_from}: count from series_start(...) "
            "(dp_operators.operators.series_upstream), or clear the upstream task too if its result is stale")
    return {name: value for name, value in upstream.items() if name != COUNTED_FROM_KEY}


def check_releasable(spec: ReleaseSpec) -> None:
    """Refuse a series spec this version cannot release, from the spec alone (the operator calls it at DAG import).

    Raises:
        ReleaseConfigError: no ``series`` block, a sum off grid 1 or of binary64
            arithmetic (a running sum read from upstream must be an integer, ADR 33), or more cells than a series
            publishes inline.
    """
    if spec.series is None:
        raise ReleaseConfigError(f"release {spec.release!r} declares no series")
    sums = [a.name for a in spec.aggregates if a.kind == "sum" and (
        a.grid != 1 or a.upstream.arithmetic != "exact" or any(b.denominator != 1 for b in a.exact_bounds))]
    if sums:
        raise ReleaseConfigError(
            f"release {spec.release!r}: series sums ({', '.join(sums)}) are released on grid 1, with integer bounds, "
            "from integer running sums only (a running sum rounded to a finer grid, or a binary64 one, moves at "
            "more steps than its unit's contributions): declare grid: 1 and integer bounds, and have the upstream "
            "round each value to an integer and clip it to the bounds before summing")
    cells = sum(a.partition_count or 1 for a in spec.aggregates)
    if cells > INLINE_ROWS_LIMIT:
        raise ReleaseConfigError(
            f"release {spec.release!r}: a series publishes its {cells} cells inline, at most {INLINE_ROWS_LIMIT} "
            "(rows files are not released for series yet): split it into several series")
    plan_spec_series(spec)


def run_series_step(
    spec: ReleaseSpec,
    aggregates: Callable[[], Mapping[str, Any]],
    ledger: Ledger,
    base: ReleaseKey,
    run: StepRun,
    *,
    series_key: SeriesKey | None,
    spec_hash: str,
    try_number: int | None = None,
    audit: Mapping[str, Any] | None = None,
    diagnostics: Callable[[DiagnosticsReport], None] | None = None,
) -> ReleaseResult:
    """Release one step of ``spec``'s series for the Airflow run ``run`` (module docstring for the order).

    Args:
        spec: a validated spec with a ``series`` block (counts, and sums on grid 1, over public keys).
        aggregates: returns the upstream's running totals (the shapes of
            :func:`~dp_operators.release.inputs.prepare_inputs`); called only when the step is not a replay.
        ledger: the budget ledger (a zCDP account).
        base: the task's release key (its run id is Airflow's; the step's key replaces it: :func:`step_key`).
        run: the Airflow run id and data interval.
        series_key: the workers' series key (the ledger connection's extra ``series_key``).
        spec_hash, try_number, audit, diagnostics: as :func:`~dp_operators.release.run_release` (the report of
            the step's running totals: rows outside the public keys, clamped, saturated, special values).

    Returns:
        :class:`~dp_operators.release.run.ReleaseResult` holding :func:`published_form` of the step's output.

    Raises:
        SeriesOrderError: the run is not the series' next step; nothing read or charged.
        SeriesKeyError: no series key, or not the series' (checked before anything is read or charged).
        ReleaseConfigError: a spec :func:`check_releasable` refuses.
        ReleaseInputError: a sum's running sums not integers (:func:`check_integer_sums`), or as
            :func:`~dp_operators.release.run_release`.
        ReleaseInputError, IncompatibleAccountantError, ledger refusals, LeaseHeldError, ReleaseAbortedError,
            ChargeStateError: as :func:`~dp_operators.release.run_release`.
    """
    check_releasable(spec)
    account_name = spec.budget_account
    for _ in range(8):  # another run may take the step first: then this run's step is the next one
        history = committed_steps(ledger, base, account_name)
        # a step is its data interval: a run of a released interval (a retry, a clear, or a new run of the same day,
        # as each `airflow dags test` is) publishes that step again
        stored = history.by_run.get(run.run_id) or history.by_interval.get(
            (_iso(run.data_interval_start), _iso(run.data_interval_end)))
        if stored is not None:
            return ReleaseResult(output=published_form(stored), replayed=True)
        result = _release_next_step(spec, aggregates, ledger, base, run, history, series_key, spec_hash,
                                    try_number, audit, diagnostics)
        if result is not None:
            return result
    raise ReleaseConfigError(f"release {spec.release!r}: eight steps in a row were taken by other runs while run "
                             f"{run.run_id!r} waited; give the release task max_active_runs=1")


def _release_next_step(spec, aggregates, ledger, base, run, history, series_key, spec_hash, try_number,
                       audit, diagnostics) -> ReleaseResult | None:
    generation, step = next_step(spec, history, run)
    account = ledger.account(spec.budget_account)
    if account.accountant != "zcdp":
        raise IncompatibleAccountantError(
            f"release {spec.release!r} is a series, charged in zCDP rho: budget account {account.name!r} is "
            f"{account.accountant}; use a zcdp account")
    check_privacy_unit(spec, account)
    plans = plan_spec_series(spec)
    noise = noise_of(plans)
    sid = series_id(account.name, base, generation)
    if series_key is None:
        raise SeriesKeyError(
            f"series {sid!r}: the ledger connection has no series_key extra: a series seals its noise under the "
            "workers' series key. Make one (python -c 'from dp_operators.continual.state import SeriesKey; "
            "print(SeriesKey.generate().text)'), put it in the release task's ledger connection's extra as "
            "\"series_key\", and back it up with the spend key (docs/continual.md)")
    steps = history.steps if generation == history.generation else []
    parameters = series_parameters(spec, plans, account.name)
    if steps and steps[0]["series"].get("parameters_sha256") != parameters:
        raise ReleaseConfigError(
            f"release {spec.release!r}: the spec's series parameters (budget, mechanism, horizon, participation, "
            f"contribution bounds, public keys and their order, account) differ from those step 0 was charged "
            f"for (run {steps[0]['series'].get('run_id')!r}): a series keeps its parameters to the end. Restore the "
            "spec, or start a new series under another release name")
    cells = {a.name: a.partition_count or 1 for a in spec.aggregates}
    history_draws = _history_draws(noise, steps, series_key, sid, cells)  # before anything is read or charged
    try:
        counted_from = _iso(run.data_interval_start) if step == 0 else steps[0]["series"]["counted_from"]
        return _measure_step(spec, aggregates, ledger, base, run, plans, noise, account, generation, step,
                             history_draws, series_key, sid, parameters, spec_hash, try_number, audit, diagnostics,
                             counted_from)
    finally:
        wipe(history_draws)


def _measure_step(spec, aggregates, ledger, base, run, plans, noise, account, generation, step, history_draws,
                  series_key, sid, parameters, spec_hash, try_number, audit, diagnostics,
                  counted_from) -> ReleaseResult | None:
    # no log line or message here depends on the data (DESIGN.md 2.8): what the totals held goes to the opt-in report
    report = DiagnosticsReport(spec.release)
    try:
        upstream = _counted_as_declared(spec, aggregates(), counted_from)
        check_integer_sums(spec, upstream)
        prepared = prepare_inputs(spec, upstream, diagnostics=report)
    finally:
        if diagnostics is not None:
            diagnostics(report)
    key = step_key(base, generation, step)
    rho = series_charge(plans)
    redraw = redraw_charge(plans)
    mechanisms = [{
        "kind": "series_step", "aggregate": p.aggregate, "mechanism": p.plan.chosen.mechanism,
        "horizon": p.plan.horizon, "step": step, "generation": generation,
        "max_steps": p.plan.participation.max_steps, "min_separation": p.plan.participation.min_separation,
        "rho": str(p.plan.rho), "sensitivity_squared": str(p.plan.chosen.sensitivity_squared),
        "step_sensitivity_squared": str(p.plan.step_sensitivity_squared),
        "noise_variance": str(p.plan.chosen.noise_variance),
    } for p in plans]
    try:
        reservation = ledger.reserve(
            key, account=account.name, amount=rho if step == 0 else 0, takeover_amount=rho if step == 0 else redraw,
            mechanisms=mechanisms, spec_hash=spec_hash, try_number=try_number, audit=audit,
        )
    except BudgetExhaustedError as error:
        if step == 0:
            raise
        # a later step's first attempt costs nothing: only a redraw (an earlier attempt of this step died after
        # it may have drawn noise) can be refused
        raise BudgetExhaustedError(
            error.account, error.unit, error.requested, error.remaining,
            note=f"series step {step} is measured again (an earlier attempt of it died after it may have drawn "
                 f"noise), which costs rho {redraw} (~{float(redraw):.4g}); leave room for redraws in the "
                 "account's cap (docs/continual.md)") from None
    if isinstance(reservation, dict):  # another run committed this step meanwhile: this run's is the next one
        return None
    drawn: list[str] = []
    try:
        with ledger.lease(reservation):
            output, text = _step_output(spec, plans, noise, prepared, history_draws, drawn, key, base, run,
                                        account, generation, step, reservation, series_key, sid, rho,
                                        redraw, mechanisms, spec_hash, parameters, counted_from)
    except Exception as error:
        returned = give_up(ledger, reservation, drawn)
        raise ReleaseAbortedError(error, budget_returned=returned) from error
    except BaseException:
        give_up(ledger, reservation, drawn)
        raise
    ledger.commit(reservation, output, canonical=text)
    return ReleaseResult(output=published_form(in_key_order(output)), replayed=False)


def _published_cell(value: Fraction, half_width: float) -> dict[str, Any]:
    """A published total: ``value`` and ``half_width``; within one half-width of the saturation limit (a true
    total beyond +-2^62 was read at the limit: docs/mechanisms.md, "Saturation"), ``saturated: true``, no
    half-width and an interval unbounded on the limit's side. Decided from the noised value: post-processing."""
    if abs(value) + Fraction(half_width) < SATURATION:
        return {"value": float(value), "half_width": half_width}
    lower, upper = float(value) - half_width, float(value) + half_width
    return {"value": float(value), "half_width": None, "saturated": True,
            "interval": [lower, None] if value > 0 else [None, upper]}


def _step_output(spec, plans, noise, prepared, history_draws, drawn, key, base, run, account, generation, step,
                 reservation, series_key, sid, rho, redraw, mechanisms, spec_hash, parameters, counted_from):
    published: dict[str, Any] = {}
    fresh: list[int] = []
    working: list[list] = [fresh]  # the draws and totals this frame holds, wiped on the way out
    try:
        for p, aggregate in zip(plans, spec.aggregates):
            series_noise = noise[aggregate.name]
            width = len(series_noise.measurements_at(step))
            totals = prepared.values[(aggregate.name, aggregate.kind)].tolist()
            drawn.append(aggregate.name)
            draws = [int(value) for value in sample_discrete_gaussian_array(series_noise.sigma2, width * len(totals))]
            working += [totals, draws]
            fresh += draws
            half_width = series_noise.half_width(step, spec.confidence)
            rows = []
            for cell, (keys, total) in enumerate(zip(prepared.keys[aggregate.name], totals)):
                cell_history = history_draws[aggregate.name][cell] + [draws[cell * width:(cell + 1) * width]]
                working.append(cell_history)
                value = Fraction(int(total)) + series_noise.total_noise(cell_history)
                row = dict(zip(aggregate.group_by, keys))
                row.update(_published_cell(value, half_width))
                rows.append(row)
            published[aggregate.name] = {
                "kind": aggregate.kind, "mechanism": p.plan.chosen.mechanism, "budget": {"rho": float(p.plan.rho)},
                "group_by": list(aggregate.group_by), "rows": rows,
            }
        sealed = seal(series_key, sid, step, reservation.attempt, fresh)
        output = {
            **release_header(spec, key, account),
            "charge": {"rho": float(reservation.amount), "rho_exact": str(reservation.amount),
                       "series_rho": float(rho), "series_rho_exact": str(rho), "redraw_rho_exact": str(redraw)},
            "confidence": spec.confidence,
            "series": {
                "generation": generation, "step": step, "horizon": spec.series.horizon,
                "run_id": run.run_id, "data_interval": [_iso(run.data_interval_start), _iso(run.data_interval_end)],
                "attempt": reservation.attempt, "key_id": series_key.key_id, "parameters_sha256": parameters,
            "counted_from": counted_from,
            },
            "aggregates": published,
            "mechanisms": mechanisms,
            "spec_hash": spec_hash,
            "package_version": __version__,
            "released_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            STATE_FIELD: {"sealed": base64.b64encode(sealed).decode("ascii"), "sha256": state_digest(sealed)},
        }
        check_plain_json(output)
        return output, CanonicalOutput.encode(output)
    finally:
        wipe(history_draws)
        for values in working:
            values.clear()
