"""Sinks of a published release (dp_operators/operators/sinks.py), fed with real releases of the Adult example spec.

Every sink must write only the ledger's output and write it identically on a replay: the replays here are real
(``run_release`` on a committed key returns the ledger's stored output) and, to be sure order never leaks in, the
same output with every mapping's keys reversed.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException
from dp_operators.ledger import ReleaseKey
from dp_operators.operators import sinks
from dp_operators.operators.sinks import (
    COLUMNS,
    SQLTableSink,
    check_formats,
    parquet_schema,
    release_csv,
    release_rows,
    sql_release_table,
    write_files,
)
from dp_operators.release import run_release
from dp_operators.spec import ReleaseSpec, load_spec_with_hash

from support import EXAMPLE_SPEC, REPO, make_ledger
from sql_targets import database_target

DAG = "adult_census_release"


def release_key(run_id: str, map_index: int = -1) -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run_id, task_id="release", map_index=map_index,
                      release_name="adult_census_statistics")


@pytest.fixture(scope="module")
def releases(tmp_path_factory, adult_aggregates):
    """Two real releases of the example spec (runs ``r1`` and ``r2``) and the ledger's replay of the first."""
    spec, spec_hash = load_spec_with_hash(EXAMPLE_SPEC)
    ledger = make_ledger(tmp_path_factory.mktemp("sinks") / "ledger.db")
    first = run_release(spec, adult_aggregates, ledger, release_key("r1"), spec_hash=spec_hash)
    second = run_release(spec, adult_aggregates, ledger, release_key("r2"), spec_hash=spec_hash)
    replay = run_release(spec, adult_aggregates, ledger, release_key("r1"), spec_hash=spec_hash)
    assert not first.replayed and replay.replayed
    return first.output, second.output, replay.output


@pytest.fixture(scope="module")
def output(releases):
    return releases[0]


def reversed_keys(value):
    """``value`` with every mapping's keys in reverse order (lists keep theirs), as a JSON round trip may give."""
    if isinstance(value, dict):
        return {k: reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(v) for v in value]
    return value


def replays(releases):
    """The outputs a replay of the first release may hand a sink."""
    output, _, replay = releases
    return [pytest.param(replay, id="ledger replay"), pytest.param(reversed_keys(output), id="keys reversed")]


def folder_of(tmp_path: Path, name: str = "out") -> ObjectStoragePath:
    return ObjectStoragePath(f"file://{tmp_path / name / 'nested'}")


# -- release_rows and the CSV ---------------------------------------------------------------------------------------

def test_release_rows_are_the_published_values_aggregates_sorted(output):
    rows = release_rows(output)
    spec_domain = output["aggregates"]["people_by_education_sex"]["rows"]
    assert [r["aggregate"] for r in rows] == (
        ["mean_hours_per_week", "median_hours_per_week"] + ["people_by_age_band"] * 7
        + ["people_by_education_sex"] * len(spec_domain)
    )
    assert all(list(row) == list(COLUMNS) for row in rows)
    mean = rows[0]
    published = output["aggregates"]["mean_hours_per_week"]
    assert (mean["key"], mean["kind"], mean["value"], mean["half_width"], mean["mechanism"]) == (
        "{}", "mean", published["value"], published["half_width"], "discrete_laplace")
    # the median (exponential mechanism) publishes no value interval, only ranks: its row's interval is empty too
    median, (published,) = rows[1], output["aggregates"]["median_hours_per_week"]["rows"]
    assert (median["key"], median["kind"], median["value"], median["mechanism"]) == (
        '{"quantile":"0.5"}', "median", published["value"], "exponential")
    assert (median["half_width"], median["lower"], median["upper"]) == (None, None, None) == (
        published["half_width"], *published["interval"])
    education = rows[9:]
    assert [json.loads(r["key"]) for r in education] == [
        {"education": r["education"], "sex": r["sex"]} for r in spec_domain
    ]
    assert education[0]["key"] == '{"education":"Preschool","sex":"Female"}'  # the spec's key order, not sorted
    assert [r["value"] for r in education] == [r["value"] for r in spec_domain]
    for row in rows:
        assert row["confidence"] == output["confidence"] == 0.95
        assert row["saturated"] is False
        if row is median:
            continue
        assert row["lower"] <= row["value"] - row["half_width"] < row["value"] + row["half_width"] <= row["upper"]
        assert row["upper"] - row["lower"] == pytest.approx(2 * row["half_width"])


