"""Quasi-identifier columns encoded for full-domain generalisation: one integer code per row and hierarchy level.

The contract between the generalisation hierarchies (:mod:`dp_operators.anonymity.generalisation`, which build
these) and the lattice search and loss metrics (:mod:`dp_operators.anonymity.lattice`,
:mod:`dp_operators.anonymity.loss`, which only read them). Everything a search needs is precomputed here once, so
evaluating a lattice node is integer arithmetic on arrays.

Full-domain generalisation (Samarati 2001; LeFevre, DeWitt, Ramakrishnan, "Incognito", SIGMOD 2005): every value of
a quasi-identifier is replaced by its ancestor at one chosen level of the attribute's hierarchy; level 0 is the value
itself and the top level is usually the single value ``*``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EncodedQuasiIdentifier:
    """One quasi-identifier column of an ``n``-row table, encoded at every level of its hierarchy.

    Attributes:
        name: the column name.
        numeric: whether the column holds numbers (then ``spans`` is the interval NCP of each generalised value).
        codes: ``codes[level]`` has shape ``(n,)``, dtype ``int32``, values in ``[0, len(labels[level]))``: the code of
            each row's generalised value at that level. ``codes[0]`` codes the original values; two rows share a code
            at a level exactly when they share the generalised value there.
        labels: ``labels[level][code]`` is the text published for that generalised value (level 0: the value as
            text, integral floats without ``.0``).
        leaf_counts: ``leaf_counts[level][code]`` is the number of distinct original values of the column (values
            present in the table) that the generalised value covers, shape ``(len(labels[level]),)``, int64; all ones
            at level 0.
        spans: ``spans[level][code]`` in ``[0, 1]``: for a numeric column, ``(max - min) / (column max - column
            min)`` over the original values present in the table that the generalised value covers (0 when the
            column has a single value); for a categorical column, ``leaf_counts / domain_size`` where that count is
            above 1, else 0 (Xu et al., KDD 2006). Float64.
        domain_size: number of distinct original values present in the table (``len(labels[0])``).

    Invariants (checked by :meth:`validate`): every level has ``n`` codes; generalisation is a function, so the code
    at level ``i + 1`` is determined by the code at level ``i``; ``leaf_counts`` does not decrease with the level.
    """

    name: str
    numeric: bool
    codes: tuple[np.ndarray, ...]
    labels: tuple[tuple[str, ...], ...]
    leaf_counts: tuple[np.ndarray, ...]
    spans: tuple[np.ndarray, ...]
    domain_size: int

    @property
    def height(self) -> int:
        """The highest level (``len(codes) - 1``); the column's lattice dimension has ``height + 1`` levels."""
        return len(self.codes) - 1

    @property
    def rows(self) -> int:
        return int(self.codes[0].size)

    def parent_codes(self, level: int) -> np.ndarray:
        """``parent[c]`` = the code at ``level + 1`` of the generalised value with code ``c`` at ``level``, shape
        ``(len(labels[level]),)``."""
        parent = np.zeros(len(self.labels[level]), dtype=np.int64)
        parent[self.codes[level]] = self.codes[level + 1]
        return parent

    def validate(self) -> None:
        """Check the invariants above.

        Raises:
            ValueError: a level has the wrong length or out-of-range codes, a code at one level maps to two codes at
                the next, or the per-level arrays have the wrong shapes.
        """
        if not self.codes:
            raise ValueError(f"{self.name}: no levels")
        n = self.rows
        if not (len(self.codes) == len(self.labels) == len(self.leaf_counts) == len(self.spans)):
            raise ValueError(f"{self.name}: codes, labels, leaf_counts and spans must have one entry per level")
        for level, codes in enumerate(self.codes):
            m = len(self.labels[level])
            if codes.shape != (n,):
                raise ValueError(f"{self.name}: level {level} has {codes.size} codes for {n} rows")
            if n and (codes.min() < 0 or codes.max() >= m):
                raise ValueError(f"{self.name}: level {level} has codes outside [0, {m})")
            if self.leaf_counts[level].shape != (m,) or self.spans[level].shape != (m,):
                raise ValueError(f"{self.name}: level {level}: leaf_counts/spans must have one entry per label")
            if level + 1 < len(self.codes):
                parent = self.parent_codes(level)  # last write wins; a second parent shows up as a mismatch
                if not np.array_equal(parent[codes], self.codes[level + 1]):
                    raise ValueError(f"{self.name}: a value at level {level} generalises to two values at level {level + 1}")
        if self.domain_size != len(self.labels[0]):
            raise ValueError(f"{self.name}: domain_size must equal the number of level-0 labels")
