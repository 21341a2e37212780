"""A series' noise: each step's draws, and the exact noise on each running total, against the strategies' matrices
(least squares for Honaker's tree), against the rational recurrence (the square root's integer decoder, and how
often it is computed) and, by simulation, against the planned variances."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from dp_operators.continual import BinaryTree, Participation, SquareRootToeplitz, SummedIncrements, plan_series
from dp_operators.continual import noise as noise_module
from dp_operators.continual.noise import SeriesNoise
from dp_operators.continual.plan import candidate


def series(strategy, rho=1, grid=Fraction(1)) -> SeriesNoise:
    return SeriesNoise(strategy, candidate(strategy, Participation(1), Fraction(rho), Fraction(1)), grid)


def _matrices(strategy) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """C (rows: measurements in the order the steps complete them) and each row's (level, index)."""
    noise = series(strategy)
    rows, names = [], []
    horizon = strategy.horizon
    for step in range(horizon):
        for level, index in noise.measurements_at(step):
            if isinstance(strategy, BinaryTree):
                row = np.zeros(horizon)
                row[index << level:(index + 1) << level] = 1
            elif isinstance(strategy, SquareRootToeplitz):
                row = np.array([strategy.coefficients[step - j] if j <= step else 0.0 for j in range(horizon)])
            else:
                row = np.eye(horizon)[step]
            rows.append(row)
            names.append((level, index))
    return np.array(rows), names


@pytest.mark.parametrize("strategy", [SummedIncrements(13), BinaryTree(13), BinaryTree(13, honaker=True),
                                      SquareRootToeplitz(13)], ids=lambda s: s.name)
def test_each_running_totals_noise_is_the_least_squares_decoding_of_the_measurements_so_far(strategy):
    """For any draws, (B z)_t equals the minimum-variance unbiased estimate of the prefix sum from the measurements
    completed by step t (for the square root and summed increments, whose C is square and invertible, B = A C^-1;
    for the plain tree, the dyadic decomposition, checked separately below)."""
    noise = series(strategy)
    matrix, names = _matrices(strategy)
    rng = random.Random(7)
    history = [[rng.randrange(-10**6, 10**6) for _ in noise.measurements_at(step)] for step in range(13)]
    flat = np.array([float(v) for draws in history for v in draws])
    done = 0
    for t in range(13):
        done += len(noise.measurements_at(t))
        got = noise.total_noise(history[:t + 1]) / noise.lattice  # in lattice units, as the draws
        if isinstance(strategy, BinaryTree) and not strategy.honaker:
            length, start, expected = t + 1, 0, 0.0
            for level in reversed(range(strategy.levels)):
                if length >> level & 1:
                    expected += flat[names.index((level, start >> level))]
                    start += 1 << level
        else:
            completed = matrix[:done, :t + 1]
            prefix = np.ones(t + 1)
            estimator = prefix @ np.linalg.pinv(completed)  # weights on the completed measurements
            expected = float(estimator @ flat[:done])
        assert float(got) == pytest.approx(expected, rel=1e-9, abs=1e-6)


def test_the_square_root_decoder_is_exact_rationals_inverting_the_rounded_coefficients():
    noise = series(SquareRootToeplitz(40))
    b = noise.decoder
    c = [Fraction(n, 1 << 24) for n in noise.strategy.numerators]
    # B C = A: sum_{s<=n} b_{n-s} c_s... in Toeplitz form, the convolution of (b_n - b_{n-1}) with c is the unit
    inverse = [b[0]] + [b[n] - b[n - 1] for n in range(1, 40)]
    for n in range(40):
        assert sum(c[s] * inverse[n - s] for s in range(n + 1)) == (1 if n == 0 else 0)
    assert all(isinstance(value, Fraction) for value in b)


def test_the_lattice_and_the_noise_parameter_follow_the_grid_and_the_strategy():
    plain = series(SummedIncrements(10), grid=Fraction(1, 1000))
    assert plain.lattice == Fraction(1, 1000)
    assert plain.sigma2 == plain.candidate.noise_variance * 10**6
    root = series(SquareRootToeplitz(10))
    assert root.lattice == Fraction(1, 2**24) and root.sigma2 == root.candidate.noise_variance * 2**48
    tree = series(BinaryTree(8))
    assert [len(tree.measurements_at(step)) for step in range(8)] == [1, 2, 1, 3, 1, 2, 1, 4]


def test_a_history_of_the_wrong_shape_is_refused():
    noise = series(BinaryTree(4))
    with pytest.raises(ValueError, match="step 1 holds 1 draws, not 2"):
        noise.total_noise([[0], [0]])
    with pytest.raises(ValueError, match="a history of 5 steps does not fit a series of 4"):
        noise.total_noise([[0], [0, 0], [0], [0, 0, 0]] + [[0]])


