"""The reward stage: fill reward, reward_components, reward_info and reward_version (DESIGN.md §5).

1:1 with its input: `rollouts/part-X.parquet` becomes `rewarded/part-X.parquet`, with the input recorded
in the output's lineage. Inputs already consumed by the output directory are skipped, and because the
output name is deterministic a re-run after a crash overwrites rather than duplicates. Re-rewarding the
same rollouts with another reward version simply targets another output directory.

A row the grader could not grade (its tests could not run: a missing interpreter or pytest, a dead
sandbox) comes back from the reward function as reward None with reward_info.error, and stays null.
A poison row never blocks its shard: a `task` that is not a JSON object, a reward function that rejects
the row (any error but a TransientError, which means retry later, or a UsageError, which means the
reward's options are wrong), or a non-finite score gives that row reward = null with reward_info
{"error": cause}; filter then drops it under completeness. A shard that cannot be read is skipped
(the others are still rewarded) and reported, or with --quarantine moved to `_quarantine/`. Rows with
other bad values (schemas/values.py) pass through unchanged for filter's invalid_values rule.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arlctl.envs.registry import Reward
from arlctl.errors import CorruptShardError, TransientError, UsageError
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
    row_errors: list[str] = field(default_factory=list)  # "shard row i (trajectory_id): cause": reward null
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs_seen, "skipped_consumed": self.skipped_consumed,
                "shards_written": len(self.written), "written": self.written, "rows": self.rows,
                "mean_reward": (self.reward_sum / self.rewarded) if self.rewarded else None,
                "corrupt": self.corrupt, "row_errors": self.row_errors, "seconds": round(self.seconds, 3)}

    @property
    def rewarded(self) -> int:
        """Rows that got a reward (the others carry reward_info.error)."""
        return self.rows - len(self.row_errors)


def _response_text(row: dict[str, Any]) -> str:
    return "\n".join(t["text"] for t in row["turns"])


FLOAT32_MAX = 3.4028234663852886e38
Scored = tuple[float | None, dict[str, float] | None, dict[str, Any]]  # (reward, components, info)


def _row_error(cause: str) -> Scored:
    return None, None, {"error": cause}


def _parse_task(text: str) -> dict[str, Any] | str:
    """The row's task as a dict, or why it is not one (the row then gets a null reward with that cause)."""
    try:
        task = json.loads(text)
    except (ValueError, RecursionError) as err:
        return f"task is not valid JSON ({_one_line(err)})"
    return task if isinstance(task, dict) else f"task is JSON {type(task).__name__}, not an object"


def _checked(result: Any) -> Scored:
    """A scorer's (reward, components, info), or a row error when any number in it is not finite.

    A scorer says "this row cannot be graded" (a grader that could not run its tests: an infrastructure
    failure, never the policy's) by returning reward None with info["error"]: the row keeps that info."""
    value, parts, info = result
    if value is None:
        info = dict(info) if isinstance(info, dict) else {}
        return None, None, {**info, "error": str(info.get("error") or "the reward function returned no reward")}
    try:
        reward, components = float(value), {str(k): float(v) for k, v in parts.items()}
    except (TypeError, ValueError, AttributeError) as err:
        return _row_error(f"the reward function returned a non-number ({_one_line(err)})")
    # Finite as float32 too: the columns are float32, where 1e39 would land as inf.
    if not all(math.isfinite(x) and abs(x) <= FLOAT32_MAX for x in (reward, *components.values())):
        return _row_error(f"the reward function returned a non-finite value (reward {reward}, "
                          f"components {components})")
    return reward, components, info


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:300]


