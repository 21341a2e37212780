"""the sources after the fixes (sources.py, file_tables.py): neighbouring inputs (one person added) that
the readers treat differently: one neighbour is read, the other fails the task. DESIGN.md 2.4: a refusal depends
on public parameters only; a data value never raises."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sources import read_reference
from dp_operators.release import ReleaseInputError
from dp_operators.release.inputs import prepare_inputs
from dp_operators.spec import parse_spec

from airflow_fakes import FakeTaskInstance, context_for
from support import SPEND_KEY, make_ledger

DAG = "review2_sources"


class NoXComTaskInstance(FakeTaskInstance):
    """The release reads its aggregates_uri; pulling XCom would fail the test."""

    def xcom_pull(self, task_ids=None, key="return_value", map_indexes=None):
        raise AssertionError("the operator read XCom; its source is aggregates_uri")

CITY_SPEC = """
version: 1
release: review2_cities
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: people_by_city
    kind: count
    group_by: [city]
    keys: {city: [Zürich, Genève]}
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""

DAY_SPEC = """
version: 1
release: review2_days
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: visits_by_day
    kind: count
    group_by: [day]
    keys: {day: ['2026-01-01', '2026-01-02']}
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""

HOURS_SPEC = """
version: 1
release: review2_hours
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: hours
    kind: sum
    bounds: [0, 99]
    grid: 0.5
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""


def outcome(spec_text: str, reference: str) -> str:
    spec = parse_spec(spec_text, source="spec")
    try:
        prepare_inputs(spec, read_reference(reference, spec))
        return "read"
    except (AirflowFailException, ReleaseInputError) as error:
        return f"refused ({type(error).__name__})"
    except Exception as error:  # noqa: BLE001 - what the operator turns into a retryable "unexpected" failure
        return f"crashed ({type(error).__name__})"


# -- CSV: one person's key in another encoding ----------------------------------------------------------------------

def test_one_key_cell_in_latin1_does_not_refuse_the_csv(tmp_path):
    """The CSV is opened as strict UTF-8: one row whose key (outside the public domain) was written in Latin-1 by
    one source system (``Z\\xfcrich``, one person) makes the whole file unreadable (UnicodeDecodeError, a
    ValueError, -> AirflowFailException). Its neighbour without that person is released. The engine already ignores
    a key with lone surrogates (``normalise_key`` -> UNPUBLISHABLE): decode with ``errors='surrogateescape'``."""
    without = tmp_path / "without.csv"
    without.write_bytes("city,count\nZürich,120\nGenève,80\n".encode("utf-8"))
    with_her = tmp_path / "with.csv"
    with_her.write_bytes("city,count\nZürich,120\nGenève,80\n".encode("utf-8") + "Zürich,1\n".encode("latin-1"))
    outcomes = {name: outcome(CITY_SPEC, f"file://{path}") for name, path in
                (("without", without), ("with", with_her))}
    assert outcomes["with"] == outcomes["without"], f"neighbouring CSV files, different outcomes: {outcomes}"


# -- Parquet: a date key beyond Python's date range -----------------------------------------------------------------

def _days_parquet(path: Path, extra: list) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    days = [dt.date(2026, 1, 1), dt.date(2026, 1, 2)]
    counts = [40, 50]
    table = pa.table({"day": pa.array([(d - dt.date(1970, 1, 1)).days for d in days] + extra, type=pa.int32())
                      .cast(pa.date32()), "count": pa.array(counts + [1] * len(extra), type=pa.int64())})
    pq.write_table(table, path)


def test_a_date_key_beyond_year_9999_does_not_crash_the_parquet_read(tmp_path):
    """A Parquet ``date32`` key column holds dates up to year ~5.8 million; Python's ``date`` stops at 9999. One
    person with a garbage visit date (a sentinel, a typo: 2026 -> 20260) makes ``table.to_pylist()`` raise
    OverflowError (file_tables.parquet_rows, outside its try), which the operator reports as an unexpected, *retryable*
    failure; the neighbour without them is released. Read such a key as unpublishable (its row ignored and
    counted), as normalise_key does for a key no release can publish."""
    without, with_him = tmp_path / "without.parquet", tmp_path / "with.parquet"
    _days_parquet(without, [])
    _days_parquet(with_him, [(dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days + 1])  # 10000-01-01
    outcomes = {"without": outcome(DAY_SPEC, f"file://{without}"), "with": outcome(DAY_SPEC, f"file://{with_him}")}
    assert outcomes["with"] == outcomes["without"], f"neighbouring Parquet files, different outcomes: {outcomes}"


def test_the_operator_does_not_retry_forever_on_that_date(tmp_path, monkeypatch):
    """Through the operator the OverflowError becomes 'failed with OverflowError before any budget was reserved (a
    retry is safe)': every retry fails the same way (a data-dependent failure, classified as transient)."""
    spec = tmp_path / "days.yaml"
    spec.write_text(DAY_SPEC)
    make_ledger(tmp_path / "ledger.db", cap="100", accountant="pure_dp", dags=(DAG,), account="acct")
    monkeypatch.setenv("AIRFLOW_CONN_REVIEW2_LEDGER", json.dumps(
        {"conn_type": "dp_ledger", "extra": {"url": f"sqlite:///{tmp_path / 'ledger.db'}",
                                             "audit_key": SPEND_KEY.text}}))
    data = tmp_path / "with.parquet"
    _days_parquet(data, [3_000_000])
    op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_uri=f"file://{data}",
                           ledger_conn_id="review2_ledger")
    try:
        op.execute(context_for(NoXComTaskInstance(dag_id=DAG)))
        result = "released"
    except AirflowFailException:
        result = "refused"
    except AirflowException as error:
        result = f"retryable: {error}"
    assert result == "released", result


# -- CSV / Parquet float sums under the default `exact` arithmetic (refused by their type, docs/adr/0017) ----------

@pytest.mark.parametrize("fmt", [
    "csv",  # every float cell (30.0 as well as 70.5) is a float sum: refused with or without him
    "parquet",  # refused by the column's type (double) under `exact`, with or without him
])
def test_an_exact_half_hour_sum_is_read_whatever_the_data(tmp_path, fmt):
    """Hours in half-hour steps (grid 0.5, the spec's own resolution), summed exactly by pandas (every x.5 is a
    binary double): 70.5 with the person who worked 40.5 h, 30.0 without. Under ``exact`` a float sum is refused by
    its type whatever its value, so both neighbours have the same outcome (docs/adr/0017)."""
    import pandas as pd

    outcomes = {}
    for name, hours in (("with him", [40.5, 30.0]), ("without him", [30.0])):
        frame = pd.DataFrame({"sum": [pd.Series(hours).sum()]})
        path = tmp_path / f"{name.replace(' ', '_')}.{fmt}"
        frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
        outcomes[name] = outcome(HOURS_SPEC, f"file://{path}")
    assert outcomes["with him"] == outcomes["without him"], f"neighbouring files, different outcomes: {outcomes}"
