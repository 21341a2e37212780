"""Mondrian multidimensional generalisation to reach a target k, with bounded suppression and information loss.

Strict Mondrian (LeFevre, DeWitt, Ramakrishnan, "Mondrian Multidimensional k-Anonymity", ICDE 2006): recursively
split the rows on the quasi-identifier with the widest normalised range, at the median, as long as both halves keep
at least k rows; each final partition becomes one equivalence class whose QI values are generalised to the
partition's range (numeric QIs: the interval ``[min, max]``) or value set (categorical QIs: ``{a, b}``, or ``*`` when
the set is the attribute's whole domain). Categorical values are split in sorted order, since no hierarchy is
declared for QIs; this is the ordered-set variant of LeFevre et al.'s categorical splits.

Bounded suppression: before partitioning, rows carrying a categorical QI value seen in fewer than k rows of the
table (a value that can never form a class on its own, so it forces a wider set) are withheld, rarest value first,
while the withheld rows stay within ``max_suppression`` of the table.

Information loss reported:

- normalised certainty penalty (NCP, Xu, Wang, Pei, Wang, Shi, Fu, "Utility-Based Anonymization Using Local
  Recoding", KDD 2006): per row and QI, ``(max - min) / (domain range)`` for a numeric interval and
  ``|set| / |domain|`` for a categorical set of more than one value (0 for a single value); averaged over rows and
  QIs, with a suppressed row counting 1 per QI. 0 = no loss, 1 = everything suppressed or generalised to ``*``.
- discernibility metric (Bayardo & Agrawal, "Data Privacy through Optimal k-Anonymization", ICDE 2005):
  ``sum over classes of |E|^2 + (suppressed rows) * n``.
- normalised average equivalence class size ``C_avg = (released rows / classes) / k`` (LeFevre et al. 2006).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.measures import check_columns

SUPPRESSED_ALL = "*"


@dataclass(frozen=True)
class MondrianResult:
    """Outcome of :func:`mondrian`.

    Attributes:
        table: the released rows (suppressed rows removed, original index kept) with every QI column replaced by its
            generalisation as text; other columns unchanged. Shape ``(n - suppressed_rows, columns)``.
        k: size of the smallest class of ``table`` (>= the target k).
        equivalence_classes: number of classes (Mondrian partitions).
        suppressed_rows: rows withheld.
        rows: rows of the input table.
        ncp: normalised certainty penalty in ``[0, 1]``.
        discernibility: discernibility metric.
        average_class_size: ``C_avg``.
    """

    table: pd.DataFrame
    k: int
    target_k: int
    equivalence_classes: int
    suppressed_rows: int
    rows: int
    ncp: float
    discernibility: int
    average_class_size: float

    @property
    def suppressed_fraction(self) -> float:
        return self.suppressed_rows / self.rows

    def information_loss(self) -> dict[str, Any]:
        """The summary as plain JSON-safe values (no row contents)."""
        return {
            "target_k": self.target_k,
            "k": self.k,
            "rows": self.rows,
            "equivalence_classes": self.equivalence_classes,
            "suppressed_rows": self.suppressed_rows,
            "suppressed_fraction": self.suppressed_fraction,
            "ncp": self.ncp,
            "discernibility": self.discernibility,
            "average_class_size": self.average_class_size,
        }


@dataclass
class _Dimension:
    name: str
    numeric: bool
    codes: np.ndarray  # (n_released,) rank of the row's value among the domain's sorted values
    domain: np.ndarray  # (m,) sorted distinct values
    span: float  # numeric: max - min of the domain; categorical: m

    def width(self, codes: np.ndarray) -> float:
        """Normalised width of a partition's values, in [0, 1]."""
        if self.numeric:
            return 0.0 if self.span == 0 else float(self.domain[codes.max()] - self.domain[codes.min()]) / self.span
        if self.span <= 1:
            return 0.0
        return (np.unique(codes).size - 1) / (self.span - 1)


