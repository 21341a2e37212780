"""Optimal full-domain generalisation: the lattice node of least information loss that meets the targets.

Full-domain generalisation (Samarati, IEEE TKDE 2001; LeFevre, DeWitt, Ramakrishnan, "Incognito", SIGMOD 2005)
replaces every value of a quasi-identifier by its ancestor at one level of the attribute's generalisation
hierarchy. A *node* of the generalisation lattice is one level per quasi-identifier; node ``a`` is below (a
predecessor of) node ``b`` when ``a[j] <= b[j]`` for every ``j``. At a node, rows equal on every generalised
quasi-identifier form an equivalence class.

A node *satisfies* the spec (:class:`~dp_operators.anonymity.criteria.Criteria`) when, after suppressing every
equivalence class that misses a class-level target (k, l, t, highest risk) — whole classes, as ARX does — at most
``floor(max_suppression * n)`` rows are suppressed, at least one row remains, and the release meets the table-level
targets (average risk, records at risk, marketer risk). :func:`full_domain_search` returns the satisfying node of
least information loss (:mod:`dp_operators.anonymity.loss`); ties (values within ``1e-9`` relative) go to fewer
suppressed rows, then the lowest sum of levels, then the lexicographically smallest levels. The result is the node
an exhaustive search of the whole lattice would return.

How it avoids evaluating every node, in the manner of OLA (El Emam, Dankar, Issa, Jonker, Amyot, Cogo, Corriveau,
Walker, Chowdhury, Vaillancourt, Roffey, Bottomley, "A Globally Optimal k-Anonymity Method for the
De-Identification of Health Data", JAMIA 16(5), 2009) and Flash (Kohlmayer, Prasser, Eckert, Kemper, Kuhn, "Flash:
Efficient, Stable and Optimal k-Anonymity", IEEE PASSAT 2012):

- *Lower-bound pruning* (always). With nothing suppressed, ``loss``, ``ncp`` and ``entropy`` are sums of one term
  per (column, level) (:func:`~dp_operators.anonymity.loss.separable_lower_bounds`); that sum bounds the value at the
  node and at every node above it from below. Nodes are visited in increasing bound order and the search stops once
  the bound exceeds the best value found. For ``discernibility`` the bound of a node is the largest of
  ``n^2 / (number of classes possible)`` and the unsuppressed discernibility of any evaluated node below it.
- *Dominance* (always). A node that satisfies with nothing suppressed is at least as good as every node above it
  (those satisfy too, with nothing suppressed — :meth:`Criteria.monotone` with 0 rows — and their value is at least
  its value), so they are skipped.
- *Predictive tagging* (only when :meth:`Criteria.monotone` holds for the suppression limit: k, distinct l and the
  highest risks with suppression, every target without). A satisfying node's successors satisfy and a failing
  node's predecessors fail, so the status of an unknown node is found by a binary search along a path from it to
  the top of the lattice, each evaluation tagging the nodes above (satisfying) or below (failing) it.
- *Size tagging* (when tagging is not allowed but a k or highest-risk target is). The rows in classes smaller than
  the smallest allowed size must be suppressed, and that set only shrinks up the lattice, so "they fit the limit" is
  monotone even when l, t or table-level targets are not: it is established by the same binary search, on the
  tuples alone, before a node's full evaluation.

A node is evaluated on integer codes: the generalised codes of the quasi-identifiers are combined into one int64
mixed-radix key per row, grouped with a bincount or a hash factorisation. When only size-based targets are declared
(no l or t), the rows are first reduced to their distinct quasi-identifier tuples with counts.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np
import pandas as pd

from dp_operators.anonymity.criteria import Criteria
from dp_operators.anonymity.encoding import EncodedQuasiIdentifier
from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.loss import (
    SEPARABLE_METRICS,
    ColumnCosts,
    check_metric,
    column_costs,
    information_loss,
    separable_lower_bounds,
)

#: The largest lattice searched (nodes), refused above before any search work (:func:`check_lattice_size`). Measured
#: on 2 cores, 1,000 rows, k = 5, binary quasi-identifiers without hierarchies: 2**16 nodes 2.4 s, 2**18 7 s, 2**20
#: (this limit) 15 s and 0.3 GB; 2**22 71 s and 0.7 GB (the search must classify the whole frontier of the lattice,
#: which grows with it). Time also grows with the distinct quasi-identifier tuples and with l / t targets.
MAX_LATTICE_NODES = 1 << 20
#: Values within this fraction of the best (at least this much absolute) are ties.
TIE_TOLERANCE = 1e-9

# Node status bits.
_SATISFIES = 1
_FAILS = 2
_DOMINATED = 4  # above a node that satisfies with nothing suppressed (implies _SATISFIES)
_SIZE_OK = 8  # meets the (monotone) size condition of _NodeEvaluator.size_condition
_SIZE_FAILS = 16  # misses it (implies _FAILS)


@dataclass(frozen=True)
class FullDomainResult:
    """Outcome of :func:`full_domain_search`.

    Attributes:
        quasi_identifiers: the QI names, in lattice order.
        heights: the highest level of each QI's hierarchy.
        node: the chosen level of each QI, or ``None`` when no node satisfies.
        metric: the information-loss metric minimised.
        value: its value at ``node`` (``None`` when no node satisfies).
        information_loss: all four metrics at ``node`` (:func:`~dp_operators.anonymity.loss.information_loss`), or
            ``None``.
        nodes_checked: lattice nodes whose equivalence classes were actually computed.
        lattice_size: nodes in the lattice (``prod(height + 1)``).
        rows: rows of the input table (``n``).
        max_suppression: the suppression allowance as a fraction.
        suppression_limit: the allowance in rows, ``floor(max_suppression * n)``.
        suppressed_rows: rows withheld (``n`` when no node satisfies: nothing is released).
        kept: bool mask of released rows, shape ``(n,)`` (all false when no node satisfies).
        classes: released equivalence classes.
        smallest_class: rows in the smallest released class (0 when nothing is released).
        predictive_tagging: whether the targets were monotone, so that tagging was used.
        seconds: wall-clock time of the search.
        table: the released rows (original index, suppressed rows removed) with each QI column replaced by its label
            at the chosen level (text), other columns unchanged; no rows when no node satisfies.
        reason: why no node satisfies (counts and target names only), else ``None``.
    """

    quasi_identifiers: tuple[str, ...]
    heights: tuple[int, ...]
    node: tuple[int, ...] | None
    metric: str
    value: float | int | None
    information_loss: dict[str, Any] | None
    nodes_checked: int
    lattice_size: int
    rows: int
    max_suppression: float
    suppression_limit: int
    suppressed_rows: int
    kept: np.ndarray = field(repr=False)
    classes: int
    smallest_class: int
    predictive_tagging: bool
    seconds: float
    table: pd.DataFrame = field(repr=False)
    reason: str | None = None

    @property
    def satisfied(self) -> bool:
        """Whether a node meets the targets (then ``table`` is the release)."""
        return self.node is not None

    def summary(self) -> dict[str, Any]:
        """The result as JSON-safe counts, levels and metric values (no row contents, no QI values)."""
        qis = list(self.quasi_identifiers)
        return {
            "satisfied": self.satisfied,
            "quasi_identifiers": qis,
            "node": None if self.node is None else dict(zip(qis, self.node, strict=True)),
            "heights": dict(zip(qis, self.heights, strict=True)),
            "metric": self.metric,
            "value": self.value,
            "information_loss": self.information_loss,
            "nodes_checked": self.nodes_checked,
            "lattice_size": self.lattice_size,
            "rows": self.rows,
            "max_suppression": self.max_suppression,
            "suppression_limit_rows": self.suppression_limit,
            "suppressed_rows": self.suppressed_rows,
            "released_rows": self.rows - self.suppressed_rows,
            "equivalence_classes": self.classes,
            "smallest_class": self.smallest_class,
            "predictive_tagging": self.predictive_tagging,
            "seconds": self.seconds,
            "reason": self.reason,
        }


def full_domain_search(
    table: pd.DataFrame,
    encoded: Sequence[EncodedQuasiIdentifier],
    criteria: Criteria,
    max_suppression: float = 0.0,
    metric: str = "loss",
) -> FullDomainResult:
    """Find the optimal full-domain generalisation of ``table`` that meets ``criteria`` (see the module docstring).

    Args:
        table: the input microdata, shape ``(n, any)``, ``n >= 1``.
        encoded: one encoded quasi-identifier per QI column of ``table``
            (:func:`~dp_operators.anonymity.generalisation.encode_quasi_identifiers`), each with ``n`` rows.
        criteria: the targets bound to the same table (``Criteria(spec, table)``).
        max_suppression: fraction of rows that may be withheld, a finite number in ``[0, 1]``.
        metric: ``"loss"``, ``"ncp"``, ``"discernibility"`` or ``"entropy"``
            (:mod:`dp_operators.anonymity.loss`).

    Returns:
        The :class:`FullDomainResult`; when no node satisfies, ``node`` is ``None`` and ``reason`` says why.

    Raises:
        AnonymityInputError: an unknown metric; ``max_suppression`` not a finite number in ``[0, 1]``; no encoded
            quasi-identifier, one whose name is not a column of ``table`` or is repeated, or whose row count differs
            from the table's; criteria bound to a table of another length; an empty table; targets needing classes
            larger than the table (k or the highest risk, :meth:`Criteria.check_min_class_size`); a lattice of more
            than :data:`MAX_LATTICE_NODES` nodes (:func:`check_lattice_size`).
    """
    start = time.perf_counter()
    metric = check_metric(metric)
    fraction = _check_fraction(max_suppression)
    columns = _check_encoded(table, encoded, criteria)
    n = len(table)
    limit = math.floor(fraction * n)
    check_lattice_size(columns)
    criteria.check_min_class_size()
    monotone = bool(criteria.monotone(limit))
    evaluator = _NodeEvaluator(columns, criteria, limit, metric)
    search = _LatticeSearch(evaluator, monotone, limit)
    best = search.run()

    heights = tuple(e.height for e in columns)
    names = tuple(e.name for e in columns)
    if best is None:
        reason = search.no_solution_reason(fraction)
        return FullDomainResult(
            quasi_identifiers=names, heights=heights, node=None, metric=metric, value=None, information_loss=None,
            nodes_checked=search.nodes_checked, lattice_size=search.size, rows=n, max_suppression=fraction,
            suppression_limit=limit, suppressed_rows=n, kept=np.zeros(n, dtype=bool), classes=0, smallest_class=0,
            predictive_tagging=monotone, seconds=time.perf_counter() - start, table=table.iloc[0:0].copy(),
            reason=reason,
        )

    node = tuple(int(level) for level in search.levels[best])
    outcome = evaluator.evaluate(np.asarray(node), with_mask=True)
    assert outcome.kept is not None and outcome.satisfies
    kept = outcome.kept
    released = table.loc[kept].copy()
    for e, level in zip(columns, node, strict=True):
        labels = np.asarray(e.labels[level], dtype=object)
        released[e.name] = pd.Series(labels[e.codes[level][kept]], index=released.index, dtype=object)
    losses = information_loss(columns, node, kept)
    value: float | int = losses[metric]
    return FullDomainResult(
        quasi_identifiers=names, heights=heights, node=node, metric=metric, value=value, information_loss=losses,
        nodes_checked=search.nodes_checked, lattice_size=search.size, rows=n, max_suppression=fraction,
        suppression_limit=limit, suppressed_rows=outcome.suppressed, kept=kept, classes=outcome.classes,
        smallest_class=outcome.smallest_class, predictive_tagging=monotone, seconds=time.perf_counter() - start,
        table=released,
    )


# -- argument checks ----------------------------------------------------------------------------------------------


def check_lattice_size(encoded: Sequence[EncodedQuasiIdentifier]) -> int:
    """The number of nodes of the generalisation lattice of ``encoded`` (``prod(height + 1)``), refused above
    :data:`MAX_LATTICE_NODES` before any search work.

    Args:
        encoded: the encoded quasi-identifiers, in lattice order.

    Returns:
        the lattice size in nodes.

    Raises:
        AnonymityInputError: the lattice has more than :data:`MAX_LATTICE_NODES` nodes, or a hierarchy has more
            than 126 levels.
    """
    dims = [e.height + 1 for e in encoded]
    size = math.prod(dims)
    if size > MAX_LATTICE_NODES:
        levels = ", ".join(f"{e.name}: {e.height + 1}" for e in encoded)
        raise AnonymityInputError(
            f"the generalisation lattice has {size:,} nodes ({len(dims)} quasi-identifiers; levels per "
            f"quasi-identifier: {levels}), more than the {MAX_LATTICE_NODES:,} the exact full-domain search handles "
            "in reasonable time; declare fewer quasi-identifiers, give them shorter hierarchies (fewer levels), or "
            "use anonymisation: {algorithm: mondrian}"
        )
    if max(dims) > 127:
        raise AnonymityInputError("a generalisation hierarchy has more than 126 levels; use fewer levels")
    return size


def _check_fraction(value: object) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
        raise AnonymityInputError(
            f"max_suppression must be a number in [0, 1] (a fraction of the rows), got {type(value).__name__}"
        )
    fraction = float(value)
    if not math.isfinite(fraction) or not 0.0 <= fraction <= 1.0:
        raise AnonymityInputError(f"max_suppression must be a finite fraction in [0, 1], got {fraction}")
    return fraction


def _check_encoded(
    table: pd.DataFrame, encoded: Sequence[EncodedQuasiIdentifier], criteria: Criteria
) -> list[EncodedQuasiIdentifier]:
    if not isinstance(table, pd.DataFrame):
        raise AnonymityInputError(f"table must be a pandas DataFrame, got {type(table).__name__}")
    columns = list(encoded)
    if not columns:
        raise AnonymityInputError("no quasi-identifier given: encode at least one column (encode_quasi_identifiers)")
    n = len(table)
    if n == 0:
        raise AnonymityInputError("the table is empty: there is nothing to generalise")
    names = [e.name for e in columns]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise AnonymityInputError(f"quasi-identifiers encoded more than once: {repeated}")
    for e in columns:
        if not isinstance(e, EncodedQuasiIdentifier):
            raise AnonymityInputError(f"encoded must hold EncodedQuasiIdentifier objects, got {type(e).__name__}")
        if e.name not in table.columns:
            raise AnonymityInputError(
                f"encoded quasi-identifier {e.name!r} is not a column of the table; encode the same table"
            )
        if e.rows != n:
            raise AnonymityInputError(
                f"encoded quasi-identifier {e.name!r} has {e.rows} rows but the table has {n}; encode the same table"
            )
        problem = _inconsistency(e)
        if problem:
            raise AnonymityInputError(f"encoded quasi-identifier {e.name!r} is inconsistent: {problem}")
    if criteria.rows != n:
        raise AnonymityInputError(
            f"the criteria were built on a table of {criteria.rows} rows but this table has {n}; build "
            "Criteria(spec, table) on the same table"
        )
    return columns


def _inconsistency(encoded: EncodedQuasiIdentifier) -> str | None:
    """What breaks the invariants of :class:`EncodedQuasiIdentifier`, or ``None`` (the checks of its ``validate``,
    in linear time: the search relies on codes in range and on each level being a function of the one below)."""
    n = encoded.rows
    levels = len(encoded.codes)
    if not levels or not (levels == len(encoded.labels) == len(encoded.leaf_counts) == len(encoded.spans)):
        return "codes, labels, leaf_counts and spans must have one entry per level"
    if encoded.domain_size != len(encoded.labels[0]):
        return "domain_size must equal the number of level-0 labels"
    for level, codes in enumerate(encoded.codes):
        m = len(encoded.labels[level])
        if codes.shape != (n,) or not np.issubdtype(codes.dtype, np.integer):
            return f"level {level} must hold {n} integer codes"
        if n and (codes.min() < 0 or codes.max() >= m):
            return f"level {level} has codes outside [0, {m})"
        if encoded.leaf_counts[level].shape != (m,) or encoded.spans[level].shape != (m,):
            return f"level {level}: leaf_counts and spans must have one entry per label"
        if level + 1 < levels:
            parent = np.zeros(m, dtype=np.int64)
            parent[codes] = encoded.codes[level + 1]
            if not np.array_equal(parent[codes], encoded.codes[level + 1]):
                return f"a value at level {level} generalises to two values at level {level + 1}"
    return None


# -- node evaluation ------------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    """One node evaluated. ``value`` is set when the node satisfies; ``unsuppressed`` is the metric with nothing
    suppressed (discernibility only, for the bound of the nodes above)."""

    satisfies: bool
    suppressed: int  # rows in failing classes
    failing_classes: int
    classes: int  # released classes
    smallest_class: int
    table_failures: list[str]
    value: float | int | None = None
    unsuppressed: int | None = None
    kept: np.ndarray | None = None


class _NodeEvaluator:
    """Evaluates lattice nodes of one table on integer codes.

    Classes are unions of *tuples* (the distinct combinations of original QI values) at every node, so size-based
    checks run on the tuples weighted by their row counts. Targets that look at sensitive values (l, t) are evaluated
    on the rows.
    """

    def __init__(self, columns: list[EncodedQuasiIdentifier], criteria: Criteria, limit: int, metric: str) -> None:
        self.columns = columns
        self.criteria = criteria
        self.limit = limit
        self.metric = metric
        self.rows = columns[0].rows
        self.min_class_size = criteria.min_class_size
        self.radices = [[len(labels) for labels in e.labels] for e in columns]
        tuple_of_row, tuples = _group([e.codes[0] for e in columns], [e.domain_size for e in columns])
        representative = np.empty(tuples, dtype=np.int64)
        representative[tuple_of_row] = np.arange(self.rows)
        self.tuple_of_row = tuple_of_row
        self.tuple_weights = np.bincount(tuple_of_row, minlength=tuples).astype(np.int64)
        self.tuple_codes = [[codes[representative] for codes in e.codes] for e in columns]
        self.tuples = tuples
        self.weighted = not criteria.needs_sensitive
        if self.weighted:
            self.unit_of_row: np.ndarray | None = tuple_of_row
            self.weights: np.ndarray | None = self.tuple_weights
            self.codes = self.tuple_codes
        else:
            self.unit_of_row = None
            self.weights = None
            self.codes = [list(e.codes) for e in columns]
        self.costs: list[ColumnCosts] | None = None
        self.lower_bounds: list[np.ndarray] | None = None
        if metric in SEPARABLE_METRICS:
            self.costs = [column_costs(e, metric) for e in columns]
            self.lower_bounds = separable_lower_bounds(columns, metric)
        self.scale = 1.0 if metric == "entropy" else 1.0 / (self.rows * len(columns))

    def size_condition(self, node: np.ndarray) -> bool:
        """Whether the rows in classes smaller than the smallest allowed size fit the limit and leave a row.

        A necessary condition of satisfying, and monotone for any limit: a row in a small class at a node is in a
        small class at every node below it.
        """
        levels = [int(level) for level in node]
        ids, count = _group(
            [self.tuple_codes[j][level] for j, level in enumerate(levels)],
            [self.radices[j][level] for j, level in enumerate(levels)],
        )
        sizes = np.bincount(ids, weights=self.tuple_weights, minlength=count).round().astype(np.int64)
        small = int(sizes[sizes < self.min_class_size].sum())
        return small <= self.limit and small < self.rows

    def lower_bound(self, node: np.ndarray) -> float:
        assert self.lower_bounds is not None
        return float(sum(bounds[level] for bounds, level in zip(self.lower_bounds, node, strict=True)))

    def evaluate(self, node: np.ndarray, with_mask: bool = False) -> _Outcome:
        levels = [int(level) for level in node]
        ids, count = _group(
            [self.codes[j][level] for j, level in enumerate(levels)],
            [self.radices[j][level] for j, level in enumerate(levels)],
        )
        if self.weights is None:
            sizes = np.bincount(ids, minlength=count).astype(np.int64)
            failing = np.asarray(self.criteria.class_failures(ids, count), dtype=bool)
        else:
            sizes = np.bincount(ids, weights=self.weights, minlength=count).round().astype(np.int64)
            failing = sizes < self.min_class_size
        suppressed = int(sizes[failing].sum())
        released = sizes[~failing]
        outcome = _Outcome(
            satisfies=False,
            suppressed=suppressed,
            failing_classes=int(np.count_nonzero(failing)),
            classes=int(released.size),
            smallest_class=int(released.min()) if released.size else 0,
            table_failures=[],
        )
        if self.metric == "discernibility":
            outcome.unsuppressed = int((sizes * sizes).sum())
        if suppressed > self.limit or released.size == 0:
            return outcome
        outcome.table_failures = list(self.criteria.table_failures(released))
        if outcome.table_failures:
            return outcome
        outcome.satisfies = True
        unit_failing = failing[ids]
        if self.metric == "discernibility":
            outcome.value = int((released * released).sum()) + suppressed * self.rows
        else:
            assert self.costs is not None
            penalty = 0.0
            if suppressed:
                failed_units = np.flatnonzero(unit_failing)
                weights = np.ones(failed_units.size) if self.weights is None else self.weights[failed_units]
                for j, level in enumerate(levels):
                    costs = self.costs[j]
                    cells = costs.top - costs.value_cost[level][self.codes[j][level][failed_units]]
                    penalty += float((weights * cells).sum())
            outcome.value = self.lower_bound(np.asarray(levels)) + penalty * self.scale
        if with_mask:
            kept_units = ~unit_failing
            outcome.kept = kept_units if self.unit_of_row is None else kept_units[self.unit_of_row]
        return outcome


def _group(columns: list[np.ndarray], radices: list[int]) -> tuple[np.ndarray, int]:
    """Class id of each unit (units equal on every column share one), shape ``(m,)`` int64, and the class count.

    Codes are combined into one mixed-radix int64 key; when the product of the radices would overflow, the partial
    key is first renumbered to its distinct values. Small key ranges are grouped with a bincount, large ones hashed.
    """
    m = int(columns[0].size)
    key = np.zeros(m, dtype=np.int64)
    span = 1
    for codes, radix in zip(columns, radices, strict=True):
        if radix == 1:
            continue
        if span * radix >= 1 << 62:
            key, uniques = pd.factorize(key)
            key = key.astype(np.int64)
            span = len(uniques)
        key = key * radix + codes
        span *= radix
    if span <= max(1 << 16, 4 * m):
        present = np.bincount(key, minlength=span) > 0
        renumber = np.cumsum(present) - 1
        return renumber[key], int(renumber[-1]) + 1 if span else 0
    ids, uniques = pd.factorize(key)
    return ids.astype(np.int64), len(uniques)


# -- the search -----------------------------------------------------------------------------------------------------


def _tie(value: float | int, metric: str) -> float:
    if metric == "discernibility":
        return 0.0  # integers, compared exactly
    return TIE_TOLERANCE * max(1.0, abs(float(value)))


class _LatticeSearch:
    """The traversal: visits nodes in increasing lower-bound order, with pruning, dominance and (when monotone)
    predictive tagging with binary searches along paths to the top."""

    def __init__(self, evaluator: _NodeEvaluator, monotone: bool, limit: int) -> None:
        self.evaluator = evaluator
        self.monotone = monotone
        self.limit = limit
        self.metric = evaluator.metric
        columns = evaluator.columns
        self.dims = tuple(e.height + 1 for e in columns)
        size = check_lattice_size(columns)
        self.size = size
        self.levels = np.indices(self.dims, dtype=np.int8).reshape(len(self.dims), -1).T.copy()
        self.strides = np.array([math.prod(self.dims[j + 1 :]) for j in range(len(self.dims))], dtype=np.int64)
        self.stride_list = [int(stride) for stride in self.strides]
        self.tops = np.array([d - 1 for d in self.dims], dtype=np.int8)
        self.level_sums = self.levels.sum(axis=1, dtype=np.int64)
        if self.metric in SEPARABLE_METRICS:
            assert evaluator.lower_bounds is not None
            bound = np.zeros(size)
            for j, terms in enumerate(evaluator.lower_bounds):
                bound += terms[self.levels[:, j]]
            # Path steps: raise first the column whose bound rises least.
            self.step_cost = [np.diff(terms) for terms in evaluator.lower_bounds]
        else:
            # Discernibility: at least n^2 / (classes possible) (Cauchy-Schwarz), classes <= distinct tuples.
            n = evaluator.rows
            possible = np.ones(size)
            for j, radices in enumerate(evaluator.radices):
                possible *= np.asarray(radices, dtype=np.float64)[self.levels[:, j]]
            possible = np.minimum(possible, float(evaluator.tuples))
            bound = np.floor(float(n) * n / possible)
            self.step_cost = [-np.diff(np.log(np.asarray(r, dtype=np.float64))) for r in evaluator.radices]
        self.initial_bound = bound
        self.bound = bound.copy()
        self.state = np.zeros(size, dtype=np.int8)
        self.outcomes: dict[int, _Outcome] = {}
        self.checked: set[int] = set()
        # Without tagging, the monotone size condition still rules out nodes in bulk (when a size target exists).
        self.size_tagging = not monotone and evaluator.min_class_size > 1
        self.best_value: float | int | None = None
        self.candidates: list[tuple[float | int, int, int]] = []  # (value, suppressed rows, node index)

    # -- tagging --------------------------------------------------------------------------------------------------

    def _spread(self, index: int, up: bool, reached: Any, mark: Any, include_start: bool = True) -> None:
        """Apply ``mark`` to ``index`` (when ``include_start``) and to every node above (``up``) or below it that
        ``reached`` does not already report, walking level by level through immediate successors / predecessors.

        ``reached(nodes) -> bool mask`` must describe an up-closed (``up``) or down-closed set — once a node is in
        it, so is every node above (below) it — so the walk stops there. The cost is proportional to the nodes newly
        marked times the number of quasi-identifiers, not to the lattice size.
        """
        frontier = np.array([index], dtype=np.int64)
        if include_start:
            mark(frontier)
        strides = self.strides if up else -self.strides
        while frontier.size:
            levels = self.levels[frontier]
            movable = levels < self.tops if up else levels > 0
            following = (frontier[:, None] + strides[None, :])[movable]
            if following.size == 0:
                break
            following = np.unique(following)
            following = following[~reached(following)]
            if following.size:
                mark(following)
            frontier = following

    def _tag(self, index: int, up: bool, bits: int, closed: int, include_start: bool = True) -> None:
        """Set ``bits`` on ``index`` and every node above (``up``) or below it; ``closed`` is a status bit whose set
        of nodes is up-closed (down-closed), so the walk stops at nodes that have it."""
        state = self.state

        def reached(nodes: np.ndarray) -> np.ndarray:
            return (state[nodes] & closed) != 0

        def mark(nodes: np.ndarray) -> None:
            state[nodes] |= bits

        self._spread(index, up, reached, mark, include_start)

    def _raise_bound_above(self, index: int, value: float) -> None:
        """Raise the bound of ``index`` and every node above it to at least ``value`` (the bound is non-decreasing
        up the lattice, so the walk stops at nodes already at ``value``)."""
        bound = self.bound

        def reached(nodes: np.ndarray) -> np.ndarray:
            return bound[nodes] >= value

        def mark(nodes: np.ndarray) -> None:
            bound[nodes] = np.maximum(bound[nodes], value)

        self._spread(index, True, reached, mark)

    def _evaluate(self, index: int) -> _Outcome:
        outcome = self.evaluator.evaluate(self.levels[index])
        self.outcomes[index] = outcome
        self.checked.add(index)
        if outcome.satisfies:
            if self.monotone:
                self._tag(index, up=True, bits=_SATISFIES, closed=_SATISFIES)
            else:
                self.state[index] |= _SATISFIES
            assert outcome.value is not None
            self._candidate(index, outcome.value, outcome.suppressed)
        else:
            if self.monotone:
                self._tag(index, up=False, bits=_FAILS, closed=_FAILS)
            else:
                self.state[index] |= _FAILS
        if outcome.unsuppressed is not None:
            self._raise_bound_above(index, float(outcome.unsuppressed))
        return outcome

    def _candidate(self, index: int, value: float | int, suppressed: int) -> None:
        self.candidates.append((value, suppressed, index))
        if self.best_value is None or value < self.best_value:
            self.best_value = value
        if suppressed == 0:
            # Every node above satisfies with nothing suppressed, at a value >= this one, and loses the tie-break.
            self._tag(index, up=True, bits=_DOMINATED | _SATISFIES, closed=_DOMINATED, include_start=False)

    def _beyond_best(self, bound: float) -> bool:
        best = self.best_value
        return best is not None and bound > float(best) + _tie(best, self.metric)

    # -- traversal --------------------------------------------------------------------------------------------------

    def run(self) -> int | None:
        """Index of the optimal node, or ``None`` when no node satisfies."""
        top = self.size - 1
        if self.monotone and not self._evaluate(top).satisfies:
            return None  # every node is below the top: none satisfies
        order = np.lexsort((np.arange(self.size), self.level_sums, self.initial_bound))
        for index in order.tolist():
            if self._beyond_best(self.initial_bound[index]):
                break  # sorted by this bound: no later node can reach the best value
            state = self.state[index]
            if state & (_FAILS | _DOMINATED) or index in self.outcomes or self._beyond_best(self.bound[index]):
                continue
            if not state & _SATISFIES:
                if not self.monotone:
                    if self.size_tagging and not self._classify(index, size=True):
                        continue
                    self._evaluate(index)
                    continue
                self._classify(index)
                if index in self.outcomes or not self.state[index] & _SATISFIES:
                    continue
            # Tagged as satisfying without an evaluation.
            if self.limit == 0 and self.metric in SEPARABLE_METRICS:
                self._candidate(index, float(self.initial_bound[index]), 0)  # nothing suppressed: value = bound
            else:
                self._evaluate(index)
        return self._choose()

    @property
    def nodes_checked(self) -> int:
        """Distinct nodes whose equivalence classes were computed."""
        return len(self.checked)

    def _evaluate_size(self, index: int) -> None:
        """Evaluate the size condition only, and tag: it holds above a node that meets it, fails below one that
        does not (then the node fails)."""
        self.checked.add(index)
        if self.evaluator.size_condition(self.levels[index]):
            self._tag(index, up=True, bits=_SIZE_OK, closed=_SIZE_OK)
        else:
            self._tag(index, up=False, bits=_SIZE_FAILS | _FAILS, closed=_SIZE_FAILS)

    def _classify(self, index: int, size: bool = False) -> bool:
        """Binary search along a path from ``index`` to the top for the lowest node that satisfies (monotone
        targets) or meets the size condition (``size``); every evaluation tags. Returns whether ``index`` does."""
        good, bad = (_SIZE_OK, _SIZE_FAILS) if size else (_SATISFIES, _FAILS)
        evaluate = self._evaluate_size if size else self._evaluate
        path = [index]
        current = self.levels[index].tolist()
        position = index
        # Greedy path: always raise the column whose next step costs least (ties: the first column); a heap of
        # each raisable column's next step keeps this O(path length x log(QIs)).
        steps = [(float(self.step_cost[j][level]), j) for j, level in enumerate(current) if level + 1 < self.dims[j]]
        heapq.heapify(steps)
        while steps:
            _, column = heapq.heappop(steps)
            current[column] += 1
            position += self.stride_list[column]
            path.append(position)
            if current[column] + 1 < self.dims[column]:
                heapq.heappush(steps, (float(self.step_cost[column][current[column]]), column))
        low, high = -1, len(path)  # path[low] fails, path[high] is good (virtual ends)
        for place, node in enumerate(path):
            if self.state[node] & good:
                high = place
                break
        for place in range(high - 1, -1, -1):
            if self.state[path[place]] & bad:
                low = place
                break
        while high - low > 1:
            middle = (low + high) // 2
            node = path[middle]
            if not self.state[node] & (good | bad):
                evaluate(node)
            if self.state[node] & good:
                high = middle
            else:
                low = middle
        return high == 0

    def _choose(self) -> int | None:
        if self.best_value is None:
            return None
        threshold = float(self.best_value) + _tie(self.best_value, self.metric)
        ties = [(suppressed, int(self.level_sums[index]), index) for value, suppressed, index in self.candidates
                if value <= threshold]
        return min(ties)[2]

    def no_solution_reason(self, fraction: float) -> str:
        """Why no node satisfies, from the top node's evaluation (the most general release)."""
        top = self.size - 1
        outcome = self.outcomes.get(top)
        if outcome is None:
            outcome = self._evaluate(top)
        evaluator = self.evaluator
        n = evaluator.rows
        where = (
            f"no node of the {self.size}-node generalisation lattice meets the targets with at most {self.limit} "
            f"suppressed rows (max_suppression {fraction:g} of {n} rows)"
        )
        if outcome.suppressed > self.limit or outcome.classes == 0:
            failing = self._failing_targets()
            return (
                f"{where}: even with every quasi-identifier at its highest level, {outcome.suppressed} rows are in "
                f"{outcome.failing_classes} equivalence class(es) missing class-level targets ({', '.join(failing)}); "
                "relax the targets, allow more suppression, or check the sensitive attributes"
            )
        return (
            f"{where}: at the highest levels the release misses the table-level target(s) "
            f"{', '.join(outcome.table_failures)}; relax them or allow more suppression"
        )

    def _failing_targets(self) -> list[str]:
        """Names of the class-level targets some class misses at the top node."""
        evaluator = self.evaluator
        ids, count = _group([e.codes[-1] for e in evaluator.columns], [len(e.labels[-1]) for e in evaluator.columns])
        evaluation = evaluator.criteria.evaluate(ids, count)
        return [name for name, mask in evaluation.failing.items() if np.any(mask)] or ["none"]
