"""Red-team review of issue 13's anonymiser (reviewer R3): hostile or buggy inputs that still crash, hang, or give a
silent wrong result. Each test names the defect in its docstring, fails on the code as reviewed, and passes once the
defect is fixed (by a clear AnonymityInputError / AnonymitySpecError / AirflowFailException, or a correct result).
"""

from __future__ import annotations

import contextlib
import decimal
import signal
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dp_operators.anonymity import AnonymityInputError, AnonymitySpecError, parse_anonymity_spec
from dp_operators.anonymity.anonymise import anonymise
from dp_operators.anonymity.errors import AnonymityError


def spec_of(qis: str, targets: str = "{k: 2}", algorithm: str = "full_domain", extra: str = ""):
    return parse_anonymity_spec(
        f"version: 1\ncheck: red_team\nquasi_identifiers: [{qis}]\ntargets: {targets}\n"
        f"anonymisation: {{algorithm: {algorithm}}}\n{extra}",
        source="red_team.yaml",
    )


@contextlib.contextmanager
def time_budget(seconds: int):
    """Raise TimeoutError (a test failure, not a hang) when the block runs longer than ``seconds``."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- silent wrong results -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(np.array([2**53, 2**53 + 1] * 2, dtype=np.int64), id="int64-above-2**53"),
        pytest.param(np.array([2**64 - 1, 2**64 - 2] * 2, dtype=np.uint64), id="uint64-near-2**64"),
        pytest.param([2**64 + 1, 2**64 + 3] * 2, id="python-int-above-2**63"),
        pytest.param([decimal.Decimal("0.1"), decimal.Decimal("0.10000000000000000001")] * 2, id="decimal-beyond-float"),
    ],
)
def test_full_domain_publishes_values_that_are_not_the_originals(values):
    """Defect: a numeric QI whose values float64 cannot tell apart (integers above 2**53, uint64 near 2**64, exact
    Decimals) is silently collapsed through float64: distinct values become one equivalence class and the released
    level-0 cell is a number that is not the row's value (2**53 + 1 is published as 9007199254740992; uint64
    2**64 - 1 as 18446744073709551616, which is not even a uint64). Every released cell must cover the row's
    original value (issue 13 acceptance), or the column must be refused with an AnonymityInputError."""
    table = pd.DataFrame({"x": values})
    try:
        result = anonymise(table, spec_of("x"))
    except AnonymityInputError:
        return
    originals = table["x"].loc[result.table.index]
    wrong = [(str(o), label) for o, label in zip(originals, result.table["x"]) if label not in (str(o), "*")]
    assert wrong == [], f"released cells that do not cover their original value: {wrong}"


def test_mondrian_crashes_on_integers_float64_cannot_separate():
    """Defect: Mondrian on a numeric QI holding 2**53 and 2**53 + 1 (distinct values, equal as float64) crashes with
    ZeroDivisionError ('float division by zero') instead of anonymising or refusing the column clearly."""
    table = pd.DataFrame({"x": np.array([2**53, 2**53 + 1] * 2, dtype=np.int64)})
    try:
        anonymise(table, spec_of("x", algorithm="mondrian"))
    except AnonymityError:
        pass


# -- crashes --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["full_domain", "mondrian"])
def test_duplicate_column_names_crash(algorithm):
    """Defect: a table with two columns of the QI's name (a SQL join selecting ``a.x, b.x`` through the operator's
    ``sql=`` source) crashes with a numpy/pandas TypeError ('int() argument must be ... not Series') instead of an
    AnonymityInputError naming the repeated column."""
    table = pd.DataFrame([["a", "a"], ["a", "a"], ["b", "b"], ["b", "b"]], columns=["x", "x"])
    with pytest.raises(AnonymityInputError, match="'x'"):
        anonymise(table, spec_of("x", algorithm=algorithm))


def test_huge_interval_width_overflows():
    """Defect: ``intervals: [5, 1e300]`` passes spec validation (each width a whole multiple of the previous), then
    anonymise() crashes with OverflowError ('Python int too large to convert to C long') when it groups the bands.
    It must be refused when the spec is loaded (AnonymitySpecError) or clearly at run time (AnonymityInputError)."""
    table = pd.DataFrame({"x": [1, 2, 3, 4]})
    with pytest.raises((AnonymitySpecError, AnonymityInputError)):
        anonymise(table, spec_of("{name: x, hierarchy: {intervals: [5, 1e300]}}"))


# -- hangs ----------------------------------------------------------------------------------------------------------


def test_tiny_highest_risk_target_hangs():
    """Defect: ``prosecutor_risk: {highest: 1e-12}`` is accepted by the spec, then anonymise() never returns:
    criteria._smallest_size_at_most counts down one class size at a time from 1e12 (the absolute RISK_TOLERANCE of
    1e-12 keeps every size down to ~5e11 'within tolerance'), about 5e11 Python iterations. A highest risk below
    1 / rows needs a class larger than the table and must be refused at once (like k > rows: AnonymityInputError),
    or at load (AnonymitySpecError)."""
    table = pd.DataFrame({"x": ["a", "a", "b", "b", "c", "c"]})
    with time_budget(5), pytest.raises((AnonymityInputError, AnonymitySpecError)):
        anonymise(table, spec_of("x", targets="{prosecutor_risk: {highest: 1e-12}}"))


@pytest.mark.slow
def test_lattice_search_is_quadratic_well_below_the_node_limit():
    """Defect: the full-domain search tags nodes with whole-lattice scans (_above/_below: O(lattice size x QIs) per
    evaluation), so its time grows with the square of the lattice: 16 quasi-identifiers without hierarchies (a
    65,536-node lattice, 1.6 % of MAX_LATTICE_NODES) on 1,000 rows with k = 5 take 47 s (14 QIs: 4 s; 18 QIs: over
    200 s; 22 QIs, still under the limit, did not finish in 5 minutes). A lattice the search cannot finish must be
    refused up front (AnonymityInputError) or searched in reasonable time; here: within 10 s."""
    rng = np.random.default_rng(0)
    table = pd.DataFrame({f"q{i}": rng.integers(0, 2, 1000).astype(str) for i in range(16)})
    spec = spec_of(", ".join(table.columns), targets="{k: 5}")
    with time_budget(10):
        try:
            result = anonymise(table, spec)
        except AnonymityInputError:
            return
    assert result.passed


# -- the operator ---------------------------------------------------------------------------------------------------

OPERATOR_SPEC = """version: 1
check: red_team
quasi_identifiers: [{name: age, type: numeric, hierarchy: {intervals: [5, 10]}}, sex]
sensitive_attributes: [{name: income, type: categorical}]
targets: {k: 2}
"""
PEOPLE = pd.DataFrame(
    {"age": [21, 22, 23, 24, 26, 27, 28, 29], "sex": list("MMFFMMFF"), "income": list("lhlhlhlh")}
)


def _operator_context():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for airflow_fakes
    from airflow_fakes import FakeTaskInstance

    return {"outlet_events": defaultdict(lambda: SimpleNamespace(extra={})), "ti": FakeTaskInstance()}


def test_failed_report_write_leaves_the_table_published(tmp_path):
    """Defect: AnonymiseOperator publishes the anonymised table *before* writing the report, so when the report
    cannot be written (report_path is a folder, a full disk, a bucket without permission) the task fails (with a raw
    IsADirectoryError, and Airflow retries it) yet the table is already at output_path for downstream readers: a
    failed task leaves a published release. Write the report first (or publish the table last)."""
    from dp_operators.operators.anonymity import AnonymiseOperator

    spec = tmp_path / "spec.yaml"
    spec.write_text(OPERATOR_SPEC)
    source = tmp_path / "people.csv"
    PEOPLE.to_csv(source, index=False)
    output = tmp_path / "out" / "people.csv"
    report_folder = tmp_path / "report.json"
    report_folder.mkdir()  # the report cannot be written there
    op = AnonymiseOperator(
        task_id="anonymise", spec=str(spec), source=str(source), output_path=str(output),
        report_path=str(report_folder),
    )
    with pytest.raises(Exception):
        op.execute(_operator_context())
    assert not output.exists(), "the task failed but its table was published"


def test_output_path_equal_to_source_overwrites_the_microdata(tmp_path):
    """Defect: AnonymiseOperator accepts output_path equal to source: the run replaces the raw microdata with the
    release, so the input is destroyed and a retry (or the next run) anonymises the already-generalised table (it
    then fails: 'age is declared numeric but 8 of its 8 values are not numbers'). The same path must be refused at
    construction (ValueError) or at run time without touching the source."""
    from dp_operators.operators.anonymity import AnonymiseOperator

    spec = tmp_path / "spec.yaml"
    spec.write_text(OPERATOR_SPEC)
    source = tmp_path / "people.csv"
    PEOPLE.to_csv(source, index=False)
    before = source.read_bytes()
    with contextlib.suppress(Exception):  # refused or failed: only the source matters
        AnonymiseOperator(
            task_id="anonymise", spec=str(spec), source=str(source), output_path=str(source)
        ).execute(_operator_context())
    assert source.read_bytes() == before, "the source microdata was overwritten by the release"
