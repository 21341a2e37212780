"""Who sees what on the budget dashboard (ADR 0035): the DAGs an Airflow user may read, asked of Airflow's auth
manager once per request.

* A **privacy officer** sees everything: a user whom the auth manager lets read every DAG
  (``is_authorized_dag(method="GET", user=...)`` without details: FAB's "can read on DAGs", the simple auth
  manager's viewer role and above) and, when Airflow runs in multi-team mode (``[core] multi_team``), every team's
  DAGs (``is_authorized_dag`` with ``DagDetails(team_name=team)`` for each team in Airflow's database).
* **Anyone else** sees what concerns the DAGs it may read: a DAG id is readable when
  ``filter_authorized_dag_ids(dag_ids=..., user=..., method="GET", team_name=...)`` keeps it (the auth manager's
  own per-DAG check; FAB answers it in one query), with the DAG's team from Airflow's database in multi-team mode
  (a DAG Airflow does not know has no team). The DAG ids asked about are those the ledger holds (an account's
  ``allowed_dags``, its charges' and events' ``dag_id``), not Airflow's DAG table, so the charges of a DAG since
  deleted from Airflow stay visible to whoever may read that DAG id.

The rules the routes apply (:mod:`dp_operators.dashboard.app`, :mod:`~dp_operators.dashboard.pages`,
:mod:`~dp_operators.dashboard.queries`): a charge, release, DAG run, refusal, series, next-run cost or approval
request is shown only when its ``dag_id`` is readable; an account (and a member account: a block, a team's quota)
only when one of its ``allowed_dags`` is, and then with its own totals (cap, spent, reserved, remaining, burn-down,
forecast: the shared budget) but only the charges, counts and lists of readable DAGs. Whatever is hidden answers
404, as an unknown one does, so its existence does not leak.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

#: Most DAG ids asked about per request beyond which the rest count as unreadable (fail closed): a ledger whose
#: rows were written around it can hold any number of DAG ids, and the auth manager's check may cost per id.
MAX_ASKED_DAGS = 10_000


class DagAccess:
    """What one user may read, for one request: ``everything`` for a privacy officer, else the DAG ids the auth
    manager lets it read (asked lazily, each id once).

    Args:
        everything: a privacy officer: no filter at all.
        ask: for a set of DAG ids, the subset the user may read (called once per batch of new ids).
    """

    def __init__(self, everything: bool, ask: Any = None) -> None:
        self.everything = everything
        self._ask = ask
        self._known: dict[str, bool] = {}

    @classmethod
    def all(cls) -> DagAccess:
        """A privacy officer's access (also what the queries assume when given none)."""
        return cls(True)

    @classmethod
    def only(cls, dag_ids: Iterable[str]) -> DagAccess:
        """Access to exactly ``dag_ids`` (tests, and a fixed grant)."""
        granted = frozenset(dag_ids)
        return cls(False, lambda asked: {dag_id for dag_id in asked if dag_id in granted})

    def readable(self, dag_ids: Iterable[Any]) -> frozenset[str]:
        """The DAG ids of ``dag_ids`` the user may read (every string one for a privacy officer); values that are
        no string (an unreadable row's) are never readable."""
        asked = {dag_id for dag_id in dag_ids if isinstance(dag_id, str)}
        if self.everything:
            return frozenset(asked)
        new = [dag_id for dag_id in asked if dag_id not in self._known]
        if new:
            allowed = set(self._ask(set(new[:MAX_ASKED_DAGS]))) if self._ask is not None else set()
            for dag_id in new:
                self._known[dag_id] = dag_id in allowed
        return frozenset(dag_id for dag_id in asked if self._known[dag_id])

    def may_read(self, dag_id: Any) -> bool:
        """Whether the user may read DAG ``dag_id``."""
        return bool(self.readable([dag_id]))

    def may_see_account(self, allowed_dags: Any) -> bool:
        """Whether the user may see an account whose ``allowed_dags`` (as read; ``None`` when unreadable) is this:
        a privacy officer always, anyone else when it may read one of them."""
        if self.everything:
            return True
        return isinstance(allowed_dags, (list, tuple)) and bool(self.readable(allowed_dags))


def _multi_team() -> bool:
    from airflow.configuration import conf

    return conf.getboolean("core", "multi_team", fallback=False)


def _teams() -> set[str]:
    from airflow.models.team import Team

    return Team.get_all_team_names()


def _teams_of(dag_ids: set[str]) -> dict[str, str | None]:
    """The team of each DAG id Airflow's database knows (multi-team mode); the others are missing."""
    import sqlalchemy as sa
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.team import dag_bundle_team_association_table as bundle_team
    from airflow.utils.session import create_session

    query = (
        sa.select(DagModel.dag_id, bundle_team.c.team_name)
        .join(DagBundleModel, DagModel.bundle_name == DagBundleModel.name)
        .join(bundle_team, DagBundleModel.name == bundle_team.c.dag_bundle_name, isouter=True)
        .where(DagModel.dag_id.in_(sorted(dag_ids)))
    )
    with create_session() as session:
        return {dag_id: team for dag_id, team in session.execute(query)}


def is_privacy_officer(auth_manager: Any, user: Any) -> bool:
    """Whether ``user`` may read every DAG (and, in multi-team mode, every team's): a privacy officer."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    if not auth_manager.is_authorized_dag(method="GET", user=user):
        return False
    if not _multi_team():
        return True
    return all(auth_manager.is_authorized_dag(method="GET", user=user, details=DagDetails(team_name=team))
               for team in sorted(_teams()))


def user_access(auth_manager: Any, user: Any) -> DagAccess:
    """The :class:`DagAccess` of ``user`` through ``auth_manager`` (Airflow's ``get_auth_manager()``)."""
    if is_privacy_officer(auth_manager, user):
        return DagAccess.all()
    multi_team = _multi_team()

    def ask(dag_ids: set[str]) -> set[str]:
        teams = _teams_of(dag_ids) if multi_team else {}
        by_team: dict[str | None, set[str]] = {}
        for dag_id in dag_ids:
            by_team.setdefault(teams.get(dag_id), set()).add(dag_id)
        allowed: set[str] = set()
        for team, ids in by_team.items():
            allowed |= auth_manager.filter_authorized_dag_ids(dag_ids=ids, user=user, method="GET", team_name=team)
        return allowed

    return DagAccess(False, ask)