def _simulated_variances(noise: SeriesNoise, runs: int, decode=None) -> np.ndarray:
    horizon = noise.strategy.horizon
    totals = np.zeros((runs, horizon))
    for run in range(runs):
        history: list[list[int]] = []
        for step in range(horizon):
            history.append(noise.draw(step))
            totals[run, step] = float((decode or noise.total_noise)(history))
    return totals.var(axis=0)


@pytest.mark.parametrize("strategy", [SummedIncrements(8), BinaryTree(8, honaker=True), SquareRootToeplitz(8)],
                         ids=lambda s: s.name)
def test_simulated_running_totals_have_the_planned_variance(strategy):
    """2,000 series at rho = 1: each step's empirical variance within 20 % of the plan (a variance from 2,000 draws
    has a relative standard deviation of 3.2 %), and their mean within 8 %."""
    noise = series(strategy)
    planned = float(noise.candidate.noise_variance) * strategy.step_variances()
    measured = _simulated_variances(noise, 2000)
    assert np.all(np.abs(measured / planned - 1) < 0.20), (measured, planned)
    assert abs(measured.mean() / planned.mean() - 1) < 0.08


def test_the_variance_check_flags_a_decoder_that_ignores_the_factorization():
    """Negative control: the square root's measurements decoded as summed increments (B = A instead of A C^-1)
    carry more noise than planned, and the check above fails on them."""
    noise = series(SquareRootToeplitz(8))

    def summed(history):
        return sum(Fraction(draws[0]) for draws in history) * noise.lattice

    planned = float(noise.candidate.noise_variance) * noise.strategy.step_variances()
    measured = _simulated_variances(noise, 2000, decode=summed)
    assert not np.all(np.abs(measured / planned - 1) < 0.20)


def _coverage(noise: SeriesNoise, runs: int, shrink: float = 1.0) -> float:
    horizon = noise.strategy.horizon
    widths = [shrink * noise.half_width(step, 0.95) for step in range(horizon)]
    inside = 0
    for _ in range(runs):
        history: list[list[int]] = []
        for step in range(horizon):
            history.append(noise.draw(step))
            inside += abs(float(noise.total_noise(history))) <= widths[step]
    return inside / (runs * horizon)


@pytest.mark.slow
def test_the_square_roots_intervals_cover_the_true_total_95_percent_of_the_time():
    """16,000 (series, step) pairs: coverage 95 % +- 2 % (its standard deviation here is under 0.5 %, the steps of a
    series being correlated); a negative control with the intervals 20 % narrower falls below 93 %."""
    noise = series(SquareRootToeplitz(8))
    assert abs(_coverage(noise, 2000) - 0.95) <= 0.02
    assert _coverage(noise, 2000, shrink=0.8) < 0.93


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [SummedIncrements(8), BinaryTree(8, honaker=True)], ids=lambda s: s.name)
def test_intervals_on_the_integer_lattice_cover_at_least_their_confidence(strategy):
    """On the integers a half-width is a lattice point (summed increments: the exact law's) or the sub-Gaussian
    bound (Honaker's weights): the coverage is at least 95 % (less 0.5 % for sampling), not 95 % +- 2 %; a negative
    control with the intervals halved falls below 93 %."""
    noise = series(strategy)
    assert _coverage(noise, 2000) >= 0.945
    assert _coverage(noise, 2000, shrink=0.5) < 0.93


def test_a_half_width_outside_the_series_is_refused():
    with pytest.raises(ValueError, match=r"step must be in \[0, 8\)"):
        series(SummedIncrements(8)).half_width(8, 0.95)


@pytest.mark.parametrize("strategy", [SummedIncrements(11), BinaryTree(11), BinaryTree(11, honaker=True),
                                      SquareRootToeplitz(11)], ids=lambda s: s.name)
def test_the_float_decoder_rows_are_the_exact_decoders_weights(strategy):
    noise = series(strategy)
    rows = noise.decoder_rows()
    rng = random.Random(3)
    history = [[rng.randrange(-1000, 1000) for _ in noise.measurements_at(step)] for step in range(11)]
    flat = np.array([float(v) for draws in history for v in draws])
    for t in range(11):
        assert rows[t] @ flat == pytest.approx(float(noise.total_noise(history[:t + 1])), rel=1e-12, abs=1e-9)
    # each row's squared weights are the planned step variance (in lattice units squared)
    np.testing.assert_allclose((rows / float(noise.lattice)) ** 2 @ np.ones(rows.shape[1]),
                               strategy.step_variances(), rtol=1e-9)


def _rational_decoder(horizon: int) -> list[Fraction]:
    """The slow reference: the power series inverse of the rounded coefficients by the recurrence in rationals
    (``u_0 = 1``, ``u_n = -sum_(s=1..n) c_s u_(n-s)``), then its prefix sums."""
    c = [Fraction(n, 1 << 24) for n in SquareRootToeplitz(horizon).numerators]
    inverse = [Fraction(1)]
    for n in range(1, horizon):
        inverse.append(-sum((c[s] * inverse[n - s] for s in range(1, n + 1)), Fraction(0)))
    prefix, running = [], Fraction(0)
    for value in inverse:
        running += value
        prefix.append(running)
    return prefix


