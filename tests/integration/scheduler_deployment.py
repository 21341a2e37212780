"""The Airflow deployment of the real-scheduler tests, ``tests/integration/test_scheduler.py`` (LocalExecutor) and
``test_celery.py`` (CeleryExecutor): its DAG runs, environment, ledger accounts, the two executors' setups,
:func:`deployed`, which sets it all up and runs it, :class:`Deployment`, which drives the runs (SIGKILLs, clears) and
reads what the tests check, and the checks both tests make (import as ``from scheduler_deployment import ...``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import ClassVar, Protocol

import httpx
import psycopg

from dp_operators.ledger import BudgetExhaustedError, ChargeStateError, Ledger, ReleaseKey, Reservation
from dp_operators.operators.release import LEASE_WAIT_MARGIN, LEASE_WAIT_MIN, default_asset
from dp_operators.release import plan_release
from dp_operators.spec import load_spec

from airflow_services import (
    AirflowServices, PostgresScratch, RedisScratch, free_port, task_log_text, wait_for, wait_while_progressing,
)
from support import GOVERNOR_KEY, SPEND_KEY

DAGS = Path(__file__).with_name("scheduler_dags")
RACE_DAG, KILLED_DAG, PUBLISH_DAG = "it_budget_race", "it_killed_release", "it_publish_retry"
RACE_RUNS = [f"race_{i}" for i in range(8)]
FITTING = 5  # releases the race account's cap pays for
PUBLISH_RUN = "publish_fails_once"
#: What a deployment runs: (a) the budget race; (b) the killed releases, whose next try waits for the dead try's
#: lease; (c) the failed publication; (d) the clears of a succeeded race run and of the publish-retry run.
RACE, KILLED, PUBLISH, CLEARS = "race", "killed", "publish", "clears"
#: release name of each DAG's spec, the name of its asset (``default_asset``)
RELEASES = {RACE_DAG: "it_people_by_sex", KILLED_DAG: "it_people_by_sex_retried",
            PUBLISH_DAG: "it_people_by_sex_republished"}
#: The stalled try's ledger lease. The test keeps it alive until a later try met it (and was rescheduled), so its
#: length only sets how long that try waits before it takes the release over, whatever the machine's load.
LEASE_SECONDS = 30
HEARTBEAT_TIMEOUT = 20  # [scheduler] task_instance_heartbeat_timeout
#: What the run loop tolerates without any task instance changing state before it calls the deployment hung: the
#: longest quiet stretches of a healthy run are a heartbeat timeout and a lease running out, with tries starting
#: several times slower than on a quiet machine.
IDLE_LIMIT = 3 * (LEASE_SECONDS + HEARTBEAT_TIMEOUT)
#: what the operator logs when the release key was already committed
REPLAYED = "already committed for this task instance: replaying it"
#: what the operator logs when a live try of the same release holds its lease
LEASE_HELD = r"holds (the budget|its) lease"


def plan_charge(spec: str) -> Fraction:
    """The rho one release of ``spec`` is charged on a zCDP account, from its plan (public parameters only)."""
    return plan_release(load_spec(DAGS / spec), accountant="zcdp").charge("zcdp")


def ledger_config() -> str:
    """The ledger's accounts: ``it_race`` fits :data:`FITTING` releases; the others fit more than their DAG needs."""
    account = "    accountant: zcdp\n    delta: 1e-6\n    privacy_unit: person\n"
    caps = {"it_race": (FITTING * plan_charge("budget_race.yaml"), RACE_DAG),
            "it_retry": (10 * plan_charge("killed_release.yaml"), KILLED_DAG),
            "it_publish": (3 * plan_charge("publish_retry.yaml"), PUBLISH_DAG)}
    return "version: 1\naccounts:\n" + "".join(
        f"  {name}:\n{account}    cap: {cap}\n    allowed_dags: [{dag_id}]\n" for name, (cap, dag_id) in caps.items()
    )


