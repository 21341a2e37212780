"""Rigorous integer bounds on exp(-x) and on the discrete Laplace magnitude CDF (used by ``vectorised``).

Every function returns integers ``lo <= 2^p * value <= hi`` proved by directed rounding: each partial product is
rounded down (floor) for the lower bound and up (ceiling) for the upper bound, and the Taylor remainder is bounded
explicitly. No float is involved; the bounds are valid at every precision, and tighten as ``p`` grows (width a
few units of 2^-p times the number of rounded operations), which is all the sampler needs: it only acts on a
comparison when the bounds certify it. A floor table's proof starts at the precision its scale needs
(``gaussian_start_precision``, ``laplace_start_precision``) and restarts 64 bits higher while a floor is unproven.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from math import ceil, isqrt

import numpy as np

#: log2(e) = 1.4426950..., rounded up. It only chooses the precision at which a floor table's proof is first
#: attempted, never a bound: an attempt that does not prove every floor is restarted 64 bits higher.
_LOG2_E_ABOVE = Fraction(14427, 10000)
#: bits added to the precision when an attempt does not prove every floor
PRECISION_STEP = 64


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


@lru_cache(maxsize=64)
def exp_neg_bounds(num: int, den: int, p: int) -> tuple[int, int]:
    """Integers (lo, hi) with lo <= 2^p * exp(-num/den) <= hi, for num >= 0, den > 0, p >= 1.

    exp(-x) = exp(-1)^floor(x) * exp(-frac(x)) (as in CKS 2020 Algorithm 1): both factors are bounded by
    :func:`_exp_neg_taylor_bounds` (arguments at most 1, so a short series) at w = p + 2 bitlen(floor(x)) + 64
    bits, the power by square-and-multiply rounded down for the lower bound and up for the upper one, and the
    product likewise. Every factor lies in [0, 1], so each rounding adds at most one unit of 2^-w to the
    width. A Taylor series for e^x itself would need about e x terms (11,000 at x = 5000, the Gaussian ratio at
    the spec's smallest sigma2).
    """
    whole, rest = divmod(num, den)
    if not whole:
        return _exp_neg_taylor_bounds(num, den, p)
    w = p + 2 * whole.bit_length() + 64
    e_lo, e_hi = _exp_neg_taylor_bounds(1, 1, w)
    f_lo, f_hi = _exp_neg_taylor_bounds(rest, den, w)
    lo = (_pow_floor(e_lo, whole, w) * f_lo) >> w
    hi = _ceil_div(_pow_ceil(e_hi, whole, w) * f_hi, 1 << w)
    return lo >> (w - p), _ceil_div(hi, 1 << (w - p))


def _exp_neg_taylor_bounds(num: int, den: int, p: int) -> tuple[int, int]:
    """Integers (lo, hi) with lo <= 2^p * exp(-num/den) <= hi, for num >= 0, den > 0, p >= 1, from e^x's series.

    e^x (x = num/den) is bounded by the Taylor sum of its first n+1 terms (all positive) below, and above by that
    sum plus the remainder bound x^(n+1)/(n+1)! * 1/(1 - x/(n+2)) (geometric majorant, valid once n+2 > x).
    Terms are computed at 2^w with w = p + 2*bitlen + 32, floored (lower) and ceiled (upper), then inverted.
    """
    w = p + 2 * (num.bit_length() + den.bit_length()) + 64
    one = 1 << w
    lo_sum = hi_sum = 0
    lo_t = hi_t = one  # floor / ceil of 2^w * x^i / i!
    i = 0
    while True:
        lo_sum += lo_t
        hi_sum += hi_t
        i += 1
        lo_t = lo_t * num // (den * i)
        hi_t = _ceil_div(hi_t * num, den * i)
        # remainder after terms 0..i-1 is sum_{j>=i} x^j/j! <= t_i / (1 - x/(i+1)) once (i+1) > x
        if (i + 1) * den > num:
            rem = _ceil_div(hi_t * (i + 1) * den, (i + 1) * den - num)
            if rem * (1 << (p + 8)) <= lo_sum:  # remainder negligible relative to e^x at precision p
                break
    e_lo, e_hi = lo_sum, hi_sum + rem
    # exp(-x) = 1/e^x: floor of the lower over the upper bound of e^x, and ceiling of the other
    return (one << p) // e_hi, _ceil_div(one << p, e_lo)


def _pow_floor(base: int, e: int, w: int) -> int:
    """floor-rounded 2^w (base/2^w)^e by square-and-multiply: a lower bound of the exact power."""
    result, b = 1 << w, base
    while e:
        if e & 1:
            result = (result * b) >> w
        b = (b * b) >> w
        e >>= 1
    return result


def _pow_ceil(base: int, e: int, w: int) -> int:
    """ceiling-rounded 2^w (base/2^w)^e: an upper bound of the exact power."""
    result, b = 1 << w, base
    while e:
        if e & 1:
            result = _ceil_div(result * b, 1 << w)
        b = _ceil_div(b * b, 1 << w)
        e >>= 1
    return result


def laplace_cdf_bounds(t: int, s: int, k: int, p: int) -> tuple[int, int]:
    """(lo, hi) with lo <= 2^p * G(k) <= hi, G(k) = P(|X| <= k) = 1 - 2 q^(k+1) / (1 + q), q = exp(-s/t).

    X is discrete Laplace with scale t/s (pmf tanh(s/2t) q^|x|), k >= 0.
    """
    w = p + 2 * (k + 1).bit_length() + 64
    q_lo, q_hi = exp_neg_bounds(s, t, w)
    # 2 q^(k+1) / (1+q) increases with q in both the power and ... (d/dq of q^m/(1+q) > 0 for m >= 1), so the
    # upper bound of the tail uses q_hi throughout and the lower bound q_lo throughout
    tail_hi = _ceil_div(2 * _pow_ceil(q_hi, k + 1, w) << w, (1 << w) + q_hi)
    tail_lo = (2 * _pow_floor(q_lo, k + 1, w) << w) // ((1 << w) + q_lo)
    shift = w - p
    return ((1 << w) - tail_hi) >> shift, _ceil_div((1 << w) - tail_lo, 1 << shift)


@dataclass(frozen=True)
class ProvenFloors:
    """A floor table with the record of its proof.

    ``floors`` are F_k = floor(2^64 G(k)), k = 0..K, each proven (None when the table would exceed its size cap);
    ``start`` is the precision p (bits below the binary point of the target 2^p G(k)) of the first attempt and
    ``rounds`` the number of attempts: each attempt that leaves a floor unproven restarts at p + 64.
    """

    floors: list[int] | None
    start: int
    rounds: int


def _start_bits(decay_bits: Fraction, exponent: int) -> int:
    """max(64, ceil(decay_bits * j^exponent)) for the first j >= 1 at which decay_bits * j^exponent >= 66.

    The last floor F_K = 2^64 - 1 is proven only by bounds that resolve 1 - G(K), about 2 v_(K+1) for the
    magnitude's unnormalised weight v_j = 2^(-decay_bits * j^exponent) (Laplace q^j: exponent 1; Gaussian
    exp(-j^2/(2 sigma2)): exponent 2). K + 1 is about the first j with v_j below 2^-66 (then 1 - G(j - 1) is below
    2^-64), so the weight to resolve is 2^-(decay_bits * j^exponent): at a small scale (v_1 already below 2^-66,
    K = 0) that is decay_bits itself, log2(e)/(2 sigma2) for the Gaussian, far above 64 bits.
    """
    need = Fraction(66) / decay_bits  # j^exponent >= need
    j = max(1, ceil(need) if exponent == 1 else _ceil_sqrt(ceil(need)))
    return max(64, ceil(decay_bits * j**exponent))


def _ceil_sqrt(n: int) -> int:
    r = isqrt(n)
    return r if r * r == n else r + 1


def laplace_start_precision(t: int, s: int) -> int:
    """The precision (bits) at which the discrete Laplace floor table for scale t/s is first attempted:
    64 bits, or more when q = exp(-s/t) is tiny (a scale below 1/64), about log2(1/q) = log2(e) s/t."""
    return _start_bits(_LOG2_E_ABOVE * Fraction(s, t), 1)


def laplace_floor_table(t: int, s: int, max_len: int) -> list[int]:
    """F_k = floor(2^64 G(k)) for k = 0..K, exactly, where K is the first k with F_k = 2^64 - 1 (then no 64-bit
    word lies beyond the table), or K = max_len - 1 (:func:`laplace_floor_proof` has the proof's record)."""
    return laplace_floor_proof(t, s, max_len).floors


def laplace_floor_proof(t: int, s: int, max_len: int, *, start: int | None = None) -> ProvenFloors:
    """The floor table of :func:`laplace_floor_table` with its proof's record, first attempted at precision
    ``start`` (default :func:`laplace_start_precision`; the floors do not depend on it, only the work does).

    The powers q^(k+1) are carried as floor/ceil bounds at w = p + bitlen(max_len) + 80 bits (one directed
    rounding per step, so after k steps the bounds are within k+1 units plus (k+1) times q's own bound width);
    each F_k is accepted only when floor(2^64 * lower) == floor(2^64 * upper), which proves it. Otherwise the
    table is recomputed with 64 more bits (G(k) is transcendental, so this terminates).

    From the default start at a scale of 64 or more, the same floors are first proven from 128-bit limb products
    in numpy (:func:`_laplace_floors_in_limbs`: 0.13 s CPU instead of 1.1 s for 2^20 entries at scale 10^6), and
    the step-by-step proof runs only if an entry is left unproven there.
    """
    precision = laplace_start_precision(t, s) if start is None else start
    if start is None and t >= _FAST_MIN_SCALE * s and max_len > _FAST_ROW:
        floors = _laplace_floors_in_limbs(t, s, max_len)
        if floors is not None:
            return ProvenFloors(floors, precision, 1)
    first, rounds = precision, 0
    while True:
        rounds += 1
        w = precision + max(max_len, 2).bit_length() + 80
        one = 1 << w
        q_lo, q_hi = exp_neg_bounds(s, t, w)
        den_lo, den_hi = one + q_hi, one + q_lo  # bounds on 2^w (1+q): hi tail uses the smaller denominator
        pw_lo, pw_hi = q_lo, q_hi  # bounds on 2^w q^(k+1)
        shift = w - 64
        top = (1 << 64) - 1
        floors: list[int] = []
        ok = True
        for _ in range(max_len):
            # G = 1 - 2 q^(k+1)/(1+q): lower G uses the upper tail bound (q_hi everywhere), and vice versa
            g_lo = one - _ceil_div((2 * pw_hi) << w, den_lo)
            g_hi = one - ((2 * pw_lo) << w) // den_hi
            f = g_lo >> shift
            # G lies in [g_lo, g_hi] / 2^w, so floor(2^64 G) is proven once both ends give the same floor
            if f != g_hi >> shift:
                ok = False
                break
            floors.append(f)
            if f == top:
                break
            pw_lo = (pw_lo * q_lo) >> w
            pw_hi = _ceil_div(pw_hi * q_hi, one)
        if ok:
            return ProvenFloors(floors, first, rounds)
        precision += PRECISION_STEP


_FAST_ROW = 1024  # k = a * 1024 + b: 1024 powers q^b and one power q^(1024 a) per row
_FAST_MIN_SCALE = 64  # below it the table is short (about 44 scale entries) and q^1024 would underflow 128 bits
_M32 = np.uint64(0xFFFFFFFF)


def _limbs(values: list[int]) -> list[np.ndarray]:
    """Four little-endian 32-bit limbs (uint64 arrays) of 128-bit integers."""
    return [np.array([(v >> (32 * i)) & 0xFFFFFFFF for v in values], dtype=np.uint64) for i in range(4)]


def _product_ceilings(x: list[np.ndarray], y: list[np.ndarray], upper: bool) -> np.ndarray:
    """For 128-bit X (rows) and Y (columns) in limbs, a bound on ceil(X Y / 2^192), elementwise over the outer
    product: below it (``upper`` False) or above it (``upper`` True).

    P = floor(S / 2^128), S the sum of the limb products X_i Y_j 2^(32(i+j)) with i + j >= 3, satisfies
    P <= X Y / 2^128 < P + 5 (the dropped products sum to less than 4 * 2^128). So ceil(P / 2^64) is a lower bound
    of ceil(X Y / 2^192), and ceil((P + 8) / 2^64) an upper one, at most one above it, for X Y / 2^192 below
    2^64 - 8 (so that the upper bound fits uint64; the caller keeps X below 2^128 - 2^67). Column sums hold at
    most eight 32-bit halves, so uint64 never overflows; every operation is an integer one.
    """
    col = {c: np.zeros((len(x[0]), len(y[0])), dtype=np.uint64) for c in range(3, 8)}
    for i in range(4):
        for j in range(4):
            if i + j >= 3:
                prod = x[i][:, None] * y[j][None, :]  # < 2^64
                col[i + j] += prod & _M32
                col[i + j + 1] += prod >> np.uint64(32)
    for c in range(3, 7):
        col[c + 1] += col[c] >> np.uint64(32)
        col[c] &= _M32
    high = (col[7] << np.uint64(32)) | col[6]  # P >> 64
    low = (col[5] << np.uint64(32)) | col[4]  # P mod 2^64
    if upper:  # ceil((P + 8) / 2^64): high + 1, or high + 2 when P mod 2^64 + 8 passes 2^64
        return high + np.uint64(1) + (low > np.uint64((1 << 64) - 9)).astype(np.uint64)
    return high + (low != 0).astype(np.uint64)


def _laplace_floors_in_limbs(t: int, s: int, max_len: int) -> list[int] | None:
    """The proven floors of :func:`laplace_floor_proof` from 128-bit fixed-point bounds in numpy limbs, or None
    when one is left unproven (the caller then runs the step-by-step proof).

    F_k = 2^64 - ceil(2^64 T_k) exactly, with T_k = 2 q^(k+1)/(1+q) = c q^k (irrational, so 2^64 T_k is never an
    integer; T_k > 0, so the ceiling is at least 1), c = 2q/(1+q) increasing in q. With k = 1024 a + b, the
    bounds c q^b (1024 values) and q^(1024 a) (one per row) are carried at 192 bits with directed rounding from
    ``exp_neg_bounds`` at 192 bits, rounded to 128 bits (floor for the lower, ceiling for the upper), and their
    products bounded by :func:`_product_ceilings`. F_k is proven when the floors from the lower and the upper bound of
    T_k agree, as in the step-by-step proof; the table ends at the first F_k = 2^64 - 1 or at max_len entries.
    """
    top = (1 << 64) - 1
    w, cut = 192, 64
    one = 1 << w
    q_lo, q_hi = exp_neg_bounds(s, t, w)
    c_lo = ((2 * q_lo) << w) // (one + q_lo)
    c_hi = _ceil_div((2 * q_hi) << w, one + q_hi)
    small_lo, small_hi = [c_lo], [c_hi]  # 2^w c q^b
    for _ in range(_FAST_ROW - 1):
        small_lo.append((small_lo[-1] * q_lo) >> w)
        small_hi.append(_ceil_div(small_hi[-1] * q_hi, one))
    step_lo, step_hi = (small_lo[-1] * q_lo) >> w, _ceil_div(small_hi[-1] * q_hi, one)  # 2^w c q^1024
    step_lo, step_hi = (step_lo << w) // c_hi, _ceil_div(step_hi << w, c_lo)  # 2^w q^1024
    x_lo = _limbs([v >> cut for v in small_lo])
    x_hi = _limbs([_ceil_div(v, 1 << cut) for v in small_hi])
    # row 0 (a = 0) from the 192-bit bounds: lower floors from the upper T, upper floors from the lower T
    rows_lo = [np.array([(1 << 64) - _ceil_div(v, 1 << (w - 64)) for v in small_hi], dtype=np.uint64)]
    rows_hi = [np.array([(1 << 64) - max(1, _ceil_div(v, 1 << (w - 64))) for v in small_lo], dtype=np.uint64)]
    big_lo, big_hi = step_lo, step_hi  # 2^w q^(1024 a), a = 1, 2, ...
    count, chunk = _FAST_ROW, 64
    while count < max_len and rows_lo[-1][-1] != top:
        bl, bh = [], []
        for _ in range(min(chunk, -(-(max_len - count) // _FAST_ROW))):
            bl.append(big_lo >> cut)
            bh.append(_ceil_div(big_hi, 1 << cut))
            big_lo, big_hi = (big_lo * step_lo) >> w, _ceil_div(big_hi * step_hi, one)
        if bh[0] >= (1 << 128) - (1 << 67):  # q^1024 within 2^-61 of 1: outside _product_ceilings' range
            return None
        upper_t = _product_ceilings(_limbs(bh), x_hi, upper=True).ravel()  # >= ceil(2^64 T_k) >= 1
        lower_t = np.maximum(_product_ceilings(_limbs(bl), x_lo, upper=False).ravel(), np.uint64(1))
        rows_lo.append(np.uint64(top) - upper_t + np.uint64(1))  # 2^64 - ceiling, without leaving uint64
        rows_hi.append(np.uint64(top) - lower_t + np.uint64(1))
        count += len(bl) * _FAST_ROW
    lo, hi = np.concatenate(rows_lo)[:max_len], np.concatenate(rows_hi)[:max_len]
    tops = np.flatnonzero(lo == np.uint64(top))
    end = int(tops[0]) + 1 if len(tops) else len(lo)
    if not np.array_equal(lo[:end], hi[:end]):
        return None
    return lo[:end].tolist()


@lru_cache(maxsize=8)
def gaussian_prefix_bounds(num: int, den: int, w: int, n_min: int) -> tuple[list[int], list[int], int, int]:
    """Bounds at 2^w on the discrete Gaussian magnitude sums, sigma2 = num/den.

    With v_i = exp(-i^2 / (2 sigma2)): S_k = 1 + 2 sum_{1<=i<=k} v_i, Z = 1 + 2 sum_{i>=1} v_i (the normaliser of
    P(X = x) = v_|x| / Z), G(k) = P(|X| <= k) = S_k / Z.
    Returns (s_lo, s_hi, z_lo, z_hi): lists with s_lo[k] <= 2^w S_k <= s_hi[k] for k = 0..N (N >= n_min, the
    first index whose tail bound is below N^2 units), and z_lo <= 2^w Z <= z_hi.
    v_i = v_(i-1) * c^(2i-1), c = exp(-1/(2 sigma2)), is carried with floor (lower) and ceiling (upper) rounding;
    the tail sum_{i>N} v_i <= v_N * c^(2N+1) / (1 - c^(2N+1)) (the ratios v_(i+1)/v_i = c^(2i+1) decrease).
    """
    one = 1 << w
    c_lo, c_hi = exp_neg_bounds(den, 2 * num, w)
    c2_lo, c2_hi = (c_lo * c_lo) >> w, _ceil_div(c_hi * c_hi, one)
    a_lo, a_hi = c_lo, c_hi  # c^(2i-1) for the next i
    v_lo = v_hi = one
    s_lo, s_hi = [one], [one]
    i = 0
    while True:
        i += 1
        v_lo, v_hi = (v_lo * a_lo) >> w, _ceil_div(v_hi * a_hi, one)
        s_lo.append(s_lo[-1] + 2 * v_lo)
        s_hi.append(s_hi[-1] + 2 * v_hi)
        a_lo, a_hi = (a_lo * c2_lo) >> w, _ceil_div(a_hi * c2_hi, one)  # now c^(2i+1)
        if a_hi < one:
            tail_hi = _ceil_div(v_hi * a_hi, one - a_hi)
            # the ceiling rounding keeps v_hi near 1/(1 - c^(2i+1)) units, so the tail bound settles near
            # (sigma2/i)^2 < i^2 units: stop there, which the guard bits (4 * bitlen(N)) absorb
            if i >= n_min and tail_hi <= i * i:
                return s_lo, s_hi, s_lo[-1], s_hi[-1] + 2 * tail_hi


def _gaussian_guard(num: int, den: int, p: int, k: int) -> int:
    # the relative error of v_i grows like i^2 rounding units; i reaches about sigma * sqrt(2 p ln 2) + k
    from math import isqrt

    n = isqrt(2 * num * p // den + 1) + 1 + k
    return p + 4 * n.bit_length() + 64


def gaussian_cdf_bounds(num: int, den: int, k: int, p: int) -> tuple[int, int]:
    """(lo, hi) with lo <= 2^p G(k) <= hi, G(k) = P(|X| <= k) for X discrete Gaussian with sigma2 = num/den."""
    reach = _prefix_reach(k)
    w = _gaussian_guard(num, den, p, reach)
    s_lo, s_hi, z_lo, z_hi = gaussian_prefix_bounds(num, den, w, reach)
    return (s_lo[k] << p) // z_hi, _ceil_div(s_hi[k] << p, z_lo)


def _prefix_reach(k: int) -> int:
    # The prefix sums are computed (and cached) to the next power of two above k, not to k itself: a refinement
    # walking k upwards one step at a time (vectorised._refine, past the end of a table) then recomputes them
    # O(log k) times instead of k times. A longer reach only raises the guard bits; every bound stays rigorous.
    return 1 << k.bit_length()


def gaussian_start_precision(num: int, den: int) -> int:
    """The precision (bits) at which the discrete Gaussian floor table for sigma2 = num/den is first attempted:
    about 64 bits, and about log2(e)/(2 sigma2) bits below sigma2 = 1/91.5, where the pmf ratio at 1,
    exp(-1/(2 sigma2)), is below 2^-66 and the table is the single floor F_0 = floor(2^64/Z) = 2^64 - 1, proven
    only once the bounds on Z = 1 + 2 exp(-1/(2 sigma2)) + ... exceed 1 (7,214 bits at the spec's smallest
    sigma2, 1e-4)."""
    return _start_bits(_LOG2_E_ABOVE * Fraction(den, 2 * num), 2)


def gaussian_floor_table(num: int, den: int, max_len: int) -> list[int] | None:
    """F_k = floor(2^64 G(k)), k = 0..K, K the first k with F_k = 2^64 - 1, each proven by the bounds above
    (floor of the lower and of the upper bound agree); None if K >= max_len (scale too large for a table).
    :func:`gaussian_floor_proof` has the proof's record."""
    return gaussian_floor_proof(num, den, max_len).floors


def gaussian_floor_proof(num: int, den: int, max_len: int, *, start: int | None = None) -> ProvenFloors:
    """The floor table of :func:`gaussian_floor_table` with its proof's record, first attempted at precision
    ``start`` (default :func:`gaussian_start_precision`; the floors do not depend on it, only the work does).
    An attempt at precision p bounds the sums at w = p + 4 bitlen(N) + 64 bits; one that leaves a floor
    unproven restarts at p + 64."""
    precision = gaussian_start_precision(num, den) if start is None else start
    first, rounds = precision, 0
    top = (1 << 64) - 1
    while True:
        rounds += 1
        w = _gaussian_guard(num, den, precision, 0)
        s_lo, s_hi, z_lo, z_hi = gaussian_prefix_bounds(num, den, w, 0)
        floors: list[int] = []
        for k in range(min(len(s_lo), max_len)):
            f = (s_lo[k] << 64) // z_hi
            if f != (s_hi[k] << 64) // z_lo:
                break
            floors.append(f)
            if f == top:
                return ProvenFloors(floors, first, rounds)
        else:
            if len(s_lo) >= max_len:
                return ProvenFloors(None, first, rounds)
        precision += PRECISION_STEP


def _block_bounds(num: int, den: int, p: int, k: int) -> tuple[list[int], list[int], int, int, int]:
    """(b_lo, b_hi, t_lo, t_hi, one): bounds at 2^w (one = 2^w) on the running sums B_k = sum_{0<=i<=k} v_i and the
    total T = sum_{i>=0} v_i of v_i = exp(-i^2/(2 sigma2)), sigma2 = num/den, as 2 B_k = S_k + 1 and 2 T = Z + 1 in
    the notation of :func:`gaussian_prefix_bounds` (the factor 2 cancels in B_k / T)."""
    reach = _prefix_reach(k)
    w = _gaussian_guard(num, den, p, reach)
    s_lo, s_hi, z_lo, z_hi = gaussian_prefix_bounds(num, den, w, reach)
    one = 1 << w
    return s_lo, s_hi, z_lo + one, z_hi + one, one


def gaussian_block_cdf_bounds(num: int, den: int, k: int, p: int) -> tuple[int, int]:
    """(lo, hi) with lo <= 2^p H(k) <= hi, H(k) = B_k / T the CDF of the index I with P(I = i) proportional to
    exp(-i^2 / (2 sigma2)) for i >= 0 (every index weighted once, unlike the magnitude of
    :func:`gaussian_cdf_bounds`, which weights i >= 1 twice), sigma2 = num/den."""
    s_lo, s_hi, t_lo, t_hi, one = _block_bounds(num, den, p, k)
    return ((s_lo[k] + one) << p) // t_hi, _ceil_div((s_hi[k] + one) << p, t_lo)


def gaussian_block_floor_table(num: int, den: int, max_len: int) -> list[int] | None:
    """F_k = floor(2^64 H(k)) of :func:`gaussian_block_cdf_bounds`, k = 0..K, K the first k with F_k = 2^64 - 1, each
    proven (the floors of the lower and the upper bound agree; otherwise the attempt restarts 64 bits higher);
    None if K >= max_len. The first attempt is at :func:`gaussian_start_precision`, as for the magnitude table."""
    precision = gaussian_start_precision(num, den)
    top = (1 << 64) - 1
    while True:
        s_lo, s_hi, t_lo, t_hi, one = _block_bounds(num, den, precision, 0)
        floors: list[int] = []
        for k in range(min(len(s_lo), max_len)):
            f = ((s_lo[k] + one) << 64) // t_hi
            if f != ((s_hi[k] + one) << 64) // t_lo:
                break
            floors.append(f)
            if f == top:
                return floors
        else:
            if len(s_lo) >= max_len:
                return None
        precision += PRECISION_STEP
