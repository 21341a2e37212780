"""Errors of the release engine: both are raised before any budget is reserved."""

from __future__ import annotations


class ReleaseInputError(ValueError):
    """The upstream aggregates do not have the shape the spec declares. Raised before any budget is reserved."""


class ReleaseConfigError(ValueError):
    """The spec and the budget account disagree (privacy unit, accountant). Raised before anything is reserved."""
