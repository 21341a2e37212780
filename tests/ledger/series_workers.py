"""Workers of two teams on one ledger, on SQLite and on PostgreSQL (tests of series steps from a worker's login).

``workers`` yields :class:`Workers`: ``a`` and ``b`` are the spender views of team A and team B (accounts ``a`` and
``b``, zCDP, each allowing the DAG ``d``: one DAG id allowed on two teams' accounts, docs/adr/0029), and ``officer``
the governor. On PostgreSQL each team is its own login (a member of its team role, ``allowed_roles`` set:
:mod:`team_deployment`); SQLite has no roles, so both are the spender of the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest

from dp_operators.ledger import Ledger, LedgerGovernor
from ledger_backends import BACKENDS, account_config, ledger_with
from support import governor, spender
from team_deployment import team_deployment


@dataclass
class Workers:
    a: Ledger
    b: Ledger
    officer: LedgerGovernor


def _accounts(cap_a: object, cap_b: object, roles: tuple[list[str] | None, list[str] | None] = (None, None)):
    extra_a = {"allowed_roles": roles[0]} if roles[0] else {}
    extra_b = {"allowed_roles": roles[1]} if roles[1] else {}
    return {"a": account_config("zcdp", cap=cap_a, dags=("d",), **extra_a),
            "b": account_config("zcdp", cap=cap_b, dags=("d",), **extra_b)}


def two_teams(request: pytest.FixtureRequest, tmp_path: Path, cap_a: object = 3,
              cap_b: object = Fraction(1, 10)) -> Iterator[Workers]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
        ledger_with(url, **_accounts(cap_a, cap_b))
        yield Workers(spender(url), spender(url), governor(url))
        return
    with team_deployment(request.getfixturevalue("pg_database"), "series",
                         lambda t: _accounts(cap_a, cap_b, ([t.team_a], [t.team_b]))) as t:
        yield Workers(t.ledger(t.login_a), t.ledger(t.login_b), t.officer())


@pytest.fixture(params=BACKENDS)
def workers(request, tmp_path) -> Iterator[Workers]:
    yield from two_teams(request, tmp_path)
