"""Mechanisms end to end (grid, exact noise, publication) against their exact distributions, empirical privacy,
interval coverage, and the floating-point attack.

Each noised vector comes from :func:`dp_operators.vector_release` with ``max_partitions_contributed=1``: every value
is then an independent run of the single-value mechanism, so one call gives many draws.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binom

from dp_operators import vector_release
from dp_operators.mechanisms import (
    discrete_gaussian_pmf,
    discrete_gaussian_upper_tail,
    discrete_laplace_pmf,
    sample_discrete_gaussian_vector,
    sample_discrete_laplace_vector,
)
from dp_operators.release import draw_noise, plan_release, prepare_inputs
from dp_operators.spec import parse_spec
from mechanisms.test_samplers import ACCEPT_P, REJECT_P, chi_square_p_value

DRAWS = 100_000
OFF = Fraction(13, 10)  # negative controls: a scale 30 % off


def noise_of(result, values, grid=Fraction(1)) -> list[int]:
    """The integer noise (grid units) a release added to ``values``, read back from its published values."""
    return [round(Fraction(out) / grid) - round(Fraction(v) / grid) for out, v in zip(result.values, values)]


@pytest.mark.slow
def test_count_with_discrete_laplace_has_exactly_its_distribution():
    values = [5] * DRAWS
    result = vector_release(values, sensitivity=1, epsilon=Fraction(1, 2), mechanism="discrete_laplace",
                            max_partitions_contributed=1)
    assert result.mechanism["scale"] == 2
    noise = noise_of(result, values)
    assert chi_square_p_value(noise, lambda x: discrete_laplace_pmf(x, 2)) > ACCEPT_P
    assert chi_square_p_value(noise, lambda x: discrete_laplace_pmf(x, 2 * OFF)) < REJECT_P


@pytest.mark.slow
def test_count_with_epsilon_delta_discrete_gaussian_has_exactly_its_distribution():
    values = [5] * DRAWS
    result = vector_release(values, sensitivity=1, epsilon=1, delta=1e-6, mechanism="discrete_gaussian",
                            max_partitions_contributed=1)
    sigma2 = Fraction(result.mechanism["sigma2_grid_units_exact"])
    noise = noise_of(result, values)
    assert chi_square_p_value(noise, lambda x: discrete_gaussian_pmf(x, sigma2)) > ACCEPT_P
    assert chi_square_p_value(noise, lambda x: discrete_gaussian_pmf(x, sigma2 * OFF**2)) < REJECT_P


@pytest.mark.slow
def test_real_valued_sum_goes_through_the_grid_with_exact_noise():
    grid = Fraction(1, 20)
    values = [0.33] * DRAWS  # on the grid: floor(0.33 / 0.05 + 1/2) = 7 steps
    result = vector_release(values, sensitivity=0.5, rho=Fraction(1, 100), grid=grid, mechanism="discrete_gaussian",
                            max_partitions_contributed=1)
    sigma2 = Fraction(result.mechanism["sigma2_grid_units_exact"])
    assert sigma2 == Fraction(10**2, 2) * 100  # linf = 0.5 / 0.05 = 10 steps, sigma^2 = 10^2 / (2 rho)
    noise = [round(Fraction(out) / grid) - 7 for out in result.values]
    assert chi_square_p_value(noise, lambda x: discrete_gaussian_pmf(x, sigma2)) > ACCEPT_P
    assert chi_square_p_value(noise, lambda x: discrete_gaussian_pmf(x, sigma2 * OFF**2)) < REJECT_P


@pytest.mark.slow
@pytest.mark.parametrize(
    "mechanism,budget",
    [
        pytest.param("discrete_laplace", {"epsilon": Fraction(1, 10)}, id="discrete Laplace at scale 10^6"),
        pytest.param("discrete_gaussian", {"rho": Fraction(1, 100)}, id="discrete Gaussian at sigma^2 5e11"),
    ],
)
def test_large_scale_sum_has_exactly_its_distribution(mechanism, budget):
    """A sum noised above the samplers' table limits (the block envelope) has the exact law of its scale, and a
    scale 30 % off is rejected by the same test."""
    from mechanisms.test_vectorised_envelope import law_p

    values = [5] * DRAWS
    result = vector_release(values, sensitivity=10**5, mechanism=mechanism, max_partitions_contributed=1, **budget)
    noise = np.array(noise_of(result, values), dtype=np.int64)
    if mechanism == "discrete_laplace":
        kind, param, off = "laplace", Fraction(result.mechanism["scale"]), OFF
        assert param == 10**6
    else:
        kind, param, off = "gaussian", Fraction(result.mechanism["sigma2_grid_units_exact"]), OFF**2
        assert param == Fraction(10**10, 2) * 100
    assert law_p(noise, kind, param) > ACCEPT_P
    assert law_p(noise, kind, param * off) < REJECT_P


def _selection_release_rate(mechanism: str, count: int, keys: int) -> tuple[float, object]:
    spec = parse_spec(f"""
