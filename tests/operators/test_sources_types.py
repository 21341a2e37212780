"""File sources decide by the file's structure, never by one person's value (DESIGN.md 2.4):

* CSV (and JSON) is decoded with ``surrogateescape``: a cell in another encoding (one source system's Latin-1
  key) is text the engine reads as no key (its row ignored and counted), a non-number in a value cell, or a header
  that names no column; never a refusal of the whole file.
* Parquet key columns: a date or timestamp Python cannot hold (beyond year 9999, before year 1) is an unpublishable
  key, not a crash; a key column of a type the engine takes no key of (bool, binary, time, nested), or whose keys can
  never match the spec's public keys, is refused by its type, with rows or without.
* Parquet sums under ``upstream.arithmetic: exact``: a floating ``sum``/``sum_squares`` column is refused by its
  type, whether its values are integral, fractional, NULL or absent; floating counts stay accepted.
"""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowFailException
from dp_operators.operators.sources import read_reference
from dp_operators.release.diagnostics import DiagnosticsReport
from dp_operators.release.inputs import prepare_inputs
from dp_operators.release.upstream_types import UNPUBLISHABLE
from dp_operators.spec import parse_spec

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SPEC = """
version: 1
release: types_types
budget_account: acct
privacy_unit: person
contribution: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
aggregates:
  - name: agg
    kind: {kind}
{extra}    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
"""
CITIES = "    group_by: [city]\n    keys: {city: [Zürich, Genève]}\n"
AGES = "    group_by: [age]\n    keys: {age: [17, 18]}\n"
DAYS = "    group_by: [day]\n    keys: {day: ['2026-01-01', '2026-01-02']}\n"
BINARY64 = "    upstream: {arithmetic: binary64, max_rows: 1000}\n"
#: A value that must never appear in a message or a log line.
SECRET = 8675309


def spec_of(kind: str, extra: str = ""):
    bounds = "" if kind == "count" else "    bounds: [0, 100]\n"
    return parse_spec(SPEC.format(kind=kind, extra=bounds + extra), source=f"{kind} spec")


def prepared(spec, read):
    """The engine's integers and the diagnostics of one read."""
    report = DiagnosticsReport(spec.release)
    inputs = prepare_inputs(spec, read, diagnostics=report)
    return {k: v.tolist() for k, v in inputs.values.items()}, report.aggregate("agg")


# --- CSV in another encoding -----------------------------------------------------------------------------------------


def city_rows(fmt: str, rows: list[tuple[str, int]], encoding: str) -> bytes:
    """Rows of ``people_by_city`` as the bytes of a CSV file or of a JSON file holding the whole mapping."""
    if fmt == "csv":
        return "".join(f"{city},{count}\n" for city, count in rows).encode(encoding)
    return ", ".join(f'{{"city": "{city}", "count": {count}}}' for city, count in rows).encode(encoding)


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_latin1_key_row_is_ignored_and_counted_not_refused(tmp_path, fmt):
    spec = spec_of("count", CITIES)
    start, end = (b"city,count\n", b"") if fmt == "csv" else (b'{"agg": [', b"]}")
    clean = city_rows(fmt, [("Zürich", 120), ("Genève", 80)], "utf-8")
    her = city_rows(fmt, [("Zürich", 1)], "latin-1")  # one source system's Latin-1 spelling
    without, with_her = tmp_path / f"without.{fmt}", tmp_path / f"with.{fmt}"
    without.write_bytes(start + clean + end)
    with_her.write_bytes(start + clean + (b"" if fmt == "csv" else b", ") + her + end)
    values_without, seen_without = prepared(spec, read_reference(str(without), spec))
    values_with, seen_with = prepared(spec, read_reference(str(with_her), spec))
    assert values_with == values_without
    assert values_without[("agg", "count")] == [120, 80]  # a real table, read as UTF-8 (with its accents)
    assert (seen_without.rows_unpublishable_key, seen_with.rows_unpublishable_key) == (0, 1)


def test_other_cells_in_another_encoding_are_null_or_no_column(tmp_path):
    """An int key cell in Latin-1 is no integer (NULL, outside the domain); a value cell is no number (NULL, the
    ``nan`` policy); a header in Latin-1 names no column the spec needs (refused by the structure, not echoed)."""
    spec = spec_of("count", AGES)
    path = tmp_path / "ages.csv"
    path.write_bytes(b"age,count\n17,5\n18,\xe9\n1\xe97,3\n")
    assert read_reference(str(path), spec) == {"agg": [{"age": 17, "count": 5}, {"age": 18, "count": None},
                                                       {"age": None, "count": 3}]}
    path.write_bytes(b"\xe2ge,count\n17,5\n")
    with pytest.raises(AirflowFailException, match="has no column 'age'") as caught:
        read_reference(str(path), spec)
    assert "\udce2" not in str(caught.value)


