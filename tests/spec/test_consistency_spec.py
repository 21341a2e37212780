"""``postprocess.consistent``, ``nonnegative``, ``integer`` and ``hierarchies`` at load time: every family that
cannot be made consistent is refused the way a user meets it (YAML text through :func:`parse_spec`), with the field
path and the aggregate in the message; the accepted shapes load; and post-processing never changes the plan or the
charge ("the budget charged is identical with and without post-processing"). The refusals a user meets editing the
example or writing Adult's age bands say what to fix."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import yaml
from yamlcore import CoreDumper

from dp_operators.release import plan_release
from dp_operators.spec import ReleaseSpec, SpecError, load_spec, parse_spec
from dp_operators.spec.families import DENSE_BASE_CELLS, consistent_families
from dp_operators.spec.yaml12 import load_yaml

from adult_families import BANDS as ADULT_BANDS
from adult_families import age_spec as adult_age_spec
from adult_families import count as adult_count
from adult_families import document as adult_document
from adult_families import example_with
from adult_families import write as adult_write
from support import REPO

CONSISTENT_SPEC = REPO / "config" / "releases" / "adult_education_sex.yaml"
EDUCATION = ["Bachelors", "HS-grad", "Masters"]
SEX = ["Female", "Male"]
RACE = ["Black", "White", "Other"]
AGES = [17, 18, 19, 20, 21, 22]
BANDS = {"17-19": [17, 18, 19], "20-22": [20, 21, 22]}


def count(name: str, **keys: list) -> dict:
    """A count grouped by ``keys``' columns (in the order given) over those public keys."""
    aggregate = {"name": name, "kind": "count", "mechanism": "discrete_gaussian", "budget": {"rho": 0.01}}
    if keys:
        aggregate.update(group_by=list(keys), keys=dict(keys))
    return aggregate


def bounded(kind: str, name: str, bounds=(0, 100), grid="1", **keys: list) -> dict:
    """A sum, mean or variance grouped by ``keys``' columns."""
    aggregate = count(name, **keys)
    aggregate.update(kind=kind, bounds=list(bounds), grid=grid)
    return aggregate


def document(aggregates: list[dict], postprocess: dict | None) -> dict:
    spec = {"version": 1, "release": "tables", "budget_account": "acct", "privacy_unit": "person",
            "aggregates": aggregates}
    if postprocess is not None:
        spec["postprocess"] = postprocess
    return spec


def education_sex(postprocess: dict | None, *extra: dict) -> dict:
    """People by education x sex (the base), by education, by sex and in total, then ``extra`` aggregates."""
    return document([count("cells", education=EDUCATION, sex=SEX), count("by_education", education=EDUCATION),
                     count("by_sex", sex=SEX), count("total"), *extra], postprocess)


def ages(groups: dict | None = None, band_keys: list | None = None, **postprocess) -> dict:
    """People by age (the base), by age band through a hierarchy, and in total."""
    groups = BANDS if groups is None else groups
    hierarchy = {"parent": "band", "child": "age", "groups": groups}
    return document([count("by_age", age=AGES), count("by_band", band=band_keys or list(groups)), count("total")],
                    {"consistent": True, "hierarchies": [hierarchy], **postprocess})


def sums(second: dict, **postprocess) -> dict:
    """A sum by education x sex (the base) and ``second``, declared one family explicitly."""
    return document([bounded("sum", "sum_cells", education=EDUCATION, sex=SEX), second],
                    {"consistent": [["sum_cells", second["name"]]], **postprocess})


def dump(spec: dict) -> str:
    """YAML 1.2 text of ``spec`` (strings that would read as numbers are quoted)."""
    return yaml.dump(spec, Dumper=CoreDumper, sort_keys=False)


def refusal(spec: dict) -> str:
    with pytest.raises(SpecError) as refused:
        parse_spec(dump(spec), source="tables.yaml")
    return str(refused.value)


