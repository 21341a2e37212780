"""``dpctl ledger ...`` commands that read the ledger: show, history, verify, reconcile, export (docs/ledger.md).

How charges print (tables, aligned lines, JSON lines) is in :mod:`.charges`.

Whatever these commands print of what the ledger holds (account names, release keys, roles, verify's problems and
chain heads) goes through :func:`~dp_operators.ledger.bounded.visible`, or is JSON with every character a terminal
could act on escaped (``\\u001b``): workers write run, task and release names, and a stored escape sequence must
not clear the officer's screen, fake "ledger consistent" or hide the lines after it. ``export`` writes data: JSON
lines escape those characters as JSON escapes (the same values); CSV keeps every value as stored, except on a
terminal, where each cell is shown :func:`~dp_operators.ledger.bounded.visible` (write it to a file with ``-o`` to
keep it exact).
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import itertools
import hashlib
import json
from fractions import Fraction
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from dp_operators.cli.charges import print_history, print_reconciled_table
from dp_operators.cli.common import (
    AuditKeyFileOption,
    ConnOption,
    EXIT_INCONSISTENT,
    GovernorKeyFileOption,
    UrlOption,
    _decimal,
    _fail,
    _governor,
    _key_file,
    _keys,
    _ledger,
    _ledger_errors,
    _locate,
    _stdout_pipe,
    console,
    errors,
    ledger_app,
    visible_json,
)
from dp_operators.ledger import Keyring
from dp_operators.ledger.bounded import visible
from dp_operators.ledger.keys import GOVERNOR_KEY_ENV, SPEND_KEY_ENV


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
    Dong-Roth-Su for gaussian_dp), rounded up. "Allowed roles": the database roles whose members may spend from the
    account (allowed_roles), or "any spender"; enforced on PostgreSQL only.
    """
    from dp_operators.ledger.errors import UnreadableValueError
    from dp_operators.ledger.structure import MEMBER_SEPARATOR
    from dp_operators.ledger.team_roles import describe_allowed_roles, stored_allowed_roles

    with _ledger_errors():
        ledger = _ledger(url, conn_id)
        unreadable: dict[str, str] = {}  # account -> why (a value the ledger never writes: written around it)
        if account:
            accounts = [ledger.account(account), *ledger.members(account)]
        else:
            try:
                accounts = ledger.accounts()
            except UnreadableValueError:
                accounts = []
                for name in ledger.account_names():
                    try:
                        accounts.append(ledger.account(name))
                    except UnreadableValueError as error:
                        unreadable[name] = error.detail
        rows = [a.summary() for a in accounts]
        allowed_roles = {} if as_json else stored_allowed_roles(ledger)
        enforced_bounding = ledger.accounts_requiring_enforced_bounding()
        series = ledger.series(account)
    for row in rows:  # an account's series (docs/continual.md): only on accounts that have one
        own = [dict(entry, charged=str(entry["charged"])) for entry in series if entry["account"] == row["account"]]
        if own:
            row["series"] = own
    for row in rows:  # only when required, so the rows of other accounts read as before
        if row["account"] in enforced_bounding:
            row["require_enforced_bounding"] = True
    if as_json:
        shown = rows + [{"account": name, "unreadable": why} for name, why in unreadable.items()]
        console.print(visible_json(json.dumps(shown, indent=2, ensure_ascii=False)), highlight=False, soft_wrap=True)
        _exit_if_unreadable(unreadable)
        return
    table = Table(title="Budget accounts")
    for column in ("account", "accountant", "unit", "cap", "spent", "reserved", "remaining",
                   "as epsilon (spent / cap)", "allowed roles"):
        table.add_column(column, justify="right" if column in ("cap", "spent", "reserved", "remaining") else "left")
    # an account's members (privacy blocks, team quotas) fold into one line each unless that account is asked for
    names = {row["account"] for row in rows}
    folded: dict[str, list[dict]] = {}
    if not account:
        for row in rows:
            parent = row["account"].split(MEMBER_SEPARATOR, 1)[0]
            if parent != row["account"] and parent in names:
                folded.setdefault(parent, []).append(row)
    hidden = {id(row) for members in folded.values() for row in members}
    # an account with privacy blocks is never charged itself: its row says so rather than look unspent
    blocked = {parent for parent, members in folded.items()
               if any(not m["account"].split(MEMBER_SEPARATOR, 1)[1].startswith("quota:") for m in members)}
    for row in rows:
        if id(row) in hidden:
            continue
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
        if row["account"] in blocked:
            table.add_row(
                visible(row["account"]), visible(row["accountant"]), visible(row["unit"]), cap + " a block",
                "on its blocks", "-", "per block (below)", "-",
                visible(describe_allowed_roles(allowed_roles.get(row["account"]))),
            )
            continue
        table.add_row(
            visible(row["account"]), visible(row["accountant"]), visible(row["unit"]), cap, spent,
            _decimal(row["reserved"]), _decimal(row["remaining"]), as_eps,
            visible(describe_allowed_roles(allowed_roles.get(row["account"]))),
        )
    for name in unreadable:
        table.add_row(visible(name), *["unreadable"] * 7, "-")
    console.print(table)
    # an account's members carry its requirement: named once, by their account
    listed_parents = names & enforced_bounding
    requiring = [row["account"] for row in rows if row.get("require_enforced_bounding")
                 and not (MEMBER_SEPARATOR in row["account"]
                          and row["account"].split(MEMBER_SEPARATOR, 1)[0] in listed_parents)]
    if requiring:  # docs/ledger.md, "Requiring enforced contribution bounding"
        every = sum(1 for row in rows if row.get("require_enforced_bounding"))
        carried = " (and their members)" if len(requiring) < every else ""
        console.print(
            f"bounding: enforced required on {', '.join(visible(name) for name in requiring)}{carried}: a charge "
            "whose contribution bounds were only declared is refused", highlight=False, soft_wrap=True,
        )
    if folded:
        members = Table(title="Privacy blocks and team quotas (dpctl ledger show --account NAME lists them)")
        for column in ("account", "members", "charged", "exhausted", "least remaining", "most spent"):
            members.add_column(column, justify="left" if column == "account" else "right")
        for parent, rows_of in sorted(folded.items()):
            charged = sum(1 for r in rows_of if Fraction(r["spent"]) > 0)
            exhausted = sum(1 for r in rows_of if Fraction(r["remaining"]) <= 0)
            members.add_row(
                visible(parent), str(len(rows_of)), str(charged), str(exhausted),
                _decimal(str(min(Fraction(r["remaining"]) for r in rows_of))),
                _decimal(str(max(Fraction(r["spent"]) for r in rows_of))),
            )
        console.print(members)
    if series:
        listed = Table(title="Series (one charge each; a step per run)")
        for column in ("account", "release", "DAG / task", "generation", "steps done", "steps left", "charged",
                       "redraws"):
            listed.add_column(column, justify="right" if column in ("generation", "steps done", "steps left",
                                                                   "redraws") else "left")
        for entry in series:
            task = entry["task_id"] if entry["map_index"] < 0 else f"{entry['task_id']}[{entry['map_index']}]"
            listed.add_row(
                visible(entry["account"]), visible(entry["release_name"]), visible(f"{entry['dag_id']} / {task}"),
                str(entry["generation"]), str(entry["steps_committed"]),
                "?" if entry["steps_left"] is None else str(entry["steps_left"]), _decimal(entry["charged"]),
                str(entry["redraws"]))
        console.print(listed)
    _exit_if_unreadable(unreadable)
    if ledger.dialect != "postgresql" and any(allowed_roles.get(row["account"]) for row in rows):
        errors.print(
            f"note: allowed roles are recorded but not enforced on SQLite: it has no database roles, and "
            "whoever can write the ledger file governs it (docs/ledger.md, Team roles)",
            highlight=False,
            soft_wrap=True,
        )


