"""DPReleaseOperator under Airflow's real scheduler on the CeleryExecutor: two Celery workers, a Redis broker,
PostgreSQL, concurrent runs, a killed task and a killed worker.

One Airflow deployment per module, set up as docs/deploy-celery.md describes and as ``test_scheduler.py``'s (the same
``scheduler_deployment.py``, DAGs and ledger), on the CeleryExecutor: the broker is the Redis server at
``DP_IT_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) under a key prefix of the session's own (kombu's
``global_keyprefix``, deleted at the end), Celery's results go to Airflow's metadata database on PostgreSQL
(``db+postgresql://...``), and two ``airflow celery worker`` processes, each with its own ``--celery-hostname``,
``--pid``, log-server port and ``--concurrency``, run the tasks. The tasks connect to the ledger as a login of the
spender role. Then:

(a) ``it_budget_race``: eight concurrent runs against an account whose cap fits exactly five releases, spread over
    both workers. Exactly five succeed; three fail at once (no retry) with the ledger's budget refusal; the ledger
    spent exactly the cap.
(b) ``it_killed_release``: the release's first try reserves and draws its noise, then stalls before the commit and
    is SIGKILLed: its task process only (the supervisor, in the Celery worker's pool process, reports the death), or
    its task process and its whole worker's process group, as when the worker's machine is lost (the scheduler finds
    the try by its heartbeat timeout; the test starts the worker again at once). That run starts first and alone,
    so that killing its worker ends no other run's task. Either way one committed charge, the dead try's charge
    ``abandoned`` and still spent, one publication.
(c) The held lease waits instead of failing: ``retry_delay`` (4 s) is shorter than the dead try's lease (30 s, kept
    alive by the test until try 2 met it), so try 2 meets a live lease; it is rescheduled to the lease's end
    (``up_for_reschedule``, recorded in ``task_reschedule``), charged nothing and no try spent, then takes the
    release over once the lease ran out: the run succeeds as try 2, published.
``dpctl ledger verify`` passes afterwards.

Skips with the reason when Redis or PostgreSQL cannot be reached; fails instead when ``CI`` is set.
"""

from __future__ import annotations

import pytest

from airflow_services import RedisScratch
from scheduler_deployment import (
    KILLED, RACE, CeleryExecutorSetup, check_budget_race, check_killed_release, check_lease_wait,
    check_ledger_verifies, deployed, plan_charge,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLED_RUNS = CeleryExecutorSetup.killed_runs
TIMINGS: dict[str, float] = {}
#: what a Celery worker logs when it takes an Airflow workload off the broker
RECEIVED = r"Task execute_workload\[[-0-9a-f]+\] received"


@pytest.fixture(scope="module")
def broker():
    with RedisScratch.session() as redis:
        yield redis


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, adult_csv, broker):
    """Set up, start Airflow with two Celery workers, trigger the killed-worker run, kill its worker (started again at
    once), trigger the other runs, kill the other stalled first try, wait until every run finished."""
    with deployed(CeleryExecutorSetup(broker), frozenset({RACE, KILLED}), tmp_path_factory.mktemp("airflow_celery"),
                  adult_csv, TIMINGS) as running:
        yield running


def test_budget_race_commits_exactly_the_releases_the_cap_fits(deployment):
    """(a): five of eight concurrent runs commit, three are refused at once; the ledger spent exactly the cap."""
    check_budget_race(deployment)


def test_both_workers_ran_tasks(deployment):
    """The two workers shared the tasks: each took workloads off the broker, under its own Celery hostname."""
    for worker in CeleryExecutorSetup.workers:
        assert deployment.services.lines(worker, RECEIVED), deployment.services.tail(worker)
        assert deployment.services.lines(worker, rf"celery@dp-it-{worker} ready"), deployment.services.tail(worker)


def test_broker_keys_are_under_the_session_prefix(deployment, broker):
    """Celery's queue bindings on Redis are under the session's prefix (kombu's ``global_keyprefix``), so parallel
    sessions on one Redis server and database never share a queue."""
    assert f"{broker.prefix}_kombu.binding.default" in broker.keys(), broker.keys()


@pytest.mark.parametrize("run_id", [pytest.param(run, id=run) for run in KILLED_RUNS])
def test_killed_release_is_retried_and_charged_once_more(deployment, run_id):
    """(b): the dead try's charge is abandoned and still spent; try 2 commits once, publishes once."""
    check_killed_release(deployment, run_id)
    if "worker" in KILLED_RUNS[run_id]:
        worker = deployment.killed_workers[run_id]
        assert len(deployment.services.lines(worker, rf"celery@dp-it-{worker} ready")) == 2, (
            f"{worker} was not started again after its kill\n{deployment.services.tail(worker)}"
        )


@pytest.mark.parametrize("run_id", [pytest.param(run, id=run) for run in KILLED_RUNS])
def test_try_meeting_a_live_lease_waits_without_spending_a_try(deployment, run_id):
    """(c): try 2 is rescheduled to the dead try's lease end, then takes the release over as try 2."""
    check_lease_wait(deployment, run_id)


def test_killed_releases_spend_two_charges_each(deployment):
    account = deployment.ledger.account("it_retry")
    assert account.spent == 2 * len(KILLED_RUNS) * plan_charge("killed_release.yaml")
    assert account.reserved == 0


def test_ledger_verifies_after_the_race_and_the_kills(deployment):
    check_ledger_verifies(deployment, ["it_race", "it_retry"])
