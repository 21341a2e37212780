"""The audit-chain status the dashboard shows: :func:`dp_operators.ledger.verify.verify_ledger`, run in the
background and cached.

A failed check (``state`` ``error``) is retried after :data:`ERROR_RETRY_INTERVAL` (30 s) instead of the full
interval, and at the next status once a request has found the ledger unreadable (:meth:`AuditChainStatus.recheck`).

``verify_ledger`` replays every account's chain and cross-checks every charge (streamed, flat memory), which takes
seconds on a ledger of 10^5 charges (18 s on the 2-core development machine): far too long for a page that must
answer in under one second. So a page reads the last finished check, and a stale one (older than
``[dp_operators] dashboard_verify_interval`` seconds) starts a new one; at most one check runs at a time per app.

The check runs in a child process (``spawn``, daemonic, so it dies with the server), not a thread: it is pure Python
for most of its run and, in a thread, would hold the api-server's GIL and slow every page while it runs (the account
page went from 0.44 s to 1.07 s at 10^5 charges; ``benchmarks/dashboard_queries.py``). The child opens the ledger
from the parent's URL, password included, sent through a pipe, never on a command line; a thread in the parent only
waits for its answer.

A check that fails reports ``error`` as the exception's type and a fixed hint (:func:`public_error`), never the
exception's message, which can hold the ledger's URL, host, login or database name; the whole exception, with its
traceback (the child's sent back as text), goes to the api-server's log.

The dashboard holds no key, so the check is structural only (``authenticated`` is ``False``): chains, sequence,
running totals, charge life cycles and output digests are checked; who signed each row is not. The page says so
and points to ``dpctl ledger verify`` with the keys for the authenticated check.
"""

from __future__ import annotations

import datetime as dt
import logging
import multiprocessing
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dp_operators.ledger import Ledger

log = logging.getLogger(__name__)

#: Problem lines kept for display (the report keeps up to 10,000).
SHOWN_PROBLEMS = 20
DEFAULT_INTERVAL = 300.0
#: Seconds after which a check that failed (``state`` ``error``) is retried, when shorter than the interval: a
#: fixed connection shows within half a minute rather than after the full interval.
ERROR_RETRY_INTERVAL = 30.0
_NOT_CHECKED: dict[str, Any] = {
    "state": "pending",
    "checked_at": None,
    "authenticated": False,
    "problem_count": 0,
    "problems": [],
    "events": 0,
    "charges": 0,
    "accounts": 0,
    "seconds": None,
    "error": None,
}


class AuditChainStatus:
    """The latest structural check of the ledger, refreshed in the background.

    Args:
        ledger: returns the ledger to check (the app's shared ledger).
        interval: seconds after which a finished check is stale and the next :meth:`status` starts another.
        clock: monotonic seconds (tests pass a fake).
        error_retry: seconds after which a failed check is stale (at most ``interval``).
    """

    def __init__(
        self, ledger: Callable[[], Ledger], interval: float = DEFAULT_INTERVAL, clock: Callable[[], float] = time.monotonic,
        error_retry: float = ERROR_RETRY_INTERVAL,
    ) -> None:
        self._ledger = ledger
        self._interval = interval
        self._error_retry = min(error_retry, interval)
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._finished_at: float | None = None
        self._result: dict[str, Any] = dict(_NOT_CHECKED)

    def status(self) -> dict[str, Any]:
        """The last finished check (``state`` ``pending`` before the first one finishes), starting a new check in
        the background when there is none or it is stale.

        Returns:
            ``{"state": "pending"|"ok"|"problems"|"error", "checked_at" (ISO 8601 UTC or None), "authenticated"
            (always False here), "problem_count", "problems" (the first :data:`SHOWN_PROBLEMS` lines), "events",
            "charges", "accounts" (rows read), "seconds" (the check's wall time), "error" (when the check
            failed: :func:`public_error`), "running" (a check is in progress)}``.
        """
        with self._lock:
            interval = self._error_retry if self._result["state"] == "error" else self._interval
            stale = self._finished_at is None or self._clock() - self._finished_at >= interval
            if stale and self._thread is None:
                self._thread = threading.Thread(target=self._check, name="dp-budget-verify", daemon=True)
                self._thread.start()
            return {**self._result, "running": self._thread is not None}

    def recheck(self) -> None:
        """Make a failed last check stale, so the next :meth:`status` starts another at once (the app calls this
        when a request found the ledger unreadable and dropped it); a passed check keeps its interval."""
        with self._lock:
            if self._result["state"] == "error":
                self._finished_at = None

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Start a check if needed and wait for the running one to finish (tests and the benchmark)."""
        self.status()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.status()

    def _check(self) -> None:
        started = self._clock()
        checked_at = dt.datetime.now(dt.timezone.utc).isoformat()
        try:
            url = self._ledger().engine.url.render_as_string(hide_password=False)
            report = _verify_in_child(url)
        except Exception as error:  # noqa: BLE001  (shown on the page; the next check retries)
            log.error("the audit-chain check could not run", exc_info=error)
            report = {"state": "error", "error": public_error(error)}
        details = report.pop("details", None)
        if details:
            log.error("the audit-chain check failed:\n%s", details)
        result = {**_NOT_CHECKED, **report, "checked_at": checked_at, "seconds": self._clock() - started}
        with self._lock:
            self._result = result
            self._finished_at = self._clock()
            self._thread = None


class AuditCheckDiedError(RuntimeError):
    """The check's child process ended without answering (killed, out of memory)."""


