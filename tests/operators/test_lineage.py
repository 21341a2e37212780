"""ReleaseLineageMixin and DPReleaseLink, on a small operator with the attributes DPReleaseOperator sets, and a
release output produced by the real engine."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from airflow.sdk import DAG, BaseOperator
from dp_operators.ledger import ReleaseKey
from dp_operators.operators import lineage
from dp_operators.operators.lineage import RELEASE_LOCATION_XCOM_KEY, DPReleaseLink, ReleaseLineageMixin
from dp_operators.release import run_release
from dp_operators.spec import load_spec_with_hash

from ledger_backends import account_config, ledger_with, pg_database  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]
FACET_SCHEMA = REPO / "docs" / "openlineage" / "DPReleaseRunFacet.json"

SPECS = {
    "zcdp": "  - {name: visits, kind: count, mechanism: discrete_gaussian, budget: {rho: 0.02}}\n",
    "approx_dp": "  - {name: visits, kind: count, mechanism: discrete_gaussian, budget: {epsilon: 1, delta: 4e-7}}\n",
}


@dataclass
class Published:
    """What DPReleaseOperator.execute sets as ``self.published``."""

    output: dict[str, Any]
    replayed: bool
    locations: dict[str, str]
    sql_table: str | None = None


class ReleaseLike(ReleaseLineageMixin, BaseOperator):
    """Stands in for DPReleaseOperator: the attributes the mixin reads, and an execute that publishes."""

    def __init__(self, *, aggregates_uri=None, conn_id=None, queries=None, sql_sink=None, publish=None, **kwargs):
        super().__init__(**kwargs)
        self.aggregates_uri, self.conn_id, self.queries, self.sql_sink = aggregates_uri, conn_id, queries, sql_sink
        self.publish = publish
        self.published = None

    def execute(self, context):
        self.published = self.publish
        return None if self.publish is None else self.publish.output


def released(tmp_path: Path, accountant: str = "zcdp", runs: int = 1) -> list:
    """The engine's results of ``runs`` tries of one release key (the first charged, the others replays)."""
    spec_path = tmp_path / "visits.yaml"
    spec_path.write_text(
        "version: 1\nrelease: visits\nbudget_account: web\nprivacy_unit: person\naggregates:\n" + SPECS[accountant]
    )
    cap = {"zcdp": "1", "approx_dp": "6"}[accountant]
    ledger = ledger_with(f"sqlite:///{tmp_path / 'ledger.db'}",
                         web=account_config(accountant, cap=cap, delta="1e-6", dags=("web_stats",)))
    spec, digest = load_spec_with_hash(spec_path)
    key = ReleaseKey("web_stats", "manual__1", "release", -1, "visits")
    return [run_release(spec, {"visits": 1234}, ledger, key, spec_hash=digest) for _ in range(runs)]


def file_locations(folder: Path) -> dict[str, str]:
    return {fmt: f"file://{folder}/release.{fmt}" for fmt in ("json", "csv", "parquet")}


@pytest.mark.parametrize("accountant", ["zcdp", "approx_dp"])
def test_on_complete_reports_the_files_written_and_the_release_facet(tmp_path, accountant):
    result = released(tmp_path, accountant)[0]
    op = ReleaseLike(task_id="release", publish=Published(result.output, result.replayed, file_locations(tmp_path)))
    op.execute({})
    facets = op.get_openlineage_facets_on_complete(task_instance=None)

    assert [(d.namespace, d.name) for d in facets.outputs] == [
        ("file", f"{tmp_path}/release.{fmt}") for fmt in ("csv", "json", "parquet")
    ]
    facet = facets.run_facets["dp_release"]
    output = result.output
    assert (facet.release, facet.budgetAccount, facet.accountant, facet.privacyUnit) == (
        "visits", "web", accountant, "person"
    )
    assert facet.mechanisms == [{"aggregate": "visits", "component": "count", "mechanism": "discrete_gaussian"}]
    unit = {"zcdp": "rho", "approx_dp": "epsilon"}[accountant]
    assert facet.charge["unit"] == unit and facet.charge["amountExact"] == output["charge"][f"{unit}_exact"]
    assert facet.charge["amount"] == float(Fraction(facet.charge["amountExact"]))
    if accountant == "approx_dp":
        assert 0 < facet.charge["delta"] <= 4e-7  # the Gaussian's exact-profile delta
    else:
        assert "delta" not in facet.charge
    assert facet.replayed is False


