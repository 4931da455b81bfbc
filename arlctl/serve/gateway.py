"""The recording gateway inside a rollout: `arlctl serve`'s app on a loopback port of this process.

    gateway = Gateway(policy, max_tokens=512)
    base_url = await gateway.start()          # http://127.0.0.1:PORT/v1, OpenAI-compatible
    ...   a harness calls it with the X-Arlctl-Session header naming its run
    rows = await gateway.take(session_id)     # the run's segments, as trajectory rows (token for token)
    await gateway.close()

The same code serves, records and rebuilds rows as `arlctl serve` (app.py, recorder.py), so a harness's
conversation becomes rows by the one token-append rule (DESIGN.md §6): the first request rendered once, each
later one tokenized only in what it adds; a request that rewrites history starts a new segment (a new row),
never a re-tokenized one. Rows are handed to the caller, not written: the rollout groups, writes and
resumes them like any others.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from arlctl.inference.base import Policy
from arlctl.schemas.rows import TrajectoryRow
from arlctl.serve.app import SESSION_HEADER, ServeState, build_app

__all__ = ["SESSION_HEADER", "Gateway"]


class Gateway:
    def __init__(self, policy: Policy, *, max_tokens: int = 256, idle_timeout_s: float = 3600.0):
        # No record directory: the rollout takes each session's rows (take) instead of the server writing them.
        self.state = ServeState(policy, None, idle_timeout_s=idle_timeout_s, default_max_tokens=max_tokens)
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        self._lock = asyncio.Lock()

    async def start(self) -> str:
        """Serve on 127.0.0.1, a free port; the base URL of its OpenAI API (`.../v1`). Idempotent."""
        async with self._lock:
            if self._runner is None:
                runner = web.AppRunner(build_app(self.state), access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                host, port = runner.addresses[0][:2]
                self._runner, self.base_url = runner, f"http://{host}:{port}/v1"
        return self.base_url

    async def take(self, session_id: str, reason: str = "harness_done") -> list[TrajectoryRow]:
        """End one session and hand back its rows (empty when the harness never called the model)."""
        async with self.state.lock(session_id):
            rows = self.state.recorder.end(session_id, reason)
        self.state.locks.pop(session_id, None)
        return rows

    async def close(self) -> None:
        async with self._lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            with contextlib.suppress(Exception):
                await runner.cleanup()
