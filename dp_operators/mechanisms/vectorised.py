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
* Finding k for a word uses a guide table on U's top bits (Chen and Asau 1974) and, in the rare buckets holding
  several floors, ``searchsorted``: uint64 comparisons only.
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
  exactly on M' >= 1, where P(M' = 1 + y | M' >= 1) = (1-q) q^y), by the same routine, recursively; for a
  scale below 1 (M' >= 1 may be very unlikely; the tail itself has probability below 2^-63 there) Y is drawn by
  the scalar exact geometric of CKS 2020 Algorithm 2 instead.

Output: numpy int64; if a value would not fit (possible only with astronomically small probability, or for a
huge scale), the array is an object array of Python ints. Laplace scales above ``TABLE_SCALE_LIMIT`` (2^14) and
Gaussian sigma2 above ``GAUSSIAN_TABLE_SIGMA2_LIMIT`` (2^20) use ``vectorised_envelope`` (a table over blocks of
the magnitude and an exact rejection inside a block) up to 2^56 (Laplace) and 2^60 (Gaussian); Laplace scales up to
2^60 then use ``vectorised_large.sample_discrete_laplace_large`` (the geometric magnitude split into a quotient and
digits, each drawn by the same inverse CDF on small exact tables), and beyond the limits the scalar exact
sampler ``samplers.sample_discrete_laplace_vector`` (exact, slow), which returns int64 when every value fits,
object otherwise. Randomness: OS CSPRNG only (``os.urandom``); no seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Callable

import numpy as np

from dp_operators.mechanisms._rational import as_positive_rational
from dp_operators.mechanisms.samplers import (
    sample_geometric,
    sample_discrete_gaussian_vector,
    sample_discrete_laplace_vector,
)
from dp_operators.mechanisms.vectorised_bounds import (
    gaussian_cdf_bounds,
    gaussian_floor_table,
    laplace_cdf_bounds,
    laplace_floor_table,
)

__all__ = [
    "GAUSSIAN_TABLE_SIGMA2_LIMIT",
    "TABLE_SCALE_LIMIT",
    "sample_discrete_gaussian_array",
    "sample_discrete_laplace_array",
]

TABLE_SCALE_LIMIT = Fraction(1 << 14)  # above this Laplace scale: vectorised_envelope (a table would be large)
GAUSSIAN_TABLE_SIGMA2_LIMIT = Fraction(1 << 20)  # above this sigma2: vectorised_envelope
_MAX_TABLE = 1 << 20  # table entries (8 MiB); covers the whole 64-bit range for scales up to about 23,000
_CHUNK = 1 << 20  # words per block: bounded temporary memory, one os.urandom call per block
_I64_MAX = (1 << 63) - 1
_TAIL = -1

WordSource = Callable[[int], np.ndarray]


def os_words(n: int) -> np.ndarray:
    """n uniform 64-bit words from the OS CSPRNG, as a uint64 array (one ``os.urandom`` call)."""
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)


@dataclass(frozen=True)
class MagnitudeTable:
    """Floors F_k = floor(2^64 G(k)), k = 0..K, of a magnitude CDF G (see the module docstring).

    ``cdf_bounds(k, p)`` gives integers lo <= 2^p G(k) <= hi for any k >= 0; ``memoryless`` is True for the
    Laplace magnitude (geometric tail, so a capped table is allowed), False for the Gaussian, whose table always
    reaches F_K = 2^64 - 1 (no word lies beyond it; refinement past K uses ``cdf_bounds`` directly).
    """

    floors: np.ndarray  # uint64, non-decreasing, length K + 1
    cdf_bounds: Callable[[int, int], tuple[int, int]]
    memoryless: bool
    scale: Fraction | None = None  # the Laplace scale t/s (memoryless tables only)

    @property
    def last(self) -> int:
        return len(self.floors) - 1

    @cached_property
    def guide(self) -> tuple[int, np.ndarray]:
        """(shift, g): g[b] = first k with F_k >= b 2^shift, b = 0..2^(64-shift) (a guide table,
        Chen and Asau 1974), so a word U in bucket b = U >> shift has its answer in [g[b], g[b+1]]."""
        floors = self.floors
        bits = min(22, (2 * len(floors)).bit_length())
        starts = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
        g = np.append(np.searchsorted(floors, starts, side="left"), len(floors)).astype(np.int32)
        return 64 - bits, g


