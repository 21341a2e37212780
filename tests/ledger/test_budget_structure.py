"""Privacy blocks and team quotas in the ledger (dp_operators.ledger.structure), on SQLite and PostgreSQL: a charge
touches the member accounts the ledger decides, all or nothing; a member or a structured parent is never charged
alone; a team login cannot spend another team's quota; verify stays clean."""

from __future__ import annotations

import datetime as dt
import multiprocessing
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.ledger import (
    AccountNotFoundError,
    BudgetExhaustedError,
    LedgerConfig,
    Reservation,
    ReleaseKey,
)
from dp_operators.ledger.config import AccountConfig, Blocks, BlockOpening, LedgerConfigError, Quota
from dp_operators.ledger.errors import RoleNotAllowedError
from dp_operators.ledger.structure import windows_read
from ledger_backends import ledger_with
from support import governor, spender

JAN = [f"2013-01-{day:02d}" for day in range(1, 32)]


def blocks_account(cap: Fraction = Fraction(1, 2), until: dt.date = dt.date(2013, 1, 31)) -> AccountConfig:
    return AccountConfig(
        accountant="zcdp", cap=cap, privacy_unit="flight", allowed_dags=["d", "e"],
        blocks=Blocks(window="day", open=BlockOpening(**{"from": dt.date(2013, 1, 1), "until": until})),
    )


def quotas_account(dags_a=("a1",), dags_b=("b1",), roles=(None, None)) -> AccountConfig:
    return AccountConfig(
        accountant="zcdp", cap=Fraction(1), privacy_unit="person", allowed_dags=[*dags_a, *dags_b],
        quotas={"team_a": Quota(cap=Fraction(3, 5), dags=list(dags_a), role=roles[0]),
                "team_b": Quota(cap=Fraction(3, 5), dags=list(dags_b), role=roles[1])},
    )


def reserve(ledger, run: str, amount, *, dag: str = "d", account: str = "n", windows=None):
    return ledger.reserve(ReleaseKey(dag, run, "t", -1, "r"), account=account, amount=Fraction(amount),
                          mechanisms=[], spec_hash="0" * 64, windows=windows)


def spent(ledger) -> dict[str, Fraction]:
    return {account.name: account.spent for account in ledger.accounts()}


def test_a_daily_release_over_new_data_runs_a_month_on_a_cap_that_funds_one_run_per_block(ledger_url):
    ledger = ledger_with(ledger_url, n=blocks_account())
    for day in JAN[:30]:
        reservation = reserve(ledger, f"scheduled__{day}", Fraction(1, 2), windows=[day])
        assert isinstance(reservation, Reservation)
        assert [member.account for member in reservation.members] == [f"n@{day}"]
        ledger.commit(reservation, {"day": day})
    after = spent(ledger)
    assert after["n"] == 0  # the parent is never charged
    assert all(after[f"n@{day}"] == Fraction(1, 2) for day in JAN[:30]) and after["n@2013-01-31"] == 0
    assert governor(ledger_url).verify().ok


def test_rereading_a_spent_window_is_refused_and_reserves_nothing_on_the_other_windows(ledger_url):
    ledger = ledger_with(ledger_url, n=blocks_account())
    ledger.commit(reserve(ledger, "day3", Fraction(1, 2), windows=["2013-01-03"]), {"v": 1})
    before = spent(ledger)
    with pytest.raises(BudgetExhaustedError, match="n@2013-01-03"):
        reserve(ledger, "week", Fraction(1, 4), windows=JAN[:7])
    assert spent(ledger) == before
    assert not [c for c in ledger.charges() if c["run_id"] == "week"]
    refused = [e for e in ledger.events() if e["event"] == "refused"]
    assert [e["account"] for e in refused] == ["n@2013-01-03"]  # the refusal is recorded on its block alone
    assert governor(ledger_url).verify().ok


