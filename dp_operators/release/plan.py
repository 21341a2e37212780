"""The release plan: mechanisms, sensitivities, scales and charges, from public parameters only (no data).

Sensitivities follow DESIGN.md 2.6 (L1 = L0 * Linf, L2^2 = L0 * Linf^2), with L0 capped by the number of partitions
and Linf carrying the float-sum allowance of :mod:`dp_operators.release.float_sums`; binary64 sums over public keys
add, for each of the P - L0 partitions the privacy unit does not touch, the allowance a = ceil(2E / grid) that their
summation order alone can move them (L1 += (P - L0) a, L2^2 += (P - L0) a^2; :class:`Shift`, docs/adr/0017);
calibration follows docs/mechanisms.md and docs/adr/0010 to 0013 and 0017; ``auto`` chooses by the cost on the
account it is charged to.

Numbers arrive typed (docs/adr/0028): a spec's budgets are :class:`~dp_operators.accounting.Epsilon`,
:class:`~dp_operators.accounting.Rho` and :class:`~dp_operators.accounting.Delta` values read once at load; the
plan types what it derives (shares of a budget, sensitivities, scales) with the constructors' checks, and the
calibration and accounting functions take those values as they are, without reading them again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from dp_operators.accounting import (
    Delta,
    DiscreteLaplaceNoise,
    Epsilon,
    GaussianNoise,
    IncompatibleAccountantError,
    NoiseScale,
    PrivacyLoss,
    Rho,
    Sensitivity,
    charge_in_account_unit,
    delta_in_account,
    unit_of,
)
from dp_operators.mechanisms import (
    discrete_gaussian_accuracy,
    discrete_gaussian_sigma2,
    discrete_gaussian_sigma2_for_approx_dp,
    discrete_gaussian_variance,
    discrete_laplace_accuracy,
    discrete_laplace_scale,
    discrete_laplace_variance,
    opendp_gaussian_scale,
    opendp_laplace_scale,
    sample_discrete_gaussian_array,
    sample_discrete_gaussian_opendp,
    sample_discrete_gaussian_vector,
    sample_discrete_laplace_array,
    sample_discrete_laplace_opendp,
    sample_discrete_laplace_vector,
)
from dp_operators.mechanisms.calibration import (
    discrete_gaussian_threshold,
    discrete_laplace_threshold,
    epsilon_for_rho,
    rho_for_approx_dp,
    rho_to_epsilon,
)
from dp_operators.mechanisms.privacy_profile import discrete_gaussian_delta
from dp_operators.release.errors import ReleaseConfigError
from dp_operators.release.float_sums import (
    ComponentBound,
    check_component,
    check_partition_selection,
    component_bound,
)
from dp_operators.release.upstream_types import SATURATION
from dp_operators.spec import Aggregate, Budget, ReleaseSpec
from dp_operators.spec.models import SAMPLERS


@dataclass(frozen=True)
class Shift:
    """The most one privacy unit moves a noised integer vector (grid units), coordinate by coordinate: by at most
    ``linf`` in each of ``l0`` coordinates (the partitions it touches), and by at most ``untouched_allowance`` in
    each of ``untouched_partitions`` others (binary64 sums over public keys: a partition it does not touch still
    moves by its summation order, :attr:`~dp_operators.release.float_sums.ComponentBound.untouched_allowance`;
    0 otherwise). ``untouched_allowance <= linf`` (2E <= Delta + 2E).

    The worst case over such neighbours: L1 = l0 linf + untouched_partitions untouched_allowance, and
    L2^2 = l0 linf^2 + untouched_partitions untouched_allowance^2 (each coordinate at its largest change).
    """

    linf: int
    l0: int
    untouched_allowance: int = 0
    untouched_partitions: int = 0

    @property
    def l1(self) -> int:
        return self.l0 * self.linf + self.untouched_partitions * self.untouched_allowance

    @property
    def l2_squared(self) -> int:
        return self.l0 * self.linf * self.linf + self.untouched_partitions * self.untouched_allowance**2

    @property
    def equal_shifts(self) -> tuple[int, int] | None:
        """``(linf, coordinates)`` when every coordinate that may move moves by the same bound (the form the exact
        privacy profile of :mod:`dp_operators.mechanisms.privacy_profile` is computed for), else None."""
        if not self.untouched_partitions or not self.untouched_allowance:
            return self.linf, self.l0
        if self.untouched_allowance == self.linf:
            return self.linf, self.l0 + self.untouched_partitions
        return None

    @property
    def dominating_shifts(self) -> tuple[int, int]:
        """``(linf, coordinates)`` of equal shifts whose privacy profile is at least this vector's: every coordinate
        that may move, moved by ``linf``. A smaller shift on one coordinate is a post-processing of the larger one
        (the Blackwell argument of :mod:`dp_operators.mechanisms.privacy_profile`), so the profile computed for the
        dominating vector is an upper bound of this one's delta."""
        return self.linf, self.l0 + (self.untouched_partitions if self.untouched_allowance else 0)


def discrete_gaussian_shift_delta(sigma2: NoiseScale, epsilon: Epsilon, shift: Shift) -> float:
    """An upper bound of the (epsilon, delta) privacy profile of i.i.d. N_Z(0, sigma2) noise for neighbours within
    ``shift``: the exact profile for equal shifts, else that of the dominating equal shifts (:class:`Shift`)."""
    linf, l0 = shift.equal_shifts or shift.dominating_shifts
    return discrete_gaussian_delta(sigma2, epsilon, linf=linf, l0=l0)