def test_rows_do_not_depend_on_the_order_of_the_output_keys(releases):
    output, _, replay = releases
    assert release_rows(reversed_keys(output)) == release_rows(output) == release_rows(replay)
    names = list(reversed_keys(output)["aggregates"])
    assert names != sorted(names)  # the control: the order did change


def test_csv_holds_the_rows_with_empty_fields_for_none(output):
    text = release_csv(output)
    assert text.splitlines()[0] == ",".join(COLUMNS)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert parsed == [{c: sinks._csv_field(v) if isinstance(v, bool) or v is None else str(v)
                       for c, v in row.items()} for row in release_rows(output)]
    assert parsed[2]["value"] == str(output["aggregates"]["people_by_age_band"]["rows"][0]["value"])
    assert parsed[2]["saturated"] == "false"
    median = [parsed[1][c] for c in ("aggregate", "half_width", "lower", "upper")]
    assert median == ["median_hours_per_week", "", "", ""]  # no value interval: empty fields, as for None


def test_a_grouped_aggregate_that_released_no_key_has_no_row(tmp_path):
    """Partition selection over keys held by one person each: none reaches the threshold (about 28 units), so
    ``rows`` is empty; the ungrouped aggregate beside it still has its row."""
    spec = ReleaseSpec.model_validate({
        "version": 1, "release": "selection", "budget_account": "acct", "privacy_unit": "person",
        "aggregates": [
            {"name": "by_zip", "kind": "count", "group_by": ["zip"], "mechanism": "discrete_laplace",
             "budget": {"epsilon": 1},
             "partition_selection": {"mechanism": "discrete_laplace", "budget": {"epsilon": 1, "delta": 1e-6}}},
            {"name": "total", "kind": "count", "mechanism": "discrete_laplace", "budget": {"epsilon": 1}},
        ]})
    ledger = make_ledger(tmp_path / "l.db", cap="100", accountant="approx_dp", dags=("d",), account="acct")
    key = ReleaseKey(dag_id="d", run_id="r", task_id="t", map_index=-1, release_name="selection")
    upstream = {"by_zip": [{"zip": f"{n:05d}", "count": 1} for n in range(5)], "total": 5}
    output = run_release(spec, upstream, ledger, key, spec_hash="0" * 64).output
    assert output["aggregates"]["by_zip"]["rows"] == []
    assert [r["aggregate"] for r in release_rows(output)] == ["total"]
    written = write_files(output, folder_of(tmp_path), "t", ("csv", "parquet"))
    assert pq.read_table(written["parquet"].path).num_rows == 1


# -- files ----------------------------------------------------------------------------------------------------------

