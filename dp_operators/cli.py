"""``dpctl``: the command line for privacy officers and pipeline owners.

Exit codes (every command; ``--help`` on each):

* 0 — success (``ledger verify``: the ledger is consistent; without the governor key it says on stderr that
  authenticity was not checked);
* 1 — an error or refusal: invalid spec or configuration, ledger not initialised or unreachable, unknown account or
  connection, a missing, unreadable or wrong key (``ledger apply`` without the governor key, a new account without
  the spend key), a change ``ledger apply`` refuses (lower a cap below spend, change an accountant, change the
  privacy unit of an account that was charged);
* 2 — usage error (unknown option, missing argument: typer/click's own);
* 3 — ``ledger verify`` found the ledger inconsistent: an audit event whose MAC does not match or whose signer has
  the wrong role, a transition the state machine forbids, an edited, inserted or deleted row, totals that disagree
  with the audit log, guard triggers changed or disabled (the first line names the first broken row).

The ledger is chosen with ``--url`` (a SQLAlchemy URL), else ``--conn-id`` (an Airflow connection id; from a shell
give it as ``AIRFLOW_CONN_<ID>`` in the environment, e.g. ``AIRFLOW_CONN_DP_LEDGER_DEFAULT='{"conn_type":
"dp_ledger", "extra": {"url": "postgresql+psycopg://user@db/ledger", "audit_key": "..."}}'``), else the
``DP_LEDGER_URL`` environment variable.

Keys (docs/adr/0020; ``dpctl ledger keygen`` makes one): the *governor key* (the privacy officer's: signs
``init`` upgrades, ``apply`` and optionally ``reconcile``) comes from ``--governor-key-file``, else
``DP_LEDGER_GOVERNOR_KEY``, else the ``--conn-id`` connection's extra ``governor_key`` (a connection only the officer
uses); the *spend key* (the workers') from ``--audit-key-file``, else ``DP_LEDGER_AUDIT_KEY``, else the ``--conn-id``
connection's extra ``audit_key``. A key file holds the current key on its first line and retired keys, which
``ledger verify`` still accepts, on later lines.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import itertools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dp_operators.accounting import ACCOUNTANTS
from dp_operators.ledger import (
    AuditKey,
    Keyring,
    Ledger,
    LedgerConfigError,
    LedgerError,
    LedgerGovernor,
    load_ledger_config,
)
from dp_operators.ledger.config import declared_accountants
from dp_operators.ledger.keys import GOVERNOR_KEY_ENV, SPEND_KEY_ENV, key_from_environment, read_key_file
from dp_operators.spec import SpecError, load_spec

app = typer.Typer(help="Differentially private releases: specs, budget ledger, releases.", no_args_is_help=True)
ledger_app = typer.Typer(help="The privacy-budget ledger.", no_args_is_help=True)
spec_app = typer.Typer(help="Release specs.", no_args_is_help=True)
release_app = typer.Typer(help="Published releases.", no_args_is_help=True)
app.add_typer(ledger_app, name="ledger")
app.add_typer(spec_app, name="spec")
app.add_typer(release_app, name="release")



def _output_width() -> int | None:
    """Width of the output: the terminal's own on a terminal; else ``COLUMNS`` if set, else 160 (so piped
    tables are not truncated at rich's default 80 columns)."""
    if sys.stdout.isatty():
        return None  # rich measures the terminal (and honours COLUMNS itself)
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else 160


# markup=False: messages carry user text (spec fields, account names, paths) that may contain square brackets,
# e.g. "bounds: [lower, upper]"; styling is applied with Text/style= instead of console markup.
console = Console(width=_output_width(), markup=False)
errors = Console(stderr=True, markup=False)

UrlOption = Annotated[Optional[str], typer.Option("--url", help="SQLAlchemy URL of the ledger database.")]
ConnOption = Annotated[
    Optional[str],
    typer.Option("--conn-id", help="Airflow connection id of the ledger (from a shell: set AIRFLOW_CONN_<ID>)."),
]
GovernorKeyFileOption = Annotated[
    Optional[Path],
    typer.Option(
        "--governor-key-file",
        help="File holding the governor key (first line; later lines: retired governor keys, for verify). "
        f"Default: ${GOVERNOR_KEY_ENV}, else the --conn-id connection's extra governor_key.",
    ),
]
AuditKeyFileOption = Annotated[
    Optional[Path],
    typer.Option(
        "--audit-key-file",
        help="File holding the spend key (first line; later lines: retired spend keys, for verify). "
        f"Default: ${SPEND_KEY_ENV}, else the --conn-id connection's extra audit_key.",
    ),
]

#: ``ledger verify`` found the ledger inconsistent (see the module docstring).
EXIT_INCONSISTENT = 3

#: ``ledger history`` prints a table when the charges fit in this many rows; longer histories stream as aligned
#: lines (a table needs every row in memory before it prints the first).
HISTORY_TABLE_ROWS = 1000


def _fail(message: str) -> None:
    errors.print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@dataclass(frozen=True)
class _Target:
    """Where the ledger is, how the user named it (for messages), and the keys its Airflow connection holds."""

    url: str
    how: str
    spend_key: AuditKey | None = None
    governor_key: AuditKey | None = None


