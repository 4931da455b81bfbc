"""Held-out evaluation: its settings and the arithmetic over rewarded rows (pass@k, correct rate, McNemar).

`arlctl eval` rolls a policy version out on fixed tasks with its own sampling and rewards the rows
(stages/eval_job.py, through the rollout and reward stages' own code); this module turns those rows into
numbers. Everything here is a pure function of rows, so it is tested on hand-built rows:

  correct      a row is correct when its reward >= `correct_at` (default 1.0: the math reward's `correct`,
               whatever --reward-opt format_weight adds below 1)
  graded       a row counts when it has a reward and is the model's answer: rows with reward null (the grader
               could not grade it) and rows whose trajectory ended env_error, policy_error or aborted
               (infrastructure, not the model) are left out of every rate and counted, by cause, in the summary
  truncated    rows whose reply a token budget or the context cut (status truncated) are the model's answer:
               graded like any row, and counted (`truncated`) so a rate held down by the budget shows it
  correct_rate correct / graded rows; its standard error is clustered by task, sqrt(sum_i (c_i - p n_i)^2) / N,
               which is the binomial sqrt(p (1 - p) / N) when each task has one row (greedy)
  pass@k       the unbiased estimator 1 - C(n-c, k) / C(n, k) per task (arlctl/envs/code.py `pass_at_k`, its one
               owner), averaged over the tasks with at least k graded samples; k = 1, 2, 4, ..., K
  McNemar      paired greedy evals of two versions, by task_id: b tasks only A solved, c only B solved; the exact
               two-sided p-value is min(1, 2 * sum_{i <= min(b, c)} C(b+c, i) / 2^(b+c))
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from arlctl.envs.code import mean_pass_at_k
from arlctl.errors import UsageError
from arlctl.inference.base import DEFAULT_SAMPLING
from arlctl.settings import setting
from arlctl.stages.agent_loop import RolloutConfig

MODES = ("greedy", "sampled")  # shard name prefixes of an eval version directory, and its summary's blocks
NOT_ANSWERS = ("env_error", "policy_error", "aborted")  # statuses that are not the model's answer

_LOOP = {f.name: f.default for f in fields(RolloutConfig)}  # the rollout loop's defaults, written once there


@dataclass
class EvalConfig:
    greedy: bool = setting(False, "One greedy answer per task (temperature 0): the default when --samples is "
                                  "not given; --compare tests paired greedy evals (McNemar).")
    samples: int = setting(0, "K sampled answers per task at --temperature, for pass@k (k = 1, 2, 4, ..., K).")
    temperature: float = setting(DEFAULT_SAMPLING.temperature, "Sampling temperature of --samples.")
    top_p: float = setting(DEFAULT_SAMPLING.top_p, "Nucleus sampling of --samples.")
    seed: int = setting(0, "Sampling seed: every version is sampled with the same seeds, so evals compare.")
    correct_at: float = setting(1.0, "A row is correct when its reward >= this.")
    every: int = setting(1, "--watch: evaluate the published versions whose number is a multiple of N.")
    reward: str = setting("auto", "Reward function (as `arlctl reward --reward`; auto: the reward of each row's env).")
    reward_opt: list[str] = setting(help="KEY=VALUE options of the reward (as `arlctl reward --reward-opt`).",
                                    factory=list)
    reward_concurrency: int = setting(4, "Rows graded at once.")
    concurrency: int = setting(_LOOP["concurrency"], "Trajectories in flight.", short="-c")
    max_turns: int = setting(_LOOP["max_turns"], "Model turns per trajectory.")
    max_tokens: int = setting(_LOOP["max_tokens"], "Response tokens (generated + environment) per trajectory.")
    max_new_tokens: int = setting(_LOOP["max_new_tokens"], "Generated tokens per turn.")
    step_timeout: float = setting(_LOOP["step_timeout"], "Seconds per environment step.")
    trajectory_timeout: float = setting(_LOOP["trajectory_timeout"], "Seconds per trajectory.")
    max_obs_tokens: int = setting(_LOOP["max_obs_tokens"], "Observation tokens kept per turn.")
    tool_format: str | None = setting(None, "Tool-call parser (default: the chat template family's).",
                                      flag="--tool-parser")

    def modes(self) -> list[str]:
        """greedy and/or sampled; greedy when neither is asked for."""
        return [m for m, on in (("greedy", self.greedy or not self.samples), ("sampled", self.samples > 0)) if on]

    def check(self) -> None:
        from arlctl.stages.rollout_job import check_sampling_options

        if self.samples < 0:
            raise UsageError(f"--samples must be >= 0, got {self.samples}")
        if self.every < 1:
            raise UsageError(f"--every must be >= 1, got {self.every}")
        if not math.isfinite(self.correct_at):
            raise UsageError(f"--correct-at must be a finite number, got {self.correct_at}")
        if self.reward_concurrency < 1:
            raise UsageError(f"--reward-concurrency must be >= 1, got {self.reward_concurrency}")
        check_sampling_options(self.temperature, self.top_p, self.max_new_tokens, self.seed)

    def loop(self, mode: str, env: str) -> RolloutConfig:
        """The rollout loop's config for one mode: greedy is G=1 at temperature 0, sampled G=K at T."""
        greedy = mode == "greedy"
        return RolloutConfig(env=env, group_size=1 if greedy else self.samples, concurrency=self.concurrency,
                             max_turns=self.max_turns, max_tokens=self.max_tokens, max_new_tokens=self.max_new_tokens,
                             step_timeout=self.step_timeout, trajectory_timeout=self.trajectory_timeout,
                             max_obs_tokens=self.max_obs_tokens, temperature=0.0 if greedy else self.temperature,
                             top_p=1.0 if greedy else self.top_p, seed=self.seed, tool_format=self.tool_format)


