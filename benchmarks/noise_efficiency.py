"""Noise efficiency of vector releases: per-value noise standard deviation for k values of sensitivity 1 under one
total budget (epsilon = 1, delta = 1e-6), as chosen by the project, beside the classical Gaussian rule with the
L1 sensitivity (the seed formula k*s*sqrt(2 ln(1.25/delta))/epsilon) and the analytic-Gaussian optimum
(Balle & Wang 2018, L2 sensitivity sqrt(k)*s).

Also the conversions tightened by issue 8 (item 8), old and new side by side:

* a pure epsilon-DP mechanism charged to a zCDP account: epsilon^2 / 2 (Bun & Steinke 2016) before,
  epsilon * tanh(epsilon / 2) now (docs/adr/0015);
* the (epsilon, delta) discrete Gaussian at small delta: before, the FFT rounding allowance of the vector profile
  (length * (L0 + log2 length) * 4u, added to delta) forced the zCDP route there; now the profile is computed
  with a proven relative error bound (docs/adr/0011). The old sigma is reproduced here by adding that allowance
  to today's profile, which is what the old code computed up to its own (smaller) numerical error.

Run:  .venv/bin/python benchmarks/noise_efficiency.py   (public parameters only: nothing is sampled or charged)
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

from dp_operators.accounting import pure_epsilon_to_rho
from dp_operators.mechanisms import (
    analytic_gaussian_sigma,
    discrete_gaussian_delta,
    discrete_gaussian_sigma2_for_approx_dp,
    discrete_gaussian_variance,
    discrete_laplace_variance,
    rho_for_approx_dp,
)
from dp_operators.release import calibrate
from dp_operators.spec import Budget

EPSILON, DELTA, SENSITIVITY = 1, Fraction(1, 10**6), 1
SIZES = (1, 10, 100, 1000)
CONVERSION_EPSILONS = (Fraction(1, 10), Fraction(3, 10), Fraction(1, 2), Fraction(1), Fraction(2), Fraction(5))
SMALL_DELTAS = (Fraction(1, 10**10), Fraction(1, 10**11), Fraction(1, 10**12))
SMALL_DELTA_SIZES = (2, 10, 100, 1000)


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


def conversion_rows() -> list[dict]:
    """rho charged to a zCDP account for a pure epsilon-DP mechanism, before and after issue 8."""
    return [
        {"epsilon": epsilon, "old_rho": epsilon * epsilon / 2, "new_rho": pure_epsilon_to_rho(epsilon)}
        for epsilon in CONVERSION_EPSILONS
    ]


def _old_fft_allowance(sigma2: float, l0: int, shift: int = 1) -> float:
    """The rounding term the vector profile added to delta before issue 8 (same FFT length)."""
    half = math.ceil(12.0 * math.sqrt(l0) * math.sqrt(sigma2)) + l0 * shift + 1
    length = 1 << (2 * half + 1).bit_length()
    return length * (l0 + length.bit_length()) * 4 * 2.0**-53


def old_small_delta_sigma(epsilon: Fraction, delta: Fraction, l0: int) -> float:
    """sigma of the (epsilon, delta) discrete Gaussian as calibrated before issue 8: the smallest sigma whose
    profile plus the old FFT allowance is at most delta, or the zCDP route when that is smaller."""
    by_zcdp = math.sqrt(l0 / (2 * rho_for_approx_dp(epsilon, delta)))

    def valid(sigma: float) -> bool:
        sigma2 = sigma * sigma
        return discrete_gaussian_delta(Fraction(sigma2), epsilon, l0=l0) + _old_fft_allowance(sigma2, l0) <= delta

    if not valid(by_zcdp):
        return by_zcdp
    low, high = 0.9 * analytic_gaussian_sigma(float(epsilon), float(delta), math.sqrt(l0)), by_zcdp
    while high - low > 1e-8 * high:
        middle = (low + high) / 2
        low, high = (low, middle) if valid(middle) else (middle, high)
    return min(high, by_zcdp)


def small_delta_rows(sizes: tuple[int, ...] = SMALL_DELTA_SIZES) -> list[dict]:
    """sigma of the (1, delta) discrete Gaussian on k values at delta 1e-10 to 1e-12, before and after issue 8."""
    table = []
    for k in sizes:
        for delta in SMALL_DELTAS:
            table.append(
                {
                    "k": k,
                    "delta": delta,
                    "analytic_gaussian": analytic_gaussian_sigma(EPSILON, float(delta), math.sqrt(k)),
                    "old_sigma": old_small_delta_sigma(Fraction(EPSILON), delta, k),
                    "new_sigma": math.sqrt(discrete_gaussian_sigma2_for_approx_dp(EPSILON, delta, l0=k)),
                }
            )
    return table


def _decimal(value: Fraction) -> str:
    """A terminating decimal Fraction (every charge is one) written out exactly."""
    with localcontext() as context:
        context.prec = 40
        return format(Decimal(value.numerator) / Decimal(value.denominator), "f")


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
    print()
    print("pure epsilon-DP charged to a zCDP account (rho)")
    print(f"{'epsilon':>8} {'old eps^2/2':>12} {'new eps tanh(eps/2), exact charge':>34} {'new / old':>10}")
    for row in conversion_rows():
        print(
            f"{float(row['epsilon']):>8g} {_decimal(row['old_rho']):>12} {_decimal(row['new_rho']):>34}"
            f" {float(row['new_rho'] / row['old_rho']):>10.4f}"
        )
    print()
    print(f"(epsilon={EPSILON}, delta) discrete Gaussian on k values at small delta: sigma per value")
    print(
        f"{'k':>5} {'delta':>7} {'analytic opt':>13} {'old sigma':>10} {'new sigma':>10}"
        f" {'old / opt':>10} {'new / opt':>10}"
    )
    for row in small_delta_rows():
        optimum = row["analytic_gaussian"]
        print(
            f"{row['k']:>5} {float(row['delta']):>7.0e} {optimum:>13.4f} {row['old_sigma']:>10.4f}"
            f" {row['new_sigma']:>10.4f} {row['old_sigma'] / optimum:>10.4f} {row['new_sigma'] / optimum:>10.4f}"
        )


if __name__ == "__main__":
    main()