#: A heterogeneous shift is also calibrated by the exact profile of its dominating equal shifts while their L2^2 is
#: at most this many times its own. Beyond that the zCDP route with the vector's own L2^2 gives less noise: it
#: costs at most 1.24 times the exact profile's sigma^2 (measured over epsilon 0.05 to 30, delta 1e-5 to 1e-12),
#: and the profile of many coordinates is slow. Only the noise's size depends on it; both routes are valid.
_DOMINATING_PROFILE_RATIO = 4


def discrete_gaussian_sigma2_for_shift(epsilon: Epsilon, delta: Delta, shift: Shift) -> NoiseScale:
    """The smallest sigma^2 found for which i.i.d. N_Z(0, sigma^2) noise is (epsilon, delta)-DP for neighbours
    within ``shift``.

    * Equal shifts (every exact sum, and binary64 without untouched partitions): the exact privacy profile
      (:func:`~dp_operators.mechanisms.discrete_gaussian_sigma2_for_approx_dp`).
    * Unequal shifts (L0 coordinates by Linf, the P - L0 untouched ones by a < Linf): the profile is computed for
      equal shifts only, so the smaller of two valid calibrations: the zCDP route with the vector's own L2^2
      (CKS 2020, Theorem 14 holds for every shift vector: rho = ||shift||_2^2 / (2 sigma^2); Corollary 13 converts
      rho to (epsilon, delta)), rounded up to 12 significant digits; and the exact profile of the dominating equal
      shifts (every coordinate by Linf), while its L2^2 is within :data:`_DOMINATING_PROFILE_RATIO` of the vector's.
    """
    equal = shift.equal_shifts
    if equal is not None:
        return discrete_gaussian_sigma2_for_approx_dp(epsilon, delta, linf=equal[0], l0=equal[1])
    sigma2 = discrete_gaussian_sigma2(Sensitivity(shift.l2_squared), rho_for_approx_dp(epsilon, delta))
    by_zcdp = NoiseScale(_round_up_significant(sigma2))
    linf, l0 = shift.dominating_shifts
    if l0 * linf * linf > _DOMINATING_PROFILE_RATIO * shift.l2_squared:
        return by_zcdp
    return min(by_zcdp, discrete_gaussian_sigma2_for_approx_dp(epsilon, delta, linf=linf, l0=l0))


def _round_up_significant(value: Fraction, digits: int = 12) -> Fraction:
    """``value`` (> 0) rounded up to ``digits`` significant decimal digits: a short exact rational."""
    step = Fraction(10) ** (math.floor(math.log10(value)) - (digits - 1))
    return math.ceil(value / step) * step


