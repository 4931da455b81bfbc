"""Rollout overlap: the arlctl agent loop vs turn-lockstep batching vs one trajectory at a time.

  python benchmarks/rollout_overlap.py                          # tiny model, N=32 trajectories x T=8 turns
  python benchmarks/rollout_overlap.py --policy default --n 16 --turns 4 --json
  python benchmarks/rollout_overlap.py --n 64 --turns 16 --modes arlctl,lockstep,minimal   # a >= 3x ceiling

N trajectories x T turns against an environment whose tool latency is long-tailed: lognormal with mean
0.5 s and sigma 1.5 (p99 = exp(mu + 2.326 sigma) = 5.3 s), drawn once, seeded, as a matrix [N, T] that
every mode replays. Every turn generates exactly K tokens (EOS is ignored, no stop ids), so every mode
does the same generation work and differs only in how it overlaps generation with tool waits:

  (a) arlctl    `arlctl.stages.rollout.rollout` (one coroutine per trajectory, concurrency N) with an env
                whose step sleeps latency[i, t] and that is done after T turns
  (b) lockstep  every live trajectory generates (all calls issued at once, so the backend batches them),
                then every tool runs and the batch waits for the slowest, turn after turn
  (c) serial    one trajectory at a time
  minimal       (diagnostic, --modes) a bare overlapped loop with no arlctl bookkeeping: if arlctl is far
                from the bound but close to this, the gap is the backend, not the agent loop

Lower bound = max(generation time at full batch: the same N x T generate calls with zero tool latency at
concurrency N, the longest trajectory's own critical path: max_i sum_t latency[i, t] + T x the batch-1
generation latency per turn). Each mode's wall time is printed with its ratio to the bound. Note that
(b) / bound is the largest speedup over lockstep any loop could show on this latency draw; it is printed
as the "ceiling" next to the goal, because at small N x T the draw alone can put the goal out of reach.
The bound is only reachable when generation is cheap next to the tools: when full-batch generation time
approaches the critical path, the critical trajectory's turns share a saturated backend and no loop can
run them at batch-1 speed (then give the backend more --threads, or a faster backend).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arlctl.envs.base import Action, EnvReset, StepResult
from arlctl.inference.base import Generation, Policy, SamplingParams
from arlctl.inference.chat import ChatCodec
from arlctl.inference.loader import load_policy
from arlctl.schemas.rows import TrajectoryRow
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout import rollout

MEAN_LATENCY_S = 0.5
SIGMA = 1.5  # exp(2.326 * 1.5 - 1.5**2 / 2) = 10.6: the p99 is 10.6x the mean, 5.3 s
GOAL_BOUND_RATIO = 1.2  # arlctl wall / lower bound
GOAL_LOCKSTEP_SPEEDUP = 3.0  # lockstep wall / arlctl wall
OBSERVATION = [{"role": "tool", "name": "work", "content": "ok"}]


def draw_latencies(
    n: int, turns: int, seed: int, mean: float = MEAN_LATENCY_S, sigma: float = SIGMA
) -> np.ndarray:
    """Tool latencies [n, turns] in seconds: lognormal with the given mean (mu = ln(mean) - sigma^2 / 2)."""
    mu = math.log(mean) - sigma**2 / 2
    return np.random.default_rng(seed).lognormal(mu, sigma, size=(n, turns))


def task_messages(index: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are an agent. Call the work tool until the job is done."},
        {"role": "user", "content": f"Job {index}: start working."},
    ]


class SleepEnv:
    """An Env whose tool takes latency[i, t] seconds (asyncio.sleep) and that ends after exactly T turns."""

    name = "sleep"
    version = "1"

    def __init__(self, latencies: np.ndarray, calls: list[tuple[int, int]] | None = None):
        self.latencies = latencies
        self.calls = calls  # when given, every step appends (trajectory, turn): the smoke test reads it
        self.index = 0
        self.turn = 0

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        self.index, self.turn = int(task["index"]), 0
        return EnvReset(messages=task_messages(self.index), tools=[])

    def parse_action(self, text: str) -> Action:
        return Action(text=text)  # the tool runs whatever the model wrote: no parsing cost, no parse errors

    async def step(self, action: Action) -> StepResult:
        if self.calls is not None:
            self.calls.append((self.index, self.turn))
        await asyncio.sleep(float(self.latencies[self.index, self.turn]))
        self.turn += 1
        done = self.turn >= self.latencies.shape[1]
        return StepResult(observations=list(OBSERVATION), done=done, final_state="done" if done else None)

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------------------------- measurement helpers


@dataclass
class LoopLag:
    """How late a 10 ms timer fires: evidence of anything blocking the event loop during a mode."""

    lags: list[float] = field(default_factory=list)
    _task: asyncio.Task | None = None

    async def _watch(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            self.lags.append(time.perf_counter() - t - 0.01)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> dict[str, float]:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        lags = sorted(self.lags) or [0.0]
        return {"p99_ms": 1000 * lags[int(0.99 * (len(lags) - 1))], "max_ms": 1000 * lags[-1]}


@dataclass
class ModeResult:
    name: str
    wall_s: float
    gen_latencies_s: list[float]  # per generate call, as its caller saw it (queueing included)
    tokens_per_turn: list[int]
    turns_per_trajectory: list[int]
    backend: dict[str, float]
    loop_lag: dict[str, float]

    def summary(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 3),
            "mean_gen_latency_s": round(statistics.fmean(self.gen_latencies_s or [0.0]), 4),
            "generate_calls": len(self.gen_latencies_s),
            "tokens_per_turn_min": min(self.tokens_per_turn or [0]),
            "tokens_per_turn_max": max(self.tokens_per_turn or [0]),
            "turns_min": min(self.turns_per_trajectory or [0]),
            "turns_max": max(self.turns_per_trajectory or [0]),
            **{f"backend_{k}": v for k, v in self.backend.items()},
            **{f"loop_lag_{k}": round(v, 2) for k, v in self.loop_lag.items()},
        }


def _backend_counters(policy: Policy) -> dict[str, int]:
    stats = getattr(policy, "stats", None) or {}
    return {k: int(stats.get(k, 0)) for k in ("generated_tokens", "decode_steps")}


def _backend_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    steps = after["decode_steps"] - before["decode_steps"]
    tokens = after["generated_tokens"] - before["generated_tokens"]
    # Every sampled token is one row of one forward (prefill or decode): tokens / steps ~ mean batch rows.
    return {"decode_steps": steps, "mean_rows_per_step": round(tokens / max(steps, 1), 2)}


async def _measured(name: str, policy: Policy, body: Any) -> ModeResult:
    """Run the coroutine `body` (returning gen latencies, tokens per turn, turns per trajectory) under timing."""
    before, lag = _backend_counters(policy), LoopLag()
    lag.start()
    start = time.perf_counter()
    gen_latencies, tokens, turns = await body
    wall = time.perf_counter() - start
    lag_stats = await lag.stop()
    backend = _backend_delta(before, _backend_counters(policy))
    return ModeResult(name, wall, gen_latencies, tokens, turns, backend, lag_stats)


# ------------------------------------------------------------------ reference loops (not the arlctl loop)


@dataclass
class Conversation:
    """One trajectory's token ids, grown as the arlctl loop grows them (sampled ids + observation segment)."""

    ids: list[int]
    gen_latencies_s: list[float] = field(default_factory=list)
    tokens_per_turn: list[int] = field(default_factory=list)


