"""Optimal full-domain generalisation (dp_operators.anonymity.lattice) against an exhaustive search written here.

The brute force below shares no code with the search: it generalises with the hierarchies' own level mappings and
pandas, groups with ``groupby``, measures k, l and t (t against the whole input table's distribution) and the four
metrics from their definitions, over every node of the lattice.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_operators.anonymity.anonymise import anonymise
from dp_operators.anonymity.criteria import Criteria
from dp_operators.anonymity.errors import AnonymityInputError
from dp_operators.anonymity.lattice import full_domain_search
from dp_operators.anonymity.loss import METRICS, information_loss
from dp_operators.anonymity.measures import k_anonymity
from dp_operators.anonymity.spec import AnonymitySpec

from .anonymity_tables import SHARED_DATA, anonymity_spec
from .test_loss import encode

ARX_ADULT = SHARED_DATA / "arx_adult"
ARX_QIS = ["age", "sex", "race", "marital-status", "education", "native-country", "workclass", "occupation"]


# -- spec, hierarchies and the exhaustive search ----------------------------------------------------------------------


make_spec = anonymity_spec  # quasi-identifiers, targets, (name, type) sensitive pairs


def arx_levels(name: str, numeric: bool) -> list[dict]:
    """ARX hierarchy file -> ``levels[i]``: value -> label at level ``i + 1``."""
    rows = pd.read_csv(ARX_ADULT / f"adult_hierarchy_{name}.csv", sep=";", header=None, dtype=str)
    keys = [int(v) for v in rows[0]] if numeric else list(rows[0])
    return [dict(zip(keys, rows[level], strict=True)) for level in range(1, rows.shape[1])]


def generalised(table, qis, hierarchies, node):
    return pd.DataFrame(
        {q: table[q] if level == 0 else table[q].map(hierarchies[q][level - 1]) for q, level in zip(qis, node)},
        index=table.index,
    )


def emd(counts: np.ndarray, reference: np.ndarray, distance: str) -> float:
    q, p = counts / counts.sum(), reference / reference.sum()
    if distance == "equal":
        return 0.5 * float(np.abs(q - p).sum())
    m = p.size
    return float(np.abs(np.cumsum(q - p)[:-1]).sum() / (m - 1)) if m > 1 else 0.0


def class_fails(rows: pd.DataFrame, targets: dict, sensitive, reference) -> bool:
    size = len(rows)
    if "k" in targets and size < targets["k"]:
        return True
    for name, kind in sensitive:
        counts = rows[name].value_counts()
        l_target = targets.get("l")
        if l_target is not None:
            if l_target["kind"] == "distinct" and counts.size < l_target["l"]:
                return True
            p = counts.to_numpy() / size
            if l_target["kind"] == "entropy" and -(p * np.log(p)).sum() < math.log(l_target["l"]) - 1e-9:
                return True
            if l_target["kind"] == "recursive":
                r = np.sort(counts.to_numpy())[::-1]
                tail = r[int(l_target["l"]) - 1 :].sum()
                if not r[0] < l_target["c"] * tail:
                    return True
        if "t" in targets:
            domain = reference[name]
            class_counts = counts.reindex(domain.index, fill_value=0).to_numpy(dtype=float)
            if emd(class_counts, domain.to_numpy(dtype=float), "ordered" if kind == "ordered" else "equal") > (
                targets["t"] + 1e-9
            ):
                return True
    return False


def node_metrics(table, qis, hierarchies, numeric, node, kept):
    """The four metrics from their definitions, suppressed rows at the top of every column."""
    n, q = len(table), len(qis)
    gen = generalised(table, qis, hierarchies, node)
    loss = ncp = entropy = 0.0
    for name in qis:
        original = table[name]
        d = original.nunique()
        covered = original.groupby(gen[name]).nunique()  # distinct originals per generalised value
        c = gen[name].map(covered)
        loss_cells = (c - 1) / (d - 1) if d > 1 else c * 0.0
        if numeric.get(name):
            low, high = original.groupby(gen[name]).min(), original.groupby(gen[name]).max()
            width = original.max() - original.min()
            ncp_cells = (gen[name].map(high) - gen[name].map(low)) / width if width else c * 0.0
        else:
            ncp_cells = np.where(c > 1, c / d, 0.0)
        count_g = gen[name].map(gen[name].value_counts())
        count_v = original.map(original.value_counts())
        entropy_cells = np.log2(count_g / count_v)
        loss += float(np.where(kept, loss_cells, 1.0).sum())
        ncp += float(np.where(kept, ncp_cells, 1.0).sum())
        entropy += float(np.where(kept, entropy_cells, np.log2(n / count_v)).sum())
    sizes = gen[kept].groupby(qis).size()
    discernibility = int((sizes**2).sum()) + int((~kept).sum()) * n
    return {"loss": loss / (n * q), "ncp": ncp / (n * q), "entropy": entropy, "discernibility": discernibility}


def brute_force(table, qis, hierarchies, numeric, targets, sensitive, max_suppression):
    """Every satisfying node: ``[(levels, suppressed rows, metrics, kept mask)]``."""
    n = len(table)
    limit = math.floor(max_suppression * n)
    reference = {name: table[name].value_counts().sort_index() for name, _ in sensitive}
    satisfying = []
    for node in itertools.product(*[range(len(hierarchies[q]) + 1) for q in qis]):
        gen = generalised(table, qis, hierarchies, node)
        ids = gen.groupby(qis).ngroup().to_numpy()
        failing = np.zeros(n, dtype=bool)
        for _, rows in table.groupby(ids):
            if class_fails(rows, targets, sensitive, reference):
                failing[table.index.get_indexer(rows.index)] = True
        kept = ~failing
        suppressed = int(failing.sum())
        if suppressed > limit or suppressed == n:
            continue
        sizes = np.bincount(ids[kept])
        sizes = sizes[sizes > 0]
        risk = targets.get("prosecutor_risk", {})
        if "average" in risk and sizes.size / kept.sum() > risk["average"] + 1e-12:
            continue
        satisfying.append((node, suppressed, node_metrics(table, qis, hierarchies, numeric, node, kept), kept))
    return satisfying


def optimum(satisfying, metric):
    """The documented choice: least value (ties within 1e-9 relative), then fewer suppressed rows, then the lowest
    sum of levels, then the lexicographically smallest levels."""
    if not satisfying:
        return None
    best = min(s[2][metric] for s in satisfying)
    ties = [s for s in satisfying if s[2][metric] <= best + 1e-9 * max(1.0, abs(best))]
    return min(ties, key=lambda s: (s[1], sum(s[0]), s[0]))


def assert_matches_brute_force(table, qis, hierarchies, numeric, targets, sensitive, max_suppression):
    satisfying = brute_force(table, qis, hierarchies, numeric, targets, sensitive, max_suppression)
    encoded = [encode(q, table[q].tolist(), hierarchies[q], numeric=numeric.get(q, False)) for q in qis]
    criteria = Criteria(make_spec(qis, targets, sensitive), table)
    for metric in METRICS:
        result = full_domain_search(table, encoded, criteria, max_suppression, metric)
        expected = optimum(satisfying, metric)
        if expected is None:
            assert result.node is None and result.reason, metric
            assert result.kept.sum() == 0 and len(result.table) == 0
            continue
        assert result.node == expected[0], metric
        assert result.value == pytest.approx(expected[2][metric], rel=1e-9, abs=1e-12), metric
        assert result.suppressed_rows == expected[1]
        assert np.array_equal(result.kept, expected[3])
        for other in METRICS:  # all four reported, at the chosen node
            assert result.information_loss[other] == pytest.approx(expected[2][other], rel=1e-9, abs=1e-12)
        assert result.nodes_checked <= result.lattice_size
    return satisfying


# -- small tables from ARX's adult example --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def arx_adult():
    path = ARX_ADULT / "adult.csv"
    if not path.exists():
        pytest.skip(f"{path} is missing: the shared test data must sit beside the project")
    return pd.read_csv(path, sep=";")


@pytest.fixture(scope="module")
def arx_levels_by_qi(arx_adult):
    return {q: arx_levels(q, numeric=q == "age") for q in ARX_QIS}


SMALL_QIS = ["age", "education", "marital-status", "sex"]  # 5 * 4 * 3 * 2 = 120 nodes


@pytest.mark.parametrize(
    ("rows", "seed", "targets", "sensitive", "max_suppression"),
    [
        pytest.param(60, 1, {"k": 2}, (), 0.0, id="k=2, no suppression, 60 rows"),
        pytest.param(120, 2, {"k": 5}, (), 0.05, id="k=5, 5% suppression"),
        pytest.param(200, 3, {"k": 10}, (), 0.10, id="k=10, 10% suppression"),
        pytest.param(150, 4, {"k": 3}, (), 0.10, id="k=3, 10% suppression"),
        pytest.param(100, 5, {"k": 2, "l": {"kind": "distinct", "l": 2}}, [("salary-class", "categorical")], 0.10,
                     id="k=2 and distinct l=2, 10% suppression"),
        pytest.param(120, 6, {"l": {"kind": "entropy", "l": 1.5}}, [("salary-class", "categorical")], 0.05,
                     id="entropy l=1.5 (non-monotone with suppression)"),
        pytest.param(100, 7, {"k": 2, "l": {"kind": "recursive", "l": 2, "c": 3}}, [("salary-class", "categorical")],
                     0.10, id="recursive (3, 2)-diversity"),
        pytest.param(150, 8, {"k": 3, "t": 0.2}, [("salary-class", "categorical")], 0.0,
                     id="k=3 and t=0.2, no suppression"),
        pytest.param(150, 9, {"k": 3, "t": 0.2}, [("salary-class", "categorical")], 0.10,
                     id="k=3 and t=0.2, 10% suppression (non-monotone)"),
        pytest.param(49, 9, {"k": 2, "t": 0.15}, [("salary-class", "categorical")], 0.10,
                     id="k=2 and t=0.15, 10% suppression (tagging predecessors of a failing node would miss it)"),
        pytest.param(30, 0, {"k": 4, "t": 0.2}, [("salary-class", "categorical")], 0.05,
                     id="k=4 and t=0.2, 5% suppression (small classes fill the allowance exactly)"),
        pytest.param(80, 10, {"k": 2, "prosecutor_risk": {"average": 0.15}}, (), 0.05,
                     id="average prosecutor risk (table-level), 5% suppression"),
    ],
)
def test_search_finds_the_brute_force_optimum_on_adult_samples(
    arx_adult, arx_levels_by_qi, rows, seed, targets, sensitive, max_suppression
):
    sample = arx_adult.sample(rows, random_state=seed)
    hierarchies = {q: arx_levels_by_qi[q] for q in SMALL_QIS}
    satisfying = assert_matches_brute_force(
        sample, SMALL_QIS, hierarchies, {"age": True}, targets, sensitive, max_suppression
    )
    assert satisfying, "the case should have a solution"


def test_no_satisfying_node_is_reported_with_a_reason(arx_adult, arx_levels_by_qi):
    sample = arx_adult.sample(40, random_state=11)
    hierarchies = {q: arx_levels_by_qi[q] for q in SMALL_QIS}
    targets = {"l": {"kind": "distinct", "l": 3}}  # salary-class has 2 values: no class can be 3-diverse
    satisfying = assert_matches_brute_force(
        sample, SMALL_QIS, hierarchies, {"age": True}, targets, [("salary-class", "categorical")], 0.1
    )
    assert not satisfying
    encoded = [encode(q, sample[q].tolist(), hierarchies[q], numeric=q == "age") for q in SMALL_QIS]
    criteria = Criteria(make_spec(SMALL_QIS, targets, [("salary-class", "categorical")]), sample)
    result = full_domain_search(sample, encoded, criteria, 0.1)
    assert result.reason.startswith("no node of the 120-node generalisation lattice meets the targets")
    assert "40 rows are in 1 equivalence class(es) missing class-level targets (l:salary-class)" in result.reason
    summary = result.summary()
    assert summary["satisfied"] is False and summary["node"] is None
    json.dumps(summary, allow_nan=False)


# -- random tables: optimality and the properties of every output ----------------------------------------------------


@st.composite
def instances(draw):
    """A small random table with three QIs (two categorical with random hierarchies, one numeric with nested
    intervals), two sensitive attributes, random targets and a suppression allowance."""
    n = draw(st.integers(8, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    hierarchies, numeric = {}, {"num": True}
    table = pd.DataFrame(index=pd.RangeIndex(100, 100 + 3 * n, 3))  # a non-default index, kept in the output
    for name in ("cat1", "cat2"):
        domain = draw(st.integers(1, 6))
        table[name] = [f"v{v}" for v in rng.integers(0, domain, n)]
        levels, groups = [], {f"v{v}": v for v in range(domain)}
        for _ in range(draw(st.integers(1, 3))):
            divisor = draw(st.integers(2, 3))
            groups = {v: g // divisor for v, g in groups.items()}
            levels.append({v: f"{name}_l{len(levels) + 1}_{g}" for v, g in groups.items()})
        hierarchies[name] = levels
    table["num"] = rng.integers(0, 30, n)
    widths = draw(st.sampled_from([[5], [5, 10], [3, 9, 27]]))
    hierarchies["num"] = [
        {v: f"[{v // w * w}, {v // w * w + w})" for v in range(30)} for w in widths
    ] + [dict.fromkeys(range(30), "*")]
    table["disease"] = [f"d{v}" for v in rng.integers(0, draw(st.integers(1, 4)), n)]
    table["salary"] = rng.integers(1, 6, n)
    targets = {"k": draw(st.integers(1, 6))}
    sensitive = []
    model = draw(st.sampled_from(["k", "l", "t", "t ordered"]))
    if model == "l":
        targets["l"] = {"kind": "distinct", "l": 2}
        sensitive = [("disease", "categorical")]
    elif model == "t":
        targets["t"] = draw(st.sampled_from([0.2, 0.35, 0.5]))
        sensitive = [("disease", "categorical")]
    elif model == "t ordered":
        targets["t"] = draw(st.sampled_from([0.15, 0.3]))
        sensitive = [("salary", "ordered")]
    max_suppression = draw(st.sampled_from([0.0, 0.05, 0.1, 0.25]))
    return table, ["cat1", "num", "cat2"], hierarchies, numeric, targets, sensitive, max_suppression


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_search_matches_brute_force_on_random_tables(instance):
    assert_matches_brute_force(*instance)


def covers(label: str, value, level: int, levels: list[dict]) -> bool:
    """The label is the hierarchy's ancestor of the value; an interval label also contains the number."""
    if level == 0:
        return label == str(value)
    if levels[level - 1][value] != label:
        return False
    interval = re.fullmatch(r"\[(\d+), (\d+)\)", label)
    return interval is None or int(interval[1]) <= value < int(interval[2])


