"""Red-team review of rows files (issue 11, item 2; docs/adr/0023), with the access DESIGN.md's threat model grants:
write access to the output storage, SQL on the ledger as its spender (the SQLite file), and a DAG author's control
of task ids, run ids, specs, upstream data and operator arguments.

Tests named ``test_attack_*`` demonstrated an attack that worked on commit 4a6431a; they assert the safe behaviour and
pass since the fixes (verified copies, the ``~rows`` folder prepared before the ledger, rows files checked from the
Parquet verdict, replays authenticated against the signed audit events). Tests named ``test_stopped_*`` are attacks
the code stopped from the start.
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
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from dp_operators.cli import app
from dp_operators.ledger import Ledger, ReleaseKey
from dp_operators.ledger.schema import trigger_ddl
from dp_operators.operators.locations import release_folder, release_stem
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import release_parquet
from dp_operators.operators.verification import release_files, verify_published

from airflow_fakes import FakeTaskInstance, context_for
from rows_files_support import rows_spec, write_tables
from support import SPEND_KEY, governor, make_ledger

DAG = "rows_review_dag"
ACCOUNT = "rows_review_account"
RELEASE = "rows_review"
CONN = "dp_ledger_rows_review"
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
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps(
            {"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{self.db}", "audit_key": SPEND_KEY.text}}))
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
    return Path(ObjectStoragePath(uri).path)


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
# Attacks that worked on 4a6431a (fixed since)
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
def test_attack_verify_says_matches_for_a_forged_rows_file_and_parquet(env, formats):
    """Storage write access: forge a cell in a rows file and rebuild ``release.parquet`` from it. Only the JSON's
    verdict checks rows files' SHA-256; the Parquet verdict rebuilds its expectation by reading the (forged) rows
    file through ``release_parquet``, without checking its digest. With no JSON beside it, ``dpctl release verify
    --output-uri`` says every file matches."""
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


def test_attack_verify_skips_every_release_of_a_run_whose_id_ends_in_rows(env):
    """A DAG author triggers a run whose id ends in ``.rows`` (a legal Airflow run id). ``release_files`` skips
    every folder named ``*.rows`` (meant for ``<stem>.rows/``), so the whole run folder, with that run's release
    JSON and Parquet, is never checked: tamper with it and ``dpctl release verify`` reports only the other run,
    all matching, exit 0."""
    hidden_run = "manual__2026-11-30.rows"
    for run_id in (RUN, hidden_run):
        env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=run_id)))
    hidden_json = env.folder(hidden_run) / "release.json"
    assert hidden_json.exists()
    tampered = json.loads(hidden_json.read_text())
    tampered["budget_account"] = "someone_else"
    hidden_json.write_text(json.dumps(tampered, indent=2, sort_keys=True) + "\n")

    result = runner.invoke(app, ["release", "verify", str(env.out), "--url", f"sqlite:///{env.db}"])
    assert result.exit_code != 0, result.output  # on 4a6431a: exit 0, "2 files: 2 match the ledger"
    files = {str(f) for f in release_files(ObjectStoragePath(f"file://{env.out}"))}
    assert f"file://{hidden_json}" in files, "the hidden run's release JSON is not even listed"


def test_attack_a_planted_rows_folder_link_redirects_rows_files_outside_output_uri(env):
    """Storage write access: before the run, plant ``<stem>.rows`` as a symbolic link to a folder outside
    ``output_uri``. ``check_publishable`` refuses links from ``output_uri`` down to the run folder but never looks at
    the rows folder, so the rows files are written through the link, and the ledger records (and a replay accepts)
    URIs whose bytes live elsewhere. Wanted: refused before the charge, like the other planted links."""
    env.folder().mkdir(parents=True)
    env.rows_folder().symlink_to(env.outside, target_is_directory=True)
    try:
        env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    except AirflowException:
        assert env.spent() == 0, "refused, but after the charge"
    assert not list(env.outside.iterdir()), "rows files were written outside output_uri through a planted link"


@pytest.mark.parametrize("obstacle", ["a plain file", "a dangling link"])
def test_attack_an_obstacle_at_the_rows_folder_burns_the_charge_and_fails_permanently(env, obstacle):
    """Storage write access: plant a plain file (or a dangling link) named ``<stem>.rows``. Rows files are written
    after the noise is drawn and before the commit, so ``put`` fails inside the charged window: the reservation is
    abandoned (spent), the task fails permanently, nothing is published. ``_check_sinks`` should refuse it before
    the ledger (as it does for links and over-long names), so no budget is burnt. (A full disk for the temporary
    file, or an object store refusing the upload, burn the charge the same way.)"""
    env.folder().mkdir(parents=True)
    if obstacle == "a plain file":
        env.rows_folder().write_text("not a folder")
    else:
        env.rows_folder().symlink_to(env.outside / "missing" / "folder", target_is_directory=True)
    with pytest.raises(AirflowException):
        env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    assert env.spent() == 0, "the budget was charged for a release that could never be written"


@pytest.mark.parametrize("when", ["first run", "replay"])
def test_attack_the_parquet_sink_streams_rows_file_bytes_it_never_checked(env, monkeypatch, when):
    """Storage write access, racing the task: the Parquet sink re-reads each rows file by URI (``_pieces``) and
    never checks it against the SHA-256 the ledger committed. On the first run nothing checks it at all between
    ``put`` and publication; on a replay ``check_rows_files`` hashes it, then ``_pieces`` opens it again (a
    time-of-check/time-of-use gap). Whatever the file holds when the sink reads it is published as the release
    (and announced to the asset's consumers). Wanted: the sink hashes what it streams and refuses a mismatch."""
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
def test_attack_a_replay_publishes_an_edited_ledger_row_unauthenticated(env, monkeypatch, how):
    """Ledger spender SQL plus storage write access: point the committed ``rows_file`` at a forged file placed in the
    rows folder under the name its digest gives. Either edit the committed row (SQLite: drop the charge guard
    trigger and recreate it), or, with no trigger touched (the spender role may UPDATE a ``reserved`` charge's
    state and output on PostgreSQL too), commit the reservation by SQL while the task draws: the task's own commit
    then fails, and the next try (a cleared task) replays the forged row. ``check_rows_files`` only checks the file
    against the row, so the replay publishes the forged table; ``dpctl ledger verify`` catches it later (see
    ``test_stopped_ledger_verify_detects_an_edited_rows_file_reference``). Not specific to rows files (an edited
    inline output replays the same way). Wanted: a replay checks the row's digest against its ``committed`` audit
    event (MAC'd with the spend key the worker holds) before publishing."""
    op = env.operator()
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    if how == "committed row edited":
        first = op.execute(context_for(ti))
        forged_value = _forge_ledger_row(env, first)
        _local(op.published.locations["parquet"]).unlink()
    else:
        original_commit = Ledger.commit
        forged: dict[str, float] = {}

        def raced_commit(self, reservation, output):
            forged["value"] = _forge_ledger_row(env, output, state="reserved")
            return original_commit(self, reservation, output)

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
# Attacks the code stops (these tests pass)
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["committed row edited", "reserved row committed"])
def test_stopped_ledger_verify_detects_an_edited_rows_file_reference(env, monkeypatch, how):
    """The edits of ``test_attack_a_replay_publishes_an_edited_ledger_row_unauthenticated`` (trigger recreated,
    digests consistent in the charge row): ``dpctl ledger verify`` still sees them: the stored output does not hash
    to the digest of its ``committed`` audit event, or the charge is committed with no such event."""
    ti = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)
    if how == "committed row edited":
        first = env.operator().execute(context_for(ti))
        assert governor(f"sqlite:///{env.db}").verify().ok
        _forge_ledger_row(env, first)
    else:
        original_commit = Ledger.commit

        def raced_commit(self, reservation, output):
            _forge_ledger_row(env, output, state="reserved")
            return original_commit(self, reservation, output)

        monkeypatch.setattr(Ledger, "commit", raced_commit)
        with pytest.raises(AirflowFailException):
            env.operator().execute(context_for(ti))
    report = governor(f"sqlite:///{env.db}").verify()
    assert not report.ok
    assert any("committed" in problem for problem in report.problems), report.problems


