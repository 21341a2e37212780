"""Red-team review of consistent releases (issue 14): specs that load and plan, then misbehave.

Every test here reproduces a finding and fails until it is fixed (the report of the review ranks them):

* controlled rounding (``integer: true``) of a small many-way table runs one 0-1 program after another, each to
  the 120 s time limit, *after* the budget is reserved: a 3^5 table with its 31 margins post-processes for 2
  minutes, a 3^6 table (729 cells) with its 63 margins for over an hour; the time limit, not the node limit,
  decides the programs, so the published values depend on the machine's speed (rounding.py says the opposite);
* the exact accuracy of a product family computes a 2^k x 2^k matrix for a base of k columns (now for counts too,
  the lattice step): a 14-column yes/no table (16,384 cells) with its total peaks at 2.7 GB to plan, 15 columns
  needs over 8.6 GB (an out-of-memory kill of the worker, or of ``dpctl spec plan``), before any charge;
* a family refused by ``plan_families`` (a member whose noise variance is below the floor) passes the DAG import
  (``load_planned_spec``), and every run of the DAG is then refused.

Run: ``.venv/bin/python -m pytest -q -p no:cacheprovider tests/release_engine/test_review_consistency_red_team.py``
(``-m 'not slow'`` skips the one that waits for the real 120 s time limit).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import dp_operators.consistency.rounding as rounding
from dp_operators.ledger import ReleaseKey
from dp_operators.release import plan_release, run_release
from dp_operators.release.consistent import make_consistent, plan_families
from dp_operators.spec import ReleaseSpec

from support import REPO, make_ledger

DAG = "consistency_red_team"
ACCOUNT = "red_team"


def _count(name: str, group_by: list[str], keys: dict | None, rho: float | str = "1/100") -> dict:
    aggregate = {"name": name, "kind": "count", "mechanism": "discrete_gaussian", "budget": {"rho": rho}}
    if group_by:
        aggregate.update(group_by=group_by, keys=keys)
    return aggregate


def _document(aggregates: list[dict], postprocess: dict) -> dict:
    return {"version": 1, "release": "red_team", "budget_account": ACCOUNT, "privacy_unit": "person",
            "aggregates": aggregates, "postprocess": postprocess}


def _spec(aggregates: list[dict], postprocess: dict) -> ReleaseSpec:
    return ReleaseSpec.model_validate(_document(aggregates, postprocess))


def _key(run: str = "run-1") -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run, task_id="release", map_index=-1, release_name="red_team")


def _ledger(path: Path):
    return make_ledger(path, cap="1000", dags=(DAG,), account=ACCOUNT)


def _all_margins(size: int, columns: int) -> list[dict]:
    """A ``size``^``columns`` table of counts and every one of its margins down to the total (2^columns counts)."""
    names = "abcdefgh"[:columns]
    keys = {c: [f"{c}{i}" for i in range(size)] for c in names}
    return [_count("by_" + "".join(kept) if kept else "total", list(kept), {c: keys[c] for c in kept})
            for r in range(columns, -1, -1) for kept in itertools.combinations(names, r)]


def _true_counts(spec: ReleaseSpec, seed: int = 1) -> dict:
    """Upstream counts of the table and its margins, consistent (every margin the sum of the table's cells)."""
    rng = np.random.default_rng(seed)
    base = spec.aggregates[0]
    cells = list(itertools.product(*(base.keys[c] for c in base.group_by)))
    values = dict(zip(cells, rng.integers(0, 30, len(cells)).tolist()))
    upstream = {}
    for aggregate in spec.aggregates:
        positions = [base.group_by.index(c) for c in aggregate.group_by]
        sums: dict[tuple, int] = {}
        for cell, value in values.items():
            projected = tuple(cell[p] for p in positions)
            sums[projected] = sums.get(projected, 0) + value
        if not aggregate.group_by:
            upstream[aggregate.name] = sums[()]
        else:
            upstream[aggregate.name] = [dict(zip(aggregate.group_by, k), count=v) for k, v in sums.items()]
    return upstream


# -- 1. post-processing after the charge runs for minutes, decided by the clock ----------------------------------------


def test_controlled_rounding_after_the_charge_is_decided_by_the_node_limit_not_the_clock(tmp_path, monkeypatch):
    """A 3 x 3 x 3 x 3 x 3 table of counts with its 31 margins (243 cells, 32 aggregates), ``integer: true``.

    rounding.py: "HiGHS's branch-and-bound node limit for one 0-1 program: the limit that decides, so the outcome is
    the same on any machine"; the 120 s time limit is a safety net that "only if it binds first" makes the outcome
    machine-dependent. Here every program ends on the time limit, after the reservation: the full program, then
    one member's constraints fewer, and so on. The time limit is lowered to 1 s so the test runs in seconds; with the
    real 120 s the first program of this family also runs to the limit (2 minutes of post-processing, measured), and
    those of a 3^6 table with its 63 margins run to it one after another, each without a solution (the slow test
    below). An ``execution_timeout`` shorter than the post-processing abandons the charge on every try."""
    monkeypatch.setattr(rounding, "MILP_TIME_LIMIT", 1.0)
    spec = _spec(_all_margins(3, 5), {"consistent": True, "nonnegative": True, "integer": True})
    ledger = _ledger(tmp_path / "ledger.db")
    programs = []
    solve = rounding.milp

    def recording(*args, **kwargs):
        states = [row["state"] for row in ledger.charges()]
        result = solve(*args, **kwargs)
        programs.append({"charge": states, "message": result.message, "solved": result.x is not None})
        return result

    monkeypatch.setattr(rounding, "milp", recording)
    output = run_release(spec, _true_counts(spec), ledger, _key(), spec_hash="0" * 64).output
    assert output["aggregates"]["total"]["consistency"]["applied"] is True
    assert programs and all(p["charge"] == ["reserved"] for p in programs)  # all of it after the reservation
    clocked = [p for p in programs if "Time limit" in p["message"]]
    assert not clocked, (
        f"{len(clocked)} of {len(programs)} rounding programs stopped on the time limit, not the node limit: the "
        f"outcome depends on the machine's speed, and each may run MILP_TIME_LIMIT=120 s after the charge "
        f"({[p['message'][:40] for p in clocked][:2]})"
    )


def _post_process_six_way(queue) -> None:  # in a forked child: the real limits, the real family
    spec = _spec(_all_margins(3, 6), {"consistent": True, "nonnegative": True, "integer": True})
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = plan_families(plan)
    rng = np.random.default_rng(1)
    base = rng.integers(0, 30, planned.family.base_cells)
    noised = {(m.name, "count"): (np.bincount(m.to_base, weights=base, minlength=m.cells)
                                  + rng.normal(0, 7, m.cells)).round().astype(np.int64)
              for m in planned.family.members}
    started = time.monotonic()
    result = make_consistent(plan, planned, noised, 0.05)
    queue.put((time.monotonic() - started, result.description))


@pytest.mark.slow
def test_post_processing_a_six_way_table_with_its_margins_finishes_within_four_minutes():
    """A 3^6 table (729 cells) with its 63 margins, noised values drawn like a release's, post-processed with the real
    limits (node limit 2000, time limit 120 s) in a child process given 240 s: it is still rounding when stopped.
    Measured outside the test: every program runs the full 120 s without a solution, then one member's
    constraints are dropped and the next runs (36 programs at a 1 s limit: over an hour at 120 s), all after the
    charge, while the README promises seconds for 10^5 cells."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_post_process_six_way, args=(queue,), daemon=True)
    child.start()
    child.join(timeout=240)
    still_running = child.is_alive()
    if still_running:
        child.terminate()
        child.join()
    assert not still_running, "the post-processing of a 729-cell table with its margins ran for over 240 s"
    seconds, _ = queue.get(timeout=5)
    assert seconds < 240


# -- 2. planning memory: 4^k for a k-column base -----------------------------------------------------------------------

_PLAN_IN_A_CHILD = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (__LIMIT__, __LIMIT__))
    from dp_operators.release import plan_release
    from dp_operators.release.consistent import plan_families
    from dp_operators.spec import ReleaseSpec
    columns = [f"q{i}" for i in range(__COLUMNS__)]
    document = {"version": 1, "release": "red_team", "budget_account": "red_team", "privacy_unit": "person",
                "aggregates": [
                    {"name": "answers", "kind": "count", "group_by": columns, "keys": {c: ["no", "yes"] for c in columns},
                     "mechanism": "discrete_gaussian", "budget": {"rho": "1/100"}},
                    {"name": "respondents", "kind": "count", "mechanism": "discrete_gaussian", "budget": {"rho": "1/100"}}],
                "postprocess": {"consistent": True}}
    spec = ReleaseSpec.model_validate(document)
    plan = plan_release(spec, accountant="zcdp")
    try:
        plan_families(plan)
    except MemoryError:
        print("MemoryError")
        sys.exit(3)
    print("planned")
""")


