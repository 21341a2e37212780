"""Fixtures of the dashboard tests: every test taking ``ledger_url`` runs on SQLite and on PostgreSQL; the
``auth_manager`` fixture is Airflow's simple auth manager signing the tests' JWTs (``dashboard_auth.mint``), and
``token`` a viewer's JWT from it; ``hostile`` is a ledger whose every DAG-author-controlled string is hostile
(``hostile_names``); ``chromium`` is Debian's Chromium driven by Playwright (skipped where it cannot run)."""

from __future__ import annotations

import pytest

from dashboard_apps import integration_support, reserve
from dashboard_auth import JWT_SECRET, ROLE, SIMPLE_AUTH_MANAGER, USER, mint
from hostile_names import (
    HOSTILE_ACCOUNT,
    HOSTILE_DAG,
    HOSTILE_MECHANISMS,
    HOSTILE_OUTPUT,
    HOSTILE_RELEASE,
    HOSTILE_RUN,
    HOSTILE_TASK,
)
from ledger_backends import account_config, ledger_with
from ledger_backends import ledger_url, pg_database  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def auth_manager(tmp_path_factory):
    """Airflow's simple auth manager initialised as the api-server does (``init_auth_manager``), signing with
    :data:`~dashboard_auth.JWT_SECRET` and knowing user :data:`~dashboard_auth.USER`; torn down so no other test
    sees it."""
    from airflow.api_fastapi.app import init_auth_manager, purge_cached_app
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager

    patch = pytest.MonkeyPatch()
    patch.setenv("AIRFLOW__CORE__AUTH_MANAGER", SIMPLE_AUTH_MANAGER)
    patch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", JWT_SECRET)
    patch.setenv("AIRFLOW__API_AUTH__JWT_LEEWAY", "0")
    patch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", f"{USER}:{ROLE}")
    patch.setenv(
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path_factory.mktemp("auth") / "passwords.json")
    )

    def reset() -> None:
        purge_cached_app()  # also forgets the auth manager singleton
        BaseAuthManager._get_token_signer.cache_clear()
        BaseAuthManager._get_token_validator.cache_clear()

    reset()
    # get_user_from_token looks the token's jti up in Airflow's metadata database (logged-out tokens); the
    # session's throwaway Airflow home has an empty one, so create that one table
    from airflow import settings
    from airflow.models.revoked_token import RevokedToken

    RevokedToken.__table__.create(settings.engine, checkfirst=True)
    yield init_auth_manager()
    reset()
    patch.undo()


@pytest.fixture
def token(auth_manager):
    """A JWT of the viewer :data:`~dashboard_auth.USER`, as Airflow's login mints it."""
    return mint(auth_manager)


@pytest.fixture
def hostile(ledger_url):
    """A ledger whose every DAG-author-controlled string is hostile: account ``census`` (and a hostile-named
    account) with a committed release publishing :data:`~hostile_names.HOSTILE_OUTPUT`, and ordinary committed
    charges of DAG ``d``, runs ``r1..r3``."""
    ledger = ledger_with(
        ledger_url,
        census=account_config("pure_dp", epsilon="10", dags=("d", HOSTILE_DAG)),
        **{HOSTILE_ACCOUNT: account_config("pure_dp", epsilon="3", dags=(HOSTILE_DAG,))},
    )
    for run in ("r1", "r2", "r3"):
        ledger.commit(reserve(ledger, "census", run), {"run": run})
    for number, account in enumerate(("census", HOSTILE_ACCOUNT)):  # two tasks of the same run
        ledger.commit(reserve(ledger, account, HOSTILE_RUN, dag=HOSTILE_DAG, task=HOSTILE_TASK + "#" * number,
                              release=HOSTILE_RELEASE, mechanisms=HOSTILE_MECHANISMS), HOSTILE_OUTPUT)
    return ledger


@pytest.fixture
def chromium():
    """Debian's Chromium launched by Playwright with the integration tests' flags."""
    support = integration_support()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(support.CHROMIUM), args=support.CHROMIUM_ARGS)
        yield browser
        browser.close()