def family_refusals() -> list:
    """(spec, the aggregate names the message must carry, a phrase of the reason)."""
    return [
        pytest.param(education_sex({"consistent": [["by_education", "by_sex", "total"]]}),
                     ["by_education", "by_sex"], "groups by every column", id="no base"),
        pytest.param(document([count("cells", education=EDUCATION, sex=SEX),
                               count("by_education", education=EDUCATION[:2])], {"consistent": True}),
                     ["by_education", "cells"], "other 'education' keys than the base", id="margin keys differ"),
        pytest.param(document([count("cells", education=EDUCATION, sex=SEX),
                               count("by_education", education=[*EDUCATION, "Doctorate"])], {"consistent": True}),
                     ["by_education", "Doctorate"], "other 'education' keys", id="margin has a key the base lacks"),
        pytest.param(education_sex({"consistent": [["cells", "by_eduction"]]}), ["by_eduction"], "unknown aggregate",
                     id="unknown name"),
        pytest.param(education_sex({"consistent": [["cells", "by_education"], ["cells", "by_sex"]]}), ["cells"],
                     "in two families", id="name in two families"),
        pytest.param(education_sex({"consistent": [["cells", "by_education", "by_education"]]}), ["by_education"],
                     "in two families (or twice in one)", id="name twice in one family"),
        pytest.param(education_sex({"consistent": [["cells", "mean_age"]]},
                                   bounded("mean", "mean_age", education=EDUCATION, sex=SEX)),
                     ["mean_age"], "is a mean", id="mean member"),
        pytest.param(education_sex({"consistent": [["cells", "age_variance"]]},
                                   bounded("variance", "age_variance", education=EDUCATION)),
                     ["age_variance"], "is a variance", id="variance member"),
        pytest.param(education_sex(
            {"consistent": [["cells", "selected"]]},
            {"name": "selected", "kind": "count", "group_by": ["education"], "mechanism": "discrete_laplace",
             "budget": {"epsilon": 1},
             "partition_selection": {"mechanism": "discrete_laplace", "budget": {"epsilon": 1, "delta": 1e-6}}}),
            ["selected"], "partition_selection", id="partition selection member"),
        pytest.param(education_sex({"consistent": [["cells", "sum_by_education"]]},
                                   bounded("sum", "sum_by_education", education=EDUCATION)),
                     ["cells", "sum_by_education"], "different kinds", id="count mixed with sum"),
        pytest.param(sums(bounded("sum", "sum_by_sex", bounds=(0, 50), sex=SEX)), ["sum_cells", "sum_by_sex"],
                     "differ in bounds, grid", id="sums with different bounds"),
        pytest.param(sums(bounded("sum", "sum_by_sex", grid="1/2", sex=SEX)), ["sum_cells", "sum_by_sex"],
                     "differ in bounds, grid", id="sums with different grids"),
        pytest.param(document([bounded("sum", "sum_cells", grid="1/2", education=EDUCATION, sex=SEX),
                               bounded("sum", "sum_by_sex", grid="1/2", sex=SEX)],
                              {"consistent": [["sum_cells", "sum_by_sex"]], "integer": True}),
                     ["sum_cells"], "grid 1/2", id="integer with grid 1/2"),
        pytest.param(education_sex({"consistent": [["cells"], ["by_education", "by_sex"]]}), ["cells"],
                     "at least two aggregates", id="family of one"),
        pytest.param(document([count("cells", education=EDUCATION, sex=SEX),
                               bounded("sum", "sum_cells", education=EDUCATION, sex=SEX)], {"consistent": True}),
                     [], "the spec has 1", id="consistent true with one count"),
        pytest.param(education_sex({"consistent": True}, count("by_race", race=RACE)), ["by_race"],
                     "groups by every column", id="consistent true with an unrelated count"),
        pytest.param(ages({"17-19": [17, 18, 19], "20-22": [20, 21]}), ["by_age"], "places no parent for the 'age' key(s) 22",
                     id="hierarchy: a base key with no parent"),
        pytest.param(ages({**BANDS, "90+": [90]}), ["by_band", "90+"], "no base key maps to",
                     id="hierarchy: a margin key no base key maps to"),
        pytest.param(ages(band_keys=["17-19", "20-22", "23-25"]), ["by_band", "23-25"], "no base key maps to",
                     id="hierarchy: a margin key outside the hierarchy"),
    ]


