"""The SQL sink's table before the charge and after it (dp_operators/operators/sql_sink.py), on SQLite and on the
local PostgreSQL.

* ``prepare()`` (before the ledger reserves) checked only that a table of the name existed: a table of another
  shape (an older dp_operators table, a teammate's) passed, the release was charged, and every try failed to
  insert. It now compares the columns and the primary key with ``sql_release_table``.
* Concurrent first releases raced in ``create_all`` (DuplicateTable / UniqueViolation): the losers failed.
* The primary key held ``aggregate`` and ``key``: a released key over PostgreSQL's B-tree row limit (~2704 bytes;
  partition selection over URLs) failed the insert after the commit. The key is now the release key plus
  ``row_digest``.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow.sdk.exceptions import AirflowFailException
from dp_operators.ledger import ReleaseKey
from dp_operators.operators import sql_sink
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import SQLTableSink, release_rows, sql_release_table
from dp_operators.release import run_release
from dp_operators.spec import load_spec_with_hash

from airflow_fakes import FakeTaskInstance, context_for
from operator_ledgers import connect_ledger
from operator_specs import selected_count_spec
from sql_targets import database_target
from support import make_ledger

DAG = "shape_dag"
ACCOUNT = "shape_account"
BIG = 10**6

SPEC = selected_count_spec("pages", ACCOUNT, "views_by_page", "page")


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path, monkeypatch):
    """``(conn_id, table, engine)`` on SQLite and on the local PostgreSQL (tests/sql_targets.py)."""
    yield from database_target(request.param, tmp_path, monkeypatch, "shape_sink")


def release(tmp_path: Path, pages: list[str], run_id: str = "r1") -> dict:
    spec_path = tmp_path / "pages.yaml"
    spec_path.write_text(SPEC)
    spec, digest = load_spec_with_hash(spec_path)
    ledger = make_ledger(tmp_path / f"ledger-{uuid.uuid4().hex[:6]}.db", cap="100", accountant="approx_dp",
                         dags=(DAG,), account=ACCOUNT)
    key = ReleaseKey(DAG, run_id, "release", -1, spec.release)
    return run_release(spec, {"views_by_page": [{"page": p, "count": BIG} for p in pages]}, ledger, key,
                       spec_hash=digest).output


def count_rows(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(sql_release_table(table))).scalar()


# -- tables of another shape ----------------------------------------------------------------------------------------

def _reshaped(name: str, *, drop: tuple[str, ...] = (), key: tuple[str, ...] | None = None,
              extra: sa.Column | None = None) -> sa.Table:
    """``sql_release_table(name)`` without the columns ``drop``, with the primary key ``key`` (None: unchanged)
    and one ``extra`` column."""
    expected = sql_release_table(name)
    wanted_key = key if key is not None else tuple(c.name for c in expected.primary_key.columns)
    columns = [sa.Column(c.name, c.type, primary_key=c.name in wanted_key, nullable=c.nullable,
                         autoincrement=False)
               for c in expected.columns if c.name not in drop]
    return sa.Table(expected.name, sa.MetaData(), *columns, *([extra] if extra is not None else []),
                    schema=expected.schema)


OLD_KEY = ("dag_id", "run_id", "task_id", "map_index", "release_name", "aggregate", "key")
SHAPES = {
    # the table of the previous dp_operators version: (aggregate, key) in the primary key, no row_digest
    "previous version": (lambda n: _reshaped(n, drop=("row_digest",), key=OLD_KEY),
                         ["missing column(s) row_digest", "primary key (", ") instead of ("]),
    "missing column": (lambda n: _reshaped(n, drop=("spec_hash", "confidence")),
                       ["missing column(s) confidence, spec_hash"]),
    "no primary key": (lambda n: _reshaped(n, key=()), ["primary key (none) instead of (dag_id, run_id, task_id"]),
    "extra NOT NULL column": (lambda n: _reshaped(n, extra=sa.Column("owner", sa.Text, nullable=False)),
                              ["column(s) owner NOT NULL without a default"]),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_prepare_refuses_an_existing_table_of_another_shape(target, shape):
    conn_id, table, engine = target
    build, differences = SHAPES[shape]
    build(table).create(engine)
    for create_table in (True, False):
        with pytest.raises(AirflowFailException) as refused:
            SQLTableSink(conn_id, table, create_table=create_table).prepare()
        message = str(refused.value)
        assert f"table {table!r} on connection {conn_id!r} exists but is not a dp_operators release table" in message
        for difference in differences:
            assert difference in message
        assert "Drop or rename it" in message and "another table name" in message


def test_prepare_accepts_extra_columns_the_sink_need_not_fill(target, tmp_path):
    conn_id, table, engine = target
    _reshaped(table, extra=sa.Column("loaded_by", sa.Text, nullable=True)).create(engine)
    sink = SQLTableSink(conn_id, table, create_table=False)
    sink.prepare()
    output = release(tmp_path, ["/a", "/b"])
    assert sink.write(output) == 2 == count_rows(engine, table)


def test_prepare_accepts_the_table_it_created(target):
    conn_id, table, engine = target
    SQLTableSink(conn_id, table).prepare()
    assert sa.inspect(engine).has_table(sql_release_table(table).name, schema=sql_release_table(table).schema)
    SQLTableSink(conn_id, table).prepare()
    SQLTableSink(conn_id, table, create_table=False).prepare()


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_the_operator_refuses_a_table_of_another_shape_before_the_charge(target, tmp_path, monkeypatch):
    conn_id, table, engine = target
    SHAPES["previous version"][0](table).create(engine)
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path, cap="100", accountant="approx_dp", dags=(DAG,), account=ACCOUNT)
    connect_ledger(monkeypatch, "dp_ledger_shape", path)
    spec_path = tmp_path / "pages.yaml"
    spec_path.write_text(SPEC)
    op = DPReleaseOperator(task_id="release", spec_path=spec_path, aggregates_task_id="compute",
                           sql_sink=SQLTableSink(conn_id, table), ledger_conn_id="dp_ledger_shape")
    ti = FakeTaskInstance(upstream={"views_by_page": [{"page": "/a", "count": BIG}]}, dag_id=DAG)
    with pytest.raises(AirflowFailException, match="missing column"):
        op.execute(context_for(ti))
    assert ledger.account(ACCOUNT).spent == 0
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")
    ti.try_number = 2
    op.execute(context_for(ti))
    assert ledger.account(ACCOUNT).spent > 0
    assert count_rows(engine, table) == 1


# -- concurrent creation ----------------------------------------------------------------------------------------------

def test_a_table_created_by_another_instance_during_prepare_is_not_an_error(target, monkeypatch):
    """Deterministic race: another connection creates the table after this one's existence check, right before its
    own ``CREATE TABLE`` (PostgreSQL: DuplicateTable; SQLite: 'already exists')."""
    conn_id, table, engine = target
    created = []

    def racing_table(name: str) -> sa.Table:
        built = sql_release_table(name)

        @sa.event.listens_for(built, "before_create")
        def other_instance_wins(*_args, **_kwargs):
            sql_release_table(name).create(engine)
            created.append(name)

        return built

    monkeypatch.setattr(sql_sink, "sql_release_table", racing_table)
    SQLTableSink(conn_id, table).prepare()
    assert created == [table]


def test_a_creation_failure_that_leaves_no_table_is_raised(target, monkeypatch):
    conn_id, table, _ = target

    def refuse(*_args, **_kwargs):
        raise sa.exc.ProgrammingError("CREATE TABLE", {}, Exception("permission denied for schema"))

    monkeypatch.setattr(sa.MetaData, "create_all", refuse)
    with pytest.raises(sa.exc.ProgrammingError):
        SQLTableSink(conn_id, table).prepare()


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_concurrent_first_prepares_all_pass_on_sqlite(target):
    """Concurrent first prepares of the SQL sink all pass on SQLite (PostgreSQL: test_sql_sink_postgres.py)."""
    conn_id, table, _ = target
    errors = []
    barrier = threading.Barrier(8)

    def instance() -> None:
        barrier.wait()
        try:
            SQLTableSink(conn_id, table).prepare()
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(repr(error)[:200])

    threads = [threading.Thread(target=instance) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []


# -- the primary key: release key + row_digest --------------------------------------------------------------------

def test_the_primary_key_is_the_release_key_and_the_row_digest(target):
    conn_id, table, engine = target
    SQLTableSink(conn_id, table).prepare()
    reflected = sql_release_table(table)
    key = sa.inspect(engine).get_pk_constraint(reflected.name, schema=reflected.schema)["constrained_columns"]
    assert set(key) == {"dag_id", "run_id", "task_id", "map_index", "release_name", "row_digest"}


def test_a_key_of_any_length_is_written_and_replayed(target, tmp_path):
    conn_id, table, engine = target
    long_page = "https://example.org/?q=" + "".join(uuid.uuid4().hex for _ in range(3000))  # ~96 kB, incompressible
    output = release(tmp_path, [long_page, "/", "é" * 2000])
    sink = SQLTableSink(conn_id, table)
    sink.prepare()
    for _ in range(2):  # the first write, then a replay
        assert sink.write(output) == 3
        assert count_rows(engine, table) == 3
    with engine.connect() as conn:
        keys = conn.execute(sa.select(sql_release_table(table).c.key)).scalars().all()
    assert sorted(json.loads(k)["page"] for k in keys) == sorted([long_page, "/", "é" * 2000])


@pytest.mark.parametrize("target", ["postgresql"], indirect=True)
def test_row_digest_is_what_the_documented_postgresql_expression_computes(target, tmp_path):
    conn_id, table, engine = target
    output = release(tmp_path, ["/a", "東京", 'quote " and \\ backslash', "a\x00b"])
    SQLTableSink(conn_id, table).write(output)
    rows = sql_release_table(table)
    recomputed = sa.func.encode(sa.func.sha256(sa.func.convert_to(rows.c.aggregate + "\n" + rows.c.key, "UTF8")),
                                "hex")
    with engine.connect() as conn:
        pairs = conn.execute(sa.select(rows.c.row_digest, recomputed)).all()
    assert len(pairs) == 4
    assert all(stored == expected for stored, expected in pairs), pairs


def test_rows_carry_one_distinct_digest_per_value(tmp_path):
    output = release(tmp_path, [None, "None", 7, "7", "/a"])
    rows = SQLTableSink("unused", "t").rows(output)
    digests = [row["row_digest"] for row in rows]
    assert len(rows) == len(release_rows(output)) == 5
    assert len(set(digests)) == 5
    assert all(len(d) == 64 and set(d) <= set("0123456789abcdef") for d in digests)
    assert SQLTableSink("unused", "t").rows(json.loads(json.dumps(output))) == rows
