"""Work of the first exact draw at the spec's limits: the floor tables of the vectorised samplers are proven in one
or two rounds from the precision the scale needs (dp_operators.mechanisms.vectorised_bounds), the old fixed 64-bit
start needs dozens to over a hundred (the negative control), the floors do not depend on the start, and the scalar
CKS samplers spend a bounded number of CSPRNG calls per draw at the smallest scales. Work is counted (rounds,
calls), never timed."""

from __future__ import annotations

import math
import secrets
from fractions import Fraction

import mpmath
import pytest

from dp_operators.mechanisms import samplers
from dp_operators.mechanisms import vectorised as vec
from dp_operators.mechanisms import vectorised_bounds as vb

TABLE = 1 << 20  # the vectorised sampler's table cap (vectorised._MAX_TABLE)
OLD_START = 64  # the precision every floor table used to be first attempted at

#: rho <= 5000 and an L2 sensitivity of at least one grid unit give sigma2 = L2^2 / (2 rho) >= 1e-4 (the smallest
#: the spec admits; an (epsilon, delta) budget gives at least about 0.0044 at epsilon 100); 1e6 is a large scale.
SIGMA2 = [
    pytest.param(Fraction(1, 10**4), id="sigma2 1e-4 (spec minimum)"),
    pytest.param(Fraction(1, 3000), id="sigma2 1/3000"),
    pytest.param(Fraction(1, 100), id="sigma2 0.01"),
    pytest.param(Fraction(1), id="sigma2 1"),
    pytest.param(Fraction(10**6), id="sigma2 1e6"),
]
#: epsilon <= 100 and an L1 sensitivity of at least one grid unit give a Laplace scale >= 1/100.
LAPLACE_SCALES = [
    pytest.param(Fraction(1, 100), id="scale 1/100 (spec minimum)"),
    pytest.param(Fraction(1, 2), id="scale 1/2"),
    pytest.param(Fraction(1), id="scale 1"),
    pytest.param(Fraction(10), id="scale 10"),
]


@pytest.mark.parametrize("sigma2", SIGMA2)
def test_gaussian_floor_table_is_proven_in_at_most_two_rounds(sigma2):
    """The discrete Gaussian floor table is proven in one or two rounds from its starting precision."""
    proof = vb.gaussian_floor_proof(sigma2.numerator, sigma2.denominator, TABLE)
    assert proof.floors is not None and proof.floors[-1] == (1 << 64) - 1
    assert proof.rounds <= 2


@pytest.mark.parametrize(
    "sigma2,at_least",
    [
        pytest.param(Fraction(1, 10**4), 100, id="sigma2 1e-4"),
        pytest.param(Fraction(1, 3000), 30, id="sigma2 1/3000"),
    ],
)
def test_gaussian_floor_table_from_64_bits_needs_many_rounds(sigma2, at_least):
    """Started at the old fixed 64 bits, the same proof restarts dozens of times at small sigma2."""
    proof = vb.gaussian_floor_proof(sigma2.numerator, sigma2.denominator, TABLE, start=OLD_START)
    assert proof.rounds >= at_least


def test_gaussian_start_precision_resolves_the_pmf_ratio_at_one():
    """At sigma2 = 1e-4 the first attempt carries log2(e)/(2 sigma2) bits, the size of exp(-1/(2 sigma2))."""
    need = math.log2(math.e) * 5000  # 7213.48 bits
    start = vb.gaussian_start_precision(1, 10**4)
    assert need <= start <= need + 2


@pytest.mark.parametrize("sigma2", SIGMA2)
def test_first_gaussian_draw_computes_the_sums_at_most_twice(sigma2, monkeypatch):
    """A first draw (no cached table) bounds the theta sums at most twice, at every sigma2 from the spec minimum."""
    calls = []
    inner = vb.gaussian_prefix_bounds
    monkeypatch.setattr(vb, "gaussian_prefix_bounds", lambda *a: calls.append(a[2]) or inner(*a))
    vec.gaussian_table.cache_clear()
    vec.sample_discrete_gaussian_array(sigma2, 3)
    assert 1 <= len(calls) <= 2


