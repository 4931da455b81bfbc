"""Every backend is a full Sandbox: the protocol declares what the pool uses (health, snapshot, tainted,
taint_reason, set_snapshot), so the pool calls them directly."""

from __future__ import annotations

import asyncio

from sandbox_helpers import LIMITS

from arlctl.sandbox import make_sandbox
from arlctl.sandbox.base import Sandbox


async def _members(kind: str, snapshot: str) -> tuple:
    sb = await make_sandbox(kind, snapshot, insecure=True, **LIMITS)
    try:
        return isinstance(sb, Sandbox), sb.snapshot, sb.tainted, sb.taint_reason, await sb.health(5.0)
    finally:
        await sb.close()


def test_every_backend_is_a_full_sandbox(backend, snapshot):
    assert asyncio.run(_members(backend, str(snapshot))) == (True, str(snapshot), False, None, True)


def test_the_subprocess_backend_is_a_full_sandbox(snapshot):
    assert asyncio.run(_members("subprocess", str(snapshot))) == (True, str(snapshot), False, None, True)


def test_the_pool_replaces_a_tainted_sandbox_and_names_the_cause(backend, pool_factory):
    """A timeout taints the sandbox; on release the pool replaces it, counting the backend's reason."""

    async def go():
        async with pool_factory(backend) as pool:
            async with pool.acquire() as sb:
                result = await sb.exec("sleep 30", timeout=0.5)
                tainted, reason = sb.tainted, sb.taint_reason
            await pool.drain()
            return result.timed_out, tainted, reason, pool.stats()

    timed_out, tainted, reason, stats = asyncio.run(go())
    assert timed_out and tainted
    # docker names why (timeout); bwrap has no finer cause, so the pool counts "tainted"
    assert stats.replacements == 1 and stats.replacement_causes == {reason or "tainted": 1}, stats
