"""The release engine: spec + upstream aggregates + ledger -> noised release. No Airflow import.

Order of one release (DESIGN.md section 2, invariant 1):

1. replay: if the release key already has a committed output, return it (nothing charged, nothing drawn), once
   authenticated against its signed audit events (:meth:`Ledger.authenticated_output
   <dp_operators.ledger.Ledger.authenticated_output>`: an output edited in the database is never republished);
2. plan from public parameters only (spec, account): mechanisms, scales, charge; on an account with privacy
   blocks, the windows of data charged, from the run's data interval or partition key (:func:`block_windows`);
3. validate the *structure* of the upstream aggregates (missing aggregate, wrong shape, refused type) and
   normalise every key and value to a plain, exact form — errors here spend nothing. Data *values* never raise:
   NaN/inf follow the spec's ``non_finite`` policy, negative counts are clamped to 0, keys outside the public
   domain are ignored. Nothing computed from the data is logged; an optional ``diagnostics`` callback receives
   the exact data-quality report (docs/adr/0016);
4. reserve the charge in the ledger (atomic check-and-charge). The reservation carries a lease: while another
   attempt of the same key (Airflow may start try 2 while try 1 still runs) holds a live lease, the ledger refuses
   with :class:`~dp_operators.ledger.LeaseHeldError` and charges nothing;
5. draw noise from the exact samplers (OS CSPRNG), inside :meth:`Ledger.lease <dp_operators.ledger.Ledger.lease>`
   so a long draw keeps renewing its lease and no other attempt takes the release over meanwhile;
6. build the output and check it is plain, finite JSON; any failure in 5-6 becomes a permanent
   :class:`~dp_operators.release.errors.ReleaseAbortedError` (a retry would charge again), and the reservation is
   released if no sampler was entered, else abandoned (still spent; the next attempt need not wait for its lease);
7. commit it to the ledger under the release key (the token proves this attempt still owns the reservation) and
   return it for publication in the ledger's canonical form (sorted keys), the form every replay returns.

Neighbouring relation: add or remove one privacy unit, which contributes to at most ``max_partitions_contributed``
partitions of each aggregate, at most ``max_contributions_per_partition`` times each, every value clipped to the
declared ``bounds`` upstream.

Mechanisms, calibration, grids and special values are documented for users in ``docs/mechanisms.md``; the
decisions behind them in ``docs/adr/0010`` to ``0014``.
"""
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dp_operators import __version__
from dp_operators.ledger import AccountStatus, AuditChainError, Ledger, LedgerError, ReleaseKey
from dp_operators.ledger.chain import CanonicalOutput
from dp_operators.ledger.structure import bounding_refusal
from dp_operators.release.bounding import declared_bounding
from dp_operators.release.columns import largest_magnitude
from dp_operators.release.diagnostics import DiagnosticsReport
from dp_operators.release.errors import ReleaseAbortedError, ReleaseConfigError, ReleaseInputError
from dp_operators.release.inputs import PreparedInputs, prepare_inputs
from dp_operators.release.plan import NoiseStep, ReleasePlan, plan_release
from dp_operators.release.publish import check_plain_json, in_key_order, publish_aggregate, release_header
from dp_operators.release.rows_file import INLINE_ROWS_LIMIT, RowsStore, cells_tables, check_rows_files, write_rows_file
from dp_operators.release.quantiles import draw_quantiles, publish_quantiles
from dp_operators.release.value_types import aggregate_value_type, grid_problem
from dp_operators.spec import ReleaseSpec
from dp_operators.spec.families import consistent_families

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReleaseResult:
    """What :func:`run_release` returns: the published release (plain JSON) and whether it was a replay."""

    output: dict[str, Any]
    replayed: bool


