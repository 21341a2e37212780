"""Exactness of the block-envelope samplers (dp_operators.mechanisms.vectorised_envelope), the default above
Laplace scale 2^14 and sigma^2 = 2^20: chi-square against the exact law on intervals of about equal mass, with
negative controls (a scale 2 % and 30 % off must be rejected by the same test); the certified brackets of exp(-x)
checked against 60-digit values; the exact acceptance test driven with chosen words; the block tables against an
independent computation; dtypes, limits and routing."""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

import mpmath
import numpy as np
import pytest
from scipy.stats import chi2

from dp_operators.mechanisms import vectorised as vec
from dp_operators.mechanisms import vectorised_envelope as ve

ACCEPT_P = 1e-4  # a correct sampler fails one such test in 10^4 runs
REJECT_P = 1e-6
TOP = (1 << 64) - 1

LAPLACE_SCALES = [Fraction(3 * 2**14 + 1, 3), Fraction(10**6), Fraction(2**30), Fraction(7 * 2**50, 3)]
GAUSSIAN_SIGMA2 = [Fraction(2**21 + 1, 3), Fraction(2**33), Fraction(10**12 + 7, 7), Fraction(2**50), Fraction(2**60)]


def laplace_cdf(scale: Fraction, x: int):
    """P(X <= x) for the discrete Laplace (pmf tanh(1/(2b)) q^|x|), as an mpf; call inside workdps(60)."""
    q = mpmath.exp(-mpmath.mpf(scale.denominator) / scale.numerator)
    return 1 - q ** (x + 1) / (1 + q) if x >= 0 else q ** (-x) / (1 + q)


def gaussian_cdf(sigma2: Fraction, x: int):
    """P(X <= x) for the discrete Gaussian with sigma^2 >= 2^20, as an mpf; call inside workdps(60).

    Euler-Maclaurin on f(k) = exp(-k^2/(2 sigma^2)): sum_{k<=x} f(k) = int_{-inf}^x f + f(x)/2 + f'(x)/12 + R with
    |R| below max|f'''| / 720 (about 1/sigma^3, 1e-12 of the sum here), and Z = sigma sqrt(2 pi) up to
    exp(-2 pi^2 sigma^2) by Poisson summation: far below what 10^7 draws can see.
    """
    s2 = mpmath.mpf(sigma2.numerator) / sigma2.denominator
    s = mpmath.sqrt(s2)
    f = mpmath.exp(-mpmath.mpf(x) ** 2 / (2 * s2))
    z = s * mpmath.sqrt(2 * mpmath.pi)
    partial = z * mpmath.ncdf(x / s) + f / 2 - x / s2 * f / 12
    return partial / z


def equal_mass_edges(spread: float, kind: str, bins: int = 60) -> np.ndarray:
    """Integer right edges of about ``bins`` intervals of roughly equal mass (the edges need not be exact; the
    masses of the chosen intervals are)."""
    edges = set()
    for j in range(1, bins):
        u = j / bins
        if kind == "laplace":
            edge = spread * math.log(2 * u) if u < 0.5 else -spread * math.log(2 * (1 - u))
        else:
            edge = spread * NormalDist().inv_cdf(u)
        edges.add(int(math.floor(edge)))
    return np.array(sorted(edges), dtype=np.int64)


def chi_square_p(sample: np.ndarray, edges: np.ndarray, cdf) -> float:
    """Pearson's p-value of ``sample`` against the masses of (-inf, e_0], (e_0, e_1], ..., (e_last, inf)."""
    with mpmath.workdps(60):
        c = [cdf(int(e)) for e in edges]
        probs = [c[0]] + [c[i] - c[i - 1] for i in range(1, len(c))] + [1 - c[-1]]
    counts = np.bincount(np.searchsorted(edges, sample, side="left"), minlength=len(edges) + 1)
    expected = np.array([float(p) for p in probs]) * len(sample)
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, len(expected) - 1))


def law_p(sample: np.ndarray, kind: str, param: Fraction) -> float:
    if kind == "laplace":
        return chi_square_p(sample, equal_mass_edges(float(param), kind), lambda x: laplace_cdf(param, x))
    return chi_square_p(sample, equal_mass_edges(math.sqrt(param), kind), lambda x: gaussian_cdf(param, x))


def check_law(kind: str, param: Fraction, n: int) -> None:
    draw = ve.sample_discrete_laplace_envelope if kind == "laplace" else ve.sample_discrete_gaussian_envelope
    sample = draw(param, n)
    assert sample.dtype == np.int64 and sample.shape == (n,)
    assert law_p(sample, kind, param) > ACCEPT_P
    # negative controls: the same test rejects the law at a scale 2 % and 30 % off (sigma^2 likewise)
    for off in (Fraction(102, 100), Fraction(130, 100)):
        assert law_p(sample, kind, param * off) < REJECT_P, off


