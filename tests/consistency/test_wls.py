"""Least-squares consistency (dp_operators.consistency.wls): the fit against a dense generalised least-squares
reference, exactly adding margins, use of noised values only, and a 10^5-cell family."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dp_operators.consistency import wls
from dp_operators.consistency.structure import Family

from .family_models import FAMILIES, all_margins, hierarchy_family, noised, product_family


def dense_gls(family: Family, observations) -> np.ndarray:
    """The weighted least-squares solution of the stacked system, by numpy's dense least squares."""
    design = np.vstack([np.eye(m.cells)[m.to_base].T / math.sqrt(m.variance) for m in family.members])
    target = np.concatenate([np.asarray(y, float) / math.sqrt(m.variance)
                             for m, y in zip(family.members, observations)])
    return np.linalg.lstsq(design, target, rcond=None)[0]


@pytest.mark.parametrize("build", [pytest.param(b, id=name) for name, b in FAMILIES.items()])
def test_fit_equals_dense_generalised_least_squares(build):
    family = build()
    rng = np.random.default_rng(1)
    for _ in range(5):
        truth = rng.integers(0, 1000, family.base_cells).astype(float)
        observations = noised(family, truth, rng)
        reference = dense_gls(family, observations)
        np.testing.assert_allclose(wls.fit(family, observations), reference, rtol=1e-9,
                                   atol=1e-9 * np.max(np.abs(reference)))


def test_fit_accepts_integer_observations_and_leaves_them_untouched():
    family = FAMILIES["4x3x2 cube with every margin"]()
    rng = np.random.default_rng(2)
    observations = [np.rint(y).astype(np.int64) for y in noised(family, rng.integers(0, 50, 24).astype(float), rng)]
    copies = [y.copy() for y in observations]
    np.testing.assert_allclose(wls.fit(family, observations), dense_gls(family, observations), rtol=1e-9)
    assert all(np.array_equal(a, b) for a, b in zip(observations, copies))


def test_fit_of_consistent_noiseless_values_returns_them():
    # unbiasedness on the constraint set: exact margins are reproduced
    family = FAMILIES["age > age band hierarchy x sex"]()
    truth = np.arange(12.0) * 7 - 20
    fitted = wls.fit(family, [family.margin(m, truth) for m in family.members])
    np.testing.assert_allclose(fitted, truth, rtol=0, atol=1e-10)


def sums_in_every_order(values: np.ndarray, rng: np.random.Generator) -> set[float]:
    return {sum(values.tolist()), sum(reversed(values.tolist())), math.fsum(values), float(np.sum(values)),
            sum(rng.permutation(values).tolist()), float(np.sum(rng.permutation(values)))}


def finer_coarser_pairs(family: Family):
    """(fine, coarse, fine cell -> coarse cell) for every pair where each fine cell lies inside one coarse cell."""
    for fine, coarse in itertools.permutations(family.members, 2):
        parent = np.full(fine.cells, -1)
        parent[fine.to_base] = coarse.to_base
        if np.array_equal(parent[fine.to_base], coarse.to_base):
            yield fine, coarse, parent


@pytest.mark.parametrize("build", [pytest.param(b, id=name) for name, b in FAMILIES.items()])
def test_exact_sums_make_every_margin_add_up_exactly_in_any_order(build):
    family = build()
    rng = np.random.default_rng(3)
    for _ in range(20):
        base = rng.uniform(-1, 1, family.base_cells) * 10.0 ** rng.uniform(-3, 15, family.base_cells)
        rounded, step = wls.exact_sums(family, base)
        assert math.frexp(step)[0] == 0.5  # a power of two
        assert np.all(np.abs(rounded - base) <= step / 2)
        assert np.all(np.mod(rounded, step) == 0)
        published = [family.margin(m, rounded) for m in family.members]
        for member, values in zip(family.members, published):
            for cell in range(member.cells):
                assert sums_in_every_order(rounded[member.to_base == cell], rng) == {values[cell]}
        for fine, coarse, parent in finer_coarser_pairs(family):
            fine_values, coarse_values = published[family.members.index(fine)], published[family.members.index(coarse)]
            for cell in range(coarse.cells):
                assert sums_in_every_order(fine_values[parent == cell], rng) == {coarse_values[cell]}


