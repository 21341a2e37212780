"""A published half-width claims that the running total's noise lies within it with the spec's confidence. On the
lattice Z (summed increments, the trees) the noise is a sum of discrete Gaussians, whose mass sits on integers: the
continuous Gaussian quantile times the standard deviation can fall just short of an integer and cover much less
(sigma^2 = 1: the Gaussian 95 % half-width is 1.96, and P[|Z| <= 1.96] = P[|Z| <= 1] = 0.883). A single release
takes its half-width from the exact law (dp_operators.mechanisms.accuracy.discrete_gaussian_accuracy); a series'
step must not claim more than its exact law gives."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dp_operators.continual import Participation, plan_series
from dp_operators.continual.noise import SeriesNoise
from dp_operators.continual.plan import strategy_of


def summed_noise_coverage(sigma2: float, terms: int, half_width: float) -> float:
    """P[|Z_1 + ... + Z_terms| <= half_width], Z_i i.i.d. N_Z(0, sigma2), by exact convolution of the pmf."""
    reach = int(40 * math.sqrt(sigma2)) + 5
    values = np.arange(-reach, reach + 1)
    pmf = np.exp(-values * values / (2 * sigma2))
    pmf /= pmf.sum()
    law = pmf
    for _ in range(terms - 1):
        law = np.convolve(law, pmf)
    middle = (len(law) - 1) // 2
    return float(law[np.abs(np.arange(-middle, middle + 1)) <= half_width].sum())


@pytest.mark.parametrize(("horizon", "max_steps", "rho"), [
    pytest.param(4, 4, Fraction(2), id="T=4 k=4 rho=2 (sigma^2 1)"),
    pytest.param(30, 13, Fraction(1), id="T=30 k=13 rho=1 (sigma^2 6.5)"),
    pytest.param(12, 12, Fraction(1), id="T=12 k=12 rho=1 (sigma^2 6)"),
])
def test_each_steps_half_width_covers_the_exact_noise_at_the_stated_confidence(horizon, max_steps, rho):
    plan = plan_series(horizon, Participation(max_steps), rho)
    assert plan.chosen.mechanism == "summed_increments"  # mechanism: auto's choice when units are in most steps
    noise = SeriesNoise(strategy_of(plan.chosen.mechanism, horizon), plan.chosen)
    for step in range(min(horizon, 6)):
        covered = summed_noise_coverage(float(noise.sigma2), step + 1, noise.half_width(step, 0.95))
        assert covered >= 0.95, f"step {step}: the published 95 % interval covers the noise {covered:.3f} of the time"
