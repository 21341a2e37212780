"""Cost of the first exact draw at a new scale, down to the spec's smallest scales (ADR 22).

A first draw builds and proves the scale's floor table (dp_operators.mechanisms.vectorised_bounds), after the
budget charge and inside the ledger lease, so its cost at the spec's limits matters: sigma2 down to 1e-4
(rho 5000, L2 sensitivity 1) for the discrete Gaussian, scale down to 1/100 (epsilon 100, L1 sensitivity 1) for the
discrete Laplace. For each scale, with every cache cleared before each repeat: the best of ``--repeats`` first-draw
times of the vectorised sampler, that time as a ratio to the first draw at sigma2 = 1 (scale 1) of the same run,
the proof's rounds from the chosen start and from the old fixed 64-bit start, and one draw of the scalar CKS
sampler (no table, no precision) for comparison. Then the first draw above the tables' limits (the block envelope of
``vectorised_envelope``: a block table and certified brackets), and the discrete Laplace floor table of 2^20 entries
at scale 10^6 proven from 128-bit limb products against the step-by-step proof (same floors), as a ratio.

Run:  .venv/bin/python benchmarks/sampler_first_draw.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

from dp_operators.mechanisms import samplers as scalar
from dp_operators.mechanisms import vectorised as vec
from dp_operators.mechanisms import vectorised_bounds as vb
from dp_operators.mechanisms import vectorised_envelope as ve
from dp_operators.mechanisms import vectorised_large as vl

GAUSSIAN_SIGMA2 = [Fraction(1, 10**4), Fraction(1, 3000), Fraction(1, 100), Fraction(1), Fraction(10**6)]
LAPLACE_SCALES = [Fraction(1, 100), Fraction(1, 2), Fraction(1), Fraction(10), Fraction(10**4)]
ENVELOPE_LAPLACE = [Fraction(2**14 + 1), Fraction(10**6), Fraction(2**30), Fraction(2**50)]
ENVELOPE_GAUSSIAN = [Fraction(2**20 + 1), Fraction(2**33), Fraction(2**40), Fraction(2**50), Fraction(2**60)]
TABLE = 1 << 20  # vectorised._MAX_TABLE


def clear_caches() -> None:
    for cached in (vec.gaussian_table, vec.laplace_table, vb.gaussian_prefix_bounds, vb.exp_neg_bounds,
                   ve.laplace_envelope, ve.gaussian_envelope, vl.geometric_table):
        cached.cache_clear()


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        clear_caches()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def report(kind: str, params: list[Fraction], draw, proof, scalar_draw, repeats: int) -> None:
    times = {p: best_time(lambda p=p: draw(p, 1), repeats) for p in params}
    reference = times[Fraction(1)]
    print(f"\n{kind}: first draw, best of {repeats}; ratio to the first draw at 1 in this run")
    print(f"{'parameter':>12}{'first draw s':>14}{'x at 1':>10}{'rounds':>8}{'start bits':>12}"
          f"{'rounds from 64':>16}{'scalar draw s':>15}")
    for p in params:
        chosen = proof(p, None)
        old = proof(p, 64)
        start = time.perf_counter()
        scalar_draw(p)
        scalar_s = time.perf_counter() - start
        print(f"{str(p):>12}{times[p]:>14.5f}{times[p] / reference:>10.1f}{chosen.rounds:>8}{chosen.start:>12}"
              f"{old.rounds:>16}{scalar_s:>15.5f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="repeats per scale, caches cleared (default 5)")
    args = parser.parse_args()
    report(
        "discrete Gaussian (sigma2)",
        GAUSSIAN_SIGMA2,
        vec.sample_discrete_gaussian_array,
        lambda p, start: vb.gaussian_floor_proof(p.numerator, p.denominator, TABLE, start=start),
        scalar.sample_discrete_gaussian,
        args.repeats,
    )
    report(
        "discrete Laplace (scale)",
        LAPLACE_SCALES,
        vec.sample_discrete_laplace_array,
        lambda p, start: vb.laplace_floor_proof(p.numerator, p.denominator, TABLE, start=start),
        scalar.sample_discrete_laplace,
        args.repeats,
    )
    print(f"\nabove the tables: first draw through the block envelope, best of {args.repeats}")
    for kind, params, draw in [
        ("discrete Laplace (scale)", ENVELOPE_LAPLACE, vec.sample_discrete_laplace_array),
        ("discrete Gaussian (sigma2)", ENVELOPE_GAUSSIAN, vec.sample_discrete_gaussian_array),
    ]:
        for p in params:
            print(f"{kind:<28}{str(p):>22}{best_time(lambda p=p: draw(p, 1), args.repeats):>10.3f} s")
    t, s = 10**6, 1
    limbs = best_time(lambda: vb.laplace_floor_proof(t, s, TABLE), args.repeats)
    stepwise = best_time(lambda: vb.laplace_floor_proof(t, s, TABLE, start=vb.laplace_start_precision(t, s)), 1)
    same = vb.laplace_floor_proof(t, s, TABLE).floors == vb.laplace_floor_proof(t, s, TABLE, start=64).floors
    print(f"\ndiscrete Laplace floor table, 2^20 entries at scale 10^6: limb products {limbs:.3f} s, step by step "
          f"{stepwise:.3f} s ({stepwise / limbs:.1f} times), same floors: {same}")


if __name__ == "__main__":
    main()
