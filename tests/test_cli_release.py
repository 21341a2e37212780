"""``dpctl release show``: a published release as tables; a one-line error for anything that is not one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_operators.cli import app

runner = CliRunner()

RELEASE = {
    "release": "adult [census] statistics",
    "release_key": {"dag_id": "d", "run_id": "manual__1", "task_id": "t", "map_index": -1, "release_name": "r"},
    "charge": {"rho": 0.1, "rho_exact": "1/10", "epsilon_at_delta": 2.3, "delta": 1e-6},
    "confidence": 0.95,
    "aggregates": {
        "people_by_sex": {
            "kind": "count",
            "mechanism": "discrete_gaussian",
            "group_by": ["sex"],
            "rows": [
                {"sex": "[Female]", "value": 12, "half_width": 7.0},
                {"sex": "Male", "value": 15, "half_width": 7.0},
            ],
        },
        "mean_hours": {"kind": "mean", "mechanism": "discrete_laplace", "group_by": [], "value": 40.25,
                       "half_width": 0.5},
    },
}


def test_show_prints_values_half_widths_and_the_charge_verbatim(tmp_path: Path):
    path = tmp_path / "release.json"
    path.write_text(json.dumps(RELEASE))
    result = runner.invoke(app, ["release", "show", str(path)])
    assert result.exit_code == 0, result.output
    assert "release adult [census] statistics published to" in result.output
    assert "run manual__1; this release spent rho 0.1 (epsilon 2.3 at delta 1e-06)" in result.output
    assert "[Female]" in result.output and "40.250" in result.output
    assert runner.invoke(app, ["release", "show", str(tmp_path)]).exit_code == 0


def test_show_prints_the_delta_spent_and_the_partition_selection_that_chose_the_keys(tmp_path: Path):
    rows = {"kind": "median", "mechanism": "exponential", "group_by": ["country", "quantile"],
            "partition_selection": {"mechanism": "discrete_laplace", "threshold": 15, "epsilon": 1.0, "delta": 1e-06},
            "rows": [{"country": "Mexico", "quantile": "0.5", "value": 40, "bin": [40, 41], "bin_label": 40,
                      "rank_half_width": 7.59, "interval": [None, None], "half_width": None}]}
    charge = {"epsilon": 2.0, "epsilon_exact": "2", "epsilon_at_delta": 2.0, "delta": 0.001,
              "delta_spent": 6.07896204086e-07}
    path = tmp_path / "release.json"
    path.write_text(json.dumps({**RELEASE, "charge": charge, "aggregates": {"hours": rows}}))
    result = runner.invoke(app, ["release", "show", str(path)], terminal_width=250)
    assert result.exit_code == 0, result.output
    assert "this release spent epsilon 2, delta 6.079e-07" in result.output
    assert ("keys found in the data: 1 rows released, of the keys whose noised count of privacy units reached the "
            "threshold 15 (partition selection, discrete_laplace, epsilon 1.0, delta 1e-06)") in result.output


def test_show_prints_a_quantiles_rank_half_width(tmp_path: Path):
    """A quantile's row shows its rank half-width: alone when it has no value interval (the exponential mechanism),
    beside its value interval when it has one (the noised CDF: not symmetric around the bin's edge)."""
    rows = {"kind": "quantile", "mechanism": "exponential", "group_by": ["quantile"], "rows": [
        {"quantile": "0.5", "value": 40, "bin": [40, 41], "bin_label": 40, "rank_half_width": 18.977130309221486,
         "interval": [None, None], "half_width": None},
        {"quantile": "0.9", "value": 55, "bin": [55, 56], "bin_label": 55, "rank_half_width": 7.5,
         "interval": [52, 58], "half_width": 3.0},
    ]}
    path = tmp_path / "release.json"
    path.write_text(json.dumps({**RELEASE, "aggregates": {"hours": rows}}))
    result = runner.invoke(app, ["release", "show", str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "within 18.98 ranks" in result.output and "[52, 58] (within 7.5 ranks)" in result.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "no such file: ", id="missing"),
        pytest.param("{not json", "not valid JSON", id="malformed JSON"),
        pytest.param("[1, 2]", "not a release published by dp-operators", id="a JSON list"),
        pytest.param('{"name": "x"}', "not a release published by dp-operators (no 'release'", id="another JSON"),
        pytest.param(json.dumps({**RELEASE, "aggregates": []}), "not a release published by dp-operators",
                     id="aggregates not a mapping"),
        pytest.param(json.dumps({**RELEASE, "aggregates": {"a": {"kind": "count"}}}),
                     "not a release published by dp-operators", id="aggregate without fields"),
    ],
)
def test_anything_else_is_a_one_line_error(tmp_path: Path, content, message):
    path = tmp_path / "release.json"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(app, ["release", "show", str(path)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_a_parquet_file_is_pointed_to_its_json(tmp_path: Path):
    path = tmp_path / "release.parquet"
    path.write_bytes(b"PAR1\xc0\x00PAR1")
    result = runner.invoke(app, ["release", "show", str(path)])
    assert result.exit_code == 1
    assert "give its JSON file" in result.stderr and str(tmp_path / "release.json") in result.stderr


def test_show_opens_a_published_location_and_a_folder_uri(tmp_path: Path):
    """What a release publishes (XCom, asset events) is a URI whose path is percent-encoded once: show takes it as
    verify does, and a file:// folder URI, such as an operator's output_uri."""
    from dp_operators.operators.locations import published_uri
    from airflow.sdk import ObjectStoragePath

    folder = tmp_path / "out" / "manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    folder.mkdir(parents=True)
    (folder / "release.json").write_text(json.dumps(RELEASE))
    location = published_uri(ObjectStoragePath(f"file://{folder / 'release.json'}"))
    assert "%253A" in location  # the folder's literal % is escaped in the URI
    for argument in (location, f"file://{tmp_path / 'out'}"):
        result = runner.invoke(app, ["release", "show", argument])
        assert result.exit_code == 0, result.output
        assert "published to" in result.output and "40.250" in result.output
    missing = runner.invoke(app, ["release", "show", f"file://{tmp_path / 'none.json'}"])
    assert missing.exit_code == 1 and f"no such file: {tmp_path / 'none.json'}" in missing.output