@pytest.mark.parametrize(("spec", "names", "reason"), family_refusals())
def test_a_family_that_cannot_be_made_consistent_is_refused_at_load(spec, names, reason):
    message = refusal(spec)
    lines = message.splitlines()
    assert lines[0] == "tables.yaml: invalid release spec (1 problem(s)):"
    assert lines[1].startswith("  postprocess.consistent: ")
    assert reason in message
    for name in names:
        assert name in message


@pytest.mark.parametrize(
    ("postprocess", "where", "reason"),
    [
        pytest.param({"nonnegative": True}, "postprocess", "nonnegative act on a consistent family",
                     id="nonnegative without consistent"),
        pytest.param({"integer": True, "consistent": False}, "postprocess", "integer act on a consistent family",
                     id="integer without consistent"),
        pytest.param({"hierarchies": [{"parent": "band", "child": "age", "groups": BANDS}]}, "postprocess",
                     "add 'consistent: true'", id="hierarchies without consistent"),
        pytest.param({"consistent": "maybe"}, "postprocess.consistent", "must be true, false or a list of families",
                     id="consistent as a string"),
        pytest.param({"consistent": 1}, "postprocess.consistent", "got 1", id="consistent as a number"),
        pytest.param({"consistent": {"cells": ["total"]}}, "postprocess.consistent", "must be true, false",
                     id="consistent as a mapping"),
        pytest.param({"consistent": True, "hierarchies": [{"parent": "band", "child": "age",
                                                           "groups": {"17-19": [17, 18, 19], "18-22": [18, 20]}}]},
                     "postprocess.hierarchies[0]", "'age' key 18 is listed under '17-19' and '18-22'",
                     id="hierarchy: a child key under two parents"),
        pytest.param({"consistent": True, "hierarchies": [{"parent": "age", "child": "age", "groups": BANDS}]},
                     "postprocess.hierarchies[0]", "got parent and child 'age'", id="hierarchy: parent is the child"),
        pytest.param({"consistent": True, "hierarchies": [{"parent": "band", "child": "age", "groups": {}}]},
                     "postprocess.hierarchies[0].groups", "", id="hierarchy: no groups"),
        pytest.param({"consistent": True, "hierarchies": [{"parent": "band", "child": "age", "groups": BANDS},
                                                          {"parent": "band", "child": "year", "groups": {"a": [1]}}]},
                     "postprocess", "['band'] are the parent of two hierarchies", id="two hierarchies, one parent"),
    ],
)
def test_a_bad_postprocess_block_is_refused_at_load(postprocess, where, reason):
    message = refusal(education_sex(postprocess))
    problem = message.splitlines()[1]
    assert problem.startswith(f"  {where}: "), problem
    assert reason in problem


def test_every_problem_is_reported_with_the_file_and_field_path_through_load_spec(tmp_path):
    path = tmp_path / "tables.yaml"
    path.write_text(dump(education_sex({"consistent": [["cells", "by_eduction"]]})))
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert str(refused.value).splitlines()[1].startswith("  postprocess.consistent: unknown aggregate 'by_eduction'")
    assert str(path) in str(refused.value)


def test_the_example_spec_loads_as_one_family_with_the_table_as_its_base():
    spec = load_spec(CONSISTENT_SPEC)
    assert (spec.postprocess.consistent, spec.postprocess.nonnegative, spec.postprocess.integer) == (True, True, True)
    (family,) = consistent_families(spec)
    assert family.members == ("people_by_education_sex", "people_by_education", "people_by_sex", "people")
    assert family.base == "people_by_education_sex" and family.parents == {}


def test_the_base_is_found_wherever_it_is_listed():
    spec = parse_spec(dump(education_sex({"consistent": [["total", "by_sex", "cells", "by_education"]]})))
    (family,) = consistent_families(spec)
    assert family.members == ("cells", "total", "by_sex", "by_education")