def test_a_seven_day_window_charges_its_seven_blocks_and_replays_without_charging_again(ledger_url):
    ledger = ledger_with(ledger_url, n=blocks_account())
    windows = windows_read("day", dt.datetime(2013, 1, 9, tzinfo=dt.timezone.utc),
                           dt.datetime(2013, 1, 10, tzinfo=dt.timezone.utc), lookback=6)
    assert windows == JAN[2:9]
    reservation = reserve(ledger, "sliding", Fraction(1, 5), windows=windows)
    ledger.commit(reservation, {"v": 7})
    charged = {name: amount for name, amount in spent(ledger).items() if amount}
    assert charged == {f"n@{day}": Fraction(1, 5) for day in JAN[2:9]}
    assert reserve(ledger, "sliding", Fraction(1, 5), windows=windows) == {"v": 7}
    assert spender(ledger_url).authenticated_output(ReleaseKey("d", "sliding", "t", -1, "r"), "n") == {"v": 7}
    assert spent(ledger) == {**spent(ledger), **charged}


def test_a_released_or_abandoned_reservation_acts_on_every_block(ledger_url):
    ledger = ledger_with(ledger_url, n=blocks_account())
    ledger.release(reserve(ledger, "gone", Fraction(1, 2), windows=JAN[:3]))
    assert all(amount == 0 for amount in spent(ledger).values())
    reservation = reserve(ledger, "dead", Fraction(1, 2), windows=JAN[:3])
    ledger.renew(reservation)
    ledger.abandon(reservation)
    assert {name for name, amount in spent(ledger).items() if amount} == {f"n@{day}" for day in JAN[:3]}
    assert governor(ledger_url).verify().ok


@pytest.mark.parametrize("windows, error, message", [
    (None, ValueError, "has privacy blocks"),
    ([], ValueError, "has privacy blocks"),
    (["2013-02-01"], AccountNotFoundError, "window '2013-02-01' of account 'n' is not open"),
    (["2013-W01"], ValueError, "is not a day window"),
    (["2013-01-01", "2013-02-01"], AccountNotFoundError, "is not open"),
])
def test_a_charge_naming_no_open_windows_is_refused_before_anything_is_written(ledger_url, windows, error, message):
    ledger = ledger_with(ledger_url, n=blocks_account())
    events = len(list(ledger.events()))
    with pytest.raises(error, match=message):
        reserve(ledger, "r", Fraction(1, 4), windows=windows)
    assert len(list(ledger.events())) == events and not list(ledger.charges())


def test_a_member_account_is_never_charged_on_its_own(ledger_url):
    ledger = ledger_with(ledger_url, n=blocks_account(), q=quotas_account())
    for member in ("n@2013-01-01", "q@quota:team_a"):
        with pytest.raises(ValueError, match="is a member of account"):
            reserve(ledger, "r", Fraction(1, 10), account=member, dag="a1" if member.startswith("q") else "d")
    with pytest.raises(ValueError, match="has no privacy blocks"):
        reserve(ledger, "r", Fraction(1, 10), account="q", dag="a1", windows=["2013-01-01"])
    assert not list(ledger.charges())


def test_one_teams_exhausted_quota_does_not_stop_another_and_the_shared_cap_stops_both(ledger_url):
    ledger = ledger_with(ledger_url, q=quotas_account())
    ledger.commit(reserve(ledger, "a-1", Fraction(1, 2), dag="a1", account="q"), {"v": 1})
    with pytest.raises(BudgetExhaustedError, match="q@quota:team_a"):
        reserve(ledger, "a-2", Fraction(1, 5), dag="a1", account="q")
    ledger.commit(reserve(ledger, "b-1", Fraction(2, 5), dag="b1", account="q"), {"v": 2})
    # team B has 1/5 of its quota left, but the account's cap (1) has only 1/10 left: the cap decides
    with pytest.raises(BudgetExhaustedError, match="budget account 'q' is exhausted"):
        reserve(ledger, "b-2", Fraction(1, 5), dag="b1", account="q")
    assert spent(ledger) == {"q": Fraction(9, 10), "q@quota:team_a": Fraction(1, 2), "q@quota:team_b": Fraction(2, 5)}
    assert governor(ledger_url).verify().ok


def approx_quotas_account(delta_a=None) -> AccountConfig:
    return AccountConfig(
        accountant="approx_dp", epsilon=Fraction(10), delta=Fraction(1, 10**5), privacy_unit="person",
        allowed_dags=["a1", "b1"],
        quotas={"team_a": Quota(cap=Fraction(5), dags=["a1"], delta=delta_a),
                "team_b": Quota(cap=Fraction(5), dags=["b1"])},
    )


