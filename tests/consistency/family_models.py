"""Models of consistent families for the tests, built from the spec alone: specs of families, the dense linear model
(0/1 summing matrices and pmf-summed noise variances) computed without ``dp_operators.consistency``, numpy's dense
generalised least squares, product families, the exact samplers fed seeded words, and the Monte Carlo coverage of
published half-widths."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from functools import cache

import numpy as np

from dp_operators.consistency import variance, wls
from dp_operators.consistency.structure import Family, Member, base_codes, member_to_base
from dp_operators.ledger import ReleaseKey
from dp_operators.mechanisms.vectorised import sample_discrete_gaussian_array, sample_discrete_laplace_array
from dp_operators.release import plan_release
from dp_operators.release.consistent import make_consistent, plan_families
from dp_operators.spec import ReleaseSpec

from support import make_ledger

ALPHA = 0.05
DAG = "consistent_families"


def aggregate(name: str, keys: dict, mechanism: str, budget: dict, kind: str = "count", **extra) -> dict:
    entry = {"name": name, "kind": kind, "mechanism": mechanism, "budget": budget, **extra}
    if keys:
        entry.update(group_by=list(keys), keys=keys)
    return entry


def make_spec(aggregates: list[dict], postprocess: dict | None) -> ReleaseSpec:
    document = {"version": 1, "release": "families", "budget_account": "acct", "privacy_unit": "person",
                "aggregates": aggregates}
    if postprocess is not None:
        document["postprocess"] = postprocess
    return ReleaseSpec.model_validate(document)


def laplace_variance_by_summation(scale: Fraction) -> float:
    """sum x^2 pmf(x) of the discrete Laplace law pmf(x) = (1 - q) / (1 + q) q^|x|, q = exp(-1 / scale)."""
    q = math.exp(-1 / float(scale))
    x = np.arange(1, int(60 * float(scale)) + 60, dtype=np.float64)
    return float(2 * np.sum(x * x * q ** x) * (1 - q) / (1 + q))


def gaussian_variance_by_summation(sigma2: Fraction) -> float:
    """sum x^2 exp(-x^2 / 2 sigma2) / sum exp(-x^2 / 2 sigma2) over the integers."""
    s2 = float(sigma2)
    if s2 >= 1e4:  # the Poisson-summation correction exp(-2 pi^2 s2) is far below float precision
        return s2
    x = np.arange(-int(40 * math.sqrt(s2)) - 40, int(40 * math.sqrt(s2)) + 41, dtype=np.float64)
    w = np.exp(-x * x / (2 * s2))
    return float(np.sum(x * x * w) / np.sum(w))


def dense_model(spec: ReleaseSpec, plan, base_name: str, members: list[str], parents: dict | None = None):
    """The linear model of a family computed from the spec alone, without dp_operators.consistency: per member, its
    0/1 summing matrix A_m (member cells x base cells, both in release order: the product of the key lists, last
    column fastest) and its exact per-cell noise variance (value units^2) by summing the law's pmf. ``parents``:
    ``{coarser column: (finer column, {finer key: coarser key})}``."""
    by_name = {a.name: a for a in spec.aggregates}
    base = by_name[base_name]
    base_cells = list(itertools.product(*(base.keys[c] for c in base.group_by)))
    matrices, variances = [], []
    for name in members:
        member = by_name[name]
        cells = list(itertools.product(*(member.keys[c] for c in member.group_by))) if member.group_by else [()]
        position = {cell: i for i, cell in enumerate(cells)}
        a = np.zeros((len(cells), len(base_cells)))
        for j, cell in enumerate(base_cells):
            named = dict(zip(base.group_by, cell))
            for coarser, (finer, mapping) in (parents or {}).items():
                named[coarser] = mapping[named[finer]]
            a[position[tuple(named[c] for c in member.group_by)], j] = 1.0
        matrices.append(a)
        step = plan.step(name, member.kind)
        law = laplace_variance_by_summation if step.mechanism == "discrete_laplace" else gaussian_variance_by_summation
        variances.append(law(step.scale) * float(step.grid) ** 2)
    return matrices, variances


def dense_gls(matrices, variances, observations) -> np.ndarray:
    """numpy's dense weighted least squares (lstsq on the whitened stacked system)."""
    design = np.vstack([a / math.sqrt(v) for a, v in zip(matrices, variances)])
    target = np.concatenate([np.asarray(y, float) / math.sqrt(v) for y, v in zip(observations, variances)])
    return np.linalg.lstsq(design, target, rcond=None)[0]


