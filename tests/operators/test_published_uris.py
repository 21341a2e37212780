"""Published locations are RFC 3986 URIs that standard readers open as they are (ADR 0021, "URIs").

A release's folder names hold a literal ``%`` (a run id's ``:`` is the folder ``%3A``): every URI a release publishes
(XCom ``release_location``, the asset event's ``extra["location"]``, OpenLineage outputs, a rows file's ``uri`` in
the ledger) writes that ``%`` as ``%25``, so urllib, pandas and pyarrow, which percent-decode a URI's path once, open
the file that was written. The path text as it was published before (the raw ``%``) must not open: the negative
control. A release committed before, whose rows files' URIs hold the raw ``%``, still replays and verifies.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse
from urllib.request import url2pathname

import pandas as pd
import pyarrow.fs
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from airflow.sdk import ObjectStoragePath
from dp_operators.cli import app
from dp_operators.ledger import ReleaseKey
from dp_operators.operators.locations import published_uri, storage_path_of
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import ObjectStorageRowsStore, publish_file, release_table
from dp_operators.operators.verification import release_files, verify_published
from dp_operators.release import LocalRowsStore
from dp_operators.release.rows_file import check_rows_files, local_path, parquet_schema, write_rows_file

from airflow_fakes import FakeTaskInstance, context_for, emitted_events
from operator_ledgers import connect_ledger
from rows_files_support import XS, YS, rows_spec, write_tables
from support import make_ledger

DAG = "published_uris_dag"
ACCOUNT = "published_uris_account"
RELEASE = "published_uris"
CONN = "dp_ledger_published_uris"

RUN_IDS = [
    pytest.param("manual__2026-01-01T00:00:00+00:00", id="run id with : and +"),
    pytest.param("a%2Fb c é", id="run id with %, a space and non-ASCII"),
]

#: RFC 3986 appendix A: ``scheme "://" authority path-abempty`` with no query or fragment; a path character is
#: unreserved, a sub-delim, ":", "@", "/" or a percent-encoded octet.
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[A-Za-z0-9\-._~%!$&'()*+,;=:]*"
                  r"(?:/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*)*")


@pytest.fixture
def env(tmp_path: Path, monkeypatch):
    """A ledger, the spec (two aggregates of 1,200 cells and one count) and its Parquet inputs, and an output
    folder whose own name holds a ``%`` (the operator's output_uri, which ``ObjectStoragePath`` takes literally)."""
    ledger = make_ledger(tmp_path / "ledger.db", cap="100", accountant="approx_dp", dags=(DAG,), account=ACCOUNT)
    connect_ledger(monkeypatch, CONN, tmp_path / "ledger.db")
    spec = tmp_path / "spec.yaml"
    spec.write_text(rows_spec(RELEASE, ACCOUNT, extra="""\
  - name: total
    kind: count
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""))
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "total.json").write_text("12345")
    uris = {**write_tables(inputs), "total": f"file://{inputs / 'total.json'}"}
    return ledger, spec, uris, tmp_path / "out%41"


def operator(env, formats, limit, out: Path | None = None) -> DPReleaseOperator:
    _, spec, uris, default_out = env
    out = out or default_out
    return DPReleaseOperator(task_id="release", spec_path=spec, aggregates_uri=uris, output_uri=f"file://{out}",
                             output_formats=formats, ledger_conn_id=CONN, inline_rows_limit=limit)


def read_with_urllib(uri: str) -> bytes:
    """The file's bytes through the standard library alone: ``urlopen``, and ``url2pathname`` of the parsed path
    (which must agree)."""
    with urllib.request.urlopen(uri) as response:
        data = response.read()
    with open(url2pathname(urlparse(uri).path), "rb") as handle:
        assert handle.read() == data
    return data


def read_with_pyarrow(uri: str) -> bytes:
    filesystem, path = pyarrow.fs.FileSystem.from_uri(uri)
    with filesystem.open_input_stream(path) as stream:
        return stream.read()


def read_with_pandas(uri: str, fmt: str) -> pd.DataFrame | pd.Series:
    if fmt == "json":
        return pd.read_json(uri, typ="series")
    return pd.read_csv(uri) if fmt == "csv" else pd.read_parquet(uri)


def previous_form(uri: str) -> str:
    """The location as it was published before: the storage path's text, its folders' ``%`` raw."""
    return str(storage_path_of(uri))


def assert_opens_as_published(uri: str, fmt: str, written: Path) -> None:
    assert _URI.fullmatch(uri), uri
    assert read_with_urllib(uri) == written.read_bytes()
    assert read_with_pyarrow(uri) == written.read_bytes()
    assert len(read_with_pandas(uri, fmt)) > 0
    if fmt == "parquet":
        assert pq.read_table(uri).equals(pq.read_table(written))


def assert_previous_form_does_not_open(uri: str, fmt: str) -> None:
    """Each reader decodes the previous form (a valid URI: the run id's characters are ``%XX`` in it) to a path
    that does not exist."""
    old = previous_form(uri)
    assert old != uri and _URI.fullmatch(old)
    with pytest.raises(OSError):
        read_with_urllib(old)
    with pytest.raises(OSError):
        read_with_pyarrow(old)
    with pytest.raises(OSError):
        read_with_pandas(old, fmt)


class TestPublishedLocations:
    @pytest.mark.parametrize("run_id", RUN_IDS)
    def test_every_published_location_opens_with_urllib_pandas_and_pyarrow(self, env, run_id):
        """XCom's release_location, the asset event's location and each file's location open as published; the
        previous, unescaped form of each does not."""
        op = operator(env, ("json", "csv", "parquet"), limit=None)
        ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=run_id)
        context = context_for(ti)
        output = op.execute(context)
        assert output["release_key"]["run_id"] == run_id
        locations = op.published.locations
        assert set(locations) == {"json", "csv", "parquet"}
        ((_, extra),) = emitted_events(context, op)
        assert ti.pushed["release_location"] == extra["location"] == locations["json"]
        folder = next(env[3].rglob("release.json")).parent
        for fmt, uri in locations.items():
            written = folder / f"release.{fmt}"
            assert_opens_as_published(uri, fmt, written)
            assert_previous_form_does_not_open(uri, fmt)
        assert json.loads(read_with_urllib(extra["location"])) == output

    @pytest.mark.parametrize("run_id", RUN_IDS)
    def test_a_rows_file_uri_in_the_ledger_opens_as_committed(self, env, run_id):
        """The committed output's rows_file.uri (in the ledger and in XCom) is a URI the readers open; the
        previous form is not."""
        ledger = env[0]
        op = operator(env, ("json", "parquet"), limit=1000)
        output = op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=run_id)))
        key = ReleaseKey(dag_id=DAG, run_id=run_id, task_id="release", map_index=-1, release_name=RELEASE)
        assert ledger.stored_output(key) == output
        for name in ("cells", "sums"):
            uri = output["aggregates"][name]["rows_file"]["uri"]
            written = Path(storage_path_of(uri).path)
            assert written.parent.name == "release~rows" and written.is_file()
            assert_opens_as_published(uri, "parquet", written)
            assert_previous_form_does_not_open(uri, "parquet")
            assert pq.read_table(uri).num_rows == XS * YS
        assert_opens_as_published(op.published.locations["parquet"], "parquet",
                                  Path(storage_path_of(op.published.locations["parquet"]).path))

    def test_an_output_uri_with_a_space_and_non_ascii_is_encoded_too(self, env, tmp_path):
        """The output folder's own name (a space, ``%``, a non-ASCII letter) is the real path the URI decodes to."""
        out = tmp_path / "dp out %41 é"
        op = operator(env, ("json", "csv", "parquet"), limit=None, out=out)
        op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN_IDS[1].values[0])))
        folder = next(out.rglob("release.json")).parent
        assert "/dp%20out%20%2541%20%C3%A9/" in op.published.locations["json"]
        for fmt, uri in op.published.locations.items():
            assert_opens_as_published(uri, fmt, folder / f"release.{fmt}")

    def test_openlineage_names_the_files_written(self, env):
        """OpenLineage names a file by its path (the naming spec), the one the published URI decodes to."""
        pytest.importorskip("airflow.providers.openlineage")
        op = operator(env, ("json", "csv"), limit=None)
        op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN_IDS[0].values[0])))
        lineage = op.get_openlineage_facets_on_complete(task_instance=None)
        written = sorted(str(p) for p in env[3].rglob("release.*"))
        assert sorted(d.name for d in lineage.outputs) == written
        assert all(Path(name).is_file() for name in written)


