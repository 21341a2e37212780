"""Refusals on the path from upstream to ledger commit and publication depend on public parameters only (DESIGN.md
2.4): two inputs that differ in one person's row are both released the same way, or both refused the same way.

Covers the engine's own decisions (``release/run.py``: inline rows or a rows file), the diagnostics report, the
operator's sinks (JSON, CSV, Parquet, SQL) on keys released by partition selection (post-processing of noised
output), and the Python API's reading of numpy floats (decided by the type, never through ``float()``).
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from dp_operators import api
from dp_operators.ledger import ReleaseKey
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sinks import SQLTableSink, sql_release_table
from dp_operators.release import run_release
from dp_operators.release.inputs import prepare_inputs
from dp_operators.release.rows_file import LocalRowsStore
from dp_operators.spec import ReleaseSpec

from airflow_fakes import FakeTaskInstance, context_for
from operator_ledgers import connect_ledger
from sql_targets import database_target
from support import make_ledger

DAG = "public_refusals"
RELEASE = "public_refusals"

#: x87 extended precision (64 significant bits) where the platform has it; binary64 elsewhere (then skipped).
EXTENDED = np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant
needs_extended = pytest.mark.skipif(not EXTENDED, reason="numpy.longdouble is binary64 on this platform")

#: Keys a partition selection may release: the sinks must publish every one of them.
ODD_KEYS = ["a\x00b", "line\nbreak\r", 'quote" and, comma', "é中文🙂", "x" * 10_000, 12345678901234567890123, None]


def _ledger(path: Path):
    return make_ledger(path, cap="1000", accountant="approx_dp", dags=(DAG,), account="acct", delta=Fraction(1, 1000))


def _key(run_id: str) -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run_id, task_id="release", map_index=-1, release_name=RELEASE)


def _spec(aggregate: dict) -> ReleaseSpec:
    return ReleaseSpec.model_validate({"version": 1, "release": RELEASE, "budget_account": "acct",
                                       "privacy_unit": "person", "aggregates": [aggregate]})


def _public_count(keys: list) -> dict:
    return {"name": "x", "kind": "count", "group_by": ["k"], "keys": {"k": keys},
            "mechanism": "discrete_laplace", "budget": {"epsilon": 1}}


def _without_noise(output: dict) -> dict:
    """What an observer sees of a release other than its noised values and its run-specific fields."""
    aggregate = dict(output["aggregates"]["x"])
    aggregate.pop("rows", None)
    aggregate.pop("rows_file", None)
    return {"aggregate": aggregate, "mechanisms": output["mechanisms"], "charge": output["charge"]}


# -- release/run.py ------------------------------------------------------------------------------------------------

def test_the_rows_file_decision_depends_on_the_public_domain_only(tmp_path):
    """A count over five public cells goes to a rows file above inline_rows_limit=2, whether the data hold 0 rows or 1."""
    ledger = _ledger(tmp_path / "ledger.db")
    spec = _spec(_public_count(["a", "b", "c", "d", "e"]))
    store = LocalRowsStore(tmp_path / "rows")
    empty, neighbour = [], [{"k": "a", "count": 1}]
    outputs = [run_release(spec, {"x": rows}, ledger, _key(f"run-{i}"), spec_hash="0" * 64, rows_store=store,
                           inline_rows_limit=2).output for i, rows in enumerate((empty, neighbour))]
    assert all("rows_file" in output["aggregates"]["x"] for output in outputs)
    assert [o["aggregates"]["x"]["rows_file"]["rows"] for o in outputs] == [5, 5]
    assert _without_noise(outputs[0]) == _without_noise(outputs[1])


def test_partition_selection_releases_an_empty_upstream_like_its_neighbour(tmp_path):
    """Partition selection over no rows and over one person's row: both released, no refusal, same public fields."""
    ledger = _ledger(tmp_path / "ledger.db")
    spec = _spec({"name": "x", "kind": "count", "group_by": ["k"], "mechanism": "discrete_laplace",
                  "budget": {"epsilon": 1},
                  "partition_selection": {"mechanism": "discrete_laplace", "budget": {"epsilon": 1, "delta": 1e-6}}})
    outputs = [run_release(spec, {"x": rows}, ledger, _key(f"run-{i}"), spec_hash="0" * 64).output
               for i, rows in enumerate(([], [{"k": "somebody", "count": 1}]))]
    assert _without_noise(outputs[0]) == _without_noise(outputs[1])