@settings(max_examples=40, deadline=None)
@given(instances())
def test_every_output_is_anonymous_complete_and_covers_the_original(instance):
    table, qis, hierarchies, numeric, targets, sensitive, max_suppression = instance
    encoded = [encode(q, table[q].tolist(), hierarchies[q], numeric=numeric.get(q, False)) for q in qis]
    criteria = Criteria(make_spec(qis, targets, sensitive), table)
    result = full_domain_search(table, encoded, criteria, max_suppression)
    out = result.table
    json.dumps(result.summary(), allow_nan=False)
    # No row lost or duplicated beyond the reported suppression; the index is the input's.
    assert out.index.is_unique
    assert len(out) + result.suppressed_rows == len(table)
    assert out.index.equals(table.index[result.kept])
    assert list(out.columns) == list(table.columns)
    if result.node is None:
        assert len(out) == 0
        return
    assert result.suppressed_rows <= math.floor(max_suppression * len(table))
    # k, l and t measured on the output table, independently of the search.
    assert k_anonymity(out, qis) >= targets["k"]
    reference = {name: table[name].value_counts().sort_index() for name, _ in sensitive}
    for _, rows in out.groupby(qis):
        assert not class_fails(rows, targets, sensitive, reference)
    # Every generalised cell covers the original value; other columns are unchanged.
    original = table.loc[out.index]
    for q, level in zip(qis, result.node):
        assert all(covers(label, value, level, hierarchies[q]) for label, value in zip(out[q], original[q]))
    for column in ("disease", "salary"):
        assert out[column].equals(original[column])
    assert result.information_loss == information_loss(encoded, result.node, result.kept)