@dataclass(frozen=True)
class NoiseStep:
    """One noised sub-step of a release: integers (grid units) noised with one exact mechanism.

    Attributes:
        aggregate, component: which aggregate and which part: ``count``, ``sum``, ``sum_squares``, or
            ``selection`` (the noised count of privacy units compared with ``threshold``).
        mechanism: ``discrete_laplace`` (``scale`` is t, pmf ~ exp(-|x|/t)) or ``discrete_gaussian``
            (``scale`` is sigma^2, pmf ~ exp(-x^2 / (2 sigma^2))), in grid units.
        budget: the budget this step was calibrated to (its share of the aggregate's budget).
        linf: how much one privacy unit changes one partition, in grid units; l0: in how many partitions.
        untouched_allowance, untouched_partitions: how much (grid units) each of how many other partitions can
            still move between neighbours: binary64 sums over public keys (a = ceil(2E / grid), P - L0 of them;
            docs/adr/0017); 0 otherwise. The sensitivities include them (:class:`Shift`).
        grid: the fixed-point resolution: released value = integer * grid (1 for counts, grid^2 for squares).
        partitions: number of noised values; None under partition selection (it depends on the data).
        noise_delta: the delta of the noise's own (epsilon, delta) guarantee (0 for pure DP and zCDP).
        threshold, threshold_delta: partition selection only: release iff noised count >= threshold; the delta
            that comparison costs.
        declared_l0: the spec's ``max_partitions_contributed``; ``l0`` is it capped by the number of partitions.
        bound: the component's public bounds (sensitivity, float allowance, rounding; :mod:`.float_sums`).
        sampler: where the noise comes from (the spec's ``sampler``; docs/adr/0022): ``vectorised`` (default; the
            inverse-CDF samplers of :mod:`dp_operators.mechanisms.vectorised`), ``scalar`` (the CKS 2020 rejection
            samplers of :mod:`dp_operators.mechanisms.samplers`) or ``opendp`` (OpenDP's, the reference, at the
            smallest float scale >= ``scale``: :mod:`dp_operators.mechanisms.opendp_samplers`). All three draw the
            same exact law; the plan, its charge and its half-widths do not depend on the choice.
    """

    aggregate: str
    component: str
    mechanism: str
    budget: Budget
    linf: int
    l0: int
    scale: NoiseScale
    grid: Fraction
    partitions: int | None
    noise_delta: Fraction = Fraction(0)
    threshold: int | None = None
    threshold_delta: Fraction | None = None
    declared_l0: int | None = None
    bound: ComponentBound | None = None
    sampler: str = "vectorised"
    untouched_allowance: int = 0
    untouched_partitions: int = 0

    @property
    def shift(self) -> Shift:
        """The worst-case change between neighbours' noised integers (:class:`Shift`)."""
        return Shift(self.linf, self.l0, self.untouched_allowance, self.untouched_partitions)

    @property
    def l1_sensitivity(self) -> int:
        """L1 in grid units: L0 * Linf, plus (P - L0) * a for the untouched partitions of binary64 sums."""
        return self.shift.l1

    @property
    def l2_sensitivity_squared(self) -> int:
        """L2^2 in grid units: L0 * Linf^2, plus (P - L0) * a^2 for the untouched partitions of binary64 sums."""
        return self.shift.l2_squared

    @property
    def epsilon(self) -> Epsilon | None:
        """The pure epsilon of a Laplace step (L1 / t, exact); the calibrated epsilon of an approximate Gaussian."""
        if self.mechanism == "discrete_laplace":
            return Epsilon(Fraction(self.l1_sensitivity) / self.scale)
        return self.budget.epsilon if self.budget.form == "epsilon_delta" else None

    @property
    def rho(self) -> Rho | None:
        """The zCDP rho of a Gaussian step: L2^2 / (2 sigma^2), exact (CKS 2020, Theorem 14)."""
        if self.mechanism == "discrete_gaussian":
            return Rho(Fraction(self.l2_sensitivity_squared) / (2 * self.scale))
        return None

    @property
    def delta(self) -> Fraction:
        """The delta this step's (epsilon, delta) guarantee spends (noise profile plus threshold), 0 if pure."""
        return self.noise_delta + (self.threshold_delta or 0)

    def privacy_loss(self, accountant: str) -> PrivacyLoss:
        """The loss to charge to an ``accountant`` account: the adapter between mechanisms and accounting.

        * Laplace: pure epsilon = L1 / t (with the threshold's delta for partition selection).
        * Gaussian calibrated to rho: rho, with its sigma^2 and L2^2 for Gaussian-DP accounts.
        * Gaussian calibrated to (epsilon, delta) by the exact profile: (epsilon, delta) on ``approx_dp``; on other
          accounts the exact rho = L2^2 / (2 sigma^2) of the same noise, a valid but looser description
          (docs/adr/0011), with delta as the conversion delta.
        """
        noise = GaussianNoise(self.scale, Fraction(self.l2_sensitivity_squared), discrete=True)
        if self.component == "selection" or self.mechanism == "discrete_laplace":
            if self.mechanism == "discrete_laplace":
                # the integer shifts behind epsilon = L1 / t: a zCDP account charges their own bound (docs/adr/0015)
                shift = self.shift
                classes = ((shift.linf, shift.l0), (shift.untouched_allowance, shift.untouched_partitions))
                laplace = DiscreteLaplaceNoise(self.scale, tuple((size, n) for size, n in classes if size and n))
                return PrivacyLoss("epsilon", self.epsilon, delta=self.delta, laplace=laplace)
            return PrivacyLoss("epsilon", self.budget.epsilon, delta=self.delta)
        if self.budget.form == "epsilon_delta" and accountant == "approx_dp":
            return PrivacyLoss("epsilon", self.budget.epsilon, delta=self.delta)
        return PrivacyLoss("rho", self.rho, delta=self.delta, gaussian=noise)

    def published_selection(self) -> dict[str, Any]:
        """A partition-selection step as a release publishes it (public parameters): its mechanism, threshold and
        budget."""
        return {"mechanism": self.mechanism, "threshold": self.threshold, "epsilon": float(self.budget.epsilon),
                "delta": float(self.budget.delta)}

    def noise_half_width_units(self, alpha: float) -> float:
        """Half-width a of the noise alone, in grid units: P(|Z| > a) <= alpha (public parameters only)."""
        if self.mechanism == "discrete_laplace":
            return discrete_laplace_accuracy(self.scale, alpha)
        return float(discrete_gaussian_accuracy(self.scale, alpha))

    def half_width(self, alpha: float) -> float:
        """Half-width of a (1 - alpha) interval around the released value that holds the true, unrounded value, in
        value units (public parameters only): the noise's half-width, plus half a grid step for a value rounded to
        the grid (``floor(x / grid + 1/2)`` is within grid/2 of x), plus, for binary64 upstream sums, the bound on
        their summation error (:attr:`ComponentBound.interval_error`). Rounded up to a float.
        """
        units = Fraction(self.noise_half_width_units(alpha))
        if self.bound is not None:
            units += (Fraction(1, 2) if self.bound.rounded else 0) + self.bound.interval_error / self.grid
        exact = units * self.grid
        width = float(exact)
        return math.nextafter(width, math.inf) if width < exact else width

    @property
    def standard_deviation(self) -> float:
        """Standard deviation of the noise on one value, in value units."""
        if self.mechanism == "discrete_laplace":
            variance = discrete_laplace_variance(self.scale)
        else:
            variance = discrete_gaussian_variance(self.scale)
        return math.sqrt(variance) * float(self.grid)

    def draw(self, size: int | None = None) -> np.ndarray:
        """Draw ``size`` (default: ``partitions``) independent noise integers, in grid units, from the step's
        ``sampler``: discrete Laplace of scale t or discrete Gaussian of sigma^2 (``scale``), exactly.

        Returns:
            shape (size,) array, dtype int64; dtype object (Python ints) when a value does not fit in int64 (huge
            scales only: the ``vectorised`` and ``scalar`` samplers).

        Raises:
            ValueError: an unknown ``sampler``, or a bad size. ImportError: ``opendp`` without opendp installed
            (:func:`plan_release` refuses that before any budget is spent).
        """
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.sampler!r}: use one of {', '.join(SAMPLERS)}")
        size = self.partitions if size is None else size
        if type(size) is int and size == 0:  # no key selected: nothing to draw (the array samplers need size >= 1)
            return np.empty(0, dtype=np.int64)
        laplace = self.mechanism == "discrete_laplace"
        if self.sampler == "vectorised":
            sample = sample_discrete_laplace_array if laplace else sample_discrete_gaussian_array
            return sample(self.scale, size)
        if self.sampler == "scalar":
            sample = sample_discrete_laplace_vector if laplace else sample_discrete_gaussian_vector
            return _integer_array(sample(self.scale, size))
        sample = sample_discrete_laplace_opendp if laplace else sample_discrete_gaussian_opendp
        return sample(self.scale, size)

    @property
    def opendp_scale(self) -> float:
        """The float scale OpenDP draws with (Laplace b, Gaussian sigma; grid units): the smallest float >= the
        exact one (:mod:`dp_operators.mechanisms.opendp_samplers`)."""
        if self.mechanism == "discrete_laplace":
            return opendp_laplace_scale(self.scale)
        return opendp_gaussian_scale(self.scale)

    def describe(self) -> dict[str, Any]:
        """A JSON-safe description recorded in the ledger and published: enough to re-derive the guarantee."""
        grid = float(self.grid)
        described: dict[str, Any] = {
            "aggregate": self.aggregate,
            "component": self.component,
            "mechanism": self.mechanism,
            "calibrated_to": {
                name: float(getattr(self.budget, name))
                for name in ("epsilon", "rho", "delta")
                if getattr(self.budget, name) is not None
            },
            "l1_sensitivity": self.l1_sensitivity * grid,
            "l2_sensitivity": math.sqrt(self.l2_sensitivity_squared) * grid,
            "linf_grid_units": self.linf,
            "max_partitions_contributed": self.l0,
            "grid": grid,
            "partitions": self.partitions,
            "sampler": self.sampler,
        }
        if self.sampler == "opendp":  # the float scale OpenDP drew with, >= the exact one below (docs/adr/0022)
            described["opendp_scale_grid_units"] = self.opendp_scale
        if self.declared_l0 is not None and self.declared_l0 != self.l0:
            described["max_partitions_contributed_declared"] = self.declared_l0
        if self.bound is not None and self.bound.rounded:
            bound = self.bound
            upstream: dict[str, Any] = {"arithmetic": bound.arithmetic, "max_rows": bound.max_rows}
            if bound.arithmetic == "binary64":
                upstream.update(
                    summation_error=float(bound.summation_error),
                    summation_error_exact=str(bound.summation_error),
                    linf_allowance_grid_units=bound.float_allowance,
                )
                # partitions the privacy unit does not touch still move by their summation order: L1 and L2 above
                # include untouched_partitions of them, each by up to this many grid units (docs/adr/0017)
                described["untouched_partition_allowance_grid_units"] = self.untouched_allowance
                described["untouched_partitions"] = self.untouched_partitions
            described["upstream"] = upstream
            # what the published half-width adds to the noise's: half a grid step, and the float error bound
            described["half_width_allowance"] = float(Fraction(1, 2) * bound.grid + bound.interval_error)
        if self.mechanism == "discrete_laplace":
            described.update(scale=float(self.scale) * grid, scale_grid_units_exact=str(self.scale))
            described["epsilon"], described["epsilon_exact"] = float(self.epsilon), str(self.epsilon)
        else:
            described.update(
                sigma=math.sqrt(self.scale) * grid,
                sigma2_grid_units_exact=str(self.scale),
                rho=float(self.rho),
                rho_exact=str(self.rho),
            )
            if self.epsilon is not None:
                described["epsilon"], described["epsilon_exact"] = float(self.epsilon), str(self.epsilon)
        if self.delta:
            described["delta"], described["delta_exact"] = float(self.delta), str(self.delta)
        if self.threshold is not None:
            described["threshold"] = self.threshold
        return described