def test_a_replay_is_flagged_and_reports_the_same_outputs(tmp_path):
    first, replay = released(tmp_path, runs=2)
    assert replay.replayed
    reports = []
    for result in (first, replay):
        op = ReleaseLike(task_id="release", publish=Published(result.output, result.replayed, file_locations(tmp_path)))
        op.execute({})
        reports.append(op.get_openlineage_facets_on_complete(task_instance=None))
    assert reports[0].outputs == reports[1].outputs
    assert [report.run_facets["dp_release"].replayed for report in reports] == [False, True]
    assert reports[0].run_facets["dp_release"].charge == reports[1].run_facets["dp_release"].charge


def test_the_facet_holds_public_parameters_only_and_matches_its_schema(tmp_path):
    """Serialized as the OpenLineage client sends it: no released value, valid against the schema the facet's
    _schemaURL names (shipped in docs/openlineage)."""
    from openlineage.client.serde import Serde

    result = released(tmp_path)[0]
    op = ReleaseLike(task_id="release", publish=Published(result.output, False, file_locations(tmp_path)))
    op.execute({})
    facet = op.get_openlineage_facets_on_complete(task_instance=None).run_facets["dp_release"]
    sent = json.loads(Serde.to_json(facet))
    schema = json.loads(FACET_SCHEMA.read_text())
    assert sent["_schemaURL"] == schema["$id"] + "#/$defs/DPReleaseRunFacet"
    assert sent["_producer"].startswith("https://github.com/dp-operators/dp-operators/tree/")
    own_part = schema["$defs"]["DPReleaseRunFacet"]["allOf"][1]  # [0] is OpenLineage's RunFacet (_producer...)
    jsonschema.validate(sent, own_part)
    noised = result.output["aggregates"]["visits"]["value"]
    assert "aggregates" not in sent and str(noised) not in json.dumps(sent["mechanisms"])


def test_the_facet_names_each_aggregates_contribution_bounding(tmp_path):
    """Per aggregate, enforced (with its source, unit column and SQL digest) or declared: from the output's
    contribution_bounding, else from its mechanisms; a release from before bounding was recorded is declared. Valid
    against the shipped schema."""
    from openlineage.client.serde import Serde

    from dp_operators.operators.lineage_facets import release_run_facet

    output = dict(released(tmp_path)[0].output)
    enforced = {"mode": "enforced", "source": "table", "privacy_unit_column": "person_id", "sql_sha256": "ab" * 32}
    with_bounding = {**output, "contribution_bounding": {"visits": enforced}}
    facet = release_run_facet(with_bounding, replayed=False)
    assert facet.contributionBounding == {"visits": {"mode": "enforced", "source": "table",
                                                     "privacyUnitColumn": "person_id", "sqlSha256": "ab" * 32}}
    from_steps = {key: value for key, value in output.items() if key != "contribution_bounding"}
    from_steps["mechanisms"] = [{**step, "contribution_bounding": enforced} for step in output["mechanisms"]]
    assert release_run_facet(from_steps, replayed=False).contributionBounding == facet.contributionBounding
    older = {**from_steps, "mechanisms": [{k: v for k, v in step.items() if k != "contribution_bounding"}
                                          for step in output["mechanisms"]]}
    assert release_run_facet(older, replayed=False).contributionBounding == {
        "visits": {"mode": "declared", "source": None, "privacyUnitColumn": None, "sqlSha256": None}}
    schema = json.loads(FACET_SCHEMA.read_text())
    jsonschema.validate(json.loads(Serde.to_json(facet)), schema["$defs"]["DPReleaseRunFacet"]["allOf"][1])


def test_inputs_are_the_aggregates_references(tmp_path):
    one = ReleaseLike(task_id="a", aggregates_uri=f"file://{tmp_path}/aggregates.json")
    assert [(d.namespace, d.name) for d in one.get_openlineage_facets_on_start().inputs] == [
        ("file", f"{tmp_path}/aggregates.json")
    ]
    several = ReleaseLike(task_id="b", aggregates_uri={"visits": "s3://stats/visits.parquet", "hours": "gcs://g/h.csv"})
    assert [(d.namespace, d.name) for d in several.get_openlineage_facets_on_start().inputs] == [
        ("s3://stats", "visits.parquet"), ("gs://g", "h.csv")
    ]
    assert ReleaseLike(task_id="c").get_openlineage_facets_on_start().inputs == []  # upstream via XCom: unknown


