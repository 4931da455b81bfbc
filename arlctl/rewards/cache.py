"""The reward cache: a reward already computed for the same content under the same reward_version is reused.

A cache entry is keyed by (reward_version, content key). The content key is the sha256 of what a reward
reads, as canonical JSON (sorted keys, no spaces): the row's final_state, its task object, the response
text and the text of each turn (`item_key`). For a reward that compares the members of a group
(`score_group`), each member's key also covers every member of its group in order (`group_keys`): the
same row in another group is another entry. reward_version is the full one, so a changed option, rubric
file or judge model (a reward's `version_suffix`) never hits an entry made under the old one.

Storage: Parquet files `part-<utc>-<rand8>.parquet` in one directory (RUN/reward-cache by default, or any
fsspec URL, s3 included, shared by several runs). The stage appends one file per shard with the entries
that shard added (`flush`), and during a long shard one every `flush_s` seconds, through the repo's
atomic write (arlctl/io/store.py): a file is whole or absent, and a crash loses at most the grading of
the last flush_s seconds. The files are read once, when the cache is opened, keeping only the versions
asked for (`versions`); `compact` merges many files into one.

Every row carries a checksum of its own values. A file that cannot be read or lacks the columns is
ignored with a warning, and so is each row whose values no longer match its checksum (a damaged file
that Parquet still decodes): a damaged cache costs recomputation, never a wrong reward.

A null reward (the row could not be graded, e.g. a judge that timed out) is never stored: a transient
failure is retried on the next run instead of being remembered.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from arlctl.io.fs import get_fs, is_hidden, join, list_files
from arlctl.io.shards import shard_name, write_table_atomic
from arlctl.io.store import write_file

COMPACT_AT = 64  # files read at open past which `compact` merges them into one
FILE_PREFIX = "part"
FORMAT = "arlctl-reward-cache-1"
FORMAT_KEY = b"arlctl.reward_cache.format"
SCHEMA = pa.schema([("reward_version", pa.string()), ("key", pa.string()), ("reward", pa.float64()),
                    ("components", pa.string()), ("info", pa.string()), ("check", pa.string())],
                   metadata={FORMAT_KEY: FORMAT.encode()})

Scored = tuple[float | None, dict[str, float] | None, dict[str, Any]]
Entry = tuple[str, str, float, str, str]  # (reward_version, key, reward, components JSON, info JSON)
log = logging.getLogger("arlctl.reward_cache")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def item_key(final_state: str | None, task: dict[str, Any], response_text: str, turns: Sequence[str] = ()) -> str:
    """The content key of one scored row: sha256 of the canonical JSON of what a reward reads."""
    blob = _canonical({"final_state": final_state, "task": task, "response_text": response_text,
                       "turns": list(turns)})
    return hashlib.sha256(blob).hexdigest()


def group_keys(member_keys: Sequence[str]) -> list[str]:
    """The keys of a group's members for a group reward: each member's own key plus the whole group's."""
    group = hashlib.sha256(",".join(member_keys).encode()).hexdigest()
    return [hashlib.sha256(f"group:{key}:{group}".encode()).hexdigest() for key in member_keys]


def checksum(entry: Entry) -> str:
    """What a row's `check` column holds: sha256 of its values (repr keeps every bit of the float)."""
    version, key, reward, components, info = entry
    return hashlib.sha256(_canonical([version, key, repr(float(reward)), components, info])).hexdigest()[:32]


def _table(entries: list[Entry]) -> pa.Table:
    columns = [list(col) for col in zip(*entries, strict=True)] if entries else [[] for _ in range(5)]
    return pa.Table.from_pydict(dict(zip(SCHEMA.names, [*columns, [checksum(e) for e in entries]], strict=True)),
                                schema=SCHEMA)


def _read_rows(path: str, warnings: list[str]) -> Iterator[Entry] | None:
    """The entries of one cache file whose checksum holds; None (and a warning) when it cannot be read."""
    fs, fs_path = get_fs(path)
    try:
        with fs.open(fs_path, "rb") as fh:
            table = pq.read_table(fh)
        if (table.schema.metadata or {}).get(FORMAT_KEY) != FORMAT.encode():
            raise ValueError(f"not a reward cache file of format {FORMAT}")
        table = table.select(SCHEMA.names).cast(SCHEMA)
    except Exception as err:  # a damaged file is only lost work: recompute, never a wrong reward
        _warn(warnings, f"reward cache: ignoring {path}: {type(err).__name__}: {' '.join(str(err).split())[:200]}")
        return None
    columns = [table.column(name).to_pylist() for name in SCHEMA.names]
    good: list[Entry] = []
    for *values, check in zip(*columns, strict=True):
        entry: Entry = tuple(values)  # type: ignore[assignment]
        if None not in entry and checksum(entry) == check:
            good.append(entry)
    if len(good) < table.num_rows:
        _warn(warnings, f"reward cache: ignoring {table.num_rows - len(good)} of {table.num_rows} rows of {path}: "
                        "their values do not match their checksum (the file was changed or damaged)")
    return iter(good)


