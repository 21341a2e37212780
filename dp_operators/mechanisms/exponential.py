"""The exponential mechanism for a quantile over a public histogram, sampled exactly.

Utility: for public ordered bins with private record counts n_0..n_(m-1) and a quantile q = a/b, candidate bin i
scores u_i = -d_i, d_i = b times the distance in ranks (records) from the target rank qN to bin i's rank interval
[lt_i, le_i] (:func:`quantile_rank_distances`). The mechanism releases bin i with probability
exp(-gamma d_i) / sum_j exp(-gamma d_j) (McSherry & Talwar 2007; for quantiles, Smith 2011).

Privacy: one record added or removed moves every d_i by at most max(a, b - a), in either direction, so the changes
of the scores lie in an interval of width W = 2 max(a, b - a) (:func:`bounded_range_width`). With
gamma = epsilon / (k W) for a privacy unit that adds or removes at most k records, the mechanism is epsilon-bounded-
range (Durfee & Rogers 2019), hence epsilon-DP and epsilon^2/8-zCDP (Cesar & Rogers 2021)
(:func:`sample_quantile_bin`).

Sampling (:func:`sample_exponential_mechanism`), exactly as stated, with no float deciding the output:

* The output is k(V) = min{k : V < S_k / Z} for V uniform on [0, 1), S_k = sum_{j<=k} w_j the prefix sums of the
  weights w_j = exp(-gamma (d_j - min d)) and Z = S_(m-1): P(k(V) = k) = w_k / Z, the law above (shifting every
  distance by the same amount does not change it, and makes Z >= 1, since the smallest distance has weight 1).
* V is written in binary from ``os.urandom``: after p bits, V lies in [A, A+1) / 2^p.
* Every weight is bounded by integers L_j <= 2^p w_j <= U_j: exp(-gamma) by
  :func:`~dp_operators.mechanisms.vectorised_bounds.exp_neg_bounds` at a guard precision, raised to the power
  d_j - min d by a fixed schedule of products with a public table of exp(-gamma 2^j), rounded down (lower) and up
  (upper): one product per bit of the capped exponent, by 1 where the bit is 0. The exponent is capped at the least
  distance whose argument gamma d exceeds 0.7 p + 2 > p ln 2 + 2 (public: it depends on gamma and p only); a weight
  at or beyond it is below e^-2 2^-p and gets the bounds 0 and the capped power's upper bound (at most 1).
* Each boundary S_k / Z = S_k / (S_k + T_k), T_k = Z - S_k, increases with S_k and decreases with T_k, so the prefix
  sums of L and U and the suffix sums of U and L bound it: B_lo[k] <= 2^p S_k / Z <= B_hi[k] (integers).
* If A + 1 <= B_lo[k] then V < S_k / Z; if A >= B_hi[k-1] then V >= S_(k-1) / Z. When both hold for the first k with
  A + 1 <= B_lo[k], k(V) = k whatever V's later bits are, and k is returned. Otherwise the precision is doubled and
  V's expansion is extended by as many fresh bits; nothing is rejected or redrawn, so the output is always k(V) and
  its law is exactly w_k / Z. Each boundary is a real number whose bounds close on it as p grows (a boundary that is
  not certified at one precision is at the next, unless V equals it, an event of probability 0), so this ends with
  probability 1.

Cost: the work at the first precision is fixed by the number of candidates m and the public gamma: one bound on
exp(-gamma) and a table of exp(-gamma 2^j), the same 2 bitlen(cap) products per candidate whatever the distances (a 0
bit of the exponent multiplies by 1; equal distances are not merged), prefix and suffix
sums of m integers, a binary search. Only the refinement depends on the data, and it runs with probability below
2 m^2 2^-p (:func:`start_precision`: under 2^-127 at the first precision). Python integers are not constant-time;
this bounds the count of operations, not their duration.

Randomness: OS CSPRNG only (``os.urandom``); no seed.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from dp_operators.mechanisms._rational import as_open_unit_interval, as_positive_rational
from dp_operators.mechanisms.vectorised_bounds import _ceil_div, exp_neg_bounds

__all__ = [
    "bounded_range_width",
    "exponential_mechanism_probabilities",
    "quantile_rank_distances",
    "rank_error_bound",
    "sample_exponential_mechanism",
    "sample_exponential_mechanism_vector",
    "sample_quantile_bin",
    "start_precision",
]

#: the threshold on gamma * d above which a weight is below 2^-p: CAP_SLOPE * p + CAP_OFFSET > p ln 2 + 2
#: (ln 2 = 0.6931... < 7/10), so 2^p exp(-gamma d) < e^-2 there
_CAP_SLOPE = Fraction(7, 10)
_CAP_OFFSET = 2


def _integer_list(values: object, name: str) -> list[int]:
    """``values`` as a list of Python ints, decided by type: a numpy array of an integer dtype, or a sequence whose
    every item is an int or a numpy integer (bools refused). Negative entries and an empty list are refused."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got an array of shape {values.shape}")
        if values.dtype.kind in "iu":
            items = values.tolist()
        elif values.dtype == object:
            items = list(values)
        else:
            raise TypeError(f"{name} must hold integers, got a numpy array of dtype {values.dtype}")
    elif isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of ints or an integer numpy array, got {type(values).__name__}")
    else:
        items = list(values)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise TypeError(f"{name}[{i}] must be an int, got {type(item).__name__} (values are read by type)")
        out.append(int(item))
    if not out:
        raise ValueError(f"{name} must have at least one entry")
    # the value is not echoed: these are private counts, and a refusal must not carry them into a log
    if min(out) < 0:
        raise ValueError(f"{name} must be non-negative integers; a negative entry was found")
    return out


