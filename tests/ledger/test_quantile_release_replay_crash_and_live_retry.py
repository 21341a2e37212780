"""Replay and idempotence of quantile releases against the ledger (both backends): a retry replays, a mapped
release is charged per map index, a crash inside the exponential mechanism's draw keeps the charge spent and never
publishes, a crash before any draw gives the budget back, and a live second try of the key while the first draws
is refused without a charge. (Review of ADR 37: these hold; kept as regression tests.)"""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from dp_operators.ledger import LeaseHeldError, ReleaseKey
from dp_operators.release import ReleaseAbortedError, run_release
from dp_operators.spec import ReleaseSpec
from ledger_backends import account_config, ledger_with

DAG = "q"
HIST = [{"x": i, "count": c} for i, c in enumerate([3, 0, 5, 9, 2, 7, 1, 4])]


def _spec(levels=("0.25", "0.75")) -> ReleaseSpec:
    return ReleaseSpec.model_validate({
        "version": 1, "release": "qs", "budget_account": "acct", "privacy_unit": "person",
        "aggregates": [{"name": "x", "kind": "quantile", "quantiles": list(levels),
                        "bins": {"column": "x", "edges": [0, 8], "width": 1},
                        "mechanism": "exponential", "budget": {"epsilon": "2/5"}}]})


def _key(map_index: int = -1, run: str = "r1") -> ReleaseKey:
    return ReleaseKey(DAG, run, "release", map_index, "qs")


@pytest.fixture
def ledger(ledger_url):
    return ledger_with(ledger_url, acct=account_config("zcdp", cap=1, delta="1e-6", dags=(DAG,)))


CHARGE = 2 * Fraction(1, 5) ** 2 / 8  # two levels at epsilon 1/5 each, bounded range


def test_a_retry_replays_and_a_mapped_release_is_charged_per_map_index(ledger):
    first = run_release(_spec(), {"x": HIST}, ledger, _key(), spec_hash="0" * 64)
    again = run_release(_spec(), {"x": HIST}, ledger, _key(), spec_hash="0" * 64)
    assert again.replayed and again.output == first.output
    assert ledger.account("acct").spent == CHARGE
    for index in (0, 1):
        run_release(_spec(), {"x": HIST}, ledger, _key(index), spec_hash="0" * 64)
    assert ledger.account("acct").spent == 3 * CHARGE
    assert sorted(c["map_index"] for c in ledger.charges()) == [-1, 0, 1]


def test_a_crash_inside_the_draw_stays_spent_and_a_retry_is_charged_again(ledger, monkeypatch):
    import dp_operators.release.quantiles as quantiles  # the release calls the sampler through this module

    real = quantiles.sample_exponential_mechanism
    calls = []

    def dies_on_the_second_level(distances, gamma):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("worker lost mid-draw")
        return real(distances, gamma)

    monkeypatch.setattr(quantiles, "sample_exponential_mechanism", dies_on_the_second_level)
    with pytest.raises(ReleaseAbortedError) as aborted:
        run_release(_spec(), {"x": HIST}, ledger, _key(), spec_hash="0" * 64)
    assert aborted.value.budget_returned is False
    assert [c["state"] for c in ledger.charges()] == ["abandoned"]
    assert ledger.stored_output(_key()) is None  # nothing from the broken attempt is kept or published
    monkeypatch.setattr(quantiles, "sample_exponential_mechanism", real)
    result = run_release(_spec(), {"x": HIST}, ledger, _key(), spec_hash="0" * 64)
    assert not result.replayed
    assert ledger.account("acct").spent == 2 * CHARGE  # the abandoned attempt's draw stays paid for


