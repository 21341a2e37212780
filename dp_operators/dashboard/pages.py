"""The budget dashboard's HTML pages, over the same queries as the JSON API (:mod:`dp_operators.dashboard.app`).

Routes (all ``GET``, all behind the app's :func:`~dp_operators.dashboard.app.require_dashboard_user`):

* ``/``: every account (cap, spent, reserved, remaining, unit, epsilon at the account's delta, its structure and
  whether it cannot fund another run) with a bar chart, and the audit-chain status in one line (the details are on
  each account's page). Member accounts (privacy blocks, team quotas) are not rows of their own: their parent's
  row counts them.
* ``/accounts/{name}``: one account: summary (with "cannot fund another run" when the last committed charge of one
  of its releases is more than what remains), burn-down chart, forecast, its privacy blocks (spent, remaining, cap
  per block, the latest windows first, :data:`~dp_operators.dashboard.queries.BLOCKS_PAGE` a page, paged by
  ``blocks_before``) or its team quotas (quota, spent, remaining per team next to the shared cap), what one more
  run of each release costs, its refused attempts with their reasons, charge counts, the audit-chain status and
  a filtered, keyset-paged charges table (``dag_id``, ``state``, ``since``, ``until``, ``after``, ``limit``,
  validated as the JSON route validates them; an empty form field means no filter). 404 page if unknown.
  Invalid values get a 422 page (the JSON routes keep FastAPI's JSON answer).
* ``/releases/{charge_id}``: one charge (its amount in the account's unit, split per aggregate from the recorded
  mechanisms) and what it published, with the confidence intervals as charts: the first
  :data:`MAX_SHOWN_AGGREGATES` aggregates drawn, each with its first :data:`MAX_SHOWN_VALUES` values in a chart and
  a table; the others named, each linking to ``?aggregate=NAME``, which shows that aggregate alone (404 page for a
  name the release does not have). A committed output too large to show here (``output_too_large``) gets a page
  saying so, with the charge's release key and digest.
* Every page shows what the user may see (ADR 0035): the overview and account pages also list the approval
  requests waiting for a privacy officer, with the ``dpctl ledger approve`` command to decide each; a hidden
  account, release or run gets the 404 page of an unknown one.
* ``/runs/{dag_id}/{run_id}``: the charges of one DAG run (Airflow's DAG-run tab; ``run_id`` percent-encoded, may
  hold ``/``; a DAG id cannot, Airflow refuses one).
* ``/static/{plotly.min.js,dashboard.css,dashboard.js}``: plotly.js from the installed plotly package (no CDN)
  and the page assets, gzipped once, with an ``ETag`` and a version in their URLs so browsers cache them.

A request without a valid Airflow login (none, expired, tampered) gets, on a page, a 401 page linking to Airflow's
login with ``next`` set to the page (:func:`_login_url`); the JSON routes keep their JSON 401 and its
``WWW-Authenticate: Bearer``.

When the ledger cannot be opened or read, every page is a 503 page with the app's fixed message
(:func:`~dp_operators.dashboard.app.unavailable_message`); the JSON routes answer it as JSON.

Links are built from the app's own routes and ``root_path``, so they hold when Airflow mounts the app under a
prefix (``/dp-budget``); path parameters are percent-encoded (any character may be in a name).

Numbers are shown with 6 significant digits; each number's cell carries the exact value as the JSON API gives it
in ``data-exact`` (a string as it is, a number as JSON writes it, empty for null), next to a ``data-field`` naming
the JSON field. A browser test reads these attributes: keep them.
"""

from __future__ import annotations

import datetime as dt
import functools
import gzip
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import jinja2
import markupsafe
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.templating import Jinja2Templates
from pydantic import BeforeValidator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware

from dp_operators.dashboard import charts, queries
from dp_operators.dashboard.app import (
    DEFAULT_LIMIT, DEFAULT_RELEASE_VALUES, LEDGER_ERRORS, AccessDep, AccountName, AfterCursor, ChargeId, DagId,
    DagIdFilter, PageLimit, RunId, SinceFilter, StateFilter, UntilFilter, audit_for, forget_ledger,
    ledger_unavailable, time_window, unavailable_message,
)
from dp_operators.dashboard.queries import MAX_PAGE
from dp_operators.ledger.bounded import SHOWN_CHARS, BoundsError, read_number, shown

#: Most published values of one aggregate drawn and listed on a release page (what the JSON gives by default).
MAX_SHOWN_VALUES = DEFAULT_RELEASE_VALUES
#: Most aggregates drawn on a release page; the others are listed by name, each with a link to its own view. A DAG
#: author decides how many aggregates a release has, and a browser stalls on hundreds of plotly charts.
MAX_SHOWN_AGGREGATES = 20
#: Charges listed on a run page (the query's largest page).
RUN_PAGE_CHARGES = MAX_PAGE

