"""The dashboard app as the tests build it (import as ``from dashboard_apps import ...``): over a given ledger, with
a stand-in for the audit-chain check unless a test is about the check, mounted as Airflow's api-server mounts a
plugin app, and driven straight through ASGI where a test client would refuse the request."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from fractions import Fraction

import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dp_operators.dashboard import app as dashboard_app
from dp_operators.ledger import Ledger, ReleaseKey

#: Where Airflow mounts the dashboard (the plugin's ``url_prefix``).
PREFIX = "/dp-budget"
MECHANISMS = [{"mechanism": "discrete_laplace", "scale": 10.0}]
#: 13,000 distinct parameters no route reads ("0&1&...&32c7"): 60 KB, under the 64 KB query that uvicorn with
#: httptools (the api-server's HTTP parser) accepts.
JUNK_PARAMETERS = "&".join(format(i, "x") for i in range(13_000))
#: What plotly has drawn once a chart is on the page.
PLOTLY_DRAWN = "svg.main-svg"


class AuditStandIn:
    """Stands for ``app.state.verify``: answers a fixed status (``status`` overrides fields of a passed check)."""

    def __init__(self, **status) -> None:
        self.result = {"state": "ok", "checked_at": "2025-03-01T12:00:00+00:00", "authenticated": False,
                       "problem_count": 0, "problems": [], "events": 14, "charges": 7, "accounts": 2,
                       "seconds": 0.25, "error": None, "running": False, **status}

    def status(self) -> dict:
        return self.result


def dashboard(ledger, audit: AuditStandIn | None = None, *, opened: list | None = None,
              own_audit_check: bool = False) -> FastAPI:
    """The dashboard app over ``ledger``; ``opened`` records each time the app opens the ledger; the audit-chain
    status is ``audit`` (a passed check by default), or the app's own background check with ``own_audit_check``
    (hourly, so a test sees at most the first)."""
    def factory():
        if opened is not None:
            opened.append(ledger)
        return ledger

    app = dashboard_app.create_app(factory, verify_interval=3600)
    if not own_audit_check:
        app.state.verify = audit or AuditStandIn()
    return app


def mount(app: FastAPI) -> FastAPI:
    """``app`` mounted at :data:`PREFIX` as Airflow's api-server mounts a plugin app (``init_plugins``)."""
    parent = FastAPI()
    parent.mount(PREFIX, app)
    return parent


def reserve(ledger: Ledger, account: str, run: str, amount: str = "1/100", *, dag: str = "d", task: str = "t",
            release: str = "r", mechanisms=MECHANISMS):
    """A reservation of ``amount`` (a fraction's text) on ``account`` for release key (dag, run, task, -1, release)."""
    return ledger.reserve(ReleaseKey(dag, run, task, -1, release), account=account, amount=Fraction(amount),
                          mechanisms=mechanisms, spec_hash="0" * 64)


def wait_for_check(client: TestClient, headers: dict[str, str] | None = None, deadline_seconds: float = 120) -> dict:
    """``/api/audit-chain`` once the app's check has left ``pending`` (the deadline only bounds a hang)."""
    deadline = time.monotonic() + deadline_seconds
    answer = client.get("/api/audit-chain", headers=headers).json()
    while answer["state"] == "pending" and time.monotonic() < deadline:
        time.sleep(0.05)
        answer = client.get("/api/audit-chain", headers=headers).json()
    return answer


def asgi_get(app: FastAPI, path: str, query: str = "", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET ``path?query`` straight through the ASGI interface, as a server hands it over (httpx refuses URLs over
    64 KB on the client side; uvicorn with httptools, Airflow's api-server, does not). Returns status and body."""
    import asyncio

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
             "server": ("testserver", 80), "client": ("127.0.0.1", 50000)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        asyncio.run(app(scope, receive, send))
    except Exception:  # noqa: BLE001  (Starlette re-raises after sending its 500)
        pass
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def integration_support():
    """``tests/integration``'s helpers (the browser's path and flags, a free port, the api-server runner); skips the
    calling test when the browser cannot run."""
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parents[1] / "integration")
    if folder not in sys.path:
        sys.path.append(folder)
    import dashboard_browser_support

    dashboard_browser_support.require_browser()
    return dashboard_browser_support


@contextlib.contextmanager
def counted_work(ledger: Ledger) -> Iterator[dict[str, int]]:
    """Counts, while the block runs, the SQL statements run on ``ledger``'s database (``ledger_statements``; Airflow's
    own metadata database, which authentication reads, is not counted) and the query-string lookups Starlette
    serves (``parameter_lookups``: ``getlist`` scans the whole list, so unknown parameters cost FastAPI a quadratic
    parse). Work counted, not time: it holds on a loaded machine."""
    from starlette.datastructures import ImmutableMultiDict

    counts = {"ledger_statements": 0, "parameter_lookups": 0}

    def on_execute(conn, *_args) -> None:
        if conn.engine.url == ledger.engine.url:
            counts["ledger_statements"] += 1

    original = ImmutableMultiDict.getlist

    def getlist(self, key):
        counts["parameter_lookups"] += 1
        return original(self, key)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", on_execute)
    ImmutableMultiDict.getlist = getlist
    try:
        yield counts
    finally:
        ImmutableMultiDict.getlist = original
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", on_execute)
