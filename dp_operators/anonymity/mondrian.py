"""Mondrian multidimensional generalisation to reach k (and l, t, highest risk), with suppression and information loss.

Strict Mondrian (LeFevre, DeWitt, Ramakrishnan, "Mondrian Multidimensional k-Anonymity", ICDE 2006): recursively
split the rows on the quasi-identifier with the widest normalised range, at the allowable cut nearest the median;
each final partition becomes one equivalence class whose QI values are generalised to the partition's range
(numeric QIs: the interval ``[min, max]``) or value set (categorical QIs: ``{a, b}``, or ``*`` when the set is the
attribute's whole domain). Categorical values are split in sorted order (the ordered-set variant of LeFevre et al.'s
categorical splits); QI hierarchies are used by the full-domain search, not here.

A cut is *allowable* when both halves keep at least ``k`` rows and, when a
:class:`~dp_operators.anonymity.criteria.Criteria` is given, both halves pass every class-level target of the spec:
k, l-diversity, t-closeness and the highest prosecutor / journalist risk. This is how Machanavajjhala et al. (2006)
and Li, Li, Venkatasubramanian (2007) run Mondrian for l and t. Since the root partition is the whole table, every
final partition passes unless the whole table already fails a target.

Suppression after generalisation, as ARX does: the partitions that still miss a class-level target are withheld
when their rows are more than 0, at most ``floor(max_suppression * n)`` and fewer than ``n``; no row is withheld
before partitioning, so a larger allowance never raises the information loss. With strict Mondrian no partition is
ever withheld: every final partition but the whole table came from an allowable cut, and every class-level target
here holds for the union of two classes that hold it (sizes add; entropy is concave; the recursive (c, l) head
grows no faster than its tail; the EMD to a fixed ``P`` is convex), so a failing partition can only be the whole
table, which suppression cannot withhold. The result then reports it in ``failing_classes``. (Before, rows with rare
categorical values were withheld *before* partitioning, which raised the loss: ARX adult, k = 50, NCP 0.190 at 0 %
rose to 0.211 at 1 %.)

QI types are handled by :func:`~dp_operators.anonymity.columns.qi_kind`: booleans are categorical, infinite values
and numbers mixed with text are refused, and so are numbers a float64 cannot hold exactly (integers beyond 2**53,
``Decimal`` with more digits than a float has; see :func:`~dp_operators.anonymity.columns.numeric_values`): distinct
values would otherwise share one float and the interval ``[min, max]`` could not be computed or would not cover
them.

Information loss reported:

- normalised certainty penalty (NCP, Xu, Wang, Pei, Wang, Shi, Fu, "Utility-Based Anonymization Using Local
  Recoding", KDD 2006): per row and QI, ``(max - min) / (domain range)`` for a numeric interval and
  ``|set| / |domain|`` for a categorical set of more than one value (0 for a single value); averaged over rows and
  QIs, with a suppressed row counting 1 per QI. 0 = no loss, 1 = everything suppressed or generalised to ``*``.
- discernibility metric (Bayardo & Agrawal, "Data Privacy through Optimal k-Anonymization", ICDE 2005):
  ``sum over classes of |E|^2 + (suppressed rows) * n``.
- average equivalence class size ``released rows / classes``, and LeFevre et al.'s normalised average class size
  ``C_avg = (released rows / classes) / k``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dp_operators.anonymity.columns import QIKind, declared_qi_kinds, numeric_values, qi_kind
from dp_operators.anonymity.criteria import Criteria
from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.generalisation import value_text
from dp_operators.anonymity.measures import check_columns

if TYPE_CHECKING:
    from dp_operators.anonymity.spec import AnonymitySpec

SUPPRESSED_ALL = "*"

#: Candidate cuts of one partition are evaluated together, up to this many (row, cut) pairs per call.
_BATCH_ROWS = 1 << 20


@dataclass(frozen=True)
class MondrianResult:
    """Outcome of :func:`mondrian`.

    Attributes:
        table: the released rows (suppressed rows removed, original index kept) with every QI column replaced by its
            generalisation as text; other columns unchanged. Shape ``(n - suppressed_rows, columns)``.
        k: size of the smallest class of ``table`` (>= the target k unless the whole table is smaller than needed).
        target_k: the k asked for.
        equivalence_classes: number of classes (Mondrian partitions) released.
        suppressed_rows: rows withheld (whole partitions that missed a class-level target).
        rows: rows of the input table.
        ncp: normalised certainty penalty in ``[0, 1]``.
        discernibility: discernibility metric.
        average_class_size: released rows / classes.
        normalised_average_class_size: LeFevre et al.'s ``C_avg = average_class_size / target_k``.
        failing_classes: released classes that still miss a class-level target of the criteria (0 when every
            target is met; nonzero only when the whole table misses one and the allowance could not withhold it).
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
    normalised_average_class_size: float
    failing_classes: int = 0

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
            "normalised_average_class_size": self.normalised_average_class_size,
            "failing_classes": self.failing_classes,
        }


