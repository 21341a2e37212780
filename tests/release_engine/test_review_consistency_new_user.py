"""A new user's review of consistent tables (issue 14), on the real UCI Adult table and a real SQLite ledger.

Each test is a user's attempt, taken from README ("Consistent tables", "Release spec reference", "Python API without
Airflow") and docs/consistency.md. The first part pins down what worked and matters; the second holds regression
tests of the problems the review found, each asserting the behaviour decided when it was fixed:

* an ``integer: true`` family with a (count or sum) cell beyond 2^53 was charged, then aborted (charge spent): it is
  now rounded exactly and released (DESIGN.md 2.4: "A data value never raises an exception mid-release");
* a key hierarchy listing a child key (age 50) the base does not list was accepted, and the band's interval missed
  its true count by ~6 half-widths: it is refused at load;
* a member whose noise variance underflows (rho 1000) raised a bare ValueError, and ``spec plan`` a traceback: the
  release refuses it with ReleaseConfigError before reserving anything, ``spec plan`` prints the error;
* ``dpctl spec plan`` prints the least-squares half-widths; the example (``integer: true``) publishes them plus 1 for
  the controlled rounding, and the plan says so;
* messages say how to fix a flat list of names, a typo in a hierarchy's column, an unrelated count under
  ``consistent: true``; int and text keys (1 and '1') are distinct keys of a family; ``consistent``, ``nonnegative``
  and ``integer`` read ``yes`` / ``no`` as booleans, like every boolean field of a spec
  (tests/spec/test_spec_yaml_traps.py::test_a_boolean_field_still_takes_yes_and_no), and refuse other text.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from collections import Counter
from decimal import Decimal
from fractions import Fraction
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dp_operators.cli import app
from dp_operators.ledger import ReleaseKey
from dp_operators.release import ReleaseAbortedError, ReleaseConfigError, ReleaseInputError, run_release
from dp_operators.spec import SpecError, load_spec
from dp_operators.spec.families import consistent_families

from support import REPO, make_ledger

DAG = "review_consistency"
ACCOUNT = "census_adult_tables"
EXAMPLE = REPO / "config" / "releases" / "adult_education_sex.yaml"
BANDS = {"17-24": range(17, 25), "25-34": range(25, 35), "35-44": range(35, 45), "45-54": range(45, 55),
         "55-64": range(55, 65), "65-74": range(65, 75), "75+": range(75, 91)}
runner = CliRunner()


# --- helpers ---------------------------------------------------------------------------------------------------------

@cache
def _dag_module():
    """``dags/adult_consistent_release.py`` loaded by path, as Airflow loads it."""
    loaded = importlib.util.spec_from_file_location("review_adult_consistent_dag",
                                                    REPO / "dags" / "adult_consistent_release.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def adult(adult_csv) -> pd.DataFrame:
    return pd.read_csv(adult_csv, skipinitialspace=True)


@pytest.fixture(scope="session")
def counts(adult_csv) -> dict:
    """The example DAG's own upstream value: true counts by education x sex, education, sex and in total."""
    return _dag_module().compute_education_sex_counts(adult_csv)


@pytest.fixture(scope="session")
def age_counts(adult) -> dict:
    """True counts by age, by age band (from the same rows) and in total."""
    bands = {age: band for band, ages in BANDS.items() for age in ages}
    return {"people_by_age": [{"age": int(a), "count": int(c)} for a, c in adult["age"].value_counts().items()],
            "people_by_age_band": [{"age_band": b, "count": int(c)}
                                   for b, c in adult["age"].map(bands).value_counts().items()],
            "people": int(len(adult))}


def new_ledger(tmp_path: Path, name: str = "ledger", cap: str = "10"):
    return make_ledger(tmp_path / f"{name}.db", cap=cap, dags=(DAG,), account=ACCOUNT)


def release(spec, aggregates, ledger, run: str = "run-1", **kwargs) -> dict:
    key = ReleaseKey(dag_id=DAG, run_id=run, task_id="release", map_index=-1, release_name=spec.release)
    return run_release(spec, aggregates, ledger, key, spec_hash="0" * 64, **kwargs).output


