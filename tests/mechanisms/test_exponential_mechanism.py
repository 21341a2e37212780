"""The exponential mechanism for quantiles (dp_operators.mechanisms.exponential): the rank distances, their bounded
range, the refusals by type, the rigour of the integer bounds, and the exact law of the sampler (chi-square against
the float64 reference law, with a negative control at a wrong gamma that must be rejected)."""

from __future__ import annotations

import inspect
import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy.stats import chisquare

from dp_operators.mechanisms import exponential as em
from dp_operators.mechanisms.exponential import (
    bounded_range_width,
    exponential_mechanism_probabilities,
    quantile_rank_distances,
    rank_error_bound,
    sample_exponential_mechanism,
    sample_exponential_mechanism_vector,
    sample_quantile_bin,
    start_precision,
)

# A correct sampler fails with probability 1e-4 per test; the negative controls give p-values far below 1e-6.
ACCEPT_P = 1e-4
REJECT_P = 1e-6
WRONG_GAMMA = Fraction(13, 10)
DRAWS = 20_000
#: a 20-bin histogram whose median law spreads over about ten bins at gamma 1/10 per half record
HISTOGRAM = [3, 0, 7, 2, 9, 1, 0, 4, 6, 2, 8, 3, 1, 0, 5, 2, 7, 4, 1, 3]
GAMMA = Fraction(1, 10)


def chi_square_p_value(draws: list[int], probabilities: np.ndarray) -> float:
    """Chi-square goodness of fit of category draws 0..m-1 to ``probabilities``; the categories expected fewer than
    5 times are pooled into one cell (with the smallest other cell, if the pool is still expected fewer than 5)."""
    n = len(draws)
    observed = np.bincount(np.asarray(draws, dtype=np.int64), minlength=len(probabilities)).astype(float)
    expected = n * probabilities / math.fsum(probabilities)
    small = expected < 5
    if small.any() and expected[small].sum() < 5 and (~small).sum() > 1:
        small[np.flatnonzero(~small)[np.argmin(expected[~small])]] = True
    obs = np.append(observed[~small], observed[small].sum()) if small.any() else observed
    exp = np.append(expected[~small], expected[small].sum()) if small.any() else expected
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


class TestQuantileRankDistances:
    @pytest.mark.parametrize(
        "counts,quantile,expected",
        [
            pytest.param([2, 3, 5], Fraction(1, 2), [6, 0, 0], id="median on the boundary of bins 1 and 2"),
            pytest.param([2, 3, 5], Fraction(1, 10), [0, 10, 40], id="0.1 quantile in the first bin"),
            pytest.param([2, 3, 5], Fraction(9, 10), [70, 40, 0], id="0.9 quantile in the last bin"),
            pytest.param([1, 0, 100, 0, 1], Fraction(1, 2), [100, 100, 0, 100, 100],
                         id="heavy bin holds the median; empty bins beside it at its edges' distance"),
            pytest.param([0, 0, 0], Fraction(1, 3), [0, 0, 0], id="all-zero histogram"),
            pytest.param([4], Fraction(1, 2), [0], id="one bin"),
            pytest.param([1, 1, 1, 1], Fraction(2, 4), [2, 0, 0, 2], id="quantile reduced: 2/4 is 1/2"),
        ],
    )
    def test_hand_worked_histograms(self, counts, quantile, expected):
        """The distances are b times the rank distance from qN to each bin's rank interval."""
        assert quantile_rank_distances(counts, quantile) == expected

    def test_the_bin_holding_the_quantile_is_at_distance_zero(self):
        """Some bin is at distance 0 on every histogram, and a bin is at 0 exactly when qN lies in its interval."""
        for counts in itertools.product(range(4), repeat=4):
            for q in (Fraction(1, 2), Fraction(1, 10), Fraction(2, 7)):
                d = quantile_rank_distances(list(counts), q)
                target = q * sum(counts)
                lt = [sum(counts[:i]) for i in range(4)]
                assert min(d) == 0
                assert [x == 0 for x in d] == [lt[i] <= target <= lt[i] + counts[i] for i in range(4)]

    def test_numpy_counts_give_python_ints(self):
        """An int64 or uint64 array is read as the list of its Python ints."""
        for dtype in (np.int64, np.uint64, np.int32):
            d = quantile_rank_distances(np.array([2, 3, 5], dtype=dtype), Fraction(1, 10))
            assert d == [0, 10, 40] and all(type(x) is int for x in d)

    def test_huge_counts_are_exact(self):
        """Counts beyond 2^64 are summed exactly."""
        big = 10**30
        assert quantile_rank_distances([big, 1, big], Fraction(1, 3)) == [0, big - 1, 3 * big + 3 - (2 * big + 1)]


