"""Budget structure inside an account: privacy blocks over data windows, and team quotas on a shared cap.

Both are made of **member accounts** that ``dpctl ledger apply`` creates from the parent account's configuration
(``config/ledgers.yaml``), each an ordinary account of the ledger with its own cap, totals and audit chain:

* **Privacy blocks** (Sage, Lécuyer et al., SOSP 2019; PrivateKube, Luo et al., OSDI 2021): an account with
  ``blocks: {window: day}`` is split into one member per data window, ``<account>@2013-01-01``, each with the
  account's ``cap``. A release names the windows of data it reads (from its DAG run's data interval or partition
  key, never from the data) and is charged its full amount on every one of them, all or nothing, in one
  transaction. The parent itself is never charged. Windows are disjoint sets of records, so a unit's record in one
  window is protected by that window's cap (event-level); a person present in many windows accumulates loss across
  them (docs/ledger.md, "Privacy blocks").
* **Team quotas** (Big Bird: per-querier budgets are unsound under adaptivity, a global budget with per-tenant
  quotas is not): an account with ``quotas: {team: {cap, dags, role}}`` keeps its ``cap`` as the one guarantee for
  the people in it; member ``<account>@quota:<team>`` holds the team's quota. A release of a DAG listed under a team
  is charged on the account and on its team's member, all or nothing: refused when either is exhausted.

Which members a charge touches is decided by the ledger (the spend function on PostgreSQL, :mod:`.spend` on
SQLite) from the parent's stored configuration, the windows the release names and its DAG id; a spender cannot
charge a member or a structured parent on its own.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

#: Granularities of a privacy block's data window.
WINDOWS = ("day", "week", "month", "partition")
#: A charge names at most this many windows (a year of days and then some).
MAX_WINDOWS = 400
#: An account opens at most this many blocks at once (apply).
MAX_OPEN_BLOCKS = 5000
#: What separates a parent's name from its member's suffix.
MEMBER_SEPARATOR = "@"
QUOTA_PREFIX = "quota:"
#: A partition key that may name a block: letters, digits, ``_ . -``; 1-64 characters.
PARTITION_KEY = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
WINDOW_PATTERNS = {
    "day": re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    "week": re.compile(r"[0-9]{4}-W[0-9]{2}"),
    "month": re.compile(r"[0-9]{4}-[0-9]{2}"),
    "partition": PARTITION_KEY,
}

Window = Literal["day", "week", "month", "partition"]


def block_account(account: str, window: str) -> str:
    """The member account of ``account`` holding the block of data window ``window`` (e.g. ``2013-01-01``)."""
    return f"{account}{MEMBER_SEPARATOR}{window}"


def quota_account(account: str, team: str) -> str:
    """The member account of ``account`` holding team ``team``'s quota."""
    return f"{account}{MEMBER_SEPARATOR}{QUOTA_PREFIX}{team}"


def window_of(granularity: str, day: dt.date) -> str:
    """The id of the window of ``granularity`` (``day``, ``week``, ``month``) holding ``day``: ``2013-01-07``,
    ``2013-W02`` (ISO 8601 week), ``2013-01``."""
    if granularity == "day":
        return day.isoformat()
    if granularity == "week":
        year, week, _ = day.isocalendar()
        return f"{year:04d}-W{week:02d}"
    if granularity == "month":
        return f"{day.year:04d}-{day.month:02d}"
    raise ValueError(f"no calendar window {granularity!r}: one of day, week, month (partition keys name themselves)")


def _start_of(granularity: str, window: str) -> dt.date:
    if granularity == "day":
        return dt.date.fromisoformat(window)
    if granularity == "week":
        return dt.date.fromisocalendar(int(window[:4]), int(window[6:]), 1)
    return dt.date(int(window[:4]), int(window[5:]), 1)


def _next_window(granularity: str, window: str) -> str:
    start = _start_of(granularity, window)
    if granularity == "day":
        return window_of("day", start + dt.timedelta(days=1))
    if granularity == "week":
        return window_of("week", start + dt.timedelta(days=7))
    return window_of("month", (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1))


def windows_between(granularity: str, first: dt.date, last: dt.date) -> list[str]:
    """Every window of ``granularity`` from the one holding ``first`` to the one holding ``last``, in order."""
    if last < first:
        return []
    out = [window_of(granularity, first)]
    end = window_of(granularity, last)
    while out[-1] != end:
        out.append(_next_window(granularity, out[-1]))
        if len(out) > MAX_OPEN_BLOCKS:
            raise ValueError(f"more than {MAX_OPEN_BLOCKS} {granularity} windows from {first} to {last} (the ledger "
                             "opens and reads at most that many at once): use a shorter range")
    return out


