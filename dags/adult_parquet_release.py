"""Example DAG: the Adult census release with its aggregates passed by reference, as Parquet files.

``stage_aggregates`` computes the same true aggregates as ``adult_census_release`` (its
``compute_adult_aggregates``), writes each one as a Parquet file (the spec's ``group_by`` columns and the value
columns its kind needs: ``count``, or ``sum`` and ``count`` for the mean; the median's histogram as
``hours_per_week`` and ``count``, one row per bin) to a staging folder, and returns only the mapping aggregate
name -> file URI. ``release`` (``DPReleaseOperator``) reads those files itself
(:func:`dp_operators.operators.sources.read_reference`), noises them as ``config/releases/adult_census.yaml`` says
after charging the budget account ``census_adult``, and publishes the release as JSON and Parquet.

Why pass by reference: a value returned by a task is stored in Airflow's XCom table and shown in the UI's XCom tab
to anyone allowed to read the DAG, so true aggregates returned that way leave the storage their owner controls.
And XCom cannot carry everything an aggregation produces: NaN and numpy arrays fail Airflow's serializer in the
upstream task, after it did its work. A file reference avoids both; the true aggregates stay in the staging folder
(give it the access rights of the raw data) and never enter XCom, a templated field or a log.

Environment:
    DP_OPERATORS_ADULT_CSV: the Adult table (default as in ``adult_census_release``: ``.data/adult.csv`` as
        ``make demo`` builds it, else ``../shared/data/adult.csv`` beside the repository).
    DP_OPERATORS_STAGING_URI: the folder of the staged true aggregates, any ``ObjectStoragePath`` URI
        (default ``file://<repo>/.demo/staging``); each run writes ``<dag_id>/<run_id>/<aggregate>.parquet`` there.
    DP_OPERATORS_OUTPUT_URI: where releases are published (default ``file://<repo>/.demo/releases``).

The ledger connection is ``dp_ledger_default``; the account's ``allowed_dags`` must list ``adult_parquet_release``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum

from airflow.sdk import ObjectStoragePath, dag, get_current_context, task
from dp_operators.operators.locations import encode_component
from dp_operators.operators.release import DPReleaseOperator

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "config" / "releases" / "adult_census.yaml"


def staging_uri() -> str:
    """The staging folder of the true aggregates (see the module docstring)."""
    return os.environ.get("DP_OPERATORS_STAGING_URI", f"file://{REPO / '.demo' / 'staging'}")


def write_parquet_aggregates(aggregates: dict, folder: ObjectStoragePath) -> dict[str, str]:
    """Write each aggregate of ``aggregates`` (the shape ``compute_adult_aggregates`` returns) as
    ``<folder>/<name>.parquet``: a grouped one as its rows, an ungrouped one as a single row. Returns name -> URI.
    Integer columns stay int64, so the engine reads every count and sum exactly."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    uris = {}
    for name, value in aggregates.items():
        rows = value if isinstance(value, list) else [value]
        path = folder / f"{name}.parquet"
        with path.open("wb") as handle:
            pq.write_table(pa.Table.from_pylist(rows), handle)
        uris[name] = str(path)
    return uris


@dag(
    dag_id="adult_parquet_release",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["differential-privacy", "example"],
    doc_md=__doc__,
)
def adult_parquet_release():
    @task(multiple_outputs=False)
    def stage_aggregates() -> dict[str, str]:
        # Imported when the task runs, not at parse time: a DAG file imported by another DAG file at parse time
        # registers its DAG under the importer too (AirflowDagDuplicatedIdException, an import error). Airflow
        # puts the DAG folder on sys.path when it runs a task.
        from adult_census_release import adult_csv_path, compute_adult_aggregates

        context = get_current_context()
        folder = ObjectStoragePath(staging_uri()) / encode_component(context["dag"].dag_id) / encode_component(
            context["run_id"]
        )
        return write_parquet_aggregates(compute_adult_aggregates(adult_csv_path()), folder)

    staged = stage_aggregates()
    release = DPReleaseOperator(
        task_id="release",
        spec_path=SPEC,
        aggregates_task_id="stage_aggregates",
        output_uri=os.environ.get("DP_OPERATORS_OUTPUT_URI", f"file://{REPO / '.demo' / 'releases'}"),
        output_formats=("json", "parquet"),
        ledger_conn_id="dp_ledger_default",
        retries=2,  # transient errors (storage, the ledger's database); a held lease waits without a try (ADR 31)
        retry_delay=timedelta(seconds=30),
    )
    staged >> release


adult_parquet_release()
