"""Large releases: a count's or sum's published rows stored as a Parquet file whose SHA-256 and location the
ledger keeps, instead of the rows themselves (issue 11, item 2; docs/adr/0023).

A ledger row holding 10^7 published cells would be a gigabyte of JSON, re-read on every replay. Above
``inline_rows_limit`` cells (a public number: the size of the public key domain), the engine writes the
aggregate's rows to a :class:`RowsStore` as deterministic Parquet, and the published aggregate (what the ledger
commits, what XCom carries) holds ``rows_file``: ``{"uri", "sha256", "rows", "format": "parquet"}``. The file is
written before the commit, named by its digest (two attempts of one release never overwrite each other's file),
and a replay checks the digest before returning (:func:`check_rows_files`): the ledger's output digest covers the
file's SHA-256, so a replay returns the same bytes or refuses.

The file's schema is :func:`parquet_schema`, the flat table the operator's Parquet sink publishes (one row per
released value: ``aggregate``, ``kind``, ``key`` as compact JSON, ``value``, ``half_width``, ``confidence``,
``mechanism``, ``saturated``, ``lower``, ``upper``). ``value`` holds the values exactly: int64 or decimal as the
aggregate's public parameters imply (:mod:`dp_operators.release.value_types`; float64 for a consistent family's
member), since the file is the only copy of them. Rows files written before values were typed hold float64.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from fractions import Fraction
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import numpy as np

from dp_operators.release.columns import largest_magnitude
from dp_operators.release.errors import ReleaseConfigError
from dp_operators.release.value_types import DECIMAL128_DIGITS, FLOAT64, INT64_MAX, ValueType, aggregate_value_type

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from dp_operators.release.publish import PublishedCells
    from dp_operators.spec import Aggregate

#: The columns of the flat table, in this order (the Parquet and CSV sinks, and rows files).
COLUMNS = ("aggregate", "kind", "key", "value", "half_width", "confidence", "mechanism", "saturated", "lower", "upper")
#: Rows per Parquet row group: bounds the writer's buffer, and fixes the file's layout (so its bytes).
ROW_GROUP = 1 << 20
#: Default number of cells above which a count's or sum's rows go to a rows file.
INLINE_ROWS_LIMIT = 100_000
#: The operator's rows files go to the folder ``<stem>~rows`` beside the release's files (``~`` never occurs in an
#: encoded DAG, run or task id, so no release's own folder or file can be taken for it).
ROWS_SUFFIX = "~rows"


class RowsFileError(ReleaseConfigError):
    """A committed release's rows file is missing or does not hold the bytes the ledger recorded. The release is
    never redrawn (that would charge again and publish other noise): restore the file from a backup."""


def parquet_schema(value: ValueType = FLOAT64, float_value: bool = False) -> pa.Schema:
    """The Arrow schema of the flat table: :data:`COLUMNS`; ``value`` of type ``value``
    (:mod:`~dp_operators.release.value_types`: int64, decimal or float64, from public parameters; float64 in rows
    files written before values were typed); ``half_width``, ``confidence``, ``lower`` and ``upper`` as float64
    (doubles by construction), ``saturated`` as bool; only ``half_width``, ``lower`` and ``upper`` nullable. With
    ``float_value`` (a release mixing binary-float aggregates with counts or sums,
    :func:`~dp_operators.release.value_types.value_columns`), a nullable float64 ``float_value`` column follows
    ``value``, which is then nullable too: each row fills one of them."""
    import pyarrow as pa

    nullable = {"half_width", "lower", "upper"} | ({"value"} if float_value else set())
    types = {"value": value.arrow(), "half_width": pa.float64(), "confidence": pa.float64(), "lower": pa.float64(),
             "upper": pa.float64(), "saturated": pa.bool_()}
    fields = [pa.field(c, types.get(c, pa.string()), nullable=c in nullable) for c in COLUMNS]
    if float_value:
        fields.insert(COLUMNS.index("value") + 1, pa.field("float_value", pa.float64(), nullable=True))
    return pa.schema(fields)


class RowsStore(Protocol):
    """Where rows files go. ``put`` moves a finished local file to ``name`` and returns its URI (RFC 3986: its
    path, percent-decoded once, is the file's; the ledger commits it and readers open it as it is); ``open`` reads a
    URI ``put`` returned (or an older version's ``put``, for the same folder); ``owns`` says whether a URI names a
    file directly in this store (a replay reads nothing else: a ledger row pointing elsewhere, say at the true
    aggregates, is refused)."""

    def put(self, name: str, source: Path) -> str: ...

    def open(self, uri: str) -> BinaryIO: ...

    def owns(self, uri: str) -> bool: ...


class LocalRowsStore:
    """A :class:`RowsStore` on a local folder (created on first use). URIs are ``file://`` URIs
    (:meth:`pathlib.PurePath.as_uri`: the path percent-encoded once, so urllib, pandas and pyarrow open them as they
    are); a release committed before that holds the file's absolute path, which is read as it is (:func:`local_path`).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def put(self, name: str, source: Path) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / name
        try:
            os.replace(source, target)
        except OSError:  # another filesystem: copy beside the target, then rename (readers never see half a file)
            partial = self.folder / f".{name}.tmp"
            shutil.copyfile(source, partial)
            os.replace(partial, target)
        return target.resolve().as_uri()

    def open(self, uri: str) -> BinaryIO:
        path = local_path(uri)
        if path is None:
            raise FileNotFoundError(f"{uri} is not a local file")
        return open_regular(path)

    def owns(self, uri: str) -> bool:
        path = local_path(uri)
        return path is not None and path.parent.resolve() == self.folder.resolve()


def local_path(uri: str) -> Path | None:
    """The local file a rows file's ``uri`` names: a ``file://`` URI's path percent-decoded once
    (:func:`urllib.request.url2pathname`), an absolute path (how a release committed before rows-file URIs were URIs
    names it; its committed output is signed and never rewritten) as it is; None for anything else (another host,
    a query or fragment, a relative path)."""
    from urllib.parse import urlsplit
    from urllib.request import url2pathname

    if not uri.startswith("file:"):
        return Path(uri) if Path(uri).is_absolute() else None
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment or not parts.path.startswith("/"):
        return None
    return Path(url2pathname(parts.path))


def _json_texts(values: Sequence[Any]) -> list[str]:
    """``json.dumps(v, ensure_ascii=False)`` of each public key value: the standard library's C string encoder for
    text and ``int.__repr__`` for an int (the JSON of both), without building an encoder per value (a 10^6-key
    domain, as vector_release's index, took seconds that way); any other type through ``json.dumps``."""
    from json.encoder import encode_basestring

    return [encode_basestring(v) if type(v) is str else int.__repr__(v) if type(v) is int
            else json.dumps(v, ensure_ascii=False) for v in values]


def _key_texts(keys: Any, positions: np.ndarray, group_by: Sequence[str]) -> pa.Array:
    """The ``key`` column (compact JSON objects in ``group_by`` order) of the cells at ``positions`` of a public
    key domain, from the JSON text of each column's listed values, taken per cell."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    for index, (column, values, codes) in enumerate(zip(group_by, keys.columns, keys.codes(positions))):
        name = json.dumps(column, ensure_ascii=False)
        texts = [f"{name}:{text}" for text in _json_texts(values)]
        if index == 0:
            texts = ["{" + t for t in texts]
        if index == len(group_by) - 1:
            texts = [t + "}" for t in texts]
        parts.append(pa.array(texts, type=pa.string()).take(pa.array(codes)))
    return parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, ",")


def cells_table(aggregate: Aggregate, cells: PublishedCells, keys: Any, confidence: float,
                start: int = 0, *, value_type: ValueType | None = None) -> pa.Table:
    """The flat table (:func:`parquet_schema` of ``value_type``) of a count's or sum's published cells over a
    public key domain (a :class:`~dp_operators.release.inputs.KeyDomain`); ``cells`` are the domain's cells from
    position ``start`` on (a slice, see :func:`cells_tables`). ``value_type``: the aggregate's
    (:func:`~dp_operators.release.value_types.aggregate_value_type`; by default from its kind and the cells' noise
    step, as for an aggregate outside any consistent family: the engine passes float64 for a family's member); an
    exact one gets the values exactly (:func:`value_array`).

    Raises:
        ValueError: a value beyond ``value_type`` (a tail event below 2^-127, see
            :mod:`~dp_operators.release.value_types`).
    """
    import pyarrow as pa

    if value_type is None:
        value_type = aggregate_value_type(aggregate.kind, cells.step.describe(), family=False)
    n = len(cells.units)
    saturated = cells.side != 0
    values = cells.value_floats()
    lower, upper = cells.bounds(values)
    half_width = np.broadcast_to(np.asarray(cells.half_width, dtype=np.float64), (n,))  # one, or one per cell
    # the JSON check of check_plain_json, on the arrays' dtypes and values at once: finite doubles only (NaN marks
    # an unbounded interval end, published as null)
    if not (np.isfinite(values).all() and np.isfinite(half_width).all()
            and not np.isinf(lower).any() and not np.isinf(upper).any()):
        raise TypeError(f"aggregate {aggregate.name!r}: a non-finite float cannot be published")
    columns = {
        "aggregate": pa.repeat(aggregate.name, n).cast(pa.string()),
        "kind": pa.repeat(aggregate.kind, n).cast(pa.string()),
        "key": _key_texts(keys, np.arange(start, start + n, dtype=np.int64), aggregate.group_by),
        "value": value_array(cells, value_type) if value_type.exact else pa.array(values),
        "half_width": pa.array(half_width, mask=saturated),
        "confidence": pa.repeat(float(confidence), n).cast(pa.float64()),
        "mechanism": pa.repeat(cells.step.mechanism, n).cast(pa.string()),
        "saturated": pa.array(saturated),
        "lower": pa.array(lower, mask=np.isnan(lower)),
        "upper": pa.array(upper, mask=np.isnan(upper)),
    }
    return pa.table(columns, schema=parquet_schema(value_type))


def value_array(cells: PublishedCells, value_type: ValueType) -> pa.Array:
    """The published values of ``cells`` (a count's or sum's) exactly, as an array of the exact ``value_type``:
    ``units * grid`` (0 where ``clamp_nonnegative`` zeroed a cell), with no rounding through doubles. The grid is
    ``G * 10^-scale`` for an integer ``G`` (the type was chosen from the grid's decimal form); the decimal array is
    built from the integers ``units * G`` (its unscaled values) when they fit int64, else from Python ``Decimal``s.

    Raises:
        ValueError: a value beyond ``value_type``, or a grid that is not a multiple of 10^-scale.
    """
    import pyarrow as pa

    grid = Fraction(cells.step.grid) * 10**value_type.scale
    if grid.denominator != 1:
        raise ValueError(f"grid {cells.step.grid} is not a multiple of 10^-{value_type.scale}: its values do not fit "
                         f"the {value_type} value column")
    factor = grid.numerator
    units = np.asarray(cells.units)
    zeroed = np.asarray(cells.zeroed, dtype=bool)
    try:
        if units.dtype != object and max(largest_magnitude(units), 1) * factor <= INT64_MAX \
                and value_type.precision <= DECIMAL128_DIGITS:
            unscaled = np.where(zeroed, 0, units.astype(np.int64) * factor)
            if value_type.name == "int64":
                return pa.array(unscaled, type=pa.int64())
            # the int64 integers, as decimals of scale 0, hold the unscaled values: the same buffers read at the
            # type's scale are the values (no per-value Python object)
            whole = pa.array(unscaled, type=pa.int64()).cast(pa.decimal128(value_type.precision, 0))
            return pa.Array.from_buffers(value_type.arrow(), len(whole), whole.buffers(), null_count=0)
        products = [0 if z else int(u) * factor for u, z in zip(units.tolist(), zeroed.tolist())]
        if value_type.name == "int64":
            return pa.array(products, type=pa.int64())
        return pa.array([Decimal(p).scaleb(-value_type.scale) for p in products], type=value_type.arrow())
    except (pa.ArrowInvalid, OverflowError):
        raise ValueError(f"a value is beyond the {value_type} value column (a noise tail event below 2^-127)") from None


def cells_tables(aggregate: Aggregate, cells: PublishedCells, keys: Any, confidence: float, *,
                 value_type: ValueType | None = None) -> Iterator[pa.Table]:
    """:func:`cells_table` in pieces of :data:`ROW_GROUP` rows, in order: the flat table is never whole in
    memory (at 10^7 cells it would be about a gigabyte of text keys)."""
    total = len(cells.units)
    for start in range(0, max(total, 1), ROW_GROUP):
        yield cells_table(aggregate, cells.slice(start, start + ROW_GROUP), keys, confidence, start,
                          value_type=value_type)


def write_rows_file(store: RowsStore, aggregate: Aggregate, pieces: pa.Table | Iterable[pa.Table]) -> dict[str, Any]:
    """Write the flat table (one table, or pieces of it in order) as deterministic Parquet (snappy, one row group
    per :data:`ROW_GROUP` rows, no timestamp) to a temporary local file, hash it, and ``put`` it in ``store`` as
    ``<aggregate>-<sha256 prefix>.parquet``. Returns the published ``rows_file`` reference."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(pieces, pa.Table):
        pieces = [pieces.slice(start, ROW_GROUP) for start in range(0, max(pieces.num_rows, 1), ROW_GROUP)]
    pieces = iter(pieces)
    first = next(pieces, None)
    schema = parquet_schema() if first is None else first.schema  # the pieces' own: their value type
    handle = tempfile.NamedTemporaryFile(prefix="dp-rows-", suffix=".parquet", delete=False)
    handle.close()
    source = Path(handle.name)
    rows = 0
    try:
        with pq.ParquetWriter(source, schema, compression="snappy") as writer:
            for piece in chain([] if first is None else [first], pieces):
                writer.write_table(piece, row_group_size=ROW_GROUP)
                rows += piece.num_rows
        os.chmod(source, 0o644)  # a published file: readable like the sinks' files (tempfile makes it 0600)
        digest = _sha256(source.open("rb"))
        uri = store.put(f"{aggregate.name}-{digest[:16]}.parquet", source)
    finally:
        source.unlink(missing_ok=True)
    return {"format": "parquet", "rows": rows, "sha256": digest, "uri": uri}


def open_regular(path: Path) -> BinaryIO:
    """Open a local file for reading, refusing anything but a regular file reached without a symbolic link (a FIFO
    would block the task; a link could lead anywhere).

    Raises:
        OSError: not a regular file, or a link.
    """
    import stat

    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    descriptor = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def verified_copy(store: RowsStore, reference: dict[str, Any], name: str) -> Path:
    """A local temporary copy of a rows file, hashed while copied and checked against the committed SHA-256, so
    what is read from it is what the ledger recorded (the file itself could change after any earlier check). The
    caller deletes it.

    Raises:
        RowsFileError: as :func:`check_rows_files`.
    """
    _check_reference(name, reference, store)
    handle = tempfile.NamedTemporaryFile(prefix="dp-rows-", suffix=".parquet", delete=False)
    digest = hashlib.sha256()
    try:
        with handle, store.open(reference["uri"]) as source:
            for block in iter(lambda: source.read(1 << 22), b""):
                digest.update(block)
                handle.write(block)
    except OSError as error:
        Path(handle.name).unlink(missing_ok=True)
        raise RowsFileError(f"the rows file of aggregate {name!r}, {reference['uri']}, cannot be read "
                            f"({type(error).__name__}); restore it from a backup (the release is never redrawn)") from None
    if digest.hexdigest() != reference["sha256"]:
        Path(handle.name).unlink(missing_ok=True)
        raise RowsFileError(f"the rows file of aggregate {name!r}, {reference['uri']}, does not hold the committed "
                            "bytes; restore it from a backup (the release is never redrawn)")
    return Path(handle.name)


def _sha256(handle: BinaryIO) -> str:
    digest = hashlib.sha256()
    with handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def rows_files(output: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(aggregate name, rows_file reference)`` of every aggregate of a published release stored as a file."""
    return [(name, aggregate["rows_file"]) for name, aggregate in sorted(output.get("aggregates", {}).items())
            if isinstance(aggregate, dict) and "rows_file" in aggregate]


def _check_reference(name: str, reference: Any, store: RowsStore) -> None:
    """Refuse a reference that is not ``<aggregate>-<sha256 prefix>.parquet`` directly in ``store``'s folder."""
    if not isinstance(reference, dict) or not all(isinstance(reference.get(f), str) for f in ("uri", "sha256")):
        raise RowsFileError(f"the committed release's rows_file of aggregate {name!r} is malformed")
    expected_name = f"{name}-{reference['sha256'][:16]}.parquet"
    if not store.owns(reference["uri"]) or not reference["uri"].endswith("/" + expected_name):
        raise RowsFileError(
            f"the committed release names {reference['uri']} as the rows file of aggregate {name!r}, which is "
            f"not {expected_name} in this release's rows folder; the ledger row was altered (run `dpctl ledger "
            "verify`); nothing is read or published from it"
        )


def check_rows_files(output: dict[str, Any], store: RowsStore) -> None:
    """Check that every rows file of ``output`` holds the bytes whose SHA-256 the ledger recorded.

    Raises:
        RowsFileError: a reference that is not ``<aggregate>-<sha256 prefix>.parquet`` in ``store``'s folder (an
            altered ledger row must not make a replay publish another file), or a file missing, unreadable, or
            with other bytes (names the aggregate and the URI).
    """
    for name, reference in rows_files(output):
        _check_reference(name, reference, store)
        try:
            found = _sha256(store.open(reference["uri"]))
        except OSError as error:
            raise RowsFileError(
                f"the rows file of aggregate {name!r} of this committed release, {reference['uri']}, cannot be read "
                f"({type(error).__name__}); restore it from a backup (the release is never redrawn)"
            ) from None
        if found != reference["sha256"]:
            raise RowsFileError(
                f"the rows file of aggregate {name!r}, {reference['uri']}, does not hold the committed bytes "
                f"(sha256 {found[:16]}..., the ledger recorded {reference['sha256'][:16]}...); restore it from a "
                "backup (the release is never redrawn)"
            )
