"""An officer's approval before a large charge (docs/ledger.md, "Approval before a large charge";
dp_operators.ledger.approvals): on both backends, a charge the account's policy holds back is not reserved until a
privacy officer grants it (governor key), is refused after a rejection or a timeout, and a grant forged by a worker
is refused (PostgreSQL: the worker's login cannot write one; SQLite: the ledger ignores a spend-key grant) or
reported by verify."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.ledger import ReleaseKey, Reservation, schema
from dp_operators.ledger.approvals import APPROVAL_GRANTED
from dp_operators.ledger.chain import AccountChain, audit_context
from dp_operators.ledger.config import Approval, LedgerConfigError, load_ledger_config
from dp_operators.ledger.errors import ApprovalRejectedError, ApprovalRequiredError
from dp_operators.ledger.keys import AuditKey
from ledger_backends import account_config, ledger_with
from support import SPEND_KEY, governor

LAPLACE = [{"mechanism": "discrete_laplace", "aggregate": "n"}]
GAUSS = [{"mechanism": "discrete_gaussian", "aggregate": "n"}]
PLAN = {"mechanisms": [{"aggregate": "n", "mechanism": "discrete_laplace", "half_width": 3.0}], "charge": "2"}


def _key(run: str | None = None) -> ReleaseKey:
    return ReleaseKey("d", run or f"r_{uuid.uuid4().hex[:8]}", "t", -1, "counts")


def _charges(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(schema.charges)).scalar()
    finally:
        engine.dispose()


def _spent(ledger, account: str = "a") -> Fraction:
    return ledger.account(account).spent


@pytest.fixture
def approval_ledger(ledger_url: str) -> Iterator[tuple[str, object]]:
    ledger = ledger_with(ledger_url, a=account_config(cap=10, approval=Approval(above=1)))
    yield ledger_url, ledger
    ledger.engine.dispose()


def test_below_threshold_needs_no_approval(approval_ledger) -> None:
    url, ledger = approval_ledger
    reservation = ledger.reserve(_key(), account="a", amount=1, mechanisms=LAPLACE, spec_hash="h")
    assert isinstance(reservation, Reservation)
    ledger.commit(reservation, {"n": 1})
    assert governor(url).verify().ok


def test_above_threshold_waits_then_reserves_on_grant(approval_ledger) -> None:
    url, ledger = approval_ledger
    key = _key()
    with pytest.raises(ApprovalRequiredError) as refused:
        ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h")
    assert refused.value.request is None and refused.value.reasons == ["above"]
    assert refused.value.account == "a" and refused.value.amount == 2
    assert _charges(url) == 0 and _spent(ledger) == 0
    filed = ledger.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h", plan=PLAN)
    assert filed["state"] == "pending"
    again = ledger.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h", plan=PLAN)
    assert again["request"] == filed["request"]  # idempotent: one request per release key and spec
    with pytest.raises(ApprovalRequiredError) as waiting:
        ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h")
    assert waiting.value.request["request"] == filed["request"]
    assert _charges(url) == 0
    officer = governor(url)
    pending = officer.approval_requests(pending=True)
    assert [(p["request"], p["plan"], p["amount"]) for p in pending] == [(filed["request"], PLAN, "2")]
    decided = officer.decide_approval("a", filed["request"], approve=True, reason="expected", user="alice")
    assert decided["decision"] == "granted"
    assert officer.approval_requests(pending=True) == []
    listed = officer.approval_requests()[0]
    assert (listed["decision"], listed["decided_by"], listed["reason"]) == ("granted", "alice", "expected")
    # a grant covers its release key and spec hash only
    with pytest.raises(ApprovalRequiredError):
        ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="other")
    with pytest.raises(ApprovalRequiredError):
        ledger.reserve(key, account="a", amount=3, mechanisms=LAPLACE, spec_hash="h")  # more than granted
    reservation = ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h")
    ledger.commit(reservation, {"n": 2})
    assert _spent(ledger) == 2
    with pytest.raises(ValueError, match="already decided"):
        officer.decide_approval("a", filed["request"], approve=False)
    report = officer.verify()
    assert report.ok, report.problems


def test_rejection_refuses_with_nothing_reserved(approval_ledger) -> None:
    url, ledger = approval_ledger
    key = _key()
    filed = ledger.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h", plan=PLAN)
    governor(url).decide_approval("a", filed["request"], approve=False, reason="too much")
    with pytest.raises(ApprovalRejectedError, match="too much") as rejected:
        ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h")
    assert (rejected.value.reason, rejected.value.request) == ("rejected", filed["request"])
    assert _charges(url) == 0 and _spent(ledger) == 0
    assert ledger.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h",
                                   plan=PLAN)["state"] == "rejected"
    assert governor(url).verify().ok


def test_timeout_rejects(ledger_url: str) -> None:
    ledger = ledger_with(ledger_url, a=account_config(cap=10, approval=Approval(above=1, timeout_hours="1/36000")))
    key = _key()
    filed = ledger.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h", plan=PLAN)
    time.sleep(0.2)  # 1/36000 h = 0.1 s
    with pytest.raises(ApprovalRejectedError, match="timeout") as rejected:
        ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h")
    assert rejected.value.reason == "timeout"
    assert _charges(ledger_url) == 0
    with pytest.raises(ValueError, match="timed out"):
        governor(ledger_url).decide_approval("a", filed["request"], approve=True)
    # final: a later request for a larger amount does not start a new wait
    again = ledger.request_approval(key, account="a", amount=Fraction(21, 10), mechanisms=LAPLACE, spec_hash="h",
                                    plan=PLAN)
    assert (again["state"], again["reason"]) == ("rejected", "timeout")
    with pytest.raises(ApprovalRejectedError, match="timeout"):
        ledger.reserve(key, account="a", amount=Fraction(21, 10), mechanisms=LAPLACE, spec_hash="h")
    ledger.engine.dispose()


def test_fraction_of_remaining_and_mechanism_change(ledger_url: str) -> None:
    ledger = ledger_with(ledger_url, a=account_config(cap=10, approval=Approval(
        above_fraction_of_remaining="1/2", on_mechanism_change=True)))
    first = ledger.reserve(_key("r1"), account="a", amount=5, mechanisms=LAPLACE, spec_hash="h")  # 5 of 10: not above
    ledger.commit(first, {"n": 1})
    with pytest.raises(ApprovalRequiredError) as large:
        ledger.reserve(_key("r2"), account="a", amount=3, mechanisms=LAPLACE, spec_hash="h")  # 3 > 5/2
    assert large.value.reasons == ["above_fraction_of_remaining"]
    with pytest.raises(ApprovalRequiredError) as changed:
        ledger.reserve(_key("r2"), account="a", amount=1, mechanisms=GAUSS, spec_hash="h2")
    assert changed.value.reasons == ["mechanism_change"]
    same = ledger.reserve(_key("r2"), account="a", amount=1, mechanisms=LAPLACE, spec_hash="h")
    assert isinstance(same, Reservation)
    ledger.engine.dispose()


def test_policy_recorded_only_when_set(tmp_path) -> None:
    plain = account_config(cap=1)
    assert "approval" not in plain.as_record()
    held = account_config(cap=1, approval=Approval(above="1/2"))
    assert held.as_record()["approval"] == {"above": "1/2", "on_mechanism_change": False, "timeout_hours": "24"}
    with pytest.raises(ValueError, match="at least one"):
        Approval()
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        Approval(above_fraction_of_remaining=2)
    path = tmp_path / "ledgers.yaml"
    path.write_text("version: 1\naccounts:\n  a:\n    accountant: pure_dp\n    cap: 1\n    privacy_unit: person\n"
                    "    allowed_dags: [d]\n    approval: {above: 0.25, timeout_hours: 2}\n")
    assert load_ledger_config(path).accounts["a"].approval.above == Fraction(1, 4)
    path.write_text(path.read_text().replace("timeout_hours", "timeout_minutes"))
    with pytest.raises(LedgerConfigError, match="approval"):
        load_ledger_config(path)


def _forge_grant(url: str, key: ReleaseKey, signer: AuditKey, request: int) -> int:
    """Append an ``approval_granted`` to account a's chain signed with ``signer`` (a worker holding the SQLite
    file and the spend key); returns its sequence number."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            chain = AccountChain.lock(conn, "a", signer)
            row = chain.append(conn, APPROVAL_GRANTED, audit_context(), **key.as_dict(), amount="2",
                               delta_amount="0", spec_hash="h", mechanisms=json.dumps(LAPLACE),
                               details={"request": request, "reason": None, "decided_by": "worker"})
            chain.flush(conn)
            return row["account_seq"]
    finally:
        engine.dispose()


