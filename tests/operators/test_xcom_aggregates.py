"""NaN, infinities and exact decimals through Airflow's XCom: ``aggregates_for_xcom`` in the upstream task, unwrapped by
the release operator (docs/adr/0014). Each value goes through what Airflow does to a return value: its serializer
(``airflow.sdk.serde``) and the strict JSON of the request to its API server."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk.serde import deserialize, serialize
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.upstream import pull_return_value
from dp_operators.operators.xcom_aggregates import (
    XComAggregatesError,
    aggregates_for_xcom,
    aggregates_from_xcom,
    is_xcom_aggregates,
)

from airflow_fakes import FakeTaskInstance, context_for
from operator_ledgers import connect_ledger
from support import make_ledger

SPEC = Path(__file__).resolve().parent.parent / "integration" / "special_values_dags" / "special_values.yaml"
#: Airflow's message when a return value holds a NaN or an infinity (the JSON body of its XCom request).
AIRFLOW_MESSAGE = "Out of range float values are not JSON compliant"


def through_xcom(value):
    """``value`` as the release task pulls it: Airflow's serializer, strict JSON (what the task SDK's HTTP client
    sends: ``allow_nan=False``), back."""
    return deserialize(json.loads(json.dumps(serialize(value), allow_nan=False)))


def special_aggregates(nan=float("nan"), infinity=float("inf"), minus_infinity=float("-inf"),
                       decimal_nan=Decimal("NaN")) -> dict:
    """The aggregates of ``special_values.yaml``: NaN counts (float and Decimal), infinite binary64 sums, a Decimal
    NaN exact sum; or finite neighbours of the same types."""
    return {
        "people": [{"city": "a", "count": nan}, {"city": "b", "count": 30}, {"city": "c", "count": decimal_nan}],
        "income": [{"city": "a", "sum": infinity}, {"city": "b", "sum": minus_infinity}, {"city": "c", "sum": 900.5}],
        "hours": decimal_nan,
    }


FINITE = dict(nan=7.0, infinity=500.0, minus_infinity=20.0, decimal_nan=Decimal("12.5"))


def same(a, b) -> bool:
    """Equal values of the same type, NaN equal to NaN (with the same sign and signalling flag for a Decimal)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, (float, np.floating)) and math.isnan(a):
        return math.isnan(b)
    return a == b


@pytest.mark.parametrize("value, expected", [
    pytest.param(float("nan"), float("nan"), id="float NaN"),
    pytest.param(float("inf"), float("inf"), id="float inf"),
    pytest.param(float("-inf"), float("-inf"), id="float -inf"),
    pytest.param(np.float64("nan"), float("nan"), id="numpy float64 NaN as a float"),
    pytest.param(np.float64("-inf"), float("-inf"), id="numpy float64 -inf as a float"),
    pytest.param(0.1, 0.1, id="finite float"),
    pytest.param(-0.0, -0.0, id="negative zero"),
    pytest.param(Decimal("NaN"), Decimal("NaN"), id="Decimal NaN"),
    pytest.param(Decimal("-sNaN"), Decimal("-sNaN"), id="Decimal signalling NaN"),
    pytest.param(Decimal("Infinity"), Decimal("Infinity"), id="Decimal Infinity"),
    pytest.param(Decimal("-Infinity"), Decimal("-Infinity"), id="Decimal -Infinity"),
    pytest.param(Decimal("12345678901234567.89"), Decimal("12345678901234567.89"), id="Decimal of 19 digits"),
    pytest.param(Decimal("1E+999999999"), Decimal("1E+999999999"), id="Decimal beyond any float"),
    pytest.param(Fraction(1, 3), Fraction(1, 3), id="Fraction"),
    pytest.param(2**200, 2**200, id="int beyond int64"),
    pytest.param(np.int64(-7), -7, id="numpy int64 as an int"),
    pytest.param(np.float32("nan"), np.float32("nan"), id="numpy float32 NaN keeps its type"),
    pytest.param(np.longdouble(1) / 3, np.longdouble(1) / 3, id="numpy longdouble keeps its digits"),
    pytest.param(None, None, id="None"),
    pytest.param(pd.NA, None, id="pandas NA as None"),
    pytest.param(pd.NaT, None, id="pandas NaT as None"),
])
def test_a_value_crosses_airflows_xcom_with_its_type(value, expected):
    """Each value reaches the release as the engine reads it: same type, same exact value, NaN and infinities
    included."""
    (row,) = aggregates_from_xcom(through_xcom(aggregates_for_xcom({"x": [{"key": "a", "sum": value}]})))["x"]
    assert same(row["sum"], expected), (row["sum"], expected)


