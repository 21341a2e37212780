"""Helpers for the source tests (tests/operators/test_sources.py, test_sql_release.py): small specs over UCI Adult,
their true aggregates computed in memory, a spec's binary64 variant (what a CSV file of sums needs), and writers of
one aggregate's rows as JSON, CSV or Parquet."""

from __future__ import annotations

import csv
import json
from decimal import Decimal, Inexact, localcontext
from pathlib import Path
from typing import Any

import yaml

from dp_operators.release.inputs import prepare_inputs
from dp_operators.spec import Aggregate, ReleaseSpec, parse_spec

#: Ages 17..90 as a public integer key domain (UCI Adult's range).
AGES = list(range(17, 91))

AGE_SPEC = f"""
version: 1
release: adult_sql_people_by_age
budget_account: census_adult
privacy_unit: person
contribution: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
aggregates:
  - name: people_by_age
    kind: count
    group_by: [age]
    keys: {{age: {AGES}}}
    mechanism: discrete_laplace
    budget: {{epsilon: 0.1}}
"""

#: Hours per day (hours_per_week / 7 to the cent, an exact NUMERIC) by sex: Decimal sums with a fraction.
HOURS_SPEC = """
version: 1
release: adult_sql_hours_per_day
budget_account: census_adult
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: hours_per_day_by_sex
    kind: mean
    group_by: [sex]
    keys: {sex: [Female, Male]}
    bounds: [0, 15]
    grid: 0.01
    mechanism: discrete_laplace
    budget: {epsilon: 0.2}
"""


def age_spec() -> ReleaseSpec:
    return parse_spec(AGE_SPEC, source="AGE_SPEC")


def hours_spec() -> ReleaseSpec:
    return parse_spec(HOURS_SPEC, source="HOURS_SPEC")


def binary64_spec(spec: ReleaseSpec, max_rows: int = 100_000) -> ReleaseSpec:
    """``spec`` with every sum, mean and variance declared ``upstream: {arithmetic: binary64, max_rows}``.

    A CSV file is refused for such an aggregate under ``exact`` (its cells carry no type: "30" reads as an int,
    "30.5" as a float); under binary64 it is read. Counts, and the histograms of medians and quantiles, keep the
    default (binary64 applies to sums only). ``max_rows`` 100,000 bounds UCI Adult's 48,842 rows per partition."""
    document = spec.model_dump(mode="json", exclude_unset=True)
    for aggregate in document["aggregates"]:
        if aggregate["kind"] not in ("count", "median", "quantile"):
            aggregate["upstream"] = {"arithmetic": "binary64", "max_rows": max_rows}
    return parse_spec(yaml.safe_dump(document, sort_keys=False), source=f"{spec.release}, binary64")


def adult_table(adult_csv: Path):
    """The Adult columns the specs use, with ``hours_per_day`` (Decimal, to the cent; at most 99 / 7 < 15)."""
    import pandas as pd

    table = pd.read_csv(adult_csv, usecols=["age", "education", "sex", "hours_per_week"], skipinitialspace=True)
    cents = Decimal("0.01")
    table["hours_per_day"] = [
        (Decimal(int(hours)) / 7).quantize(cents) for hours in table["hours_per_week"]
    ]
    return table


def people_by_age(adult_csv: Path) -> dict[str, Any]:
    table = adult_table(adult_csv)
    counts = table.groupby("age").size()
    return {"people_by_age": [{"age": int(age), "count": int(count)} for age, count in counts.items()]}


def hours_per_day_by_sex(adult_csv: Path) -> dict[str, Any]:
    """Exact Decimal sums (under a context that traps any rounding) and int counts, by sex."""
    table = adult_table(adult_csv)
    rows = []
    with localcontext(traps=[Inexact]):
        for sex, group in table.groupby("sex"):
            rows.append({"sex": sex, "sum": sum(group["hours_per_day"], Decimal(0)), "count": len(group)})
    return {"hours_per_day_by_sex": rows}


def tabular_rows(aggregate: Aggregate, value: Any) -> list[dict]:
    """An aggregate's value as the rows of a tabular file (one row for an ungrouped aggregate)."""
    if aggregate.group_by:
        return [dict(row) for row in value]
    return [dict(value)] if isinstance(value, dict) else [{aggregate.components[0]: value}]


def write_aggregate(path: Path, aggregate: Aggregate, value: Any) -> Path:
    """Write one aggregate's value to ``path`` in the format of its suffix (.json, .csv, else Parquet)."""
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(value))
        return path
    rows = tabular_rows(aggregate, value)
    if path.suffix.lower() == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def assert_same_inputs(spec: ReleaseSpec, read: Any, expected: Any) -> None:
    """The engine prepares the same integers (and keys) from ``read`` as from the in-memory ``expected``."""
    got, want = prepare_inputs(spec, read), prepare_inputs(spec, expected)
    assert got.keys == want.keys
    assert got.values.keys() == want.values.keys()
    assert all(got.values[k].tolist() == want.values[k].tolist() for k in want.values)
    assert any(any(vector) for vector in want.values.values())  # a real table, not zeros compared with zeros
