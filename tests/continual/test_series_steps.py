"""A series released step by step through the ledger (dp_operators.continual.run), on SQLite and PostgreSQL: one
charge for the whole series, one committed measurement per step, exact totals, replays, and the refusals of a run
that is not the next step."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
import datetime as dt
import time
from fractions import Fraction

import numpy as np
import pytest

from dp_operators.continual.run import (
    STATE_FIELD,
    SeriesOrderError,
    StepRun,
    committed_steps,
    noise_of,
    redraw_charge,
    run_series_step,
    series_id,
    series_start,
    step_key,
)
from dp_operators.continual.plan import plan_spec_series
from dp_operators.continual.state import SeriesKey, SeriesKeyError, open_sealed
from dp_operators.operators.series_upstream import series_totals
from dp_operators.ledger import BudgetExhaustedError, LeaseHeldError, Reservation, ReleaseKey
from dp_operators.release import ReleaseConfigError, ReleaseInputError
from dp_operators.spec import parse_spec
from ledger_backends import account_config, ledger_url, ledger_with, pg_database  # noqa: F401  (fixtures)
from support import governor, spender

KEY = SeriesKey(bytes(range(32)))
BASE = ReleaseKey("d", "unused", "release", -1, "daily_flights")
DAY = dt.timedelta(days=1)
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)


def spec(horizon: int = 8, after: str = "refuse", mechanism: str = "auto", kind: str = "count", grid: str = "1"):
    bounds = f", bounds: [0, 10], grid: {grid}" if kind == "sum" else ""
    return parse_spec(
        "version: 1\nrelease: daily_flights\nbudget_account: a\nprivacy_unit: person\n"
        f"series: {{horizon: {horizon}, after_horizon: {after}, mechanism: {mechanism}}}\n"
        f"aggregates:\n  - {{name: flights, kind: {kind}, group_by: [origin], keys: {{origin: [EWR, JFK, LGA]}}, "
        f"mechanism: auto, budget: {{rho: 1}}{bounds}}}\n", source="s.yaml")


def day(index: int) -> StepRun:
    return StepRun(f"scheduled__{(START + index * DAY).date()}", START + index * DAY, START + (index + 1) * DAY)


def totals(index: int) -> dict:
    """Running totals through day ``index``: EWR grows by 10 a day, JFK by 3, LGA stays 0."""
    return {"flights": [{"origin": "EWR", "count": 10 * (index + 1)}, {"origin": "JFK", "count": 3 * (index + 1)}]}


def step(ledger, index: int, the_spec=None, key: SeriesKey | None = KEY, run: StepRun | None = None):
    return run_series_step(the_spec or spec(), lambda: totals(index), ledger, BASE, run or day(index),
                           series_key=key, spec_hash="0" * 64)


@pytest.fixture
def ledger(ledger_url):
    return ledger_with(ledger_url, a=account_config("zcdp", cap=3))


def test_the_series_is_charged_once_and_each_step_commits_one_measurement(ledger):
    outputs = [step(ledger, index).output for index in range(8)]
    assert ledger.account("a").spent == 1  # rho 1 at step 0, nothing after
    assert [o["series"]["step"] for o in outputs] == list(range(8))
    assert all(STATE_FIELD not in o for o in outputs)  # the sealed state is never published
    charges = list(ledger.charges())
    assert sorted(c["run_id"] for c in charges) == [step_key(BASE, 0, i).run_id for i in range(8)]
    assert [Fraction(c["amount"]) for c in sorted(charges, key=lambda c: c["run_id"])] == [1] + [0] * 7
    assert governor(ledger.url).verify().ok


def test_each_published_total_is_the_true_total_plus_the_exact_decoded_noise(ledger):
    the_spec = spec()
    for index in range(8):
        step(ledger, index, the_spec)
    steps = committed_steps(ledger, BASE, "a").steps
    (noise,) = noise_of(plan_spec_series(the_spec)).values()
    sid = series_id("a", BASE, 0)
    flat = [open_sealed(KEY, sid, i, s["series"]["attempt"], base64.b64decode(s[STATE_FIELD]["sealed"]))
            for i, s in enumerate(steps)]
    width = [len(noise.measurements_at(i)) for i in range(8)]
    for index, output in enumerate(steps):
        for cell, row in enumerate(output["aggregates"]["flights"]["rows"]):
            history = [flat[i][cell * width[i]:(cell + 1) * width[i]] for i in range(index + 1)]
            true = [10, 3, 0][cell] * (index + 1)
            assert row["value"] == float(true + noise.total_noise(history))
            assert row["half_width"] == noise.half_width(index, 0.95)


def test_a_second_run_of_a_committed_step_replays_it_without_reading_data_or_charging(ledger):
    first = step(ledger, 0).output
    step(ledger, 1)
    again = run_series_step(spec(), lambda: pytest.fail("a replay reads no data"), ledger, BASE, day(0),
                            series_key=None, spec_hash="0" * 64)
    assert again.replayed and again.output == first
    assert ledger.account("a").spent == 1


@pytest.mark.parametrize(("runs", "message"), [
    pytest.param([0, 2], "leaves a gap after step 0", id="a missing day"),
    pytest.param([1, 0], "is not after step 0", id="an earlier day after a later one"),
])
def test_a_run_that_is_not_the_next_step_is_refused_before_anything_is_read_or_charged(ledger, runs, message):
    step(ledger, runs[0])
    with pytest.raises(SeriesOrderError, match=message):
        run_series_step(spec(), lambda: pytest.fail("read"), ledger, BASE, day(runs[1]), series_key=KEY,
                        spec_hash="0" * 64)
    assert ledger.account("a").spent == 1 and len(list(ledger.charges())) == 1


def test_past_the_horizon_the_series_refuses(ledger):
    for index in range(2):
        step(ledger, index, spec(horizon=2))
    with pytest.raises(SeriesOrderError, match="released all its 2 steps"):
        step(ledger, 2, spec(horizon=2))
    assert ledger.account("a").spent == 1


def renewing_step(ledger, index: int, the_spec, counted_from: dt.datetime | None = None):
    """A step whose upstream says where its totals count from (required when the spec may start a new series)."""
    since = counted_from or series_start(the_spec, ledger, BASE, day(index))
    return run_series_step(the_spec, lambda: series_totals(totals(index), since), ledger, BASE, day(index),
                           series_key=KEY, spec_hash="0" * 64)


def test_after_the_horizon_a_new_series_starts_where_the_last_one_ended_charged_again(ledger):
    renewing = spec(horizon=2, after="new_series")
    for index in range(2):
        renewing_step(ledger, index, renewing)
    assert series_start(renewing, ledger, BASE, day(2)) == START + 2 * DAY  # the new series counts from its first day
    with pytest.raises(SeriesOrderError, match="leaves a gap after step 1"):
        renewing_step(ledger, 3, renewing, counted_from=START)  # no day skipped at the boundary
    renewed = renewing_step(ledger, 2, renewing).output
    assert (renewed["series"]["generation"], renewed["series"]["step"]) == (1, 0)
    assert renewed["series"]["counted_from"] == (START + 2 * DAY).isoformat()
    assert series_start(renewing, ledger, BASE, day(3)) == START + 2 * DAY
    assert series_start(renewing, ledger, BASE, day(1)) == START  # a replayed step: its own series' start
    assert ledger.account("a").spent == 2


@pytest.mark.parametrize("declared", [None, START], ids=["not declared", "the first series' start"])
def test_a_new_series_whose_upstream_does_not_count_from_its_start_is_refused_before_any_charge(ledger, declared):
    """Totals carried over from the first series would put every unit's earlier contributions in the new series'
    first step: the upstream must declare where it counts from, and it must be the new series' start."""
    renewing = spec(horizon=2, after="new_series")
    for index in range(2):
        renewing_step(ledger, index, renewing)
    upstream = totals(2) if declared is None else series_totals(totals(2), declared)
    with pytest.raises(ReleaseInputError, match="count from|counts from"):
        run_series_step(renewing, lambda: upstream, ledger, BASE, day(2), series_key=KEY, spec_hash="0" * 64)
    assert ledger.account("a").spent == 1


