"""The YAML anonymity-check spec: pydantic v2 models, loading, and error messages with field paths.

A spec declares the quasi-identifiers and sensitive attributes of a microdata table and the targets a release must
meet before publication::

    version: 1
    check: adult_microdata
    quasi_identifiers:
      - sex                                             # no hierarchy: the value, then *
      - {name: age, type: numeric, hierarchy: {intervals: [5, 10, 20]}}
      - {name: education, hierarchy: {file: hierarchies/education.csv}}   # ARX's CSV, relative to this file
      - name: race
        hierarchy: {tree: {"*": {White: [White], Other: [Black, Asian-Pac-Islander, Amer-Indian-Eskimo, Other]}}}
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
    anonymisation: {algorithm: full_domain, metric: loss}   # how the anonymiser generalises

Quasi-identifier hierarchies (:mod:`dp_operators.anonymity.generalisation`) are loaded and validated when the spec
is, so a bad hierarchy file fails at DAG import: ``<spec>: quasi_identifiers.1.hierarchy: <csv>: line 7: <reason>``.

Every model forbids unknown fields. Numeric fields take YAML numbers only: ``k: '5'`` (quoted, so text) and
``k: true`` are refused, and an integer is accepted wherever a real number is. ``anonymisation: {algorithm:
mondrian}`` refuses quasi-identifier hierarchies (Mondrian builds its own intervals and sets; the check ignores them
too), rather than ignoring them silently. :func:`load_anonymity_spec` turns validation errors into one
:class:`~dp_operators.anonymity.errors.AnonymitySpecError` whose lines read ``<file>: <field.path>: <reason>``; a
value out of range or not among the allowed choices also says what the field means and which values it takes.
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
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dp_operators.anonymity.errors import AnonymitySpecError
from dp_operators.anonymity.generalisation import GeneralisationHierarchy
from dp_operators.anonymity.hierarchy import ValueHierarchy
from dp_operators.spec.yaml12 import YAMLDocumentError, document_kind, dotted_location, load_yaml

_STRICT = ConfigDict(extra="forbid", frozen=True)


def _plain_number(value: object) -> object:
    """Refuse what pydantic would otherwise coerce into a number: a YAML boolean (``true`` is not 1) and text
    (``'5'`` is quoted, so YAML reads it as text, not a number)."""
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not a boolean ({str(value).lower()})")
    if isinstance(value, (str, bytes)):
        text = value if isinstance(value, str) else value.decode("utf-8", "replace")
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise ValueError(f"must be a number, not text ({shown!r}); write the number without quotes")
    return value


def _unit_interval(value: object) -> object:
    """A fraction in [0, 1]: refuses booleans, text, NaN and infinities with a message saying so (range checked by
    the field's own ge/le)."""
    _plain_number(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number in [0, 1], got {value}")
    return value


#: An integer that is neither a YAML boolean (``k: true`` is not k = 1) nor text (``k: '5'``).
_Integer = Annotated[int, BeforeValidator(_plain_number)]
#: A real number (an integer is one too) that is neither a YAML boolean nor text.
_Number = Annotated[float, BeforeValidator(_plain_number)]
#: A fraction in [0, 1], finite, neither a boolean nor text.
_Fraction01 = Annotated[float, BeforeValidator(_unit_interval)]

_RISK_HELP = {
    "highest": "the largest re-identification risk (1 / class size) allowed for any record: a number in (0, 1], "
    "e.g. 0.2 (every class has 5 rows or more)",
    "average": "the largest mean record risk allowed over the released records: a number in (0, 1], e.g. 0.05",
    "records_at_risk": "the largest fraction of released records whose risk exceeds risk_threshold: a number in "
    "[0, 1], e.g. 0.01",
}

#: What each field means and which values it takes, by field path without list indices: appended to every error
#: about the field's value, so that the message says how to fix it.
_FIELD_HELP = {
    "version": "the spec format version; the only one is 1",
    "quasi_identifiers.type": "numeric (generalised to intervals) or categorical (to sets or hierarchy labels)",
    "quasi_identifiers.hierarchy.intervals": "band widths, each a whole multiple of the previous, e.g. [5, 10, 20]",
    "quasi_identifiers.hierarchy.origin": "a number where bands start (default 0)",
    "sensitive_attributes.type": "ordered (values have an order: the ordered distance for t) or categorical (the "
    "equal distance, or the hierarchical one with a hierarchy)",
    "targets.k": "k is the smallest equivalence class a release may have (every row shares its quasi-identifier "
    "values with at least k - 1 others): a whole number >= 1, e.g. 5",
    "targets.l.kind": "the l-diversity variant: distinct, entropy or recursive",
    "targets.l.l": "l is how many well-represented sensitive values each class needs: a number >= 1 (whole for "
    "distinct and recursive), e.g. 2",
    "targets.l.c": "c bounds the most frequent sensitive value of a class against the others in recursive "
    "(c, l)-diversity: a number > 0, e.g. 3",
    "targets.t": "t is the largest Earth Mover's Distance allowed between a class's sensitive-value distribution and "
    "the whole table's: a number in [0, 1], e.g. 0.2 (smaller is stricter)",
    **{f"targets.{model}_risk.{field}": meaning for model in ("prosecutor", "journalist") for field, meaning in
       _RISK_HELP.items()},
    "targets.marketer_risk": "the largest expected fraction of records re-identified by linking the whole release: "
    "a number in (0, 1], e.g. 0.05",
    "suppression.max_fraction": "the largest fraction of the table's rows that may be suppressed (withheld from the "
    "release): a number in [0, 1], e.g. 0.01 for 1%",
    "risk_threshold": "a record whose re-identification risk (1 / class size) exceeds this is at risk: a number in "
    "(0, 1], default 0.2",
    "on_failure": "fail (the task fails) or warn (it logs the report and succeeds)",
    "anonymisation.algorithm": "full_domain (optimal search over the quasi-identifiers' hierarchy levels) or "
    "mondrian (multidimensional partitioning into intervals and sets)",
    "anonymisation.metric": "the information loss the full-domain search minimises: loss (ARX's loss), ncp "
    "(normalised certainty penalty), discernibility or entropy (non-uniform entropy)",
}

#: pydantic's range errors, as a bound phrase.
_BOUNDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("greater than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}


class QuasiIdentifierHierarchy(BaseModel):
    """The generalisation hierarchy of one quasi-identifier: exactly one of

    - ``file`` (+ optional ``separator``, default ``;``): ARX's hierarchy CSV, one row per value and one column per
      level; a relative path is resolved against the spec file's folder;
    - ``intervals`` (+ optional ``origin``, default 0): nested numeric bands, e.g. ``[5, 10, 20]``, then ``*``;
    - ``tree``: nested mappings whose innermost lists are the column's values, all at the same depth.

    The hierarchy is built and validated here (see :class:`~dp_operators.anonymity.generalisation.
    GeneralisationHierarchy`); :meth:`generalisation_hierarchy` returns it.
    """

    model_config = _STRICT

    file: Path | None = None
    separator: str | None = Field(default=None, min_length=1, max_length=1)
    intervals: list[_Number] | None = Field(default=None, min_length=1)
    origin: _Number | None = None
    tree: dict[Any, Any] | None = None

    _hierarchy: GeneralisationHierarchy | None = PrivateAttr(default=None)

    @field_validator("file")
    @classmethod
    def _resolve(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None or value.is_absolute():
            return value
        base = (info.context or {}).get("base_dir")
        return (Path(base) if base is not None else Path.cwd()) / value

    @model_validator(mode="after")
    def _build(self) -> QuasiIdentifierHierarchy:
        declared = [key for key in ("file", "intervals", "tree") if getattr(self, key) is not None]
        if len(declared) != 1:
            found = f"got {', '.join(declared)}" if declared else "got none"
            raise ValueError(f"declare exactly one of file, intervals, tree ({found})")
        if self.separator is not None and self.file is None:
            raise ValueError("separator applies to a hierarchy file")
        if self.origin is not None and self.intervals is None:
            raise ValueError("origin applies to intervals")
        # Each constructor raises AnonymitySpecError (a ValueError) saying where and why; pydantic adds the path.
        if self.file is not None:
            self._hierarchy = GeneralisationHierarchy.from_arx_csv(self.file, self.separator or ";")
        elif self.intervals is not None:
            self._hierarchy = GeneralisationHierarchy.intervals(self.intervals, self.origin or 0)
        else:
            assert self.tree is not None
            self._hierarchy = GeneralisationHierarchy.from_tree(self.tree)
        return self

    def generalisation_hierarchy(self) -> GeneralisationHierarchy:
        assert self._hierarchy is not None  # set by the validator
        return self._hierarchy


class QuasiIdentifier(BaseModel):
    """One quasi-identifier: a bare column name (``age``), or ``{name, type?, hierarchy?}``.

    ``type`` (``numeric`` or ``categorical``) overrides the kind inferred from the column
    (:func:`~dp_operators.anonymity.columns.qi_kind`); without ``hierarchy`` the QI is generalised flat (the value,
    then ``*``).
    """

    model_config = _STRICT

    name: str = Field(min_length=1)
    type: Literal["numeric", "categorical"] | None = None
    hierarchy: QuasiIdentifierHierarchy | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: object) -> object:
        if isinstance(value, str):
            return {"name": value}
        if not isinstance(value, (dict, QuasiIdentifier)):
            raise ValueError(
                "a quasi-identifier is a column name or a mapping {name, type?, hierarchy?}, "
                f"got {type(value).__name__}"
            )
        return value

    @model_validator(mode="after")
    def _check_type(self) -> QuasiIdentifier:
        if self.type == "categorical" and self.hierarchy is not None and self.hierarchy.intervals is not None:
            raise ValueError("interval hierarchies apply to numeric columns; set type: numeric or give a file or tree")
        return self

    def generalisation_hierarchy(self) -> GeneralisationHierarchy | None:
        """The declared hierarchy, or ``None`` (then the anonymiser uses ``GeneralisationHierarchy.flat()``)."""
        return None if self.hierarchy is None else self.hierarchy.generalisation_hierarchy()


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


class RiskTarget(BaseModel):
    """Re-identification risk bounds for the prosecutor or journalist model (El Emam & Dankar 2008); each optional.

    ``highest``: the largest record risk (``1 / class size``) allowed, a class-level target; ``average``: the
    largest average risk (prosecutor: the mean record risk over released records; journalist: El Emam's
    ``max(J / sum F, (1/n) sum f / F)``); ``records_at_risk``: the largest fraction of released records whose risk
    exceeds the spec's ``risk_threshold``. See :mod:`dp_operators.anonymity.risk`.
    """

    model_config = _STRICT

    highest: _Fraction01 | None = Field(default=None, gt=0, le=1)
    average: _Fraction01 | None = Field(default=None, gt=0, le=1)
    records_at_risk: _Fraction01 | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _at_least_one(self) -> RiskTarget:
        if self.highest is None and self.average is None and self.records_at_risk is None:
            raise ValueError("declare at least one of highest, average, records_at_risk")
        return self


class Targets(BaseModel):
    """What the table must meet. At least one target; ``l`` and ``t`` apply to every sensitive attribute."""

    model_config = _STRICT

    k: _Integer | None = Field(default=None, ge=1)
    l: LDiversityTarget | None = None
    t: _Fraction01 | None = Field(default=None, ge=0, le=1)
    prosecutor_risk: RiskTarget | None = None
    journalist_risk: RiskTarget | None = None
    marketer_risk: _Fraction01 | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _at_least_one(self) -> Targets:
        declared = (self.k, self.l, self.t, self.prosecutor_risk, self.journalist_risk, self.marketer_risk)
        if all(value is None for value in declared):
            raise ValueError(
                "declare at least one target: k, l, t, prosecutor_risk, journalist_risk or marketer_risk"
            )
        return self


class Suppression(BaseModel):
    """Whole equivalence classes that still fail a class-level target after generalisation (k, l, t, highest risk)
    may be suppressed (withheld from the release) as long as their rows are at most ``floor(max_fraction * n)``;
    t keeps the whole input table's distribution as its reference (:mod:`dp_operators.anonymity.criteria`)."""

    model_config = _STRICT

    max_fraction: _Fraction01 = Field(default=0.0, ge=0, le=1)


class Anonymisation(BaseModel):
    """How the anonymiser generalises the table.

    ``algorithm``: ``full_domain`` (optimal search over the lattice of hierarchy levels; LeFevre et al. 2005,
    Kohlmayer et al. 2012) or ``mondrian`` (multidimensional partitioning; LeFevre et al. 2006). ``metric``: the
    information loss minimised by the full-domain search: ``loss`` (ARX's loss), ``ncp`` (normalised certainty
    penalty, Xu et al. 2006), ``discernibility`` (Bayardo & Agrawal 2005) or ``entropy`` (non-uniform entropy).
    Mondrian does not use quasi-identifier hierarchies: a spec declaring one with ``algorithm: mondrian`` is refused
    (:class:`AnonymitySpec`).
    """

    model_config = _STRICT

    algorithm: Literal["full_domain", "mondrian"] = "full_domain"
    metric: Literal["loss", "ncp", "discernibility", "entropy"] = "loss"


class AnonymitySpec(BaseModel):
    """A whole anonymity-check spec (``version: 1``)."""

    model_config = _STRICT

    version: Literal[1]
    check: str = Field(min_length=1, description="name of the check, reported and used in the asset event")
    quasi_identifiers: list[QuasiIdentifier] = Field(min_length=1)
    sensitive_attributes: list[SensitiveAttribute] = Field(default_factory=list)
    targets: Targets
    suppression: Suppression = Field(default_factory=Suppression)
    risk_threshold: _Fraction01 = Field(
        default=0.2, gt=0, le=1, description="a record whose re-identification risk exceeds this is at risk"
    )
    on_failure: Literal["fail", "warn"] = "fail"
    anonymisation: Anonymisation = Field(default_factory=Anonymisation)

    @field_validator("quasi_identifiers")
    @classmethod
    def _unique_qis(cls, value: list[QuasiIdentifier]) -> list[QuasiIdentifier]:
        names = [q.name for q in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"quasi-identifiers listed more than once: {duplicates}")
        return value

    @property
    def qi_names(self) -> list[str]:
        """The quasi-identifier column names, in the spec's order."""
        return [q.name for q in self.quasi_identifiers]

    def hierarchies(self) -> dict[str, GeneralisationHierarchy]:
        """The declared generalisation hierarchies by QI name (QIs without one are absent: they are generalised
        flat)."""
        declared = {q.name: q.generalisation_hierarchy() for q in self.quasi_identifiers}
        return {name: hierarchy for name, hierarchy in declared.items() if hierarchy is not None}

    @model_validator(mode="after")
    def _check_attributes(self) -> AnonymitySpec:
        names = [a.name for a in self.sensitive_attributes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"sensitive attributes listed more than once: {duplicates}")
        overlap = sorted(set(names) & set(self.qi_names))
        if overlap:
            raise ValueError(f"columns declared both quasi-identifier and sensitive attribute: {overlap}")
        if (self.targets.l is not None or self.targets.t is not None) and not self.sensitive_attributes:
            raise ValueError("targets l and t need at least one sensitive attribute")
        if self.anonymisation.algorithm == "mondrian":
            declared = [f"quasi_identifiers.{i}.hierarchy ({q.name})" for i, q in enumerate(self.quasi_identifiers)
                        if q.hierarchy is not None]
            if declared:
                raise ValueError(
                    "Mondrian does not use quasi-identifier hierarchies (it builds intervals and sets), but "
                    f"{', '.join(declared)} declare(s) one; remove them or use algorithm: full_domain"
                )
        return self


def _format_errors(source: str, error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"]) or "<document>"
        kind = item["type"]
        message = item["msg"].removeprefix("Value error, ")
        if kind == "extra_forbidden":
            message = "unknown field (check the spelling; see docs/anonymity.md)"
        elif kind in _BOUNDS:
            phrase, key = _BOUNDS[kind]
            bound = (item.get("ctx") or {}).get(key)
            if isinstance(bound, float) and bound.is_integer():
                bound = int(bound)
            message = f"must be {phrase} {bound}, got {_shown(item.get('input'))}"
        elif kind == "int_from_float":
            message = f"must be a whole number, got {_shown(item.get('input'))}"
        elif kind in ("int_type", "float_type", "int_parsing", "float_parsing"):
            message = f"must be a number, got {type(item.get('input')).__name__}"
        elif kind == "literal_error":
            message = f"must be {(item.get('ctx') or {}).get('expected')}, got {_shown(item.get('input'))}"
        meaning = _FIELD_HELP.get(".".join(str(p) for p in item["loc"] if not isinstance(p, int)))
        if meaning is not None and kind not in ("extra_forbidden", "missing"):
            message = f"{message}; {meaning}"
        lines.append(f"{source}: {path}: {message}")
    return "\n".join(lines)


def _shown(value: object) -> str:
    """A spec value for a message (the spec is configuration, not personal data), cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def parse_anonymity_spec(text: str, source: str = "<string>", base_dir: str | Path | None = None) -> AnonymitySpec:
    """Parse and validate spec YAML text; ``source`` names it in error messages.

    Relative hierarchy file paths are resolved against ``base_dir`` (the spec file's folder when called by
    :func:`load_anonymity_spec`), else against the current directory; the files are read and validated here.

    Raises:
        AnonymitySpecError: invalid YAML, a document that is not a mapping, or a field that fails validation
            (one line per problem: ``<source>: <field.path>: <reason>``).
    """
    try:
        document = load_yaml(text)  # YAML 1.2: [yes, no] are text; an ambiguous 010 is refused
    except YAMLDocumentError as exc:
        raise AnonymitySpecError(exc.describe(source, lambda loc: dotted_location(loc) or "<document>")) from exc
    if not isinstance(document, dict):
        raise AnonymitySpecError(
            f"{source}: <document>: expected a mapping of spec fields, found {document_kind(document)}"
        )
    try:
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        return AnonymitySpec.model_validate(document, context={"base_dir": base})
    except ValidationError as exc:
        raise AnonymitySpecError(_format_errors(source, exc)) from exc


def load_anonymity_spec(path: str | Path) -> AnonymitySpec:
    """Read and validate a spec file (relative hierarchy files are resolved against its folder).

    Raises:
        AnonymitySpecError: the file cannot be read, or see :func:`parse_anonymity_spec`.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AnonymitySpecError(f"{path}: <document>: cannot read the spec file: {exc.strerror}") from exc
    return parse_anonymity_spec(text, source=str(path), base_dir=path.parent)