def _sampling(tokens: int, seed: int, index: int, turn: int) -> SamplingParams:
    return SamplingParams(
        temperature=1.0, max_new_tokens=tokens, seed=(seed * 1_000_003 + index * 1_009 + turn) % 2**31
    )


def _conversations(codec: ChatCodec, n: int) -> list[Conversation]:
    return [Conversation(ids=list(codec.prompt(task_messages(i), []).ids)) for i in range(n)]


async def _generate_turn(policy: Policy, conv: Conversation, sampling: SamplingParams) -> Generation:
    t = time.perf_counter()
    gen = await policy.generate(conv.ids, sampling)
    conv.gen_latencies_s.append(time.perf_counter() - t)
    conv.tokens_per_turn.append(len(gen.ids))
    conv.ids.extend(gen.ids)
    return gen


def _append_observation(codec: ChatCodec, conv: Conversation, gen: Generation) -> None:
    _, glue = codec.split_generation(gen.ids)
    conv.ids.extend(codec.continuation(glue, OBSERVATION).ids)


def _collect(convs: list[Conversation]) -> tuple[list[float], list[int], list[int]]:
    return (
        [s for c in convs for s in c.gen_latencies_s],
        [k for c in convs for k in c.tokens_per_turn],
        [len(c.tokens_per_turn) for c in convs],
    )


