"""Accountants: how a mechanism's privacy loss is charged to an account, and how spend is reported.

Sources: Bun & Steinke, "Concentrated Differential Privacy" (TCC 2016), Prop. 1.4 (epsilon-DP implies
(epsilon^2/2)-zCDP) and Lemma 2.3 (composition adds rho); Canonne, Kamath & Steinke, "The Discrete Gaussian for
Differential Privacy" (NeurIPS 2020), Prop. 12 / Cor. 13 (rho-zCDP to (epsilon, delta)-DP).
"""

from __future__ import annotations

from fractions import Fraction

from dp_operators.accounting.budget import PrivacyLoss, round_up

#: accountant name -> the unit its caps, charges and running totals are kept in
ACCOUNTANTS: dict[str, str] = {"pure_dp": "epsilon", "zcdp": "rho"}


class IncompatibleAccountantError(ValueError):
    """A mechanism's privacy loss cannot be expressed in the account's unit (e.g. a zCDP mechanism on a pure-DP
    account). A public-parameter refusal, raised before anything is reserved."""


def unit_of(accountant: str) -> str:
    """Return the unit (``"epsilon"`` or ``"rho"``) of ``accountant``.

    Raises:
        ValueError: unknown accountant name.
    """
    try:
        return ACCOUNTANTS[accountant]
    except KeyError:
        raise ValueError(f"unknown accountant {accountant!r}; expected one of {sorted(ACCOUNTANTS)}") from None


def charge_in_account_unit(loss: PrivacyLoss, accountant: str) -> Fraction:
    """Convert one mechanism's privacy loss to the account's unit, exactly, rounded up.

    Raises:
        IncompatibleAccountantError: a rho-zCDP loss on a ``pure_dp`` account (zCDP does not imply pure DP).
    """
    unit = unit_of(accountant)
    if loss.unit == unit:
        return round_up(loss.amount)
    if loss.unit == "epsilon" and unit == "rho":
        return round_up(loss.amount**2 / 2)
    raise IncompatibleAccountantError(
        f"a mechanism with a {loss.unit} guarantee cannot be charged to a {accountant!r} account "
        f"(its unit is {unit}); use a discrete_laplace mechanism with an epsilon budget, "
        "or an account whose accountant is 'zcdp'"
    )


def epsilon_at_delta(amount: Fraction, accountant: str, delta: Fraction | None) -> float | None:
    """Report a spend in the account's unit as epsilon (at the account's delta for zCDP).

    Returns the epsilon itself for ``pure_dp``; for ``zcdp`` the Canonne-Kamath-Steinke 2020 conversion at
    ``delta`` (``None`` when no delta is configured or ``amount`` is 0, where the conversion is 0).
    """
    if unit_of(accountant) == "epsilon":
        return float(amount)
    if delta is None:
        return None
    if amount == 0:
        return 0.0
    from dp_operators.mechanisms.calibration import rho_to_epsilon

    return rho_to_epsilon(amount, delta)
