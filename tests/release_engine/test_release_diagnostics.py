"""The opt-in diagnostics report: exact data-quality numbers for data owners, never logged;
``check_aggregates`` for the upstream task; the ``diagnostics`` callback of ``run_release``."""

from __future__ import annotations

import json
import logging
from decimal import Decimal

import pytest

from dp_operators.ledger import BudgetExhaustedError
from dp_operators.release import (
    SATURATION,
    DiagnosticsReport,
    ReleaseInputError,
    check_aggregates,
    prepare_inputs,
    run_release,
)


def test_check_aggregates_reports_every_problem_with_its_row_index_and_never_raises(build_spec):
    rows = [
        {"k": "a", "count": 1},
        {"k": b"b", "count": 2},       # row 1: bytes key
        {"k": "a", "count": "3"},      # row 2: str count
        {"k": "a"},                    # row 3: no count
        ["a", 4],                      # row 4: not a mapping
        {"k": "a", "count": 5},
    ]
    report = check_aggregates(build_spec(), {"x": rows, "y": 7})
    assert not report.ok
    problems = [(p.aggregate, p.row, p.field) for p in report.all_problems()]
    assert problems == [("x", 1, "k"), ("x", 2, "count"), ("x", 3, None), ("x", 4, None)]
    assert report.aggregates["x"].problem_count == 4
    assert report.unused_aggregates == ["y"]
    seen = report.aggregates["x"]
    assert seen.rows == 6 and seen.partitions == 1  # the good rows (1 + 5) of key 'a' are still read


def test_check_aggregates_reports_each_binary_float_sum_under_exact_arithmetic(build_spec):
    rows = [{"k": "a", "sum": 1}, {"k": "a", "sum": 0.5}, {"k": 1, "sum": float("nan")}, {"k": 1, "sum": 2.0},
            {"k": 1, "sum": 2.25}]
    report = check_aggregates(build_spec("sum"), {"x": rows})
    # under exact every float sum is refused by its type: NaN and integral floats as well as fractions
    assert [(p.row, p.field) for p in report.all_problems()] == [(1, "sum"), (2, "sum"), (3, "sum"), (4, "sum")]
    assert "Casacuberta" in report.all_problems()[0].message


@pytest.mark.parametrize("aggregates", [
    pytest.param(None, id="None"),
    pytest.param([("x", 1)], id="a list"),
    pytest.param({}, id="the aggregate is missing"),
    pytest.param({"x": "rows"}, id="a string for a list of rows"),
    pytest.param({"x": {"k": "a", "count": 1}}, id="a mapping for a list of rows"),
])
def test_check_aggregates_reports_whole_value_problems_and_never_raises(aggregates, build_spec):
    report = check_aggregates(build_spec(), aggregates)
    assert not report.ok
    (problem,) = report.all_problems()
    with pytest.raises(ReleaseInputError) as refused:
        prepare_inputs(build_spec(), aggregates)
    assert str(refused.value) == (f"aggregate {problem.aggregate!r}: " if problem.aggregate else "") + problem.message


def test_check_aggregates_counts_what_the_release_handles_silently(build_spec):
    """Counts from reasoning on the rows below (public keys 'a', 1, '2024-01-31', '2024-01-31T12:00:00')."""
    spec = build_spec("mean", non_finite={"nan": "drop", "infinity": "clamp"})
    rows = [
        {"k": "a", "sum": Decimal("4.5"), "count": 2.5},             # float count read, non-integer (-> 3)
        {"k": 1, "sum": None, "count": 2},                           # None sum: nan policy drop -> row dropped
        {"k": "2024-01-31", "sum": Decimal("Infinity"), "count": 1},  # clamped to the saturation limit
        {"k": "unlisted", "sum": 1, "count": 1},                     # outside the public domain
        {"k": None, "sum": 1, "count": 1},                           # a NULL key is outside it too
        {"k": "unlisted", "sum": 1, "count": 1},                     # the same example is kept once
        {"k": "2024-01-31T12:00:00", "sum": 500, "count": -4},       # negative count and a sum beyond the bounds
    ]
    seen = check_aggregates(spec, {"x": rows}).aggregates["x"]
    assert seen.rows == 7
    assert seen.partitions == 3  # 'a', '2024-01-31', '2024-01-31T12:00:00' (key 1's only row was dropped)
    assert seen.rows_outside_domain == 3
    assert seen.outside_domain_examples == [["unlisted"], [None]]
    assert seen.rows_dropped == 1
    assert {f: dict(c) for f, c in seen.special_values.items()} == {"sum": {"null": 1, "infinity": 1}}
    assert dict(seen.float_values) == {"count": 1}
    assert dict(seen.non_integer_counts) == {"count": 1}
    # centred at 5, half range 5: count -4 -> 0 (clamped); '2024-01-31' sum +2^61 (clamp policy) - 5 N, N = 1,
    # clamped into [-5, 5]; '...T12:00:00' sum 500 - 5 * 0 clamped into [0, 0]; 'a' 4.5 - 5 * 3 is inside [-15, 15]
    assert dict(seen.clamped) == {"count": 1, "sum": 2}
    assert seen.problems == [] and seen.problem_count == 0


