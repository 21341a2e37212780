"""Known answers for k, l and t (Sweeney 2002; Machanavajjhala et al. 2006; Li, Li, Venkatasubramanian 2007)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from .anonymity_tables import DISEASE_HIERARCHY, HOSPITAL_QIS, STUDENT_QIS
from scipy.optimize import linprog

from dp_operators.anonymity import (
    AnonymityInputError,
    ValueHierarchy,
    distinct_l_diversity,
    entropy_l_diversity,
    equivalence_classes,
    k_anonymity,
    recursive_cl_diversity,
    sensitive_distribution,
    t_closeness,
    violating_classes,
)

LI_QIS = ["zip", "age"]


# --- Li et al. 2007, Table 4 -------------------------------------------------------------------------------------


def test_li_table4_is_3_anonymous_and_3_diverse(li_patients):
    assert k_anonymity(li_patients, LI_QIS) == 3
    assert distinct_l_diversity(li_patients, LI_QIS, "disease") == 3
    assert entropy_l_diversity(li_patients, LI_QIS, "disease") == pytest.approx(3.0)
    # Every class has three distinct values, each once: r_1 = 1, r_2 + r_3 = 2.
    assert recursive_cl_diversity(li_patients, LI_QIS, "disease", l=2) == pytest.approx(0.5)


def test_li_table4_salary_ordered_distance_is_0_167(li_patients):
    """The paper's Table 4 caption: 0.167-closeness w.r.t. Salary (ordered distance over 9 salaries)."""
    assert t_closeness(li_patients, LI_QIS, "salary", "ordered") == pytest.approx(1 / 6)
    assert round(t_closeness(li_patients, LI_QIS, "salary", "ordered"), 3) == 0.167
    classes = equivalence_classes(li_patients, LI_QIS)
    per_class = sensitive_distribution(li_patients, classes, "salary", "ordered").class_emd_ordered()
    assert sorted(per_class) == pytest.approx([1 / 12, 1 / 6, 1 / 6])


def test_li_section_4_salary_example_is_0_375():
    """Li et al. 2007, section 4.2: P = {3k..11k}, Q1 = {3k, 4k, 5k} has D[P, Q1] = 0.375 (and Q2 = the rest 0.1875)."""
    table = pd.DataFrame({"q": [1, 1, 1, 2, 2, 2, 2, 2, 2], "salary": [3, 4, 5, 6, 7, 8, 9, 10, 11]})
    classes = equivalence_classes(table, ["q"])
    emd = sensitive_distribution(table, classes, "salary", "ordered").class_emd_ordered()
    assert emd == pytest.approx([0.375, 0.1875])


def _emd_by_linear_programme(p: np.ndarray, q: np.ndarray, ground: np.ndarray) -> float:
    """Earth Mover's Distance as the transportation problem (an independent oracle for the closed forms)."""
    m = p.size
    rows_sum_to_q = [np.kron(np.eye(m)[i], np.ones(m)) for i in range(m)]
    columns_sum_to_p = [np.kron(np.ones(m), np.eye(m)[j]) for j in range(m)]
    equalities = rows_sum_to_q + columns_sum_to_p
    result = linprog(ground.ravel(), A_eq=np.array(equalities), b_eq=np.concatenate([q, p]), bounds=(0, None))
    return float(result.fun)


def _hierarchy_ground_distance(hierarchy: ValueHierarchy) -> np.ndarray:
    m = len(hierarchy.leaves)
    ancestors = [[] for _ in range(m)]
    for leaf in range(m):
        node = leaf
        while node >= 0:
            ancestors[leaf].append(node)
            node = hierarchy.parent[node]
    ground = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            common = next(a for a in ancestors[i] if a in ancestors[j])
            ground[i, j] = (hierarchy.height - hierarchy.depth[common]) / hierarchy.height
    return ground


