"""Names and values a DAG author (or a spender holding the ledger connection) controls, each made hostile: HTML,
attribute, script-closing, URL and plotly pseudo-HTML syntax (import as ``from hostile_names import ...``). The
``hostile`` fixture (conftest.py) is a ledger full of them; these helpers find its pages."""

from __future__ import annotations

from urllib.parse import quote

from dp_operators.ledger import Ledger

# Every string a DAG author (or a spender with the ledger connection) controls, each carrying HTML, attribute,
# script-closing, URL and plotly pseudo-HTML syntax. "PWN" marks them, so a test can find where they ended up.
HOSTILE_ACCOUNT = "acct\"'><img src=x onerror=window.PWN=1>&amp;</script>"
HOSTILE_DAG = "dag\"><svg onload=window.PWN=2>{{7*7}}%{y}"
HOSTILE_RUN = "run</script><script>window.PWN=3</script>/../../api/accounts?x=1#y javascript:PWN"
HOSTILE_TASK = "task<iframe srcdoc='<script>parent.PWN=4</script>'>"
HOSTILE_RELEASE = "<a href=\"javascript:window.PWN=5\">rel</a><!--"
HOSTILE_AGGREGATE = "agg<b onmouseover=window.PWN=6>bold</b>&lt;i&gt;entity&lt;/i&gt;"
HOSTILE_COLUMN = "col<style>*{display:none}</style>"
HOSTILE_KEYS = [
    "<a href=\"javascript:window.PWN=7\">click</a>",
    "&lt;img src=x onerror=window.PWN=8&gt;",  # entities plotly would decode if not escaped again
    "<br><span style=\"font-size:90px\">big</span>%{x}",
    "</script><script>window.PWN=9</script>",
]
HOSTILE_OUTPUT = {
    "release": "hostile",
    "confidence": 0.95,
    "aggregates": {
        HOSTILE_AGGREGATE: {
            "kind": "count<img src=x onerror=window.PWN=10>",
            "mechanism": "<script>window.PWN=11</script>",
            "group_by": [HOSTILE_COLUMN],
            "rows": [{HOSTILE_COLUMN: key, "value": i, "half_width": 1.5} for i, key in enumerate(HOSTILE_KEYS)],
        },
        "file<img src=x onerror=window.PWN=12>": {
            "kind": "count", "mechanism": "discrete_laplace", "group_by": ["k"],
            "rows_file": {"uri": "javascript:window.PWN=13//<img src=x onerror=window.PWN=14>",
                          "sha256": "<b>" + "a" * 61, "rows": 3, "format": "<svg onload=window.PWN=15>"},
        },
    },
}
HOSTILE_MECHANISMS = [{"mechanism": "<img src=x onerror=window.PWN=16>", "aggregate": HOSTILE_AGGREGATE},
                      {"mechanism": "discrete_laplace", "aggregate": HOSTILE_AGGREGATE}]


def hostile_release_id(ledger: Ledger, account: str = "census") -> int:
    """The charge id of the hostile run's release on ``account``."""
    return next(c["id"] for c in ledger.charges(account=account) if c["run_id"] == HOSTILE_RUN)


def run_path(dag_id: str, run_id: str) -> str:
    """The DAG-run tab's path as Airflow's UI fills it (``encodeURIComponent``)."""
    unreserved = "-_.!~*'()"
    return f"/runs/{quote(dag_id, safe=unreserved)}/{quote(run_id, safe=unreserved)}"


def hostile_pages(ledger: Ledger) -> list[str]:
    """Every page path that shows a hostile name or value, some with hostile query parameters."""
    release = hostile_release_id(ledger)
    return ["/", "/accounts/census", f"/accounts/{quote(HOSTILE_ACCOUNT, safe='')}",
            f"/accounts/census?dag_id={quote(HOSTILE_DAG, safe='')}", f"/releases/{release}",
            f"/releases/{hostile_release_id(ledger, HOSTILE_ACCOUNT)}", run_path(HOSTILE_DAG, HOSTILE_RUN),
            f"/accounts/{quote(HOSTILE_RUN, safe='')}", f"/releases/{release}?x=<script>",
            f"/accounts/census?state={quote(HOSTILE_TASK, safe='')}",
            f"/accounts/census?since={quote(HOSTILE_RELEASE, safe='')}&limit={quote(HOSTILE_DAG, safe='')}"]