@pytest.fixture
def sqlite_conn(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "warehouse.db"
    monkeypatch.setenv("AIRFLOW_CONN_DP_WAREHOUSE", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    return path


def test_inputs_are_the_tables_the_aggregate_queries_read(sqlite_conn):
    queries = {
        "people": "SELECT education, COUNT(*) AS count FROM adult GROUP BY education",
        "hours": "SELECT SUM(h.hours) AS sum, COUNT(*) AS count FROM adult a JOIN census.hours h ON a.id = h.id",
    }
    op = ReleaseLike(task_id="release", conn_id="dp_warehouse", queries=queries)
    facets = op.get_openlineage_facets_on_start()
    assert sorted((d.namespace, d.name) for d in facets.inputs) == [  # one dataset per table
        (f"sqlite://{sqlite_conn}", "census.hours"), (f"sqlite://{sqlite_conn}", "main.adult"),
    ]
    assert "GROUP BY education" in facets.job_facets["sql"].query


def test_the_sql_table_is_an_output(tmp_path, sqlite_conn):
    result = released(tmp_path)[0]
    published = Published(result.output, False, {"json": f"file://{tmp_path}/r.json"}, sql_table="dp_releases")
    op = ReleaseLike(task_id="release", sql_sink=SimpleNamespace(conn_id="dp_warehouse"), publish=published)
    op.execute({})
    outputs = op.get_openlineage_facets_on_complete(task_instance=None).outputs
    assert [(d.namespace, d.name) for d in outputs] == [
        ("file", f"{tmp_path}/r.json"), (f"sqlite://{sqlite_conn}", "main.dp_releases")
    ]


def test_the_sql_table_on_postgres_has_the_name_common_sql_gives_it(tmp_path, monkeypatch, pg_database):
    """The release's output table and a SQL operator reading it must be one dataset in the lineage graph."""
    from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator

    monkeypatch.setenv("AIRFLOW_CONN_DP_SINK_PG", json.dumps({
        "conn_type": "postgres", "host": pg_database.host, "port": pg_database.port, "login": pg_database.username,
        "schema": pg_database.database,
    }))
    result = released(tmp_path)[0]
    published = Published(result.output, False, {}, sql_table="dp_releases")
    op = ReleaseLike(task_id="release", sql_sink=SimpleNamespace(conn_id="dp_sink_pg"), publish=published)
    op.execute({})
    [table] = op.get_openlineage_facets_on_complete(task_instance=None).outputs
    reader = SQLExecuteQueryOperator(task_id="reader", conn_id="dp_sink_pg", sql="SELECT * FROM dp_releases")
    [read] = reader.get_openlineage_facets_on_start().inputs
    assert (table.namespace, table.name) == (read.namespace, read.name)
    assert table.namespace == f"postgres://{pg_database.host}:{pg_database.port}"


def test_an_unreachable_sql_connection_costs_the_table_not_the_lineage(tmp_path):
    result = released(tmp_path)[0]
    published = Published(result.output, False, {"json": f"file://{tmp_path}/r.json"}, sql_table="dp_releases")
    op = ReleaseLike(task_id="release", sql_sink=SimpleNamespace(conn_id="no_such_connection"), publish=published)
    op.execute({})
    facets = op.get_openlineage_facets_on_complete(task_instance=None)
    assert [d.name for d in facets.outputs] == [f"{tmp_path}/r.json"] and "dp_release" in facets.run_facets


def test_a_task_that_failed_before_publishing_reports_its_inputs_only(tmp_path):
    op = ReleaseLike(task_id="release", aggregates_uri=f"file://{tmp_path}/aggregates.json")
    facets = op.get_openlineage_facets_on_complete(task_instance=None)  # execute never set published
    assert len(facets.inputs) == 1 and facets.outputs == [] and facets.run_facets == {}


def test_the_openlineage_provider_extracts_through_the_mixin(tmp_path):
    """The provider's own ExtractorManager (what its listener calls) picks the mixin's methods."""
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.utils.state import TaskInstanceState

    result = released(tmp_path)[0]
    op = ReleaseLike(task_id="release", aggregates_uri=f"file://{tmp_path}/in.json",
                     publish=Published(result.output, False, file_locations(tmp_path)))
    op.execute({})
    manager, dag_run = ExtractorManager(), SimpleNamespace(run_id="manual__1")
    running = manager.extract_metadata(dag_run, op, TaskInstanceState.RUNNING, SimpleNamespace())
    done = manager.extract_metadata(dag_run, op, TaskInstanceState.SUCCESS, SimpleNamespace())
    assert len(running.inputs) == 1 and running.outputs == [] and "dp_release" not in running.run_facets
    assert len(done.inputs) == 1 and len(done.outputs) == 3 and done.run_facets["dp_release"].release == "visits"


OPENLINEAGE_MODULES = ("airflow.providers.openlineage", "openlineage", "dp_operators.operators.lineage_facets")


@pytest.fixture
def without_openlineage(monkeypatch):
    """As if neither the OpenLineage provider nor its client were installed."""
    for name in list(sys.modules):
        if name.startswith(OPENLINEAGE_MODULES):
            monkeypatch.setitem(sys.modules, name, None)
    for name in OPENLINEAGE_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError):
        import airflow.providers.openlineage.extractors  # noqa: F401


def test_without_openlineage_the_methods_return_none_and_the_operator_runs(tmp_path, without_openlineage):
    spec = importlib.util.spec_from_file_location("lineage_fresh_import", lineage.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the module itself imports nothing of OpenLineage
    published = Published({"release": "visits"}, False, file_locations(tmp_path))
    op = ReleaseLike(task_id="release", aggregates_uri=f"file://{tmp_path}/in.json", publish=published)
    assert op.execute({}) == {"release": "visits"}
    assert op.get_openlineage_facets_on_start() is None
    assert op.get_openlineage_facets_on_complete(task_instance=None) is None


class InMemoryXComs:
    """The task supervisor's side of XCom.set / XCom.get_one (what the SDK's XCom class talks to)."""

    def __init__(self) -> None:
        self.values: dict[tuple, Any] = {}

    def send(self, msg):
        from airflow.sdk.execution_time.comms import GetXCom, SetXCom, XComResult

        if isinstance(msg, SetXCom):
            self.values[(msg.dag_id, msg.run_id, msg.task_id, msg.map_index, msg.key)] = msg.value
            return None
        if isinstance(msg, GetXCom):
            index = -1 if msg.map_index is None else msg.map_index
            return XComResult(key=msg.key, value=self.values.get((msg.dag_id, msg.run_id, msg.task_id, index, msg.key)))
        raise AssertionError(f"unexpected message {msg!r}")


def test_the_link_is_the_location_the_operator_pushed(monkeypatch, tmp_path):
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.xcom import XCom

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", InMemoryXComs(), raising=False)
    location = f"file://{tmp_path}/visits/web_stats/manual__1/release~2.json"
    XCom.set(key=RELEASE_LOCATION_XCOM_KEY, value=location, dag_id="web_stats", task_id="release",
             run_id="manual__1", map_index=2)
    op = ReleaseLike(task_id="release")
    link = DPReleaseLink()
    assert link.get_link(op, ti_key=TaskInstanceKey("web_stats", "release", "manual__1", 1, 2)) == location
    assert link.get_link(op, ti_key=TaskInstanceKey("web_stats", "release", "manual__1", 1, 0)) == ""  # none pushed
    assert link.name == "DP release"


def test_the_link_is_on_the_operator_and_registered_with_the_provider():
    from airflow.serialization.serialized_objects import DagSerialization

    from dp_operators.get_provider_info import get_provider_info

    schema = json.loads((Path(sys.modules["airflow"].__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert f"{DPReleaseLink.__module__}.{DPReleaseLink.__qualname__}" in info["extra-links"]
    assert "dp_operators.operators.gate" in info["operators"][0]["python-modules"]
    with DAG("web_stats", schedule=None) as dag:
        ReleaseLike(task_id="release")
    [task] = DagSerialization.to_dict(dag)["dag"]["tasks"]
    assert task["__var"]["_operator_extra_links"] == {"DP release": "_link_DPReleaseLink"}
