"""Team roles: PostgreSQL roles that bind budget accounts to the logins allowed to spend from them.

An account's ``allowed_roles`` (``config/ledgers.yaml``, :class:`~dp_operators.ledger.config.AccountConfig`) names
database roles; the ledger's spend functions refuse a reservation on that account unless the session's login is a
member of one of them, whatever ``dag_id`` the worker claims. ``allowed_dags`` is what the worker says;
``allowed_roles`` is who the database knows the worker logged in as.

The shape, per team (docs/ledger.md, "Team roles"):

* a **team role** (``NOLOGIN``, e.g. ``team_census``), named in the ``allowed_roles`` of the team's accounts and a
  member of the spender role, so it holds the spender's privileges and nothing else;
* the team's **login roles** (what its workers' ledger connection logs in as), members of the team role:
  ``CREATE ROLE census_worker LOGIN PASSWORD '...' IN ROLE team_census``.

:func:`team_role_statements` is the SQL ``dpctl ledger roles --config ledgers.yaml`` prints (or runs with
``--execute``): optionally create the team roles, refuse the roles that must not receive the spender's privileges
(the same refusals as :mod:`dp_operators.ledger.roles`, plus a team role inside another team role or the
governor role), revoke any privilege granted to them directly on the ledger's tables, sequences and functions (so
they converge on the spender's privileges only), and grant them the spender role. Idempotent.

On SQLite there are no roles: ``allowed_roles`` is recorded and signed but nothing enforces it (whoever can write
the file governs it).

Importing this module loads nothing heavy (the configuration models use :func:`role_name_problem`); the SQL
functions import SQLAlchemy and the ledger's tables when called.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from dp_operators.ledger.config import LedgerConfig
    from dp_operators.ledger.store import LedgerBase

#: A plain PostgreSQL role name: what :mod:`dp_operators.ledger.roles` accepts (quoted, so case-sensitive).
ROLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

#: Names PostgreSQL reserves (``public``, ``none``) or reads as something else in a role specification.
RESERVED_ROLE_NAMES = frozenset({"public", "none", "current_user", "session_user", "current_role"})


def role_name_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a team role name (``"is not a plain PostgreSQL role name: ..."``), or
    ``None`` if it is a plain, unreserved role name."""
    if not isinstance(name, str) or not ROLE_NAME.fullmatch(name):
        return (
            "is not a plain PostgreSQL role name: use 1-63 letters, digits and underscores, starting with a letter "
            "or an underscore"
        )
    if name.lower() in RESERVED_ROLE_NAMES or name.lower().startswith("pg_"):
        return "is reserved by PostgreSQL (public, none, current_user, session_user, current_role, pg_*): choose another name"
    return None


def team_roles(config: LedgerConfig) -> dict[str, tuple[str, ...]]:
    """``{team role: the accounts whose allowed_roles name it}`` of a ledger configuration, both sorted."""
    found: dict[str, set[str]] = {}
    for account, settings in config.all_accounts().items():
        for role in settings.allowed_roles or ():
            found.setdefault(role, set()).add(account)
    return {role: tuple(sorted(found[role])) for role in sorted(found)}


def _quoted(name: str) -> str:
    problem = role_name_problem(name)
    if problem is not None:
        raise ValueError(f"team role {name!r} {problem}")
    return f'"{name}"'


def _literal(name: str) -> str:
    return f"'{name}'"  # only ever called on a name _quoted accepted: no quote can occur in it


