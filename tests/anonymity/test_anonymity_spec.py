"""The YAML anonymity spec: valid documents load, invalid ones name the file, the field path and the reason."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from .anonymity_tables import REPO_ROOT, SHARED_DATA

from dp_operators.anonymity import (
    AnonymitySpecError,
    GeneralisationHierarchy,
    QuasiIdentifier,
    load_anonymity_spec,
    parse_anonymity_spec,
)

MINIMAL = """
version: 1
check: patients
quasi_identifiers: [zip, age]
sensitive_attributes:
  - {name: disease, type: categorical}
targets: {k: 3}
"""


def test_minimal_spec_defaults():
    spec = parse_anonymity_spec(MINIMAL)
    assert spec.on_failure == "fail"
    assert spec.suppression.max_fraction == 0.0
    assert spec.sensitive_attributes[0].distance == "equal"
    assert spec.anonymisation.algorithm == "full_domain" and spec.anonymisation.metric == "loss"
    assert spec.risk_threshold == 0.2


def test_example_spec_loads():
    spec = load_anonymity_spec(REPO_ROOT / "config" / "anonymity" / "adult_microdata.yaml")
    assert spec.qi_names == ["age", "sex", "race", "native_country", "education"]
    assert spec.hierarchies() == {}
    distances = {a.name: a.distance for a in spec.sensitive_attributes}
    assert distances == {"income": "equal", "hours_per_week": "ordered", "occupation": "hierarchical"}


@pytest.mark.parametrize(
    ("replace", "by", "path", "reason"),
    [
        pytest.param("targets: {k: 3}", "targets: {k: 3, kk: 4}", "targets.kk",
                     "unknown field (check the spelling; see docs/anonymity.md)", id="unknown field"),
        pytest.param("targets: {k: 3}", "targets: {k: true}", "targets.k", "not a boolean", id="k is a boolean"),
        pytest.param("targets: {k: 3}", "targets: {l: {kind: distinct, l: true}}", "targets.l.l", "not a boolean",
                     id="l is a boolean"),
        pytest.param("targets: {k: 3}", "targets: {t: .nan}", "targets.t", "must be a finite number in [0, 1]",
                     id="t is NaN"),
        pytest.param("targets: {k: 3}", "targets: {t: true}", "targets.t", "not a boolean", id="t is a boolean"),
        pytest.param(
            "targets: {k: 3}", "targets: {k: 3}\nsuppression: {max_fraction: .nan}", "suppression.max_fraction",
            "must be a finite number in [0, 1]", id="NaN suppression",
        ),
        pytest.param("targets: {k: 3}", "targets: {k: 0}", "targets.k",
                     "must be at least 1, got 0; k is the smallest equivalence class", id="k below 1"),
        pytest.param("targets: {k: 3}", "targets: {}", "targets", "at least one target", id="no target"),
        pytest.param("targets: {k: 3}", "targets: {t: 1.5}", "targets.t",
                     "must be at most 1, got 1.5; t is the largest",
                     id="t above 1"),
        pytest.param(
            "targets: {k: 3}", "targets: {l: {kind: recursive, l: 2}}", "targets.l", "needs c", id="recursive without c"
        ),
        pytest.param(
            "targets: {k: 3}", "targets: {l: {kind: distinct, l: 2.5}}", "targets.l", "integer l", id="fractional l"
        ),
        pytest.param(
            "type: categorical}", "type: nominal}", "sensitive_attributes.0.type", "'ordered' or 'categorical'",
            id="bad attribute type",
        ),
        pytest.param("[zip, age]", "[zip, zip]", "quasi_identifiers", "more than once", id="duplicate QI"),
        pytest.param("[zip, age]", "[zip, disease]", "<document>", "both quasi-identifier", id="QI is also sensitive"),
        pytest.param("version: 1", "version: 2", "version", "must be 1, got 2", id="unknown version"),
        pytest.param(
            "type: categorical}", "type: ordered, hierarchy: {'*': [a]}}", "sensitive_attributes.0",
            "hierarchy applies to a categorical", id="hierarchy on ordered",
        ),
        pytest.param(
            "type: categorical}", "type: categorical, hierarchy: {'*': [a, a]}}", "sensitive_attributes.0",
            "more than once", id="duplicate hierarchy leaf",
        ),
        pytest.param(
            "targets: {k: 3}", "targets: {k: 3}\nsuppression: {max_fraction: -0.1}", "suppression.max_fraction",
            "must be at least 0, got -0.1; the largest fraction of the table's rows that may be suppressed", 
            id="negative suppression",
        ),
        pytest.param("targets: {k: 3}", "targets: {k: 3}\non_failure: ignore", "on_failure", "'fail' or 'warn'",
                     id="bad on_failure"),
        *[
            pytest.param("targets: {k: 3}", f"targets: {{{field}: {value}}}", path, reason, id=f"{field} {value}")
            for field, path in [
                ("prosecutor_risk: {highest", "targets.prosecutor_risk.highest"),
                ("journalist_risk: {average", "targets.journalist_risk.average"),
                ("prosecutor_risk: {records_at_risk", "targets.prosecutor_risk.records_at_risk"),
            ]
            for value, reason in [("true}", "not a boolean"), (".nan}", "must be a finite number in [0, 1]"),
                                  ("1.5}", "must be at most 1, got 1.5; the largest")]
        ],
        pytest.param("targets: {k: 3}", "targets: {prosecutor_risk: {highest: 0}}", "targets.prosecutor_risk.highest",
                     "must be greater than 0, got 0; the largest re-identification risk", id="highest risk 0"),
        pytest.param("targets: {k: 3}", "targets: {journalist_risk: {average: 0}}", "targets.journalist_risk.average",
                     "must be greater than 0, got 0; the largest mean record risk", id="average risk 0"),
        pytest.param("targets: {k: 3}", "targets: {prosecutor_risk: {}}", "targets.prosecutor_risk",
                     "declare at least one of highest, average, records_at_risk", id="empty risk target"),
        pytest.param("targets: {k: 3}", "targets: {prosecutor_risk: {highst: 0.1}}", "targets.prosecutor_risk.highst",
                     "unknown field", id="misspelt risk field"),
        *[
            pytest.param("targets: {k: 3}", f"targets: {{marketer_risk: {value}}}", "targets.marketer_risk", reason,
                         id=f"marketer risk {value}")
            for value, reason in [("true", "not a boolean"), (".nan", "must be a finite number in [0, 1]"),
                                  ("0", "must be greater than 0, got 0; the largest expected fraction"),
                                  ("1.01", "must be at most 1, got 1.01; the largest expected fraction")]
        ],
        *[
            pytest.param("targets: {k: 3}", f"targets: {{k: 3}}\nrisk_threshold: {value}", "risk_threshold", reason,
                         id=f"risk threshold {value}")
            for value, reason in [("true", "not a boolean"), (".nan", "must be a finite number in [0, 1]"),
                                  ("0", "must be greater than 0, got 0; a record whose"),
                                  ("2", "must be at most 1, got 2; a record whose")]
        ],
        pytest.param("targets: {k: 3}", "targets: {k: 3}\nanonymisation: {algorithm: incognito}",
                     "anonymisation.algorithm", "'full_domain' or 'mondrian'", id="unknown algorithm"),
        pytest.param("targets: {k: 3}", "targets: {k: 3}\nanonymisation: {metric: precision}", "anonymisation.metric",
                     "'loss', 'ncp', 'discernibility' or 'entropy'", id="unknown metric"),
        pytest.param("targets: {k: 3}", "targets: {k: 3}\nanonymisation: {metrc: ncp}", "anonymisation.metrc",
                     "unknown field", id="misspelt anonymisation field"),
        pytest.param("[zip, age]", "[zip, {name: age, typ: numeric}]", "quasi_identifiers.1.typ", "unknown field",
                     id="misspelt QI field"),
        pytest.param("[zip, age]", "[zip, {name: age, type: ordered}]", "quasi_identifiers.1.type",
                     "'numeric' or 'categorical'", id="bad QI type"),
        pytest.param("[zip, age]", "[zip, {type: numeric}]", "quasi_identifiers.1.name", "Field required",
                     id="QI without name"),
        pytest.param("[zip, age]", "[zip, 5]", "quasi_identifiers.1", "a column name or a mapping", id="QI number"),
        pytest.param("[zip, age]", "[zip, {name: zip, type: numeric}]", "quasi_identifiers", "more than once",
                     id="duplicate QI mapping"),
        pytest.param("[zip, age]", "[zip, {name: disease}]", "<document>", "both quasi-identifier",
                     id="QI mapping is also sensitive"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {}}]", "quasi_identifiers.1.hierarchy",
                     "declare exactly one of file, intervals, tree (got none)", id="empty hierarchy"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {intervals: [5], tree: {a: [b]}}}]",
                     "quasi_identifiers.1.hierarchy", "exactly one of file, intervals, tree (got intervals, tree)",
                     id="two hierarchies"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {intervals: [5], separator: ','}}]",
                     "quasi_identifiers.1.hierarchy", "separator applies to a hierarchy file", id="stray separator"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {tree: {a: [b]}, origin: 3}}]",
                     "quasi_identifiers.1.hierarchy", "origin applies to intervals", id="stray origin"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {intervals: [5, 12]}}]",
                     "quasi_identifiers.1.hierarchy",
                     "interval width 1: 12 is not a whole multiple of the previous width 5 (e.g. 10 or 15)",
                     id="intervals do not nest"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {intervals: [5, 1e300]}}]",
                     "quasi_identifiers.1.hierarchy",
                     "interval width 1: 1e+300 is more than 2**52 times the finest width 5",
                     id="widths too far apart to count"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {intervals: [true]}}]",
                     "quasi_identifiers.1.hierarchy.intervals.0", "not a boolean", id="boolean interval width"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {intervals: []}}]",
                     "quasi_identifiers.1.hierarchy.intervals", "at least 1 item", id="no interval widths"),
        pytest.param("[zip, age]", "[zip, {name: age, type: categorical, hierarchy: {intervals: [5]}}]",
                     "quasi_identifiers.1", "interval hierarchies apply to numeric columns",
                     id="categorical intervals"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {tree: {'*': {a: [b], c: {d: [e]}}}}}]",
                     "quasi_identifiers.1.hierarchy", "tree: values sit at different depths (1 value(s) at depth 2, "
                     "1 value(s) at depth 3)", id="uneven tree"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {file: absent.csv}}]",
                     "quasi_identifiers.1.hierarchy", "absent.csv: cannot read the hierarchy file", id="missing file"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {file: h.csv, separator: ';;'}}]",
                     "quasi_identifiers.1.hierarchy.separator", "at most 1 character", id="long separator"),
    ],
)
def test_invalid_spec_names_file_path_and_reason(tmp_path: Path, replace, by, path, reason):
    assert replace in MINIMAL
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(MINIMAL.replace(replace, by, 1))
    with pytest.raises(AnonymitySpecError) as info:
        load_anonymity_spec(spec_file)
    message = str(info.value)
    assert message.startswith(f"{spec_file}: {path}: "), message
    assert reason in message


def test_risk_targets_in_range_are_accepted():
    spec = parse_anonymity_spec(MINIMAL.replace(
        "targets: {k: 3}",
        "targets: {prosecutor_risk: {highest: 1, records_at_risk: 0}, journalist_risk: {average: 0.05}, "
        "marketer_risk: 0.1}\nrisk_threshold: 1",
    ))
    assert spec.targets.prosecutor_risk.highest == 1 and spec.targets.prosecutor_risk.records_at_risk == 0
    assert spec.targets.journalist_risk.average == 0.05 and spec.targets.marketer_risk == 0.1
    assert spec.risk_threshold == 1 and spec.targets.k is None


# -- quasi-identifier hierarchies --------------------------------------------------------------------------------------

HIERARCHY_SPEC = """
version: 1
check: towns
quasi_identifiers:
  - sex
  - {name: age, type: numeric, hierarchy: {intervals: [5, 10], origin: 2}}
  - {name: town, hierarchy: {file: HIERARCHY_FILE}}
  - {name: region, type: categorical, hierarchy: {file: regions.txt, separator: ","}}
  - name: education
    hierarchy:
      tree: {"*": {Higher: [Bachelors, Masters], Secondary: [HS-grad]}}
