"""An ungrouped aggregate read from a table (a query's result, a CSV or Parquet file) adds its rows up: one row and
two rows (a stray ``GROUP BY``) have the same outcome, so it never depends on the row count (DESIGN.md 2.4)."""

from __future__ import annotations

import sqlite3

import pandas as pd
import pytest
import yaml

from airflow.sdk.exceptions import AirflowFailException
from dp_operators.operators.sources import query_aggregates, read_reference
from dp_operators.release import ReleaseInputError, prepare_inputs
from dp_operators.spec import parse_spec


def ungrouped_spec(kind: str, arithmetic: str = "exact"):
    """One ungrouped aggregate; ``binary64`` (max_rows 1000) is the arithmetic a CSV file of sums is read under."""
    entry = {"name": "total", "kind": kind, "mechanism": "discrete_laplace", "budget": {"epsilon": 1}}
    if kind != "count":
        entry.update(bounds=[0, 100], grid=1)
    if arithmetic == "binary64":
        entry.update(upstream={"arithmetic": "binary64", "max_rows": 1000})
    document = {"version": 1, "release": "ungrouped", "budget_account": "acct", "privacy_unit": "person",
                "aggregates": [entry]}
    return parse_spec(yaml.safe_dump(document, sort_keys=False), source="ungrouped")


class SqliteFile:
    """A DB-API hook over one SQLite file (``query_aggregates`` needs ``get_conn`` only)."""

    def __init__(self, path) -> None:
        self.path = path

    def get_conn(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path)


def outcome(spec, aggregates) -> tuple[str, object]:
    try:
        prepared = prepare_inputs(spec, aggregates)
    except ReleaseInputError as error:
        return "refused", str(error)
    return "read", {k: v.tolist() for k, v in prepared.values.items()}


PEOPLE = {
    "everyone in one region": pd.DataFrame({"region": ["north"] * 3, "hours": [40, 30, 50]}),
    "one more in a second region": pd.DataFrame({"region": ["north"] * 3 + ["south"], "hours": [40, 30, 50, 20]}),
}
QUERIES = {
    "count": "SELECT COUNT(*) AS count FROM people GROUP BY region",
    "sum": "SELECT SUM(hours) AS sum FROM people GROUP BY region",
    "mean": "SELECT SUM(hours) AS sum, COUNT(*) AS count FROM people GROUP BY region",
}


@pytest.mark.parametrize("kind", list(QUERIES))
def test_a_stray_group_by_is_read_whatever_the_number_of_rows(tmp_path, kind):
    """A query with a stray GROUP BY is read on one region as on two: same outcome for neighbouring data."""
    spec = ungrouped_spec(kind)
    outcomes = {}
    for name, people in PEOPLE.items():
        path = tmp_path / f"{len(people)}.db"
        with sqlite3.connect(path) as connection:
            people.to_sql("people", connection, index=False)
        outcomes[name] = outcome(spec, query_aggregates(SqliteFile(path), {"total": QUERIES[kind]}, spec))
    assert [state for state, _ in outcomes.values()] == ["read", "read"]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize(("kind", "one", "two"), [
    pytest.param("count", {"count": [4]}, {"count": [3, 1]}, id="count"),
    pytest.param("sum", {"sum": [140]}, {"sum": [120, 20]}, id="sum"),
    pytest.param("mean", {"sum": [140], "count": [4]}, {"sum": [120, 20], "count": [3, 1]}, id="mean"),
    pytest.param("variance", {"sum": [140], "count": [4], "sum_squares": [5400]},
                 {"sum": [120, 20], "count": [3, 1], "sum_squares": [5000, 400]}, id="variance"),
])
def test_two_rows_of_a_file_read_as_the_one_row_of_their_total(tmp_path, suffix, kind, one, two):
    """An ungrouped file of partial sums reads as the file of their total."""
    # CSV cells carry no type: a CSV file of sums is read under binary64 (refused under exact)
    spec = ungrouped_spec(kind, "binary64" if suffix == ".csv" and kind != "count" else "exact")
    read = {}
    for name, columns in (("one", one), ("two", two)):
        path = tmp_path / f"{name}{suffix}"
        frame = pd.DataFrame(columns)
        frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False)
        read[name] = outcome(spec, read_reference({"total": str(path)}, spec))
    assert read["one"] == read["two"] and read["one"][0] == "read"


def test_a_null_sum_among_several_rows_follows_the_nan_policy(tmp_path):
    """A NULL sum in one of several rows follows non_finite.nan (replace: 0), as in one row."""
    spec = ungrouped_spec("sum", "binary64")  # a CSV file of sums is read under binary64 (refused under exact)
    (tmp_path / "two.csv").write_text("sum\n120\n\n")
    (tmp_path / "one.csv").write_text("sum\n120\n")
    assert outcome(spec, read_reference({"total": str(tmp_path / "two.csv")}, spec)) == outcome(
        spec, read_reference({"total": str(tmp_path / "one.csv")}, spec))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_float_sum_in_two_rows_is_refused_as_in_one(tmp_path, suffix):
    """Under exact, float sums are refused whether the file has one row or two, with the same message."""
    spec = ungrouped_spec("sum")
    path = tmp_path / f"total{suffix}"  # one path for both files: the message names the file
    outcomes = []
    for sums in ([30.0], [30.0, 0.5]):
        frame = pd.DataFrame({"sum": sums})
        frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False)
        try:  # CSV: refused from the suffix and the spec; Parquet: by the double column's type
            outcomes.append(outcome(spec, read_reference({"total": str(path)}, spec)))
        except AirflowFailException as error:
            outcomes.append(("refused", str(error)))
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == "refused"


def test_an_empty_result_is_the_aggregate_of_nobody(tmp_path):
    """No row is count 0 (and a NULL sum), as SQL computes it."""
    spec = ungrouped_spec("count")
    (tmp_path / "none.csv").write_text("count\n")
    assert read_reference({"total": str(tmp_path / "none.csv")}, spec) == {"total": 0}