def _integer_array(values: list[int]) -> np.ndarray:
    """``values`` as an int64 array, or an object array of the same Python ints when one does not fit in int64."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


@dataclass(frozen=True)
class ReleasePlan:
    """The public plan of a release: every noised sub-step. Computed without touching data.

    ``accountant`` is the accountant the plan was made for (``auto`` chose by the cost on it), or None when the
    plan compares mechanisms at the written budget (:func:`plan_release`).
    """

    spec: ReleaseSpec
    steps: tuple[NoiseStep, ...]
    accountant: str | None = None

    def _accountant(self, accountant: str | None) -> str:
        accountant = accountant or self.accountant
        if accountant is None:
            raise ValueError("say which accountant to charge: this plan was made without one")
        return accountant

    def losses(self, accountant: str | None = None) -> list[PrivacyLoss]:
        """Every step's privacy loss, as charged to an ``accountant`` account (default: the plan's)."""
        accountant = self._accountant(accountant)
        return [step.privacy_loss(accountant) for step in self.steps]

    def charge(self, accountant: str | None = None) -> Fraction:
        """The exact total charge in ``accountant``'s unit (default: the plan's accountant): the sum of every step's
        converted loss (composition).

        Raises:
            IncompatibleAccountantError: a step cannot be charged to this accountant.
            ValueError: no accountant given and the plan was made without one.
        """
        accountant = self._accountant(accountant)
        total = Fraction(0)
        for step, loss in zip(self.steps, self.losses(accountant)):
            try:
                total += charge_in_account_unit(loss, accountant)
            except IncompatibleAccountantError as error:
                raise IncompatibleAccountantError(
                    f"aggregate {step.aggregate!r} ({step.component}, {step.mechanism}): {error}"
                ) from None
        return total

    def delta(self, accountant: str | None = None) -> Fraction:
        """The total delta an ``approx_dp`` account is charged (basic composition); 0 for other accountants."""
        accountant = self._accountant(accountant)
        return sum((delta_in_account(loss, accountant) for loss in self.losses(accountant)), Fraction(0))

    def step(self, aggregate: str, component: str) -> NoiseStep:
        return next(s for s in self.steps if s.aggregate == aggregate and s.component == component)

    def steps_of(self, aggregate: str) -> list[NoiseStep]:
        return [s for s in self.steps if s.aggregate == aggregate]


#: the typed value of each budget field
_BUDGET_TYPES = {"epsilon": Epsilon, "rho": Rho, "delta": Delta}


def _share(budget: Budget, parts: int) -> Budget:
    """An equal share of ``budget`` for one of ``parts`` components (basic / zCDP composition), typed as the
    budget's fields are (a share of a value in its range stays in it)."""
    if parts == 1:
        return budget
    values = {
        name: kind(getattr(budget, name) / parts) for name, kind in _BUDGET_TYPES.items() if getattr(budget, name)
    }
    return Budget.model_construct(**values)


