"""The column type of published values in Parquet files (the release's Parquet output and rows files), chosen from
public parameters only, never from the values of a run: neighbouring inputs give the same schema.

A binary64 column rounds an integer above 2^53 (a noised count of 2^53 + 1 was written as 2^53), and for a rows file
that file is the only copy of the values. Each aggregate's values get the narrowest type that holds every value it
can publish exactly (:func:`aggregate_value_type`):

* ``int64``: a count, or a sum on a grid of 1, whose values stay within int64 (below);
* ``decimal(p, s)``: a sum on any other grid (``s`` the grid's decimal places), or a count or sum whose values may
  pass int64; ``decimal128`` up to 38 digits (every single aggregate fits there), ``decimal256`` for wider joins;
* ``float64``: means and variances (binary floats by construction, computed in float arithmetic from noised
  components), and members of a consistent family (``postprocess.consistent``: post-processed values are doubles
  by construction; see the limitation below).

**Bounds.** Every grid integer the engine holds is within +-2^62 (``SATURATION``) before noise. Noise is not bounded,
so the bound is a tail bound: a discrete Laplace of scale t exceeds 90 t in magnitude with probability at most
2 e^-90 < 2^-127 (its tail is e^(-m/t) / (1 + e^(-1/t))), a discrete Gaussian of parameter sigma^2 (its variance
is slightly smaller) exceeds 13.5 sigma
with probability at most 2 e^-91.125 (it is sub-Gaussian with variance proxy sigma^2: Canonne, Kamath, Steinke 2020,
section 2). A value beyond the bound (about one value in 10^38; a release of N cells, N times that) is refused
when written, not rounded
(:meth:`ValueType.column_value`). The scale comes from the step's published description (its exact
``scale_grid_units_exact`` / ``sigma2_grid_units_exact``); a description without them (an older release) is
bounded with the largest scale a plan allows (2^62 grid units).

**The grid.** The published description holds the grid as a double (``grid``); its shortest decimal
(``repr``) is taken as the grid. For a spec whose grid is not that decimal (``1/3``, or a grid of more than 17
significant digits) values would not fit a decimal column: the operator refuses such a spec for Parquet output or
rows files before any budget is spent (:func:`grid_problem`).

**Limitation.** A consistent family's values are doubles when post-processed, but a family left as released (a
member may be saturated) publishes its noised values, and an ``integer`` family publishes integer margins: values
beyond 2^53 there round in the float64 column (their JSON keeps them exact). Which of these a family is cannot be
read from a published output without its values.

A Parquet file holds one ``value`` column for every aggregate of a release: its type is the join of theirs
(:func:`join`). A release mixing binary-float aggregates with counts or sums has no single exact type; its file
then holds ``value`` (the exact join, null on the binary-float rows) and ``float_value`` (float64, null elsewhere),
see :func:`value_columns`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dp_operators.release.upstream_types import SATURATION

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: Largest int64.
INT64_MAX = 2**63 - 1
#: Decimal digits of the largest int64.
_INT64_DIGITS = 19
#: Digits of Parquet's decimal128 and decimal256.
DECIMAL128_DIGITS = 38
DECIMAL256_DIGITS = 76
#: Tail bounds in noise scales: |discrete Laplace| > 90 t, |discrete Gaussian| > 13.5 sigma, each with probability
#: below 2^-127 (module docstring).
LAPLACE_TAIL = 90
GAUSSIAN_TAIL_SQUARED = Fraction(729, 4)  # 13.5^2
#: The largest noise scale a plan allows (docs/adr/0019), for descriptions without an exact scale.
_LARGEST_SCALE = Fraction(SATURATION)


class ColumnRangeError(ValueError):
    """A published value beyond its column's range (a noise tail of probability below 2^-127 per value) or not of
    its aggregate's type; the message names the column, never the value (it is a noised but unpublished number)."""