#: What each filter of the account page takes, said on the 422 page next to the value that was refused.
FILTER_FORMATS = {
    "dag_id": "give a DAG id of 1 to 250 characters, or leave it empty for every DAG",
    "state": f"give one of {', '.join(queries.CHARGE_STATES)}, or leave it empty for every state",
    "since": "give an ISO 8601 time such as 2025-01-31T00:00Z or a date 2025-01-31",
    "until": "give an ISO 8601 time such as 2025-02-28T00:00Z or a date 2025-02-28",
    "after": "give the previous page's next_after id (the id of its last charge, which its Next page link carries), "
             "or leave it out for the first page",
    "limit": f"give a whole number from 1 to {MAX_PAGE}, or leave it empty for {DEFAULT_LIMIT}",
    "blocks_before": "give the window of the last block of the previous page (its Older blocks link carries it), or "
                     "leave it out for the latest blocks",
}
_FORM_FIELDS = ("dag_id", "state", "since", "until", "limit")
#: The account page's cursor in its privacy blocks: the window of the previous page's last block.
BlocksCursor = Annotated[str | None, Query(min_length=1, max_length=100, pattern=r"^[^\x00]*$")]

_HERE = FilePath(__file__).parent
# plotly.js draws with inline styles; everything else comes from this app
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
)

# An empty field of the filter form (submitted as "dag_id=") means "no filter" (an empty limit: the default);
# anything else is validated by the JSON route's own filter types (app.py).
_Blank = BeforeValidator(lambda value: None if value == "" else value)
_BlankIsDefaultLimit = BeforeValidator(lambda value: value or DEFAULT_LIMIT)


# -- assets -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Asset:
    body: bytes
    media_type: str
    etag: str

    @functools.cached_property
    def gzipped(self) -> bytes:
        # once per process: plotly.js (4.8 MB) takes about 0.3 s to compress
        return gzip.compress(self.body, mtime=0)


def _plotly_js() -> bytes:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode("utf-8")


_ASSET_SOURCES = {
    "plotly.min.js": (_plotly_js, "text/javascript; charset=utf-8"),
    "dashboard.js": (lambda: (_HERE / "static" / "dashboard.js").read_bytes(), "text/javascript; charset=utf-8"),
    "dashboard.css": (lambda: (_HERE / "static" / "dashboard.css").read_bytes(), "text/css; charset=utf-8"),
}


@functools.cache
def _asset(name: str) -> _Asset:
    read, media_type = _ASSET_SOURCES[name]
    body = read()
    return _Asset(body, media_type, f'"{hashlib.sha256(body).hexdigest()[:32]}"')


def _serve(request: Request, asset: _Asset) -> Response:
    # private: the assets are behind the login; the URL carries the version, so a day's caching is safe
    headers = {"ETag": asset.etag, "Cache-Control": "private, max-age=86400", "Vary": "Accept-Encoding"}
    if asset.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(asset.gzipped, media_type=asset.media_type, headers={**headers, "Content-Encoding": "gzip"})
    return Response(asset.body, media_type=asset.media_type, headers=headers)


# -- templates ----------------------------------------------------------------------------------------------------
def _href(request: Request, route: str, query: dict[str, Any] | None = None, /, **params: Any) -> str:
    """The path of route ``route`` as the browser must request it: under the mount prefix (``root_path``), each
    path parameter percent-encoded (``/`` too, as ``encodeURIComponent`` does), the query without empty values."""
    path = request.app.url_path_for(route, **{key: quote(str(value), safe="") for key, value in params.items()})
    url = request.scope.get("root_path", "") + path
    query = {key: value for key, value in (query or {}).items() if value is not None}
    return f"{url}?{urlencode(query)}" if query else url


