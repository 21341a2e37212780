"""File sources: JSON, CSV and Parquet files of real UCI Adult aggregates, read by ``read_reference`` into exactly
what the engine gets from the same aggregates in memory; and every refusal, which names the file and the column but
never a value."""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowFailException
from dp_operators.operators.sources import is_reference, read_reference, value_columns
from dp_operators.release import ReleaseInputError
from dp_operators.release.columns import is_table
from dp_operators.release.inputs import prepare_inputs
from dp_operators.spec import parse_spec

from source_tables import (
    AGE_SPEC,
    HOURS_SPEC,
    age_spec,
    assert_same_inputs,
    binary64_spec,
    hours_per_day_by_sex,
    hours_spec,
    people_by_age,
    write_aggregate,
)

FORMATS = [pytest.param(".json", id="JSON"), pytest.param(".csv", id="CSV"), pytest.param(".parquet", id="Parquet")]
#: A value that must never appear in a message or a log line.
SECRET = "Secret-Key-8675309"
#: The refusal of a CSV file for sums declared exact (decided by the suffix and the spec, before any read).
EXACT_CSV_REFUSAL = r"is CSV, but its sums are declared exact \(upstream\.arithmetic: exact\)"


def write_each(folder: Path, spec, aggregates: dict, suffix: str) -> dict[str, str]:
    """One file per aggregate; returns the reference mapping (file:// URIs)."""
    return {
        aggregate.name: f"file://{write_aggregate(folder / f'{aggregate.name}{suffix}', aggregate, aggregates[aggregate.name])}"
        for aggregate in spec.aggregates
    }


def test_one_json_file_holds_the_whole_mapping(tmp_path, example_spec, adult_aggregates):
    stored = tmp_path / "aggregates.json"
    stored.write_text(json.dumps(adult_aggregates))
    for reference in (f"file://{stored}", str(stored)):  # a bare path is a local file
        read = read_reference(reference, example_spec)
        assert_same_inputs(example_spec, read, adult_aggregates)


@pytest.mark.parametrize("suffix", FORMATS)
def test_one_file_per_aggregate_reads_as_the_in_memory_aggregates(tmp_path, example_spec, adult_aggregates, suffix):
    """Each aggregate in its own JSON, CSV or Parquet file reads as the same rows and prepared integers."""
    # CSV cells carry no type: a CSV file of sums (the mean) is read under binary64 (exact is refused for CSV)
    spec = binary64_spec(example_spec) if suffix == ".csv" else example_spec
    reference = write_each(tmp_path, spec, adult_aggregates, suffix)
    read = read_reference(reference, spec)
    # the same rows and types (ints), so the same prepared integers; Parquet of int keys and values comes as an
    # Arrow table, read by the engine's columnar reader
    assert suffix != ".parquet" or all(is_table(read[a.name]) for a in example_spec.aggregates if a.group_by)
    as_rows = {name: value.to_pylist() if is_table(value) else value for name, value in read.items()}
    assert as_rows == adult_aggregates
    assert_same_inputs(spec, read, adult_aggregates)


def test_formats_can_be_mixed_and_suffixes_are_case_insensitive(tmp_path, example_spec, adult_aggregates):
    reference = {
        aggregate.name: str(write_aggregate(tmp_path / f"{aggregate.name}{suffix}", aggregate,
                                            adult_aggregates[aggregate.name]))
        for aggregate, suffix in zip(example_spec.aggregates, (".CSV", ".pq", ".Json", ".PARQUET"), strict=True)
    }
    assert_same_inputs(example_spec, read_reference(reference, example_spec), adult_aggregates)


@pytest.mark.parametrize("suffix", [pytest.param(".csv", id="CSV"), pytest.param(".parquet", id="Parquet")])
def test_a_single_table_file_for_a_one_aggregate_spec(tmp_path, adult_csv, suffix):
    spec, expected = age_spec(), people_by_age(adult_csv)
    path = write_aggregate(tmp_path / f"ages{suffix}", spec.aggregates[0], expected["people_by_age"])
    read = read_reference(f"file://{path}", spec)
    rows = read["people_by_age"].to_pylist() if is_table(read["people_by_age"]) else read["people_by_age"]
    assert all(type(row["age"]) is int for row in rows)  # the domain's type, also from CSV text
    assert_same_inputs(spec, read, expected)