def test_without_exact_sums_the_order_of_summation_changes_margins():
    # negative control of the test above: the same check on unrounded values must find a disagreement
    family = FAMILIES["4x3x2 cube with every margin"]()
    rng = np.random.default_rng(3)
    disagreements = 0
    for _ in range(20):
        base = rng.uniform(-1, 1, family.base_cells) * 10.0 ** rng.uniform(-3, 15, family.base_cells)
        disagreements += len(sums_in_every_order(base, rng)) > 1
    assert disagreements > 0


def test_exact_sums_step_is_the_finest_allowed():
    family = FAMILIES["3x2 table, rows, columns, total"]()
    counts = np.array([10.2, 3.0, 0.0, 7.7, 1.1, 2.5])  # sum |x| + cells < 2^12: the cap 2^-40 applies
    assert wls.exact_sums(family, counts)[1] == 2.0 ** -40
    for total in (2.0 ** 30, 3.0e15, 1.0e20):
        base = np.full(6, total / 6)
        _, step = wls.exact_sums(family, base)
        k = -math.log2(step)
        bound = math.fsum(np.abs(base)) + 6
        assert bound * 2.0 ** k < 2.0 ** 52 <= bound * 2.0 ** (k + 1)
    assert wls.exact_sums(family, np.full(6, 1.0e20))[1] > 1  # k negative: a step above one


def test_consistent_values_are_the_margins_of_the_rounded_fit():
    family = FAMILIES["age > age band hierarchy x sex"]()
    rng = np.random.default_rng(4)
    observations = noised(family, rng.integers(0, 100, 12).astype(float), rng)
    values = wls.consistent_values(family, observations)
    rounded, step = wls.exact_sums(family, wls.fit(family, observations))
    assert step == 2.0 ** -40
    np.testing.assert_array_equal(values[0], rounded)
    for member, published in zip(family.members, values):
        assert published.dtype == np.float64 and published.shape == (member.cells,)
        np.testing.assert_array_equal(published, np.bincount(member.to_base, weights=rounded,
                                                             minlength=member.cells))
        assert not np.array_equal(published, observations[family.members.index(member)])


def test_the_estimate_depends_on_the_noised_values_only():
    # two true tables, released with noise that happens to give the same noised values: identical outputs. A fit
    # reading anything but the noised values and the public structure could not give the same answer for both.
    rng = np.random.default_rng(5)
    family_a = FAMILIES["4x3x2 cube with every margin"]()
    family_b = FAMILIES["4x3x2 cube with every margin"]()
    truth_a = rng.integers(0, 100, 24).astype(float)
    truth_b = rng.integers(1000, 5000, 24).astype(float)
    observations = [np.rint(y) for y in noised(family_a, truth_a, rng)]  # integer noise, as the samplers draw
    noise_b = [y - family_b.margin(m, truth_b) for m, y in zip(family_b.members, observations)]
    observations_b = [family_b.margin(m, truth_b) + e for m, e in zip(family_b.members, noise_b)]
    assert all(np.array_equal(a, b) for a, b in zip(observations, observations_b))
    np.testing.assert_array_equal(wls.fit(family_a, observations), wls.fit(family_b, observations_b))
    for a, b in zip(wls.consistent_values(family_a, observations), wls.consistent_values(family_b, observations_b)):
        np.testing.assert_array_equal(a, b)
    # and the estimate is close to the table that was (most plausibly) released, far from the other
    estimate = wls.fit(family_a, observations)
    assert np.max(np.abs(estimate - truth_a)) < 10 < np.min(np.abs(estimate - truth_b))


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param(lambda obs: obs[:-1], "observation arrays", id="one array missing"),
        pytest.param(lambda obs: [obs[0][:-1], *obs[1:]], "shape", id="a short array"),
        pytest.param(lambda obs: [obs[0], obs[1] * np.nan, *obs[2:]], "non-finite", id="NaN"),
    ],
)
def test_fit_refuses_bad_observations(change, message):
    family = FAMILIES["3x2 table, rows, columns, total"]()
    observations = [np.ones(m.cells) for m in family.members]
    with pytest.raises(ValueError, match=message):
        wls.fit(family, change(observations))


