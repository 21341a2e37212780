"""Check a microdata table against an :class:`~dp_operators.anonymity.spec.AnonymitySpec` and build a JSON report.

The report holds only plain ``int``/``float``/``str``/``bool``/``None``/``list``/``dict`` values: counts, class
sizes, measures, risks and targets, never a row or a quasi-identifier or sensitive value, so it can go to XCom, an
asset event, a log or a file, on success and on failure alike.

Order of evaluation (the same as the full-domain lattice search uses for one node, so an anonymiser's report equals
the search's evaluation of the node it chose):

1. Validate the input (columns exist, table not empty, no missing values, target k not above the row count).
2. Group rows into equivalence classes on the quasi-identifiers (Sweeney 2002) and evaluate every class-level target
   with :class:`~dp_operators.anonymity.criteria.Criteria`: k, l (Machanavajjhala et al. 2006), t (Li, Li,
   Venkatasubramanian 2007) and the highest prosecutor / journalist risk (El Emam & Dankar 2008).
3. If the classes failing *any* class-level target hold more than 0 rows, at most ``floor(max_fraction * n)`` rows
   and fewer than ``n`` rows, suppress those whole classes (the release withholds them, as ARX does).
4. The release passes iff no released class fails a class-level target and no table-level risk target (average
   risk, records at risk, marketer risk) fails on the released classes.

t-closeness compares each class with the distribution ``P`` of the sensitive attribute over the *whole input table*
(the paper's "overall table"), fixed before any suppression, so suppressing rows never moves the reference.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from dp_operators.anonymity.criteria import AttributeEvaluation, ClassEvaluation, Criteria
from dp_operators.anonymity.measures import check_columns, equivalence_classes, violating_classes
from dp_operators.anonymity.risk import risk_summary
from dp_operators.anonymity.spec import AnonymitySpec


def check_table(table: pd.DataFrame, spec: AnonymitySpec) -> dict[str, Any]:
    """Measure ``table`` (shape ``(n, any)``) against ``spec`` and return the JSON-safe report.

    See :func:`evaluate_table` for the report's keys and the errors raised.
    """
    report, _ = evaluate_table(table, spec)
    return report


def evaluate_table(
    table: pd.DataFrame, spec: AnonymitySpec, criteria: Criteria | None = None
) -> tuple[dict[str, Any], np.ndarray]:
    """Evaluate ``table`` (shape ``(n, any)``) against ``spec``: suppress failing classes within the allowance, then
    measure the release.

    Args:
        table: the microdata (already generalised, or raw).
        spec: the validated spec.
        criteria: the spec's targets bound to this same ``table`` (pass it to reuse the coding of the sensitive
            attributes); built here when ``None``.

    Returns:
        ``(report, released)``: ``released`` is the bool mask, shape ``(n,)``, of the rows the release keeps; the
        report is a JSON-safe dict with keys

        - ``check``, ``on_failure``, ``rows``, ``quasi_identifiers``, ``passed``;
        - ``equivalence_classes``, ``k``: classes and smallest class size before suppression;
        - ``violating_classes`` (when k is a target): ``{target_k, classes, rows, size_counts}`` of the classes
          smaller than k before suppression, sizes as string keys;
        - ``failing_classes``: classes failing at least one class-level target before suppression,
          ``{classes, rows, by_target: {target name: classes}}``;
        - ``suppression``: ``{max_fraction, allowed_rows, suppressed_rows, suppressed_classes,
          suppressed_fraction, applied}``;
        - ``released``: ``{rows, equivalence_classes, k}`` after suppression;
        - ``class_size_histogram``: ``{"released": {size: classes}, "before_suppression": {size: classes}}``,
          sizes as string keys in ascending order;
        - ``sensitive_attributes``: ``{name: {type, distance, distinct_l, entropy_l, recursive_c_bound, t}}`` over
          the released classes (``recursive_c_bound`` only with a recursive l target, ``None`` when unbounded);
        - ``risk``: :func:`~dp_operators.anonymity.risk.risk_summary` of the released classes at the spec's
          ``risk_threshold``;
        - ``targets``: one ``{measure, target, value, passed}`` per declared target and attribute, with
          ``attribute`` for l and t and ``failing_classes`` for every class-level target (measures ``k``,
          ``l_distinct``/``l_entropy``/``l_recursive`` (with ``c``), ``t``, ``prosecutor_risk.highest``,
          ``journalist_risk.highest``; table-level: ``prosecutor_risk.average``,
          ``prosecutor_risk.records_at_risk``, the same for ``journalist_risk``, ``marketer_risk``);
        - ``failed_targets``: one readable line per failed target (value vs target, failing classes).

    Raises:
        AnonymityInputError: unknown column, empty table, missing value in a QI or sensitive attribute, a target k
            larger than the table, a sensitive value outside a declared order or hierarchy.
    """
    qis = list(spec.qi_names)
    check_columns(table, qis, "quasi-identifier")
    if spec.sensitive_attributes:
        check_columns(table, [a.name for a in spec.sensitive_attributes], "sensitive attribute")
    n = len(table)
    target_k = spec.targets.k
    if criteria is None:
        criteria = Criteria(spec, table)
    elif criteria.rows != n:
        raise ValueError(f"criteria were built for a table of {criteria.rows} rows, not this one ({n} rows)")
    criteria.check_min_class_size()  # k or the highest risk needing classes larger than the table

    classes = equivalence_classes(table, qis)
    evaluation = criteria.evaluate(classes.class_ids, classes.n_classes, all_measures=True)
    sizes = evaluation.sizes
    failing = evaluation.failing_classes
    failing_rows = int(sizes[failing].sum())
    allowed_rows = math.floor(spec.suppression.max_fraction * n)
    suppress = 0 < failing_rows <= allowed_rows and failing_rows < n
    kept_classes = ~failing if suppress else np.ones(classes.n_classes, dtype=bool)
    released_mask = kept_classes[classes.class_ids]
    released = _select_classes(evaluation, kept_classes)
    released_sizes = released.sizes

    report: dict[str, Any] = {
        "check": spec.check,
        "on_failure": spec.on_failure,
        "rows": n,
        "quasi_identifiers": qis,
        "equivalence_classes": classes.n_classes,
        "k": classes.k,
    }
    if target_k is not None:
        violation = violating_classes(classes, target_k)
        report["violating_classes"] = {
            "target_k": violation.target_k,
            "classes": violation.classes,
            "rows": violation.rows,
            "size_counts": {str(size): count for size, count in violation.size_counts.items()},
        }
    report["failing_classes"] = {
        "classes": int(np.count_nonzero(failing)),
        "rows": failing_rows,
        "by_target": {name: int(np.count_nonzero(mask)) for name, mask in evaluation.failing.items()},
    }
    suppressed_rows = failing_rows if suppress else 0
    report["suppression"] = {
        "max_fraction": float(spec.suppression.max_fraction),
        "allowed_rows": allowed_rows,
        "suppressed_rows": suppressed_rows,
        "suppressed_classes": int(np.count_nonzero(failing)) if suppress else 0,
        "suppressed_fraction": suppressed_rows / n,
        "applied": suppress,
    }
    report["released"] = {
        "rows": int(released_sizes.sum()),
        "equivalence_classes": int(released_sizes.size),
        "k": int(released_sizes.min()),
    }
    report["class_size_histogram"] = {"released": _histogram(released_sizes), "before_suppression": _histogram(sizes)}

    targets: list[dict[str, Any]] = []
    if target_k is not None:
        targets.append(_class_target("k", int(target_k), int(released_sizes.min()), released.failing["k"]))
    report["sensitive_attributes"] = _attribute_measures(spec, released, targets)
    summary = risk_summary(released_sizes, None, criteria.risk_threshold)
    report["risk"] = summary
    for model in ("prosecutor_risk", "journalist_risk"):
        risk_target = getattr(spec.targets, model)
        if risk_target is not None and risk_target.highest is not None:
            name = f"{model}.highest"
            value = summary[model.removesuffix("_risk")]["highest"]
            targets.append(_class_target(name, float(risk_target.highest), value, released.failing[name]))
    table_failures = set(criteria.table_failures(released_sizes))
    for name, target in criteria.table_targets.items():
        model, _, measure = name.partition(".")
        value = summary[model.removesuffix("_risk")][measure or "average"]
        targets.append({"measure": name, "target": target, "value": value, "passed": name not in table_failures})
    report["targets"] = targets
    report["failed_targets"] = [_describe_failure(t) for t in targets if not t["passed"]]
    report["passed"] = all(t["passed"] for t in targets)
    return report, released_mask


def _attribute_measures(
    spec: AnonymitySpec, released: ClassEvaluation, targets: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per-attribute measures over the released classes; appends the l and t targets to ``targets``."""
    target_l, target_t = spec.targets.l, spec.targets.t
    measured: dict[str, dict[str, Any]] = {}
    for attribute in spec.sensitive_attributes:
        evaluation = released.attributes[attribute.name]
        entry: dict[str, Any] = {
            "type": attribute.type,
            "distance": attribute.distance,
            "distinct_l": int(evaluation.distinct.min()),
            "entropy_l": evaluation.distribution.entropy_l(),
            "recursive_c_bound": None,
            "t": float(evaluation.emd.max()),
        }
        if evaluation.recursive_ratio is not None:
            bound = float(evaluation.recursive_ratio.max())
            entry["recursive_c_bound"] = bound if math.isfinite(bound) else None
        if target_l is not None:
            value: float | int | None
            if target_l.kind == "distinct":
                value, target_value = entry["distinct_l"], int(target_l.l)
            elif target_l.kind == "entropy":
                value, target_value = entry["entropy_l"], target_l.l
            else:
                value, target_value = entry["recursive_c_bound"], int(target_l.l)
            result = _class_target(
                f"l_{target_l.kind}", target_value, value, released.failing[f"l:{attribute.name}"], attribute.name
            )
            if target_l.c is not None:
                result["c"] = target_l.c
            targets.append(result)
        if target_t is not None:
            targets.append(
                _class_target("t", target_t, entry["t"], released.failing[f"t:{attribute.name}"], attribute.name)
            )
        measured[attribute.name] = entry
    return measured


