"""The audit log: append-only triggers, tamper detection by ``dpctl ledger verify``, and the schema upgrades
(1 -> 3 and 2 -> 3: the old history is closed by a governor-signed event and keeps verifying)."""

from __future__ import annotations

import datetime as dt
import json
from fractions import Fraction

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import Ledger, LedgerKeyError, ReleaseKey, schema
from ledger_backends import account_config, ledger_with, old_schema_metadata
from old_ledgers import version_2_ledger
from support import GOVERNOR_KEY, SPEND_KEY, governor, spender

KEYS = {"DP_LEDGER_GOVERNOR_KEY": GOVERNOR_KEY.text, "DP_LEDGER_AUDIT_KEY": SPEND_KEY.text}


def history(url: str) -> Ledger:
    """A ledger with two accounts and a few charges in every state."""
    ledger = ledger_with(url, a=account_config("pure_dp", cap=1), b=account_config("zcdp", cap="0.5", delta="1e-6"))
    for run in range(3):
        reservation = ledger.reserve(ReleaseKey("d", f"run-{run}", "t", -1, "r"), account="a",
                                     amount=Fraction(1, 10), mechanisms=[{"mechanism": "m"}], spec_hash="0" * 64)
        ledger.commit(reservation, {"value": run})
    released = ledger.reserve(ReleaseKey("d", "run-9", "t", -1, "r"), account="b", amount=Fraction(1, 100),
                              mechanisms=[], spec_hash="0" * 64)
    ledger.release(released)
    return ledger


def raw(url: str, *statements: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
    engine.dispose()


def drop_triggers(url: str) -> list[str]:
    """Statements an owner runs to get past the guard triggers (verify then also reports them missing)."""
    if url.startswith("sqlite"):
        return [f"DROP TRIGGER {name}" for name in ("dp_audit_no_update", "dp_audit_no_delete", "dp_charges_guard",
                                                     "dp_charges_no_delete")]
    return [f"DROP TRIGGER {name} ON {table}" for name, table in (
        ("dp_audit_no_update", "dp_audit_events"), ("dp_audit_no_delete", "dp_audit_events"),
        ("dp_charges_guard", "dp_charges"), ("dp_charges_no_delete", "dp_charges"))]


def verify(url: str):
    return CliRunner().invoke(app, ["ledger", "verify", "--url", url], env=KEYS)


def event_id(url: str, account: str, seq: int) -> int:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(schema.audit_events.c.id).where(
                schema.audit_events.c.account == account, schema.audit_events.c.account_seq == seq
            )
        ).scalar_one()
    engine.dispose()
    return found


def test_an_untouched_ledger_verifies(ledger_url):
    history(ledger_url)
    result = verify(ledger_url)
    assert result.exit_code == 0, result.output
    assert "ledger consistent: 10 audit events, 2 accounts, 4 charges" in result.output
    assert "authenticated" in result.output


@pytest.mark.parametrize("statement", ["UPDATE dp_audit_events SET amount = '1/1000'", "DELETE FROM dp_audit_events"])
def test_triggers_refuse_update_and_delete_of_audit_rows(ledger_url, statement):
    history(ledger_url)
    with pytest.raises(sa.exc.DatabaseError, match="append-only"):
        raw(ledger_url, statement)
    assert verify(ledger_url).exit_code == 0


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        pytest.param(lambda id_: f"UPDATE dp_audit_events SET amount = '1/1000' WHERE id = {id_}",
                     "MAC does not match under key id", id="edit an audit row"),
        pytest.param(lambda id_: f"DELETE FROM dp_audit_events WHERE id = {id_}",
                     "expected seq 3; the rows in between were deleted", id="delete an audit row"),
    ],
)
def test_verify_names_the_first_broken_audit_row(ledger_url, tamper, expected):
    history(ledger_url)
    target = event_id(ledger_url, "a", 3)
    raw(ledger_url, *drop_triggers(ledger_url), tamper(target))
    result = verify(ledger_url)
    assert result.exit_code == 3
    first = result.stderr.splitlines()[0]
    broken = target if "MAC" in expected else event_id(ledger_url, "a", 4)
    assert f"first broken: dp_audit_events id={broken} (account 'a', seq" in first
    assert expected in first
    assert "trigger dp_audit_no_update" in result.stderr and "is missing (dropped)" in result.stderr


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        pytest.param("UPDATE dp_budget_accounts SET cap = '100' WHERE name = 'a'",
                     "dp_budget_accounts 'a': cap differs from the last governance event", id="raise a cap"),
        pytest.param("UPDATE dp_budget_accounts SET spent = '0' WHERE name = 'a'",
                     "dp_budget_accounts 'a': spent 0 (delta 0) but the audit events add up to 3/10",
                     id="zero the spend"),
        pytest.param("UPDATE dp_charges SET state = 'released' WHERE id = 1",
                     "state 'released', but its audit events end in 'committed'", id="release a committed charge"),
        pytest.param("UPDATE dp_charges SET output = '{\"value\":42}' WHERE id = 1",
                     "the stored output does not hash to the digest in its 'committed' event",
                     id="edit a published output"),
        pytest.param("DELETE FROM dp_charges WHERE id = 2",
                     "names charge id=2, which has no dp_charges row", id="delete a charge"),
    ],
)
def test_verify_cross_checks_the_mutable_tables_against_the_log(ledger_url, tamper, expected):
    history(ledger_url)
    raw(ledger_url, *drop_triggers(ledger_url), tamper)
    result = verify(ledger_url)
    assert result.exit_code == 3
    assert expected in result.stderr