def test_consistent_false_and_no_block_make_no_family():
    assert consistent_families(parse_spec(dump(education_sex(None)))) == []
    assert consistent_families(parse_spec(dump(education_sex({"consistent": False})))) == []


def test_margins_may_list_their_columns_in_another_order_than_the_base():
    spec = document([count("cells", education=EDUCATION, sex=SEX, race=RACE),
                     count("race_education", race=RACE, education=EDUCATION),
                     count("sex_race", sex=SEX, race=RACE), count("total")], {"consistent": True})
    (family,) = consistent_families(parse_spec(dump(spec)))
    assert family.members == ("cells", "race_education", "sex_race", "total")


def test_explicit_families_of_counts_and_of_sums_load_side_by_side():
    spec = education_sex({"consistent": [["cells", "by_education"], ["sum_cells", "sum_by_sex"]], "integer": True},
                         bounded("sum", "sum_cells", education=EDUCATION, sex=SEX),
                         bounded("sum", "sum_by_sex", sex=SEX))
    families = consistent_families(parse_spec(dump(spec)))
    assert [f.members for f in families] == [("cells", "by_education"), ("sum_cells", "sum_by_sex")]


def test_a_hierarchy_family_loads_with_the_parent_mapping():
    spec = parse_spec(dump(ages(nonnegative=True, integer=True)))
    (family,) = consistent_families(spec)
    assert family.members == ("by_age", "by_band", "total")
    child, child_to_parent = family.parents["band"]
    assert child == "age"
    assert dict(child_to_parent) == {a: band for band, members in BANDS.items() for a in members}


def test_a_chain_of_two_hierarchies_is_accepted():
    """county > state > region: the region margin reaches the base's counties through the states."""
    counties = ["c1", "c2", "c3", "c4", "c5"]
    hierarchies = [{"parent": "state", "child": "county", "groups": {"s1": ["c1", "c2"], "s2": ["c3", "c4", "c5"]}},
                   {"parent": "region", "child": "state", "groups": {"north": ["s1", "s2"]}}]
    spec = document([count("by_county", county=counties, sex=SEX), count("by_state", state=["s1", "s2"]),
                     count("by_region_sex", region=["north"], sex=SEX), count("total")],
                    {"consistent": True, "hierarchies": hierarchies})
    (family,) = consistent_families(parse_spec(dump(spec)))
    assert family.base == "by_county"
    assert family.parents["state"][0] == "county" and family.parents["region"][0] == "state"


def test_a_broken_link_in_a_chain_of_hierarchies_is_refused():
    hierarchies = [{"parent": "state", "child": "county", "groups": {"s1": ["c1"], "s2": ["c2"]}},
                   {"parent": "region", "child": "state", "groups": {"north": ["s1"]}}]
    spec = document([count("by_county", county=["c1", "c2"]), count("by_region", region=["north"])],
                    {"consistent": True, "hierarchies": hierarchies})
    message = refusal(spec)
    assert "postprocess.consistent: the hierarchy 'region' > 'state' places no parent for the 'state' key(s) 's2'" \
        in message


