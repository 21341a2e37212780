"""What an observer sees must not depend on one person beyond the noised values (DESIGN.md 2.8).

Each case runs the engine on two neighbouring inputs (``base`` and ``base`` plus one privacy unit) with the same
spec and a fresh ledger each, and compares everything an observer can see except the noised values: every log record
of every logger at DEBUG, the exception text if the release is refused, the published output with its noised parts
removed, and every ledger row (charges and audit events) with its volatile fields (timestamps, ids, hashes, pids,
output digests) removed. The added person is the awkward one: outside the public key domain, NaN, infinite, ``None``,
beyond the bounds, holding a key nobody else holds, or a Decimal. A negative control shows the comparison catches a
data-derived log line.
"""

from __future__ import annotations

import json
import logging
import math
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from dp_operators.ledger import ReleaseKey
from dp_operators.release import run_release
from dp_operators.spec import parse_spec

from support import make_ledger

NOISED = {"value", "half_width", "saturated", "released_at", "interval"}
VOLATILE = {"id", "created_at", "row_hash", "prev_hash", "output_digest", "context", "charge_id", "updated_at",
            "token_hash", "proof", "lease_expires_at"}  # tokens: random; times: see "Timing" in docs/ledger.md


def spec_text(aggregate: dict, accountant_budget: dict | None = None) -> str:
    document = {
        "version": 1,
        "release": "neighbours",
        "budget_account": "acct",
        "privacy_unit": "person",
        "aggregates": [aggregate],
    }
    return yaml.safe_dump(document, sort_keys=False)


def aggregate(kind: str, *, grouping: str, policy: dict | None = None, mechanism: str = "discrete_laplace",
              upstream: dict | None = None) -> dict:
    entry: dict[str, Any] = {"name": "a", "kind": kind, "mechanism": mechanism}
    entry["budget"] = {"epsilon": 1} if mechanism == "discrete_laplace" else {"epsilon": 1, "delta": "1e-6"}
    if kind != "count":
        entry["bounds"] = [0, 10]
    if grouping == "public":
        entry["group_by"] = ["g"]
        entry["keys"] = {"g": ["x", "y"]}
    elif grouping == "selection":
        entry["group_by"] = ["g"]
        entry["partition_selection"] = {"budget": {"epsilon": 1, "delta": "1e-6"}}
    if policy:
        entry["non_finite"] = policy
    if upstream:
        entry["upstream"] = upstream
    return entry


def row_fields(kind: str, value: Any, count: int = 1) -> dict:
    """The fields one row carries for ``kind`` (a count is its own value)."""
    if kind == "count":
        return {"count": count}
    fields = {"sum": value, "count": count}
    if kind == "variance":
        fields["sum_squares"] = value * value if value is not None and not math.isnan(value) else value
    if kind == "sum":
        fields = {"sum": value}
    return fields


def upstream(kind: str, grouping: str, rows: list[tuple[str, Any]]) -> dict:
    """Upstream aggregates from per-key rows ``(key, value)``: one row per person, never summed here (the engine
    adds rows of one key)."""
    if grouping == "none":
        total: dict[str, Any] = {}
        for _, value in rows:
            for name, number in row_fields(kind, value).items():
                if name not in total or total[name] is None or number is None:
                    total[name] = number if name not in total else None
                else:
                    total[name] += number
        return {"a": total["count"] if kind == "count" else (total["sum"] if kind == "sum" else total)}
    out = []
    for key, value in rows:
        row = {"g": key, **row_fields(kind, value)}
        if grouping == "selection" and (kind != "count"):
            row["units"] = 1
        out.append(row)
    return {"a": out}


