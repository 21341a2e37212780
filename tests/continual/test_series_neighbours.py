"""A series' running totals from two neighbouring streams (one unit added at one step), handed over as every upstream
representation (float, numpy, pandas, Arrow, SQL, Parquet, Decimal, int) and summed in several orders: both
neighbours are read, or both refused with the same message (by type, never by value), and where read, the implied
increments differ at the unit's step only, by at most the plan's per-step bound. Then the whole step on both
neighbours: everything an observer sees but the noised values (refusal, charge, keys, half-widths) is the same."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow.sdk.exceptions import AirflowFailException

from dp_operators.continual.checks import check_integer_totals
from dp_operators.continual.plan import step_sensitivity_squared
from dp_operators.continual.run import StepRun, run_series_step
from dp_operators.continual.state import SeriesKey
from dp_operators.ledger import ReleaseKey
from dp_operators.release.errors import ReleaseConfigError, ReleaseInputError
from dp_operators.release.inputs import prepare_inputs
from dp_operators.spec import parse_spec
from ledger_backends import account_config, ledger_with
from neighbour_harness import SUMMATION_ORDERS, Case, represent, upstream_rows

REPRESENTATIONS = ("float", "numpy", "pandas", "arrow", "sql", "parquet", "decimal", "int")
STEPS = 5
#: the unit the neighbour adds: one row at step 2 (k = 1), its value at the sum's bound
ADDED_STEP, ADDED = 2, ("x", 5)
#: per step, the rows that step adds (key, value): one near 2^52, where a float running sum rounds
ROWS_BY_STEP = [[("x", 2), ("y", 3)], [("x", 4)], [("y", 1), ("y", 5)], [("x", 2**52 - 3)], [("y", 0)]]


def spec(kind: str):
    bounds = ", bounds: [0, 5]" if kind == "sum" else ""
    return parse_spec(
        "version: 1\nrelease: r\nbudget_account: a\nprivacy_unit: person\nseries: {horizon: 8}\n"
        f"aggregates:\n  - {{name: a, kind: {kind}, group_by: [g], keys: {{g: [x, y]}}, mechanism: auto, "
        f"budget: {{rho: 1}}{bounds}}}\n", source="s.yaml")


def running_rows(step: int, neighbour: bool) -> list[tuple[str, int]]:
    rows = [row for added in ROWS_BY_STEP[:step + 1] for row in added]
    return rows + [ADDED] if neighbour and step >= ADDED_STEP else rows


def reading(the_spec, rows, representation: str, order: str, tmp_path):
    """What the series step makes of one step's running totals before anything is charged."""
    case = Case(the_spec, rows, rows)
    exact = representation in ("decimal", "int")
    values = [(k, __import__("decimal").Decimal(v) if representation == "decimal" else v) for k, v in rows]
    try:
        aggregates = represent(case, upstream_rows(case, values, order, exact=exact), representation, tmp_path)
    except AirflowFailException as refusal:  # the file or SQL source refuses first, by the column's type
        return "refused", f"{type(refusal).__name__}: {refusal}"
    try:
        check_integer_totals(the_spec, aggregates)
        prepared = prepare_inputs(the_spec, aggregates)
    except (ReleaseInputError, ReleaseConfigError) as refusal:
        return "refused", f"{type(refusal).__name__}: {refusal}"
    vector = prepared.values[("a", the_spec.aggregates[0].kind)].tolist()
    return "read", dict(zip(("x", "y"), vector))


@pytest.mark.parametrize("kind", ["count", "sum"])
@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_neighbouring_streams_are_refused_alike_or_differ_at_the_units_step_only(kind, representation, tmp_path):
    the_spec = spec(kind)
    bound = step_sensitivity_squared(the_spec, the_spec.aggregates[0])
    for order in ("left to right", "reversed", "chunked"):
        assert order in SUMMATION_ORDERS
        outcomes = [[reading(the_spec, running_rows(step, neighbour), representation, order, tmp_path)
                     for step in range(STEPS)] for neighbour in (False, True)]
        for base, other in zip(*outcomes):
            assert base[0] == other[0] and (base[0] == "read" or base[1] == other[1]), (order, base, other)
        # the harness counts rows as integers in every representation; it sums values as floats in float, numpy,
        # pandas, Arrow, SQL and Parquet (in the order given), as Decimal in decimal, exactly only in int
        integers = kind == "count" or representation == "int"
        assert (outcomes[0][0][0] == "read") == integers, (representation, order, outcomes[0][0])  # by type
        if outcomes[0][0][0] == "refused":
            assert "not an integer" in outcomes[0][0][1] or "a binary float" in outcomes[0][0][1]
            continue
        totals = [[reading[1] for reading in stream] for stream in outcomes]
        for step in range(STEPS):
            gaps = {key: (totals[1][step][key] - (totals[1][step - 1][key] if step else 0))
                    - (totals[0][step][key] - (totals[0][step - 1][key] if step else 0)) for key in ("x", "y")}
            if step == ADDED_STEP:
                assert sum(gap * gap for gap in gaps.values()) <= bound and any(gaps.values())
            else:
                assert not any(gaps.values()), (representation, order, step, gaps)


def test_a_whole_step_on_neighbouring_streams_shows_an_observer_the_same_but_its_values(tmp_path):
    """Charge, refusal, keys, half-widths and series block are the same on both neighbours; and a float stream
    is refused on both before anything is charged."""
    the_spec = spec("count")
    seen = []
    for neighbour in (False, True):
        ledger = ledger_with(f"sqlite:///{tmp_path / f'ledger-{neighbour}.db'}", a=account_config("zcdp", cap=2,
                                                                                                  dags=("d",)))
        day = dt.datetime(2013, 1, 1, tzinfo=dt.timezone.utc)
        outputs = []
        for step in range(STEPS):
            counts = {}
            for key, _ in running_rows(step, neighbour):
                counts[key] = counts.get(key, 0) + 1
            rows = [{"g": key, "count": count} for key, count in counts.items()]
            run = StepRun(f"scheduled__{step}", day + dt.timedelta(days=step), day + dt.timedelta(days=step + 1))
            output = run_series_step(the_spec, lambda rows=rows: {"a": rows}, ledger, ReleaseKey("d", "x", "t", -1, "r"),
                                     run, series_key=SeriesKey(bytes(32)), spec_hash="0" * 64).output
            for row in output["aggregates"]["a"]["rows"]:
                row.pop("value")
            output.pop("released_at")
            outputs.append(output)
        with pytest.raises(ReleaseInputError, match="not an integer"):
            run_series_step(the_spec, lambda: {"a": [{"g": "x", "count": 3.0}]}, ledger,
                            ReleaseKey("d", "x", "t", -1, "r"), StepRun("late", day + dt.timedelta(days=STEPS),
                                                                        day + dt.timedelta(days=STEPS + 1)),
                            series_key=SeriesKey(bytes(32)), spec_hash="0" * 64)
        charges = [{field: c[field] for field in ("run_id", "attempt", "state", "amount", "mechanisms")}
                   for c in ledger.charges()]
        seen.append((outputs, charges, ledger.account("a").spent))
    assert seen[0] == seen[1]
