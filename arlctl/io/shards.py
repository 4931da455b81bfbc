"""Shard I/O: the one place that writes and reads Parquet trajectory shards (DESIGN.md §5).

Writes are atomic. Local: a hidden `.<name>.tmp` in the target directory, flushed, fsynced and renamed
over the final name with os.replace. Object stores: the final key is written once (a PUT appears whole
or not at all). Readers never see dot- or underscore-prefixed names.

Lineage travels inside each shard's Parquet key-value metadata: producer stage, arlctl version, host,
pid, config hash and the input shards consumed. A stage learns what it already consumed by reading its
own output directory (`arlctl.io.ledger.consumed_inputs`): commit of the output is commit of consumption.

Lineage is data: nothing read from a shard is ever executed, and a reader trusts a lineage record only
as far as it can check it (see `arlctl.io.ledger.consumed_inputs`). Shard names are data too: a name holding a glob
character (`* ? [ ] { }`) is listed as a stray and never read, because DuckDB and fsspec would expand it
into other files, hidden temp files included. Reading a shard checks its values (schemas/values.py)
unless the caller drops bad rows itself (filter) or passes them through (reward).

Reading is bounded (`ReadLimits`): Parquet's dictionary and RLE encodings let a few kilobytes stand for
gigabytes (one long string in a dictionary, referenced by every row). So before any page is decoded the
footer's sizes are summed, and the data is decoded with every string kept in dictionary form (its size
is the dictionary plus 4 bytes per value), batch by batch; each row's decoded size is computed from
those arrays, and only a shard whose rows and total fit the caps is expanded into plain columns. A
shard over a cap is a CorruptShardError naming the cap and how to raise it (ARLCTL_MAX_ROW_BYTES,
ARLCTL_MAX_SHARD_BYTES), which a stage's --quarantine moves aside like any other bad shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from arlctl import __version__
from arlctl.errors import CorruptShardError, NoShardsError, UsageError
from arlctl.io.fs import basename, get_fs, is_hidden, to_url
from arlctl.io.store import write_file
from arlctl.schemas.trajectory import (
    SCHEMA_METADATA,
    SchemaError,
    check_version,
    conform,
    validate,
    validate_structure,
)
from arlctl.schemas.values import check_values

LINEAGE_KEY = b"arlctl.lineage"
TARGET_ROW_GROUP_BYTES = 64 << 20  # uncompressed bytes per row group: large enough for fast scans
ZSTD_LEVEL = 3
GLOB_CHARS = frozenset("*?[]{}")  # what DuckDB's and fsspec's globbing expand inside a path
# What every shard name matches (shard_name writes `<prefix>-<utc>-<rand8>.parquet`): an allowlist, so a
# character nobody listed (a newline in a planted name) makes a stray, not a shard.
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,191}\.parquet")


@dataclass
class Lineage:
    stage: str
    inputs: list[str] = field(default_factory=list)
    config_hash: str = ""
    arlctl_version: str = __version__
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    created_at: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Lineage:
        data = json.loads(text)
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def config_hash(config: dict[str, Any] | None) -> str:
    """A short stable hash of a resolved configuration (sorted JSON)."""
    if not config:
        return ""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- writing


def write_table_atomic(table: pa.Table, url: str, metadata: dict[bytes, bytes] | None = None) -> str:
    """Write any Arrow table as one Parquet file, atomically. Returns the URL written."""
    if metadata:
        merged = dict(table.schema.metadata or {})
        merged.update(metadata)
        table = table.replace_schema_metadata(merged)
    row_group_size = _row_group_size(table)

    def write(fh: Any) -> None:
        pq.write_table(table, fh, compression="zstd", compression_level=ZSTD_LEVEL, row_group_size=row_group_size)

    # Local: streamed to a hidden temp file, fsynced, renamed; object store: one PUT (arlctl/io/store.py).
    return write_file(url, write)


def write_shard(table: pa.Table, url: str, lineage: Lineage) -> str:
    """Validate a trajectory table and commit it atomically with its lineage. Never coerces."""
    validate(table)
    meta = dict(SCHEMA_METADATA)
    meta[LINEAGE_KEY] = lineage.to_json().encode()
    return write_table_atomic(table, url, meta)


def _row_group_size(table: pa.Table) -> int:
    if table.num_rows == 0:
        return 1
    per_row = max(1, table.nbytes // table.num_rows)
    return int(max(1, min(table.num_rows, TARGET_ROW_GROUP_BYTES // per_row)))


def shard_name(prefix: str) -> str:
    """`<prefix>-<utc>-<rand8>.parquet`; names sort by creation time."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{int(time.time() * 1e6) % 1_000_000:06d}Z"
    return f"{prefix}-{stamp}-{os.urandom(4).hex()}.parquet"


