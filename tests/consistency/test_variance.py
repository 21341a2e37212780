"""Accuracy of the least-squares values (dp_operators.consistency.variance): closed forms against dense linear
algebra, bias bounds against the fitted linear map, variances against simulated releases, interval coverage."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chi2, norm

from dp_operators.consistency import variance, wls
from dp_operators.consistency.structure import Family, Member, member_to_base
from dp_operators.mechanisms.accuracy import discrete_gaussian_variance, discrete_laplace_variance
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array, sample_discrete_laplace_array

from .family_models import FAMILIES, all_margins, hierarchy_family, linear_map, product_family

RELEASES = 4000
ALPHA = 0.05
COVERAGE_TOLERANCE = 0.015
#: The highest coverage accepted at 95 %: the continuity correction (half a lattice step) is conservative, and
#: over-coverage up to 97.5 % is accepted; beyond it the intervals would be needlessly wide.
MAX_COVERAGE = 0.975

PRODUCT_FAMILIES = {name: build for name, build in FAMILIES.items() if build().product}


def with_biases(family: Family, biases) -> Family:
    return Family(tuple(Member(m.name, m.cells, m.to_base, m.variance, m.mechanism, b, m.kept_axes)
                        for m, b in zip(family.members, biases)), family.base_shape, family.grid)


def stacked(arrays) -> np.ndarray:
    return np.concatenate(list(arrays))


@pytest.mark.parametrize("build", [pytest.param(b, id=name) for name, b in PRODUCT_FAMILIES.items()])
def test_closed_form_equals_dense_computation_on_product_families(build):
    family = build()
    family = with_biases(family, [0.5 * (m % 3) for m in range(len(family.members))])  # some zero, some not
    closed, dense = variance.closed_form_accuracy(family), variance.dense_accuracy(family)
    assert [a.exact for a in closed] == [True] * len(family.members)
    for member, c, d in zip(family.members, closed, dense):
        assert c.standard_deviation.shape == c.bias.shape == (member.cells,)
        np.testing.assert_allclose(c.standard_deviation, d.standard_deviation, rtol=1e-12)
        np.testing.assert_allclose(c.bias, d.bias, rtol=1e-12)
        np.testing.assert_allclose(c.lattice, d.lattice, rtol=1e-12)
    assert any(np.all(c.bias > 0) for c in closed)
    # accuracy() takes the closed form for a product family
    for a, c in zip(variance.accuracy(family), closed):
        np.testing.assert_array_equal(a.standard_deviation, c.standard_deviation)


@pytest.mark.parametrize("build", [pytest.param(b, id=name) for name, b in FAMILIES.items()])
def test_variances_and_bias_bounds_match_the_fitted_linear_map(build):
    # var = sum_i variance_i P_ji^2, bias = sum_i bias_i |P_ji| and lattice = max_i |P_ji|, with P read off the fit
    family = build()
    family = with_biases(family, [0.1 + 0.2 * m for m in range(len(family.members))])
    p = linear_map(family)
    variances = stacked(np.full(m.cells, m.variance) for m in family.members)
    biases = stacked(np.full(m.cells, m.bias) for m in family.members)
    accuracies = variance.accuracy(family)
    np.testing.assert_allclose(stacked(a.standard_deviation for a in accuracies) ** 2, p ** 2 @ variances,
                               rtol=1e-9)
    bound = stacked(a.bias for a in accuracies)
    np.testing.assert_allclose(bound, np.abs(p) @ biases, rtol=1e-9)
    np.testing.assert_allclose(stacked(a.lattice for a in accuracies), np.abs(p).max(axis=1), rtol=1e-9)
    # the bound is attained: deterministic errors of the worst signs move each value by exactly the bound
    for row in range(len(bound)):
        worst = np.sign(p[row]) * biases
        assert p[row] @ worst == pytest.approx(bound[row], rel=1e-9)


def test_zero_biases_give_zero_bounds():
    for build in FAMILIES.values():
        assert all(np.all(a.bias == 0) for a in variance.accuracy(build()))


def variance_accepted(errors: np.ndarray, predicted: np.ndarray, p_value: float) -> np.ndarray:
    """Per column: is the mean square of errors (true mean 0, Gaussian) within the two-sided chi-square(releases)
    acceptance region at level p_value for the predicted variance?"""
    releases = errors.shape[0]
    statistic = np.sum(errors ** 2, axis=0) / predicted
    return (chi2.ppf(p_value / 2, releases) <= statistic) & (statistic <= chi2.isf(p_value / 2, releases))


def consistent_map(family: Family) -> np.ndarray:
    """P, the published values (wls.consistent_values, stacked members) as a linear function of the stacked noised
    observations, read off the package column by column from unit observations. consistent_values is linear up to
    its exact-sum rounding (a step of at most 2^-40 value units here), far below the noise."""
    columns = []
    for m, member in enumerate(family.members):
        for cell in range(member.cells):
            unit = [np.zeros(other.cells) for other in family.members]
            unit[m][cell] = 1.0
            columns.append(stacked(wls.consistent_values(family, unit)))
    return np.array(columns).T


#: Releases of simulate() also published one by one through wls.consistent_values, checking the linear map.
DIRECT_RELEASES = 20


def simulate(family: Family, truth: np.ndarray, draw, releases: int = RELEASES) -> np.ndarray:
    """Errors of every published value (stacked members) over simulated releases, shape (releases, cells).

    ``draw(family, truth, releases)`` gives the noise of every member over all releases, a list of arrays of shape
    (releases, member.cells). The errors of the published values are the consistent map applied to the noise (one
    matrix product for all releases: consistent observations are published unchanged, and the map is linear); the
    first DIRECT_RELEASES releases are also published through wls.consistent_values and must agree."""
    exact = stacked(family.margin(m, truth) for m in family.members)
    noise = np.concatenate(draw(family, truth, releases), axis=1)
    errors = noise @ consistent_map(family).T
    starts = np.cumsum([0] + [m.cells for m in family.members])
    for r in range(DIRECT_RELEASES):
        observed = [family.margin(m, truth) + noise[r, a:b] for m, a, b in zip(family.members, starts, starts[1:])]
        np.testing.assert_allclose(stacked(wls.consistent_values(family, observed)) - exact, errors[r],
                                   rtol=0, atol=1e-8 * (1 + np.abs(exact).max()))
    return errors


def gaussian_noise(rng: np.random.Generator):
    """Every member's Gaussian noise of its variance over all releases (the law of family_models.noised)."""
    return lambda family, truth, releases: [rng.normal(0.0, math.sqrt(m.variance), (releases, m.cells))
                                            for m in family.members]


