"""An account that requires enforced contribution bounding (``require_enforced_bounding: true`` in ledgers.yaml;
docs/ledger.md, "Requiring enforced contribution bounding"), on SQLite and PostgreSQL: a charge any of whose steps
only declared its bounds (or records none: a charge written before bounding was recorded) is refused before
anything is reserved or written, with :class:`BoundingNotEnforcedError`; one whose every step was enforced is
reserved as usual. Members of blocks and quotas carry the parent's policy. A worker login calling ``dp_reserve``
by hand is refused the same way. verify names a declared charge on an account that required enforced bounding when
it was charged, and not one charged before the requirement was set."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.ledger import BoundingNotEnforcedError, LedgerConfig, ReleaseKey, Reservation
from dp_operators.ledger.config import AccountConfig, Blocks, BlockOpening, Quota, load_ledger_config
from dp_operators.ledger.structure import (
    bounding_by_aggregate,
    bounding_summary,
    config_record,
    declared_aggregates,
    describe_bounding,
    requires_enforced_bounding,
)
from ledger_backends import account_config, ledger_with
from support import SPEND_KEY, governor, spender


def enforced(aggregate: str, column: str = "person_id") -> dict:
    return {"aggregate": aggregate, "mechanism": "discrete_laplace", "scale": "2",
            "contribution_bounding": {"mode": "enforced", "source": "table", "privacy_unit_column": column,
                                      "sql_sha256": "ab" * 32}}


def declared(aggregate: str, source: str = "query") -> dict:
    return {"aggregate": aggregate, "mechanism": "discrete_laplace", "scale": "2",
            "contribution_bounding": {"mode": "declared", "source": source, "privacy_unit_column": None,
                                      "sql_sha256": None}}


def legacy(aggregate: str) -> dict:
    """A step as charges before this version recorded it: no contribution_bounding (counts as declared)."""
    return {"aggregate": aggregate, "mechanism": "discrete_laplace", "scale": "2"}


def _key(run: str | None = None, dag: str = "d") -> ReleaseKey:
    return ReleaseKey(dag, run or f"scheduled__{uuid.uuid4().hex[:8]}", "t", -1, "r")


def reserve(ledger, mechanisms, *, account: str = "a", amount=Fraction(1, 10), key: ReleaseKey | None = None,
            windows=None):
    return ledger.reserve(key or _key(), account=account, amount=amount, mechanisms=mechanisms,
                          spec_hash="0" * 64, windows=windows)


def _snapshot(ledger) -> tuple:
    return ([(a.name, a.spent) for a in ledger.accounts()], len(list(ledger.charges())), len(list(ledger.events())))


@pytest.mark.parametrize("mechanisms, named", [
    ([declared("count")], ["count"]),
    ([enforced("count"), declared("sum_age"), declared("sum_age")], ["sum_age"]),
    ([legacy("count"), enforced("sum")], ["count"]),
    ([{"aggregate": "count", "contribution_bounding": {"mode": "ENFORCED"}}], ["count"]),
    ([{"aggregate": "count", "contribution_bounding": "enforced"}], ["count"]),
    ([], []),
], ids=["declared", "mixed", "no-bounding-recorded", "wrong-case", "not-an-object", "no-steps"])
def test_an_account_requiring_enforced_bounding_refuses_a_declared_charge_and_writes_nothing(
        ledger_url, mechanisms, named):
    ledger = ledger_with(ledger_url, a=account_config(cap=1, require_enforced_bounding=True))
    before = _snapshot(ledger)
    with pytest.raises(BoundingNotEnforcedError) as refused:
        reserve(ledger, mechanisms)
    assert refused.value.account == "a" and refused.value.declared == named
    message = str(refused.value)
    assert "'a' requires enforced contribution bounding" in message and "nothing was reserved" in message
    assert "privacy_unit_column" in message and "require_enforced_bounding" in message
    for name in named:
        assert repr(name) in message
    assert _snapshot(ledger) == before  # no charge, no event (not even 'refused'), nothing spent
    assert governor(ledger_url).verify().ok


def test_an_account_requiring_enforced_bounding_accepts_a_charge_whose_every_step_was_enforced(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config(cap=1, require_enforced_bounding=True))
    reservation = reserve(ledger, [enforced("count"), enforced("sum_age")])
    assert isinstance(reservation, Reservation)
    ledger.commit(reservation, {"count": 3})
    assert ledger.account("a").spent == Fraction(1, 10)
    assert governor(ledger_url).verify().ok


def test_an_account_without_the_requirement_accepts_declared_and_legacy_charges(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config(cap=1))
    for mechanisms in ([declared("count")], [legacy("count")], []):
        ledger.commit(reserve(ledger, mechanisms), {"v": 1})
    assert governor(ledger_url).verify().ok


def test_blocks_and_quota_members_carry_the_parents_requirement(ledger_url):
    blocks = AccountConfig(
        accountant="zcdp", cap=Fraction(1, 2), privacy_unit="flight", allowed_dags=["d"],
        blocks=Blocks(window="day", open=BlockOpening(**{"from": dt.date(2013, 1, 1), "until": dt.date(2013, 1, 3)})),
        require_enforced_bounding=True,
    )
    quotas = AccountConfig(
        accountant="zcdp", cap=Fraction(1), privacy_unit="person", allowed_dags=["a1", "b1"],
        quotas={"team_a": Quota(cap=Fraction(3, 5), dags=["a1"]), "team_b": Quota(cap=Fraction(3, 5), dags=["b1"])},
        require_enforced_bounding=True,
    )
    ledger = ledger_with(ledger_url, n=blocks, q=quotas)
    for name in ("n@2013-01-01", "q@quota:team_a", "q"):
        assert requires_enforced_bounding(ledger.account_config(name)), name
    before = _snapshot(ledger)
    with pytest.raises(BoundingNotEnforcedError, match="'n' requires"):
        reserve(ledger, [declared("count")], account="n", windows=["2013-01-01", "2013-01-02"])
    with pytest.raises(BoundingNotEnforcedError, match="'q' requires"):
        reserve(ledger, [declared("count")], account="q", key=_key(dag="a1"))
    assert _snapshot(ledger) == before
    on_blocks = reserve(ledger, [enforced("count")], account="n", windows=["2013-01-01", "2013-01-02"])
    assert [m.account for m in on_blocks.members] == ["n@2013-01-01", "n@2013-01-02"]
    on_quota = reserve(ledger, [enforced("count")], account="q", key=_key(dag="a1"))
    assert sorted(m.account for m in on_quota.members) == ["q", "q@quota:team_a"]
    ledger.commit(on_blocks, {"v": 1})
    ledger.commit(on_quota, {"v": 1})
    assert governor(ledger_url).verify().ok


def test_the_requirement_may_be_set_and_lifted_at_any_time_and_does_not_flag_earlier_charges(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config(cap=1))
    ledger.commit(reserve(ledger, [declared("count")]), {"v": 1})  # charged before the requirement
    officer = governor(ledger_url)
    changes = officer.apply_config(LedgerConfig(version=1, accounts={
        "a": account_config(cap=1, require_enforced_bounding=True)}))
    assert changes == ["updated account 'a': require_enforced_bounding false -> true"]
    assert config_record(ledger.account_config("a"))["require_enforced_bounding"] is True
    with pytest.raises(BoundingNotEnforcedError):
        reserve(ledger, [declared("count")])
    ledger.commit(reserve(ledger, [enforced("count")]), {"v": 2})
    report = officer.verify()
    assert report.ok, report.problems  # the declared charge came before the requirement
    assert officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config(cap=1)})) == [
        "updated account 'a': require_enforced_bounding true -> false"]
    ledger.commit(reserve(ledger, [declared("count")]), {"v": 3})
    assert officer.verify().ok


def test_an_account_that_does_not_require_it_records_the_configuration_it_always_did():
    record = account_config(cap=1).as_record()
    assert "require_enforced_bounding" not in record
    assert account_config(cap=1, require_enforced_bounding=True).as_record()["require_enforced_bounding"] is True
    assert not requires_enforced_bounding(None) and not requires_enforced_bounding({"require_enforced_bounding": 1})


def test_the_ledger_configuration_file_takes_the_field(tmp_path):
    path = tmp_path / "ledgers.yaml"
    path.write_text("version: 1\naccounts:\n  a:\n    accountant: pure_dp\n    cap: 1\n    privacy_unit: person\n"
                    "    allowed_dags: [d]\n    require_enforced_bounding: true\n", encoding="utf-8")
    assert load_ledger_config(path).accounts["a"].require_enforced_bounding is True


def test_sqlite_verify_names_a_declared_charge_a_modified_worker_wrote_on_a_requiring_account(tmp_path, monkeypatch):
    """On SQLite the file's writer can skip the check (here: a worker running a modified package); verify names the
    charge, as the account required enforced bounding when it was charged."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = ledger_with(url, a=account_config(cap=1, require_enforced_bounding=True))
    from dp_operators.ledger import spend

    monkeypatch.setattr(spend, "bounding_refusal", lambda config, mechanisms: None)
    ledger.commit(reserve(ledger, [enforced("count"), declared("sum_age")]), {"v": 1})
    monkeypatch.undo()
    report = governor(url).verify()
    assert not report.ok
    assert any("required enforced contribution bounding when it was charged" in p and "'sum_age'" in p
               and "reserved" in p for p in report.problems), report.problems


