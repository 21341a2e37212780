"""Exactness of the large-scale vectorised discrete Laplace sampler (dp_operators.mechanisms.vectorised_large).

Chi-square tests against the exact law computed with mpmath at 60 digits, on about 60 groups of equal mass (the
scales are too large to list the pmf, so the groups are intervals and their masses come from the closed-form CDF),
each with a negative control 2 % off that the same test must reject; each factor against its own pmf; the digits
read back from the output; a two-sample test against the scalar exact sampler; refinement driven with chosen
words; dtypes; refused parameters.

Speed is measured apart, never asserted: ``benchmarks/samplers.py`` prints samples/s at scales up to 2^50 as a
ratio to the scalar exact sampler in the same process.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy.stats import chi2
from test_vectorised_samplers import ACCEPT_P, REJECT_P, _scripted, two_sample_p

from dp_operators.mechanisms import vectorised as vec
from dp_operators.mechanisms import vectorised_large as vl
from dp_operators.mechanisms.samplers import sample_discrete_laplace_vector

SCALES = [Fraction(3 * 2**22 + 1, 3), Fraction(10**7), Fraction(7 * 10**6, 3), Fraction(10**9), Fraction(2**50)]
TOP = (1 << 64) - 1


def _q(scale: Fraction):
    return mpmath.exp(-mpmath.mpf(scale.denominator) / scale.numerator)


def laplace_cdf(scale: Fraction, x: int):
    """P(X <= x) for the discrete Laplace at scale ``scale``, as an mpf (call inside workdps(60))."""
    q = _q(scale)
    return 1 - q ** (x + 1) / (1 + q) if x >= 0 else q ** (-x) / (1 + q)


def equal_mass_edges(scale: Fraction, bins: int = 60) -> np.ndarray:
    """Integer right edges of about ``bins`` intervals of roughly equal mass under the Laplace law (the choice
    of edges need not be exact; the masses of the chosen intervals are)."""
    b = float(scale)
    edges = set()
    for j in range(1, bins):
        u = j / bins  # quantile of the continuous Laplace, rounded to an integer edge
        edges.add(int(math.floor(b * math.log(2 * u))) if u < 0.5 else int(math.floor(-b * math.log(2 * (1 - u)))))
    return np.array(sorted(edges), dtype=np.int64)


def interval_probs(edges: np.ndarray, cdf) -> list:
    """Masses of (-inf, e_0], (e_0, e_1], ..., (e_last, inf) under ``cdf`` (mpf values at 60 digits)."""
    with mpmath.workdps(60):
        c = [cdf(int(e)) for e in edges]
        return [c[0]] + [c[i] - c[i - 1] for i in range(1, len(c))] + [1 - c[-1]]


def chi_square_p(sample: np.ndarray, edges: np.ndarray, probs: list) -> float:
    """Pearson's p-value of ``sample`` against the interval masses ``probs`` on ``edges``."""
    counts = np.bincount(np.searchsorted(edges, sample, side="left"), minlength=len(edges) + 1)
    expected = np.array([float(p) for p in probs]) * len(sample)
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, len(expected) - 1))


def laplace_p(sample: np.ndarray, scale: Fraction) -> float:
    edges = equal_mass_edges(scale)
    return chi_square_p(sample, edges, interval_probs(edges, lambda x: laplace_cdf(scale, x)))


def _check_laplace(scale: Fraction, n: int) -> tuple[float, float]:
    sample = vl.sample_discrete_laplace_large(scale, n)
    assert sample.dtype == np.int64 and sample.shape == (n,)
    p_true, p_off = laplace_p(sample, scale), laplace_p(sample, scale * Fraction(102, 100))
    assert p_true > ACCEPT_P, p_true
    assert p_off < REJECT_P, p_off  # the same test rejects a scale 2 % off
    return p_true, p_off


@pytest.mark.parametrize("scale", [SCALES[1]], ids=str)
def test_discrete_laplace_matches_the_exact_law(scale):
    _check_laplace(scale, 10**6)


@pytest.mark.slow
@pytest.mark.parametrize("scale", SCALES, ids=str)
def test_discrete_laplace_matches_the_exact_law_on_1e7_draws(scale):
    _check_laplace(scale, 10**7)


# --- each factor against its own pmf -------------------------------------------------------------------------


