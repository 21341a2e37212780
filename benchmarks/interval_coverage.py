"""Measured coverage of the published intervals, per kind (count, sum, mean, variance), at a few budgets.

Each budget is one release of four aggregates grouped by a public key with ``--keys`` partitions; every partition
is an independent draw, so one release measures coverage over all of them (and ``--repeats`` releases add more).
The release goes through the engine's own plan (:func:`dp_operators.release.plan_release`), its exact samplers
(``NoiseStep.draw``) and its publication (:func:`dp_operators.release.publish.publish_aggregate`); the ledger is
left out (it only stores the output). The partitions mix small and large counts and values spread over the bounds
or piled at one bound, where the box bounds over-covered most.

    .venv/bin/python benchmarks/interval_coverage.py --keys 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np

from dp_operators.release import plan_release
from dp_operators.release.publish import publish_aggregate, published_interval
from dp_operators.spec import ReleaseSpec

LOWER, UPPER = 0, 10
BUDGETS = {"rho 0.1": {"rho": "1/10"}, "rho 0.01": {"rho": "1/100"}, "epsilon 1 (Laplace)": {"epsilon": 1}}


def spec_for(budget: dict, keys: list[int]) -> ReleaseSpec:
    mechanism = "discrete_laplace" if "epsilon" in budget else "discrete_gaussian"
    aggregates = []
    for kind in ("count", "sum", "mean", "variance"):
        entry = {"name": kind, "kind": kind, "mechanism": mechanism, "budget": budget, "group_by": ["g"],
                 "keys": {"g": keys}}
        if kind != "count":
            entry["bounds"] = [LOWER, UPPER]
        aggregates.append(entry)
    return ReleaseSpec.model_validate({"version": 1, "release": "coverage", "budget_account": "acct",
                                       "privacy_unit": "person", "aggregates": aggregates})


def partitions(keys: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Integer values in [LOWER, UPPER] per partition: counts from 3 to 3,000; spread, or piled near a bound."""
    out = []
    for index in range(keys):
        n = int(np.exp(rng.uniform(np.log(3), np.log(3000))))
        shape = index % 3
        if shape == 0:
            values = rng.integers(LOWER, UPPER + 1, n)
        elif shape == 1:
            values = np.minimum(UPPER, LOWER + rng.geometric(0.7, n) - 1)
        else:
            values = np.where(rng.random(n) < 0.5, LOWER, UPPER)
        out.append(values)
    return out


def truths(values: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "count": np.array([len(v) for v in values], dtype=float),
        "sum": np.array([v.sum() for v in values], dtype=float),
        "mean": np.array([v.mean() for v in values]),
        "variance": np.array([v.var() for v in values]),
    }


def noised_inputs(plan, values: list[np.ndarray]) -> dict[tuple[str, str], np.ndarray]:
    """The released grid integers: the exact (centred, for means and variances) aggregates plus the plan's noise."""
    middle = Fraction(LOWER + UPPER, 2)
    out = {}
    for name, components in (("count", ("count",)), ("sum", ("sum",)), ("mean", ("sum", "count")),
                             ("variance", ("sum", "count", "sum_squares"))):
        for component in components:
            step = plan.step(name, component)
            if component == "count":
                exact = [Fraction(len(v)) for v in values]
            elif name == "sum":
                exact = [Fraction(int(v.sum())) for v in values]
            elif component == "sum":  # sum (x - middle), exactly: sum x - n middle
                exact = [Fraction(int(v.sum())) - len(v) * middle for v in values]
            else:  # sum (x - middle)^2, exactly: (x - middle)^2 = (2x - LOWER - UPPER)^2 / 4, summed in integers
                exact = [Fraction(int(((2 * v.astype(np.int64) - (LOWER + UPPER)) ** 2).sum()), 4) for v in values]
            units = np.array([int((e / step.grid + Fraction(1, 2)) // 1) for e in exact], dtype=np.int64)
            out[(name, component)] = units + step.draw(len(values)).astype(np.int64)
    return out


def coverage(budget: dict, keys: int, repeats: int, seed: int) -> dict[str, tuple[float, int]]:
    """Per kind, (share of partitions whose interval holds the truth, number of partitions)."""
    rng = np.random.default_rng(seed)
    key_list = list(range(keys))
    spec = spec_for(budget, key_list)
    plan = plan_release(spec, accountant="zcdp" if "rho" in budget else "pure_dp")
    hits = {kind: 0 for kind in ("count", "sum", "mean", "variance")}
    total = 0
    for _ in range(repeats):
        values = partitions(keys, rng)
        truth = truths(values)
        noised = noised_inputs(plan, values)
        for aggregate in spec.aggregates:
            published = publish_aggregate(spec, aggregate, plan, noised, [(k,) for k in key_list])
            for row, true in zip(published["rows"], truth[aggregate.name]):
                low, high = published_interval(row)
                hits[aggregate.name] += int((low is None or low <= true) and (high is None or true <= high))
        total += keys
    return {kind: (count / total, total) for kind, count in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"95 % intervals; {args.keys} partitions x {args.repeats} releases per budget")
    for label, budget in BUDGETS.items():
        started = time.perf_counter()
        measured = coverage(budget, args.keys, args.repeats, args.seed)
        figures = "  ".join(f"{kind} {share:.2%}" for kind, (share, _) in measured.items())
        print(f"{label:>22}: {figures}  ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
