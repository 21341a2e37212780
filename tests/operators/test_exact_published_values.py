"""Published values are exact in every sink (issue 25, item 7): integers above 2^53, beyond int64, and fixed-point
values with more digits than a double holds, through the Parquet output format, rows files and the SQL table on
SQLite and PostgreSQL; ``dpctl release verify`` compares them exactly.

A double ``value`` column wrote a noised count of 2^53 + 1 as 2^53, and a rows file, the only copy of its values,
kept the rounded one; ``dpctl release verify`` compared through doubles and called it a match. The releases here are
real (``run_release`` on a SQLite ledger) with the noise fixed (``NoiseStep.draw`` patched): the published values
are then known exactly, ``units * grid`` for each cell.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException
from dp_operators.ledger import ReleaseKey
from dp_operators.operators.locations import release_folder, release_stem
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import (
    ObjectStorageRowsStore,
    SQLTableSink,
    parquet_schema,
    release_rows,
    release_table,
    sql_release_table,
    write_files,
)
from dp_operators.operators.verification import release_files, verify_published
from dp_operators.release import ReleaseConfigError, run_release
from dp_operators.release import run as run_module
from dp_operators.release.plan import NoiseStep
from dp_operators.release.rows_file import ROWS_SUFFIX
from dp_operators.release.value_types import FLOAT64
from dp_operators.spec import ReleaseSpec

from sql_targets import database_target
from support import make_ledger

DAG = "exact_values"
RELEASE = "exact_values"
KEYS = ["a", "b", "c", "d"]
BIG = 2**53 + 1

#: Per aggregate: (its spec, its grid, the true values per key in grid units, the noise per key in grid units).
#: ``people`` reaches 2^53 + 1, -(2^53 + 1) and 2^63 - 1 (a true count at the engine's limit 2^62 plus noise);
#: ``income`` on grid 0.001 holds 123456789012345.678, 18 significant digits (a double holds 15 to 17);
#: ``tonnes`` on grid 1000 passes int64 ((2^62 - 1) * 1000, about 4.6e21).
AGGREGATES = {
    "people": ({"kind": "count"}, Fraction(1), [0, 2**53, 2**62, 0], [0, 1, 2**62 - 1, -BIG]),
    "income": ({"kind": "sum", "bounds": [-1000, 1000], "grid": "0.001"}, Fraction(1, 1000), [0, 0, 0, 0],
               [123456789012345678, -123456789012345678, 24751, 1]),
    "tonnes": ({"kind": "sum", "bounds": [-10**6, 10**6], "grid": 1000}, Fraction(1000), [0, 0, 0, 0],
               [2**62 - 1, -(2**62 - 1), 5, 0]),
}


def exact_values(name: str) -> list[Fraction]:
    """The published values of aggregate ``name``, exactly: (true + noise) * grid per key."""
    _, grid, true, noise = AGGREGATES[name]
    return [(t + n) * grid for t, n in zip(true, noise)]


def spec(names=tuple(AGGREGATES), **grids) -> ReleaseSpec:
    aggregates = []
    for name in names:
        fields = {**AGGREGATES[name][0], **({"grid": grids[name]} if name in grids else {})}
        aggregates.append({"name": name, **fields, "group_by": ["k"], "keys": {"k": KEYS},
                           "mechanism": "discrete_laplace", "budget": {"epsilon": 1}})
    return ReleaseSpec.model_validate({
        "version": 1, "release": RELEASE, "budget_account": "acct", "privacy_unit": "person",
        "aggregates": aggregates, "postprocess": {"clamp_nonnegative": False}})


def upstream(names=tuple(AGGREGATES)) -> dict:
    found = {}
    for name in names:
        fields, grid, true, _ = AGGREGATES[name]
        column = "count" if fields["kind"] == "count" else "sum"
        found[name] = [{"k": k, column: int(t * grid)} for k, t in zip(KEYS, true)]
    return found


@pytest.fixture
def fixed_noise(monkeypatch):
    """``NoiseStep.draw`` returns each aggregate's noise of :data:`AGGREGATES` (a test of publication, not of the
    samplers: every value published is then known exactly)."""
    def draw(step: NoiseStep, size=None):
        noise = AGGREGATES[step.aggregate][3]
        return np.array(noise, dtype=np.int64 if max(map(abs, noise)) < 2**62 else object)

    monkeypatch.setattr(NoiseStep, "draw", draw)


def key(run_id: str = "r1") -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run_id, task_id="release", map_index=-1, release_name=RELEASE)


def rows_store(root: Path, release_key: ReleaseKey) -> ObjectStorageRowsStore:
    """The operator's rows folder of ``release_key`` under ``root`` (where ``dpctl release verify`` looks)."""
    return ObjectStorageRowsStore(release_folder(f"file://{root}", release_key) / f"{release_stem(release_key)}"
                                                                                  f"{ROWS_SUFFIX}")