def test_a_sum_family_with_a_hierarchy_is_limited_to_the_dense_size():
    """The exact rounding allowance of a sum family with a hierarchy is computed densely (families.py)."""
    cells = list(range(DENSE_BASE_CELLS + 1))
    groups = {"low": cells[: len(cells) // 2], "high": cells[len(cells) // 2:]}
    spec = document([bounded("sum", "by_cell", cell=cells), bounded("sum", "by_half", half=["low", "high"])],
                    {"consistent": [["by_cell", "by_half"]],
                     "hierarchies": [{"parent": "half", "child": "cell", "groups": groups}]})
    assert f"limited to {DENSE_BASE_CELLS} base cells" in refusal(spec)
    smaller = copy.deepcopy(spec)
    smaller["aggregates"][0]["keys"]["cell"] = cells[:-1]
    smaller["postprocess"]["hierarchies"][0]["groups"]["high"] = cells[len(cells) // 2:-1]
    assert consistent_families(parse_spec(dump(smaller)))[0].members == ("by_cell", "by_half")


_PLAN_IN_A_CHILD = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (__LIMIT__, __LIMIT__))
    from dp_operators.release import plan_release
    from dp_operators.release.consistent import plan_families
    from dp_operators.spec import ReleaseSpec
    columns = [f"q{i}" for i in range(__COLUMNS__)]
    document = {"version": 1, "release": "survey", "budget_account": "acct", "privacy_unit": "person",
                "aggregates": [
                    {"name": "answers", "kind": "count", "group_by": columns, "keys": {c: ["no", "yes"] for c in columns},
                     "mechanism": "discrete_gaussian", "budget": {"rho": "1/100"}},
                    {"name": "respondents", "kind": "count", "mechanism": "discrete_gaussian", "budget": {"rho": "1/100"}}],
                "postprocess": {"consistent": True}}
    spec = ReleaseSpec.model_validate(document)
    plan = plan_release(spec, accountant="zcdp")
    try:
        plan_families(plan)
    except MemoryError:
        print("MemoryError")
        sys.exit(3)
    print("planned")
""")


def _plan_in_a_child(columns: int, limit_bytes: int) -> subprocess.CompletedProcess:
    code = _PLAN_IN_A_CHILD.replace("__LIMIT__", str(limit_bytes)).replace("__COLUMNS__", str(columns))
    environment = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=120)


def test_a_family_base_of_more_than_ten_columns_is_refused_before_planning_runs_out_of_memory():
    """A family whose base groups by more than MAX_BASE_COLUMNS (10) columns is refused at load with a clear error,
    never planned into an out-of-memory kill: 15 yes/no columns (32,768 cells) and the total would build a
    2^15 x 2^15 float64 matrix (8.6 GB; the cost is 4^columns, not the number of cells). Run in a child limited to
    4 GB of address space; the control (10 columns) plans within the same limit."""
    limit = 4 * 2**30
    small = _plan_in_a_child(10, limit)
    assert small.returncode == 0 and "planned" in small.stdout, small.stderr[-2000:]
    large = _plan_in_a_child(15, limit)
    assert large.returncode != 0 and "MemoryError" not in large.stderr, large.stderr[-2000:]
    assert "groups by 15 columns; at most 10 are supported" in large.stderr, large.stderr[-2000:]


def _without_postprocess(document_: dict) -> dict:
    return {k: v for k, v in document_.items() if k != "postprocess"}


def _set(**postprocess) -> Callable[[dict], dict]:
    return lambda document_: {**document_, "postprocess": postprocess}


def _laplace(document_: dict) -> dict:
    """The example with every aggregate noised by discrete Laplace at epsilon 1/2 (a pure-DP release)."""
    for aggregate in document_["aggregates"]:
        aggregate.update(mechanism="discrete_laplace", budget={"epsilon": 0.5})
    return document_


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: d, id="the example's consistent nonnegative integer"),
        pytest.param(_set(consistent=True), id="consistent only"),
        pytest.param(_set(consistent=[["people_by_education_sex", "people"]], nonnegative=True),
                     id="an explicit family"),
        pytest.param(_set(clamp_nonnegative=False), id="no family, no clamp"),
    ],
)
@pytest.mark.parametrize(
    ("noise", "accountant"),
    [
        pytest.param(lambda d: d, "zcdp", id="gaussian on zcdp"),
        pytest.param(_laplace, "pure_dp", id="laplace on pure_dp"),
        pytest.param(_laplace, "approx_dp", id="laplace on approx_dp"),
    ],
)
def test_postprocessing_never_changes_the_plan_or_the_charge(change, noise, accountant):
    original = noise(load_yaml(CONSISTENT_SPEC.read_text()))
    plain = ReleaseSpec.model_validate(_without_postprocess(original))
    postprocessed = ReleaseSpec.model_validate(change(copy.deepcopy(original)))
    assert plain.postprocess.consistent is False
    plain_plan = plan_release(plain, accountant=accountant)
    post_plan = plan_release(postprocessed, accountant=accountant)
    assert len(post_plan.steps) == 4
    assert post_plan.steps == plain_plan.steps
    assert [s.describe() for s in post_plan.steps] == [s.describe() for s in plain_plan.steps]
    assert post_plan.charge(accountant) == plain_plan.charge(accountant) > 0
    assert post_plan.delta(accountant) == plain_plan.delta(accountant)


# -- refusals a user meets editing the example or writing Adult's age bands ---------------------------------------


@pytest.mark.parametrize(("postprocess", "aggregates", "expected"), [
    pytest.param({"consistent": True}, [adult_count("people_by_education", {"education": ["Bachelors", "HS-grad"]}),
                                        adult_count("people_by_sex", {"sex": ["Female", "Male"]}),
                                        adult_count("people")],
                 ["no aggregate of the family", "add that table"], id="a family without the cross table"),
    pytest.param({"consistent": True}, [
        adult_count("people_by_education_sex", {"education": ["Bachelors", "HS-grad", "Masters"],
                                                "sex": ["Female", "Male"]}),
        adult_count("people_by_education", {"education": ["Bachelors", "HS-grad"]})],
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
    """A family without its cross table, a margin missing a key, a mean member, sums with other bounds and integer
    with a grid are refused at load under ``postprocess.consistent``, naming the aggregate and the fix."""
    with pytest.raises(SpecError) as refused:
        load_spec(adult_write(tmp_path, adult_document("mistake", aggregates, postprocess)))
    message = str(refused.value)
    assert "postprocess.consistent" in message
    for part in expected:
        assert part in message, message


def test_hierarchy_mistakes_in_keys_are_refused_at_load(tmp_path):
    """A hierarchy that places no parent for a base key, or lists a band no base key maps to, is refused at load
    with the keys named; the right groups load."""
    groups = {band: list(ages) for band, ages in ADULT_BANDS.items()}
    groups["75+"].remove(90)
    with pytest.raises(SpecError, match=r"'age_band' > 'age' places no parent for the 'age' key\(s\) 90 that the "
                                        r"family's base 'people_by_age' lists"):
        load_spec(adult_age_spec(tmp_path, groups=groups))
    groups = {band: list(ages) for band, ages in ADULT_BANDS.items()}
    groups["75 +"] = groups.pop("75+")
    with pytest.raises(SpecError, match=r"'people_by_age_band' lists 'age_band' keys \W*'75\+'\W* no base key maps to, "
                                        r"and misses \W*'75 \+'"):
        load_spec(adult_age_spec(tmp_path, groups=groups))
    assert load_spec(adult_age_spec(tmp_path)).postprocess.hierarchies  # control: the right groups load


@pytest.mark.parametrize("flag", ["consistent", "nonnegative", "integer"])
@pytest.mark.parametrize(("written", "expected"), [("yes", True), ("Yes", True), ("on", True), ("no", False)])
def test_postprocess_flags_read_yes_and_no_as_booleans_like_every_boolean_field(tmp_path, flag, written, expected):
    """tests/spec/test_spec_yaml_traps.py::test_a_boolean_field_still_takes_yes_and_no: where a boolean is expected,
    'yes' and 'no' mean what the author meant; ``consistent`` reads them too."""
    others = {"nonnegative": "false", "integer": "false"} if (flag, expected) == ("consistent", False) else {}
    spec = load_spec(adult_write(tmp_path, example_with(**{flag: written}, **others)))
    assert getattr(spec.postprocess, flag) is expected
    if flag == "consistent":
        example = load_spec(CONSISTENT_SPEC)
        assert consistent_families(spec) == (consistent_families(example) if expected else [])


@pytest.mark.parametrize(("flag", "message"), [
    pytest.param("consistent", r"postprocess.consistent: must be true, false or a list of families.*'maybe'",
                 id="consistent"),
    pytest.param("nonnegative", r"postprocess.nonnegative: .*valid boolean", id="nonnegative"),
    pytest.param("integer", r"postprocess.integer: .*valid boolean", id="integer"),
])
def test_postprocess_flags_refuse_other_text(tmp_path, flag, message):
    """``consistent``, ``nonnegative`` and ``integer`` refuse text other than a YAML boolean (``maybe``)."""
    with pytest.raises(SpecError, match=message):
        load_spec(adult_write(tmp_path, example_with(**{flag: "maybe"})))


def test_a_hierarchy_child_key_the_base_does_not_list_is_refused_at_load(tmp_path):
    """The base forgets age 50, the hierarchy puts 50 in 45-54: the band counts people the cells cannot hold."""
    path = adult_age_spec(tmp_path, base_ages=[a for a in range(17, 91) if a != 50])
    with pytest.raises(SpecError, match=r"'age' key\(s\) 50 under parents the family releases, but the base "
                                        r"'people_by_age' does not list them.*add the key\(s\) to the base's keys"):
        load_spec(path)


def test_a_flat_list_of_names_says_to_write_a_list_of_families(tmp_path):
    """``consistent: [a, b, c]`` is refused with a message showing a list of families (``[[a, b, ...]]``)."""
    text = CONSISTENT_SPEC.read_text().replace("  consistent: true ",
                                       "  consistent: [people_by_education_sex, people_by_sex, people] ")
    with pytest.raises(SpecError) as refused:
        load_spec(adult_write(tmp_path, text))
    message = str(refused.value)
    assert "famil" in message and "[[" in message, message  # e.g. "a list of families: [[a, b, ...]]"


@pytest.mark.parametrize(("columns", "typo"), [
    pytest.param({"parent_column": "ageband"}, "ageband", id="parent"),
    pytest.param({"child_column": "agee"}, "agee", id="child"),
])
def test_a_typo_in_a_hierarchy_column_is_named(tmp_path, columns, typo):
    """A misspelt parent or child column of a hierarchy is named in the refusal, with ``hierarchies[0]``."""
    with pytest.raises(SpecError) as refused:
        load_spec(adult_age_spec(tmp_path, **columns))
    message = str(refused.value)
    # was: "no aggregate of the family ... groups by every column ...: add that table", the hierarchy unnamed
    assert typo in message and "hierarchies[0]" in message, message


def test_an_unrelated_count_under_consistent_true_suggests_listing_the_families(tmp_path):
    """A count that belongs to no family under ``consistent: true`` is refused with the advice to list the
    families."""
    text = CONSISTENT_SPEC.read_text().replace("postprocess:", (
        "  - {name: people_by_race, kind: count, group_by: [race], keys: {race: [White, Black, Other]}, "
        "mechanism: discrete_gaussian, budget: {rho: 0.01}}\npostprocess:"))
    with pytest.raises(SpecError) as refused:
        load_spec(adult_write(tmp_path, text))
    message = str(refused.value)
    assert re.search(r"list (the |its )?families|consistent: \[\[", message), message


@pytest.mark.parametrize("where", ["margin", "hierarchy"])
def test_int_and_text_keys_are_distinct_keys_of_a_family(tmp_path, where):
    """docs/consistency.md: refused at load, 'margin keys that differ from the base's'; the engine elsewhere keeps
    1 and '1' apart (int rows never match text keys). Control: the same family with keys of one type loads."""
    def margin_spec(margin_keys: list) -> Path:
        return adult_write(tmp_path, adult_document("strint", [adult_count("by_k_s", {"k": [1, 2, 3], "s": ["F", "M"]}),
                                                   adult_count("by_k", {"k": margin_keys}), adult_count("total")],
                                        {"consistent": True}))

    def hierarchy_spec(as_text: bool) -> Path:
        groups = {band: list(ages) for band, ages in ADULT_BANDS.items()}
        if as_text:
            groups["17-24"] = [str(a) for a in groups["17-24"]]
        return adult_age_spec(tmp_path, groups=groups)

    build = margin_spec if where == "margin" else hierarchy_spec
    mixed, same = (["1", "2", "3"], [1, 2, 3]) if where == "margin" else (True, False)
    with pytest.raises(SpecError, match=r"'1', '2', '3'|17, 18, 19"):
        load_spec(build(mixed))
    assert load_spec(build(same)).postprocess.consistent is True
