"""A spec's keys are what the author typed; ambiguous YAML 1.1 scalars are refused, not guessed.

The trap: PyYAML (YAML 1.1) reads ``keys: {married: [yes, no]}`` as ``[True, False]``; upstream rows ``"yes"`` and
``"no"`` then fall outside the key domain and the release publishes noised zeros while spending budget. Expected
readings come from the YAML 1.2.2 core schema (section 10.3.2), see tests/spec/test_yaml12.py.
"""

from __future__ import annotations

import datetime
import hashlib
from fractions import Fraction

import pytest
from pydantic import ValidationError

from dp_operators.anonymity.errors import AnonymitySpecError
from dp_operators.anonymity.spec import parse_anonymity_spec
from dp_operators.ledger.config import LedgerConfigError, declared_accountants, load_ledger_config
from dp_operators.release import prepare_inputs
from dp_operators.spec import ReleaseSpec, SpecError, load_spec_with_hash, parse_spec


def spec_text(keys: str, *, extra: str = "", budget: str = "{epsilon: 1}") -> str:
    return f"""\
version: 1
release: marital_status
budget_account: census_adult
privacy_unit: person
{extra}aggregates:
  - name: people
    kind: count
    group_by: [married]
    keys: {{married: {keys}}}
    mechanism: discrete_laplace
    budget: {budget}
"""


@pytest.mark.parametrize(
    ("written", "keys"),
    [
        pytest.param("[yes, no]", ["yes", "no"], id="yes/no"),
        pytest.param("[on, off]", ["on", "off"], id="on/off"),
        pytest.param("[y, n]", ["y", "n"], id="y/n"),
        pytest.param("[Yes, No, YES]", ["Yes", "No", "YES"], id="capitalised"),
        pytest.param("[2026-01-01, 2026-01-02]", ["2026-01-01", "2026-01-02"], id="dates"),
        pytest.param("[10:30, 9:15]", None, id="sexagesimal is refused"),
        pytest.param("['010', '1_000', '1:20', '1e3', 'true', '~']", ["010", "1_000", "1:20", "1e3", "true", "~"],
                     id="quoted traps are text"),
        pytest.param("[1, 2, 0x1F]", [1, 2, 31], id="integers stay integers"),
    ],
)
def test_key_values_are_the_text_the_author_typed(written, keys):
    if keys is None:
        with pytest.raises(SpecError, match=r"keys\.married\[0\]: 10:30 is ambiguous"):
            parse_spec(spec_text(written))
        return
    aggregate = parse_spec(spec_text(written)).aggregates[0]
    assert aggregate.keys == {"married": keys}
    assert all(type(value) is type(expected) for value, expected in zip(aggregate.keys["married"], keys))


def test_string_rows_yes_and_no_land_in_their_partitions():
    """End to end up to the noise: rows keyed "yes"/"no" are inside the public domain, so the
    true counts reach the mechanism (with YAML 1.1 keys they were dropped as outside it, and 0, 0 was noised)."""
    spec = parse_spec(spec_text("[yes, no]"))
    rows = [{"married": "yes", "count": 7}, {"married": "no", "count": 3}]
    prepared = prepare_inputs(spec, {"people": rows})
    assert prepared.keys["people"] == [("yes",), ("no",)]
    assert prepared.values[("people", "count")].tolist() == [7, 3]