def test_one_team_cannot_spend_the_delta_another_teams_selections_need(ledger_url):
    """On an approx_dp account each quota holds its share of the delta (cap / account cap, here half): a team that
    spends its whole share, or tries to reserve the account's whole delta with a tiny epsilon, leaves the other
    team's delta untouched."""
    ledger = ledger_with(ledger_url, q=approx_quotas_account())
    key = ReleaseKey("a1", "greedy", "t", -1, "r")
    with pytest.raises(BudgetExhaustedError, match="'q@quota:team_a' has too little delta left for this charge: "
                                                   "requested delta 1e-05, remaining 5e-06"):
        ledger.reserve(key, account="q", amount=Fraction(1, 10**6), delta=Fraction(1, 10**5), mechanisms=[],
                       spec_hash="0" * 64)
    ledger.commit(ledger.reserve(key, account="q", amount=Fraction(1, 2), delta=Fraction(1, 2 * 10**5),
                                 mechanisms=[], spec_hash="0" * 64), {"v": 1})
    with pytest.raises(BudgetExhaustedError, match="q@quota:team_a"):
        ledger.reserve(ReleaseKey("a1", "more", "t", -1, "r"), account="q", amount=Fraction(1, 2),
                       delta=Fraction(1, 10**9), mechanisms=[], spec_hash="0" * 64)
    # team B's release with partition selection still finds its half of the delta
    ledger.commit(ledger.reserve(ReleaseKey("b1", "b-1", "t", -1, "r"), account="q", amount=Fraction(2),
                                 delta=Fraction(1, 2 * 10**5), mechanisms=[], spec_hash="0" * 64), {"v": 2})
    deltas = {account.name: account.delta_spent for account in ledger.accounts()}
    assert deltas == {"q": Fraction(1, 10**5), "q@quota:team_a": Fraction(1, 2 * 10**5),
                      "q@quota:team_b": Fraction(1, 2 * 10**5)}
    assert governor(ledger_url).verify().ok


def test_a_quotas_delta_is_its_share_of_the_cap_unless_given_and_only_on_approx_dp_accounts():
    members = approx_quotas_account(delta_a=Fraction(1, 10**6)).members("q")
    assert members["q@quota:team_a"].delta == Fraction(1, 10**6)
    assert members["q@quota:team_b"].delta == Fraction(1, 2 * 10**5)
    assert quotas_account().members("q")["q@quota:team_a"].delta is None  # zcdp: no delta is spent
    with pytest.raises(ValueError, match="only an approx_dp account spends"):
        AccountConfig(accountant="zcdp", cap=Fraction(1), privacy_unit="person", allowed_dags=["a1"],
                      quotas={"t": Quota(cap=Fraction(1, 2), dags=["a1"], delta=Fraction(1, 10**6))})
    with pytest.raises(ValueError, match="above the account's delta"):
        approx_quotas_account(delta_a=Fraction(1, 10**4))


def test_quotas_must_cover_exactly_the_accounts_dags_each_in_one_team(tmp_path):
    with pytest.raises(ValueError, match="allowed_dags must be exactly the DAGs"):
        AccountConfig(accountant="zcdp", cap=1, privacy_unit="p", allowed_dags=["a1", "b1", "c"],
                      quotas={"t": Quota(cap=Fraction(1, 2), dags=["a1", "b1"])})
    with pytest.raises(ValueError, match="in the quotas of both"):
        AccountConfig(accountant="zcdp", cap=1, privacy_unit="p", allowed_dags=["a1"],
                      quotas={"t": Quota(cap=Fraction(1, 2), dags=["a1"]), "u": Quota(cap=Fraction(1, 2), dags=["a1"])})
    with pytest.raises(ValueError, match="above the account's cap"):
        AccountConfig(accountant="zcdp", cap=1, privacy_unit="p", allowed_dags=["a1"],
                      quotas={"t": Quota(cap=2, dags=["a1"])})
    with pytest.raises(ValueError, match="is kept for the members"):
        LedgerConfig(version=1, accounts={"x@y": blocks_account()})


