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


def mint(auth_manager: Any, role: str | None = ROLE, *, user: str = USER, **kwargs: Any) -> str:
    """A JWT for ``user`` (default :data:`USER`) with ``role`` (``None``: a user without a role, whom Airflow shows
    nothing), made the way Airflow's login does (``BaseAuthManager.generate_jwt``; ``kwargs`` go to it, e.g.
    ``expiration_time_in_seconds``)."""
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return auth_manager.generate_jwt(SimpleAuthManagerUser(username=user, role=role), **kwargs)


#: The environment variable :class:`PerDagAuthManager` reads its grants from: JSON ``{"user": ["dag", ...]}``, or
#: ``"*"`` for a user who may read every DAG (a privacy officer). Read at each check, so an api-server started
#: with it in its environment (the browser test) grants the same.
GRANTS_VARIABLE = "DP_DASHBOARD_TEST_DAG_GRANTS"
#: Where Airflow imports it from (``AIRFLOW__CORE__AUTH_MANAGER``; ``tests/`` on the path).
PER_DAG_AUTH_MANAGER = "dashboard_auth.PerDagAuthManager"


def _per_dag_auth_manager() -> type:
    import json
    import os

    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    class PerDagAuthManager(SimpleAuthManager):
        """Airflow's simple auth manager (users, roles, login, JWTs and UI access as it has them), but DAG access
        granted per user, as FAB's per-DAG permissions or Keycloak's resources grant it: a user reads a DAG only
        when :data:`GRANTS_VARIABLE` names it for that user, and every DAG (``is_authorized_dag`` without a DAG
        id) only with ``"*"``. Other methods than GET follow the simple auth manager's roles, on granted DAGs."""

        def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
            if not super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details):
                return False
            grant = json.loads(os.environ.get(GRANTS_VARIABLE) or "{}").get(user.get_name(), [])
            if grant == "*":
                return True
            return details is not None and details.id is not None and details.id in grant

    PerDagAuthManager.__module__ = __name__
    PerDagAuthManager.__qualname__ = "PerDagAuthManager"
    return PerDagAuthManager


def __getattr__(name: str) -> Any:
    # built on first use: importing this module must not import Airflow (the non-dashboard tests import it)
    if name == "PerDagAuthManager":
        cls = _per_dag_auth_manager()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def bearer(token: str) -> dict[str, str]:
    """The request headers that present ``token`` as an API client does: ``Authorization: Bearer <token>``."""
    return {"Authorization": f"Bearer {token}"}
