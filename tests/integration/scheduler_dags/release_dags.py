"""DAGs of the real-scheduler integration tests (tests/integration/test_scheduler.py on the LocalExecutor,
test_celery.py on the CeleryExecutor); not examples to copy.

``it_budget_race``: count people by sex in UCI Adult, release the counts with ``DPReleaseOperator``. The test
triggers eight runs at once against an account whose cap fits five of them.

``it_killed_release``: the same, but the release's first try reserves its charge and draws its noise as the
operator does, then stalls before the ledger commit, after writing its pid (and its supervisor's) for the test to
SIGKILL. Later tries are the operator's own, unchanged.

``it_publish_retry``: the release's first try commits in the ledger, then its file sink fails (a directory stands
where the JSON file goes), so the try fails after the commit and announces nothing; the retry replays the release.

Environment (set by the test for every Airflow service):
    DP_IT_ADULT_CSV: the UCI Adult table.
    DP_IT_OUTPUT_URI: the folder releases are published to.
    DP_IT_PID_DIR: where a stalled first try writes ``<run_id>.reservation.json`` (its reservation, for the test to
        keep its lease alive as the dead try's lease keeper would have), then ``<run_id>.pid``
        (``<task pid> <supervisor pid>``).
    DP_IT_LEASE_SECONDS: the stalled try's ledger lease, seconds (short, so that a retry can take over soon).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pendulum

from airflow.sdk import dag, task
from dp_operators.hooks.ledger import DPLedgerHook
from dp_operators.ledger import Ledger, ReleaseKey, Reservation
from dp_operators.operators.locations import release_file
from dp_operators.operators.release import DPReleaseOperator, PublishedRelease
from dp_operators.release import run_release

HERE = Path(__file__).resolve().parent


def count_people_by_sex(csv_path: str) -> dict[str, Any]:
    """True counts of UCI Adult by sex, shaped as the specs' ``people_by_sex`` aggregate expects."""
    import pandas as pd

    counts = pd.read_csv(csv_path, usecols=["sex"], skipinitialspace=True)["sex"].value_counts()
    return {"people_by_sex": [{"sex": sex, "count": int(count)} for sex, count in counts.items()]}


class StallingLedger(Ledger):
    """A spender's ledger whose :meth:`commit` never returns: it writes its reservation (with the token that renews
    its lease) beside ``pid_file``, then ``<task pid> <supervisor pid>`` to ``pid_file``, and sleeps, so the
    reservation stays ``reserved`` (noise drawn, nothing committed) until the test kills the process and the lease
    expires."""

    def __init__(self, *args: Any, pid_file: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pid_file = pid_file

    def commit(self, reservation: Reservation, output: dict, **kwargs: Any) -> str:
        held = {"charge_id": reservation.charge_id, "key": list(astuple(reservation.key)),
                "account": reservation.account, "amount": str(reservation.amount), "attempt": reservation.attempt,
                "delta": str(reservation.delta), "token": reservation.token}
        _write_atomically(self.pid_file.with_suffix(".reservation.json"), json.dumps(held))
        _write_atomically(self.pid_file, f"{os.getpid()} {os.getppid()}\n")  # last: the test reads both then
        while True:
            time.sleep(60)


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.rename(path)  # the test never reads half a file


class ReleaseKilledOnFirstTry(DPReleaseOperator):
    """``DPReleaseOperator`` whose first try runs the release engine on a :class:`StallingLedger` (short lease):
    reserved, noised, never committed. Tries 2 and later are the operator's own ``execute``."""

    def execute(self, context: Any) -> dict[str, Any]:
        ti = context["ti"]
        if ti.try_number > 1:
            return super().execute(context)
        hook = DPLedgerHook(ledger_conn_id=self.ledger_conn_id)
        ledger = StallingLedger(
            hook.get_url(),
            audit_key=hook.get_audit_key(),
            lease_seconds=float(os.environ["DP_IT_LEASE_SECONDS"]),
            pid_file=Path(os.environ["DP_IT_PID_DIR"]) / f"{ti.run_id}.pid",
        )
        key = ReleaseKey(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            map_index=-1 if ti.map_index is None else ti.map_index,
            release_name=self.release_spec.release,
        )
        run_release(
            self.release_spec,
            lambda: self.read_aggregates(context),
            ledger,
            key,
            spec_hash=self.spec_sha256,
            try_number=ti.try_number,
        )
        raise AssertionError("unreachable: the stalled commit never returns")


class ReleaseUnpublishedOnFirstTry(DPReleaseOperator):
    """``DPReleaseOperator`` whose file sink fails on the first try, after the ledger committed the release: a
    directory is made where the JSON file goes, so writing it raises ``IsADirectoryError``, which the operator turns
    into its retryable "committed in the ledger but publishing it failed". Later tries remove the directory first;
    the rest is the operator's own."""

    def _publish(self, output: dict[str, Any], key: ReleaseKey, replayed: bool, ti: Any) -> PublishedRelease:
        blocker = Path(release_file(self.output_uri, key, "json").path)
        if ti.try_number == 1:
            blocker.mkdir(parents=True)
        elif blocker.is_dir():
            blocker.rmdir()
        return super()._publish(output, key, replayed, ti)


def release_dag(dag_id: str, spec: str, operator: type[DPReleaseOperator], **release_args: Any) -> None:
    """Register the DAG ``dag_id``: ``count_people`` >> ``release`` (``operator`` on ``spec``)."""

    @dag(
        dag_id=dag_id,
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=8,
        tags=["dp-operators-integration-test"],
    )
    def release_pipeline() -> None:
        @task(show_return_value_in_logs=False)
        def count_people() -> dict[str, Any]:
            return count_people_by_sex(os.environ["DP_IT_ADULT_CSV"])

        count_people() >> operator(
            task_id="release",
            spec_path=HERE / spec,
            aggregates_task_id="count_people",
            output_uri=os.environ.get("DP_IT_OUTPUT_URI", "file:///tmp/dp-it-releases"),
            ledger_conn_id="dp_ledger_default",
            **release_args,
        )

    release_pipeline()


# retries: a budget refusal must fail at once whatever the retries (AirflowFailException)
release_dag("it_budget_race", "budget_race.yaml", DPReleaseOperator, retries=2)
# one retry, sooner than the dead try's lease ends: it meets the live lease and waits for it (rescheduled, no try
# spent, however often), then takes the release over
release_dag(
    "it_killed_release",
    "killed_release.yaml",
    ReleaseKilledOnFirstTry,
    retries=1,
    retry_delay=pendulum.duration(seconds=4),
)
# one retry, soon: the retry replays the committed release (charging nothing) and announces it once
release_dag(
    "it_publish_retry",
    "publish_retry.yaml",
    ReleaseUnpublishedOnFirstTry,
    retries=1,
    retry_delay=pendulum.duration(seconds=2),
)
