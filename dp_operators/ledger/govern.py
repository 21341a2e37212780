"""The governor's ledger: what the privacy officer's ``dpctl ledger init``, ``apply`` and ``verify`` use.

Every governance event (account created, updated, migrated, chain keyed) is signed with the governor key, which
only the privacy officer holds; ``dpctl ledger verify`` with that key detects any governance event written without
it. On PostgreSQL the spender's database role has no privilege on the governed columns at all
(:mod:`dp_operators.ledger.roles`), so a task cannot even try. See docs/adr/0020.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from fractions import Fraction
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dp_operators.accounting import unit_of
from dp_operators.ledger import pg_functions, schema
from dp_operators.ledger.chain import GOVERNANCE_EVENTS, AccountChain, audit_context, canonical_json, now
from dp_operators.ledger.config import LedgerConfig
from dp_operators.ledger.errors import LedgerKeyError, LedgerNotInitialisedError
from dp_operators.ledger.keys import AuditKey, Keyring, as_key
from dp_operators.ledger.spend import reconcile_expired
from dp_operators.ledger.store import LedgerBase, show, stored_config, user_name
from dp_operators.ledger.team_roles import allowed_roles_text, describe_allowed_roles

#: The schema version that keyed the audit chain: upgrading from an older one signs every account's chain.
KEYED_CHAIN_VERSION = 3

#: Columns each schema version added, for in-place upgrades (``ALTER TABLE ... ADD COLUMN``).
_ADDED_IN = {
    2: {schema.accounts: ("delta_spent", "config", "audit_seq", "audit_head"), schema.charges: ("delta_amount", "context")},
    3: {
        schema.accounts: ("spend_key_id",),
        schema.charges: ("token_hash", "lease_expires_at"),
        schema.audit_events: ("token_hash", "proof", "key_id"),
    },
    4: {schema.accounts: ("allowed_roles",)},
}


class LedgerGovernor(LedgerBase):
    """The privacy officer's view of the ledger: schema, accounts and caps, verification.

    Args:
        url: SQLAlchemy URL of the ledger database, or an existing :class:`~sqlalchemy.engine.Engine`. On
            PostgreSQL, connect as the governor role (``dpctl ledger roles``); ``init`` as the tables' owner.
        governor_key: the governor key (:class:`~dp_operators.ledger.keys.AuditKey` or its text); signs every
            governance event. Required to write; :meth:`verify` needs it (or a keyring holding it) to check
            authenticity.
        spend_key: the spend key the workers hold; :meth:`apply_config` records its id as the key accounts
            accept (required when an account is created; giving a new one rotates it).
        max_retries: how often a transaction that lost a lock race is retried.
    """

    def __init__(
        self,
        url: str | Engine,
        *,
        governor_key: AuditKey | str | None = None,
        spend_key: AuditKey | str | None = None,
        max_retries: int = 30,
    ) -> None:
        super().__init__(url, max_retries=max_retries)
        self._key = as_key(governor_key)
        self._spend_key = as_key(spend_key)
        if self._key is not None and self._spend_key is not None and self._key.key_id == self._spend_key.key_id:
            raise ValueError("the governor key and the spend key must differ: workers hold the spend key")

    def _governor_key(self) -> AuditKey:
        if self._key is None:
            raise LedgerKeyError(
                "governance events are signed with the governor key: give it with --governor-key-file or "
                "DP_LEDGER_GOVERNOR_KEY (make one with 'dpctl ledger keygen'; only the privacy officer holds it)"
            )
        return self._key

    @property
    def key_ids(self) -> dict[str, str | None]:
        """Ids of the keys this governor holds: ``{"governor": ..., "spend": ...}``."""
        return {
            "governor": None if self._key is None else self._key.key_id,
            "spend": None if self._spend_key is None else self._spend_key.key_id,
        }

    # -- schema --------------------------------------------------------------------------------------------------
    def init_schema(self) -> int:
        """Create the tables and the guard triggers if missing, upgrade an older schema in place, and record the
        schema version; on PostgreSQL also install pgcrypto, drop overloads of the ledger's function names that are
        not their current definitions (left by earlier versions), and (re)create the spend functions the spender
        role executes (:mod:`~dp_operators.ledger.pg_functions`; grants made by ``dpctl ledger roles`` survive, but a
        ledger upgraded from schema 3 needs ``dpctl ledger roles --execute`` again to grant them), and replace the
        release key's unique constraint of earlier versions with the per-account one
        (:func:`~dp_operators.ledger.schema.constraint_ddl`), all in one transaction. Explicit (``dpctl ledger
        init``): never called at import. Idempotent.

        Returns the schema version.

        Raises:
            LedgerNotInitialisedError: the database holds a newer version.
            LedgerKeyError: an upgrade (it writes signed events) without the governor key.
        """
        dialect = self.dialect
        found = self._schema_version()
        if found is not None and found > schema.SCHEMA_VERSION:
            raise LedgerNotInitialisedError(
                f"ledger schema version {found} is newer than the version {schema.SCHEMA_VERSION} this package "
                "uses; upgrade dp-operators"
            )
        if found is not None and found < schema.SCHEMA_VERSION:
            if found < KEYED_CHAIN_VERSION:
                self._governor_key()
            self._add_columns(found)
        if dialect == "sqlite":
            # WAL lets readers proceed while a writer holds the lock; synchronous stays FULL (the default), so a
            # committed reservation survives a power loss before any noise is drawn. Outside any transaction.
            raw = self.engine.raw_connection()
            try:
                raw.driver_connection.execute("PRAGMA journal_mode=WAL")
            finally:
                raw.close()
            _owner_only(self.engine.url.database)
        schema.metadata.create_all(self.engine)

        def create(conn: Connection) -> None:
            if dialect == "postgresql":
                # pgcrypto and the spend functions (docs/adr/0029); first, as it drops overloads of the ledger's
                # function names left by earlier versions (the trigger functions' included)
                pg_functions.install(conn)
            for statement in schema.trigger_ddl(dialect):
                conn.exec_driver_sql(statement.replace("%", "%%") if dialect == "postgresql" else statement)
            # PostgreSQL: the release key's constraint of earlier versions (without the account) becomes the current
            # one; a SQLite file keeps the one it was created with (docs/adr/0029)
            for statement in schema.constraint_ddl(conn):
                conn.exec_driver_sql(statement)
            if found is not None and found < KEYED_CHAIN_VERSION:
                self._migrate_chains(conn, found)
            if found is None or found < schema.SCHEMA_VERSION:
                conn.execute(schema.schema_version.insert().values(version=schema.SCHEMA_VERSION, applied_at=now()))

        self._write(create)
        self._schema_checked = False
        return schema.SCHEMA_VERSION

    def _add_columns(self, found: int) -> None:
        """``ALTER TABLE ... ADD COLUMN`` for every column added after schema ``found``."""
        dialect = self.engine.dialect
        inspector = sa.inspect(self.engine)
        existing = {
            table.name: {column["name"] for column in inspector.get_columns(table.name)}
            for table in (schema.accounts, schema.charges, schema.audit_events)
            if inspector.has_table(table.name)
        }
        with self.engine.begin() as conn:
            for version in range(found + 1, schema.SCHEMA_VERSION + 1):
                for table, names in _ADDED_IN[version].items():
                    if table.name not in existing:
                        continue  # created whole by create_all
                    for name in names:
                        if name in existing[table.name]:
                            continue
                        column = table.c[name]
                        default = (
                            f" DEFAULT '{column.server_default.arg}'" if column.server_default is not None else ""
                        )
                        null = " NOT NULL" if not column.nullable else ""
                        conn.exec_driver_sql(
                            f"ALTER TABLE {table.name} ADD COLUMN {name} {column.type.compile(dialect)}{default}{null}"
                        )

    def _migrate_chains(self, conn: Connection, found: int) -> None:
        """Close every account's pre-3 history with a governor-signed event: ``account_migrated`` (from schema 1,
        whose charges had no events: it states the totals) or ``chain_keyed`` (from schema 2: it signs the head of
        the unkeyed chain, so rewriting that prefix breaks the signature)."""
        key = self._governor_key()
        context = audit_context({"user": user_name(), "command": "init"})
        last_charge = conn.execute(sa.select(sa.func.max(schema.charges.c.id))).scalar() or 0
        spend_key_id = None if self._spend_key is None else self._spend_key.key_id
        names = conn.execute(sa.select(schema.accounts.c.name).order_by(schema.accounts.c.name)).scalars().all()
        for name in names:
            chain = AccountChain.lock(conn, name, key)
            assert chain is not None
            values = {**stored_config(_row_dict(chain.row)), "spend_key_id": spend_key_id}
            event = "account_migrated" if found == 1 else "chain_keyed"
            chain.append(
                conn, event, context,
                details={"from_schema": found, "last_charge_id": last_charge, "stored": values},
            )
            chain.flush(conn, spend_key_id=spend_key_id)

    # -- governance ----------------------------------------------------------------------------------------------
    def apply_config(
        self,
        config: LedgerConfig,
        *,
        audit: Mapping[str, Any] | None = None,
        new_governor_key: bool = False,
        dry_run: bool = False,
    ) -> list[str]:
        """Create or update accounts from a :class:`LedgerConfig`; every change is an audit event signed with the
        governor key (``account_created``/``account_updated`` with the configuration as written and the values
        stored). This is the only way a cap, an allowlist or the accepted spend key changes. Returns a line per
        change made.

        An account's accountant is fixed at creation, and its privacy unit once anything was charged to it; a cap
        may not go below what is already spent. Accounts in the ledger but not in ``config`` are left as they are
        (their history stays). With a spend key, every account in ``config`` accepts it from now on (rotation).

        A governor key that never signed this ledger's governance events is refused (a wrong key would write events
        verify rejects) unless ``new_governor_key``: then every account in ``config`` records the rotation in a
        signed ``account_updated`` event, so the new key has signed each chain from here on. ``dry_run`` makes every
        check and returns the lines, then rolls the transaction back: nothing is changed.

        Raises:
            ValueError: changing an accountant, changing the privacy unit of an account that was charged, or a cap
                below the spent amount (nothing is changed).
            LedgerKeyError: no governor key; the governor key is an account's spend key; a governor key this
                ledger has not seen without ``new_governor_key``; creating an account without a spend key.
            LedgerNotInitialisedError: no schema.
        """
        self.check_schema()
        key = self._governor_key()
        context = audit_context({"user": user_name(), "command": "apply", **(audit or {})})
        spend_key_id = None if self._spend_key is None else self._spend_key.key_id
        prepared = {name: (account, account_values(account)) for name, account in sorted(config.all_accounts().items())}

        def work(conn: Connection) -> list[str]:
            self._check_governor_key(conn, key, new_governor_key)
            for name, account in config.accounts.items():
                _refuse_structure_change(conn, name, account)
            requiring = sorted(n for n, a in config.accounts.items() if getattr(a, "require_enforced_bounding", False))
            if requiring and self.dialect == "postgresql" and not pg_functions.reserve_enforces_bounding(conn):
                raise ValueError(
                    f"account {requiring[0]!r} requires enforced contribution bounding, but this ledger's spend "
                    "function dp_reserve predates the requirement and would not enforce it: the tables' owner runs "
                    "'dpctl ledger init' (it reinstalls the functions; charges made before keep verifying), then "
                    "apply again. Nothing was changed"
                )
            changes: list[str] = []
            for name, (account, values) in prepared.items():
                chain = AccountChain.lock(conn, name, key)
                if chain is None:
                    if spend_key_id is None:
                        raise LedgerKeyError(
                            f"account {name!r} is new: give the spend key the workers will hold "
                            "(--audit-key-file or DP_LEDGER_AUDIT_KEY), so the account knows which key signs its "
                            "spend events"
                        )
                    values = {**values, "spend_key_id": spend_key_id}
                    created = now()
                    conn.execute(
                        schema.accounts.insert().values(
                            name=name, spent="0", delta_spent="0", audit_seq=0, created_at=created,
                            updated_at=created, **values,
                        )
                    )
                    chain = AccountChain.lock(conn, name, key)
                    assert chain is not None
                    chain.append(
                        conn, "account_created", context,
                        details={"config": account.as_record(), "stored": governed_values(values)},
                    )
                    chain.flush(conn)
                    changes.append(
                        f"created account {name!r} ({account.accountant}, cap {show(Fraction(values['cap']))} "
                        f"{unit_of(account.accountant)})"
                    )
                    continue
                row = chain.row
                values = {**values, "spend_key_id": spend_key_id or row.spend_key_id}
                if row.accountant != account.accountant:
                    raise ValueError(accountant_fixed(name, row.accountant, account.accountant))
                if row.privacy_unit != account.privacy_unit and (
                    chain.spent > 0
                    or conn.execute(
                        sa.select(schema.charges.c.id).where(schema.charges.c.account == name).limit(1)
                    ).first()
                ):
                    raise ValueError(
                        f"account {name!r}: the privacy unit is fixed once budget has been spent "
                        f"({row.privacy_unit!r}); cannot change it to {account.privacy_unit!r}, since spend "
                        f"protecting one unit does not compose with releases protecting another. "
                        "Create a new account instead."
                    )
                cap = Fraction(values["cap"])
                if cap < chain.spent:
                    raise ValueError(f"account {name!r}: cap {show(cap)} is below the {show(chain.spent)} already spent")
                if values["delta"] is not None and account.accountant == "approx_dp":
                    if Fraction(values["delta"]) < chain.delta_spent:
                        raise ValueError(
                            f"account {name!r}: delta {values['delta']} is below the {chain.delta_spent} already spent"
                        )
                changed = {field: value for field, value in values.items() if getattr(row, field) != value}
                if not changed and not new_governor_key:
                    continue
                chain.append(
                    conn, "account_updated", context,
                    details={
                        "config": account.as_record(),
                        "stored": governed_values(values),
                        "before": governed_values(row),
                        "changed": sorted(changed) + (["governor_key"] if new_governor_key else []),
                        **({"governor_key_id": key.key_id} if new_governor_key else {}),
                    },
                )
                chain.flush(conn, **changed)
                fields = sorted(k for k in changed if k != "config") + (["governor key"] if new_governor_key else [])
                fields = [_describe_change(field, row, values) for field in fields]
                if "config" in changed:
                    from dp_operators.ledger.structure import config_record, requires_enforced_bounding

                    was = requires_enforced_bounding(config_record(row.config))
                    if was != account.require_enforced_bounding:
                        fields.append(f"require_enforced_bounding {str(was).lower()} -> "
                                      f"{str(account.require_enforced_bounding).lower()}")
                fields = fields or ["configuration as written"]
                changes.append(f"updated account {name!r}: {', '.join(fields)}")
            return changes

        if dry_run:
            return self._rolled_back(work)
        return self._write(work)

    def _rolled_back(self, work: Any) -> Any:
        """Run ``work`` in a write transaction (with its locks and checks) and roll it back."""
        with self.engine.connect() as conn:
            transaction = conn.begin()
            try:
                return work(conn)
            finally:
                transaction.rollback()

    @staticmethod
    def _check_governor_key(conn: Connection, key: AuditKey, new_governor_key: bool) -> None:
        """Refuse a governor key that is an account's spend key, or that this ledger has never seen sign a
        governance event unless it is announced as new (a wrong key file would otherwise write events that verify
        then rejects). A check for honest mistakes: code that skips it is caught by verify."""
        spending = conn.execute(
            sa.select(schema.accounts.c.name).where(schema.accounts.c.spend_key_id == key.key_id).limit(1)
        ).first()
        if spending is not None:
            raise LedgerKeyError(
                f"the governor key given is the spend key of account {spending.name!r} (id {key.key_id!r}), which "
                "the workers hold; give the privacy officer's governor key. Nothing was changed"
            )
        events = schema.audit_events.c
        governance = sa.select(events.id).where(
            events.event.in_(sorted(GOVERNANCE_EVENTS)), events.key_id.is_not(None)
        )
        if new_governor_key or conn.execute(governance.limit(1)).first() is None:
            return
        if conn.execute(governance.where(events.key_id == key.key_id).limit(1)).first() is None:
            raise LedgerKeyError(
                f"governor key id {key.key_id!r} has never signed this ledger's governance events: a wrong key? "
                "Nothing was changed. To rotate the governor key, apply with the new key and --new-governor-key"
            )
        rotation = conn.execute(
            sa.select(events.details)
            .where(events.event == "account_updated", events.details.like('%"governor_key_id"%'))
            .order_by(events.id.desc())
            .limit(1)
        ).scalar()
        current = json.loads(rotation).get("governor_key_id") if rotation else None
        if current is not None and current != key.key_id:
            raise LedgerKeyError(
                f"governor key id {key.key_id!r} was retired when the ledger rotated to governor key id "
                f"{current!r}; nothing was changed. Use the current governor key"
            )

    def refuse_accountant_changes(self, accountants: Mapping[str, str]) -> None:
        """Raise the "accountant is fixed" :class:`ValueError` if any existing account in ``accountants``
        (``{name: accountant}`` as written in a configuration) has another accountant; read-only.

        Raises:
            ValueError: an accountant would change.
            LedgerNotInitialisedError: no schema.
        """
        self.check_schema()
        if not accountants:
            return
        with self._read() as conn:
            rows = conn.execute(
                sa.select(schema.accounts.c.name, schema.accounts.c.accountant)
                .where(schema.accounts.c.name.in_(sorted(accountants)))
                .order_by(schema.accounts.c.name)
            ).all()
        for name, stored in rows:
            if stored != accountants[name]:
                raise ValueError(accountant_fixed(name, stored, accountants[name]))

    def reconcile(self, *, audit: Mapping[str, Any] | None = None) -> list[dict]:
        """Mark every reservation whose lease has expired ``abandoned`` (still spent), signed with the governor
        key; returns them (see :func:`~dp_operators.ledger.spend.reconcile_expired`)."""
        return reconcile_expired(
            self, self._governor_key(), {"command": "reconcile", **(audit or {})}, governor=True
        )

    def verify(
        self,
        keyring: Keyring | None = None,
        config: LedgerConfig | None = None,
        *,
        governor_key_ids: set[str] | None = None,
    ) -> Any:
        """Replay every account's audit chain and cross-check it with every charge and account row; see
        :func:`dp_operators.ledger.verify.verify_ledger`.

        Args:
            keyring: keys to check the MACs with (current and retired keys of both roles); defaults to the keys
                this governor holds. Without any key, every check but authenticity runs.
            config: optionally, a ledger configuration the account rows must match.
            governor_key_ids: which of ``keyring``'s keys are governor keys (default: this governor's key).
        """
        from dp_operators.ledger.verify import verify_ledger

        self.check_schema()
        if keyring is None:
            keyring = Keyring([self._key, self._spend_key])
        governor_ids = governor_key_ids
        if governor_ids is None and self._key is not None:
            governor_ids = {self._key.key_id}
        return verify_ledger(self, keyring if len(keyring) else None, config, governor_key_ids=governor_ids)


    # -- approval before a large charge (dp_operators.ledger.approvals) -------------------------------------------
    def approval_requests(self, account: str | None = None, *, pending: bool = False) -> list[dict[str, Any]]:
        """The approval requests (oldest first, by account) with their plan and decision (see
        :func:`dp_operators.ledger.approvals.requests`), each with ``expires_at`` and ``timed_out`` (undecided past
        its account's ``timeout_hours``, on the database's clock); ``pending``: only those still to decide."""
        from dp_operators.ledger import approvals

        self.check_schema()
        with self._read() as conn:
            found = approvals.requests(conn, account)
            now = self._db_now(conn)
            policies = {row.name: approvals.policy_of(row.config) for row in conn.execute(
                sa.select(schema.accounts.c.name, schema.accounts.c.config))}
        for request in found:
            requested = dt.datetime.fromisoformat(request["requested_at"])
            if requested.tzinfo is None:
                requested = requested.replace(tzinfo=dt.timezone.utc)
            expires = requested + approvals.timeout_of(policies.get(request["account"]))
            request["expires_at"] = expires.isoformat()
            request["timed_out"] = request["decision"] is None and now >= expires
        if pending:
            found = [r for r in found if r["decision"] is None and not r["timed_out"]]
        return found

    def decide_approval(
        self,
        account: str,
        request: int,
        *,
        approve: bool,
        reason: str | None = None,
        user: str | None = None,
        audit: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Grant or reject approval request ``request`` (its sequence number on ``account``): an
        ``approval_granted`` or ``approval_rejected`` event signed with the governor key, naming the request and
        copying its release key, amount, spec hash and mechanisms, with ``details.reason`` and
        ``details.decided_by`` (``user``, default this login's name); its ``created_at`` is when. A request is
        decided once; one past its timeout may only be rejected (it already counts as rejected).

        Raises:
            LedgerKeyError: no governor key, or not one this ledger knows (as :meth:`apply_config`).
            AccountNotFoundError: no such account.
            ValueError: no such request on the account, not signed by the account's spend key, already decided,
                timed out (to grant), or a reason longer than 1000 characters.
        """
        from dp_operators.ledger import approvals
        from dp_operators.ledger.errors import AccountNotFoundError
        from dp_operators.ledger.store import not_found

        self.check_schema()
        key = self._governor_key()
        if reason is not None and len(reason) > approvals.MAX_REASON_CHARS:
            raise ValueError(f"a decision's reason is at most {approvals.MAX_REASON_CHARS} characters")
        decided_by = user or user_name()
        context = audit_context({"user": decided_by, "command": "approve", **(audit or {})})
        events = schema.audit_events.c

        def work(conn: Connection) -> dict[str, Any]:
            self._check_governor_key(conn, key, False)
            chain = AccountChain.lock(conn, account, key)
            if chain is None:
                raise AccountNotFoundError(not_found(account))
            asked = conn.execute(sa.select(schema.audit_events).where(
                events.account == account, events.account_seq == request)).first()
            if asked is None or asked.event != approvals.APPROVAL_REQUESTED:
                raise ValueError(f"account {account!r} has no approval request {request} (see 'dpctl ledger "
                                 "approvals')")
            if asked.key_id is None or asked.key_id != chain.row.spend_key_id:
                raise ValueError(f"approval request {request} of account {account!r} is not signed by the account's "
                                 f"spend key (key id {asked.key_id!r}): not a worker's request; run 'dpctl ledger "
                                 "verify'")
            if self._spend_key is not None and self._spend_key.key_id == asked.key_id:
                from dp_operators.ledger.chain import audit_row_mac

                if audit_row_mac(asked._mapping, self._spend_key) != asked.row_hash:
                    raise ValueError(f"approval request {request} of account {account!r} does not carry a valid "
                                     "MAC: the ledger was altered; run 'dpctl ledger verify'")
            for row in conn.execute(sa.select(events.details, events.event).where(
                    events.account == account, events.event.in_(sorted(approvals.APPROVAL_DECISIONS)))):
                try:
                    named = json.loads(row.details or "{}").get("request")
                except (ValueError, AttributeError):
                    named = None
                if named == request:
                    raise ValueError(f"approval request {request} of account {account!r} was already decided "
                                     f"({row.event})")
            now = self._db_now(conn)
            requested = dt.datetime.fromisoformat(asked.created_at)
            if requested.tzinfo is None:
                requested = requested.replace(tzinfo=dt.timezone.utc)
            expires = requested + approvals.timeout_of(approvals.policy_of(chain.row.config))
            if approve and now >= expires:
                raise ValueError(f"approval request {request} of account {account!r} timed out at "
                                 f"{expires.isoformat()}: it counts as rejected and cannot be granted (the release "
                                 "files a new request when it runs again under another release key)")
            event = approvals.APPROVAL_GRANTED if approve else approvals.APPROVAL_REJECTED
            row = chain.append(
                conn, event, context, dag_id=asked.dag_id, run_id=asked.run_id, task_id=asked.task_id,
                map_index=asked.map_index, release_name=asked.release_name, amount=asked.amount,
                delta_amount=asked.delta_amount, spec_hash=asked.spec_hash, mechanisms=asked.mechanisms,
                details={"request": request, "reason": reason, "decided_by": decided_by},
            )
            chain.flush(conn)
            return {"account": account, "request": request, "decision": "granted" if approve else "rejected",
                    "event_seq": row["account_seq"], "decided_at": row["created_at"], "decided_by": decided_by}

        return self._write(work)