@settings(max_examples=30, deadline=None)
@given(instances(), st.sampled_from(METRICS))
def test_information_loss_never_rises_when_the_allowance_grows(instance, metric):
    table, qis, hierarchies, numeric, targets, sensitive, _ = instance
    encoded = [encode(q, table[q].tolist(), hierarchies[q], numeric=numeric.get(q, False)) for q in qis]
    criteria = Criteria(make_spec(qis, targets, sensitive), table)
    previous = None
    for allowance in (0.0, 0.05, 0.1, 0.25, 0.5, 1.0):
        result = full_domain_search(table, encoded, criteria, allowance, metric)
        if previous is not None and previous.node is not None:
            assert result.node is not None
            assert result.value <= previous.value * (1 + 1e-9) + 1e-12
        previous = result


# -- argument checks --------------------------------------------------------------------------------------------------


@pytest.fixture()
def tiny():
    table = pd.DataFrame({"x": ["a", "a", "b", "c"], "s": [1, 2, 1, 2]})
    levels = [{"a": "ab", "b": "ab", "c": "c"}, dict.fromkeys("abc", "*")]
    return table, [encode("x", table["x"].tolist(), levels)], Criteria(make_spec(["x"], {"k": 2}), table)


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        pytest.param("max_suppression", -0.1, r"finite fraction in \[0, 1\], got -0.1", id="negative allowance"),
        pytest.param("max_suppression", 1.5, r"finite fraction in \[0, 1\], got 1.5", id="allowance above 1"),
        pytest.param("max_suppression", float("nan"), r"finite fraction in \[0, 1\], got nan", id="NaN allowance"),
        pytest.param("max_suppression", True, "got bool", id="boolean allowance"),
        pytest.param("max_suppression", "0.1", "got str", id="text allowance"),
        pytest.param("metric", "precision", "unknown information-loss metric 'precision'", id="unknown metric"),
    ],
)
def test_bad_arguments_are_refused(tiny, argument, value, message):
    table, encoded, criteria = tiny
    with pytest.raises(AnonymityInputError, match=message):
        full_domain_search(table, encoded, criteria, **{argument: value})


