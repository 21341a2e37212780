"""Prosecutor, journalist and marketer re-identification risk (El Emam & Dankar 2008) against hand-computed values
and a per-record brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_operators.anonymity.risk import RISK_TOLERANCE, exceeds, record_risks, risk_summary


def test_prosecutor_and_marketer_without_a_population():
    # Classes of 1, 2, 3 and 4 rows (n = 10). Record risks 1, 1/2, 1/3, 1/4.
    summary = risk_summary(np.array([1, 2, 3, 4]), None, threshold=0.3)
    assert summary["population"] == "release"
    assert summary["prosecutor"]["highest"] == 1.0
    assert summary["prosecutor"]["average"] == pytest.approx(4 / 10)  # sum over records of 1/f = classes / n
    assert summary["prosecutor"]["records_at_risk"] == pytest.approx(6 / 10)  # 1 + 2 + 3 rows have risk > 0.3
    assert summary["journalist"] == summary["prosecutor"]  # the release is its own population
    assert summary["marketer"]["average"] == pytest.approx(4 / 10)


def test_journalist_and_marketer_with_a_population():
    # Sample f = 1, 2, 3, 4 drawn from population classes F = 2, 4, 3, 8. Journalist record risks 1/F:
    # 1/2, 1/4, 1/3, 1/8; marketer (1/n) sum f/F = (1/2 + 2/4 + 3/3 + 4/8) / 10 = 0.25.
    summary = risk_summary(np.array([1, 2, 3, 4]), np.array([2, 4, 3, 8]), threshold=0.3)
    assert summary["population"] == "given"
    assert summary["journalist"]["highest"] == 0.5
    assert summary["journalist"]["records_at_risk"] == pytest.approx((1 + 3) / 10)  # 1/2 and 1/3 exceed 0.3
    assert summary["journalist"]["average"] == pytest.approx(0.25)
    assert summary["marketer"]["average"] == pytest.approx(0.25)
    assert summary["prosecutor"]["highest"] == 1.0  # the prosecutor knows the target is in the release


def test_journalist_average_is_the_larger_of_classes_over_population_and_the_marketer_figure():
    """The journalist average is max(J / sum F, (1/n) sum f / F), El Emam's definition as ARX computes it."""
    # Sample f = 1, 3 from population classes F = 2, 3: J / sum F = 2 / 5 = 0.4 exceeds the marketer figure
    # (1/2 + 3/3) / 4 = 0.375, so the journalist average is 0.4 while the marketer average stays 0.375.
    summary = risk_summary(np.array([1, 3]), np.array([2, 3]), threshold=0.5)
    assert summary["journalist"]["average"] == pytest.approx(0.4)
    assert summary["marketer"]["average"] == pytest.approx(0.375)


@pytest.mark.parametrize(
    ("size", "threshold"),
    [(5, 0.2), (4, 0.25), (3, 1 / 3), (10, 0.1), (1, 1.0), (7, 1 / 7)],
)
def test_a_class_of_exactly_one_over_the_threshold_is_not_at_risk(size, threshold):
    # risk 1/size == threshold is not *above* it; one row fewer is
    assert risk_summary(np.array([size]), None, threshold)["prosecutor"]["records_at_risk"] == 0.0
    if size > 1:
        smaller = risk_summary(np.array([size - 1]), None, threshold)
        assert smaller["prosecutor"]["records_at_risk"] == 1.0


def test_empty_release_is_all_zero_and_json_safe():
    summary = risk_summary(np.array([], dtype=np.int64), None, 0.2)
    assert summary["prosecutor"] == {"highest": 0.0, "average": 0.0, "records_at_risk": 0.0}
    assert summary["marketer"] == {"average": 0.0}


def test_record_risks():
    np.testing.assert_allclose(record_risks(np.array([1, 4])), [1.0, 0.25])


@pytest.mark.parametrize(
    ("sample", "population", "threshold", "match"),
    [
        pytest.param([1, 2], None, 0.0, "threshold must be in \\(0, 1\\]", id="threshold zero"),
        pytest.param([1, 2], None, 1.5, "threshold must be in \\(0, 1\\]", id="threshold above one"),
        pytest.param([1, 2], None, math.nan, "threshold must be in \\(0, 1\\]", id="threshold nan"),
        pytest.param([0, 2], None, 0.2, "sizes must be >= 1", id="empty class"),
        pytest.param([1, 2], [3], 0.2, "one entry per released class", id="shape"),
        pytest.param([2, 2], [1, 5], 0.2, "population class is smaller", id="population smaller"),
    ],
)
def test_bad_arguments(sample, population, threshold, match):
    with pytest.raises(ValueError, match=match):
        risk_summary(np.array(sample), None if population is None else np.array(population), threshold)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 12)), min_size=1, max_size=15),
    st.sampled_from([0.05, 0.1, 0.2, 0.25, 1 / 3, 0.5, 1.0]),
)
def test_matches_a_per_record_brute_force(classes, threshold):
    f = np.array([size for size, _ in classes])
    big_f = np.array([size + extra for size, extra in classes])
    summary = risk_summary(f, big_f, threshold)
    prosecutor = [1 / size for size in f for _ in range(size)]  # one entry per released record
    journalist = [1 / pop for size, pop in zip(f, big_f) for _ in range(size)]
    n = len(prosecutor)
    assert summary["prosecutor"]["highest"] == pytest.approx(max(prosecutor))
    assert summary["prosecutor"]["average"] == pytest.approx(sum(prosecutor) / n)
    assert summary["journalist"]["highest"] == pytest.approx(max(journalist))
    assert summary["journalist"]["average"] == pytest.approx(max(len(f) / big_f.sum(), sum(journalist) / n))
    assert summary["marketer"]["average"] == pytest.approx(sum(journalist) / n)
    # at risk: strictly above the threshold, compared in exact fractions (1/size > t  <=>  size * t < 1)
    at_risk = sum(size for size in f if size * threshold < 1 - 1e-12)
    assert summary["prosecutor"]["records_at_risk"] == pytest.approx(at_risk / n)


def test_the_tolerance_is_relative_to_the_target():
    # An absolute 1e-12 would let 1/(10**6 + 1) pass a 1e-12 target; relative, only float rounding is forgiven.
    assert exceeds(1.0 / 2, 1e-12)
    assert exceeds(1e-12 * (1 + 4 * RISK_TOLERANCE), 1e-12)
    assert not exceeds(1e-12 * (1 + RISK_TOLERANCE / 2), 1e-12)
    assert not exceeds(1.0 / 3, 0.3333333333333333) and exceeds(1.0 / 3, 0.33333333333)
    assert exceeds(np.array([0.0, 1e-300]), 0.0).tolist() == [False, True]
    sizes = np.array([10**8, 10**8 - 1])
    summary = risk_summary(sizes, None, 1e-8)
    assert summary["prosecutor"]["records_at_risk"] == pytest.approx((10**8 - 1) / (2 * 10**8 - 1))
