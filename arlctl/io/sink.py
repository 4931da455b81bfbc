"""Buffered shard writer for producers that emit rows in groups (rollout, serve).

Groups are never split across shards. A shard is committed every `flush_groups` groups or
`flush_seconds` seconds, whichever comes first, and on close. The write itself runs in a thread so an
event loop keeps generating while Parquet is encoded.

Each group is converted and validated when it is added: a group the schema refuses raises there and
never enters the buffer, so it cannot poison the groups written with it. A write that fails (full disk,
an unreachable store) keeps the buffered groups for the next flush: nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pyarrow as pa

from arlctl.io.fs import join
from arlctl.io.shards import Lineage, shard_name, write_shard
from arlctl.schemas.rows import TrajectoryRow, rows_to_table
from arlctl.schemas.trajectory import validate


class GroupShardWriter:
    def __init__(self, out: str, lineage: Callable[[], Lineage], flush_groups: int = 16,
                 flush_seconds: float = 60.0, prefix: str = "part", dry_run: bool = False):
        self.out = out
        self.lineage = lineage
        self.flush_groups = flush_groups
        self.flush_seconds = flush_seconds
        self.prefix = prefix
        self.dry_run = dry_run
        self._tables: list[pa.Table] = []  # one per buffered group, each already valid
        self._last_flush = time.monotonic()
        self._lock = asyncio.Lock()
        self.written: list[str] = []
        self.rows_written = 0

    async def add_group(self, rows: list[TrajectoryRow]) -> None:
        table = await asyncio.to_thread(_valid_table, rows)  # a bad group raises here, alone
        async with self._lock:
            self._tables.append(table)
            due = len(self._tables) >= self.flush_groups or time.monotonic() - self._last_flush >= self.flush_seconds
            if due:
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
        table = pa.concat_tables(tables)
        if not self.dry_run:
            url, lineage = join(self.out, shard_name(self.prefix)), self.lineage()
            written = await asyncio.to_thread(write_shard, table, url, lineage)
            self.written.append(written)
        del self._tables[: len(tables)]
        self.rows_written += table.num_rows


def _valid_table(rows: list[TrajectoryRow]) -> pa.Table:
    table = rows_to_table(rows)
    validate(table)
    return table