@dataclass
class _Dimension:
    name: str
    numeric: bool
    codes: np.ndarray  # (n,) rank of the row's value among the domain's sorted values
    domain: np.ndarray  # (m,) sorted distinct values
    span: float  # numeric: max - min of the domain; categorical: m

    def width(self, codes: np.ndarray) -> float:
        """Normalised width of a partition's values, in [0, 1]."""
        if self.numeric:
            if self.span == 0:
                return 0.0
            return (float(self.domain[codes.max()]) - float(self.domain[codes.min()])) / self.span
        if self.span <= 1:
            return 0.0
        return (np.unique(codes).size - 1) / (self.span - 1)


def mondrian(
    table: pd.DataFrame,
    quasi_identifiers: Sequence[str],
    k: int,
    max_suppression: float = 0.0,
    categorical: Sequence[str] | None = None,
    criteria: Criteria | None = None,
    numeric: Sequence[str] | None = None,
) -> MondrianResult:
    """Generalise ``table`` (shape ``(n, any)``) on ``quasi_identifiers`` until every class has at least ``k`` rows
    (and meets the class-level targets of ``criteria``).

    Args:
        table: the microdata.
        quasi_identifiers: QI columns; their kind (numeric intervals or categorical sets) comes from
            :func:`~dp_operators.anonymity.columns.qi_kind`, which infers it unless listed in ``categorical`` or
            ``numeric``.
        k: the target k, an ``int`` or numpy integer (not ``bool``), ``1 <= k <= n``.
        max_suppression: fraction of rows that may be withheld, finite, in ``[0, 1)``; only partitions that still
            miss a class-level target after partitioning may be withheld, which strict Mondrian never produces short
            of the whole table (see the module docstring): the allowance is validated and kept so that a spec's
            allowance can be passed as is.
        categorical: QI columns to treat as categorical even when numeric.
        criteria: the class-level targets (k, l, t, highest risk) a cut must keep on both halves; built for this
            same ``table`` (``Criteria(spec, table)``). ``None``: k alone. Table-level risk targets are not
            enforced by the partitioning; measure the result with :func:`~dp_operators.anonymity.check.check_table`.
        numeric: QI columns to treat as numeric (text holding numbers, e.g. a column read as strings).

    Raises:
        TypeError: ``k`` is not an integer (a float such as 2.5, or a boolean), or ``max_suppression`` is not a real
            number.
        ValueError: ``k < 1``; ``max_suppression`` not finite or outside ``[0, 1)``; a column listed in
            ``categorical``/``numeric`` is not a QI or is listed in both; ``criteria`` built for another table.
        AnonymityInputError: unknown column, empty table, missing QI value, ``k`` larger than the table, a QI that
            cannot be generalised as declared (infinite values, numbers mixed with text; see ``qi_kind``).
    """
    qis = list(quasi_identifiers)
    check_columns(table, qis, "quasi-identifier")
    n = len(table)
    k = _check_k(k, n)
    max_suppression = _check_fraction(max_suppression)
    if criteria is not None and criteria.rows != n:
        raise ValueError(f"criteria were built for a table of {criteria.rows} rows, not this one ({n} rows)")
    declared = _declared_kinds(qis, categorical, numeric)
    dims = [_dimension(table[q], declared[q]) for q in qis]

    min_size = k if criteria is None else max(k, criteria.min_class_size)
    sensitive_criteria = criteria if criteria is not None and criteria.needs_sensitive else None
    partitions = _partition(dims, np.arange(n), min_size, sensitive_criteria)

    # Suppression after generalisation: only partitions that still miss a class-level target.
    sizes = np.fromiter((p.size for p in partitions), dtype=np.int64, count=len(partitions))
    failing = sizes < min_size
    if criteria is not None:
        class_ids = np.empty(n, dtype=np.intp)
        for i, rows in enumerate(partitions):
            class_ids[rows] = i
        failing |= criteria.class_failures(class_ids, len(partitions))
    failing_rows = int(sizes[failing].sum())
    if 0 < failing_rows <= math.floor(max_suppression * n) and failing_rows < n:
        partitions = [p for p, fails in zip(partitions, failing) if not fails]
        sizes = sizes[~failing]
        still_failing = 0
    else:
        still_failing = int(np.count_nonzero(failing))

    kept = np.sort(np.concatenate(partitions))
    position = np.full(n, -1, dtype=np.intp)
    position[kept] = np.arange(kept.size)
    generalised = {d.name: np.empty(kept.size, dtype=object) for d in dims}
    penalty = 0.0
    for rows in partitions:
        for d in dims:
            label, loss = _generalise(d, d.codes[rows])
            generalised[d.name][position[rows]] = label
            penalty += loss * rows.size
    released = table.iloc[kept]
    out = released.copy()
    for d in dims:
        out[d.name] = pd.Series(generalised[d.name], index=released.index, dtype=object)

    suppressed = n - kept.size
    average = kept.size / len(partitions)
    return MondrianResult(
        table=out,
        k=int(sizes.min()),
        target_k=k,
        equivalence_classes=len(partitions),
        suppressed_rows=suppressed,
        rows=n,
        ncp=(penalty + suppressed * len(dims)) / (n * len(dims)),
        discernibility=int((sizes**2).sum()) + suppressed * n,
        average_class_size=average,
        normalised_average_class_size=average / k,
        failing_classes=still_failing,
    )


