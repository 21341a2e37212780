"""The budget dashboard's JSON API: a read-only FastAPI app that Airflow's api-server mounts as a plugin app.

Routes (all ``GET``; there are no write routes, so any other method gets 405):

* ``/api/accounts``: every budget account (:func:`~dp_operators.dashboard.queries.accounts_overview`).
* ``/api/accounts/{name}``: one account, 404 if unknown (:func:`~dp_operators.dashboard.queries.account_detail`).
* ``/api/accounts/{name}/charges``: a page of its charges, oldest first (by id), filtered by ``dag_id``, ``state``,
  ``since``/``until`` (ISO 8601 times) and paged by ``after`` (the id of the last charge of the previous page) and
  ``limit`` (1 to ``queries.MAX_PAGE`` = 500, default :data:`DEFAULT_LIMIT` = 50); 404 if the account is
  unknown, 422 for an invalid parameter or ``since`` after ``until``
  (:func:`~dp_operators.dashboard.queries.account_charges`).
* ``/api/releases/{charge_id}``: one charge's release with its published values, 404 if unknown
  (:func:`~dp_operators.dashboard.queries.release_detail`).
* ``/api/runs/{dag_id}/{run_id}``: the charges of one DAG run in every account (``run_id`` may hold any character,
  percent-encoded; :func:`~dp_operators.dashboard.queries.run_charges`).
* ``/api/audit-chain``: the latest structural check of the audit chains, run in the background
  (:class:`~dp_operators.dashboard.audit_status.AuditChainStatus`).

The HTML pages over the same queries are added by :func:`dp_operators.dashboard.pages.add_pages`.

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
holds a governor key. Give it a database role that may only read where the ledger is PostgreSQL (the reader role:
``dpctl ledger roles --reader-role``, docs/ledger.md).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dp_operators.dashboard import queries
from dp_operators.dashboard.audit_status import DEFAULT_INTERVAL, AuditChainStatus
from dp_operators.dashboard.queries import CHARGE_STATES, MAX_PAGE

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
    from dp_operators.ledger import Ledger

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


def dashboard_ledger(conn_id: str | None = None) -> Ledger:
    """Open the ledger read-only from an Airflow connection: a :class:`~dp_operators.ledger.Ledger` with no key,
    so it can read accounts and charges but sign nothing.

    Args:
        conn_id: the connection (forms as :class:`~dp_operators.hooks.ledger.DPLedgerHook`); default the config
            option ``[dp_operators] dashboard_ledger_conn_id``, else ``dp_ledger_default``.

    Raises:
        ValueError: the connection holds a governor key (the dashboard must not be pointed at the privacy
            officer's connection), or names no ledger.
        airflow.exceptions.AirflowNotFoundException: no such connection.
    """
    from airflow.configuration import conf
    from dp_operators.hooks.ledger import GOVERNOR_KEY_EXTRA, DPLedgerHook, ledger_url_from_connection
    from dp_operators.ledger import Ledger

    conn_id = conn_id or conf.get("dp_operators", CONN_ID_OPTION, fallback=DEFAULT_CONN_ID)
    conn = DPLedgerHook(conn_id).get_connection(conn_id)
    if (conn.extra_dejson or {}).get(GOVERNOR_KEY_EXTRA):
        raise ValueError(
            f"connection {conn_id!r} holds a governor_key; the dashboard only reads the ledger: point "
            f"[dp_operators] {CONN_ID_OPTION} at a spender's or reader's connection"
        )
    return Ledger(ledger_url_from_connection(conn))


class _LedgerSlot:
    """Opens the ledger on first use (the plugin is imported when Airflow lists plugins, which must not need the
    database) and keeps it, so requests share one engine and its connection pool."""

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


def _read_ledger(request: Request) -> Ledger:
    """The app's ledger (opened at the first request that gets this far, i.e. past authentication)."""
    return request.app.state.ledger()


LedgerDep = Annotated[Any, Depends(_read_ledger)]
AccountName = Annotated[str, Path(min_length=1, max_length=200)]
DagId = Annotated[str, Path(min_length=1, max_length=250)]
RunId = Annotated[str, Path(min_length=1, max_length=250)]

# The charges filters of /api/accounts/{name}/charges; the account page (pages.py) takes the same ones and adds
# its reading of an empty form field as "no filter" through Annotated.
DagIdFilter = Annotated[str | None, Query(min_length=1, max_length=250)]
StateFilter = Annotated[ChargeState | None, Query()]
SinceFilter = Annotated[dt.datetime | None, Query(description="ISO 8601; charges created at or after")]
UntilFilter = Annotated[dt.datetime | None, Query(description="ISO 8601; charges created before")]
AfterCursor = Annotated[int | None, Query(ge=1, description="id of the previous page's last charge")]
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE)]


def time_window(
    since: dt.datetime | None, until: dt.datetime | None
) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The ``since``/``until`` filters as the queries take them: a time without an offset is UTC (the ledger
    stores UTC); ``None`` (no bound) stays ``None``.

    Raises:
        ValueError: ``since`` is after ``until`` (the message gives both, for a 422 answer).
    """
    since, until = _utc(since), _utc(until)
    if since is not None and until is not None and since > until:
        raise ValueError(f"since ({since.isoformat()}) is after until ({until.isoformat()})")
    return since, until


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=dt.timezone.utc)


def _found(value: Any, what: str) -> Any:
    if value is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no such {what}")
    return value


def _verify_interval() -> float:
    from airflow.configuration import conf

    return conf.getfloat("dp_operators", VERIFY_INTERVAL_OPTION, fallback=DEFAULT_INTERVAL)


def create_app(
    ledger_factory: Callable[[], Ledger] = dashboard_ledger, verify_interval: float | None = None
) -> FastAPI:
    """The dashboard's FastAPI app, for a plugin's ``fastapi_apps`` entry.

    Args:
        ledger_factory: returns the :class:`~dp_operators.ledger.Ledger` to read; called once, at the first
            authenticated request. Default :func:`dashboard_ledger`.
        verify_interval: seconds between background audit-chain checks; default the config option
            ``[dp_operators] dashboard_verify_interval`` (300), read at the first check.

    Returns:
        an app whose every route requires :func:`require_dashboard_user`; JSON shapes are those of
        :mod:`dp_operators.dashboard.queries`.
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

    @app.get("/api/accounts")
    def list_accounts(ledger: LedgerDep) -> list[dict]:
        return queries.accounts_overview(ledger)

    @app.get("/api/accounts/{name}")
    def get_account(name: AccountName, ledger: LedgerDep) -> dict:
        return _found(queries.account_detail(ledger, name), "budget account")

    @app.get("/api/accounts/{name}/charges")
    def list_charges(
        name: AccountName,
        ledger: LedgerDep,
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
            ledger, name, dag_id=dag_id, state=state, since=since, until=until, after=after, limit=limit
        )
        return _found(page, "budget account")

    @app.get("/api/releases/{charge_id}")
    def get_release(charge_id: Annotated[int, Path(ge=1)], ledger: LedgerDep) -> dict:
        return _found(queries.release_detail(ledger, charge_id), "release")

    @app.get("/api/runs/{dag_id}/{run_id:path}")
    def get_run(dag_id: DagId, run_id: RunId, ledger: LedgerDep) -> dict:
        return queries.run_charges(ledger, dag_id, run_id)

    @app.get("/api/audit-chain")
    def get_audit_chain(request: Request) -> dict:
        return request.app.state.verify.status()

    from dp_operators.dashboard.pages import add_pages

    add_pages(app)
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