def _warn(warnings: list[str], message: str) -> None:
    warnings.append(message)
    log.warning(message)


class RewardCache:
    """Entries loaded from `url` at construction; new entries kept in memory until `flush` writes them.

    versions: keep only entries of these reward versions in memory (None: all); a run needs only its own.
    flush_s: also write new entries while a shard is scored, at most every flush_s seconds (None: only on
    `flush`). hits / misses count (row, reward) lookups made by the reward stage: a composite reward
    looks up each of its components (arlctl/rewards/composite.py).
    """

    def __init__(self, url: str, versions: set[str] | None = None, flush_s: float | None = None):
        self.url, self.versions, self.flush_s = url, versions, flush_s
        self.entries: dict[tuple[str, str], tuple[float, str, str]] = {}  # (version, key) -> stored values
        self.pending: list[Entry] = []
        self.hits = self.misses = 0
        self.warnings: list[str] = []
        self.loaded: list[str] = []  # the files read at open
        self._last_flush = time.monotonic()
        for path in self._files():  # sorted by creation time: a later file's entry wins (they agree anyway)
            rows = _read_rows(path, self.warnings)
            if rows is None:
                continue
            self.loaded.append(path)
            for version, key, reward, components, info in rows:
                if versions is None or version in versions:
                    self.entries[(version, key)] = (reward, components, info)

    def _files(self) -> list[str]:
        names = sorted(name for name in list_files(self.url) if "/" not in name and not is_hidden(name)
                       and name.startswith(FILE_PREFIX + "-") and name.endswith(".parquet"))
        return [join(self.url, name) for name in names]

    def get(self, version: str, key: str) -> Scored | None:
        """The stored (reward, components, info), or None when there is no entry."""
        found = self.entries.get((version, key))
        if found is None:
            return None
        reward, components, info = found
        return reward, json.loads(components), json.loads(info)

    def put(self, version: str, key: str, scored: Scored) -> None:
        """Remember a result; a null reward (a row that could not be graded) is never stored."""
        reward, components, info = scored
        if reward is None or components is None or not math.isfinite(reward):
            return
        values = (float(reward), _canonical(components).decode(), _canonical(info).decode())
        if self.entries.get((version, key)) == values:
            return
        self.entries[(version, key)] = values
        self.pending.append((version, key, *values))
        if self.flush_s is not None and time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> str | None:
        """Write the entries added since the last flush as one new file (atomically); its URL, or None."""
        self._last_flush = time.monotonic()
        if not self.pending:
            return None
        written = write_table_atomic(_table(self.pending), join(self.url, shard_name(FILE_PREFIX)))
        self.pending = []
        return written

    def compact(self, at: int = COMPACT_AT) -> str | None:
        """With more than `at` files read at open, merge them into one new file, then delete them, so that
        opening the cache stays a few reads. Every version is kept (each file is read again, one at a
        time, whatever `versions` says). Another process that lists a deleted file just before it goes
        only warns and recomputes: nothing is lost, because the merged file is committed first."""
        if len(self.loaded) <= at:
            return None
        sources, dropped = list(self.loaded), []

        def write(fh: BinaryIO) -> None:
            with pq.ParquetWriter(fh, SCHEMA, compression="zstd") as writer:
                for path in sources:
                    rows = _read_rows(path, self.warnings)
                    if rows is None:  # gone or damaged since open: not deleted below, nothing merged
                        dropped.append(path)
                        continue
                    writer.write_table(_table(list(rows)))

        merged = write_file(join(self.url, shard_name(FILE_PREFIX)), write)
        fs, _ = get_fs(self.url)
        for path in sources:
            if path not in dropped:
                try:
                    fs.rm(get_fs(path)[1])
                except FileNotFoundError:  # another process compacted it first
                    pass
        self.loaded = [merged]
        return merged
