"""Names in a release spec: release and aggregate names, and ``group_by`` columns.

Release and aggregate names become parts of file names and of the SQL sink's rows, so they are plain identifiers of
bounded length; a ``group_by`` column must not take the name of a field that published and upstream rows already
hold.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

#: A release, aggregate or account name: a letter or ``_``, then letters, digits, ``_`` and ``-`` (matched with
#: ``fullmatch``: no trailing newline).
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
#: Names starting with this are dp_operators' own: the key of the XCom envelope of ``aggregates_for_xcom``
#: (``__dp_operators_aggregates__``), which an aggregate of that name would be mistaken for.
RESERVED_PREFIX = "__dp_"
#: The longest release or aggregate name. Both become parts of file names (``<release>/...``, one folder name of at
#: most 255 bytes on common filesystems) and of the SQL sink's rows and release key.
MAX_NAME_LENGTH = 200

#: Field names of a published row and of an upstream row besides its ``group_by`` columns: a ``group_by`` column
#: of one of these names would lose its key to the noised number (``value``) or be read as a total (``count``).
RESERVED_COLUMNS = frozenset({"value", "half_width", "saturated", "interval", "count", "sum", "sum_squares", "units"})


def check_name(value: str, what: str) -> str:
    """``value`` if it is a spec name (letters, digits, ``_`` and ``-``, not starting with a digit or ``-``) of at
    most :data:`MAX_NAME_LENGTH` characters; else ValueError saying which rule it breaks."""
    if not NAME.fullmatch(value):
        raise ValueError(f"{what} use letters, digits, '_' and '-', got {value!r}")
    if value.startswith(RESERVED_PREFIX):
        raise ValueError(f"{what} cannot start with {RESERVED_PREFIX!r} (dp_operators' own keys, such as the XCom "
                         f"envelope of aggregates_for_xcom, use it), got {value!r}: rename it")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{what} are at most {MAX_NAME_LENGTH} characters (they become parts of file names and of the SQL "
            f"sink's release key), got {len(value)}: shorten it"
        )
    return value


def _group_by_column(value: str) -> str:
    if value.startswith(RESERVED_PREFIX):
        raise ValueError(f"a group_by column cannot start with {RESERVED_PREFIX!r} (dp_operators' own keys, such as "
                         f"the XCom tags of aggregates_for_xcom, use it), got {value!r}: rename the column upstream")
    if value in RESERVED_COLUMNS:
        raise ValueError(
            f"a group_by column cannot be named {value!r}: published and upstream rows use that name for their "
            f"own field ({', '.join(sorted(RESERVED_COLUMNS))}), so the key would be lost; rename the column "
            f"upstream (e.g. SELECT {value} AS {value}_key) and list the new name in group_by (and keys)"
        )
    return value


#: A ``group_by`` column name: any text except the row fields of :data:`RESERVED_COLUMNS`.
GroupByColumn = Annotated[str, AfterValidator(_group_by_column)]
