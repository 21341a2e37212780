"""Consistent releases (issue 14): the error reduction on UCI Adult, and the time and memory to make a large table
and its margins consistent, as ratios against drawing the noise of the same cells.

(a) UCI Adult, counts by education x sex, by education, by sex and in total
    (``config/releases/adult_education_sex.yaml``, discrete Gaussian, rho 0.01 each), ``--releases`` releases
    simulated through the engine's own pieces without the ledger: ``plan_release``, ``prepare_inputs`` (the true
    counts of ``dags/adult_consistent_release.py``), ``draw_noise`` (exact samplers, OS randomness) and
    ``consistent_cells``. Per member: the RMSE of the raw noised values (without consistency), of the least-squares
    values (``consistent: true`` alone) and of the example's published values (``nonnegative`` and ``integer``
    too), beside the least-squares prediction (``dp_operators.consistency.accuracy``: sqrt of the mean predicted
    variance), and the mean published half-widths.

(b) A table of 10^5 cells with its margins, e.g. 100 x 100 x 10 with every two-way and one-way margin and the total
    (112,211 noised values), and 316 x 316 with both one-way margins and the total: counts over public integer keys,
    discrete Gaussian, rho 0.01 each, true counts Poisson(``--mean``) so that non-negativity binds on some cells.
    Each step is timed on its own (best of ``--repeat``, fewer once it has taken 10 s): the baseline, drawing the
    noise of every member with ``NoiseStep.draw`` (what the engine does before post-processing), then
    ``build_family`` (cell maps from the key lists), the least-squares ``fit``, the variance computation
    (``accuracy`` and ``half_widths``; the engine does it once per spec, in ``plan_families``), ``exact_sums``,
    ``nonnegative_fit`` and ``controlled_rounding``, and the engine's whole ``make_consistent`` with all three
    options. Ratios are seconds over the baseline's (the house rule: targets are ratios against an in-process
    baseline). Memory: the ``tracemalloc`` peak above the step's start (numpy's arrays are traced), in a separate
    run so tracing does not slow the timed one (skipped for steps slower than ``--trace-limit``); the peak resident
    set above the start, sampled during the first timed run (it also sees HiGHS's C++ heap, which tracemalloc does
    not); and the process's peak RSS.

Run:  .venv/bin/python benchmarks/consistency.py [--releases 2000] [--sizes 100x100x10,316x316] [--repeat 3]
      [--adult PATH] [--mean 10] [--trace-limit 20] [--skip-adult] [--skip-scale]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import os
import resource
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from dp_operators.consistency import accuracy, exact_sums, fit, half_widths
from dp_operators.release import draw_noise, plan_release, prepare_inputs
from dp_operators.release.consistent import (
    PlannedFamily,
    build_family,
    consistent_cells,
    make_consistent,
    plan_families,
)
from dp_operators.release.publish import grid_floats
from dp_operators.spec import ReleaseSpec, load_yaml
from dp_operators.spec.families import consistent_families

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "config" / "releases" / "adult_education_sex.yaml"
DEFAULT_ADULT = os.environ.get("DP_OPERATORS_ADULT_CSV", str(REPO.parent / "shared" / "data" / "adult.csv"))
DEFAULT_SIZES = ((100, 100, 10), (316, 316))


# -- (a) UCI Adult ----------------------------------------------------------------------------------------------------

def adult_counts(path: Path) -> dict:
    """The true counts, by the example DAG's own upstream function (the DAG file is loaded by path; Airflow gets a
    throwaway home first, never ~/airflow)."""
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="consistency-benchmark-airflow-")
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    spec = importlib.util.spec_from_file_location("adult_consistent_release_dag",
                                                  REPO / "dags" / "adult_consistent_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_education_sex_counts(path)


def adult_spec(**postprocess: bool) -> ReleaseSpec:
    """The example spec with its ``postprocess`` replaced."""
    document = load_yaml(SPEC.read_text())
    document["postprocess"] = dict(postprocess)
    return ReleaseSpec.model_validate(document)


def simulate(spec: ReleaseSpec, counts: dict, releases: int) -> dict[str, Any]:
    """Per member: sums of squared errors (raw, published), of published half-widths, the cell count, and the
    seconds per release spent in ``draw_noise`` and in ``consistent_cells``."""
    plan = plan_release(spec)
    families = plan_families(plan)  # public parameters only: the engine plans them once, before the reservation
    prepared = prepare_inputs(spec, counts)
    alpha = 1 - spec.confidence
    names = [a.name for a in spec.aggregates]
    truth = {name: prepared.values[(name, "count")].astype(np.float64) for name in names}
    raw = dict.fromkeys(names, 0.0)
    published = dict.fromkeys(names, 0.0)
    widths = dict.fromkeys(names, 0.0)
    draw_s = post_s = 0.0
    for _ in range(releases):
        start = time.perf_counter()
        noised, _ = draw_noise(plan, prepared, [])
        middle = time.perf_counter()
        cells, described = consistent_cells(plan, noised, alpha, families)
        post_s += time.perf_counter() - middle
        draw_s += middle - start
        if not all(described[name]["applied"] for name in names):
            raise RuntimeError(f"the family was not post-processed: {described}")
        for name in names:
            raw[name] += float(np.sum((noised[(name, "count")] - truth[name]) ** 2))
            published[name] += float(np.sum((cells[name].published.astype(np.float64) - truth[name]) ** 2))
            widths[name] += float(np.sum(cells[name].half_width))
    family = families[0].family
    predicted = {m.name: float(np.mean(a.standard_deviation ** 2)) for m, a in zip(family.members, accuracy(family))}
    return {"plan": plan, "cells": {name: len(truth[name]) for name in names}, "raw": raw, "published": published,
            "widths": widths, "predicted": predicted, "draw_s": draw_s / releases, "post_s": post_s / releases}


def adult_report(path: Path, releases: int) -> None:
    counts = adult_counts(path)
    wls = simulate(adult_spec(consistent=True), counts, releases)
    example = simulate(adult_spec(consistent=True, nonnegative=True, integer=True), counts, releases)
    plan = wls["plan"]
    print(f"(a) UCI Adult ({counts['people']:,} people), {releases:,} releases, discrete Gaussian rho 0.01 per member: "
          "RMSE (people)")
    header = (f"{'member':<25}{'cells':>6}{'raw sd':>8}{'raw':>8}{'LS pred.':>9}{'LS':>8}{'LS+nn+int':>10}"
              f"{'pred. ratio':>12}{'LS ratio':>9}{'ex. ratio':>10}{'hw raw':>8}{'hw LS':>7}{'hw ex.':>7}")
    print(header)
    print("-" * len(header))
    for name, cells in wls["cells"].items():
        n = releases * cells
        step = plan.step(name, "count")
        raw_sd = step.standard_deviation
        raw = math.sqrt((wls["raw"][name] + example["raw"][name]) / (2 * n))  # both simulations' raw draws
        predicted = math.sqrt(wls["predicted"][name])
        ls = math.sqrt(wls["published"][name] / n)
        ex = math.sqrt(example["published"][name] / n)
        raw_width = step.half_width(1 - plan.spec.confidence)
        print(f"{name:<25}{cells:>6}{raw_sd:>8.3f}{raw:>8.3f}{predicted:>9.3f}{ls:>8.3f}{ex:>10.3f}"
              f"{predicted / raw_sd:>12.4f}{ls / raw:>9.4f}{ex / raw:>10.4f}{raw_width:>8.2f}"
              f"{wls['widths'][name] / n:>7.2f}{example['widths'][name] / n:>7.2f}")
    print("raw: the noised values without consistency; LS: consistent only (weighted least squares); LS+nn+int: the "
          "example (nonnegative, integer); ratios: RMSE over the raw RMSE (pred.: the least-squares theory); hw: mean "
          "published 95 % half-width (raw: the independent release's)")
    print(f"per release: draw_noise {wls['draw_s'] * 1e3:.2f} ms; consistent_cells {wls['post_s'] * 1e3:.2f} ms (LS), "
          f"{example['post_s'] * 1e3:.2f} ms (LS + nonnegative + integer)\n")


# -- (b) scale --------------------------------------------------------------------------------------------------------

def table_spec(shape: tuple[int, ...]) -> ReleaseSpec:
    """Counts over ``shape`` (axes a0, a1, ... with integer keys) and every margin of it, down to the total."""
    axes = [f"a{i}" for i in range(len(shape))]
    aggregates = []
    for size in range(len(shape), -1, -1):
        for kept in itertools.combinations(range(len(shape)), size):
            columns = [axes[i] for i in kept]
            aggregate: dict[str, Any] = {"name": "by_" + "_".join(columns) if columns else "total", "kind": "count",
                                         "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}}
            if columns:
                aggregate.update(group_by=columns, keys={axes[i]: list(range(shape[i])) for i in kept})
            aggregates.append(aggregate)
    return ReleaseSpec.model_validate({
        "version": 1, "release": "consistency_benchmark", "budget_account": "benchmark", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
        "aggregates": aggregates,
        "postprocess": {"consistent": True, "nonnegative": True, "integer": True},
    })


def true_counts(shape: tuple[int, ...], mean: float) -> dict[tuple[str, str], np.ndarray]:
    """Poisson(mean) base cells and their exact margins, in each aggregate's release order (row-major)."""
    base = np.random.default_rng().poisson(mean, shape).astype(np.int64)
    values = {}
    for size in range(len(shape), -1, -1):
        for kept in itertools.combinations(range(len(shape)), size):
            dropped = tuple(i for i in range(len(shape)) if i not in kept)
            name = "by_" + "_".join(f"a{i}" for i in kept) if kept else "total"
            values[(name, "count")] = np.atleast_1d(base.sum(axis=dropped)).ravel()
    return values


