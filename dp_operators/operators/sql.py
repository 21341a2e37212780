"""``DPSQLReleaseOperator``: run the aggregate queries through an Airflow SQL connection and release their results.

The true aggregates go from the database straight into the release engine inside :meth:`execute`: never through
XCom, Airflow's metadata database, a rendered template field or the task log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowFailException

from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sources import query_aggregates, value_columns

if TYPE_CHECKING:
    from airflow.providers.common.sql.hooks.sql import DbApiHook
    from airflow.sdk import Context


class DPSQLReleaseOperator(DPReleaseOperator):
    """Release differentially private aggregates computed by SQL queries, one per aggregate of the spec.

    Each query runs through the connection's ``common.sql`` hook (PostgreSQL, SQLite, MySQL, Snowflake, ...:
    any ``DbApiHook``) and returns one row per key: the aggregate's ``group_by`` columns and its value columns by
    name (``count``; ``sum``; ``sum`` and ``count`` for a mean, plus ``sum_squares`` for a variance; ``units`` under
    partition selection), one row for an ungrouped aggregate (:func:`~dp_operators.operators.sources.query_aggregates`).
    For example, for the spec ``config/releases/adult_census.yaml``::

        DPSQLReleaseOperator(
            task_id="release",
            spec_path="config/releases/adult_census.yaml",
            conn_id="warehouse",
            queries={
                "people_by_education_sex":
                    "SELECT education, sex, COUNT(*) AS count FROM adult GROUP BY education, sex",
                "people_by_age_band": "sql/age_bands.sql",   # a file beside the DAG, rendered by Jinja
                "mean_hours_per_week":   # clipped to the spec's bounds [1, 99] (PostgreSQL: LEAST, GREATEST)
                    "SELECT SUM(MIN(MAX(hours_per_week, 1), 99)) AS sum, COUNT(*) AS count FROM adult",
            },
            output_uri="s3://stats/dp",
        )

    Sums of ``NUMERIC`` columns (``SUM(CAST(x AS NUMERIC))`` on PostgreSQL) arrive as ``Decimal`` and are read
    exactly; clip the values in the query to the spec's ``bounds`` (the engine clamps the totals only). The queries
    run only when the release is not a replay: a retry of a committed release reads nothing.

    Args:
        conn_id: the Airflow connection whose hook runs the queries (its hook must be a ``DbApiHook``).
        queries: aggregate name -> SQL, exactly one for each aggregate of the spec (checked when the DAG is parsed).
            A value ending in ``.sql`` is a template file, as for ``SQLExecuteQueryOperator``. (templated: the SQL
            text is rendered and stored by Airflow, so it must never embed data values)
        parameters: bound to every query (a mapping for named placeholders lets each query use the names it
            needs). (templated)
        **kwargs: :class:`~dp_operators.operators.release.DPReleaseOperator`'s arguments (``spec_path``,
            ``output_uri``, ``sql_sink``, ``ledger_conn_id``, ...) except ``aggregates_task_id`` and
            ``aggregates_uri``: the queries are the source.

    Raises:
        ValueError: at construction, a query missing for an aggregate of the spec or given for another, or
            ``aggregates_task_id``/``aggregates_uri`` given.
        AirflowFailException: the connection's hook is not a ``DbApiHook``; a query fails for a reason a retry
            cannot fix, or returns a result without the columns the spec needs; and every refusal of
            :class:`~dp_operators.operators.release.DPReleaseOperator`.
        AirflowException: retryable database failures (a lost connection), and those of the parent.
    """

    template_fields: Sequence[str] = (*DPReleaseOperator.template_fields, "queries", "parameters")
    template_ext: Sequence[str] = (".sql",)
    template_fields_renderers: ClassVar[dict[str, str]] = {"queries": "json", "parameters": "json"}
    ui_color = "#e0ecf8"

    def __init__(
        self,
        *,
        conn_id: str,
        queries: Mapping[str, str],
        parameters: Iterable | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        for argument in ("aggregates_task_id", "aggregates_uri"):
            if kwargs.get(argument) is not None:
                raise ValueError(
                    f"task {kwargs.get('task_id')!r}: DPSQLReleaseOperator reads the aggregates with its queries; "
                    f"drop {argument} (or use DPReleaseOperator)"
                )
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.queries = dict(queries)
        self.parameters = parameters
        self._check_queries()

    def _check_queries(self) -> None:
        """One query per aggregate of the spec, and nothing else: a DAG import error, not a failed run."""
        names = [aggregate.name for aggregate in self.release_spec.aggregates]
        missing = [name for name in names if name not in self.queries]
        unknown = [name for name in self.queries if name not in names]
        if missing or unknown:
            needs = {a.name: a.group_by + value_columns(self.release_spec, a) for a in self.release_spec.aggregates}
            raise ValueError(
                f"task {self.task_id!r}: queries must hold one query for each aggregate of {self.spec_path}"
                + (f"; missing {missing}" if missing else "")
                + (f"; not in the spec: {unknown}" if unknown else "")
                + f". Columns each query returns: {needs}"
            )

    def get_db_hook(self) -> DbApiHook:
        """The ``DbApiHook`` of ``conn_id`` (as ``SQLExecuteQueryOperator`` gets it: ``BaseHook.get_hook``).

        Raises:
            AirflowFailException: the connection's hook is not a ``common.sql`` ``DbApiHook``.
        """
        from airflow.providers.common.sql.hooks.sql import DbApiHook

        hook = BaseHook.get_hook(self.conn_id)
        if not isinstance(hook, DbApiHook):
            raise AirflowFailException(
                f"connection {self.conn_id!r} gives a {type(hook).__name__}, not a common.sql DbApiHook: give a SQL "
                "connection (postgres, sqlite, mysql, ...) whose provider is installed"
            )
        return hook

    def read_aggregates(self, context: Context) -> dict[str, Any]:
        """The true aggregates, from :attr:`queries` run on :attr:`conn_id` (only the connection id is logged)."""
        hook = self.get_db_hook()
        self.log.info("reading the aggregates of %d queries on connection %r", len(self.queries), self.conn_id)
        return query_aggregates(hook, self.queries, self.release_spec, self.parameters)