# ----------------------------------------------------------------------------------------------- listing


@dataclass
class DirListing:
    shards: list[str]  # visible *.parquet files, sorted by name
    strays: list[str]  # visible files that are not Parquet shards, or whose name globs (reported, never read)


def scan(url: str) -> DirListing:
    """List a shard directory (or a single file). Hidden names are skipped entirely."""
    fs, path = get_fs(url)
    # s3fs caches listings for the life of the process: a daemon polling its input must ask the store.
    fs.invalidate_cache(path)
    if fs.isfile(path):
        return DirListing([to_url(fs, path)], []) if is_shard_name(basename(path)) else DirListing([], [url])
    if not fs.exists(path):
        return DirListing([], [])
    shards, strays = [], []
    for entry in sorted(fs.ls(path, detail=True), key=lambda e: e["name"]):
        name = basename(entry["name"])
        if is_hidden(name) or entry["type"] != "file":
            continue
        (shards if is_shard_name(name) else strays).append(to_url(fs, entry["name"]))
    return DirListing(shards, strays)


def is_shard_name(name: str) -> bool:
    """A name of the one shape shards have (SHARD_NAME): visible, `*.parquet`, ASCII letters, digits and
    `. _ = + -` only. Anything else -- a glob character DuckDB or fsspec would expand, a newline or other
    control character, a space, non-ASCII, `..` -- is a stray: listed (and counted) for the caller to
    report, never read."""
    return (SHARD_NAME.fullmatch(name) is not None and not is_hidden(name) and not GLOB_CHARS & set(name)
            and ".." not in name)


def list_shards(*urls: str) -> list[str]:
    """The shards under `urls`, in order. Strays are not returned: each directory's are counted in one
    warning, the first name written with `ascii()` (a planted newline or escape arrives spelled out)."""
    out: list[str] = []
    for url in urls:
        listing = scan(url)
        out.extend(listing.shards)
        if listing.strays:
            logging.getLogger("arlctl.shards").warning(
                "%s: %d file(s) not read (not a shard name), e.g. %s", ascii(url), len(listing.strays),
                ascii(basename(listing.strays[0])))
    return out


# ----------------------------------------------------------------------------------------------- reading


def read_lineage(url: str) -> Lineage | None:
    meta = _read_footer(url).metadata or {}
    raw = meta.get(LINEAGE_KEY)
    if not raw:
        return None
    try:
        return Lineage.from_json(raw)
    except (ValueError, TypeError, AttributeError) as err:
        raise CorruptShardError(url, f"unreadable lineage metadata ({_one_line(err)})") from None


def _read_footer(url: str) -> pa.Schema:
    fs, path = get_fs(url)
    try:
        with fs.open(path, "rb") as fh:
            return pq.read_schema(fh)
    except FileNotFoundError:
        raise
    except Exception as err:
        raise CorruptShardError(url, _one_line(err)) from None


DEFAULT_MAX_ROW_BYTES = 64 << 20  # one trajectory decoded: text, ids, log-probs (1M tokens with text: ~15 MB)
DEFAULT_MAX_SHARD_BYTES = 2 << 30  # one shard decoded (10k-token rows: ~16,000 of them)
DECODE_BATCH_ROWS = 256  # rows decoded at once, in dictionary form, before they are measured


@dataclass(frozen=True)
class ReadLimits:
    """Caps on what one shard may decode to, in bytes. `from_env` reads ARLCTL_MAX_ROW_BYTES and
    ARLCTL_MAX_SHARD_BYTES (plain integers) over the defaults; a value that is not one is a UsageError."""

    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES

    @classmethod
    def from_env(cls) -> ReadLimits:
        return cls(_env_bytes("ARLCTL_MAX_ROW_BYTES", DEFAULT_MAX_ROW_BYTES),
                   _env_bytes("ARLCTL_MAX_SHARD_BYTES", DEFAULT_MAX_SHARD_BYTES))


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{name}={raw[:40]!r} is not a positive number of bytes", hint=f"unset it, or e.g. {name}={default}")
    return int(raw)


