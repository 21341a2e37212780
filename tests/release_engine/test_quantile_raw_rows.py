"""A quantile's histogram bounded from raw rows: each row's value goes to its bin (edges and ``closed`` as the spec
fixes them, values beyond the edges to the end bins, non-numbers dropped), alike in the generated SQL on SQLite and
PostgreSQL and on pandas, and one unit's rows are held to its contribution bounds. Over groups found in the data
(``partition_selection``), every bin row carries its group's distinct units with a kept row, which the selection
noises, and the bins' counts are those over public groups."""

from __future__ import annotations

import json
from fractions import Fraction

import pandas as pd
import pytest
import sqlalchemy as sa

from dp_operators.ledger import ReleaseKey
from dp_operators.release import run_release
from dp_operators.release.bounding import (
    BoundedRowsSource,
    bound_frame,
    bounded_rows,
    bounded_sql,
    enforced_bounding,
)
from dp_operators.spec import ReleaseSpec

from ledger_backends import pg_database  # noqa: F401 - the PostgreSQL fixture (skips, or fails in CI, without PG)
from support import make_ledger

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


# -- groups found in the data (partition_selection): every bin row carries its group's distinct units --------------

GROUPED_SOURCE = BoundedRowsSource(privacy_unit_column="person", table="hours_by_country")
SELECTION = {"budget": {"epsilon": 1, "delta": "1/1000000"}}
HOURS_BINS = {"edges": [20, 60], "width": 10}  # 20, 30, 40, 50: Adult's hours below 20 and from 60 to the end bins


def _grouped_spec(l0: int, linf: int, countries: list[str] | None = None,
                  bins: dict = HOURS_BINS) -> ReleaseSpec:
    """A median of ``hours`` by ``country``: over the countries found in the data, or over ``countries`` (public)."""
    groups = {"keys": {"country": countries}} if countries is not None else {"partition_selection": SELECTION}
    return ReleaseSpec.model_validate({
        "version": 1, "release": "hours", "budget_account": "a", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": l0, "max_contributions_per_partition": linf},
        "aggregates": [{"name": "hours", "kind": "median", "group_by": ["country"], **groups,
                        "bins": {"column": "hours", **bins}, "mechanism": "exponential", "budget": {"epsilon": 1}}],
    })


def _no_key(key):
    """A missing group key as None (pandas returns the NULL group's key as NaN; the engine reads both as missing)."""
    return None if isinstance(key, float) and key != key else key


def _grouped(backend: str, spec: ReleaseSpec, rows: list, tmp_path, request) -> list[dict]:
    """The bounded rows of ``spec``'s median over a table (person, country, hours) on ``backend``."""
    aggregate = spec.aggregates[0]
    if backend == "pandas":
        frame = pd.DataFrame(rows, columns=["person", "country", "hours"])
        found = bound_frame(spec, aggregate, frame, "person", None)
    else:
        url = (f"sqlite:///{tmp_path / 'hours.db'}" if backend == "sqlite"
               else request.getfixturevalue("pg_database"))
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP TABLE IF EXISTS hours_by_country")
                conn.exec_driver_sql("CREATE TABLE hours_by_country (person integer, country text, "
                                     "hours double precision)")
                if rows:
                    conn.execute(sa.text("INSERT INTO hours_by_country VALUES (:p, :c, :h)"),
                                 [{"p": p, "c": c, "h": h} for p, c, h in rows])
                result = conn.exec_driver_sql(bounded_sql(spec, aggregate, GROUPED_SOURCE, engine.dialect.name))
                found = bounded_rows(aggregate, list(result.keys()), result.fetchall())
        finally:
            engine.dispose()
    return [{**row, "country": _no_key(row["country"])} for row in found]


def _cells(found: list[dict], field: str = "count") -> dict:
    return {(row["country"], row["hours"]): row[field] for row in found}


def _group_units(found: list[dict]) -> dict:
    """Each group's units, checked to be the same number on every one of its bin rows."""
    units: dict = {}
    for row in found:
        assert units.setdefault(row["country"], row["units"]) == row["units"], row["country"]
    return units