def test_simulated_releases_have_the_predicted_variances_and_not_the_raw_ones():
    family = product_family((3, 2), all_margins(2), [1.0, 4.0, 4.0, 9.0])
    rng = np.random.default_rng(11)
    truth = np.array([120.0, 80.0, 35.0, 41.0, 7.0, 0.0])
    errors = simulate(family, truth, gaussian_noise(rng))
    predicted = stacked(a.standard_deviation for a in variance.accuracy(family)) ** 2
    raw = stacked(np.full(m.cells, m.variance) for m in family.members)
    p_value = 1e-3 / len(predicted)  # Bonferroni over the cells
    assert np.all(variance_accepted(errors, predicted, p_value))
    margins = slice(family.base_cells, None)
    assert np.all(predicted[margins] < raw[margins])
    # negative control: the raw noise variance is rejected for every margin cell
    assert not np.any(variance_accepted(errors, raw, p_value)[margins])


def test_hierarchy_family_dense_variances_match_simulated_releases():
    family = hierarchy_family([1.0, 2.0, 3.0, 0.5, 4.0, 1.5])
    assert not family.product
    rng = np.random.default_rng(12)
    truth = rng.integers(0, 300, family.base_cells).astype(float)
    errors = simulate(family, truth, gaussian_noise(rng))
    accuracies = variance.accuracy(family)
    assert all(a.exact for a in accuracies)
    predicted = stacked(a.standard_deviation for a in accuracies) ** 2
    p_value = 1e-3 / len(predicted)
    assert np.all(variance_accepted(errors, predicted, p_value))
    assert not np.any(variance_accepted(errors, predicted * 1.3, p_value))  # negative control: 30 % off
    # the raw variance bound of the fallback is valid here
    assert np.all(predicted <= stacked(np.full(m.cells, m.variance) for m in family.members))


