"""The Sandbox protocol (DESIGN.md §7). Model-written code never runs outside one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from arlctl.errors import TransientError


class SandboxError(TransientError):
    """The sandbox itself failed (not the command inside it). The pool replaces such a sandbox."""


@dataclass
class ExecResult:
    exit_code: int  # -9 or 137 style codes when killed; 124 when timed out
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0


@runtime_checkable
class Sandbox(Protocol):
    """One isolated workspace. Every backend (bwrap.py, docker.py, process.py) implements all of it;
    the pool (pool.py) uses snapshot, tainted, taint_reason, health and set_snapshot to check, switch
    and replace sandboxes, and envs report `placement()` as the row's env_info."""

    workdir: str  # the writable workspace path as seen by commands inside the sandbox
    snapshot: str | None  # the directory the workspace starts as (and reset returns it to)
    tainted: bool  # set after a timeout, OOM kill or crash: the pool replaces, never reuses, it
    taint_reason: str | None  # why, where the backend can tell (timeout, oom, pids_limit, ...); else None

    async def exec(
        self, cmd: str | list[str], timeout: float = 30.0, stdin: bytes | None = None
    ) -> ExecResult:
        """Run cmd (a string runs under `sh -c`) in workdir; kill the whole process tree at timeout."""
        ...

    async def put_file(self, path: str, data: bytes) -> None:
        """Write a file; relative paths are relative to workdir."""
        ...

    async def get_file(self, path: str) -> bytes: ...

    async def reset(self) -> None:
        """Return the workspace to its pristine snapshot and kill anything left running."""
        ...

    async def health(self, timeout: float = 2.0) -> bool:
        """Whether the sandbox still answers within `timeout`; False (never an exception) when it does not."""
        ...

    async def set_snapshot(self, snapshot: str | None) -> None:
        """Make `snapshot` the workspace's pristine state (one pool serves many tasks) and reset to it."""
        ...

    async def close(self) -> None: ...

    def placement(self) -> dict[str, Any]:
        """Where it runs, as JSON-ready values: {"sandbox": its kind, ...} plus the host (bwrap, subprocess)
        or the docker engine and container. Cheap and never raises: rows record it (schema v3 env_info)."""
        ...


def placement_of(sandbox: Any) -> dict[str, Any]:
    """`sandbox.placement()`, or {"sandbox": its kind} for an object without one (a test double)."""
    own = getattr(sandbox, "placement", None)
    if callable(own):
        return dict(own())
    return {"sandbox": str(getattr(sandbox, "kind", type(sandbox).__name__))}