def _quantile(quantile: object) -> Fraction:
    return Fraction(as_open_unit_interval(quantile, "quantile"))


def quantile_rank_distances(counts: Sequence[int] | np.ndarray, quantile: Fraction) -> list[int]:
    """Distances d_i = max(0, b lt_i - a N, a N - b le_i) of each bin's rank interval from the q-quantile's rank.

    With q = a/b in lowest terms, N = sum(counts), lt_i = sum_{j<i} n_j and le_i = lt_i + n_i, d_i is b times the
    distance in records from the target rank qN to [lt_i, le_i]: 0 exactly for the bin(s) holding the q-quantile
    (two bins when qN falls on the boundary between them, and every empty bin at that rank), so min d_i = 0. The
    exponential mechanism's utility is u_i = -d_i. The work per bin is fixed (one running sum, one max).

    Args:
        counts: shape (m,), m >= 1: the record counts of public ordered bins, non-negative ints (Python ints of any
            size, or a numpy integer array, converted to Python ints).
        quantile: q in (0, 1), exact (a Fraction; an int, Decimal or a float read as the decimal it was typed as).

    Returns:
        list of m non-negative Python ints, in units of 1/b record.

    Raises:
        TypeError: counts not a sequence of ints or an integer array (floats and bools refused, whatever their
            value). ValueError: counts empty or with a negative entry; quantile not strictly between 0 and 1.

    Source: the rank utility of Smith 2011 ("Privacy-preserving statistical estimation with optimal convergence
    rates", STOC), scaled by b so that it is an integer.
    """
    q = _quantile(quantile)
    n = _integer_list(counts, "counts")
    a, b = q.numerator, q.denominator
    target = a * sum(n)
    distances = []
    below = 0  # b lt_i
    for count in n:
        upto = below + b * count  # b le_i
        distances.append(max(0, below - target, target - upto))
        below = upto
    return distances


def bounded_range_width(quantile: Fraction) -> int:
    """W = 2 max(a, b - a) for q = a/b in lowest terms: the width of an interval holding every candidate's change of
    the utility u_i = -d_i (:func:`quantile_rank_distances`) when one record is added or removed.

    Argument. d_i = max(0, f_i, g_i) with f_i = b lt_i - a N and g_i = a N - b le_i. Add a record to bin j (a removal
    is the reverse change): N grows by 1; for i > j, lt_i and le_i grow by 1, so f_i and g_i move by b - a and
    a - b; for i < j, only N moves, so f_i and g_i move by -a and +a; for i = j, le_j grows by 1, so f_j moves by -a
    and g_j by a - b. A maximum of terms that each move by at most c = max(a, b - a) moves by at most c, so every
    change of u_i lies in [-c, c], an interval of width W = 2c. The width is reached (for example the median, a
    record added at the top: a bin below the median moves by -1, a bin between the median and the top by +1).
    A privacy unit adding or removing k records moves every u_i within [-kc, kc]: width k W.

    Units: 1/b record, as the distances. Raises ValueError if the quantile is not strictly between 0 and 1.
    Source: the bounded-range notion of Durfee & Rogers 2019 ("Practical differentially private top-k selection
    with pay-what-you-get composition", NeurIPS).
    """
    q = _quantile(quantile)
    a, b = q.numerator, q.denominator
    return 2 * max(a, b - a)


