"""Public bounds on each noised component: how far one privacy unit moves it, how far the upstream's arithmetic can
move it, and how large it can get. From the spec alone (bounds, grid, contribution bounds, ``upstream``), never data.

Why (docs/adr/0017): neighbouring float sums can land further apart than neighbouring true sums (Casacuberta,
Shoemate, Vadhan, Wagaman, "Widespread Underestimation of Sensitivity in Differentially Private Libraries and How to
Fix It", CCS 2022): with bounds [0, 1] and grid 1, the neighbours {0.49999999999999994} and {0.49999999999999994,
1} have float sums 0.49999999999999994 and 1.5, which round to 0 and 2 grid units, two apart where one was planned.

The float model (``upstream.arithmetic: binary64``): the upstream hands over, per partition, IEEE 754 double
precision sums of at most ``max_rows`` values, each a double clipped to the bounds (at the double nearest each
bound), added in any order and any grouping (left to right, pairwise as numpy does, in parallel chunks as a
database does: every such method is a tree of n - 1 additions); a sum of squares adds the rounded products
``fl(x * x)``. Each value then goes through at most n - 1 roundings ``fl(a + b) = (a + b)(1 + d)``, |d| <= u
(exact when the sum underflows), and a product through one more, ``fl(x * x) = x^2 (1 + d) + e`` with |e| at most
half the smallest subnormal when it underflows; so (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd
ed., 2002: chapter 2 for the model of arithmetic, Lemma 3.1 and 3.3 for gamma_k, section 4.2 for summation in any
order, and Higham, "The accuracy of floating point summation", SIAM J. Sci. Comput. 14, 1993, for the general
class of summation trees):

* |float sum - true sum| <= gamma_{n-1} * sum |x_i| <= gamma_{n-1} * n * M, with gamma_k = k u / (1 - k u),
  u = 2^-53 and M the largest |bound|;
* |float sum of squares - true sum of squares| <= gamma_n * n * M^2 + 2 n eta, eta = 2^-1075.

Neighbouring true values differ by at most Delta, each float value is within E of its true value, so neighbouring
float values differ by at most Delta + 2E, and rounding to the grid once maps them to integers at most
ceil((Delta + 2E) / grid) apart: that is the planned Linf. With exact arithmetic (integers, ``Decimal``,
``Fraction``) E = 0 and Linf = ceil(Delta / grid), as before.

A partition the privacy unit does not touch has the same true value in both neighbours, but the upstream may sum
it in another order there (a row added elsewhere shifts a database's chunks, or a file's row order): its float
values are each within E of that one true value, so within 2E of each other, and their grid integers at most
ceil(2E / grid) apart (:attr:`ComponentBound.untouched_allowance`). With public keys the plan adds that to every
partition beyond L0; under partition selection the number of partitions is private, so binary64 is refused
(:func:`check_partition_selection`; docs/adr/0017).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction

from dp_operators.release.errors import ReleaseConfigError
from dp_operators.release.upstream_types import SATURATION
from dp_operators.spec import Aggregate

__all__ = [
    "UNIT_ROUNDOFF",
    "ComponentBound",
    "binary64_spacing",
    "check_component",
    "check_partition_selection",
    "component_bound",
    "gamma",
]

#: u, the unit roundoff of IEEE 754 binary64 (round to nearest): half the spacing of doubles just above 1.
UNIT_ROUNDOFF = Fraction(1, 2**53)
#: eta, the largest absolute error of a product that underflows: half the smallest subnormal double, 2^-1075.
_UNDERFLOW_ERROR = Fraction(1, 2**1075)
_SMALLEST_NORMAL = Fraction(1, 2**1022)


def gamma(k: int) -> Fraction:
    """gamma_k = k u / (1 - k u), exactly (Higham 2002, Lemma 3.1): |prod (1 + d_i)^(+-1) - 1| <= gamma_k for k
    roundings |d_i| <= u. Raises ValueError unless 0 <= k and k u < 1."""
    if k < 0 or k * UNIT_ROUNDOFF >= 1:
        raise ValueError(f"gamma_k needs 0 <= k < 2^53, got {k}")
    return k * UNIT_ROUNDOFF / (1 - k * UNIT_ROUNDOFF)


def binary64_spacing(magnitude: Fraction) -> Fraction:
    """The gap between consecutive binary64 numbers at ``magnitude`` (> 0): 2^(e - 52) in the binade
    [2^e, 2^(e+1)), 2^-1074 among the subnormals. Exact."""
    if magnitude < _SMALLEST_NORMAL:
        return Fraction(1, 2**1074)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    while Fraction(2) ** exponent > magnitude:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= magnitude:
        exponent += 1
    return Fraction(2) ** (exponent - 52)


def _nearest_binary64(value: Fraction) -> Fraction:
    # float(Fraction) is an integer true division, which CPython rounds correctly (to nearest)
    return Fraction(float(value))


@dataclass(frozen=True)
class ComponentBound:
    """Public bounds on one noised component of one partition, in the component's value units (the aggregate's
    units for sums, squared units for ``sum_squares``, people for counts).

    Attributes:
        aggregate, component: which aggregate and component (``count``, ``sum``, ``sum_squares``, ``selection``).
        grid: the resolution the value is rounded to (``grid``, ``grid^2`` for ``sum_squares``, 1 for counts).
        sensitivity: Delta, the most one privacy unit moves the true value (``max_contributions_per_partition``
            times the largest per-value change; for binary64, with the bounds widened to the doubles nearest them).
        declared_sensitivity: the same from the declared bounds, as the exact path plans it.
        summation_error: E, the most the upstream's float value can differ from the true value (0 when exact).
        interval_error: the most the engine's value, before rounding, can differ from the true value of the
            declared aggregate: E, plus for means and variances the widening of the bounds (the engine clamps to
            the declared range).
        rounded: the value is rounded to the grid (sums, sums of squares); counts are integers.
        arithmetic, max_rows: the declared ``upstream``.
        largest_float: the largest |float| the upstream can hand over (binary64 with ``max_rows``), else None.
        largest_value: the largest |value| the engine can round to the grid, from ``max_rows`` (else from one
            privacy unit's contributions, the least any partition must carry).
    """

    aggregate: str
    component: str
    grid: Fraction
    sensitivity: Fraction
    declared_sensitivity: Fraction
    summation_error: Fraction
    interval_error: Fraction
    rounded: bool
    arithmetic: str
    max_rows: int | None
    largest_float: Fraction | None
    largest_value: Fraction

    @property
    def linf(self) -> int:
        """Linf in grid units: ceil((Delta + 2E) / grid), the most one privacy unit moves the rounded integer."""
        return math.ceil((self.sensitivity + 2 * self.summation_error) / self.grid)

    @property
    def declared_linf(self) -> int:
        """Linf the exact path would plan: ceil(Delta_declared / grid)."""
        return math.ceil(self.declared_sensitivity / self.grid)

    @property
    def float_allowance(self) -> int:
        """Grid units the float allowance adds to Linf (0 on the exact path)."""
        return self.linf - self.declared_linf

    @property
    def untouched_allowance(self) -> int:
        """a = ceil(2E / grid) in grid units: the most a partition the privacy unit does not touch can move
        between neighbours (same true value, two summation orders, each float within E of it). 0 on the exact
        path and for counts, whose values do not depend on the order."""
        return math.ceil(2 * self.summation_error / self.grid)


def component_bound(aggregate: Aggregate, component: str, per_partition: int) -> ComponentBound:
    """The public bounds of one component of ``aggregate`` (see :class:`ComponentBound`), per partition.

    Per-value change D (one contribution), largest per-partition value V with n = ``upstream.max_rows``:

    ==========================  ======================  ================================  ==========================
    component                   D                       E (binary64)                      V
    ==========================  ======================  ================================  ==========================
    count (and selection)       1                       0 (an integer)                    n
    sum of a ``sum``            M                       gamma_{n-1} n M                   n M + E
    sum of a mean / variance    h (centred)             gamma_{n-1} n M (raw sum S)       h n (clamped to [-hN, hN])
    sum_squares                 h^2 (centred)           E_Q + 2 |m| E_S                   h^2 n (clamped to [0, h^2 N])
    ==========================  ======================  ================================  ==========================

    M = max(|lower|, |upper|), m = (lower + upper)/2, h = (upper - lower)/2; Delta = ``per_partition`` * D.
    Means and variances are centred by the engine, but the upstream sums the raw clipped values, so the float
    error of S is bounded with M, not h; the centred sum of squares Q - 2 m S + m^2 N carries Q's error plus
    2 |m| times S's; the count is exact. For binary64 the bounds are first widened to the doubles nearest them
    (an upstream clipping at ``0.1`` clips at 0.1000000000000000055...).
    """
    selection_or_count = component in ("count", "selection")
    upstream = aggregate.upstream
    n = upstream.max_rows
    # D and the grid power from the spec model (the one definition the load-time Linf limit checks too): the
    # exact path plans exactly it; binary64 widens the bounds below
    change, power = aggregate.largest_change("count" if selection_or_count else component)
    declared = per_partition * change
    if selection_or_count:
        largest = Fraction(n if n is not None else per_partition)
        return ComponentBound(
            aggregate.name, component, Fraction(1), declared, declared, Fraction(0), Fraction(0), False,
            "exact", n, None, largest,
        )
    grid = aggregate.grid**power
    binary64 = upstream.arithmetic == "binary64"
    lower, upper = aggregate.exact_bounds  # type: ignore[misc]
    if binary64:
        wide_lower, wide_upper = min(lower, _nearest_binary64(lower)), max(upper, _nearest_binary64(upper))
    else:
        wide_lower, wide_upper = lower, upper
    largest_magnitude = max(abs(wide_lower), abs(wide_upper))
    rows = n if n is not None else per_partition
    sum_error = gamma(rows - 1) * rows * largest_magnitude if binary64 else Fraction(0)
    largest_float = rows * largest_magnitude + sum_error if binary64 else None
    if aggregate.kind == "sum":
        # D of the widened bounds: max(|lower|, |upper|) of the doubles the upstream clips at
        return ComponentBound(
            aggregate.name, component, grid, per_partition * largest_magnitude if binary64 else declared, declared,
            sum_error, sum_error, True, upstream.arithmetic, n, largest_float,
            rows * largest_magnitude + sum_error,
        )
    # means and variances are centred at the declared middle m: a widened bound moves up to wide_half from it
    middle, half = (lower + upper) / 2, (upper - lower) / 2
    wide_half = max(wide_upper - middle, middle - wide_lower)
    if component == "sum":
        return ComponentBound(
            aggregate.name, component, grid, per_partition * wide_half if binary64 else declared, declared,
            sum_error, sum_error + rows * (wide_half - half) if binary64 else Fraction(0), True,
            upstream.arithmetic, n, largest_float, rows * half,
        )
    squares_error = Fraction(0)
    squares_float = None
    if binary64:
        raw_squares_error = gamma(rows) * rows * largest_magnitude**2 + 2 * rows * _UNDERFLOW_ERROR
        squares_error = raw_squares_error + 2 * abs(middle) * sum_error
        squares_float = rows * largest_magnitude**2 + raw_squares_error
    return ComponentBound(
        aggregate.name, component, grid, per_partition * wide_half**2 if binary64 else declared, declared,
        squares_error, squares_error + rows * (wide_half**2 - half**2) if binary64 else Fraction(0), True,
        upstream.arithmetic, n, squares_float, rows * half**2,
    )


def _largest_rows_within(aggregate: Aggregate, component: str, per_partition: int) -> int:
    """The largest ``max_rows`` whose float allowance 2E stays within the sensitivity (bisection; E grows with n)."""

    def fits(rows: int) -> bool:
        bound = component_bound(
            aggregate.model_copy(update={"upstream": aggregate.upstream.model_copy(update={"max_rows": rows})}),
            component, per_partition,
        )
        return 2 * bound.summation_error <= bound.sensitivity

    low, high = 1, aggregate.upstream.max_rows or 1
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _number(value: Fraction | float) -> str:
    return f"{float(value):.6g}"


def _grid_for(bound: ComponentBound, resolution: Fraction) -> str:
    """The smallest aggregate ``grid`` whose component grid (``grid``, or ``grid^2`` for ``sum_squares``) is at
    least ``resolution``, rounded up to 6 significant digits: advice a user can copy."""
    with localcontext() as context:
        context.prec, context.rounding = 30, ROUND_CEILING
        grid = Decimal(resolution.numerator) / Decimal(resolution.denominator)
        if bound.component == "sum_squares":
            grid = grid.sqrt().next_plus()  # Decimal.sqrt rounds half-even whatever the context: one step up
        context.prec = 6
        return f"{+grid:g}"


def check_component(aggregate: Aggregate, bound: ComponentBound, per_partition: int) -> None:
    """Refuse, from public parameters only, a component the engine cannot release as planned.

    * binary64: the spacing of doubles at the largest total the upstream can hand over is coarser than the grid
      (the float cannot carry the grid);
    * binary64: the allowance 2E alone exceeds the sensitivity Delta (Linf, and so the noise, more than doubled);
    * the largest value, in grid units, exceeds the saturation limit of +-2^62 grid units (from ``max_rows``, or
      from a single privacy unit's contributions when no row bound is declared).

    Raises:
        ReleaseConfigError: naming the aggregate, the component and what to change. The numbers in the message
            come from the spec (bounds, grid, max_rows), never from data.
    """
    where = f"aggregate {aggregate.name!r} ({bound.component})"
    units = "grid units" if bound.component != "sum_squares" else "grid^2 units"
    bounds = [float(b) for b in aggregate.bounds or ()]
    exact_advice = (
        "return exact sums instead (Python or numpy integers, Decimal as SQL SUM over NUMERIC/DECIMAL returns it, "
        "or Fraction) and set upstream.arithmetic: exact"
    )
    if bound.largest_float is not None:
        spacing = binary64_spacing(bound.largest_float)
        if spacing > bound.grid:
            raise ReleaseConfigError(
                f"{where}: upstream.arithmetic binary64 cannot carry grid {_number(aggregate.grid)}: "
                f"{bound.max_rows} values within bounds {bounds} can add up to {_number(bound.largest_float)}, "
                f"where consecutive doubles are {_number(spacing)} apart, more than one grid step. Make grid at "
                f"least {_grid_for(bound, spacing)}, lower upstream.max_rows, or {exact_advice}"
            )
        if 2 * bound.summation_error > bound.sensitivity:
            fitting = _largest_rows_within(aggregate, bound.component, per_partition)
            raise ReleaseConfigError(
                f"{where}: the binary64 summation error allowance for up to {bound.max_rows} values (2E = "
                f"{_number(2 * bound.summation_error)}) exceeds the sensitivity itself "
                f"({_number(bound.sensitivity)}), which would more than double the noise. Lower upstream.max_rows "
                f"(at most {fitting} keeps the allowance within the sensitivity), or {exact_advice}"
            )
    if bound.largest_value / bound.grid + Fraction(1, 2) > SATURATION:
        source = (
            f"upstream.max_rows {bound.max_rows}" if bound.max_rows is not None
            else "a single privacy unit's contributions"
        )
        raise ReleaseConfigError(
            f"{where}: with bounds {bounds} and {source}, a partition's value can reach "
            f"{_number(bound.largest_value / bound.grid)} {units}, beyond the engine's saturation limit of 2^62 "
            f"(about 4.6e18) {units}, where values are clamped and released wrong. Make grid at least "
            f"{_grid_for(bound, bound.largest_value / SATURATION)}"
            + (" or lower upstream.max_rows" if bound.max_rows is not None else "")
        )


def check_partition_selection(aggregate: Aggregate) -> None:
    """Refuse binary64 sums under partition selection, from the spec alone (docs/adr/0017).

    A float sum can move by up to ceil(2E / grid) grid units in *every* partition, touched by the added privacy unit
    or not, since the upstream may sum each one in another order. With public keys the plan charges that for the
    P - L0 untouched partitions (P public); under partition selection the partitions are the keys found in the
    data, so their number, and with it the L1 and L2 distance between neighbours, is not bounded by any public
    parameter. No rounding of a float to the grid avoids it: every deterministic rounding has boundaries, and a sum
    next to one crosses it when its order changes.

    Raises:
        ReleaseConfigError: naming the aggregate and the two ways out (exact sums, or public keys).
    """
    if aggregate.partition_selection is None or aggregate.upstream.arithmetic != "binary64":
        return
    raise ReleaseConfigError(
        f"aggregate {aggregate.name!r}: upstream.arithmetic binary64 cannot be used with partition_selection: a "
        "float sum can move in every partition, even one the added person never touches (the upstream may sum it "
        "in another order), and under partition selection the number of partitions comes from the data, so no "
        "allowance for them can be planned. To fix it: return exact sums (Python or numpy integers, Decimal as SQL "
        "SUM over NUMERIC/DECIMAL returns it, or Fraction) and set upstream.arithmetic: exact, or give the public "
        "key domain ('keys' instead of 'partition_selection'), over which the allowance is planned"
    )
