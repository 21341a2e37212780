"""The dashboard's read-only queries, on SQLite and PostgreSQL: the numbers are the ledger's (``Ledger.account``,
``dpctl ledger show``), pages and filters select what ``Ledger.charges`` selects, the forecast follows its rate."""

from __future__ import annotations

import json
import math

import datetime as dt
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.dashboard import queries
from dp_operators.ledger import ReleaseKey, schema
from dp_operators.ledger.errors import LedgerNotInitialisedError
from ledger_backends import account_config, ledger_with
from dashboard_data import MECHANISMS, OUTPUT
from support import make_ledger


def key(run: str, dag: str = "d") -> ReleaseKey:
    return ReleaseKey(dag, run, "t", -1, "r")


def reserve(ledger, run: str, amount, dag: str = "d", account: str = "a"):
    return ledger.reserve(key(run, dag), account=account, amount=Fraction(amount), mechanisms=MECHANISMS,
                          spec_hash="0" * 64)


@pytest.fixture
def small(ledger_url):
    """Account ``a`` (pure_dp, cap 10) with charges 1..6 in states committed, committed, released, abandoned,
    committed (DAG ``e``), reserved; account ``z`` (zCDP, cap 1/2) with one committed charge of 1/30."""
    ledger = ledger_with(
        ledger_url,
        a=account_config("pure_dp", epsilon="10", dags=("d", "e")),
        z=account_config("zcdp", cap="1/2", delta="1e-6", dags=("d",)),
    )
    ledger.commit(reserve(ledger, "r1", "1/3"), OUTPUT)
    ledger.commit(reserve(ledger, "r2", "1/2"), {"run": "r2"})
    ledger.release(reserve(ledger, "r3", "2"))
    ledger.abandon(reserve(ledger, "r4", "1/4"))
    ledger.commit(reserve(ledger, "r5", "1/5", dag="e"), {"run": "r5"})
    reserve(ledger, "r6", "1/7")
    ledger.commit(reserve(ledger, "r7", "1/30", account="z"), {"run": "r7"})
    return ledger


def settled(ledger, account="a") -> list[dict]:
    return [c for c in ledger.charges(account=account) if c["state"] in queries.SETTLED_STATES]


def utc(value: dt.datetime) -> dt.datetime:
    """A stored time as aware UTC (SQLite hands timestamps back naive)."""
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value


def test_overview_is_what_ledger_show_prints(small, ledger_url):
    from typer.testing import CliRunner

    from dp_operators.cli import app

    shown = CliRunner().invoke(app, ["ledger", "show", "--url", str(ledger_url), "--json"])
    assert shown.exit_code == 0, shown.output
    printed = {row.pop("account"): row for row in json.loads(shown.stdout)}
    rows = queries.accounts_overview(small)
    assert [row["name"] for row in rows] == ["a", "z"] == sorted(printed)
    for row in rows:
        status = small.account(row["name"])
        expected = printed[row["name"]]
        assert {k: row[k] for k in expected} == expected
        assert row["spent_float"] == float(status.spent) and row["remaining_float"] == float(status.remaining)
    a = rows[0]
    # committed 1/3 + 1/2 + 1/5, abandoned 1/4, reserved 1/7; released 2 returned
    assert Fraction(a["spent"]) == Fraction(1, 3) + Fraction(1, 2) + Fraction(1, 5) + Fraction(1, 4) + Fraction(1, 7)
    assert Fraction(a["reserved"]) == Fraction(1, 7)
    assert rows[1]["unit"] == "rho" and rows[1]["spent_epsilon"] > 0 and rows[1]["cap_epsilon"] > 0


def test_detail_counts_burn_down_and_unknown_account(small):
    detail = queries.account_detail(small, "a")
    assert {k: detail[k] for k in queries.accounts_overview(small)[0]} == queries.accounts_overview(small)[0]
    assert detail["charge_counts"] == {"reserved": 1, "committed": 3, "released": 1, "abandoned": 1, "total": 6}
    points = detail["burn_down"]["points"]
    exact = sum(Fraction(c["amount"]) for c in settled(small))
    assert points[-1]["cumulative"] == pytest.approx(float(exact), rel=1e-12)
    assert points[-1]["charges"] == 4
    assert [p["cumulative"] for p in points] == sorted(p["cumulative"] for p in points)
    assert detail["burn_down"]["cap_float"] == 10.0
    assert queries.account_detail(small, "nope") is None