def test_a_ledger_configuration_file_with_blocks_names_a_bad_field(tmp_path):
    from dp_operators.ledger.config import load_ledger_config

    path = tmp_path / "ledgers.yaml"
    path.write_text("version: 1\naccounts:\n  n:\n    accountant: zcdp\n    cap: 1\n    privacy_unit: flight\n"
                    "    allowed_dags: [d]\n    blocks: {window: fortnight, open: {from: 2013-01-01, until: 2013-01-05}}\n")
    with pytest.raises(LedgerConfigError, match=r"accounts\.n\.blocks\.window"):
        load_ledger_config(path)
    path.write_text(path.read_text().replace("fortnight", "week").replace("until: 2013-01-05", "ahead: 2"))
    config = load_ledger_config(path)
    assert list(config.all_accounts(today=dt.date(2013, 1, 20))) == [
        "n", "n@2013-W01", "n@2013-W02", "n@2013-W03", "n@2013-W04", "n@2013-W05"]


def _race(url: str, run: str, windows: list[str], queue) -> None:
    ledger = spender(url)
    try:
        reservation = reserve(ledger, run, Fraction(1, 2), windows=windows)
        ledger.commit(reservation, {"run": run})
        queue.put((run, "committed"))
    except BudgetExhaustedError:
        queue.put((run, "refused"))
    except Exception as error:  # noqa: BLE001 - reported to the test
        queue.put((run, repr(error)))


def test_overlapping_sliding_windows_racing_for_the_same_blocks_commit_whole_or_not_at_all(ledger_url):
    ledger_with(ledger_url, n=blocks_account())
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    # seven runs, each over 7 days, windows shifted one day: any two overlap (day 7 is in all), a block funds one run
    runs = {f"run{i}": JAN[i:i + 7] for i in range(7)}
    processes = [context.Process(target=_race, args=(ledger_url, run, windows, queue)) for run, windows in runs.items()]
    for process in processes:
        process.start()
    outcomes = dict(queue.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    assert set(outcomes.values()) <= {"committed", "refused"}, outcomes
    committed = [run for run, outcome in outcomes.items() if outcome == "committed"]
    assert len(committed) == 1  # every pair of these windows overlaps
    ledger = spender(ledger_url)
    charged = {name: amount for name, amount in spent(ledger).items() if amount}
    assert charged == {f"n@{day}": Fraction(1, 2) for day in runs[committed[0]]}
    states = {(c["run_id"], c["state"]) for c in ledger.charges()}
    assert states == {(committed[0], "committed")}
    assert governor(ledger_url).verify().ok


def test_a_team_login_cannot_spend_another_teams_quota_whatever_dag_it_claims(pg_database):
    from team_deployment import team_deployment

    def accounts(t):
        return {"q": quotas_account(roles=(t.team_a, t.team_b))}

    with team_deployment(pg_database, "quota", accounts) as t:
        as_a = t.ledger(t.login_a)
        with pytest.raises(RoleNotAllowedError):
            reserve(as_a, "steal", Fraction(1, 10), dag="b1", account="q")
        ledger = t.ledger(t.login_b)
        ledger.commit(reserve(ledger, "own", Fraction(1, 10), dag="b1", account="q"), {"v": 1})
        with sa.create_engine(t.url()).connect() as conn:
            rows = conn.exec_driver_sql("SELECT account, state FROM dp_charges ORDER BY account").all()
        assert [tuple(row) for row in rows] == [("q", "committed"), ("q@quota:team_b", "committed")]
        t.dispose()


def test_verify_names_a_charge_written_on_a_blocks_account_or_a_quota_without_its_twin(ledger_url):
    ledger = ledger_with(ledger_url, n=blocks_account(), q=quotas_account())
    ledger.commit(reserve(ledger, "a-1", Fraction(1, 5), dag="a1", account="q"), {"v": 1})
    assert governor(ledger_url).verify().ok
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:  # the file's (or the tables' owner's) rights: outside the spend functions
        for account, attempt in (("n", 98), ("q", 99)):  # a charge on a blocks parent; one on 'q' with no twin
            conn.exec_driver_sql(
                "INSERT INTO dp_charges (account, dag_id, run_id, task_id, map_index, release_name, attempt, state, "
                "amount, delta_amount, mechanisms, spec_hash, token_hash, created_at, updated_at) SELECT "
                f"'{account}', dag_id, run_id, task_id, map_index, release_name, {attempt}, 'reserved', amount, "
                f"delta_amount, mechanisms, spec_hash, '{attempt}' || substr(token_hash, 3), created_at, updated_at "
                "FROM dp_charges WHERE account = 'q'"
            )
    engine.dispose()
    problems = " ".join(governor(ledger_url).verify().problems)
    assert "is on account 'n', which has privacy blocks" in problems
    assert "of account 'q' (team quotas)" in problems


@pytest.mark.parametrize("change, message", [
    ({"blocks": Blocks(window="week", open=BlockOpening(**{"from": dt.date(2013, 1, 1), "until": dt.date(2013, 1, 31)}))},
     r"its structure \(day privacy blocks -> week privacy blocks\)"),
    ({"blocks": None}, r"its structure \(day privacy blocks -> no blocks or quotas\)"),
    ({"privacy_unit": "person"}, r"its privacy unit \('flight' -> 'person'\)"),
])
def test_a_spent_blocks_structure_and_unit_are_fixed_so_no_record_gets_a_fresh_budget(ledger_url, change, message):
    ledger = ledger_with(ledger_url, n=blocks_account())
    ledger.commit(reserve(ledger, "day5", Fraction(1, 2), windows=["2013-01-05"]), {"v": 1})
    changed = blocks_account().model_copy(update=change)
    with pytest.raises(ValueError, match=message):
        governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"n": changed}))
    with pytest.raises(BudgetExhaustedError):  # the spent day stays spent
        reserve(ledger, "again", Fraction(1, 8), windows=["2013-01-05"])
    # before anything is charged, an account may still be reshaped
    fresh = ledger_with(ledger_url, m=blocks_account())
    governor(ledger_url).apply_config(LedgerConfig(version=1, accounts={"m": blocks_account().model_copy(update=change)}))
    assert fresh.structure("m")[0] == ("plain" if change.get("blocks", 0) is None else "blocks")


