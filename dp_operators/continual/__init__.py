"""Series: running totals released at every step of a scheduled series from one budget (continual release).

:mod:`.strategies` (the factorizations ``A = B C`` of the prefix-sum matrix, their exact sensitivities under a
contribution pattern, their step variances), :mod:`.plan` (the noise a budget sets, the planned errors, the choice
of ``mechanism: auto``). Public parameters only; nothing here reads data. Decisions: docs/adr/0032.
"""

from __future__ import annotations

from dp_operators._lazy import lazy_attributes

#: public name -> defining submodule, imported on first use (PEP 562)
_LAZY = {
    "BinaryTree": "strategies", "Participation": "strategies", "SquareRootToeplitz": "strategies",
    "Strategy": "strategies", "SummedIncrements": "strategies", "prefix_sum_lower_bound": "strategies",
    "strategies": "strategies",
    "MECHANISMS": "plan", "Candidate": "plan", "SeriesPlan": "plan", "plan_series": "plan",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