@pytest.mark.parametrize(
    ("written", "got"),
    [
        pytest.param("[true, false]", "the boolean true", id="boolean"),
        pytest.param("[1.5, 2]", "the float 1.5", id="float"),
        pytest.param("[1000.0]", "the float 1000.0", id="float with integer value: no 1000.0 -> 1000"),
        pytest.param("[1e3]", "the float 1000.0", id="exponent float"),
        pytest.param("[~, a]", "null", id="tilde null"),
        pytest.param("[null]", "null", id="null"),
        pytest.param("[a, NULL]", "null", id="NULL"),
    ],
)
def test_key_values_of_other_types_are_refused_with_the_field_path_and_quote_advice(written, got):
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_text(written), source="releases/married.yaml")
    message = str(caught.value)
    assert message.startswith("releases/married.yaml: ")
    assert "aggregates[0](people).keys.married[" in message
    assert got in message and "quote the value as written" in message


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(True, id="True is not coerced to 1"),
        pytest.param(1000.0, id="1000.0 is not coerced to 1000"),
        pytest.param(None, id="None"),
        pytest.param(datetime.date(2026, 1, 1), id="date"),
        pytest.param(b"yes", id="bytes"),
    ],
)
def test_the_model_refuses_non_text_non_integer_keys_from_python_too(value):
    document = {
        "version": 1, "release": "r", "budget_account": "a", "privacy_unit": "person",
        "aggregates": [{"name": "c", "kind": "count", "group_by": ["k"], "keys": {"k": [value]},
                        "mechanism": "auto", "budget": {"epsilon": 1}}],
    }
    with pytest.raises(ValidationError) as caught:
        ReleaseSpec.model_validate(document)
    [problem] = caught.value.errors()
    assert problem["loc"][:5] == ("aggregates", 0, "keys", "k", 0)
    assert "key values are text or integers" in problem["msg"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param(spec_text("[010, '020']"), "aggregates[0](people).keys.married[0]", id="in keys"),
        pytest.param(spec_text("[a]", extra="description: 007\n"), "description", id="in free text"),
        pytest.param(spec_text("[a]", extra="contribution: {max_contributions_per_partition: 010}\n"),
                     "contribution.max_contributions_per_partition", id="in a contribution bound"),
        pytest.param(spec_text("[a]", budget="{epsilon: 01}"), "aggregates[0](people).budget.epsilon",
                     id="in a budget"),
    ],
)
def test_a_leading_zero_integer_is_refused_everywhere_with_quote_advice(text, where):
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="r.yaml")
    message = str(caught.value)
    assert message.startswith("r.yaml: cannot be read unambiguously")
    assert f"  {where}: " in message
    assert "is ambiguous" in message and "quote it" in message and "(line " in message


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        pytest.param("0.1", Fraction(1, 10), id="0.1 is 1/10"),
        pytest.param("1e-3", Fraction(1, 1000), id="1e-3 is 1/1000"),
        pytest.param("1.0e-3", Fraction(1, 1000), id="1.0e-3 is 1/1000"),
        pytest.param("'1/3'", Fraction(1, 3), id="'1/3' is 1/3"),
        pytest.param("'0.30000000000000001'", Fraction(30000000000000001, 10**17), id="quoted: exact decimal"),
        pytest.param("2", Fraction(2), id="an integer"),
    ],
)
def test_numbers_where_numbers_are_expected_read_exactly(written, expected):
    spec = parse_spec(spec_text("[a]", budget=f"{{epsilon: {written}}}"))
    assert spec.aggregates[0].budget.epsilon == expected


def test_delta_written_with_an_exponent_is_exact():
    spec = parse_spec(spec_text("[a]", budget="{epsilon: 1, delta: 1e-6}").replace("discrete_laplace", "auto"))
    assert spec.aggregates[0].budget.delta == Fraction(1, 10**6)


def test_an_unquoted_number_a_double_cannot_hold_is_refused_not_rounded():
    with pytest.raises(SpecError, match=r"budget\.epsilon: 0\.30000000000000001 is not held exactly"):
        parse_spec(spec_text("[a]", budget="{epsilon: 0.30000000000000001}"))


def test_spec_hash_is_the_hash_of_the_raw_text(tmp_path):
    text = spec_text("[yes, no, 2026-01-01]") + "# a comment the hash keeps\n"
    path = tmp_path / "married.yaml"
    path.write_text(text, encoding="utf-8")
    spec, digest = load_spec_with_hash(path)
    assert digest == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert spec.aggregates[0].keys == {"married": ["yes", "no", "2026-01-01"]}


def test_a_syntax_error_keeps_its_message_shape():
    with pytest.raises(SpecError, match=r"^r\.yaml: not valid YAML: "):
        parse_spec("version: 1\naggregates: [\n", source="r.yaml")


# -- ledgers.yaml and anonymity specs share the reader ------------------------------------------------------------
LEDGER = """\
version: 1
accounts:
  census_adult:
    accountant: zcdp
    cap: 0.5
    delta: 1e-6
    privacy_unit: person
    allowed_dags: [{dags}]
"""