def test_deleting_the_end_of_a_chain_is_caught_by_the_head(ledger_url):
    history(ledger_url)
    last = event_id(ledger_url, "b", 3)
    raw(ledger_url, *drop_triggers(ledger_url), f"DELETE FROM dp_audit_events WHERE id = {last}")
    result = verify(ledger_url)
    assert result.exit_code == 3
    assert "dp_budget_accounts 'b': chain head is seq 3 but the last event is seq 2" in result.stderr


def test_init_upgrades_a_version_1_ledger_in_place(ledger_url):
    engine = sa.create_engine(ledger_url)
    v1 = old_schema_metadata(1)
    v1.create_all(engine)
    now = dt.datetime.now(dt.timezone.utc)
    with engine.begin() as conn:
        conn.execute(v1.tables["dp_schema_version"].insert().values(version=1, applied_at=now))
        conn.execute(v1.tables["dp_budget_accounts"].insert().values(
            name="a", accountant="pure_dp", cap="1", spent="3/10", delta=None, privacy_unit="person",
            allowed_dags=json.dumps(["d"]), created_at=now, updated_at=now))
        conn.execute(v1.tables["dp_charges"].insert().values(
            account="a", dag_id="d", run_id="old", task_id="t", map_index=-1, release_name="r", attempt=1,
            state="reserved", amount="3/10", mechanisms="[]", spec_hash="0" * 64, created_at=now, updated_at=now))
    engine.dispose()

    with pytest.raises(LedgerKeyError, match="governor key"):
        spender_free_governor = type(governor(ledger_url))(ledger_url)  # no keys: an upgrade writes signed events
        spender_free_governor.init_schema()
    assert governor(ledger_url).init_schema() == schema.SCHEMA_VERSION
    ledger = spender(ledger_url)
    assert ledger.account("a").spent == Fraction(3, 10) and ledger.account("a").spend_key_id == SPEND_KEY.key_id
    # the old reservation has no lease: a rerun of its key abandons it (it stays spent) and is charged again
    rerun = ledger.reserve(ReleaseKey("d", "old", "t", -1, "r"), account="a", amount=Fraction(1, 10),
                           mechanisms=[], spec_hash="0" * 64)
    assert rerun.attempt == 2 and ledger.account("a").spent == Fraction(4, 10)
    assert [e["event"] for e in ledger.events("a")] == ["account_migrated", "abandoned", "reserved"]
    report = governor(ledger_url).verify()
    assert report.ok and report.authenticated, report.problems
    assert governor(ledger_url).init_schema() == schema.SCHEMA_VERSION


def _version_2_ledger(url: str) -> None:
    """A schema-2 ledger: account 'a' (pure_dp, cap 1) with one committed charge of 1/4, chain unkeyed."""
    version_2_ledger(url, cap="1", key=ReleaseKey("d", "old", "t", -1, "r"), output={"value": 1})


def test_init_upgrades_a_version_2_ledger_and_signs_the_head_of_its_unkeyed_chain(ledger_url):
    _version_2_ledger(ledger_url)
    assert governor(ledger_url).init_schema() == schema.SCHEMA_VERSION
    ledger = spender(ledger_url)
    assert [e["event"] for e in ledger.events("a")] == ["account_created", "reserved", "committed", "chain_keyed"]
    assert ledger.stored_output(ReleaseKey("d", "old", "t", -1, "r")) == {"value": 1}  # replays survive
    ledger.commit(ledger.reserve(ReleaseKey("d", "new", "t", -1, "r"), account="a", amount=Fraction(1, 4),
                                 mechanisms=[], spec_hash="0" * 64), {"value": 2})
    report = governor(ledger_url).verify()
    assert report.ok and report.authenticated, report.problems
    assert ledger.account("a").spent == Fraction(1, 2)


def test_an_edit_of_the_unkeyed_prefix_is_caught_after_the_upgrade(ledger_url):
    _version_2_ledger(ledger_url)
    governor(ledger_url).init_schema()
    raw(ledger_url, *drop_triggers(ledger_url), "UPDATE dp_audit_events SET amount = '1/100' WHERE account_seq = 2")
    result = verify(ledger_url)
    assert result.exit_code == 3
    assert "seq 2" in result.stderr.splitlines()[0]
