"""Exact accuracy of the least-squares values of a consistent family, from public parameters only.

The fitted values of member m' are A_{m'} x-hat = P y, a linear map of the independent noised observations y with
P = A_{m'} N^-1 A^T W (N = sum_m w_m A_m^T A_m, W = diag of the weights w_m = 1 / variance_m; see
:mod:`dp_operators.consistency.wls`). Their covariance is A_{m'} N^-1 A_{m'}^T (Gauss-Markov), whose diagonal gives
the exact standard deviation of every published value; a deterministic error of at most bias_i on observation i
(sum families: the grid rounding) moves a fitted value by at most sum_i |P_ji| bias_i.

Three ways to compute them:

* product families (every member a plain margin, ``Family.product``): closed forms over the 2^axes eigenspaces of N,
  independent of the number of cells (:func:`closed_form_accuracy`; derivation below);
* families with a key hierarchy and at most ``DENSE_BASE_CELLS`` base cells: dense linear algebra
  (:func:`dense_accuracy`);
* larger hierarchy families: the raw noise's standard deviation, an upper bound (``exact=False``).

Closed form. Base axes c have sizes n_c; a member keeping the axes S has A_S^T A_S = (x)_{c in S} I (x)_{c not in S}
J (J the all-ones matrix). With V_T the cells' functions that are non-constant exactly along the axes T (projector
Pi_T = (x)_{c in T} (I - J/n_c) (x)_{c not in T} J/n_c), A_S^T A_S = prod_{c not in S} n_c on V_T if T is a subset
of S, 0 otherwise, so N = sum_T lambda_T Pi_T with lambda_T = sum_{S superset of T} w_S prod_{c not in S} n_c, and
N^-1 = sum_T Pi_T / lambda_T. Then, axis by axis:

* var(cell b of S') = prod_{c not in S'} n_c * sum_{T subset of S'} lambda_T^-1 prod_{c in T} (1 - 1/n_c)
  prod_{c in S' minus T} 1/n_c;
* the coefficient of cell a of S on cell b of S' (U = S and S') is
  P = w_S prod_{c not in S or S'} n_c * sum_{T subset of U} lambda_T^-1 prod_{c in T} (delta_c - 1/n_c)
  prod_{c in U minus T} 1/n_c, delta_c = [a_c = b_c]; it depends on a only through the match set M = {c in U :
  a_c = b_c}, which prod_{c in U minus M} (n_c - 1) prod_{c in S minus U} n_c cells of S share.

So every cell of a member has the same accuracy, in O(members^2 4^axes) operations. Source: Hay, Rastogi, Miklau,
Suciu, VLDB 2010 (least squares over consistency constraints); the eigen-decomposition is derived above and checked
against dense linear algebra and the fitted map in tests/consistency/test_variance.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from scipy.linalg import lapack
from scipy.sparse import csr_array

from dp_operators.consistency.structure import Family, Member
from dp_operators.consistency.wls import inverse_variances
from dp_operators.spec.families import DENSE_BASE_CELLS

__all__ = [
    "MemberAccuracy",
    "accuracy",
    "closed_form_accuracy",
    "dense_accuracy",
    "half_widths",
    "quantile_factor",
]

MECHANISMS = ("discrete_gaussian", "discrete_laplace")


@dataclass(frozen=True)
class MemberAccuracy:
    """The accuracy of one member's published (least-squares) values.

    Attributes:
        standard_deviation: float64 array of shape (member.cells,), value units: the standard deviation of each
            published value's noise (exact unless ``exact`` is False, then an upper bound).
        bias: float64 array of shape (member.cells,), value units: a bound on each published value's deterministic
            error carried from the observations' ``Member.bias`` (zeros for counts).
        exact: False when the standard deviation is the raw noise's bound, not the least-squares value's.
        lattice: float64 array of shape (member.cells,): the largest absolute weight of one noised value in each
            published value (1 for a raw value; small when the value mixes many noised values). The noise is
            integer-valued in grid units, so the error lives near a lattice of this spacing (grid units), which
            :func:`half_widths` corrects for.
    """

    standard_deviation: np.ndarray
    bias: np.ndarray
    exact: bool
    lattice: np.ndarray | None = None


def _biases(family: Family) -> np.ndarray:
    biases = np.array([float(m.bias) for m in family.members], dtype=np.float64)
    if not np.all(np.isfinite(biases)) or np.any(biases < 0):
        raise ValueError(f"member biases must be finite and non-negative, got {dict(zip(family.names, biases))}")
    return biases


def _subset_masks(axes: Sequence[int]) -> np.ndarray:
    """The masks (bit c for axis c) of the subsets of ``axes``, in the order of a Kronecker product of one 2-entry
    factor per axis of ``axes`` (the first axis the most significant)."""
    masks = np.zeros(1, dtype=np.int64)
    for c in axes:
        masks = np.stack([masks, masks | (1 << c)], axis=1).ravel()
    return masks


def _kron(factors: Iterable[np.ndarray]) -> np.ndarray:
    out = np.ones((1, 1))
    for factor in factors:
        out = np.kron(out, np.atleast_2d(factor))
    return out


def _mask(axes: Iterable[int]) -> int:
    return sum(1 << c for c in axes)


def _eigenvalues(family: Family, weights: np.ndarray) -> np.ndarray:
    """lambda_T for every mask T of the base axes: N's eigenvalue on V_T."""
    sizes = family.base_shape
    axes = len(sizes)
    masks = np.arange(1 << axes, dtype=np.int64)
    eigenvalues = np.zeros(1 << axes)
    for member, w in zip(family.members, weights):
        kept = _mask(member.kept_axes)
        dropped = math.prod(sizes[c] for c in range(axes) if c not in member.kept_axes)
        eigenvalues[(masks & ~kept) == 0] += w * dropped
    return eigenvalues