def seeded_words(rng: np.random.Generator):
    return lambda n: rng.bit_generator.random_raw(n).astype(np.uint64)


def exact_noise(sampler, parameter, size: int, rng: np.random.Generator) -> np.ndarray:
    """The project's exact sampler fed seeded words; its magnitude |X| with a seeded fair sign has X's law (the
    samplers draw the sign independently, from the OS)."""
    magnitude = np.abs(sampler(parameter, size, _words=seeded_words(rng)))
    return np.where(rng.integers(0, 2, size).astype(bool), -magnitude, magnitude)


def discrete_releases(rng: np.random.Generator, parameters):
    """Every member's exact noise over all releases, one sampler call per member."""
    def draw(family: Family, truth: np.ndarray, releases: int) -> list[np.ndarray]:
        out = []
        for member, parameter in zip(family.members, parameters):
            sampler = (sample_discrete_laplace_array if member.mechanism == "discrete_laplace"
                       else sample_discrete_gaussian_array)
            out.append(exact_noise(sampler, parameter, releases * member.cells, rng).reshape(releases, member.cells)
                       .astype(np.float64))
        return out
    return draw


COVERAGE_CASES = {
    "discrete Gaussian, sigma2 9, 16, 16, 36": ("discrete_gaussian", [Fraction(9), Fraction(16), Fraction(16),
                                                                        Fraction(36)]),
    "discrete Laplace, scale 5": ("discrete_laplace", [Fraction(5)] * 4),
}


@pytest.mark.parametrize("mechanism, parameters", [pytest.param(*case, id=name)
                                                   for name, case in COVERAGE_CASES.items()])
def test_intervals_cover_the_truth_at_their_level(mechanism, parameters):
    law_variance = discrete_laplace_variance if mechanism == "discrete_laplace" else discrete_gaussian_variance
    family = product_family((3, 2), all_margins(2), [law_variance(p) for p in parameters], mechanism)
    rng = np.random.default_rng(13)
    truth = np.array([120.0, 80.0, 35.0, 41.0, 7.0, 0.0])
    errors = simulate(family, truth, discrete_releases(rng, parameters))
    widths = stacked(variance.half_widths(family, variance.accuracy(family), ALPHA))
    covered = np.mean(np.abs(errors) <= widths, axis=0)
    halved = np.mean(np.abs(errors) <= widths / 2, axis=0)
    if mechanism == "discrete_gaussian":
        # the continuity correction over-covers a little (95.2 .. 96.7 % here): at least nominal minus the
        # binomial tolerance, at most MAX_COVERAGE, every cell
        assert np.all(covered >= 1 - ALPHA - COVERAGE_TOLERANCE), covered
        assert np.all(covered <= MAX_COVERAGE), covered
    else:
        # the Laplace quantile is the heaviest-tailed case, so least-squares mixtures over-cover a little: the
        # family-wide rate is checked two-sided, every cell on the side that matters
        assert 1 - ALPHA - COVERAGE_TOLERANCE <= np.mean(covered) <= MAX_COVERAGE, covered
        assert np.all(covered >= 1 - ALPHA - COVERAGE_TOLERANCE), covered
    # negative control: intervals of half the width fall well short
    assert np.all(halved < 1 - ALPHA - COVERAGE_TOLERANCE), halved


def test_quantile_factors():
    assert variance.quantile_factor(["discrete_gaussian"] * 3, 0.05) == pytest.approx(1.959963984540054, rel=1e-12)
    laplace = math.log(20) / math.sqrt(2)
    assert variance.quantile_factor(["discrete_gaussian", "discrete_laplace"], 0.05) == pytest.approx(laplace)
    assert variance.quantile_factor(iter(["discrete_laplace"]), 0.05) == pytest.approx(2.1183026, rel=1e-7)
    # for a wide alpha the normal quantile is the larger one
    assert variance.quantile_factor(["discrete_laplace"], 0.5) == pytest.approx(0.6744897501960817)
    assert variance.quantile_factor(["discrete_gaussian"], 1e-20) == pytest.approx(norm.isf(5e-21), rel=1e-9)


