"""The ledger's tables (SQLAlchemy Core; the same schema on SQLite and PostgreSQL).

Exact numbers are stored as text (``str(Fraction)``, e.g. ``"1/3"``) so no database type rounds them. The account
row keeps running totals (``spent``, ``delta_spent``) and the head of its audit chain (``audit_seq``,
``audit_head``), so a budget check and an audit append cost the same with one or a million prior charges.

``dp_charges`` is mutable (a charge changes state); ``dp_audit_events`` is the append-only record: database
triggers refuse UPDATE and DELETE on it (:func:`audit_trigger_ddl`), and each row carries the SHA-256 of the
previous row of its account's chain.

Version history (``dp_schema_version``): 1 — accounts and charges (the first cut); 2 — delta totals, charge
context, the audit event table and its triggers; 3 — keyed audit chain (``key_id``, ``spend_key_id``), reservation
tokens and leases (``token_hash``, ``proof``, ``lease_expires_at``), guard triggers on charges and accounts; 4 —
``allowed_roles`` (the database roles whose members may spend from an account) and, on PostgreSQL, the spend
functions: the spender role executes them and writes no table (docs/adr/0029); later in 4, the release key's
unique constraint includes the account (``uq_release_attempt_account``; on PostgreSQL ``dpctl ledger init`` replaces
the earlier ``uq_release_attempt``).
:mod:`dp_operators.ledger.govern` upgrades older versions in place.

Database triggers (both dialects, :func:`trigger_ddl`) make ``dp_audit_events`` append-only, keep every charge
and account row (no DELETE), and let a charge change only its state (``reserved`` to ``committed``, ``released``
or ``abandoned``, once), its output and its lease. The tables are owned by the role that ran ``dpctl ledger init``,
so the spender and governor roles cannot drop or disable them (docs/adr/0020).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

#: Bumped when the tables change; ``dpctl ledger init`` records it and the ledger refuses other versions.
SCHEMA_VERSION = 4

metadata = MetaData()

_ID = BigInteger().with_variant(Integer, "sqlite")

#: A charge's release key and attempt are unique per account: the ledger reads a key's charges on the caller's account
#: only (replay, leases, takeover), so two accounts' charges of one key (a DAG id allowed on accounts of two teams)
#: must never wait for each other either, as a unique index makes an INSERT wait for an uncommitted row with the same
#: values. The release key's columns lead, so the index also serves lookups by key and by DAG and run.
RELEASE_ATTEMPT_CONSTRAINT = "uq_release_attempt_account"
RELEASE_ATTEMPT_COLUMNS = ("dag_id", "run_id", "task_id", "map_index", "release_name", "account", "attempt")
#: The constraint ledgers had before (the release key and attempt, not the account): on PostgreSQL ``dpctl ledger
#: init`` replaces it; SQLite files keep it (docs/adr/0029).
OLD_RELEASE_ATTEMPT_CONSTRAINT = "uq_release_attempt"

schema_version = Table(
    "dp_schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", DateTime(timezone=True), nullable=False),
)

accounts = Table(
    "dp_budget_accounts",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("accountant", String(20), nullable=False),
    Column("cap", Text, nullable=False),
    Column("spent", Text, nullable=False),
    Column("delta", Text, nullable=True),
    Column("delta_spent", Text, nullable=False, server_default="0"),
    Column("privacy_unit", String(200), nullable=False),
    Column("allowed_dags", Text, nullable=False),
    #: JSON list of database roles (PostgreSQL) whose members may spend from the account; NULL: any spender.
    Column("allowed_roles", Text, nullable=True),
    Column("owner", String(200), nullable=True),
    Column("description", Text, nullable=True),
    Column("config", Text, nullable=True),
    Column("spend_key_id", String(16), nullable=True),
    Column("audit_seq", Integer, nullable=False, server_default="0"),
    Column("audit_head", String(64), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

charges = Table(
    "dp_charges",
    metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("account", String(200), ForeignKey("dp_budget_accounts.name"), nullable=False),
    Column("dag_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("task_id", String(250), nullable=False),
    Column("map_index", Integer, nullable=False),
    Column("release_name", String(200), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("state", String(20), nullable=False),
    Column("amount", Text, nullable=False),
    Column("delta_amount", Text, nullable=False, server_default="0"),
    Column("mechanisms", Text, nullable=False),
    Column("spec_hash", String(64), nullable=False),
    Column("try_number", Integer, nullable=True),
    Column("context", Text, nullable=True),
    Column("output", Text, nullable=True),
    Column("output_digest", String(64), nullable=True),
    Column("token_hash", String(64), nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint(*RELEASE_ATTEMPT_COLUMNS, name=RELEASE_ATTEMPT_CONSTRAINT),
    Index("ix_dp_charges_account_state", "account", "state"),
)

#: Every column except ``id`` and ``row_hash`` enters the row's MAC; values are text or integers so they read back
#: from either database exactly as they were written.
audit_events = Table(
    "dp_audit_events",
    metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("account", String(200), nullable=False),
    Column("account_seq", Integer, nullable=False),
    Column("event", String(40), nullable=False),
    Column("charge_id", _ID, nullable=True),
    Column("dag_id", String(250), nullable=True),
    Column("run_id", String(250), nullable=True),
    Column("task_id", String(250), nullable=True),
    Column("map_index", Integer, nullable=True),
    Column("release_name", String(200), nullable=True),
    Column("attempt", Integer, nullable=True),
    Column("try_number", Integer, nullable=True),
    Column("spec_hash", String(64), nullable=True),
    Column("amount", Text, nullable=True),
    Column("delta_amount", Text, nullable=True),
    Column("spent_after", Text, nullable=False),
    Column("delta_spent_after", Text, nullable=False),
    Column("mechanisms", Text, nullable=True),
    Column("output_digest", String(64), nullable=True),
    Column("context", Text, nullable=False),
    Column("details", Text, nullable=True),
    Column("created_at", String(40), nullable=False),
    Column("token_hash", String(64), nullable=True),
    Column("proof", String(100), nullable=True),
    Column("key_id", String(16), nullable=True),
    Column("prev_hash", String(64), nullable=False),
    Column("row_hash", String(64), nullable=False),
    UniqueConstraint("account", "account_seq", name="uq_audit_account_seq"),
)

#: The MAC'd columns of an audit row, in a fixed order (the canonical form is sorted JSON of these).
AUDIT_HASHED_COLUMNS = tuple(c.name for c in audit_events.c if c.name not in ("id", "row_hash"))

#: The hashed columns of a schema-2 row (plain SHA-256, no key): legacy rows keep verifying after the upgrade.
LEGACY_HASHED_COLUMNS = tuple(c for c in AUDIT_HASHED_COLUMNS if c not in ("token_hash", "proof", "key_id"))

#: Columns of a charge fixed at reservation (the guard trigger refuses to change them; verify compares each with
#: the charge's ``reserved`` event).
CHARGE_FIXED_COLUMNS = (
    "id", "account", "dag_id", "run_id", "task_id", "map_index", "release_name", "attempt", "amount",
    "delta_amount", "mechanisms", "spec_hash", "try_number", "context", "token_hash", "created_at",
)

#: Governed columns of an account: only governance events (``dpctl ledger apply``) change them.
ACCOUNT_GOVERNED_COLUMNS = ("accountant", "cap", "delta", "privacy_unit", "allowed_dags", "spend_key_id")

#: The longest lease a reservation may hold (seconds): the guard trigger refuses a later lease end, and the
#: ledger treats one as expired, so a tampered lease cannot block a release key for ever.
MAX_LEASE_SECONDS = 3600
#: How long a reservation may hold its release key against other attempts: renewals are refused once it is this old
#: (seconds since the charge was created), so its lease then runs out and another attempt may take the release over
#: (a hung try whose keeper thread lives, or a reservation of another task's key, cannot hold it for ever).
MAX_RESERVATION_HOLD_SECONDS = 6 * 3600


def _sqlite_triggers() -> dict[str, str]:
    fixed_changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in CHARGE_FIXED_COLUMNS)
    refuse = "BEGIN SELECT RAISE(ABORT, '{}'); END"
    return {
        "dp_audit_no_update": "CREATE TRIGGER dp_audit_no_update BEFORE UPDATE ON dp_audit_events "
        + refuse.format("dp_audit_events is append-only: UPDATE refused"),
        "dp_audit_no_delete": "CREATE TRIGGER dp_audit_no_delete BEFORE DELETE ON dp_audit_events "
        + refuse.format("dp_audit_events is append-only: DELETE refused"),
        "dp_charges_no_delete": "CREATE TRIGGER dp_charges_no_delete BEFORE DELETE ON dp_charges "
        + refuse.format("dp_charges rows are kept: DELETE refused"),
        "dp_charges_guard": "CREATE TRIGGER dp_charges_guard BEFORE UPDATE ON dp_charges WHEN "
        f"OLD.state <> 'reserved' OR NEW.state NOT IN ('reserved', 'committed', 'released', 'abandoned') "
        f"OR {fixed_changed} "
        f"OR (NEW.lease_expires_at IS NOT OLD.lease_expires_at "
        f"AND NEW.lease_expires_at > strftime('%Y-%m-%d %H:%M:%f', 'now', '+{MAX_LEASE_SECONDS} seconds')) "
        + refuse.format(
            "dp_charges: only a reserved charge may change, and only its state (to committed, released or "
            "abandoned), output and lease (at most MAX_LEASE_SECONDS ahead)"
        ),
        "dp_accounts_no_delete": "CREATE TRIGGER dp_accounts_no_delete BEFORE DELETE ON dp_budget_accounts "
        + refuse.format("dp_budget_accounts rows are kept: DELETE refused"),
    }


#: PostgreSQL trigger functions: name -> body. Each pins its ``search_path`` to the ledger's schema, then
#: ``pg_temp`` (as the spend functions do: :mod:`dp_operators.ledger.pg_functions`).
_PG_FUNCTIONS = {
    "dp_audit_append_only": " BEGIN RAISE EXCEPTION 'dp_audit_events is append-only: % refused', TG_OP; END ",
    "dp_rows_kept": " BEGIN RAISE EXCEPTION '% rows are kept: % refused', TG_TABLE_NAME, TG_OP; END ",
    "dp_charges_guard": (
        " BEGIN "
        "IF OLD.state <> 'reserved' OR NEW.state NOT IN ('reserved', 'committed', 'released', 'abandoned') "
        "OR (" + ", ".join(f"NEW.{c}" for c in CHARGE_FIXED_COLUMNS) + ") IS DISTINCT FROM ("
        + ", ".join(f"OLD.{c}" for c in CHARGE_FIXED_COLUMNS) + ") "
        f"OR (NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at "
        f"AND NEW.lease_expires_at > clock_timestamp() + interval '{MAX_LEASE_SECONDS} seconds') THEN "
        "RAISE EXCEPTION 'dp_charges: only a reserved charge may change, and only its state (to committed, "
        "released or abandoned), output and lease (at most MAX_LEASE_SECONDS ahead)'; END IF; RETURN NEW; END "
    ),
}

#: PostgreSQL triggers: name -> (table, timing and events, level, function).
_PG_TRIGGERS = {
    "dp_audit_no_update": ("dp_audit_events", "BEFORE UPDATE", "ROW", "dp_audit_append_only"),
    "dp_audit_no_delete": ("dp_audit_events", "BEFORE DELETE", "ROW", "dp_audit_append_only"),
    "dp_audit_no_truncate": ("dp_audit_events", "BEFORE TRUNCATE", "STATEMENT", "dp_audit_append_only"),
    "dp_charges_no_delete": ("dp_charges", "BEFORE DELETE", "ROW", "dp_rows_kept"),
    "dp_charges_no_truncate": ("dp_charges", "BEFORE TRUNCATE", "STATEMENT", "dp_rows_kept"),
    "dp_charges_guard": ("dp_charges", "BEFORE UPDATE", "ROW", "dp_charges_guard"),
    "dp_accounts_no_delete": ("dp_budget_accounts", "BEFORE DELETE", "ROW", "dp_rows_kept"),
    "dp_accounts_no_truncate": ("dp_budget_accounts", "BEFORE TRUNCATE", "STATEMENT", "dp_rows_kept"),
}

#: Names of every guard trigger (both dialects share the first five).
AUDIT_TRIGGER_NAMES = ("dp_audit_no_update", "dp_audit_no_delete")


def trigger_ddl(dialect: str) -> list[str]:
    """DDL statements (re)creating the guard triggers on ``dialect`` (``sqlite`` or ``postgresql``); idempotent.

    On PostgreSQL the trigger functions pin their ``search_path`` to the connection's ``current_schema()`` (then
    ``pg_temp``); the statements hold ``%`` as PostgreSQL reads it (a driver whose paramstyle uses ``%`` needs it
    doubled).

    Raises:
        ValueError: another dialect.
    """
    if dialect == "sqlite":
        statements = []
        for name, ddl in _sqlite_triggers().items():
            statements += [f"DROP TRIGGER IF EXISTS {name}", ddl]
        return statements
    if dialect == "postgresql":
        statements = [
            "DO $do$ BEGIN EXECUTE format('CREATE OR REPLACE FUNCTION " + name + "() RETURNS trigger LANGUAGE "
            "plpgsql SET search_path = %I, pg_temp AS %L', current_schema(), $body$" + body + "$body$); END $do$"
            for name, body in _PG_FUNCTIONS.items()
        ]
        for name, (table, when, level, function) in _PG_TRIGGERS.items():
            statements += [
                f"DROP TRIGGER IF EXISTS {name} ON {table}",
                f"CREATE TRIGGER {name} {when} ON {table} FOR EACH {level} EXECUTE FUNCTION {function}()",
            ]
        return statements
    raise ValueError(f"unsupported ledger database {dialect!r}: use SQLite or PostgreSQL")


_PG_TRIGGER_QUERY = """
SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid), p.proname, p.prosrc, p.proconfig,
       format('search_path=%%I, pg_temp', n.nspname)
FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE NOT t.tgisinternal
  AND t.tgrelid IN ('dp_audit_events'::regclass, 'dp_charges'::regclass, 'dp_budget_accounts'::regclass)
"""


def _normalise(sql: str) -> str:
    return " ".join(sql.replace("IF NOT EXISTS ", "").split())


def trigger_problems(conn) -> list[str]:
    """Compare the guard triggers in the database with their expected definitions: each must exist, be enabled
    (PostgreSQL ``tgenabled = 'O'``) and run the expected body (SQLite: the stored ``CREATE TRIGGER`` text;
    PostgreSQL: ``pg_get_triggerdef``, the trigger function's source and its ``search_path``, pinned to its own
    schema then ``pg_temp``). On PostgreSQL the spend functions are compared too
    (:func:`~dp_operators.ledger.pg_functions.function_problems`), and the unique constraints of ``dp_charges``
    (:func:`constraint_problems`). Returns one line per problem.

    Args:
        conn: a SQLAlchemy connection to the ledger database.
    """
    dialect = conn.dialect.name
    problems = []
    if dialect == "sqlite":
        found = {
            name: sql
            for name, sql in conn.exec_driver_sql(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN "
                "('dp_audit_events', 'dp_charges', 'dp_budget_accounts')"
            )
        }
        for name, ddl in _sqlite_triggers().items():
            if name not in found:
                problems.append(f"trigger {name} is missing (dropped)")
            elif _normalise(found[name]) != _normalise(ddl):
                problems.append(f"trigger {name} does not have its expected definition (replaced)")
        for name in sorted(set(found) - set(_sqlite_triggers())):
            problems.append(f"trigger {name} is not one of the ledger's (added outside 'dpctl ledger init')")
        return problems
    rows = {row[0]: row for row in conn.exec_driver_sql(_PG_TRIGGER_QUERY)}
    for name, (table, when, level, function) in _PG_TRIGGERS.items():
        row = rows.get(name)
        if row is None:
            problems.append(f"trigger {name} on {table} is missing (dropped)")
            continue
        _, enabled, definition, proname, prosrc, config, pinned = row
        expected = f"CREATE TRIGGER {name} {when} ON {table} FOR EACH {level} EXECUTE FUNCTION {function}()"
        unqualified = " ".join(definition.split()).replace(f" ON {_schema_prefix(definition, table)}{table} ", f" ON {table} ")
        if enabled != "O":
            problems.append(f"trigger {name} on {table} is disabled (tgenabled={enabled!r})")
        if unqualified != expected or proname != function:
            problems.append(f"trigger {name} on {table} does not have its expected definition (replaced)")
        elif " ".join(prosrc.split()) != " ".join(_PG_FUNCTIONS[function].split()):
            problems.append(f"trigger function {function}() of {name} was replaced (its body differs)")
        elif list(config or []) != [pinned]:
            problems.append(
                f"trigger function {function}() of {name} does not pin its search_path to its schema, then pg_temp "
                "(replaced; 'dpctl ledger init' restores it)"
            )
    for name in sorted(set(rows) - set(_PG_TRIGGERS)):
        problems.append(f"trigger {name} is not one of the ledger's (added outside 'dpctl ledger init')")
    from dp_operators.ledger.pg_functions import function_problems  # it imports this module

    return problems + constraint_problems(conn) + function_problems(conn)


_PG_UNIQUE_QUERY = """
SELECT c.conname, pg_catalog.pg_get_constraintdef(c.oid) FROM pg_catalog.pg_constraint AS c
WHERE c.conrelid = 'dp_charges'::regclass AND c.contype = 'u' ORDER BY 1
"""
_RELEASE_ATTEMPT_DEFINITION = f"UNIQUE ({', '.join(RELEASE_ATTEMPT_COLUMNS)})"


def constraint_ddl(conn) -> list[str]:
    """PostgreSQL: the statements that give ``dp_charges`` the release-key constraint of this version
    (:data:`RELEASE_ATTEMPT_CONSTRAINT`), read from the catalog: drop the constraint of earlier versions
    (:data:`OLD_RELEASE_ATTEMPT_CONSTRAINT`) and one of the current name with another definition, add the current one
    if it is then missing. Empty when the table already has it: idempotent. The new constraint is weaker than the old
    (one more column), so adding it never fails on rows the old one admitted. ``dpctl ledger init`` runs them in its
    transaction (:meth:`~dp_operators.ledger.govern.LedgerGovernor.init_schema`); other dialects: none (a SQLite
    file keeps the constraint it was created with: docs/adr/0029).
    """
    if conn.dialect.name != "postgresql":
        return []
    found = dict(conn.exec_driver_sql(_PG_UNIQUE_QUERY).all())
    statements = []
    for name in (OLD_RELEASE_ATTEMPT_CONSTRAINT, RELEASE_ATTEMPT_CONSTRAINT):
        if name in found and (name != RELEASE_ATTEMPT_CONSTRAINT or found[name] != _RELEASE_ATTEMPT_DEFINITION):
            statements.append(f"ALTER TABLE dp_charges DROP CONSTRAINT {name}")
    if found.get(RELEASE_ATTEMPT_CONSTRAINT) != _RELEASE_ATTEMPT_DEFINITION:
        statements.append(
            f"ALTER TABLE dp_charges ADD CONSTRAINT {RELEASE_ATTEMPT_CONSTRAINT} {_RELEASE_ATTEMPT_DEFINITION}"
        )
    return statements


def constraint_problems(conn) -> list[str]:
    """PostgreSQL: the unique constraints of ``dp_charges`` against this version's: the release-key constraint must
    exist with its definition, and no other (the constraint of earlier versions, without the account, lets one
    account's uncommitted charge stall another account's reserves). One line per problem; none on SQLite."""
    if conn.dialect.name != "postgresql":
        return []
    found = dict(conn.exec_driver_sql(_PG_UNIQUE_QUERY).all())
    problems = []
    definition = found.pop(RELEASE_ATTEMPT_CONSTRAINT, None)
    if definition is None:
        if OLD_RELEASE_ATTEMPT_CONSTRAINT not in found:  # else named below, as the constraint init replaces
            problems.append(
                f"constraint {RELEASE_ATTEMPT_CONSTRAINT} on dp_charges is missing (run 'dpctl ledger init')"
            )
    elif definition != _RELEASE_ATTEMPT_DEFINITION:
        problems.append(
            f"constraint {RELEASE_ATTEMPT_CONSTRAINT} on dp_charges is {definition}, not "
            f"{_RELEASE_ATTEMPT_DEFINITION} (replaced; 'dpctl ledger init' restores it)"
        )
    for name, definition in sorted(found.items()):
        if name == OLD_RELEASE_ATTEMPT_CONSTRAINT:
            problems.append(
                f"constraint {name} on dp_charges is an earlier version's ({definition}: one account's open "
                "reservation of a release key stalls another account's reserves of it); 'dpctl ledger init' "
                f"replaces it with {RELEASE_ATTEMPT_CONSTRAINT}"
            )
        else:
            problems.append(f"constraint {name} on dp_charges ({definition}) is not the ledger's (added outside "
                            "'dpctl ledger init')")
    return problems


def _schema_prefix(definition: str, table: str) -> str:
    marker = f".{table} "
    if marker not in definition:
        return ""
    before = definition[: definition.index(marker)]
    return before.rsplit(" ", 1)[-1] + "."
