"""Reading configuration YAML (release specs, ``ledgers.yaml``, anonymity specs) as YAML 1.2, refusing the plain
scalars that YAML 1.1 tools read as a different number.

PyYAML's ``safe_load`` implements YAML 1.1, where ``yes``/``no``/``on``/``off`` are booleans, ``2026-01-01`` is a
date, ``010`` is the octal 8, ``1_000`` is 1000 and ``1:20`` is the sexagesimal 80. A key domain
``{married: [yes, no]}`` then holds two booleans, string rows ``"yes"``/``"no"`` fall outside it, and zeros are
published while budget is spent. This module reads every document with the YAML 1.2 *core schema* (YAML 1.2.2,
section 10.3.2; resolver and constructors from the ``yamlcore`` package, on PyYAML's parser):

* ``yes``, ``no``, ``on``, ``off``, ``y``, ``n``, dates and times stay the text the author typed;
* ``true``/``false`` are booleans, ``~``/``null``/empty are null, ``0o17``/``0x1F`` are integers, ``1e3`` and
  ``1e-3`` are floats.

Where YAML 1.1 and YAML 1.2 would give a plain (unquoted) scalar different values and either could be meant, the
document is refused with the field path and a fix, instead of silently picking one (another tool reading the same
file, or the author, may take the other):

* a decimal integer with a leading zero (``010``, ``02139``: octal 8 or text in YAML 1.1, 10 or 2139 in YAML 1.2);
* a scalar YAML 1.1 reads as a number and YAML 1.2 as text or another number (``1_000``, ``1:20``, ``0b101``,
  ``+0x1F``), or YAML 1.1 reads as text and YAML 1.2 as an integer (``0o10``);
* a float whose written decimal a 64-bit float does not hold exactly (``1e400``, ``1e-400``,
  ``0.30000000000000001``): quoted, the exact readers (:func:`~dp_operators.accounting.exact_number`) read it as
  typed;
* a ``%YAML`` directive other than 1.2, a duplicate mapping key, and the YAML 1.1 merge key ``<<``.

See docs/adr/0018-yaml-1-2-core-schema.md for why this is built on ``yamlcore`` rather than ``ruamel.yaml``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver
from yamlcore import CoreLoader
from yamlcore.loader import CommonConstructor

__all__ = ["YAMLDocumentError", "YAMLProblem", "dotted_location", "load_yaml"]

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_NUMBERS = (_INT, _FLOAT)
_STR = Resolver.DEFAULT_SCALAR_TAG
#: YAML 1.1 as PyYAML's safe_load resolves it: the reading other tools give the same file.
_YAML11_RESOLVER = Resolver()


class _CoreConstructor(CommonConstructor):
    """yamlcore's YAML 1.2 core-schema constructors, alone (a fresh instance per scalar keeps no state)."""


_CoreConstructor.init_constructors("core")

#: A location in a document: mapping keys and sequence indices from the root, as pydantic's ``loc``.
Location = tuple[str | int, ...]


@dataclass(frozen=True)
class YAMLProblem:
    """One reason a document was refused: where (``location`` from the root, 1-based ``line``; both empty/0 for a
    syntax error the parser could not place in the tree) and why, with the fix."""

    location: Location
    line: int
    reason: str


class YAMLDocumentError(ValueError):
    """A YAML document cannot be read unambiguously: a syntax error, or the problems listed in the module docstring.

    Attributes:
        problems: every problem found, in document order.
        document: the document as YAML 1.2 reads it (to name paths, e.g. aggregate names), or None on a syntax
            error.
    """

    def __init__(self, problems: list[YAMLProblem], document: object = None) -> None:
        self.problems = tuple(problems)
        self.document = document
        super().__init__("\n".join(_plain_line(p) for p in self.problems))

    def describe(self, source: str, name_location: Callable[[Location], str] | None = None) -> str:
        """One line per problem, ``<source>: <field.path>: <reason>`` (``<source>: <reason>`` where the location is
        empty); ``name_location`` turns a location into the field path (default :func:`dotted_location`)."""
        name = name_location or dotted_location
        lines = []
        for problem in self.problems:
            where = name(problem.location)
            lines.append(f"{source}: {where}: {problem.reason}" if where else f"{source}: {problem.reason}")
        return "\n".join(lines)


