"""The YAML 1.2 reader shared by release specs, ledgers.yaml and anonymity specs (dp_operators.spec.yaml12).

Expected values come from the YAML 1.2.2 specification, section 10.3.2 (the core schema: null, bool, int in
decimal, ``0o`` octal or ``0x`` hex, float; everything else is a string), and, for what YAML 1.1 tools read, from
the YAML 1.1 type repository (bool ``yes/no/on/off/y/n``, ``timestamp``, ``int`` with ``0`` octal, ``0b`` binary,
``_`` separators and base-60 ``1:20``), which PyYAML's ``safe_load`` follows.
"""

from __future__ import annotations

import pytest

from dp_operators.spec.yaml12 import YAMLDocumentError, load_yaml


def read(scalar: str) -> object:
    return load_yaml(f"value: {scalar}\n")["value"]


@pytest.mark.parametrize(
    ("scalar", "expected"),
    [
        # YAML 1.1 booleans are plain text in YAML 1.2
        *(pytest.param(word, word, id=f"{word} stays text") for word in
          ("yes", "no", "on", "off", "y", "n", "Yes", "NO", "On", "OFF")),
        pytest.param("true", True, id="true is a boolean"),
        pytest.param("False", False, id="False is a boolean"),
        # YAML 1.1 timestamps are text in YAML 1.2
        pytest.param("2026-01-01", "2026-01-01", id="date stays text"),
        pytest.param("2026-01-01 10:00:00", "2026-01-01 10:00:00", id="date-time stays text"),
        pytest.param("~", None, id="tilde is null"),
        pytest.param("null", None, id="null is null"),
        pytest.param("", None, id="empty is null"),
        pytest.param("1e3", 1000.0, id="1e3 is the float 1000"),
        pytest.param("1e-3", 0.001, id="1e-3 is the float 0.001"),
        pytest.param("0.1", 0.1, id="0.1 is a float"),
        pytest.param(".5", 0.5, id="leading dot float"),
        pytest.param("0x1F", 31, id="hex is an integer in both"),
        pytest.param("0", 0, id="zero"),
        pytest.param("-7", -7, id="negative integer"),
        pytest.param("123456789012345678901234567890", 123456789012345678901234567890, id="big integer exact"),
        pytest.param("-0o10", "-0o10", id="signed octal is text in both"),
        pytest.param("1/3", "1/3", id="a ratio is text"),
        pytest.param("'010'", "010", id="single-quoted 010 is text"),
        pytest.param('"yes"', "yes", id="double-quoted yes is text"),
        pytest.param("!!str 010", "010", id="explicit str tag"),
        pytest.param("'1_000'", "1_000", id="quoted 1_000 is text"),
    ],
)
def test_plain_scalars_read_with_the_yaml_1_2_core_schema(scalar, expected):
    value = read(scalar)
    assert value == expected and type(value) is type(expected)


def test_infinities_and_nan_are_floats():
    assert read(".inf") == float("inf") and read("-.inf") == float("-inf")
    nan = read(".nan")
    assert nan != nan


@pytest.mark.parametrize(
    ("scalar", "yaml_1_1", "yaml_1_2"),
    [
        pytest.param("0o10", "the text '0o10'", "the number 8", id="YAML 1.2 octal"),
        pytest.param("1_000", "the number 1000", "the text '1_000'", id="digit separators"),
        pytest.param("1_000.5", "the number 1000.5", "the text '1_000.5'", id="float with separators"),
        pytest.param("1:20", "the number 80", "the text '1:20'", id="sexagesimal 1:20"),
        pytest.param("190:20:30.15", "the number 685230.15", "the text '190:20:30.15'", id="sexagesimal float"),
        pytest.param("0b101", "the number 5", "the text '0b101'", id="binary"),
        pytest.param("+0x1F", "the number 31", "the text '+0x1F'", id="signed hex"),
    ],
)
def test_scalars_yaml_1_1_reads_as_another_number_are_refused(scalar, yaml_1_1, yaml_1_2):
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml(f"top:\n  inner: [a, {scalar}]\n")
    [problem] = caught.value.problems
    assert problem.location == ("top", "inner", 1)
    assert problem.line == 2
    assert f"YAML 1.1 reads {yaml_1_1} and YAML 1.2 reads {yaml_1_2}" in problem.reason
    assert f"quote it ('{scalar}')" in problem.reason


