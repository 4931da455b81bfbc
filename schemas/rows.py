"""The one row builder: every producer fills a `TrajectoryRow` and calls `rows_to_table`.

No stage hand-assembles Arrow columns. Fields mirror the schema in trajectory.py; counters that can be
derived from the token lists (prompt_tokens, response_tokens, generated_tokens, num_turns) are derived
here so that they can never disagree with the tokens.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from arlctl.schemas.trajectory import SCHEMA_VERSION, TRAJECTORY_SCHEMA, validate


def uuid7() -> str:
    """A time-ordered UUID (RFC 9562 version 7): 48-bit unix ms, then random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 68) & 0xFFF) << 64
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


@dataclass
class Turn:
    index: int
    gen_start: int
    gen_len: int
    obs_len: int
    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    observation: str | None = None
    policy_version: int = 0
    gen_latency_s: float = 0.0
    env_latency_s: float = 0.0
    reward_step: float | None = None
    error: str | None = None
    advantage: float | None = None  # schema v2: written by `filter --adv turn`, null before

    def to_arrow(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "gen_start": self.gen_start,
            "gen_len": self.gen_len,
            "obs_len": self.obs_len,
            "text": self.text,
            "tool_calls": json.dumps(self.tool_calls, ensure_ascii=False),
            "observation": self.observation,
            "policy_version": self.policy_version,
            "gen_latency_s": self.gen_latency_s,
            "env_latency_s": self.env_latency_s,
            "reward_step": self.reward_step,
            "error": self.error,
            "advantage": self.advantage,
        }


@dataclass
class TrajectoryRow:
    group_id: str
    sample_index: int
    task_id: str
    env: str
    env_version: str
    task: dict[str, Any] | str
    policy: str
    prompt_text: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    status: str = "ok"
    finish_reason: str = "stop"
    policy_version: int = 0
    policy_version_last: int = 0
    num_tool_calls: int = 0
    env_errors: int = 0
    retries: int = 0
    wall_time_s: float = 0.0
    gen_time_s: float = 0.0
    env_time_s: float = 0.0
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    final_state: str | None = None
    reward: float | None = None
    reward_components: dict[str, float] | None = None
    reward_info: str | None = None
    reward_version: str | None = None
    advantage: float | None = None
    weight: float | None = None
    trajectory_id: str = field(default_factory=uuid7)
    trace_id: str | None = None
    # Schema v3: where the environment ran (the env's env_info(): sandbox kind, engine/host, container), as
    # a JSON object; None when the env has no sandbox.
    env_info: dict[str, Any] | None = None

    def to_arrow(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "trajectory_id": self.trajectory_id,
            "group_id": self.group_id,
            "sample_index": self.sample_index,
            "task_id": self.task_id,
            "env": self.env,
            "env_version": self.env_version,
            "task": self.task if isinstance(self.task, str) else json.dumps(self.task, ensure_ascii=False),
            "policy": self.policy,
            "policy_version": self.policy_version,
            "policy_version_last": self.policy_version_last,
            "prompt_text": self.prompt_text,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "response_mask": self.response_mask,
            "response_logprobs": self.response_logprobs,
            "turns": [t.to_arrow() for t in self.turns],
            "status": self.status,
            "finish_reason": self.finish_reason,
            "num_turns": len(self.turns),
            "num_tool_calls": self.num_tool_calls,
            "env_errors": self.env_errors,
            "retries": self.retries,
            "prompt_tokens": len(self.prompt_ids),
            "response_tokens": len(self.response_ids),
            "generated_tokens": int(sum(self.response_mask)),
            "wall_time_s": self.wall_time_s,
            "gen_time_s": self.gen_time_s,
            "env_time_s": self.env_time_s,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "final_state": self.final_state,
            "reward": self.reward,
            "reward_components": None if self.reward_components is None else list(self.reward_components.items()),
            "reward_info": self.reward_info,
            "reward_version": self.reward_version,
            "advantage": self.advantage,
            "weight": self.weight,
            "trace_id": self.trace_id or self.trajectory_id,
            "env_info": None if self.env_info is None else json.dumps(self.env_info, ensure_ascii=False,
                                                                      default=str),
        }


def rows_to_table(rows: list[TrajectoryRow]) -> pa.Table:
    """Build a validated Arrow table in the exact trajectory schema."""
    table = pa.Table.from_pylist([r.to_arrow() for r in rows], schema=TRAJECTORY_SCHEMA)
    validate(table)
    return table
