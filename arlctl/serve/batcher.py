"""Ended sessions' rows, committed in batches: one shard per `flush_sessions` sessions, not one per session.

Before, serve wrote a shard for every session that ended (3,000 sessions made 3,025 files). Now each
ended session's rows are converted and validated at once (a session the schema refuses fails alone,
before it enters the batch, as in GroupShardWriter), then wait in the batch. A shard is committed when
`flush_sessions` sessions wait, when the oldest has waited `flush_seconds` (the server's flusher task
checks), when a client ends a session explicitly, and when the server stops.

An explicit end (POST /v1/sessions/{id}/end) answers only once the session's rows are committed: a
client that was told its session is written may rely on it (it may delete its own copy, or stop the
server with SIGKILL). `commit(sid)` is a group commit: an end that arrives while a shard is being
written waits for it, and every session that ended meanwhile goes into the next shard together, so
concurrent ends share shards; a harness that ends sessions strictly one after another gets one shard per
session, which is the price of an answer that means "written".

A write that fails (full disk, an unreachable store) keeps the whole batch for the next flush: nothing
is lost, nothing is written twice. The batch knows which session each table holds, so when the last
flush at shutdown fails every session still waiting is named (`unwritten`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from arlctl.io.fs import join
from arlctl.io.shards import Lineage, shard_name
from arlctl.io.sink import valid_table, write_tables
from arlctl.schemas.rows import TrajectoryRow

DEFAULT_FLUSH_SESSIONS = 64
DEFAULT_FLUSH_SECONDS = 10.0
Offload = Callable[..., Awaitable[Any]]  # runs fn(*args) off the event loop (ServeState.offload)


@dataclass
class Waiting:
    session: str
    table: pa.Table  # the session's rows, already valid
    since: float  # time.monotonic() when it ended


class SessionBatcher:
    def __init__(self, out: str, lineage: Callable[[], Lineage], offload: Offload, *, flush_sessions: int,
                 flush_seconds: float, prefix: str = "serve", dry_run: bool = False):
        self.out, self.lineage, self.offload = out, lineage, offload
        self.flush_sessions, self.flush_seconds = flush_sessions, flush_seconds
        self.prefix, self.dry_run = prefix, dry_run
        self.waiting: list[Waiting] = []
        self._lock = asyncio.Lock()  # one write at a time
        self.written: list[str] = []  # shard URLs committed
        self.rows_written = 0
        self.sessions_written = 0

    async def add(self, session: str, rows: list[TrajectoryRow]) -> None:
        """Validate one ended session's rows (raising here, alone, if the schema refuses them) and queue them."""
        table = await self.offload(valid_table, rows)
        self.waiting.append(Waiting(session, table, time.monotonic()))

    def due(self) -> bool:
        """Whether a shard should be committed now: a full batch, or one whose oldest session waited enough."""
        if not self.waiting:
            return False
        return (len(self.waiting) >= self.flush_sessions
                or time.monotonic() - self.waiting[0].since >= self.flush_seconds)

    def pending(self, session: str) -> bool:
        return any(w.session == session for w in self.waiting)

    def rows_of(self, session: str) -> int:
        return sum(w.table.num_rows for w in self.waiting if w.session == session)

    @property
    def unwritten(self) -> list[str]:
        return [w.session for w in self.waiting]

    async def flush(self) -> None:
        """Commit every waiting session as one shard (raises when the write fails; the batch stays)."""
        async with self._lock:
            await self._flush()

    async def flush_if_due(self) -> None:
        if self.due() and not self._lock.locked():
            await self.flush()

    async def commit(self, session: str) -> None:
        """Return once `session`'s rows are committed: by a flush already under way, or by one run here."""
        async with self._lock:
            if self.pending(session):
                await self._flush()

    async def _flush(self) -> None:
        batch = list(self.waiting)
        if not batch:
            return
        tables = [w.table for w in batch]
        if self.dry_run:
            rows = sum(t.num_rows for t in tables)
        else:
            url = join(self.out, shard_name(self.prefix))
            written, rows = await self.offload(write_tables, tables, url, self.lineage())
            self.written.append(written)
        # Sessions that ended while the shard was written are behind the batch: they wait for the next one.
        del self.waiting[:len(batch)]
        self.rows_written += rows
        self.sessions_written += len(batch)
