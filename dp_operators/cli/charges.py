"""How ``dpctl ledger history`` and ``dpctl ledger reconcile`` print charges: tables, aligned lines, JSON.

A charge is identified by its release key (DAG, run, task and map index, release). Run ids share long prefixes
(``manual__2026-11-30T16:05:01.123456+00:00``), so a table that cut them short made different charges look the
same: tables stack the release key in one column, one part a line, and never cut a part (a part wider than the
terminal folds onto the next line).

``ledger history`` checks every charge as it streams (:func:`~dp_operators.ledger.store.read_charge`: numbers in
``str(Fraction)`` form within their digit bound, JSON text of bounded length and depth, text that fits its column):
a row holding a value the ledger does not write is printed as unreadable, naming its id and each unreadable column,
and every other row prints as usual; nothing a row holds can make the command fail or hang. Every text a row holds
(names written by workers) is printed through :func:`~dp_operators.ledger.bounded.visible`: a control or format
character (an escape sequence, a carriage return, a bidirectional override) shows as its escape, ``\\x1b``, and
never acts on the terminal; a stored line break too, so a name cannot add lines of its own to a cell.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from dp_operators.cli.common import console, visible_json
from dp_operators.ledger.bounded import BoundsError, read_number, visible

#: ``ledger history`` prints a table when the charges fit in this many rows; longer histories stream as aligned
#: lines (a table needs every row in memory before it prints the first).
HISTORY_TABLE_ROWS = 1000

#: The header of ``ledger history``'s aligned lines, one column each.
HISTORY_COLUMNS = ("id", "account", "dag_id", "run_id", "task_id", "release", "attempt", "state", "amount", "bounding",
                   "created")

#: Columns of ``dp_charges`` stored as JSON text (``dp_operators.ledger.schema``); ``--json`` nests them as JSON.
JSON_TEXT_COLUMNS = ("mechanisms", "context")

_KEY_HEADER = "dag / run / task / release"


def task_label(c: dict[str, Any]) -> str:
    """The charge's task as Airflow names a mapped task instance: ``release`` or ``release[2]`` (task ids cannot
    contain brackets, so the label is unambiguous)."""
    map_index = c.get("map_index")
    if not isinstance(map_index, int):  # None, or "?" where unreadable
        return str(c["task_id"]) + ("" if map_index is None else f"[{map_index}]")
    return c["task_id"] if map_index < 0 else f"{c['task_id']}[{map_index}]"


def release_key_cell(c: dict[str, Any]) -> str:
    """The release key, one part a line: DAG, run, task (with its map index), release; each part
    :func:`~dp_operators.ledger.bounded.visible`."""
    return "\n".join(map(visible, (c["dag_id"], c["run_id"], task_label(c), c["release_name"])))


def amount_text(c: dict[str, Any], separator: str = " ") -> str:
    """The amount in the account's unit, and the delta when the charge has one (``?`` for an unreadable one)."""
    amount = _amount(c["amount"])
    if c["delta_amount"] != "0":
        amount += f"{separator}(delta {_amount(c['delta_amount'])})"
    return amount


def account_amount_cell(c: dict[str, Any]) -> str:
    """The account (:func:`~dp_operators.ledger.bounded.visible`), then the amount (and delta) on the next
    lines."""
    return visible(c["account"]) + "\n" + amount_text(c, separator="\n")


def charge_document(c: dict[str, Any]) -> dict[str, Any]:
    """A charge row as one JSON object: the columns stored as JSON text become nested JSON, the rest as they are
    (times as text). A row with unreadable values (:func:`~dp_operators.ledger.store.read_charge`) has each of them
    ``null`` and one more key, ``unreadable``: a list of ``"column [value cut short] what is wrong"``."""
    from dp_operators.ledger.store import read_charge

    read = read_charge(c)
    document = {
        name: read.values[name] if name in JSON_TEXT_COLUMNS else (None if read.values[name] is None else value)
        for name, value in c.items()
    }
    if not read.ok:
        document["unreadable"] = read.reasons()
    return document