def release(tmp_path: Path, *, filed: bool, names=tuple(AGGREGATES), run_id: str = "r1", ledger=None) -> dict:
    """A committed release of ``names`` (rows files with ``filed``), published as JSON and Parquet under
    ``tmp_path / "out"``."""
    ledger = ledger or make_ledger(tmp_path / "ledger.db", cap="1000", accountant="approx_dp", dags=(DAG,),
                                   account="acct")
    root, release_key = tmp_path / "out", key(run_id)
    store = rows_store(root, release_key)
    output = run_release(spec(names), upstream(names), ledger, release_key, spec_hash="0" * 64,
                         rows_store=store if filed else None, inline_rows_limit=2 if filed else None).output
    write_files(output, release_folder(f"file://{root}", release_key), release_stem(release_key),
                ("json", "parquet"), rows_store=store)
    return output


def parquet_path(tmp_path: Path, run_id: str = "r1") -> Path:
    return Path((release_folder(f"file://{tmp_path / 'out'}", key(run_id)) / f"{release_stem(key(run_id))}.parquet")
                .path)


def column_values(table: pa.Table, name: str) -> list:
    """The values of aggregate ``name`` in a flat table, as the file holds them (``value``, or ``float_value``)."""
    rows = [row for row in table.to_pylist() if row["aggregate"] == name]
    return [row["float_value"] if row["value"] is None else row["value"] for row in rows]


def committed(output: dict, name: str) -> list:
    return [row["value"] for row in output["aggregates"][name]["rows"]]


# -- the Parquet output format and rows files ----------------------------------------------------------------------

def test_parquet_output_holds_integers_beyond_doubles_and_int64_exactly(tmp_path, fixed_noise):
    """Counts of 2^53 + 1, -(2^53 + 1) and 2^63 - 1 read back from the Parquet file as the ledger committed them, and
    a sum on grid 1000 beyond int64 too; a fixed-point value reads back as the grid value its double denotes."""
    output = release(tmp_path, filed=False)
    table = pq.read_table(parquet_path(tmp_path))
    assert committed(output, "people") == [0, BIG, 2**63 - 1, -BIG]  # the premise: the ledger holds them exactly
    assert column_values(table, "people") == committed(output, "people")
    assert column_values(table, "tonnes") == committed(output, "tonnes") == exact_values("tonnes")
    assert table.schema.field("value").type == pa.decimal128(25, 3)  # the join of int64, (19, 3) and (22, 0)
    income = column_values(table, "income")
    # the ledger holds a fractional grid value as the double nearest it: the file holds that grid value (exactly
    # the noised one wherever the double determines it) and reads back as the same double
    assert [float(value) for value in income] == committed(output, "income")
    assert income[2:] == [Decimal("24.751"), Decimal("0.001")]
    assert all(value == value.quantize(Decimal("0.001")) for value in income)


def test_rows_files_hold_every_value_exactly(tmp_path, fixed_noise):
    """A rows file, the only copy of its values, holds 2^53 + 1, 2^63 - 1, 123456789012345.678 (18 digits) and
    (2^62 - 1) * 1000 exactly, and so does the release's Parquet file streamed from them."""
    output = release(tmp_path, filed=True)
    published = pq.read_table(parquet_path(tmp_path))
    for name in AGGREGATES:
        rows_file = pq.read_table(Path(ObjectStoragePath(output["aggregates"][name]["rows_file"]["uri"]).path))
        assert [Fraction(v) for v in rows_file.column("value").to_pylist()] == exact_values(name), name
        assert [Fraction(v) for v in column_values(published, name)] == exact_values(name), name
    files = {name: pq.read_schema(Path(ObjectStoragePath(output["aggregates"][name]["rows_file"]["uri"]).path))
             for name in AGGREGATES}
    assert {name: schema.field("value").type for name, schema in files.items()} == {
        "people": pa.int64(), "income": pa.decimal128(19, 3), "tonnes": pa.decimal128(22, 0)}


