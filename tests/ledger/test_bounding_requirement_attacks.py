"""Attacks on ``require_enforced_bounding`` (docs/ledger.md, "Requiring enforced contribution bounding") from a
worker login on PostgreSQL: the database's decision and verify's replay must agree. A declared charge the
database lets through on an account whose chain says the requirement was in force is both a bypass of the policy
and a false "written around the ledger" report by verify.

- A reservation that read the account's configuration before the governor's ``apply`` committed the requirement,
  and then waited on the account's lock until it did, lands on the chain *after* the requirement: the database must
  refuse it (decide on the configuration of the row it locked), as verify holds it to that configuration.
- A privacy block dropped from the configuration keeps its member account (and its old policy): a worker naming
  its window is charged on it; what the database accepts there, verify must not report.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.ledger import LedgerConfig, ReleaseKey
from dp_operators.ledger.config import AccountConfig, BlockOpening, Blocks
from ledger_backends import account_config
from support import SPEND_KEY

DECLARED = [{"aggregate": "count", "mechanism": "discrete_laplace", "scale": "2",
             "contribution_bounding": {"mode": "declared", "source": "query", "privacy_unit_column": None,
                                       "sql_sha256": None}}]


def _raw_reserve(teams, role: str, account: str, mechanisms: list, windows=()) -> dict:
    """``dp_reserve`` called by hand by a worker login (as test_enforced_bounding does)."""
    from dp_operators.ledger.pg_functions import SPEND_FUNCTIONS

    (function,) = [f for f in SPEND_FUNCTIONS if f.name == "dp_reserve"]
    arguments = [arg.strip().split(" ", 1) for arg in function.args.split(",")]
    sql = "SELECT dp_reserve(" + ", ".join(f"CAST(:{n.removeprefix('p_')} AS {t})" for n, t in arguments) + ")"
    key = ReleaseKey("d", f"scheduled__{uuid.uuid4().hex[:8]}", "t", -1, "r")
    params = {"key": SPEND_KEY.secret, "account": account, "windows": list(windows), **key.as_dict(),
              "amount": "1/100", "takeover": "1/100", "delta": "0", "mechanisms": json.dumps(mechanisms),
              "spec_hash": "0" * 64, "try_number": None, "context": "{}",
              "token_hash": hashlib.sha256(b"token").hexdigest(), "lease_seconds": 120.0}
    with teams.raw(role).connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def test_a_declared_reservation_that_waited_on_the_account_while_the_requirement_was_applied_is_refused(
        pg_database):
    from team_deployment import team_deployment

    with team_deployment(pg_database, "bndrace", lambda t: {
        "a": account_config("pure_dp", cap=10, dags=("d",)),
    }) as t:
        officer = t.officer()
        wrote, go_on = threading.Event(), threading.Event()

        @sa.event.listens_for(officer.engine, "before_cursor_execute")
        def _note_write(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith("UPDATE DP_BUDGET_ACCOUNTS"):
                conn.info["wrote"] = True

        @sa.event.listens_for(officer.engine, "commit")
        def _hold_commit(conn):  # apply's write transaction: hold it open until the worker waits on the account
            if conn.info.pop("wrote", False):
                wrote.set()
                assert go_on.wait(30)

        applied: list = []
        governor_thread = threading.Thread(target=lambda: applied.append(officer.apply_config(LedgerConfig(
            version=1, accounts={"a": account_config("pure_dp", cap=10, dags=("d",),
                                                     require_enforced_bounding=True)}))))
        governor_thread.start()
        assert wrote.wait(30), "apply never wrote the account"
        result: list = []
        worker_thread = threading.Thread(target=lambda: result.append(_raw_reserve(t, t.login_a, "a", DECLARED)))
        worker_thread.start()
        with t.raw("postgres").connect() as conn:  # the worker's dp_reserve waits on the account's row lock
            for _ in range(300):
                if conn.exec_driver_sql(
                        "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'",
                        (t.login_a,)).scalar_one():
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the worker's reservation did not wait on the account")
        go_on.set()
        governor_thread.join(30)
        worker_thread.join(30)
        assert applied == [["updated account 'a': require_enforced_bounding false -> true"]]
        report = t.officer().verify()
        # the reservation landed after the requirement on the account's chain: the database must refuse it, as
        # verify (which replays the chain) holds it to the requirement
        assert result and result[0]["status"] == "bounding_not_enforced", result
        assert report.ok, report.problems
        t.dispose()


def _blocks(partitions: list[str], required: bool) -> AccountConfig:
    return AccountConfig(accountant="zcdp", cap=Fraction(1, 2), privacy_unit="flight", allowed_dags=["d"],
                         blocks=Blocks(window="partition", open=BlockOpening(partitions=partitions)),
                         require_enforced_bounding=required)


def test_a_declared_charge_the_database_accepts_on_a_dropped_block_is_not_reported_by_verify(pg_database):
    from team_deployment import team_deployment

    with team_deployment(pg_database, "bndblk", lambda t: {"n": _blocks(["p1", "p2"], True)}) as t:
        officer = t.officer()
        # the officer lifts the requirement and no longer lists block p1 (its member account stays, as it was)
        officer.apply_config(LedgerConfig(version=1, accounts={"n": _blocks(["p2"], False)}))
        try:
            result = _raw_reserve(t, t.login_a, "n", DECLARED, windows=["p1"])
        except sa.exc.DBAPIError:
            result = {"status": "refused by the database"}
        if result["status"] != "reserved":  # refusing it (the block's own policy) is one consistent answer
            t.dispose()
            return
        report = officer.verify()
        assert report.ok, report.problems  # accepting it is the other: then verify must not call it forged
        t.dispose()



# -- both backends: the check is the locked member's, after the replay, and approvals follow it ------------------

def enforced(aggregate: str) -> dict:
    return {"aggregate": aggregate, "mechanism": "discrete_laplace", "scale": "2",
            "contribution_bounding": {"mode": "enforced", "source": "table", "privacy_unit_column": "person_id",
                                      "sql_sha256": "ab" * 32}}


def _events(url: str) -> int:
    from dp_operators.ledger import schema

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(schema.audit_events)).scalar_one()
    finally:
        engine.dispose()


def test_a_release_committed_before_the_requirement_replays_its_output_when_retried(ledger_url):
    from dp_operators.ledger import BoundingNotEnforcedError
    from ledger_backends import ledger_with
    from support import governor

    ledger = ledger_with(ledger_url, a=account_config(cap=1))
    key = ReleaseKey("d", f"scheduled__{uuid.uuid4().hex[:8]}", "t", -1, "r")
    ledger.commit(ledger.reserve(key, account="a", amount=Fraction(1, 10), mechanisms=DECLARED, spec_hash="h"),
                  {"count": 7})
    officer = governor(ledger_url)
    officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config(cap=1, require_enforced_bounding=True)}))
    events = _events(ledger_url)
    # the retry publishes what was committed (nothing charged), as before the requirement
    assert ledger.reserve(key, account="a", amount=Fraction(1, 10), mechanisms=DECLARED, spec_hash="h") == {"count": 7}
    assert _events(ledger_url) == events and ledger.account("a").spent == Fraction(1, 10)
    from dp_operators.ledger import BoundingNotEnforcedError

    with pytest.raises(BoundingNotEnforcedError):  # a new key is refused
        ledger.reserve(ReleaseKey("d", "other", "t", -1, "r"), account="a", amount=Fraction(1, 10),
                       mechanisms=DECLARED, spec_hash="h")
    report = officer.verify()
    assert report.ok, report.problems


def test_a_refusal_on_a_later_block_rolls_back_the_blocks_reserved_before_it(ledger_url):
    """Blocks p1, p2 required enforced bounding; the officer lifts it and no longer lists p2 (whose member keeps
    the requirement). A declared charge reading p1 and p2 is refused by p2's own policy, and p1, reserved first,
    is rolled back: nothing is written."""
    from dp_operators.ledger import BoundingNotEnforcedError
    from ledger_backends import ledger_with
    from support import governor

    ledger = ledger_with(ledger_url, n=_blocks(["p1", "p2"], True))
    officer = governor(ledger_url)
    officer.apply_config(LedgerConfig(version=1, accounts={"n": _blocks(["p1"], False)}))
    before = ([(a.name, a.spent) for a in ledger.accounts()], _events(ledger_url))
    key = ReleaseKey("d", f"scheduled__{uuid.uuid4().hex[:8]}", "t", -1, "r")
    with pytest.raises(BoundingNotEnforcedError, match="'n' requires"):
        ledger.reserve(key, account="n", amount=Fraction(1, 10), mechanisms=DECLARED, spec_hash="h",
                       windows=["p1", "p2"])
    assert ([(a.name, a.spent) for a in ledger.accounts()], _events(ledger_url)) == before
    assert list(ledger.charges()) == []
    # p1 alone (no requirement any more) takes it; p2 takes an enforced charge
    ledger.commit(ledger.reserve(key, account="n", amount=Fraction(1, 10), mechanisms=DECLARED, spec_hash="h",
                                 windows=["p1"]), {"v": 1})
    ledger.commit(ledger.reserve(ReleaseKey("d", "other", "t", -1, "r"), account="n", amount=Fraction(1, 10),
                                 mechanisms=[enforced("count")], spec_hash="h", windows=["p2"]), {"v": 2})
    report = officer.verify()
    assert report.ok, report.problems


def test_a_dropped_block_keeps_its_own_requirement_on_both_backends(ledger_url):
    from dp_operators.ledger import BoundingNotEnforcedError
    from ledger_backends import ledger_with
    from support import governor

    ledger = ledger_with(ledger_url, n=_blocks(["p1", "p2"], True))
    officer = governor(ledger_url)
    officer.apply_config(LedgerConfig(version=1, accounts={"n": _blocks(["p2"], False)}))
    key = ReleaseKey("d", f"scheduled__{uuid.uuid4().hex[:8]}", "t", -1, "r")
    with pytest.raises(BoundingNotEnforcedError):
        ledger.reserve(key, account="n", amount=Fraction(1, 10), mechanisms=DECLARED, spec_hash="h", windows=["p1"])
    ledger.commit(ledger.reserve(key, account="n", amount=Fraction(1, 10), mechanisms=DECLARED, spec_hash="h",
                                 windows=["p2"]), {"v": 1})
    report = officer.verify()
    assert report.ok, report.problems


def test_an_approval_request_for_a_declared_charge_on_a_requiring_account_is_refused(ledger_url):
    from dp_operators.ledger import BoundingNotEnforcedError
    from dp_operators.ledger.config import Approval
    from ledger_backends import ledger_with
    from support import governor

    ledger = ledger_with(ledger_url, a=account_config(cap=10, approval=Approval(above=1),
                                                      require_enforced_bounding=True))
    key = ReleaseKey("d", f"scheduled__{uuid.uuid4().hex[:8]}", "t", -1, "r")
    plan = {"mechanisms": [{"aggregate": "count"}], "charge": "2"}
    events = _events(ledger_url)
    for mechanisms in (DECLARED, []):
        with pytest.raises(BoundingNotEnforcedError, match="'a' requires"):
            ledger.request_approval(key, account="a", amount=2, mechanisms=mechanisms, spec_hash="h", plan=plan)
    assert _events(ledger_url) == events  # no request filed: an officer never reviews it
    officer = governor(ledger_url)
    assert officer.approval_requests(pending=True) == []
    filed = ledger.request_approval(key, account="a", amount=2, mechanisms=[enforced("count")], spec_hash="h",
                                    plan=plan)
    assert filed["state"] == "pending"
    assert officer.verify().ok


def test_verify_reports_an_account_config_changed_outside_apply(ledger_url):
    from dp_operators.ledger import schema
    from ledger_backends import ledger_with
    from support import governor

    ledger_with(ledger_url, a=account_config(cap=1, require_enforced_bounding=True))
    officer = governor(ledger_url)
    assert officer.verify().ok
    engine = sa.create_engine(ledger_url)
    try:
        with engine.begin() as conn:  # the tables' owner (or the SQLite file's writer) lifts it around the ledger
            conn.execute(schema.accounts.update().where(schema.accounts.c.name == "a").values(
                config=json.dumps(account_config(cap=1).as_record(), sort_keys=True, separators=(",", ":"))))
    finally:
        engine.dispose()
    report = officer.verify()
    assert not report.ok
    assert any("config differs from the last governance event" in p and "changed outside 'dpctl ledger apply'" in p
               for p in report.problems), report.problems


def test_verify_with_the_configuration_compares_the_requirement(ledger_url):
    from ledger_backends import ledger_with
    from support import governor

    ledger_with(ledger_url, a=account_config(cap=1))
    officer = governor(ledger_url)
    wanted = LedgerConfig(version=1, accounts={"a": account_config(cap=1, require_enforced_bounding=True)})
    report = officer.verify(config=wanted)
    assert not report.ok
    assert any("require_enforced_bounding false (configuration: true)" in p for p in report.problems), report.problems
    assert officer.verify(config=LedgerConfig(version=1, accounts={"a": account_config(cap=1)})).ok
    officer.apply_config(wanted)
    assert officer.verify(config=wanted).ok
