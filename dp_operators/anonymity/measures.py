"""k-anonymity, l-diversity and t-closeness of a microdata table.

A table (``pandas.DataFrame``, one row per person) has declared quasi-identifiers (QIs: columns an attacker may
link with outside data) and sensitive attributes. Rows that agree on every QI form an *equivalence class*.

- k-anonymity (Sweeney, "k-Anonymity: A Model for Protecting Privacy", IJUFKS 10(5), 2002): ``k`` is the size of
  the smallest equivalence class.
- l-diversity (Machanavajjhala, Gehrke, Kifer, Venkitasubramaniam, "l-Diversity: Privacy Beyond k-Anonymity",
  ICDE 2006; TKDD 1(1), 2007): *distinct* l is the fewest distinct sensitive values in a class; *entropy* l is
  ``exp(min over classes of H(class))`` with ``H = -sum p log p`` (a table is entropy l-diverse iff every class has
  ``H >= log l``); *recursive (c, l)*: with the class's value counts sorted ``r_1 >= r_2 >= ... >= r_m``, a class
  is recursive (c, l)-diverse iff ``r_1 < c * (r_l + r_{l+1} + ... + r_m)``.
- t-closeness (Li, Li, Venkatasubramanian, "t-Closeness: Privacy Beyond k-Anonymity and l-Diversity", ICDE 2007):
  ``t`` is the largest Earth Mover's Distance between a class's sensitive-value distribution ``Q`` and the whole
  table's ``P``. Ground distances (section 4.2): *ordered* (values ranked ``v_1 < ... < v_m``, distance
  ``|i - j| / (m - 1)``, so EMD ``= sum_{i<m} |sum_{j<=i} (p_j - q_j)| / (m - 1)``); *equal* (every pair at
  distance 1, so EMD = total variation ``= sum |p_i - q_i| / 2``); *hierarchical* (``level(v_i, v_j) / H`` in a
  declared generalisation tree, EMD computed bottom-up from each node's extra mass).

The domain of an ordered or equal-distance attribute is the set of values present in the table (as in the paper's
examples), or the declared ``order`` / hierarchy leaves when one is given.

Everything here is pure pandas/numpy. Results are plain Python ``int``/``float``. Missing values are refused
(:class:`~dp_operators.anonymity.errors.AnonymityInputError`) rather than silently grouped or dropped.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Literal

import numpy as np
import pandas as pd

from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.hierarchy import ValueHierarchy

Distance = Literal["ordered", "equal", "hierarchical"]


def check_columns(table: pd.DataFrame, columns: Sequence[str], role: str) -> None:
    """Refuse an empty table, unknown columns, missing values and unhashable cells in ``columns``.

    Every entry point that groups or encodes quasi-identifiers or sensitive attributes (``check_table``,
    ``anonymise`` with either algorithm, ``mondrian``, ``encode_quasi_identifiers``, the measures here, the criteria
    evaluator) calls this first, so bad cells are refused here, once, for all of them.

    Args:
        table: the microdata, shape ``(n, any)``.
        columns: column names that must exist and be complete.
        role: what the columns are (``"quasi-identifier"``, ``"sensitive attribute"``), for the message.

    Raises:
        AnonymityInputError: no rows, no columns declared, a column is absent (or is named by a number where the
            spec gives text), a column name appears more than once in the table, a column has missing values
            (NaN/None/NaT), or a column has cells that cannot be grouped (lists, dicts, sets, arrays: what
            ``pandas.read_parquet`` returns for nested Parquet columns); the message gives the column and the number
            of such cells, never their values.
    """
    if not columns:
        raise AnonymityInputError(f"no {role} declared")
    unknown = [c for c in columns if c not in table.columns]
    if unknown:
        # A column named by the integer 5 prints like the spec's "5": say which, rather than list "5" as present.
        wanted = {str(c) for c in unknown}
        not_text = [f"{c!r} ({type(c).__name__})" for c in table.columns if not isinstance(c, str) and str(c) in wanted]
        hint = (
            f"; the table's column(s) {', '.join(not_text)} are not named by text, as spec names are: rename the "
            "table's columns to text (table.columns = table.columns.map(str))"
            if not_text
            else ""
        )
        raise AnonymityInputError(
            f"unknown {role} column(s) {unknown}; the table has columns {[str(c) for c in table.columns]}{hint}"
        )
    occurrences = table.columns.value_counts()
    repeated = [c for c in dict.fromkeys(columns) if int(occurrences.get(c, 0)) > 1]
    if repeated:
        raise AnonymityInputError(
            f"{role} column(s) {repeated} appear more than once in the table (as a SQL join selecting a.x, b.x "
            "returns), so it is ambiguous which one is meant; rename or drop the repeated columns (for example "
            "alias them in the query)"
        )
    if len(table) == 0:
        raise AnonymityInputError("the table is empty: there is nothing to check")
    for column in columns:
        missing = int(table[column].isna().sum())
        if missing:
            raise AnonymityInputError(
                f"{role} column {column!r} has {missing} missing value(s) (NaN/None); drop those rows before the "
                "check, or fill them with an explicit value (for example 'unknown') and, if the column has a "
                "generalisation hierarchy or a declared order, add that value to it"
            )
        unhashable = _unhashable_cells(table[column])
        if unhashable:
            raise AnonymityInputError(
                f"{role} column {column!r} has {unhashable} cell(s) holding a list, dict, set or array (as "
                "pandas.read_parquet returns for nested Parquet columns), which cannot be compared or grouped; "
                "flatten the column into plain values (one column per field) or convert each cell to text"
            )


def _unhashable_cells(column: pd.Series) -> int:
    """The number of cells of ``column`` that cannot be hashed (so neither grouped nor encoded): lists, dicts, sets,
    arrays, tuples holding them, and every cell of a nested Arrow column (struct, list, map)."""
    dtype = column.dtype
    if isinstance(dtype, pd.ArrowDtype):
        import pyarrow as pa  # pandas' Arrow dtypes need pyarrow, so it is installed when one is seen

        return int(column.notna().sum()) if pa.types.is_nested(dtype.pyarrow_dtype) else 0
    if dtype != object:
        return 0
    cells = column.to_numpy(dtype=object)
    try:
        pd.unique(cells)  # one hash-table pass (C speed): fine for the usual column of hashable cells
    except TypeError:
        return sum(1 for cell in cells if not _hashable(cell))
    return 0


def _hashable(cell: object) -> bool:
    try:
        hash(cell)
    except TypeError:
        return False
    return True


@dataclass(frozen=True)
class EquivalenceClasses:
    """The partition of rows by their quasi-identifier values.

    Attributes:
        class_ids: class index of each row, shape ``(n,)``, values in ``[0, n_classes)``.
        sizes: number of rows in each class, shape ``(n_classes,)``.
    """

    class_ids: np.ndarray
    sizes: np.ndarray

    @property
    def n_classes(self) -> int:
        return int(self.sizes.size)

    @property
    def k(self) -> int:
        """Size of the smallest class (Sweeney 2002)."""
        return int(self.sizes.min())


def equivalence_classes(table: pd.DataFrame, quasi_identifiers: Sequence[str]) -> EquivalenceClasses:
    """Group the rows of ``table`` by ``quasi_identifiers``.

    Raises:
        AnonymityInputError: see :func:`check_columns`.
    """
    qis = list(quasi_identifiers)
    check_columns(table, qis, "quasi-identifier")
    class_ids = table.groupby(qis, sort=False, dropna=False, observed=True).ngroup().to_numpy(dtype=np.intp)
    return EquivalenceClasses(class_ids=class_ids, sizes=np.bincount(class_ids).astype(np.int64))


@dataclass(frozen=True)
class ViolatingClasses:
    """Equivalence classes smaller than a target k: sizes and counts only, never their QI values.

    Attributes:
        target_k: the k they violate.
        classes: number of classes with fewer than ``target_k`` rows.
        rows: number of rows in those classes.
        size_counts: ``{class size: number of classes of that size}`` for the violating sizes, ascending.
    """

    target_k: int
    classes: int
    rows: int
    size_counts: dict[int, int]


def violating_classes(classes: EquivalenceClasses, target_k: int) -> ViolatingClasses:
    """Summarise the classes with fewer than ``target_k`` rows (Sweeney 2002)."""
    small = classes.sizes[classes.sizes < target_k]
    sizes, counts = np.unique(small, return_counts=True)
    return ViolatingClasses(
        target_k=int(target_k),
        classes=int(small.size),
        rows=int(small.sum()),
        size_counts={int(s): int(c) for s, c in zip(sizes, counts)},
    )


@dataclass(frozen=True)
class SensitiveDistribution:
    """Per-class counts of one sensitive attribute, in sparse form.

    Values are coded ``0 .. m-1`` (ranked for an ordered attribute, leaf indices for a hierarchy).

    Attributes:
        n_values: ``m``, the size of the value domain.
        table_counts: count of each value in the whole table, shape ``(m,)``.
        class_sizes: rows per class, shape ``(n_classes,)``.
        pair_class, pair_code, pair_count: one entry per (class, value) present, sorted by class then code,
            shape ``(n_pairs,)`` each.
    """

    n_values: int
    table_counts: np.ndarray
    class_sizes: np.ndarray
    pair_class: np.ndarray
    pair_code: np.ndarray
    pair_count: np.ndarray

    @classmethod
    def from_codes(cls, classes: EquivalenceClasses, codes: np.ndarray, n_values: int) -> SensitiveDistribution:
        """Build from each row's class and value code (``codes`` shape ``(n,)``, values in ``[0, n_values)``)."""
        keys = classes.class_ids.astype(np.int64) * n_values + codes.astype(np.int64)
        unique_keys, counts = np.unique(keys, return_counts=True)
        return cls(
            n_values=int(n_values),
            table_counts=np.bincount(codes, minlength=n_values).astype(np.int64),
            class_sizes=classes.sizes,
            pair_class=(unique_keys // n_values).astype(np.intp),
            pair_code=(unique_keys % n_values).astype(np.intp),
            pair_count=counts.astype(np.int64),
        )

    @property
    def n_classes(self) -> int:
        return int(self.class_sizes.size)

    def class_distinct_counts(self) -> np.ndarray:
        """Distinct sensitive values per class, shape ``(n_classes,)`` (Machanavajjhala et al. 2006, distinct l)."""
        return np.bincount(self.pair_class, minlength=self.n_classes)

    def class_entropies(self) -> np.ndarray:
        """Shannon entropy (natural log) of each class's distribution, shape ``(n_classes,)``."""
        p = self.pair_count / self.class_sizes[self.pair_class]
        return np.bincount(self.pair_class, weights=-p * np.log(p), minlength=self.n_classes)

    def class_entropy_l_met(
        self, l: float, entropy: np.ndarray | None = None, distinct: np.ndarray | None = None
    ) -> np.ndarray:
        """Whether each class is entropy l-diverse, ``H >= log l``, decided exactly; bool, shape ``(n_classes,)``.

        A class of ``n`` rows with value counts ``c_i`` has ``exp(H) = prod (n / c_i)^(c_i / n)``, so with
        ``l = a / b`` in lowest terms and ``g = gcd(c_i)`` the test is, raising both sides to the power ``n / g``,
        the integer comparison ``(n b)^(n / g) >= a^(n / g) prod c_i^(c_i / g)`` (Machanavajjhala et al. 2006,
        definition 4.1). The float entropy decides every class farther from ``log l`` than its rounding error
        (:func:`_entropy_rounding_bound`); only the others, such as three equally common values against ``l = 3``,
        take the integer test, so a class exactly at ``l`` passes and one below it by any amount fails.

        ``entropy`` and ``distinct``, when given, are :meth:`class_entropies` and :meth:`class_distinct_counts`
        already computed (the criteria evaluator has them), which saves computing them again.
        """
        entropy = self.class_entropies() if entropy is None else entropy
        distinct = self.class_distinct_counts() if distinct is None else distinct
        log_l = math.log(l)
        met = entropy >= log_l
        bound = _entropy_rounding_bound(distinct, np.maximum(entropy, log_l))
        close = np.flatnonzero(np.abs(entropy - log_l) <= bound)
        if close.size:
            a, b = Fraction(l).as_integer_ratio()
            decided: dict[tuple[int, ...], bool] = {}
            for cls, counts in zip(close, self._class_counts(close)):
                key = tuple(sorted(counts))
                if key not in decided:
                    decided[key] = _perplexity_at_least(list(key), a, b)
                met[cls] = decided[key]
        return met

    def entropy_l(self) -> float:
        """Entropy l of the partition: ``min over classes of exp(H)``, correctly rounded to a float (so exactly
        ``3.0`` for three equally common values); ``inf`` when there is no class.

        The float entropies pick the classes within rounding error of the smallest; each of those is recomputed
        in 40-digit decimal arithmetic (``exp(log n - sum c_i log c_i / n)``, every step correctly rounded) before
        the minimum is converted to a float. The result is the float nearest the true value unless that value lies
        within about 1e-35 of halfway between two floats (a whole number never does).
        """
        if self.n_classes == 0:
            return math.inf
        entropy = self.class_entropies()
        bound = _entropy_rounding_bound(self.class_distinct_counts(), entropy)
        smallest = float(entropy.min())
        candidates = np.flatnonzero(entropy - bound <= smallest + float(bound.max()))
        with localcontext() as context:
            context.prec = 40
            logs: dict[int, Decimal] = {}

            def log_of(count: int) -> Decimal:
                if count not in logs:
                    logs[count] = Decimal(count).ln()
                return logs[count]

            values = []
            for counts in {tuple(sorted(c)) for c in self._class_counts(candidates)}:  # equal counts, equal value
                n = sum(counts)
                weighted = sum((Decimal(c) * log_of(c) for c in counts), Decimal(0))
                values.append((log_of(n) - weighted / n).exp())
            return float(min(values))

    def select_classes(self, keep: np.ndarray) -> SensitiveDistribution:
        """The distribution of the kept classes only (renumbered in order); ``keep`` is a bool mask
        ``(n_classes,)``. The table counts (``P``) stay those of the whole table."""
        new_class = np.cumsum(keep) - 1
        kept_pairs = keep[self.pair_class]
        return SensitiveDistribution(
            n_values=self.n_values,
            table_counts=self.table_counts,
            class_sizes=self.class_sizes[keep],
            pair_class=new_class[self.pair_class[kept_pairs]].astype(np.intp),
            pair_code=self.pair_code[kept_pairs],
            pair_count=self.pair_count[kept_pairs],
        )

    def _class_counts(self, classes: np.ndarray) -> list[list[int]]:
        """The value counts of each of ``classes`` (class indices), as lists of Python ints."""
        starts = np.searchsorted(self.pair_class, classes, side="left")
        ends = np.searchsorted(self.pair_class, classes, side="right")
        return [self.pair_count[start:end].tolist() for start, end in zip(starts, ends)]

    def class_recursive_ratios(self, l: int) -> np.ndarray:
        """``r_1 / (r_l + ... + r_m)`` per class, shape ``(n_classes,)``; ``inf`` where the class has fewer than
        ``l`` distinct values. A class is recursive (c, l)-diverse iff its ratio is ``< c``
        (Machanavajjhala et al. 2006, definition 4.4)."""
        if l < 1:
            raise ValueError(f"l must be >= 1, got {l}")
        order = np.lexsort((-self.pair_count, self.pair_class))
        cls_sorted = self.pair_class[order]
        count_sorted = self.pair_count[order]
        starts = np.searchsorted(cls_sorted, np.arange(self.n_classes))
        rank = np.arange(cls_sorted.size) - starts[cls_sorted]
        r1 = count_sorted[rank == 0]  # one per class, in class order
        tail = np.bincount(cls_sorted, weights=np.where(rank >= l - 1, count_sorted, 0), minlength=self.n_classes)
        with np.errstate(divide="ignore"):
            return np.where(tail > 0, r1 / np.where(tail > 0, tail, 1), np.inf)

    def class_emd_ordered(self) -> np.ndarray:
        """EMD to the table distribution under the ordered distance, shape ``(n_classes,)`` (Li et al. 2007, 4.2).

        Computed without a dense class-by-value matrix: the class CDF is a step function and the table CDF is
        monotone, so each step's ``sum |c - P_i|`` splits at ``searchsorted(P, c)`` and uses prefix sums of ``P``.
        Cost ``O(n_pairs log m)``, so attributes with tens of thousands of distinct values are fine.
        """
        m = self.n_values
        if m == 1:
            return np.zeros(self.n_classes)
        p_cdf = np.cumsum(self.table_counts) / self.table_counts.sum()
        # Only positions 0..m-2 enter the sum; prefix[i] = sum_{j < i} p_cdf[j].
        p_used = p_cdf[: m - 1]
        prefix = np.concatenate(([0.0], np.cumsum(p_used)))
        cls, code, count = self.pair_class, self.pair_code, self.pair_count
        class_start = np.searchsorted(cls, np.arange(self.n_classes))
        running = np.cumsum(count)
        before_class = np.where(class_start > 0, running[class_start - 1], 0)
        q_cdf = (running - before_class[cls]) / self.class_sizes[cls]
        is_last = np.ones(cls.size, dtype=bool)
        is_last[:-1] = cls[1:] != cls[:-1]
        seg_end = np.where(is_last, m - 1, np.roll(code, -1))
        seg_start = np.minimum(code, m - 1)
        seg_end = np.maximum(seg_end, seg_start)
        cross = np.clip(np.searchsorted(p_used, q_cdf, side="left"), seg_start, seg_end)
        seg_sum = (
            q_cdf * (cross - seg_start)
            - (prefix[cross] - prefix[seg_start])
            + (prefix[seg_end] - prefix[cross])
            - q_cdf * (seg_end - cross)
        )
        # Before the class's first value its CDF is 0, so |0 - P_i| = P_i.
        first_code = code[class_start]
        head = prefix[np.minimum(first_code, m - 1)]
        total = np.bincount(cls, weights=seg_sum, minlength=self.n_classes) + head
        return total / (m - 1)

    def class_emd_equal(self) -> np.ndarray:
        """EMD under the equal distance, i.e. total variation ``sum |p_i - q_i| / 2``, shape ``(n_classes,)``
        (Li et al. 2007, 4.2)."""
        p = self.table_counts / self.table_counts.sum()
        q = self.pair_count / self.class_sizes[self.pair_class]
        p_present = p[self.pair_code]
        present = np.bincount(self.pair_class, weights=np.abs(q - p_present), minlength=self.n_classes)
        mass_present = np.bincount(self.pair_class, weights=p_present, minlength=self.n_classes)
        return 0.5 * (present + (1.0 - mass_present))

    def class_emd_hierarchical(self, hierarchy: ValueHierarchy) -> np.ndarray:
        """EMD under the hierarchical distance ``level(v_i, v_j) / H``, shape ``(n_classes,)``.

        Li et al. 2007, 4.2: ``extra(N) = sum over leaves under N of (q_i - p_i)``; for an internal node,
        ``pos_extra``/``neg_extra`` sum the positive / absolute negative extras of its children and
        ``cost(N) = height(N) / H * min(pos_extra, neg_extra)``; the EMD is the sum of the costs. ``height(N)`` is
        ``H - depth(N)``, which is the paper's height in a balanced tree.
        """
        m = self.n_values
        if m != len(hierarchy.leaves):
            raise ValueError("codes were not built from this hierarchy")
        p = self.table_counts / self.table_counts.sum()
        diff = np.zeros((self.n_classes, m))
        np.add.at(diff, (self.pair_class, self.pair_code), self.pair_count / self.class_sizes[self.pair_class])
        diff -= p
        extra = diff @ hierarchy.descendant_matrix()  # (n_classes, n_nodes)
        n_nodes = len(hierarchy.nodes)
        parent = np.asarray(hierarchy.parent)
        child = np.flatnonzero(parent >= 0)
        pos = np.zeros((self.n_classes, n_nodes))
        neg = np.zeros((self.n_classes, n_nodes))
        np.add.at(pos.T, parent[child], np.maximum(extra[:, child], 0.0).T)
        np.add.at(neg.T, parent[child], np.maximum(-extra[:, child], 0.0).T)
        node_height = (hierarchy.height - np.asarray(hierarchy.depth)) / hierarchy.height
        return (np.minimum(pos, neg) * node_height).sum(axis=1)


def _entropy_rounding_bound(distinct: np.ndarray, entropy: np.ndarray) -> np.ndarray:
    """A bound, far above the actual float error, on ``|float H - H|`` for classes with ``distinct`` values and
    entropy about ``entropy`` (both shape ``(n_classes,)``).

    Each term ``-p log p`` is off by a few units in the last place of ``p (1 + |log p|)`` and the sum adds one
    rounding per term, so the error is below ``(distinct + 2) * (H + 1) * 4 * 2**-52``; ``2**-40`` in place of
    ``4 * 2**-52`` leaves a margin of a thousand, still small enough that only classes within about
    ``1e-12 * distinct`` of ``log l`` take the exact test.
    """
    return 2.0**-40 * (distinct + 2) * (entropy + 1.0)


#: Above this many bits the integers of the exact entropy l test cost more than a few tenths of a second (a class of
#: 10**6 rows with coprime counts needs 2 * 10**7 bits and took 15 s), and the test is made in decimal arithmetic instead.
_EXACT_TEST_BITS = 2**20

#: Digits of that decimal arithmetic; a difference of logs below 10**-45 of their size counts as equality.
_DECIMAL_TEST_DIGITS = 60


def _perplexity_at_least(counts: list[int], a: int, b: int) -> bool:
    """Whether a class with value counts ``counts`` has ``exp(H) >= a / b`` (see
    :meth:`SensitiveDistribution.class_entropy_l_met`).

    Exact integer arithmetic while the integers stay below :data:`_EXACT_TEST_BITS`; beyond (only classes of tens of
    thousands of rows whose counts share no large factor), ``n log(n b / a) >= sum c_i log c_i`` in
    :data:`_DECIMAL_TEST_DIGITS`-digit arithmetic, which still decides equal frequencies as equal and tells any
    class distribution apart from ``l`` unless its ``exp(H)`` agrees with ``l`` to some 45 digits.
    """
    n = sum(counts)
    g = math.gcd(*counts)
    power = n // g
    if power * (n * max(a, b)).bit_length() <= _EXACT_TEST_BITS:
        rhs = a**power
        for count in counts:
            rhs *= count ** (count // g)
        return (n * b) ** power >= rhs
    with localcontext() as context:
        context.prec = _DECIMAL_TEST_DIGITS
        lhs = n * (Decimal(n).ln() + Decimal(b).ln() - Decimal(a).ln())
        rhs_log = sum((c * Decimal(c).ln() for c in counts), Decimal(0))
        return lhs - rhs_log >= -(lhs.copy_abs() + rhs_log) * Decimal(10) ** -45


def sensitive_codes(
    column: pd.Series,
    distance: Distance,
    hierarchy: ValueHierarchy | None = None,
    order: Sequence[object] | None = None,
) -> tuple[np.ndarray, int]:
    """Code a sensitive column as integers ``0 .. m-1``; returns ``(codes (n,), m)``.

    ``ordered``: ranks in ``order`` if given, else in sorted order of the values (numeric columns only, since the
    sort order of text is rarely the attribute's order). ``equal``: any consistent coding. ``hierarchical``: leaf
    indices of ``hierarchy``.

    A declared ``order`` is matched by the column's type class, never by how a value happens to print: on a numeric
    column (numeric dtype other than bool, or an object column of numbers) by equality of number, so ``1`` in the
    order matches a cell ``1.0`` of a float column; on any other column by text, so ``1`` matches a cell ``"1"``.

    Raises:
        AnonymityInputError: an ordered text column without ``order``, a value missing from ``order`` or from the
            hierarchy, a non-numeric (or NaN) ``order`` entry for a numeric column, or two ``order`` entries that are
            the same number (``1`` and ``1.0``).
    """
    name = str(column.name)
    if distance == "hierarchical":
        if hierarchy is None:
            raise ValueError("the hierarchical distance needs a hierarchy")
        return hierarchy.leaf_codes(column.to_numpy(), name), len(hierarchy.leaves)
    if distance == "ordered" and order is not None:
        if _is_numeric_column(column):
            index = _numeric_order_index(order, name, column.dtype)
            cell_codes, uniques = pd.factorize(column)
            unique_codes = np.fromiter((index.get(v, -1) for v in uniques.tolist()), dtype=np.intp, count=len(uniques))
            codes = unique_codes[cell_codes]
        else:
            text_index = {str(v): i for i, v in enumerate(order)}
            codes = np.fromiter((text_index.get(str(v), -1) for v in column), dtype=np.intp, count=len(column))
        unknown = int(np.count_nonzero(codes < 0))
        if unknown:
            raise AnonymityInputError(
                f"sensitive attribute {name!r}: {unknown} value(s) are not in the declared order; list every value"
            )
        return codes, len(order)
    if distance == "ordered" and not pd.api.types.is_numeric_dtype(column):
        raise AnonymityInputError(
            f"sensitive attribute {name!r} is declared ordered but is not numeric; declare its 'order' "
            "(the values from lowest to highest) or make it categorical"
        )
    codes, uniques = pd.factorize(column, sort=True)
    return codes.astype(np.intp), len(uniques)


def _is_numeric_column(column: pd.Series) -> bool:
    """Whether ``column``'s type class is numeric: a numeric dtype other than bool (NumPy, nullable or Arrow), or an
    object column whose cells are all numbers (ints, floats, decimals), as some database drivers return."""
    dtype = column.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return False
    if pd.api.types.is_numeric_dtype(dtype):
        return True
    if dtype == object:
        kind = pd.api.types.infer_dtype(column, skipna=True)
        return kind in ("integer", "floating", "mixed-integer-float", "decimal")
    return False


def _numeric_order_index(order: Sequence[object], name: str, dtype: object) -> dict[object, int]:
    """``{number: rank}`` for a declared order of a numeric column; Python numbers hash by value (``hash(1) ==
    hash(1.0) == hash(Decimal(1))``), so a lookup matches a cell by equality of number.

    Raises:
        AnonymityInputError: an entry is not a number (text such as ``"1"``, a bool) or is NaN, or two entries are
            the same number; the message names the column and the entries.
    """
    not_numbers = [v for v in order if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Number) or v != v]
    if not_numbers:
        raise AnonymityInputError(
            f"sensitive attribute {name!r} is numeric ({dtype}) but its declared order has entries that are not "
            f"numbers: {not_numbers[:5]!r}; list the order as numbers (1, not '1'), or convert the column to text "
            "if its values are labels"
        )
    index: dict[object, int] = {}
    for rank, value in enumerate(order):
        if value in index:
            raise AnonymityInputError(
                f"sensitive attribute {name!r}: the declared order lists the number {value!r} more than once "
                f"(at positions {index[value] + 1} and {rank + 1}, counting from 1); list each value once"
            )
        index[value] = rank
    return index


def sensitive_distribution(
    table: pd.DataFrame,
    classes: EquivalenceClasses,
    attribute: str,
    distance: Distance = "equal",
    hierarchy: ValueHierarchy | None = None,
    order: Sequence[object] | None = None,
) -> SensitiveDistribution:
    """Per-class distribution of ``attribute`` over ``classes`` (built from the same ``table``).

    Raises:
        AnonymityInputError: see :func:`check_columns` and :func:`sensitive_codes`.
    """
    check_columns(table, [attribute], "sensitive attribute")
    codes, m = sensitive_codes(table[attribute], distance, hierarchy, order)
    return SensitiveDistribution.from_codes(classes, codes, m)


def k_anonymity(table: pd.DataFrame, quasi_identifiers: Sequence[str]) -> int:
    """k of the table: the size of its smallest equivalence class (Sweeney 2002).

    Raises:
        AnonymityInputError: empty table, unknown column, missing value in a QI.
    """
    return equivalence_classes(table, quasi_identifiers).k


def distinct_l_diversity(table: pd.DataFrame, quasi_identifiers: Sequence[str], attribute: str) -> int:
    """Distinct l: the fewest distinct values of ``attribute`` in any class (Machanavajjhala et al. 2006)."""
    classes = equivalence_classes(table, quasi_identifiers)
    return int(sensitive_distribution(table, classes, attribute).class_distinct_counts().min())


def entropy_l_diversity(table: pd.DataFrame, quasi_identifiers: Sequence[str], attribute: str) -> float:
    """Entropy l: ``exp(min over classes of -sum p log p)``, a real number >= 1 (Machanavajjhala et al. 2006).

    The table is entropy l-diverse for every ``l`` up to this value. Correctly rounded, so three equally common
    values in the least diverse class give exactly ``3.0`` (see :meth:`SensitiveDistribution.entropy_l`).
    """
    classes = equivalence_classes(table, quasi_identifiers)
    return sensitive_distribution(table, classes, attribute).entropy_l()


def recursive_cl_diversity(table: pd.DataFrame, quasi_identifiers: Sequence[str], attribute: str, l: int) -> float:
    """The bound on c for recursive (c, l)-diversity: ``max over classes of r_1 / (r_l + ... + r_m)``.

    The table is recursive (c, l)-diverse iff ``c`` is strictly greater than the returned value; ``inf`` when a
    class has fewer than ``l`` distinct values (no c works). Machanavajjhala et al. 2006, definition 4.4.
    """
    classes = equivalence_classes(table, quasi_identifiers)
    return float(sensitive_distribution(table, classes, attribute).class_recursive_ratios(l).max())


def t_closeness(
    table: pd.DataFrame,
    quasi_identifiers: Sequence[str],
    attribute: str,
    distance: Distance = "equal",
    hierarchy: ValueHierarchy | None = None,
    order: Sequence[object] | None = None,
) -> float:
    """t of the table for ``attribute``: the largest EMD between a class's distribution and the table's
    (Li, Li, Venkatasubramanian 2007). ``distance`` is ``"ordered"``, ``"equal"`` or ``"hierarchical"``
    (the latter with ``hierarchy``).

    Raises:
        AnonymityInputError: see :func:`check_columns` and :func:`sensitive_codes`.
    """
    classes = equivalence_classes(table, quasi_identifiers)
    dist = sensitive_distribution(table, classes, attribute, distance, hierarchy, order)
    return float(class_emd(dist, distance, hierarchy).max())


def class_emd(dist: SensitiveDistribution, distance: Distance, hierarchy: ValueHierarchy | None = None) -> np.ndarray:
    """Per-class EMD under ``distance``, shape ``(n_classes,)``."""
    if distance == "ordered":
        return dist.class_emd_ordered()
    if distance == "equal":
        return dist.class_emd_equal()
    if hierarchy is None:
        raise ValueError("the hierarchical distance needs a hierarchy")
    return dist.class_emd_hierarchical(hierarchy)
