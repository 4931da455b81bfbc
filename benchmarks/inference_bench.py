"""Inference backends on the same math rollout: hf vs vllm tokens/s, and vLLM's prefix-cache hit rate vs load.

  python benchmarks/inference_bench.py --part ratio                      # SmolLM2-135M, hf vs vllm
  python benchmarks/inference_bench.py --part ratio --n 8 -G 2 --threads 1 --json
  .venv-vllm/bin/python benchmarks/inference_bench.py --part cache --concurrency 1 4 16 64

Part "ratio": the same `arlctl rollout --json` (builtin math tasks, G samples each, multi-turn with the
calculator tool; same tasks, G, turns, max tokens, temperature and seed) run as a subprocess once per
backend, each in its own virtualenv: hf in .venv (--hf-python), vllm in .venv-vllm (--vllm-python).
The two venvs carry different transformers builds; running hf inside .venv-vllm measured it abnormally
slowly, so each backend gets its proper environment. Reports each run's generated tokens/s (the rollout's
own counter: generated tokens over the loop's wall time, model loading excluded) and the vllm/hf ratio.
Fairness: both children get the same CPU budget. --threads N (default 1) pins each whole child process
tree to the same N cores (the last N this process may use) with OMP_NUM_THREADS=N; for vLLM the OMP
threads are bound to exactly those cores (VLLM_CPU_OMP_THREADS_BIND=<cores>) instead of its automatic
binding, which on a small machine reserves a core and leaves the other to the engine. --repeats R runs the
pair R times (hf, vllm, hf, vllm, ...) and reports the median of each, to dilute a noisy machine; the load
average is recorded before and after each run.

Part "cache": the KV residency effect. The same rollout with the vllm backend at growing concurrency
(trajectories in flight) and a deliberately small KV cache (--kv-blocks blocks; 128 tokens each on CPU). Every
later turn of a trajectory re-sends its whole history; the history is still cached if the trajectory's
blocks survived while the others generated. The hit rate (cached prompt tokens / prompt tokens) stays
high while all in-flight trajectories fit the cache and falls once they do not. It runs the engine in this
process: run it with the vllm virtualenv's python (the engine runs in a child process, hence the main guard).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def config(args: argparse.Namespace, concurrency: int) -> Any:
    from arlctl.stages.agent_loop import RolloutConfig

    return RolloutConfig(env="math", group_size=args.group_size, concurrency=concurrency, max_turns=args.turns,
                         max_new_tokens=args.max_new_tokens, max_tokens=args.max_new_tokens * args.turns * 2,
                         max_context=2048, temperature=1.0, seed=0)


async def run_rollout(policy: Any, tasks: list[dict[str, Any]], cfg: Any) -> dict[str, Any]:
    from arlctl.envs.registry import make_env
    from arlctl.stages.agent_loop import Stats
    from arlctl.stages.rollout import rollout

    rows: list[Any] = []

    async def sink(group: list[Any]) -> None:
        rows.extend(group)

    stats = Stats()
    t0 = time.monotonic()
    await rollout(tasks, policy, lambda: make_env("math"), cfg, sink, stats=stats)
    wall = time.monotonic() - t0
    return {"trajectories": len(rows), "turns": sum(len(r.turns) for r in rows),
            "generated_tokens": stats.generated_tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(stats.generated_tokens / wall, 1)}


def make_vllm_policy(spec: str, **opts: Any) -> Any:
    from arlctl.inference.loader import resolve_policy
    from arlctl.inference.vllm import VLLMPolicy

    resolved = resolve_policy(spec, progress=False)
    return VLLMPolicy(resolved.path, name=resolved.name, **opts)


def pinned_cores(threads: int) -> list[int]:
    """The last `threads` cores this process may run on (core 0 tends to take the machine's interrupts)."""
    allowed = sorted(os.sched_getaffinity(0))
    if threads > len(allowed):
        raise SystemExit(f"--threads {threads}: only {len(allowed)} cores are available")
    return allowed[-threads:]


def rollout_command(args: argparse.Namespace, backend: str, out: str) -> list[str]:
    python = args.hf_python if backend == "hf" else args.vllm_python
    return [python, "-m", "arlctl.cli.main", "rollout", "--env", "math",
            "--tasks", f"builtin:math?n={args.n}&seed=0", "--policy", args.policy, "--backend", backend,
            "-G", str(args.group_size), "-c", str(args.ratio_concurrency), "--max-batch", str(args.max_num_seqs),
            "--max-turns", str(args.turns), "--max-new-tokens", str(args.max_new_tokens),
            "--max-tokens", str(args.max_new_tokens * args.turns * 2), "--temperature", "1.0", "--seed", "0",
            "--out", out, "--json", "--quiet"]


def run_backend(args: argparse.Namespace, backend: str, cores: list[int]) -> dict[str, Any]:
    """One `arlctl rollout --json` in the backend's own venv, pinned to `cores`; its summary, trimmed."""
    cpu_list = ",".join(map(str, cores))
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cores)), "MKL_NUM_THREADS": str(len(cores)),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if backend == "vllm":
        env.update(VLLM_CPU_OMP_THREADS_BIND=cpu_list, VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"inference-bench-{backend}-") as out:
        t0 = time.monotonic()
        proc = subprocess.run(rollout_command(args, backend, out), env=env, cwd=ROOT, capture_output=True,
                              text=True, preexec_fn=lambda: os.sched_setaffinity(0, cores))
        total = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{backend} rollout failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    metrics = summary.get("backend_metrics") or {}
    result = {"trajectories": summary["trajectories"], "generated_tokens": summary["generated_tokens"],
              "rollout_s": round(summary["seconds"], 2), "process_s": round(total, 2),
              "tokens_per_s": round(summary["generated_tokens_per_s"], 2), "errors": summary["errors"],
              "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    if "prefix_cache_hit_rate" in metrics:
        result["prefix_cache_hit_rate"] = round(metrics["prefix_cache_hit_rate"], 3)
    if summary["errors"]:
        result["last_error"] = summary.get("last_error")
    if not summary["generated_tokens"]:
        raise SystemExit(f"{backend} rollout generated nothing: {summary.get('last_error')}")
    return result


def part_ratio(args: argparse.Namespace) -> dict[str, Any]:
    cores = pinned_cores(args.threads)
    runs: dict[str, list[dict[str, Any]]] = {"hf": [], "vllm": []}
    for _ in range(args.repeats):
        for backend in ("hf", "vllm"):
            runs[backend].append(run_backend(args, backend, cores))
            print(f"{backend}: {runs[backend][-1]}", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"cores": cores, "threads": args.threads, "runs": runs}
    for backend in ("hf", "vllm"):
        out[f"{backend}_tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in runs[backend])
    out["vllm_over_hf_tokens_per_s"] = round(out["vllm_tokens_per_s"] / max(out["hf_tokens_per_s"], 1e-9), 2)
    return out


async def part_cache(args: argparse.Namespace, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    policy = make_vllm_policy(args.policy, max_num_seqs=args.max_num_seqs, max_model_len=2048,
                              enforce_eager=not args.compiled, num_gpu_blocks_override=args.kv_blocks)
    results = []
    try:
        for concurrency in args.concurrency:
            await policy.reset_prefix_cache()
            before = dict(policy.stats)
            n_tasks = max(1, -(-concurrency * 2 // args.group_size))  # two waves of trajectories
            summary = await run_rollout(policy, tasks[:n_tasks], config(args, concurrency))
            prompt = policy.stats["prompt_tokens"] - before["prompt_tokens"]
            cached = policy.stats["cached_prompt_tokens"] - before["cached_prompt_tokens"]
            summary.update(concurrency=concurrency, prompt_tokens=prompt, cached_prompt_tokens=cached,
                           prefix_cache_hit_rate=round(cached / max(prompt, 1), 3))
            results.append(summary)
            print(f"cache: {summary}", flush=True)
    finally:
        await policy.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--part", choices=["ratio", "cache", "both"], default="both")
    parser.add_argument("--n", type=int, default=8, help="math tasks for the ratio part")
    parser.add_argument("--group-size", "-G", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--ratio-concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="ratio: cores (and OMP threads) for each backend")
    parser.add_argument("--repeats", type=int, default=1, help="ratio: hf/vllm pairs to run (median reported)")
    parser.add_argument("--hf-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--kv-blocks", type=int, default=24, help="KV cache blocks (128 tokens on CPU) for the cache part")
    parser.add_argument("--compiled", action="store_true", help="vLLM compiled mode (slower start, ~3x faster)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report: dict[str, Any] = {"policy": args.policy, "load_avg": [round(x, 2) for x in os.getloadavg()]}
    if args.part in ("ratio", "both"):
        report["ratio"] = part_ratio(args)
    if args.part in ("cache", "both"):
        from arlctl.envs.tasks import load_tasks

        tasks = load_tasks("builtin:math?n=64&seed=0", env="math")
        report["cache"] = asyncio.run(part_cache(args, tasks))
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