def test_li_table4_disease_hierarchical_distance_matches_transportation_problem(li_patients):
    """Hierarchical distance over Figure 1's tree. The paper prints 0.278 for Table 4; the exact EMD of its own data
    under its own ground distance is 8/27 = 0.296 (the class {gastritis, flu, bronchitis}), as the linear programme
    below confirms, and the paper's 0.5 for {gastric ulcer, gastritis, stomach cancer} exceeds that class's total
    variation 4/9, so no distance <= 1 can produce it. We follow the definition, not the printed figure
    (docs/anonymity.md)."""
    hierarchy = ValueHierarchy.from_mapping(DISEASE_HIERARCHY)
    classes = equivalence_classes(li_patients, LI_QIS)
    dist = sensitive_distribution(li_patients, classes, "disease", "hierarchical", hierarchy)
    ours = dist.class_emd_hierarchical(hierarchy)

    ground = _hierarchy_ground_distance(hierarchy)
    p = dist.table_counts / dist.table_counts.sum()
    for c in range(classes.n_classes):
        q = np.zeros(p.size)
        mask = dist.pair_class == c
        q[dist.pair_code[mask]] = dist.pair_count[mask] / dist.class_sizes[c]
        assert ours[c] == pytest.approx(_emd_by_linear_programme(p, q, ground), abs=1e-9)
    assert sorted(ours) == pytest.approx([5 / 27, 7 / 27, 8 / 27])
    assert t_closeness(li_patients, LI_QIS, "disease", "hierarchical", hierarchy) == pytest.approx(8 / 27)


def test_equal_distance_is_total_variation(li_patients):
    # P = (gastric ulcer 1, gastritis 2, stomach cancer 2, flu 1, pneumonia 1, bronchitis 2) / 9.
    # {gastric ulcer, stomach cancer, pneumonia}: |q - p| = 2/9 + 2/9 + 1/9 + 1/9 + 2/9 + 2/9 = 10/9, halved 5/9;
    # {gastritis, flu, bronchitis}: 8/9 -> 4/9; {gastritis, bronchitis, stomach cancer}: 6/9 -> 3/9.
    classes = equivalence_classes(li_patients, LI_QIS)
    emd = sensitive_distribution(li_patients, classes, "disease", "equal").class_emd_equal()
    assert emd == pytest.approx([5 / 9, 4 / 9, 3 / 9])
    assert t_closeness(li_patients, LI_QIS, "disease", "equal") == pytest.approx(5 / 9)


# --- the kanon tables (../shared/data/kanon) ----------------------------------------------------------------------


def test_hospital_table_known_answers(hospital):
    """Classes on (gender, city): F-Kerala 2, F-Tamil Nadu 2, M-Karnataka 3, M-Kerala 3, M-Tamil Nadu 3 (all Cancer)."""
    classes = equivalence_classes(hospital, HOSPITAL_QIS)
    assert classes.n_classes == 5
    assert k_anonymity(hospital, HOSPITAL_QIS) == 2
    assert distinct_l_diversity(hospital, HOSPITAL_QIS, "disease") == 1
    assert entropy_l_diversity(hospital, HOSPITAL_QIS, "disease") == pytest.approx(1.0)
    assert math.isinf(recursive_cl_diversity(hospital, HOSPITAL_QIS, "disease", l=2))
    # P: Cancer 5/13; the all-Cancer class is at total variation 1 - 5/13 = 8/13 (F-Kerala ties at 8/13).
    assert t_closeness(hospital, HOSPITAL_QIS, "disease", "equal") == pytest.approx(8 / 13)
    violation = violating_classes(classes, 3)
    assert (violation.classes, violation.rows, violation.size_counts) == (2, 4, {2: 2})


