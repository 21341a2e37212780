"""Noise mechanisms: exact integer samplers, calibration (scale <-> budget) and accuracy (interval half-widths).

Samplers (docs/adr/0022): ``sample_*_array`` (vectorised inverse CDF, the default noise source of releases),
``sample_*_vector`` and ``sample_discrete_*`` (CKS 2020 rejection, scalar), ``sample_*_opendp`` (OpenDP's, the
reference; opendp is imported only when they are called).

Pure Python (no Airflow import). Sources: Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020); Bun & Steinke, "Concentrated Differential Privacy" (TCC 2016).
"""

from __future__ import annotations

from dp_operators.mechanisms.accuracy import (
    discrete_gaussian_accuracy,
    discrete_gaussian_pmf,
    discrete_gaussian_upper_tail,
    discrete_gaussian_variance,
    discrete_laplace_accuracy,
    discrete_laplace_pmf,
    discrete_laplace_variance,
    gaussian_accuracy,
    laplace_accuracy,
)
from dp_operators.mechanisms.calibration import (
    discrete_gaussian_sigma2,
    discrete_gaussian_sigma2_for_approx_dp,
    discrete_gaussian_threshold,
    discrete_laplace_scale,
    discrete_laplace_threshold,
    epsilon_for_discrete_gaussian_accuracy,
    epsilon_for_discrete_laplace_accuracy,
    epsilon_for_rho,
    rho_for_discrete_gaussian_accuracy,
    pure_epsilon_to_rho,
    rho_for_approx_dp,
    rho_to_epsilon,
)
from dp_operators.mechanisms.opendp_samplers import (
    opendp_gaussian_scale,
    opendp_laplace_scale,
    sample_discrete_gaussian_opendp,
    sample_discrete_laplace_opendp,
)
from dp_operators.mechanisms.privacy_profile import (
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
    discrete_gaussian_delta,
)
from dp_operators.mechanisms.samplers import (
    sample_discrete_gaussian,
    sample_discrete_gaussian_vector,
    sample_discrete_laplace,
    sample_discrete_laplace_vector,
)
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array, sample_discrete_laplace_array

__all__ = [
    "analytic_gaussian_delta",
    "analytic_gaussian_sigma",
    "discrete_gaussian_accuracy",
    "discrete_gaussian_delta",
    "discrete_gaussian_pmf",
    "discrete_gaussian_sigma2",
    "discrete_gaussian_sigma2_for_approx_dp",
    "discrete_gaussian_threshold",
    "discrete_gaussian_upper_tail",
    "discrete_gaussian_variance",
    "discrete_laplace_accuracy",
    "discrete_laplace_pmf",
    "discrete_laplace_scale",
    "discrete_laplace_threshold",
    "discrete_laplace_variance",
    "epsilon_for_discrete_gaussian_accuracy",
    "epsilon_for_discrete_laplace_accuracy",
    "epsilon_for_rho",
    "gaussian_accuracy",
    "laplace_accuracy",
    "opendp_gaussian_scale",
    "opendp_laplace_scale",
    "pure_epsilon_to_rho",
    "rho_for_approx_dp",
    "rho_for_discrete_gaussian_accuracy",
    "rho_to_epsilon",
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_array",
    "sample_discrete_gaussian_opendp",
    "sample_discrete_gaussian_vector",
    "sample_discrete_laplace",
    "sample_discrete_laplace_array",
    "sample_discrete_laplace_opendp",
    "sample_discrete_laplace_vector",
]
