"""A step interrupted after its reservation (a task timeout, SIGTERM: BaseExceptions that run_series_step re-raises
as they are) leaves its traceback to Airflow's task runner and to error reporters, which capture frame locals
(Sentry's include_local_variables, on by default; ADR 33 counts "an error reporter capturing frames" as a way an
output is observed). A single release exposes that step's aggregates there; a series step would expose the opened
draws of every earlier step, which with the published totals give every earlier true total exactly. The frames of
an interrupted step must not hold the earlier steps' draws once the exception leaves run_series_step."""

from __future__ import annotations

import base64
import datetime as dt

import pytest

import dp_operators.continual.run as run_module
from dp_operators.continual.run import STATE_FIELD, StepRun, committed_steps, run_series_step, series_id
from dp_operators.continual.state import SeriesKey, open_sealed
from dp_operators.ledger import ReleaseKey
from dp_operators.spec import parse_spec
from ledger_backends import account_config, ledger_url, ledger_with, pg_database  # noqa: F401  (fixtures)

KEY = SeriesKey(bytes(range(32)))
BASE = ReleaseKey("d", "unused", "release", -1, "daily_flights")
START = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)
SPEC = parse_spec(
    "version: 1\nrelease: daily_flights\nbudget_account: a\nprivacy_unit: person\nseries: {horizon: 8}\n"
    "aggregates:\n  - {name: flights, kind: count, group_by: [origin], keys: {origin: [EWR, JFK]}, "
    "mechanism: auto, budget: {rho: 1}}\n", source="s.yaml")


class TaskTimeout(BaseException):
    """Stands for Airflow's AirflowTaskTimeout, a BaseException raised wherever the task happens to be."""


def day(index: int) -> StepRun:
    return StepRun(f"scheduled__{(START + index * DAY).date()}", START + index * DAY, START + (index + 1) * DAY)


def _frame_text(error: BaseException) -> str:
    texts, tb = [], error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != __file__:  # the engine's frames, not this test's (it holds `earlier`)
            texts += [repr(value) for value in tb.tb_frame.f_locals.values()]
        tb = tb.tb_next
    return "\n".join(texts)


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_a_step_interrupted_while_drawing_leaves_no_earlier_draws_in_its_frames(ledger_url, monkeypatch):
    ledger = ledger_with(ledger_url, a=account_config("zcdp", cap=3))
    for index in range(3):
        run_series_step(SPEC, lambda index=index: {"flights": [{"origin": "EWR", "count": 10 * (index + 1)}]},
                        ledger, BASE, day(index), series_key=KEY, spec_hash="0" * 64)
    sid = series_id("a", BASE, 0)
    earlier = [draw for index, step in enumerate(committed_steps(ledger, BASE, "a").steps)
               for draw in open_sealed(KEY, sid, index, step["series"]["attempt"],
                                       base64.b64decode(step[STATE_FIELD]["sealed"]))]

    def interrupted(sigma2, size):
        raise TaskTimeout()

    monkeypatch.setattr(run_module, "sample_discrete_gaussian_array", interrupted)
    with pytest.raises(TaskTimeout) as caught:
        run_series_step(SPEC, lambda: {"flights": [{"origin": "EWR", "count": 40}]}, ledger, BASE, day(3),
                        series_key=KEY, spec_hash="0" * 64)
    text = _frame_text(caught.value)
    shown = [draw for draw in earlier if str(draw) in text]
    assert not shown, f"{len(shown)} of the {len(earlier)} earlier draws are in the interrupted step's frames"
