"""Names in a release spec (dp_operators/spec/names.py).

* A ``group_by`` column named like a field of a published or upstream row (``value``, ``half_width``,
  ``saturated``, ``interval``, ``count``, ``sum``, ``sum_squares``, ``units``) lost its key: publish.py builds a
  row as ``dict(zip(group_by, key))`` and then sets ``value``, ``half_width``... on it, so ``{"value": "low"}``
  became ``{"value": <noised count>}``; an upstream column ``count`` is read as the total. Refused at validation.
* Release and aggregate names become parts of file names and of the SQL sink's rows: at most 200 characters.
"""

from __future__ import annotations

import pytest

from dp_operators.spec import SpecError, load_spec, parse_spec

from support import REPO

#: written out here, not imported: a name dropped from the implementation's list must fail this test
RESERVED = ("value", "half_width", "saturated", "interval", "count", "sum", "sum_squares", "units")


def spec_text(*, release: str = "names", name: str = "agg", group_by: tuple[str, ...] = ("band",),
              kind: str = "count", selection: bool = False) -> str:
    columns = ", ".join(group_by)
    if selection:
        domain = ("    partition_selection:\n      mechanism: discrete_laplace\n"
                  "      budget: {epsilon: 1, delta: 1e-6}\n")
    else:
        domain = "    keys: {" + ", ".join(f"{c}: [a, b]" for c in group_by) + "}\n"
    bounds = "" if kind == "count" else "    bounds: [0, 10]\n"
    return (
        f"version: 1\nrelease: {release}\nbudget_account: census_adult\nprivacy_unit: person\naggregates:\n"
        f"  - name: {name}\n    kind: {kind}\n    group_by: [{columns}]\n{domain}{bounds}"
        "    mechanism: discrete_laplace\n    budget: {epsilon: 1}\n"
    )


def refusal(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="r.yaml")
    return str(caught.value)


@pytest.mark.parametrize("column", RESERVED)
@pytest.mark.parametrize("selection", [False, True], ids=["public keys", "partition selection"])
def test_a_group_by_column_named_like_a_row_field_is_refused_with_its_path(column, selection):
    message = refusal(spec_text(group_by=("region", column), selection=selection))
    assert f"  aggregates[0](agg).group_by[1]: a group_by column cannot be named {column!r}" in message
    assert "rename the column upstream" in message
    assert message.count("\n") == 1  # one problem: the column, not a knock-on error about keys


@pytest.mark.parametrize("kind", ["sum", "mean", "variance"])
def test_the_refusal_does_not_depend_on_the_kind(kind):
    assert "group_by[0]: a group_by column cannot be named 'sum'" in refusal(spec_text(group_by=("sum",), kind=kind))


@pytest.mark.parametrize("column", ["Value", "value_key", "counts", "band", "units_sold", "VALUE"])
def test_columns_that_only_resemble_a_row_field_are_accepted(column):
    assert parse_spec(spec_text(group_by=(column,))).aggregates[0].group_by == [column]


def test_every_reserved_column_in_one_spec_is_reported():
    message = refusal(spec_text(group_by=RESERVED))
    for index, column in enumerate(RESERVED):
        assert f"group_by[{index}]: a group_by column cannot be named {column!r}" in message


@pytest.mark.parametrize("length", [1, 199, 200])
def test_names_up_to_200_characters_are_accepted(length):
    spec = parse_spec(spec_text(release="r" * length, name="a" * length))
    assert (len(spec.release), len(spec.aggregates[0].name)) == (length, length)


@pytest.mark.parametrize("length", [201, 5000])
def test_a_longer_release_name_is_refused(length):
    message = refusal(spec_text(release="r" * length))
    assert "  release: release names are at most 200 characters" in message
    assert f"got {length}: shorten it" in message


@pytest.mark.parametrize("length", [201, 5000])
def test_a_longer_aggregate_name_is_refused(length):
    message = refusal(spec_text(name="a" * length))
    assert ").name: aggregate names are at most 200 characters" in message
    assert f"got {length}: shorten it" in message


@pytest.mark.parametrize("name", ['"agg\\n"', '"1agg"', '"a.b"', '""'])
def test_a_name_with_other_characters_is_refused(name):
    assert "aggregate names use letters, digits, '_' and '-'" in refusal(spec_text(name=name))
    assert "release: release names use letters, digits, '_' and '-'" in refusal(spec_text(release=name))


def test_an_aggregate_named_like_the_xcom_envelope_is_refused():
    """An upstream mapping holding an aggregate ``__dp_operators_aggregates__`` would be read as the envelope of
    ``aggregates_for_xcom``: the name is refused when the spec is loaded, as every ``__dp_`` name is."""
    from dp_operators.operators.xcom_aggregates import ENVELOPE

    message = refusal(spec_text(name=ENVELOPE))
    assert "aggregate names cannot start with '__dp_'" in message and "rename it" in message
    assert "release names cannot start with '__dp_'" in refusal(spec_text(release="__dp_release"))
    assert parse_spec(spec_text(name="_dp_counts")).aggregates  # one underscore is an ordinary name
    assert "a group_by column cannot start with '__dp_'" in refusal(spec_text(group_by=("__dp_number__",)))


def test_the_shipped_specs_still_validate():
    specs = sorted((REPO / "config" / "releases").glob("*.yaml"))
    assert specs
    for path in specs:
        assert load_spec(path).aggregates

