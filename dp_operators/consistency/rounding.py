"""Non-negative and integer published values for a consistent family, with every margin still the sum of its cells.

The least-squares step (:mod:`dp_operators.consistency.wls`) gives the base estimate whose margins are the best
linear unbiased estimates of the released aggregates; its cells can be negative or fractional. Two optional steps
follow, as the US Census Bureau's TopDown algorithm does (Abowd et al., "The 2020 Census Disclosure Avoidance System
TopDown Algorithm", Harvard Data Science Review 2022, sections 5-6):

1. :func:`nonnegative_fit`: the non-negative base minimising the same weighted least-squares objective (an L2
   projection onto the non-negative orthant in the metric of the noise variances). Every member is then published as
   a sum of base cells, so the margins stay exact; the estimate is no longer unbiased (cells near zero are pushed up,
   and their margins with them) but it is plausible.
2. :func:`controlled_rounding`: an integer base whose every cell is the floor or the ceiling of the real one and whose
   every member cell (margins and total included) is the floor or the ceiling of its real sum, found as a 0-1 linear
   program. Cox ("A constructive procedure for unbiased controlled rounding", JASA 82(398), 1987) proves such a
   rounding exists for a two-way table with both margins and its total; for three-way tables it may not exist, and
   the constraints of the largest margins are then given up one member at a time.

Both functions read only the noised values and public parameters (variances, key domains): they are post-processing
and cost no privacy budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse.linalg import LinearOperator, cg, lsmr

from dp_operators.consistency.structure import Family, Member, one_blas_thread

# A value within this distance of an integer is that integer (both are its floor or its ceiling, up to the error
# of binary64 arithmetic): it gets no 0-1 variable, and a member cell whose real remainder is that close to an
# integer must hit it exactly.
INTEGER_TOLERANCE = 1e-9
# HiGHS's branch-and-bound node limit for one 0-1 program: the limit that decides, so the outcome is the same on any
# machine (two-way tables are solved at the root: their constraint matrix is totally unimodular). Without a solution
# within it the constraints count as infeasible.
MILP_NODE_LIMIT = 2000
# Up to this many fractional base cells the 0-1 program first constrains every member (small programs solve in well
# under a second even when not totally unimodular); above it, only the members two_chains() holds.
FULL_PROGRAM_CELLS = 1000
# ... and at most this many members (a 2 x 2 x 2 cube with its margins has 8).
FULL_PROGRAM_MEMBERS = 8
# A safety time limit (seconds) for one program; only if it binds first can the outcome depend on machine speed.
MILP_TIME_LIMIT = 120.0
# nonnegative_fit stops when the projected-gradient step (value units) is below this, relative to max(1, max cell).
FIT_TOLERANCE = 1e-9
_MAX_NEWTON_STEPS = 200
_ARMIJO = 1e-4


def _check_variances(family: Family) -> np.ndarray:
    variances = np.array([member.variance for member in family.members], dtype=np.float64)
    if not np.all(np.isfinite(variances)) or np.any(variances <= 0):
        raise ValueError(f"every member of the family needs a finite positive noise variance, got {variances.tolist()}")
    return variances


def _design(family: Family, observations: Sequence[np.ndarray]) -> tuple[sp.csr_array, np.ndarray]:
    """The stacked design matrix (one row per member cell, rows scaled by 1 / sd) and the scaled observations."""
    if len(observations) != len(family.members):
        raise ValueError(f"{len(observations)} observation vectors for a family of {len(family.members)} members")
    sds = np.sqrt(_check_variances(family))
    n = family.base_cells
    blocks, rhs = [], []
    for member, observed, sd in zip(family.members, observations, sds):
        y = np.asarray(observed, dtype=np.float64)
        if y.shape != (member.cells,):
            raise ValueError(f"member {member.name!r}: observations of shape {y.shape}, expected ({member.cells},)")
        if not np.all(np.isfinite(y)):
            raise ValueError(f"member {member.name!r}: observations must be finite")
        blocks.append(
            sp.csr_array((np.full(n, 1.0 / sd), (member.to_base, np.arange(n))), shape=(member.cells, n))
        )
        rhs.append(y / sd)
    return sp.vstack(blocks, format="csr"), np.concatenate(rhs)


@one_blas_thread
def nonnegative_fit(
    family: Family, observations: Sequence[np.ndarray], start: np.ndarray | None = None
) -> np.ndarray:
    """The non-negative base minimising the weighted least-squares objective of the family.

    Minimises ``sum_m ||A_m x - y_m||^2 / variance_m`` over ``x >= 0``, where ``A_m`` sums base cells into the cells
    of member ``m`` (``member.to_base``) and ``y_m`` are its noised values: the objective of the least-squares step
    (Hay, Rastogi, Miklau, Suciu, VLDB 2010), restricted to the non-negative orthant, as TopDown's non-negative L2
    projection (Abowd et al. 2022). The problem is a strictly convex quadratic program (the base is a member, so the
    design has full column rank): its minimiser is unique.

    Solver: Bertsekas's projected Newton method for bound constraints (Bertsekas, "Projected Newton methods for
    optimization problems with simple constraints", SIAM J. Control Optim. 20(2), 1982): at each step the cells at
    zero with a positive gradient are held at zero, a Newton step on the others is solved by conjugate gradients on
    the normal equations (``scipy.sparse.linalg.cg`` on scipy.sparse operators: the Hessian of a product family has
    at most 2^axes distinct eigenvalues, so few iterations are needed), and an Armijo search along the projection
    arc ``max(x + alpha d, 0)`` gives the step; it converges superlinearly once the cells at zero are identified.
    ``scipy.optimize.lsq_linear`` (method ``trf`` with ``lsmr``) solves the same problem but cannot be warm-started
    and did not converge on a 100 x 100 x 10 table with all its margins in 400 iterations (21 s), where this method
    converges in 1-3 s; its exact dense method (``bvls``) is the reference in the tests.

    Args:
        family: the family's structure; ``members[0]`` is the base.
        observations: per member, its noised values: float arrays of shape ``(member.cells,)``, value units.
        start: optional warm start of shape ``(base cells,)``, usually the unconstrained least-squares estimate;
            the solver starts from ``max(start, 0)``. Without it, the unconstrained estimate is computed (LSMR).

    Returns:
        float64 array of shape ``(base cells,)``, every cell ``>= 0`` (cells the optimum puts on the bound are exactly
        0), value units. The solver stops when the projected-gradient step is below ``FIT_TOLERANCE`` times
        ``max(1, max cell)`` value units, or when it stops making progress (then the last iterate, which is
        non-negative and no worse than the start, is returned: a data value never raises).

    Raises:
        ValueError: observations of the wrong count, shape, or not finite; a variance that is not finite and
            positive; a start of the wrong shape or not finite.
    """
    design, rhs = _design(family, observations)
    n = family.base_cells
    if start is None:
        x = lsmr(design, rhs, atol=1e-14, btol=1e-14, maxiter=10 * n)[0]
    else:
        x = np.asarray(start, dtype=np.float64)
        if x.shape != (n,) or not np.all(np.isfinite(x)):
            raise ValueError(f"start must be a finite array of shape ({n},), got shape {x.shape}")
    x = _projected_newton(design, rhs, np.maximum(x, 0.0))
    x[x < 0] = 0.0
    return x


def _projected_newton(design: sp.csr_array, rhs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bertsekas's projected Newton iteration for min 0.5 ||design x - rhs||^2 over x >= 0, from a feasible x."""
    transpose = design.T.tocsr()
    # every base cell lies in exactly one cell of every member: the Hessian's diagonal is one number
    curvature = float(design.multiply(design).sum(axis=0).max())
    residual = design @ x - rhs
    best_step, stalled = np.inf, 0
    for _ in range(_MAX_NEWTON_STEPS):
        gradient = transpose @ residual
        # the projected-gradient step in value units: zero exactly at the optimum (KKT conditions)
        step = np.abs(x - np.maximum(x - gradient / curvature, 0.0)).max()
        if step <= FIT_TOLERANCE * max(1.0, x.max()):
            break
        if step < 0.5 * best_step:
            best_step, stalled = step, 0
        else:
            # the method converges, so a long run without halving the step means rounding error has taken over
            stalled += 1
            if stalled >= 50:
                break
        bound = min(1e-3, step)
        held = (x <= bound) & (gradient > 0)
        free = (~held).astype(np.float64)

        def hessian(v: np.ndarray, free: np.ndarray = free) -> np.ndarray:
            return free * (transpose @ (design @ (free * v)))

        operator = LinearOperator((x.size, x.size), matvec=hessian, rmatvec=hessian, dtype=np.float64)
        # inexact Newton: the step is solved more accurately as the iterate nears the optimum
        newton, _ = cg(operator, -free * gradient, rtol=max(1e-12, min(1e-2, step)), maxiter=10 * x.size)
        direction = free * newton - (1.0 - free) * gradient / curvature
        predicted_free = -float(gradient @ (free * direction))
        alpha = 1.0
        while alpha > 1e-12:
            candidate = np.maximum(x + alpha * direction, 0.0)
            change = candidate - x
            design_change = design @ change
            # the exact change of the objective, without the cancellation of differencing two large objectives
            decrease = -(float(gradient @ change) + 0.5 * float(design_change @ design_change))
            required = _ARMIJO * (alpha * predicted_free - float(gradient @ ((1.0 - free) * change)))
            if decrease >= required:
                x = candidate
                residual = design @ x - rhs
                break
            alpha *= 0.5
        else:
            break
    return x


