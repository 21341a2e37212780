"""The ledger's life cycle, exact arithmetic, refusals and governance, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction

import pytest

from dp_operators.ledger import (
    AccountNotFoundError,
    BudgetExhaustedError,
    ChargeStateError,
    DagNotAllowedError,
    Ledger,
    LedgerConfig,
    LedgerNotInitialisedError,
    ReleaseKey,
    schema,
)
from dp_operators.ledger.chain import CanonicalOutput, canonical_json
from ledger_backends import account_config, ledger_with
from support import SPEND_KEY, governor, spender

NO_MECHANISMS: list[dict] = []


def key(run: str = "run-1", dag: str = "d") -> ReleaseKey:
    return ReleaseKey(dag, run, "t", -1, "r")


def spend(ledger: Ledger, run: str, amount, account: str = "a", **kwargs):
    reservation = ledger.reserve(
        key(run), account=account, amount=Fraction(amount), mechanisms=NO_MECHANISMS, spec_hash="0" * 64, **kwargs
    )
    ledger.commit(reservation, {"run": run})
    return reservation


def test_ten_tenths_fill_a_cap_of_one_and_the_eleventh_is_refused(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap="1.0"))
    for run in range(10):
        spend(ledger, f"run-{run}", "0.1")
    assert ledger.account("a").spent == 1 and ledger.account("a").remaining == 0
    with pytest.raises(BudgetExhaustedError) as refused:
        spend(ledger, "run-10", "0.1")
    error = refused.value
    assert (error.requested, error.remaining, error.difference) == (Fraction(1, 10), 0, Fraction(1, 10))
    assert "requested epsilon 0.1, remaining 0, short by 0.1" in str(error)
    assert len(list(ledger.charges())) == 10


def test_three_thirds_fit_in_one_and_the_refusal_names_requested_remaining_difference(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("zcdp", cap=1, delta="1e-6"))
    for run in range(3):
        spend(ledger, f"run-{run}", Fraction(1, 3))
    assert ledger.account("a").spent == 1
    ledger = ledger_with(ledger_url, a=account_config("zcdp", cap="1.5", delta="1e-6"))
    with pytest.raises(BudgetExhaustedError, match=r"requested rho 2/3 \(~0.666667\), remaining 0.5, short by 1/6 \(~0.166667\)"):
        spend(ledger, "run-3", Fraction(2, 3))


def test_replay_of_a_committed_key_returns_the_output_and_charges_nothing(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    spend(ledger, "run-1", "0.5")
    again = ledger.reserve(key("run-1"), account="a", amount=Fraction(1, 2), mechanisms=[], spec_hash="0" * 64)
    assert again == {"run": "run-1"} == ledger.stored_output(key("run-1"))
    assert ledger.account("a").spent == Fraction(1, 2) and len(list(ledger.charges())) == 1


def test_release_returns_budget_only_for_a_reserved_charge(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    reservation = ledger.reserve(key(), account="a", amount=Fraction(1, 4), mechanisms=[], spec_hash="0" * 64)
    assert ledger.account("a").reserved == Fraction(1, 4)
    ledger.release(reservation)
    assert ledger.account("a").spent == 0 and list(ledger.charges())[0]["state"] == "released"
    with pytest.raises(ChargeStateError):
        ledger.release(reservation)
    with pytest.raises(ChargeStateError):
        ledger.commit(reservation, {"x": 1})


def test_approx_account_composes_epsilon_and_delta_and_refuses_on_either(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("approx_dp", cap=1, delta="1e-6"))
    spend(ledger, "run-1", "0.25", delta=Fraction(1, 2 * 10**6))
    spend(ledger, "run-2", "0.25", delta=Fraction(1, 2 * 10**6))
    status = ledger.account("a")
    assert (status.spent, status.delta_spent, status.remaining_delta) == (Fraction(1, 2), Fraction(1, 10**6), 0)
    with pytest.raises(BudgetExhaustedError) as refused:
        spend(ledger, "run-3", "0.25", delta=Fraction(1, 10**9))
    assert refused.value.unit == "delta"
    spend(ledger, "run-4", "0.5")  # pure charges still fit
    assert governor(ledger_url).verify().ok


def test_a_delta_on_an_account_without_one_is_a_programming_error(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    with pytest.raises(ValueError, match="no delta part"):
        spend(ledger, "run-1", "0.1", delta=Fraction(1, 10**6))
    assert list(ledger.charges()) == []


def test_refusals_reserve_nothing_and_are_recorded(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap="0.5"))
    with pytest.raises(AccountNotFoundError, match="dpctl ledger apply"):
        spend(ledger, "run-1", "0.1", account="missing")
    with pytest.raises(DagNotAllowedError, match="allowed_dags"):
        ledger.reserve(key(dag="other"), account="a", amount=Fraction(1, 10), mechanisms=[], spec_hash="0" * 64)
    with pytest.raises(BudgetExhaustedError):
        spend(ledger, "run-2", "0.6")
    assert list(ledger.charges()) == [] and ledger.account("a").spent == 0
    refused = [json.loads(e["details"])["reason"] for e in ledger.events("a") if e["event"] == "refused"]
    assert refused == ["dag_not_allowed", "budget_exhausted"]
    assert governor(ledger_url).verify().ok


def test_audit_rows_carry_who_what_when_and_never_the_output(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    mechanisms = [{"mechanism": "discrete_laplace", "scale": 10.0, "l1_sensitivity": 1.0, "epsilon_exact": "1/10"}]
    reservation = ledger.reserve(
        key(), account="a", amount=Fraction(1, 10), mechanisms=mechanisms, spec_hash="ab" * 32, try_number=2,
        audit={"run_type": "scheduled", "triggering_user": "alice"},
    )
    digest = ledger.commit(reservation, {"secret_looking_value": 123456789})
    reserved, committed = [e for e in ledger.events("a") if e["event"] in ("reserved", "committed")]
    for event in (reserved, committed):
        context = json.loads(event["context"])
        assert context["run_type"] == "scheduled" and context["triggering_user"] == "alice"
        assert {"host", "package_version"} <= set(context)
        assert (event["dag_id"], event["run_id"], event["task_id"], event["map_index"]) == ("d", "run-1", "t", -1)
        assert (event["try_number"], event["spec_hash"], event["amount"]) == (2, "ab" * 32, "1/10")
        assert json.loads(event["mechanisms"]) == mechanisms
    assert committed["output_digest"] == digest
    assert not any("123456789" in str(value) for event in ledger.events() for value in event.values())
    with pytest.raises(ValueError, match="audit context key"):
        ledger.reserve(key("run-2"), account="a", amount=Fraction(1, 10), mechanisms=[], spec_hash="0" * 64,
                       audit={"true_count": 17})


def test_apply_records_every_change_and_guards_caps_and_accountants(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    spend(ledger, "run-1", "0.75")
    config = lambda **kw: LedgerConfig(version=1, accounts={"a": account_config(**kw)})  # noqa: E731
    assert governor(ledger_url).apply_config(config(accountant="pure_dp", cap=1)) == []
    assert governor(ledger_url).apply_config(config(accountant="pure_dp", cap=2, owner="po@example.org")) == [
        "updated account 'a': cap, owner"
    ]
    with pytest.raises(ValueError, match="below the 0.75 already spent"):
        governor(ledger_url).apply_config(config(accountant="pure_dp", cap="0.5"))
    with pytest.raises(ValueError, match="accountant is fixed"):
        governor(ledger_url).apply_config(config(accountant="zcdp", cap=1))
    assert ledger.account("a").cap == 2
    events = [e for e in ledger.events("a") if e["event"].startswith("account_")]
    assert [e["event"] for e in events] == ["account_created", "account_updated"]
    details = json.loads(events[1]["details"])
    assert details["before"]["cap"] == "1" and details["stored"]["cap"] == "2"
    assert governor(ledger_url).verify().ok


@pytest.mark.parametrize(
    ("accountant", "given", "stored"),
    [
        pytest.param("pure_dp", {"epsilon": 1}, Fraction(1), id="pure_dp epsilon"),
        pytest.param("gaussian_dp", {"cap": "0.5", "delta": "1e-6"}, Fraction(1, 4), id="gaussian_dp cap is mu"),
        pytest.param("gaussian_dp", {"epsilon": 1, "delta": "1e-6"}, Fraction(140072409563, 2500000000000),
                     id="gaussian_dp by (epsilon, delta)"),
        pytest.param("zcdp", {"epsilon": 1, "delta": "1e-6"}, Fraction(48711940719, 2000000000000),
                     id="zcdp by (epsilon, delta)"),
    ],
)
def test_caps_are_stored_in_the_account_unit(ledger_url, accountant, given, stored):
    ledger = ledger_with(ledger_url, a=account_config(accountant, **given))
    assert ledger.account("a").cap == stored
    assert governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"a": account_config(accountant, **given)})) == []


def test_the_ledger_refuses_to_work_before_init(ledger_url):
    ledger = governor(ledger_url)
    with pytest.raises(LedgerNotInitialisedError, match="dpctl ledger init"):
        ledger.accounts()
    assert ledger.init_schema() == ledger.init_schema() == schema.SCHEMA_VERSION


def test_a_missing_sqlite_ledger_file_is_refused_and_not_created(tmp_path):
    """A spender pointed at a SQLite file that is gone is refused before connecting: no empty file appears where
    'dpctl ledger init' would start a budget that forgets every charge."""
    from dp_operators.ledger import Ledger, ReleaseKey

    path = tmp_path / "deleted.db"
    ledger = Ledger(f"sqlite:///{path}", audit_key=SPEND_KEY)
    with pytest.raises(LedgerNotInitialisedError, match="the file does not exist") as refused:
        ledger.reserve(ReleaseKey("d", "r", "t", -1, "x"), account="a", amount=Fraction(1, 10), mechanisms=[],
                       spec_hash="0" * 64)
    assert "Nothing was reserved" in str(refused.value)
    assert not path.exists()


def test_a_database_error_never_carries_the_spend_key(tmp_path):
    """The ledger's engines hide bound parameters: an error from the driver (here a trigger planted in the file
    refusing every charge) names the statement but not the values, so the spend key and the amounts stay out of
    task logs."""
    import sqlite3

    import sqlalchemy as sa

    from dp_operators.ledger import ReleaseKey

    path = tmp_path / "ledger.db"
    ledger = ledger_with(f"sqlite:///{path}", a=account_config("pure_dp", cap=1))
    with sqlite3.connect(path) as planted:
        planted.execute("CREATE TRIGGER refuse BEFORE INSERT ON dp_charges BEGIN "
                        "SELECT RAISE(ABORT, 'refused by a planted trigger'); END")
    planted.close()
    with pytest.raises(sa.exc.DBAPIError) as failed:
        ledger.reserve(ReleaseKey("d", "r", "t", -1, "x"), account="a", amount=Fraction(1, 10),
                       mechanisms=[{"secret_marker": 1}], spec_hash="0" * 64)
    text = str(failed.value)
    assert "refused by a planted trigger" in text and "INSERT INTO dp_charges" in text
    assert "hidden due to hide_parameters" in text
    assert "secret_marker" not in text and SPEND_KEY.text not in text


@pytest.mark.parametrize("who", ["spender", "governor"])
def test_a_read_only_sqlite_ledger_is_refused_naming_the_file_and_the_fix(tmp_path, who):
    """A ledger file this process may read but not write (here a mode=ro URI: tests run as root, whom file modes do
    not stop) is refused with LedgerAccessError, a LedgerError the operator does not retry, naming the file and
    the fix; nothing is written. Before, SQLAlchemy's raw OperationalError with the SQL, retried."""
    import sqlite3

    from dp_operators.ledger import Ledger, LedgerAccessError, ReleaseKey
    from dp_operators.ledger.config import LedgerConfig

    path = tmp_path / "ledger.db"
    ledger_with(f"sqlite:///{path}", a=account_config("pure_dp", cap=1)).engine.dispose()
    with sqlite3.connect(path) as before:
        events = before.execute("SELECT count(*) FROM dp_audit_events").fetchone()[0]
    before.close()
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    with pytest.raises(LedgerAccessError) as refused:
        if who == "spender":
            Ledger(url, audit_key=SPEND_KEY).reserve(ReleaseKey("d", "r", "t", -1, "x"), account="a",
                                                     amount=Fraction(1, 10), mechanisms=[], spec_hash="0" * 64)
        else:
            governor(url).apply_config(LedgerConfig(version=1, accounts={"b": account_config("pure_dp", cap=1)}))
    message = str(refused.value)
    assert str(path) in message and "read-only" in message and "write access" in message
    assert "nothing was written" in message and "INSERT" not in message
    with sqlite3.connect(path) as after:
        assert after.execute("SELECT count(*) FROM dp_audit_events").fetchone()[0] == events
    after.close()


