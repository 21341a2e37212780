"""Accountants: how a mechanism's privacy loss is charged to an account, and how spend is reported.

| accountant    | unit of cap, charges, totals | composition                          | reported as epsilon at delta      |
|---------------|------------------------------|--------------------------------------|-----------------------------------|
| ``pure_dp``   | epsilon                      | epsilons add (basic)                 | the epsilon itself                |
| ``approx_dp`` | epsilon, plus a delta total  | epsilons add, deltas add (basic)     | the epsilon (at the spent delta)  |
| ``zcdp``      | rho                          | rhos add                             | Canonne-Kamath-Steinke 2020       |
| ``gaussian_dp``| mu^2 (``mu_squared``)       | mu^2 add (exact for Gaussians)       | Dong-Roth-Su 2019, exact          |

What each accountant accepts (anything else raises :class:`IncompatibleAccountantError` before reserving):

* ``pure_dp``: pure epsilon losses.
* ``approx_dp``: epsilon losses as (epsilon, delta) with their own delta (pure ones as (epsilon, 0)); rho losses that
  name a conversion delta, as (epsilon_CKS(rho, delta), delta) with epsilon rounded up.
* ``zcdp``: rho losses; pure epsilon losses as epsilon * tanh(epsilon / 2), the tight conversion (sup over alpha of
  the Rényi divergence of randomized response over alpha; :mod:`dp_operators.accounting.conversions`, never above
  Bun & Steinke's epsilon^2 / 2), or, for a discrete Laplace loss that carries its scale and integer shifts
  (:class:`~dp_operators.accounting.budget.DiscreteLaplaceNoise`), the mechanism's own sup over alpha when certified and smaller
  (:mod:`dp_operators.accounting.discrete_laplace_renyi`; docs/adr/0015). Approximate (epsilon, delta > 0) losses
  are refused: they do not imply zCDP.
* ``gaussian_dp``: Gaussian mechanisms only (a loss carrying :class:`GaussianNoise`), charged mu^2 =
  Delta_2^2 / sigma^2 exactly. Laplace and other non-Gaussian mechanisms are refused: a pure epsilon-DP mechanism
  is only (epsilon-dependent) f-DP, and mixing it in would make the account's mu^2 total meaningless.

Sources: Bun & Steinke, "Concentrated Differential Privacy" (TCC 2016), Def. 1.1, Lemma 2.3; the pure-DP conversion
and its sources in :mod:`dp_operators.accounting.conversions` (docs/adr/0015); Canonne, Kamath &
Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020), Cor. 13 and Thm 14; Dong, Roth & Su,
"Gaussian Differential Privacy" (2019), Thm 2.7, Cor. 2.13, Cor. 3.3; Dwork & Roth 2014, Thm 3.16 (basic
composition).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from dp_operators.accounting.budget import PrivacyLoss, round_up
from dp_operators.accounting.conversions import bounded_range_rho, pure_epsilon_to_rho
from dp_operators.accounting.discrete_laplace_renyi import discrete_laplace_rho
from dp_operators.accounting.values import Delta, Rho

#: accountant name -> the unit its caps, charges and running totals are kept in
ACCOUNTANTS: dict[str, str] = {
    "pure_dp": "epsilon",
    "approx_dp": "epsilon",
    "zcdp": "rho",
    "gaussian_dp": "mu_squared",
}


class IncompatibleAccountantError(ValueError):
    """A mechanism's privacy loss cannot be expressed in the account's unit (e.g. a zCDP mechanism on a pure-DP
    account, or a Laplace mechanism on a Gaussian-DP account). A public-parameter refusal, raised before anything
    is reserved."""


@dataclass(frozen=True)
class Charge:
    """What a release costs an account: ``amount`` in the account's unit and, for ``approx_dp``, a ``delta``."""

    amount: Fraction
    delta: Fraction = Fraction(0)


def unit_of(accountant: str) -> str:
    """Return the unit (``"epsilon"``, ``"rho"`` or ``"mu_squared"``) of ``accountant``.

    Raises:
        ValueError: unknown accountant name.
    """
    try:
        return ACCOUNTANTS[accountant]
    except KeyError:
        raise ValueError(f"unknown accountant {accountant!r}; expected one of {sorted(ACCOUNTANTS)}") from None