def test_the_issues_raw_nan_fails_airflows_xcom_where_the_wrapped_one_passes():
    """A NaN count and a Decimal NaN returned as they are fail Airflow's XCom JSON (the upstream task's failure);
    wrapped, the same mapping passes."""
    raw = {"rows": [{"key": "a", "value": float("nan")}], "total": Decimal("NaN")}
    with pytest.raises(ValueError, match=AIRFLOW_MESSAGE):
        through_xcom({"rows": raw["rows"]})
    with pytest.raises(ValueError, match=AIRFLOW_MESSAGE):
        through_xcom({"total": raw["total"]})
    pulled = aggregates_from_xcom(through_xcom(aggregates_for_xcom(raw)))
    assert same(pulled["rows"][0]["value"], float("nan")) and same(pulled["total"], Decimal("NaN"))


def test_a_decimal_through_plain_xcom_loses_digits_that_the_wrapped_one_keeps():
    """Airflow's serializer sends a Decimal as a binary float: 19 significant digits arrive rounded."""
    exact = Decimal("12345678901234567.89")
    assert through_xcom({"s": exact})["s"] != exact
    assert aggregates_from_xcom(through_xcom(aggregates_for_xcom({"s": exact})))["s"] == exact


def test_a_special_value_is_encoded_whatever_its_neighbours_are():
    """Only the changed value's encoding differs between two mappings that differ in one value: the encoding of a
    value depends on its type and itself, never on the other values."""
    special, finite = aggregates_for_xcom(special_aggregates()), aggregates_for_xcom(special_aggregates(**FINITE))
    people = special["aggregates"]["people"], finite["aggregates"]["people"]
    assert people[0][1] == people[1][1] == {"city": "b", "count": 30}
    assert special["aggregates"]["income"][2] == finite["aggregates"]["income"][2] == {"city": "c", "sum": 900.5}
    assert finite["aggregates"]["people"][0]["count"] == 7.0
    assert finite["aggregates"]["hours"] == {"__dp_number__": "decimal", "text": "12.5"}


def test_finite_floats_ints_and_keys_stay_readable_json():
    """What Airflow's XCom tab shows of a wrapped value: plain numbers and keys, tags only where JSON has no type."""
    wrapped = aggregates_for_xcom({"people": [{"city": "a", "count": 12}, {"city": "b", "count": 2.5}]})
    assert wrapped == {"__dp_operators_aggregates__": 1,
                       "aggregates": {"people": [{"city": "a", "count": 12}, {"city": "b", "count": 2.5}]}}


@pytest.mark.parametrize("value", [
    pytest.param({"people": [{"city": "a", "__dp_number__": 1}]}, id="a column named like the tag"),
    pytest.param(aggregates_for_xcom({"people": 1}), id="a value wrapped twice"),
])
def test_a_mapping_using_a_reserved_key_is_refused_by_the_key(value):
    with pytest.raises(XComAggregatesError, match="uses the reserved key"):
        aggregates_for_xcom(value)


@pytest.mark.parametrize("value", [
    pytest.param({"people": [{"city": "a", "count": 3}]}, id="a mapping"),
    pytest.param("s3://bucket/aggregates.parquet", id="a reference"),
    pytest.param(None, id="nothing"),
])
def test_a_value_returned_without_the_wrapper_is_read_unchanged(value):
    assert not is_xcom_aggregates(value)
    assert aggregates_from_xcom(value) is value


def envelope_of(number: dict) -> dict:
    return {"__dp_operators_aggregates__": 1, "aggregates": {"s": number}}


@pytest.mark.parametrize("envelope, message", [
    pytest.param({"__dp_operators_aggregates__": 2, "aggregates": {}}, "encoded by a newer dp_operators",
                 id="a newer encoding"),
    pytest.param(envelope_of({"__dp_number__": "float", "text": "8675309"}), "of kind 'float' cannot be read",
                 id="a float that is not NaN or an infinity"),
    pytest.param(envelope_of({"__dp_number__": "decimal", "text": "8675309x"}), "of kind 'decimal' cannot be read",
                 id="a malformed Decimal"),
    pytest.param(envelope_of({"__dp_number__": "8675309", "text": "1"}), "of an unknown kind cannot be read",
                 id="an unknown kind"),
])
def test_an_envelope_this_version_did_not_write_fails_the_release_without_echoing_it(envelope, message):
    """The release fails (no retry) naming the upstream task; the text of the value is withheld."""
    op = DPReleaseOperator(task_id="release", spec_path=SPEC, aggregates_task_id="compute_aggregates")
    with pytest.raises(AirflowFailException, match=message) as failed:
        pull_return_value(op, context_for(FakeTaskInstance(envelope)), "compute_aggregates")
    assert "the return value of task 'compute_aggregates'" in str(failed.value)
    assert "8675309" not in str(failed.value)