def test_csv_int_keys_accept_integral_numbers_and_ignore_other_text(tmp_path, adult_csv):
    """pandas writes an int column holding a NULL as floats (25.0); text that is no integer is outside the domain:
    its row is ignored like any key outside it, never refused (the refusal would depend on that row)."""
    spec, expected = age_spec(), people_by_age(adult_csv)
    rows = expected["people_by_age"]
    lines = ["age,count"] + [f"{row['age']}.0,{row['count']}" for row in rows] + [f"{SECRET},5", ",7"]
    path = tmp_path / "ages.csv"
    path.write_text("\n".join(lines) + "\n")
    read = read_reference(f"file://{path}", spec)
    assert read["people_by_age"][-2:] == [{"age": None, "count": 5}, {"age": None, "count": 7}]
    assert_same_inputs(spec, read, expected)


def test_csv_non_integers_are_floats_exactly_as_through_xcom(tmp_path, adult_csv):
    """Sums with a fraction, printed to CSV, are read as the floats the text spells (never as exact Decimals, which
    would let a float sum printed as text pass ``arithmetic: exact``): under ``exact`` the CSV file is refused before
    it is read, as the same floats through XCom are refused, and under ``binary64`` it is read as those floats."""
    spec, expected = hours_spec(), hours_per_day_by_sex(adult_csv)
    rows = expected["hours_per_day_by_sex"]
    path = write_aggregate(tmp_path / "hours.csv", spec.aggregates[0], rows)
    as_floats = {"hours_per_day_by_sex": [dict(row, sum=float(row["sum"])) for row in rows]}
    with pytest.raises(AirflowFailException, match=EXACT_CSV_REFUSAL):
        read_reference(f"file://{path}", spec)
    with pytest.raises(ReleaseInputError, match="upstream.arithmetic is 'exact'"):  # the XCom path, for contrast
        prepare_inputs(spec, as_floats)
    read = read_reference(f"file://{path}", binary64_hours_spec())
    assert read == as_floats
    assert all(type(row["sum"]) is float and type(row["count"]) is int for row in read["hours_per_day_by_sex"])
    assert any(not row["sum"].is_integer() for row in read["hours_per_day_by_sex"])  # the case under test
    assert_same_inputs(binary64_hours_spec(), read, as_floats)


def test_a_csv_file_of_exact_sums_is_refused_whatever_its_cells(tmp_path):
    """Under ``exact`` a CSV file of sums is refused, with one message for neighbouring cells "30" and "30.5"."""
    spec = hours_spec()
    path = tmp_path / "hours.csv"
    messages = {}
    for cell in ("30", "30.5"):  # one person's 0.5 h apart: an int and a float as CSV text
        path.write_text(f"sex,sum,count\nFemale,{cell},10\nMale,20,10\n")
        with pytest.raises(AirflowFailException, match=EXACT_CSV_REFUSAL) as caught:
            read_reference({"hours_per_day_by_sex": f"file://{path}"}, spec)
        messages[cell] = str(caught.value)
    assert messages["30"] == messages["30.5"]  # the neighbour property: the refusal does not depend on a cell
    message = messages["30"]
    assert f"aggregate 'hours_per_day_by_sex' (file://{path})" in message  # names the aggregate and the file
    assert "30" not in message.replace(str(path), "")  # never a value
    assert "Write it as Parquet" in message and "upstream: {arithmetic: binary64, max_rows: N}" in message
    path.unlink()  # decided by the suffix and the spec alone, before the file is read
    with pytest.raises(AirflowFailException) as caught:
        read_reference({"hours_per_day_by_sex": f"file://{path}"}, spec)
    assert str(caught.value) == message
    # the fix the message names: the same cells are read under binary64, as the floats and ints they spell
    for cell, value in (("30", 30), ("30.5", 30.5)):
        path.write_text(f"sex,sum,count\nFemale,{cell},10\nMale,20,10\n")
        (female, _) = read_reference({"hours_per_day_by_sex": str(path)}, binary64_hours_spec())["hours_per_day_by_sex"]
        assert female["sum"] == value and type(female["sum"]) is type(value)
    # counts from CSV are read as before, under the default exact arithmetic
    ages = tmp_path / "ages.csv"
    ages.write_text("age,count\n17,30\n18,5\n")
    assert age_spec().aggregates[0].upstream.arithmetic == "exact"
    assert read_reference(str(ages), age_spec()) == {"people_by_age": [{"age": 17, "count": 30},
                                                                       {"age": 18, "count": 5}]}


