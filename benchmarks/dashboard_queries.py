"""Wall time of the dashboard's queries (``dp_operators.dashboard.queries``) on a ledger of 10^5 charges.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/dashboard_queries.py [--charges 100000] [--repeat 5] [--backend both]

For each backend (a SQLite file; PostgreSQL at ``DP_LEDGER_TEST_PG_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``, in a throwaway database dropped afterwards) one account
``bench`` gets ``--charges`` committed releases from the bulk loader (``benchmarks/ledger_bulk.py``: the rows
``Ledger.reserve`` + ``commit`` write, 5,000 per transaction), plus one released, one abandoned and one reserved
charge through the API. The loader stamps every charge with the time it writes it, so the burn-down spans the
load's minute or so; the chart still has up to 500 buckets over 10^5 rows, which is what costs.

Each query runs ``--repeat`` times on one ``Ledger`` (its engines warm); the table gives the median seconds, the
ratio to the baseline measured in the same run (``SELECT count(*) FROM dp_charges``, the cheapest full look at the
table) and the issue's target: the account page and its JSON under 1 s at 10^5 charges.

Then the same through the dashboard app over HTTP (FastAPI's test client; the Airflow login dependency is replaced
by a fixed user, since a JWT check is the same for every page): the JSON routes and the HTML pages, once after the
background audit-chain check has finished (also timed: ``verify_ledger`` over the whole ledger) and once while it
runs in the same process (it holds the GIL for most of its run), which is what a user sees every
``dashboard_verify_interval`` seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from ledger_bulk import (  # noqa: E402
    SYNTHETIC_MECHANISMS,
    bench_account,
    bulk_load,
    init_ledger,
    synthetic_releases,
    throwaway_database,
)

from dp_operators.dashboard import queries  # noqa: E402
from dp_operators.ledger import Ledger, ReleaseKey  # noqa: E402
from dp_operators.ledger.keys import AuditKey  # noqa: E402

ACCOUNT = "bench"
TARGET_SECONDS = 1.0


def _median_seconds(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _build(url: str, charges: int) -> tuple[Ledger, list[int]]:
    governor_key, spend_key = AuditKey.generate(), AuditKey.generate()
    init_ledger(url, governor_key, spend_key, **{ACCOUNT: bench_account()})
    summary = bulk_load(url, synthetic_releases(charges, (ACCOUNT,)), spend_key=spend_key)
    print(f"  loaded {summary.charges} charges in {summary.seconds:.1f} s", flush=True)
    ledger = Ledger(url, audit_key=spend_key)
    for run, finish in (("api-released", ledger.release), ("api-abandoned", ledger.abandon), ("api-reserved", None)):
        reservation = ledger.reserve(ReleaseKey("d", run, "t", -1, "r"), account=ACCOUNT, amount=Fraction(1, 10**6),
                                     mechanisms=SYNTHETIC_MECHANISMS, spec_hash="0" * 64)
        if finish is not None:
            finish(reservation)
    return ledger, summary.charge_ids


def _run(backend: str, charges: int, repeat: int, workdir: Path) -> list[tuple[str, str, float, float]]:
    url, dispose = throwaway_database(backend, workdir)
    try:
        ledger, ids = _build(url, charges)
        middle = ids[len(ids) // 2]

        def baseline() -> int:
            with ledger._read() as conn:
                return conn.execute(sa.text("SELECT count(*) FROM dp_charges")).scalar()

        detail = queries.account_detail(ledger, ACCOUNT)
        assert detail["charge_counts"]["total"] == charges + 3, detail["charge_counts"]
        assert len(detail["burn_down"]["points"]) <= queries.MAX_BURN_DOWN_POINTS
        cases: list[tuple[str, Callable[[], object]]] = [
            ("baseline: SELECT count(*)", baseline),
            ("accounts_overview", lambda: queries.accounts_overview(ledger)),
            ("account_detail", lambda: queries.account_detail(ledger, ACCOUNT)),
            ("account_charges first page", lambda: queries.account_charges(ledger, ACCOUNT)),
            ("account_charges page after middle id", lambda: queries.account_charges(ledger, ACCOUNT, after=middle)),
            ("account_charges state=abandoned", lambda: queries.account_charges(ledger, ACCOUNT, state="abandoned")),
            ("account_charges dag_id=d, 200 a page", lambda: queries.account_charges(ledger, ACCOUNT, dag_id="d",
                                                                                      limit=200)),
            ("release_detail", lambda: queries.release_detail(ledger, middle)),
        ]
        rows = []
        base = None
        for name, work in cases:
            work()  # warm: compiled statements, pooled connections
            seconds = _median_seconds(work, repeat)
            base = base or seconds
            rows.append((backend, name, seconds, seconds / base))
        rows += _through_the_app(backend, ledger, middle, repeat, base)
        ledger.engine.dispose()
        if ledger._reader is not ledger.engine:
            ledger._reader.dispose()
        return rows
    finally:
        dispose()


def _through_the_app(
    backend: str, ledger: Ledger, charge_id: int, repeat: int, base: float
) -> list[tuple[str, str, float, float]]:
    from fastapi.testclient import TestClient

    from dp_operators.dashboard.app import create_app, require_dashboard_user

    app = create_app(lambda: ledger, verify_interval=10**9)
    app.dependency_overrides[require_dashboard_user] = lambda: "benchmark"
    routes = [
        ("GET /api/accounts/bench", f"/api/accounts/{ACCOUNT}"),
        ("GET /api/accounts/bench/charges", f"/api/accounts/{ACCOUNT}/charges"),
        ("page /", "/"),
        ("page /accounts/bench", f"/accounts/{ACCOUNT}"),
        ("page /accounts/bench?state=committed", f"/accounts/{ACCOUNT}?state=committed&limit=200"),
        ("page /releases/ID", f"/releases/{charge_id}"),
    ]
    rows = []
    with TestClient(app) as client:

        def get(path: str) -> None:
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code, response.text[:300])

        started = time.perf_counter()
        get("/api/audit-chain")  # starts the background check
        while client.get("/api/audit-chain").json()["state"] == "pending":
            time.sleep(0.05)
        audit = client.get("/api/audit-chain").json()
        assert audit["state"] == "ok", audit
        rows.append((backend, "audit-chain check (background)", time.perf_counter() - started, 0.0))
        for name, path in routes:
            get(path)
            seconds = _median_seconds(lambda: get(path), repeat)
            rows.append((backend, name, seconds, seconds / base))
        app.state.verify = create_app(lambda: ledger, verify_interval=0).state.verify  # a check on every request
        get("/api/audit-chain")
        time.sleep(0.5)  # let it get going
        path = f"/accounts/{ACCOUNT}"
        seconds = _median_seconds(lambda: get(path), repeat)
        rows.append((backend, "page /accounts/bench during the check", seconds, seconds / base))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    args = parser.parse_args()
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    results = []
    with tempfile.TemporaryDirectory(prefix="dp-dashboard-bench-") as workdir:
        for backend in backends:
            print(f"{backend}: building a ledger of {args.charges} charges", flush=True)
            results += _run(backend, args.charges, args.repeat, Path(workdir))
    print(f"\nmedian of {args.repeat} runs, {args.charges} charges; target {TARGET_SECONDS:g} s for the account page")
    print(f"{'backend':<11} {'query':<40} {'seconds':>9} {'x count(*)':>11}  target")
    for backend, name, seconds, ratio in results:
        timed = not name.startswith(("baseline", "audit-chain"))
        verdict = ("ok" if seconds < TARGET_SECONDS else "MISSED") if timed else ""
        print(f"{backend:<11} {name:<40} {seconds:>9.4f} {ratio:>11.1f}  {verdict}")


if __name__ == "__main__":
    main()
