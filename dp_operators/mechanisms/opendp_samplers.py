"""OpenDP's exact samplers as a noise source: the reference the project's own samplers are compared with.

A spec selects them with ``sampler: opendp`` (docs/adr/0022). The noise is drawn by OpenDP's ``make_laplace`` and
``make_gaussian`` on ``vector_domain(atom_domain(T="i64"))``: on integers these are the exact discrete Laplace and
discrete Gaussian samplers of Canonne, Kamath, Steinke 2020 on bignum rationals (OpenDP's proofs,
``rust/src/measurements/noise``), fed by OpenDP's own CSPRNG.

Scale. OpenDP takes the scale as a binary64 float and converts that float to a rational exactly. The plan's scale is
an exact rational (Laplace t/s) or an exact sigma^2 whose square root is usually irrational, so this module hands
OpenDP the smallest float that is >= the exact value (Laplace: b; Gaussian: sigma with sigma^2 >= sigma2): the noise
is at most one unit in the last place (a relative 2^-52) wider than planned. The charges that are monotone in the
scale stay valid (pure epsilon = L1/b and rho = L2^2/(2 sigma^2) only fall); the two that are not (a partition
selection threshold's delta, and the discrete Gaussian's exact (epsilon, delta) profile at small sigma) are covered
by :func:`dp_operators.release.plan.check_sampler` (docs/adr/0022).

Range. OpenDP returns ``i64`` and *saturates* a draw beyond it (``then_saturating_cast``). A saturated noise value
would not have the stated law, so scales above :data:`OPENDP_SCALE_LIMIT` (2^56 grid units: the chance that one
draw reaches 2^63 is below exp(-128) for the Laplace, far less for the Gaussian) are refused, and a saturated value,
should one appear anyway, raises instead of being returned.

opendp is an optional dependency (``pip install 'opendp>=0.12'``), imported only when this route is used.
It needs OpenDP's ``contrib`` feature, which :func:`load_opendp` enables for the process.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

from dp_operators.mechanisms._rational import as_positive_rational

__all__ = [
    "OPENDP_INSTALL_HINT",
    "OPENDP_SCALE_LIMIT",
    "check_opendp_scale",
    "load_opendp",
    "opendp_gaussian_scale",
    "opendp_laplace_scale",
    "sample_discrete_gaussian_opendp",
    "sample_discrete_laplace_opendp",
]

#: What to run when opendp is missing.
OPENDP_INSTALL_HINT = "pip install 'opendp>=0.12'"
#: The largest noise scale (Laplace b, Gaussian sigma) in grid units drawn through OpenDP's i64 output.
OPENDP_SCALE_LIMIT = Fraction(1 << 56)
_CHUNK = 1 << 20  # draws per OpenDP call: bounds the Python lists OpenDP takes and returns
_I64 = np.iinfo(np.int64)


def load_opendp() -> ModuleType:
    """Import ``opendp.prelude`` and enable its ``contrib`` feature (needed by ``make_laplace``/``make_gaussian`` on
    integer vectors). Returns the prelude module.

    Raises:
        ImportError: opendp is not installed; the message says how to install it.
    """
    try:
        import opendp.prelude as dp
    except ImportError as error:
        raise ImportError(
            f"sampler 'opendp' needs the opendp package, which is not installed: {OPENDP_INSTALL_HINT} (or choose "
            "sampler: vectorised, the default)"
        ) from error
    dp.enable_features("contrib")
    return dp


def _smallest_float_at_least(value: Fraction) -> float:
    """The smallest binary64 float f with Fraction(f) >= value (value > 0, below the float range)."""
    f = float(value)  # correctly rounded: within half an ulp, on either side
    if Fraction(f) < value:
        f = math.nextafter(f, math.inf)
    return f


def opendp_laplace_scale(scale: Fraction | int) -> float:
    """The float Laplace scale handed to OpenDP for the exact scale t/s: the smallest float b with b >= t/s.

    Raises ValueError for a scale that is not a positive finite rational.
    """
    return _smallest_float_at_least(as_positive_rational(scale, "scale"))


def opendp_gaussian_scale(sigma2: Fraction | int) -> float:
    """The float sigma handed to OpenDP for the exact sigma^2: the smallest float sigma with sigma^2 >= sigma2, checked
    in exact rational arithmetic (OpenDP squares the float exactly, so its noise has sigma^2 >= sigma2).

    Raises ValueError for a sigma2 that is not a positive finite rational, or outside [1e-300, 1e300].
    """
    sigma2 = as_positive_rational(sigma2, "sigma2")
    if not Fraction(1, 10**300) <= sigma2 <= 10**300:
        raise ValueError(f"sigma2 must be in [1e-300, 1e300] for a float sigma, got {float(sigma2):.3g}")
    sigma = math.sqrt(float(sigma2))  # within an ulp or so of the exact root; corrected both ways below
    while Fraction(sigma) ** 2 < sigma2:
        sigma = math.nextafter(sigma, math.inf)
    while (below := math.nextafter(sigma, 0.0)) > 0 and Fraction(below) ** 2 >= sigma2:
        sigma = below
    return sigma


def check_opendp_scale(scale: float) -> None:
    """Refuse a float noise scale (Laplace b, Gaussian sigma; grid units) above :data:`OPENDP_SCALE_LIMIT`.

    Raises ValueError saying why and what to use instead.
    """
    if Fraction(scale) > OPENDP_SCALE_LIMIT:
        raise ValueError(
            f"noise scale {scale:.3g} grid units: above 2^56 (about 7.2e16), OpenDP's 64-bit integer output would "
            "saturate too often to stand for the exact law; use sampler: vectorised"
        )


@lru_cache(maxsize=32)
def _measurement(kind: str, scale: float) -> Any:
    dp = load_opendp()
    make, metric = (dp.m.make_laplace, dp.l1_distance) if kind == "laplace" else (dp.m.make_gaussian, dp.l2_distance)
    return make(dp.vector_domain(dp.atom_domain(T="i64")), metric(T="i64"), scale=scale)


def _draw(kind: str, scale: float, size: int) -> np.ndarray:
    """``size`` draws of OpenDP's noise on zeros (the noise itself), int64."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    check_opendp_scale(scale)
    out = np.empty(size, dtype=np.int64)
    if size == 0:
        return out
    measurement = _measurement(kind, scale)
    for start in range(0, size, _CHUNK):
        n = min(_CHUNK, size - start)
        out[start : start + n] = measurement([0] * n)
    if out.max() == _I64.max or out.min() == _I64.min:  # saturated: not a draw of the stated law
        raise OverflowError(
            f"OpenDP's {kind} noise at scale {scale:g} saturated at the int64 limit; use sampler: vectorised"
        )
    return out