@pytest.fixture(scope="module")
def households(adult_csv) -> pd.DataFrame:
    """UCI Adult's native country and weekly hours, three consecutive records a privacy unit (a household of
    sorts): a unit fills up to three bins of a country, and where its records' countries differ, several groups.
    The first 6,000 records: 2,000 units, 40 countries, 588 units in two or three of them."""
    table = pd.read_csv(adult_csv, usecols=["native_country", "hours_per_week"], nrows=6000)
    return pd.DataFrame({"person": [i // 3 for i in range(len(table))], "country": table["native_country"],
                         "hours": table["hours_per_week"].astype(float)})


def _rows(people: pd.DataFrame) -> list[tuple]:
    return list(people.itertuples(index=False, name=None))


def _bin(hours: float) -> int:  # HOURS_BINS' label, values beyond the edges in the end bins
    return int(min(max(hours, 20), 59) // 10 * 10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_bin_row_of_a_group_carries_the_distinct_units_with_a_kept_row_in_the_group(backend, households,
                                                                                          tmp_path, request):
    """No unit exceeds the bounds (three records, so at most three cells; Linf 3): every row is kept, and a group's
    units are its distinct people, once however many of its bins they fill, in each of their countries."""
    found = _grouped(backend, _grouped_spec(l0=3, linf=3), _rows(households), tmp_path, request)
    expected_units = households.groupby("country")["person"].nunique().to_dict()
    assert _group_units(found) == expected_units
    assert (households.groupby("person")["country"].nunique() > 1).any()  # units counted in several groups
    binned = households.assign(hours=households["hours"].map(_bin))
    assert _cells(found) == binned.groupby(["country", "hours"]).size().to_dict()
    assert all(type(row["hours"]) is int for row in found)  # the spec's labels, as over public keys


def test_the_three_backends_agree_on_a_quantiles_groups_found_in_the_data(households, tmp_path, request):
    spec = _grouped_spec(l0=3, linf=3)
    found = {backend: sorted(_grouped(backend, spec, _rows(households), tmp_path, request),
                             key=lambda row: (str(row["country"]), row["hours"]))
             for backend in BACKENDS}
    assert found["sqlite"] == found["pandas"] == found["postgresql"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_bin_counts_are_those_of_the_same_histogram_over_public_groups(backend, households, tmp_path,
                                                                          request):
    """Only ``units`` changes meaning under partition selection: the cells and their counts are those of the
    countries declared public, whose rows keep each cell's own units."""
    rows = _rows(households)
    selected = _grouped(backend, _grouped_spec(l0=3, linf=3), rows, tmp_path, request)
    countries = sorted(households["country"].unique())
    public = _grouped(backend, _grouped_spec(l0=3, linf=3, countries=countries), rows, tmp_path, request)
    assert _cells(selected) == _cells(public)
    binned = households.assign(hours=households["hours"].map(_bin))
    assert _cells(public, "units") == binned.groupby(["country", "hours"])["person"].nunique().to_dict()


# one unit in several bins of one group, one in two groups; rows with no number, no unit or no group key
SMALL = [(1, "a", 5.0), (1, "a", 15.0), (1, "a", 15.0), (1, "a", 35.0), (1, "b", 25.0),
         (2, "a", 5.0),
         (3, "b", -3.0), (3, "c", None),
         (4, "c", None),
         (None, "d", 5.0),
         (5, None, 12.0), (6, None, 50.0)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_unit_counts_once_in_a_group_whatever_its_bins_and_in_each_group_it_has_a_row_in(backend, tmp_path,
                                                                                            request):
    spec = _grouped_spec(l0=10, linf=10, bins={"edges": [0, 40], "width": 10})
    found = _grouped(backend, spec, SMALL, tmp_path, request)
    # a: units 1 (bins 0, 10, 30) and 2 (bin 0); b: units 1 (bin 20) and 3 (-3 to bin 0); c: no number, no row;
    # d: no unit; the rows without a country are one group
    assert _group_units(found) == {"a": 2, "b": 2, None: 2}
    assert _cells(found) == {("a", 0): 2, ("a", 10): 2, ("a", 30): 1, ("b", 0): 1, ("b", 20): 1,
                             (None, 10): 1, (None, 30): 1}


@pytest.mark.parametrize("backend", BACKENDS)
def test_l0_removes_a_unit_from_the_groups_of_the_cells_it_drops(backend, tmp_path, request):
    """L0 applies although the groups are not known in advance: a unit keeps at most L0 cells, so it counts in at
    most L0 groups."""
    bins = {"edges": [0, 40], "width": 10}
    two_groups = [(1, "a", 5.0), (1, "b", 5.0), (2, "a", 5.0), (3, "b", 5.0)]
    units = _group_units(_grouped(backend, _grouped_spec(l0=1, linf=1, bins=bins), two_groups, tmp_path, request))
    assert sorted(units.values()) == [1, 2]  # unit 1 stays in a or in b, never in both
    heavy = [(99, group, float(hours)) for group in "abcde" for hours in range(0, 40) for _ in range(2)]
    found = _grouped(backend, _grouped_spec(l0=2, linf=3, bins=bins), heavy, tmp_path, request)
    assert len(found) == 2 and {row["count"] for row in found} == {3}  # two cells of Linf records
    assert set(_group_units(found).values()) == {1}  # in one or two groups, counted once in each


def test_a_median_by_country_bounded_from_raw_rows_is_released_for_the_populous_countries(households, tmp_path):
    """End to end: the bounded rows of the generated SQL (SQLite) are what ``run_release`` reads for a quantile over
    groups found in the data; the countries of thousands of units are released, those of a few are not."""
    spec = _grouped_spec(l0=3, linf=3)
    aggregate = spec.aggregates[0]
    found = _grouped("sqlite", spec, _rows(households), tmp_path, None)
    sql = bounded_sql(spec, aggregate, GROUPED_SOURCE, "sqlite")
    ledger = make_ledger(tmp_path / "ledger.db", cap="100", accountant="approx_dp", dags=("d",), account="a",
                         delta=Fraction(1, 1000))
    key = ReleaseKey(dag_id="d", run_id="r", task_id="release", map_index=-1, release_name="hours")
    bounding = {aggregate.name: enforced_bounding("table", "person", sql,
                                                  contribution=spec.contribution_for(aggregate))}
    output = run_release(spec, {"hours": found}, ledger, key, spec_hash="0" * 64, bounding=bounding).output
    released = {row["country"] for row in output["aggregates"]["hours"]["rows"]}
    units = households.groupby("country")["person"].nunique()
    assert "United-States" in released  # 1,800 or so units against a threshold of tens
    assert not released & set(units[units <= 3].index)
    mechanisms = json.loads(list(ledger.charges())[0]["mechanisms"])  # the selection and the median
    assert [m["contribution_bounding"]["mode"] for m in mechanisms] == ["enforced"] * 2


@pytest.mark.parametrize("partition_selection", [True, False], ids=["groups found", "public groups"])
def test_one_units_text_cell_in_a_csv_rows_files_histogram_column_changes_no_other_units_bins(partition_selection,
                                                                                             tmp_path):
    """pandas types a CSV column by all its cells: one unit's ``unknown`` would make every hour text, which the
    bounding drops as no number. The operator reads each cell of the histogram's column as the number it spells."""
    from dp_operators.operators.raw_rows import bounded_file_aggregates

    spec = _grouped_spec(l0=3, linf=3, countries=None if partition_selection else ["a", "b"],
                         bins={"edges": [0, 40], "width": 10})
    rows = [(1, "a", 5), (2, "a", 15), (3, "b", 25)]
    found = []
    for table in (rows, rows + [(4, "a", "unknown")]):
        path = tmp_path / "rows.csv"
        pd.DataFrame(table, columns=["person", "country", "hours"]).to_csv(path, index=False)
        found.append(_cells(bounded_file_aggregates(str(path), spec, "person", {})["hours"]))
    assert found[0] == found[1] == {("a", 0): 1, ("a", 10): 1, ("b", 20): 1}
