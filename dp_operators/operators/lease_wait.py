"""How a release task waits for another try's live ledger lease: Airflow's reschedule to the lease's end, the same
try number, no triggerer (ADR 31). Public parameters and clocks only."""

from __future__ import annotations

import datetime as dt

from dp_operators.ledger import LeaseHeldError, ReleaseKey

#: A lease wait reschedules the task at least this far ahead: the ledger's clock (PostgreSQL's, or the holder's host)
#: and the scheduler's may disagree by seconds, and a reschedule date in the scheduler's past would rerun the task at
#: once, over and over, while the lease is still live.
LEASE_WAIT_MIN = dt.timedelta(seconds=5)
#: How far past the lease's end the task is rescheduled, so that the lease has expired when it runs again.
LEASE_WAIT_MARGIN = dt.timedelta(seconds=1)
#: How long a task waits for leases in all by default (``lease_wait_timeout``) before it fails without a retry: past
#: the ledger's cap on a reservation's hold (``MAX_RESERVATION_HOLD_SECONDS``, 6 h) plus the longest lease (1 h), so
#: that a hold by a hung try or another task's reservation has run out, and been taken over, before the wait ends.
LEASE_WAIT_TIMEOUT = dt.timedelta(hours=7)


def lease_wait_until(error: LeaseHeldError, lease_seconds: float, now: dt.datetime | None = None) -> dt.datetime:
    """When a task that met another try's live lease runs again (UTC, timezone-aware): the lease's end plus
    :data:`LEASE_WAIT_MARGIN`, at most one lease of this connection (plus the margin) from ``now`` (a ledger clock
    ahead of this one cannot park the task longer; a holder on a connection with a longer lease only makes the task
    wake and wait again), and at least :data:`LEASE_WAIT_MIN` from ``now``. Public parameters only.

    Args:
        error: the ledger's refusal; ``expires_at`` is the holder's lease end (UTC), None if unknown.
        lease_seconds: this connection's lease length, in seconds (its ``lease_seconds`` extra).
        now: the current time (UTC); default the system clock.

    Source: Airflow's reschedule (``AirflowRescheduleException``, the mechanism of sensors in ``reschedule`` mode):
    the task instance waits in ``up_for_reschedule`` and runs again with the same try number (ADR 31).
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    longest = now + dt.timedelta(seconds=lease_seconds) + LEASE_WAIT_MARGIN
    end = error.expires_at
    if end is None:
        wake = longest
    else:
        if end.tzinfo is None:  # the ledger's timestamps are UTC
            end = end.replace(tzinfo=dt.timezone.utc)
        wake = min(end + LEASE_WAIT_MARGIN, longest)
    return max(wake, now + LEASE_WAIT_MIN)


def lease_held_message(key: ReleaseKey, error: LeaseHeldError, until: dt.datetime) -> str:
    """The task log's line for :class:`LeaseHeldError`: which try holds the lease, until when (UTC), and that the
    task waits until ``until`` without spending a try. Public parameters only."""
    lease_end = error.expires_at.isoformat(timespec="seconds") if error.expires_at is not None else "unknown"
    return (
        f"another try of release {key.release_name!r} (run {key.run_id!r}, ledger attempt {error.attempt}) is still "
        f"running and holds the budget lease until {lease_end}; nothing was charged. This task waits (rescheduled "
        f"to {until.isoformat(timespec='seconds')}, no try spent), then replays that try's committed output, or "
        "takes the release over if that try died (its charge stays spent)"
    )


__all__ = ["LEASE_WAIT_MARGIN", "LEASE_WAIT_MIN", "LEASE_WAIT_TIMEOUT", "lease_held_message", "lease_wait_until"]
