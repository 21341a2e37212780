"""Bounded readers of what the ledger's tables hold: exact numbers and JSON text (docs/ledger.md, "Hostile rows").

Whoever can write ledger rows (on SQLite whoever can write the file; on PostgreSQL the tables' owner, and today
the workers' login) can store any text where the ledger stores a number or JSON. Every reader of the ledger
(:mod:`~dp_operators.ledger.verify`, ``dpctl ledger history``, the dashboard, the running totals the write path
reads) goes through this module, which checks the *text* against a grammar and bounds before any ``Fraction``,
``int`` or JSON value is built, so no stored value can make a reader crash, run for ever or take unbounded memory:

* ``Fraction("1e-99999999")`` never returns (it builds ``10**99999999``); ``float`` of a 400-digit fraction raises
  ``OverflowError``; an exact sum of many 400-digit denominators grows without bound;
* ``json.loads`` of ``"[" * 200_000`` raises ``RecursionError``, and a structure nested a thousand levels deep makes
  whatever walks it later (``json.dumps``, a template) do the same.

Numbers. Every version of the ledger wrote exact numbers as ``str(Fraction)`` and nothing else (checked against
``tests/ledger/old_ledgers.py`` and the schema-1 and schema-2 writers in the git history): ``"0"``, ``"3"``,
``"-1/10"``. :func:`read_number` accepts exactly that canonical form: ASCII digits, an optional leading ``-``, an
optional ``/`` and denominator; no leading zeros, no ``-0``, no denominator 0 or 1, lowest terms (``"2/4"`` is not
what ``str(Fraction)`` writes); no sign ``+``, no spaces, no decimal point, no exponent (so there is no exponent to
bound), no ``nan``/``inf``, no Unicode digits. Numerator and denominator have at most :data:`MAX_DIGITS` digits
each, checked on the text's length before anything is converted. Why 60: charges and running totals are rounded
up to multiples of ``1/MAX_DENOMINATOR`` = 10^-18 (19-digit denominators) and stay within an account's cap, so
their numerators have at most 18 digits more than the cap's integer part; caps and deltas are an officer's
decimals (``0.5``, ``1e-6``) or 12-significant-digit conversions. 60 digits leave a cap up to 10^42 with full
precision, and deltas and caps down to 10^-59: beyond any budget (a delta cap below 10^-18 cannot hold one charge).
The largest value, 10^60, is far inside a double (``float`` never overflows) and every product or sum the readers
form stays small.

JSON. :func:`read_json` accepts JSON text of at most :data:`MAX_JSON_CHARS` characters (mechanisms, details,
context, allowed_dags, allowed_roles, config) or :data:`MAX_OUTPUT_CHARS` (a release's output, which holds up to
``INLINE_ROWS_LIMIT`` published rows per aggregate inline), nested at most :data:`MAX_JSON_DEPTH` levels (the
ledger's own JSON nests under 10), without ``NaN``/``Infinity`` (which ``canonical_json`` never writes) or numbers
beyond the doubles. The length is checked first; the depth by ``json.loads`` (whose C scanner raises
``RecursionError`` at the interpreter's recursion limit instead of recursing further) and then by an iterative
walk of the parsed containers (never recursive), which runs only when the text holds more brackets than
:data:`MAX_JSON_DEPTH`.

Both raise :class:`BoundsError` (a ``ValueError``) with the reason in words; :func:`ledger_number` and
:func:`ledger_json` wrap them in :class:`~dp_operators.ledger.errors.UnreadableValueError`, which names the table,
the row (id, or an account's name) and the column.
"""

from __future__ import annotations

import functools
import json
import math
import re
from fractions import Fraction
from typing import Any

from dp_operators.ledger.errors import UnreadableValueError

#: Most digits of a stored number's numerator, and of its denominator.
MAX_DIGITS = 60
#: Longest text of a stored number: ``-`` and :data:`MAX_DIGITS` digits, ``/`` and :data:`MAX_DIGITS` digits.
MAX_NUMBER_CHARS = 2 * MAX_DIGITS + 2
#: Deepest nesting of stored JSON (``[[1]]`` is 2).
MAX_JSON_DEPTH = 64
#: Longest JSON text in the ledger's small JSON columns (mechanisms, details, context, allowed_dags, config), in
#: characters: 4 MiB.
MAX_JSON_CHARS = 4 * 2**20
#: Longest release output, in characters: 256 MiB (PostgreSQL's text holds at most 1 GB).
MAX_OUTPUT_CHARS = 256 * 2**20

#: ``str(Fraction)`` in ASCII: sign, numerator without leading zeros, optional denominator without leading zeros.
_NUMBER = re.compile(r"(-?)(0|[1-9][0-9]*)(?:/([1-9][0-9]*))?")
#: How much of a stored text a message shows (the longest name a column holds is 250 characters).
SHOWN_CHARS = 250


class BoundsError(ValueError):
    """A stored value outside the grammar or the bounds of this module; ``str(error)`` says why, in words that
    never repeat more than :data:`SHOWN_CHARS` characters of the value."""


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters (``'abc…' (10,485,760 characters)``): a
    hostile value of megabytes must not be copied into every message that names it. An integer of more than 60
    digits is described, not converted (Python refuses to print one of more than 4,300)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    if isinstance(value, (str, bytes)) and len(value) > limit:
        kind = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}… ({len(value):,} {kind})"
    if isinstance(value, (dict, list, tuple, set, frozenset)) and len(value) > 64:
        return f"a {type(value).__name__} of {len(value):,} items"
    text = repr(value)
    return text if len(text) <= 2 * limit else text[: 2 * limit] + "…"