@pytest.mark.parametrize(
    "sigma2",
    [pytest.param(Fraction(1, 3000), id="sigma2 1/3000"), pytest.param(Fraction(1, 3), id="sigma2 1/3")],
)
def test_gaussian_floors_do_not_depend_on_the_starting_precision(sigma2):
    """The proven floors are the same whether the proof starts at 64 bits, the chosen start, or above it."""
    num, den = sigma2.numerator, sigma2.denominator
    chosen = vb.gaussian_start_precision(num, den)
    tables = {s: vb.gaussian_floor_proof(num, den, TABLE, start=s).floors for s in (OLD_START, chosen, chosen + 200)}
    assert tables[OLD_START] == tables[chosen] == tables[chosen + 200]


@pytest.mark.parametrize("scale", LAPLACE_SCALES)
def test_laplace_floor_table_is_proven_in_at_most_two_rounds(scale):
    """The discrete Laplace floor table is proven in one or two rounds from its starting precision."""
    proof = vb.laplace_floor_proof(scale.numerator, scale.denominator, TABLE)
    assert proof.floors[-1] == (1 << 64) - 1
    assert proof.rounds <= 2


def test_laplace_floor_table_below_the_spec_minimum_from_64_bits_needs_many_rounds():
    """At scale 1/1000 (q = exp(-1000), 1443 bits) the old 64-bit start restarts 20 times; the chosen one does not."""
    assert vb.laplace_floor_proof(1, 1000, TABLE, start=OLD_START).rounds >= 20
    proof = vb.laplace_floor_proof(1, 1000, TABLE)
    assert proof.rounds == 1
    assert proof.floors == vb.laplace_floor_proof(1, 1000, TABLE, start=OLD_START).floors


@pytest.mark.parametrize(
    "x",
    [
        Fraction(0),
        Fraction(1, 3),
        Fraction(1),
        Fraction(7, 3),
        Fraction(100),
        Fraction(5000),
        Fraction(7 * 10**6 + 1, 7),
    ],
    ids=str,
)
@pytest.mark.parametrize("p", [64, 300, 7400])
def test_exp_neg_bounds_bracket_the_exact_value_tightly(x, p):
    """exp(-x) split as exp(-1)^floor(x) exp(-frac(x)) is bracketed, within a few units of 2^-p."""
    lo, hi = vb.exp_neg_bounds(x.numerator, x.denominator, p)
    with mpmath.workprec(p + 128):  # a float: relative precision, whatever the exponent
        exact = mpmath.exp(-mpmath.mpf(x.numerator) / x.denominator) * mpmath.mpf(2) ** p
        assert lo <= exact <= hi
    assert hi - lo <= 4


def _mean_randbelow_calls(draw, monkeypatch, n: int) -> float:
    calls = [0]
    inner = secrets.randbelow

    def counted(k):
        calls[0] += 1
        return inner(k)

    monkeypatch.setattr(samplers.secrets, "randbelow", counted)
    for _ in range(n):
        draw()
    monkeypatch.setattr(samplers.secrets, "randbelow", inner)
    return calls[0] / n


@pytest.mark.parametrize("sigma2", SIGMA2)
def test_scalar_gaussian_csprng_calls_per_draw_stay_bounded(sigma2, monkeypatch):
    """The CKS discrete Gaussian spends under 40 CSPRNG calls per draw on average (about 29 at sigma2 = 1e-4)."""
    assert _mean_randbelow_calls(lambda: samplers.sample_discrete_gaussian(sigma2), monkeypatch, 2000) < 40


@pytest.mark.parametrize("scale", LAPLACE_SCALES)
def test_scalar_laplace_csprng_calls_per_draw_stay_bounded(scale, monkeypatch):
    """The CKS discrete Laplace spends under 20 CSPRNG calls per draw on average (about 15 at scale 1/100)."""
    assert _mean_randbelow_calls(lambda: samplers.sample_discrete_laplace(scale), monkeypatch, 2000) < 20
