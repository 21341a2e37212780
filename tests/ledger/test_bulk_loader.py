"""The benchmarks' bulk loader (benchmarks/ledger_bulk.py) writes what the API writes, so its ledgers verify.

The same releases go once through the loader and once through ``Ledger.reserve`` + ``Ledger.commit``, into two
ledgers on the same backend: both must verify (with both keys), and their rows must agree column by column except
where the API itself varies from run to run (timestamps, the random reservation token and what hashes it).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
import sys
import uuid
from fractions import Fraction
from pathlib import Path

import pytest
import sqlalchemy as sa

from dp_operators.ledger import (
    BudgetExhaustedError,
    DagNotAllowedError,
    LedgerConfig,
    LedgerKeyError,
    ReleaseKey,
    schema,
)
from dp_operators.ledger.keys import AuditKey
from ledger_backends import account_config
from support import GOVERNOR_KEY, REPO, SPEND_KEY, governor, spender


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


bulk = _load_module("ledger_bulk", REPO / "benchmarks" / "ledger_bulk.py")

COUNT = 50
HEX64 = re.compile(r"[0-9a-f]{64}")
#: Columns that differ between two runs of the API itself: when, and the random token and what hashes it.
CHARGE_RUN_COLUMNS = ("token_hash", "lease_expires_at", "created_at", "updated_at")
EVENT_RUN_COLUMNS = ("created_at", "token_hash", "proof", "prev_hash", "row_hash")


def _accounts() -> dict:
    return {
        "pure": account_config("pure_dp", cap=1, dags=("d", "e")),
        "approx": account_config("approx_dp", cap=1, delta="1e-5", dags=("d",)),
    }


def _releases() -> list:
    """COUNT releases over a pure and an approx_dp account; amounts that need rounding up, deltas, two DAGs."""
    releases = []
    for i in range(COUNT):
        on_approx = i % 3 == 0
        releases.append(
            bulk.BulkRelease(
                key=ReleaseKey("d" if on_approx or i % 2 else "e", f"run-{i}", f"task-{i % 4}", i % 5 - 1, "r"),
                account="approx" if on_approx else "pure",
                amount=Fraction(1, 3 * 10**4 + i),
                mechanisms=[{"mechanism": "discrete_gaussian", "sigma2": str(Fraction(i + 1, 7))}],
                spec_hash=f"{i:064x}",
                output={"value": i, "noisy": [i * 0.5, None]},
                try_number=None if i == 7 else 1 + i % 3,
                delta=Fraction(1, 10**8 + i) if on_approx else Fraction(0),
                audit={"run_type": "manual" if i % 2 else "scheduled", "triggering_user": f"user-{i % 3}"},
            )
        )
    return releases


def _sibling_url(url: str, tmp_path: Path) -> str:
    """A second empty ledger database on the same backend as ``url`` (another file, or another schema)."""
    if url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'second.db'}"
    name = f"t_{uuid.uuid4().hex[:12]}"
    parsed = sa.make_url(url)
    engine = sa.create_engine(parsed, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    engine.dispose()
    return parsed.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(hide_password=False)


def _init(url: str) -> None:
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts=_accounts()))


def _rows(url: str, table: sa.Table, order: sa.Column) -> list[dict]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(sa.select(table).order_by(order))]
    finally:
        engine.dispose()


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def test_a_bulk_loaded_ledger_verifies_and_matches_one_written_by_the_api(ledger_url: str, tmp_path: Path) -> None:
    loaded_url, api_url = ledger_url, _sibling_url(ledger_url, tmp_path)
    releases = _releases()
    _init(loaded_url)
    summary = bulk.bulk_load(loaded_url, releases, spend_key=SPEND_KEY, per_transaction=7)
    assert (summary.charges, summary.events, summary.transactions) == (COUNT, 2 * COUNT, 8)

    _init(api_url)
    api = spender(api_url)
    for release in releases:
        reservation = api.reserve(
            release.key, account=release.account, amount=release.amount, mechanisms=release.mechanisms,
            spec_hash=release.spec_hash, try_number=release.try_number, delta=release.delta, audit=release.audit,
        )
        api.commit(reservation, release.output)

    for url in (loaded_url, api_url):
        report = governor(url).verify()
        assert report.problems == []
        assert report.authenticated
        assert (report.charges, report.events, report.accounts) == (COUNT, 2 * COUNT + 2, 2)

    loaded_charges = _rows(loaded_url, schema.charges, schema.charges.c.id)
    api_charges = _rows(api_url, schema.charges, schema.charges.c.id)
    assert [row["id"] for row in loaded_charges] == summary.charge_ids
    assert len(loaded_charges) == len(api_charges) == COUNT
    for loaded, written in zip(loaded_charges, api_charges):
        assert loaded.keys() == written.keys()
        same = {name for name in written if name not in CHARGE_RUN_COLUMNS}
        assert {name: loaded[name] for name in same} == {name: written[name] for name in same}
        assert HEX64.fullmatch(loaded["token_hash"]) and HEX64.fullmatch(written["token_hash"])
        for row in (loaded, written):
            assert type(row["created_at"]) is type(written["created_at"])
            lease = _aware(row["lease_expires_at"]) - _aware(row["created_at"])
            assert abs(lease.total_seconds() - 120) < 5
            assert _aware(row["updated_at"]) >= _aware(row["created_at"])

    loaded_events = _rows(loaded_url, schema.audit_events, schema.audit_events.c.id)
    api_events = _rows(api_url, schema.audit_events, schema.audit_events.c.id)
    assert len(loaded_events) == len(api_events) == 2 * COUNT + 2
    for loaded, written in zip(loaded_events[2:], api_events[2:]):  # after the two account_created events
        same = {name for name in written if name not in EVENT_RUN_COLUMNS}
        assert {name: loaded[name] for name in same} == {name: written[name] for name in same}
        for name in EVENT_RUN_COLUMNS:
            assert (loaded[name] is None) == (written[name] is None), name
            assert type(loaded[name]) is type(written[name]), name
            if loaded[name] is not None:
                assert len(loaded[name]) == len(written[name]), name

    loaded_accounts = _rows(loaded_url, schema.accounts, schema.accounts.c.name)
    api_accounts = _rows(api_url, schema.accounts, schema.accounts.c.name)
    for loaded, written in zip(loaded_accounts, api_accounts):
        for name in ("name", "spent", "delta_spent", "audit_seq", *schema.ACCOUNT_GOVERNED_COLUMNS):
            assert loaded[name] == written[name], name
        assert HEX64.fullmatch(loaded["audit_head"])
    assert Fraction(loaded_accounts[0]["delta_spent"]) > 0  # the approx_dp account was charged delta


@pytest.mark.parametrize(
    "change, error",
    [
        pytest.param({"amount": Fraction(2)}, BudgetExhaustedError, id="over the cap"),
        pytest.param({"key": ReleaseKey("intruder", "run-x", "t", -1, "r")}, DagNotAllowedError, id="DAG not allowed"),
    ],
)
def test_the_loader_refuses_what_the_api_refuses_and_rolls_the_batch_back(
    ledger_url: str, change: dict, error: type
) -> None:
    _init(ledger_url)
    releases = _releases()[:10]
    bad = releases[7]
    releases[7] = bulk.BulkRelease(**{**bad.__dict__, **change})
    with pytest.raises(error):
        bulk.bulk_load(ledger_url, releases, spend_key=SPEND_KEY, per_transaction=5)
    ledger = spender(ledger_url)
    assert [charge["run_id"] for charge in ledger.charges()] == [f"run-{i}" for i in range(5)]
    assert governor(ledger_url).verify().problems == []


def test_the_loader_refuses_a_key_the_account_does_not_accept(ledger_url: str) -> None:
    _init(ledger_url)
    with pytest.raises(LedgerKeyError):
        bulk.bulk_load(ledger_url, _releases()[:3], spend_key=AuditKey.from_text("w" * 40))
    with pytest.raises(LedgerKeyError):  # the governor's key is not a spend key the account accepts either
        bulk.bulk_load(ledger_url, _releases()[:3], spend_key=GOVERNOR_KEY)
    assert list(spender(ledger_url).charges()) == []