async def _score_rows(rows: list[dict[str, Any]], reward: Reward, concurrency: int) -> list[Scored]:
    """Score every row; async scorers (sandboxed graders) run `concurrency` at a time."""
    slots = asyncio.Semaphore(concurrency)

    async def one(row: dict[str, Any]) -> Scored:
        task = _parse_task(row["task"])
        if isinstance(task, str):
            return _row_error(task)
        async with slots:
            try:
                result = reward.score(row["final_state"], task, _response_text(row))
                if inspect.isawaitable(result):
                    result = await result
            except (TransientError, UsageError):
                raise  # retry later / wrong reward options: nothing is written, the shard stays pending
            except Exception as err:  # anything else is this row's own outcome, recorded with its cause
                return _row_error(f"the reward function failed on this row ({_one_line(err)})")
        return _checked(result)

    return await asyncio.gather(*(one(r) for r in rows))


def reward_table(table: pa.Table, reward: Reward, concurrency: int = 4) -> pa.Table:
    """Return `table` with the reward columns filled by `reward`; every other column is unchanged.

    A row that could not be scored has reward and reward_components null and reward_info {"error": ...}.
    """
    rows = table.select(["task", "final_state", "turns"]).to_pylist()
    scored = asyncio.run(_score_rows(rows, reward, concurrency))
    rewards = [value for value, _, _ in scored]
    components = [None if parts is None else list(parts.items()) for _, parts, _ in scored]
    infos = [json.dumps(info, sort_keys=True, default=str) for _, _, info in scored]
    columns = {
        "reward": pa.array(rewards, pa.float32()),
        "reward_components": pa.array(components, TRAJECTORY_SCHEMA.field("reward_components").type),
        "reward_info": pa.array(infos, pa.string()),
        "reward_version": pa.array([reward.version] * table.num_rows, pa.string()),
    }
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), TRAJECTORY_SCHEMA.field(name), values)
    return table


def row_errors(table: pa.Table, shard: str) -> list[str]:
    """`shard row i (trajectory_id 'x'): cause` for every row of a rewarded table left without a reward."""
    out = []
    ids, rewards, infos = (table.column(c).to_pylist() for c in ("trajectory_id", "reward", "reward_info"))
    for i, (tid, value, info) in enumerate(zip(ids, rewards, infos, strict=True)):
        if value is None:
            out.append(f"{basename(shard)} row {i} (trajectory_id {tid!r}): {json.loads(info).get('error')}")
    return out


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
    done = consumed_inputs(out_url, same_name=True)  # 1:1: rewarded/X vouches only for rollouts/X
    unreadable: list[CorruptShardError] = []
    cfg_hash = config_hash({"reward": reward.name, "version": reward.version})
    for shard in only if only is not None else partition(scan(in_url).shards, *worker):
        if stop is not None and stop.is_set():
            break
        summary.inputs_seen += 1
        if basename(shard) in done:
            summary.skipped_consumed += 1
            continue
        try:
            table = read_shard(shard, bad_values="keep")  # bad values pass through to filter's invalid_values
        except CorruptShardError as err:
            # One unreadable shard must not hold back the others: they are rewarded first.
            if on_corrupt == "raise":
                unreadable.append(err)
                continue
            summary.corrupt.append(f"{shard}: {err.reason}")
            if on_corrupt == "quarantine":
                quarantine(shard)
            continue
        rewarded = reward_table(table, reward, concurrency)
        summary.rows += rewarded.num_rows
        summary.reward_sum += sum(v for v in rewarded.column("reward").to_pylist() if v is not None)
        summary.row_errors += row_errors(rewarded, shard)
        if dry_run:
            continue
        target = join(out_url, output_name(shard))
        lineage = Lineage(stage="reward", inputs=[shard], config_hash=cfg_hash,
                          extra={"reward": reward.name, "reward_version": reward.version})
        summary.written.append(write_shard(rewarded, target, lineage))
    summary.seconds = time.monotonic() - start
    if unreadable:
        more = f" (and {len(unreadable) - 1} more unreadable shards)" if len(unreadable) > 1 else ""
        raise CorruptShardError(unreadable[0].path, unreadable[0].reason + more)
    return summary
