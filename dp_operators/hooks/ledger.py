"""Airflow hook turning a Connection into the spender's :class:`~dp_operators.ledger.Ledger`.

Connection forms (https://airflow.apache.org/docs/apache-airflow/stable/howto/connection.html):

* ``conn_type`` ``dp_ledger``: ``extra`` holds ``{"url": "<SQLAlchemy URL>", "audit_key": "<spend key>"}``, e.g.
  ``sqlite:////srv/ledger.db`` or ``postgresql+psycopg://spender@host:5432/ledger``; or ``host`` holds a SQLite
  file path.
* ``conn_type`` ``postgres``: host, port, login, password and schema (the database) of a PostgreSQL server; the
  spend key still goes in ``extra`` as ``audit_key`` (the password is the database's).

The spend key (``audit_key``, made by ``dpctl ledger keygen`` and given to the accounts by the privacy officer's
``dpctl ledger apply``) signs the tasks' spend events (docs/adr/0020). Keeping it in the connection's extra lets a
secrets backend (Vault, AWS Secrets Manager, ...) hold it with the rest of the connection. The *governor* key never
belongs in the workers' connection: tasks can read their connection, and whoever holds the governor key can sign
cap changes. ``dpctl`` may read it from a separate connection only the privacy officer uses (extra
``governor_key``, see :func:`governor_key_from_connection`). After a spend-key rotation, the extra
``retired_audit_keys`` (a list of the old keys' texts) lets a retry of a release committed under an old key
authenticate its audit events and replay it; those keys never sign.

Tasks cannot reach Airflow's own metadata database (Airflow 3), so the ledger always lives behind its own
Connection.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from airflow.sdk import BaseHook
from dp_operators.ledger import AuditKey, LedgerKeyError

if TYPE_CHECKING:
    from dp_operators.continual.state import SeriesKey
    from dp_operators.ledger import Ledger

log = logging.getLogger(__name__)

#: The connection extra holding the spend key (workers' connection).
AUDIT_KEY_EXTRA = "audit_key"
#: The connection extra holding the governor key (the privacy officer's connection, read by dpctl only).
GOVERNOR_KEY_EXTRA = "governor_key"


#: The connection extra setting the lease of reservations, in seconds.
LEASE_SECONDS_EXTRA = "lease_seconds"
#: Extra holding the spend keys a rotation retired (replays of releases they signed are authenticated with them).
RETIRED_KEYS_EXTRA = "retired_audit_keys"
#: The connection extra holding the series key (workers' connection): it seals series' noise state (ADR 32).
SERIES_KEY_EXTRA = "series_key"


def lease_seconds_from_extra(conn_id: str, value: Any) -> float:
    """The extra ``lease_seconds`` as a float in (0, MAX_LEASE_SECONDS].

    Raises:
        ValueError: not a number (bool included), not finite, or outside that range; names the connection.
    """
    from dp_operators.ledger.schema import MAX_LEASE_SECONDS

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_LEASE_SECONDS:
        raise ValueError(
            f"connection {conn_id!r}: extra {LEASE_SECONDS_EXTRA!r} must be a number of seconds in "
            f"(0, {MAX_LEASE_SECONDS}], got {value!r}"
        )
    return float(value)


def ledger_url_from_connection(conn: Any) -> str:
    """Build the ledger's SQLAlchemy URL from an Airflow ``Connection``.

    Raises:
        ValueError: the connection has neither a ``url`` extra, a SQLite path nor PostgreSQL fields.
    """
    extra = conn.extra_dejson or {}
    if extra.get("url"):
        return str(extra["url"])
    if conn.conn_type in ("postgres", "postgresql"):
        return URL.create(
            "postgresql+psycopg",
            username=conn.login or None,
            password=conn.password or None,
            host=conn.host or None,
            port=conn.port or None,
            database=conn.schema or None,
        ).render_as_string(hide_password=False)
    if conn.host:
        return f"sqlite:///{conn.host}"
    raise ValueError(
        f"connection {conn.conn_id!r} does not say where the ledger is: set extra {{\"url\": \"sqlite:////path\"}} "
        "or a PostgreSQL host"
    )


def _key_from_extra(conn: Any, name: str) -> AuditKey | None:
    value = (conn.extra_dejson or {}).get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise LedgerKeyError(f"connection {conn.conn_id!r}: extra {name!r} must be a string (the key's text)")
    try:
        key = AuditKey.from_text(value)
    except ValueError as error:  # the message never contains the key; a configuration error: no retry helps
        raise LedgerKeyError(f"connection {conn.conn_id!r}, extra {name!r}: {error}") from None
    _mask(key)
    return key


def _mask(key: AuditKey | SeriesKey) -> None:
    """Redact the key from task logs (Airflow masks extras by name, and ``audit_key`` is not one of its names)."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older Airflow
        return
    mask_secret(key.text)


def audit_key_from_connection(conn: Any) -> AuditKey | None:
    """The spend key in a connection's extra ``audit_key``, or ``None`` if it has none.

    Raises:
        LedgerKeyError: the value is not text of at least 32 characters (the message names the connection, never
            the value); a configuration error, so the operator fails the task without retrying.
    """
    return _key_from_extra(conn, AUDIT_KEY_EXTRA)


