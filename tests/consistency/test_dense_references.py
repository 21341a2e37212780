"""The least-squares estimate of a family and its exact variances against independent dense references: the linear
model computed from the spec's key lists alone (tests/consistency/family_models.py), pmf-summed noise variances and
numpy's dense generalised least squares, through spec -> plan -> plan_families."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dp_operators.consistency import variance, wls
from dp_operators.release import plan_release
from dp_operators.release.consistent import make_consistent, plan_families

from .family_models import (
    ALPHA,
    aggregate,
    all_margins,
    dense_gls,
    dense_model,
    four_axis_spec,
    make_spec,
    product_family,
)


def assert_matches_dense_gls(planned, matrices, variances, seed: int) -> np.ndarray:
    """The closed-form variances of ``planned`` equal diag(A N^-1 A^T) of the dense model, and its fit of one
    simulated release equals numpy's dense GLS; returns N^-1."""
    inverse = np.linalg.inv(sum(a.T @ a / v for a, v in zip(matrices, variances)))
    for a, accuracy in zip(matrices, planned.accuracies):
        np.testing.assert_allclose(accuracy.standard_deviation ** 2, np.diag(a @ inverse @ a.T), rtol=1e-10)
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 50, matrices[0].shape[1]).astype(float)
    observations = [a @ truth + rng.normal(0, math.sqrt(v), a.shape[0]) for a, v in zip(matrices, variances)]
    np.testing.assert_allclose(wls.fit(planned.family, observations), dense_gls(matrices, variances, observations),
                               rtol=1e-9, atol=1e-9)
    return inverse


@pytest.mark.parametrize("kind", ["count", "sum"])
def test_fit_variances_and_bias_bounds_equal_dense_gls_through_the_spec(kind):
    """Through spec -> plan -> plan_families: 4 axes, margins with reordered columns and keys, a duplicated margin
    (Laplace and Gaussian), a reordered copy of the base, mixed mechanisms. The closed-form variances equal
    diag(A N^-1 A^T) computed densely from the key lists and pmf-summed variances; the fit equals numpy's dense
    GLS; for sums the carried rounding allowance equals sum_i |P_ji| b_i."""
    spec = four_axis_spec(kind)
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = plan_families(plan)
    names = list(planned.family.names)
    assert names[0] == "base" and planned.family.product
    matrices, variances = dense_model(spec, plan, "base", names)
    for member, v in zip(planned.family.members, variances):
        assert member.variance == pytest.approx(v, rel=1e-12)
    inverse = assert_matches_dense_gls(planned, matrices, variances, seed=7)
    if kind == "sum":
        biases = np.concatenate([np.full(a.shape[0], m.bias) for a, m in zip(matrices, planned.family.members)])
        assert np.all(biases > 0)
        stacked = np.vstack(matrices)
        weights = np.concatenate([np.full(a.shape[0], 1 / v) for a, v in zip(matrices, variances)])
        projection = stacked @ inverse @ stacked.T * weights  # P = A N^-1 A^T W
        np.testing.assert_allclose(np.concatenate([acc.bias for acc in planned.accuracies]),
                                   np.abs(projection) @ biases, rtol=1e-9)


def test_hierarchy_family_variances_equal_dense_gls_through_the_spec():
    """age > age band, with band keys listed in another order than the hierarchy's groups, band x sex listed as
    [sex, band], mixed mechanisms: the dense exact variances of plan_families equal diag(A N^-1 A^T) computed
    from the spec alone, and the fit equals numpy's dense GLS."""
    bands = {"10-19": list(range(10, 20)), "0-4": list(range(0, 5)), "5-9": list(range(5, 10)), "20+": [20]}
    band_of = {age: band for band, ages in bands.items() for age in ages}
    ages, sexes, band_keys = list(range(21)), ["F", "M"], ["20+", "0-4", "10-19", "5-9"]
    spec = make_spec([aggregate("age_sex", {"age": ages, "sex": sexes}, "discrete_gaussian", {"rho": "1/10"}),
                      aggregate("sex_band", {"sex": ["M", "F"], "band": band_keys}, "discrete_laplace",
                                {"epsilon": "1/2"}),
                      aggregate("band", {"band": band_keys[::-1]}, "discrete_gaussian", {"rho": "1/30"}),
                      aggregate("age", {"age": ages[::-1]}, "discrete_laplace", {"epsilon": "1/4"}),
                      aggregate("total", {}, "discrete_gaussian", {"rho": "1/50"})],
                     {"consistent": True, "hierarchies": [{"parent": "band", "child": "age", "groups": bands}]})
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = plan_families(plan)
    assert not planned.family.product and all(a.exact for a in planned.accuracies)
    names = list(planned.family.names)
    matrices, variances = dense_model(spec, plan, "age_sex", names, {"band": ("age", band_of)})
    assert_matches_dense_gls(planned, matrices, variances, seed=17)


