"""Buffered shard writer for producers that emit rows in groups (rollout, serve).

Groups are never split across shards. A shard is committed every `flush_groups` groups or
`flush_seconds` seconds, whichever comes first, and on close. The write itself runs in a thread so an
event loop keeps generating while Parquet is encoded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from arlctl.io.fs import join
from arlctl.io.shards import Lineage, shard_name, write_shard
from arlctl.schemas.rows import TrajectoryRow, rows_to_table


class GroupShardWriter:
    def __init__(self, out: str, lineage: Callable[[], Lineage], flush_groups: int = 16,
                 flush_seconds: float = 60.0, prefix: str = "part", dry_run: bool = False):
        self.out = out
        self.lineage = lineage
        self.flush_groups = flush_groups
        self.flush_seconds = flush_seconds
        self.prefix = prefix
        self.dry_run = dry_run
        self._rows: list[TrajectoryRow] = []
        self._groups = 0
        self._last_flush = time.monotonic()
        self._lock = asyncio.Lock()
        self.written: list[str] = []
        self.rows_written = 0

    async def add_group(self, rows: list[TrajectoryRow]) -> None:
        async with self._lock:
            self._rows.extend(rows)
            self._groups += 1
            due = self._groups >= self.flush_groups or time.monotonic() - self._last_flush >= self.flush_seconds
            if due:
                await self._flush()

    async def flush(self) -> None:
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        """Commit the buffer as one shard; the rows leave the buffer only once the shard is written, so a
        failed write (full disk, a value Arrow refuses) loses nothing and the next flush tries again."""
        if not self._rows:
            return
        rows = self._rows
        self._last_flush = time.monotonic()
        if not self.dry_run:
            url, lineage = join(self.out, shard_name(self.prefix)), self.lineage()
            written = await asyncio.to_thread(lambda: write_shard(rows_to_table(rows), url, lineage))
            self.written.append(written)
        self._rows, self._groups = [], 0
        self.rows_written += len(rows)