def _plan_in_a_child(columns: int, limit_bytes: int) -> subprocess.CompletedProcess:
    code = _PLAN_IN_A_CHILD.replace("__LIMIT__", str(limit_bytes)).replace("__COLUMNS__", str(columns))
    environment = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=120)


def test_planning_a_yes_no_survey_table_of_15_questions_with_its_total_fits_in_4_gb():
    """15 yes/no columns (32,768 cells) and the total: two counts. ``closed_form_accuracy`` builds, for the base
    observed by itself, a Kronecker product of one 2 x 2 factor per shared column: a 2^15 x 2^15 float64 matrix
    (8.6 GB), since the lattice term made it run for counts too (before, only for sums with a bias). Measured peaks:
    13 columns 750 MB, 14 columns 2.7 GB (7.6 s); the cost is 4^columns, not the number of cells. Before the
    reservation, so nothing is charged, but an out-of-memory kill of the worker (or of ``dpctl spec plan``) for a
    small table. The negative control (10 columns) plans within the same limit."""
    limit = 4 * 2**30
    small = _plan_in_a_child(10, limit)
    assert small.returncode == 0 and "planned" in small.stdout, small.stderr[-2000:]
    # fixed by refusing, at load, a family whose base groups by more than MAX_BASE_COLUMNS (10) columns: a clear
    # error before any plan or charge, never an out-of-memory kill
    large = _plan_in_a_child(15, limit)
    assert large.returncode != 0 and "MemoryError" not in large.stderr, large.stderr[-2000:]
    assert "groups by 15 columns; at most 10 are supported" in large.stderr, large.stderr[-2000:]