@pytest.mark.parametrize(
    ("scalar", "reason"),
    [
        pytest.param("010", "YAML 1.1 reads the octal integer 010, that is 8, and YAML 1.2 reads the decimal integer "
                     "10; either reading loses the leading zero", id="leading zero: octal 8 or 10"),
        pytest.param("0010", "YAML 1.1 reads the octal integer 0010, that is 8, and YAML 1.2 reads the decimal "
                     "integer 10", id="two leading zeros"),
        pytest.param("-010", "YAML 1.1 reads the octal integer -010, that is -8, and YAML 1.2 reads the decimal "
                     "integer -10", id="signed leading zero"),
        pytest.param("02139", "YAML 1.1 reads the text '02139' (8 and 9 are not octal digits), and YAML 1.2 reads "
                     "the decimal integer 2139, which loses the leading zero", id="zip code"),
        pytest.param("09", "YAML 1.1 reads the text '09' (8 and 9 are not octal digits), and YAML 1.2 reads the "
                     "decimal integer 9", id="09: not octal in 1.1"),
        pytest.param("01", "01 is ambiguous: YAML 1.1 reads it as octal and YAML 1.2 as decimal, both the "
                     "integer 1 here", id="01: octal and decimal agree"),
        pytest.param("00", "YAML 1.1 reads it as octal and YAML 1.2 as decimal, both the integer 0 here",
                     id="00 loses a zero"),
    ],
)
def test_integers_with_a_leading_zero_say_how_each_yaml_version_reads_them(scalar, reason):
    """A leading zero is refused with each version's reading named (octal or text in 1.1, decimal in 1.2)."""
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml(f"top:\n  inner: [a, {scalar}]\n")
    [problem] = caught.value.problems
    assert reason in problem.reason and f"quote it ('{scalar}')" in problem.reason


@pytest.mark.parametrize(
    ("scalar", "read_as"),
    [
        pytest.param("1e400", "inf", id="overflows to infinity"),
        pytest.param("1e-400", "0.0", id="underflows to zero"),
        pytest.param("0.30000000000000001", "0.3", id="more digits than a double holds"),
        pytest.param("2e-324", "0.0", id="below half the smallest subnormal"),
    ],
)
def test_floats_a_double_cannot_hold_exactly_are_refused(scalar, read_as):
    with pytest.raises(YAMLDocumentError) as caught:
        read(scalar)
    reason = caught.value.problems[0].reason
    assert f"would read as {read_as}" in reason and f"quote it ('{scalar}')" in reason


def test_floats_a_double_holds_exactly_are_kept():
    # 0.1 is not a binary fraction, but its shortest repr is '0.1': read through it, nothing typed is lost
    assert read("0.1") == 0.1 and read("1.0e-6") == 1e-6 and read("12.5e-7") == 1.25e-6


def test_every_problem_is_reported_with_its_line():
    text = "a: 010\nb:\n  - 1:20\n  - fine\nc: {d: 1_000}\n"
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml(text)
    found = [(p.location, p.line) for p in caught.value.problems]
    assert found == [(("a",), 1), (("b", 0), 3), (("c", "d"), 5)]
    assert caught.value.document == {"a": 10, "b": ["1:20", "fine"], "c": {"d": "1_000"}}


def test_describe_gives_source_field_path_and_reason():
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml("accounts:\n  x:\n    allowed_dags: [010]\n")
    message = caught.value.describe("config/ledgers.yaml")
    assert message.startswith("config/ledgers.yaml: accounts.x.allowed_dags.0: 010 is ambiguous")


def test_an_ambiguous_mapping_key_is_refused():
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml("keys:\n  010: a\n")
    assert caught.value.problems[0].location == ("keys", "010")


def test_duplicate_keys_are_refused_instead_of_keeping_the_last():
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml("budget:\n  epsilon: 0.1\n  epsilon: 5\n")
    [problem] = caught.value.problems
    assert problem.location == ("budget", "epsilon") and problem.line == 3
    assert "duplicate key 'epsilon' (first on line 2)" in problem.reason


def test_the_yaml_1_1_merge_key_is_refused():
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml("base: &b {epsilon: 1}\nother:\n  <<: *b\n")
    assert "merge key" in caught.value.problems[0].reason
    assert load_yaml("'<<': 1\n") == {"<<": 1}  # quoted, it is a name


def test_a_yaml_1_1_directive_is_refused_and_1_2_accepted():
    with pytest.raises(YAMLDocumentError, match=r"declares %YAML 1\.1"):
        load_yaml("%YAML 1.1\n---\nvalue: yes\n")
    assert load_yaml("%YAML 1.2\n---\nvalue: yes\n") == {"value": "yes"}


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a: [\n", id="unclosed flow sequence"),
        pytest.param("- a\n---\n- b\n", id="two documents"),
        pytest.param("value: !!timestamp 2026-01-01\n", id="explicit YAML 1.1 tag"),
        pytest.param("value: !!python/object:os.system x\n", id="python tag"),
    ],
)
def test_invalid_yaml_is_one_problem_without_a_location(text):
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml(text)
    [problem] = caught.value.problems
    assert problem.location == () and problem.reason.startswith("not valid YAML: ")
    assert caught.value.describe("f.yaml").startswith("f.yaml: not valid YAML: ")


def test_an_empty_document_is_none_and_aliases_are_read_once():
    assert load_yaml("") is None
    assert load_yaml("a: &x [yes, 1]\nb: *x\n") == {"a": ["yes", 1], "b": ["yes", 1]}


def test_a_parse_error_names_its_line_and_column_on_one_line_without_pyyamls_stream_name():
    """The reason is one line with 1-based line and column; the file is named by the caller, never
    PyYAML's "<unicode string>"."""
    with pytest.raises(YAMLDocumentError) as caught:
        load_yaml("accounts:\n  census: [1\n")
    described = caught.value.describe("ledgers.yaml")
    assert described == ("ledgers.yaml: not valid YAML: expected ',' or ']', but got '<stream end>' at line 3, "
                         "column 1 (while parsing a flow sequence at line 2, column 11)")