def _utc_date(value: dt.datetime | dt.date) -> dt.date:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError(f"a data interval bound must be timezone-aware (Airflow's are UTC), got {value!r}")
        return value.astimezone(dt.timezone.utc).date()
    return value


def windows_read(
    granularity: str,
    start: dt.datetime | dt.date | None,
    end: dt.datetime | dt.date | None,
    *,
    lookback: int = 0,
    partition_key: str | None = None,
) -> list[str]:
    """The windows of data a release reads: every window of ``granularity`` that the data interval
    ``[start, end)`` overlaps, and the ``lookback`` windows before the first (a 7-day sliding window over daily
    blocks: ``lookback=6``); for ``partition`` blocks, the run's ``partition_key`` alone. Decided from the run's
    schedule, never from the data.

    Raises:
        ValueError: no data interval (or no partition key), an empty or reversed interval, naive datetimes, a
            negative lookback, a partition key that cannot name a block, or more than :data:`MAX_WINDOWS` windows.
    """
    if lookback < 0:
        raise ValueError(f"lookback must be >= 0 windows, got {lookback}")
    try:
        return _windows_read(granularity, start, end, lookback, partition_key)
    except (TypeError, OverflowError) as error:  # a date with a datetime, a window before year 1: bad input
        raise ValueError(f"the data interval [{start}, {end}) with lookback {lookback} names no windows: {error}") from None


def _windows_read(granularity: str, start: Any, end: Any, lookback: int, partition_key: str | None) -> list[str]:
    if granularity == "partition":
        if partition_key is None or not PARTITION_KEY.fullmatch(partition_key):
            raise ValueError(
                f"this release's account has partition blocks, so its run needs a partition key of 1-64 letters, "
                f"digits, '_', '.' or '-' (Airflow asset partitions); got {partition_key!r}"
            )
        if lookback:
            raise ValueError("a lookback needs calendar blocks (day, week, month), not partition blocks")
        return [partition_key]
    if start is None or end is None:
        raise ValueError(
            "this release's account has privacy blocks, so its run needs a data interval (a timetable with data "
            "intervals, e.g. CronDataIntervalTimetable or @daily); a manual or asset-triggered run without one "
            "cannot say which data it reads"
        )
    first, last_exclusive = _utc_date(start), end
    if isinstance(end, dt.datetime):
        if end.tzinfo is None:
            raise ValueError(f"a data interval bound must be timezone-aware (Airflow's are UTC), got {end!r}")
        if not start < end:  # type: ignore[operator]
            raise ValueError(f"the data interval [{start}, {end}) is empty: it reads no window")
        last = (end - dt.timedelta(microseconds=1)).astimezone(dt.timezone.utc).date()
    else:
        if not first < last_exclusive:
            raise ValueError(f"the data interval [{start}, {end}) is empty: it reads no window")
        last = last_exclusive - dt.timedelta(days=1)
    windows = windows_between(granularity, first, last)
    for _ in range(lookback):
        windows.insert(0, window_of(granularity, _start_of(granularity, windows[0]) - dt.timedelta(days=1)))
    if len(windows) > MAX_WINDOWS:
        raise ValueError(f"a release reads at most {MAX_WINDOWS} windows; this one would read {len(windows)}")
    return windows


#: A stored configuration longer than this is not read (only the governor writes it; a record is a few hundred bytes).
MAX_CONFIG_CHARS = 1_000_000


def config_record(config: Any) -> dict | None:
    """An account's stored configuration record (the ``config`` column, JSON text, or the record itself) as a
    dict, or ``None`` if it is missing, too long or not a JSON object."""
    if isinstance(config, str):
        if len(config) > MAX_CONFIG_CHARS:
            return None
        try:
            config = json.loads(config)
        except ValueError:
            return None
    return config if isinstance(config, dict) else None


def quota_team(quotas: Mapping[str, Any], dag_id: str) -> str | None:
    """The team whose quota lists ``dag_id`` (configuration allows one), or ``None``."""
    teams = sorted(team for team, quota in quotas.items()
                   if isinstance(quota, Mapping) and dag_id in (quota.get("dags") or ()))
    return teams[0] if teams else None


