"""Ledgers as older versions of the package wrote them (import as ``from old_ledgers import version_2_ledger``)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from fractions import Fraction

import sqlalchemy as sa

from dp_operators.ledger import ReleaseKey, schema
from dp_operators.ledger.chain import GENESIS_HASH, canonical_json, legacy_row_hash, timestamp_text
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