@pytest.mark.parametrize("scale", LAPLACE_SCALES, ids=str)
def test_discrete_laplace_matches_the_exact_law(scale):
    """10^6 envelope draws pass the chi-square test against the discrete Laplace law, and scales off fail it."""
    check_law("laplace", scale, 10**6)


@pytest.mark.parametrize("sigma2", GAUSSIAN_SIGMA2, ids=str)
def test_discrete_gaussian_matches_the_exact_law(sigma2):
    """10^6 envelope draws pass the chi-square test against the discrete Gaussian law, and sigma^2 off fails it."""
    check_law("gaussian", sigma2, 10**6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,param",
    [
        ("laplace", LAPLACE_SCALES[0]),
        ("laplace", LAPLACE_SCALES[-1]),
        ("gaussian", GAUSSIAN_SIGMA2[0]),
        ("gaussian", GAUSSIAN_SIGMA2[-1]),
    ],
    ids=str,
)
def test_the_law_holds_on_1e7_draws(kind, param):
    """10^7 envelope draws pass the same chi-square test, and the scales off still fail it."""
    check_law(kind, param, 10**7)


def test_the_sign_and_zero_come_out_with_their_exact_weights():
    """At a small sigma^2 routed through the envelope, zero, the positives and the negatives have their exact
    masses (zero is reached through the positive sign only)."""
    sigma2 = Fraction(2)
    sample = ve.sample_discrete_gaussian_envelope(sigma2, 10**6)
    with mpmath.workdps(60):
        w = [mpmath.exp(-mpmath.mpf(x * x) / (2 * sigma2)) for x in range(-40, 41)]
        z = mpmath.fsum(w)
        probs = [float(v / z) for v in w]
    counts = np.bincount(np.clip(sample + 40, 0, 80), minlength=81)
    keep = np.array(probs) * len(sample) > 5
    expected = np.array(probs)[keep] / sum(np.array(probs)[keep]) * counts[keep].sum()
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    assert chi2.sf(stat, keep.sum() - 1) > ACCEPT_P


# --- the certified acceptance test ------------------------------------------------------------------------------


def plans():
    return [
        ("laplace", ve.laplace_envelope(10**9, 1)),
        ("laplace", ve.laplace_envelope(7 * 2**50, 3)),
        ("gaussian", ve.gaussian_envelope(2**40, 1)),
        ("gaussian", ve.gaussian_envelope(10**12 + 7, 7)),
    ]


