"""Privacy blocks: what a charge on k blocks costs against one on a plain account, in the same run.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/privacy_blocks.py [--charges 100] [--backends sqlite postgresql]

An account with daily privacy blocks for 2013 and a plain account are applied to a fresh ledger (SQLite file;
PostgreSQL at ``DP_LEDGER_TEST_PG_URL``, default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``, in a
throwaway schema). ``--charges`` reserve + commit pairs are made on the plain account, then on 1, 7 and 30 blocks
(a day, a week's sliding window, a month's); each pair is one release key. Printed per row: wall-clock and this
process's CPU (``time.process_time``) per pair, and the ratio of each to the plain account's. A charge on k blocks
is k member charges in one transaction (docs/adr/0034), so the cost grows linearly with k.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
import uuid
from fractions import Fraction
from pathlib import Path

import sqlalchemy as sa

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests")]

from dp_operators.ledger import LedgerConfig, ReleaseKey  # noqa: E402
from dp_operators.ledger.config import AccountConfig, BlockOpening, Blocks  # noqa: E402
from support import governor, spender  # noqa: E402

PG_URL = os.environ.get("DP_LEDGER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
DAYS = [(dt.date(2013, 1, 1) + dt.timedelta(days=i)).isoformat() for i in range(365)]


def _ledger_url(backend: str, workdir: Path) -> tuple[str, callable]:
    if backend == "sqlite":
        return f"sqlite:///{workdir / f'blocks-{uuid.uuid4().hex[:6]}.db'}", lambda: None
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()

    url = sa.make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), drop


def measure(backend: str, charges: int, workdir: Path) -> list[tuple[str, float, float]]:
    url, drop = _ledger_url(backend, workdir)
    try:
        officer = governor(url)
        officer.init_schema()
        common = {"accountant": "zcdp", "cap": Fraction(10**6), "privacy_unit": "flight", "allowed_dags": ["d"]}
        officer.apply_config(LedgerConfig(version=1, accounts={
            "plain": AccountConfig(**common),
            "daily": AccountConfig(**common, blocks=Blocks(window="day", open=BlockOpening(
                **{"from": dt.date(2013, 1, 1), "until": dt.date(2013, 12, 31)}))),
        }))
        ledger = spender(url)

        def run(tag: str, account: str, k: int, n: int) -> tuple[float, float]:
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(n):
                windows = None if k == 0 else DAYS[i % 300: i % 300 + k]
                reservation = ledger.reserve(ReleaseKey("d", f"{tag}-{i}", "t", -1, "r"), account=account,
                                             amount=Fraction(1, 8), mechanisms=[], spec_hash="0" * 64,
                                             windows=windows)
                ledger.commit(reservation, {"i": i})
            return (time.perf_counter() - wall) / n * 1000, (time.process_time() - cpu) / n * 1000

        run("warm", "plain", 0, 20)
        rows = [("plain account", *run("plain", "plain", 0, charges))]
        for k in (1, 7, 30):
            rows.append((f"{k} block{'s' if k > 1 else ''}", *run(f"b{k}", "daily", k, charges)))
        ledger.engine.dispose()
        officer.engine.dispose()
        return rows
    finally:
        drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--charges", type=int, default=100)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            rows = measure(backend, args.charges, Path(tmp))
            base_wall, base_cpu = rows[0][1], rows[0][2]
            print(f"\n## {backend}: reserve + commit, {args.charges} charges per row\n")
            print("| charged on | wall ms | ratio | CPU ms | ratio |\n|---|---|---|---|---|")
            for label, wall, cpu in rows:
                print(f"| {label} | {wall:.2f} | {wall / base_wall:.1f} | {cpu:.2f} | {cpu / base_cpu:.1f} |")


if __name__ == "__main__":
    main()
