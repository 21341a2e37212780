"""``dpctl release show``: print a published release; ``dpctl release verify``: compare published files with the
ledger (:mod:`dp_operators.operators.verification`).

Names, values and paths in a release (written by DAG authors and workers) are printed through
:func:`~dp_operators.ledger.bounded.visible`: no control or format character reaches the terminal as itself."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from dp_operators.cli.charges import release_key_cell
from dp_operators.cli.common import (
    EXIT_INCONSISTENT,
    ConnOption,
    UrlOption,
    _fail,
    _ledger_errors,
    _locate,
    _stdout_pipe,
    console,
    release_app,
)
from dp_operators.ledger.bounded import visible
from dp_operators.ledger.structure import bounding_by_aggregate, bounding_summary, describe_bounding

if TYPE_CHECKING:
    from dp_operators.operators.verification import FileVerdict


@release_app.command("show")
def release_show(
    path: Annotated[str, typer.Argument(help="A release JSON file, or a folder: its newest release is shown. A local "
                                        "path or a URI (s3://...), such as a published location.")],
) -> None:
    """Print a published release: values with their confidence half-widths, and the charge."""
    from dp_operators.operators.verification import located_path

    located = located_path(path)
    try:
        if located.is_dir():
            found = [(p.stat().st_mtime, str(p), p) for p in located.rglob("*.json")
                     if not p.name.endswith("~diagnostics.json")]
            if not found:
                _fail(f"no release JSON under {visible(path)}")
            located = max(found, key=lambda item: item[:2])[2]
    except OSError as error:
        _fail(f"cannot read {visible(path)}: {getattr(error, 'strerror', None) or error}")
    release = _load_release(located)
    try:
        _print_release(release, located)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        _fail(f"{visible(path)}: not a release published by dp-operators ({type(error).__name__}: {error})")


def _load_release(path: Any) -> dict:
    """The release JSON at ``path`` (an ``ObjectStoragePath``); a one-line error (exit 1) if it is missing, not JSON
    or not a release."""
    shown = _shown(path)
    if path.suffix.lower() in (".parquet", ".csv"):
        _fail(f"{shown} is the release's {path.suffix[1:].upper()} file: give its JSON file "
              f"({_shown(path.with_suffix('.json'))}) or a folder of releases")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        _fail(f"no such file: {shown}")
    except (OSError, UnicodeDecodeError) as error:
        _fail(f"cannot read {shown}: {getattr(error, 'strerror', None) or error}")
    try:
        release = json.loads(text)
    except json.JSONDecodeError as error:
        _fail(f"{shown}: not valid JSON ({error})")
    required = ("release", "release_key", "charge", "confidence", "aggregates")
    missing = [name for name in required if name not in release] if isinstance(release, dict) else list(required)
    if missing or not isinstance(release["aggregates"], dict) or not isinstance(release["charge"], dict):
        what = f"no {', '.join(repr(m) for m in missing)}" if missing else "unexpected field types"
        _fail(f"{shown}: not a release published by dp-operators ({what})")
    return release


def _shown(path: Any) -> str:
    """How a message names a file: its path if local, else its URI (terminal-safe)."""
    local = getattr(path, "protocol", "file") in ("file", "local", "")
    return visible(path.path if local else str(path))


def _print_release(release: dict, path: Any) -> None:
    console.print(
        Text.assemble("release ", (visible(release["release"]), "bold"), f" published to {_shown(path)}"),
        soft_wrap=True,
    )
    charge = release["charge"]
    spent = ", ".join(f"{unit} {charge[unit]:g}" for unit in ("epsilon", "rho") if unit in charge)
    if charge.get("epsilon_at_delta") is not None and "rho" in charge:
        spent += f" (epsilon {charge['epsilon_at_delta']:.4g} at delta {charge['delta']:g})"
    elif isinstance(charge.get("delta_spent"), (int, float)):  # an (epsilon, delta) charge: partition selection
        spent += f", delta {charge['delta_spent']:.4g}"
    series = release.get("series")
    if isinstance(series, dict):  # a series step: its step, its run's data interval, the series' one charge
        interval = series.get("data_interval") or [None, None]
        console.print(
            f"series step {visible(series.get('step'))} of {visible(series.get('horizon'))} (run "
            f"{visible(series.get('run_id'))}, data interval {visible(interval[0])} to {visible(interval[-1])}); "
            f"this step spent {spent}, the series rho {visible(charge.get('series_rho'))} once", highlight=False)
    else:
        console.print(f"run {visible(release['release_key']['run_id'])}; this release spent {spent}", highlight=False)
    level = f"{release['confidence']:.0%}"
    bounding = _bounding_by_aggregate(release)
    for name, aggregate in release["aggregates"].items():
        console.print(
            Text.assemble("\n", (visible(name), "bold"), f" ({visible(aggregate['kind'])}, "
                          f"{visible(aggregate['mechanism'])})"),
            highlight=False,
        )
        console.print(f"contribution bounding: {visible(describe_bounding(bounding.get(name)))}", highlight=False,
                      soft_wrap=True)
        selection = aggregate.get("partition_selection")
        if isinstance(selection, dict):  # the keys (a quantile's groups) were selected from the data
            rows = aggregate.get("rows")
            released = f"{len(rows)} rows released" if isinstance(rows, list) else "rows released"
            console.print(f"keys found in the data: {released}, of the keys whose noised count of privacy units "
                          f"reached the threshold {visible(selection.get('threshold'))} (partition selection, "
                          f"{visible(selection.get('mechanism'))}, epsilon {visible(selection.get('epsilon'))}, delta "
                          f"{visible(selection.get('delta'))})", highlight=False, soft_wrap=True)
        reference = aggregate.get("rows_file")
        if isinstance(reference, dict):  # a large release: its rows are in a Parquet file, not in the JSON
            console.print(f"{visible(reference.get('rows'))} rows in the rows file {visible(reference.get('uri'))} "
                          f"(sha256 {visible(str(reference.get('sha256'))[:16])}...; `dpctl release verify` checks "
                          "it)", highlight=False, soft_wrap=True)
            continue
        table = Table()
        for column in aggregate["group_by"] + ["value", f"± ({level})"]:
            table.add_column(visible(column), justify="right" if column in ("value",) else "left")
        rows = aggregate.get("rows") or [aggregate]
        for row in rows:
            value = row["value"]
            shown = f"{value:.3f}" if isinstance(value, float) else visible(value)
            table.add_row(*[visible(row[c]) for c in aggregate["group_by"]], shown, _shown_half_width(row))
        console.print(table)


def _bounding_by_aggregate(release: dict) -> dict:
    """``{aggregate: contribution_bounding}`` of a release: its ``contribution_bounding``, else read from its
    ``mechanisms``; an aggregate with neither (a release published before bounding was recorded) was declared."""
    found = release.get("contribution_bounding")
    if isinstance(found, dict):
        return found
    return bounding_by_aggregate(release.get("mechanisms"))


def _shown_half_width(row: dict) -> str:
    """A row's half-width, or the interval of a saturated value (an unbounded side shown as ...). A quantile's row
    also has its rank half-width (records), its only guarantee when it has no value interval (the exponential
    mechanism): ``within 18.98 ranks``, or its value interval with them, ``[48, 51] (within 7.5 ranks)``."""
    if row.get("rank_half_width") is not None:  # a quantile: within so many records of its target rank
        ranks = f"within {row['rank_half_width']:.4g} ranks"
        interval = row.get("interval")
        if row.get("half_width") is None or not isinstance(interval, list) or len(interval) != 2:
            return ranks
        return f"[{interval[0]}, {interval[1]}] ({ranks})"
    if row.get("saturated") and row["half_width"] is None:
        lower, upper = row["interval"]
        ends = ["..." if end is None else f"{end:.6g}" for end in (lower, upper)]
        return f"saturated: [{ends[0]}, {ends[1]}]"
    return f"{row['half_width']:.3g}" + (" (saturated)" if row.get("saturated") else "")




@release_app.command("verify")
def release_verify(
    path: Annotated[str, typer.Argument(help="A release file or a folder of them: a local path or a URI (s3://...), "
                                        "such as a published location.")],
    url: UrlOption = None,
    conn_id: ConnOption = None,
    output_uri: Annotated[
        Optional[str],
        typer.Option("--output-uri", help="The operator's output_uri: check every file's path is its key's location "
                     "under it (default: inferred from the folders the files lie in)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a file, instead of a table.")] = False,
) -> None:
    """Compare published release files with the ledger's committed outputs, the authority on what was released.

    For each .json release (and its .csv and .parquet siblings) under PATH: the file must be exactly
    what the operator writes for the committed output of its release key (the JSON's release_key): the JSON
    equal and byte for byte, the CSV byte for byte, the Parquet file byte for byte or (written by another pyarrow
    version) the same table, or (written before values were typed) the same values, which the verdict says; numbers
    are compared exactly, never through doubles. Its path must be its key's location under the output root
    (--output-uri, else the root the folders show), so a file copied into another DAG's folder is caught.
    Diagnostics reports are skipped. Reading needs no key; run 'dpctl ledger verify' to authenticate the ledger
    itself.

    Exit 0 when every file matches; 3 when any differs, is not in the ledger, is not a release or cannot be read;
    1 when PATH or the ledger cannot be read.
    """
    from dp_operators.ledger import Ledger
    from dp_operators.operators.verification import located_path, release_files, verify_published

    with _ledger_errors():
        ledger = Ledger(_locate(url, conn_id).url)  # reading needs no spend key
        ledger.check_schema()
        root = located_path(path)
        try:
            files = release_files(root)
        except FileNotFoundError:
            _fail(f"no such file or folder: {path}")
        except (OSError, ValueError) as error:
            _fail(f"cannot read {path}: {error}")
        if not files:
            _fail(f"no release files (.json, .csv, .parquet) under {path}")
        verdicts = verify_published(files, ledger.stored_output, output_uri)
        bounding = {verdict.file: _committed_bounding(ledger, verdict.key) for verdict in verdicts}
    with _stdout_pipe():
        if as_json:
            for verdict in verdicts:
                typer.echo(json.dumps({**verdict.as_dict(), "contribution_bounding": bounding[verdict.file]}))
        else:
            _print_verdicts(verdicts, str(root if root.is_dir() else root.parent), bounding)
    if not all(verdict.matches for verdict in verdicts):
        raise typer.Exit(EXIT_INCONSISTENT)


def _committed_bounding(ledger: Any, key: Any) -> str | None:
    """How the committed release of ``key`` bounded its contributions, from the mechanisms the ledger recorded with
    its charge: ``enforced``, ``declared`` or ``mixed`` (:func:`~dp_operators.ledger.structure.bounding_summary`);
    None when the key has no committed output this ledger can read."""
    if key is None:
        return None
    try:
        stored = ledger.stored_output(key)
    except Exception:  # noqa: BLE001 - the verdict already says why the file does not match
        return None
    return None if stored is None else bounding_summary(stored.get("mechanisms"))


def _print_verdicts(verdicts: list[FileVerdict], folder: str, bounding: dict[str, str | None]) -> None:
    """A table of ``verdicts`` (file names relative to ``folder``, the URI they lie under), with the contribution
    bounding the ledger recorded for each file's release, and a count."""
    table = Table(title=f"release files under {visible(folder)}")
    table.add_column("file", overflow="fold")
    table.add_column("release key (dag / run / task / release)", overflow="fold")
    table.add_column("bounding")
    table.add_column("verdict", overflow="fold")
    for verdict in verdicts:
        key = "-" if verdict.key is None else release_key_cell(verdict.key.as_dict())
        reasons = verdict.problems + verdict.notes
        shown = Text(visible(verdict.verdict), style="green" if verdict.matches else "red")
        if reasons:
            shown.append(": " + "; ".join(map(visible, reasons)))
        table.add_row(visible(verdict.file.removeprefix(folder.rstrip("/") + "/")), key,
                      bounding.get(verdict.file) or "-", shown)
    console.print(table)
    bad = sum(not verdict.matches for verdict in verdicts)
    console.print(
        f"{len(verdicts)} files: {len(verdicts) - bad} match the ledger" + (f", {bad} do not" if bad else ""),
        highlight=False,
    )
