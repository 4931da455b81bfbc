"""A real `arlctl serve` app on 127.0.0.1 in a background thread, for tests driving it over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from arlctl.inference.hf import HFPolicy
from arlctl.models import tiny_model_dir
from arlctl.schemas.trajectory import validate
from arlctl.serve.app import ServeState, build_app


class Server:
    """The serve app on its own event loop in a thread (the openai client is synchronous)."""

    def __init__(self, record_dir: str, idle_timeout_s: float = 600.0, flush_seconds: float = 0.2):
        from aiohttp import web

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.policy = HFPolicy(tiny_model_dir(), name="tiny", max_batch=8)
        self.state = ServeState(self.policy, record_dir, idle_timeout_s=idle_timeout_s, default_max_tokens=24,
                                flush_seconds=flush_seconds)
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

    def end(self, session_id: str) -> int:
        """End a session as POST /v1/sessions/{id}/end does: its rows committed before this returns."""
        async def end() -> int:
            rows = await self.state.end_session(session_id, "ended")
            await self.state.writer.commit(session_id)
            return rows

        return self.call(end())

    def stop(self) -> None:
        self.call(self.runner.cleanup())  # ends and writes every open session
        self.call(self.policy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# ---- a real `arlctl serve` process, and what the tests check on its records ----

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
TOOL_REPLY = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
FINAL_REPLY = "The answer is 42."
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeProcess:
    """`arlctl serve --policy tiny` as its own process on 127.0.0.1 (with --reply: the scripted policy)."""

    def __init__(self, record: Path, *extra: str, replies: tuple[str, ...] = (), wait: bool = True):
        self.port, self.record = free_port(), record
        self.log_path = record.parent / f"serve-{self.port}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (lives as long as the process)
        args = [*ARLCTL, "serve", "--policy", "tiny", "--port", str(self.port), "--record", str(record), *extra]
        for reply in replies:
            args += ["--reply", reply]
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.url = f"http://127.0.0.1:{self.port}"
        if wait:
            self.ready()

    @classmethod
    def start(cls, record: Path, *extra: str, replies: tuple[str, ...] = ()) -> ServeProcess:
        """Start without waiting (start several, then `ready()` each: their startups overlap)."""
        return cls(record, *extra, replies=replies, wait=False)

    def ready(self) -> ServeProcess:
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"arlctl serve exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                self.health()
                return self
            except OSError:
                time.sleep(0.2)
        self.proc.kill()
        raise RuntimeError("arlctl serve did not come up")

    def log(self) -> str:
        return self.log_path.read_text()

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/health", timeout=10) as response:
            return json.loads(response.read())

    def end(self, session: str) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.url}/v1/sessions/{session}/end", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def read_rows(record_dir: Path) -> list[dict]:
    """Every row of every committed shard under record_dir (each shard validated)."""
    rows = []
    for path in sorted(Path(record_dir).glob("*.parquet")):
        table = pq.read_table(path)
        validate(table)
        rows.extend(table.to_pylist())
    return rows


def rows_by_session(record_dir: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in read_rows(record_dir):
        out.setdefault(row["group_id"], []).append(row)
    return out


def assert_token_exact(model: Any, row: dict, tol: float = 1e-3) -> None:
    """Re-score prompt + response in one unpadded pass; mask-1 log-probs must match (temperature 1).

    The serving batch left-pads and splices KV caches, so float32 sums happen in another order: the
    differences are ~1e-5; 1e-3 still catches any off-by-one token or wrong-distribution error.
    """
    import torch

    ids = row["prompt_ids"] + row["response_ids"]
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(row["prompt_ids"])
    checked = 0
    for i, (token, mask, recorded) in enumerate(zip(row["response_ids"], row["response_mask"],
                                                   row["response_logprobs"], strict=True)):
        if mask:
            assert abs(recorded - float(logprobs[start + i - 1, token])) <= tol, (i, recorded)
            checked += 1
    assert checked == row["generated_tokens"] > 0


def assert_contiguous(row: dict) -> None:
    """Each turn's generated span is mask 1 and its observation span mask 0, with nothing between."""
    at = 0
    for turn in row["turns"]:
        assert turn["gen_start"] == at
        span = row["response_mask"][at:at + turn["gen_len"] + turn["obs_len"]]
        assert span == [1] * turn["gen_len"] + [0] * turn["obs_len"]
        at += turn["gen_len"] + turn["obs_len"]
    assert at == len(row["response_ids"])


def token_record(row: dict) -> tuple:
    """What must be identical between two recordings of the same conversation (ids, mask, log-probs,
    per-turn offsets, text and calls without their ids)."""
    turns = [(t["gen_start"], t["gen_len"], t["obs_len"], t["text"], t["observation"],
              [(c["name"], c["arguments"]) for c in json.loads(t["tool_calls"] or "[]")]) for t in row["turns"]]
    return (row["prompt_text"], row["prompt_ids"], row["response_ids"], row["response_mask"],
            [round(lp, 5) for lp in row["response_logprobs"]], turns, row["num_turns"], row["status"])