def dotted_location(location: Location) -> str:
    """``('accounts', 'census', 'allowed_dags', 0)`` -> ``accounts.census.allowed_dags.0`` (pydantic's style)."""
    return ".".join(str(part) for part in location)


def _plain_line(problem: YAMLProblem) -> str:
    where = dotted_location(problem.location)
    return f"{where}: {problem.reason}" if where else problem.reason


def load_yaml(text: str) -> object:
    """Read one YAML document with the YAML 1.2 core schema (module docstring); None for an empty document.

    Returns plain Python objects: dict, list, str, int, float, bool, None.

    Raises:
        YAMLDocumentError: not valid YAML (reason ``not valid YAML: ...``), more than one document, or the
            ambiguous scalars, duplicate keys, merge keys and ``%YAML`` directives listed in the module docstring
            (every one found, each with its location).
    """
    loader = _CoreReader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as error:
            raise YAMLDocumentError([YAMLProblem((), 0, f"not valid YAML: {_parser_message(error)}")]) from None
        problems: list[YAMLProblem] = []
        if loader.yaml_version not in (None, (1, 2)):
            major, minor = loader.yaml_version
            problems.append(YAMLProblem((), 1, (
                f"the document declares %YAML {major}.{minor}, but it is read as YAML 1.2 (core schema): remove "
                "the directive or write '%YAML 1.2'"
            )))
        if node is not None:
            _check_node(node, (), loader.plain_scalars, problems, set())
        try:
            document = None if node is None else loader.construct_document(node)
        except yaml.YAMLError as error:  # an explicit tag the core schema has no constructor for (!!timestamp), or
            # a duplicate key already listed in problems
            invalid = YAMLProblem((), 0, f"not valid YAML: {_parser_message(error)}")
            raise YAMLDocumentError(problems or [invalid]) from None
        if problems:
            raise YAMLDocumentError(problems, document)
        return document
    finally:
        loader.dispose()


def document_kind(document: object) -> str:
    """What a document :func:`load_yaml` returned is, in a reader's words, for "expected a mapping, found ...":
    ``no document (an empty file, or only comments)``, ``a list``, ``a string``, ``a number``, ``a boolean``."""
    if document is None:
        return "no document (an empty file, or only comments)"
    if isinstance(document, list):
        return "a list"
    if isinstance(document, str):
        return "a string"
    return "a boolean" if isinstance(document, bool) else "a number"


def _parser_message(error: yaml.YAMLError) -> str:
    """PyYAML's error on one line, with 1-based line and column, without the stream name PyYAML gives a string
    ("<unicode string>"): the caller names the file."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return str(error)

    def at(mark) -> str:
        return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""

    message = f"{error.problem or 'invalid document'}{at(error.problem_mark)}"
    if error.context:
        message += f" ({error.context}{at(error.context_mark)})"
    return message


class _CoreReader(CoreLoader):
    """yamlcore's YAML 1.2 core-schema loader, noting which scalars were plain and untagged (``plain_scalars``,
    node ids): only those are resolved by a schema, so only those can be ambiguous. Quoted scalars and explicit tags
    (``'010'``, ``!!str 010``) say what they are."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.plain_scalars: set[int] = set()

    def compose_scalar_node(self, anchor):  # noqa: ANN001, ANN201 (PyYAML's signature)
        event = self.peek_event()
        node = super().compose_scalar_node(anchor)
        if event.tag in (None, "!") and event.implicit[0]:  # PyYAML resolves a bare '!' like a plain scalar
            self.plain_scalars.add(id(node))
        return node