def test_burn_down_is_downsampled(small):
    points = queries.account_detail(small, "a", max_points=2)["burn_down"]["points"]
    assert 1 <= len(points) <= 2
    assert points[-1]["charges"] == 4
    assert dt.datetime.fromisoformat(points[-1]["time"]) == max(utc(c["created_at"]) for c in settled(small))
    with pytest.raises(ValueError, match="max_points"):
        queries.account_detail(small, "a", max_points=1)


def test_forecast_at_a_known_rate(small):
    first = min(utc(c["created_at"]) for c in settled(small))
    now = first + dt.timedelta(days=10)
    forecast = queries.account_detail(small, "a", now=now)["forecast"]
    spend = float(sum(Fraction(c["amount"]) for c in settled(small)))
    remaining = small.account("a").remaining
    assert forecast["window_spend"] == pytest.approx(spend, rel=1e-12)
    assert forecast["rate_per_day"] == pytest.approx(spend / 10, rel=1e-9)
    assert forecast["days_left"] == pytest.approx(float(remaining) / (spend / 10), rel=1e-9)
    exhausts = dt.datetime.fromisoformat(forecast["exhausts_at"])
    assert abs((exhausts - now).total_seconds() - forecast["days_left"] * 86_400) < 1
    assert forecast["remaining"] == float(remaining) and not forecast["exhausted"]
    # a month and more later nothing was spent in the window: no rate, no date
    assert forecast["reason"] is None
    assert forecast["window_from_first_charge"] is True and forecast["window_start"] == first.isoformat()
    later = queries.account_detail(small, "a", now=first + dt.timedelta(days=45))["forecast"]
    assert later["rate_per_day"] is None and later["exhausts_at"] is None and later["window_charges"] == 0
    assert later["reason"] == "no settled spend in the last 30 days"


@pytest.mark.parametrize(
    "history, forecast_given",
    [
        pytest.param(dt.timedelta(minutes=6), False, id="6 minutes: no forecast"),
        pytest.param(dt.timedelta(days=1) - dt.timedelta(seconds=1), False, id="a second short of a day"),
        pytest.param(dt.timedelta(days=1), True, id="a day: forecast"),
    ],
)
def test_a_forecast_needs_a_day_of_settled_history(small, history, forecast_given):
    """Minutes of spend extrapolated to a daily rate forecast exhaustion within the hour: below
    MIN_FORECAST_HISTORY_DAYS there is no rate, and ``reason`` says why."""
    assert queries.MIN_FORECAST_HISTORY_DAYS == 1.0
    first = min(utc(c["created_at"]) for c in settled(small))  # the fixture's charges are seconds apart
    forecast = queries.account_detail(small, "a", now=first + history)["forecast"]
    assert forecast["window_charges"] == 4 and forecast["window_start"] == first.isoformat()
    assert forecast["window_from_first_charge"] is True and forecast["min_history_days"] == 1.0
    if forecast_given:
        assert forecast["reason"] is None and forecast["rate_per_day"] == pytest.approx(forecast["window_spend"])
        assert forecast["days_left"] > 0 and forecast["exhausts_at"]
    else:
        assert (forecast["rate_per_day"], forecast["days_left"], forecast["exhausts_at"]) == (None, None, None)
        assert forecast["reason"] == "not enough history: settled spend spans less than 1 day"


def test_a_window_full_of_history_is_not_from_the_first_charge(small):
    first = min(utc(c["created_at"]) for c in settled(small))
    forecast = queries.account_detail(small, "a", now=first + dt.timedelta(days=20), window_days=5)["forecast"]
    assert forecast["window_from_first_charge"] is False and forecast["reason"] == "no settled spend in the last 5 days"


