"""Pydantic models of a release spec (version 1). Field reference: README, section "Release spec reference".

Every model forbids unknown keys (a typo like ``epsilion`` is an error, not a silently ignored field). Budget
numbers are read exactly (:func:`dp_operators.accounting.exact_number`): ``0.1`` is 1/10, ``"1/3"`` is 1/3.
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator, model_validator

from dp_operators.accounting import exact_number


#: Budgets (epsilon, rho) and grids outside this range are refused: scales computed from them would overflow or
#: underflow floating point in accuracy and reporting, and no meaningful release needs them.
SUPPORTED_RANGE = (Fraction(1, 10**12), Fraction(10**12))
#: Bounds and replacement values beyond this magnitude are refused for the same reason.
MAX_MAGNITUDE = 10**15


def _positive_exact(value: object) -> Fraction:
    number = exact_number(value, name="value")
    if number <= 0:
        raise ValueError(f"must be > 0, got {value!r}")
    low, high = SUPPORTED_RANGE
    if not low <= number <= high:
        raise ValueError(f"must be between 1e-12 and 1e12, got {value!r}")
    return number


def _finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"must be finite, got {value!r}")
    if abs(number) > MAX_MAGNITUDE:
        raise ValueError(f"must be at most 1e15 in magnitude, got {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else number


#: A strictly positive exact rational read from int, float, decimal string or "p/q" string.
PositiveExact = Annotated[Fraction, BeforeValidator(_positive_exact), PlainSerializer(str, return_type=str)]
#: A finite int or float.
FiniteNumber = Annotated[float | int, BeforeValidator(_finite)]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _delta(value: object) -> Fraction:
    number = exact_number(value, name="delta")
    if not 0 < number < 1:
        raise ValueError(f"delta must be in (0, 1), got {value!r}")
    if number < Fraction(1, 10**300):
        raise ValueError(f"delta must be at least 1e-300, got {value!r}")
    return number


#: An exact delta in the open interval (0, 1).
Delta = Annotated[Fraction, BeforeValidator(_delta), PlainSerializer(str, return_type=str)]


class Budget(_Strict):
    """The privacy loss one aggregate may spend. One of:

    * ``{epsilon}``: pure epsilon-DP (``discrete_laplace``, or ``auto`` which then picks it);
    * ``{rho}``: rho-zCDP (``discrete_gaussian``; ``auto`` compares it with a Laplace at epsilon = sqrt(2 rho));
    * ``{epsilon, delta}``: approximate DP. ``discrete_gaussian`` is calibrated with the exact (epsilon, delta)
      privacy profile of the discrete Gaussian (docs/mechanisms.md); ``auto`` compares it with a pure Laplace.
    """

    epsilon: PositiveExact | None = None
    rho: PositiveExact | None = None
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
    one aggregate, each at most ``max_contributions_per_partition`` times (Linf). L1 = L0*Linf, L2 = sqrt(L0)*Linf."""

    max_partitions_contributed: int = Field(default=1, ge=1)
    max_contributions_per_partition: int = Field(default=1, ge=1)


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
      ``NUMERIC``/``DECIMAL``) or ``Fraction``. A binary float for a sum, mean or variance is refused before any
      budget is reserved (its rounding error is not inside the planned sensitivity).
    * ``arithmetic: binary64``: sums are IEEE 754 double-precision floats (pandas, numpy, SQL ``DOUBLE``), computed in
      any order over at most ``max_rows`` values per partition. The sensitivity then carries a sound allowance for
      the summation error (Casacuberta et al., CCS 2022; Higham 2002, section 4.2), and a grid the float cannot
      carry is refused at plan time.
    * ``max_rows``: the most upstream rows (values) summed into one partition's total: a public bound, declared by the
      author (required with ``binary64``). It also lets the plan refuse a spec whose totals could reach the engine's
      saturation limit.
    """

    arithmetic: Literal["exact", "binary64"] = "exact"
    max_rows: int | None = Field(default=None, ge=1, le=10**15)

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
}


class Aggregate(_Strict):
    """One released aggregate: a count, bounded sum, mean or variance; optionally grouped over a public key domain
    (``keys``) or over keys found in the data (``partition_selection``)."""

    name: str
    kind: Literal["count", "sum", "mean", "variance"]
    group_by: list[str] = Field(default_factory=list)
    keys: dict[str, list[str | int]] | None = None
    partition_selection: PartitionSelection | None = None
    bounds: tuple[FiniteNumber, FiniteNumber] | None = None
    grid: PositiveExact = Fraction(1)
    mechanism: Literal["discrete_laplace", "discrete_gaussian", "auto"]
    budget: Budget
    contribution: ContributionBounds | None = None
    non_finite: NonFinitePolicy = NonFinitePolicy()
    out_of_range: Literal["clamp"] = "clamp"
    upstream: UpstreamSums = UpstreamSums()

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"aggregate names use letters, digits, '_' and '-', got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Aggregate:
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError(f"group_by lists a column twice: {self.group_by}")
        if self.partition_selection is not None:
            if not self.group_by:
                raise ValueError("partition_selection needs group_by columns (it selects which keys to release)")
            if self.keys is not None:
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
        if self.kind != "count":
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
        if self.kind == "count" and self.upstream.arithmetic != "exact":
            raise ValueError(
                "upstream.arithmetic binary64 applies to sums, means and variances; a count is an integer "
                "(a float count is read as the number it holds)"
            )
        allowed = MECHANISM_BUDGETS[self.mechanism]
        if self.budget.form not in allowed:
            raise ValueError(
                f"mechanism {self.mechanism} is calibrated from {' or '.join(allowed)}, "
                f"but budget gives {self.budget.form}"
                + (" (use mechanism: auto to let the engine choose)" if self.mechanism != "auto" else "")
            )
        return self

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


class Postprocess(_Strict):
    """Post-processing of noised values (free under DP: it never touches raw data)."""

    clamp_nonnegative: bool = True


class ReleaseSpec(_Strict):
    """A release spec document (``version: 1``)."""

    version: Literal[1]
    release: str
    budget_account: str
    privacy_unit: str
    description: str | None = None
    contribution: ContributionBounds = ContributionBounds()
    confidence: float = Field(default=0.95, gt=0, lt=1, allow_inf_nan=False)
    aggregates: list[Aggregate] = Field(min_length=1)
    postprocess: Postprocess = Postprocess()

    @field_validator("release", "budget_account")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"use letters, digits, '_' and '-', got {value!r}")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> ReleaseSpec:
        names = [aggregate.name for aggregate in self.aggregates]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"aggregate names must be unique, repeated: {duplicates}")
        return self

    def contribution_for(self, aggregate: Aggregate) -> ContributionBounds:
        """The contribution bounds that apply to ``aggregate`` (its own, else the spec's)."""
        return aggregate.contribution or self.contribution
