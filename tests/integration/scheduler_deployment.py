"""The Airflow deployment of ``tests/integration/test_scheduler.py``: its DAG runs, environment, ledger accounts,
and :class:`Deployment`, which drives the runs (SIGKILLs, clears) and reads what the tests check (import as
``from scheduler_deployment import ...``)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import httpx
import psycopg

from dp_operators.ledger import ChargeStateError, Ledger, ReleaseKey, Reservation
from dp_operators.release import plan_release
from dp_operators.spec import load_spec

from airflow_services import AirflowServices, free_port, task_log_text
from support import SPEND_KEY

DAGS = Path(__file__).with_name("scheduler_dags")
RACE_DAG, KILLED_DAG, PUBLISH_DAG = "it_budget_race", "it_killed_release", "it_publish_retry"
RACE_RUNS = [f"race_{i}" for i in range(8)]
FITTING = 5  # releases the race account's cap pays for
#: killed run -> what the test SIGKILLs once the first try stalls before its commit
KILLED_RUNS = {"killed_task": ("task",), "killed_task_and_supervisor": ("task", "supervisor")}
PUBLISH_RUN = "publish_fails_once"
#: release name of each DAG's spec, the name of its asset (``default_asset``)
RELEASES = {RACE_DAG: "it_people_by_sex", KILLED_DAG: "it_people_by_sex_retried",
            PUBLISH_DAG: "it_people_by_sex_republished"}
#: The stalled try's ledger lease. The test keeps it alive until a later try was refused for it, so its length only
#: sets how long the take-over waits after that refusal, whatever the machine's load.
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


def airflow_env(home: Path, metadata_url: str, ledger_url: str, api_port: int, adult_csv: Path) -> dict[str, str]:
    """The services' environment: what docs/deployment.md sets, with short intervals so the test runs fast."""
    secret = secrets.token_urlsafe(32)
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW")}
    return {
        **inherited,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
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


class Deployment:
    """The running deployment and, once every run has finished, what the tests read."""

    def __init__(self, home: Path, services: AirflowServices, metadata_dsn: str, ledger_url: str,
                 officer_url: str, api: str):
        self.home, self.services, self.metadata_dsn, self.api = home, services, metadata_dsn, api
        self.ledger = Ledger(ledger_url)  # read-only use, as the tables' owner
        # renews a killed try's lease, as that try's keeper thread would have, had it lived
        self.lease_keeper = Ledger(ledger_url, audit_key=SPEND_KEY, lease_seconds=LEASE_SECONDS)
        self.officer_url = officer_url
        self.killed: dict[str, float] = {}  # run id -> monotonic time of the SIGKILL
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

    def query(self, sql: str, *params: object) -> list[tuple]:
        with psycopg.connect(self.metadata_dsn) as db:
            return db.execute(sql, params).fetchall()

    def kill_stalled_first_tries(self) -> None:
        """SIGKILL each killed run's stalled first try as soon as its pid file appears, and take over renewing its
        lease (:meth:`keep_leases`)."""
        for run_id, targets in KILLED_RUNS.items():
            pid_file = self.home / "pids" / f"{run_id}.pid"
            if run_id in self.killed or not pid_file.exists():
                continue
            held = json.loads(pid_file.with_suffix(".reservation.json").read_text())
            reservation = Reservation(
                charge_id=held["charge_id"], key=ReleaseKey(*held["key"]), account=held["account"],
                amount=Fraction(held["amount"]), attempt=held["attempt"], delta=Fraction(held["delta"]),
                token=held["token"])
            task_pid, supervisor_pid = map(int, pid_file.read_text().split())
            for target in targets:
                os.kill(task_pid if target == "task" else supervisor_pid, signal.SIGKILL)
            self.killed[run_id] = time.monotonic()
            self.kept[run_id] = (reservation, float("-inf"))
        self.keep_leases()

    def keep_leases(self) -> None:
        """Renew each killed try's lease every third of :data:`LEASE_SECONDS` until a later try of its run was
        refused for it; from then on the lease runs out and a later try takes the release over. How soon Airflow
        starts the next try depends on the machine's load; this way that try always meets a live lease."""
        for run_id, (reservation, renewed) in list(self.kept.items()):
            refused = [number for number, text in self.task_logs(KILLED_DAG, run_id).items()
                       if number > 1 and re.search(LEASE_HELD, text)]
            if refused:
                del self.kept[run_id]
                self.lease_kept_until[run_id] = f"try {min(refused)} was refused for the lease"
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
        race_won = [run for run in RACE_RUNS if self.run_states.get((RACE_DAG, run)) == "success"]
        targets = [(PUBLISH_DAG, PUBLISH_RUN), *((RACE_DAG, run) for run in race_won[:1])]
        due = [(dag_id, run_id) for dag_id, run_id in targets if self.run_states.get((dag_id, run_id)) == "success"
               and not any(cleared_dag == dag_id for cleared_dag, _ in self.cleared)]
        for dag_id, run_id in due:
            self.clear_release(dag_id, run_id)
        return not due and all(self.release_try(dag_id, run_id)[0] > before.try_number
                               for (dag_id, run_id), before in self.cleared.items())

    def finished(self) -> bool:
        """Drive the runs one step (kills, clears); True once every run has finished, its release cleared and run
        again if it was a clear's target (a clear queues its run again)."""
        self.services.check_alive()
        self.kill_stalled_first_tries()
        self.progress = tuple(self.query(
            "SELECT dag_id, run_id, task_id, map_index, try_number, state FROM task_instance "
            "ORDER BY dag_id, run_id, task_id, map_index"))
        rows = self.query("SELECT dag_id, run_id, state FROM dag_run")
        self.run_states = {(dag_id, run_id): state for dag_id, run_id, state in rows}
        cleared = self.clear_succeeded_releases()
        expected = len(RACE_RUNS) + len(KILLED_RUNS) + 1
        return cleared and len(rows) == expected and all(
            state in ("success", "failed") for state in self.run_states.values()
        )

    def read_tries(self) -> None:
        rows = self.query(
            "SELECT dag_id, run_id, task_id, try_number, state FROM task_instance_history "
            "UNION ALL SELECT dag_id, run_id, task_id, try_number, state FROM task_instance"
        )
        for dag_id, run_id, task_id, try_number, state in rows:
            self.tries.setdefault((dag_id, run_id, task_id), {})[try_number] = state

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
        """try number -> the text of that try's task log."""
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
