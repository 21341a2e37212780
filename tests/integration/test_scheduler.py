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
    its keeper thread would have, until a later try was refused for it: tries while the lease is live are refused
    with the retryable lease error and charged nothing, however slowly a loaded machine starts them; once the lease
    runs out a later try takes the release over. The ledger
    keeps the dead attempt's charge (``abandoned``, still spent) and one committed charge; one JSON is published and
    it is the ledger's committed output; the take-over announced it once.
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
import re
import time
from fractions import Fraction

import httpx
import pytest

from dp_operators.ledger import BudgetExhaustedError, ReleaseKey
from dp_operators.operators.release import default_asset

from airflow_services import AirflowServices, PostgresScratch, free_port, wait_for, wait_while_progressing
from scheduler_deployment import (
    FITTING, IDLE_LIMIT, KILLED_DAG, KILLED_RUNS, LEASE_HELD, PUBLISH_DAG, PUBLISH_RUN, RACE_DAG, RACE_RUNS, RELEASES,
    REPLAYED, Deployment, airflow_env, ledger_config, plan_charge,
)
from support import GOVERNOR_KEY, SPEND_KEY

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, adult_csv):
    """Set up, start Airflow, trigger every run, kill the stalled first tries, clear two succeeded releases, wait
    until every run finished (again)."""
    started = time.monotonic()
    home = tmp_path_factory.mktemp("airflow_scheduler")
    (home / "pids").mkdir()
    with PostgresScratch.session() as pg:
        metadata_db, ledger_db = pg.create_database("airflow"), pg.create_database("ledger")
        spender, governor = pg.create_role("spender", login=False), pg.create_role("governor", login=False)
        worker = pg.create_role("worker", login=True, member_of=spender)
        officer = pg.create_role("officer", login=True, member_of=governor)
        api_port = free_port()
        env = airflow_env(home, pg.url(metadata_db, driver="psycopg2"), pg.url(ledger_db, worker), api_port, adult_csv)
        env.update(DP_LEDGER_GOVERNOR_KEY=GOVERNOR_KEY.text, DP_LEDGER_AUDIT_KEY=SPEND_KEY.text)
        services = AirflowServices(env, home)
        deployment = Deployment(home, services, pg.dsn(metadata_db), pg.url(ledger_db), pg.url(ledger_db, officer),
                                f"http://127.0.0.1:{api_port}")
        try:
            config = home / "ledgers.yaml"
            config.write_text(ledger_config())
            migrate = services.start("db-migrate", "airflow", "db", "migrate")
            services.run("dpctl", "ledger", "init", "--url", pg.url(ledger_db))
            services.run("dpctl", "ledger", "roles", "--url", pg.url(ledger_db), "--spender-role", spender,
                         "--governor-role", governor, "--execute")
            services.run("dpctl", "ledger", "apply", str(config), "--url", pg.url(ledger_db, officer))
            assert migrate.wait(timeout=900) == 0, services.tail("db-migrate")  # only bounds a hang
            del services.processes["db-migrate"]
            TIMINGS["setup (databases, roles, migrate, ledger)"] = time.monotonic() - started
            # starting the services and parsing the DAGs imports Airflow as the setup did: a loaded machine slows both
            parse_limit = max(120.0, 2 * TIMINGS["setup (databases, roles, migrate, ledger)"])

            services.start("api-server", "airflow", "api-server", "--host", "127.0.0.1", "--port", str(api_port))
            services.start("scheduler", "airflow", "scheduler")
            services.start("dag-processor", "airflow", "dag-processor")
            for dag_id in (RACE_DAG, KILLED_DAG, PUBLISH_DAG):
                wait_for(lambda: services.check_alive() or httpx.get(f"{deployment.api}/api/v2/dags/{dag_id}",
                                                                     timeout=5).status_code == 200,
                         timeout=parse_limit, what=f"DAG {dag_id} to be parsed and served",
                         retry_on=(httpx.HTTPError,))
            TIMINGS["services up, DAGs parsed"] = time.monotonic() - started
            for run_id in KILLED_RUNS:
                deployment.trigger(KILLED_DAG, run_id)
            deployment.trigger(PUBLISH_DAG, PUBLISH_RUN)
            for run_id in RACE_RUNS:
                deployment.trigger(RACE_DAG, run_id)
            runs_started = time.monotonic()
            try:
                wait_while_progressing(deployment.finished, lambda: deployment.progress, idle=IDLE_LIMIT,
                                       what="every DAG run to finish")
            finally:
                deployment.read_tries()
            TIMINGS["runs (trigger to all finished, clears rerun)"] = time.monotonic() - runs_started
            TIMINGS["clears (first clear to all finished)"] = time.monotonic() - min(
                (before.at for before in deployment.cleared.values()), default=time.monotonic())
            yield deployment
        except Exception:
            print(services.tails(120))
            for (dag_id, run_id), state in deployment.run_states.items():
                if state not in ("success", "failed"):
                    print(f"run {dag_id} {run_id} is {state}\n{deployment.explain(dag_id, run_id)}")
            raise
        finally:
            services.stop_all()
            TIMINGS["total"] = time.monotonic() - started
            print(f"\ntimings (s): { {name: round(value, 1) for name, value in TIMINGS.items()} }")