def test_history_filters_by_account_dag_state_and_date(ledger_url):
    import datetime as dt

    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1, dags=("d", "e")),
                         b=account_config("pure_dp", cap=1))
    spend(ledger, "run-1", "0.1")
    spend(ledger, "run-2", "0.1", account="b")
    ledger.reserve(key("run-3", dag="e"), account="a", amount=Fraction(1, 10), mechanisms=[], spec_hash="0" * 64)
    assert len(list(ledger.charges())) == 3
    assert [c["run_id"] for c in ledger.charges(account="a")] == ["run-1", "run-3"]
    assert [c["run_id"] for c in ledger.charges(dag_id="e")] == ["run-3"]
    assert [c["run_id"] for c in ledger.charges(state="reserved")] == ["run-3"]
    tomorrow = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    assert list(ledger.charges(since=tomorrow)) == [] and len(list(ledger.charges(until=tomorrow))) == 3


def test_the_privacy_unit_is_fixed_once_anything_was_charged(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1), b=account_config("pure_dp", cap=1))
    household = lambda name: account_config("pure_dp", cap=1).model_copy(  # noqa: E731
        update={"privacy_unit": "household"}
    )
    # Nothing charged yet: the unit may still be corrected.
    assert governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"b": household("b")})) == [
        "updated account 'b': privacy_unit"
    ]
    spend(ledger, "run-1", "0.25")
    with pytest.raises(ValueError, match=r"account 'a': the privacy unit is fixed .*'person'.*'household'.*"
                                         r"Create a new account instead"):
        governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"a": household("a")}))
    assert ledger.account("a").privacy_unit == "person"
    # A charge given back (released) still fixes the unit: budget was once spent under it.
    reservation = ledger.reserve(key("run-x", "d"), account="b", amount=Fraction(1, 10), mechanisms=NO_MECHANISMS,
                                 spec_hash="0" * 64)
    ledger.release(reservation)
    assert ledger.account("b").spent == 0
    with pytest.raises(ValueError, match="privacy unit is fixed"):
        governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"b": account_config("pure_dp", cap=1)}))
    assert governor(ledger_url).verify().ok