def _exit_if_unreadable(unreadable: dict[str, str]) -> None:
    """Name each account ``show`` could not read, and exit 3 (the ledger holds what it never writes)."""
    for name, why in unreadable.items():
        errors.print(f"account {name!r} is unreadable: {visible(why)}; it was written around the ledger: run "
                     "'dpctl ledger verify'", highlight=False, soft_wrap=True)
    if unreadable:
        raise typer.Exit(EXIT_INCONSISTENT)


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
    it prints, so a history longer than 1000 charges (without --limit) prints as aligned lines instead. The table
    shows each charge's release key in full, one part a line (DAG, run, task[map index], release). --json prints one
    JSON object a line: every column but output and token_hash, mechanisms and context as nested JSON.
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
        count, last = print_history(page, as_json)
        more = limit is not None and count == limit and next(charges, None) is not None
        charges.close()
    if more:
        errors.print(f"more: --after {last}", highlight=False)


def _print_verify_report(report, note: str | None = None, all_heads: bool = False) -> None:
    """A consistent ledger's summary and chain heads on stdout; an inconsistent one's problems on stderr (the first
    line names the first broken row), then exit 3. ``note`` (authenticity not checked) goes to stderr last. Each
    problem, hint, account name and head is one line :func:`~dp_operators.ledger.bounded.visible`: they name rows
    by what workers wrote."""
    if not report.problems:
        console.print(
            f"ledger consistent: {report.events} audit events, {report.accounts} accounts, {report.charges} charges"
            + ("; every event authenticated" if report.authenticated else ""),
            highlight=False,
        )
        # an account's members (a year of daily blocks is 365 accounts) in one line: the SHA-256 of their names and
        # heads in name order, which a recorded copy is compared with as well as each head (--all-heads prints each)
        from dp_operators.ledger.structure import MEMBER_SEPARATOR

        names = set(report.heads)
        folded: dict[str, list[str]] = {}
        for name in sorted(names):
            parent = name.split(MEMBER_SEPARATOR, 1)[0]
            if parent != name and parent in names and not all_heads:
                folded.setdefault(parent, []).append(name)
        for name, head in sorted(report.heads.items()):
            if name.split(MEMBER_SEPARATOR, 1)[0] in folded and MEMBER_SEPARATOR in name and not all_heads:
                continue
            console.print(f"  {visible(name)}: chain head {visible(head)}", highlight=False, soft_wrap=True)
            if name in folded:
                digest = hashlib.sha256("".join(f"{m}\0{report.heads[m]}\n" for m in folded[name]).encode()).hexdigest()
                console.print(f"  {visible(name)}@*: {len(folded[name])} member accounts, chain heads digest "
                              f"{digest}", highlight=False, soft_wrap=True)
        if note:
            errors.print(note, highlight=False, soft_wrap=True)
        return
    errors.print(
        Text.assemble(("ledger inconsistent:", "red"), f" first broken: {visible(report.problems[0])}"),
        highlight=False,
        soft_wrap=True,
    )
    for problem in report.problems[1:50]:
        errors.print(f"  also: {visible(problem)}", highlight=False, soft_wrap=True)
    if len(report.problems) > 50:
        errors.print(f"  ... and {len(report.problems) - 50} more", highlight=False, soft_wrap=True)
    for hint in report.hints:
        errors.print(f"hint: {visible(hint)}", highlight=False, soft_wrap=True)
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
    series_key_file: Annotated[
        Optional[Path],
        typer.Option("--series-key-file", help="Also open every series step's sealed noise with this series key "
                     "(64 hex digits) and check each published total against it (docs/continual.md)."),
    ] = None,
    all_heads: Annotated[
        bool, typer.Option("--all-heads", help="Print the chain head of every member account (privacy blocks, team "
                           "quotas) rather than one digest of them per account.")
    ] = False,
) -> None:
    """Replay every account's audit chain under the ledger's state machine and cross-check it with every charge,
    every account row and the guard triggers; with the keys, check every event's MAC and signer. With
    --series-key-file, also check every series step's published totals against its sealed noise (the key reveals
    the true totals: run it where the series key may be).

    Authenticity needs the governor key (--governor-key-file or DP_LEDGER_GOVERNOR_KEY) and the spend keys
    (--audit-key-file or DP_LEDGER_AUDIT_KEY; retired keys on later lines of the key files, or in --keys). Without
    the governor key every other check runs and stderr says authenticity was not checked.

    Exit 0 and print each account's chain head (worth recording outside the database: a chain rewritten from the
    start by someone with every key would then no longer match); exit 3 naming the first broken row and every
    other inconsistency found.
    """
    from dp_operators.ledger import load_ledger_config

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
        series_problems = _audit_series(governor, series_key_file) if series_key_file is not None else []
    _print_verify_report(report, note, all_heads)
    if series_problems:
        raise typer.Exit(EXIT_INCONSISTENT)


