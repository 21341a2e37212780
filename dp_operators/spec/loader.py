"""Loading release specs from YAML, with errors that name the file, the field path and the reason."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml
from pydantic import ValidationError

from dp_operators.spec.models import ReleaseSpec


class SpecError(ValueError):
    """A release spec is invalid. The message names the source, every failing field path and the reason."""


def _field_path(location: tuple, document: object) -> str:
    parts: list[str] = []
    node = document
    for item in location:
        if isinstance(item, int):
            entry = node[item] if isinstance(node, list) and 0 <= item < len(node) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            parts.append(f"[{item}]" + (f"({name})" if name else ""))
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
    """Parse and validate a release spec from YAML text.

    Args:
        text: the YAML document.
        source: where it came from, used in error messages (a file path).

    Raises:
        SpecError: invalid YAML, or a document that fails validation; one line per problem,
            ``<source>: <field.path>: <reason>``.
    """
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(f"{source}: not valid YAML: {error}") from None
    if not isinstance(document, dict):
        raise SpecError(f"{source}: a release spec is a YAML mapping with 'version: 1', got {type(document).__name__}")
    try:
        return ReleaseSpec.model_validate(document)
    except ValidationError as error:
        lines = [f"{source}: invalid release spec ({error.error_count()} problem(s)):"]
        for problem in error.errors():
            message = problem["msg"].removeprefix("Value error, ")
            if problem["type"] == "extra_forbidden":
                message = "unknown field (check the spelling; see the spec reference in README.md)"
            lines.append(f"  {_field_path(problem['loc'], document)}: {message}")
        raise SpecError("\n".join(lines)) from None


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
