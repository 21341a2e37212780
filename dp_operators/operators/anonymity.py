"""``AnonymityCheckOperator``: gate a microdata release on k-anonymity, l-diversity and t-closeness.

A thin shell: it resolves the table (a CSV/Parquet file through ``ObjectStoragePath``, or a SQL query through the
connection's ``common.sql`` hook), calls :func:`dp_operators.anonymity.check_table`, and publishes the report. All
measures live in :mod:`dp_operators.anonymity`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, BaseOperator, ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException

from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.spec import AnonymitySpec, load_anonymity_spec

if TYPE_CHECKING:
    import pandas as pd
    from airflow.sdk import Context

_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


class AnonymityCheckOperator(BaseOperator):
    """Check a microdata table against an anonymity spec; fail the task or warn as the spec says.

    The spec (``docs/anonymity.md``) is loaded and validated when the operator is built, so a bad spec fails the
    DAG import with ``<file>: <field.path>: <reason>``.

    :param spec: path of the YAML anonymity spec, or an already-validated ``AnonymitySpec``.
    :param source: file to check: a path or URL understood by ``ObjectStoragePath`` (``file://``, ``s3://`` ...),
        CSV or Parquet. (templated)
    :param source_format: ``"csv"`` or ``"parquet"``; by default taken from the file suffix.
    :param sql: query returning the table to check, instead of ``source``. (templated)
    :param conn_id: connection whose ``common.sql`` hook runs ``sql``. (templated)

    Returns (XCom ``return_value``) the JSON report of :func:`~dp_operators.anonymity.check_table`: counts, class
    sizes, measures and targets, never row contents. Every ``Asset`` in ``outlets`` gets the same report as its
    event's ``extra``.

    Raises:
        AnonymitySpecError: at construction, the spec is invalid.
        AirflowFailException: the table fails a target and the spec says ``on_failure: fail``, or the table cannot
            be checked (unknown column, empty table, missing QI value, k larger than the table): retrying would not
            change the outcome.
    """

    template_fields: Sequence[str] = ("source", "sql", "conn_id")
    ui_color = "#e8f0e0"

    def __init__(
        self,
        *,
        spec: str | Path | AnonymitySpec,
        source: str | ObjectStoragePath | None = None,
        source_format: str | None = None,
        sql: str | None = None,
        conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (source is None) == (sql is None):
            raise ValueError(f"{self.task_id}: give exactly one of source= (a file) or sql= (a query)")
        if sql is not None and not conn_id:
            raise ValueError(f"{self.task_id}: sql= needs conn_id=")
        if source_format is not None and source_format not in ("csv", "parquet"):
            raise ValueError(f"{self.task_id}: source_format must be 'csv' or 'parquet', got {source_format!r}")
        self.anonymity_spec = spec if isinstance(spec, AnonymitySpec) else load_anonymity_spec(spec)
        self.spec_path = None if isinstance(spec, AnonymitySpec) else str(spec)
        self.source = source
        self.source_format = source_format
        self.sql = sql
        self.conn_id = conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from dp_operators.anonymity.check import check_table

        table = self._read_table()
        try:
            report = check_table(table, self.anonymity_spec)
        except AnonymityInputError as exc:
            raise AirflowFailException(f"anonymity check {self.anonymity_spec.check!r} cannot run: {exc}") from exc

        if not report["passed"]:
            message = _failure_summary(report)
            if self.anonymity_spec.on_failure == "fail":
                raise AirflowFailException(message)
            self.log.warning("%s (on_failure: warn, the task succeeds)", message)
        else:
            self.log.info("anonymity check %r passed on %d rows", report["check"], report["rows"])

        for outlet in self.outlets or ():
            context["outlet_events"][outlet].extra = report
        return report

    def _read_table(self) -> pd.DataFrame:
        import pandas as pd

        if self.sql is not None:
            hook = BaseHook.get_connection(self.conn_id).get_hook()
            if hasattr(hook, "get_df"):
                return hook.get_df(self.sql, df_type="pandas")
            return hook.get_pandas_df(self.sql)
        path = self.source if isinstance(self.source, ObjectStoragePath) else ObjectStoragePath(str(self.source))
        file_format = self.source_format or _FORMATS.get(path.suffix.lower())
        if file_format is None:
            raise AirflowFailException(
                f"cannot tell the format of {path}: name it *.csv or *.parquet, or pass source_format="
            )
        with path.open("rb") as handle:
            return pd.read_csv(handle) if file_format == "csv" else pd.read_parquet(handle)


def _failure_summary(report: dict[str, Any]) -> str:
    failed = []
    for target in report["targets"]:
        if target["passed"]:
            continue
        where = f" on {target['attribute']}" if "attribute" in target else ""
        failed.append(f"{target['measure']}{where}: {target['value']} vs target {target['target']}")
    return f"anonymity check {report['check']!r} failed: " + "; ".join(failed)
