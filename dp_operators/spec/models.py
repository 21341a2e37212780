"""Pydantic models of a release spec (version 1). Field reference: docs/spec-reference.md.

Every model forbids unknown keys (a typo like ``epsilion`` is an error, not a silently ignored field). Budget
numbers are read exactly (:func:`dp_operators.accounting.exact_number`): ``0.1`` is 1/10, ``"1/3"`` is 1/3. They are
read once, here, into the typed values of :mod:`dp_operators.accounting.values` (a budget's ``epsilon`` is an
:class:`~dp_operators.accounting.Epsilon`, its ``delta`` a :class:`~dp_operators.accounting.Delta`, a ``grid`` a
:class:`~dp_operators.accounting.Grid`, and an aggregate's clipping bounds are kept as exact fractions in
:attr:`Aggregate.exact_bounds`), which the engine takes as they are (docs/adr/0028).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from dp_operators.accounting import exact_number
from dp_operators.accounting import values as typed
from dp_operators.spec.names import NAME, GroupByColumn, check_name


#: Grids outside this range are refused: scales computed from them would overflow or underflow floating point in
#: accuracy and reporting, and no meaningful release needs them.
GRID_RANGE = (Fraction(1, 10**12), Fraction(10**12))
#: Bounds and replacement values beyond this magnitude are refused for the same reason.
MAX_MAGNITUDE = 10**15

# Limits on the numbers that set the noise: budgets and the numbers that drive sensitivity. docs/spec-reference.md
# ("Numeric limits") says why each holds; docs/adr/0019 has the measurements. Together they keep
# every noise scale of a plan within binary64 range and within what the half-width and reporting functions compute
# in milliseconds: sqrt(L0) * Linf <= 1e14 grid units, and sigma <= about 1e20 grid units at the smallest budgets
# (epsilon 1e-4 split over a variance's three components, delta 1e-300).
#: epsilon of one aggregate (or of its partition selection). Below 1e-4 the noise is ten thousand times the
#: sensitivity; above 100 (a likelihood ratio of e^100) the release protects nothing, and partition selection's
#: tail probabilities underflow to 0.
EPSILON_RANGE = (Fraction(1, 10**4), Fraction(100))
#: rho of one aggregate: the zCDP counterpart of EPSILON_RANGE (rho = epsilon^2 / 2 gives 5e-9 to 5000; the lower
#: end is rounded down to 1e-9).
RHO_RANGE = (Fraction(1, 10**9), Fraction(5000))
#: L0: at most this many partitions per privacy unit. delta / L0, the per-partition delta of partition selection,
#: stays a normal double for every delta >= 1e-300.
MAX_PARTITIONS_CONTRIBUTED = 10**4
#: Linf of a count: at most this many contributions of one privacy unit to one partition.
MAX_CONTRIBUTIONS_PER_PARTITION = 10**6
#: Per-contribution sensitivity in grid units (grid^2 units for a variance's sum of squares):
#: ceil(max_contributions_per_partition * D / grid), D the largest change of one value. A sum of [0, 1e6] on a grid
#: of 1e-6 is at the limit; the noise is at least Linf / 100 grid units, so a finer grid carries nothing more.
MAX_LINF_GRID_UNITS = 10**12
#: upstream.max_rows: the summation-error bound gamma_{n-1} needs n u < 1 (n < 2^53, about 9.007e15).
MAX_ROWS = 10**15


def _exact_in(kind: type[typed.PositiveRational], low: Fraction, high: Fraction):  # noqa: ANN202 (a validator factory)
    """A validator reading an exact positive number (:func:`~dp_operators.accounting.exact_number`) in
    [low, high], into the typed value ``kind`` (the one parse of that number: docs/adr/0028)."""

    def check(value: object) -> typed.PositiveRational:
        if isinstance(value, kind) and low <= value <= high:  # a typed value (a copied model): read once already
            return value
        number = exact_number(value, name=kind.field)
        if number <= 0:
            raise ValueError(f"must be > 0, got {value!r}")
        if not low <= number <= high:
            raise ValueError(f"must be between {float(low):g} and {float(high):g}, got {value!r}")
        return kind(number)

    return BeforeValidator(check)


def _bounded_integer(low: int, high: int):  # noqa: ANN202 (a validator factory)
    """A validator for an integer field in [low, high]: only a YAML integer is taken (no bool, no float such as
    ``1.5`` or ``1e300``, no text), so nothing is silently rounded or coerced."""

    def check(value: object) -> int:
        if type(value) is not int:
            kind = "a boolean" if isinstance(value, bool) else f"{type(value).__name__} {value!r}"
            raise ValueError(
                f"must be a whole number from {low} to {high:,} written as an integer (like 3, without a decimal "
                f"point or exponent), got {kind}"
            )
        if not low <= value <= high:
            raise ValueError(f"must be from {low} to {high:,}, got {value:,}")
        return value

    return BeforeValidator(check)


#: L0, an integer in [1, MAX_PARTITIONS_CONTRIBUTED].
PartitionsContributed = Annotated[int, _bounded_integer(1, MAX_PARTITIONS_CONTRIBUTED)]
#: Linf of a count, an integer in [1, MAX_CONTRIBUTIONS_PER_PARTITION].
ContributionsPerPartition = Annotated[int, _bounded_integer(1, MAX_CONTRIBUTIONS_PER_PARTITION)]
#: A row bound, an integer in [1, MAX_ROWS].
RowBound = Annotated[int, _bounded_integer(1, MAX_ROWS)]
#: The longest series, in steps (``dp_operators.continual.strategies.MAX_STEPS``, kept equal by a test).
MAX_SERIES_STEPS = 10_000
#: A number of series steps, an integer in [1, MAX_SERIES_STEPS].
SeriesSteps = Annotated[int, _bounded_integer(1, MAX_SERIES_STEPS)]


def _key_value(value: object) -> str | int:
    """A public key value is text or an integer, exactly as written: a boolean, float, null or date is refused
    rather than turned into something the upstream's rows will never hold (``True`` would match the row text
    ``"True"``, not ``"yes"``; ``1000.0`` would become 1000)."""
    if type(value) is str or type(value) is int:
        return value
    if isinstance(value, bool):
        kind = f"the boolean {str(value).lower()}"
    elif value is None:
        kind = "null (an empty value, ~ or null)"
    elif isinstance(value, float):
        kind = f"the float {value!r}"
    else:
        kind = f"a {type(value).__name__} ({value})"
    raise ValueError(
        f"key values are text or integers, got {kind}: quote the value as written if it is text (e.g. 'yes', "
        "'2026-01-01', '1.50'), or write an integer"
    )


#: One public key value: ``str`` or ``int``, strictly.
KeyValue = Annotated[str | int, BeforeValidator(_key_value)]


def _finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"must be finite, got {value!r}")
    if abs(number) > MAX_MAGNITUDE:
        raise ValueError(f"must be at most 1e15 in magnitude, got {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else number


_AS_TEXT = PlainSerializer(str, return_type=str)
#: Exact rationals read from int, float, decimal string or "p/q" string, each in its range.
Epsilon = Annotated[Fraction, _exact_in(typed.Epsilon, *EPSILON_RANGE), _AS_TEXT]
Rho = Annotated[Fraction, _exact_in(typed.Rho, *RHO_RANGE), _AS_TEXT]
Grid = Annotated[Fraction, _exact_in(typed.Grid, *GRID_RANGE), _AS_TEXT]
#: A finite int or float.
FiniteNumber = Annotated[float | int, BeforeValidator(_finite)]

#: The noise sources a spec may select (``sampler``), default first. All draw the exact discrete Laplace and
#: discrete Gaussian laws; docs/adr/0022 says how each does it.
SAMPLERS = ("vectorised", "scalar", "opendp")


def _sampler(value: object) -> object:
    if value not in SAMPLERS:
        raise ValueError(
            f"unknown sampler {value!r}: use 'vectorised' (the default: exact inverse-CDF samplers on numpy arrays), "
            "'scalar' (the exact CKS 2020 rejection samplers, slower) or 'opendp' (OpenDP's exact samplers, the "
            "reference; pip install 'opendp>=0.12')"
        )
    return value


#: One of :data:`SAMPLERS`; anything else is refused with the list.
Sampler = Annotated[Literal["vectorised", "scalar", "opendp"], BeforeValidator(_sampler)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _delta(value: object) -> typed.Delta:
    if isinstance(value, typed.Delta) and value >= Fraction(1, 10**300):  # read once already (a copied model)
        return value
    number = exact_number(value, name="delta")
    if not 0 < number < 1:
        raise ValueError(f"delta must be in (0, 1), got {value!r}")
    if number < Fraction(1, 10**300):
        raise ValueError(f"delta must be at least 1e-300, got {value!r}")
    return typed.Delta(number)


#: An exact delta in the open interval (0, 1), a :class:`~dp_operators.accounting.Delta`.
Delta = Annotated[Fraction, BeforeValidator(_delta), PlainSerializer(str, return_type=str)]


class Budget(_Strict):
    """The privacy loss one aggregate may spend. One of:

    * ``{epsilon}``: pure epsilon-DP (``discrete_laplace``, or ``auto`` which then picks it);
    * ``{rho}``: rho-zCDP (``discrete_gaussian``; ``auto`` compares it with a Laplace at the largest epsilon whose
      zCDP charge epsilon * tanh(epsilon / 2) fits rho, docs/adr/0015);
    * ``{epsilon, delta}``: approximate DP. ``discrete_gaussian`` is calibrated with the exact (epsilon, delta)
      privacy profile of the discrete Gaussian (docs/mechanisms.md); ``auto`` compares it with a pure Laplace.

    ``auto`` chooses by the cost on the account the release is charged to (docs/adr/0012): on a ``zcdp`` account
    an ``{epsilon, delta}`` budget's Laplace is charged epsilon * tanh(epsilon / 2) and its Gaussian the rho of
    its noise, so the candidates are brought to the same charge before their variances are compared.

    Ranges (checked at load): epsilon in [1e-4, 100], rho in [1e-9, 5000], delta in [1e-300, 1); numbers are read
    exactly (``0.1`` is 1/10).
    """

    epsilon: Epsilon | None = None
    rho: Rho | None = None
    delta: Delta | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Budget:
        given = {name for name in ("epsilon", "rho", "delta") if getattr(self, name) is not None}
        if given not in ({"epsilon"}, {"rho"}, {"epsilon", "delta"}):
            raise ValueError(
                "give {epsilon} (discrete_laplace), {rho} or {epsilon, delta} (discrete_gaussian), "
                f"got {sorted(given) or 'nothing'}"
            )
        return self

    @property
    def form(self) -> str:
        """``"epsilon"``, ``"rho"`` or ``"epsilon_delta"``."""
        if self.rho is not None:
            return "rho"
        return "epsilon_delta" if self.delta is not None else "epsilon"


class ContributionBounds(_Strict):
    """How much one privacy unit may contribute (DESIGN.md 2.6): L0 = ``max_partitions_contributed`` partitions of
    one aggregate, each at most ``max_contributions_per_partition`` times (Linf). L1 = L0*Linf, L2 = sqrt(L0)*Linf.

    Both are integers (a float such as ``1e300`` or ``3.0`` is refused, never rounded), L0 in [1, 10^4] and
    ``max_contributions_per_partition`` in [1, 10^6]; see the module constants for why."""

    max_partitions_contributed: PartitionsContributed = 1
    max_contributions_per_partition: ContributionsPerPartition = 1


class NonFinitePolicy(_Strict):
    """What a NaN or infinite upstream value does. Data values never raise mid-release (DESIGN.md 2.4).

    * ``nan``: ``replace`` (by ``replace_with``) or ``drop`` (the row is ignored, as if absent);
    * ``infinity``: ``replace``, ``drop``, or ``clamp`` (to the saturation limit of the engine, +-2**62 grid units).
    """

    nan: Literal["replace", "drop"] = "replace"
    infinity: Literal["replace", "clamp", "drop"] = "replace"
    replace_with: FiniteNumber = 0


class PartitionSelection(_Strict):
    """Release only the keys found in the data whose noised count of privacy units reaches a threshold (for
    group-by keys with no public domain). The threshold is derived from the budget's delta, rounded up; its noise
    and delta are charged in addition to the aggregate's own budget."""

    mechanism: Literal["discrete_laplace", "discrete_gaussian"] = "discrete_laplace"
    budget: Budget

    @model_validator(mode="after")
    def _approximate(self) -> PartitionSelection:
        if self.budget.form != "epsilon_delta":
            raise ValueError(
                "partition selection needs an approximate budget {epsilon, delta}: delta bounds the chance that "
                f"a key held by one privacy unit is released; got {self.budget.form}"
            )
        return self