def sample_discrete_laplace_opendp(scale: Fraction | int, size: int) -> np.ndarray:
    """Draw ``size`` discrete Laplace integers, pmf proportional to exp(-|x|/b), from OpenDP's exact sampler.

    ``b`` is :func:`opendp_laplace_scale` of ``scale`` (t/s in grid units): the smallest float >= t/s.

    Returns:
        shape (size,) array, dtype int64.

    Raises:
        ImportError: opendp is not installed. ValueError: a bad scale or size, or a scale above
        :data:`OPENDP_SCALE_LIMIT`. OverflowError: a draw saturated at the int64 limit (see the module docstring).
    """
    return _draw("laplace", opendp_laplace_scale(scale), size)


def sample_discrete_gaussian_opendp(sigma2: Fraction | int, size: int) -> np.ndarray:
    """Draw ``size`` discrete Gaussian integers N_Z(0, sigma^2) from OpenDP's exact sampler.

    ``sigma`` is :func:`opendp_gaussian_scale` of ``sigma2`` (in squared grid units): the smallest float whose square
    is >= sigma2.

    Returns:
        shape (size,) array, dtype int64.

    Raises:
        ImportError: opendp is not installed. ValueError: a bad sigma2 or size, or sigma above
        :data:`OPENDP_SCALE_LIMIT`. OverflowError: a draw saturated at the int64 limit.
    """
    return _draw("gaussian", opendp_gaussian_scale(sigma2), size)