def test_a_failure_before_any_draw_returns_the_budget(ledger, monkeypatch):
    import dp_operators.release.quantiles as quantiles  # the release calls the sampler through this module

    def fails(*_args):
        raise RuntimeError("before the sampler")

    monkeypatch.setattr(quantiles, "quantile_rank_distances", fails)
    with pytest.raises(ReleaseAbortedError) as aborted:
        run_release(_spec(), {"x": HIST}, ledger, _key(), spec_hash="0" * 64)
    assert aborted.value.budget_returned is True
    assert ledger.account("acct").spent == 0


def test_a_live_second_try_while_the_first_draws_is_not_charged(ledger, monkeypatch):
    import dp_operators.release.quantiles as quantiles  # the release calls the sampler through this module

    real = quantiles.sample_exponential_mechanism
    drawing, finish = threading.Event(), threading.Event()

    def slow(distances, gamma):
        drawing.set()
        assert finish.wait(30)
        return real(distances, gamma)

    monkeypatch.setattr(quantiles, "sample_exponential_mechanism", slow)
    results: list = []
    first = threading.Thread(target=lambda: results.append(
        run_release(_spec(("0.5",)), {"x": HIST}, ledger, _key(), spec_hash="0" * 64)))
    first.start()
    assert drawing.wait(30)
    with pytest.raises(LeaseHeldError):
        run_release(_spec(("0.5",)), {"x": HIST}, ledger, _key(), spec_hash="0" * 64)
    finish.set()
    first.join(30)
    assert results and not results[0].replayed
    assert len(list(ledger.charges())) == 1 and ledger.account("acct").spent == Fraction(1, 5) ** 2 * 4 / 8
    replay = run_release(_spec(("0.5",)), {"x": HIST}, ledger, _key(), spec_hash="0" * 64)
    assert replay.replayed and replay.output == results[0].output


# -- groups found in the data (partition selection) ------------------------------------------------------------------

SELECTED_HIST = [{"g": g, "x": i, "count": c} for g in ("a", "b")
                 for i, c in enumerate([30, 0, 50, 90, 20, 70, 10, 40])]


def _selected_spec() -> ReleaseSpec:
    return ReleaseSpec.model_validate({
        "version": 1, "release": "qs", "budget_account": "acct", "privacy_unit": "person",
        "aggregates": [{"name": "x", "kind": "median", "group_by": ["g"],
                        "partition_selection": {"budget": {"epsilon": 1, "delta": "1e-6"}},
                        "bins": {"column": "x", "edges": [0, 8], "width": 1},
                        "mechanism": "exponential", "budget": {"epsilon": "2/5"}}]})


@pytest.fixture
def approx_ledger(ledger_url):
    return ledger_with(ledger_url, acct=account_config("approx_dp", epsilon=10, delta="1e-3", dags=(DAG,)))


def test_a_crash_in_the_group_selection_stays_spent_and_a_retry_replays_the_whole_release(approx_ledger,
                                                                                          monkeypatch):
    from dp_operators.release.plan import NoiseStep

    real = NoiseStep.draw

    def dies(self, *args, **kwargs):
        raise RuntimeError("worker lost while selecting the groups")

    monkeypatch.setattr(NoiseStep, "draw", dies)
    with pytest.raises(ReleaseAbortedError) as aborted:
        run_release(_selected_spec(), {"x": SELECTED_HIST}, approx_ledger, _key(), spec_hash="0" * 64)
    assert aborted.value.budget_returned is False  # the selection's noise may exist: its charge stays
    assert approx_ledger.stored_output(_key()) is None
    monkeypatch.setattr(NoiseStep, "draw", real)
    first = run_release(_selected_spec(), {"x": SELECTED_HIST}, approx_ledger, _key(), spec_hash="0" * 64)
    rows = first.output["aggregates"]["x"]["rows"]
    assert [row["g"] for row in rows] == ["a", "b"]  # 310 records each: far above the threshold
    again = run_release(_selected_spec(), {}, approx_ledger, _key(), spec_hash="0" * 64)
    assert again.replayed and again.output == first.output
    assert approx_ledger.account("acct").spent == 2 * (1 + Fraction(2, 5))
