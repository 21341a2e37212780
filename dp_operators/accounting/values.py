"""Typed privacy parameters: exact numbers validated once, where they enter the project (docs/adr/0028).

A budget number written in a spec (``epsilon: 0.3``) used to be read and checked again by every function it
passed through on its way to the sampler. Here it is read once, at the boundary (the spec's pydantic models, or
:mod:`dp_operators.api` for a Python caller), into a value whose type says what it is and what holds for it:

======================  ===========================  ======================================================
type                    holds                        used for
======================  ===========================  ======================================================
:class:`Epsilon`        exact rational > 0           pure or approximate DP epsilon
:class:`Rho`            exact rational > 0           zCDP rho (Bun & Steinke 2016, Def. 1.1)
:class:`Delta`          exact rational in (0, 1)     the delta of (epsilon, delta)-DP
:class:`Grid`           exact rational > 0           fixed-point resolution of a released value
:class:`Sensitivity`    exact rational > 0           L1, L2^2 or Linf sensitivity, in grid units
:class:`NoiseScale`     exact rational > 0           discrete Laplace t, or discrete Gaussian sigma^2
======================  ===========================  ======================================================

Each is a :class:`fractions.Fraction` (arithmetic, comparison, hashing, ``str`` and ``float`` are Fraction's, so a
calibration computed from typed values is the same number as before), immutable, and cannot be constructed holding
NaN, an infinity, a bool, a float, a value out of its range or text. Arithmetic on them gives plain ``Fraction``
values: a derived number (an equal share of a budget, a delta split in two) is typed again by the code that derives
it, with the constructor's check and no parse.

Two ways in:

* ``Epsilon(value)``: ``value`` must already be exact (``int``, ``Fraction``, a finite ``Decimal``, or a numerator
  and a denominator); a float is refused with TypeError, because which rational a float stands for is a decision
  (the decimal it was typed as, or its binary value) that belongs to the boundary reading it;
* ``Epsilon.read(value, name)``: the boundary's reading (:func:`~dp_operators.accounting.budget.exact_number`): a
  float is the decimal it was typed as (``0.1`` is 1/10), text is a decimal or a ratio (``"1/3"``). This is the
  one parse of a number.

``Epsilon.of(value, name)`` returns a typed value unchanged, checks an exact one with the constructor and reads
anything else: public functions that also serve direct callers (accounting) use it, so a typed argument is never
read again.

Errors: ValueError naming the field and the value for NaN, infinities, bools, zero or negative values and a delta
outside (0, 1); TypeError for a float or text given to a constructor, or a value that is not a number.

Source of the design: Tumult Analytics' budget types (``PureDPBudget``, ``ApproxDPBudget``, ``RhoZCDPBudget``),
validated at construction with the value in the message.
"""

from __future__ import annotations

import math
import numbers
from decimal import Decimal
from fractions import Fraction
from typing import ClassVar, TypeVar

import dp_operators.accounting.budget as _budget

__all__ = [
    "Delta",
    "Epsilon",
    "ExactParameter",
    "Grid",
    "NoiseScale",
    "PositiveRational",
    "Rho",
    "Sensitivity",
]

T = TypeVar("T", bound="ExactParameter")


