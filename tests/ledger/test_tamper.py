"""The tamper suite: every attack listed below, on SQLite and PostgreSQL, must be BLOCKED (the database
or the ledger refuses it and nothing changes) or DETECTED (``dpctl ledger verify`` with the keys exits 3 and its
first line names the row).

Who attacks:

* ``sqlite``: anyone who can write the database file (task code on the same machine): raw SQL, the chain code
  with the spend key the workers hold, or the ledger's Python API.
* ``postgresql (spender)``: task code connected as the spender role (:mod:`dp_operators.ledger.roles`), holding
  the spend key; it writes no table (it executes the spend functions, docs/adr/0029), so every attack that needs
  a raw INSERT or UPDATE is blocked by the database.
* ``postgresql (owner)``: the tables' owner, a superuser here: it can bypass or neuter every trigger, so only
  the keyed chain and the replay stand between it and an undetected edit.

The suite records (kind, attacker, outcome) and prints the table at the end of the session (terminal summary;
also on stdout under ``-s``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import (
    AuditChainError,
    AuditKey,
    LedgerConfig,
    LedgerError,
    LedgerGovernor,
    ReleaseKey,
    Reservation,
    schema,
)
from dp_operators.ledger.chain import (
    GENESIS_HASH,
    AccountChain,
    audit_row_mac,
    charge_event_fields,
    legacy_row_hash,
    timestamp_text,
)
from dp_operators.ledger.keys import GOVERNOR_KEY_ENV, SPEND_KEY_ENV
from dp_operators.ledger.roles import apply_roles
from dp_operators.ledger.spend import Ledger
from ledger_backends import account_config
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender

#: A key of the attacker's own (not in the officer's keyring).
ATTACKER_KEY = AuditKey.from_text("attacker-key-" + "x" * 40)

CONFIG = LedgerConfig(
    version=1,
    accounts={"a": account_config("pure_dp", cap=1), "b": account_config("approx_dp", cap=1, delta="1e-6")},
)

#: What a refusal says (guards against counting a broken test statement as "blocked").
REFUSALS = re.compile(
    r"permission denied|must be owner|dp_charges: only a reserved charge may change|append-only|rows are kept|"
    r"is not this reservation's|no governance call|already holds sequence number|is the spend key of account"
)

#: (kind, attacker, outcome, how) for the table.
RESULTS: list[tuple[str, str, str, str]] = []


class Refused(Exception):
    """The ledger's Python API offers no way to do what the attack needs."""


# -- the attacker's tools -----------------------------------------------------------------------------------------


@dataclass
class Target:
    """The ledger under attack: the owner's URL (verify and snapshots use it) and the attacker's."""

    url: str
    attacker_url: str
    backend: str
    attacker: str
    history: SimpleNamespace

    @contextmanager
    def connect(self, *, bypass_triggers: bool = False) -> Iterator[sa.Connection]:
        """One transaction on the attacker's connection; ``bypass_triggers`` as an owner who gets past the guard
        triggers (SQLite: drop them, then re-create them exactly; PostgreSQL: a superuser's replica role)."""
        engine = sa.create_engine(self.attacker_url)
        try:
            with engine.begin() as conn:
                if bypass_triggers and self.backend == "sqlite":
                    for name in [row[0] for row in conn.exec_driver_sql(
                            "SELECT name FROM sqlite_master WHERE type = 'trigger'")]:
                        conn.exec_driver_sql(f"DROP TRIGGER {name}")
                elif bypass_triggers:
                    conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
                yield conn
                if bypass_triggers and self.backend == "sqlite":
                    for statement in schema.trigger_ddl("sqlite"):
                        conn.exec_driver_sql(statement)
        finally:
            engine.dispose()

    def sql(self, *statements: str, bypass_triggers: bool = False) -> None:
        with self.connect(bypass_triggers=bypass_triggers) as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)

    def spender(self) -> Ledger:
        """The ledger's Python API on the attacker's connection, with the workers' spend key."""
        return Ledger(self.attacker_url, audit_key=SPEND_KEY)

    def charge(self, run: str):
        with self.connect() as conn:
            return conn.execute(sa.select(schema.charges).where(schema.charges.c.run_id == run)).one()


def where(event_id: int) -> str:
    return f"dp_audit_events id={event_id} ("


