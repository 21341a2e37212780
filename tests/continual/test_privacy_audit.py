"""An empirical audit of a series: neighbouring streams (one unit added at its worst pattern of steps) give published
running totals whose measured privacy loss stays within the series' rho, and a negative control (the noise scaled
down) is flagged.

The published totals of a series are Gaussian-like (discrete Gaussian noise, linearly decoded) with a mean shift
``A 1_S`` between neighbours. The zCDP loss of such a release is ``mu^T Sigma^-1 mu / 2``. Here ``mu`` and
``Sigma`` are both *estimated* from simulated outputs (20,000 series per side), not taken from the plan, so the
audit tests the noise the engine draws and decodes, not the plan's arithmetic.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dp_operators.continual import BinaryTree, Participation, SquareRootToeplitz, SummedIncrements
from dp_operators.continual.noise import SeriesNoise
from dp_operators.continual.plan import candidate
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array

HORIZON, RUNS, RHO = 12, 20_000, Fraction(1, 2)


def outputs(noise: SeriesNoise, shift: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """RUNS simulated series of published totals (value units), for increments ``shift`` (0 or the added unit),
    the noise drawn by the engine's sampler and multiplied by ``scale`` (1 but in the negative control)."""
    rows = noise.decoder_rows()
    draws = sample_discrete_gaussian_array(noise.sigma2, RUNS * rows.shape[1]).reshape(RUNS, rows.shape[1])
    return np.cumsum(shift)[None, :] + scale * (draws.astype(np.float64) @ rows.T)


def measured_rho(without: np.ndarray, with_unit: np.ndarray) -> float:
    """mu^T Sigma^-1 mu / 2 from the two samples: the loss of the best linear test between them."""
    mu = with_unit.mean(axis=0) - without.mean(axis=0)
    sigma = (np.cov(without, rowvar=False) + np.cov(with_unit, rowvar=False)) / 2
    return float(mu @ np.linalg.solve(sigma, mu) / 2)


def worst_pattern(strategy, participation: Participation) -> np.ndarray:
    """The unit's increments on its worst pattern: the earliest steps (exact for these strategies, ADR 32)."""
    shift = np.zeros(strategy.horizon)
    shift[participation.earliest(strategy.horizon)] = 1.0
    return shift


CASES = [
    pytest.param(SquareRootToeplitz(HORIZON), Participation(1), id="sqrt k=1"),
    pytest.param(SquareRootToeplitz(HORIZON), Participation(3, 2), id="sqrt k=3 b=2"),
    pytest.param(BinaryTree(HORIZON, honaker=True), Participation(2), id="tree_honaker k=2"),
    pytest.param(SummedIncrements(HORIZON), Participation(2), id="summed k=2"),
]


@pytest.mark.parametrize(("strategy", "participation"), CASES)
def test_neighbouring_streams_lose_at_most_the_series_rho(strategy, participation):
    noise = SeriesNoise(strategy, candidate(strategy, participation, RHO, Fraction(1)))
    shift = worst_pattern(strategy, participation)
    rho = measured_rho(outputs(noise, np.zeros(HORIZON)), outputs(noise, shift))
    assert rho <= 1.10 * float(RHO), rho  # the estimate's sampling error is a few %
    if not isinstance(strategy, BinaryTree):
        # B is square and invertible: the totals reveal the whole measurement, and the worst pattern spends all of
        # rho (the tree has more measurements than steps; its totals reveal less, about 0.85 rho here)
        assert rho >= 0.85 * float(RHO), rho


@pytest.mark.parametrize(("strategy", "participation"), CASES)
def test_the_audit_flags_noise_scaled_down(strategy, participation):
    """Negative control: 20 % less noise spends rho / 0.64, which the bound above refuses."""
    noise = SeriesNoise(strategy, candidate(strategy, participation, RHO, Fraction(1)))
    shift = worst_pattern(strategy, participation)
    rho = measured_rho(outputs(noise, np.zeros(HORIZON), 0.8), outputs(noise, shift, 0.8))
    assert rho > 1.10 * float(RHO), rho
