"""The host side of the exec-server protocol (`_sbxd.py`): length-prefixed JSON frames over two streams.

Shared by the bwrap backend (the server's stdin/stdout pipes) and the docker backend (the container's
attach socket, demultiplexed). One request is in flight at a time; callers hold their own lock.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from typing import Protocol

from arlctl.sandbox.base import ExecResult, SandboxError


class _Reader(Protocol):
    async def readexactly(self, n: int) -> bytes: ...


class ExecChannel:
    def __init__(self, reader: _Reader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def recv(self) -> dict:
        try:
            header = await self.reader.readexactly(4)
            body = await self.reader.readexactly(struct.unpack(">I", header)[0])
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise SandboxError("sandbox exec server exited") from e
        return json.loads(body)

    async def send(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        try:
            self.writer.write(struct.pack(">I", len(data)) + data)
            await self.writer.drain()
        except (ConnectionError, BrokenPipeError, RuntimeError) as e:
            raise SandboxError("sandbox exec server is gone") from e

    async def call(self, obj: dict, timeout: float) -> dict:
        """Send one request and wait for its reply; TimeoutError if none comes within timeout."""
        await self.send(obj)
        return await asyncio.wait_for(self.recv(), timeout)

    async def ping(self, timeout: float) -> bool:
        try:
            return bool((await self.call({"op": "ping"}, timeout)).get("ok"))
        except (TimeoutError, SandboxError):
            return False


def exec_request(argv: list[str], timeout: float, stdin: bytes | None, cwd: str, max_output: int) -> dict:
    return {
        "op": "exec",
        "argv": argv,
        "timeout": timeout,
        "cwd": cwd,
        "stdin": base64.b64encode(stdin).decode() if stdin is not None else None,
        "max_output": max_output,
    }


def to_result(reply: dict, started: float, max_output: int) -> ExecResult:
    if "exit" not in reply:
        raise SandboxError(f"malformed reply from the sandbox exec server: {str(reply)[:200]}")
    stderr = base64.b64decode(reply["stderr"]).decode(errors="replace")
    if reply.get("truncated"):
        stderr += f"\n[arlctl: output truncated at {max_output} bytes per stream]"
    return ExecResult(
        int(reply["exit"]),
        base64.b64decode(reply["stdout"]).decode(errors="replace"),
        stderr,
        timed_out=bool(reply["timed_out"]),
        duration_s=time.monotonic() - started,
    )


def raw_stdout(reply: dict) -> bytes:
    return base64.b64decode(reply["stdout"])