def test_release_entry_points_refuse_a_ledger_without_schema(ledger_url):
    ledger = Ledger(ledger_url)
    with pytest.raises(LedgerNotInitialisedError, match="dpctl ledger init"):
        ledger.stored_output(key())
    with pytest.raises(LedgerNotInitialisedError, match="dpctl ledger init"):
        ledger.account("a")
    with pytest.raises(LedgerNotInitialisedError, match="dpctl ledger init"):
        ledger.reserve(key(), account="a", amount=Fraction(1), mechanisms=NO_MECHANISMS, spec_hash="0" * 64)
    with pytest.raises(LedgerNotInitialisedError, match="dpctl ledger init"):
        ledger.charges()
    with pytest.raises(LedgerNotInitialisedError, match="dpctl ledger init"):
        list(ledger.events())


def test_the_schema_is_checked_once_per_ledger(ledger_url, monkeypatch):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    fresh = Ledger(ledger_url, audit_key=SPEND_KEY)
    calls = []
    original = fresh._schema_version
    monkeypatch.setattr(fresh, "_schema_version", lambda: calls.append(1) or original())
    assert fresh.stored_output(key()) is None
    spend(fresh, "run-1", "0.25")
    assert fresh.stored_output(key()) == {"run": "run-1"}
    assert fresh.account("a").spent == Fraction(1, 4)
    assert len(calls) == 1
    assert ledger.account("a").spent == Fraction(1, 4)


