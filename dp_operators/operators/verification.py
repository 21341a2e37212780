"""Check published release files against the ledger, the authority on what was released (``dpctl release verify``).

Anyone who can write to the storage a release is published to can overwrite its files; the ledger's committed output
(:meth:`dp_operators.ledger.Ledger.stored_output`, authenticated by ``dpctl ledger verify``) cannot be changed
unseen. :func:`verify_published` compares every release file under a folder with what the sinks
(:mod:`~dp_operators.operators.sinks`) write for the committed output of its release key:

* ``<stem>.json``: parses, equals the committed output, and its bytes are :func:`~.sinks.release_json` of it;
  every rows file it names (``<stem>~rows/``, a release of more than ``inline_rows_limit`` cells) holds the bytes
  whose SHA-256 the ledger recorded;
* ``<stem>.csv``: its bytes are :func:`~.sinks.release_csv` of it;
* ``<stem>.parquet``: its bytes are :func:`~.sinks.release_parquet` of it, or (a file another pyarrow version wrote,
  which :func:`~.sinks.write_files` leaves in place) it holds the same table, which the verdict says; or (a file
  written before published values were typed, its ``value`` a double) every value of it equals the committed
  table's exactly: numbers are compared as exact rationals, never through doubles, so an integer above 2^53
  rounded on its way to the file differs;
* the path is the one :mod:`~dp_operators.operators.locations` gives the key under the output root, so a file copied
  into another DAG's, run's or release's folder is caught. The root is given, or inferred: a folder ``B`` is an
  output root when a release JSON lies at ``B/<its own release, encoded>/<dag>/<run>/<file>``; every file is then
  held to the layout under the innermost such ``B`` above it (so folders of an operator expanded over ``output_uri``
  verify together from their parent; give ``--output-uri`` to hold every file to one root). A file under no known
  root has its path unchecked (said so).

The release key of ``<stem>.*`` is the JSON's ``release_key``; without a readable JSON, the one its path encodes
(under a known root). Diagnostics reports (``<stem>~diagnostics.json``) hold true aggregates: they are skipped,
never read. Verdicts name where a file differs (a field path, a line, a row), never a value.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from airflow.sdk import ObjectStoragePath

from dp_operators.ledger import AmbiguousReleaseKeyError, ReleaseKey
from dp_operators.ledger.store import published_form
from dp_operators.operators.locations import SEPARATOR, encode_component, key_of, release_file, storage_path_of
from dp_operators.operators.sinks import (
    FORMATS,
    ObjectStorageRowsStore,
    release_csv,
    release_json,
    release_parquet,
    release_table_with_doubles,
)
from dp_operators.operators.flat_rows import COLUMNS
from dp_operators.release.rows_file import ROWS_SUFFIX, RowsFileError, check_rows_files
from dp_operators.release.value_types import published_fraction

#: Verdicts, from the one that passes to those that do not.
MATCHES = "matches"
DIFFERS = "differs"
NOT_IN_LEDGER = "not in the ledger"
NOT_A_RELEASE = "not a release"
UNREADABLE = "unreadable"

_DIAGNOSTICS_SUFFIX = f"{SEPARATOR}diagnostics.json"
_KEY_FIELDS = {"dag_id": str, "run_id": str, "task_id": str, "map_index": int, "release_name": str}


@dataclass(frozen=True)
class FileVerdict:
    """The verdict on one published file.

    Attributes:
        file: the file's URI (``file:///...`` for a local file).
        fmt: ``json``, ``csv`` or ``parquet``.
        key: the release key it was checked against, or ``None`` when none could be read.
        verdict: :data:`MATCHES`, :data:`DIFFERS`, :data:`NOT_IN_LEDGER`, :data:`NOT_A_RELEASE` or
            :data:`UNREADABLE`.
        problems: why it does not match, one sentence each (empty when it matches).
        notes: what a matching verdict rests on (a Parquet file matched by content; the path not checked).
        path_checked: whether the path was compared with the key's location.
    """

    file: str
    fmt: str
    key: ReleaseKey | None
    verdict: str
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    path_checked: bool = False

    @property
    def matches(self) -> bool:
        return self.verdict == MATCHES

    def as_dict(self) -> dict[str, Any]:
        """One JSON object: ``file``, ``format``, ``release_key`` (object or null), ``verdict``, ``matches``,
        ``problems``, ``notes``, ``path_checked``."""
        return {
            "file": self.file, "format": self.fmt, "release_key": None if self.key is None else self.key.as_dict(),
            "verdict": self.verdict, "matches": self.matches, "problems": list(self.problems),
            "notes": list(self.notes), "path_checked": self.path_checked,
        }


def storage_path(location: str) -> ObjectStoragePath:
    """``location`` as an :class:`ObjectStoragePath`: a URI as it is, a local path made absolute as ``file://``
    (so that paths and output roots compare as the same strings)."""
    if "://" in location:
        return ObjectStoragePath(location)
    # not Path.as_uri(): it would percent-encode the "%" of encoded components, which ObjectStoragePath keeps as is
    return ObjectStoragePath(f"file://{Path(location).expanduser().resolve()}")


def located_path(location: str) -> ObjectStoragePath:
    """What ``dpctl release verify`` reads at ``location``: a local path as :func:`storage_path` takes it; a URI as a
    release publishes it (:func:`~dp_operators.operators.locations.storage_path_of`: its path percent-decoded once).
    A URI whose decoded path does not exist while its text taken as a path does is read that way: a location
    published before locations were valid URIs (its folders' ``%3A`` raw), or an ``output_uri`` as the operator was
    given it (which ``ObjectStoragePath`` takes literally)."""
    literal = storage_path(location)
    if "://" not in location:
        return literal
    try:
        decoded = storage_path_of(location)
    except ValueError:
        return literal
    return literal if not decoded.exists() and literal.exists() else decoded


def release_files(path: ObjectStoragePath) -> list[ObjectStoragePath]:
    """The release files at or under ``path``, sorted: ``*.json``, ``*.csv``, ``*.parquet``, without diagnostics
    reports and hidden (temporary) files. A file ``path`` brings its siblings of the same stem.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    if path.is_file():
        stem = _stem(path.name)
        found = [p for p in path.parent.iterdir() if _is_release_file(p.name) and _stem(p.name) == stem]
        return sorted(found or [path], key=str)
    if not path.exists():
        raise FileNotFoundError(str(path))
    found = [folder / name for folder, _, names in path.walk() for name in names
             if _is_release_file(name) and not folder.name.endswith(ROWS_SUFFIX)]  # (no encoded id holds "~")
    return sorted(found, key=str)


def verify_published(
    files: Iterable[ObjectStoragePath],
    stored_output: Callable[[ReleaseKey, str | None], Mapping[str, Any] | None],
    output_uri: str | None = None,
) -> list[FileVerdict]:
    """The verdict on each of ``files`` (from :func:`release_files`), in order.

    Args:
        files: release files; those sharing a folder and stem are one release.
        stored_output: the ledger's committed output of a key on an account (``None``: any one account), or
            ``None`` (``Ledger.stored_output``); called once per key, with the ``budget_account`` the release's JSON
            states (a key committed on several accounts, each team's own, is never matched against another's).
        output_uri: the output root the files were published under; ``None`` to infer it (module docstring).

    Raises:
        whatever ``stored_output`` raises (the ledger is unreadable).
    """
    groups: dict[tuple[str, str], list[ObjectStoragePath]] = {}
    for path in files:
        groups.setdefault((str(path.parent), _stem(path.name)), []).append(path)
    # the JSONs first (their keys place the output roots); the other files one at a time, when checked
    contents = {str(p): _read(p) for group in groups.values() for p in group if _suffix(p.name) == "json"}
    json_keys = {group_id: _json_key(group, contents) for group_id, group in groups.items()}
    roots = [str(storage_path(output_uri)).rstrip("/")] if output_uri else _inferred_roots(groups, json_keys)
    outputs: dict[tuple[ReleaseKey, str | None], Mapping[str, Any] | None] = {}
    ambiguous: dict[tuple[ReleaseKey, str | None], str] = {}
    verdicts = []
    for group_id, group in groups.items():
        json_key, json_problem = json_keys[group_id]
        root = next((r for r in roots if group_id[0].startswith(r + "/")), None)
        key = json_key or _path_key(group[0], root)
        account = _json_account(group, contents)
        if key is not None and (key, account) not in outputs:
            try:
                outputs[key, account] = published_form(stored_output(key, account))
            except AmbiguousReleaseKeyError as error:
                outputs[key, account], ambiguous[key, account] = None, str(error)
        problem_of_key = ambiguous.get((key, account))
        for path in group:
            problem = problem_of_key or _path_problem(path, key, root, given=bool(output_uri))
            verdicts.append(_verdict(
                path, contents.pop(str(path), None) or _read(path), key, outputs.get((key, account)) if key else None,
                json_problem, problem,
                path_checked=root is not None or problem is not None,
            ))
    return sorted(verdicts, key=lambda v: v.file)


def _is_release_file(name: str) -> bool:
    return not name.startswith(".") and not name.endswith(_DIAGNOSTICS_SUFFIX) and _suffix(name) in FORMATS


def _stem(name: str) -> str:
    return name.rpartition(".")[0]


def _suffix(name: str) -> str:
    return name.rpartition(".")[2]


def _read(path: ObjectStoragePath) -> bytes | OSError:
    try:
        return path.read_bytes()
    except OSError as error:
        return error


def _json_account(group: list[ObjectStoragePath], contents: Mapping[str, bytes | OSError]) -> str | None:
    """The ``budget_account`` the group's JSON states, or ``None`` (no JSON, unreadable, or none stated)."""
    json_file = next((p for p in group if _suffix(p.name) == "json"), None)
    data = contents.get(str(json_file)) if json_file is not None else None
    if not isinstance(data, bytes):
        return None
    try:
        release = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    account = release.get("budget_account") if isinstance(release, dict) else None
    return account if isinstance(account, str) else None


def _json_key(group: list[ObjectStoragePath], contents: Mapping[str, bytes | OSError]) -> tuple[ReleaseKey | None,
                                                                                                  str | None]:
    """The release key of the group's JSON, or ``None`` and why (``None`` when the group has no JSON)."""
    json_file = next((p for p in group if _suffix(p.name) == "json"), None)
    if json_file is None:
        return None, None
    data = contents[str(json_file)]
    if isinstance(data, OSError):
        return None, None
    try:
        release = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"not valid JSON ({error})"
    found = release.get("release_key") if isinstance(release, dict) else None
    if not isinstance(found, dict):
        return None, "no release_key object: not a release published by dp-operators"
    wrong = [name for name, kind in _KEY_FIELDS.items()
             if not isinstance(found.get(name), kind) or isinstance(found.get(name), bool) or found.get(name) == ""]
    if wrong:
        return None, f"release_key has no valid {', '.join(wrong)}: not a release published by dp-operators"
    return ReleaseKey(**{name: found[name] for name in _KEY_FIELDS}), None


def _inferred_roots(groups: Mapping[tuple[str, str], list[ObjectStoragePath]],
                    json_keys: Mapping[tuple[str, str], tuple[ReleaseKey | None, str | None]]) -> list[str]:
    """Output roots: ``B`` for each JSON at ``B/<its release, encoded>/<dag>/<run>/<file>``, innermost first."""
    roots = set()
    for group_id, group in groups.items():
        key = json_keys[group_id][0]
        if key is None:
            continue
        release_folder = group[0].parent.parent.parent
        if release_folder.name == encode_component(key.release_name) and release_folder.parent != release_folder:
            roots.add(str(release_folder.parent).rstrip("/"))
    # innermost first: each file is held to the deepest root above it, so releases published to several output
    # folders under one parent (an operator expanded over output_uri) verify together
    return sorted(roots, key=len, reverse=True)


def _path_key(path: ObjectStoragePath, root: str | None) -> ReleaseKey | None:
    """The key ``path`` encodes under ``root``; ``None`` without a root or when it is not a release path."""
    if root is None:
        return None
    try:
        return key_of(path, root)[0]
    except ValueError:
        return None


def _path_problem(path: ObjectStoragePath, key: ReleaseKey | None, root: str | None, *, given: bool) -> str | None:
    """Why ``path`` is not the location of ``key`` under ``root`` (:func:`~.locations.release_file`), or ``None``
    (also when there is no root or no key to compare with)."""
    if root is None:
        return "not under --output-uri" if given else None
    if key is None:
        return None
    try:
        path_key = key_of(path, root)[0]
    except ValueError:
        return f"not at a release path (<release>/<dag_id>/<run_id>/<task>.<format>) under {root}"
    if path_key != key:
        differing = [name for name in _KEY_FIELDS if getattr(key, name) != getattr(path_key, name)]
        return f"path is not its release key's location under {root}: " + ", ".join(
            f"{name} is {getattr(path_key, name)!r} in the path but {getattr(key, name)!r} in the JSON's release_key"
            for name in differing
        )
    expected = str(release_file(root, key, _suffix(path.name)))
    if str(path) != expected:  # the same key, spelt otherwise (an unencoded ":", "%41" for "A"...)
        return f"path is not the one its release key is published at: {expected}"
    return None


def _verdict(path: ObjectStoragePath, data: bytes | OSError, key: ReleaseKey | None,
             output: Mapping[str, Any] | None, json_problem: str | None, path_problem: str | None, *,
             path_checked: bool) -> FileVerdict:
    fmt = _suffix(path.name)
    base = FileVerdict(file=str(path), fmt=fmt, key=key, verdict=MATCHES, path_checked=path_checked)
    if isinstance(data, OSError):
        return replace(base, verdict=UNREADABLE, problems=(f"cannot read: {data.strerror or data}",))
    problems = [json_problem] if fmt == "json" and json_problem else []
    if key is None or problems:
        if not problems:
            problems.append("no readable release JSON beside it names its release key, and it lies under no "
                            "output root to read the key from its path (give --output-uri)")
        return replace(base, verdict=NOT_A_RELEASE, problems=tuple(problems + [path_problem] * bool(path_problem)))
    problems += [path_problem] * bool(path_problem)
    if output is None:
        problems.append("the ledger has no committed output for its release key")
        return replace(base, verdict=NOT_IN_LEDGER, problems=tuple(problems))
    notes = []
    if fmt == "json":
        problems += _json_problems(data, output, path)
    elif fmt == "csv":
        problems += _csv_problems(data, output)
    else:
        found, note = _parquet_problems(data, output, path)
        problems += found
        notes += [note] * bool(note)
    if not path_checked:
        notes.append("path not checked: it lies under no output root (give --output-uri)")
    return replace(base, verdict=DIFFERS if problems else MATCHES, problems=tuple(problems), notes=tuple(notes))


def _json_problems(data: bytes, output: Mapping[str, Any], path: ObjectStoragePath | None = None) -> list[str]:
    expected = release_json(output).encode("utf-8")
    if data == expected:
        if path is not None:  # the rows files it names, beside it, hold the bytes whose SHA-256 it records
            try:
                check_rows_files(dict(output), ObjectStorageRowsStore(path.parent / f"{_stem(path.name)}{ROWS_SUFFIX}"))
            except RowsFileError as error:
                return [str(error)]
        return []
    where = first_difference(json.loads(data.decode("utf-8")), json.loads(expected))
    if where is not None:
        return [f"content differs from the ledger's committed output at {where}"]
    return ["same content as the committed output, but not the bytes published (release_json): rewritten"]


def _csv_problems(data: bytes, output: Mapping[str, Any]) -> list[str]:
    expected = release_csv(output).encode("utf-8")
    if data == expected:
        return []
    found, wanted = data.split(b"\n"), expected.split(b"\n")
    line = next((n for n, (a, b) in enumerate(zip(found, wanted), start=1) if a != b), None)
    if line is not None:
        return [f"line {line} differs from the committed output's CSV (release_csv)"]
    return [f"has {len(found) - 1} lines, the committed output's CSV (release_csv) {len(wanted) - 1}"]


def _parquet_problems(data: bytes, output: Mapping[str, Any], path: ObjectStoragePath | None = None
                      ) -> tuple[list[str], str | None]:
    """Problems of a Parquet file, and the note when it matches by content rather than by bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = None if path is None else ObjectStorageRowsStore(path.parent / f"{_stem(path.name)}{ROWS_SUFFIX}")
    try:  # the rows files are read from copies checked against their committed SHA-256, in their own folder
        expected = release_parquet(output, store)
    except RowsFileError as error:
        return [str(error)], None
    except (pa.ArrowException, OSError) as error:
        return [f"the committed output's rows files cannot be read ({type(error).__name__})"], None
    except ValueError as error:  # a value beyond its column's type (a noise tail event below 2^-127)
        return [f"the committed output's table cannot be built: {error}"], None
    if data == expected:
        return [], None
    try:
        found = pq.ParquetFile(pa.BufferReader(data))
        table = found.read()
    except (pa.ArrowException, OSError) as error:
        return [f"not a readable Parquet file ({type(error).__name__})"], None
    wanted, doubles = release_table_with_doubles(output, store)
    if not (table.schema.equals(wanted.schema, check_metadata=False) and table.equals(wanted)):
        problem = _exact_difference(table, wanted, doubles)
        if problem:
            return [problem], None
        return [], (f"same values as the committed output, exactly, in another schema (value as "
                    f"{table.schema.field('value').type}): written before published values were typed")
    writer = pq.ParquetFile(pa.BufferReader(expected)).metadata.created_by
    if found.metadata.created_by != writer:
        return [], (f"same table as the committed output; bytes differ: written by {found.metadata.created_by!r}, "
                    f"this pyarrow writes {writer!r}")
    return [], "same table as the committed output; bytes differ (not written by release_parquet's settings)"


def _exact_difference(table: Any, wanted: Any, doubles: list[bool]) -> str | None:
    """Where the flat table ``table`` (a published Parquet file) differs from ``wanted`` (:func:`~.sinks.release_table`
    of the committed output), comparing every number exactly whatever the column types (an int as an int, a
    decimal as its exact value, a double as its exact binary value: a count of 2^53 + 1 written through a double
    is 2^53, which differs), or None. A row's value is its ``value``, or its ``float_value`` where ``value`` is null
    (a release mixing counts or sums with means, :func:`~.sinks.parquet_schema`); a file of an older version has
    ``value`` alone, as float64. Where the committed value is itself a double (``doubles``: a JSON float, an older
    rows file), that double matches too where the table holds the fractional grid value it denotes."""
    columns = set(table.column_names)
    if not set(COLUMNS) <= columns <= set(COLUMNS) | {"float_value"}:
        return "its columns differ from the committed output's table (release_table)"
    rows, wanted_rows = table.to_pylist(), wanted.to_pylist()
    for number, (found, expected, double) in enumerate(zip(rows, wanted_rows, doubles)):
        try:
            same = _exact_row(found) == _exact_row(expected)
            if not same and double:  # the committed double itself, where the table holds the decimal it denotes
                value, wanted_value = _row_value(found), _row_value(expected)
                same = type(value) is float and wanted_value is not None and value == float(wanted_value) \
                    and _exact_row({**found, "value": None}) == _exact_row({**expected, "value": None})
        except TypeError:  # a number column holding something else
            same = False
        if not same:
            return f"row {number} differs from the committed output's table (release_table)"
    if len(rows) != len(wanted_rows):
        return f"has {len(rows)} rows, the committed output's table {len(wanted_rows)}"
    return None


_NUMBER_COLUMNS = frozenset({"value", "half_width", "confidence", "lower", "upper"})


def _row_value(row: Mapping[str, Any]) -> Any:
    """A flat-table row's value: its ``value``, or its ``float_value`` where ``value`` is null."""
    return row["value"] if row["value"] is not None else row.get("float_value")


def _exact_row(row: Mapping[str, Any]) -> tuple:
    """A flat-table row as comparable values: numbers as exact rationals, the value as :func:`_row_value` reads it.

    Raises:
        TypeError: a number column holding something else.
    """
    value = _row_value(row)
    return tuple(published_fraction(value if column == "value" else row[column]) if column in _NUMBER_COLUMNS
                 else (type(row[column]), row[column]) for column in COLUMNS)


def first_difference(found: Any, expected: Any, where: str = "") -> str | None:
    """The path of the first place ``found`` differs from ``expected`` (``aggregates.x.rows[3].value``; ``<root>``
    for the whole value), or ``None`` when they are equal, types included (``1`` is not ``1.0`` nor ``true``)."""
    here = where or "<root>"
    if isinstance(expected, dict) and isinstance(found, dict):
        for name in sorted(set(found) | set(expected)):
            if name not in found or name not in expected:
                return f"{where}.{name}".lstrip(".") + (" (missing)" if name not in found else " (added)")
            inner = first_difference(found[name], expected[name], f"{where}.{name}".lstrip("."))
            if inner is not None:
                return inner
        return None
    if isinstance(expected, list) and isinstance(found, list):
        for index, (a, b) in enumerate(zip(found, expected)):
            inner = first_difference(a, b, f"{where}[{index}]")
            if inner is not None:
                return inner
        return None if len(found) == len(expected) else f"{here} (length {len(found)}, committed {len(expected)})"
    return None if type(found) is type(expected) and found == expected else here
