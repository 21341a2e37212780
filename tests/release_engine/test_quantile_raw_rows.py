"""A quantile's histogram bounded from raw rows: each row's value goes to its bin (edges and ``closed`` as the spec
fixes them, values beyond the edges to the end bins, non-numbers dropped), alike in the generated SQL on SQLite and
PostgreSQL and on pandas, and one unit's rows are held to its contribution bounds."""

from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy as sa

from dp_operators.release.bounding import BoundedRowsSource, bound_frame, bounded_rows, bounded_sql
from dp_operators.spec import ReleaseSpec

from ledger_backends import pg_database  # noqa: F401 - the PostgreSQL fixture (skips, or fails in CI, without PG)

SOURCE = BoundedRowsSource(privacy_unit_column="person", table="shifts")


def _spec(bins: dict, l0: int = 10, linf: int = 10) -> ReleaseSpec:
    return ReleaseSpec.model_validate({
        "version": 1, "release": "shifts", "budget_account": "a", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": l0, "max_contributions_per_partition": linf},
        "aggregates": [{"name": "hours", "kind": "median", "bins": {"column": "hours", **bins},
                        "mechanism": "exponential", "budget": {"epsilon": 1}}],
    })


def _histogram(backend: str, spec: ReleaseSpec, rows: list, tmp_path, request,
               column_type: str = "double precision") -> dict:
    aggregate = spec.aggregates[0]
    if backend == "pandas":
        found = bound_frame(spec, aggregate, pd.DataFrame(rows, columns=["person", "hours"]), "person", None)
    else:
        url = f"sqlite:///{tmp_path / 'shifts.db'}" if backend == "sqlite" else request.getfixturevalue("pg_database")
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP TABLE IF EXISTS shifts")
                conn.exec_driver_sql(f"CREATE TABLE shifts (person integer, hours {column_type})")
                conn.execute(sa.text("INSERT INTO shifts VALUES (:p, :h)"), [{"p": p, "h": h} for p, h in rows])
                result = conn.exec_driver_sql(bounded_sql(spec, aggregate, SOURCE, engine.dialect.name))
                found = bounded_rows(aggregate, list(result.keys()), result.fetchall())
        finally:
            engine.dispose()
    return {row["hours"]: row["count"] for row in found}


BACKENDS = ["pandas", "sqlite", "postgresql"]
# values on, between and beyond the edges [0, 10, 20, 40], one unit each; None is no number
ROWS = [(1, -5.0), (2, 0.0), (3, 9.5), (4, 10.0), (5, 19.99), (6, 20.0), (7, 39.0), (8, 40.0), (9, 1e9), (10, None)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_value_goes_to_the_bin_its_closed_side_says_and_beyond_the_edges_to_the_end_bins(backend, tmp_path,
                                                                                              request):
    left = _spec({"edges": [0, 10, 20, 40]})
    assert _histogram(backend, left, ROWS, tmp_path, request) == {0: 3, 10: 2, 20: 4}
    right = _spec({"edges": [0, 10, 20, 40], "closed": "right", "label": "index"})
    assert _histogram(backend, right, ROWS, tmp_path, request) == {1: 4, 2: 2, 3: 3}


@pytest.mark.parametrize("backend", BACKENDS)
def test_equal_width_bins_are_assigned_by_arithmetic_as_the_edges_would(backend, tmp_path, request):
    spec = _spec({"edges": [0, 40], "width": 10})
    assert _histogram(backend, spec, ROWS, tmp_path, request) == {0: 3, 10: 2, 20: 1, 30: 3}
    by_index = _spec({"edges": [0, 40], "width": 10, "closed": "right", "label": "index"})
    assert _histogram(backend, by_index, ROWS, tmp_path, request) == {1: 4, 2: 2, 4: 3}


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_unit_adds_at_most_l0_bins_of_linf_rows(backend, tmp_path, request):
    spec = _spec({"edges": [0, 40], "width": 10}, l0=2, linf=3)
    heavy = [(99, float(h)) for h in range(0, 40) for _ in range(5)]  # 50 rows in each of the 4 bins
    found = _histogram(backend, spec, heavy, tmp_path, request)
    assert sum(found.values()) == 6 and len(found) == 2 and set(found.values()) == {3}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("value", "end_bin"), [(float("inf"), 9), (float("-inf"), 0), (1e19, 9), (-1e300, 0)])
def test_one_extreme_value_goes_to_an_end_bin_and_never_fails_the_query(backend, value, end_bin, tmp_path, request):
    """No arithmetic on the value: one unit's infinity or huge number cannot make the query fail (a refusal decided
    by the data) or overflow a cast."""
    spec = _spec({"edges": [0, 10], "width": 1})
    assert _histogram(backend, spec, [(1, 5.0), (2, value)], tmp_path, request) == {5: 1, end_bin: 1}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("column_type", ["double precision", "numeric"])
def test_a_value_equal_to_a_decimal_edge_goes_to_the_bin_its_closed_side_says(backend, column_type, tmp_path,
                                                                               request):
    """Compared with the edges, never divided by the width: 0.3 / 0.1 is 2.9999999999999996 in binary64, whose floor
    would put 0.3 in the bin below its own."""
    if backend == "sqlite" and column_type == "numeric":
        pytest.skip("SQLite stores a numeric column's 0.3 as REAL: the double precision case covers it")
    spec = _spec({"edges": [0, 1], "width": 0.1, "label": "index"})  # [0, 0.1), [0.1, 0.2), ...: index 1..10
    rows = [(1, 0.3), (2, 0.6), (3, 0.7)]
    assert _histogram(backend, spec, rows, tmp_path, request, column_type) == {4: 1, 7: 1, 8: 1}
