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
from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path

import pytest
import sqlalchemy as sa

from dp_operators.ledger import AccountConfig, Ledger, LedgerConfig
from dp_operators.ledger import schema as ledger_schema
from support import governor, spender

PG_URL = os.environ.get("DP_LEDGER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql")]
#: A test marked with this runs on SQLite in ``make test`` and on PostgreSQL in ``make test-slow`` (ADR 30): a
#: costly test whose behaviour does not depend on the database (an answer given before the ledger is read, a
#: terminal's layout, a real process), or whose PostgreSQL side other tests of ``make test`` check.
SQLITE_FAST = pytest.mark.parametrize(
    "ledger_url", [pytest.param("sqlite", id="sqlite"),
                   pytest.param("postgresql", id="postgresql", marks=pytest.mark.slow)], indirect=True
)


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


def drop_scratch(conn: sa.Connection, schema: str | None, roles: Iterable[str]) -> None:
    """Drop a test's PostgreSQL schema (if given) and its login roles that still exist, with what they own or were
    granted (``conn``: an autocommit connection of the server's superuser)."""
    if schema is not None:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    for role in roles:
        if conn.exec_driver_sql(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'").first():
            conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
            conn.exec_driver_sql(f'DROP ROLE "{role}"')


@pytest.fixture(scope="module")
def pg_roles(pg_database) -> Iterator[tuple[str, str]]:
    """A spender and a governor login role for one test module (cluster-wide; dropped at the end)."""
    suffix = uuid.uuid4().hex[:8]
    roles = (f"dp_spender_{suffix}", f"dp_governor_{suffix}")
    admin = sa.create_engine(pg_database, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for role in roles:
            conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
    try:
        yield roles
    finally:
        with admin.connect() as conn:
            drop_scratch(conn, None, roles)
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


#: Columns each schema version added (old ledgers for the upgrade tests are the current tables without them).
V3_COLUMNS = {"dp_budget_accounts": {"spend_key_id"}, "dp_charges": {"token_hash", "lease_expires_at"},
              "dp_audit_events": {"token_hash", "proof", "key_id"}}
V2_COLUMNS = {"dp_budget_accounts": {"delta_spent", "config", "audit_seq", "audit_head"},
              "dp_charges": {"delta_amount", "context"}}


def old_schema_metadata(version: int) -> sa.MetaData:
    """The tables of schema ``version`` (1 or 2), for the upgrade tests."""
    dropped = {name: V3_COLUMNS.get(name, set()) | (V2_COLUMNS.get(name, set()) if version == 1 else set())
               for name in ("dp_budget_accounts", "dp_charges", "dp_audit_events")}
    tables = [ledger_schema.schema_version, ledger_schema.accounts, ledger_schema.charges]
    if version == 2:
        tables.append(ledger_schema.audit_events)
    metadata = sa.MetaData()
    for table in tables:
        unique = [sa.UniqueConstraint(*[c.name for c in constraint.columns], name=constraint.name)
                  for constraint in list(table.constraints) if isinstance(constraint, sa.UniqueConstraint)]
        sa.Table(table.name, metadata,
                 *[c._copy() for c in table.columns if c.name not in dropped.get(table.name, set())], *unique)
    return metadata
