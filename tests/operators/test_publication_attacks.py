"""Attacks on published locations and asset events of DPReleaseOperator: names too long for a file, planted
symbolic links, a DAG author's outlets, a try that dies between commit and success. Each test asserts the defence
that holds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowException
from dp_operators.ledger import ReleaseKey
from dp_operators.operators.locations import release_file
from dp_operators.operators.release import RELEASE_ALIAS, DPReleaseOperator

from airflow_fakes import FakeAssetEvents, FakeTaskInstance, context_for, run_tries
from operator_ledgers import connect_ledger
from operator_specs import CITY_COUNTS, city_count_spec
from support import make_ledger

DAG = "publication_dag"
ACCOUNT = "publication_account"
RELEASE = "publication_release"

SPEC = city_count_spec(RELEASE, ACCOUNT)

AGGREGATES = CITY_COUNTS


def FakeTI(**fields) -> FakeTaskInstance:  # noqa: N802 - the name the tests below use
    return FakeTaskInstance(**{"upstream": AGGREGATES, "dag_id": DAG, **fields})


@pytest.fixture
def env(tmp_path: Path, monkeypatch):
    """A spec file, a SQLite ledger with one pure-DP account (cap epsilon 10) and its Airflow connection."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    path = tmp_path / "ledger.db"
    ledger = make_ledger(path, cap="10", accountant="pure_dp", dags=(DAG, "Publication_DAG"), account=ACCOUNT)
    connect_ledger(monkeypatch, "dp_ledger_publication", path)
    return spec, ledger


def make_operator(spec: Path, out: str, task_id: str = "release", **kwargs) -> DPReleaseOperator:
    return DPReleaseOperator(
        task_id=task_id, spec_path=spec, aggregates_task_id="compute", output_uri=out,
        ledger_conn_id="dp_ledger_publication", **kwargs,
    )


def key_of(ti: FakeTI) -> ReleaseKey:
    return ReleaseKey(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=ti.map_index,
                      release_name=RELEASE)


# -- 1. names Airflow allows whose encoded path component exceeds NAME_MAX: charged, never published -------------

LONG_NAME_CASES = [
    # airflow dags trigger --run-id: [scheduler] allowed_run_id_pattern is ^[A-Za-z0-9_.~:+-]+$, 250 chars max;
    # each ':' '+' '~' becomes 3 characters, so 86 of them pass NAME_MAX (255)
    pytest.param({"run_id": "backfill:" + "2026-01-01T00:00:00+00:00:" * 8}, "release", id="run id with colons"),
    # task ids are ^[\w.-]+$ with Unicode \w: 30 CJK characters are 90 bytes (Airflow's own log path is fine),
    # 270 characters once percent-encoded
    pytest.param({}, "統計" * 15, id="unicode task id"),
    # a 250-character task id (Airflow's maximum) in a mapped release: '<task_id>~3.json' is 257 characters
    pytest.param({"map_index": 3}, "t" * 250, id="longest task id, mapped"),
    # not mapped, plain ASCII, under Airflow's 250: '<task_id>.json' is 247 characters and fits, but the atomic
    # write's temporary sibling '.<task_id>.json.XXXXXXXX.tmp' (sinks._publish) is 261
    pytest.param({}, "grp.sub." + "t" * 234, id="ascii task id of 242 (temporary file)"),
]


@pytest.mark.parametrize(("ti_fields", "task_id"), LONG_NAME_CASES)
def test_a_name_airflow_accepts_is_refused_before_the_charge_or_published(env, tmp_path, ti_fields, task_id):
    """Airflow accepts these ids; the percent-encoded path component is longer than the filesystem's 255 bytes.
    ``release_folder`` is checked before the ledger but not its length, so the release is charged, then every
    publish fails with ENAMETOOLONG: the retries replay and fail again, and the charge is never published."""
    spec, ledger = env
    ti = FakeTI(task_id=task_id, **ti_fields)
    op = make_operator(spec, f"file://{tmp_path / 'out'}", task_id=task_id)
    outcomes = run_tries(op, ti)
    charged = ledger.account(ACCOUNT).spent > 0
    published = Path(release_file(f"file://{tmp_path / 'out'}", key_of(ti), "json").path)
    exists = False
    try:
        exists = published.exists()
    except OSError:
        pass
    assert not charged or exists, f"charged but never published; tries: {outcomes}"


# -- 2. a new release whose first try failed after the commit is never announced ---------------------------------

def test_a_release_whose_first_try_failed_after_the_commit_is_still_announced(env, tmp_path):
    """Try 1 commits the charge, then publishing fails (a transient storage error: here a file where the release
    folder must go). Try 2 replays the committed release and publishes it; no earlier try announced it, so it adds
    the asset event once. A later replay (the task cleared after its success) finds that event and stays silent."""
    spec, ledger = env
    out = tmp_path / "out"
    out.mkdir()
    (out / RELEASE).write_text("not a folder")  # the storage refuses the first write
    op = make_operator(spec, f"file://{out}")
    ti = FakeTI()
    history = FakeAssetEvents()
    ti.try_number = 1
    context = context_for(ti, history)
    with pytest.raises(AirflowException, match="committed in the ledger but publishing it failed"):
        op.execute(context)
    # the try failed: Airflow records nothing of it
    (out / RELEASE).unlink()  # the storage recovers
    for try_number in (2, 3):
        ti.try_number = try_number
        context = context_for(ti, history)
        op.execute(context)
        history.record(context, ti, op)  # the try succeeded: Airflow records its events
    assert ledger.account(ACCOUNT).spent > 0
    assert len(history.events) == 1, "a new release (one charge) must be announced exactly once"


# -- 3. a DAG author's outlets silence every new release -----------------------------------------------------------

def test_outlets_given_by_the_dag_author_keep_the_release_alias(env, tmp_path):
    """``outlets`` is only defaulted (``kwargs.setdefault``): any explicit ``outlets=[...]`` drops the alias, and
    Airflow's API server ignores alias events of an alias the task does not declare
    (``TaskInstance.register_asset_changes_in_db``: ``if alias_name not in outlet_alias_names: continue``), so every
    new release is silent."""
    spec, _ = env
    op = make_operator(spec, f"file://{tmp_path / 'out'}", outlets=[])
    assert RELEASE_ALIAS in op.outlets


def test_a_symlink_planted_inside_output_uri_is_not_followed(env, tmp_path):
    """Whoever can write below output_uri plants ``<release>/<dag_id>`` as a symlink to a folder of their choice
    (another DAG's run folder, or outside output_uri). ``_check_inside`` compares strings, so the operator writes
    through the link: outside output_uri, or over another DAG's published files."""
    spec, ledger = env
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / RELEASE).mkdir(parents=True)
    os.symlink(elsewhere, out / RELEASE / DAG)
    op = make_operator(spec, f"file://{out}")
    run_tries(op, FakeTI())
    assert not any(elsewhere.rglob("*.json")), "the release was written outside output_uri through a symlink"


# -- 5. case-insensitive storage ----------------------------------------------------------------------------------
