"""Every type an upstream task commonly returns, as a key and as a value, under public keys and partition
selection: each is either released correctly or refused before any budget is reserved.

The case that shaped this module: a partition-selection key of type ``numpy.str_`` (as ``numpy.unique`` returns)
passed the input checks, noise was drawn, then the output check raised ``TypeError`` after the reservation; Airflow
retried (TypeError is not permanent) and charged again each time: epsilon 6 spent, nothing published.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dp_operators.release import (
    SATURATION,
    DiagnosticsReport,
    ReleaseAbortedError,
    ReleaseInputError,
    check_plain_json,
    prepare_inputs,
    run_release,
)
from dp_operators.release.upstream_types import UNPUBLISHABLE, normalise_key


class Colour(enum.Enum):
    RED = "a"


class Letter(enum.StrEnum):
    A = "a"


class Number(enum.IntEnum):
    ONE = 1


INTEGER_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
#: (upstream key, the key it is published as): str, int or None, exactly
ACCEPTED_KEYS = [
    pytest.param("a", "a", id="str"),
    pytest.param(np.str_("a"), "a", id="numpy.str_ (numpy.unique)"),
    pytest.param(Letter.A, "a", id="StrEnum"),
    pytest.param(Colour.RED, "a", id="Enum with a str value"),
    pytest.param(Number.ONE, 1, id="IntEnum"),
    pytest.param(1, 1, id="int"),
    *[pytest.param(dtype(1), 1, id=f"numpy.{dtype.__name__}") for dtype in INTEGER_DTYPES],
    pytest.param(dt.date(2024, 1, 31), "2024-01-31", id="date"),
    pytest.param(dt.datetime(2024, 1, 31, 12), "2024-01-31T12:00:00", id="datetime"),
    pytest.param(pd.Timestamp("2024-01-31 12:00"), "2024-01-31T12:00:00", id="pandas.Timestamp"),
    pytest.param(None, None, id="None (SQL NULL)"),
    pytest.param(pd.NA, None, id="pandas.NA"),
    pytest.param(pd.NaT, None, id="pandas.NaT"),
    pytest.param(float("nan"), None, id="float NaN (pandas object column)"),
    pytest.param(np.float64("nan"), None, id="numpy.float64 NaN"),
    # pandas makes an int key column float64 when one key is missing: an integral float is its int
    pytest.param(1.0, 1, id="float 1.0"),
    pytest.param(np.float64(1.0), 1, id="numpy.float64 1.0"),
    pytest.param(np.float32(1.0), 1, id="numpy.float32 1.0"),
    # a NUMERIC key column (PostgreSQL, Parquet decimal) arrives as Decimal
    pytest.param(Decimal("1"), 1, id="Decimal 1"),
    pytest.param(Decimal("NaN"), None, id="Decimal NaN"),
]
#: (upstream key, the type name the message must give)
REFUSED_KEYS = [
    pytest.param(b"a", "bytes", id="bytes"),
    pytest.param(bytearray(b"a"), "bytearray", id="bytearray"),
    pytest.param(True, "bool", id="bool"),
    pytest.param(np.bool_(True), "bool", id="numpy.bool_"),
    pytest.param(Fraction(1), "Fraction", id="Fraction"),
    pytest.param(np.datetime64("2024-01-31"), "numpy.datetime64", id="numpy.datetime64"),
    pytest.param(("a", 1), "tuple", id="tuple"),
    pytest.param(object(), "object", id="object"),
]


def values_by_key(output: dict) -> dict:
    return {row["k"]: row["value"] for row in output["aggregates"]["x"]["rows"]}


@pytest.mark.parametrize(("upstream_key", "published"), ACCEPTED_KEYS)
def test_a_key_of_a_common_type_is_released_under_public_keys(upstream_key, published, build_spec, public_keys,
                                                               approx_ledger, release_key):
    """10,000 people with the key: its cell is about 10,000 (noise scale 1: |Z| > 60 has probability e^-60), every
    other cell about 0; a NULL key is outside the public domain, so every cell is about 0."""
    spec = build_spec()
    output = run_release(spec, {"x": [{"k": upstream_key, "count": 10_000}]}, approx_ledger, release_key(),
                         spec_hash="0" * 64).output
    check_plain_json(output)
    values = values_by_key(output)
    assert list(values) == public_keys
    for cell, value in values.items():
        truth = 10_000 if cell == published else 0
        assert abs(value - truth) <= 60, cell


@pytest.mark.parametrize(("upstream_key", "published"), ACCEPTED_KEYS)
def test_a_key_of_a_common_type_is_published_as_plain_json_under_partition_selection(
    upstream_key, published, build_spec, approx_ledger, release_key
):
    """10,000 units with the key pass the threshold (28) with certainty; the key is published as a plain str, int
    or None (a numpy.str_ key must never fail the output check after the reservation)."""
    output = run_release(build_spec(selection=True), {"x": [{"k": upstream_key, "count": 10_000}]}, approx_ledger,
                         release_key(), spec_hash="0" * 64).output
    (row,) = output["aggregates"]["x"]["rows"]
    assert row["k"] == published and type(row["k"]) is type(published)
    assert abs(row["value"] - 10_000) <= 60
    json.dumps(output, allow_nan=False)
    assert [charge["state"] for charge in approx_ledger.charges()] == ["committed"]


@pytest.mark.parametrize("selection", [pytest.param(False, id="public keys"), pytest.param(True, id="selection")])
@pytest.mark.parametrize(("upstream_key", "type_name"), REFUSED_KEYS)
def test_a_key_of_a_refused_type_is_refused_before_any_reservation(upstream_key, type_name, selection, build_spec,
                                                                    approx_ledger, release_key):
    rows = [{"k": "a", "count": 5}, {"k": upstream_key, "count": 10_000}]
    with pytest.raises(ReleaseInputError) as refused:
        run_release(build_spec(selection=selection), {"x": rows}, approx_ledger, release_key(), spec_hash="0" * 64)
    message = str(refused.value)
    assert f"aggregate 'x': a row's key column 'k' holds a {type_name}" in message or (
        f"key column 'k' holds {type_name}" in message and "decode it upstream" in message
    )
    assert "row 1" not in message and "10000" not in message
    assert list(approx_ledger.charges()) == []


def exact_units(spec, value, field="count", **row) -> int:
    """The grid units ``prepare_inputs`` reads for one row of key 'a' holding ``value`` in ``field``."""
    prepared = prepare_inputs(spec, {"x": [{"k": "a", field: value, **row}]})
    return prepared.values[("x", field)][0]


#: (count value, its count in units): exact reading, then round half up (floor(x + 1/2)); NaN/None/inf -> 0
#: (the default policy: replace with 0); values beyond 2^62 saturate
COUNT_VALUES = [
    pytest.param(7, 7, id="int"),
    *[pytest.param(dtype(7), 7, id=f"numpy.{dtype.__name__}") for dtype in INTEGER_DTYPES],
    pytest.param(np.uint64(2**64 - 1), SATURATION, id="numpy.uint64 max: saturates, never wraps"),
    pytest.param(Decimal("7"), 7, id="Decimal"),
    pytest.param(Decimal("7.5"), 8, id="Decimal 7.5 rounds half up"),
    pytest.param(Decimal("NaN"), 0, id="Decimal NaN"),
    pytest.param(Decimal("sNaN"), 0, id="Decimal sNaN"),
    pytest.param(Decimal("Infinity"), 0, id="Decimal Infinity"),
    pytest.param(Decimal("1E+999999999"), SATURATION, id="Decimal 1E+999999999 saturates without expanding"),
    pytest.param(Decimal("1E-999999999"), 0, id="Decimal 1E-999999999 is 0"),
    pytest.param(Fraction(29, 4), 7, id="Fraction 29/4"),
    pytest.param(7.0, 7, id="float"),
    pytest.param(7.5, 8, id="float 7.5"),
    pytest.param(np.float64(7.5), 8, id="numpy.float64"),
    pytest.param(np.longdouble(7.5), 8, id="numpy.longdouble"),
    pytest.param(float(2**60), 2**60, id="float 2^60 read as its binary value, not its repr 1.152921504606847e+18"),
    pytest.param(float("nan"), 0, id="float NaN"),
    pytest.param(float("inf"), 0, id="float inf"),
    pytest.param(None, 0, id="None"),
    pytest.param(pd.NA, 0, id="pandas.NA"),
    pytest.param(pd.NaT, 0, id="pandas.NaT"),
]


@pytest.mark.parametrize(("value", "units"), COUNT_VALUES)
def test_a_count_of_a_common_type_is_read_exactly(value, units, build_spec):
    assert exact_units(build_spec(), value) == units


#: (sum value, its units on grid 1/2): floor(2 x + 1/2); NaN/None/inf -> 0
EXACT_SUM_VALUES = [
    pytest.param(7, 14, id="int"),
    *[pytest.param(dtype(7), 14, id=f"numpy.{dtype.__name__}") for dtype in INTEGER_DTYPES],
    pytest.param(Decimal("2.25"), 5, id="Decimal 2.25 (SQL NUMERIC)"),
    pytest.param(Decimal("-Infinity"), 0, id="Decimal -Infinity"),
    pytest.param(Decimal("NaN"), 0, id="Decimal NaN"),
    # binary64 would read 1234567890123456.25 (spacing 1/4 there) and round 2 x + 1/2 up to ...913
    pytest.param(Decimal("1234567890123456.2"), 2469135780246912, id="Decimal beyond float precision"),
    pytest.param(Fraction(9, 4), 5, id="Fraction 9/4"),
    pytest.param(None, 0, id="None (SUM over no rows)"),
    pytest.param(pd.NA, 0, id="pandas.NA"),
]


@pytest.mark.parametrize(("value", "units"), EXACT_SUM_VALUES)
def test_a_sum_of_an_exact_type_is_read_exactly(value, units, build_spec):
    assert exact_units(build_spec("sum"), value, "sum") == units


@pytest.mark.parametrize("value", [
    pytest.param(7.5, id="float"),
    pytest.param(np.float64(7.5), id="numpy.float64"),
    pytest.param(np.longdouble(7.5), id="numpy.longdouble"),
    pytest.param(float(2**53 + 2), id="an integral float beyond 2^53"),
    pytest.param(float("inf"), id="float inf"),
])
def test_a_binary_float_sum_is_refused_under_exact_arithmetic_by_its_type(value, build_spec):
    with pytest.raises(ReleaseInputError, match="upstream.arithmetic is 'exact'.*Casacuberta") as refused:
        prepare_inputs(build_spec("sum"), {"x": [{"k": "a", "sum": value}]})
    assert "binary64" in str(refused.value) and "Decimal" in str(refused.value)


#: (value, units on grid 1/2) under upstream.arithmetic binary64: the float's exact binary value
BINARY64_SUM_VALUES = [
    pytest.param(2.25, 5, id="float"),
    pytest.param(np.float64(2.25), 5, id="numpy.float64"),
    pytest.param(0.1 + 0.2, 1, id="0.1 + 0.2 = 0.30000000000000004"),
    pytest.param(float("nan"), 0, id="float NaN follows the policy"),
    pytest.param(Decimal("2.25"), 5, id="an exact type is still read exactly"),
]


@pytest.mark.parametrize(("value", "units"), BINARY64_SUM_VALUES)
def test_a_binary_float_sum_is_read_as_its_binary_value_under_binary64(value, units, build_spec):
    spec = build_spec("sum", upstream={"arithmetic": "binary64", "max_rows": 10})
    assert exact_units(spec, value, "sum") == units


@pytest.mark.parametrize("value", [
    pytest.param(8.0, id="float"),
    pytest.param(np.float64(-8.0), id="numpy.float64"),
    pytest.param(float(2**53), id="2^53, the largest run of consecutive integers in a double"),
    pytest.param(float("nan"), id="NaN"),
    pytest.param(float("inf"), id="inf"),
])
def test_an_integral_or_special_float_sum_is_refused_by_its_type_under_exact_arithmetic(value, build_spec):
    """Under exact arithmetic a float sum is refused by its type whatever its value: reading an integral float while
    refusing 8.5 (or inf) would make the refusal depend on a value, and an integral float above 2^52 needs a float
    allowance (docs/adr/0017)."""
    spec = build_spec("sum", grid=1)
    with pytest.raises(ReleaseInputError, match="upstream.arithmetic is 'exact': a float sum is refused by its type"):
        exact_units(spec, value, "sum")


def test_a_float_nan_sum_is_sql_null_under_binary64(build_spec):
    """pandas shows SQL's NULL (a LEFT JOIN's empty group) as NaN: under binary64 arithmetic it follows the nan policy
    (replace by 0 here), as None does."""
    spec = build_spec("sum", upstream={"arithmetic": "binary64", "max_rows": 10})
    assert exact_units(spec, float("nan"), "sum") == exact_units(spec, None, "sum") == 0


def test_a_binary64_sum_is_its_exact_binary_value_not_its_shortest_decimal(build_spec):
    """1e23 is 10^23 - 2^23 in binary64; on grid 2^20 that is 95367431640625000 - 8 units (the decimal reading of
    exact_number would give 95367431640625000)."""
    spec = build_spec("sum", upstream={"arithmetic": "binary64", "max_rows": 10}, grid=2**20, bounds=[0, 10**15])
    assert exact_units(spec, 1e23, "sum") == 95367431640625000 - 8


#: (value, the type name the message gives)
REFUSED_VALUES = [
    pytest.param("7", "str", id="str"),
    pytest.param(b"7", "bytes", id="bytes"),
    pytest.param(True, "bool", id="bool"),
    pytest.param(np.bool_(True), "bool", id="numpy.bool_"),
    pytest.param(dt.date(2024, 1, 31), "date", id="date"),
    pytest.param(dt.datetime(2024, 1, 31), "datetime", id="datetime"),
    pytest.param(np.datetime64("2024-01-31"), "numpy.datetime64", id="numpy.datetime64"),
    pytest.param(np.float16(7), "numpy.float16", id="numpy.float16 (counts above 2048 are not exact)"),
    pytest.param(np.float32(7), "numpy.float32", id="numpy.float32 (counts above 2^24 are not exact)"),
    pytest.param([7], "list", id="list"),
    pytest.param(complex(7), "complex", id="complex"),
    pytest.param(Colour.RED, "Colour", id="Enum"),
]


@pytest.mark.parametrize("selection", [pytest.param(False, id="public keys"), pytest.param(True, id="selection")])
@pytest.mark.parametrize("field", ["count", "sum"])
@pytest.mark.parametrize(("value", "type_name"), REFUSED_VALUES)
def test_a_value_of_a_refused_type_is_refused_before_any_reservation(value, type_name, field, selection, build_spec,
                                                                      approx_ledger, release_key):
    kind = "count" if field == "count" else "sum"
    spec = build_spec(kind, selection=selection)
    extra = {"units": 1} if selection and kind == "sum" else {}
    rows = [{"k": "a", field: 5, **extra}, {"k": "b", field: value, **extra}]
    with pytest.raises(ReleaseInputError) as refused:
        run_release(spec, {"x": rows}, approx_ledger, release_key(), spec_hash="0" * 64)
    message = str(refused.value)
    assert f"aggregate 'x': a row's field '{field}' holds a {type_name}" in message
    assert "row 1" not in message
    assert list(approx_ledger.charges()) == []


@pytest.mark.parametrize("selection", [pytest.param(False, id="public keys"), pytest.param(True, id="selection")])
def test_every_accepted_type_together_is_released_and_committed(selection, build_spec, approx_ledger, release_key):
    """One release mixing every accepted key and value type: one committed charge, plain JSON out."""
    spec = build_spec("mean", selection=selection, per_partition=1)
    rows = [
        {"k": np.str_("a"), "sum": Decimal("2.5"), "count": np.int64(4), "units": 4},
        {"k": Letter.A, "sum": 3, "count": 2.0, "units": np.int32(2)},
        {"k": Number.ONE, "sum": Fraction(1, 2), "count": np.uint8(1), "units": 1},
        {"k": dt.date(2024, 1, 31), "sum": None, "count": Decimal("3"), "units": Decimal("3")},
        {"k": pd.NA, "sum": pd.NA, "count": pd.NA, "units": 1},
    ]
    output = run_release(spec, {"x": rows}, approx_ledger, release_key(), spec_hash="0" * 64).output
    check_plain_json(output)
    for row in output["aggregates"]["x"]["rows"]:
        assert row["k"] is None or type(row["k"]) in (str, int)
    assert [charge["state"] for charge in approx_ledger.charges()] == ["committed"]


def test_numpy_unique_keys_are_released_once_and_charged_once(build_spec, approx_ledger, release_key):
    """Keys and counts straight from ``numpy.unique`` (numpy.str_, numpy.int64) are released once and charged once."""
    cities = np.array(["Oslo", "Oslo", "Bergen"] * 5_000)
    keys, counts = np.unique(cities, return_counts=True)  # numpy.str_ keys and numpy.int64 counts
    rows = [{"k": k, "count": c} for k, c in zip(keys, counts)]
    output = run_release(build_spec(selection=True), {"x": rows}, approx_ledger, release_key(),
                         spec_hash="0" * 64).output
    assert [type(row["k"]) for row in output["aggregates"]["x"]["rows"]] == [str, str]
    assert [charge["state"] for charge in approx_ledger.charges()] == ["committed"]


def test_a_failure_after_the_reservation_is_permanent_and_keeps_the_charge(build_spec, approx_ledger, release_key,
                                                                            monkeypatch):
    """Any exception between the reservation and the commit becomes ReleaseAbortedError (constant text + type):
    the operator fails without retry, so a deterministic failure is charged once, not once per try."""
    import dp_operators.release.run as engine

    def publish_fails(*args, **kwargs):
        raise TypeError("release.aggregates.x.rows[0].k: str_ is not plain JSON (value 'Oslo')")

    monkeypatch.setattr(engine, "publish_aggregate", publish_fails)
    with pytest.raises(ReleaseAbortedError) as aborted:
        run_release(build_spec(selection=True), {"x": [{"k": "Oslo", "count": 10_000}]}, approx_ledger,
                    release_key(), spec_hash="0" * 64)
    message = str(aborted.value)
    assert "(TypeError)" in message and "charge stays spent" in message and "Oslo" not in message
    assert isinstance(aborted.value.__cause__, TypeError)
    assert [charge["state"] for charge in approx_ledger.charges()] == ["abandoned"]  # spent: noise was drawn


def test_a_refused_type_gives_the_same_message_on_neighbouring_inputs(build_spec, observe):
    """Neighbours: one more person with a key before the malformed row. The refusal text and the logs must not
    move with the row's index (which counts the rows before it)."""
    bad = {"k": b"Oslo", "count": 3}
    first = observe(build_spec(selection=True), {"x": [{"k": "Bergen", "count": 40}, bad]})
    second = observe(build_spec(selection=True),
                     {"x": [{"k": "Bergen", "count": 41}, {"k": "Tromso", "count": 1}, bad]})
    assert first[0] is not None and first[0].startswith("ReleaseInputError")
    assert first[:3] == second[:3]


