"""the sinks (sinks.py) through the operator: a replay from the ledger rewrites the same bytes, for
outputs with partition selection (non-ASCII, NULL and int/str keys), saturation, means and variances; and the
``key`` column of the flat table."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow.sdk.exceptions import AirflowException
from dp_operators.ledger import ReleaseKey
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import SQLTableSink, release_rows
from dp_operators.release import run_release
from dp_operators.spec import SpecError, load_spec_with_hash

from airflow_fakes import FakeTaskInstance, context_for, run_tries
from operator_ledgers import connect_ledger
from support import make_ledger

DAG = "replay_bytes_dag"
ACCOUNT = "replay_bytes_account"

MIXED_SPEC = f"""\
version: 1
release: replay_bytes_mixed
budget_account: {ACCOUNT}
privacy_unit: person
aggregates:
  - name: by_city
    kind: count
    group_by: [city]
    partition_selection:
      mechanism: discrete_laplace
      budget: {{epsilon: 1, delta: 1e-6}}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
  - name: income_total
    kind: sum
    bounds: [0, 100]
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
  - name: hours_by_sex
    kind: mean
    group_by: [sex]
    keys: {{sex: [F, M]}}
    bounds: [0, 99]
    grid: 0.5
    mechanism: discrete_gaussian
    budget: {{epsilon: 1, delta: 1e-7}}
  - name: hours_spread
    kind: variance
    bounds: [0, 99]
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
"""

BIG = 10**6
MIXED_AGGREGATES = {
    "by_city": [{"city": c, "count": BIG} for c in ("Zürich", "東京", None, "None", 7, "7", "a\x00b", "\u00e9", "e\u0301")],
    "income_total": Decimal("1e30"),  # saturates: published with saturated: true, an open interval
    "hours_by_sex": [{"sex": "F", "sum": 4000, "count": 100}, {"sex": "M", "sum": Decimal("1e30"), "count": 10**25}],
    "hours_spread": {"sum": 4000, "count": 100, "sum_squares": 170000},
}


@pytest.fixture
def env(tmp_path: Path, monkeypatch):
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path, cap="100", accountant="approx_dp", dags=(DAG,), account=ACCOUNT)
    connect_ledger(monkeypatch, "dp_ledger_replay_bytes", path)
    return ledger


def test_a_replay_rewrites_every_file_byte_for_byte(env, tmp_path):
    spec = tmp_path / "mixed.yaml"
    spec.write_text(MIXED_SPEC)
    out = tmp_path / "out"
    op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="compute",
                           output_uri=f"file://{out}", output_formats=("json", "csv", "parquet"),
                           ledger_conn_id="dp_ledger_replay_bytes")
    ti = FakeTaskInstance(upstream=MIXED_AGGREGATES, dag_id=DAG)
    first = op.execute(context_for(ti))
    rows = release_rows(first)
    assert any(r["saturated"] for r in rows), "the fixture is meant to saturate a value"
    assert len(first["aggregates"]["by_city"]["rows"]) == 9
    written = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert set(written) == {"release.json", "release.csv", "release.parquet"}
    shutil.rmtree(out)  # the replay must write them again, not find them in place

    ti.try_number = 2
    ti.upstream = None  # a replay reads nothing upstream
    again = op.execute(context_for(ti))
    assert json.dumps(again) == json.dumps(first)
    rewritten = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert rewritten == written


# -- a group_by column named like a published field ---------------------------------------------------------------

SHADOW_SPEC = f"""\
version: 1
release: replay_bytes_shadow
budget_account: {ACCOUNT}
privacy_unit: person
aggregates:
  - name: by_band
    kind: count
    group_by: [value]
    keys: {{value: [low, high]}}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