def _check_node(node: Node, location: Location, plain: set[int], problems: list[YAMLProblem], seen: set[int]) -> None:
    """Append the problems of ``node`` and everything under it (each node once: aliases share nodes)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, ScalarNode):
        reason = _ambiguity(node.tag, node.value) if id(node) in plain else None
        if reason is not None:
            problems.append(YAMLProblem(location, node.start_mark.line + 1, reason))
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _check_node(item, (*location, index), plain, problems, seen)
    elif isinstance(node, MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, ScalarNode):  # a complex key: not used by any of our documents
                _check_node(key_node, location, plain, problems, seen)
                _check_node(value_node, location, plain, problems, seen)
                continue
            name = key_node.value
            if name == "<<" and id(key_node) in plain:
                problems.append(YAMLProblem(location, line, (
                    "'<<' is a YAML 1.1 merge key, which YAML 1.2 does not have: write the fields out (or quote "
                    "'<<' if it is a name)"
                )))
            elif name in first_line:
                problems.append(YAMLProblem((*location, name), line, (
                    f"duplicate key {name!r} (first on line {first_line[name]}): YAML keys must be unique, and "
                    "other readers silently keep the last value; keep one"
                )))
            first_line.setdefault(name, line)
            _check_node(key_node, (*location, name), plain, problems, seen)
            _check_node(value_node, (*location, name), plain, problems, seen)


def _ambiguity(tag_12: str, text: str) -> str | None:
    """Why the plain scalar ``text``, resolved to ``tag_12`` by the YAML 1.2 core schema, cannot be read
    unambiguously; None if it can."""
    if tag_12 not in (*_NUMBERS, _STR):
        return None  # true/false/null read the same in YAML 1.1
    value_12 = _construct_12(tag_12, text)
    tag_11 = _YAML11_RESOLVER.resolve(ScalarNode, text, (True, False))
    value_11 = _construct_11(tag_11, text)
    digits = text.lstrip("+-")
    if tag_12 == _INT and len(digits) > 1 and digits[0] == "0" and digits.isdigit():
        fix = (f"quote it ('{text}') if it is a code such as a zip code, or write the number without the leading "
               "zero")
        if tag_11 == _INT and value_11 == value_12:  # 00-07: octal and decimal agree, but the zero is still lost
            return (
                f"{text} is ambiguous: YAML 1.1 reads it as octal and YAML 1.2 as decimal, both the integer "
                f"{value_12} here (from 8 on they differ: 010 is 8 in YAML 1.1, 10 in YAML 1.2), and either reading "
                f"loses the leading zero; {fix}"
            )
        if tag_11 == _INT:
            yaml_11 = f"the octal integer {text}, that is {value_11}"
            lost = "; either reading loses the leading zero"
        else:
            yaml_11 = f"{_reading(tag_11, value_11)} (8 and 9 are not octal digits)"
            lost = ", which loses the leading zero"
        return (
            f"{text} is ambiguous: YAML 1.1 reads {yaml_11}, and YAML 1.2 reads the decimal integer {value_12}"
            f"{lost}; {fix}"
        )
    if (tag_11 in _NUMBERS or tag_12 == _INT) and (tag_11 != tag_12 or not _same_number(value_11, value_12)):
        return (
            f"{text} is ambiguous: YAML 1.1 reads {_reading(tag_11, value_11)} and YAML 1.2 reads "
            f"{_reading(tag_12, value_12)}; quote it ('{text}') if it is text, or write the number in plain "
            "decimal digits"
        )
    if tag_12 == _FLOAT and not _float_holds(text, value_12):
        return (
            f"{text} is not held exactly by a 64-bit float (it would read as {value_12!r}); quote it ('{text}') "
            "to have the exact decimal read, or round it"
        )
    return None


def _construct_12(tag: str, text: str) -> object:
    return _CoreConstructor().construct_object(ScalarNode(tag, text))


def _construct_11(tag: str, text: str) -> object:
    try:
        return SafeConstructor().construct_object(ScalarNode(tag, text))
    except (yaml.YAMLError, ValueError):  # a YAML 1.1-only tag with no value here (the merge key '<<', '=')
        return text


def _reading(tag: str, value: object) -> str:
    if tag in _NUMBERS:
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the text {value!r}"
    return f"the {type(value).__name__} {value!r}"


def _same_number(first: object, second: object) -> bool:
    if isinstance(first, float) and isinstance(second, float) and math.isnan(first) and math.isnan(second):
        return True
    return first == second


def _float_holds(text: str, value: float) -> bool:
    """True if the float ``value`` is exactly the decimal ``text`` (so that reading it through its shortest repr, as
    :func:`~dp_operators.accounting.exact_number` does, gives back what was typed), or ``text`` is ``.inf``/``.nan``.
    """
    try:
        written = Decimal(text)
    except InvalidOperation:  # .inf, .nan: not decimals, read as written
        return True
    return written == Decimal(repr(value))
