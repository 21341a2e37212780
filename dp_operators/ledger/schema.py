"""The ledger's tables (SQLAlchemy Core; the same schema on SQLite and PostgreSQL).

Exact numbers are stored as text (``str(Fraction)``, e.g. ``"1/3"``) so no database type rounds them. The account
row keeps running totals (``spent``, ``delta_spent``) and the head of its audit chain (``audit_seq``,
``audit_head``), so a budget check and an audit append cost the same with one or a million prior charges.

``dp_charges`` is mutable (a charge changes state); ``dp_audit_events`` is the append-only record: database
triggers refuse UPDATE and DELETE on it (:func:`audit_trigger_ddl`), and each row carries the SHA-256 of the
previous row of its account's chain.

Version history (``dp_schema_version``): 1 — accounts and charges (the first cut); 2 — delta totals, charge
context, the audit event table and its triggers. :mod:`dp_operators.ledger.store` upgrades 1 to 2 in place.
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
SCHEMA_VERSION = 2

metadata = MetaData()

_ID = BigInteger().with_variant(Integer, "sqlite")

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
    Column("owner", String(200), nullable=True),
    Column("description", Text, nullable=True),
    Column("config", Text, nullable=True),
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
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("dag_id", "run_id", "task_id", "map_index", "release_name", "attempt", name="uq_release_attempt"),
    Index("ix_dp_charges_account_state", "account", "state"),
)

#: Every column except ``id`` and ``row_hash`` enters the row's hash; values are text or integers so they
#: read back from either database exactly as they were written.
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
    Column("prev_hash", String(64), nullable=False),
    Column("row_hash", String(64), nullable=False),
    UniqueConstraint("account", "account_seq", name="uq_audit_account_seq"),
)

#: The hashed columns of an audit row, in a fixed order (the canonical form is sorted JSON of these).
AUDIT_HASHED_COLUMNS = tuple(c.name for c in audit_events.c if c.name not in ("id", "row_hash"))

AUDIT_TRIGGER_NAMES = ("dp_audit_no_update", "dp_audit_no_delete")


def audit_trigger_ddl(dialect: str) -> list[str]:
    """DDL statements making ``dp_audit_events`` append-only on ``dialect`` (``sqlite`` or ``postgresql``)."""
    if dialect == "sqlite":
        return [
            f"CREATE TRIGGER IF NOT EXISTS dp_audit_no_{op.lower()} BEFORE {op} ON dp_audit_events "
            f"BEGIN SELECT RAISE(ABORT, 'dp_audit_events is append-only: {op} refused'); END"
            for op in ("UPDATE", "DELETE")
        ]
    if dialect == "postgresql":
        return [
            "CREATE OR REPLACE FUNCTION dp_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'dp_audit_events is append-only: %% refused', TG_OP; END $$",
            "DROP TRIGGER IF EXISTS dp_audit_no_update ON dp_audit_events",
            "CREATE TRIGGER dp_audit_no_update BEFORE UPDATE ON dp_audit_events "
            "FOR EACH ROW EXECUTE FUNCTION dp_audit_append_only()",
            "DROP TRIGGER IF EXISTS dp_audit_no_delete ON dp_audit_events",
            "CREATE TRIGGER dp_audit_no_delete BEFORE DELETE ON dp_audit_events "
            "FOR EACH ROW EXECUTE FUNCTION dp_audit_append_only()",
            "DROP TRIGGER IF EXISTS dp_audit_no_truncate ON dp_audit_events",
            "CREATE TRIGGER dp_audit_no_truncate BEFORE TRUNCATE ON dp_audit_events "
            "FOR EACH STATEMENT EXECUTE FUNCTION dp_audit_append_only()",
        ]
    raise ValueError(f"unsupported ledger database {dialect!r}: use SQLite or PostgreSQL")


def audit_trigger_query(dialect: str) -> str:
    """A query returning the names of the append-only triggers present on ``dp_audit_events``."""
    if dialect == "sqlite":
        return "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'dp_audit_events'"
    return (
        "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgrelid = 'dp_audit_events'::regclass"
    )