"""


def test_a_group_by_column_named_value_keeps_its_key(env, tmp_path):
    """The spec accepts any group_by name. publish.py builds each row as ``dict(zip(group_by, key))`` then
    ``row.update(value=..., half_width=...)``: a column named ``value`` (or ``half_width``, ``saturated``,
    ``interval``) loses its key to the noised number. The published JSON no longer says which band a count is for,
    and the sinks' ``key`` column becomes ``{"value": <noised count>}``: two bands with equal noised counts collide
    on the SQL table's primary key after the commit, on every retry.

    (Edited by the fix: such a column is refused when the spec is validated, naming the field and how to fix it;
    the renamed column keeps its key.)"""
    spec_path = tmp_path / "shadow.yaml"
    spec_path.write_text(SHADOW_SPEC)
    with pytest.raises(SpecError) as refused:
        load_spec_with_hash(spec_path)
    assert "aggregates[0](by_band).group_by[0]" in str(refused.value)
    assert "rename the column upstream" in str(refused.value)
    assert not env.account(ACCOUNT).spent

    spec_path.write_text(SHADOW_SPEC.replace("value", "value_key"))
    spec, digest = load_spec_with_hash(spec_path)
    output = run_release(spec, {"by_band": [{"value_key": "low", "count": 10}, {"value_key": "high", "count": 10}]},
                         env, ReleaseKey(DAG, "r1", "release", -1, spec.release), spec_hash=digest).output
    keys = [json.loads(row["key"]) for row in release_rows(output)]
    assert keys == [{"value_key": "low"}, {"value_key": "high"}], f"published keys: {keys}"


# -- the SQL sink's table is checked for existence only -----------------------------------------------------------

def test_an_existing_table_of_another_shape_is_refused_before_the_charge(env, tmp_path, monkeypatch):
    """docs/operators.md: 'Before anything is reserved the operator checks that ... the SQL sink's table exists or can be
    created.' ``prepare()`` checks only that a table of that name exists (``create_all(checkfirst=True)``). A table
    of the same name with another shape (an older dp_operators schema, a teammate's table) passes the check; the
    release is charged and committed, then every try fails to insert."""
    sink_db = tmp_path / "sink.db"
    monkeypatch.setenv("AIRFLOW_CONN_REPLAY_BYTES_SINK", json.dumps({"conn_type": "sqlite", "host": str(sink_db)}))
    engine = sa.create_engine(f"sqlite:///{sink_db}")
    with engine.begin() as conn:  # an older sink table: a ';'-joined key, no spec_hash
        conn.exec_driver_sql("CREATE TABLE dp_rows (dag_id TEXT, run_id TEXT, task_id TEXT, map_index INT, "
                             "release_name TEXT, aggregate TEXT, key TEXT, value REAL)")
    spec = tmp_path / "shadow.yaml"
    spec.write_text(SHADOW_SPEC.replace("group_by: [value]", "group_by: [band]").replace("{value:", "{band:"))
    op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="compute",
                           sql_sink=SQLTableSink("replay_bytes_sink", "dp_rows"), ledger_conn_id="dp_ledger_replay_bytes")
    ti = FakeTaskInstance(upstream={"by_band": [{"band": "low", "count": 3}]}, dag_id=DAG)
    outcomes = run_tries(op, ti)  # as Airflow's retries would
    charged = env.account(ACCOUNT).spent > 0
    assert not charged or outcomes[-1] == "success", f"charged, never published: {outcomes}"


# -- the exact, data-derived diagnostics report published next to the release -------------------------------------

def test_a_diagnostics_report_is_never_written_into_the_published_folder(env, tmp_path):
    """``diagnostics_uri`` holds exact, data-derived counts (not DP): docs/operators.md and ADR 0016 say to keep it with the true
    aggregates. Nothing stops ``diagnostics_uri == output_uri`` (an easy copy-paste in a DAG, or one templated
    variable for both): the report is then written into the public release folder beside release.json, at
    ``<release>/<dag>/<run>/release~diagnostics.json``, where every reader of the releases finds it (and
    ``dpctl release verify`` skips it without a word). Both locations are configuration: refuse it at construction
    (or before the reservation)."""
    spec = tmp_path / "shadow.yaml"
    spec.write_text(SHADOW_SPEC.replace("group_by: [value]", "group_by: [band]").replace("{value:", "{band:"))
    out = f"file://{tmp_path / 'public'}"
    try:
        op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="compute", output_uri=out,
                               diagnostics_uri=out, ledger_conn_id="dp_ledger_replay_bytes")
    except ValueError:
        return  # refused at construction: fixed
    ti = FakeTaskInstance(upstream={"by_band": [{"band": "low", "count": 3}, {"band": "nope", "count": 1}]},
                          dag_id=DAG)
    try:
        op.execute(context_for(ti))
    except AirflowException:
        return  # refused before the reservation: fixed
    leaked = sorted(p.name for p in (tmp_path / "public").rglob("*diagnostics*"))
    assert not leaked, f"the exact diagnostics report was written into the published folder: {leaked}"