class TestBoundedRange:
    @pytest.mark.parametrize(
        "quantile,width",
        [(Fraction(1, 2), 2), (Fraction(1, 10), 18), (Fraction(9, 10), 18), (Fraction(2, 7), 10), (0.25, 6)],
    )
    def test_width_is_twice_the_larger_of_a_and_b_minus_a(self, quantile, width):
        """W = 2 max(a, b - a) for q = a/b in lowest terms (a float is read as the decimal it spells)."""
        assert bounded_range_width(quantile) == width

    @pytest.mark.parametrize("quantile", [Fraction(1, 2), Fraction(1, 10), Fraction(9, 10), Fraction(2, 7)])
    def test_every_neighbour_moves_the_scores_within_the_width(self, quantile):
        """On every histogram of up to 4 bins with counts up to 3, adding or removing one record in any bin moves
        each score by at most max(a, b-a), the scores' changes span at most W, and some neighbour spans W exactly."""
        width = bounded_range_width(quantile)
        reached = False
        for m in range(1, 5):
            for counts in itertools.product(range(4), repeat=m):
                u = [-x for x in quantile_rank_distances(list(counts), quantile)]
                for j, change in itertools.product(range(m), (1, -1)):
                    if counts[j] + change < 0:
                        continue
                    neighbour = list(counts)
                    neighbour[j] += change
                    du = [-x - y for x, y in zip(quantile_rank_distances(neighbour, quantile), u)]
                    assert max(abs(x) for x in du) <= width // 2
                    assert max(du) - min(du) <= width
                    reached |= max(du) - min(du) == width
        assert reached


class TestRefusals:
    @pytest.mark.parametrize(
        "counts,error",
        [
            pytest.param([1.0, 2], TypeError, id="a float count, though integral"),
            pytest.param([True, 2], TypeError, id="a bool count"),
            pytest.param(np.array([1.0, 2.0]), TypeError, id="a float array"),
            pytest.param(np.array([True, False]), TypeError, id="a bool array"),
            pytest.param([np.bool_(True)], TypeError, id="a numpy bool"),
            pytest.param("12", TypeError, id="text"),
            pytest.param({1, 2}, TypeError, id="a set (no order)"),
            pytest.param([1, -1], ValueError, id="a negative count"),
            pytest.param(np.array([3, -2]), ValueError, id="a negative count in an array"),
            pytest.param([], ValueError, id="no bins"),
            pytest.param(np.array([[1, 2]]), ValueError, id="a two-dimensional array"),
        ],
    )
    def test_counts_are_read_by_type(self, counts, error):
        """Counts that are not non-negative ints are refused, by type before any value is looked at."""
        with pytest.raises(error):
            quantile_rank_distances(counts, Fraction(1, 2))

    def test_a_negative_count_is_not_echoed(self):
        """The refusal of a negative count does not carry the private value into the message."""
        with pytest.raises(ValueError) as raised:
            quantile_rank_distances([5, -12345], Fraction(1, 2))
        assert "12345" not in str(raised.value)

    @pytest.mark.parametrize("quantile", [Fraction(0), Fraction(1), Fraction(3, 2), Fraction(-1, 2), 0, 1])
    def test_quantile_outside_the_open_unit_interval_is_refused(self, quantile):
        """The quantile must lie strictly between 0 and 1."""
        with pytest.raises(ValueError, match="quantile"):
            quantile_rank_distances([1, 2], quantile)
        with pytest.raises(ValueError, match="quantile"):
            bounded_range_width(quantile)

    @pytest.mark.parametrize(
        "distances,gamma,error",
        [
            pytest.param([0, 1.5], GAMMA, TypeError, id="a float distance"),
            pytest.param([0, -1], GAMMA, ValueError, id="a negative distance"),
            pytest.param([], GAMMA, ValueError, id="no candidates"),
            pytest.param([0, 1], Fraction(0), ValueError, id="gamma zero"),
            pytest.param([0, 1], Fraction(-1, 2), ValueError, id="gamma negative"),
            pytest.param([0, 1], "1/2", TypeError, id="gamma as text"),
            pytest.param([0, 1], float("nan"), ValueError, id="gamma NaN"),
        ],
    )
    def test_sampler_refuses_bad_inputs(self, distances, gamma, error):
        """The sampler reads distances by type and gamma as a positive exact rational."""
        with pytest.raises(error):
            sample_exponential_mechanism(distances, gamma)

    @pytest.mark.parametrize("records", [0, -1, True, 1.0])
    def test_records_per_unit_must_be_a_positive_int(self, records):
        """records_per_unit is a positive int (bools and floats refused)."""
        with pytest.raises((TypeError, ValueError), match="records_per_unit"):
            sample_quantile_bin([1, 2], Fraction(1, 2), Fraction(1), records)

    def test_size_must_be_a_non_negative_int(self):
        """The vector sampler refuses a negative or non-int size, and gives an empty list for size 0."""
        with pytest.raises(ValueError, match="size"):
            sample_exponential_mechanism_vector([0, 1], GAMMA, -1)
        with pytest.raises(ValueError, match="size"):
            sample_exponential_mechanism_vector([0, 1], GAMMA, 2.0)
        assert sample_exponential_mechanism_vector([0, 1], GAMMA, 0) == []


