"""Cross-check with pycanon 1.3.6 in a separate virtual environment (see pycanon_crosscheck.py)."""

from __future__ import annotations

import pytest
from .pycanon_crosscheck import (
    DATASETS,
    KANON_DIR,
    RegistryUnreachable,
    disagreements,
    ensure_pycanon_python,
    our_results,
    pycanon_results,
)


@pytest.mark.slow
def test_measures_agree_with_pycanon_where_definitions_agree():
    if not KANON_DIR.exists():
        pytest.skip(f"{KANON_DIR} is missing: the shared test data must sit beside the project")
    try:
        python = ensure_pycanon_python()
    except RegistryUnreachable as exc:
        pytest.skip(str(exc))
    theirs = pycanon_results(python)
    ours = our_results()
    assert set(theirs) == {name for name, *_ in DATASETS}
    assert disagreements(ours, theirs) == []
