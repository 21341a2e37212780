"""Vectorised exact discrete Laplace and discrete Gaussian samplers for large scales: a block envelope (ADR 22).

An inverse-CDF table of the magnitude (``vectorised``) needs about 44 b entries for a Laplace scale b and 9.4 sigma
for a Gaussian, too many above b = 2^14 or sigma^2 = 2^20. Here the magnitude is drawn in blocks of W = 2^w
integers, W about a thousandth of the scale, so that one table over the block index stays small (about 45,000
entries for the Laplace, 20,000 for the Gaussian) and the position inside a block is corrected by an exact
rejection whose acceptance is above 1 - 2^-9.

Distributions (Canonne, Kamath, Steinke 2020; the laws of ``samplers`` and ``vectorised``): X in Z with
P(X = x) proportional to exp(-phi(|x|)), phi(m) = m s/t for the discrete Laplace at scale b = t/s, and
phi(m) = m^2 q/(2 p) for the discrete Gaussian with sigma^2 = p/q.

Proof of exactness
------------------
1. **Magnitude and sign.** Let M >= 0 have P(M = m) proportional to v(m) = exp(-phi(m)), and a fair sign bit be
   independent of it; output X = M or -M, and reject the pair (negative, 0). Then P(X = x) is proportional to v(|x|)
   for every x in Z (0 is reached only with the positive sign): the stated law, exactly. The rejected event has
   probability P(M = 0)/2, below 1/(2 b) or 1/(2 sigma).
2. **Block envelope.** Write m = I W + R, I >= 0, 0 <= R < W. Draw I with P(I = i) proportional to v(i W) (the
   table below) and R uniform on {0..W-1} (w raw bits), so the proposal has P(m) proportional to v(I W). phi is
   increasing on m >= 0, so a(m) = v(m) / v(I W) = exp(-(phi(m) - phi(I W))) lies in (0, 1]; accept with probability
   a(m). Rejection sampling: an accepted m has P(m) proportional to v(I W) a(m) = v(m), i.e. the law of M, exactly;
   a rejected proposal is replaced by a fresh one. phi(m) - phi(I W) = n c with an integer n and a rational c:
   n = R, c = s/t (Laplace); n = R (2 I W + R), c = q/(2 p) (Gaussian). At W about scale/2^10 the exponent is at
   most about 2^-10 (Laplace) or 10/2^10 (Gaussian, over the table's reach).
3. **The block index by inverse CDF on 64-bit words** (the argument of ``vectorised``, whose ``_magnitudes`` is
   reused): P(I <= i) is H(i) = 1 - r^(i+1) with r = exp(-W s/t) (``vectorised_large.geometric_table``) or
   B_i / T with B_i = sum_{j<=i} v(j W) and T the infinite sum (``vectorised_bounds.gaussian_block_floor_table``),
   floors proven by integer bounds, undecided words refined with more words, tables reaching 2^64 - 1.
4. **The acceptance test, exactly.** The word giving R also gives the test: its low w bits are R and its top
   64 - w bits are the first bits of a uniform V in [0, 1) independent of R (disjoint bits of a uniform word);
   accept iff V < exp(-n c), an event of probability a(m) exactly. The comparison is certified without a float:
   with h = 2^z c <= 2^-16 (z the largest such shift, or 0), the bracket j = n >> z places n c in [j h, (j+1) h);
   since exp is decreasing, V's bits below floor(2^(64-w) e_lo(j+1)) accept and bits above
   ceil(2^(64-w) e_hi(j)) - 1 reject, where e_lo(j) <= exp(-j h) <= e_hi(j) are integer bounds carried with
   directed rounding from bounds on exp(-h). Otherwise (probability about 2^-16, or n past the last bracket) V is
   compared with exp(-n c) itself through ``vectorised_bounds.exp_neg_bounds`` at a precision above V's length,
   appending 64 fresh bits to V until the bounds decide (exp(-n c) is irrational for n c > 0, and 1 for n = 0, so
   this ends with probability 1).
5. **Independence.** Each proposal reads its own words of one i.i.d. stream from the OS CSPRNG, and how many it
   reads depends only on the words it has read; the outputs are the accepted proposals in order, so the draws are
   i.i.d. with the law above.

Integer arithmetic only from random bits to output: uint64 words and comparisons, int64 indices, products and sums
(``GAUSSIAN_SIGMA2_LIMIT`` and ``LAPLACE_SCALE_LIMIT`` keep I W + R and n inside int64 over the tables' reach; an
index beyond it is handled in Python ints). Randomness: ``os.urandom`` through ``vectorised.os_words``; no seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from dp_operators.mechanisms._rational import as_positive_rational
from dp_operators.mechanisms.vectorised import MagnitudeTable, WordSource, _magnitudes, os_words
from dp_operators.mechanisms.vectorised_bounds import (
    _ceil_div,
    exp_neg_bounds,
    gaussian_block_cdf_bounds,
    gaussian_block_floor_table,
)
from dp_operators.mechanisms.vectorised_large import geometric_table, join_draws

__all__ = [
    "GAUSSIAN_SIGMA2_LIMIT",
    "LAPLACE_SCALE_LIMIT",
    "sample_discrete_gaussian_envelope",
    "sample_discrete_laplace_envelope",
]

#: The largest Laplace scale drawn here: I W + R stays below 2^63 over the table's reach (about 45 b).
LAPLACE_SCALE_LIMIT = Fraction(1 << 56)
#: The largest sigma^2 drawn here: n = R (2 I W + R) stays below 2^62 over the table's reach.
GAUSSIAN_SIGMA2_LIMIT = Fraction(1 << 60)
_BLOCKS_PER_SCALE_BITS = 10  # W is about scale / 2^10: acceptance above 1 - 2^-9, tables of 10^4 - 10^5 entries
_N_BITS = 16  # brackets of width at most 2^-16 in the exponent: about one proposal in 65,536 is tested exactly
_CHUNK = 1 << 16  # proposals per block: bounded temporary memory, and arrays that stay in cache (1.4x at 2^16)
_I64_MAX = (1 << 63) - 1
_TOP = (1 << 64) - 1


@dataclass(frozen=True)
class EnvelopePlan:
    """The block envelope of one law (module docstring): block width 2^w, the block index table, the acceptance
    exponent's rational c = c_num / c_den (exponent n c), its brackets and certified bounds."""

    w: int
    gaussian: bool
    blocks: MagnitudeTable
    c_num: int
    c_den: int
    shift: int  # bracket j = n >> shift: n c in [j h, (j+1) h), h = 2^shift c <= 2^-16 (or shift 0)
    accept_below: np.ndarray  # uint64, floor(2^(64-w) * lower bound of exp(-(j+1) h)); 0 at the last entry
    reject_from: np.ndarray  # uint64, ceil(2^(64-w) * upper bound of exp(-j h)) - 1; 2^64 - 1 at the last entry
    index_limit: int  # largest block index whose n and I W + R are computed in int64


