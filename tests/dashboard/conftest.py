"""Fixtures of the dashboard tests: every test taking ``ledger_url`` runs on SQLite and on PostgreSQL; the
``auth_manager`` fixture is Airflow's simple auth manager signing the tests' JWTs (``dashboard_auth.mint``)."""

from __future__ import annotations

import pytest

from dashboard_auth import JWT_SECRET, ROLE, SIMPLE_AUTH_MANAGER, USER
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
