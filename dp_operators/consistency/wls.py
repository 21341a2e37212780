"""Weighted least squares over a consistent family: the best linear unbiased estimate of the base table.

Every member m of a :class:`~dp_operators.consistency.structure.Family` observes y_m = A_m x + e_m, where x is the
true base table, A_m sums base cells into the member's cells (``Member.to_base``) and e_m is independent noise of
variance ``Member.variance`` per cell. The estimate minimising sum_m ||A_m x - y_m||^2 / variance_m solves the normal
equations N x = b, N = sum_m w_m A_m^T A_m, b = sum_m w_m A_m^T y_m, w_m = 1 / variance_m; it is the best linear
unbiased estimate (Gauss-Markov), and the members' values computed from it add up exactly (Hay, Rastogi, Miklau,
Suciu, "Boosting the Accuracy of Differentially Private Histograms Through Consistency", VLDB 2010).

Post-processing only: the inputs are the noised values and public parameters (structure, variances), so it costs no
privacy budget. N is never formed: conjugate gradients apply it with ``np.bincount`` (sum into member cells) and a
gather (spread back to base cells), O(members x base cells) per iteration. N is positive definite because the base
observes every cell (A_0 = I). For a product family N has at most 2^axes distinct eigenvalues
(:mod:`dp_operators.consistency.variance`), so CG converges in that many iterations in exact arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.sparse.linalg import LinearOperator, cg

from dp_operators.consistency.structure import Family, one_blas_thread

__all__ = ["consistent_values", "exact_sums", "fit", "inverse_variances"]

#: CG stops when the residual of the normal equations is below this fraction of ||b||.
RTOL = 1e-13
#: Convergence check: the residual recomputed from scratch after CG must be below this fraction of ||b||. CG
#: tracks a recursive residual, which can drift from the true one in floating point; the true one decides.
_CHECK_RTOL = 1e-9
#: CG iterations allowed. Product families need at most 2^axes; irregular hierarchies (groups of many different
#: sizes) about 150 at 10^5 base cells.
MAX_ITERATIONS = 5000
#: exact_sums never uses a finer step than 2^-_MAX_STEP_BITS (value units).
_MAX_STEP_BITS = 40


def inverse_variances(family: Family) -> np.ndarray:
    """The weights w_m = 1 / Member.variance of the members (float64 array of shape (members,), 1 / value units^2).

    Raises:
        ValueError: naming the members whose variance is not positive and finite.
    """
    variances = np.array([float(m.variance) for m in family.members], dtype=np.float64)
    if not np.all(np.isfinite(variances)) or np.any(variances <= 0):
        bad = [m.name for m, v in zip(family.members, variances) if not (math.isfinite(v) and v > 0)]
        raise ValueError(f"members {bad} have a noise variance that is not positive and finite")
    return 1.0 / variances


def _observations(family: Family, observations: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(observations) != len(family.members):
        raise ValueError(f"{len(observations)} observation arrays for {len(family.members)} members "
                         f"{list(family.names)}: give one per member, in the family's order")
    checked = []
    for member, values in zip(family.members, observations):
        array = np.asarray(values, dtype=np.float64)
        if array.shape != (member.cells,):
            raise ValueError(f"member {member.name!r} has {member.cells} cells; its observations have shape "
                             f"{array.shape}")
        if not np.all(np.isfinite(array)):
            raise ValueError(f"member {member.name!r} has non-finite observations: noised values are finite")
        checked.append(array)
    return checked


def _is_identity(member_to_base: np.ndarray) -> bool:
    return bool(np.array_equal(member_to_base, np.arange(len(member_to_base))))


@one_blas_thread
def fit(family: Family, observations: Sequence[np.ndarray]) -> np.ndarray:
    """The weighted least-squares (best linear unbiased) estimate of the base table from the members' noised values.

    Minimises sum_m ||A_m x - y_m||^2 / variance_m, where (A_m x)[c] is the sum of x over the base cells whose
    ``to_base`` is c. Solved by preconditioned conjugate gradients (``scipy.sparse.linalg.cg``, Jacobi
    preconditioner diag(N)[i] = sum_m w_m |cell of m containing i|, relative tolerance :data:`RTOL`, at most
    :data:`MAX_ITERATIONS`) on the normal equations, started from the base's own observations; the result is
    accepted when its residual, recomputed, is below 1e-9 ||b||. Uses only the noised values and public parameters.

    Args:
        family: the public structure and noise variances (value units^2).
        observations: per member, in ``family.members`` order, its noised values: arrays of shape (member.cells,),
            value units, int or float.

    Returns:
        float64 array of shape (base_cells,), value units: the estimate x-hat. Its margins ``family.margin(m, xhat)``
        are the consistent values of every member (see :func:`consistent_values` for exactly adding ones).

    Raises:
        ValueError: a wrong number of observation arrays, a wrong shape, a non-finite value, or a variance that is
            not positive and finite.
        RuntimeError: CG did not reach the residual check (N is positive definite, so CG converges: a failure is
            a bug to report).

    Source: Hay, Rastogi, Miklau, Suciu, VLDB 2010 (least squares over a consistency tree); Hestenes and Stiefel
    1952 (conjugate gradients).
    """
    weights = inverse_variances(family)
    weights = weights / weights.max()  # the estimate does not depend on the weights' scale; this keeps N in range
    values = _observations(family, observations)
    n = family.base_cells
    # least squares is linear: fit(y) = y_base + fit(y - A y_base); the residuals are noise-sized, so the solver's
    # relative tolerance bounds the error of the correction, not of values that may be far larger than the noise
    offset = values[0]
    values = [y - family.margin(m, offset) for m, y in zip(family.members, values)]
    maps = [None if _is_identity(m.to_base) else m.to_base for m in family.members]
    sizes = [None if index is None else np.bincount(index, minlength=m.cells)
             for index, m in zip(maps, family.members)]

    rhs = np.zeros(n)
    diagonal = np.zeros(n)
    for index, size, w, y in zip(maps, sizes, weights, values):
        rhs += w * (y if index is None else y[index])
        diagonal += w if index is None else w * size[index]

    def normal_matvec(x: np.ndarray) -> np.ndarray:
        x = np.ravel(x)
        out = np.zeros(n)
        for index, member, w in zip(maps, family.members, weights):
            out += w * (x if index is None else np.bincount(index, weights=x, minlength=member.cells)[index])
        return out

    normal = LinearOperator((n, n), matvec=normal_matvec, dtype=np.float64)
    jacobi = LinearOperator((n, n), matvec=lambda r: np.ravel(r) / diagonal, dtype=np.float64)
    start = np.zeros(n)
    estimate, info = cg(normal, rhs, x0=start, rtol=RTOL, atol=0.0, maxiter=MAX_ITERATIONS, M=jacobi)
    scale = float(np.linalg.norm(rhs))
    residual = float(np.linalg.norm(rhs - normal_matvec(estimate)))
    # a CG run stopped by MAX_ITERATIONS short of RTOL is still accepted when its true residual passes the check:
    # this runs after the noise was drawn and charged, so it fails only when the estimate is not usable
    if not np.all(np.isfinite(estimate)) or residual > _CHECK_RTOL * scale:
        raise RuntimeError(
            f"least squares over the family {list(family.names)} did not converge (cg info {info}, relative "
            f"residual {residual / scale if scale else residual:.3g}): please report this family's structure"
        )
    return offset + estimate


def exact_sums(family: Family, base: np.ndarray) -> tuple[np.ndarray, float]:
    """Round base values to a power-of-two step so that every member's cells, as sums of them, are exact in binary64.

    step = 2^-k with k the largest integer <= 40 such that (sum |base| + base_cells) * 2^k < 2^52 (k may be
    negative for huge values). Every rounded value is an integer multiple of step, and every sum of any subset of
    them, in any order, is a multiple of step of magnitude below 2^52 step: every partial sum is representable, so
    no addition rounds. A consumer adding the published cells of a member in any order gets the published margin bit
    for bit. Rounding to nearest moves each base cell by at most step / 2 (2^-41 value units for realistic counts).
    ``sum |base|`` is computed with ``math.fsum`` and nudged up one ulp, so k may be one below the largest when the
    bound sits on a power of two: the exactness holds either way.

    Args:
        family: the family (only its base size is used).
        base: float array of shape (base_cells,), value units (for instance :func:`fit`'s output).

    Returns:
        (rounded base: float64 array of shape (base_cells,), step: float, a power of two).

    Raises:
        ValueError: a wrong shape or a non-finite value.
    """
    values = np.asarray(base, dtype=np.float64)
    if values.shape != (family.base_cells,):
        raise ValueError(f"base values have shape {values.shape}, the base {family.base.name!r} has "
                         f"{family.base_cells} cells")
    if not np.all(np.isfinite(values)):
        raise ValueError("base values must be finite")
    bound = math.nextafter(math.fsum(np.abs(values)) + family.base_cells, math.inf)
    _, exponent = math.frexp(bound)  # 2^(exponent - 1) <= bound < 2^exponent
    k = min(_MAX_STEP_BITS, 52 - exponent)
    step = math.ldexp(1.0, -k)
    # scaling by a power of two is exact; rint makes an integer (|.| < 2^52), scaling back is exact again
    rounded = np.ldexp(np.rint(np.ldexp(values, k)), -k)
    return rounded, step


def consistent_values(family: Family, observations: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The published values of every member, consistent and exactly adding up.

    Per member (base first), ``family.margin(member, rounded)`` with ``rounded = exact_sums(family, fit(family,
    observations))[0]``: the least-squares estimate, rounded to the step of :func:`exact_sums`, summed into the
    member's cells. Every member's cells sum exactly (binary64, any order) to the cells of any coarser member.

    Args and raises: as :func:`fit`.

    Returns:
        list of float64 arrays, one per member, of shape (member.cells,), value units.
    """
    rounded, _ = exact_sums(family, fit(family, observations))
    return [family.margin(member, rounded) for member in family.members]
