"""Exact conversion and validation of public mechanism parameters (shared by samplers, calibration, accuracy)."""

from __future__ import annotations

import math
import numbers
from decimal import Decimal
from fractions import Fraction


def as_rational(value: object, name: str) -> Fraction:
    """Return ``value`` as an exact ``Fraction``.

    Accepts ints, ``Fraction``/other rationals, ``Decimal`` and finite floats (converted exactly, so ``0.1`` becomes
    the binary fraction it really is, not 1/10). Raises ValueError for bool, NaN and infinities, TypeError for
    non-numbers. ``name`` is the parameter name used in the message.
    """
    # bool is an int subclass; True as a scale is almost certainly a bug in the caller, not a request for scale 1
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got the bool {value!r}")
    if isinstance(value, numbers.Rational):
        return Fraction(value.numerator, value.denominator)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{name} must be finite, got {value!r}")
        return Fraction(value)
    if isinstance(value, numbers.Real):
        as_float = float(value)
        if not math.isfinite(as_float):
            raise ValueError(f"{name} must be finite, got {value!r}")
        return Fraction(as_float)
    raise TypeError(f"{name} must be an int, Fraction, Decimal or finite float, got {type(value).__name__} {value!r}")


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