@pytest.mark.parametrize("kind,plan", plans(), ids=lambda p: p if isinstance(p, str) else f"w={p.w}")
def test_the_brackets_bound_exp_minus_x_for_every_exponent_they_hold(kind, plan):
    """For exponents n c at bracket edges and inside, the accept and reject bounds enclose 2^(64-w) exp(-n c)."""
    bits = 64 - plan.w
    last = len(plan.accept_below) - 1
    with mpmath.workdps(60):
        for j in list(range(0, last, max(1, last // 50))) + [last - 1]:
            for n in ((j << plan.shift), ((j + 1) << plan.shift) - 1):
                value = mpmath.exp(-mpmath.mpf(n * plan.c_num) / plan.c_den) * 2**bits
                assert int(plan.accept_below[j]) <= value <= int(plan.reject_from[j]) + 1
    assert plan.accept_below[last] == 0 and plan.reject_from[last] == TOP  # past the brackets: always refined


def scripted(words: list[int]):
    stream = iter(words)
    return lambda n: np.array([next(stream) for _ in range(n)], dtype=np.uint64)


@pytest.mark.parametrize("offset", [-1, 0, 1])
@pytest.mark.parametrize("extra", [0, TOP])
def test_an_undecided_acceptance_is_settled_by_more_bits(offset, extra):
    """A word at the boundary of exp(-n c) goes to the exact test, which reads more words and decides as the
    60-digit comparison of V with exp(-n c) does."""
    plan = ve.gaussian_envelope(2**40, 1)
    r, index = (1 << plan.w) - 1, 1000  # a proposal far enough out that the exponent is not tiny
    n = r * (2 * (index << plan.w) + r)
    bits = 64 - plan.w
    with mpmath.workdps(60):
        target = mpmath.exp(-mpmath.mpf(n * plan.c_num) / plan.c_den)
        v = int(mpmath.floor(target * 2**bits)) + offset
        exact = (mpmath.mpf(v) * 2**64 + extra) / mpmath.mpf(2) ** (bits + 64) < target
    words = scripted([extra] * 4)
    assert ve._exact_accept(n, plan.c_num, plan.c_den, v, bits, words) == bool(exact)


def test_the_proposal_path_accepts_exactly_the_words_below_the_acceptance_probability():
    """Driven with chosen words, a proposal is kept iff its test bits lie below exp(-n c): the block index comes
    from the first word, the offset and the test from the second."""
    plan = ve.laplace_envelope(2**30, 1)
    floors = plan.blocks.floors
    block_word = int(floors[5]) + 1  # decides index 6
    r = (1 << plan.w) - 1
    bits = 64 - plan.w
    with mpmath.workdps(60):
        boundary = int(mpmath.floor(mpmath.exp(-mpmath.mpf(r) / 2**30) * 2**bits))
    below = (boundary - 3) << plan.w | r
    above = (boundary + 3) << plan.w | r
    kept = ve._proposals(plan, 2, scripted([block_word, block_word, below, above]))
    assert kept.tolist() == [(6 << plan.w) + r]


# --- tables, dtypes, limits and routing ------------------------------------------------------------------------


def test_the_gaussian_block_table_agrees_with_an_independent_computation():
    """The proven block floors equal floor(2^64 B_k / T) computed at 60 digits."""
    p, q = 2**40, 1
    plan = ve.gaussian_envelope(p, q)
    width = 1 << plan.w
    floors = plan.blocks.floors
    with mpmath.workdps(60):
        s2 = mpmath.mpf(p) / q / width**2
        reach = int(14 * mpmath.sqrt(s2))  # the terms beyond are below exp(-98), 10^-42 of the sum
        v = [mpmath.exp(-mpmath.mpf(i * i) / (2 * s2)) for i in range(reach)]
        total = mpmath.fsum(v)
        partial = mpmath.mpf(0)
        for k in range(len(floors)):
            partial += v[k]
            assert int(floors[k]) == min(TOP, int(mpmath.floor(partial / total * 2**64))), k
    assert int(floors[-1]) == TOP


def test_no_float_on_the_path():
    """Words are uint64 and outputs int64 on both mechanisms; a float word source is refused, not rounded."""
    seen = []

    def words(n):
        w = vec.os_words(n)
        seen.append(w.dtype)
        return w

    assert ve.sample_discrete_laplace_envelope(10**9, 1000, _words=words).dtype == np.int64
    assert ve.sample_discrete_gaussian_envelope(2**40, 1000, _words=words).dtype == np.int64
    assert set(seen) == {np.dtype(np.uint64)}
    with pytest.raises(TypeError):
        ve.sample_discrete_gaussian_envelope(2**40, 10, _words=lambda n: np.zeros(n, dtype=np.float64))


@pytest.mark.parametrize(
    "sampler,bad",
    [
        (ve.sample_discrete_laplace_envelope, ve.LAPLACE_SCALE_LIMIT + 1),
        (ve.sample_discrete_gaussian_envelope, ve.GAUSSIAN_SIGMA2_LIMIT + 1),
        (ve.sample_discrete_laplace_envelope, 0),
        (ve.sample_discrete_gaussian_envelope, float("nan")),
    ],
)
def test_parameters_outside_the_envelope_are_refused(sampler, bad):
    """A scale above the envelope's limit, zero or NaN raises ValueError."""
    with pytest.raises(ValueError):
        sampler(bad, 3)


def test_zero_draws_give_an_empty_int64_array():
    """size 0 returns an empty int64 array."""
    for sampler in (ve.sample_discrete_laplace_envelope, ve.sample_discrete_gaussian_envelope):
        out = sampler(2**40, 0)
        assert out.shape == (0,) and out.dtype == np.int64


@pytest.mark.parametrize(
    "sampler,param,route",
    [
        (vec.sample_discrete_laplace_array, 2**30, "sample_discrete_laplace_envelope"),
        (vec.sample_discrete_gaussian_array, 2**40, "sample_discrete_gaussian_envelope"),
        (vec.sample_discrete_gaussian_array, 2**21, "sample_discrete_gaussian_envelope"),
    ],
)
def test_the_default_samplers_send_large_scales_to_the_envelope(monkeypatch, sampler, param, route):
    """Above the table limits the default samplers draw through the envelope, not the scalar sampler."""
    calls = []
    real = getattr(ve, route)

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ve, route, spy)
    assert sampler(param, 10).dtype == np.int64
    assert len(calls) == 1


def test_a_block_index_refined_past_the_table_recomputes_its_prefix_sums_logarithmically_often():
    """Words of all ones (probability about 2^-64 each) walk the Gaussian block index past its table one step at a
    time; the exact prefix sums behind that walk are recomputed O(log k) times, not once per step."""
    import os

    from dp_operators.mechanisms import vectorised_bounds as vb

    ones = np.uint64(2**64 - 1)
    queue = [ones] + list(np.frombuffer(os.urandom(8 * 18), dtype=np.uint64)) + [ones] * 8

    def words(n):
        out = np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()
        k = min(n, len(queue))
        out[:k] = queue[:k]
        del queue[:k]
        return out

    vb.gaussian_prefix_bounds.cache_clear()
    ve.sample_discrete_gaussian_envelope(2**60, 3, _words=words)
    assert vb.gaussian_prefix_bounds.cache_info().misses <= 64
