"""Privacy-loss units, exact budget numbers and composition (no Airflow import).

An account has one accountant, fixed at creation:

* ``pure_dp`` — pure epsilon-DP, basic composition (epsilons add; Dwork & Roth 2014, Thm 3.16);
* ``approx_dp`` — (epsilon, delta)-DP, basic composition (epsilons add, deltas add);
* ``zcdp`` — rho-zero-concentrated DP, composition by adding rho (Bun & Steinke 2016, Lemma 2.3). A pure
  epsilon-DP mechanism is charged ``epsilon * tanh(epsilon / 2)`` rounded up, the tight conversion through
  randomized response (:mod:`dp_operators.accounting.conversions`; below Bun & Steinke's ``epsilon**2 / 2``), or a
  discrete Laplace its own smaller Rényi bound for its integer shifts
  (:mod:`dp_operators.accounting.discrete_laplace_renyi`), and
  spend is reported as epsilon at the account's delta with the Canonne-Kamath-Steinke 2020 conversion;
* ``gaussian_dp`` — mu-Gaussian DP for Gaussian-only accounts, composition by adding mu^2 (Dong, Roth & Su 2019),
  reported as epsilon at the account's delta with their exact conversion.

See :mod:`dp_operators.accounting.accountants` for what each accepts. Budget numbers are read once, where they enter
the project, into the typed values of :mod:`dp_operators.accounting.values` (:class:`Epsilon`, :class:`Rho`,
:class:`Delta`, ...; docs/adr/0028).
"""

from __future__ import annotations

from dp_operators.accounting.budget import (
    MAX_DENOMINATOR,
    DiscreteLaplaceNoise,
    GaussianNoise,
    PrivacyLoss,
    exact_number,
    round_down,
    round_up,
)
from dp_operators.accounting.accountants import (
    ACCOUNTANTS,
    Charge,
    IncompatibleAccountantError,
    account_charge,
    charge_in_account_unit,
    delta_in_account,
    epsilon_at_delta,
    unit_of,
)
from dp_operators.accounting.conversions import bounded_range_rho, largest_epsilon_within_rho, pure_epsilon_to_rho
from dp_operators.accounting.discrete_laplace_renyi import discrete_laplace_rho
from dp_operators.accounting.gaussian_dp import gdp_delta, gdp_epsilon, gdp_mu_squared_for_approx_dp
from dp_operators.accounting.values import Delta, Epsilon, Grid, NoiseScale, PositiveRational, Rho, Sensitivity

__all__ = [
    "ACCOUNTANTS",
    "MAX_DENOMINATOR",
    "Charge",
    "Delta",
    "DiscreteLaplaceNoise",
    "Epsilon",
    "GaussianNoise",
    "Grid",
    "IncompatibleAccountantError",
    "PrivacyLoss",
    "account_charge",
    "charge_in_account_unit",
    "delta_in_account",
    "discrete_laplace_rho",
    "epsilon_at_delta",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu_squared_for_approx_dp",
    "largest_epsilon_within_rho",
    "NoiseScale",
    "PositiveRational",
    "pure_epsilon_to_rho",
    "bounded_range_rho",
    "exact_number",
    "Rho",
    "round_down",
    "round_up",
    "Sensitivity",
    "unit_of",
]