def test_neighbouring_inputs_give_the_same_parquet_schema(tmp_path, fixed_noise):
    """The value column's type comes from public parameters: a count of 0 everywhere and one of 2^53 + 1 give the
    same int64 column."""
    ledger = make_ledger(tmp_path / "ledger.db", cap="1000", accountant="approx_dp", dags=(DAG,), account="acct")
    spec_of_counts = spec(("people",))
    small = run_release(spec_of_counts, {"people": [{"k": k, "count": 0} for k in KEYS]}, ledger, key("small"),
                        spec_hash="0" * 64).output
    large = run_release(spec_of_counts, upstream(("people",)), ledger, key("large"), spec_hash="0" * 64).output
    assert parquet_schema(small) == parquet_schema(large)
    assert parquet_schema(small).field("value").type == pa.int64()
    assert parquet_schema(small).names == parquet_schema(large).names  # no float_value: no binary-float aggregate


# -- the SQL table -------------------------------------------------------------------------------------------------

@pytest.fixture(params=["sqlite", "postgresql"])
def sql_target(request, tmp_path, monkeypatch):
    """``(conn_id, table, engine)`` on SQLite and on the local PostgreSQL (tests/sql_targets.py)."""
    yield from database_target(request.param, tmp_path, monkeypatch, "exact_values_sink")


def test_sql_table_holds_every_value_as_the_ledger_committed_it(tmp_path, fixed_noise, sql_target):
    """2^53 + 1, -(2^53 + 1), 2^63 - 1, integers beyond int64 and the doubles of a fixed-point grid read back from
    the SQL table equal to the committed values, types included (an int as an int, a float as the same double)."""
    conn_id, table, engine = sql_target
    output = release(tmp_path, filed=False)
    assert SQLTableSink(conn_id, table).write(output) == 12
    with engine.connect() as conn:
        stored = {(row.aggregate, row.key): row.value for row in conn.execute(sa.select(sql_release_table(table)))}
    expected = {(row["aggregate"], row["key"]): row["value"] for row in release_rows(output)}
    assert stored == expected
    assert {k: type(v) for k, v in stored.items()} == {k: type(v) for k, v in expected.items()}
    assert stored["people", '{"k":"b"}'] == BIG and stored["tonnes", '{"k":"a"}'] == (2**62 - 1) * 1000


def test_sql_sink_refuses_a_double_value_column_before_the_charge(tmp_path, sql_target):
    """A table of an older version, whose ``value`` is a double, would round integers above 2^53: ``prepare()``
    (called before the ledger reserves) refuses it and says how to convert it."""
    conn_id, table, engine = sql_target
    current = sql_release_table(table)
    older = sa.Table(current.name, sa.MetaData(), *(
        sa.Column(c.name, sa.Double if c.name == "value" else c.type, primary_key=c.primary_key,
                  nullable=c.nullable, autoincrement=False) for c in current.columns), schema=current.schema)
    older.create(engine)
    with pytest.raises(AirflowFailException, match="column value is .*(ALTER TABLE|INSERT INTO new SELECT)"):
        SQLTableSink(conn_id, table).prepare()


# -- dpctl release verify ------------------------------------------------------------------------------------------

def _verdicts(tmp_path: Path, ledger) -> dict[str, object]:
    found = verify_published(release_files(ObjectStoragePath(f"file://{tmp_path / 'out'}")), ledger.stored_output)
    return {Path(ObjectStoragePath(v.file).path).name: v for v in found}


def _rounded_through_doubles(path: Path) -> None:
    """Rewrite the Parquet file at ``path`` as a double ``value`` column would have written it."""
    table = pq.read_table(path)
    index = table.schema.get_field_index("value")
    values = pa.array([None if v is None else float(v) for v in table.column("value").to_pylist()], pa.float64())
    pq.write_table(table.set_column(index, pa.field("value", pa.float64()), values), path, compression="snappy")


@pytest.mark.parametrize("filed", [pytest.param(False, id="inline rows"), pytest.param(True, id="rows files")])
def test_verify_reports_a_value_rounded_through_a_double(tmp_path, fixed_noise, filed):
    """The release's Parquet file with 2^53 + 1 rounded to 2^53 (as a double column writes it) does not match the
    ledger, for inline rows and for rows files (whose values it streams); the file as published does."""
    ledger = make_ledger(tmp_path / "ledger.db", cap="1000", accountant="approx_dp", dags=(DAG,), account="acct")
    release(tmp_path, filed=filed, names=("people",), ledger=ledger)
    assert {name: v.verdict for name, v in _verdicts(tmp_path, ledger).items()} == {
        "release.json": "matches", "release.parquet": "matches"}
    _rounded_through_doubles(parquet_path(tmp_path))
    verdict = _verdicts(tmp_path, ledger)["release.parquet"]
    assert verdict.verdict == "differs"
    assert verdict.problems == ("row 1 differs from the committed output's table (release_table)",)


