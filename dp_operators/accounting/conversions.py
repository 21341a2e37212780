"""Pure epsilon-DP expressed as zCDP: the tight conversion through binary randomized response.

A mechanism M is rho-zCDP when D_alpha(M(x) || M(x')) <= rho * alpha for every alpha > 1 and every pair of
neighbours (Bun & Steinke, "Concentrated Differential Privacy: Simplifications, Extensions, and Lower Bounds",
TCC 2016, Def. 1.1, with xi = 0). Bun & Steinke show that epsilon-DP implies (epsilon^2 / 2)-zCDP (ibid.,
Prop. 1.4 / Prop. 3.3). The smallest rho that holds for *every* epsilon-DP mechanism is smaller:

    rho(epsilon) = sup_{alpha > 1} D_alpha(RR_eps) / alpha = epsilon * tanh(epsilon / 2)
                 = epsilon * (e^epsilon - 1) / (e^epsilon + 1),

where RR_eps is binary randomized response, the pair P = (e^eps, 1) / (1 + e^eps), Q = (1, e^eps) / (1 + e^eps).
About 2 % below epsilon^2 / 2 at epsilon = 0.5 and 24 % below at epsilon = 2 (there epsilon^2 / 2 is 31 % above
it); the two agree to first order as epsilon -> 0 (epsilon tanh(epsilon/2) = epsilon^2/2 - epsilon^4/24 + ...).

Proof.

1. *RR_eps is the worst epsilon-DP pair.* For every epsilon-DP mechanism and neighbours x, x', the pair
   (M(x), M(x')) is a post-processing of (P, Q): the privacy region (trade-off curve) of any (epsilon, 0)-DP pair
   lies inside that of RR_eps, and by Blackwell's theorem region containment means there is a Markov kernel T
   with T(P) = M(x) and T(Q) = M(x') (Kairouz, Oh & Viswanath, "The Composition Theorem for Differential
   Privacy", ICML 2015 / IEEE Trans. Inf. Theory 63(6), 2017, Sec. 2; the same statement for trade-off
   functions is Blackwell's theorem in Dong, Roth & Su, "Gaussian Differential Privacy", 2019, Sec. 2, with
   f = f_{eps,0}).
2. *Rényi divergence does not grow under post-processing* (data-processing inequality; van Erven & Harremoës,
   "Rényi Divergence and Kullback-Leibler Divergence", IEEE Trans. Inf. Theory 60(7), 2014). So
   D_alpha(M(x) || M(x')) <= D_alpha(P || Q) for every alpha, and M is rho-zCDP as soon as
   D_alpha(P || Q) <= rho * alpha for every alpha > 1. The smallest such rho is sup_alpha D_alpha(P || Q) / alpha,
   and it is attained by a real mechanism (randomized response; also the discrete Laplace with L1 sensitivity
   equal to its grid step, whose privacy loss takes only the values +-epsilon), so it cannot be improved without
   knowing more about the mechanism.
3. *The supremum in closed form.* With q = 1 / (1 + e^eps),
   D_alpha(P || Q) = ln((e^{alpha eps} + e^{(1-alpha) eps}) q) / (alpha - 1)
                   = [L(eps (alpha - 1/2)) - L(eps / 2)] / (alpha - 1),  L = ln cosh.
   Put u = (alpha - 1/2)^2, so alpha (alpha - 1) = u - 1/4 and
   D_alpha / alpha = [phi(u) - phi(1/4)] / (u - 1/4),  phi(u) = ln cosh(eps sqrt(u)):
   a slope of a chord of phi from the fixed point u = 1/4 (alpha = 1) to u > 1/4 (alpha > 1).
   phi'(u) = (eps^2 / 2) tanh(z) / z with z = eps sqrt(u), and tanh(z) / z decreases for z > 0, so phi is concave
   and its chord slopes from 1/4 decrease in u. Hence D_alpha / alpha decreases in alpha > 1 and its supremum is
   the limit alpha -> 1+, phi'(1/4) = eps tanh(eps / 2) — which is the KL divergence of RR_eps,
   (p - q) eps. (The same value appears as the optimal pure-DP -> zCDP conversion in "Tight RDP & zCDP Bounds
   from Pure DP", DifferentialPrivacy.org, https://differentialprivacy.org/pdp-to-zcdp/; see also Asoodeh, Liao,
   Calmon, Kosut & Sankar, "Three Variants of Differential Privacy: Lossless Conversion and Applications",
   IEEE JSAIT 2021, on optimal conversions between approximate DP and Rényi DP.)
4. *A rigorous number.* e^eps is transcendental for rational eps != 0, so rho(eps) is evaluated in interval
   arithmetic (mpmath's interval context, 200-bit endpoints rounded outwards): its upper endpoint is an exact
   binary fraction >= rho(eps). That endpoint is rounded *up* to a decimal with 12 significant digits, capped by
   the Bun-Steinke value epsilon^2 / 2 (never charge more than before), and rounded up to the ledger's
   resolution (:func:`~dp_operators.accounting.budget.round_up`). The result is the exact charge.

Mechanism-specific bounds can be smaller still (e.g. epsilon + e^-epsilon - 1 for the continuous Laplace
mechanism: Harrison & Manurangsi, "Exact zCDP Characterizations for Fundamental Differentially Private
Mechanisms", FORC 2026); they need a per-mechanism proof and are not used here (docs/adr/0015).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import mpmath
from mpmath import libmp
from mpmath.ctx_iv import MPIntervalContext

from dp_operators.accounting.budget import MAX_DENOMINATOR, exact_number, round_up
from dp_operators.accounting.values import PositiveRational

__all__ = ["largest_epsilon_within_rho", "pure_epsilon_to_rho"]

#: Significant decimal digits of a converted charge (rounded up) or of an inverted epsilon (rounded down).
SIGNIFICANT_DIGITS = 12
# A private interval context: mpmath.iv is global, and changing its precision would affect other callers.
_INTERVALS = MPIntervalContext()
_INTERVALS.prec = 200
_INVERSE_DIGITS = 40
_BISECTION_STEPS = 200


def _positive(value: object, name: str) -> Fraction:
    """``value`` read and checked > 0; a typed :class:`~dp_operators.accounting.values.PositiveRational` (an
    :class:`Epsilon`, a :class:`Rho`) was checked when it was made and is taken as it is (docs/adr/0028)."""
    if isinstance(value, PositiveRational):
        return value
    number = exact_number(value, name=name)
    if number <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return number


def _decimal_step(value: Fraction) -> Fraction:
    """The unit in the last place of ``value`` written with :data:`SIGNIFICANT_DIGITS` significant digits."""
    exponent = math.floor(math.log10(value)) - (SIGNIFICANT_DIGITS - 1)
    return Fraction(10) ** exponent


def _rho_upper_endpoint(epsilon: Fraction) -> Fraction:
    """An exact rational >= epsilon * tanh(epsilon / 2), from interval arithmetic (outward rounding)."""
    eps = _INTERVALS.mpf(epsilon.numerator) / epsilon.denominator
    # tanh(eps/2) = 1 - 2 / (e^eps + 1): no cancellation for large eps, and an interval for e^eps stays valid
    rho = eps * (1 - 2 / (_INTERVALS.exp(eps) + 1))
    numerator, denominator = libmp.to_rational(rho._mpi_[1])
    return Fraction(numerator, denominator)


def pure_epsilon_to_rho(epsilon: Fraction | int | float) -> Fraction:
    """rho such that every epsilon-DP mechanism is rho-zCDP: epsilon * tanh(epsilon / 2), rounded up.

    This is sup over alpha > 1 of D_alpha(RR_eps) / alpha, the tight conversion (module docstring for the proof
    and the sources). The result is an exact ``Fraction``: a decimal with 12 significant digits rounded up, never
    above epsilon^2 / 2 (Bun & Steinke 2016, Prop. 1.4), then rounded up to the ledger's resolution — exactly
    what a ``zcdp`` account is charged. Cached per epsilon.

    Args:
        epsilon: the pure-DP epsilon (> 0, finite; a float is read as the decimal it was typed as).

    Raises:
        ValueError: epsilon not a positive finite number.
    """
    return _pure_epsilon_to_rho(_positive(epsilon, "epsilon"))


def bounded_range_rho(epsilon: Fraction | int | float) -> Fraction:
    """rho such that every epsilon-bounded-range mechanism (the exponential mechanism: Durfee & Rogers 2019) is
    rho-zCDP: epsilon^2 / 8 (Cesar & Rogers, ALT 2021), exact for a rational epsilon, or
    :func:`pure_epsilon_to_rho` where that is smaller (above epsilon 8: an epsilon-BR mechanism is epsilon-DP).

    Raises:
        ValueError: epsilon not a positive finite number.
    """
    epsilon = _positive(epsilon, "epsilon")
    return min(epsilon * epsilon / 8, pure_epsilon_to_rho(epsilon))


@lru_cache(maxsize=4096)
def _pure_epsilon_to_rho(epsilon: Fraction) -> Fraction:
    upper = _rho_upper_endpoint(epsilon)
    step = _decimal_step(upper)
    decimal = math.ceil(upper / step) * step
    return round_up(min(decimal, epsilon * epsilon / 2))


def largest_epsilon_within_rho(rho: Fraction | int | float) -> Fraction:
    """The largest epsilon, a decimal with 12 significant digits, whose charge
    :func:`pure_epsilon_to_rho` (epsilon) is at most ``rho``: the pure-DP budget that fits a rho-zCDP budget.

    epsilon * tanh(epsilon / 2) increases strictly, so its inverse is found by bisection in 40-digit arithmetic;
    from there the 12-digit decimals are searched (galloping, then bisection) for the last one whose exact charge
    fits, the next one's not. Cached per rho.

    Raises:
        ValueError: rho not a positive finite number, or too small for any epsilon to fit after the ledger's
            rounding (below about 1e-18).
    """
    return _largest_epsilon_within_rho(_positive(rho, "rho"))


@lru_cache(maxsize=4096)
def _largest_epsilon_within_rho(rho: Fraction) -> Fraction:
    if rho < Fraction(1, MAX_DENOMINATOR):  # every charge is at least one unit of the ledger's resolution
        raise ValueError(f"rho={float(rho):g} is too small: no epsilon > 0 fits it after the ledger's rounding")
    with mpmath.workdps(_INVERSE_DIGITS):
        target = mpmath.mpf(rho.numerator) / rho.denominator
        # eps tanh(eps/2) <= eps^2/2 gives the lower end; it exceeds rho at rho + 1 (2x <= e^x + 1 for all x)
        low, high = mpmath.sqrt(2 * target), target + 1
        for _ in range(_BISECTION_STEPS):
            middle = (low + high) / 2
            if middle * mpmath.tanh(middle / 2) <= target:
                low = middle
            else:
                high = middle
        mantissa, exponent = low.man_exp
    estimate = Fraction(int(mantissa)) * Fraction(2) ** int(exponent)
    step = _decimal_step(estimate)

    def fits(multiple: int) -> bool:
        return multiple > 0 and _pure_epsilon_to_rho(multiple * step) <= rho

    # the charge's rounding (12 digits, the ledger's 1e-18) moves the answer a few decimal steps from the exact
    # inverse, or many for a rho near 1e-18: gallop to a bracket [fitting, not fitting], then bisect
    start = math.floor(estimate / step)
    if fits(start):
        good, jump = start, 1
        while fits(good + jump):
            good, jump = good + jump, 2 * jump
        bad = good + jump
    else:
        bad, jump = start, 1
        while not fits(bad - jump):
            bad, jump = bad - jump, 2 * jump
        good = bad - jump
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good * step