def test_no_spend_no_forecast(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", epsilon="1"))
    ledger.release(reserve(ledger, "r1", "1/2"))
    detail = queries.account_detail(ledger, "a")
    assert detail["burn_down"]["points"] == []
    assert detail["forecast"]["rate_per_day"] is None and detail["forecast"]["exhausts_at"] is None
    assert detail["charge_counts"]["released"] == 1


def test_charges_pages_by_id(small):
    seen, after = [], None
    while True:
        page = queries.account_charges(small, "a", after=after, limit=4)
        assert page["total"] == 6
        seen += page["charges"]
        after = page["next_after"]
        if after is None:
            break
    assert [c["id"] for c in seen] == [c["id"] for c in small.charges(account="a")]
    assert len(seen) == 6
    first = seen[0]
    assert first["amount"] == "1/3" and first["amount_float"] == pytest.approx(1 / 3)
    assert first["mechanisms"] == ["discrete_laplace", "discrete_gaussian"]
    assert (first["dag_id"], first["run_id"], first["task_id"], first["map_index"], first["release_name"]) == (
        "d", "r1", "t", -1, "r")
    assert first["state"] == "committed" and first["attempt"] == 1
    assert dt.datetime.fromisoformat(first["created_at"]).tzinfo is not None


@pytest.mark.parametrize(
    "filters",
    [
        pytest.param({"dag_id": "e"}, id="dag"),
        pytest.param({"state": "committed"}, id="state"),
        pytest.param({"dag_id": "d", "state": "committed"}, id="dag and state"),
        pytest.param({"state": "released"}, id="released"),
    ],
)
def test_charges_filters_match_ledger_history(small, filters):
    page = queries.account_charges(small, "a", **filters)
    expected = [c["id"] for c in small.charges(account="a", **filters)]
    assert [c["id"] for c in page["charges"]] == expected
    assert page["total"] == len(expected) and page["next_after"] is None


def test_charges_time_window(small):
    charges = list(small.charges(account="a"))
    middle = charges[2]["created_at"]
    since = queries.account_charges(small, "a", since=middle)
    until = queries.account_charges(small, "a", until=middle)
    assert [c["id"] for c in since["charges"]] == [c["id"] for c in small.charges(account="a", since=middle)]
    assert since["total"] + until["total"] == 6
    # an aware time in another zone means the same instant
    shifted = utc(middle).astimezone(dt.timezone(dt.timedelta(hours=5)))
    assert queries.account_charges(small, "a", since=shifted)["total"] == since["total"]


def test_charges_refusals(small):
    assert queries.account_charges(small, "nope") is None
    with pytest.raises(ValueError, match="unknown charge state 'spent'"):
        queries.account_charges(small, "a", state="spent")
    with pytest.raises(ValueError, match="limit"):
        queries.account_charges(small, "a", limit=0)


def test_release_detail_values_and_intervals(small):
    first = next(iter(small.charges(account="a")))
    release = queries.release_detail(small, first["id"])
    assert release["state"] == "committed" and release["output"] == OUTPUT
    assert release["output_digest"] == first["output_digest"]
    by_name = {a["name"]: a for a in release["aggregates"]}
    assert by_name["by_sex"]["values"] == [
        {"key": {"sex": "F"}, "value": 10, "half_width": 3.0, "lower": 7.0, "upper": 13.0, "saturated": False},
        {"key": {"sex": "M"}, "value": 12, "half_width": 3.0, "lower": 9.0, "upper": 15.0, "saturated": False},
    ]
    assert by_name["total"]["values"] == [
        {"key": {}, "value": 22, "half_width": 1.5, "lower": 20.5, "upper": 23.5, "saturated": False}]
    assert by_name["capped"]["values"][0]["upper"] is None and by_name["capped"]["values"][0]["saturated"]
    assert by_name["large"]["rows_file"] == OUTPUT["aggregates"]["large"]["rows_file"]
    assert "values" not in by_name["large"] and by_name["by_sex"]["confidence"] == 0.95


def test_release_detail_lists_the_first_values_up_to_a_limit(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", epsilon="10", dags=("d",)))
    output = {"release": "r", "confidence": 0.9, "aggregates": {
        "many": {"kind": "count", "group_by": ["k"],
                 "rows": [{"k": f"k{i}", "value": i, "half_width": 1.0} for i in range(5)]},
        "one": {"kind": "sum", "group_by": [], "value": 7, "half_width": 0.5},
        "file": {"kind": "count", "group_by": ["k"], "rows_file": {"uri": "file:///r", "rows": 9}},
    }}
    ledger.commit(reserve(ledger, "r1", "1/3", account="a"), output)
    charge = next(iter(ledger.charges(account="a")))["id"]
    whole = queries.release_detail(ledger, charge)
    assert whole["output"] == output and whole["output_complete"] is True
    # in the stored order (the ledger stores canonical JSON: keys sorted)
    assert [(a["name"], len(a.get("values", [])), a.get("values_total")) for a in whole["aggregates"]] == [
        ("file", 0, None), ("many", 5, 5), ("one", 1, 1)]
    cut = queries.release_detail(ledger, charge, limit=2)
    many = cut["aggregates"][1]
    assert [v["key"]["k"] for v in many["values"]] == ["k0", "k1"] and many["values_total"] == 5
    assert cut["output_complete"] is False
    # the output's rows cut the same way; everything else as stored
    assert cut["output"] == {**output, "aggregates": {**output["aggregates"], "many": {
        **output["aggregates"]["many"], "rows": output["aggregates"]["many"]["rows"][:2]}}}
    assert queries.release_detail(ledger, charge, limit=5)["output"] == output
    assert queries.release_detail(ledger, charge, limit=queries.MAX_RELEASE_VALUES)["output_complete"] is True
    for bad in (0, queries.MAX_RELEASE_VALUES + 1):
        with pytest.raises(ValueError, match="limit must be between 1 and 10000"):
            queries.release_detail(ledger, charge, limit=bad)


@pytest.mark.parametrize(
    "row, lower, upper",
    [
        pytest.param({"value": 10**400, "half_width": 1.5}, None, None, id="an integer beyond the doubles"),
        pytest.param({"value": 1.7e308, "half_width": 1e308}, "below", None, id="only the upper bound overflows"),
        pytest.param({"value": -1.7e308, "half_width": 1e308}, None, "above", id="only the lower bound overflows"),
        pytest.param({"value": 2**53 + 1, "half_width": 0.5}, 9007199254740992.0, 9007199254740994.0,
                     id="an exact integer above 2^53: bounds rounded outwards"),
        pytest.param({"value": "12", "half_width": 1.5}, None, None, id="a value that is no number"),
        pytest.param({"value": True, "half_width": 1.5}, None, None, id="a boolean value"),
        pytest.param({"value": 3}, None, None, id="no half-width"),
        pytest.param({"value": 3, "interval": [1, 10**400]}, 1, 10**400, id="a stored interval, kept as stored"),
        pytest.param({"value": 3, "interval": "wide"}, None, None, id="an interval that is not a pair"),
    ],
)
def test_published_values_beyond_the_doubles_or_of_no_number_have_open_bounds(ledger_url, row, lower, upper):
    """A spender can commit any plain finite JSON: the value is kept as stored, a bound that cannot be computed as
    a double is None (open); a bound that can is the one published_interval gives."""
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", epsilon="10", dags=("d",)))
    ledger.commit(reserve(ledger, "r1", "1/3", account="a"),
                  {"aggregates": {"x": {"kind": "sum", "group_by": [], **row}}})
    charge = next(iter(ledger.charges(account="a")))["id"]
    [value] = queries.release_detail(ledger, charge)["aggregates"][0]["values"]
    assert value["value"] == row["value"] and type(value["value"]) is type(row["value"])
    # "below"/"above": the double next to the exact value -+ half-width, on the outer side (rounded outwards)
    exact = {"below": Fraction(row["value"]) - Fraction(row.get("half_width", 0)),
             "above": Fraction(row["value"]) + Fraction(row.get("half_width", 0))}
    if lower == "below":
        assert Fraction(value["lower"]) <= exact["below"] < Fraction(math.nextafter(value["lower"], math.inf))
        lower = value["lower"]
    if upper == "above":
        assert Fraction(math.nextafter(value["upper"], -math.inf)) < exact["above"] <= Fraction(value["upper"])
        upper = value["upper"]
    assert (value["lower"], value["upper"]) == (lower, upper)


def test_a_release_of_any_shape_has_a_detail(ledger_url):
    """Outputs no release engine writes (rows that are no list or no dicts, a group-by that is no list) still give
    a detail: what can be read is, the rest is empty."""
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", epsilon="10", dags=("d",)))
    odd = {"confidence": "high", "aggregates": {
        "rows_not_a_list": {"group_by": ["k"], "rows": 5},
        "rows_not_dicts": {"group_by": ["k", 7, None], "rows": [3, {"k": "a", "value": 1, "half_width": 1}]},
        "group_by_a_string": {"group_by": "k", "rows": [{"k": "a", "value": 1, "half_width": 1}]},
        "not_a_dict": [1, 2],
    }}
    ledger.commit(reserve(ledger, "r1", "1/3", account="a"), odd)
    charge = next(iter(ledger.charges(account="a")))["id"]
    detail = queries.release_detail(ledger, charge)
    assert detail["output"] == odd
    by_name = {a["name"]: a for a in detail["aggregates"]}
    assert by_name["rows_not_a_list"]["values"] == [] and by_name["not_a_dict"]["values"] == []
    assert [v["value"] for v in by_name["rows_not_dicts"]["values"]] == [None, 1]
    assert by_name["rows_not_dicts"]["group_by"] == ["k"] and by_name["group_by_a_string"]["group_by"] == []
    assert queries.release_detail(ledger, charge, limit=1)["output"]["aggregates"]["rows_not_dicts"]["rows"] == [3]


def test_release_detail_of_uncommitted_and_unknown_charges(small):
    released = next(iter(small.charges(account="a", state="released")))
    detail = queries.release_detail(small, released["id"])
    assert detail["state"] == "released" and detail["output"] is None and detail["aggregates"] == []
    assert queries.release_detail(small, 10**9) is None


def test_engine_and_url_are_accepted_and_nothing_is_written(small):
    before = _row_counts(small.engine)
    by_engine = queries.accounts_overview(small.engine)
    by_url = queries.account_charges(small.url if "sqlite" in small.url else
                                     small.engine.url.render_as_string(hide_password=False), "a")
    assert by_engine == queries.accounts_overview(small)
    assert by_url["total"] == 6
    assert _row_counts(small.engine) == before


def _row_counts(engine) -> tuple:
    with engine.connect() as conn:
        return tuple(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
                     for t in (schema.accounts, schema.charges, schema.audit_events))


def test_uninitialised_ledger_is_refused(tmp_path):
    with pytest.raises(LedgerNotInitialisedError):
        queries.accounts_overview(f"sqlite:///{tmp_path / 'empty.db'}")


def test_make_ledger_example_account(tmp_path):
    ledger = make_ledger(tmp_path / "ledger.db")
    reservation = ledger.reserve(key("r1", "adult_census_release"), account="census_adult",
                                 amount=Fraction(1, 100), mechanisms=MECHANISMS, spec_hash="0" * 64)
    ledger.commit(reservation, OUTPUT)
    row = queries.accounts_overview(ledger)[0]
    status = ledger.account("census_adult")
    assert row["spent"] == str(status.spent) and row["spent_epsilon"] == status.as_epsilon(status.spent)
    assert row["delta"] == "1/1000000" and row["unit"] == "rho"


@pytest.mark.parametrize(
    "run_id",
    [
        pytest.param("manual__2026-01-01T00:00:00+00:00", id="colons and plus"),
        pytest.param("a/b %2F <script>é", id="slash, percent, markup, unicode"),
    ],
)
def test_run_charges_are_the_runs_charges_in_every_account(ledger_url, run_id):
    ledger = ledger_with(
        ledger_url,
        a=account_config("pure_dp", epsilon="10", dags=("d", "e")),
        z=account_config("zcdp", cap="1/2", delta="1e-6", dags=("d",)),
    )
    first = reserve(ledger, run_id, "1/3")
    ledger.commit(first, {"run": run_id})
    other_task = ReleaseKey("d", run_id, "t2", -1, "r")
    ledger.abandon(ledger.reserve(other_task, account="z", amount=Fraction(1, 30), mechanisms=MECHANISMS,
                                  spec_hash="0" * 64))
    reserve(ledger, run_id + "x", "1/5")  # another run whose id starts with this one's
    reserve(ledger, run_id, "1/7", dag="e")  # the same run id in another DAG

    page = queries.run_charges(ledger, "d", run_id)
    assert page["total"] == 2 and [c["account"] for c in page["charges"]] == ["a", "z"]
    assert [c["state"] for c in page["charges"]] == ["committed", "abandoned"]
    assert {c["run_id"] for c in page["charges"]} == {run_id}
    assert page["charges"][0]["amount"] == "1/3" and page["charges"][0]["id"] == first.charge_id
    # each charge in its own account's unit, and the run's units listed for the table's header
    assert [c["unit"] for c in page["charges"]] == ["epsilon", "rho"] and page["units"] == ["epsilon", "rho"]
    assert queries.run_charges(ledger, "d", "no-such-run") == {
        "dag_id": "d", "run_id": "no-such-run", "units": [], "charges": [], "total": 0, "limit": queries.MAX_PAGE
    }
    limited = queries.run_charges(ledger, "d", run_id, limit=1)
    assert limited["total"] == 2 and len(limited["charges"]) == 1
    with pytest.raises(ValueError, match="limit must be between 1 and 500"):
        queries.run_charges(ledger, "d", run_id, limit=0)
