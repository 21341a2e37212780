"""``DPReleaseOperator``: noise upstream aggregates as a release spec says, charge the ledger, publish.

The operator is thin (STYLE.md): it resolves inputs, calls :func:`dp_operators.release.run_release`, and
publishes. No DP arithmetic happens here.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator, ObjectStoragePath
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from sqlalchemy.exc import SQLAlchemyError

from dp_operators.accounting import IncompatibleAccountantError
from dp_operators.hooks.ledger import DPLedgerHook
from dp_operators.ledger import LeaseHeldError, LedgerError, ReleaseKey
from dp_operators.release import (
    DiagnosticsReport,
    ReleaseAbortedError,
    ReleaseConfigError,
    ReleaseInputError,
    plan_release,
    run_release,
)
from dp_operators.release.publish import published_interval
from dp_operators.spec import SpecError, load_spec_with_hash

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Refusals no retry can fix: Airflow must fail the task at once (DESIGN.md 7). Every ledger refusal is one
#: (budget exhausted, DAG not allowed, unknown account, no schema, wrong spend key: configuration), except
#: :class:`LeaseHeldError`, which is caught first: another try of the same release still holds its lease, and a
#: later retry replays that try's output or takes over once the lease has expired.
_PERMANENT = (LedgerError, ReleaseInputError, ReleaseConfigError, IncompatibleAccountantError)


class DPReleaseOperator(BaseOperator):
    """Release differentially private aggregates computed by an upstream task.

    The spec file is read and validated when the DAG is parsed, so a bad spec fails at DAG import with the file,
    the field path and the reason. The upstream aggregates are pulled from XCom inside :meth:`execute`, never
    through a templated field: Airflow stores rendered fields in its database and shows them in the UI.

    Args:
        spec_path: path of the release spec YAML (absolute, or relative to the working directory).
        aggregates_task_id: the upstream task whose return value holds the true aggregates (shape: see
            :func:`dp_operators.release.prepare_inputs`).
        output_uri: folder (any ``ObjectStoragePath`` URI, e.g. ``file:///srv/releases`` or ``s3://bucket/dp``)
            where ``<release>/<run_id>/<task_id>.json`` and ``.csv`` are written. (templated)
        ledger_conn_id: Airflow connection of the budget ledger (see :class:`DPLedgerHook`).
        asset: the asset whose event announces the release; default ``dp-release://<account>/<release>``.
        diagnostics_uri: opt-in data-quality report: a folder (``ObjectStoragePath`` URI) where
            ``<release>/<run_id>/<task_id>.diagnostics.json`` is written before any budget is reserved, whether or
            not the release is then refused (:class:`~dp_operators.release.DiagnosticsReport`: rows outside the
            public key domain with examples, NaN/None handled, values clamped, row index of a malformed row...).
            It holds exact, data-derived numbers: point it next to the true aggregates, readable only by the people
            who may see them. Default None: no report (the task log never holds such numbers). (templated)

    Returns (XCom ``return_value``): the published release, plain JSON; identical, byte for byte, on every retry.

    Raises:
        AirflowFailException: budget exhausted, DAG not allowed, unknown account, ledger not initialised, a
            missing or rotated spend key, malformed upstream aggregates: refusals that retrying cannot fix; and any
            failure after the budget was reserved (:class:`~dp_operators.release.ReleaseAbortedError`), which a
            retry would repeat while charging again.
        AirflowException: retryable. Another try of this release is still running and holds the ledger's lease
            on its reservation (Airflow can start try 2 while try 1 still runs): nothing was charged, and a retry
            replays that try's committed output, or takes the release over once the lease has expired (that try
            died; its charge stays spent). Also the ledger's database failing, and unexpected errors before any
            reservation (their text withheld).
    """

    template_fields: Sequence[str] = ("output_uri", "diagnostics_uri")
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        spec_path: str | Path,
        aggregates_task_id: str,
        output_uri: str,
        ledger_conn_id: str = DPLedgerHook.default_conn_name,
        asset: Asset | None = None,
        diagnostics_uri: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.spec_path = str(spec_path)
        self.release_spec, self.spec_sha256 = load_spec_with_hash(self.spec_path)
        try:  # public checks of the plan (float grid, saturation, noise range) fail the DAG import, not the run
            plan_release(self.release_spec)
        except ReleaseConfigError as error:
            raise SpecError(f"{self.spec_path}: the spec cannot be planned: {error}") from None
        self.release_asset = asset or Asset(
            name=self.release_spec.release,
            uri=f"dp-release://{self.release_spec.budget_account}/{self.release_spec.release}",
        )
        kwargs.setdefault("outlets", [self.release_asset])
        super().__init__(**kwargs)
        self.aggregates_task_id = aggregates_task_id
        self.output_uri = output_uri
        self.ledger_conn_id = ledger_conn_id
        self.diagnostics_uri = diagnostics_uri

    def execute(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        key = ReleaseKey(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            map_index=-1 if ti.map_index is None else ti.map_index,
            release_name=self.release_spec.release,
        )
        ledger = DPLedgerHook(ledger_conn_id=self.ledger_conn_id).get_ledger()
        try:
            result = run_release(
                self.release_spec,
                lambda: self._pull_aggregates(ti),  # pulled only if the release is not a replay
                ledger,
                key,
                spec_hash=self.spec_sha256,
                try_number=getattr(ti, "try_number", None),
                audit=_audit_context(context),
                diagnostics=self._diagnostics_writer(key) if self.diagnostics_uri else None,
            )
        except ReleaseAbortedError as error:
            # the original exception's text is not audited for data: it stays out of the task log
            raise AirflowFailException(str(error)) from None
        except LeaseHeldError as error:  # before _PERMANENT: a live try of the same release, not a refusal
            raise AirflowException(lease_held_message(key, error)) from None
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
        location = self._write_files(output, key)
        self.log.info("published release %r to %s", output["release"], location)
        context["outlet_events"][self.release_asset].extra = {
            "release": output["release"],
            "budget_account": output["budget_account"],
            "charge": output["charge"],
            "location": str(location),
        }
        return output

    def _pull_aggregates(self, ti: Any) -> Any:
        """The upstream aggregates: the upstream task's return value, or, when it returned a string, the JSON file
        at that ``ObjectStoragePath`` URI (pass by reference keeps raw values out of Airflow's XCom table)."""
        pulled = ti.xcom_pull(task_ids=self.aggregates_task_id, key="return_value")
        if pulled is None:
            raise AirflowFailException(
                f"task {self.aggregates_task_id!r} returned no aggregates; it must return a mapping with one entry "
                f"per aggregate of {self.spec_path}, or the URI of a JSON file holding one"
            )
        if not isinstance(pulled, str):
            return pulled
        try:
            return json.loads(ObjectStoragePath(pulled).read_text())
        except (OSError, ValueError) as error:
            raise AirflowFailException(
                f"task {self.aggregates_task_id!r} returned the reference {pulled!r}, which is not a readable JSON "
                f"file: {type(error).__name__}"
            ) from None

    def _write_files(self, output: dict[str, Any], key: ReleaseKey) -> ObjectStoragePath:
        """Write ``<release>/<run_id>/<task_id>[_<map_index>].json`` and ``.csv``; returns the JSON's path."""
        json_path = _release_path(self.output_uri, key, ".json")
        json_path.write_text(json.dumps(output, indent=2, sort_keys=True) + "\n")
        _release_path(self.output_uri, key, ".csv").write_text(release_csv(output))
        return json_path

    def _diagnostics_writer(self, key: ReleaseKey) -> Callable[[DiagnosticsReport], None]:
        """The callback writing the report to ``<diagnostics_uri>/<release>/<run_id>/<stem>.diagnostics.json``
        (the release files' relative path); only its location is logged, never a number from it."""

        def write(report: DiagnosticsReport) -> None:
            path = _release_path(self.diagnostics_uri, key, ".diagnostics.json")  # type: ignore[arg-type]
            path.write_text(json.dumps(report.as_dict(), indent=2, sort_keys=True) + "\n")
            self.log.info("wrote the diagnostics report (exact, data-derived; not for publication) to %s", path)

        return write


def _release_path(base_uri: str, key: ReleaseKey, suffix: str) -> ObjectStoragePath:
    """``<base_uri>/<release>/<run_id>/<task_id>[_<map_index>]<suffix>``, its folder created."""
    folder = ObjectStoragePath(base_uri) / key.release_name / _safe(key.run_id)
    folder.mkdir(parents=True, exist_ok=True)
    stem = key.task_id if key.map_index < 0 else f"{key.task_id}_{key.map_index}"
    return folder / f"{stem}{suffix}"


def lease_held_message(key: ReleaseKey, error: LeaseHeldError) -> str:
    """The retryable task error for :class:`LeaseHeldError`: which try holds the lease, until when (UTC), and what
    Airflow's retry will do. Public parameters only."""
    until = error.expires_at.isoformat(timespec="seconds") if error.expires_at is not None else "it expires"
    return (
        f"another try of release {key.release_name!r} (run {key.run_id!r}, ledger attempt {error.attempt}) is still "
        f"running and holds the budget lease until {until}; nothing was charged. Airflow's retry will replay its "
        "committed output, or take the release over after the lease expires if that try died (its charge stays "
        "spent)"
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


def release_csv(output: dict[str, Any]) -> str:
    """The released values as CSV: ``aggregate, kind, key, value, half_width, confidence, mechanism, saturated,
    lower, upper``.

    ``key`` is ``column=value`` pairs joined by ``;`` (empty for ungrouped aggregates). ``lower`` and ``upper`` are
    the interval's ends (``value -+ half_width``, rounded outwards); a saturated value (``saturated`` true) has an
    empty ``half_width`` and an empty end on its unbounded side (docs/mechanisms.md, "Saturation").
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        ["aggregate", "kind", "key", "value", "half_width", "confidence", "mechanism", "saturated", "lower", "upper"]
    )
    for name, aggregate in output["aggregates"].items():
        rows = aggregate.get("rows") or [aggregate]
        for row in rows:
            key = ";".join(f"{column}={row[column]}" for column in aggregate["group_by"])
            lower, upper = published_interval(row)
            writer.writerow(
                [name, aggregate["kind"], key, row["value"], "" if row["half_width"] is None else row["half_width"],
                 output["confidence"], aggregate["mechanism"], str(bool(row.get("saturated"))).lower(),
                 "" if lower is None else lower, "" if upper is None else upper]
            )
    return buffer.getvalue()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)
