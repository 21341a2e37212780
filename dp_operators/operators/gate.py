"""``DPBudgetGateOperator``: skip the rest of a DAG run when a release's charge no longer fits its budget account.

A DAG puts the gate before the tasks that compute expensive aggregates::

    gate = DPBudgetGateOperator(task_id="budget_gate", spec_path=SPEC, release_task_id="release")
    gate >> compute_aggregates >> release

The gate reads the spec and the ledger account (public parameters only: the plan's charge, the account's cap,
spent, reserved and allowlist; never data), spends nothing and reserves nothing. It is Airflow's
``ShortCircuitOperator``: when the charge does not fit, the downstream tasks are skipped exactly as that operator
skips them (``ignore_downstream_trigger_rules``). The answer is advice: another release may spend from the account
between the gate and the release, whose own reservation stays the only authority.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from sqlalchemy.exc import SQLAlchemyError

from dp_operators.accounting import IncompatibleAccountantError
from dp_operators.hooks.ledger import DPLedgerHook
from dp_operators.ledger import LedgerError, ReleaseKey
from dp_operators.release import ReleaseConfigError, plan_release
from dp_operators.release.budget_check import BudgetCheck, check_budget
from dp_operators.spec import ReleaseSpec, SpecError, load_spec_with_hash

if TYPE_CHECKING:
    from airflow.sdk import Context

#: XCom key of a task's return value (``BaseXCom.XCOM_RETURN_KEY``).
_RETURN_VALUE = "return_value"


class DPBudgetGateOperator(ShortCircuitOperator):
    """Continue the DAG run only if one run of a release spec still fits its budget account.

    The spec is read, validated and planned when the DAG is parsed (a bad spec fails the DAG import with the file,
    the field path and the reason, as :class:`~dp_operators.operators.release.DPReleaseOperator` does). At run time
    the gate computes the charge the release will reserve and compares it with the account's remaining budget
    exactly as the ledger's reservation does (:func:`~dp_operators.release.budget_check.check_budget`): "fits"
    means the reservation would succeed now, "does not fit" that it would be refused with
    :class:`~dp_operators.ledger.BudgetExhaustedError`.

    Args:
        spec_path: path of the release spec YAML (the one the release task uses).
        ledger_conn_id: Airflow connection of the budget ledger (see :class:`DPLedgerHook`); read only, no spend
            key needed.
        release_task_id: optional: the release task of this DAG. When given and that task instance's release is
            already committed in the ledger (a cleared and rerun DAG run), the gate lets the run through: the
            release replays its stored output and spends nothing. Its map index is taken to be the gate's own
            (both in the same mapped task group, or neither mapped).
        ignore_downstream_trigger_rules: ``ShortCircuitOperator``'s: True (default) skips every downstream task;
            False skips the direct downstream tasks and lets the others' trigger rules decide.
        kwargs: ``BaseOperator``'s.

    Returns (XCom ``return_value``, pushed also when the downstream tasks are skipped):
        ``{"fits": bool, "reason": str, "release": str, "account": str, "unit": str, "charge": float,
        "charge_exact": str, "remaining": float, "remaining_exact": str, "delta_charge", "delta_charge_exact",
        "delta_remaining", "delta_remaining_exact"}`` (:meth:`BudgetCheck.as_dict`): ``reason`` is ``fits``,
        ``budget_exhausted``, ``delta_exhausted`` (``approx_dp`` accounts; the ``delta_*`` amounts are None on
        other accounts) or ``replay``. The decision is logged with the same public numbers.

    Raises:
        AirflowFailException: configuration errors, which fail the task instead of skipping the run (a skip would
            look like an ordinary exhausted budget and hide them): the account is not in the ledger, the DAG is
            not in its ``allowed_dags``, the account is for another privacy unit, a mechanism the account's
            accountant cannot charge, the ledger has no schema. The message says what to fix.
        AirflowException: retryable: the ledger's database failed.
    """

    ui_color = "#fde8e8"
    # python_callable is this operator's own method: a deep copy of the operator must bind it to the copy
    shallow_copy_attrs = ("op_kwargs",)

    def __init__(
        self,
        *,
        spec_path: str | Path,
        ledger_conn_id: str = DPLedgerHook.default_conn_name,
        release_task_id: str | None = None,
        ignore_downstream_trigger_rules: bool = True,
        **kwargs: Any,
    ) -> None:
        self.spec_path = str(spec_path)
        self.release_spec, self.spec_sha256 = load_planned_spec(self.spec_path)
        super().__init__(
            python_callable=self.decide,
            ignore_downstream_trigger_rules=ignore_downstream_trigger_rules,
            **kwargs,
        )
        self.ledger_conn_id = ledger_conn_id
        self.release_task_id = release_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        # ShortCircuitOperator calls decide() and skips the downstream tasks when its answer is falsy
        check: BudgetCheck = super().execute(context)
        return check.as_dict()

    def decide(self, ti: Any) -> BudgetCheck:
        """The gate's condition (``ShortCircuitOperator``'s ``python_callable``): the budget check of this task
        instance's DAG, logged, and pushed to XCom when it does not fit (Airflow 3 skips the downstream tasks by
        raising from ``execute``, before the task's return value would be pushed)."""
        release_key = None
        if self.release_task_id is not None:
            release_key = ReleaseKey(
                dag_id=ti.dag_id,
                run_id=ti.run_id,
                task_id=self.release_task_id,
                map_index=-1 if ti.map_index is None else ti.map_index,
                release_name=self.release_spec.release,
            )
        ledger = DPLedgerHook(ledger_conn_id=self.ledger_conn_id).get_ledger()
        try:
            check = check_budget(self.release_spec, ledger, ti.dag_id, release_key=release_key,
                                 windows=_windows(self.release_spec, ledger))
        except (LedgerError, ReleaseConfigError, IncompatibleAccountantError) as error:
            raise AirflowFailException(str(error)) from None
        except SQLAlchemyError as error:  # the ledger's database: retryable, and its text holds no data values
            raise AirflowException(f"the budget ledger failed: {type(error).__name__}: {error}") from None
        self.log.info("budget gate: %s", check)
        if not check and self.do_xcom_push:
            ti.xcom_push(key=_RETURN_VALUE, value=check.as_dict())
        return check


