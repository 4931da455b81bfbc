"""`arlctl serve` under many concurrent agent sessions: the gateway's added latency, and no session lost.

  python benchmarks/serve_load.py                                  # 1000 sessions x 3 turns, tiny tokenizer
  python benchmarks/serve_load.py --sessions 200 --turns 2 --json
  python benchmarks/serve_load.py --stream-every 0                 # no streamed sessions

A real `arlctl serve --reply TEXT` process on 127.0.0.1 (a scripted policy: no model, a reply costs one
tokenizer call) so what is measured is the gateway: HTTP, JSON, validation, session lookup, chat-template
rendering, recording, the response, and the end-of-session shard write. Every `--stream-every`-th session
streams (SSE); the rest are plain. Each session sends its conversation turn by turn (each request
extends the last: the reply echoed back, then a tool result), then POST /v1/sessions/ID/end.

Baseline, measured in the same run: the same policy called directly (`policy.generate` on the prompt ids
of each turn, no HTTP). Printed per phase: request latency p50 / p99, the policy's own p50 / p99, and the
added latency = the request latency's percentile - the policy's median (a direct call's p99 is scheduler
noise on a shared machine, not a cost every request pays); for streamed requests also the time to the
first byte. Two phases: `serial` (one request at a time: the per-request overhead) and
`concurrent` (every session at once: --sessions in flight, so queueing is included). Then the check the
test asserts on a smaller count: every session's rows are written exactly once (one row of --turns
turns per session, none missing, none twice), and no session failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

SESSION_HEADER = "X-Arlctl-Session"
REPLY = "I will look at the files first and then run the tests."
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                          "required": ["cmd"]}}}]


@dataclass
class LoadResult:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "stream": []})
    first_byte: list[float] = field(default_factory=list)  # streamed requests: seconds to the first byte
    end_latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ended: dict[str, int] = field(default_factory=dict)  # session id -> rows the server reported writing
    wall_s: float = 0.0


def conversation(turn: int) -> list[dict[str, Any]]:
    """The messages a session sends on `turn` (0-based): the reply echoed back, then a tool result."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Fix the failing test in the repository."}]
    for k in range(turn):
        messages += [{"role": "assistant", "content": REPLY},
                     {"role": "tool", "tool_call_id": f"call_{k}", "content": f"output of step {k}: 3 passed"}]
    return messages


