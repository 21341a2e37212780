"""Vectorised exact discrete Laplace sampler for large rational scales (issue 11, item 1; ADR 22).

``vectorised.sample_discrete_laplace_array`` keeps one inverse-CDF table of the magnitude for scales up to
``TABLE_SCALE_LIMIT`` (2^14) and draws larger ones through ``vectorised_envelope`` up to 2^56; between 2^56 and
2^60 it uses this module, which draws the same law exactly from a few small tables, by factorising the geometric
law into independent digits. ``geometric_table`` also gives ``vectorised_envelope`` its Laplace block index.

Distribution: P(X = x) = tanh(1/(2b)) q^|x|, q = exp(-1/b), x in Z, b = t/s > 0 rational (Canonne, Kamath,
Steinke 2020; the law of ``samplers.sample_discrete_laplace`` and of ``vectorised``). tanh(1/(2b)) = (1-q)/(1+q).

Proof of exactness
------------------
1. **Sign and zero.** Let S take the values 0, 1, 2 with P(S=0) = (1-q)/(1+q), P(S=1) = P(S=2) = q/(1+q)
   (these sum to 1), and G be geometric, P(G = g) = (1-q) q^g for g >= 0, independent of S. Put X = 0 if S = 0,
   X = 1 + G if S = 1, X = -(1 + G) if S = 2. Then P(X = 0) = (1-q)/(1+q), and for x != 0
   P(X = x) = q/(1+q) * (1-q) q^(|x|-1) = (1-q)/(1+q) q^|x|: the discrete Laplace pmf, exactly.
   (Equivalently X = G1 - G2 for i.i.d. geometrics: for x >= 0, sum_g (1-q)^2 q^(g+x) q^g = (1-q)/(1+q) q^x;
   the route above needs one geometric instead of two.)
2. **Quotient and remainder.** For K = 2^k, write G = K A + R with A = G // K, R = G mod K; (a, r) <-> g is a
   bijection N x {0..K-1} -> N. P(A = a, R = r) = (1-q) q^(Ka + r) = [(1 - q^K) (q^K)^a] * [(1-q) q^r / (1-q^K)],
   a product of a function of a and a function of r, each summing to 1 (geometric sums), so A and R are
   independent, A geometric with ratio q^K, and R truncated geometric on {0..K-1}, P(R = r) proportional to q^r.
3. **Digits.** With k = d_1 + ... + d_L and e_i = d_1 + ... + d_(i-1), every r in {0..K-1} is uniquely
   r = sum_i 2^(e_i) D_i with digits D_i in {0..2^(d_i)-1}, and q^r = prod_i (q^(2^(e_i)))^(D_i) factorises, so
   the D_i are independent, D_i truncated geometric on {0..2^(d_i)-1} with ratio q^(2^(e_i)) (the brief's
   R = K2 B + C is the case L = 2).
4. **Each factor by inverse CDF on 64-bit words** (the argument of ``vectorised``, whose ``_magnitudes`` is
   reused): a factor F with CDF H(j) = P(F <= j) is min{j : V < H(j)} for V uniform on [0, 1) read in binary
   from the OS CSPRNG. Its table holds F_j = floor(2^64 H(j)), each *proven* (floor of a rigorous lower and upper
   bound agree; bounds from ``vectorised_bounds.exp_neg_bounds`` with directed rounding, never a float). A word U
   with F_(j-1) < U < F_j decides F = j; a word equal to a floor is refined with more words against bounds at a
   higher precision (``cdf_bounds``); the last entry of a finite factor (H = 1) is stored as 2^64 - 1, which only
   sends the word 2^64 - 1 to refinement, where H = 1 is exact. Nothing is rejected, so each factor has its law
   exactly. For the truncated factor H(j) = (1 - r^(j+1)) / (1 - r^n) (ratio r, support {0..n-1}); for A,
   H(j) = 1 - r^(j+1). Every table reaches 2^64 - 1 (A: K > b so r < 1/e and at most 45 entries), so no
   word lies beyond it; refinement past the table's end uses ``cdf_bounds`` directly.
5. **Independence.** All factors of all draws read disjoint stretches of one stream of i.i.d. uniform words; how
   many words a draw reads depends only on the words it has read, so the draws are independent (each is a
   stopping-time functional of the i.i.d. stream, the rest of which stays i.i.d. and independent of it).

So X = sign(S) (1 + K A + sum_i 2^(e_i) D_i) has the discrete Laplace law exactly. Integer arithmetic only from
random bits to output: uint64 words, uint64 comparisons, int64 (or Python ints in object arrays when
K (max A + 1) exceeds int64) shifts, products and sums.

Parameters: K = 2^k with k the bit length of ceil(b) (2^(k-1) <= ceil(b) < 2^k, so b < K <= 2 ceil(b) and the
quotient's ratio q^K = exp(-K/b) lies in [about e^-2, e^-1): 23-45 table entries), L = ceil(k / 20) digits of
balanced sizes d_i <= 20 (each table at most 2^20 entries, about 2^(k/L)). At b = 10^7: two 4096-entry digit
tables; b = 2^50: three 2^17-entry tables. Per draw: 2 + L uint64 words.
Randomness: ``os.urandom`` in blocks (through ``vectorised.os_words``); no seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from dp_operators.mechanisms._rational import as_positive_rational
from dp_operators.mechanisms.vectorised import MagnitudeTable, WordSource, _magnitudes, os_words
from dp_operators.mechanisms.vectorised_bounds import _ceil_div, exp_neg_bounds

__all__ = ["LARGE_SCALE_LIMIT", "sample_discrete_laplace_large"]

LARGE_SCALE_LIMIT = Fraction(1 << 60)  # above it: more digits and slower tables; vectorised uses the scalar sampler
_DIGIT_BITS = 20  # each digit table has at most 2^20 entries
_CHUNK = 1 << 20  # draws per block: bounded temporary memory
_TOP = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1


def _geometric_cdf_bounds(num: int, den: int, n: int | None, k: int, p: int) -> tuple[int, int]:
    """(lo, hi) with lo <= 2^p H(k) <= hi for the geometric with ratio r = exp(-num/den) truncated to {0..n-1}
    (n None: not truncated): H(k) = (1 - r^(k+1)) / (1 - r^n), or 1 - r^(k+1).

    r^(k+1) and r^n come straight from ``exp_neg_bounds`` at w = p + guard bits, the guard covering the relative
    precision lost in 1 - r^j when num/den is tiny (about log2(den/num) bits). Exact 2^p for k >= n - 1.
    """
    if n is not None and k >= n - 1:
        return 1 << p, 1 << p
    guard = max(0, den.bit_length() - num.bit_length()) + 64
    w = p + guard
    one = 1 << w
    e_lo, e_hi = exp_neg_bounds((k + 1) * num, den, w)
    top_lo, top_hi = one - e_hi, one - e_lo  # 2^w (1 - r^(k+1))
    if n is None:
        return max(0, top_lo) >> guard, min(1 << p, _ceil_div(top_hi, 1 << guard))
    n_lo, n_hi = exp_neg_bounds(n * num, den, w)
    bot_lo, bot_hi = one - n_hi, one - n_lo  # 2^w (1 - r^n) > 0
    if bot_lo <= 0 or top_lo < 0:  # not resolved at this precision: the trivial bounds (refinement raises p)
        return 0, 1 << p
    return (top_lo << p) // bot_hi, min(1 << p, _ceil_div(top_hi << p, bot_lo))


@lru_cache(maxsize=32)
def geometric_table(num: int, den: int, n: int | None) -> MagnitudeTable:
    """Proven floors F_j = floor(2^64 H(j)) of the (truncated) geometric with ratio exp(-num/den) (see
    ``_geometric_cdf_bounds``), j = 0..J, J the first j with F_j = 2^64 - 1 (or n - 1, stored as 2^64 - 1:
    H(n-1) = 1), as a ``vectorised.MagnitudeTable`` (not memoryless: refinement past J uses the bounds).

    Powers r^(j+1) are carried at w bits with floor (lower) and ceiling (upper) rounding; F_j is accepted only
    when the floors of the lower and upper bound of 2^64 H(j) agree, else the table is rebuilt with 64 more bits.
    Raises ValueError if an untruncated table would exceed 2^20 entries (ratio too close to 1).
    """
    limit = 1 << _DIGIT_BITS
    if n is not None and n > limit:
        raise ValueError(f"a truncated factor has at most {limit} values, got {n}")
    count = limit if n is None else n - 1  # entries computed from bounds; a finite table adds its last (H = 1)
    guard = 64 + max(0, den.bit_length() - num.bit_length()) + 2 * count.bit_length() + 16
    while True:
        w = 64 + guard
        one = 1 << w
        r_lo, r_hi = exp_neg_bounds(num, den, w)
        if n is None:
            bot_lo = bot_hi = one
        else:
            n_lo, n_hi = exp_neg_bounds(n * num, den, w)
            bot_lo, bot_hi = one - n_hi, one - n_lo
        pw_lo, pw_hi = r_lo, r_hi  # bounds on 2^w r^(j+1)
        floors: list[int] = []
        ok = bot_lo > 0
        for _ in range(count if ok else 0):
            f = ((one - pw_hi) << 64) // bot_hi
            if f < 0 or f != ((one - pw_lo) << 64) // bot_lo:
                ok = False
                break
            floors.append(f)
            if f == _TOP:
                break
            pw_lo = (pw_lo * r_lo) >> w
            pw_hi = _ceil_div(pw_hi * r_hi, one)
        if ok:
            break
        guard += 64
    if not floors or floors[-1] != _TOP:
        if n is None:
            raise ValueError(f"geometric ratio exp(-{num}/{den}) needs more than {limit} table entries")
        floors.append(_TOP)  # H(n-1) = 1; only the word 2^64 - 1 meets it, and its refinement is exact
    return MagnitudeTable(
        np.array(floors, dtype=np.uint64), lambda k, p: _geometric_cdf_bounds(num, den, n, k, p), False
    )


def _sign_cdf_bounds(t: int, s: int, k: int, p: int) -> tuple[int, int]:
    """Bounds at 2^p of the CDF of S: H(0) = (1-q)/(1+q), H(1) = 1/(1+q), H(2) = 1, q = exp(-s/t)."""
    if k >= 2:
        return 1 << p, 1 << p
    w = p + 64
    one = 1 << w
    q_lo, q_hi = exp_neg_bounds(s, t, w)
    if k == 0:  # (1-q)/(1+q) decreases in q
        return ((one - q_hi) << p) // (one + q_hi), _ceil_div((one - q_lo) << p, one + q_lo)
    return (one << p) // (one + q_hi), _ceil_div(one << p, one + q_lo)


@lru_cache(maxsize=32)
def sign_table(t: int, s: int) -> MagnitudeTable:
    """Proven floors of S's CDF (values 0, 1, 2; see the module docstring), the last stored as 2^64 - 1."""
    extra = 64
    while True:
        bounds = [_sign_cdf_bounds(t, s, k, 64 + extra) for k in (0, 1)]
        floors = [lo >> extra for lo, _ in bounds]
        if floors == [hi >> extra for _, hi in bounds]:
            break
        extra += 64
    return MagnitudeTable(
        np.array(floors + [_TOP], dtype=np.uint64), lambda k, p: _sign_cdf_bounds(t, s, k, p), False
    )


