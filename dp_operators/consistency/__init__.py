"""Consistent releases: noised tables and their margins made to add up by post-processing (no privacy cost).

:mod:`.structure` (which cells sum to which, public parameters), :mod:`.wls` (the weighted least-squares fit, the
best linear unbiased estimate; Hay, Rastogi, Miklau, Suciu, VLDB 2010), :mod:`.variance` (the exact variances of the
fitted values, hence their half-widths), :mod:`.rounding` (non-negativity and controlled rounding that keep the
margins the sums of their cells, as the Census Bureau's TopDown does; Abowd et al. 2022). No Airflow import, no
ledger: these functions see noised values and public parameters only. User guide: docs/consistency.md.
"""

from __future__ import annotations

from dp_operators._lazy import lazy_attributes

#: public name -> defining submodule, imported on first use (PEP 562)
_LAZY = {
    "Family": "structure", "Member": "structure", "base_codes": "structure", "member_to_base": "structure",
    "MemberAccuracy": "variance", "accuracy": "variance", "half_widths": "variance", "quantile_factor": "variance",
    "consistent_values": "wls", "exact_sums": "wls", "fit": "wls",
    "controlled_rounding": "rounding", "nonnegative_fit": "rounding",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
