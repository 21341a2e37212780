"""A privacy officer's check of a series with its key: every committed step's sealed noise opens, and every
published total is a whole running total plus the exact noise decoded from the sealed draws (ADR 33, "Verify").

``dpctl ledger verify`` proves the ledger's chain without the series key; with it (``--series-key-file``) this module
also shows that each published value was computed from the noise the ledger holds for it: ``value - (B z)_t`` is an
integer (the true running total, read exactly: counts and grid-1 sums) up to the one rounding of the value to a
float. A step published from other noise, or edited after its commit with a forged digest, fails it. The check
learns the true totals, so it runs where the series key may be: the officer's machine, never the dashboard.
"""

from __future__ import annotations

import base64
import math
from fractions import Fraction
from typing import Any

from dp_operators.continual.noise import SeriesNoise
from dp_operators.continual.plan import Candidate, strategy_of
from dp_operators.continual.state import SeriesKey, SeriesKeyError, open_sealed
from dp_operators.continual.steps import series_id, step_key
from dp_operators.ledger import ReleaseKey
from dp_operators.ledger.store import SERIES_STATE_FIELD, LedgerBase


def _noise_of(described: dict[str, Any]) -> SeriesNoise:
    horizon = described["horizon"]
    candidate = Candidate(described["mechanism"], Fraction(described["sensitivity_squared"]),
                          Fraction(described["noise_variance"]), 0.0, 0.0)
    return SeriesNoise(strategy_of(described["mechanism"], horizon), candidate)


def audit_series(ledger: LedgerBase, key: SeriesKey, account: str | None = None) -> tuple[int, list[str]]:
    """Check every committed step of every series (on ``account``, or all) against its sealed noise.

    Returns:
        ``(steps checked, problems)``: one line per problem, naming the series, the step and what failed (never a
        true total or a draw).
    """
    problems: list[str] = []
    checked = 0
    for series in ledger.series(account):
        base = ReleaseKey(series["dag_id"], "", series["task_id"], series["map_index"], series["release_name"])
        sid = series_id(series["account"], base, series["generation"])
        history: dict[tuple[str, int], list[list[int]]] = {}
        for step in range(series["steps_committed"]):
            where = f"series {sid!r} step {step}"
            output = ledger.stored_output(step_key(base, series["generation"], step), series["account"])
            if output is None:
                problems.append(f"{where}: no committed output (the steps are not 0 to {series['steps_committed'] - 1})")
                break
            try:
                # the draws are sealed in the spec's aggregate order, which the mechanisms keep (the aggregates'
                # mapping is stored with sorted keys)
                noises = {d["aggregate"]: _noise_of(d) for d in output["mechanisms"] if d.get("kind") == "series_step"}
                state = output[SERIES_STATE_FIELD]
                draws = open_sealed(key, sid, step, output["series"]["attempt"], base64.b64decode(state["sealed"]))
            except SeriesKeyError as error:
                problems.append(f"{where}: {error}")
                break
            except (KeyError, TypeError, ValueError) as error:
                problems.append(f"{where}: not a series step's output ({type(error).__name__}: {error})")
                break
            position, wrong = 0, 0
            for name, noise in noises.items():
                aggregate = output["aggregates"].get(name)
                if aggregate is None:
                    problems.append(f"{where}: series mechanism of {name!r} has no published aggregate")
                    continue
                width = len(noise.measurements_at(step))
                for cell, row in enumerate(aggregate["rows"]):
                    cell_history = history.setdefault((name, cell), [])
                    cell_history.append(draws[position:position + width])
                    position += width
                    if row.get("saturated"):
                        continue
                    value = row["value"]
                    remainder = Fraction(value) - noise.total_noise(cell_history)
                    if abs(remainder - round(remainder)) > Fraction(math.ulp(value)) or (
                            aggregate["kind"] == "count" and round(remainder) < 0):
                        wrong += 1
            if position != len(draws):
                problems.append(f"{where}: the sealed state holds {len(draws)} draws, the output's cells {position}")
            if wrong:
                problems.append(f"{where}: {wrong} published value(s) are not a whole running total plus the noise "
                                "sealed for them")
            checked += 1
    return checked, problems