def number_problem(text: object) -> str | None:
    """Why ``text`` is not a number as the ledger stores it (``str(Fraction)`` within :data:`MAX_DIGITS`), or
    ``None`` when it is one. Looks at the text only: builds no number."""
    if not isinstance(text, str):
        return f"holds {shown(text)}, not text" if text is not None else "is empty (NULL)"
    if len(text) > MAX_NUMBER_CHARS:
        return f"is {len(text):,} characters long; a stored number has at most {MAX_NUMBER_CHARS}"
    match = _NUMBER.fullmatch(text)
    if match is None:
        return "is not of the form p, -p or p/q in ASCII digits (str(Fraction))"
    sign, numerator, denominator = match.groups()
    if len(numerator) > MAX_DIGITS or (denominator is not None and len(denominator) > MAX_DIGITS):
        return f"has more than {MAX_DIGITS} digits in its numerator or denominator"
    if sign and numerator == "0":
        return "is -0, which str(Fraction) never writes"
    if denominator is not None:
        if denominator == "1":
            return "has the denominator 1, which str(Fraction) never writes"
        if math.gcd(int(numerator), int(denominator)) != 1:
            return "is not in lowest terms, as str(Fraction) writes it"
    return None


def read_number(text: object) -> Fraction:
    """The exact number ``text`` holds, read as the ledger stores numbers (``str(Fraction)``, at most
    :data:`MAX_DIGITS` digits above and below the line). The last 256 texts that passed are cached (amounts
    repeat).

    Raises:
        BoundsError: anything else (:func:`number_problem` says why); nothing is converted before the text passed.
    """
    if type(text) is str and len(text) <= MAX_NUMBER_CHARS:
        number = _read_short(text)
        if number is not None:
            return number
    raise BoundsError(number_problem(text) or "is not a number")


@functools.lru_cache(maxsize=256)
def _read_short(text: str) -> Fraction | None:
    if number_problem(text) is not None:
        return None
    numerator, _, denominator = text.partition("/")
    return Fraction(int(numerator), int(denominator or 1))


def _refuse_constant(name: str) -> Any:
    raise BoundsError(f"holds {name}, which the ledger never writes")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BoundsError(f"holds the number {shown(text)}, beyond the doubles")
    return value


#: One decoder for every read (building one per call costs more than decoding a small text). Integers are C's own:
#: Python refuses to convert one of more than ``sys.int_info.default_max_str_digits`` (4,300) digits, a
#: ``ValueError`` that makes the text unreadable.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether the lists and dicts of ``value`` nest deeper than ``limit`` (``[]`` is depth 1); iterative, so any
    depth is measured without recursion."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def read_json(text: object, *, max_chars: int = MAX_JSON_CHARS, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value ``text`` holds, if it is at most ``max_chars`` characters long and nests at most
    ``max_depth`` levels, with finite numbers only (no ``NaN``, ``Infinity`` or ``1e999``; integers of at most
    4,300 digits, Python's limit).

    Raises:
        BoundsError: not text, too long, not JSON, nested too deep or holding a number beyond those; the reason
            in words, never the whole text.
    """
    if not isinstance(text, str):
        raise BoundsError(f"holds {shown(text)}, not JSON text" if text is not None else "is empty (NULL)")
    if len(text) > max_chars:
        raise BoundsError(f"is {len(text):,} characters long; the ledger's JSON here has at most {max_chars:,}")
    try:
        value = _DECODER.decode(text)
    except BoundsError:
        raise
    except RecursionError:  # the C scanner stops at the interpreter's recursion limit
        raise BoundsError(f"nests deeper than {max_depth} levels") from None
    except ValueError as error:
        if not isinstance(error, json.JSONDecodeError):  # int(): more digits than Python converts
            raise BoundsError("holds an integer of more than 4,300 digits") from None
        raise BoundsError(f"is not JSON text (invalid at character {error.pos:,})") from None
    if text.count("[") + text.count("{") > max_depth and json_depth_exceeds(value, max_depth):
        raise BoundsError(f"nests deeper than {max_depth} levels")
    return value


def ledger_number(text: object, *, table: str, row: object, column: str) -> Fraction:
    """:func:`read_number` of the value of ``column`` in row ``row`` (its id, or an account's name) of ``table``.

    Raises:
        UnreadableValueError: the value is not a number as the ledger stores it; names the table, row and column.
    """
    try:
        return read_number(text)
    except BoundsError as error:
        raise UnreadableValueError(table, row, column, str(error), value=text) from None


def ledger_json(
    text: object, *, table: str, row: object, column: str, max_chars: int = MAX_JSON_CHARS
) -> Any:
    """:func:`read_json` of the value of ``column`` in row ``row`` (its id, or an account's name) of ``table``.

    Raises:
        UnreadableValueError: the value is not bounded JSON text; names the table, row and column.
    """
    try:
        return read_json(text, max_chars=max_chars)
    except BoundsError as error:
        raise UnreadableValueError(table, row, column, str(error)) from None
