"""Neighbouring inputs through the file sources (dp_operators/operators/sources.py, file_tables.py): run the readers
and the operator on neighbouring inputs and compare what an observer sees. Each numbered weakness below is one the
tests guard against (see dp_operators/operators/file_tables.py).

1. CSV decimal text is read as an exact Decimal, so a binary float sum printed by pandas passes ``arithmetic:
   exact``, which the XCom/JSON/Parquet paths refuse for a non-integral float: neighbouring float sums land two grid
   units apart where the plan charged one (ADR 0017's own counterexample, Casacuberta et al. CCS 2022).
2. A CSV value cell that is not a number fails the task (before any budget, without echoing the value, but still):
   whether the release runs depends on a data value (DESIGN.md 2.4). Shown with pandas' ``na_rep="N/A"``: the cell
   says N/A only when a key's group is empty, i.e. when one person is removed from a group of one.
3. An integer-domain CSV key is parsed with ``int(Decimal(text))`` without the exponent limit the engine applies to
   the same Decimal (upstream_types.DECIMAL_EXPONENT_LIMIT): one short key cell (``1e9999999``) makes the read take
   hours (the time taken is then a function of a data value; the task sits until ``execution_timeout``).
4. An ungrouped SQL aggregate whose query returns no row (``... WHERE sex = 'F' GROUP BY sex``, or ``HAVING``) is
   refused, so the refusal depends on whether one person is present.

The last section compares outcomes only (read, refused or crashed): one person's key in another encoding, a date
beyond Python's range, a float sum under ``exact``; neighbours must have the same outcome.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from dp_operators.operators.release import DPReleaseOperator
from dp_operators.operators.sources import query_aggregates, read_reference
from dp_operators.release import ReleaseInputError
from dp_operators.release.inputs import prepare_inputs
from dp_operators.release.plan import plan_release
from dp_operators.spec import parse_spec

from airflow_fakes import FakeTaskInstance as PlainTaskInstance
from airflow_fakes import NoXComTaskInstance, context_for
from operator_ledgers import connect_ledger
from support import make_ledger

DAG = "neighbours_dp_sources"

SUM_SPEC = """
version: 1
release: neighbours_float_sum
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: total
    kind: sum
    bounds: [0, 1]
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""

MEAN_SPEC = """
version: 1
release: neighbours_mean_by_sex
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: hours_by_sex
    kind: mean
    group_by: [sex]
    keys: {sex: [F, M]}
    bounds: [0, 100]
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""

AGE_SPEC = """
version: 1
release: neighbours_ages
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: people_by_age
    kind: count
    group_by: [age]
    keys: {age: [17, 18, 19]}
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""

COUNT_SPEC = """
version: 1
release: neighbours_women
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: women
    kind: count
    mechanism: discrete_laplace
    budget: {epsilon: 1}
"""


# -- 1. a float sum laundered through CSV text ----------------------------------------------------------------------

def test_a_float_sum_printed_to_csv_keeps_the_planned_sensitivity(tmp_path):
    """Neighbours {0.49999999999999994} and {0.49999999999999994, 1} (bounds [0, 1], grid 1, Linf 1 planned): pandas
    sums them to 0.49999999999999994 and 1.5 and writes exactly that text. Through XCom both floats are refused under
    ``exact``; through CSV both are read as exact Decimals and land on grid units 0 and 2."""
    import pandas as pd

    spec = parse_spec(SUM_SPEC, source="SUM_SPEC")
    (step,) = plan_release(spec).steps
    linf = step.describe()["linf_grid_units"]
    read = {}
    for name, values in (("without", [0.49999999999999994]), ("with", [0.49999999999999994, 1.0])):
        path = tmp_path / f"{name}.csv"
        pd.DataFrame({"sum": [pd.Series(values).sum()]}).to_csv(path, index=False)  # an ordinary upstream task
        try:
            read[name] = prepare_inputs(spec, read_reference({"total": f"file://{path}"}, spec)).values[("total", "sum")]
        except (AirflowFailException, ReleaseInputError):
            read[name] = None  # refused (as the XCom path refuses these floats): no sensitivity to break
        with pytest.raises(ReleaseInputError, match="upstream.arithmetic is 'exact'"):  # the XCom path, for contrast
            prepare_inputs(spec, {"total": float(pd.Series(values).sum())})
    if read["without"] is not None and read["with"] is not None:
        gap = abs(read["with"][0] - read["without"][0])
        assert gap <= linf, (
            f"neighbouring CSV sums were read {gap} grid units apart; the plan charged Linf = {linf}: a float sum "
            "printed as text passed 'arithmetic: exact'"
        )