def test_a_byte_order_mark_is_still_skipped(tmp_path):
    spec = spec_of("count", AGES)
    path = tmp_path / "ages.csv"
    path.write_bytes(b"\xef\xbb\xbfage,count\n17,5\n")  # spreadsheets write a BOM
    assert read_reference(str(path), spec) == {"agg": [{"age": 17, "count": 5}]}


# --- Parquet keys beyond Python's dates -----------------------------------------------------------------------------

EPOCH = dt.date(1970, 1, 1)
IN_RANGE_DAYS = [(dt.date(2026, 1, 1) - EPOCH).days, (dt.date(2026, 1, 2) - EPOCH).days]
US_PER_DAY = 86_400 * 10**6


def day_column(kind, days: list[int]):
    if pa.types.is_date32(kind):
        return pa.array(days, pa.int32()).cast(kind)
    if pa.types.is_date64(kind):
        return pa.array([d * 86_400_000 for d in days], pa.int64()).cast(kind)
    return pa.array([d * US_PER_DAY for d in days], pa.int64()).cast(kind)


@pytest.mark.parametrize("kind", [
    pytest.param(pa.date32(), id="date32"),
    pytest.param(pa.date64(), id="date64"),
    pytest.param(pa.timestamp("us"), id="timestamp"),
    pytest.param(pa.timestamp("us", tz="UTC"), id="timestamp with a time zone"),
])
@pytest.mark.parametrize("outlier", [
    pytest.param((dt.date(9999, 12, 31) - EPOCH).days + 1, id="year 10000"),
    pytest.param(3_000_000, id="year 10183"),
    pytest.param((dt.date(1, 1, 1) - EPOCH).days - 1, id="before year 1"),
])
def test_a_date_key_python_cannot_hold_is_unpublishable(tmp_path, kind, outlier):
    spec = spec_of("count", DAYS)
    read = {}
    for name, days in (("without", IN_RANGE_DAYS), ("with", IN_RANGE_DAYS + [outlier])):
        path = tmp_path / f"{name}.parquet"
        counts = [40, 50, 1][: len(days)]
        pq.write_table(pa.table({"day": day_column(kind, days), "count": pa.array(counts, pa.int64())}), path)
        read[name] = read_reference(str(path), spec)
    assert read["with"]["agg"][:2] == read["without"]["agg"]  # the rows Python can hold, read as they are
    assert read["with"]["agg"][2] == {"day": UNPUBLISHABLE, "count": 1}
    values_without, seen_without = prepared(spec, read["without"])
    values_with, seen_with = prepared(spec, read["with"])
    assert values_with == values_without
    if getattr(kind, "tz", None) is None:  # an aware timestamp is published with its offset: outside this domain
        assert values_without[("agg", "count")] == [40, 50]
    assert (seen_without.rows_unpublishable_key, seen_with.rows_unpublishable_key) == (0, 1)


# --- Parquet key column types ---------------------------------------------------------------------------------------

def key_file(path: Path, column, rows: str) -> Path:
    """A Parquet file whose ``age`` key column is ``column``'s type; ``rows``: its values, none, or all NULL."""
    if rows == "no rows":
        column = pa.array([], column.type)
    elif rows == "all NULL":
        column = pa.array([None] * len(column), column.type)
    pq.write_table(pa.table({"age": column, "count": pa.array([SECRET] * len(column), pa.int64())}), path)
    return path


ROWS = ["with values", "no rows", "all NULL"]


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("column", "domain", "message"), [
    pytest.param(pa.array([True, False]), AGES, "key column 'age' is bool, which is no key", id="bool"),
    pytest.param(pa.array([b"17", b"18"]), AGES, r"is binary \(bytes\), which is no key; write it as a string",
                 id="binary"),
    pytest.param(pa.array([b"17"], pa.large_binary()), AGES, r"large_binary \(bytes\)", id="large binary"),
    pytest.param(pa.array([dt.time(17)]), AGES, "is of type time64", id="time"),
    pytest.param(pa.array([dt.timedelta(1)]), AGES, "is of type duration", id="duration"),
    pytest.param(pa.array([["17"]]), AGES, "is of type list", id="list"),
    pytest.param(pa.array([17, 18], pa.int64()), CITIES.replace("city", "age"), "whose keys are int, but the "
                 "spec's public domain lists only str values", id="integers for text keys"),
    pytest.param(pa.array(["17", "18"]), AGES, "whose keys are str, but the spec's public domain lists only int",
                 id="text for integer keys"),
    pytest.param(pa.array([dt.date(2026, 1, 1)]), AGES, "is date32", id="dates for integer keys"),
    pytest.param(pa.array(["17"]).dictionary_encode(), AGES, "whose keys are str", id="categorical text"),
])
def test_a_key_column_is_refused_by_its_type_whatever_it_holds(tmp_path, column, domain, message, rows, caplog):
    spec = spec_of("count", domain)
    path = key_file(tmp_path / "keys.parquet", column, rows)
    with caplog.at_level(logging.DEBUG), pytest.raises(AirflowFailException, match=message) as caught:
        read_reference(str(path), spec)
    assert "keys.parquet" in str(caught.value) and str(SECRET) not in str(caught.value) + caplog.text


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("column", "domain"), [
    pytest.param(pa.array([17, 18], pa.int16()), AGES, id="integers"),
    pytest.param(pa.array([17.0, float("nan")]), AGES, id="floats (pandas: an int column with a NULL)"),
    pytest.param(pa.array([Decimal(17), Decimal(18)], pa.decimal128(4, 0)), AGES, id="decimals"),
    pytest.param(pa.array(["Zürich", "Genève"]).dictionary_encode(), CITIES.replace("city", "age"),
                 id="categorical text"),
    pytest.param(pa.array([dt.date(2026, 1, 1), dt.date(2026, 1, 2)]), DAYS.replace("day", "age"), id="dates"),
])
def test_key_columns_the_engine_reads_are_read(tmp_path, column, domain, rows):
    spec = spec_of("count", domain)
    path = key_file(tmp_path / "keys.parquet", column, rows)
    read = read_reference(str(path), spec)
    assert len(read["agg"]) == (0 if rows == "no rows" else len(column))
    values, _ = prepared(spec, read)
    if rows == "with values":  # the first key is inside the domain, so its count is there
        assert SECRET in values[("agg", "count")]


