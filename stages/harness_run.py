"""Harness-driven trajectories: `arlctl rollout --harness NAME` runs someone else's agent loop per sample.

Per sample (run_group's member, in place of the built-in agent loop): the env is reset on the task (a
sandbox holding its repository, leased the way the built-in loop leases it), the harness runs against that
sandbox and the rollout's in-process recording gateway (arlctl/serve/gateway.py) under a session id of its
own, the env takes the final diff from the sandbox (SweEnv.final_state, as for every swe row), and the
gateway hands back the session's rows. Those rows are the harness's conversation token for token (the
gateway's append-only record); they are given the sample's group, task, env and the diff as final_state, so
`arlctl reward` grades them with the env's reward and `filter`/`train` take them like any rows.

A session the harness split (it rewrote its history: mini-swe-agent drops a reply it could not parse) is
several rows of the sample, each a trajectory of its own as the gateway ended it, env_info saying
`segment` k of `segments` n; the run's end (status, finish_reason) is the last one's. None is dropped. A harness that failed before any model call, or whose
sandbox could not be made, is one env_error row with the cause; a harness that failed after some calls
keeps its rows, the last with status env_error and the cause.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from arlctl.envs.base import env_info
from arlctl.harnesses import Harness, HarnessContext, HarnessResult, make_harness
from arlctl.inference.base import Policy
from arlctl.schemas.rows import TrajectoryRow
from arlctl.schemas.safe_text import parquet_safe_value
from arlctl.serve.gateway import Gateway
from arlctl.stages.agent_loop import RolloutConfig, Stats, Trajectory

# A run's end, as a row's (status, finish_reason): the agent submitting is a normal end; its step limit a
# bound (truncated, like --max-turns); format errors are the policy's (its replies were not actions).
ROW_END = {"submitted": ("ok", "submit"), "limit": ("truncated", "max_turns"), "timeout": ("timeout", "timeout"),
           "format": ("policy_error", "error"), "error": ("env_error", "error")}


class HarnessDriver:
    """One harness and one gateway for a whole rollout (started on the first sample)."""

    def __init__(self, policy: Policy, cfg: RolloutConfig):
        self.harness: Harness = make_harness(cfg.harness or "", cfg.harness_options)
        self.gateway = Gateway(policy, max_tokens=cfg.max_new_tokens, idle_timeout_s=cfg.trajectory_timeout + 60)
        self.model = getattr(policy, "name", "arlctl") or "arlctl"

    async def close(self) -> None:
        await self.gateway.close()


def _problem(task: dict[str, Any]) -> str:
    """The statement the harness is given, with the "(task ID)" line the built-in swe prompt carries too."""
    text = str(task.get("problem_statement") or task.get("prompt") or task.get("question") or "").strip()
    return f"{text}\n\n(task {task.get('instance_id') or task.get('task_id')})"


async def run_harness(traj: Trajectory, env: Any, cfg: RolloutConfig, stats: Stats, driver: HarnessDriver
                      ) -> TrajectoryRow:
    """One sample through the harness; returns its last row and leaves any earlier segments in traj.extra_rows."""
    row = traj.row
    row.env_version = str(getattr(env, "version", "") or "")
    started = time.monotonic()
    try:
        await asyncio.wait_for(env.reset(traj.task), cfg.trajectory_timeout)
    except Exception as err:
        row.env_errors += 1
        stats.fault("infra:reset_failed", f"reset failed: {type(err).__name__}: {err}")
        return traj.finish("env_error", "error")
    base_url = await driver.gateway.start()
    session = f"h{secrets.token_hex(6)}-{row.sample_index}"
    ctx = HarnessContext(
        task=traj.task, sandbox=env.sandbox, base_url=base_url, model=driver.model, session_id=session,
        problem=_problem(traj.task), temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
        seed=None if cfg.seed is None else cfg.seed + 1000 * row.sample_index + traj.attempt,
        deadline_s=cfg.trajectory_timeout, command_timeout_s=cfg.step_timeout)
    try:
        result = await asyncio.wait_for(driver.harness.run(ctx), cfg.trajectory_timeout)
    except TimeoutError:
        result = HarnessResult("timeout", f"the harness ran past {cfg.trajectory_timeout:g} s")
    except Exception as err:  # a harness bug: the row says so
        result = HarnessResult("error", f"{type(err).__name__}: {err}"[:2000])
    env_started = time.monotonic()
    try:
        diff = await env.final_state()
    except Exception as err:
        diff, result = None, HarnessResult("error", f"the final diff could not be taken: {err}"[:2000],
                                           result.steps, result.info)
    rows = await driver.gateway.take(session)
    env_time = time.monotonic() - env_started
    try:
        placement = parquet_safe_value(env_info(env)) or {}
    except Exception as err:
        stats.fault("env_info_error", f"env_info failed: {type(err).__name__}: {err}")
        placement = {}
    status, finish = ROW_END.get(result.status, ("env_error", "error"))
    if status in ("env_error", "policy_error", "timeout"):
        stats.fault(f"harness:{result.status}", f"{driver.harness.name}: {result.detail or result.status}")
    info = {**placement, "harness": driver.harness.name, "harness_status": result.status, "harness_detail": result.detail[:500],
            "harness_steps": result.steps, "session": session, **result.info}
    if not rows:  # no model call was made: the harness failed on its own (or the policy never answered)
        row.final_state = diff
        row.env_info = {**(row.env_info or {}), **info, "segment": 0, "segments": 0}
        if status == "ok":
            status, finish = "env_error", "error"
        return traj.finish(status, finish)
    shaped = [_as_sample_row(r, row, diff, info, k, len(rows)) for k, r in enumerate(rows)]
    stats.generated_tokens += sum(sum(r.response_mask) for r in shaped)
    stats.env_calls += sum(len(r.turns) for r in shaped)  # each model turn was followed by a sandbox command
    stats.env_time_s += sum(t.env_latency_s or 0.0 for r in shaped for t in r.turns)
    last = shaped[-1]
    last.status, last.finish_reason = status, finish
    last.wall_time_s = round(time.monotonic() - started, 3)
    last.env_time_s = round(env_time, 3)
    traj.extra_rows.extend(shaped[:-1])
    return last


def _as_sample_row(recorded: TrajectoryRow, sample: TrajectoryRow, diff: str | None, info: dict[str, Any],
                   segment: int, segments: int) -> TrajectoryRow:
    """A gateway row as this sample's: its group, index, task and env; the diff as its final state."""
    recorded.group_id, recorded.sample_index = sample.group_id, sample.sample_index
    recorded.task_id, recorded.task, recorded.env = sample.task_id, sample.task, sample.env
    recorded.env_version, recorded.policy = sample.env_version, sample.policy
    recorded.final_state = diff
    recorded.started_at = sample.started_at
    recorded.env_info = {**(sample.env_info or {}), **info, "segment": segment, "segments": segments}
    return recorded
