"""Every named learning algorithm on the `two-first-tokens` toy with the tiny model: steps to a target, over seeds.

One real loop per (mode, seed), in process, step for step: the tiny random model as an HF policy samples one
token per turn in the real env through the rollout driver, the env's reward grades each trajectory, filter's
rules and packer make one batch per step with the mode's `--adv`, `train_step` takes one optimizer step with
the mode's train options (a critic for GAE, the frozen reference for REINFORCE++'s KL reward, a teacher for
distillation), and the policy reloads the new weights. The curve is the mean outcome of each step's rollouts,
measured before training on them; "steps" is the number of optimizer steps before the first rollout at or
above the target (an arm that never gets there within --max-steps is censored at --max-steps + 1).

The distillation teacher is the policy that the baseline (ppo-clip, group) reached on seed 0 after
--teacher-steps steps: a model that already solves the task, which the student imitates with no task reward
(--distill-task-coef 0) or with it (1), with the batch baseline (the default) or without.

    .venv/bin/python benchmarks/algorithms_compare.py --seeds 8 --max-steps 20 --json docs/learning/algorithms.json

Prints one line per run to stderr and the table (mean steps, a 95% t-interval over seeds, reached/total) at
the end. Settings: rules lower,letter (docs/learning/turn_credit.md), 4 tasks x G = 8, lr 3e-2, target 0.9.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.toy_loop` when run as a script

from benchmarks.toy_loop import TARGET, run_arm  # noqa: E402

GROUP_SIZE = 8
DEFAULTS = {"lr": 3e-2, "tasks_per_step": 4, "rules": ("lower", "letter")}  # run_mode's loop settings (see main)

# mode name -> (filter --adv, train options). Each differs from the baseline in what it names only.
MODES: dict[str, tuple[str, dict]] = {
    "ppo-clip (GRPO)": ("group", {}),
    "gspo": ("group", {"loss": "gspo", "loss_agg": "seq-mean-token-mean", "eps_low": 3e-4, "eps_high": 4e-4}),
    "cispo": ("group", {"loss": "cispo", "eps_low": 1.0, "eps_high": 0.28}),
    "tis token truncate": ("group", {"tis_cap": 2.0}),
    "is sequence mask": ("group", {"tis_cap": 2.0, "is_level": "sequence", "is_mode": "mask"}),
    "is geometric mask": ("group", {"tis_cap": 2.0, "is_level": "geometric", "is_mode": "mask"}),
    "dr-grpo": ("dr-grpo", {"loss_agg": "seq-mean-token-sum-norm"}),
    "rloo": ("rloo", {}),
    "reinforce++": ("reinforce++", {"kl_in_reward": 0.01}),
    "gae (critic)": ("gae", {"value_coef": 0.5, "gae_lambda": 0.95}),
    "distill": ("distill", {"distill_coef": 1.0, "distill_task_coef": 0.0}),
    "distill + task": ("distill", {"distill_coef": 1.0, "distill_task_coef": 1.0}),
    "distill (no baseline)": ("distill", {"distill_coef": 1.0, "distill_task_coef": 0.0, "distill_baseline": "none"}),
    "distill + task (no baseline)": ("distill", {"distill_coef": 1.0, "distill_task_coef": 1.0,
                                                "distill_baseline": "none"}),
}


def run_mode(adv: str, options: dict, seed: int, workdir: Path, max_steps: int, loop: dict,
             teacher_dir: Path | None = None, save_to: Path | None = None) -> list[float]:
    """The mean outcome of each step's rollouts for one mode and seed (benchmarks/toy_loop.py `run_arm`); stops
    after the first at >= TARGET, unless save_to is given: then it trains max_steps steps and saves the policy.
    loop: lr, tasks_per_step and rules (DEFAULTS)."""
    return run_arm(adv, seed, workdir, max_steps=max_steps, group_size=GROUP_SIZE, **loop,
                   stop_at_target=save_to is None, train_overrides=options,
                   filter_overrides={"keep_uniform": 1.0} if adv == "reinforce++" else None,
                   teacher_dir=teacher_dir if adv == "distill" else None, save_to=save_to)


def steps_to_target(curve: list[float], max_steps: int) -> tuple[int, bool]:
    """(steps, reached): optimizer steps before the first rollout at >= TARGET, or max_steps + 1 (censored)."""
    hit = next((i for i, value in enumerate(curve) if value >= TARGET), None)
    return (max_steps + 1, False) if hit is None else (hit, True)


def t_interval(values: list[float]) -> tuple[float, float]:
    """A 95% Student-t interval of the mean (n - 1 degrees of freedom)."""
    from scipy import stats

    n = len(values)
    if n < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return statistics.mean(values) - half, statistics.mean(values) + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--teacher-steps", type=int, default=20)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of the mode names")
    parser.add_argument("--json", type=Path, help="write every curve and the table here")
    parser.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    parser.add_argument("--tasks-per-step", type=int, default=DEFAULTS["tasks_per_step"])
    parser.add_argument("--rules", default=",".join(DEFAULTS["rules"]), help="the turns' first-character classes; '' for the "
                                                                  "env's default (space, then letter)")
    args = parser.parse_args()
    loop = {"lr": args.lr, "tasks_per_step": args.tasks_per_step,
            "rules": tuple(r for r in args.rules.split(",") if r) or None}
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    report: dict = {"settings": {"tasks_per_step": loop["tasks_per_step"], "group_size": GROUP_SIZE, "lr": loop["lr"],
                                 "target": TARGET, "rules": loop["rules"], "max_steps": args.max_steps,
                                 "seeds": args.seeds},
                    "modes": {}}
    with tempfile.TemporaryDirectory(prefix="arlctl-algos-") as scratch:
        root = Path(scratch)
        teacher_dir = None
        if any(MODES[m][0] == "distill" for m in chosen):
            teacher_dir = root / "teacher"
            started = time.perf_counter()
            curve = run_mode("group", {}, 0, root / "teacher-run", args.teacher_steps, loop, save_to=teacher_dir)
            report["teacher_curve"] = curve
            print(f"teacher: ppo-clip seed 0, {args.teacher_steps} steps, last outcome {curve[-1]:.3f} "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        for name in chosen:
            adv, options = MODES[name]
            runs = []
            for seed in range(args.seeds):
                started = time.perf_counter()
                curve = run_mode(adv, options, seed, root / f"{name}-{seed}", args.max_steps, loop,
                                 teacher_dir=teacher_dir)
                steps, reached = steps_to_target(curve, args.max_steps)
                runs.append({"seed": seed, "steps": steps, "reached": reached, "curve": curve})
                print(f"{name} seed {seed}: {steps}{'' if reached else '+ (censored)'} steps, last {curve[-1]:.3f} "
                      f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
            steps = [r["steps"] for r in runs]
            low, high = t_interval([float(s) for s in steps])
            report["modes"][name] = {"adv": adv, "train": options, "runs": runs, "mean_steps": statistics.mean(steps),
                                     "ci95": [low, high], "reached": sum(r["reached"] for r in runs)}
            if args.json:  # after every mode: a long run that is stopped keeps what it measured
                args.json.write_text(json.dumps(report, indent=1))
    print(f"\n{'mode':<22} {'--adv':<12} {'mean steps':>10} {'95% CI':>16} {'reached':>8}")
    for name, row in report["modes"].items():
        interval = "[{:.1f}, {:.1f}]".format(*row["ci95"])
        print(f"{name:<22} {row['adv']:<12} {row['mean_steps']:>10.2f} {interval:>16} {row['reached']:>5}/{args.seeds}")


if __name__ == "__main__":
    main()