def raw_append(conn: sa.Connection, account: str, event: str, *, key_id: str | None, mac_key: AuditKey | None = None,
               row_hash: str | None = None, move_head: bool = True, spent_after: str | None = None,
               **fields) -> int:
    """Insert ``event`` at the next sequence number of ``account``'s chain, linked to its head, as raw SQL would:
    claiming ``key_id``, with the MAC of ``mac_key`` if the attacker has one, the plain SHA-256 of a schema-2 row
    if ``key_id`` is None, else ``row_hash`` (made up). ``move_head`` also moves the account's head (and its spent
    to ``spent_after``), as a careful attacker would. Returns the row's id."""
    account_row = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == account)).one()
    values = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
    values.update(
        account=account, account_seq=account_row.audit_seq + 1, event=event, context="{}",
        created_at=timestamp_text(dt.datetime.now(dt.timezone.utc)), prev_hash=account_row.audit_head or GENESIS_HASH,
        spent_after=spent_after if spent_after is not None else account_row.spent,
        delta_spent_after=account_row.delta_spent, key_id=key_id,
    )
    values.update(fields)
    if mac_key is not None:
        values["row_hash"] = audit_row_mac(values, mac_key)
    elif key_id is None:
        values["row_hash"] = legacy_row_hash(values)
    else:
        values["row_hash"] = row_hash or "f" * 64
    new_id = conn.execute(schema.audit_events.insert().values(**values)).inserted_primary_key[0]
    if move_head:
        conn.execute(schema.accounts.update().where(schema.accounts.c.name == account).values(
            audit_seq=values["account_seq"], audit_head=values["row_hash"], spent=values["spent_after"]))
    return new_id


def spend_key_append(conn: sa.Connection, account: str, event: str, *, spent: Fraction | None = None,
                     flush: dict | None = None, **fields) -> int:
    """Append ``event`` with the chain code and the workers' spend key (what a worker gone rogue can do)."""
    chain = AccountChain.lock(conn, account, SPEND_KEY)
    if spent is not None:
        chain.spent = spent
    row = chain.append(conn, event, {"host": "attacker"}, **fields)
    chain.flush(conn, **(flush or {}))
    return conn.execute(sa.select(schema.audit_events.c.id).where(
        schema.audit_events.c.row_hash == row["row_hash"])).scalar_one()


def stored_config(conn: sa.Connection, account: str, **changes) -> str:
    row = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == account)).one()
    stored = {name: getattr(row, name) for name in schema.ACCOUNT_GOVERNED_COLUMNS}
    return json.dumps({"stored": {**stored, **changes}})


# -- the attacks: each returns the text the first line of verify must name (or raises: blocked) -----------------


def forged_cap_raise_without_key(t: Target) -> str:
    with t.connect() as conn:
        forged = raw_append(conn, "a", "account_updated", key_id=GOVERNOR_KEY.key_id,
                            details=stored_config(conn, "a", cap="100"))
        conn.exec_driver_sql("UPDATE dp_budget_accounts SET cap = '100' WHERE name = 'a'")
    return where(forged)


def forged_cap_raise_with_spend_key(t: Target) -> str:
    with t.connect() as conn:
        forged = spend_key_append(conn, "a", "account_updated", details=json.loads(stored_config(conn, "a", cap="100")),
                                  flush={"cap": "100"})
    return where(forged)


def released_after_committed(t: Target) -> str:
    charge = t.charge("r1")
    with t.connect() as conn:
        # the committed event's proof is public once the charge is terminal: it does not help here
        proof = conn.execute(sa.select(schema.audit_events.c.proof).where(
            schema.audit_events.c.charge_id == charge.id, schema.audit_events.c.event == "committed")).scalar_one()
        spent = Fraction(conn.execute(sa.select(schema.accounts.c.spent).where(
            schema.accounts.c.name == "a")).scalar_one()) - Fraction(charge.amount)
        forged = spend_key_append(conn, "a", "released", spent=spent, proof=proof, **charge_event_fields(charge))
    return where(forged)


def refund_committed_by_state_update(t: Target) -> str:
    charge_id = t.charge("r1").id
    t.sql(f"UPDATE dp_charges SET state = 'released' WHERE id = {charge_id}")
    return f"dp_charges id={charge_id} ("