def test_arx_table_ordered_zip(arx_age_gender_zip):
    """QI gender; zipcode as an ordered attribute: values 81667 < 81675 < 81925 < 81931 with P = (1, 1, 1, 4)/7.
    Female (81675, 81931, 81931): cumulative differences -1/7, 1/21, -2/21, so EMD = (6/21)/3 = 2/21.
    Male (81667, 81925, 81931, 81931): 3/28, -1/28, 2/28, so EMD = (6/28)/3 = 1/14."""
    table = arx_age_gender_zip
    assert k_anonymity(table, ["age", "gender", "zipcode"]) == 1
    assert k_anonymity(table, ["gender"]) == 3
    classes = equivalence_classes(table, ["gender"])
    emd = sensitive_distribution(table, classes, "zipcode", "ordered").class_emd_ordered()
    assert sorted(emd) == pytest.approx([1 / 14, 2 / 21])
    assert t_closeness(table, ["gender"], "zipcode", "ordered") == pytest.approx(2 / 21)


def test_students_k5_is_5_anonymous(students_k5):
    assert k_anonymity(students_k5, STUDENT_QIS) == 5


# --- l-diversity on a hand table -----------------------------------------------------------------------------------


def test_recursive_and_entropy_l_on_hand_table():
    # One class with counts 3, 2, 1: entropy = -(1/2 ln 1/2 + 1/3 ln 1/3 + 1/6 ln 1/6).
    table = pd.DataFrame({"qi": ["a"] * 6, "s": ["x", "x", "x", "y", "y", "z"]})
    entropy = -(0.5 * math.log(0.5) + math.log(1 / 3) / 3 + math.log(1 / 6) / 6)
    assert entropy_l_diversity(table, ["qi"], "s") == pytest.approx(math.exp(entropy))
    assert recursive_cl_diversity(table, ["qi"], "s", l=1) == pytest.approx(3 / 6)
    assert recursive_cl_diversity(table, ["qi"], "s", l=2) == pytest.approx(3 / 3)
    assert recursive_cl_diversity(table, ["qi"], "s", l=3) == pytest.approx(3 / 1)
    assert math.isinf(recursive_cl_diversity(table, ["qi"], "s", l=4))


def test_ordered_emd_with_many_values_matches_dense_formula():
    """The sparse ordered EMD equals the textbook dense formula on a random table with many distinct values."""
    rng = np.random.default_rng(7)
    table = pd.DataFrame({"qi": rng.integers(0, 40, 3000), "s": rng.integers(0, 500, 3000)})
    classes = equivalence_classes(table, ["qi"])
    dist = sensitive_distribution(table, classes, "s", "ordered")
    dense = np.zeros((classes.n_classes, dist.n_values))
    np.add.at(dense, (dist.pair_class, dist.pair_code), dist.pair_count)
    q = dense / dense.sum(axis=1, keepdims=True)
    p = dist.table_counts / dist.table_counts.sum()
    expected = np.abs(np.cumsum(q - p, axis=1)[:, :-1]).sum(axis=1) / (dist.n_values - 1)
    assert dist.class_emd_ordered() == pytest.approx(expected, abs=1e-12)
    expected_equal = 0.5 * np.abs(q - p).sum(axis=1)
    assert dist.class_emd_equal() == pytest.approx(expected_equal, abs=1e-12)


def test_ordered_text_attribute_uses_declared_order():
    table = pd.DataFrame({"qi": [1, 1, 2, 2], "s": ["low", "high", "mid", "mid"]})
    assert t_closeness(table, ["qi"], "s", "ordered", order=["low", "mid", "high"]) == pytest.approx(0.25)


# --- a declared order on a numeric column ----------------------------------------------------------------------


