"""Ledgers as older versions of the package wrote them (import as ``from old_ledgers import version_2_ledger``)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import secrets
from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace

import sqlalchemy as sa

from dp_operators.ledger import ReleaseKey, schema
from dp_operators.ledger.chain import AccountChain, GENESIS_HASH, canonical_json, legacy_row_hash, timestamp_text
from ledger_backends import old_schema_metadata


def version_2_ledger(url: str, *, cap: str, key: ReleaseKey, output: dict) -> None:
    """A schema-2 ledger at ``url``: account ``a`` (pure DP, ``cap``, DAG ``d``) with one charge of 1/4 for ``key``,
    committed with ``output``; its audit chain is unkeyed (plain SHA-256 rows, as schema 2 wrote them)."""
    engine = sa.create_engine(url)
    v2 = old_schema_metadata(2)
    v2.create_all(engine)
    now = dt.datetime.now(dt.timezone.utc)
    stored = {"accountant": "pure_dp", "cap": cap, "delta": None, "privacy_unit": "person",
              "allowed_dags": json.dumps(["d"])}
    text = canonical_json(output)
    digest = hashlib.sha256(text.encode()).hexdigest()
    chain = {"seq": 0, "head": GENESIS_HASH, "spent": Fraction(0)}
    events = v2.tables["dp_audit_events"]

    def append(conn, **fields):
        values = {name: None for name in schema.LEGACY_HASHED_COLUMNS}
        values.update(fields)
        chain["seq"] += 1
        values.update(account="a", account_seq=chain["seq"], spent_after=str(chain["spent"]), delta_spent_after="0",
                      context=canonical_json({"host": "old"}), prev_hash=chain["head"],
                      created_at=timestamp_text(dt.datetime.now(dt.timezone.utc)))
        values["row_hash"] = chain["head"] = legacy_row_hash(values)
        conn.execute(events.insert().values(**values))

    charge = {"charge_id": 1, **key.as_dict(), "attempt": 1, "try_number": None, "spec_hash": "0" * 64,
              "amount": "1/4", "delta_amount": "0", "mechanisms": "[]"}
    with engine.begin() as conn:
        conn.execute(v2.tables["dp_schema_version"].insert().values(version=2, applied_at=now))
        conn.execute(v2.tables["dp_budget_accounts"].insert().values(
            name="a", spent="0", delta_spent="0", audit_seq=0, owner=None, description=None, config="{}",
            created_at=now, updated_at=now, **stored))
        append(conn, event="account_created", details=canonical_json({"stored": stored}))
        conn.execute(v2.tables["dp_charges"].insert().values(
            account="a", attempt=1, state="committed", amount="1/4", delta_amount="0", mechanisms="[]",
            spec_hash="0" * 64, context=canonical_json({"host": "old"}), output=text, output_digest=digest,
            created_at=now, updated_at=now, **key.as_dict()))
        chain["spent"] = Fraction(1, 4)
        append(conn, event="reserved", **charge)
        append(conn, event="committed", output_digest=digest, **charge)
        conn.execute(v2.tables["dp_budget_accounts"].update().values(
            spent="1/4", audit_seq=chain["seq"], audit_head=chain["head"]))
    engine.dispose()


def _version_3_metadata() -> sa.MetaData:
    """The tables of schema 3, frozen as that version created them (schema 4 added ``allowed_roles``)."""
    ident = sa.BigInteger().with_variant(sa.Integer, "sqlite")
    metadata = sa.MetaData()
    sa.Table("dp_schema_version", metadata, sa.Column("version", sa.Integer, primary_key=True),
             sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False))
    sa.Table(
        "dp_budget_accounts", metadata,
        sa.Column("name", sa.String(200), primary_key=True), sa.Column("accountant", sa.String(20), nullable=False),
        sa.Column("cap", sa.Text, nullable=False), sa.Column("spent", sa.Text, nullable=False),
        sa.Column("delta", sa.Text), sa.Column("delta_spent", sa.Text, nullable=False, server_default="0"),
        sa.Column("privacy_unit", sa.String(200), nullable=False), sa.Column("allowed_dags", sa.Text, nullable=False),
        sa.Column("owner", sa.String(200)), sa.Column("description", sa.Text), sa.Column("config", sa.Text),
        sa.Column("spend_key_id", sa.String(16)),
        sa.Column("audit_seq", sa.Integer, nullable=False, server_default="0"), sa.Column("audit_head", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    sa.Table(
        "dp_charges", metadata,
        sa.Column("id", ident, primary_key=True, autoincrement=True),
        sa.Column("account", sa.String(200), sa.ForeignKey("dp_budget_accounts.name"), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=False), sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("task_id", sa.String(250), nullable=False), sa.Column("map_index", sa.Integer, nullable=False),
        sa.Column("release_name", sa.String(200), nullable=False), sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("state", sa.String(20), nullable=False), sa.Column("amount", sa.Text, nullable=False),
        sa.Column("delta_amount", sa.Text, nullable=False, server_default="0"),
        sa.Column("mechanisms", sa.Text, nullable=False), sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("try_number", sa.Integer), sa.Column("context", sa.Text), sa.Column("output", sa.Text),
        sa.Column("output_digest", sa.String(64)), sa.Column("token_hash", sa.String(64)),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("dag_id", "run_id", "task_id", "map_index", "release_name", "attempt",
                            name="uq_release_attempt"),
        sa.Index("ix_dp_charges_account_state", "account", "state"),
    )
    sa.Table(
        "dp_audit_events", metadata,
        sa.Column("id", ident, primary_key=True, autoincrement=True),
        sa.Column("account", sa.String(200), nullable=False), sa.Column("account_seq", sa.Integer, nullable=False),
        sa.Column("event", sa.String(40), nullable=False), sa.Column("charge_id", ident),
        sa.Column("dag_id", sa.String(250)), sa.Column("run_id", sa.String(250)), sa.Column("task_id", sa.String(250)),
        sa.Column("map_index", sa.Integer), sa.Column("release_name", sa.String(200)), sa.Column("attempt", sa.Integer),
        sa.Column("try_number", sa.Integer), sa.Column("spec_hash", sa.String(64)), sa.Column("amount", sa.Text),
        sa.Column("delta_amount", sa.Text), sa.Column("spent_after", sa.Text, nullable=False),
        sa.Column("delta_spent_after", sa.Text, nullable=False), sa.Column("mechanisms", sa.Text),
        sa.Column("output_digest", sa.String(64)), sa.Column("context", sa.Text, nullable=False),
        sa.Column("details", sa.Text), sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("token_hash", sa.String(64)), sa.Column("proof", sa.String(100)), sa.Column("key_id", sa.String(16)),
        sa.Column("prev_hash", sa.String(64), nullable=False), sa.Column("row_hash", sa.String(64), nullable=False),
        sa.UniqueConstraint("account", "account_seq", name="uq_audit_account_seq"),
    )
    return metadata


@dataclass
class Version3Ledger:
    """What :func:`version_3_ledger` wrote: the committed key and its output, and a reservation still open (its
    charge id, key and token: its owner may commit it after the upgrade)."""

    committed: ReleaseKey
    output: dict
    open_charge_id: int
    open_key: ReleaseKey
    open_token: str


def version_3_ledger(url: str, *, cap: str = "1", lease_seconds: float = 3600) -> Version3Ledger:
    """A schema-3 ledger at ``url``, its rows signed as schema 3 signed them (the chain code of
    :class:`~dp_operators.ledger.chain.AccountChain`, the test keys): account ``a`` (pure DP, ``cap``, DAG ``d``)
    created by a governor-signed ``account_created``; release ``r1`` reserved (1/4) and committed; ``r2``
    reserved (1/8) and released; ``r3`` reserved (1/10), its lease running ``lease_seconds``. The schema-3 guard
    triggers are the current ones (``dpctl ledger init`` re-creates them on the upgrade anyway)."""
    from support import GOVERNOR_KEY, SPEND_KEY

    engine = sa.create_engine(url)
    v3 = _version_3_metadata()
    v3.create_all(engine)
    accounts, charges, events = (v3.tables[name] for name in ("dp_budget_accounts", "dp_charges", "dp_audit_events"))
    now = dt.datetime.now(dt.timezone.utc)
    stored = {"accountant": "pure_dp", "cap": cap, "delta": None, "privacy_unit": "person",
              "allowed_dags": json.dumps(["d"]), "spend_key_id": SPEND_KEY.key_id}
    context = {"host": "old", "package_version": "0.0.3", "pid": 1, "run_type": "scheduled"}
    row = SimpleNamespace(name="a")
    governing = AccountChain(row, Fraction(0), Fraction(0), 0, GENESIS_HASH, GOVERNOR_KEY)
    result = Version3Ledger(ReleaseKey("d", "r1", "t", -1, "r"), {"value": 1}, 0, ReleaseKey("d", "r3", "t", -1, "r"),
                            "")
    with engine.begin() as conn:
        for statement in schema.trigger_ddl(engine.dialect.name):
            conn.exec_driver_sql(statement.replace("%", "%%") if engine.dialect.name == "postgresql" else statement)
        conn.execute(v3.tables["dp_schema_version"].insert().values(version=3, applied_at=now))
        conn.execute(accounts.insert().values(name="a", spent="0", delta_spent="0", audit_seq=0, owner=None,
                                              description=None, config="{}", created_at=now, updated_at=now, **stored))
        conn.execute(events.insert().values(**governing.signed_row(
            "account_created", {"host": "old", "command": "apply"}, details={"config": {}, "stored": stored})))
        spending = AccountChain(row, Fraction(0), Fraction(0), governing.seq, governing.head, SPEND_KEY)

        def reserve(run: str, amount: str, lease: float) -> tuple[int, ReleaseKey, str, dict]:
            key = ReleaseKey("d", run, "t", -1, "r")
            token = secrets.token_urlsafe(32)
            created = dt.datetime.now(dt.timezone.utc)
            values = {**key.as_dict(), "account": "a", "attempt": 1, "state": "reserved", "amount": amount,
                      "delta_amount": "0", "mechanisms": "[]", "spec_hash": "0" * 64, "try_number": 1,
                      "context": canonical_json(context), "token_hash": hashlib.sha256(token.encode()).hexdigest(),
                      "lease_expires_at": created + dt.timedelta(seconds=lease), "created_at": created,
                      "updated_at": created}
            charge_id = conn.execute(charges.insert().values(**values)).inserted_primary_key[0]
            fields = {**key.as_dict(), "charge_id": charge_id, "attempt": 1, "try_number": 1, "spec_hash": "0" * 64,
                      "amount": amount, "delta_amount": "0", "mechanisms": "[]"}
            spending.spent += Fraction(amount)
            conn.execute(events.insert().values(**spending.signed_row(
                "reserved", context, token_hash=values["token_hash"], created_at=created, **fields)))
            return charge_id, key, token, fields

        charge_id, _, token, fields = reserve("r1", "1/4", 120)
        text = canonical_json(result.output)
        digest = hashlib.sha256(text.encode()).hexdigest()
        conn.execute(charges.update().where(charges.c.id == charge_id).values(
            state="committed", output=text, output_digest=digest))
        conn.execute(events.insert().values(**spending.signed_row(
            "committed", context, output_digest=digest, proof=token, **fields)))
        charge_id, _, token, fields = reserve("r2", "1/8", 120)
        conn.execute(charges.update().where(charges.c.id == charge_id).values(state="released"))
        spending.spent -= Fraction(1, 8)
        conn.execute(events.insert().values(**spending.signed_row(
            "released", context, proof=token, details={"reason": "no noise was drawn"}, **fields)))
        result.open_charge_id, result.open_key, result.open_token, _ = reserve("r3", "1/10", lease_seconds)
        conn.execute(accounts.update().values(spent=str(spending.spent), audit_seq=spending.seq,
                                              audit_head=spending.head))
    engine.dispose()
    return result
