"""Who sees what (ADR 0035): the dashboard filters every page and JSON route by the DAGs the Airflow user may read,
with real Airflow JWTs from an auth manager that grants DAGs per user (``dashboard_auth.PerDagAuthManager``: the
simple auth manager's logins and roles, FAB-like per-DAG grants). ``alice`` may read DAG ``census_dag``, ``bob``
DAG ``pums_dag``, ``officer`` every DAG (a privacy officer). A hidden account, release or run answers 404, as an
unknown one does. Also: the pending approvals (overview, account page, ``/api/approvals``), read-only, same rule."""

from __future__ import annotations

import datetime as dt
import json
from fractions import Fraction

import pytest
from fastapi.testclient import TestClient

from dashboard_apps import AuditStandIn, dashboard, reserve
from dashboard_auth import GRANTS_VARIABLE, JWT_SECRET, PER_DAG_AUTH_MANAGER, bearer, mint
from dp_operators.dashboard import queries
from dp_operators.dashboard.access import DagAccess
from dp_operators.ledger import ReleaseKey
from dp_operators.ledger.config import Approval
from ledger_backends import account_config, governor, ledger_with

GRANTS = {"alice": ["census_dag"], "bob": ["pums_dag"], "officer": "*"}
PLAN = {"release": "census_release", "account": "census", "charge": "2", "remaining_after": "8", "confidence": 0.95,
        "reasons": ["above"], "mechanisms": [{"aggregate": "n", "component": "count", "mechanism": "discrete_laplace",
                                              "half_width": 3.5}]}
PROBLEM = "account 'pums': a problem naming pums_dag"


@pytest.fixture(scope="module")
def per_dag_auth_manager(tmp_path_factory):
    """:class:`dashboard_auth.PerDagAuthManager` initialised as the api-server does, with :data:`GRANTS`."""
    from airflow import settings
    from airflow.api_fastapi.app import init_auth_manager, purge_cached_app
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
    from airflow.models.revoked_token import RevokedToken

    patch = pytest.MonkeyPatch()
    patch.setenv("AIRFLOW__CORE__AUTH_MANAGER", PER_DAG_AUTH_MANAGER)
    patch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", JWT_SECRET)
    patch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "alice:viewer,bob:viewer,officer:viewer")
    patch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
                 str(tmp_path_factory.mktemp("auth") / "passwords.json"))
    patch.setenv(GRANTS_VARIABLE, json.dumps(GRANTS))

    def reset() -> None:
        purge_cached_app()
        BaseAuthManager._get_token_signer.cache_clear()
        BaseAuthManager._get_token_validator.cache_clear()

    reset()
    RevokedToken.__table__.create(settings.engine, checkfirst=True)
    yield init_auth_manager()
    reset()
    patch.undo()


@pytest.fixture
def ledger(ledger_url):
    """Accounts ``census`` (DAG census_dag, approval above 1), ``pums`` (pums_dag) and ``shared`` (both), a committed
    charge of each DAG on each account it may spend, a refusal of each DAG, and a pending approval request of
    census_dag on ``census``."""
    ledger = ledger_with(
        ledger_url,
        census=account_config("pure_dp", epsilon="10", dags=("census_dag",), approval=Approval(above=1)),
        pums=account_config("pure_dp", epsilon="5", dags=("pums_dag",)),
        shared=account_config("pure_dp", epsilon="3", dags=("census_dag", "pums_dag")),
    )
    for account, dag in (("census", "census_dag"), ("pums", "pums_dag"), ("shared", "census_dag"),
                         ("shared", "pums_dag")):
        ledger.commit(reserve(ledger, account, f"run_{dag}", dag=dag), {"aggregates": {}})
    for account, dag in (("census", "census_dag"), ("pums", "pums_dag")):
        with pytest.raises(Exception):  # noqa: B017,PT011  (the ledger refuses: budget exhausted)
            reserve(ledger, account, "too_much", amount="100", dag=dag)
    key = ReleaseKey("census_dag", "big_run", "release", -1, "census_release")
    ledger.request_approval(key, account="census", amount=Fraction(2), mechanisms=[{"mechanism": "discrete_laplace"}],
                            spec_hash="h" * 64, plan=PLAN)
    return ledger


