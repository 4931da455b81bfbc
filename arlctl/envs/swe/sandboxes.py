"""Where SweEnv gets its sandboxes: warm pools per task snapshot, shared by the envs of one run.

The rollout makes one SweEnv per trajectory from one `SweEnvFactory` (env.py); they share the factory's
`PoolProvider`, which keeps one warm pool per repository snapshot (and per image, for image tasks), at
most `max_pools` pools alive (idle ones are closed least recently used first), and at most `sandboxes`
sandboxes held at once. The factory owns the provider and closes it in `aclose()`; nothing here is
process-global. Tests and callers may pass their own provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from typing import Any, Protocol

from arlctl.sandbox.base import Sandbox
from arlctl.sandbox.pool import SandboxPool


class Lease(Protocol):
    sandbox: Sandbox
    # Sandboxes the pool gave up before this one (placement and cause; SandboxPool.acquire's `moves`).
    # Optional: a provider whose leases have no `moves` reports none.
    moves: list[dict[str, Any]]

    async def release(self) -> None: ...


class Provider(Protocol):
    async def acquire(self, snapshot: str, options: dict[str, Any] | None = None) -> Lease:
        """A sandbox on `snapshot`; `options` are backend options the task needs (image tasks: image,
        workdir, env), which a provider over one fixed pool may ignore."""
        ...


class _PoolLease:
    def __init__(self, sandbox: Sandbox, context: contextlib.AbstractAsyncContextManager, on_release=None,
                 moves: list[dict[str, Any]] | None = None):
        self.sandbox, self._context, self._on_release = sandbox, context, on_release
        self.moves = moves if moves is not None else []
        self._released = False

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            await self._context.__aexit__(None, None, None)  # the pool resets or replaces it
        finally:
            if self._on_release is not None:
                self._on_release()


async def lease_from(pool: SandboxPool, on_release=None) -> _PoolLease:
    moves: list[dict[str, Any]] = []
    context = pool.acquire(moves=moves)
    sandbox = await context.__aenter__()
    return _PoolLease(sandbox, context, on_release, moves)


class PoolProvider:
    def __init__(self, kind: str = "bwrap", sandboxes: int = 8, pool_size: int = 2, max_pools: int | None = None,
                 insecure: bool = False, **limits: Any):
        self.kind, self.insecure, self.limits = kind, insecure, limits
        self.pool_size = max(1, min(pool_size, sandboxes))
        self.max_pools = max_pools or max(2, sandboxes)
        self._slots = asyncio.Semaphore(sandboxes)
        self._pools: OrderedDict[str, SandboxPool] = OrderedDict()
        self._held: dict[str, int] = {}
        self._lock = asyncio.Lock()

    async def _pool(self, snapshot: str, key: str, options: dict[str, Any]) -> SandboxPool:
        from arlctl.sandbox import make_pool

        async with self._lock:
            # Count the hold under the lock, so eviction never closes a pool someone is about to use.
            self._held[key] = self._held.get(key, 0) + 1
            if key in self._pools:
                self._pools.move_to_end(key)
                return self._pools[key]
            while len(self._pools) >= self.max_pools:
                idle = next((s for s in self._pools if not self._held.get(s)), None)
                if idle is None:
                    break
                await self._pools.pop(idle).close()
            limits = {**self.limits, **options}
            if "env" in options:
                limits["env"] = {**(self.limits.get("env") or {}), **options["env"]}
            pool = make_pool(self.kind, snapshot, size=self.pool_size, insecure=self.insecure, **limits)
            try:
                await pool.start()
            except BaseException:
                self._held[key] -= 1
                raise
            self._pools[key] = pool
            return pool

    async def acquire(self, snapshot: str, options: dict[str, Any] | None = None) -> Lease:
        key = snapshot if not options else f"{snapshot}|{json.dumps(options, sort_keys=True)}"
        await self._slots.acquire()
        try:
            pool = await self._pool(snapshot, key, options or {})
        except BaseException:
            self._slots.release()
            raise
        try:
            return await lease_from(pool, on_release=lambda: self._done(key))
        except BaseException:
            self._done(key)
            raise

    def _done(self, key: str) -> None:
        self._held[key] -= 1
        self._slots.release()

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), OrderedDict()
        for pool in pools:
            await pool.close()