@pytest.mark.parametrize("edit", ["spent = '0'", "delta_spent = '0', spent = '0'", "audit_head = 'f'"])
def test_reserve_refuses_an_account_whose_totals_disagree_with_its_chain(ledger_url, edit):
    """Lowering the running totals (a column the PostgreSQL spender role may update) does not buy budget: every
    write checks the row against the head of its chain first, so reserves stop until the row is repaired."""
    import sqlalchemy as sa

    from dp_operators.ledger import AuditChainError

    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    spend(ledger, "run-1", "1")
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE dp_budget_accounts SET {edit} WHERE name = 'a'")
    engine.dispose()
    with pytest.raises(AuditChainError, match="disagree with the last event of its audit chain"):
        spend(ledger, "run-2", "1")
    assert [c["state"] for c in ledger.charges()] == ["committed"]


def test_apply_refuses_a_governor_key_the_ledger_has_not_seen_unless_it_is_announced(ledger_url):
    from dp_operators.ledger import AuditKey, Keyring, LedgerGovernor, LedgerKeyError
    from support import GOVERNOR_KEY, SPEND_KEY

    ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    config = LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=2)})
    new_key = AuditKey.generate()
    with pytest.raises(LedgerKeyError, match="has never signed this ledger's governance events"):
        LedgerGovernor(ledger_url, governor_key=new_key, spend_key=SPEND_KEY).apply_config(config)
    with pytest.raises(LedgerKeyError, match="is the spend key of account 'a'"):
        LedgerGovernor(ledger_url, governor_key=SPEND_KEY).apply_config(config, new_governor_key=True)
    assert governor(ledger_url).account("a").cap == 1  # nothing changed
    rotated = LedgerGovernor(ledger_url, governor_key=new_key, spend_key=SPEND_KEY)
    assert rotated.apply_config(config, new_governor_key=True) == ["updated account 'a': cap, governor key"]
    assert rotated.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=3)})) == [
        "updated account 'a': cap"]  # the new key has signed now
    report = rotated.verify(Keyring([GOVERNOR_KEY, new_key, SPEND_KEY]),
                            governor_key_ids={GOVERNOR_KEY.key_id, new_key.key_id})
    assert report.ok and report.authenticated, report.problems
    # the retired key governs no more: refused by apply, and flagged by verify if written around apply
    with pytest.raises(LedgerKeyError, match="was retired when the ledger rotated"):
        governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=100)}))
    unchecked = governor(ledger_url)
    unchecked._check_governor_key = lambda *args: None
    unchecked.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=100)}))
    report = rotated.verify(Keyring([GOVERNOR_KEY, new_key, SPEND_KEY]),
                            governor_key_ids={GOVERNOR_KEY.key_id, new_key.key_id})
    assert any("a governor key this chain's rotation retired" in problem for problem in report.problems), report