def public_error(error: BaseException) -> str:
    """What :meth:`AuditChainStatus.status` shows of a failed check: ``"<exception type>: <fixed hint>"``, the hint
    of :func:`~dp_operators.dashboard.queries.ledger_error_hint` (no schema, a database error, a ledger the
    dashboard could not open, ...), never the exception's message."""
    from dp_operators.dashboard.queries import ledger_error_hint

    if isinstance(error, AuditCheckDiedError):
        hint = "the check's process ended without an answer (killed, or out of memory)"
    else:
        hint = ledger_error_hint(error)
    return f"{type(error).__name__}: {hint}"


def _verify_in_child(url: str) -> dict[str, Any]:
    """Run :func:`_verify_url` in a spawned daemonic child, give it ``url`` through a pipe, return its answer.

    Raises:
        AuditCheckDiedError: the child ended without answering (killed, out of memory).
    """
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=_verify_url, args=(theirs,), daemon=True, name="dp-budget-verify")
    child.start()
    theirs.close()
    try:
        ours.send(url)
        return ours.recv()
    except (EOFError, OSError):  # the child died before reading the URL or before answering
        raise AuditCheckDiedError(
            f"the audit check's process ended without an answer (exit code {child.exitcode})"
        ) from None
    finally:
        ours.close()
        child.join(timeout=5)


def _verify_url(connection: Any) -> None:
    """The child's work: read the ledger's URL from ``connection``, run :func:`~dp_operators.ledger.verify.
    verify_ledger` without keys, send back the fields :meth:`AuditChainStatus.status` shows (the first
    :data:`SHOWN_PROBLEMS` problem lines only); on failure ``error`` (:func:`public_error`) and ``details`` (the
    traceback, for the parent's log)."""
    try:
        from dp_operators.ledger import Ledger
        from dp_operators.ledger.verify import verify_ledger

        ledger = Ledger(connection.recv())
        try:
            report = verify_ledger(ledger)
        finally:
            ledger.engine.dispose()
            ledger._reader.dispose()
        answer = {
            "state": "ok" if report.ok else "problems",
            "authenticated": report.authenticated,
            "problem_count": len(report.problems),
            "problems": report.problems[:SHOWN_PROBLEMS],
            "events": report.events,
            "charges": report.charges,
            "accounts": report.accounts,
            "error": None,
        }
    except Exception as error:  # noqa: BLE001  (the parent shows the hint and logs the details)
        answer = {"state": "error", "error": public_error(error), "details": traceback.format_exc()}
    connection.send(answer)
    connection.close()
