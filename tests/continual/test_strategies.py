"""Series strategies: the planned errors of the literature, exact sensitivities under a contribution pattern
(against exhaustive search over every pattern a unit may follow), decoders that invert their measurements, and the
choice of ``mechanism: auto``."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from dp_operators.continual import (
    BinaryTree,
    Participation,
    SquareRootToeplitz,
    SummedIncrements,
    plan_series,
    prefix_sum_lower_bound,
)


# worst-step std of a running total at rho = 1, one contribution per unit (the table of the continual-release issue;
# Fichtenberger, Henzinger, Upadhyay 2023 and Honaker 2015 give the same figures)
@pytest.mark.parametrize(("horizon", "expected"), [
    (365, {"summed_increments": 13.51, "binary_tree": 6.00, "tree_honaker": 4.65, "sqrt_factorization": 2.08}),
    (1000, {"summed_increments": 22.36, "binary_tree": 6.71, "tree_honaker": 5.15, "sqrt_factorization": 2.31}),
])
def test_planned_worst_step_errors_match_the_literature(horizon, expected):
    plan = plan_series(horizon, Participation(1), 1)
    assert {c.mechanism: round(c.worst_std, 2) for c in plan.candidates} == expected
    assert plan.chosen.mechanism == "sqrt_factorization"


@pytest.mark.parametrize(("horizon", "bound"), [(365, 1.83), (1000, 2.05)])
def test_no_candidate_beats_the_factorization_lower_bound(horizon, bound):
    lower = prefix_sum_lower_bound(horizon) / np.sqrt(2)  # rho = 1: noise variance 1/2 at sensitivity 1
    assert round(lower, 2) == bound
    for c in plan_series(horizon, Participation(1), 1).candidates:
        assert c.rmse >= lower


def test_the_square_root_factorization_is_within_its_closed_form():
    # (ln T + gamma + 4 ln 2) / (pi sqrt(2 rho)): the unrounded coefficients' worst step, an upper bound
    for horizon in (10, 365, 1000, 5000):
        worst = plan_series(horizon, Participation(1), 1, mechanism="sqrt_factorization").chosen.worst_std
        closed = (np.log(horizon) + np.euler_gamma + 4 * np.log(2)) / (np.pi * np.sqrt(2))
        assert closed * 0.97 < worst <= closed * (1 + 1e-6)


@pytest.mark.parametrize(("k", "sqrt_std", "summed_std"), [(1, 2.08, 13.51), (7, 12.54, 35.74),
                                                          (30, 47.48, 73.99), (90, 125.55, 128.16)])
def test_the_gain_shrinks_as_a_unit_contributes_to_more_steps(k, sqrt_std, summed_std):
    plan = plan_series(365, Participation(k), 1)
    by_name = {c.mechanism: c for c in plan.candidates}
    assert round(by_name["sqrt_factorization"].worst_std, 2) == sqrt_std
    assert round(by_name["summed_increments"].worst_std, 2) == summed_std


def test_auto_takes_summed_increments_when_a_unit_may_contribute_every_step():
    assert plan_series(64, Participation(64), 1).chosen.mechanism == "summed_increments"
    assert plan_series(64, Participation(1), 1).chosen.mechanism == "sqrt_factorization"


def test_a_named_mechanism_is_planned_alone():
    plan = plan_series(100, Participation(1), "1/2", mechanism="tree_honaker")
    assert [c.mechanism for c in plan.candidates] == ["tree_honaker"] and plan.chosen.mechanism == "tree_honaker"
    with pytest.raises(ValueError, match="unknown series mechanism 'fft'"):
        plan_series(100, Participation(1), 1, mechanism="fft")


def test_the_noise_variance_is_exact_in_the_budget_and_the_step_sensitivity():
    plan = plan_series(100, Participation(3), Fraction(1, 8), step_sensitivity_squared=4,
                       mechanism="summed_increments")
    # Delta_C^2 = 3 steps; sigma^2 = 3 * 2^2 / (2 / 8)
    assert plan.chosen.sensitivity_squared == 3 and plan.chosen.noise_variance == 48


# -- exact sensitivities against exhaustive search ----------------------------------------------------------------
def _measurements(strategy) -> list[list[Fraction]]:
    """The strategy's measurement matrix C, exact (rows: measurements, columns: steps)."""
    horizon = strategy.horizon
    if isinstance(strategy, SummedIncrements):
        return [[Fraction(int(i == j)) for j in range(horizon)] for i in range(horizon)]
    if isinstance(strategy, BinaryTree):
        rows = []
        for level in range(strategy.levels):
            size = 1 << level
            for start in range(0, horizon - size + 1, size):
                rows.append([Fraction(int(start <= j < start + size)) for j in range(horizon)])
        return rows
    c = [Fraction(n, 1 << 24) for n in strategy.numerators]
    return [[c[i - j] if j <= i else Fraction(0) for j in range(horizon)] for i in range(horizon)]


def _patterns(horizon: int, participation: Participation):
    """Every set of steps a unit may contribute to: at most k steps, pairwise at least b apart (non-empty)."""
    for size in range(1, participation.max_steps + 1):
        for steps in itertools.combinations(range(horizon), size):
            if all(later - earlier >= participation.min_separation for earlier, later in zip(steps, steps[1:])):
                yield steps