def test_encodings_of_another_table_are_refused(tiny):
    table, encoded, criteria = tiny
    with pytest.raises(AnonymityInputError, match="'x' has 4 rows but the table has 3; encode the same table"):
        full_domain_search(table.iloc[:3], encoded, Criteria(make_spec(["x"], {"k": 2}), table.iloc[:3]))
    with pytest.raises(AnonymityInputError, match="criteria were built on a table of 4 rows but this table has 3"):
        full_domain_search(table.iloc[:3], [encode("x", ["a", "a", "b"], [{"a": "*", "b": "*"}])], criteria)
    with pytest.raises(AnonymityInputError, match="encoded more than once"):
        full_domain_search(table, encoded * 2, criteria)
    with pytest.raises(AnonymityInputError, match="no quasi-identifier given"):
        full_domain_search(table, [], criteria)
    with pytest.raises(AnonymityInputError, match="target k = 5 is larger than the table"):
        full_domain_search(table, encoded, Criteria(make_spec(["x"], {"k": 5}), table))


def test_inconsistent_encodings_are_refused(tiny):
    table, (x,), criteria = tiny
    two_parents = dataclasses.replace(x, codes=(x.codes[0], np.array([0, 1, 0, 1], dtype=np.int32), x.codes[2]))
    with pytest.raises(AnonymityInputError, match="'x' is inconsistent: a value at level 0 generalises to two values"):
        full_domain_search(table, [two_parents], criteria)
    out_of_range = dataclasses.replace(x, codes=(x.codes[0], x.codes[1], np.array([0, 0, 0, 1], dtype=np.int32)))
    with pytest.raises(AnonymityInputError, match=r"level 2 has codes outside \[0, 1\)"):
        full_domain_search(table, [out_of_range], criteria)


