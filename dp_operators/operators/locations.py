"""Where a release is published: one folder per release key, collision-free and inside the output URI.

Layout (ADR 0021)::

    <output_uri>/<release>/<dag_id>/<run_id>/<task_id>[~<map_index>].<format>
    <diagnostics_uri>/<release>/<dag_id>/<run_id>/<task_id>[~<map_index>]~diagnostics.json

Each of ``release``, ``dag_id``, ``run_id`` and ``task_id`` is one path component, encoded by
:func:`encode_component`: a reversible percent-encoding (RFC 3986 section 2.1) of the component's UTF-8 bytes that
keeps ``A-Z a-z 0-9 _ -`` and ``.`` (except a leading one) and encodes every other byte, ``%`` and ``~`` included.
So:

* distinct keys never share a path: the encoding is injective, ``~`` never appears unencoded inside a component (it
  only separates the map index and the diagnostics suffix), and the format suffixes end differently;
* no component is empty, contains ``/`` or ``\\``, or starts with ``.``: nothing can climb out of ``output_uri``
  (``..``, ``.``, absolute paths) or hide as a dot-file; :func:`release_stem` checks the result lies under the base;
* a path can be read back to its release key (:func:`decode_component`), which an auditor uses to match files to
  ledger rows.

So a folder name holds a literal ``%`` (``manual__2026-01-01T00%3A00%3A00%2B00%3A00``). ``ObjectStoragePath``
(fsspec) writes a path as the text it is given, while every URI reader (urllib, pandas, pyarrow) percent-decodes a
URI's path once: the URI a file is published under (XCom, asset events, the extra link, rows files in the ledger) is
therefore :func:`published_uri`, which encodes that ``%`` as ``%25``; :func:`storage_path_of` reads it back.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from airflow.sdk import ObjectStoragePath

from dp_operators.ledger import ReleaseKey

#: Bytes kept as they are (besides ``.`` not in first position); every other byte is written ``%XX``.
_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")

#: Separates a task id from its map index and from the diagnostics suffix; never produced by the encoding.
SEPARATOR = "~"

#: Longest file or folder name, in bytes, common file systems and object-store tools accept (NAME_MAX).
MAX_NAME_BYTES = 255
#: What the longest file name adds to the stem: ``~diagnostics.json`` (17), plus the sinks' temporary sibling
#: ``.<name>.<8 random>.tmp`` (14).
_STEM_OVERHEAD = len(f"{SEPARATOR}diagnostics.json") + len(".") + len(".12345678.tmp")


def encode_component(text: str) -> str:
    """``text`` as one safe, reversible path component (see the module docstring).

    Raises:
        ValueError: ``text`` is empty (no Airflow id is).
    """
    if not text:
        raise ValueError("an empty name cannot be a path component")
    out = []
    for position, byte in enumerate(text.encode("utf-8")):
        if byte in _KEPT and not (position == 0 and byte == ord(".")):
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def decode_component(component: str) -> str:
    """The inverse of :func:`encode_component`."""
    return unquote(component, encoding="utf-8", errors="strict")


def published_uri(path: ObjectStoragePath) -> str:
    """The URI a file written at ``path`` is published under: an RFC 3986 URI whose path, percent-decoded once
    (section 2.1), is the file's real path (or object key). A local file (``file://`` or a bare path) as
    :meth:`pathlib.PurePath.as_uri` writes it; an object store's ``<protocol>://<bucket>`` kept, its key encoded by
    :func:`urllib.parse.quote` (UTF-8, only ``/`` and the unreserved characters left as they are). Opens as it is
    with ``urllib.request.urlopen``, pandas and ``pyarrow.fs.FileSystem.from_uri``; fsspec and ``ObjectStoragePath``
    take a URI's path text as the path: give them :func:`storage_path_of` of it."""
    if _is_local(path):
        return Path(path.path).as_uri()
    scheme, _, rest = str(path).partition("://")
    authority, slash, key = rest.partition("/")
    return f"{scheme}://{authority}{slash}{quote(key, safe='/')}"