def account_migrated_resetting_spend(t: Target) -> str:
    with t.connect() as conn:
        details = json.loads(stored_config(conn, "a"))
        forged = spend_key_append(conn, "a", "account_migrated", spent=Fraction(0),
                                  details={**details, "last_charge_id": 10**6})
    return where(forged)


def release_as_other_account_api(t: Target) -> str:
    live: Reservation = t.history.live
    t.spender().release(dataclasses.replace(live, account="b"))
    return f"dp_charges id={live.charge_id} ("


def release_as_other_account_forged(t: Target) -> str:
    charge = t.charge("r3")
    with t.connect() as conn:
        spent = Fraction(conn.execute(sa.select(schema.accounts.c.spent).where(
            schema.accounts.c.name == "b")).scalar_one()) - Fraction(charge.amount)
        forged = spend_key_append(conn, "b", "released", spent=spent, proof="guess", **charge_event_fields(charge))
    return where(forged)


def release_without_token_api(t: Target) -> str:
    charge = t.charge("r3")  # everything about another worker's reservation is readable, except its token
    stolen = Reservation(
        charge_id=charge.id, key=ReleaseKey(charge.dag_id, charge.run_id, charge.task_id, charge.map_index,
                                            charge.release_name),
        account=charge.account, amount=Fraction(charge.amount), attempt=charge.attempt, token="guess",
    )
    t.spender().release(stolen)
    return f"dp_charges id={charge.id} ("


def release_without_token_forged(t: Target) -> str:
    charge = t.charge("r3")
    with t.connect() as conn:
        conn.exec_driver_sql(f"UPDATE dp_charges SET state = 'released' WHERE id = {charge.id}")
        spent = Fraction(conn.execute(sa.select(schema.accounts.c.spent).where(
            schema.accounts.c.name == "a")).scalar_one()) - Fraction(charge.amount)
        forged = spend_key_append(conn, "a", "released", spent=spent, proof="guess", **charge_event_fields(charge))
    return where(forged)


def apply_config_through_the_spender_api(t: Target) -> str:
    worker = t.spender()
    if not hasattr(worker, "apply_config"):
        raise Refused("the spender's Ledger has no governance call (no apply_config)")
    worker.apply_config(CONFIG)  # pragma: no cover - the attack succeeded
    return "dp_audit_events"


RAISED = LedgerConfig(version=1, accounts={
    "a": account_config("pure_dp", cap=1000, dags=("d", "evil")), "c": account_config("pure_dp", cap=1000)})


def apply_config_with_the_spend_key(t: Target) -> str:
    """The attacker's own copy of the governor's code, without its key checks (a Python check binds nobody)."""
    with t.connect() as conn:
        first = (conn.execute(sa.select(sa.func.max(schema.audit_events.c.id))).scalar() or 0) + 1
    unchecked = LedgerGovernor(t.attacker_url, governor_key=SPEND_KEY, spend_key=ATTACKER_KEY)
    unchecked._check_governor_key = lambda *args: None
    unchecked.apply_config(RAISED)
    return where(first)


def apply_config_api_with_the_spend_key(t: Target) -> str:
    LedgerGovernor(t.attacker_url, governor_key=SPEND_KEY, spend_key=ATTACKER_KEY).apply_config(
        RAISED, new_governor_key=True)
    return ""


def edit_charge(column: str, value: str, run: str = "r1", *, bypass: bool = False) -> Callable[[Target], str]:
    def attack(t: Target) -> str:
        charge_id = t.charge(run).id
        t.sql(f"UPDATE dp_charges SET {column} = {value} WHERE id = {charge_id}", bypass_triggers=bypass)
        return f"dp_charges id={charge_id} ("

    return attack


def noop_trigger_same_name(t: Target) -> str:
    t.sql("DROP TRIGGER dp_charges_guard",
          "CREATE TRIGGER dp_charges_guard BEFORE UPDATE ON dp_charges BEGIN SELECT 1; END")
    return "trigger dp_charges_guard does not have its expected definition"


def dropped_trigger(t: Target) -> str:
    suffix = "" if t.backend == "sqlite" else " ON dp_audit_events"
    t.sql(f"DROP TRIGGER dp_audit_no_update{suffix}")
    return "trigger dp_audit_no_update"