def observe(tmp_path: Path, name: str, text: str, aggregates: dict, caplog, *, live_try: bool = False) -> dict:
    """Everything an observer sees of one release, with the noised values removed. ``live_try``: another try of the
    same release key holds a live reservation (Airflow started this try while that one still runs)."""
    ledger = make_ledger(tmp_path / f"{name}.db", cap="1000", accountant="approx_dp", dags=("dag",), account="acct")
    key = ReleaseKey(dag_id="dag", run_id="run", task_id="task", map_index=-1, release_name="neighbours")
    if live_try:
        ledger.reserve(key, account="acct", amount=Fraction(1), mechanisms=[], spec_hash="0" * 64)
    caplog.clear()
    error = None
    output = None
    with caplog.at_level(logging.DEBUG):
        try:
            output = run_release(parse_spec(text), aggregates, ledger, key, spec_hash="0" * 64).output
        except Exception as exc:  # noqa: BLE001 - the text of any refusal is part of what an observer sees
            error = re.sub(r"until \S+;", "until <lease end>;", f"{type(exc).__name__}: {exc}")
    logs = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    return {
        "logs": logs,
        "error": error,
        "output": strip(output),
        "charges": [strip(row) for row in ledger.charges()],
        "events": [strip(row) for row in ledger.events()],
    }


