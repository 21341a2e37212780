"""Quantiles and medians from a histogram over public bins (``kind: quantile`` / ``median``): the plan, the
release and the published form. docs/mechanisms.md ("Quantiles") and ADR 37 give the argument.

The upstream hands counts per bin (a ``GROUP BY`` of the bin, or ``width_bucket``), per group of the spec's
``group_by``; :class:`~dp_operators.spec.models.QuantileBins` fixes the bins. Two mechanisms, chosen from public
parameters only (the spec, the account's accountant, the confidence):

* ``exponential``: for each level q = a/b and group, the exponential mechanism over the bins with the integer
  utility ``-d_i``, ``d_i`` = b times the rank distance from the target rank qN to bin i's ranks
  (:func:`~dp_operators.mechanisms.exponential.quantile_rank_distances`), sampled exactly
  (:func:`~dp_operators.mechanisms.exponential.sample_exponential_mechanism`). One record changes every utility by
  at most max(a, b - a), all of them inside an interval of width W = 2 max(a, b - a); with
  ``gamma = epsilon / (k W)`` (k the records one privacy unit can add) the mechanism is epsilon-bounded-range
  (Durfee & Rogers, NeurIPS 2019), hence epsilon-DP and epsilon^2/8-zCDP (Cesar & Rogers, ALT 2021). The levels
  share the budget equally.
* ``noised_cdf``: one Gaussian measurement of the histogram's prefix sums (the cumulative counts), by
  :mod:`.cdf`: the binary tree made consistent by least squares, or the square-root factorization (``cdf_strategy``;
  by default the one with the smaller published half-width). Every level follows by post-processing: the first bin
  whose noised cumulative count reaches q times the noised total.

``auto`` takes the mechanism with the smaller planned rank half-width (the worst over the levels).

Published per group and level: ``value`` (the bin's closed edge: the value a bin of width-1 integer data holds),
``bin`` (its edges), ``rank_half_width`` (records, from public parameters: with probability at least the spec's
confidence the released bin is within that many ranks of the target rank), and for the noised CDF an ``interval``
of values holding the true quantile at that confidence (the bins the rank interval spans, from the noised
cumulative counts: post-processing). The exponential mechanism releases no counts, so its ``interval`` is
unbounded (``[null, null]``): its guarantee is in ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from dp_operators.accounting import Epsilon, PrivacyLoss, bounded_range_rho
from dp_operators.accounting.budget import GaussianNoise
from dp_operators.release.cdf import CdfMeasurement, cdf_measurement
from dp_operators.mechanisms.exponential import (
    bounded_range_width,
    quantile_rank_distances,
    rank_error_bound,
    sample_exponential_mechanism,
)
from dp_operators.spec.models import Aggregate, Budget, ContributionBounds, level_text

#: Bits of the dyadic epsilon a ``{rho}`` budget gives the exponential mechanism: the largest multiple of 2^-40
#: at most sqrt(8 rho), so that its charge epsilon^2 / 8 is exact and within the budget.
EPSILON_BITS = 40


def epsilon_for_rho(rho: Fraction) -> Fraction:
    """sqrt(8 rho) when it is rational (rho = 1/50 gives 2/5), else the largest multiple of 2^-EPSILON_BITS below
    it (exact integer square roots): the epsilon whose bounded-range charge epsilon^2 / 8 fits ``rho``."""
    square = 8 * rho
    top, bottom = math.isqrt(square.numerator), math.isqrt(square.denominator)
    if top * top == square.numerator and bottom * bottom == square.denominator:
        return Fraction(top, bottom)
    scaled = math.isqrt(math.floor(8 * rho * (1 << (2 * EPSILON_BITS))))
    return Fraction(scaled, 1 << EPSILON_BITS)


def _value(number: Fraction) -> int | float:
    return int(number) if number.denominator == 1 else float(number)


@dataclass(frozen=True)
class QuantileStep:
    """The plan of one quantile or median aggregate: its mechanism, budget and planned accuracy (public only).

    Attributes:
        aggregate: the aggregate's name.
        mechanism: ``exponential`` or ``noised_cdf``.
        budget: the aggregate's written budget.
        quantiles: the levels, exact.
        bins: m, the number of bins of each group's histogram.
        groups: G, the number of groups (1 when not grouped); None for groups found in the data (partition
            selection), whose number is not public.
        l0, linf: the contribution bounds (L0 capped by the G*m partitions).
        records_per_unit: k = L0 * Linf, the most records one privacy unit adds to the histograms.
        epsilon_each: the exponential mechanism's epsilon per level (and group), exact; None for the CDF.
        cdf_strategy: the CDF's strategy (:data:`~dp_operators.release.cdf.CDF_STRATEGIES`); None for the exponential.
        cdf_noise: the CDF's :class:`~dp_operators.release.cdf.CdfMeasurement`; None for the exponential.
        rank_half_widths: per level, the published rank half-width (records) at ``confidence``.
        cdf_half_width: the CDF only: h, every noised cumulative count of a group is within h of the true one
            with probability at least ``confidence`` (records).
        confidence: the spec's confidence.
        candidates: ``{mechanism: worst planned rank half-width}`` of every mechanism ``auto`` compared.
    """

    aggregate: str
    mechanism: str
    budget: Budget
    quantiles: tuple[Fraction, ...]
    bins: int
    groups: int | None
    l0: int
    linf: int
    records_per_unit: int
    epsilon_each: Fraction | None
    cdf_strategy: str | None
    cdf_noise: Any
    rank_half_widths: tuple[float, ...]
    cdf_half_width: float | None
    confidence: float
    candidates: tuple[tuple[str, float], ...] = ()
    declared_l0: int | None = None
    component: str = "quantile"
    sampler: str = "vectorised"
    noise_delta: Fraction = Fraction(0)
    threshold: int | None = None
    threshold_delta: Fraction | None = None

    @property
    def partitions(self) -> int | None:
        """The number of groups released (each with one value per level); None when they are selected from the
        data."""
        return self.groups

    @property
    def delta(self) -> Fraction:
        return Fraction(0)

    @property
    def epsilon(self) -> Fraction | None:
        """The exponential mechanism's pure epsilon over all levels (basic composition); None for the CDF."""
        if self.epsilon_each is None:
            return None
        return self.epsilon_each * len(self.quantiles)

    @property
    def rho(self) -> Fraction:
        """The zCDP rho: over the levels, the sum of epsilon^2 / 8 (bounded range; Cesar & Rogers 2021), or of
        epsilon tanh(epsilon / 2) where that is smaller (above epsilon 8; every epsilon-DP mechanism), or the CDF's
        Gaussian measurement's Delta^2 / (2 sigma^2), exact."""
        if self.epsilon_each is not None:
            return bounded_range_rho(self.epsilon_each) * len(self.quantiles)
        return self.cdf_noise.rho

    def privacy_loss(self, accountant: str) -> PrivacyLoss:
        """The loss to charge to an ``accountant`` account. The exponential mechanism: pure epsilon (``pure_dp``,
        ``approx_dp``), and on ``zcdp`` the sum of its levels' epsilon^2 / 8 (each level bounded-range; the sum is
        what composition gives, below (sum epsilon)^2 / 8). The CDF: its exact rho, with its Gaussian noise
        parameters (a ``gaussian_dp`` account refuses the discrete Gaussian, as for every release)."""
        if self.epsilon_each is not None:
            if accountant == "zcdp":  # each level epsilon-BR: epsilon^2/8, or the tanh bound where smaller (eps > 8)
                return PrivacyLoss("rho", self.rho)
            return PrivacyLoss("epsilon", self.epsilon, bounded_range=True)  # a sum of BR losses is BR
        noise = self.cdf_noise
        gaussian = GaussianNoise(noise.noise_variance, noise.sensitivity_squared, discrete=True)
        return PrivacyLoss("rho", self.rho, gaussian=gaussian)

    def describe(self) -> dict[str, Any]:
        """A JSON-safe description recorded in the ledger and published: enough to re-derive the guarantee."""
        described: dict[str, Any] = {
            "aggregate": self.aggregate,
            "component": self.component,
            "mechanism": self.mechanism,
            "calibrated_to": {name: float(getattr(self.budget, name)) for name in ("epsilon", "rho", "delta")
                              if getattr(self.budget, name) is not None},
            "quantiles": [level_text(q) for q in self.quantiles],
            "bins": self.bins,
            "partitions": self.groups,
            "max_partitions_contributed": self.l0,
            "max_contributions_per_partition": self.linf,
            "records_per_unit": self.records_per_unit,
            "rank_half_width": list(self.rank_half_widths),
            "rho": float(self.rho),
            "rho_exact": str(self.rho),
        }
        if self.declared_l0 is not None and self.declared_l0 != self.l0:
            described["max_partitions_contributed_declared"] = self.declared_l0
        if self.epsilon_each is not None:
            described.update(
                epsilon=float(self.epsilon), epsilon_exact=str(self.epsilon),
                epsilon_per_quantile_exact=str(self.epsilon_each), bounded_range=True,
                sampler="exact_inverse_cdf",
            )
        else:
            described.update(self.cdf_noise.describe(), cdf_half_width=self.cdf_half_width, sampler="vectorised")
        if self.candidates:
            described["candidates"] = dict(self.candidates)
        return described