def mondrian(
    table: pd.DataFrame,
    quasi_identifiers: Sequence[str],
    k: int,
    max_suppression: float = 0.0,
    categorical: Sequence[str] | None = None,
) -> MondrianResult:
    """Generalise ``table`` (shape ``(n, any)``) on ``quasi_identifiers`` until every class has at least ``k`` rows.

    Args:
        table: the microdata.
        quasi_identifiers: QI columns; numeric dtypes become intervals unless listed in ``categorical``.
        k: the target k (>= 1, <= number of rows).
        max_suppression: fraction of rows that may be withheld (``[0, 1)``).
        categorical: QI columns to treat as categorical even when numeric.

    Raises:
        AnonymityInputError: unknown column, empty table, missing QI value, k larger than the table.
        ValueError: k < 1 or ``max_suppression`` outside ``[0, 1)``.
    """
    qis = list(quasi_identifiers)
    check_columns(table, qis, "quasi-identifier")
    n = len(table)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise AnonymityInputError(f"target k = {k} is larger than the table ({n} rows)")
    if not 0 <= max_suppression < 1:
        raise ValueError(f"max_suppression must be in [0, 1), got {max_suppression}")
    forced = set(categorical or ())
    numeric = {q: q not in forced and pd.api.types.is_numeric_dtype(table[q]) for q in qis}

    keep = _suppress_rare_values(table, [q for q in qis if not numeric[q]], k, math.floor(max_suppression * n))
    released = table.loc[keep]
    dims = []
    for q in qis:
        codes, domain = pd.factorize(released[q], sort=True)
        domain = np.asarray(domain)
        span = float(domain[-1] - domain[0]) if numeric[q] else float(domain.size)
        dims.append(_Dimension(q, numeric[q], codes.astype(np.intp), domain, span))

    partitions = _partition(dims, np.arange(len(released)), k)

    generalised = {d.name: np.empty(len(released), dtype=object) for d in dims}
    penalty = 0.0
    sizes = np.empty(len(partitions), dtype=np.int64)
    for i, rows in enumerate(partitions):
        sizes[i] = rows.size
        for d in dims:
            label, loss = _generalise(d, d.codes[rows])
            generalised[d.name][rows] = label
            penalty += loss * rows.size
    out = released.copy()
    for d in dims:
        out[d.name] = pd.Series(generalised[d.name], index=released.index, dtype=object)

    suppressed = n - len(released)
    return MondrianResult(
        table=out,
        k=int(sizes.min()),
        target_k=int(k),
        equivalence_classes=len(partitions),
        suppressed_rows=suppressed,
        rows=n,
        ncp=(penalty + suppressed * len(dims)) / (n * len(dims)),
        discernibility=int((sizes**2).sum()) + suppressed * n,
        average_class_size=(len(released) / len(partitions)) / k,
    )


def _suppress_rare_values(table: pd.DataFrame, categorical_qis: list[str], k: int, budget: int) -> np.ndarray:
    """Boolean mask of rows kept, shape ``(n,)``: withhold rows with categorical QI values seen < k times,
    rarest value first, while the withheld rows stay within ``budget`` (and at least k rows remain)."""
    n = len(table)
    keep = np.ones(n, dtype=bool)
    if budget <= 0 or not categorical_qis:
        return keep
    rare: list[tuple[int, int, np.ndarray]] = []  # (frequency, tie-break, row mask)
    for column in categorical_qis:
        codes, _ = pd.factorize(table[column])
        counts = np.bincount(codes)
        for code in np.flatnonzero(counts < k):
            rare.append((int(counts[code]), len(rare), codes == code))
    rare.sort(key=lambda item: (item[0], item[1]))
    withheld = 0
    for _, _, rows in rare:
        new = int(np.count_nonzero(rows & keep))
        if new and withheld + new <= budget and n - withheld - new >= k:
            keep &= ~rows
            withheld += new
    return keep


def _partition(dims: list[_Dimension], rows: np.ndarray, k: int) -> list[np.ndarray]:
    """Strict Mondrian: the final partitions (row-index arrays), each of size >= k."""
    final: list[np.ndarray] = []
    stack = [rows]
    while stack:
        part = stack.pop()
        widths = [(d.width(d.codes[part]), j) for j, d in enumerate(dims)]
        split = False
        # Widest normalised range first; fall back to the next dimension when no cut keeps k rows on both sides.
        for width, j in sorted(widths, key=lambda w: (-w[0], w[1])):
            if width == 0:
                break
            cut = _median_cut(dims[j].codes[part], k)
            if cut is not None:
                left = dims[j].codes[part] <= cut
                stack.append(part[~left])
                stack.append(part[left])
                split = True
                break
        if not split:
            final.append(part)
    return final


def _median_cut(codes: np.ndarray, k: int) -> int | None:
    """The code c splitting ``codes`` into ``<= c`` and ``> c`` closest to the median with both sides >= k rows,
    or ``None`` when no allowable cut exists (LeFevre et al. 2006, strict partitioning)."""
    low = int(codes.min())
    cumulative = np.cumsum(np.bincount(codes - low))
    total = int(cumulative[-1])
    allowable = np.flatnonzero((cumulative >= k) & (total - cumulative >= k))
    if allowable.size == 0:
        return None
    best = allowable[np.argmin(np.abs(cumulative[allowable] - total / 2))]
    return int(best) + low


def _format_value(value: object) -> str:
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _generalise(dim: _Dimension, codes: np.ndarray) -> tuple[str, float]:
    """Label of a partition's values on one QI and its NCP per row."""
    low, high = int(codes.min()), int(codes.max())
    if dim.numeric:
        if low == high:
            return _format_value(dim.domain[low]), 0.0
        lo, hi = dim.domain[low], dim.domain[high]
        return f"[{_format_value(lo)}, {_format_value(hi)}]", float(hi - lo) / dim.span
    present = np.unique(codes)
    if present.size == 1:
        return _format_value(dim.domain[present[0]]), 0.0
    if present.size == dim.domain.size:
        return SUPPRESSED_ALL, 1.0
    return "{" + ", ".join(_format_value(v) for v in dim.domain[present]) + "}", present.size / dim.domain.size