@dataclass(frozen=True)
class ValueType:
    """The type of a published value column: ``int64``, ``decimal`` (``precision`` digits, ``scale`` after the
    point) or ``float64``."""

    name: str
    precision: int = 0
    scale: int = 0

    @property
    def exact(self) -> bool:
        """Integer or decimal: the column holds the values exactly."""
        return self.name != "float64"

    def arrow(self) -> pa.DataType:
        """The Arrow type: ``int64``, ``decimal128(p, s)`` (``decimal256`` above 38 digits) or ``float64``."""
        import pyarrow as pa

        if self.name == "int64":
            return pa.int64()
        if self.name == "float64":
            return pa.float64()
        if self.precision <= DECIMAL128_DIGITS:
            return pa.decimal128(self.precision, self.scale)
        return pa.decimal256(self.precision, self.scale)

    def column_value(self, value: Any) -> int | Decimal | float | None:
        """A published value (``int``, ``float``, or a ``Decimal`` of a narrower decimal column; ``None`` stays
        ``None``) as this column holds it: an ``int`` for int64 (a whole ``float`` too: a rows file written before
        values were typed holds doubles); a ``Decimal`` for a decimal column (an ``int`` or ``Decimal`` exactly; a
        ``float``, which the JSON holds for a value of a fractional grid, as the multiple of 10^-scale nearest it:
        the grid value it was rounded from while it is within 2^53 grid units, else the grid value nearest the
        double the ledger committed, which reads back as that double; only a rows file holds every digit there); a
        ``float`` for float64.

        Raises:
            ColumnRangeError: a value beyond the column's range (module docstring: about one value in 10^38), or a
                fractional float for an int64 column (not a value of this aggregate).
        """
        if value is None:
            return None
        if self.name == "float64":
            return float(value)
        if self.name == "int64":
            if type(value) is float and value.is_integer():  # a rows file written before values were typed
                value = int(value)
            if type(value) is not int or not -INT64_MAX - 1 <= value <= INT64_MAX:
                raise ColumnRangeError("a value does not fit the int64 value column")
            return value
        try:
            with localcontext() as context:
                context.prec = DECIMAL256_DIGITS + 2  # beyond any column: the check below refuses what does not fit
                step = Decimal(1).scaleb(-self.scale)
                number = Decimal(value) if type(value) is int else Decimal(value).quantize(step)
                if isinstance(value, Decimal) and number != value:
                    raise InvalidOperation  # a Decimal of a finer scale than the column's: never rounded
        except InvalidOperation:
            number = Decimal("Infinity")
        if not number.is_finite() or number.adjusted() >= self.precision - self.scale:
            raise ColumnRangeError(f"a value does not fit the decimal({self.precision}, {self.scale}) value column")
        return number

    def __str__(self) -> str:
        return f"decimal({self.precision}, {self.scale})" if self.name == "decimal" else self.name


INT64 = ValueType("int64")
FLOAT64 = ValueType("float64")


def decimal_grid(grid: float) -> Decimal:
    """The grid of a published description (a double) as the decimal it was written as: its shortest ``repr``."""
    return Decimal(repr(float(grid)))


def grid_problem(grid: Fraction) -> str | None:
    """Why values on ``grid`` cannot go to an exact decimal column, or None: the published description holds the
    grid as a double, read back as its shortest decimal (:func:`decimal_grid`), which must be the grid exactly
    (``0.001``, ``1/1024`` = ``0.0009765625`` are; ``1/3`` is not)."""
    if Fraction(decimal_grid(float(grid))) == grid:
        return None
    return (f"grid {grid} has no exact decimal form of at most 17 significant digits, so its values cannot be "
            "published exactly in a decimal column")


def noise_bound(described: Mapping[str, Any]) -> int:
    """The most the noise of a step moves a value, in grid units, but with probability below 2^-127 (module
    docstring), from the step's published description.

    Raises:
        ValueError: a mechanism this bound does not cover (the spec allows the two discrete mechanisms only).
    """
    mechanism = described.get("mechanism")
    if mechanism not in ("discrete_gaussian", "discrete_laplace"):
        raise ValueError(f"no noise tail bound for mechanism {mechanism!r}: add its tail to value_types.noise_bound")
    if mechanism == "discrete_gaussian":
        exact = described.get("sigma2_grid_units_exact")
        sigma2 = Fraction(exact) if isinstance(exact, str) else _LARGEST_SCALE**2
        return math.isqrt(math.ceil(GAUSSIAN_TAIL_SQUARED * sigma2)) + 1
    exact = described.get("scale_grid_units_exact")
    scale = Fraction(exact) if isinstance(exact, str) else _LARGEST_SCALE
    return math.ceil(LAPLACE_TAIL * scale)


