"""``dpctl ledger history`` (and the reconcile table): filters, pages, JSON lines of nested JSON, and tables that
show every charge's release key in full at any terminal width, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from cli_ledger_support import (  # noqa: F401  (fixtures)
    CONFIG,
    DPCTL,
    MECHANISMS,
    applied,
    charge,
    config,
    dpctl,
    officer_keys,
)
from dp_operators.cli import charges as charges_cli
from dp_operators.ledger import Ledger
from ledger_backends import SQLITE_FAST
from ledger_backends import ledger_url, pg_database  # noqa: F401  (fixtures)
from support import spender

#: Run ids as ``make demo`` makes them: five runs differ only after the 28th character.
DEMO_RUNS = [f"manual__2026-11-30T16:05:0{i}.123456+00:00" for i in range(5)]
WIDTHS = [pytest.param(80, id="80 columns"), pytest.param(160, id="160 columns")]
# The tables drawn in a real terminal (a dpctl process each, 2 s) are SQLITE_FAST: the rows they draw are read on both
# databases by the tests in-process (history here, reconcile in test_cli_ledger.py).


@pytest.fixture
def demo_ledger(ledger_url, config) -> str:
    """A ledger holding the demo's five charges: DAG adult_census_release, task release, one charge a run."""
    config.write_text(CONFIG.replace("allowed_dags: [d]\n  survey", "allowed_dags: [d, adult_census_release]\n  survey"))
    assert dpctl("ledger", "init", "--url", ledger_url).exit_code == 0
    result = dpctl("ledger", "apply", str(config), "--url", ledger_url)
    assert result.exit_code == 0, result.output
    ledger = spender(ledger_url)
    for run in DEMO_RUNS:
        charge(ledger, run, dag="adult_census_release", task="release", release="adult_census_statistics")
    return ledger_url