def cdf_step(aggregate: Aggregate, noise: CdfMeasurement, l0: int, linf: int, confidence: float,
             declared_l0: int | None = None) -> QuantileStep:
    """The plan of ``aggregate`` released by the CDF measurement ``noise``: h = its half-width holding every prefix
    at once at ``confidence`` (:meth:`CdfMeasurement.half_width`), and each level's rank half-width h (1 + q)."""
    levels = tuple(aggregate.quantiles or ())
    bins = noise.bins
    groups = aggregate.partition_count // bins if aggregate.public_keys else None  # type: ignore[operator]
    h = noise.half_width(confidence)
    return QuantileStep(aggregate.name, "noised_cdf", aggregate.budget, levels, bins, groups, l0, linf, l0 * linf,
                        None, noise.name, noise, tuple(float(h * (1 + q)) for q in levels), h, confidence,
                        declared_l0=declared_l0)


def plan_quantiles(aggregate: Aggregate, contribution: ContributionBounds, accountant: str | None,
                   confidence: float) -> QuantileStep:
    """The plan of a quantile or median aggregate (public parameters only).

    The exponential mechanism's epsilon per level: ``{epsilon}`` (or ``{epsilon, delta}``, whose delta is not
    used) split equally over the levels; ``{rho}``: the largest dyadic epsilon with epsilon^2 / 8 <= rho / levels.
    The CDF needs ``{rho}`` and an account that composes zCDP (``zcdp``, or no accountant given). ``auto`` takes
    the smaller worst planned rank half-width (ties: the exponential mechanism).

    Raises:
        ValueError: ``noised_cdf`` with a budget or account it cannot be charged to (the spec refuses the first).
    """
    levels = tuple(aggregate.quantiles or ())
    bins_model = aggregate.bins
    assert bins_model is not None and levels
    bins = len(bins_model.labels)
    declared_l0 = contribution.max_partitions_contributed
    if aggregate.public_keys:
        groups: int | None = aggregate.partition_count // bins  # type: ignore[operator]
        l0 = min(declared_l0, groups * bins)  # type: ignore[operator]
    else:  # groups found in the data: their number is not public, and L0 stands
        groups, l0 = None, declared_l0
    linf = contribution.max_contributions_per_partition
    records = l0 * linf
    alpha = 1 - confidence
    budget = aggregate.budget
    # typed once here (docs/adr/0028): the sampler and the accuracy take it as it is
    if budget.form == "rho":
        epsilon_each = Epsilon(epsilon_for_rho(budget.rho / len(levels)))
    else:
        epsilon_each = Epsilon(budget.epsilon / len(levels))
    options: dict[str, QuantileStep] = {}
    if aggregate.mechanism in ("auto", "exponential"):
        widths = tuple(rank_error_bound(bins, q, epsilon_each, records, alpha) for q in levels)
        options["exponential"] = QuantileStep(
            aggregate.name, "exponential", budget, levels, bins, groups, l0, linf, records, epsilon_each, None, None,
            widths, None, confidence, declared_l0=declared_l0)
    # under partition selection no account holds both the selection's (epsilon, delta) and the CDF's zCDP
    cdf_possible = budget.form == "rho" and accountant in (None, "zcdp") and aggregate.public_keys
    if aggregate.mechanism == "noised_cdf" and not cdf_possible:
        raise ValueError(f"aggregate {aggregate.name!r}: mechanism noised_cdf is a Gaussian measurement charged in "
                         f"zCDP; a {accountant} account cannot be charged for it: use mechanism exponential")
    if aggregate.mechanism in ("auto", "noised_cdf") and cdf_possible:
        # over groups found in the data, a unit's bins split over at most L0 of them: the worst split of any number
        measurement = cdf_measurement(aggregate.cdf_strategy, bins, l0, linf, groups or l0, budget.rho, confidence)
        options["noised_cdf"] = cdf_step(aggregate, measurement, l0, linf, confidence, declared_l0)
    if not options:
        raise ValueError(f"aggregate {aggregate.name!r}: no quantile mechanism fits budget {budget.form}")
    compared = tuple((name, max(step.rank_half_widths)) for name, step in options.items())
    chosen = min(options.values(), key=lambda step: max(step.rank_half_widths))  # min keeps the first: exponential
    if aggregate.mechanism == "auto":
        chosen = replace(chosen, candidates=compared)
    return chosen