def _locate(url: str | None, conn_id: str | None, *, create: bool = False) -> _Target:
    """The ledger named by --url, --conn-id or DP_LEDGER_URL (and, with --conn-id, the keys in its extra).

    Unless ``create`` (``ledger init`` only), a SQLite ledger whose file does not exist is refused: opening it would
    create an empty database file.
    """
    import sqlalchemy as sa

    if url:
        shown = sa.make_url(url).render_as_string(hide_password=True) if "://" in url else url
        target = _Target(url, f"--url {shown}")
    elif conn_id:
        from dp_operators.hooks.ledger import (
            DPLedgerHook,
            audit_key_from_connection,
            governor_key_from_connection,
            ledger_url_from_connection,
        )

        try:
            conn = DPLedgerHook.get_connection(conn_id)
            found = ledger_url_from_connection(conn)
        except Exception as error:  # Airflow raises its own not-found type; the message says what is missing
            _fail(
                f"cannot use Airflow connection {conn_id!r}: {error}. From a shell, define it as "
                f"AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\": \"dp_ledger\", \"extra\": {{\"url\": \"...\"}}}}'"
            )
            raise AssertionError("unreachable")
        try:
            target = _Target(
                found, f"--conn-id {conn_id}", audit_key_from_connection(conn), governor_key_from_connection(conn)
            )
        except ValueError as error:
            _fail(str(error))
            raise AssertionError("unreachable")
    elif os.environ.get("DP_LEDGER_URL"):
        target = _Target(os.environ["DP_LEDGER_URL"], "")
    else:
        _fail("say which ledger: --url sqlite:///ledger.db, --conn-id <airflow connection>, or set DP_LEDGER_URL")
        raise AssertionError("unreachable")
    if not create:
        try:
            engine_url = sa.make_url(target.url)
        except sa.exc.ArgumentError as error:
            _fail(f"not a SQLAlchemy URL: {error}")
            raise AssertionError("unreachable")
        database = engine_url.database
        if (
            engine_url.get_backend_name() == "sqlite"
            and database
            and database != ":memory:"
            and not database.startswith("file:")
            and not Path(database).exists()
        ):
            _fail(f"no ledger at {database}; run 'dpctl ledger init{' ' + target.how if target.how else ''}' first")
    return target


def _ledger(url: str | None, conn_id: str | None, *, create: bool = False) -> Ledger:
    """The spender's :class:`Ledger` named by --url, --conn-id or DP_LEDGER_URL, with the connection's spend key if
    it has one (see :func:`_locate`)."""
    target = _locate(url, conn_id, create=create)
    return Ledger(target.url, audit_key=target.spend_key)


def _key_file(option: str, path: Path) -> list[AuditKey]:
    """The keys in the file given to ``option``, one a line (exit 1 if it cannot be read or holds none); warns when
    other users may read it."""
    try:
        keys = read_key_file(path)
    except OSError as error:
        _fail(f"cannot read {option} {path}: {error.strerror or error}")
    except ValueError as error:
        _fail(str(error))
    if not keys:
        _fail(f"{option} {path} holds no key (make one with 'dpctl ledger keygen')")
    if os.name == "posix" and path.stat().st_mode & 0o077:
        errors.print(f"warning: {path} can be read by other users; 'chmod 600 {path}'", highlight=False, soft_wrap=True)
    return keys


def _role_keys(option: str, path: Path | None, variable: str, from_connection: AuditKey | None) -> list[AuditKey]:
    """One role's keys, current first then retired: from the key file ``path`` (every line), else environment
    ``variable``, else the key in the ``--conn-id`` connection's extra. Empty if none is given."""
    if path is not None:
        return _key_file(option, path)
    try:
        key = key_from_environment(variable)
    except ValueError as error:
        _fail(f"${variable}: {error}")
    if key is not None:
        return [key]
    return [from_connection] if from_connection is not None else []


def _keys(target: _Target, governor_key_file: Path | None, audit_key_file: Path | None):
    """``(governor keys, spend keys)`` given for ``target``, each current first then retired."""
    return (
        _role_keys("--governor-key-file", governor_key_file, GOVERNOR_KEY_ENV, target.governor_key),
        _role_keys("--audit-key-file", audit_key_file, SPEND_KEY_ENV, target.spend_key),
    )


def _governor(target: _Target, governor_keys: list[AuditKey], spend_keys: list[AuditKey]) -> LedgerGovernor:
    return LedgerGovernor(
        target.url,
        governor_key=governor_keys[0] if governor_keys else None,
        spend_key=spend_keys[0] if spend_keys else None,
    )


@contextlib.contextmanager
def _ledger_errors() -> Iterator[None]:
    """Turn the ledger's refusals and database failures into exit code 1 with the message."""
    import sqlalchemy as sa

    try:
        yield
    except (LedgerConfigError, LedgerError, ValueError) as error:
        _fail(str(error))
    except sa.exc.SQLAlchemyError as error:
        _fail(f"ledger database error: {getattr(error, 'orig', None) or error}")


