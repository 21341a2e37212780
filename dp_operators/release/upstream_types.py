"""What each type an upstream task returns becomes, before any budget is reserved (issue 8, items 2 and 4).

Every upstream key and value is normalised to an exact, plain form or refused here, by its *type* only, so that no
type can pass the input checks and fail after the reservation (where the budget would be spent for nothing).

Values (``count``, ``sum``, ``sum_squares``, ``units``) become exact :class:`~fractions.Fraction` s:

========================================  ==================================================================
type                                      read as
========================================  ==================================================================
``int``, numpy integers                   the integer (never wraps: numpy int32/int64 become Python ints)
``decimal.Decimal``                       its exact decimal value (SQL ``SUM`` over ``NUMERIC``); NaN, sNaN and
                                          Infinity follow ``non_finite``
``fractions.Fraction``                    itself
``float``, numpy float64 / longdouble     counts: the float's exact binary value, then rounded as counts are (a
                                          float count is read by its type, whatever its value); sums: refused
                                          under ``upstream.arithmetic: exact`` (the default) by the type, for
                                          every value (an integral float, NaN and infinity as well as a fraction:
                                          a float sum may be further from its neighbour's than the sensitivity,
                                          Casacuberta et al., CCS 2022); under ``binary64`` the exact binary value,
                                          an infinity following ``non_finite.infinity``. A float NaN is SQL's NULL
                                          (below) wherever a float is read
numpy float16 / float32                   refused: they hold neither every count above 2^24 (2^11 for float16)
                                          nor a sum to double precision
``None``, ``pandas.NA``, ``pandas.NaT``   SQL's NULL: follows the ``nan`` policy of ``non_finite`` (for a count or
                                          unit count, replacement and clamping give 0)
``bool``, ``numpy.bool_``, ``str``,       refused
``bytes``, dates, anything else
========================================  ==================================================================

Keys (``group_by`` columns) become ``str``, ``int`` or ``None``: ``str`` and its subclasses (``numpy.str_``) -> str;
``int`` and numpy integers -> int; an ``Enum`` (``StrEnum``, ``IntEnum``) -> its ``.value``, normalised again;
``datetime.date`` / ``datetime`` (and ``pandas.Timestamp``) -> ``isoformat()``, a naive datetime at midnight
-> its date's ``isoformat()`` (pandas holds dates as midnight timestamps); ``None``, ``pandas.NA``,
``pandas.NaT`` and a float or ``Decimal`` NaN -> ``None`` (SQL's NULL group); an integral float -> ``int`` (pandas
makes an int column float64 when a key is missing); an integral ``Decimal`` (a ``NUMERIC`` key column) -> ``int``.
A value no release can publish (a non-integral float or ``Decimal``, a ``str`` with lone
surrogates, an int beyond :data:`MAX_KEY_BITS` bits) makes its row ignored, counted in the diagnostics: a refusal
would depend on that one row. ``bytes``, ``bool`` and other types are refused with the column, the type and how to
fix it.

Messages name the field and the type found, never a value or a row index (DESIGN.md 2.8).
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import numbers
import sys
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_operators.accounting import exact_number

if TYPE_CHECKING:
    from dp_operators.release.diagnostics import AggregateDiagnostics
    from dp_operators.spec import Aggregate

#: Data values are saturated at +-SATURATION grid units (about 4.6e18): they never overflow and never wrap.
SATURATION = 2**62
#: Decimal exponents beyond this (in magnitude) are not expanded: reading 1E+999999999 exactly would take the
#: memory of a billion-digit integer. Such values are far beyond any saturation limit (at most 2^62 grid units
#: of at most (10^12)^2) or far below any grid (at least (10^-12)^2), so they saturate or count as 0.
DECIMAL_EXPONENT_LIMIT = 1000

_EXACT_TYPES = "int, Decimal or Fraction"
#: Why a float sum is refused under ``upstream.arithmetic: exact`` and how to fix it (also used by the columnar and
#: Parquet readers, which refuse a floating sum column by its type).
FLOAT_SUM_ADVICE = (
    "a float sum is refused by its type whatever its value (an integral, NaN or infinite float too), since a binary "
    "float sum may be further from its neighbour's than the planned sensitivity (Casacuberta, Shoemate, Vadhan, "
    "Wagaman, CCS 2022). Compute the sums upstream as int or Decimal (sums of integer values; SQL SUM over NUMERIC "
    "or BIGINT; pandas: the nullable Int64 dtype, or .fillna(0).astype('int64'), which keep the type whether or not "
    "a group is missing; never wrap a float sum in Decimal(...) or int(...), which hides or truncates its rounding), "
    "or declare the float arithmetic on this aggregate in the spec: upstream: {arithmetic: binary64, max_rows: N}"
)


class InputTypeError(Exception):
    """A key or value of a type the engine refuses. ``field``: the field or key column; the message names the
    type found and how to fix it, never a value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class DropRow(Exception):
    """A data value whose declared ``non_finite`` policy is ``drop``: the row is ignored."""