class RSSPeak:
    """The peak resident set of this process while a block runs, above its start, MB: sampled every
    ``interval`` seconds by a thread (psutil), so it also sees memory tracemalloc does not (HiGHS's C++ heap)."""

    def __init__(self, interval: float = 0.005) -> None:
        import psutil

        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.start = self.peak = 0

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __enter__(self) -> RSSPeak:
        self.start = self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def grown_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def best(function: Callable[[], Any], repeat: int, budget: float) -> tuple[float, float, Any]:
    """The least wall time of up to ``repeat`` calls (no new call once ``budget`` seconds are spent), the RSS growth
    of the first call (MB), and the last result."""
    times, grown, result, spent = [], 0.0, None, 0.0
    while len(times) < repeat and (not times or spent < budget):
        with RSSPeak() as rss:
            start = time.perf_counter()
            result = function()
            times.append(time.perf_counter() - start)
        spent += times[-1]
        grown = grown if len(times) > 1 else rss.grown_mb
    return min(times), grown, result


def traced_peak(function: Callable[[], Any]) -> float:
    """The tracemalloc peak of one call above its start, MB (Python objects and numpy arrays)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    function()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return (peak - start) / 2**20


def scale_report(shape: tuple[int, ...], repeat: int, mean: float, trace_limit: float) -> None:
    from dp_operators.consistency.rounding import FULL_PROGRAM_CELLS, controlled_rounding, nonnegative_fit

    spec = table_spec(shape)
    plan = plan_release(spec)
    layout = consistent_families(spec)[0]
    truth = true_counts(shape, mean)
    steps = [plan.step(a.name, "count") for a in spec.aggregates]
    values = sum(step.partitions for step in steps)

    def draw() -> dict[tuple[str, str], np.ndarray]:
        return {(step.aggregate, "count"): truth[(step.aggregate, "count")] + step.draw() for step in steps}

    noised = draw()
    family = build_family(plan, layout)
    planned = PlannedFamily(layout, family, accuracy(family))
    observations = [grid_floats(noised[(m.name, "count")], Fraction(family.grid)) for m in family.members]
    estimate = fit(family, observations)
    nonnegative = nonnegative_fit(family, observations, start=estimate)
    alpha = 1 - spec.confidence
    measured: list[tuple[str, Callable[[], Any]]] = [
        ("noise draw (baseline)", draw),
        ("build_family", lambda: build_family(plan, layout)),
        ("fit (least squares)", lambda: fit(family, observations)),
        ("accuracy + half_widths", lambda: half_widths(family, accuracy(family), alpha)),
        ("exact_sums", lambda: exact_sums(family, estimate)),
        ("nonnegative_fit", lambda: nonnegative_fit(family, observations, start=estimate)),
        ("controlled_rounding", lambda: controlled_rounding(family, nonnegative)),
        ("make_consistent (all)", lambda: make_consistent(plan, planned, noised, alpha)),
    ]
    label = " x ".join(map(str, shape))
    print(f"(b) {label} table ({family.base_cells:,} cells) with {len(family.members) - 1} margins: {values:,} noised "
          f"values; Poisson({mean:g}) counts; best of up to {repeat} runs")
    header = f"{'step':<25}{'seconds':>10}{'x baseline':>12}{'traced MB':>11}{'RSS +MB':>9}"
    print(header)
    print("-" * len(header))
    baseline = None
    controlled: tuple[str, ...] = ()
    for name, function in measured:
        seconds, grown, result = best(function, repeat, budget=10.0)
        baseline = baseline or seconds
        traced = f"{traced_peak(function):.1f}" if seconds <= trace_limit else "-"
        print(f"{name:<25}{seconds:>10.3f}{seconds / baseline:>12.1f}{traced:>11}{grown:>9.1f}", flush=True)
        if name == "controlled_rounding":
            controlled = result[1]
    negative = int(np.sum(estimate < 0))
    print(f"least-squares base cells below 0: {negative:,} of {family.base_cells:,}; members whose rounding is "
          f"controlled: {len(controlled)} of {len(family.members)} (two chains of nested margins are guaranteed "
          f"above {FULL_PROGRAM_CELLS} fractional cells); peak RSS so far {peak_rss_mb():.0f} MB")
    print("traced MB: tracemalloc peak above the start (Python and numpy; not HiGHS's heap; - : step slower than "
          f"{trace_limit:g} s, not traced); RSS +MB: sampled peak resident set above the start (a lower bound: "
          "memory freed earlier is reused)\n")


def peak_rss_mb() -> float:
    """This process's peak resident set so far, MB (``ru_maxrss`` is KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def parse_sizes(text: str) -> list[tuple[int, ...]]:
    sizes = []
    for part in text.split(","):
        try:
            shape = tuple(int(n) for n in part.strip().lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"size {part!r}: give axis sizes joined by x, e.g. 100x100x10") from None
        if not shape or min(shape) < 2:
            raise argparse.ArgumentTypeError(f"size {part!r}: every axis needs at least 2 keys")
        sizes.append(shape)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", type=int, default=2000, help="simulated Adult releases per variant")
    parser.add_argument("--sizes", type=parse_sizes, default=list(DEFAULT_SIZES),
                        help="tables for (b), e.g. 100x100x10,316x316")
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed runs per step in (b), fewer once a step has taken 10 s; the best is printed")
    parser.add_argument("--trace-limit", type=float, default=20.0,
                        help="in (b), trace a step's memory with tracemalloc (one more run) only if it took at most "
                             "this many seconds")
    parser.add_argument("--mean", type=float, default=10.0, help="mean true count per base cell in (b)")
    parser.add_argument("--adult", type=Path, default=Path(DEFAULT_ADULT))
    parser.add_argument("--skip-adult", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    args = parser.parse_args()
    if not args.skip_adult:
        adult_report(args.adult, args.releases)
    if not args.skip_scale:
        for shape in args.sizes:
            scale_report(shape, args.repeat, args.mean, args.trace_limit)


if __name__ == "__main__":
    main()