@pytest.mark.parametrize(
    "mechanisms, alpha",
    [pytest.param([], 0.05, id="no mechanism"), pytest.param(["laplace"], 0.05, id="unknown mechanism"),
     pytest.param(["discrete_gaussian"], 0.0, id="alpha 0"), pytest.param(["discrete_gaussian"], 1.0, id="alpha 1"),
     pytest.param(["discrete_gaussian"], float("nan"), id="alpha NaN")],
)
def test_quantile_factor_refuses_bad_arguments(mechanisms, alpha):
    with pytest.raises(ValueError):
        variance.quantile_factor(mechanisms, alpha)


def test_half_widths_are_rounded_up():
    """q * sd + lattice * grid / 2 + bias (the continuity correction: MemberAccuracy.lattice), moved up one float."""
    family = with_biases(FAMILIES["age > age band hierarchy x sex"](), [0.25] * 6)
    family = Family(family.members, family.base_shape, grid=0.5)
    accuracies = variance.accuracy(family)
    q = variance.quantile_factor(["discrete_gaussian"], ALPHA)
    for accuracy, widths in zip(accuracies, variance.half_widths(family, accuracies, ALPHA)):
        assert np.all((accuracy.lattice > 0) & (accuracy.lattice <= 1))
        exact = q * accuracy.standard_deviation + accuracy.lattice * 0.5 / 2 + accuracy.bias
        assert np.all(widths > exact)
        np.testing.assert_array_equal(widths, np.nextafter(exact, np.inf))
    with pytest.raises(ValueError, match="accuracies"):
        variance.half_widths(family, accuracies[:-1], ALPHA)


def large_hierarchy_family(bias: float = 0.0) -> Family:
    """Ages 0..99 (decades above them) x 50 regions: 5000 base cells, above DENSE_BASE_CELLS."""
    keys = {"age": [str(a) for a in range(100)], "region": [f"r{r}" for r in range(50)],
            "decade": [f"{d}0s" for d in range(10)]}
    parents = {"decade": ("age", {str(a): f"{a // 10}0s" for a in range(100)})}
    members = []
    for m, columns in enumerate([["age", "region"], ["decade", "region"], ["decade"], []]):
        to_base, kept = member_to_base(["age", "region"], keys, columns, keys, parents)
        members.append(Member("_".join(columns) or "total", math.prod(len(keys[c]) for c in columns), to_base,
                              4.0 * (m + 1), "discrete_gaussian", bias, kept))
    return Family(tuple(members), (100, 50))


def test_large_hierarchy_family_falls_back_to_the_raw_noise_bound():
    family = large_hierarchy_family()
    assert family.base_cells > variance.DENSE_BASE_CELLS and not family.product
    for member, accuracy in zip(family.members, variance.accuracy(family)):
        assert not accuracy.exact
        np.testing.assert_array_equal(accuracy.standard_deviation, np.full(member.cells, math.sqrt(member.variance)))
        np.testing.assert_array_equal(accuracy.bias, np.zeros(member.cells))
    with pytest.raises(ValueError, match="cannot be bounded"):
        variance.accuracy(large_hierarchy_family(bias=0.5))


def test_closed_form_refuses_a_hierarchy_family():
    with pytest.raises(ValueError, match="hierarchy"):
        variance.closed_form_accuracy(FAMILIES["age > age band hierarchy x sex"]())


def test_closed_form_is_instant_on_a_hundred_thousand_cells():
    family = product_family((100, 100, 10), all_margins(3), [4.0, 2.0, 2.0, 8.0, 1.0, 3.0, 0.5, 16.0],
                          biases=[0.5] * 8)
    accuracies = variance.accuracy(family)
    assert [a.standard_deviation.shape for a in accuracies] == [(m.cells,) for m in family.members]
    sd = [float(a.standard_deviation[0]) for a in accuracies]
    assert all(s < math.sqrt(m.variance) for s, m in zip(sd, family.members))
    # the total of an all-margins family: its own observation (variance 16) and sums of every margin
    assert sd[-1] ** 2 < 16