def read_shard(url: str, columns: list[str] | None = None, *, bad_values: str = "raise",
               vocab_size: int | None = None, limits: ReadLimits | None = None) -> pa.Table:
    """Read and validate one trajectory shard; any defect raises CorruptShardError naming the file.

    bad_values: "raise" also refuses a shard with any row that breaks a value rule (schemas/values.py);
    "keep" returns such rows for a caller that drops them under a counted rule (filter) or passes them
    on untouched (reward). vocab_size: token ids must be below it (unknown: only >= 0 is checked).
    limits: the decoded-size caps (default: ReadLimits.from_env()); a shard over one is corrupt.
    """
    if bad_values not in ("raise", "keep"):
        raise ValueError(f"bad_values must be 'raise' or 'keep', not {bad_values!r}")
    limits = limits or ReadLimits.from_env()
    fs, path = get_fs(url)
    try:
        with fs.open(path, "rb") as fh:
            table = _read_bounded(fh, limits)
    except (FileNotFoundError, CorruptShardError):
        raise
    except _OverCap as err:
        raise CorruptShardError(url, str(err)) from None
    except Exception as err:
        raise CorruptShardError(url, _one_line(err)) from None
    meta = table.schema.metadata or {}
    if meta.get(b"arlctl.schema") != b"trajectory":
        raise CorruptShardError(url, "not an arlctl trajectory shard (no arlctl.schema metadata)")
    try:
        check_version(int(meta.get(b"arlctl.schema_version", b"0")))
        validate_structure(table)
        if bad_values == "raise":
            check_values(table, vocab_size)
    except (SchemaError, ValueError) as err:
        raise CorruptShardError(url, _one_line(err)) from None
    table = conform(table)
    return table.select(columns) if columns else table


class _OverCap(Exception):
    """A shard whose decoded size is over a ReadLimits cap (the message names the cap and the fix)."""


def _over(what: str, size: int, cap: int, env: str) -> _OverCap:
    return _OverCap(f"{what} decodes to {size} bytes, over the {cap}-byte cap (raise {env} to read it)")


def _read_bounded(fh: Any, limits: ReadLimits) -> pa.Table:
    """The whole file as an Arrow table, never decoding past `limits`.

    1. The footer: the pages' uncompressed sizes and value counts, summed, must fit the shard cap (this
       bounds every dictionary page and plain page before any is decompressed).
    2. Batches decoded with every BYTE_ARRAY column kept as a dictionary: what a repeated string costs is
       an index, not a copy. Each row's decoded size is measured on them (`_row_bytes`); a row or a running
       total over a cap stops the read there.
    3. Only then are the dictionary columns expanded to the file's own types.
    """
    meta = pq.read_metadata(fh)
    footer = sum(_chunk_floor(meta.row_group(g).column(c))
                 for g in range(meta.num_row_groups) for c in range(meta.num_columns))
    if footer > limits.max_shard_bytes:
        raise _over("the shard (by its footer)", footer, limits.max_shard_bytes, "ARLCTL_MAX_SHARD_BYTES")
    schema = pq.ParquetFile(fh, metadata=meta).schema_arrow  # the file's own types, no dictionaries
    leaves = [meta.schema.column(i) for i in range(len(meta.schema))]
    strings = [leaf.path for leaf in leaves if leaf.physical_type == "BYTE_ARRAY"]
    reader = pq.ParquetFile(fh, metadata=meta, read_dictionary=strings)
    batches, total, first_row = [], 0, 0
    for batch in reader.iter_batches(batch_size=DECODE_BATCH_ROWS):
        sizes = _row_bytes(batch)  # [B]
        if len(sizes) and int(sizes.max()) > limits.max_row_bytes:
            row = first_row + int(sizes.argmax())
            raise _over(f"row {row}", int(sizes.max()), limits.max_row_bytes, "ARLCTL_MAX_ROW_BYTES")
        total += int(sizes.sum())
        if total > limits.max_shard_bytes:
            raise _over(f"the shard (rows 0..{first_row + batch.num_rows - 1} alone)", total,
                        limits.max_shard_bytes, "ARLCTL_MAX_SHARD_BYTES")
        batches.append(batch)
        first_row += batch.num_rows
    if not batches:
        return schema.empty_table()
    return pa.Table.from_batches(batches).cast(schema)


