"""The audit log: append-only triggers, tamper detection by ``dpctl ledger verify``, and the schema upgrade."""

from __future__ import annotations

import datetime as dt
import json
from fractions import Fraction

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import Ledger, ReleaseKey, schema
from ledger_backends import account_config, ledger_with


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


def drop_triggers(url: str) -> str:
    suffix = "" if url.startswith("sqlite") else " ON dp_audit_events"
    return [f"DROP TRIGGER dp_audit_no_update{suffix}", f"DROP TRIGGER dp_audit_no_delete{suffix}"]


def verify(url: str):
    return CliRunner().invoke(app, ["ledger", "verify", "--url", url])


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
                     "content does not match its row_hash (the row was edited)", id="edit an audit row"),
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
    broken = target if "edited" in expected else event_id(ledger_url, "a", 4)
    assert f"first broken: dp_audit_events id={broken} (account 'a', seq" in first
    assert expected in first
    assert "append-only trigger(s) ['dp_audit_no_delete', 'dp_audit_no_update'] are missing" in result.stderr


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        pytest.param("UPDATE dp_budget_accounts SET cap = '100' WHERE name = 'a'",
                     "dp_budget_accounts 'a': cap/accountant/delta/privacy unit/allowed DAGs differ", id="raise a cap"),
        pytest.param("UPDATE dp_budget_accounts SET spent = '0' WHERE name = 'a'",
                     "dp_budget_accounts 'a': spent 0 (delta 0) but the audit events add up to 3/10",
                     id="zero the spend"),
        pytest.param("UPDATE dp_charges SET state = 'released' WHERE id = 1",
                     "state 'released' but the audit log says 'committed'", id="release a committed charge"),
        pytest.param("UPDATE dp_charges SET output = '{\"value\":42}' WHERE id = 1",
                     "stored output does not match the digest", id="edit a published output"),
        pytest.param("DELETE FROM dp_charges WHERE id = 2",
                     "dp_charges id=2: has audit events but the charge row is missing", id="delete a charge"),
    ],
)
def test_verify_cross_checks_the_mutable_tables_against_the_log(ledger_url, tamper, expected):
    history(ledger_url)
    raw(ledger_url, tamper)
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


def _v1_metadata() -> sa.MetaData:
    """The tables of schema version 1 (the first cut), for the upgrade test."""
    new = {"dp_budget_accounts": {"delta_spent", "config", "audit_seq", "audit_head"},
           "dp_charges": {"delta_amount", "context"}}
    metadata = sa.MetaData()
    for table in (schema.schema_version, schema.accounts, schema.charges):
        sa.Table(table.name, metadata,
                 *[c._copy() for c in table.columns if c.name not in new.get(table.name, set())])
    return metadata


def test_init_upgrades_a_version_1_ledger_in_place(ledger_url):
    engine = sa.create_engine(ledger_url)
    v1 = _v1_metadata()
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

    ledger = Ledger(ledger_url)
    assert ledger.init_schema() == 2
    assert ledger.account("a").spent == Fraction(3, 10)
    # the old reservation is abandoned by a rerun of its key, and stays spent
    rerun = ledger.reserve(ReleaseKey("d", "old", "t", -1, "r"), account="a", amount=Fraction(1, 10),
                           mechanisms=[], spec_hash="0" * 64)
    assert rerun.attempt == 2 and ledger.account("a").spent == Fraction(4, 10)
    assert [e["event"] for e in ledger.events("a")] == ["account_migrated", "abandoned", "reserved"]
    report = ledger.verify()
    assert report.ok, report.problems
    assert Ledger(ledger_url).init_schema() == 2
