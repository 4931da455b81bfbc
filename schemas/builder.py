"""The one trajectory builder: the token-append rule of DESIGN.md §4/§6, shared by rollout and serve.

A row grows by two moves only. `add_generation` appends the ids a policy sampled, as returned, with mask 1
and their log-probs, and opens a turn at that offset; `add_observation` appends the ids of what followed
(the template's closing, tool results, the next header) with mask 0 and log-prob 0.0, counted into the
open turn. Nothing else writes `response_ids`, `response_mask`, `response_logprobs` or the turn offsets,
so the invariants hold by construction (tests/schemas: a property test drives random sequences of moves):
- the three response columns have one entry per token;
- turn k's sampled span is `[gen_start, gen_start + gen_len)` (mask 1), followed by `obs_len` mask-0 ids,
  and turns tile the response in order;
- every mask-0 position has log-prob 0.0;
- num_tool_calls is the sum of the turns' calls; policy_version is the first turn's, policy_version_last
  the last's; gen_time_s the sum of the turns' generation latencies.
`truncate` undoes moves back to an earlier length (serve rolls back a request that failed).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from arlctl.schemas.rows import TrajectoryRow, Turn


class TrajectoryBuilder:
    """Grows one TrajectoryRow turn by turn; `row` is the row itself (never a copy)."""

    def __init__(self, row: TrajectoryRow):
        self.row = row
        self.t0 = time.monotonic()

    def add_generation(self, ids: list[int], logprobs: list[float], version: int, text: str,
                       tool_calls: list[dict[str, Any]] | None = None, latency_s: float = 0.0) -> Turn:
        """Append one sampled turn (mask 1) and return its Turn record."""
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(logprobs)} log-probs for {len(ids)} sampled ids")
        row = self.row
        calls = list(tool_calls or [])
        turn = Turn(index=len(row.turns), gen_start=len(row.response_ids), gen_len=len(ids), obs_len=0,
                    text=text, tool_calls=calls, policy_version=version, gen_latency_s=latency_s)
        row.response_ids.extend(ids)
        row.response_mask.extend([1] * len(ids))
        row.response_logprobs.extend(float(lp) for lp in logprobs)
        if not row.turns:
            row.policy_version = version  # a reload may land between creation and the first turn
        row.turns.append(turn)
        row.policy_version_last = version
        row.num_tool_calls += len(calls)
        row.gen_time_s += latency_s
        return turn

    def add_observation(self, ids: list[int], text: str | None) -> None:
        """Append what followed the last turn (mask 0); several calls accumulate into that turn."""
        row = self.row
        if not row.turns:
            raise ValueError("an observation needs a generation before it")
        row.response_ids.extend(ids)
        row.response_mask.extend([0] * len(ids))
        row.response_logprobs.extend([0.0] * len(ids))
        last = row.turns[-1]
        last.obs_len += len(ids)
        if text is not None:
            last.observation = text if last.observation is None else last.observation + text

    def truncate(self, response_len: int, last_obs: tuple[int, str | None] | None) -> None:
        """Back to `response_len` response tokens, the last turn's observation as (obs_len, text)."""
        row = self.row
        for column in (row.response_ids, row.response_mask, row.response_logprobs):
            del column[response_len:]
        if last_obs is not None and row.turns:
            row.turns[-1].obs_len, row.turns[-1].observation = last_obs

    def finish(self, status: str, finish_reason: str) -> TrajectoryRow:
        row = self.row
        row.status, row.finish_reason = status, finish_reason
        row.finished_at = datetime.now(UTC)
        row.wall_time_s = time.monotonic() - self.t0
        return row