def test_saturated_partitions_are_counted(build_spec):
    rows = [{"k": "a", "count": 2**63}, {"k": 1, "count": SATURATION - 1}]
    seen = check_aggregates(build_spec(), {"x": rows}).aggregates["x"]
    assert dict(seen.saturated) == {"count": 1}


def test_the_report_examples_are_capped_and_problems_kept_up_to_a_limit(build_spec):
    from dp_operators.release.diagnostics import EXAMPLE_KEYS, KEPT_PROBLEMS

    rows = [{"k": f"other-{i}", "count": 1} for i in range(50)] + [{"k": "a", "count": "x"}] * 30
    seen = check_aggregates(build_spec(), {"x": rows}).aggregates["x"]
    assert seen.rows_outside_domain == 50 and len(seen.outside_domain_examples) == EXAMPLE_KEYS == 10
    assert seen.problem_count == 30 and len(seen.problems) == KEPT_PROBLEMS == 20
    assert [p.row for p in seen.problems] == list(range(50, 70))


def test_the_report_is_plain_json_and_says_what_it_holds(build_spec):
    report = check_aggregates(build_spec(selection=True), {"x": [{"k": None, "count": float("nan")}]})
    document = json.loads(json.dumps(report.as_dict(), allow_nan=False))
    assert document["notice"].startswith("Exact, data-derived numbers")
    assert document["ok"] is True
    assert document["aggregates"]["x"]["special_values"] == {"count": {"nan": 1}}


def test_the_report_withholds_its_content_from_repr_and_str(build_spec):
    """An accidental ``log.info("%s", report)`` must show no number from the data."""
    report = check_aggregates(build_spec(), {"x": [{"k": "unlisted-77", "count": 12345}, {"k": "a", "count": "9"}]})
    withheld = "DiagnosticsReport(release='input_types', <data-derived content withheld; see as_dict()>)"
    assert repr(report) == str(report) == f"{report}" == withheld
    assert repr(report.aggregates["x"]) == "AggregateDiagnostics(<data-derived content withheld; see as_dict()>)"
    assert repr(report.all_problems()) == "[InputProblem(<withheld>)]"


def test_the_callback_gets_the_same_report_as_check_aggregates_before_the_reservation(build_spec, approx_ledger,
                                                                                     release_key):
    spec = build_spec("sum", selection=True)
    aggregates = {"x": [{"k": "a", "sum": 3, "units": 40}, {"k": "b", "sum": None, "units": 2.5}]}
    received = []

    def receive(report: DiagnosticsReport) -> None:
        assert list(approx_ledger.charges()) == []  # called before anything is reserved
        received.append(report)

    run_release(spec, aggregates, approx_ledger, release_key(), spec_hash="0" * 64, diagnostics=receive)
    (report,) = received
    assert report.as_dict() == check_aggregates(spec, aggregates).as_dict()
    assert [charge["state"] for charge in approx_ledger.charges()] == ["committed"]


