"""What every ``dpctl`` command shares: the Typer apps, the consoles, the ledger options, where the ledger is and
its keys, and how ledger errors become exit codes.

The command line for privacy officers and pipeline owners.

Exit codes (every command; ``--help`` on each):

* 0 — success (``ledger verify``: the ledger is consistent; without the governor key it says on stderr that
  authenticity was not checked);
* 1 — an error or refusal: invalid spec or configuration, ledger not initialised or unreachable, unknown account or
  connection, a missing, unreadable or wrong key (``ledger apply`` without the governor key, a new account without
  the spend key), a change ``ledger apply`` refuses (lower a cap below spend, change an accountant, change the
  privacy unit of an account that was charged);
* 2 — usage error (unknown option, missing argument: typer/click's own);
* 3 — ``ledger verify`` found the ledger inconsistent (``release verify``: a published file differs from the ledger, is not in it, or is not a release): an audit event whose MAC does not match or whose signer has
  the wrong role, a transition the state machine forbids, an edited, inserted or deleted row, totals that disagree
  with the audit log, guard triggers changed or disabled (the first line names the first broken row).

The ledger is chosen with ``--url`` (a SQLAlchemy URL), else ``--conn-id`` (an Airflow connection id; from a shell
give it as ``AIRFLOW_CONN_<ID>`` in the environment, e.g. ``AIRFLOW_CONN_DP_LEDGER_DEFAULT='{"conn_type":
"dp_ledger", "extra": {"url": "postgresql+psycopg://user@db/ledger", "audit_key": "..."}}'``), else the
``DP_LEDGER_URL`` environment variable.

Keys (docs/adr/0020; ``dpctl ledger keygen`` makes one): the *governor key* (the privacy officer's: signs
``init`` upgrades, ``apply`` and optionally ``reconcile``) comes from ``--governor-key-file``, else the ``--conn-id``
connection's extra ``governor_key`` (a connection only the officer uses), else ``DP_LEDGER_GOVERNOR_KEY``; the *spend
key* (the workers') from ``--audit-key-file``, else the ``--conn-id`` connection's extra ``audit_key``, else
``DP_LEDGER_AUDIT_KEY``. What the command line names (a file, a connection) wins over the environment, as ``--url``
and ``--conn-id`` win over ``DP_LEDGER_URL``. A key file holds the current key on its first line and retired keys, which
``ledger verify`` still accepts, on later lines.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

# Only the light ledger modules (errors, keys: the standard library) at import time: SQLAlchemy, the ledger's
# tables and the configuration models load inside the commands that open a ledger, so `dpctl --help` and
# `dpctl spec ...` without a ledger start quickly (tests/test_lazy_imports.py).
from dp_operators.ledger import AuditKey, LedgerError
from dp_operators.ledger.bounded import visible
from dp_operators.ledger.keys import GOVERNOR_KEY_ENV, SPEND_KEY_ENV, key_from_environment, read_key_file

if TYPE_CHECKING:
    from dp_operators.ledger import Ledger, LedgerGovernor

app = typer.Typer(help="Differentially private releases: specs, budget ledger, releases.", no_args_is_help=True)
ledger_app = typer.Typer(help="The privacy-budget ledger.", no_args_is_help=True)
spec_app = typer.Typer(help="Release specs.", no_args_is_help=True)
release_app = typer.Typer(help="Published releases.", no_args_is_help=True)
app.add_typer(ledger_app, name="ledger")
app.add_typer(spec_app, name="spec")
app.add_typer(release_app, name="release")


#: The width of output that is not a terminal and has no ``COLUMNS``: wider than any table, so that a table is
#: printed at its natural width and nothing in it is cut or folded (``dpctl spec plan > plan.txt``).
UNLIMITED_WIDTH = 100_000


def _output_width() -> int | None:
    """Width of the output: the terminal's own on a terminal; else ``COLUMNS`` if set (the reader asked for that
    width: long cells fold), else :data:`UNLIMITED_WIDTH` (piped tables keep every name whole)."""
    if sys.stdout.isatty():
        return None  # rich measures the terminal (and honours COLUMNS itself)
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else UNLIMITED_WIDTH


# markup=False: messages carry user text (spec fields, account names, paths) that may contain square brackets,
# e.g. "bounds: [lower, upper]"; styling is applied with Text/style= instead of console markup.
# emoji=False: a name such as ":warning:" prints as written, not as an emoji.
console = Console(width=_output_width(), markup=False, emoji=False)
errors = Console(stderr=True, markup=False, emoji=False)

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
        f"Default: the --conn-id connection's extra governor_key, else ${GOVERNOR_KEY_ENV}.",
    ),
]
AuditKeyFileOption = Annotated[
    Optional[Path],
    typer.Option(
        "--audit-key-file",
        help="File holding the spend key (first line; later lines: retired spend keys, for verify). "
        f"Default: the --conn-id connection's extra audit_key, else ${SPEND_KEY_ENV}.",
    ),
]

#: ``ledger verify`` found the ledger inconsistent (see the module docstring).
EXIT_INCONSISTENT = 3


def visible_lines(text: str) -> str:
    """``text`` made safe to print (:func:`~dp_operators.ledger.bounded.visible`), keeping its line breaks: for
    messages of several lines, which may quote what the ledger holds."""
    return "\n".join(visible(line) for line in text.split("\n"))


def visible_json(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``, indented or not) with every character Python does not
    call printable written as a JSON escape (``\\u202e``; a character beyond the BMP as its surrogate pair): the same
    JSON value, nothing a terminal acts on, and letters of any script as they are. ``json.dumps`` has already
    escaped the C0 controls inside strings; a line break left is the indentation's."""
    if all(line.isprintable() for line in text.split("\n")):
        return text
    out = []
    for char in text:
        if char.isprintable() or char == "\n":
            out.append(char)
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            high, low = divmod(ord(char) - 0x10000, 0x400)
            out.append(f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}")
    return "".join(out)


