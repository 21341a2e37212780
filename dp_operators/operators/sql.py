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
from dp_operators.operators.raw_rows import (
    bounded_sql_aggregates,
    bounding_records,
    check_raw_rows_arguments,
    sql_dialect,
)
from dp_operators.operators.sources import query_aggregates, value_columns
from dp_operators.release.bounding import BoundedRowsSource, declared_bounding

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
                "median_hours_per_week":   # a histogram: one row per bin (its lower edge), hours clipped as above
                    "SELECT MIN(MAX(hours_per_week, 1), 99) AS hours_per_week, COUNT(*) AS count FROM adult "
                    "GROUP BY 1",
            },
            output_uri="s3://stats/dp",
        )

    **Enforced bounds from raw rows.** Instead of ``queries``, give the table (or a ``SELECT`` of its rows), the
    column naming the privacy unit and, for each sum, mean or variance, its value column; the operator generates the
    bounded aggregation (:mod:`dp_operators.release.bounding`) and runs it in the database, which returns one row
    per key::

        DPSQLReleaseOperator(
            task_id="release",
            spec_path="config/releases/nyc_aircraft.yaml",
            conn_id="warehouse",
            table="flights",                      # or rows_query="SELECT ... FROM flights JOIN ..."
            privacy_unit_column="tailnum",        # one aircraft: every row of it counts towards its bounds
            value_columns={"mean_dep_delay": "dep_delay"},
        )

    Each privacy unit then contributes to at most ``max_partitions_contributed`` keys of an aggregate and at most
    ``max_contributions_per_partition`` rows per key, chosen at random in the database, with values clipped to the
    spec's ``bounds``: the ledger, the published ``mechanisms`` and the lineage record the bounds as ``enforced``
    (with the generated SQL's SHA-256). With hand-written ``queries`` they are ``declared``: the author promises
    them, and an account with ``require_enforced_bounding`` refuses the release before anything is charged.

    Sums of ``NUMERIC`` columns (``SUM(CAST(x AS NUMERIC))`` on PostgreSQL) arrive as ``Decimal`` and are read
    exactly; clip the values in the query to the spec's ``bounds`` (the engine clamps the totals only). The queries
    run only when the release is not a replay: a retry of a committed release reads nothing.

    Args:
        conn_id: the Airflow connection whose hook runs the queries (its hook must be a ``DbApiHook``).
        table: a table of raw rows (``"flights"``, ``"schema.flights"``), bounded by the operator.
        rows_query: instead of ``table``, a ``SELECT`` of raw rows (a subquery of the generated query; a ``.sql``
            file is a template). Its joins and filters are the author's: the bounds are enforced per value of its
            privacy-unit column. (templated)
        privacy_unit_column: with ``table``/``rows_query``, the column identifying the privacy unit.
        value_columns: with ``table``/``rows_query``, aggregate name -> the column a ``sum``, ``mean`` or
            ``variance`` adds (a count takes none).
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

    template_fields: Sequence[str] = (*DPReleaseOperator.template_fields, "queries", "rows_query", "parameters")
    template_ext: Sequence[str] = (".sql",)
    template_fields_renderers: ClassVar[dict[str, str]] = {"queries": "json", "rows_query": "sql",
                                                          "parameters": "json"}
    ui_color = "#e0ecf8"

    def __init__(
        self,
        *,
        conn_id: str,
        queries: Mapping[str, str] | None = None,
        parameters: Iterable | Mapping[str, Any] | None = None,
        table: str | None = None,
        rows_query: str | None = None,
        privacy_unit_column: str | None = None,
        value_columns: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        task = f"task {kwargs.get('task_id')!r}"
        for argument in ("aggregates_task_id", "aggregates_uri", "rows_uri"):
            if kwargs.get(argument) is not None:
                raise ValueError(
                    f"{task}: DPSQLReleaseOperator reads the aggregates with its queries or from its table; "
                    f"drop {argument} (or use DPReleaseOperator)"
                )
        if [queries, table, rows_query].count(None) != 2:
            raise ValueError(
                f"{task}: give exactly one of table= (a table of raw rows, bounded by the operator: enforced "
                "bounds), rows_query= (a SELECT of raw rows, bounded likewise) and queries= (hand-written aggregate "
                "queries: declared bounds)"
            )
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.queries = dict(queries) if queries is not None else None
        self.parameters = parameters
        self.table = table
        self.rows_query = rows_query
        if queries is not None:
            if privacy_unit_column is not None or value_columns:
                raise ValueError(f"{task}: privacy_unit_column and value_columns describe raw rows: give them with "
                                 "table= or rows_query=, not with hand-written queries")
            self._check_queries()
        else:
            value_columns = check_raw_rows_arguments(self.release_spec, privacy_unit_column, value_columns,
                                                     kwargs.get("task_id"))
            if table is not None and (not isinstance(table, str) or not table.strip() or "{{" in table):
                raise ValueError(f"{task}: table must name a table ('flights' or 'schema.flights'), got {table!r}; "
                                 "for a query of raw rows use rows_query=")
        self.privacy_unit_column = privacy_unit_column
        self.value_columns = dict(value_columns or {})

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

    def rows_source(self) -> BoundedRowsSource | None:
        """The raw rows the operator bounds (``table`` or ``rows_query``), or None with hand-written queries."""
        if self.queries is not None:
            return None
        return BoundedRowsSource(privacy_unit_column=self.privacy_unit_column, table=self.table,
                                 query=self.rows_query, value_columns=self.value_columns)

    def contribution_bounding(self) -> dict[str, dict[str, Any]]:
        """``enforced`` for every aggregate when the operator bounds the raw rows (``table``, ``rows_query``),
        with the SHA-256 of the query generated for the connection's dialect; ``declared`` (with the SHA-256 of
        each rendered hand-written query) otherwise."""
        source = self.rows_source()
        if source is None:
            return {name: declared_bounding("query", sql) for name, sql in self.queries.items()}
        return bounding_records(self.release_spec, source, sql_dialect(self.get_db_hook()), self.parameters)

    def read_aggregates(self, context: Context) -> dict[str, Any]:
        """The true aggregates, from :attr:`queries` run on :attr:`conn_id`, or bounded and aggregated in the
        database from :attr:`table` / :attr:`rows_query` (only the connection id is logged)."""
        hook = self.get_db_hook()
        source = self.rows_source()
        if source is not None:
            self.log.info("bounding and aggregating the raw rows of %s on connection %r (%d aggregates)",
                          f"table {self.table!r}" if self.table else "the rows query", self.conn_id,
                          len(self.release_spec.aggregates))
            return bounded_sql_aggregates(hook, self.release_spec, source, self.parameters)
        self.log.info("reading the aggregates of %d queries on connection %r", len(self.queries), self.conn_id)
        return query_aggregates(hook, self.queries, self.release_spec, self.parameters)
