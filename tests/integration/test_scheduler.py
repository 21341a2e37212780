"""DPReleaseOperator under Airflow's real scheduler: LocalExecutor, PostgreSQL, concurrent runs, a killed task, a
failed publication, a cleared task.

One Airflow deployment per module, set up as docs/deployment.md describes: Airflow's metadata database and the ledger
on PostgreSQL (fresh databases, dropped at the end), the ledger's spender and governor roles (``dpctl ledger
roles``), ``airflow scheduler``, ``airflow dag-processor`` and ``airflow api-server`` as subprocesses, the DAGs of
``scheduler_dags/`` (the deployment: ``scheduler_deployment.py``). Every run is triggered at once through the REST
API, then:

(a) ``it_budget_race``: eight concurrent runs against an account whose cap fits exactly five releases. Exactly five
    succeed; three fail at once (no retry) with the ledger's budget refusal; the ledger spent exactly the cap;
    Airflow holds one asset event per release committed.
(b) ``it_killed_release``: the release's first try reserves and draws its noise, then stalls before the commit and
    is SIGKILLed: its task process only (Airflow's supervisor reports the death), or its task process and the
    supervisor (the scheduler finds the task by its heartbeat timeout). The test renews the dead try's lease, as
    its keeper thread would have, until try 2 met it: try 2 waits for the lease instead of failing (rescheduled to
    the lease's end, ``up_for_reschedule``, the same try number, charged nothing, however slowly a loaded machine
    starts it), then takes the release over once the lease ran out and succeeds as try 2. The ledger keeps the dead
    attempt's charge (``abandoned``, still spent) and one committed charge; one JSON is published and it is the
    ledger's committed output; the take-over announced it once.
(c) ``it_publish_retry``: the release's first try commits in the ledger, then its file sink fails, so the try fails
    having announced nothing. The retry replays the release (nothing charged), publishes the ledger's output and,
    as no earlier try announced it, adds its one asset event.
(d) Once they succeeded, the release task of a race run and of the publish-retry run are cleared through the REST
    API, as a user re-running them would: each reruns as a replay, charges nothing, leaves the published bytes
    unchanged and adds no asset event.
``dpctl ledger verify`` passes afterwards.
"""

from __future__ import annotations

import json

import pytest

from dp_operators.ledger import ReleaseKey
from dp_operators.operators.release import default_asset

from scheduler_deployment import (
    CLEARS, KILLED, PUBLISH, PUBLISH_DAG, PUBLISH_RUN, RACE, RACE_DAG, RELEASES, REPLAYED, LocalExecutorSetup,
    check_budget_race, check_killed_release, check_lease_wait, check_ledger_verifies, deployed, plan_charge,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLED_RUNS = LocalExecutorSetup.killed_runs
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, adult_csv):
    """Set up, start Airflow on the LocalExecutor, trigger every run, kill the stalled first tries, clear two
    succeeded releases, wait until every run finished (again)."""
    with deployed(LocalExecutorSetup(), frozenset({RACE, KILLED, PUBLISH, CLEARS}),
                  tmp_path_factory.mktemp("airflow_scheduler"), adult_csv, TIMINGS) as running:
        yield running


def test_budget_race_commits_exactly_the_releases_the_cap_fits(deployment):
    """(a): five of eight concurrent runs commit, three are refused at once; the ledger spent exactly the cap."""
    check_budget_race(deployment)


@pytest.mark.parametrize("run_id", [pytest.param(run, id=run) for run in KILLED_RUNS])
def test_killed_release_is_retried_and_charged_once_more(deployment, run_id):
    """(b): the dead try's charge is abandoned and still spent; try 2 commits once, publishes once."""
    check_killed_release(deployment, run_id)


@pytest.mark.parametrize("run_id", [pytest.param(run, id=run) for run in KILLED_RUNS])
def test_try_meeting_a_live_lease_waits_without_spending_a_try(deployment, run_id):
    """(b): try 2 is rescheduled to the dead try's lease end, then takes the release over as try 2."""
    check_lease_wait(deployment, run_id)


def test_killed_releases_spend_two_charges_each(deployment):
    account = deployment.ledger.account("it_retry")
    assert account.spent == 2 * len(KILLED_RUNS) * plan_charge("killed_release.yaml")
    assert account.reserved == 0


def test_release_committed_then_unpublished_is_replayed_and_announced_once(deployment):
    """(c): the first try commits, then fails to publish; the retry replays it, publishes it and announces it."""
    run_id, release = PUBLISH_RUN, RELEASES[PUBLISH_DAG]
    explanation = deployment.explain(PUBLISH_DAG, run_id)
    before_clear = deployment.cleared.get((PUBLISH_DAG, run_id))
    assert before_clear is not None, f"the run never succeeded\n{explanation}"
    assert before_clear.try_number == 2, explanation  # succeeded on its retry (then cleared: scenario d)
    logs = deployment.task_logs(PUBLISH_DAG, run_id)
    assert "is committed in the ledger but publishing it failed (IsADirectoryError" in logs[1], explanation
    assert REPLAYED in logs[2], explanation

    # committed by try 1; try 2 replayed it, charging nothing
    charges = [c for c in deployment.ledger.charges(dag_id=PUBLISH_DAG) if c["run_id"] == run_id]
    assert [(c["attempt"], c["state"], c["try_number"]) for c in charges] == [(1, "committed", 1)], explanation
    assert deployment.ledger.account("it_publish").spent == plan_charge("publish_retry.yaml")
    output = deployment.ledger.stored_output(ReleaseKey(PUBLISH_DAG, run_id, "release", -1, release))
    [path] = deployment.published(PUBLISH_DAG, run_id)
    assert json.loads(before_clear.published) == output

    # no try announced it before the retry: the retry did, once, with the committed release's public fields
    [(name, uri, event_run, map_index, extra)] = before_clear.asset_events
    assert (name, uri, event_run, map_index) == (release, default_asset(release).uri, run_id, -1)
    extra = json.loads(extra)
    assert extra["release_key"] == output["release_key"] and extra["charge"] == output["charge"]
    assert extra["location"] == path.as_uri() and json.loads(path.read_text()) == output  # the folders' "%" as "%25"


@pytest.mark.parametrize("dag_id", [RACE_DAG, PUBLISH_DAG])
def test_cleared_release_replays_without_a_second_event(deployment, dag_id):
    """(d): a cleared release task reruns as a replay: no charge, the same bytes, no asset event."""
    cleared = {run: before for (cleared_dag, run), before in deployment.cleared.items() if cleared_dag == dag_id}
    assert len(cleared) == 1, f"no succeeded run of {dag_id} was cleared: {deployment.run_states}"
    [(run_id, before)] = cleared.items()
    explanation = deployment.explain(dag_id, run_id)
    assert deployment.run_states[(dag_id, run_id)] == "success", explanation
    try_number, state = deployment.release_try(dag_id, run_id)
    assert (try_number, state) == (before.try_number + 1, "success"), explanation
    assert REPLAYED in deployment.task_logs(dag_id, run_id)[try_number], explanation

    assert [c for c in deployment.ledger.charges(dag_id=dag_id) if c["run_id"] == run_id] == before.charges
    assert len(before.asset_events) == 1, explanation
    assert deployment.asset_events(dag_id, run_id) == before.asset_events, explanation
    [path] = deployment.published(dag_id, run_id)
    assert path.read_bytes() == before.published


def test_ledger_verifies_after_the_race_and_the_kills(deployment):
    check_ledger_verifies(deployment, ["it_race", "it_retry", "it_publish"])