class TestIntegerBounds:
    @pytest.mark.parametrize("p", [8, 64, 137, 300])
    @pytest.mark.parametrize("gamma", [Fraction(1, 10), Fraction(7, 3), Fraction(1, 10**9), Fraction(10**6)])
    def test_weight_bounds_hold_the_exact_weight(self, gamma, p):
        """L_j <= 2^p exp(-gamma d_j) <= U_j with U_j - L_j <= 2, checked at 400 digits, across the cap."""
        shifted = [0, 1, 2, 5, 17, 100, 10**4, 10**9, 10**18]
        lower, upper = em._weight_bounds(shifted, gamma, p)
        with mpmath.workdps(400):
            for d, lo, hi in zip(shifted, lower, upper):
                exact = mpmath.ldexp(mpmath.exp(-mpmath.mpf(gamma.numerator) * d / gamma.denominator), p)
                assert lo <= exact <= hi
                assert 0 <= hi - lo <= 2
        assert lower[0] == upper[0] == 1 << p  # the smallest distance has weight exactly 1

    def test_boundary_bounds_hold_the_exact_boundaries(self):
        """B_lo[k] <= 2^p S_k / Z <= B_hi[k], and the bounds are within 2m + 1 units (the docstring's claim)."""
        shifted = quantile_rank_distances(HISTOGRAM, Fraction(1, 2))
        m = len(shifted)
        for p in (8, 64, start_precision(m)):
            b_lo, b_hi = em._boundary_bounds(shifted, GAMMA, p)
            with mpmath.workdps(200):
                weights = [mpmath.exp(-mpmath.mpf(d) / 10) for d in shifted]
                z = mpmath.fsum(weights)
                for k in range(m):
                    exact = mpmath.ldexp(mpmath.fsum(weights[: k + 1]) / z, p)
                    assert b_lo[k] <= exact <= b_hi[k]
                    assert b_hi[k] - b_lo[k] <= 2 * m + 1
            assert b_lo == sorted(b_lo) and b_lo[-1] == b_hi[-1] == 1 << p

    def test_undecided_mass_at_the_start_precision_is_below_two_m_squared_units(self):
        """The p-bit prefixes of V left undecided number at most 2 m^2 (probability 2 m^2 2^-p < 2^-127)."""
        for distances in (quantile_rank_distances(HISTOGRAM, Fraction(1, 2)), list(range(64)), [0] * 50):
            m = len(distances)
            p = start_precision(m)
            b_lo, b_hi = em._boundary_bounds(distances, GAMMA, p)
            undecided = sum(hi - lo for lo, hi in zip(b_lo[:-1], b_hi[:-1]))
            assert undecided <= 2 * m * m
            assert 2 * m * m * 2**127 <= 2**p