def closed_form_accuracy(family: Family) -> list[MemberAccuracy]:
    """Exact accuracy of a product family's least-squares values, from the closed forms in the module docstring.

    O(members^2 4^axes) operations, whatever the number of cells.

    Returns:
        one :class:`MemberAccuracy` per member (``exact=True``); all cells of a member share their values.

    Raises:
        ValueError: the family is not a product family (a member without ``kept_axes``), its base does not keep
            every axis, a variance is not positive and finite, or a bias is negative or not finite.
    """
    if not family.product:
        raise ValueError(f"the family {list(family.names)} uses a key hierarchy: the closed forms need plain margins")
    axes = len(family.base_shape)
    if tuple(family.base.kept_axes) != tuple(range(axes)):
        raise ValueError(f"the base {family.base.name!r} must keep every axis, keeps {family.base.kept_axes}")
    weights, biases = inverse_variances(family), _biases(family)
    sizes = family.base_shape
    inverse = 1.0 / _eigenvalues(family, weights)

    def dropped(kept: Iterable[int]) -> int:
        kept = set(kept)
        return math.prod(sizes[c] for c in range(axes) if c not in kept)

    results = []
    for fitted in family.members:
        kept = fitted.kept_axes
        factor = _kron(np.array([1 / sizes[c], 1 - 1 / sizes[c]]) for c in kept).ravel()
        variance = dropped(kept) * float(factor @ inverse[_subset_masks(kept)])
        bias = 0.0
        lattice = 0.0
        for observed, w, b in zip(family.members, weights, biases):
            shared = tuple(sorted(set(kept) & set(observed.kept_axes)))
            n = [sizes[c] for c in shared]
            # rows: match set M (delta_c = 1 on a match), columns: T; both as Kronecker products over the shared axes
            terms = _kron(np.array([[1 / m, -1 / m], [1 / m, 1 - 1 / m]]) for m in n)
            coefficient = w * dropped(set(kept) | set(observed.kept_axes)) * (terms @ inverse[_subset_masks(shared)])
            count = _kron(np.array([m - 1, 1.0]) for m in n).ravel() * math.prod(
                sizes[c] for c in observed.kept_axes if c not in shared)
            lattice = max(lattice, float(np.abs(coefficient[count > 0]).max()))
            if b:
                bias += b * float(count @ np.abs(coefficient))
        results.append(MemberAccuracy(np.full(fitted.cells, math.sqrt(variance)), np.full(fitted.cells, bias), True,
                                      np.full(fitted.cells, lattice)))
    return results