class UpstreamSums(_Strict):
    """How the upstream task computed the sums it hands over, and how many rows went into one partition's total.

    * ``arithmetic: exact`` (default): sums are exact numbers: Python/numpy integers, ``Decimal`` (SQL ``SUM`` over
      ``NUMERIC``/``DECIMAL``) or ``Fraction``. A binary float sum is refused before any budget is reserved (its
      rounding error is not inside the planned sensitivity), by its type, whatever its value (30.0 as well as
      30.5; docs/adr/0017). pandas makes an int column float64 when one group is missing: keep the type upstream
      (the nullable ``Int64`` dtype, or ``.fillna(0).astype("int64")``).
    * ``arithmetic: binary64``: sums are IEEE 754 double-precision floats (pandas, numpy, SQL ``DOUBLE``), computed in
      any order over at most ``max_rows`` values per partition. The sensitivity then carries a sound allowance for
      the summation error (Casacuberta et al., CCS 2022; Higham 2002, section 4.2), and a grid the float cannot
      carry is refused at plan time. Over public keys the partitions a privacy unit does not touch carry the
      allowance too (their summation order alone moves them); under ``partition_selection`` binary64 is refused.
    * ``max_rows``: the most upstream rows (values) summed into one partition's total: a public bound, declared by the
      author (required with ``binary64``). It also lets the plan refuse a spec whose totals could reach the engine's
      saturation limit.
    """

    arithmetic: Literal["exact", "binary64"] = "exact"
    max_rows: RowBound | None = None

    @model_validator(mode="after")
    def _row_bound_for_floats(self) -> UpstreamSums:
        if self.arithmetic == "binary64" and self.max_rows is None:
            raise ValueError(
                "binary64 sums need 'max_rows', the most rows summed into one partition: the float summation "
                "error, and so the sensitivity allowance, grows with it"
            )
        return self