def _readable(c: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The charge as the table and the aligned lines print it: each readable value as it is, each unreadable one
    ``"?"``; and the unreadable columns, each as ``column [value cut short] what is wrong``."""
    from dp_operators.ledger.store import read_charge

    read = read_charge(c)
    if read.ok:
        return c, []
    return {name: "?" if name in read.unreadable else value for name, value in c.items()}, read.reasons()


def _amount(text: Any) -> str:
    """An amount as the ledger stores it (``"1/400"``) with 6 significant digits (an integer in full); ``?`` for an
    unreadable one. Parsed by :func:`~dp_operators.ledger.bounded.read_number`, never by ``Fraction(text)``."""
    try:
        value = read_number(text)
    except BoundsError:
        return "?"
    return f"{float(value):.6g}" if value.denominator != 1 else str(value.numerator)


def bounding_text(c: dict[str, Any]) -> str:
    """Whether the charge's steps enforced their contribution bounds (the ``contribution_bounding`` its mechanisms
    record; a step without one was declared): ``enforced``, ``declared``, ``mixed``, or ``-`` (no steps, or
    mechanisms unreadable)."""
    from dp_operators.ledger.bounded import BoundsError, read_json
    from dp_operators.ledger.structure import bounding_summary

    mechanisms = c.get("mechanisms")
    if isinstance(mechanisms, str):
        try:
            mechanisms = read_json(mechanisms)
        except (BoundsError, ValueError):
            return "-"
    return bounding_summary(mechanisms)


def _print_charges_table(title: str, last_header: str, rows: list[list[str]]) -> None:
    """Print a table of charges: id, release key, account and amount, then ``last_header`` (state or lease).

    When the table is wider than the terminal, the release key's column keeps the width of its widest line (a whole
    run id) if the other columns fit beside it at their longest word; they wrap to make that room. Otherwise the key
    takes what room is left and its long lines fold onto the next: no cell is ever cut.
    """
    headers = ["id", _KEY_HEADER, "account / amount", last_header]
    texts = [[header, *(row[column] for row in rows)] for column, header in enumerate(headers)]
    longest_line = [max(cell_len(line) for text in column for line in text.splitlines()) for column in texts]
    longest_word = [max(cell_len(word) for text in column for word in text.split()) for column in texts]
    widths: list[int | None] = [None] * len(headers)
    room = console.width - (3 * len(headers) + 1)  # borders and one space of padding each side of a cell
    if sum(longest_line) > room:
        others = (3, 2, 0)  # the order spare room goes to the other columns, up to their longest line
        key = max(1, min(longest_line[1], room - sum(longest_word[c] for c in others)))
        spare = room - key - sum(longest_word[c] for c in others)
        widths[1] = key
        for column in others:
            widths[column] = longest_word[column] + max(0, min(spare, longest_line[column] - longest_word[column]))
            spare -= widths[column] - longest_word[column]
    table = Table(title=title, show_lines=True)
    for column, header in enumerate(headers):
        table.add_column(
            header,
            justify="right" if column == 0 else "left",
            overflow="fold",
            width=widths[column],
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # plain text: a run id such as "[/x]" is not markup
    console.print(table)


def print_history_table(charges: list[dict[str, Any]]) -> None:
    rows = []
    for charge in charges:
        c, unreadable = _readable(charge)
        key = release_key_cell(c)
        if unreadable:
            key = "UNREADABLE ROW: " + visible("; ".join(unreadable)) + "\n" + key
        rows.append([
            str(c["id"]),
            key,
            account_amount_cell(c),
            "\n".join(map(visible, (c["state"], f"attempt {c['attempt']}", str(c["created_at"])[:19],
                                    f"bounding {bounding_text(c)}"))),
        ])
    _print_charges_table("Charges", "state / attempt / created / bounding", rows)


def print_reconciled_table(abandoned: list[dict[str, Any]]) -> None:
    rows = [
        [
            str(c["id"]),
            release_key_cell(c),
            account_amount_cell(c),
            "\n".join(map(visible, (f"attempt {c['attempt']}", str(c["lease_expires_at"] or "-")[:19]))),
        ]
        for c in abandoned
    ]
    _print_charges_table(
        f"Abandoned {len(abandoned)} expired reservation(s) (still counted as spent)", "attempt / lease ended", rows
    )


def _history_cells(charge: dict[str, Any]) -> list[str]:
    c, unreadable = _readable(charge)
    cells = [
        str(c["id"]), c["account"], c["dag_id"], c["run_id"], task_label(c), c["release_name"], str(c["attempt"]),
        c["state"], amount_text(c), bounding_text(c), str(c["created_at"])[:19],
    ]
    cells = [visible(cell) for cell in cells]
    if unreadable:  # after the last column, which is never padded
        cells[-1] += "  UNREADABLE ROW: " + visible("; ".join(unreadable))
    return cells


def print_history(charges: Iterator[dict[str, Any]], as_json: bool) -> tuple[int, int | None]:
    """Print ``charges`` as they stream in; returns ``(how many, id of the last)``.

    JSON lines (:func:`charge_document`) are written one by one. Otherwise up to :data:`HISTORY_TABLE_ROWS` charges
    are held: if that is all of them they print as a table; else as aligned lines of full values (column widths
    from the first rows held), streamed, so memory stays flat however long the history.
    """
    out = sys.stdout
    count, last = 0, None
    if as_json:
        for charge in charges:
            out.write(visible_json(json.dumps(charge_document(charge), default=str, sort_keys=True,
                                              ensure_ascii=False)) + "\n")
            count, last = count + 1, charge["id"]
        return count, last
    held: list[dict[str, Any]] = []
    for charge in charges:
        held.append(charge)
        count, last = count + 1, charge["id"]
        if len(held) > HISTORY_TABLE_ROWS:
            break
    else:
        print_history_table(held)
        return count, last
    rows = [_history_cells(charge) for charge in held]
    held.clear()
    widths = [max(len(column), *(len(cells[i]) for cells in rows)) for i, column in enumerate(HISTORY_COLUMNS)]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip() + "\n"

    out.write(line(list(HISTORY_COLUMNS)))
    for cells in rows:
        out.write(line(cells))
    rows.clear()
    for charge in charges:
        out.write(line(_history_cells(charge)))
        count, last = count + 1, charge["id"]
    return count, last
