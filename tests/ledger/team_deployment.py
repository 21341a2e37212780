"""A PostgreSQL ledger in a schema of its own with two teams (tests of worker logins): a spender and a governor
role, team roles ``team_a`` and ``team_b`` (members of the spender role), one login each, and the accounts a test
asks for. :func:`team_deployment` sets it up and drops every schema object and role after."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import sqlalchemy as sa

from dp_operators.ledger import AccountConfig, Ledger, LedgerConfig, LedgerGovernor
from dp_operators.ledger.team_roles import apply_team_roles
from ledger_backends import drop_scratch
from support import GOVERNOR_KEY, SPEND_KEY


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@dataclass
class Teams:
    database: sa.URL
    prefix: str
    schema: str = ""
    spender_role: str = ""
    governor_role: str = ""
    team_a: str = ""
    team_b: str = ""
    login_a: str = ""
    login_b: str = ""
    engines: list[sa.Engine] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("schema", "spender_role", "governor_role", "team_a", "team_b", "login_a", "login_b"):
            setattr(self, name, unique(f"{self.prefix}_{name}"))

    @property
    def roles(self) -> tuple[str, ...]:
        return (self.login_a, self.login_b, self.team_a, self.team_b, self.spender_role, self.governor_role)

    def url(self, role: str = "postgres") -> str:
        return (self.database.set(username=role).update_query_dict({"options": f"-csearch_path={self.schema}"})
                .render_as_string(hide_password=False))

    def engine(self, role: str, **kwargs) -> sa.Engine:
        engine = sa.create_engine(self.url(role), **kwargs)
        self.engines.append(engine)
        return engine

    def raw(self, role: str) -> sa.Engine:
        return self.engine(role, isolation_level="AUTOCOMMIT")

    def ledger(self, role: str, **kwargs) -> Ledger:
        ledger = Ledger(self.url(role), **{"audit_key": SPEND_KEY, **kwargs})
        self.engines += [ledger.engine, ledger._reader]
        return ledger

    def officer(self) -> LedgerGovernor:
        officer = LedgerGovernor(self.url(self.governor_role), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
        self.engines += [officer.engine, officer._reader]
        return officer

    def dispose(self) -> None:
        for engine in self.engines:
            engine.dispose()
        self.engines.clear()


@contextlib.contextmanager
def team_deployment(
    database: sa.URL, prefix: str, accounts: Callable[[Teams], Mapping[str, AccountConfig]],
    *, after_init: Callable[[Teams], None] | None = None,
) -> Iterator[Teams]:
    """The deployment (module docstring); ``accounts(teams)`` the accounts the governor applies, ``after_init`` run
    as the owner after ``init`` and before the roles (e.g. to give a table an earlier version's shape)."""
    t = Teams(database, prefix)
    admin = sa.create_engine(database, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{t.schema}"')
            for role in (t.spender_role, t.governor_role):
                conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        owner = LedgerGovernor(t.url(), governor_key=GOVERNOR_KEY, spend_key=SPEND_KEY)
        t.engines += [owner.engine, owner._reader]
        owner.init_schema()
        if after_init is not None:
            after_init(t)
        apply_team_roles(t.url(), [t.team_a, t.team_b], t.spender_role, t.governor_role, create=True)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE ROLE "{t.login_a}" LOGIN IN ROLE "{t.team_a}"')
            conn.exec_driver_sql(f'CREATE ROLE "{t.login_b}" LOGIN IN ROLE "{t.team_b}"')
        t.officer().apply_config(LedgerConfig(version=1, accounts=dict(accounts(t))))
        t.dispose()
        yield t
    finally:
        t.dispose()
        with admin.connect() as conn:
            drop_scratch(conn, t.schema, t.roles)
        admin.dispose()
