"""``require_enforced_bounding`` and quantile releases (review of ADR 37; these hold, kept as regression tests):
a median whose histogram was computed upstream is refused before anything is read or charged, by the engine and by
the database for a worker login calling ``Ledger.reserve`` with the quantile's declared record; a median bounded by
the operator from raw rows is charged, recorded ``enforced``, and its histogram holds at most
``max_partitions_contributed * max_contributions_per_partition`` records per unit."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pandas as pd
import pytest
import sqlalchemy as sa

from dp_operators.ledger import BoundingNotEnforcedError, ReleaseKey
from dp_operators.release import ReleaseConfigError, plan_release, run_release
from dp_operators.release.bounding import bound_frame, declared_bounding
from dp_operators.spec import ReleaseSpec
from ledger_backends import account_config, ledger_with
from team_deployment import Teams, team_deployment


def _spec(l0: int = 1, linf: int = 1) -> ReleaseSpec:
    return ReleaseSpec.model_validate({
        "version": 1, "release": "m", "budget_account": "acct", "privacy_unit": "person",
        "contribution": {"max_partitions_contributed": l0, "max_contributions_per_partition": linf},
        "aggregates": [{"name": "bill", "kind": "median", "bins": {"column": "bill", "edges": [0, 500], "width": 10},
                        "mechanism": "exponential", "budget": {"epsilon": "1/2"}}]})


def _key() -> ReleaseKey:
    return ReleaseKey("d", f"r_{uuid.uuid4().hex[:8]}", "release", -1, "m")


def test_an_upstream_median_is_refused_before_anything_is_read(ledger_url):
    ledger = ledger_with(ledger_url, acct=account_config("zcdp", cap=1, delta="1e-6", dags=("d",),
                                                         require_enforced_bounding=True))

    def read():
        raise AssertionError("the histogram was read")

    with pytest.raises(ReleaseConfigError, match="requires enforced contribution bounding"):
        run_release(_spec(), read, ledger, _key(), spec_hash="0" * 64)
    assert list(ledger.charges()) == []


@pytest.fixture
def teams(pg_database: sa.URL) -> Iterator[Teams]:
    with team_deployment(pg_database, "qbnd", lambda t: {
        "acct": account_config("zcdp", cap=1, delta="1e-6", dags=("d",), allowed_roles=[t.team_a],
                               require_enforced_bounding=True)}) as t:
        yield t
        t.dispose()


def test_a_worker_login_reserving_a_declared_quantile_record_is_refused_by_the_database(teams):
    plan = plan_release(_spec(), accountant="zcdp")
    mechanisms = [{**s.describe(), "contribution_bounding": declared_bounding("upstream")} for s in plan.steps]
    with pytest.raises(BoundingNotEnforcedError):
        teams.ledger(teams.login_a).reserve(_key(), account="acct", amount=plan.charge("zcdp"),
                                            mechanisms=mechanisms, spec_hash="0" * 64)
    assert list(teams.ledger(teams.login_a).charges()) == []


@pytest.mark.parametrize(("l0", "linf"), [(1, 1), (2, 1), (2, 3)])
def test_raw_rows_bound_each_unit_to_l0_times_linf_records_of_the_histogram(l0, linf):
    rng = random.Random(7)
    rows = pd.DataFrame([(p, rng.choice([5.0, 15.0, 25.0, 35.0, 999.0, -4.0]))
                         for p in range(300) for _ in range(rng.randint(1, 9))], columns=["patient", "bill"])
    spec = _spec(l0, linf)
    bounded = bound_frame(spec, spec.aggregates[0], rows, "patient", None, seed=1)
    total = sum(int(r["count"]) for r in bounded)
    assert total <= 300 * l0 * linf
    step = plan_release(spec, accountant="zcdp").steps[0]
    assert step.records_per_unit == l0 * linf
    # a single unit with many rows in many bins adds at most l0 * linf records
    one = pd.DataFrame([(1, float(v)) for v in range(0, 500, 7) for _ in range(5)], columns=["patient", "bill"])
    assert sum(int(r["count"]) for r in bound_frame(spec, spec.aggregates[0], one, "patient", None, seed=2)) \
        == min(l0, 50) * linf
