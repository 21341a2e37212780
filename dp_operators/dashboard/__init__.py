"""The budget dashboard (issue 12): :mod:`.queries` is its read-only data layer over the ledger; the FastAPI app
serving pages and JSON is built on it."""