def start_precision(m: int) -> int:
    """The first precision p (bits) of :func:`sample_exponential_mechanism` for m candidates: 128 + 2 ceil(log2 m).

    At precision p the draw is left undecided with probability below 2 m^2 2^-p, which is below 2^-127 here: each
    weight's bounds are at most 2 units of 2^-p apart (0 for the smallest distance, whose weight is exactly 1), so
    the m - 1 inner boundaries S_k / Z are each known to within 2 m + 1 units (Z >= 1), and V is undecided only
    when its p-bit prefix falls in one of those intervals.
    """
    return 128 + 2 * (m - 1).bit_length()


def _product_down(a: int, b: int, w: int) -> int:
    """floor(a b / 2^w): a product of two w-bit fixed-point numbers rounded down."""
    return (a * b) >> w


def _product_up(a: int, b: int, w: int) -> int:
    """ceil(a b / 2^w): rounded up."""
    return -((-(a * b)) >> w)


def _weight_bounds(shifted: list[int], gamma: Fraction, p: int) -> tuple[list[int], list[int]]:
    """Integers (L, U) with L_j <= 2^p exp(-gamma d_j) <= U_j, d_j = shifted[j] >= 0; U_j - L_j <= 2.

    exp(-gamma d) is exp(-gamma)^e with e = min(d, cap), cap the least integer with gamma cap > 0.7 p + 2 (public:
    it depends on gamma and p only). Bounds on exp(-gamma) come from ``exp_neg_bounds`` at w = p + 2 bitlen(cap) + 64
    bits; a public table holds bounds on exp(-gamma 2^j), j < bitlen(cap), by squaring rounded down and up. Every
    candidate's power then takes the same bitlen(cap) steps, each one product rounded down and one rounded up: by
    the table entry where e has a 1 bit, by 1 (2^w) where it has a 0, so the count of products is fixed by gamma and
    p, never by the distances (each rounding adds one unit of 2^-w and a squaring at most doubles the width, so the
    width stays below 2^(w - p)); then rounded to p bits outward. For d >= cap the lower bound is 0 and the upper one
    that of exp(-gamma cap) (exp decreases): 2^p exp(-gamma cap) < e^-2, so that upper bound is at most 1.
    """
    threshold = _CAP_SLOPE * p + _CAP_OFFSET
    cap = math.floor(threshold / gamma) + 1
    steps = cap.bit_length()
    w = p + 2 * steps + 64
    one = 1 << w
    base_lo, base_hi = exp_neg_bounds(gamma.numerator, gamma.denominator, w)
    table_lo, table_hi = [base_lo], [base_hi]
    for _ in range(1, steps):
        table_lo.append((table_lo[-1] * table_lo[-1]) >> w)
        table_hi.append(_ceil_div(table_hi[-1] * table_hi[-1], one))
    shift = w - p
    unit = 1 << shift
    lower, upper = [], []
    for d in shifted:
        e = min(d, cap)
        lo = hi = one
        for j in range(steps):  # the same products for every e: a 0 bit multiplies by 1
            bit = (e >> j) & 1
            lo = _product_down(lo, table_lo[j] if bit else one, w)
            hi = _product_up(hi, table_hi[j] if bit else one, w)
        lower.append(lo >> shift if d < cap else 0)
        upper.append(_ceil_div(hi, unit))
    return lower, upper