class TestSampler:
    def test_a_single_candidate_is_returned(self):
        """With one candidate the index is 0, at any precision."""
        assert sample_exponential_mechanism([12345], GAMMA) == 0
        assert sample_exponential_mechanism_vector([10**18], GAMMA, 50, _precision=1) == [0] * 50

    def test_a_candidate_at_distance_10_to_the_18_is_never_chosen(self):
        """exp(-10^17) is far below 2^-1000: the far candidate is never drawn, at the default or a tiny precision."""
        distances = [0, 10**18, 0, 3]
        for precision in (None, 8):
            draws = sample_exponential_mechanism_vector(distances, GAMMA, 2_000, _precision=precision)
            assert 1 not in draws and {0, 2, 3} <= set(draws)

    def test_huge_equal_distances_are_shifted(self):
        """Only differences of distances matter: candidates at 10^18 and 10^18 + 1 have the law of 0 and 1."""
        draws = sample_exponential_mechanism_vector([10**18, 10**18 + 1], Fraction(1), 4_000)
        assert chi_square_p_value(draws, exponential_mechanism_probabilities([0, 1], Fraction(1))) > ACCEPT_P

    def test_equal_distances_are_uniform(self):
        """Equal distances give every candidate the same probability."""
        draws = sample_exponential_mechanism_vector([7] * 10, GAMMA, 10_000)
        assert chi_square_p_value(draws, np.full(10, 0.1)) > ACCEPT_P

    def test_the_index_is_the_inverse_cdf_of_the_uniform_bits(self, monkeypatch):
        """With V's bits forced, the index is min{k : V < S_k / Z}: V = 0 gives 0, V = 1/2 on four equal weights
        gives 2 (V equals the boundary S_1 / Z and the interval is half-open), V just below 1 gives the last."""
        for first_byte, expected in ((0x00, 0), (0x80, 2), (0x3F, 0), (0x40, 1), (0xFF, 3)):
            fill = 0xFF if first_byte == 0xFF else 0x00
            monkeypatch.setattr(em.os, "urandom", lambda n, b=first_byte, f=fill: bytes([b]) + bytes([f]) * (n - 1))
            assert sample_exponential_mechanism([5, 5, 5, 5], GAMMA) == expected

    def test_work_at_the_start_precision_is_the_same_for_every_input_of_a_length(self, monkeypatch):
        """The same rounded products per candidate and one exp(-gamma) bound, whatever the distances (equal, spread,
        huge, an empty histogram's zeros): the count of operations depends on m and gamma only."""
        calls = {"down": 0, "up": 0, "exp": 0}
        down, up, exp_bounds = em._product_down, em._product_up, em.exp_neg_bounds

        def counted(name, f):
            def wrapper(*args):
                calls[name] += 1
                return f(*args)
            return wrapper

        monkeypatch.setattr(em, "_product_down", counted("down", down))
        monkeypatch.setattr(em, "_product_up", counted("up", up))
        monkeypatch.setattr(em, "exp_neg_bounds", counted("exp", exp_bounds))
        seen = set()
        for distances in ([0] * 12, list(range(12)), [0] + [10**18] * 11, [5, 10**9] * 6, [1] + [0] * 11):
            calls.update(down=0, up=0, exp=0)
            sample_exponential_mechanism(distances, GAMMA)
            seen.add(tuple(calls.values()))
        assert len(seen) == 1
        (down_count, up_count, exp_count), = seen
        assert exp_count == 1 and down_count == up_count and down_count % 12 == 0 and down_count > 0

    @pytest.mark.parametrize("histogram,neighbour", [
        ([0] * 16, [1] + [0] * 15),
        ([0, 5, 0, 2, 9, 0, 0, 1, 40, 0, 0, 0, 3, 0, 0, 7], [0, 5, 0, 2, 9, 0, 0, 1, 40, 0, 0, 0, 3, 0, 0, 8]),
        ([0, 5, 0, 2, 9, 0, 0, 1, 40, 0, 0, 0, 3, 0, 0, 7], [1, 5, 0, 2, 9, 0, 0, 1, 40, 0, 0, 0, 3, 0, 0, 7]),
    ])
    def test_neighbouring_histograms_cost_the_same_products(self, monkeypatch, histogram, neighbour):
        """Counted, never timed: the big-integer products of a draw are the same for a histogram and a neighbour
        (a square-and-multiply over each distance's bits would not be: an empty histogram would cost none)."""
        count = {"products": 0}
        down, up = em._product_down, em._product_up

        def counting(f):
            def wrapper(*args):
                count["products"] += 1
                return f(*args)
            return wrapper

        monkeypatch.setattr(em, "_product_down", counting(down))
        monkeypatch.setattr(em, "_product_up", counting(up))

        def work(counts):
            count["products"] = 0
            sample_quantile_bin(counts, Fraction(1, 2), Fraction(1, 10), 1)
            return count["products"]

        assert work(histogram) == work(neighbour) > 0

    def test_randomness_comes_from_the_os(self, monkeypatch):
        """Every bit of V is read from os.urandom (no seedable generator)."""
        read = []
        urandom = em.os.urandom
        monkeypatch.setattr(em.os, "urandom", lambda n: read.append(n) or urandom(n))
        sample_exponential_mechanism_vector(HISTOGRAM, GAMMA, 3)
        assert read and sum(read) >= 3 * start_precision(len(HISTOGRAM)) // 8
        assert "seed" not in inspect.signature(sample_exponential_mechanism).parameters

    def test_draws_have_exactly_the_exponential_mechanism_law(self):
        """20,000 draws on a 20-bin median law pass a chi-square test against the exact law."""
        distances = quantile_rank_distances(HISTOGRAM, Fraction(1, 2))
        draws = sample_exponential_mechanism_vector(distances, GAMMA, DRAWS)
        assert chi_square_p_value(draws, exponential_mechanism_probabilities(distances, GAMMA)) > ACCEPT_P
        # the negative control: the same draws are rejected against the law at a gamma 30 % off
        wrong = exponential_mechanism_probabilities(distances, GAMMA * WRONG_GAMMA)
        assert chi_square_p_value(draws, wrong) < REJECT_P

    def test_scalar_draws_have_the_same_law(self):
        """Independent scalar calls (bounds recomputed each time) pass the same test; the wrong gamma fails."""
        distances = quantile_rank_distances([4, 1, 0, 6, 2, 5], Fraction(1, 3))
        gamma = Fraction(1, 12)
        draws = [sample_exponential_mechanism(distances, gamma) for _ in range(5_000)]
        assert chi_square_p_value(draws, exponential_mechanism_probabilities(distances, gamma)) > ACCEPT_P
        wrong = exponential_mechanism_probabilities(distances, gamma * WRONG_GAMMA)
        assert chi_square_p_value(draws, wrong) < REJECT_P

    def test_refinement_keeps_the_law(self, monkeypatch):
        """From an 8-bit start most draws need more bits of V and finer bounds; the law is still exact, and the
        wrong gamma is still rejected."""
        precisions = []
        boundary_bounds = em._boundary_bounds
        monkeypatch.setattr(em, "_boundary_bounds", lambda d, g, p: precisions.append(p) or boundary_bounds(d, g, p))
        distances = quantile_rank_distances(HISTOGRAM, Fraction(1, 2))
        draws = sample_exponential_mechanism_vector(distances, GAMMA, DRAWS, _precision=8)
        assert precisions[0] == 8 and max(precisions) > 8  # refinement happened
        assert chi_square_p_value(draws, exponential_mechanism_probabilities(distances, GAMMA)) > ACCEPT_P
        wrong = exponential_mechanism_probabilities(distances, GAMMA * WRONG_GAMMA)
        assert chi_square_p_value(draws, wrong) < REJECT_P

    def test_refinement_from_one_bit_in_scalar_calls(self):
        """Scalar calls started at a 1-bit precision refine every draw and keep the law."""
        distances = [0, 1, 3, 0, 2]
        gamma = Fraction(1, 2)
        draws = [sample_exponential_mechanism(distances, gamma, _precision=1) for _ in range(3_000)]
        assert chi_square_p_value(draws, exponential_mechanism_probabilities(distances, gamma)) > ACCEPT_P

    @pytest.mark.slow
    def test_a_million_draws_have_exactly_the_law(self):
        """10^6 draws on the 20-bin law pass the chi-square test, and a gamma 5 % off is rejected."""
        distances = quantile_rank_distances(HISTOGRAM, Fraction(1, 2))
        draws = sample_exponential_mechanism_vector(distances, GAMMA, 1_000_000)
        assert chi_square_p_value(draws, exponential_mechanism_probabilities(distances, GAMMA)) > ACCEPT_P
        wrong = exponential_mechanism_probabilities(distances, GAMMA * Fraction(21, 20))
        assert chi_square_p_value(draws, wrong) < REJECT_P