def test_margins_with_keys_in_another_order_sum_the_right_cells():
    """Noiseless (consistent) 'noised' values in each member's own key order come back unchanged from
    make_consistent: the cell maps follow the keys, not their positions."""
    spec = four_axis_spec()
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = plan_families(plan)
    matrices, _ = dense_model(spec, plan, "base", list(planned.family.names))
    truth = np.random.default_rng(8).integers(0, 1000, matrices[0].shape[1])
    noised = {(name, "count"): (a @ truth).astype(np.int64) for name, a in zip(planned.family.names, matrices)}
    result = make_consistent(plan, planned, noised, ALPHA)
    for name, a in zip(planned.family.names, matrices):
        np.testing.assert_array_equal(result.cells[name].published, a @ truth)


def test_every_margin_variance_is_at_most_its_own_noise_variance():
    """docs: 'Every margin's variance is at most the variance of its own noised value' (Gauss-Markov: the raw
    value is itself linear unbiased): random product families with duplicated members and extreme variance
    ratios, and a hierarchy family through the dense path."""
    rng = np.random.default_rng(9)
    for _ in range(40):
        axes = int(rng.integers(1, 4))
        shape = tuple(int(s) for s in rng.integers(2, 5, axes))
        subsets = all_margins(axes)[1:]
        kept = [tuple(range(axes))] + [subsets[i] for i in rng.integers(0, len(subsets), int(rng.integers(1, 5)))]
        family = product_family(shape, kept, list(10 ** rng.uniform(-4, 4, len(kept))))
        for member, accuracy in zip(family.members, variance.accuracy(family)):
            assert np.all(accuracy.standard_deviation ** 2 <= member.variance * (1 + 1e-12))
        dense = variance.dense_accuracy(family)
        for closed, exact in zip(variance.accuracy(family), dense):
            np.testing.assert_allclose(closed.standard_deviation, exact.standard_deviation, rtol=1e-8)


def test_large_sums_on_a_fine_grid_add_up_exactly():
    """Sums of ~1e12 on grid 0.01: the published floats (a power-of-two step above 1 here) add up to every margin
    bit for bit, in any order and by fsum, and the half-widths carry the coarser step."""
    keys = {"x": list(range(30)), "y": list(range(20))}
    extra = {"bounds": [0, 10**6], "grid": "1/100"}
    spec = make_spec([aggregate("s_xy", keys, "discrete_gaussian", {"rho": 1}, "sum", **extra),
                      aggregate("s_x", {"x": keys["x"]}, "discrete_gaussian", {"rho": 1}, "sum", **extra),
                      aggregate("s_y", {"y": keys["y"]}, "discrete_gaussian", {"rho": 1}, "sum", **extra),
                      aggregate("s", {}, "discrete_gaussian", {"rho": 1}, "sum", **extra)],
                     {"consistent": [["s_xy", "s_x", "s_y", "s"]]})
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = plan_families(plan)
    rng = np.random.default_rng(10)
    base_units = rng.integers(10**14, 2 * 10**14, 600)  # 1e12 .. 2e12 in grid units of 0.01
    matrices, _ = dense_model(spec, plan, "s_xy", list(planned.family.names))
    noised = {(n, "sum"): (a @ base_units).astype(np.int64) + rng.integers(-10**8, 10**8, a.shape[0])
              for n, a in zip(planned.family.names, matrices)}
    result = make_consistent(plan, planned, noised, ALPHA)
    base = result.cells["s_xy"].published.reshape(30, 20)
    shuffle = np.random.default_rng(11)
    for name, margin in (("s_x", base.sum(axis=1)), ("s_y", base.sum(axis=0)), ("s", [base.sum()])):
        published = result.cells[name].published
        for i, value in enumerate(published.tolist()):
            terms = (base[i] if name == "s_x" else base[:, i] if name == "s_y" else base.ravel()).tolist()
            assert math.fsum(terms) == value == sum(terms) == sum(terms[::-1])
            shuffled = list(terms)
            shuffle.shuffle(shuffled)
            assert sum(shuffled) == value
        np.testing.assert_array_equal(published, margin)
    assert float(np.max(np.abs(base))) > 1e12