def _number(value: Any) -> str:
    """6 significant digits; an int as it is; an exact fraction string in
    the ledger's form (:func:`~dp_operators.ledger.bounded.read_number`) as its nearest float; ``-`` for None.
    Anything else (a published value that is no number, text such as ``"1e-99999999"``, which is never handed to
    ``Fraction``) as its text, cut to :data:`~dp_operators.ledger.bounded.SHOWN_CHARS` characters."""
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return str(value)  # stored JSON holds at most 4,300 digits, which Python prints
        except ValueError:
            return shown(value)
    if isinstance(value, str):
        try:
            value = float(read_number(value))
        except BoundsError:
            return value if len(value) <= SHOWN_CHARS else value[:SHOWN_CHARS] + "…"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun`` in agreement: ``1 account``, ``2 accounts``, ``0 accounts`` (``plural`` when adding
    an s is wrong)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _exact(value: Any) -> str:
    """The ``data-exact`` text of a value: a string as it is, a number as JSON writes it, empty for None."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _when(iso: str | None, pattern: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    """An ISO 8601 time in UTC as the strftime ``pattern`` says (default ``2025-01-31 12:00:00 UTC``; the exact
    value goes in a ``<time>`` element)."""
    if iso is None:
        return "-"
    return dt.datetime.fromisoformat(iso).astimezone(dt.timezone.utc).strftime(pattern)


# After these characters a long identifier may wrap: "adult_census_release" breaks at its underscores, so a table
# column of DAG ids or release names can be narrower than its longest name and the table fits the page.
_BREAK_AFTER = re.compile(r"(?<=[_./:-])")


def _breakable(text: Any) -> markupsafe.Markup:
    """``text`` HTML-escaped with a ``<wbr>`` after each ``_ . / : -``: where it may wrap; its text is unchanged
    (``<wbr>`` adds no character to ``innerText`` or a copy)."""
    return markupsafe.Markup("<wbr>").join(markupsafe.escape(part) for part in _BREAK_AFTER.split(str(text)))


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters.update(number=_number, exact=_exact, when=_when, breakable=_breakable, counted=_counted)
    env.globals.update(href=_template_href, static_url=_static_url, charge_states=queries.CHARGE_STATES,
                       max_page=MAX_PAGE)
    return Jinja2Templates(env=env)


@jinja2.pass_context
def _template_href(context: Any, route: str, query: dict[str, Any] | None = None, /, **params: Any) -> str:
    return _href(context["request"], route, query, **params)


@jinja2.pass_context
def _static_url(context: Any, asset: str, /) -> str:
    # the content's hash in the URL: a new plotly or stylesheet is fetched at once despite the caching
    return _href(context["request"], "static_asset", {"v": _asset(asset).etag[1:13]}, name=asset)


_TEMPLATES = _templates()


def _page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    return _TEMPLATES.TemplateResponse(
        request, template, context, status_code=status_code, headers={"Content-Security-Policy": _CSP}
    )


def _error_page(request: Request, status_code: int, title: str, problems: list[str]) -> Response:
    return _page(request, "error.html", status_code, title=title, problems=problems)


def _ledger(request: Request) -> Any:
    return request.app.state.ledger()


# -- pages --------------------------------------------------------------------------------------------------------
router = APIRouter()


@router.get("/", name="overview_page")
def overview_page(request: Request, access: AccessDep) -> Response:
    """Every budget account the viewer may see, with its bar, and the approval requests waiting for a decision."""
    ledger = _ledger(request)
    rows = queries.accounts_overview(ledger, access)
    approvals = queries.pending_approvals(ledger, access=access)
    # a parent with privacy blocks is never charged: its bar would say 0 % whatever its blocks spent
    charted = [row for row in rows if row.get("structure") != "blocks"]
    return _page(request, "overview.html", accounts=rows, figure=charts.overview_figure(charted),
                 audit=audit_for(access, request.app.state.verify.status()), approvals=approvals,
                 restricted=not access.everything)


@router.get("/accounts/{name:path}", name="account_page")
def account_page(
    request: Request,
    name: AccountName,
    access: AccessDep,
    dag_id: Annotated[DagIdFilter, _Blank] = None,
    state: Annotated[StateFilter, _Blank] = None,
    since: Annotated[SinceFilter, _Blank] = None,
    until: Annotated[UntilFilter, _Blank] = None,
    after: Annotated[AfterCursor, _Blank] = None,
    limit: Annotated[PageLimit, _BlankIsDefaultLimit] = DEFAULT_LIMIT,
    blocks_before: Annotated[BlocksCursor, _Blank] = None,
) -> Response:
    """One account: summary, burn-down, forecast, its privacy blocks (a page, the latest first, after
    ``blocks_before``) or team quotas, what the next run costs, refused attempts, counts, audit-chain status and a
    page of its charges."""
    try:
        since, until = time_window(since, until)
    except ValueError as error:
        return _invalid_filters_page(request, [str(error)])
    ledger = _ledger(request)
    detail = queries.account_detail(ledger, name, blocks_before=blocks_before, access=access)
    if detail is None:  # unknown, or not the viewer's to see: the same answer (ADR 0035)
        return _error_page(request, 404, "No such budget account", [f"There is no budget account {name!r}."])
    filters = {"dag_id": dag_id, "state": state, "since": since, "until": until, "limit": limit}
    page = queries.account_charges(ledger, name, after=after, access=access, **filters)
    # the filters as the next page's and the form's query: times in ISO 8601, the default limit left out
    query = {**filters, "since": since and since.isoformat(), "until": until and until.isoformat(),
             "limit": None if limit == DEFAULT_LIMIT else limit}
    return _page(
        request,
        "account.html",
        account=detail,
        figure=None if detail.get("unreadable") else charts.burn_down_figure(detail),
        audit=audit_for(access, request.app.state.verify.status()),
        page=page,
        query=query,
        after=after,
    )


@router.get("/releases/{charge_id}", name="release_page")
def release_page(
    request: Request,
    charge_id: ChargeId,
    access: AccessDep,
    aggregate: Annotated[str | None, Query(min_length=1), _Blank] = None,
) -> Response:
    """One charge and, when committed, its published values with their confidence intervals: the first
    :data:`MAX_SHOWN_AGGREGATES` aggregates, or only ``aggregate``."""
    release = queries.release_detail(_ledger(request), charge_id, limit=MAX_SHOWN_VALUES, access=access)
    if release is None:  # unknown, or of a DAG the viewer may not read: the same answer (ADR 0035)
        return _error_page(request, 404, "No such release", [f"There is no charge {charge_id} in the ledger."])
    if release.get("output_too_large"):
        key = ", ".join(f"{name} {release[name]!r}" for name in ("account", "dag_id", "run_id", "task_id",
                                                                  "release_name"))
        return _error_page(request, 200, f"Release {release['release_name'] or '?'} (charge {charge_id})", [
            f"Charge {charge_id} ({key}) committed an output too large to show here: more than "
            f"{queries.MAX_SHOWN_OUTPUT_CHARS:,} characters, or more than {queries.MAX_SHOWN_OUTPUT_VALUES:,} values "
            "once each aggregate is cut to its first values. Its digest is "
            f"{release['output_digest'] or '-'}; 'dpctl ledger verify' checks it.",
        ])
    published = release["aggregates"]
    if aggregate is None:
        shown, others = published[:MAX_SHOWN_AGGREGATES], published[MAX_SHOWN_AGGREGATES:]
    else:
        shown, others = [entry for entry in published if entry["name"] == aggregate], []
        if not shown:
            return _error_page(request, 404, "No such aggregate",
                               [f"Release {release['release_name']!r} (charge {charge_id}) has no aggregate "
                                f"{aggregate!r}."])
    return _page(request, "release.html", release=release, aggregates=[_shown(entry) for entry in shown],
                 others=[entry["name"] for entry in others], published=len(published), chosen=aggregate)


def _shown(aggregate: dict[str, Any]) -> dict[str, Any]:
    """An aggregate of :func:`~dp_operators.dashboard.queries.release_detail` as the release page shows it: with
    its chart, and its ``rows_file`` as a dict whatever was stored (the ledger holds any JSON a spender commits)."""
    shown = dict(aggregate)
    if "rows_file" in aggregate:
        shown["rows_file"] = aggregate["rows_file"] if isinstance(aggregate["rows_file"], dict) else {}
    else:
        shown["figure"] = charts.release_figure(aggregate) if aggregate["values"] else None
    return shown


@router.get("/runs/{dag_id}/{run_id:path}", name="run_page")
def run_page(request: Request, dag_id: DagId, run_id: RunId, access: AccessDep) -> Response:
    """The charges of one DAG run in every account (Airflow's DAG-run tab); a 404 page for a DAG the viewer may not
    read."""
    run = queries.run_charges(_ledger(request), dag_id, run_id, limit=RUN_PAGE_CHARGES, access=access)
    if run is None:
        return _error_page(request, 404, "No such DAG run", [f"There is no DAG run {run_id!r} of DAG {dag_id!r}."])
    return _page(request, "run.html", run=run)


@router.get("/static/{name}", name="static_asset")
def static_asset(request: Request, name: str) -> Response:
    """plotly.js (the installed plotly package's copy) and the dashboard's stylesheet and script."""
    if name not in _ASSET_SOURCES:
        return Response(f"no static file {name!r}", status_code=404, media_type="text/plain")
    return _serve(request, _asset(name))


_PAGE_ENDPOINTS = frozenset({overview_page, account_page, release_page, run_page})


async def _invalid_parameters(request: Request, error: RequestValidationError) -> Response:
    """A 422 page for a page's invalid query or path values; the JSON routes keep FastAPI's JSON answer."""
    if request.scope.get("endpoint") not in _PAGE_ENDPOINTS:
        return await request_validation_exception_handler(request, error)
    if request.scope["endpoint"] is account_page:
        return _invalid_filters_page(request, [_filter_problem(problem) for problem in error.errors()])
    problems = [f"{'.'.join(str(part) for part in problem['loc'][1:]) or 'request'}: {problem['msg']}"
                for problem in error.errors()]
    return _error_page(request, 422, "Invalid parameters", problems)


def _filter_problem(problem: dict[str, Any]) -> str:
    """One refused value of the account page in words: the parameter, the value given, what was wrong and the
    format it takes (:data:`FILTER_FORMATS`)."""
    field = ".".join(str(part) for part in problem["loc"][1:]) or "request"
    given = problem.get("input")
    value = f" {given!r}" if isinstance(given, str) else ""
    expected = FILTER_FORMATS.get(field)
    return f"{field}:{value} is not valid ({problem['msg']})" + (f"; {expected}" if expected else "")


def _invalid_filters_page(request: Request, problems: list[str]) -> Response:
    """The account page's 422 page: the problems, and the filter form again with the values as given and a link
    back to the account's page (none when the account name itself was refused: there is no page to go back to)."""
    name = request.path_params.get("name")
    name_refused = any(problem.startswith("name:") for problem in problems)
    filters = {field: request.query_params.get(field) or None for field in _FORM_FIELDS}
    return _page(request, "error.html", 422, title="Invalid filters", problems=problems,
                 account_name=None if name_refused or not name else name, filters=filters)


#: Where to log in when the auth manager cannot say (the simple and FAB auth managers' login, under Airflow's /auth).
FALLBACK_LOGIN_URL = "/auth/login"
# A path the browser could read as another origin: "//host" and "/\host" are protocol-relative
_LEADING_SLASHES = re.compile(r"^[/\\]+")


def _login_url(request: Request) -> str:
    """Airflow's login page (``get_auth_manager().get_url_login(next_url=...)``, else :data:`FALLBACK_LOGIN_URL`)
    with ``next`` the requested page: a path on this server, as the browser sent it, never an absolute URL."""
    from airflow.api_fastapi.app import get_auth_manager

    raw = request.scope.get("raw_path") or quote(request.scope["path"]).encode()
    query = request.scope.get("query_string", b"")
    next_url = _LEADING_SLASHES.sub("/", raw.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else ""))
    try:
        login = get_auth_manager().get_url_login(next_url=next_url)
    except RuntimeError:  # no auth manager initialised
        login = None
    # BaseAuthManager.get_url_login's default body returns None
    return login or f"{FALLBACK_LOGIN_URL}?{urlencode({'next': next_url})}"


async def _login_required(request: Request, error: StarletteHTTPException) -> Response:
    """A page's 401 (no, an expired or a bad Airflow token): a small page linking to Airflow's login that returns
    here, still 401 with the ``WWW-Authenticate`` challenge; every other HTTP error, and the JSON routes' 401,
    as FastAPI answers them. Pages are told apart by route, not by the ``Accept`` header."""
    if error.status_code != 401 or request.scope.get("endpoint") not in _PAGE_ENDPOINTS:
        return await http_exception_handler(request, error)
    response = _page(request, "login.html", 401, login_url=_login_url(request))
    response.headers.update(error.headers or {})
    return response


async def _ledger_unavailable(request: Request, error: Exception) -> Response:
    """A 503 page when the ledger cannot be opened or read; the JSON routes keep the app's JSON answer."""
    if request.scope.get("endpoint") not in _PAGE_ENDPOINTS:
        return await ledger_unavailable(request, error)
    forget_ledger(request)
    return _error_page(request, 503, "The ledger cannot be read", [unavailable_message(error)])


def add_pages(app: FastAPI) -> None:
    """Add the HTML pages and their static assets to the dashboard app.

    The routes inherit the app's dependencies (the Airflow login); they read ``app.state.ledger()`` (the
    :class:`~dp_operators.ledger.Ledger`) and ``app.state.verify.status()`` (the audit-chain check's latest
    result). Responses are gzipped for clients that accept it. The pages' invalid parameters and unreadable
    ledger get HTML error pages (422, 503); the JSON routes keep their JSON answers.
    """
    app.include_router(router)
    app.add_exception_handler(RequestValidationError, _invalid_parameters)
    app.add_exception_handler(StarletteHTTPException, _login_required)
    for error_type in LEDGER_ERRORS:
        app.add_exception_handler(error_type, _ledger_unavailable)
    app.add_middleware(GZipMiddleware, minimum_size=1000)