class ExecutorSetup(Protocol):
    """How a deployment runs its tasks: the executor's environment, the workers it starts, what the test kills."""

    #: killed run -> what the test SIGKILLs once its first try stalls before its commit: ``task`` (the task
    #: process), ``supervisor`` (the process supervising it), ``worker`` (the Celery worker's process group, restarted
    #: at once; its tasks' own process groups are not in it)
    killed_runs: ClassVar[dict[str, tuple[str, ...]]]

    def env(self, metadata_dsn: str) -> dict[str, str]:
        """The executor's settings, for every service (``metadata_dsn``: libpq URL of Airflow's database)."""

    def start_workers(self, services: AirflowServices, home: Path) -> None:
        """Start the processes that run tasks, if the scheduler does not."""


class LocalExecutorSetup:
    """The LocalExecutor: the scheduler forks the processes that run the tasks (docs/deployment.md)."""

    # the task process only: its supervisor reports the death at once; or the task process and its supervisor:
    # nothing reports it, the scheduler finds the try by its missing heartbeats
    killed_runs: ClassVar = {"killed_task": ("task",), "killed_task_and_supervisor": ("task", "supervisor")}

    def env(self, metadata_dsn: str) -> dict[str, str]:
        return {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__CORE__PARALLELISM": "4"}

    def start_workers(self, services: AirflowServices, home: Path) -> None:
        """Nothing to start: the scheduler runs the tasks."""


@dataclass(frozen=True)
class CeleryExecutorSetup:
    """The CeleryExecutor on a Redis broker (its keys under the session's prefix), the results in Airflow's metadata
    database, and :attr:`workers` ``airflow celery worker`` processes on this machine, each with its own Celery
    hostname, pid file and log-server port (docs/deploy-celery.md)."""

    broker: RedisScratch
    concurrency: int = 2  # task slots per worker
    workers: ClassVar[tuple[str, ...]] = ("worker-1", "worker-2")
    # the task process only: its supervisor (in the worker's pool process) reports the death at once; or the task
    # process and its whole worker, as when the worker's machine is lost: nothing reports it, the scheduler finds the
    # try by its missing heartbeats. (The task runs in a process group of its own, so killing the worker's group
    # alone would leave it running.)
    killed_runs: ClassVar = {"killed_task": ("task",), "killed_worker": ("task", "worker")}

    def env(self, metadata_dsn: str) -> dict[str, str]:
        return {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(len(self.workers) * self.concurrency),
            "AIRFLOW__CELERY__BROKER_URL": self.broker.url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{metadata_dsn}",
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__GLOBAL_KEYPREFIX": self.broker.prefix,
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
        }

    def start_workers(self, services: AirflowServices, home: Path) -> None:
        """Start the workers in the foreground, as a service manager would (so Airflow writes no pid file: it does
        only with ``-D``; the flag is given as docs/deploy-celery.md gives it)."""
        for name in self.workers:
            services.start(name, "airflow", "celery", "worker", "--celery-hostname", f"dp-it-{name}",
                           "--pid", str(home / f"{name}.pid"), "--concurrency", str(self.concurrency),
                           env={"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())})


def airflow_env(home: Path, metadata_url: str, ledger_url: str, api_port: int, adult_csv: Path,
                executor_env: dict[str, str]) -> dict[str, str]:
    """The services' environment: what docs/deployment.md sets, with short intervals so the test runs fast."""
    secret = secrets.token_urlsafe(32)
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW")}
    return {
        **inherited,
        **executor_env,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # the test's REST calls need no login
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secret,
        "AIRFLOW__API_AUTH__JWT_SECRET": secret,  # the scheduler signs the workers' tokens, the api-server checks
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW_CONN_DP_LEDGER_DEFAULT": json.dumps(
            {"conn_type": "dp_ledger", "extra": {"url": ledger_url, "audit_key": SPEND_KEY.text}}
        ),
        "DP_IT_ADULT_CSV": str(adult_csv),
        "DP_IT_OUTPUT_URI": f"file://{home / 'releases'}",
        "DP_IT_PID_DIR": str(home / "pids"),
        "DP_IT_LEASE_SECONDS": str(LEASE_SECONDS),
    }


@dataclass(frozen=True)
class Cleared:
    """A succeeded release task the test cleared (scenario d), and what was true just before."""

    try_number: int
    charges: list[dict]  # the ledger's charges of the run
    asset_events: list[tuple]  # :meth:`Deployment.asset_events` of the run
    published: bytes  # the JSON file's bytes
    at: float  # monotonic time of the clear


@dataclass(frozen=True)
class Reschedule:
    """One row of Airflow's ``task_reschedule`` table: a run of a try that ended ``up_for_reschedule``."""

    try_number: int
    start: dt.datetime
    end: dt.datetime
    reschedule_date: dt.datetime  # when the scheduler may run the same try again


class Deployment:
    """The running deployment and, once every run has finished, what the tests read."""

    def __init__(self, home: Path, services: AirflowServices, executor: ExecutorSetup, scenarios: frozenset[str],
                 metadata_dsn: str, ledger_url: str, officer_url: str, api: str):
        self.home, self.services, self.metadata_dsn, self.api = home, services, metadata_dsn, api
        self.executor, self.scenarios = executor, scenarios
        self.ledger = Ledger(ledger_url)  # read-only use, as the tables' owner
        # renews a killed try's lease, as that try's keeper thread would have, had it lived
        self.lease_keeper = Ledger(ledger_url, audit_key=SPEND_KEY, lease_seconds=LEASE_SECONDS)
        self.officer_url = officer_url
        self.killed_runs = executor.killed_runs if KILLED in scenarios else {}
        self.runs = [(KILLED_DAG, run_id) for run_id in self.killed_runs]
        self.runs += [(PUBLISH_DAG, PUBLISH_RUN)] if PUBLISH in scenarios else []
        self.runs += [(RACE_DAG, run_id) for run_id in RACE_RUNS] if RACE in scenarios else []
        self.triggered: set[tuple[str, str]] = set()
        self.killed: dict[str, float] = {}  # run id -> monotonic time of the SIGKILL
        self.killed_workers: dict[str, str] = {}  # run id -> the worker killed (and restarted) with its first try
        self.kept: dict[str, tuple[Reservation, float]] = {}  # run id -> (killed try's reservation, last renewal)
        self.lease_kept_until: dict[str, str] = {}  # run id -> why the test stopped renewing its lease
        self.progress: tuple = ()  # the task instances' (dag, run, task, map index, try, state), last seen
        self.cleared: dict[tuple[str, str], Cleared] = {}  # (dag id, run id) -> before the clear
        self.run_states: dict[tuple[str, str], str] = {}
        self.tries: dict[tuple[str, str, str], dict[int, str]] = {}

    def trigger(self, dag_id: str, run_id: str) -> None:
        response = httpx.post(f"{self.api}/api/v2/dags/{dag_id}/dagRuns",
                              json={"dag_run_id": run_id, "logical_date": None}, timeout=30)
        assert response.status_code == 200, response.text
        self.triggered.add((dag_id, run_id))

    def trigger_due_runs(self) -> None:
        """Trigger the runs that may start now: a killed run whose first try's worker is killed whole starts first
        and alone (killing a worker ends every task it runs), every other run once those were killed."""
        alone = [(KILLED_DAG, run_id) for run_id, targets in self.killed_runs.items() if "worker" in targets]
        others_due = all(run_id in self.killed for _, run_id in alone)
        for run in self.runs:
            if run not in self.triggered and (run in alone or others_due):
                self.trigger(*run)

    def query(self, sql: str, *params: object) -> list[tuple]:
        with psycopg.connect(self.metadata_dsn) as db:
            return db.execute(sql, params).fetchall()

    def kill_stalled_first_tries(self) -> None:
        """SIGKILL what each killed run names once its stalled first try's pid file appears (a killed worker is
        started again at once), and take over renewing the try's lease (:meth:`keep_leases`)."""
        for run_id, targets in self.killed_runs.items():
            pid_file = self.home / "pids" / f"{run_id}.pid"
            if run_id in self.killed or not pid_file.exists():
                continue
            held = json.loads(pid_file.with_suffix(".reservation.json").read_text())
            reservation = Reservation(
                charge_id=held["charge_id"], key=ReleaseKey(*held["key"]), account=held["account"],
                amount=Fraction(held["amount"]), attempt=held["attempt"], delta=Fraction(held["delta"]),
                token=held["token"])
            task_pid, supervisor_pid = map(int, pid_file.read_text().split())
            worker = self.services.group_of(supervisor_pid) if "worker" in targets else None
            if "worker" in targets and worker is None:
                raise RuntimeError(f"{run_id}: the first try's supervisor (pid {supervisor_pid}) is in no worker's "
                                   f"process group\n{self.services.tails()}")
            for target in targets:
                if target == "worker":
                    self.services.kill(worker)
                    self.services.restart(worker)
                    self.killed_workers[run_id] = worker
                else:
                    os.kill(task_pid if target == "task" else supervisor_pid, signal.SIGKILL)
            self.killed[run_id] = time.monotonic()
            self.kept[run_id] = (reservation, float("-inf"))
        self.keep_leases()

    def keep_leases(self) -> None:
        """Renew each killed try's lease every third of :data:`LEASE_SECONDS` until a later try of its run met it
        (and was rescheduled); from then on the lease runs out and that try, run again, takes the release over. How
        soon Airflow starts the next try depends on the machine's load; this way that try always meets a live
        lease."""
        for run_id, (reservation, renewed) in list(self.kept.items()):
            waited = [number for number, text in self.task_logs(KILLED_DAG, run_id).items()
                      if number > 1 and re.search(LEASE_HELD, text)]
            if waited:
                del self.kept[run_id]
                self.lease_kept_until[run_id] = f"try {min(waited)} met the lease"
            elif time.monotonic() - renewed >= LEASE_SECONDS / 3:
                try:
                    self.lease_keeper.renew(reservation)
                except ChargeStateError as error:  # the lease ran out first: the test's assertions will say so
                    del self.kept[run_id]
                    self.lease_kept_until[run_id] = f"renewal refused: {error}"
                    continue
                self.kept[run_id] = (reservation, time.monotonic())

    def release_try(self, dag_id: str, run_id: str) -> tuple[int, str]:
        """The release task instance's current try number and state."""
        [(try_number, state)] = self.query(
            "SELECT try_number, state FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = 'release'",
            dag_id, run_id,
        )
        return try_number, state

    def clear_release(self, dag_id: str, run_id: str) -> None:
        """Record what is true now, then clear the run's (succeeded) release task through the REST API, as a user
        re-running it would; the run is queued again."""
        [json_file] = self.published(dag_id, run_id)
        self.cleared[(dag_id, run_id)] = Cleared(
            try_number=self.release_try(dag_id, run_id)[0],
            charges=[c for c in self.ledger.charges(dag_id=dag_id) if c["run_id"] == run_id],
            asset_events=self.asset_events(dag_id, run_id),
            published=json_file.read_bytes(),
            at=time.monotonic(),
        )
        response = httpx.post(f"{self.api}/api/v2/dags/{dag_id}/clearTaskInstances", timeout=30, json={
            "dry_run": False, "dag_run_id": run_id, "task_ids": ["release"], "only_failed": False,
            "reset_dag_runs": True,
        })
        assert response.status_code == 200 and response.json()["total_entries"] == 1, response.text

    def clear_succeeded_releases(self) -> bool:
        """Scenario (d): clear the release of the first race run seen succeeded, and of the publish-retry run once
        it succeeded, once each. True when no clear was due now and every cleared task has a new try."""
        if CLEARS not in self.scenarios:
            return True
        race_won = [run for run in RACE_RUNS if self.run_states.get((RACE_DAG, run)) == "success"]
        targets = [(PUBLISH_DAG, PUBLISH_RUN), *((RACE_DAG, run) for run in race_won[:1])]
        due = [(dag_id, run_id) for dag_id, run_id in targets if self.run_states.get((dag_id, run_id)) == "success"
               and not any(cleared_dag == dag_id for cleared_dag, _ in self.cleared)]
        for dag_id, run_id in due:
            self.clear_release(dag_id, run_id)
        return not due and all(self.release_try(dag_id, run_id)[0] > before.try_number
                               for (dag_id, run_id), before in self.cleared.items())

    def finished(self) -> bool:
        """Drive the runs one step (kills, triggers, clears); True once every run was triggered and has finished,
        its release cleared and run again if it was a clear's target (a clear queues its run again)."""
        self.services.check_alive()
        self.kill_stalled_first_tries()
        self.trigger_due_runs()
        self.progress = tuple(self.query(
            "SELECT dag_id, run_id, task_id, map_index, try_number, state FROM task_instance "
            "ORDER BY dag_id, run_id, task_id, map_index"))
        rows = self.query("SELECT dag_id, run_id, state FROM dag_run")
        self.run_states = {(dag_id, run_id): state for dag_id, run_id, state in rows}
        cleared = self.clear_succeeded_releases()
        return cleared and len(rows) == len(self.runs) and all(
            state in ("success", "failed") for state in self.run_states.values()
        )

    def read_tries(self) -> None:
        rows = self.query(
            "SELECT dag_id, run_id, task_id, try_number, state FROM task_instance_history "
            "UNION ALL SELECT dag_id, run_id, task_id, try_number, state FROM task_instance"
        )
        for dag_id, run_id, task_id, try_number, state in rows:
            self.tries.setdefault((dag_id, run_id, task_id), {})[try_number] = state

    def reschedules(self, dag_id: str, run_id: str, task_id: str = "release") -> list[Reschedule]:
        """The task's ``task_reschedule`` rows, oldest first. Airflow keeps those of the current try only (it
        deletes them when the next try starts)."""
        return [Reschedule(*row) for row in self.query(
            "SELECT ti.try_number, r.start_date, r.end_date, r.reschedule_date FROM task_reschedule r "
            "JOIN task_instance ti ON ti.id = r.ti_id WHERE ti.dag_id = %s AND ti.run_id = %s AND ti.task_id = %s "
            "ORDER BY r.id", dag_id, run_id, task_id,
        )]

    def asset_events(self, dag_id: str, run_id: str | None = None) -> list[tuple]:
        """The asset events of ``dag_id``'s release tasks (of ``run_id`` only, if given) in Airflow's metadata
        database, whatever their asset: ``(asset name, asset uri, run id, map index, extra)`` by event id."""
        return [tuple(row) for row in self.query(
            "SELECT a.name, a.uri, e.source_run_id, e.source_map_index, e.extra::text FROM asset_event e "
            "JOIN asset a ON a.id = e.asset_id WHERE e.source_dag_id = %s AND e.source_task_id = 'release' "
            "AND (%s::text IS NULL OR e.source_run_id = %s) ORDER BY e.id",
            dag_id, run_id, run_id,
        )]

    def task_logs(self, dag_id: str, run_id: str, task_id: str = "release") -> dict[int, str]:
        """try number -> the text of that try's task log (every run of a rescheduled try appends to it)."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return {int(re.search(r"attempt=(\d+)", path.name).group(1)): task_log_text(path)
                for path in sorted(folder.glob("attempt=*.log"))}

    def explain(self, dag_id: str, run_id: str) -> str:
        """What a failing assertion prints: the services' log tails, the run's tries and its task logs."""
        logs = "\n".join(f"----- {dag_id} {run_id} release try {number} -----\n{text[-4000:]}"
                         for number, text in self.task_logs(dag_id, run_id).items())
        tries = {key: value for key, value in self.tries.items() if key[:2] == (dag_id, run_id)}
        kept = self.lease_kept_until.get(run_id, "never renewed by the test")
        return f"{self.services.tails()}\ntries: {tries}\nlease kept until: {kept}\n{logs}"

    def published(self, dag_id: str, run_id: str) -> list[Path]:
        """The JSON files under the output root whose release key is this run's (found by content: the layout is
        the operator's)."""
        found = []
        for path in (self.home / "releases").rglob("*.json"):
            if not path.is_file():
                continue
            key = json.loads(path.read_text()).get("release_key", {})
            if (key.get("dag_id"), key.get("run_id")) == (dag_id, run_id):
                found.append(path)
        return found


@contextmanager
def deployed(executor: ExecutorSetup, scenarios: frozenset[str], home: Path, adult_csv: Path,
             timings: dict[str, float]) -> Iterator[Deployment]:
    """Set the deployment up as docs/deployment.md describes (fresh PostgreSQL databases for Airflow and the ledger,
    the ledger's spender and governor roles, ``airflow db migrate``, the ledger's accounts), start the API server,
    scheduler, DAG processor and ``executor``'s workers, trigger the runs of ``scenarios``, kill the stalled first
    tries, clear succeeded releases, and wait until every run finished (again); yield the deployment, then stop it
    and drop the databases. How long each phase took goes into ``timings`` (seconds)."""
    started = time.monotonic()
    (home / "pids").mkdir()
    with PostgresScratch.session() as pg:
        metadata_db, ledger_db = pg.create_database("airflow"), pg.create_database("ledger")
        spender, governor = pg.create_role("spender", login=False), pg.create_role("governor", login=False)
        worker = pg.create_role("worker", login=True, member_of=spender)
        officer = pg.create_role("officer", login=True, member_of=governor)
        api_port = free_port()
        env = airflow_env(home, pg.url(metadata_db, driver="psycopg2"), pg.url(ledger_db, worker), api_port,
                          adult_csv, executor.env(pg.dsn(metadata_db)))
        env.update(DP_LEDGER_GOVERNOR_KEY=GOVERNOR_KEY.text, DP_LEDGER_AUDIT_KEY=SPEND_KEY.text)
        services = AirflowServices(env, home)
        deployment = Deployment(home, services, executor, scenarios, pg.dsn(metadata_db), pg.url(ledger_db),
                                pg.url(ledger_db, officer), f"http://127.0.0.1:{api_port}")
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
            timings["setup (databases, roles, migrate, ledger)"] = time.monotonic() - started
            # starting the services and parsing the DAGs imports Airflow as the setup did: a loaded machine slows both
            parse_limit = max(120.0, 2 * timings["setup (databases, roles, migrate, ledger)"])

            services.start("api-server", "airflow", "api-server", "--host", "127.0.0.1", "--port", str(api_port))
            services.start("scheduler", "airflow", "scheduler")
            services.start("dag-processor", "airflow", "dag-processor")
            executor.start_workers(services, home)
            for dag_id in (RACE_DAG, KILLED_DAG, PUBLISH_DAG):
                wait_for(lambda: services.check_alive() or httpx.get(f"{deployment.api}/api/v2/dags/{dag_id}",
                                                                     timeout=5).status_code == 200,
                         timeout=parse_limit, what=f"DAG {dag_id} to be parsed and served",
                         retry_on=(httpx.HTTPError,))
            timings["services up, DAGs parsed"] = time.monotonic() - started
            runs_started = time.monotonic()
            try:
                wait_while_progressing(deployment.finished, lambda: deployment.progress, idle=IDLE_LIMIT,
                                       what="every DAG run to finish")
            finally:
                deployment.read_tries()
            timings["runs (trigger to all finished, clears rerun)"] = time.monotonic() - runs_started
            if deployment.cleared:
                timings["clears (first clear to all finished)"] = time.monotonic() - min(
                    before.at for before in deployment.cleared.values())
            yield deployment
        except Exception:
            print(services.tails(120))
            for (dag_id, run_id), state in deployment.run_states.items():
                if state not in ("success", "failed"):
                    print(f"run {dag_id} {run_id} is {state}\n{deployment.explain(dag_id, run_id)}")
            raise
        finally:
            services.stop_all()
            timings["total"] = time.monotonic() - started
            print(f"\ntimings (s): { {name: round(value, 1) for name, value in timings.items()} }")


# The checks both tests make, one per scenario (the tests name the behaviour and call them).


def check_budget_race(deployment: Deployment) -> None:
    """(a) Of eight concurrent runs on a cap that fits five, exactly five commit, are published and announced; three
    are refused at once (no retry), charged nothing; the ledger spent exactly the cap."""
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
    # one asset event per committed release, none for a refused one (after a clear of scenario d too)
    release = RELEASES[RACE_DAG]
    events = sorted(event[:4] for event in deployment.asset_events(RACE_DAG))
    assert events == [(release, default_asset(release).uri, run_id, -1) for run_id in succeeded]


def check_killed_release(deployment: Deployment, run_id: str) -> None:
    """(b) A release whose first try was SIGKILLed after its reservation and noise ends with that try's charge
    abandoned (still spent), one committed charge (try 2's), one publication of the committed output, announced
    once; the death was seen the way its kill allows."""
    charge = plan_charge("killed_release.yaml")
    key = ReleaseKey(KILLED_DAG, run_id, "release", -1, RELEASES[KILLED_DAG])
    explanation = deployment.explain(KILLED_DAG, run_id)
    assert run_id in deployment.killed, f"the first try never stalled before its commit\n{explanation}"
    assert deployment.run_states[(KILLED_DAG, run_id)] == "success", explanation

    charges = sorted(deployment.ledger.charges(dag_id=KILLED_DAG), key=lambda c: c["attempt"])
    charges = [c for c in charges if c["run_id"] == run_id]
    # the killed attempt stays spent (abandoned by the take-over); try 2 is charged once and committed
    assert [(c["attempt"], c["state"], c["try_number"]) for c in charges] == [
        (1, "abandoned", 1), (2, "committed", 2)
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
    if deployment.killed_runs[run_id] == ("task",):  # the supervisor reports the death at once
        assert "Process terminated by signal" in logs[1], explanation
    else:  # no supervisor left to report: the scheduler fails the try when its heartbeats stop
        assert deployment.services.lines(
            "scheduler", rf"Detected a task instance without a heartbeat.*'Run Id': '{run_id}'"
        ), explanation


def check_lease_wait(deployment: Deployment, run_id: str) -> None:
    """(b, the wait) The try after the kill meets the dead try's live lease, kept alive until then, and waits for it
    instead of failing: Airflow reschedules it to the lease's end (``up_for_reschedule``, the same try number), one
    or more times, charging nothing; run again once the lease ran out, the same try takes the release over and
    succeeds. No try is spent on the lease."""
    explanation = deployment.explain(KILLED_DAG, run_id)
    tries = deployment.tries[(KILLED_DAG, run_id, "release")]
    assert sorted(tries) == [1, 2] and tries[2] == "success", explanation
    logs = deployment.task_logs(KILLED_DAG, run_id)
    assert not re.search(LEASE_HELD, logs[1]), explanation
    waits = len(re.findall(LEASE_HELD, logs[2]))
    reschedules = deployment.reschedules(KILLED_DAG, run_id)
    # each meeting with the lease is one run of try 2 that ended up_for_reschedule
    assert waits >= 1 and len(reschedules) == waits, f"{reschedules}\n{explanation}"
    assert {r.try_number for r in reschedules} == {2}
    for r in reschedules:
        # to the lease's end plus a margin: at least the minimum wait from when the try computed it (half of it from
        # when the try ended, on a loaded machine), at most a lease away
        wait = r.reschedule_date - r.end
        assert LEASE_WAIT_MIN / 2 <= wait <= dt.timedelta(seconds=LEASE_SECONDS) + LEASE_WAIT_MARGIN, r
    [(start, end)] = deployment.query(
        "SELECT start_date, end_date FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = 'release'",
        KILLED_DAG, run_id,
    )
    # the run that took the release over started no sooner than the last reschedule date
    assert end >= reschedules[-1].reschedule_date, (start, end, reschedules)
    after_last_wait = logs[2][logs[2].rindex("holds the budget lease"):]
    assert "published release" in after_last_wait and REPLAYED not in logs[2], explanation


def check_ledger_verifies(deployment: Deployment, accounts: list[str]) -> None:
    """``dpctl ledger verify``, as the officer, passes and covers ``accounts``."""
    result = deployment.services.run("dpctl", "ledger", "verify", "--url", deployment.officer_url, check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert all(account in result.stdout for account in accounts)
