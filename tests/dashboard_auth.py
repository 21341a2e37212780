"""Airflow logins for the dashboard's tests (``tests/dashboard``): the simple auth manager's settings, real Airflow
JWTs and the header that carries one (import as ``from dashboard_auth import ...``).

The ``auth_manager`` fixture that initialises Airflow's simple auth manager with these settings is in
``tests/dashboard/conftest.py``; :func:`mint` takes the manager it yields.
"""

from __future__ import annotations

from typing import Any

#: The secret the test auth manager signs JWTs with (Airflow wants at least 64 characters for HS512).
JWT_SECRET = "dashboard-test-jwt-secret-" + "j" * 38
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
#: The one user of the test auth manager and its Airflow role (``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS``).
USER, ROLE = "officer", "viewer"


def mint(auth_manager: Any, role: str | None = ROLE, **kwargs: Any) -> str:
    """A JWT for user :data:`USER` with ``role`` (``None``: a user without a role, whom Airflow shows nothing),
    made the way Airflow's login does (``BaseAuthManager.generate_jwt``; ``kwargs`` go to it, e.g.
    ``expiration_time_in_seconds``)."""
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return auth_manager.generate_jwt(SimpleAuthManagerUser(username=USER, role=role), **kwargs)


def bearer(token: str) -> dict[str, str]:
    """The request headers that present ``token`` as an API client does: ``Authorization: Bearer <token>``."""
    return {"Authorization": f"Bearer {token}"}
