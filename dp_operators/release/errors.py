"""Errors of the release engine. ``ReleaseInputError`` and ``ReleaseConfigError`` are raised before any budget is
reserved; ``ReleaseAbortedError`` after it. All three are permanent: retrying cannot fix them."""

from __future__ import annotations


class ReleaseInputError(ValueError):
    """The upstream aggregates do not have the shape or types the spec declares. Raised before any budget is
    reserved. The message names the aggregate, the field and the type found, never a value or a row index."""


class ReleaseConfigError(ValueError):
    """The spec and the budget account disagree (privacy unit, accountant). Raised before anything is reserved."""


class ReleaseAbortedError(RuntimeError):
    """A release failed after its budget was reserved (a bug: every check that can fail runs before the
    reservation). Permanent: the same inputs would fail again, and each retry would charge again.

    The message is constant but for the original exception's type (no data); the original is chained as
    ``__cause__`` for debugging outside Airflow (its text is not audited for data, so the operator does not log it).

    Attributes:
        budget_returned: True when no sampler had been entered, so the reservation was released; False when noise
            may have been drawn, so the charge stays spent (DESIGN.md 2.1).
    """

    def __init__(self, cause: BaseException, *, budget_returned: bool) -> None:
        fate = (
            "no noise had been drawn, so the reservation was returned"
            if budget_returned
            else "noise may have been drawn, so the charge stays spent"
        )
        super().__init__(
            f"the release failed after its budget was reserved ({type(cause).__name__}); {fate}. It is not retried "
            "automatically, since a retry would fail the same way and charge again: please report it as a bug "
            "with the spec, then rerun the task"
        )
        self.budget_returned = budget_returned