def controlled_rounding(family: Family, base: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """An integer base whose cells and member sums are each the floor or the ceiling of their real values.

    Every base cell becomes ``floor`` or ``ceil`` of its value (integers stay), and, for every member whose
    constraints are kept, every member cell's sum of rounded base cells is the floor or the ceiling of its real sum:
    a *controlled rounding* (Cox, "A constructive procedure for unbiased controlled rounding", JASA 82(398), 1987;
    TopDown's second step, Abowd et al., Harvard Data Science Review 2022). Published margins, recomputed as sums of
    the rounded base, are integers and add up exactly.

    Method: one binary per fractional base cell (1 = round up), two-sided linear constraints per member cell
    (a sparse matrix), minimising ``sum |rounded - base|`` (linear in the binaries), solved by
    ``scipy.optimize.milp`` (HiGHS branch and cut, deterministic). For a two-way table with its two margins and
    its total (or a one-column hierarchy) the member cells form two laminar families of sets (rows nested in the
    total; columns), whose incidence matrix is totally unimodular, and the real fractions are a feasible point of
    the relaxation: an integer solution always exists (Cox 1987) and HiGHS finds it at the root. For three or more
    dimensions one may not exist, and searching for one can take minutes at 10^5 cells: above
    ``FULL_PROGRAM_CELLS`` fractional cells the program constrains only the members :func:`two_chains` holds
    (totally unimodular, so solved at the root, without a time limit: seconds at 10^5 cells, about a minute and a
    half at 10^6), and the others are checked after the rounding (``kept``). Should a program still fail, the
    constraints of the member outside the chains with the most cells (ties: the later in spec order) are dropped and
    it is solved again, down to the chains' program, which is totally unimodular with the real fractions feasible,
    so it has a solution: the members :func:`guaranteed_rounding` names (the base and the chains) keep their
    floor/ceiling on every input, which the published half-widths rely on. (Were even that program to fail, which
    only float error beyond ``_sum_bounds``'s tolerance in 10^6 rows could cause, the chains would be given up the
    same way, down to the one-cell members; ``kept`` then says so and the caller must not publish guaranteed widths.)
    One-cell members (the total) alone are rounded by largest remainder, which always satisfies them: the rounding
    closest to the base whose grand total is the floor or the ceiling of the real total (it is also used when the
    family has no total). A program
    without a solution within ``MILP_NODE_LIMIT`` branch-and-bound nodes counts as infeasible (the same outcome on
    any machine), as does one without a solution within the safety limit ``MILP_TIME_LIMIT`` seconds (only then
    can the outcome depend on the machine's speed); a solution found within the limits that is not proven optimal
    is kept.

    Rounding is not unbiased here: the solution is the closest rounding, not a random one.

    Args:
        family: the family's structure; ``members[0]`` is the base.
        base: float array of shape ``(base cells,)``, value units (counts; for sums, the caller divides by the grid
            first), finite and at most 2^62 in absolute value (the engine's value range; a double beyond 2^52 is an
            integer already).

    Returns:
        ``(rounded, kept)``: the rounded base, int64 array of shape ``(base cells,)`` (non-negative where the base is);
        and the names of the members (base first, in family order) every cell of which is the floor or the ceiling of
        its real sum, checked on the result: every member whose constraints were kept, and any other the solution
        happens to satisfy.

    Raises:
        ValueError: a base of the wrong shape, not finite, or beyond 2^62 in absolute value.
    """
    values = np.asarray(base, dtype=np.float64)
    n = family.base_cells
    if values.shape != (n,):
        raise ValueError(f"base must have shape ({n},), got {values.shape}")
    if not np.all(np.isfinite(values)) or np.any(np.abs(values) > 2.0**62):
        raise ValueError("base cells must be finite and at most 2^62 in absolute value to round them")
    nearest = np.rint(values)
    integral = np.abs(values - nearest) <= INTEGER_TOLERANCE
    low = np.where(integral, nearest, np.floor(values))
    # the real remainder above `low`: in [0, 1) for a fractional cell, within INTEGER_TOLERANCE of 0 for an integer
    remainder = values - low
    fractional = np.flatnonzero(~integral)
    # per member (the base's entry unused), the allowed numbers of rounded-up base cells in each of its cells
    bounds = [_sum_bounds(member.to_base, member.cells, remainder) for member in family.members]
    up = np.zeros(fractional.size, dtype=bool)
    if fractional.size:
        # the members two chains of nested margins can hold: their constraints are totally unimodular, so a
        # controlled rounding exists and HiGHS finds it at the root; drop order if not: most cells first, the
        # later in spec order first on ties
        chains = two_chains(family)
        # every member at once only for a family two chains hold anyway, or a small program over few members: a
        # program that is not totally unimodular can branch for minutes even at a few hundred cells (3^6 with 63
        # margins), and would then be decided by the clock
        unimodular = len(chains) == len(family.members) - 1 or fractional.size > FULL_PROGRAM_CELLS \
            or len(family.members) > FULL_PROGRAM_MEMBERS
        def largest_first(indexes) -> list[int]:
            return sorted(indexes, key=lambda i: (-family.members[i].cells, -i))

        # the members outside the chains are given up first (largest first), so that the program always ends at the
        # chains' totally unimodular one: the members guaranteed_rounding() names keep their floor/ceiling whatever
        # the values, and the published half-widths can rely on it
        others = [] if unimodular else largest_first(i for i in range(1, len(family.members)) if i not in chains)
        constrained = others + largest_first(chains)
        while True:
            if all(family.members[i].cells == 1 for i in constrained):
                lower, upper = _sum_bounds(np.zeros(n, dtype=np.int64), 1, remainder)
                up = _largest_remainder(remainder[fractional], int(lower[0]), int(upper[0]))
                break
            solution = _solve_rounding(
                [(family.members[i].to_base, family.members[i].cells, *bounds[i]) for i in constrained],
                fractional,
                remainder[fractional],
                # a totally unimodular program is solved at the root, however long that takes: no time limit, so
                # the outcome never depends on the machine's speed
                MILP_TIME_LIMIT if any(i not in chains for i in constrained) else None,
            )
            if solution is not None:
                up = solution
                break
            constrained = constrained[1:]
    rounded = low.astype(np.int64)
    rounded[fractional[up]] += 1
    kept = [family.base.name]
    for member, (lower, upper) in zip(family.members[1:], bounds[1:]):
        ups = np.bincount(member.to_base[fractional[up]], minlength=member.cells)
        if np.all((ups >= lower) & (ups <= upper)):
            kept.append(member.name)
    return rounded, tuple(kept)


def guaranteed_rounding(family: Family) -> dict[str, int]:
    """Per member (base first), the most :func:`controlled_rounding` can move one of its cells, in units (strictly
    less than this): a function of the family's structure only, never of the values rounded.

    The base and the members :func:`two_chains` holds keep their floor/ceiling on every input (their program is
    totally unimodular with the real fractions feasible): each of their cells moves by less than 1, so 1. Any other
    member's cell is a union of cells of some guaranteed member (the base at least); the sum of k such cells, each
    moved by less than 1, moves by less than k: the smallest such k over the guaranteed members it is a union of.
    Whether the rounding of one draw happens to keep such a member too (``kept``) is not used, so the half-widths
    built on these allowances are the same on every draw.
    """
    guaranteed = [0, *two_chains(family)]
    allowances = {}
    for index, member in enumerate(family.members):
        if index in guaranteed:
            allowances[member.name] = 1
            continue
        best = None
        for finer in (family.members[i] for i in guaranteed):
            if member.cells and nested(member, finer):
                # distinct cells of `finer` per cell of `member`
                pairs = np.unique(finer.to_base.astype(np.int64) * member.cells + member.to_base)
                most = int(np.bincount(pairs % member.cells, minlength=member.cells).max())
                best = most if best is None else min(best, most)
        allowances[member.name] = 1 if best is None else best
    return allowances


def nested(coarser: Member, finer: Member) -> bool:
    """True when every cell of ``coarser`` is a union of cells of ``finer`` (the base cells of one ``finer`` cell
    all lie in one ``coarser`` cell)."""
    pairs = np.unique(finer.to_base * coarser.cells + coarser.to_base)
    return pairs.size == np.unique(finer.to_base).size


def two_chains(family: Family) -> list[int]:
    """Indexes of the members (not the base) that two chains of nested margins hold, chosen greedily from the
    coarsest (the total, then the smallest margins; spec order on ties). The cells of the members of one chain form
    a laminar family of sets, and the incidence matrix of two laminar families is totally unimodular (a network
    matrix; Schrijver, *Theory of Linear and Integer Programming*, 1986, section 19.3): with the real fractions
    feasible, the 0-1 program of a controlled rounding then has an integral optimum at the root of its relaxation.
    A two-way table with both margins and the total fits (total, one margin; the other margin); a three-way table
    with its two-way margins does not, and the members left out are only checked after the rounding."""
    chains: list[list[int]] = [[], []]
    for index in sorted(range(1, len(family.members)), key=lambda i: (family.members[i].cells, i)):
        for chain in chains:
            if not chain or nested(family.members[chain[-1]], family.members[index]):
                chain.append(index)
                break
    return sorted(chains[0] + chains[1])


def _sum_bounds(to_base: np.ndarray, cells: int, remainder: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per member cell, the allowed numbers of its base cells rounded up: floor and ceil of its real remainder.

    A remainder within a summation allowance of an integer must hit it exactly (that integer is the floor or the
    ceiling of the real sum either way, and binary64 sums of fractions are not exact).
    """
    total = np.bincount(to_base, weights=remainder, minlength=cells)
    nearest = np.rint(total)
    exact = np.abs(total - nearest) <= 1e-6
    lower = np.where(exact, nearest, np.floor(total))
    upper = np.where(exact, nearest, np.ceil(total))
    return lower, upper


def _largest_remainder(fractions: np.ndarray, lower: int, upper: int) -> np.ndarray:
    """Which fractional cells to round up, between ``lower`` and ``upper`` of them (the floor and ceiling of the
    grand total's remainder), closest to the real cells: the ``lower`` largest fractions, and one more if there is
    room and it exceeds one half (index order on ties).
    """
    order = np.argsort(-fractions, kind="stable")
    count = max(lower, 0)
    if count < min(upper, fractions.size) and fractions[order[count]] > 0.5:
        count += 1
    up = np.zeros(fractions.size, dtype=bool)
    up[order[:count]] = True
    return up


def _solve_rounding(
    constraints: Sequence[tuple[np.ndarray, int, np.ndarray, np.ndarray]],
    fractional: np.ndarray,
    fractions: np.ndarray,
    time_limit: float | None = MILP_TIME_LIMIT,
) -> np.ndarray | None:
    """The 0-1 program of a controlled rounding: which fractional cells to round up.

    Args:
        constraints: per constrained member, ``(to_base, cells, lower, upper)``: the allowed numbers of rounded-up
            base cells in each of its cells.
        fractional: indexes of the fractional base cells, shape ``(k,)``.
        fractions: their fractional parts, in (0, 1), shape ``(k,)``.

    Returns:
        bool array of shape ``(k,)``, or None when the program is infeasible or has no solution within
        ``MILP_NODE_LIMIT`` nodes and ``MILP_TIME_LIMIT`` seconds.
    """
    k = fractional.size
    rows, lower_bounds, upper_bounds = [], [], []
    for to_base, cells, lower, upper in constraints:
        counts = np.bincount(to_base[fractional], minlength=cells)
        # a row binds only if it excludes some count between 0 and its number of binaries
        binding = (lower > 0) | (upper < counts)
        if np.any(binding):
            matrix = sp.csr_array((np.ones(k), (to_base[fractional], np.arange(k))), shape=(cells, k))
            rows.append(matrix[binding])
            lower_bounds.append(lower[binding])
            upper_bounds.append(upper[binding])
    # rounding a cell up costs |ceil - x| = 1 - f instead of f: minimise the sum of (1 - 2 f) over the cells rounded up
    cost = 1.0 - 2.0 * fractions
    if not rows:
        return cost < 0
    result = milp(
        cost,
        integrality=np.ones(k),
        bounds=Bounds(0, 1),
        constraints=LinearConstraint(
            sp.vstack(rows, format="csr"), np.concatenate(lower_bounds), np.concatenate(upper_bounds)
        ),
        options={"node_limit": MILP_NODE_LIMIT} | ({} if time_limit is None else {"time_limit": time_limit}),
    )
    if result.x is None:
        return None
    return np.rint(result.x) > 0.5