class ExactParameter(Fraction):
    """An exact rational privacy parameter, validated at construction (base of the typed values; not used alone).

    Subclasses set :attr:`field` (the name in error messages) and :meth:`_check` (the range).
    """

    __slots__ = ()
    #: the parameter's name in error messages, unless the caller names the field
    field: ClassVar[str] = "value"

    def __new__(cls: type[T], value: object = 0, denominator: int | None = None, *, name: str | None = None) -> T:
        name = name or cls.field
        if denominator is not None:
            for part in (value, denominator):
                if type(part) is not int:
                    raise TypeError(f"{name}: numerator and denominator must be ints, got {value!r} / {denominator!r}")
            return cls._make(Fraction(value, denominator), value, name)  # ZeroDivisionError for 0, as Fraction
        if isinstance(value, cls):
            return value
        return cls._make(_exact(value, name, cls.__name__), value, name)

    @classmethod
    def _make(cls: type[T], number: Fraction, value: object, name: str) -> T:
        """The typed value of ``number`` once its range is checked (``value`` is what the message shows)."""
        cls._check(number, value, name)
        return Fraction.__new__(cls, number.numerator, number.denominator)

    @classmethod
    def _check(cls, number: Fraction, value: object, name: str) -> None:
        raise NotImplementedError

    @classmethod
    def read(cls: type[T], value: object, name: str | None = None) -> T:
        """Read a number as written by a user (``int``, ``Fraction``, ``Decimal``, a finite float as the decimal it
        was typed as, or text: ``"0.1"``, ``"1e-6"``, ``"1/3"``) and check it. The one parse of a number.

        Raises:
            ValueError: bool, NaN, infinities, unparsable text, other types, or a value outside the type's range;
                the message names ``name`` (default: the type's field) and the value as written.
        """
        name = name or cls.field
        # looked up on the module at call time, so that a test can count the parses (tests/accounting/test_values.py)
        return cls._make(_budget.exact_number(value, name=name), value, name)

    @classmethod
    def of(cls: type[T], value: object, name: str | None = None) -> T:
        """``value`` itself when it already has this type (checked when it was made); an exact number (``int``,
        ``Fraction``, ``Decimal``) checked by the constructor; anything else (a float, text) :meth:`read`."""
        if isinstance(value, cls):
            return value
        if isinstance(value, (numbers.Rational, Decimal)) and not isinstance(value, bool):
            return cls(value, name=name)
        return cls.read(value, name)

    def __setattr__(self, name: str, value: object) -> None:
        # Fraction keeps its numerator and denominator in writable slots; they are set once, by Fraction.__new__
        if name in ("_numerator", "_denominator") and not _initialised(self):
            object.__setattr__(self, name, value)
            return
        raise AttributeError(f"{type(self).__name__} values are immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} values are immutable; cannot delete {name!r}")

    def __reduce__(self):  # noqa: ANN204 (pickle: rebuild through the checking constructor)
        return (type(self), (self.numerator, self.denominator))

    def __copy__(self):  # noqa: ANN204 (immutable: a copy is itself)
        return self

    def __deepcopy__(self, memo):  # noqa: ANN001, ANN204
        return self


def _initialised(value: Fraction) -> bool:
    try:
        Fraction._denominator.__get__(value)  # type: ignore[attr-defined]
    except AttributeError:
        return False
    return True


def _exact(value: object, name: str, kind: str) -> Fraction:
    """``value`` as a Fraction when it is exact already; TypeError for a float or text, ValueError for a bool,
    a non-finite Decimal, or a value that is not a number."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got the boolean {value!r}")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        return Fraction(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        raise TypeError(
            f"{name} must be exact (an int, Fraction or Decimal), got the float {value!r}: read it with "
            f"{kind}.read(), which takes a float as the decimal it was typed as"
        )
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a number, got the text {value!r}: read text with {kind}.read()")
    raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")


class PositiveRational(ExactParameter):
    """An exact rational > 0 (finite by construction)."""

    __slots__ = ()

    @classmethod
    def _check(cls, number: Fraction, value: object, name: str) -> None:
        if number <= 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


class Epsilon(PositiveRational):
    """The epsilon of pure or approximate differential privacy (Dwork & Roth 2014, Def. 2.4), exact, > 0."""

    __slots__ = ()
    field = "epsilon"


class Rho(PositiveRational):
    """The rho of rho-zero-concentrated DP (Bun & Steinke 2016, Def. 1.1), exact, > 0."""

    __slots__ = ()
    field = "rho"


class Delta(ExactParameter):
    """The delta of (epsilon, delta)-DP, exact, strictly between 0 and 1 (0 is pure DP, which has no delta field;
    1 promises nothing)."""

    __slots__ = ()
    field = "delta"

    @classmethod
    def _check(cls, number: Fraction, value: object, name: str) -> None:
        if not 0 < number < 1:
            raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")


class Grid(PositiveRational):
    """The fixed-point resolution of a released value (released value = integer * grid), exact, > 0."""

    __slots__ = ()
    field = "grid"


class Sensitivity(PositiveRational):
    """A sensitivity (L1, L2^2 or Linf) of a noised integer vector, in grid units, exact, > 0 (DESIGN.md 2.6)."""

    __slots__ = ()
    field = "sensitivity"


class NoiseScale(PositiveRational):
    """A noise scale in grid units, exact, > 0: t of the discrete Laplace (pmf ~ exp(-|x| / t)), or sigma^2 of the
    discrete Gaussian (pmf ~ exp(-x^2 / (2 sigma^2))); Canonne, Kamath, Steinke 2020."""

    __slots__ = ()
    field = "scale"
