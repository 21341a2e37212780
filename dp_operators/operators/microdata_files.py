"""Microdata files of the anonymity operators (:mod:`dp_operators.operators.anonymity`): reading the source table,
writing the report and the anonymised table, and guarding where they go.

* :func:`read_table` reads the table from a CSV/Parquet file through ``ObjectStoragePath`` or from a SQL query
  through a connection's ``common.sql`` hook, turning every fault a retry cannot cure into ``AnonymityInputError``.
* :func:`write_report` and :func:`write_table` write the report (JSON, keys sorted) and the anonymised table (CSV or
  Parquet). Every file is written whole or not at all, via :func:`dp_operators.operators.sinks.publish_file`;
  :func:`write_report_or_fail` turns a report that can never be written into ``AirflowFailException``.
* Location guards: :func:`refuse_same_static_locations` (when the DAG is parsed) and
  :func:`refuse_same_rendered_locations` / :func:`checked_destinations` (once templates are rendered) refuse an
  output or report at the source's place or at each other's, so the raw microdata are never overwritten.

Imports only the Airflow SDK (``airflow.sdk``, ``airflow.sdk.exceptions``).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook, ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException

from dp_operators.anonymity.errors import AnonymityInputError

if TYPE_CHECKING:
    import pandas as pd

#: File formats by suffix, for the source table and the anonymised table.
TABLE_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}

#: Storage errors that a retry cannot cure (a folder where a file should be, a path through a file, no permission,
#: no such bucket or folder): a report or table that cannot be written for one of these fails the task without retry.
PERMANENT_WRITE_ERRORS = (IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError, FileNotFoundError)


def read_table(
    source: str | ObjectStoragePath | None,
    source_format: str | None = None,
    sql: str | None = None,
    conn_id: str | None = None,
    csv_separator: str = ",",
) -> pd.DataFrame:
    """The microdata table to check or anonymise, shape ``(n, columns)``.

    Args:
        source: a CSV or Parquet file, as a path or any ``ObjectStoragePath`` URL (``file://``, ``s3://`` ...).
        source_format: ``"csv"`` or ``"parquet"``; ``None`` takes it from the suffix (``.csv``, ``.parquet``, ``.pq``).
        sql: a query to run instead, through the ``common.sql`` hook of ``conn_id`` (``get_df``, else
            ``get_pandas_df``).
        conn_id: the connection of ``sql``.
        csv_separator: the field separator of a CSV source, one character (``","``; ``";"`` for the CSV files ARX
            writes, ``"\t"`` for TSV). The first row is the header; ``""``, ``NA``, ``NaN`` ... read as missing.

    Raises:
        AnonymityInputError: the file does not exist, cannot be read (permission, a folder), its URL names no
            storage the worker knows, is not valid CSV / Parquet or not UTF-8, or its format cannot be told from its
            name and none was given. The message names the file and the fix, never a cell. (The operators turn it
            into ``AirflowFailException`` with a report.) Other storage errors (``OSError``: a network fault, a
            throttled bucket) and SQL errors propagate, so Airflow retries them.
    """
    import pandas as pd

    if sql is not None:
        hook = BaseHook.get_connection(conn_id).get_hook()
        if hasattr(hook, "get_df"):
            return hook.get_df(sql, df_type="pandas")
        return hook.get_pandas_df(sql)
    check_csv_separator("read_table", csv_separator)
    try:
        path = _storage_path(source)
    except ValueError as exc:  # an unknown scheme, or one whose filesystem provider is not installed
        raise AnonymityInputError(
            f"the source {source} is not a path or URL the worker can open ({exc}): fix source=, or install the "
            "Airflow provider of its storage"
        ) from exc
    file_format = source_format or TABLE_FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise AnonymityInputError(
            f"cannot tell the format of the source {path}: name it *.csv or *.parquet, or pass source_format="
        )
    try:
        with path.open("rb") as handle:
            if file_format == "csv":
                return pd.read_csv(handle, sep=csv_separator, encoding="utf-8")
            return pd.read_parquet(handle)
    except FileNotFoundError as exc:
        raise AnonymityInputError(
            f"the source {path} does not exist: check source= (a path or ObjectStoragePath URL; relative paths are "
            "resolved against the worker's working directory) or create the file first"
        ) from exc
    except (PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        raise AnonymityInputError(
            f"the source {path} cannot be read ({type(exc).__name__}): point source= at a readable "
            f"{file_format.upper()} file, or give the worker's user read access"
        ) from exc
    except UnicodeDecodeError as exc:
        raise AnonymityInputError(
            f"the source {path} is not UTF-8 text: re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from exc
    except pd.errors.EmptyDataError as exc:
        raise AnonymityInputError(
            f"the source {path} is empty (no header row): write the table with its header"
        ) from exc
    except pd.errors.ParserError as exc:
        raise AnonymityInputError(
            f"the source {path} is not valid CSV with separator {csv_separator!r} ({_parser_position(exc)}): check "
            "csv_separator= and the file's quoting"
        ) from exc
    except (ValueError, TypeError) as exc:
        if file_format != "parquet":
            raise
        raise AnonymityInputError(
            f"the source {path} is not a readable Parquet file ({type(exc).__name__}): check the file, or pass "
            "source_format='csv' if it is CSV"
        ) from exc


def write_report(path: str | ObjectStoragePath, report: Mapping[str, Any]) -> ObjectStoragePath:
    """Write ``report`` as JSON (indent 2, final newline; no NaN) to ``path``, replacing it whole.

    Keys are sorted at every level, as text, except in an object whose keys are all whole numbers written in
    decimal (a class-size histogram ``{"2": 1, "10": 1}``): those are sorted as numbers, ascending.

    Raises:
        ValueError: the report holds NaN or an infinity (it would not be valid JSON).
        OSError: the storage refused the write.
    """
    target = _storage_path(path)
    text = json.dumps(_sorted_keys(report), indent=2, allow_nan=False) + "\n"
    _publish_local(target, lambda local: local.write_text(text, encoding="utf-8"))
    return target


def write_table(path: str | ObjectStoragePath, table: pd.DataFrame, file_format: str) -> ObjectStoragePath:
    """Write an anonymised table to ``path`` as ``"csv"`` (UTF-8, ``\\n`` line ends, header, no index) or
    ``"parquet"`` (snappy, no index), replacing the file whole.

    Text columns (the generalised quasi-identifiers) stay text: a Parquet file reads back as the same frame; a CSV
    file holds the labels as written (a reader may parse a label such as ``17`` as a number).

    Raises:
        ValueError: an unknown format.
        OSError: the storage refused the write.
    """
    if file_format not in ("csv", "parquet"):
        raise ValueError(f"the table format must be 'csv' or 'parquet', got {file_format!r}")
    target = _storage_path(path)
    if file_format == "csv":
        _publish_local(target, lambda local: table.to_csv(local, index=False, lineterminator="\n"))
    else:
        _publish_local(target, lambda local: table.to_parquet(local, index=False, compression="snappy"))
    return target


def write_report_or_fail(path: str | ObjectStoragePath, report: Mapping[str, Any], what: str) -> None:
    """:func:`write_report`, turning a fault a retry cannot cure (a folder, a path through a file, no permission, no
    such bucket, a URL naming no storage the worker knows) into ``AirflowFailException`` naming the path and the fix.
    Other ``OSError`` (a network fault, a throttled bucket) propagate, so that Airflow retries."""
    try:
        write_report(path, report)
    except PERMANENT_WRITE_ERRORS as exc:
        raise AirflowFailException(
            f"{what} {report.get('check')!r} cannot write its report to {path} ({type(exc).__name__}): "
            f"{write_fix(exc, 'report_path')}; nothing was published"
        ) from exc
    except ValueError as exc:
        if "filesystem" not in str(exc).lower():
            raise  # NaN in the report: a bug, not a setting
        raise AirflowFailException(
            f"{what} {report.get('check')!r} cannot write its report to {path}: it is not a path or URL the worker "
            f"can write ({exc}): fix report_path=, or install the Airflow provider of its storage; nothing was "
            "published"
        ) from exc


def write_fix(exc: OSError, argument: str) -> str:
    """How to fix a write that failed with one of :data:`PERMANENT_WRITE_ERRORS`."""
    if isinstance(exc, IsADirectoryError):
        return f"it is a folder: make {argument}= name a file inside it"
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        return f"a part of its path is a file, not a folder: fix {argument}="
    if isinstance(exc, PermissionError):
        return f"the worker may not write there: give its user (or connection) write access, or change {argument}="
    return f"its folder or bucket does not exist: create it, or fix {argument}="


def check_csv_separator(task_id: str, separator: object) -> None:
    if not isinstance(separator, str) or len(separator) != 1 or separator in "\"\r\n":
        raise ValueError(
            f"{task_id}: csv_separator must be one character other than a quote or a line break, such as ',' or "
            f"';', got {separator!r}"
        )


def refuse_same_static_locations(task_id: str, locations: Mapping[str, object]) -> None:
    """At construction: raise ``ValueError`` when two of ``locations`` (argument name to path, URL,
    ``ObjectStoragePath``, templated string or ``None``) are known, as the DAG is parsed, to be the same place.
    Templated strings and anything else not known yet are left to :func:`refuse_same_rendered_locations`."""
    _refuse_same_locations(task_id, {name: _static_location(location) for name, location in locations.items()},
                           ValueError)


def refuse_same_rendered_locations(task_id: str, locations: Mapping[str, object]) -> None:
    """At run time, templates rendered: raise ``AirflowFailException`` when two of ``locations`` (argument name to
    path, URL, ``ObjectStoragePath`` or ``None``) are the same place. A location that names no storage the worker
    knows is left out: reading or writing it fails with its own message."""
    present = {name: location for name, location in locations.items() if location is not None}
    if len(present) < 2:
        return
    resolved = {}
    for name, location in present.items():
        with contextlib.suppress(ValueError):  # a bad URL: read_table or the write says so
            resolved[name] = _storage_path(location)
    _refuse_same_locations(task_id, resolved, AirflowFailException)


def checked_destinations(
    task_id: str, source: object, destinations: Mapping[str, object]
) -> dict[str, ObjectStoragePath | None]:
    """The rendered ``destinations`` (argument name to location, or ``None`` for none) as ``ObjectStoragePath``,
    refused (``AirflowFailException``, before anything is read or written) when a URL names no storage the worker
    knows, when one is the ``source`` or another destination, or when a local one is a folder or lies behind a
    symbolic link."""
    resolved = {
        name: None if location is None else _destination(task_id, name, location)
        for name, location in destinations.items()
    }
    refuse_same_rendered_locations(task_id, {"source": source, **resolved})
    for name, path in resolved.items():
        if path is not None:
            _check_local_destination(task_id, name, path)
    return resolved


def _parser_position(exc: Exception) -> str:
    """Where pandas' CSV parser stopped, from its message (which gives line and field counts, not cells)."""
    import re

    found = re.search(r"line (\d+)", str(exc))
    return f"line {found.group(1)}" if found else "see the file"


def _sorted_keys(value: Any) -> Any:
    """``value`` with every object's keys in order: numerically when they are all decimal whole numbers (class-size
    histograms), else as text."""
    if isinstance(value, Mapping):
        keys = [str(k) for k in value]
        numeric = bool(keys) and all(k.isdecimal() for k in keys)
        order = sorted(keys, key=int) if numeric else sorted(keys)
        items = {str(k): v for k, v in value.items()}
        return {k: _sorted_keys(items[k]) for k in order}
    if isinstance(value, (list, tuple)):
        return [_sorted_keys(v) for v in value]
    return value


def _destination(task_id: str, name: str, location: str | ObjectStoragePath) -> ObjectStoragePath:
    try:
        return _storage_path(location)
    except ValueError as exc:
        raise AirflowFailException(
            f"{task_id}: {name} {location} is not a path or URL the worker can write ({exc}): fix {name}=, or "
            "install the Airflow provider of its storage; nothing was read or published"
        ) from exc


def _check_local_destination(task_id: str, name: str, path: ObjectStoragePath) -> None:
    """A local destination that no retry could write: a folder, or a path behind a symbolic link (which
    :func:`~dp_operators.operators.sinks.publish_file` refuses). Checked before anything is written, so that a
    failed task leaves neither a report nor a table from this run."""
    if not _is_local(path):
        return
    target = Path(path.path)
    if target.is_dir():
        raise AirflowFailException(
            f"{task_id}: {name} {target} is a folder: make {name}= name a file inside it; nothing was published"
        )
    if target.is_symlink() or target.parent.is_symlink():
        raise AirflowFailException(
            f"{task_id}: {name} {target} lies behind a symbolic link, which release files are never written "
            f"through: point {name}= at the real location; nothing was published"
        )


def _is_local(path: ObjectStoragePath) -> bool:
    return path.protocol in ("", "file", "local")


def _static_location(location: object) -> tuple[str, str] | None:
    """Where ``location`` points, when that is known as the DAG is parsed: ``(protocol, normalised path)`` of a
    plain path, URL or ``ObjectStoragePath``; ``None`` for a templated string or anything else (an XComArg)."""
    if isinstance(location, ObjectStoragePath):
        return _location_key(location)
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str) or not location or "{{" in location or "{%" in location:
        return None
    parts = urlsplit(location)
    if len(parts.scheme) <= 1 or parts.scheme.lower() in ("file", "local"):  # a path (or a drive letter), file://
        return ("file", os.path.realpath(parts.path if len(parts.scheme) > 1 else location))
    host = parts.netloc.rpartition("@")[2]  # the connection id before '@' names credentials, not a place
    return (parts.scheme.lower(), _normalised(f"{host}/{parts.path}"))


