"""Turn-level credit against outcome-only credit on `two-first-tokens`: steps to 0.9 over seeds, with 95% intervals.

Both arms run benchmarks/toy_loop.py's real loop (rollout -> reward -> filter -> train_step, the tiny model)
in "the 1.5x setting" of docs/learning/turn_credit.md (rules lower,letter, 4 tasks x G = 8, lr 1e-2, gamma 0),
seeds 0..N-1, and differ only in filter's --adv: `turn` (one advantage per turn) against `group` (one per
trajectory, from the outcome). For each seed and arm it records the optimizer steps before the first rollout
at a mean outcome >= 0.9; a run that never gets there within --max-steps counts as --max-steps + 1 and is
flagged censored (so any summary that includes it is a bound, not a value).

The summary: the mean steps per arm; the ratio of the means (outcome / turn, > 1: turn credit is faster)
with a 95% percentile bootstrap interval, resampling seeds with replacement and keeping each seed's two
arms together (fixed RNG seed, 10,000 resamples); and the geometric mean of the per-seed ratios with its own
interval from the same resamples. Each run is deterministic on one machine and library set, but the curves
follow the float arithmetic: the seeds are the unit of replication, and the interval is what to read.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/credit_compare.py --seeds 12 --json docs/learning/credit_compare.json

Prints one line per run to stderr, the table and the summary to stdout. About 40 s per seed and arm pair on a
2-core CPU machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # so that `benchmarks.toy_loop` imports when this file runs as a script

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.toy_loop import (  # noqa: E402
    GAMMA,
    GROUP_SIZE,
    LR,
    MAX_STEPS,
    RULES,
    TARGET,
    TASKS_PER_STEP,
    run_arm,
    steps_to_target,
)

ARMS = {"turn": "turn", "outcome": "group"}  # arm name -> filter --adv
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


@dataclasses.dataclass
class Run:
    arm: str
    adv: str
    seed: int
    steps: int  # optimizer steps before the first rollout at >= TARGET; max_steps + 1 when censored
    censored: bool  # never reached TARGET within max_steps
    curve: list[float]  # mean outcome of each step's rollouts, before training on them
    wall_s: float


@dataclasses.dataclass
class Interval:
    value: float
    low: float  # 2.5th percentile of the bootstrap
    high: float  # 97.5th percentile


def run_one(arm: str, seed: int, max_steps: int) -> Run:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"credit-{arm}-{seed}-") as workdir:
        curve = run_arm(ARMS[arm], seed, Path(workdir), max_steps=max_steps)
    reached = steps_to_target(curve)
    return Run(arm=arm, adv=ARMS[arm], seed=seed, steps=max_steps + 1 if reached is None else reached,
               censored=reached is None, curve=curve, wall_s=round(time.perf_counter() - start, 2))


def paired_bootstrap(turn: np.ndarray, outcome: np.ndarray, resamples: int, rng_seed: int) -> dict[str, Interval]:
    """Ratio of mean steps (outcome / turn) and geometric mean of the per-seed ratios, each with a 95%
    percentile interval over `resamples` resamples of the seeds (both arms of a seed drawn together)."""
    # A run at the target before any step would have 0 steps; it counts as 1 so that every ratio is defined
    # (it cannot happen in this setting, where the outcome starts near 0.07).
    turn, outcome = np.maximum(turn, 1).astype(float), np.maximum(outcome, 1).astype(float)  # [S]
    log_ratio = np.log(outcome / turn)  # [S]
    idx = np.random.default_rng(rng_seed).integers(0, len(turn), size=(resamples, len(turn)))  # [R, S]
    ratio_of_means = outcome[idx].mean(axis=1) / turn[idx].mean(axis=1)  # [R]
    geomean = np.exp(log_ratio[idx].mean(axis=1))  # [R]

    def interval(value: float, draws: np.ndarray) -> Interval:
        low, high = np.percentile(draws, [2.5, 97.5])
        return Interval(round(float(value), 4), round(float(low), 4), round(float(high), 4))

    return {"ratio_of_means": interval(outcome.mean() / turn.mean(), ratio_of_means),
            "geomean_paired_ratio": interval(math.exp(log_ratio.mean()), geomean)}


def tree_state() -> dict[str, object]:
    """The commit and whether the code the loop runs differs from it (the numbers follow the float arithmetic)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout

    paths = ["arlctl", "stages", "schemas", "benchmarks/toy_loop.py"]
    dirty = git("status", "--porcelain", "--", *paths).splitlines()
    untracked = sorted(line[3:] for line in dirty if line.startswith("??"))
    digest = hashlib.sha256(git("diff", "HEAD", "--", *paths).encode())
    for path in untracked:
        for file in sorted((REPO / path).rglob("*")) if (REPO / path).is_dir() else [REPO / path]:
            if file.is_file():
                digest.update(file.read_bytes())
    return {"commit": git("rev-parse", "HEAD").strip(), "dirty": [line[3:] for line in dirty],
            "diff_sha256": digest.hexdigest() if dirty else None}