def test_sqlite_grant_forged_with_spend_key_is_refused_and_reported(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = ledger_with(url, a=account_config(cap=10, approval=Approval(above=1)))
    key = _key()
    filed = ledger.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h", plan=PLAN)
    seq = _forge_grant(url, key, SPEND_KEY, filed["request"])
    with pytest.raises(ApprovalRequiredError):  # a spend-key grant counts for nothing
        ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h")
    report = governor(url).verify()
    assert not report.ok
    assert any(f"seq {seq}" in p and "not a governor key" in p for p in report.problems), report.problems


def test_sqlite_grant_forged_with_another_key_is_reported(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = ledger_with(url, a=account_config(cap=10, approval=Approval(above=1)))
    key = _key()
    filed = ledger.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h", plan=PLAN)
    _forge_grant(url, key, AuditKey.from_text("made-up-key-" + "m" * 52), filed["request"])
    # the SQLite file's writer can make the ledger reserve (file permissions are the only barrier there) ...
    ledger.commit(ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h"), {"n": 1})
    problems = governor(url).verify().problems
    # ... but verify names the forged grant and the charge it let through
    assert any("approval_granted" in p and "not a governor key" in p for p in problems), problems
    assert any("reserved" in p and "without the privacy officer's approval" in p for p in problems), problems


def test_governor_listing_and_cli(approval_ledger, tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from dp_operators.cli import app
    from support import GOVERNOR_KEY

    url, ledger = approval_ledger
    key = _key()
    filed = ledger.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h", plan=PLAN)
    gkey = tmp_path / "governor.key"
    gkey.write_text(GOVERNOR_KEY.secret.decode() if isinstance(GOVERNOR_KEY.secret, bytes) else GOVERNOR_KEY.secret)
    gkey.chmod(0o600)
    runner = CliRunner()
    listed = runner.invoke(app, ["ledger", "approvals", "--url", url, "--json"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output.splitlines()[0])["request"] == filed["request"]
    shown = runner.invoke(app, ["ledger", "approvals", "--url", url])
    assert "discrete_laplace" in shown.output and str(filed["request"]) in shown.output
    rejected = runner.invoke(app, ["ledger", "approve", "a", str(filed["request"]), "--reject", "--reason", "no",
                                   "--url", url, "--governor-key-file", str(gkey)])
    assert rejected.exit_code == 0, rejected.output
    with pytest.raises(ApprovalRejectedError):
        ledger.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h")


# -- PostgreSQL: a worker's login (a team role, member of the spender role, holding the spend key) -----------------
@pytest.fixture(scope="module")
def teams(pg_database: sa.URL):
    from team_deployment import team_deployment

    with team_deployment(pg_database, "apr", lambda t: {
        "a": account_config("pure_dp", cap=10, dags=("d",), allowed_roles=[t.team_a], approval=Approval(above=1)),
    }) as t:
        yield t


def test_worker_login_cannot_forge_an_approval(teams) -> None:
    import psycopg

    worker = teams.ledger(teams.login_a)
    key = _key()
    filed = worker.request_approval(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h", plan=PLAN)
    raw = teams.raw(teams.login_a)
    with raw.connect() as conn:
        head = conn.execute(sa.text("SELECT audit_seq, audit_head, spent, delta_spent FROM dp_budget_accounts "
                                    "WHERE name = 'a'")).one()
        with pytest.raises(sa.exc.ProgrammingError) as denied:  # no INSERT on the audit log
            conn.execute(sa.text(
                "INSERT INTO dp_audit_events (account, account_seq, event, dag_id, run_id, task_id, map_index, "
                "release_name, spec_hash, amount, spent_after, delta_spent_after, context, details, created_at, "
                "key_id, prev_hash, row_hash) VALUES ('a', :seq, 'approval_granted', 'd', :run, 't', -1, 'counts', "
                "'h', '2', :spent, :dspent, '{}', :details, '2030-01-01T00:00:00+00:00', 'ffffffffffffffff', :prev, "
                "'0000000000000000000000000000000000000000000000000000000000000000')"),
                {"seq": head.audit_seq + 1, "run": key.run_id, "spent": head.spent, "dspent": head.delta_spent,
                 "details": json.dumps({"request": filed["request"]}), "prev": head.audit_head})
        assert isinstance(denied.value.orig, psycopg.errors.InsufficientPrivilege)
    with raw.connect() as conn:  # nor call the helpers that decide (only the spend functions are granted)
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            conn.execute(sa.text("SELECT dp_approval_state(a, 'd', :run, 't', -1, 'counts', 'h', ARRAY[2, 1], "
                                 "now()) FROM dp_budget_accounts AS a"), {"run": key.run_id})
    with pytest.raises(ApprovalRequiredError):  # dp_reserve does not accept the charge without a grant
        worker.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h")
    with pytest.raises(Exception, match="permission denied|spend key|governor"):  # nor decide as the governor
        teams_officer = type(teams.officer())(teams.url(teams.login_a), governor_key=SPEND_KEY)
        teams_officer.decide_approval("a", filed["request"], approve=True)
    teams.officer().decide_approval("a", filed["request"], approve=True, reason="ok")
    worker.commit(worker.reserve(key, account="a", amount=2, mechanisms=LAPLACE, spec_hash="h"), {"n": 1})
    report = teams.officer().verify()
    assert report.ok, report.problems