class TestPublishedUri:
    @pytest.mark.parametrize("location, expected", [
        pytest.param("file:///srv/out/a%3Ab/r.json", "file:///srv/out/a%253Ab/r.json", id="local file"),
        pytest.param("/srv/out dir/a%2B/r.json", "file:///srv/out%20dir/a%252B/r.json", id="bare local path"),
        pytest.param("s3://bucket/dp/a%3A é/r.json", "s3://bucket/dp/a%253A%20%C3%A9/r.json", id="object store"),
    ])
    def test_the_path_is_percent_encoded_once(self, location, expected):
        """The bucket is kept; the path's every byte outside the unreserved set and ``/`` is encoded, ``%`` too."""
        path = ObjectStoragePath(location)
        assert published_uri(path) == expected
        assert storage_path_of(expected).path == path.path


class TestOldCommittedOutputs:
    """Releases committed before locations were escaped: their rows files' uri holds the path's text."""

    @staticmethod
    def old_put(store, name, source):
        """``ObjectStorageRowsStore.put`` as the previous version wrote it: the rows file's path as text."""
        target = store.folder / name
        publish_file(target, source)
        return str(target)

    def test_an_old_rows_file_uri_replays_the_same_bytes_and_verifies(self, env, monkeypatch):
        """The signed output keeps its unescaped uri; a replay finds the file, publishes identical files and the
        same XCom, and ``dpctl release verify`` matches them, given the published or the previous location."""
        ledger, out = env[0], env[3]
        run_id = RUN_IDS[0].values[0]
        with monkeypatch.context() as patch:
            patch.setattr(ObjectStorageRowsStore, "put", self.old_put)
            first = operator(env, ("json", "parquet"), limit=1000).execute(
                context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=run_id)))
        old_uri = first["aggregates"]["cells"]["rows_file"]["uri"]
        assert "%3A" in old_uri and "%25" not in old_uri
        files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        parquet = next(out.rglob("release.parquet"))
        parquet.unlink()  # the replay rebuilds it from the rows files the old uri names

        op = operator(env, ("json", "parquet"), limit=1000)
        again = op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=run_id, try_number=2)))
        assert json.dumps(again) == json.dumps(first)
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
        assert release_table(first).equals(pq.read_table(parquet))  # no store: the old uri read as a path

        verdicts = verify_published(release_files(ObjectStoragePath(f"file://{out}")), ledger.stored_output)
        assert [v.verdict for v in verdicts] == ["matches", "matches"], verdicts
        location = op.published.locations["json"]
        for given in (location, previous_form(location)):
            result = CliRunner().invoke(app, ["release", "verify", given, "--url",
                                              f"sqlite:///{out.parent / 'ledger.db'}"])
            assert result.exit_code == 0, result.output

    def test_an_old_local_rows_store_path_is_still_read(self, tmp_path):
        """``LocalRowsStore`` writes a file URI; a reference holding the absolute path, as before, is read too."""
        import pyarrow as pa

        store = LocalRowsStore(tmp_path / "rows %41 é")
        table = pa.Table.from_pylist([], schema=parquet_schema())
        reference = write_rows_file(store, SimpleNamespace(name="cells"), table)  # the aggregate's name only
        assert reference["uri"].startswith("file:///") and _URI.fullmatch(reference["uri"])
        path = local_path(reference["uri"])
        assert path == (tmp_path / "rows %41 é" / path.name).resolve() and path.is_file()
        assert read_with_urllib(reference["uri"]) == read_with_pyarrow(reference["uri"]) == path.read_bytes()
        for uri in (reference["uri"], str(path)):
            check_rows_files({"aggregates": {"cells": {"rows_file": {**reference, "uri": uri}}}}, store)
