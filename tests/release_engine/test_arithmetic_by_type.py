"""How an upstream sum is read is decided by its type, never by its value (DESIGN.md 2.4): under the default
``upstream.arithmetic: exact`` a float sum is refused for every value, before any budget is reserved, on every
representation; under ``binary64`` NaN and infinity follow ``non_finite``; the columnar reader's representation is
chosen from the spec and the schema, never from the largest value."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dp_operators.release import ReleaseInputError, prepare_inputs
from dp_operators.release import columns
from dp_operators.release.upstream_types import FLOAT_SUM_ADVICE

BINARY64 = {"arithmetic": "binary64", "max_rows": 10}
REPRESENTATIONS = ["float", "numpy.float64", "pandas", "arrow"]


def upstream(representation: str, sums: list, kind: str = "sum") -> object:
    """Rows of key ``a`` holding ``sums`` (added up by the engine, as rows repeating a key are), in the shape the
    named upstream gives them."""
    counts = {"count": [1] * len(sums)} if kind == "mean" else {}
    if representation == "float":
        return [{"k": "a", "sum": float(s), **{c: v[i] for c, v in counts.items()}} for i, s in enumerate(sums)]
    if representation == "numpy.float64":
        return [{"k": "a", "sum": np.float64(s), **{c: v[i] for c, v in counts.items()}} for i, s in enumerate(sums)]
    frame = pd.DataFrame({"k": ["a"] * len(sums), "sum": pd.Series(sums, dtype="float64"), **counts})
    if representation == "pandas":
        return frame.to_dict("records")
    return pa.Table.from_pandas(frame, preserve_index=False)


def outcome(spec, value) -> tuple[str, object]:
    """``("refused", message)`` or ``("read", vectors)``."""
    try:
        prepared = prepare_inputs(spec, {"x": value})
    except ReleaseInputError as error:
        return "refused", str(error)
    return "read", {k: v.tolist() for k, v in prepared.values.items()}


NEIGHBOURS = [
    pytest.param([30.0], [30.5], id="30.0 vs 30.5"),
    pytest.param([0.5, 0.5], [0.5, 0.5, 0.7], id="[0.5, 0.5] vs [0.5, 0.5, 0.7]"),
    pytest.param([float(2**53)], [float(2**53 + 2)], id="2^53 vs 2^53 + 2"),
    pytest.param([float("nan")], [float("inf")], id="NaN vs inf"),
    pytest.param([], [30.0], id="no row vs one row"),
]


class TestFloatSumsUnderExact:
    @pytest.mark.parametrize("representation", REPRESENTATIONS)
    @pytest.mark.parametrize(("base", "neighbour"), NEIGHBOURS)
    def test_neighbouring_float_sums_are_refused_alike(self, build_spec, representation, base, neighbour):
        """Neighbouring float sums are both refused under exact, with the same message."""
        spec = build_spec("sum", bounds=[0, 100], grid=1)
        first, second = outcome(spec, upstream(representation, base)), outcome(spec, upstream(representation,
                                                                                                neighbour))
        if base or representation == "arrow":  # no row of a list is no float; a table's column is typed
            assert first[0] == "refused"
        assert second[0] == "refused" and "upstream.arithmetic is 'exact'" in second[1]
        if base or representation == "arrow":
            assert first == second

    @pytest.mark.parametrize("value", [30.0, 30.5, np.float64(2**53), float("nan"), float("-inf")])
    def test_an_ungrouped_float_sum_is_refused_whatever_its_value(self, value):
        """An ungrouped float sum is refused with one message for every value, integral or not."""
        from dp_operators.spec import ReleaseSpec

        spec = ReleaseSpec.model_validate({"version": 1, "release": "r", "budget_account": "acct",
                                           "privacy_unit": "person", "aggregates": [
                                               {"name": "x", "kind": "sum", "bounds": [0, 100], "grid": 1,
                                                "mechanism": "discrete_laplace", "budget": {"epsilon": 1}}]})
        with pytest.raises(ReleaseInputError) as caught:
            prepare_inputs(spec, {"x": value})
        name = "numpy.float64" if isinstance(value, np.floating) else "float"
        assert str(caught.value) == (f"aggregate 'x': field 'sum' holds a {name} but upstream.arithmetic is 'exact': "
                                     + FLOAT_SUM_ADVICE)

    def test_the_refusal_comes_before_any_reservation(self, build_spec, observe):
        """A float sum under exact is refused before the ledger is touched: nothing is charged."""
        spec = build_spec("sum", bounds=[0, 100], grid=1)
        error, _, charges, _ = observe(spec, {"x": [{"k": "a", "sum": 30.0}]})
        assert error.startswith("ReleaseInputError") and charges == []

    def test_the_advice_names_both_fixes(self):
        """The message says how to declare binary64 and how to cast the sums upstream (pandas included)."""
        assert "upstream: {arithmetic: binary64, max_rows: N}" in FLOAT_SUM_ADVICE
        assert "Int64" in FLOAT_SUM_ADVICE and ".fillna(0).astype('int64')" in FLOAT_SUM_ADVICE

    @pytest.mark.parametrize("representation", REPRESENTATIONS)
    def test_a_float_mean_sum_is_refused_like_a_float_sum(self, build_spec, representation):
        """A mean's float sum is refused by its type, integral or not."""
        spec = build_spec("mean", bounds=[0, 100], grid=1)
        assert outcome(spec, upstream(representation, [30.0], "mean")) == outcome(
            spec, upstream(representation, [30.5], "mean"))
        assert outcome(spec, upstream(representation, [30.0], "mean"))[0] == "refused"

    @pytest.mark.parametrize("value", [3.0, 3.5, np.float64(2**53 + 2), float("nan")])
    def test_a_float_count_is_read_by_its_type(self, build_spec, value):
        """A count given as a float is read (its exact binary value, rounded as counts are) whatever its value."""
        assert outcome(build_spec("count"), [{"k": "a", "count": value}])[0] == "read"