MECHANISM_BUDGETS = {
    "discrete_laplace": ("epsilon",),
    "discrete_gaussian": ("rho", "epsilon_delta"),
    "auto": ("epsilon", "rho", "epsilon_delta"),
}
#: the components each kind noises, in release order
COMPONENTS = {
    "count": ("count",),
    "sum": ("sum",),
    "mean": ("sum", "count"),
    "variance": ("sum", "count", "sum_squares"),
    "quantile": ("count",),
    "median": ("count",),
}
#: Kinds whose upstream rows carry counts (``count``): a count, and the histogram of a quantile or median.
COUNTED_KINDS = ("count", "quantile", "median")
#: Kinds released from a histogram over public bins (:class:`QuantileBins`).
QUANTILE_KINDS = ("quantile", "median")
#: The most bins a quantile's histogram may have (the continual strategies' longest series).
MAX_QUANTILE_BINS = 10_000
#: The fields of a published quantile row besides ``value``, ``interval`` and ``half_width`` (reserved for every kind):
#: a quantile's ``group_by`` column may not take one of these names.
QUANTILE_ROW_FIELDS = frozenset({"quantile", "bin", "bin_label", "rank_half_width"})
#: The mechanisms a quantile or median may name; ``auto`` picks by planned rank error (docs/mechanisms.md).
QUANTILE_MECHANISMS = ("auto", "exponential", "noised_cdf")


def level_text(level: Fraction) -> str:
    """A quantile level as written and published: its decimal when it has one (``0.5``, ``0.125``), else ``a/b``."""
    denominator = level.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return f"{level.numerator}/{level.denominator}"
    digits = 0
    while (level * 10**digits).denominator != 1:
        digits += 1
    return f"{float(level):.{digits}f}"


def _quantile(value: object) -> Fraction:
    number = exact_number(value, name="quantiles")
    if not 0 < number < 1:
        raise ValueError(f"a quantile is strictly between 0 and 1 (0.5 is the median), got {value!r}")
    if number.denominator > 10**6:
        raise ValueError(f"a quantile is a fraction with denominator at most 10^6 (like 0.25 or '1/3'), got {value!r}")
    return number


#: One quantile in (0, 1), read exactly (``0.1`` is 1/10, ``"1/3"`` is 1/3).
QuantileLevel = Annotated[Fraction, BeforeValidator(_quantile), _AS_TEXT]


