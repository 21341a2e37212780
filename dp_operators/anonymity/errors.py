"""Errors raised by the anonymity checks.

Both are :class:`ValueError` subclasses so callers that only know "bad value" still catch them; the message says
what was wrong, where (file, field path or column) and how to fix it. Messages never quote row contents: only
column names, counts and declared (public) parameters.
"""

from __future__ import annotations


class AnonymityError(ValueError):
    """Base class of every error raised by :mod:`dp_operators.anonymity`."""


class AnonymitySpecError(AnonymityError):
    """A YAML anonymity spec is unreadable or invalid.

    The message has the form ``<file>: <field.path>: <reason>`` (one line per problem).
    """


class AnonymityInputError(AnonymityError):
    """The table cannot be checked as declared: unknown column, empty table, missing value in a quasi-identifier or
    sensitive attribute, a target k larger than the table, or a value absent from a declared hierarchy."""
