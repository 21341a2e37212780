"""The noised CDF of a quantile's histogram (``dp_operators.release.cdf``): the consistent tree is the least-squares
decoder of every node, its sensitivity is the worst over every set of bins, and both strategies plan the accuracy
the issue set at 1,000 bins."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from dp_operators.continual.strategies import GRID_BITS, _square_root_numerators
from dp_operators.release import cdf, plan_release
from dp_operators.release.cdf import ConsistentTreeCdf, cdf_measurement, tree_sensitivity_squared
from dp_operators.spec import ReleaseSpec


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
    tree = ConsistentTreeCdf(bins, 1, 1, 1, Fraction(1))
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


# -- one privacy unit over several groups: the measurement's change, computed from the matrices themselves ---------

def _spec(bins: int, groups: int, l0: int, strategy: str = "sqrt_factorization") -> ReleaseSpec:
    return ReleaseSpec.model_validate({
        "version": 1, "release": "q", "budget_account": "acct", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": l0, "max_contributions_per_partition": 1},
        "aggregates": [{"name": "h", "kind": "median", "bins": {"column": "x", "edges": [0, bins], "width": 1},
                        "group_by": ["day"], "keys": {"day": list(range(groups))},
                        "mechanism": "noised_cdf", "cdf_strategy": strategy, "budget": {"rho": 1}}]})


def _measurement_change_squared(bins: int, records_per_group: list[int]) -> Fraction:
    """||C x||^2 summed over groups, C the rounded square-root Toeplitz matrix (numerators / 2^GRID_BITS), x the
    unit's records: ``records_per_group[g]`` records in the lowest bins of group g, one per bin."""
    c = _square_root_numerators(bins)
    total = 0
    for filled in records_per_group:
        for t in range(bins):  # (C x)_t = sum_{s <= t, s < filled} c_(t - s)
            value = sum(c[t - s] for s in range(min(t + 1, filled)))
            total += value * value
    return Fraction(total, 1 << (2 * GRID_BITS))


def _tree_change_squared(bins: int, records_per_group: list[int]) -> int:
    """Sum over groups of sum over every node of the binary tree over M = 2^ceil(log2 m) leaves of (records in the
    node)^2, the unit's records in the lowest bins of each group, one per bin."""
    leaves = 1 << (bins - 1).bit_length()
    total = 0
    for filled in records_per_group:
        size = 1
        while size <= leaves:
            total += sum(len(range(start, min(start + size, filled))) ** 2 for start in range(0, leaves, size))
            size *= 2
    return total



def _splits(bins: int, groups: int, l0: int, parts: tuple = ()) -> list[tuple]:
    """Every way (up to order) to put at most ``l0`` of a unit's records, one per bin, into at most ``groups``
    groups of ``bins`` bins, the lowest bins of each (the worst place for both strategies)."""
    found = [parts]
    if len(parts) < groups:
        for filled in range(1, min(bins, l0 - sum(parts), parts[-1] if parts else bins) + 1):
            found += _splits(bins, groups, l0, parts + (filled,))
    return found


@pytest.mark.parametrize(("bins", "groups", "l0", "splits"), [
    # a unit spread over partly filled groups moves the square root (the ninth bin of ten moves little) and the
    # tree (eight bins fill a subtree of nine's padded sixteen) more than full groups do
    (10, 12, 100, [(10,) * 10, (9,) * 10 + (10,)]), (9, 12, 72, [(9,) * 8, (8,) * 9]),
    (5, 3, 7, None), (4, 4, 9, None), (3, 2, 2, None), (9, 4, 20, None)])
def test_no_split_of_a_unit_over_groups_moves_the_measurement_beyond_the_planned_sensitivity(bins, groups, l0,
                                                                                            splits):
    root = plan_release(_spec(bins, groups, l0), accountant="zcdp").steps[0].cdf_noise
    tree = plan_release(_spec(bins, groups, l0, "tree_consistent"), accountant="zcdp").steps[0].cdf_noise
    splits = splits or _splits(bins, groups, l0)  # every split where that is few enough
    assert root.sensitivity_squared >= max(_measurement_change_squared(bins, list(s)) for s in splits)
    assert tree.sensitivity_squared >= max(_tree_change_squared(bins, list(s)) for s in splits)
    # and where one group holds the worst (L0 <= m), the plan is that exactly
    if l0 <= bins:
        assert root.sensitivity_squared == _measurement_change_squared(bins, [l0])
