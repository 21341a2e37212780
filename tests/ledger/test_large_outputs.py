"""Committed outputs of millions of JSON values: verify and the dashboard read them in memory that does not grow with
the values (docs/ledger.md, "Hostile rows"; :mod:`dp_operators.ledger.bounded`).

A text with more than ``MAX_PARSED_VALUES`` brackets, braces and commas is read as a stream of parser events
(ijson) instead of ``json.loads``: it must accept and refuse exactly what ``read_json`` does, for the same reasons,
whatever order texts come in (a parse left unfinished must not harm the next one); verify must still name an
unreadable long output by table, row and column, and check a readable one's digest; the dashboard shows the first
values of a long output's aggregates, and says an output is too large to show rather than build it.
"""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import tracemalloc
from fractions import Fraction

import pytest
import sqlalchemy as sa

from dp_operators.dashboard import queries
from dp_operators.ledger import LedgerConfig, ReleaseKey, bounded, schema
from dp_operators.ledger.bounded import (
    MAX_OUTPUT_CHARS,
    BoundsError,
    CutList,
    TooManyValuesError,
    check_json,
    few_json_values,
    read_json,
    read_json_cut,
)
from dp_operators.ledger.verify import OUTPUT_BATCH_CHARS
from ledger_backends import account_config
from support import governor, spender

#: Two million empty objects: 6 MB of text, hundreds of MB as Python values.
EMPTIES = "[" + "{}," * 1_999_999 + "{}]"
MANY = "[" + "0," * 150_000  # a prefix of many values, then what makes the text unreadable (or not)

#: Texts and whether read_json accepts them; each is also read with the stream (MAX_PARSED_VALUES made -1).
TEXTS = [
    "[" * 64 + "]" * 64, "[" * 65 + "]" * 65, "[" * 200_000 + "]" * 200_000, '{"a":' * 65 + "1" + "}" * 65,
    "NaN", "[Infinity]", "[-Infinity]", "[1e999]", "[-1e999]", "[1.8e308]", "[1e308]", "[1.7976931348623157e308]",
    "[1e-99999]", "{", "", " ", "[1,]", "[1] x", '"a\x01"', "01", "[.5]", "\ufeff[1]", '"\\x"', "tru", "true", "null",
    "[" + "1" * 4300 + "]", "[-" + "1" * 4300 + "]", "[" + "1" * 4301 + "]", "[12345678901234567890123]",
    "[12345678901234567890123, 1e999]", "[12345678901234567890123, " + "1" * 5000 + "]",
    '[12345678901234567890123, "' + "1" * 5000 + '"]', "[12345678901234567890123, " + "[" * 70 + "]" * 70 + "]",
    '{"a": [1, 2.5, "x", null, true, false, -0, 1E5, 1e-999, "é日本\\u202e"], "a": {}}', '"' + "x" * 70_000 + '"',
    MANY + "0]", MANY + "NaN]", MANY + "[" * 65 + "]" * 65 + "]", MANY + "1e999]", MANY + "9" * 5000 + "]",
    # lone surrogate escapes (refused), pairs and escaped backslashes (read)
    '["\\udc00"]', '["\\ud83d"]', '["\\ud83d\\ude00"]', '["\\\\udc00"]', '{"\\udc00": 1}',
    MANY + '"\\udc00"]', MANY + '"\\ud83d\\ude00"]', "[99999999999999999999," + MANY[1:] + '"\\udc00"]',
]


def _outcome(read, text):
    try:
        return "ok", read(text)
    except BoundsError as error:
        return "refused", str(error)


@pytest.mark.parametrize("text", TEXTS, ids=lambda text: f"{text[:24]!r}({len(text)})")
def test_the_stream_accepts_and_refuses_what_read_json_does(text, monkeypatch):
    fast = _outcome(lambda t: read_json(t, max_chars=MAX_OUTPUT_CHARS), text)
    monkeypatch.setattr(bounded, "MAX_PARSED_VALUES", -1)  # every text read as a stream
    checked = _outcome(lambda t: check_json(t, max_chars=MAX_OUTPUT_CHARS), text)
    built = _outcome(lambda t: read_json_cut(t, cut_at=("a",), keep=None, max_values=10**7), text)
    assert fast[0] == checked[0] == built[0], (fast, checked, built)
    if fast[0] == "ok":
        assert built[1] == fast[1]
    else:  # the same reason in words; the parser's message (which quotes the text) is never shown
        reason = fast[1].split(" (invalid at")[0]
        if "NaN" in reason or "Infinity" in reason:
            reason = "is not JSON text"
        elif "beyond the doubles" in reason:
            reason = "beyond the doubles"
        assert reason in checked[1] and reason in built[1], (fast, checked, built)