def disable_trigger_user(t: Target) -> str:
    t.sql("ALTER TABLE dp_charges DISABLE TRIGGER USER")
    return "is disabled (tgenabled='D')"


def replaced_trigger_function(t: Target) -> str:
    t.sql("CREATE OR REPLACE FUNCTION dp_charges_guard() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; "
          "END $$")
    return "trigger function dp_charges_guard() of dp_charges_guard was replaced"


def non_numeric_spent(t: Target) -> str:
    t.sql("UPDATE dp_budget_accounts SET spent = 'lots' WHERE name = 'a'")
    _next_reserve_is_refused(t, "a")
    return "dp_budget_accounts 'a': spent 'lots' is not a number"


def lowered_spent(t: Target) -> str:
    t.sql("UPDATE dp_budget_accounts SET spent = '0' WHERE name = 'a'")
    return "dp_budget_accounts 'a': spent 0"


def lowered_spent_stops_reserves(t: Target) -> str:
    t.sql("UPDATE dp_budget_accounts SET spent = '0' WHERE name = 'a'")
    _next_reserve_is_refused(t, "a")
    return "dp_budget_accounts 'a': spent 0"


def forged_head_lowering_spent(claimed: str) -> Callable[[Target], str]:
    """Append a head claiming another key id (the governor's, or made up) that states spent 0, and point the
    account row at it: the head agrees with the row, but not the newest event the spend key signed."""
    def attack(t: Target) -> str:
        key_id = GOVERNOR_KEY.key_id if claimed == "governor" else "0123456789abcdef"
        with t.connect() as conn:
            forged = raw_append(conn, "a", "refused", key_id=key_id, dag_id="d", spent_after="0")
        _next_reserve_is_refused(t, "a")
        return where(forged)

    return attack


def junk_row_at_next_seq(t: Target) -> str:
    with t.connect() as conn:
        forged = raw_append(conn, "a", "junk", key_id=None, row_hash="junk", move_head=False, spent_after="?")
    _next_reserve_is_refused(t, "a")
    return where(forged)


def forged_append_schema_2_hash(t: Target) -> str:
    with t.connect() as conn:
        forged = raw_append(conn, "a", "refused", key_id=None, dag_id="d", amount="1")
    return where(forged)


def forged_append_own_key(t: Target) -> str:
    with t.connect() as conn:
        forged = raw_append(conn, "a", "refused", key_id=ATTACKER_KEY.key_id, mac_key=ATTACKER_KEY, dag_id="d",
                            amount="1")
    return where(forged)


def forged_append_claimed_spend_key(t: Target) -> str:
    with t.connect() as conn:
        forged = raw_append(conn, "a", "refused", key_id=SPEND_KEY.key_id, dag_id="d", amount="1")
    return where(forged)


def wrong_chain_event(t: Target) -> str:
    charge = t.charge("r3")
    with t.connect() as conn:
        forged = spend_key_append(conn, "b", "abandoned", **charge_event_fields(charge))
    return where(forged)


def edit_audit_row(*, bypass: bool) -> Callable[[Target], str]:
    def attack(t: Target) -> str:
        with t.connect() as conn:
            target = conn.execute(sa.select(sa.func.min(schema.audit_events.c.id)).where(
                schema.audit_events.c.event == "reserved")).scalar_one()
        t.sql(f"UPDATE dp_audit_events SET amount = '1/1000' WHERE id = {target}", bypass_triggers=bypass)
        return where(target)

    return attack


def delete_audit_row(*, bypass: bool) -> Callable[[Target], str]:
    def attack(t: Target) -> str:
        with t.connect() as conn:
            target = conn.execute(sa.select(sa.func.min(schema.audit_events.c.id)).where(
                schema.audit_events.c.event == "reserved")).scalar_one()
            after = conn.execute(sa.select(sa.func.min(schema.audit_events.c.id)).where(
                schema.audit_events.c.id > target, schema.audit_events.c.account == "a")).scalar_one()
        t.sql(f"DELETE FROM dp_audit_events WHERE id = {target}", bypass_triggers=bypass)
        return where(after)

    return attack


