"""Re-identification risk of a released microdata table under the prosecutor, journalist and marketer attacker models.

El Emam & Dankar, "Protecting Privacy Using k-Anonymity", JAMIA 15(5), 2008; El Emam, "Guide to the
De-Identification of Personal Health Information" (2013), chapter 14; the same three models as ARX's risk analysis.

Notation: the released table (the *sample*) has equivalence classes ``E_j`` of sizes ``f_j`` (``n`` released rows in
all); the attacker's identification table (the *population*) has the matching classes of sizes ``F_j >= f_j``.

- **Prosecutor** (the attacker knows the target is in the release): record risk ``1 / f_j``.
- **Journalist** (the attacker knows only that the target is in the population): record risk ``1 / F_j``.
- **Marketer** (the attacker re-identifies as many records as possible): expected fraction re-identified
  ``(1 / n) * sum_j f_j / F_j``.

For the prosecutor and journalist we report the *highest* record risk, the *average* risk and the fraction of
*records at risk*, whose record risk exceeds a threshold. The prosecutor average is ``J / n`` (``J`` the number of
released classes). The journalist average is El Emam's (Guide, "Measuring the Probability of Re-identification"), as
ARX computes it (``RiskModelSampleSummary.getJournalistRisk``): ``max(J / sum_j F_j, (1 / n) * sum_j f_j / F_j)``,
the sums over the released classes. The first term is the average risk of a target drawn from the matching
population classes, the second the marketer figure; the larger is reported so that neither attacker is understated.
Without a separate population the released table is its own population (``F = f``): both terms are ``J / n`` and the
journalist figures equal the prosecutor's, as in ARX without a research subset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Per-record risks are ratios 1/f: a class of exactly 1/threshold records must not count as "above" on the last bit.
#: *Relative* (a fraction of the target), so that it stays below the gap between 1/f and 1/(f + 1) for any class
#: size a table can have: an absolute 1e-12 would treat every size above ~1e6 as meeting a risk of 1e-12.
RISK_TOLERANCE = 1e-12


def exceeds(value: np.ndarray | float, target: float) -> np.ndarray | bool:
    """Whether a risk figure is above ``target`` beyond float rounding: ``value > target * (1 + RISK_TOLERANCE)``.

    Args:
        value: risk figures (any shape) or one figure, each in ``[0, 1]``.
        target: the largest value allowed, ``>= 0``.

    Returns:
        a bool array of ``value``'s shape (a bool for a scalar).
    """
    return value > target * (1.0 + RISK_TOLERANCE)


def record_risks(sizes: np.ndarray) -> np.ndarray:
    """``1 / size`` per class, shape ``(n_classes,)``, float64 (sizes >= 1)."""
    return 1.0 / np.asarray(sizes, dtype=np.float64)


def risk_summary(sample_sizes: np.ndarray, population_sizes: np.ndarray | None, threshold: float) -> dict[str, Any]:
    """The three models' figures for one released table.

    Args:
        sample_sizes: released rows per class, shape ``(n_classes,)``, all >= 1.
        population_sizes: the same classes' sizes in the attacker's population, shape ``(n_classes,)``, each
            ``>= sample_sizes``; ``None`` when the release is its own population.
        threshold: a record is *at risk* when its record risk exceeds this, in ``(0, 1]``.

    Returns:
        ``{"threshold", "population": "release" | "given", "prosecutor": {highest, average, records_at_risk},
        "journalist": {highest, average, records_at_risk}, "marketer": {average}}``; plain floats in ``[0, 1]``
        (all 0 for an empty release). The journalist ``average`` is ``max(J / sum F, marketer average)`` (El Emam,
        "Guide to the De-Identification of Personal Health Information", 2013; ARX's ``RiskModelSampleSummary``).

    Raises:
        ValueError: shapes differ, a size is below 1, a population class is smaller than its sample class, or the
            threshold is outside ``(0, 1]``.
    """
    f = np.asarray(sample_sizes, dtype=np.int64)
    if not 0 < threshold <= 1:
        raise ValueError(f"the risk threshold must be in (0, 1], got {threshold}")
    if f.size and f.min() < 1:
        raise ValueError("class sizes must be >= 1")
    big_f = f if population_sizes is None else np.asarray(population_sizes, dtype=np.int64)
    if big_f.shape != f.shape:
        raise ValueError("population_sizes must have one entry per released class")
    if np.any(big_f < f):
        raise ValueError("a population class is smaller than the released class it contains")
    n = int(f.sum())
    population = "release" if population_sizes is None else "given"
    if n == 0:
        zero = {"highest": 0.0, "average": 0.0, "records_at_risk": 0.0}
        return {"threshold": threshold, "population": population, "prosecutor": dict(zero),
                "journalist": dict(zero), "marketer": {"average": 0.0}}
    prosecutor = record_risks(f)
    journalist = record_risks(big_f)
    marketer = float((f / big_f).sum() / n)
    journalist_average = max(f.size / float(big_f.sum()), marketer)
    return {
        "threshold": float(threshold),
        "population": population,
        "prosecutor": {
            "highest": float(prosecutor.max()),
            "average": f.size / n,
            "records_at_risk": float(f[exceeds(prosecutor, threshold)].sum() / n),
        },
        "journalist": {
            "highest": float(journalist.max()),
            "average": journalist_average,
            "records_at_risk": float(f[exceeds(journalist, threshold)].sum() / n),
        },
        "marketer": {"average": marketer},
    }