@dataclass(frozen=True)
class _Calibration:
    """One candidate mechanism with its scale, the budget it is calibrated to, and its noise profile's delta."""

    mechanism: str
    scale: NoiseScale
    budget: Budget
    noise_delta: Fraction = Fraction(0)

    @property
    def variance(self) -> float:
        if self.mechanism == "discrete_laplace":
            return discrete_laplace_variance(self.scale)
        return discrete_gaussian_variance(self.scale)

    def cost(self, accountant: str, shift: Shift) -> Fraction | None:
        """The charge on an ``accountant`` account, as the plan would charge it; None if it cannot be charged."""
        step = NoiseStep("", "", self.mechanism, self.budget, shift.linf, shift.l0, self.scale, Fraction(1), None,
                         self.noise_delta, untouched_allowance=shift.untouched_allowance,
                         untouched_partitions=shift.untouched_partitions)
        try:
            return charge_in_account_unit(step.privacy_loss(accountant), accountant)
        except IncompatibleAccountantError:
            return None


def _laplace(budget: Budget, epsilon: Epsilon, shift: Shift) -> _Calibration:
    return _Calibration("discrete_laplace", discrete_laplace_scale(Sensitivity(shift.l1), epsilon), budget)


def _candidates(mechanism: str, budget: Budget, shift: Shift) -> list[_Calibration]:
    """Every mechanism ``mechanism`` allows for ``budget``, each at its smallest valid scale (the written budget)."""
    candidates: list[_Calibration] = []
    if mechanism in ("discrete_laplace", "auto"):
        epsilon = budget.epsilon if budget.form != "rho" else epsilon_for_rho(budget.rho)
        candidates.append(_laplace(budget, epsilon, shift))
    if mechanism in ("discrete_gaussian", "auto") and budget.form != "epsilon":
        if budget.form == "rho":
            sigma2 = discrete_gaussian_sigma2(Sensitivity(shift.l2_squared), budget.rho)
            candidates.append(_Calibration("discrete_gaussian", sigma2, budget))
        else:
            sigma2 = discrete_gaussian_sigma2_for_shift(budget.epsilon, budget.delta, shift)
            candidates.append(_Calibration("discrete_gaussian", sigma2, budget, budget.delta))
    return candidates


#: (accountant, budget form) pairs where the budget is written in the account's own privacy notion, so every
#: candidate calibrated to it costs at most the written amount
_WRITTEN_IN_ACCOUNT_UNIT = {("pure_dp", "epsilon"), ("approx_dp", "epsilon"), ("approx_dp", "epsilon_delta"),
                            ("zcdp", "rho")}
_RECALIBRATION_STEPS = 100


def _within_written(sigma2: NoiseScale, rho: Fraction, written: Budget, shift: Shift) -> bool:
    """True when discrete Gaussian noise of variance parameter ``sigma2`` (rho-zCDP) still meets the written
    ``{epsilon, delta}`` budget: by the CKS 2020 Cor. 13 conversion of rho, else by the exact privacy profile
    (CKS 2020 Thm 7; more noise is not always a smaller delta for sigma below about 1, so it is checked), of the
    dominating equal shifts for a heterogeneous ``shift`` (:func:`discrete_gaussian_shift_delta`)."""
    if written.form != "epsilon_delta":
        return True
    if rho_to_epsilon(Rho(rho), written.delta) <= written.epsilon:
        return True
    return discrete_gaussian_shift_delta(sigma2, written.epsilon, shift) <= written.delta


def _at_cost(candidate: _Calibration, cap: Fraction, accountant: str, shift: Shift) -> _Calibration | None:
    """``candidate`` recalibrated to cost at most ``cap`` on a rho (zCDP) account and still within its written
    budget; None where that is not possible.

    A Gaussian gets sigma^2 = L2^2 / (2 cap) (CKS 2020, Thm 14), kept only if it still meets the written
    ``{epsilon, delta}`` (:func:`_within_written`); a Laplace the largest epsilon whose charge fits
    (:func:`~dp_operators.mechanisms.calibration.epsilon_for_rho`, checked against the charge the account
    computes, :func:`~dp_operators.accounting.charge_in_account_unit`), below the written epsilon since its
    written cost exceeded the cap.
    """
    if unit_of(accountant) != "rho":
        return None
    rho = Rho(cap)
    if candidate.mechanism == "discrete_gaussian":
        sigma2 = discrete_gaussian_sigma2(Sensitivity(shift.l2_squared), rho)
        if not _within_written(sigma2, rho, candidate.budget, shift):
            return None
        return _Calibration("discrete_gaussian", sigma2, Budget.model_construct(rho=rho))
    try:
        epsilon = epsilon_for_rho(rho)
    except ValueError:  # a cap below the ledger's resolution: no Laplace fits it
        return None
    for _ in range(_RECALIBRATION_STEPS):  # the charge rounds up; step below it if that crosses the cap
        recalibrated = _laplace(Budget.model_construct(epsilon=epsilon), epsilon, shift)
        cost = recalibrated.cost(accountant, shift)
        if cost is not None and cost <= cap:
            return recalibrated
        epsilon = Epsilon(epsilon * (1 - Fraction(1, 10**12)))
    return None


