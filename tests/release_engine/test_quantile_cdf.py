"""The noised CDF of a quantile's histogram (``dp_operators.release.cdf``): the consistent tree is the least-squares
decoder of every node, its sensitivity is the worst over every set of bins, and both strategies plan the accuracy
the issue set at 1,000 bins."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from dp_operators.release import cdf
from dp_operators.release.cdf import ConsistentTreeCdf, cdf_measurement, tree_sensitivity_squared


def _node_matrix(leaves: int) -> np.ndarray:
    rows, size = [], 1
    while size <= leaves:
        for start in range(0, leaves, size):
            row = np.zeros(leaves)
            row[start:start + size] = 1
            rows.append(row)
        size *= 2
    return np.array(rows)


@pytest.mark.parametrize("bins", [1, 2, 5, 8, 13])
def test_the_consistent_tree_decodes_every_node_by_least_squares(bins, monkeypatch):
    tree = ConsistentTreeCdf(bins, 1, Fraction(1), Fraction(1))
    nodes = _node_matrix(tree.leaves)
    prefixes = np.tril(np.ones((tree.leaves, tree.leaves)))[:bins] @ np.linalg.pinv(nodes)
    noise = np.random.default_rng(bins).integers(-50, 51, size=len(nodes))
    monkeypatch.setattr(cdf, "sample_discrete_gaussian_array", lambda sigma2, size: noise[:size])
    histogram = list(range(bins))
    decoded = tree.noised_prefixes(histogram)
    assert np.allclose([float(value) for value in decoded], np.cumsum(histogram) + prefixes @ noise)
    assert np.allclose(tree.prefix_variances() / float(tree.noise_variance), (prefixes**2).sum(axis=1))


@pytest.mark.parametrize("contributions", [1, 2, 3, 4, 5])
def test_the_tree_sensitivity_is_the_worst_over_every_set_of_bins(contributions):
    nodes = _node_matrix(8)
    worst = max(int(((nodes[:, list(chosen)].sum(axis=1)) ** 2).sum())
                for chosen in combinations(range(8), contributions))
    assert tree_sensitivity_squared(8, contributions) == worst


def test_both_strategies_plan_the_accuracy_set_for_a_thousand_bins():
    tree = cdf_measurement("tree_consistent", 1000, 1, 1, 1, Fraction(1))
    root = cdf_measurement("sqrt_factorization", 1000, 1, 1, 1, Fraction(1))
    assert tree.rho == root.rho == 1
    assert tree.worst_std <= 4.2
    assert root.worst_std < 2.31
    assert cdf_measurement("auto", 1000, 1, 1, 1, Fraction(1)).name == "sqrt_factorization"
    with pytest.raises(ValueError, match="unknown CDF strategy"):
        cdf_measurement("binary_tree", 1000, 1, 1, 1, Fraction(1))


def test_more_bins_than_the_square_root_decodes_in_time_take_the_tree():
    from dp_operators.release.cdf import SQRT_MAX_BINS

    assert cdf_measurement("auto", SQRT_MAX_BINS + 1, 1, 1, 1, Fraction(1)).name == "tree_consistent"
    with pytest.raises(ValueError, match="at most 2,048 bins"):
        cdf_measurement("sqrt_factorization", SQRT_MAX_BINS + 1, 1, 1, 1, Fraction(1))
