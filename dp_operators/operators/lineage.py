"""Lineage of a release: OpenLineage facets and the "DP release" extra link.

:class:`ReleaseLineageMixin` gives a release operator the two methods the OpenLineage provider's default extractor
calls (``get_openlineage_facets_on_start`` and ``get_openlineage_facets_on_complete``, see
``airflow/providers/openlineage/extractors/base.py``) and the extra link :class:`DPReleaseLink`. Without the
OpenLineage provider (``pip install apache-airflow-providers-openlineage``) both methods return None and nothing else
changes: the provider and its client are imported inside them, never at module import.

What the operator provides (read with ``getattr``; every one is optional):

==================  ===================================================================================
``aggregates_uri``  a URI (or a mapping aggregate name -> URI) the true aggregates are read from: inputs
``conn_id``,        a SQL connection and the aggregate queries run on it (a statement, a list, or a mapping
``queries``         aggregate name -> SQL): inputs, the tables those queries read
``published``       set by ``execute``: an object with ``output`` (the published release), ``replayed``,
                    ``locations`` (format -> URI of each file written) and ``sql_table`` (or None): outputs,
                    and the ``dp_release`` run facet
``sql_sink``        the SQL sink, whose ``conn_id`` names the connection of ``published.sql_table``
==================  ===================================================================================

and it pushes the JSON file's URI to XCom key :data:`RELEASE_LOCATION_XCOM_KEY` for the extra link.

Lineage never holds a value: only locations, table names and the public privacy parameters of the ``dp_release``
facet (:class:`~dp_operators.operators.lineage_facets.DPReleaseRunFacet`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: The XCom key under which a release operator pushes the URI of the published JSON file (read by the link).
RELEASE_LOCATION_XCOM_KEY = "release_location"


class DPReleaseLink(BaseOperatorLink):
    """Extra link "DP release": the URI of the release's JSON file, as the operator pushed it to XCom key
    :data:`RELEASE_LOCATION_XCOM_KEY`; ``""`` (no link) when the task instance pushed none (it failed before
    publishing, or was skipped)."""

    name = "DP release"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom  # the configured XCom backend

        location = XCom.get_value(ti_key=ti_key, key=RELEASE_LOCATION_XCOM_KEY)
        return location if isinstance(location, str) else ""


class ReleaseLineageMixin:
    """OpenLineage facets and the extra link of a release operator; see the module docstring for what the operator
    provides. Put it before ``BaseOperator`` in the bases."""

    operator_extra_links = (DPReleaseLink(),)

    def get_openlineage_facets_on_start(self) -> OperatorLineage | None:
        """Inputs known before the release runs: the aggregates' URI(s) and the tables the aggregate queries read
        (with their ``sql`` job facet). None without the OpenLineage provider."""
        try:
            from airflow.providers.openlineage.extractors import OperatorLineage

            from dp_operators.operators import lineage_facets
        except ImportError:
            return None
        lineage = OperatorLineage()
        reference = getattr(self, "aggregates_uri", None) or getattr(self, "aggregates_reference", None)
        if reference:
            uris = reference.values() if isinstance(reference, Mapping) else [reference]
            lineage.inputs.extend(lineage_facets.dataset_for_uri(str(uri)) for uri in uris)
        conn_id, queries = getattr(self, "conn_id", None), getattr(self, "queries", None)
        if conn_id and queries:
            try:
                read = lineage_facets.sql_lineage(conn_id, lineage_facets.sql_statements(queries))
            except Exception as error:  # lineage is best effort: it never fails the task
                self.log.warning("no OpenLineage inputs for connection %r: %s", conn_id, type(error).__name__)
                read = None
            if read is not None:
                lineage.inputs.extend(read.inputs)
                lineage.job_facets.update(read.job_facets)
                lineage.run_facets.update(read.run_facets)
        return lineage

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage | None:
        """The start's inputs, plus once published: one output dataset per file written and the SQL table, and
        the ``dp_release`` run facet. A task that failed before publishing reports its inputs only. None without
        the OpenLineage provider."""
        lineage = self.get_openlineage_facets_on_start()
        published = getattr(self, "published", None)
        if lineage is None or published is None:
            return lineage
        from dp_operators.operators import lineage_facets
        from dp_operators.operators.locations import storage_path_of

        # OpenLineage names a file by its path or object key (naming spec), not by a URI: the published URI decoded
        lineage.outputs.extend(lineage_facets.dataset_for_uri(str(storage_path_of(uri)))
                               for _, uri in sorted(published.locations.items()))
        sink_conn_id = getattr(getattr(self, "sql_sink", None), "conn_id", None)
        if published.sql_table and sink_conn_id:
            try:
                table = lineage_facets.sql_table_dataset(sink_conn_id, published.sql_table)
            except Exception as error:  # lineage is best effort: it never fails the task
                self.log.warning("no OpenLineage output for table %r: %s", published.sql_table, type(error).__name__)
                table = None
            if table is not None:
                lineage.outputs.append(table)
        lineage.run_facets[lineage_facets.FACET_NAME] = lineage_facets.release_run_facet(
            published.output, replayed=published.replayed
        )
        return lineage
