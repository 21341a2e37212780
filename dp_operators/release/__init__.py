"""The release engine: spec + upstream aggregates + ledger -> noised release. No Airflow import.

Modules, in the order of one release: :mod:`.plan` (public plan: mechanisms, scales, charge), :mod:`.inputs`
(upstream shapes and values onto the grid; :mod:`.upstream_types` says what each upstream type becomes),
:mod:`.columns` (Arrow tables read array-at-a-time), :mod:`.run` (replay, reserve, draw, commit), :mod:`.publish`
(the published form), :mod:`.rows_file` (large releases' rows as Parquet files the ledger records by digest).
:mod:`.diagnostics` holds the opt-in data-quality report (exact, data-derived numbers, never logged). See :mod:`dp_operators.release.run` for
the order of steps and the neighbouring relation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dp_operators._lazy import lazy_attributes
from dp_operators.release.errors import ReleaseAbortedError, ReleaseConfigError, ReleaseInputError

if TYPE_CHECKING:  # pragma: no cover
    from dp_operators.release.diagnostics import AggregateDiagnostics, DiagnosticsReport, InputProblem
    from dp_operators.release.inputs import SATURATION, PreparedInputs, check_aggregates, key_domain, prepare_inputs
    from dp_operators.release.plan import NoiseStep, ReleasePlan, calibrate, component_sensitivity, plan_release
    from dp_operators.release.publish import check_plain_json, publish_aggregate
    from dp_operators.release.rows_file import INLINE_ROWS_LIMIT, LocalRowsStore, RowsFileError, RowsStore
    from dp_operators.release.run import ReleaseResult, draw_noise, run_release

#: Public name -> the submodule defining it, imported on first access (PEP 562): planning a spec (``dpctl spec
#: plan``, the operator at DAG parse time) then loads neither the ledger nor SQLAlchemy nor pyarrow.
_LAZY = {
    "AggregateDiagnostics": "diagnostics", "DiagnosticsReport": "diagnostics", "InputProblem": "diagnostics",
    "SATURATION": "inputs", "PreparedInputs": "inputs", "check_aggregates": "inputs", "key_domain": "inputs",
    "prepare_inputs": "inputs",
    "NoiseStep": "plan", "ReleasePlan": "plan", "calibrate": "plan", "component_sensitivity": "plan",
    "plan_release": "plan",
    "check_plain_json": "publish", "publish_aggregate": "publish",
    "INLINE_ROWS_LIMIT": "rows_file", "LocalRowsStore": "rows_file", "RowsFileError": "rows_file",
    "RowsStore": "rows_file",
    "ReleaseResult": "run", "draw_noise": "run", "run_release": "run",
}

__all__ = [
    "INLINE_ROWS_LIMIT",
    "SATURATION",
    "AggregateDiagnostics",
    "DiagnosticsReport",
    "InputProblem",
    "LocalRowsStore",
    "NoiseStep",
    "PreparedInputs",
    "ReleaseAbortedError",
    "ReleaseConfigError",
    "ReleaseInputError",
    "ReleasePlan",
    "ReleaseResult",
    "RowsFileError",
    "RowsStore",
    "calibrate",
    "check_aggregates",
    "check_plain_json",
    "component_sensitivity",
    "draw_noise",
    "key_domain",
    "plan_release",
    "prepare_inputs",
    "publish_aggregate",
    "run_release",
]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
