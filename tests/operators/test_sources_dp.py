"""File sources and what an observer may learn from them: what is a reference (a string value must never be echoed as a
"URI"), CSV refused without a public key domain (decided by the spec, before any read), integer CSV keys read in
bounded time, and the empty ungrouped aggregate (no row is not a refusal: whether a row exists can depend on one
person)."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException
from dp_operators.operators.file_tables import _int_key
from dp_operators.operators.sources import is_reference, read_reference
from dp_operators.release.inputs import prepare_inputs
from dp_operators.spec import parse_spec

from source_tables import AGE_SPEC, age_spec, write_aggregate

SECRET = "8675309.25"

KIND_SPEC = """
version: 1
release: empty_{kind}
budget_account: acct
privacy_unit: person
contribution: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
aggregates:
  - name: total
    kind: {kind}
{extra}    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
"""

SELECTION = "    group_by: [age]\n    partition_selection: {budget: {epsilon: 1, delta: 1e-8}}\n"
#: The float arithmetic under which a CSV file of sums is read (CSV cells carry no type: exact sums are refused).
BINARY64 = "    upstream: {arithmetic: binary64, max_rows: 1000}\n"


def kind_spec(kind: str, extra: str = ""):
    bounds = "" if kind == "count" else "    bounds: [0, 100]\n"
    return parse_spec(KIND_SPEC.format(kind=kind, extra=bounds + extra), source=f"{kind} spec")


# --- references ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("s3://bucket/aggregates.json", True, id="URI"),
        pytest.param("file:///tmp/a.CSV", True, id="file URI, upper-case suffix"),
        pytest.param("/data/ages.pq", True, id="absolute path"),
        pytest.param({"a": "gs://b/a.parquet", "b": "/x/b.json"}, True, id="mapping of references"),
        pytest.param(ObjectStoragePath("file:///tmp/x.csv"), True, id="ObjectStoragePath"),
        pytest.param(SECRET, False, id="a number as text"),
        pytest.param({"women": SECRET}, False, id="mapping of numbers as text"),
        pytest.param({"women": "1.csv"}, False, id="relative path"),
        pytest.param("s3://bucket/aggregates.txt", False, id="unknown suffix"),
        pytest.param("s3://bucket/a.csv/", False, id="a folder"),
        pytest.param({"a": "s3://b/a.csv", "b": SECRET}, False, id="mixed mapping"),
        pytest.param({"a": [{"k": "x", "count": 1}]}, False, id="rows"),
        pytest.param({}, False, id="empty mapping"),
        pytest.param(12, False, id="number"),
    ],
)
def test_is_reference(value, expected):
    assert is_reference(value) is expected


def test_a_string_value_goes_to_the_engine_which_refuses_it_without_the_value():
    spec = kind_spec("count")
    pulled = {"total": SECRET}
    assert not is_reference(pulled)
    with pytest.raises(Exception, match="holds a str") as caught:
        prepare_inputs(spec, pulled)
    assert "8675309" not in str(caught.value)


# --- CSV without a public key domain -------------------------------------------------------------------------------


def test_csv_is_refused_under_partition_selection_before_any_read(tmp_path):
    """The file does not exist: the refusal comes from the spec and the suffix alone."""
    spec = kind_spec("count", SELECTION)
    for reference in (f"file://{tmp_path / 'absent.csv'}", {"total": str(tmp_path / "absent.CSV")}):
        with pytest.raises(AirflowFailException, match="no public key domain .* Parquet or JSON"):
            read_reference(reference, spec)


def test_a_mapping_is_checked_for_csv_before_any_file_is_read(tmp_path):
    spec = parse_spec(AGE_SPEC + """  - name: selected
    kind: count
    group_by: [age]
    mechanism: discrete_laplace
    budget: {epsilon: 1}
    partition_selection: {budget: {epsilon: 1, delta: 1e-8}}