def _fail(message: str) -> None:
    errors.print(Text.assemble(("error:", "red"), " ", visible_lines(message)), highlight=False, soft_wrap=True)
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
        try:
            engine_url.get_dialect()
        except sa.exc.NoSuchModuleError:
            _fail(f"{target.url!r} is not a ledger database URL this installation can open: use sqlite:///PATH "
                  "(a file; four slashes for an absolute path) or postgresql+psycopg://USER@HOST/DATABASE")
            raise AssertionError("unreachable")
        database = engine_url.database
        if (
            engine_url.get_backend_name() == "sqlite"
            and database
            and database != ":memory:"
            and not database.startswith("file:")
            and not Path(database).exists()
        ):
            hint = ""
            if not Path(database).is_absolute() and Path("/" + database).exists():
                hint = (f" (did you mean the file /{database}? An absolute path takes four slashes: "
                        f"sqlite:////{database})")
            _fail(f"no ledger at {database}{hint}; 'dpctl ledger init{' ' + target.how if target.how else ''}' "
                  "makes a new, empty ledger there: if the ledger exists elsewhere, point at it instead")
    return target


def _ledger(url: str | None, conn_id: str | None, *, create: bool = False) -> Ledger:
    """The spender's :class:`Ledger` named by --url, --conn-id or DP_LEDGER_URL, with the connection's spend key if
    it has one (see :func:`_locate`)."""
    from dp_operators.ledger import Ledger

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
    """One role's keys, current first then retired: from the key file ``path`` (every line), else the key in the
    ``--conn-id`` connection's extra, else environment ``variable``. Empty if none is given."""
    if path is not None:
        return _key_file(option, path)
    if from_connection is not None:  # named on the command line: wins over a key the shell happens to export
        return [from_connection]
    try:
        key = key_from_environment(variable)
    except ValueError as error:
        _fail(f"${variable}: {error}")
    return [key] if key is not None else []


def _keys(target: _Target, governor_key_file: Path | None, audit_key_file: Path | None):
    """``(governor keys, spend keys)`` given for ``target``, each current first then retired."""
    return (
        _role_keys("--governor-key-file", governor_key_file, GOVERNOR_KEY_ENV, target.governor_key),
        _role_keys("--audit-key-file", audit_key_file, SPEND_KEY_ENV, target.spend_key),
    )


def _governor(target: _Target, governor_keys: list[AuditKey], spend_keys: list[AuditKey]) -> LedgerGovernor:
    from dp_operators.ledger import LedgerGovernor

    return LedgerGovernor(
        target.url,
        governor_key=governor_keys[0] if governor_keys else None,
        spend_key=spend_keys[0] if spend_keys else None,
    )


@contextlib.contextmanager
def _ledger_errors() -> Iterator[None]:
    """Turn the ledger's refusals and database failures into exit code 1 with the message."""
    import sqlalchemy as sa

    from dp_operators.ledger import LedgerConfigError

    try:
        yield
    except (LedgerConfigError, LedgerError, ValueError) as error:
        _fail(str(error))
    except sa.exc.SQLAlchemyError as error:
        original = getattr(error, "orig", None)
        text = str(original or error).strip().splitlines()[0]
        if getattr(original, "sqlstate", None) == "42501" or "must be owner" in text:
            text += (
                ". This database role may not do that: 'init' and 'roles' run as the tables' owner, 'apply' and "
                "'reconcile' as the governor role, tasks as the spender role (docs/ledger.md, PostgreSQL steps)"
            )
        _fail(f"ledger database error: {text}")


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


def _decimal(text: str) -> str:
    from fractions import Fraction

    value = Fraction(text)
    return f"{float(value):.6g}" if value.denominator != 1 else str(value.numerator)


if __name__ == "__main__":  # pragma: no cover
    app()