def binary64_hours_spec():
    return parse_spec(HOURS_SPEC.replace("    grid: 0.01\n", "    grid: 0.01\n    upstream: {arithmetic: binary64, "
                                         "max_rows: 100000}\n"), source="HOURS_SPEC, binary64")


def test_parquet_decimals_stay_decimals_and_are_read_exactly(tmp_path, adult_csv):
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec, expected = hours_spec(), hours_per_day_by_sex(adult_csv)
    rows = expected["hours_per_day_by_sex"]
    table = pa.table({
        "sex": [row["sex"] for row in rows],
        "sum": pa.array([row["sum"] for row in rows], pa.decimal128(14, 2)),
        "count": pa.array([row["count"] for row in rows], pa.int64()),
    })
    pq.write_table(table, tmp_path / "hours.parquet")
    read = read_reference({"hours_per_day_by_sex": f"file://{tmp_path / 'hours.parquet'}"}, spec)
    assert all(type(row["sum"]) is Decimal for row in read["hours_per_day_by_sex"])
    assert_same_inputs(spec, read, expected)
    # negative control: the same sums as binary floats are refused under exact arithmetic, so the Decimal path is
    # what makes the file usable (and a float sneaking through would fail this test)
    as_floats = {"hours_per_day_by_sex": [dict(row, sum=float(row["sum"])) for row in rows]}
    with pytest.raises(ReleaseInputError, match="upstream.arithmetic is 'exact'"):
        prepare_inputs(spec, as_floats)


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        pytest.param("12", 12, id="integer"),
        pytest.param("-3", -3, id="negative integer"),
        pytest.param("12.50", 12.5, id="decimal is a float"),
        pytest.param("1e3", 1000.0, id="exponent is a float"),
        pytest.param("40.0", 40.0, id="integral float text stays a float"),
        pytest.param("1e999999", float("inf"), id="huge exponent, no time"),
        pytest.param("9" * 5000, Decimal("9" * 5000), id="integer beyond the int digit limit is exact"),
        pytest.param("", None, id="empty is NULL"),
        pytest.param("N/A", None, id="text is NULL"),
        pytest.param(SECRET, None, id="any text is NULL"),
        pytest.param(" 7 ", 7, id="padded"),
    ],
)
def test_csv_value_cells(tmp_path, cell, expected):
    """A CSV value cell reads as the int, float, exact Decimal or NULL its text spells (under binary64)."""
    spec = binary64_hours_spec()  # a CSV file of sums is refused under exact
    (tmp_path / "h.csv").write_text(f"sex,sum,count\nFemale,{cell},1\n")
    (row,) = read_reference({"hours_per_day_by_sex": str(tmp_path / "h.csv")}, spec)["hours_per_day_by_sex"]
    assert row["sum"] == expected and type(row["sum"]) is type(expected)


@pytest.mark.parametrize("cell", ["nan", "NaN", "inf", "-Infinity", "0.49999999999999994", "80.0", "N/A", ""])
@pytest.mark.parametrize("arithmetic", ["exact", "binary64"])
def test_csv_cells_follow_the_engine_rules_for_the_same_xcom_value(tmp_path, cell, arithmetic):
    """Under ``exact`` a CSV file of sums is refused with the same message whatever the cell (a float, NULL or the
    int 20); under ``binary64`` a cell has the outcome of the value XCom would carry: the float its text spells, or
    None (NULL) for text that is no number; NULL follows the ``nan`` policy, NaN and infinity ``non_finite``, and
    any other float is read, as for XCom."""
    spec = hours_spec() if arithmetic == "exact" else binary64_hours_spec()
    reference = {"hours_per_day_by_sex": str(tmp_path / "h.csv")}
    if arithmetic == "exact":  # refused from the suffix and the spec: the same refusal for every neighbouring cell
        refusals = []
        for text in (cell, "20"):
            (tmp_path / "h.csv").write_text(f"sex,sum,count\nFemale,{text},10\nMale,20,10\n")
            with pytest.raises(AirflowFailException, match=EXACT_CSV_REFUSAL) as caught:
                read_reference(reference, spec)
            refusals.append(str(caught.value))
        assert refusals[0] == refusals[1]
        return
    (tmp_path / "h.csv").write_text(f"sex,sum,count\nFemale,{cell},10\nMale,20,10\n")
    read = read_reference(reference, spec)
    try:
        via_xcom = float(cell)
    except ValueError:
        via_xcom = None
    xcom = {"hours_per_day_by_sex": [{"sex": "Female", "sum": via_xcom, "count": 10},
                                     {"sex": "Male", "sum": 20, "count": 10}]}
    assert repr(read) == repr(xcom)  # repr: a NaN is not equal to itself
    try:
        expected = prepare_inputs(spec, xcom)
    except ReleaseInputError as error:
        with pytest.raises(ReleaseInputError) as caught:
            prepare_inputs(spec, read)
        assert str(caught.value) == str(error)
        return
    prepared = prepare_inputs(spec, read)
    assert prepared.keys == expected.keys
    assert {k: v.tolist() for k, v in prepared.values.items()} == {k: v.tolist() for k, v in expected.values.items()}
    assert prepared.values[("hours_per_day_by_sex", "count")].tolist() == [10, 10]


