"""Consistent families of a spec (``postprocess.consistent``): which aggregates are margins of which.

Public parameters only. :func:`consistent_families` resolves and checks them when a spec is loaded, so a family that
cannot be made consistent is refused with the aggregate and the reason before anything is planned or charged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from dp_operators.spec.models import Aggregate, ReleaseSpec

#: The most columns a family's base may group by: the closed-form accuracy works on 2^columns x 2^columns
#: matrices (8 MB at 10 columns, 2.7 GB at 14), computed before any budget is reserved.
MAX_BASE_COLUMNS = 10
#: ``integer: true`` solves a 0-1 program over the base cells after the charge: seconds at 10^5 cells, over ten
#: minutes at 10^6 (review), so it is refused at load above this size.
MAX_INTEGER_BASE_CELLS = 200_000
#: Key hierarchies make the closed-form variances inapplicable; the exact variances are then computed with dense
#: linear algebra over the base cells, at most this many (docs/consistency.md). A larger family with a hierarchy is
#: still made consistent, with the noise's own variance as a (valid, unshrunk) bound for its intervals; a sum family
#: needs the exact computation for its rounding allowance and is refused above it.
DENSE_BASE_CELLS = 4096


@dataclass(frozen=True)
class FamilyLayout:
    """One consistent family.

    Attributes:
        members: aggregate names, the base (finest) first, then the others in spec order.
        parents: for every coarser column a member uses, ``(finer column, {finer key: coarser key})`` (keys as written: ``1`` and ``'1'`` differ).
    """

    members: tuple[str, ...]
    parents: Mapping[str, tuple[str, Mapping[str, object]]]

    @property
    def base(self) -> str:
        return self.members[0]


def chain_to_base(column: str, base_columns: Sequence[str],
                  parents: Mapping[str, tuple[str, Mapping]]) -> list[str] | None:
    """``column`` followed by the finer columns the hierarchies map to it, down to the first of
    ``base_columns``; None when no chain reaches one."""
    chain = [column]
    while chain[-1] not in base_columns:
        if chain[-1] not in parents or len(chain) > len(parents):
            return None
        chain.append(parents[chain[-1]][0])
    return chain


def _covers(base: Aggregate, member: Aggregate, parents: Mapping[str, tuple[str, Mapping]]) -> bool:
    return all(chain_to_base(c, base.group_by, parents) is not None for c in member.group_by)


def _check_member(base: Aggregate, member: Aggregate, parents: Mapping[str, tuple[str, Mapping]]) -> None:
    base_keys = {c: set(base.keys[c]) for c in base.group_by}  # type: ignore[index]
    for column in member.group_by:
        chain = chain_to_base(column, base.group_by, parents)
        if chain is None:
            raise ValueError(
                f"aggregate {member.name!r} groups by {column!r}, which the family's base {base.name!r} does not "
                f"group by (nor a finer column a hierarchy maps to it): add {column!r} to the base's group_by, or "
                "declare a hierarchy"
            )
        keys = set(member.keys[column])  # type: ignore[index]
        if len(chain) == 1:
            if keys != base_keys[column]:
                missing = sorted(map(repr, base_keys[column] - keys))[:3]
                extra = sorted(map(repr, keys - base_keys[column]))[:3]
                raise ValueError(
                    f"aggregate {member.name!r} lists other {column!r} keys than the base {base.name!r} "
                    f"(missing {', '.join(missing) or 'none'}; not in the base: {', '.join(extra) or 'none'}): a "
                    "margin's cells are sums of the base's, so both list the same keys (1 and '1' differ)"
                )
            continue
        # level by level up the chain: the keys reached at the finer level are exactly the children the hierarchy
        # gives the coarser keys reached (a child the base lacks would leave its parent's true total outside the
        # sum of the base's cells), and the member lists exactly the keys reached at its own level
        level = base_keys[chain[-1]]
        for coarser in reversed(chain[:-1]):
            finer, child_to_parent = parents[coarser]
            unplaced = sorted(map(repr, (k for k in level if k not in child_to_parent)))
            if unplaced:
                raise ValueError(
                    f"the hierarchy {coarser!r} > {finer!r} places no parent for the {finer!r} key(s) "
                    f"{', '.join(unplaced[:3])} that the family's base {base.name!r} lists: every base key needs a "
                    "parent"
                )
            reached = {child_to_parent[k] for k in level}
            children = {k for k, parent in child_to_parent.items() if parent in reached}
            absent = sorted(map(repr, children - level))
            if absent:
                raise ValueError(
                    f"the hierarchy {coarser!r} > {finer!r} puts {finer!r} key(s) {', '.join(absent[:3])} under "
                    f"parents the family releases, but the base {base.name!r} does not list them: those parents' "
                    f"totals would include people the base's cells leave out; add the key(s) to the base's keys or "
                    "remove them from the hierarchy"
                )
            level = reached
        if level != keys:
            raise ValueError(
                f"aggregate {member.name!r} lists {column!r} keys "
                f"{', '.join(sorted(map(repr, keys - level))[:3]) or 'none'} no base key maps to, and misses "
                f"{', '.join(sorted(map(repr, level - keys))[:3]) or 'none'}: its keys must be exactly the parents of "
                "the base's keys"
            )


def _same_measure(base: Aggregate, member: Aggregate, spec: ReleaseSpec) -> None:
    if member.kind != base.kind:
        raise ValueError(f"aggregates {base.name!r} ({base.kind}) and {member.name!r} ({member.kind}) are of "
                         "different kinds: a family adds up one count or one sum")
    if member.kind == "sum" and (tuple(member.bounds) != tuple(base.bounds) or member.grid != base.grid  # type: ignore[arg-type]
                                 or member.upstream != base.upstream):
        raise ValueError(f"sums {base.name!r} and {member.name!r} differ in bounds, grid or upstream arithmetic: "
                         "the members of a family sum the same clipped measure")


def consistent_families(spec: ReleaseSpec) -> list[FamilyLayout]:
    """The families of ``spec.postprocess.consistent`` (empty when off).

    ``true``: every count over public keys, one family. A list: each entry's names, one family each.

    Raises:
        ValueError: naming the aggregate and the fix: an unknown or repeated name; a mean, variance or partition
            selection; members of different kinds or measures; no member grouping by every column (the base); keys
            that differ from the base's; a hierarchy that misses a key; ``integer`` with a grid other than 1; a sum
            family with a hierarchy beyond :data:`DENSE_BASE_CELLS` base cells.
    """
    post = spec.postprocess
    if not post.consistent:
        return []
    by_name = {a.name: a for a in spec.aggregates}
    if post.consistent is True:
        groups = [[a.name for a in spec.aggregates if a.kind == "count" and a.public_keys]]
        if len(groups[0]) < 2:
            raise ValueError(
                "consistent: true makes the counts over public keys add up, but the spec has "
                f"{len(groups[0])}; list families explicitly for sums"
            )
    else:
        groups = post.consistent
    parents = {h.parent: (h.child, h.child_to_parent()) for h in post.hierarchies}
    grouped = {c for a in spec.aggregates for c in a.group_by}
    # a column between two hierarchies of a chain (state in county > state > region) need not be grouped by
    linking = {h.parent for h in post.hierarchies} & {h.child for h in post.hierarchies}
    for index, hierarchy in enumerate(post.hierarchies):
        for role in ("parent", "child"):
            column = getattr(hierarchy, role)
            if column not in grouped and column not in linking:
                raise ValueError(
                    f"hierarchies[{index}] ({hierarchy.parent!r} > {hierarchy.child!r}): no aggregate groups by its "
                    f"{role} column {column!r}; the columns grouped by are {sorted(grouped)}"
                )
    seen: set[str] = set()
    layouts = []
    for names in groups:
        if len(names) < 2:
            raise ValueError(f"a family needs at least two aggregates (a table and a margin), got {names}")
        for name in names:
            if name not in by_name:
                raise ValueError(f"unknown aggregate {name!r} in postprocess.consistent; known: {sorted(by_name)}")
            if name in seen:
                raise ValueError(f"aggregate {name!r} is in two families (or twice in one)")
            seen.add(name)
            aggregate = by_name[name]
            if aggregate.kind not in ("count", "sum"):
                raise ValueError(f"aggregate {name!r} is a {aggregate.kind}: only counts and sums add up "
                                 "(release its sum and count as members instead)")
            if not aggregate.public_keys:
                raise ValueError(f"aggregate {name!r} uses partition_selection: its keys depend on the data, so "
                                 "its cells cannot be matched to margins; give public keys")
        members = [by_name[n] for n in names]
        bases = [m for m in members if all(_covers(m, other, parents) for other in members)]
        if not bases:
            raise ValueError(
                f"no aggregate of the family {names} groups by every column the others use (or a finer column a "
                "hierarchy maps to theirs): add that table (e.g. counts by all the columns) as an aggregate; it is "
                "the base the margins sum. If some of these counts are not margins of one table, list the families "
                "instead: consistent: [[table, margin, ...], [other table, ...]]"
            )
        base = max(bases, key=lambda m: m.partition_count)
        if len(base.group_by) > MAX_BASE_COLUMNS:
            raise ValueError(
                f"the family's base {base.name!r} groups by {len(base.group_by)} columns; at most {MAX_BASE_COLUMNS} "
                "are supported (the exact variances grow as 4^columns): split the table into families over fewer "
                "columns"
            )
        for member in members:
            _same_measure(base, member, spec)
            if member is not base:
                _check_member(base, member, parents)
        if post.integer and base.partition_count > MAX_INTEGER_BASE_CELLS:
            raise ValueError(
                f"integer: true rounds the base with an integer program, limited to {MAX_INTEGER_BASE_CELLS:,} base "
                f"cells (a 10^6-cell table takes over ten minutes); {base.name!r} has {base.partition_count:,}: drop "
                "integer (least squares alone publishes exactly adding floats) or split the table"
            )
        if post.integer and base.grid != 1:
            raise ValueError(f"integer: true rounds to whole numbers, but {base.name!r} has grid {base.grid}; use "
                             "grid 1 or drop integer")
        if base.kind == "sum" and any(chain_to_base(c, base.group_by, parents) != [c]
                                       for m in members for c in m.group_by) \
                and base.partition_count > DENSE_BASE_CELLS:
            raise ValueError(f"a sum family with a key hierarchy is limited to {DENSE_BASE_CELLS} base cells (its "
                             f"rounding allowance is computed exactly), {base.name!r} has {base.partition_count}")
        used: dict[str, tuple[str, Mapping[str, object]]] = {}
        for member in members:
            for column in member.group_by:
                for coarser in (chain_to_base(column, base.group_by, parents) or [])[:-1]:
                    used[coarser] = parents[coarser]
        layouts.append(FamilyLayout(members=(base.name, *[m.name for m in members if m is not base]), parents=used))
    return layouts


def family_of(layouts: Sequence[FamilyLayout], name: str) -> FamilyLayout | None:
    """The family holding aggregate ``name``, or None."""
    return next((layout for layout in layouts if name in layout.members), None)
