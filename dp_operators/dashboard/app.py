"""The budget dashboard's JSON API: a read-only FastAPI app that Airflow's api-server mounts as a plugin app.

Routes (all ``GET``; there are no write routes, so any other method gets 405):

* ``/api/accounts``: every budget account but member accounts, which their parent's row counts (privacy blocks,
  team quotas; :func:`~dp_operators.dashboard.queries.accounts_overview`).
* ``/api/accounts/{name}``: one account, 404 if unknown (:func:`~dp_operators.dashboard.queries.account_detail`):
  with its blocks (the latest page) or team quotas, refused attempts and ``cannot_fund_next_run``.
  ``name`` may hold ``/``, as is or percent-encoded (``%2F``): ``/api/accounts/a/b`` is account ``a/b``. A path
  ending in ``/charges`` is always the charges route: ``/api/accounts/x/charges`` is account ``x``'s charges, so
  an account literally named ``x/charges`` has its charges at ``/api/accounts/x/charges/charges`` but no detail
  route (its page, ``/accounts/x%2Fcharges``, shows it).
* ``/api/accounts/{name}/charges``: a page of its charges, oldest first (by id), filtered by ``dag_id``, ``state``,
  ``since``/``until`` (ISO 8601 times) and paged by ``after`` (the id of the last charge of the previous page) and
  ``limit`` (1 to ``queries.MAX_PAGE`` = 500, default :data:`DEFAULT_LIMIT` = 50); 404 if the account is
  unknown, 422 for an invalid parameter, a time outside the years 1 to 9999 once converted to UTC, or ``since``
  after ``until`` (:func:`~dp_operators.dashboard.queries.account_charges`).
* ``/api/releases/{charge_id}?limit=N``: one charge's release, 404 if unknown
  (:func:`~dp_operators.dashboard.queries.release_detail`). Each aggregate lists its first ``limit`` published
  values (1 to ``queries.MAX_RELEASE_VALUES`` = 10,000, default :data:`DEFAULT_RELEASE_VALUES` = 200; first N in
  the stored order, no offset) and says how many it has in ``values_total``; ``output`` is the committed output
  with each aggregate's inline ``rows`` cut the same way, so it is the output as stored (and hashes to
  ``output_digest``) exactly when ``output_complete`` is true. An output too large to show (``output_too_large``:
  over ``queries.MAX_SHOWN_OUTPUT_CHARS`` characters, or over ``queries.MAX_SHOWN_OUTPUT_VALUES`` values once cut)
  comes as ``output`` null with no aggregates.
* ``/api/runs/{dag_id}/{run_id}``: the charges of one DAG run in every account (``run_id`` may hold any character,
  percent-encoded; :func:`~dp_operators.dashboard.queries.run_charges`).
* ``/api/audit-chain``: the latest structural check of the audit chains, run in the background
  (:class:`~dp_operators.dashboard.audit_status.AuditChainStatus`); without the ``problems`` list for a user who
  is no privacy officer (:func:`audit_for`).
* ``/api/approvals``: the approval requests waiting for a privacy officer
  (:func:`~dp_operators.dashboard.queries.pending_approvals`), read-only.

Who sees what (ADR 0035, :mod:`dp_operators.dashboard.access`): every route takes the user's
:class:`~dp_operators.dashboard.access.DagAccess` (:func:`viewer_access`): a privacy officer (may read every DAG)
sees everything; anyone else only the accounts one of whose ``allowed_dags`` it may read, with only the charges,
lists and approvals of the DAGs it may read, and the releases and runs of those DAGs. A hidden account, release or
run answers 404 exactly as an unknown one.

The HTML pages over the same queries are added by :func:`dp_operators.dashboard.pages.add_pages`.

Request limits, checked before anything else. A query string over :data:`MAX_QUERY_BYTES` (2 KB) or with more than
:data:`MAX_QUERY_PARAMETERS` (32) parameters gets 414 (URI Too Long) from :class:`QueryStringLimit`, the outermost
middleware, before authentication and before FastAPI parses it: FastAPI collects the query parameters a route does
not declare with Starlette's ``getlist``, which scans the whole list for each key, so 13,000 junk parameters (60 KB,
under the 64 KB uvicorn accepts) held an api-server worker for seconds. The longest query the dashboard makes is
the account page's filters, under 1 KB. Ids (``charge_id``, ``after``) are at most :data:`MAX_ID` (the databases'
64-bit integers) and names and filters refuse a NUL character (PostgreSQL text cannot hold one): 422 beyond.

Errors and caching. When the ledger cannot be opened or read (no Airflow connection, a governor's connection, no
SQLite file, no schema, a database error) every page and JSON route answers 503 with a fixed message that names the
connection id, the config option and the fix (:func:`unavailable_message`); the exception, which can hold the
ledger's URL, host, login or database, goes to the api-server's log only. A 503 also drops the ledger the app
kept (:func:`forget_ledger`): the next request re-reads the Airflow connection, so fixing it needs no restart. Pages and JSON answers carry
``Cache-Control: no-store`` (:class:`NoStore`); the static assets keep their own caching.

Authentication. Airflow mounts a plugin's FastAPI app with ``app.mount()`` (``init_plugins`` in
``airflow/api_fastapi/app.py``), and a mounted app inherits none of the core API's dependencies, so Airflow does not
authenticate it (DESIGN.md section 7). Every route here therefore depends on :func:`require_dashboard_user`, which
reuses the dependency Airflow's core API uses, ``get_user`` in ``airflow/api_fastapi/core_api/security.py``: the
Airflow JWT from ``Authorization: Bearer <token>`` (API clients, ``POST /auth/token``) or else the ``_token``
cookie the UI's login sets, validated by the configured auth manager (``get_auth_manager()``, a process-wide
singleton the api-server initialises in ``create_app``, so it is available to mounted apps). A missing, tampered
or expired token gets 401 (Airflow's own API answers 403 for a token that fails validation; RFC 6750 section 3.1
says 401). An authenticated user must also be allowed to see Airflow's UI (``is_authorized_view`` with
``AccessView.WEBSITE``), else 403. The OpenAPI and docs pages are switched off: they would be unauthenticated.

Ledger access. The app reads the ledger through a :class:`~dp_operators.ledger.Ledger` without any key (reading
needs none): :func:`dashboard_ledger` opens it from the Airflow connection named by ``[dp_operators]
dashboard_ledger_conn_id`` (default ``dp_ledger_default``, the spenders' connection) and refuses a connection that
holds a governor key. A SQLite ledger is opened in SQLite's read-only mode (``mode=ro``), so the dashboard neither
creates a missing file nor can write; give it a database role that may only read where the ledger is PostgreSQL (the
reader role: ``dpctl ledger roles --reader-role``, docs/ledger.md).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import quote

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, status
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dp_operators.dashboard import queries
from dp_operators.dashboard.access import DagAccess, user_access
from dp_operators.dashboard.audit_status import DEFAULT_INTERVAL, AuditChainStatus
from dp_operators.dashboard.queries import CHARGE_STATES, MAX_PAGE, MAX_RELEASE_VALUES, LedgerUnavailableError
from dp_operators.ledger.errors import LedgerNotInitialisedError

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from dp_operators.ledger import Ledger

log = logging.getLogger(__name__)

#: The Airflow config option (section ``dp_operators``) naming the dashboard's ledger connection; the environment
#: variable ``AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID`` sets it too.
CONN_ID_OPTION = "dashboard_ledger_conn_id"
DEFAULT_CONN_ID = "dp_ledger_default"
#: The Airflow config option (section ``dp_operators``): seconds between background checks of the audit chain.
VERIFY_INTERVAL_OPTION = "dashboard_verify_interval"
#: The states a charge can be in (DESIGN.md section 3), as a type FastAPI validates query values against.
ChargeState = Literal[CHARGE_STATES]
#: Charges per page of an account's charges (JSON route and page), unless the query says ``limit``.
DEFAULT_LIMIT = 50
#: Published values per aggregate of ``/api/releases/{charge_id}`` (and of the release page), unless the query
#: says ``limit``.
DEFAULT_RELEASE_VALUES = 200
#: Largest id a route takes: the databases' signed 64-bit integers (SQLite INTEGER, PostgreSQL BIGINT); sqlite3
#: raises OverflowError on a larger Python int.
MAX_ID = 2**63 - 1
#: Longest query string (bytes, as sent: percent-encoded) and most parameters a request may carry (414 beyond).
MAX_QUERY_BYTES = 2048
MAX_QUERY_PARAMETERS = 32
# Names and filters hold any character but NUL, which PostgreSQL text refuses (psycopg raises on it); no ledger
# name can hold one, so a NUL is an invalid parameter (422), never a query.
_NO_NUL = r"^[^\x00]*$"

_bearer = HTTPBearer(auto_error=False, description="An Airflow JWT (POST /auth/token, or the UI's _token cookie)")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


async def require_dashboard_user(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> BaseUser:
    """The Airflow user making the request, authenticated as Airflow's core API does.

    Returns:
        the auth manager's user object for the token.

    Raises:
        HTTPException: 401 (with ``WWW-Authenticate: Bearer``) when no token is given, or it is expired, tampered
            with or signed by another key; 403 when the auth manager does not let the user see Airflow's UI.
    """
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import get_user

    try:
        # the core API's own resolution: the bearer header wins, else the trusted refresh middleware's user, else
        # the _token cookie (airflow/api_fastapi/core_api/security.py, get_user)
        user = await get_user(request, _oauth_token=None, bearer_credentials=bearer)
    except HTTPException as error:
        if error.status_code in (status.HTTP_401_UNAUTHORIZED, status.HTTP_403_FORBIDDEN):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, error.detail, headers=_CHALLENGE) from None
        raise
    if not get_auth_manager().is_authorized_view(access_view=AccessView.WEBSITE, user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: this user may not see Airflow's UI")
    return user


def configured_conn_id() -> str:
    """The dashboard's ledger connection id: the config option ``[dp_operators] dashboard_ledger_conn_id``, else
    ``dp_ledger_default``."""
    from airflow.configuration import conf

    return conf.get("dp_operators", CONN_ID_OPTION, fallback=DEFAULT_CONN_ID)


def dashboard_ledger(conn_id: str | None = None) -> Ledger:
    """Open the ledger read-only from an Airflow connection: a :class:`~dp_operators.ledger.Ledger` with no key,
    so it can read accounts and charges but sign nothing; a SQLite ledger through SQLite's read-only mode
    (:func:`read_only_sqlite_url`).

    Args:
        conn_id: the connection (forms as :class:`~dp_operators.hooks.ledger.DPLedgerHook`); default
            :func:`configured_conn_id`.

    Raises:
        LedgerUnavailableError: there is no such connection; it holds a governor key (the dashboard must not be
            pointed at the privacy officer's connection); it names no ledger, or a URL SQLAlchemy cannot use; its
            SQLite file does not exist (never created here: ``dpctl ledger init`` creates a ledger). Its ``hint``
            names the connection and the fix, without the URL.
    """
    from airflow.sdk.exceptions import AirflowNotFoundException

    from dp_operators.hooks.ledger import GOVERNOR_KEY_EXTRA, DPLedgerHook, ledger_url_from_connection
    from dp_operators.ledger import Ledger

    conn_id = conn_id or configured_conn_id()
    option = f"[dp_operators] {CONN_ID_OPTION}"
    try:
        conn = DPLedgerHook(conn_id).get_connection(conn_id)
    except AirflowNotFoundException as error:
        raise LedgerUnavailableError(
            str(error),
            f"there is no Airflow connection {conn_id!r}: create it (a spender's or reader's ledger connection) or "
            f"set {option} to the ledger's connection",
        ) from error
    if (conn.extra_dejson or {}).get(GOVERNOR_KEY_EXTRA):
        refusal = (
            f"connection {conn_id!r} holds a governor_key; the dashboard only reads the ledger: point {option} at "
            "a spender's or reader's connection"
        )
        raise LedgerUnavailableError(refusal, refusal)
    try:
        url = read_only_sqlite_url(ledger_url_from_connection(conn), conn_id)
        return Ledger(url)
    except (ValueError, sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as error:
        raise LedgerUnavailableError(
            f"connection {conn_id!r}: {error}",
            f"connection {conn_id!r} does not give a usable ledger URL: set its extra {{\"url\": ...}} to a "
            "sqlite:/// path or a postgresql+psycopg:// URL, or its PostgreSQL host, login and schema",
        ) from error


def read_only_sqlite_url(url: str, conn_id: str) -> str:
    """A SQLite ledger URL as the dashboard opens it: ``sqlite:///file:<absolute path>?mode=ro&uri=true``, SQLite's
    read-only mode (https://www.sqlite.org/uri.html), so no statement can write, even by mistake, and a missing
    file is an error rather than a new empty database. A WAL-mode ledger reads with no writer connected: SQLite
    (3.22 and later) creates the ``-wal`` and ``-shm`` files it needs, with the database file's permissions, as
    any reader does, and being read-only leaves them when it closes (the next writer uses them). Other URLs are
    returned unchanged.

    Args:
        url: the connection's ledger URL.
        conn_id: the connection, for the messages.

    Raises:
        LedgerUnavailableError: no file at the path (the message names the path; the hint does not), or the URL
            names no file (an in-memory database, or already a ``file:`` URI, which this does not rewrite).
    """
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return url
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or "uri" in parsed.query:
        hint = f"connection {conn_id!r} must give the SQLite ledger as a file path (sqlite:////absolute/path.db)"
        raise LedgerUnavailableError(f"{hint}, not {parsed.render_as_string(hide_password=True)}", hint)
    path = os.path.abspath(database)
    if not os.path.isfile(path):
        raise LedgerUnavailableError(
            f"no ledger at {path}: run 'dpctl ledger init' (or point connection {conn_id!r} at the ledger's file)",
            f"the SQLite ledger file that connection {conn_id!r} names does not exist: run 'dpctl ledger init', or "
            "fix the path in the connection (the api-server's log names it)",
        )
    read_only = parsed.set(database=f"file:{quote(path)}", query={**parsed.query, "mode": "ro", "uri": "true"})
    return read_only.render_as_string(hide_password=False)


class _LedgerSlot:
    """Opens the ledger on first use (the plugin is imported when Airflow lists plugins, which must not need the
    database) and keeps it, so requests share one engine and its connection pool. A failed opening is not kept:
    the next request tries again (the connection may have been fixed). A ledger that opened but then failed a read
    (no schema, database down, the connection since pointed elsewhere) is dropped by :meth:`discard`, which the
    503 answers call, so fixing the Airflow connection needs no api-server restart."""

    def __init__(self, factory: Callable[[], Ledger]) -> None:
        self._factory = factory
        self._ledger: Ledger | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Ledger:
        if self._ledger is None:
            with self._lock:
                if self._ledger is None:
                    self._ledger = self._factory()
        return self._ledger

    def discard(self) -> None:
        """Forget the kept ledger and close its engines' pooled connections; the next call opens it again from
        the factory (re-reading the Airflow connection). Connections a running request holds are closed when it
        returns them."""
        with self._lock:
            ledger, self._ledger = self._ledger, None
        if ledger is not None:
            for engine in {id(engine): engine for engine in (ledger.engine, ledger._reader)}.values():
                engine.dispose()


def viewer_access(user: Annotated[Any, Depends(require_dashboard_user)]) -> DagAccess:
    """What the request's user may see (ADR 0035; :func:`~dp_operators.dashboard.access.user_access`): everything
    for a privacy officer, else the DAGs the auth manager lets it read. A plain function: FastAPI runs it in its
    thread pool, as the auth manager's checks may read Airflow's database."""
    from airflow.api_fastapi.app import get_auth_manager

    return user_access(get_auth_manager(), user)


AccessDep = Annotated[DagAccess, Depends(viewer_access)]


def audit_for(access: DagAccess, audit: dict[str, Any]) -> dict[str, Any]:
    """The audit-chain status as ``access`` may see it: a privacy officer the whole of it; anyone else without the
    ``problems`` list (each problem names an account, a charge or a DAG it may not read), with
    ``problems_hidden`` true; the count and the state stay."""
    if access.everything:
        return audit
    return {**audit, "problems": [], "problems_hidden": True}


def _read_ledger(request: Request) -> Ledger:
    """The app's ledger (opened at the first request that gets this far, i.e. past authentication)."""
    return request.app.state.ledger()


LedgerDep = Annotated[Any, Depends(_read_ledger)]
AccountName = Annotated[str, Path(min_length=1, max_length=200, pattern=_NO_NUL)]
DagId = Annotated[str, Path(min_length=1, max_length=250, pattern=_NO_NUL)]
RunId = Annotated[str, Path(min_length=1, max_length=250, pattern=_NO_NUL)]
ChargeId = Annotated[int, Path(ge=1, le=MAX_ID)]

# The charges filters of /api/accounts/{name}/charges; the account page (pages.py) takes the same ones and adds
# its reading of an empty form field as "no filter" through Annotated.
DagIdFilter = Annotated[str | None, Query(min_length=1, max_length=250, pattern=_NO_NUL)]
StateFilter = Annotated[ChargeState | None, Query()]
SinceFilter = Annotated[dt.datetime | None, Query(description="ISO 8601; charges created at or after")]
UntilFilter = Annotated[dt.datetime | None, Query(description="ISO 8601; charges created before")]
AfterCursor = Annotated[int | None, Query(ge=1, le=MAX_ID, description="id of the previous page's last charge")]
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
ReleaseValuesLimit = Annotated[int, Query(ge=1, le=MAX_RELEASE_VALUES, description="values per aggregate")]


def time_window(
    since: dt.datetime | None, until: dt.datetime | None
) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The ``since``/``until`` filters as the queries take them: aware times in UTC (the ledger stores UTC; a time
    without an offset is UTC); ``None`` (no bound) stays ``None``.

    Raises:
        ValueError: a time that leaves the years 1 to 9999 once converted to UTC (``9999-12-31T23:00-05:00``), or
            ``since`` after ``until`` (the message gives the values, for a 422 answer).
    """
    since, until = _utc(since, "since"), _utc(until, "until")
    if since is not None and until is not None and since > until:
        raise ValueError(f"since ({since.isoformat()}) is after until ({until.isoformat()})")
    return since, until


def _utc(moment: dt.datetime | None, name: str) -> dt.datetime | None:
    try:
        return queries.as_utc(moment)
    except OverflowError:
        raise ValueError(
            f"{name} ({moment.isoformat()}) is outside the years 1 to 9999 in UTC: give a time within them"
        ) from None


def _found(value: Any, what: str) -> Any:
    if value is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no such {what}")
    return value


def _verify_interval() -> float:
    from airflow.configuration import conf

    return conf.getfloat("dp_operators", VERIFY_INTERVAL_OPTION, fallback=DEFAULT_INTERVAL)


# -- the ledger cannot be read: 503 ---------------------------------------------------------------------------
#: What the dashboard answers 503 to, from any route: opening the ledger failed (:func:`dashboard_ledger`), it has
#: no schema, or the database failed a read (SQLAlchemy wraps every driver error: connection refused, login or
#: rights refused, ...).
LEDGER_ERRORS: tuple[type[Exception], ...] = (LedgerUnavailableError, LedgerNotInitialisedError, sa.exc.SQLAlchemyError)


def unavailable_message(error: BaseException) -> str:
    """Log ``error`` (with its traceback) and return the fixed text a client is shown instead of it.

    The text names the connection (:func:`configured_conn_id`), the config option and what to do
    (:func:`~dp_operators.dashboard.queries.ledger_error_hint`); never the error's own message, which can hold
    the ledger's URL, host, login, database name or file path (psycopg's connection errors do, and a password
    given as a URL query parameter is in ``LedgerNotInitialisedError``'s).
    """
    conn_id = configured_conn_id()
    log.error("the dashboard cannot read the ledger of connection %r", conn_id, exc_info=error)
    return (
        f"The privacy-budget ledger cannot be read through the Airflow connection {conn_id!r} (set by "
        f"[dp_operators] {CONN_ID_OPTION}): {queries.ledger_error_hint(error)}. The api-server's log has the details."
    )


def forget_ledger(request: Request) -> None:
    """After one of :data:`LEDGER_ERRORS`: drop the app's kept ledger (:meth:`_LedgerSlot.discard`), so the next
    request reopens it from the Airflow connection, and let the audit check retry at the next status instead of
    after its interval."""
    request.app.state.ledger.discard()
    request.app.state.verify.recheck()


async def ledger_unavailable(request: Request, error: Exception) -> JSONResponse:
    """The JSON routes' answer to one of :data:`LEDGER_ERRORS`: 503 with ``{"detail": unavailable_message}``; the
    kept ledger is dropped (:func:`forget_ledger`)."""
    forget_ledger(request)
    return JSONResponse({"detail": unavailable_message(error)}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)


# -- middleware -----------------------------------------------------------------------------------------------
def _query_problem(query: bytes) -> str | None:
    if len(query) > MAX_QUERY_BYTES:
        return f"the query string is {len(query)} bytes long; the dashboard takes at most {MAX_QUERY_BYTES}"
    # the pieces Starlette's parse_qsl makes (it splits on "&" and skips empty ones)
    count = sum(1 for piece in query.split(b"&") if piece)
    if count > MAX_QUERY_PARAMETERS:
        return f"the query string has {count} parameters; the dashboard takes at most {MAX_QUERY_PARAMETERS}"
    return None


class QueryStringLimit:
    """ASGI middleware: 414 (URI Too Long, ``{"detail": ...}``) for a query string over :data:`MAX_QUERY_BYTES`
    bytes or with more than :data:`MAX_QUERY_PARAMETERS` parameters, answered before anything parses the query or
    authenticates the request (the outermost middleware of :func:`create_app`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = _query_problem(scope.get("query_string", b"")) if scope["type"] == "http" else None
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"detail": problem}, status_code=status.HTTP_414_URI_TOO_LONG, headers={"Cache-Control": "no-store"}
        )
        await response(scope, receive, send)


class NoStore:
    """ASGI middleware: ``Cache-Control: no-store`` on every answer that does not set its own caching, so no browser
    or proxy keeps a page or JSON answer of the ledger (the static assets set theirs)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"cache-control" for name, _ in headers):
                    message = {**message, "headers": [*headers, (b"cache-control", b"no-store")]}
            await send(message)

        await self.app(scope, receive, send_no_store)


def create_app(
    ledger_factory: Callable[[], Ledger] = dashboard_ledger, verify_interval: float | None = None
) -> FastAPI:
    """The dashboard's FastAPI app, for a plugin's ``fastapi_apps`` entry.

    Args:
        ledger_factory: returns the :class:`~dp_operators.ledger.Ledger` to read; called at the first
            authenticated request, and again at the next one while it raises. Default :func:`dashboard_ledger`.
        verify_interval: seconds between background audit-chain checks; default the config option
            ``[dp_operators] dashboard_verify_interval`` (300), read at the first check.

    Returns:
        an app whose every route requires :func:`require_dashboard_user`; JSON shapes are those of
        :mod:`dp_operators.dashboard.queries`; the request limits, 503 answers and caching of the module's
        docstring.
    """
    app = FastAPI(
        title="DP budget dashboard",
        dependencies=[Depends(require_dashboard_user)],
        # the generated docs would be served outside the auth dependency
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.ledger = _LedgerSlot(ledger_factory)
    app.state.verify = _LazyAuditStatus(app.state.ledger, verify_interval)
    for error_type in LEDGER_ERRORS:
        app.add_exception_handler(error_type, ledger_unavailable)

    @app.get("/api/accounts")
    def list_accounts(ledger: LedgerDep, access: AccessDep) -> list[dict]:
        return queries.accounts_overview(ledger, access)

    @app.get("/api/approvals")
    def list_approvals(ledger: LedgerDep, access: AccessDep) -> dict:
        return queries.pending_approvals(ledger, access=access)

    # declared before the account route, which would take ".../charges" as part of a name holding "/"
    @app.get("/api/accounts/{name:path}/charges")
    def list_charges(
        name: AccountName,
        ledger: LedgerDep,
        access: AccessDep,
        dag_id: DagIdFilter = None,
        state: StateFilter = None,
        since: SinceFilter = None,
        until: UntilFilter = None,
        after: AfterCursor = None,
        limit: PageLimit = DEFAULT_LIMIT,
    ) -> dict:
        try:
            since, until = time_window(since, until)
        except ValueError as error:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
        page = queries.account_charges(
            ledger, name, dag_id=dag_id, state=state, since=since, until=until, after=after, limit=limit,
            access=access,
        )
        return _found(page, "budget account")

    @app.get("/api/accounts/{name:path}")
    def get_account(name: AccountName, ledger: LedgerDep, access: AccessDep) -> dict:
        return _found(queries.account_detail(ledger, name, access=access), "budget account")

    @app.get("/api/releases/{charge_id}")
    def get_release(
        charge_id: ChargeId, ledger: LedgerDep, access: AccessDep, limit: ReleaseValuesLimit = DEFAULT_RELEASE_VALUES
    ) -> dict:
        return _found(queries.release_detail(ledger, charge_id, limit=limit, access=access), "release")

    @app.get("/api/runs/{dag_id}/{run_id:path}")
    def get_run(dag_id: DagId, run_id: RunId, ledger: LedgerDep, access: AccessDep) -> dict:
        return _found(queries.run_charges(ledger, dag_id, run_id, access=access), "DAG run")

    @app.get("/api/audit-chain")
    def get_audit_chain(request: Request, access: AccessDep) -> dict:
        return audit_for(access, request.app.state.verify.status())

    from dp_operators.dashboard.pages import add_pages

    add_pages(app)
    # added last, so outermost: the 414 comes before authentication, the pages' gzip and FastAPI's parsing
    app.add_middleware(NoStore)
    app.add_middleware(QueryStringLimit)
    return app


class _LazyAuditStatus:
    """:class:`AuditChainStatus`, built at the first request (reading the interval from Airflow's config then, not
    when the plugin is imported)."""

    def __init__(self, ledger: Callable[[], Ledger], interval: float | None) -> None:
        self._ledger, self._interval = ledger, interval
        self._status: AuditChainStatus | None = None
        self._lock = threading.Lock()

    def status(self) -> dict[str, Any]:
        with self._lock:
            if self._status is None:
                interval = self._interval if self._interval is not None else _verify_interval()
                self._status = AuditChainStatus(self._ledger, interval)
        return self._status.status()

    def recheck(self) -> None:
        """:meth:`AuditChainStatus.recheck` (nothing before the first check)."""
        with self._lock:
            if self._status is not None:
                self._status.recheck()