def _bin_edges(aggregate: Aggregate, index: int) -> tuple[Fraction, Fraction]:
    edges = aggregate.bins.exact_edges  # type: ignore[union-attr]
    return edges[index], edges[index + 1]


def _closed_edge(aggregate: Aggregate, index: int) -> Fraction:
    lower, upper = _bin_edges(aggregate, index)
    return lower if aggregate.bins.closed == "left" else upper  # type: ignore[union-attr]


def _first_reaching(cumulative: Sequence[Fraction], target: Fraction) -> int:
    """The first index whose value is at least ``target``; the last index when none is (exact comparisons, every
    one of them made: the work does not depend on where the first is)."""
    reached = [value >= target for value in cumulative]
    return reached.index(True) if True in reached else len(cumulative) - 1


def draw_quantiles(step: QuantileStep, counts: np.ndarray, drawn: list[str]) -> list[list[dict[str, Any]]]:
    """The released bins of every group and level: ``result[g][j]`` is ``{"bin": index, "lower_bin": index,
    "upper_bin": index}`` (the interval's bins for the CDF; None for the exponential mechanism).

    ``counts`` is the histograms' integer vector, shape (groups * bins,), each group's bins contiguous (the key
    domain's order, the bin column last; under partition selection the selected groups' only). ``drawn`` records
    each draw before it starts (:func:`run_release`'s rule: a caller knows whether noise may exist). Work is fixed
    by the public parameters and the number of groups released: every bin is scored, or every prefix noised,
    whatever the counts."""
    results: list[list[dict[str, Any]]] = []
    m = step.bins
    for group in range(len(counts) // m):
        histogram = [int(value) for value in counts[group * m:(group + 1) * m].tolist()]
        released: list[dict[str, Any]] = []
        if step.mechanism == "exponential":
            for level in step.quantiles:
                gamma = step.epsilon_each / (step.records_per_unit * bounded_range_width(level))
                distances = quantile_rank_distances(histogram, level)
                drawn.append(step.component)
                released.append({"bin": sample_exponential_mechanism(distances, gamma),
                                 "lower_bin": None, "upper_bin": None})
        else:
            drawn.append(step.component)
            cumulative = step.cdf_noise.noised_prefixes(histogram)
            noised_total = cumulative[-1]
            h = Fraction(step.cdf_half_width)
            for level in step.quantiles:
                released.append({
                    "bin": _first_reaching(cumulative, level * noised_total),
                    "lower_bin": _first_reaching([c + h for c in cumulative], level * (noised_total - h)),
                    "upper_bin": _first_reaching([c - h for c in cumulative], level * (noised_total + h)),
                })
        results.append(released)
    return results


def _published_bins(aggregate: Aggregate) -> dict[str, Any]:
    """The bins as published: column, count, ``closed``, ``label`` and the edges (``low``, ``high`` and ``width``
    when equally spaced, else every edge)."""
    bins = aggregate.bins  # type: ignore[union-attr]
    edges = bins.exact_edges
    published: dict[str, Any] = {"column": bins.column, "count": len(edges) - 1, "closed": bins.closed,
                                 "label": bins.label, "low": _value(edges[0]), "high": _value(edges[-1])}
    width = edges[1] - edges[0]
    if all(b - a == width for a, b in zip(edges, edges[1:])):
        published["width"] = _value(width)
    else:
        published["edges"] = [_value(edge) for edge in edges]
    return published


def publish_quantiles(aggregate: Aggregate, step: QuantileStep, released: list[list[dict[str, Any]]],
                      groups: Sequence[tuple], selection: Any = None) -> dict[str, Any]:
    """The published form of a quantile or median aggregate (post-processing of the released bins only): rows keyed
    by the groups' columns and ``quantile``, each with ``value``, ``bin``, ``rank_half_width``, ``interval`` and
    ``half_width`` (see the module docstring). ``groups``: each released group's key (its outer columns' values);
    ``selection``: the partition-selection step that kept the groups (its mechanism and threshold are published),
    None over public groups."""
    outer = aggregate.outer_group_by
    rows = []
    edges = aggregate.bins.exact_edges  # type: ignore[union-attr]
    for key, bins in zip(groups, released):
        for level, width, chosen in zip(step.quantiles, step.rank_half_widths, bins):
            index = chosen["bin"]
            value = _closed_edge(aggregate, index)
            lower, upper = _bin_edges(aggregate, index)
            row: dict[str, Any] = dict(zip(outer, key))
            row.update(quantile=level_text(level), value=_value(value), bin=[_value(lower), _value(upper)],
                       bin_label=aggregate.bins.labels[index], rank_half_width=width)  # type: ignore[union-attr]
            if chosen["lower_bin"] is None:
                row.update(interval=[None, None], half_width=None)
            else:
                low = edges[min(chosen["lower_bin"], index)]
                high = edges[max(chosen["upper_bin"], index) + 1]
                row.update(interval=[_value(low), _value(high)], half_width=float(max(value - low, high - value)))
            rows.append(dict(sorted(row.items())))
    published: dict[str, Any] = {
        "kind": aggregate.kind,
        "mechanism": step.mechanism if step.cdf_strategy is None else f"noised_cdf:{step.cdf_strategy}",
        "budget": {name: float(getattr(aggregate.budget, name)) for name in ("epsilon", "rho", "delta")
                   if getattr(aggregate.budget, name) is not None},
        "group_by": [*outer, "quantile"],
        "bins": _published_bins(aggregate),
        "rows": rows,
    }
    if selection is not None:
        published["partition_selection"] = selection.published_selection()
    return published