# -- 2. a refusal that depends on a value cell ----------------------------------------------------------------------

def FakeTaskInstance(**fields) -> NoXComTaskInstance:  # noqa: N802 - the release reads its aggregates_uri
    return NoXComTaskInstance(**{"dag_id": DAG, **fields})


def test_whether_a_csv_release_runs_does_not_depend_on_a_data_value(tmp_path, monkeypatch, capsys):
    """Mean hours by sex, the upstream a pandas ``groupby`` reindexed over the public keys and written with
    ``na_rep="N/A"`` (sums in pandas' nullable ``Int64``, so the column's type does not depend on a missing group).
    Neighbours: with and without the only woman; the empty group's sum cell says ``N/A``, which is NULL: both
    releases have the same outcome."""
    import pandas as pd

    spec_path = tmp_path / "mean.yaml"
    spec_path.write_text(MEAN_SPEC)
    make_ledger(tmp_path / "ledger.db", cap="100", accountant="pure_dp", dags=(DAG,), account="acct")
    connect_ledger(monkeypatch, "neighbours_ledger", tmp_path / 'ledger.db')
    people = {"with her": pd.DataFrame({"sex": ["F", "M", "M"], "hours": [40, 30, 50]}),
              "without her": pd.DataFrame({"sex": ["M", "M"], "hours": [30, 50]})}
    outcomes, ledger_rows = {}, {}
    for name, table in people.items():
        grouped = table.groupby("sex")["hours"].agg(sum="sum", count="count").reindex(["F", "M"])
        grouped["count"] = grouped["count"].fillna(0).astype(int)
        grouped["sum"] = grouped["sum"].astype("Int64")  # int sums whether or not a group is missing (exact)
        path = tmp_path / f"{name.replace(' ', '_')}.csv"
        grouped.rename_axis("sex").reset_index().to_csv(path, index=False, na_rep="N/A")
        operator = DPReleaseOperator(
            task_id="release", spec_path=spec_path, aggregates_uri=f"file://{path}",
            output_uri=f"file://{tmp_path / 'out'}", ledger_conn_id="neighbours_ledger",
        )
        ti = FakeTaskInstance(run_id=f"manual__{name.replace(' ', '_')}")
        try:
            operator.execute(context_for(ti))
            outcomes[name] = "released"
        except AirflowFailException as error:
            assert "N/A" not in str(error) and "40" not in str(error)  # no value is echoed (holds today)
            outcomes[name] = f"refused: {type(error).__name__}"
        ledger_rows[name] = [c for c in make_ledger_reader(tmp_path).charges() if c["run_id"] == ti.run_id]
    capsys.readouterr()
    assert not ledger_rows["without her"] or outcomes["without her"] == "released"  # refused before any charge
    assert outcomes["with her"] == outcomes["without her"], (
        f"neighbouring data, different task outcomes: {outcomes} (a refusal must depend on public parameters only; "
        "an unparsable value cell should follow the aggregate's non_finite policy like NaN, as an unparsable key "
        "cell is read as NULL)"
    )


def make_ledger_reader(tmp_path: Path):
    from support import spender

    return spender(f"sqlite:///{tmp_path / 'ledger.db'}")


# -- 3. an integer key cell with a huge exponent ---------------------------------------------------------------------

def _read_ages(path: str) -> None:
    spec = parse_spec(AGE_SPEC, source="AGE_SPEC")
    read_reference(f"file://{path}", spec)


def test_an_integer_key_cell_is_read_in_bounded_time(tmp_path):
    """``_int_key('1e9999999')``: ``Decimal`` says it is integral, ``int()`` then builds a ten-million-digit integer
    (about a minute for 1e999999, hours for this one). ``normalise_key`` refuses to expand such a Decimal; the CSV
    key reader should do the same (or hand ``Decimal(text)`` to ``normalise_key``)."""
    path = tmp_path / "ages.csv"
    path.write_text("age,count\n17,5\n18,6\n1e9999999,1\n19,7\n")
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_read_ages, args=(str(path),))
    process.start()
    process.join(120)  # bounds a hang only: the expansion takes hours, the read a fraction of a second
    finished = not process.is_alive()
    if not finished:
        process.kill()
        process.join()
    assert finished, "reading a 4-row CSV did not finish: one key cell '1e9999999' is being expanded to an int"
    assert process.exitcode == 0


