"""``dpctl release show``: print a published release."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from dp_operators.cli.common import (
    _fail,
    console,
    release_app,
)

@release_app.command("show")
def release_show(
    path: Annotated[Path, typer.Argument(help="A release JSON file, or a folder: its newest release is shown.")],
) -> None:
    """Print a published release: values with their confidence half-widths, and the charge."""
    if path.is_dir():
        found = sorted(path.rglob("*.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            _fail(f"no release JSON under {path}")
        path = found[-1]
    release = _load_release(path)
    try:
        _print_release(release, path)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        _fail(f"{path}: not a release published by dp-operators ({type(error).__name__}: {error})")


def _load_release(path: Path) -> dict:
    """The release JSON at ``path``; a one-line error (exit 1) if it is missing, not JSON or not a release."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        _fail(f"no such file: {path}")
    except (OSError, UnicodeDecodeError) as error:
        _fail(f"cannot read {path}: {getattr(error, 'strerror', None) or error}")
    try:
        release = json.loads(text)
    except json.JSONDecodeError as error:
        _fail(f"{path}: not valid JSON ({error})")
    required = ("release", "release_key", "charge", "confidence", "aggregates")
    missing = [name for name in required if name not in release] if isinstance(release, dict) else list(required)
    if missing or not isinstance(release["aggregates"], dict) or not isinstance(release["charge"], dict):
        what = f"no {', '.join(repr(m) for m in missing)}" if missing else "unexpected field types"
        _fail(f"{path}: not a release published by dp-operators ({what})")
    return release


def _print_release(release: dict, path: Path) -> None:
    console.print(
        Text.assemble("release ", (str(release["release"]), "bold"), f" published to {path}"), soft_wrap=True
    )
    charge = release["charge"]
    spent = ", ".join(f"{unit} {charge[unit]:g}" for unit in ("epsilon", "rho") if unit in charge)
    if charge.get("epsilon_at_delta") is not None and "rho" in charge:
        spent += f" (epsilon {charge['epsilon_at_delta']:.4g} at delta {charge['delta']:g})"
    console.print(f"run {release['release_key']['run_id']}; this release spent {spent}", highlight=False)
    level = f"{release['confidence']:.0%}"
    for name, aggregate in release["aggregates"].items():
        console.print(
            Text.assemble("\n", (str(name), "bold"), f" ({aggregate['kind']}, {aggregate['mechanism']})"),
            highlight=False,
        )
        table = Table()
        for column in aggregate["group_by"] + ["value", f"± ({level})"]:
            table.add_column(column, justify="right" if column in ("value",) else "left")
        rows = aggregate.get("rows") or [aggregate]
        for row in rows:
            value = row["value"]
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            table.add_row(*[str(row[c]) for c in aggregate["group_by"]], shown, _shown_half_width(row))
        console.print(table)


def _shown_half_width(row: dict) -> str:
    """A row's half-width, or the interval of a saturated value (an unbounded side shown as ...)."""
    if row.get("saturated") and row["half_width"] is None:
        lower, upper = row["interval"]
        ends = ["..." if end is None else f"{end:.6g}" for end in (lower, upper)]
        return f"saturated: [{ends[0]}, {ends[1]}]"
    return f"{row['half_width']:.3g}" + (" (saturated)" if row.get("saturated") else "")


