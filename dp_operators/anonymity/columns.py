"""Type handling of quasi-identifier columns, in one place for Mondrian and full-domain generalisation.

A QI is *numeric* (generalised to intervals, NCP by range) or *categorical* (generalised to sets or hierarchy nodes).
The kind is declared in the spec or inferred here from the column; columns that would be misread are refused with a
message naming the column and counting the offending cells, never quoting them (they may be row contents).
"""

from __future__ import annotations

import decimal
import fractions
import math
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from dp_operators.anonymity.errors import AnonymityInputError

if TYPE_CHECKING:
    from dp_operators.anonymity.spec import AnonymitySpec

QIKind = Literal["numeric", "categorical"]

# Every integer of at most this magnitude is a float64.
_EXACT_INTEGERS = 2**53

# Cell kinds of an object/string column, see _cell_kind.
_TEXT, _NUMERIC_TEXT, _BOOLEAN, _NUMBER = 0, 1, 2, 3


def declared_qi_kinds(spec: AnonymitySpec) -> dict[str, QIKind | None]:
    """``{QI name: "numeric" | "categorical" | None}``: each QI's declared ``type`` (``None``: infer it with
    :func:`qi_kind`). An interval hierarchy implies ``numeric``."""
    kinds: dict[str, QIKind | None] = {}
    for qi in spec.quasi_identifiers:
        declared = qi.type
        if declared is None and qi.hierarchy is not None and qi.hierarchy.intervals is not None:
            declared = "numeric"
        kinds[qi.name] = declared
    return kinds


def qi_kind(column: pd.Series, declared: QIKind | None = None) -> QIKind:
    """The kind of a QI column, after refusing the inputs that would be generalised wrongly.

    Rules:
        - booleans (``bool``/``boolean`` dtype, or an object column holding only ``True``/``False``) are
          categorical: they have no range; declaring them numeric is refused;
        - a numeric dtype (integer or float) is numeric unless declared categorical; its values must be finite
          (``inf`` has no interval and would make NCP ``nan``) and their range must be a finite float; complex
          numbers are refused;
        - an object/string column holding only number objects (``int``, ``float``, ``Decimal``, numpy scalars) is
          numeric, with the same finiteness checks;
        - an object/string column holding only numeric *text* (``"039"``, as ZIP codes are kept) is categorical
          unless declared numeric;
        - an object/string column whose cells mix numbers or numeric text with other text or booleans is refused
          unless declared categorical: one stray string would otherwise turn an age column into categories split
          in text order;
        - declaring a column ``numeric`` that holds anything but numbers or numeric text is refused.

    Args:
        column: the QI column, shape ``(n,)``; missing values are refused earlier
            (:func:`~dp_operators.anonymity.measures.check_columns`).
        declared: the kind declared in the spec, or ``None`` to infer.

    Raises:
        AnonymityInputError: the column holds infinite or NaN numbers, complex numbers, mixes numbers with text, or
            is declared numeric and holds non-numbers. The message names the column and counts cells; it never
            quotes them.
        ValueError: ``declared`` is not ``"numeric"``, ``"categorical"`` or ``None``.
    """
    if declared not in (None, "numeric", "categorical"):
        raise ValueError(f"declared must be 'numeric', 'categorical' or None, got {declared!r}")
    name = str(column.name)
    if declared == "categorical":
        return "categorical"
    if pd.api.types.is_bool_dtype(column):
        if declared == "numeric":
            raise AnonymityInputError(
                f"quasi-identifier {name!r} is boolean and cannot be numeric; declare it categorical"
            )
        return "categorical"
    if pd.api.types.is_complex_dtype(column):
        raise AnonymityInputError(
            f"quasi-identifier {name!r} holds complex numbers, which have no order; convert it to real numbers or text"
        )
    if pd.api.types.is_numeric_dtype(column):
        _check_finite(name, numeric_values(column))
        return "numeric"
    texts, numeric_texts, booleans, numbers = _kind_counts(column)
    size = len(column)
    if booleans == size:
        if declared == "numeric":
            raise AnonymityInputError(
                f"quasi-identifier {name!r} is boolean and cannot be numeric; declare it categorical"
            )
        return "categorical"
    if declared == "numeric":
        if texts or booleans:
            raise AnonymityInputError(
                f"quasi-identifier {name!r} is declared numeric but {texts + booleans} of its {size} values "
                "are not numbers; clean the column (for example with pandas.to_numeric) or declare it categorical"
            )
        _check_finite(name, numeric_values(column))
        return "numeric"
    if numbers and (texts or booleans or numeric_texts):
        raise AnonymityInputError(
            f"quasi-identifier {name!r} mixes numbers ({numbers} values) with text or booleans "
            f"({texts + numeric_texts + booleans} values); clean the column (for example with pandas.to_numeric) "
            "or declare it categorical"
        )
    if numeric_texts and (texts or booleans):
        raise AnonymityInputError(
            f"quasi-identifier {name!r} holds {numeric_texts} numeric and {texts + booleans} non-numeric value(s) "
            "as text (a number column with stray entries, as a CSV reader leaves it); clean the column (for "
            "example with pandas.to_numeric) or declare it categorical"
        )
    if numbers:
        _check_finite(name, numeric_values(column))
        return "numeric"
    # Text that all reads as numbers (ZIP codes, "039") stays text unless declared numeric.
    return "categorical"