def test_init_makes_a_sqlite_ledger_readable_by_its_owner_only(tmp_path):
    import stat

    governor(f"sqlite:///{tmp_path / 'ledger.db'}").init_schema()
    assert stat.S_IMODE((tmp_path / "ledger.db").stat().st_mode) == 0o600


@pytest.mark.parametrize("signer", ["the governor's key id, MAC made up", "a random key id"])
def test_a_forged_head_under_another_key_id_does_not_lower_the_totals(ledger_url, signer):
    """An event claiming another key at the next seq, stating spent 0, with the row pointed at it, lowers nothing.
    The newest event the spend key signed still states the true totals, so reserves stop."""
    import sqlalchemy as sa

    from dp_operators.ledger import AuditChainError, schema
    from support import GOVERNOR_KEY

    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    spend(ledger, "run-1", "1")
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        row = conn.execute(sa.select(schema.accounts).where(schema.accounts.c.name == "a")).first()
        forged = {name: None for name in schema.AUDIT_HASHED_COLUMNS}
        forged.update(account="a", account_seq=row.audit_seq + 1, event="refused", spent_after="0",
                      delta_spent_after="0", context="{}", created_at="2026-01-01T00:00:00.000000+00:00",
                      key_id=GOVERNOR_KEY.key_id if "governor" in signer else "0123456789abcdef",
                      prev_hash=row.audit_head, row_hash="f" * 64)
        conn.execute(schema.audit_events.insert().values(**forged))
        conn.execute(schema.accounts.update().where(schema.accounts.c.name == "a").values(
            spent="0", audit_seq=row.audit_seq + 1, audit_head="f" * 64))
    engine.dispose()
    with pytest.raises(AuditChainError, match="disagree with the last event of its audit chain"):
        spend(ledger, "run-2", "1")
    assert [c["state"] for c in ledger.charges()] == ["committed"]



