"""Buffered shard writer for producers that emit rows in groups (rollout, serve).

Groups are never split across shards. A shard is committed every `flush_groups` groups or
`flush_seconds` seconds, whichever comes first, and on close. All Arrow and Parquet work (building and
validating a group's table, concatenating the buffer, encoding and writing the shard) runs on the
writer threads, never on the event loop, so a loop with thousands of trajectories in flight keeps
generating while a shard is written. Two threads, shared by every writer in the process: each one that
runs Python competes with the loop for the GIL, so there are few.

Each group is converted and validated when it is added: a group the schema refuses raises there and
never enters the buffer, so it cannot poison the groups written with it. A write that fails (full disk,
an unreachable store) keeps the buffered groups for the next flush: nothing is lost. A flush takes the
groups buffered when it starts and removes exactly those once their shard is committed; groups added
while it writes stay buffered for the next one, so every row is written exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from arlctl.io.fs import join
from arlctl.io.shards import Lineage, shard_name, write_shard
from arlctl.schemas.rows import TrajectoryRow, rows_to_table
from arlctl.schemas.trajectory import validate

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _writer_threads() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="arlctl-sink")
        return _executor


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_writer_threads(), fn, *args)


# How groups flush into shards (the defaults of rollout's --flush-groups, --flush-seconds and --prefix).
FLUSH_GROUPS = 16
FLUSH_SECONDS = 60.0
SHARD_PREFIX = "part"


class GroupShardWriter:
    def __init__(self, out: str, lineage: Callable[[], Lineage], flush_groups: int = FLUSH_GROUPS,
                 flush_seconds: float = FLUSH_SECONDS, prefix: str = SHARD_PREFIX, dry_run: bool = False):
        self.out = out
        self.lineage = lineage
        self.flush_groups = flush_groups
        self.flush_seconds = flush_seconds
        self.prefix = prefix
        self.dry_run = dry_run
        self._tables: list[pa.Table] = []  # one per buffered group, each already valid
        self._last_flush = time.monotonic()
        self._lock = asyncio.Lock()  # one flush at a time
        self.written: list[str] = []
        self.rows_written = 0

    async def add_group(self, rows: list[TrajectoryRow]) -> None:
        """Buffer a group (raising here if the schema refuses it); commit a shard when one is due.

        When another caller's flush is already writing, this one does not wait for it: its group stays
        buffered for the next flush (the due check runs again on the next group, and flush() at the end).
        """
        table = await _off_loop(valid_table, rows)  # a bad group raises here, alone
        self._tables.append(table)
        due = len(self._tables) >= self.flush_groups or time.monotonic() - self._last_flush >= self.flush_seconds
        if due and not self._lock.locked():
            async with self._lock:
                await self._flush()

    async def flush(self) -> None:
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        """Commit the buffer as one shard; the rows leave the buffer only once the shard is written, so a
        failed write (full disk, a value Arrow refuses) loses nothing and the next flush tries again."""
        if not self._tables:
            return
        tables = list(self._tables)
        self._last_flush = time.monotonic()
        if self.dry_run:
            rows = sum(t.num_rows for t in tables)
        else:
            url, lineage = join(self.out, shard_name(self.prefix)), self.lineage()
            written, rows = await _off_loop(write_tables, tables, url, lineage)
            self.written.append(written)
        del self._tables[: len(tables)]
        self.rows_written += rows


def valid_table(rows: list[TrajectoryRow]) -> pa.Table:
    """The rows as one validated table (a bad row raises here, before anything is written)."""
    table = rows_to_table(rows)
    validate(table)
    return table


def write_tables(tables: list[pa.Table], url: str, lineage: Lineage) -> tuple[str, int]:
    """The tables as one shard at `url`: (the shard written, its rows)."""
    table = pa.concat_tables(tables)
    return write_shard(table, url, lineage), table.num_rows