def _warn_if_spec_changed(stored: Mapping[str, Any], spec_hash: str, key: ReleaseKey) -> None:
    """A replay returns what was released under ``key``, whatever the spec says now; say so if the spec changed."""
    if stored.get("spec_hash") != spec_hash:
        log.warning(
            "release %s was already committed with another version of the spec (sha256 %s); replaying the stored "
            "release unchanged. To release under the new spec, give it a new release name.",
            key, stored.get("spec_hash"),
        )


def check_privacy_unit(spec: ReleaseSpec, account: AccountStatus) -> None:
    """Refuse a spec whose privacy unit is not the account's: a budget only composes over one privacy unit.

    Raises:
        ReleaseConfigError: naming both units.
    """
    if account.privacy_unit != spec.privacy_unit:
        raise ReleaseConfigError(
            f"the spec protects privacy unit {spec.privacy_unit!r} but budget account {account.name!r} is for "
            f"{account.privacy_unit!r}; a budget only composes over one privacy unit"
        )


def block_windows(
    spec: ReleaseSpec,
    ledger: Ledger,
    *,
    data_interval: tuple[dt.datetime | None, dt.datetime | None] | None = None,
    partition_key: str | None = None,
) -> list[str] | None:
    """The data windows a release of ``spec`` reads, when its budget account has privacy blocks; ``None`` when it
    has none (a plain account, or team quotas). Decided from the run's schedule (public), never from the data:
    the windows of ``day``/``week``/``month`` blocks that the run's data interval ``[start, end)`` overlaps, and
    ``spec.lookback_windows`` earlier ones (:func:`~dp_operators.ledger.structure.windows_read`); for
    ``partition`` blocks, the run's partition key alone. Window ids as the ledger names its blocks:
    ``2013-01-05``, ``2013-W01``, ``2013-01``, or the partition key.

    Args:
        data_interval: the run's data interval, two timezone-aware datetimes (Airflow's ``data_interval_start``
            and ``data_interval_end``, UTC), or ``None`` / ``(None, None)`` for a run without one.
        partition_key: the run's partition key (Airflow's ``dag_run.partition_key``), or ``None``.

    Raises:
        ReleaseConfigError: ``spec.lookback_windows`` is given but the account has no calendar blocks; the account
            has blocks and the run has no data interval (or partition key), an empty or naive interval, or more
            windows than a release may read. Raised before anything is reserved; the message says how to fix it.
        AccountNotFoundError: the account does not exist.
    """
    from dp_operators.ledger.structure import windows_read

    kind, granularity = ledger.structure(spec.budget_account)
    lookback = spec.lookback_windows
    if kind != "blocks":
        if lookback is not None:
            raise ReleaseConfigError(
                f"release {spec.release!r} declares lookback_windows: {lookback}, but its budget account "
                f"{spec.budget_account!r} has no privacy blocks, so there are no windows to look back over: drop "
                "lookback_windows from the spec, or name an account with calendar blocks (blocks: {window: day}) "
                "in config/ledgers.yaml. Nothing was charged"
            )
        return None
    start, end = data_interval if data_interval is not None else (None, None)
    try:
        return windows_read(granularity, start, end, lookback=lookback or 0, partition_key=partition_key)
    except ValueError as error:
        raise ReleaseConfigError(
            f"release {spec.release!r} on account {spec.budget_account!r} ({granularity} privacy blocks): {error}. "
            "Nothing was charged"
        ) from None