def _summing_matrix(member: Member, base_cells: int) -> csr_array:
    return csr_array((np.ones(base_cells), (member.to_base, np.arange(base_cells))), shape=(member.cells, base_cells))


def dense_accuracy(family: Family) -> list[MemberAccuracy]:
    """Exact accuracy of any family's least-squares values by dense linear algebra over the base cells.

    N = sum_m w_m A_m^T A_m is formed densely (base_cells^2 float64) and inverted through its Cholesky factor
    (LAPACK ``dpotrf`` and ``dpotri``, about n^3 flops: some seconds at ``DENSE_BASE_CELLS``). Then
    var = diag(A_m N^-1 A_m^T) and, when a member has a bias, the L1 norms of the rows of P = A_m N^-1 A^T W.

    Returns:
        one :class:`MemberAccuracy` per member (``exact=True``), arrays of shape (member.cells,), value units.

    Raises:
        ValueError: a variance not positive and finite, or a bias negative or not finite.
        RuntimeError: LAPACK failed (N is positive definite, so this would be a bug).
    """
    weights, biases = inverse_variances(family), _biases(family)
    n = family.base_cells
    sums = [_summing_matrix(m, n) for m in family.members]
    normal = sum(w * (a.T @ a) for a, w in zip(sums, weights)).toarray()
    factor, info = lapack.dpotrf(normal, lower=0, overwrite_a=1)
    if info != 0:
        raise RuntimeError(f"Cholesky factorisation of the normal matrix failed (LAPACK info {info})")
    del normal
    upper, info = lapack.dpotri(factor, lower=0, overwrite_c=1)
    if info != 0:
        raise RuntimeError(f"inverting the normal matrix failed (LAPACK info {info})")
    inverse = np.triu(upper)
    inverse += np.triu(upper, 1).T
    del upper, factor
    cells = np.arange(n)
    results = []
    for fitted, a_fitted in zip(family.members, sums):
        rows = a_fitted @ inverse  # (fitted cells, n): A_m' N^-1
        variance = np.bincount(fitted.to_base, weights=rows[fitted.to_base, cells], minlength=fitted.cells)
        bias = np.zeros(fitted.cells)
        lattice = np.zeros(fitted.cells)
        for a_observed, w, b in zip(sums, weights, biases):
            block = w * np.abs(a_observed @ rows.T)  # P's block for this observation, transposed: (observed, fitted)
            lattice = np.maximum(lattice, block.max(axis=0))
            if b > 0:
                bias += b * block.sum(axis=0)
        results.append(MemberAccuracy(np.sqrt(np.maximum(variance, 0.0)), bias, True, lattice))
    return results


def accuracy(family: Family) -> list[MemberAccuracy]:
    """The accuracy of every member's published least-squares values (base first).

    Product families: :func:`closed_form_accuracy` (exact, any size). Families with a key hierarchy and at most
    ``DENSE_BASE_CELLS`` base cells: :func:`dense_accuracy` (exact). Larger hierarchy families: the raw noise's
    standard deviation sqrt(Member.variance), a valid upper bound because the best linear unbiased estimate of a
    member's cells has at most the variance of the member's own unbiased observation; ``exact=False``.

    Returns:
        one :class:`MemberAccuracy` per member, arrays of shape (member.cells,), value units.

    Raises:
        ValueError: a variance not positive and finite; a negative or non-finite bias; a member with a bias in a
            family too large for the exact computation (its rounding error is spread by the least-squares map, and
            the raw bias would not bound it: spec validation refuses such sum families first).
    """
    if family.product:
        return closed_form_accuracy(family)
    if family.base_cells <= DENSE_BASE_CELLS:
        return dense_accuracy(family)
    inverse_variances(family)
    if np.any(_biases(family) > 0):
        raise ValueError(
            f"the family {list(family.names)} has a key hierarchy and {family.base_cells} base cells (above "
            f"{DENSE_BASE_CELLS}) and a member with a rounding bias: its post-processed bias cannot be bounded "
            "without the exact computation"
        )
    return [MemberAccuracy(np.full(m.cells, math.sqrt(float(m.variance))), np.zeros(m.cells), False, np.ones(m.cells))
            for m in family.members]


