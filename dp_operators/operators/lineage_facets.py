"""OpenLineage pieces of a release: the ``dp_release`` run facet and the datasets a release reads and writes.

Imported only from inside :class:`~dp_operators.operators.lineage.ReleaseLineageMixin`'s methods, and only once
the OpenLineage provider has imported: this module needs ``openlineage-python`` and
``apache-airflow-providers-openlineage`` at import time.

Dataset names follow the OpenLineage naming spec (https://openlineage.io/docs/spec/naming): Airflow's own
asset-to-OpenLineage converters first (the ones the installed providers register: ``file`` from common-io, ``s3``
from amazon, ``gs`` from google), else the OpenLineage client's naming classes; SQL tables as the OpenLineage SQL
parser names them for the connection (``postgres://host:5432`` / ``database.schema.table``), so a release's tables
join the lineage graph under the same names the SQL operators of that connection report.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

from attrs import define, field
from openlineage.client.event_v2 import Dataset
from openlineage.client.facet_v2 import RunFacet
from openlineage.client.naming.dataset import GCS, S3, LocalFileSystem, RemoteFileSystem

from airflow.providers.openlineage.extractors import OperatorLineage
from airflow.providers.openlineage.sqlparser import DatabaseInfo, SQLParser, get_openlineage_facets_with_sql
from airflow.providers.openlineage.utils.utils import translate_airflow_asset
from airflow.sdk import Asset, BaseHook
from dp_operators import __version__
from dp_operators.accounting import unit_of

log = logging.getLogger(__name__)

#: The ``_producer`` of every facet this package emits (OpenLineage: a URI naming the producing software version).
PRODUCER = f"https://github.com/dp-operators/dp-operators/tree/{__version__}"
#: The JSON Schema of :class:`DPReleaseRunFacet` (docs/openlineage/DPReleaseRunFacet.json in the repository).
SCHEMA_URL = (
    "https://raw.githubusercontent.com/dp-operators/dp-operators/main/docs/openlineage/DPReleaseRunFacet.json"
    "#/$defs/DPReleaseRunFacet"
)
#: The run facet's key in an OpenLineage event's ``run.facets``.
FACET_NAME = "dp_release"


@define
class DPReleaseRunFacet(RunFacet):
    """The privacy side of a release run, public parameters only (never a value, true or noised).

    Attributes:
        release: the spec's release name. budgetAccount: the ledger account charged. accountant: its accountant
            (``pure_dp``, ``approx_dp``, ``zcdp``, ``gaussian_dp``). privacyUnit: what one contribution bound
            protects.
        mechanisms: one entry per noised step, names only: ``{"aggregate", "component", "mechanism"}``.
        charge: what the release was charged, in the account's unit: ``{"unit", "amount"`` (float)``,
            "amountExact"`` (the exact fraction's text)``}``, and ``"delta"``, the delta part, on an ``approx_dp``
            account only. Charged once, by the first run of the release key.
        replayed: this run found the release already committed and republished it: it was charged nothing.
        contributionBounding: per aggregate, how its contribution bounds held: ``{"mode": "enforced"`` (the
            operator read the rows and bounded each unit's contributions) ``| "declared"`` (the spec's author
            promises them: hand-written aggregate queries, upstream aggregates, or a release from before bounding
            was recorded)``, "source", "privacyUnitColumn", "sqlSha256"}`` (the last three ``None`` when unknown; the
            OpenLineage client leaves a ``None`` out when it sends the facet).
    """

    release: str
    budgetAccount: str  # noqa: N815 - OpenLineage facet fields are camelCase
    accountant: str
    privacyUnit: str  # noqa: N815
    mechanisms: list[dict[str, str]]
    charge: dict[str, Any]
    replayed: bool
    contributionBounding: dict[str, dict[str, Any]] = field(factory=dict)  # noqa: N815
    _producer: str = field(default=PRODUCER, kw_only=True)
    _additional_skip_redact: ClassVar[list[str]] = [
        "release", "budgetAccount", "accountant", "privacyUnit", "mechanisms", "charge", "replayed",
        "contributionBounding",
    ]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL


def release_run_facet(output: Mapping[str, Any], *, replayed: bool) -> DPReleaseRunFacet:
    """The ``dp_release`` facet of a release's published ``output`` (the dict
    :func:`~dp_operators.release.run_release` returns: ``release``, ``budget_account``, ``accountant``,
    ``privacy_unit``, ``charge``, ``mechanisms``)."""
    unit = unit_of(output["accountant"])
    charge = output["charge"]
    return DPReleaseRunFacet(
        release=output["release"],
        budgetAccount=output["budget_account"],
        accountant=output["accountant"],
        privacyUnit=output["privacy_unit"],
        mechanisms=[
            # a series step's mechanism measures the whole series (its "kind" is series_step), not one component
            {"aggregate": step["aggregate"], "component": step.get("component", step.get("kind")),
             "mechanism": step["mechanism"]}
            for step in output["mechanisms"]
        ],
        charge={"unit": unit, "amount": charge[unit], "amountExact": charge[f"{unit}_exact"]}
        | ({"delta": charge["delta_spent"]} if "delta_spent" in charge else {}),
        replayed=replayed,
        contributionBounding=contribution_bounding(output),
    )


def contribution_bounding(output: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The facet's ``contributionBounding`` of a release ``output``: per aggregate (every aggregate published, and
    every one its mechanisms name), from the output's ``contribution_bounding``, else from the ``contribution_bounding``
    its mechanisms record; an aggregate with neither (a release from before bounding was recorded) was declared."""
    from dp_operators.ledger.structure import bounding_by_aggregate

    recorded = output.get("contribution_bounding")
    by_aggregate = dict(recorded) if isinstance(recorded, Mapping) else bounding_by_aggregate(output.get("mechanisms"))
    names = [*(output.get("aggregates") or {}), *by_aggregate]
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(names):
        found = by_aggregate.get(name)
        found = found if isinstance(found, Mapping) else {}
        text = lambda key: found.get(key) if isinstance(found.get(key), str) else None  # noqa: E731
        out[str(name)] = {
            "mode": "enforced" if found.get("mode") == "enforced" else "declared",
            "source": text("source"),
            "privacyUnitColumn": text("privacy_unit_column"),
            "sqlSha256": text("sql_sha256"),
        }
    return out