# ---------------------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Outcome:
    """What the eval needs of one rewarded row."""

    task_id: str
    reward: float | None
    status: str = "ok"
    cause: str | None = None  # reward_info.error when reward is null

    def graded(self) -> bool:
        return self.reward is not None and self.status not in NOT_ANSWERS

    def correct(self, correct_at: float) -> bool:
        return self.reward is not None and self.reward >= correct_at


def outcomes(table: Any) -> list[Outcome]:
    """One Outcome per row of a rewarded trajectory table (pyarrow)."""
    columns = [table.column(c).to_pylist() for c in ("task_id", "reward", "status", "reward_info")]
    return [Outcome(str(task), reward, str(status), _error(info) if reward is None else None)
            for task, reward, status, info in zip(*columns, strict=True)]


def _error(info: str | None) -> str:
    try:
        parsed = json.loads(info or "{}")
    except ValueError:
        parsed = {}
    return str((parsed if isinstance(parsed, dict) else {}).get("error") or "no reward_info.error")


def by_task(rows: Iterable[Outcome], correct_at: float) -> dict[str, list[bool]]:
    """{task_id: [correct, ...]} over the graded rows, in row order."""
    tasks: dict[str, list[bool]] = {}
    for row in rows:
        if row.graded():
            tasks.setdefault(row.task_id, []).append(row.correct(correct_at))
    return tasks


# ---------------------------------------------------------------------------------------------- numbers


def correct_rate(tasks: dict[str, list[bool]]) -> tuple[float | None, float | None]:
    """(rate, standard error clustered by task) over every graded row; (None, None) with no rows."""
    n = sum(len(v) for v in tasks.values())
    if n == 0:
        return None, None
    p = sum(sum(v) for v in tasks.values()) / n
    se = math.sqrt(sum((sum(v) - p * len(v)) ** 2 for v in tasks.values())) / n
    return p, se


def ks_up_to(k_max: int) -> list[int]:
    """1, 2, 4, ... up to k_max, and k_max itself."""
    ks, k = [], 1
    while k <= k_max:
        ks.append(k)
        k *= 2
    return ks + ([k_max] if k_max >= 1 and ks[-1] != k_max else [])


def pass_at_ks(tasks: dict[str, list[bool]], k_max: int) -> dict[str, float]:
    """{str(k): mean pass@k over the tasks with at least k graded samples} for k in ks_up_to(k_max)."""
    out = {}
    for k in ks_up_to(k_max):
        eligible = {t: v for t, v in tasks.items() if len(v) >= k}
        if eligible:
            out[str(k)] = mean_pass_at_k(eligible, k)
    return out


def summarize_mode(rows: list[Outcome], correct_at: float, k_max: int) -> dict[str, Any]:
    """The numbers of one mode's rows (greedy or sampled): rates over graded rows, and what was left out."""
    tasks = by_task(rows, correct_at)
    rate, se = correct_rate(tasks)
    rewards = [r.reward for r in rows if r.graded()]
    status: dict[str, int] = {}
    null_causes: dict[str, int] = {}
    for row in rows:
        status[row.status] = status.get(row.status, 0) + 1
        if row.reward is None:
            null_causes[str(row.cause)] = null_causes.get(str(row.cause), 0) + 1
    return {"n_tasks": len({r.task_id for r in rows}), "n_rows": len(rows), "n_graded": len(rewards),
            "correct_rate": rate, "correct_se": se,
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "pass_at_k": pass_at_ks(tasks, k_max),
            "null_reward": sum(null_causes.values()), "null_reward_causes": null_causes,
            "not_answers": sum(status.get(s, 0) for s in NOT_ANSWERS), "truncated": status.get("truncated", 0),
            "status": dict(sorted(status.items()))}


