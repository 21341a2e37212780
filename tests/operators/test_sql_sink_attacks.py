"""Attacks on the SQL sink (SQLTableSink) and the ``key`` column of CSV/Parquet/SQL rows. The key is a JSON object,
injective: a ``";".join(f"{column}={value}")`` key printed NULL and 'None', 1 and '1', and values holding ';' or '='
alike, so the table's primary key collided and the sink failed *after the ledger committed the charge*, on every
retry."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from dp_operators.ledger import ReleaseKey
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import SQLTableSink, release_csv, sql_release_table
from dp_operators.release import run_release
from dp_operators.spec import load_spec_with_hash

from airflow_fakes import FakeTaskInstance, run_tries
from operator_ledgers import connect_ledger
from operator_specs import selected_count_spec
from sql_targets import database_target
from support import make_ledger

DAG = "sink_attacks_dag"
ACCOUNT = "sink_attacks_account"

SEPARATOR_SPEC = """\
version: 1
release: separators
budget_account: sink_attacks_account
privacy_unit: person
aggregates:
  - name: people
    kind: count
    group_by: [a, b]
    keys:
      a: ['x', 'x;b=y']
      b: ['y;b=z', 'z']
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""

BIG = 10**6  # far above any selection threshold: every key is released


def selection_spec(tmp_path: Path, *, release: str = "selected", name: str = "by_city") -> Path:
    path = tmp_path / f"{release}.yaml"
    path.write_text(selected_count_spec(release, ACCOUNT, name, "city"))
    return path


def release(tmp_path: Path, spec_path: Path, aggregates: dict) -> dict:
    spec, digest = load_spec_with_hash(spec_path)
    ledger = make_ledger(tmp_path / f"ledger-{uuid.uuid4().hex[:6]}.db", cap="100", accountant="approx_dp",
                         dags=(DAG,), account=ACCOUNT)
    key = ReleaseKey(dag_id=DAG, run_id="r1", task_id="release", map_index=-1, release_name=spec.release)
    return run_release(spec, aggregates, ledger, key, spec_hash=digest).output


ALIKE = [
    pytest.param([None, "None"], id="NULL and 'None'"),
    pytest.param([1, "1"], id="int 1 and '1'"),
]


@pytest.fixture(params=["sqlite", "postgresql"])
def sink_target(request, tmp_path, monkeypatch):
    """(conn_id, table, engine) on SQLite and on the local PostgreSQL (tests/sql_targets.py)."""
    yield from database_target(request.param, tmp_path, monkeypatch, "sink_attacks_sink")


@pytest.mark.parametrize("keys", ALIKE)
def test_selected_keys_that_print_alike_are_all_written_to_the_sql_table(tmp_path, sink_target, keys):
    conn_id, table, engine = sink_target
    output = release(tmp_path, selection_spec(tmp_path), {"by_city": [{"city": k, "count": BIG} for k in keys]})
    assert len(output["aggregates"]["by_city"]["rows"]) == 2  # both keys were released (and charged)
    SQLTableSink(conn_id, table).write(output)  # IntegrityError today: the two rows share the primary key
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(sql_release_table(table))).scalar() == 2


def test_public_keys_holding_the_separators_are_all_written_to_the_sql_table(tmp_path, sink_target):
    """The spec author's own public domain: ('x', 'y;b=z') and ('x;b=y', 'z') both print 'a=x;b=y;b=z'."""
    conn_id, table, engine = sink_target
    spec = tmp_path / "separators.yaml"
    spec.write_text(SEPARATOR_SPEC)
    output = release(tmp_path, spec, {"people": []})
    SQLTableSink(conn_id, table).write(output)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(sql_release_table(table))).scalar() == 4


@pytest.mark.parametrize("keys", ALIKE)
def test_the_csv_tells_every_released_key_apart(tmp_path, keys):
    output = release(tmp_path, selection_spec(tmp_path), {"by_city": [{"city": k, "count": BIG} for k in keys]})
    lines = release_csv(output).splitlines()[1:]
    printed_keys = [line.split(",")[2] for line in lines]
    assert len(set(printed_keys)) == len(printed_keys) == 2, printed_keys


@pytest.mark.parametrize("sink_target", ["postgresql"], indirect=True)
def test_a_selected_key_with_a_nul_character_reaches_the_postgresql_table(tmp_path, sink_target):
    """A NUL in a text key (Parquet, CSV since Python 3.11, XCom) is publishable for the engine and the ledger
    (JSON escapes it), but PostgreSQL text cannot hold it: DataError after the commit, on every retry."""
    conn_id, table, engine = sink_target
    output = release(tmp_path, selection_spec(tmp_path), {"by_city": [{"city": "a\x00b", "count": BIG}]})
    SQLTableSink(conn_id, table).write(output)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(sql_release_table(table))).scalar() == 1


@pytest.mark.parametrize("sink_target", ["postgresql"], indirect=True)
def test_a_long_aggregate_name_the_spec_accepts_reaches_the_postgresql_table(tmp_path, sink_target):
    """The spec's names had no length limit; the sink's ``aggregate`` column was VARCHAR(250): the insert failed
    after the commit on PostgreSQL (SQLite ignores the length). Names are now at most 200 characters (the spec
    refuses longer ones) and ``aggregate`` is TEXT: the longest accepted name is written."""
    conn_id, table, engine = sink_target
    name = "n" * 200
    output = release(tmp_path, selection_spec(tmp_path, name=name), {name: [{"city": "a", "count": BIG}]})
    SQLTableSink(conn_id, table).write(output)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(sql_release_table(table))).scalar() == 1


# -- end to end: the operator charges, then never publishes -------------------------------------------------------

@pytest.mark.parametrize("sink_target", ["sqlite"], indirect=True)
def test_the_operator_never_charges_a_release_it_cannot_put_in_its_sql_table(tmp_path, sink_target, monkeypatch):
    conn_id, table, engine = sink_target
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path, cap="100", accountant="approx_dp", dags=(DAG,), account=ACCOUNT)
    connect_ledger(monkeypatch, "dp_ledger_sink_attacks", path)
    op = DPReleaseOperator(task_id="release", spec_path=selection_spec(tmp_path), aggregates_task_id="compute",
                           sql_sink=SQLTableSink(conn_id, table), ledger_conn_id="dp_ledger_sink_attacks")
    ti = FakeTaskInstance(upstream={"by_city": [{"city": None, "count": BIG}, {"city": "None", "count": BIG}]},
                          dag_id=DAG)
    outcomes = run_tries(op, ti)  # as Airflow's retries would
    charged = ledger.account(ACCOUNT).spent > 0
    with engine.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).select_from(sql_release_table(table))).scalar()
    assert not charged or rows == 2, f"charged, {rows} rows in the table; tries: {outcomes}"