def _location_key(path: ObjectStoragePath) -> tuple[str, str]:
    """``(protocol, normalised path)`` of a resolved location; local paths made absolute, symbolic links followed."""
    if _is_local(path):
        return ("file", os.path.realpath(path.path))
    return (path.protocol, _normalised(path.path))


def _normalised(path: str) -> str:
    return posixpath.normpath("/" + path.strip("/")).strip("/")


def _refuse_same_locations(task_id: str, locations: Mapping[str, Any], error: type[Exception]) -> None:
    """Raise ``error`` when two of ``locations`` (name to ``(protocol, path)`` key, ``ObjectStoragePath`` or
    ``None``) are the same place: writing the release or its report there would destroy the source or the other
    file."""
    names = [name for name, location in locations.items() if location is not None]
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            a, b = locations[first], locations[second]
            if _same_place(a, b):
                shown = b if isinstance(b, ObjectStoragePath) else b[1]
                damage = "the raw microdata" if first == "source" else f"the file of {first}"
                raise error(
                    f"{task_id}: {second} and {first} are the same location ({shown}): writing it would overwrite "
                    f"{damage}; give {second}= a location of its own"
                )


def _same_place(a: Any, b: Any) -> bool:
    if isinstance(a, ObjectStoragePath) and isinstance(b, ObjectStoragePath):
        if _is_local(a) and _is_local(b):
            with contextlib.suppress(OSError):  # two names of one file: a hard link, a case-insensitive disk
                if os.path.samefile(a.path, b.path):
                    return True
        return _location_key(a) == _location_key(b)
    return a == b


def _storage_path(location: str | ObjectStoragePath | None) -> ObjectStoragePath:
    if isinstance(location, ObjectStoragePath):
        return location
    return ObjectStoragePath(str(location))


def _publish_local(target: ObjectStoragePath, write: Any) -> None:
    """Let ``write(local_path)`` fill a local temporary file, then publish it to ``target`` whole
    (:func:`~dp_operators.operators.sinks.publish_file`)."""
    from dp_operators.operators.sinks import publish_file  # imported when publishing, not when a DAG is parsed

    handle = tempfile.NamedTemporaryFile(prefix="dp-anonymity-", suffix=target.suffix, delete=False)
    handle.close()
    local = Path(handle.name)
    try:
        write(local)
        publish_file(target, local)
    finally:
        local.unlink(missing_ok=True)