def test_a_changed_mechanism_on_a_new_days_block_waits_for_approval_as_on_the_same_block(ledger_url):
    from dp_operators.ledger.config import Approval
    from dp_operators.ledger.errors import ApprovalRequiredError

    account = blocks_account().model_copy(update={"approval": Approval(on_mechanism_change=True)})
    ledger = ledger_with(ledger_url, n=account)
    gaussian, laplace = [{"mechanism": "discrete_gaussian"}], [{"mechanism": "discrete_laplace"}]

    def release(run, day, mechanisms):
        return ledger.reserve(ReleaseKey("d", run, "t", -1, "r"), account="n", amount=Fraction(1, 4),
                              mechanisms=mechanisms, spec_hash="0" * 64, windows=[day])

    ledger.commit(release("day1", "2013-01-01", gaussian), {"v": 1})
    ledger.commit(release("day2", "2013-01-02", gaussian), {"v": 2})  # the same mechanism: no approval
    with pytest.raises(ApprovalRequiredError, match="budget account 'n' requires"):
        release("day3", "2013-01-03", laplace)  # a new block, but the release changed mechanism
    assert not [c for c in ledger.charges() if c["run_id"] == "day3"]
    assert governor(ledger_url).verify().ok


@pytest.mark.parametrize("first, then", [("commit", "release"), ("release", "commit")])
def test_a_reservation_on_several_accounts_is_settled_whole_never_one_member_one_way(ledger_url, first, then):
    """Settling one member of a quota reservation, then the other the other way, would charge the team's quota
    but not the shared cap (or the reverse); the ledger refuses the second, and the members stay counted."""
    ledger = ledger_with(ledger_url, q=quotas_account())
    reservation = reserve(ledger, "a-1", Fraction(1, 5), dag="a1", account="q")
    parent, quota = reservation.members

    def settle(action, part):
        return ledger.commit(part, {"v": 1}) if action == "commit" else ledger.release(part)

    settle(first, quota)
    with pytest.raises(Exception, match="one member of a reservation"):
        settle(then, parent)
    totals = spent(ledger)
    assert totals["q"] == Fraction(1, 5)  # never released: the shared cap keeps the charge
    assert totals["q@quota:team_a"] == (Fraction(1, 5) if first == "commit" else 0)


