"""Sandboxes where model-written code runs: the Sandbox protocol (base.py), backends and a warm pool.

    sb = await make_sandbox("bwrap", "/path/to/repo", memory_mb=1024)
    pool = make_pool("bwrap", "/path/to/repo", size=8); await pool.start()

    async with pool.acquire(snapshot="/path/to/task-42") as sb: ...   # one pool, many task snapshots

Backends: `bwrap` (bwrap.py, the default on Linux), `docker` (docker.py) and `subprocess` (process.py,
insecure, refused unless insecure=True, i.e. the CLI's --insecure-sandbox). The protocol includes what
the pool needs: `health()`, `set_snapshot(path)`, and the `tainted` flag with its `taint_reason` (set
after a timeout, OOM kill or crash) that make the pool replace rather than reuse a sandbox.
"""

from __future__ import annotations

from typing import Any

from arlctl.errors import UsageError
from arlctl.sandbox.base import ExecResult, Sandbox, SandboxError
from arlctl.sandbox.pool import PoolExhausted, PoolStats, SandboxPool

KINDS = ("bwrap", "docker", "subprocess")


def _check_kind(kind: str, insecure: bool) -> None:
    if kind not in KINDS:
        raise UsageError(f"unknown sandbox kind {kind!r}", hint=f"choose one of {', '.join(KINDS)}")
    if kind == "subprocess" and not insecure:
        raise UsageError(
            "the subprocess sandbox runs code directly on this host with rlimits only",
            hint="use --sandbox bwrap or docker; pass --insecure-sandbox only for trusted code",
        )


async def make_sandbox(
    kind: str, snapshot: str | None = None, *, insecure: bool = False, **limits: Any
) -> Sandbox:
    """Create and start one sandbox whose workspace starts as a copy of `snapshot` (a directory).

    `limits` go to the backend: memory_mb, pids, disk_mb, max_output_bytes, env for all; python and
    ro_binds for bwrap; image, cpus, user, docker_host for docker.
    """
    _check_kind(kind, insecure)
    if kind == "bwrap":
        from arlctl.sandbox.bwrap import BwrapSandbox

        return await BwrapSandbox.create(snapshot, **limits)
    if kind == "docker":
        from arlctl.sandbox.docker import DockerSandbox

        return await DockerSandbox.create(snapshot, **limits)
    from arlctl.sandbox.process import SubprocessSandbox

    return await SubprocessSandbox.create(snapshot, **limits)


def make_pool(
    kind: str,
    snapshot: str | None = None,
    size: int = 4,
    *,
    insecure: bool = False,
    max_wait_s: float = 300.0,
    **limits: Any,
) -> SandboxPool:
    """A warm pool of `size` sandboxes of one kind and snapshot; `await pool.start()` (or `async with`)."""
    _check_kind(kind, insecure)
    return SandboxPool(
        lambda: make_sandbox(kind, snapshot, insecure=insecure, **limits), size=size, max_wait_s=max_wait_s
    )


__all__ = [
    "KINDS",
    "ExecResult",
    "PoolExhausted",
    "PoolStats",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "make_pool",
    "make_sandbox",
]
