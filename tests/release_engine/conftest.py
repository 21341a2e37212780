"""Fixtures for the release-engine input tests: a spec builder, an approx_dp ledger, and an observer that runs a
release and returns everything it shows other than the noised values (exception text, log records)."""

from __future__ import annotations

import logging
from fractions import Fraction
from pathlib import Path

import pytest

from dp_operators.ledger import AccountConfig, Ledger, LedgerConfig, ReleaseKey  # noqa: F401
from dp_operators.release import run_release
from dp_operators.spec import ReleaseSpec
from support import make_ledger

DAG = "input_types"
PUBLIC_KEYS = ["a", 1, "2024-01-31", "2024-01-31T12:00:00"]


def _build_spec(kind: str = "count", *, selection: bool = False, per_partition: int = 1, **extra) -> ReleaseSpec:
    """One aggregate ``x`` grouped by ``k``: over PUBLIC_KEYS, or under partition selection (threshold 28 for the
    default budgets); sums and means get bounds [0, 10] and grid 1/2 unless ``extra`` says otherwise."""
    aggregate = {"name": "x", "kind": kind, "group_by": ["k"], "mechanism": "discrete_laplace",
                 "budget": {"epsilon": 1}, "contribution": {"max_contributions_per_partition": per_partition}}
    if kind != "count":
        aggregate.update(bounds=[0, 10], grid="1/2")
    if selection:
        aggregate["partition_selection"] = {"mechanism": "discrete_laplace", "budget": {"epsilon": 1, "delta": 1e-6}}
    else:
        aggregate["keys"] = {"k": PUBLIC_KEYS}
    aggregate.update(extra)
    return ReleaseSpec.model_validate({"version": 1, "release": "input_types", "budget_account": "acct",
                                       "privacy_unit": "person", "aggregates": [aggregate]})


def _make_approx_ledger(path: Path) -> Ledger:
    return make_ledger(path, cap="1000", accountant="approx_dp", dags=(DAG,), account="acct", delta=Fraction(1, 1000))


def _release_key(run: str = "run-1") -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id=run, task_id="release", map_index=-1, release_name="input_types")


@pytest.fixture
def build_spec():
    """The spec builder (a fixture, so that test modules need not import this conftest)."""
    return _build_spec


@pytest.fixture
def release_key():
    return _release_key


@pytest.fixture
def public_keys():
    return list(PUBLIC_KEYS)


@pytest.fixture
def approx_ledger(tmp_path: Path) -> Ledger:
    return _make_approx_ledger(tmp_path / "approx.db")


@pytest.fixture
def observe(tmp_path: Path, caplog):
    """``observe(spec, aggregates)`` runs a release on a fresh ledger and returns ``(exception text or None, log
    records as (logger, level, message), charges, output)``: what anyone reading the task log or the ledger
    could see."""
    runs = iter(range(10**6))

    def run(spec: ReleaseSpec, aggregates, **kwargs):
        ledger = _make_approx_ledger(tmp_path / f"observed-{next(runs)}.db")
        caplog.clear()
        error, output = None, None
        with caplog.at_level(logging.DEBUG):
            try:
                output = run_release(spec, aggregates, ledger, _release_key(), spec_hash="0" * 64, **kwargs).output
            except Exception as caught:  # noqa: BLE001 - the text is what is compared
                error = f"{type(caught).__name__}: {caught}"
        records = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        return error, records, list(ledger.charges()), output

    return run


def _xy_spec(kind: str = "sum", *, grid: str | None = None, bounds=(-50, 100), non_finite: dict | None = None,
             selection: bool = False, sampler: str | None = None, release: str = "xy") -> ReleaseSpec:
    """One aggregate ``agg`` grouped by an int column ``x`` (public keys 0..3) and a text column ``y`` (a, b), or
    under partition selection; discrete Laplace at epsilon 1, one contribution per person."""
    aggregate: dict = {"name": "agg", "kind": kind, "group_by": ["x", "y"], "mechanism": "discrete_laplace",
                       "budget": {"epsilon": 1}}
    if kind != "count":
        aggregate["bounds"] = list(bounds)
    if grid is not None:
        aggregate["grid"] = grid
    if non_finite is not None:
        aggregate["non_finite"] = non_finite
    if selection:
        aggregate["partition_selection"] = {"mechanism": "discrete_laplace", "budget": {"epsilon": 1, "delta": 1e-6}}
    else:
        aggregate["keys"] = {"x": [0, 1, 2, 3], "y": ["a", "b"]}
    document = {"version": 1, "release": release, "budget_account": "acct", "privacy_unit": "person",
                "contribution": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                "aggregates": [aggregate]}
    if sampler is not None:
        document["sampler"] = sampler
    return ReleaseSpec.model_validate(document)


@pytest.fixture
def xy_spec():
    """The builder of a count or sum grouped by ``x`` (int) and ``y`` (text) (a fixture, so that test modules need
    not import this conftest)."""
    return _xy_spec