def test_an_officers_grant_approves_one_charge_not_every_later_attempt(ledger_url):
    """Reserve under a grant, abandon (noise may have been drawn), reserve again: the takeover is refused rather
    than charged under the same grant again, on a plain account with an approval policy."""
    from dp_operators.ledger.config import Approval
    from dp_operators.ledger.errors import ApprovalRejectedError, ApprovalRequiredError

    account = AccountConfig(accountant="zcdp", cap=Fraction(10), privacy_unit="person", allowed_dags=["d"],
                            approval=Approval(above=Fraction(1)))
    ledger = ledger_with(ledger_url, ap=account)
    key = ReleaseKey("d", "r", "t", -1, "r")

    def charge():
        return ledger.reserve(key, account="ap", amount=Fraction(2), mechanisms=[], spec_hash="0" * 64)

    with pytest.raises(ApprovalRequiredError):
        charge()
    request = ledger.request_approval(key, account="ap", amount=Fraction(2), mechanisms=[], spec_hash="0" * 64,
                                      plan={"charge": "2"})
    governor(ledger_url).decide_approval("ap", request["request"], approve=True)
    ledger.abandon(charge())
    with pytest.raises(ApprovalRejectedError, match="used by an earlier attempt"):
        charge()
    assert ledger.account("ap").spent == 2


def test_verify_names_a_reservation_whose_members_were_settled_unlike_each_other(ledger_url):
    ledger = ledger_with(ledger_url, n=blocks_account())
    ledger.commit(reserve(ledger, "week", Fraction(1, 4), windows=JAN[:3]), {"v": 1})
    assert governor(ledger_url).verify().ok
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:  # a released member of the committed reservation, written around the ledger
        conn.exec_driver_sql(
            "INSERT INTO dp_charges (account, dag_id, run_id, task_id, map_index, release_name, attempt, state, "
            "amount, delta_amount, mechanisms, spec_hash, token_hash, created_at, updated_at) SELECT "
            "'n@2013-01-04', dag_id, run_id, task_id, map_index, release_name, 9, 'released', amount, delta_amount, "
            "mechanisms, spec_hash, token_hash, created_at, updated_at FROM dp_charges WHERE account = 'n@2013-01-01'"
        )
    engine.dispose()
    problems = " ".join(governor(ledger_url).verify().problems)
    assert "settled unlike each other (committed, released)" in problems


def test_an_officers_grant_on_blocks_covers_the_windows_its_request_listed_only(ledger_url):
    """The plan the officer granted lists the release's blocks; the same release key charged on other windows is
    not covered by that grant (it waits, as a new charge would)."""
    from dp_operators.ledger.config import Approval
    from dp_operators.ledger.errors import ApprovalRequiredError

    account = blocks_account().model_copy(update={"approval": Approval(above=Fraction(1, 8))})
    ledger = ledger_with(ledger_url, n=account)
    key = ReleaseKey("d", "r", "t", -1, "r")
    listed = {"charge": "1/4", "blocks": [{"window": "2013-01-05", "remaining_after": "1/4"}]}
    request = ledger.request_approval(key, account="n", amount=Fraction(1, 4), mechanisms=[], spec_hash="0" * 64,
                                      plan=listed)
    governor(ledger_url).decide_approval("n", request["request"], approve=True)

    def charge(windows):
        return ledger.reserve(key, account="n", amount=Fraction(1, 4), mechanisms=[], spec_hash="0" * 64,
                              windows=windows)

    with pytest.raises(ApprovalRequiredError):
        charge(["2013-01-05", "2013-01-06"])  # 01-06 was not in the granted plan
    assert not list(ledger.charges())
    ledger.commit(charge(["2013-01-05"]), {"v": 1})
    assert governor(ledger_url).verify().ok