def strip(value: Any) -> Any:
    """``value`` without noised parts and volatile ledger fields. Under partition selection the released rows are a
    noised quantity (which keys pass the threshold, none or some), so they are not compared."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in NOISED or k in VOLATILE:
                continue
            if k == "rows" and isinstance(v, list) and "partition_selection" in value:
                continue
            if k in ("mechanisms", "details") and isinstance(v, str):
                v = json.loads(v)
            out[k] = strip(v)
        return out
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


BASE = [("x", 3), ("x", 4), ("y", 5), ("y", 6), ("y", 7)]

#: the added person: (description, key, value)
ADDED = [
    pytest.param("x", 2, id="ordinary person"),
    pytest.param("z", 2, id="key outside the public domain"),
    pytest.param("x", math.nan, id="NaN value"),
    pytest.param("x", math.inf, id="infinite value"),
    pytest.param("x", -math.inf, id="minus infinity"),
    pytest.param("x", None, id="None value (SQL NULL)"),
    pytest.param("x", 1000, id="beyond the bounds"),
    pytest.param("w", 2, id="a key nobody else holds"),
    pytest.param("x", 2**63 - 1, id="int64 max"),
]

POLICIES = [
    pytest.param({"nan": "replace", "infinity": "replace", "replace_with": 0}, id="replace"),
    pytest.param({"nan": "drop", "infinity": "drop"}, id="drop"),
    pytest.param({"nan": "replace", "infinity": "clamp"}, id="clamp"),
]


def cases():
    """Every kind x grouping x policy x added person; a count row has no value to be special, so counts take only
    the added people with an ordinary value (in or outside the domain, or holding a new key).

    ``make test`` runs a third of them, a covering array: for each kind, grouping and added person the policy whose
    index is the sum of their indices modulo 3. Every combination of any three of the four factors is still run (a
    count's five added people cover the three residues too); the other two policies of each are ``slow`` (ADR 30)."""
    for k, kind in enumerate(("count", "sum", "mean", "variance")):
        for g, grouping in enumerate(("none", "public", "selection")):
            for p, policy in enumerate(POLICIES):
                for a, added in enumerate(ADDED):
                    key, value = added.values
                    if kind == "count" and not isinstance(value, int):
                        continue
                    yield pytest.param(kind, grouping, policy.values[0], key, value,
                                       id=f"{kind}-{grouping}-{policy.id}-{added.id}",
                                       marks=[] if (k + g + a) % len(POLICIES) == p else [pytest.mark.slow])


@pytest.mark.parametrize(("kind", "grouping", "policy", "added_key", "added_value"), list(cases()))
def test_neighbours_look_the_same_except_noised_values(
    tmp_path, caplog, kind, grouping, policy, added_key, added_value
):
    text = spec_text(aggregate(kind, grouping=grouping, policy=policy))
    binary64 = kind != "count" and isinstance(added_value, float)
    if binary64:
        # a float sum must be declared binary64 (an exact spec refuses floats whatever their value: by type)
        text = spec_text(aggregate(kind, grouping=grouping, policy=policy,
                                   upstream={"arithmetic": "binary64", "max_rows": 1000}))
        base_rows = [(k, float(v)) for k, v in BASE]
        added_rows = base_rows + [(added_key, added_value)]
    elif added_value is None:
        base_rows, added_rows = BASE, BASE + [(added_key, None)]
    else:
        base_rows, added_rows = BASE, BASE + [(added_key, added_value)]
    if kind == "count":
        base_rows = [(k, 1) for k, _ in base_rows]
        added_rows = [(k, 1) for k, _ in added_rows]
    seen = [
        observe(tmp_path, name, text, upstream(kind, grouping, rows), caplog)
        for name, rows in (("base", base_rows), ("added", added_rows))
    ]
    if binary64 and grouping == "selection":  # refused from the spec alone: the partitions are private (ADR 0017)
        assert seen[0]["error"].startswith(
            "ReleaseConfigError: aggregate 'a': upstream.arithmetic binary64 cannot be used with partition_selection"
        ), seen[0]["error"]
        assert seen[0]["charges"] == [], seen[0]["charges"]
    else:
        assert seen[0]["error"] is None, seen[0]["error"]
    assert seen[0] == seen[1]


@pytest.mark.parametrize("grouping", ["public", "selection"])
def test_decimal_neighbours_look_the_same(tmp_path, caplog, grouping):
    text = spec_text(aggregate("sum", grouping=grouping))
    base = [(k, Decimal(v) / 10) for k, v in BASE]
    seen = [
        observe(tmp_path, name, text, upstream("sum", grouping, rows), caplog)
        for name, rows in (("base", base), ("added", base + [("q", Decimal("0.7"))]))
    ]
    assert seen[0]["error"] is None
    assert seen[0] == seen[1]


@pytest.mark.parametrize("grouping", ["public", "selection"])
@pytest.mark.parametrize(("added_key", "added_value"), [("q", 7), ("y", Decimal("NaN")), ("y", Decimal("1e30"))],
                         ids=["a new key", "NaN", "a huge Decimal"])
def test_neighbours_look_the_same_under_a_second_live_try(tmp_path, caplog, grouping, added_key, added_value):
    """A try that finds another try of its release still holding the lease is refused (nothing charged) the same
    way whatever one person contributed: error text, logs, ledger rows."""
    text = spec_text(aggregate("sum", grouping=grouping))
    base = list(BASE)
    seen = [
        observe(tmp_path, name, text, upstream("sum", grouping, rows), caplog, live_try=True)
        for name, rows in (("base", base), ("added", base + [(added_key, added_value)]))
    ]
    assert seen[0]["error"].startswith("LeaseHeldError: attempt 1 of release 'neighbours'"), seen[0]["error"]
    assert [charge["state"] for charge in seen[0]["charges"]] == ["reserved"]  # only the live try's
    assert seen[0] == seen[1]


def test_the_comparison_catches_a_data_derived_log_line(tmp_path, caplog, monkeypatch):
    """Negative control: a log line that counts dropped rows (a data-derived number) must be caught."""
    import dp_operators.release.run as engine

    original = engine.prepare_inputs

    def leaky(spec, aggregates, *args, **kwargs):
        rows = aggregates["a"]
        logging.getLogger("dp_operators.release").warning("%d upstream row(s)", len(rows))
        return original(spec, aggregates, *args, **kwargs)

    monkeypatch.setattr(engine, "prepare_inputs", leaky)
    text = spec_text(aggregate("count", grouping="public"))
    seen = [
        observe(tmp_path, name, text, upstream("count", "public", rows), caplog)
        for name, rows in (("base", [(k, 1) for k, _ in BASE]), ("added", [(k, 1) for k, _ in BASE + [("z", 1)]]))
    ]
    assert seen[0]["logs"] != seen[1]["logs"]
