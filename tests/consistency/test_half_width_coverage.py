"""Coverage of the published half-widths of consistent families (Monte Carlo with the project's exact samplers fed
seeded words, each with a negative control), the Laplace quantile rule, and the documented limitations: the
Laplace factor widening a precise Gaussian member's interval, and ``nonnegative`` biasing sparse tables
(docs/consistency.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dp_operators.consistency import variance
from dp_operators.release import plan_release
from dp_operators.release.consistent import make_consistent, plan_families

from .family_models import (
    ALPHA,
    COVERAGE_CASES,
    PASSING_COVERAGE_CASES,
    aggregate,
    assert_coverage,
    make_spec,
    nonnegative_simulation,
    simulated_coverage,
    standard_error,
)


@pytest.mark.parametrize("base, margins", [pytest.param(*case, id=name) for name, case in COVERAGE_CASES.items()])
def test_half_widths_cover_at_small_scales_with_the_continuity_correction(base, margins):
    """When one member dominates, its least-squares value is essentially its own lattice noise: the published
    half-width q * sd + L * grid / 2 (docs/consistency.md; L the largest weight of one noised value) reaches the
    lattice point the exact quantile includes, and every member covers at the nominal rate (within 4 standard
    errors)."""
    per_member, releases = simulated_coverage(tuple(base[:1]) + (tuple(base[1].items()),),
                                              tuple(margins[:1]) + (tuple(margins[1].items()),))
    assert_coverage(per_member, releases)


@pytest.mark.parametrize("base, margins", [pytest.param(*case, id=name) for name, case in COVERAGE_CASES.items()])
def test_without_the_continuity_correction_small_scale_values_under_cover(base, margins):
    """The control of the test above: q * sd alone (q normal, or the
    continuous-Laplace quantile) misses the lattice points just beyond it. Observed (5000 releases):
    Gaussian sigma2 1 base 88.0 %, row margins 92.7 %, total 93.5 %; Laplace scale 1 base 92.8 %; Laplace scale 2
    base 93.8 %; Laplace scale 1/2 row margin (a sum of two lattice noises) 92.3 %; mixed family row margin 92.9 %."""
    per_member, releases = simulated_coverage(tuple(base[:1]) + (tuple(base[1].items()),),
                                              tuple(margins[:1]) + (tuple(margins[1].items()),))
    low = {name: round(plain, 4) for name, (_, _, plain) in per_member.items()
           if plain < 1 - ALPHA - 4 * standard_error(name, releases)}
    assert low, {name: values[2] for name, values in per_member.items()}


@pytest.mark.parametrize("base, margins",
                         [pytest.param(*case, id=name) for name, case in PASSING_COVERAGE_CASES.items()])
def test_half_widths_cover_where_the_lattice_is_fine_or_the_quantile_is_generous(base, margins):
    """Where no member dominates at a small scale, every member covers at the nominal rate (within 4 standard
    errors)."""
    per_member, releases = simulated_coverage(tuple(base[:1]) + (tuple(base[1].items()),),
                                              tuple(margins[:1]) + (tuple(margins[1].items()),))
    assert_coverage(per_member, releases)


def test_the_laplace_quantile_rule_holds_for_continuous_combinations():
    """The documented rule max(z, ln(1/alpha)/sqrt 2) bounds the tail of any unit-variance combination of
    independent (continuous) Laplace and Gaussian noises (random weights, including a single Laplace and sums of
    equal Laplaces): the claim is right for continuous laws; the failure above is the lattice."""
    rng = np.random.default_rng(12)
    n = 400_000
    laplaces = rng.laplace(0, 1 / math.sqrt(2), (3, n))
    gaussian = rng.normal(0, 1, n)
    for alpha in (0.01, 0.05, 0.2):
        q = variance.quantile_factor(["discrete_laplace"], alpha)
        se = math.sqrt(alpha * (1 - alpha) / n)
        weights = [np.array([1, 0, 0, 0.0]), np.array([1, 1, 0, 0]) / math.sqrt(2), np.ones(4) / 2]
        weights += [np.sqrt(rng.dirichlet(np.ones(4))) for _ in range(10)]
        for w in weights:
            combined = w[:3] @ laplaces + w[3] * gaussian
            assert np.mean(np.abs(combined) > q) <= alpha + 4 * se, (alpha, w)
        if alpha <= 0.05:  # negative control (where the Laplace quantile is the larger): 10 % narrower fails
            assert np.mean(np.abs(laplaces[0]) > 0.9 * q) > alpha + 4 * se


def test_a_precise_gaussian_member_of_a_mixed_family_keeps_its_sd_but_takes_the_laplace_factor():
    """Documented limitation (docs/consistency.md, "Half-widths after post-processing"): in a family mixing Laplace
    and Gaussian members every value uses the Laplace quantile factor (2.118 at 95 %). A Gaussian total measured far
    more precisely than the Laplace cells keeps almost its raw variance, so its half-width comes out wider than
    released alone (the exact discrete Gaussian quantile), while its standard deviation never exceeds the raw one
    (Gauss-Markov). The imprecise Laplace cells gain, as the docs promise."""
    spec = make_spec([aggregate("n_by_x", {"x": [0, 1, 2]}, "discrete_laplace", {"epsilon": "0.01"}),
                      aggregate("n", {}, "discrete_gaussian", {"rho": "0.02"})], {"consistent": True})
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = plan_families(plan)
    noised = {("n_by_x", "count"): np.array([100, 200, 300]), ("n", "count"): np.array([600])}
    cells = make_consistent(plan, planned, noised, ALPHA).cells
    laplace_factor = math.log(1 / ALPHA) / math.sqrt(2)
    assert variance.quantile_factor(["discrete_laplace", "discrete_gaussian"], ALPHA) == pytest.approx(laplace_factor)
    for member, accuracy in zip(planned.family.members, planned.accuracies):
        step = plan.step(member.name, "count")
        assert np.all(accuracy.standard_deviation <= step.standard_deviation * (1 + 1e-12)), member.name  # the sd claim
        np.testing.assert_allclose(cells[member.name].half_width,  # every member, the Gaussian too: the Laplace factor
                                   laplace_factor * accuracy.standard_deviation + accuracy.lattice / 2, rtol=1e-12)
    raw = plan.step("n", "count").half_width(ALPHA)
    assert cells["n"].half_width[0] > raw  # the documented widening (about 11.09 against 10)
    assert np.all(cells["n_by_x"].half_width < plan.step("n_by_x", "count").half_width(ALPHA))  # the cells gain



def test_nonnegative_zero_cells_over_cover():
    """docs: a zero cell is published >= 0 and its interval centred too high; it still holds 0 (over-covers)."""
    coverage, truth, _ = nonnegative_simulation()
    assert coverage["nonnegative"]["xy"][truth == 0].mean() >= 1 - ALPHA


def test_nonnegative_biases_the_total_and_large_cells_of_a_sparse_table_where_least_squares_covers():
    """Documented limitation (docs/consistency.md, "Non-negativity and integers"): in a sparse table the
    non-negative fit lifts the ~855 zero cells a little each, and the total and the large cells pay for it: the
    total's interval covered 76 % of releases (70 % with another seed; 95 % nominal), the non-zero cells
    (20..59, four standard deviations and more) 88 % on average. TopDown's known bias of sparse tables (Abowd et
    al. 2022). Control: least squares alone, on the same noised values, covers them at the nominal rate."""
    coverage, truth, releases = nonnegative_simulation()
    se = math.sqrt(ALPHA * (1 - ALPHA) / releases)
    nonzero = truth > 0
    cell_se = se / math.sqrt(int(nonzero.sum()))
    biased, unbiased = coverage["nonnegative"], coverage["least squares"]
    assert biased["t"][0] < 1 - ALPHA - 4 * se, biased["t"][0]  # the total under-covers
    assert biased["xy"][nonzero].mean() < 1 - ALPHA - 4 * cell_se, biased["xy"][nonzero].mean()  # large cells too
    assert unbiased["t"][0] >= 1 - ALPHA - 4 * se, unbiased["t"][0]
    assert unbiased["xy"][nonzero].mean() >= 1 - ALPHA - 4 * cell_se, unbiased["xy"][nonzero].mean()

