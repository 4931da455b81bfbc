"""Rollout scale: thousands of trajectories in flight against a fleet of fast fake engines.

  python benchmarks/rollout_scale.py                               # N = 256, 1024, 4096 x T=4 turns
  python benchmarks/rollout_scale.py --sizes 256,1024 --json
  python benchmarks/rollout_scale.py --sizes 4096 --profile /tmp/scale.prof   # cProfile of the rollout
  python benchmarks/rollout_scale.py --codec            # per-turn ChatCodec work: shortcuts vs general path
  python benchmarks/rollout_scale.py --sizes 1024 --codec-general   # the rollout on ChatCodec's general path
  python benchmarks/rollout_scale.py --sizes 4096 --workers 2       # N split over 2 rollout processes

For each N, N trajectories of T turns run through the real rollout (stages/rollout_job.run_rollout: the
driver, the agent loop, the shard writer and the metrics row) with the `openai` backend against E fake
OpenAI-compatible engines (aiohttp on 127.0.0.1, in one child process: they answer /v1/completions with
a fixed K-token reply in the shape vLLM and `arlctl serve` use (choices[0].token_ids and
logprobs.token_logprobs) after a fixed per-token latency, with unbounded parallelism) and the synthetic
LatencyEnv (arlctl/synthetic.py), whose tool sleeps a lognormal time (mean 1 s, sigma 1: long-tailed).

Lower bound (benchmarks/rollout_overlap.py's definition) = max(generation at full batch: the same N x T
generate calls with no tool latency at concurrency N, through the same backend; the longest trajectory's
critical path: max_i sum_t latency[i, t] + T x the batch-1 generate latency). Printed per N:

  x bound        the rollout's wall time / the lower bound (goal at N = 4096: <= 1.05)
  lag p99        event-loop lag p99 of the probe in run_rollout (a 10 ms timer's overshoot; goal < 20 ms)
  RSS/traj       (peak RSS - RSS at start) / most trajectories in flight
  CPU/turn       the rollout process's CPU time (every thread) / turns

and the ratio of each N's CPU/turn and RSS/traj to those of the smallest N: flat means no per-turn work
that grows with the number in flight. Each N runs in a fresh process, so its RSS and CPU are its own.
Wall-time ratios need a core to spare: when the rollout process is CPU-bound (CPU/turn x turns near the
bound), starting thousands of trajectories takes longer than the short ones live, and the peak in flight
stays below N. The machine is shared: run it twice and read both.

`--workers W` splits each N over W rollout processes the way `arlctl rollout --worker I/W` does (by task
id), started together once all are loaded; the wall time runs from the common start to the last one's end,
against the same bound. Lag and RSS/traj are the worst worker's, CPU/turn is over all of them, and
"in flight" is the sum of the workers' peaks.

`--codec` measures the rollout's own per-turn token work instead: split_generation of the reply plus
continuation of the observation, with ChatCodec's shortcuts (the compiled template, the Rust tokenizer)
against the general path (`ChatCodec(fast=False)`: apply_chat_template and the tokenizer wrapper), both
in the same run, rounds interleaved; it checks both give the same ids on every call. `--codec-general`
runs the whole rollout with the shortcuts off, for CPU/turn before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from arlctl.inference.base import SamplingParams
from arlctl.inference.chat import ChatCodec
from arlctl.inference.openai import OpenAIPolicy
from arlctl.io.partition import owns
from arlctl.models import tiny_model_dir
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout_job import EnvPicker, RolloutJob, run_rollout
from arlctl.synthetic import latency_tasks, tool_latencies

ENV = "arlctl.synthetic:LatencyEnv"
REPLY = "Working on it: calling the tool now, then checking its output."
GOAL_BOUND_RATIO = 1.05
GOAL_LAG_P99_MS = 20.0


# ---------------------------------------------------------------------------------- the fake engine fleet


def serve_fleet(engines: int, reply_ids: list[int], per_token_s: float) -> None:
    """(child process) E OpenAI-compatible fake engines; prints their URLs, serves until stdin closes."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        ids = reply_ids[: int(body.get("max_tokens") or len(reply_ids))]
        await asyncio.sleep(per_token_s * len(ids))
        finish = "length" if len(ids) < len(reply_ids) else "stop"
        return web.json_response({"id": "cmpl-fake", "object": "text_completion", "model": "fake", "choices": [
            {"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
             "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}}]})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def main() -> None:
        urls, runners = [], []
        for _ in range(engines):
            app = web.Application(client_max_size=64 * 2**20)
            app.add_routes([web.post("/v1/completions", completions), web.get("/v1/models", models),
                            web.get("/health", health)])
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=8192)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            urls.append(f"http://127.0.0.1:{port}")
            runners.append(runner)
        print(json.dumps({"urls": urls}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # parent gone: stop

    asyncio.run(main())


def start_fleet(engines: int, reply_ids: list[int], per_token_s: float) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-fleet", str(engines), "--per-token-ms",
                             str(per_token_s * 1000), "--reply-ids", json.dumps(reply_ids)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line:
        raise RuntimeError("the fake engine fleet did not start")
    return proc, json.loads(line)["urls"]


# ---------------------------------------------------------------------------------------- measurements


async def gen_single_turn_s(policy: Any, prompt: list[int], tokens: int, calls: int = 20) -> float:
    """Batch-1 latency of one generate call as the rollout sees it (HTTP included)."""
    times = []
    for i in range(calls):
        t = time.perf_counter()
        await policy.generate(prompt + [i + 1], SamplingParams(max_new_tokens=tokens))
        times.append(time.perf_counter() - t)
    return statistics.fmean(times[2:])


async def gen_full_batch_s(policy: Any, prompt: list[int], n: int, turns: int, tokens: int) -> float:
    """The N x T generate calls with no tool latency, N at a time: what generation alone costs at full batch."""

    async def one(i: int) -> None:
        ids = prompt + [i + 1]
        for _ in range(turns):
            gen = await policy.generate(ids, SamplingParams(max_new_tokens=tokens))
            ids = ids + gen.ids + prompt[:8]  # grows like a conversation (generated + observation ids)

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t


def make_policy(urls: list[str], args: argparse.Namespace) -> Any:
    """The fake fleet through the openai backend, or (--backend synthetic) the same replies in process."""
    if args.backend == "synthetic":
        from transformers import AutoTokenizer

        from arlctl.synthetic import SyntheticPolicy

        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir()), local_files_only=True)
        return SyntheticPolicy(tokenizer, per_token_s=args.per_token_ms / 1000, reply_ids=json.loads(args.reply_ids))
    return OpenAIPolicy(urls, str(tiny_model_dir()), model="fake", name="fake-fleet", timeout_s=600.0)


def lower_bound(latencies: np.ndarray, gen_full_s: float, gen_single_s: float) -> dict[str, float]:
    """rollout_overlap.py's bound: max(generation at full batch, the longest trajectory's critical path)."""
    critical = float(latencies.sum(axis=1).max()) + latencies.shape[1] * gen_single_s
    return {"bound_s": max(gen_full_s, critical), "gen_full_batch_s": gen_full_s, "critical_path_s": critical,
            "gen_single_turn_s": gen_single_s}


async def one_size(urls: list[str], n: int, args: argparse.Namespace, out_root: str) -> dict[str, Any]:
    latencies = np.stack([tool_latencies(i, args.turns, args.seed, args.mean, args.sigma) for i in range(n)])
    # One policy for the calibration and the rollout: the calibration's sequential calls also make every
    # engine known to it (its /v1/models read), so the rollout starts on a warm fleet.
    policy = make_policy(urls, args)
    prompt = ChatCodec(policy.tokenizer).prompt([{"role": "user", "content": "Job 0: start working."}], []).ids
    if args.worker_index:  # workers 1.. start after worker 0 calibrated alone: its bound is the one used
        bound = {"bound_s": 0.0}
        await gen_single_turn_s(policy, prompt, args.tokens, calls=3)  # warm: the engines are known to it
    else:
        single = await gen_single_turn_s(policy, prompt, args.tokens)
        full = await gen_full_batch_s(policy, prompt, n, args.turns, args.tokens)
        bound = lower_bound(latencies, full, single)
    if args.worker_index is not None:  # this worker's share, from the common start
        tasks = [t for t in latency_tasks(n) if owns(t["task_id"], args.worker_index, args.workers)]
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    else:
        tasks = latency_tasks(n)
    cfg = RolloutConfig(env=ENV, group_size=1, concurrency=len(tasks), max_turns=args.turns,
                        max_new_tokens=args.tokens, max_tokens=1 << 20, max_context=1 << 20,
                        step_timeout=float(latencies.max()) + 60.0, trajectory_timeout=1e6, seed=args.seed)
    envs = EnvPicker({"turns": args.turns, "mean": args.mean, "sigma": args.sigma, "seed": args.seed})
    envs.check(tasks, ENV)
    out = str(Path(out_root) / f"n{n}" / "rollouts")
    job = RolloutJob(cfg=cfg, tasks=tasks, envs=envs, out=out, backend=args.backend, flush_groups=args.flush_groups)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start, started_at = time.perf_counter(), time.time()
    result = await run_rollout(job, policy, asyncio.Event(), log=lambda line: None)
    wall, ended_at = time.perf_counter() - start, time.time()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    if result.rows_written != len(tasks) or result.status.get("ok", 0) != len(tasks):
        raise RuntimeError(f"N={n}: {result.rows_written} rows, statuses {result.status}: {result.last_error}")
    return {
        "n": n, "started_at": started_at, "ended_at": ended_at, "wall_s": round(wall, 3),
        "ratio_to_bound": round(wall / bound["bound_s"], 4) if bound["bound_s"] else None,
        **{k: round(v, 4) for k, v in bound.items()},
        "loop_lag_p50_ms": result.loop_lag_p50_ms, "loop_lag_p99_ms": result.loop_lag_p99_ms,
        "loop_lag_max_ms": result.loop_lag_max_ms, "peak_in_flight": result.peak_in_flight,
        "peak_rss_mb": result.peak_rss_mb, "rss_per_trajectory_kb": result.rss_per_trajectory_kb,
        "cpu_s": result.cpu_s, "cpu_per_turn_ms": result.cpu_per_turn_ms, "turns": result.env_calls,
        "gc_pause_max_ms": result.gc_pause_max_ms, "gc_pause_total_s": result.gc_pause_total_s,
        "shards": result.shards_written,
    }


def codec_turns(rounds: int, calls: int) -> dict[str, Any]:
    """Per-turn codec calls/s, shortcuts vs the general path, on LatencyEnv's observation and on longer,
    distinct tool outputs (a real env's); ids compared on every call."""
    from transformers import AutoTokenizer

    from arlctl.inference.scripted import end_of_message_ids

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir()), local_files_only=True)
    reply = (tokenizer(REPLY, add_special_tokens=False)["input_ids"] * 2)[:15] + end_of_message_ids(tokenizer)
    codecs = {"general": ChatCodec(tokenizer, fast=False), "shortcuts": ChatCodec(tokenizer)}
    workloads = {
        "latency-env": [[{"role": "tool", "name": "work", "content": "ok"}]] * calls,
        "tool-output": [[{"role": "tool", "name": "bash", "tool_call_id": f"call{i:04d}",
                          "content": f"$ pytest -q tests/test_{i}.py\n" + f"line {i}: assert x == {i}\n" * 12}]
                        for i in range(calls)],
    }
    out: dict[str, Any] = {"rounds": rounds, "calls": calls}
    for name, observations in workloads.items():
        seconds: dict[str, list[float]] = {kind: [] for kind in codecs}
        ids: dict[str, list[list[int]]] = {}
        for _ in range(rounds):
            for kind, codec in codecs.items():  # interleaved, so load drifts hit both alike
                got = []
                t = time.perf_counter()
                for obs in observations:
                    _text, glue = codec.split_generation(reply)
                    got.append(codec.continuation(glue, obs).ids)
                seconds[kind].append(time.perf_counter() - t)
                ids[kind] = got
        if ids["general"] != ids["shortcuts"]:
            raise RuntimeError(f"{name}: the shortcuts changed the continuation ids")
        rate = {kind: calls / statistics.median(values) for kind, values in seconds.items()}
        out[name] = {"general_per_s": round(rate["general"]), "shortcuts_per_s": round(rate["shortcuts"]),
                     "speedup": round(rate["shortcuts"] / rate["general"], 2)}
    return out


def run_workers(n: int, urls: list[str], reply_ids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """One N over args.workers processes, started together once every one is loaded and calibrated."""
    def start(i: int) -> subprocess.Popen:
        return subprocess.Popen(child_argv(n, urls, reply_ids, args) + ["--worker-index", str(i)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ready(proc: subprocess.Popen) -> None:
        if proc.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise RuntimeError("a rollout worker did not start")

    procs = [start(0)]
    ready(procs[0])  # worker 0 measures the bound's generation terms alone, before the others start
    procs += [start(i) for i in range(1, args.workers)]
    for proc in procs[1:]:
        ready(proc)
    for proc in procs:
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
    parts = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"a rollout worker failed (exit {proc.returncode})")
        parts.append(json.loads(out.strip().splitlines()[-1]))
    wall = max(p["ended_at"] for p in parts) - min(p["started_at"] for p in parts)
    turns, cpu = sum(p["turns"] for p in parts), sum(p["cpu_s"] for p in parts)
    bound = parts[0]["bound_s"]
    worst = max(parts, key=lambda p: p["loop_lag_p99_ms"])
    calibration = {k: parts[0][k] for k in ("gen_full_batch_s", "critical_path_s", "gen_single_turn_s")}
    return {**worst, **calibration, "n": n, "workers": args.workers, "wall_s": round(wall, 3), "bound_s": bound,
            "ratio_to_bound": round(wall / bound, 4), "turns": turns, "cpu_s": round(cpu, 3),
            "cpu_per_turn_ms": round(1000 * cpu / max(turns, 1), 4),
            "peak_in_flight": sum(p["peak_in_flight"] for p in parts),
            "rss_per_trajectory_kb": max(p["rss_per_trajectory_kb"] for p in parts),
            "loop_lag_max_ms": max(p["loop_lag_max_ms"] for p in parts),
            "gc_pause_max_ms": max(p["gc_pause_max_ms"] for p in parts)}


def child_argv(n: int, urls: list[str], reply_ids: list[int], args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, __file__, "--child", "--sizes", str(n), "--urls", json.dumps(urls),
            "--reply-ids", json.dumps(reply_ids), "--backend", args.backend, "--turns", str(args.turns),
            "--tokens", str(args.tokens), "--per-token-ms", str(args.per_token_ms), "--mean", str(args.mean),
            "--sigma", str(args.sigma), "--flush-groups", str(args.flush_groups), "--seed", str(args.seed)]
    if args.codec_general:
        argv.append("--codec-general")
    if args.profile and n == max(args.sizes):
        argv += ["--profile", args.profile]
    if args.workers > 1:
        argv += ["--workers", str(args.workers)]
    return argv


def run_child(n: int, urls: list[str], reply_ids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Measure one N in its own process (same options); the fleet is shared."""
    if args.workers > 1:
        return run_workers(n, urls, reply_ids, args)
    argv = child_argv(n, urls, reply_ids, args)
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(out: dict[str, Any]) -> str:
    c = out["config"]
    lines = [
        f"rollout scale ({c['backend']}, codec {c.get('codec', 'shortcuts')}, {c.get('workers', 1)} rollout "
        f"process(es)): T={c['turns']} turns x "
        f"K={c['tokens']} tokens, {c['engines']} fake engines at "
        f"{c['per_token_ms']} ms/token, tool latency lognormal mean {c['mean']} s sigma {c['sigma']}",
        f"{'N':>6}{'wall s':>9}{'bound s':>9}{'x bound':>9}{'lag p99':>9}{'lag max':>9}{'in flight':>10}"
        f"{'RSS/traj':>10}{'CPU/turn':>10}{'CPU x':>7}{'RSS x':>7}{'GC max':>9}",
    ]
    base = out["sizes"][0]
    for r in out["sizes"]:
        lines.append(
            f"{r['n']:>6}{r['wall_s']:>9.2f}{r['bound_s']:>9.2f}{r['ratio_to_bound']:>9.3f}"
            f"{r['loop_lag_p99_ms']:>7.0f}ms{r['loop_lag_max_ms']:>7.0f}ms{r['peak_in_flight']:>10}"
            f"{r['rss_per_trajectory_kb']:>8.1f}kB{r['cpu_per_turn_ms']:>8.3f}ms"
            f"{r['cpu_per_turn_ms'] / max(base['cpu_per_turn_ms'], 1e-9):>7.2f}"
            f"{r['rss_per_trajectory_kb'] / max(base['rss_per_trajectory_kb'], 1e-9):>7.2f}"
            f"{r['gc_pause_max_ms']:>7.0f}ms")
    big = out["sizes"][-1]
    lines.append(f"goal at N={big['n']}: wall <= {GOAL_BOUND_RATIO}x bound: {big['ratio_to_bound']:.3f}x "
                 f"({'met' if big['ratio_to_bound'] <= GOAL_BOUND_RATIO else 'NOT met'}); loop lag p99 < "
                 f"{GOAL_LAG_P99_MS:g} ms: {big['loop_lag_p99_ms']:g} ms "
                 f"({'met' if big['loop_lag_p99_ms'] < GOAL_LAG_P99_MS else 'NOT met'})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256,1024,4096", help="comma-separated N (trajectories in flight)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per turn (the reply is cut or padded)")
    parser.add_argument("--engines", type=int, default=4, help="fake engines in the fleet")
    parser.add_argument("--backend", default="openai", choices=("openai", "synthetic"),
                        help="openai: the fake fleet over HTTP; synthetic: the same replies in process (no HTTP)")
    parser.add_argument("--per-token-ms", type=float, default=1.0)
    parser.add_argument("--mean", type=float, default=1.0, help="mean tool latency, seconds")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the tool latency")
    parser.add_argument("--flush-groups", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1,
                        help="rollout processes per N, each with its share of the tasks (rollout --worker I/W)")
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", default=None, help="write a cProfile of the largest N's rollout here")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--codec", action="store_true",
                        help="only measure per-turn ChatCodec calls/s, shortcuts vs general path")
    parser.add_argument("--codec-calls", type=int, default=2000, help="turns per --codec round")
    parser.add_argument("--codec-general", action="store_true",
                        help="run the rollout with ChatCodec's shortcuts off (the general path)")
    parser.add_argument("--serve-fleet", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--reply-ids", default="[]", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--urls", default="[]", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fleet:
        serve_fleet(args.serve_fleet, json.loads(args.reply_ids), args.per_token_ms / 1000)
        return
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.codec:
        result = codec_turns(rounds=5, calls=args.codec_calls)
        for name in ("latency-env", "tool-output"):
            r = result[name]
            print(f"codec per turn ({name}): general path {r['general_per_s']}/s, shortcuts "
                  f"{r['shortcuts_per_s']}/s: x{r['speedup']:.2f} (same ids on every call)", file=sys.stderr)
        if args.json:
            print(json.dumps(result))
        return
    if args.child:  # one N in a fresh process, so its RSS and CPU are its own: JSON on stdout
        ChatCodec.shortcuts = not args.codec_general
        with tempfile.TemporaryDirectory(prefix="rollout-scale-") as tmp:
            print(json.dumps(asyncio.run(one_size(json.loads(args.urls), args.sizes[0], args, tmp))))
        return
    from transformers import AutoTokenizer

    from arlctl.inference.scripted import end_of_message_ids

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir()), local_files_only=True)
    words = tokenizer(REPLY, add_special_tokens=False)["input_ids"]
    reply_ids = (words * args.tokens)[: args.tokens - 1] + end_of_message_ids(tokenizer)  # K tokens, ends a turn
    fleet, urls = start_fleet(args.engines, reply_ids, args.per_token_ms / 1000) if args.backend == "openai" \
        else (None, [])
    try:
        sizes = [run_child(n, urls, reply_ids, args) for n in args.sizes]
    finally:
        if fleet is not None:
            fleet.stdin.close()  # type: ignore[union-attr]
            fleet.wait(timeout=30)
    out = {"config": {"backend": args.backend, "turns": args.turns, "tokens": args.tokens, "engines": args.engines,
                      "codec": "general" if args.codec_general else "shortcuts", "workers": args.workers,
                      "per_token_ms": args.per_token_ms, "mean": args.mean, "sigma": args.sigma,
                      "seed": args.seed}, "sizes": sizes}
    print(report(out), file=sys.stderr)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
