"""A DAG id allowed on accounts of two teams lets each commit the same release key on its own account. One team's
committed output must never stand for the other's: not in `dpctl release verify`'s verdict on a published file,
nor in the budget gate's "already committed: a replay" answer."""

from __future__ import annotations

from fractions import Fraction

import pytest
from airflow.sdk import ObjectStoragePath

from dp_operators.ledger import AmbiguousReleaseKeyError, ReleaseKey
from dp_operators.operators.locations import release_file
from dp_operators.operators.sinks import release_json
from dp_operators.operators.verification import DIFFERS, MATCHES, verify_published
from ledger_backends import account_config, ledger_with

KEY = ReleaseKey("shared_dag", "run-1", "release", -1, "counts")


def _commit(ledger, account: str, output: dict) -> None:
    reservation = ledger.reserve(KEY, account=account, amount=Fraction(1, 10), mechanisms=[], spec_hash="0" * 64)
    ledger.commit(reservation, output)


def _output(account: str, value: int) -> dict:
    return {"release_key": KEY.as_dict(), "budget_account": account, "aggregates": {"n": {"value": value}}}


@pytest.fixture
def ledger(tmp_path):
    dags = ("shared_dag",)
    return ledger_with(f"sqlite:///{tmp_path / 'ledger.db'}", a=account_config("pure_dp", cap=1, dags=dags),
                       b=account_config("pure_dp", cap=1, dags=dags))


def test_a_key_committed_on_two_accounts_is_looked_up_on_the_named_account(ledger):
    _commit(ledger, "a", _output("b", 666))  # team A, on its own account, claiming to be B's release
    assert ledger.stored_output(KEY, "b") is None  # B's own budget gate: nothing committed on b yet
    assert ledger.stored_output(KEY) == _output("b", 666)  # one account holds it: no ambiguity
    _commit(ledger, "b", _output("b", 1))
    assert ledger.stored_output(KEY, "b") == _output("b", 1)
    assert ledger.stored_output(KEY, "a") == _output("b", 666)
    with pytest.raises(AmbiguousReleaseKeyError, match="committed on accounts 'a', 'b'"):
        ledger.stored_output(KEY)


def test_release_verify_compares_a_file_with_the_account_it_states(ledger, tmp_path):
    _commit(ledger, "a", _output("b", 666))
    _commit(ledger, "b", _output("b", 1))
    base = f"file://{tmp_path / 'out'}"
    genuine = release_file(base, KEY, "json")
    genuine.parent.mkdir(parents=True, exist_ok=True)
    genuine.write_text(release_json(_output("b", 1)))
    [verdict] = verify_published([genuine], ledger.stored_output, base)
    assert verdict.verdict == MATCHES, verdict
    genuine.write_text(release_json(_output("b", 666)))  # A's output, published as B's: checked against B's
    [verdict] = verify_published([ObjectStoragePath(str(genuine))], ledger.stored_output, base)
    assert verdict.verdict == DIFFERS, verdict
