"""A published release can be overwritten or forged by anyone with write access to the storage; the ledger holds the
committed output, and ``dpctl release verify PATH`` tells a reader whether a file is the ledger's committed output
for the key its path names."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import ReleaseKey
from dp_operators.operators.locations import release_file, release_folder, release_stem
from dp_operators.operators.sinks import write_files
from dp_operators.release import run_release
from dp_operators.spec import load_spec_with_hash

from support import make_ledger

SPEC = """\
version: 1
release: victim_release
budget_account: victim_account
privacy_unit: person
aggregates:
  - {name: people, kind: count, mechanism: discrete_laplace, budget: {epsilon: 0.5}}
"""

runner = CliRunner()


def test_a_reader_can_tell_a_forged_release_file_from_the_committed_one(tmp_path: Path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    spec, digest = load_spec_with_hash(spec_path)
    ledger_path = tmp_path / "ledger.db"
    ledger = make_ledger(ledger_path, cap="10", accountant="pure_dp", dags=("victim_dag",), account="victim_account")
    key = ReleaseKey(dag_id="victim_dag", run_id="2026-01", task_id="release", map_index=-1,
                     release_name=spec.release)
    output = run_release(spec, {"people": 1000}, ledger, key, spec_hash=digest).output
    base = f"file://{tmp_path / 'out'}"
    write_files(output, release_folder(base, key), release_stem(key), ("json",))
    genuine = Path(release_file(base, key, "json").path)
    url = f"sqlite:///{ledger_path}"
    result = runner.invoke(app, ["release", "verify", str(genuine), "--url", url])
    assert result.exit_code == 0, f"no command checks a published release against the ledger: {result.output[:200]}"

    # another DAG's task (same workers, same storage credentials) rewrites the victim's file
    forged = json.loads(genuine.read_text())
    forged["aggregates"]["people"]["value"] = 1
    genuine.write_text(json.dumps(forged, indent=2, sort_keys=True) + "\n")

    result = runner.invoke(app, ["release", "verify", str(genuine), "--url", url])
    assert result.exit_code not in (0, 2), (
        f"no way to detect a forged published release (exit {result.exit_code}): {result.output[:300]}"
    )