def test_commit_takes_pre_encoded_text_only_as_the_canonical_output_type(ledger_url):
    """A commit stores pre-encoded text only when CanonicalOutput.encode made it; other text is refused, unstored."""
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    output = {"b": [1, 2], "a": "x"}
    reservation = ledger.reserve(key(), account="a", amount=Fraction(1, 4), mechanisms=[], spec_hash="0" * 64)
    with pytest.raises(TypeError, match="CanonicalOutput"):
        ledger.commit(reservation, output, canonical='{"a":"forged"}')
    assert list(ledger.charges())[0]["state"] == "reserved"
    digest = ledger.commit(reservation, output, canonical=CanonicalOutput.encode(output))
    assert digest == hashlib.sha256(canonical_json(output).encode("utf-8")).hexdigest()
    assert ledger.authenticated_output(key()) == output


@pytest.mark.parametrize("change", ["deleted", "replaced", "untouched"])
def test_a_sqlite_ledger_deleted_or_replaced_while_open_commits_nothing(tmp_path, change):
    """A SQLite ledger file deleted (or replaced by another file) while a release holds it open: the commit must not
    land in the unlinked file, where it would be lost with it while the release published. The write notices the
    path no longer names the file it opened, rolls back and says to restore the file from backup, not to run init
    (which would make a new, empty ledger). Untouched: the negative control commits."""
    import os
    import shutil

    from dp_operators.ledger import LedgerNotInitialisedError, ReleaseKey

    path = tmp_path / "ledger.db"
    ledger = ledger_with(f"sqlite:///{path}", a=account_config("pure_dp", cap=1))
    reservation = ledger.reserve(ReleaseKey("d", "r", "t", -1, "x"), account="a", amount=Fraction(1, 10),
                                 mechanisms=[], spec_hash="0" * 64)
    if change != "untouched":
        copy = tmp_path / "copy.db"
        shutil.copyfile(path, copy)
        for suffix in ("-wal", "-shm"):
            if (tmp_path / f"ledger.db{suffix}").exists():
                shutil.copyfile(tmp_path / f"ledger.db{suffix}", tmp_path / f"copy.db{suffix}")
        os.unlink(path)
        if change == "replaced":
            os.replace(copy, path)
    if change == "untouched":
        ledger.commit(reservation, {"value": 1})
        assert [c["state"] for c in ledger.charges()] == ["committed"]
        return
    with pytest.raises(LedgerNotInitialisedError) as refused:
        ledger.commit(reservation, {"value": 1})
    message = str(refused.value)
    assert str(path) in message and "deleted or replaced while this process had it open" in message
    assert "Restore the ledger file from its backup" in message and "new, empty ledger" in message
    assert path.exists() == (change == "replaced")  # nothing created where the file was
    if change == "replaced":  # the replacement holds the reservation (copied after it), never the commit
        assert [c["state"] for c in spender(f"sqlite:///{path}").charges()] == ["reserved"]


