"""The release page and route of a committed output too large to show (``queries.MAX_SHOWN_OUTPUT_VALUES`` values
once each aggregate is cut to its first values): a page saying so, and the JSON with ``output_too_large``, never
the output built whole (tests/ledger/test_large_outputs.py has the queries)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from dashboard_apps import dashboard, reserve
from dashboard_auth import bearer
from dp_operators.dashboard import queries
from ledger_backends import account_config, ledger_with


def test_the_release_page_says_an_output_is_too_large_to_show(ledger_url, token, monkeypatch):
    ledger = ledger_with(ledger_url, census=account_config("pure_dp", epsilon="10"))
    huge, rows = reserve(ledger, "census", "huge"), reserve(ledger, "census", "rows")
    ledger.commit(huge, [{} for _ in range(150_000)])
    ledger.commit(rows, {"aggregates": {"n": {"kind": "count", "rows": [{"value": i} for i in range(150_000)]}}})
    monkeypatch.setattr(queries, "MAX_SHOWN_OUTPUT_VALUES", 1000)
    with TestClient(dashboard(ledger), headers=bearer(token)) as client:
        page, api = client.get(f"/releases/{huge.charge_id}"), client.get(f"/api/releases/{huge.charge_id}")
        shown = client.get(f"/api/releases/{rows.charge_id}?limit=5").json()
        shown_page = client.get(f"/releases/{rows.charge_id}")
    assert page.status_code == 200 and "too large to show here" in page.text and "huge" in page.text
    assert api.status_code == 200 and api.json()["output_too_large"] is True and api.json()["output"] is None
    # 150,000 rows, cut to their first: shown, whatever the bound on values kept
    assert shown["aggregates"][0]["values_total"] == 150_000 and len(shown["aggregates"][0]["values"]) == 5
    assert shown_page.status_code == 200 and "The first 200 of 150000 values." in shown_page.text
