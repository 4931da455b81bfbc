"""A real `arlctl serve` app on 127.0.0.1 in a background thread, for tests driving it over HTTP."""

from __future__ import annotations

import asyncio
import socket
import threading

from arlctl.inference.hf import HFPolicy
from arlctl.models import tiny_model_dir
from arlctl.serve.app import ServeState, build_app


class Server:
    """The serve app on its own event loop in a thread (the openai client is synchronous)."""

    def __init__(self, record_dir: str, idle_timeout_s: float = 600.0):
        from aiohttp import web

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.policy = HFPolicy(tiny_model_dir(), name="tiny", max_batch=8)
        self.state = ServeState(self.policy, record_dir, idle_timeout_s=idle_timeout_s, default_max_tokens=24)
        self.runner = web.AppRunner(build_app(self.state), access_log=None)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())
        self.url = f"http://127.0.0.1:{self.port}/v1"

    async def _start(self) -> None:
        from aiohttp import web

        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def stop(self) -> None:
        self.call(self.runner.cleanup())  # ends and writes every open session
        self.call(self.policy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