# -- 3. a family every run refuses passes the DAG import ---------------------------------------------------------------


def test_a_family_that_every_run_refuses_fails_the_dag_import(tmp_path):
    """``load_planned_spec`` (the operator's constructor: a spec that cannot be released fails the DAG import) does
    not run ``plan_families``; a member at rho 30 (noise variance 1.9e-13 grid units^2, below the floor) loads, the
    DAG imports, and then every run is refused before the reservation."""
    from dp_operators.operators.gate import load_planned_spec
    from dp_operators.release.errors import ReleaseConfigError
    from dp_operators.spec import SpecError

    document = _document([_count("base", ["a"], {"a": ["x", "y"]}, rho=30), _count("total", [], None)],
                         {"consistent": True})
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML
    spec = ReleaseSpec.model_validate(document)
    ledger = _ledger(tmp_path / "ledger.db")
    with pytest.raises(ReleaseConfigError, match="noise variance"):
        run_release(spec, {"base": [{"a": "x", "count": 1}], "total": 1}, ledger, _key(), spec_hash="0" * 64)
    assert not list(ledger.charges())  # refused before anything was reserved (as it should)
    with pytest.raises(SpecError, match="noise variance"):
        load_planned_spec(str(path))


def test_the_refused_family_is_a_budget_question_not_a_structure_one():
    """Negative control for the test above: the same family at rho 1/100 is planned (so the refusal is about the
    budget alone, which the DAG import knows)."""
    spec = _spec([_count("base", ["a"], {"a": ["x", "y"]}), _count("total", [], None)], {"consistent": True})
    (planned,) = plan_families(plan_release(spec, accountant="zcdp"))
    assert planned.family.names == ("base", "total")
    assert Fraction(spec.aggregates[0].budget.rho) == Fraction(1, 100)