def _client(ledger, **audit) -> TestClient:
    return TestClient(dashboard(ledger, AuditStandIn(**audit)), raise_server_exceptions=False)


def _as(client: TestClient, manager, user: str, path: str):
    return client.get(path, headers=bearer(mint(manager, user=user)))


def _charge_of(ledger, account: str, dag: str) -> int:
    [charge] = [c for c in ledger.charges(account=account) if c["dag_id"] == dag and c["state"] == "committed"]
    return charge["id"]


def test_each_user_lists_the_accounts_of_its_dags_and_the_officer_all(ledger, per_dag_auth_manager):
    with _client(ledger) as client:
        listed = {user: sorted(row["name"] for row in _as(client, per_dag_auth_manager, user, "/api/accounts").json())
                  for user in GRANTS}
        pages = {user: _as(client, per_dag_auth_manager, user, "/").text for user in GRANTS}
    assert listed == {"alice": ["census", "shared"], "bob": ["pums", "shared"], "officer": ["census", "pums", "shared"]}
    assert 'data-account="pums"' not in pages["alice"] and 'data-account="census"' in pages["alice"]
    assert 'data-account="census"' not in pages["bob"] and 'data-account="pums"' in pages["bob"]
    assert 'id="restricted-note"' in pages["alice"] and 'id="restricted-note"' not in pages["officer"]


def test_another_teams_account_release_and_run_answer_404_by_url_and_api(ledger, per_dag_auth_manager):
    """alice cannot read bob's account, release or run, by page or API; the answers are those of unknown ones."""
    pums_release = _charge_of(ledger, "pums", "pums_dag")
    census_release = _charge_of(ledger, "census", "census_dag")
    with _client(ledger) as client:
        for path in ("/api/accounts/pums", "/api/accounts/pums/charges", "/accounts/pums",
                     f"/api/releases/{pums_release}", f"/releases/{pums_release}", "/api/runs/pums_dag/run_pums_dag",
                     "/runs/pums_dag/run_pums_dag"):
            hidden = _as(client, per_dag_auth_manager, "alice", path)
            assert hidden.status_code == 404, (path, hidden.status_code)
            # the answer of an account, release or run that does not exist, word for word
            twin = _as(client, per_dag_auth_manager, "alice",
                       path.replace("pums", "zzzz").replace(str(pums_release), "999999"))
            assert twin.status_code == 404, path
            assert hidden.text == twin.text.replace("zzzz", "pums").replace("999999", str(pums_release)), path
            # the officer reads each; bob too
            for user in ("officer", "bob"):
                assert _as(client, per_dag_auth_manager, user, path).status_code == 200, (user, path)
        # and bob cannot read alice's
        for path in ("/api/accounts/census", f"/api/releases/{census_release}", "/api/runs/census_dag/run_census_dag",
                     "/accounts/census", f"/releases/{census_release}"):
            assert _as(client, per_dag_auth_manager, "bob", path).status_code == 404, path
            assert _as(client, per_dag_auth_manager, "alice", path).status_code == 200, path


def test_a_shared_account_shows_its_totals_but_only_the_readers_charges(ledger, per_dag_auth_manager):
    with _client(ledger) as client:
        details = {user: _as(client, per_dag_auth_manager, user, "/api/accounts/shared").json() for user in GRANTS}
        charges = {user: _as(client, per_dag_auth_manager, user, "/api/accounts/shared/charges").json()
                   for user in GRANTS}
        filtered = _as(client, per_dag_auth_manager, "alice", "/api/accounts/shared/charges?dag_id=pums_dag").json()
        page = _as(client, per_dag_auth_manager, "alice", "/accounts/shared").text
    # the totals are the account's, for everyone who may see it
    assert {details[user]["spent"] for user in GRANTS} == {"1/50"}
    assert details["alice"]["restricted"] is True and details["officer"]["restricted"] is False
    assert [c["dag_id"] for c in charges["alice"]["charges"]] == ["census_dag"]
    assert [c["dag_id"] for c in charges["bob"]["charges"]] == ["pums_dag"]
    assert sorted(c["dag_id"] for c in charges["officer"]["charges"]) == ["census_dag", "pums_dag"]
    assert charges["alice"]["total"] == 1 and filtered["charges"] == [] and filtered["total"] == 0
    assert details["alice"]["charge_counts"]["total"] == 1 and details["officer"]["charge_counts"]["total"] == 2
    assert [run["dag_id"] for run in details["alice"]["next_run"]["runs"]] == ["census_dag"]
    assert 'id="restricted-note"' in page and "run_pums_dag" not in page and "run_census_dag" in page


