"""Anonymity operators: gate a microdata table (``AnonymityCheckOperator``) or anonymise and publish it
(``AnonymiseOperator``).

Thin shells: they resolve the table (a CSV/Parquet file through ``ObjectStoragePath``, or a SQL query through the
connection's ``common.sql`` hook: :func:`~dp_operators.operators.microdata_files.read_table`), call the pure
functions of :mod:`dp_operators.anonymity` (:func:`~dp_operators.anonymity.check.check_table`,
:func:`~dp_operators.anonymity.anonymise.anonymise`), and publish: the report (counts only, never a row or a
quasi-identifier value) as XCom, as the outlet asset events' ``extra`` and optionally as a JSON file; the anonymised
table as a CSV or Parquet file. A report that fails its targets is written and pushed (XCom key
``anonymity_report``) *before* the task fails, so a failed gate can be diagnosed. A source that cannot be read
(missing, unreadable, not CSV/Parquet) fails the same way, with a report saying why. Reading, writing (whole or not
at all) and the location guards live in :mod:`dp_operators.operators.microdata_files`; the operators call it
through the module, so a test patches the names there.

These operators decide by the data, by design: whether a table meets k-anonymity, l-diversity or a risk target is a
function of its rows, and so are the counts in the report and the log line. That is not a differentially private
release (DESIGN.md 2.4 governs :class:`~dp_operators.operators.release.DPReleaseOperator` only): they neither read
nor charge a budget ledger, and no DP release's refusal passes through them. Do not put a gate that can fail
(``on_failure: fail``) upstream of a DP release of the same data: the release would then run or not depending on
whether the data pass the gate, a one-bit disclosure outside the ledger's accounting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator, ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException

from dp_operators.anonymity.errors import AnonymityError, AnonymityInputError
from dp_operators.anonymity.spec import AnonymitySpec, load_anonymity_spec
from dp_operators.operators import microdata_files
from dp_operators.operators.microdata_files import read_table, write_report, write_table  # re-exported

if TYPE_CHECKING:
    import pandas as pd
    from airflow.sdk import Context

__all__ = [
    "REPORT_XCOM_KEY", "AnonymiseOperator", "AnonymityCheckOperator", "failure_summary", "read_table", "write_report",
    "write_table",
]

#: XCom key of the report of a check or an anonymisation that missed its targets (or could not run).
REPORT_XCOM_KEY = "anonymity_report"


class _MicrodataOperator(BaseOperator):
    """What both operators share: the source table (a file or a query; ``ValueError`` naming the task for bad source
    arguments or ``csv_separator``), the optional report file, and the anonymity spec (:meth:`_load_spec`, which each
    operator calls at its own point of construction)."""

    def __init__(
        self,
        *,
        source: str | ObjectStoragePath | None,
        source_format: str | None,
        csv_separator: str,
        sql: str | None,
        conn_id: str | None,
        report_path: str | ObjectStoragePath | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (source is None) == (sql is None):
            raise ValueError(f"{self.task_id}: give exactly one of source= (a file) or sql= (a query)")
        if sql is not None and not conn_id:
            raise ValueError(f"{self.task_id}: sql= needs conn_id=")
        if source_format is not None and source_format not in ("csv", "parquet"):
            raise ValueError(f"{self.task_id}: source_format must be 'csv' or 'parquet', got {source_format!r}")
        microdata_files.check_csv_separator(self.task_id, csv_separator)
        self.source = source
        self.source_format = source_format
        self.csv_separator = csv_separator
        self.sql = sql
        self.conn_id = conn_id
        self.report_path = report_path

    def _load_spec(self, spec: str | Path | AnonymitySpec) -> None:
        """Load and validate the spec (``AnonymitySpecError`` when invalid), unless it is already an
        ``AnonymitySpec``."""
        self.anonymity_spec = spec if isinstance(spec, AnonymitySpec) else load_anonymity_spec(spec)
        self.spec_path = None if isinstance(spec, AnonymitySpec) else str(spec)

    def _read_table(self) -> pd.DataFrame:
        return microdata_files.read_table(self.source, self.source_format, self.sql, self.conn_id, self.csv_separator)


class AnonymityCheckOperator(_MicrodataOperator):
    """Check a microdata table against an anonymity spec; fail the task or warn as the spec says.

    The spec (``docs/anonymity.md``) is loaded and validated when the operator is built, so a bad spec fails the
    DAG import with ``<file>: <field.path>: <reason>``.

    :param spec: path of the YAML anonymity spec, or an already-validated ``AnonymitySpec``.
    :param source: file to check: a path or URL understood by ``ObjectStoragePath`` (``file://``, ``s3://`` ...),
        CSV or Parquet. (templated)
    :param source_format: ``"csv"`` or ``"parquet"``; by default taken from the file suffix.
    :param csv_separator: the field separator of a CSV source, one character (default ``","``; ``";"`` for a file
        ARX wrote). Checked at construction, hence not templated.
    :param sql: query returning the table to check, instead of ``source``. (templated)
    :param conn_id: connection whose ``common.sql`` hook runs ``sql``. (templated)
    :param report_path: where to write the report as JSON (a path or ``ObjectStoragePath`` URL), on success and on
        failure (before the task fails). (templated)

    Returns (XCom ``return_value``) the JSON report of :func:`~dp_operators.anonymity.check_table`: counts, class
    sizes, measures, risk and targets, never row contents. Every ``Asset`` in ``outlets`` gets the same report as
    its event's ``extra``. When a target is missed (or the table cannot be checked) the report is also pushed under
    the XCom key ``anonymity_report`` and written to ``report_path`` before the task fails or warns.

    Raises:
        AnonymitySpecError: at construction, the spec is invalid.
        AirflowFailException: the table fails a target and the spec says ``on_failure: fail`` (the message lists
            every failed target), or the table cannot be read (missing or unreadable file, not CSV/Parquet) or
            checked (unknown column, empty table, missing QI value, k larger than the table), or the report cannot
            be written for a reason a retry cannot cure (``report_path`` is a folder or a bad URL, no permission)
            or is the source itself (also refused at construction when both are plain paths): retrying would not
            change the outcome. Other storage errors propagate, so Airflow retries them.
    """

    template_fields: Sequence[str] = ("source", "sql", "conn_id", "report_path")
    ui_color = "#e8f0e0"

    def __init__(
        self,
        *,
        spec: str | Path | AnonymitySpec,
        source: str | ObjectStoragePath | None = None,
        source_format: str | None = None,
        csv_separator: str = ",",
        sql: str | None = None,
        conn_id: str | None = None,
        report_path: str | ObjectStoragePath | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            source=source, source_format=source_format, csv_separator=csv_separator, sql=sql,
            conn_id=conn_id, report_path=report_path, **kwargs,
        )
        self._load_spec(spec)
        microdata_files.refuse_same_static_locations(self.task_id, {"source": source, "report_path": report_path})

    def execute(self, context: Context) -> dict[str, Any]:
        from dp_operators.anonymity.check import check_table

        microdata_files.refuse_same_rendered_locations(
            self.task_id, {"source": self.source, "report_path": self.report_path or None}
        )
        try:
            table = self._read_table()
            report = check_table(table, self.anonymity_spec)
        except AnonymityError as exc:
            _refuse_input(context, self.anonymity_spec, self.report_path, "anonymity check", exc)

        if self.report_path:
            microdata_files.write_report_or_fail(self.report_path, report, "anonymity check")
        if not report["passed"]:
            _missed_targets(context, self, report, "anonymity check")
        else:
            self.log.info("anonymity check %r passed on %d rows", report["check"], report["rows"])
        _set_outlet_extra(context, self.outlets, report)
        return report


class AnonymiseOperator(_MicrodataOperator):
    """Anonymise a microdata table as its spec says and publish it, with its report, only when the targets are met.

    Calls :func:`dp_operators.anonymity.anonymise.anonymise` (full-domain generalisation with an optimal lattice
    search, or Mondrian, per the spec's ``anonymisation`` section), then writes the anonymised table to
    ``output_path`` (the quasi-identifiers as their generalised labels, suppressed rows left out, every other column
    unchanged).

    :param spec: path of the YAML anonymity spec (hierarchy files are read relative to its folder), or an
        already-validated ``AnonymitySpec``. Validated at construction.
    :param source: the table, a CSV or Parquet file (path or ``ObjectStoragePath`` URL). (templated)
    :param source_format: ``"csv"`` or ``"parquet"``; by default taken from the source's suffix.
    :param csv_separator: the field separator of a CSV source, one character (default ``","``; ``";"`` for a file
        ARX wrote). Checked at construction, hence not templated.
    :param sql: query returning the table, instead of ``source``. (templated)
    :param conn_id: connection whose ``common.sql`` hook runs ``sql``. (templated)
    :param output_path: where the anonymised table goes (path or ``ObjectStoragePath`` URL). (templated) (Not
        ``output``: that name is ``BaseOperator``'s XCom reference.)
    :param output_format: ``"csv"`` or ``"parquet"``; by default taken from ``output_path``'s suffix (``.csv``,
        ``.parquet``, ``.pq``).
    :param report_path: where to write the report as JSON, on success and on failure (before the task fails).
        (templated)
    :param columns: the columns to publish, in order; the table is cut to them before it is anonymised. They must
        include every quasi-identifier and sensitive attribute. ``None`` publishes every column of the source:
        columns that are neither (an identifier, a weight, a code that mirrors a QI) are published unchanged, so
        name the columns unless the source holds nothing else; the task log lists such columns.

    Returns (XCom ``return_value``) the report of :func:`~dp_operators.anonymity.anonymise.anonymise`: the gate's
    measures, risk and targets of the released table plus the search (algorithm, metric, chosen lattice node,
    information loss, nodes checked); counts only. Every ``Asset`` in ``outlets`` gets it as its event's ``extra``.

    The report is written before the table, and the table only once its report is written: a task that fails never
    leaves a table without its report. A retry rewrites both (the anonymisation is deterministic), so a retry after a
    storage fault between the two converges to a consistent pair. ``output_path`` and ``report_path`` must differ
    from each other and from ``source``: the same location is refused at construction when the paths are known then,
    and again at run time once templates are rendered (the raw microdata are never overwritten).

    When the targets cannot be met, nothing is written to ``output_path``; the report (with the failed targets,
    measured at full generalisation) is pushed under the XCom key ``anonymity_report`` and written to
    ``report_path``; then the task fails (``on_failure: fail``) or logs a warning and succeeds (``on_failure: warn``;
    the asset events' ``extra`` then says ``passed: false``).

    Raises:
        AnonymitySpecError: at construction, the spec (or a hierarchy file it names) is invalid.
        ValueError: at construction, bad source arguments, an output whose format is neither given nor told by
            its suffix, or ``output_path`` / ``report_path`` naming the source's file or each other's.
        AirflowFailException: the targets are missed under ``on_failure: fail``, or the table cannot be
            read (missing or unreadable file, not CSV/Parquet) or anonymised as declared (unknown column, a column
            of ``columns`` absent, missing value, a value outside its hierarchy), or the rendered ``output_path`` /
            ``report_path`` is the source or each other, or the report or table cannot be written for a reason a
            retry cannot cure (a folder, a path through a file or a symbolic link, a bad URL, no permission, no
            such bucket). Other storage errors (a network fault) propagate so that Airflow retries the task.
    """

    template_fields: Sequence[str] = ("source", "sql", "conn_id", "output_path", "report_path")
    ui_color = "#dfeae8"

    def __init__(
        self,
        *,
        spec: str | Path | AnonymitySpec,
        output_path: str | ObjectStoragePath,
        source: str | ObjectStoragePath | None = None,
        source_format: str | None = None,
        csv_separator: str = ",",
        sql: str | None = None,
        conn_id: str | None = None,
        output_format: str | None = None,
        report_path: str | ObjectStoragePath | None = None,
        columns: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            source=source, source_format=source_format, csv_separator=csv_separator, sql=sql,
            conn_id=conn_id, report_path=report_path, **kwargs,
        )
        if output_format is not None and output_format not in ("csv", "parquet"):
            raise ValueError(f"{self.task_id}: output_format must be 'csv' or 'parquet', got {output_format!r}")
        if output_format is None:
            _output_format(self.task_id, output_path, None)
        microdata_files.refuse_same_static_locations(
            self.task_id, {"source": source, "output_path": output_path, "report_path": report_path}
        )
        self._load_spec(spec)
        self.output_path = output_path
        self.output_format = output_format
        self.columns = None if columns is None else _published_columns(self.task_id, columns, self.anonymity_spec)

    def execute(self, context: Context) -> dict[str, Any]:
        from dp_operators.anonymity.anonymise import anonymise

        file_format = _output_format(self.task_id, self.output_path, self.output_format)
        # Refused before anything is read or written: a bad URL, the source's place, a folder, a symbolic link.
        destinations = microdata_files.checked_destinations(
            self.task_id, self.source, {"output_path": self.output_path, "report_path": self.report_path or None}
        )
        output_path, report_path = destinations["output_path"], destinations["report_path"]
        try:
            table = self._read_table()
        except AnonymityError as exc:
            _refuse_input(context, self.anonymity_spec, self.report_path, "anonymisation", exc)
        if self.columns is not None:
            missing = [c for c in self.columns if c not in table.columns]
            if missing:
                absent = AnonymityInputError(
                    f"the source has no column(s) {missing} named in columns=; it has {len(table.columns)} columns"
                )
                _refuse_input(context, self.anonymity_spec, self.report_path, "anonymisation", absent)
            table = table[self.columns]
        else:
            undeclared = [c for c in table.columns if c not in _declared_columns(self.anonymity_spec)]
            if undeclared:
                self.log.warning("published unchanged (neither quasi-identifier nor sensitive attribute): %s; pass "
                                 "columns= to publish only what the spec declares", ", ".join(map(str, undeclared)))
        try:
            result = anonymise(table, self.anonymity_spec)
        except AnonymityError as exc:
            _refuse_input(context, self.anonymity_spec, self.report_path, "anonymisation", exc)

        report = result.report
        # The report first: a report that cannot be written fails the task before any table is published.
        if report_path is not None:
            microdata_files.write_report_or_fail(report_path, report, "anonymisation")
        if result.passed:
            try:
                written = microdata_files.write_table(output_path, result.table, file_format)
            except microdata_files.PERMANENT_WRITE_ERRORS as exc:
                self._unpublishable(context, output_path, report_path, exc)
            self.log.info("anonymisation %r published %d of %d rows to %s", self.anonymity_spec.check,
                          len(result.table), len(table), written)
        if not result.passed:
            _missed_targets(context, self, report, "anonymisation")
        _set_outlet_extra(context, self.outlets, report)
        return report

    def _unpublishable(
        self, context: Context, output_path: ObjectStoragePath, report_path: ObjectStoragePath | None,
        exc: OSError,
    ) -> NoReturn:
        """The table cannot be written for good: replace the (passed) report already written by one saying so, so
        that no report claims a release that is not there, push it, and fail without retry."""
        message = (
            f"{self.task_id}: anonymisation {self.anonymity_spec.check!r} cannot write the table to {output_path} "
            f"({type(exc).__name__}): {microdata_files.write_fix(exc, 'output_path')}; nothing was published"
        )
        report = {"check": self.anonymity_spec.check, "passed": False, "on_failure": self.anonymity_spec.on_failure,
                  "error": message}
        if report_path is not None:
            microdata_files.write_report_or_fail(report_path, report, "anonymisation")
        _push_report(context, report)
        raise AirflowFailException(message) from exc


def _declared_columns(spec: AnonymitySpec) -> list[str]:
    return [*spec.qi_names, *(a.name for a in spec.sensitive_attributes)]


def _published_columns(task_id: str, columns: Sequence[str], spec: AnonymitySpec) -> list[str]:
    if isinstance(columns, str):
        raise ValueError(f"{task_id}: columns must be a list of column names such as [{columns!r}], not a string")
    chosen = [str(c) for c in columns]
    duplicates = sorted({c for c in chosen if chosen.count(c) > 1})
    if duplicates:
        raise ValueError(f"{task_id}: columns lists {duplicates} more than once")
    absent = [c for c in _declared_columns(spec) if c not in chosen]
    if absent:
        raise ValueError(
            f"{task_id}: columns must include every quasi-identifier and sensitive attribute of the spec; add {absent}"
        )
    return chosen


def _output_format(task_id: str, output_path: str | ObjectStoragePath, declared: str | None) -> str:
    if declared is not None:
        return declared
    suffix = Path(str(output_path)).suffix.lower()
    if suffix not in microdata_files.TABLE_FORMATS:
        raise ValueError(
            f"{task_id}: cannot tell the format of output_path {str(output_path)!r}: name it *.csv or *.parquet, "
            "or pass output_format='csv' or 'parquet'"
        )
    return microdata_files.TABLE_FORMATS[suffix]


def _refuse_input(
    context: Context, spec: AnonymitySpec, report_path: Any, what: str, exc: AnonymityError
) -> NoReturn:
    """The table cannot be processed as declared: publish a report saying why (the message names columns and
    counts, never cells), then fail without retry."""
    message = f"{what} {spec.check!r} cannot run: {exc}"
    report = {"check": spec.check, "passed": False, "on_failure": spec.on_failure, "error": str(exc)}
    _push_report(context, report)
    if report_path:
        try:
            microdata_files.write_report_or_fail(report_path, report, what)
        except AirflowFailException as unwritten:
            raise AirflowFailException(f"{message}; and {unwritten}") from exc
    raise AirflowFailException(message) from exc


def _missed_targets(context: Context, operator: BaseOperator, report: dict[str, Any], what: str) -> None:
    """Push the failed report, then fail or warn as the spec says."""
    _push_report(context, report)
    message = failure_summary(report, what)
    if operator.anonymity_spec.on_failure == "fail":  # type: ignore[attr-defined]
        raise AirflowFailException(message)
    operator.log.warning("%s (on_failure: warn, the task succeeds and publishes nothing)", message)


def failure_summary(report: Mapping[str, Any], what: str = "anonymity check") -> str:
    """One line naming every target the report failed, with its measured value and target (public figures only).

    ``report["failed_targets"]`` lists the failed targets; reports without it (older callers) fall back to the
    entries of ``report["targets"]`` whose ``passed`` is false. The reason, when there is one (the anonymiser's
    ``anonymisation.reason``: why no lattice node meets the targets; else a top-level ``reason``), follows in
    parentheses.
    """
    failed = report.get("failed_targets")
    if failed is None:
        failed = [t for t in report.get("targets", ()) if not t.get("passed")]
    parts = [_describe_target(target) for target in failed]
    reason = report.get("reason")
    if not reason and isinstance(report.get("anonymisation"), Mapping):
        reason = report["anonymisation"].get("reason")
    text = f"{what} {report.get('check')!r} failed: " + ("; ".join(parts) or "targets not met")
    return f"{text} ({reason})" if reason else text


def _describe_target(target: Any) -> str:
    if not isinstance(target, Mapping):
        return str(target)
    where = f" on {target['attribute']}" if target.get("attribute") else ""
    failing = target.get("failing_classes")
    classes = f", {failing} failing class(es)" if failing else ""
    return f"{target.get('measure')}{where}: {target.get('value')} vs target {target.get('target')}{classes}"


def _push_report(context: Context, report: Mapping[str, Any]) -> None:
    ti = context.get("ti") if isinstance(context, Mapping) else None
    if ti is not None:
        ti.xcom_push(key=REPORT_XCOM_KEY, value=report)


def _set_outlet_extra(context: Context, outlets: Sequence[Any] | None, report: dict[str, Any]) -> None:
    for outlet in outlets or ():
        context["outlet_events"][outlet].extra = report
