"""Published locations: collision-free, reversible, and never outside the output URI."""

from __future__ import annotations

import itertools
import string

import pytest

from dp_operators.ledger import ReleaseKey
from dp_operators.operators.locations import (
    decode_component,
    diagnostics_file,
    encode_component,
    key_of,
    release_file,
    release_folder,
)

#: Airflow's default ``[scheduler] allowed_run_id_pattern`` is ``^[A-Za-z0-9_.~:+-]+$``; a deployment may widen it.
RUN_ID_CHARACTERS = string.ascii_letters + string.digits + "_.~:+-"
AWKWARD = ["..", ".", "...", ".hidden", "a/../../b", "/etc/passwd", "a\\b", "%2E%2E", "~", "x~1", "ä ö/€", "a b",
           "2026-01:eu", "2026-01+eu", "2026-01_eu", "2026-01%3Aeu", "CON", "a\x00b", "manual__2026-01-01T00:00:00+00:00"]


def key(run_id="run", dag_id="dag", task_id="release", map_index=-1, release="stats") -> ReleaseKey:
    return ReleaseKey(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index, release_name=release)


def test_every_run_id_character_is_kept_apart_and_reversible():
    names = ["".join(pair) for pair in itertools.product(RUN_ID_CHARACTERS, repeat=2)] + list(RUN_ID_CHARACTERS)
    names += AWKWARD
    encoded = {encode_component(name): name for name in names}
    assert len(encoded) == len(set(names))  # injective: no two run ids share a folder
    for component, name in encoded.items():
        assert decode_component(component) == name
        assert "/" not in component and "\\" not in component and "~" not in component
        assert not component.startswith(".")


def test_run_ids_that_once_collided_get_separate_folders(tmp_path):
    """``2026-01:eu`` and ``2026-01+eu`` get separate release files."""
    base = f"file://{tmp_path}"
    first, second = (release_file(base, key(run_id=r), "json") for r in ("2026-01:eu", "2026-01+eu"))
    assert first != second


def test_two_dags_sharing_a_spec_and_a_run_id_write_different_files(tmp_path):
    base = f"file://{tmp_path}"
    scheduled = "scheduled__2026-01-01T00:00:00+00:00"
    assert release_file(base, key(scheduled, dag_id="a"), "json") != release_file(base, key(scheduled, dag_id="b"), "json")


@pytest.mark.parametrize("run_id", ["..", ".", "../../etc", "/abs", "a/../..", "%2e%2e"])
def test_no_run_id_climbs_out_of_the_output_location(tmp_path, run_id):
    base = tmp_path / "out"
    path = release_file(f"file://{base}", key(run_id), "json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and all(base in p.resolve().parents for p in written)
    assert all(p.resolve().parent.parent.name == "dag" for p in written)  # <release>/<dag>/<run>/<file>


def test_task_ids_map_indexes_and_diagnostics_never_share_a_file(tmp_path):
    base = f"file://{tmp_path}"
    paths = [
        release_file(base, key(task_id="release"), "json"),
        release_file(base, key(task_id="release", map_index=1), "json"),
        release_file(base, key(task_id="release_1"), "json"),
        release_file(base, key(task_id="release~1"), "json"),
        release_file(base, key(task_id="release.diagnostics"), "json"),
        release_file(base, key(task_id="group.release"), "json"),
        diagnostics_file(base, key(task_id="release")),
        release_file(base, key(task_id="release.csv"), "json"),
        release_file(base, key(task_id="release"), "csv"),
    ]
    assert len({str(p) for p in paths}) == len(paths)


@pytest.mark.parametrize("run_id", AWKWARD)
def test_a_file_reads_back_to_its_release_key(tmp_path, run_id):
    base = f"file://{tmp_path}"
    original = key(run_id, dag_id="dag.v2", task_id="grp.release", map_index=3, release="adult_stats")
    assert key_of(release_file(base, original, "parquet"), base) == (original, "parquet")


def test_the_folder_is_below_the_base_even_for_an_object_store_uri():
    folder = release_folder("s3://bucket/dp", key(".."))
    assert str(folder) == "s3://bucket/dp/stats/dag/%2E."


def test_an_empty_name_is_refused():
    with pytest.raises(ValueError, match="empty"):
        encode_component("")
