"""Vectorised exact discrete Laplace sampler on numpy integer arrays (issue 11, item 1).

Distribution: P(X = x) = tanh(1/(2b)) * exp(-|x|/b) for x in Z, b = t/s > 0 rational (Canonne, Kamath, Steinke
2020, Definition of the discrete Laplace; the same law as ``samplers.sample_discrete_laplace``).

Method: inverse CDF of the magnitude M = |X| on 64-bit words, plus a sign bit.

* M has CDF G(k) = P(M <= k) = 1 - 2 q^(k+1) / (1 + q), q = exp(-1/b): P(M = 0) = (1-q)/(1+q) and
  P(M = k) = 2 q^k (1-q)/(1+q) for k >= 1. X = M with probability 1/2 and -M otherwise; for M = 0 both signs give
  0, so P(X = 0) = P(M = 0) and P(X = x) = P(M = |x|)/2 = tanh(1/(2b)) q^|x| otherwise: the pmf above, exactly
  (0 is counted once because the sign is applied to a magnitude whose law already gives 0 its own weight).
* A real V uniform on [0, 1) gives M = min{k : V < G(k)} with exactly the law G. V is written in binary from
  the OS CSPRNG: its first 64 bits are a word U (``os.urandom`` in blocks, read as uint64), so V lies in
  [U, U+1) / 2^64, and further bits are drawn only when needed.
* The table holds F_k = floor(2^64 G(k)) for k = 0..K, each proven by rigorous integer bounds
  (``vectorised_bounds``: directed rounding and an explicit Taylor remainder, never a float). If
  F_(k-1) < U < F_k (F_(-1) = -1) then [U, U+1)/2^64 lies inside [G(k-1), G(k)): U >= F_(k-1) + 1 > 2^64 G(k-1)
  and U + 1 <= F_k <= 2^64 G(k). So M = k whatever the later bits are: the word is decided by one
  ``searchsorted`` on uint64 (integer comparisons).
* Undecided words: U equal to some F_j. Then more 64-bit words are appended to V's binary expansion and V is
  compared with G(j), G(j+1), ... through bounds computed at a precision above V's current length, until the
  bounds certify on which side of each G V lies (G(j) is transcendental, so this ends with probability 1).
  The result is again exactly min{k : V < G(k)}: no draw is rejected or conditioned, so the output law is G.
* Words beyond the table (U > F_K; only when the table was capped, for a large scale): these mean V > G(K), and
  an undecided word at F_K whose refinement shows V >= G(K) means the same. The event {V >= G(K)} therefore has
  probability exactly 1 - G(K) = P(M > K). On that event M is replaced by K + 1 + Y with Y a fresh draw of the
  geometric law P(Y = y) = (1-q) q^y, which is the law of M - (K+1) given M > K (memorylessness: P(M = K+1+y |
  M > K) = q^y (1-q)). Y is drawn as M' - 1 for a fresh magnitude M' >= 1 (zeros rejected, which conditions
  exactly on M' >= 1, where P(M' = 1 + y | M' >= 1) = (1-q) q^y), by the same routine, recursively.

Output: numpy int64; if a value would not fit (possible only with astronomically small probability, or for a
huge scale), the array is an object array of Python ints. Scales above ``TABLE_SCALE_LIMIT`` use the scalar
exact sampler ``samplers.sample_discrete_laplace_vector`` (exact, slow) and return int64 when every value fits,
object otherwise. Randomness: OS CSPRNG only (``os.urandom``); no seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Callable

import numpy as np

from dp_operators.mechanisms._rational import as_positive_rational
from dp_operators.mechanisms.samplers import sample_discrete_laplace_vector
from dp_operators.mechanisms.vectorised_bounds import laplace_cdf_bounds, laplace_floor_table

__all__ = ["TABLE_SCALE_LIMIT", "sample_discrete_laplace_array"]

TABLE_SCALE_LIMIT = Fraction(1 << 22)  # above this scale the scalar exact sampler is used
_MAX_TABLE = 1 << 20  # table entries (8 MiB); covers the whole 64-bit range for scales up to about 23,000
_CHUNK = 1 << 20  # words per block: bounded temporary memory, one os.urandom call per block
_I64_MAX = (1 << 63) - 1
_TAIL = -1

WordSource = Callable[[int], np.ndarray]


def os_words(n: int) -> np.ndarray:
    """n uniform 64-bit words from the OS CSPRNG, as a uint64 array (one ``os.urandom`` call)."""
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)


@dataclass(frozen=True)
class LaplaceTable:
    """Floors F_k = floor(2^64 G(k)), k = 0..K, of the magnitude CDF for scale t/s (see the module docstring)."""

    t: int
    s: int
    floors: np.ndarray  # uint64, non-decreasing, length K + 1

    @property
    def last(self) -> int:
        return len(self.floors) - 1


@lru_cache(maxsize=16)
def laplace_table(t: int, s: int) -> LaplaceTable:
    """The cached table for scale t/s (t, s > 0 coprime ints). Built once per scale: about 1 s at scale 10^4."""
    floors = np.array(laplace_floor_table(t, s, _MAX_TABLE), dtype=np.uint64)
    return LaplaceTable(t, s, floors)


def _refine(table: LaplaceTable, word: int, first: int, words: WordSource) -> int:
    """Exact min{k >= first : V < G(k)} for V in [word, word+1)/2^64 known to be >= G(first-1); _TAIL if V >= G(K).

    V's binary expansion is extended 64 bits at a time; a comparison with G(k) is acted on only when G(k)'s
    rigorous bounds at precision m + 64 (m = bits of V so far) put all of [A, A+1)/2^m on one side.
    """
    a, m, k = word, 64, first
    while True:
        if k > table.last:
            return _TAIL
        p = m + 64
        g_lo, g_hi = laplace_cdf_bounds(table.t, table.s, k, p)
        v_lo, v_hi = a << (p - m), (a + 1) << (p - m)
        if v_hi <= g_lo:  # V < (A+1)/2^m <= G(k)
            return k
        if v_lo >= g_hi:  # V >= A/2^m >= G(k)
            k += 1
            continue
        a = (a << 64) | int(words(1)[0])
        m += 64


def _magnitudes(table: LaplaceTable, n: int, words: WordSource) -> np.ndarray:
    """n independent exact magnitudes |X|, int64 (object if a value exceeds int64)."""
    out = np.empty(n, dtype=np.int64)
    floors, last = table.floors, table.last
    tail_idx: list[np.ndarray] = []
    for start in range(0, n, _CHUNK):
        u = words(min(_CHUNK, n - start))
        assert u.dtype == np.uint64  # integer comparison only: a float key would round
        i = np.searchsorted(floors, u, side="left")  # first k with F_k >= U
        block = out[start : start + len(u)]
        block[...] = i
        beyond = i > last  # U > F_K: V > G(K), the tail event
        tail_idx.append(start + np.flatnonzero(beyond))
        for j in np.flatnonzero(~beyond & (floors[np.minimum(i, last)] == u)):  # U = F_j: refine
            k = _refine(table, int(u[j]), int(i[j]), words)
            if k == _TAIL:
                tail_idx.append(np.array([start + j]))
            else:
                block[j] = k
    idx = np.concatenate(tail_idx)
    if not len(idx):
        return out
    y = _positive_magnitudes(table, len(idx), words)  # M' >= 1; Y = M' - 1
    offset = table.last  # K + 1 + (M' - 1)
    if y.dtype == object or int(y.max()) > _I64_MAX - offset:
        out = out.astype(object)
        y = y.astype(object)
    out[idx] = y + offset
    return out


def _positive_magnitudes(table: LaplaceTable, n: int, words: WordSource) -> np.ndarray:
    """n independent magnitudes conditioned on being >= 1 (rejection of zeros, which is exact conditioning)."""
    parts, need = [], n
    while need:
        m = _magnitudes(table, need, words)
        m = m[m != 0]
        parts.append(m)
        need -= len(m)
    if any(p.dtype == object for p in parts):
        parts = [p.astype(object) for p in parts]
    return np.concatenate(parts)


def _signs(n: int) -> np.ndarray:
    """n independent fair sign bits (bool, True = negative) from the OS CSPRNG."""
    return np.unpackbits(np.frombuffer(os.urandom((n + 7) // 8), dtype=np.uint8), count=n).astype(bool)


def _fallback(scale: Fraction, size: int) -> np.ndarray:
    values = sample_discrete_laplace_vector(scale, size)
    if all(-_I64_MAX - 1 <= v <= _I64_MAX for v in values):
        return np.array(values, dtype=np.int64)
    return np.array(values, dtype=object)


def sample_discrete_laplace_array(scale: Fraction | int, size: int, *, _words: WordSource = os_words) -> np.ndarray:
    """Draw ``size`` independent discrete Laplace integers with scale ``scale`` as a numpy array.

    pmf: P(x) = tanh(1/(2 scale)) exp(-|x|/scale), x in Z (CKS 2020), scale in units of the integer aggregate;
    added to a query of L1 sensitivity Delta it gives (Delta/scale)-DP. Exact: see the module docstring.

    Args:
        scale: positive finite rational (int, Fraction, Decimal, or float read as its decimal).
        size: number of draws (non-negative int).

    Returns:
        shape (size,) array, dtype int64; dtype object (Python ints) when a value does not fit in int64.

    Raises:
        ValueError: scale NaN, infinite, <= 0 or bool; size not a non-negative int. TypeError: scale not a number.
    """
    scale = as_positive_rational(scale, "scale")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    if scale > TABLE_SCALE_LIMIT:
        return _fallback(scale, size)
    table = laplace_table(scale.numerator, scale.denominator)
    magnitude = _magnitudes(table, size, _words)
    return np.where(_signs(size), -magnitude, magnitude)