class QuantileBins(_Strict):
    """The public bins of a quantile's histogram: the upstream counts rows per bin, and the quantile released is a
    bin (docs/spec-reference.md, "Quantiles and medians").

    * ``column``: the histogram's key column (upstream rows: this column, the ``group_by`` columns and ``count``).
    * ``edges``: the bin edges, strictly increasing: ``m + 1`` edges give ``m`` bins. With ``width``, give two
      edges ``[low, high]`` and the bins are ``low, low + width, ..., high`` (``(high - low) / width`` whole).
    * ``closed``: which bin holds a value equal to an inner edge: ``left`` (default, ``[lower, upper)``: the bin
      above it) or ``right`` (``(lower, upper]``: the bin below). Fixed here, so every row has one bin.
    * ``label``: how the upstream names a bin in ``column``: ``lower_edge`` (default: the bin's lower edge, an
      integer, as ``FLOOR(x / w) * w`` gives) or ``index`` (1 to m, as PostgreSQL's ``width_bucket`` gives).
    """

    column: GroupByColumn
    edges: list[FiniteNumber] = Field(min_length=2)
    width: FiniteNumber | None = None
    closed: Literal["left", "right"] = "left"
    label: Literal["lower_edge", "index"] = "lower_edge"
    _exact_edges: tuple[Fraction, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _bins(self) -> QuantileBins:
        edges = [exact_number(edge, name="edges") for edge in self.edges]
        if self.width is not None:
            width = exact_number(self.width, name="width")
            if len(edges) != 2:
                raise ValueError(f"with 'width', give edges as [low, high], got {len(edges)} edges")
            if width <= 0:
                raise ValueError(f"width must be > 0, got {self.width!r}")
            span = (edges[1] - edges[0]) / width
            if span.denominator != 1 or span < 1:
                raise ValueError(f"(high - low) / width must be a whole number of bins, got ({self.edges[1]} - "
                                 f"{self.edges[0]}) / {self.width} = {float(span):g}")
            if span > MAX_QUANTILE_BINS:
                raise ValueError(f"at most {MAX_QUANTILE_BINS:,} bins, got {int(span):,}: use a wider width")
            edges = [edges[0] + i * width for i in range(int(span) + 1)]
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError("edges must be strictly increasing")
        if len(edges) - 1 > MAX_QUANTILE_BINS:
            raise ValueError(f"at most {MAX_QUANTILE_BINS:,} bins, got {len(edges) - 1:,}")
        if len(edges) == 2:
            raise ValueError(f"edges {self.edges} make one bin, whose quantile is always that bin: give 'width' "
                             "(edges: [low, high], width: 1) or every edge")
        if self.label == "lower_edge" and any(edge.denominator != 1 for edge in edges[:-1]):
            raise ValueError("label lower_edge names each bin by its lower edge, which must then be a whole number; "
                             "use label: index (1 to m, as width_bucket gives) for fractional edges")
        self._exact_edges = tuple(edges)
        return self

    @property
    def exact_edges(self) -> tuple[Fraction, ...]:
        """The ``m + 1`` edges as exact fractions (``width`` expanded)."""
        return self._exact_edges

    @property
    def labels(self) -> list[int]:
        """The key each bin has in ``column``, in order: its lower edge, or its index 1..m."""
        if self.label == "index":
            return list(range(1, len(self._exact_edges)))
        return [int(edge) for edge in self._exact_edges[:-1]]



class Aggregate(_Strict):
    """One released aggregate: a count, bounded sum, mean or variance; optionally grouped over a public key domain
    (``keys``: per column, its values as text or integers, exactly as written) or over keys found in the data
    (``partition_selection``).

    ``name`` is at most :data:`~dp_operators.spec.names.MAX_NAME_LENGTH` characters; a ``group_by`` column may not be
    named like a row field (:data:`~dp_operators.spec.names.RESERVED_COLUMNS`: ``value``, ``count``...)."""

    name: str
    kind: Literal["count", "sum", "mean", "variance", "quantile", "median"]
    group_by: list[GroupByColumn] = Field(default_factory=list)
    keys: dict[str, list[KeyValue]] | None = None
    partition_selection: PartitionSelection | None = None
    bounds: tuple[FiniteNumber, FiniteNumber] | None = None
    grid: Grid = typed.Grid(1)
    mechanism: Literal["discrete_laplace", "discrete_gaussian", "auto", "exponential", "noised_cdf"]
    budget: Budget
    contribution: ContributionBounds | None = None
    #: a quantile's or median's public bins (:class:`QuantileBins`) and levels (a median: [0.5])
    bins: QuantileBins | None = None
    quantiles: list[QuantileLevel] | None = None
    #: a noised CDF's strategy: ``auto`` (the smaller published half-width), ``tree_consistent``, ``sqrt_factorization``
    cdf_strategy: Literal["auto", "tree_consistent", "sqrt_factorization"] = "auto"
    non_finite: NonFinitePolicy = NonFinitePolicy()
    out_of_range: Literal["clamp"] = "clamp"
    upstream: UpstreamSums = UpstreamSums()
    # the bounds as exact fractions, read once when the aggregate is validated (docs/adr/0028)
    _exact_bounds: tuple[Fraction, Fraction] | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, value: str) -> str:
        return check_name(value, "aggregate names")

    @model_validator(mode="before")
    @classmethod
    def _median_levels(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("kind") == "median" and data.get("quantiles") is None:
            return {**data, "quantiles": [Fraction(1, 2)]}
        return data

    @model_validator(mode="after")
    def _histogram(self) -> Aggregate:
        """A quantile or median is released from a histogram over its public bins: ``bins.column`` is appended to
        ``group_by`` (last, so each group's bins are contiguous) with the bins' labels as its keys, and the
        aggregate is read as counts over those keys. Checked here: no ``bounds``, a mechanism of
        :data:`QUANTILE_MECHANISMS`, the levels; the other kinds take no ``bins`` or ``quantiles``."""
        if self.kind not in QUANTILE_KINDS:
            if self.bins is not None or self.quantiles is not None or self.cdf_strategy != "auto":
                raise ValueError(f"'bins', 'quantiles' and 'cdf_strategy' belong to a quantile or median, not a "
                                 f"{self.kind}")
            if self.mechanism in ("exponential", "noised_cdf"):
                raise ValueError(f"mechanism {self.mechanism} releases a quantile or median; a {self.kind} takes "
                                 "discrete_laplace, discrete_gaussian or auto")
            return self
        if self.bins is None:
            raise ValueError(f"a {self.kind} needs 'bins': the histogram's column and its public edges, e.g. "
                             "bins: {column: age_bin, edges: [0, 100], width: 1}")
        if self.mechanism not in QUANTILE_MECHANISMS:
            raise ValueError(f"a {self.kind} is released by mechanism exponential, noised_cdf or auto, got "
                             f"{self.mechanism}")
        levels = list(self.quantiles or [])
        if not levels:
            raise ValueError("a quantile needs 'quantiles': the levels wanted, e.g. [0.1, 0.5, 0.9]")
        if self.kind == "median" and levels != [Fraction(1, 2)]:
            written = ", ".join(level_text(q) for q in levels)
            raise ValueError(f"a median releases the 0.5 quantile; use kind: quantile for quantiles [{written}]")
        if len(set(levels)) != len(levels):
            raise ValueError("quantiles lists a level twice")
        if self.bounds is not None:
            raise ValueError(f"a {self.kind} takes no 'bounds': its bins are public, and one record moves one count")
        if self.grid != 1:
            raise ValueError(f"a {self.kind} takes no 'grid': its histogram holds counts (the bins are 'bins')")
        taken = sorted((set(self.group_by) - {self.bins.column}) & QUANTILE_ROW_FIELDS)
        if taken:
            raise ValueError(f"group_by column(s) {taken} would be lost in the published rows, which use those names "
                             f"for a quantile's own fields ({', '.join(sorted(QUANTILE_ROW_FIELDS))}): rename them "
                             "upstream")
        if self.upstream.arithmetic != "exact":
            raise ValueError(f"a {self.kind}'s histogram holds counts: upstream.arithmetic binary64 does not apply")
        if self.partition_selection is not None and not self.group_by:
            raise ValueError(f"partition_selection selects which groups of a {self.kind} to release: it needs "
                             "group_by columns (the histogram's own bins are public)")
        if self.partition_selection is not None and self.mechanism == "noised_cdf":
            raise ValueError("mechanism noised_cdf is charged in zCDP, which cannot hold partition selection's "
                             "(epsilon, delta): use mechanism exponential (or auto, which takes it) for groups found "
                             "in the data")
        if self.cdf_strategy != "auto" and self.mechanism == "exponential":
            raise ValueError(f"cdf_strategy {self.cdf_strategy} applies to mechanism noised_cdf (or auto), not "
                             "exponential")
        if self.mechanism == "noised_cdf" and self.budget.form != "rho":
            written = {"epsilon": "{epsilon}", "epsilon_delta": "{epsilon, delta}"}[self.budget.form]
            raise ValueError("mechanism noised_cdf is one Gaussian measurement of the histogram's prefix sums: give "
                             f"budget {{rho}}, got {written} (or use mechanism exponential or auto)")
        column, labels = self.bins.column, self.bins.labels
        if self.group_by and self.group_by[-1] == column and (self.keys or {}).get(column) == labels:
            return self  # derived already (a copy of a validated aggregate)
        if column in self.group_by or column in (self.keys or {}):
            raise ValueError(f"bins.column {column!r} is the histogram's column: do not list it in group_by or keys "
                             "(its keys are the bins' labels)")
        object.__setattr__(self, "group_by", [*self.group_by, column])
        object.__setattr__(self, "keys", {**(self.keys or {}), column: labels})
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Aggregate:
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError(f"group_by lists a column twice: {self.group_by}")
        if self.partition_selection is not None:
            if not self.group_by:
                raise ValueError("partition_selection needs group_by columns (it selects which keys to release)")
            # a quantile's bins are public under partition selection too: only the groups come from the data
            public = {self.bins.column} if self.releases_quantiles else set()  # type: ignore[union-attr]
            if set(self.keys or {}) - public:
                raise ValueError("give either public 'keys' or 'partition_selection', not both")
        elif set(self.keys or {}) != set(self.group_by):
            raise ValueError(
                "keys must give the public key domain of every group_by column and no other "
                "(or use partition_selection for keys that are not public): "
                f"group_by is {self.group_by}, keys has {sorted(self.keys or {})}"
            )
        for column, values in (self.keys or {}).items():
            if not values:
                raise ValueError(f"keys.{column} is empty; list the public values of {column!r}")
            if len({str(v) for v in values}) != len(values):
                raise ValueError(f"keys.{column} lists a value twice")
        if self.kind not in COUNTED_KINDS:
            if self.bounds is None:
                raise ValueError(f"a {self.kind} needs clipping 'bounds: [lower, upper]'")
            lower, upper = self.bounds
            if not lower < upper:
                raise ValueError(
                    f"bounds must have lower < upper, got [{lower}, {upper}] (equal bounds give sensitivity 0: "
                    "nothing to release)"
                )
        elif self.bounds is not None:
            raise ValueError("a count takes no 'bounds' (its per-contribution sensitivity is 1)")
        if self.bounds is not None:
            self._exact_bounds = tuple(exact_number(b, name="bounds") for b in self.bounds)  # type: ignore[assignment]
        if self.kind in COUNTED_KINDS and self.upstream.arithmetic != "exact":
            raise ValueError(
                "upstream.arithmetic binary64 applies to sums, means and variances; a count is an integer "
                "(a float count is read as the number it holds)"
            )
        if self.non_finite.replace_with != 0:
            # SQL gives NULL for an empty group, whose true count, sum and sum of squares are 0; a neighbour with one
            # person there has totals within the sensitivity of 0, but not of another replacement (for a mean or
            # variance the replaced count moves too, and with it the clamp range of the centred sums)
            raise ValueError(
                "non_finite.replace_with must be 0 (a NULL or NaN total is an empty group, whose true value is 0; "
                "another replacement can differ from a neighbour's total by more than the sensitivity), got "
                f"{self.non_finite.replace_with}; use nan: drop to ignore such rows instead"
            )
        allowed = MECHANISM_BUDGETS.get(self.mechanism, ("epsilon", "rho", "epsilon_delta"))
        if self.budget.form not in allowed:
            raise ValueError(
                f"mechanism {self.mechanism} is calibrated from {' or '.join(allowed)}, "
                f"but budget gives {self.budget.form}"
                + (" (use mechanism: auto to let the engine choose)" if self.mechanism != "auto" else "")
            )
        return self

    def largest_change(self, component: str) -> tuple[Fraction, int]:
        """``(D, k)``: the most one value moves ``component``, in value units, and the power k of the grid its
        integer is counted in (1, or 2 for ``sum_squares``, counted in grid^2 units). D is 1 for a count,
        max(|lower|, |upper|) for a sum, h = (upper - lower)/2 for the centred sum of a mean or variance and h^2 for
        its sum of squares (docs/adr/0010)."""
        if component == "count":
            return Fraction(1), 0
        lower, upper = self.exact_bounds  # type: ignore[misc]
        if component == "sum_squares":
            return ((upper - lower) / 2) ** 2, 2
        if self.kind == "sum":
            return max(abs(lower), abs(upper)), 1
        return (upper - lower) / 2, 1

    def linf_grid_units(self, max_contributions_per_partition: int) -> dict[str, int]:
        """The declared per-contribution sensitivity of each component, in grid units (grid^2 units for
        ``sum_squares``): ``ceil(max_contributions_per_partition * D / grid^k)`` with ``(D, k)`` from
        :meth:`largest_change`. The same as the exact path's plan
        (:attr:`dp_operators.release.float_sums.ComponentBound.declared_linf`); binary64 sums add an allowance."""
        linf = {}
        for component in self.components:
            change, power = self.largest_change(component)
            linf[component] = math.ceil(max_contributions_per_partition * change / self.grid**power)
        return linf

    @property
    def exact_bounds(self) -> tuple[Fraction, Fraction] | None:
        """``(lower, upper)`` of the clipping ``bounds`` as exact fractions (a float is the decimal it was written
        as: ``0.1`` is 1/10), read once at validation; None for a count."""
        return self._exact_bounds

    @property
    def reads_counts(self) -> bool:
        """True when the upstream rows carry counts: a count, or a quantile's or median's histogram."""
        return self.kind in COUNTED_KINDS

    @property
    def releases_quantiles(self) -> bool:
        """True for a quantile or median (released from a histogram over :attr:`bins`)."""
        return self.kind in QUANTILE_KINDS

    @property
    def outer_group_by(self) -> list[str]:
        """The ``group_by`` columns a quantile is released per (its histogram's column excluded); every column for
        the other kinds."""
        return self.group_by[:-1] if self.releases_quantiles else list(self.group_by)

    @property
    def components(self) -> tuple[str, ...]:
        """The noised components of this aggregate (``count``, ``sum``, ``sum_squares``), in release order."""
        return COMPONENTS[self.kind]

    @property
    def public_keys(self) -> bool:
        """True when the released keys are the public key domain (always released, missing ones as 0)."""
        return self.partition_selection is None

    @property
    def partition_count(self) -> int | None:
        """Number of released partitions for a public key domain (1 when not grouped); None under partition
        selection, where it depends on the data."""
        if not self.public_keys:
            return None
        return math.prod(len(self.keys[column]) for column in self.group_by)  # type: ignore[index]


def _linf_message(aggregate: Aggregate, component: str, linf: int, per_partition: int, where: str) -> str:
    """Why a component's per-contribution sensitivity is out of range, and the smallest grid that fits."""
    change, power = aggregate.largest_change(component)
    if component == "sum_squares":
        what = f"the {aggregate.kind}'s centred sum of squares"
    elif aggregate.kind == "sum":
        what = "the sum"
    else:
        what = f"the {aggregate.kind}'s centred sum"
    # the smallest grid G with per_partition * change / G^power <= MAX, rounded up to two significant digits
    needed = per_partition * change / MAX_LINF_GRID_UNITS
    root = needed if power == 1 else Fraction(math.sqrt(needed))
    step = Fraction(10) ** (math.floor(math.log10(root)) - 1)
    grid = math.ceil(root / step) * step
    while grid**power < needed:
        grid += step
    lower, upper = aggregate.bounds  # type: ignore[misc]
    return (
        f"with bounds [{float(lower):g}, {float(upper):g}], grid {float(aggregate.grid):g} and "
        f"max_contributions_per_partition {per_partition} ({where}), one privacy unit moves {what} by up to "
        f"{linf:.3g} {'grid units' if power == 1 else 'grid^2 units'}; at most {MAX_LINF_GRID_UNITS:.0e} are "
        f"supported (a finer grid is far below any noise): use a grid of at least {float(grid):g}, or narrower "
        "bounds"
    )


class SeriesParticipation(_Strict):
    """How often one privacy unit contributes over a series (the ``(k, b)``-participation of Choquette-Choo et al.,
    ICML 2023): in at most ``max_steps`` steps, any two of them at least ``min_separation`` steps apart (1: any
    steps). Within a step, the spec's ``contribution`` bounds apply as for any release."""

    max_steps: SeriesSteps = 1
    min_separation: SeriesSteps = 1


class Series(_Strict):
    """A release declared as a series: running totals published at each of ``horizon`` steps (one DAG run each)
    from one budget, the aggregates' ``budget.rho`` being the whole series' (docs/adr/0032).

    ``mechanism`` ``auto`` takes the lowest planned worst-step error among summed increments, the binary tree, the
    tree with Honaker's estimates and the square-root factorization, from public parameters only. ``after_horizon``
    says what a run past the last step does: ``refuse``, or ``new_series`` (a new series, charged again).
    """

    horizon: SeriesSteps
    participation: SeriesParticipation = SeriesParticipation()
    mechanism: Literal["auto", "summed_increments", "binary_tree", "tree_honaker", "sqrt_factorization"] = "auto"
    after_horizon: Literal["refuse", "new_series"] = "refuse"

    @model_validator(mode="after")
    def _fits(self) -> Series:
        if self.participation.max_steps > self.horizon:
            raise ValueError(f"participation.max_steps ({self.participation.max_steps}) exceeds the horizon "
                             f"({self.horizon}): a unit contributes to at most every step")
        return self


#: Texts pydantic reads as booleans, as every boolean field of a spec does (``clamp_nonnegative: no`` is False).
_BOOLEAN_TEXTS = {"yes", "no", "on", "off", "true", "false", "y", "n", "t", "f", "1", "0"}


class KeyHierarchy(_Strict):
    """A public key hierarchy: every key of the finer column ``child`` belongs to one key of the coarser column
    ``parent`` (age > age band, county > state). ``groups`` maps each parent key to its child keys; both are text
    or integers exactly as in the aggregates' ``keys``. A consistent family may then hold an aggregate grouped by
    ``parent`` beside one grouped by ``child``: the parent's cells are sums of the child's."""

    parent: GroupByColumn
    child: GroupByColumn
    groups: dict[KeyValue, list[KeyValue]] = Field(min_length=1)

    @model_validator(mode="after")
    def _partition(self) -> KeyHierarchy:
        if self.parent == self.child:
            raise ValueError(f"a hierarchy maps a column to another column, got parent and child {self.parent!r}")
        seen: dict[object, object] = {}
        for parent, children in self.groups.items():
            if not children:
                raise ValueError(f"groups.{parent} lists no {self.child!r} keys")
            for child in children:
                if child in seen:
                    raise ValueError(
                        f"{self.child!r} key {child!r} is listed under {seen[child]!r} and {parent!r}: every child "
                        "key belongs to one parent"
                    )
                seen[child] = parent
        return self

    def child_to_parent(self) -> dict[object, object]:
        """``{child key: parent key}``, keys as written (``1`` and ``'1'`` differ, as in ``keys``)."""
        return {child: parent for parent, children in self.groups.items() for child in children}


class Postprocess(_Strict):
    """Post-processing of noised values (free under DP: it never touches raw data or spends budget).

    * ``clamp_nonnegative`` (default true): a negative count (or sum with bounds >= 0) is published as 0. Not
      applied to the members of a consistent family (it would break their sums): use ``nonnegative``.
    * ``consistent``: ``true`` makes all counts over public keys one family: one of them (the *base*) groups by
      every column the others use (or by a finer column a ``hierarchies`` entry maps to theirs), and every
      published margin then equals the sum of its cells exactly (weighted least squares, the best linear unbiased
      estimate; docs/consistency.md). A list of lists of aggregate names declares the families explicitly (needed
      for sums: the engine cannot tell which sums add up the same measure).
    * ``nonnegative``: no published member value is negative (a non-negative least-squares fit; biased).
    * ``integer``: every published member value is an integer, margins still the sums of their cells (controlled
      rounding; needs grid 1).
    * ``hierarchies``: public key hierarchies (:class:`KeyHierarchy`).
    """

    clamp_nonnegative: bool = True
    consistent: bool | list[list[str]] = False
    nonnegative: bool = False
    integer: bool = False
    hierarchies: list[KeyHierarchy] = Field(default_factory=list)

    @field_validator("consistent", mode="before")
    @classmethod
    def _strict_flag(cls, value: object) -> object:
        if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
            raise ValueError(
                f"a list of families is a list of lists of aggregate names: write [{value!r}] (consistent: "
                f"[[{', '.join(value)}]]) for one family"
            )
        if isinstance(value, (bool, list)) or (isinstance(value, str) and value.lower() in _BOOLEAN_TEXTS):
            return value  # yes / no as the project's other boolean fields read them (tests/spec/test_spec_yaml_traps)
        raise ValueError(
            f"must be true, false or a list of families (lists of aggregate names), got {value!r}"
        )

    @model_validator(mode="after")
    def _needs_consistent(self) -> Postprocess:
        asked = [name for name in ("nonnegative", "integer") if getattr(self, name)]
        if asked and not self.consistent:
            raise ValueError(
                f"{' and '.join(asked)} act on a consistent family: add 'consistent: true' (or list the families); "
                "for independent counts, clamp_nonnegative already publishes negatives as 0"
            )
        if self.hierarchies and not self.consistent:
            raise ValueError("hierarchies are used by consistent families: add 'consistent: true'")
        # a column may be the child of several hierarchies (age > age band, age > decade), not the parent of two
        parents = [h.parent for h in self.hierarchies]
        repeated = sorted({c for c in parents if parents.count(c) > 1})
        if repeated:
            raise ValueError(f"column(s) {repeated} are the parent of two hierarchies; declare one per column")
        return self


#: The largest ``lookback_windows``: a release reads at most 400 windows
#: (``dp_operators.ledger.structure.MAX_WINDOWS``), its own one included.
MAX_LOOKBACK_WINDOWS = 399


class ReleaseSpec(_Strict):
    """A release spec document (``version: 1``).

    ``sampler`` chooses where the noise comes from, never how much: ``vectorised`` (default) draws with the exact
    inverse-CDF samplers on numpy arrays, ``scalar`` with the exact CKS 2020 rejection samplers, ``opendp`` with
    OpenDP's exact samplers (the reference; an optional extra, at the smallest float scale >= the planned one).
    The plan, its charge and its half-widths are the same for all three (docs/adr/0022).
    """

    version: Literal[1]
    release: str
    budget_account: str
    privacy_unit: str
    description: str | None = None
    contribution: ContributionBounds = ContributionBounds()
    confidence: float = Field(default=0.95, gt=0, lt=1, allow_inf_nan=False)
    aggregates: list[Aggregate] = Field(min_length=1)
    postprocess: Postprocess = Postprocess()
    sampler: Sampler = "vectorised"
    series: Series | None = None
    #: A sliding window over the budget account's privacy blocks: the release reads (and is charged on) the
    #: windows of its run's data interval and this many earlier windows (a 7-day window over daily blocks: 6).
    #: ``None`` (not given): the run's own windows only. Only for an account with calendar blocks (day, week,
    #: month); checked against the account before anything is charged. At most :data:`MAX_LOOKBACK_WINDOWS`.
    lookback_windows: int | None = Field(default=None, ge=0, le=MAX_LOOKBACK_WINDOWS, strict=True)

    @field_validator("release")
    @classmethod
    def _release_name(cls, value: str) -> str:
        return check_name(value, "release names")

    @field_validator("budget_account")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError(f"use letters, digits, '_' and '-', got {value!r}")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> ReleaseSpec:
        names = [aggregate.name for aggregate in self.aggregates]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"aggregate names must be unique, repeated: {duplicates}")
        return self

    @model_validator(mode="after")
    def _sensitivity_in_range(self) -> ReleaseSpec:
        """Each component's per-contribution sensitivity (bounds, grid and the contribution bound that applies,
        the aggregate's own or the spec's) is at most MAX_LINF_GRID_UNITS grid units; the error names the
        aggregate's ``grid`` and the smallest grid that fits."""
        problems = []
        for index, aggregate in enumerate(self.aggregates):
            if aggregate.kind in COUNTED_KINDS:
                continue  # Linf = max_contributions_per_partition, already in range
            per_partition = self.contribution_for(aggregate).max_contributions_per_partition
            where = "the aggregate's contribution" if aggregate.contribution else "the spec's contribution"
            for component, linf in aggregate.linf_grid_units(per_partition).items():
                if linf <= MAX_LINF_GRID_UNITS:
                    continue
                problems.append(InitErrorDetails(
                    type=PydanticCustomError("value_error", "{message}", {"message": _linf_message(
                        aggregate, component, linf, per_partition, where
                    )}),
                    loc=("aggregates", index, "grid"),
                    input=str(aggregate.grid),
                ))
        if problems:
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    @model_validator(mode="after")
    def _families(self) -> ReleaseSpec:
        """``postprocess.consistent`` names families that can be made consistent (:mod:`.families`)."""
        from dp_operators.spec.families import consistent_families

        try:
            consistent_families(self)
        except ValueError as error:
            raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError("value_error", "{message}", {"message": str(error)}),
                loc=("postprocess", "consistent"),
                input=self.postprocess.consistent,
            )]) from None
        return self

    @model_validator(mode="after")
    def _series_aggregates(self) -> ReleaseSpec:
        """A series releases counts and sums over public keys, noised by one Gaussian measurement of the whole
        series (ADR 32): each aggregate a ``count`` or ``sum``, public ``keys`` (the same at every step), budget
        ``{rho}``, mechanism ``discrete_gaussian`` or ``auto``; no consistent families."""
        if self.series is None:
            return self
        problems = []

        def problem(loc: tuple, message: str, value: object) -> None:
            problems.append(InitErrorDetails(type=PydanticCustomError("value_error", "{message}", {"message": message}),
                                             loc=loc, input=value))

        for index, aggregate in enumerate(self.aggregates):
            if aggregate.kind not in ("count", "sum"):
                problem(("aggregates", index, "kind"), f"a series releases running counts and sums, not a "
                        f"{aggregate.kind}: release it without 'series', or its sum (grid 1) and count as two aggregates",
                        aggregate.kind)
            if not aggregate.public_keys:
                problem(("aggregates", index, "partition_selection"), "a series needs public keys, the same at "
                        "every step: give 'keys' instead of partition_selection", "partition_selection")
            if aggregate.budget.form != "rho":
                problem(("aggregates", index, "budget"), "a series' budget is zCDP: give {rho} (the whole series' "
                        f"budget), got {aggregate.budget.form}", aggregate.budget.form)
            if aggregate.mechanism == "discrete_laplace":
                problem(("aggregates", index, "mechanism"), "a series is noised by one Gaussian measurement: use "
                        "mechanism discrete_gaussian or auto (series.mechanism chooses the strategy)",
                        aggregate.mechanism)
        if self.postprocess.consistent:
            problem(("postprocess", "consistent"), "a series' running totals are not made consistent across "
                    "aggregates: drop postprocess.consistent", self.postprocess.consistent)
        if self.lookback_windows is not None:
            problem(("lookback_windows",), "a series on privacy blocks is not supported yet: drop lookback_windows "
                    "(a series is charged once on a plain account)", self.lookback_windows)
        if problems:
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    def contribution_for(self, aggregate: Aggregate) -> ContributionBounds:
        """The contribution bounds that apply to ``aggregate`` (its own, else the spec's)."""
        return aggregate.contribution or self.contribution
