"""Privacy-loss units, exact budget numbers and composition (no Airflow import).

An account has one accountant, fixed at creation. This first cut supports two:

* ``pure_dp`` — pure epsilon-DP, basic composition (epsilons add; Dwork & Roth 2014, Thm 3.16);
* ``zcdp`` — rho-zero-concentrated DP, composition by adding rho (Bun & Steinke 2016, Lemma 2.3). A pure
  epsilon-DP mechanism is charged ``epsilon**2 / 2`` (Bun & Steinke 2016, Prop. 1.4), and spend is reported as
  epsilon at the account's delta with the Canonne-Kamath-Steinke 2020 conversion.
"""

from __future__ import annotations

from dp_operators.accounting.budget import (
    MAX_DENOMINATOR,
    PrivacyLoss,
    exact_number,
    round_down,
    round_up,
)
from dp_operators.accounting.accountants import (
    ACCOUNTANTS,
    IncompatibleAccountantError,
    charge_in_account_unit,
    epsilon_at_delta,
    unit_of,
)

__all__ = [
    "ACCOUNTANTS",
    "MAX_DENOMINATOR",
    "IncompatibleAccountantError",
    "PrivacyLoss",
    "charge_in_account_unit",
    "epsilon_at_delta",
    "exact_number",
    "round_down",
    "round_up",
    "unit_of",
]
