"""Loading release specs from YAML, with errors that name the file, the field path and the reason."""

from __future__ import annotations

import difflib
import hashlib
import typing
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dp_operators.spec.models import ReleaseSpec
from dp_operators.spec.yaml12 import YAMLDocumentError, document_kind, load_yaml


class SpecError(ValueError):
    """A release spec is invalid. The message names the source, every failing field path and the reason."""


def _field_path(location: tuple, document: object) -> str:
    parts: list[str] = []
    node = document
    for item in location:
        if isinstance(item, int):
            entry = node[item] if isinstance(node, list) and 0 <= item < len(node) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            shown = f"{name[:40]}..." if isinstance(name, str) and len(name) > 40 else name
            parts.append(f"[{item}]" + (f"({shown})" if shown else ""))
        else:
            if item.startswith(("function-", "tagged-union")) or item in ("float", "int", "str"):
                continue
            parts.append(("." if parts else "") + str(item))
        try:
            node = node[item]
        except (KeyError, IndexError, TypeError):
            node = None
    return "".join(parts) or "(document)"


def parse_spec(text: str, *, source: str = "<string>") -> ReleaseSpec:
    """Parse and validate a release spec from YAML text, read as YAML 1.2 (:mod:`dp_operators.spec.yaml12`:
    ``[yes, no]`` are text, an ambiguous scalar such as ``010`` is refused).

    Args:
        text: the YAML document.
        source: where it came from, used in error messages (a file path).

    Raises:
        SpecError: invalid or ambiguous YAML, or a document that fails validation; one line per problem,
            ``<source>: <field.path>: <reason>``.
    """
    try:
        document = load_yaml(text)
    except YAMLDocumentError as error:
        if len(error.problems) == 1 and not error.problems[0].location:  # a syntax error: no field to name
            raise SpecError(f"{source}: {error.problems[0].reason}") from None
        lines = [f"{source}: cannot be read unambiguously ({len(error.problems)} problem(s)):"]
        for problem in error.problems:
            lines.append(f"  {_field_path(problem.location, error.document)}: {problem.reason} (line {problem.line})")
        raise SpecError("\n".join(lines)) from None
    if not isinstance(document, dict):
        raise SpecError(f"{source}: a release spec is a YAML mapping with 'version: 1', found {document_kind(document)}")
    try:
        return ReleaseSpec.model_validate(document)
    except ValidationError as error:
        lines = [f"{source}: invalid release spec ({error.error_count()} problem(s)):"]
        for problem in error.errors():
            message = problem["msg"].removeprefix("Value error, ")
            if problem["type"] == "extra_forbidden":
                near = _nearest_field(problem["loc"])
                hint = f"did you mean {near!r}? " if near else "check the spelling; "
                message = f"unknown field ({hint}see docs/spec-reference.md)"
            lines.append(f"  {_field_path(problem['loc'], document)}: {message}")
        raise SpecError("\n".join(lines)) from None


def _nearest_field(location: tuple) -> str | None:
    """The field of the model at ``location`` (a pydantic error location) closest to its last element's spelling,
    if one is close (difflib's ratio of at least 0.6), else None."""
    model: Any = ReleaseSpec
    for part in location[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return None
    fields = list(getattr(model, "model_fields", {}))
    found = difflib.get_close_matches(str(location[-1]), fields, n=1, cutoff=0.6) if location else []
    return found[0] if found else None


def _model_in(annotation: Any) -> Any:
    """The pydantic model an annotation holds (``Aggregate`` in ``list[Aggregate]``, ``Series | None``), or None."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def load_spec(path: str | Path) -> ReleaseSpec:
    """Load and validate the release spec at ``path``.

    Raises:
        SpecError: the file is missing or unreadable, or the spec is invalid.
    """
    return load_spec_with_hash(path)[0]


def load_spec_with_hash(path: str | Path) -> tuple[ReleaseSpec, str]:
    """Load and validate the release spec at ``path`` and return it with the SHA-256 of the very text validated
    (one read: the hash recorded with a charge always belongs to the spec that was applied).

    Raises:
        SpecError: the file is missing or unreadable, or the spec is invalid.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(f"{path}: cannot read release spec: {error.strerror}") from None
    return parse_spec(text, source=str(path)), spec_hash(text)


def spec_hash(text: str) -> str:
    """SHA-256 hex digest of a spec's text, recorded with every charge so an auditor can match spec and release."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