# -- 4. an ungrouped SQL aggregate whose query returns no row --------------------------------------------------------

class SqliteConnections:
    """A DB-API hook over one SQLite file (what ``query_aggregates`` needs: ``get_conn``)."""

    def __init__(self, path: Path):
        self.path = path

    def get_conn(self):
        return sqlite3.connect(self.path)


def test_an_ungrouped_query_without_a_row_is_not_refused_by_the_data(tmp_path):
    """``SELECT COUNT(*) AS count FROM people WHERE sex = 'F' GROUP BY sex`` returns one row when a woman is present
    and none when the only one is removed: the release runs on one neighbour and is refused on the other. An
    ungrouped aggregate over an empty set is 0 (COUNT) or NULL (SUM): read no row as that, via the non_finite policy."""
    spec = parse_spec(COUNT_SPEC, source="COUNT_SPEC")
    query = {"women": "SELECT COUNT(*) AS count FROM people WHERE sex = 'F' GROUP BY sex"}
    outcomes = {}
    for name, rows in (("with her", ["F", "M", "M"]), ("without her", ["M", "M"])):
        path = tmp_path / f"{name.replace(' ', '_')}.db"
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE people (sex TEXT)")
            connection.executemany("INSERT INTO people VALUES (?)", [(sex,) for sex in rows])
        try:
            prepare_inputs(spec, query_aggregates(SqliteConnections(path), query, spec))
            outcomes[name] = "read"
        except (AirflowFailException, ReleaseInputError) as error:
            outcomes[name] = f"refused: {error}"
    assert outcomes["with her"] == outcomes["without her"], f"neighbouring databases, different outcomes: {outcomes}"


# -- 5. a true value passed as a string is taken for a file reference and echoed --------------------------------------

def test_a_count_returned_as_a_string_is_not_echoed_in_the_task_error(tmp_path, monkeypatch, capsys):
    """An upstream returning its aggregates as strings (``{"women": str(total)}``, a common way to get a Decimal
    through XCom) is taken by ``is_reference`` for a mapping of file URIs; ``_located`` then fails with the "URI" in
    the message: the true count lands in the task log and the Airflow UI. The engine refuses the same value as
    "field 'count' holds a str" without echoing it (DESIGN.md 2.8)."""
    spec_path = tmp_path / "women.yaml"
    spec_path.write_text(COUNT_SPEC)
    make_ledger(tmp_path / "ledger.db", cap="100", accountant="pure_dp", dags=(DAG,), account="acct")
    connect_ledger(monkeypatch, "neighbours_ledger", tmp_path / 'ledger.db')

    upstream = {"women": "8675309.25"}  # the true sum/count, stringified for XCom

    operator = DPReleaseOperator(task_id="release", spec_path=spec_path, aggregates_task_id="compute",
                                 ledger_conn_id="neighbours_ledger")
    with pytest.raises(Exception) as failed:
        operator.execute(context_for(PlainTaskInstance(upstream, run_id="manual__1", dag_id=DAG)))
    seen = str(failed.value) + capsys.readouterr().out
    assert "8675309" not in seen, f"the true value is in the task error: {failed.value}"


# -- 6. CSV key text under partition selection ------------------------------------------------------------------------

SELECTION_SPEC = """
version: 1
release: neighbours_selected_ages
budget_account: acct
privacy_unit: person
contribution: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
aggregates:
  - name: people_by_age
    kind: count
    group_by: [age]
    mechanism: discrete_laplace
    budget: {epsilon: 1}
    partition_selection: {mechanism: discrete_laplace, budget: {epsilon: 1, delta: 1e-8}}
"""