version: 1
release: selection
budget_account: any
privacy_unit: person
aggregates:
  - name: by_city
    kind: count
    group_by: [city]
    partition_selection: {{mechanism: {mechanism}, budget: {{epsilon: 1, delta: 1e-5}}}}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
""")
    plan = plan_release(spec)
    prepared = prepare_inputs(spec, {"by_city": [{"city": f"c{i}", "count": count} for i in range(keys)]})
    _, selected = draw_noise(plan, prepared, [])
    return len(selected["by_city"]) / keys, plan.step("by_city", "selection")


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["discrete_laplace", "discrete_gaussian"])
def test_partition_selection_releases_a_key_with_exactly_its_stated_probability(mechanism):
    _, step = _selection_release_rate(mechanism, count=1, keys=1)
    count = step.threshold - 1  # one below the threshold: released iff noise >= 1
    rate, step = _selection_release_rate(mechanism, count=count, keys=DRAWS)
    if mechanism == "discrete_laplace":
        scale = float(step.scale)
        expected = math.exp(-1 / scale) / (1 + math.exp(-1 / scale))
        wrong = math.exp(-1 / (scale * 1.3)) / (1 + math.exp(-1 / (scale * 1.3)))
    else:
        expected = discrete_gaussian_upper_tail(1, step.scale)
        wrong = discrete_gaussian_upper_tail(1, step.scale * OFF**2)
    released = round(rate * DRAWS)
    assert binom.cdf(released, DRAWS, expected) > ACCEPT_P / 2 and binom.sf(released - 1, DRAWS, expected) > ACCEPT_P / 2
    assert min(binom.cdf(released, DRAWS, wrong), binom.sf(released - 1, DRAWS, wrong)) < REJECT_P


# -- empirical privacy ----------------------------------------------------------------------------------------------
def largest_log_ratio(first: list[int], second: list[int], minimum: int = 1000) -> float:
    """The largest |log P(E | first) / P(E | second)| over histogram events E (single outputs and tails) that both
    samples hit at least ``minimum`` times, minus a 3-standard-error sampling slack."""
    n1, n2 = len(first), len(second)
    c1, c2 = Counter(first), Counter(second)
    support = sorted(set(c1) | set(c2))
    events = [(c1[y], c2[y]) for y in support]
    below1 = np.cumsum([c1[y] for y in support])
    below2 = np.cumsum([c2[y] for y in support])
    events += list(zip(below1.tolist(), below2.tolist())) + list(zip((n1 - below1).tolist(), (n2 - below2).tolist()))
    worst = 0.0
    for a, b in events:
        if min(a, b) < minimum:
            continue
        slack = 3 * (1 / math.sqrt(a) + 1 / math.sqrt(b))
        worst = max(worst, abs(math.log((a / n1) / (b / n2))) - slack)
    return worst


@pytest.mark.slow
def test_counts_zero_and_one_stay_within_e_to_the_epsilon_and_an_under_noised_mechanism_does_not():
    epsilon = 1.0
    zero = vector_release([0] * DRAWS, sensitivity=1, epsilon=epsilon, mechanism="discrete_laplace",
                          max_partitions_contributed=1).values
    one = vector_release([1] * DRAWS, sensitivity=1, epsilon=epsilon, mechanism="discrete_laplace",
                         max_partitions_contributed=1).values
    assert largest_log_ratio(zero, one) <= epsilon
    # the same test catches noise at half the scale (true epsilon 2)
    under_zero = sample_discrete_laplace_vector(Fraction(1, 2), DRAWS)
    under_one = [1 + z for z in sample_discrete_laplace_vector(Fraction(1, 2), DRAWS)]
    assert largest_log_ratio(under_zero, under_one) > epsilon


def largest_delta_excess(first: list[int], second: list[int], epsilon: float) -> float:
    """max over threshold events E of P(E | first) - e^eps P(E | second), minus a 4-standard-error slack."""
    n = len(first)
    grid = np.arange(min(first + second) - 1, max(first + second) + 2)
    f1 = np.searchsorted(np.sort(first), grid, side="right") / n
    f2 = np.searchsorted(np.sort(second), grid, side="right") / n
    worst = -1.0
    for p1, p2 in ((f1, f2), (1 - f1, 1 - f2), (f2, f1), (1 - f2, 1 - f1)):
        slack = 4 * (np.sqrt(p1 * (1 - p1) / n) + math.exp(epsilon) * np.sqrt(p2 * (1 - p2) / n))
        worst = max(worst, float(np.max(p1 - math.exp(epsilon) * p2 - slack)))
    return worst


@pytest.mark.slow
def test_sum_at_both_bounds_stays_within_epsilon_delta_and_an_under_noised_mechanism_does_not():
    epsilon, delta, n = 1.0, 1e-3, 60_000
    low = vector_release([0] * n, sensitivity=10, epsilon=epsilon, delta=delta, mechanism="discrete_gaussian",
                         max_partitions_contributed=1)
    high = vector_release([10] * n, sensitivity=10, epsilon=epsilon, delta=delta, mechanism="discrete_gaussian",
                          max_partitions_contributed=1)
    assert largest_delta_excess(low.values, high.values, epsilon) <= delta
    sigma2 = Fraction(low.mechanism["sigma2_grid_units_exact"])
    under_low = sample_discrete_gaussian_vector(sigma2 / 9, n)
    under_high = [10 + z for z in sample_discrete_gaussian_vector(sigma2 / 9, n)]
    assert largest_delta_excess(under_low, under_high, epsilon) > delta


# -- coverage of the published intervals ----------------------------------------------------------------------------
REPETITIONS = 5_000


@pytest.mark.parametrize(
    ("budget", "mechanism"),
    [
        pytest.param({"epsilon": Fraction(1, 10)}, "discrete_laplace", id="discrete Laplace scale 10"),
        pytest.param({"rho": Fraction(1, 2000)}, "discrete_gaussian", id="discrete Gaussian rho"),
        pytest.param({"epsilon": Fraction(1, 5), "delta": 1e-6}, "discrete_gaussian", id="discrete Gaussian eps-delta"),
    ],
)
def test_stated_95_percent_intervals_cover_the_true_value_95_percent_of_the_time(budget, mechanism):
    truth = [1234] * REPETITIONS
    result = vector_release(truth, sensitivity=1, mechanism=mechanism, max_partitions_contributed=1, **budget)
    covered = sum(abs(v - t) <= result.half_width for v, t in zip(result.values, truth)) / REPETITIONS
    assert 0.93 <= covered <= 0.97


def test_mean_intervals_cover_the_true_clipped_mean_at_least_95_percent_of_the_time():
    """Mean intervals (Fieller, exact for the integer noise laws) cover the true mean at their 95 % level, within four
    standard errors of 5,000 draws; the same draws against 0.7 of each half-width fall short (the negative control)."""
    keys = list(range(REPETITIONS))
    spec = parse_spec(f"""
