"""Test DAG: DPReleaseOperator in every mapped shape (issue 10, item 1).

True counts are far apart (1,000 x the index), so a published value (Laplace noise of scale 1) shows which upstream
instance it came from. ``group`` index 2's compute task returns nothing: that release must fail and charge nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum

from airflow.sdk import dag, task, task_group
from dp_operators.operators.release import DPReleaseOperator

SPEC = Path(__file__).with_name("mapped_count.yaml")
OUT = os.environ.get("DP_OPERATORS_OUTPUT_URI", "file:///tmp/dp_mapped_out")


@dag(dag_id="mapped_releases", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     tags=["test"], doc_md=__doc__)
def mapped_releases():
    @task_group(group_id="region")
    def region(index: int):
        @task
        def compute(index: int) -> dict | None:
            return None if index == 2 else {"people": 1000 * (index + 1)}

        computed = compute(index)
        computed >> DPReleaseOperator(
            task_id="release", spec_path=SPEC, aggregates_task_id="region.compute", output_uri=OUT,
        )

    region.expand(index=[0, 1, 2])

    @task
    def expanded(index: int) -> dict:
        return {"people": 100_000 * (index + 1)}

    expanded_values = expanded.expand(index=[0, 1, 2])
    expanded_values >> DPReleaseOperator.partial(
        task_id="release_expanded", spec_path=SPEC, aggregates_task_id="expanded",
    ).expand(output_uri=[f"{OUT}/a", f"{OUT}/b", f"{OUT}/c"])

    @task
    def first() -> dict:
        return {"people": 7_000_000}

    @task
    def second() -> dict:
        return {"people": 8_000_000}

    [first(), second()] >> DPReleaseOperator.partial(task_id="release_each", spec_path=SPEC, output_uri=OUT).expand_kwargs(
        [{"aggregates_task_id": "first"}, {"aggregates_task_id": "second"}]
    )

    expanded_values >> DPReleaseOperator(
        task_id="release_unmapped", spec_path=SPEC, aggregates_task_id="expanded", output_uri=OUT,
    )

    expanded_values >> DPReleaseOperator.partial(
        task_id="release_mismatched", spec_path=SPEC, aggregates_task_id="expanded",
    ).expand(output_uri=[f"{OUT}/x", f"{OUT}/y"])


mapped_releases()