async def free_running(
    policy: Policy, codec: ChatCodec, latencies: np.ndarray, tokens: int, seed: int, concurrency: int
) -> tuple[list[float], list[int], list[int]]:
    """Each trajectory runs its own turns at its own pace, `concurrency` at a time (1 = serial)."""
    n, turns = latencies.shape
    convs, slots = _conversations(codec, n), asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with slots:
            for t in range(turns):
                gen = await _generate_turn(policy, convs[i], _sampling(tokens, seed, i, t))
                if latencies[i, t] > 0:
                    await asyncio.sleep(float(latencies[i, t]))
                if t < turns - 1:
                    _append_observation(codec, convs[i], gen)

    await asyncio.gather(*(one(i) for i in range(n)))
    return _collect(convs)


async def lockstep(
    policy: Policy, codec: ChatCodec, latencies: np.ndarray, tokens: int, seed: int
) -> tuple[list[float], list[int], list[int]]:
    """Naive batch rollout: the whole batch generates, then the whole batch waits for its slowest tool."""
    n, turns = latencies.shape
    convs = _conversations(codec, n)
    for t in range(turns):
        # 1. Every trajectory generates; the calls are issued together so the backend batches them.
        gens = await asyncio.gather(
            *(_generate_turn(policy, convs[i], _sampling(tokens, seed, i, t)) for i in range(n))
        )
        # 2. Every tool runs concurrently; the turn ends when the slowest one returns.
        await asyncio.gather(*(asyncio.sleep(float(latencies[i, t])) for i in range(n)))
        if t < turns - 1:
            for conv, gen in zip(convs, gens, strict=True):
                _append_observation(codec, conv, gen)
    return _collect(convs)


async def arlctl_loop(
    policy: Policy, latencies: np.ndarray, tokens: int, seed: int, calls: list[tuple[int, int]] | None = None
) -> tuple[list[float], list[int], list[int]]:
    """The real agent loop, concurrency N, group size 1: trajectory i replays row i of the latencies."""
    n, turns = latencies.shape
    cfg = RolloutConfig(
        env="sleep",
        group_size=1,
        concurrency=n,
        max_turns=turns,
        max_new_tokens=tokens,
        max_tokens=1 << 30,
        max_context=1 << 30,
        step_timeout=float(latencies.max()) + 60.0,
        trajectory_timeout=1e9,
        temperature=1.0,
        seed=seed,
    )
    rows: list[TrajectoryRow] = []

    async def sink(group: list[TrajectoryRow]) -> None:
        rows.extend(group)

    tasks = [{"task_id": f"job-{i}", "index": i} for i in range(n)]
    await rollout(tasks, policy, lambda: SleepEnv(latencies, calls), cfg, sink)
    # Every reply is forced to `tokens` tokens, so a last reply cut by the budget is truncated: completed.
    bad = [r.status for r in rows if r.status not in ("ok", "truncated")]
    if len(rows) != n or bad:
        raise RuntimeError(f"arlctl loop: {len(rows)} rows of {n}, statuses not completed: {bad[:5]}")
    return (
        [turn.gen_latency_s for r in rows for turn in r.turns],
        [turn.gen_len for r in rows for turn in r.turns],
        [len(r.turns) for r in rows],
    )


# ------------------------------------------------------------------------------------------------ driver


def lower_bound(latencies: np.ndarray, gen_full_s: float, gen_single_turn_s: float) -> dict[str, float]:
    """max(generation at full batch, the longest trajectory's critical path: its tools + T batch-1 turns)."""
    turns = latencies.shape[1]
    critical = float(latencies.sum(axis=1).max()) + turns * gen_single_turn_s
    return {
        "bound_s": max(gen_full_s, critical),
        "gen_full_batch_s": gen_full_s,
        "critical_path_s": critical,
        "gen_single_turn_s": gen_single_turn_s,
    }