def _pandas_missing(value: Any) -> bool:
    """True for ``pandas.NA`` and ``pandas.NaT``; pandas is never imported for this (if it was not imported, no
    value can be one of them)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and (value is getattr(pandas, "NA", None) or value is getattr(pandas, "NaT", None))


def _type_name(value: Any) -> str:
    """``float``, ``Decimal``, but ``numpy.float32``: numpy's names would be ambiguous without the package."""
    kind = type(value)
    package = kind.__module__.split(".")[0]
    return f"{package}.{kind.__name__}" if package in ("numpy", "pandas") else kind.__name__


#: An int key of more bits than this (about 1000 decimal digits) cannot be published: its row is treated as
#: outside every domain.
MAX_KEY_BITS = 3300


class _Unpublishable:
    """A key value no release can publish (a non-integral float, a str with lone surrogates, an int of more than
    :data:`MAX_KEY_BITS` bits): decided per value, so its row is ignored like a key outside the public domain and
    counted in the diagnostics, never refused (a refusal would depend on one row's value)."""

    def __repr__(self) -> str:
        return "UNPUBLISHABLE"


UNPUBLISHABLE = _Unpublishable()


def key_kind(value: Any) -> type | None:
    """The key type (``str`` or ``int``) an upstream key stands for, decided by its *type* alone, before
    normalisation: dates count as ``str``; ``None`` for floats (pandas puts a float NaN where a key of a text or int
    column is missing, so a float decides nothing), NULL-like values, and types :func:`normalise_key` refuses."""
    if isinstance(value, enum.Enum):
        return key_kind(value.value)
    if value is None or _pandas_missing(value) or isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (str, dt.date)):
        return str
    if isinstance(value, numbers.Integral):
        return int
    return None  # floats too: pandas makes a text or int key column hold NaN for a missing key


def normalise_key(value: Any, column: str) -> str | int | None | _Unpublishable:
    """One ``group_by`` value as a plain JSON key: ``str``, ``int`` or ``None`` (see the module docstring), or
    :data:`UNPUBLISHABLE` for a value no release can publish (its row is ignored, never refused).

    Raises:
        InputTypeError: bytes, bool, or any other type; names the column and the type (never the value).
    """
    if value is UNPUBLISHABLE:  # a source's reader already found this value unpublishable (an out-of-range date)
        return value
    if type(value) is str and value.isascii():  # the common case, already plain
        return value
    if type(value) is int and value.bit_length() <= MAX_KEY_BITS:  # (bool is not exactly int)
        return value
    if isinstance(value, enum.Enum):
        value = value.value
        if isinstance(value, enum.Enum):  # an enum of enums: one more level, then refuse below
            value = value.value
    if value is None or _pandas_missing(value):
        return None
    if isinstance(value, (bool, np.bool_)):
        raise InputTypeError(column, f"key column {column!r} holds a bool; give str or int keys (e.g. 'yes'/'no')")
    if isinstance(value, str):
        text = str.__str__(value)  # a plain str, also for numpy.str_ and other subclasses
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates (surrogateescape decoding): no JSON file or ledger row holds it
            return UNPUBLISHABLE
        return text
    if isinstance(value, numbers.Integral):
        number = int(value)
        # Python refuses to print ints beyond 4300 digits; such a key could not be published or compared
        return number if number.bit_length() <= MAX_KEY_BITS else UNPUBLISHABLE
    if isinstance(value, Decimal):
        # a NUMERIC key column (PostgreSQL, Parquet decimal): NaN is the NULL group, an integral value its int, any
        # other value no key at all; decided like floats, never refused by the value
        if value.is_nan():
            return None
        if value.is_finite() and abs(value.adjusted()) <= DECIMAL_EXPONENT_LIMIT and value == value.to_integral_value():
            number = int(value)
            return number if number.bit_length() <= MAX_KEY_BITS else UNPUBLISHABLE
        return UNPUBLISHABLE
    if isinstance(value, (float, np.floating)):
        # pandas turns an int key column into float64 when one key is missing: never refuse by the value (that
        # would make the refusal depend on one row). NaN is the NULL group, an integral float its int, any other
        # float no key at all (the row is outside every domain, counted in the diagnostics).
        if value != value:
            return None
        number = float(value)
        if math.isfinite(number) and number.is_integer():
            return int(number)
        return UNPUBLISHABLE
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise InputTypeError(
            column, f"key column {column!r} holds {_type_name(value)}; decode it upstream (e.g. .decode('utf-8'))"
        )
    if isinstance(value, dt.datetime) and value.tzinfo is None and value.time() == dt.time(0):
        return value.date().isoformat()  # a date held as a midnight datetime (pandas' datetime64 columns)
    if isinstance(value, dt.date):  # datetime and pandas.Timestamp too (NaT was caught above)
        return value.isoformat()
    raise InputTypeError(
        column, f"key column {column!r} holds a {_type_name(value)}; give str, int, date or None keys"
    )


def _largest_grid(aggregate: Aggregate) -> Fraction:
    return max(aggregate.grid, aggregate.grid**2) if not aggregate.reads_counts else Fraction(1)


