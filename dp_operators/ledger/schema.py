"""The ledger's tables (SQLAlchemy Core; the same schema on SQLite and PostgreSQL).

Exact numbers are stored as text (``str(Fraction)``, e.g. ``"1/3"``) so no database type rounds them. The account
row keeps running totals (``spent``) so a budget check costs the same with one or a million prior charges.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

#: Bumped when the tables change; ``dpctl ledger init`` records it and the ledger refuses other versions.
SCHEMA_VERSION = 1

metadata = MetaData()

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
    Column("privacy_unit", String(200), nullable=False),
    Column("allowed_dags", Text, nullable=False),
    Column("owner", String(200), nullable=True),
    Column("description", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

charges = Table(
    "dp_charges",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("account", String(200), ForeignKey("dp_budget_accounts.name"), nullable=False),
    Column("dag_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("task_id", String(250), nullable=False),
    Column("map_index", Integer, nullable=False),
    Column("release_name", String(200), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("state", String(20), nullable=False),
    Column("amount", Text, nullable=False),
    Column("mechanisms", Text, nullable=False),
    Column("spec_hash", String(64), nullable=False),
    Column("try_number", Integer, nullable=True),
    Column("output", Text, nullable=True),
    Column("output_digest", String(64), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("dag_id", "run_id", "task_id", "map_index", "release_name", "attempt", name="uq_release_attempt"),
)