@pytest.mark.parametrize("key", [None, SeriesKey(bytes(32))], ids=["no key", "another key"])
def test_a_worker_without_the_series_key_fails_before_reading_or_charging(ledger, key):
    step(ledger, 0)
    with pytest.raises(SeriesKeyError):
        run_series_step(spec(), lambda: pytest.fail("read"), ledger, BASE, day(1), series_key=key,
                        spec_hash="0" * 64)
    assert len(list(ledger.charges())) == 1


def test_a_step_taken_over_after_a_dead_attempt_pays_its_redraw_and_commits_once(ledger_url):
    ledger_with(ledger_url, a=account_config("zcdp", cap=3))
    step(spender(ledger_url), 0)
    dying = spender(ledger_url, lease_seconds=0.3)
    dead = dying.reserve(step_key(BASE, 0, 1), account="a", amount=0, takeover_amount=1, mechanisms=[],
                         spec_hash="0" * 64)
    assert isinstance(dead, Reservation)  # the attempt dies here, after its reservation (noise maybe drawn)
    live = spender(ledger_url)
    with pytest.raises(LeaseHeldError):
        step(live, 1)  # a second live try of the step waits, charged nothing
    time.sleep(0.5)
    output = step(live, 1).output
    assert output["series"]["attempt"] == 2
    assert live.account("a").spent == 1 + redraw_charge(plan_spec_series(spec()))
    assert [c["state"] for c in live.charges() if c["run_id"].endswith("000001")] == ["abandoned", "committed"]
    assert step(live, 2).output["series"]["step"] == 2  # the series goes on from the committed attempt's state


