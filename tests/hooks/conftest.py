"""Fixtures of the hook tests (both ledger backends)."""

from ledger_backends import ledger_url, pg_database  # noqa: F401  (fixtures)