def test_a_non_numeric_value_cell_is_null_not_a_refusal(tmp_path, caplog, capsys):
    """Whether the file is accepted never depends on a cell's value: text that is no number (pandas' ``na_rep``)
    is NULL, replaced by the ``nan`` policy (0 here) exactly as an empty cell is, and never echoed."""
    spec = binary64_hours_spec()  # a CSV file of sums is read under binary64 (refused under exact)
    prepared = {}
    for name, cell in (("text", SECRET), ("empty", "")):
        (tmp_path / f"{name}.csv").write_text(f"sex,sum,count\nFemale,{cell},0\nMale,2000,100\n")
        with caplog.at_level(logging.DEBUG):
            read = read_reference({"hours_per_day_by_sex": str(tmp_path / f"{name}.csv")}, spec)
        prepared[name] = prepare_inputs(spec, read)
    assert {k: v.tolist() for k, v in prepared["text"].values.items()} == {
        k: v.tolist() for k, v in prepared["empty"].values.items()}
    assert any(prepared["text"].values[("hours_per_day_by_sex", "sum")])
    assert SECRET not in caplog.text + capsys.readouterr().out


def test_value_columns_follow_the_kind_and_partition_selection():
    spec = parse_spec(
        AGE_SPEC.replace("keys: {age: " + str(list(range(17, 91))) + "}",
                         "partition_selection: {budget: {epsilon: 0.1, delta: 1e-6}}")
        .replace("kind: count", "kind: variance\n    bounds: [0, 99]"),
        source="variance spec",
    )
    assert value_columns(spec, spec.aggregates[0]) == ["sum", "count", "sum_squares", "units"]
    assert value_columns(age_spec(), age_spec().aggregates[0]) == ["count"]


def test_is_reference():
    assert is_reference("s3://bucket/aggregates.json")
    assert is_reference({"a": "file:///a.csv"})
    assert not is_reference({"a": [{"k": "x", "count": 1}]})
    assert not is_reference({})


