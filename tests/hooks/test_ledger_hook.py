"""``DPLedgerHook``: from an Airflow Connection to a ledger, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import Connection

from dp_operators.get_provider_info import get_provider_info
from dp_operators.hooks.ledger import DPLedgerHook, ledger_url_from_connection
from dp_operators.ledger import Ledger


def connection_env(monkeypatch, conn_id: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        pytest.param({"conn_type": "dp_ledger", "extra": json.dumps({"url": "sqlite:////srv/l.db"})},
                     "sqlite:////srv/l.db", id="dp_ledger with a url extra"),
        pytest.param({"conn_type": "dp_ledger", "host": "/srv/l.db"}, "sqlite:////srv/l.db",
                     id="dp_ledger with a SQLite path in host"),
        pytest.param({"conn_type": "postgres", "host": "db", "port": 5433, "login": "dp", "password": "s3cret",
                      "schema": "ledger"},
                     "postgresql+psycopg://dp:s3cret@db:5433/ledger", id="a postgres connection"),
    ],
)
def test_connection_forms_give_a_ledger_url(fields, url):
    assert ledger_url_from_connection(Connection(conn_id="x", **fields)) == url


def test_a_connection_that_says_nothing_is_refused():
    with pytest.raises(ValueError, match="does not say where the ledger is"):
        ledger_url_from_connection(Connection(conn_id="x", conn_type="dp_ledger"))


def test_hook_reads_an_environment_connection_and_tests_it(ledger_url, monkeypatch):
    connection_env(monkeypatch, "my_ledger", conn_type="dp_ledger", extra={"url": ledger_url})
    hook = DPLedgerHook(ledger_conn_id="my_ledger")
    ok, message = hook.test_connection()
    assert not ok and "dpctl ledger init" in message
    Ledger(ledger_url).init_schema()
    assert hook.test_connection() == (True, "ledger reachable, schema up to date")
    assert hook.get_ledger().accounts() == []


def test_the_hook_is_registered_as_a_connection_type():
    info = get_provider_info()
    assert {"hook-class-name": "dp_operators.hooks.ledger.DPLedgerHook", "connection-type": "dp_ledger"} in info[
        "connection-types"
    ]
    assert DPLedgerHook.default_conn_name == "dp_ledger_default" and DPLedgerHook.conn_type == "dp_ledger"