class TestFloatSumsUnderBinary64:
    @pytest.mark.parametrize("representation", REPRESENTATIONS)
    @pytest.mark.parametrize("nan", ["replace", "drop"])
    @pytest.mark.parametrize("infinity", ["clamp", "replace", "drop"])
    def test_nan_and_inf_follow_the_policy_alike(self, build_spec, representation, nan, infinity):
        """Under binary64 a NaN and an infinite float sum are both read, each by its non_finite policy."""
        spec = build_spec("sum", bounds=[0, 100], grid=1, upstream=BINARY64,
                          non_finite={"nan": nan, "infinity": infinity})
        assert outcome(spec, upstream(representation, [float("nan")]))[0] == "read"
        assert outcome(spec, upstream(representation, [float("inf")]))[0] == "read"

    @pytest.mark.parametrize("representation", REPRESENTATIONS)
    @pytest.mark.parametrize(("base", "neighbour"), NEIGHBOURS[:3])
    def test_neighbouring_float_sums_are_both_read(self, build_spec, representation, base, neighbour):
        """Under binary64 neighbouring float sums are both read."""
        spec = build_spec("sum", bounds=[0, 10**12], grid=1, upstream=BINARY64)
        assert outcome(spec, upstream(representation, base))[0] == "read"
        assert outcome(spec, upstream(representation, neighbour))[0] == "read"


class TestTableSchemas:
    @pytest.mark.parametrize("column", [
        pytest.param(pa.array([], type=pa.float64()), id="empty double"),
        pytest.param(pa.array([None], type=pa.float64()), id="all-NULL double"),
        pytest.param(pa.array([30.0], type=pa.float64()), id="integral double"),
    ])
    def test_a_floating_sum_column_is_refused_whatever_it_holds(self, build_spec, column):
        """A double sum column under exact is refused by the schema, also when empty or all NULL."""
        spec = build_spec("sum", bounds=[0, 100], grid=1)
        table = pa.table({"k": pa.array(["a"] * len(column), type=pa.string()), "sum": column})
        state, message = outcome(spec, table)
        assert state == "refused" and "column 'sum' is double" in message

    @pytest.mark.parametrize("kind", [pa.float32(), pa.string(), pa.bool_()])
    def test_a_value_column_of_a_refused_type_is_refused_when_empty(self, build_spec, kind):
        """float32, text and bool value columns are refused by the schema, rows or none."""
        spec = build_spec("count")
        empty = pa.table({"k": pa.array([], type=pa.string()), "count": pa.array([], type=kind)})
        assert outcome(spec, empty)[0] == "refused"

    def test_a_missing_column_is_refused_when_the_table_is_empty(self, build_spec):
        """A table lacking a needed column is refused by its schema, not by its first row."""
        empty = pa.table({"k": pa.array([], type=pa.string())})
        state, message = outcome(build_spec("count"), empty)
        assert state == "refused" and "no column 'count'" in message