def dataset_for_uri(uri: str) -> Dataset:
    """The OpenLineage dataset of an ``ObjectStoragePath`` URI (``file:///srv/x.json`` -> namespace ``file``,
    name ``/srv/x.json``; ``s3://bucket/key`` -> ``s3://bucket`` and ``key``; ``gs://`` or ``gcs://`` likewise;
    another scheme -> ``<scheme>://<authority>`` and the path)."""
    try:
        converted = translate_airflow_asset(Asset(uri=uri), None)
    except ValueError:  # a URI Airflow's asset rules refuse (e.g. an unnormalisable scheme): named below
        converted = None
    if converted is not None:
        return converted
    parts = urlsplit(uri)
    path = parts.path
    scheme = {"gcs": "gs", "s3a": "s3"}.get(parts.scheme, parts.scheme)
    if scheme in ("", "file", "local"):
        naming = RemoteFileSystem(parts.netloc, path) if parts.netloc else LocalFileSystem(path)
    elif scheme == "s3" and parts.netloc and path.strip("/"):
        naming = S3(parts.netloc, path.lstrip("/"))
    elif scheme == "gs" and parts.netloc and path.strip("/"):
        naming = GCS(parts.netloc, path.lstrip("/"))
    else:
        return Dataset(namespace=f"{scheme}://{parts.netloc}", name=path.lstrip("/") or "/")
    return Dataset(namespace=naming.get_namespace(), name=naming.get_name())


def sql_lineage(conn_id: str, sql: str | list[str]) -> OperatorLineage | None:
    """Tables ``sql`` reads and writes on connection ``conn_id``, named as the OpenLineage SQL parser names them
    (the SQL is parsed, never run). Uses the hook's OpenLineage database info (PostgreSQL, and every hook that
    provides it); for a hook without it (SQLite) the namespace is ``<conn_type>://<host>[:<port>]`` (SQLite: the
    database file's path) and unqualified tables are in schema ``main`` on SQLite. None when the connection has no
    SQL hook."""
    connection = BaseHook.get_connection(conn_id)
    hook = connection.get_hook()
    if not hasattr(hook, "get_openlineage_database_info"):
        log.debug("connection %r has no SQL hook: no SQL lineage", conn_id)
        return None
    lineage = get_openlineage_facets_with_sql(hook=hook, sql=sql, conn_id=conn_id, database=None,
                                              use_connection=False, connection=connection)
    if lineage is not None:
        return lineage
    authority = connection.host or ""
    if connection.port:
        authority += f":{connection.port}"
    database_info = DatabaseInfo(scheme=connection.conn_type, authority=authority or None)
    # SQLite's one schema is "main"; DbApiHook's default ("public") is PostgreSQL's
    default_schema = "main" if connection.conn_type == "sqlite" else hook.get_openlineage_default_schema()
    parser = SQLParser(dialect=hook.get_openlineage_database_dialect(connection), default_schema=default_schema)
    return parser.generate_openlineage_metadata_from_sql(
        sql=sql, hook=hook, database_info=database_info, use_connection=False
    )


def sql_table_dataset(conn_id: str, table: str) -> Dataset | None:
    """The dataset of table ``table`` (``name`` or ``schema.name``) on connection ``conn_id``: parsed as the target
    of an INSERT, so the name carries the same database and default schema as the names :func:`sql_lineage` (and
    common-sql's operators) give the tables of that connection. The statement is parsed, never run."""
    lineage = sql_lineage(conn_id, f"INSERT INTO {table} SELECT 1")
    if lineage is None or not lineage.outputs:
        return None
    return lineage.outputs[0]


def sql_statements(queries: str | Iterable[str] | Mapping[str, str]) -> list[str]:
    """The SQL of an operator's ``queries``: one statement, a list of them, or a mapping aggregate name -> SQL."""
    if isinstance(queries, str):
        return [queries]
    if isinstance(queries, Mapping):
        return [str(sql) for sql in queries.values()]
    return [str(sql) for sql in queries]
