"""Rows files under attack (docs/adr/0023), with the access DESIGN.md's threat model grants: write access to the
output storage, SQL on the ledger as its spender (the SQLite file), and a DAG author's control of task ids, run ids,
specs, upstream data and operator arguments. Each test asserts the safe behaviour: verified copies, the ``~rows``
folder prepared before the ledger, rows files checked from the Parquet verdict, replays authenticated against the
signed audit events.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowRescheduleException
from dp_operators.cli import app
from dp_operators.ledger import Ledger, ReleaseKey
from dp_operators.ledger.schema import trigger_ddl
from dp_operators.operators.locations import release_folder, release_stem, storage_path_of
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import release_parquet
from dp_operators.operators.verification import release_files, verify_published

from airflow_fakes import FakeTaskInstance, context_for
from operator_ledgers import connect_ledger
from rows_files_support import rows_spec, write_tables
from support import governor, make_ledger

DAG = "rows_attacks_dag"
ACCOUNT = "rows_attacks_account"
RELEASE = "rows_attacks"
CONN = "dp_ledger_rows_attacks"
LIMIT = 1000  # XS x YS = 1,200 cells per aggregate: rows files
RUN = "manual__2026-11-29T10:00:00+00:00"

SPEC = rows_spec(RELEASE, ACCOUNT)

runner = CliRunner()


_tables = write_tables


class Env:
    """A SQLite ledger with one account, the two-aggregate spec, its Parquet inputs, and the output folders."""

    def __init__(self, tmp_path: Path, monkeypatch) -> None:
        self.db = tmp_path / "ledger.db"
        self.ledger: Ledger = make_ledger(self.db, cap="1000", accountant="approx_dp", dags=(DAG,), account=ACCOUNT)
        connect_ledger(monkeypatch, CONN, self.db)
        self.spec = tmp_path / "rows.yaml"
        self.spec.write_text(SPEC)
        inputs = tmp_path / "inputs"
        inputs.mkdir()
        self.uris = _tables(inputs)
        self.out = tmp_path / "out"
        self.outside = tmp_path / "outside"
        self.outside.mkdir()

    def operator(self, formats=("json", "parquet"), limit=LIMIT, task_id="release", out=True) -> DPReleaseOperator:
        return DPReleaseOperator(task_id=task_id, spec_path=self.spec, aggregates_uri=self.uris,
                                 output_uri=f"file://{self.out}" if out else None, output_formats=formats,
                                 ledger_conn_id=CONN, inline_rows_limit=limit)

    def spent(self):
        return self.ledger.account(ACCOUNT).spent

    def key(self, run_id=RUN, task_id="release") -> ReleaseKey:
        return ReleaseKey(dag_id=DAG, run_id=run_id, task_id=task_id, map_index=-1, release_name=RELEASE)

    def folder(self, run_id=RUN, task_id="release") -> Path:
        key = self.key(run_id, task_id)
        return Path(release_folder(f"file://{self.out}", key).path)

    def rows_folder(self, run_id=RUN, task_id="release") -> Path:
        key = self.key(run_id, task_id)
        return self.folder(run_id, task_id) / f"{release_stem(key)}~rows"


@pytest.fixture
def env(tmp_path: Path, monkeypatch) -> Env:
    return Env(tmp_path, monkeypatch)


def _local(uri: str) -> Path:
    return Path(storage_path_of(uri).path)


def _forge(path: Path, delta: float = 1000.0) -> float:
    """The storage attacker's edit: rewrite the Parquet file at ``path`` with its first value moved by ``delta``;
    returns the forged value."""
    table = pq.read_table(path)
    values = table.column("value").to_pylist()
    values[0] += delta
    pq.write_table(table.set_column(3, "value", pa.array(values, pa.float64())), path)
    return values[0]


def _published_first_value(parquet: Path, aggregate: str) -> float:
    table = pq.read_table(parquet)
    mask = pc.equal(table.column("aggregate"), aggregate)
    return table.filter(mask).column("value")[0].as_py()


# ------------------------------------------------------------------------------------------------------------------
# Forged files and ledger rows
# ------------------------------------------------------------------------------------------------------------------


def _unchecked_copy(store, reference, name):
    import shutil
    import tempfile

    handle = tempfile.NamedTemporaryFile(suffix=".parquet", delete=False)
    handle.close()
    shutil.copyfile(_local(reference["uri"]), handle.name)
    return Path(handle.name)


@pytest.mark.parametrize("formats", [
    pytest.param(("parquet",), id="the operator publishes only Parquet"),
    pytest.param(("json", "parquet"), id="the attacker deletes the JSON"),
])
def test_verify_refuses_a_forged_rows_file_and_the_parquet_rebuilt_from_it(env, formats):
    """A forged rows file, with release.parquet rebuilt from it and no JSON beside it, fails `dpctl release verify`."""
    # The Parquet verdict rebuilds its expectation by reading the rows file, so it must check the rows file's SHA-256
    # itself rather than rely on the JSON's verdict.
    op = env.operator(formats=formats)
    output = op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    rows_file = _local(output["aggregates"]["cells"]["rows_file"]["uri"])
    _forge(rows_file)
    parquet = _local(op.published.locations["parquet"])
    # the published table, rebuilt over the forged rows file with the attacker's own tools (here: the sink's
    # writer with the digest check taken out)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("dp_operators.operators.sinks.rows_file.verified_copy", _unchecked_copy)
        parquet.write_bytes(release_parquet(output))
    (parquet.with_suffix(".json")).unlink(missing_ok=True)

    verdicts = verify_published(release_files(ObjectStoragePath(f"file://{env.out}")), env.ledger.stored_output,
                                output_uri=f"file://{env.out}")
    assert verdicts, "verify found no file"
    assert not all(v.matches for v in verdicts), [v.as_dict() for v in verdicts]
    result = runner.invoke(app, ["release", "verify", str(env.out), "--url", f"sqlite:///{env.db}",
                                 "--output-uri", f"file://{env.out}"])
    assert result.exit_code != 0, result.output


def test_verify_checks_the_releases_of_a_run_whose_id_ends_in_rows(env):
    """A run id ending in ``.rows`` (legal in Airflow) is checked by ``dpctl release verify`` like any other."""
    # A folder skipped by its suffix would hide a whole run's tampered JSON and Parquet from the check.
    hidden_run = "manual__2026-11-30.rows"
    for run_id in (RUN, hidden_run):
        env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=run_id)))
    hidden_json = env.folder(hidden_run) / "release.json"
    assert hidden_json.exists()
    tampered = json.loads(hidden_json.read_text())
    tampered["budget_account"] = "someone_else"
    hidden_json.write_text(json.dumps(tampered, indent=2, sort_keys=True) + "\n")

    result = runner.invoke(app, ["release", "verify", str(env.out), "--url", f"sqlite:///{env.db}"])
    assert result.exit_code != 0, result.output  # a skipped folder would say "2 files: 2 match the ledger"
    files = {str(f) for f in release_files(ObjectStoragePath(f"file://{env.out}"))}
    assert f"file://{hidden_json}" in files, "the hidden run's release JSON is not even listed"


def test_a_planted_rows_folder_link_writes_nothing_outside_output_uri(env):
    """A symbolic link planted at the rows folder is refused before the charge; nothing is written through it."""
    env.folder().mkdir(parents=True)
    env.rows_folder().symlink_to(env.outside, target_is_directory=True)
    try:
        env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    except AirflowException:
        assert env.spent() == 0, "refused, but after the charge"
    assert not list(env.outside.iterdir()), "rows files were written outside output_uri through a planted link"


@pytest.mark.parametrize("obstacle", ["a plain file", "a dangling link"])
def test_an_obstacle_at_the_rows_folder_is_refused_before_the_charge(env, obstacle):
    """A plain file or dangling link at the rows folder is refused before the ledger: no budget is burnt."""
    # Rows files are written between the draw and the commit, so a write failing there would abandon (spend) the
    # reservation for a release that can never be published.
    env.folder().mkdir(parents=True)
    if obstacle == "a plain file":
        env.rows_folder().write_text("not a folder")
    else:
        env.rows_folder().symlink_to(env.outside / "missing" / "folder", target_is_directory=True)
    with pytest.raises(AirflowException):
        env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    assert env.spent() == 0, "the budget was charged for a release that could never be written"


@pytest.mark.parametrize("when", ["first run", "replay"])
def test_the_parquet_sink_never_publishes_rows_file_bytes_forged_after_the_check(env, monkeypatch, when):
    """A rows file forged after the commit (first run) or after the replay's check is refused, never published."""
    # The Parquet sink re-reads each rows file by URI; it must hash what it streams (no time-of-check gap).
    import dp_operators.release.run as run_module

    op = env.operator()
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    forged: dict[str, float] = {}

    def forge_now(output):
        if "value" not in forged:
            forged["value"] = _forge(_local(output["aggregates"]["cells"]["rows_file"]["uri"]))

    if when == "first run":
        original_publish = DPReleaseOperator._publish

        def racing_publish(self, output, key, replayed, ti_):
            forge_now(output)  # the attacker's write lands after the commit, before the sink reads
            return original_publish(self, output, key, replayed, ti_)

        monkeypatch.setattr(DPReleaseOperator, "_publish", racing_publish)
        try:
            op.execute(context_for(ti))
        except AirflowException:
            return  # refused: safe
    else:
        first = op.execute(context_for(ti))
        _local(op.published.locations["parquet"]).unlink()  # the replay writes it again
        original_check = run_module.check_rows_files

        def racing_check(output, store):
            original_check(output, store)
            forge_now(first)  # the attacker's write lands just after the check

        monkeypatch.setattr(run_module, "check_rows_files", racing_check)
        ti.try_number = 2
        try:
            op.execute(context_for(ti))
        except AirflowException:
            return  # refused: safe
    published = _local(op.published.locations["parquet"])
    assert _published_first_value(published, "cells") != forged["value"], (
        "the Parquet sink published a forged cell the ledger never committed")