def storage_path_of(uri: str) -> ObjectStoragePath:
    """The file a URI from :func:`published_uri` names: its path percent-decoded once (the inverse).

    Raises:
        ValueError: not ``<scheme>://...``, a query or fragment, a ``file`` URI naming another host, or a path that
            is not UTF-8 once decoded (no URI :func:`published_uri` writes).
    """
    parts = urlsplit(uri)
    if not parts.scheme or not uri.lower().startswith(f"{parts.scheme}://") or parts.query or parts.fragment:
        raise ValueError(f"{uri!r} is not a URI of a published file (<scheme>://<path>, no query or fragment)")
    try:
        path = unquote(parts.path, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise ValueError(f"the path of {uri!r} is not UTF-8 once percent-decoded") from None
    if parts.scheme in ("file", "local"):
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{uri!r} names a file on another host ({parts.netloc})")
        return ObjectStoragePath(f"file://{path}")
    return ObjectStoragePath(f"{parts.scheme}://{parts.netloc}{path}")


def _is_local(path: ObjectStoragePath) -> bool:
    return path.protocol in ("file", "local", "")


def release_folder(base_uri: str, key: ReleaseKey) -> ObjectStoragePath:
    """``<base_uri>/<release>/<dag_id>/<run_id>``, not created. ``base_uri`` is any ``ObjectStoragePath`` URI."""
    base = ObjectStoragePath(base_uri)
    folder = base
    for part in (key.release_name, key.dag_id, key.run_id):
        folder = folder / encode_component(part)
    _check_inside(base, folder)
    return folder


def release_stem(key: ReleaseKey) -> str:
    """``<task_id>`` or ``<task_id>~<map_index>``, encoded: the file name without its suffix."""
    stem = encode_component(key.task_id)
    return stem if key.map_index < 0 else f"{stem}{SEPARATOR}{key.map_index}"


def release_file(base_uri: str, key: ReleaseKey, fmt: str) -> ObjectStoragePath:
    """The file of ``key`` in format ``fmt`` (``json``, ``csv``, ``parquet``) under ``base_uri``, not created."""
    return release_folder(base_uri, key) / f"{release_stem(key)}.{fmt}"


def diagnostics_file(base_uri: str, key: ReleaseKey) -> ObjectStoragePath:
    """The diagnostics report of ``key`` under ``base_uri``: ``<stem>~diagnostics.json``, not created."""
    return release_folder(base_uri, key) / f"{release_stem(key)}{SEPARATOR}diagnostics.json"


def key_of(path: ObjectStoragePath | str, base_uri: str) -> tuple[ReleaseKey, str]:
    """The release key and format of a published file (the inverse of :func:`release_file`).

    Raises:
        ValueError: ``path`` is not a release file under ``base_uri``.
    """
    base = str(ObjectStoragePath(base_uri)).rstrip("/")
    text = str(path)
    if not text.startswith(base + "/"):
        raise ValueError(f"{text} is not under {base}")
    parts = text[len(base) + 1:].split("/")
    if len(parts) != 4 or "." not in parts[3]:
        raise ValueError(f"{text} is not <release>/<dag_id>/<run_id>/<task>.<format> under {base}")
    stem, fmt = parts[3].rsplit(".", 1)
    task, _, map_index = stem.partition(SEPARATOR)
    release, dag_id, run_id = (decode_component(p) for p in parts[:3])
    key = ReleaseKey(
        dag_id=dag_id, run_id=run_id, task_id=decode_component(task),
        map_index=int(map_index) if map_index else -1, release_name=release,
    )
    return key, fmt


def check_publishable(base_uri: str, key: ReleaseKey) -> ObjectStoragePath:
    """The folder of ``key`` under ``base_uri``, checked to be writable as published files: called before any
    budget is reserved, so a name that cannot be a file never costs a charge it cannot publish.

    Raises:
        ValueError: an encoded name longer than :data:`MAX_NAME_BYTES` bytes (a long run id of ``:``/``+``, which
            encode to 3 bytes each, or a long non-ASCII task id), or, on local storage, a symbolic link between
            ``base_uri`` and the folder (a planted link would redirect the files elsewhere).
    """
    names = {"release name": key.release_name, "dag_id": key.dag_id, "run_id": key.run_id}
    for what, name in names.items():
        encoded = encode_component(name)
        if len(encoded) > MAX_NAME_BYTES:
            raise ValueError(
                f"the {what} {name[:40]!r}... is {len(encoded)} bytes once encoded as a path component, more than "
                f"{MAX_NAME_BYTES}; use a shorter {what}"
            )
    stem = release_stem(key)
    if len(stem) + _STEM_OVERHEAD > MAX_NAME_BYTES:
        raise ValueError(
            f"the task id {key.task_id[:40]!r}... is {len(stem)} bytes once encoded as a file name, more than "
            f"{MAX_NAME_BYTES - _STEM_OVERHEAD}; use a shorter task id"
        )
    folder = release_folder(base_uri, key)
    _check_no_links(ObjectStoragePath(base_uri), folder)
    return folder


def _check_no_links(base: ObjectStoragePath, folder: ObjectStoragePath) -> None:
    """On local storage, refuse a symbolic link at any level below ``base`` down to ``folder``."""
    if not _is_local(base):
        return
    root = Path(base.path)
    current = root
    for part in Path(folder.path).relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            raise ValueError(f"{current} is a symbolic link: release files are never written through one")


def _check_inside(base: ObjectStoragePath, path: ObjectStoragePath) -> None:
    """Refuse a path that is not strictly below ``base`` (defence in depth: the encoding already prevents it)."""
    root = str(base).rstrip("/") + "/"
    if not str(path).startswith(root) or any(part in ("", ".", "..") for part in str(path)[len(root):].split("/")):
        raise ValueError(f"the release path {path} escapes the output location {base}")