@lru_cache(maxsize=16)
def laplace_table(t: int, s: int) -> MagnitudeTable:
    """The cached table for scale t/s (t, s > 0 coprime ints). Built once per scale: about 1 s at scale 10^4."""
    floors = np.array(laplace_floor_table(t, s, _MAX_TABLE), dtype=np.uint64)
    return MagnitudeTable(floors, lambda k, p: laplace_cdf_bounds(t, s, k, p), True, Fraction(t, s))


@lru_cache(maxsize=16)
def gaussian_table(num: int, den: int) -> MagnitudeTable | None:
    """The cached table for sigma2 = num/den, or None when it would exceed the size cap (sigma2 above ~10^10;
    the sampler sends sigma2 above 2^20 to ``vectorised_envelope``)."""
    floors = gaussian_floor_table(num, den, _MAX_TABLE)
    if floors is None:
        return None
    return MagnitudeTable(np.array(floors, dtype=np.uint64), lambda k, p: gaussian_cdf_bounds(num, den, k, p), False)


def _refine(table: MagnitudeTable, word: int, first: int, words: WordSource) -> int:
    """Exact min{k >= first : V < G(k)} for V in [word, word+1)/2^64 known to be >= G(first-1); _TAIL if V >= G(K).

    V's binary expansion is extended 64 bits at a time; a comparison with G(k) is acted on only when G(k)'s
    rigorous bounds at precision m + 64 (m = bits of V so far) put all of [A, A+1)/2^m on one side.
    """
    a, m, k = word, 64, first
    while True:
        if k > table.last and table.memoryless:
            return _TAIL
        p = m + 64
        g_lo, g_hi = table.cdf_bounds(k, p)
        v_lo, v_hi = a << (p - m), (a + 1) << (p - m)
        if v_hi <= g_lo:  # V < (A+1)/2^m <= G(k)
            return k
        if v_lo >= g_hi:  # V >= A/2^m >= G(k)
            k += 1
            continue
        a = (a << 64) | int(words(1)[0])
        m += 64


def _magnitudes(table: MagnitudeTable, n: int, words: WordSource) -> np.ndarray:
    """n independent exact magnitudes |X|, int64 (object if a value exceeds int64)."""
    out = np.empty(n, dtype=np.int64)
    floors, last = table.floors, table.last
    tail_idx: list[np.ndarray] = []
    for start in range(0, n, _CHUNK):
        u = words(min(_CHUNK, n - start))
        if u.dtype != np.uint64:  # integer comparison only: a float key would round
            raise TypeError(f"random words must be uint64, got {u.dtype}")
        i, maybe_equal = _first_floor_at_least(table, u)
        block = out[start : start + len(u)]
        block[...] = i
        beyond = i > last  # U > F_K: V > G(K), the tail event
        tail_idx.append(start + np.flatnonzero(beyond))
        maybe_equal = maybe_equal[~beyond[maybe_equal]]
        for j in maybe_equal[floors[i[maybe_equal]] == u[maybe_equal]]:  # U = F_j: refine
            k = _refine(table, int(u[j]), int(i[j]), words)
            if k == _TAIL:
                tail_idx.append(np.array([start + j]))
            else:
                block[j] = k
    idx = np.concatenate(tail_idx) if tail_idx else np.zeros(0, dtype=np.intp)  # (none for n = 0)
    if not len(idx):
        return out
    if table.scale >= 1:  # P(M' >= 1) = 1 - tanh(1/(2 scale)) > 0.53: rejection of zeros is cheap
        y = _positive_magnitudes(table, len(idx), words)  # M' >= 1; Y = M' - 1
    else:  # P(M' >= 1) may be tiny: the scalar exact geometric instead (a tail here has probability < 2^-63)
        y = 1 + np.array([_scalar_geometric(table.scale) for _ in idx], dtype=object)
    offset = table.last  # K + 1 + Y = K + M'
    if y.dtype == object or int(y.max()) > _I64_MAX - offset:
        out = out.astype(object)
        y = y.astype(object)
    out[idx] = y + offset
    if out.dtype == object and all(-_I64_MAX - 1 <= int(v) <= _I64_MAX for v in out[idx]):
        out = out.astype(np.int64)
    return out


