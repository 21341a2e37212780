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

Outputs. A release's output may be 256 MiB of JSON, and ``json.loads`` builds a Python object per value: 6 MB of
``[{},{},...]`` (two million empty objects) takes hundreds of megabytes, 60 MB gigabytes. The readers that only need
to know an output is readable (verify; history never reads outputs) call :func:`check_json`, and the dashboard
:func:`read_json_cut`; neither builds a value per JSON value of a large text. A text with at most
:data:`MAX_PARSED_VALUES` brackets, braces and commas (each JSON value but the first of its container follows one
of them, and each object key a brace or a comma, so it holds at most about twice as many values) is parsed by
``json`` as :func:`read_json` does, in one C call (every output the release engine writes for a few hundred rows:
the common case stays as fast as it was); any other text is read as a stream of parser events
(`ijson <https://pypi.org/project/ijson/>`_, its yajl2 C backend) from UTF-8 slices of the text, counting the
nesting depth and checking each number as it goes, so memory stays at the text plus a constant whatever it holds.
The stream accepts what :func:`read_json` accepts, with the same bounds (depth, finite doubles, integers of at most
4,300 digits), and names the reason in the same words, except that text that is not JSON is named without the
position (the parser's message quotes the text, which is never repeated).

Display. Text read from the ledger is written by workers (run, task and release names, DAG ids) and by whoever can
write its rows. :func:`visible` is what every command that prints it to a terminal passes it through: control
characters (C0, DEL, C1, among them ``ESC`` and ``CSI``), format characters (Unicode category Cf: bidirectional
overrides such as U+202E, zero-width characters) and every other character Python does not call printable become
visible escapes (``\\x1b``, ``\\u202e``), as :func:`repr` writes them, so no stored name can move the cursor, clear
the screen, hide lines or reorder what is shown. Letters, digits, spaces and punctuation of any script print as
they are.

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

#: A JSON text with at most this many ``[``, ``{`` and ``,`` is parsed by ``json`` in one call (it holds at most
#: about twice as many values: some tens of MB of Python objects at worst); one with more is checked or read as a
#: stream (:func:`check_json`, :func:`read_json_cut`). Every output the release engine writes for up to some ten
#: thousand published values stays below it.
MAX_PARSED_VALUES = 100_000
#: Characters of a long JSON text encoded and handed to the stream parser at a time.
_STREAM_CHARS = 2**16

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


def visible(text: object) -> str:
    """``text`` (any value: ``str()`` of it) as it may be printed on a terminal: every character Python does not
    call printable (``str.isprintable``: control characters C0, DEL and C1 such as ``\\x1b`` and ``\\x9b``, line and
    paragraph separators, format characters such as the bidirectional override ``\\u202e`` or a zero-width space,
    unassigned and private-use code points, spaces other than U+0020) written as the escape :func:`repr` gives it
    (``\\x1b``, ``\\u202e``, ``\\U000e0001``); everything else as it is, so a plain name (``census``, ``é``, ``日本``,
    ``run 1``) prints unchanged. The one place names read from the ledger are made safe to print (module
    docstring, "Display"); multi-line output escapes each line and joins them after (a stored ``\\n`` is escaped
    too)."""
    text = text if type(text) is str else str(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    return repr(char)[1:-1]  # one character Python does not call printable: never a quote or a backslash


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
    _check_text(text, max_chars)
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


def _check_text(text: object, max_chars: int) -> None:
    if not isinstance(text, str):
        raise BoundsError(f"holds {shown(text)}, not JSON text" if text is not None else "is empty (NULL)")
    if len(text) > max_chars:
        raise BoundsError(f"is {len(text):,} characters long; the ledger's JSON here has at most {max_chars:,}")
    if "\\u" in text and lone_surrogate_escape(text):
        raise BoundsError("holds a lone surrogate escape (a \\uD800-\\uDFFF not paired), which is not Unicode text")


#: A ``\\u`` escape of a UTF-16 surrogate (not itself escaped: preceded by an even number of backslashes).
_SURROGATE_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u([dD][89a-fA-F][0-9a-fA-F]{2})")


def lone_surrogate_escape(text: str) -> bool:
    """Whether JSON ``text`` holds a ``\\uD800``-``\\uDBFF`` escape not followed at once by a ``\\uDC00``-``\\uDFFF``
    one, or the latter not preceded by the former (RFC 8259 section 8.2: such a string's meaning is unpredictable).
    Python's ``json`` reads one as a lone surrogate, the stream parser cannot (it is not UTF-8), PostgreSQL's
    ``jsonb`` refuses it: the ledger's readers refuse it whatever the text's size, and its writers never write one."""
    pending = None  # where the escape after an unpaired high surrogate must start
    for match in _SURROGATE_ESCAPE.finditer(text):
        start = match.start(1) - 2
        if int(match.group(1), 16) < 0xDC00:  # high
            if pending is not None:
                return True
            pending = match.end()
        elif pending != start:  # low, not right after a high
            return True
        else:
            pending = None
    return pending is not None


def few_json_values(text: str) -> bool:
    """Whether ``text`` has at most :data:`MAX_PARSED_VALUES` brackets, braces and commas: then ``json`` may parse
    it whole (at most about twice as many values); counted in C, without parsing."""
    if len(text) <= MAX_PARSED_VALUES:
        return True
    marks = text.count(",")
    return marks <= MAX_PARSED_VALUES and marks + text.count("{") + text.count("[") <= MAX_PARSED_VALUES


class _Utf8Slices:
    """A text as a binary file for the stream parser: each read encodes the next slice of characters (UTF-8
    encodes each character on its own, so the slices join to the whole text's encoding), never the whole text. A
    lone surrogate (which ``json`` accepts in a string) becomes ``?``: the parser is never handed bytes that are not
    UTF-8."""

    __slots__ = ("text", "at")

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def read(self, size: int = -1) -> bytes:  # ijson reads 0 bytes first, to tell bytes from text
        start = self.at
        self.at = len(self.text) if size is None or size < 0 else start + size
        return self.text[start : self.at].encode("utf-8", "replace")


#: An integer of more than 4,300 digits, or an exponent of 16 digits or more, anywhere in a text (in a string too):
#: what makes the C parser's exact reading of numbers (``int``, ``Decimal``) raise inside the parser.
_RISKY_NUMBER = re.compile(r"(?<![0-9])[0-9]{4301}|[eE][+-]?[0-9]{16}")


def _stream(text: str, consume: Any) -> Any:
    """``consume(events)`` of the stream parser's events over ``text``, ``(event, value)`` pairs with numbers as
    ``int``, ``float`` or ``Decimal``; a parser failure as :class:`BoundsError`.

    The C parser (yajl2_c) first reads numbers as C integers and doubles, so no Python exception is ever raised
    inside it: one raised there (an integer Python will not convert, an exponent ``Decimal`` refuses) can crash
    ijson 3.6 once an earlier parse was left unfinished, which the checks here do when they stop at the first
    problem. It refuses numbers beyond the doubles itself. Only a text with an integer beyond 64 bits (which JSON
    allows and ``json`` reads) is read again: by the C parser with exact numbers when the text holds no integer
    Python refuses to convert and no exponent ``Decimal`` refuses, else by ijson's pure-Python parser (slower;
    never a text the release engine writes)."""
    import ijson

    try:
        fast = ijson.get_backend("yajl2_c")
    except ImportError:  # no C extension on this platform: the pure-Python parser, slower
        fast = None
    if fast is not None:
        try:
            return consume(fast.basic_parse(_Utf8Slices(text), buf_size=_STREAM_CHARS, use_float=True))
        except ijson.JSONError as error:
            if "integer overflow" not in str(error):
                raise _stream_error(error) from None
        except UnicodeDecodeError:  # defence in depth: _check_text refused lone surrogate escapes already
            raise BoundsError("holds a string that is not Unicode text") from None
    exact = fast if fast is not None and _RISKY_NUMBER.search(text) is None else ijson.get_backend("python")
    try:
        return consume(exact.basic_parse(_Utf8Slices(text), buf_size=_STREAM_CHARS, use_float=exact is not fast))
    except BoundsError:  # what consume found
        raise
    except (ijson.JSONError, ValueError, ArithmeticError) as error:
        raise _stream_error(error) from None


def _number_problem(number: Any) -> str | None:
    """Why a number the stream parser read is one :func:`read_json` refuses, or ``None`` (an integer the parser
    returned is within Python's digit limit)."""
    kind = type(number)
    if kind is int or (kind is float and math.isfinite(number)):
        return None
    if kind is not float and number.adjusted() < 308:  # a Decimal: |x| < 10**308 is a finite double
        return None
    if kind is not float and math.isfinite(float(number)):
        return None
    return f"holds the number {shown(str(number))}, beyond the doubles"


def _stream_error(error: Exception) -> BoundsError:
    """A stream parser's failure in :func:`read_json`'s words; never its message, which quotes the text."""
    said = f"{error} {error.__context__ or ''}"
    if "overflow" in said:  # C: "numeric (floating point) overflow"; Python: "float overflow"
        return BoundsError("holds a number beyond the doubles")
    if "digits" in said:  # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        return BoundsError("holds an integer of more than 4,300 digits")
    return BoundsError("is not JSON text")


_OPEN = ("start_map", "start_array")
_CLOSE = ("end_map", "end_array")


def check_json(text: object, *, max_chars: int = MAX_JSON_CHARS, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise what :func:`read_json` raises for ``text``, building no value per JSON value of a long text: one with
    at most :data:`MAX_PARSED_VALUES` brackets, braces and commas is parsed (and dropped) as :func:`read_json`
    does, any other is read as a stream of parser events (memory: the text and a constant).

    Raises:
        BoundsError: not text, too long, not JSON, nested too deep or holding a number beyond those.
    """
    _check_text(text, max_chars)
    if few_json_values(text):
        read_json(text, max_chars=max_chars, max_depth=max_depth)
        return

    def consume(events: Any) -> None:
        depth = 0
        for event, value in events:
            if event == "number":
                if type(value) is not int and (problem := _number_problem(value)) is not None:
                    raise BoundsError(problem)
            elif event in _OPEN:
                depth += 1
                if depth > max_depth:
                    raise BoundsError(f"nests deeper than {max_depth} levels")
            elif event in _CLOSE:
                depth -= 1

    _stream(text, consume)


class CutList(list):
    """A JSON array :func:`read_json_cut` kept only the first items of; ``total`` is how many it has."""

    total: int = 0


class TooManyValuesError(Exception):
    """:func:`read_json_cut` would keep more values than it was allowed (the text is readable as far as read)."""


def read_json_cut(
    text: object,
    *,
    cut_at: tuple[str | None, ...],
    keep: int | None,
    max_values: int,
    max_chars: int = MAX_OUTPUT_CHARS,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """The JSON value of ``text`` as :func:`read_json` reads it, except that each array at the path ``cut_at``
    (object keys from the top; ``None`` matches any key, e.g. ``("aggregates", None, "rows")``) keeps only its first
    ``keep`` items (all for ``None``) and is a :class:`CutList` whose ``total`` counts them all; the items left out
    are checked as they are read but never built. A text of at most :data:`MAX_PARSED_VALUES` brackets, braces and
    commas is parsed whole and then cut; any other is built from a stream of parser events, so memory is the text
    and the values kept.

    Raises:
        BoundsError: not text, too long, not JSON, nested too deep or holding a number beyond those.
        TooManyValuesError: more than ``max_values`` values would be kept (the rest is not read).
    """
    _check_text(text, max_chars)
    if few_json_values(text):
        return _cut_parsed(read_json(text, max_chars=max_chars, max_depth=max_depth), cut_at, keep)

    def consume(events: Any) -> Any:
        top: list[Any] = []
        # open containers: (container, its path of keys from the top while it may lead to cut_at, else None, how
        # many items it keeps when it is an array at cut_at, else None)
        stack: list[tuple[Any, tuple | None, int | None]] = []
        key: Any = None
        skipping = 0  # > 0: inside an item a cut array leaves out, this many levels deep
        kept = 0
        for event, value in events:
            if event == "number" and type(value) is not int:
                if (problem := _number_problem(value)) is not None:
                    raise BoundsError(problem)
                value = float(value)
            if skipping:
                if event in _OPEN:
                    skipping += 1
                    if len(stack) + skipping > max_depth:
                        raise BoundsError(f"nests deeper than {max_depth} levels")
                elif event in _CLOSE:
                    skipping -= 1
                continue
            if event == "map_key":
                key = value
                continue
            if event in _CLOSE:
                stack.pop()
                continue
            path: tuple | None = None
            if stack:
                parent, parent_path, limit = stack[-1]
                if type(parent) is dict:
                    if parent_path is not None and len(parent_path) < len(cut_at):
                        wanted = cut_at[len(parent_path)]
                        if wanted is None or wanted == key:
                            path = (*parent_path, key)
                elif limit is not None:
                    parent.total += 1
                    if parent.total > limit:  # left out: checked, not built
                        if event in _OPEN:
                            skipping = 1
                            if len(stack) + 1 > max_depth:
                                raise BoundsError(f"nests deeper than {max_depth} levels")
                        continue
            else:
                parent, path = None, ()
            kept += 1
            if kept > max_values:
                raise TooManyValuesError(f"more than {max_values:,} values")
            limit = None
            if event == "start_map":
                value = {}
            elif event == "start_array":
                if path is not None and len(path) == len(cut_at):
                    value, limit = CutList(), keep
                else:
                    value = []
            if parent is None:
                top.append(value)
            elif type(parent) is dict:
                parent[key] = value
            else:
                parent.append(value)
            if event in _OPEN:
                if len(stack) >= max_depth:
                    raise BoundsError(f"nests deeper than {max_depth} levels")
                stack.append((value, path, limit))
        return top[0]

    return _stream(text, consume)


def _cut_parsed(value: Any, cut_at: tuple[str | None, ...], keep: int | None) -> Any:
    """``value`` (parsed) with each array at ``cut_at`` as a :class:`CutList` of its first ``keep`` items."""
    found = [(value, 0)]
    while found:
        item, level = found.pop()
        if not isinstance(item, dict):
            continue
        wanted = cut_at[level]
        for name in (item if wanted is None else ([wanted] if wanted in item else [])):
            child = item[name]
            if level + 1 < len(cut_at):
                found.append((child, level + 1))
            elif isinstance(child, list):
                cut = CutList(child if keep is None else child[:keep])
                cut.total = len(child)
                item[name] = cut
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
