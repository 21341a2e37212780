"""Sampler throughput, one process, same sizes (issue 11): samples/s of

* the vectorised exact samplers (dp_operators.mechanisms.vectorised), table build timed separately;
* the project's current exact scalar samplers (dp_operators.mechanisms.samplers; capped at 10^5 draws, it is slow);
* OpenDP's exact samplers (make_laplace / make_gaussian on an integer vector domain; capped at 10^6 draws);
* numpy's float samplers (Generator.laplace / normal; not exact, not safe: the speed reference only),

at 10^4, 10^6 and 10^7 draws, for discrete Laplace at scales 10 and 10^4 and discrete Gaussian at sigma 10 and
10^4 (sigma2 = 100 and 10^8), and discrete Laplace at scales 10^7 and 10^9 (beyond the 2^22 table limit: the
exact decomposition of dp_operators.mechanisms.vectorised_large). Ratios are the vectorised rate over each other rate. Capped sizes are reported
at the capped count (the rate is per draw, and these samplers are linear in the count).

Run:  .venv/bin/python benchmarks/samplers.py [--max 1e7]
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np
import opendp.prelude as dp

from dp_operators.mechanisms import samplers as scalar
from dp_operators.mechanisms import vectorised as vec

dp.enable_features("contrib")

SCALAR_CAP = 10**5
OPENDP_CAP = 10**6


def rate(fn, n: int) -> float:
    start = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - start)


def opendp_sampler(kind: str, param: float):
    # T="i64": OpenDP reads T=int as 32 bits, too narrow for noise at scale 10^9
    metric = dp.l1_distance if kind == "laplace" else dp.l2_distance
    space = dp.vector_domain(dp.atom_domain(T="i64")), metric(T="i64")
    make = dp.m.make_laplace if kind == "laplace" else dp.m.make_gaussian
    measurement = make(*space, scale=param)
    return lambda n: measurement([0] * n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=float, default=1e7, help="largest size (default 1e7)")
    args = parser.parse_args()
    sizes = [n for n in (10**4, 10**6, 10**7) if n <= args.max]
    rng = np.random.default_rng()
    cases = [
        ("laplace", "scale 10", Fraction(10), 10.0),
        ("laplace", "scale 1e4", Fraction(10**4), 1e4),
        ("gaussian", "sigma 10", Fraction(100), 10.0),
        ("gaussian", "sigma 1e4", Fraction(10**8), 1e4),
        # beyond the 2^22 table limit: the exact decomposition of mechanisms/vectorised_large.py
        ("laplace", "scale 1e7", Fraction(10**7), 1e7),
        ("laplace", "scale 1e9", Fraction(10**9), 1e9),
    ]
    print(f"{'sampler':<28}{'size':>10}{'vectorised/s':>15}{'project/s':>13}{'opendp/s':>13}{'numpy/s':>14}"
          f"{'x project':>11}{'x opendp':>10}{'numpy/x':>9}")
    for kind, label, param, fparam in cases:
        if kind == "laplace":
            ours = lambda n, p=param: vec.sample_discrete_laplace_array(p, n)  # noqa: E731
            old = lambda n, p=param: scalar.sample_discrete_laplace_vector(p, n)  # noqa: E731
            flt = lambda n, s=fparam: rng.laplace(0.0, s, n)  # noqa: E731
        else:
            ours = lambda n, p=param: vec.sample_discrete_gaussian_array(p, n)  # noqa: E731
            old = lambda n, p=param: scalar.sample_discrete_gaussian_vector(p, n)  # noqa: E731
            flt = lambda n, s=fparam: rng.normal(0.0, s, n)  # noqa: E731
        start = time.perf_counter()
        ours(1)  # builds and caches the table
        print(f"{kind} {label}: table built in {time.perf_counter() - start:.2f} s")
        theirs = opendp_sampler(kind, fparam)
        for n in sizes:
            r_ours = rate(ours, n)
            r_old = rate(old, min(n, SCALAR_CAP))
            r_odp = rate(theirs, min(n, OPENDP_CAP))
            r_np = rate(flt, n)
            print(f"{kind + ' ' + label:<28}{n:>10,}{r_ours:>15,.0f}{r_old:>13,.0f}{r_odp:>13,.0f}{r_np:>14,.0f}"
                  f"{r_ours / r_old:>11.0f}{r_ours / r_odp:>10.0f}{r_np / r_ours:>9.1f}")


if __name__ == "__main__":
    main()