def test_refusals_follow_the_dags(ledger, per_dag_auth_manager):
    with _client(ledger) as client:
        census = _as(client, per_dag_auth_manager, "alice", "/api/accounts/census").json()
        officer = _as(client, per_dag_auth_manager, "officer", "/api/accounts/census").json()
    assert [r["dag_id"] for r in census["refusals"]] == ["census_dag"] == [r["dag_id"] for r in officer["refusals"]]


def test_pending_approvals_are_listed_read_only_for_who_may_read_their_dag(ledger, per_dag_auth_manager):
    with _client(ledger) as client:
        api = {user: _as(client, per_dag_auth_manager, user, "/api/approvals").json() for user in GRANTS}
        account = _as(client, per_dag_auth_manager, "alice", "/api/accounts/census").json()
        overview = {user: _as(client, per_dag_auth_manager, user, "/").text for user in GRANTS}
        page = _as(client, per_dag_auth_manager, "alice", "/accounts/census").text
        # read-only: no route decides
        for method in ("post", "put", "delete", "patch"):
            answer = getattr(client, method)("/api/approvals", headers=bearer(mint(per_dag_auth_manager,
                                                                                 user="officer")))
            assert answer.status_code == 405, method
    assert api["bob"] == {"approvals": [], "total": 0, "more": False}
    [pending] = api["alice"]["approvals"]
    assert api["officer"]["approvals"] == [pending] and api["alice"]["total"] == 1
    assert pending["account"] == "census" and pending["request"] >= 1 and pending["amount"] == "2"
    assert (pending["dag_id"], pending["run_id"], pending["release_name"]) == ("census_dag", "big_run",
                                                                                 "census_release")
    requested = dt.datetime.fromisoformat(pending["requested_at"])
    assert dt.datetime.fromisoformat(pending["expires_at"]) - requested == dt.timedelta(hours=24)
    assert pending["plan"]["charge"] == "2" and pending["plan"]["remaining_after"] == "8"
    assert pending["plan"]["mechanisms"] == [{"aggregate": "n", "component": "count", "mechanism": "discrete_laplace",
                                              "half_width": 3.5}]
    assert pending["command"] == f"dpctl ledger approve census {pending['request']}"
    assert account["approvals"] == [pending] and account["approvals_total"] == 1
    assert pending["command"] in overview["alice"] and pending["command"] in overview["officer"]
    assert pending["command"] not in overview["bob"] and 'id="no-approvals"' in overview["bob"]
    assert pending["command"] in page and 'id="approvals-table"' in page


def test_a_decided_or_timed_out_request_is_not_pending(ledger, ledger_url):
    [pending] = queries.pending_approvals(ledger)["approvals"]
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=25)
    assert queries.pending_approvals(ledger, now=later) == {"approvals": [], "total": 0, "more": False}
    governor(ledger_url).decide_approval("census", pending["request"], approve=True, reason="ok", user="carol")
    assert queries.pending_approvals(ledger)["approvals"] == []
    assert queries.account_detail(ledger, "census")["approvals"] == []


