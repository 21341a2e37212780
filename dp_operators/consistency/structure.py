"""The public structure of a consistent family: which released aggregates are margins of which, cell by cell.

A *family* is a set of counts (or sums of one measure) over public key domains, one of which, the *base*, groups by
the finest columns; every other *member* groups by a subset of them, each column either one of the base's columns
or a coarser column a declared key hierarchy maps one of them to (age band > age, state > county). Every member
cell is then the sum of a set of base cells, and the sets of one member partition the base cells: the linear
constraints the least-squares step makes the published values satisfy (Hay, Rastogi, Miklau, Suciu, VLDB 2010).

Everything here is a function of public parameters (key domains, hierarchies, noise variances): nothing reads data.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np


_F = TypeVar("_F", bound=Callable)


def one_blas_thread(function: _F) -> _F:
    """Run ``function`` with BLAS limited to one thread (threadpoolctl). The solvers' BLAS calls are vector
    operations of 10^5 elements, for which OpenBLAS's threads cost more than they give: on the 2-core development
    machine under load, the non-negative fit of a 10^5-cell table took 22 s with the default threads and 2.1 s
    with one (benchmarks/consistency.py)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):  # noqa: ANN202
        with _blas_controller().limit(limits=1, user_api="blas"):
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@functools.cache
def _blas_controller():  # noqa: ANN202
    # One scan of the process's loaded libraries, made at the first solve (numpy's and scipy's BLAS are loaded by
    # then): threadpool_limits() rescans /proc/self/maps at every call, about 120 us, which was 40 % of a
    # simulation of thousands of small releases; ThreadpoolController.limit reuses the scan (about 4 us).
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@dataclass(frozen=True)
class Member:
    """One aggregate of a family.

    Attributes:
        name: the aggregate's name.
        cells: number of its cells (its public key domain's size, in release order).
        to_base: int64 array of shape (base cells,): for every base cell, the index of this member's cell that
            contains it (``arange`` for the base itself).
        variance: the variance of the noise on one cell, value units squared (the exact variance of the discrete
            Laplace or discrete Gaussian law, times grid^2).
        mechanism: ``discrete_laplace`` or ``discrete_gaussian``.
        bias: a bound on the deterministic error of one cell before noise, value units (half a grid step for a sum
            rounded to its grid, plus a binary64 summation allowance; 0 for a count).
        kept_axes: the base axes this member keeps, when it is a plain margin (no hierarchy): a sorted tuple of
            indexes into the base's columns. None when a hierarchy maps one of its columns.
    """

    name: str
    cells: int
    to_base: np.ndarray
    variance: float
    mechanism: str
    bias: float = 0.0
    kept_axes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Family:
    """A family of aggregates made consistent together; ``members[0]`` is the base.

    Attributes:
        members: the base first, then the margins in spec order.
        base_shape: the sizes of the base's key lists, in its ``group_by`` order (cells in row-major order, the
            last column fastest, as :class:`~dp_operators.release.inputs.KeyDomain` numbers them).
        grid: the value grid shared by every member (1 for counts).
    """

    members: tuple[Member, ...]
    base_shape: tuple[int, ...]
    grid: float = 1.0
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(member.name for member in self.members))

    @property
    def base(self) -> Member:
        return self.members[0]

    @property
    def base_cells(self) -> int:
        return self.base.cells

    @property
    def product(self) -> bool:
        """True when every member is a plain margin of the base (no hierarchy): the closed forms apply."""
        return all(member.kept_axes is not None for member in self.members)

    def margin(self, member: Member, base_values: np.ndarray) -> np.ndarray:
        """The member's cells as sums of base values (float64 array of shape (member.cells,))."""
        return np.bincount(member.to_base, weights=base_values, minlength=member.cells)


def base_codes(base_shape: Sequence[int]) -> list[np.ndarray]:
    """Per base column, the index into its key list of every base cell (int64 arrays of shape (base cells,))."""
    n = math.prod(base_shape)
    cells = np.arange(n, dtype=np.int64)
    codes = []
    stride = n
    for size in base_shape:
        stride //= size
        codes.append((cells // stride) % size)
    return codes


def member_to_base(
    base_columns: Sequence[str],
    base_keys: Mapping[str, Sequence],
    member_columns: Sequence[str],
    member_keys: Mapping[str, Sequence],
    parents: Mapping[str, tuple[str, Mapping]],
    codes: Sequence[np.ndarray] | None = None,
) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """For every base cell, the index of the member cell containing it; and the kept base axes if no hierarchy
    is used.

    Args:
        base_columns, base_keys: the base's ``group_by`` and its key lists.
        member_columns, member_keys: the member's.
        parents: for a coarser column, ``(finer column, {finer key: coarser key})``: the declared hierarchies.
        codes: :func:`base_codes` of the base (computed when not given).

    Raises:
        ValueError: a member column that is neither a base column nor reached from one by the hierarchies, or a
            key the base or the hierarchy does not map (the spec validation gives the user-facing message).
    """
    shape = tuple(len(base_keys[c]) for c in base_columns)
    if codes is None:
        codes = base_codes(shape)
    index = np.zeros(math.prod(shape), dtype=np.int64)
    kept: list[int] | None = []
    for column in member_columns:
        position = {v: i for i, v in enumerate(member_keys[column])}
        chain = [column]
        while chain[-1] not in base_columns:
            if chain[-1] not in parents:
                raise ValueError(f"column {column!r} is not a base column and no hierarchy maps a base column to it")
            chain.append(parents[chain[-1]][0])
            if len(chain) > 64:
                raise ValueError(f"the hierarchies above {column!r} form a cycle")
        base_column = chain[-1]
        axis = list(base_columns).index(base_column)
        # each base key, mapped up the chain to this member column's key, then to its position
        mapped = []
        for key in base_keys[base_column]:
            value = key
            for coarser in reversed(chain[:-1]):
                value = parents[coarser][1][value]
            mapped.append(position[value])
        lookup = np.asarray(mapped, dtype=np.int64)
        index = index * len(member_keys[column]) + lookup[codes[axis]]
        if kept is not None:
            if len(chain) == 1:
                kept.append(axis)
            else:
                kept = None
    if kept is not None and kept != sorted(kept):
        # a margin listing its columns in another order than the base is still a plain margin; the closed forms
        # use the set of axes and the cell index computed above
        kept = sorted(kept)
    return index, (tuple(kept) if kept is not None else None)
