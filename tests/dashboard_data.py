"""Data shared by the dashboard's tests (tests/dashboard/): mechanisms and a committed output to store in test
ledgers, and the charge filters every charges route must refuse."""

from __future__ import annotations

import pytest

MECHANISMS = [
    {"mechanism": "discrete_laplace", "scale": 10.0},
    {"mechanism": "discrete_gaussian", "sigma": 3.0},
    {"mechanism": "discrete_laplace", "scale": 5.0},
]

#: A committed output: a grouped count, an ungrouped count, a saturated sum with an open interval, and an aggregate
#: stored as a rows file.
OUTPUT = {
    "release": "r",
    "confidence": 0.95,
    "aggregates": {
        "by_sex": {
            "kind": "count", "mechanism": "discrete_laplace", "group_by": ["sex"],
            "rows": [{"sex": "F", "value": 10, "half_width": 3.0}, {"sex": "M", "value": 12, "half_width": 3.0}],
        },
        "total": {"kind": "count", "mechanism": "discrete_laplace", "group_by": [], "value": 22, "half_width": 1.5},
        "capped": {
            "kind": "sum", "mechanism": "discrete_laplace", "group_by": ["k"],
            "rows": [{"k": "a", "value": 100, "half_width": None, "saturated": True, "interval": [90.0, None]}],
        },
        "large": {
            "kind": "count", "mechanism": "discrete_laplace", "group_by": ["k"],
            "rows_file": {"uri": "file:///x~rows/abc.parquet", "sha256": "ab" * 32, "rows": 10**6,
                          "format": "parquet"},
        },
    },
}

#: Charge filters refused (422) by the JSON route and the account page alike.
BAD_CHARGE_FILTERS = [
    pytest.param({"limit": "0"}, id="limit 0"),
    pytest.param({"limit": "501"}, id="limit over 500"),
    pytest.param({"limit": "ten"}, id="limit not a number"),
    pytest.param({"state": "spent"}, id="unknown state"),
    pytest.param({"since": "last tuesday"}, id="since not ISO 8601"),
    pytest.param({"since": "2025-02-01T00:00:00Z", "until": "2025-01-01T00:00:00Z"}, id="since after until"),
    pytest.param({"after": "0"}, id="after not a charge id"),
]
