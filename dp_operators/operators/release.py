"""``DPReleaseOperator``: noise upstream aggregates as a release spec says, charge the ledger, publish.

The operator is thin (STYLE.md): it reads the true aggregates (:mod:`~dp_operators.operators.upstream`,
:mod:`~dp_operators.operators.sources`), calls :func:`dp_operators.release.run_release`, and publishes what the ledger
committed (:mod:`~dp_operators.operators.sinks`, :mod:`~dp_operators.operators.locations`). No DP arithmetic here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator, ObjectStoragePath
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowRescheduleException
from sqlalchemy.exc import SQLAlchemyError

from dp_operators.accounting import IncompatibleAccountantError
from dp_operators.continual.state import SeriesKeyError
from dp_operators.hooks.ledger import DPLedgerHook
from dp_operators.ledger import LeaseHeldError, LedgerError, ReleaseKey
from dp_operators.release import (
    DiagnosticsReport,
    ReleaseAbortedError,
    ReleaseConfigError,
    ReleaseInputError,
    run_release,
)
from dp_operators.operators.assets import (
    RELEASE_ALIAS,
    announce,
    announced_before,
    default_asset,
    release_outlets,
)
from dp_operators.operators.gate import load_planned_spec
from dp_operators.ledger.errors import ApprovalRequiredError
from dp_operators.operators.approval_wait import wait_for_approval
from dp_operators.operators.lease_wait import (
    LEASE_WAIT_MARGIN,
    LEASE_WAIT_MIN,
    LEASE_WAIT_TIMEOUT,
    lease_held_message,
    lease_wait_until,
)
from dp_operators.operators.lineage import RELEASE_LOCATION_XCOM_KEY, ReleaseLineageMixin
from dp_operators.operators.locations import (
    check_publishable,
    diagnostics_file,
    published_uri,
    release_folder,
    release_stem,
)
from dp_operators.operators.sinks import ObjectStorageRowsStore, SQLTableSink, check_formats, release_csv, write_files
from dp_operators.operators.flat_rows import NotInlineError
from dp_operators.release.rows_file import INLINE_ROWS_LIMIT, ROWS_SUFFIX, RowsFileError
from dp_operators.release.value_types import ColumnRangeError
from dp_operators.release.run import check_inline_rows_limit, filed_aggregates, filed_value_problem, too_large_inline
from dp_operators.operators.raw_rows import bounded_file_aggregates, check_raw_rows_arguments
from dp_operators.operators.sources import is_reference, read_reference
from dp_operators.release.bounding import declared_bounding, enforced_bounding
from dp_operators.operators.upstream import describe_missing, pull_return_value
from dp_operators.spec import load_spec_with_hash

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Refusals no retry can fix: Airflow must fail the task at once (DESIGN.md 7). Every ledger refusal is one
#: (budget exhausted, DAG not allowed, unknown account, no schema, wrong spend key: configuration), except
#: :class:`LeaseHeldError`, which is caught first and is no failure at all: another try of the same release still
#: holds its lease, so the task is rescheduled to the lease's end (:func:`lease_wait_until`, ADR 31) without spending
#: a try, and then replays that try's output or takes the release over.
_PERMANENT = (LedgerError, ReleaseInputError, ReleaseConfigError, IncompatibleAccountantError, SeriesKeyError)



@dataclass(frozen=True)
class PublishedRelease:
    """What one :meth:`DPReleaseOperator.execute` published (read by lineage and extra links).

    Attributes:
        output: the committed release (plain JSON, canonical key order).
        replayed: True when the release key was already committed (nothing charged, no asset event).
        locations: format (``json``, ``csv``, ``parquet``) -> URI of the file written
            (:func:`~dp_operators.operators.locations.published_uri`: RFC 3986, its path percent-decoded once is the
            file's, so a folder's ``%3A`` is ``%253A`` in it).
        sql_table: the SQL sink's table, if any.
    """

    output: dict[str, Any]
    replayed: bool
    locations: dict[str, str] = field(default_factory=dict)
    sql_table: str | None = None


class DPReleaseOperator(ReleaseLineageMixin, BaseOperator):
    """Release differentially private aggregates: noise them as a release spec says, charge the ledger, publish.

    The spec file is read and validated when the DAG is parsed, so a bad spec fails at DAG import with the file,
    the field path and the reason. The true aggregates are read inside :meth:`execute` (never through a templated
    field: Airflow stores rendered fields in its database and shows them in the UI), from one source:

    * ``aggregates_task_id``: the upstream task's return value (XCom), of the same map index when the release is
      mapped with it (:mod:`dp_operators.operators.upstream`); a reference returned there (a URI with a scheme, or
      an absolute path, ending .json/.csv/.parquet/.pq, or a mapping of aggregate name -> such URIs:
      :func:`~dp_operators.operators.sources.is_reference`) is read by
      :func:`dp_operators.operators.sources.read_reference`;
    * ``aggregates_uri``: such a reference given directly (JSON, CSV or Parquet by ``ObjectStoragePath``);
    * a subclass's :meth:`read_aggregates` (:class:`~dp_operators.operators.sql.DPSQLReleaseOperator` runs SQL).

    What the ledger committed is published to XCom (``return_value``), to files under ``output_uri`` and to an
    optional SQL table; a replay (the release key already committed: a retry, a cleared task) publishes the same
    bytes everywhere and emits no asset event (it drops its asset from the running task's outlets;
    :mod:`~dp_operators.operators.assets`, ADR 0021), unless no earlier try of the task instance announced it.

    Args:
        spec_path: path of the release spec YAML (absolute, or relative to the working directory).
        aggregates_task_id: the upstream task returning the true aggregates (shape: see
            :func:`dp_operators.release.prepare_inputs`) or a reference to files holding them.
        aggregates_uri: a reference to files holding the true aggregates (instead of ``aggregates_task_id``):
            one JSON file of the whole mapping, or a mapping aggregate name -> JSON/CSV/Parquet file. (templated)
        output_uri: folder (any ``ObjectStoragePath`` URI: ``file:///srv/releases``, ``s3://bucket/dp``) where
            ``<release>/<dag_id>/<run_id>/<task_id>[~<map_index>].<format>`` is written, each name encoded
            reversibly (:mod:`dp_operators.operators.locations`). None: no files. (templated)
        output_formats: the file formats under ``output_uri``: any of ``json``, ``csv``, ``parquet``.
        sql_sink: a :class:`~dp_operators.operators.sinks.SQLTableSink` the released rows are upserted into.
        ledger_conn_id: Airflow connection of the budget ledger (see :class:`DPLedgerHook`).
        asset: the asset whose event announces a new release; default ``Asset(name=<release>,
            uri="dp-release://<release>")`` (independent of the budget account, so moving a release to another
            account keeps its asset).
        diagnostics_uri: opt-in data-quality report: a folder (``ObjectStoragePath`` URI) where
            ``<release>/<dag_id>/<run_id>/<task_id>~diagnostics.json`` is written before any budget is reserved,
            whether or not the release is then refused (:class:`~dp_operators.release.DiagnosticsReport`). It holds
            exact, data-derived numbers: point it next to the true aggregates, readable only by the people who may
            see them. Default None: no report (the task log never holds such numbers). (templated)
        rows_uri: instead of aggregates, a CSV or Parquet file of raw rows (``ObjectStoragePath`` URI) that the
            operator bounds and aggregates itself (:mod:`dp_operators.release.bounding`): per privacy unit at most
            ``max_partitions_contributed`` keys and ``max_contributions_per_partition`` rows per key, chosen at
            random, values clipped to the spec's ``bounds``. The ledger records the release's bounds as
            ``enforced``; from ``aggregates_task_id``/``aggregates_uri`` they are ``declared``. (templated)
        privacy_unit_column: with ``rows_uri``, the column identifying the privacy unit.
        value_columns: with ``rows_uri``, aggregate name -> the column a ``sum``, ``mean`` or ``variance`` adds.
        lease_wait_timeout: how long the task waits, in all, for another try's live lease on this release
            (:data:`LEASE_WAIT_TIMEOUT`, 7 hours, by default), counted from its first wait; then it fails without a
            retry. A holder that keeps renewing that long is hung (its keeper thread alive, its work not) or is not
            one of this task's tries.

    On a budget account with privacy blocks (``blocks:`` in ``config/ledgers.yaml``) the release is charged on the
    block of every data window its run reads: those its data interval (``data_interval_start``,
    ``data_interval_end``) overlaps and the spec's ``lookback_windows`` earlier ones, or, for ``partition`` blocks,
    the run's ``partition_key``; never windows taken from the data (:func:`dp_operators.release.run.block_windows`).

    Returns (XCom ``return_value``): the published release, plain JSON; identical, byte for byte, on every replay.
    Also pushes XCom ``release_location``: the JSON file's URI (the "DP release" extra link), as every published
    location, an RFC 3986 URI whose path percent-decoded once is the file's
    (:func:`~dp_operators.operators.locations.published_uri`).

    Raises:
        ValueError: at construction, neither or both of ``aggregates_task_id`` and ``aggregates_uri``, or an unknown
            output format.
        AirflowFailException: budget exhausted, DAG not allowed, unknown account, ledger not initialised, a
            missing or rotated spend key, missing or malformed upstream aggregates, on an account with privacy blocks
            a spent or unopened block or a run without a data interval (or partition key), ``lookback_windows`` on
            an account without blocks, a series on an account with blocks: refusals that retrying cannot fix;
            and any failure after the budget was reserved (:class:`~dp_operators.release.ReleaseAbortedError`),
            which a retry would repeat while charging again.
        AirflowRescheduleException: another try of this release is still running and holds the ledger's lease on
            its reservation (Airflow can start try 2 while try 1 still runs): nothing was charged, and the task waits
            for the lease's end without spending a try, then replays that try's committed output, or takes the
            release over once the lease has expired (that try died; its charge stays spent). ADR 31.
        AirflowException: retryable. The ledger's database failing, a sink failing after the commit (a retry
            replays and rewrites the same content), and unexpected errors before any reservation (their text
            withheld).
    """

    template_fields: Sequence[str] = ("aggregates_uri", "rows_uri", "output_uri", "diagnostics_uri")
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        spec_path: str | Path,
        aggregates_task_id: str | None = None,
        aggregates_uri: str | Mapping[str, str] | None = None,
        output_uri: str | None = None,
        output_formats: Sequence[str] = ("json", "csv"),
        sql_sink: SQLTableSink | None = None,
        ledger_conn_id: str = DPLedgerHook.default_conn_name,
        asset: Asset | None = None,
        diagnostics_uri: str | None = None,
        inline_rows_limit: int | None = INLINE_ROWS_LIMIT,
        lease_wait_timeout: dt.timedelta = LEASE_WAIT_TIMEOUT,
        rows_uri: str | None = None,
        privacy_unit_column: str | None = None,
        value_columns: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(lease_wait_timeout, dt.timedelta) or lease_wait_timeout <= dt.timedelta(0):
            raise ValueError(f"task {kwargs.get('task_id')!r}: lease_wait_timeout must be a positive timedelta, got "
                             f"{lease_wait_timeout!r}")
        self.spec_path = str(spec_path)
        # read, validated and planned from public parameters: a bad spec fails the DAG import, not the run
        self.release_spec, self.spec_sha256 = load_planned_spec(self.spec_path)
        if type(self).read_aggregates is DPReleaseOperator.read_aggregates and (
            [aggregates_task_id, aggregates_uri, rows_uri].count(None) != 2
        ):
            raise ValueError(
                f"task {kwargs.get('task_id')!r}: give exactly one of aggregates_task_id (the task returning the "
                "aggregates or a reference to them), aggregates_uri (files holding them) and rows_uri (a file of raw "
                "rows the operator bounds and aggregates itself)"
            )
        if rows_uri is not None:
            value_columns = check_raw_rows_arguments(self.release_spec, privacy_unit_column, value_columns,
                                                     kwargs.get("task_id"))
        elif privacy_unit_column is not None or value_columns:
            raise ValueError(f"task {kwargs.get('task_id')!r}: privacy_unit_column and value_columns describe raw "
                             "rows: give them with rows_uri (or DPSQLReleaseOperator's table=)")
        self.output_formats = check_formats(output_formats)
        check_inline_rows_limit(inline_rows_limit)
        # a templated output_uri counts as given (it is checked again once rendered, before the ledger)
        problem = rows_files_problem(self.release_spec, inline_rows_limit, output_uri, self.output_formats, sql_sink)
        if problem:
            raise ValueError(f"task {kwargs.get('task_id')!r}: {problem}")
        for name, location in (("output_uri", output_uri), ("diagnostics_uri", diagnostics_uri)):
            if location and "{{" not in location:  # a template is checked once rendered, in execute
                check_location(name, location)
        self.release_asset = asset or default_asset(self.release_spec.release)
        self.release_alias = RELEASE_ALIAS
        kwargs["outlets"] = release_outlets(kwargs.get("outlets"), self.release_asset)
        # the asset is also an inlet: the operator reads its earlier events (_announced); an inlet emits no event
        inlets = list(kwargs.get("inlets") or [])
        kwargs["inlets"] = inlets if self.release_asset in inlets else [*inlets, self.release_asset]
        super().__init__(**kwargs)
        self.aggregates_task_id = aggregates_task_id
        self.aggregates_uri = aggregates_uri
        self.rows_uri = rows_uri
        self.privacy_unit_column = privacy_unit_column
        self.value_columns = dict(value_columns or {})
        self.output_uri = output_uri
        self.sql_sink = sql_sink
        self.ledger_conn_id = ledger_conn_id
        self.diagnostics_uri = diagnostics_uri
        self.inline_rows_limit = inline_rows_limit
        self.lease_wait_timeout = lease_wait_timeout
        self.published: PublishedRelease | None = None
        #: the reference the upstream task returned, once read (lineage reports it as the input)
        self.aggregates_reference: str | Mapping[str, str] | None = None

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:
        """Airflow's ``.partial()``, declaring the outlets and inlet ``__init__`` declares (a mapped operator's come
        from ``partial``). With ``spec_path`` among the expanded arguments the asset is not known when the DAG is
        parsed: only :data:`RELEASE_ALIAS` is declared, and each instance announces through it."""
        spec_path = kwargs.get("spec_path")
        asset = kwargs.get("asset")
        if isinstance(spec_path, (str, Path)):
            spec = load_spec_with_hash(str(spec_path))[0]
            if asset is None:
                asset = default_asset(spec.release)
            # what the partial arguments already rule out is a DAG import error too (``__init__`` runs only when a
            # mapped instance does); arguments left to expand() are assumed to fit
            limit = check_inline_rows_limit(kwargs.get("inline_rows_limit", INLINE_ROWS_LIMIT))
            problem = rows_files_problem(
                spec, limit, kwargs.get("output_uri", "<expanded>"),
                check_formats(kwargs["output_formats"]) if "output_formats" in kwargs else ("json",),
                kwargs.get("sql_sink"),
            )
            if problem:
                raise ValueError(f"task {kwargs.get('task_id')!r}: {problem}")
        if "outlets" in kwargs or asset is None:
            kwargs["outlets"] = release_outlets(kwargs.get("outlets"), None)
        else:
            kwargs["outlets"] = release_outlets(None, asset)
        if asset is not None:
            inlets = list(kwargs.get("inlets") or [])
            kwargs["inlets"] = inlets if asset in inlets else [*inlets, asset]
        return super().partial(**kwargs)

    def execute(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        key = ReleaseKey(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            map_index=-1 if ti.map_index is None else ti.map_index,
            release_name=self.release_spec.release,
        )
        # the "DP release" link reads this key when the try ends, failed or not; pushed empty now (no link), so that
        # a refused try does not log Airflow's "XCom not found" error beside its refusal
        ti.xcom_push(key=RELEASE_LOCATION_XCOM_KEY, value="")
        self._check_sinks(key)  # before anything is spent: a release that cannot be published is never charged
        hook = DPLedgerHook(ledger_conn_id=self.ledger_conn_id)
        try:
            ledger = hook.get_ledger()
            series_key = hook.get_series_key() if self.release_spec.series is not None else None
        except (ValueError, LedgerError) as error:  # the connection is misconfigured: no retry fixes it
            raise AirflowFailException(str(error)) from None
        try:
            if self.release_spec.series is not None:  # one step of a series (dp_operators.continual.run)
                from dp_operators.continual.run import run_series_step

                _refuse_series_on_blocks(self.release_spec, ledger)

                result = run_series_step(
                    self.release_spec, lambda: self.read_aggregates(context), ledger, key, _step_run(context),
                    series_key=series_key, spec_hash=self.spec_sha256, try_number=getattr(ti, "try_number", None),
                    audit=_audit_context(context),
                    diagnostics=self._diagnostics_writer(key) if self.diagnostics_uri else None,
                )
            else:
                result = run_release(
                    self.release_spec,
                    lambda: self.read_aggregates(context),  # read only if the release is not a replay
                    ledger,
                    key,
                    spec_hash=self.spec_sha256,
                    try_number=getattr(ti, "try_number", None),
                    audit=_audit_context(context),
                    diagnostics=self._diagnostics_writer(key) if self.diagnostics_uri else None,
                    rows_store=self._rows_store(key),
                    inline_rows_limit=self.inline_rows_limit,
                    # public: the windows of an account with privacy blocks come from these, never from the data
                    data_interval=_data_interval(context),
                    partition_key=_partition_key(context),
                    bounding=self.contribution_bounding(),
                )
        except ReleaseAbortedError as error:
            # the original exception's text is not audited for data: it stays out of the task log
            raise AirflowFailException(str(error)) from None
        except LeaseHeldError as error:  # before _PERMANENT: a live try of the same release, not a refusal
            self._check_lease_wait(context, key, error)
            until = lease_wait_until(error, ledger.lease_seconds)
            self.log.warning("%s", lease_held_message(key, error, until))
            raise AirflowRescheduleException(until) from None
        except ApprovalRequiredError as error:  # before _PERMANENT: waits for an officer's decision, no try spent
            from dp_operators.release.run import block_windows

            windows = block_windows(self.release_spec, ledger, data_interval=_data_interval(context),
                                    partition_key=_partition_key(context))
            wait_for_approval(self, ledger, key, error, _audit_context(context), windows=windows)
        except _PERMANENT as error:
            # the messages are self-contained; the chain's frames hold the true aggregates in their locals, which
            # error reporters (Sentry) capture
            raise AirflowFailException(str(error)) from None
        except SQLAlchemyError as error:  # the ledger's database: retryable, and its text holds no data values
            raise AirflowException(f"the budget ledger failed: {type(error).__name__}: {error}") from None
        except AirflowException:
            raise
        except Exception as error:  # anything else: retryable, its text and frames withheld (they may hold data)
            raise AirflowException(
                f"the release failed with {type(error).__name__} before any budget was reserved (a retry is safe); "
                "details are withheld from the log because the engine's frames hold the true aggregates"
            ) from None
        output = result.output
        if result.replayed:
            self.log.info("release %s already committed for this task instance: replaying it, nothing charged", key)
        if self.release_spec.series is not None:  # a step's files are its own, whichever run released or replays it
            key = ReleaseKey(**output["release_key"])
            if self.output_uri:
                try:
                    check_publishable(self.output_uri, key)  # the step's folder, known only now (no link in it)
                except ValueError as error:
                    raise AirflowFailException(f"release {key.release_name!r} is committed in the ledger but cannot "
                                               f"be published: {error}") from None
        self.published = self._publish(output, key, result.replayed, ti)
        announce(self, context, output, emit=not result.replayed or not announced_before(self, context, key, output))
        return output

    def _check_lease_wait(self, context: Context, key: ReleaseKey, error: LeaseHeldError) -> None:
        """Fail (no retry) once this task has waited ``lease_wait_timeout`` for leases, counted from its first
        reschedule (Airflow's ``get_first_reschedule_date``, as a sensor's timeout is)."""
        first = getattr(context["ti"], "get_first_reschedule_date", lambda _: None)(context)
        if first is None:
            return
        waited = dt.datetime.now(dt.timezone.utc) - first
        if waited > self.lease_wait_timeout:
            raise AirflowFailException(
                f"release {key.release_name!r} (run {key.run_id!r}) has waited since "
                f"{first.isoformat(timespec='seconds')} for ledger attempt {error.attempt}'s lease, which is still "
                f"renewed: longer than lease_wait_timeout ({self.lease_wait_timeout}). That attempt is hung (kill its "
                "task process: its lease then runs out) or does not belong to this task; nothing was charged for "
                "this try. Clear the task once the holder is gone"
            )

    def _check_sinks(self, key: ReleaseKey) -> None:
        """Refuse, before the ledger is called, what would make publishing fail after the commit: a file name too
        long or a link under ``output_uri`` / ``diagnostics_uri``; create the SQL sink's table if needed.

        Raises:
            AirflowFailException: a location that cannot hold this release's files (no retry fixes it).
        """
        if key.run_id.startswith(TEMPORARY_RUN_PREFIX):
            raise AirflowFailException(
                f"run {key.run_id!r} is the temporary run `airflow tasks test` makes when the run id it is given does "
                "not exist; a release is made only for a real DAG run (a replay needs the run id of the run that "
                "released: `airflow dags list-runs <dag_id>`). Nothing was charged"
            )
        if key.run_id in (".", ".."):
            raise AirflowFailException(
                f"run id {key.run_id!r} cannot be released: Airflow's API cannot address this run's XComs, so the task "
                "would fail after its charge; trigger the run with another run id. Nothing was charged"
            )
        try:
            for name, base in (("output_uri", self.output_uri), ("diagnostics_uri", self.diagnostics_uri)):
                if base:
                    check_location(name, base)
                    check_publishable(base, key)
            if self.output_uri and self.diagnostics_uri and _inside(self.diagnostics_uri, self.output_uri):
                raise ValueError(
                    f"diagnostics_uri {self.diagnostics_uri!r} lies in output_uri {self.output_uri!r}: the report "
                    "holds exact, data-derived numbers and must never sit beside published files; point it elsewhere"
                )
        except ValueError as error:
            raise AirflowFailException(f"release {key.release_name!r} cannot be published: {error}") from None
        filed = filed_aggregates(self.release_spec, self.inline_rows_limit)
        problem = rows_files_problem(self.release_spec, self.inline_rows_limit, self.output_uri,
                                     self.output_formats, self.sql_sink)
        if problem:
            raise AirflowFailException(f"release {key.release_name!r} cannot be published: {problem}. Nothing was "
                                       "charged.")
        if filed:
            self._prepare_rows_folder(key)
        if self.sql_sink is not None:
            try:
                self.sql_sink.prepare()
            except SQLAlchemyError as error:
                raise AirflowException(
                    f"the SQL sink's database failed before anything was reserved (a retry is safe): "
                    f"{type(error).__name__}"
                ) from None

    def _prepare_rows_folder(self, key: ReleaseKey) -> None:
        """Create the rows folder before the ledger is called, refusing a link or a file planted in its place:
        rows files are written after the noise is drawn, where a failure keeps the charge spent.

        Raises:
            AirflowFailException: something other than a folder is at its place (no retry fixes it).
        """
        store = self._rows_store(key)
        assert store is not None
        folder = store.folder
        from fsspec.implementations.local import LocalFileSystem

        if isinstance(folder.fs, LocalFileSystem):
            local = Path(folder.path)
            if local.is_symlink() or (local.exists() and not local.is_dir()):
                raise AirflowFailException(
                    f"release {key.release_name!r} cannot be published: {local} is not a folder (a link or a file "
                    "sits where its rows files go); remove it. Nothing was charged"
                )
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise AirflowException(
                f"release {key.release_name!r}: its rows folder {folder} cannot be created ({type(error).__name__}); "
                "nothing was charged, a retry is safe"
            ) from None

    def _rows_store(self, key: ReleaseKey) -> ObjectStorageRowsStore | None:
        """Where rows files go: ``<output_uri>/<release>/<dag_id>/<run_id>/<stem>~rows/`` (``None`` without an
        ``output_uri``)."""
        if not self.output_uri:
            return None
        return ObjectStorageRowsStore(release_folder(self.output_uri, key) / f"{release_stem(key)}{ROWS_SUFFIX}")

    def contribution_bounding(self) -> dict[str, dict[str, Any]]:
        """How each aggregate's contribution bounds hold, as the ledger records it
        (:func:`~dp_operators.release.run.run_release`'s ``bounding``): ``enforced`` for a ``rows_uri`` release
        (the operator bounds the rows itself), else ``declared`` by the author of the aggregates. Public: decided
        from the operator's arguments, before anything is read. A subclass reading its own source overrides it."""
        if self.rows_uri is not None:
            return {aggregate.name: enforced_bounding("file", self.privacy_unit_column, None, uri=str(self.rows_uri),
                                                      contribution=self.release_spec.contribution_for(aggregate))
                    for aggregate in self.release_spec.aggregates}
        source = "file" if self.aggregates_uri is not None else "upstream"
        return {aggregate.name: declared_bounding(source) for aggregate in self.release_spec.aggregates}

    def read_aggregates(self, context: Context) -> Any:
        """The true aggregates: the upstream task's return value (of this map index), or the files it or
        ``aggregates_uri`` references, or those the operator computes from the raw rows of ``rows_uri``, bounding
        each privacy unit's contribution (:func:`~dp_operators.operators.raw_rows.bounded_file_aggregates`).
        Override to read them elsewhere (the result is checked by the engine).

        Raises:
            AirflowFailException: no value, an upstream mapped differently, or an unreadable reference.
        """
        if self.rows_uri is not None:
            return bounded_file_aggregates(self.rows_uri, self.release_spec, self.privacy_unit_column,
                                           self.value_columns)
        if self.aggregates_uri is not None:
            return read_reference(self.aggregates_uri, self.release_spec)
        assert self.aggregates_task_id is not None
        pulled = pull_return_value(self, context, self.aggregates_task_id)
        if pulled is None:
            ti = context["ti"]
            raise AirflowFailException(describe_missing(
                self.aggregates_task_id,
                -1 if ti.map_index is None else ti.map_index,
                [aggregate.name for aggregate in self.release_spec.aggregates],
            ))
        if is_reference(pulled):
            self.aggregates_reference = pulled  # what was read, for lineage (a URI: no data)
            return read_reference(pulled, self.release_spec)
        return pulled

    def _publish(self, output: dict[str, Any], key: ReleaseKey, replayed: bool, ti: Any) -> PublishedRelease:
        """Write the committed ``output`` to every sink; the same bytes on a replay. A sink failing here is
        retryable: the retry replays the committed output (nothing charged) and rewrites it."""
        locations: dict[str, str] = {}
        try:
            if self.output_uri:
                written = write_files(output, release_folder(self.output_uri, key), release_stem(key),
                                      self.output_formats, rows_store=self._rows_store(key))
                locations = {fmt: published_uri(path) for fmt, path in written.items()}
            if self.sql_sink is not None:
                self.sql_sink.write(output)
        except AirflowFailException:  # a sink's own refusal (e.g. the connection is not SQL): no retry fixes it
            raise
        except (NotInlineError, RowsFileError, ColumnRangeError) as error:
            # e.g. csv asked of a committed release with rows files, or a noised value past its column's range (a
            # tail of probability below 2^-127 per value): every replay would meet it again
            raise AirflowFailException(
                f"release {key.release_name!r} is committed in the ledger but cannot be published as asked: {error}"
            ) from None
        except Exception as error:
            raise AirflowException(
                f"release {key.release_name!r} is committed in the ledger but publishing it failed "
                f"({type(error).__name__}: {error}); a retry replays the committed release and writes it again, "
                "charging nothing"
            ) from None
        for fmt, location in locations.items():
            self.log.info("published release %r (%s) to %s", output["release"], fmt, location)
        if self.sql_sink is not None:
            self.log.info("published release %r to SQL table %s", output["release"], self.sql_sink.table)
        if "json" in locations:
            ti.xcom_push(key=RELEASE_LOCATION_XCOM_KEY, value=locations["json"])
        return PublishedRelease(
            output=output, replayed=replayed, locations=locations,
            sql_table=None if self.sql_sink is None else self.sql_sink.table,
        )

    def _diagnostics_writer(self, key: ReleaseKey) -> Callable[[DiagnosticsReport], None]:
        """The callback writing the report to ``<diagnostics_uri>/<release>/<dag_id>/<run_id>/<stem>~diagnostics.json``;
        only its location is logged, never a number from it."""

        def write(report: DiagnosticsReport) -> None:
            path = diagnostics_file(self.diagnostics_uri, key)  # type: ignore[arg-type]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report.as_dict(), indent=2, sort_keys=True) + "\n")
            self.log.info("wrote the diagnostics report (exact, data-derived; not for publication) to %s", path)

        return write


#: The run ids ``airflow tasks test`` invents for a run id that does not exist (``task_command._get_ti``).
TEMPORARY_RUN_PREFIX = "__airflow_temporary_run_"


def rows_files_problem(spec: Any, limit: int | None, output_uri: str | None, formats: Sequence[str],
                       sql_sink: Any) -> str | None:
    """What keeps ``spec``'s large aggregates, or its values in Parquet, from being published with these arguments
    (public parameters only; checked when the DAG is parsed and again before the ledger is called), or None."""
    refusal = too_large_inline(spec, limit)
    if refusal:
        return refusal
    filed = filed_aggregates(spec, limit)
    # a Parquet file (the parquet format, or rows files) holds each value exactly: a sum's grid needs a decimal form
    parquet = [a.name for a in spec.aggregates] if "parquet" in formats else filed
    problem = filed_value_problem(spec, parquet) if parquet else None
    if problem:
        return f"its Parquet {'file' if 'parquet' in formats else 'rows files'} cannot hold every value exactly: " \
               f"{problem}"
    if not filed:
        return None
    why = f"aggregate(s) {filed} release more than inline_rows_limit={limit} cells, so their rows go to Parquet " \
          "rows files under output_uri (the ledger keeps their SHA-256)"
    if not output_uri:
        return f"{why}, and the operator has no output_uri: give one, or raise inline_rows_limit"
    if "csv" in formats:
        return f"{why}, and output_formats asks for csv, which takes inline rows only: use json and parquet"
    if sql_sink is not None:
        return f"{why}, and the SQL sink takes inline rows only: drop sql_sink, or raise inline_rows_limit"
    return None


def check_location(name: str, uri: str) -> None:
    """Refuse a location that is neither a URI with a scheme (``file://``, ``s3://``...) nor an absolute path: a
    relative path would be written relative to whichever directory the worker runs in. ``file://releases`` (two
    slashes) is one too: ``releases`` is the URI's host, and fsspec writes the files under the worker's directory.

    Raises:
        ValueError: naming the argument and how to fix it.
    """
    if "://" not in uri and not uri.startswith("/"):
        raise ValueError(
            f"{name} {uri!r} is a relative path; give a URI (file:///srv/releases, s3://bucket/releases) or an "
            "absolute path"
        )
    scheme, _, rest = uri.partition("://")
    host = rest.partition("/")[0]
    if scheme.lower() in ("file", "local") and host not in ("", "localhost"):
        raise ValueError(
            f"{name} {uri!r} names {host!r} as a host, and the files would land under whichever directory the "
            f"worker runs in: a local folder takes three slashes, {scheme}:///{rest} for an absolute path"
        )


def _inside(inner: str, outer: str) -> bool:
    """Whether the location ``inner`` is ``outer`` or below it (both ``ObjectStoragePath`` URIs)."""
    inner_text = str(ObjectStoragePath(inner)).rstrip("/")
    outer_text = str(ObjectStoragePath(outer)).rstrip("/")
    return inner_text == outer_text or inner_text.startswith(outer_text + "/")


def _step_run(context: Context) -> Any:
    """The series step's run: Airflow's run id and data interval (public, never the data)."""
    from dp_operators.continual.run import StepRun

    ti, dag_run = context["ti"], context.get("dag_run")
    start = context.get("data_interval_start") or getattr(dag_run, "data_interval_start", None)
    end = context.get("data_interval_end") or getattr(dag_run, "data_interval_end", None)
    if start is None or end is None:
        raise ReleaseConfigError(
            f"run {ti.run_id!r} has no data interval: a series step is the run's data interval (give the DAG a "
            "schedule; a manual run of a scheduled DAG gets one from its logical date)")
    return StepRun(ti.run_id, start, end)


def _data_interval(context: Context) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The run's data interval ``(start, end)`` (timezone-aware; ``None`` where the run has none): what a release on
    an account with privacy blocks is charged for (:func:`~dp_operators.release.run.block_windows`)."""
    dag_run = context.get("dag_run")
    start = context.get("data_interval_start") or getattr(dag_run, "data_interval_start", None)
    end = context.get("data_interval_end") or getattr(dag_run, "data_interval_end", None)
    return start, end


def _partition_key(context: Context) -> str | None:
    """The run's partition key (Airflow's ``partition_key`` of a partitioned asset-triggered run), or ``None``: the
    one window of an account with ``partition`` blocks."""
    key = context.get("partition_key")
    if key is None:
        key = getattr(context.get("dag_run"), "partition_key", None)
    return key if isinstance(key, str) else None


def _refuse_series_on_blocks(spec: Any, ledger: Any) -> None:
    """A series is charged once for all its steps, which privacy blocks (a charge per window of data) cannot hold
    yet: refuse it before anything is charged.

    Raises:
        ReleaseConfigError: the series' budget account has privacy blocks.
    """
    kind, granularity = ledger.structure(spec.budget_account)
    if kind == "blocks":
        raise ReleaseConfigError(
            f"series {spec.release!r}: its budget account {spec.budget_account!r} has privacy blocks ({granularity} "
            "windows), and a series on privacy blocks is not supported yet (a series is charged once for all its "
            "steps, a block per window of data). Name an account without blocks in the spec's budget_account, or "
            "release each window as an ordinary release (no 'series'). Nothing was charged"
        )


def _audit_context(context: Context) -> dict[str, Any]:
    """Who/what triggered this run, for the ledger's audit events (host, OS user, pid, version are added there)."""
    dag_run = context.get("dag_run")
    run_type = getattr(dag_run, "run_type", None)
    audit = {
        "run_type": getattr(run_type, "value", run_type),
        "triggering_user": getattr(dag_run, "triggering_user_name", None),
    }
    return {name: str(value) for name, value in audit.items() if value is not None}


__all__ = [
    "LEASE_WAIT_MARGIN", "LEASE_WAIT_MIN", "LEASE_WAIT_TIMEOUT", "RELEASE_ALIAS", "DPReleaseOperator",
    "PublishedRelease", "default_asset",
    "lease_held_message", "lease_wait_until", "release_csv",
]
