"""The flat table of a published release: one row per released value, the one shape the CSV, the Parquet file and
the SQL table share (:mod:`dp_operators.operators.sinks`, :mod:`dp_operators.operators.sql_sink`).

A function of the ``output`` dict :func:`dp_operators.release.run_release` returns, and of nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dp_operators.release.publish import published_interval

class NotInlineError(ValueError):
    """A release whose rows are in rows files cannot be given as row dicts (the CSV file, the SQL sink)."""


#: The columns of :func:`release_rows`, the CSV and the Parquet file, in this order.
COLUMNS = ("aggregate", "kind", "key", "value", "half_width", "confidence", "mechanism", "saturated", "lower", "upper")


def release_rows(output: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The flat table of a published release: one dict per released value, with the keys :data:`COLUMNS`.

    * ``aggregate``, ``kind``, ``mechanism``: the aggregate's name, kind and mechanism, as published;
    * ``key``: the row's ``group_by`` columns and values as a compact JSON object, in ``group_by`` order
      (``{"education":"Bachelors","sex":"Female"}``; ``{}`` for an ungrouped aggregate): unambiguous, so NULL
      and ``"None"``, ``1`` and ``"1"``, and values holding ``;``, ``=`` or NUL stay distinct keys;
    * ``value``: the noised value (``int`` for counts and integer sums, else ``float``), in the aggregate's units;
    * ``half_width``: half-width of the confidence interval (``float``), ``None`` for a saturated value;
    * ``confidence``: the interval's confidence level (the release's, e.g. 0.95);
    * ``saturated``: ``True`` when the value is at the noise range's limit (docs/mechanisms.md, "Saturation");
    * ``lower``, ``upper``: the interval's ends (``value -+ half_width`` rounded outwards to floats); ``None`` on
      the unbounded side of a saturated value.

    A quantile or median row (its ``key`` holds ``quantile``) has its value interval's ends and ``half_width``
    (the noised CDF's), or ``None`` for all three and ``saturated`` false when the exponential mechanism released it:
    its guarantee is then in ranks, the ``rank_half_width`` of the JSON output (docs/mechanisms.md).

    Order: aggregates sorted by name (whatever the dict's insertion order: a replay returns the ledger's canonical
    JSON, whose key order may differ from the first run's), then rows in the output's order. A grouped aggregate
    whose partition selection released no key has no row.

    Raises:
        KeyError: ``output`` is not a published release (no ``aggregates``, ``confidence``...).
        NotInlineError: an aggregate's rows are in a rows file (a release of more than ``inline_rows_limit`` cells):
            read that Parquet file (``sinks.release_table`` does) instead of building millions of dicts.
    """
    rows = []
    fragments: dict[tuple, str] = {}  # (column, type, value) -> '"column":value' as json.dumps writes it

    def key_text(row: Mapping[str, Any], group_by: list[str]) -> str:
        parts = []
        for column in group_by:
            value = row[column]
            memo = (column, type(value), value)
            text = fragments.get(memo)
            if text is None:
                text = fragments[memo] = (json.dumps(column, ensure_ascii=False) + ":"
                                          + json.dumps(value, ensure_ascii=False))
            parts.append(text)
        return "{" + ",".join(parts) + "}"

    for name in sorted(output["aggregates"]):
        aggregate = output["aggregates"][name]
        if "rows_file" in aggregate:
            raise NotInlineError(
                f"aggregate {name!r} is stored as a rows file ({aggregate['rows_file']['uri']}), not as rows: only the "
                "Parquet sink and the JSON header publish it; read the file with pyarrow"
            )
        group_by = aggregate["group_by"]
        for row in aggregate["rows"] if "rows" in aggregate else [aggregate]:
            lower, upper = published_interval(row)
            rows.append({
                "aggregate": name,
                "kind": aggregate["kind"],
                "key": key_text(row, group_by),  # json.dumps(..., ensure_ascii=False, separators=(",", ":"))
                "value": row["value"],
                "half_width": row["half_width"],
                "confidence": output["confidence"],
                "mechanism": aggregate["mechanism"],
                "saturated": bool(row.get("saturated")),
                "lower": lower,
                "upper": upper,
            })
    return rows