def delete_charge(*, bypass: bool) -> Callable[[Target], str]:
    def attack(t: Target) -> str:
        with t.connect() as conn:
            first_event = conn.execute(sa.select(sa.func.min(schema.audit_events.c.id)).where(
                schema.audit_events.c.charge_id == t.charge("r2").id)).scalar_one()
        t.sql(f"DELETE FROM dp_charges WHERE id = {t.charge('r2').id}", bypass_triggers=bypass)
        return where(first_event)

    return attack


def _next_reserve_is_refused(t: Target, account: str) -> None:
    """After the tamper, the next reservation on ``account`` is refused with a LedgerError naming the problem
    (not a raw database error), and changes nothing."""
    with pytest.raises(AuditChainError, match="dpctl ledger verify"):
        t.spender().reserve(ReleaseKey("d", "after", "t", -1, "r"), account=account, amount=Fraction(1, 100),
                            mechanisms=[], spec_hash="0" * 64)


# -- the catalogue: (kind, attack, expected outcome per attacker) ----------------------------------------------

B, D = "blocked", "detected"


@dataclass(frozen=True)
class Kind:
    name: str
    attack: Callable[[Target], str]
    outcomes: dict[str, str]  # attacker -> expected outcome; attackers: sqlite, spender, owner
    slow: bool = False  # ``make test-slow`` only: a variant of a kind that ``make test`` runs (ADR 30)


def _every(outcome: str, **overrides: str) -> dict[str, str]:
    return {"sqlite": outcome, "spender": outcome, "owner": outcome, **overrides}


#: A committed charge is refused whatever column is edited (the guard's first condition), and verify compares every
#: fixed column with the charge's events in one loop (created_at read per database): ``make test`` edits the run_id
#: and created_at, the other columns are ``slow`` (ADR 30).
CHARGE_EDITS = {
    "run_id": "'other-run'", "release_name": "'other-release'", "task_id": "'other-task'",
    "created_at": "'2000-01-01 00:00:00'", "mechanisms": "'[]'", "spec_hash": "'" + "1" * 64 + "'", "attempt": "7",
}
FAST_EDITS = ("run_id", "created_at")