def test_the_report_gives_the_row_index_the_message_withholds(build_spec):
    report = DiagnosticsReport("input_types")
    rows = [{"k": "a", "count": 1}, {"k": "b", "count": 2}, {"k": b"c", "count": 3}]
    with pytest.raises(ReleaseInputError):
        prepare_inputs(build_spec(selection=True), {"x": rows}, diagnostics=report)
    (problem,) = report.aggregates["x"].problems
    assert (problem.row, problem.field) == (2, "k")


def test_int_keys_against_a_string_domain_are_refused_not_dropped(tmp_path):
    """Zip codes read as int lose their leading zeros (2139 is not '02139'): silently dropping every such row would
    publish noised zeros and spend the budget. The key's type appears nowhere in the column's domain, so the
    release refuses it before reserving, by type alone."""
    from dp_operators.ledger import ReleaseKey
    from dp_operators.spec import ReleaseSpec
    from support import make_ledger

    spec = ReleaseSpec.model_validate({"version": 1, "release": "zips", "budget_account": "acct",
                                       "privacy_unit": "person", "aggregates": [{
                                           "name": "x", "kind": "count", "group_by": ["zip"],
                                           "keys": {"zip": ["02139", "10001"]}, "mechanism": "discrete_laplace",
                                           "budget": {"epsilon": 1}}]})
    ledger = make_ledger(tmp_path / "l.db", cap="10", accountant="pure_dp", dags=("dag",), account="acct")
    key = ReleaseKey(dag_id="dag", run_id="r", task_id="t", map_index=-1, release_name="zips")
    with pytest.raises(ReleaseInputError, match=r"holds int keys but the spec's public domain lists only str"):
        run_release(spec, {"x": [{"zip": np.int64(2139), "count": 5}]}, ledger, key, spec_hash="0" * 64)
    assert list(ledger.charges()) == []
    released = run_release(spec, {"x": [{"zip": "02139", "count": 5}]}, ledger, key, spec_hash="0" * 64)
    assert [row["zip"] for row in released.output["aggregates"]["x"]["rows"]] == ["02139", "10001"]


