"""PostgreSQL roles of the ledger: the database, not only the Python API, decides who may spend and who may govern.

Three roles (docs/adr/0020, docs/adr/0029), the third optional:

* the **spender** (what release tasks connect as) may read every ledger table and execute the spend functions
  (``dp_reserve``, ``dp_commit``, ``dp_release``, ``dp_abandon``, ``dp_renew``, ``dp_reconcile``:
  :mod:`~dp_operators.ledger.pg_functions`), and nothing else: no INSERT, UPDATE, DELETE or TRUNCATE on any table,
  no sequence. The functions belong to the tables' owner and run with its rights (``SECURITY DEFINER``); they write
  only what the ledger's state machine allows, stamp time and caller from the database, and check the spend key,
  the reservation token, the lease, the budget and the account's team roles (``allowed_roles``). So the spender
  can neither change a cap, an allowlist or a spend key id, nor forge a charge, an event, a running total, a
  timestamp or another worker's reservation.
* the **governor** (what the privacy officer's ``dpctl ledger apply`` and ``reconcile`` connect as) may read
  everything, create accounts and update every account column but ``name`` and ``created_at``, insert audit events,
  and move a charge's ``state`` (reconcile's ``abandoned``, signed with the governor key, runs the Python path).
* the **reader** (e.g. the budget dashboard's connection, issue 12) may read every ledger table and nothing else:
  no INSERT, UPDATE, DELETE or TRUNCATE, no sequence, no function, so it can neither spend nor change a cap. Nor
  can it lock rows (``FOR UPDATE`` and ``FOR SHARE`` need an UPDATE privilege), so it cannot hold up a spender's
  check-and-charge; neither can the spender any more, outside the functions' own transactions.

None may own the tables or the functions: the owner (the admin role that ran ``dpctl ledger init``) is the only one
who can drop, disable or replace the guard triggers and the functions (PostgreSQL allows ``ALTER TABLE ... DISABLE
TRIGGER``, ``DROP TRIGGER`` and ``CREATE OR REPLACE FUNCTION`` only to the owner of the table or function). The
generated SQL refuses to grant to a role that owns the tables, is a member of their owner, is a superuser or may
create roles (a superuser ignores every privilege check, so a "read-only" superuser could still write), and
revokes CREATE on the ledger's schema from PUBLIC and the three roles, so nobody else can add an object the
functions' pinned ``search_path`` would find.

Run it after ``dpctl ledger init`` (the functions must exist to be granted), and again after an upgrade from
schema 3: it revokes the spender's old table privileges and grants the functions.

The statements use unqualified table names and ``current_schema()``: run them with the same ``search_path`` as the
ledger's connections (``dpctl ledger roles`` uses the ledger's URL).
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dp_operators.ledger import pg_functions, schema

#: The ledger's tables.
LEDGER_TABLES = (
    schema.schema_version.name,
    schema.accounts.name,
    schema.charges.name,
    schema.audit_events.name,
)

#: The sequences behind the tables' serial keys (PostgreSQL names them ``<table>_<column>_seq``).
CHARGE_ID_SEQUENCE = "dp_charges_id_seq"
AUDIT_ID_SEQUENCE = "dp_audit_events_id_seq"
LEDGER_SEQUENCES = (CHARGE_ID_SEQUENCE, AUDIT_ID_SEQUENCE, "dp_schema_version_version_seq")

#: The functions the spender may execute, and every function of the ledger (revoked from everybody else).
SPEND_FUNCTIONS = tuple(function.signature for function in pg_functions.SPEND_FUNCTIONS)
LEDGER_FUNCTIONS = tuple(function.signature for function in pg_functions.FUNCTIONS)

#: Account columns the governor may update: all but the primary key (charges and events refer to it) and the
#: creation time.
GOVERNOR_ACCOUNT_COLUMNS = tuple(c.name for c in schema.accounts.c if c.name not in ("name", "created_at"))

#: Charge columns the governor may update: reconcile marks expired reservations ``abandoned``.
GOVERNOR_CHARGE_COLUMNS = ("state", "updated_at")

_ROLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _role(name: str, what: str) -> str:
    """``name`` as a quoted identifier, after checking it is a plain role name.

    Raises:
        ValueError: not 1-63 letters, digits and underscores starting with a letter or underscore, or a name
            PostgreSQL reserves (``public``, ``pg_*``).
    """
    if not isinstance(name, str) or not _ROLE_NAME.fullmatch(name):
        raise ValueError(
            f"{what} role {name!r} is not a plain role name: use 1-63 letters, digits and underscores, starting "
            "with a letter or an underscore"
        )
    if name.lower() == "public" or name.lower().startswith("pg_"):
        raise ValueError(f"{what} role {name!r} is reserved by PostgreSQL; choose another name")
    return f'"{name}"'


def _literal(name: str) -> str:
    return f"'{name}'"  # only ever called on a name _role accepted: no quote can occur in it


def _columns(names: tuple[str, ...]) -> str:
    return ", ".join(names)


def role_statements(
    spender_role: str, governor_role: str, *, reader_role: str | None = None, create: bool = False
) -> list[str]:
    """The SQL (PostgreSQL only) giving ``spender_role``, ``governor_role`` and optionally ``reader_role`` exactly
    the ledger's privileges.

    In order: optionally create the roles (``NOLOGIN``: grant them to login roles, or ``ALTER ROLE ... LOGIN``);
    refuse roles that own the tables, are members of their owner, are superusers or may create roles; revoke every
    privilege on the ledger's tables, sequences and functions from ``PUBLIC`` and from the roles (so re-running
    converges on exactly these grants); grant ``USAGE`` on the ledger's schema (``current_schema()``) and revoke
    ``CREATE`` on it from ``PUBLIC`` and the roles; then the grants of each role (module docstring). Idempotent.
    Run as the tables' owner (or a superuser), with the ledger's ``search_path``, after ``dpctl ledger init``.

    Args:
        spender_role, governor_role: role names (letters, digits, underscores; case-sensitive, as quoted
            identifiers). They must differ.
        reader_role: a role that may only read (``SELECT`` on every ledger table, no sequence), e.g. for the
            budget dashboard; a role of its own, different from the other two. ``None``: no reader.
        create: also create the roles if they do not exist.

    Returns:
        The statements, each runnable on its own (``DO`` blocks for the conditional parts).

    Raises:
        ValueError: a role name that is not plain, reserved, or two roles the same.
    """
    spender = _role(spender_role, "spender")
    governor = _role(governor_role, "governor")
    if spender_role == governor_role:
        raise ValueError("the spender and the governor must be different roles: tasks connect as the spender")
    granted = [spender, governor]
    reader = None
    if reader_role is not None:
        reader = _role(reader_role, "reader")
        if reader_role in (spender_role, governor_role):
            other = "spender" if reader_role == spender_role else "governor"
            raise ValueError(
                f"the reader role {reader_role!r} is also the {other} role: a reader may only read, so give it a "
                "role of its own (e.g. dp_ledger_reader)"
            )
        granted.append(reader)
    tables = ", ".join(LEDGER_TABLES)
    sequences = ", ".join(LEDGER_SEQUENCES)
    roles = ", ".join(granted)
    statements: list[str] = []
    if create:
        for quoted in granted:
            statements.append(
                "DO $$ BEGIN "
                f"IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = {_literal(quoted[1:-1])}) THEN "
                f"CREATE ROLE {quoted} NOLOGIN; END IF; END $$"
            )
    owned = ", ".join(f"'{table}'::regclass" for table in LEDGER_TABLES)
    for quoted in granted:
        name = _literal(quoted[1:-1])
        statements.append(
            "DO $$ BEGIN "
            f"IF EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = {name} "
            "AND (r.rolsuper OR r.rolcreaterole)) "
            f"OR EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid IN ({owned}) "
            f"AND pg_catalog.pg_has_role({name}, c.relowner, 'MEMBER')) THEN "
            f"RAISE EXCEPTION 'role % owns the ledger tables (or is a member of their owner, a superuser, or may "
            "create roles), so it could drop or disable the guard triggers: grant the ledger privileges to a role "
            f"that is not', {name}; END IF; END $$"
        )
    names = ", ".join(_literal(quoted[1:-1]) for quoted in granted)
    placeholders = ", ".join(["%I"] * len(granted))
    statements += [
        f"REVOKE ALL ON TABLE {tables} FROM PUBLIC, {roles}",
        f"REVOKE ALL ON SEQUENCE {sequences} FROM PUBLIC, {roles}",
        f"REVOKE ALL ON FUNCTION {', '.join(LEDGER_FUNCTIONS)} FROM PUBLIC, {roles}",
        "DO $$ BEGIN "
        "IF current_schema() IS NULL THEN RAISE EXCEPTION 'no schema on the search_path: set the search_path of "
        "the ledger''s connection'; END IF; "
        f"EXECUTE format('GRANT USAGE ON SCHEMA %I TO {placeholders}', current_schema(), {names}); "
        f"EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC, {placeholders}', current_schema(), {names}); "
        "END $$",
        # the spender: read, and spend only through the functions (it writes no table)
        f"GRANT SELECT ON TABLE {tables} TO {spender}",
        f"GRANT EXECUTE ON FUNCTION {', '.join(SPEND_FUNCTIONS)} TO {spender}",
        # the governor: read, govern accounts, sign events, abandon expired reservations
        f"GRANT SELECT ON TABLE {tables} TO {governor}",
        f"GRANT INSERT ON TABLE {schema.accounts.name}, {schema.audit_events.name} TO {governor}",
        f"GRANT UPDATE ({_columns(GOVERNOR_ACCOUNT_COLUMNS)}) ON TABLE {schema.accounts.name} TO {governor}",
        f"GRANT UPDATE ({_columns(GOVERNOR_CHARGE_COLUMNS)}) ON TABLE {schema.charges.name} TO {governor}",
        f"GRANT USAGE ON SEQUENCE {AUDIT_ID_SEQUENCE} TO {governor}",
    ]
    if reader is not None:
        # the reader: read, and nothing else (no sequence either: it never inserts)
        statements.append(f"GRANT SELECT ON TABLE {tables} TO {reader}")
    return statements


def apply_roles(
    engine: Engine | str,
    spender_role: str,
    governor_role: str,
    create: bool = False,
    *,
    reader_role: str | None = None,
) -> list[str]:
    """Run :func:`role_statements` in one transaction on ``engine`` (connected as the tables' owner or a
    superuser, with the ledger's ``search_path``). ``reader_role``: the optional read-only role (as in
    :func:`role_statements`). Returns the statements run.

    Raises:
        ValueError: a bad role name, two roles the same, a database other than PostgreSQL, or a role that may not
            receive the grants (it owns the tables, is a member of their owner, a superuser or may create roles;
            nothing is changed).
        sqlalchemy.exc.DBAPIError: the database refused, e.g. the roles do not exist (without ``create``), the
            ledger has no schema, or the connecting role may not grant (not the owner).
    """
    statements = role_statements(spender_role, governor_role, reader_role=reader_role, create=create)
    return run_grant_statements(
        engine, statements,
        not_postgresql="database roles are a PostgreSQL feature; this ledger is {dialect} (on SQLite, file "
        "permissions decide who may write: docs/ledger.md)",
    )


def run_grant_statements(engine: Engine | str, statements: list[str], *, not_postgresql: str) -> list[str]:
    """Run ``statements`` in one transaction on ``engine`` (PostgreSQL only); returns them.

    Raises:
        ValueError: another database (``not_postgresql``, with ``{dialect}`` filled in), or a ``RAISE EXCEPTION``
            of the statements' own checks (SQLSTATE P0001: its message); nothing is changed.
        sqlalchemy.exc.DBAPIError: any other refusal of the database.
    """
    owned_engine = isinstance(engine, str)
    bound = sa.create_engine(engine) if isinstance(engine, str) else engine
    try:
        if bound.dialect.name != "postgresql":
            raise ValueError(not_postgresql.format(dialect=bound.dialect.name))
        try:
            with bound.begin() as conn:
                for statement in statements:
                    conn.exec_driver_sql(statement.replace("%", "%%"))  # the driver's paramstyle escapes %
        except sa.exc.DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) == "P0001":  # a RAISE EXCEPTION of the statements' checks
                diag = getattr(error.orig, "diag", None)
                raise ValueError(getattr(diag, "message_primary", None) or str(error.orig)) from None
            raise
    finally:
        if owned_engine:
            bound.dispose()
    return statements