def _scalar_geometric(scale: Fraction) -> int:
    """One exact draw with P(y) = (1-q) q^y, q = exp(-1/scale) (:func:`samplers.sample_geometric`)."""
    return sample_geometric(scale.numerator, scale.denominator)


def _first_floor_at_least(table: MagnitudeTable, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(i, candidates): i[j] = first k with F_k >= u[j] (K + 1 if none), and the positions where u may equal a
    floor (a superset of {j : F_(i[j]) = u[j]}). uint64 comparisons only."""
    floors = table.floors
    shift, g = table.guide
    b = (u >> np.uint64(shift)).astype(np.intp)
    g0, g1 = g[b].astype(np.intp), g[b + 1]
    span = g1 - g0  # floors inside the bucket of u: the answer is in [g0, g0 + span]
    i = g0
    one = np.flatnonzero(span == 1)
    i[one] += floors[g0[one]] < u[one]
    many = np.flatnonzero(span > 1)
    i[many] = np.searchsorted(floors, u[many], side="left")
    # a floor equal to u lies in u's bucket, so only buckets holding a floor can hold an equality
    return i, np.concatenate([one, many])


def _positive_magnitudes(table: MagnitudeTable, n: int, words: WordSource) -> np.ndarray:
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


def _fallback(values: list[int]) -> np.ndarray:
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
    _check_size(size)
    if scale > TABLE_SCALE_LIMIT:  # the block envelope, then the digit decomposition, then scalar
        from dp_operators.mechanisms import vectorised_envelope, vectorised_large

        if scale <= vectorised_envelope.LAPLACE_SCALE_LIMIT:
            return vectorised_envelope.sample_discrete_laplace_envelope(scale, size, _words=_words)
        if scale <= vectorised_large.LARGE_SCALE_LIMIT:
            return vectorised_large.sample_discrete_laplace_large(scale, size, _words=_words)
        return _fallback(sample_discrete_laplace_vector(scale, size))
    table = laplace_table(scale.numerator, scale.denominator)
    magnitude = _magnitudes(table, size, _words)
    return np.where(_signs(size), -magnitude, magnitude)


def sample_discrete_gaussian_array(sigma2: Fraction | int, size: int, *, _words: WordSource = os_words) -> np.ndarray:
    """Draw ``size`` independent discrete Gaussian integers N_Z(0, sigma2) as a numpy array.

    pmf: P(x) = exp(-x^2/(2 sigma2)) / Z, Z = sum over Z of the same (CKS 2020), sigma2 in squared units of the
    integer aggregate. Same method as the Laplace sampler (module docstring) with the magnitude CDF
    G(k) = S_k / Z, S_k = 1 + 2 sum_{1<=i<=k} exp(-i^2/(2 sigma2)), bounded rigorously (``vectorised_bounds``).
    The table always reaches F_K = 2^64 - 1, so every word is decided or refined; no tail step is needed.
    Exactness: the output is min{k : V < G(k)} for V uniform from the OS bits, with a fair sign for k > 0.

    Returns shape (size,) int64 (object when a value does not fit). sigma2 above ``GAUSSIAN_TABLE_SIGMA2_LIMIT``
    (2^20) uses ``vectorised_envelope`` (exact, same speed), and above its limit (2^60) the scalar exact sampler
    ``samplers.sample_discrete_gaussian_vector`` (exact, slow).
    Raises ValueError for a bad sigma2 or size, TypeError when sigma2 is not a number.
    """
    sigma2 = as_positive_rational(sigma2, "sigma2")
    _check_size(size)
    if sigma2 > GAUSSIAN_TABLE_SIGMA2_LIMIT:  # the block envelope, then scalar
        from dp_operators.mechanisms import vectorised_envelope

        if sigma2 <= vectorised_envelope.GAUSSIAN_SIGMA2_LIMIT:
            return vectorised_envelope.sample_discrete_gaussian_envelope(sigma2, size, _words=_words)
        return _fallback(sample_discrete_gaussian_vector(sigma2, size))
    table = gaussian_table(sigma2.numerator, sigma2.denominator)
    magnitude = _magnitudes(table, size, _words)
    return np.where(_signs(size), -magnitude, magnitude)


def _check_size(size: object) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
