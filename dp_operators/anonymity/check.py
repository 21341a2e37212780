"""Check a microdata table against an :class:`~dp_operators.anonymity.spec.AnonymitySpec` and build a JSON report.

The report holds only plain ``int``/``float``/``str``/``bool``/``None``/``list``/``dict`` values: counts, class
sizes, measures and targets, never a row or a quasi-identifier value, so it can go to XCom, an asset event or a log.

Order of evaluation:

1. Validate the input (columns exist, table not empty, no missing values, target k not above the row count).
2. Group rows into equivalence classes on the quasi-identifiers and measure k (Sweeney 2002).
3. If some classes are smaller than the target k and their rows fit in ``suppression.max_fraction`` of the table,
   suppress them (the release withholds those rows, as ARX does) and measure on the remaining rows.
4. For every sensitive attribute: distinct l, entropy l, the recursive (c, l) bound when targeted
   (Machanavajjhala et al. 2006) and t under its declared distance (Li, Li, Venkatasubramanian 2007), the latter
   relative to the distribution of the rows that are released.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.measures import (
    EquivalenceClasses,
    SensitiveDistribution,
    check_columns,
    class_emd,
    equivalence_classes,
    sensitive_distribution,
    violating_classes,
)
from dp_operators.anonymity.spec import AnonymitySpec

# Entropies and EMDs are float sums: a table exactly at the target must not fail on the last bit.
_TOLERANCE = 1e-9


def check_table(table: pd.DataFrame, spec: AnonymitySpec) -> dict[str, Any]:
    """Measure ``table`` (shape ``(n, any)``) against ``spec`` and return the JSON-safe report.

    The report's keys: ``check``, ``passed``, ``on_failure``, ``rows``, ``quasi_identifiers``,
    ``equivalence_classes``, ``k``, ``violating_classes`` (``{target_k, classes, rows, size_counts}`` with sizes as
    string keys), ``suppression`` (``{max_fraction, allowed_rows, suppressed_rows, suppressed_fraction, applied}``),
    ``released`` (``{rows, equivalence_classes, k}`` after suppression), ``sensitive_attributes``
    (``{name: {type, distance, distinct_l, entropy_l, recursive_c_bound, t}}``) and ``targets`` (a list of
    ``{measure, target, value, passed}``, with ``attribute`` for l and t).

    Raises:
        AnonymityInputError: unknown column, empty table, missing value in a QI or sensitive attribute, a target k
            larger than the table, a value outside a declared order or hierarchy.
    """
    qis = list(spec.quasi_identifiers)
    attributes = spec.sensitive_attributes
    check_columns(table, qis, "quasi-identifier")
    if attributes:
        check_columns(table, [a.name for a in attributes], "sensitive attribute")
    n = len(table)
    target_k = spec.targets.k
    if target_k is not None and target_k > n:
        raise AnonymityInputError(
            f"target k = {target_k} is larger than the table ({n} rows): no table this size can be {target_k}-anonymous"
        )

    classes = equivalence_classes(table, qis)
    report: dict[str, Any] = {
        "check": spec.check,
        "on_failure": spec.on_failure,
        "rows": n,
        "quasi_identifiers": qis,
        "equivalence_classes": classes.n_classes,
        "k": classes.k,
    }

    allowed_rows = math.floor(spec.suppression.max_fraction * n)
    released, released_classes = table, classes
    suppressed_rows = 0
    if target_k is not None:
        violation = violating_classes(classes, target_k)
        report["violating_classes"] = {
            "target_k": violation.target_k,
            "classes": violation.classes,
            "rows": violation.rows,
            "size_counts": {str(size): count for size, count in violation.size_counts.items()},
        }
        if 0 < violation.rows <= allowed_rows and violation.rows < n:
            keep = classes.sizes[classes.class_ids] >= target_k
            released = table.loc[keep]
            released_classes = _renumber(classes, keep)
            suppressed_rows = violation.rows
    report["suppression"] = {
        "max_fraction": float(spec.suppression.max_fraction),
        "allowed_rows": allowed_rows,
        "suppressed_rows": suppressed_rows,
        "suppressed_fraction": suppressed_rows / n,
        "applied": suppressed_rows > 0,
    }
    report["released"] = {
        "rows": int(len(released)),
        "equivalence_classes": released_classes.n_classes,
        "k": released_classes.k,
    }

    targets: list[dict[str, Any]] = []
    if target_k is not None:
        targets.append(
            {"measure": "k", "target": target_k, "value": released_classes.k, "passed": released_classes.k >= target_k}
        )
    target_l, target_t = spec.targets.l, spec.targets.t
    measured: dict[str, dict[str, Any]] = {}
    for attribute in attributes:
        hierarchy = attribute.value_hierarchy()
        dist = sensitive_distribution(
            released, released_classes, attribute.name, attribute.distance, hierarchy, attribute.order
        )
        distinct = dist.class_distinct_counts()
        entropies = dist.class_entropies()
        emd = class_emd(dist, attribute.distance, hierarchy)
        entry: dict[str, Any] = {
            "type": attribute.type,
            "distance": attribute.distance,
            "distinct_l": int(distinct.min()),
            "entropy_l": math.exp(float(entropies.min())),
            "recursive_c_bound": None,
            "t": float(emd.max()),
        }
        if target_l is not None:
            value, passed, failing = _l_result(target_l.kind, target_l.l, target_l.c, dist, distinct, entropies, entry)
            target_value = target_l.l if target_l.kind == "entropy" else int(target_l.l)
            result = {"measure": f"l_{target_l.kind}", "attribute": attribute.name, "target": target_value}
            if target_l.c is not None:
                result["c"] = target_l.c
            targets.append(result | {"value": value, "passed": passed, "failing_classes": failing})
        if target_t is not None:
            failing_t = int(np.count_nonzero(emd > target_t + _TOLERANCE))
            targets.append(
                {
                    "measure": "t",
                    "attribute": attribute.name,
                    "target": target_t,
                    "value": entry["t"],
                    "passed": failing_t == 0,
                    "failing_classes": failing_t,
                }
            )
        measured[attribute.name] = entry
    report["sensitive_attributes"] = measured
    report["targets"] = targets
    report["passed"] = all(t["passed"] for t in targets)
    return report


def _l_result(
    kind: str,
    l: float,
    c: float | None,
    dist: SensitiveDistribution,
    distinct: np.ndarray,
    entropies: np.ndarray,
    entry: dict[str, Any],
) -> tuple[float | int | None, bool, int]:
    """(table value, passed, number of failing classes) for one l target."""
    if kind == "distinct":
        failing = int(np.count_nonzero(distinct < l))
        return entry["distinct_l"], failing == 0, failing
    if kind == "entropy":
        failing = int(np.count_nonzero(entropies < math.log(l) - _TOLERANCE))
        return entry["entropy_l"], failing == 0, failing
    ratios = dist.class_recursive_ratios(int(l))
    bound = float(ratios.max())
    entry["recursive_c_bound"] = bound if math.isfinite(bound) else None
    failing = int(np.count_nonzero(~(ratios < c)))
    return entry["recursive_c_bound"], failing == 0, failing


def _renumber(classes: EquivalenceClasses, keep: np.ndarray) -> EquivalenceClasses:
    """The classes of the kept rows (whole classes are kept or dropped), renumbered from 0."""
    kept_ids = classes.class_ids[keep]
    surviving, new_ids = np.unique(kept_ids, return_inverse=True)
    return EquivalenceClasses(class_ids=new_ids.astype(np.intp), sizes=classes.sizes[surviving])