async def _request(http: aiohttp.ClientSession, url: str, sid: str, turn: int, stream: bool,
                   result: LoadResult) -> None:
    body = {"model": "scripted", "messages": conversation(turn), "tools": TOOLS, "max_tokens": 64,
            "stream": stream}
    t0 = time.perf_counter()
    async with http.post(f"{url}/v1/chat/completions", json=body, headers={SESSION_HEADER: sid}) as response:
        if response.status != 200:
            raise RuntimeError(f"{sid} turn {turn}: HTTP {response.status}: {(await response.text())[:300]}")
        if stream:
            first = True
            text = ""
            async for line in response.content:
                if first:
                    result.first_byte.append(time.perf_counter() - t0)
                    first = False
                if line.startswith(b"data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        text += choice["delta"].get("content") or ""
        else:
            text = (await response.json())["choices"][0]["message"]["content"]
    result.latencies["stream" if stream else "plain"].append(time.perf_counter() - t0)
    if text != REPLY:
        raise RuntimeError(f"{sid} turn {turn}: unexpected reply {text[:100]!r}")


async def _session(http: aiohttp.ClientSession, url: str, sid: str, turns: int, stream: bool,
                   result: LoadResult) -> None:
    try:
        for turn in range(turns):
            await _request(http, url, sid, turn, stream, result)
        t0 = time.perf_counter()
        async with http.post(f"{url}/v1/sessions/{sid}/end") as response:
            answer = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{sid} end: HTTP {response.status}: {answer}")
        result.end_latencies.append(time.perf_counter() - t0)
        result.ended[sid] = answer["rows"]
    except Exception as err:  # counted and reported: a lost session is the benchmark's finding
        result.errors.append(f"{type(err).__name__}: {err}"[:300])


async def drive(url: str, session_ids: list[str], turns: int, stream_every: int, concurrent: bool) -> LoadResult:
    """Run the sessions against `url` (all at once, or one after another) and time every request."""
    result = LoadResult()
    connector = aiohttp.TCPConnector(limit=0)  # one connection per session in flight: no client-side queue
    timeout = aiohttp.ClientTimeout(total=600)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        jobs = [_session(http, url, sid, turns, bool(stream_every) and i % stream_every == 0, result)
                for i, sid in enumerate(session_ids)]
        if concurrent:
            await asyncio.gather(*jobs)
        else:
            for job in jobs:
                await job
    result.wall_s = time.perf_counter() - t0
    return result


async def policy_baseline(tokenizer_dir: str, turns: int, calls: int) -> list[float]:
    """Seconds per direct `policy.generate` on the same prompts (the cost the gateway adds to)."""
    from transformers import AutoTokenizer

    from arlctl.inference.base import SamplingParams
    from arlctl.inference.chat import ChatCodec
    from arlctl.serve.recorder import template_message
    from arlctl.serve.replies import replies_policy

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    policy = replies_policy(tokenizer, "tiny", [REPLY])
    codec = ChatCodec(tokenizer)
    prompts = [codec.prompt([template_message(m) for m in conversation(t)], TOOLS).ids for t in range(turns)]
    sampling = SamplingParams(max_new_tokens=64)
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        await policy.generate(prompts[i % turns], sampling)
        out.append(time.perf_counter() - t0)
    return out


# ---- the server process and the record check ----

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeProcess:
    def __init__(self, record: Path, log: Path, policy: str = "tiny"):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "w")  # noqa: SIM115 (lives as long as the process)
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arlctl.cli.main", "serve", "--policy", policy, "--reply", REPLY, "--port",
             str(self.port), "--record", str(record)], stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"})

    async def ready(self, timeout_s: float = 300) -> None:
        deadline = time.time() + timeout_s
        async with aiohttp.ClientSession() as http:
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"arlctl serve exited: {self.log.read_text()[-2000:]}")
                try:
                    async with http.get(f"{self.url}/health") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError("arlctl serve did not come up")

    async def health(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(f"{self.url}/health") as response:
            return await response.json()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def written_sessions(record: Path) -> dict[str, list[int]]:
    """group_id -> num_turns of each row written for it, over every committed shard."""
    import pyarrow.parquet as pq

    out: dict[str, list[int]] = {}
    for path in sorted(record.glob("*.parquet")):
        table = pq.read_table(path, columns=["group_id", "num_turns"])
        for gid, turns in zip(table["group_id"].to_pylist(), table["num_turns"].to_pylist(), strict=True):
            out.setdefault(gid, []).append(turns)
    return out


def lost_or_duplicated(record: Path, session_ids: list[str], turns: int) -> list[str]:
    """Why the record is not exactly one row of `turns` turns per session ([] when it is)."""
    written = written_sessions(record)
    problems = [f"{sid}: not written" for sid in session_ids if sid not in written]
    problems += [f"{sid}: rows {rows} (want one of {turns} turns)" for sid, rows in written.items()
                 if rows != [turns]]
    problems += [f"{sid}: written but never sent" for sid in set(written) - set(session_ids)]
    return problems


# ---- the report ----

def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(result: LoadResult, baseline: list[float]) -> dict[str, Any]:
    policy_cost = percentile(baseline, 50)  # the policy's typical cost, taken off every request
    out: dict[str, Any] = {"wall_s": round(result.wall_s, 3), "errors": len(result.errors),
                           "sessions_ended": len(result.ended)}
    requests = sum(len(v) for v in result.latencies.values())
    out["requests_per_s"] = round(requests / result.wall_s, 1) if result.wall_s else None
    for kind, values in result.latencies.items():
        if not values:
            continue
        row = {"n": len(values)}
        for q in (50, 99):
            row[f"p{q}_ms"] = round(percentile(values, q) * 1e3, 3)
            row[f"added_p{q}_ms"] = round((percentile(values, q) - policy_cost) * 1e3, 3)
        out[kind] = row
    if result.first_byte:
        out["stream_first_byte_ms"] = {f"p{q}": round(percentile(result.first_byte, q) * 1e3, 3) for q in (50, 99)}
    out["end_ms"] = {f"p{q}": round(percentile(result.end_latencies, q) * 1e3, 3) for q in (50, 99)}
    return out


async def run(sessions: int, turns: int, stream_every: int, serial_sessions: int, workdir: Path,
              policy: str = "tiny") -> dict[str, Any]:
    """Both phases against one server, the baseline, and the record check; returns the report."""
    from arlctl.inference.loader import resolve_policy

    record = workdir / "record"
    server = ServeProcess(record, workdir / "serve.log", policy)
    try:
        await server.ready()
        baseline = await policy_baseline(str(resolve_policy(policy).path), turns, max(1000, serial_sessions * turns))
        serial_ids = [f"serial-{i:05d}" for i in range(serial_sessions)]
        load_ids = [f"load-{i:05d}" for i in range(sessions)]
        serial = await drive(server.url, serial_ids, turns, stream_every, concurrent=False)
        concurrent = await drive(server.url, load_ids, turns, stream_every, concurrent=True)
        health = await server.health()
    finally:
        code = server.stop()
    report = {
        "sessions": sessions, "turns": turns, "stream_every": stream_every,
        "policy_direct_ms": {f"p{q}": round(percentile(baseline, q) * 1e3, 3) for q in (50, 99)},
        "serial": summarize(serial, baseline), "concurrent": summarize(concurrent, baseline),
        "errors": (serial.errors + concurrent.errors)[:10],
        "server_exit": code, "sessions_failed": health["sessions_failed"],
        "record_problems": lost_or_duplicated(record, serial_ids + load_ids, turns)[:20],
    }
    report["sessions_lost"] = len(report["record_problems"])
    return report


def _print(report: dict[str, Any]) -> None:
    direct = report["policy_direct_ms"]
    print(f"policy called directly: p50 {direct['p50']:.3f} ms  p99 {direct['p99']:.3f} ms")
    for phase in ("serial", "concurrent"):
        res = report[phase]
        print(f"{phase}: {res['sessions_ended']} sessions, {res['requests_per_s']} req/s, wall {res['wall_s']} s")
        for kind in ("plain", "stream"):
            if kind in res:
                r = res[kind]
                print(f"  {kind:6} n={r['n']:5}  p50 {r['p50_ms']:9.3f} ms (added {r['added_p50_ms']:9.3f})  "
                      f"p99 {r['p99_ms']:9.3f} ms (added {r['added_p99_ms']:9.3f})")
        if "stream_first_byte_ms" in res:
            fb = res["stream_first_byte_ms"]
            print(f"  stream first byte: p50 {fb['p50']:.3f} ms  p99 {fb['p99']:.3f} ms")
        print(f"  session end (rows written): p50 {res['end_ms']['p50']:.3f} ms  p99 {res['end_ms']['p99']:.3f} ms")
    print(f"sessions lost or duplicated: {report['sessions_lost']}; failed: {report['sessions_failed']}; "
          f"request errors: {report['serial']['errors'] + report['concurrent']['errors']}")
    for problem in report["record_problems"] + report["errors"]:
        print("  ", problem)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000, help="sessions in flight at once")
    parser.add_argument("--turns", type=int, default=3, help="requests per session")
    parser.add_argument("--stream-every", type=int, default=2, help="every Nth session streams (0: none)")
    parser.add_argument("--serial-sessions", type=int, default=50, help="sessions of the one-at-a-time phase")
    parser.add_argument("--policy", default="tiny", help="whose tokenizer the scripted policy uses")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        report = asyncio.run(run(args.sessions, args.turns, args.stream_every, args.serial_sessions, Path(tmp),
                                 args.policy))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    ok = report["sessions_lost"] == 0 and not report["errors"] and report["sessions_failed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