def latency_summary(latencies: np.ndarray) -> dict[str, float]:
    flat = latencies.ravel()
    return {
        "mean_s": float(flat.mean()),
        "p50_s": float(np.quantile(flat, 0.5)),
        "p99_s": float(np.quantile(flat, 0.99)),
        "max_s": float(flat.max()),
        "lockstep_tool_s": float(latencies.max(axis=0).sum()),
        "longest_trajectory_tool_s": float(latencies.sum(axis=1).max()),
    }


def ignore_eos(policy: Policy) -> None:
    """Make every turn generate exactly max_new_tokens: the hf backend stops on EOS unless told otherwise."""
    if hasattr(policy, "_eos_ids"):
        # The Policy protocol has no ignore_eos sampling flag yet; the hf backend adds its EOS ids to the stop
        # set of every request from this attribute, so emptying it is the benchmark-only way to switch it off.
        policy._eos_ids = frozenset()  # type: ignore[attr-defined]
    else:
        print(
            "warning: cannot switch off EOS on this backend; turns may be shorter than --tokens",
            file=sys.stderr,
        )


async def run_benchmark(
    policy: Policy,
    n: int,
    turns: int,
    tokens: int,
    seed: int,
    modes: tuple[str, ...] = ("arlctl", "lockstep", "serial"),
    mean_latency: float = MEAN_LATENCY_S,
) -> dict[str, Any]:
    """Every measurement of one run, as a dict (the --json output). Tests shrink `mean_latency`."""
    codec = ChatCodec(policy.tokenizer)
    latencies = draw_latencies(n, turns, seed, mean=mean_latency)
    zero = np.zeros_like(latencies)
    # Warm-up: one full batch, so lazy initialisation and allocator growth land outside every timing.
    await free_running(policy, codec, zero[:, :1], tokens, seed + 1, concurrency=n)
    single = await _measured(
        "gen_single", policy, free_running(policy, codec, zero[: min(n, 2)], tokens, seed, 1)
    )
    full = await _measured("gen_full", policy, free_running(policy, codec, zero, tokens, seed, concurrency=n))
    bound = lower_bound(latencies, full.wall_s, statistics.fmean(single.gen_latencies_s))
    bodies = {
        "arlctl": lambda: arlctl_loop(policy, latencies, tokens, seed),
        "lockstep": lambda: lockstep(policy, codec, latencies, tokens, seed),
        "serial": lambda: free_running(policy, codec, latencies, tokens, seed, concurrency=1),
        "minimal": lambda: free_running(policy, codec, latencies, tokens, seed, concurrency=n),
    }
    results = {m: await _measured(m, policy, bodies[m]()) for m in modes}
    out: dict[str, Any] = {
        "config": {
            "n": n,
            "turns": turns,
            "tokens": tokens,
            "seed": seed,
            "policy": policy.name,
            "latency_mean_s": mean_latency,
            "latency_sigma": SIGMA,
        },
        "latency": latency_summary(latencies),
        "bound": bound,
        "calibration": {"gen_single": single.summary(), "gen_full": full.summary()},
        "modes": {
            m: {**r.summary(), "ratio_to_bound": round(r.wall_s / bound["bound_s"], 3)}
            for m, r in results.items()
        },
    }
    if "arlctl" in results:
        a = results["arlctl"].wall_s
        out["speedup"] = {
            f"arlctl_over_{m}": round(r.wall_s / a, 3) for m, r in results.items() if m != "arlctl"
        }
        out["goals"] = {
            "arlctl_ratio_to_bound": {
                "goal_max": GOAL_BOUND_RATIO,
                "value": out["modes"]["arlctl"]["ratio_to_bound"],
            },
        }
        if "lockstep" in results:
            out["goals"]["arlctl_over_lockstep"] = {
                "goal_min": GOAL_LOCKSTEP_SPEEDUP,
                "value": out["speedup"]["arlctl_over_lockstep"],
                # No loop can beat the bound, so lockstep / bound caps the speedup this latency draw allows.
                "ceiling": round(results["lockstep"].wall_s / bound["bound_s"], 3),
            }
    return out


