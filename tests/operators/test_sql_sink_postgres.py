"""SQLTableSink (sinks.py:226-393) on the local PostgreSQL: the checks ``prepare()`` makes before the
reservation, and what still fails after the commit."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from dp_operators.ledger import ReleaseKey
from dp_operators.operators.sinks import SQLTableSink, sql_release_table
from dp_operators.release import run_release
from dp_operators.spec import SpecError, load_spec_with_hash

from operator_specs import selected_count_spec
from sql_targets import database_target
from support import make_ledger

DAG = "sink_pg_dag"
ACCOUNT = "sink_pg_account"


@pytest.fixture
def pg_sink(tmp_path, monkeypatch):
    """``(conn_id, table, engine)`` on the local PostgreSQL (tests/sql_targets.py)."""
    yield from database_target("postgresql", tmp_path, monkeypatch, "sink_pg_pg")


def test_concurrent_first_releases_all_pass_the_sink_check(pg_sink):
    """The first run of a mapped release (8 instances at once; the scheduler scale tests run parallelism >= 4)
    calls ``prepare()`` -> ``create_all(checkfirst=True)`` concurrently: check-then-create races, and the losers get
    DuplicateTable / UniqueViolation(pg_type). The operator turns that into 'the SQL sink's database failed' —
    retryable, but Airflow's default is retries=0, so those instances fail their run. (A race: 5 fresh tables are
    tried; one round alone loses about 4 times in 5.)"""
    conn_id, _, engine = pg_sink
    errors: list[str] = []
    for _ in range(5):
        table = f"public.sink_pg_{uuid.uuid4().hex[:10]}"
        barrier = threading.Barrier(8)

        def instance() -> None:
            barrier.wait()
            try:
                SQLTableSink(conn_id, table).prepare()
            except Exception as error:  # noqa: BLE001
                errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:100]}")

        threads = [threading.Thread(target=instance) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with engine.begin() as conn:
            sql_release_table(table).drop(conn, checkfirst=True)
    assert not errors, f"{len(errors)} of 40 concurrent prepare() calls failed: {errors[:3]}"


def _release(tmp_path: Path, name: str, page: str) -> dict:
    spec_path = tmp_path / "urls.yaml"
    spec_path.write_text(selected_count_spec("sink_pg_urls", ACCOUNT, name, "page"))
    spec, digest = load_spec_with_hash(spec_path)
    ledger = make_ledger(tmp_path / f"ledger-{uuid.uuid4().hex[:6]}.db", cap="100", accountant="approx_dp",
                         dags=(DAG,), account=ACCOUNT)
    key = ReleaseKey(DAG, "scheduled__2026-01-01T00:00:00+00:00", "release", -1, spec.release)
    return run_release(spec, {name: [{"page": page, "count": 10**6}]}, ledger, key, spec_hash=digest).output


def test_a_long_selected_key_reaches_the_table(tmp_path, pg_sink):
    """Under partition selection a released key can be any text (a URL, a referrer). The table's primary key holds
    it (``key`` TEXT in a composite B-tree key): a key of ~3 kB exceeds PostgreSQL's B-tree row limit (2704 bytes),
    so the insert fails *after the commit*, on every retry."""
    conn_id, table, engine = pg_sink
    output = _release(tmp_path, "views_by_page", "https://example.org/?q=" + "".join(uuid.uuid4().hex for _ in range(100)))
    SQLTableSink(conn_id, table).prepare()
    SQLTableSink(conn_id, table).write(output)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(sql_release_table(table))).scalar() == 1


def test_a_long_aggregate_name_is_refused_before_the_charge_or_written(tmp_path, pg_sink):
    """The spec puts no length limit on aggregate names (spec/models.py _NAME) and ``aggregate`` is in the primary key:
    a 3200-character name is known from the spec alone, passes ``prepare()``, is charged, and fails the insert.

    (Edited by the fix: the spec refuses names above 200 characters before anything is charged, and the longest
    name it accepts is written.)"""
    conn_id, table, engine = pg_sink
    name = "a" + "".join(uuid.uuid4().hex for _ in range(100))  # incompressible (B-tree tuples are compressed)
    with pytest.raises(SpecError, match="at most 200 characters"):
        _release(tmp_path, name, "/home")
    output = _release(tmp_path, name[:200], "/home")
    SQLTableSink(conn_id, table).prepare()
    SQLTableSink(conn_id, table).write(output)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sql_release_table(table).c.aggregate)).scalars().all() == [name[:200]]
