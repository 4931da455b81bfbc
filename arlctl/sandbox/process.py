"""The `subprocess` sandbox backend: INSECURE, for trusted code only (opt-in with --insecure-sandbox).

Commands run as the calling user, directly on the host, in a private workspace directory copied from the
snapshot. The only limits are per-process rlimits set through `prlimit` (address space, file size, process
count, no core dumps) and a wall timeout that kills the command's process group. Nothing stops such a
command from reading host files, using the network or escaping its process group with setsid; use it for
fast local debugging of environments, never for model-written code you do not trust.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

from arlctl.sandbox import _files
from arlctl.sandbox.base import ExecResult, SandboxError


class SubprocessSandbox:
    """Build with `await SubprocessSandbox.create(snapshot, ...)`; `workdir` is a host directory."""

    kind = "subprocess"

    def __init__(
        self,
        snapshot: str | None = None,
        *,
        memory_mb: int = 1024,
        pids: int = 256,
        disk_mb: int = 512,
        env: dict[str, str] | None = None,
        root_dir: str | None = None,
        max_output_bytes: int = 1 << 20,
    ):
        self.snapshot = snapshot
        self.memory_mb, self.pids_max, self.disk_mb = memory_mb, pids, disk_mb
        self.max_output_bytes = max_output_bytes
        self.root = Path(tempfile.mkdtemp(prefix="arlctl-insecure-", dir=root_dir))
        self.workdir = str(self.root / "workspace")
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.workdir,
            "LANG": "C.UTF-8",
            **(env or {}),
        }
        self.tainted = False
        self.taint_reason: str | None = None  # no finer cause than `tainted` here: the pool counts that
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def create(cls, snapshot: str | None = None, **kwargs) -> SubprocessSandbox:
        sb = cls(snapshot, **kwargs)
        await sb.reset()
        return sb

    def _limits(self) -> list[str]:
        return [
            "prlimit",
            f"--as={self.memory_mb << 20}",
            f"--fsize={self.disk_mb << 20}",
            f"--nproc={self.pids_max}",
            "--core=0",
            "--",
        ]

    async def exec(
        self, cmd: str | list[str], timeout: float = 30.0, stdin: bytes | None = None
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        async with self._lock:
            if self._closed:
                raise SandboxError("sandbox is closed")
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *self._limits(),
                *argv,
                cwd=self.workdir,
                env=self.env,
                start_new_session=True,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            io = asyncio.gather(
                capped_read(proc.stdout, self.max_output_bytes),
                capped_read(proc.stderr, self.max_output_bytes),
                _feed(proc, stdin),
            )
            timed_out = False
            try:
                (out, _), (err, _), _ = await asyncio.wait_for(asyncio.shield(io), timeout)
                code = await proc.wait()
            except TimeoutError:
                timed_out = True
                self.tainted = True
                _killpg(proc.pid)
                (out, _), (err, _), _ = await io
                await proc.wait()
                code = 124
            _killpg(proc.pid)  # background jobs left in the group go with the command
        return ExecResult(
            code,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    async def put_file(self, path: str, data: bytes) -> None:
        host, parts = _files.map_path(path, {self.workdir: self.workdir}, self.workdir)
        await asyncio.to_thread(_files.write_beneath, host, parts, data, None)

    async def get_file(self, path: str) -> bytes:
        host, parts = _files.map_path(path, {self.workdir: self.workdir}, self.workdir)
        return await asyncio.to_thread(_files.read_beneath, host, parts)

    async def health(self, timeout: float = 2.0) -> bool:
        return not self._closed and not self.tainted and os.path.isdir(self.workdir)

    async def set_snapshot(self, snapshot: str | None) -> None:
        """Serve another task: make `snapshot` the pristine state and reset the workspace to it."""
        self.snapshot = snapshot
        await self.reset()

    async def reset(self) -> None:
        def _restore() -> None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            if self.snapshot:
                shutil.copytree(self.snapshot, self.workdir, symlinks=True)
            else:
                os.makedirs(self.workdir)

        async with self._lock:
            await asyncio.to_thread(_restore)
            self.tainted = False

    def placement(self) -> dict[str, str]:
        """Where this sandbox runs: directly on this host."""
        return {"sandbox": self.kind, "host": socket.gethostname()}

    async def close(self) -> None:
        self._closed = True
        await asyncio.to_thread(shutil.rmtree, self.root, True)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if data is None or proc.stdin is None:
        return
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
    except (ConnectionError, BrokenPipeError):
        pass
    finally:
        proc.stdin.close()


async def capped_read(stream: asyncio.StreamReader | None, limit: int) -> tuple[bytes, bool]:
    """Read a stream to EOF keeping the first `limit` bytes, so a flood of output cannot exhaust memory."""
    if stream is None:
        return b"", False
    kept, size, total = [], 0, 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if size < limit:
            kept.append(chunk[: limit - size])
            size += len(kept[-1])
    return b"".join(kept), total > limit
