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
A sandbox that breaks while its lease is being prepared (switching it to the task's snapshot), before
the caller has run anything in it, is replaced and the acquire tries another one: nothing was lost yet.
Such moves (and sandboxes skipped for a failed health check) are reported to a caller that asks
(`acquire(moves=[])`), each as the sandbox's `placement()` and a cause: rollout rows record them.

Sandboxes spread over several engines (docker hosts) are placed by `EngineSet`: the engine with the most
free capacity (its limit minus the sandboxes it holds; ties go to the least loaded) gets the next one; an
engine found unreachable is ejected, new sandboxes go to the others, and it is tried again after a
backoff that doubles while it stays down. The backend reserves a slot when it creates a sandbox and
releases it when the sandbox closes, so every pool of a run (one per task snapshot) sees the same counts.
When the backend says which engines already hold the sandbox's image (`reserve(holding=...)`), those
come first and capacity decides among them: a SWE-bench image is gigabytes, so an engine without it
would have to pull it (or cannot start the sandbox at all); it gets the sandbox only when no engine that
holds the image has room. The backend counts each start as an image hit or miss of its engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from arlctl.errors import TransientError
from arlctl.sandbox.base import Sandbox, SandboxError, placement_of

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
        start_concurrency: int = 16,
    ):
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.start_concurrency = max(1, start_concurrency)
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
        """Start `size` sandboxes, `start_concurrency` at a time (hundreds booting at once starve each
        other past their start timeout). When none starts, the pool is closed and the first cause raised;
        when only some fail (a loaded engine), the rest are created in the background, with backoff."""
        gate = asyncio.Semaphore(self.start_concurrency)

        async def one() -> Sandbox:
            async with gate:
                return await self.factory()

        results = await asyncio.gather(*(one() for _ in range(self.size)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        for sb in results:
            if not isinstance(sb, BaseException):
                self._all.add(sb)
                self._idle.put_nowait(sb)
        if failures and (not self._all or any(not isinstance(f, Exception) for f in failures)):
            await self.close()
            raise SandboxError(
                f"could not start {len(failures)} of {self.size} sandboxes: {failures[0]}"
            ) from failures[0]
        if failures:
            self._create_failures += len(failures)
            log.warning(
                "%d of %d sandboxes failed to start (%s); creating them in the background",
                len(failures),
                self.size,
                failures[0],
            )
            for _ in failures:
                self._spawn(self._create_one())
        return self

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def acquire(
        self, snapshot: str | None = None, moves: list[dict] | None = None
    ) -> AsyncIterator[Sandbox]:
        """Hold a healthy sandbox; with `snapshot`, its workspace is first switched to that task's snapshot,
        so one pool can serve many tasks.

        moves: when given, every sandbox this acquire gave up before handing one out (it failed its health
        check, or broke while switching to `snapshot`) is appended as its placement() with the `cause`, so
        the caller can record where its work moved from (schema v3 env_info `replaced_from`)."""
        sb = await self._prepared(snapshot, moves=moves)
        spoiled = False
        try:
            yield sb
        except SandboxError:
            spoiled = True
            raise
        finally:
            self._spawn(self._recycle(sb, spoiled or sb.tainted))

    async def _prepared(
        self, snapshot: str | None, attempts: int = 3, moves: list[dict] | None = None
    ) -> Sandbox:
        """A healthy sandbox switched to `snapshot`. One that breaks while switching (tainted: its engine
        died, say) is replaced and another is tried: the caller has run nothing in it, so nothing is lost."""
        for attempt in range(attempts):
            sb = await self._take(moves)
            if snapshot is None or sb.snapshot == snapshot:
                return sb
            try:
                await sb.set_snapshot(snapshot)
                return sb
            except SandboxError as e:
                self._spawn(self._recycle(sb, spoiled=True))
                if not sb.tainted or attempt == attempts - 1:
                    raise  # untainted: the snapshot, not the sandbox, is at fault; another would fail alike
                _note_move(moves, sb, sb.taint_reason or "switch_failed")
                log.warning("sandbox failed while switching to %s (%s); trying another", snapshot, e)
            except BaseException:
                self._spawn(self._recycle(sb, sb.tainted))
                raise
        raise AssertionError("unreachable")

    async def _take(self, moves: list[dict] | None = None) -> Sandbox:
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
            _note_move(moves, sb, "health_check")
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
        await self._create_one()

    async def _create_one(self) -> None:
        """Create one sandbox for the idle queue, retrying with backoff until it starts or the pool closes."""
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


def _note_move(moves: list[dict] | None, sb: Sandbox, cause: str) -> None:
    """Record a sandbox an acquire gave up (see acquire's `moves`)."""
    if moves is not None:
        moves.append({**placement_of(sb), "cause": cause})


async def _close_quietly(sb: Sandbox) -> None:
    try:
        await sb.close()
    except Exception as e:
        log.warning("closing a sandbox failed: %s", e)


# ---- placement over several engines ---------------------------------------------------------------


class EnginesUnavailable(SandboxError):
    """No engine can take another sandbox now: every one is ejected (unreachable) or at its limit.
    `reasons` says why, per engine (what the message lists), for a caller that reports them its own way."""

    def __init__(self, message: str, reasons: dict[str, str] | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reasons = reasons or {}


@dataclass
class EngineState:
    """One engine as the placement sees it. `limit` None means no limit of its own."""

    name: str
    limit: int | None = None
    count: int = 0  # sandboxes it holds now (reserved, starting or running)
    placed: int = 0  # sandboxes ever placed on it
    ejections: int = 0
    ejected_until: float = 0.0  # monotonic time of its next trial; 0 while it is up
    backoff_s: float = 0.0  # the wait after its latest ejection (doubles while it stays down)
    on_trial: bool = False  # one placement is testing whether an ejected engine is back
    last_error: str | None = None
    last_pick: int = 0  # placement sequence number of its latest pick (ties between equals rotate)
    image_hits: int = 0  # sandboxes started here that found their image already on this engine
    image_misses: int = 0  # starts here that found their image missing (failed, or pulled it)

    @property
    def up(self) -> bool:
        return self.ejected_until == 0.0

    @property
    def free(self) -> float:
        return math.inf if self.limit is None else self.limit - self.count

    def to_json(self) -> dict:
        return {
            "engine": self.name,
            "up": self.up,
            "count": self.count,
            "limit": self.limit,
            "placed": self.placed,
            "ejections": self.ejections,
            "last_error": self.last_error,
            "image_hits": self.image_hits,
            "image_misses": self.image_misses,
        }


class EngineSet:
    """Which engine gets the next sandbox, and which engines are out for now (see the module docstring).

    reserve() picks and counts a slot; the backend calls confirm() once the sandbox runs (readmitting an
    engine on trial), release() when it closes, and eject() when it finds the engine unreachable.
    Thread-safe: backends create sandboxes in worker threads.
    """

    def __init__(
        self,
        engines: Iterable[tuple[str, int | None]],
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engines = {name: EngineState(name, limit) for name, limit in engines}
        if not self.engines:
            raise ValueError("an engine set needs at least one engine")
        self.backoff_s, self.max_backoff_s, self.clock = backoff_s, max_backoff_s, clock
        self._lock = threading.Lock()
        self._picks = 0

    def reserve(self, exclude: Iterable[str] = (), holding: Iterable[str] | None = None) -> str:
        """The engine with the most free capacity (ties: fewest sandboxes, then the one picked longest
        ago), its count already raised; EnginesUnavailable when none can take one.

        holding: the engines known to hold the sandbox's image. Given, only those are considered while
        one of them can take the sandbox; the others only when none can (that start then pulls the image
        or fails, and the backend says so through image_placed())."""
        skip = set(exclude)
        with self._lock:
            now = self.clock()
            candidates = [
                e
                for e in self.engines.values()
                if e.name not in skip and e.free > 0 and self._placeable(e, now)
            ]
            if not candidates:
                reasons = self._why_none(skip, now)
                raise EnginesUnavailable(
                    "no docker engine can take another sandbox: "
                    + "; ".join(f"{name}: {why}" for name, why in reasons.items()),
                    reasons,
                    hint="check the engines (arlctl sandbox prefetch) or raise their limits",
                )
            holders = None if holding is None else set(holding)
            if holders is not None:
                local = [e for e in candidates if e.name in holders]
                candidates = local or candidates
            best = min(candidates, key=lambda e: (-e.free, e.count, e.last_pick))
            if not best.up:
                best.on_trial = True  # the only placement until it proves the engine is back
            self._picks += 1
            best.count, best.placed, best.last_pick = best.count + 1, best.placed + 1, self._picks
            return best.name

    @staticmethod
    def _placeable(e: EngineState, now: float) -> bool:
        """Up, or ejected with its backoff over and no trial placement under way."""
        return e.up or (now >= e.ejected_until and not e.on_trial)

    def placeable(self) -> list[str]:
        """The engines reserve() could pick now, room aside: the ones worth asking about an image."""
        with self._lock:
            now = self.clock()
            return [e.name for e in self.engines.values() if self._placeable(e, now)]

    def _why_none(self, skip: set[str], now: float) -> dict[str, str]:
        """Why each engine cannot take a sandbox now: {name: reason}."""
        reasons = {}
        for e in self.engines.values():
            if e.name in skip:
                reasons[e.name] = "failed just now"
            elif not e.up:
                reasons[e.name] = f"unreachable, retried in {max(0.0, e.ejected_until - now):.1f}s" + (
                    f" ({e.last_error})" if e.last_error else ""
                )
            else:
                reasons[e.name] = f"at its limit ({e.count}/{e.limit})"
        return reasons

    def confirm(self, name: str) -> None:
        """A sandbox placed on `name` runs: an engine on trial is back in the set."""
        with self._lock:
            e = self.engines[name]
            if not e.up:
                log.warning("engine %s answers again; placing sandboxes on it", name)
            e.ejected_until, e.backoff_s, e.on_trial = 0.0, 0.0, False

    def image_placed(self, name: str, local: bool) -> None:
        """What a start on `name` found: its image there (local: a hit) or not (a miss: the start failed
        with image-not-found, or had to pull). Counted here, not at reserve(), since what placement knew
        of an engine's images may be out of date."""
        with self._lock:
            e = self.engines[name]
            if local:
                e.image_hits += 1
            else:
                e.image_misses += 1

    def release(self, name: str) -> None:
        with self._lock:
            e = self.engines[name]
            e.count = max(0, e.count - 1)
            e.on_trial = False  # a trial that ended without a verdict (cancelled): the next one may try

    def eject(self, name: str, cause: str) -> None:
        """`name` is unreachable: place nothing there until its backoff has passed, then try one sandbox."""
        with self._lock:
            e = self.engines[name]
            e.last_error = cause
            if not e.up and self.clock() < e.ejected_until:
                return  # already out; the backoff runs from the first report
            e.backoff_s = min(self.max_backoff_s, e.backoff_s * 2 if e.backoff_s else self.backoff_s)
            e.ejected_until, e.on_trial = self.clock() + e.backoff_s, False
            e.ejections += 1
        log.warning("engine %s is unreachable (%s); ejected, retried in %.1fs", name, cause, e.backoff_s)

    def is_up(self, name: str) -> bool:
        with self._lock:
            return self.engines[name].up

    def stats(self) -> list[dict]:
        with self._lock:
            return [e.to_json() for e in self.engines.values()]
