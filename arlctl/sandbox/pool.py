"""A warm pool of sandboxes: pre-started, health-checked on acquire, reset on release, replaced when spoiled.

    pool = SandboxPool(lambda: make_sandbox("bwrap", snapshot), size=8)
    await pool.start()
    async with pool.acquire() as sb:
        await sb.exec("python3 -m pytest -q")
    print(pool.stats())

Release never blocks the caller: the returned sandbox is reset (workspace back to its pristine snapshot,
leftover processes killed) in the background and only then goes back to the idle queue. A sandbox that
timed out, was OOM-killed, raised SandboxError or fails its health check is closed and replaced by a
fresh one rather than reused; `stats().replacement_causes` counts why (the backend's `taint_reason`
when it gives one: timeout, oom, pids_limit, ...; else tainted, error, reset_failed, health_check).
Waiting for a free sandbox is bounded (`max_wait_s`); the time every acquire spent queued is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from arlctl.errors import TransientError
from arlctl.sandbox.base import Sandbox, SandboxError

log = logging.getLogger(__name__)


class PoolExhausted(TransientError):
    """No sandbox became free within the pool's bounded wait."""


@dataclass
class PoolStats:
    size: int
    idle: int
    acquires: int
    queue_wait_p50_ms: float
    queue_wait_p99_ms: float
    queue_wait_max_ms: float
    replacements: int
    resets: int
    health_failures: int
    create_failures: int
    replacement_causes: dict[str, int] = field(default_factory=dict)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class SandboxPool:
    def __init__(
        self,
        factory: Callable[[], Awaitable[Sandbox]],
        size: int,
        max_wait_s: float = 300.0,
        health_timeout_s: float = 2.0,
    ):
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.factory, self.size, self.max_wait_s = factory, size, max_wait_s
        self.health_timeout_s = health_timeout_s
        self._idle: asyncio.Queue[Sandbox] = asyncio.Queue()
        self._all: set[Sandbox] = set()
        self._background: set[asyncio.Task] = set()
        self._waits_s: deque[float] = deque(maxlen=100_000)
        self._acquires = self._replacements = self._resets = self._health_failures = self._create_failures = 0
        self._causes: Counter[str] = Counter()
        self._closed = False

    async def start(self) -> SandboxPool:
        results = await asyncio.gather(*(self.factory() for _ in range(self.size)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        for sb in results:
            if not isinstance(sb, BaseException):
                self._all.add(sb)
                self._idle.put_nowait(sb)
        if failures:
            await self.close()
            raise SandboxError(
                f"could not start {len(failures)} of {self.size} sandboxes: {failures[0]}"
            ) from failures[0]
        return self

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def acquire(self, snapshot: str | None = None) -> AsyncIterator[Sandbox]:
        """Hold a healthy sandbox; with `snapshot`, its workspace is first switched to that task's snapshot,
        so one pool can serve many tasks."""
        sb = await self._take()
        spoiled = False
        try:
            if snapshot is not None and sb.snapshot != snapshot:
                await sb.set_snapshot(snapshot)
            yield sb
        except SandboxError:
            spoiled = True
            raise
        finally:
            self._spawn(self._recycle(sb, spoiled or sb.tainted))

    async def _take(self) -> Sandbox:
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        t0 = time.monotonic()
        while True:
            remaining = self.max_wait_s - (time.monotonic() - t0)
            try:
                sb = await asyncio.wait_for(self._idle.get(), max(remaining, 0.0))
            except TimeoutError as e:
                raise PoolExhausted(
                    f"no sandbox free within {self.max_wait_s:.0f}s (pool size {self.size})",
                    hint="raise --sandboxes or lower --concurrency",
                ) from e
            if await self._healthy(sb):
                self._waits_s.append(time.monotonic() - t0)
                self._acquires += 1
                return sb
            self._health_failures += 1
            self._spawn(self._replace(sb, "health_check"))

    async def _healthy(self, sb: Sandbox) -> bool:
        try:
            return bool(await sb.health(self.health_timeout_s))
        except Exception:  # any failure to answer is a failed check, never an error for the caller
            return False

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _recycle(self, sb: Sandbox, spoiled: bool) -> None:
        if self._closed:
            await _close_quietly(sb)
            return
        if not spoiled:
            try:
                await sb.reset()
                self._resets += 1
                self._idle.put_nowait(sb)
                return
            except Exception as e:
                log.warning("sandbox reset failed (%s); replacing it", e)
                await self._replace(sb, "reset_failed")
                return
        await self._replace(sb, sb.taint_reason or ("tainted" if sb.tainted else "error"))

    async def _replace(self, sb: Sandbox, cause: str) -> None:
        self._all.discard(sb)
        self._replacements += 1
        self._causes[cause] += 1
        await _close_quietly(sb)
        delay = 0.1
        while not self._closed:
            try:
                fresh = await self.factory()
            except Exception as e:
                self._create_failures += 1
                log.warning("could not create a replacement sandbox (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            if self._closed:
                await _close_quietly(fresh)
                return
            self._all.add(fresh)
            self._idle.put_nowait(fresh)
            return

    async def drain(self) -> None:
        """Wait until every background reset and replacement has finished (tests, benchmarks)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def stats(self) -> PoolStats:
        waits = list(self._waits_s)
        return PoolStats(
            size=self.size,
            idle=self._idle.qsize(),
            acquires=self._acquires,
            queue_wait_p50_ms=_percentile(waits, 0.5) * 1e3,
            queue_wait_p99_ms=_percentile(waits, 0.99) * 1e3,
            queue_wait_max_ms=max(waits, default=0.0) * 1e3,
            replacements=self._replacements,
            resets=self._resets,
            health_failures=self._health_failures,
            create_failures=self._create_failures,
            replacement_causes=dict(self._causes),
        )

    async def close(self) -> None:
        self._closed = True
        await self.drain()
        sandboxes = list(self._all)
        self._all.clear()
        await asyncio.gather(*(_close_quietly(sb) for sb in sandboxes))


async def _close_quietly(sb: Sandbox) -> None:
    try:
        await sb.close()
    except Exception as e:
        log.warning("closing a sandbox failed: %s", e)