def _refusal(tmp_path: Path, case: str):
    """Build the failing reference of ``case``; returns (reference, spec)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = hours_spec()
    name = spec.aggregates[0].name
    csv_file = tmp_path / "h.csv"
    csv_spec = binary64_hours_spec()  # a CSV file of sums is read under binary64 only: the refusal below is reached
    if case == "missing file":
        return {name: f"file://{tmp_path / 'absent.csv'}"}, csv_spec
    if case == "exact sums in csv":
        csv_file.write_text(f"sex,sum,count\n{SECRET},1,2\n")
        return {name: str(csv_file)}, spec
    if case == "unreadable parquet":
        (tmp_path / "h.parquet").write_bytes(SECRET.encode() * 10)
        return {name: str(tmp_path / "h.parquet")}, spec
    if case == "unreadable json":
        (tmp_path / "all.json").write_text('{"hours_per_day_by_sex": [' + SECRET)
        return str(tmp_path / "all.json"), spec
    if case == "json not an object":
        (tmp_path / "all.json").write_text(json.dumps([SECRET]))
        return str(tmp_path / "all.json"), spec
    if case == "unknown suffix":
        return {name: str(tmp_path / "h.txt")}, spec
    if case == "unknown aggregate":
        return {name: str(csv_file), SECRET: str(csv_file)}, spec
    if case == "missing aggregate":
        return {}, spec
    if case == "missing column csv":
        csv_file.write_text(f"sex,total,count\n{SECRET},1,2\n")
        return {name: str(csv_file)}, csv_spec
    if case == "headerless csv":
        csv_file.write_text(f"{SECRET},1,2\n")
        return {name: str(csv_file)}, csv_spec
    if case == "missing column parquet":
        pq.write_table(pa.table({"sex": [SECRET], "sum": [1]}), tmp_path / "h.parquet")
        return {name: str(tmp_path / "h.parquet")}, spec
    if case == "text column in parquet":
        pq.write_table(pa.table({"sex": ["Female"], "sum": [SECRET], "count": [2]}), tmp_path / "h.parquet")
        return {name: str(tmp_path / "h.parquet")}, spec
    if case == "float32 column in parquet":
        pq.write_table(pa.table({"sex": ["Female"], "sum": pa.array([1.5], pa.float32()), "count": [2]}),
                       tmp_path / "h.parquet")
        return {name: str(tmp_path / "h.parquet")}, spec
    if case == "ragged csv row":
        csv_file.write_text(f"sex,sum,count\nFemale,1,2,{SECRET}\n")
        return {name: str(csv_file)}, csv_spec
    if case == "empty csv":
        csv_file.write_text("")
        return {name: str(csv_file)}, csv_spec
    if case == "table file for a spec of several aggregates":
        from support import EXAMPLE_SPEC
        from dp_operators.spec import load_spec

        csv_file.write_text("a,count\nb,1\n")
        return str(csv_file), load_spec(EXAMPLE_SPEC)
    raise AssertionError(case)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        pytest.param("missing file", r"absent\.csv was not found; check the URI", id="missing file"),
        pytest.param("unreadable parquet", r"h\.parquet is not a readable Parquet file", id="unreadable Parquet"),
        pytest.param("unreadable json", r"all\.json is not a readable JSON file \(JSONDecodeError\)",
                     id="unreadable JSON"),
        pytest.param("json not an object", "holds a JSON list, not an object", id="JSON not an object"),
        pytest.param("unknown suffix", r"has suffix '\.txt'; name the file \.json, \.csv", id="unknown suffix"),
        pytest.param("unknown aggregate", r"names 1 name\(s\) that the spec does not release",
                     id="unknown aggregate name"),
        pytest.param("missing aggregate", r"misses \['hours_per_day_by_sex'\]", id="missing aggregate"),
        pytest.param("exact sums in csv", r"h\.csv\) is CSV, but its sums are declared exact .* Write it as Parquet",
                     id="exact sums in CSV"),
        pytest.param("missing column csv", r"h\.csv \(aggregate 'hours_per_day_by_sex'\) has no column 'sum';",
                     id="missing column (CSV)"),
        pytest.param("headerless csv", "has no column 'sex'; give one row per key with the columns",
                     id="CSV without a header"),
        pytest.param("missing column parquet", "has no column 'count'", id="missing column (Parquet)"),
        pytest.param("text column in parquet", "column 'sum' is of type string, not a number",
                     id="text column in Parquet"),
        pytest.param("float32 column in parquet", "column 'sum' is float, which holds neither",
                     id="float32 column in Parquet"),
        pytest.param("ragged csv row", "a row whose number of fields differs from its header", id="ragged CSV"),
        pytest.param("empty csv", "is empty; write a header row", id="empty CSV"),
        pytest.param("table file for a spec of several aggregates", "holds the rows of one aggregate, but the spec "
                     "releases 4", id="one CSV for four aggregates"),
    ],
)
def test_refusals_name_the_file_and_column_never_a_value(tmp_path, case, message, caplog, capsys):
    """Every refusal of a reference names the file (and column) but never a value, in its message or the logs."""
    reference, spec = _refusal(tmp_path, case)
    with caplog.at_level(logging.DEBUG), pytest.raises(AirflowFailException, match=message) as caught:
        read_reference(reference, spec)
    assert SECRET not in str(caught.value)
    error = caught.value  # no chained parser text (it can quote the file)
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert SECRET not in caplog.text and SECRET not in capsys.readouterr().out


def test_reading_logs_no_data_value(tmp_path, adult_csv, caplog, capsys):
    """Reading a CSV file of real sums and counts logs none of them."""
    spec, expected = binary64_hours_spec(), hours_per_day_by_sex(adult_csv)  # CSV sums: binary64 (exact refused)
    path = write_aggregate(tmp_path / "hours.csv", spec.aggregates[0], expected["hours_per_day_by_sex"])
    with caplog.at_level(logging.DEBUG):
        read_reference(f"file://{path}", spec)
    logged = caplog.text + capsys.readouterr().out
    for row in expected["hours_per_day_by_sex"]:
        assert str(row["sum"]) not in logged and str(row["count"]) not in logged