def test_the_integer_decoder_equals_the_rational_recurrence_for_every_short_horizon():
    for horizon in range(1, 65):
        expected = _rational_decoder(horizon)
        dyadic = noise_module.square_root_decoder(horizon)
        assert len(dyadic.numerators) == horizon
        assert [Fraction(b, 1 << dyadic.exponent) for b in dyadic.numerators] == expected, horizon
        assert series(SquareRootToeplitz(horizon)).decoder == expected, horizon


def test_the_integer_decoder_equals_the_rational_recurrence_at_200_steps_over_a_near_tight_denominator():
    expected = _rational_decoder(200)
    dyadic = noise_module.square_root_decoder(200)
    assert [Fraction(b, 1 << dyadic.exponent) for b in dyadic.numerators] == expected
    assert series(SquareRootToeplitz(200)).decoder == expected
    # the common denominator is within a few bits of the largest reduced one (373 against 371 bits)
    largest = max(value.denominator.bit_length() - 1 for value in expected)
    assert largest <= dyadic.exponent <= largest + 4


def test_a_common_denominator_too_small_for_the_inverse_is_refused_not_rounded():
    """Negative control for the exactness check: one bit short of the largest denominator, a step's sum is not a
    multiple of 2^GRID_BITS and the computation stops."""
    numerators = SquareRootToeplitz(64).numerators
    prefix = _rational_decoder(64)
    inverse = [prefix[0]] + [prefix[n] - prefix[n - 1] for n in range(1, 64)]
    largest = max(value.denominator.bit_length() - 1 for value in inverse)
    assert noise_module._scaled_inverse(numerators, largest)  # enough
    with pytest.raises(ArithmeticError, match="not a multiple"):
        noise_module._scaled_inverse(numerators, largest - 1)


def test_limb_sums_are_carried_back_into_the_exact_integer():
    rng = np.random.default_rng(5)
    for _ in range(50):
        sums = rng.integers(-(2**53) + 1, 2**53, size=rng.integers(1, 40)).astype(np.float64)
        sums[rng.random(sums.size) < 0.3] = 0
        assert noise_module._from_limbs(sums) == sum(int(value) << (16 * k) for k, value in enumerate(sums))
    for value in (0, 1, -1, 2**200 - 1, -(3**100)):
        assert noise_module._from_limbs(noise_module._to_limbs(value, 14)) == value


@pytest.mark.parametrize("grid", [Fraction(1), Fraction(1, 1000)], ids=["counts", "sums"])
def test_the_total_noise_is_the_rational_decoders_exact_sum_on_random_histories(grid):
    noise = series(SquareRootToeplitz(200), grid=grid)
    decoder = _rational_decoder(200)
    rng = random.Random(11)
    for t in (0, 1, 7, 63, 150, 199):
        for scale in (10, 2**30, 2**70):
            history = [[rng.randrange(-scale, scale + 1)] for _ in range(t + 1)]
            expected = sum((decoder[t - s] * draws[0] for s, draws in enumerate(history)), Fraction(0))
            got = noise.total_noise(history)
            assert isinstance(got, Fraction) and got == expected * grid / 2**24
    # draws read back as numpy integers decode to the same exact total
    history = [[rng.randrange(-2**40, 2**40)] for _ in range(100)]
    assert noise.total_noise([[np.int64(draws[0])] for draws in history]) == noise.total_noise(history)


def test_every_series_of_a_horizon_shares_one_decoder_computation(monkeypatch):
    """The work count: the exact inverse is computed once per horizon in a process, however many series (one per
    Airflow run) decode with it, and whichever of total_noise, decoder and decoder_rows reads it."""
    computed: list[int] = []
    inverse = noise_module._scaled_inverse

    def counting(numerators, exponent):
        computed.append(len(numerators))
        return inverse(numerators, exponent)

    monkeypatch.setattr(noise_module, "_scaled_inverse", counting)
    noise_module.square_root_decoder.cache_clear()
    noise_module.square_root_decoder_fractions.cache_clear()
    rng = random.Random(2)
    for run in range(6):
        horizon = 30 if run % 2 else 31
        noise = series(SquareRootToeplitz(horizon))  # a new strategy and series each run, as an operator's
        history = [noise.draw(step) for step in range(rng.randrange(1, horizon))]
        assert isinstance(noise.total_noise(history), Fraction)
        assert len(noise.decoder) == horizon and noise.decoder_rows().shape == (horizon, horizon)
    assert sorted(computed) == [30, 31]
    assert noise_module.square_root_decoder.cache_info().misses == 2