def truncated_geometric_pmf(num: int, den: int, n: int | None, length: int) -> list:
    """P(F = j), j < length, for the geometric with ratio exp(-num/den) truncated to {0..n-1} (None: not)."""
    with mpmath.workdps(60):
        r = mpmath.exp(-mpmath.mpf(num) / den)
        z = (1 - r**n) if n is not None else 1
        return [(1 - r) * r**j / z for j in range(length)]


def factor_p(sample: np.ndarray, pmf: list, bins: int = 60) -> float:
    """Pearson's p-value of a sample of a factor (values 0..len(pmf)-1, the last group taking any beyond)
    against ``pmf`` on about ``bins`` groups of consecutive values of roughly equal mass."""
    probs = [float(p) for p in pmf]
    edges, acc = [], 0.0
    for j, p in enumerate(probs[:-1]):
        acc += p
        if acc >= 1 / bins:
            edges.append(j)
            acc = 0.0
    edges = np.array(edges, dtype=np.int64)
    with mpmath.workdps(60):  # prefix sums of the 60-digit pmf
        prefix, total = [], mpmath.mpf(0)
        for p in pmf:
            total += p
            prefix.append(total)
    masses = [prefix[edges[0]]] + [prefix[e] - prefix[d] for d, e in zip(edges[:-1], edges[1:])]
    masses.append(1 - prefix[edges[-1]])
    return chi_square_p(sample, edges, masses)


@pytest.mark.parametrize("scale", [
    # 10 s: more and larger digit tables, each a chi-square on 10^6 draws (ADR 30); its floors are checked exactly
    # in make test (test_table_floors_agree_with_an_independent_computation)
    pytest.param(Fraction(10**9), id="1000000000", marks=pytest.mark.slow),
    pytest.param(Fraction(7 * 10**6, 3), id="7000000/3"),
])
def test_each_factor_matches_its_own_pmf(scale):
    t, s = scale.numerator, scale.denominator
    plan = vl.large_scale_plan(t, s)
    n = 10**6
    # the quotient A: geometric with ratio q^K
    a = vec._magnitudes(plan.quotient, n, vec.os_words)
    assert factor_p(a, truncated_geometric_pmf(s << plan.k, t, None, 80)) > ACCEPT_P
    assert factor_p(a, truncated_geometric_pmf((s << plan.k) * 102, t * 100, None, 80)) < REJECT_P  # 2 % off
    # each digit D_i: truncated geometric on {0..2^d_i - 1} with ratio q^(2^e_i); the top digit's law drops by
    # a factor exp(-2^(e_L + d_L) / b) over its range, so a log-ratio 10 % off is visible in 10^6 draws
    for table, e in zip(plan.digits, plan.shifts):
        size = len(table.floors)
        assert table.floors[-1] == TOP
        d = vec._magnitudes(table, n, vec.os_words)
        assert d.min() >= 0 and d.max() < size
        assert factor_p(d, truncated_geometric_pmf(s << e, t, size, size)) > ACCEPT_P
        if e == plan.shifts[-1]:
            assert factor_p(d, truncated_geometric_pmf((s << e) * 110, t * 100, size, size)) < REJECT_P


def test_the_sign_factor_matches_its_pmf():
    # S in {0, 1, 2} with masses (1-q)/(1+q), q/(1+q), q/(1+q); at scale 3/2 all three are large
    scale = Fraction(3, 2)
    table = vl.sign_table(3, 2)
    sample = vec._magnitudes(table, 10**6, vec.os_words)
    with mpmath.workdps(60):
        q = _q(scale)
        pmf = [(1 - q) / (1 + q), q / (1 + q), q / (1 + q)]
    counts = np.bincount(sample, minlength=3)
    expected = np.array([float(p) for p in pmf]) * len(sample)
    assert chi2.sf(float(((counts - expected) ** 2 / expected).sum()), 2) > ACCEPT_P
    # at a large scale: the floors are the exact floors of the masses' partial sums (checked at 400 bits)
    for scale in SCALES:
        floors = [int(f) for f in vl.sign_table(scale.numerator, scale.denominator).floors]
        with mpmath.workprec(400):
            q = mpmath.exp(-mpmath.mpf(scale.denominator) / scale.numerator)
            exact = [int(mpmath.floor(2**64 * (1 - q) / (1 + q))), int(mpmath.floor(2**64 / (1 + q)))]
        assert floors == exact + [TOP]