def test_write_files_writes_every_format(tmp_path, output):
    folder = folder_of(tmp_path)
    written = write_files(output, folder, "release~3", ("json", "csv", "parquet"))
    assert list(written) == ["json", "csv", "parquet"]
    assert {p.name for p in Path(folder.path).iterdir()} == {"release~3.json", "release~3.csv", "release~3.parquet"}
    assert json.loads(written["json"].read_text()) == output
    assert written["csv"].read_text() == release_csv(output)
    table = pq.read_table(written["parquet"].path)
    assert table.schema.equals(parquet_schema(output))
    # counts beside a mean: the counts' int64 value, the mean's float_value; no pandas index column
    assert table.column_names == [*COLUMNS[:4], "float_value", *COLUMNS[4:]]
    assert b"pandas" not in (table.schema.metadata or {})
    found, rows = table.to_pylist(), release_rows(output)
    assert [{c: r[c] for c in COLUMNS if c != "value"} for r in found] == [
        {c: r[c] for c in COLUMNS if c != "value"} for r in rows]
    assert [r["float_value"] if r["value"] is None else r["value"] for r in found] == [r["value"] for r in rows]
    assert (table.schema.field("value").type, table.schema.field("float_value").type) == (pa.int64(), pa.float64())


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_a_replay_writes_identical_bytes(tmp_path, releases, fmt):
    output = releases[0]
    first = write_files(output, folder_of(tmp_path, "a"), "release", (fmt,))[fmt].read_bytes()
    for number, replayed in enumerate([releases[2], reversed_keys(output)]):
        fresh = write_files(replayed, folder_of(tmp_path, f"b{number}"), "release", (fmt,))[fmt].read_bytes()
        assert fresh == first
    other = write_files(releases[1], folder_of(tmp_path, "c"), "release", (fmt,))[fmt].read_bytes()
    assert other != first  # the control: another release's noise gives other bytes


def test_parquet_bytes_are_the_same_in_another_process(tmp_path, output):
    """No timestamp or random id in the file: a process started later writes the same bytes."""
    (tmp_path / "output.json").write_text(json.dumps(output))
    here = sinks.release_parquet(output)
    code = ("import json, sys; from dp_operators.operators.sinks import release_parquet; "
            "sys.stdout.buffer.write(release_parquet(json.load(open(sys.argv[1]))))")
    time.sleep(1.1)  # a timestamp of one-second resolution would now differ
    there = subprocess.run([sys.executable, "-c", code, str(tmp_path / "output.json")], check=True,
                           capture_output=True, cwd=REPO).stdout
    assert there == here


def test_a_replay_leaves_published_files_untouched(tmp_path, releases):
    folder = folder_of(tmp_path)
    written = write_files(releases[0], folder, "release", ("json", "csv", "parquet"))
    stamps = {fmt: os.stat(path.path).st_mtime_ns for fmt, path in written.items()}
    time.sleep(0.01)
    write_files(releases[2], folder, "release", ("json", "csv", "parquet"))
    assert {fmt: os.stat(path.path).st_mtime_ns for fmt, path in written.items()} == stamps


def test_parquet_with_the_same_content_in_other_bytes_is_kept(tmp_path, releases):
    """A file another pyarrow version wrote (here: other compression) holds the same table: a replay keeps it.
    Another release's table in the same place is replaced."""
    folder = folder_of(tmp_path)
    folder.mkdir(parents=True)
    target = Path(folder.path) / "release.parquet"
    pq.write_table(sinks.release_table(releases[0]), target, compression="gzip")
    kept = target.read_bytes()
    assert kept != sinks.release_parquet(releases[0])
    write_files(releases[2], folder, "release", ("parquet",))
    assert target.read_bytes() == kept
    write_files(releases[1], folder, "release", ("parquet",))
    assert target.read_bytes() == sinks.release_parquet(releases[1])