def test_a_parse_left_unfinished_never_harms_the_next(monkeypatch):
    """Checks stop at the first problem and leave the parser mid-text; ijson 3.6's C parser could crash on a later
    parse raising inside it (an integer Python refuses to convert). Random orders of every kind of text."""
    monkeypatch.setattr(bounded, "MAX_PARSED_VALUES", -1)
    rng = random.Random(7)
    for _ in range(600):
        text = rng.choice(TEXTS[:36])
        depth = rng.choice([2, 64])
        with contextlib.suppress(BoundsError, TooManyValuesError):
            if rng.random() < 0.5:
                check_json(text, max_chars=MAX_OUTPUT_CHARS, max_depth=depth)
            else:
                read_json_cut(text, cut_at=("aggregates", None, "rows"), keep=rng.choice([None, 1]),
                              max_values=rng.choice([3, 10**6]), max_depth=depth)


def _check_json_peak(text: str) -> int:
    """The peak memory of checking ``text`` (read) and ``text`` with too deep a tail (refused), in bytes."""
    assert not few_json_values(text) and few_json_values('{"rows": [1, 2, 3]}')
    tracemalloc.start()
    try:
        check_json(text, max_chars=MAX_OUTPUT_CHARS)
        with pytest.raises(BoundsError, match="nests deeper than 64 levels"):
            check_json(text[:-1] + "," + "[" * 65 + "]" * 65 + "]", max_chars=MAX_OUTPUT_CHARS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_a_text_of_many_values_is_checked_in_memory_that_does_not_grow_with_them():
    """300,000 empty objects (0.9 MB, read as a stream: past MAX_PARSED_VALUES); two million: the slow test below."""
    peak = _check_json_peak("[" + "{}," * 299_999 + "{}]")
    assert peak < 8 * 2**20, peak  # the text's edited copy and a constant (4 MB, 2026-12-07); json.loads: ~21 MB


@pytest.mark.slow  # 20 s under tracemalloc: the scale (ADR 30); 300,000 values: the test above
def test_a_text_of_millions_of_values_is_checked_in_memory_that_does_not_grow_with_them():
    peak = _check_json_peak(EMPTIES)
    assert peak < 20 * 2**20, peak  # the text (6 MB, one copy with its edit) and a constant; json.loads: ~300 MB


def test_read_json_cut_keeps_the_first_rows_and_counts_them_all():
    output = {"release": "r", "confidence": 0.9, "aggregates": {
        "a": {"kind": "count", "rows": [{"g": i, "value": i + 0.5, "interval": [i, i + 1]} for i in range(50_000)]},
        "b": {"kind": "sum", "value": 3}, "c": {"rows_file": {"uri": "x"}}}}
    text = json.dumps(output)
    assert not few_json_values(text)
    for source in (text, json.dumps({**output, "aggregates": {**output["aggregates"], "a": {
            "kind": "count", "rows": output["aggregates"]["a"]["rows"][:10]}}})):  # the stream, then json
        read = read_json_cut(source, cut_at=("aggregates", None, "rows"), keep=3, max_values=1000)
        rows = read["aggregates"]["a"]["rows"]
        assert isinstance(rows, CutList) and rows == output["aggregates"]["a"]["rows"][:3]
        assert rows.total == (50_000 if source is text else 10)
        assert read["aggregates"]["b"] == {"kind": "sum", "value": 3} and read["confidence"] == 0.9
    whole = read_json_cut(text, cut_at=("aggregates", None, "rows"), keep=None, max_values=10**6)
    assert whole == output
    with pytest.raises(TooManyValuesError):
        read_json_cut(text, cut_at=("aggregates", None, "rows"), keep=None, max_values=1000)


# -- verify and the dashboard on a ledger ---------------------------------------------------------------------------


@pytest.fixture
def ledger(ledger_url):
    officer = governor(ledger_url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={"a": account_config("pure_dp", cap=10)}))
    return ledger_url