def summarize(rows_by_mode: dict[str, list[Outcome]], cfg: EvalConfig) -> dict[str, Any]:
    """The summary's numbers: each mode's block, and at the top level the primary mode's (greedy when it was
    evaluated, else sampled) with row counts over every mode."""
    blocks = {mode: summarize_mode(rows, cfg.correct_at, 1 if mode == "greedy" else cfg.samples)
              for mode, rows in rows_by_mode.items()}
    primary = "greedy" if "greedy" in blocks else "sampled"
    top = dict(blocks[primary])
    if "sampled" in blocks:
        top["pass_at_k"] = blocks["sampled"]["pass_at_k"]  # pass@k comes from the K samples
    for key in ("n_rows", "n_graded", "null_reward", "not_answers", "truncated"):
        top[key] = sum(b[key] for b in blocks.values())
    top["null_reward_causes"] = _sum_counts(b["null_reward_causes"] for b in blocks.values())
    top["status"] = _sum_counts(b["status"] for b in blocks.values())
    top["n_tasks"] = len({r.task_id for rows in rows_by_mode.values() for r in rows})
    return {"primary": primary, **top, "by_mode": blocks}


def _sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for key, value in one.items():
            total[key] = total.get(key, 0) + value
    return dict(sorted(total.items()))


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts: a binomial(b + c, 1/2) test."""
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def mcnemar(rows_a: list[Outcome], rows_b: list[Outcome], correct_at: float) -> dict[str, Any]:
    """Pair two greedy evals by task_id (a task with several rows counts as solved when any row is) over the
    tasks graded in both; b = solved only by A, c = solved only by B."""
    solved_a = {t: any(v) for t, v in by_task(rows_a, correct_at).items()}
    solved_b = {t: any(v) for t, v in by_task(rows_b, correct_at).items()}
    shared = sorted(solved_a.keys() & solved_b.keys())
    b = sum(1 for t in shared if solved_a[t] and not solved_b[t])
    c = sum(1 for t in shared if solved_b[t] and not solved_a[t])
    both = sum(1 for t in shared if solved_a[t] and solved_b[t])
    return {"tasks": len(shared), "both": both, "neither": len(shared) - both - b - c, "only_a": b, "only_b": c,
            "unpaired": len(solved_a.keys() ^ solved_b.keys()), "p_value": mcnemar_p(b, c)}


def compare(a: dict[str, Any], rows_a: dict[str, list[Outcome]], b: dict[str, Any],
            rows_b: dict[str, list[Outcome]]) -> dict[str, Any]:
    """Two evaluated versions side by side (their summaries and rows by mode): each mode both have, its correct
    rates with standard errors and difference; greedy modes also the exact McNemar test."""
    correct_at = a.get("correct_at", 1.0)
    if b.get("correct_at", 1.0) != correct_at:
        raise UsageError(f"the evals used different --correct-at ({correct_at} and {b.get('correct_at')})",
                         hint="re-run one with --force and the other's --correct-at")
    out: dict[str, Any] = {"a": a["version"], "b": b["version"], "correct_at": correct_at, "modes": {}}
    for mode in MODES:
        if mode not in rows_a or mode not in rows_b:
            continue
        block_a, block_b = a["by_mode"][mode], b["by_mode"][mode]
        entry: dict[str, Any] = {
            side: {k: block.get(k) for k in ("correct_rate", "correct_se", "n_graded", "pass_at_k", "mean_reward")}
            for side, block in (("a", block_a), ("b", block_b))}
        if block_a["correct_rate"] is not None and block_b["correct_rate"] is not None:
            entry["difference"] = block_b["correct_rate"] - block_a["correct_rate"]
        entry["mcnemar"] = mcnemar(rows_a[mode], rows_b[mode], correct_at) if mode == "greedy" else None
        out["modes"][mode] = entry
    if not out["modes"]:
        raise UsageError(f"v{a['version']} and v{b['version']} share no eval mode (greedy or sampled)",
                         hint="evaluate both the same way (the same --greedy / --samples)")
    return out


__all__ = ["MODES", "NOT_ANSWERS", "EvalConfig", "Outcome", "by_task", "compare", "correct_rate", "ks_up_to",
           "mcnemar", "mcnemar_p", "outcomes", "pass_at_ks", "summarize", "summarize_mode"]
