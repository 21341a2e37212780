"""Generalisation hierarchies for quasi-identifiers, and their encoding for full-domain generalisation.

A *full-domain* generalisation hierarchy gives every value of a quasi-identifier one label at each level
``0..height``: level 0 is the value itself (as text), each higher level a coarser label, and generalisation is a
function (two values with the same label at level ``i`` share their labels at every level above ``i``). Full-domain
generalisation (Samarati, "Protecting Respondents' Identities in Microdata Release", IEEE TKDE 2001; LeFevre,
DeWitt, Ramakrishnan, "Incognito", SIGMOD 2005) replaces every value of a column by its label at one chosen level;
the lattice search picks one level per quasi-identifier.

Three ways to declare one (:class:`GeneralisationHierarchy`):

- a table, as ARX writes it (Prasser, Kohlmayer, "Putting Statistical Disclosure Control into Practice: The ARX
  Data Anonymization Tool", 2015): one row per value, one column per level, usually ``*`` in the last column
  (:meth:`~GeneralisationHierarchy.from_arx_csv`, :meth:`~GeneralisationHierarchy.from_rows`);
- a tree of nested mappings whose innermost lists are the values (:meth:`~GeneralisationHierarchy.from_tree`);
- nested numeric intervals, e.g. age in 5-, 10- and 20-year bands, then ``*`` (
  :meth:`~GeneralisationHierarchy.intervals`).

A quasi-identifier without a declared hierarchy gets :meth:`~GeneralisationHierarchy.flat` (the value, then ``*``).
:meth:`~GeneralisationHierarchy.encode` turns a column into the
:class:`~dp_operators.anonymity.encoding.EncodedQuasiIdentifier` the lattice search and loss metrics read.

Errors never quote values (of the table or of a hierarchy's first column: they may be personal data); they give the
file and line, the column, and counts.
"""

from __future__ import annotations

import csv
import decimal
import fractions
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from dp_operators.anonymity.columns import QIKind, numeric_values, qi_kind
from dp_operators.anonymity.encoding import EncodedQuasiIdentifier
from dp_operators.anonymity.errors import AnonymityInputError, AnonymitySpecError
from dp_operators.anonymity.measures import check_columns

if TYPE_CHECKING:
    from dp_operators.anonymity.spec import AnonymitySpec

#: The label of the top level of interval and flat hierarchies (ARX's convention for "any value").
TOP = "*"

HierarchyKind = Literal["table", "intervals", "flat"]

#: Turns a row's number into its place in messages (``line 7``, ``value #7``).
_Where = Callable[[int], str]

# Interval bands are numbered with int64 from floats: beyond 2**52 bands the float quotient no longer separates them.
_MAX_BANDS = 2.0**52
# Every integer of smaller magnitude is exact in float64.
_EXACT_INTEGERS = 2.0**53