def test_releases_of_amounts_with_large_denominators_keep_the_total_readable(ledger_url):
    """Each reserve rounds the total up to the ledger's resolution (1/10^18); a release subtracting its exact
    amount did not, so three releases of 1/p (p prime near 10^18) grew the total's denominator past the 60 digits a
    stored number holds: the account refused every later reserve as edited, and verify alarmed for good. Releases
    round up too (never below the exact difference)."""
    from dp_operators.ledger import ReleaseKey
    from dp_operators.ledger.bounded import MAX_DIGITS

    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    primes = [999999999999999989, 999999999999999967, 999999999999999877]
    reservations = [
        ledger.reserve(ReleaseKey("d", f"run-{i}", "t", -1, "r"), account="a", amount=Fraction(1, p), mechanisms=[],
                       spec_hash="0" * 64)
        for i, p in enumerate(primes)
    ]
    for reservation in reservations:
        ledger.release(reservation)
    spent = ledger.account("a").spent
    assert 0 <= spent <= Fraction(3, 10**18) and len(str(spent.denominator)) <= MAX_DIGITS
    ledger.reserve(ReleaseKey("d", "after", "t", -1, "r"), account="a", amount=Fraction(1, 10), mechanisms=[],
                   spec_hash="0" * 64)
    report = governor(ledger_url).verify()
    assert report.ok, report.problems


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("text, refused", [('["\\udc00"]', True), ('{"\\ud83d": 1}', True),
                                           ('["\\ud83d\\ude00"]', False), ('["\\\\udc00"]', False)])
def test_the_spend_functions_refuse_a_lone_surrogate_escape_the_readers_refuse(ledger_url, text, refused):
    """JSON allows a \\uDC00 escape alone, and PostgreSQL's json type and Python's json read one, but it is not
    Unicode text: the stream reader cannot read it and the ledger's readers refuse it at any size, so dp_commit
    refuses it (DPL06, nothing written); a surrogate pair and an escaped backslash are text like any other."""
    from dp_operators.ledger import ReleaseKey
    from dp_operators.ledger.bounded import BoundsError, read_json

    ledger = ledger_with(ledger_url, a=account_config("pure_dp", cap=1))
    reservation = ledger.reserve(ReleaseKey("d", "r", "t", -1, "x"), account="a", amount=Fraction(1, 10),
                                 mechanisms=[], spec_hash="0" * 64)
    if refused:
        with pytest.raises(BoundsError):
            read_json(text)
        with pytest.raises(ValueError, match="lone surrogate escape"):
            ledger.commit(reservation, None, canonical=CanonicalOutput(text))
        assert [c["state"] for c in ledger.charges()] == ["reserved"]
    else:
        ledger.commit(reservation, None, canonical=CanonicalOutput(text))
        assert ledger.stored_output(ReleaseKey("d", "r", "t", -1, "x")) == read_json(text)
        assert governor(ledger_url).verify().ok
