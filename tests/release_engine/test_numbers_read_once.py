"""Each budget number is read once, where the spec is loaded; the engine takes the typed values as they are.

Every reading of a number in the package goes through :func:`dp_operators.accounting.exact_number` (the typed
values' ``read``, the spec's validators, the mechanisms' readers). These tests count its calls by the field they
read, across every module that binds it, around a spec load and a release.
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from dp_operators.ledger import ReleaseKey
from dp_operators.release import plan_release, run_release
from dp_operators.spec import load_spec, parse_spec

from support import EXAMPLE_SPEC

BUDGET_FIELDS = ("epsilon", "rho", "delta")


@pytest.fixture
def reads(monkeypatch) -> Counter:
    """Counts the calls of the number reader by the name of the field read, from the ``dp_operators`` modules
    outside the ledger (list it after the fixtures whose setup reads numbers, such as ``ledger``)."""
    counted: Counter = Counter()
    for name, module in list(sys.modules.items()):
        # the ledger is a boundary of its own: it reads the charge any caller hands it (amount and delta)
        if not name.startswith("dp_operators") or name.startswith("dp_operators.ledger") or module is None:
            continue
        original = module.__dict__.get("exact_number")
        if not callable(original):
            continue

        def counting(value, *args, _original=original, **kwargs):
            counted[kwargs.get("name", args[0] if args else "value")] += 1
            return _original(value, *args, **kwargs)

        monkeypatch.setattr(module, "exact_number", counting)
    return counted


def written_budget_numbers(spec) -> Counter:
    """How many epsilon, rho and delta numbers the spec's text writes (aggregates and partition selections)."""
    written: Counter = Counter()
    for aggregate in spec.aggregates:
        budgets = [aggregate.budget]
        if aggregate.partition_selection is not None:
            budgets.append(aggregate.partition_selection.budget)
        for budget in budgets:
            written.update(field for field in BUDGET_FIELDS if getattr(budget, field) is not None)
    return written


def test_run_release_reads_each_budget_once(adult_aggregates, ledger, reads):
    """Loading the example spec and releasing it reads each written budget number exactly once (at the load)."""
    spec = load_spec(EXAMPLE_SPEC)
    at_load = Counter({field: reads[field] for field in BUDGET_FIELDS})
    key = ReleaseKey(dag_id="adult_census_release", run_id="run-1", task_id="release", map_index=-1,
                     release_name=spec.release)
    run_release(spec, adult_aggregates, ledger, key, spec_hash="0" * 64)

    written = written_budget_numbers(spec)
    assert written["epsilon"] and written["rho"]  # the example writes both forms
    assert at_load == Counter({field: written[field] for field in BUDGET_FIELDS})
    assert {field: reads[field] for field in BUDGET_FIELDS} == {field: written[field] for field in BUDGET_FIELDS}


def test_release_reads_no_sensitivity_scale_or_bound_again(adult_aggregates, ledger, reads):
    """After the load, the release reads no budget, sensitivity, scale, grid or bound: all arrive typed."""
    spec = load_spec(EXAMPLE_SPEC)
    reads.clear()
    key = ReleaseKey(dag_id="adult_census_release", run_id="run-2", task_id="release", map_index=-1,
                     release_name=spec.release)
    run_release(spec, adult_aggregates, ledger, key, spec_hash="0" * 64)

    engine_fields = {"epsilon", "rho", "delta", "scale", "sigma2", "l1_sensitivity", "l2_sensitivity_squared",
                     "grid", "bounds"}
    assert {field: n for field, n in reads.items() if field in engine_fields} == {}


APPROXIMATE_SPEC = """
version: 1
release: approximate
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 2, max_contributions_per_partition: 3}
aggregates:
  - name: hours
    kind: variance
    group_by: [g]
    keys: {g: [a, b, c]}
    bounds: [-2.5, 7.25]
    grid: 0.25
    mechanism: auto
    budget: {epsilon: 1.5, delta: 1e-6}
  - name: places
    kind: count
    group_by: [place]
    mechanism: discrete_laplace
    budget: {epsilon: 1}
    partition_selection: {mechanism: discrete_gaussian, budget: {epsilon: 1, delta: 1e-7}}
  - name: towns
    kind: count
    group_by: [town]
    mechanism: discrete_laplace
    budget: {epsilon: 0.5}
    partition_selection: {budget: {epsilon: 0.5, delta: 1e-8}}
"""


#: on a zCDP account: ``auto`` recalibrates the (epsilon, delta) variance to an equal rho cost (no partition
#: selection: its approximate guarantee cannot be charged to zCDP)
ZCDP_SPEC = APPROXIMATE_SPEC.split("  - name: places")[0] + """  - name: people
    kind: count
    mechanism: auto
    budget: {rho: 0.02}
"""


@pytest.mark.parametrize(
    ("text", "accountant"),
    [
        pytest.param(APPROXIMATE_SPEC, "approx_dp", id="approx_dp, partition selection"),
        pytest.param(ZCDP_SPEC, "zcdp", id="zcdp, auto at equal cost"),
    ],
)
def test_plan_and_charge_read_no_budget_again(reads, text, accountant):
    """Planning and charging (epsilon, delta) and rho budgets, with partition selection or ``auto``'s
    recalibration on a zCDP account, reads no budget number again."""
    spec = parse_spec(text)
    written = written_budget_numbers(spec)
    assert {field: reads[field] for field in BUDGET_FIELDS} == {field: written[field] for field in BUDGET_FIELDS}
    reads.clear()
    plan = plan_release(spec, accountant=accountant)
    plan.charge()
    plan.delta()
    [step.describe() for step in plan.steps]
    assert {field: reads[field] for field in BUDGET_FIELDS} == {field: 0 for field in BUDGET_FIELDS}