class TestReferenceLaw:
    def test_probabilities_are_the_normalised_weights(self):
        """P(i) = exp(-gamma d_i) / sum_j exp(-gamma d_j), summing to 1, with no overflow for huge distances."""
        p = exponential_mechanism_probabilities([0, 1, 2], Fraction(1))
        weights = np.exp([0.0, -1.0, -2.0])
        assert np.allclose(p, weights / weights.sum(), rtol=1e-15, atol=0)
        far = exponential_mechanism_probabilities([10**18, 10**18 + 1, 10**30], Fraction(1))
        assert np.allclose(far, [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1)), 0.0])


class TestQuantileBin:
    def test_gamma_is_epsilon_over_records_per_unit_times_the_width(self, monkeypatch):
        """sample_quantile_bin calls the sampler with the distances and gamma = epsilon / (k W)."""
        seen = []
        monkeypatch.setattr(em, "sample_exponential_mechanism", lambda d, g: seen.append((d, g)) or 0)
        sample_quantile_bin([2, 3, 5], Fraction(1, 10), Fraction(1, 2), 3)
        assert seen == [([0, 10, 40], Fraction(1, 2) / (3 * 18))]

    def test_a_large_epsilon_releases_a_bin_holding_the_quantile(self):
        """At epsilon 1000 a bin at distance 1 has relative weight exp(-500): the release holds the median."""
        draws = {sample_quantile_bin([2, 3, 5], Fraction(1, 2), Fraction(1000), 1) for _ in range(200)}
        assert draws == {1, 2}

    def test_numpy_counts_are_accepted(self):
        """An int64 histogram is released like the list of its values."""
        assert sample_quantile_bin(np.array([0, 9, 0], dtype=np.int64), Fraction(1, 2), Fraction(1000), 1) == 1