@pytest.mark.parametrize("filed", [pytest.param(False, id="inline rows"), pytest.param(True, id="rows files")])
def test_verify_accepts_files_written_before_values_were_typed(tmp_path, fixed_noise, monkeypatch, filed):
    """A release whose Parquet file (and rows files) hold doubles, as an older version wrote them, still verifies
    when every value is the committed one (a count exactly; a value on grid 0.001 as the double the ledger or the
    rows file holds), and does not when one differs."""
    names = ("income", "people")
    monkeypatch.setitem(AGGREGATES, "people", (AGGREGATES["people"][0], Fraction(1), [0, 5, 7, 0], [0, 1, 2, -3]))
    monkeypatch.setitem(AGGREGATES, "income", (*AGGREGATES["income"][:3], [24751, 1, -5, 0]))
    ledger = make_ledger(tmp_path / "ledger.db", cap="1000", accountant="approx_dp", dags=(DAG,), account="acct")
    with monkeypatch.context() as older:  # the older writer: a double value column everywhere
        older.setattr(run_module, "aggregate_value_type", lambda *args: FLOAT64)
        output = release(tmp_path, filed=filed, names=names, ledger=ledger)
    if filed:
        rows_file = Path(ObjectStoragePath(output["aggregates"]["income"]["rows_file"]["uri"]).path)
        assert pq.read_schema(rows_file).field("value").type == pa.float64()  # the premise: an older rows file
    _rounded_through_doubles(parquet_path(tmp_path))  # the older release Parquet file
    verdicts = _verdicts(tmp_path, ledger)
    assert {name: v.verdict for name, v in verdicts.items()} == {"release.json": "matches",
                                                                 "release.parquet": "matches"}
    assert verdicts["release.parquet"].notes[0].startswith("same values as the committed output, exactly, in another "
                                                           "schema (value as double)")
    assert release_table(output, rows_store(tmp_path / "out", key())).column("value").to_pylist() == [
        Decimal("24.751"), Decimal("0.001"), Decimal("-0.005"), 0, 0, 6, 9, -3]
    table = pq.read_table(parquet_path(tmp_path))
    values = table.column("value").to_pylist()
    values[6] = 10.0  # people's third key: 9 in the ledger
    pq.write_table(table.set_column(3, table.schema.field("value"), pa.array(values, pa.float64())),
                   parquet_path(tmp_path))
    assert _verdicts(tmp_path, ledger)["release.parquet"].problems == (
        "row 6 differs from the committed output's table (release_table)",)


# -- grids without an exact decimal form ---------------------------------------------------------------------------

def test_a_grid_without_a_decimal_form_is_refused_for_parquet_before_the_charge(tmp_path):
    """A sum on grid 1/3 has values no decimal column holds: the operator refuses Parquet output when the DAG is
    parsed, and the engine refuses rows files before reserving anything; JSON alone is published as before."""
    spec_path = tmp_path / "thirds.yaml"
    spec_path.write_text(f"""\
version: 1
release: {RELEASE}
budget_account: acct
privacy_unit: person
aggregates:
  - name: income
    kind: sum
    bounds: [-1000, 1000]
    grid: 1/3
    group_by: [k]
    keys: {{k: {KEYS}}}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
""")
    common = {"task_id": "release", "spec_path": spec_path, "aggregates_task_id": "up",
              "output_uri": f"file://{tmp_path / 'out'}"}
    with pytest.raises(ValueError, match="grid 1/3 has no exact decimal form"):
        DPReleaseOperator(output_formats=("json", "parquet"), **common)
    DPReleaseOperator(output_formats=("json",), **common)  # the control: JSON holds the values as before

    ledger = make_ledger(tmp_path / "ledger.db", cap="1000", accountant="approx_dp", dags=(DAG,), account="acct")
    with pytest.raises(ReleaseConfigError, match="grid 1/3 has no exact decimal form"):
        run_release(spec(("income",), income="1/3"), upstream(("income",)), ledger, key(), spec_hash="0" * 64,
                    rows_store=rows_store(tmp_path / "out", key()), inline_rows_limit=2)
    assert list(ledger.charges()) == []