@pytest.mark.parametrize("how", [
    pytest.param("committed row edited", id="SQLite: trigger dropped, committed row edited, trigger recreated"),
    pytest.param("reserved row committed", id="spender SQL commits the reserved row first (triggers allow it)"),
])
def test_a_replay_never_publishes_an_edited_ledger_row(env, monkeypatch, how):
    """A charge row edited (or committed) by SQL to point at a forged rows file is refused on replay."""
    # The replay checks the row's digest against its committed audit event, MAC'd with the spend key, so spender SQL
    # with storage write access cannot make a replay publish its own table.
    op = env.operator()
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    if how == "committed row edited":
        first = op.execute(context_for(ti))
        forged_value = _forge_ledger_row(env, first)
        _local(op.published.locations["parquet"]).unlink()
    else:
        original_commit = Ledger.commit
        forged: dict[str, float] = {}

        def raced_commit(self, reservation, output, **kwargs):
            forged["value"] = _forge_ledger_row(env, output, state="reserved")
            return original_commit(self, reservation, output, **kwargs)

        monkeypatch.setattr(Ledger, "commit", raced_commit)
        with pytest.raises(AirflowFailException):
            op.execute(context_for(ti))
        monkeypatch.setattr(Ledger, "commit", original_commit)
        forged_value = forged["value"]
    ti.try_number = 2
    try:
        op.execute(context_for(ti))
    except AirflowException:
        return  # refused: safe
    assert _published_first_value(_local(op.published.locations["parquet"]), "cells") != forged_value


