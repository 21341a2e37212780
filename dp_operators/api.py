"""The Python API without Airflow: single-call mechanisms and the release engine.

Every helper here is a thin front over the release engine (:mod:`dp_operators.release`): the value goes onto a
fixed-point grid, gets exact discrete noise from the OS CSPRNG, and comes back with the half-width of its
confidence interval. Parameters are validated by the same models as a YAML spec, before anything is charged.

Values may be ``int``, numpy integers, ``Decimal``, ``Fraction`` or floats; a float is taken as its exact binary
value, so the declared ``sensitivity`` must hold for the floats passed. A float sum of clipped values can differ
between neighbouring datasets by more than the clipping bound (Casacuberta, Shoemate, Vadhan, Wagaman, CCS 2022):
pass such sums exactly (an integer sum of integer values, an exactly summed ``Decimal``, a ``Fraction``), or
release them through
:func:`run_release` with a spec declaring ``upstream: {arithmetic: binary64, max_rows: N}``.

Charging: pass ``ledger``, ``account`` and ``key`` together to charge a budget account first (DESIGN.md 2.1). The
``key`` (a :class:`~dp_operators.ledger.ReleaseKey`) makes the call idempotent: calling again with the same key
returns the stored result, draws nothing and spends nothing. Its ``dag_id`` must be allowed to spend from the
account (``allowed_dags`` in the ledger configuration); outside Airflow use a pipeline name there. Without a
ledger nothing is recorded: you are responsible for composing the budgets yourself.

User guide: ``docs/python-api.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from numbers import Integral, Real
from typing import Any

from pydantic import ValidationError

from dp_operators.accounting import exact_number
from dp_operators.ledger import Ledger, ReleaseKey
from dp_operators.release import (
    check_aggregates,
    draw_noise,
    plan_release,
    prepare_inputs,
    publish_aggregate,
    run_release,
)
from dp_operators.spec import ReleaseSpec

__all__ = [
    "NoisyValue",
    "NoisyVector",
    "check_aggregates",
    "gaussian_mechanism",
    "laplace_mechanism",
    "plan_release",
    "run_release",
    "vector_release",
]

_NAME = "value"


@dataclass(frozen=True)
class NoisyValue:
    """One released value.

    Attributes:
        value: the noised value, a multiple of the grid (an ``int`` when the grid is 1).
        half_width: half-width of its ``confidence`` interval around ``value``, from public parameters only: the
            noise's half-width plus half a grid step (the rounding to the grid). None when the value may be
            saturated: its noised grid integer is within one noise half-width of the engine's limit of +-2**62
            grid units, so the true value may lie beyond it and no finite interval is claimed.
        mechanism: the noise step as recorded in a ledger (mechanism, scale or sigma, sensitivities, epsilon/rho).
        charge: what the ledger account was charged (``None`` without a ledger).
        replayed: True when a ledger returned the stored result of this key (nothing drawn, nothing spent).
        saturated: True when the value may be saturated (then ``half_width`` is None). Decided from the noised
            value only (post-processing).
    """

    value: int | float
    half_width: float | None
    confidence: float
    mechanism: dict[str, Any]
    charge: dict[str, Any] | None
    replayed: bool = False
    saturated: bool = False


@dataclass(frozen=True)
class NoisyVector:
    """A released vector: ``values`` in input order, each with the same noise and so the same ``half_width``
    (see :class:`NoisyValue`), except the values flagged in ``saturated``: ``saturated[i]`` is True when
    ``values[i]`` may be saturated (its noised grid integer is within one noise half-width of +-2**62 grid units),
    and then no finite interval holds for it. ``half_width`` is None only when every value is saturated."""

    values: list[int | float]
    half_width: float | None
    confidence: float
    mechanism: dict[str, Any]
    charge: dict[str, Any] | None
    replayed: bool = False
    saturated: list[bool] = field(default_factory=list)


def _default_grid(sensitivity: Fraction, grid: object) -> Fraction:
    if grid is not None:
        return exact_number(grid, name="grid")
    return Fraction(1) if sensitivity.denominator == 1 else sensitivity / 1000


def _budget(epsilon: object, delta: object, rho: object) -> dict[str, object]:
    return {name: value for name, value in (("epsilon", epsilon), ("delta", delta), ("rho", rho)) if value is not None}


def _exact_value(value: object) -> object:
    """A float argument as the exact number of its binary value (NaN and infinities kept): the caller declares
    the sensitivity of the value it passes, so the float is the query's answer, not a float sum of clipped rows
    whose rounding the engine would have to bound (``upstream.arithmetic``). Other types pass unchanged.

    How a float is read is decided by its type only (DESIGN.md 2.4): a Python float (binary64) becomes the
    ``Decimal`` of its value; a finite numpy float of any width (float16 to ``longdouble``) the ``Fraction`` of
    its ``as_integer_ratio()``. Never through ``float()``: an x87 ``longdouble`` has 64 significant bits, so two
    values one sensitivity apart could round to doubles 256 sensitivities apart, and a finite value beyond 1.8e308
    would become infinity and be replaced by 0 instead of saturating like any other huge value."""
    numpy_float = type(value).__module__ == "numpy" and isinstance(value, Real) and not isinstance(value, Integral)
    if numpy_float:
        import numpy as np  # loaded already: the value is a numpy scalar

        if bool(np.isfinite(value)):  # type: ignore[call-overload]
            return Fraction(*value.as_integer_ratio())  # type: ignore[union-attr]
        return Decimal(float(value))  # NaN and +-infinity: the spec's non_finite policy handles them
    if isinstance(value, float):
        return Decimal(value)
    return value


def _checked_sensitivity(sensitivity: object) -> Fraction:
    try:
        value = exact_number(sensitivity, name="sensitivity")
    except ValueError as error:
        raise ValueError(str(error)) from None
    if value <= 0:
        raise ValueError(
            f"sensitivity must be > 0 (how much one privacy unit can change the value), got {sensitivity!r}"
        )
    return value


def _spec(
    *,
    release: str,
    account: str,
    privacy_unit: str,
    size: int | None,
    sensitivity: Fraction,
    grid: Fraction,
    mechanism: str,
    budget: dict[str, object],
    max_partitions_contributed: int,
    confidence: float,
) -> ReleaseSpec:
    """The one-aggregate spec a single call stands for: a sum whose contributions lie in [-sensitivity,
    sensitivity], so one privacy unit moves each value by at most the sensitivity (in at most
    ``max_partitions_contributed`` of the ``size`` values of a vector)."""
    aggregate: dict[str, Any] = {
        "name": _NAME,
        "kind": "sum",
        "bounds": [-float(sensitivity), float(sensitivity)]
        if exact_number(float(sensitivity)) == sensitivity  # the spec reads bounds back as typed decimals
        else None,
        "grid": str(grid),
        "mechanism": mechanism,
        "budget": {k: str(v) if isinstance(v, Fraction) else v for k, v in budget.items()},
        "contribution": {"max_partitions_contributed": max_partitions_contributed},
    }
    if aggregate["bounds"] is None:
        raise ValueError(f"sensitivity must be representable as a float, got {sensitivity}")
    if size is not None:
        aggregate.update(group_by=["index"], keys={"index": list(range(size))})
    document = {
        "version": 1,
        "release": release,
        "budget_account": account,
        "privacy_unit": privacy_unit,
        "confidence": confidence,
        "aggregates": [aggregate],
    }
    try:
        return ReleaseSpec.model_validate(document)
    except ValidationError as error:
        problems = []
        for problem in error.errors():
            where = ".".join(str(p) for p in problem["loc"] if not isinstance(p, int) and p != "aggregates")
            where = where.replace("budget.", "").replace("contribution.", "")
            problems.append(f"{where or 'parameters'}: {problem['msg'].removeprefix('Value error, ')}")
        raise ValueError("invalid parameters: " + "; ".join(problems)) from None


def _release(
    values: list[object] | object,
    *,
    sensitivity: object,
    budget: dict[str, object],
    mechanism: str,
    grid: object,
    max_partitions_contributed: int | None,
    confidence: float,
    ledger: Ledger | None,
    account: str | None,
    key: ReleaseKey | None,
    array: bool = False,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, bool]:
    """Run a one-aggregate release; returns (published aggregate, mechanism description, charge, replayed).
    ``values`` is a vector when it is a list, or when ``array`` says it is a 1-D array (vector_release)."""
    sensitivity_q = _checked_sensitivity(sensitivity)
    grid_q = _default_grid(sensitivity_q, grid)
    vector = isinstance(values, list) or array
    size = len(values) if vector else None
    if vector and size == 0:
        raise ValueError("values is empty: nothing to release")
    given = (ledger is not None, account is not None, key is not None)
    if any(given) and not all(given):
        raise ValueError("to charge a budget, give ledger, account and key together (see docs/python-api.md)")
    account_status = ledger.account(account) if ledger is not None else None  # type: ignore[arg-type]
    spec = _spec(
        release=key.release_name if key is not None else "api",
        account=account or "none",
        privacy_unit=account_status.privacy_unit if account_status else "unspecified",
        size=size,
        sensitivity=sensitivity_q,
        grid=grid_q,
        mechanism=mechanism,
        budget=budget,
        max_partitions_contributed=max_partitions_contributed or size or 1,
        confidence=confidence,
    )
    upstream = {_NAME: _vector_upstream(values, grid_q) if vector else _exact_value(values)}
    if ledger is not None:
        # the values are returned to the caller, never stored as files: every row stays in the output
        result = run_release(spec, upstream, ledger, key, spec_hash=_call_hash(spec),  # type: ignore[arg-type]
                             inline_rows_limit=None)
        output = result.output
        return output["aggregates"][_NAME], output["mechanisms"][0], output["charge"], result.replayed
    plan = plan_release(spec)
    prepared = prepare_inputs(spec, upstream)
    noised, _ = draw_noise(plan, prepared, [])
    if vector:  # the cells themselves (PublishedCells), not a row dict per value: nothing leaves this call as JSON
        published = publish_aggregate(spec, spec.aggregates[0], plan, noised, prepared.keys[_NAME],
                                      rows_file=lambda _aggregate, cells, _keys: cells)
    else:
        published = publish_aggregate(spec, spec.aggregates[0], plan, noised, prepared.keys[_NAME])
    return published, plan.steps[0].describe(), None, False


def _vector_upstream(values: list[object] | Any, grid: Fraction) -> Any:
    """The upstream value of a vector's aggregate (one row per index, the value as its ``sum``).

    An integer array, or a list of Python ints, becomes a :class:`pyarrow.Table` of int64 columns ``index`` and
    ``sum``, which the engine reads array-at-a-time (``release/columns.py``, docs/adr/0023); any other vector becomes
    row dicts of exact values (:func:`_exact_value`) for the row-by-row reader. Both readers give identical grid
    integers and refusals (tests/release_engine/test_columnar_inputs.py), so which one runs changes the running time
    only, and it is chosen from the values' types and the public ``grid`` alone, never from a value: a list of ints
    is clipped to +-(SATURATION + 1) grid steps first (:func:`_int64_array`), which changes no grid integer since
    everything beyond saturates at +-SATURATION anyway."""
    integers = _int64_array(values, grid)
    if integers is not None:
        import numpy as np
        import pyarrow as pa

        return pa.table({"index": np.arange(len(integers), dtype=np.int64), "sum": integers})
    if not isinstance(values, list):
        values = values.tolist()
    return [{"index": i, "sum": _exact_value(v)} for i, v in enumerate(values)]


def _int64_array(values: Any, grid: Fraction) -> Any:
    """``values`` as a numpy int64 array when they are integers by type: an array of a signed integer dtype or of an
    unsigned one narrower than 64 bits, or a list of Python ``int`` (never ``bool``). A list is clipped to
    +-ceil(grid * (SATURATION + 1)) first, so a value beyond int64 takes the same path as its neighbours; when that
    bound itself exceeds int64 (a grid above about 2, public) every list goes to the row reader. None for anything
    else (floats, numpy scalars of other types, Decimal, Fraction, uint64, mixed lists)."""
    import math

    import numpy as np

    from dp_operators.release.upstream_types import SATURATION

    if isinstance(values, np.ndarray):
        kind = values.dtype
        if kind.kind == "i" or (kind.kind == "u" and kind.itemsize < 8):
            return values.astype(np.int64, copy=False)
        return None
    if not all(type(v) is int for v in values):
        return None
    bound = math.ceil(grid * (SATURATION + 1))
    if bound > np.iinfo(np.int64).max:
        return None
    return np.array([-bound if v < -bound else bound if v > bound else v for v in values], dtype=np.int64)


def _call_hash(spec: ReleaseSpec) -> str:
    """SHA-256 of the call's parameters (the spec it stands for), recorded with the charge like a spec's hash."""
    from dp_operators.ledger import canonical_json
    from dp_operators.spec import spec_hash

    return spec_hash(canonical_json(spec.model_dump(mode="json")))


def _scalar(published: dict, described: dict, charge: dict | None, replayed: bool, confidence: float) -> NoisyValue:
    return NoisyValue(
        value=published["value"],
        half_width=published["half_width"],
        confidence=confidence,
        mechanism=described,
        charge=charge,
        replayed=replayed,
        saturated=bool(published.get("saturated", False)),
    )


def laplace_mechanism(
    value: int | float,
    *,
    sensitivity: int | float | Fraction,
    epsilon: int | float | Fraction,
    grid: int | float | Fraction | None = None,
    confidence: float = 0.95,
    ledger: Ledger | None = None,
    account: str | None = None,
    key: ReleaseKey | None = None,
) -> NoisyValue:
    """Release ``value`` with discrete Laplace noise: pure epsilon-DP for a query whose value one privacy unit
    changes by at most ``sensitivity``.

    The value is rounded to the ``grid`` (default 1 for an integer sensitivity, else sensitivity/1000) and noised
    as an integer with scale ceil(sensitivity/grid)/epsilon grid units, so the output carries no floating-point
    leak (Mironov 2012). The half-width adds half a grid step for the rounding. NaN and infinities become 0 (the
    spec defaults for ``non_finite``); a float is read as its exact binary value (module docstring).

    Raises:
        ValueError: epsilon or sensitivity not positive finite; ledger, account and key not given together.
        BudgetExhaustedError, DagNotAllowedError, AccountNotFoundError: ledger refusals, nothing spent.
        LedgerKeyError: the ledger has no spend key, or not the one the account accepts; nothing spent.
        LeaseHeldError: another call with the same ``key`` is still running (transient: retry after its lease).

    Source: Canonne, Kamath, Steinke 2020 (discrete Laplace, exact sampler).
    """
    published, described, charge, replayed = _release(
        value, sensitivity=sensitivity, budget=_budget(epsilon, None, None), mechanism="discrete_laplace", grid=grid,
        max_partitions_contributed=None, confidence=confidence, ledger=ledger, account=account, key=key,
    )
    return _scalar(published, described, charge, replayed, confidence)


def gaussian_mechanism(
    value: int | float,
    *,
    sensitivity: int | float | Fraction,
    epsilon: int | float | Fraction | None = None,
    delta: float | Fraction | None = None,
    rho: int | float | Fraction | None = None,
    grid: int | float | Fraction | None = None,
    confidence: float = 0.95,
    ledger: Ledger | None = None,
    account: str | None = None,
    key: ReleaseKey | None = None,
) -> NoisyValue:
    """Release ``value`` with discrete Gaussian noise, calibrated to (epsilon, delta) — any epsilon > 0, with the
    exact privacy profile of the discrete Gaussian — or to rho-zCDP.

    Give ``epsilon`` and ``delta``, or ``rho``. Grid and special values as :func:`laplace_mechanism`.

    Raises:
        ValueError: a missing or invalid budget (delta must be in (0, 1)), sensitivity not positive finite.
        Ledger refusals as :func:`laplace_mechanism`.

    Source: Canonne, Kamath, Steinke 2020, Theorem 7 (profile) and Theorem 14 (zCDP); docs/mechanisms.md.
    """
    if rho is None and (epsilon is None or delta is None):
        raise ValueError("gaussian_mechanism needs epsilon and delta (approximate DP), or rho (zCDP)")
    published, described, charge, replayed = _release(
        value, sensitivity=sensitivity, budget=_budget(epsilon, delta, rho), mechanism="discrete_gaussian", grid=grid,
        max_partitions_contributed=None, confidence=confidence, ledger=ledger, account=account, key=key,
    )
    return _scalar(published, described, charge, replayed, confidence)


def vector_release(
    values: Sequence[int | float],
    *,
    sensitivity: int | float | Fraction,
    epsilon: int | float | Fraction | None = None,
    delta: float | Fraction | None = None,
    rho: int | float | Fraction | None = None,
    mechanism: str = "auto",
    max_partitions_contributed: int | None = None,
    grid: int | float | Fraction | None = None,
    confidence: float = 0.95,
    ledger: Ledger | None = None,
    account: str | None = None,
    key: ReleaseKey | None = None,
) -> NoisyVector:
    """Release a vector of k values under one budget for the whole vector.

    One privacy unit changes each value by at most ``sensitivity``, in at most ``max_partitions_contributed``
    values (default: all k). The noise is calibrated to the true sensitivities: L1 = L0 * s for
    ``discrete_laplace``, L2 = sqrt(L0) * s for ``discrete_gaussian`` (exact (epsilon, delta) profile); ``auto``
    (the default) picks the one with the smaller variance at the written budget, or, with a ``ledger``, by the cost
    on the account charged (docs/mechanisms.md). A budget ``{epsilon}`` alone means pure DP (Laplace).

    Raises:
        ValueError: an invalid budget or sensitivity, an empty vector, an unknown mechanism, or no
            ``max_partitions_contributed`` for a vector longer than 10,000 values (the default, all of them, is
            above the spec's limit).
        Ledger refusals as :func:`laplace_mechanism`.
    """
    array = getattr(values, "ndim", None) == 1 and hasattr(values, "tolist")  # a 1-D numpy array: read as is
    if not array and (isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence)):
        raise ValueError(f"values must be a sequence (or 1-D array) of numbers, got {type(values).__name__}")
    if max_partitions_contributed is not None and (
        isinstance(max_partitions_contributed, bool)
        or not isinstance(max_partitions_contributed, int)
        or not 1 <= max_partitions_contributed <= max(len(values), 1)
    ):
        raise ValueError(
            "max_partitions_contributed must be a whole number from 1 to the number of values "
            f"({len(values)}), got {max_partitions_contributed!r}"
        )
    from dp_operators.spec.models import MAX_PARTITIONS_CONTRIBUTED

    if max_partitions_contributed is None and len(values) > MAX_PARTITIONS_CONTRIBUTED:
        raise ValueError(
            f"max_partitions_contributed defaults to the number of values ({len(values):,}), above the limit of "
            f"{MAX_PARTITIONS_CONTRIBUTED:,} values one privacy unit may change; pass max_partitions_contributed=k, "
            "the most values one unit can change (1 for a histogram where each unit falls in one bin)"
        )
    published, described, charge, replayed = _release(
        values if array else list(values), sensitivity=sensitivity, budget=_budget(epsilon, delta, rho),
        mechanism=mechanism, grid=grid, max_partitions_contributed=max_partitions_contributed,
        confidence=confidence, ledger=ledger, account=account, key=key, array=bool(array),
    )
    if "rows_file" in published:  # without a ledger: the published cells (api._release)
        cells = published["rows_file"]
        flags = (cells.side != 0).tolist()
        return NoisyVector(
            values=cells.values().tolist(),
            half_width=None if all(flags) else cells.half_width,
            confidence=confidence,
            mechanism=described,
            charge=charge,
            replayed=replayed,
            saturated=flags,
        )
    rows = published["rows"]
    finite = [row["half_width"] for row in rows if row["half_width"] is not None]
    return NoisyVector(
        values=[row["value"] for row in rows],
        half_width=finite[0] if finite else None,
        confidence=confidence,
        mechanism=described,
        charge=charge,
        replayed=replayed,
        saturated=[bool(row.get("saturated", False)) for row in rows],
    )