def test_the_helpers_read_bounding_from_the_recorded_mechanisms():
    steps = [enforced("count", "pid"), declared("sum", "upstream"), legacy("mean")]
    assert declared_aggregates(steps) == ["mean", "sum"]
    assert declared_aggregates(json.dumps([enforced("count")])) == []
    assert declared_aggregates([]) is None and declared_aggregates("not json") is None
    assert bounding_summary(steps) == "mixed"
    assert bounding_summary([legacy("x")]) == "declared" and bounding_summary([enforced("x")]) == "enforced"
    by = bounding_by_aggregate(steps)
    assert describe_bounding(by["count"]) == "enforced (table, unit column pid, SQL sha256 abababababab…)"
    assert describe_bounding(by["sum"]) == "declared (upstream)" and describe_bounding(by["mean"]) == "declared"


# -- PostgreSQL: the database refuses, whoever calls -----------------------------------------------------------------


def _raw_reserve(teams, role: str, key: ReleaseKey, account: str, mechanisms: list) -> dict:
    from dp_operators.ledger.pg_functions import SPEND_FUNCTIONS

    (function,) = [f for f in SPEND_FUNCTIONS if f.name == "dp_reserve"]
    arguments = [arg.strip().split(" ", 1) for arg in function.args.split(",")]
    sql = "SELECT dp_reserve(" + ", ".join(f"CAST(:{n.removeprefix('p_')} AS {t})" for n, t in arguments) + ")"
    params = {"key": SPEND_KEY.secret, "account": account, "windows": [], **key.as_dict(), "amount": "1/100",
              "takeover": "1/100", "delta": "0", "mechanisms": json.dumps(mechanisms), "spec_hash": "0" * 64,
              "try_number": None, "context": "{}", "token_hash": hashlib.sha256(b"token").hexdigest(),
              "lease_seconds": 120.0}
    with teams.raw(role).connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def test_a_worker_login_calling_dp_reserve_by_hand_with_declared_mechanisms_is_refused(pg_database):
    from team_deployment import team_deployment

    with team_deployment(pg_database, "bnd", lambda t: {
        "a": account_config("pure_dp", cap=10, dags=("d",), require_enforced_bounding=True),
    }) as t:
        for mechanisms in ([declared("count")], [legacy("count")], [enforced("c"), "enforced"], []):
            result = _raw_reserve(t, t.login_a, _key(), "a", mechanisms)
            assert result["status"] == "bounding_not_enforced", (mechanisms, result)
        with t.raw("postgres").connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM dp_charges").scalar_one() == 0
            assert conn.exec_driver_sql("SELECT count(*) FROM dp_audit_events").scalar_one() == 1  # created
        with pytest.raises(BoundingNotEnforcedError, match=r"\['count'\]"):
            reserve(t.ledger(t.login_a), [declared("count")])
        assert _raw_reserve(t, t.login_a, _key(), "a", [enforced("count")])["status"] == "reserved"
        assert t.officer().verify().ok
        t.dispose()


