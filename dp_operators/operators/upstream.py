"""Pull the upstream task's return value for *this* task instance, mapped or not.

Airflow's ``ti.xcom_pull(task_ids=...)`` without ``map_indexes`` returns every map index of a mapped upstream (a
list), and the wrong one is easy to take. Which upstream instance belongs to a release task instance:

==============================================  ===========================================================
upstream                                        pulled
==============================================  ===========================================================
not mapped, in no mapped task group             its one value (also for every instance of an expanded release)
in a mapped task group the release is also in   the instance of the same group index (Airflow's own rule for
                                                ``XComArg``, ``get_relevant_upstream_map_indexes``)
``.expand()`` / ``.expand_kwargs()``            the same map index, when the release is mapped into as many
                                                instances (``.partial().expand()`` over the same input)
mapped otherwise                                refused: :class:`~airflow.sdk.exceptions.AirflowFailException`
                                                saying how the two are mapped
==============================================  ===========================================================

A missing value (the upstream returned ``None`` or nothing) is refused by the caller, never replaced by another
instance's value. A value the upstream wrapped with :func:`~dp_operators.operators.xcom_aggregates.aggregates_for_xcom`
(to carry NaN, infinities and exact decimals through XCom) is unwrapped here, so the caller sees what the upstream
task computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from dp_operators.operators.xcom_aggregates import XComAggregatesError, aggregates_from_xcom


def _mapped_group_id(task: Any) -> str | None:
    group = task.get_closest_mapped_task_group()
    return None if group is None else group.group_id


def pull_return_value(operator: Any, context: Any, upstream_id: str) -> Any:
    """The return value of ``upstream_id`` that belongs to this task instance (see the module docstring), unwrapped
    if the upstream returned :func:`~dp_operators.operators.xcom_aggregates.aggregates_for_xcom`.

    Returns ``None`` if that instance returned nothing.

    Raises:
        AirflowFailException: the upstream is mapped in a way no single instance belongs to this release, or it
            returned an envelope of ``aggregates_for_xcom`` this version cannot read.
    """
    pulled = _pull(operator, context, upstream_id)
    try:
        return aggregates_from_xcom(pulled)
    except XComAggregatesError as error:
        raise AirflowFailException(f"the return value of task {upstream_id!r}: {error}") from None


def _pull(operator: Any, context: Any, upstream_id: str) -> Any:
    ti = context["ti"]
    map_index = -1 if getattr(ti, "map_index", None) is None else ti.map_index
    dag = operator.dag if operator.has_dag() else None
    upstream = dag.get_task(upstream_id) if dag is not None and dag.has_task(upstream_id) else None
    if upstream is None:
        if dag is not None:
            raise AirflowFailException(
                f"aggregates_task_id {upstream_id!r} is not a task of DAG {dag.dag_id!r}; name the task that returns "
                "the aggregates (inside a task group its id is '<group_id>.<task_id>')"
            )
        return ti.xcom_pull(task_ids=upstream_id, key="return_value", map_indexes=None)

    release = dag.get_task(operator.task_id)
    upstream_group, release_group = _mapped_group_id(upstream), _mapped_group_id(release)
    if getattr(upstream, "is_mapped", False):
        return _pull_expanded(ti, context, upstream_id, map_index)
    if upstream_group is None:
        return ti.xcom_pull(task_ids=upstream_id, key="return_value", map_indexes=None)
    if release_group == upstream_group and map_index >= 0:
        return ti.xcom_pull(task_ids=upstream_id, key="return_value", map_indexes=map_index)
    raise AirflowFailException(
        f"task {upstream_id!r} is in mapped task group {upstream_group!r} but this release "
        f"({operator.task_id!r}) is not in that group, so no single instance of it belongs to this release; put the "
        "DPReleaseOperator inside the same mapped task group"
    )


def _pull_expanded(ti: Any, context: Any, upstream_id: str, map_index: int) -> Any:
    """The same map index of an ``.expand()``-ed upstream, if the release is expanded into as many instances."""
    if map_index < 0:
        raise AirflowFailException(
            f"task {upstream_id!r} is mapped (.expand()) but this release is not: one release cannot take one of its "
            "instances. Expand the release over the same input (DPReleaseOperator.partial(...).expand(...)) or put "
            "both in a mapped task group"
        )
    ours = context.get("expanded_ti_count") or _instance_count(ti, ti.task_id)
    theirs = _instance_count(ti, upstream_id)
    if ours is not None and theirs is not None and ours != theirs:
        raise AirflowFailException(
            f"task {upstream_id!r} is mapped into {theirs} instances but this release into {ours}: they are mapped "
            "differently, so map index to map index would pair the wrong aggregates; expand both over the same input"
        )
    return ti.xcom_pull(task_ids=upstream_id, key="return_value", map_indexes=map_index)


def _instance_count(ti: Any, task_id: str) -> int | None:
    """How many instances ``task_id`` has in this run (Airflow's execution API), or None if it cannot tell."""
    try:
        from airflow.sdk.execution_time.task_mapping import get_ti_count_for_task
    except ImportError:  # pragma: no cover - older task SDKs
        return None
    try:
        return get_ti_count_for_task(task_id, ti.dag_id, ti.run_id)
    except Exception:  # noqa: BLE001 - outside a supervised task (tests, `tasks test`): no count to compare
        return None


def describe_missing(upstream_id: str, map_index: int, expected: Sequence[str]) -> str:
    """The error text for an upstream instance that returned nothing."""
    where = f"task {upstream_id!r}" + (f" (map index {map_index})" if map_index >= 0 else "")
    return (
        f"{where} returned no aggregates; it must return a mapping with one entry per aggregate "
        f"({', '.join(expected)}), or a reference (URI) to files holding them"
    )
