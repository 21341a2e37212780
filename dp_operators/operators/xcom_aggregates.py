"""True aggregates through XCom with their types: NaN, infinities and exact decimals included (docs/adr/0014).

Airflow sends an XCom value to its API server as strict JSON: a float NaN or infinity fails the upstream task's XCom
push (``ValueError: Out of range float values are not JSON compliant``), after the task did its work, and so does a
``Decimal`` NaN or infinity, which Airflow's serializer turns into a float first; a finite ``Decimal`` of more than
15-17 significant digits arrives rounded to the nearest binary float. The release never runs.

:func:`aggregates_for_xcom` wraps the mapping an upstream task would return (the shapes of
:func:`dp_operators.release.prepare_inputs`) into an envelope of plain JSON that keeps every value's type:

=============================================  ===============================================================
value                                          carried as
=============================================  ===============================================================
``float`` (numpy ``float64``) NaN, inf, -inf   ``{"__dp_number__": "float", "text": "nan" | "inf" | "-inf"}``
finite ``float`` (numpy ``float64``)           the JSON number (Python's shortest repr: the same float back)
``decimal.Decimal`` (any, NaN and sNaN,        ``{"__dp_number__": "decimal", "text": str(value)}``: exact
``Infinity`` too)
``fractions.Fraction``                         ``{"__dp_number__": "fraction", "text": "p/q"}`` (hexadecimal)
``int`` outside [-2^63, 2^63)                  ``{"__dp_number__": "int", "text": hexadecimal}``
numpy ``float16``/``float32``/``longdouble``   ``{"__dp_number__": "float32", "text": str(value)}`` (the type kept:
                                               the release refuses float16/float32 by type as it would anyway)
numpy integers, numpy bool                     ``int``, ``bool``
``pandas.NA``, ``pandas.NaT``                  ``None`` (SQL's NULL either way)
mappings, lists, tuples                        a ``dict``, a ``list``, their items encoded
anything else (``int``, ``str``, ``None``,     itself, for Airflow's serializer
dates, ...)
=============================================  ===============================================================

The whole value is ``{"__dp_operators_aggregates__": 1, "aggregates": <encoded>}``. A special value is carried by
its type, like any other: the encoding of a value never depends on the other values, and a column holding a NaN is
carried exactly as the same column holding a finite float. The release operator
(:func:`~dp_operators.operators.upstream.pull_return_value`) decodes the envelope with :func:`aggregates_from_xcom`
and reads the values as if the upstream task had returned them directly: NaN and infinities follow the aggregate's
``non_finite`` policy (a float sum is still refused under ``upstream.arithmetic: exact``, by its type).

The values are still true aggregates in Airflow's XCom table, shown in the UI's XCom tab as any returned mapping
is: in production prefer a reference to Parquet files (float64 columns hold NaN and infinities natively) or SQL
(docs/operators.md, *Sources*).

This module imports neither Airflow nor numpy (numpy only to decode a numpy float), so an upstream task pays nothing
for it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

__all__ = ["ENVELOPE", "NUMBER", "XComAggregatesError", "aggregates_for_xcom", "aggregates_from_xcom",
           "is_xcom_aggregates"]

#: The key marking an encoded value; its value is the encoding's version.
ENVELOPE = "__dp_operators_aggregates__"
#: The key of an encoded number (``{NUMBER: kind, "text": text}``).
NUMBER = "__dp_number__"
_VERSION = 1
#: Text of the float special values, exactly as written: nothing else is read as a float.
_SPECIAL_FLOATS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
#: numpy float types carried with their type (float64 is a Python float and travels as one).
_NUMPY_FLOATS = ("float16", "float32", "longdouble")
_FRACTION = re.compile(r"-?[0-9a-f]+/[0-9a-f]+")
_HEX_INT = re.compile(r"-?[0-9a-f]+")
#: Ints outside [-2^63, 2^63) are carried in hexadecimal: JSON readers (and CPython's int <-> str, beyond 4,300 digits)
#: do not hold them all.
_INT64 = 2**63


class XComAggregatesError(ValueError):
    """An envelope :func:`aggregates_from_xcom` cannot read (a newer encoding, or one not written by
    :func:`aggregates_for_xcom`), or a mapping :func:`aggregates_for_xcom` cannot encode. The message names the
    problem, never a value."""


def aggregates_for_xcom(aggregates: Any) -> dict[str, Any]:
    """The upstream task's aggregates as plain JSON that Airflow's XCom carries with every value's type (module
    docstring): return this from the task instead of the mapping itself when a value may be NaN, infinite or a
    ``Decimal``.

    Example::

        @task(show_return_value_in_logs=False, multiple_outputs=False)
        def compute_aggregates() -> dict:
            rows = [{"city": "a", "count": float("nan")}, {"city": "b", "count": 3}]
            return aggregates_for_xcom({"people": rows, "income": Decimal("NaN")})

    Args:
        aggregates: the mapping of aggregate name to value the release reads
            (:func:`dp_operators.release.prepare_inputs`), or a reference to files holding them.

    Returns:
        ``{"__dp_operators_aggregates__": 1, "aggregates": <the value encoded>}``: JSON-compliant wherever the input
        holds only the types of the module docstring's table and types Airflow's serializer handles.

    Raises:
        XComAggregatesError: a mapping uses one of the reserved keys ``__dp_number__`` or
            ``__dp_operators_aggregates__`` (decided by the keys, never a value; an already wrapped value too).
    """
    return {ENVELOPE: _VERSION, "aggregates": _encode(aggregates)}


def is_xcom_aggregates(value: Any) -> bool:
    """True if ``value`` is an envelope written by :func:`aggregates_for_xcom` (decided by its keys alone)."""
    return isinstance(value, Mapping) and ENVELOPE in value


def aggregates_from_xcom(value: Any) -> Any:
    """The aggregates an envelope of :func:`aggregates_for_xcom` holds, every value of its original type (a numpy
    ``float64`` as a ``float``, ``pandas.NA`` as ``None``); any other value unchanged.

    Raises:
        XComAggregatesError: an envelope of a newer version, or one :func:`aggregates_for_xcom` did not write.
    """
    if not is_xcom_aggregates(value):
        return value
    version = value[ENVELOPE]
    if type(version) is not int or set(value) != {ENVELOPE, "aggregates"}:
        raise XComAggregatesError(
            f"the value holds the key {ENVELOPE!r} but is not an envelope written by aggregates_for_xcom: return "
            "aggregates_for_xcom(...)'s value unchanged, or rename that key (it is reserved)")
    if version > _VERSION:
        raise XComAggregatesError(
            f"the aggregates were encoded by a newer dp_operators (encoding {version}, this one reads up to "
            f"{_VERSION}): install the same dp_operators version on every worker"
        )
    return _decode(value["aggregates"])


def _encode(value: Any) -> Any:
    if isinstance(value, float):  # numpy float64 too
        number = float(value)
        if number != number:
            return {NUMBER: "float", "text": "nan"}
        if number in (float("inf"), float("-inf")):
            return {NUMBER: "float", "text": "inf" if number > 0 else "-inf"}
        return number
    if isinstance(value, Decimal):
        return {NUMBER: "decimal", "text": str(value)}
    if isinstance(value, Fraction):  # hexadecimal: CPython limits decimal int <-> str to 4,300 digits, not hex
        return {NUMBER: "fraction", "text": f"{value.numerator:x}/{value.denominator:x}"}
    if type(value) is int and not -_INT64 <= value < _INT64:  # JSON's own ints stay readable where JSON holds them
        return {NUMBER: "int", "text": f"{value:x}"}
    if isinstance(value, Mapping):
        reserved = sorted({ENVELOPE, NUMBER} & set(value))
        if reserved:
            raise XComAggregatesError(
                f"a mapping uses the reserved key {reserved[0]!r}: aggregates_for_xcom encodes the mapping the "
                "upstream task would return, once (rename that column, and do not wrap an encoded value again)"
            )
        return {key: _encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(item) for item in value]
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        if isinstance(value, numpy.floating) and type(value).__name__ in _NUMPY_FLOATS:
            return {NUMBER: type(value).__name__, "text": str(value)}
        if isinstance(value, numpy.integer):
            return int(value)
        if isinstance(value, numpy.bool_):
            return bool(value)
    pandas = sys.modules.get("pandas")
    if pandas is not None and (value is getattr(pandas, "NA", None) or value is getattr(pandas, "NaT", None)):
        return None
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, Mapping):
        if NUMBER in value:
            return _decode_number(value)
        return {key: _decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def _decode_number(tagged: Mapping) -> Any:
    kind, text = tagged.get(NUMBER), tagged.get("text")
    if set(tagged) != {NUMBER, "text"} or not isinstance(kind, str) or not isinstance(text, str):
        raise XComAggregatesError(f"an encoded number is not of the form {{{NUMBER!r}: kind, 'text': text}}: give "
                                  "the return value of aggregates_for_xcom unchanged")
    try:
        if kind == "float" and text in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[text]
        if kind == "decimal":
            return Decimal(text)
        if kind == "fraction" and _FRACTION.fullmatch(text):
            numerator, denominator = text.split("/")
            return Fraction(int(numerator, 16), int(denominator, 16))
        if kind == "int" and _HEX_INT.fullmatch(text):
            return int(text, 16)
        if kind in _NUMPY_FLOATS:
            import warnings

            import numpy

            # an overflow to inf converting the text warns into the task log: the type is what the release reads
            with warnings.catch_warnings(), numpy.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                return getattr(numpy, kind)(text)
    except (InvalidOperation, ValueError, ZeroDivisionError):
        pass
    # the text is withheld (it may be a data value), and so is a kind this module never writes
    named = (f"of kind {kind!r}" if kind in ("float", "decimal", "fraction", "int", *_NUMPY_FLOATS)
             else "of an unknown kind")
    raise XComAggregatesError(f"an encoded number {named} cannot be read: give the return value of "
                              "aggregates_for_xcom unchanged")