def _choose(mechanism: str, budget: Budget, shift: Shift, accountant: str | None) -> _Calibration:
    """The mechanism, scale and budget of one noised component (see :func:`calibrate` for the rule)."""
    candidates = _candidates(mechanism, budget, shift)
    if len(candidates) == 1 or accountant is None:
        return min(candidates, key=lambda c: c.variance)
    costs = [(candidate, candidate.cost(accountant, shift)) for candidate in candidates]
    chargeable = [(candidate, cost) for candidate, cost in costs if cost is not None]
    if not chargeable:  # none fits the account: plan.charge refuses it with the accountant's own message
        return min(candidates, key=lambda c: c.variance)
    if (accountant, budget.form) in _WRITTEN_IN_ACCOUNT_UNIT:
        return min((candidate for candidate, _ in chargeable), key=lambda c: c.variance)
    cap = min(cost for _, cost in chargeable)
    at_equal_cost = [
        candidate if cost <= cap else _at_cost(candidate, cap, accountant, shift)
        for candidate, cost in chargeable
    ]
    return min((c for c in at_equal_cost if c is not None), key=lambda c: c.variance)


def calibrate(
    mechanism: str,
    budget: Budget,
    *,
    linf: int,
    l0: int,
    accountant: str | None = None,
    untouched_allowance: int = 0,
    untouched_partitions: int = 0,
) -> tuple[str, Fraction]:
    """Choose a mechanism and its smallest valid scale for ``budget`` on integers changed by at most ``linf`` in
    each of at most ``l0`` coordinates (and by at most ``untouched_allowance`` in each of ``untouched_partitions``
    others: :class:`Shift`). Returns ``(mechanism, scale)``: t for ``discrete_laplace``, sigma^2 for
    ``discrete_gaussian``, in grid units.

    * ``discrete_laplace``: t = L1 / epsilon (an ``{rho}`` budget under ``auto`` uses the largest epsilon whose
      zCDP charge fits rho, :func:`~dp_operators.mechanisms.calibration.epsilon_for_rho`);
    * ``discrete_gaussian``: sigma^2 = L2^2 / (2 rho), or the (epsilon, delta) calibration of
      :func:`discrete_gaussian_sigma2_for_shift` (the exact profile for equal shifts);
    * ``auto`` chooses by the cost on the account it will be charged to (``accountant``; docs/adr/0012):
      each candidate is calibrated to the written budget and its charge computed in the account's unit; candidates
      the account cannot be charged for are dropped. When the budget is written in the account's own notion
      (``{rho}`` on ``zcdp``, ``{epsilon}`` on ``pure_dp``, ``{epsilon}`` or ``{epsilon, delta}`` on
      ``approx_dp``) every candidate costs at most the written amount, and the smaller noise variance wins.
      Otherwise (``{epsilon, delta}`` on ``zcdp``) let C be the smallest charge: the others are recalibrated to
      cost at most C on that account while staying within the written budget, and the smallest noise variance
      at that equal cost wins. Without an ``accountant`` the candidates are compared at the written budget.
    """
    shift = Shift(linf, l0, untouched_allowance, untouched_partitions)
    chosen = _choose(mechanism, budget, shift, accountant)
    return chosen.mechanism, chosen.scale


def _selection_step(aggregate: Aggregate, l0: int) -> NoiseStep:
    """The partition-selection step: noised counts of privacy units (one per unit and partition, so linf = 1)."""
    selection = aggregate.partition_selection
    budget = selection.budget  # type: ignore[union-attr]
    noise_delta: Fraction = Fraction(0)
    if selection.mechanism == "discrete_laplace":  # type: ignore[union-attr]
        scale = discrete_laplace_scale(Sensitivity(l0), budget.epsilon)
        threshold, threshold_delta = discrete_laplace_threshold(scale, budget.delta, l0=l0)
    else:  # half the delta for the noise's profile, half for the threshold
        noise_delta = Delta(budget.delta / 2)
        scale = discrete_gaussian_sigma2_for_approx_dp(budget.epsilon, noise_delta, linf=1, l0=l0)
        threshold, threshold_delta = discrete_gaussian_threshold(scale, Delta(budget.delta - noise_delta), l0=l0)
    return NoiseStep(
        aggregate=aggregate.name,
        component="selection",
        mechanism=selection.mechanism,  # type: ignore[union-attr]
        budget=budget,
        linf=1,
        l0=l0,
        scale=scale,
        grid=Fraction(1),
        partitions=None,
        noise_delta=noise_delta,
        threshold=threshold,
        threshold_delta=threshold_delta,
    )


def _two_digits_up(value: Fraction) -> float:
    """``value`` (> 0) rounded up to two significant digits: advice a user can copy."""
    step = Fraction(10) ** (math.floor(math.log10(value)) - 1)
    return float(math.ceil(value / step) * step)