def test_known_answer_and_summary(tiny):
    table, encoded, criteria = tiny
    # k=2: level 0 has classes a(2), b(1), c(1); level 1 ab(3), c(1); only '*' (level 2) has no small class.
    result = full_domain_search(table, encoded, criteria)
    assert result.node == (2,) and result.suppressed_rows == 0 and result.classes == 1
    assert list(result.table["x"]) == ["*"] * 4 and list(result.table["s"]) == [1, 2, 1, 2]
    # With one row allowed (25%): level 0 suppresses 2 rows, level 1 suppresses c only: loss (3 * 0.5 + 1) / 4.
    result = full_domain_search(table, encoded, criteria, max_suppression=0.25)
    assert result.node == (1,) and result.suppressed_rows == 1
    assert result.value == pytest.approx(0.625)
    assert list(result.table.index) == [0, 1, 2]
    summary = result.summary()
    assert summary["node"] == {"x": 1} and summary["released_rows"] == 3 and summary["lattice_size"] == 3
    json.dumps(summary, allow_nan=False)


def test_ties_go_to_the_lowest_sum_of_levels():
    # x and y are symmetric; y's level 1 merges nothing. Generalising x or y to '*' costs the same (loss 0.5), so
    # (1, 0) and (0, 2) tie: the lower sum of levels wins although (0, 2) is lexicographically smaller.
    table = pd.DataFrame({"x": ["a", "a", "a", "b", "b", "b"], "y": ["a", "a", "b", "b", "a", "b"]})
    x = encode("x", table["x"].tolist(), [{"a": "*", "b": "*"}])
    y = encode("y", table["y"].tolist(), [{"a": "A", "b": "B"}, {"a": "*", "b": "*"}])
    criteria = Criteria(make_spec(["x", "y"], {"k": 3}), table)
    expected = {"loss": 0.5, "ncp": 0.5, "discernibility": 3**2 + 3**2, "entropy": 6 * math.log2(6 / 3)}
    for metric, value in expected.items():
        result = full_domain_search(table, [x, y], criteria, 0.0, metric)
        assert result.node == (1, 0), metric
        assert result.value == pytest.approx(value), metric