def mondrian_spec(table: pd.DataFrame, spec: AnonymitySpec, criteria: Criteria | None = None) -> MondrianResult:
    """Mondrian for an anonymity spec: its QIs (and their declared kinds), every class-level target (k, l, t,
    highest risk) through :class:`~dp_operators.anonymity.criteria.Criteria`, and its suppression allowance.

    The target k of the result is the smallest class size the class-level targets allow
    (:attr:`Criteria.min_class_size`: k, and ``ceil(1 / highest risk)``). A ``max_fraction`` of 1 is taken as "any
    number of rows but not all". Table-level risk targets are not enforced by Mondrian; check the released table
    with :func:`~dp_operators.anonymity.check.check_table`.

    Args:
        table: the microdata, shape ``(n, any)``.
        spec: the validated spec.
        criteria: ``Criteria(spec, table)`` if already built.

    Raises:
        AnonymityInputError: see :func:`mondrian` and :class:`Criteria`.
    """
    qis = list(spec.qi_names)
    check_columns(table, qis, "quasi-identifier")
    if criteria is None:
        criteria = Criteria(spec, table)
    criteria.check_min_class_size()
    kinds = declared_qi_kinds(spec)
    allowance = min(float(spec.suppression.max_fraction), math.nextafter(1.0, 0.0))
    return mondrian(
        table,
        qis,
        k=criteria.min_class_size,
        max_suppression=allowance,
        categorical=[q for q in qis if kinds.get(q) == "categorical"],
        criteria=criteria,
        numeric=[q for q in qis if kinds.get(q) == "numeric"],
    )


def _check_k(k: object, n: int) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(
            f"k must be an integer (int or numpy integer), got {type(k).__name__} {k!r}; a class size has no fraction"
        )
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise AnonymityInputError(f"target k = {k} is larger than the table ({n} rows)")
    return k


def _check_fraction(value: object) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"max_suppression must be a real number in [0, 1), got {type(value).__name__}")
    fraction = float(value)
    if not (math.isfinite(fraction) and 0 <= fraction < 1):
        raise ValueError(f"max_suppression must be a finite fraction in [0, 1), got {fraction}")
    return fraction


def _declared_kinds(
    qis: list[str], categorical: Sequence[str] | None, numeric: Sequence[str] | None
) -> dict[str, QIKind | None]:
    forced_categorical, forced_numeric = set(categorical or ()), set(numeric or ())
    for role, names in (("categorical", forced_categorical), ("numeric", forced_numeric)):
        unknown = sorted(str(name) for name in names - set(qis))
        if unknown:
            raise ValueError(f"{role}= lists column(s) {unknown} that are not quasi-identifiers {qis}")
    both = sorted(forced_categorical & forced_numeric)
    if both:
        raise ValueError(f"column(s) {both} are listed both categorical= and numeric=")
    return {
        q: "categorical" if q in forced_categorical else "numeric" if q in forced_numeric else None for q in qis
    }


