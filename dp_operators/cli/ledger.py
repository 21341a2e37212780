"""``dpctl ledger ...``: keys, schema, accounts and database roles (keygen, init, apply, roles); the commands that
read the ledger (show, history, verify, reconcile, export) are in :mod:`.ledger_records` (docs/ledger.md)."""

from __future__ import annotations

import contextlib
import re
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from dp_operators.cli.common import (
    AuditKeyFileOption,
    ConnOption,
    GovernorKeyFileOption,
    UrlOption,
    _fail,
    _governor,
    _keys,
    _ledger_errors,
    _locate,
    console,
    errors,
    ledger_app,
    visible_lines,
)
from dp_operators.ledger import AuditKey, LedgerError
from dp_operators.ledger.keys import GOVERNOR_KEY_ENV, SPEND_KEY_ENV


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
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and print the changes, then change nothing.")
    ] = False,
) -> None:
    """Create or update budget accounts from a ledger configuration file (needs the governor key).

    The only way a cap changes. Every change is an audit event signed with the governor key, recording the
    configuration as written, the values stored, the previous values, the user and the host. With the spend key
    (--audit-key-file or DP_LEDGER_AUDIT_KEY; required to create an account), every account in the file accepts
    that key from now on: giving a new one rotates it. A cap below the spend so far, a change of accountant and a
    change of privacy unit once anything was charged are refused (exit 1) and nothing is changed.
    """
    from dp_operators.ledger.config import LedgerConfigError, declared_accountants, load_ledger_config
    from dp_operators.ledger.structure import MEMBER_SEPARATOR

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
        changes = governor.apply_config(parsed, new_governor_key=new_governor_key, dry_run=dry_run)
        existing = {account.name for account in governor.accounts()}
        untouched = sorted(  # an account's blocks and quotas go with it: noted once, by the account's name
            name for name in existing - set(parsed.accounts)
            if MEMBER_SEPARATOR not in name or name.split(MEMBER_SEPARATOR, 1)[0] not in existing | set(parsed.accounts)
        )
        changes = _members_summarised(changes)
        notes = _team_role_notes(governor, parsed, config)
    prefix = "would have " if dry_run else ""
    for line in changes or ["no change"]:  # changes quote the values the ledger held
        console.print(visible_lines(prefix + line if changes else line), highlight=False, soft_wrap=True)
    for note in notes:
        errors.print(visible_lines(note), highlight=False, soft_wrap=True)
    for name in untouched:
        errors.print(
            f"note: account {name!r} is in the ledger but not in {config} (left as it is; a misspelt name creates "
            "a new account: check with --dry-run first)",
            highlight=False,
            soft_wrap=True,
        )
    if dry_run:
        console.print("dry run: nothing was changed", highlight=False)


def _members_summarised(changes: list[str]) -> list[str]:
    """``apply``'s lines with the creation of an account's member accounts (blocks, quotas) in one line per
    account: a year of daily blocks is 365 accounts."""
    out: list[str] = []
    created: dict[str, list[str]] = {}
    for line in changes:
        match = re.match(r"created account '([^'@]+)@([^']+)' \((.*)\)$", line)
        if match is None:
            out.append(line)
            continue
        if match.group(1) not in created:
            out.append(match.group(1))  # placeholder, replaced below
            created[match.group(1)] = []
        created[match.group(1)].append(match.group(2))
        created.setdefault("\0" + match.group(1), [match.group(3)])
    for index, line in enumerate(out):
        if line in created and not line.startswith("created"):
            parts = created[line]
            shown = parts[0] if len(parts) == 1 else f"{parts[0]} .. {parts[-1]}"
            out[index] = (f"created {len(parts)} member account(s) of {line!r}: {line}@{shown} "
                          f"({created[chr(0) + line][0]} each)")
    return out


#: How ledger notes name a database.
_DIALECTS = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def _team_role_notes(governor, parsed, config: Path) -> list[str]:
    """What ``apply`` says about the configuration's ``allowed_roles``: on SQLite that nothing enforces them; on
    PostgreSQL which named roles do not exist yet (nobody can spend from their accounts until they do)."""
    from dp_operators.ledger.team_roles import missing_roles, team_roles

    teams = team_roles(parsed)
    if not teams:
        return []
    if governor.dialect != "postgresql":
        accounts = sorted({account for names in teams.values() for account in names})
        database = _DIALECTS.get(governor.dialect, governor.dialect)
        return [
            f"note: the allowed_roles of {', '.join(repr(a) for a in accounts)} are recorded and signed, but "
            f"{database} has no database roles to enforce them: whoever can write the ledger file governs it. Use "
            "PostgreSQL where task authors are not trusted (docs/ledger.md, Team roles)"
        ]
    return [
        f"note: role {team!r} (allowed_roles of {', '.join(repr(a) for a in teams[team])}) does not exist in this "
        "database: nobody can spend from those accounts until it does. As the tables' owner: 'dpctl ledger roles "
        f"--config {config} --create --execute', then make the team's worker logins members of {team!r}"
        for team in missing_roles(governor.engine, teams)
    ]