def aggregate_value_type(kind: str, described: Mapping[str, Any] | None, family: bool) -> ValueType:
    """The column type of an aggregate's values, from public parameters only.

    Args:
        kind: ``count``, ``sum``, ``mean`` or ``variance``.
        described: the published description of its value's noise step (``mechanisms`` entry of component
            ``kind``: ``grid``, ``mechanism`` and exact scale); ``None`` for a mean or variance.
        family: a member of a consistent family (``consistency`` in the published aggregate).
    """
    if kind not in ("count", "sum") or family or described is None:
        return FLOAT64
    grid = decimal_grid(described.get("grid", 1.0))
    scale = max(0, -grid.normalize().as_tuple().exponent)  # type: ignore[operator]
    grid_digits = int(grid.scaleb(scale))  # the grid in units of 10^-scale, an integer
    largest = (SATURATION + noise_bound(described)) * grid_digits  # in units of 10^-scale
    if scale == 0 and largest <= INT64_MAX:
        return INT64
    return ValueType("decimal", max(len(str(largest)), scale, 1), scale)


def join(types: Iterable[ValueType]) -> ValueType:
    """The narrowest exact type holding the values of every one of ``types`` (all exact): int64 if all are, else
    a decimal with the most integer digits and the most decimal places among them.

    Raises:
        ValueError: an inexact type, or a join beyond 76 digits.
    """
    types = list(types)
    if any(not t.exact for t in types):
        raise ValueError("only exact types join")
    if all(t.name == "int64" for t in types):
        return INT64
    scale = max(t.scale for t in types)
    digits = max(_INT64_DIGITS if t.name == "int64" else t.precision - t.scale for t in types)
    if digits + scale > DECIMAL256_DIGITS:
        raise ValueError(f"no decimal column holds {digits} integer digits and {scale} decimal places")
    return ValueType("decimal", digits + scale, scale)


def value_columns(types: Iterable[ValueType]) -> tuple[ValueType, bool]:
    """The ``value`` column's type for a file holding aggregates of ``types``, and whether the file also has a
    ``float_value`` column: the join of the exact ones, with ``float_value`` for the binary-float ones beside them;
    float64 alone when every one is binary float (and for no aggregate)."""
    types = list(types)
    exact = [t for t in types if t.exact]
    if not exact:
        return FLOAT64, False
    return join(exact), len(exact) < len(types)


def described_step(output: Mapping[str, Any], name: str, component: str) -> Mapping[str, Any] | None:
    """The published description (``mechanisms`` entry) of ``component`` of aggregate ``name``, or None."""
    for described in output.get("mechanisms") or ():
        if isinstance(described, Mapping) and described.get("aggregate") == name \
                and described.get("component") == component:
            return described
    return None


def output_value_types(output: Mapping[str, Any]) -> dict[str, ValueType]:
    """Each aggregate's :func:`aggregate_value_type`, read from a published release's public fields (``kind``,
    ``consistency``, the ``mechanisms`` descriptions), sorted by name."""
    types = {}
    for name in sorted(output["aggregates"]):
        aggregate = output["aggregates"][name]
        kind = aggregate["kind"]
        types[name] = aggregate_value_type(kind, described_step(output, name, kind), "consistency" in aggregate)
    return types


def published_fraction(value: Any) -> Fraction | None:
    """``value`` (an ``int``, ``float``, ``Decimal`` or ``None``) as the exact rational it holds, for comparing values
    exactly whatever their column types (``None`` stays ``None``; a bool is not a number here). A float is its binary
    value, unlike :func:`dp_operators.accounting.exact_number`, which reads a spec's float as the decimal written.

    Raises:
        TypeError: anything else (text, a non-finite number).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise TypeError(f"{type(value).__name__} is not a published number")
    try:
        return Fraction(value)
    except (ValueError, OverflowError, InvalidOperation):
        raise TypeError(f"{value!r} is not a finite number") from None
