"""Synthetic trajectories, envs and policies for tests and benchmarks: realistic shape, no model needed.

Rows look like agentic rollouts: ~20 turns, ~10k tokens, generated spans (mask 1, real-looking
log-probs) interleaved with observation spans (mask 0, log-prob 0), G samples per group, a mix of
statuses, and rewards in the ranges real verifiers produce. Everything is drawn from a seeded
numpy Generator, so the same arguments give the same rows (ids included).

For scale runs of the real agent loop: `LatencyEnv` (a tool with long-tailed latency, done after T turns)
and `SyntheticPolicy` (a fixed reply after a fixed per-token latency).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa

from arlctl.envs.base import Action, EnvReset, StepResult
from arlctl.inference.base import Generation, SamplingParams
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table

ENVS = ("math", "swe", "code")
TOOLS = {"math": ["calculator"], "swe": ["bash", "view_file", "edit_file", "run_tests"], "code": ["python"]}
STATUS_P = {"ok": 0.86, "truncated": 0.06, "timeout": 0.03, "env_error": 0.03, "policy_error": 0.02}
VOCAB = 49152  # SmolLM2 vocabulary size


def _id(rng: np.random.Generator) -> str:
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def synthetic_rows(
    n_groups: int,
    group_size: int = 4,
    seed: int = 0,
    mean_turns: int = 20,
    tokens_per_turn: int = 500,
    envs: tuple[str, ...] = ENVS,
    policy_version: int = 0,
    rewarded: bool = True,
    reward_p: float = 0.4,
) -> list[TrajectoryRow]:
    """n_groups × group_size rows; about mean_turns × tokens_per_turn response tokens each."""
    rng = np.random.default_rng(seed)
    base_time = datetime(2026, 1, 1, tzinfo=UTC)
    rows: list[TrajectoryRow] = []
    statuses, status_p = list(STATUS_P), list(STATUS_P.values())
    for g in range(n_groups):
        env = envs[g % len(envs)]
        group_id = _id(rng)
        task = {"task_id": f"{env}-{g:06d}", "question": f"synthetic task {g}"}
        prompt_ids = rng.integers(0, VOCAB, size=int(rng.integers(60, 200))).astype(np.int32).tolist()
        task_p = float(np.clip(rng.normal(reward_p, 0.25), 0.0, 1.0))  # per-task difficulty
        for s in range(group_size):
            rows.append(
                _one_row(rng, env, group_id, s, task, prompt_ids, mean_turns, tokens_per_turn,
                         base_time + timedelta(seconds=g * 7 + s), policy_version, rewarded, task_p,
                         statuses, status_p)
            )
    return rows


def _one_row(rng, env, group_id, sample_index, task, prompt_ids, mean_turns, tokens_per_turn, started,
             policy_version, rewarded, task_p, statuses, status_p) -> TrajectoryRow:
    n_turns = int(np.clip(rng.poisson(mean_turns), 1, 4 * mean_turns))
    response_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    turns: list[Turn] = []
    gen_time = env_time = 0.0
    n_calls = 0
    for t in range(n_turns):
        gen_len = int(max(1, rng.gamma(2.0, tokens_per_turn * 0.35 / 2.0)))
        last = t == n_turns - 1
        obs_len = 0 if last else int(max(1, rng.gamma(2.0, tokens_per_turn * 0.65 / 2.0)))
        gen_start = len(response_ids)
        response_ids.extend(rng.integers(0, VOCAB, size=gen_len + obs_len).astype(np.int32).tolist())
        mask.extend([1] * gen_len + [0] * obs_len)
        # Sampled-token log-probs of a small model: mostly confident, a heavy tail of surprises.
        lp = -rng.exponential(0.6, size=gen_len).astype(np.float32)
        logprobs.extend(lp.tolist() + [0.0] * obs_len)
        tool = str(rng.choice(TOOLS.get(env, ["tool"])))
        calls = [] if last else [{"name": tool, "arguments": {"arg": int(rng.integers(0, 1000))}, "id": f"call_{t}"}]
        n_calls += len(calls)
        g_lat, e_lat = float(rng.gamma(2.0, 0.4)), float(rng.lognormal(-1.2, 1.0))
        gen_time += g_lat
        env_time += 0.0 if last else e_lat
        turns.append(Turn(index=t, gen_start=gen_start, gen_len=gen_len, obs_len=obs_len,
                          text=f"turn {t}: thinking about step {t}",
                          tool_calls=calls, observation=None if last else f"result {t}",
                          policy_version=policy_version, gen_latency_s=g_lat,
                          env_latency_s=0.0 if last else e_lat))
    status = str(rng.choice(statuses, p=status_p))
    finish = {"ok": "submit", "truncated": "length", "timeout": "timeout", "env_error": "error",
              "policy_error": "error"}[status]
    correct = float(rng.random() < task_p) if status == "ok" else 0.0
    wall = gen_time + env_time + float(rng.exponential(0.05))
    row = TrajectoryRow(
        group_id=group_id, sample_index=sample_index, task_id=task["task_id"], env=env,
        env_version=f"{env}-1", task=task, policy="synthetic", prompt_text=f"<prompt {task['task_id']}>",
        prompt_ids=prompt_ids, response_ids=response_ids, response_mask=mask, response_logprobs=logprobs,
        turns=turns, status=status, finish_reason=finish, policy_version=policy_version,
        policy_version_last=policy_version, num_tool_calls=n_calls, env_errors=int(rng.poisson(0.3)),
        retries=0, wall_time_s=wall, gen_time_s=gen_time, env_time_s=env_time, started_at=started,
        finished_at=started + timedelta(seconds=wall), final_state=f"answer {int(rng.integers(0, 100))}",
        trajectory_id=_id(rng),
    )
    if rewarded:
        fmt = float(rng.random() < 0.9)
        row.reward = correct
        row.reward_components = {"correct": correct, "format": fmt}
        row.reward_info = json.dumps({"synthetic": True})
        row.reward_version = f"{env}-synthetic-1"
    return row


def synthetic_table(n_groups: int, group_size: int = 4, seed: int = 0, **kwargs) -> pa.Table:
    return rows_to_table(synthetic_rows(n_groups, group_size, seed, **kwargs))


def split_per_turn(row: TrajectoryRow) -> list[TrajectoryRow]:
    """The rows `rollout --history per-turn` would write for `row` (contract of issue 13).

    Row k holds turn k alone: its prompt is the trajectory's prompt plus every response token before the
    turn (a prefix-consistent template renders it the same), its response the turn's sampled tokens (no
    observation tokens: obs_len 0, the observation text kept). Rows before the last are "continued"; the
    last keeps the real finish_reason and final_state; every row keeps the trajectory's status.
    """
    from dataclasses import replace

    out: list[TrajectoryRow] = []
    last = len(row.turns) - 1
    for k, turn in enumerate(row.turns):
        span = slice(turn.gen_start, turn.gen_start + turn.gen_len)
        out.append(replace(
            row, prompt_ids=row.prompt_ids + row.response_ids[: turn.gen_start],
            response_ids=row.response_ids[span], response_mask=row.response_mask[span],
            response_logprobs=row.response_logprobs[span],
            turns=[replace(turn, gen_start=0, obs_len=0)],
            finish_reason=row.finish_reason if k == last else "continued",
            final_state=row.final_state if k == last else None,
            num_tool_calls=len(turn.tool_calls),
        ))
    return out


# ------------------------------------------------------- a synthetic env and policy for scale runs and tests


def tool_latencies(index: int, turns: int, seed: int = 0, mean: float = 0.5, sigma: float = 1.0) -> np.ndarray:
    """Trajectory `index`'s tool latency per turn in seconds: lognormal with the given mean (long-tailed).

    Drawn from (seed, index) alone, so an env can find its own row and a benchmark the whole matrix (its
    lower bound) without either holding the other's copy.
    """
    mu = float(np.log(mean)) - sigma**2 / 2
    return np.random.default_rng([seed, index]).lognormal(mu, sigma, size=turns)


class LatencyEnv:
    """An env whose one tool sleeps a long-tailed time and that is done after exactly `turns` steps.

    The task names its trajectory by "index" (its latency row, see tool_latencies). Every observation is
    the same short text, so the work per turn is the loop's own, not the env's. As a plugin:
    `--env arlctl.synthetic:LatencyEnv --env-opt turns=4 --env-opt mean=0.5`.
    """

    name = "latency"
    version = "1"
    tool_format = None
    final_state_truncated = None

    def __init__(self, turns: int = 4, mean: float = 0.5, sigma: float = 1.0, seed: int = 0):
        self.turns, self.mean, self.sigma, self.seed = int(turns), float(mean), float(sigma), int(seed)
        self.latencies: list[float] = []
        self.turn = 0

    async def reset(self, task: dict) -> EnvReset:
        index = int(task.get("index", 0))
        self.latencies = tool_latencies(index, self.turns, self.seed, self.mean, self.sigma).tolist()
        self.turn = 0
        return EnvReset(messages=[{"role": "system", "content": "You are an agent. Call the tool until done."},
                                  {"role": "user", "content": f"Job {index}: start working."}], tools=[])

    def parse_action(self, text: str) -> Action:
        return Action(text=text)  # the tool takes whatever the model wrote: no parsing cost, no parse errors

    async def step(self, action: Action) -> StepResult:
        await asyncio.sleep(self.latencies[self.turn])
        self.turn += 1
        done = self.turn >= self.turns
        return StepResult(observations=[{"role": "tool", "name": "work", "content": "ok"}], done=done,
                          final_state="done" if done else None, finish_reason="submit" if done else None)

    async def final_state(self) -> str | None:
        return None

    async def close(self) -> None:
        return None


def latency_tasks(n: int) -> list[dict]:
    """n tasks for LatencyEnv, trajectory i replaying latency row i."""
    return [{"task_id": f"job-{i}", "index": i} for i in range(n)]


class SyntheticPolicy:
    """A Policy that answers every prompt with the same reply after `per_token_s` per token (no model).

    The reply is real text encoded by the real tokenizer and ends with the template's end-of-message token,
    so the loop splits, decodes and appends it as it would a model's turn; log-probs are a fixed -0.5.
    """

    max_context = None

    def __init__(self, tokenizer, reply: str = "Working on it: calling the tool now.", per_token_s: float = 0.001,
                 name: str = "synthetic", reply_ids: list[int] | None = None):
        from arlctl.inference.scripted import end_of_message_ids

        self.tokenizer, self.name, self.version = tokenizer, name, 0
        self.reply_ids = reply_ids or (tokenizer(reply, add_special_tokens=False)["input_ids"]
                                       + end_of_message_ids(tokenizer))
        self.per_token_s = per_token_s
        self.requests = 0

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        ids = self.reply_ids[: sampling.max_new_tokens]
        self.requests += 1
        await asyncio.sleep(self.per_token_s * len(ids))
        finish = "length" if len(ids) < len(self.reply_ids) else "stop"
        return Generation(ids=list(ids), logprobs=[-0.5] * len(ids), finish_reason=finish, version=self.version)

    def metrics(self) -> dict:
        return {"requests": self.requests}

    async def reload(self, policy_dir: str, version: int) -> None:
        self.version = version

    async def close(self) -> None:
        return None