def states(ledger) -> list[str]:
    return [charge["state"] for charge in ledger.charges()]


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def count(name: str, keys: dict | None = None, budget: dict | None = None, **extra) -> dict:
    aggregate = {"name": name, "kind": "count", "mechanism": "discrete_gaussian", "budget": budget or {"rho": 0.01}}
    if keys:
        aggregate.update(group_by=list(keys), keys=keys)
    aggregate.update(extra)
    return aggregate


def document(release_name: str, aggregates: list[dict], postprocess: dict) -> str:
    """A spec as YAML text (JSON is YAML 1.2)."""
    return json.dumps({"version": 1, "release": release_name, "budget_account": ACCOUNT, "privacy_unit": "person",
                       "aggregates": aggregates, "postprocess": postprocess}, indent=1)


def age_spec(tmp_path: Path, *, base_ages=range(17, 91), groups=None, child_column: str = "age",
             parent_column: str = "age_band") -> Path:
    groups = groups if groups is not None else {band: list(ages) for band, ages in BANDS.items()}
    text = document("ages", [
        count("people_by_age", {"age": list(base_ages)}),
        count("people_by_age_band", {"age_band": list(BANDS)}),
        count("people"),
    ], {"consistent": True, "hierarchies": [{"parent": parent_column, "child": child_column, "groups": groups}]})
    return write(tmp_path, text, "ages.yaml")


def by_key(output: dict, name: str) -> dict[tuple, dict]:
    published = output["aggregates"][name]
    if not published["group_by"]:
        return {(): published}
    return {tuple(row[c] for c in published["group_by"]): row for row in published["rows"]}


def assert_example_adds_up(output: dict) -> None:
    base = {k: r["value"] for k, r in by_key(output, "people_by_education_sex").items()}
    education, sex = Counter(), Counter()
    for (e, s), value in base.items():
        education[e] += value
        sex[s] += value
    assert {k[0]: r["value"] for k, r in by_key(output, "people_by_education").items()} == dict(education)
    assert {k[0]: r["value"] for k, r in by_key(output, "people_by_sex").items()} == dict(sex)
    assert output["aggregates"]["people"]["value"] == sum(base.values())


def beyond_2_53(counts: dict) -> dict:
    """The example's counts with 10^16 more people in HS-grad x Male (and in its margins): a data value."""
    big = 10**16

    def more(rows: list[dict], **where) -> list[dict]:
        return [dict(r, count=r["count"] + (big if all(r[c] == v for c, v in where.items()) else 0)) for r in rows]

    return {"people_by_education_sex": more(counts["people_by_education_sex"], education="HS-grad", sex="Male"),
            "people_by_education": more(counts["people_by_education"], education="HS-grad"),
            "people_by_sex": more(counts["people_by_sex"], sex="Male"),
            "people": counts["people"] + big}


# --- what worked -----------------------------------------------------------------------------------------------------

def test_the_example_publishes_integer_non_negative_cells_whose_margins_add_up_at_the_planned_charge(counts, tmp_path):
    ledger = new_ledger(tmp_path)
    spec = load_spec(EXAMPLE)
    output = release(spec, counts, ledger)
    assert_example_adds_up(output)
    values = [r["value"] for r in output["aggregates"]["people_by_education_sex"]["rows"]]
    assert all(type(v) is int and v >= 0 for v in values)
    assert Fraction(output["charge"]["rho_exact"]) == Fraction(4, 100) == ledger.account(ACCOUNT).spent
    block = output["aggregates"]["people"]["consistency"]
    assert block["applied"] and block["base"] == "people_by_education_sex" and block["variance"] == "exact"
    assert block["controlled_rounding"] == list(block["family"])  # a two-way table: every member keeps its guarantee
    # least squares 11.29 (q sd = 10.98 plus the continuity correction), plus 1 for the controlled rounding: 12.29
    # (README, docs/consistency.md)
    assert output["aggregates"]["people"]["half_width"] == pytest.approx(12.2917, abs=1e-4)