def test_hostile_plan_values_are_shown_within_bounds(ledger_url):
    ledger = ledger_with(ledger_url, a=account_config("pure_dp", epsilon="10", dags=("d",), approval=Approval(above=1)))
    hostile = {"charge": "1e-99999999", "remaining_after": 7, "confidence": "high", "reasons": ["x" * 500, 3],
               "mechanisms": [{"aggregate": "<script>", "half_width": "wide"}] * 300 + ["junk"]}
    ledger.request_approval(ReleaseKey("d", "r", "t", -1, "rel"), account="a", amount=Fraction(2),
                            mechanisms=[], spec_hash="h" * 64, plan=hostile)
    [pending] = queries.pending_approvals(ledger)["approvals"]
    plan = pending["plan"]
    assert plan["charge"] is None and plan["remaining_after"] is None and plan["confidence"] is None
    assert plan["reasons"] == ["x" * 80 + "…"] and plan["mechanisms_total"] == 301
    assert len(plan["mechanisms"]) == queries.MAX_PLAN_STEPS
    assert plan["mechanisms"][0] == {"aggregate": "<script>", "component": None, "mechanism": None,
                                     "half_width": None}


def test_the_audit_chains_problems_are_for_the_officer(ledger, per_dag_auth_manager):
    with _client(ledger, state="problems", problem_count=1, problems=[PROBLEM]) as client:
        alice = _as(client, per_dag_auth_manager, "alice", "/api/audit-chain").json()
        officer = _as(client, per_dag_auth_manager, "officer", "/api/audit-chain").json()
        page = _as(client, per_dag_auth_manager, "alice", "/accounts/census").text
    assert alice["problems"] == [] and alice["problems_hidden"] is True and alice["problem_count"] == 1
    assert officer["problems"] == [PROBLEM]
    assert "pums_dag" not in page and 'id="audit-problems-hidden"' in page


def test_a_user_without_any_grant_sees_no_account(ledger, per_dag_auth_manager):
    with _client(ledger) as client:
        token = mint(per_dag_auth_manager, user="mallory")  # a viewer whom no DAG is granted
        assert client.get("/api/accounts", headers=bearer(token)).json() == []
        assert 'id="no-accounts"' in client.get("/", headers=bearer(token)).text
        assert client.get("/api/approvals", headers=bearer(token)).json()["approvals"] == []


def test_dag_access_asks_each_dag_once_and_fails_closed():
    asked: list[set] = []

    def ask(ids):
        asked.append(set(ids))
        return {dag for dag in ids if dag.startswith("ok")}

    access = DagAccess(False, ask)
    assert access.readable(["ok1", "no1", None, 3]) == {"ok1"}
    assert access.readable(["ok1", "ok2"]) == {"ok1", "ok2"}
    assert asked == [{"ok1", "no1"}, {"ok2"}]
    assert not access.may_see_account(None) and not access.may_see_account(["no1"])
    assert access.may_see_account(["no1", "ok2"]) and DagAccess.all().may_see_account(None)


def test_multi_team_mode_asks_per_team_and_the_officer_needs_every_team(monkeypatch):
    """In multi-team mode each DAG is asked about with its team (from Airflow's database), and a privacy officer
    must be authorized for every team's DAGs."""
    from dp_operators.dashboard import access as access_module

    calls = []

    class Manager:
        def is_authorized_dag(self, *, method, user, details=None):
            return details is None or details.team_name == "red"

        def filter_authorized_dag_ids(self, *, dag_ids, user, method, team_name):
            calls.append((sorted(dag_ids), team_name))
            return set(dag_ids) if team_name == "red" else set()

    monkeypatch.setattr(access_module, "_multi_team", lambda: True)
    monkeypatch.setattr(access_module, "_teams", lambda: {"red", "blue"})
    monkeypatch.setattr(access_module, "_teams_of", lambda ids: {"r": "red", "b": "blue"})
    viewer = access_module.user_access(Manager(), object())
    assert not viewer.everything
    assert viewer.readable(["r", "b", "unknown"]) == {"r"}
    assert sorted(calls, key=str) == sorted([(["r"], "red"), (["b"], "blue"), (["unknown"], None)], key=str)
    monkeypatch.setattr(access_module, "_teams", lambda: {"red"})
    assert access_module.user_access(Manager(), object()).everything