def check_noise_scale(aggregate: Aggregate, step: NoiseStep) -> None:
    """Refuse a step whose noise scale (the discrete Laplace t, or the discrete Gaussian sigma) exceeds the
    engine's value range of +-2^62 grid units (:data:`~dp_operators.release.inputs.SATURATION`): such
    noise cannot be represented, and every value it touches would be clamped. Public parameters only.

    The scale grows linearly with Linf (exactly for Laplace and rho-calibrated Gaussians; for ``{epsilon, delta}``
    Gaussians this large the calibration is the zCDP route, linear too), so the message gives the coarsest grid
    that fits where the component is rounded to a grid.

    Raises:
        ReleaseConfigError: naming the aggregate, the component, the scale and what to change.
    """
    scale_squared = step.scale if step.mechanism == "discrete_gaussian" else step.scale**2
    if scale_squared <= SATURATION**2:
        return
    name = "sigma" if step.mechanism == "discrete_gaussian" else "scale"
    scale = math.sqrt(scale_squared)
    units = "grid^2 units" if step.component == "sum_squares" else "grid units"
    advice = ["raise the budget", "lower max_partitions_contributed or max_contributions_per_partition"]
    bound = step.bound
    if bound is not None and bound.rounded:
        # Linf' <= Linf * 2^62 / scale keeps the scale in range; Linf' = ceil((Delta + 2E) / grid^k)
        largest_linf = math.floor(step.linf * SATURATION / Fraction(scale))
        if largest_linf >= 1:
            component_grid = (bound.sensitivity + 2 * bound.summation_error) / largest_linf
            grid = component_grid if step.component != "sum_squares" else Fraction(math.sqrt(component_grid))
            advice.insert(0, f"make grid at least {_two_digits_up(grid):g}")
        advice.append("narrow the bounds")
    if step.untouched_allowance and step.untouched_partitions:
        advice.append("return exact sums (binary64 sums carry an allowance in every partition, docs/adr/0017)")
    raise ReleaseConfigError(
        f"aggregate {aggregate.name!r} ({step.component}): its {step.mechanism} noise would have {name} "
        f"{scale:.3g} {units}, beyond the engine's value range of 2^62 (about 4.6e18) {units}: noise that large "
        f"cannot be represented. To fix it: {'; or '.join(advice)}"
    )


def check_sampler(spec: ReleaseSpec, steps: list[NoiseStep]) -> None:
    """Refuse, before any budget is reserved, a ``sampler: opendp`` spec whose noise OpenDP cannot draw as planned
    (docs/adr/0022). Public parameters only; nothing to check for the project's own samplers.

    * opendp must be installed (it is an optional extra);
    * each noise scale (Laplace b, Gaussian sigma) is at most 2^56 grid units, so OpenDP's int64 output does not
      saturate (:data:`~dp_operators.mechanisms.opendp_samplers.OPENDP_SCALE_LIMIT`);
    * OpenDP draws at the smallest float scale >= the planned one. A larger scale keeps every charge that is
      monotone in it (pure epsilon = L1/b, rho = L2^2/(2 sigma^2)); a threshold's delta grows with it by a relative
      2^-52 times at most 2 ln(L0/delta) <= 1400, inside the 1e-9 margin the threshold's delta is computed with
      (:func:`~dp_operators.mechanisms.calibration.discrete_laplace_threshold`). The exact (epsilon, delta)
      profile of a discrete Gaussian is not monotone in sigma for small sigma, so a step calibrated to it is
      checked again at OpenDP's sigma, as the calibration checks its own (:func:`_within_written`).

    Raises:
        ReleaseConfigError: naming the aggregate and component where one applies, and the fix.
    """
    if spec.sampler != "opendp":
        return
    from dp_operators.mechanisms.opendp_samplers import check_opendp_scale, load_opendp

    try:
        load_opendp()
    except ImportError as error:
        raise ReleaseConfigError(str(error)) from None
    for step in steps:
        if not isinstance(step, NoiseStep):  # a quantile's: the project's exact exponential sampler or CDF noise
            continue
        where = f"aggregate {step.aggregate!r} ({step.component})"
        scale = step.opendp_scale
        try:
            check_opendp_scale(scale)
        except ValueError as error:
            raise ReleaseConfigError(f"{where}: sampler 'opendp': {error}") from None
        if step.mechanism != "discrete_gaussian" or not step.noise_delta:
            continue
        sigma2 = NoiseScale(Fraction(scale) ** 2, name="sigma2")
        rho = Fraction(step.l2_sensitivity_squared) / (2 * sigma2)
        written = Budget.model_construct(epsilon=step.budget.epsilon, delta=step.noise_delta)
        if not _within_written(sigma2, rho, written, step.shift):
            raise ReleaseConfigError(
                f"{where}: sampler 'opendp' draws with the float sigma {scale!r}, just above the planned "
                f"{math.sqrt(step.scale):.17g} grid units, and the discrete Gaussian's exact (epsilon, delta) profile "
                f"at that sigma exceeds (epsilon {float(step.budget.epsilon):g}, delta {float(step.noise_delta):g}) "
                "(it is not monotone in sigma for small sigma): use sampler: vectorised, or change the budget"
            )


def component_sensitivity(aggregate: Aggregate, component: str, per_partition: int) -> tuple[int, Fraction]:
    """``(linf, grid)`` of one component: the most one privacy unit changes one partition, in grid units.

    Rounding a partition's value to the grid with ``floor(x / grid + 1/2)`` maps values ``d`` apart to integers at
    most ``ceil(d / grid)`` apart, so the rounding is inside the sensitivity (DESIGN.md 2.5). Means and variances
    are computed on values centred at the middle of the bounds, which halves their range. Binary64 upstream sums
    add their summation error allowance (:func:`~dp_operators.release.float_sums.component_bound`).
    """
    bound = component_bound(aggregate, component, per_partition)
    return bound.linf, bound.grid