def _special(
    aggregate: Aggregate, kind: str, negative: bool, field: str, label: str, diagnostics: AggregateDiagnostics,
    count_like: bool = False,
) -> Fraction:
    """A NaN (``kind == "nan"``) or infinity handled by the aggregate's ``non_finite`` policy. For a count or a unit
    count (``count_like``) ``replace`` and ``clamp`` both give 0: a NULL count is an empty group, and an infinite or
    saturated count would let one garbage row push a key over the partition-selection threshold."""
    diagnostics.special(field, label)
    policy = aggregate.non_finite
    action = policy.nan if kind == "nan" else policy.infinity
    if action == "drop":
        raise DropRow
    if count_like:  # a count is never infinite or missing in truth: 0 (an empty group) is the only safe value
        return Fraction(0)
    if action == "clamp":
        return Fraction(-SATURATION if negative else SATURATION) * _largest_grid(aggregate)
    return exact_number(policy.replace_with, name="non_finite.replace_with")


def _decimal(
    value: Decimal, aggregate: Aggregate, field: str, diagnostics: AggregateDiagnostics, count_like: bool
) -> Fraction:
    if value.is_nan():  # NaN and sNaN (never compared: sNaN raises on comparison)
        return _special(aggregate, "nan", False, field, "nan", diagnostics, count_like)
    if value.is_infinite():
        return _special(aggregate, "infinity", value.is_signed(), field, "infinity", diagnostics, count_like)
    if value.is_zero():
        return Fraction(0)
    if value.adjusted() > DECIMAL_EXPONENT_LIMIT:
        return Fraction(-1 if value.is_signed() else 1) * 10**DECIMAL_EXPONENT_LIMIT
    if value.adjusted() < -DECIMAL_EXPONENT_LIMIT:
        return Fraction(0)
    return Fraction(value)


def read_number(
    value: Any, aggregate: Aggregate, field: str, component: str, diagnostics: AggregateDiagnostics
) -> Fraction:
    """One upstream value as an exact number (see the module docstring for each type).

    Args:
        value: the upstream value.
        aggregate: its aggregate (``non_finite`` policy, ``upstream.arithmetic``, grid).
        field: the row field it came from (``count``, ``sum``, ``sum_squares``, ``units``), for messages.
        component: ``count`` for counts and unit counts, ``sum`` for sums and sums of squares.
        diagnostics: where special and float values are counted.

    Raises:
        InputTypeError: a type the engine refuses (decided by the type alone, never the value).
        DropRow: the value's ``non_finite`` policy drops its row.
    """
    if type(value) is int:  # the common case (bool is not exactly int)
        return Fraction(value)
    if value is None or _pandas_missing(value):
        return _special(aggregate, "nan", False, field, "null", diagnostics, component == "count")
    if isinstance(value, (bool, np.bool_)):
        raise InputTypeError(field, f"field {field!r} holds a bool; give a number ({_EXACT_TYPES})")
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    if isinstance(value, Fraction):
        return value
    if isinstance(value, Decimal):
        return _decimal(value, aggregate, field, diagnostics, component == "count")
    if isinstance(value, np.floating) and np.finfo(value.dtype).nmant < np.finfo(np.float64).nmant:
        exact_up_to = np.finfo(value.dtype).nmant + 1
        raise InputTypeError(
            field,
            f"field {field!r} holds a {_type_name(value)}, which holds neither every count above 2^{exact_up_to} nor "
            f"a sum to double precision; return {_EXACT_TYPES} values (or float64)",
        )
    if isinstance(value, (float, np.floating)):
        if component == "sum" and aggregate.upstream.arithmetic == "exact":
            # by the type alone, before NaN and inf: reading an integral float and refusing 30.5 (or inf) would make
            # the refusal depend on a value, and pandas makes an int column float64 when one group is missing
            # (docs/adr/0017)
            raise InputTypeError(
                field, f"field {field!r} holds a {_type_name(value)} but upstream.arithmetic is 'exact': "
                + FLOAT_SUM_ADVICE
            )
        if np.isnan(value):  # SQL NULL as pandas shows it
            return _special(aggregate, "nan", False, field, "nan", diagnostics, component == "count")
        diagnostics.float_values[field] += 1
        if np.isinf(value):
            negative = bool(value < 0)
            return _special(aggregate, "infinity", negative, field, "infinity", diagnostics, component == "count")
        return Fraction(*value.as_integer_ratio())  # the float's exact binary value, not its shortest decimal
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    if isinstance(value, (str, bytes, bytearray)):
        advice = "parse it upstream (int(...), Decimal(...))"
    elif isinstance(value, (dt.date, dt.time, dt.timedelta, np.datetime64, np.timedelta64)):
        advice = "convert it to a number upstream"
    else:
        advice = f"give {_EXACT_TYPES}" + (", or a float for a count" if component == "count" else "")
    raise InputTypeError(field, f"field {field!r} holds a {_type_name(value)}, not a number; {advice}")

