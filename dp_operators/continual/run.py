"""One step of a series: the running totals of one DAG run, noised so that the whole series costs its budget once
(ADR 32 for the mechanism, ADR 33 for the ledger). No Airflow import.

Which step a run releases, and the series' identity: :mod:`.steps`; what is checked of the spec and the upstream
before any charge: :mod:`.checks`.

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
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any


from dp_operators import __version__
from dp_operators.accounting import IncompatibleAccountantError
from dp_operators.continual.noise import SeriesNoise
from dp_operators.continual.plan import AggregateSeriesPlan, plan_spec_series, strategy_of
from dp_operators.continual.state import SeriesKey, SeriesKeyError, open_sealed, seal, state_digest
from dp_operators.ledger import BudgetExhaustedError, Ledger, ReleaseKey
from dp_operators.ledger.chain import CanonicalOutput
from dp_operators.ledger.store import SERIES_STATE_FIELD, published_form
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array
from dp_operators.release.diagnostics import DiagnosticsReport
from dp_operators.release.errors import ReleaseAbortedError, ReleaseConfigError, ReleaseInputError
from dp_operators.release.inputs import prepare_inputs
from dp_operators.release.upstream_types import SATURATION
from dp_operators.release.publish import check_plain_json, in_key_order, release_header
from dp_operators.release.run import ReleaseResult, check_privacy_unit, give_up
from dp_operators.spec import ReleaseSpec
from dp_operators.continual.checks import (
    COUNTED_FROM_KEY,
    check_integer_totals,
    check_releasable,
    counted_as_declared,
)
from dp_operators.continual.steps import (
    SeriesOrderError,
    SeriesSteps,
    StepRun,
    committed_steps,
    next_step,
    series_id,
    series_start,
    step_key,
    utc_iso,
)

#: The output field holding the sealed noise (never published).
STATE_FIELD = SERIES_STATE_FIELD

#: The names of :mod:`.steps` and :mod:`.checks` a step's callers use, with this module's own.
__all__ = [
    "COUNTED_FROM_KEY", "STATE_FIELD", "SeriesOrderError", "SeriesSteps", "StepRun", "check_releasable",
    "committed_steps", "noise_of", "published_form", "redraw_charge", "run_series_step", "series_charge", "series_id",
    "series_parameters", "series_start", "step_key", "wipe",
]


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
        ReleaseInputError: running totals that are not integers by type (:func:`check_integer_totals`), or as
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
            (utc_iso(run.data_interval_start), utc_iso(run.data_interval_end)))
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
        counted_from = utc_iso(run.data_interval_start) if step == 0 else steps[0]["series"]["counted_from"]
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
        upstream = counted_as_declared(spec, aggregates(), counted_from)
        check_integer_totals(spec, upstream)
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
                "run_id": run.run_id, "data_interval": [utc_iso(run.data_interval_start), utc_iso(run.data_interval_end)],
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