def test_table_floors_agree_with_an_independent_computation():
    # 400-bit mpmath floors of 2^64 H(j) at sampled j, for every table of two plans
    for scale in [Fraction(10**9), Fraction(3 * 2**22 + 1, 3)]:
        t, s = scale.numerator, scale.denominator
        plan = vl.large_scale_plan(t, s)
        cases = [(plan.quotient, s << plan.k, None)] + [
            (table, s << e, len(table.floors)) for table, e in zip(plan.digits, plan.shifts)
        ]
        for table, num, n in cases:
            last = len(table.floors) - 1
            with mpmath.workprec(400):
                r = mpmath.exp(-mpmath.mpf(num) / t)
                for j in sorted({0, 1, 2, last // 2, last - 1}):
                    h = (1 - r ** (j + 1)) / ((1 - r**n) if n is not None else 1)
                    assert int(table.floors[j]) == int(mpmath.floor(h * 2**64)), (scale, j)
                    lo, hi = table.cdf_bounds(j, 200)
                    assert lo <= h * mpmath.mpf(2) ** 200 <= hi and hi - lo < 2**8


def test_the_output_digits_read_back_with_their_laws():
    # (|X| - 1) mod 2^e_2 is D_1 and the next bits are D_2 (given X != 0): checks how the factors are assembled
    scale = Fraction(10**7)
    t, s = scale.numerator, scale.denominator
    plan = vl.large_scale_plan(t, s)
    x = vl.sample_discrete_laplace_large(scale, 10**6)
    m = np.abs(x[x != 0]) - 1
    e2, size1, size2 = plan.shifts[1], len(plan.digits[0].floors), len(plan.digits[1].floors)
    assert factor_p(m & (size1 - 1), truncated_geometric_pmf(s, t, size1, size1)) > ACCEPT_P
    assert factor_p((m >> e2) & (size2 - 1), truncated_geometric_pmf(s << e2, t, size2, size2)) > ACCEPT_P
    # signs: P(X > 0) = P(X < 0)
    pos, neg = int((x > 0).sum()), int((x < 0).sum())
    assert abs(pos - neg) < 5 * math.sqrt(pos + neg)


@pytest.mark.slow
def test_two_sample_against_the_scalar_exact_sampler():
    scale = SCALES[0]  # 2^22 + 1/3, just above the single-table limit
    theirs = np.array(sample_discrete_laplace_vector(scale, 3 * 10**5), dtype=np.int64)  # about 6 s
    edges = equal_mass_edges(scale, 40)
    ours = vl.sample_discrete_laplace_large(scale, 3 * 10**6)
    assert two_sample_p(ours, theirs, edges) > ACCEPT_P
    # negative control: ours at a scale 5 % larger against the same scalar sample
    off = vl.sample_discrete_laplace_large(scale * Fraction(105, 100), 3 * 10**6)
    assert two_sample_p(off, theirs, edges) < REJECT_P


# --- chosen words --------------------------------------------------------------------------------------------


def _exact_floor_fraction(num: int, den: int, n: int | None, j: int) -> tuple[int, int]:
    """(floor(2^64 H(j)), floor(2^128 H(j)) - 2^64 floor(2^64 H(j))) at 400 bits."""
    with mpmath.workprec(400):
        r = mpmath.exp(-mpmath.mpf(num) / den)
        h = (1 - r ** (j + 1)) / ((1 - r**n) if n is not None else 1)
        hi = int(mpmath.floor(h * mpmath.mpf(2) ** 128))
    return hi >> 64, hi & TOP


def test_chosen_words_give_the_exact_assembled_value_and_refinement_decides():
    scale = Fraction(10**7)
    t, s = scale.numerator, scale.denominator
    plan = vl.large_scale_plan(t, s)
    f_sign = [int(f) for f in plan.sign.floors]
    d1, d2 = plan.digits
    e2, size1 = plan.shifts[1], len(d1.floors)
    j = 1000
    f_j, frac = _exact_floor_fraction(s, t, size1, j)
    assert int(d1.floors[j]) == f_j and int(d1.floors[j + 1]) > f_j
    # sign word in (F_0, F_1): S = 1 (X > 0); quotient word 0: A = 0; digit 2 word 0: D_2 = 0
    positive, negative = f_sign[0] + 1, f_sign[1] + 1
    for c, expected in [(0, j), (frac - 2, j), (frac + 2, j + 1), (TOP, j + 1)]:
        if 0 <= c <= TOP:  # a word equal to F_j is refined by the next word c
            out = vl.sample_discrete_laplace_large(scale, 1, _words=_scripted([positive, 0, f_j, c, 0]))
            assert int(out[0]) == 1 + expected, (c, frac)
    # a word strictly inside the floors is decided without refinement, and the assembly is 1 + K A + D_1 + 2^e2 D_2
    a_word = int(plan.quotient.floors[2]) + 1  # A = 3
    d2_word = int(d2.floors[4]) + 1  # D_2 = 5
    out = vl.sample_discrete_laplace_large(scale, 1, _words=_scripted([negative, a_word, f_j - 1, d2_word]))
    assert int(out[0]) == -(1 + (3 << plan.k) + j + (5 << e2))
    # S = 0: X = 0 whatever the other factors
    out = vl.sample_discrete_laplace_large(scale, 1, _words=_scripted([0, a_word, f_j - 1, d2_word]))
    assert int(out[0]) == 0 and out.dtype == np.int64


def test_the_last_word_refines_past_the_table_end():
    # the word 2^64 - 1 equals the last floor: the quotient's refinement continues with exact bounds past the
    # table (A > last with probability about 2^-64), a digit's ends at its last value (H = 1 exactly)
    plan = vl.large_scale_plan(10**7, 1)
    last_a = len(plan.quotient.floors) - 1
    out = vec._magnitudes(plan.quotient, 1, _scripted([TOP, TOP, TOP, TOP]))
    assert int(out[0]) > last_a
    out = vec._magnitudes(plan.digits[0], 1, _scripted([TOP, TOP, TOP]))
    assert int(out[0]) == len(plan.digits[0].floors) - 1
    # and with random continuation words the answer is the last entry except with probability < 2^-60
    assert int(vec._magnitudes(plan.quotient, 1, _scripted([TOP]))[0]) >= last_a


def test_huge_values_come_back_as_python_ints():
    # at 2^60 (K = 2^61) a quotient A >= 3 overflows int64: the array is object, the value exact
    scale = vl.LARGE_SCALE_LIMIT
    plan = vl.large_scale_plan(scale.numerator, scale.denominator)
    a_word = int(plan.quotient.floors[4]) + 1  # A = 5
    positive = int(plan.sign.floors[0]) + 1
    words = [positive, a_word] + [0] * len(plan.digits)
    out = vl.sample_discrete_laplace_large(scale, 1, _words=_scripted(words))
    assert out.dtype == object and type(out[0]) is int and out[0] == 1 + (5 << plan.k)
    sample = vl.sample_discrete_laplace_large(scale, 2000)
    assert sample.shape == (2000,)
    median = sorted(abs(int(v)) for v in sample)[1000]
    assert Fraction(median) / scale > Fraction(1, 2) and Fraction(median) / scale < 1  # about ln 2


def test_no_float_on_the_path(monkeypatch):
    seen_words, seen_factors = [], []

    def words(n):
        w = vec.os_words(n)
        seen_words.append(w.dtype)
        return w

    real = vl._magnitudes

    def spy(table, n, source):
        assert table.floors.dtype == np.uint64
        out = real(table, n, source)
        seen_factors.append(out.dtype)
        return out

    monkeypatch.setattr(vl, "_magnitudes", spy)
    for scale in [Fraction(10**7), Fraction(7 * 10**6, 3), Fraction(2**50)]:
        out = vl.sample_discrete_laplace_large(scale, 1000, _words=words)
        assert out.dtype == np.int64
    assert set(seen_words) == {np.dtype(np.uint64)} and set(seen_factors) == {np.dtype(np.int64)}
    # a float word source is refused, not rounded
    with pytest.raises(TypeError):
        vl.sample_discrete_laplace_large(10**7, 10, _words=lambda n: np.zeros(n, dtype=np.float64))


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, Fraction(2**60) + 1])
def test_bad_scales_are_refused(bad):
    with pytest.raises(ValueError):
        vl.sample_discrete_laplace_large(bad, 3)


@pytest.mark.parametrize("size", [-1, True, 2.0])
def test_bad_sizes_are_refused(size):
    with pytest.raises(ValueError):
        vl.sample_discrete_laplace_large(10**7, size)


def test_text_scale_is_a_type_error_and_zero_draws_are_empty():
    with pytest.raises(TypeError):
        vl.sample_discrete_laplace_large("1e7", 3)
    drawn = vl.sample_discrete_laplace_large(10**7, 0)
    assert drawn.shape == (0,) and drawn.dtype == np.int64


def test_digit_split_keeps_tables_small():
    for k in range(0, 62):
        sizes = vl.digit_split(k)
        assert sum(sizes) == k and all(1 <= d <= 20 for d in sizes) and len(sizes) == -(-k // 20)
