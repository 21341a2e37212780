"""The targets of an anonymity spec, evaluated on any partition of a table's rows into equivalence classes.

One evaluator for every caller: :func:`~dp_operators.anonymity.check.check_table` (the gate), the full-domain lattice
search (:mod:`dp_operators.anonymity.lattice`, once per lattice node) and Mondrian (once per candidate cut). Each
sensitive attribute is coded once, when the :class:`Criteria` is built, and the t-closeness reference distribution
``P`` is the distribution over the *whole* table given then (Li, Li, Venkatasubramanian, ICDE 2007: "the
distribution of the attribute in the overall table"), so suppressing rows later never moves ``P``.

Class-level targets (a class passes or fails on its own, so a failing class can be suppressed):
``k`` (Sweeney 2002), ``l`` (Machanavajjhala et al. 2006: distinct, entropy, recursive (c, l)), ``t`` (Li et al.
2007) and the *highest* prosecutor / journalist risk (a record's risk is ``1 / class size``; El Emam & Dankar 2008).
Table-level targets (a property of the whole release): the *average* prosecutor / journalist risk, the fraction of
records at risk, and the marketer risk (see :mod:`dp_operators.anonymity.risk`).

Monotonicity, which the lattice search uses to prune: without suppression every target here holds for a
generalisation of a table that meets it (k and the risks: classes only merge; l: the papers' monotonicity results;
t: the EMD is convex in the class distribution). With suppression only k, distinct l and the highest risks stay
monotone (a merged class containing a passing class passes); :meth:`Criteria.monotone` says which case applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.hierarchy import ValueHierarchy
from dp_operators.anonymity.measures import Distance, SensitiveDistribution, check_columns, class_emd, sensitive_codes
from dp_operators.anonymity.risk import RISK_TOLERANCE, exceeds, risk_summary

if TYPE_CHECKING:
    from dp_operators.anonymity.spec import AnonymitySpec, Targets

#: EMDs are float sums: a class exactly at the target must not fail on the last bit. (Entropy l is decided exactly,
#: by :meth:`~dp_operators.anonymity.measures.SensitiveDistribution.class_entropy_l_met`.)
TOLERANCE = 1e-9


@dataclass(frozen=True)
class SensitiveColumn:
    """One sensitive attribute coded once.

    Attributes:
        name: column name.
        distance: the t-closeness ground distance.
        codes: value code of every row of the table, shape ``(n,)``.
        n_values: ``m``, the size of the value domain.
        reference_counts: counts of each value over the whole table (``P`` for t-closeness), shape ``(m,)``.
        hierarchy: the declared hierarchy for the hierarchical distance, else ``None``.
    """

    name: str
    distance: Distance
    codes: np.ndarray
    n_values: int
    reference_counts: np.ndarray
    hierarchy: ValueHierarchy | None = None


@dataclass(frozen=True)
class AttributeEvaluation:
    """Per-class measures of one sensitive attribute, each shape ``(n_classes,)``, and the per-class value counts
    they come from (``distribution``: the exact entropy l test and the correctly rounded entropy l use them)."""

    distinct: np.ndarray
    entropy: np.ndarray
    emd: np.ndarray
    recursive_ratio: np.ndarray | None  # r_1 / (r_l + ... + r_m), only when a recursive target is declared
    distribution: SensitiveDistribution


@dataclass(frozen=True)
class ClassEvaluation:
    """The outcome of :meth:`Criteria.evaluate` for one partition.

    Attributes:
        sizes: rows per class, shape ``(n_classes,)``.
        failing: ``{target name: bool mask (n_classes,)}`` for every declared class-level target; names are ``"k"``,
            ``"l:<attribute>"``, ``"t:<attribute>"``, ``"prosecutor_risk.highest"``, ``"journalist_risk.highest"``.
        attributes: ``{attribute name: AttributeEvaluation}`` (empty when no sensitive attribute is declared).
    """

    sizes: np.ndarray
    failing: dict[str, np.ndarray]
    attributes: dict[str, AttributeEvaluation] = field(default_factory=dict)

    @property
    def failing_classes(self) -> np.ndarray:
        """Classes that fail at least one class-level target, bool mask shape ``(n_classes,)``."""
        mask = np.zeros(self.sizes.size, dtype=bool)
        for part in self.failing.values():
            mask |= part
        return mask


class Criteria:
    """The targets of one spec bound to one table (its sensitive attributes coded, ``P`` fixed).

    Args:
        spec: the validated anonymity spec (targets, sensitive attributes, risk threshold).
        table: the whole input table, shape ``(n, any)``; row ``i`` of every later call refers to its row ``i``.

    Raises:
        AnonymityInputError: a sensitive attribute is missing, has missing values, or holds a value outside its
            declared order or hierarchy (see :func:`~dp_operators.anonymity.measures.sensitive_codes`).
    """

    def __init__(self, spec: AnonymitySpec, table: pd.DataFrame) -> None:
        self.spec = spec
        self.targets: Targets = spec.targets
        self.rows = len(table)
        attributes = spec.sensitive_attributes
        if attributes:
            check_columns(table, [a.name for a in attributes], "sensitive attribute")
        self.sensitive: list[SensitiveColumn] = []
        for attribute in attributes:
            hierarchy = attribute.value_hierarchy()
            codes, m = sensitive_codes(table[attribute.name], attribute.distance, hierarchy, attribute.order)
            self.sensitive.append(
                SensitiveColumn(
                    name=attribute.name,
                    distance=attribute.distance,
                    codes=codes,
                    n_values=m,
                    reference_counts=np.bincount(codes, minlength=m).astype(np.int64),
                    hierarchy=hierarchy,
                )
            )

    # -- what is declared -------------------------------------------------------------------------------------------

    @property
    def min_class_size(self) -> int:
        """The smallest class size any class-level target allows: ``k`` and ``ceil(1 / highest risk)`` (>= 1).

        A value above :attr:`rows` means no release of this table can meet the targets: the searches refuse it
        (:meth:`check_min_class_size`).
        """
        sizes = [1]
        if self.targets.k is not None:
            sizes.append(int(self.targets.k))
        for risk in (self.targets.prosecutor_risk, self.targets.journalist_risk):
            if risk is not None and risk.highest is not None:
                sizes.append(_smallest_size_at_most(risk.highest))
        return max(sizes)

    def check_min_class_size(self) -> None:
        """Refuse targets that need a class larger than the table (k, or ``ceil(1 / highest risk)``, above
        :attr:`rows`): no generalisation or suppression of this table can meet them.

        Raises:
            AnonymityInputError: the smallest allowed class size exceeds the row count (the message names the
                targets, the size needed and the row count).
        """
        size = self.min_class_size
        if size <= self.rows:
            return
        reasons = []
        if self.targets.k is not None and self.targets.k > self.rows:
            reasons.append(f"target k = {self.targets.k} is larger than the table ({self.rows} rows)")
        for model in ("prosecutor_risk", "journalist_risk"):
            risk = getattr(self.targets, model)
            if risk is not None and risk.highest is not None:
                needed = _smallest_size_at_most(risk.highest)
                if needed > self.rows:
                    reasons.append(
                        f"target {model}.highest = {risk.highest:g} needs equivalence classes of at least {needed} "
                        f"rows, more than the table has ({self.rows} rows)"
                    )
        raise AnonymityInputError(
            f"{'; '.join(reasons)}: no release of this table can meet the targets; lower k, raise the highest "
            f"risk to at least 1/{self.rows} = {1 / self.rows:g}, or anonymise a larger table"
        )

    @property
    def needs_sensitive(self) -> bool:
        """Whether any class-level target looks at sensitive values (l or t)."""
        return self.targets.l is not None or self.targets.t is not None

    @property
    def has_table_targets(self) -> bool:
        """Whether any table-level (risk) target is declared."""
        return bool(self.table_targets)

    @property
    def table_targets(self) -> dict[str, float]:
        """The declared table-level targets, ``{name: largest value allowed}``, names
        ``"prosecutor_risk.average"``, ``"prosecutor_risk.records_at_risk"``, the same for ``journalist_risk``, and
        ``"marketer_risk"``; empty when none is declared."""
        values: dict[str, float] = {}
        for model in ("prosecutor_risk", "journalist_risk"):
            risk = getattr(self.targets, model)
            if risk is None:
                continue
            if risk.average is not None:
                values[f"{model}.average"] = float(risk.average)
            if risk.records_at_risk is not None:
                values[f"{model}.records_at_risk"] = float(risk.records_at_risk)
        if self.targets.marketer_risk is not None:
            values["marketer_risk"] = float(self.targets.marketer_risk)
        return values

    def monotone(self, suppression_rows: int) -> bool:
        """Whether every declared target, with up to ``suppression_rows`` rows suppressed, holds for every
        generalisation of a table that meets it (see the module docstring)."""
        if suppression_rows <= 0:
            return True
        l_target = self.targets.l
        if self.targets.t is not None or (l_target is not None and l_target.kind != "distinct"):
            return False
        return not self.has_table_targets

    # -- evaluation -------------------------------------------------------------------------------------------------

    def evaluate(
        self,
        class_ids: np.ndarray,
        n_classes: int,
        rows: np.ndarray | None = None,
        all_measures: bool = False,
    ) -> ClassEvaluation:
        """Evaluate every class-level target on a partition.

        Args:
            class_ids: class of each row considered, shape ``(r,)``, values in ``[0, n_classes)``, every class
                non-empty.
            n_classes: number of classes.
            rows: the table rows that ``class_ids`` describes (indices into the table given at construction),
                shape ``(r,)``; ``None`` means all rows in order (``r = n``). A row may appear more than once
                (Mondrian evaluates several candidate cuts of one partition in one call).
            all_measures: also compute the EMD of every sensitive attribute when no t target is declared (a report
                shows it); otherwise ``emd`` is zeros then, which saves the search the work.

        Returns:
            the class sizes, the failing mask of each class-level target and the per-attribute measures.
        """
        sizes = np.bincount(class_ids, minlength=n_classes).astype(np.int64)
        failing: dict[str, np.ndarray] = {}
        targets = self.targets
        if targets.k is not None:
            failing["k"] = sizes < targets.k
        for model in ("prosecutor_risk", "journalist_risk"):
            risk = getattr(targets, model)
            if risk is not None and risk.highest is not None:
                failing[f"{model}.highest"] = exceeds(1.0 / sizes, risk.highest)
        attributes: dict[str, AttributeEvaluation] = {}
        if self.sensitive:
            for column in self.sensitive:
                evaluation = self._evaluate_attribute(column, class_ids, n_classes, sizes, rows, all_measures)
                attributes[column.name] = evaluation
                if targets.l is not None:
                    failing[f"l:{column.name}"] = self._l_failing(evaluation)
                if targets.t is not None:
                    failing[f"t:{column.name}"] = evaluation.emd > targets.t + TOLERANCE
        return ClassEvaluation(sizes=sizes, failing=failing, attributes=attributes)

    def class_failures(self, class_ids: np.ndarray, n_classes: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Classes failing at least one class-level target, bool mask shape ``(n_classes,)``.

        Skips the sensitive-attribute work when only size-based targets are declared.
        """
        if not self.needs_sensitive:
            sizes = np.bincount(class_ids, minlength=n_classes)
            return sizes < self.min_class_size
        return self.evaluate(class_ids, n_classes, rows).failing_classes

    def table_failures(self, released_sizes: np.ndarray, population_sizes: np.ndarray | None = None) -> list[str]:
        """Names of the table-level targets the release misses, as in :attr:`table_targets` (empty list when all
        pass or none is declared).

        Args:
            released_sizes: rows per released class, shape ``(c,)``.
            population_sizes: the same classes in the attacker's population (see :func:`risk_summary`), or ``None``.
        """
        declared = self.table_targets
        if not declared:
            return []
        summary = risk_summary(released_sizes, population_sizes, self.risk_threshold)
        return [name for name, target in declared.items() if exceeds(_lookup(summary, name), target)]

    @property
    def risk_threshold(self) -> float:
        """The threshold above which a record counts as at risk (the spec's ``risk_threshold``)."""
        return float(self.spec.risk_threshold)

    # -- internals --------------------------------------------------------------------------------------------------

    def _evaluate_attribute(
        self,
        column: SensitiveColumn,
        class_ids: np.ndarray,
        n_classes: int,
        sizes: np.ndarray,
        rows: np.ndarray | None,
        all_measures: bool = False,
    ) -> AttributeEvaluation:
        codes = column.codes if rows is None else column.codes[rows]
        keys = class_ids.astype(np.int64) * column.n_values + codes.astype(np.int64)
        unique_keys, counts = np.unique(keys, return_counts=True)
        dist = SensitiveDistribution(
            n_values=column.n_values,
            table_counts=column.reference_counts,
            class_sizes=sizes,
            pair_class=(unique_keys // column.n_values).astype(np.intp),
            pair_code=(unique_keys % column.n_values).astype(np.intp),
            pair_count=counts.astype(np.int64),
        )
        l_target = self.targets.l
        ratio = None
        if l_target is not None and l_target.kind == "recursive":
            ratio = dist.class_recursive_ratios(int(l_target.l))
        if self.targets.t is not None or all_measures:
            emd = class_emd(dist, column.distance, column.hierarchy)
        else:
            emd = np.zeros(n_classes)
        return AttributeEvaluation(
            distinct=dist.class_distinct_counts(),
            entropy=dist.class_entropies(),
            emd=emd,
            recursive_ratio=ratio,
            distribution=dist,
        )

    def _l_failing(self, evaluation: AttributeEvaluation) -> np.ndarray:
        target = self.targets.l
        assert target is not None
        if target.kind == "distinct":
            return evaluation.distinct < target.l
        if target.kind == "entropy":
            met = evaluation.distribution.class_entropy_l_met(float(target.l), evaluation.entropy, evaluation.distinct)
            return ~met
        assert evaluation.recursive_ratio is not None and target.c is not None
        return ~(evaluation.recursive_ratio < target.c)


def _smallest_size_at_most(highest: float) -> int:
    """The smallest class size whose record risk ``1 / size`` is at most ``highest`` (within the relative
    :data:`~dp_operators.anonymity.risk.RISK_TOLERANCE`, exactly as :meth:`Criteria.evaluate` tests a class).

    ``ceil(1 / (highest * (1 + tolerance)))`` computed in float, then at most two steps each way so that the answer
    agrees with the float test ``1 / size > highest * (1 + tolerance)`` of :func:`~dp_operators.anonymity.risk.
    exceeds`. Constant time for any ``highest`` in ``(0, 1]`` (a size beyond ``2**53`` is returned as computed: no
    table has that many rows, and the caller refuses a size above the row count).
    """
    target = highest * (1.0 + RISK_TOLERANCE)
    estimate = 1.0 / target
    if not math.isfinite(estimate) or estimate >= 2.0**53:
        return math.ceil(estimate) if math.isfinite(estimate) else 2**63
    size = max(1, math.ceil(estimate))
    for _ in range(2):
        if size > 1 and not exceeds(1.0 / (size - 1), highest):
            size -= 1
    for _ in range(2):
        if exceeds(1.0 / size, highest):
            size += 1
    return size


def _lookup(summary: dict[str, Any], name: str) -> float:
    """The figure of :func:`risk_summary` a table-level target name refers to."""
    if name == "marketer_risk":
        return float(summary["marketer"]["average"])
    model, measure = name.split(".")
    return float(summary[model.removesuffix("_risk")][measure])
