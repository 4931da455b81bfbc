"""The Sandbox protocol (DESIGN.md §7). Model-written code never runs outside one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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
    workdir: str  # the writable workspace path as seen by commands inside the sandbox

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

    async def close(self) -> None: ...