def _dimension(column: pd.Series, declared: QIKind | None) -> _Dimension:
    """Code one QI column by rank of its value (numbers by value, categories in sorted order)."""
    name = str(column.name)
    if qi_kind(column, declared) == "numeric":
        values = numeric_values(column)
        if pd.api.types.is_signed_integer_dtype(column):  # keep exact integers for the labels
            values = column.to_numpy(dtype=np.int64)
        elif pd.api.types.is_unsigned_integer_dtype(column):
            values = column.to_numpy(dtype=np.uint64)
        codes, domain = pd.factorize(values, sort=True)
        domain = np.asarray(domain)
        return _Dimension(name, True, codes.astype(np.intp), domain, float(domain[-1]) - float(domain[0]))
    codes, domain = _factorize_categories(column)
    return _Dimension(name, False, codes, domain, float(domain.size))


def _factorize_categories(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``(n,)`` and sorted distinct values ``(m,)``; values that do not compare with each other (mixed types)
    are ordered by type name, then text."""
    codes, uniques = pd.factorize(column.to_numpy(dtype=object))
    values = list(uniques)
    try:
        order = sorted(range(len(values)), key=values.__getitem__)
    except TypeError:
        order = sorted(range(len(values)), key=lambda i: (type(values[i]).__name__, str(values[i])))
    rank = np.empty(len(values), dtype=np.intp)
    rank[order] = np.arange(len(values))
    domain = np.empty(len(values), dtype=object)
    domain[:] = [values[i] for i in order]
    return rank[codes], domain


def _partition(
    dims: list[_Dimension], rows: np.ndarray, min_size: int, criteria: Criteria | None
) -> list[np.ndarray]:
    """Strict Mondrian: the final partitions (row-index arrays), each of >= ``min_size`` rows unless the root is
    smaller, and each passing ``criteria`` unless the root fails it."""
    final: list[np.ndarray] = []
    stack = [rows]
    while stack:
        part = stack.pop()
        widths = [(d.width(d.codes[part]), j) for j, d in enumerate(dims)]
        split = False
        # Widest normalised range first; fall back to the next dimension when no cut is allowable.
        for width, j in sorted(widths, key=lambda w: (-w[0], w[1])):
            if width == 0:
                break
            codes = dims[j].codes[part]
            cut = _allowable_cut(codes, part, min_size, criteria)
            if cut is not None:
                left = codes <= cut
                stack.append(part[~left])
                stack.append(part[left])
                split = True
                break
        if not split:
            final.append(part)
    return final


def _allowable_cut(codes: np.ndarray, part: np.ndarray, min_size: int, criteria: Criteria | None) -> int | None:
    """The code c splitting ``codes`` into ``<= c`` and ``> c`` closest to the median such that both sides keep
    ``min_size`` rows and pass ``criteria``'s class-level targets; ``None`` when no cut is allowable (LeFevre et al.
    2006, strict partitioning)."""
    low = int(codes.min())
    counts = np.bincount(codes - low)
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1])
    # One candidate per distinct split: a cut at a code absent from the partition repeats the previous cut.
    allowable = np.flatnonzero((counts > 0) & (cumulative >= min_size) & (total - cumulative >= min_size))
    if allowable.size == 0:
        return None
    candidates = allowable[np.argsort(np.abs(cumulative[allowable] - total / 2), kind="stable")]
    if criteria is None:
        return int(candidates[0]) + low
    # Try the cuts nearest the median first, in batches that double (the first cut usually passes).
    start, batch = 0, 1
    while start < candidates.size:
        cuts = candidates[start : start + max(1, min(batch, _BATCH_ROWS // part.size))] + low
        left = codes[None, :] <= cuts[:, None]  # (cuts, rows)
        class_ids = (2 * np.arange(cuts.size)[:, None] + ~left).ravel()
        fails = criteria.class_failures(class_ids, 2 * cuts.size, np.tile(part, cuts.size))
        passing = np.flatnonzero(~fails.reshape(cuts.size, 2).any(axis=1))
        if passing.size:
            return int(cuts[passing[0]])
        start += cuts.size
        batch *= 2
    return None


def _generalise(dim: _Dimension, codes: np.ndarray) -> tuple[str, float]:
    """Label of a partition's values on one QI and its NCP per row."""
    low, high = int(codes.min()), int(codes.max())
    if dim.numeric:
        if low == high:
            return value_text(dim.domain[low]), 0.0
        lo, hi = dim.domain[low], dim.domain[high]
        # numeric_values refuses values a float64 cannot hold, so distinct values have distinct floats: span > 0.
        return f"[{value_text(lo)}, {value_text(hi)}]", (float(hi) - float(lo)) / dim.span
    present = np.unique(codes)
    if present.size == 1:
        return value_text(dim.domain[present[0]]), 0.0
    if present.size == dim.domain.size:
        return SUPPRESSED_ALL, 1.0
    return "{" + ", ".join(value_text(v) for v in dim.domain[present]) + "}", present.size / dim.domain.size
