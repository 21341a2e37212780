"""Airflow hook turning a Connection into a :class:`~dp_operators.ledger.Ledger`.

Connection forms (https://airflow.apache.org/docs/apache-airflow/stable/howto/connection.html):

* ``conn_type`` ``dp_ledger``: ``extra`` holds ``{"url": "<SQLAlchemy URL>"}``, e.g. ``sqlite:////srv/ledger.db``
  or ``postgresql+psycopg://user@host:5432/ledger``; or ``host`` holds a SQLite file path.
* ``conn_type`` ``postgres``: host, port, login, password and schema (the database) of a PostgreSQL server.

Tasks cannot reach Airflow's own metadata database (Airflow 3), so the ledger always lives behind its own
Connection.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from airflow.sdk import BaseHook
from dp_operators.ledger import Ledger


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


class DPLedgerHook(BaseHook):
    """Hook for the privacy-budget ledger.

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
        """Connection form: the SQLAlchemy URL goes in ``extra``; a SQLite path may go in ``host``."""
        return {
            "hidden_fields": ["port", "login", "password", "schema"],
            "relabeling": {"host": "SQLite file path (or leave empty and set extra url)"},
            "placeholders": {"extra": '{"url": "postgresql+psycopg://user@db:5432/ledger"}'},
        }

    def get_url(self) -> str:
        return ledger_url_from_connection(self.get_connection(self.ledger_conn_id))

    def get_ledger(self) -> Ledger:
        """A :class:`Ledger` on the connection's database (the schema must already exist: ``dpctl ledger init``)."""
        return Ledger(self.get_url())

    def test_connection(self) -> tuple[bool, str]:
        """Connect and check the ledger schema; used by the UI's "Test" button."""
        try:
            self.get_ledger().check_schema()
        except Exception as error:  # the UI shows the message
            return False, str(error)
        return True, "ledger reachable, schema up to date"
