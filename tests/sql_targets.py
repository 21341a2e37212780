"""A database for the SQL sink's tests: an Airflow connection (``AIRFLOW_CONN_...``), a table name not yet used and
an engine to look at it, on SQLite or on the local PostgreSQL (skipped with the reason when the server is down,
failed when ``CI`` is set; the table dropped after)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from dp_operators.operators.sinks import sql_release_table
from ledger_backends import PG_URL


def database_target(backend: str, tmp_path: Path, monkeypatch, conn_id: str) -> Iterator[tuple[str, str, sa.Engine]]:
    """Yield ``(conn_id, table, engine)`` on ``backend`` (``sqlite`` or ``postgresql``); use from a fixture with
    ``yield from``."""
    table = f"dp_rows_{uuid.uuid4().hex[:10]}"
    variable = f"AIRFLOW_CONN_{conn_id.upper()}"
    if backend == "sqlite":
        path = tmp_path / f"{conn_id}.db"
        monkeypatch.setenv(variable, json.dumps({"conn_type": "sqlite", "host": str(path)}))
        engine = sa.create_engine(f"sqlite:///{path}")
        yield conn_id, table, engine
        engine.dispose()
        return
    url = sa.make_url(PG_URL)
    engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as error:
        engine.dispose()
        reason = f"PostgreSQL not reachable at {url.render_as_string()}: {str(error.orig).strip()[:200]}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: the PostgreSQL sink tests must run)")
        pytest.skip(reason)
    monkeypatch.setenv(variable, json.dumps({
        "conn_type": "postgres", "host": url.host, "port": url.port or 5432, "login": url.username,
        "password": url.password, "schema": url.database}))
    table = f"public.{table}"  # schema-qualified on PostgreSQL
    yield conn_id, table, engine
    with engine.begin() as conn:
        sql_release_table(table).drop(conn, checkfirst=True)
    engine.dispose()