def report(out: dict[str, Any]) -> str:
    c, lat, b = out["config"], out["latency"], out["bound"]
    lines = [
        f"rollout overlap: {c['n']} trajectories x {c['turns']} turns x {c['tokens']} tokens, policy {c['policy']}, "
        f"seed {c['seed']}",
        f"tool latency (lognormal, mean {c['latency_mean_s']} s, sigma {c['latency_sigma']}): realised mean "
        f"{lat['mean_s']:.3f} s  p50 {lat['p50_s']:.3f} s  p99 {lat['p99_s']:.2f} s  max {lat['max_s']:.2f} s",
        f"  tools alone: lockstep sum_t max_i = {lat['lockstep_tool_s']:.2f} s, "
        f"longest trajectory sum_t = {lat['longest_trajectory_tool_s']:.2f} s",
        f"generation: full batch (N x T calls, no tools) {b['gen_full_batch_s']:.2f} s; "
        f"batch-1 turn {1000 * b['gen_single_turn_s']:.1f} ms",
        f"lower bound = max({b['gen_full_batch_s']:.2f}, critical path {b['critical_path_s']:.2f}) = {b['bound_s']:.2f} s",
        "",
        f"{'mode':<10}{'wall s':>9}{'x bound':>9}{'gen ms':>9}{'rows/step':>11}{'lag p99 ms':>12}{'tok/turn':>10}",
    ]
    for name, m in out["modes"].items():
        tok = f"{m['tokens_per_turn_min']}-{m['tokens_per_turn_max']}"
        lines.append(
            f"{name:<10}{m['wall_s']:>9.2f}{m['ratio_to_bound']:>9.2f}{1000 * m['mean_gen_latency_s']:>9.1f}"
            f"{m['backend_mean_rows_per_step']:>11.2f}{m['loop_lag_p99_ms']:>12.1f}{tok:>10}"
        )
    for name, value in out.get("speedup", {}).items():
        lines.append(f"speedup {name}: {value:.2f}x")
    goals = out.get("goals", {})
    if "arlctl_ratio_to_bound" in goals:
        g = goals["arlctl_ratio_to_bound"]
        verdict = "met" if g["value"] <= g["goal_max"] else "NOT met"
        lines.append(f"goal: arlctl within {g['goal_max']}x of the bound: {g['value']:.2f}x ({verdict})")
    if "arlctl_over_lockstep" in goals:
        g = goals["arlctl_over_lockstep"]
        verdict = "met" if g["value"] >= g["goal_min"] else "NOT met"
        lines.append(
            f"goal: arlctl >= {g['goal_min']}x faster than lockstep: {g['value']:.2f}x ({verdict}; "
            f"the most this latency draw allows is lockstep/bound = {g['ceiling']:.2f}x)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", default="tiny", help="tiny | default | a model directory")
    parser.add_argument("--n", type=int, default=32, help="trajectories (and concurrency)")
    parser.add_argument("--turns", type=int, default=8, help="turns per trajectory")
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated per turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--modes",
        default="arlctl,lockstep,serial",
        help="comma-separated: arlctl, lockstep, serial, minimal (a bare overlapped loop)",
    )
    # One torch thread by default: on a small shared machine two OpenMP threads fighting the event loop
    # (and other processes) for two cores made a batch-1 forward of the tiny model 5x slower (45 vs 9 ms).
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads for the hf backend (0: torch's default)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object to stdout")
    args = parser.parse_args()
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = set(modes) - {"arlctl", "lockstep", "serial", "minimal"}
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    policy = load_policy(args.policy, max_batch=args.n, num_threads=args.threads or None, progress=True)
    ignore_eos(policy)

    async def go() -> dict[str, Any]:
        try:
            return await run_benchmark(policy, args.n, args.turns, args.tokens, args.seed, modes)
        finally:
            await policy.close()

    out = asyncio.run(go())
    print(report(out), file=sys.stderr)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
