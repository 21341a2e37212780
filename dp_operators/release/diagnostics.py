"""Opt-in diagnostics of upstream aggregates: exact, data-derived numbers for the people who may see the data.

A release never logs, raises or stores a number computed from the data other than the noised values (DESIGN.md
2.8): how many rows fell outside the public key domain, how many NaNs were replaced, which row was malformed are
exact functions of the data, and a task log is readable by anyone who can see the DAG. Data owners still need that
feedback, so it is collected in a :class:`DiagnosticsReport` that the engine hands only to a caller who asked for
it (:func:`~dp_operators.release.run_release`'s ``diagnostics`` callback, the operator's ``diagnostics_uri``, or
:func:`~dp_operators.release.check_aggregates` in the upstream task). The report belongs next to the true
aggregates, readable by the same people; never log it, publish it or pass it through XCom. Decision record:
docs/adr/0016-diagnostics-report.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Keys outside the public domain kept as examples per aggregate.
EXAMPLE_KEYS = 10
#: Problems kept (with their row index) per aggregate; ``problem_count`` counts them all.
KEPT_PROBLEMS = 20

NOTICE = (
    "Exact, data-derived numbers about the true aggregates (not differentially private). Keep this report with "
    "the true aggregates, readable only by the people who may see them; never publish or log it."
)


@dataclass(frozen=True)
class InputProblem:
    """A shape or type problem of an upstream value: the release refuses it before reserving any budget.

    Attributes:
        aggregate: the aggregate's name (None for a problem of the whole mapping).
        row: index of the row in the aggregate's list of rows (None when not grouped or not row-level).
        field: the field or key column at fault (None for a whole-value problem).
        message: what is wrong and how to fix it (names the type found, never a value).
    """

    aggregate: str | None
    row: int | None
    field: str | None
    message: str

    def __repr__(self) -> str:  # the row index is data-derived
        return "InputProblem(<withheld>)"

    def as_dict(self) -> dict[str, Any]:
        return {"aggregate": self.aggregate, "row": self.row, "field": self.field, "message": self.message}


@dataclass
class AggregateDiagnostics:
    """What the engine saw in one aggregate's upstream value. Every number is exact and data-derived.

    Attributes:
        rows: rows read (1 for an ungrouped aggregate), malformed ones included.
        partitions: partitions with at least one row (public keys found, or keys found under partition selection).
        rows_outside_domain: rows whose key is not in the public key domain (ignored; a NULL key is outside it).
        outside_domain_examples: up to :data:`EXAMPLE_KEYS` distinct such keys, as lists of column values.
        rows_dropped: rows ignored because a value's ``non_finite`` policy is ``drop``.
        rows_unpublishable_key: rows ignored because a key value cannot be published (a non-integral float, a str
            with lone surrogates, an int of more than about 1000 digits).
        special_values: per field, how many values were ``nan`` (float or Decimal NaN), ``null`` (None,
            pandas.NA, pandas.NaT: treated as NaN) or ``infinity``, each handled by the ``non_finite`` policy.
        float_values: per field, how many binary floats were read (exactly, as their binary value).
        non_integer_counts: per component, partitions whose count (``count``, rounded to nearest) or unit count
            (``selection``, rounded down) was not a whole number.
        clamped: per component, partitions clamped into the range clipped data satisfy (a negative count, a
            centred sum beyond the bounds).
        saturated: per component, partitions beyond the engine's saturation limit (+-2^62 grid units).
        partitions_over_max_rows: partitions whose count exceeds the spec's declared ``upstream.max_rows`` (only
            for kinds with a count: mean, variance). The float allowance and the saturation check rest on that
            declaration: raise ``max_rows`` in the spec (the release itself never refuses on a data value).
        labels_beyond_bins: rows of a quantile's histogram whose bin label lies below the first bin's (counted in
            the first bin) or above the last's (counted in the last), as values beyond the edges are.
        groups_with_differing_units: a quantile's groups under partition selection whose rows give different
            ``units`` (each row should repeat its group's number of units; the release takes the largest).
        problems: the first :data:`KEPT_PROBLEMS` shape or type problems, with their row index.
        problem_count: every problem found.
    """

    rows: int = 0
    partitions: int = 0
    rows_outside_domain: int = 0
    outside_domain_examples: list[list[Any]] = field(default_factory=list)
    rows_dropped: int = 0
    rows_unpublishable_key: int = 0
    special_values: dict[str, Counter] = field(default_factory=dict)
    float_values: Counter = field(default_factory=Counter)
    non_integer_counts: Counter = field(default_factory=Counter)
    clamped: Counter = field(default_factory=Counter)
    saturated: Counter = field(default_factory=Counter)
    partitions_over_max_rows: int = 0
    labels_beyond_bins: int = 0
    groups_with_differing_units: int = 0
    problems: list[InputProblem] = field(default_factory=list)
    problem_count: int = 0

    def __repr__(self) -> str:  # data-derived: must not reach a log through a repr
        return "AggregateDiagnostics(<data-derived content withheld; see as_dict()>)"

    def special(self, field_name: str, kind: str) -> None:
        self.special_values.setdefault(field_name, Counter())[kind] += 1

    def outside_domain(self, key: tuple) -> None:
        self.rows_outside_domain += 1
        example = list(key)
        if len(self.outside_domain_examples) < EXAMPLE_KEYS and example not in self.outside_domain_examples:
            self.outside_domain_examples.append(example)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "partitions": self.partitions,
            "rows_outside_domain": self.rows_outside_domain,
            "outside_domain_examples": [list(example) for example in self.outside_domain_examples],
            "rows_dropped": self.rows_dropped,
            "rows_unpublishable_key": self.rows_unpublishable_key,
            "special_values": {f: dict(sorted(c.items())) for f, c in sorted(self.special_values.items())},
            "float_values": dict(sorted(self.float_values.items())),
            "non_integer_counts": dict(sorted(self.non_integer_counts.items())),
            "clamped": dict(sorted(self.clamped.items())),
            "saturated": dict(sorted(self.saturated.items())),
            "partitions_over_max_rows": self.partitions_over_max_rows,
            "labels_beyond_bins": self.labels_beyond_bins,
            "groups_with_differing_units": self.groups_with_differing_units,
            "problems": [problem.as_dict() for problem in self.problems],
            "problem_count": self.problem_count,
        }


@dataclass
class DiagnosticsReport:
    """Data-quality report of one release's upstream aggregates: exact, data-derived numbers, not private.

    Filled by :func:`~dp_operators.release.prepare_inputs` (inside a release) and
    :func:`~dp_operators.release.check_aggregates` (in the upstream task). Its ``repr`` withholds the content, so
    that an accidental log line shows nothing; read it through the attributes or :meth:`as_dict`.

    Attributes:
        release: the spec's release name.
        aggregates: per aggregate of the spec that was provided, its :class:`AggregateDiagnostics`.
        problems: problems of the whole mapping (not a mapping, aggregates missing).
        unused_aggregates: names the upstream provided that the spec does not release (ignored).
    """

    release: str
    aggregates: dict[str, AggregateDiagnostics] = field(default_factory=dict)
    problems: list[InputProblem] = field(default_factory=list)
    unused_aggregates: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # data-derived: must not reach a log through a repr
        return f"DiagnosticsReport(release={self.release!r}, <data-derived content withheld; see as_dict()>)"

    __str__ = __repr__

    def aggregate(self, name: str) -> AggregateDiagnostics:
        """The diagnostics of aggregate ``name`` (created empty on first use)."""
        return self.aggregates.setdefault(name, AggregateDiagnostics())

    def add_problem(self, problem: InputProblem) -> None:
        if problem.aggregate is None:
            self.problems.append(problem)
            return
        diagnostics = self.aggregate(problem.aggregate)
        diagnostics.problem_count += 1
        if len(diagnostics.problems) < KEPT_PROBLEMS:
            diagnostics.problems.append(problem)

    @property
    def ok(self) -> bool:
        """True when no shape or type problem was found: the release would accept these aggregates."""
        return not self.problems and not any(d.problem_count for d in self.aggregates.values())

    def all_problems(self) -> list[InputProblem]:
        """The kept problems, whole-mapping ones first, then per aggregate in spec order."""
        return self.problems + [p for d in self.aggregates.values() for p in d.problems]

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON (what the operator writes to ``diagnostics_uri``)."""
        return {
            "notice": NOTICE,
            "release": self.release,
            "ok": self.ok,
            "problems": [problem.as_dict() for problem in self.problems],
            "unused_aggregates": list(self.unused_aggregates),
            "aggregates": {name: d.as_dict() for name, d in self.aggregates.items()},
        }
