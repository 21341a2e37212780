"""Exact conversion and validation of public mechanism parameters (shared by samplers, calibration, accuracy).

A typed value of :mod:`dp_operators.accounting.values` was checked when it was made and is returned as it is
(docs/adr/0028): the engine passes typed budgets, scales and sensitivities, so nothing is read twice. Anything else
is read here, the boundary for a direct caller.
"""

from __future__ import annotations

import numbers
from decimal import Decimal
from fractions import Fraction
from typing import TypeVar

from dp_operators.accounting.budget import exact_number
from dp_operators.accounting.values import Delta, ExactParameter, PositiveRational

T = TypeVar("T", bound=ExactParameter)


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
    """Return ``value`` as an exact positive ``Fraction``; ValueError if it is not finite and > 0. A
    :class:`~dp_operators.accounting.values.PositiveRational` (an :class:`Epsilon`, a :class:`NoiseScale`...) is
    returned unchanged (its sign checked again: one comparison, and a value built around its constructor is caught)."""
    if isinstance(value, PositiveRational) and value > 0:
        return value
    result = as_rational(value, name)
    if result <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return result


def as_open_unit_interval(value: object, name: str) -> Fraction:
    """Return ``value`` as an exact ``Fraction`` in (0, 1); ValueError otherwise (e.g. alpha, delta). A
    :class:`~dp_operators.accounting.values.Delta` is returned unchanged."""
    if isinstance(value, Delta) and 0 < value < 1:
        return value
    result = as_rational(value, name)
    if not 0 < result < 1:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return result


def as_typed(kind: type[T], value: object, name: str) -> T:
    """``value`` as a ``kind`` (:class:`~dp_operators.accounting.values.Epsilon`, :class:`Delta`, ...): unchanged
    when it has that type already, else read as the mechanisms read a number (:func:`as_rational`: text refused
    with TypeError) and checked by ``kind``, with ``name`` and the value in the message (ValueError)."""
    if isinstance(value, kind):
        return value
    return kind._make(as_rational(value, name), value, name)
