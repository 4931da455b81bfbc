"""Real engines for the fleet tests: `arlctl serve` apps in threads (tapped) and `arlctl serve` processes.

A `ThreadEngine` runs the real serve app (arlctl.serve.app, HFPolicy on the tiny model) on its own event
loop; its policy is wrapped by `Tap`, which forwards every call and notes each request's prompt ids and
sampled ids, so a test can say which engine served which turn and check that the ids it was sent are
exactly the trajectory's prefix. A `ProcessEngine` is `arlctl serve --policy DIR` in its own process, for
SIGKILL. `TurnsEnv` is an environment of N turns with a short tool wait, so trajectories stay in flight
while engines come and go.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from arlctl.envs.base import Action, EnvReset, StepResult
from arlctl.inference.hf import HFPolicy
from arlctl.models import tiny_model_dir
from arlctl.serve.app import ServeState, build_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Tap:
    """A Policy that forwards to `policy` and records (time, prompt ids, sampled ids) per request."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.log: list[tuple[float, list[int], list[int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    async def generate(self, prompt_ids, sampling):
        gen = await self.policy.generate(prompt_ids, sampling)
        self.log.append((time.monotonic(), list(prompt_ids), list(gen.ids)))
        return gen


class ThreadEngine:
    """The serve app over the tiny model at `version`, on 127.0.0.1:port in a background thread."""

    def __init__(self, version: int = 0, port: int | None = None):
        from aiohttp import web

        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.tap = Tap(HFPolicy(tiny_model_dir(), name="tiny", version=version, max_batch=8))
        self.state = ServeState(self.tap, None, default_max_tokens=16)
        # a short shutdown: stopping is how tests take an engine away, open keep-alive connections or not
        self.runner = web.AppRunner(build_app(self.state), access_log=None, shutdown_timeout=0.5)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        from aiohttp import web

        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def served(self) -> list[tuple[list[int], list[int]]]:
        return [(prompt, out) for _, prompt, out in list(self.tap.log)]

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.call(self.runner.cleanup())
        self.call(self.tap.policy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def versioned_tiny(directory: Path, version: int) -> Path:
    """A copy of the tiny model that is policy version `version` (its version.json says so)."""
    if not (directory / "config.json").is_file():
        shutil.copytree(tiny_model_dir(), directory)
        (directory / "version.json").write_text(json.dumps({"version": version}))
    return directory


class ProcessEngine:
    """`arlctl serve --policy DIR` as its own process (started at once; `wait_ready` before use)."""

    def __init__(self, policy: str, log_path: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arlctl.cli.main", "serve", "--policy", policy, "--port", str(self.port),
             "--max-tokens", "16"],
            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env)  # noqa: SIM115

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"arlctl serve exited {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"arlctl serve not up after {timeout_s}s: {self.log_path.read_text()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


class TurnsEnv:
    """`fleet-turns`: the task's `turns` replies (any text), each answered by a user message after a short
    wait; done after the last."""

    name = "fleet-turns"
    version = "fleet-turns-1"
    tool_format = None
    final_state_truncated = None

    def __init__(self, delay_s: float = 0.05):
        self.delay_s = delay_s
        self.left = 0

    def parse_action(self, text: str) -> Action:
        return Action(text=text)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        self.left = int(task.get("turns", 3))
        return EnvReset(messages=[{"role": "user", "content": task["prompt"]}], tools=[])

    async def step(self, action: Action) -> StepResult:
        await asyncio.sleep(self.delay_s)
        self.left -= 1
        if self.left <= 0:
            return StepResult(observations=[], done=True, final_state=action.text, finish_reason="submit")
        return StepResult(observations=[{"role": "user", "content": f"Go on, {self.left} to go."}], done=False)

    async def final_state(self) -> str | None:
        return None

    async def close(self) -> None:
        pass


def turn_requests(row: Any) -> list[tuple[list[int], list[int]]]:
    """What each turn of a trajectory row must have sent and received: (prompt_ids + the response so far,
    the turn's sampled ids). Token exactness says the engines saw exactly these."""
    prompt, response = list(row["prompt_ids"]), list(row["response_ids"])
    return [(prompt + response[:t["gen_start"]], response[t["gen_start"]:t["gen_start"] + t["gen_len"]])
            for t in row["turns"]]