def own_or_first_block(charges: list, account: str, of: Any = lambda charge: charge["account"]) -> list:
    """The charges of ``charges`` on ``account``; if it has none (an account with privacy blocks, which is never
    charged), those on its first block charged, which holds the same output as its other blocks."""
    own = [charge for charge in charges if of(charge) == account]
    if own:
        return own
    blocks = sorted({of(charge) for charge in charges if str(of(charge)).startswith(account + MEMBER_SEPARATOR)})
    return [charge for charge in charges if blocks and of(charge) == blocks[0]]


def structure_of(config: Mapping[str, Any] | None) -> tuple[str, Any]:
    """``("blocks", granularity)``, ``("quotas", {team: {"dags": [...], ...}})``, ``("member", parent)`` or
    ``("plain", None)`` for an account's stored configuration record (``details.config`` of its ``account_*``
    events, the ``config`` column)."""
    if not isinstance(config, Mapping):
        return "plain", None
    if isinstance(config.get("part_of"), Mapping):
        return "member", config["part_of"].get("account")
    if isinstance(config.get("blocks"), Mapping):
        return "blocks", config["blocks"].get("window")
    if isinstance(config.get("quotas"), Mapping):
        return "quotas", config["quotas"]
    return "plain", None


def members_charged(
    account: str, config: Mapping[str, Any] | None, windows: Sequence[str] | None, dag_id: str
) -> list[str] | str:
    """The accounts one charge of ``dag_id`` on ``account`` touches, sorted (the order their locks are taken in),
    or why the ledger refuses it (a message). What ``dp_reserve`` decides on PostgreSQL.

    * a plain account: itself; no windows may be named;
    * an account with blocks: one member per distinct window named (at least one, at most :data:`MAX_WINDOWS`);
    * an account with quotas: itself and the quota member of the team whose ``dags`` list ``dag_id`` (a DAG in no
      team's list is refused as not allowed, by the parent's allowlist);
    * a member account: refused (charge its parent).
    """
    kind, detail = structure_of(config)
    named = sorted(set(windows or ()))
    if kind == "member":
        return (f"account {account!r} is a member of account {detail!r} (a block or a team quota): a release "
                f"names {detail!r} and the ledger charges its members")
    if kind == "blocks":
        if not named:
            return (f"account {account!r} has privacy blocks ({detail} windows): a release on it names the windows "
                    "of data it reads (from its run's data interval or partition key)")
        if len(named) > MAX_WINDOWS:
            return f"a release reads at most {MAX_WINDOWS} windows; this one names {len(named)}"
        pattern = WINDOW_PATTERNS.get(detail)
        bad = [w for w in named if pattern is None or not pattern.fullmatch(w)]
        if bad:
            return f"window {bad[0][:70]!r} is not a {detail} window of account {account!r}"
        return [block_account(account, w) for w in named]
    if named:
        return (f"account {account!r} has no privacy blocks: a release on it names no windows (the windows "
                f"{named[:3]} were given)")
    if kind == "quotas":
        team = quota_team(detail, dag_id)
        if team is None:
            return [account]  # no team lists the DAG: nor does the parent's allowlist (config), which refuses it
        return sorted([account, quota_account(account, team)])
    return [account]


# -- contribution bounding: "enforced" by the operator, or "declared" by the spec's author -------------------------

#: The key of an account's configuration record that requires every charge's mechanisms to have enforced their
#: contribution bounds (``require_enforced_bounding`` in ``ledgers.yaml``; docs/ledger.md, "Requiring enforced
#: contribution bounding").
REQUIRE_ENFORCED_BOUNDING = "require_enforced_bounding"
#: How many declared aggregates a refusal names at most.
MAX_DECLARED_NAMED = 20


def requires_enforced_bounding(config_record: Mapping[str, Any] | None) -> bool:
    """Whether an account's stored configuration record (:meth:`LedgerBase.account_config
    <dp_operators.ledger.store.LedgerBase.account_config>`; a member's carries its parent's value) requires every
    charge to have enforced its contribution bounds: ``require_enforced_bounding: true``. ``None`` (no record):
    ``False``."""
    return isinstance(config_record, Mapping) and config_record.get(REQUIRE_ENFORCED_BOUNDING) is True


def _mechanism_list(mechanisms: Any) -> list | None:
    """A charge's recorded ``mechanisms`` (the list, or its JSON text) as a list; ``None`` if it is not one."""
    if isinstance(mechanisms, (str, bytes)):
        try:
            mechanisms = json.loads(mechanisms)
        except ValueError:
            return None
    return mechanisms if isinstance(mechanisms, list) else None


