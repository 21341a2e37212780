"""Generalisation hierarchies over categorical values (a tree whose leaves are the attribute's values).

Used for the hierarchical ground distance of t-closeness (Li, Li, Venkatasubramanian, "t-Closeness: Privacy Beyond
k-Anonymity and l-Diversity", ICDE 2007, section 4.2): the distance between two leaves is
``level(v_i, v_j) / H``, where ``H`` is the height of the tree and ``level`` the height of their lowest common
ancestor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dp_operators.anonymity.errors import AnonymityInputError

IMPLICIT_ROOT = "*"


@dataclass(frozen=True)
class ValueHierarchy:
    """A rooted tree over categorical values, stored flat.

    Attributes:
        leaves: leaf labels (the attribute's values, as strings), shape ``(m,)``.
        nodes: every node label, leaves first (``nodes[:m] == leaves``), shape ``(n_nodes,)``.
        parent: index of each node's parent in ``nodes``, ``-1`` for the root, shape ``(n_nodes,)``.
        depth: depth of each node (root 0), shape ``(n_nodes,)``.
        height: ``H``, the largest leaf depth (>= 1).

    Build one with :meth:`from_mapping`.
    """

    leaves: tuple[str, ...]
    nodes: tuple[str, ...]
    parent: tuple[int, ...]
    depth: tuple[int, ...]
    height: int

    @classmethod
    def from_mapping(cls, tree: Mapping[str, object] | Sequence[object]) -> ValueHierarchy:
        """Build a hierarchy from nested mappings whose innermost values are lists of leaves.

        ``{"Digestive": {"Stomach": ["gastritis", "gastric ulcer"], "Colon": ["colitis"]}}`` has root
        ``Digestive``. A mapping with several top-level keys (or a bare list of leaves) gets an implicit root ``*``.
        Leaves are compared with the data as strings.

        Raises:
            ValueError: a leaf appears twice, a node has no children, or the tree has no leaves.
        """
        if isinstance(tree, Mapping) and len(tree) == 1:
            ((root_label, children),) = tree.items()
            root_label = str(root_label)
        else:
            root_label, children = IMPLICIT_ROOT, tree

        labels: list[str] = [root_label]
        parents: list[int] = [-1]
        depths: list[int] = [0]
        is_leaf: list[bool] = [False]

        def add_children(node: int, subtree: object) -> None:
            if isinstance(subtree, Mapping):
                items = list(subtree.items())
            elif isinstance(subtree, Sequence) and not isinstance(subtree, str):
                items = [(leaf, None) for leaf in subtree]
            else:
                raise ValueError(f"node {labels[node]!r}: children must be a mapping or a list of leaves")
            if not items:
                raise ValueError(f"node {labels[node]!r} has no children")
            for label, grandchildren in items:
                labels.append(str(label))
                parents.append(node)
                depths.append(depths[node] + 1)
                is_leaf.append(grandchildren is None)
                if grandchildren is not None:
                    add_children(len(labels) - 1, grandchildren)

        add_children(0, children)
        leaf_labels = [label for label, leaf in zip(labels, is_leaf) if leaf]
        duplicates = sorted({label for label in leaf_labels if leaf_labels.count(label) > 1})
        if duplicates:
            raise ValueError(f"leaves appear more than once: {duplicates}")
        # Reorder so that leaves come first: the EMD code indexes leaves 0..m-1.
        order = [i for i, leaf in enumerate(is_leaf) if leaf] + [i for i, leaf in enumerate(is_leaf) if not leaf]
        new_index = {old: new for new, old in enumerate(order)}
        return cls(
            leaves=tuple(leaf_labels),
            nodes=tuple(labels[i] for i in order),
            parent=tuple(new_index[parents[i]] if parents[i] >= 0 else -1 for i in order),
            depth=tuple(depths[i] for i in order),
            height=max(depths[i] for i in order if is_leaf[i]),
        )

    def leaf_codes(self, values: Sequence[object], column: str) -> np.ndarray:
        """Map values to leaf indices, shape ``(n,)``.

        Raises:
            AnonymityInputError: a value is not a leaf of the hierarchy (the message names the column and counts
                the unknown values, without quoting them: they may be row contents).
        """
        index = {leaf: i for i, leaf in enumerate(self.leaves)}
        codes = np.fromiter((index.get(str(v), -1) for v in values), dtype=np.intp, count=len(values))
        missing = int(np.count_nonzero(codes < 0))
        if missing:
            raise AnonymityInputError(
                f"column {column!r}: {missing} value(s) are not leaves of the declared hierarchy; "
                "add every value of the column as a leaf"
            )
        return codes

    def descendant_matrix(self) -> np.ndarray:
        """``A[i, j] = 1`` when leaf ``i`` lies in the subtree of node ``j`` (a leaf is in its own subtree).

        Shape ``(m, n_nodes)``, float.
        """
        m = len(self.leaves)
        matrix = np.zeros((m, len(self.nodes)))
        for leaf in range(m):
            node = leaf
            while node >= 0:
                matrix[leaf, node] = 1.0
                node = self.parent[node]
        return matrix