@contextlib.contextmanager
def _stdout_pipe() -> Iterator[None]:
    """Stop quietly when the reader of a streamed output goes away (``dpctl ledger history | head``)."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit; point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0)


@ledger_app.command("keygen")
def ledger_keygen() -> None:
    """Print a new random audit key (256 bits as 64 hex digits) on stdout; run it once per role.

    The governor key signs governance events (caps, allowlists, accounts): only the privacy officer holds it. The
    spend key signs the tasks' spend events: the workers' ledger connection holds it (extra ``audit_key``), and the
    officer gives it to ``dpctl ledger apply`` so the accounts accept it. Store each in a file only its holder can
    read (``chmod 600``) or in a secrets backend.
    """
    typer.echo(AuditKey.generate().text)
    errors.print(
        f"keep it secret: a governor key goes only to the privacy officer (--governor-key-file or "
        f"{GOVERNOR_KEY_ENV}); a spend key goes in the workers' ledger connection (extra \"audit_key\") and to "
        f"'dpctl ledger apply' (--audit-key-file or {SPEND_KEY_ENV})",
        highlight=False,
        soft_wrap=True,
    )


@ledger_app.command("init")
def ledger_init(
    url: UrlOption = None,
    conn_id: ConnOption = None,
    governor_key_file: GovernorKeyFileOption = None,
    audit_key_file: AuditKeyFileOption = None,
) -> None:
    """Create the ledger's tables and guard triggers, or upgrade an older schema; record the schema version.

    Idempotent. Nothing else creates tables: the operators and the other commands refuse an uninitialised ledger.
    A new ledger needs no key (run it as the database role that should own the tables); an upgrade closes each
    account's older history with an event signed by the governor key (--governor-key-file or
    DP_LEDGER_GOVERNOR_KEY), and from schema 1 also records the spend key the accounts accept (--audit-key-file).
    """
    with _ledger_errors():
        target = _locate(url, conn_id, create=True)
        governor = _governor(target, *_keys(target, governor_key_file, audit_key_file))
        version = governor.init_schema()
    console.print(f"ledger schema version {version} ready at {governor.url}", highlight=False, soft_wrap=True)


@ledger_app.command("apply")
def ledger_apply(
    config: Annotated[Path, typer.Argument(help="The ledger configuration (config/ledgers.yaml).")],
    url: UrlOption = None,
    conn_id: ConnOption = None,
    governor_key_file: GovernorKeyFileOption = None,
    audit_key_file: AuditKeyFileOption = None,
    new_governor_key: Annotated[
        bool,
        typer.Option(
            "--new-governor-key",
            help="The governor key has not signed this ledger before (rotation): record it on every account.",
        ),
    ] = False,
) -> None:
    """Create or update budget accounts from a ledger configuration file (needs the governor key).

    The only way a cap changes. Every change is an audit event signed with the governor key, recording the
    configuration as written, the values stored, the previous values, the user and the host. With the spend key
    (--audit-key-file or DP_LEDGER_AUDIT_KEY; required to create an account), every account in the file accepts
    that key from now on: giving a new one rotates it. A cap below the spend so far, a change of accountant and a
    change of privacy unit once anything was charged are refused (exit 1) and nothing is changed.
    """
    with _ledger_errors():
        target = _locate(url, conn_id)
        governor_keys, spend_keys = _keys(target, governor_key_file, audit_key_file)
        if not governor_keys:
            _fail(
                "'dpctl ledger apply' signs governance events with the governor key: give --governor-key-file FILE "
                f"or set {GOVERNOR_KEY_ENV} (make one with 'dpctl ledger keygen'; only the privacy officer holds it)"
            )
        governor = _governor(target, governor_keys, spend_keys)
        try:
            parsed = load_ledger_config(config)
        except LedgerConfigError:
            # A changed accountant often fails validation too (zcdp -> pure_dp with its delta still there); the
            # accountant being fixed is the real problem, so say that first.
            with contextlib.suppress(LedgerError):
                governor.refuse_accountant_changes(declared_accountants(config))
            raise
        changes = governor.apply_config(parsed, new_governor_key=new_governor_key)
    for line in changes or ["no change"]:
        console.print(line, highlight=False, soft_wrap=True)


def _account_row(a) -> dict:
    mu = a.accountant == "gaussian_dp"
    return {
        "account": a.name,
        "accountant": a.accountant,
        "unit": a.unit,
        "cap": str(a.cap),
        "spent": str(a.spent),
        "reserved": str(a.reserved),
        "remaining": str(a.remaining),
        "delta": None if a.delta is None else str(a.delta),
        "delta_spent": str(a.delta_spent) if a.accountant == "approx_dp" else None,
        "cap_mu": float(a.cap) ** 0.5 if mu else None,
        "spent_mu": float(a.spent) ** 0.5 if mu else None,
        "spent_epsilon": a.as_epsilon(a.spent),
        "cap_epsilon": a.as_epsilon(a.cap),
        "privacy_unit": a.privacy_unit,
        "allowed_dags": list(a.allowed_dags),
    }


@ledger_app.command("show")
def ledger_show(
    url: UrlOption = None,
    conn_id: ConnOption = None,
    account: Annotated[Optional[str], typer.Option(help="Only this budget account.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (exact numbers as fractions).")] = False,
) -> None:
    """Accounts: cap, spent, reserved and remaining in the account's unit, and as epsilon.

    Units: epsilon (pure_dp, approx_dp; approx_dp also shows the delta spent), rho (zcdp), mu^2 (gaussian_dp; mu
    shown beside it). "As epsilon" is the spend and the cap converted at the account's delta (CKS 2020 for zcdp,
    Dong-Roth-Su for gaussian_dp), rounded up.
    """
    with _ledger_errors():
        ledger = _ledger(url, conn_id)
        accounts = [ledger.account(account)] if account else ledger.accounts()
        rows = [_account_row(a) for a in accounts]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table(title="Budget accounts")
    for column in ("account", "accountant", "unit", "cap", "spent", "reserved", "remaining",
                   "as epsilon (spent / cap)"):
        table.add_column(column, justify="right" if column in ("cap", "spent", "reserved", "remaining") else "left")
    for row in rows:
        if row["spent_epsilon"] is None:
            as_eps = "-"
        else:
            as_eps = f"{row['spent_epsilon']:.4g} / {row['cap_epsilon']:.4g}"
            if row["accountant"] == "approx_dp":
                as_eps += f", delta {_decimal(row['delta_spent'])} / {_decimal(row['delta'])}"
            elif row["delta"]:
                as_eps += f" at delta {_decimal(row['delta'])}"
        cap = _decimal(row["cap"]) + (f" (mu {row['cap_mu']:.4g})" if row["cap_mu"] is not None else "")
        spent = _decimal(row["spent"]) + (f" (mu {row['spent_mu']:.4g})" if row["spent_mu"] is not None else "")
        table.add_row(
            row["account"], row["accountant"], row["unit"], cap, spent, _decimal(row["reserved"]),
            _decimal(row["remaining"]), as_eps,
        )
    console.print(table)


class ChargeState(str, Enum):
    """The states of a charge (``ledger history --state``)."""

    reserved = "reserved"
    committed = "committed"
    released = "released"
    abandoned = "abandoned"


def _date(value: Optional[str], option: str) -> Optional[dt.datetime]:
    if value is None:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an ISO date or date-time (e.g. 2026-01-31)", param_hint=option)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


_HISTORY_COLUMNS = ("id", "account", "dag_id", "run_id", "task_id", "release", "attempt", "state", "amount", "created")


def _history_cells(c: dict) -> list[str]:
    amount = _decimal(c["amount"]) + (f" (delta {_decimal(c['delta_amount'])})" if c["delta_amount"] != "0" else "")
    return [
        str(c["id"]), c["account"], c["dag_id"], c["run_id"], c["task_id"], c["release_name"], str(c["attempt"]),
        c["state"], amount, str(c["created_at"])[:19],
    ]


def _print_history(charges: Iterator[dict], as_json: bool) -> tuple[int, int | None]:
    """Print ``charges`` as they stream in; returns ``(how many, id of the last)``.

    JSON lines are written one by one. Otherwise up to :data:`HISTORY_TABLE_ROWS` charges are held: if that is
    all of them they print as a table; else as aligned lines (column widths from the first rows held), streamed,
    so memory stays flat however long the history.
    """
    out = sys.stdout
    count, last = 0, None
    if as_json:
        for charge in charges:
            out.write(json.dumps(charge, default=str, sort_keys=True) + "\n")
            count, last = count + 1, charge["id"]
        return count, last
    held: list[list[str]] = []
    for charge in charges:
        held.append(_history_cells(charge))
        count, last = count + 1, charge["id"]
        if len(held) > HISTORY_TABLE_ROWS:
            break
    else:
        table = Table(title="Charges")
        for column in _HISTORY_COLUMNS:
            table.add_column(column, justify="right" if column in ("id", "attempt") else "left")
        for cells in held:
            table.add_row(*cells)
        console.print(table)
        return count, last
    widths = [max(len(column), *(len(cells[i]) for cells in held)) for i, column in enumerate(_HISTORY_COLUMNS)]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip() + "\n"

    out.write(line(list(_HISTORY_COLUMNS)))
    for cells in held:
        out.write(line(cells))
    held.clear()
    for charge in charges:
        out.write(line(_history_cells(charge)))
        count, last = count + 1, charge["id"]
    return count, last


@ledger_app.command("history")
def ledger_history(
    account: Annotated[Optional[str], typer.Option(help="Only this budget account.")] = None,
    dag_id: Annotated[Optional[str], typer.Option("--dag-id", help="Only this DAG.")] = None,
    state: Annotated[Optional[ChargeState], typer.Option(help="Only charges in this state.")] = None,
    since: Annotated[Optional[str], typer.Option(help="Charges created at or after this ISO date (UTC).")] = None,
    until: Annotated[Optional[str], typer.Option(help="Charges created before this ISO date (UTC).")] = None,
    limit: Annotated[
        Optional[int],
        typer.Option(min=1, help="At most this many charges (a page); the next page's --after is printed."),
    ] = None,
    after: Annotated[
        Optional[int],
        typer.Option(min=0, help="Only charges with an id above this one (the cursor of the next page)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines instead of a table.")] = False,
    url: UrlOption = None,
    conn_id: ConnOption = None,
) -> None:
    """Charges, oldest first: release key, attempt, state and amount (filter by account, DAG, state, date).

    Streams from the database, so memory stays flat however long the ledger. Page with --limit N: when more charges
    follow, "more: --after ID" on stderr gives the option that prints the next page. A table needs every row before
    it prints, so a history longer than 1000 charges (without --limit) prints as aligned lines instead; --json
    prints one JSON object a line.
    """
    with _ledger_errors(), _stdout_pipe():
        charges = _ledger(url, conn_id).charges(
            account=account,
            dag_id=dag_id,
            state=state.value if state else None,
            since=_date(since, "--since"),
            until=_date(until, "--until"),
            after=after,
            limit=None if limit is None else limit + 1,  # one more than shown tells whether a next page exists
        )
        page = charges if limit is None else itertools.islice(charges, limit)
        count, last = _print_history(page, as_json)
        more = limit is not None and count == limit and next(charges, None) is not None
        charges.close()
    if more:
        errors.print(f"more: --after {last}", highlight=False)


def _print_verify_report(report, note: str | None = None) -> None:
    """A consistent ledger's summary and chain heads on stdout; an inconsistent one's problems on stderr (the first
    line names the first broken row), then exit 3. ``note`` (authenticity not checked) goes to stderr last."""
    if not report.problems:
        console.print(
            f"ledger consistent: {report.events} audit events, {report.accounts} accounts, {report.charges} charges"
            + ("; every event authenticated" if report.authenticated else ""),
            highlight=False,
        )
        for name, head in sorted(report.heads.items()):
            console.print(f"  {name}: chain head {head}", highlight=False, soft_wrap=True)
        if note:
            errors.print(note, highlight=False, soft_wrap=True)
        return
    errors.print(
        Text.assemble(("ledger inconsistent:", "red"), f" first broken: {report.problems[0]}"),
        highlight=False,
        soft_wrap=True,
    )
    for problem in report.problems[1:50]:
        errors.print(f"  also: {problem}", highlight=False, soft_wrap=True)
    if len(report.problems) > 50:
        errors.print(f"  ... and {len(report.problems) - 50} more", highlight=False, soft_wrap=True)
    if note:
        errors.print(note, highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_INCONSISTENT)


@ledger_app.command("verify")
def ledger_verify(
    url: UrlOption = None,
    conn_id: ConnOption = None,
    governor_key_file: GovernorKeyFileOption = None,
    audit_key_file: AuditKeyFileOption = None,
    keys: Annotated[
        Optional[Path],
        typer.Option("--keys", help="More keys to check MACs with, one a line (e.g. retired spend keys)."),
    ] = None,
    config: Annotated[
        Optional[Path],
        typer.Option("--config", help="Also check that the accounts match this ledger configuration (ledgers.yaml)."),
    ] = None,
) -> None:
    """Replay every account's audit chain under the ledger's state machine and cross-check it with every charge,
    every account row and the guard triggers; with the keys, check every event's MAC and signer.

    Authenticity needs the governor key (--governor-key-file or DP_LEDGER_GOVERNOR_KEY) and the spend keys
    (--audit-key-file or DP_LEDGER_AUDIT_KEY; retired keys on later lines of the key files, or in --keys). Without
    the governor key every other check runs and stderr says authenticity was not checked.

    Exit 0 and print each account's chain head (worth recording outside the database: a chain rewritten from the
    start by someone with every key would then no longer match); exit 3 naming the first broken row and every
    other inconsistency found.
    """
    with _ledger_errors():
        target = _locate(url, conn_id)
        governor_keys, spend_keys = _keys(target, governor_key_file, audit_key_file)
        more_keys = _key_file("--keys", keys) if keys is not None else []
        parsed = load_ledger_config(config) if config is not None else None
        governor = _governor(target, governor_keys, spend_keys)
        if not governor_keys:
            if spend_keys or more_keys:
                note = (
                    f"authenticity not checked: no governor key given (--governor-key-file or {GOVERNOR_KEY_ENV}); "
                    "governance events cannot be checked without it"
                )
            else:
                note = (
                    "authenticity not checked: no keys given (--governor-key-file/--audit-key-file or "
                    f"{GOVERNOR_KEY_ENV}/{SPEND_KEY_ENV})"
                )
            report = governor.verify(Keyring(), parsed)
        else:
            note = None
            if not spend_keys and not more_keys:
                _fail(
                    f"verify checks spend events with the spend key: give --audit-key-file or {SPEND_KEY_ENV} too "
                    "(retired spend keys on later lines of the file, or in --keys)"
                )
            report = governor.verify(
                Keyring([*governor_keys, *spend_keys, *more_keys]),
                parsed,
                governor_key_ids={key.key_id for key in governor_keys},
            )
    _print_verify_report(report, note)


_RECONCILED_COLUMNS = ("id", "account", "dag_id", "run_id", "task_id", "release", "attempt", "amount", "lease ended")


@ledger_app.command("reconcile")
def ledger_reconcile(
    url: UrlOption = None,
    conn_id: ConnOption = None,
    governor_key_file: GovernorKeyFileOption = None,
    audit_key_file: AuditKeyFileOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the abandoned charges as JSON.")] = False,
) -> None:
    """Mark every reservation whose lease has expired (its attempt died without committing or releasing) abandoned,
    and list them. Abandoned charges stay counted as spent: their noise may have been drawn.

    Signs the ``abandoned`` events with the governor key if given (--governor-key-file or DP_LEDGER_GOVERNOR_KEY),
    else with the spend key (--audit-key-file, DP_LEDGER_AUDIT_KEY or the connection's extra audit_key).
    Safe to run at any time (e.g. on a schedule): a live reservation's lease is renewed by its owner.
    """
    with _ledger_errors():
        target = _locate(url, conn_id)
        governor_keys, spend_keys = _keys(target, governor_key_file, audit_key_file)
        if governor_keys:
            abandoned = _governor(target, governor_keys, spend_keys).reconcile()
        elif spend_keys:
            abandoned = Ledger(target.url, audit_key=spend_keys[0]).reconcile()
        else:
            _fail(
                "reconcile signs the 'abandoned' events: give the spend key (--audit-key-file, "
                f"{SPEND_KEY_ENV} or the --conn-id connection's extra audit_key) or the governor key "
                f"(--governor-key-file or {GOVERNOR_KEY_ENV})"
            )
    if as_json:
        typer.echo(json.dumps(abandoned, default=str, sort_keys=True))
        return
    if not abandoned:
        console.print("no expired reservations", highlight=False)
        return
    table = Table(title=f"Abandoned {len(abandoned)} expired reservation(s) (still counted as spent)")
    for column in _RECONCILED_COLUMNS:
        table.add_column(column)
    for c in abandoned:
        amount = _decimal(c["amount"]) + (f" (delta {_decimal(c['delta_amount'])})" if c["delta_amount"] != "0" else "")
        table.add_row(
            str(c["id"]), c["account"], c["dag_id"], c["run_id"], c["task_id"], c["release_name"], str(c["attempt"]),
            amount, str(c["lease_expires_at"] or "-")[:19],
        )
    console.print(table)


@ledger_app.command("export")
def ledger_export(
    fmt: Annotated[str, typer.Option("--format", help="jsonl (one JSON object a line) or csv.")] = "jsonl",
    what: Annotated[str, typer.Option(help="events (the audit log) or charges (without outputs).")] = "events",
    account: Annotated[Optional[str], typer.Option(help="Only this budget account.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    url: UrlOption = None,
    conn_id: ConnOption = None,
) -> None:
    """Export the audit log (every column, MACs included, so it can be re-verified elsewhere) or the charges
    (without outputs and token hashes). Streams: memory stays flat however long the ledger."""
    if fmt not in ("jsonl", "csv"):
        raise typer.BadParameter("use jsonl or csv", param_hint="--format")
    if what not in ("events", "charges"):
        raise typer.BadParameter("use events or charges", param_hint="--what")
    from dp_operators.ledger import schema

    with _ledger_errors():
        ledger = _ledger(url, conn_id)
        ledger.check_schema()
        rows = ledger.events(account) if what == "events" else ledger.charges(account=account)
        count = 0
        try:
            destination = (
                output.open("w", encoding="utf-8", newline="") if output else contextlib.nullcontext(sys.stdout)
            )
        except OSError as error:
            _fail(f"cannot write {output}: {error.strerror or error}")
        with _stdout_pipe(), destination as out:
            if fmt == "jsonl":
                for row in rows:
                    out.write(json.dumps(row, default=str, sort_keys=True, ensure_ascii=False) + "\n")
                    count += 1
            else:
                table = schema.audit_events if what == "events" else schema.charges
                hidden = () if what == "events" else ("output", "token_hash")  # what Ledger.charges leaves out
                columns = [c.name for c in table.c if c.name not in hidden]
                writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
                writer.writeheader()
                for row in rows:
                    writer.writerow({name: row.get(name) for name in columns})
                    count += 1
    if output:
        errors.print(f"wrote {count} {what} to {output}", highlight=False, soft_wrap=True)


@ledger_app.command("roles")
def ledger_roles(
    spender_role: Annotated[
        str, typer.Option("--spender-role", help="The database role release tasks connect as.")
    ] = "dp_ledger_spender",
    governor_role: Annotated[
        str, typer.Option("--governor-role", help="The database role the privacy officer's dpctl connects as.")
    ] = "dp_ledger_governor",
    create: Annotated[bool, typer.Option("--create", help="Also create the roles (NOLOGIN) if missing.")] = False,
    execute: Annotated[
        bool, typer.Option("--execute", help="Run the statements on the ledger (as the tables' owner).")
    ] = False,
    url: UrlOption = None,
    conn_id: ConnOption = None,
) -> None:
    """PostgreSQL only: print (or with --execute run) the GRANTs that let the spender role only spend and the
    governor role govern: neither may change or disable the guard triggers, and the spender has no privilege on
    caps, allowlists, accountants or accounts (see docs/ledger.md). Idempotent.

    Printing needs no ledger; --execute runs them on the ledger named by --url, --conn-id or DP_LEDGER_URL,
    connected as the role that owns the tables (the one that ran 'dpctl ledger init').
    """
    import sqlalchemy as sa

    from dp_operators.ledger import roles  # the PostgreSQL grants; only this command needs them

    with _ledger_errors():
        named = url or conn_id or os.environ.get("DP_LEDGER_URL")
        target = _locate(url, conn_id) if named or execute else None
        if target is not None and sa.make_url(target.url).get_backend_name() != "postgresql":
            raise ValueError(
                f"database roles are a PostgreSQL feature; this ledger is not PostgreSQL ({target.how or target.url}); "
                "on SQLite, file permissions decide who may write (docs/ledger.md)"
            )
        if not execute:
            for statement in roles.role_statements(spender_role, governor_role, create=create):
                typer.echo(statement.rstrip().rstrip(";") + ";")
            return
        assert target is not None
        from dp_operators.ledger.store import create_ledger_engine

        engine = create_ledger_engine(target.url)
        try:
            done = roles.apply_roles(engine, spender_role, governor_role, create=create)
        finally:
            engine.dispose()
    console.print(
        f"granted the ledger privileges to {spender_role!r} (spender) and {governor_role!r} (governor): "
        f"{len(done)} statements run on {target.how or 'DP_LEDGER_URL'}",
        highlight=False,
        soft_wrap=True,
    )


@spec_app.command("validate")
def spec_validate(spec: Annotated[Path, typer.Argument(help="A release spec YAML file.")]) -> None:
    """Validate a release spec; prints every problem with its field path, then plans it (float sums that cannot
    carry the grid, totals that can reach the saturation limit, noise beyond the engine's range are refused here,
    as they would be at the release, before any budget)."""
    from dp_operators.release import ReleaseConfigError, plan_release

    try:
        loaded = load_spec(spec)
        plan_release(loaded)
    except SpecError as error:
        _fail(str(error))
    except ReleaseConfigError as error:
        _fail(f"{spec}: the spec cannot be planned: {error}")
    console.print(f"{spec}: valid (release {loaded.release!r}, {len(loaded.aggregates)} aggregate(s))", highlight=False)


#: The accountants of budget accounts (``spec plan --accountant``), from the one list in the accounting package.
Accountant = Enum("Accountant", {name: name for name in ACCOUNTANTS}, type=str)


@spec_app.command("plan")
def spec_plan(
    spec: Annotated[Path, typer.Argument(help="A release spec YAML file.")],
    url: UrlOption = None,
    conn_id: ConnOption = None,
    accountant: Annotated[
        Optional[Accountant],
        typer.Option(help="Plan for an account with this accountant (default: the account's, from a ledger or "
                     "--ledger-config; else the written budgets)."),
    ] = None,
    ledger_config: Annotated[
        Optional[Path],
        typer.Option("--ledger-config", help="Read the spec's budget account from this ledger configuration "
                     "(config/ledgers.yaml) instead of a ledger database."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show what a spec will do, before any data is read or budget spent: per noised step the mechanism, scale,
    charge (in the account's unit and as epsilon) and the half-width of each value's interval; with a ledger
    (--url, --conn-id or DP_LEDGER_URL) also how many more runs the budget account can fund.

    `mechanism: auto` chooses by the cost on the account the release is charged to, so the plan needs its
    accountant: the ledger's account, else the account in --ledger-config, else --accountant. Without any of
    them, auto compares mechanisms at the written budgets (which on a zcdp account can cost more than needed).
    """
    from dp_operators.accounting import IncompatibleAccountantError, epsilon_at_delta, unit_of
    from dp_operators.release import ReleaseConfigError, plan_release

    try:
        loaded = load_spec(spec)
    except SpecError as error:
        _fail(str(error))
    account = None
    chosen = accountant.value if accountant is not None else None
    delta = None
    if url or conn_id or os.environ.get("DP_LEDGER_URL"):
        with _ledger_errors():
            account = _ledger(url, conn_id).account(loaded.budget_account)
        if account.privacy_unit != loaded.privacy_unit:
            _fail(
                f"budget account {account.name!r} is for privacy unit {account.privacy_unit!r} but the spec protects "
                f"{loaded.privacy_unit!r}: a release would be refused (ReleaseConfigError), since a budget only "
                "composes over one privacy unit. Point budget_account at an account for "
                f"{loaded.privacy_unit!r}, or fix the spec's privacy_unit"
            )
        source, found, delta = "the ledger's account", account.accountant, account.delta
    elif ledger_config is not None:
        try:
            config = load_ledger_config(ledger_config)
        except LedgerConfigError as error:
            _fail(str(error))
        if loaded.budget_account not in config.accounts:
            _fail(
                f"{ledger_config} has no account {loaded.budget_account!r} (the spec's budget_account); it defines "
                f"{sorted(config.accounts)}"
            )
        configured = config.accounts[loaded.budget_account]
        source = f"account {loaded.budget_account!r} in {ledger_config}"
        found, delta = configured.accountant, configured.delta
    else:
        source, found = None, None
    if found is not None:
        if chosen is not None and chosen != found:
            _fail(f"--accountant {chosen} disagrees with {source}, whose accountant is {found}; drop --accountant")
        chosen = found
    try:
        plan = plan_release(loaded, accountant=chosen)
    except ReleaseConfigError as error:
        _fail(f"{spec}: {error}")
    alpha = 1 - loaded.confidence

    def as_epsilon(amount):
        return account.as_epsilon(amount) if account is not None else epsilon_at_delta(amount, chosen, delta)

    try:
        rows = [_plan_row(step, chosen, as_epsilon, alpha) for step in plan.steps]
        total = plan.charge() if chosen else None
    except IncompatibleAccountantError as error:
        _fail(f"budget account {loaded.budget_account!r} ({chosen}): {error}")
    summary: dict = {
        "release": loaded.release, "budget_account": loaded.budget_account, "accountant": chosen, "steps": rows,
    }
    if chosen is not None:
        summary.update(
            unit=unit_of(chosen),
            charge_per_run=str(total),
            charge_per_run_as_epsilon=as_epsilon(total),
            delta=None if delta is None else float(delta),
        )
        delta_per_run = None
        if chosen == "approx_dp":  # an approx_dp account also spends delta per run (basic composition)
            delta_per_run = plan.delta()
            # the run's guarantee is (charge_per_run, delta_per_run): its delta, not the account's delta cap
            summary.update(delta=float(delta_per_run), delta_per_run=str(delta_per_run))
    if account is not None:
        runs, limit = _runs_remaining(account, total, delta_per_run)
        summary.update(remaining=str(account.remaining))
        remaining_delta = _remaining_delta(account)
        if remaining_delta is not None:
            summary["delta_remaining"] = str(remaining_delta)
        summary.update(runs_remaining=runs, runs_limited_by=limit)
    if as_json:
        console.print_json(json.dumps(summary))
        return
    level = f"{loaded.confidence:.0%}"
    table = Table(title=f"Plan of release {loaded.release!r} (no data read, nothing spent)", title_justify="left")
    columns = ["aggregate", "component", "mechanism", "scale", "sensitivity (L1 / L2)", "L0", "calibrated to"]
    columns += [f"charge ({unit_of(chosen)})", "charge as epsilon"] if chosen else []
    columns += [f"± ({level})", "partitions"]
    for column in columns:
        table.add_column(column)
    for row in rows:
        cells = [
            row["aggregate"], row["component"], row["mechanism"], row["scale"],
            f"{row['l1_sensitivity']:.6g} / {row['l2_sensitivity']:.6g}", row["l0"], row["calibrated_to"],
        ]
        if chosen:
            eps = row["charge_as_epsilon"]
            cells += [_decimal(row["charge"]), "-" if eps is None else f"{eps:.4g}"]
        cells += [f"{row['half_width']:.4g}", str(row["partitions"] if row["partitions"] is not None else "selected")]
        table.add_row(*cells)
    console.print(table)
    if chosen is None:
        console.print(
            "no accountant given (a ledger, --ledger-config or --accountant): charges not shown, and mechanism auto "
            "compared mechanisms at the written budgets"
        )
        return
    unit = unit_of(chosen)
    as_eps = summary["charge_per_run_as_epsilon"]
    line = f"charge per run ({chosen}): {unit} {_decimal(str(total))}"
    if "delta_per_run" in summary:
        line += f", delta {float(delta_per_run):.6g}"
    if as_eps is not None and unit != "epsilon":
        line += f" (epsilon {as_eps:.4g}" + (f" at delta {float(delta):g})" if delta else ")")
    if account is not None:
        left = f"{unit} {_decimal(str(account.remaining))}"
        if remaining_delta is not None:
            left += f" and delta {float(remaining_delta):.6g}"
        runs = summary["runs_remaining"]
        line += f"; account {account.name!r} has {left} left: " + (
            "no run limit" if runs is None else f"{runs} more run(s)"
        )
        if summary["runs_limited_by"] == "delta":
            line += " (limited by delta)"
    console.print(line, highlight=False)


def _remaining_delta(account) -> Fraction | None:
    """The delta an ``approx_dp`` ledger account has left, exact and rounded down as the ledger's reserve does;
    ``None`` for other accountants (their delta is a reporting delta, never spent)."""
    from fractions import Fraction

    from dp_operators.accounting import round_down

    if account.accountant != "approx_dp" or account.delta is None:
        return None
    return max(round_down(Fraction(account.delta) - Fraction(account.delta_spent)), Fraction(0))


def _runs_remaining(account, charge: Fraction, delta_charge: Fraction | None) -> tuple[int | None, str | None]:
    """How many more runs a ledger ``account`` (an AccountStatus) can fund at ``charge`` (in the account's unit) and
    ``delta_charge`` (the delta a run spends on an ``approx_dp`` account; ``None`` or 0 otherwise) per run.

    Exact (Fractions): floor(remaining / per-run charge) in each dimension, the per-run charges rounded up as the
    ledger's ``reserve`` rounds them; a dimension whose per-run charge is 0 does not limit. Returns
    ``(runs, dimension)``: the minimum over the dimensions and the one that sets it (the account's unit, e.g.
    ``"epsilon"`` or ``"rho"``, on a tie; ``"delta"`` only when delta admits strictly fewer runs), or
    ``(None, None)`` when no dimension is charged.
    """
    from fractions import Fraction

    from dp_operators.accounting import round_up, unit_of

    limits: list[tuple[int, str]] = []
    charge = round_up(Fraction(charge))
    if charge > 0:
        limits.append((int(Fraction(account.remaining) // charge), unit_of(account.accountant)))
    remaining_delta = _remaining_delta(account)
    delta_charge = round_up(Fraction(delta_charge or 0))
    if remaining_delta is not None and delta_charge > 0:
        limits.append((int(remaining_delta // delta_charge), "delta"))
    if not limits:
        return None, None
    return min(limits, key=lambda limit: limit[0])  # min keeps the first of equals: the account's unit on a tie


def _plan_row(step, accountant: str | None, as_epsilon, alpha: float) -> dict:
    """One noised step of a plan as plain JSON (public parameters only)."""
    described = step.describe()
    scale = (
        f"b = {described['scale']:.6g}" if step.mechanism == "discrete_laplace" else f"sigma = {described['sigma']:.6g}"
    )
    if step.threshold is not None:
        scale += f", threshold {step.threshold}"
    budget = ", ".join(f"{name} {value:g}" for name, value in described["calibrated_to"].items())
    l0 = str(step.l0)
    if "max_partitions_contributed_declared" in described:
        l0 += f" (declared {described['max_partitions_contributed_declared']}, capped by the partitions)"
    row = {
        "aggregate": step.aggregate,
        "component": step.component,
        "mechanism": step.mechanism,
        "scale": scale,
        "l1_sensitivity": described["l1_sensitivity"],
        "l2_sensitivity": described["l2_sensitivity"],
        "l0": l0,
        "calibrated_to": budget,
        "half_width": step.half_width(alpha),
        "partitions": step.partitions,
        "noise": described,
    }
    if accountant is not None:
        from dp_operators.accounting import charge_in_account_unit

        charge = charge_in_account_unit(step.privacy_loss(accountant), accountant)
        row.update(charge=str(charge), charge_as_epsilon=as_epsilon(charge))
    return row


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


def _decimal(text: str) -> str:
    from fractions import Fraction

    value = Fraction(text)
    return f"{float(value):.6g}" if value.denominator != 1 else str(value.numerator)


if __name__ == "__main__":  # pragma: no cover
    app()
