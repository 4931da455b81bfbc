"""Soak: the math pipeline under `arlctl up`'s supervisor for --minutes, with a stage SIGKILLed every
--kill-every seconds, then drained and audited for exactly-once. Not in CI (30 minutes by default).

    .venv/bin/python benchmarks/soak.py                              # SmolLM2-135M, 30 minutes
    .venv/bin/python benchmarks/soak.py --policy tiny --minutes 1    # the plumbing in about 3 minutes

Prints throughput (trajectories and train steps per minute of the rollout phase), the staleness
distribution (trainer step at a trajectory's start minus its policy version), restarts per process, the
kills, and the audit of arlctl.audit.audit_run (the same function tests/chaos asserts on). --json writes
the whole report to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from arlctl.audit import audit_run
from arlctl.supervisor import STAGES, Supervisor, parse_recipe, run


def soak_recipe(args: argparse.Namespace) -> dict:
    small = args.policy == "tiny"
    return {
        "run": args.run,
        "restart": {"backoff_start_s": 1, "backoff_cap_s": 30, "healthy_after_s": 60},
        "stop_grace_s": 60,
        "refresh_s": 2,
        "stages": {
            "rollout": {"args": {"env": "math", "tasks": f"builtin:math?n={args.tasks}&seed={args.seed}&difficulty=1",
                                 "policy": args.policy, "group-size": args.group_size, "concurrency": args.concurrency,
                                 "max-turns": 1 if small else 2, "max-new-tokens": 8 if small else 96,
                                 "env-opt": ["on_no_action=end"] + ([] if small else ["tools=none"]), "flush-groups": 1 if small else 4,
                                 "max-pending": args.max_pending, "max-staleness": args.max_staleness, "poll": 2}},
            "reward": {"workers": 2, "args": {"reward": "math",
                                              "reward-opt": ["fallback=last_number", "format_weight=0.5"], "poll": 2}},
            "filter": {"args": {"batch-groups": args.batch_groups, "keep-uniform": 0.5 if small else 0.0,
                                "max-lag": args.max_staleness + 2, "poll": 2}},
            "train": {"args": {"policy": args.policy, "lr": 1e-3 if small else 2e-6, "poll": 2}},
            "sync": {"args": {"poll": 2}},
        },
    }


class Killer:
    """SIGKILL one running process every `every` seconds (seeded, a shuffled round over the stages) while
    rollout runs; stop rollout at `rollout_for` seconds. Rollout is killed again only once its restart
    committed a shard, so a slow start cannot starve the run."""

    def __init__(self, every: float, rollout_for: float, seed: int, min_uptime: float = 20.0):
        self.every, self.rollout_for, self.min_uptime = every, rollout_for, min_uptime
        self.rng = random.Random(seed)
        self.round: list[str] = []
        self.next_kill = every
        self.kills: list[tuple[float, str]] = []
        self.rollout_stopped_at: float | None = None
        self.rollout_shards = 0
        self.rollout_floor = 0  # rollout shards when rollout was last killed

    def on_state(self, sup: Supervisor, state: dict) -> None:
        self.rollout_shards = state["stages"]["rollout"]["output_shards"]

    def __call__(self, sup: Supervisor, elapsed: float) -> None:
        if self.rollout_stopped_at is None and elapsed >= self.rollout_for:
            self.rollout_stopped_at = elapsed
            sup.log(f"soak: {elapsed:.0f}s, stopping rollout; draining")
            sup.stop_stage("rollout")
        if self.rollout_stopped_at is not None or elapsed < self.next_kill:
            return
        self.next_kill = elapsed + self.every
        if not self.round:
            self.round = list(STAGES)
            self.rng.shuffle(self.round)
        stage = self.round.pop()
        victims = [c for c in sup.running(stage) if time.time() - c.started_at >= self.min_uptime]
        if stage == "rollout" and self.rollout_shards <= self.rollout_floor:
            victims = []
        if victims:
            victim = self.rng.choice(sorted(victims, key=lambda c: c.index))
            sup.kill(victim)
            self.kills.append((round(elapsed, 1), victim.name))
            if stage == "rollout":
                self.rollout_floor = self.rollout_shards


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="Rollout phase length (then drain).")
    parser.add_argument("--drain-minutes", type=float, default=15.0, help="Longest drain after rollout stops.")
    parser.add_argument("--policy", default="default", help="default (SmolLM2-135M-Instruct) or tiny.")
    parser.add_argument("--run", default=None, help="Run directory (default runs/soak-<utc>).")
    parser.add_argument("--kill-every", type=float, default=60.0, help="Seconds between SIGKILLs (0: none).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=256, help="Tasks per epoch.")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batch-groups", type=int, default=4)
    parser.add_argument("--max-pending", type=int, default=256)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--json", default=None, help="Write the report to this file.")
    args = parser.parse_args()
    if args.policy == "tiny" and args.group_size == 8:
        args.group_size, args.concurrency = 4, 8
    args.run = args.run or os.path.join("runs", time.strftime("soak-%Y%m%dT%H%M%SZ", time.gmtime()))

    rollout_for = args.minutes * 60
    killer = Killer(args.kill_every or float("inf"), rollout_for, args.seed)
    sup = Supervisor(parse_recipe(soak_recipe(args), source="soak"),
                     log=lambda line: print(time.strftime("%H:%M:%S"), line, file=sys.stderr, flush=True))
    print(f"soak: {args.run}, policy {args.policy}, {args.minutes:g} min + drain, kill every {args.kill_every:g}s",
          file=sys.stderr)
    result = run(sup, for_s=rollout_for + args.drain_minutes * 60, until_drained=True, on_tick=killer,
                 on_state=killer.on_state)
    report = audit_run(args.run, drained=result.stopped_by == "drained", latest_history=result.policy_history)

    minutes = (killer.rollout_stopped_at or result.seconds) / 60
    lags = report.staleness
    summary = {
        "run": args.run, "policy": args.policy, "stopped_by": result.stopped_by,
        "rollout_minutes": round(minutes, 2), "total_minutes": round(result.seconds / 60, 2),
        "trajectories": report.trajectories, "trajectories_per_min": round(report.trajectories / minutes, 2),
        "train_steps": report.trainer_step, "train_steps_per_min": round(report.trainer_step / minutes, 2),
        "staleness": {str(k): v for k, v in lags.items()},
        "staleness_max": max(lags) if lags else None,
        "kills": len(killer.kills), "restarts": result.restarts, "restarts_total": sum(result.restarts.values()),
        "policy_versions_seen": result.policy_history,
        "audit": report.as_dict(),
    }
    print(f"throughput: {summary['trajectories_per_min']} trajectories/min, {summary['train_steps_per_min']} "
          f"train steps/min over {minutes:.1f} min of rollout ({report.trajectories} trajectories, "
          f"{report.trainer_step} steps); stopped: {result.stopped_by} after {result.seconds / 60:.1f} min")
    total = sum(lags.values()) or 1
    print("staleness at start (trainer step - policy version): "
          + ", ".join(f"{k}: {v} ({100 * v / total:.0f}%)" for k, v in lags.items()))
    print(f"kills: {len(killer.kills)}; restarts: {summary['restarts_total']} {result.restarts}")
    print(f"audit: {'OK' if report.ok else 'FAILED'} — {report.trajectories} trajectories: {report.trained} trained "
          f"once, {sum(report.dropped.values())} dropped by rule {report.dropped}, {report.in_flight} in flight; "
          f"trainer step {report.trainer_step} == {report.consumed_batches} consumed batches; "
          f"LATEST history {result.policy_history}")
    for problem in report.problems:
        print(f"  problem: {problem}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1, default=str)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