@pytest.mark.parametrize("swap", ["the other release's file, renamed", "the ledger row pointing at it"])
def test_stopped_a_rows_file_of_another_release_is_refused(env, swap):
    """Another run's valid rows file cannot stand in for this release's: copied over this release's file its digest
    differs from the committed one; pointed at by an edited ledger row it lies outside this release's rows folder."""
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


def test_stopped_orphan_rows_files_hold_only_charged_noise(env, monkeypatch):
    """A crash between writing the rows files and the commit leaves them in the rows folder, unreferenced. They
    hold only noised cells, and the attempt that drew them stays charged (abandoned, not released), so they leak
    nothing the ledger did not charge for; the next try charges again and writes files of other names."""
    original_commit = Ledger.commit
    calls = {"n": 0}

    def failing_commit(self, reservation, output):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("the worker lost its database connection")
        return original_commit(self, reservation, output)

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
def test_stopped_hostile_ids_keep_rows_files_inside_output_uri(env, run_id, task_id):
    """Run ids and task ids are percent-encoded into single path components: the rows folder never leaves
    ``output_uri``."""
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


def test_stopped_raising_inline_rows_limit_on_a_replay_charges_nothing_and_writes_no_partial_csv(env):
    """Try 1 commits with rows files; the DAG author then raises ``inline_rows_limit`` and adds the CSV sink to
    dodge ``_check_sinks``. The replay charges nothing and no CSV of a rows-file release is written (its
    publication fails permanently, naming the rows file: no retry can make a CSV of it)."""
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
def test_stopped_what_cannot_take_rows_files_is_refused_before_the_charge(env, formats, out, limit):
    """``inline_rows_limit`` at 0 files every grouped count and sum (a negative one is refused); sinks that take
    inline rows only are refused when the DAG is parsed, and again before the ledger if the limit changes later."""
    with pytest.raises(ValueError, match="inline_rows_limit|inline rows only|no output_uri"):
        env.operator(formats=formats, limit=limit, out=out)
    if limit >= 0:
        op = env.operator(formats=formats, limit=None, out=out)
        op.inline_rows_limit = limit
        with pytest.raises(AirflowFailException, match="Nothing was charged"):
            op.execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    assert env.spent() == 0