@dataclass(frozen=True)
class LargeScalePlan:
    """The factorisation for scale t/s: K = 2^k, digit shifts e_i and sizes d_i, and the factor tables."""

    k: int
    shifts: tuple[int, ...]
    sign: MagnitudeTable
    quotient: MagnitudeTable  # A, geometric with ratio q^K
    digits: tuple[MagnitudeTable, ...]  # D_i, truncated geometric with ratio q^(2^e_i) on {0..2^d_i - 1}


def digit_split(k: int) -> list[int]:
    """Balanced digit sizes d_1 >= ... >= d_L summing to k, L = ceil(k / 20) (no digit when k = 0)."""
    n = -(-k // _DIGIT_BITS)
    return [k // n + (1 if i < k % n else 0) for i in range(n)] if n else []


@lru_cache(maxsize=16)
def large_scale_plan(t: int, s: int) -> LargeScalePlan:
    """The cached plan for scale t/s (t, s > 0 coprime ints): tables built once per scale."""
    k = (-(-t // s)).bit_length()  # 2^k > ceil(t/s) - 1, so 2^k >= t/s
    sizes = digit_split(k)
    shifts = tuple(sum(sizes[:i]) for i in range(len(sizes)))
    # q^(2^e) = exp(-(2^e s)/t); the fraction need not be reduced for exp_neg_bounds
    digits = tuple(geometric_table(s << e, t, 1 << d) for e, d in zip(shifts, sizes))
    return LargeScalePlan(k, shifts, sign_table(t, s), geometric_table(s << k, t, None), digits)


def _draw(plan: LargeScalePlan, n: int, words: WordSource) -> np.ndarray:
    """n exact draws (int64, or object when a magnitude exceeds int64)."""
    sign = _magnitudes(plan.sign, n, words)
    quotient = _magnitudes(plan.quotient, n, words)
    big = int(quotient.max(initial=0)) + 1 > _I64_MAX >> plan.k  # K (max A + 1) >= max magnitude
    magnitude = quotient.astype(object) << plan.k if big else quotient << np.int64(plan.k)
    for table, e in zip(plan.digits, plan.shifts):
        d = _magnitudes(table, n, words)  # < 2^20, and D_i 2^e_i < K
        magnitude = magnitude + (d.astype(object) << e if big else d << np.int64(e))
    magnitude = magnitude + 1
    zero = np.zeros(1, dtype=magnitude.dtype)
    return np.where(sign == 0, zero, np.where(sign == 1, magnitude, -magnitude))


def sample_discrete_laplace_large(scale: Fraction | int, size: int, *, _words: WordSource = os_words) -> np.ndarray:
    """Draw ``size`` independent discrete Laplace integers with scale ``scale`` (exact; module docstring).

    pmf: P(x) = tanh(1/(2 scale)) exp(-|x|/scale), x in Z (CKS 2020), scale in units of the integer aggregate.
    ``vectorised`` uses it for scales in (2^56, 2^60], where it is about 100 times the scalar sampler; exact for
    every scale in (0, 2^60]. Tables are built once per scale (0.01 s at 10^7, 0.1 s at 10^9, 0.6 s at 2^50) and
    cached.

    Args:
        scale: positive finite rational (int, Fraction, Decimal, or float read as its decimal), at most 2^60.
        size: number of draws (non-negative int).

    Returns:
        shape (size,) array, dtype int64; dtype object (Python ints) if some value does not fit in int64 (at
        scale 2^60, a draw beyond 2^63 has probability about e^-8 each).

    Raises:
        ValueError: scale NaN, infinite, <= 0, bool or above ``LARGE_SCALE_LIMIT``; size not a non-negative
        int. TypeError: scale not a number.
    """
    scale = as_positive_rational(scale, "scale")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    if scale > LARGE_SCALE_LIMIT:
        raise ValueError(f"scale must be at most 2^60 for this sampler, got {scale}")
    plan = large_scale_plan(scale.numerator, scale.denominator)
    parts = [_draw(plan, min(_CHUNK, size - start), _words) for start in range(0, size, _CHUNK)]
    return join_draws(parts)


def join_draws(parts: list[np.ndarray]) -> np.ndarray:
    """Chunks of draws as one array: int64 when every value fits (the usual case), else object (Python ints)."""
    if not parts:
        return np.zeros(0, dtype=np.int64)
    if any(p.dtype == object for p in parts):
        out = np.concatenate([p.astype(object) for p in parts])
        if all(-_I64_MAX - 1 <= int(v) <= _I64_MAX for v in out):
            return out.astype(np.int64)
        return out
    return np.concatenate(parts) if len(parts) > 1 else parts[0]
