"""Fixtures of the ledger tests: every test taking ``ledger_url`` runs on SQLite and on PostgreSQL."""

from ledger_backends import ledger_url, pg_database, pg_roles  # noqa: F401  (fixtures)