def test_apply_refuses_the_requirement_on_a_ledger_whose_spend_function_predates_it(pg_database):
    """A ledger upgraded without 'dpctl ledger init' would record the requirement and not enforce it: apply refuses,
    and init (reinstalling the functions) lets it through."""
    from team_deployment import team_deployment

    with team_deployment(pg_database, "bndold", lambda t: {"a": account_config("pure_dp", cap=10, dags=("d",))}) as t:
        with t.raw("postgres").connect() as conn:  # the body of an earlier version: no bounding check
            source = conn.exec_driver_sql("SELECT prosrc FROM pg_proc WHERE proname = 'dp_reserve_member' AND "
                                          "pronamespace = current_schema()::regnamespace").scalar_one()
            start = source.index("  -- the account's contribution-bounding policy, on the row locked above")
            end = source.index("  -- the first charge of a key on this account is the amount")
            old = source[:start] + source[end:]
            identity = conn.exec_driver_sql("SELECT pg_get_function_identity_arguments(oid) FROM pg_proc WHERE "
                                            "proname = 'dp_reserve_member' AND "
                                            "pronamespace = current_schema()::regnamespace").scalar_one()
            conn.exec_driver_sql(f"CREATE OR REPLACE FUNCTION dp_reserve_member({identity}) RETURNS jsonb "
                                 f"LANGUAGE plpgsql AS $fn${old}$fn$".replace("%", "%%"))
        wanted = LedgerConfig(version=1, accounts={
            "a": account_config("pure_dp", cap=10, dags=("d",), require_enforced_bounding=True)})
        with pytest.raises(ValueError, match="predates the requirement.*dpctl ledger init"):
            t.officer().apply_config(wanted)
        owner = governor(t.url())
        owner.init_schema()
        owner.engine.dispose()
        assert t.officer().apply_config(wanted) == ["updated account 'a': require_enforced_bounding false -> true"]
        with pytest.raises(BoundingNotEnforcedError):
            reserve(t.ledger(t.login_a), [declared("count")])
        t.dispose()


def test_the_bounds_a_release_enforced_are_described_in_words():
    record = {"mode": "enforced", "source": "table", "privacy_unit_column": "tailnum", "sql_sha256": "ab" * 32,
              "max_partitions_contributed": 3, "max_contributions_per_partition": 250}
    assert describe_bounding(record) == ("enforced (table, unit column tailnum, each unit in at most 3 keys, at most "
                                         "250 rows each, SQL sha256 abababababab…)")
    assert "at most 1 key, at most 1 row each" in describe_bounding(
        {**record, "max_partitions_contributed": 1, "max_contributions_per_partition": 1})