def quantile_factor(mechanisms: Iterable[str], alpha: float) -> float:
    """The multiplier q of a standard deviation giving the half-width of a (1 - alpha) interval.

    Every member discrete_gaussian: q = z_{1 - alpha/2}, the normal quantile (a least-squares value is a linear
    combination of discrete Gaussians, near-normal). Any discrete_laplace: q = max(z_{1 - alpha/2},
    ln(1/alpha) / sqrt(2)), the quantile of a (continuous) Laplace law of the same variance, the heaviest-tailed of
    the combinations that can arise. This is an approximation checked empirically (tests/consistency), not a proven
    bound: a raw discrete Laplace of small scale (below about 10 grid steps) puts its lattice points just outside
    the interval and covers less, e.g. 92.7 % instead of 95 % at scale 1 (use the mechanism's own
    ``discrete_laplace_accuracy`` for a single raw value).

    Args:
        mechanisms: the family members' mechanisms (``discrete_laplace`` or ``discrete_gaussian``).
        alpha: in (0, 1).

    Raises:
        ValueError: no mechanism, an unknown mechanism, or alpha outside (0, 1).
    """
    kinds = set(mechanisms)
    if not kinds or not kinds <= set(MECHANISMS):
        raise ValueError(f"mechanisms must be a non-empty set of {MECHANISMS}, got {sorted(kinds)}")
    alpha = float(alpha)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    normal = -NormalDist().inv_cdf(alpha / 2)  # the lower quantile negated: 1 - alpha/2 may round to 1
    if "discrete_laplace" in kinds:
        return max(normal, math.log(1 / alpha) / math.sqrt(2))
    return normal


def half_widths(family: Family, accuracies: Sequence[MemberAccuracy], alpha: float) -> list[np.ndarray]:
    """Half-widths of (1 - alpha) intervals around every member's published values: q * sd + grid * L / 2 + bias,
    rounded up (L: :attr:`MemberAccuracy.lattice`).

    q is :func:`quantile_factor` of the family's mechanisms (one for the whole family, since every value mixes all
    observations). The noise is integer-valued in grid units, so the error of a value dominated by one noised value
    lives near a lattice of spacing L grid steps (L its weight in the value), where ``q * sd`` can fall just short
    of the lattice point the exact quantile includes (a discrete Gaussian of sigma^2 = 1 has q * sd = 1.94 < 2,
    covering 88 %): half a lattice step is added, the continuity correction of a normal approximation to a lattice
    law (Feller, *An Introduction to Probability Theory*, vol. 1, VII.2). A value mixing many noised values (small
    L) gets almost none. tests/consistency/test_review_expert.py checks coverage at small scales. Each half-width is moved to the next float towards +inf, so the float rounding of q * sd + bias
    never shrinks it.

    Args:
        family: the family.
        accuracies: :func:`accuracy`'s output, one per member.
        alpha: in (0, 1).

    Returns:
        float64 arrays of shape (member.cells,), value units, one per member.

    Raises:
        ValueError: accuracies not one per member, or the errors of :func:`quantile_factor`.
    """
    if len(accuracies) != len(family.members):
        raise ValueError(f"{len(accuracies)} accuracies for {len(family.members)} members")
    q = quantile_factor((m.mechanism for m in family.members), alpha)
    half_step = float(family.grid) / 2
    return [np.nextafter(q * acc.standard_deviation + half_step * (1.0 if acc.lattice is None else acc.lattice)
                         + acc.bias, np.inf) for acc in accuracies]
