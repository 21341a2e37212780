"""``dpctl ledger approvals`` and ``dpctl ledger approve``: an officer's approval before a large charge
(docs/ledger.md, "Approval before a large charge"; :mod:`dp_operators.ledger.approvals`)."""

from __future__ import annotations

import json
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
    ledger_app,
    visible_json,
)
from dp_operators.ledger.bounded import visible
from dp_operators.ledger.keys import GOVERNOR_KEY_ENV


def _amount(text: object, unit: str) -> str:
    """An exact amount as the officer reads it: ``rho 0.2 (1/5)``; as written if it is not a number."""
    from fractions import Fraction

    try:
        value = Fraction(str(text))
    except (ValueError, ZeroDivisionError):
        return visible(str(text))
    shown = f"{float(value):.6g}"
    return f"{unit} {shown}" + ("" if shown == str(value) else f" ({value})")


def _plan_lines(plan: object, unit: str = "") -> list[str]:
    """The plan a request carries, as the officer reads it: the charge, the budget left after it (and on privacy
    blocks each block's), each mechanism with its expected half-width."""
    if not isinstance(plan, dict):
        return ["  (no plan)"]
    lines = []
    for name in ("charge", "remaining_after", "confidence", "reasons", "spec"):
        if name in plan:
            value = plan[name]
            shown = _amount(value, unit) if name in ("charge", "remaining_after") else visible(str(value))
            lines.append(f"  {name.replace('_', ' ')}: {shown}")
    blocks = plan.get("blocks")
    if isinstance(blocks, list) and blocks:
        listed = [b for b in blocks if isinstance(b, dict)][:400]
        lines.append(f"  charged on {len(listed)} privacy block(s): " + ", ".join(
            f"{visible(str(b.get('window')))} ({_amount(b.get('remaining_after'), unit)} left after)"
            for b in listed[:31]) + (" ..." if len(listed) > 31 else ""))
    for step in plan.get("mechanisms") or []:
        if isinstance(step, dict):
            lines.append("  - " + ", ".join(f"{k} {visible(str(v))}" for k, v in sorted(step.items())))
    return lines


@ledger_app.command("approvals")
def ledger_approvals(
    url: UrlOption = None,
    conn_id: ConnOption = None,
    account: Annotated[Optional[str], typer.Option("--account", help="Only this account's requests.")] = None,
    every: Annotated[bool, typer.Option("--all", help="Also decided and timed-out requests.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
) -> None:
    """List the approval requests still to decide (with --all, every request and its decision), each with its
    plan: the mechanisms, the charge, the budget left after it and the expected half-widths. Needs no key."""
    from dp_operators.ledger import LedgerGovernor

    with _ledger_errors():
        target = _locate(url, conn_id)
        found = LedgerGovernor(target.url).approval_requests(account, pending=not every)
    if as_json:
        for request in found:
            typer.echo(visible_json(json.dumps(request, sort_keys=True, default=str, ensure_ascii=False)))
        return
    if not found:
        console.print("no approval requests to decide" if not every else "no approval requests", highlight=False)
        return
    units: dict[str, str] = {}
    for r in found:
        if r["account"] not in units:
            with _ledger_errors():
                units[r["account"]] = LedgerGovernor(target.url).account(r["account"]).unit
        unit = units[r["account"]]
        state = r["decision"] or ("timed out (rejected)" if r["timed_out"] else "pending")
        console.print(
            f"account {visible(r['account'])} request {r['request']}: {state}; charge {_amount(r['amount'], unit)} for "
            f"release {visible(str(r['release_name']))} (DAG {visible(str(r['dag_id']))}, run "
            f"{visible(str(r['run_id']))}, task {visible(str(r['task_id']))}[{r['map_index']}]), spec "
            f"{visible(str(r['spec_hash']))[:12]}; requested {r['requested_at']}, expires {r['expires_at']}"
            + (f"; decided {r['decided_at']} by {visible(str(r['decided_by']))}"
               + (f" ({visible(str(r['reason']))})" if r.get("reason") else "") if r["decision"] else ""),
            highlight=False, soft_wrap=True, markup=False,
        )
        for line in _plan_lines(r["plan"], unit):
            console.print(line, highlight=False, soft_wrap=True, markup=False)


@ledger_app.command("approve")
def ledger_approve(
    account: Annotated[str, typer.Argument(help="The account of the request.")],
    request: Annotated[int, typer.Argument(help="The request's number (dpctl ledger approvals).")],
    reject: Annotated[bool, typer.Option("--reject", help="Reject the charge instead of granting it.")] = False,
    reason: Annotated[Optional[str], typer.Option("--reason", help="Why (recorded in the ledger).")] = None,
    user: Annotated[Optional[str], typer.Option("--user", help="Who decides (default: this login).")] = None,
    url: UrlOption = None,
    conn_id: ConnOption = None,
    governor_key_file: GovernorKeyFileOption = None,
    audit_key_file: AuditKeyFileOption = None,
) -> None:
    """Grant (or --reject) an approval request: an event signed with the governor key (--governor-key-file or
    DP_LEDGER_GOVERNOR_KEY) naming the request, who decided and why; the release waiting for it then reserves
    (or fails). A request is decided once; one past its timeout counts as rejected."""
    with _ledger_errors():
        target = _locate(url, conn_id)
        governor_keys, spend_keys = _keys(target, governor_key_file, audit_key_file)
        if not governor_keys:
            _fail(f"a decision is signed with the governor key: give --governor-key-file or {GOVERNOR_KEY_ENV}")
        try:
            decided = _governor(target, governor_keys, spend_keys).decide_approval(
                account, request, approve=not reject, reason=reason, user=user)
        except ValueError as error:
            _fail(str(error))
    console.print(f"{decided['decision']} request {request} of account {visible(account)} "
                  f"(event seq {decided['event_seq']}, {decided['decided_at']}, by {visible(decided['decided_by'])})",
                  highlight=False, soft_wrap=True, markup=False)