@dataclass(frozen=True)
class GeneralisationHierarchy:
    """A full-domain generalisation hierarchy for one quasi-identifier.

    Build one with :meth:`from_arx_csv`, :meth:`from_rows`, :meth:`from_tree`, :meth:`intervals` or :meth:`flat`
    (the constructors validate; the fields below are their output).

    Attributes:
        kind: ``"table"`` (from rows or a tree: an explicit label per value and level), ``"intervals"`` (numeric
            bands) or ``"flat"`` (the value, then ``*``).
        height: the highest level; the hierarchy has ``height + 1`` levels, level 0 being the value itself.
        source: where it was declared (the file path, ``"<rows>"``, ``"tree"``), for messages.
        values: ``"table"`` only: the level-0 labels (the values the hierarchy covers), one per row of the table,
            shape ``(v,)``; empty for the other kinds (they cover every value).
        level_labels: ``"table"`` only: ``level_labels[i - 1]`` = the distinct labels at level ``i`` (``1 <= i <=
            height``), in order of first appearance.
        level_index: ``"table"`` only: ``level_index[i - 1][j]`` = index in ``level_labels[i - 1]`` of the level-``i``
            label of ``values[j]``, shape ``(v,)`` per level.
        widths: ``"intervals"`` only: the band widths of levels ``1..height - 1``, strictly increasing, each a whole
            multiple of the previous; level ``height`` is ``*``.
        origin: ``"intervals"`` only: a band boundary; the bands of width ``w`` are ``[origin + j w, origin + (j + 1)
            w)`` for every integer ``j``.
    """

    kind: HierarchyKind
    height: int
    source: str = field(default="", compare=False)
    values: tuple[str, ...] = field(default=(), repr=False)
    level_labels: tuple[tuple[str, ...], ...] = field(default=(), repr=False)
    level_index: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    widths: tuple[float, ...] = ()
    origin: float = 0.0

    # -- constructors ---------------------------------------------------------------------------------------------

    @classmethod
    def from_arx_csv(cls, path: str | Path, separator: str = ";") -> GeneralisationHierarchy:
        """Read a hierarchy in ARX's CSV format: one row per value, one column per level (level 0 first).

        ARX writes ``;``-separated files without a header, e.g. ``Bachelors;Undergraduate;Higher education;*``.
        Cells are read as text (UTF-8, a byte-order mark is ignored); blank lines are skipped.

        Args:
            path: the CSV file.
            separator: the one-character field separator.

        Raises:
            AnonymitySpecError: ``<path>: line N: <reason>`` for an unreadable file, an empty file, a file with one
                column (wrong separator?), rows of different lengths, empty cells, a value listed twice, or a label
                that generalises to two different labels at the next level.
        """
        path = Path(path)
        if not isinstance(separator, str) or len(separator) != 1:
            raise AnonymitySpecError(f"{path}: the separator must be one character, got {separator!r}")
        numbered: list[tuple[int, list[str]]] = []
        try:
            with path.open(encoding="utf-8-sig", newline="") as handle:
                reader = csv.reader(handle, delimiter=separator, strict=True)
                for row in reader:
                    if row:
                        numbered.append((reader.line_num, row))
        except OSError as exc:
            raise AnonymitySpecError(f"{path}: cannot read the hierarchy file: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise AnonymitySpecError(f"{path}: the hierarchy file is not UTF-8 text ({exc.reason})") from exc
        except csv.Error as exc:
            raise AnonymitySpecError(f"{path}: line {reader.line_num}: malformed CSV ({exc})") from exc
        return cls._from_table(numbered, str(path), lambda line: f"line {line}")

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[object]], source: str = "<rows>") -> GeneralisationHierarchy:
        """The hierarchy of an in-memory table: ``rows[j]`` = the labels of one value at levels ``0..height``.

        Cells are compared as text (``39`` and ``39.0`` both read ``"39"``). Row ``j`` is reported as line ``j + 1``.

        Raises:
            AnonymitySpecError: as :meth:`from_arx_csv`, with ``source`` in place of the file.
        """
        numbered = [(i + 1, ["" if cell is None else value_text(cell) for cell in row]) for i, row in enumerate(rows)]
        return cls._from_table(numbered, source, lambda line: f"line {line}")

    @classmethod
    def from_tree(cls, tree: Mapping[object, object], source: str = "tree") -> GeneralisationHierarchy:
        """The hierarchy of a tree of nested mappings whose innermost lists are the values.

        ``{"*": {"Undergraduate": ["Bachelors", "Some-college"], "Graduate": ["Masters", "Doctorate"]}}`` has
        height 2: ``Bachelors`` -> ``Undergraduate`` -> ``*``. The top keys form the top level as written: a mapping
        with several top keys gets no implicit ``*`` (unlike the sensitive-attribute hierarchies of
        :class:`~dp_operators.anonymity.hierarchy.ValueHierarchy`), since full-domain levels are never added
        silently. Every value must sit at the same depth.

        Raises:
            AnonymitySpecError: the tree is not a mapping, a node has no children or children of the wrong type,
                values sit at different depths (the message counts the values at each depth), a value appears twice,
                or a label generalises to two different labels at the next level. Values are numbered in
                depth-first order (``value #N``) in messages.
        """
        if not isinstance(tree, Mapping) or not tree:
            raise AnonymitySpecError(
                f"{source}: expected a non-empty mapping of top-level labels to subtrees, innermost lists holding "
                "the values"
            )
        paths: list[tuple[str, ...]] = []  # for each value: (value, parent, ..., top label)

        def walk(ancestors: tuple[str, ...], subtree: object) -> None:
            depth = len(ancestors)
            if isinstance(subtree, Mapping):
                if not subtree:
                    raise AnonymitySpecError(f"{source}: a node at depth {depth} has no children")
                for label, children in subtree.items():
                    if isinstance(label, (Mapping, list, tuple)):
                        raise AnonymitySpecError(f"{source}: a node at depth {depth} has a label that is not text")
                    walk((value_text(label), *ancestors), children)
            elif isinstance(subtree, Sequence) and not isinstance(subtree, str):
                if not subtree:
                    raise AnonymitySpecError(f"{source}: a node at depth {depth} has no values (an empty list)")
                for value in subtree:
                    if value is None or isinstance(value, (Mapping, list, tuple)):
                        raise AnonymitySpecError(
                            f"{source}: a list at depth {depth} holds something other than values; a value is text "
                            "or a number, and a subtree is a mapping"
                        )
                    paths.append((value_text(value), *ancestors))
            else:
                raise AnonymitySpecError(
                    f"{source}: a node at depth {depth} has children that are neither a mapping nor a list of values "
                    "(a single value still needs a list: [value])"
                )

        walk((), tree)
        depths: dict[int, int] = {}
        for path in paths:
            depths[len(path) - 1] = depths.get(len(path) - 1, 0) + 1
        if len(depths) > 1:
            counts = ", ".join(f"{count} value(s) at depth {depth}" for depth, count in sorted(depths.items()))
            raise AnonymitySpecError(
                f"{source}: values sit at different depths ({counts}); full-domain generalisation needs a label at "
                "every level for every value: put every value at the same depth (repeat a label to lengthen a "
                "short branch)"
            )
        numbered = [(i + 1, list(path)) for i, path in enumerate(paths)]
        return cls._from_table(numbered, source, lambda number: f"value #{number} (depth-first order)")

    @classmethod
    def intervals(cls, widths: Sequence[float], origin: float = 0) -> GeneralisationHierarchy:
        """Nested numeric bands, then ``*``: ``widths=[5, 10, 20]`` gives age -> 5-year band -> 10-year band ->
        20-year band -> ``*`` (height 4).

        Level ``i`` (``1 <= i <= len(widths)``) puts a value ``x`` in the band ``[origin + j w, origin + (j + 1) w)``
        with ``w = widths[i - 1]`` and ``j = floor((x - origin) / w)``, labelled like ``[20, 25)``. Bands cover the
        whole line; since each width is a whole multiple of the previous one, every band lies inside one band of the
        next level (the levels nest). A value is placed in its finest band once, and coarser bands are whole groups
        of finest bands, so the levels nest exactly.

        Band edges are exact decimals: ``origin + j * m * w1`` computed in decimal from the shortest round-trip text
        of ``origin`` and of the finest width ``w1`` (``0.1 * 3`` is ``0.3``, not ``0.30000000000000004``), printed
        without ``.0`` when integral and as the float's shortest round-trip text otherwise (``1e-13``), so distinct
        bands always get distinct labels. A value is compared with the edges as the decimal it prints as at level 0
        (:func:`value_text`): a value within float rounding of an edge counts as on it exactly when its text is the
        edge's (``0.3`` lies in ``[0.3, 0.4)`` for width ``0.1``, although ``0.3 / 0.1 < 3`` in floats), and every
        label covers the printed values it generalises.

        Raises:
            AnonymitySpecError: no widths, a width or the origin that is a boolean, not finite, or (widths) not
                positive, widths not strictly increasing, or a width that is not a whole multiple of the previous.
        """
        if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or not widths:
            raise AnonymitySpecError("interval widths: give a non-empty list of band widths, e.g. [5, 10, 20]")
        checked: list[float] = []
        for position, width in enumerate(widths):
            if isinstance(width, bool) or not isinstance(width, Real):
                raise AnonymitySpecError(f"interval width {position}: must be a number, got {type(width).__name__}")
            width = float(width)
            if not math.isfinite(width) or width <= 0:
                raise AnonymitySpecError(f"interval width {position}: must be a positive finite number, got {width}")
            if checked:
                previous = checked[-1]
                ratio = width / previous
                if ratio <= 1:
                    raise AnonymitySpecError(
                        f"interval width {position}: {value_text(width)} is not larger than the previous width "
                        f"{value_text(previous)}; widths must be strictly increasing, each a whole multiple (at "
                        f"least 2 times) of the previous, e.g. {value_text(previous)}, {value_text(2 * previous)}"
                    )
                if width / checked[0] > _MAX_BANDS:
                    raise AnonymitySpecError(
                        f"interval width {position}: {width:g} is more than 2**52 times the finest width "
                        f"{checked[0]:g}; bands are counted in finest bands, which a 64-bit float counts "
                        "exactly only up to 2**52 (beyond, 'whole multiple' has no meaning); use a larger finest "
                        "width or drop this level (the top level * already covers every value)"
                    )
                if abs(ratio - round(ratio)) > 1e-9 * ratio:
                    below, above = math.floor(ratio) * previous, math.ceil(ratio) * previous
                    raise AnonymitySpecError(
                        f"interval width {position}: {value_text(width)} is not a whole multiple of the previous "
                        f"width {value_text(previous)} (e.g. {value_text(below)} or {value_text(above)}), so its "
                        "bands would not each lie inside one band of the next level; make it a whole multiple"
                    )
            checked.append(width)
        if isinstance(origin, bool) or not isinstance(origin, Real) or not math.isfinite(float(origin)):
            raise AnonymitySpecError(f"interval origin: must be a finite number, got {origin!r}")
        return cls(
            kind="intervals", height=len(checked) + 1, source="intervals", widths=tuple(checked), origin=float(origin)
        )

    @classmethod
    def flat(cls) -> GeneralisationHierarchy:
        """Two levels: the value, then ``*`` (the default for a quasi-identifier without a declared hierarchy:
        keep it or suppress it)."""
        return cls(kind="flat", height=1, source="flat")

    @classmethod
    def _from_table(
        cls, numbered: list[tuple[int, list[str]]], source: str, where: _Where
    ) -> GeneralisationHierarchy:
        """Validate the rows (each with its line number) and build a ``"table"`` hierarchy."""
        if not numbered:
            raise AnonymitySpecError(f"{source}: the hierarchy is empty; give one row per value, one column per level")
        first_line, first_row = numbered[0]
        width = len(first_row)
        if width < 2:
            raise AnonymitySpecError(
                f"{source}: {where(first_line)}: only one column; a hierarchy needs the value and at least one "
                "generalisation level (check the separator)"
            )
        for line, row in numbered:
            if len(row) != width:
                raise AnonymitySpecError(
                    f"{source}: {where(line)}: {len(row)} columns, but {where(first_line)} has {width}; every value "
                    "needs a label at every level"
                )
            for column, cell in enumerate(row):
                if not cell.strip():
                    raise AnonymitySpecError(
                        f"{source}: {where(line)}: column {column + 1} (level {column}) is empty; every value needs a "
                        "label at every level"
                    )
        seen: dict[str, int] = {}
        for line, row in numbered:
            first = seen.setdefault(row[0], line)
            if first != line:
                raise AnonymitySpecError(
                    f"{source}: {where(line)}: the value in column 1 is listed again (first on {where(first)}); "
                    "list each value once"
                )
        labels: list[tuple[str, ...]] = []
        index: list[tuple[int, ...]] = []
        for level in range(1, width):
            parent_of: dict[str, tuple[str, int]] = {}  # level label -> (its label one level up, first line)
            codes: dict[str, int] = {}
            for line, row in numbered:
                label = row[level]
                codes.setdefault(label, len(codes))
                if level + 1 < width:
                    parent, first = parent_of.setdefault(label, (row[level + 1], line))
                    if parent != row[level + 1]:
                        raise AnonymitySpecError(
                            f"{source}: {where(line)}: the level-{level} label (column {level + 1}) generalises to a "
                            f"different level-{level + 1} label than on {where(first)}; generalisation must be a "
                            "function: give that label one parent, or rename one of them"
                        )
            labels.append(tuple(codes))
            index.append(tuple(codes[row[level]] for _, row in numbered))
        return cls(
            kind="table",
            height=width - 1,
            source=source,
            values=tuple(row[0] for _, row in numbered),
            level_labels=tuple(labels),
            level_index=tuple(index),
        )

    # -- use ------------------------------------------------------------------------------------------------------

    @cached_property
    def _value_positions(self) -> dict[str, int]:
        return {value: position for position, value in enumerate(self.values)}

    @cached_property
    def _level_index_arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(np.asarray(codes, dtype=np.int64) for codes in self.level_index)

    def generalise(self, value: object, level: int) -> str:
        """The label of one value at ``level`` (numbers are treated as numeric, anything else as categorical).

        Raises:
            ValueError: ``level`` is outside ``[0, height]``.
            AnonymityInputError: the value is not covered (see :meth:`encode`).
        """
        if not 0 <= level <= self.height:
            raise ValueError(f"level must be in [0, {self.height}], got {level}")
        numeric = isinstance(value, Real) and not isinstance(value, bool)
        encoded = self.encode(pd.Series([value], name="value"), "numeric" if numeric else "categorical")
        return encoded.labels[level][0]

    def encode(self, column: pd.Series, kind: QIKind) -> EncodedQuasiIdentifier:
        """Encode a quasi-identifier column at every level of this hierarchy.

        Values are matched to the hierarchy's level-0 labels as text (a numeric column's ``39.0`` matches ``"39"``).
        The domain is the set of distinct values present in the column: numeric columns in increasing order,
        categorical ones in the hierarchy's row order (sorted text for a flat hierarchy). Every level of the
        hierarchy is kept, even one that merges nothing in this column (the lattice needs the declared levels).

        Args:
            column: the QI column, shape ``(n,)``, without missing values (see
                :func:`~dp_operators.anonymity.measures.check_columns`); its ``name`` names it.
            kind: ``"numeric"`` (spans are the covered value range over the column's range) or ``"categorical"``
                (spans are leaf counts over the domain size), as :func:`~dp_operators.anonymity.columns.qi_kind`
                decides.

        Returns:
            The column's :class:`~dp_operators.anonymity.encoding.EncodedQuasiIdentifier` (``height + 1`` levels,
            int32 codes), which passes its ``validate()``.

        Raises:
            AnonymityInputError: values not covered by the hierarchy (the message counts the distinct values and
                rows, without quoting them); an interval hierarchy on a categorical column; ``kind="numeric"`` on a
                column that is not numeric or holds infinite values.
        """
        name = str(column.name)
        if kind not in ("numeric", "categorical"):
            raise ValueError(f"kind must be 'numeric' or 'categorical', got {kind!r}")
        if self.kind == "intervals" and kind != "numeric":
            raise AnonymityInputError(
                f"quasi-identifier {name!r} has an interval hierarchy but is categorical; declare it type: numeric "
                "(if it holds numbers) or give a hierarchy file or tree instead"
            )
        codes0, texts, numbers = _domain(column, kind, name)
        domain_size = len(texts)

        if self.kind == "table":
            codes0, texts, numbers, positions = self._match(codes0, texts, numbers, kind, name)
            parents = [(index[positions], self.level_labels[i]) for i, index in enumerate(self._level_index_arrays)]
            upper = [_present_labels(index, labels) for index, labels in parents]
        elif self.kind == "intervals":
            assert numbers is not None
            try:
                upper = self._bands(numbers, name)
            except (OverflowError, decimal.InvalidOperation, decimal.Inexact) as exc:
                raise AnonymityInputError(
                    f"quasi-identifier {name!r}: its interval hierarchy ({self.source}) has band widths or an origin "
                    "too far apart to number the bands exactly; build it with GeneralisationHierarchy.intervals "
                    "(which refuses such widths) and use widths at most 2**52 times the finest"
                ) from exc
        else:
            if kind == "categorical":
                codes0, texts = _sorted_domain(codes0, texts)
            upper = [(np.zeros(domain_size, dtype=np.int64), (TOP,))]

        codes = [codes0.astype(np.int32)]
        labels = [tuple(texts)]
        leaf_counts = [np.ones(domain_size, dtype=np.int64)]
        spans = [np.zeros(domain_size, dtype=np.float64)]
        column_range = float(numbers.max() - numbers.min()) if numbers is not None and domain_size else 0.0
        for domain_to_label, level_labels in upper:
            m = len(level_labels)
            counts = np.bincount(domain_to_label, minlength=m).astype(np.int64)
            codes.append(domain_to_label.astype(np.int32)[codes0])
            labels.append(level_labels)
            leaf_counts.append(counts)
            if kind == "numeric":
                assert numbers is not None
                low = np.full(m, np.inf)
                high = np.full(m, -np.inf)
                np.minimum.at(low, domain_to_label, numbers)
                np.maximum.at(high, domain_to_label, numbers)
                span = (high - low) / column_range if column_range > 0 else np.zeros(m)
            else:
                span = np.where(counts > 1, counts / max(domain_size, 1), 0.0)
            spans.append(span.astype(np.float64))
        return EncodedQuasiIdentifier(
            name=name,
            numeric=kind == "numeric",
            codes=tuple(codes),
            labels=tuple(labels),
            leaf_counts=tuple(leaf_counts),
            spans=tuple(spans),
            domain_size=domain_size,
        )

    def _match(
        self, codes0: np.ndarray, texts: list[str], numbers: np.ndarray | None, kind: QIKind, name: str
    ) -> tuple[np.ndarray, list[str], np.ndarray | None, np.ndarray]:
        """Match the domain to the table's values; refuse uncovered values; order a categorical domain like the
        hierarchy's rows. Returns the (re-coded) codes, texts, numbers and each domain value's row in the table."""
        lookup = self._value_positions
        positions = np.fromiter((lookup.get(text, -1) for text in texts), dtype=np.int64, count=len(texts))
        uncovered = positions < 0
        if uncovered.any():
            rows = int(np.bincount(codes0, minlength=len(texts))[uncovered].sum())
            raise AnonymityInputError(
                f"quasi-identifier {name!r}: {int(uncovered.sum())} distinct value(s) in {rows} row(s) are not in its "
                f"generalisation hierarchy ({self.source}); add a row for each value of the column to the hierarchy"
            )
        if kind == "categorical":
            order = np.argsort(positions, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            codes0 = rank[codes0]
            texts = [texts[i] for i in order]
            positions = positions[order]
        return codes0, texts, numbers, positions

    def _bands(self, numbers: np.ndarray, name: str) -> list[tuple[np.ndarray, tuple[str, ...]]]:
        """Per level ``1..height``: each domain value's label code and the labels, for an interval hierarchy."""
        finest = self.widths[0]
        scaled = (numbers - self.origin) / finest
        if numbers.size and float(np.abs(scaled).max()) >= _MAX_BANDS:
            raise AnonymityInputError(
                f"quasi-identifier {name!r}: values lie more than 2**52 bands of width {finest:g} from the origin "
                f"{self.origin:g}; use wider bands or move the origin"
            )
        band = np.floor(scaled).astype(np.int64)
        # The float quotient is off by a few units of rounding (0.3 / 0.1 is 2.9999999999999996), and a value's
        # printed decimal by half a unit of its own: a value that close to an edge is placed exactly (_Edges.band).
        nearest = np.round(scaled)
        error_bound = 64 * np.finfo(np.float64).eps * (1.0 + (np.abs(numbers) + abs(self.origin)) / finest)
        edges = _Edges(self.origin, finest)
        close = np.abs(scaled - nearest) <= error_bound
        if edges.integral:  # integers below 2**53 are exact in float64: integer division is exact
            whole = close & (numbers == np.floor(numbers)) & (np.abs(numbers) < _EXACT_INTEGERS)
            band[whole] = np.floor_divide(numbers[whole].astype(np.int64) - int(self.origin), int(finest))
            close &= ~whole
        for i in np.flatnonzero(close).tolist():
            band[i] = edges.band(float(numbers[i]))
        levels = []
        for width in self.widths:
            multiple = int(round(width / finest))
            coarse = np.floor_divide(band, multiple)
            present, inverse = np.unique(coarse, return_inverse=True)
            labels = tuple(
                f"[{edges.text(j * multiple)}, {edges.text((j + 1) * multiple)})" for j in present.tolist()
            )
            levels.append((inverse.reshape(-1).astype(np.int64), labels))
        levels.append((np.zeros(numbers.size, dtype=np.int64), (TOP,)))
        return levels


class _Edges:
    """The finest band edges ``origin + j * width`` of an interval hierarchy, as exact decimals.

    ``origin`` and ``width`` are read as the decimals their shortest round-trip text shows (``0.1`` is 1/10), so an
    edge is what a reader of the spec expects (``3 * 0.1`` is ``0.3``), and distinct ``j`` give distinct edges.
    """

    # Exact: float exponents span about 10**-324 .. 10**308, and j < 2**52.
    _CONTEXT = decimal.Context(prec=800, traps=[decimal.Inexact, decimal.InvalidOperation])

    def __init__(self, origin: float, width: float) -> None:
        self._origin = decimal.Decimal(value_text(origin))
        self._width = decimal.Decimal(value_text(width))
        #: origin and width are integers exact in float64: every edge is an integer (the common case: ages, years).
        self.integral = all(v.is_integer() and abs(v) < _EXACT_INTEGERS for v in (float(origin), float(width)))

    def edge(self, j: int) -> decimal.Decimal:
        """``origin + j * width``, exactly."""
        context = self._CONTEXT
        return context.add(self._origin, context.multiply(decimal.Decimal(j), self._width))

    def band(self, value: float) -> int:
        """The ``j`` with edge ``j <= value <`` edge ``j + 1``, ``value`` read as the decimal it prints as
        (:func:`value_text`), exactly."""
        offset = fractions.Fraction(decimal.Decimal(value_text(value))) - fractions.Fraction(self._origin)
        return int(offset // fractions.Fraction(self._width))

    def text(self, j: int) -> str:
        """Edge ``j`` as text: an integer without ``.0``; else the float's shortest round-trip text when that is the
        edge exactly (``0.3``, ``1e-13``), else the exact decimal (an edge finer than a float can hold)."""
        if self.integral:
            return str(int(self._origin) + j * int(self._width))
        edge = self.edge(j)
        if edge == edge.to_integral_value():
            return str(int(edge))
        shortest = repr(float(edge))
        if decimal.Decimal(shortest) == edge:
            return shortest
        return format(edge.normalize(self._CONTEXT), "f")


def encode_quasi_identifiers(table: pd.DataFrame, spec: AnonymitySpec) -> list[EncodedQuasiIdentifier]:
    """Encode every quasi-identifier of ``spec`` for full-domain generalisation, in the spec's order.

    For each QI: its kind is :func:`~dp_operators.anonymity.columns.qi_kind` of the column with the declared ``type``;
    its hierarchy is the declared one, else :meth:`GeneralisationHierarchy.flat`.

    Args:
        table: the microdata, shape ``(n, any)``.
        spec: the anonymity spec (its ``quasi_identifiers`` and their hierarchies).

    Returns:
        One :class:`~dp_operators.anonymity.encoding.EncodedQuasiIdentifier` per QI, each with ``n`` rows.

    Raises:
        AnonymityInputError: an unknown QI column, an empty table, missing values
            (:func:`~dp_operators.anonymity.measures.check_columns`); a column refused by ``qi_kind`` (booleans
            declared numeric, infinite values, numbers mixed with text); values not covered by a hierarchy; an
            interval hierarchy on a categorical column.
    """
    check_columns(table, spec.qi_names, "quasi-identifier")
    encoded = []
    for qi in spec.quasi_identifiers:
        column = table[qi.name]
        kind = qi_kind(column, qi.type)
        hierarchy = qi.generalisation_hierarchy() or GeneralisationHierarchy.flat()
        encoded.append(hierarchy.encode(column, kind))
    return encoded


def value_text(value: object) -> str:
    """A value as hierarchy text: integral numbers without ``.0`` (``39.0`` -> ``"39"``), other floats by their
    shortest round-trip representation, booleans ``True``/``False``, anything else ``str(value)``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, Integral):
        return str(int(value))
    if isinstance(value, Real):
        number = float(value)
        if not isinstance(value, (float, np.floating)) or np.dtype(type(value)).itemsize > 8:
            # A Fraction or long double that no float64 prints as would lose digits: keep its own text.
            if not math.isfinite(number) or fractions.Fraction(repr(number)) != value:
                return str(value)
        if math.isfinite(number) and number.is_integer():
            return str(int(number))
        return repr(number)
    return str(value)


def _sorted_domain(codes: np.ndarray, texts: list[str]) -> tuple[np.ndarray, list[str]]:
    """Re-code a categorical domain in sorted text order (a stable order for hierarchies that impose none)."""
    order = np.argsort(np.asarray(texts, dtype=object), kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[codes], [texts[i] for i in order]


def _present_labels(domain_to_label: np.ndarray, labels: tuple[str, ...]) -> tuple[np.ndarray, tuple[str, ...]]:
    """Keep only the labels some present value generalises to; re-code the domain to them (in label order)."""
    present, inverse = np.unique(domain_to_label, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), tuple(labels[i] for i in present.tolist())


def _domain(column: pd.Series, kind: QIKind, name: str) -> tuple[np.ndarray, list[str], np.ndarray | None]:
    """The distinct values of a column: each row's domain code (shape ``(n,)``), each code's text, and (numeric
    columns) each code's number, increasing. Values with the same text are one value."""
    if kind == "numeric":
        try:
            numbers = numeric_values(column)
        except AnonymityInputError:
            raise
        except (TypeError, ValueError) as exc:
            raise AnonymityInputError(
                f"quasi-identifier {name!r} is not numeric; declare it type: categorical or clean the column"
            ) from exc
        infinite = int(np.count_nonzero(np.isinf(numbers)))
        if infinite:
            raise AnonymityInputError(
                f"quasi-identifier {name!r} has {infinite} infinite value(s); replace or drop them before generalising"
            )
        codes, uniques = pd.factorize(numbers, sort=True)
        representatives: list[object] = uniques.tolist()
        values: np.ndarray | None = np.asarray(uniques, dtype=np.float64)
    else:
        codes, uniques = pd.factorize(column)
        representatives = list(uniques)
        if column.dtype == object and len(uniques) > 1:
            # Hashing equates 1 with True (and 1.0): tell types apart so that each keeps its own text.
            type_codes, types = pd.factorize(column.map(type))
            if len(types) > 1:
                codes, _ = pd.factorize(codes.astype(np.int64) * len(types) + type_codes)
                _, first_rows = np.unique(codes, return_index=True)
                representatives = list(column.to_numpy(dtype=object)[first_rows])
        values = None
    texts = [value_text(v) for v in representatives]
    text_codes, distinct_texts = pd.factorize(pd.Series(texts, dtype=object))
    if len(distinct_texts) != len(texts):
        _, first = np.unique(text_codes, return_index=True)
        codes = text_codes[codes]
        if values is not None:
            values = values[first]
    return np.asarray(codes, dtype=np.int64), [str(t) for t in distinct_texts], values