def _forge_ledger_row(env: Env, output: dict, state: str = "committed") -> float:
    """Copy ``output``'s cells rows file, forge a cell, name the copy by its digest in the rows folder, and make the
    ledger's charge row of ``RUN`` a committed one holding ``output`` pointed at it: a ``committed`` row is edited
    with the SQLite guard trigger dropped and recreated around the UPDATE; a ``reserved`` row is committed by a
    plain UPDATE, which the trigger allows. Returns the forged value."""
    import hashlib

    original = _local(output["aggregates"]["cells"]["rows_file"]["uri"])
    scratch = env.outside / "forged.parquet"
    scratch.write_bytes(original.read_bytes())
    forged_value = _forge(scratch)
    digest = hashlib.sha256(scratch.read_bytes()).hexdigest()
    target = original.parent / f"cells-{digest[:16]}.parquet"
    os.replace(scratch, target)
    edited = json.loads(json.dumps(output))
    edited["aggregates"]["cells"]["rows_file"].update(
        sha256=digest, uri=output["aggregates"]["cells"]["rows_file"]["uri"].replace(original.name, target.name))
    text = json.dumps(edited, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    update = ("UPDATE dp_charges SET state = 'committed', output = ?, output_digest = ? "
              "WHERE state = ? AND run_id = ?")
    with sqlite3.connect(env.db) as conn:
        if state == "committed":
            conn.execute("DROP TRIGGER dp_charges_guard")
        conn.execute(update, (text, hashlib.sha256(text.encode()).hexdigest(), state, RUN))
        if state == "committed":
            for statement in trigger_ddl("sqlite"):
                if "dp_charges_guard" in statement and statement.startswith("CREATE"):
                    conn.execute(statement)
    assert env.ledger.stored_output(env.key()) == edited
    return forged_value


# ------------------------------------------------------------------------------------------------------------------
# Paths, crashes, replays and concurrent tries
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["committed row edited", "reserved row committed"])
def test_ledger_verify_detects_an_edited_rows_file_reference(env, monkeypatch, how):
    """``dpctl ledger verify`` reports a charge row edited or committed by SQL to reference a forged rows file."""
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    if how == "committed row edited":
        first = env.operator().execute(context_for(ti))
        assert governor(f"sqlite:///{env.db}").verify().ok
        _forge_ledger_row(env, first)
    else:
        original_commit = Ledger.commit

        def raced_commit(self, reservation, output, **kwargs):
            _forge_ledger_row(env, output, state="reserved")
            return original_commit(self, reservation, output, **kwargs)

        monkeypatch.setattr(Ledger, "commit", raced_commit)
        with pytest.raises(AirflowFailException):
            env.operator().execute(context_for(ti))
    report = governor(f"sqlite:///{env.db}").verify()
    assert not report.ok
    assert any("committed" in problem for problem in report.problems), report.problems