class TestRankErrorBound:
    @pytest.mark.parametrize(
        "m,quantile,epsilon,k,beta,reference",
        [
            pytest.param(100, Fraction(1, 2), Fraction(1), 1, 0.05, math.log(2000), id="median: ln(m/beta)"),
            pytest.param(100, Fraction(1, 10), Fraction(1, 2), 2, 0.05, 18 * 2 * math.log(2000) / (10 * 0.5),
                         id="0.1 quantile, two records per unit"),
            pytest.param(1, Fraction(1, 2), Fraction(1), 1, Fraction(1, 1000), math.log(1000), id="one bin"),
        ],
    )
    def test_reference_values_rounded_up(self, m, quantile, epsilon, k, beta, reference):
        """k W (ln m + ln(1/beta)) / (b epsilon) records, never below the exact value and within 1e-12 of it."""
        bound = rank_error_bound(m, quantile, epsilon, k, beta)
        beta_exact = Fraction(str(beta)) if isinstance(beta, float) else beta  # a float is the decimal it spells
        with mpmath.workdps(50):
            exact = (
                bounded_range_width(quantile) * k * (mpmath.log(m) + mpmath.log(beta_exact.denominator)
                                                     - mpmath.log(beta_exact.numerator))
                * epsilon.denominator / (quantile.denominator * epsilon.numerator)
            )
            assert bound >= exact
        assert bound == pytest.approx(reference, rel=1e-12)

    def test_the_bound_covers_the_exact_law(self):
        """On a 200-bin histogram the exact probability of a release farther than the bound is below beta."""
        counts = [(7 * i) % 11 for i in range(200)]
        quantile, epsilon, k, beta = Fraction(1, 4), Fraction(1, 2), 1, 0.01
        distances = quantile_rank_distances(counts, quantile)
        gamma = epsilon / (k * bounded_range_width(quantile))
        probabilities = exponential_mechanism_probabilities(distances, gamma)
        bound = rank_error_bound(len(counts), quantile, epsilon, k, beta)
        far = [d / quantile.denominator > bound for d in distances]
        assert 0 < probabilities[far].sum() <= beta

    def test_bad_parameters_are_refused(self):
        """m must be a positive int and beta strictly between 0 and 1."""
        with pytest.raises(ValueError, match="m"):
            rank_error_bound(0, Fraction(1, 2), 1, 1, 0.1)
        with pytest.raises(ValueError, match="beta"):
            rank_error_bound(10, Fraction(1, 2), 1, 1, 1.0)


def test_public_surface():
    """__all__ is exactly the module's public functions."""
    public = {name for name, value in vars(em).items() if inspect.isfunction(value) and not name.startswith("_")
              and value.__module__ == em.__name__}
    assert set(em.__all__) == public
