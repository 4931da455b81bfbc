"""One real RL loop on the `two-first-tokens` toy with the tiny model, in process: the shared piece of the
turn-credit benchmark (benchmarks/credit_compare.py), its test (tests/stages/test_turn_learning.py) and the
runs in docs/learning/turn_credit.md.

Each step: the tiny random model as an HF policy samples one token per turn in the real env through the
rollout driver, the env's reward scores each trajectory, filter's rules pack one batch, train_step takes one
optimizer step, and the policy reloads the new weights from disk. The curve is the mean outcome of each
step's rollouts, measured before training on them; "steps to 0.9" is the number of optimizer steps before the
first rollout at >= 0.9.

The defaults are "the 1.5x setting" of the docs: the rules `lower,letter` (turn 1 must start with a
lower-case ASCII letter, turn 2 with any ASCII letter; the random model hits them 24% and 31% of the time, so
the outcome starts near 0.07), 4 tasks x G = 8 per step, lr 1e-2, gamma 0 for the turn arm (each turn's return
is its own step reward, the outcome added at the last turn), at most 40 steps. Every step's tasks are the same
for every seed and arm; the seed sets torch's and the sampler's. Each request is generated alone, so reruns
on one machine and library set repeat the curves exactly; other float arithmetic moves them a lot.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from arlctl.envs import toy
from arlctl.envs.registry import env_factory, get_reward
from arlctl.inference.hf import HFPolicy
from arlctl.models import tiny_model_dir
from arlctl.rl.config import TrainConfig
from arlctl.rl.distributed import ScoringModel
from arlctl.rl.trainer_state import load_model, lr_lambda
from arlctl.schemas.rows import rows_to_table
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import apply_rules, pack_batches
from arlctl.stages.reward import reward_table
from arlctl.stages.rollout import rollout
from arlctl.stages.train import train_step

# The settings both arms share; GAMMA is the turn arm's own (the filter ignores it for --adv group).
TASKS_PER_STEP = 4
GROUP_SIZE = 8
LR = 1e-2
GAMMA = 0.0
MAX_STEPS = 40
TARGET = 0.9
RULES = ("lower", "letter")


def run_arm(adv: str, seed: int, workdir: Path, max_steps: int = MAX_STEPS, lr: float = LR,
            group_size: int = GROUP_SIZE, tasks_per_step: int = TASKS_PER_STEP, gamma: float = GAMMA,
            stop_at_target: bool = True, per_turn: list[dict[str, float]] | None = None,
            rules: tuple[str, ...] | None = RULES, train_overrides: dict[str, Any] | None = None,
            filter_overrides: dict[str, Any] | None = None, batches: list[pa.Table] | None = None,
            teacher_dir: Path | None = None, save_to: Path | None = None) -> list[float]:
    """Mean outcome of each step's rollouts, for one arm (`adv`: filter's --adv); stops after the first at
    >= TARGET unless told not.

    per_turn: if given, gets each step's share of replies that start right, per turn (the reward components).
    rules: the turns' first-character classes (the task option `rules=`, toy.FIRST_CHAR_RULES); None: the env's
    default (space, then letter: the earlier measurements in the docs).
    train_overrides / filter_overrides: TrainConfig / FilterConfig fields that replace the ones set here
    (None: none; the optimizer takes its lr and weight decay from the TrainConfig).
    batches: if given, gets every packed batch that was trained on, in order.
    The train side follows the settings as `arlctl train` would: a value head on the policy with --value-coef,
    the frozen initial policy with --kl-coef / --kl-in-reward, and for --adv distill the teacher at
    `teacher_dir`; each batch is trained as filtered with `adv`. save_to: the final policy is written there."""
    torch.manual_seed(seed)
    start = tiny_model_dir()
    lm = load_model(start)
    train_cfg = TrainConfig(**{"lr": lr, "eps_low": 0.2, "eps_high": 0.28, "seed": seed, **(train_overrides or {}),
                               **({"teacher": str(teacher_dir)} if teacher_dir is not None else {})})
    train_cfg.check()
    model = ScoringModel(lm, value_head=True) if train_cfg.value_coef else lm
    ref = load_model(start).requires_grad_(False).eval() if train_cfg.needs_reference() else None
    teacher = load_model(teacher_dir).requires_grad_(False).eval() if teacher_dir is not None else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=train_cfg.lr, betas=train_cfg.adam_betas,
                                  weight_decay=train_cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(train_cfg))
    filter_cfg = FilterConfig(**{"adv": adv, "gamma": gamma, "batch_groups": tasks_per_step, **(filter_overrides or {})})
    rollout_cfg = RolloutConfig(env=toy.TWO_ENV_NAME, group_size=group_size, concurrency=tasks_per_step * group_size,
                                max_turns=2, max_new_tokens=1, seed=seed)
    reward = get_reward(toy.TWO_ENV_NAME)
    # One request at a time: a batch's composition (which depends on timing) would move the floats and so the
    # samples; alone, every request computes the same numbers on every run, and a rerun repeats the curve.
    policy = HFPolicy(start, max_batch=1)
    curve: list[float] = []
    try:
        for step in range(max_steps + 1):
            # 1. Roll out this step's tasks (the same for both arms) with the current weights; grade them.
            rows: list = []

            async def sink(group: list, rows: list = rows) -> None:
                rows.extend(group)

            options = {"n": str(tasks_per_step), "seed": str(step)} | ({"rules": ",".join(rules)} if rules else {})
            tasks = toy._builtin_two(options)
            asyncio.run(rollout(tasks, policy, env_factory(toy.TWO_ENV_NAME), rollout_cfg, sink))
            table = reward_table(rows_to_table(rows), reward)
            curve.append(float(np.mean(table.column("reward").to_numpy())))
            if per_turn is not None:
                parts = [dict(c) for c in table.column("reward_components").to_pylist()]
                per_turn.append({name: float(np.mean([p[name] for p in parts])) for name in parts[0]})
            if step == max_steps or (stop_at_target and curve[-1] >= TARGET):
                break
            # 2. Filter (advantages) and one optimizer step; then the policy loads the new weights.
            result = apply_rules(table, filter_cfg, current_version=step)
            kept = np.flatnonzero(result.keep)
            packed, _ = pack_batches(table.take(pa.array(kept, pa.int64())), result.weight[kept], filter_cfg)
            for batch in packed:  # none when every group was uniform: the weights stay
                train_step(model, ref, optimizer, scheduler, batch, train_cfg, version=step, estimator=adv,
                           teacher=teacher)
                if batches is not None:
                    batches.append(batch)
            lm.save_pretrained(workdir / "policy")
            asyncio.run(policy.reload(str(workdir / "policy"), step + 1))
    finally:
        asyncio.run(policy.close())
    if save_to is not None:
        from transformers import AutoTokenizer

        lm.save_pretrained(save_to)
        AutoTokenizer.from_pretrained(start).save_pretrained(save_to)
    return curve


def steps_to_target(curve: list[float], target: float = TARGET) -> int | None:
    """The index of the first step whose mean outcome is >= target (the optimizer steps it took), or None."""
    return next((i for i, value in enumerate(curve) if value >= target), None)
