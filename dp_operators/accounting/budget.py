"""Exact budget numbers.

Budgets and charges are :class:`fractions.Fraction` values, never floats summed in a loop (DESIGN.md 2.3):
ten charges of 0.1 fill a cap of 1.0 exactly and an eleventh is refused; three charges of 1/3 fit in 1.
A user writes ``0.1`` in YAML, which arrives as the binary float 0.1000000000000000055...; :func:`exact_number`
reads it back as the decimal the user typed (the shortest repr that round-trips), so it becomes exactly 1/10.

To keep denominators bounded over many compositions, a charge whose denominator exceeds :data:`MAX_DENOMINATOR`
is rounded *up* to a multiple of ``1 / MAX_DENOMINATOR`` and a remaining budget is rounded *down*: rounding can
only overstate spend.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MAX_DENOMINATOR = 10**18


def exact_number(value: object, *, name: str = "value") -> Fraction:
    """Read ``value`` as an exact rational number.

    Accepts ``int``, ``Fraction``, ``Decimal``, a finite ``float`` (read as the decimal its shortest repr shows:
    ``0.1`` -> ``1/10``), numpy integer and float scalars, or a string holding a decimal (``"0.1"``, ``"1e-6"``) or a ratio (``"1/3"``).

    Raises:
        ValueError: for ``bool``, NaN, infinities, unparsable strings and other types; the message names ``name``.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got the boolean {value!r}")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, numbers.Integral):  # int, and numpy's integer scalars
        return Fraction(int(value))
    if isinstance(value, numbers.Real) and not isinstance(value, Decimal):  # float, and numpy's float scalars
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        return Fraction(Decimal(repr(number)))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        return Fraction(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            if "/" in text:
                numerator, denominator = text.split("/", 1)
                return Fraction(int(numerator), int(denominator))
            decimal = Decimal(text)
        except (ValueError, ZeroDivisionError, InvalidOperation):
            raise ValueError(
                f"{name} must be a decimal like '0.1' or a ratio like '1/3', got {value!r}"
            ) from None
        if not decimal.is_finite():
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        return Fraction(decimal)
    raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")


def _exact(value: object, name: str) -> Fraction:
    """``value`` when it is a ``Fraction`` already (the engine's typed values are: docs/adr/0028), else
    :func:`exact_number` of it: the same number, without reading an exact value again."""
    return value if isinstance(value, Fraction) else exact_number(value, name=name)


def round_up(value: Fraction, max_denominator: int = MAX_DENOMINATOR) -> Fraction:
    """Return ``value`` unchanged if its denominator is at most ``max_denominator``, else the smallest multiple of
    ``1/max_denominator`` above it (charges are rounded up)."""
    if value.denominator <= max_denominator:
        return value
    return Fraction(math.ceil(value * max_denominator), max_denominator)


def round_down(value: Fraction, max_denominator: int = MAX_DENOMINATOR) -> Fraction:
    """Like :func:`round_up`, towards minus infinity (remaining budgets are rounded down)."""
    if value.denominator <= max_denominator:
        return value
    return Fraction(math.floor(value * max_denominator), max_denominator)


@dataclass(frozen=True)
class GaussianNoise:
    """The parameters of one Gaussian noise addition, enough for exact Gaussian-DP accounting.

    Attributes:
        sigma2: the noise variance parameter sigma^2 (for the discrete Gaussian, the sigma^2 of N_Z(0, sigma^2)),
            in the query's units squared.
        l2_sensitivity_squared: the squared L2 sensitivity of the noised vector, same units.

        discrete: ``True`` for the discrete Gaussian N_Z(0, sigma^2) (every release mechanism of this project),
            ``False`` for continuous Gaussian noise.

    For continuous noise ``mu_squared = l2_sensitivity_squared / sigma2`` is exact: the mechanism is
    (Delta / sigma)-GDP (Dong, Roth & Su 2019, Thm 2.7), and composing k of them gives sqrt(sum mu_i^2)-GDP (ibid.,
    Cor. 3.3). The discrete Gaussian's privacy profile is slightly worse than the continuous one at the same sigma
    (CKS 2020, Thm 7; docs/adr/0005), so Delta / sigma is not a proven GDP bound for it.
    """

    sigma2: Fraction
    l2_sensitivity_squared: Fraction
    discrete: bool = False

    def __post_init__(self) -> None:
        for name in ("sigma2", "l2_sensitivity_squared"):
            value = _exact(getattr(self, name), name)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
            object.__setattr__(self, name, value)

    @property
    def mu_squared(self) -> Fraction:
        return self.l2_sensitivity_squared / self.sigma2


@dataclass(frozen=True)
class DiscreteLaplaceNoise:
    """The parameters of one discrete Laplace noise addition, enough for its own zCDP charge.

    Attributes:
        scale: t of Lap_Z(t) (pmf ~ exp(-|x| / t)), in grid units, exact.
        shifts: ``((shift, count), ...)``: neighbours differ by at most ``shift`` grid units (an int) in each of at
            most ``count`` coordinates of each class (``((linf, l0),)`` for one contribution bound). The pure epsilon
            of the noise is then ``sum(shift * count) / scale``.

    A ``zcdp`` account charges it :func:`~dp_operators.accounting.discrete_laplace_renyi.discrete_laplace_rho`
    where that is certified and below the pure-DP conversion (docs/adr/0015).
    """

    scale: Fraction
    shifts: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        scale = _exact(self.scale, "scale")
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        object.__setattr__(self, "scale", scale)
        shifts = tuple((shift, count) for shift, count in self.shifts)
        for shift, count in shifts:
            for name, value in (("shift", shift), ("count", count)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not shifts:
            raise ValueError("shifts must name at least one (shift, count) class")
        object.__setattr__(self, "shifts", shifts)

    @property
    def epsilon(self) -> Fraction:
        """The pure epsilon of this noise: L1 / t, exact."""
        return sum(shift * count for shift, count in self.shifts) / self.scale


@dataclass(frozen=True)
class PrivacyLoss:
    """The privacy loss of one mechanism, in the unit its calibration guarantees.

    Attributes:
        unit: ``"epsilon"`` (epsilon-DP, or (epsilon, delta)-DP when ``delta > 0``) or ``"rho"`` (rho-zCDP).
        amount: the exact loss, a positive :class:`~fractions.Fraction`.
        delta: the delta this loss is charged at on an ``approx_dp`` account. For an ``epsilon`` loss it is the
            mechanism's own delta (0: pure DP). For a ``rho`` loss it is the delta at which the rho-zCDP
            guarantee is converted to (epsilon, delta) (0: the loss cannot be charged to an ``approx_dp`` account).
        gaussian: for a Gaussian mechanism, its sigma^2 and squared L2 sensitivity; required by ``gaussian_dp``
            accounts, which only compose Gaussian mechanisms.
        laplace: for a pure discrete Laplace loss, its scale and integer shifts, with which a ``zcdp`` account
            charges the mechanism's own Rényi bound; ``amount`` must be their epsilon (ValueError otherwise).
        bounded_range: the ``epsilon`` loss is epsilon-bounded-range (the exponential mechanism: Durfee & Rogers,
            NeurIPS 2019), which is epsilon-DP and epsilon^2 / 8-zCDP (Cesar & Rogers, ALT 2021): a
            ``zcdp`` account charges epsilon^2 / 8 (exact for a rational epsilon) instead of epsilon tanh(epsilon/2).

    The optional fields default to "absent", so ``PrivacyLoss("rho", rho)`` keeps its old meaning.
    """

    unit: str
    amount: Fraction
    delta: Fraction = Fraction(0)
    gaussian: GaussianNoise | None = None
    laplace: DiscreteLaplaceNoise | None = None
    bounded_range: bool = False

    def __post_init__(self) -> None:
        if self.unit not in ("epsilon", "rho"):
            raise ValueError(f"unknown privacy-loss unit {self.unit!r}; expected 'epsilon' or 'rho'")
        if self.amount <= 0:
            raise ValueError(f"{self.unit} must be > 0, got {self.amount}")
        delta = _exact(self.delta, "delta")
        if not 0 <= delta < 1:
            raise ValueError(f"delta must be in [0, 1), got {self.delta}")
        object.__setattr__(self, "delta", delta)
        if self.bounded_range and (self.unit != "epsilon" or delta):
            raise ValueError("a bounded-range loss is a pure epsilon (unit 'epsilon', delta 0)")
        if self.laplace is not None and (self.unit != "epsilon" or self.laplace.epsilon != self.amount):
            raise ValueError(
                f"discrete Laplace noise of scale {self.laplace.scale} and shifts {self.laplace.shifts} is "
                f"{self.laplace.epsilon}-DP, not the {self.unit} {self.amount} this loss states"
            )