def test_a_series_sum_off_grid_1_is_refused_before_anything_is_charged(ledger):
    with pytest.raises(ReleaseConfigError, match="released on grid 1, with integer bounds"):
        step(ledger, 0, spec(kind="sum", grid="0.5"))
    assert list(ledger.charges()) == []


def test_a_series_sum_publishes_the_integer_running_sum_plus_its_exact_noise(ledger):
    sums = spec(kind="sum")
    for index in range(3):
        published = run_series_step(
            sums, lambda index=index: {"flights": [{"origin": "EWR", "sum": 7 * (index + 1)},
                                                   {"origin": "JFK", "sum": np.int64(2)}]},
            ledger, BASE, day(index), series_key=KEY, spec_hash="0" * 64).output
    ewr = published["aggregates"]["flights"]["rows"][0]
    assert published["aggregates"]["flights"]["kind"] == "sum"
    assert abs(ewr["value"] - 21) < 4 * ewr["half_width"]
    assert ledger.account("a").spent == 1


@pytest.mark.parametrize("value", [21.0, Decimal(21), Fraction(21), "21", True],
                         ids=["float", "Decimal", "Fraction", "str", "bool"])
def test_a_series_sum_that_is_not_an_integer_by_type_is_refused_before_anything_is_charged(ledger, value):
    with pytest.raises(ReleaseInputError, match="not an integer|holds a"):
        run_series_step(spec(kind="sum"), lambda: {"flights": [{"origin": "EWR", "sum": value}]}, ledger, BASE,
                        day(0), series_key=KEY, spec_hash="0" * 64)
    assert list(ledger.charges()) == []


