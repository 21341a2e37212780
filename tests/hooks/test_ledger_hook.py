"""``DPLedgerHook``: from an Airflow Connection to the spender's ledger and its spend key, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
from fractions import Fraction

import pytest
from airflow.sdk import Connection

from dp_operators.get_provider_info import get_provider_info
from dp_operators.hooks.ledger import DPLedgerHook, audit_key_from_connection, ledger_url_from_connection
from dp_operators.ledger import Ledger, LedgerKeyError, ReleaseKey
from support import GOVERNOR_KEY, SPEND_KEY, governor, make_ledger


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
    connection_env(monkeypatch, "my_ledger", conn_type="dp_ledger", extra={"url": ledger_url,
                                                                           "audit_key": SPEND_KEY.text})
    hook = DPLedgerHook(ledger_conn_id="my_ledger")
    ok, message = hook.test_connection()
    assert not ok and "dpctl ledger init" in message
    governor(ledger_url).init_schema()
    assert hook.test_connection() == (True, "ledger reachable, schema up to date")
    assert hook.get_ledger().accounts() == []


def reserve(ledger: Ledger):
    return ledger.reserve(ReleaseKey("adult_census_release", "run", "t", -1, "r"), account="census_adult",
                          amount=Fraction(1, 100), mechanisms=[], spec_hash="0" * 64)


def test_the_spend_key_comes_from_the_connections_extra(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    make_ledger(tmp_path / "ledger.db")
    connection_env(monkeypatch, "workers", conn_type="dp_ledger", extra={"url": url, "audit_key": SPEND_KEY.text})
    ledger = DPLedgerHook(ledger_conn_id="workers").get_ledger(lease_seconds=30)
    reservation = reserve(ledger)
    assert reservation.charge_id and ledger.lease_seconds == 30
    event = list(Ledger(url).events("census_adult"))[-1]
    assert event["event"] == "reserved" and event["key_id"] == SPEND_KEY.key_id


def test_a_connection_without_audit_key_can_read_but_not_reserve(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    make_ledger(tmp_path / "ledger.db")
    connection_env(monkeypatch, "readers", conn_type="dp_ledger", extra={"url": url})
    hook = DPLedgerHook(ledger_conn_id="readers")
    ledger = hook.get_ledger()
    assert [a.name for a in ledger.accounts()] == ["census_adult"]
    with pytest.raises(LedgerKeyError, match="set the extra 'audit_key' of the ledger connection"):
        reserve(ledger)
    assert list(ledger.charges()) == []
    ok, message = hook.test_connection()
    assert ok and "no extra 'audit_key', so tasks cannot reserve budget" in message


def test_a_key_too_short_is_refused_without_showing_it():
    extra = json.dumps({"url": "sqlite://", "audit_key": "hunter2"})
    conn = Connection(conn_id="x", conn_type="dp_ledger", extra=extra)
    with pytest.raises(LedgerKeyError, match="connection 'x', extra 'audit_key': an audit key needs at least") as error:
        audit_key_from_connection(conn)
    assert "hunter2" not in str(error.value)


def test_a_governor_key_in_the_workers_connection_is_warned_about_and_not_used(tmp_path, monkeypatch, caplog):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    make_ledger(tmp_path / "ledger.db")
    connection_env(monkeypatch, "workers", conn_type="dp_ledger",
                   extra={"url": url, "governor_key": GOVERNOR_KEY.text})
    with caplog.at_level(logging.WARNING, logger="dp_operators.hooks.ledger"):
        ledger = DPLedgerHook(ledger_conn_id="workers").get_ledger()
    assert "holds a governor_key" in caplog.text and GOVERNOR_KEY.text not in caplog.text
    with pytest.raises(LedgerKeyError):  # the governor key is never the spender's key
        reserve(ledger)


def test_the_connection_form_says_where_the_spend_key_goes():
    behaviour = DPLedgerHook.get_ui_field_behaviour()
    assert '"audit_key"' in behaviour["placeholders"]["extra"]
    assert "audit_key" in DPLedgerHook.__doc__ and "governor key" in DPLedgerHook.__doc__


def test_the_hook_is_registered_as_a_connection_type():
    info = get_provider_info()
    assert {"hook-class-name": "dp_operators.hooks.ledger.DPLedgerHook", "connection-type": "dp_ledger"} in info[
        "connection-types"
    ]
    assert DPLedgerHook.default_conn_name == "dp_ledger_default" and DPLedgerHook.conn_type == "dp_ledger"


def test_the_lease_can_be_set_on_the_connection(tmp_path, monkeypatch):
    path = tmp_path / "ledger.db"
    make_ledger(path)
    extra = {"url": f"sqlite:///{path}", "audit_key": SPEND_KEY.text, "lease_seconds": 30}
    connection_env(monkeypatch, "lease_test", conn_type="dp_ledger", extra=json.dumps(extra))
    assert DPLedgerHook(ledger_conn_id="lease_test").get_ledger().lease_seconds == 30
    assert DPLedgerHook(ledger_conn_id="lease_test").get_ledger(lease_seconds=5).lease_seconds == 5


@pytest.mark.parametrize("lease", [0, -1, 3601, "60", True, float("nan")])
def test_a_bad_lease_on_the_connection_is_refused_with_its_name(tmp_path, monkeypatch, lease):
    extra = {"url": f"sqlite:///{tmp_path / 'l.db'}", "lease_seconds": lease}
    connection_env(monkeypatch, "lease_bad", conn_type="dp_ledger", extra=json.dumps(extra, allow_nan=True))
    with pytest.raises(ValueError, match="connection 'lease_bad': extra 'lease_seconds' must be a number of seconds"):
        DPLedgerHook(ledger_conn_id="lease_bad").get_ledger()