def _class_target(
    measure: str, target: float | int, value: float | int | None, failing: np.ndarray, attribute: str | None = None
) -> dict[str, Any]:
    """One class-level target's entry: ``passed`` iff no released class fails it."""
    count = int(np.count_nonzero(failing))
    entry: dict[str, Any] = {"measure": measure}
    if attribute is not None:
        entry["attribute"] = attribute
    return entry | {"target": target, "value": value, "passed": count == 0, "failing_classes": count}


def _describe_failure(target: dict[str, Any]) -> str:
    """A readable line for one failed target: ``"<measure>[ on <attribute>]: <value> vs target <target>"`` and the
    failing classes, e.g. ``"t on salary: 0.1667 vs target 0.1 (2 failing classes)"``. k and l are lower bounds,
    t and the risks upper bounds; for recursive (c, l) the value is the bound on c (it must be below c)."""
    measure = target["measure"]
    where = f" on {target['attribute']}" if "attribute" in target else ""
    value = target["value"]
    if measure == "l_recursive":
        shown = "unbounded" if value is None else _number(value)
        line = f"{measure}{where}: c bound {shown} vs target c {_number(target['c'])} (l = {target['target']})"
    else:
        line = f"{measure}{where}: {_number(value)} vs target {_number(target['target'])}"
    if "failing_classes" in target:
        count = target["failing_classes"]
        line += f" ({count} failing class{'' if count == 1 else 'es'})"
    return line


def _number(value: float | int) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def _histogram(sizes: np.ndarray) -> dict[str, int]:
    """``{size as text: number of classes}`` in ascending size order."""
    values, counts = np.unique(sizes, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


def _select_classes(evaluation: ClassEvaluation, keep: np.ndarray) -> ClassEvaluation:
    """The evaluation restricted to the kept classes. Class-level measures depend only on a class's own rows and on
    the fixed reference ``P``, so this equals evaluating the released rows afresh."""
    if keep.all():
        return evaluation
    attributes = {
        name: AttributeEvaluation(
            distinct=a.distinct[keep],
            entropy=a.entropy[keep],
            emd=a.emd[keep],
            recursive_ratio=None if a.recursive_ratio is None else a.recursive_ratio[keep],
            distribution=a.distribution.select_classes(keep),
        )
        for name, a in evaluation.attributes.items()
    }
    return ClassEvaluation(
        sizes=evaluation.sizes[keep],
        failing={name: mask[keep] for name, mask in evaluation.failing.items()},
        attributes=attributes,
    )