def _chunk_floor(chunk: Any) -> int:
    """The least one column chunk decodes to: its uncompressed pages, and at least 1 byte per value."""
    return max(int(chunk.total_uncompressed_size), int(chunk.num_values))


def _row_bytes(array: pa.Array | pa.RecordBatch) -> np.ndarray:
    """[N] the bytes each row of `array` takes once every dictionary is expanded (strings: their bytes;
    fixed-width values: their width; lists, maps and structs: the sum of what they hold)."""
    if isinstance(array, pa.RecordBatch):
        out = np.zeros(array.num_rows, dtype=np.int64)
        for column in array.columns:
            out += _row_bytes(column)
        return out
    kind = array.type
    if pa.types.is_dictionary(kind):
        per_value = _row_bytes(array.dictionary)  # [D]
        indices = array.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)  # [N]
        return per_value[indices] if len(per_value) else np.zeros(len(array), dtype=np.int64)
    if pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind) \
            or pa.types.is_large_binary(kind):
        return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_struct(kind):
        out = np.zeros(len(array), dtype=np.int64)
        for i in range(kind.num_fields):
            out += _row_bytes(array.field(i))
        return out
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)  # [N + 1]
        child = _row_bytes(array.values if not pa.types.is_map(kind) else array.values)  # [V]
        cumulative = np.concatenate([[0], np.cumsum(child)])
        return cumulative[offsets[1:]] - cumulative[offsets[:-1]]
    width = kind.bit_width // 8 if hasattr(kind, "bit_width") and kind.bit_width else 1
    return np.full(len(array), max(1, width), dtype=np.int64)


def read_shards(urls: Iterable[str], on_corrupt: str = "raise") -> tuple[pa.Table, list[CorruptShardError]]:
    """Read many shards into one table.

    on_corrupt: "raise" stops at the first bad shard; "skip" collects the errors; "quarantine" also
    moves each bad shard into `_quarantine/` beside it.
    """
    tables, errors = [], []
    for url in urls:
        try:
            tables.append(read_shard(url))
        except CorruptShardError as err:
            if on_corrupt == "raise":
                raise
            errors.append(err)
            if on_corrupt == "quarantine":
                quarantine(url)
    if not tables:
        from arlctl.schemas.trajectory import empty_table

        return empty_table(), errors
    return pa.concat_tables(tables), errors


def read_dirs(*urls: str, on_corrupt: str = "raise") -> tuple[pa.Table, list[CorruptShardError]]:
    shards = list_shards(*urls)
    if not shards:
        raise NoShardsError(", ".join(urls))
    return read_shards(shards, on_corrupt=on_corrupt)


def quarantine(url: str) -> str:
    """Move a bad shard to `_quarantine/` in its directory (invisible to readers). Returns the new URL."""
    fs, path = get_fs(url)
    directory, name = path.rsplit("/", 1)
    target = f"{directory}/_quarantine/{name}"
    fs.makedirs(f"{directory}/_quarantine", exist_ok=True)
    fs.mv(path, target)
    return to_url(fs, target)


def quarantine_rows(rows: pa.Table, url: str, causes: list[str], stage: str) -> str:
    """Set aside rows of shard `url` that no stage may write (their causes are in the file's lineage):
    `_quarantine/<stem>.rows.parquet` beside it, written as read (never validated, never coerced), so a
    re-run overwrites it. The shard itself stays where it is. Returns the URL written."""
    fs, path = get_fs(url)
    directory, name = path.rsplit("/", 1)
    target = to_url(fs, f"{directory}/_quarantine/{name.removesuffix('.parquet')}.rows.parquet")
    lineage = Lineage(stage=stage, inputs=[url], extra={"quarantined_rows": causes})
    return write_table_atomic(rows, target, {**SCHEMA_METADATA, LINEAGE_KEY: lineage.to_json().encode()})


def _one_line(err: BaseException) -> str:
    text = str(err).strip().replace("\n", " ")
    return f"{type(err).__name__}: {text}"[:300]


__all__ = [
    "DirListing", "Lineage", "ReadLimits", "config_hash", "is_shard_name", "list_shards", "quarantine",
    "quarantine_rows",
    "read_dirs", "read_lineage", "read_shard", "read_shards", "scan", "shard_name", "write_shard",
    "write_table_atomic",
]