def dpctl_in_terminal(columns: int, *args: str) -> subprocess.CompletedProcess:
    """``dpctl *args`` as a real process whose output is ``columns`` wide (``COLUMNS``, as a terminal sets it)."""
    done = subprocess.run([str(DPCTL), *args], env={**os.environ, "COLUMNS": str(columns)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def nested_json_strings(value, path: str = "") -> list[str]:
    """Paths of the strings in ``value`` that are themselves a JSON object or array."""
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in nested_json_strings(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in nested_json_strings(item, f"{path}[{i}]")]
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return []
        return [path] if isinstance(parsed, (dict, list)) else []
    return []


def test_history_filters_and_prints_json_lines(applied):
    result = dpctl("ledger", "history", "--url", applied, "--account", "census", "--json")
    assert result.exit_code == 0
    charges = [json.loads(line) for line in result.stdout.splitlines()]
    assert [c["run_id"] for c in charges] == ["run-0", "run-1"]
    assert "output" not in charges[0] and "token_hash" not in charges[0]
    assert dpctl("ledger", "history", "--url", applied, "--since", "2999-01-01", "--json").output == ""
    bad = dpctl("ledger", "history", "--url", applied, "--since", "yesterday")
    assert bad.exit_code == 2


@pytest.mark.parametrize("as_json", [pytest.param(True, id="json lines"), pytest.param(False, id="table")])
def test_history_pages_with_limit_and_after_without_duplicates_or_gaps(applied, as_json):
    ledger = spender(applied)
    for run in range(2, 9):
        charge(ledger, f"run-{run}", commit=run % 2 == 0)
    expected = [c["id"] for c in Ledger(applied).charges()]
    assert len(expected) == 9
    seen: list[int] = []
    after: list[str] = []
    pages = 0
    while True:
        result = dpctl("ledger", "history", "--url", applied, "--limit", "4", *after, *(["--json"] if as_json else []))
        assert result.exit_code == 0, result.output
        pages += 1
        if as_json:
            ids = [json.loads(line)["id"] for line in result.stdout.splitlines()]
        else:
            ids = [int(m) for m in re.findall(r"^\W*(\d+)\s*\W", result.stdout, flags=re.MULTILINE)]
            assert "Charges" in result.stdout  # a page is small enough for a table
        assert 0 < len(ids) <= 4
        seen += ids
        more = re.fullmatch(r"more: --after (\d+)", result.stderr.strip())
        if more is None:
            assert result.stderr == ""
            break
        assert int(more.group(1)) == ids[-1]
        after = ["--after", more.group(1)]
    assert seen == expected and pages == 3
    # a page that ends exactly at the last charge says nothing more follows
    exact = dpctl("ledger", "history", "--url", applied, "--limit", "9", "--json")
    assert len(exact.stdout.splitlines()) == 9 and exact.stderr == ""
    last = dpctl("ledger", "history", "--url", applied, "--after", str(expected[-1]), "--json")
    assert last.exit_code == 0 and last.stdout == ""


def test_a_long_history_streams_as_aligned_lines(applied, monkeypatch):
    monkeypatch.setattr(charges_cli, "HISTORY_TABLE_ROWS", 1)
    result = dpctl("ledger", "history", "--url", applied)
    assert result.exit_code == 0, result.output
    header, *lines = result.stdout.splitlines()
    assert header.split() == list(charges_cli.HISTORY_COLUMNS)
    assert [line.split()[3] for line in lines] == ["run-0", "run-1"]
    assert len({line.index("census") for line in lines}) == 1  # aligned under the header
    assert lines[0].index("census") == header.index("account")


def test_history_state_must_be_a_known_state(applied):
    result = dpctl("ledger", "history", "--url", applied, "--state", "bogus")
    assert result.exit_code == 2
    for state in ("reserved", "committed", "released", "abandoned"):
        assert state in result.output
    result = dpctl("ledger", "history", "--url", applied, "--state", "committed", "--json")
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 2


@pytest.mark.parametrize("columns", WIDTHS)
@SQLITE_FAST
def test_the_history_table_shows_each_run_id_in_full(demo_ledger, columns):
    """Five charges whose run ids share their first 28 characters: each id is printed whole, once, and the table
    fits the terminal (a table that cut the ids printed five identical keys)."""
    table = dpctl_in_terminal(columns, "ledger", "history", "--url", demo_ledger).stdout
    for run in DEMO_RUNS:
        assert table.count(run) == 1, table
    assert table.count("adult_census_statistics") == len(DEMO_RUNS)
    assert table.count("committed") == len(DEMO_RUNS) and table.count("attempt 1") == len(DEMO_RUNS)
    assert max(len(line) for line in table.splitlines()) <= columns and "…" not in table
    ids = [c["id"] for c in Ledger(demo_ledger).charges()]
    assert [int(m) for m in re.findall(r"^\W*(\d+)\s*\W", table, flags=re.MULTILINE)] == ids


@pytest.mark.parametrize("columns", WIDTHS)
@SQLITE_FAST
def test_the_reconcile_table_shows_the_run_id_in_full(demo_ledger, columns):
    dead = charge(spender(demo_ledger, lease_seconds=0.001), DEMO_RUNS[0].replace("16:05", "17:05"), commit=False,
                  dag="adult_census_release", task="release", map_index=3, release="adult_census_statistics")
    time.sleep(0.05)
    table = dpctl_in_terminal(columns, "ledger", "reconcile", "--url", demo_ledger).stdout
    assert "Abandoned 1 expired reservation(s)" in table
    assert DEMO_RUNS[0].replace("16:05", "17:05") in table and "release[3]" in table
    assert re.search(rf"^\W*{dead.charge_id}\s*\W", table, flags=re.MULTILINE)
    assert max(len(line) for line in table.splitlines()) <= columns


@SQLITE_FAST
def test_a_run_id_wider_than_the_terminal_folds_instead_of_being_cut(demo_ledger):
    run = "backfill__" + "x" * 90 + "_end"
    charge(spender(demo_ledger), run, dag="adult_census_release", task="release", release="adult_census_statistics")
    table = dpctl_in_terminal(80, "ledger", "history", "--url", demo_ledger).stdout
    key_column = "".join(line.split("│")[2].strip() for line in table.splitlines() if line.count("│") == 5)
    assert run in key_column and "…" not in table
    assert max(len(line) for line in table.splitlines()) <= 80
    assert table.count("committed") == len(DEMO_RUNS) + 1 and "2026-" in table  # the other columns still show


def test_mapped_charges_of_one_run_are_told_apart_by_their_map_index(demo_ledger):
    ledger = spender(demo_ledger)
    for index in range(3):
        charge(ledger, "scheduled__2026-12-01T00:00:00+00:00", dag="adult_census_release", task="release",
               map_index=index, release="adult_census_statistics")
    table = dpctl("ledger", "history", "--url", demo_ledger, "--after", "5").stdout
    assert [table.count(f"release[{index}]") for index in range(3)] == [1, 1, 1]


def test_history_json_nests_json_instead_of_strings_of_json(demo_ledger):
    """--json keeps the documented shape (one object a line, every column but output and token_hash) with the
    columns stored as JSON text (mechanisms, context) nested as JSON, and no value a string holding JSON."""
    result = dpctl("ledger", "history", "--url", demo_ledger, "--json")
    assert result.exit_code == 0, result.output
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    stored = list(Ledger(demo_ledger).charges())
    assert [c["run_id"] for c in printed] == DEMO_RUNS
    assert all(set(c) == set(row) for c, row in zip(printed, stored))
    assert [nested_json_strings(c) for c in printed] == [[]] * len(DEMO_RUNS)
    assert all(c["mechanisms"] == MECHANISMS for c in printed)
    assert [c["context"] for c in printed] == [json.loads(row["context"]) for row in stored]
    assert all(isinstance(c["context"], dict) for c in printed)
    assert all(c["amount"] == "1/400" and c["map_index"] == -1 for c in printed)  # exact numbers stay text


@SQLITE_FAST
def test_a_run_id_that_looks_like_rich_markup_prints_as_it_is(demo_ledger):
    """A run id such as ``[/x] [bold]b[/bold]`` is text in the table, not markup (which would fail to render)."""
    run = "[/x] [bold]b[/bold]"
    charge(spender(demo_ledger), run, dag="adult_census_release", task="release", release="adult_census_statistics")
    table = dpctl_in_terminal(160, "ledger", "history", "--url", demo_ledger).stdout
    assert run in table


@pytest.mark.parametrize("form", ["table", "aligned lines", "json lines"])
def test_a_charge_holding_values_the_ledger_never_writes_prints_as_unreadable(applied, form, monkeypatch):
    """A charge whose amount is ``1e-99999999`` and whose context nests 100,000 deep prints as unreadable, naming
    both columns; the other charges print as usual."""
    import sqlalchemy as sa

    engine = sa.create_engine(applied)
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("DROP TRIGGER dp_charges_guard")
        else:
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        hostile = conn.exec_driver_sql("SELECT max(id) FROM dp_charges").scalar()
        conn.execute(sa.text("UPDATE dp_charges SET amount = :amount, context = :context WHERE id = :id"),
                     {"amount": "1e-99999999", "context": "[" * 100_000 + "]" * 100_000, "id": hostile})
    engine.dispose()
    if form == "table":  # wide enough that no cell folds
        result = dpctl_in_terminal(400, "ledger", "history", "--url", applied)
    else:
        monkeypatch.setattr(charges_cli, "HISTORY_TABLE_ROWS", 1)
        result = dpctl("ledger", "history", "--url", applied, *(["--json"] if form == "json lines" else []))
        assert result.exit_code == 0, result.output
    if form == "json lines":
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert [line.get("unreadable") for line in lines] == [None, [
            "amount '1e-99999999' is not of the form p, -p or p/q in ASCII digits (str(Fraction))",
            "context nests deeper than 64 levels"]]
        assert lines[1]["amount"] is None and lines[1]["context"] is None and lines[1]["run_id"] == "run-1"
        return
    assert result.stdout.count("UNREADABLE ROW: amount '1e-99999999' is not of the form p, -p or p/q in ASCII digits "
                               "(str(Fraction)); context nests deeper than 64 levels") == 1
    assert "run-0" in result.stdout and "run-1" in result.stdout and "0.0025" in result.stdout