@pytest.fixture
def special_values_operator(tmp_path, monkeypatch):
    """The release of ``special_values.yaml`` on a fresh ledger, its diagnostics beside the output; returns a
    function running it on a run id and an upstream value: (output, diagnostics, charge amount)."""
    ledger = make_ledger(tmp_path / "ledger.db", cap="100", accountant="pure_dp", dags=("adult_census_release",),
                         account="special_values_test")
    connect_ledger(monkeypatch, "dp_ledger_test", tmp_path / "ledger.db")

    def release(run_id: str, upstream) -> tuple[dict, dict, Fraction]:
        op = DPReleaseOperator(task_id="release", spec_path=SPEC, aggregates_task_id="compute_aggregates",
                               output_uri=f"file://{tmp_path / 'out'}",
                               diagnostics_uri=f"file://{tmp_path / 'private'}", ledger_conn_id="dp_ledger_test")
        output = op.execute(context_for(FakeTaskInstance(upstream, run_id=run_id)))
        (report,) = (tmp_path / "private").rglob(f"{run_id}/release~diagnostics.json")
        (charge,) = [c for c in ledger.charges() if c["run_id"] == run_id]
        assert charge["state"] == "committed"
        return output, json.loads(report.read_text())["aggregates"], Fraction(charge["amount"])

    return release


def test_the_release_reads_wrapped_nan_and_infinities_and_applies_the_spec_policies(special_values_operator):
    """NaN counts (float and Decimal) are replaced by 0, infinite binary64 sums dropped (``infinity: drop``), the
    Decimal NaN exact sum replaced by 0: the release succeeds and its diagnostics record each special value."""
    output, seen, charge = special_values_operator("nan", through_xcom(aggregates_for_xcom(special_aggregates())))
    assert seen["people"]["special_values"] == {"count": {"nan": 2}}
    assert seen["income"]["special_values"] == {"sum": {"infinity": 2}} and seen["income"]["rows_dropped"] == 2
    assert seen["hours"]["special_values"] == {"sum": {"nan": 1}}
    assert [row["city"] for row in output["aggregates"]["income"]["rows"]] == ["a", "b", "c"]
    assert charge == 3


def test_a_finite_neighbour_publishes_the_same_fields_at_the_same_charge(special_values_operator):
    """The release of the special values and of finite values of the same types: no refusal either way, the same
    published fields and keys, the same charge (DESIGN.md 2.4)."""

    def shape(output: dict) -> dict:
        return {name: (sorted(aggregate), [(row.get("city"), sorted(row)) for row in aggregate.get("rows", [])])
                for name, aggregate in output["aggregates"].items()}

    special = special_values_operator("nan", through_xcom(aggregates_for_xcom(special_aggregates())))
    finite = special_values_operator("finite", through_xcom(aggregates_for_xcom(special_aggregates(**FINITE))))
    assert finite[1]["people"]["special_values"] == {} and finite[1]["income"]["rows_dropped"] == 0
    assert shape(special[0]) == shape(finite[0])
    assert special[2] == finite[2] == 3


@pytest.mark.parametrize("value", [
    pytest.param(Fraction(1, 3**9000), id="a fraction of 4,300+ digits"),
    pytest.param(-(10**5000) - 7, id="an int of 5,000 digits"),
    pytest.param(2**63, id="an int just past int64"),
])
def test_a_value_of_any_size_crosses_xcom_whole(value):
    """Whether the release runs never depends on how large a value is: CPython refuses decimal int <-> str beyond
    4,300 digits, so large ints and fractions travel in hexadecimal."""
    back = aggregates_from_xcom(through_xcom(aggregates_for_xcom({"total": value})))["total"]
    assert back == value and type(back) is type(value)


def test_a_float16_overflowing_on_decoding_writes_no_warning(recwarn):
    """float16's largest value is written 6.55e+04, which numpy reads back with an overflow warning: a task log line
    depending on a value (the type is what the release reads, and refuses)."""
    wrapped = aggregates_for_xcom({"x": np.float16(65504.0)})
    recwarn.clear()
    back = aggregates_from_xcom(through_xcom(wrapped))
    assert type(back["x"]) is np.float16
    assert [str(w.message) for w in recwarn] == []