def test_fit_refuses_a_non_positive_variance():
    """A member of variance 0 (the row margin ``c0``) is refused with a ValueError naming it."""
    family = product_family((3, 2), all_margins(2), [1.0, 0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"members \['c0'\]"):
        wls.fit(family, [np.ones(m.cells) for m in family.members])


def test_fit_raises_when_conjugate_gradients_stop_early(monkeypatch):
    real_cg = wls.cg
    monkeypatch.setattr(wls, "cg", lambda *args, **kwargs: real_cg(*args, **{**kwargs, "maxiter": 1}))
    family = FAMILIES["4x3x2 cube with every margin"]()
    rng = np.random.default_rng(6)
    with pytest.raises(RuntimeError, match="did not converge"):
        wls.fit(family, noised(family, rng.integers(0, 100, 24).astype(float), rng))


def product_reference(family: Family, observations) -> np.ndarray:
    """The least-squares solution of a product family by its eigen-decomposition: x = sum_T Pi_T b / lambda_T,
    Pi_T centring along the axes in T and averaging along the others (independent of wls's iterative solver)."""
    shape = family.base_shape
    rhs = np.zeros(family.base_cells)
    for member, y in zip(family.members, observations):
        rhs += y[member.to_base] / member.variance
    rhs = rhs.reshape(shape)
    solution = np.zeros(shape)
    for t in itertools.product([False, True], repeat=len(shape)):
        eigenvalue = sum(m.variance ** -1 * math.prod(n for c, n in enumerate(shape) if c not in m.kept_axes)
                         for m in family.members if all(c in m.kept_axes for c in range(len(shape)) if t[c]))
        part = rhs
        for axis, centred in enumerate(t):
            mean = part.mean(axis=axis, keepdims=True)
            part = part - mean if centred else np.broadcast_to(mean, part.shape)
        solution += part / eigenvalue
    return solution.ravel()


def test_a_hundred_thousand_cell_table_with_all_margins_is_solved():
    family = product_family((100, 100, 10), all_margins(3), [4.0, 2.0, 2.0, 8.0, 1.0, 3.0, 0.5, 16.0])
    assert family.base_cells == 100_000 and family.product
    rng = np.random.default_rng(7)
    observations = noised(family, rng.integers(0, 500, family.base_cells).astype(float), rng)
    fitted = wls.fit(family, observations)
    reference = product_reference(family, observations)
    np.testing.assert_allclose(fitted, reference, rtol=0, atol=1e-9 * np.max(np.abs(reference)))
    values = wls.consistent_values(family, observations)
    total = values[-1][0]
    for member, published in zip(family.members, values):
        assert math.fsum(published) == float(np.sum(published[::-1])) == total


@pytest.mark.parametrize("shape", [pytest.param((5, 4, 3, 2), id="4 axes"),
                                   pytest.param((3, 2, 2, 2, 2, 2), id="6 axes")])
def test_cg_converges_in_a_few_iterations_far_below_its_cap(shape):
    """Documented (ADR 0027, wls module docstring): for plain margins N has at most 2^axes distinct eigenvalues, so
    CG would converge in that many steps in exact arithmetic; in binary64 it takes a few more (measured: 21 > 16 on
    4 axes, up to 149 > 64 on 6 axes, with every margin and variances spread over 1e-3..1e3), far below
    MAX_ITERATIONS. Checked: every fit converges (normal-equation residual, and numpy's dense GLS), within
    4 * 2^axes iterations and a twentieth of the cap."""
    import scipy.sparse.linalg as sparse_linalg

    iterations = []

    def counting_cg(*args, **kwargs):
        count = [0]
        result = sparse_linalg.cg(*args, callback=lambda _: count.__setitem__(0, count[0] + 1), **kwargs)
        iterations.append(count[0])
        return result

    rng = np.random.default_rng(3)
    kept = all_margins(len(shape))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wls, "cg", counting_cg)
        for _ in range(3):
            family = product_family(shape, kept, list(10 ** rng.uniform(-3, 3, len(kept))))
            truth = rng.integers(0, 100, family.base_cells).astype(float)
            observations = [family.margin(m, truth) + rng.normal(0, math.sqrt(m.variance), m.cells)
                            for m in family.members]
            estimate = wls.fit(family, observations)
            weights = [1 / m.variance for m in family.members]
            rhs = sum(w * y[m.to_base] for m, w, y in zip(family.members, weights, observations))
            normal = sum(w * family.margin(m, estimate)[m.to_base] for m, w in zip(family.members, weights))
            assert np.linalg.norm(rhs - normal) <= 1e-9 * np.linalg.norm(rhs)
            np.testing.assert_allclose(estimate, dense_gls(family, observations), rtol=1e-7, atol=1e-7)
    assert len(iterations) == 3
    assert max(iterations) <= min(4 * 2 ** len(shape), wls.MAX_ITERATIONS // 20), iterations

