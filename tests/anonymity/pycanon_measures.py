"""Runs INSIDE the pycanon virtual environment (pycanon 1.3.6 and its pinned numpy/pandas), never in the project's.

Usage: ``<pycanon-venv>/bin/python pycanon_measures.py '<json list of {name, path, qis, sa}>'``; prints one JSON
object ``{name: {k, l, entropy_l, t, recursive_c, recursive_l}}`` with pycanon's own results.
"""

from __future__ import annotations

import json
import math
import sys

import pandas as pd
from pycanon import anonymity


def main() -> None:
    datasets = json.loads(sys.argv[1])
    results = {}
    for item in datasets:
        data = pd.read_csv(item["path"])
        qis, sa = item["qis"], [item["sa"]]
        c, l_rec = anonymity.recursive_c_l_diversity(data, qis, sa)
        results[item["name"]] = {
            "k": int(anonymity.k_anonymity(data, qis)),
            "l": int(anonymity.l_diversity(data, qis, sa)),
            "entropy_l": int(anonymity.entropy_l_diversity(data, qis, sa)),
            "t": float(anonymity.t_closeness(data, qis, sa)),
            "recursive_c": None if c is None or (isinstance(c, float) and math.isnan(c)) else float(c),
            "recursive_l": int(l_rec),
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