@pytest.mark.parametrize(("postprocess", "aggregates", "expected"), [
    pytest.param({"consistent": True}, [count("people_by_education", {"education": ["Bachelors", "HS-grad"]}),
                                        count("people_by_sex", {"sex": ["Female", "Male"]}), count("people")],
                 ["no aggregate of the family", "add that table"], id="a family without the cross table"),
    pytest.param({"consistent": True}, [
        count("people_by_education_sex", {"education": ["Bachelors", "HS-grad", "Masters"], "sex": ["Female", "Male"]}),
        count("people_by_education", {"education": ["Bachelors", "HS-grad"]})],
        ["'people_by_education'", "missing 'Masters'"], id="a margin missing a key"),
    pytest.param({"consistent": [["hours_by_sex", "hours_mean"]]}, [
        {"name": "hours_by_sex", "kind": "sum", "group_by": ["sex"], "keys": {"sex": ["Female", "Male"]},
         "bounds": [1, 99], "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}},
        {"name": "hours_mean", "kind": "mean", "bounds": [1, 99], "mechanism": "discrete_gaussian",
         "budget": {"rho": 0.01}}], ["'hours_mean' is a mean", "release its sum and count"], id="a mean member"),
    pytest.param({"consistent": [["hours_by_sex", "hours_total"]]}, [
        {"name": "hours_by_sex", "kind": "sum", "group_by": ["sex"], "keys": {"sex": ["Female", "Male"]},
         "bounds": [1, 99], "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}},
        {"name": "hours_total", "kind": "sum", "bounds": [0, 99], "mechanism": "discrete_gaussian",
         "budget": {"rho": 0.01}}], ["'hours_by_sex' and 'hours_total' differ in bounds"], id="sums with other bounds"),
    pytest.param({"consistent": [["hours_by_sex", "hours_total"]], "integer": True}, [
        {"name": "hours_by_sex", "kind": "sum", "group_by": ["sex"], "keys": {"sex": ["Female", "Male"]},
         "bounds": [1, 99], "grid": 0.5, "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}},
        {"name": "hours_total", "kind": "sum", "bounds": [1, 99], "grid": 0.5, "mechanism": "discrete_gaussian",
         "budget": {"rho": 0.01}}], ["grid 1/2", "use grid 1 or drop integer"], id="integer with a grid"),
])
def test_family_mistakes_are_refused_at_load_with_the_aggregate_and_the_fix(tmp_path, postprocess, aggregates,
                                                                             expected):
    with pytest.raises(SpecError) as refused:
        load_spec(write(tmp_path, document("mistake", aggregates, postprocess)))
    message = str(refused.value)
    assert "postprocess.consistent" in message
    for part in expected:
        assert part in message, message


def test_hierarchy_mistakes_in_keys_are_refused_at_load(tmp_path):
    groups = {band: list(ages) for band, ages in BANDS.items()}
    groups["75+"].remove(90)
    with pytest.raises(SpecError, match=r"'age_band' > 'age' places no parent for the 'age' key\(s\) 90 that the "
                                        r"family's base 'people_by_age' lists"):
        load_spec(age_spec(tmp_path, groups=groups))
    groups = {band: list(ages) for band, ages in BANDS.items()}
    groups["75 +"] = groups.pop("75+")
    with pytest.raises(SpecError, match=r"'people_by_age_band' lists 'age_band' keys \W*'75\+'\W* no base key maps to, "
                                        r"and misses \W*'75 \+'"):
        load_spec(age_spec(tmp_path, groups=groups))
    assert load_spec(age_spec(tmp_path)).postprocess.hierarchies  # control: the right groups load


def example_with(**flags: str) -> str:
    """The example spec's text with some of its postprocess flags written otherwise (``integer="yes"``)."""
    text = EXAMPLE.read_text()
    for flag, written in flags.items():
        old = f"\n  {flag}: true "
        assert text.count(old) == 1, flag
        text = text.replace(old, f"\n  {flag}: {written} ")
    return text


@pytest.mark.parametrize("flag", ["consistent", "nonnegative", "integer"])
@pytest.mark.parametrize(("written", "expected"), [("yes", True), ("Yes", True), ("on", True), ("no", False)])
def test_postprocess_flags_read_yes_and_no_as_booleans_like_every_boolean_field(tmp_path, flag, written, expected):
    """tests/spec/test_spec_yaml_traps.py::test_a_boolean_field_still_takes_yes_and_no: where a boolean is expected,
    'yes' and 'no' mean what the author meant; ``consistent`` reads them too."""
    others = {"nonnegative": "false", "integer": "false"} if (flag, expected) == ("consistent", False) else {}
    spec = load_spec(write(tmp_path, example_with(**{flag: written}, **others)))
    assert getattr(spec.postprocess, flag) is expected
    if flag == "consistent":
        example = load_spec(EXAMPLE)
        assert consistent_families(spec) == (consistent_families(example) if expected else [])


@pytest.mark.parametrize(("flag", "message"), [
    pytest.param("consistent", r"postprocess.consistent: must be true, false or a list of families.*'maybe'",
                 id="consistent"),
    pytest.param("nonnegative", r"postprocess.nonnegative: .*valid boolean", id="nonnegative"),
    pytest.param("integer", r"postprocess.integer: .*valid boolean", id="integer"),
])
def test_postprocess_flags_refuse_other_text(tmp_path, flag, message):
    with pytest.raises(SpecError, match=message):
        load_spec(write(tmp_path, example_with(**{flag: "maybe"})))


def test_a_hierarchy_of_ages_into_bands_publishes_bands_that_are_sums_of_ages(age_counts, tmp_path):
    output = release(load_spec(age_spec(tmp_path)), age_counts, new_ledger(tmp_path))
    ages = {k[0]: r["value"] for k, r in by_key(output, "people_by_age").items()}
    for (band,), row in by_key(output, "people_by_age_band").items():
        assert row["value"] == sum(ages[a] for a in BANDS[band])
    assert output["aggregates"]["people"]["value"] == sum(ages.values())
    assert output["aggregates"]["people_by_age_band"]["consistency"]["applied"] is True


@pytest.mark.parametrize("convert", [
    pytest.param(lambda c: {**c, "people": np.int64(c["people"]),
                            "people_by_sex": [dict(r, count=np.int64(r["count"])) for r in c["people_by_sex"]]},
                 id="numpy ints"),
    pytest.param(lambda c: {name: ([dict(r, count=Decimal(r["count"])) for r in value] if isinstance(value, list)
                                   else Decimal(value)) for name, value in c.items()}, id="Decimal"),
])
def test_upstream_numpy_ints_and_decimals_are_released_consistent(counts, tmp_path, convert):
    output = release(load_spec(EXAMPLE), convert(counts), new_ledger(tmp_path))
    assert_example_adds_up(output)


@pytest.mark.parametrize(("convert", "message"), [
    pytest.param(lambda c, t: {**c, "people_by_sex": t["sex"].value_counts()}, "got Series", id="a pandas Series"),
    pytest.param(lambda c, t: {**c, "people": pd.Series([len(t)])}, "holds a pandas.Series", id="a Series total"),
    pytest.param(lambda c, t: {**c, "people_by_sex": t.groupby("sex").size().rename("count").reset_index()},
                 "to_dict('records')", id="a DataFrame"),
])
def test_upstream_pandas_objects_are_refused_before_any_charge(counts, adult, tmp_path, convert, message):
    ledger = new_ledger(tmp_path)
    with pytest.raises(ReleaseInputError, match=re.escape(message)):
        release(load_spec(EXAMPLE), convert(counts, adult), ledger)
    assert states(ledger) == []


def test_hours_per_week_by_sex_and_in_total_add_up_as_whole_non_negative_hours(adult, tmp_path):
    aggregates = [{"name": "hours_by_sex", "kind": "sum", "group_by": ["sex"], "keys": {"sex": ["Female", "Male"]},
                   "bounds": [1, 99], "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}},
                  {"name": "hours_total", "kind": "sum", "bounds": [1, 99], "mechanism": "discrete_gaussian",
                   "budget": {"rho": 0.01}}]
    spec = load_spec(write(tmp_path, document("hours", aggregates, {
        "consistent": [["hours_by_sex", "hours_total"]], "nonnegative": True, "integer": True})))
    hours = adult["hours_per_week"].clip(1, 99)
    upstream = {"hours_by_sex": [{"sex": s, "sum": int(v)} for s, v in hours.groupby(adult["sex"]).sum().items()],
                "hours_total": int(hours.sum())}
    output = release(spec, upstream, new_ledger(tmp_path))
    rows = output["aggregates"]["hours_by_sex"]["rows"]
    assert all(type(r["value"]) is int and r["value"] >= 0 for r in rows)
    assert output["aggregates"]["hours_total"]["value"] == sum(r["value"] for r in rows)
    assert Fraction(output["charge"]["rho_exact"]) == Fraction(2, 100)


def test_odd_keys_unicode_huge_ints_and_empty_text_round_trip_and_add_up(tmp_path):
    keys = [1, "ü", "日本", 10**30, "", " "]
    spec = load_spec(write(tmp_path, document("odd", [
        count("by_k_s", {"k": keys, "s": ["F", "M"]}), count("by_k", {"k": keys}), count("total")],
        {"consistent": True, "integer": True})))
    true = {(k, s): 1000 * (i + 1) + 7 * j for i, k in enumerate(keys) for j, s in enumerate("FM")}
    upstream = {"by_k_s": [{"k": k, "s": s, "count": c} for (k, s), c in true.items()],
                "by_k": [{"k": k, "count": true[(k, "F")] + true[(k, "M")]} for k in keys],
                "total": sum(true.values())}
    output = release(spec, upstream, new_ledger(tmp_path))
    base = by_key(output, "by_k_s")
    margin = by_key(output, "by_k")
    assert list(margin) == [(k,) for k in keys]  # types kept: 1 and 10**30 stay ints
    for (k,), row in margin.items():
        assert row["value"] == base[(k, "F")]["value"] + base[(k, "M")]["value"]


@pytest.mark.slow
def test_a_hundred_thousand_cell_table_with_margins_through_the_python_api(tmp_path):
    a_keys, b_keys = [f"a{i}" for i in range(500)], list(range(200))
    spec = load_spec(write(tmp_path, document("big", [
        count("by_ab", {"a": a_keys, "b": b_keys}), count("by_a", {"a": a_keys}), count("by_b", {"b": b_keys}),
        count("total")], {"consistent": True})))
    cells = np.random.default_rng(14).poisson(3, size=(500, 200))
    upstream = {"by_ab": [{"a": a, "b": b, "count": int(cells[i, j])} for i, a in enumerate(a_keys)
                          for j, b in enumerate(b_keys)],
                "by_a": [{"a": a, "count": int(cells[i].sum())} for i, a in enumerate(a_keys)],
                "by_b": [{"b": b, "count": int(cells[:, j].sum())} for j, b in enumerate(b_keys)],
                "total": int(cells.sum())}
    started = time.perf_counter()
    output = release(spec, upstream, new_ledger(tmp_path))
    elapsed = time.perf_counter() - started
    base = np.array([r["value"] for r in output["aggregates"]["by_ab"]["rows"]]).reshape(500, 200)
    assert [r["value"] for r in output["aggregates"]["by_a"]["rows"]] == [sum(row.tolist()) for row in base]
    assert output["aggregates"]["total"]["consistency"]["applied"] is True
    print(f"10^5-cell family with margins released in {elapsed:.1f} s")


# --- regression tests of what the review found ---------------------------------------------------------------------

# Was SERIOUS: charged, then failed on a data value (integer sums beyond 2^53 are now rounded exactly, up to 2^62).
@pytest.mark.parametrize("case", ["example counts", "revenue sums"])
def test_an_integer_family_with_a_cell_beyond_2_53_is_released_with_exact_integer_margins(counts, tmp_path, case):
    if case == "example counts":
        spec, upstream = load_spec(EXAMPLE), beyond_2_53(counts)
    else:
        bounds = [0, 10**9]  # e.g. revenue per person in cents; Linf 1e9 grid units is within the limits
        spec = load_spec(write(tmp_path, document("revenue", [
            {"name": "revenue_by_sex", "kind": "sum", "group_by": ["sex"], "keys": {"sex": ["Female", "Male"]},
             "bounds": bounds, "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}},
            {"name": "revenue_total", "kind": "sum", "bounds": bounds, "mechanism": "discrete_gaussian",
             "budget": {"rho": 0.01}}], {"consistent": [["revenue_by_sex", "revenue_total"]], "integer": True})))
        upstream = {"revenue_by_sex": [{"sex": "Female", "sum": 10**16}, {"sex": "Male", "sum": 7 * 10**15}],
                    "revenue_total": 17 * 10**15}
    ledger = new_ledger(tmp_path)
    try:
        output = release(spec, upstream, ledger)
    except ReleaseAbortedError as aborted:
        pytest.fail(f"the release was charged ({states(ledger)}; spent {ledger.account(ACCOUNT).spent}) and then "
                    f"failed on a data value: {aborted.__cause__!r}")
    assert states(ledger) == ["committed"]
    for aggregate in spec.aggregates:
        assert output["aggregates"][aggregate.name]["consistency"]["applied"] is True, aggregate.name
    if case == "example counts":
        assert_example_adds_up(output)  # Python ints: exact, however large
        assert max(r["value"] for r in output["aggregates"]["people_by_education_sex"]["rows"]) > 2**53
    else:
        rows = output["aggregates"]["revenue_by_sex"]["rows"]
        assert all(type(r["value"]) is int for r in rows) and max(r["value"] for r in rows) > 2**53
        assert output["aggregates"]["revenue_total"]["value"] == sum(r["value"] for r in rows)


# Was HIGH: a wrong release, published with confident intervals.
def test_a_hierarchy_child_key_the_base_does_not_list_is_refused_at_load(tmp_path):
    """The base forgets age 50, the hierarchy puts 50 in 45-54: the band counts people the cells cannot hold."""
    path = age_spec(tmp_path, base_ages=[a for a in range(17, 91) if a != 50])
    with pytest.raises(SpecError, match=r"'age' key\(s\) 50 under parents the family releases, but the base "
                                        r"'people_by_age' does not list them.*add the key\(s\) to the base's keys"):
        load_spec(path)


def test_a_band_is_published_near_its_true_count_and_a_base_missing_one_of_its_ages_is_refused(age_counts, tmp_path):
    """With every age listed, the 45-54 band's interval holds its true count; with age 50 missing from the base
    (the miss that put the band ~6 half-widths off) the spec is refused at load: no release, no charge."""
    truth = {r["age_band"]: r["count"] for r in age_counts["people_by_age_band"]}
    output = release(load_spec(age_spec(tmp_path)), age_counts, new_ledger(tmp_path))
    row = by_key(output, "people_by_age_band")[("45-54",)]
    # 3 half-widths: a correct release misses by that much with probability ~1e-9
    assert abs(row["value"] - truth["45-54"]) <= 3 * row["half_width"], (row, truth["45-54"])
    with pytest.raises(SpecError, match=r"\b50\b"):
        load_spec(age_spec(tmp_path, base_ages=[a for a in range(17, 91) if a != 50]))


# Was MEDIUM: a spec in the documented ranges that plan crashed on and the release refused with a bare ValueError.
def _underflowing_spec(tmp_path: Path) -> Path:
    text = EXAMPLE.read_text()
    tail = text[text.index("  - name: people_by_sex"):]
    return write(tmp_path, text.replace(tail, tail.replace("budget: {rho: 0.01}", "budget: {rho: 1000}"), 1))


def test_a_member_whose_noise_variance_underflows_is_refused_before_any_reservation(counts, tmp_path):
    """rho 1000 on people_by_sex: its variance is 0 in binary64. The document is valid (spec load checks the
    document); planning the families refuses it with ReleaseConfigError naming the aggregate and the fix, before the
    ledger reserves anything."""
    ledger = new_ledger(tmp_path, cap="10000")
    spec = load_spec(_underflowing_spec(tmp_path))
    with pytest.raises(ReleaseConfigError) as refused:
        release(spec, counts, ledger)
    message = str(refused.value)
    assert "'people_by_sex'" in message and "noise variance" in message and "smaller budget" in message, message
    assert states(ledger) == [] and ledger.account(ACCOUNT).spent == 0
    # control: the example, with rho 0.01 everywhere, is released from the same ledger
    release(load_spec(EXAMPLE), counts, ledger)
    assert states(ledger) == ["committed"]


def test_dpctl_plan_prints_the_refusal_of_such_a_spec_without_a_traceback(tmp_path):
    path = _underflowing_spec(tmp_path)
    planned = runner.invoke(app, ["spec", "plan", str(path), "--accountant", "zcdp"])
    assert planned.exception is None or isinstance(planned.exception, SystemExit), repr(planned.exception)
    assert planned.exit_code != 0, planned.output
    text = " ".join(planned.output.split())
    assert "Traceback" not in text and "'people_by_sex'" in text and "smaller budget" in text, text
    # validate plans the families too (dp_operators/cli/spec.py), refusing what the release would
    validated = runner.invoke(app, ["spec", "validate", str(path)])
    text = " ".join(validated.output.split())
    assert validated.exit_code != 0 and "'people_by_sex'" in text and "smaller budget" in text, validated.output
    # control: plan prints the example's families
    assert runner.invoke(app, ["spec", "plan", str(EXAMPLE), "--accountant", "zcdp"]).exit_code == 0


# Was LOW-MEDIUM: the plan promised narrower intervals than the example publishes; it now says what rounding adds.
@pytest.mark.parametrize("integer", [pytest.param(True, id="integer: +1"), pytest.param(False, id="no integer: +0")])
def test_plan_half_widths_are_the_least_squares_part_of_the_published_ones(counts, tmp_path, integer):
    path = EXAMPLE if integer else write(tmp_path, example_with(integer="false"))
    planned = runner.invoke(app, ["spec", "plan", str(path), "--accountant", "zcdp", "--json"])
    assert planned.exit_code == 0, planned.output
    family = json.loads(planned.output)["consistent_families"][0]["half_widths"]
    output = release(load_spec(path), counts, new_ledger(tmp_path))
    for name, width in family.items():
        published = output["aggregates"][name]
        rows = published["rows"] if published["group_by"] else [published]
        if integer:  # every member keeps its controlled-rounding guarantee here: exactly 1 more
            assert name in published["consistency"]["controlled_rounding"]
        assert max(r["half_width"] for r in rows) == pytest.approx(width + (1 if integer else 0), abs=1e-6), name
    text = " ".join(runner.invoke(app, ["spec", "plan", str(path), "--accountant", "zcdp"]).output.split())
    assert ("integer rounding adds up to 1 more" in text) is integer, text


# Was LOW: messages that did not say how to fix the mistake.
def test_a_flat_list_of_names_says_to_write_a_list_of_families(tmp_path):
    text = EXAMPLE.read_text().replace("  consistent: true ",
                                       "  consistent: [people_by_education_sex, people_by_sex, people] ")
    with pytest.raises(SpecError) as refused:
        load_spec(write(tmp_path, text))
    message = str(refused.value)
    assert "famil" in message and "[[" in message, message  # e.g. "a list of families: [[a, b, ...]]"


@pytest.mark.parametrize(("columns", "typo"), [
    pytest.param({"parent_column": "ageband"}, "ageband", id="parent"),
    pytest.param({"child_column": "agee"}, "agee", id="child"),
])
def test_a_typo_in_a_hierarchy_column_is_named(tmp_path, columns, typo):
    with pytest.raises(SpecError) as refused:
        load_spec(age_spec(tmp_path, **columns))
    message = str(refused.value)
    # was: "no aggregate of the family ... groups by every column ...: add that table", the hierarchy unnamed
    assert typo in message and "hierarchies[0]" in message, message


def test_an_unrelated_count_under_consistent_true_suggests_listing_the_families(tmp_path):
    text = EXAMPLE.read_text().replace("postprocess:", (
        "  - {name: people_by_race, kind: count, group_by: [race], keys: {race: [White, Black, Other]}, "
        "mechanism: discrete_gaussian, budget: {rho: 0.01}}\npostprocess:"))
    with pytest.raises(SpecError) as refused:
        load_spec(write(tmp_path, text))
    message = str(refused.value)
    assert re.search(r"list (the |its )?families|consistent: \[\[", message), message


@pytest.mark.parametrize("where", ["margin", "hierarchy"])
def test_int_and_text_keys_are_distinct_keys_of_a_family(tmp_path, where):
    """docs/consistency.md: refused at load, 'margin keys that differ from the base's'; the engine elsewhere keeps
    1 and '1' apart (int rows never match text keys). Control: the same family with keys of one type loads."""
    def margin_spec(margin_keys: list) -> Path:
        return write(tmp_path, document("strint", [count("by_k_s", {"k": [1, 2, 3], "s": ["F", "M"]}),
                                                   count("by_k", {"k": margin_keys}), count("total")],
                                        {"consistent": True}))

    def hierarchy_spec(as_text: bool) -> Path:
        groups = {band: list(ages) for band, ages in BANDS.items()}
        if as_text:
            groups["17-24"] = [str(a) for a in groups["17-24"]]
        return age_spec(tmp_path, groups=groups)

    build = margin_spec if where == "margin" else hierarchy_spec
    mixed, same = (["1", "2", "3"], [1, 2, 3]) if where == "margin" else (True, False)
    with pytest.raises(SpecError, match=r"'1', '2', '3'|17, 18, 19"):
        load_spec(build(mixed))
    assert load_spec(build(same)).postprocess.consistent is True