def bounding_of(mechanism: Any) -> dict[str, Any]:
    """The ``contribution_bounding`` of one recorded mechanism step (``{"mode": "enforced" | "declared", "source",
    "privacy_unit_column", "sql_sha256"}``), or ``{"mode": "declared"}`` when it has none (a charge written before
    bounding was recorded) or it is not shaped like one. Only the mode ``"enforced"`` (exactly) counts as
    enforced."""
    found = mechanism.get("contribution_bounding") if isinstance(mechanism, Mapping) else None
    if not isinstance(found, Mapping):
        return {"mode": "declared"}
    mode = "enforced" if found.get("mode") == "enforced" else "declared"
    return {**{k: v for k, v in found.items() if isinstance(k, str)}, "mode": mode}


def aggregate_of(mechanism: Any) -> str:
    """The aggregate a recorded mechanism step belongs to (its ``aggregate``), or ``"?"``."""
    name = mechanism.get("aggregate") if isinstance(mechanism, Mapping) else None
    return name if isinstance(name, str) and name else "?"


def declared_aggregates(mechanisms: Any) -> list[str] | None:
    """The aggregates (sorted, distinct) of the steps in ``mechanisms`` (the list a charge records, or its JSON
    text) whose contribution bounding is not ``enforced``; ``[]`` when every step's is; ``None`` when
    ``mechanisms`` is not a non-empty list (nothing shows the bounds were enforced). What an account with
    ``require_enforced_bounding`` refuses (:func:`bounding_refusal`)."""
    mechanisms = _mechanism_list(mechanisms)
    if not mechanisms:
        return None
    return sorted({aggregate_of(m) for m in mechanisms if bounding_of(m)["mode"] != "enforced"})


def bounding_refusal(config_record: Mapping[str, Any] | None, mechanisms: Any) -> list[str] | None:
    """``None`` when a charge with ``mechanisms`` may be reserved on an account whose stored configuration is
    ``config_record`` as far as contribution bounding goes; else the aggregates whose bounds were only declared
    (``[]`` when the mechanisms are not a non-empty list). What ``dp_reserve`` decides on PostgreSQL."""
    if not requires_enforced_bounding(config_record):
        return None
    declared = declared_aggregates(mechanisms)
    if declared is None:
        return []
    return declared or None


def bounding_summary(mechanisms: Any) -> str:
    """``"enforced"`` when every step of a charge's ``mechanisms`` enforced its contribution bounds, ``"declared"``
    when none did, ``"mixed"`` otherwise; ``"-"`` for no step (a display value)."""
    mechanisms = _mechanism_list(mechanisms)
    if not mechanisms:
        return "-"
    modes = {bounding_of(m)["mode"] for m in mechanisms}
    return modes.pop() if len(modes) == 1 else "mixed"


def bounding_by_aggregate(mechanisms: Any) -> dict[str, dict[str, Any]]:
    """``{aggregate: contribution_bounding}`` of a charge's ``mechanisms`` (an aggregate with several steps whose
    modes differ counts as declared)."""
    out: dict[str, dict[str, Any]] = {}
    for mechanism in _mechanism_list(mechanisms) or ():
        name, bounding = aggregate_of(mechanism), bounding_of(mechanism)
        if name in out and out[name] != bounding:
            bounding = {"mode": "declared"} if "declared" in (out[name]["mode"], bounding["mode"]) else out[name]
        out[name] = bounding
    return out


def describe_bounding(bounding: Mapping[str, Any] | None) -> str:
    """One aggregate's contribution bounding in words: ``enforced (table, unit column person_id, SQL sha256
    0a1b2c3d4e5f…)`` or ``declared`` (``declared (query)`` when its source is known)."""
    bounding = bounding if isinstance(bounding, Mapping) else {"mode": "declared"}
    parts = []
    if isinstance(bounding.get("source"), str):
        parts.append(bounding["source"][:20])
    if bounding.get("mode") == "enforced":
        if isinstance(bounding.get("privacy_unit_column"), str):
            parts.append(f"unit column {bounding['privacy_unit_column'][:64]}")
        l0, linf = bounding.get("max_partitions_contributed"), bounding.get("max_contributions_per_partition")
        if type(l0) is int and type(linf) is int:
            parts.append(f"each unit in at most {l0} key{'s' if l0 != 1 else ''}, at most {linf} "
                         f"row{'s' if linf != 1 else ''} each")
        if isinstance(bounding.get("sql_sha256"), str):
            parts.append(f"SQL sha256 {bounding['sql_sha256'][:12]}…")
        return f"enforced ({', '.join(parts)})" if parts else "enforced"
    return f"declared ({', '.join(parts)})" if parts else "declared"