def _audit_series(ledger, path: Path) -> list[str]:
    """Check the series against their sealed noise (:func:`dp_operators.continual.audit.audit_series`); print
    the steps checked, or each problem on stderr. Returns the problems."""
    from dp_operators.continual.audit import audit_series
    from dp_operators.continual.state import SeriesKey

    try:
        key = SeriesKey.from_text(next(iter(path.read_text().splitlines()), ""))
    except (OSError, ValueError) as error:
        _fail(f"--series-key-file {path}: {error}")
    checked, problems = audit_series(ledger, key)
    if not problems:
        console.print(f"series: {checked} step(s) match the noise sealed for them (key id {key.key_id})",
                      highlight=False)
    for problem in problems:
        errors.print(f"series inconsistent: {visible(problem)}", highlight=False, soft_wrap=True)
    return problems


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
    from dp_operators.ledger import Ledger

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
        typer.echo(visible_json(json.dumps(abandoned, default=str, sort_keys=True, ensure_ascii=False)))
        return
    if not abandoned:
        console.print("no expired reservations", highlight=False)
        return
    print_reconciled_table(abandoned)


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
                    out.write(visible_json(json.dumps(row, default=str, sort_keys=True, ensure_ascii=False)) + "\n")
                    count += 1
            else:
                table = schema.audit_events if what == "events" else schema.charges
                hidden = () if what == "events" else ("output", "token_hash")  # what Ledger.charges leaves out
                columns = [c.name for c in table.c if c.name not in hidden]
                writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
                writer.writeheader()
                shown = visible if output is None and sys.stdout.isatty() else None  # a terminal: see the module
                for row in rows:
                    values = {name: row.get(name) for name in columns}
                    if shown is not None:
                        values = {name: None if value is None else shown(value) for name, value in values.items()}
                    writer.writerow(values)
                    count += 1
    if output:
        errors.print(f"wrote {count} {what} to {output}", highlight=False, soft_wrap=True)
