"""Upstream values: check their shape and types and read them onto each aggregate's grid. Raw values never leave
here except as :class:`PreparedInputs`, which the engine noises and drops, and as the opt-in
:class:`~dp_operators.release.diagnostics.DiagnosticsReport`, which holds exact data-derived counts for the data
owners (docs/adr/0016)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import product
from typing import Any

import numpy as np

from dp_operators.release import columns
from dp_operators.release.diagnostics import AggregateDiagnostics, DiagnosticsReport, InputProblem
from dp_operators.release.errors import ReleaseInputError
from dp_operators.release.upstream_types import (
    SATURATION,
    UNPUBLISHABLE,
    DropRow,
    InputTypeError,
    key_kind,
    normalise_key,
    read_number,
)
from dp_operators.spec import Aggregate, ReleaseSpec, load_spec

__all__ = ["SATURATION", "KeyDomain", "PreparedInputs", "UngroupedRows", "check_aggregates", "key_domain", "prepare_inputs"]


@dataclass
class PreparedInputs:
    """True aggregates in grid units, per aggregate and component, in release order. Never leaves the engine.

    ``values[(name, component)]`` is a numpy int64 array of shape (partitions,): every grid integer lies within
    +-SATURATION (2^62), so it fits, and a noise value below 2^62 can be added without overflow. ``keys[name]`` is
    the list of partitions (key tuples of ``str``, ``int`` or ``None``) the vectors are aligned with: the public key
    domain, or under partition selection the keys found in the data (sorted), whose ``selection`` vector holds their
    counts of privacy units. A quantile's histograms under partition selection are sparse: ``keys`` holds the
    candidate groups and ``selection`` their units, ``cells`` the positions of the ``count`` values
    (:func:`_prepare_histograms`).
    """

    values: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    keys: dict[str, Sequence[tuple]] = field(default_factory=dict)

    def __repr__(self) -> str:  # raw values must not reach logs through a repr
        return f"PreparedInputs(<{len(self.values)} vectors withheld>)"


def key_domain(aggregate: Aggregate) -> list[tuple]:
    """The public partitions of ``aggregate`` in release order: the product of the key lists (``[()]`` if not
    grouped)."""
    return list(product(*(aggregate.keys[column] for column in aggregate.group_by)))  # type: ignore[index]


class KeyDomain(Sequence):
    """The public partitions of an aggregate in release order (the product of its key lists, last column fastest),
    held as the key lists only: a 10^7-cell domain costs its column lists, not 10^7 tuples.

    ``domain[i]`` is the key tuple of partition ``i``; :meth:`codes` gives, for an array of partition positions,
    each column's index into its key list (mixed-radix digits), for array-at-a-time publication.
    """

    def __init__(self, aggregate: Aggregate) -> None:
        self.columns = [list(aggregate.keys[column]) for column in aggregate.group_by]  # type: ignore[index]
        self._sizes = [len(values) for values in self.columns]
        self._length = math.prod(self._sizes)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(index)
        digits = []
        for size in reversed(self._sizes):
            index, digit = divmod(index, size)
            digits.append(digit)
        return tuple(values[d] for values, d in zip(self.columns, reversed(digits)))

    def __iter__(self):
        return product(*self.columns)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyDomain):
            return self.columns == other.columns
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KeyDomain({' x '.join(map(str, self._sizes)) or '1'} partitions)"

    def codes(self, positions: np.ndarray) -> list[np.ndarray]:
        """Per column, the index into its key list of each partition position (int64 arrays)."""
        digits = []
        rest = np.asarray(positions, dtype=np.int64)
        for size in reversed(self._sizes):
            rest, digit = np.divmod(rest, size)
            digits.append(digit)
        return list(reversed(digits))


def _on_grid(
    value: Fraction, grid: Fraction, low: Fraction | None, high: Fraction | None, *, round_down: bool = False
) -> tuple[int, bool, bool]:
    """``value`` clamped to [low, high], then rounded to the grid once, ``floor(value / grid + 1/2)`` (or
    ``floor(value / grid)`` with ``round_down``), and saturated at +-SATURATION grid units. Returns
    ``(grid units, clamped, saturated)``.

    Clamping into a range whose ends move by at most the per-contribution bound between neighbours is
    1-Lipschitz, so it keeps the sensitivity (docs/mechanisms.md); both roundings map values ``d`` apart to
    integers at most ``ceil(d / grid)`` apart.
    """
    clamped = False
    if low is not None and value < low:
        value, clamped = low, True
    if high is not None and value > high:
        value, clamped = high, True
    units = math.floor(value / grid) if round_down else math.floor(value / grid + Fraction(1, 2))
    saturated = abs(units) >= SATURATION
    return max(-SATURATION, min(SATURATION, units)), clamped, saturated


def _partition_units(aggregate: Aggregate, total: Mapping[str, Fraction], seen: AggregateDiagnostics) -> dict:
    """The grid integers of one partition's exact totals.

    Counts are kept >= 0 and rounded to the nearest integer. Unit counts (``selection``, under partition
    selection) are kept >= 0 and rounded *down*: the threshold's delta bounds the chance that a key held by a
    single privacy unit (unit count 1) is released, P[1 + Z >= threshold]; a non-integer unit count in [1, 2)
    floored stays 1 and keeps that bound, while rounding 1.5 up to 2 would release such a key with P[2 + Z >=
    threshold], above the planned delta. Rounding down never raises a count above its true value.

    Means and variances are centred at m = (lower + upper)/2: the centred sum S - m N is kept in [-h N, h N] and
    the centred sum of squares Q - 2 m S + m^2 N in [0, h^2 N], h the half range — the ranges clipped data always
    satisfy. Out-of-range values are always clamped, never dropped: dropping would move a whole partition when
    float sums of correctly clipped data land a hair outside.
    """
    out: dict[str, int] = {}

    def place(component: str, value: Fraction, grid: Fraction, low: Fraction | None, high: Fraction | None,
              round_down: bool = False) -> None:
        out[component], clamped, saturated = _on_grid(value, grid, low, high, round_down=round_down)
        if clamped:
            seen.clamped[component] += 1
        if saturated:
            seen.saturated[component] += 1

    max_rows = aggregate.upstream.max_rows
    if max_rows is not None and "count" in total and total["count"] > max_rows:
        seen.partitions_over_max_rows += 1
    for component in ("count", "selection"):
        if component in total:
            if total[component].denominator != 1:
                seen.non_integer_counts[component] += 1
            place(component, total[component], Fraction(1), Fraction(0), None, round_down=component == "selection")
    if aggregate.kind == "sum":
        place("sum", total["sum"], aggregate.grid, None, None)
    elif aggregate.kind in ("mean", "variance"):
        lower, upper = aggregate.exact_bounds  # type: ignore[misc]
        middle, half = (lower + upper) / 2, (upper - lower) / 2
        count = Fraction(out["count"])
        place("sum", total["sum"] - middle * count, aggregate.grid, -half * count, half * count)
        if aggregate.kind == "variance":
            centred_squares = total["sum_squares"] - 2 * middle * total["sum"] + middle * middle * count
            place("sum_squares", centred_squares, aggregate.grid**2, Fraction(0), half * half * count)
    return out


def selection_units_field(spec: ReleaseSpec, aggregate: Aggregate) -> str | None:
    """The row field holding a partition's number of distinct privacy units, under partition selection: ``count``
    for a count with one contribution per partition (the same number), else ``units``. For a quantile the
    partitions selected are its groups (the outer ``group_by`` key) and ``units`` is the group's number of units,
    repeated on each of its bins' rows; ``count`` when one unit adds at most one record over all groups
    (``max_partitions_contributed`` and ``max_contributions_per_partition`` both 1): a group's records are then
    its units."""
    if aggregate.public_keys:
        return None
    contribution = spec.contribution_for(aggregate)
    if aggregate.releases_quantiles:  # a group's units: its records when one unit adds at most one record in all
        one = contribution.max_partitions_contributed == 1 and contribution.max_contributions_per_partition == 1
        return "count" if one else "units"
    if aggregate.reads_counts and contribution.max_contributions_per_partition == 1:
        return "count"
    return "units"


def _row_values(aggregate: Aggregate, row: Mapping, units_field: str | None, seen: AggregateDiagnostics) -> dict:
    """The exact values of one row's components (and its unit count under partition selection), not yet rounded:
    rows of one key are added up exactly first, so each partition is rounded once (rounding every row would let
    one privacy unit's rows each carry a rounding step, beyond the planned sensitivity)."""
    fields = [(c, c, "count" if c == "count" else "sum") for c in aggregate.components]
    if units_field not in (None, "count"):
        fields.append(("selection", units_field, "count"))
    values: dict[str, Fraction] = {}
    dropped = False
    for name, field_name, component in fields:  # every field is type-checked, even in a row that is dropped
        try:
            values[name] = read_number(row[field_name], aggregate, field_name, component, seen)
        except DropRow:
            dropped = True
    if dropped:
        raise DropRow
    if units_field == "count":
        values["selection"] = values["count"]
    return values


Refuse = Callable[[int | None, str | None, str], None]

#: The aggregate of nobody, as SQL computes it: ``COUNT`` (and a count of units) 0, ``SUM`` NULL (``None``, which
#: follows the aggregate's ``non_finite`` ``nan`` policy).
EMPTY_UNGROUPED_ROW = {"count": 0, "units": 0, "sum": None, "sum_squares": None}


class UngroupedRows(list):
    """The rows of a tabular source (a query's result, a CSV or Parquet file) for an *ungrouped* aggregate: each
    row a mapping with the aggregate's value columns. They are added up exactly, as rows repeating a key of a
    grouped aggregate are, so one row and two rows (a stray ``GROUP BY``) are read alike; no row is the aggregate
    of nobody (:data:`EMPTY_UNGROUPED_ROW`). Decided by this type, never by the number of rows."""


def _key_type_mismatch(column: str, found: type, declared: set[type], bins: bool = False) -> str:
    if bins:  # a quantile's histogram column: its labels are the spec's integers
        return (f"histogram column {column!r} holds {found.__name__} labels but the bins are labelled by integers "
                "(their lower edges, or 1..m with label: index), so no row could match; cast the column to int "
                "upstream")
    if found is int:
        fix = ("cast the column to str upstream (zero-padded where the spec's keys are, e.g. pandas "
               ".astype(str).str.zfill(5)), or list the spec's keys as integers")
    else:
        fix = "cast the column to int upstream, or quote the spec's keys"
    listed = " and ".join(sorted(t.__name__ for t in declared))
    return (f"key column {column!r} holds {found.__name__} keys but the spec's public domain lists only {listed} "
            f"values, so no row could match; {fix}")


def _read_aggregate(
    spec: ReleaseSpec, aggregate: Aggregate, raw: Any, prepared: PreparedInputs, seen: AggregateDiagnostics,
    refuse: Refuse,
) -> None:
    """Read one aggregate's upstream value into ``prepared`` (shapes: :func:`prepare_inputs`). A problem goes to
    ``refuse(row index, field, message)``, which raises (a release) or records it and goes on (a check)."""
    components = list(aggregate.components)
    units_field = selection_units_field(spec, aggregate)
    grouped = bool(aggregate.group_by)
    needed = aggregate.group_by + components + ([units_field] if units_field not in (None, "count") else [])
    tabular = isinstance(raw, UngroupedRows)
    if columns.is_table(raw):
        refusal = columns.table_refusal(aggregate, raw.schema, needed[len(aggregate.group_by):])
        if refusal is not None:  # by the schema, before any row: an empty table is refused as a full one is
            refuse(None, *refusal)
            return
        if grouped and columns.columnar_eligible(units_field, aggregate, raw.schema):
            prepared.keys[aggregate.name], vectors = columns.read_table(aggregate, raw, seen, KeyDomain)
            for component in components:
                prepared.values[(aggregate.name, component)] = vectors[component]
            return
        raw = raw.to_pylist()  # the row-by-row reader: floats, wide decimals, other key types, means, selection
        tabular = True
    if grouped or tabular:
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            hint = (
                "; convert it with .reset_index().to_dict('records') (keep int sums int: the nullable Int64 dtype or "
                "astype('int64') after fillna) and return it wrapped in aggregates_for_xcom(...) if it may hold "
                "NaN or inf (dp_operators.operators.xcom_aggregates; XCom refuses them), or better write it to "
                "Parquet and return its URI" if type(raw).__name__ == "DataFrame" else ""
            )
            refuse(None, None, f"expected a list of rows with columns {needed}, got {type(raw).__name__}{hint}")
            return
        rows = raw if raw else ([] if grouped else [dict(EMPTY_UNGROUPED_ROW)])
    elif len(components) > 1:
        if not isinstance(raw, Mapping):
            fields = ", ".join(f"'{c}': number" for c in components)
            refuse(None, None, f"a {aggregate.kind} expects {{{fields}}}, got {type(raw).__name__}")
            return
        rows = [raw]
    else:
        rows = [{components[0]: raw}]
    fields = components + (["selection"] if units_field is not None else [])
    totals: dict[tuple, dict[str, Fraction]] = {}
    if aggregate.public_keys:
        for key in key_domain(aggregate):
            totals[tuple(str(v) for v in key)] = dict.fromkeys(fields, Fraction(0))
    # the key types (str, int) each column's public domain lists: a key of another type can never match, and
    # would otherwise be dropped silently (zip codes read as int lose their leading zeros: 2139 is not '02139')
    domain_types = {c: {type(v) for v in aggregate.keys[c]} for c in aggregate.group_by} if aggregate.public_keys else {}
    # a quantile's groups found in the data: its bins stay public (their labels), its groups are selected
    grouped_histogram = aggregate.releases_quantiles and not aggregate.public_keys
    bin_labels: dict[str, int] = {}
    if grouped_histogram:
        bin_labels = {str(label): i for i, label in enumerate(aggregate.bins.labels)}  # type: ignore[union-attr]
        domain_types = {aggregate.group_by[-1]: {int}}
    found: set[tuple] = set()
    histograms: dict[tuple, dict[str, Any]] = {}
    for row_number, row in enumerate(rows):
        seen.rows += 1
        index = row_number if grouped else None
        prefix = "a row's " if grouped else ""
        if not isinstance(row, Mapping):
            refuse(index, None, f"a row is a {type(row).__name__}; give a mapping with columns {needed}")
            continue
        absent = [c for c in needed if c not in row]
        if absent:
            refuse(index, None, f"{'a row is' if grouped else 'the value is'} missing field(s) {absent}"
                   + (_units_hint(spec, aggregate) if "units" in absent else ""))
            continue
        try:
            key = tuple(normalise_key(row[c], c) for c in aggregate.group_by)
            for column in domain_types:
                kind = key_kind(row[column])  # by the type alone, so a refusal never depends on the value
                if kind is not None and kind not in domain_types[column]:
                    histogram = aggregate.releases_quantiles and column == aggregate.group_by[-1]
                    raise InputTypeError(column, _key_type_mismatch(column, kind, domain_types[column], histogram))
            if aggregate.releases_quantiles:
                key = into_end_bins(aggregate, key, seen)
            publishable = UNPUBLISHABLE not in key
            if grouped_histogram:  # every row of a group makes it a candidate, in a bin or not (its units)
                inside = publishable
            else:
                inside = publishable and (
                    not aggregate.public_keys or (None not in key and tuple(str(v) for v in key) in totals)
                )
            # values of rows outside the domain are type-checked too, but neither counted nor added
            values = _row_values(aggregate, row, units_field, seen if inside else AggregateDiagnostics())
        except InputTypeError as problem:
            refuse(index, problem.field, prefix + str(problem))
            continue
        except DropRow:
            if inside:
                seen.rows_dropped += 1
                continue
        if not publishable:
            seen.rows_unpublishable_key += 1
            continue
        if not inside:
            seen.outside_domain(key)
            continue
        if grouped_histogram:
            index = bin_labels.get(str(key[-1])) if key[-1] is not None else None
            if index is None:  # no bin's label: its group is a candidate (its units count), its record is in no bin
                seen.outside_domain(key)
            else:
                found.add(key)
            _add_to_histogram(histograms, key[:-1], index, values, units_field == "count")
            continue
        if aggregate.public_keys:
            key = tuple(str(v) for v in key)
        found.add(key)
        slot = totals.setdefault(key, dict.fromkeys(fields, Fraction(0)))
        for field_name, value in values.items():
            slot[field_name] += value
    seen.partitions = len(found)
    if grouped_histogram:
        _prepare_histograms(aggregate, histograms, prepared, seen)
        return
    if aggregate.public_keys:
        prepared.keys[aggregate.name] = KeyDomain(aggregate)
        ordered = [_partition_units(aggregate, total, seen) for total in totals.values()]
    else:
        order = sorted(totals, key=lambda k: tuple((type(v).__name__, v) for v in k))
        prepared.keys[aggregate.name] = order
        ordered = [_partition_units(aggregate, totals[k], seen) for k in order]
        prepared.values[(aggregate.name, "selection")] = np.array([slot["selection"] for slot in ordered],
                                                                   dtype=np.int64)
    for component in components:
        prepared.values[(aggregate.name, component)] = np.array([slot[component] for slot in ordered],
                                                                dtype=np.int64)


def _units_hint(spec: ReleaseSpec, aggregate: Aggregate) -> str:
    """What ``units`` is and why it is needed (partition selection; public parameters only)."""
    contribution = spec.contribution_for(aggregate)
    bounds = (f"max_partitions_contributed {contribution.max_partitions_contributed}, "
              f"max_contributions_per_partition {contribution.max_contributions_per_partition}")
    if aggregate.releases_quantiles:
        return (f": under partition_selection each row carries 'units', its group's number of distinct privacy units "
                f"(the same on every row of the group, over the same records as the counts), since one unit may add "
                f"more than one record ({bounds}); e.g. join COUNT(DISTINCT unit) ... GROUP BY "
                f"{', '.join(aggregate.outer_group_by)}")
    return (f": under partition_selection each row carries 'units', the number of distinct privacy units with its "
            f"key, since one unit may add more than one record to a key ({bounds})")


def into_end_bins(aggregate: Aggregate, key: tuple, seen: AggregateDiagnostics) -> tuple:
    """``key`` of a quantile's histogram row with an integer bin label below the first bin's label read as the first
    bin's, and one above the last's as the last's (``seen.labels_beyond_bins`` counts them): a value beyond the
    edges is counted in the end bin, as the raw-row bounding does and as ``width_bucket``'s 0 and m + 1 mean. A
    function of each row's own label, so one record still moves one bin's count by one. Labels between the first
    and last that are no bin's (a ``lower_edge`` label off the edges) stay outside the histogram."""
    label = key[-1]
    if type(label) is not int:
        return key
    labels = aggregate.bins.labels  # type: ignore[union-attr]
    if labels[0] <= label <= labels[-1]:
        return key
    seen.labels_beyond_bins += 1
    return (*key[:-1], labels[0] if label < labels[0] else labels[-1])


def _add_to_histogram(histograms: dict[tuple, dict[str, Any]], group: tuple, index: int | None,
                      values: Mapping[str, Fraction], units_are_records: bool) -> None:
    """Add one row of a quantile's histogram under partition selection to its ``group`` (the key without its bin):
    the count of bin ``index`` (None: a label that is no bin's, counted in none), and the group's units: the sum of
    its records when they are its units, else the largest ``units`` of its rows (each row repeats the group's
    number; the largest of equal numbers is that number, and rows repeating a cell do not add it twice). Every row
    counts towards its group's units, in a bin or not: were a row outside the bins to make no candidate, one unit's
    record in a bin could turn a group of many units outside the bins into a candidate (docs/adr/0037)."""
    held = histograms.setdefault(group, {"counts": {}, "selection": Fraction(0), "seen_units": set()})
    if index is not None:
        held["counts"][index] = held["counts"].get(index, Fraction(0)) + values["count"]
    if units_are_records:
        held["selection"] += values["selection"]
    else:
        held["selection"] = max(held["selection"], values["selection"])
        held["seen_units"].add(values["selection"])


def _prepare_histograms(aggregate: Aggregate, histograms: Mapping[tuple, Mapping[str, Any]],
                        prepared: PreparedInputs, seen: AggregateDiagnostics) -> None:
    """The vectors of a quantile's histograms under partition selection, sparse until the groups are selected: the
    candidate groups found in the data (``keys``, sorted as any selected keys are) with their units
    (``selection``, shape (G,)), and the bins that have rows: ``cells`` their positions ``g * m + i`` (ascending),
    ``count`` their counts, read onto the grid as every count is (:func:`_partition_units`). A bin with no row is
    0 (:func:`~dp_operators.release.run.select_groups` fills the kept groups' histograms). The work is one step per
    row and per group, not per bin of every candidate: the m bins of a group that is not kept cost nothing."""
    m = len(aggregate.bins.labels)  # type: ignore[union-attr]
    order = sorted(histograms, key=lambda k: tuple((type(v).__name__, v) for v in k))
    cells: list[int] = []
    counts: list[int] = []
    units: list[int] = []
    for position, group in enumerate(order):
        held = histograms[group]
        seen.groups_with_differing_units += len(held["seen_units"]) > 1
        units.append(_partition_units(aggregate, {"selection": held["selection"]}, seen)["selection"])
        for index in sorted(held["counts"]):
            cells.append(position * m + index)
            counts.append(_partition_units(aggregate, {"count": held["counts"][index]}, seen)["count"])
    prepared.keys[aggregate.name] = order
    prepared.values[(aggregate.name, "selection")] = np.array(units, dtype=np.int64)
    prepared.values[(aggregate.name, "cells")] = np.array(cells, dtype=np.int64)
    prepared.values[(aggregate.name, "count")] = np.array(counts, dtype=np.int64)


def _read(spec: ReleaseSpec, aggregates: Any, report: DiagnosticsReport, *, strict: bool) -> PreparedInputs:
    """Shared by :func:`prepare_inputs` (``strict``: raise at the first problem) and :func:`check_aggregates`
    (record every problem with its row index, skip the row, go on)."""

    def refuser(aggregate: str | None) -> Refuse:
        def refuse(row: int | None, field_name: str | None, message: str) -> None:
            report.add_problem(InputProblem(aggregate, row, field_name, message))
            if strict:  # the row index stays in the report: it is data-derived (the number of rows before it)
                raise ReleaseInputError(f"aggregate {aggregate!r}: {message}" if aggregate else message) from None

        return refuse

    prepared = PreparedInputs()
    if not isinstance(aggregates, Mapping):
        refuser(None)(None, None, "the upstream aggregates must be a mapping of aggregate name to value, got "
                      f"{type(aggregates).__name__}")
        return prepared
    names = {a.name for a in spec.aggregates}
    report.unused_aggregates = sorted(str(name) for name in aggregates if name not in names)
    missing = [a.name for a in spec.aggregates if a.name not in aggregates]
    if missing:  # names from the spec only: the upstream's own names stay in the report
        refuser(None)(None, None, f"the upstream task did not provide {missing}; return a mapping with one entry "
                      "per aggregate in the spec")
    for aggregate in spec.aggregates:
        if aggregate.name in aggregates:
            _read_aggregate(spec, aggregate, aggregates[aggregate.name], prepared, report.aggregate(aggregate.name),
                            refuser(aggregate.name))
    return prepared


def prepare_inputs(
    spec: ReleaseSpec, aggregates: Mapping[str, Any], *, diagnostics: DiagnosticsReport | None = None
) -> PreparedInputs:
    """Check the shape and types of the upstream aggregates and read them onto each aggregate's grid.

    Shapes (JSON-friendly, as an upstream ``@task`` returns them):

    * ungrouped count or sum: a number; ungrouped mean ``{"sum", "count"}``; variance ``{"sum", "count",
      "sum_squares"}`` (of the clipped values);
    * grouped: a list of rows, each a mapping with every ``group_by`` column and the fields above (``count``,
      ``sum``, ``sum_squares`` as the kind needs). Rows repeating a key are added up. A public key with no row is
      a true 0; a row outside the public domain (a NULL key included) is ignored (never published). Under
      partition selection each row also carries ``units``, its number of distinct privacy units (not needed for a
      count with one contribution per partition: the count is that number).

    Types: keys are normalised to ``str``, ``int`` or ``None`` and values read exactly, or refused by their type
    (table in :mod:`dp_operators.release.upstream_types`). Binary float sums are refused unless the aggregate
    declares ``upstream: {arithmetic: binary64}``; float counts are read as their exact binary value.

    Data values never raise: NaN, inf and ``None`` follow ``non_finite``; rows of one key are added up exactly and
    each partition total is rounded to the grid once (counts to the nearest integer, unit counts down), clamped
    into the range clipped data satisfy, and saturated at +-SATURATION grid units. ``non_finite`` replacement and
    dropping avoid crashes; they are not part of the DP guarantee, which assumes the upstream values are the
    clipped aggregates the spec declares.

    Args:
        spec: the release spec.
        aggregates: the upstream mapping of aggregate name to value.
        diagnostics: a report to fill with exact, data-derived counts (rows outside the domain, special values,
            clamped and saturated partitions, the row index of a problem). Never logged; see
            :class:`~dp_operators.release.diagnostics.DiagnosticsReport`.

    Raises:
        ReleaseInputError: a missing aggregate, a wrong shape or a refused type; the message names the aggregate,
            the field and the type found, never a value or a row index (those are in ``diagnostics``).
    """
    report = diagnostics if diagnostics is not None else DiagnosticsReport(spec.release)
    return _read(spec, aggregates, report, strict=True)


def check_aggregates(spec: ReleaseSpec | str | os.PathLike, aggregates: Any) -> DiagnosticsReport:
    """Check aggregates against ``spec`` in the upstream task, before returning them: no ledger, no budget, no
    noise, and no exception for any data value or shape.

    ``spec`` is a loaded :class:`~dp_operators.spec.ReleaseSpec` or the path of its YAML file (loaded with
    :func:`~dp_operators.spec.load_spec`, which raises :class:`~dp_operators.spec.SpecError` for a bad spec).

    Returns a :class:`~dp_operators.release.diagnostics.DiagnosticsReport` with every shape or type problem the
    release would refuse (``report.ok`` is False; each problem with its row index) and the data-quality counts of
    :func:`prepare_inputs` (rows outside the public key domain with examples, NaN/None/infinite values handled per
    policy and field, binary floats read, non-integer counts rounded, partitions clamped or saturated).

    The report holds exact, data-derived numbers: keep it where the true aggregates are kept, for the people who
    may already see them; never log it, publish it or return it through XCom (docs/adr/0016).

    Example (in the upstream ``@task``; the report goes next to the aggregates, the log gets no number)::

        report = check_aggregates(load_spec(SPEC), aggregates)
        (folder / "aggregates.diagnostics.json").write_text(json.dumps(report.as_dict()))
        if not report.ok:
            raise ValueError("the aggregates do not match the spec: see aggregates.diagnostics.json")
    """
    if isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    report = DiagnosticsReport(spec.release)
    _read(spec, aggregates, report, strict=False)
    return report
