"""Rigorous integer bounds on exp(-x) and on the discrete Laplace magnitude CDF (used by ``vectorised``).

Every function returns integers ``lo <= 2^p * value <= hi`` proved by directed rounding: each partial product is
rounded down (floor) for the lower bound and up (ceiling) for the upper bound, and the Taylor remainder is bounded
explicitly. No float is involved; the bounds are valid at every precision, and tighten as ``p`` grows (width a
few units of 2^-p times the number of rounded operations), which is all the sampler needs: it only acts on a
comparison when the bounds certify it.
"""

from __future__ import annotations

from functools import lru_cache


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


@lru_cache(maxsize=64)
def exp_neg_bounds(num: int, den: int, p: int) -> tuple[int, int]:
    """Integers (lo, hi) with lo <= 2^p * exp(-num/den) <= hi, for num >= 0, den > 0, p >= 1.

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


def laplace_floor_table(t: int, s: int, max_len: int) -> list[int]:
    """F_k = floor(2^64 G(k)) for k = 0..K, exactly, where K is the first k with F_k = 2^64 - 1 (then no 64-bit
    word lies beyond the table), or K = max_len - 1.

    The powers q^(k+1) are carried as floor/ceil bounds at w bits (one directed rounding per step, so after k
    steps the bounds are within k+1 units plus (k+1) times q's own bound width); each F_k is accepted only when
    floor(2^64 * lower) == floor(2^64 * upper), which proves it. Otherwise the table is recomputed with 64 more
    bits (G(k) is transcendental, so this terminates).
    """
    guard = 64 + max(max_len, 2).bit_length() + 16
    while True:
        w = 64 + guard
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
            return floors
        guard += 64