def team_role_statements(
    teams: Iterable[str],
    spender_role: str,
    *,
    governor_role: str | None = None,
    reader_role: str | None = None,
    create: bool = False,
) -> list[str]:
    """The SQL (PostgreSQL only) making each of ``teams`` a team role: a member of ``spender_role`` with no other
    privilege on the ledger.

    In order: optionally create the team roles (``NOLOGIN``) if missing; refuse a team role that does not exist,
    is a superuser, may create roles, owns the ledger's tables or is a member of their owner (its members could
    drop or disable the guard triggers), is a member of another of ``teams`` (its members could spend that team's
    accounts) or of ``governor_role``; revoke every privilege granted to the team roles directly on the ledger's
    tables, sequences and functions; grant them ``spender_role``. Idempotent. Run after
    :func:`dp_operators.ledger.roles.role_statements` (the spender's grants), as a role that may grant membership
    in the spender role (a superuser, or one with ``CREATEROLE``; PostgreSQL 16 and later: one with ``ADMIN
    OPTION`` on the spender role, as its creator has), with the ledger's ``search_path``.

    Args:
        teams: the team role names (e.g. the keys of :func:`team_roles`); duplicates are ignored.
        spender_role: the ledger's spender role, whose privileges the team roles receive.
        governor_role, reader_role: the ledger's other roles, if any: a team role may be neither.
        create: also create the team roles if they do not exist.

    Returns:
        The statements, each runnable on its own (``DO`` blocks for the conditional parts); none if ``teams`` is
        empty.

    Raises:
        ValueError: a name that is not a plain role name or is reserved; a team role that is the spender, governor
            or reader role.
    """
    from dp_operators.ledger.roles import LEDGER_FUNCTIONS, LEDGER_SEQUENCES, LEDGER_TABLES

    names = sorted(set(teams))
    if not names:
        return []
    spender = _quoted(spender_role)
    others = {spender_role: "spender", governor_role: "governor", reader_role: "reader"}
    for name in names:
        _quoted(name)
        what = others.get(name)
        if what == "spender":
            raise ValueError(
                f"team role {name!r} is the spender role: every worker's login is a member of it, so it binds "
                "nothing; name a team role of its own (e.g. team_census), or leave allowed_roles out"
            )
        if what is not None:
            raise ValueError(
                f"team role {name!r} is the {what} role: a team role receives the spender's privileges, which the "
                f"{what} must not hold; name a team role of its own (e.g. team_census)"
            )
    quoted = [f'"{name}"' for name in names]
    statements: list[str] = []
    if create:
        statements += [
            "DO $$ BEGIN "
            f"IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = {_literal(name)}) THEN "
            f"CREATE ROLE {role} NOLOGIN; END IF; END $$"
            for name, role in zip(names, quoted)
        ]
    owned = ", ".join(f"'{table}'::regclass" for table in LEDGER_TABLES)
    for name in names:
        role = _literal(name)
        other_teams = ", ".join(_literal(other) for other in names if other != name)
        inside_team = (
            f"IF EXISTS (SELECT FROM pg_catalog.pg_roles o WHERE o.rolname IN ({other_teams}) "
            f"AND pg_catalog.pg_has_role({role}, o.oid, 'MEMBER')) THEN "
            "RAISE EXCEPTION 'team role % is a member of another team role, so its members could spend that "
            f"team''s accounts: revoke that membership (list both roles in allowed_roles instead)', {role}; END IF; "
            if other_teams
            else ""
        )
        inside_governor = (
            f"IF EXISTS (SELECT FROM pg_catalog.pg_roles g WHERE g.rolname = {_literal(governor_role)} "
            f"AND pg_catalog.pg_has_role({role}, g.oid, 'MEMBER')) THEN "
            "RAISE EXCEPTION 'team role % is a member of the governor role %: workers must not govern; revoke that "
            f"membership', {role}, {_literal(governor_role)}; END IF; "
            if governor_role is not None
            else ""
        )
        statements.append(
            "DO $$ BEGIN "
            f"IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = {role}) THEN "
            "RAISE EXCEPTION 'team role % does not exist: create it as a NOLOGIN role, or let these statements "
            f"create it (dpctl ledger roles --create)', {role}; END IF; "
            f"IF EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = {role} "
            "AND (r.rolsuper OR r.rolcreaterole)) "
            f"OR EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid IN ({owned}) "
            f"AND pg_catalog.pg_has_role({role}, c.relowner, 'MEMBER')) THEN "
            "RAISE EXCEPTION 'team role % owns the ledger tables (or is a member of their owner, a superuser, or "
            "may create roles), so its members could drop or disable the guard triggers: name a team role that is "
            f"not', {role}; END IF; "
            f"{inside_team}{inside_governor}END $$"
        )
    roles = ", ".join(quoted)
    statements += [
        f"REVOKE ALL ON TABLE {', '.join(LEDGER_TABLES)} FROM {roles}",
        f"REVOKE ALL ON SEQUENCE {', '.join(LEDGER_SEQUENCES)} FROM {roles}",
        f"REVOKE ALL ON FUNCTION {', '.join(LEDGER_FUNCTIONS)} FROM {roles}",
        f"GRANT {spender} TO {roles}",
    ]
    return statements