def _largest_change(strategy, participation: Participation, *, signs: bool = True) -> Fraction:
    """max ||C v||^2 over every pattern and every v with |v_i| <= 1 on it (a convex function of v: its maximum is at
    a vertex, v_i = +-1). ``signs=False`` takes v = 1 only: the maximum too, since no entry of C^T C is negative
    (checked with every sign for the smaller patterns)."""
    matrix = _measurements(strategy)
    best = Fraction(0)
    for steps in _patterns(strategy.horizon, participation):
        for vertex in itertools.product((1, -1), repeat=len(steps)) if signs else [(1,) * len(steps)]:
            change = sum((sum(s * row[j] for s, j in zip(vertex, steps)) ** 2 for row in matrix), Fraction(0))
            best = max(best, change)
    return best


PATTERNS = [Participation(k, b) for k in (1, 2, 3) for b in (1, 2, 3)]
#: patterns up to every step of the horizons below: a unit in many steps fills the tree's few long intervals
MANY_STEPS = [Participation(k, b) for k in (4, 5, 7, 9) for b in (1, 2)]


@pytest.mark.parametrize("participation", PATTERNS, ids=lambda p: f"k={p.max_steps},b={p.min_separation}")
@pytest.mark.parametrize("horizon", [7, 9])
def test_factorization_and_summed_sensitivities_are_the_exact_maximum_over_every_pattern(horizon, participation):
    for strategy in (SummedIncrements(horizon), SquareRootToeplitz(horizon)):
        assert strategy.sensitivity_squared(participation) == _largest_change(strategy, participation)


@pytest.mark.parametrize("participation", PATTERNS, ids=lambda p: f"k={p.max_steps},b={p.min_separation}")
@pytest.mark.parametrize("horizon", [7, 9])
def test_the_tree_sensitivity_is_never_below_the_maximum_and_exact_for_consecutive_steps(horizon, participation):
    strategy = BinaryTree(horizon)
    largest = _largest_change(strategy, participation)
    assert strategy.sensitivity_squared(participation) >= largest
    if participation.min_separation == 1:
        assert strategy.sensitivity_squared(participation) == largest


@pytest.mark.parametrize("participation", MANY_STEPS, ids=lambda p: f"k={p.max_steps},b={p.min_separation}")
@pytest.mark.parametrize("horizon", [5, 7, 9])
def test_sensitivities_stay_exact_when_a_unit_is_in_many_steps(horizon, participation):
    for strategy in (SummedIncrements(horizon), SquareRootToeplitz(horizon)):
        assert strategy.sensitivity_squared(participation) == _largest_change(strategy, participation, signs=False)
    tree = BinaryTree(horizon)
    largest = _largest_change(tree, participation, signs=False)
    assert tree.sensitivity_squared(participation) >= largest
    if participation.min_separation == 1:
        assert tree.sensitivity_squared(participation) == largest


def test_exhaustive_search_flags_a_sensitivity_taken_at_the_wrong_steps():
    """Negative control: the square-root factorization's sensitivity computed at the last k steps (where its
    columns are shortest) is below the exhaustive maximum, so the comparison above can fail."""
    strategy, participation = SquareRootToeplitz(9), Participation(2)
    matrix = _measurements(strategy)
    last = sum((row[7] + row[8]) ** 2 for row in matrix)
    assert last < _largest_change(strategy, participation) == strategy.sensitivity_squared(participation)


# -- decoders ----------------------------------------------------------------------------------------------------
def test_the_square_root_decoder_inverts_the_rounded_measurements():
    strategy = SquareRootToeplitz(200)
    c = strategy.coefficients
    assert c[0] == 1 and np.all(np.diff(c) <= 0) and np.all(c > 0)
    exact = np.array([float(Fraction(n, 1 << 24)) for n in strategy.numerators])
    assert np.array_equal(c, exact)
    horizon = strategy.horizon
    measure = np.array([[c[i - j] if j <= i else 0.0 for j in range(horizon)] for i in range(horizon)])
    decode = np.array([[strategy.decoder_coefficients[i - j] if j <= i else 0.0 for j in range(horizon)]
                       for i in range(horizon)])
    np.testing.assert_allclose(decode @ measure, np.tril(np.ones((horizon, horizon))), atol=1e-9)
    np.testing.assert_allclose(strategy.step_variances(), (decode ** 2).sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("horizon", [1, 2, 7, 40])
def test_honaker_step_variances_are_the_least_squares_estimates_from_completed_intervals(horizon):
    """The bottom-up recursion against generalized least squares over every interval completed by each step."""
    strategy = BinaryTree(horizon, honaker=True)
    rows = np.array([[float(x) for x in row] for row in _measurements(strategy)])
    starts = [int(np.flatnonzero(row)[0]) for row in rows]
    ends = [int(np.flatnonzero(row)[-1]) + 1 for row in rows]
    expected = []
    for t in range(1, horizon + 1):
        completed = rows[[i for i, end in enumerate(ends) if end <= t]][:, :t]
        prefix = np.ones(t)
        expected.append(prefix @ np.linalg.pinv(completed.T @ completed) @ prefix)
    np.testing.assert_allclose(strategy.step_variances(), expected, rtol=1e-9)
    assert starts  # every level's intervals were built


def test_the_plain_tree_sums_the_binary_digits_of_each_step():
    variances = BinaryTree(365).step_variances()
    assert variances[254] == 8 and variances[255] == 1 and variances.max() == 8  # 255 = 0b11111111, 256 = 0b1e8


def test_a_horizon_out_of_range_and_a_bad_pattern_are_refused():
    with pytest.raises(ValueError, match="a series has 1 to 10000 steps, got 0"):
        SummedIncrements(0)
    with pytest.raises(ValueError, match="max_steps and min_separation must be >= 1"):
        Participation(0)
    with pytest.raises(ValueError, match="rho and step_sensitivity_squared must be > 0"):
        plan_series(10, Participation(1), 0)
