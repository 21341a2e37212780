"""``dpctl``: the command line for privacy officers and pipeline owners.

Exit codes: 0 success; 1 a check failed or a refusal (invalid spec or configuration, ledger not initialised,
unknown account); 2 usage error (typer/click's own). Every command has ``--help``.

The ledger is chosen with ``--url`` (a SQLAlchemy URL), else ``--conn-id`` (an Airflow connection), else the
``DP_LEDGER_URL`` environment variable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from dp_operators.ledger import Ledger, LedgerConfigError, LedgerError, load_ledger_config
from dp_operators.spec import SpecError, load_spec

app = typer.Typer(help="Differentially private releases: specs, budget ledger, releases.", no_args_is_help=True)
ledger_app = typer.Typer(help="The privacy-budget ledger.", no_args_is_help=True)
spec_app = typer.Typer(help="Release specs.", no_args_is_help=True)
release_app = typer.Typer(help="Published releases.", no_args_is_help=True)
app.add_typer(ledger_app, name="ledger")
app.add_typer(spec_app, name="spec")
app.add_typer(release_app, name="release")

console = Console(width=None if __import__("sys").stdout.isatty() else 120)
errors = Console(stderr=True)

UrlOption = Annotated[Optional[str], typer.Option("--url", help="SQLAlchemy URL of the ledger database.")]
ConnOption = Annotated[Optional[str], typer.Option("--conn-id", help="Airflow connection id of the ledger.")]


def _fail(message: str) -> None:
    errors.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(1)


def _ledger(url: str | None, conn_id: str | None) -> Ledger:
    if url:
        return Ledger(url)
    if conn_id:
        from dp_operators.hooks.ledger import DPLedgerHook

        return DPLedgerHook(ledger_conn_id=conn_id).get_ledger()
    if os.environ.get("DP_LEDGER_URL"):
        return Ledger(os.environ["DP_LEDGER_URL"])
    _fail("say which ledger: --url sqlite:///ledger.db, --conn-id <airflow connection>, or set DP_LEDGER_URL")
    raise AssertionError("unreachable")


@ledger_app.command("init")
def ledger_init(url: UrlOption = None, conn_id: ConnOption = None) -> None:
    """Create the ledger's tables (idempotent) and record the schema version."""
    ledger = _ledger(url, conn_id)
    try:
        version = ledger.init_schema()
    except LedgerError as error:
        _fail(str(error))
    console.print(f"ledger schema version {version} ready at {ledger.engine.url.render_as_string()}")


@ledger_app.command("apply")
def ledger_apply(
    config: Annotated[Path, typer.Argument(help="The ledger configuration (config/ledgers.yaml).")],
    url: UrlOption = None,
    conn_id: ConnOption = None,
) -> None:
    """Create or update budget accounts from a ledger configuration file."""
    try:
        changes = _ledger(url, conn_id).apply_config(load_ledger_config(config))
    except (LedgerConfigError, LedgerError, ValueError) as error:
        _fail(str(error))
    for line in changes or ["no change"]:
        console.print(line)


@ledger_app.command("show")
def ledger_show(
    url: UrlOption = None,
    conn_id: ConnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Accounts: cap, spent, reserved and remaining in the account's unit, and as epsilon."""
    try:
        accounts = _ledger(url, conn_id).accounts()
    except LedgerError as error:
        _fail(str(error))
    rows = [
        {
            "account": a.name,
            "accountant": a.accountant,
            "unit": a.unit,
            "cap": str(a.cap),
            "spent": str(a.spent),
            "reserved": str(a.reserved),
            "remaining": str(a.remaining),
            "spent_epsilon": a.as_epsilon(a.spent),
            "cap_epsilon": a.as_epsilon(a.cap),
            "delta": None if a.delta is None else float(a.delta),
        }
        for a in accounts
    ]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table(title="Budget accounts")
    for column in ("account", "unit", "cap", "spent", "reserved", "remaining", "as epsilon (spent / cap)"):
        table.add_column(column)
    for row in rows:
        as_eps = (
            "-" if row["spent_epsilon"] is None
            else f"{row['spent_epsilon']:.4g} / {row['cap_epsilon']:.4g}"
            + (f" at delta {row['delta']:g}" if row["delta"] else "")
        )
        table.add_row(
            row["account"], row["unit"], _decimal(row["cap"]), _decimal(row["spent"]), _decimal(row["reserved"]),
            _decimal(row["remaining"]), as_eps,
        )
    console.print(table)


@ledger_app.command("history")
def ledger_history(
    account: Annotated[Optional[str], typer.Option(help="Only this budget account.")] = None,
    dag_id: Annotated[Optional[str], typer.Option("--dag-id", help="Only this DAG.")] = None,
    url: UrlOption = None,
    conn_id: ConnOption = None,
) -> None:
    """Charges, oldest first: release key, state and amount."""
    try:
        charges = _ledger(url, conn_id).charges(account=account, dag_id=dag_id)
    except LedgerError as error:
        _fail(str(error))
    table = Table(title="Charges")
    for column in ("id", "account", "dag_id", "run_id", "task_id", "release", "state", "amount", "created"):
        table.add_column(column)
    for c in charges:
        table.add_row(
            str(c["id"]), c["account"], c["dag_id"], c["run_id"], c["task_id"], c["release_name"], c["state"],
            _decimal(c["amount"]), str(c["created_at"])[:19],
        )
    console.print(table)


@spec_app.command("validate")
def spec_validate(spec: Annotated[Path, typer.Argument(help="A release spec YAML file.")]) -> None:
    """Validate a release spec; prints every problem with its field path."""
    try:
        loaded = load_spec(spec)
    except SpecError as error:
        _fail(str(error))
    console.print(f"{spec}: valid (release {loaded.release!r}, {len(loaded.aggregates)} aggregate(s))")


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
    release = json.loads(path.read_text(encoding="utf-8"))
    console.print(f"release [bold]{release['release']}[/bold] published to {path}", soft_wrap=True)
    charge = release["charge"]
    spent = ", ".join(f"{unit} {charge[unit]:g}" for unit in ("epsilon", "rho") if unit in charge)
    if charge.get("epsilon_at_delta") is not None and "rho" in charge:
        spent += f" (epsilon {charge['epsilon_at_delta']:.4g} at delta {charge['delta']:g})"
    console.print(f"run {release['release_key']['run_id']}; this release spent {spent}", highlight=False)
    level = f"{release['confidence']:.0%}"
    for name, aggregate in release["aggregates"].items():
        console.print(f"\n[bold]{name}[/bold] ({aggregate['kind']}, {aggregate['mechanism']})", highlight=False)
        table = Table()
        for column in aggregate["group_by"] + ["value", f"± ({level})"]:
            table.add_column(column, justify="right" if column in ("value",) else "left")
        rows = aggregate.get("rows") or [aggregate]
        for row in rows:
            value = row["value"]
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            table.add_row(*[str(row[c]) for c in aggregate["group_by"]], shown, f"{row['half_width']:.3g}")
        console.print(table)


def _decimal(text: str) -> str:
    from fractions import Fraction

    value = Fraction(text)
    return f"{float(value):.6g}" if value.denominator != 1 else str(value.numerator)


if __name__ == "__main__":  # pragma: no cover
    app()
