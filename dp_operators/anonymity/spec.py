"""The YAML anonymity-check spec: pydantic v2 models, loading, and error messages with field paths.

A spec declares the quasi-identifiers and sensitive attributes of a microdata table and the targets a release must
meet before publication::

    version: 1
    check: adult_microdata
    quasi_identifiers: [age, sex, race, native_country, education]
    sensitive_attributes:
      - {name: income, type: categorical}
      - {name: hours_per_week, type: ordered}
      - name: occupation
        type: categorical
        hierarchy: {"*": {Office: [Adm-clerical, Sales], Manual: [Craft-repair, ...]}}
    targets:
      k: 5
      l: {kind: distinct, l: 2}          # or {kind: entropy, l: 1.5} or {kind: recursive, l: 2, c: 3}
      t: 0.35
    suppression: {max_fraction: 0.01}    # rows in classes smaller than k that may be suppressed
    on_failure: fail                     # or warn

Every model forbids unknown fields. :func:`load_anonymity_spec` turns validation errors into one
:class:`~dp_operators.anonymity.errors.AnonymitySpecError` whose lines read ``<file>: <field.path>: <reason>``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dp_operators.anonymity.errors import AnonymitySpecError
from dp_operators.anonymity.hierarchy import ValueHierarchy
from dp_operators.spec.yaml12 import YAMLDocumentError, dotted_location, load_yaml

_STRICT = ConfigDict(extra="forbid", frozen=True)


def _not_bool(value: object) -> object:
    # YAML 'true' would otherwise be read as the number 1.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not a boolean ({str(value).lower()})")
    return value


def _unit_interval(value: object) -> object:
    """A fraction in [0, 1]: refuses booleans, NaN and infinities with a message saying so (range checked by the
    field's own ge/le)."""
    _not_bool(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number in [0, 1], got {value}")
    return value


#: An integer that is not a YAML boolean (``k: true`` is not k = 1).
_Integer = Annotated[int, BeforeValidator(_not_bool)]
#: A real number that is not a YAML boolean.
_Number = Annotated[float, BeforeValidator(_not_bool)]
#: A fraction in [0, 1], finite, not a boolean.
_Fraction01 = Annotated[float, BeforeValidator(_unit_interval)]


class SensitiveAttribute(BaseModel):
    """One sensitive attribute.

    ``type: ordered`` uses the ordered distance for t-closeness (numeric columns, or any column with ``order``
    listing its values from lowest to highest); ``type: categorical`` uses the equal distance, or the hierarchical
    distance when ``hierarchy`` is given (nested mappings, innermost values are lists of the column's values).
    """

    model_config = _STRICT

    name: str = Field(min_length=1)
    type: Literal["ordered", "categorical"]
    hierarchy: dict[str, Any] | None = None
    order: list[str | int | float] | None = None

    @model_validator(mode="after")
    def _check_options(self) -> SensitiveAttribute:
        if self.hierarchy is not None and self.type != "categorical":
            raise ValueError("a hierarchy applies to a categorical attribute; set type: categorical")
        if self.order is not None and self.type != "ordered":
            raise ValueError("an order applies to an ordered attribute; set type: ordered")
        if self.order is not None and len({str(v) for v in self.order}) != len(self.order):
            raise ValueError("order lists a value more than once")
        if self.hierarchy is not None:
            ValueHierarchy.from_mapping(self.hierarchy)  # raises ValueError with the reason
        return self

    @property
    def distance(self) -> Literal["ordered", "equal", "hierarchical"]:
        """The t-closeness ground distance this declaration selects (Li et al. 2007, section 4.2)."""
        if self.type == "ordered":
            return "ordered"
        return "hierarchical" if self.hierarchy is not None else "equal"

    def value_hierarchy(self) -> ValueHierarchy | None:
        return None if self.hierarchy is None else ValueHierarchy.from_mapping(self.hierarchy)


class LDiversityTarget(BaseModel):
    """Target l: ``distinct`` (integer l), ``entropy`` (real l >= 1) or ``recursive`` (integer l, and c > 0)."""

    model_config = _STRICT

    kind: Literal["distinct", "entropy", "recursive"]
    l: _Number = Field(ge=1)
    c: _Number | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_kind(self) -> LDiversityTarget:
        if self.kind in ("distinct", "recursive") and not float(self.l).is_integer():
            raise ValueError(f"{self.kind} l-diversity needs an integer l, got {self.l}")
        if self.kind == "recursive" and self.c is None:
            raise ValueError("recursive (c, l)-diversity needs c")
        if self.kind != "recursive" and self.c is not None:
            raise ValueError("c applies only to kind: recursive")
        if not math.isfinite(self.l) or (self.c is not None and not math.isfinite(self.c)):
            raise ValueError("l and c must be finite")
        return self


class Targets(BaseModel):
    """What the table must meet. At least one of ``k``, ``l``, ``t``; ``l`` and ``t`` apply to every sensitive
    attribute."""

    model_config = _STRICT

    k: _Integer | None = Field(default=None, ge=1)
    l: LDiversityTarget | None = None
    t: _Fraction01 | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _at_least_one(self) -> Targets:
        if self.k is None and self.l is None and self.t is None:
            raise ValueError("declare at least one target: k, l or t")
        return self


class Suppression(BaseModel):
    """Rows in equivalence classes smaller than the target k may be suppressed (withheld from the release) as long
    as they are at most ``max_fraction`` of the table; l and t are then measured on the remaining rows."""

    model_config = _STRICT

    max_fraction: _Fraction01 = Field(default=0.0, ge=0, le=1)


class AnonymitySpec(BaseModel):
    """A whole anonymity-check spec (``version: 1``)."""

    model_config = _STRICT

    version: Literal[1]
    check: str = Field(min_length=1, description="name of the check, reported and used in the asset event")
    quasi_identifiers: list[str] = Field(min_length=1)
    sensitive_attributes: list[SensitiveAttribute] = Field(default_factory=list)
    targets: Targets
    suppression: Suppression = Field(default_factory=Suppression)
    on_failure: Literal["fail", "warn"] = "fail"

    @field_validator("quasi_identifiers")
    @classmethod
    def _unique_qis(cls, value: list[str]) -> list[str]:
        duplicates = sorted({q for q in value if value.count(q) > 1})
        if duplicates:
            raise ValueError(f"quasi-identifiers listed more than once: {duplicates}")
        return value

    @model_validator(mode="after")
    def _check_attributes(self) -> AnonymitySpec:
        names = [a.name for a in self.sensitive_attributes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"sensitive attributes listed more than once: {duplicates}")
        overlap = sorted(set(names) & set(self.quasi_identifiers))
        if overlap:
            raise ValueError(f"columns declared both quasi-identifier and sensitive attribute: {overlap}")
        if (self.targets.l is not None or self.targets.t is not None) and not self.sensitive_attributes:
            raise ValueError("targets l and t need at least one sensitive attribute")
        return self


def _format_errors(source: str, error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"]) or "<document>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see docs/anonymity.md)"
        lines.append(f"{source}: {path}: {message}")
    return "\n".join(lines)


def parse_anonymity_spec(text: str, source: str = "<string>") -> AnonymitySpec:
    """Parse and validate spec YAML text; ``source`` names it in error messages.

    Raises:
        AnonymitySpecError: invalid YAML, a document that is not a mapping, or a field that fails validation
            (one line per problem: ``<source>: <field.path>: <reason>``).
    """
    try:
        document = load_yaml(text)  # YAML 1.2: [yes, no] are text; an ambiguous 010 is refused
    except YAMLDocumentError as exc:
        raise AnonymitySpecError(exc.describe(source, lambda loc: dotted_location(loc) or "<document>")) from exc
    if not isinstance(document, dict):
        kind = type(document).__name__
        raise AnonymitySpecError(f"{source}: <document>: expected a mapping of spec fields, got {kind}")
    try:
        return AnonymitySpec.model_validate(document)
    except ValidationError as exc:
        raise AnonymitySpecError(_format_errors(source, exc)) from exc


def load_anonymity_spec(path: str | Path) -> AnonymitySpec:
    """Read and validate a spec file.

    Raises:
        AnonymitySpecError: the file cannot be read, or see :func:`parse_anonymity_spec`.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AnonymitySpecError(f"{path}: <document>: cannot read the spec file: {exc.strerror}") from exc
    return parse_anonymity_spec(text, source=str(path))