def test_ledger_config_dag_ids_are_text(tmp_path):
    path = tmp_path / "ledgers.yaml"
    path.write_text(LEDGER.format(dags="on, off, yes, 2026-01-01"))
    account = load_ledger_config(path).accounts["census_adult"]
    assert account.allowed_dags == ["on", "off", "yes", "2026-01-01"]
    assert account.delta == Fraction(1, 10**6)
    assert declared_accountants(path) == {"census_adult": "zcdp"}


def test_ledger_config_refuses_an_ambiguous_scalar_with_its_path(tmp_path):
    path = tmp_path / "ledgers.yaml"
    path.write_text(LEDGER.format(dags="daily, 0123"))
    with pytest.raises(LedgerConfigError) as caught:
        load_ledger_config(path)
    assert str(caught.value).startswith(f"{path}: accounts.census_adult.allowed_dags.1: 0123 is ambiguous")
    assert declared_accountants(path) == {}


def test_ledger_config_syntax_error_keeps_its_message_shape(tmp_path):
    path = tmp_path / "ledgers.yaml"
    path.write_text("version: 1\naccounts: [\n")
    with pytest.raises(LedgerConfigError, match=f"^{path}: not valid YAML: "):
        load_ledger_config(path)


@pytest.mark.parametrize(("text", "found"), [
    ("", "no document (an empty file, or only comments)"),
    ("# accounts come later\n", "no document (an empty file, or only comments)"),
    ("- census_adult\n", "a list"),
    ("census_adult\n", "a string"),
])
def test_a_ledger_config_that_is_not_a_mapping_says_what_it_found_and_where_to_look(tmp_path, text, found):
    """An empty or misshapen configuration names the file, what it holds and the example and docs to follow."""
    path = tmp_path / "ledgers.yaml"
    path.write_text(text)
    with pytest.raises(LedgerConfigError) as caught:
        load_ledger_config(path)
    assert str(caught.value) == (
        f"{path}: invalid ledger configuration: expected a mapping with 'version: 1' and 'accounts:', found {found} "
        "(an example: config/ledgers.yaml; the fields: docs/ledger.md)"
    )


ANONYMITY = """\
version: 1
check: survey
quasi_identifiers: [{quasi}]
sensitive_attributes:
  - {{name: smoker, type: categorical}}
targets: {{k: 2}}
"""


def test_anonymity_spec_column_names_are_text():
    spec = parse_anonymity_spec(ANONYMITY.format(quasi="age, on, yes, {name: no, type: categorical}"))
    assert spec.qi_names == ["age", "on", "yes", "no"]


def test_anonymity_spec_refuses_an_ambiguous_scalar_in_its_error_shape():
    with pytest.raises(AnonymitySpecError) as caught:
        parse_anonymity_spec(ANONYMITY.format(quasi="age, 1:20"), source="checks/survey.yaml")
    assert str(caught.value).startswith("checks/survey.yaml: quasi_identifiers.1: 1:20 is ambiguous")
    with pytest.raises(AnonymitySpecError, match=r"^s\.yaml: <document>: not valid YAML: "):
        parse_anonymity_spec("check: [\n", source="s.yaml")


@pytest.mark.parametrize(("written", "expected"), [("no", False), ("off", False), ("yes", True), ("false", False)])
def test_a_boolean_field_still_takes_yes_and_no(written, expected):
    """Where a boolean is expected, the text 'no' means what the author meant (pydantic reads it as False)."""
    spec = parse_spec(spec_text("[a]", extra=f"postprocess: {{clamp_nonnegative: {written}}}\n"))
    assert spec.postprocess.clamp_nonnegative is expected


@pytest.mark.parametrize(("text", "found"), [
    ("", "no document (an empty file, or only comments)"),
    ("- a\n", "a list"),
    ("true\n", "a boolean"),
])
def test_a_release_or_anonymity_spec_that_is_not_a_mapping_says_what_it_found(text, found):
    """Every reader of the shared YAML loader names what a document that is not a mapping holds, in words."""
    with pytest.raises(SpecError) as release:
        parse_spec(text, source="r.yaml")
    assert str(release.value) == f"r.yaml: a release spec is a YAML mapping with 'version: 1', found {found}"
    with pytest.raises(AnonymitySpecError) as anonymity:
        parse_anonymity_spec(text, source="s.yaml")
    assert str(anonymity.value) == f"s.yaml: <document>: expected a mapping of spec fields, found {found}"