def test_diagnostics_of_a_key_outside_the_domain_never_refuse_the_release(tmp_path):
    """One person's row under an odd key outside the domain: the report still serialises and both neighbours release."""
    ledger = _ledger(tmp_path / "ledger.db")
    spec = _spec(_public_count(["a", "b"]))
    written = []

    def deliver(report):  # what the operator's diagnostics writer does with the report
        written.append(json.dumps(report.as_dict(), indent=2, sort_keys=True).encode("ascii"))

    outside = [key for key in ODD_KEYS if not isinstance(key, int)]  # the domain's type: str (or NULL)
    base = [{"k": "a", "count": 3}]
    for i, extra in enumerate([[]] + [[{"k": key, "count": 1}] for key in outside]):
        output = run_release(spec, {"x": base + extra}, ledger, _key(f"run-{i}"), spec_hash="0" * 64,
                             diagnostics=deliver).output
        assert [row["k"] for row in output["aggregates"]["x"]["rows"]] == ["a", "b"]
    assert len(written) == 1 + len(outside)


# -- operators/release.py and the sinks ----------------------------------------------------------------------------

SELECTION_SPEC = f"""\
version: 1
release: {RELEASE}
budget_account: acct
privacy_unit: person
aggregates:
  - name: x
    kind: count
    group_by: [k]
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
    partition_selection:
      mechanism: discrete_laplace
      budget: {{epsilon: 1, delta: 1.0e-6}}
"""


@pytest.fixture
def selection_operator(tmp_path, monkeypatch):
    """A DPReleaseOperator releasing a count under partition selection to JSON, CSV, Parquet and a SQLite table."""
    path = tmp_path / "ledger.db"
    _ledger(path)
    connect_ledger(monkeypatch, "dp_ledger_test", path)
    spec_path = tmp_path / "selection.yaml"
    spec_path.write_text(SELECTION_SPEC)
    target = database_target("sqlite", tmp_path, monkeypatch, "dp_public_refusals")
    conn_id, table, engine = next(target)

    def build() -> DPReleaseOperator:
        return DPReleaseOperator(
            task_id="release", spec_path=spec_path, aggregates_task_id="upstream",
            output_uri=f"file://{tmp_path / 'out'}", output_formats=("json", "csv", "parquet"),
            sql_sink=SQLTableSink(conn_id, table), ledger_conn_id="dp_ledger_test",
            diagnostics_uri=f"file://{tmp_path / 'diagnostics'}",
        )

    yield build, table, engine
    next(target, None)


def test_sinks_publish_every_key_partition_selection_releases_for_both_neighbours(tmp_path, selection_operator):
    """Released keys with NUL, newlines, quotes, non-ASCII, 10 kB text, a huge int or NULL: every sink publishes both neighbours."""
    build, table, engine = selection_operator
    base = [{"k": key, "count": 10**6} for key in ODD_KEYS]
    neighbour = [dict(row) for row in base]
    neighbour[0]["count"] += 1  # one more person in one partition
    released = []
    for run_id, rows in (("run-base", base), ("run-neighbour", neighbour)):
        ti = FakeTaskInstance({"x": rows}, dag_id=DAG, run_id=run_id)
        output = build().execute(context_for(ti))
        keys = [row["k"] for row in output["aggregates"]["x"]["rows"]]
        released.append(sorted(map(json.dumps, keys)))
        folder = tmp_path / "out" / RELEASE / DAG / run_id
        assert json.loads((folder / "release.json").read_text()) == output
        assert (folder / "release.csv").read_text().count("\n") > len(keys)  # quoted newlines inside keys
        assert pq.read_table(folder / "release.parquet").num_rows == len(keys)
        sql_table = sql_release_table(table)
        with engine.connect() as connection:
            stored = connection.execute(sa.select(sql_table.c.key).where(sql_table.c.run_id == run_id)).scalars()
            assert sorted(json.dumps(json.loads(text)["k"]) for text in stored) == released[-1]
    assert released[0] == released[1] == sorted(map(json.dumps, ODD_KEYS))