def test_budget_race_commits_exactly_the_releases_the_cap_fits(deployment):
    charge = plan_charge("budget_race.yaml")
    states = {run_id: deployment.run_states[(RACE_DAG, run_id)] for run_id in RACE_RUNS}
    succeeded = sorted(run for run, state in states.items() if state == "success")
    failed = sorted(run for run, state in states.items() if state == "failed")
    charges = list(deployment.ledger.charges(account="it_race"))
    committed = sorted(c["run_id"] for c in charges if c["state"] == "committed")
    # a release the ledger committed was published: Airflow must not report its task failed
    assert committed == succeeded, (
        f"the ledger committed the releases of {committed}; Airflow marks {succeeded} successful. The API "
        "server's errors:\n" + "\n".join(deployment.services.lines("api-server", "Error updating|Violation"))
    )
    assert len(succeeded) == FITTING and len(failed) == len(RACE_RUNS) - FITTING, (
        f"{states}\n{deployment.services.tails()}"
    )
    # what the ledger says once the cap is full: remaining 0, whichever runs won the race
    refusal = str(BudgetExhaustedError("it_race", "rho", charge, Fraction(0)))
    for run_id in failed:
        logs = deployment.task_logs(RACE_DAG, run_id)
        # a refusal is not retried: one try was refused, and it was the last. A try before it may have failed for a
        # transient reason a loaded machine gives (a task heartbeat missed, the API server slow to hand over the
        # upstream's XCom): that try charged nothing, as the ledger's charges below show.
        refused_tries = [number for number, text in logs.items() if refusal in text]
        assert refused_tries == [max(logs)], deployment.explain(RACE_DAG, run_id)
        assert deployment.published(RACE_DAG, run_id) == []

    spans = deployment.query(
        "SELECT start_date, end_date FROM task_instance WHERE dag_id = %s AND task_id = 'release'", RACE_DAG
    )
    concurrent = max(sum(start <= moment < end for start, end in spans) for moment, _ in spans)
    assert concurrent >= 2, f"the releases never ran at the same time: {spans}"
    refused = [e["run_id"] for e in deployment.ledger.events("it_race") if e["event"] == "refused"]
    assert sorted(refused) == failed

    assert sorted(c["run_id"] for c in charges) == succeeded
    assert {c["state"] for c in charges} == {"committed"}
    assert sum(Fraction(c["amount"]) for c in charges) == FITTING * charge
    account = deployment.ledger.account("it_race")
    assert account.spent == account.cap == FITTING * charge and account.reserved == 0
    for run_id in succeeded:
        [path] = deployment.published(RACE_DAG, run_id)
        stored = deployment.ledger.stored_output(ReleaseKey(RACE_DAG, run_id, "release", -1, RELEASES[RACE_DAG]))
        assert json.loads(path.read_text()) == stored
    # one asset event per committed release, none for a refused one (after the clear of scenario d too)
    release = RELEASES[RACE_DAG]
    events = sorted(event[:4] for event in deployment.asset_events(RACE_DAG))
    assert events == [(release, default_asset(release).uri, run_id, -1) for run_id in succeeded]


@pytest.mark.parametrize("run_id", [pytest.param(run, id=run) for run in KILLED_RUNS])
def test_killed_release_is_retried_and_charged_once_more(deployment, run_id):
    charge = plan_charge("killed_release.yaml")
    key = ReleaseKey(KILLED_DAG, run_id, "release", -1, RELEASES[KILLED_DAG])
    explanation = deployment.explain(KILLED_DAG, run_id)
    assert run_id in deployment.killed, f"the first try never stalled before its commit\n{explanation}"
    assert deployment.run_states[(KILLED_DAG, run_id)] == "success", explanation
    tries = deployment.tries[(KILLED_DAG, run_id, "release")]
    assert min(tries) == 1 and max(tries) >= 2 and tries[max(tries)] == "success", explanation

    charges = sorted(deployment.ledger.charges(dag_id=KILLED_DAG), key=lambda c: c["attempt"])
    charges = [c for c in charges if c["run_id"] == run_id]
    # the killed attempt stays spent (abandoned by the take-over), the retry is charged once and committed
    assert [(c["attempt"], c["state"], c["try_number"]) for c in charges] == [
        (1, "abandoned", 1), (2, "committed", charges[-1]["try_number"])
    ], explanation
    assert all(Fraction(c["amount"]) == charge for c in charges)
    abandoned = [json.loads(e["details"]) for e in deployment.ledger.events("it_retry")
                 if e["event"] == "abandoned" and e["run_id"] == run_id]
    assert len(abandoned) == 1 and "lease expired" in abandoned[0]["reason"], abandoned  # not reconcile: the retry
    [path] = deployment.published(KILLED_DAG, run_id)
    assert json.loads(path.read_text()) == deployment.ledger.stored_output(key)
    assert sorted(p.suffix for p in path.parent.iterdir()) == [".csv", ".json"]  # one file per format, no leftovers
    # the take-over committed a new release (not a replay): announced once
    assert [event[:4] for event in deployment.asset_events(KILLED_DAG, run_id)] == [
        (RELEASES[KILLED_DAG], default_asset(RELEASES[KILLED_DAG]).uri, run_id, -1)
    ], explanation

    logs = deployment.task_logs(KILLED_DAG, run_id)
    held = [number for number, text in logs.items() if re.search(LEASE_HELD, text)]
    # the next try after the kill meets the dead try's lease, kept alive until then: refused, charged nothing
    assert held and min(held) == 2, explanation
    if KILLED_RUNS[run_id] == ("task",):  # the supervisor reports the death at once
        assert "Process terminated by signal" in logs[1], explanation
    else:  # no supervisor left to report: the scheduler fails the try when its heartbeats stop
        assert deployment.services.lines(
            "scheduler", rf"Detected a task instance without a heartbeat.*'Run Id': '{run_id}'"
        ), explanation
    assert max(held, default=1) < charges[-1]["try_number"], explanation


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
    assert extra["location"] == f"file://{path}" and json.loads(path.read_text()) == output


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
    result = deployment.services.run("dpctl", "ledger", "verify", "--url", deployment.officer_url, check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert all(account in result.stdout for account in ("it_race", "it_retry", "it_publish"))
