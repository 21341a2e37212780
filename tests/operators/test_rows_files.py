"""Large releases through the operator (docs/adr/0023): above ``inline_rows_limit`` cells a count's or sum's
rows go to a Parquet rows file under ``output_uri``; the ledger and XCom hold its location and SHA-256; the
Parquet sink streams it; a replay writes the same bytes, and refuses (charging nothing) when the file was altered
or removed; what cannot publish rows files is refused before the ledger is called."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException
from dp_operators.operators.locations import storage_path_of
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import release_table
from dp_operators.operators.verification import release_files, verify_published
from dp_operators.release.columns import is_table

from airflow_fakes import FakeTaskInstance, context_for
from operator_ledgers import connect_ledger
from rows_files_support import XS, YS, rows_spec, write_tables
from support import make_ledger

DAG = "rows_files_dag"
ACCOUNT = "rows_files_account"

SPEC = rows_spec("rows_files", ACCOUNT, extra="""\
  - name: total
    kind: count
    mechanism: discrete_laplace
    budget: {epsilon: 1}
""")


def tables(folder: Path) -> dict[str, str]:
    (folder / "total.json").write_text("12345")
    return {**write_tables(folder), "total": f"file://{folder / 'total.json'}"}


@pytest.fixture
def env(tmp_path: Path, monkeypatch):
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path, cap="100", accountant="approx_dp", dags=(DAG,), account=ACCOUNT)
    connect_ledger(monkeypatch, "dp_ledger_rows", path)
    spec = tmp_path / "rows.yaml"
    spec.write_text(SPEC)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    return ledger, spec, tables(inputs)


def operator(spec: Path, uris, out: Path | None, formats=("json", "parquet"), limit=1000) -> DPReleaseOperator:
    return DPReleaseOperator(task_id="release", spec_path=spec, aggregates_uri=uris,
                             output_uri=None if out is None else f"file://{out}", output_formats=formats,
                             ledger_conn_id="dp_ledger_rows", inline_rows_limit=limit)


def test_the_parquet_source_reaches_the_engine_as_an_arrow_table(env):
    _, spec, uris = env
    read = operator(spec, uris, None, limit=None).read_aggregates({})
    assert is_table(read["cells"]) and is_table(read["sums"]) and read["total"] == 12345


def test_rows_files_are_published_replayed_byte_for_byte_and_verified(env, tmp_path):
    ledger, spec, uris = env
    out = tmp_path / "out"
    op = operator(spec, uris, out)
    ti = FakeTaskInstance(upstream=None, dag_id=DAG)
    first = op.execute(context_for(ti))
    for name in ("cells", "sums"):
        reference = first["aggregates"][name]["rows_file"]
        assert "rows" not in first["aggregates"][name] and reference["rows"] == XS * YS
        assert reference["uri"].endswith(".parquet") and "~rows/" in reference["uri"]
    assert "rows" not in first["aggregates"]["total"] and "value" in first["aggregates"]["total"]  # 1 cell: inline
    # the ledger holds the reference, not the rows
    assert ledger.stored_output(_key(ti)) == first
    parquet_file = Path(storage_path_of(op.published.locations["parquet"]).path)
    published = pq.read_table(parquet_file)
    assert published.num_rows == 2 * XS * YS + 1
    assert published.equals(release_table(first))
    written = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert len([name for name in written if "~rows/" in name]) == 2

    verdicts = verify_published(release_files(ObjectStoragePath(f"file://{out}")), ledger.stored_output)
    assert [v.verdict for v in verdicts] == ["matches", "matches"], verdicts

    parquet_file.unlink()
    ti.try_number = 2
    again = op.execute(context_for(ti))
    assert json.dumps(again) == json.dumps(first)
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == written


def _key(ti):
    from dp_operators.ledger import ReleaseKey

    return ReleaseKey(dag_id=DAG, run_id=ti.run_id, task_id="release", map_index=-1, release_name="rows_files")


def test_an_altered_rows_file_is_refused_on_replay_and_by_verify(env, tmp_path):
    ledger, spec, uris = env
    out = tmp_path / "out"
    op = operator(spec, uris, out)
    ti = FakeTaskInstance(upstream=None, dag_id=DAG)
    first = op.execute(context_for(ti))
    spent = ledger.account(ACCOUNT).spent
    target = Path(storage_path_of(first["aggregates"]["cells"]["rows_file"]["uri"]).path)
    table = pq.read_table(target)
    values = table.column("value").to_pylist()
    values[0] += 1000  # a forged cell
    pq.write_table(table.set_column(3, "value", pa.array(values, pa.float64())), target)
    verdicts = verify_published(release_files(ObjectStoragePath(f"file://{out}")), ledger.stored_output)
    assert any("does not hold the committed bytes" in " ".join(v.problems) for v in verdicts)
    ti.try_number = 2
    with pytest.raises(AirflowFailException, match="does not hold the committed bytes"):
        op.execute(context_for(ti))
    shutil.rmtree(target.parent)
    with pytest.raises(AirflowFailException, match="cannot be read"):
        op.execute(context_for(ti))
    assert ledger.account(ACCOUNT).spent == spent  # nothing charged, nothing redrawn


@pytest.mark.parametrize(
    "formats, out, match",
    [
        (("json", "csv"), True, "output_formats asks for csv, which takes inline rows only"),
        (("json",), False, "the operator has no output_uri"),
    ],
)
def test_what_cannot_take_rows_files_is_refused_when_the_dag_is_parsed_and_before_the_ledger(
    env, tmp_path, formats, out, match
):
    ledger, spec, uris = env
    with pytest.raises(ValueError, match=match):  # a DAG import error
        operator(spec, uris, tmp_path / "out" if out else None, formats=formats)
    op = operator(spec, uris, tmp_path / "out" if out else None, formats=formats, limit=None)
    op.inline_rows_limit = 1000  # changed after parsing (a template, a subclass): checked again at run time
    with pytest.raises(AirflowFailException, match=match):
        op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG)))
    assert ledger.account(ACCOUNT).spent == 0


@pytest.mark.parametrize("limit", [-1, 1.5, True, "100000"])
def test_a_bad_inline_rows_limit_is_refused_when_the_dag_is_parsed(env, tmp_path, limit):
    _, spec, uris = env
    with pytest.raises(ValueError, match="inline_rows_limit must be None or an int >= 0"):
        operator(spec, uris, tmp_path / "out", limit=limit)


def test_a_large_mean_is_refused_not_put_in_the_ledger(env, tmp_path):
    ledger, _, uris = env
    spec = tmp_path / "mean.yaml"
    spec.write_text(rows_spec("rows_files", ACCOUNT).replace("kind: sum", "kind: mean"))
    with pytest.raises(ValueError, match=r"sums \(mean, 1200 cells\).*release its bounded sum and its count"):
        operator(spec, uris, tmp_path / "out")
    assert ledger.account(ACCOUNT).spent == 0


def test_below_the_limit_every_row_is_inline(env, tmp_path):
    _, spec, uris = env
    op = operator(spec, uris, tmp_path / "out", formats=("json", "csv", "parquet"), limit=None)
    output = op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG)))
    assert len(output["aggregates"]["cells"]["rows"]) == XS * YS
    assert not list((tmp_path / "out").rglob("*~rows"))


@pytest.mark.parametrize("change", ["one person fewer", "a NULL sum (the row reader's path)"])
def test_neighbouring_inputs_look_the_same_but_for_the_noised_values(tmp_path, monkeypatch, caplog, change):
    """Two releases of neighbouring tables (one person's row changed): everything an observer sees but the noised
    values and interval ends is identical: outcome, output fields, rows file sizes and schemas, key, half-width
    and saturation columns, file names but for their digests, ledger charges and the task log."""
    import logging
    import re

    spec = tmp_path / "rows.yaml"
    spec.write_text(SPEC)
    seen = {}
    for name in ("with", "without"):  # each release on a fresh ledger with the same cap
        path = tmp_path / f"ledger_{name}.db"
        ledger = make_ledger(path, cap="100", accountant="approx_dp", dags=(DAG,), account=ACCOUNT)
        connect_ledger(monkeypatch, "dp_ledger_rows", path)
        folder = tmp_path / name
        folder.mkdir()
        uris = tables(folder)
        if name == "without":
            cells = pq.read_table(folder / "cells.parquet")
            sums = pq.read_table(folder / "sums.parquet")
            if change == "one person fewer":
                counts = cells.column("count").to_pylist()
                counts[5] -= 1
                pq.write_table(cells.set_column(2, "count", pa.array(counts, pa.int64())), folder / "cells.parquet")
            else:
                values = sums.column("sum").to_pylist()
                values[5] = None
                pq.write_table(sums.set_column(2, "sum", pa.array(values, pa.int64())), folder / "sums.parquet")
        out = tmp_path / f"out_{name}"
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            output = operator(spec, uris, out).execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG)))
        files = sorted(re.sub(r"-[0-9a-f]{16}\.parquet$", "-<digest>.parquet", str(p.relative_to(out)))
                       for p in out.rglob("*") if p.is_file())
        flat = pq.read_table(next(out.rglob("release.parquet")))
        public = flat.drop_columns(["value", "lower", "upper"])
        log = [re.sub(r"[0-9a-f]{64}|[0-9a-f]{16}", "<hex>",
                      r.getMessage().replace(str(folder), "<in>").replace(str(out), "<out>").replace(str(path), "<db>"))
               for r in caplog.records]
        # times, the lease token and digests of the (noised) output differ between any two releases
        charges = [{k: v for k, v in c.items() if not (k.endswith("_at") or "sha256" in k or "token" in k
                                                       or "output" in k or "lease" in k)}
                   for c in ledger.charges()]
        shape = {name: sorted(a) for name, a in output["aggregates"].items()}
        rows = {name: (a["rows_file"]["rows"], a["rows_file"]["format"]) for name, a in output["aggregates"].items()
                if "rows_file" in a}
        seen[name] = (files, public, flat.schema, log, charges, shape, rows)
    a, b = seen["with"], seen["without"]
    for index, what in enumerate(["files", None, "schema", "log", "ledger charges", "output fields", "rows files"]):
        if what:
            assert a[index] == b[index], what
    assert a[1].equals(b[1])


def test_dpctl_release_show_names_the_rows_file(env, tmp_path):
    from typer.testing import CliRunner

    from dp_operators.cli import app

    _, spec, uris = env
    op = operator(spec, uris, tmp_path / "out")
    output = op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG)))
    published = Path(storage_path_of(op.published.locations["json"]).path)
    result = CliRunner().invoke(app, ["release", "show", str(published)])
    assert result.exit_code == 0, result.output
    assert f"{XS * YS} rows in the rows file" in " ".join(result.output.split())
    assert output["aggregates"]["cells"]["rows_file"]["sha256"][:16] in result.output


def test_the_python_api_keeps_a_large_vector_inline(tmp_path):
    """``vector_release`` returns its values: above ``inline_rows_limit`` too, without a rows store."""
    from dp_operators.api import vector_release
    from dp_operators.ledger import ReleaseKey
    from dp_operators.release import INLINE_ROWS_LIMIT

    ledger = make_ledger(tmp_path / "api.db", cap="100", accountant="pure_dp", dags=("api_dag",), account="api")
    size = INLINE_ROWS_LIMIT + 1
    result = vector_release([1] * size, sensitivity=1, epsilon=1, max_partitions_contributed=1, ledger=ledger,
                            account="api", key=ReleaseKey("api_dag", "r", "t", -1, "vector"))
    assert len(result.values) == size


def test_published_files_are_readable_by_others(env, tmp_path):
    """Every published file (JSON, CSV and Parquet written from bytes, rows files, the streamed Parquet) is 0644,
    not the 0600 a temporary file is created with."""
    import stat

    _, spec, uris = env
    out = tmp_path / "out"
    operator(spec, uris, out, formats=("json", "parquet")).execute(
        context_for(FakeTaskInstance(upstream=None, dag_id=DAG)))
    small = tmp_path / "small"
    operator(spec, uris, small, formats=("json", "csv", "parquet"), limit=None).execute(
        context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id="small")))
    files = [p for p in [*out.rglob("*"), *small.rglob("*")] if p.is_file()]
    assert len(files) == 4 + 3
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o644"}


# ---- refusals when the DAG is parsed ------------------------------------------------------------------------------
@pytest.fixture
def large_spec(tmp_path):
    path = tmp_path / "rows.yaml"
    path.write_text(rows_spec("rows_parse", "rows_account"))
    return path


def test_a_templated_output_uri_still_refuses_csv_at_parse_time(large_spec):
    """With a templated ``output_uri``, the other rows-file refusals (CSV here) are still DAG import errors."""
    with pytest.raises(ValueError, match="csv"):
        DPReleaseOperator(task_id="release", spec_path=large_spec, aggregates_uri="file:///in/cells.parquet",
                          output_uri="{{ var.value.release_root }}", output_formats=("json", "csv"),
                          inline_rows_limit=1000)


def test_a_partial_that_rules_out_rows_files_is_refused_at_parse_time(large_spec):
    """``.partial(...).expand(...)`` whose partial arguments rule out rows files is refused when the DAG is parsed."""
    # Airflow builds a mapped operator only when an instance runs, so ``partial`` itself must check.
    import datetime

    from airflow.sdk import DAG as Dag

    with pytest.raises(ValueError, match="csv"):
        with Dag("rows_partial_dag", schedule=None, start_date=datetime.datetime(2026, 1, 1)):
            DPReleaseOperator.partial(task_id="release", spec_path=str(large_spec), output_uri="file:///out",
                                      output_formats=("json", "csv"), inline_rows_limit=1000).expand(
                aggregates_uri=["file:///in/a.parquet", "file:///in/b.parquet"])


def test_a_mapped_instance_that_cannot_take_rows_files_is_refused_when_unmapped(large_spec):
    """A mapped instance with expanded formats that rule out rows files is refused when built, before the ledger."""
    import datetime

    from airflow.sdk import DAG as Dag

    with Dag("rows_unmap_dag", schedule=None, start_date=datetime.datetime(2026, 1, 1)):
        # the formats are expanded, so parsing cannot know them: the instance is refused when built
        mapped = DPReleaseOperator.partial(task_id="release", spec_path=str(large_spec), output_uri="file:///out",
                                           aggregates_uri="file:///in/a.parquet", inline_rows_limit=1000).expand(
            output_formats=[("json", "csv")])
    with pytest.raises(ValueError, match="csv"):
        mapped.unmap({"output_formats": ("json", "csv")})


@pytest.mark.parametrize("arguments, match", [
    ({"output_uri": "file:///out", "output_formats": ("json", "csv")}, "csv"),
    ({"output_formats": ("json", "parquet")}, "no output_uri"),
    ({"output_uri": "file:///out", "output_formats": ("json", "parquet"), "sql_sink": "SINK"}, "SQL sink"),
])
def test_the_sql_release_operator_refuses_what_cannot_take_rows_files_at_parse_time(large_spec, arguments, match):
    """``DPSQLReleaseOperator`` passes its arguments through, so its rows-file refusals are DAG import errors too."""
    from dp_operators.operators.sinks import SQLTableSink
    from dp_operators.operators.sql import DPSQLReleaseOperator

    if arguments.get("sql_sink") == "SINK":
        arguments = {**arguments, "sql_sink": SQLTableSink(conn_id="warehouse", table="dp_releases")}
    with pytest.raises(ValueError, match=match):
        DPSQLReleaseOperator(task_id="release", spec_path=large_spec, conn_id="warehouse",
                             queries={"cells": "SELECT 1", "sums": "SELECT 1"}, inline_rows_limit=1000,
                             **arguments)


def test_key_values_are_written_as_the_standard_librarys_json():
    """The ``key`` column's values are ``json.dumps(v, ensure_ascii=False)`` of each public key value: quotes,
    backslashes, control and non-ASCII characters, NUL, and ints beyond int64."""
    from dp_operators.release.rows_file import _json_texts

    values = ["a", "é", '"q"', "\n\u2028", "", "x\\y", "\x00", 0, -5, 2**70]
    assert _json_texts(values) == [json.dumps(v, ensure_ascii=False) for v in values]
