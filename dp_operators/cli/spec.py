"""``dpctl spec ...``: validate a release spec, and plan it against a ledger account."""

from __future__ import annotations

import math

import json
import datetime as dt
import os
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from dp_operators.accounting import ACCOUNTANTS, round_up, unit_of
from dp_operators.cli.common import (
    ConnOption,
    UrlOption,
    _decimal,
    _fail,
    _ledger,
    _ledger_errors,
    console,
    spec_app,
)

@spec_app.command("validate")
def spec_validate(spec: Annotated[Path, typer.Argument(help="A release spec YAML file.")]) -> None:
    """Validate a release spec; prints every problem with its field path, then plans it (float sums that cannot
    carry the grid, totals that can reach the saturation limit, noise beyond the engine's range are refused here,
    as they would be at the release, before any budget)."""
    from dp_operators.release import ReleaseConfigError, plan_release
    from dp_operators.spec import SpecError, load_spec

    try:
        loaded = load_spec(spec)
        plan = plan_release(loaded)
        if loaded.postprocess.consistent:  # the consistent families' refusals (noise variances), as at the release
            from dp_operators.release.consistent import plan_families

            plan_families(plan)
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
    rows_assumed: Annotated[
        Optional[int],
        typer.Option("--rows", min=1, help="Show each mean's expected half-width for this many rows (a public "
                     "assumption: the true count stays private); default: as W / n, for n rows."),
    ] = None,
    data_interval: Annotated[
        Optional[str],
        typer.Option("--data-interval", help="On an account with privacy blocks: the data interval of a run, "
                     "START/END in ISO 8601 (e.g. 2013-01-05/2013-01-06), to show which blocks it would charge "
                     "and what each has left."),
    ] = None,
    partition_key: Annotated[
        Optional[str],
        typer.Option("--partition-key", help="On an account with partition blocks: a run's partition key."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show what a spec will do, before any data is read or budget spent: per noised step the mechanism, scale,
    charge (in the account's unit and as epsilon) and the half-width of each value's interval; with a ledger
    (--url, --conn-id or DP_LEDGER_URL) also how many more runs the budget account can fund. On an account with
    privacy blocks, the blocks a run would charge (--data-interval or --partition-key) and each one's remaining
    budget, or a summary of the blocks; on an account with team quotas, each team's remaining quota.

    `mechanism: auto` chooses by the cost on the account the release is charged to, so the plan needs its
    accountant: the ledger's account (--url, --conn-id), else the account in --ledger-config, else --accountant,
    else the ledger in DP_LEDGER_URL: an option given on the command line wins over the environment. Without any
    of them, auto compares mechanisms at the written budgets (which on a zcdp account can cost more than needed).

    A mean is published as its noised sum over its noised count, so its half-width depends on the true count,
    which is private: the plan gives it as W / n (W from the Fieller interval of docs/mechanisms.md, public
    parameters only), or at --rows n.
    """
    from dp_operators.accounting import IncompatibleAccountantError, epsilon_at_delta
    from dp_operators.ledger import LedgerConfigError, load_ledger_config
    from dp_operators.release import ReleaseConfigError, plan_release
    from dp_operators.spec import SpecError, load_spec

    try:
        loaded = load_spec(spec)
    except SpecError as error:
        _fail(str(error))
    if loaded.series is not None:
        _print_series_plan(loaded, as_json)
        return
    account = None
    chosen = accountant.value if accountant is not None else None
    delta = None
    # An explicit option wins over the environment: DP_LEDGER_URL (set by scripts/demo_env.sh, say) is the
    # ledger only when no --ledger-config or --accountant says which account to plan for.
    from_environment = ledger_config is None and accountant is None and bool(os.environ.get("DP_LEDGER_URL"))
    ledger = None
    if url or conn_id or from_environment:
        with _ledger_errors():
            ledger = _ledger(url, conn_id)
            account = ledger.account(loaded.budget_account)
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
    means = _mean_half_widths(plan, alpha, rows_assumed)
    if means:
        summary["means"] = means
    if loaded.postprocess.consistent:
        try:
            summary["consistent_families"] = _family_widths(plan, alpha)
        except ReleaseConfigError as error:
            _fail(f"{spec}: {error}")
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
    structure = None
    if data_interval is not None and partition_key is not None:
        _fail("give --data-interval (calendar blocks) or --partition-key (partition blocks), not both")
    if ledger is None and (data_interval is not None or partition_key is not None):
        _fail("--data-interval and --partition-key read the account's privacy blocks from a ledger: give --url or "
              "--conn-id (or set DP_LEDGER_URL)")
    if ledger is not None and chosen is not None:
        with _ledger_errors():
            structure = _structure_plan(ledger, loaded, total, data_interval, partition_key)
        if structure is not None:
            summary["structure"] = structure
    if account is not None:
        runs, limit = _runs_remaining(account, total, delta_per_run)
        summary.update(remaining=str(account.remaining))
        remaining_delta = account.remaining_delta
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
    width_header = f"± ({level})"
    if means:
        width_header += f"; a mean's for n = {rows_assumed} rows" if rows_assumed else "; a mean's for n rows"
    columns += [width_header, "partitions"]
    for column in columns:
        table.add_column(column, overflow="fold")  # a narrow COLUMNS folds long names instead of cutting them
    mean_after = {}  # a mean's own row follows the last noised step of its aggregate
    for index, row in enumerate(rows):
        mean_after[row["aggregate"]] = index
    mean_rows = {mean_after[mean["aggregate"]]: mean for mean in means}
    for index, row in enumerate(rows):
        cells = [
            row["aggregate"], row["component"], row["mechanism"], row["scale"],
            f"{row['l1_sensitivity']:.6g} / {row['l2_sensitivity']:.6g}", row["l0"], row["calibrated_to"],
        ]
        if chosen:
            eps = row["charge_as_epsilon"]
            cells += [_decimal(row["charge"]), "-" if eps is None else f"{eps:.4g}"]
        width = f"{row['half_width']:.4g}" + (" ranks" if row.get("half_width_unit") == "ranks" else "")
        cells += [width, str(row["partitions"] if row["partitions"] is not None else "selected")]
        table.add_row(*cells)
        if index in mean_rows:
            mean = mean_rows[index]
            width = (f"{mean['half_width']:.4g}" if mean["half_width"] is not None
                     else f"{mean['half_width_times_rows']:.4g} / n")
            table.add_row(mean["aggregate"], "mean", "sum / count (no budget)", *["-"] * (len(columns) - 5), width,
                          str(mean["partitions"]))
    console.print(table)
    if means:
        console.print(
            "a mean's half-width depends on its true count n, which stays private: it is at most W / n' for the "
            "noised count n' (W from its Fieller interval, public parameters only)"
            + ("" if rows_assumed else "; --rows n prints it for n rows"),
            highlight=False,
        )
    for row in rows:  # what the binary64 allowance adds to the sensitivities above (docs/adr/0017)
        upstream = row["noise"].get("upstream", {})
        if upstream.get("arithmetic") == "binary64":
            untouched = row["noise"]["untouched_partitions"]
            console.print(
                f"binary64 upstream, {row['aggregate']} ({row['component']}): summation error "
                f"{upstream['summation_error']:.4g}, +{upstream['linf_allowance_grid_units']} grid unit(s) of Linf in "
                f"each touched partition" + (
                    f", +{row['noise']['untouched_partition_allowance_grid_units']} in each of the {untouched} "
                    "untouched partitions (included in L1 / L2)" if untouched else ""
                ) + f"; half-width allowance {row['noise']['half_width_allowance']:.4g}",
                highlight=False,
            )
    for family in summary.get("consistent_families", []):
        widths = ", ".join(f"{name} ± {width:.4g}" for name, width in family["half_widths"].items())
        rounding = "; integer rounding adds up to 1 more" if loaded.postprocess.integer else ""
        console.print(f"consistent family (post-processing, no budget): {widths} (least squares{rounding}; "
                      f"before: {', '.join(f'{w:.4g}' for w in family['half_widths_before'].values())})",
                      highlight=False)
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
    if structure is not None and structure["kind"] == "blocks":
        line = line.split("; account ")[0]  # the parent is never charged: its blocks say what is left
    console.print(line, highlight=False)
    if structure is not None:
        _print_structure(structure, unit)
    if ledger is not None:
        with _ledger_errors():
            note = _approval_note(ledger, loaded.budget_account, total, structure)
        if note:
            console.print(note, highlight=False)
    if structure is not None and structure.get("run_funded") is False:
        raise typer.Exit(1)  # the run would be refused: as for a series that cannot be released


def _print_series_plan(loaded, as_json: bool) -> None:
    """A series spec's plan: per aggregate, every candidate's half-width on the widest step and at the RMSE, and
    the choice (docs/adr/0032). Public parameters only."""
    from dp_operators.continual.plan import plan_spec_series

    plans = plan_spec_series(loaded)
    series = loaded.series
    total = sum((plan.plan.rho for plan in plans), Fraction(0))
    summary = {
        "release": loaded.release, "budget_account": loaded.budget_account, "series": {
            "horizon": series.horizon, "max_steps": series.participation.max_steps,
            "min_separation": series.participation.min_separation, "mechanism": series.mechanism,
            "after_horizon": series.after_horizon,
        },
        "confidence": loaded.confidence, "charge_per_series": {"unit": "rho", "amount": str(total)},
        "aggregates": [{
            "aggregate": plan.aggregate, "chosen": plan.plan.chosen.mechanism,
            "candidates": [{
                "mechanism": c.mechanism, "noise_variance": str(c.noise_variance),
                "worst_step_std": c.worst_std, "rmse": c.rmse,
                "worst_step_half_width": plan.worst_half_width[c.mechanism],
                "rmse_half_width": plan.mean_half_width[c.mechanism],
            } for c in plan.plan.candidates],
        } for plan in plans],
    }
    if as_json:
        console.print_json(json.dumps(summary))
        _refuse_unreleasable(loaded)
        return
    level = f"{loaded.confidence:.0%}"
    pattern = f"a unit in at most {series.participation.max_steps} step(s)"
    if series.participation.min_separation > 1:
        pattern += f", at least {series.participation.min_separation} steps apart"
    table = Table(title=f"Plan of series {loaded.release!r}: {series.horizon} steps, {pattern} (no data read, "
                  "nothing spent)", title_justify="left")
    for column in ("aggregate", "mechanism", f"± widest step ({level})", f"± at the RMSE ({level})", "chosen"):
        table.add_column(column, overflow="fold")
    for plan in plans:
        for c in plan.plan.candidates:
            table.add_row(plan.aggregate, c.mechanism, f"{plan.worst_half_width[c.mechanism]:.4g}",
                          f"{plan.mean_half_width[c.mechanism]:.4g}",
                          "yes" if c.mechanism == plan.plan.chosen.mechanism else "")
    console.print(table)
    from dp_operators.continual.run import redraw_charge

    console.print(f"charge per series (zcdp): rho {_decimal(str(total))}, once for all {series.horizon} steps (at "
                  f"the first); a step measured again after its attempt died: rho {_decimal(str(redraw_charge(plans)))}"
                  " (leave room for it in the account's cap).", highlight=False)
    _refuse_unreleasable(loaded)


def _structure_plan(ledger, loaded, charge: Fraction, data_interval: str | None,
                    partition_key: str | None) -> dict | None:
    """The plan's view of the budget account's structure (docs/ledger.md, "Privacy blocks and team quotas"):
    for blocks, the windows a run with ``data_interval`` (or ``partition_key``) reads, each block's remaining
    budget and whether the run is funded, or a summary without them; for quotas, each team's remaining quota.
    ``None`` for a plain account."""
    from dp_operators.ledger.structure import block_account, windows_read

    kind, detail = ledger.structure(loaded.budget_account)
    if kind != "blocks" and getattr(loaded, "lookback_windows", None) is not None:
        _fail(f"{loaded.release!r} declares lookback_windows: {loaded.lookback_windows}, but budget account "
              f"{loaded.budget_account!r} has no privacy blocks: a release would be refused. Drop lookback_windows, "
              "or name an account with calendar blocks")
    members = {member.name: member for member in ledger.members(loaded.budget_account)}
    if kind == "quotas":
        teams = []
        for team, quota in sorted(detail.items()):
            member = members.get(f"{loaded.budget_account}@quota:{team}")
            teams.append({"team": team, "dags": quota.get("dags", []),
                          "remaining": None if member is None else str(member.remaining),
                          "funds_a_run": member is not None and member.remaining >= charge})
        return {"kind": "quotas", "teams": teams}
    if kind != "blocks":
        if data_interval or partition_key:
            _fail(f"budget account {loaded.budget_account!r} has no privacy blocks: drop --data-interval and "
                  "--partition-key")
        return None
    out: dict = {"kind": "blocks", "window": detail, "blocks_open": len(members),
                 "blocks_charged": sum(1 for m in members.values() if m.spent > 0),
                 "blocks_that_fund_a_run": sum(1 for m in members.values() if m.remaining >= charge)}
    if data_interval is None and partition_key is None:
        return out
    start = end = None
    if data_interval is not None:
        try:
            first, last = data_interval.split("/")
            start, end = (dt.datetime.fromisoformat(first), dt.datetime.fromisoformat(last))
        except ValueError:
            _fail(f"--data-interval {data_interval!r}: give START/END in ISO 8601, e.g. 2013-01-05/2013-01-06")
        start, end = (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc) for v in (start, end))
    try:
        windows = windows_read(detail, start, end, lookback=getattr(loaded, "lookback_windows", None) or 0,
                               partition_key=partition_key)
    except ValueError as error:
        _fail(str(error))
    blocks = []
    for window in windows:
        member = members.get(block_account(loaded.budget_account, window))
        blocks.append({"window": window, "open": member is not None,
                       "remaining": None if member is None else str(member.remaining),
                       "funds_a_run": member is not None and member.remaining >= charge})
    out.update(run_charges=blocks, run_funded=all(block["funds_a_run"] for block in blocks))
    return out


def _approval_note(ledger, account_name: str, charge: Fraction, structure: dict | None) -> str | None:
    """Why a run's charge would wait for a privacy officer's approval (the account's ``approval`` policy, amount
    rules; docs/ledger.md), or ``None``."""
    from dp_operators.ledger import approvals

    policy = approvals.policy_of(ledger.account_config(account_name))
    if policy is None:
        return None
    if structure is not None and structure.get("run_charges"):
        remaining = min((Fraction(b["remaining"]) for b in structure["run_charges"] if b["remaining"] is not None),
                        default=Fraction(0))
    else:
        remaining = ledger.account(account_name).remaining
    reasons = approvals.approval_reasons(policy, charge, max(remaining, Fraction(0)))
    if not reasons:
        return None
    return (f"this run's charge needs a privacy officer's approval ({', '.join(reasons)}): the release files a request "
            f"and waits (dpctl ledger approvals; dpctl ledger approve {account_name} N)")


def _print_structure(structure: dict, unit: str) -> None:
    if structure["kind"] == "quotas":
        for team in structure["teams"]:
            left = "not open" if team["remaining"] is None else f"{unit} {_decimal(team['remaining'])} left"
            console.print(f"team {team['team']!r} quota: {left}" + ("" if team["funds_a_run"] else
                          " (cannot fund a run)"), highlight=False)
        return
    console.print(
        f"privacy blocks ({structure['window']}): {structure['blocks_open']} open, {structure['blocks_charged']} "
        f"charged, {structure['blocks_that_fund_a_run']} can fund a run; a run is charged on every block it reads",
        highlight=False,
    )
    if "run_charges" not in structure:
        console.print("give --data-interval START/END (or --partition-key) to see the blocks a run would charge",
                      highlight=False)
        return
    for block in structure["run_charges"]:
        state = ("not open: refused" if not block["open"] else
                 f"{unit} {_decimal(block['remaining'])} left" + ("" if block["funds_a_run"] else ": refused"))
        console.print(f"  block {block['window']}: {state}", highlight=False)
    console.print("this run would be " + ("charged on every block above" if structure["run_funded"] else
                  "refused before anything is reserved"), highlight=False)


def _refuse_unreleasable(loaded) -> None:
    """A series this version plans but does not release fails the command (exit 1), as its DAG's import would."""
    from dp_operators.continual.checks import check_releasable
    from dp_operators.release import ReleaseConfigError

    try:
        check_releasable(loaded)
    except ReleaseConfigError as error:
        _fail(f"planned, but not releasable by this version: {error}")


def _mean_half_widths(plan, alpha: float, rows: int | None) -> list[dict]:
    """Per mean aggregate, the numerator W of its expected half-width W / n at ``1 - alpha`` for n rows (public
    parameters only), and W / ``rows`` (capped at the width of the bounds) when ``rows`` is given.

    The published interval (:func:`dp_operators.release.publish.mean_fieller_table`) is the hull of the centred
    means m with ``|S' - m N'| <= W1(m)``, so it lies within ``S'/N' +- max W1 / N'``; N' is the noised count,
    about n. The released mean and its interval are inside the bounds, so the half-width never exceeds their
    width. Returns a list of ``{"aggregate", "half_width_times_rows", "rows", "half_width", "partitions"}``
    (``half_width`` None without ``rows``).
    """
    from dp_operators.accounting import exact_number
    from dp_operators.release.publish import fieller_table

    means = []
    for aggregate in plan.spec.aggregates:
        if aggregate.kind != "mean":
            continue
        lower, upper = (exact_number(bound, name="bounds") for bound in aggregate.bounds)
        steps = [plan.step(aggregate.name, component) for component in ("sum", "count")]
        table = fieller_table("mean", steps, float((upper - lower) / 2), alpha)
        width = float(table.mean_widths.max())
        means.append({
            "aggregate": aggregate.name,
            "half_width_times_rows": width,
            "rows": rows,
            "half_width": None if rows is None else min(width / rows, float(upper - lower)),
            "partitions": steps[1].partitions if steps[1].partitions is not None else "selected",
        })
    return means


def _family_widths(plan, alpha: float) -> list[dict]:
    """Per consistent family, every member's largest half-width after the least-squares step and its own before
    (public parameters only: the exact variances of docs/consistency.md)."""
    from dp_operators.consistency import half_widths
    from dp_operators.release.consistent import plan_families

    families = []
    for planned in plan_families(plan):
        widths = half_widths(planned.family, planned.accuracies, alpha)
        families.append({
            "family": list(planned.family.names),
            "half_widths": {m.name: float(w.max()) for m, w in zip(planned.family.members, widths)},
            "half_widths_before": {m.name: plan.step(m.name, plan.spec.aggregates[
                [a.name for a in plan.spec.aggregates].index(m.name)].kind).half_width(alpha)
                for m in planned.family.members},
        })
    return families


def _runs_remaining(account, charge: Fraction, delta_charge: Fraction | None) -> tuple[int | None, str | None]:
    """How many more runs a ledger ``account`` (an AccountStatus) can fund at ``charge`` (in the account's unit) and
    ``delta_charge`` (the delta a run spends on an ``approx_dp`` account; ``None`` or 0 otherwise) per run.

    Exact (Fractions): floor(remaining / per-run charge) in each dimension, the per-run charges rounded up as the
    ledger's ``reserve`` rounds them; a dimension whose per-run charge is 0 does not limit. Returns
    ``(runs, dimension)``: the minimum over the dimensions and the one that sets it (the account's unit, e.g.
    ``"epsilon"`` or ``"rho"``, on a tie; ``"delta"`` only when delta admits strictly fewer runs), or
    ``(None, None)`` when no dimension is charged.
    """
    limits: list[tuple[int, str]] = []
    charge = round_up(Fraction(charge))
    if charge > 0:
        limits.append((int(Fraction(account.remaining) // charge), unit_of(account.accountant)))
    remaining_delta = account.remaining_delta
    delta_charge = round_up(Fraction(delta_charge or 0))
    if remaining_delta is not None and delta_charge > 0:
        limits.append((int(remaining_delta // delta_charge), "delta"))
    if not limits:
        return None, None
    return min(limits, key=lambda limit: limit[0])  # min keeps the first of equals: the account's unit on a tie


def _with_charge(row: dict, step, accountant: str | None, as_epsilon) -> dict:
    """``row`` with the step's charge on ``accountant`` (and as epsilon), when an accountant is known."""
    if accountant is not None:
        from dp_operators.accounting import charge_in_account_unit

        charge = charge_in_account_unit(step.privacy_loss(accountant), accountant)
        row.update(charge=str(charge), charge_as_epsilon=as_epsilon(charge))
    return row


def _quantile_plan_row(step, described: dict, accountant: str | None, as_epsilon) -> dict:
    """A quantile's plan row: its mechanism's parameter, the records one unit moves, and the largest planned rank
    half-width over its levels (records)."""
    if step.mechanism == "exponential":
        scale = f"epsilon {float(step.epsilon_each):.6g} per level"
    else:
        scale = f"{step.cdf_strategy}, sigma = {math.sqrt(float(step.cdf_noise.noise_variance)):.6g}"
    row = {
        "aggregate": step.aggregate,
        "component": f"quantile ({', '.join(described['quantiles'])}) over {step.bins:,} bins",
        "mechanism": step.mechanism,
        "scale": scale,
        "l1_sensitivity": float(step.records_per_unit),
        "l2_sensitivity": (float(step.records_per_unit) if step.cdf_noise is None
                           else math.sqrt(float(step.cdf_noise.sensitivity_squared))),
        "l0": str(step.l0),
        "calibrated_to": ", ".join(f"{name} {value:g}" for name, value in described["calibrated_to"].items()),
        "half_width": max(step.rank_half_widths),
        "half_width_unit": "ranks",
        "partitions": step.partitions,
        "noise": described,
    }
    return _with_charge(row, step, accountant, as_epsilon)


def _plan_row(step, accountant: str | None, as_epsilon, alpha: float) -> dict:
    """One noised step of a plan as plain JSON (public parameters only)."""
    described = step.describe()
    if step.component == "quantile":
        return _quantile_plan_row(step, described, accountant, as_epsilon)
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
    return _with_charge(row, step, accountant, as_epsilon)