targets: {k: 2}
anonymisation: {algorithm: full_domain, metric: ncp}
"""


def write_hierarchy_files(folder: Path, town_file: str = "hierarchies/towns.csv") -> Path:
    (folder / "hierarchies").mkdir(parents=True, exist_ok=True)
    (folder / "hierarchies" / "towns.csv").write_text("north;N;*\nsouth;S;*\n")
    (folder / "regions.txt").write_text("r1,R,*\nr2,R,*\n")
    spec_file = folder / "spec.yaml"
    spec_file.write_text(HIERARCHY_SPEC.replace("HIERARCHY_FILE", town_file))
    return spec_file


def test_every_hierarchy_form_loads(tmp_path, monkeypatch):
    spec_file = write_hierarchy_files(tmp_path / "checks")
    monkeypatch.chdir(tmp_path)  # relative files resolve against the spec's folder, not the current directory
    spec = load_anonymity_spec(spec_file)
    assert spec.qi_names == ["sex", "age", "town", "region", "education"]
    assert [q.type for q in spec.quasi_identifiers] == [None, "numeric", None, "categorical", None]
    assert spec.quasi_identifiers[0] == QuasiIdentifier(name="sex")
    assert spec.quasi_identifiers[0].generalisation_hierarchy() is None
    hierarchies = spec.hierarchies()
    assert sorted(hierarchies) == ["age", "education", "region", "town"]
    assert hierarchies["age"] == GeneralisationHierarchy.intervals([5, 10], origin=2)
    assert hierarchies["age"].generalise(7, 1) == "[7, 12)" and hierarchies["age"].generalise(7, 2) == "[2, 12)"
    assert hierarchies["town"].values == ("north", "south") and hierarchies["town"].generalise("south", 1) == "S"
    assert spec.quasi_identifiers[2].hierarchy.file == tmp_path / "checks" / "hierarchies" / "towns.csv"
    assert hierarchies["region"].height == 2 and hierarchies["region"].generalise("r2", 1) == "R"
    assert hierarchies["education"].height == 2 and hierarchies["education"].generalise("HS-grad", 1) == "Secondary"
    assert spec.anonymisation.algorithm == "full_domain" and spec.anonymisation.metric == "ncp"
    # The parsed hierarchies travel with the spec (Airflow may pickle it).
    assert pickle.loads(pickle.dumps(spec)).hierarchies() == hierarchies


def test_absolute_hierarchy_path(tmp_path):
    spec_file = write_hierarchy_files(tmp_path, town_file=str(tmp_path / "hierarchies" / "towns.csv"))
    spec = load_anonymity_spec(spec_file)
    assert spec.hierarchies()["town"].values == ("north", "south")


def test_parse_resolves_against_base_dir_or_current_directory(tmp_path, monkeypatch):
    write_hierarchy_files(tmp_path)
    text = HIERARCHY_SPEC.replace("HIERARCHY_FILE", "hierarchies/towns.csv")
    assert parse_anonymity_spec(text, base_dir=tmp_path).hierarchies()["town"].height == 2
    monkeypatch.chdir(tmp_path)
    assert parse_anonymity_spec(text).hierarchies()["town"].height == 2
    monkeypatch.chdir(tmp_path / "hierarchies")
    with pytest.raises(AnonymitySpecError, match=r"^<string>: quasi_identifiers.2.hierarchy: .*cannot read"):
        parse_anonymity_spec(text)


def test_bad_hierarchy_file_fails_with_spec_path_file_and_line(tmp_path):
    spec_file = write_hierarchy_files(tmp_path)
    rows = "".join(f"t{i};{'N' if i % 2 else 'S'};*\n" for i in range(6)) + "t6;N;X\n"
    (tmp_path / "hierarchies" / "towns.csv").write_text(rows)
    with pytest.raises(AnonymitySpecError) as caught:
        load_anonymity_spec(spec_file)
    town_file = tmp_path / "hierarchies" / "towns.csv"
    assert str(caught.value) == (
        f"{spec_file}: quasi_identifiers.2.hierarchy: {town_file}: line 7: the level-1 label (column 2) generalises "
        "to a different level-2 label than on line 2; generalisation must be a function: give that label one "
        "parent, or rename one of them"
    )
    assert "t6" not in str(caught.value)


def test_arx_adult_hierarchy_in_a_spec():
    folder = SHARED_DATA / "arx_adult"
    if not (folder / "adult_hierarchy_education.csv").exists():
        pytest.skip(f"{folder} is missing: the shared test data must sit beside the project")
    spec = parse_anonymity_spec(
        "version: 1\ncheck: c\nquasi_identifiers: [{name: education, hierarchy: {file: adult_hierarchy_education.csv}}]"
        "\ntargets: {k: 5}", base_dir=folder,
    )
    education = spec.hierarchies()["education"]
    assert education.height == 3 and education.generalise("Masters", 3) == "*"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("version: [1", "not valid YAML", id="broken YAML"),
        pytest.param("- a\n- b", "expected a mapping", id="not a mapping"),
    ],
)
def test_unparseable_document(text, reason):
    with pytest.raises(AnonymitySpecError, match=f"^spec.yaml: <document>: {reason}"):
        parse_anonymity_spec(text, source="spec.yaml")


def test_missing_file(tmp_path: Path):
    with pytest.raises(AnonymitySpecError, match="cannot read the spec file"):
        load_anonymity_spec(tmp_path / "absent.yaml")


def test_spec_error_is_a_value_error():
    assert issubclass(AnonymitySpecError, ValueError)


# -- numbers are numbers: quoted text is refused, integers are real numbers ------------------------------------------


@pytest.mark.parametrize(
    ("replace", "by", "path"),
    [
        pytest.param("targets: {k: 3}", "targets: {k: '5'}", "targets.k", id="k"),
        pytest.param("targets: {k: 3}", "targets: {l: {kind: entropy, l: '2'}}", "targets.l.l", id="l"),
        pytest.param("targets: {k: 3}", "targets: {l: {kind: recursive, l: 2, c: '3'}}", "targets.l.c", id="c"),
        pytest.param("targets: {k: 3}", "targets: {t: '0.2'}", "targets.t", id="t"),
        *[
            pytest.param("targets: {k: 3}", f"targets: {{{model}_risk: {{{field}: '0.1'}}}}",
                         f"targets.{model}_risk.{field}", id=f"{model} {field}")
            for model in ("prosecutor", "journalist") for field in ("highest", "average", "records_at_risk")
        ],
        pytest.param("targets: {k: 3}", "targets: {marketer_risk: '0.1'}", "targets.marketer_risk", id="marketer"),
        pytest.param("targets: {k: 3}", "targets: {k: 3}\nsuppression: {max_fraction: '0.01'}",
                     "suppression.max_fraction", id="max_fraction"),
        pytest.param("targets: {k: 3}", "targets: {k: 3}\nrisk_threshold: '0.2'", "risk_threshold",
                     id="risk_threshold"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {intervals: [5, '10']}}]",
                     "quasi_identifiers.1.hierarchy.intervals.1", id="interval width"),
        pytest.param("[zip, age]", "[zip, {name: age, hierarchy: {intervals: [5], origin: '2'}}]",
                     "quasi_identifiers.1.hierarchy.origin", id="interval origin"),
    ],
)
def test_quoted_numbers_are_refused(replace, by, path):
    assert replace in MINIMAL
    with pytest.raises(AnonymitySpecError) as caught:
        parse_anonymity_spec(MINIMAL.replace(replace, by, 1), source="q.yaml")
    message = str(caught.value)
    assert message.startswith(f"q.yaml: {path}: must be a number, not text ("), message
    assert "without quotes" in message and len(message.splitlines()) == 1


def test_integers_are_accepted_where_real_numbers_are_expected():
    spec = parse_anonymity_spec(MINIMAL.replace("[zip, age]", "[zip, {name: age, hierarchy: {intervals: [5, 10], "
                                                "origin: 2}}]").replace(
        "targets: {k: 3}",
        "targets: {k: 3, t: 1, l: {kind: recursive, l: 2, c: 3}, prosecutor_risk: {highest: 1, average: 1, "
        "records_at_risk: 0}, marketer_risk: 1}\nsuppression: {max_fraction: 1}\nrisk_threshold: 1",
    ))
    targets = spec.targets
    assert (targets.k, targets.t, targets.l.l, targets.l.c, targets.marketer_risk) == (3, 1.0, 2.0, 3.0, 1.0)
    assert (targets.prosecutor_risk.highest, targets.prosecutor_risk.records_at_risk) == (1.0, 0.0)
    assert spec.suppression.max_fraction == 1.0 and spec.risk_threshold == 1.0
    assert spec.hierarchies()["age"] == GeneralisationHierarchy.intervals([5.0, 10.0], origin=2.0)


# -- messages say the allowed values and what the field means --------------------------------------------------------


@pytest.mark.parametrize(
    ("by", "expected"),
    [
        pytest.param(
            "targets: {k: 0}",
            "targets.k: must be at least 1, got 0; k is the smallest equivalence class a release may have (every row "
            "shares its quasi-identifier values with at least k - 1 others): a whole number >= 1, e.g. 5",
            id="k 0",
        ),
        pytest.param(
            "targets: {k: 3}\nsuppression: {max_fraction: 1.5}",
            "suppression.max_fraction: must be at most 1, got 1.5; the largest fraction of the table's rows that may "
            "be suppressed (withheld from the release): a number in [0, 1], e.g. 0.01 for 1%",
            id="max_fraction 1.5",
        ),
        pytest.param(
            "targets: {k: 2.5}",
            "targets.k: must be a whole number, got 2.5; k is the smallest equivalence class a release may have "
            "(every row shares its quasi-identifier values with at least k - 1 others): a whole number >= 1, e.g. 5",
            id="k 2.5",
        ),
        pytest.param(
            "targets: {t: [0.2]}",
            "targets.t: must be a number, got list; t is the largest Earth Mover's Distance allowed between a "
            "class's sensitive-value distribution and the whole table's: a number in [0, 1], e.g. 0.2 (smaller is "
            "stricter)",
            id="t a list",
        ),
        pytest.param(
            "targets: {k: 3}\nanonymisation: {metric: precision}",
            "anonymisation.metric: must be 'loss', 'ncp', 'discernibility' or 'entropy', got 'precision'; the "
            "information loss the full-domain search minimises: loss (ARX's loss), ncp (normalised certainty "
            "penalty), discernibility or entropy (non-uniform entropy)",
            id="unknown metric",
        ),
    ],
)
def test_range_and_choice_errors_explain_the_field(by, expected):
    with pytest.raises(AnonymitySpecError) as caught:
        parse_anonymity_spec(MINIMAL.replace("targets: {k: 3}", by, 1), source="m.yaml")
    assert str(caught.value) == f"m.yaml: {expected}"


@pytest.mark.parametrize(
    ("widths", "expected"),
    [
        pytest.param("[5, 12]", "interval width 1: 12 is not a whole multiple of the previous width 5 (e.g. 10 or 15), "
                     "so its bands would not each lie inside one band of the next level; make it a whole multiple",
                     id="not nested"),
        pytest.param("[10, 5]", "interval width 1: 5 is not larger than the previous width 10; widths must be strictly "
                     "increasing, each a whole multiple (at least 2 times) of the previous, e.g. 10, 20",
                     id="decreasing"),
    ],
)
def test_interval_errors_say_only_what_is_wrong(widths, expected):
    text = MINIMAL.replace("[zip, age]", f"[zip, {{name: age, hierarchy: {{intervals: {widths}}}}}]")
    with pytest.raises(AnonymitySpecError) as caught:
        parse_anonymity_spec(text, source="i.yaml")
    assert str(caught.value) == f"i.yaml: quasi_identifiers.1.hierarchy: {expected}"


# -- Mondrian builds its own intervals and sets ----------------------------------------------------------------------


def test_mondrian_refuses_quasi_identifier_hierarchies(tmp_path):
    spec_file = write_hierarchy_files(tmp_path)
    spec_file.write_text(spec_file.read_text().replace("algorithm: full_domain", "algorithm: mondrian"))
    with pytest.raises(AnonymitySpecError) as caught:
        load_anonymity_spec(spec_file)
    assert str(caught.value) == (
        f"{spec_file}: <document>: Mondrian does not use quasi-identifier hierarchies (it builds intervals and sets), "
        "but quasi_identifiers.1.hierarchy (age), quasi_identifiers.2.hierarchy (town), quasi_identifiers.3.hierarchy "
        "(region), quasi_identifiers.4.hierarchy (education) declare(s) one; remove them or use algorithm: full_domain"
    )
    # A hierarchy file that does not exist is still reported (hierarchies are read before the algorithm is checked).
    missing = MINIMAL.replace("[zip, age]", "[zip, {name: age, hierarchy: {file: absent.csv}}]") + (
        "anonymisation: {algorithm: mondrian}\n")
    with pytest.raises(AnonymitySpecError, match="cannot read the hierarchy file"):
        parse_anonymity_spec(missing, base_dir=tmp_path)
    # Declared types are kept: Mondrian reads them.
    typed = MINIMAL.replace("[zip, age]", "[{name: zip, type: categorical}, age]")
    typed += "anonymisation: {algorithm: mondrian}\n"
    assert parse_anonymity_spec(typed).quasi_identifiers[0].type == "categorical"