@pytest.mark.parametrize("swap", ["the other release's file, renamed", "the ledger row pointing at it"])
def test_a_rows_file_of_another_release_is_refused(env, swap):
    """Another release's valid rows file, copied over or pointed at by an edited row, is refused on replay."""
    import hashlib

    other = "manual__2026-12-01T10:00:00+00:00"
    op = env.operator()
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    first = op.execute(context_for(ti))
    second = env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=other)))
    spent = env.spent()
    mine = _local(first["aggregates"]["cells"]["rows_file"]["uri"])
    theirs_reference = second["aggregates"]["cells"]["rows_file"]
    if swap.startswith("the other"):
        mine.write_bytes(_local(theirs_reference["uri"]).read_bytes())
        match = "does not hold the committed bytes"
    else:
        edited = json.loads(json.dumps(first))
        edited["aggregates"]["cells"]["rows_file"] = dict(theirs_reference)
        text = json.dumps(edited, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        with sqlite3.connect(env.db) as conn:
            conn.execute("DROP TRIGGER dp_charges_guard")
            conn.execute("UPDATE dp_charges SET output = ?, output_digest = ? WHERE state = 'committed' "
                         "AND run_id = ?", (text, hashlib.sha256(text.encode()).hexdigest(), RUN))
        match = "not .* in this release's rows folder|does not hash to the digest"
    ti.try_number = 2
    with pytest.raises(AirflowFailException, match=match):
        op.execute(context_for(ti))
    assert env.spent() == spent


def test_orphan_rows_files_hold_only_charged_noise(env, monkeypatch):
    """Rows files left by a crash before the commit hold noised cells only, and their attempt stays charged."""
    original_commit = Ledger.commit
    calls = {"n": 0}

    def failing_commit(self, reservation, output, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("the worker lost its database connection")
        return original_commit(self, reservation, output, **kwargs)

    monkeypatch.setattr(Ledger, "commit", failing_commit)
    op = env.operator()
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    with pytest.raises(AirflowFailException):
        op.execute(context_for(ti))
    orphans = sorted(p.name for p in env.rows_folder().iterdir())
    assert len(orphans) == 2
    states = [c["state"] for c in env.ledger.charges(ACCOUNT)]
    assert states == ["abandoned"]
    one_charge = env.spent()
    assert one_charge > 0
    ti.try_number = 2
    output = op.execute(context_for(ti))
    assert env.spent() == 2 * one_charge
    committed = {Path(output["aggregates"][a]["rows_file"]["uri"]).name for a in ("cells", "sums")}
    assert committed.isdisjoint(orphans)
    for name in orphans:  # the orphans are noised tables of the published schema, not inputs
        assert pq.read_schema(env.rows_folder() / name).names[:4] == ["aggregate", "kind", "key", "value"]


@pytest.mark.parametrize("run_id, task_id", [
    pytest.param("../../../../escape", "release", id="run id climbing out"),
    pytest.param("/abs/path", "release", id="absolute run id"),
    pytest.param(RUN, "..", id="task id .."),
    pytest.param(RUN, "x/../../y", id="task id with slashes"),
])
def test_hostile_ids_keep_rows_files_inside_output_uri(env, run_id, task_id):
    """Run and task ids are percent-encoded into one path component: the rows folder never leaves output_uri."""
    op = env.operator(task_id="release")
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=run_id, task_id=task_id)
    output = op.execute(context_for(ti))
    root = env.out.resolve()
    for name in ("cells", "sums"):
        path = _local(output["aggregates"][name]["rows_file"]["uri"]).resolve()
        assert root in path.parents
        assert path.parent.name.endswith("~rows")
    assert not list(env.outside.iterdir())
    assert all(root in p.resolve().parents for p in env.out.rglob("*"))


def test_raising_inline_rows_limit_on_a_replay_charges_nothing_and_writes_no_partial_csv(env):
    """A replay asked for CSV of a rows-file release charges nothing and fails permanently, writing no CSV."""
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    env.operator().execute(context_for(ti))
    spent = env.spent()
    ti.try_number = 2
    with pytest.raises(AirflowFailException, match="committed in the ledger but cannot be published as asked"):
        env.operator(formats=("json", "csv"), limit=None).execute(context_for(ti))
    assert env.spent() == spent
    assert not (env.folder() / "release.csv").exists()


@pytest.mark.parametrize("formats, out", [
    pytest.param(("json", "csv"), True, id="CSV sink"),
    pytest.param(("json",), False, id="no output_uri"),
])
@pytest.mark.parametrize("limit", [LIMIT, 0, -1])
def test_sinks_that_cannot_take_rows_files_are_refused_at_parse_time_and_before_the_charge(env, formats, out, limit):
    """CSV-only or file-less sinks are refused at parse time, and again before the ledger if the limit changes."""
    with pytest.raises(ValueError, match="inline_rows_limit|inline rows only|no output_uri"):
        env.operator(formats=formats, limit=limit, out=out)
    if limit >= 0:
        op = env.operator(formats=formats, limit=None, out=out)
        op.inline_rows_limit = limit
        with pytest.raises(AirflowFailException, match="Nothing was charged"):
            op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    assert env.spent() == 0


def test_a_rows_file_replaced_by_a_link_to_the_true_aggregates_is_refused(env):
    """A rows file replaced by a link to the true aggregates is refused on replay; nothing is charged or published."""
    op = env.operator()
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    first = op.execute(context_for(ti))
    spent = env.spent()
    rows_file = _local(first["aggregates"]["cells"]["rows_file"]["uri"])
    rows_file.unlink()
    rows_file.symlink_to(_local(env.uris["cells"]))
    parquet = _local(op.published.locations["parquet"])
    before = parquet.read_bytes()
    ti.try_number = 2
    with pytest.raises(AirflowFailException, match="does not hold the committed bytes|cannot be read"):
        op.execute(context_for(ti))
    assert env.spent() == spent
    assert parquet.read_bytes() == before


def test_a_task_id_ending_in_rows_does_not_collide_with_another_tasks_rows_folder(env):
    """Tasks ``release`` and ``release.rows`` of one run get separate rows folders, and verify checks both."""
    outputs = {}
    for task_id in ("release", "release.rows"):
        ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN, task_id=task_id)
        outputs[task_id] = env.operator().execute(context_for(ti))
    folders = {task_id: {_local(output["aggregates"][a]["rows_file"]["uri"]).parent.name for a in ("cells", "sums")}
               for task_id, output in outputs.items()}
    assert folders == {"release": {"release~rows"}, "release.rows": {"release.rows~rows"}}
    verdicts = verify_published(release_files(ObjectStoragePath(f"file://{env.out}")), env.ledger.stored_output)
    assert sorted(Path(v.file).name for v in verdicts if v.matches) == [
        "release.json", "release.parquet", "release.rows.json", "release.rows.parquet"]


