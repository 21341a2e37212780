"""Cross-check our measures with pycanon 1.3.6 (IFCA-Advanced-Computing/pycanon) run in its own virtual environment.

pycanon pins numpy 2.0.2, pandas 2.3.3, scipy 1.15.3 and typer 0.23.2, which clash with the project's environment,
so it lives in ``.cache/pycanon-venv`` (git-ignored), created on first use with ``uv venv`` and
``uv pip install pycanon==1.3.6`` (``python -m venv`` and pip where the project's environment has no uv); ``pycanon_measures.py`` runs there and prints pycanon's results as JSON.

Also a script, independent of make::

    .venv/bin/python tests/anonymity/pycanon_crosscheck.py

prints both sets of results side by side and exits 1 on a disagreement where the definitions agree.

Where the definitions agree (compared): k, distinct l, t (pycanon picks the ordered distance for numeric columns and
the equal distance for text, as we declare them here). Where they differ (shown, not compared): pycanon's entropy l is
``int(exp(min H))``, a floor of ours; its recursive (c, l) sorts class counts ascending and reports
``floor(r_min / (r_l + ... + r_m) + 1)`` at the table's distinct l, while Machanavajjhala et al. take ``r_1`` as the
most frequent value (we report the bound ``max r_1 / (r_l + ... + r_m)``). See docs/anonymity.md.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

if __package__:
    from .anonymity_tables import HOSPITAL_QIS, KANON_DIR, REPO_ROOT, STUDENT_QIS
else:  # run as a script: python tests/anonymity/pycanon_crosscheck.py
    from anonymity_tables import HOSPITAL_QIS, KANON_DIR, REPO_ROOT, STUDENT_QIS

VENV = REPO_ROOT / ".cache" / "pycanon-venv"
PYCANON = "pycanon==1.3.6"
RUNNER = Path(__file__).with_name("pycanon_measures.py")

# name, file, quasi-identifiers, sensitive attribute, its type for us (pycanon decides by dtype)
DATASETS = [
    ("hospital", "hospital_anonymized.csv", HOSPITAL_QIS, "disease", "categorical"),
    ("students", "StudentsMath_Score.csv", STUDENT_QIS, "Score", "ordered"),
    ("students_k5", "StudentsMath_Score_k5.csv", STUDENT_QIS, "Score", "ordered"),
    ("students_k5_ethnic", "StudentsMath_Score_k5.csv", ["Teacher", "Gender", "Freeredu"], "Ethnic", "categorical"),
    ("arx_zip_by_gender", "arx_test_age_gender_zip.csv", ["gender"], "zipcode", "ordered"),
    ("arx_gender_by_zip", "arx_test_age_gender_zip.csv", ["zipcode"], "gender", "categorical"),
]

_UNREACHABLE = (
    "Temporary failure in name resolution",
    "Name or service not known",
    "NewConnectionError",
    "Max retries exceeded",
    "Network is unreachable",
    "Connection refused",
    "No matching distribution found for pycanon",
    "Could not find a version that satisfies the requirement pycanon",
    "Failed to fetch",  # uv
    "error sending request",  # uv
    "dns error",  # uv
)


class RegistryUnreachable(RuntimeError):
    """The installer could not reach the package registry to install pycanon."""


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def ensure_pycanon_python() -> Path:
    """The interpreter of a virtual environment with pycanon 1.3.6, creating it on first use.

    Raises:
        RegistryUnreachable: pip could not reach the registry (the caller may skip).
        RuntimeError: the environment could not be built for another reason (with pip's output).
    """
    from filelock import FileLock

    python = venv_python()
    probe = "import importlib.metadata as m; assert m.version('pycanon') == '1.3.6'"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    # parallel test workers (pytest-xdist) share the cache: one builds it, the others wait and then find it built
    with FileLock(VENV.parent / "pycanon-venv.lock"):
        if python.exists() and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0:
            return python
        return _build_pycanon_venv(python)


def _build_pycanon_venv(python: Path) -> Path:
    uv = Path(sys.executable).with_name("uv")
    if uv.exists():  # the Makefile installs the project with uv: seconds instead of pip's most of a minute
        subprocess.run([uv, "venv", "--clear", "--quiet", "--python", sys.executable, str(VENV)], check=True, capture_output=True)
        command = [uv, "pip", "install", "--quiet", "--python", python, PYCANON]
    else:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, capture_output=True)
        command = [python, "-m", "pip", "install", "--disable-pip-version-check", PYCANON]
    install = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if install.returncode != 0:
        output = install.stdout + install.stderr
        if any(marker in output for marker in _UNREACHABLE):
            raise RegistryUnreachable(f"could not install {PYCANON}: {output.strip().splitlines()[-1]}")
        raise RuntimeError(f"installing {PYCANON} failed:\n{output[-4000:]}")
    return python


def pycanon_results(python: Path) -> dict[str, dict]:
    """pycanon's measures for every dataset in :data:`DATASETS`."""
    payload = [
        {"name": name, "path": str(KANON_DIR / file), "qis": qis, "sa": sa} for name, file, qis, sa, _ in DATASETS
    ]
    run = subprocess.run([python, str(RUNNER), json.dumps(payload)], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def our_results() -> dict[str, dict]:
    """Our measures for every dataset in :data:`DATASETS`, in pycanon's vocabulary."""
    import pandas as pd

    from dp_operators.anonymity import (
        distinct_l_diversity,
        entropy_l_diversity,
        k_anonymity,
        recursive_cl_diversity,
        t_closeness,
    )

    results = {}
    for name, file, qis, sa, kind in DATASETS:
        table = pd.read_csv(KANON_DIR / file)
        l = distinct_l_diversity(table, qis, sa)
        bound = recursive_cl_diversity(table, qis, sa, l)
        results[name] = {
            "k": k_anonymity(table, qis),
            "l": l,
            "entropy_l": entropy_l_diversity(table, qis, sa),
            "t": t_closeness(table, qis, sa, "ordered" if kind == "ordered" else "equal"),
            "recursive_c_bound": bound if math.isfinite(bound) else None,
        }
    return results


def disagreements(ours: dict[str, dict], theirs: dict[str, dict]) -> list[str]:
    """Where the definitions agree and the numbers do not."""
    problems = []
    for name, mine in ours.items():
        other = theirs[name]
        for key in ("k", "l"):
            if mine[key] != other[key]:
                problems.append(f"{name}: {key} ours {mine[key]} pycanon {other[key]}")
        if not math.isclose(mine["t"], other["t"], rel_tol=1e-9, abs_tol=1e-12):
            problems.append(f"{name}: t ours {mine['t']} pycanon {other['t']}")
        # pycanon floors exp(min H); a float a hair under an integer floors one lower, so accept either side.
        floors = {math.floor(mine["entropy_l"] - 1e-9), math.floor(mine["entropy_l"] + 1e-9)}
        if other["entropy_l"] not in floors:
            problems.append(f"{name}: entropy l ours {mine['entropy_l']} (floor) pycanon {other['entropy_l']}")
    return problems


def main() -> int:
    ours, theirs = our_results(), pycanon_results(ensure_pycanon_python())
    for name in ours:
        print(f"{name}:\n  ours    {ours[name]}\n  pycanon {theirs[name]}")
    problems = disagreements(ours, theirs)
    print("\n".join(problems) if problems else "agreement on k, distinct l, floor(entropy l) and t")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