def test_the_published_key_set_does_not_reveal_one_person_with_a_null_key(tmp_path):
    """pandas holds an int column with one NaN as float64, so ``groupby('age').size().to_csv()`` writes ``17.0`` when
    one person's age is missing and ``17`` when not. Under partition selection the CSV reader keeps key text
    verbatim, so every released key changes its spelling with that one person: the published key set (not its noise)
    tells whether they are in the data. The XCom and Parquet paths normalise the integral float 17.0 to the int 17
    (upstream_types.normalise_key) and publish the same keys for both neighbours."""
    import numpy as np
    import pandas as pd

    from dp_operators.ledger import ReleaseKey
    from dp_operators.release import run_release

    spec = parse_spec(SELECTION_SPEC, source="SELECTION_SPEC")
    ledger = make_ledger(tmp_path / "ledger.db", cap="100", accountant="approx_dp", dags=(DAG,), account="acct")
    published = {}
    for name, extra in (("without", []), ("with a NULL age", [np.nan])):
        people = pd.DataFrame({"age": [17] * 5000 + [18] * 5000 + extra})
        path = tmp_path / f"{len(extra)}.csv"
        people.groupby("age").size().rename("count").reset_index().to_csv(path, index=False)
        try:
            aggregates = read_reference(f"file://{path}", spec)
        except AirflowFailException as error:  # the fix: CSV is refused without a public key domain, by the spec
            assert "no public key domain" in str(error)
            published[name] = "refused: CSV without a public key domain"
            continue
        output = run_release(spec, aggregates, ledger,
                             ReleaseKey(DAG, f"run_{len(extra)}", "release", -1, spec.release),
                             spec_hash="0" * 64).output
        published[name] = sorted(row["age"] for row in output["aggregates"]["people_by_age"]["rows"])
    assert published["without"] == published["with a NULL age"], (
        f"published keys: {published} (5000 people per age; one person with a missing age changes every key)"
    )


# -- 7. neighbours' outcomes: read, refused or crashed ------------------------------------------------------------

CITY_SPEC = """
version: 1
release: kinds_cities
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
release: kinds_days
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
release: kinds_hours
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
    """A key cell in Latin-1 (one person's) gives a CSV the same outcome as its neighbour without that person."""
    # Decoded with surrogateescape, such a key is one no release can publish (normalise_key: UNPUBLISHABLE).
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
    """A Parquet date key beyond year 9999 (one person's typo) gives the same outcome as the neighbour without it."""
    # date32 holds dates up to year ~5.8 million, Python's date stops at 9999: such a key is read as unpublishable.
    without, with_him = tmp_path / "without.parquet", tmp_path / "with.parquet"
    _days_parquet(without, [])
    _days_parquet(with_him, [(dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days + 1])  # 10000-01-01
    outcomes = {"without": outcome(DAY_SPEC, f"file://{without}"), "with": outcome(DAY_SPEC, f"file://{with_him}")}
    assert outcomes["with"] == outcomes["without"], f"neighbouring Parquet files, different outcomes: {outcomes}"


def test_the_operator_releases_despite_a_date_key_beyond_year_9999(tmp_path, monkeypatch):
    """Through the operator, a date key beyond year 9999 is no failure at all (not even a retryable one)."""
    spec = tmp_path / "days.yaml"
    spec.write_text(DAY_SPEC)
    make_ledger(tmp_path / "ledger.db", cap="100", accountant="pure_dp", dags=(DAG,), account="acct")
    connect_ledger(monkeypatch, "kinds_ledger", tmp_path / 'ledger.db')
    data = tmp_path / "with.parquet"
    _days_parquet(data, [3_000_000])
    op = DPReleaseOperator(task_id="release", spec_path=spec, aggregates_uri=f"file://{data}",
                           ledger_conn_id="kinds_ledger")
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
def test_a_half_hour_float_sum_has_the_same_outcome_with_or_without_one_person(tmp_path, fmt):
    """Under ``exact`` a float sum is refused by its type whatever its value: both neighbours, same outcome."""
    # Hours in half-hour steps summed by pandas: 70.5 with the person who worked 40.5 h, 30.0 without (docs/adr/0017).
    import pandas as pd

    outcomes = {}
    for name, hours in (("with him", [40.5, 30.0]), ("without him", [30.0])):
        frame = pd.DataFrame({"sum": [pd.Series(hours).sum()]})
        path = tmp_path / f"{name.replace(' ', '_')}.{fmt}"
        frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
        outcomes[name] = outcome(HOURS_SPEC, f"file://{path}")
    assert outcomes["with him"] == outcomes["without him"], f"neighbouring files, different outcomes: {outcomes}"