def _boundary_bounds(shifted: list[int], gamma: Fraction, p: int) -> tuple[list[int], list[int]]:
    """Integers (B_lo, B_hi), each non-decreasing, with B_lo[k] <= 2^p S_k / Z <= B_hi[k], k = 0..m-1.

    S_k / Z = S_k / (S_k + T_k) (T_k the weights after k) increases with S_k and decreases with T_k, so it lies
    between SL_k / (SL_k + TU_k) and SU_k / (SU_k + TL_k), SL and SU the prefix sums of the weight bounds, TL and TU
    their suffix sums (both denominators are positive: Z's bounds include the exact 2^p of the smallest distance).
    """
    lower, upper = _weight_bounds(shifted, gamma, p)
    total_lo, total_hi = sum(lower), sum(upper)
    b_lo, b_hi = [], []
    s_lo = s_hi = 0
    for lo, hi in zip(lower, upper):
        s_lo += lo
        s_hi += hi
        t_lo, t_hi = total_lo - s_lo, total_hi - s_hi  # the suffix sums after k
        b_lo.append((s_lo << p) // (s_lo + t_hi))
        b_hi.append(_ceil_div(s_hi << p, s_hi + t_lo))
    return b_lo, b_hi


def _uniform_bits(n: int) -> int:
    """n fresh uniform bits from the OS CSPRNG, as an integer in [0, 2^n)."""
    return int.from_bytes(os.urandom((n + 7) // 8), "big") >> (-n % 8)


def _draws(distances: object, gamma: object, size: int, precision: int | None) -> list[int]:
    d = _integer_list(distances, "distances")
    g = Fraction(as_positive_rational(gamma, "gamma"))
    if precision is not None and (isinstance(precision, bool) or not isinstance(precision, int) or precision < 1):
        raise ValueError(f"_precision must be a positive int, got {precision!r}")
    low = min(d)
    shifted = [x - low for x in d]
    first = start_precision(len(d)) if precision is None else precision
    # the bounds depend on the precision only, not on V: one computation serves every draw of this call
    boundaries = {first: _boundary_bounds(shifted, g, first)}
    out = []
    for _ in range(size):
        p, a = first, _uniform_bits(first)  # V in [a, a + 1) / 2^p
        while True:
            b_lo, b_hi = boundaries[p]
            k = bisect_left(b_lo, a + 1)  # the first k with V < S_k / Z certified (k = m - 1 at the latest)
            if k == 0 or a >= b_hi[k - 1]:  # and V >= S_(k-1) / Z certified: k(V) = k
                out.append(k)
                break
            a = (a << p) | _uniform_bits(p)  # V's next p bits: the same V, known twice as finely
            p *= 2
            if p not in boundaries:
                boundaries[p] = _boundary_bounds(shifted, g, p)
    return out


def sample_exponential_mechanism(
    distances: Sequence[int] | np.ndarray, gamma: Fraction, *, _precision: int | None = None
) -> int:
    """Draw index i with probability exactly exp(-gamma d_i) / sum_j exp(-gamma d_j).

    Exact: the index is min{k : V < S_k / Z} for a uniform V written lazily from the OS CSPRNG, decided only when
    rigorous integer bounds certify it (see the module docstring). The work at the first precision
    (:func:`start_precision`) is fixed by m = len(distances) and gamma; further precision, the only data-dependent
    work, is needed with probability below 2 m^2 2^-p (below 2^-127).

    Args:
        distances: shape (m,), m >= 1: non-negative ints d_i (Python ints of any size, or an integer numpy array);
            the utility of candidate i is -d_i.
        gamma: positive rational, per unit of distance (a Fraction; an int, Decimal or a float read as its decimal).
        _precision: the first precision in bits, for tests of the refinement (default :func:`start_precision`).

    Returns:
        the index i in [0, m), a Python int.

    Raises:
        TypeError: distances not ints (floats and bools refused by type). ValueError: distances empty or negative;
        gamma not positive and finite.

    Source: McSherry & Talwar 2007 ("Mechanism design via differential privacy", FOCS); the exactness concern of
    Mironov 2012 ("On significance of the least significant bits for differential privacy", CCS) and Ilvento 2020
    ("Implementing the exponential mechanism with base-2 differential privacy", CCS).
    """
    return _draws(distances, gamma, 1, _precision)[0]


def sample_exponential_mechanism_vector(
    distances: Sequence[int] | np.ndarray, gamma: Fraction, size: int, *, _precision: int | None = None
) -> list[int]:
    """``size`` independent draws of :func:`sample_exponential_mechanism` on the same distances and gamma.

    The bounds are computed once per precision and shared by the draws (they do not depend on V), so each draw
    costs one binary search; each draw has its own V. Returns a list of ``size`` Python ints. Raises as
    :func:`sample_exponential_mechanism`, and ValueError for a size that is not a non-negative int.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    return _draws(distances, gamma, size, _precision)


def exponential_mechanism_probabilities(distances: Sequence[int] | np.ndarray, gamma: Fraction) -> np.ndarray:
    """The law of :func:`sample_exponential_mechanism` in float64, for tests and benchmarks (never for sampling).

    P(i) = exp(-gamma d_i) / sum_j exp(-gamma d_j), computed as exp(-x_i) / sum_j exp(-x_j) with
    x_i = gamma (d_i - min d) exact before its conversion to float (a log-sum-exp shift: no overflow, and the
    largest term is exactly 1). Returns shape (m,) float64 summing to 1 up to rounding. Raises as the sampler.
    """
    d = _integer_list(distances, "distances")
    g = Fraction(as_positive_rational(gamma, "gamma"))
    low = min(d)
    exponents = np.array([float(g * (x - low)) for x in d], dtype=np.float64)
    weights = np.exp(-exponents)
    return weights / math.fsum(weights)


def _records_per_unit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"records_per_unit must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"records_per_unit must be at least 1, got {value!r}")
    return int(value)


def sample_quantile_bin(
    counts: Sequence[int] | np.ndarray, quantile: Fraction, epsilon: Fraction, records_per_unit: int
) -> int:
    """Release the index of a bin near the q-quantile of a histogram by the exponential mechanism, exactly.

    gamma = epsilon / (k W), k = ``records_per_unit``, W = :func:`bounded_range_width` (quantile); the scores are
    -:func:`quantile_rank_distances` (counts, quantile). One privacy unit adding or removing at most k records moves
    every score within an interval of width k W, so the log-probability ratio of any output between neighbours lies
    in [-epsilon, epsilon] and its range over outputs is at most epsilon: the mechanism is epsilon-bounded-range
    (Durfee & Rogers 2019), hence epsilon-DP and epsilon^2/8-zCDP (Cesar & Rogers 2021, "Bounding, concentrating,
    and truncating: unifying privacy loss composition for data analytics", ALT). The bins' edges are
    public; an empty bin is a candidate like any other.

    Accuracy: with probability at least 1 - beta the released bin's rank interval is within
    :func:`rank_error_bound` records of the target rank qN (the utility theorem of McSherry & Talwar 2007).

    Args:
        counts: shape (m,): record counts of public ordered bins (non-negative ints, or an integer numpy array).
        quantile: q in (0, 1), exact. epsilon: positive rational (pure-DP epsilon). records_per_unit: k >= 1, the
            records one privacy unit may add or remove in total (after contribution bounding).

    Returns:
        the released bin index in [0, m), a Python int.

    Raises:
        TypeError: counts not ints; records_per_unit not an int. ValueError: empty or negative counts, quantile
        outside (0, 1), epsilon not positive and finite, records_per_unit below 1.
    """
    epsilon = Fraction(as_positive_rational(epsilon, "epsilon"))
    k = _records_per_unit(records_per_unit)
    distances = quantile_rank_distances(counts, quantile)
    gamma = epsilon / (k * bounded_range_width(quantile))
    return sample_exponential_mechanism(distances, gamma)


def _float_not_above(value: Fraction) -> float:
    rounded = float(value)
    return math.nextafter(rounded, 0.0) if rounded > value else rounded


def rank_error_bound(m: int, quantile: Fraction, epsilon: Fraction, records_per_unit: int, beta: float) -> float:
    """Records t such that, with probability at least 1 - beta, :func:`sample_quantile_bin` releases a bin whose
    rank interval is within t records of the target rank qN: t = k W (ln m + ln(1/beta)) / (b epsilon).

    Proof: gamma = epsilon / (k W) per unit of distance (1/b record); the best bin has distance 0 and weight 1, so
    the bins at distance above s carry probability at most (m - 1) exp(-gamma s) < m exp(-gamma s) = beta for
    s = (ln m + ln(1/beta)) / gamma (the utility theorem of McSherry & Talwar 2007). Depends on public parameters only.

    Units: records. The float is rounded up: epsilon and beta are rounded down to floats, and the result carries a
    margin of 8 units in the last place for the rounding of the logarithms and products, then one step up.

    Raises:
        ValueError: m not a positive int; quantile or beta not strictly between 0 and 1; epsilon not positive;
        records_per_unit below 1. TypeError: records_per_unit not an int.
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m (the number of bins) must be a positive int, got {m!r}")
    q = _quantile(quantile)
    k = _records_per_unit(records_per_unit)
    eps = _float_not_above(Fraction(as_positive_rational(epsilon, "epsilon")))
    beta_f = _float_not_above(Fraction(as_open_unit_interval(beta, "beta")))
    if eps == 0.0 or beta_f == 0.0:  # below the smallest float: no finite bound to give
        return math.inf
    width = bounded_range_width(q)
    value = width * k * (math.log(m) - math.log(beta_f)) / (q.denominator * eps)
    return math.nextafter(value + 8 * value * 2.0**-52, math.inf)
