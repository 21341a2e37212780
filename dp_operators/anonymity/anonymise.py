"""Anonymise a microdata table as its spec says: generalise the quasi-identifiers, suppress what still fails, report.

The entry point the operators call (:class:`~dp_operators.operators.anonymity.AnonymiseOperator`), pure (no
Airflow). The steps, for a table of ``n`` rows:

1. Encode the quasi-identifiers with their declared generalisation hierarchies
   (:func:`~dp_operators.anonymity.generalisation.encode_quasi_identifiers`) and bind the targets to the table
   (:class:`~dp_operators.anonymity.criteria.Criteria`: the sensitive attributes coded once, the t-closeness
   reference fixed to the whole input table).
2. Generalise, per ``spec.anonymisation.algorithm``:

   - ``full_domain``: the optimal search over the generalisation lattice
     (:func:`~dp_operators.anonymity.lattice.full_domain_search`; Samarati 2001, LeFevre et al. 2005, El Emam et al.
     2009, Kohlmayer et al. 2012) for the node of least ``spec.anonymisation.metric`` that meets every target with at
     most ``floor(suppression.max_fraction * n)`` rows suppressed;
   - ``mondrian``: strict multidimensional partitioning (LeFevre, DeWitt, Ramakrishnan, ICDE 2006) whose cuts keep
     every class-level target on both halves (:func:`~dp_operators.anonymity.mondrian.mondrian_spec`).

3. Measure the generalised table, before suppression, with the gate's own evaluation
   (:func:`~dp_operators.anonymity.check.evaluate_table`): it suppresses the classes that still miss a class-level
   target (within the allowance) and measures the release. For the full-domain search this is the evaluation the
   search made of the chosen node, so the released rows must be the search's (checked on every call).

The report is the gate's report (counts, class-size histogram, measures per attribute, risk, targets, failed
targets) plus an ``anonymisation`` section; it holds no row, no quasi-identifier or sensitive value and no
generalised label, only counts, hierarchy levels and loss figures, so it can go to XCom, a log or a file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dp_operators.anonymity.check import evaluate_table
from dp_operators.anonymity.criteria import Criteria
from dp_operators.anonymity.encoding import EncodedQuasiIdentifier
from dp_operators.anonymity.generalisation import encode_quasi_identifiers
from dp_operators.anonymity.lattice import full_domain_search
from dp_operators.anonymity.mondrian import mondrian_spec
from dp_operators.anonymity.spec import AnonymitySpec, Suppression


@dataclass(frozen=True)
class AnonymisationResult:
    """Outcome of :func:`anonymise`.

    Attributes:
        table: the release: the rows kept (original index; suppressed rows left out), every quasi-identifier
            replaced by its generalised label as text, every other column unchanged. No rows
            when ``passed`` is false: nothing is publishable.
        report: the JSON-safe report (see :func:`anonymise`).
        passed: whether the release meets every target.
    """

    table: pd.DataFrame = field(repr=False)
    report: dict[str, Any]
    passed: bool


def anonymise(table: pd.DataFrame, spec: AnonymitySpec) -> AnonymisationResult:
    """Anonymise ``table`` (shape ``(n, any)``) to the targets of ``spec`` and report on the release.

    Returns:
        An :class:`AnonymisationResult`. Its report is
        :func:`~dp_operators.anonymity.check.evaluate_table`'s report of the generalised table (keys ``check``,
        ``passed``, ``rows``, ``equivalence_classes``, ``k``, ``failing_classes``, ``suppression``, ``released``,
        ``class_size_histogram``, ``sensitive_attributes``, ``risk``, ``targets``, ``failed_targets``, ...) plus
        ``anonymisation``:

        - ``algorithm`` (``full_domain`` | ``mondrian``), ``metric`` (the metric minimised; ``None`` for Mondrian),
          ``seconds`` (wall-clock time of the whole call);
        - full-domain: ``node`` (``{qi: level}`` chosen, ``None`` when none meets the targets), ``evaluated_node``
          (the node the report measures: the chosen one, else the most general one, every QI at its top level),
          ``heights`` (``{qi: highest level}``), ``nodes_checked``, ``lattice_size``, ``predictive_tagging``;
        - ``information_loss``: full-domain: ``loss``, ``ncp``, ``discernibility``, ``entropy`` and their
          ``normalised`` values (:func:`~dp_operators.anonymity.loss.information_loss`); Mondrian: its NCP,
          discernibility and class sizes (:meth:`~dp_operators.anonymity.mondrian.MondrianResult.information_loss`);
          ``None`` when nothing is released;
        - ``reason``: why the targets cannot be met (counts and target names), else ``None``.

        When the targets cannot be met, ``passed`` is false, the table has no rows and the report measures the most
        general release (full-domain: the top node; Mondrian: its partition), so its ``failed_targets`` say which
        targets fail even there.

    Raises:
        AnonymityInputError: an unknown column, an empty table, a missing value in a quasi-identifier or sensitive
            attribute, a quasi-identifier that cannot be generalised as declared (a value its hierarchy does not
            cover, infinite values, numbers mixed with text), a sensitive value outside its declared order or
            hierarchy, a target k (or highest risk) needing more rows than the table has.
        AnonymitySpecError: a hierarchy that cannot be applied (see
            :mod:`dp_operators.anonymity.generalisation`).
    """
    start = time.perf_counter()
    if spec.anonymisation.algorithm == "mondrian":
        criteria = Criteria(spec, table)
        generalised, section = _mondrian(table, spec, criteria)
    else:
        encoded = encode_quasi_identifiers(table, spec)
        criteria = Criteria(spec, table)
        generalised, section = _full_domain(table, spec, encoded, criteria)

    report, kept = evaluate_table(generalised, spec, criteria)
    search_kept = section.pop("_kept")
    passed = bool(report["passed"]) and section["reason"] is None
    if search_kept is not None:
        # The search evaluated this node with the same Criteria; a disagreement is a bug, never a user error, and
        # must stop the release even under `python -O` (which strips asserts).
        if not np.array_equal(kept, search_kept):
            raise RuntimeError("internal error: the gate's released rows differ from the search's; nothing released")
    if not passed:
        report["passed"] = False
        if section["reason"] is None:
            section["reason"] = "the generalised table misses the targets: " + "; ".join(report["failed_targets"])
        section["information_loss"] = None
    section["seconds"] = time.perf_counter() - start
    report["anonymisation"] = section
    released = generalised.loc[kept] if passed else generalised.iloc[0:0]
    return AnonymisationResult(table=released, report=report, passed=passed)


def _full_domain(
    table: pd.DataFrame, spec: AnonymitySpec, encoded: list[EncodedQuasiIdentifier], criteria: Criteria
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The table generalised to the optimal node (or the top node when none satisfies) and the report section."""
    result = full_domain_search(
        table, encoded, criteria, spec.suppression.max_fraction, spec.anonymisation.metric
    )
    names = [e.name for e in encoded]
    node = result.node if result.node is not None else tuple(e.height for e in encoded)
    section: dict[str, Any] = {
        "algorithm": "full_domain",
        "metric": result.metric,
        "node": None if result.node is None else dict(zip(names, result.node, strict=True)),
        "evaluated_node": dict(zip(names, node, strict=True)),
        "heights": dict(zip(names, result.heights, strict=True)),
        "nodes_checked": result.nodes_checked,
        "lattice_size": result.lattice_size,
        "predictive_tagging": result.predictive_tagging,
        "information_loss": result.information_loss,
        "reason": result.reason,
        "_kept": result.kept if result.node is not None else None,
    }
    return generalise_to_node(table, encoded, node), section