def test_a_failed_local_write_leaves_the_old_file_whole_and_no_temporary(tmp_path, releases, monkeypatch):
    folder = folder_of(tmp_path)
    old = write_files(releases[1], folder, "release", ("csv",))["csv"].read_bytes()

    def refuse(*args):
        raise OSError("disk full")

    monkeypatch.setattr(sinks.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_files(releases[0], folder, "release", ("csv",))
    assert [p.name for p in Path(folder.path).iterdir()] == ["release.csv"]
    assert (Path(folder.path) / "release.csv").read_bytes() == old


def test_unknown_format_is_refused_before_anything_is_written(tmp_path, output):
    with pytest.raises(ValueError, match=r"unknown output format\(s\) 'xlsx'; valid formats: json, csv, parquet"):
        write_files(output, folder_of(tmp_path), "release", ("json", "xlsx"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("formats", "expected"), [
    pytest.param(("csv", "json", "csv"), ("csv", "json"), id="duplicates dropped, order kept"),
    pytest.param([], (), id="no file"),
    pytest.param(["parquet"], ("parquet",), id="a list"),
])
def test_check_formats(formats, expected):
    assert check_formats(formats) == expected


@pytest.mark.parametrize("formats", [
    pytest.param("json", id="a bare string"),
    pytest.param(("JSON",), id="upper case"),
    pytest.param(("json", "xml"), id="unknown"),
])
def test_check_formats_refuses(formats):
    with pytest.raises(ValueError, match="valid formats: json, csv, parquet|not a string"):
        check_formats(formats)


@pytest.mark.parametrize("stem", ["", "..", "a/b", "a\\b"])
def test_a_stem_that_is_not_one_file_name_is_refused(tmp_path, output, stem):
    with pytest.raises(ValueError, match="one file name"):
        write_files(output, folder_of(tmp_path), stem, ("json",))


# -- the SQL table --------------------------------------------------------------------------------------------------

@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql")])
def sql_target(request, tmp_path, monkeypatch):
    """``(conn_id, table, engine)`` on each backend (tests/sql_targets.py)."""
    yield from database_target(request.param, tmp_path, monkeypatch, "dp_sink_test")


def stored(engine: sa.Engine, table: str, run_id: str | None = None) -> list[dict]:
    """The rows of ``table`` (of one run), sorted by release key, aggregate and key."""
    release_table = sql_release_table(table)
    query = sa.select(release_table)
    if run_id is not None:
        query = query.where(release_table.c.run_id == run_id)
    with engine.connect() as conn:
        rows = [dict(row._mapping) for row in conn.execute(query)]
    return sorted(rows, key=lambda r: (r["run_id"], r["aggregate"], r["key"]))


def expected_rows(output: dict) -> list[dict]:
    return sorted(release_rows(output), key=lambda r: (r["aggregate"], r["key"]))


def test_sql_sink_writes_the_rows_once_per_release_key(sql_target, releases):
    conn_id, table, engine = sql_target
    first, second, replay = releases
    sink = SQLTableSink(conn_id, table)
    assert sink.write(first) == len(release_rows(first)) == 41
    rows = stored(engine, table)
    assert [{c: r[c] for c in COLUMNS} for r in rows] == expected_rows(first)
    released_at = dt.datetime.fromisoformat(first["released_at"])
    for row in rows:
        assert {k: row[k] for k in first["release_key"]} == first["release_key"]
        assert row["spec_hash"] == first["spec_hash"]
        at = row["released_at"]
        assert (at if at.tzinfo else at.replace(tzinfo=dt.timezone.utc)) == released_at

    for replayed in (replay, reversed_keys(first)):
        assert sink.write(replayed) == 41
        assert stored(engine, table) == rows  # same count, same content

    assert sink.write(second) == 41
    assert stored(engine, table, "r1") == rows  # the first release untouched
    assert [{c: r[c] for c in COLUMNS} for r in stored(engine, table, "r2")] == expected_rows(second)
    assert len(stored(engine, table)) == 82


def test_sql_sink_without_create_table_needs_the_table(sql_target, output):
    conn_id, table, _ = sql_target
    with pytest.raises(sa.exc.SQLAlchemyError):
        SQLTableSink(conn_id, table, create_table=False).write(output)
    SQLTableSink(conn_id, table).write(output)  # creates it
    assert SQLTableSink(conn_id, table, create_table=False).write(output) == 41


@pytest.mark.parametrize("sql_target", ["postgresql"], indirect=True)
def test_sql_sink_retries_when_a_concurrent_writer_commits_first(sql_target, releases):
    """Two tries of one release write at once: this one's delete runs before the other's rows are committed, its
    insert then waits on the primary key and fails when the other commits. The retry makes it succeed with the
    same rows. (PostgreSQL only: SQLite serialises whole transactions, so the race cannot happen there.)"""
    conn_id, table, engine = sql_target
    output = releases[0]
    sink = SQLTableSink(conn_id, table)
    sink.write(releases[1])  # creates the table
    release_table = sql_release_table(table)
    errors = []
    other = engine.connect()
    transaction = other.begin()
    other.execute(release_table.insert(), sink.rows(output))
    thread = threading.Thread(target=lambda: errors.append(_try(sink.write, output)))
    thread.start()
    deadline = time.monotonic() + 10
    with engine.connect() as conn:
        while time.monotonic() < deadline and not conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )).scalar():
            time.sleep(0.05)
    transaction.commit()
    other.close()
    thread.join(30)
    assert errors == [None]
    assert [{c: r[c] for c in COLUMNS} for r in stored(engine, table, "r1")] == expected_rows(output)