def test_ties_go_to_fewer_suppressed_rows():
    # Discernibility: node (0, 1) has classes {2, 2} and one suppressed row (4 + 4 + 5 = 13); node (1, 0) has
    # classes {3, 2} and nothing suppressed (9 + 4 = 13). The bottom needs 3 suppressed rows, more than the 1 allowed.
    table = pd.DataFrame({"x": ["a", "a", "b", "b", "c"], "y": ["p", "p", "p", "q", "q"]})
    x = encode("x", table["x"].tolist(), [dict.fromkeys("abc", "*")])
    y = encode("y", table["y"].tolist(), [dict.fromkeys("pq", "*")])
    result = full_domain_search(table, [x, y], Criteria(make_spec(["x", "y"], {"k": 2}), table), 0.2, "discernibility")
    assert result.value == 13
    assert result.node == (1, 0) and result.suppressed_rows == 0


# -- ARX's adult example (30,162 rows, 8 QIs with ARX's hierarchies) --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("max_suppression", [0.0, 0.01])
def test_arx_adult_k5(arx_adult, max_suppression):
    from dp_operators.anonymity.generalisation import encode_quasi_identifiers

    declared = [{"name": q, "hierarchy": {"file": str(ARX_ADULT / f"adult_hierarchy_{q}.csv")}} for q in ARX_QIS]
    spec = make_spec(declared, {"k": 5})
    encoded = encode_quasi_identifiers(arx_adult, spec)
    result = full_domain_search(arx_adult, encoded, Criteria(spec, arx_adult), max_suppression, "loss")
    assert result.lattice_size == 5 * 2 * 2 * 3 * 4 * 3 * 3 * 3
    assert result.nodes_checked < result.lattice_size
    assert k_anonymity(result.table, ARX_QIS) >= 5
    assert result.suppressed_rows <= math.floor(max_suppression * len(arx_adult))
    assert len(result.table) + result.suppressed_rows == len(arx_adult)
    # The optimum found by evaluating all 6,480 nodes exhaustively (once, outside the test suite).
    expected = {0.0: ((4, 0, 0, 2, 3, 2, 2, 1), 0, 0.66084171117), 0.01: ((4, 0, 0, 2, 2, 1, 1, 1), 256, 0.41260203183)}
    node, suppressed, loss = expected[max_suppression]
    assert result.node == node and result.suppressed_rows == suppressed
    assert result.value == pytest.approx(loss, abs=1e-10)


# -- large lattices: tagging cost and the size limit ------------------------------------------------------------------


def binary_table(columns: int, rows: int, seed: int) -> tuple[pd.DataFrame, list]:
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({f"q{j}": rng.integers(0, 2, rows).astype(str) for j in range(columns)})
    return table, [encode(name, table[name].tolist(), [{"0": "*", "1": "*"}]) for name in table.columns]