def partitions_contributed(aggregate: Aggregate, declared: int) -> int:
    """L0 for ``aggregate``: the declared ``max_partitions_contributed``, capped by the number of partitions when
    they are public (1 when not grouped; the size of the key domain otherwise). Under partition selection the
    partitions come from the data and the declared L0 stands."""
    if not aggregate.public_keys:
        return declared
    return min(declared, aggregate.partition_count)  # type: ignore[type-var]


def plan_release(spec: ReleaseSpec, accountant: str | None = None) -> ReleasePlan:
    """Compute the mechanisms, sensitivities, scales and losses of ``spec`` from public parameters only.

    Each aggregate's budget is split equally over its components (a mean: sum and count; a variance: sum, count
    and sum of squares), every one charged (DESIGN.md 2.7). Partition selection adds its own step and budget.
    Sensitivities follow DESIGN.md 2.6 (L1 = L0 * Linf, L2^2 = L0 * Linf^2), L0 capped by the number of public
    partitions (:func:`partitions_contributed`) and Linf from
    :func:`~dp_operators.release.float_sums.component_bound` (with the float allowance for binary64 sums). Binary64
    sums over P public partitions add the untouched partitions' allowance a = ceil(2E / grid):
    L1 += (P - L0) a, L2^2 += (P - L0) a^2 (:class:`Shift`; docs/adr/0017).

    Args:
        spec: the validated release spec.
        accountant: the accountant of the account the release will be charged to (``pure_dp``, ``approx_dp``,
            ``zcdp``, ``gaussian_dp``): ``auto`` chooses by the cost on it (:func:`calibrate`). None compares
            mechanisms at the written budget, which may cost more than needed on a zCDP account.

    Raises:
        ReleaseConfigError: a series spec (planned by :func:`dp_operators.continual.plan.plan_spec_series`,
            released step by step by :func:`dp_operators.continual.run.run_series_step`); a component the engine cannot release as planned: binary64 sums under partition
            selection (:func:`~dp_operators.release.float_sums.check_partition_selection`), binary64 sums whose
            float cannot carry the grid or whose error allowance exceeds the sensitivity, or values that can reach the
            saturation limit (:func:`~dp_operators.release.float_sums.check_component`), or noise whose scale
            exceeds that limit (:func:`check_noise_scale`), or ``sampler: opendp`` where OpenDP cannot draw the
            plan's noise (:func:`check_sampler`). Nothing is reserved.
        ValueError: an unknown accountant name.
    """
    if spec.series is not None:
        raise ReleaseConfigError(
            f"release {spec.release!r} is a series (series: horizon {spec.series.horizon}): it is released one step "
            "per run (DPReleaseOperator, dp_operators.continual.run.run_series_step), planned by "
            "dp_operators.continual.plan.plan_spec_series, not as one release"
        )
    if accountant is not None:
        unit_of(accountant)
    steps: list[NoiseStep] = []
    for aggregate in spec.aggregates:
        contribution = spec.contribution_for(aggregate)
        if aggregate.releases_quantiles:  # a histogram's quantiles: their own mechanisms (ADR 37)
            from dp_operators.release.quantiles import plan_quantiles

            if aggregate.partition_selection is not None:  # its groups, by their units (one per unit and group)
                steps.append(_selection_step(aggregate, contribution.max_partitions_contributed))
                check_noise_scale(aggregate, steps[-1])
            try:
                steps.append(plan_quantiles(aggregate, contribution, accountant, spec.confidence))  # type: ignore[arg-type]
            except ValueError as error:
                raise ReleaseConfigError(str(error)) from None
            continue
        declared_l0 = contribution.max_partitions_contributed
        l0 = partitions_contributed(aggregate, declared_l0)
        per_partition = contribution.max_contributions_per_partition
        check_partition_selection(aggregate)
        # partitions the privacy unit does not touch (public keys only: under partition selection binary64 is
        # refused above, and exact sums do not move where the unit is absent)
        untouched = aggregate.partition_count - l0 if aggregate.public_keys else 0  # type: ignore[operator]
        bounds = {c: component_bound(aggregate, c, per_partition) for c in aggregate.components}
        for bound in bounds.values():
            check_component(aggregate, bound, per_partition)
        if aggregate.partition_selection is not None:
            steps.append(_selection_step(aggregate, l0))
            check_noise_scale(aggregate, steps[-1])
        share = _share(aggregate.budget, len(aggregate.components))
        for component in aggregate.components:
            bound = bounds[component]
            shift = Shift(bound.linf, l0, bound.untouched_allowance, untouched)
            chosen = _choose(aggregate.mechanism, share, shift, accountant)
            steps.append(
                NoiseStep(
                    aggregate=aggregate.name,
                    component=component,
                    mechanism=chosen.mechanism,
                    budget=chosen.budget,
                    linf=bound.linf,
                    l0=l0,
                    scale=chosen.scale,
                    grid=bound.grid,
                    partitions=aggregate.partition_count,
                    noise_delta=chosen.noise_delta,
                    declared_l0=declared_l0,
                    bound=bound,
                    untouched_allowance=shift.untouched_allowance,
                    untouched_partitions=shift.untouched_partitions,
                )
            )
            check_noise_scale(aggregate, steps[-1])
    steps = [replace(step, sampler=spec.sampler) for step in steps]
    check_sampler(spec, steps)
    return ReleasePlan(spec=spec, steps=tuple(steps), accountant=accountant)
