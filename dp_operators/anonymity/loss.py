"""Information-loss metrics of a full-domain generalisation with suppression, and their separable lower bounds.

A release is described by a lattice *node* (one hierarchy level per quasi-identifier) and the set of rows kept; the
other rows are suppressed (withheld). Every metric counts a suppressed row as generalised to the top of every
column (the least informative release of that cell), so suppressing a row never costs less than generalising its
cells to ``*``. With ``n`` input rows and ``q`` quasi-identifiers (``n * q`` cells):

- ``loss`` — the general loss metric of Iyengar ("Transforming Data to Satisfy Privacy Constraints", KDD 2002),
  ARX's "Loss": a cell generalised to a value covering ``c`` of the column's ``d`` distinct values costs
  ``(c - 1) / (d - 1)`` (0 when ``d = 1``); a suppressed cell costs 1; mean over the ``n * q`` cells, in ``[0, 1]``.
- ``ncp`` — the normalised certainty penalty of Xu, Wang, Pei, Wang, Shi, Fu ("Utility-Based Anonymization Using
  Local Recoding", KDD 2006): a cell costs the ``spans`` of its generalised value (numeric: covered range over the
  column's range; categorical: covered values over the domain size, 0 for a single value); a suppressed cell costs 1;
  mean over the ``n * q`` cells, in ``[0, 1]``.
- ``discernibility`` — Bayardo & Agrawal ("Data Privacy through Optimal k-Anonymization", ICDE 2005): the sum over
  released equivalence classes of ``|E|^2`` plus ``n`` for every suppressed row; an integer in ``[n, n^2]``.
- ``entropy`` — non-uniform entropy (Gionis & Tassa, "k-Anonymization with Minimal Loss of Information", IEEE TKDE
  21(2), 2009; ARX's "Non-uniform entropy"): a cell whose original value ``v`` is generalised to ``g`` costs
  ``log2(count(g) / count(v))``, counts taken over the whole input table; a suppressed cell costs
  ``log2(n / count(v))``; summed over the cells, in bits.

All four are monotone under generalisation when nothing is suppressed. ``loss``, ``ncp`` and ``entropy`` are then
also *separable*: the value at a node is a sum of one term per (column, level) — :func:`separable_lower_bounds`.
Since a suppressed cell costs at least as much as any generalisation of it, that sum is a lower bound of the value
at the node with any suppression, and of the value at every more general node: the lattice search
(:mod:`dp_operators.anonymity.lattice`) prunes with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dp_operators.anonymity.encoding import EncodedQuasiIdentifier
from dp_operators.anonymity.errors import AnonymityInputError

#: The metric names, in the order reports list them.
METRICS: tuple[str, ...] = ("loss", "ncp", "discernibility", "entropy")
#: The metrics that are a sum of per-(column, level) terms when nothing is suppressed.
SEPARABLE_METRICS: tuple[str, ...] = ("loss", "ncp", "entropy")


@dataclass(frozen=True)
class ColumnCosts:
    """The per-cell cost of one quasi-identifier under one separable metric.

    A row whose original value has level-0 code ``v`` and whose generalised value at ``level`` has code ``g`` costs
    ``value_cost[level][g] - base[v]``; suppressed, it costs ``top - base[v]``. (``base`` is zero except for entropy,
    where ``value_cost = log2(count of g)``, ``base = log2(count of v)`` and ``top = log2(n)``.) Costs are
    unnormalised: ``loss`` and ``ncp`` divide the sum over cells by ``n * q``.

    Attributes:
        value_cost: per level, shape ``(len(labels[level]),)``, float64.
        base: shape ``(domain_size,)``, float64.
        top: the cost of a suppressed cell before subtracting ``base``.
        level_totals: the sum of the cost over the column's ``n`` rows at each level, nothing suppressed, shape
            ``(height + 1,)``; non-decreasing in the level.
    """

    value_cost: tuple[np.ndarray, ...]
    base: np.ndarray
    top: float
    level_totals: np.ndarray


def check_metric(metric: object) -> str:
    """Return ``metric`` if it names one of :data:`METRICS`.

    Raises:
        AnonymityInputError: any other value.
    """
    if not isinstance(metric, str) or metric not in METRICS:
        raise AnonymityInputError(f"unknown information-loss metric {metric!r}; use one of {list(METRICS)}")
    return metric


def column_costs(encoded: EncodedQuasiIdentifier, metric: str) -> ColumnCosts:
    """The :class:`ColumnCosts` of one quasi-identifier under a separable metric (``loss``, ``ncp``, ``entropy``).

    Raises:
        AnonymityInputError: ``metric`` is not separable.
    """
    if metric not in SEPARABLE_METRICS:
        raise AnonymityInputError(f"metric {metric!r} is not separable; use one of {list(SEPARABLE_METRICS)}")
    n = encoded.rows
    levels = range(encoded.height + 1)
    if metric == "loss":
        d = encoded.domain_size
        value_cost = tuple(
            (encoded.leaf_counts[lv] - 1) / (d - 1) if d > 1 else np.zeros(len(encoded.labels[lv])) for lv in levels
        )
        base, top = np.zeros(encoded.domain_size), 1.0
    elif metric == "ncp":
        value_cost = tuple(np.asarray(encoded.spans[lv], dtype=np.float64) for lv in levels)
        base, top = np.zeros(encoded.domain_size), 1.0
    else:
        value_cost = tuple(
            _log2_counts(np.bincount(encoded.codes[lv], minlength=len(encoded.labels[lv]))) for lv in levels
        )
        base, top = value_cost[0], math.log2(n) if n else 0.0
    base_total = float(base[encoded.codes[0]].sum())
    totals = np.array([float(value_cost[lv][encoded.codes[lv]].sum()) - base_total for lv in levels])
    # The sum is non-decreasing in the level mathematically; keep it so in floating point.
    return ColumnCosts(value_cost, base, top, np.maximum.accumulate(np.maximum(totals, 0.0)))


def separable_lower_bounds(encoded: Sequence[EncodedQuasiIdentifier], metric: str) -> list[np.ndarray]:
    """Per-(column, level) terms whose sum is the metric at a node with nothing suppressed.

    For a node ``(l_1, ..., l_q)`` the metric with nothing suppressed is ``sum_j bounds[j][l_j]``; with any
    suppression it is at least that, and the sum never decreases when a level rises, so it is a lower bound of the
    metric at the node and at every more general node (what the lattice search prunes with).

    Args:
        encoded: the ``q`` encoded quasi-identifiers of one ``n``-row table.
        metric: ``"loss"`` or ``"ncp"`` (terms already divided by ``n * q``, so the sum is the mean) or ``"entropy"``
            (bits).

    Returns:
        ``bounds[j]`` of shape ``(height_j + 1,)``, float64, non-decreasing.

    Raises:
        AnonymityInputError: ``metric`` is not separable, or no quasi-identifier is given.
    """
    check_metric(metric)
    if not encoded:
        raise AnonymityInputError("no quasi-identifier given")
    totals = [column_costs(e, metric).level_totals for e in encoded]
    if metric == "entropy":
        return totals
    cells = encoded[0].rows * len(encoded)
    return [t / cells if cells else t for t in totals]


def information_loss(
    encoded: Sequence[EncodedQuasiIdentifier], node: Sequence[int], kept: np.ndarray | None = None
) -> dict[str, Any]:
    """All four metrics for a release: the rows in ``kept`` generalised to ``node``, the others suppressed.

    Args:
        encoded: the ``q`` encoded quasi-identifiers of one ``n``-row table.
        node: one level per quasi-identifier, ``0 <= node[j] <= height_j``.
        kept: bool mask of released rows, shape ``(n,)``; ``None`` keeps every row.

    Returns:
        A JSON-safe dict: ``loss``, ``ncp`` (means in ``[0, 1]``), ``discernibility`` (int), ``entropy`` (bits),
        ``normalised`` (each in ``[0, 1]``: ``loss`` and ``ncp`` as they are, ``discernibility`` as
        ``(DM - n) / (n^2 - n)``, ``entropy`` over its value with every row suppressed; 0 when the denominator is
        0), ``rows``, ``suppressed_rows``, ``equivalence_classes`` (released).

    Raises:
        AnonymityInputError: no quasi-identifier, lengths that differ, a node of the wrong length or with a level
            out of range, or a mask of the wrong shape.
    """
    if not encoded:
        raise AnonymityInputError("no quasi-identifier given")
    n = encoded[0].rows
    q = len(encoded)
    if any(e.rows != n for e in encoded):
        raise AnonymityInputError("the encoded quasi-identifiers have different row counts")
    levels = tuple(int(level) for level in node)
    if len(levels) != q:
        raise AnonymityInputError(f"the node has {len(levels)} levels for {q} quasi-identifiers")
    for e, level in zip(encoded, levels, strict=True):
        if not 0 <= level <= e.height:
            raise AnonymityInputError(f"level {level} of quasi-identifier {e.name!r} is outside [0, {e.height}]")
    keep = np.ones(n, dtype=bool) if kept is None else np.asarray(kept)
    if keep.dtype != bool or keep.shape != (n,):
        raise AnonymityInputError(f"kept must be a boolean mask of shape ({n},)")
    suppressed = int(n - np.count_nonzero(keep))

    values: dict[str, float] = {}
    for metric in SEPARABLE_METRICS:
        total = 0.0
        worst = 0.0
        for e, level in zip(encoded, levels, strict=True):
            costs = column_costs(e, metric)
            base = costs.base[e.codes[0]]
            cell = costs.value_cost[level][e.codes[level]] - base
            top = costs.top - base
            total += float(cell[keep].sum()) + float(top[~keep].sum())
            worst += float(top.sum())
        if metric == "entropy":
            values[metric] = total
            values["entropy_worst"] = worst
        else:
            values[metric] = total / (n * q) if n else 0.0

    released_sizes = _class_sizes([e.codes[level][keep] for e, level in zip(encoded, levels, strict=True)])
    discernibility = int((released_sizes.astype(np.int64) ** 2).sum()) + suppressed * n
    worst_entropy = values.pop("entropy_worst")
    return {
        "loss": values["loss"],
        "ncp": values["ncp"],
        "discernibility": discernibility,
        "entropy": values["entropy"],
        "normalised": {
            "loss": values["loss"],
            "ncp": values["ncp"],
            "discernibility": (discernibility - n) / (n * n - n) if n > 1 else 0.0,
            "entropy": values["entropy"] / worst_entropy if worst_entropy > 0 else 0.0,
        },
        "rows": n,
        "suppressed_rows": suppressed,
        "equivalence_classes": int(released_sizes.size),
    }


def _log2_counts(counts: np.ndarray) -> np.ndarray:
    """``log2(count)`` per value, 0 for values no row holds (their cost is never used)."""
    out = np.zeros(counts.size, dtype=np.float64)
    present = counts > 0
    out[present] = np.log2(counts[present])
    return out


def _class_sizes(columns: list[np.ndarray]) -> np.ndarray:
    """Sizes of the groups of rows equal on every column (codes, shape ``(r,)`` each)."""
    if not columns or columns[0].size == 0:
        return np.zeros(0, dtype=np.int64)
    frame = pd.DataFrame({i: c for i, c in enumerate(columns)})
    return frame.groupby(list(frame.columns), sort=False).size().to_numpy(dtype=np.int64)