def apply_team_roles(
    engine: Engine | str,
    teams: Iterable[str],
    spender_role: str,
    governor_role: str,
    *,
    reader_role: str | None = None,
    create: bool = False,
) -> list[str]:
    """Run the ledger's role grants (:func:`dp_operators.ledger.roles.role_statements`) and then
    :func:`team_role_statements` in one transaction on ``engine`` (connected as the tables' owner, or a superuser,
    that may also grant membership in the spender role; with the ledger's ``search_path``): a refusal changes
    nothing. Returns the statements run.

    Raises:
        ValueError: a bad or reserved role name, a team role that is one of the ledger's roles, a database other
            than PostgreSQL, or a role the database check refuses (missing without ``create``, a superuser, may
            create roles, owns the tables or is a member of their owner, inside another team role or the
            governor role; nothing is changed).
        sqlalchemy.exc.DBAPIError: the database refused, e.g. the ledger has no schema, or the connecting role
            may not grant.
    """
    from dp_operators.ledger.roles import role_statements, run_grant_statements

    statements = role_statements(spender_role, governor_role, reader_role=reader_role, create=create)
    statements += team_role_statements(
        teams, spender_role, governor_role=governor_role, reader_role=reader_role, create=create
    )
    return run_grant_statements(
        engine, statements,
        not_postgresql="team roles are database roles, a PostgreSQL feature; this ledger is {dialect}, where "
        "allowed_roles is recorded but not enforced: whoever can write the ledger file governs it "
        "(docs/ledger.md, Team roles)",
    )


def missing_roles(engine: Engine, names: Iterable[str]) -> list[str]:
    """Those of ``names`` that are not roles of the PostgreSQL cluster ``engine`` reaches (sorted); any role may
    read ``pg_roles``."""
    import sqlalchemy as sa

    wanted = sorted(set(names))
    if not wanted:
        return []
    query = sa.text("SELECT rolname FROM pg_catalog.pg_roles WHERE rolname IN :names").bindparams(
        sa.bindparam("names", expanding=True)
    )
    with engine.connect() as conn:
        found = set(conn.execute(query, {"names": wanted}).scalars())
    return [name for name in wanted if name not in found]


def stored_allowed_roles(base: LedgerBase) -> dict[str, str | None]:
    """``{account: its stored allowed_roles}`` (the JSON text, or ``None``: any spender) of every account."""
    import sqlalchemy as sa

    from dp_operators.ledger import schema

    base.check_schema()
    accounts = schema.accounts.c
    with base._read() as conn:
        return {name: roles for name, roles in conn.execute(sa.select(accounts.name, accounts.allowed_roles))}


def describe_allowed_roles(stored: str | None) -> str:
    """A stored ``allowed_roles`` as ``dpctl`` prints it: ``"team_a, team_b"``, ``"any spender"`` (``None``), or the
    text itself, marked unreadable, if it is not a JSON list of role names (edited outside ``apply``)."""
    import json

    if stored is None:
        return "any spender"
    try:
        roles = json.loads(stored)
    except ValueError:
        roles = None
    if not isinstance(roles, list) or not roles or any(role_name_problem(role) for role in roles):
        return f"unreadable: {stored!r}"
    return ", ".join(roles)


def allowed_roles_text(roles: Any) -> str | None:
    """The stored form of an ``allowed_roles`` list: canonical JSON of the sorted, distinct names (``None`` stays
    ``None``: any spender)."""
    if roles is None:
        return None
    from dp_operators.ledger.chain import canonical_json

    return canonical_json(sorted(set(roles)))
