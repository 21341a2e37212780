"""Read-only queries behind the budget dashboard: accounts, burn-down, forecast, charge pages and releases.

Every function takes the ledger as a :class:`~dp_operators.ledger.store.LedgerBase` (a spender's ``Ledger`` or a
governor's view), a SQLAlchemy :class:`~sqlalchemy.engine.Engine` or a URL, and only reads: each call runs in one
read transaction (PostgreSQL: ``REPEATABLE READ READ ONLY``, one snapshot that the server refuses to write from;
SQLite: a deferred transaction on the ledger's reader engine). Pages and aggregates come from SQL (``COUNT``,
``GROUP BY``, keyset pages on the primary key): a call reads O(page + chart points) rows whatever the number of
charges (``benchmarks/dashboard_queries.py`` measures it at 100,000).

Numbers. Budgets are exact fractions stored as text (``str(Fraction)``). Totals that matter (cap, spent,
reserved, remaining) are exact: taken from the account row's running totals and the reserved charges, exactly as
``dpctl ledger show`` and :meth:`LedgerBase.account` compute them, and returned as exact strings (``"1/3"``) with
a float beside them (``*_float``). The burn-down chart and the forecast's rate sum many charges in SQL, which
cannot add fractions exactly: there each stored amount is converted to a double in SQL and summed as doubles
(relative error about 1e-16 per charge; for display only, never for a budget decision).

Spend over time counts *settled* charges: ``committed`` and ``abandoned`` (both spent for good). ``reserved``
charges are in flight (their total is the account's ``reserved``) and ``released`` ones were returned.

Hostile rows. Whoever can write the ledger's tables can store any value (docs/ledger.md, "Hostile rows"). Every
value read is checked against the bounds of :mod:`dp_operators.ledger.bounded` before it is used
(:func:`~dp_operators.ledger.store.read_row`): a row that holds a value the ledger does not write is returned with
its id (an account: its name) and ``"unreadable"``, a list of ``"column [value] what is wrong"``, and ``None`` in
each unreadable field; every other row as usual. In SQL, the burn-down and the forecast convert only amounts in the
ledger's form (``p``, ``-p``, ``p/q`` of at most 60 digits a side) and times within the years 1 to 9999; anything
else is left out of the sums (it is named on the charge's row). No stored value makes a query raise or run long.

Errors. A ledger without its schema raises :class:`~dp_operators.ledger.LedgerNotInitialisedError` and a database
failure a SQLAlchemy error; their messages can hold the ledger's URL, host, login or database name, so what a viewer
is told is :func:`ledger_error_hint`'s fixed text, never the message.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import shlex
import weakref
from collections.abc import Callable, Iterator
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from dp_operators.accounting import MAX_DENOMINATOR, round_down, round_up
from dp_operators.dashboard.access import MAX_ASKED_DAGS, DagAccess
from dp_operators.accounting.accountants import ACCOUNTANTS
from dp_operators.ledger import schema
from dp_operators.ledger.bounded import (
    MAX_DIGITS,
    MAX_OUTPUT_CHARS,
    BoundsError,
    TooManyValuesError,
    check_json,
    CutList,
    read_json_cut,
    read_number,
    shown,
)
from dp_operators.ledger.approvals import APPROVAL_DECISIONS, APPROVAL_REQUESTED
from dp_operators.ledger.errors import LedgerNotInitialisedError, UnreadableValueError
from dp_operators.ledger.structure import (
    MEMBER_SEPARATOR,
    QUOTA_PREFIX,
    WINDOWS,
    bounding_by_aggregate,
    bounding_summary,
    describe_bounding,
)
from dp_operators.ledger.store import (
    ACCOUNT_READ_COLUMNS,
    SERIES_RUN_PREFIX,
    SERIES_STEP_RUN_ID,
    LedgerBase,
    account_status,
    lenient_sqlite_text,
    published_form,
    read_row,
    reserved_totals,
    sqlite_timestamp,
    timestamp_column,
)

#: The states of a charge (DESIGN.md 3).
CHARGE_STATES = ("reserved", "committed", "released", "abandoned")
#: States whose amount is spent for good: the burn-down and the forecast count these.
SETTLED_STATES = ("committed", "abandoned")
#: Most points of a burn-down series.
MAX_BURN_DOWN_POINTS = 500
#: The forecast's window: spend over this many days before ``now``.
FORECAST_WINDOW_DAYS = 30
#: Least history (days from the start of the forecast's window, or the first settled charge if later, to ``now``)
#: the forecast needs before it gives a rate: two charges minutes apart would otherwise extrapolate minutes of
#: spend to a daily rate and forecast exhaustion within the hour.
MIN_FORECAST_HISTORY_DAYS = 1.0
#: Largest page of :func:`account_charges`.
MAX_PAGE = 500
#: Most published values per aggregate :func:`release_detail` lists when asked for a limit.
MAX_RELEASE_VALUES = 10_000
#: Longest committed output :func:`release_detail` reads, in characters (32 MiB: every output the release engine
#: writes inline, up to ``INLINE_ROWS_LIMIT`` rows); a longer one is "too large to show here" (``dpctl ledger
#: verify`` checks it).
MAX_SHOWN_OUTPUT_CHARS = 32 * 2**20
#: Most series :func:`account_detail` lists for an account (the first by key); ``series_total`` counts them all.
MAX_SERIES = 100
#: Most ``(series, amount)`` groups :func:`account_detail` reads: the series' charges are summed exactly from them.
#: The ledger writes about three amounts in a series' steps (its charge, 0 and its redraw price), so only a page of
#: series written around the ledger comes near it: the series after it are not listed, and a first series with more
#: groups has ``charged`` ``None``.
MAX_SERIES_AMOUNTS = 10 * MAX_SERIES
#: Most values of a committed output :func:`release_detail` keeps once each aggregate's rows are cut to its limit
#: (some tens of MB as Python values); an output that would keep more is "too large to show here".
MAX_SHOWN_OUTPUT_VALUES = 500_000
#: Privacy blocks listed per page of a parent account's blocks (the latest windows first).
BLOCKS_PAGE = 30
#: Most refused attempts :func:`account_detail` lists (the latest first); ``refusals_total`` counts them all.
MAX_REFUSALS = 50
#: Most ``(dag_id, task_id, release_name)`` whose last committed charge :func:`account_detail` weighs against the
#: remaining budget (the most recently committed first); ``runs_total`` counts them all.
MAX_NEXT_RUNS = 50
#: Most ``(account, dag_id, task_id, release_name)`` keys read to decide ``cannot_fund_next_run`` (the most recently
#: committed first): a bound on what a ledger with unboundedly many release names costs a page.
MAX_NEXT_RUN_KEYS = 10_000
#: Refused attempts counted at most (``refusals_more`` says there are more): a flood of refusals is cheap to write.
MAX_REFUSALS_COUNTED = 10_000
#: Most noised steps of a charge's recorded mechanisms :func:`release_detail` splits per aggregate.
MAX_SPLIT_STEPS = 1000

#: Most pending approval requests listed (the latest first), on an account page and in :func:`pending_approvals`.
MAX_APPROVALS = 100
#: Most ``approval_requested`` events read (the latest first) to find the pending ones; ``approvals_more`` says
#: there are more (the older ones have mostly timed out).
MAX_APPROVAL_REQUESTS_READ = 500
#: Most decisions (``approval_granted``/``approval_rejected``) read to tell which requests are decided.
MAX_APPROVAL_DECISIONS_READ = 10_000
#: Most mechanisms of a request's plan listed; ``mechanisms_total`` counts them all.
MAX_PLAN_STEPS = 100
#: An account's approval timeout when its policy gives none (docs/ledger.md, ``timeout_hours``).
DEFAULT_APPROVAL_HOURS = 24

_c = schema.charges.c
_a = schema.accounts.c
_DAY = 86_400.0


# -- SQL building blocks (one expression, compiled per dialect) ---------------------------------------------------
class _fraction_as_double(FunctionElement):
    """A ``str(Fraction)`` text column (``"3"``, ``"-1/3"``) as a double: numerator / denominator; NULL for any
    other text (so ``SUM`` leaves it out): PostgreSQL checks the grammar and the 60-digit bound with a regular
    expression (a cast of ``'1e-99999999'`` or ``'abc'`` would fail the query); SQLite, which has none, keeps texts
    of ASCII digits, ``-`` and one ``/`` within the length bound (its casts never fail; a text such as ``'1-2'``
    casts to a wrong but finite number, for display only, and the charge's row names it unreadable)."""

    type = sa.Float()
    name = "fraction_as_double"
    inherit_cache = True


@compiles(_fraction_as_double, "sqlite")
def _fraction_sqlite(element, compiler, **kw) -> str:
    x = compiler.process(element.clauses, **kw)
    numerator = f"substr({x}, 1, instr({x}, '/') - 1)"
    denominator = f"substr({x}, instr({x}, '/') + 1)"
    return (
        f"(CASE WHEN typeof({x}) <> 'text' OR length({x}) NOT BETWEEN 1 AND {2 * MAX_DIGITS + 2} "
        f"OR {x} GLOB '*[^0-9/-]*' OR {x} GLOB '*/*/*' THEN NULL "
        f"WHEN instr({x}, '/') > 0 THEN CAST({numerator} AS REAL) / NULLIF(CAST({denominator} AS REAL), 0) "
        f"ELSE CAST({x} AS REAL) END)"
    )


@compiles(_fraction_as_double, "postgresql")
def _fraction_postgresql(element, compiler, **kw) -> str:
    x = compiler.process(element.clauses, **kw)
    grammar = f"^-?(0|[1-9][0-9]{{0,{MAX_DIGITS - 1}}})(/[1-9][0-9]{{0,{MAX_DIGITS - 1}}})?$"
    return (
        f"(CASE WHEN {x} ~ '{grammar}' THEN CAST(split_part({x}, '/', 1) AS DOUBLE PRECISION) "
        f"/ CAST(COALESCE(NULLIF(split_part({x}, '/', 2), ''), '1') AS DOUBLE PRECISION) END)"
    )


class _epoch_seconds(FunctionElement):
    """A timestamp column as seconds since 1970-01-01 UTC (a double)."""

    type = sa.Float()
    name = "epoch_seconds"
    inherit_cache = True


@compiles(_epoch_seconds, "sqlite")
def _epoch_sqlite(element, compiler, **kw) -> str:
    # SQLAlchemy stores SQLite timestamps as UTC text 'YYYY-MM-DD HH:MM:SS.ffffff'; julianday() parses it.
    return f"((julianday({compiler.process(element.clauses, **kw)}) - 2440587.5) * 86400.0)"


@compiles(_epoch_seconds, "postgresql")
def _epoch_postgresql(element, compiler, **kw) -> str:
    return f"EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)})"


# A series step's run id is __dp_series__/g<generation: 1 to 6 digits>/step/<step: 6 digits>
# (dp_operators.continual.run.step_key; SERIES_STEP_RUN_ID matches it in Python). Neither the prefix nor the rest
# holds a character GLOB or a PostgreSQL regular expression reads as syntax.
_GENERATION_AT = len(SERIES_RUN_PREFIX) + 2  # the 1-based position of the generation's first digit
_STEP_SUFFIX = len("/step/000000")
_SERIES_GENERATION_RUN_ID = re.compile(re.escape(SERIES_RUN_PREFIX) + r"g([0-9]{1,6})")


class _series_step_run_id(FunctionElement):
    """True for a run id of a series step's canonical form (``__dp_series__/g<1 to 6 digits, no leading zero>/step/
    <6 digits>``, ASCII digits: ``dp_operators.ledger.store.SERIES_STEP_RUN_ID``), false or NULL for any other
    value; checked in SQL, so a run id of another form is never read."""

    type = sa.Boolean()
    name = "series_step_run_id"
    inherit_cache = True


@compiles(_series_step_run_id, "sqlite")
def _series_step_sqlite(element, compiler, **kw) -> str:
    x = compiler.process(element.clauses, **kw)
    shortest = _GENERATION_AT + _STEP_SUFFIX
    generation = f"substr({x}, {_GENERATION_AT}, length({x}) - {shortest - 1})"
    return (
        f"(typeof({x}) = 'text' AND length({x}) BETWEEN {shortest} AND {shortest + 5} "
        f"AND {x} GLOB '{SERIES_RUN_PREFIX}g[0-9]*/step/{'[0-9]' * 6}' AND {generation} NOT GLOB '*[^0-9]*' "
        f"AND ({generation} = '0' OR {generation} NOT GLOB '0*'))"
    )


@compiles(_series_step_run_id, "postgresql")
def _series_step_postgresql(element, compiler, **kw) -> str:
    x = compiler.process(element.clauses, **kw)
    return f"({x} ~ '^{SERIES_RUN_PREFIX}g(0|[1-9][0-9]{{0,5}})/step/[0-9]{{6}}$')"


_AMOUNT = _fraction_as_double(_c.amount)
_SETTLED = _c.state.in_(SETTLED_STATES)
_OF_ACCOUNT = _c.account == sa.bindparam("account")
#: A charge's creation time in seconds since 1970 (a double), and the charges whose time is one the dashboard can
#: show: within the years 1 to 9999 (NULL, SQLite text that is no time, PostgreSQL's infinity are left out).
_CREATED = _epoch_seconds(_c.created_at)
_FIRST_SECOND = dt.datetime(1, 1, 2, tzinfo=dt.timezone.utc).timestamp()
_LAST_SECOND = dt.datetime(9999, 12, 30, tzinfo=dt.timezone.utc).timestamp()
_SHOWN_TIME = _CREATED.between(_FIRST_SECOND, _LAST_SECOND)

#: ``created_at`` as the burn-down reads it, per dialect: SQLite's text (read back by ``sqlite_timestamp``; the
#: rows are those of :data:`_SHOWN_TIME`, which PostgreSQL's driver can always return).
_CREATED_AT = {"sqlite": sa.type_coerce(_c.created_at, sa.String)}

_ACCOUNT_ROW = sa.select(*ACCOUNT_READ_COLUMNS).where(_a.name == sa.bindparam("account"))
_STATE_COUNTS = sa.select(_c.state, sa.func.count()).where(_OF_ACCOUNT).group_by(_c.state)
_BUCKET = sa.cast((_CREATED - sa.bindparam("t0")) / sa.bindparam("width"), sa.Integer)


def _settled_span(dialect: str) -> Any:
    created = _CREATED_AT.get(dialect, _c.created_at)
    return sa.select(sa.func.min(created), sa.func.max(created), sa.func.count()).where(
        _OF_ACCOUNT, _SETTLED, _SHOWN_TIME
    )


def _burn_down_buckets(dialect: str) -> Any:
    return (
        sa.select(sa.func.max(_CREATED_AT.get(dialect, _c.created_at)), sa.func.sum(_AMOUNT), sa.func.count())
        .where(_OF_ACCOUNT, _SETTLED, _SHOWN_TIME)
        .group_by(_BUCKET)
        .order_by(_BUCKET)
    )


_WINDOW_SPEND = sa.select(sa.func.sum(_AMOUNT), sa.func.count()).where(
    _OF_ACCOUNT, _SETTLED, _SHOWN_TIME, _c.created_at >= sa.bindparam("start"), _c.created_at <= sa.bindparam("end")
)


# The series of an account: its charges whose run id is a series step's, grouped by series (account, dag_id,
# task_id, map_index, release_name and the run id's "__dp_series__/g<generation>") and, within one, by amount (the
# exact sum of a series' charges is made in Python from few groups: its charge, 0 and its redraw price). Constants
# are written into the SQL (literal_column), so PostgreSQL sees one expression in SELECT, GROUP BY and ORDER BY.
_SERIES_GENERATION = sa.func.substr(
    _c.run_id, sa.literal_column("1"), sa.func.length(_c.run_id) - sa.literal_column(str(_STEP_SUFFIX))
)
_SERIES_KEY = (_c.dag_id, _c.task_id, _c.map_index, _c.release_name, _SERIES_GENERATION)
_OF_SERIES = (_OF_ACCOUNT, _series_step_run_id(_c.run_id))
_COMMITTED = _c.state == "committed"
_SERIES_GROUPS = (
    sa.select(
        *_SERIES_KEY[:4],
        _SERIES_GENERATION.label("generation"),
        _c.amount,
        # released charges' budget came back: they are left out of the sum
        sa.func.sum(sa.case((_c.state == "released", 0), else_=1)).label("charges"),
        sa.func.count(sa.distinct(sa.case((_COMMITTED, _c.run_id)))).label("steps_committed"),
        sa.func.max(sa.case((_COMMITTED, _c.run_id))).label("last_run_id"),
        sa.func.max(sa.case((_COMMITTED, _c.id))).label("last_charge_id"),
        sa.func.min(_c.id).label("first_charge_id"),
        sa.func.sum(sa.case((_c.attempt > 1, 1), else_=0)).label("redraws"),
    )
    .where(*_OF_SERIES)
    .group_by(*_SERIES_KEY, _c.amount)
    .order_by(*_SERIES_KEY, _c.amount)
)
_SERIES_COUNT = sa.select(sa.func.count()).select_from(
    sa.select(*_SERIES_KEY).where(*_OF_SERIES).group_by(*_SERIES_KEY).subquery()
)
_MECHANISMS_OF = sa.select(_c.id, _c.mechanisms).where(_c.id.in_(sa.bindparam("ids", expanding=True)))


def _read_columns(conn: Connection, columns: tuple[sa.Column, ...]) -> list[Any]:
    """``columns`` as the dashboard selects them on ``conn``'s database: a timestamp so that no stored value makes
    the read raise (:func:`~dp_operators.ledger.store.timestamp_column`; :func:`_row_values` reads it back)."""
    return [timestamp_column(column, conn.dialect.name) for column in columns]


def _row_values(row: Any) -> dict[str, Any]:
    """A row selected through :func:`_read_columns` as a dict, SQLite's timestamp texts as datetimes where they
    hold one (:func:`~dp_operators.ledger.store.sqlite_timestamp`)."""
    return {name: sqlite_timestamp(value) if name in _TIMES else value for name, value in row._mapping.items()}


_TIMES = frozenset({"created_at", "updated_at", "lease_expires_at"})
_PAGE_COLUMNS = (
    _c.id, _c.dag_id, _c.run_id, _c.task_id, _c.map_index, _c.release_name, _c.attempt, _c.state, _c.amount,
    _c.delta_amount, _c.mechanisms, _c.created_at, _c.updated_at,
)
_RELEASE_COLUMNS = (
    _c.id, _c.account, _c.dag_id, _c.run_id, _c.task_id, _c.map_index, _c.release_name, _c.attempt, _c.state,
    _c.amount, _c.mechanisms, _c.output, _c.output_digest, _c.created_at, _c.updated_at,
)


# -- errors a viewer may be told about ----------------------------------------------------------------------
class LedgerUnavailableError(Exception):
    """The dashboard's ledger cannot be opened: no such Airflow connection, a governor's connection, no ledger URL
    in it, no SQLite file (raised by :func:`dp_operators.dashboard.app.dashboard_ledger`).

    Args:
        message: the details, for the server's log only (it may name the file's path or the URL).
        hint: fixed text any viewer may be shown: what is wrong and how to fix it, naming the connection, never
            the URL, host, login, database or path.
    """

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


# checked in order: DBAPIError (every driver error: connection refused, login or rights refused, a missing table)
# is a SQLAlchemyError
_HINTS: tuple[tuple[type[BaseException], str], ...] = (
    (LedgerNotInitialisedError, "the database has no ledger schema, or one of another version: a privacy officer "
                                "runs 'dpctl ledger init'"),
    (sa.exc.DBAPIError, "the database refused or failed the read (down, unreachable, or refusing the connection's "
                        "login or its role's rights): check the connection's host and login, and that its role may "
                        "read the ledger ('dpctl ledger roles --reader-role')"),
    (sa.exc.SQLAlchemyError, "SQLAlchemy could not use the ledger's database: check the connection's URL and the "
                             "database driver"),
)


def ledger_error_hint(error: BaseException) -> str:
    """Why the ledger could not be opened or read, in fixed words any viewer may be shown: the hint of a
    :class:`LedgerUnavailableError`, a fixed text per known type (no schema, a database error, another SQLAlchemy
    error), else ``"an unexpected error"``. Never the error's message (see the module's docstring)."""
    if isinstance(error, LedgerUnavailableError):
        return error.hint
    for kind, hint in _HINTS:
        if isinstance(error, kind):
            return hint
    return "an unexpected error"


# -- access ---------------------------------------------------------------------------------------------------
_LEDGERS: weakref.WeakKeyDictionary[Engine, LedgerBase] = weakref.WeakKeyDictionary()


def _ledger(ledger: LedgerBase | Engine | str) -> LedgerBase:
    if isinstance(ledger, LedgerBase):
        return ledger
    if isinstance(ledger, Engine):
        if ledger not in _LEDGERS:
            _LEDGERS[ledger] = LedgerBase(ledger)
        return _LEDGERS[ledger]
    return LedgerBase(ledger)


@contextlib.contextmanager
def _reading(ledger: LedgerBase | Engine | str) -> Iterator[Connection]:
    """One read-only transaction on the ledger (the schema checked first). A ledger opened here from a URL is
    closed afterwards (its engines disposed)."""
    base = _ledger(ledger)
    try:
        base.check_schema()
        with base._read() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            lenient_sqlite_text(conn)
            yield conn
    finally:
        if isinstance(ledger, str):
            base.engine.dispose()
            base._reader.dispose()


def as_utc(value: dt.datetime | None) -> dt.datetime | None:
    """Aware UTC (a naive value is taken as UTC: SQLite hands stored timestamps back naive, and the API takes a
    time without an offset as UTC); ``None`` stays ``None``.

    Raises:
        OverflowError: the conversion leaves the years 1 to 9999.
    """
    if value is None:
        return None
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def _iso(value: dt.datetime | None) -> str | None:
    value = as_utc(value)
    return None if value is None else value.isoformat()


def _exact(value: Fraction | None) -> tuple[str | None, float | None]:
    return (None, None) if value is None else (str(value), float(value))


def _time(value: Any) -> dt.datetime | None:
    """A timestamp as read (:func:`_row_values`): a datetime, or ``None`` for anything else."""
    return value if isinstance(value, dt.datetime) else None


# -- who sees what (dp_operators.dashboard.access, ADR 0035) ----------------------------------------------------
def _readable_dags(conn: Connection, access: DagAccess | None, charges_where: Any = None, events_where: Any = None,
                   extra: Any = ()) -> frozenset[str] | None:
    """The DAG ids a filtered viewer may read among ``extra`` and those of the charges (``charges_where``) and audit
    events (``events_where``) in question, each read as at most :data:`MAX_ASKED_DAGS` distinct values (the others
    count as unreadable); ``None`` (no filter) for a privacy officer or without ``access``."""
    if access is None or access.everything:
        return None
    asked = set(extra) if isinstance(extra, (list, tuple, set, frozenset)) else set()
    if charges_where is not None:
        asked.update(conn.execute(sa.select(_c.dag_id).where(charges_where).distinct().limit(MAX_ASKED_DAGS)).scalars())
    if events_where is not None:
        asked.update(conn.execute(sa.select(_e.dag_id).where(events_where).distinct().limit(MAX_ASKED_DAGS)).scalars())
    return access.readable(asked)


def _of_dags(column: Any, dags: frozenset[str] | None) -> Any:
    """The SQL filter of rows whose DAG is one of ``dags`` (``None``: every row)."""
    return sa.true() if dags is None else column.in_(sorted(dags))


def _allowed_dags(conn: Connection, name: str) -> tuple[bool, list[str] | None]:
    """Whether account ``name`` exists, and its ``allowed_dags`` as read (``None`` when unreadable)."""
    row = conn.execute(sa.select(_a.name, _a.allowed_dags).where(_a.name == name)).first()
    if row is None:
        return False, None
    read = read_row(schema.accounts, {"name": row.name, "allowed_dags": row.allowed_dags})
    return True, read.values.get("allowed_dags") if read.ok else None


def account_visible(ledger: LedgerBase | Engine | str, name: str, access: DagAccess | None) -> bool:
    """Whether account ``name`` exists and the viewer may see it (:meth:`DagAccess.may_see_account`)."""
    with _reading(ledger) as conn:
        exists, allowed = _allowed_dags(conn, name)
    return exists and (access is None or access.may_see_account(allowed))


# -- accounts -------------------------------------------------------------------------------------------------
#: The fields of an account row (:func:`accounts_overview`), all ``None`` in an unreadable account's row.
_OVERVIEW_FIELDS = (
    "accountant", "unit", "cap", "spent", "reserved", "remaining", "delta", "delta_spent", "cap_mu", "spent_mu",
    "spent_epsilon", "cap_epsilon", "privacy_unit", "allowed_dags", "cap_float", "spent_float", "reserved_float",
    "remaining_float", "delta_float", "fraction_spent",
)


def _overview_row(status) -> dict[str, Any]:
    """The fields of ``dpctl ledger show --json`` for one account (``account`` named ``name``), plus floats."""
    shown = status.summary()
    row: dict[str, Any] = {"name": shown.pop("account"), **shown}
    for field in ("cap", "spent", "reserved", "remaining", "delta"):
        row[f"{field}_float"] = _exact(getattr(status, field))[1]
    row["fraction_spent"] = float(status.spent / status.cap) if status.cap else None
    return row


def _unreadable_account(name: Any, error: UnreadableValueError) -> dict[str, Any]:
    """The row of an account whose row (or a reserved charge of it) holds a value the ledger does not write: its
    name (cut short if it is itself unreadable), every other field ``None``, and ``unreadable``."""
    readable = isinstance(name, str) and len(name) <= 200
    return {"name": name if readable else shown(name, 80), **dict.fromkeys(_OVERVIEW_FIELDS),
            "unreadable": [f"{error.where}: {error.detail}"]}


def accounts_overview(ledger: LedgerBase | Engine | str, access: DagAccess | None = None) -> list[dict[str, Any]]:
    """Every budget account, by name: the data of ``dpctl ledger show --json``.

    Each row: ``name``, ``accountant``, ``unit`` (``epsilon``, ``rho`` or ``mu_squared``); ``cap``, ``spent``
    (reserved and abandoned included, released excluded), ``reserved`` and ``remaining`` (rounded down) as exact
    strings, each with a ``*_float``; ``delta`` (exact string or ``None``) and ``delta_float``; ``delta_spent``
    (``approx_dp`` only, else ``None``); ``cap_mu``/``spent_mu`` (``gaussian_dp`` only); ``spent_epsilon`` and
    ``cap_epsilon`` (floats: epsilon at the account's delta, CKS 2020 for zCDP, Dong-Roth-Su for Gaussian DP,
    rounded up; ``None`` without a delta); ``privacy_unit``; ``allowed_dags`` (list); ``fraction_spent``
    (spent / cap as a float, for a bar); ``structure`` (``plain``, ``blocks``, ``quotas``, or ``member`` for a
    member whose parent is not in the ledger) and ``parent`` (that parent); ``members`` (a parent with blocks or
    quotas, else ``None``): ``{"kind", "window", "teams", "count", "exhausted", "unreadable", "least_remaining",
    "least_remaining_float"}`` over its member accounts; ``cannot_fund_next_run`` as in :func:`account_detail`.

    Member accounts (``X@2013-01-01``, ``X@quota:team``) are not rows of their own: they are counted in their
    parent's ``members`` and listed by :func:`account_detail` of the parent (and each still has its own detail).

    An account whose row, or one of its reserved charges, holds a value the ledger does not write has ``name``
    (cut to 80 characters if the name itself is unreadable), every other field ``None`` and ``unreadable``: a list
    of ``"<table> <row>: <column> [value] what is wrong"`` (docs/ledger.md, "Hostile rows").

    With ``access`` (:class:`~dp_operators.dashboard.access.DagAccess`) of a viewer who is no privacy officer,
    only the accounts it may see (one of their ``allowed_dags`` readable; an unreadable account never), and
    ``cannot_fund_next_run`` weighs only the releases of DAGs it may read.

    Raises:
        LedgerNotInitialisedError: the ledger has no schema (or another version).
    """
    with _reading(ledger) as conn:
        structures = {row.name: _structure(row.name, row.config) for row in conn.execute(_CONFIGS)}
        parents = {name: s["kind"] for name, s in structures.items() if s["kind"] in ("blocks", "quotas")}
        rows = conn.execute(sa.select(*ACCOUNT_READ_COLUMNS).order_by(_a.name)).all()
        members: dict[str, list[Any]] = {name: [] for name in parents}
        top = []
        for row in rows:
            parent = structures.get(row.name, {}).get("parent")
            if parent in parents and _is_member_of(parent, parents[parent], row.name):
                members[parent].append(row)  # listed on its parent's page, summed up in its parent's row
            else:
                top.append(row)
        shown_rows = []
        budgets = {}
        for row in top:
            shown_row, status = _member_row(conn, row)
            structure = structures.get(row.name) or {"kind": "plain", "parent": None, "window": None, "teams": []}
            shown_row["structure"] = structure["kind"]
            shown_row["parent"] = structure["parent"]
            shown_row["members"] = (_members_summary(structure["kind"], structure, members[row.name])
                                    if row.name in parents else None)
            shown_row["cannot_fund_next_run"] = None
            if access is not None and not access.may_see_account(shown_row.get("allowed_dags")):
                continue
            if status is not None and structure["kind"] != "blocks":  # a blocks parent is never charged
                budgets[row.name] = _budget(status)
            shown_rows.append(shown_row)
        dags = _readable_dags(conn, access, _c.account.in_(sorted(budgets))) if budgets else None
        runs = _next_runs(conn, budgets, limit=0, dags=dags)
        for shown_row in shown_rows:
            if shown_row["name"] in runs:
                shown_row["cannot_fund_next_run"] = runs[shown_row["name"]]["cannot_fund_next_run"]
        return shown_rows


def _status(conn: Connection, name: str):
    """The account's status; ``None`` if there is no such account. Raises UnreadableValueError."""
    row = conn.execute(_ACCOUNT_ROW, {"account": name}).first()
    return None if row is None else account_status(row, *reserved_totals(conn, name))


def _burn_down(conn: Connection, name: str, max_points: int) -> tuple[list[dict[str, Any]], dt.datetime | None]:
    dialect = conn.dialect.name
    first, last, count = conn.execute(_settled_span(dialect), {"account": name}).one()
    first, last = _time(sqlite_timestamp(first)), _time(sqlite_timestamp(last))
    if not count or first is None or last is None:
        return [], None
    first, last = as_utc(first), as_utc(last)
    span = (last - first).total_seconds()
    # equal buckets from the first to the last charge; bucket i holds times near t0 + i * width, so the index
    # (truncated on SQLite, rounded on PostgreSQL) runs from 0 to max_points - 1
    width = span / (max_points - 1) if span > 0 else 1.0
    points, total, charges = [], 0.0, 0
    rows = conn.execute(_burn_down_buckets(dialect), {"account": name, "t0": first.timestamp(), "width": width})
    for time, amount, number in rows:
        total += amount or 0.0  # NULL: no amount in the bucket in the ledger's form
        charges += number
        points.append({"time": _iso(_time(sqlite_timestamp(time))), "cumulative": total, "charges": charges})
    return points, first


def _forecast(
    conn: Connection, name: str, remaining: Fraction, first: dt.datetime | None, now: dt.datetime, days: float
) -> dict[str, Any]:
    start = now - dt.timedelta(days=days)
    spend, count = conn.execute(_WINDOW_SPEND, {"account": name, "start": start, "end": now}).one()
    forecast: dict[str, Any] = {
        "method": f"settled spend (committed + abandoned) over the last {days:g} days before now, or since the "
        "first settled charge if later; remaining / that rate, from now; no rate before that window spans "
        f"{_days(MIN_FORECAST_HISTORY_DAYS)}",
        "window_days": days,
        "min_history_days": MIN_FORECAST_HISTORY_DAYS,
        "window_from_first_charge": False,
        "window_start": None,
        "window_end": now.isoformat(),
        "window_spend": float(spend or 0.0),
        "window_charges": count,
        "rate_per_day": None,
        "remaining": float(remaining),
        "exhausted": remaining <= 0,
        "exhausts_at": None,
        "days_left": None,
        "reason": None,
    }
    if first is None or not count or not spend:
        forecast["reason"] = f"no settled spend in the last {_days(days)}"
        return forecast
    effective = max(start, first)
    forecast["window_start"] = effective.isoformat()
    forecast["window_from_first_charge"] = first > start
    elapsed_days = (now - effective).total_seconds() / _DAY
    if elapsed_days < MIN_FORECAST_HISTORY_DAYS:
        forecast["reason"] = f"not enough history: settled spend spans less than {_days(MIN_FORECAST_HISTORY_DAYS)}"
        return forecast
    rate = spend / elapsed_days
    forecast["rate_per_day"] = rate
    if remaining <= 0:
        forecast["days_left"] = 0.0
        forecast["exhausts_at"] = now.isoformat()
        return forecast
    days_left = float(remaining) / rate
    forecast["days_left"] = days_left
    with contextlib.suppress(OverflowError):  # beyond year 9999: no date
        forecast["exhausts_at"] = (now + dt.timedelta(days=days_left)).isoformat()
    return forecast


def _days(days: float) -> str:
    return f"{days:g} day" if days == 1 else f"{days:g} days"


_SERIES_NAMES = ("dag_id", "task_id", "map_index", "release_name")


def _account_series(conn: Connection, name: str,
                    dags: frozenset[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """The first :data:`MAX_SERIES` series of account ``name`` (see :func:`account_detail`) and how many it has.
    One scan of the account's step charges, grouped in SQL by series and amount, of which the first
    :data:`MAX_SERIES_AMOUNTS` groups are read; then the mechanisms that give the listed series' horizons (by id),
    and the number of series only when the groups read do not hold them all."""
    of_dags = _of_dags(_c.dag_id, dags)
    groups = conn.execute(_SERIES_GROUPS.where(of_dags).limit(MAX_SERIES_AMOUNTS + 1), {"account": name}).all()
    cut = len(groups) > MAX_SERIES_AMOUNTS
    series: dict[tuple, list[Any]] = {}
    for group in groups[:MAX_SERIES_AMOUNTS]:
        series.setdefault(tuple(group[:5]), []).append(group)
    counted = sa.select(sa.func.count()).select_from(
        sa.select(*_SERIES_KEY).where(*_OF_SERIES, of_dags).group_by(*_SERIES_KEY).subquery())
    total = conn.execute(counted, {"account": name}).scalar() if cut else len(series)
    listed = list(series.values())[:MAX_SERIES]
    # the group after the cut may belong to the last series read: that one is then left out, or, when it is the
    # only one, listed from the groups read, without a charge
    partial = cut and tuple(groups[MAX_SERIES_AMOUNTS][:5]) == tuple(groups[MAX_SERIES_AMOUNTS - 1][:5])
    if partial and len(series) > 1:
        partial = False
        if len(listed) == len(series):
            listed.pop()
    ids = [_described_by(parts) for parts in listed]
    mechanisms = {row.id: row.mechanisms for row in conn.execute(_MECHANISMS_OF, {"ids": ids})} if ids else {}
    return [_series_entry(parts, mechanisms.get(_described_by(parts)), partial) for parts in listed], total


def _described_by(groups: list[Any]) -> int:
    """The charge whose recorded mechanisms give a series' horizon: its last committed step's, else its first."""
    committed = [group.last_charge_id for group in groups if group.last_charge_id is not None]
    return max(committed) if committed else min(group.first_charge_id for group in groups)


def _series_entry(groups: list[Any], mechanisms: Any, partial: bool) -> dict[str, Any]:
    """One series of :func:`account_detail` from its groups of ``_SERIES_GROUPS`` (one per amount; ``partial``:
    not all of them were read) and the mechanisms (the ledger's text) of :func:`_described_by`; unreadable fields
    ``None``, each named in ``unreadable``."""
    row = groups[0]
    first = min(group.first_charge_id for group in groups)
    names = read_row(schema.charges, {"id": first, **{field: getattr(row, field) for field in _SERIES_NAMES}})
    problems = names.reasons()
    entry: dict[str, Any] = {field: None if field in names.unreadable else getattr(row, field)
                             for field in _SERIES_NAMES}
    generation = _SERIES_GENERATION_RUN_ID.fullmatch(row.generation)  # the SQL kept only run ids of this form
    last_run_ids = [group.last_run_id for group in groups if group.last_run_id is not None]
    last = SERIES_STEP_RUN_ID.fullmatch(max(last_run_ids)) if last_run_ids else None  # 6 digits: text order
    committed = [group.last_charge_id for group in groups if group.last_charge_id is not None]
    horizon = None
    read = read_row(schema.charges, {"id": _described_by(groups), "mechanisms": mechanisms})
    if read.ok:  # each step's record names the series' horizon (dp_operators.continual.run)
        horizons = [m.get("horizon") for m in read.values["mechanisms"] if isinstance(m, dict)]
        horizon = next((h for h in horizons if type(h) is int and h >= 0), None)
    else:
        problems += read.reasons()
    charged: Fraction | None = None
    if partial:
        problems.append(f"amount: its steps hold more than the {MAX_SERIES_AMOUNTS:,} different amounts the dashboard "
                        "reads, so its charge is not shown and its counts are those of the amounts read; 'dpctl "
                        "ledger verify' checks them")
    else:
        charged = Fraction(0)
        for group in groups:
            read = read_row(schema.charges, {"amount": group.amount})
            if not read.ok:
                problems += read.reasons()
                charged = None
            elif charged is not None and group.charges:
                charged += group.charges * read.values["amount"]
                if charged.denominator > MAX_DENOMINATOR**2:  # rows written around the ledger: shown rounded up
                    charged = round_up(charged)
    steps = sum(group.steps_committed for group in groups)  # a step commits once, so in one group
    entry.update(
        generation=int(generation[1]) if generation else None,
        steps_committed=steps,
        last_step=int(last[2]) if last else None,
        horizon=horizon,
        steps_left=None if horizon is None else max(horizon - steps, 0),
        charged=None if charged is None else str(charged),
        charged_float=None if charged is None else float(charged),
        redraws=sum(group.redraws for group in groups),
        last_charge_id=max(committed) if committed else None,
    )
    if problems:
        entry["unreadable"] = problems
    return entry


def account_detail(
    ledger: LedgerBase | Engine | str,
    name: str,
    *,
    now: dt.datetime | None = None,
    window_days: float = FORECAST_WINDOW_DAYS,
    max_points: int = MAX_BURN_DOWN_POINTS,
    blocks_before: str | None = None,
    blocks_limit: int = BLOCKS_PAGE,
    access: DagAccess | None = None,
) -> dict[str, Any] | None:
    """One account: its :func:`accounts_overview` row plus ``burn_down``, ``forecast``, ``charge_counts``,
    ``series``, its budget structure, its refused attempts and whether it can fund another run; ``None`` if there is
    no account ``name``.

    * ``burn_down``: ``{"unit", "cap_float", "points": [{"time", "cumulative", "charges"}, ...]}``, cumulative
      settled spend (committed + abandoned, a float in the account's unit) against time (ISO 8601 UTC, the
      creation time of the bucket's last charge), at most ``max_points`` points: the span from the first to the
      last settled charge is cut into equal time buckets, summed in SQL (``GROUP BY``); ``charges`` is the
      cumulative count. Without settled charges ``points`` is empty.
    * ``forecast``: the exhaustion date at the recent rate: settled spend created in ``[now - window_days, now]``
      divided by the days from the later of that start and the first settled charge to ``now``; no rate when those
      days are fewer than :data:`MIN_FORECAST_HISTORY_DAYS`. Keys: ``method`` (this in words), ``window_days``,
      ``min_history_days``, ``window_start`` (the later of the two), ``window_from_first_charge`` (true when the
      first settled charge is the later, so the window is shorter than ``window_days``), ``window_end``,
      ``window_spend``, ``window_charges``, ``rate_per_day`` (unit per day), ``remaining`` (float of the exact
      remaining budget), ``exhausted`` (bool), ``days_left`` and ``exhausts_at`` (ISO 8601 UTC), and ``reason``:
      ``None`` when there is a rate, else why not in words (``"no settled spend in the last 30 days"``, ``"not
      enough history: settled spend spans less than 1 day"``), and then ``rate_per_day``, ``days_left`` and
      ``exhausts_at`` are ``None``.
    * ``charge_counts``: ``{state: count}`` for every state of :data:`CHARGE_STATES`, and ``total`` (every charge of
      the account, also those whose state is none of them).
    * ``series``: the account's continual-release series (docs/continual.md, ADR 33), the first :data:`MAX_SERIES`
      by key, and ``series_total`` how many it has (0 and ``[]`` without any). A series is the account's charges
      whose run id is a step's (``__dp_series__/g<generation>/step/<step>``) with one ``(dag_id, task_id, map_index,
      release_name, generation)``; each has those five, ``steps_committed``, ``last_step`` (0-based, ``None`` before
      the first commit), ``horizon`` (from the recorded mechanisms of its last committed step, else its first;
      ``None`` if they name none), ``steps_left`` (``None`` without a horizon), ``charged`` (exact string, the
      account's unit: its steps' amounts but those of released charges, whose budget came back: the series' charge
      plus its redraws) and ``charged_float``, ``redraws`` (step attempts after a step's first) and
      ``last_charge_id`` (the last committed step's charge, ``None`` before the first). The grouping and the counts
      are SQL (``GROUP BY`` series and amount, at most :data:`MAX_SERIES_AMOUNTS` groups read): the steps are never
      read one by one. A series whose names, amounts or recorded mechanisms hold a value the ledger does not write
      has ``None`` there and ``unreadable`` naming each.

    * ``structure``, ``parent`` and ``members`` as in :func:`accounts_overview` (``members`` counts all the
      blocks or quotas, and the exhausted ones).
    * ``blocks`` (privacy blocks only): a page of the account's blocks, the latest window first: each an
      :func:`accounts_overview` row of its member account plus ``window`` and ``cannot_fund_next_run``;
      ``blocks_next_before`` is the ``blocks_before`` of the next page (``None`` on the last), ``blocks_limit`` the
      page size. The parent itself is never charged: its own spent stays 0.
    * ``quotas`` (team quotas only): per team, its member account's row (the quota is its ``cap``) plus ``team`` and
      ``cannot_fund_next_run``; ``missing`` true for a team whose member the ledger does not hold.
    * ``refusals``: the latest :data:`MAX_REFUSALS` ``refused`` audit events of the account (and of its members, on
      a parent: each is recorded on the member that refused), latest first: ``id``, ``account`` (the one refused),
      the release key fields, ``attempt``, ``amount`` and ``delta_amount`` (what was asked), ``reason`` (the event's
      ``details.reason``: ``budget_exhausted``, ``dag_not_allowed``, ...), ``remaining`` and ``remaining_unit``
      (for ``budget_exhausted``), ``created_at``; ``refusals_total`` counts them all up to
      :data:`MAX_REFUSALS_COUNTED`, and ``refusals_more`` is true when there are more.
    * ``next_run``: ``{"cannot_fund_next_run", "runs", "runs_total"}``: per ``(dag_id, task_id, release_name)`` the
      account committed, the amount of its last committed charge as what one run costs (``charge_id``, ``amount``,
      ``delta_amount``) and ``fundable`` (``amount <= remaining``, and the delta on ``approx_dp``), the most recent
      :data:`MAX_NEXT_RUNS` first (of the :data:`MAX_NEXT_RUN_KEYS` most recent keys). ``cannot_fund_next_run`` (also at the top level and in ``forecast``) is true when
      one of them is not fundable: the ledger would refuse that release's next run although the account is not
      exhausted. ``None`` on a parent with blocks (each block says it).

    An account whose row (or a reserved charge of it) is unreadable is its :func:`accounts_overview` row
    (``unreadable``, the other fields ``None``) with ``charge_counts``, ``series``, ``structure`` and ``refusals``,
    and ``burn_down``, ``forecast`` and ``cannot_fund_next_run`` ``None``.

    * ``approvals``: the account's pending approval requests (:func:`pending_approvals`), ``approvals_total`` and
      ``approvals_more``.
    * ``restricted``: true when ``access`` is a viewer's who is no privacy officer. Then the account is ``None``
      unless the viewer may see it (one of its ``allowed_dags`` readable), and the lists and counts (``charge_counts``,
      ``series``, ``refusals``, ``next_run``, ``approvals``, the quotas of teams whose DAGs it may not read, each
      block's and quota's ``cannot_fund_next_run``) hold only the DAGs it may read; the totals, burn-down and
      forecast are the account's own, over every DAG that spends it (ADR 0035).

    Args:
        now: the forecast's reference time (default: the current time, UTC).
        window_days: the forecast's window.
        max_points: most points of the burn-down (at least 2).
        blocks_before: list the blocks whose window comes before this one (the previous page's last window).
        blocks_limit: blocks per page.

    Raises:
        ValueError: ``max_points`` below 2.
        LedgerNotInitialisedError: the ledger has no schema (or another version).
    """
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")
    now = as_utc(now) or dt.datetime.now(dt.timezone.utc)
    with _reading(ledger) as conn:
        try:
            status = _status(conn, name)
        except UnreadableValueError as error:
            status = error
        if status is None:
            return None
        structure = _structure(name, conn.execute(sa.select(_a.config).where(_a.name == name)).scalar())
        kind = structure["kind"]
        parent = kind in ("blocks", "quotas")
        dags = None
        if access is not None and not access.everything:
            allowed = _allowed_dags(conn, name)[1]
            if not access.may_see_account(allowed):
                return None
            members = _c.account.startswith(_member_prefix(name), autoescape=True)
            event_members = _e.account.startswith(_member_prefix(name), autoescape=True)
            dags = _readable_dags(
                conn, access, sa.or_(_c.account == name, members) if parent else _c.account == name,
                sa.and_(sa.or_(_e.account == name, event_members) if parent else _e.account == name,
                        _e.event.in_(("refused", APPROVAL_REQUESTED))),
                allowed)
        counts = dict.fromkeys(CHARGE_STATES, 0)
        total = 0
        for state, number in conn.execute(_STATE_COUNTS.where(_of_dags(_c.dag_id, dags)), {"account": name}):
            if state in counts:
                counts[state] = number
            total += number
        counts["total"] = total
        series, series_total = _account_series(conn, name, dags)
        refusals, refusals_total = _refusals(conn, name, with_members=parent, dags=dags)
        approvals, approvals_total = _pending_approvals(conn, name, dags, now)
        common = {"structure": kind, "parent": structure["parent"],
                  "members": _members_of(conn, name, structure) if parent else None,
                  "refusals": refusals, "refusals_total": min(refusals_total, MAX_REFUSALS_COUNTED),
                  "refusals_more": refusals_total > MAX_REFUSALS_COUNTED,
                  "approvals": approvals, "approvals_total": approvals_total,
                  "approvals_more": approvals_total > len(approvals), "restricted": dags is not None}
        if isinstance(status, UnreadableValueError):
            return {**_unreadable_account(name, status), "burn_down": None, "forecast": None, "charge_counts": counts,
                    "series": series, "series_total": series_total, "cannot_fund_next_run": None, **common}
        detail = _overview_row(status)
        points, first = _burn_down(conn, name, max_points)
        detail["burn_down"] = {"unit": status.unit, "cap_float": float(status.cap), "points": points}
        detail["forecast"] = _forecast(conn, name, status.remaining, first, now, window_days)
        detail["charge_counts"] = counts
        detail["series"], detail["series_total"] = series, series_total
        detail.update(common)
        if kind == "blocks":  # the parent is never charged: each block weighs its own runs
            next_run = {"cannot_fund_next_run": None, "runs": [], "runs_total": 0}
            detail.update(_blocks(conn, name, blocks_before, blocks_limit, dags))
        else:
            next_run = _next_runs(conn, {name: _budget(status)}, dags=dags)[name]
        if kind == "quotas":
            detail["quotas"] = _quotas(conn, name, structure["teams"], access, dags)
        detail["next_run"] = next_run
        detail["cannot_fund_next_run"] = detail["forecast"]["cannot_fund_next_run"] = next_run["cannot_fund_next_run"]
    return detail


# -- budget structure: privacy blocks, team quotas, refusals, the next run --------------------------------------

_e = schema.audit_events.c
_CONFIGS = sa.select(_a.name, _a.config).order_by(_a.name)
_ACCOUNTANT_OF = sa.select(_a.accountant).where(_a.name == sa.bindparam("account"))
_REFUSAL_COLUMNS = (
    _e.id, _e.account, _e.created_at, _e.dag_id, _e.run_id, _e.task_id, _e.map_index, _e.release_name, _e.attempt,
    _e.amount, _e.delta_amount, _e.details,
)


def _short(text: str, length: int) -> str:
    """``text`` as it is, or cut to ``length`` characters and an ellipsis."""
    return text if len(text) <= length else text[:length] + "…"


def unit_or_none(accountant: Any) -> str | None:
    """The unit (``epsilon``, ``rho``, ``mu_squared``) of an accountant name; ``None`` for any other value."""
    return ACCOUNTANTS.get(accountant) if isinstance(accountant, str) else None


def _structure(name: Any, config: Any) -> dict[str, Any]:
    """An account's budget structure from its stored ``config`` (read within bounds; an unreadable one is a plain
    account): ``{"kind": "blocks" | "quotas" | "member" | "plain", "parent", "window", "teams"}`` with ``parent`` the
    parent of a member, ``window`` the granularity of blocks, ``teams`` the quotas' teams (sorted)."""
    from dp_operators.ledger.structure import structure_of

    read = read_row(schema.accounts, {"name": name, "config": config})
    kind, detail = structure_of(read.values.get("config") if read.ok else None)
    out: dict[str, Any] = {"kind": kind, "parent": None, "window": None, "teams": []}
    if kind == "member":
        if isinstance(detail, str) and isinstance(name, str) and name.startswith(detail + MEMBER_SEPARATOR):
            out["parent"] = detail
        else:  # a member record that names no parent it is part of: shown as a plain account
            out["kind"] = "plain"
    elif kind == "blocks":
        out["window"] = detail if detail in WINDOWS else None
    elif kind == "quotas":
        out["teams"] = sorted(team for team in detail if isinstance(team, str))
    return out


def _member_prefix(name: str) -> str:
    return name + MEMBER_SEPARATOR


def _is_member_of(parent: str, parent_kind: str, name: Any) -> bool:
    """Whether ``name`` is a member account of ``parent`` by its name: a block ``parent@<window>`` or a quota
    ``parent@quota:<team>``."""
    if not isinstance(name, str) or not name.startswith(_member_prefix(parent)):
        return False
    quota = name[len(parent) + 1:].startswith(QUOTA_PREFIX)
    return quota if parent_kind == "quotas" else not quota


def _remaining_of(row: Any) -> Fraction | None:
    """The exact remaining budget of an account row (cap - spent, rounded down, at least 0); ``None`` when either is
    unreadable."""
    read = read_row(schema.accounts, {"name": row.name, "cap": row.cap, "spent": row.spent})
    if not read.ok:
        return None
    return round_down(max(read.values["cap"] - read.values["spent"], Fraction(0)))


def _members_summary(kind: str, structure: dict[str, Any], member_rows: list[Any]) -> dict[str, Any]:
    """How many members a parent has, how many are exhausted (nothing remains) and the least remaining."""
    remaining = [_remaining_of(row) for row in member_rows]
    known = [value for value in remaining if value is not None]
    least = min(known, default=None)
    return {
        "kind": kind,
        "window": structure["window"],
        "teams": structure["teams"],
        "count": len(member_rows),
        "exhausted": sum(1 for value in known if value <= 0),
        "unreadable": len(remaining) - len(known),
        "least_remaining": None if least is None else str(least),
        "least_remaining_float": None if least is None else float(least),
    }


def _next_runs(conn: Connection, budgets: dict[str, tuple[Fraction, Fraction | None]],
               limit: int = MAX_NEXT_RUNS, dags: frozenset[str] | None = None) -> dict[str, dict[str, Any]]:
    """Per account of ``budgets`` (``{name: (remaining, remaining delta or None)}``): whether it can fund another
    run of each ``(dag_id, task_id, release_name)`` it committed, taking the amount of that key's last committed
    charge as what one run costs: ``{"cannot_fund_next_run", "runs": [...], "runs_total"}``, the runs most recently
    committed first, at most ``limit`` per account. ``cannot_fund_next_run`` is true when one run's amount (or, on
    an ``approx_dp`` account, its delta) is more than what remains: the ledger would refuse the next run. ``dags``:
    only the releases of these DAGs (``None``: all)."""
    out = {name: {"cannot_fund_next_run": False, "runs": [], "runs_total": 0} for name in budgets}
    if not budgets:
        return out
    key = (_c.account, _c.dag_id, _c.task_id, _c.release_name)
    last = (sa.select(*key, sa.func.max(_c.id).label("last_id"))
            .where(_c.account.in_(list(budgets)), _COMMITTED, _of_dags(_c.dag_id, dags)).group_by(*key).subquery())
    rows = conn.execute(
        sa.select(_c.id, _c.account, _c.dag_id, _c.task_id, _c.release_name, _c.amount, _c.delta_amount)
        .join(last, _c.id == last.c.last_id).order_by(_c.id.desc()).limit(MAX_NEXT_RUN_KEYS)
    ).all()
    for row in rows:
        entry = out.get(row.account)
        if entry is None:
            continue
        entry["runs_total"] += 1
        remaining, remaining_delta = budgets[row.account]
        read = read_row(schema.charges, row)
        amount, delta = read.values.get("amount"), read.values.get("delta_amount")
        if read.ok:
            fundable = amount <= remaining and (remaining_delta is None or delta <= remaining_delta)
        else:
            fundable = None
        if fundable is False:
            entry["cannot_fund_next_run"] = True
        if len(entry["runs"]) < limit:
            run = {field: None if field in read.unreadable else getattr(row, field)
                   for field in ("dag_id", "task_id", "release_name")}
            run.update(charge_id=row.id, amount=None if amount is None else str(amount),
                       amount_float=None if amount is None else float(amount),
                       delta_amount=None if delta is None else str(delta), fundable=fundable)
            if not read.ok:
                run["unreadable"] = read.reasons()
            entry["runs"].append(run)
    return out


def _budget(status) -> tuple[Fraction, Fraction | None]:
    return status.remaining, status.remaining_delta


def _member_row(conn: Connection, row: Any) -> tuple[dict[str, Any], Any]:
    """A member account's row as :func:`accounts_overview` gives it, and its status (``None`` if unreadable)."""
    try:
        status = account_status(row, *reserved_totals(conn, row.name))
    except UnreadableValueError as error:
        return _unreadable_account(row.name, error), None
    return _overview_row(status), status


def _members_where(name: str, kind: str) -> tuple[Any, ...]:
    """The SQL filter of parent ``name``'s member accounts by name (:func:`_is_member_of`)."""
    prefix = _member_prefix(name)
    quota = _a.name.startswith(prefix + QUOTA_PREFIX, autoescape=True)
    return _a.name.startswith(prefix, autoescape=True), quota if kind == "quotas" else sa.not_(quota)


def _members_of(conn: Connection, name: str, structure: dict[str, Any]) -> dict[str, Any]:
    """The :func:`_members_summary` of parent ``name`` (one read of its members' names, caps and spends)."""
    rows = conn.execute(sa.select(_a.name, _a.cap, _a.spent).where(*_members_where(name, structure["kind"]))).all()
    return _members_summary(structure["kind"], structure, rows)


def _blocks(conn: Connection, name: str, before: str | None, limit: int,
            dags: frozenset[str] | None = None) -> dict[str, Any]:
    """The privacy blocks of parent ``name``, the latest window first (windows of a granularity sort by name): a
    page of ``limit`` after the window ``before`` (exclusive), each with its window, cap, spent, reserved,
    remaining and whether it can fund another run."""
    prefix = _member_prefix(name)
    query = (sa.select(*ACCOUNT_READ_COLUMNS).where(*_members_where(name, "blocks")).order_by(_a.name.desc())
             .limit(limit + 1))
    if before is not None:
        query = query.where(_a.name < prefix + before)
    rows = conn.execute(query).all()
    page = []
    statuses = {}
    for row in rows[:limit]:
        shown_row, status = _member_row(conn, row)
        shown_row["window"] = row.name[len(prefix):] if isinstance(row.name, str) else None
        page.append(shown_row)
        if status is not None:
            statuses[status.name] = _budget(status)
    runs = _next_runs(conn, statuses, dags=dags)
    for shown_row in page:
        shown_row["cannot_fund_next_run"] = runs.get(shown_row["name"], {}).get("cannot_fund_next_run")
    return {
        "blocks": page,
        "blocks_before": before,
        "blocks_next_before": page[-1]["window"] if len(rows) > limit and page else None,
        "blocks_limit": limit,
    }


def _quotas(conn: Connection, name: str, teams: list[str], access: DagAccess | None = None,
            dags: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """Per team of parent ``name``'s quotas: its member account's row (quota as ``cap``, ``spent``, ``reserved``,
    ``remaining``), the DAGs it covers and whether it can fund another run; ``missing`` when the ledger has no
    member for it (``dpctl ledger apply`` creates them). With a filtered ``access``, only the teams whose quota the
    viewer may see (one of its DAGs readable), and their next runs of ``dags`` only."""
    from dp_operators.ledger.structure import quota_account

    out, statuses = [], {}
    for team in teams:
        member = quota_account(name, team)
        row = conn.execute(_ACCOUNT_ROW, {"account": member}).first()
        if row is None:
            out.append({"team": team, "name": member, "missing": True})
            continue
        shown_row, status = _member_row(conn, row)
        if access is not None and not access.may_see_account(shown_row.get("allowed_dags")):
            continue
        shown_row["team"] = team
        out.append(shown_row)
        if status is not None:
            statuses[member] = _budget(status)
    runs = _next_runs(conn, statuses, dags=dags)
    for shown_row in out:
        shown_row["cannot_fund_next_run"] = runs.get(shown_row["name"], {}).get("cannot_fund_next_run")
    return out


def _time_text(value: Any) -> str | None:
    """An audit event's ``created_at`` text as ISO 8601 UTC; ``None`` if it holds no time."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        return _iso(dt.datetime.fromisoformat(value.replace(" ", "T")))
    except (ValueError, OverflowError):
        return None


def _refusals(conn: Connection, name: str, with_members: bool,
              dags: frozenset[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """The refused attempts on account ``name`` (and, on a parent, on its members: a refusal is recorded on the
    member that refused), the latest :data:`MAX_REFUSALS` first, and how many there are (counted up to
    :data:`MAX_REFUSALS_COUNTED` + 1)."""
    accounts = _e.account == name
    if with_members:
        accounts = sa.or_(accounts, _e.account.startswith(_member_prefix(name), autoescape=True))
    where = (_e.event == "refused", accounts, _of_dags(_e.dag_id, dags))
    counted = sa.select(_e.id).where(*where).limit(MAX_REFUSALS_COUNTED + 1).subquery()
    total = conn.execute(sa.select(sa.func.count()).select_from(counted)).scalar()
    rows = conn.execute(sa.select(*_REFUSAL_COLUMNS).where(*where).order_by(_e.id.desc()).limit(MAX_REFUSALS)).all()
    out = []
    for row in rows:
        values = dict(row._mapping)
        created = values.pop("created_at")
        read = read_row(schema.audit_events, values)
        checked = read.values
        details = checked.get("details") if isinstance(checked.get("details"), dict) else {}
        entry = {field: None if field in read.unreadable else value for field, value in values.items()
                 if field not in ("amount", "delta_amount", "details")}
        reason, remaining, unit = details.get("reason"), details.get("remaining"), details.get("unit")
        entry.update(
            created_at=_time_text(created),
            amount=None if checked.get("amount") is None else str(checked["amount"]),
            delta_amount=None if checked.get("delta_amount") is None else str(checked["delta_amount"]),
            reason=_short(reason, 80) if isinstance(reason, str) else None,
            remaining=remaining if isinstance(remaining, str) and len(remaining) <= 130 else None,
            remaining_unit=_short(unit, 20) if isinstance(unit, str) else None,
        )
        if not read.ok:
            entry["unreadable"] = read.reasons()
        out.append(entry)
    return out, total


def _charge_split(mechanisms: Any, unit: str | None) -> dict[str, Any]:
    """A charge's loss split per aggregate, from its recorded ``mechanisms`` (one entry per noised step, each
    naming its ``aggregate``, ``component``, ``mechanism`` and its own loss: ``epsilon_exact``, ``rho_exact``,
    ``delta_exact``).

    Returns ``{"unit", "aggregates": [{"aggregate", "steps": [...], "loss", "loss_float", "delta", "bounding_mode",
    "bounding"}], "total",
    "total_float", "complete"}``: ``loss`` is the sum of the steps' recorded losses in the account's ``unit``
    (exact strings), ``None`` when a step's loss is recorded in another unit (a Laplace step, epsilon, on a zCDP
    account: the ledger converts it, which the record does not repeat; a ``mu_squared`` account's steps record
    rho). ``total`` sums them when every aggregate has one; ``complete`` is false when steps were left out
    (:data:`MAX_SPLIT_STEPS`). ``bounding_mode`` is ``enforced`` or ``declared`` (the aggregate's contribution
    bounding as its steps recorded it; none recorded: declared), ``bounding`` the same in words
    (:func:`~dp_operators.ledger.structure.describe_bounding`: source, unit column, SQL digest)."""
    steps = mechanisms if isinstance(mechanisms, list) else []
    key = {"epsilon": "epsilon_exact", "rho": "rho_exact"}.get(unit or "")
    groups: dict[str, dict[str, Any]] = {}
    for described in steps[:MAX_SPLIT_STEPS]:
        if not isinstance(described, dict):
            continue
        name = described.get("aggregate")
        name = _short(name, 200) if isinstance(name, str) else "-"
        group = groups.setdefault(name, {"aggregate": name, "steps": [], "loss": Fraction(0), "delta": Fraction(0),
                                         "bounding_steps": []})
        group["bounding_steps"].append(described)
        losses = {}
        for field in ("epsilon", "rho", "delta"):
            try:
                losses[field] = read_number(described.get(f"{field}_exact"))
            except BoundsError:
                losses[field] = None
        text = {field: described.get(field) if isinstance(described.get(field), str) else None
                for field in ("component", "mechanism")}
        group["steps"].append({**{field: _short(value, 80) if value else None for field, value in text.items()},
                               **{field: None if value is None else str(value) for field, value in losses.items()}})
        share = losses.get(key.split("_")[0]) if key else None
        if share is None or group["loss"] is None:
            group["loss"] = None
        else:
            group["loss"] += share
        if losses["delta"] is not None and group["delta"] is not None:
            group["delta"] += losses["delta"]
    aggregates = []
    total: Fraction | None = Fraction(0)
    for group in groups.values():
        loss = group["loss"]
        total = None if loss is None or total is None else total + loss
        # how the aggregate's contribution bounds held, from its steps' record (none recorded: declared)
        bounding = next(iter(bounding_by_aggregate(group.pop("bounding_steps")).values()), None)
        group.update(bounding_mode=bounding_summary([{"contribution_bounding": bounding}]),
                     bounding=_short(describe_bounding(bounding), 300))
        aggregates.append({**group, "loss": None if loss is None else str(loss),
                           "loss_float": None if loss is None else float(loss), "delta": str(group["delta"])})
    return {
        "unit": unit,
        "aggregates": aggregates,
        "total": None if total is None or not aggregates else str(total),
        "total_float": None if total is None or not aggregates else float(total),
        "complete": len(steps) <= MAX_SPLIT_STEPS,
    }


# -- charges --------------------------------------------------------------------------------------------------
def _mechanism_names(described: Any) -> list[str]:
    """The mechanism names of a charge's mechanisms (parsed JSON), in order, without repeats."""
    if not isinstance(described, list):
        return []
    names = [m.get("mechanism") for m in described if isinstance(m, dict)]
    return list(dict.fromkeys(n if isinstance(n, str) and len(n) <= 200 else shown(n, 80) for n in names if n))


def _charge_row(row: Any) -> dict[str, Any]:
    """A page's charge (see :func:`account_charges`); an unreadable one with ``None`` in each unreadable field and
    ``unreadable``."""
    values = _row_values(row)
    read = read_row(schema.charges, values)
    checked = read.values
    amount = checked["amount"]
    charge = {name: None if name in read.unreadable else value for name, value in values.items()}
    charge.update(
        amount=None if amount is None else str(amount),
        amount_float=None if amount is None else float(amount),
        mechanisms=_mechanism_names(checked["mechanisms"]),
        # enforced / declared / mixed / "-", from the contribution_bounding its steps recorded (none: declared)
        bounding=None if "mechanisms" in read.unreadable else bounding_summary(checked["mechanisms"]),
        created_at=_iso(_time(checked["created_at"])),
        updated_at=_iso(_time(checked["updated_at"])),
    )
    if not read.ok:
        charge["unreadable"] = read.reasons()
    return charge


def account_charges(
    ledger: LedgerBase | Engine | str,
    name: str,
    *,
    dag_id: str | None = None,
    state: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    after: int | None = None,
    limit: int = 50,
    access: DagAccess | None = None,
) -> dict[str, Any] | None:
    """A page of account ``name``'s charges, by id (oldest first), as ``dpctl ledger history`` filters them;
    ``None`` if there is no account ``name``.

    Returns ``{"account", "unit", "charges": [...], "total", "next_after", "limit"}`` (``unit``: the
    accountant's, every amount's, ``None`` for an unreadable accountant): each charge has ``id``,
    ``dag_id``, ``run_id``, ``task_id``, ``map_index``, ``release_name``, ``attempt``, ``state``, ``amount``
    (exact string, account's unit) and ``amount_float``, ``delta_amount`` (exact string), ``mechanisms`` (the
    mechanism names, in order, without repeats), ``created_at`` and ``updated_at`` (ISO 8601 UTC). ``total``
    counts every charge matching the filters (all pages); ``next_after`` is the ``after`` of the next page, or
    ``None`` on the last one.

    Args:
        dag_id, state: filters (``state`` one of :data:`CHARGE_STATES`).
        since, until: creation time, ``since`` inclusive, ``until`` exclusive (naive values are UTC; the app
            passes aware UTC times, :func:`dp_operators.dashboard.app.time_window`).
        after: keyset cursor: only charges with an id above it.
        limit: page size, 1 to :data:`MAX_PAGE`.
        access: a viewer's (ADR 0035): ``None`` unless it may see the account, and only the charges of DAGs it
            may read (``total`` counts those).

    Raises:
        ValueError: an unknown state or a limit out of range.
        LedgerNotInitialisedError: the ledger has no schema (or another version).
    """
    if state is not None and state not in CHARGE_STATES:
        raise ValueError(f"unknown charge state {state!r}: use one of {', '.join(CHARGE_STATES)}")
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    filters = [_c.account == name]
    if dag_id is not None:
        filters.append(_c.dag_id == dag_id)
    if state is not None:
        filters.append(_c.state == state)
    if since is not None:
        filters.append(_c.created_at >= as_utc(since))
    if until is not None:
        filters.append(_c.created_at < as_utc(until))
    with _reading(ledger) as conn:
        account = conn.execute(sa.select(_a.name, _a.accountant).where(_a.name == name)).first()
        if account is None:
            return None
        if access is not None and not access.everything:
            allowed = _allowed_dags(conn, name)[1]
            if not access.may_see_account(allowed):
                return None
            filters.append(_of_dags(_c.dag_id, _readable_dags(conn, access, _c.account == name, extra=allowed)))
        total = conn.execute(sa.select(sa.func.count()).select_from(schema.charges).where(*filters)).scalar()
        page = sa.select(*_read_columns(conn, _PAGE_COLUMNS)).where(*filters).order_by(_c.id).limit(limit + 1)
        if after is not None:
            page = page.where(_c.id > after)
        rows = conn.execute(page).all()
    more = len(rows) > limit
    charges = [_charge_row(row) for row in rows[:limit]]
    return {
        "account": name,
        "unit": unit_or_none(account.accountant),
        "charges": charges,
        "total": total,
        "next_after": charges[-1]["id"] if more else None,
        "limit": limit,
    }


def run_charges(ledger: LedgerBase | Engine | str, dag_id: str, run_id: str, *, limit: int = MAX_PAGE,
                access: DagAccess | None = None) -> dict[str, Any] | None:
    """The charges of one DAG run, in every account, by id (the dashboard's DAG-run tab).

    Returns ``{"dag_id", "run_id", "units", "charges": [...], "total", "limit"}``: each charge as in
    :func:`account_charges` plus ``account`` and ``unit`` (its account's accountant's unit); ``units`` the distinct
    units of the charges listed; at most ``limit`` charges (the first by id), ``total`` counts them
    all. A run that spent nothing has no charges (an unknown run is not an error: Airflow knows its runs, the
    ledger only those that spent). With ``access`` (ADR 0035): ``None`` unless the viewer may read DAG ``dag_id``
    (nothing is read then).

    Raises:
        ValueError: a limit out of range.
        LedgerNotInitialisedError: the ledger has no schema (or another version).
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    if access is not None and not access.may_read(dag_id):
        return None
    filters = (_c.dag_id == dag_id, _c.run_id == run_id)  # the leading columns of uq_release_attempt_account's index
    with _reading(ledger) as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(schema.charges).where(*filters)).scalar()
        columns = _read_columns(conn, (_c.account, *_PAGE_COLUMNS))
        rows = conn.execute(sa.select(*columns).where(*filters).order_by(_c.id).limit(limit)).all()
        names = sorted({row.account for row in rows if isinstance(row.account, str)})
        units = {account: unit_or_none(accountant) for account, accountant in
                 conn.execute(sa.select(_a.name, _a.accountant).where(_a.name.in_(names)))} if names else {}
    charges = [_charge_row(row) for row in rows]
    for charge in charges:
        charge["unit"] = units.get(charge["account"]) if isinstance(charge["account"], str) else None
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "units": sorted({charge["unit"] for charge in charges if charge["unit"]}),
        "charges": charges,
        "total": total,
        "limit": limit,
    }


# -- releases -------------------------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return type(value) in (int, float)  # bool is an int subclass, not a published number


def _interval(row: dict[str, Any], published_interval: Callable[[dict[str, Any]], tuple]) -> tuple[Any, Any]:
    """:func:`~dp_operators.release.publish.published_interval` of a published row, with ``None`` (an open side)
    where it cannot give a bound: the bound is beyond the doubles (a value of ``10**400``, or ``1.7e308`` with a
    half-width of ``1e308``), or the row is not what the release engine publishes (a value or half-width that is no
    number, an interval that is not a pair). The engine writes none of these, but whoever holds the spender
    connection can commit any plain finite JSON; the published value itself is always kept as stored."""
    if "interval" in row:
        interval = row["interval"]
        if not (isinstance(interval, list) and len(interval) == 2):
            return None, None
        return tuple(bound if _is_number(bound) else None for bound in interval)
    value, width = row.get("value"), row.get("half_width")
    if not (_is_number(value) and _is_number(width)):
        return None, None
    try:
        return published_interval(row)
    except OverflowError:
        # a side beyond the doubles: each side alone, as published_interval rounds the exact value -+ half-width
        # (a half-width of 0 makes it round that exact number outwards)
        sides = []
        for exact, side in ((Fraction(value) - Fraction(width), 0), (Fraction(value) + Fraction(width), 1)):
            try:
                sides.append(published_interval({"value": exact, "half_width": 0})[side])
            except OverflowError:
                sides.append(None)
        return sides[0], sides[1]


def _published_values(aggregate: dict[str, Any], limit: int | None) -> tuple[list[dict[str, Any]], int]:
    """The aggregate's first ``limit`` released values (all for ``None``) with their intervals, and how many it
    has: each ``key`` (group-by values), ``value`` (as stored), ``half_width``, ``lower``, ``upper`` (``None`` on an
    open side, see :func:`_interval`), ``saturated``."""
    from dp_operators.release.publish import published_interval  # the one definition of a published interval

    group_by = _columns(aggregate)
    rows = aggregate.get("rows")
    if rows is None:
        rows = [aggregate] if "value" in aggregate else []
    if not isinstance(rows, list):
        rows = []
    total = rows.total if isinstance(rows, CutList) else len(rows)  # rows read cut to their first ones
    values = []
    for row in rows[:limit]:
        row = row if isinstance(row, dict) else {}
        lower, upper = _interval(row, published_interval)
        shown = {
            "key": {column: row.get(column) for column in group_by},
            "value": row.get("value"),
            "half_width": row.get("half_width"),
            "lower": lower,
            "upper": upper,
            "saturated": bool(row.get("saturated", False)),
        }
        if _is_number(row.get("rank_half_width")):  # a quantile's guarantee in ranks (records)
            shown["rank_half_width"] = row["rank_half_width"]
        values.append(shown)
    return values, total


def _columns(aggregate: dict[str, Any]) -> list[str]:
    group_by = aggregate.get("group_by")
    return [column for column in group_by if isinstance(column, str)] if isinstance(group_by, list) else []


def release_detail(
    ledger: LedgerBase | Engine | str, charge_id: int, *, limit: int | None = None, access: DagAccess | None = None
) -> dict[str, Any] | None:
    """The release of charge ``charge_id``; ``None`` if there is no such charge.

    Returns the charge (``id``, ``account``, release key fields, ``attempt``, ``state``, ``amount`` and its
    ``unit``, ``output_digest``, ``created_at``, ``updated_at``), ``charge_split`` (the charge's recorded loss per
    aggregate: :func:`_charge_split`), ``output`` (the committed output JSON, or ``None`` when
    the charge is not committed), ``output_complete`` and ``aggregates``: per aggregate, ``{"name", "kind",
    "mechanism", "group_by", "confidence", "values": [...], "values_total"}`` with the first ``limit`` values of
    :func:`_published_values` (value, half-width, interval; first in the stored order) and how many there are,
    or, for an aggregate whose rows are stored as a file, ``"rows_file"`` (its ``uri``, ``sha256``, ``rows``,
    ``format``) and no ``values``: the dashboard does not read rows files. ``output`` has each aggregate's inline
    ``rows`` cut to the same first ``limit``; ``output_complete`` is false when that cut anything, so ``output`` is
    the committed output as stored (and hashes to ``output_digest``) exactly when it is true. The rows left out are
    never built (an output of millions of values is read as a stream). An output too large to show here, longer
    than :data:`MAX_SHOWN_OUTPUT_CHARS` or keeping more than :data:`MAX_SHOWN_OUTPUT_VALUES` values once cut, is
    not read further: ``output`` is ``None``, there are no aggregates, ``output_complete`` is false and
    ``output_too_large`` is true (``dpctl ledger verify`` checks it; a shorter limit may show it).

    Published values are shown as stored, whatever they are (a spender can commit any plain finite JSON): a
    bound that cannot be computed as a double is ``None``, as an open side is. A charge whose row holds a value the
    ledger does not write (an output that is not JSON within the bounds of
    :func:`~dp_operators.ledger.bounded.read_json`, an unreadable amount, ...) has ``None`` in each unreadable
    field and ``unreadable``, a list of ``"column [value] what is wrong"``; an unreadable output gives no
    aggregates.

    Args:
        limit: values per aggregate, 1 to :data:`MAX_RELEASE_VALUES`; ``None``: all of them.
        access: a viewer's (ADR 0035): ``None`` unless it may read the charge's DAG (nothing else is read then).

    Raises:
        ValueError: a limit out of range.
        LedgerNotInitialisedError: the ledger has no schema (or another version).
    """
    if limit is not None and not 1 <= limit <= MAX_RELEASE_VALUES:
        raise ValueError(f"limit must be between 1 and {MAX_RELEASE_VALUES}, got {limit}")
    with _reading(ledger) as conn:
        if access is not None and not access.everything:
            dag_id = conn.execute(sa.select(_c.dag_id).where(_c.id == charge_id)).scalar()
            if not access.may_read(dag_id):
                return None
        query = sa.select(*_read_columns(conn, _RELEASE_COLUMNS)).where(_c.id == charge_id)
        row = conn.execute(query).first()
        accountant = None if row is None else conn.execute(_ACCOUNTANT_OF, {"account": row.account}).scalar()
    if row is None:
        return None
    values = _row_values(row)
    text = values.pop("output")
    read = read_row(schema.charges, values)  # every column but the output, read below within bounds
    row = SimpleNamespace(**{name: None if name in read.unreadable else value for name, value in values.items()})
    output, problem, too_large = _release_output(text, row.state, limit)
    shown = published_form(output)
    sealed, output = shown is not output, shown
    problems = {error.column: error.detail for error in read.problems}
    if problem is not None:
        problems["output"] = f"output {problem}"
    unreadable = [problems[column.name] for column in _RELEASE_COLUMNS if column.name in problems]
    stored = output.get("aggregates") if isinstance(output, dict) else None
    aggregates, complete = [], True
    for aggregate_name, aggregate in (stored.items() if isinstance(stored, dict) else ()):
        aggregate = aggregate if isinstance(aggregate, dict) else {}
        entry: dict[str, Any] = {
            "name": aggregate_name,
            "kind": aggregate.get("kind"),
            "mechanism": aggregate.get("mechanism"),
            "group_by": _columns(aggregate),
            "confidence": output.get("confidence"),
        }
        if "rows_file" in aggregate:
            entry["rows_file"] = aggregate["rows_file"]
        else:
            entry["values"], entry["values_total"] = _published_values(aggregate, limit)
            complete = complete and len(entry["values"]) >= entry["values_total"]
        aggregates.append(entry)
    return {
        "id": row.id,
        "account": row.account,
        "dag_id": row.dag_id,
        "run_id": row.run_id,
        "task_id": row.task_id,
        "map_index": row.map_index,
        "release_name": row.release_name,
        "attempt": row.attempt,
        "state": row.state,
        "amount": row.amount,
        "unit": unit_or_none(accountant),
        "charge_split": _charge_split(None if "mechanisms" in read.unreadable else read.values.get("mechanisms"),
                                      unit_or_none(accountant)),
        "bounding": None if "mechanisms" in read.unreadable else bounding_summary(read.values.get("mechanisms")),
        "output_digest": row.output_digest,
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
        "output": output,
        # a series step's sealed noise state is not shown (its length and bytes are the workers' secret's business)
        "output_complete": complete and not too_large and not sealed,
        "aggregates": aggregates,
        **({"output_too_large": True} if too_large else {}),
        **({"unreadable": unreadable} if unreadable else {}),
    }


def _release_output(text: Any, state: Any, limit: int | None) -> tuple[Any, str | None, bool]:
    """``(output, problem, too large)`` of a charge's stored output for :func:`release_detail`: a committed one
    read with each aggregate's ``rows`` cut to their first ``limit``
    (:func:`~dp_operators.ledger.bounded.read_json_cut`: an output of millions of values is read as a stream,
    building only what is kept), another only checked (it is not shown); what is wrong with an unreadable one; and
    whether it is too large to show here (longer than :data:`MAX_SHOWN_OUTPUT_CHARS`, or more than
    :data:`MAX_SHOWN_OUTPUT_VALUES` values kept), which is not read further."""
    if text is None:
        return None, None, False
    if isinstance(text, str) and len(text) > MAX_SHOWN_OUTPUT_CHARS:
        return None, None, state == "committed"
    try:
        if state != "committed":
            check_json(text, max_chars=MAX_OUTPUT_CHARS)
            return None, None, False
        output = read_json_cut(text, cut_at=("aggregates", None, "rows"), keep=limit,
                               max_values=MAX_SHOWN_OUTPUT_VALUES, max_chars=MAX_OUTPUT_CHARS)
    except BoundsError as error:
        return None, str(error), False
    except TooManyValuesError:
        return None, None, True
    return output, None, False


# -- approvals waiting for a privacy officer (docs/ledger.md, "Approval before a large charge") ----------------
_APPROVAL_COLUMNS = (
    _e.id, _e.account, _e.account_seq, _e.dag_id, _e.run_id, _e.task_id, _e.map_index, _e.release_name, _e.amount,
    _e.delta_amount, _e.spec_hash, _e.details,
)


def _approval_timeout(conn: Connection, account: str, cache: dict[str, dt.timedelta | None]) -> dt.timedelta | None:
    """The approval timeout of ``account``'s policy (``timeout_hours``, default :data:`DEFAULT_APPROVAL_HOURS`),
    read within bounds; ``None`` when it is beyond what a date can hold (the request never expires here)."""
    if account not in cache:
        config = conn.execute(sa.select(_a.config).where(_a.name == account)).scalar()
        read = read_row(schema.accounts, {"name": account, "config": config})
        policy = read.values.get("config", {}).get("approval") if read.ok and isinstance(
            read.values.get("config"), dict) else None
        hours = policy.get("timeout_hours") if isinstance(policy, dict) else None
        try:
            value = read_number(str(hours)) if isinstance(hours, (str, int)) and not isinstance(hours, bool) else None
        except BoundsError:
            value = None
        try:
            cache[account] = dt.timedelta(hours=float(value if value and value > 0 else DEFAULT_APPROVAL_HOURS))
        except OverflowError:
            cache[account] = None
    return cache[account]


def _text(value: Any, length: int) -> str | None:
    return _short(value, length) if isinstance(value, str) else None


def _plan(plan: Any) -> dict[str, Any] | None:
    """A request's ``details.plan`` as the dashboard shows it, whatever was stored: ``charge`` and ``remaining_after``
    (exact strings in the ledger's form, else ``None``), ``confidence`` (a number), ``reasons``, ``release`` and
    ``mechanisms`` (each ``aggregate``, ``component``, ``mechanism``, ``half_width``: the expected half-width at
    the confidence), the first :data:`MAX_PLAN_STEPS` and ``mechanisms_total``."""
    if not isinstance(plan, dict):
        return None

    def exact(value: Any) -> str | None:
        try:
            return str(read_number(value))
        except BoundsError:
            return None

    steps = plan.get("mechanisms") if isinstance(plan.get("mechanisms"), list) else []
    reasons = plan.get("reasons") if isinstance(plan.get("reasons"), list) else []
    return {
        "release": _text(plan.get("release"), 200),
        "charge": exact(plan.get("charge")),
        "remaining_after": exact(plan.get("remaining_after")),
        "confidence": plan.get("confidence") if _is_number(plan.get("confidence")) else None,
        "reasons": [_short(reason, 80) for reason in reasons[:20] if isinstance(reason, str)],
        "mechanisms": [{
            "aggregate": _text(step.get("aggregate"), 200), "component": _text(step.get("component"), 80),
            "mechanism": _text(step.get("mechanism"), 80),
            "half_width": step.get("half_width") if _is_number(step.get("half_width")) else None,
            **({"rank_half_width": step["rank_half_width"]} if _is_number(step.get("rank_half_width")) else {}),
        } for step in steps[:MAX_PLAN_STEPS] if isinstance(step, dict)],
        "mechanisms_total": len(steps),
    }


def _pending_approvals(conn: Connection, account: str | None, dags: frozenset[str] | None,
                       now: dt.datetime | None) -> tuple[list[dict[str, Any]], int]:
    """The pending approval requests (of ``account``, or every account; of ``dags`` only unless ``None``), the
    latest first, at most :data:`MAX_APPROVALS`, and how many pending ones the events read hold (see
    :func:`pending_approvals`)."""
    now = as_utc(now) or dt.datetime.now(dt.timezone.utc)
    where = [_e.event == APPROVAL_REQUESTED, _of_dags(_e.dag_id, dags)]
    if account is not None:
        where.append(_e.account == account)
    rows = conn.execute(sa.select(*_APPROVAL_COLUMNS, _e.created_at).where(*where).order_by(_e.id.desc())
                        .limit(MAX_APPROVAL_REQUESTS_READ)).all()
    firsts: dict[str, int] = {}
    for row in rows:
        if isinstance(row.account, str) and type(row.account_seq) is int:
            firsts[row.account] = min(firsts.get(row.account, row.account_seq), row.account_seq)
    decided: set[tuple[str, int]] = set()
    if firsts:
        after = sa.or_(*(sa.and_(_e.account == name, _e.account_seq > seq) for name, seq in sorted(firsts.items())))
        decisions = sa.select(_e.account, _e.details).where(_e.event.in_(sorted(APPROVAL_DECISIONS)), after)
        for name, details in conn.execute(decisions.limit(MAX_APPROVAL_DECISIONS_READ)):
            read = read_row(schema.audit_events, {"details": details})
            request = read.values.get("details", {}).get("request") if read.ok and isinstance(
                read.values.get("details"), dict) else None
            if type(request) is int:
                decided.add((name, request))
    timeouts: dict[str, dt.timedelta | None] = {}
    pending = []
    for row in rows:
        values = dict(row._mapping)
        created = values.pop("created_at")
        if (values["account"], values["account_seq"]) in decided:
            continue
        read = read_row(schema.audit_events, values)
        checked = read.values
        requested = _time_text(created)
        name = None if "account" in read.unreadable else values["account"]
        expires = None
        if requested is not None and name is not None:
            timeout = _approval_timeout(conn, name, timeouts)
            with contextlib.suppress(OverflowError):
                expires = None if timeout is None else dt.datetime.fromisoformat(requested) + timeout
            if expires is not None and expires <= now:
                continue  # timed out: it counts as rejected
        details = checked.get("details") if isinstance(checked.get("details"), dict) else {}
        entry = {field: None if field in read.unreadable else values[field]
                 for field in ("account", "dag_id", "run_id", "task_id", "map_index", "release_name", "spec_hash")}
        seq = None if "account_seq" in read.unreadable else values["account_seq"]
        entry.update(
            request=seq,
            amount=None if checked.get("amount") is None else str(checked["amount"]),
            amount_float=None if checked.get("amount") is None else float(checked["amount"]),
            delta_amount=None if checked.get("delta_amount") is None else str(checked["delta_amount"]),
            requested_at=requested,
            expires_at=None if expires is None else expires.isoformat(),
            plan=_plan(details.get("plan")),
            command=None if name is None or seq is None else f"dpctl ledger approve {shlex.quote(name)} {seq}",
        )
        if not read.ok:
            entry["unreadable"] = read.reasons()
        pending.append(entry)
    return pending[:MAX_APPROVALS], len(pending)


def pending_approvals(ledger: LedgerBase | Engine | str, *, access: DagAccess | None = None,
                      now: dt.datetime | None = None) -> dict[str, Any]:
    """The approval requests waiting for a privacy officer's decision, in every account, the latest first: each
    ``account`` (whose chain holds it: a privacy block's parent), ``request`` (its sequence number on the account),
    the release key (``dag_id``, ``run_id``, ``task_id``, ``map_index``, ``release_name``), ``spec_hash``,
    ``amount`` (exact string, the account's unit) and ``amount_float``, ``delta_amount``, ``requested_at`` and
    ``expires_at`` (ISO 8601 UTC: ``requested_at`` plus the account's ``timeout_hours``), ``plan`` (:func:`_plan`)
    and ``command``: the ``dpctl ledger approve ACCOUNT N`` a privacy officer runs (the dashboard decides nothing).

    Returns ``{"approvals": [...], "total", "more"}``: at most :data:`MAX_APPROVALS` listed, ``total`` the pending
    ones among the latest :data:`MAX_APPROVAL_REQUESTS_READ` requests, ``more`` true when there were more requests
    than that. A request is pending when no decision on its account names it and it is not past its timeout (on
    this machine's clock, or ``now``; the ledger decides on the database's). Values are read within the bounds of
    :mod:`dp_operators.ledger.bounded`: an unreadable field is ``None`` and named in ``unreadable``.

    Args:
        access: a viewer's (ADR 0035): only the requests of DAGs it may read.
        now: the reference time for timeouts (default: the current time, UTC).

    Raises:
        LedgerNotInitialisedError: the ledger has no schema (or another version).
    """
    with _reading(ledger) as conn:
        dags = _readable_dags(conn, access, events_where=_e.event == APPROVAL_REQUESTED)
        more = conn.execute(sa.select(sa.func.count()).select_from(
            sa.select(_e.id).where(_e.event == APPROVAL_REQUESTED, _of_dags(_e.dag_id, dags))
            .limit(MAX_APPROVAL_REQUESTS_READ + 1).subquery())).scalar() > MAX_APPROVAL_REQUESTS_READ
        found, total = _pending_approvals(conn, None, dags, now)
    return {"approvals": found, "total": total, "more": more}
