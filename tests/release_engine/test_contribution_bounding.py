"""The bounded aggregation from raw rows (``dp_operators.release.bounding``), run as generated SQL on SQLite and
PostgreSQL and on pandas: neighbouring tables (one unit added with many rows in many partitions) stay within the
planned sensitivity, every unit's contribution is bounded, the rows kept are random rather than the first by
physical order, and the three backends agree where the bounding has no choice to make."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pandas as pd
import pytest
import sqlalchemy as sa

from dp_operators.release.bounding import (
    BoundedRowsSource,
    bound_frame,
    bounded_rows,
    bounded_select,
    bounded_sql,
    bounding_problem,
)
from dp_operators.spec import ReleaseSpec

from ledger_backends import pg_database  # noqa: F401 - the PostgreSQL fixture (skips, or fails in CI, without PG)

REGIONS = ["north", "south", "east", "west", "centre"]
L0, LINF = 2, 3
LOWER, UPPER, GRID = -4, 10, Fraction(1, 2)


def visits_spec(**contribution) -> ReleaseSpec:
    """Four aggregates over a table of visits (several rows per person): a count and a variance over public
    regions, a mean over everyone, and a sum over regions found in the data."""
    bounds = {"bounds": [LOWER, UPPER], "grid": str(GRID)}
    public = {"group_by": ["region"], "keys": {"region": REGIONS}}
    budget = {"mechanism": "discrete_laplace", "budget": {"epsilon": 1}}
    return ReleaseSpec.model_validate({
        "version": 1, "release": "visits", "budget_account": "clinic", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": L0, "max_contributions_per_partition": LINF, **contribution},
        "aggregates": [
            {"name": "visits_by_region", "kind": "count", **public, **budget},
            {"name": "spend_by_region", "kind": "variance", **public, **bounds, **budget},
            {"name": "mean_spend", "kind": "mean", **bounds, **budget},
            {"name": "spend_found", "kind": "sum", "group_by": ["region"], **bounds, **budget,
             "partition_selection": {"budget": {"epsilon": 1, "delta": 1e-6}}},
        ],
    })


SOURCE = BoundedRowsSource(privacy_unit_column="person", table="visits",
                           value_columns={"spend_by_region": "spend", "mean_spend": "spend", "spend_found": "spend"})


def runner(name: str, tmp_path, request):
    """``run(spec, aggregate_name, rows) -> bounded rows`` on backend ``name``, and a closer."""
    if name == "pandas":
        def run_frame(spec, aggregate_name, rows):
            aggregate = next(a for a in spec.aggregates if a.name == aggregate_name)
            frame = pd.DataFrame(rows, columns=["person", "region", "spend"])
            return bound_frame(spec, aggregate, frame, "person", SOURCE.value_column(aggregate))
        return run_frame, lambda: None
    if name == "sqlite":
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'visits.db'}")
    else:
        engine = sa.create_engine(request.getfixturevalue("pg_database"))

    def run_sql(spec, aggregate_name, rows):
        aggregate = next(a for a in spec.aggregates if a.name == aggregate_name)
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS visits")
            conn.exec_driver_sql("CREATE TABLE visits (person integer, region text, spend double precision)")
            if rows:
                conn.execute(sa.text("INSERT INTO visits VALUES (:p, :r, :s)"),
                             [{"p": p, "r": r, "s": s} for p, r, s in rows])
            result = conn.exec_driver_sql(bounded_sql(spec, aggregate, SOURCE, engine.dialect.name))
            return bounded_rows(aggregate, list(result.keys()), result.fetchall())

    return run_sql, engine.dispose


@pytest.fixture(params=["sqlite", "postgresql", "pandas"])
def backend(request, tmp_path):
    """``run(spec, aggregate_name, rows) -> list of bounded rows`` on one backend."""
    run, close = runner(request.param, tmp_path, request)
    yield run
    close()


def within_bounds_table(seed: int, regions: int = L0) -> list[tuple]:
    """People who each stay within the bounds (at most ``regions`` <= L0 regions, at most LINF visits in each): the
    bounding of a grouped aggregate has no choice to make, so its output is a function of the table alone (and with
    one region each, of an ungrouped one too)."""
    rng = random.Random(seed)
    rows = []
    for person in range(60):
        for region in rng.sample(REGIONS, rng.randint(1, regions)):
            rows.extend((person, region, rng.choice([-6.25, -1.0, 0.0, 2.5, 7.75, 12.0, 3.3]))
                        for _ in range(rng.randint(1, LINF)))
    return rows


def heavy_person(person: int = 10_000) -> list[tuple]:
    """One person with 40 visits in every region, spending far outside the bounds."""
    return [(person, region, 1e9 if i % 2 else -1e9) for region in REGIONS for i in range(40)]


def by_key(rows: list[dict], group_by: list[str]) -> dict:
    return {tuple(row[c] for c in group_by): row for row in rows}


def grid_units(value: Fraction, power: int = 1) -> Fraction:
    return value / GRID**power


@pytest.mark.parametrize("name", ["visits_by_region", "spend_by_region", "mean_spend", "spend_found"])
def test_adding_one_unit_with_many_rows_moves_the_aggregates_within_the_sensitivity(backend, name):
    spec = visits_spec()
    aggregate = next(a for a in spec.aggregates if a.name == name)
    base = within_bounds_table(seed=7, regions=L0 if aggregate.group_by else 1)
    without = by_key(backend(spec, name, base), aggregate.group_by)
    with_heavy = by_key(backend(spec, name, base + heavy_person()), aggregate.group_by)
    partitions = 1 if not aggregate.group_by else L0
    changed = [key for key in with_heavy if with_heavy[key] != without.get(key)]
    assert 1 <= len(changed) <= partitions  # the heavy person lands somewhere, in at most L0 keys
    largest = max(abs(LOWER), abs(UPPER))
    for key in changed:
        before = without.get(key, {"count": 0, "units": 0, "sum": Fraction(0), "sum_squares": Fraction(0)})
        after = with_heavy[key]
        assert 0 < after["count"] - before["count"] <= LINF
        assert after["units"] - before["units"] == 1
        if aggregate.kind != "count":
            assert abs(grid_units(after["sum"] - before["sum"])) <= LINF * largest / GRID
        if aggregate.kind == "variance":
            assert 0 <= grid_units(after["sum_squares"] - before["sum_squares"], 2) <= LINF * (largest / GRID) ** 2


def test_the_three_backends_agree_where_the_bounding_has_no_choice(request, tmp_path):
    spec = visits_spec()
    rows = within_bounds_table(seed=11, regions=1)
    results = {}
    for name in ("sqlite", "postgresql", "pandas"):
        run, close = runner(name, tmp_path, request)
        results[name] = {a.name: sorted(run(spec, a.name, rows), key=repr) for a in spec.aggregates}
        close()
    first = next(iter(results.values()))
    assert all(result == first for result in results.values())
    # the values are the clipped, snapped spends, exactly: a kept 12.0 is 10, a kept 3.3 is 3.5 (on the 1/2 grid)
    expected = sum(min(max(Fraction(s), LOWER), UPPER) for _, _, s in rows)
    snapped = sum(Fraction(round(min(max(Fraction(s), LOWER), UPPER) / GRID)) * GRID for _, _, s in rows)
    assert first["mean_spend"][0]["sum"] == snapped != expected


@pytest.mark.parametrize("name", ["visits_by_region", "spend_by_region", "spend_found"])
def test_every_unit_is_held_to_its_bounds_on_any_table(backend, name):
    spec = visits_spec()
    aggregate = next(a for a in spec.aggregates if a.name == name)
    rng = random.Random(3)
    rows = [(p, rng.choice(REGIONS + ["elsewhere"]), rng.uniform(-50, 50)) for p in range(80)
            for _ in range(rng.randint(1, 30))]
    result = backend(spec, name, rows)
    people = len({p for p, _, _ in rows})
    assert sum(row["units"] for row in result) <= L0 * people
    for row in result:
        assert row["units"] <= row["count"] <= LINF * row["units"]
        if aggregate.kind != "count":
            assert LOWER * row["count"] <= row["sum"] <= UPPER * row["count"]
    if aggregate.public_keys:  # a key outside the public domain uses up none of a unit's L0 keys
        assert {row["region"] for row in result} <= set(REGIONS)


def test_the_rows_kept_are_random_not_the_first_by_physical_order(backend):
    """Each of 300 people has ten visits inserted in the order 0, 1, ..., 9 (the physical order of a fresh table);
    with one visit kept per person, the first rows would sum to 0 and a uniform choice to 1350 +- 50 (sd)."""
    spec = visits_spec(max_contributions_per_partition=1)
    rows = [(person, "north", float(visit)) for person in range(300) for visit in range(10)]
    total = backend(spec, "mean_spend", rows)[0]["sum"]
    assert 1350 - 350 < total < 1350 + 350
    counts = Counter(p for p, _, _ in rows)
    assert backend(spec, "mean_spend", rows)[0]["count"] == len(counts)


def test_the_random_choice_differs_between_runs(backend):
    spec = visits_spec(max_contributions_per_partition=1)
    rows = [(person, "north", float(visit)) for person in range(20) for visit in range(10)]
    totals = {backend(spec, "mean_spend", rows)[0]["sum"] for _ in range(5)}
    assert len(totals) > 1


def test_an_empty_table_is_the_aggregate_of_nobody(backend):
    spec = visits_spec()
    assert backend(spec, "mean_spend", []) == [{"count": 0, "units": 0, "sum": Fraction(0)}]
    assert backend(spec, "visits_by_region", []) == []


def test_negative_sums_are_joined_exactly_from_their_halves(backend):
    spec = visits_spec()
    rows = [(p, "north", -4.0) for p in range(50) for _ in range(3)]
    assert backend(spec, "mean_spend", rows)[0]["sum"] == -4 * 150


def test_rows_without_a_unit_or_a_value_are_dropped(backend):
    spec = visits_spec()
    rows = [(1, "north", 2.0), (None, "north", 2.0), (2, "north", None)]
    result = backend(spec, "mean_spend", rows)[0]
    assert (result["count"], result["units"], result["sum"]) == (1, 1, 2)


def test_the_generated_sql_differs_by_dialect_only_where_the_dialects_do():
    spec = visits_spec()
    aggregate = spec.aggregates[1]
    sqlite, postgresql = bounded_sql(spec, aggregate, SOURCE, "sqlite"), bounded_sql(spec, aggregate, SOURCE,
                                                                                       "postgresql")
    assert "least(" in postgresql and "least(" not in sqlite  # SQLite's scalar min/max
    assert "sum_hi" in sqlite and "sum_hi" not in postgresql  # SQLite adds halves; PostgreSQL adds NUMERIC
    assert postgresql.count("ORDER BY random()") == sqlite.count("ORDER BY random()") == 2
    assert bounded_sql(spec, aggregate, SOURCE, "sqlite") == sqlite  # the same text each time: its hash is stable


def test_a_unit_that_cannot_exceed_l0_needs_no_partition_choice():
    spec = visits_spec(max_partitions_contributed=len(REGIONS))
    counts = next(a for a in spec.aggregates if a.name == "visits_by_region")
    assert str(bounded_select(spec, counts, SOURCE, "sqlite")).count("row_number()") == 0
    found = next(a for a in spec.aggregates if a.name == "spend_found")  # keys not public: any number
    assert str(bounded_select(spec, found, SOURCE, "sqlite")).count("row_number()") == 2


@pytest.mark.parametrize(
    ("change", "dialect", "message"),
    [
        pytest.param({"value": None}, "sqlite", "give the column whose values it adds", id="no value column"),
        pytest.param({"grid": "3", "bounds": [1, 2]}, "sqlite", "no multiple of the grid", id="no grid point"),
        pytest.param({"grid": "0.000001", "bounds": [1e6, 1e6 + 1]}, "sqlite", "beyond the 64-bit integers",
                     id="squares beyond int64 on SQLite"),
    ],
)
def test_what_cannot_be_bounded_is_refused_from_public_parameters(change, dialect, message):
    spec = visits_spec()
    data = spec.model_dump(mode="json")
    aggregate = data["aggregates"][1]
    aggregate.update({k: v for k, v in change.items() if k != "value"})
    changed = ReleaseSpec.model_validate(data)
    value = change.get("value", "spend")
    assert message in bounding_problem(changed, changed.aggregates[1], value, dialect=dialect)
    if dialect == "sqlite" and "64-bit" in message:  # PostgreSQL adds NUMERIC
        assert bounding_problem(changed, changed.aggregates[1], value, dialect="postgresql") is None


def test_a_unit_sum_beyond_64_bits_is_refused_on_every_backend():
    spec = visits_spec()
    data = spec.model_dump(mode="json")
    data["aggregates"][2].update(bounds=[999_999_999_999_999, 10**15], grid="0.0001")
    changed = ReleaseSpec.model_validate(data)
    for dialect in ("sqlite", "postgresql", "pandas"):
        assert "beyond the 64-bit integers" in bounding_problem(changed, changed.aggregates[2], "spend",
                                                                dialect=dialect)


def test_a_nan_value_drops_its_row_on_every_backend(backend):
    """PostgreSQL sorts NaN above every number, so clipping alone would make it the upper bound; SQLite stores it as
    NULL; pandas reads it as missing: on all three it is a missing value."""
    spec = visits_spec()
    rows = [(1, "north", 2.0), (2, "north", float("nan")), (3, "north", float("inf"))]
    result = backend(spec, "mean_spend", rows)[0]
    assert (result["count"], result["units"], result["sum"]) == (2, 2, 2 + UPPER)


def test_text_in_a_sqlite_value_column_is_no_number(tmp_path):
    spec = visits_spec()
    aggregate = next(a for a in spec.aggregates if a.name == "mean_spend")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'typed.db'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE visits (person integer, region text, spend)")  # no affinity
        conn.exec_driver_sql("INSERT INTO visits VALUES (1, 'north', 5), (2, 'north', '5'), (3, 'north', 'abc'),"
                             " (4, 'north', 7.5), (5, 'north', x'00')")
        result = conn.exec_driver_sql(bounded_sql(spec, aggregate, SOURCE, "sqlite"))
        (row,) = bounded_rows(aggregate, list(result.keys()), result.fetchall())
    engine.dispose()
    assert (row["count"], row["sum"]) == (2, Fraction(25, 2))
    frame = pd.DataFrame({"person": [1, 2, 3, 4], "region": ["north"] * 4, "spend": [5, "5", "abc", 7.5]})
    (from_frame,) = bound_frame(spec, aggregate, frame, "person", "spend")
    assert (from_frame["count"], from_frame["sum"]) == (2, Fraction(25, 2))


def test_a_whole_real_key_on_sqlite_is_the_integer_key_as_in_pandas(tmp_path):
    """pandas writes an integer column holding a NULL as REAL: its 2.0 is the key 2 on SQLite as in a file."""
    spec = ReleaseSpec.model_validate({
        "version": 1, "release": "r", "budget_account": "a", "privacy_unit": "person",
        "aggregates": [{"name": "c", "kind": "count", "group_by": ["ward"], "keys": {"ward": [1, 2, 3]},
                        "mechanism": "discrete_laplace", "budget": {"epsilon": 1}}]})
    aggregate = spec.aggregates[0]
    frame = pd.DataFrame({"person": [1, 2, 3, 4], "ward": [1, 2, None, 2.5]})  # float64: 1.0, 2.0, NaN, 2.5
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'real.db'}")
    with engine.begin() as conn:
        frame.to_sql("visits", conn, index=False)
        result = conn.exec_driver_sql(bounded_sql(spec, aggregate, BoundedRowsSource("person", table="visits"),
                                                  "sqlite"))
        from_sql = bounded_rows(aggregate, list(result.keys()), result.fetchall())
    engine.dispose()
    from_frame = bound_frame(spec, aggregate, frame, "person", None)
    expected = [{"ward": 1, "count": 1, "units": 1}, {"ward": 2, "count": 1, "units": 1}]
    assert sorted(from_sql, key=repr) == sorted(from_frame, key=repr) == expected


def test_a_bool_beside_integer_keys_in_a_file_changes_no_other_row():
    spec = ReleaseSpec.model_validate({
        "version": 1, "release": "r", "budget_account": "a", "privacy_unit": "person",
        "aggregates": [{"name": "c", "kind": "count", "group_by": ["ward"], "keys": {"ward": [1, 2]},
                        "mechanism": "discrete_laplace", "budget": {"epsilon": 1}}]})
    base = pd.DataFrame({"person": [1, 2, 3], "ward": pd.Series([1, 2, 1], dtype=object)})
    neighbour = pd.DataFrame({"person": [0, 1, 2, 3], "ward": pd.Series([True, 1, 2, 1], dtype=object)})
    assert bound_frame(spec, spec.aggregates[0], neighbour, "person", None) == \
        bound_frame(spec, spec.aggregates[0], base, "person", None)