KINDS = [
    Kind("forged account_updated raising a cap (no key)", forged_cap_raise_without_key, _every(D, spender=B)),
    Kind("forged account_updated raising a cap (spend key)", forged_cap_raise_with_spend_key, _every(D, spender=B)),
    Kind("released after committed (spend key)", released_after_committed, _every(D, spender=B)),
    Kind("refund a committed charge by UPDATE state", refund_committed_by_state_update, _every(B)),
    Kind("account_migrated resetting spend (spend key)", account_migrated_resetting_spend, _every(D, spender=B)),
    Kind("release A's reservation as account B (API)", release_as_other_account_api,
         {"sqlite": B, "spender": B}),
    Kind("release A's reservation in B's chain (spend key)", release_as_other_account_forged, _every(D, spender=B)),
    Kind("release another worker's reservation without its token (API)", release_without_token_api,
         {"sqlite": B, "spender": B}),
    Kind("release another worker's reservation without its token (spend key)", release_without_token_forged,
         _every(D, spender=B)),
    Kind("apply_config through the spender's Ledger (API)", apply_config_through_the_spender_api,
         {"sqlite": B, "spender": B}),
    Kind("apply_config on the spender connection with the spend key", apply_config_with_the_spend_key,
         _every(D, spender=B)),
    Kind("apply_config with the spend key as governor key (API)", apply_config_api_with_the_spend_key, _every(B)),
    *[Kind(f"edit a charge's {column}", edit_charge(column, value), _every(B), slow=column not in FAST_EDITS)
      for column, value in CHARGE_EDITS.items()],
    *[Kind(f"edit a charge's {column} (guard trigger bypassed)", edit_charge(column, value, bypass=True),
           {"sqlite": D, "owner": D}, slow=column not in FAST_EDITS) for column, value in CHARGE_EDITS.items()],
    Kind("re-key a charge: claim another DAG's dag_id", edit_charge("dag_id", "'other-dag'"), _every(B)),
    Kind("re-key a charge: claim another DAG's dag_id (guard trigger bypassed)",
         edit_charge("dag_id", "'other-dag'", bypass=True), {"sqlite": D, "owner": D}),
    Kind("re-key a reservation: replace its token_hash", edit_charge("token_hash", "'" + "3" * 64 + "'", run="r3"),
         _every(B)),
    Kind("re-key a reservation: replace its token_hash (guard trigger bypassed)",
         edit_charge("token_hash", "'" + "3" * 64 + "'", run="r3", bypass=True), {"sqlite": D, "owner": D}),
    Kind("edit a published output", edit_charge("output", "'{\"value\":42}'"), _every(B)),
    Kind("edit a published output (guard trigger bypassed)", edit_charge("output", "'{\"value\":42}'", bypass=True),
         {"sqlite": D, "owner": D}),
    Kind("no-op trigger with the same name", noop_trigger_same_name, {"sqlite": D}),
    Kind("dropped guard trigger", dropped_trigger, {"sqlite": D, "spender": B, "owner": D}),
    Kind("DISABLE TRIGGER USER", disable_trigger_user, {"spender": B, "owner": D}),
    Kind("replaced trigger function", replaced_trigger_function, {"spender": B, "owner": D}),
    Kind("non-numeric spent", non_numeric_spent, _every(D, spender=B)),
    Kind("lowered spent", lowered_spent, _every(D, spender=B)),
    Kind("lowered spent, then reserve", lowered_spent_stops_reserves, _every(D, spender=B)),
    Kind("forged head under the governor's key id lowering spent", forged_head_lowering_spent("governor"),
         _every(D, spender=B)),
    Kind("forged head under a made-up key id lowering spent", forged_head_lowering_spent("made up"),
         _every(D, spender=B)),
    Kind("junk audit row at the next seq", junk_row_at_next_seq, _every(D, spender=B)),
    Kind("forged append: unkeyed row with a plain SHA-256", forged_append_schema_2_hash, _every(D, spender=B)),
    Kind("forged append: signed with the attacker's own key", forged_append_own_key, _every(D, spender=B)),
    Kind("forged append: claims the spend key, MAC made up", forged_append_claimed_spend_key, _every(D, spender=B)),
    Kind("wrong-chain event (spend key)", wrong_chain_event, _every(D, spender=B)),
    Kind("edit an audit row", edit_audit_row(bypass=False), _every(B)),
    Kind("edit an audit row (trigger bypassed)", edit_audit_row(bypass=True), {"sqlite": D, "owner": D}),
    Kind("delete an audit row", delete_audit_row(bypass=False), _every(B)),
    Kind("delete an audit row (trigger bypassed)", delete_audit_row(bypass=True), {"sqlite": D, "owner": D}),
    Kind("delete a charge", delete_charge(bypass=False), _every(B)),
    Kind("delete a charge (trigger bypassed)", delete_charge(bypass=True), {"sqlite": D, "owner": D}),
]

ATTACKER_LABELS = {"sqlite": "sqlite", "spender": "postgresql (spender)", "owner": "postgresql (owner)"}


def _cases():
    for kind in KINDS:
        for attacker, outcome in kind.outcomes.items():
            backend = "sqlite" if attacker == "sqlite" else "postgresql"
            yield pytest.param(kind, backend, attacker, outcome, id=f"{kind.name} [{ATTACKER_LABELS[attacker]}]",
                               marks=[pytest.mark.slow] if kind.slow else [])


# -- fixtures -----------------------------------------------------------------------------------------------------




@pytest.fixture(scope="module", autouse=True)
def outcome_table(request) -> Iterator[None]:
    """Print the table of kinds and outcomes at the end: on stdout (``-s``) and in pytest's terminal summary."""

    class Summary:
        def pytest_terminal_summary(self, terminalreporter) -> None:
            terminalreporter.write_sep("=", "ledger tamper suite: kinds and outcomes")
            for line in _table():
                terminalreporter.write_line(line)

    plugin = Summary()
    request.config.pluginmanager.register(plugin, f"dp-tamper-table-{id(plugin)}")
    yield
    print("\n" + "\n".join(_table()))


