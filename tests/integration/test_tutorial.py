"""docs/tutorial.md, executed: every shell block in order in one fresh temporary folder and Airflow home, every file
block saved where the reader saves it, every exit status and expected message as the page states them.

The page's conventions are in the HTML comment at its top: ```bash blocks run (``exit=N`` for another status,
``skip="why"`` not run), ```LANG file=PATH blocks are written to PATH, and ``<!-- expect: TEXT -->`` after a block
requires TEXT in that block's output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TUTORIAL = REPO / "docs" / "tutorial.md"
#: A fence at the start of a line (fences inside the page's HTML comment are indented), its info string and body.
FENCE = re.compile(r"^```(?P<language>\w+)(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
EXPECT = re.compile(r"\A\s*<!-- expect: (?P<text>.*?) -->", re.DOTALL)
#: Variables of the developer's or the test runner's shell that would point the tutorial at another ledger, Airflow
#: home or key, or change how output is laid out.
INHERITED = re.compile(r"^(AIRFLOW_.*|AIRFLOW__.*|DP_.*|COLUMNS|LINES|PYTEST_.*|TUTORIAL|ADULT_CSV)$")


@dataclass
class Block:
    """One fenced block of the page, with what the page says about it."""

    language: str
    attributes: dict[str, str]
    body: str
    line: int
    expected: list[str] = field(default_factory=list)

    @property
    def runs(self) -> bool:
        return self.language == "bash" and "skip" not in self.attributes and "file" not in self.attributes


def tutorial_blocks(text: str) -> list[Block]:
    """The page's fenced blocks in order, each with its ``key=value`` attributes and the expect comments after it."""
    blocks = []
    for match in FENCE.finditer(text):
        attributes = dict(token.split("=", 1) for token in shlex.split(match["info"]) if "=" in token)
        block = Block(match["language"], attributes, match["body"], text.count("\n", 0, match.start()) + 1)
        rest = text[match.end():]
        while expected := EXPECT.match(rest):
            block.expected.append(" ".join(expected["text"].split()))
            rest = rest[expected.end():]
        blocks.append(block)
    return blocks


def test_the_page_follows_its_own_conventions():
    """Every block uses a known attribute (a typo would turn a checked step into an unchecked one)."""
    blocks = tutorial_blocks(TUTORIAL.read_text())
    assert sum(block.runs for block in blocks) >= 10
    assert {block.attributes["file"] for block in blocks if "file" in block.attributes} == {
        "release.yaml", "ledgers.yaml", "dags/adult_income_release.py"
    }
    assert [block.attributes["exit"] for block in blocks if "exit" in block.attributes] == ["1"]
    assert any("is exhausted" in text for block in blocks for text in block.expected)
    for block in blocks:
        assert set(block.attributes) <= {"file", "exit", "skip"}, f"line {block.line}: {block.attributes}"
        assert not block.expected or block.runs, f"line {block.line}: an expectation on a block that does not run"


def test_every_command_of_the_tutorial_runs_as_written(tmp_path, adult_csv):
    """Every command of docs/tutorial.md exits and prints as the page says, the budget's refusal included."""
    home = tmp_path / "tutorial"
    # the shell session between blocks: its exported variables and its current folder
    variables, folder = tmp_path / "variables.sh", tmp_path / "folder"
    env = {name: value for name, value in os.environ.items() if not INHERITED.match(name)}
    env["TUTORIAL"] = str(home)
    variables.write_text("")
    folder.write_text(str(REPO))
    ran = 0
    for block in tutorial_blocks(TUTORIAL.read_text()):
        if "file" in block.attributes:
            target = Path(folder.read_text()) / block.attributes["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body)
            continue
        if not block.runs:
            continue
        saved_variables, saved_folder = shlex.quote(str(variables)), shlex.quote(str(folder))
        script = (
            f"source {saved_variables}\n"
            f"cd \"$(cat {saved_folder})\"\n"
            # saved even when the block fails as the page says it should
            f"trap 'export -p > {saved_variables}; printf %s \"$PWD\" > {saved_folder}' EXIT\n"
            "set -e -o pipefail\n"
            + block.body
        )
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=900)
        output = done.stdout + done.stderr
        where = f"docs/tutorial.md line {block.line}:\n{block.body}\n--- output:\n{output[-4000:]}"
        assert done.returncode == int(block.attributes.get("exit", 0)), where
        flat = " ".join(output.split())
        for text in block.expected:
            assert text in flat, f"expected {text!r}; {where}"
        ran += 1
    assert ran >= 10
    # runs 1-3 and 5 published; the refused fourth run published nothing
    assert len(list((home / "releases").rglob("release.json"))) == 4