def _mondrian(table: pd.DataFrame, spec: AnonymitySpec, criteria: Criteria) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Mondrian's partition of every row (suppression is left to the gate's evaluation) and the report section.

    Strict Mondrian only cuts where both halves meet the class-level targets and suppresses only after
    partitioning, so the partition does not depend on the allowance: it is computed without one and the gate
    evaluates the allowance on it.
    """
    without_allowance = spec.model_copy(update={"suppression": Suppression(max_fraction=0.0)})
    result = mondrian_spec(table, without_allowance, criteria)
    section: dict[str, Any] = {
        "algorithm": "mondrian",
        "metric": None,
        "information_loss": result.information_loss(),
        "reason": None,
        "_kept": None,
    }
    # Mondrian's labels are text in object columns; give them the text dtype readers return, as full-domain does.
    return result.table.astype({name: str for name in spec.qi_names}), section


def generalise_to_node(
    table: pd.DataFrame, encoded: list[EncodedQuasiIdentifier], node: tuple[int, ...] | list[int]
) -> pd.DataFrame:
    """``table`` with every quasi-identifier replaced by its label at ``node`` (pandas' text dtype, as a CSV or
    Parquet reader returns text); all rows, index and other columns unchanged.

    Args:
        table: the ``n``-row table ``encoded`` was built from.
        encoded: its encoded quasi-identifiers (:func:`~dp_operators.anonymity.generalisation.
            encode_quasi_identifiers`).
        node: one level per encoded quasi-identifier, ``0 <= node[j] <= encoded[j].height``.

    Raises:
        ValueError: the node has the wrong length or a level out of range.
    """
    if len(node) != len(encoded):
        raise ValueError(f"the node has {len(node)} levels for {len(encoded)} quasi-identifiers")
    out = table.copy()
    for column, level in zip(encoded, node, strict=True):
        if not 0 <= level <= column.height:
            raise ValueError(f"level {level} of quasi-identifier {column.name!r} is outside [0, {column.height}]")
        labels = np.asarray(column.labels[level], dtype=object)
        out[column.name] = pd.Series(labels[column.codes[level]], index=table.index, dtype=str)
    return out