def _six_values(values: pd.Series) -> pd.DataFrame:
    return pd.DataFrame({"qi": [1, 1, 1, 2, 2, 2], "s": values})


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param("int64", id="int64"),
        pytest.param("float64", id="float64"),
        pytest.param("Int64", id="nullable Int64"),
        pytest.param("Float64", id="nullable Float64"),
        pytest.param("double[pyarrow]", id="Arrow double"),
        pytest.param(object, id="object column of floats"),
    ],
)
@pytest.mark.parametrize(
    "order",
    [pytest.param([1, 2, 3, 4, 5, 6], id="int order"), pytest.param([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], id="float order")],
)
def test_declared_order_matches_numeric_column_by_number(dtype, order):
    """A declared order matches a numeric column's values by equality of number (1 == 1.0), whatever the dtype."""
    values = pd.Series([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).astype(dtype)
    # Class {1, 2, 3} against P uniform over six ranks: CDF gaps 1/6, 2/6, 3/6, 2/6, 1/6, so EMD = (9/6) / 5 = 0.3.
    assert t_closeness(_six_values(values), ["qi"], "s", "ordered", order=order) == pytest.approx(0.3)


def test_declared_order_ranks_float_column_as_declared_not_sorted():
    """The declared order, not the sort order, ranks a float column's values."""
    table = pd.DataFrame({"qi": [1, 1, 2, 2], "s": [1.0, 3.0, 2.0, 2.0]})
    # Declared 1 < 3 < 2: class {1, 3} has Q = (1/2, 1/2, 0) against P = (1/4, 1/4, 1/2): EMD = (1/4 + 1/2) / 2.
    assert t_closeness(table, ["qi"], "s", "ordered", order=[1, 3, 2]) == pytest.approx(0.375)


@pytest.mark.parametrize(
    "order",
    [
        pytest.param(["1", "2", "3", "4", "5", "6"], id="text entries"),
        pytest.param([1, 2, 3, 4, 5, "six"], id="one text entry"),
        pytest.param([True, 2, 3, 4, 5, 6], id="bool entry"),
        pytest.param([1, 2, 3, 4, 5, math.nan], id="NaN entry"),
    ],
)
def test_non_numeric_order_for_numeric_column_is_refused_naming_the_column(order):
    """A declared order with non-numeric entries for a numeric column is a clear error naming the column."""
    table = _six_values(pd.Series([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    with pytest.raises(AnonymityInputError, match=r"sensitive attribute 's' is numeric \(float64\).*not numbers"):
        t_closeness(table, ["qi"], "s", "ordered", order=order)


def test_order_listing_the_same_number_twice_is_refused():
    """An order listing one number twice (1 and 1.0) is refused for a numeric column."""
    table = _six_values(pd.Series([1, 2, 3, 4, 5, 6]))
    with pytest.raises(AnonymityInputError, match="lists the number 1.0 more than once"):
        t_closeness(table, ["qi"], "s", "ordered", order=[1, 2, 3, 4, 5, 6, 1.0])


def test_numeric_order_for_text_column_matches_by_text():
    """On a text column a declared order matches by text, so the order entry 1 matches the cell "1"."""
    table = _six_values(pd.Series(["1", "2", "3", "4", "5", "6"]))
    assert t_closeness(table, ["qi"], "s", "ordered", order=[1, 2, 3, 4, 5, 6]) == pytest.approx(0.3)


def test_float_column_value_missing_from_integer_order_is_refused():
    """A float value that equals no number of the declared order (2.5) is refused, not rounded."""
    table = _six_values(pd.Series([1.0, 2.5, 3.0, 4.0, 5.0, 6.0]))
    with pytest.raises(AnonymityInputError, match="1 value\\(s\\) are not in the declared order"):
        t_closeness(table, ["qi"], "s", "ordered", order=[1, 2, 3, 4, 5, 6])


# --- entropy l is exact at equal frequencies ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(["a", "b", "c"], 3.0, id="three values once each"),
        pytest.param(["a", "b", "c"] * 7, 3.0, id="three values seven times each"),
        pytest.param(list("abcdefg") * 13, 7.0, id="seven values thirteen times each"),
        pytest.param(["a", "b"] * 50_000, 2.0, id="two values in a class of 100000"),
        pytest.param(list("aaaabcde"), 4.0, id="counts 4, 1, 1, 1, 1 give exactly 4"),
    ],
)
def test_entropy_l_is_exact_when_exp_entropy_is_a_whole_number(values, expected):
    """Entropy l is reported exactly (3.0, not 2.9999999999999996) when exp(H) is a whole number."""
    table = pd.DataFrame({"qi": 1, "s": values})
    assert entropy_l_diversity(table, ["qi"], "s") == expected


@pytest.mark.parametrize(
    ("counts", "l", "met"),
    [
        pytest.param([1, 1, 1], 3, True, id="three equal counts meet l = 3"),
        pytest.param([5, 5, 5], 3.0000000000000004, False, id="three equal counts miss the next float above 3"),
        pytest.param([2, 1, 1], 3, False, id="unequal counts miss l = 3"),
        pytest.param([50_001, 49_999], 2, False, id="counts 50001 and 49999 miss l = 2 by 2e-10"),
        pytest.param([50_000, 50_000], 2, True, id="counts 50000 and 50000 meet l = 2"),
        pytest.param([500_001, 499_999], 2, False, id="a class of 10**6 rows misses l = 2 by 2e-12"),
        pytest.param([4, 1, 1, 1, 1], 4, True, id="counts 4, 1, 1, 1, 1 meet l = 4"),
        pytest.param([4, 4, 8], 2.5, True, id="exp(H) = 2 * 2**0.5 meets l = 2.5"),
        # 2 * 2**0.5 = 2.8284271247461900976...: the float just below it is met, the float nearest it (above) is not.
        pytest.param([4, 4, 8], 2.82842712474619, True, id="exp(H) = 2 * 2**0.5 meets the float just below it"),
        pytest.param([4, 4, 8], 2.8284271247461903, False, id="exp(H) = 2 * 2**0.5 misses the float just above it"),
        pytest.param([7], 1, True, id="one value meets l = 1"),
    ],
)
def test_entropy_l_test_is_exact_at_the_target(counts, l, met):
    """The entropy l test decides classes at or within float rounding of l exactly."""
    values = [f"v{i}" for i, count in enumerate(counts) for _ in range(count)]
    table = pd.DataFrame({"qi": 1, "s": values})
    dist = sensitive_distribution(table, equivalence_classes(table, ["qi"]), "s")
    assert dist.class_entropy_l_met(l).tolist() == [met]


# --- bad input -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "qis", "match"),
    [
        pytest.param(pd.DataFrame({"a": [1, 2]}), ["b"], "unknown quasi-identifier column", id="unknown column"),
        pytest.param(pd.DataFrame({"a": pd.Series([], dtype=int)}), ["a"], "empty", id="empty table"),
        pytest.param(pd.DataFrame({"a": [1.0, np.nan, 2.0]}), ["a"], "1 missing value", id="NaN in a QI"),
        pytest.param(pd.DataFrame({"a": ["x", None]}), ["a"], "missing value", id="None in a text QI"),
        pytest.param(pd.DataFrame({"a": [1]}), [], "no quasi-identifier declared", id="no QI"),
    ],
)
def test_bad_input_is_a_clear_error(table, qis, match):
    with pytest.raises(AnonymityInputError, match=match):
        k_anonymity(table, qis)


def test_errors_are_value_errors_and_never_quote_values():
    table = pd.DataFrame({"qi": [1, 2], "s": ["secret-diagnosis", "flu"]})
    hierarchy = ValueHierarchy.from_mapping({"*": ["flu"]})
    with pytest.raises(ValueError) as info:
        t_closeness(table, ["qi"], "s", "hierarchical", hierarchy)
    assert "secret-diagnosis" not in str(info.value)
    assert "1 value(s) are not leaves" in str(info.value)


def test_ordered_text_attribute_without_order_is_refused():
    table = pd.DataFrame({"qi": [1, 1], "s": ["b", "a"]})
    with pytest.raises(AnonymityInputError, match="declare its 'order'"):
        t_closeness(table, ["qi"], "s", "ordered")


@pytest.mark.parametrize(
    ("tree", "match"),
    [
        pytest.param({"*": ["a", "a"]}, "more than once", id="duplicate leaf"),
        pytest.param({"*": {"g": []}}, "no children", id="empty node"),
        pytest.param({"*": {"g": "a"}}, "mapping or a list", id="leaf not in a list"),
    ],
)
def test_bad_hierarchy(tree, match):
    with pytest.raises(ValueError, match=match):
        ValueHierarchy.from_mapping(tree)
