"""``dpctl release verify``: published release files against the ledger's committed outputs.

The releases are real: the operator publishes two runs of the example spec (JSON, CSV, Parquet, with a diagnostics
report beside them) and ``run_release`` + ``write_files`` a mapped one, all charged to a SQLite ledger. Each test
then tampers with a copy of that tree as someone with write access to the storage could.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dp_operators.cli import EXIT_INCONSISTENT, app
from dp_operators.ledger import ReleaseKey
from dp_operators.operators.locations import encode_component, release_file, release_folder, release_stem
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import release_json, write_files
from dp_operators.release import run_release
from dp_operators.spec import load_spec_with_hash

from airflow_fakes import FakeTaskInstance, context_for
from support import EXAMPLE_SPEC, SPEND_KEY, example_charge, make_ledger

DAG = "adult_census_release"
RELEASE = "adult_census_statistics"
RUNS = ("manual__2026-11-29T10:00:00+00:00", "scheduled__2026-01:eu")
FORMATS = ("json", "csv", "parquet")

runner = CliRunner()


@dataclass(frozen=True)
class Published:
    ledger_path: Path
    root: Path
    outputs: dict  # ReleaseKey -> committed output


@pytest.fixture(scope="module")
def published(tmp_path_factory, adult_aggregates) -> Published:
    """Three committed releases published under ``out/``: two operator runs and one mapped task instance."""
    folder = tmp_path_factory.mktemp("published")
    ledger = make_ledger(folder / "ledger.db", cap=str(4 * example_charge()))
    root = folder / "out"
    outputs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_DP_LEDGER_VERIFY", json.dumps(
            {"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{folder / 'ledger.db'}",
                                                 "audit_key": SPEND_KEY.text}}))
        for run_id in RUNS:
            op = DPReleaseOperator(
                task_id="release", spec_path=EXAMPLE_SPEC, aggregates_task_id="compute_aggregates",
                output_uri=f"file://{root}", output_formats=FORMATS, diagnostics_uri=f"file://{folder / 'private'}",
                ledger_conn_id="dp_ledger_verify",
            )
            output = op.execute(context_for(FakeTaskInstance(adult_aggregates, run_id=run_id, dag_id=DAG)))
            outputs[ReleaseKey(**output["release_key"])] = output
    # a diagnostics report found among published files (the operator refuses to write one there; an older layout
    # or a hand copy may still put it there): verify must skip it unread
    for report in (folder / "private").rglob("*~diagnostics.json"):
        target = root / report.relative_to(folder / "private")
        target.write_bytes(report.read_bytes())
    spec, spec_hash = load_spec_with_hash(EXAMPLE_SPEC)
    key = ReleaseKey(dag_id=DAG, run_id=RUNS[0], task_id="release", map_index=2, release_name=RELEASE)
    mapped = run_release(spec, adult_aggregates, ledger, key, spec_hash=spec_hash).output
    write_files(mapped, release_folder(f"file://{root}", key), release_stem(key), FORMATS)
    outputs[key] = mapped
    return Published(folder / "ledger.db", root, outputs)


@pytest.fixture
def tree(published, tmp_path) -> Path:
    """A copy of the published tree to tamper with (the ledger stays the module's)."""
    return Path(shutil.copytree(published.root, tmp_path / "out"))


def verify(published: Published, path: Path | str, *options: str):
    return runner.invoke(app, ["release", "verify", str(path), "--url", f"sqlite:///{published.ledger_path}",
                               *options])


def verdicts(result) -> dict[str, dict]:
    """``--json`` output by file path (local paths, without ``file://``)."""
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return {line["file"].removeprefix("file://"): line for line in lines}


def run_folder(root: Path, run_id: str, dag_id: str = DAG) -> Path:
    return root / RELEASE / encode_component(dag_id) / encode_component(run_id)


def test_every_published_file_matches(published, tree):
    result = verify(published, tree, "--json")
    assert result.exit_code == 0, result.output
    found = verdicts(result)
    expected = {str(run_folder(tree, run) / f"release{suffix}.{fmt}")
                for run, suffix in ((RUNS[0], ""), (RUNS[1], ""), (RUNS[0], "~2")) for fmt in FORMATS}
    assert set(found) == expected  # the diagnostics reports beside them are skipped
    assert list((run_folder(tree, RUNS[0])).glob("*~diagnostics.json"))
    assert all(v["verdict"] == "matches" and v["path_checked"] and not v["problems"] for v in found.values())
    keys = {json.dumps(v["release_key"], sort_keys=True) for v in found.values()}
    assert keys == {json.dumps(key.as_dict(), sort_keys=True) for key in published.outputs}
    # the aggregates came from an upstream task: the ledger recorded their bounds as declared
    assert {v["contribution_bounding"] for v in found.values()} == {"declared"}

    table = verify(published, tree)
    assert table.exit_code == 0, table.output
    assert "9 files: 9 match the ledger" in table.stdout
    assert verify(published, f"file://{tree}", "--output-uri", str(tree)).exit_code == 0
    one = verify(published, run_folder(tree, RUNS[1]) / "release.csv", "--json")  # a file brings its siblings
    assert one.exit_code == 0 and len(verdicts(one)) == 3


def test_a_forged_value_in_the_json_is_named(published, tree):
    path = run_folder(tree, RUNS[1]) / "release.json"
    release = json.loads(path.read_text())
    release["aggregates"]["people_by_age_band"]["rows"][0]["value"] += 100
    path.write_text(release_json(release))  # formatted as the operator would: only the content gives it away
    result = verify(published, tree, "--json")
    assert result.exit_code == EXIT_INCONSISTENT
    found = verdicts(result)
    assert found[str(path)]["verdict"] == "differs"
    assert found[str(path)]["problems"] == [
        "content differs from the ledger's committed output at aggregates.people_by_age_band.rows[0].value"
    ]
    assert [file for file, v in found.items() if v["verdict"] != "matches"] == [str(path)]

    table = verify(published, tree)
    assert table.exit_code == EXIT_INCONSISTENT
    assert "release.json" in table.stdout and "9 files: 8 match the ledger, 1 do not" in table.stdout


def test_a_reformatted_json_is_caught_by_its_bytes(published, tree):
    path = run_folder(tree, RUNS[0]) / "release.json"
    path.write_text(json.dumps(json.loads(path.read_text())))
    (found,) = [v for f, v in verdicts(verify(published, tree, "--json")).items() if f == str(path)]
    assert found["verdict"] == "differs" and "not the bytes published" in found["problems"][0]


def test_a_forged_csv_row_is_named_by_its_line(published, tree):
    path = run_folder(tree, RUNS[0]) / "release~2.csv"
    lines = path.read_text().splitlines(keepends=True)
    fields = lines[4].split(",")
    fields[3] = str(int(float(fields[3])) + 1)
    lines[4] = ",".join(fields)
    path.write_text("".join(lines))
    result = verify(published, tree, "--json")
    assert result.exit_code == EXIT_INCONSISTENT
    found = verdicts(result)
    assert found[str(path)]["problems"] == ["line 5 differs from the committed output's CSV (release_csv)"]
    assert found[str(path)]["release_key"]["map_index"] == 2
    assert sum(v["verdict"] != "matches" for v in found.values()) == 1


def test_a_release_copied_into_another_dags_folder_is_caught(published, tree):
    source, target = run_folder(tree, RUNS[0]), run_folder(tree, RUNS[0], dag_id="other_dag")
    target.mkdir(parents=True)
    for fmt in FORMATS:
        shutil.copy(source / f"release.{fmt}", target / f"release.{fmt}")
    for options in ((), ("--output-uri", f"file://{tree}")):
        result = verify(published, tree, "--json", *options)
        assert result.exit_code == EXIT_INCONSISTENT
        found = verdicts(result)
        bad = {file: v for file, v in found.items() if v["verdict"] != "matches"}
        assert set(bad) == {str(target / f"release.{fmt}") for fmt in FORMATS}
        for v in bad.values():
            assert v["verdict"] == "differs" and v["release_key"]["dag_id"] == DAG
            assert v["problems"] == [f"path is not its release key's location under file://{tree}: dag_id is "
                                     f"'other_dag' in the path but '{DAG}' in the JSON's release_key"]


@pytest.mark.parametrize(
    ("moved_to", "problem"),
    [
        pytest.param(lambda tree: tree / RELEASE / DAG / RUNS[1], "path is not the one its release key is published at",
                     id="same key, run id left unencoded"),
        pytest.param(lambda tree: run_folder(tree, RUNS[1]) / "old", "not at a release path", id="one folder deeper"),
    ],
)
def test_a_release_moved_off_its_location_is_caught(published, tree, moved_to, problem):
    source, target = run_folder(tree, RUNS[1]), moved_to(tree)
    target.mkdir(parents=True)
    for fmt in FORMATS:
        (source / f"release.{fmt}").rename(target / f"release.{fmt}")
    for options in (("--output-uri", str(tree)), ()):  # the root given, or inferred from the other releases
        result = verify(published, tree, "--json", *options)
        assert result.exit_code == EXIT_INCONSISTENT
        bad = {file: v for file, v in verdicts(result).items() if v["verdict"] != "matches"}
        assert set(bad) == {str(target / f"release.{fmt}") for fmt in FORMATS}
        assert all(v["problems"][0].startswith(problem) for v in bad.values()), bad


def test_a_file_outside_any_output_root_says_its_path_was_not_checked(published, tree, tmp_path):
    loose = tmp_path / "downloads"
    loose.mkdir()
    shutil.copy(run_folder(tree, RUNS[1]) / "release.json", loose / "release.json")
    result = verify(published, loose / "release.json", "--json")
    assert result.exit_code == 0
    (found,) = verdicts(result).values()
    assert not found["path_checked"]
    assert found["notes"] == ["path not checked: it lies under no output root (give --output-uri)"]
    refused = verify(published, loose / "release.json", "--json", "--output-uri", str(tree))
    assert refused.exit_code == EXIT_INCONSISTENT
    assert verdicts(refused)[str(loose / "release.json")]["problems"] == ["not under --output-uri"]


def test_a_release_the_ledger_never_committed(published, tree):
    output = json.loads((run_folder(tree, RUNS[0]) / "release.json").read_text())
    output["release_key"]["run_id"] = "manual__never_run"
    key = ReleaseKey(**output["release_key"])
    write_files(output, release_folder(f"file://{tree}", key), release_stem(key), FORMATS)
    result = verify(published, tree, "--json")
    assert result.exit_code == EXIT_INCONSISTENT
    bad = {file: v for file, v in verdicts(result).items() if v["verdict"] != "matches"}
    assert set(bad) == {str(release_file(str(tree), key, fmt).path) for fmt in FORMATS}
    assert {v["verdict"] for v in bad.values()} == {"not in the ledger"}
    assert "not in the ledger" in verify(published, tree).stdout


def test_parquet_is_compared_by_content_when_only_its_writer_differs(published, tree):
    path = run_folder(tree, RUNS[1]) / "release.parquet"
    data = path.read_bytes()
    created_by = pq.ParquetFile(path).metadata.created_by.encode()
    version = created_by.rsplit(b" ", 1)[1]
    older = b".".join(b"9" * len(part) for part in version.split(b"."))  # same length: the footer stays valid
    path.write_bytes(data.replace(created_by, created_by.replace(version, older)))
    result = verify(published, tree, "--json")
    assert result.exit_code == 0, result.output
    found = verdicts(result)[str(path)]
    assert found["verdict"] == "matches"
    assert found["notes"] == [f"same table as the committed output; bytes differ: written by "
                              f"'{created_by.replace(version, older).decode()}', this pyarrow writes "
                              f"'{created_by.decode()}'"]


def test_a_forged_parquet_value_is_named_by_its_row(published, tree):
    path = run_folder(tree, RUNS[1]) / "release.parquet"
    table = pq.read_table(path)
    values = table.column("value").to_pylist()
    values[3] += 1
    forged = table.set_column(3, table.schema.field("value"), pa.array(values, table.schema.field("value").type))
    pq.write_table(forged, path, compression="snappy")
    found = verdicts(verify(published, tree, "--json"))[str(path)]
    assert found["verdict"] == "differs"
    assert found["problems"] == ["row 3 differs from the committed output's table (release_table)"]


def test_files_that_are_not_releases(published, tree):
    folder = run_folder(tree, RUNS[0])
    (folder / "notes.json").write_text('{"comment": "not a release"}')
    (folder / "broken.json").write_text("{not json")
    result = verify(published, tree, "--json")
    assert result.exit_code == EXIT_INCONSISTENT
    found = verdicts(result)
    assert found[str(folder / "notes.json")]["verdict"] == "not a release"
    assert found[str(folder / "notes.json")]["problems"] == [
        "no release_key object: not a release published by dp-operators"
    ]
    broken = found[str(folder / "broken.json")]
    assert broken["verdict"] == "not a release" and broken["problems"][0].startswith("not valid JSON")
    assert broken["release_key"]["task_id"] == "broken"  # the key its path gives, under the inferred root
    assert sum(v["verdict"] != "matches" for v in found.values()) == 2


def test_a_csv_without_its_json_is_keyed_by_its_path(published, tree):
    folder = run_folder(tree, RUNS[0])
    (folder / "release.json").unlink()
    with_root = verify(published, folder / "release.csv", "--json", "--output-uri", str(tree))
    assert with_root.exit_code == 0, with_root.output
    assert verdicts(with_root)[str(folder / "release.csv")]["release_key"]["run_id"] == RUNS[0]
    without = verify(published, folder / "release.csv", "--json")
    assert without.exit_code == EXIT_INCONSISTENT
    assert verdicts(without)[str(folder / "release.csv")]["verdict"] == "not a release"


def test_json_lines_shape(published, tree):
    result = verify(published, run_folder(tree, RUNS[0]) / "release.json", "--json")
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    for line in lines:
        document = json.loads(line)
        assert list(document) == ["file", "format", "release_key", "verdict", "matches", "problems", "notes",
                                  "path_checked", "contribution_bounding"]
        assert document["file"].startswith("file:///") and document["format"] in FORMATS
        assert document["release_key"] == {"dag_id": DAG, "run_id": RUNS[0], "task_id": "release",
                                           "map_index": -1, "release_name": RELEASE}
        assert document["matches"] is True


def test_object_storage_and_the_other_ways_to_name_the_ledger(published, monkeypatch):
    """A URI PATH (fsspec's in-memory store, as s3 or gcs would be), and the ledger from --conn-id or
    DP_LEDGER_URL; reading needs no spend key."""
    from airflow.sdk import ObjectStoragePath

    store = ObjectStoragePath(f"memory://verify-{id(published)}/out")
    for local in published.root.rglob("*"):
        if local.is_file():
            target = store / str(local.relative_to(published.root))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(local.read_bytes())
    url = f"sqlite:///{published.ledger_path}"
    monkeypatch.setenv("AIRFLOW_CONN_DP_LEDGER_READER", json.dumps({"conn_type": "dp_ledger", "extra": {"url": url}}))
    by_conn = runner.invoke(app, ["release", "verify", str(store), "--conn-id", "dp_ledger_reader", "--json"])
    assert by_conn.exit_code == 0, by_conn.output
    found = [json.loads(line) for line in by_conn.stdout.splitlines()]
    assert len(found) == 9 and all(v["file"].startswith("memory://") and v["path_checked"] for v in found)
    (store / RELEASE / DAG / encode_component(RUNS[0]) / "release.csv").write_text("aggregate\n")
    monkeypatch.setenv("DP_LEDGER_URL", url)
    by_env = runner.invoke(app, ["release", "verify", str(store), "--output-uri", str(store)])
    assert by_env.exit_code == EXIT_INCONSISTENT
    assert "9 files: 8 match the ledger, 1 do not" in by_env.stdout


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda tmp: ["--url", f"sqlite:///{tmp / 'none.db'}"], "no ledger at", id="no ledger file"),
        pytest.param(lambda tmp: ["--url", f"sqlite:///{tmp / 'empty.db'}"], "dpctl ledger init",
                     id="ledger not initialised"),
    ],
)
def test_an_unreadable_ledger_is_an_error(published, tree, tmp_path, make, message):
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()
    result = runner.invoke(app, ["release", "verify", str(tree), *make(tmp_path)])
    assert result.exit_code == 1
    assert message in result.stderr and result.stdout == ""


def test_a_missing_or_empty_path_is_an_error(published, tmp_path):
    assert verify(published, tmp_path / "nowhere").exit_code == 1
    assert "no such file or folder" in verify(published, tmp_path / "nowhere").stderr
    (tmp_path / "empty").mkdir()
    empty = verify(published, tmp_path / "empty")
    assert empty.exit_code == 1 and "no release files" in empty.stderr


def test_releases_of_an_operator_expanded_over_output_uri_verify_from_their_parent(published, tmp_path):
    """`.partial(...).expand(output_uri=[out/a, out/b])` publishes under two roots; verifying `out` holds each file
    to the deepest root above it, so correct files are not reported as misplaced."""
    parent = tmp_path / "expanded"
    for name in ("a", "b"):
        shutil.copytree(published.root, parent / name)
    result = verify(published, parent, "--json")
    assert result.exit_code == 0, result.stdout
    assert {v["verdict"] for v in verdicts(result).values()} == {"matches"}