def print_table(runs: dict[str, list[Run]], summary: dict[str, Interval], means: dict[str, float]) -> None:
    mark = {True: "*", False: " "}
    print(f"{'seed':>4}  {'turn':>6}  {'outcome':>8}  {'outcome/turn':>12}")
    for turn, outcome in zip(runs["turn"], runs["outcome"]):
        ratio = max(outcome.steps, 1) / max(turn.steps, 1)
        print(f"{turn.seed:>4}  {turn.steps:>5}{mark[turn.censored]}  {outcome.steps:>7}{mark[outcome.censored]}"
              f"  {ratio:>12.2f}")
    print(f"{'mean':>4}  {means['turn']:>6.2f}  {means['outcome']:>8.2f}")
    for name, label in (("ratio_of_means", "ratio of means (outcome / turn)"),
                        ("geomean_paired_ratio", "geometric mean of per-seed ratios")):
        got = summary[name]
        print(f"{label}: {got.value:.3f}  95% CI [{got.low:.3f}, {got.high:.3f}]")
    censored = sum(r.censored for arm in runs.values() for r in arm)
    if censored:
        print(f"* censored: never reached {TARGET} (counted as max steps + 1); {censored} run(s), so the "
              f"summaries that include them are bounds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=12, help="Seeds 0..N-1 (default 12).")
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS, help=f"Cap per run (default {MAX_STEPS}).")
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help=f"Bootstrap resamples (default {RESAMPLES}).")
    parser.add_argument("--json", type=Path, help="Write settings, every run (curves included) and the summary here.")
    args = parser.parse_args()
    torch.set_num_threads(1)

    tree = tree_state()  # before the runs: the code they import is the code as it is now
    started = time.perf_counter()
    runs: dict[str, list[Run]] = {arm: [] for arm in ARMS}
    for seed in range(args.seeds):
        for arm in ARMS:  # interleaved, so that a change in the machine's load hits both arms alike
            run = run_one(arm, seed, args.max_steps)
            runs[arm].append(run)
            print(f"[{time.perf_counter() - started:7.1f}s] seed {seed:2d} {arm:7s} steps {run.steps:3d}"
                  f"{' (censored)' if run.censored else ''}  {run.wall_s:6.1f}s", file=sys.stderr, flush=True)
    steps = {arm: np.array([r.steps for r in arm_runs]) for arm, arm_runs in runs.items()}  # [S] each
    means = {arm: float(s.mean()) for arm, s in steps.items()}
    summary = paired_bootstrap(steps["turn"], steps["outcome"], args.resamples, BOOTSTRAP_SEED)
    print_table(runs, summary, means)

    if args.json:
        report = {
            "settings": {"rules": list(RULES), "tasks_per_step": TASKS_PER_STEP, "group_size": GROUP_SIZE, "lr": LR,
                         "gamma_turn_arm": GAMMA, "target": TARGET, "max_steps": args.max_steps,
                         "seeds": list(range(args.seeds)), "arms": ARMS},
            "bootstrap": {"resamples": args.resamples, "rng_seed": BOOTSTRAP_SEED, "interval": "percentile 95%",
                          "resampling": "seeds with replacement, both arms of a seed together"},
            "environment": {"python": platform.python_version(), "torch": torch.__version__,
                            "machine": platform.machine(), "cpus": os.cpu_count(),
                            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "tree": tree},
            "steps": {arm: s.tolist() for arm, s in steps.items()},
            "censored": {arm: [r.censored for r in arm_runs] for arm, arm_runs in runs.items()},
            "mean_steps": means,
            "summary": {name: dataclasses.asdict(got) for name, got in summary.items()},
            "runs": [dataclasses.asdict(r) for arm_runs in runs.values() for r in arm_runs],
            "wall_s": round(time.perf_counter() - started, 1),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