def _owner_only(database: str | None) -> None:
    """Make a SQLite ledger file (and its WAL files) readable and writable by its owner only (mode 600): on SQLite
    file permissions are the only barrier between tasks and governance (docs/ledger.md)."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    for suffix in ("", "-wal", "-shm"):
        path = Path(database + suffix)
        if path.exists():
            path.chmod(0o600)


def _row_dict(row: Any) -> dict[str, Any]:
    return dict(row._mapping)


def _refuse_structure_change(conn: Connection, name: str, account: Any) -> None:
    """Refuse a configuration that would give records a fresh budget: once any member of account ``name`` (a
    privacy block or a team quota) or the account itself was charged, its structure (plain, blocks of a given
    window, quotas) and its privacy unit are fixed. Re-partitioning spent blocks into other windows, or dropping
    them, would let the same records be charged again on new blocks; changing the unit would let a spec for
    another unit spend on blocks that protect this one (docs/ledger.md, "Privacy blocks and team quotas").

    Raises:
        ValueError: such a change (nothing is changed).
    """
    from dp_operators.ledger.structure import MEMBER_SEPARATOR, config_record, structure_of

    row = conn.execute(sa.select(schema.accounts.c.config, schema.accounts.c.privacy_unit)
                       .where(schema.accounts.c.name == name)).first()
    if row is None:
        return
    before = structure_of(config_record(row.config))
    after = structure_of(account.as_record())
    shape = lambda kind_detail: (kind_detail[0], kind_detail[1] if kind_detail[0] == "blocks" else None)  # noqa: E731
    if shape(before) == shape(after) and (row.privacy_unit == account.privacy_unit or before[0] == "plain"):
        return  # a plain account's unit: apply's own check of the row (its charges) says it
    c = schema.charges.c
    charged = conn.execute(
        sa.select(c.account).where(sa.or_(c.account == name,
                                          c.account.startswith(name + MEMBER_SEPARATOR, autoescape=True))).limit(1)
    ).first()
    if charged is None:
        return
    what = []
    if shape(before) != shape(after):
        describe = lambda k: {"plain": "no blocks or quotas", "quotas": "team quotas"}.get(  # noqa: E731
            k[0], f"{k[1]} privacy blocks")
        what.append(f"its structure ({describe(before)} -> {describe(after)})")
    if row.privacy_unit != account.privacy_unit:
        what.append(f"its privacy unit ({row.privacy_unit!r} -> {account.privacy_unit!r})")
    raise ValueError(
        f"account {name!r}: {' and '.join(what)} cannot change once it or one of its members "
        f"({charged.account!r}) was charged: the records its blocks or quotas spent on would get a fresh budget "
        "under the new structure (a block never gets budget back). Create a new account instead"
    )


def accountant_fixed(name: str, stored: str, wanted: str) -> str:
    return (
        f"account {name!r}: the accountant is fixed at creation ({stored}); cannot change it to {wanted}. "
        "Create a new account instead."
    )


def governed_values(values: Any) -> dict[str, Any]:
    """The governed values an ``account_created``/``account_updated`` event records (``details.stored`` and
    ``details.before``) of an account row or of the values about to be written: those of
    :func:`~dp_operators.ledger.store.stored_config`, and ``allowed_roles`` (schema 4) in any case."""
    get = values.get if isinstance(values, Mapping) else lambda name: getattr(values, name)
    return {**stored_config(values), "allowed_roles": get("allowed_roles")}


def account_values(account: Any) -> dict[str, Any]:
    """The account-row values a configuration stands for (the cap converted to the account's unit); the spend key
    id is added by :meth:`LedgerGovernor.apply_config`. ``allowed_roles`` is stored as canonical JSON of the sorted,
    distinct role names, or ``None`` (any spender)."""
    return {
        "accountant": account.accountant,
        "cap": str(account.cap_in_unit()),
        "delta": None if account.delta is None else str(account.delta),
        "privacy_unit": account.privacy_unit,
        "allowed_dags": json.dumps(sorted(account.allowed_dags)),
        "allowed_roles": allowed_roles_text(account.allowed_roles),
        "owner": account.owner,
        "description": account.description,
        "config": canonical_json(account.as_record()),
    }


def _describe_change(field: str, row: Any, values: Mapping[str, Any]) -> str:
    """One changed field of an ``account_updated``, as ``dpctl ledger apply`` prints it: the allowed roles before and
    after; the spend key's ids before and after, with what the workers must do (a key file given by mistake re-keys
    the account, and every worker's charge is then refused until the connection holds the new key)."""
    if field == "allowed_roles":
        return (f"allowed_roles ({describe_allowed_roles(row.allowed_roles)} -> "
                f"{describe_allowed_roles(values['allowed_roles'])})")
    if field == "spend_key_id":
        return (f"spend key id {row.spend_key_id or '(none)'} -> {values['spend_key_id']} (workers' charges need the "
                "new spend key in their ledger connection; to undo, apply again with the previous --audit-key-file)")
    return field