TEXT_KEYS = {"k": ["a", "b", "c"]}


class TestColumnarRepresentation:
    """The columnar reader's grid arithmetic is chosen by :func:`columns.grid_arithmetic` from the spec and the
    column type: one value of 5e12 among small ones takes the same path as the small ones alone."""

    @staticmethod
    def paths(monkeypatch) -> list[str]:
        taken: list[str] = []
        for name in ("_units_int64", "_units_python"):
            original = getattr(columns, name)

            def spy(*args, _original=original, _name=name, **kwargs):
                taken.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(columns, name, spy)
        return taken

    @pytest.mark.parametrize("kind", [pa.int64(), pa.decimal128(18, 2)])
    def test_one_large_value_takes_the_same_path(self, build_spec, monkeypatch, kind):
        """Neighbouring tables (one large in-bounds value, or not) take the same representation path."""
        from decimal import Decimal

        spec = build_spec("sum", bounds=[0, 10**13], grid=10, keys=TEXT_KEYS)
        taken = self.paths(monkeypatch)
        make = (lambda v: v) if pa.types.is_integer(kind) else Decimal
        results = []
        for values in ([1, 2, 3], [1, 2, 5 * 10**12]):
            table = pa.table({"k": pa.array(["a"] * 3), "sum": pa.array([make(v) for v in values], type=kind)})
            assert columns.columnar_eligible(None, spec.aggregates[0], table.schema)
            results.append(outcome(spec, table))
            assert results[-1] == outcome(spec, table.to_pylist())  # the row reader's vectors
        assert len(taken) == 2 and taken[0] == taken[1]

    def test_the_decision_reads_only_the_spec_and_the_column_type(self, build_spec):
        """grid_arithmetic is int64 for integer columns on usual grids and Python ints for decimals."""
        def decided(spec, component, kind):
            return columns.grid_arithmetic(spec.aggregates[0], component, kind)

        assert decided(build_spec("sum", grid="1/2"), "sum", pa.int64()) == columns.INT64
        assert decided(build_spec("count"), "count", pa.int32()) == columns.INT64
        assert decided(build_spec("sum"), "sum", pa.decimal128(18, 2)) == columns.PYTHON_INT
        assert decided(build_spec("sum", bounds=[0, 2**40], grid=2**31), "sum", pa.int64()) == columns.PYTHON_INT

    @pytest.mark.parametrize("grid", [1, "1/2", "1/3", 7, "1/1000000", 2**30 - 1])
    @pytest.mark.parametrize("kind", ["count", "sum"])
    def test_extreme_int64_values_read_as_the_row_reader_does(self, build_spec, grid, kind):
        """Totals of extreme int64 values (many rows at +-2^63) give the row reader's grid integers exactly."""
        rng = np.random.default_rng(7)
        pool = [-2**63, 2**63 - 1, 2**62, -2**62 - 1, 0, 1, -1, 5 * 10**12, 2**32 - 1, -2**32]
        values = [pool[i] for i in rng.integers(0, len(pool), 300)] + rng.integers(-10**6, 10**6, 100).tolist()
        keys = [TEXT_KEYS["k"][i] for i in rng.integers(0, 3, len(values))]
        if kind == "count":
            spec = build_spec("count", upstream={"max_rows": 2**40}, keys=TEXT_KEYS)
        else:
            spec = build_spec("sum", bounds=[0, 10], grid=grid, keys=TEXT_KEYS)
        table = pa.table({"k": pa.array(keys), kind: pa.array(values, type=pa.int64())})
        assert columns.columnar_eligible(None, spec.aggregates[0], table.schema)
        assert outcome(spec, table) == outcome(spec, table.to_pylist())
