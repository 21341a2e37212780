"""Noise efficiency of vector releases: per-value noise standard deviation for k values of sensitivity 1 under one
total budget (epsilon = 1, delta = 1e-6), as chosen by the project, beside the classical Gaussian rule with the
L1 sensitivity (the seed formula k*s*sqrt(2 ln(1.25/delta))/epsilon) and the analytic-Gaussian optimum
(Balle & Wang 2018, L2 sensitivity sqrt(k)*s).

Run:  .venv/bin/python benchmarks/noise_efficiency.py   (public parameters only: nothing is sampled or charged)
"""

from __future__ import annotations

import math
from fractions import Fraction

from dp_operators.mechanisms import analytic_gaussian_sigma, discrete_gaussian_variance, discrete_laplace_variance
from dp_operators.release import calibrate
from dp_operators.spec import Budget

EPSILON, DELTA, SENSITIVITY = 1, Fraction(1, 10**6), 1
SIZES = (1, 10, 100, 1000)


def project_std(mechanism: str, k: int) -> tuple[str, float]:
    """Per-value noise standard deviation the engine chooses for k values, each moved by one privacy unit."""
    chosen, scale = calibrate(mechanism, Budget(epsilon=EPSILON, delta=DELTA), linf=SENSITIVITY, l0=k)
    variance = discrete_laplace_variance(scale) if chosen == "discrete_laplace" else discrete_gaussian_variance(scale)
    return chosen, math.sqrt(variance)


def rows() -> list[dict]:
    table = []
    for k in SIZES:
        _, laplace = project_std("discrete_laplace", k)
        _, gaussian = project_std("discrete_gaussian", k)
        chosen, auto = project_std("auto", k)
        table.append(
            {
                "k": k,
                "seed_formula": k * SENSITIVITY * math.sqrt(2 * math.log(1.25 / float(DELTA))) / EPSILON,
                "analytic_gaussian": analytic_gaussian_sigma(EPSILON, float(DELTA), math.sqrt(k) * SENSITIVITY),
                "discrete_laplace": laplace,
                "discrete_gaussian": gaussian,
                "auto": auto,
                "auto_chose": chosen,
            }
        )
    return table


def main() -> None:
    print(f"per-value noise std, k values of sensitivity {SENSITIVITY}, total budget epsilon={EPSILON}, delta={DELTA}")
    header = f"{'k':>5} {'seed formula':>13} {'analytic opt':>13} {'d. Laplace':>11} {'d. Gaussian':>12} {'auto':>9}  chose"
    print(header)
    for row in rows():
        print(
            f"{row['k']:>5} {row['seed_formula']:>13.2f} {row['analytic_gaussian']:>13.3f} {row['discrete_laplace']:>11.3f}"
            f" {row['discrete_gaussian']:>12.3f} {row['auto']:>9.3f}  {row['auto_chose']}"
            f"  (Gaussian / optimum = {row['discrete_gaussian'] / row['analytic_gaussian']:.4f})"
        )


if __name__ == "__main__":
    main()
