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

import pyarrow as pa
import pyarrow.parquet as pq

from arlctl import __version__
from arlctl.errors import CorruptShardError, NoShardsError
from arlctl.io.fs import basename, get_fs, is_hidden, join, to_url
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
    control character, a space, non-ASCII -- is a stray: listed (and counted) for the caller to report,
    never read."""
    return SHARD_NAME.fullmatch(name) is not None and not is_hidden(name) and not GLOB_CHARS & set(name)


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


def read_shard(url: str, columns: list[str] | None = None, *, bad_values: str = "raise",
               vocab_size: int | None = None) -> pa.Table:
    """Read and validate one trajectory shard; any defect raises CorruptShardError naming the file.

    bad_values: "raise" also refuses a shard with any row that breaks a value rule (schemas/values.py);
    "keep" returns such rows for a caller that drops them under a counted rule (filter) or passes them
    on untouched (reward). vocab_size: token ids must be below it (unknown: only >= 0 is checked).
    """
    if bad_values not in ("raise", "keep"):
        raise ValueError(f"bad_values must be 'raise' or 'keep', not {bad_values!r}")
    fs, path = get_fs(url)
    try:
        with fs.open(path, "rb") as fh:
            table = pq.read_table(fh)
    except FileNotFoundError:
        raise
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


def _one_line(err: BaseException) -> str:
    text = str(err).strip().replace("\n", " ")
    return f"{type(err).__name__}: {text}"[:300]


__all__ = [
    "DirListing", "Lineage", "config_hash", "is_shard_name", "join", "list_shards", "quarantine",
    "read_dirs", "read_lineage", "read_shard", "read_shards", "scan", "shard_name", "write_shard",
    "write_table_atomic",
]