def _certified_brackets(c_num: int, c_den: int, w: int, x_max: Fraction) -> tuple[int, np.ndarray, np.ndarray]:
    """(shift, accept_below, reject_from) for exponents n c in [0, x_max] (module docstring, step 4).

    Bracket j holds the integers n with n >> shift = j, so n c lies in [j h, (j+1) h) with h = 2^shift c, shift
    the largest with h <= 2^-16 (or 0). The bounds come from one ratio exp(-h) bounded at 128 bits and carried
    with floor (lower) and ceiling (upper) rounding; the entry past the last bracket always refines.
    """
    shift = max(0, (c_den // (c_num << _N_BITS)).bit_length() - 1)  # 2^shift <= c_den / (2^16 c_num)
    count = int(x_max / (Fraction(c_num << shift, c_den))) + 2
    bits = 64 - w
    prec = 128
    e_lo, e_hi = exp_neg_bounds(c_num << shift, c_den, prec)  # exp(-h)
    lo, hi = 1 << prec, 1 << prec  # bounds on 2^prec exp(-j h), j = 0
    accept, reject = [], []
    for _ in range(count):
        nxt_lo, nxt_hi = (lo * e_lo) >> prec, _ceil_div(hi * e_hi, 1 << prec)
        accept.append(nxt_lo >> (prec - bits))  # floor(2^bits * lower bound of exp(-(j+1) h))
        reject.append(_ceil_div(hi, 1 << (prec - bits)) - 1)  # ceil(2^bits * upper bound of exp(-j h)) - 1
        lo, hi = nxt_lo, nxt_hi
    accept.append(0)
    reject.append(_TOP)
    return shift, np.array(accept, dtype=np.uint64), np.array(reject, dtype=np.uint64)


def _block_bits(scale_bits: int) -> int:
    return max(0, scale_bits - _BLOCKS_PER_SCALE_BITS)


@lru_cache(maxsize=16)
def laplace_envelope(t: int, s: int) -> EnvelopePlan:
    """The cached plan for the discrete Laplace at scale t/s (t, s > 0 coprime ints): W = 2^w with
    w = max(0, floor(log2(t/s)) - 10), block index geometric with ratio exp(-W s/t), exponent n = R, c = s/t."""
    w = _block_bits((t // s).bit_length() - 1)
    blocks = geometric_table(s << w, t, None)
    x_max = Fraction(s << w, t)  # R < W
    shift, accept, reject = _certified_brackets(s, t, w, x_max)
    index_limit = (_I64_MAX >> w) - 1  # (I + 1) W <= 2^63 - 1
    return EnvelopePlan(w, False, blocks, s, t, shift, accept, reject, index_limit)


@lru_cache(maxsize=16)
def gaussian_envelope(p: int, q: int) -> EnvelopePlan:
    """The cached plan for the discrete Gaussian with sigma^2 = p/q (coprime ints): W = 2^w with
    w = max(0, floor(log2 sigma) - 10), block index with P(I = i) proportional to exp(-(i W)^2 q/(2 p)), exponent
    n = R (2 I W + R), c = q/(2 p)."""
    w = _block_bits(((p // q).bit_length() - 1) // 2)
    floors = gaussian_block_floor_table(p, q << (2 * w), 1 << 20)
    if floors is None:  # not reached for W about sigma / 2^10: the table has about 9.4 * 2^11 entries at most
        raise ValueError(f"sigma2 {p}/{q}: block table above 2^20 entries")
    blocks = MagnitudeTable(
        np.array(floors, dtype=np.uint64), lambda k, prec: gaussian_block_cdf_bounds(p, q << (2 * w), k, prec), False
    )
    reach = len(floors) + 8  # the exact refinement may pass the last floor, with probability below 2^-64
    x_max = Fraction((2 * reach + 1) * q << (2 * w), 2 * p)  # R (2 I W + R) q/(2 p) < (2 I + 1) W^2 q/(2 p)
    shift, accept, reject = _certified_brackets(q, 2 * p, w, x_max)
    index_limit = ((1 << 62) >> (2 * w)) // 2 - 1  # R (2 I W + R) < (2 I + 1) W^2 <= 2^62
    return EnvelopePlan(w, True, blocks, q, 2 * p, shift, accept, reject, index_limit)


def _exact_accept(n: int, c_num: int, c_den: int, a: int, m: int, words: WordSource) -> bool:
    """Whether V < exp(-n c_num/c_den), V in [a, a+1)/2^m read further from ``words`` as needed (step 4)."""
    while True:
        p = m + 64
        lo, hi = exp_neg_bounds(n * c_num, c_den, p)
        if (a + 1) << (p - m) <= lo:  # V < (a+1)/2^m <= exp(-n c)
            return True
        if a << (p - m) >= hi:  # V >= a/2^m >= exp(-n c)
            return False
        a = (a << 64) | int(words(1)[0])
        m += 64


def _proposals(plan: EnvelopePlan, size: int, words: WordSource) -> np.ndarray:
    """The accepted magnitudes among ``size`` proposals (at most ``size``; int64, or object beyond the limit)."""
    index = _magnitudes(plan.blocks, size, words)
    u = words(size)
    if u.dtype != np.uint64:  # integer comparison only: a float key would round
        raise TypeError(f"random words must be uint64, got {u.dtype}")
    w = np.uint64(plan.w)
    r = (u & np.uint64((1 << plan.w) - 1)).astype(np.int64)
    v = u >> w  # the first 64 - w bits of V, independent of R
    big = int(index.max(initial=0)) > plan.index_limit
    if big:  # probability below 2^-64 per proposal: Python ints for the whole block
        index, r = index.astype(object), r.astype(object)
    n = r * (2 * (index << plan.w) + r) if plan.gaussian else r
    if big:
        accepted = np.array(
            [_exact_accept(int(k), plan.c_num, plan.c_den, int(a), 64 - plan.w, words) for k, a in zip(n, v)], bool
        )
    else:
        j = np.minimum(n >> np.int64(plan.shift), len(plan.accept_below) - 1)
        accepted = v < plan.accept_below[j]
        undecided = np.flatnonzero(~accepted & (v <= plan.reject_from[j]))
        for i in undecided:
            accepted[i] = _exact_accept(int(n[i]), plan.c_num, plan.c_den, int(v[i]), 64 - plan.w, words)
    return (index[accepted] << plan.w) + r[accepted]


def _signed(plan: EnvelopePlan, size: int, words: WordSource) -> np.ndarray:
    """``size`` exact draws: accepted magnitudes with fair signs, the pair (negative, 0) rejected (step 1)."""
    parts, need = [], size
    while need:
        batch = min(_CHUNK, need + (need >> 6) + 16)  # a few spare proposals: rejection is below 2^-9
        m = _proposals(plan, batch, words)
        negative = np.unpackbits(np.frombuffer(words((len(m) + 63) // 64).tobytes(), np.uint8), count=len(m))
        keep = ~(negative.astype(bool) & (m == 0))
        x = np.where(negative[keep].astype(bool), -m[keep], m[keep])[:need]
        parts.append(x)
        need -= len(x)
    return join_draws(parts)


def _check_size(size: object) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")


def sample_discrete_laplace_envelope(
    scale: Fraction | int, size: int, *, _words: WordSource = os_words
) -> np.ndarray:
    """Draw ``size`` independent discrete Laplace integers at scale ``scale`` (exact; module docstring).

    pmf: P(x) = tanh(1/(2 scale)) exp(-|x|/scale), x in Z (CKS 2020), scale in units of the integer aggregate.
    Meant for scales above 2^14, where ``vectorised``'s single table would be large; exact for every scale in
    (0, ``LAPLACE_SCALE_LIMIT``]. The plan (a block table of about 45,000 proven floors) is built once per scale
    and cached.

    Returns:
        shape (size,) array, dtype int64.

    Raises:
        ValueError: scale NaN, infinite, <= 0, bool or above ``LAPLACE_SCALE_LIMIT`` (2^56); size not a
        non-negative int. TypeError: scale not a number; a word source that is not uint64.
    """
    scale = as_positive_rational(scale, "scale")
    _check_size(size)
    if scale > LAPLACE_SCALE_LIMIT:
        raise ValueError(f"scale must be at most 2^56 for this sampler, got {scale}")
    return _signed(laplace_envelope(scale.numerator, scale.denominator), size, _words)


def sample_discrete_gaussian_envelope(
    sigma2: Fraction | int, size: int, *, _words: WordSource = os_words
) -> np.ndarray:
    """Draw ``size`` independent discrete Gaussian integers N_Z(0, sigma2) (exact; module docstring).

    pmf: P(x) = exp(-x^2/(2 sigma2)) / Z, Z the sum over Z of the same (CKS 2020), sigma2 in squared units of the
    integer aggregate. Meant for sigma2 above 2^20; exact for every sigma2 in (0, ``GAUSSIAN_SIGMA2_LIMIT``]. The plan
    (a block table of at most about 20,000 proven floors) is built once per sigma2 and cached.

    Returns:
        shape (size,) array, dtype int64.

    Raises:
        ValueError: sigma2 NaN, infinite, <= 0, bool or above ``GAUSSIAN_SIGMA2_LIMIT`` (2^60); size not a
        non-negative int. TypeError: sigma2 not a number; a word source that is not uint64.
    """
    sigma2 = as_positive_rational(sigma2, "sigma2")
    _check_size(size)
    if sigma2 > GAUSSIAN_SIGMA2_LIMIT:
        raise ValueError(f"sigma2 must be at most 2^60 for this sampler, got {sigma2}")
    return _signed(gaussian_envelope(sigma2.numerator, sigma2.denominator), size, _words)