def test_ledger_show_lists_each_series_with_its_steps_and_charge(ledger):
    from typer.testing import CliRunner

    from dp_operators.cli import app

    for index in range(3):
        step(ledger, index)
    (entry,) = ledger.series("a")
    assert (entry["steps_committed"], entry["last_step"], entry["horizon"], entry["steps_left"], entry["charged"],
            entry["redraws"]) == (3, 2, 8, 5, 1, 0)
    shown = CliRunner().invoke(app, ["ledger", "show", "--url", ledger.url], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "Series (one charge each" in shown.output
    assert "daily_flights" in shown.output and "d / release" in shown.output
    as_json = CliRunner().invoke(app, ["ledger", "show", "--url", ledger.url, "--json"])
    (account,) = json.loads(as_json.output)
    assert account["series"][0]["steps_left"] == 5 and account["series"][0]["charged"] == "1"


def test_a_run_with_an_empty_data_interval_is_refused_naming_the_timetable_to_use(ledger):
    moment = START + DAY
    with pytest.raises(SeriesOrderError, match="CronDataIntervalTimetable"):
        step(ledger, 0, run=StepRun("scheduled__2013-01-02", moment, moment))
    assert list(ledger.charges()) == []


def test_a_new_run_of_a_released_interval_replays_its_step(ledger):
    first = step(ledger, 0).output
    step(ledger, 1)
    rerun = StepRun("manual__2026-12-06T17:00:00+00:00", START, START + DAY)  # a new run id, the same day
    again = run_series_step(spec(), lambda: pytest.fail("a replay reads no data"), ledger, BASE, rerun,
                            series_key=None, spec_hash="0" * 64)
    assert again.replayed and again.output == first and ledger.account("a").spent == 1


def test_two_live_tries_of_one_step_commit_it_once(ledger_url):
    """Two workers run the same step at the same moment: one measures it, the other waits for its lease and then
    replays it; one committed charge for the step, the series charged once."""
    import threading

    ledger_with(ledger_url, a=account_config("zcdp", cap=3))
    step(spender(ledger_url), 0)
    start = threading.Barrier(2)
    outputs: list[dict] = []

    def worker() -> None:
        ledger = spender(ledger_url)
        start.wait()
        while True:
            try:
                outputs.append(step(ledger, 1).output)
                return
            except LeaseHeldError:
                time.sleep(0.05)  # the other try holds the step: wait as the operator's reschedule does

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(outputs) == 2 and outputs[0] == outputs[1]
    charges = [c for c in spender(ledger_url).charges() if c["run_id"] == step_key(BASE, 0, 1).run_id]
    assert [c["state"] for c in charges] == ["committed"]
    assert spender(ledger_url).account("a").spent == 1


def test_a_redraw_the_cap_cannot_pay_is_refused_naming_the_redraw(ledger_url):
    ledger_with(ledger_url, a=account_config("zcdp", cap=1))
    step(spender(ledger_url), 0)
    spender(ledger_url, lease_seconds=0.3).reserve(step_key(BASE, 0, 1), account="a", amount=0, takeover_amount=1,
                                                    mechanisms=[], spec_hash="0" * 64)  # dies after drawing
    time.sleep(0.5)
    with pytest.raises(BudgetExhaustedError, match="series step 1 is measured again .* leave room for redraws"):
        step(spender(ledger_url), 1)


def test_a_total_past_the_saturation_limit_is_published_saturated(ledger, monkeypatch):
    """A total beyond 2^62 is read at the limit; a noised value within a half-width of it is flagged, with no
    half-width and an interval open on the limit's side (post-processing, as for any release). The noise is pinned
    at 0 so the noised value is the limit itself."""
    import numpy as np

    from dp_operators.continual import run as run_module

    monkeypatch.setattr(run_module, "sample_discrete_gaussian_array", lambda sigma2, size: np.zeros(size, np.int64))
    published = run_series_step(spec(), lambda: {"flights": [{"origin": "EWR", "count": 10**30}]}, ledger, BASE,
                                day(0), series_key=KEY, spec_hash="0" * 64).output
    ewr, jfk, _ = published["aggregates"]["flights"]["rows"]
    assert ewr["saturated"] is True and ewr["half_width"] is None and ewr["interval"][1] is None
    assert ewr["value"] == 2.0**62
    assert "saturated" not in jfk and jfk["half_width"] > 0
