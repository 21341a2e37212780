"""Ledger database backends for tests: a SQLite file, and PostgreSQL in a throwaway database.

PostgreSQL: ``DP_LEDGER_TEST_PG_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``) names a server
and a database to connect to first. One database ``dp_ledger_test_<random>`` is created per test session and
dropped at its end; each test gets its own schema in it (through ``search_path`` in the URL, so worker processes
see the same tables). When the server cannot be reached the PostgreSQL cases are skipped with the reason, unless
``CI`` is set: then they fail, because CI must exercise both backends.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
import sqlalchemy as sa

from dp_operators.ledger import AccountConfig, Ledger, LedgerConfig
from support import governor, spender

PG_URL = os.environ.get("DP_LEDGER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql")]


def _admin_engine() -> sa.Engine:
    return sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})


@pytest.fixture(scope="session")
def pg_database() -> Iterator[sa.URL]:
    """A fresh PostgreSQL database for this session (dropped afterwards); skips or fails as the module says."""
    admin = _admin_engine()
    try:
        with admin.connect():
            pass
    except sa.exc.OperationalError as error:
        admin.dispose()
        reason = f"PostgreSQL not reachable at {admin.url.render_as_string()}: {str(error.orig).strip()[:200]}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: the PostgreSQL ledger tests must run)")
        pytest.skip(reason)
    name = f"dp_ledger_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(PG_URL).set(database=name)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def ledger_url(request, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty ledger database, once per backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    database: sa.URL = request.getfixturevalue("pg_database")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(database, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    engine.dispose()
    yield database.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


def account_config(
    accountant: str = "pure_dp",
    *,
    cap: object = None,
    epsilon: object = None,
    delta: object = None,
    dags: tuple[str, ...] = ("d",),
    **extra: object,
) -> AccountConfig:
    return AccountConfig(
        accountant=accountant,
        cap=None if cap is None else Fraction(str(cap)),
        epsilon=None if epsilon is None else Fraction(str(epsilon)),
        delta=None if delta is None else Fraction(str(delta)),
        privacy_unit="person",
        allowed_dags=list(dags),
        **extra,
    )


def ledger_with(url: str, **accounts: AccountConfig) -> Ledger:
    """An initialised ledger at ``url`` holding ``accounts``; returns the spender's view (the test spend key)."""
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts=accounts))
    return spender(url)