def test_stopped_a_rows_file_replaced_by_a_link_to_the_true_aggregates_is_refused(env):
    """Storage write access: replace the committed rows file by a symbolic link to the true aggregates' Parquet
    file. The replay hashes what the link reaches and refuses it; nothing is charged or published."""
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


def test_stopped_a_task_id_ending_in_rows_does_not_collide_with_another_tasks_rows_folder(env):
    """Tasks ``release`` and ``release.rows`` of one run: the second's files (``release.rows.json``...) sit beside
    the first's rows folder (``release.rows/``) without sharing a name, its own rows folder is
    ``release.rows.rows/``, and ``dpctl release verify`` checks both releases."""
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


def test_stopped_a_concurrent_attempt_writes_no_rows_files_and_charges_nothing(env, monkeypatch):
    """Try 2 of the same task instance starts while try 1, its rows files written, is about to commit: try 2 finds
    try 1's lease, is refused (retryable) before any charge or draw, and writes no rows file; try 1 commits its
    own files, and a later try replays them."""
    original_commit = Ledger.commit
    seen: dict[str, object] = {}

    def commit_with_a_concurrent_try(self, reservation, output):
        if "concurrent" not in seen:
            seen["files_before"] = sorted(p.name for p in env.rows_folder().iterdir())
            seen["spent_before"] = env.spent()
            concurrent = FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN, try_number=2)
            with pytest.raises(AirflowException, match="holds the budget lease") as refused:
                env.operator().execute(context_for(concurrent))
            assert not isinstance(refused.value, AirflowFailException)
            seen["concurrent"] = True
            seen["files_after"] = sorted(p.name for p in env.rows_folder().iterdir())
            seen["spent_after"] = env.spent()
        return original_commit(self, reservation, output)

    monkeypatch.setattr(Ledger, "commit", commit_with_a_concurrent_try)
    first = env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN)))
    assert seen["files_after"] == seen["files_before"] and len(seen["files_before"]) == 2
    assert seen["spent_after"] == seen["spent_before"] == env.spent()
    committed = sorted(Path(first["aggregates"][a]["rows_file"]["uri"]).name for a in ("cells", "sums"))
    assert committed == seen["files_before"]
    monkeypatch.setattr(Ledger, "commit", original_commit)
    again = env.operator().execute(context_for(FakeTaskInstance(upstream=None, dag_id=DAG, run_id=RUN,
                                                                try_number=3)))
    assert again == first and env.spent() == seen["spent_before"]