# --- Parquet sums under exact arithmetic ----------------------------------------------------------------------------

def value_file(path: Path, columns: dict, rows: str) -> Path:
    """An ungrouped aggregate's one-row Parquet file; ``rows``: the values, no row, or NULLs."""
    if rows == "no rows":
        columns = {name: pa.array([], column.type) for name, column in columns.items()}
    elif rows == "all NULL":
        columns = {name: pa.array([None], column.type) for name, column in columns.items()}
    pq.write_table(pa.table(columns), path)
    return path


INTEGRAL, FRACTIONAL = pa.array([30.0]), pa.array([70.5])


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("kind", "columns", "floating"), [
    pytest.param("sum", {"sum": INTEGRAL}, "sum", id="sum, integral"),
    pytest.param("sum", {"sum": FRACTIONAL}, "sum", id="sum, with a fraction"),
    pytest.param("mean", {"sum": FRACTIONAL, "count": pa.array([2])}, "sum", id="mean"),
    pytest.param("variance", {"sum": pa.array([70]), "count": pa.array([2]), "sum_squares": INTEGRAL},
                 "sum_squares", id="variance, sum_squares"),
])
def test_a_floating_sum_column_is_refused_under_exact_whatever_it_holds(tmp_path, kind, columns, floating, rows):
    spec = spec_of(kind)
    path = value_file(tmp_path / "total.parquet", columns, rows)
    with pytest.raises(AirflowFailException, match=f"column '{floating}' is double, a binary float, but the spec's "
                       "upstream.arithmetic is 'exact'") as caught:
        read_reference({"agg": str(path)}, spec)
    message = str(caught.value)
    assert "total.parquet" in message and "70.5" not in message and "30" not in message
    for advice in ("decimal128", "nullable Int64", "upstream: {arithmetic: binary64, max_rows: N}"):
        assert advice in message
    # under binary64 the same file is read and prepared (the float allowance is in the plan)
    binary64 = spec_of(kind, BINARY64)
    prepared(binary64, read_reference({"agg": str(path)}, binary64))


@pytest.mark.parametrize("column", [
    pytest.param(pa.array([70], pa.int64()), id="int64"),
    pytest.param(pa.array([Decimal("70.5")], pa.decimal128(6, 1)), id="decimal128"),
])
def test_exact_sum_columns_are_read_under_exact(tmp_path, column):
    spec = spec_of("sum")
    path = value_file(tmp_path / "total.parquet", {"sum": column}, "with values")
    read = read_reference({"agg": str(path)}, spec)
    assert read == {"agg": column.to_pylist()[0]}
    prepared(spec, read)


def test_pandas_nullable_int64_sums_are_read_under_exact(tmp_path):
    """The message's advice works: pandas' nullable Int64 keeps a sum column holding a NULL an int64 column."""
    pd = pytest.importorskip("pandas")
    spec = spec_of("sum", AGES)
    path = tmp_path / "sums.parquet"
    pd.DataFrame({"age": [17, 18], "sum": pd.array([SECRET, None], dtype="Int64")}).to_parquet(path, index=False)
    read = read_reference(str(path), spec)["agg"]  # an Arrow table: int64 columns, one NULL
    assert read.to_pylist() == [{"age": 17, "sum": SECRET}, {"age": 18, "sum": None}]


def test_a_floating_count_column_is_read_under_exact(tmp_path):
    """Counts in a double column (pandas: an int column holding a NULL) are read and rounded, as through XCom."""
    spec = spec_of("mean")
    path = value_file(tmp_path / "total.parquet", {"sum": pa.array([70]), "count": pa.array([2.0])}, "with values")
    read = read_reference({"agg": str(path)}, spec)
    assert read == {"agg": {"sum": 70, "count": 2.0}}
    values, _ = prepared(spec, read)
    assert values[("agg", "count")] == [2]