def _try(function, *args):
    try:
        function(*args)
    except Exception as error:  # noqa: BLE001 - returned for the assertion
        return error
    return None


@pytest.mark.parametrize("table", [
    pytest.param("releases; DROP TABLE x", id="statement"),
    pytest.param("a.b.c", id="three parts"),
    pytest.param("1releases", id="leading digit"),
    pytest.param("", id="empty"),
    pytest.param("dp-releases", id="hyphen"),
    pytest.param('dp"releases', id="quote"),
    pytest.param("public.", id="empty table part"),
    pytest.param(".releases", id="empty schema part"),
])
def test_a_bad_table_name_is_refused_at_construction(table):
    with pytest.raises(ValueError, match="'table' or 'schema.table'"):
        SQLTableSink("dp_sink_test", table)


def test_good_table_names_and_a_missing_conn_id():
    assert SQLTableSink("c", "public.dp_releases").table == "public.dp_releases"
    assert SQLTableSink("c", "_Releases2").create_table is True
    with pytest.raises(ValueError, match="connection id"):
        SQLTableSink("", "releases")


def test_a_connection_that_is_not_sql_is_refused(monkeypatch, output, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_DP_SINK_NOT_SQL", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{tmp_path / 'x.db'}"}}))
    with pytest.raises(AirflowFailException, match="not a SQL hook"):
        SQLTableSink("dp_sink_not_sql", "releases").write(output)


def test_the_json_file_is_the_standard_librarys_indented_text_character_for_character():
    """``release_json`` writes exactly ``json.dumps(output, indent=2, sort_keys=True)`` plus a newline, whatever
    the nesting, the rows (flat dicts, one C call) or the strings (quotes, braces, newlines, non-ASCII) hold."""
    import random

    from dp_operators.operators.sinks import release_json

    rng = random.Random(23)

    def scalar():
        return rng.choice([None, True, False, rng.randint(-10**30, 10**30), rng.random() * 10**rng.randint(-9, 30),
                           -0.0, 1e-5, 1e16, "é\n\"}, {x", "", "a}", "},\n      {", "\u2028"])

    def document(depth):
        draw = rng.random()
        if depth > 3 or draw < 0.4:
            return scalar()
        if draw < 0.6:
            return {rng.choice(["b", "a", "é", "x y", "}"]) + str(i): document(depth + 1)
                    for i in range(rng.randint(0, 4))}
        if draw < 0.8:
            return [{rng.choice(["k", "v}", "{"]) + str(j): scalar() for j in range(rng.randint(1, 4))}
                    for _ in range(rng.randint(1, 5))]
        return [document(depth + 1) for _ in range(rng.randint(0, 4))]

    for _ in range(3000):
        output = {"aggregates": document(0), "rows": document(1)}
        assert release_json(output) == json.dumps(output, indent=2, sort_keys=True) + "\n"