def _commit(url: str, run: str, output) -> int:
    worker = spender(url)
    reservation = worker.reserve(ReleaseKey("d", run, "t", -1, "r"), account="a", amount=Fraction(1, 100),
                                 mechanisms=[], spec_hash="0" * 64)
    worker.commit(reservation, output)
    return reservation.charge_id


def _set_output(url: str, charge_id: int, text: str) -> None:
    """As the tables' owner, past the guard triggers."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "sqlite":
                names = [name for (name,) in conn.exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE type = 'trigger'")]
                for name in names:
                    conn.exec_driver_sql(f"DROP TRIGGER {name}")
            else:
                conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            conn.execute(schema.charges.update().where(schema.charges.c.id == charge_id).values(output=text))
            if engine.dialect.name == "sqlite":
                for statement in schema.trigger_ddl("sqlite"):
                    conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_verify_checks_long_outputs_one_at_a_time_and_names_an_unreadable_one(ledger):
    """Short and long outputs interleaved (long ones are fetched from a stream of their own): readable ones verify,
    digests included; an unreadable long one is named by table, row and column; an empty one too."""
    rows = {"aggregates": {"n": {"kind": "count", "rows": [{"g": i, "value": i} for i in range(40_000)]}}}
    ids = [_commit(ledger, "short-1", {"value": 1}), _commit(ledger, "long-1", rows),
           _commit(ledger, "empties", [{} for _ in range(200_000)]), _commit(ledger, "short-2", {"value": 2}),
           _commit(ledger, "long-2", rows), _commit(ledger, "empty", {"value": 3})]
    assert len(json.dumps(rows)) > OUTPUT_BATCH_CHARS
    assert governor(ledger).verify().ok
    _set_output(ledger, ids[2], "[" + "{}," * 200_000 + "NaN]")
    _set_output(ledger, ids[4], json.dumps(rows).replace('"value": 39999', '"value": 1e999'))
    _set_output(ledger, ids[5], "")
    problems = governor(ledger).verify().problems
    for charge_id, reason in ((ids[2], "is not JSON text"), (ids[4], "beyond the doubles"),
                              (ids[5], "is not JSON text")):
        assert any(p.startswith(f"dp_charges id={charge_id} (") and "output is not JSON text the ledger writes: it"
                   in p and reason in p for p in problems), (charge_id, problems)
    assert not any(p.startswith(f"dp_charges id={charge_id} (") for charge_id in (ids[0], ids[1], ids[3])
                   for p in problems), problems


def test_the_dashboard_shows_the_first_values_of_a_long_output_and_refuses_to_build_a_huge_one(ledger):
    rows = [{"g": f"k{i}", "value": i, "half_width": 1.5} for i in range(60_000)]
    charge = _commit(ledger, "long", {"confidence": 0.95, "aggregates": {"n": {"kind": "count", "group_by": ["g"],
                                                                             "rows": rows}}})
    release = queries.release_detail(ledger, charge, limit=5)
    (aggregate,) = release["aggregates"]
    assert aggregate["values_total"] == 60_000 and [value["value"] for value in aggregate["values"]] == list(range(5))
    assert release["output"]["aggregates"]["n"]["rows"] == rows[:5] and release["output_complete"] is False
    assert "unreadable" not in release and "output_too_large" not in release
    whole = queries.release_detail(ledger, charge)
    assert whole["output_complete"] is True and whole["output"]["aggregates"]["n"]["rows"] == rows

    huge = _commit(ledger, "huge", {"value": 1})
    _set_output(ledger, huge, EMPTIES)  # as the owner: the test process never builds its two million objects
    tracemalloc.start()
    try:
        release = queries.release_detail(ledger, huge, limit=5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert release["output_too_large"] is True and release["output"] is None and release["aggregates"] == []
    assert release["output_complete"] is False and "unreadable" not in release
    assert peak < 100 * 2**20, peak  # the text and at most MAX_SHOWN_OUTPUT_VALUES values; whole: ~300 MB

    _set_output(ledger, huge, "[" + "{}," * 2_000 + "[" * 65 + "]" * 65 + "]")
    assert queries.release_detail(ledger, huge, limit=5)["unreadable"] == ["output nests deeper than 64 levels"]
