"""Start-up time of ``dpctl``: wall time of whole commands run as a user runs them, against an empty interpreter.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/startup.py [--runs 15] [--spec config/releases/adult_census.yaml] [--task-only]

Each round runs, as subprocesses, ``python -c pass`` (the interpreter's own start-up: the baseline), ``python -c
"import dp_operators.cli"``, ``dpctl --help`` and ``dpctl spec plan SPEC`` (no ledger: nothing read, nothing
spent), in that order; rounds repeat ``--runs`` times so drift on a shared machine touches every command alike.
Prints the median and minimum wall time of each and the median less the baseline's. Which modules the light
commands load is tested in ``tests/test_lazy_imports.py``; ``python -X importtime -c 'import dp_operators.cli'``
shows where the rest goes. The goal (issue 11): both commands under 1 s on the 2-core development machine.

Then the fixed cost of a task process running a release: ``tests/task_process_probe.py`` run ``--runs`` times, each
in a fresh interpreter, loads Airflow's plugins as the task runner does (every ``airflow.plugins`` entry point, the
dashboard plugin of this package included) and executes a two-key release; it reports the CPU seconds of importing
the task SDK's plugin manager (Airflow's own, the baseline), of loading the plugins, of importing the operator
and of ``execute``, and whether the dashboard app, FastAPI or plotly were imported. The goal (issue 23): a task
never loads the dashboard (``tests/test_lazy_imports.py`` checks the modules; this measures the time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DPCTL = str(Path(sys.executable).with_name("dpctl"))


def commands(spec: str) -> dict[str, list[str]]:
    return {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "import dp_operators.cli": [sys.executable, "-c", "import dp_operators.cli"],
        "dpctl --help": [DPCTL, "--help"],
        f"dpctl spec plan {spec}": [DPCTL, "spec", "plan", spec],
    }


def wall_seconds(argv: list[str]) -> float:
    """Wall time of one run of ``argv`` (stdout and stderr discarded); raises if it fails."""
    started = time.perf_counter()
    subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    return time.perf_counter() - started


TASK_PROBE = REPO / "tests" / "task_process_probe.py"
#: Modules only the dashboard needs (a task process should load none).
DASHBOARD = ("dp_operators.dashboard.app", "fastapi", "plotly")


def task_process_costs(runs: int) -> None:
    """Print the median CPU seconds of each phase of a task process (module docstring)."""
    phases: dict[str, list[float]] = {}
    dashboard = set()
    for _ in range(runs):
        done = subprocess.run([sys.executable, str(TASK_PROBE)], cwd=REPO, check=True, capture_output=True, text=True,
                              timeout=300)
        found = json.loads(done.stdout.splitlines()[-1])
        for phase, seconds in found["cpu_seconds"].items():
            phases.setdefault(phase, []).append(seconds)
        dashboard |= {m for m in found["modules"] if m.split(".")[0] in DASHBOARD or m.startswith(DASHBOARD)}
    print(f"\ntask process, {runs} runs: CPU seconds per phase\n")
    print("| phase | median CPU s | min CPU s |\n|---|---|---|")
    for phase, seconds in phases.items():
        print(f"| {phase} | {statistics.median(seconds):.3f} | {min(seconds):.3f} |")
    total = sum(statistics.median(seconds) for phase, seconds in phases.items() if phase != "import_task_sdk")
    print(f"\nplugins + operator import + execute: {total:.3f} CPU s; dashboard modules loaded: "
          f"{sorted(dashboard)[:5] or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--spec", default="config/releases/adult_census.yaml")
    parser.add_argument("--task-only", action="store_true", help="measure the task process only")
    args = parser.parse_args()
    if args.task_only:
        task_process_costs(args.runs)
        return
    runs = commands(args.spec)
    for argv in runs.values():  # warm the file cache and the bytecode
        wall_seconds(argv)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.runs):
        for name, argv in runs.items():
            times[name].append(wall_seconds(argv))
    baseline = statistics.median(next(iter(times.values())))
    print(f"{args.runs} runs each, interleaved\n")
    print("| command | median s | min s | median - baseline s |\n|---|---|---|---|")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median:.3f} | {min(seconds):.3f} | {median - baseline:.3f} |")
    task_process_costs(args.runs)


if __name__ == "__main__":
    main()
