"""Fixtures of the dashboard tests: every test taking ``ledger_url`` runs on SQLite and on PostgreSQL."""

from ledger_backends import ledger_url, pg_database  # noqa: F401  (fixtures)