def test_a_midnight_timestamp_is_its_date():
    """pandas holds a date column as midnight Timestamps; the spec lists dates as '2026-01-05'."""
    pandas = pytest.importorskip("pandas")
    from dp_operators.release.upstream_types import normalise_key

    assert normalise_key(pandas.Timestamp("2026-01-05"), "day") == "2026-01-05"
    assert normalise_key(dt.datetime(2026, 1, 5), "day") == "2026-01-05"
    assert normalise_key(dt.datetime(2026, 1, 5, 12, 30), "day") == "2026-01-05T12:30:00"
    assert normalise_key(pandas.Timestamp("2026-01-05", tz="UTC"), "day") == "2026-01-05T00:00:00+00:00"


@pytest.mark.parametrize("upstream_key", [
    pytest.param(1.5, id="a non-integral float"),
    pytest.param(float("inf"), id="an infinite float"),
    pytest.param("caf\udce9", id="a str with a lone surrogate (surrogateescape)"),
    pytest.param(10**1500, id="an int of 1500 digits"),
])
@pytest.mark.parametrize("selection", [pytest.param(False, id="public keys"), pytest.param(True, id="selection")])
def test_a_key_no_release_can_publish_ignores_its_row_and_is_never_refused(upstream_key, selection, build_spec,
                                                                             approx_ledger, release_key):
    """Deciding by the value would make a refusal depend on one row (DESIGN.md 2.4), and letting the value through
    fails at the ledger's commit, after the noise (a charge per retry): the row is ignored like a
    key outside the domain, and counted in the diagnostics."""
    rows = [{"k": 1, "count": 5}, {"k": upstream_key, "count": 7}]
    reports = []
    released = run_release(build_spec(selection=selection), {"x": rows}, approx_ledger, release_key(),
                            spec_hash="0" * 64, diagnostics=reports.append)
    keys = [row["k"] for row in released.output["aggregates"]["x"].get("rows", [])]
    assert all(type(k) in (str, int) and (type(k) is int or k.isprintable()) for k in keys)
    assert reports[0].aggregates["x"].rows_unpublishable_key == 1
    assert [c["state"] for c in approx_ledger.charges()] == ["committed"]