def numeric_values(column: pd.Series) -> np.ndarray:
    """A numeric QI column as float64, shape ``(n,)`` (after :func:`qi_kind` said ``numeric``).

    This is the one place where numeric QI values become numbers, for both algorithms. A value must be held exactly:
    float cells (at most 64 bits) are taken as they are; any other number (an integer, a ``Decimal``, a
    ``Fraction``, a long double) must equal the float64 it converts to, read as the decimal the float prints as
    (``Decimal("0.1")`` is the float ``0.1``; ``2**53 + 1``, ``uint64 2**64 - 1`` and
    ``Decimal("0.10000000000000000001")`` are not). Otherwise distinct values would merge into one equivalence class
    and the published level-0 cell would not be the row's value. Infinite and NaN results are left to
    :func:`qi_kind`, which refuses them with their own message.

    Raises:
        AnonymityInputError: a cell is not a number (call :func:`qi_kind` first to get the reason), is too large for
            a float64, or cannot be held exactly by one (the message counts the distinct values and says how to fix:
            round the column, or declare it categorical to keep the values exactly).
    """
    name = str(column.name)
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        if pd.api.types.is_integer_dtype(column):
            unsigned = pd.api.types.is_unsigned_integer_dtype(column)
            integers = column.to_numpy(dtype=np.uint64 if unsigned else np.int64)
            values = integers.astype(np.float64)
            # Every integer of magnitude <= 2**53 is a float64; larger ones only when their float converts back.
            large = integers > _EXACT_INTEGERS
            if not unsigned:
                large |= integers < -_EXACT_INTEGERS
            if large.any():
                candidates = pd.unique(integers[large])
                _refuse_inexact(name, sum(1 for v in candidates.tolist() if int(float(v)) != int(v)))
            return values
        if pd.api.types.is_float_dtype(column) and getattr(column.dtype, "itemsize", 8) <= 8:
            return column.to_numpy(dtype=np.float64)
    cells = column.to_numpy(dtype=object)
    try:  # float() reads int, float, Decimal, Fraction, numpy scalars and numeric text alike
        values = np.fromiter((float(v) for v in cells), dtype=np.float64, count=cells.size)
    except OverflowError as exc:  # float(10**400)
        raise AnonymityInputError(
            f"quasi-identifier {name!r} has value(s) too large for a 64-bit float; rescale the column (for example "
            "divide it by a power of ten) or declare it categorical"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise AnonymityInputError(
            f"quasi-identifier {name!r} is not numeric: some of its values are not numbers; clean the column (for "
            "example with pandas.to_numeric) or declare it type: categorical"
        ) from exc
    if cells.size:
        try:
            distinct = pd.unique(cells)
        except TypeError:  # unhashable cells are refused by check_columns; be safe when called directly
            distinct = cells
        _refuse_inexact(name, sum(1 for v in distinct if not _held_exactly(v)))
    return values


def _held_exactly(cell: object) -> bool:
    """Whether one numeric cell equals its float64, read as the decimal the float prints as (``repr``); an infinite or
    NaN float counts as exact here (refused by :func:`_check_finite` with its own message)."""
    if isinstance(cell, str):  # numeric text is matched as its decimal
        try:
            cell = decimal.Decimal(cell.strip())
        except decimal.InvalidOperation:
            return False
    if isinstance(cell, (float, np.floating)) and np.dtype(type(cell)).itemsize <= 8:
        return True
    number = float(cell)  # type: ignore[arg-type]
    if not math.isfinite(number):
        return True
    if isinstance(cell, (int, np.integer)):
        return int(cell) == int(number)
    try:
        exact = fractions.Fraction(cell)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        ratio = getattr(cell, "as_integer_ratio", None)  # numpy long double and other float types
        if ratio is None:
            return False
        exact = fractions.Fraction(*ratio())
    return exact == fractions.Fraction(repr(number)) or exact == fractions.Fraction(number)


def _refuse_inexact(name: str, count: int) -> None:
    if count:
        raise AnonymityInputError(
            f"quasi-identifier {name!r} has {count} distinct value(s) that a 64-bit float cannot hold exactly "
            "(integers beyond 2**53, or more than about 16 significant digits), so distinct values would merge and "
            "published cells would not be the rows' values; round the column to fewer significant digits (for "
            "example integer-divide large integers by a power of ten), or declare it type: categorical to keep its "
            "values exactly"
        )


def _check_finite(name: str, values: np.ndarray) -> None:
    """Refuse NaN (a missing value pandas did not see, e.g. ``Decimal('NaN')``), infinities and ranges too wide for
    float64 (``max - min`` overflowing makes NCP ``nan``)."""
    missing = int(np.count_nonzero(np.isnan(values)))
    if missing:
        raise AnonymityInputError(
            f"quasi-identifier {name!r} has {missing} NaN value(s); drop those rows before generalising, or replace "
            "them with a number and, if the column has a generalisation hierarchy file or tree, add it there"
        )
    infinite = int(np.count_nonzero(np.isinf(values)))
    if infinite:
        raise AnonymityInputError(
            f"quasi-identifier {name!r} has {infinite} infinite value(s); replace or drop them before generalising "
            "(an interval cannot cover infinity)"
        )
    if values.size:
        with np.errstate(over="ignore"):
            span = np.float64(values.max()) - np.float64(values.min())
        if not np.isfinite(span):
            raise AnonymityInputError(
                f"quasi-identifier {name!r} has a range wider than a float64 can hold; rescale the column"
            )


def _kind_counts(column: pd.Series) -> tuple[int, int, int, int]:
    """Cells of each kind (text, numeric text, boolean, number) of a non-numeric column."""
    if isinstance(column.dtype, pd.StringDtype):  # every cell is a str: classify each distinct value once
        frequencies = column.value_counts(sort=False)
        kinds = np.fromiter((_cell_kind(v) for v in frequencies.index), dtype=np.int8, count=frequencies.size)
        counts = np.bincount(kinds, weights=frequencies.to_numpy(), minlength=4)
    else:  # object cells: 1 and True compare equal, so classify every cell by its own type
        cells = column.to_numpy(dtype=object)
        counts = np.bincount(np.fromiter((_cell_kind(v) for v in cells), dtype=np.int8, count=cells.size), minlength=4)
    text, numeric_text, boolean, number = (int(c) for c in counts)
    return text, numeric_text, boolean, number


def _cell_kind(value: object) -> int:
    """The kind of one cell of an object column: text, numeric text, boolean or number."""
    if isinstance(value, (bool, np.bool_)):
        return _BOOLEAN
    if isinstance(value, (int, float, np.integer, np.floating)):
        return _NUMBER
    if isinstance(value, (complex, np.complexfloating)):
        return _TEXT  # no order: never numeric
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return _TEXT
        return _NUMERIC_TEXT
    if isinstance(value, (bytes, bytearray)):
        return _TEXT
    try:  # Decimal, Fraction and other number types
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return _TEXT
    return _NUMBER