def retired_keys_from_connection(conn: Any) -> list[AuditKey]:
    """The spend keys in a connection's extra ``retired_audit_keys`` (a list of key texts; empty if unset): keys
    that signed releases before a rotation, used only to authenticate a replay of such a release, never to sign.

    Raises:
        LedgerKeyError: not a list of key texts (the message names the connection, never a value).
    """
    values = (conn.extra_dejson or {}).get(RETIRED_KEYS_EXTRA) or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise LedgerKeyError(f"connection {conn.conn_id!r}: extra {RETIRED_KEYS_EXTRA!r} must be a list of key texts")
    keys = []
    for value in values:
        try:
            keys.append(AuditKey.from_text(value))
        except ValueError as error:
            raise LedgerKeyError(f"connection {conn.conn_id!r}, extra {RETIRED_KEYS_EXTRA!r}: {error}") from None
        _mask(keys[-1])
    return keys


def governor_key_from_connection(conn: Any) -> AuditKey | None:
    """The governor key in a connection's extra ``governor_key`` (a connection only the privacy officer's
    ``dpctl`` uses), or ``None``. :meth:`DPLedgerHook.get_ledger` never reads it.

    Raises:
        LedgerKeyError: as :func:`audit_key_from_connection`.
    """
    return _key_from_extra(conn, GOVERNOR_KEY_EXTRA)


class DPLedgerHook(BaseHook):
    """Hook for the privacy-budget ledger: what release tasks use to spend.

    The connection says where the ledger is (extra ``url``, a SQLite path in ``host``, or a ``postgres``
    connection's fields) and holds the spend key in extra ``audit_key``; the key can come from a secrets backend
    like any connection. Without ``audit_key`` the ledger can still be read, but a reservation raises
    :class:`~dp_operators.ledger.LedgerKeyError` saying to set it. Never put the governor key in this connection.

    Args:
        ledger_conn_id: the Airflow connection id (default ``dp_ledger_default``).
    """

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "dp_ledger_default"
    conn_type = "dp_ledger"
    hook_name = "DP Budget Ledger"

    def __init__(self, ledger_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ledger_conn_id = ledger_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Connection form: the SQLAlchemy URL and the spend key go in ``extra``; a SQLite path may go in ``host``."""
        return {
            "hidden_fields": ["port", "login", "password", "schema"],
            "relabeling": {"host": "SQLite file path (or leave empty and set extra url)"},
            "placeholders": {
                "extra": '{"url": "postgresql+psycopg://spender@db:5432/ledger", '
                '"audit_key": "<the spend key from dpctl ledger keygen>"}',
            },
        }

    def get_url(self) -> str:
        return ledger_url_from_connection(self.get_connection(self.ledger_conn_id))

    def get_audit_key(self) -> AuditKey | None:
        """The spend key in the connection's extra ``audit_key`` (``None`` if unset; ``LedgerKeyError`` if too short)."""
        return audit_key_from_connection(self.get_connection(self.ledger_conn_id))

    def get_series_key(self) -> SeriesKey | None:
        """The series key in the connection's extra ``series_key`` (64 hex digits; ``None`` if unset), masked in
        task logs: it seals a series' noise state (:mod:`dp_operators.continual.state`).

        Raises:
            ValueError: the extra is not 64 hex digits (the message never shows it).
        """
        from dp_operators.continual.state import SeriesKey

        value = (self.get_connection(self.ledger_conn_id).extra_dejson or {}).get(SERIES_KEY_EXTRA)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"connection {self.ledger_conn_id!r}: extra {SERIES_KEY_EXTRA!r} must be a string")
        try:
            key = SeriesKey.from_text(value)
        except ValueError as error:
            raise ValueError(f"connection {self.ledger_conn_id!r}, extra {SERIES_KEY_EXTRA!r}: {error}") from None
        _mask(key)
        return key

    def get_ledger(self, **kwargs: Any) -> Ledger:
        """The spender's :class:`Ledger` on the connection's database, signing with the connection's ``audit_key``
        (the schema must already exist: ``dpctl ledger init``). ``kwargs`` go to :class:`Ledger`; the extra
        ``lease_seconds`` (a number of seconds in (0, 3600], default 120) sets the reservations' lease unless
        ``kwargs`` does: how long a dead try's reservation blocks its retry (docs/deployment.md).

        Raises:
            ValueError: the connection names no ledger, or its ``lease_seconds`` is not such a number.
            LedgerKeyError: its ``audit_key`` is not a valid key.
        """
        # imported here: Airflow loads this module to list connection types, which needs no ledger code
        from dp_operators.ledger import Ledger

        conn = self.get_connection(self.ledger_conn_id)
        if (conn.extra_dejson or {}).get(GOVERNOR_KEY_EXTRA):
            log.warning(
                "connection %r holds a governor_key: every task using it can sign governance events (raise caps). "
                "Keep the governor key in a connection only the privacy officer's dpctl uses.",
                self.ledger_conn_id,
            )
        lease = (conn.extra_dejson or {}).get(LEASE_SECONDS_EXTRA)
        if lease is not None and "lease_seconds" not in kwargs:
            kwargs["lease_seconds"] = lease_seconds_from_extra(conn.conn_id, lease)
        if "retired_audit_keys" not in kwargs:
            kwargs["retired_audit_keys"] = retired_keys_from_connection(conn)
        return Ledger(ledger_url_from_connection(conn), audit_key=audit_key_from_connection(conn), **kwargs)

    def test_connection(self) -> tuple[bool, str]:
        """Connect and check the ledger schema; used by the UI's "Test" button. Says so when the connection has no
        ``audit_key`` (tasks could read the ledger but not spend)."""
        try:
            self.get_ledger().check_schema()
            has_key = self.get_audit_key() is not None
        except Exception as error:  # the UI shows the message
            return False, str(error)
        if not has_key:
            return True, (
                "ledger reachable, schema up to date; but the connection has no extra 'audit_key', so tasks "
                "cannot reserve budget"
            )
        return True, "ledger reachable, schema up to date"