# -- api.py --------------------------------------------------------------------------------------------------------

def _grid_integers(value: object, *, sensitivity: int = 1) -> list:
    """The grid integers the engine reads for ``value`` passed to :func:`api.laplace_mechanism` (no noise)."""
    spec = api._spec(release="api", account="none", privacy_unit="unspecified", size=None,
                     sensitivity=Fraction(sensitivity), grid=Fraction(1), mechanism="discrete_laplace",
                     budget={"epsilon": 1}, max_partitions_contributed=1, confidence=0.95)
    prepared = prepare_inputs(spec, {"value": api._exact_value(value)})
    return [int(v) for v in prepared.values[("value", "sum")].tolist()]


@needs_extended
def test_neighbouring_longdouble_values_are_read_one_sensitivity_apart():
    """Two extended-precision values one sensitivity apart reach the grid one unit apart, not 256 (no double rounding)."""
    value = np.longdouble(2**60) + np.longdouble(128)
    neighbour = value + np.longdouble(1)
    assert float(neighbour) - float(value) == 256.0  # what reading through float() would have released
    (low,), (high,) = _grid_integers(value), _grid_integers(neighbour)
    assert high - low == 1
    assert low == 2**60 + 128


@needs_extended
def test_finite_longdouble_beyond_the_double_range_saturates_like_its_neighbour():
    """A finite value above 1.8e308 and its neighbour both saturate, as a huge int does, never read as infinity (0)."""
    value = np.longdouble("1e400")
    results = [api.laplace_mechanism(v, sensitivity=1, epsilon=1) for v in (value, value + np.longdouble(1))]
    assert [r.saturated for r in results] == [True, True]
    assert all(r.value > 2**61 for r in results)


@needs_extended
def test_vector_release_reads_a_longdouble_array_exactly():
    """A 1-D longdouble array's values reach the grid exactly, each one sensitivity from its neighbour's."""
    values = np.array([2**60 + 128, 2**60 + 129], dtype=np.longdouble)
    exact = [api._exact_value(v) for v in values.tolist()]
    assert exact == [Fraction(2**60 + 128), Fraction(2**60 + 129)]
    result = api.vector_release(values, sensitivity=1, epsilon=1, mechanism="discrete_laplace")
    assert result.saturated == [False, False] and len(result.values) == 2


@pytest.mark.parametrize("kind", [np.float16, np.float32, np.float64, np.longdouble])
def test_numpy_floats_are_read_as_their_exact_binary_value(kind):
    """Every numpy float width is read as the exact rational of its binary value, decided by its type."""
    value = kind(0.1)
    assert api._exact_value(value) == Fraction(*value.as_integer_ratio())


@pytest.mark.parametrize("special", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("kind", [np.float32, np.float64, np.longdouble])
def test_non_finite_numpy_floats_follow_the_declared_policy(kind, special):
    """NaN and infinities of any numpy width are replaced by 0 (the spec default), never raised, for both neighbours."""
    assert _grid_integers(kind(special)) == [0]
    assert abs(api.laplace_mechanism(kind(special), sensitivity=1, epsilon=1).value) < 100


def test_python_floats_are_still_read_as_exact_decimals():
    """A Python float keeps its exact Decimal reading (the engine's binary float rules do not apply to the API)."""
    from decimal import Decimal

    assert api._exact_value(0.1) == Decimal(0.1)
    assert _grid_integers(float(sys.float_info.max))[0] > 2**61  # saturated, not refused


# -- operators/anonymity.py ----------------------------------------------------------------------------------------

def test_no_dp_release_path_loads_the_anonymity_gate():
    """The DP release operator, the budget gate and the engine load no anonymity module: no DP refusal passes through it."""
    import subprocess

    probe = ("import sys, dp_operators.operators.release, dp_operators.operators.gate, dp_operators.release.run, "
             "dp_operators.api; print(sorted(m for m in sys.modules if 'anonymi' in m))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