version: 1
release: means
budget_account: any
privacy_unit: person
aggregates:
  - name: mean_hours
    kind: mean
    group_by: [k]
    keys: {{k: {keys}}}
    bounds: [0, 10]
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
""")
    from dp_operators.release import publish_aggregate

    plan = plan_release(spec)
    rows = [{"k": k, "sum": 700, "count": 100} for k in keys]  # true clipped mean 7
    prepared = prepare_inputs(spec, {"mean_hours": rows})
    noised, _ = draw_noise(plan, prepared, [])
    published = publish_aggregate(spec, spec.aggregates[0], plan, noised, prepared.keys["mean_hours"])
    covered = sum(abs(r["value"] - 7) <= r["half_width"] for r in published["rows"]) / REPETITIONS
    narrow = sum(abs(r["value"] - 7) <= 0.7 * r["half_width"] for r in published["rows"]) / REPETITIONS
    floor = 0.95 - 4 * math.sqrt(0.95 * 0.05 / REPETITIONS)  # 0.9377: exact intervals sit at 0.95, not above it
    assert covered >= floor
    assert narrow < floor


# -- the floating-point attack (Mironov 2012) -----------------------------------------------------------------------
def on_grid(value: float, grid: Fraction) -> bool:
    return float(round(Fraction(value) / grid) * grid) == value


@pytest.mark.parametrize("grid", [Fraction(1, 10), Fraction(1, 1024), Fraction(3, 7)])
def test_outputs_for_inputs_zero_and_one_lie_on_the_same_grid(grid):
    results = [
        vector_release([x] * 2000, sensitivity=1, epsilon=1, delta=1e-6, grid=grid, max_partitions_contributed=1)
        for x in (0.0, 1.0)
    ]
    for result in results:
        assert all(on_grid(v, grid) for v in result.values)
    # the sets of reachable outputs coincide: every output of one input is a possible output of the other
    assert {v for v in results[0].values} & {v for v in results[1].values}


def test_textbook_float_laplace_fails_the_same_grid_check():
    rng = np.random.default_rng()
    outputs = (1.0 + rng.laplace(0, 1, 2000)).tolist()
    assert not all(on_grid(v, Fraction(1, 1024)) for v in outputs)