def test_a_concurrent_attempt_writes_no_rows_files_and_charges_nothing(env, monkeypatch):
    """A second try meeting the first's lease waits (rescheduled, no try spent) before any charge, draw or rows
    file."""
    original_commit = Ledger.commit
    seen: dict[str, object] = {}

    def commit_with_a_concurrent_try(self, reservation, output, **kwargs):
        if "concurrent" not in seen:
            seen["files_before"] = sorted(p.name for p in env.rows_folder().iterdir())
            seen["spent_before"] = env.spent()
            concurrent = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN, try_number=2)
            with pytest.raises(AirflowRescheduleException):
                env.operator().execute(context_for(concurrent))
            seen["concurrent"] = True
            seen["files_after"] = sorted(p.name for p in env.rows_folder().iterdir())
            seen["spent_after"] = env.spent()
        return original_commit(self, reservation, output, **kwargs)

    monkeypatch.setattr(Ledger, "commit", commit_with_a_concurrent_try)
    first = env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    assert seen["files_after"] == seen["files_before"] and len(seen["files_before"]) == 2
    assert seen["spent_after"] == seen["spent_before"] == env.spent()
    committed = sorted(Path(first["aggregates"][a]["rows_file"]["uri"]).name for a in ("cells", "sums"))
    assert committed == seen["files_before"]
    monkeypatch.setattr(Ledger, "commit", original_commit)
    again = env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN,
                                                                try_number=2)))
    assert again == first and env.spent() == seen["spent_before"]
