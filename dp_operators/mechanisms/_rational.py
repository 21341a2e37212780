"""Exact conversion and validation of public mechanism parameters (shared by samplers, calibration, accuracy)."""

from __future__ import annotations

import numbers
from decimal import Decimal
from fractions import Fraction

from dp_operators.accounting.budget import exact_number


def as_rational(value: object, name: str) -> Fraction:
    """Return ``value`` as an exact ``Fraction``, read as the project reads every public number
    (:func:`dp_operators.accounting.exact_number`: a float is the decimal it was typed as, ``0.1`` is 1/10).

    Raises ValueError for bool, NaN and infinities, TypeError for values that are not numbers (text included:
    mechanism parameters are numbers). ``name`` is the parameter name used in the message.
    """
    if value is None or isinstance(value, (str, bytes)) or not isinstance(value, (numbers.Number, Decimal)):
        raise TypeError(
            f"{name} must be an int, Fraction, Decimal or finite float, got {type(value).__name__} {value!r}"
        )
    return exact_number(value, name=name)


def as_positive_rational(value: object, name: str) -> Fraction:
    """Return ``value`` as an exact positive ``Fraction``; ValueError if it is not finite and > 0."""
    result = as_rational(value, name)
    if result <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return result


def as_open_unit_interval(value: object, name: str) -> Fraction:
    """Return ``value`` as an exact ``Fraction`` in (0, 1); ValueError otherwise (e.g. alpha, delta)."""
    result = as_rational(value, name)
    if not 0 < result < 1:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return result