def _windows(spec: ReleaseSpec, ledger: Any) -> list[str] | None:
    """The windows a release of ``spec`` in this task's DAG run reads, on an account with privacy blocks (from the
    run's data interval or partition key, as the release operator takes them)."""
    from airflow.sdk import get_current_context

    from dp_operators.operators.release import _data_interval, _partition_key
    from dp_operators.release.run import block_windows

    if ledger.structure(spec.budget_account)[0] != "blocks":
        return block_windows(spec, ledger)  # None (or the refusal of a lookback on an account without blocks)
    context = get_current_context()
    return block_windows(spec, ledger, data_interval=_data_interval(context), partition_key=_partition_key(context))


def load_planned_spec(spec_path: str) -> tuple[ReleaseSpec, str]:
    """The validated spec at ``spec_path`` and the SHA-256 of its text, after the public checks of its plan (float
    grid, saturation, noise range, consistent families' noise variances), so that a spec that cannot be released
    fails the DAG import.

    Raises:
        SpecError: the spec is unreadable or invalid (file, field path, reason), or cannot be planned.
    """
    spec, digest = load_spec_with_hash(spec_path)
    if spec.series is not None:  # planned step by step (dp_operators.continual.run); checked here as every run will
        from dp_operators.continual.checks import check_releasable

        try:
            check_releasable(spec)
        except ReleaseConfigError as error:
            raise SpecError(f"{spec_path}: the spec cannot be planned: {error}") from None
        return spec, digest
    try:
        plan = plan_release(spec)
        if spec.postprocess.consistent:  # a family every run would refuse fails the import (no scipy needed here)
            from dp_operators.release.consistent import check_families

            check_families(plan)
    except ReleaseConfigError as error:
        raise SpecError(f"{spec_path}: the spec cannot be planned: {error}") from None
    return spec, digest
