"""Test DAGs: NaN and infinities from an upstream task through XCom (issue 25, item 5; docs/adr/0014).

Three DAGs release ``special_values.yaml`` from the same upstream rows:

* ``special_values_xcom``: the upstream returns ``aggregates_for_xcom(...)`` of rows holding a float NaN count, a
  ``Decimal`` NaN count, +inf and -inf binary64 sums and a ``Decimal`` NaN exact sum;
* ``special_values_finite``: the same, each special value replaced by a finite value of the same type (the
  neighbouring input: the release must behave alike);
* ``special_values_raw``: the NaN mapping returned as it is, which Airflow's XCom push refuses in the upstream task.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pendulum

from airflow.sdk import dag, task
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.xcom_aggregates import aggregates_for_xcom

SPEC = Path(__file__).with_name("special_values.yaml")


def special_aggregates(nan: float, infinity: float, minus_infinity: float, decimal_nan: Decimal) -> dict:
    """The upstream's aggregates, the special values given (NaN and infinities, or finite neighbours)."""
    return {
        "people": [{"city": "a", "count": nan}, {"city": "b", "count": 30}, {"city": "c", "count": decimal_nan}],
        "income": [{"city": "a", "sum": infinity}, {"city": "b", "sum": minus_infinity}, {"city": "c", "sum": 900.5}],
        "hours": decimal_nan,
    }


SPECIAL = dict(nan=float("nan"), infinity=float("inf"), minus_infinity=float("-inf"), decimal_nan=Decimal("NaN"))
FINITE = dict(nan=7.0, infinity=500.0, minus_infinity=20.0, decimal_nan=Decimal("12.5"))


def release_dag(dag_id: str, values: dict, wrap: bool) -> None:
    @dag(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
         tags=["test"], doc_md=__doc__)
    def releases():
        @task(show_return_value_in_logs=False)
        def compute_aggregates() -> dict:
            aggregates = special_aggregates(**values)
            return aggregates_for_xcom(aggregates) if wrap else aggregates

        compute_aggregates() >> DPReleaseOperator(
            task_id="release", spec_path=SPEC, aggregates_task_id="compute_aggregates",
            output_uri=os.environ["DP_OPERATORS_OUTPUT_URI"],
            diagnostics_uri=os.environ.get("DP_OPERATORS_DIAGNOSTICS_URI"),
        )

    releases()


release_dag("special_values_xcom", SPECIAL, wrap=True)
release_dag("special_values_finite", FINITE, wrap=True)
release_dag("special_values_raw", SPECIAL, wrap=False)