def add_exactly(values: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """``values + noise`` without overflow: int64 when every noise value is below 2^62 in magnitude (the grid
    integers are within +-2^62, so the sum is within int64), else Python ints in an object array. Never a float."""
    noise = np.asarray(noise)
    if noise.dtype == np.int64 and largest_magnitude(noise) < 2**62:
        return values + noise
    return values.astype(object) + noise.astype(object)


def draw_noise(
    plan: ReleasePlan, prepared: PreparedInputs, drawn: list[str]
) -> tuple[dict[tuple[str, str], np.ndarray], dict[str, np.ndarray]]:
    """Noised integer vectors per (aggregate, component) (numpy int64, or object arrays of Python ints), and the
    positions of the selected keys under partition selection. ``drawn`` records every draw *before* it starts,
    so a caller knows whether any noise may exist.

    Keys are selected by :func:`selected_positions`.
    """
    noised: dict[tuple[str, str], np.ndarray] = {}
    selected: dict[str, np.ndarray] = {}
    for aggregate in plan.spec.aggregates:
        if aggregate.releases_quantiles:  # released by draw_quantiles (their own mechanisms)
            continue
        positions = None
        if not aggregate.public_keys:
            positions = selected_positions(plan.step(aggregate.name, "selection"),
                                           prepared.values[(aggregate.name, "selection")], drawn)
            selected[aggregate.name] = positions
        for component in aggregate.components:
            step = plan.step(aggregate.name, component)
            values = prepared.values[(aggregate.name, component)]
            if positions is not None:
                values = values[positions]
            drawn.append(step.component)
            noised[(aggregate.name, component)] = add_exactly(values, step.draw(len(values)))
    return noised, selected


def selected_positions(step: NoiseStep, units: np.ndarray, drawn: list[str]) -> np.ndarray:
    """The positions of the keys a partition-selection ``step`` keeps: those whose noised number of privacy units
    (``units``) is >= the threshold, the same comparison the threshold's delta was computed with
    (:func:`~dp_operators.mechanisms.calibration.discrete_laplace_threshold`). Records the draw in ``drawn`` first."""
    drawn.append(step.component)
    noised = add_exactly(units, step.draw(len(units)))
    return np.flatnonzero(np.asarray(noised >= step.threshold, dtype=bool))


def select_groups(step: NoiseStep, units: np.ndarray, groups: Sequence[tuple], cells: np.ndarray,
                  counts: np.ndarray, bins: int, drawn: list[str]) -> tuple[np.ndarray, list[tuple]]:
    """The histograms of a quantile's groups selected from the data: a group is kept iff its noised number of
    privacy units is at least the threshold (``units``, shape (G,); :func:`selected_positions`). ``cells`` and
    ``counts`` are the candidates' sparse histograms (:class:`~dp_operators.release.inputs.PreparedInputs`).
    Returns the kept groups' dense histograms (shape (kept * bins,), each group's bins contiguous, a bin with no
    row 0) and their keys. Only the kept groups' bins are filled: the work is one step per candidate and per cell
    with a row, plus ``bins`` per kept group."""
    kept = selected_positions(step, units, drawn)
    slot = np.full(len(units), -1, dtype=np.int64)
    slot[kept] = np.arange(len(kept))
    group, index = np.divmod(cells, bins)
    inside = slot[group] >= 0
    dense = np.zeros(len(kept) * bins, dtype=np.int64)
    dense[slot[group[inside]] * bins + index[inside]] = counts[inside]
    return dense, [groups[i] for i in kept.tolist()]


def check_inline_rows_limit(limit: object) -> int | None:
    """``limit`` if it is ``None`` or an int >= 0 (not a bool).

    Raises:
        ValueError: anything else (a string from an environment variable, a float, a negative number).
    """
    if limit is None or (type(limit) is int and limit >= 0):
        return limit
    raise ValueError(f"inline_rows_limit must be None or an int >= 0 (a number of cells), got {limit!r}")


def filed_aggregates(spec: ReleaseSpec, limit: int | None) -> list[str]:
    """The counts and sums over a public key domain of more than ``limit`` cells: their rows go to a rows file
    (:mod:`dp_operators.release.rows_file`). Public parameters only."""
    if check_inline_rows_limit(limit) is None:
        return []
    return [a.name for a in spec.aggregates
            if a.public_keys and a.kind in ("count", "sum") and a.group_by and a.partition_count > limit]


def too_large_inline(spec: ReleaseSpec, limit: int | None) -> str | None:
    """Why ``spec`` cannot be released under ``limit``: a mean or variance over a public domain of more than
    ``limit`` cells (published inline only, so its rows would all go to the ledger and XCom); else None."""
    if check_inline_rows_limit(limit) is None:
        return None
    large = [f"{a.name} ({a.kind}, {a.partition_count} cells)" for a in spec.aggregates
             if a.public_keys and a.kind in ("mean", "variance") and a.partition_count > limit]
    if not large:
        return None
    return (f"aggregate(s) {', '.join(large)} release more than inline_rows_limit={limit} cells, and a mean or "
            "variance is published inline only (its rows would all go to the ledger row and XCom): release its "
            "bounded sum and its count as two aggregates (rows files), or raise inline_rows_limit")


def run_release(
    spec: ReleaseSpec,
    aggregates: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    ledger: Ledger,
    key: ReleaseKey,
    *,
    spec_hash: str,
    try_number: int | None = None,
    audit: Mapping[str, Any] | None = None,
    diagnostics: Callable[[DiagnosticsReport], None] | None = None,
    rows_store: RowsStore | None = None,
    inline_rows_limit: int | None = INLINE_ROWS_LIMIT,
    data_interval: tuple[dt.datetime | None, dt.datetime | None] | None = None,
    partition_key: str | None = None,
    bounding: Mapping[str, Mapping[str, Any]] | None = None,
) -> ReleaseResult:
    """Run one release end to end (see the module docstring for the order of steps).

    Args:
        spec: the validated release spec.
        aggregates: true aggregates from upstream, shaped as :func:`prepare_inputs` documents, or a function
            returning them, called only when the release is not a replay (a retry then needs no upstream value).
        ledger: the budget ledger.
        key: the release key; ``key.release_name`` must equal ``spec.release``.
        spec_hash: SHA-256 of the spec's text, recorded with the charge.
        try_number: the Airflow try, recorded for the audit trail only (never part of the key).
        audit: who/where context for the ledger's audit events (``run_type``, ``triggering_user``, ...; see
            :meth:`dp_operators.ledger.Ledger.reserve`). Never data values.
        diagnostics: opt-in: called once with the :class:`~dp_operators.release.diagnostics.DiagnosticsReport` of
            the upstream aggregates (exact, data-derived counts; row indexes of shape problems), after they are
            read and before the reservation, whether or not the release is then refused. Not called on a replay
            (the aggregates are not read). Store the report with the true aggregates; never log it.
        rows_store: where the rows of counts and sums of more than ``inline_rows_limit`` public cells go, as
            Parquet files the ledger records by SHA-256 and location (:mod:`dp_operators.release.rows_file`);
            a replay checks them. ``inline_rows_limit=None`` keeps every row in the output.
        data_interval: the run's data interval ``(start, end)``, timezone-aware (Airflow's, UTC). On a budget
            account with privacy blocks it decides the windows charged (:func:`block_windows`): every block the
            interval overlaps, and ``spec.lookback_windows`` earlier ones, each charged the full amount, all or
            nothing. Ignored on an account without blocks.
        partition_key: the run's partition key, the one window of an account with ``partition`` blocks.
        bounding: aggregate name -> how its contribution bounds came to hold
            (:func:`~dp_operators.release.bounding.enforced_bounding`: bounded by the operator from raw rows, or
            :func:`~dp_operators.release.bounding.declared_bounding`); an aggregate missing here (and every one when
            ``None``) is declared by the upstream author. Recorded with every mechanism of the charge and published
            as ``contribution_bounding``. An account whose configuration has ``require_enforced_bounding`` refuses a
            release with a declared aggregate, here before anything is read, and in the ledger's database.

    Returns:
        :class:`ReleaseResult`. On a replay the stored output is returned unchanged and nothing is charged.

    Raises:
        ReleaseInputError, ReleaseConfigError, IncompatibleAccountantError: before anything is reserved (a spec
            with more than ``inline_rows_limit`` public cells in a count or sum and no ``rows_store`` included; on
            an account with privacy blocks, a run without a data interval or partition key; ``lookback_windows``
            on an account without calendar blocks).
        RowsFileError: on a replay, a rows file is missing or altered (nothing is charged or redrawn).
        AuditChainError: on a replay, the stored output or its audit events were altered (nothing is published).
        AccountNotFoundError, DagNotAllowedError, BudgetExhaustedError: refusals from the ledger; nothing reserved.
            On an account with privacy blocks: a window whose block is not open is an ``AccountNotFoundError``
            naming it, a spent block a ``BudgetExhaustedError`` naming its member account (``X@2013-01-05``); no
            other block is charged.
        LeaseHeldError: another attempt of ``key`` is still running and holds the lease on its reservation
            (``.attempt``, ``.expires_at``, UTC); nothing was charged and no aggregate was noised. Transient: a
            retry replays that attempt's output once it commits, or takes the release over (charging again,
            the dead attempt's charge staying spent) once its lease has expired.
        LedgerKeyError: the ledger has no spend key, or not the one the account accepts; nothing reserved.
        ReleaseAbortedError: an exception after the reservation and before the commit (chained as its cause).
            The reservation is released if no sampler was entered, else abandoned (it stays spent, and its lease
            ends at once). Permanent: do not retry.
        ChargeStateError: at the commit, this attempt no longer owns the reservation (its lease lapsed, e.g. the
            renewals failed, and another attempt took the release over); the output is not returned and the
            charge stays spent.
    """
    if key.release_name != spec.release:
        raise ReleaseConfigError(f"release key names {key.release_name!r} but the spec releases {spec.release!r}")
    stored = ledger.authenticated_output(key, spec.budget_account)
    if stored is not None:
        return _replay(stored, spec_hash, key, rows_store)
    filed = filed_aggregates(spec, inline_rows_limit)
    refusal = too_large_inline(spec, inline_rows_limit)
    if refusal:
        raise ReleaseConfigError(refusal)
    if filed and rows_store is None:
        raise ReleaseConfigError(
            f"aggregate(s) {filed} release more than inline_rows_limit={inline_rows_limit} cells: their rows are "
            "stored as a Parquet file whose digest the ledger keeps; give a rows_store (the operator: an "
            "output_uri), or raise inline_rows_limit"
        )
    problem = filed_value_problem(spec, filed) if filed else None
    if problem:
        raise ReleaseConfigError(f"the rows file cannot hold its values exactly: {problem}")

    account = ledger.account(spec.budget_account)
    check_privacy_unit(spec, account)
    bounding = contribution_bounding(spec, bounding)
    check_bounding_required(spec, bounding, ledger.account_config(account.name))
    # which blocks are charged: from the run's schedule, before the data is read and anything is reserved
    windows = block_windows(spec, ledger, data_interval=data_interval, partition_key=partition_key)
    plan = plan_release(spec, accountant=account.accountant)
    charge = plan.charge(account.accountant)
    delta_spent = plan.delta(account.accountant)
    if callable(aggregates):
        aggregates = aggregates()
    # No log line, warning or message here may depend on the data (DESIGN.md 2.8): counts of dropped rows or
    # special values go to the opt-in report only.
    report = DiagnosticsReport(spec.release)
    try:
        prepared = prepare_inputs(spec, aggregates, diagnostics=report)
    except ReleaseInputError:
        if diagnostics is not None:
            try:
                diagnostics(report)
            except Exception as failure:  # the input error is the one to report; nothing was reserved
                log.warning("the diagnostics report could not be delivered: %s", type(failure).__name__)
        raise
    del aggregates  # the prepared integers are all the engine needs; fewer raw values in this frame's locals
    if diagnostics is not None:
        diagnostics(report)

    families = None
    if spec.postprocess.consistent:  # public structure and accuracy, before anything is reserved (scipy is
        from dp_operators.release.consistent import plan_families  # imported only by specs that ask for it)

        families = plan_families(plan)

    mechanisms = [{**step.describe(), "contribution_bounding": bounding[step.aggregate]} for step in plan.steps]
    reservation = ledger.reserve(
        key,
        account=account.name,
        amount=charge,
        delta=delta_spent,
        mechanisms=mechanisms,
        spec_hash=spec_hash,
        try_number=try_number,
        audit=audit,
        **({} if windows is None else {"windows": windows}),
    )
    if isinstance(reservation, dict):  # committed meanwhile by another attempt: authenticated like any replay
        authenticated = ledger.authenticated_output(key, spec.budget_account)
        if authenticated is None:  # reserve() saw a committed charge this read does not: never publish it unchecked
            raise AuditChainError(f"release {key.release_name!r}: the ledger returned a committed output it then "
                                  "does not hold; nothing is published. A privacy officer runs `dpctl ledger verify`")
        return _replay(authenticated, spec_hash, key, rows_store)

    # From here on a failure keeps the charge spent unless no sampler was entered (DESIGN.md 2.1, ADR 1), and is
    # permanent: every check that can fail ran before the reservation, so a failure here is a bug a retry would
    # repeat, charging again each time. The lease is renewed in the background while the noise is drawn, so a
    # concurrent attempt of the same key is refused (not charged) however long the draw takes; the renewals stop
    # before the commit, which the lease's remaining two thirds or more cover.
    drawn: list[str] = []
    try:
        with ledger.lease(reservation):
            output, text = _noised_output(plan, prepared, drawn, key, account, charge, delta_spent, mechanisms,
                                          spec_hash, _rows_writer(rows_store, set(filed), spec.confidence,
                                                                     _family_members(spec)), families, windows)
    except Exception as error:
        returned = give_up(ledger, reservation, drawn)
        raise ReleaseAbortedError(error, budget_returned=returned) from error
    except BaseException:  # interrupts and task timeouts: not a deterministic failure, keep their meaning
        give_up(ledger, reservation, drawn)
        raise
    try:
        ledger.commit(reservation, output, canonical=text)
    except LedgerError:  # a refusal of the ledger's own (ChargeStateError: this attempt lost its lease and another
        raise  # took the release over); the charge stays spent and this output is never published
    except Exception as error:  # the noise exists: the charge stays spent, and a retry must not charge again
        give_up(ledger, reservation, drawn)
        raise ReleaseAbortedError(error, budget_returned=False) from error
    # the committed form: what the ledger stores and every replay returns (sorted keys), so a first run and its
    # replays publish the same bytes and the same XCom
    return ReleaseResult(output=in_key_order(output), replayed=False)


def contribution_bounding(spec: ReleaseSpec, bounding: Mapping[str, Mapping[str, Any]] | None
                          ) -> dict[str, dict[str, Any]]:
    """Every aggregate's bounding record (:func:`run_release`'s ``bounding``), declared where none is given.

    Raises:
        ReleaseConfigError: ``bounding`` names an aggregate the spec does not release.
    """
    given = dict(bounding or {})
    unknown = sorted(set(given) - {aggregate.name for aggregate in spec.aggregates})
    if unknown:
        raise ReleaseConfigError(f"contribution bounding is given for {unknown}, which the spec does not release")
    return {aggregate.name: dict(given.get(aggregate.name) or declared_bounding("upstream"))
            for aggregate in spec.aggregates}


def check_bounding_required(spec: ReleaseSpec, bounding: Mapping[str, Mapping[str, Any]],
                            config: Mapping[str, Any] | None) -> None:
    """Refuse a release with an aggregate whose bounds were declared, on an account whose stored configuration
    requires enforced bounding (``require_enforced_bounding``). Public: the spec, the operator's sources and the
    account's configuration, never the data.

    Raises:
        ReleaseConfigError: naming the declared aggregates and how to read them from raw rows.
    """
    # the ledger's own rule (structure.bounding_refusal, which dp_reserve_member applies), on the records the
    # charge's mechanisms will carry
    declared = bounding_refusal(config, [{"aggregate": name, "contribution_bounding": record}
                                         for name, record in bounding.items()])
    if declared is not None:
        raise ReleaseConfigError(
            f"budget account {spec.budget_account!r} requires enforced contribution bounding, but the bounds of "
            f"{declared} are declared by their author (aggregates computed upstream or by a hand-written query). "
            "Read the raw rows with the operator's table= (or rows_query=), privacy_unit_column= and value_columns= "
            "arguments (DPSQLReleaseOperator; rows_uri= for a file), so the operator bounds them itself; or ask the "
            "privacy officer to lift require_enforced_bounding in ledgers.yaml. Nothing was read or charged"
        )


def _replay(stored: dict[str, Any], spec_hash: str, key: ReleaseKey, rows_store: RowsStore | None) -> ReleaseResult:
    _warn_if_spec_changed(stored, spec_hash, key)
    if rows_store is not None:
        check_rows_files(stored, rows_store)
    return ReleaseResult(output=stored, replayed=True)


def _rows_writer(store: RowsStore | None, filed: set[str], confidence: float,
                 family_members: set[str]) -> dict[str, Callable]:
    """The ``rows_file`` callback of :func:`publish_aggregate` per aggregate in ``filed``. The value column's type
    comes from the published description of the cells' noise step, as a reader of the committed output finds it
    (:func:`~dp_operators.release.value_types.output_value_types`), and from the family membership
    (``family_members``, published as ``consistency``): public parameters only."""
    if store is None:
        return {}

    def write(aggregate: Any, cells: Any, keys: Any) -> dict[str, Any]:
        value_type = aggregate_value_type(aggregate.kind, cells.step.describe(), aggregate.name in family_members)
        return write_rows_file(store, aggregate, cells_tables(aggregate, cells, keys, confidence,
                                                              value_type=value_type))

    return dict.fromkeys(filed, write)


def _family_members(spec: ReleaseSpec) -> set[str]:
    """The names of every member of a consistent family of ``spec`` (their values are published as doubles)."""
    return {name for layout in consistent_families(spec) for name in layout.members}


def filed_value_problem(spec: ReleaseSpec, names: Iterable[str]) -> str | None:
    """Why the values of the aggregates ``names`` (counts and sums whose rows go to Parquet files: rows files,
    or the release's Parquet output) cannot be written exactly, or None: a sum's grid with no exact decimal form
    (:func:`~dp_operators.release.value_types.grid_problem`; a consistent family's members are doubles, and
    excepted). Public parameters only: checked before any budget is reserved."""
    names = set(names)
    members = _family_members(spec)
    for aggregate in spec.aggregates:
        if aggregate.name in names and aggregate.kind == "sum" and aggregate.name not in members:
            problem = grid_problem(aggregate.grid)
            if problem:
                return (f"aggregate {aggregate.name!r}: {problem} (a Parquet file's value column): use a decimal "
                        "grid such as 0.5, 0.001 or 1/1024, or publish it as JSON")
    return None


def give_up(ledger: Ledger, reservation: Any, drawn: list[str]) -> bool:
    """End a failed attempt's reservation so the next attempt of the key need not wait for its lease: released
    (the budget comes back) if no sampler was entered, else abandoned (it stays spent: noise may exist). Returns
    True iff the budget came back. A ledger failure here is logged (its type only) and leaves the charge reserved
    and spent until its lease expires, which is safe; the abort stays permanent instead of becoming the ledger's
    error."""
    try:
        if drawn:
            ledger.abandon(reservation)
            return False
        ledger.release(reservation)
    except Exception as failure:  # noqa: BLE001 - any failure here only wastes budget or time, never leaks
        log.warning("the failed attempt's reservation could not be ended (%s); it stays spent until its lease "
                    "expires", type(failure).__name__)
        return False
    return True


def _noised_output(
    plan: ReleasePlan,
    prepared: PreparedInputs,
    drawn: list[str],
    key: ReleaseKey,
    account: AccountStatus,
    charge: Fraction,
    delta_spent: Fraction,
    mechanisms: list[dict[str, Any]],
    spec_hash: str,
    rows_writers: Mapping[str, Callable] | None = None,
    families: list[Any] | None = None,
    windows: list[str] | None = None,
) -> tuple[dict[str, Any], CanonicalOutput]:
    """Draw the noise and build the published release, checked to be plain JSON (steps 5 and 6). ``families``:
    the spec's consistent families, planned (:func:`~dp_operators.release.consistent.plan_families`); ``windows``:
    the privacy blocks charged (:func:`block_windows`), published as ``privacy_blocks`` (absent without blocks).

    Returns ``(output, text)``: ``text`` is the output's canonical JSON
    (:class:`~dp_operators.ledger.chain.CanonicalOutput`), encoded once here for the ledger's row and digest and for
    the returned form."""
    spec = plan.spec
    noised, selected = draw_noise(plan, prepared, drawn)
    quantiles = {}
    for aggregate in spec.aggregates:
        if aggregate.releases_quantiles:
            step = plan.step(aggregate.name, "quantile")
            counts, keys = prepared.values[(aggregate.name, "count")], prepared.keys[aggregate.name]
            selection = None
            if aggregate.public_keys:
                groups = [keys[g * step.bins][:-1] for g in range(len(counts) // step.bins)]
            else:  # the groups whose noised units reach the threshold, then their bins
                selection = plan.step(aggregate.name, "selection")
                counts, groups = select_groups(selection, prepared.values[(aggregate.name, "selection")], keys,
                                               prepared.values[(aggregate.name, "cells")], counts, step.bins, drawn)
            bins = draw_quantiles(step, counts, drawn)
            quantiles[aggregate.name] = publish_quantiles(aggregate, step, bins, groups, selection)
    consistent: dict[str, Any] = {}
    consistency: dict[str, Any] = {}
    if families is not None:
        from dp_operators.release.consistent import consistent_cells

        consistent, consistency = consistent_cells(plan, noised, 1 - spec.confidence, families)
    keys = dict(prepared.keys)
    for name, positions in selected.items():
        keys[name] = [keys[name][i] for i in positions.tolist()]

    output = {
        **release_header(spec, key, account),
        **({} if windows is None else {"privacy_blocks": list(windows)}),
        "charge": {
            account.unit: float(charge),
            f"{account.unit}_exact": str(charge),
            "epsilon_at_delta": account.as_epsilon(charge),
            "delta": None if account.delta is None else float(account.delta),
        },
        "confidence": spec.confidence,
        "aggregates": {
            aggregate.name: quantiles[aggregate.name] if aggregate.releases_quantiles else publish_aggregate(
                spec, aggregate, plan, noised, keys[aggregate.name], (rows_writers or {}).get(aggregate.name),
                consistent.get(aggregate.name), consistency.get(aggregate.name),
            )
            for aggregate in spec.aggregates
        },
        "mechanisms": mechanisms,
        "contribution_bounding": {m["aggregate"]: m["contribution_bounding"] for m in mechanisms},
        "spec_hash": spec_hash,
        "package_version": __version__,
        "released_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if delta_spent:
        output["charge"]["delta_spent"] = float(delta_spent)
        output["charge"]["delta_spent_exact"] = str(delta_spent)
    check_plain_json(output)
    # what the ledger stores and the operator writes: UTF-8 JSON (inside the permanent-failure path)
    text = CanonicalOutput.encode(output)
    text.encode("utf-8")
    return output, text