def _table() -> list[str]:
    columns = list(ATTACKER_LABELS)
    cells: dict[str, dict[str, str]] = {}
    for kind, attacker, outcome, _ in RESULTS:
        cells.setdefault(kind, {})[attacker] = outcome
    width = max([len(kind.name) for kind in KINDS] + [4])
    header = f"{'kind':<{width}} | " + " | ".join(f"{ATTACKER_LABELS[c]:<20}" for c in columns)
    lines = [header, "-" * len(header)]
    for kind in KINDS:
        if kind.name not in cells:
            continue
        row = cells[kind.name]
        lines.append(f"{kind.name:<{width}} | " + " | ".join(f"{row.get(c, '-'):<20}" for c in columns))
    failed = [r for r in RESULTS if r[2] not in (B, D)]
    lines.append(f"{len(RESULTS)} attacks run: {sum(r[2] == B for r in RESULTS)} blocked, "
                 f"{sum(r[2] == D for r in RESULTS)} detected, {len(failed)} neither")
    return lines


def _history(url: str) -> SimpleNamespace:
    """Accounts a (pure_dp, cap 1) and b (approx_dp): a has r1, r2 committed and r3 reserved (another worker's
    live reservation); b has r4 released and r5 committed."""
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(CONFIG)
    worker = spender(url)

    def reserve(run: str, account: str, amount: str):
        return worker.reserve(ReleaseKey("d", run, "t", -1, "r"), account=account, amount=Fraction(amount),
                              mechanisms=[{"mechanism": "m"}], spec_hash="0" * 64)

    worker.commit(reserve("r1", "a", "1/10"), {"value": 1})
    worker.commit(reserve("r2", "a", "1/10"), {"value": 2})
    live = reserve("r3", "a", "1/10")
    worker.release(reserve("r4", "b", "1/100"))
    worker.commit(reserve("r5", "b", "1/100"), {"value": 5})
    return SimpleNamespace(live=live)


def _snapshot(url: str) -> dict[str, list[tuple]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found = {
                table.name: [tuple(row) for row in conn.execute(
                    sa.select(*[sa.type_coerce(c, sa.String) for c in table.c]).order_by(*table.primary_key.columns))]
                for table in (schema.schema_version, schema.accounts, schema.charges, schema.audit_events)
            }
            found["triggers"] = [tuple(schema.trigger_problems(conn))]
            return found
    finally:
        engine.dispose()


def _verify(url: str):
    """``dpctl ledger verify`` with the officer's keys (the governor key and the workers' spend key)."""
    return CliRunner().invoke(
        app, ["ledger", "verify", "--url", url],
        env={GOVERNOR_KEY_ENV: GOVERNOR_KEY.text, SPEND_KEY_ENV: SPEND_KEY.text},
    )


# -- the suite ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "ledger_url", "attacker", "expected"), list(_cases()), indirect=["ledger_url"])
def test_attack_is_blocked_or_detected(kind: Kind, ledger_url: str, attacker: str, expected: str, request):
    history = _history(ledger_url)
    attacker_url = ledger_url
    if attacker == "spender":
        spender_role, governor_role = request.getfixturevalue("pg_roles")
        apply_roles(ledger_url, spender_role, governor_role)
        attacker_url = sa.make_url(ledger_url).set(username=spender_role).render_as_string(hide_password=False)
    target = Target(ledger_url, attacker_url, "sqlite" if attacker == "sqlite" else "postgresql", attacker, history)
    assert _verify(ledger_url).exit_code == 0, "the ledger must verify before the attack"
    before = _snapshot(ledger_url)

    try:
        names = kind.attack(target)
    except (sa.exc.DBAPIError, LedgerError, Refused) as error:
        message = str(getattr(error, "orig", None) or error).splitlines()[0]
        assert REFUSALS.search(message), f"refused for an unexpected reason: {message}"
        assert _snapshot(ledger_url) == before, "a refused attack changed the ledger"
        result = _verify(ledger_url)
        assert result.exit_code == 0, result.output
        outcome, how = B, message[:90]
    else:
        result = _verify(ledger_url)
        assert result.exit_code == 3, f"UNDETECTED: verify exited {result.exit_code}:\n{result.output}"
        first = result.stderr.splitlines()[0]
        assert first.startswith("ledger inconsistent: first broken: "), first
        assert names in first, f"the first line does not name {names!r}:\n{result.stderr}"
        outcome, how = D, first.removeprefix("ledger inconsistent: first broken: ")[:90]
    RESULTS.append((kind.name, attacker, outcome, how))
    assert outcome == expected, f"{kind.name}: expected {expected}, got {outcome} ({how})"