def charge_in_account_unit(loss: PrivacyLoss, accountant: str) -> Fraction:
    """Convert one mechanism's privacy loss to the account's unit, exactly (or rounded up where irrational).

    For ``approx_dp`` this is the epsilon part; :func:`delta_in_account` gives the delta part, and
    :func:`account_charge` both at once.

    Raises:
        IncompatibleAccountantError: the loss has no valid expression in the account's unit (see module docstring).
    """
    unit = unit_of(accountant)
    if accountant == "gaussian_dp":
        if loss.gaussian is None:
            raise IncompatibleAccountantError(
                f"a gaussian_dp account composes Gaussian mechanisms only (charged mu^2 = Delta^2 / sigma^2); "
                f"this mechanism has a {_describe(loss)} guarantee without Gaussian noise parameters. Use a "
                "discrete_gaussian mechanism, or an account whose accountant is 'zcdp' or 'approx_dp'"
            )
        if loss.gaussian.discrete:
            raise IncompatibleAccountantError(
                "a gaussian_dp account cannot be charged a discrete Gaussian: mu = Delta / sigma is exact for "
                "continuous Gaussian noise only, and the discrete Gaussian's privacy profile is slightly worse "
                "(docs/adr/0005). Charge discrete_gaussian releases to an account whose accountant is 'zcdp' "
                "(exact for the discrete Gaussian, CKS 2020 Thm 14) or 'approx_dp'"
            )
        return round_up(loss.gaussian.mu_squared)
    if accountant == "approx_dp":
        if loss.unit == "epsilon":
            return round_up(loss.amount)
        if loss.delta == 0:
            raise IncompatibleAccountantError(
                "a rho-zCDP mechanism needs a delta to be charged to an approx_dp account; give its budget as "
                "{epsilon, delta}, or use an account whose accountant is 'zcdp'"
            )
        from dp_operators.mechanisms.calibration import rho_to_epsilon

        return round_up(Fraction(rho_to_epsilon(Rho.of(loss.amount), Delta.of(loss.delta))))
    if loss.unit == "epsilon" and loss.delta > 0:
        raise IncompatibleAccountantError(
            f"an approximate ({_describe(loss)}) guarantee cannot be charged to a {accountant!r} account: it implies "
            "neither pure DP nor zCDP. Use an account whose accountant is 'approx_dp'"
        )
    if loss.unit == unit:
        return round_up(loss.amount)
    if loss.unit == "epsilon" and unit == "rho":
        if loss.bounded_range:  # epsilon-BR is epsilon^2/8-zCDP (Cesar & Rogers 2021), below epsilon tanh(epsilon/2)
            charge = round_up(bounded_range_rho(loss.amount))
        else:
            charge = pure_epsilon_to_rho(loss.amount)  # already rounded up to the ledger's resolution
        if loss.laplace is not None:  # the discrete Laplace's own bound for its integer shifts, where certified
            own = discrete_laplace_rho(loss.laplace.scale, loss.laplace.shifts)
            if own is not None and own < charge:
                charge = own
        return charge
    raise IncompatibleAccountantError(
        f"a mechanism with a {loss.unit} guarantee cannot be charged to a {accountant!r} account "
        f"(its unit is {unit}); use a discrete_laplace mechanism with an epsilon budget, "
        "or an account whose accountant is 'zcdp'"
    )


def delta_in_account(loss: PrivacyLoss, accountant: str) -> Fraction:
    """The delta one loss adds to an ``approx_dp`` account (0 for every other accountant)."""
    return loss.delta if accountant == "approx_dp" else Fraction(0)


def account_charge(losses: Iterable[PrivacyLoss], accountant: str) -> Charge:
    """The composed charge of a release's mechanisms on an ``accountant`` account: the sum of every loss in the
    account's unit (each rounded up), and for ``approx_dp`` the sum of the deltas (basic composition).

    Raises:
        IncompatibleAccountantError: one loss cannot be charged to this accountant (before anything is reserved).
    """
    amount, delta = Fraction(0), Fraction(0)
    for loss in losses:
        amount += charge_in_account_unit(loss, accountant)
        delta += delta_in_account(loss, accountant)
    return Charge(amount=amount, delta=delta)


def epsilon_at_delta(amount: Fraction, accountant: str, delta: Fraction | None) -> float | None:
    """Report a spend in the account's unit as epsilon (at the account's delta for zCDP and Gaussian DP).

    Returns the epsilon itself for ``pure_dp`` and ``approx_dp``; for ``zcdp`` the Canonne-Kamath-Steinke 2020
    conversion at ``delta``; for ``gaussian_dp`` the Dong-Roth-Su conversion of mu = sqrt(amount) at ``delta``.
    ``None`` when no delta is configured; 0 when ``amount`` is 0. Conversions are rounded up.
    """
    if unit_of(accountant) == "epsilon":
        return float(amount)
    if delta is None:
        return None
    if amount == 0:
        return 0.0
    if accountant == "gaussian_dp":
        from dp_operators.accounting.gaussian_dp import gdp_epsilon

        return gdp_epsilon(amount, delta)
    from dp_operators.mechanisms.calibration import rho_to_epsilon

    return rho_to_epsilon(Rho.of(amount, "amount"), Delta.of(delta))


def _describe(loss: PrivacyLoss) -> str:
    if loss.unit == "epsilon":
        return f"epsilon={float(loss.amount):g}" + (f", delta={float(loss.delta):g}" if loss.delta else "")
    return f"rho={float(loss.amount):g}"
