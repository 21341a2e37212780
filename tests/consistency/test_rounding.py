"""Non-negativity and controlled rounding (dp_operators.consistency.rounding): the non-negative least-squares fit
against its optimality conditions, a library reference (scipy's lsq_linear) and a dense solve; the controlled
rounding against its definition, brute force, Cox's two-way guarantee, an infeasible three-way instance, and UCI
Adult."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import lsq_linear

from dp_operators.consistency import wls
from dp_operators.consistency.rounding import controlled_rounding, nonnegative_fit
from dp_operators.consistency.structure import Family, Member

from .family_models import all_margins, hierarchy_family, noised, product_family


ADULT_NAMES = ["education_sex", "education", "sex", "total"]

FAMILIES = {
    "3x2 table, rows, columns, total": lambda: product_family((3, 2), all_margins(2), [1.0, 4.0, 2.5, 9.0]),
    "16x2 like Adult education x sex": lambda: product_family((16, 2), all_margins(2), [4.0, 2.0, 8.0, 1.0],
                                                              names=ADULT_NAMES),
    "4x3x2 cube with every margin": lambda: product_family((4, 3, 2), all_margins(3),
                                                           [1.0, 2.0, 0.5, 3.0, 1.5, 4.0, 0.7, 2.5]),
    "age > age band hierarchy x sex": lambda: hierarchy_family([1.0, 2.0, 3.0, 0.5, 4.0, 1.5]),
    "base noisy, total nearly exact": lambda: product_family((5, 4), all_margins(2), [100.0, 10.0, 10.0, 0.01]),
}
TWO_WAY = [name for name in FAMILIES if "cube" not in name]


def design(family: Family) -> tuple[np.ndarray, np.ndarray]:
    """The dense stacked design (rows: member cells; columns: base cells) and the per-row weights 1 / variance."""
    blocks, weights = [], []
    for member in family.members:
        block = np.zeros((member.cells, family.base_cells))
        block[member.to_base, np.arange(family.base_cells)] = 1.0
        blocks.append(block)
        weights.append(np.full(member.cells, 1.0 / member.variance))
    return np.vstack(blocks), np.concatenate(weights)


def gradient(family: Family, observations, x: np.ndarray) -> np.ndarray:
    """Gradient of sum_m ||A_m x - y_m||^2 / (2 variance_m), computed densely (1 / value units)."""
    a, w = design(family)
    return a.T @ (w * (a @ x - np.concatenate(observations)))


def dense_wls(family: Family, observations) -> np.ndarray:
    a, w = design(family)
    return np.linalg.solve(a.T @ (w[:, None] * a), a.T @ (w * np.concatenate(observations)))


def kkt_violation(family: Family, observations, x: np.ndarray) -> float:
    """Largest violation of the optimality conditions of min f(x) over x >= 0, relative to the gradient's scale:
    the gradient must be >= 0 where x = 0 and 0 where x > 0."""
    g = gradient(family, observations, x)
    scale = max(1.0, float(np.abs(gradient(family, observations, np.zeros_like(x))).max()))
    at_zero = x == 0
    return max(float(np.max(-g[at_zero], initial=0.0)), float(np.max(np.abs(g[~at_zero]), initial=0.0))) / scale


def sparse_truth(family: Family, rng: np.random.Generator) -> np.ndarray:
    """Counts with many zeros and small cells, so that noised estimates go negative."""
    truth = rng.poisson(1.0, family.base_cells).astype(float)
    truth[rng.random(family.base_cells) < 0.4] = 0.0
    return truth


# ---------------------------------------------------------------------------------------------- nonnegative_fit


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in FAMILIES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nonnegative_fit_is_the_constrained_optimum(name, seed):
    family = FAMILIES[name]()
    rng = np.random.default_rng(seed)
    observations = noised(family, sparse_truth(family, rng), rng)
    plain = dense_wls(family, observations)
    assert plain.min() < 0, "negative control: the unconstrained estimate must have negative cells here"
    clipped = np.maximum(plain, 0.0)
    assert kkt_violation(family, observations, clipped) > 1e-3, "negative control: clipping is not the optimum"

    x = nonnegative_fit(family, observations, start=plain)

    assert x.dtype == np.float64 and x.shape == (family.base_cells,)
    assert np.all(x >= 0) and np.any(x == 0)
    assert kkt_violation(family, observations, x) < 1e-8
    a, w = design(family)
    sd = np.sqrt(w)
    # scipy's bounded-variable least squares (Stark & Parker 1995), an exact active-set method on the dense design
    reference = lsq_linear(sd[:, None] * a, sd * np.concatenate(observations), bounds=(0, np.inf), method="bvls")
    np.testing.assert_allclose(x, reference.x, atol=1e-6)


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in FAMILIES])
def test_nonnegative_fit_equals_the_least_squares_fit_when_that_is_nonnegative(name):
    family = FAMILIES[name]()
    rng = np.random.default_rng(7)
    truth = rng.integers(200, 400, family.base_cells).astype(float)
    observations = noised(family, truth, rng)
    plain = dense_wls(family, observations)
    assert plain.min() > 0

    np.testing.assert_allclose(nonnegative_fit(family, observations), plain, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(wls.fit(family, observations), plain, rtol=1e-9, atol=1e-9)


def test_nonnegative_fit_does_not_depend_on_the_start():
    family = FAMILIES["4x3x2 cube with every margin"]()
    rng = np.random.default_rng(3)
    observations = noised(family, sparse_truth(family, rng), rng)
    cold = nonnegative_fit(family, observations)
    for start in (wls.fit(family, observations), np.zeros(family.base_cells), rng.normal(5.0, 5.0, family.base_cells)):
        np.testing.assert_allclose(nonnegative_fit(family, observations, start=start), cold, atol=1e-7)


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param(lambda obs: obs[:-1], "observation vectors", id="one member missing"),
        pytest.param(lambda obs: [obs[0][:-1], *obs[1:]], "shape", id="wrong shape"),
        pytest.param(lambda obs: [np.where(np.arange(obs[0].size) == 0, np.nan, obs[0]), *obs[1:]], "finite",
                     id="NaN"),
    ],
)
def test_nonnegative_fit_rejects_malformed_observations(change, message):
    family = FAMILIES["3x2 table, rows, columns, total"]()
    observations = noised(family, np.ones(family.base_cells), np.random.default_rng(0))
    with pytest.raises(ValueError, match=message):
        nonnegative_fit(family, change(observations))
    with pytest.raises(ValueError, match="start"):
        nonnegative_fit(family, observations, start=np.zeros(family.base_cells + 1))


# ------------------------------------------------------------------------------------------ controlled_rounding


def assert_controlled(family: Family, base: np.ndarray, rounded: np.ndarray, kept) -> None:
    """Every rounded cell is floor or ceil of its real value, and every cell of every kept member is floor or ceil
    of its real sum (an integer within 1 of it, exactly it when it is an integer)."""
    assert rounded.dtype == np.int64 and rounded.shape == base.shape
    assert np.all((rounded == np.floor(base)) | (rounded == np.ceil(base)))
    assert kept[0] == family.base.name and set(kept) <= set(family.names)
    for member in family.members:
        published = np.bincount(member.to_base, weights=rounded, minlength=member.cells)
        real = family.margin(member, base)
        # margins recomputed from the integer base are integers and all add up to the same total
        assert np.all(published == np.rint(published)) and published.sum() == rounded.sum()
        if member.name in kept:
            assert np.all(np.abs(published - real) < 1.0), member.name


def satisfies(family: Family, base: np.ndarray, rounded: np.ndarray, member: Member) -> bool:
    published = np.bincount(member.to_base, weights=rounded, minlength=member.cells)
    return bool(np.all(np.abs(published - family.margin(member, base)) < 1.0))


def brute_force(family: Family, base: np.ndarray) -> list[tuple[float, np.ndarray]]:
    """Every controlled rounding of a small base (all members kept) with its distance sum |rounded - base|."""
    fractional = np.flatnonzero(base != np.floor(base))
    found = []
    for ups in itertools.product([0, 1], repeat=fractional.size):
        rounded = np.floor(base)
        rounded[fractional] += ups
        if all(satisfies(family, base, rounded, m) for m in family.members):
            found.append((float(np.abs(rounded - base).sum()), rounded))
    return found


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in TWO_WAY])
def test_two_way_tables_keep_every_margin(name):
    """Cox (1987): a two-way table with both margins and its total always has a controlled rounding."""
    family = FAMILIES[name]()
    rng = np.random.default_rng(11)
    for _ in range(60):
        base = rng.gamma(0.6, 20.0, family.base_cells)
        base[rng.random(family.base_cells) < 0.2] = 0.0
        rounded, kept = controlled_rounding(family, base)
        assert kept == family.names
        assert_controlled(family, base, rounded, kept)


def test_halves_in_a_two_way_table():
    """All fractions one half: every row, column and the total of an even table must be hit exactly."""
    family = FAMILIES["16x2 like Adult education x sex"]()
    base = np.arange(32) + 0.5
    rounded, kept = controlled_rounding(family, base)
    assert kept == family.names
    assert_controlled(family, base, rounded, kept)
    assert rounded.sum() == base.sum()
    assert np.array_equal(controlled_rounding(family, base)[0], rounded), "not deterministic"


@pytest.mark.parametrize(
    "name, shape, kept",
    [
        pytest.param("3x2 with every margin", (3, 2), all_margins(2), id="3x2 with every margin"),
        pytest.param("2x2x2 with every margin", (2, 2, 2), all_margins(3), id="2x2x2 with every margin"),
    ],
)
def test_rounding_is_the_closest_controlled_rounding(name, shape, kept):
    family = product_family(shape, kept)
    rng = np.random.default_rng(5)
    for _ in range(15):
        base = rng.gamma(1.0, 3.0, family.base_cells)
        rounded, kept_names = controlled_rounding(family, base)
        candidates = brute_force(family, base)
        assert candidates, "every instance drawn here has a controlled rounding"
        assert kept_names == family.names
        assert np.abs(rounded - base).sum() == pytest.approx(min(d for d, _ in candidates), abs=1e-9)


def test_integers_stay_and_nonnegative_stays_nonnegative():
    family = FAMILIES["4x3x2 cube with every margin"]()
    rng = np.random.default_rng(9)
    base = rng.gamma(0.3, 2.0, family.base_cells)
    integral = rng.random(family.base_cells) < 0.5
    base[integral] = np.floor(base[integral])
    rounded, kept = controlled_rounding(family, base)
    assert np.array_equal(rounded[integral], base[integral])
    assert rounded.min() >= 0
    assert_controlled(family, base, rounded, kept)

    whole = np.floor(base)
    rounded, kept = controlled_rounding(family, whole)
    assert np.array_equal(rounded, whole) and kept == family.names


def test_three_way_random_tables():
    family = FAMILIES["4x3x2 cube with every margin"]()
    rng = np.random.default_rng(21)
    for _ in range(40):
        base = rng.gamma(0.8, 3.0, family.base_cells)
        rounded, kept = controlled_rounding(family, base)
        assert {family.base.name, "total"} <= set(kept)
        assert_controlled(family, base, rounded, kept)
        assert np.array_equal(controlled_rounding(family, base)[0], rounded), "not deterministic"


def test_infeasible_three_way_table_falls_back():
    """Four half cells of a 4x3x2 cube: c0 = 1 pairs cells b, c; c1 = 0 pairs a, b and c1 = 1 pairs c, d; c2 = 0
    pairs b, d and c2 = 1 pairs a, c. Each pair sums to exactly 1, so exactly one of each pair rounds up: b + c = 1,
    b + d = 1 and c + d = 1, an odd cycle with no 0-1 solution. The one-way margins cannot all be kept."""
    family = FAMILIES["4x3x2 cube with every margin"]()
    base = np.full((4, 3, 2), 3.0)
    for cell in [(0, 0, 1), (1, 0, 0), (1, 1, 1), (2, 1, 0)]:
        base[cell] += 0.5
    base = base.ravel()
    assert brute_force(family, base) == [], "no controlled rounding keeps every member"
    one_way = [family.members[family.names.index(name)] for name in ("c0", "c1", "c2")]
    every_rounding = brute_force(product_family((4, 3, 2), [(0, 1, 2)]), base)  # the base alone: all 16
    assert len(every_rounding) == 16
    assert not any(all(satisfies(family, base, r, m) for m in one_way) for _, r in every_rounding), (
        "the one-way margins alone are already infeasible")

    rounded, kept = controlled_rounding(family, base)

    assert_controlled(family, base, rounded, kept)
    # the members are dropped largest first (the two-way margins, then c0): c1, c2 and the total survive, and the
    # two-way margins hold anyway (each of their cells holds at most one fractional base cell)
    assert kept == tuple(name for name in family.names if name != "c0")
    assert not satisfies(family, base, rounded, family.members[family.names.index("c0")])
    assert np.array_equal(controlled_rounding(family, base)[0], rounded), "not deterministic"


@pytest.mark.parametrize(
    "kept_axes, names",
    [
        pytest.param([(0, 1), ()], ["base", "total"], id="base and total only"),
        pytest.param([(0, 1)], ["base"], id="base only"),
    ],
)
def test_families_without_margins_use_largest_remainder(kept_axes, names):
    family = product_family((4, 3), kept_axes, names=names)
    base = np.random.default_rng(4).gamma(1.0, 2.0, 12)
    rounded, kept = controlled_rounding(family, base)
    assert kept == family.names
    assert_controlled(family, base, rounded, kept)
    assert abs(rounded.sum() - base.sum()) < 1.0
    total_only = product_family((4, 3), [(0, 1), ()])
    best = min(d for d, _ in brute_force(total_only, base))
    assert np.abs(rounded - base).sum() == pytest.approx(best, abs=1e-9)


def test_rounding_rejects_malformed_bases():
    family = FAMILIES["3x2 table, rows, columns, total"]()
    with pytest.raises(ValueError, match="shape"):
        controlled_rounding(family, np.zeros(7))
    with pytest.raises(ValueError, match="finite"):
        controlled_rounding(family, np.array([0.5, np.inf, 1, 2, 3, 4]))


def test_two_way_table_of_100000_cells_keeps_every_margin():
    family = product_family((500, 200), all_margins(2))
    base = np.random.default_rng(2).gamma(0.5, 4.0, family.base_cells)
    rounded, kept = controlled_rounding(family, base)
    assert kept == family.names
    assert_controlled(family, base, rounded, kept)


# ---------------------------------------------------------------------------------------------------- UCI Adult


def test_adult_education_by_sex_is_nonnegative_integer_and_adds_up(adult_csv):
    """Counts by education x sex, education, sex and total of UCI Adult with Gaussian noise (sd 30: the small cells,
    Preschool x Female = 24, often go negative): least squares, then non-negativity, then controlled rounding."""
    data = pd.read_csv(adult_csv, usecols=["education", "sex"])
    table = pd.crosstab(data["education"], data["sex"])
    assert table.shape == (16, 2)
    truth = table.to_numpy(dtype=float).ravel()
    family = product_family((16, 2), all_margins(2), [900.0] * 4, names=ADULT_NAMES)
    rng = np.random.default_rng(2024)
    negative_observed = negative_fitted = 0
    for _ in range(100):
        observations = noised(family, truth, rng)
        plain = wls.fit(family, observations)
        negative_observed += int(observations[0].min() < 0)
        negative_fitted += int(plain.min() < 0)
        fitted = nonnegative_fit(family, observations, start=plain)
        rounded, kept = controlled_rounding(family, fitted)
        assert rounded.min() >= 0 and kept == family.names
        assert_controlled(family, fitted, rounded, kept)
        published = [np.bincount(m.to_base, weights=rounded, minlength=m.cells) for m in family.members]
        education, sex, total = published[1], published[2], published[3]
        assert education.sum() == sex.sum() == total[0] == rounded.sum()
    assert negative_observed > 0 and negative_fitted > 0, "negative control: the inputs had negative cells"


def test_two_way_controlled_rounding_keeps_every_margin():
    """docs: 'For two-way tables with their margins such a rounding always exists and is found at once': random
    tables (duplicated margins, fractions 1/3 and 1/2, remainders within 1e-7 of an integer) keep every member."""
    rng = np.random.default_rng(13)
    for _ in range(120):
        shape = (int(rng.integers(2, 12)), int(rng.integers(2, 12)))
        kept = all_margins(2) + ([(0,), ()] if rng.random() < 0.3 else [])
        family = product_family(shape, kept, [1.0] * len(kept))
        fractions = rng.choice([[0, 1 / 3, 2 / 3, 0.5], [0, 1e-7, 1 - 1e-7, 0.5], [0.1, 0.3, 0.7, 0.9]][
            int(rng.integers(0, 3))], family.base_cells)
        base = rng.integers(0, 5, family.base_cells) + fractions
        rounded, kept_names = controlled_rounding(family, base)
        assert kept_names == family.names
        assert np.all(np.abs(rounded - base) < 1)



def test_controlled_rounding_of_a_large_two_way_table_does_not_depend_on_the_time_limit(monkeypatch):
    """ADR 0027: 'Both are deterministic (the integer program is bounded by a node limit, not by time)'. The
    totally unimodular program of a large two-way table is solved without a time limit (with the 120 s safety
    limit, a 1000x1000 table took 85 s for its one program, so a slower worker would drop the margins' guarantee
    and publish other values): on a 200x200 table with the limit lowered to 0.05 s the guarantee holds and the
    published base is the same."""
    from dp_operators.consistency import rounding

    family = product_family((200, 200), all_margins(2), [1.0] * 4)
    base = np.random.default_rng(14).uniform(0, 5, family.base_cells)
    reference, kept_reference = rounding.controlled_rounding(family, base)
    assert kept_reference == family.names  # control: with the full limit every margin keeps its guarantee
    monkeypatch.setattr(rounding, "MILP_TIME_LIMIT", 0.05)
    rounded, kept = rounding.controlled_rounding(family, base)
    assert kept == family.names and np.array_equal(rounded, reference), kept