@ledger_app.command("roles")
def ledger_roles(
    spender_role: Annotated[
        str, typer.Option("--spender-role", help="The database role release tasks connect as.")
    ] = "dp_ledger_spender",
    governor_role: Annotated[
        str, typer.Option("--governor-role", help="The database role the privacy officer's dpctl connects as.")
    ] = "dp_ledger_governor",
    reader_role: Annotated[
        str | None, typer.Option("--reader-role", help="A read-only role, e.g. for the budget dashboard.")
    ] = None,
    create: Annotated[bool, typer.Option("--create", help="Also create the roles (NOLOGIN) if missing.")] = False,
    execute: Annotated[
        bool, typer.Option("--execute", help="Run the statements on the ledger (as the tables' owner).")
    ] = False,
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            help="A ledger configuration (ledgers.yaml): also make the team roles its accounts' allowed_roles name "
            "members of the spender role.",
        ),
    ] = None,
    url: UrlOption = None,
    conn_id: ConnOption = None,
) -> None:
    """PostgreSQL only: print (or with --execute run) the GRANTs that let the spender role only spend, the
    governor role govern and the optional reader role only read: none may change or disable the guard triggers,
    and the spender has no privilege on caps, allowlists, accountants or accounts (see docs/ledger.md). Idempotent.

    With --config, also the team roles named by the accounts' allowed_roles: each becomes a member of the spender
    role and holds no other ledger privilege (--create creates them NOLOGIN); a team's workers log in as members
    of its team role, and the database refuses them the accounts of other teams. A team role that is a superuser,
    may create roles, owns the tables, or is inside another team role or the governor role is refused.

    Printing needs no ledger; --execute runs them on the ledger named by --url, --conn-id or DP_LEDGER_URL,
    connected as the role that owns the tables (the one that ran 'dpctl ledger init'), in one transaction.
    """
    import sqlalchemy as sa

    from dp_operators.ledger import roles  # the PostgreSQL grants; only this command needs them

    teams: dict[str, tuple[str, ...]] = {}
    if config is not None:
        from dp_operators.ledger.config import load_ledger_config
        from dp_operators.ledger.team_roles import team_roles

        with _ledger_errors():
            teams = team_roles(load_ledger_config(config))
        if not teams:
            errors.print(
                f"note: no account in {config} has allowed_roles: no team roles to make (any login holding the "
                "spender role may spend from every account)",
                highlight=False,
                soft_wrap=True,
            )
    with _ledger_errors():
        named = url or conn_id or os.environ.get("DP_LEDGER_URL")
        target = _locate(url, conn_id) if named or execute else None
        if target is not None and sa.make_url(target.url).get_backend_name() != "postgresql":
            raise ValueError(
                f"database roles are a PostgreSQL feature; this ledger is not PostgreSQL ({target.how or target.url}); "
                "on SQLite, file permissions decide who may write (docs/ledger.md)"
            )
        if not execute:
            from dp_operators.ledger.team_roles import team_role_statements

            statements = roles.role_statements(spender_role, governor_role, reader_role=reader_role, create=create)
            team_statements = team_role_statements(
                teams, spender_role, governor_role=governor_role, reader_role=reader_role, create=create
            )
            for statement in statements:
                typer.echo(statement.rstrip().rstrip(";") + ";")
            if teams:
                typer.echo(f"-- team roles (members of {spender_role!r}) and the accounts they may spend from:")
                for team, accounts in teams.items():
                    typer.echo(f"--   {team}: {', '.join(repr(account) for account in accounts)}")
            for statement in team_statements:
                typer.echo(statement.rstrip().rstrip(";") + ";")
            return
        assert target is not None
        from dp_operators.ledger.store import create_ledger_engine
        from dp_operators.ledger.team_roles import apply_team_roles

        engine = create_ledger_engine(target.url)
        try:
            if teams:
                done = apply_team_roles(
                    engine, teams, spender_role, governor_role, reader_role=reader_role, create=create
                )
            else:
                done = roles.apply_roles(engine, spender_role, governor_role, create=create, reader_role=reader_role)
        finally:
            engine.dispose()
    named = [f"{spender_role!r} (spender)", f"{governor_role!r} (governor)"]
    if reader_role is not None:
        named.append(f"{reader_role!r} (reader)")
    made = (
        f"; made the team roles {', '.join(repr(team) for team in teams)} members of {spender_role!r}" if teams else ""
    )
    console.print(
        f"granted the ledger privileges to {', '.join(named[:-1])} and {named[-1]}{made}: {len(done)} statements "
        f"run on {target.how or 'DP_LEDGER_URL'}",
        highlight=False,
        soft_wrap=True,
    )


# Registered after the commands above, so that --help lists setting up before reading.
from dp_operators.cli import ledger_records  # noqa: E402, F401  (registers show, history, verify, reconcile, export)
from dp_operators.cli import ledger_approvals  # noqa: E402, F401  (registers approvals, approve)