def test_the_callback_is_called_when_the_release_is_refused(build_spec, approx_ledger, release_key, tmp_path):
    received = []
    with pytest.raises(ReleaseInputError):
        run_release(build_spec(), {"x": [{"k": "a", "count": 1}, {"k": "a", "count": "2"}]}, approx_ledger,
                    release_key(), spec_hash="0" * 64, diagnostics=received.append)
    (report,) = received
    assert [(p.row, p.field) for p in report.all_problems()] == [(1, "count")]

    from support import make_ledger

    exhausted = make_ledger(tmp_path / "small.db", accountant="pure_dp", cap="0.5", dags=["input_types"],
                            account="acct")
    received.clear()
    with pytest.raises(BudgetExhaustedError):
        run_release(build_spec(), {"x": [{"k": "a", "count": 1}]}, exhausted, release_key(), spec_hash="0" * 64,
                    diagnostics=received.append)
    assert len(received) == 1 and received[0].ok


def test_the_callback_is_not_called_on_a_replay(build_spec, approx_ledger, release_key):
    received = []
    for _ in range(2):
        run_release(build_spec(), {"x": [{"k": "a", "count": 1}]}, approx_ledger, release_key(), spec_hash="0" * 64,
                    diagnostics=received.append)
    assert len(received) == 1


def test_diagnostics_change_nothing_in_the_logs(build_spec, observe):
    """With or without the callback, on neighbouring inputs, the release logs nothing."""
    spec = build_spec()
    records = []
    for rows in ([{"k": "a", "count": 3}], [{"k": "a", "count": 3}, {"k": "unlisted", "count": float("nan")}]):
        for callback in (None, lambda report: None):
            error, logged, _, _ = observe(spec, {"x": rows}, diagnostics=callback)
            assert error is None
            records.append(logged)
    assert records == [[], [], [], []]


def test_a_check_logs_nothing(build_spec, caplog):
    with caplog.at_level(logging.DEBUG):
        check_aggregates(build_spec(), {"x": [{"k": "unlisted", "count": float("nan")}, {"k": "a", "count": "x"}]})
    assert caplog.records == []


def test_check_aggregates_is_exported_from_the_package_and_the_api():
    import dp_operators
    import dp_operators.api

    assert dp_operators.check_aggregates is dp_operators.api.check_aggregates is check_aggregates


def test_partitions_above_the_declared_row_bound_are_reported_never_refused(build_spec):
    """The float allowance and the saturation check rest on ``upstream.max_rows``; a count above it is a broken
    declaration the data owner must see (in the report only: a release never refuses on a data value)."""
    spec = build_spec("mean", upstream={"arithmetic": "binary64", "max_rows": 10})
    rows = [{"k": "a", "sum": 50.0, "count": 11}, {"k": 1, "sum": 5.0, "count": 10}]
    report = check_aggregates(spec, {"x": rows})
    assert report.ok
    assert report.aggregates["x"].partitions_over_max_rows == 1
    assert report.as_dict()["aggregates"]["x"]["partitions_over_max_rows"] == 1
    prepare_inputs(spec, {"x": rows})  # no exception


def test_check_aggregates_takes_the_spec_path(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "version: 1\nrelease: r\nbudget_account: acct\nprivacy_unit: person\naggregates:\n"
        "  - {name: x, kind: count, mechanism: discrete_laplace, budget: {epsilon: 1}}\n"
    )
    assert check_aggregates(path, {"x": 3}).ok
    assert check_aggregates(str(path), {"x": "three"}).ok is False


def test_an_undeliverable_report_does_not_hide_the_input_error(build_spec, approx_ledger, release_key, caplog):
    """A refused input is the error the user must see (and a permanent one); a failing report writer must not
    replace it with its own, retryable, error."""

    def unwritable(report):
        raise PermissionError("read-only folder")

    with caplog.at_level(logging.DEBUG), pytest.raises(ReleaseInputError):
        run_release(build_spec(), {"x": [{"k": "a", "count": "3"}]}, approx_ledger, release_key(),
                    spec_hash="0" * 64, diagnostics=unwritable)
    assert [r.getMessage() for r in caplog.records] == ["the diagnostics report could not be delivered: PermissionError"]
    assert list(approx_ledger.charges()) == []