def test_binary_lattice_optimum_matches_a_bitmask_brute_force():
    # 12 binary QIs without hierarchies (4,096 nodes), k = 4, nothing suppressed: every node's loss is (generalised
    # columns) / 12, so the optimum is the k-anonymous node with the fewest generalised columns, ties to the
    # lexicographically smallest levels. Brute force: every subset of kept columns, classes by bitmask keys.
    table, encoded = binary_table(12, 300, seed=3)
    bits = np.stack([(table[name] == "1").to_numpy() for name in table.columns], axis=1).astype(np.int64)
    best = None
    for node in itertools.product((0, 1), repeat=12):
        kept = [j for j in range(12) if node[j] == 0]
        keys = (bits[:, kept] << np.arange(len(kept))).sum(axis=1)
        sizes = np.bincount(keys)
        if sizes[sizes > 0].min() >= 4 and (best is None or (sum(node), node) < (sum(best), best)):
            best = node
    result = full_domain_search(table, encoded, Criteria(make_spec(table.columns, {"k": 4}), table))
    assert result.node == best
    assert result.value == pytest.approx(sum(best) / 12)
    assert result.nodes_checked < result.lattice_size / 2  # tagging, not an exhaustive evaluation


def test_lattice_above_the_limit_is_refused_before_any_search_work(monkeypatch):
    import dp_operators.anonymity.lattice as lattice

    table, encoded = binary_table(21, 3, seed=0)  # 2**21 nodes
    criteria = Criteria(make_spec(table.columns, {"k": 1}), table)

    def no_work(*args, **kwargs):
        raise AssertionError("the search started before the lattice size was checked")

    monkeypatch.setattr(lattice, "_NodeEvaluator", no_work)
    assert lattice.MAX_LATTICE_NODES == 1 << 20
    with pytest.raises(AnonymityInputError) as refused:
        full_domain_search(table, encoded, criteria)
    message = str(refused.value)
    assert "2,097,152 nodes (21 quasi-identifiers" in message and "more than the 1,048,576" in message
    assert "fewer quasi-identifiers" in message and "shorter hierarchies" in message and "mondrian" in message
    assert lattice.check_lattice_size(encoded[:20]) == 1 << 20  # exactly at the limit is searched


def test_highest_risk_needing_classes_larger_than_the_table_is_refused(tiny):
    table, encoded, _ = tiny  # 4 rows
    criteria = Criteria(make_spec(["x"], {"prosecutor_risk": {"highest": 0.2}}), table)  # classes of >= 5 rows
    with pytest.raises(AnonymityInputError, match="prosecutor_risk.highest = 0.2 needs equivalence classes of at "
                                                  r"least 5 rows, more than the table has \(4 rows\)"):
        full_domain_search(table, encoded, criteria)
    at_the_size = Criteria(make_spec(["x"], {"prosecutor_risk": {"highest": 0.25}}), table)
    assert full_domain_search(table, encoded, at_the_size).node == (2,)  # one class of all 4 rows


@pytest.mark.slow
def test_lattice_tagging_work_grows_with_the_lattice_not_its_square(monkeypatch):
    """16 quasi-identifiers without hierarchies (a 65,536-node lattice, 1.6 % of MAX_LATTICE_NODES), 1,000 rows,
    k = 5: the search finishes (or refuses the lattice up front), and predictive tagging examines at most
    (lattice size x quasi-identifiers) nodes in all, counted through ``_spread``'s ``reached`` callback. Scanning the
    whole lattice per evaluated node (quadratic: 47 s here, 22 QIs did not finish in 5 minutes) examines over a
    thousand times more."""
    import dp_operators.anonymity.lattice as lattice

    examined = []
    real_spread = lattice._LatticeSearch._spread

    def counting_spread(self, index, up, reached, mark, include_start=True):
        def counted(nodes):
            examined.append(len(nodes))
            return reached(nodes)

        return real_spread(self, index, up, counted, mark, include_start)

    monkeypatch.setattr(lattice._LatticeSearch, "_spread", counting_spread)
    rng = np.random.default_rng(0)
    table = pd.DataFrame({f"q{i}": rng.integers(0, 2, 1000).astype(str) for i in range(16)})
    spec = make_spec(list(table.columns), {"k": 5})
    try:
        result = anonymise(table, spec)
    except AnonymityInputError:
        return
    assert result.passed
    assert 0 < sum(examined) <= 2**16 * 16, f"{sum(examined):,} nodes examined by tagging"