def test_a_failure_of_the_commit_after_the_noise_is_permanent_and_keeps_the_charge(
    build_spec, approx_ledger, release_key, monkeypatch
):
    """Anything but a ledger refusal raised by the commit comes after the noise: the charge stays spent and the
    error is permanent (a retry would charge again)."""
    def broken(reservation, output, **kwargs):
        raise UnicodeEncodeError("utf-8", "x", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(approx_ledger, "commit", broken)
    with pytest.raises(ReleaseAbortedError) as aborted:
        run_release(build_spec(), {"x": [{"k": "a", "count": 5}]}, approx_ledger, release_key(), spec_hash="0" * 64)
    assert aborted.value.budget_returned is False
    assert [c["state"] for c in approx_ledger.charges()] == ["abandoned"]


def test_a_nan_key_in_a_text_column_is_the_null_group_not_an_int(build_spec, approx_ledger, release_key):
    """pandas puts a float NaN where a text key is missing (read_csv, groupby(dropna=False)): a float decides no key
    type, so the neighbour with one such row is released like the dataset without it (never refused as 'int keys')."""
    spec = build_spec()
    spec = spec.model_copy(update={"aggregates": [spec.aggregates[0].model_copy(update={"keys": {"k": ["a", "b"]}})]})
    for rows in ([{"k": "a", "count": 3}], [{"k": "a", "count": 3}, {"k": float("nan"), "count": 1}]):
        run_release(spec, {"x": rows}, approx_ledger, release_key(f"run-{len(rows)}"), spec_hash="0" * 64)
    assert [c["state"] for c in approx_ledger.charges()] == ["committed", "committed"]


def test_a_dropped_row_is_still_type_checked(build_spec):
    """A NaN whose policy drops the row must not skip the type check of the row's other fields: the refusal would
    then depend on whether every such row happened to be dropped."""
    spec = build_spec("variance", non_finite={"nan": "drop"})  # fields read in order sum, count, sum_squares
    with pytest.raises(ReleaseInputError, match="field 'sum_squares' holds a float"):
        prepare_inputs(spec, {"x": [{"k": "a", "sum": None, "count": 1, "sum_squares": 2.5}]})


def test_a_ledger_that_cannot_return_the_reservation_keeps_the_abort_permanent(
    build_spec, approx_ledger, release_key, monkeypatch
):
    """No noise drawn, but the ledger fails to release: the charge stays spent (safe) and the error stays the
    permanent abort, not the ledger's retryable database error (a retry would charge again)."""
    import dp_operators.release.run as engine

    def no_noise(*args, **kwargs):
        raise RuntimeError("bug before any sampler")

    def broken_release(reservation, **kwargs):
        raise ConnectionError("ledger gone")

    monkeypatch.setattr(engine, "draw_noise", no_noise)
    monkeypatch.setattr(approx_ledger, "release", broken_release)
    with pytest.raises(ReleaseAbortedError) as aborted:
        run_release(build_spec(), {"x": [{"k": "a", "count": 5}]}, approx_ledger, release_key(), spec_hash="0" * 64)
    assert aborted.value.budget_returned is False
    assert [c["state"] for c in approx_ledger.charges()] == ["reserved"]  # the ledger could not be reached: the lease expires, the charge stays spent


@pytest.mark.parametrize(
    ("key", "expected"),
    [(Decimal("17"), 17), (Decimal("17.000"), 17), (Decimal("1.7E+1"), 17), (Decimal("-3"), -3),
     (Decimal("NaN"), None), (Decimal("sNaN"), None)],
)
def test_an_integral_decimal_key_is_its_int_and_a_decimal_nan_the_null_group(key, expected):
    """NUMERIC key columns (PostgreSQL, Parquet decimal) arrive as Decimal; they read like integral floats."""
    assert normalise_key(key, "age") == expected


@pytest.mark.parametrize("key", [Decimal("17.5"), Decimal("Infinity"), Decimal("-Infinity"), Decimal("1E+2000")])
def test_a_decimal_key_no_release_can_publish_is_ignored_not_refused(key):
    assert normalise_key(key, "age") is UNPUBLISHABLE
