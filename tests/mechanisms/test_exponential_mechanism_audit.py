"""Empirical privacy audit of the exponential mechanism for quantiles (dp_operators.mechanisms.exponential).

Two neighbouring histograms D and D' (one record, or one privacy unit's k records, added at the far end, so that
many scores move at once) are released many times each. For every output bin, Clopper-Pearson intervals on its
probability under D and under D' give a lower confidence bound on |log P(i | D) / P(i | D')|; the largest of them is
a lower confidence bound on the privacy loss the pair shows. The claimed epsilon must not be exceeded, and the same
estimate must flag a mechanism claiming less than it delivers: the twin claims epsilon/2, and a sampler run at
1.5 epsilon claims epsilon. The pairs are chosen so that the exact loss (computed from the exact law, checked here)
is close to epsilon: the bins holding most of the mass lose score while a bin with a few percent of it gains.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import beta as beta_distribution

from dp_operators.mechanisms.exponential import (
    bounded_range_width,
    exponential_mechanism_probabilities,
    quantile_rank_distances,
    sample_exponential_mechanism_vector,
)

#: the chance that any of one audit's confidence bounds is wrong (Bonferroni over the 2m intervals)
ALPHA = 1e-6
EPSILON = Fraction(1)
MEDIAN = Fraction(1, 2)

#: qN = 5 is the upper edge of bin 0 and of the ten empty bins (distance 0); one record added to the last bin moves
#: qN to 5.5: those eleven bins, most of the mass, go to distance 1 (score -1), the last bin from 2 to 1 (+1)
MEDIAN_PAIR = ([5] + [0] * 10 + [1] + [4], [5] + [0] * 10 + [1] + [5])
#: the 0.1 quantile (W = 18): a record added to the first bin moves qN from 0.9 to 1 and every bin above the first
#: by one rank: the eight empty bins gain 9 (from 9 to 0), the last bin loses 9
TENTH_PAIR = ([0] * 8 + [6, 3], [1] + [0] * 7 + [6, 3])
#: two records per privacy unit, both added to the last bin
TWO_RECORD_PAIR = ([3] + [0] * 20 + [3, 0], [3] + [0] * 20 + [3, 2])


def gamma_for(quantile: Fraction, epsilon: Fraction, records_per_unit: int) -> Fraction:
    """The gamma of :func:`sample_quantile_bin`: epsilon / (k W)."""
    return epsilon / (records_per_unit * bounded_range_width(quantile))


def exact_log_ratios(pair, quantile: Fraction, gamma: Fraction) -> np.ndarray:
    """log P(i | D) - log P(i | D') for every output i, from the exact law."""
    d, d2 = (exponential_mechanism_probabilities(quantile_rank_distances(c, quantile), gamma) for c in pair)
    return np.log(d) - np.log(d2)


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided 1 - alpha interval for a binomial proportion."""
    lo = beta_distribution.ppf(alpha / 2, successes, trials - successes + 1) if successes else 0.0
    hi = beta_distribution.ppf(1 - alpha / 2, successes + 1, trials - successes) if successes < trials else 1.0
    return float(lo), float(hi)


def privacy_loss_lower_bound(draws: list[int], draws_neighbour: list[int], m: int, alpha: float = ALPHA) -> float:
    """A 1 - alpha lower confidence bound on max_i |log P(i | D) / P(i | D')| from draws under D and under D'."""
    counts = np.bincount(draws, minlength=m)
    counts_neighbour = np.bincount(draws_neighbour, minlength=m)
    level = alpha / (2 * m)
    best = 0.0
    for x, y in zip(counts.tolist(), counts_neighbour.tolist()):
        p_lo, p_hi = clopper_pearson(x, len(draws), level)
        q_lo, q_hi = clopper_pearson(y, len(draws_neighbour), level)
        if p_lo > 0:
            best = max(best, math.log(p_lo / q_hi))
        if q_lo > 0:
            best = max(best, math.log(q_lo / p_hi))
    return best


def audit(pair, quantile: Fraction, gamma: Fraction, draws: int, precision: int | None = None) -> float:
    """The lower confidence bound of the privacy loss that ``draws`` releases from each histogram of ``pair`` show."""
    samples = [
        sample_exponential_mechanism_vector(quantile_rank_distances(c, quantile), gamma, draws, _precision=precision)
        for c in pair
    ]
    return privacy_loss_lower_bound(samples[0], samples[1], len(pair[0]))


def neighbours(counts: list[int], records: int):
    """Every histogram reached by adding or removing ``records`` records in total, one bin at a time."""
    frontier = {tuple(counts)}
    for _ in range(records):
        frontier = {
            tuple(c + (change if i == j else 0) for i, c in enumerate(h))
            for h in frontier
            for j, change in itertools.product(range(len(h)), (1, -1))
            if h[j] + change >= 0
        }
    return [list(h) for h in frontier]


class TestChosenPairs:
    @pytest.mark.parametrize(
        "pair,quantile,records",
        [
            pytest.param(MEDIAN_PAIR, MEDIAN, 1, id="median, a record added at the top"),
            pytest.param(TENTH_PAIR, Fraction(1, 10), 1, id="0.1 quantile, a record added at the bottom"),
            pytest.param(TWO_RECORD_PAIR, MEDIAN, 2, id="median, two records per unit"),
        ],
    )
    def test_the_pair_loses_nearly_epsilon_and_no_neighbour_loses_more(self, pair, quantile, records):
        """The exact privacy loss of the chosen pair is between 0.85 epsilon and epsilon, on an output carrying at
        least a third of a percent of the mass under both; every neighbour of D loses at most epsilon."""
        gamma = gamma_for(quantile, EPSILON, records)
        ratios = exact_log_ratios(pair, quantile, gamma)
        worst = int(np.argmax(np.abs(ratios)))
        assert 0.85 * EPSILON <= abs(ratios[worst]) <= EPSILON
        for c in pair:
            law = exponential_mechanism_probabilities(quantile_rank_distances(c, quantile), gamma)
            assert law[worst] > 0.0035
        for other in neighbours(pair[0], records):
            assert np.max(np.abs(exact_log_ratios((pair[0], other), quantile, gamma))) <= EPSILON + 1e-12

    def test_the_median_pair_is_the_worst_neighbour_of_its_histogram(self):
        """No one-record neighbour of the median histogram shows a larger exact loss than the chosen one."""
        gamma = gamma_for(MEDIAN, EPSILON, 1)
        chosen = np.max(np.abs(exact_log_ratios(MEDIAN_PAIR, MEDIAN, gamma)))
        others = [np.max(np.abs(exact_log_ratios((MEDIAN_PAIR[0], o), MEDIAN, gamma)))
                  for o in neighbours(MEDIAN_PAIR[0], 1)]
        assert chosen == pytest.approx(max(others), rel=1e-12)


class TestAudit:
    def test_the_claimed_epsilon_holds_and_a_claim_of_half_is_flagged(self):
        """100,000 releases from each median neighbour: the loss's lower bound is at most epsilon, and above
        epsilon/2, so a mechanism claiming epsilon/2 would be caught."""
        bound = audit(MEDIAN_PAIR, MEDIAN, gamma_for(MEDIAN, EPSILON, 1), 100_000)
        assert bound <= EPSILON
        assert bound > EPSILON / 2

    def test_a_sampler_run_at_one_and_a_half_epsilon_is_flagged(self):
        """A sampler with gamma 1.5 times the calibrated one (claiming epsilon, delivering about 1.35) is caught."""
        bound = audit(MEDIAN_PAIR, MEDIAN, gamma_for(MEDIAN, EPSILON * Fraction(3, 2), 1), 100_000)
        assert bound > EPSILON

    @pytest.mark.slow
    @pytest.mark.parametrize(
        "pair,quantile,records,precision",
        [
            pytest.param(MEDIAN_PAIR, MEDIAN, 1, None, id="median"),
            pytest.param(MEDIAN_PAIR, MEDIAN, 1, 8, id="median, refined from 8 bits"),
            pytest.param(TENTH_PAIR, Fraction(1, 10), 1, None, id="0.1 quantile"),
            pytest.param(TWO_RECORD_PAIR, MEDIAN, 2, None, id="median, two records per unit"),
        ],
    )
    def test_audit_with_a_million_releases(self, pair, quantile, records, precision):
        """10^6 releases from each neighbour: epsilon holds, epsilon/2 is flagged, and a sampler run at 1.5 epsilon
        is flagged as exceeding epsilon."""
        bound = audit(pair, quantile, gamma_for(quantile, EPSILON, records), 1_000_000, precision)
        assert EPSILON / 2 < bound <= EPSILON
        overspent = audit(pair, quantile, gamma_for(quantile, EPSILON * Fraction(3, 2), records), 1_000_000, precision)
        assert overspent > EPSILON
