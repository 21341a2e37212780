"""Coverage of the published 95 % intervals of counts, sums, means and variances, measured through the engine's
plan, samplers and publication (benchmarks/interval_coverage.py), with a negative control."""

from __future__ import annotations

import importlib.util

import pytest

from support import REPO

TOLERANCE = 0.015  # about three standard errors at 2,000 partitions


def benchmark():
    loaded = importlib.util.spec_from_file_location("interval_coverage", REPO / "benchmarks" / "interval_coverage.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("budget", [pytest.param({"rho": "1/10"}, id="rho 0.1"),
                                    pytest.param({"epsilon": 1}, id="epsilon 1")])
def test_every_kind_covers_at_least_the_nominal_level(budget):
    """Every kind's measured coverage is at least 95 % minus the sampling tolerance."""
    measured = benchmark().coverage(budget, keys=2000, repeats=1, seed=7)
    for kind, (share, _) in measured.items():
        assert share >= 0.95 - TOLERANCE, (kind, share)


@pytest.mark.slow
def test_a_too_narrow_interval_is_detected(monkeypatch):
    """Negative control: half-widths scaled by 0.7 under-cover, and the test above would reject them."""
    module = benchmark()
    original = module.published_interval

    def narrowed(row):
        if row.get("half_width") is None:
            return original(row)
        return original({**row, "half_width": 0.7 * row["half_width"]})

    monkeypatch.setattr(module, "published_interval", narrowed)
    measured = module.coverage({"rho": "1/10"}, keys=2000, repeats=1, seed=7)
    assert all(share < 0.95 - TOLERANCE for share, _ in measured.values()), measured
