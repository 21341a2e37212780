"""Sampler throughput as ratios against baselines drawn in the same process (ADR 22): samples/s of

* the default exact samplers (``dp_operators.mechanisms.vectorised``: inverse-CDF tables at small scales, the block
  envelope of ``vectorised_envelope`` at large ones), table build timed separately;
* the exact scalar CKS 2020 samplers (``dp_operators.mechanisms.samplers``; capped at ``--scalar-cap`` draws);
* OpenDP's exact samplers (``make_laplace`` / ``make_gaussian`` on an i64 vector domain; capped at ``--opendp-cap``);
* numpy's float samplers (``Generator.laplace`` / ``normal``: not exact, not safe, the speed reference only),

for the discrete Laplace at scales 10, 10^4, 2^20, 2^30, 2^33, 2^40, 2^50 and the discrete Gaussian at the same
values of sigma^2. Capped samplers are timed at the capped count (their cost is linear in the count). The target
(issue: no slow path left) is every scale of both mechanisms at >= 5 million samples/s on a quiet machine; the last
columns are the default sampler's rate over OpenDP's and numpy's rate over the default's. ``cpu/s`` is the default
sampler's rate in process CPU time, which a loaded machine inflates far less than wall time (the load average is
printed first).

Run:  .venv/bin/python benchmarks/samplers.py [--size 1e6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time
from fractions import Fraction

import numpy as np

from dp_operators.mechanisms import samplers as scalar
from dp_operators.mechanisms import vectorised as vec
from dp_operators.mechanisms.opendp_samplers import load_opendp

SCALES = [10, 10**4, 2**20, 2**30, 2**33, 2**40, 2**50]


def rate(fn, n: int, repeats: int = 1, clock=time.perf_counter) -> float:
    """Best samples/s of ``repeats`` calls of fn(n), timed by ``clock`` (wall by default)."""
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn(n)
        best = min(best, clock() - start)
    return n / best


def opendp_sampler(kind: str, param: float):
    dp = load_opendp()
    # T="i64": OpenDP reads T=int as 32 bits, too narrow for noise at scale 10^9
    metric = dp.l1_distance if kind == "laplace" else dp.l2_distance
    make = dp.m.make_laplace if kind == "laplace" else dp.m.make_gaussian
    measurement = make(dp.vector_domain(dp.atom_domain(T="i64")), metric(T="i64"), scale=param)
    return lambda n: measurement([0] * n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=float, default=1e6, help="draws per timing of the default sampler")
    parser.add_argument("--repeats", type=int, default=3, help="timings per sampler, best kept (default 3)")
    parser.add_argument("--scalar-cap", type=int, default=2 * 10**4, help="draws of the scalar sampler")
    parser.add_argument("--opendp-cap", type=int, default=2 * 10**5, help="draws of OpenDP's sampler")
    parser.add_argument("--kinds", default="laplace,gaussian", help="comma-separated: laplace, gaussian")
    args = parser.parse_args()
    n = int(args.size)
    rng = np.random.default_rng()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {n:,} draws, best of {args.repeats}")
    print(f"{'mechanism':<10}{'scale':>8}{'build s':>9}{'default/s':>13}{'cpu/s':>13}{'scalar/s':>11}{'opendp/s':>12}"
          f"{'numpy/s':>13}{'x scalar':>10}{'x opendp':>10}{'numpy/x':>9}")
    for kind in args.kinds.split(","):
        for value in SCALES:
            param = Fraction(value)
            label = f"2^{value.bit_length() - 1}" if value > 10**4 else str(value)
            if kind == "laplace":
                ours = lambda n, p=param: vec.sample_discrete_laplace_array(p, n)  # noqa: E731
                old = lambda n, p=param: scalar.sample_discrete_laplace_vector(p, n)  # noqa: E731
                flt = lambda n, s=float(value): rng.laplace(0.0, s, n)  # noqa: E731
                theirs = opendp_sampler(kind, float(value))
            else:
                ours = lambda n, p=param: vec.sample_discrete_gaussian_array(p, n)  # noqa: E731
                old = lambda n, p=param: scalar.sample_discrete_gaussian_vector(p, n)  # noqa: E731
                flt = lambda n, s=float(value) ** 0.5: rng.normal(0.0, s, n)  # noqa: E731
                theirs = opendp_sampler(kind, float(value) ** 0.5)
            start = time.perf_counter()
            ours(1)  # builds and caches the scale's tables
            build = time.perf_counter() - start
            r_ours = rate(ours, n, args.repeats)
            r_cpu = rate(ours, n, args.repeats, time.process_time)
            r_old = rate(old, args.scalar_cap)
            r_odp = rate(theirs, args.opendp_cap)
            r_np = rate(flt, n, args.repeats)
            print(f"{kind:<10}{label:>8}{build:>9.2f}{r_ours:>13,.0f}{r_cpu:>13,.0f}{r_old:>11,.0f}{r_odp:>12,.0f}"
                  f"{r_np:>13,.0f}"
                  f"{r_ours / r_old:>10.0f}{r_ours / r_odp:>10.1f}{r_np / r_ours:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