""", source="two aggregates")
    reference = {"people_by_age": str(tmp_path / "absent.parquet"), "selected": str(tmp_path / "selected.csv")}
    with pytest.raises(AirflowFailException, match="'selected' .* no public key domain"):
        read_reference(reference, spec)  # not "absent.parquet was not found"


@pytest.mark.parametrize("suffix", [".parquet", ".json"])
def test_typed_formats_are_read_under_partition_selection(tmp_path, suffix):
    spec = kind_spec("count", SELECTION)
    rows = [{"age": 17, "count": 5000}, {"age": 18, "count": 4000}]
    path = write_aggregate(tmp_path / f"ages{suffix}", spec.aggregates[0], rows)
    assert read_reference({"total": str(path)}, spec) == {"total": rows}


# --- integer CSV keys ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("17", 17), (" 17.0 ", 17), ("1.7e1", 17), ("-0", 0), ("17.5", None), ("nan", None), ("inf", None),
     ("x", None), ("", None), ("1e9999999", None), ("-1e999999999999", None), ("1" * 5000, None)],
)
def test_int_keys(text, expected):
    assert _int_key(text) == expected


def _read_huge_keys(path: str) -> None:
    read_reference(path, age_spec())


def test_huge_exponents_in_int_keys_are_read_in_bounded_time(tmp_path):
    path = tmp_path / "ages.csv"
    path.write_text("age,count\n" + "".join(f"1e{9999999 - i},1\n" for i in range(20)) + "17,5\n")
    process = multiprocessing.get_context("spawn").Process(target=_read_huge_keys, args=(str(path),))
    process.start()
    process.join(30)
    if process.is_alive():
        process.kill()
        process.join()
        pytest.fail("20 key cells 1e9999999 took more than 30 s")
    assert process.exitcode == 0
    assert read_reference(str(path), age_spec())["people_by_age"][-1] == {"age": 17, "count": 5}


# --- the empty ungrouped aggregate ---------------------------------------------------------------------------------


def sql_empty_aggregate() -> dict:
    """What SQL computes over no row: ``COUNT`` 0, ``SUM`` NULL."""
    with sqlite3.connect(":memory:") as connection:
        connection.execute("CREATE TABLE t (x)")
        cursor = connection.execute("SELECT COUNT(*) AS count, SUM(x) AS sum, SUM(x * x) AS sum_squares FROM t")
        return dict(zip([c[0] for c in cursor.description], cursor.fetchone()))


@pytest.mark.parametrize("kind", ["count", "sum", "mean", "variance"])
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_an_ungrouped_file_without_a_row_is_the_empty_aggregate(tmp_path, kind, suffix):
    """An ungrouped CSV or Parquet file with a header and no row reads as SQL's aggregate of no row."""
    spec = kind_spec(kind, BINARY64 if suffix == ".csv" and kind != "count" else "")  # CSV sums: binary64
    columns = list(spec.aggregates[0].components)
    path = tmp_path / f"total{suffix}"
    if suffix == ".csv":
        path.write_text(",".join(columns) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({c: pa.array([], pa.int64()) for c in columns}), path)
    read = read_reference({"total": str(path)}, spec)
    empty = sql_empty_aggregate()
    expected = empty[columns[0]] if len(columns) == 1 else {c: empty[c] for c in columns}
    assert read == {"total": expected}
    assert {k: v.tolist() for k, v in prepare_inputs(spec, read).values.items()} == {
        k: v.tolist() for k, v in prepare_inputs(spec, {"total": expected}).values.items()}


def test_an_ungrouped_file_of_two_rows_is_read_as_their_total(tmp_path):
    """An ungrouped file's rows are added up: two rows read as the one row of their total."""
    spec = kind_spec("mean", BINARY64)  # a CSV file of sums is read under binary64 (refused under exact)
    (tmp_path / "one.csv").write_text("sum,count\n127,4\n")
    assert read_reference({"total": str(tmp_path / "one.csv")}, spec) == {"total": {"sum": 127, "count": 4}}
    (tmp_path / "two.csv").write_text("sum,count\n120,3\n7,1\n")
    one = prepare_inputs(spec, read_reference({"total": str(tmp_path / "one.csv")}, spec))
    two = prepare_inputs(spec, read_reference({"total": str(tmp_path / "two.csv")}, spec))
    assert {k: v.tolist() for k, v in two.values.items()} == {k: v.tolist() for k, v in one.values.items()}
