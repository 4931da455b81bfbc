"""The reward stage: fill reward, reward_components, reward_info and reward_version (DESIGN.md §5).

1:1 with its input: `rollouts/part-X.parquet` becomes `rewarded/part-X.parquet`, with the input recorded
in the output's lineage. Inputs already consumed by the output directory are skipped, and because the
output name is deterministic a re-run after a crash overwrites rather than duplicates. Re-rewarding the
same rollouts with another reward version simply targets another output directory.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arlctl.envs.registry import Reward
from arlctl.errors import CorruptShardError
from arlctl.io.fs import basename, join
from arlctl.io.partition import partition
from arlctl.io.shards import Lineage, config_hash, consumed_inputs, quarantine, read_shard, scan, write_shard
from arlctl.schemas.trajectory import TRAJECTORY_SCHEMA


@dataclass
class RewardSummary:
    inputs_seen: int = 0
    skipped_consumed: int = 0
    written: list[str] = field(default_factory=list)
    rows: int = 0
    reward_sum: float = 0.0
    corrupt: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs_seen, "skipped_consumed": self.skipped_consumed,
                "shards_written": len(self.written), "written": self.written, "rows": self.rows,
                "mean_reward": (self.reward_sum / self.rows) if self.rows else None,
                "corrupt": self.corrupt, "seconds": round(self.seconds, 3)}


def _response_text(row: dict[str, Any]) -> str:
    return "\n".join(t["text"] for t in row["turns"])


async def _score_rows(rows: list[dict[str, Any]], reward: Reward, concurrency: int) -> list[tuple]:
    """Score every row; async scorers (sandboxed graders) run `concurrency` at a time."""
    slots = asyncio.Semaphore(concurrency)

    async def one(row: dict[str, Any]) -> tuple:
        async with slots:
            task = json.loads(row["task"])
            result = reward.score(row["final_state"], task, _response_text(row))
            if inspect.isawaitable(result):
                result = await result
            return result

    return await asyncio.gather(*(one(r) for r in rows))


def reward_table(table: pa.Table, reward: Reward, concurrency: int = 4) -> pa.Table:
    """Return `table` with the reward columns filled by `reward`; every other column is unchanged."""
    rows = table.select(["task", "final_state", "turns"]).to_pylist()
    scored = asyncio.run(_score_rows(rows, reward, concurrency))
    rewards, components, infos = [], [], []
    for value, parts, info in scored:
        rewards.append(float(value))
        components.append(list({k: float(v) for k, v in parts.items()}.items()))
        infos.append(json.dumps(info, sort_keys=True, default=str))
    columns = {
        "reward": pa.array(rewards, pa.float32()),
        "reward_components": pa.array(components, TRAJECTORY_SCHEMA.field("reward_components").type),
        "reward_info": pa.array(infos, pa.string()),
        "reward_version": pa.array([reward.version] * table.num_rows, pa.string()),
    }
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), TRAJECTORY_SCHEMA.field(name), values)
    return table


def output_name(input_url: str) -> str:
    return basename(input_url)


def reward_dir(in_url: str, out_url: str, reward: Reward, concurrency: int = 4, on_corrupt: str = "raise",
               dry_run: bool = False, only: list[str] | None = None, worker: tuple[int, int] = (0, 1),
               stop: Any = None) -> RewardSummary:
    """Reward every input shard not yet consumed by out_url. Returns what was done.

    worker=(i, n): take only the shards whose stable hash falls to worker i of n, so n copies on n
    machines never take the same shard. stop: anything with is_set(); checked between shards.
    """
    start = time.monotonic()
    summary = RewardSummary()
    done = consumed_inputs(out_url)
    cfg_hash = config_hash({"reward": reward.name, "version": reward.version})
    for shard in only if only is not None else partition(scan(in_url).shards, *worker):
        if stop is not None and stop.is_set():
            break
        summary.inputs_seen += 1
        if basename(shard) in done:
            summary.skipped_consumed += 1
            continue
        try:
            table = read_shard(shard)
        except CorruptShardError as err:
            if on_corrupt == "raise":
                raise
            summary.corrupt.append(f"{shard}: {err.reason}")
            if on_corrupt == "quarantine":
                quarantine(shard)
            continue
        rewarded = reward_table(table, reward, concurrency)
        summary.rows += rewarded.num_rows
        summary.reward_sum += sum(rewarded.column("reward").to_pylist())
        if dry_run:
            continue
        target = join(out_url, output_name(shard))
        lineage = Lineage(stage="reward", inputs=[shard], config_hash=cfg_hash,
                          extra={"reward": reward.name, "reward_version": reward.version})
        summary.written.append(write_shard(rewarded, target, lineage))
    summary.seconds = time.monotonic() - start
    return summary
