"""Start-up time of ``dpctl``: wall time of whole commands run as a user runs them, against an empty interpreter.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/startup.py [--runs 15] [--spec config/releases/adult_census.yaml]

Each round runs, as subprocesses, ``python -c pass`` (the interpreter's own start-up: the baseline), ``python -c
"import dp_operators.cli"``, ``dpctl --help`` and ``dpctl spec plan SPEC`` (no ledger: nothing read, nothing
spent), in that order; rounds repeat ``--runs`` times so drift on a shared machine touches every command alike.
Prints the median and minimum wall time of each and the median less the baseline's. Which modules the light
commands load is tested in ``tests/test_lazy_imports.py``; ``python -X importtime -c 'import dp_operators.cli'``
shows where the rest goes. The goal (issue 11): both commands under 1 s on the 2-core development machine.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--spec", default="config/releases/adult_census.yaml")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
