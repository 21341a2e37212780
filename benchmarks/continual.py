"""Series (continual release): the error of each strategy's published running totals, by simulation, against the
plan and against the naive baseline (summed noised increments), at zCDP rho = 1 for the whole series.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/continual.py [--series 4000] [--horizons 365 1000] [--steps-per-unit 1 7 30]

For each horizon T and each k (the most steps one privacy unit contributes to), every strategy of
``dp_operators.continual`` is planned (:func:`~dp_operators.continual.plan_series`), and ``--series`` independent
series are simulated: every measurement's noise drawn by the engine's exact sampler at the plan's parameter
(:class:`~dp_operators.continual.noise.SeriesNoise`, ``sigma2`` on its lattice), decoded into running totals by the
engine's decoder weights (:meth:`~dp_operators.continual.noise.SeriesNoise.decoder_rows`, checked against the exact
rational decoder in tests/continual/test_noise.py). Reported per strategy:

- the empirical standard deviation of the total at the plan's worst step, and the RMSE over steps and series;
- the plan's figures and the relative difference;
- the ratio of the worst-step std to summed increments', from the same run;
- the coverage of the published 95 % intervals (:meth:`~dp_operators.continual.noise.SeriesNoise.half_width`)
  over every step of every series.

The issue's table (rho = 1, k = 1): T = 365: 13.51 / 6.00 / 4.65 / 2.08; T = 1000: 22.36 / 6.71 / 5.15 / 2.31.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dp_operators.continual import Participation, plan_series  # noqa: E402
from dp_operators.continual.noise import SeriesNoise  # noqa: E402
from dp_operators.continual.plan import MECHANISMS, strategy_of  # noqa: E402
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array  # noqa: E402


def simulate(noise: SeriesNoise, series: int, chunk: int = 500) -> dict:
    """Empirical worst-step std, RMSE and 95 % coverage of ``series`` simulated series."""
    rows = noise.decoder_rows()  # (T, M), value units per lattice unit
    planned_variances = float(noise.candidate.noise_variance) * noise.strategy.step_variances()
    worst_step = int(np.argmax(planned_variances))
    widths = np.array([noise.half_width(step, 0.95) for step in range(noise.strategy.horizon)])
    squares = np.zeros(noise.strategy.horizon)
    covered = 0
    done = 0
    while done < series:
        n = min(chunk, series - done)
        draws = sample_discrete_gaussian_array(noise.sigma2, n * rows.shape[1]).reshape(n, rows.shape[1])
        totals = draws.astype(np.float64) @ rows.T  # (n, T)
        squares += (totals**2).sum(axis=0)
        covered += int((np.abs(totals) <= widths).sum())
        done += n
    variances = squares / series  # the noise has mean 0
    return {
        "worst_std": math.sqrt(variances[worst_step]),
        "rmse": math.sqrt(variances.mean()),
        "coverage": covered / (series * noise.strategy.horizon),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=4000)
    parser.add_argument("--horizons", type=int, nargs="+", default=[365, 1000])
    parser.add_argument("--steps-per-unit", type=int, nargs="+", default=[1, 7, 30])
    args = parser.parse_args()
    print(f"zCDP rho = 1 for the whole series; {args.series} simulated series per row\n")
    header = ("T", "k", "mechanism", "worst std plan", "simulated", "diff", "RMSE plan", "simulated", "diff",
              "worst vs summed", "95% coverage", "seconds")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for horizon in args.horizons:
        for k in args.steps_per_unit:
            plan = plan_series(horizon, Participation(k), Fraction(1))
            results = {}
            for candidate in plan.candidates:
                started = time.perf_counter()
                noise = SeriesNoise(strategy_of(candidate.mechanism, horizon), candidate)
                results[candidate.mechanism] = (candidate, simulate(noise, args.series),
                                                time.perf_counter() - started)
            naive = results["summed_increments"][1]["worst_std"]
            for name in MECHANISMS[1:]:
                candidate, measured, seconds = results[name]
                chosen = " (chosen)" if name == plan.chosen.mechanism else ""
                print(" | ".join([
                    str(horizon), str(k), name + chosen,
                    f"{candidate.worst_std:.2f}", f"{measured['worst_std']:.2f}",
                    f"{measured['worst_std'] / candidate.worst_std - 1:+.1%}",
                    f"{candidate.rmse:.2f}", f"{measured['rmse']:.2f}", f"{measured['rmse'] / candidate.rmse - 1:+.1%}",
                    f"{naive / measured['worst_std']:.2f}x", f"{measured['coverage']:.2%}", f"{seconds:.1f}",
                ]))


if __name__ == "__main__":
    main()
