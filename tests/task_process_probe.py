"""What a task process running a release loads: run as a script in a fresh interpreter.

It does what Airflow's task runner does around ``DPReleaseOperator.execute``: loads the plugins (the runner's
``get_template_context`` calls ``integrate_macros_plugins``, which imports every ``airflow.plugins`` entry point,
this package's dashboard plugin included), then executes a small release (a two-key count, a fresh SQLite ledger,
the test suite's fake task instance) and prints JSON: the modules loaded, and the CPU seconds of importing the task
SDK's plugin manager, of loading the plugins, of the operator's import and of ``execute``.

Used by ``tests/test_lazy_imports.py`` (which modules) and ``benchmarks/startup.py`` (how long).

Run:  .venv/bin/python tests/task_process_probe.py [--only-plugins]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SPEC = """\
version: 1
release: probe_release
budget_account: probe_account
privacy_unit: person
aggregates:
  - name: people
    kind: count
    group_by: [k]
    keys: {k: [a, b]}
    mechanism: discrete_laplace
    budget: {epsilon: 0.5}
"""


def main() -> None:
    seconds: dict[str, float] = {}
    with contextlib.redirect_stdout(sys.stderr):
        started = time.process_time()
        from airflow.sdk.plugins_manager import integrate_macros_plugins

        imported = time.process_time()
        integrate_macros_plugins()
        seconds["import_task_sdk"] = imported - started
        seconds["load_plugins"] = time.process_time() - imported
        if "--only-plugins" not in sys.argv:
            with tempfile.TemporaryDirectory(prefix="task-probe-") as folder:
                seconds.update(_release(Path(folder)))
    print(json.dumps({"modules": sorted(sys.modules), "cpu_seconds": seconds}))


def _release(folder: Path) -> dict[str, float]:
    sys.path.insert(0, str(HERE))
    from support import SPEND_KEY, make_ledger  # noqa: E402 - tests/ is not on the path of a script

    make_ledger(folder / "ledger.db", cap="1", accountant="pure_dp", dags=("probe_dag",), account="probe_account")
    os.environ["AIRFLOW_CONN_DP_LEDGER_PROBE"] = json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{folder / 'ledger.db'}", "audit_key": SPEND_KEY.text}})
    (folder / "spec.yaml").write_text(SPEC)
    from airflow_fakes import FakeTaskInstance, context_for

    started = time.process_time()
    from dp_operators.operators.release import DPReleaseOperator

    imported = time.process_time()
    op = DPReleaseOperator(task_id="release", spec_path=str(folder / "spec.yaml"), aggregates_task_id="upstream",
                           output_uri=f"file://{folder / 'out'}", ledger_conn_id="dp_ledger_probe")
    ti = FakeTaskInstance({"people": [{"k": "a", "count": 3}, {"k": "b", "count": 4}]}, dag_id="probe_dag")
    op.execute(context_for(ti))
    return {"import_operator": imported - started, "execute": time.process_time() - imported}


if __name__ == "__main__":
    main()