def seeded_noise(mechanism: str, parameter: Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """The project's exact vectorised sampler fed seeded words; its sign (drawn by the sampler from the OS) is
    replaced by a seeded fair sign, which leaves the (symmetric) law unchanged."""
    sampler = sample_discrete_laplace_array if mechanism == "discrete_laplace" else sample_discrete_gaussian_array
    magnitude = np.abs(sampler(parameter, size, _words=lambda n: rng.bit_generator.random_raw(n).astype(np.uint64)))
    return np.where(rng.integers(0, 2, size).astype(bool), -magnitude, magnitude).astype(np.int64)


def product_family(shape, kept, variances=None, mechanism: str = "discrete_gaussian", biases=None,
                   names=None) -> Family:
    """A product family over axes c0, c1, ... of the given sizes; ``kept[m]`` the axes member m keeps (the base
    first, keeping them all). Members are named ``names[m]``, or by their columns (``c0xc1``, ``total``) with the
    position added to a repeated one; variances default to 1, biases to 0."""
    columns = [f"c{i}" for i in range(len(shape))]
    keys = {c: [f"{c}_{k}" for k in range(n)] for c, n in zip(columns, shape)}
    codes = base_codes(shape)
    variances = variances if variances is not None else [1.0] * len(kept)
    members, seen = [], set()
    for m, axes in enumerate(kept):
        columns_kept = [columns[a] for a in axes]
        to_base, kept_axes = member_to_base(columns, keys, columns_kept, {c: keys[c] for c in columns_kept}, {},
                                            codes)
        name = names[m] if names else ("x".join(columns_kept) or "total")
        name = f"{name}_{m}" if name in seen else name
        seen.add(name)
        members.append(Member(name, math.prod(shape[a] for a in axes), to_base, variances[m], mechanism,
                              0.0 if biases is None else biases[m], kept_axes))
    return Family(tuple(members), tuple(shape))


def all_margins(axes: int) -> list[tuple[int, ...]]:
    """Every subset of the axes, the full set (the base) first and the empty one (the total) last."""
    return [s for k in range(axes, -1, -1) for s in itertools.combinations(range(axes), k)]


AGE_BAND = {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3", 4: "4-5", 5: "4-5"}


def hierarchy_family(variances=None, mechanism: str = "discrete_gaussian", biases=None) -> Family:
    """Ages 0..5 x sex, with age band (0-1, 2-3, 4-5) x sex, age band, sex, the total and age alone (age band >
    age); variances default to 1, biases to 0."""
    base_columns = ["age", "sex"]
    keys = {"age": list(range(6)), "sex": ["F", "M"], "band": ["0-1", "2-3", "4-5"]}
    parents = {"band": ("age", AGE_BAND)}
    groupings = [["age", "sex"], ["band", "sex"], ["band"], ["sex"], [], ["age"]]
    variances = variances if variances is not None else [1.0] * len(groupings)
    members = []
    for m, columns in enumerate(groupings):
        to_base, kept = member_to_base(base_columns, keys, columns, keys, parents)
        members.append(Member("_".join(columns) or "total", math.prod(len(keys[c]) for c in columns), to_base,
                              variances[m], mechanism, 0.0 if biases is None else biases[m], kept))
    return Family(tuple(members), (6, 2))


FAMILIES = {
    "3x2 table, rows, columns, total": lambda: product_family((3, 2), all_margins(2), [1.0, 4.0, 2.5, 9.0]),
    "4x3x2 cube with every margin": lambda: product_family(
        (4, 3, 2), all_margins(3), [1.0, 2.0, 0.5, 3.0, 1.5, 4.0, 0.7, 2.5]),
    "duplicated members (two row margins, two totals)": lambda: product_family(
        (3, 4), [(0, 1), (0,), (0,), (), ()], [2.0, 1.0, 3.0, 5.0, 0.25]),
    "age > age band hierarchy x sex": lambda: hierarchy_family([1.0, 2.0, 3.0, 0.5, 4.0, 1.5]),
}


def noised(family: Family, truth: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """One release: every member's true cells plus Gaussian noise of its variance."""
    return [family.margin(m, truth) + rng.normal(0.0, math.sqrt(m.variance), m.cells) for m in family.members]


def new_ledger(path, accountant="zcdp", cap="100000"):
    return make_ledger(path, cap=cap, accountant=accountant, dags=(DAG,), account="acct")


def release_key(name: str = "families") -> ReleaseKey:
    return ReleaseKey(dag_id=DAG, run_id="r", task_id="t", map_index=-1, release_name=name)



FOUR_AXES = {"a": ["a0", "a1"], "b": ["b0", "b1", "b2"], "c": ["c0", "c1"], "d": ["d0", "d1", "d2"]}


def four_axis_aggregates(kind: str = "count") -> list[dict]:
    """A 2x3x2x3 base and margins that list their columns in another order than the base and their keys in another
    order, a margin released twice (Laplace and Gaussian), a reordered copy of the base, and the total."""
    extra = {"bounds": [0, 5], "grid": "1/4"} if kind == "sum" else {}
    k = FOUR_AXES
    return [
        aggregate("base", k, "discrete_gaussian", {"rho": "1/10"}, kind, **extra),
        aggregate("db", {"d": ["d2", "d0", "d1"], "b": ["b1", "b2", "b0"]}, "discrete_gaussian", {"rho": "1/40"},
                  kind, **extra),
        aggregate("ca", {"c": ["c1", "c0"], "a": k["a"]}, "discrete_laplace", {"epsilon": "1/2"}, kind, **extra),
        aggregate("b_laplace", {"b": ["b2", "b1", "b0"]}, "discrete_laplace", {"epsilon": "1/5"}, kind, **extra),
        aggregate("b_gauss", {"b": k["b"]}, "discrete_gaussian", {"rho": "1/100"}, kind, **extra),
        aggregate("dcba", {"d": k["d"], "c": k["c"], "b": ["b2", "b0", "b1"], "a": k["a"]}, "discrete_gaussian",
                  {"rho": "1/20"}, kind, **extra),
        aggregate("total", {}, "discrete_laplace", {"epsilon": "1/3"}, kind, **extra),
    ]


def four_axis_spec(kind: str = "count", postprocess=True) -> ReleaseSpec:
    names = [a["name"] for a in four_axis_aggregates(kind)]
    consistent = True if kind == "count" else [names]
    post = {"consistent": consistent} if postprocess else None
    return make_spec(four_axis_aggregates(kind), post)



def linear_map(family: Family) -> np.ndarray:
    """P, the published values of all members (stacked) as a linear function of all observations, column by
    column: the fit of every unit observation (the fit is linear)."""
    columns = []
    for m, member in enumerate(family.members):
        for cell in range(member.cells):
            unit = [np.zeros(other.cells) for other in family.members]
            unit[m][cell] = 1.0
            fitted = wls.fit(family, unit)
            columns.append(np.concatenate([family.margin(other, fitted) for other in family.members]))
    return np.array(columns).T


KEYS_3x2 = {"x": ["x0", "x1", "x2"], "y": ["y0", "y1"]}


def table_spec(base: tuple[str, dict], margins: tuple[str, dict]) -> ReleaseSpec:
    """A 3x2 count table, its row and column margins and the total: the base with one mechanism and budget, the
    three margins with another."""
    k = KEYS_3x2
    return make_spec([aggregate("xy", k, *base), aggregate("x", {"x": k["x"]}, *margins),
                      aggregate("y", {"y": k["y"]}, *margins), aggregate("t", {}, *margins)], {"consistent": True})


COVERAGE_CASES = {
    # base dominating: its least-squares value is essentially its own lattice-valued noise
    "discrete Gaussian sigma2 1 (rho 1/2) base, margins rho 1e-6": (
        ("discrete_gaussian", {"rho": "1/2"}), ("discrete_gaussian", {"rho": "0.000001"})),
    "discrete Laplace scale 1 (epsilon 1) base, margins epsilon 1e-3": (
        ("discrete_laplace", {"epsilon": 1}), ("discrete_laplace", {"epsilon": "0.001"})),
    "discrete Laplace scale 2 base, margins epsilon 1e-3": (
        ("discrete_laplace", {"epsilon": "1/2"}), ("discrete_laplace", {"epsilon": "0.001"})),
    "discrete Laplace scale 1/2 base (it over-covers), margins epsilon 1e-3 (the 2-cell row margin does not)": (
        ("discrete_laplace", {"epsilon": 2}), ("discrete_laplace", {"epsilon": "0.001"})),
    "mixed: discrete Gaussian sigma2 1 base, Laplace margins epsilon 1e-3": (
        ("discrete_gaussian", {"rho": "1/2"}), ("discrete_laplace", {"epsilon": "0.001"})),
}
PASSING_COVERAGE_CASES = {
    "discrete Laplace scale 1 everywhere": (("discrete_laplace", {"epsilon": 1}), ("discrete_laplace", {"epsilon": 1})),
    "discrete Gaussian sigma2 4 everywhere": (("discrete_gaussian", {"rho": "1/8"}),
                                              ("discrete_gaussian", {"rho": "1/8"})),
}


@cache
def simulated_coverage(base: tuple, margins: tuple, releases: int = 5000, seed: int = 21):
    """Per member: the fraction of (release, cell) pairs whose published interval holds the true value; the same
    with intervals of half the width (the negative control); and with the half-width q * sd alone, without the
    continuity correction (the rule that under-covers at small scales). The published half-widths come from
    make_consistent; the errors are the fitted linear map applied to the exact samplers' noise (checked against
    make_consistent on the first releases)."""
    base_ = (base[0], dict(base[1]))
    margins_ = (margins[0], dict(margins[1]))
    spec = table_spec(base_, margins_)
    plan = plan_release(spec, accountant="zcdp")
    (planned,) = plan_families(plan)
    family = planned.family
    rng = np.random.default_rng(seed)
    truth = np.array([120, 80, 35, 41, 7, 0])
    noise = []
    for member in family.members:
        step = plan.step(member.name, "count")
        noise.append(seeded_noise(step.mechanism, step.scale, releases * member.cells, rng).reshape(releases, -1))
    noise = np.hstack(noise)
    exact = np.concatenate([family.margin(m, truth.astype(float)) for m in family.members])
    projection = linear_map(family)
    errors = noise @ projection.T
    bounds = np.cumsum([0] + [m.cells for m in family.members])
    widths = None
    for r in range(3):
        noised = {(m.name, "count"): (exact[bounds[i]:bounds[i + 1]] + noise[r, bounds[i]:bounds[i + 1]]
                                      ).astype(np.int64) for i, m in enumerate(family.members)}
        result = make_consistent(plan, planned, noised, ALPHA)
        published = np.concatenate([result.cells[m.name].published for m in family.members])
        np.testing.assert_allclose(published - exact, errors[r], atol=1e-9)
        widths = np.concatenate([result.cells[m.name].half_width for m in family.members])
    q = variance.quantile_factor([m.mechanism for m in family.members], ALPHA)
    uncorrected = q * np.concatenate([a.standard_deviation for a in planned.accuracies])
    assert np.all(widths > uncorrected)
    covered = np.abs(errors) <= widths
    halved = np.abs(errors) <= widths / 2
    plain = np.abs(errors) <= uncorrected
    per_member = {m.name: (float(covered[:, bounds[i]:bounds[i + 1]].mean()),
                           float(halved[:, bounds[i]:bounds[i + 1]].mean()),
                           float(plain[:, bounds[i]:bounds[i + 1]].mean()))
                  for i, m in enumerate(family.members)}
    return per_member, releases


def standard_error(name: str, releases: int) -> float:
    cells = {"xy": 6, "x": 3, "y": 2, "t": 1}[name]
    return math.sqrt(ALPHA * (1 - ALPHA) / (releases * cells))


def assert_coverage(per_member: dict, releases: int) -> None:
    low = {}
    for name, (covered, halved, _) in per_member.items():
        se = standard_error(name, releases)
        assert halved < 1 - ALPHA - 4 * se, (name, halved)  # negative control: the check can fail
        if covered < 1 - ALPHA - 4 * se:
            low[name] = round(covered, 4)
    assert low == {}, f"coverage below the nominal {1 - ALPHA} by more than 4 standard errors: {low}"



@cache
def nonnegative_simulation(releases: int = 150, seed: int = 31):
    """A sparse 30x30 count table (95 % zero cells, the others 20..59) with its margins and total, discrete
    Gaussian sigma2 25 everywhere: coverage of the published intervals per group, with ``nonnegative: true`` and,
    on the same noised values, with least squares alone (``{"nonnegative": ..., "least squares": ...}``)."""
    k = {"x": [f"x{i}" for i in range(30)], "y": [f"y{i}" for i in range(30)]}
    budget = ("discrete_gaussian", {"rho": "1/50"})
    aggregates = [aggregate("xy", k, *budget), aggregate("x", {"x": k["x"]}, *budget),
                  aggregate("y", {"y": k["y"]}, *budget), aggregate("t", {}, *budget)]
    plans = {}
    for label, post in (("nonnegative", {"consistent": True, "nonnegative": True}),
                        ("least squares", {"consistent": True})):
        plan = plan_release(make_spec(aggregates, post), accountant="zcdp")
        (planned,) = plan_families(plan)
        plans[label] = (plan, planned)
    plan, planned = plans["nonnegative"]
    family = planned.family
    rng = np.random.default_rng(seed)
    truth = rng.integers(20, 60, 900)
    truth[rng.random(900) < 0.95] = 0
    exact = {m.name: family.margin(m, truth.astype(float)) for m in family.members}
    covered = {label: {m.name: [] for m in family.members} for label in plans}
    for _ in range(releases):
        noised = {(m.name, "count"): (exact[m.name] + seeded_noise("discrete_gaussian", plan.step(m.name, "count")
                                                                   .scale, m.cells, rng)).astype(np.int64)
                  for m in family.members}
        for label, (one_plan, one_planned) in plans.items():
            result = make_consistent(one_plan, one_planned, noised, ALPHA)
            for m in family.members:
                cells = result.cells[m.name]
                if label == "nonnegative":
                    assert np.all(cells.published >= 0)
                covered[label][m.name].append(np.abs(cells.published - exact[m.name]) <= cells.half_width)
    coverage = {label: {name: np.array(rows).mean(axis=0) for name, rows in by_member.items()}
                for label, by_member in covered.items()}
    return coverage, truth, releases

