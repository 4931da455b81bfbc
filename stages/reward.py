"""The reward stage: fill reward, reward_components, reward_info and reward_version (DESIGN.md §5).

1:1 with its input: `rollouts/part-X.parquet` becomes `rewarded/part-X.parquet`, with the input recorded
in the output's lineage. Inputs already consumed by the output directory are skipped, and because the
output name is deterministic a re-run after a crash overwrites rather than duplicates. Re-rewarding the
same rollouts with another reward version simply targets another output directory.

A trajectory is scored once. The rows of a `--history per-turn` trajectory (arlctl/turn_rows.py) are
graded on their last row (the one not "continued": it holds final_state) with every turn's text as the
response, and that reward, reward_components, reward_info and reward_version are copied onto all of
them; a per-turn trajectory whose last row is not in the shard gets reward null with the cause.
`AutoReward` (`--reward auto`) scores each row with the reward registered under its own `env`; an env
without one gives reward null with reward_info.error "no reward registered for env X", never 0.

A row the grader could not grade (its tests could not run: a missing interpreter or pytest, a dead
sandbox) comes back from the reward function as reward None with reward_info.error, and stays null.
A poison row never blocks its shard: a `task` that is not a JSON object, a reward function that rejects
the row (any error but a TransientError, which means retry later, or a UsageError, which means the
reward's options are wrong), or a non-finite score gives that row reward = null with reward_info
{"error": cause}; filter then drops it under completeness. A shard that cannot be read is skipped
(the others are still rewarded) and reported, or with --quarantine moved to `_quarantine/`. Rows with
other bad values (schemas/values.py) pass through unchanged for filter's invalid_values rule; a row no
writer accepts (response_mask or response_logprobs not as long as response_ids) is set aside, before
scoring, into `_quarantine/<stem>.rows.parquet` beside its shard, and named (shard, row, trajectory_id,
cause) among the row errors under the cause invalid_row; the shard's other rows are rewarded and written.
A shard larger than the read caps (arlctl/io/shards.py ReadLimits) is an unreadable shard.

Truncated rows (status truncated: the reply was cut by a token budget or the context, finish_reason
"length"; stages/agent_loop.py) are graded as configured by --on-truncated: grade (as any row, the
default), zero (reward 0 with reward_info.truncated "zero", not graded, no overlong penalty) or null
(reward null with reward_info.error TRUNCATED_NULL: a row error of cause `truncated`, which filter's
completeness drops). The summary counts the truncated rows it saw, and the mode.

Scoring goes through arlctl/rewards/scoring.py: a reward with `score_group` (it compares the members of a
GRPO group) is called once per group of the shard (rows sharing group_id, in row order) and an error
there nulls that group's rows with the cause; composite rewards (`swe + 0.2*judge`,
arlctl/rewards/composite.py) score each component and add them up; a remote reward (`http://HOST:P/NAME`,
arlctl/rewards/server.py) posts the shard's rows to an `arlctl reward-serve`. With a reward cache
(arlctl/rewards/cache.py) a row already scored under the same reward_version is not scored again; each
shard appends what it added to the cache before the shard itself is written.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arlctl.envs.registry import Reward
from arlctl.errors import CorruptShardError
from arlctl.io.fs import basename, join
from arlctl.io.ledger import consuming_lineage
from arlctl.io.partition import partition
from arlctl.io.shards import Lineage, config_hash, quarantine, quarantine_rows, read_shard, scan, write_shard
from arlctl.rewards.cache import RewardCache
from arlctl.rewards.scoring import (
    Interrupted,
    Item,
    ScoreContext,
    Scored,
    Scorer,
    Slots,
    one_line,
    row_error,
    score_items,
    until_stopped,
)
from arlctl.schemas.trajectory import TRAJECTORY_SCHEMA, SchemaError, token_layout_problems
from arlctl.stages.configs import RewardConfig
from arlctl.turn_rows import CONTINUED, first_turn_indices


@dataclass
class RewardSummary:
    inputs_seen: int = 0
    skipped_consumed: int = 0
    written: list[str] = field(default_factory=list)
    rows: int = 0
    reward_sum: float = 0.0
    corrupt: list[str] = field(default_factory=list)
    row_errors: list[str] = field(default_factory=list)  # "shard row i (trajectory_id): cause": reward null
    error_causes: dict[str, int] = field(default_factory=dict)  # error_cause -> rows (see error_cause)
    seconds: float = 0.0
    cache_hits: int = 0  # (row, reward component) lookups answered by the reward cache
    cache_misses: int = 0  # ... and those scored (both 0 without a cache)
    interrupted: str | None = None  # a stop (SIGTERM) came during a shard: which one, left pending
    truncated: int = 0  # rows of status truncated, handled as on_truncated says
    on_truncated: str = RewardConfig.GRADE
    envs: set[str] = field(default_factory=set)  # the envs of the rows scored (a wrong --reward names them)
    metrics: str | None = None  # the invocation's metrics row, once written (stages/reward_job.py)
    other_reward: list[str] = field(default_factory=list)  # outputs kept from another reward's settings

    def add_causes(self, causes: dict[str, int]) -> None:
        for cause, count in causes.items():
            self.error_causes[cause] = self.error_causes.get(cause, 0) + count

    def as_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs_seen, "skipped_consumed": self.skipped_consumed,
                "shards_written": len(self.written), "written": self.written, "rows": self.rows,
                "mean_reward": (self.reward_sum / self.rewarded) if self.rewarded else None,
                "corrupt": self.corrupt, "row_errors": self.row_errors, "error_causes": self.error_causes,
                "cache_hits": self.cache_hits, "cache_misses": self.cache_misses,
                "truncated": self.truncated, "on_truncated": self.on_truncated, "envs": sorted(self.envs),
                "other_reward": self.other_reward,
                "interrupted": self.interrupted, "seconds": round(self.seconds, 3)}

    @property
    def rewarded(self) -> int:
        """Rows that got a reward (the others carry reward_info.error)."""
        return self.rows - len(self.row_errors)

    def to_json(self) -> dict[str, Any]:
        """The --json summary of `arlctl reward` (the command adds reward_version, cache and metrics)."""
        return self.as_dict()

    def merge(self, other: RewardSummary) -> None:
        """Add another round's counts (a --watch daemon reports its total)."""
        for name in ("inputs_seen", "skipped_consumed", "rows", "reward_sum", "cache_hits", "cache_misses", "truncated"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.written += other.written
        self.other_reward += other.other_reward
        self.corrupt += other.corrupt
        self.row_errors += other.row_errors
        self.add_causes(other.error_causes)
        self.envs |= other.envs
        self.interrupted = self.interrupted or other.interrupted
        self.on_truncated = other.on_truncated

    def summary_line(self, version: str, out: str, dry_run: bool = False, cache: bool = False) -> str:
        mean = "-" if not self.rewarded else f"{self.reward_sum / self.rewarded:.4f}"
        shards = len(self.written) if not dry_run else self.inputs_seen - self.skipped_consumed
        return (f"rewarded {self.rows} rows ({version}), mean reward {mean}; "
                f"{'would write' if dry_run else 'wrote'} {shards} shards to {out}; skipped {self.skipped_consumed} "
                "already consumed" + (f"; reward cache: {self.cache_hits} hits, {self.cache_misses} misses"
                                      if cache else "")
                + (f"; {self.truncated} truncated ({TRUNCATED_SHOWN[self.on_truncated]})" if self.truncated else "")
                + (f"; {len(self.row_errors)} rows got no reward (see above)" if self.row_errors else "")
                + (f"; {self.interrupted}" if self.interrupted else ""))


RewardResult = RewardSummary  # the stage's result type, under the name every stage uses
TRUNCATED_SHOWN = {"grade": "graded", "zero": "reward 0", "null": "no reward"}  # --on-truncated in the summary
TRUNCATED_NULL = "truncated: the reply was cut (finish_reason {reason}) and --on-truncated null leaves it ungraded"


@dataclass
class RewardIO:
    in_url: str  # rollout shards
    out: str  # rewarded shards, one per input of the same name
    worker: tuple[int, int] = (0, 1)  # (i, n): worker i's share of the inputs
    dry_run: bool = False


def _response_text(row: dict[str, Any]) -> str:
    return "\n".join(t["text"] for t in row["turns"])


def _parse_task(text: str) -> dict[str, Any] | str:
    """The row's task as a dict, or why it is not one (the row then gets a null reward with that cause)."""
    try:
        task = json.loads(text)
    except (ValueError, RecursionError) as err:
        return f"task is not valid JSON ({one_line(err)})"
    return task if isinstance(task, dict) else f"task is JSON {type(task).__name__}, not an object"


class AutoReward:
    """`--reward auto`: each row is scored by the reward registered under its own `env` (built in, or a
    plugin's `arlctl.rewards` entry point of the same name). options: env name -> that reward's options.

    An env with no reward of its name gets no score: reward null, reward_info.error NO_REWARD (never 0).
    A `module:attr` env spec has no reward name to look up, so it is such an env too.
    """

    name = "auto"

    def __init__(self, options: dict[str, dict[str, Any]] | None = None):
        self.options = options or {}
        self._found: dict[str, Reward | str] = {}
        suffix = ",".join(f"{env}.{k}={v}" for env in sorted(self.options) for k, v in sorted(self.options[env].items()))
        self.version = "auto" + (f"+{suffix}" if suffix else "")

    def for_env(self, env: str) -> Reward | str:
        """The env's reward, or the row error when it has none (a broken plugin is a UsageError)."""
        if env not in self._found:
            from arlctl.envs import registry

            known = (env in registry.REWARDS or env in registry.builtin_names("reward")
                     or registry.family_of(env) is not None or env in registry.entry_points(registry.REWARD_GROUP))
            self._found[env] = (registry.get_reward(env, **self.options.get(env, {})) if known and not
                                registry.is_spec(env) else NO_REWARD.format(env=env))
        return self._found[env]


NO_REWARD = "no reward registered for env {env}"
NO_FINAL_ROW = "the last row of this per-turn trajectory is not in this shard"


@dataclass
class _Unit:
    """One scoring call: a whole-trajectory row, or the rows of one per-turn trajectory (scored on its last)."""

    rows: list[int]  # every table row that gets the result
    scored: int | None  # the row whose final_state and task are graded; None: `error` instead
    reward: Scorer | None
    error: str | None = None
    preset: Scored | None = None  # decided without grading (--on-truncated zero | null)


def _units(table: pa.Table, reward: Scorer | AutoReward) -> list[_Unit]:
    """One unit per whole-trajectory row (a repeated id stays filter's duplicate rule, each row is scored),
    and one per per-turn trajectory, scored on its final row; without exactly one final row: an error unit."""
    envs = table.column("env").to_pylist()
    reasons = table.column("finish_reason").to_pylist()
    first = first_turn_indices(table)
    per_turn: dict[str, list[int]] = {}
    plan: list[tuple[list[int], int | None, str | None]] = []  # (rows, scored row, error)
    for i, (tid, reason, index) in enumerate(zip(table.column("trajectory_id").to_pylist(), reasons, first,
                                                 strict=True)):
        if reason == CONTINUED or index > 0:
            if tid not in per_turn:
                per_turn[tid] = []
                plan.append((per_turn[tid], None, tid))  # filled below, in order of first row
            per_turn[tid].append(i)
        else:
            plan.append(([i], i, None))
    units = []
    for rows, scored, tid in plan:
        if tid is not None:
            finals = [i for i in rows if reasons[i] != CONTINUED]
            rows.sort(key=lambda i: first[i])
            if len(finals) != 1:
                cause = NO_FINAL_ROW if not finals else f"this per-turn trajectory has {len(finals)} final rows"
                units.append(_Unit(rows, None, None, cause))
                continue
            scored = finals[0]
        chosen = reward.for_env(envs[scored]) if isinstance(reward, AutoReward) else reward
        units.append(_Unit(rows, None, None, chosen) if isinstance(chosen, str) else _Unit(rows, scored, chosen))
    return units


async def _score_units(units: list[_Unit], rows: list[dict[str, Any]], ctx: ScoreContext) -> list[Scored]:
    """Score every unit once, each reward over all of its units at once (group and batch rewards see them
    together); async scorers (sandboxed graders, judges) run `ctx.slots` at a time."""
    out: list[Scored] = [u.preset if u.preset is not None else row_error(str(u.error)) for u in units]
    by_reward: dict[int, tuple[Any, list[int], list[Item]]] = {}
    for u, unit in enumerate(units):
        if unit.scored is None or unit.reward is None or unit.preset is not None:
            continue
        row = rows[unit.scored]
        task = _parse_task(row["task"])
        if isinstance(task, str):
            out[u] = row_error(task)
            continue
        # The policy's whole response: every turn of the trajectory, in order (one row or several).
        text = "\n".join(_response_text(rows[i]) for i in unit.rows)
        entry = by_reward.setdefault(id(unit.reward), (unit.reward, [], []))
        entry[1].append(u)
        turns = [t["text"] for i in unit.rows for t in rows[i]["turns"]]
        entry[2].append(Item(row["final_state"], task, text, row["trajectory_id"], row["group_id"], turns))

    async def one(reward: Any, indices: list[int], items: list[Item]) -> None:
        for u, scored in zip(indices, await score_items(reward, items, ctx), strict=True):
            out[u] = scored

    await asyncio.gather(*(one(*entry) for entry in by_reward.values()))
    return out


def _on_truncated(units: list[_Unit], table: pa.Table, mode: str) -> None:
    """--on-truncated zero | null: the units whose graded row is truncated get their result without grading."""
    if mode == "grade":
        return
    status, reasons = table.column("status").to_pylist(), table.column("finish_reason").to_pylist()
    for unit in units:
        if unit.scored is None or status[unit.scored] != "truncated":
            continue
        reason = reasons[unit.scored]
        unit.preset = ((0.0, {"truncated": 0.0}, {"truncated": "zero", "finish_reason": reason}) if mode == "zero"
                       else (None, None, {"error": TRUNCATED_NULL.format(reason=reason), "truncated": "null"}))


def reward_table(table: pa.Table, reward: Scorer | AutoReward, concurrency: int = RewardConfig.CONCURRENCY,
                 cache: RewardCache | None = None, overlong: tuple[int, int] | None = None,
                 stop: Any = None, on_truncated: str = RewardConfig.GRADE) -> pa.Table:
    """Return `table` with the reward columns filled by `reward`; every other column is unchanged.

    overlong: (L_max, L_cache) of DAPO's soft overlong penalty (arlctl/rl/advantages.py `overlong_penalty`),
    added to every scored trajectory's reward as the component `overlong`, from the tokens it generated (all
    its rows). Applied after the cache: the cache holds the reward's own score.

    Scored once per trajectory: the rows of a per-turn trajectory (arlctl/turn_rows.py) all get the score
    of its last row. A row that could not be scored has reward and reward_components null and
    reward_info {"error": ...}. With a cache, rows it holds are not scored again (arlctl/rewards/cache.py).

    stop: anything with is_set() (SIGTERM/SIGINT set it). Once set, no further row is scored and the calls
    in flight are cancelled (a remote request dripping its answer included): Interrupted, a TransientError,
    and nothing of the table is returned.

    on_truncated: grade | zero | null, for the trajectories of status truncated (see the module's docstring).
    """
    rows = table.select(["task", "final_state", "turns", "trajectory_id", "group_id"]).to_pylist()
    units = _units(table, reward)
    _on_truncated(units, table, on_truncated)

    async def score() -> list[Scored]:
        return await until_stopped(_score_units(units, rows, ScoreContext(Slots(concurrency, stop=stop), cache)),
                                   stop)

    scored = asyncio.run(score())
    n = table.num_rows
    rewards: list[float | None] = [None] * n
    components: list[Any] = [None] * n
    infos: list[str | None] = [None] * n
    versions: list[str | None] = [None] * n
    generated = table.column("generated_tokens").to_pylist()
    for unit, (value, parts, info) in zip(units, scored, strict=True):
        if overlong is not None and value is not None and unit.preset is None:
            penalty = _overlong(sum(generated[i] or 0 for i in unit.rows), overlong)
            value, parts = value + penalty, {**(parts or {"reward": value}), "overlong": penalty}
        text = json.dumps(info, sort_keys=True, default=str)
        for i in unit.rows:
            rewards[i], infos[i] = value, text
            components[i] = None if parts is None else list(parts.items())
            versions[i] = unit.reward.version if unit.reward is not None else (
                None if isinstance(reward, AutoReward) else reward.version)
    columns = {
        "reward": pa.array(rewards, pa.float32()),
        "reward_components": pa.array(components, TRAJECTORY_SCHEMA.field("reward_components").type),
        "reward_info": pa.array(infos, pa.string()),
        "reward_version": pa.array(versions, pa.string()),
    }
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), TRAJECTORY_SCHEMA.field(name), values)
    return table


def _overlong(length: int, overlong: tuple[int, int]) -> float:
    from arlctl.rl.advantages import overlong_penalty  # torch: imported only when the penalty is on

    return overlong_penalty([length], *overlong)[0]


def error_cause(error: str, infra: bool) -> str:
    """The metrics name of a row's reward_info.error (RUN/metrics error_causes; "infra:" = not the policy's).

    The swe grader marks a run that could not test with reward_info.infra = true (arlctl/envs/swe/grader.py):
    pytest missing in the sandbox, no report from the driver, or the harness failing otherwise."""
    if error.startswith(NO_REWARD.format(env="")):
        return "no_reward_for_env"
    if error == NO_FINAL_ROW or "per-turn trajectory" in error:
        return "incomplete_trajectory"
    if error.startswith(TRUNCATED_NULL.split(":")[0] + ":"):
        return "truncated"
    if not infra:
        return "reward_error"
    if "cannot import pytest" in error or "No module named 'pytest'" in error or "No module named pytest" in error:
        return "infra:grader_no_pytest"
    if "produced no report" in error:
        return "infra:grader_no_report"
    return "infra:grader_error"


def error_causes(table: pa.Table) -> dict[str, int]:
    """{cause: rows} over the rows of a rewarded table left without a reward."""
    causes: dict[str, int] = {}
    for value, info in zip(table.column("reward").to_pylist(), table.column("reward_info").to_pylist(), strict=True):
        if value is None:
            detail = _info(info)
            cause = error_cause(str(detail.get("error") or ""), bool(detail.get("infra")))
            causes[cause] = causes.get(cause, 0) + 1
    return causes


def _info(text: str | None) -> dict[str, Any]:
    try:
        info = json.loads(text or "{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def row_errors(table: pa.Table, shard: str) -> list[str]:
    """`shard row i (trajectory_id 'x'): cause` for every row of a rewarded table left without a reward."""
    out = []
    ids, rewards, infos = (table.column(c).to_pylist() for c in ("trajectory_id", "reward", "reward_info"))
    for i, (tid, value, info) in enumerate(zip(ids, rewards, infos, strict=True)):
        if value is None:
            out.append(f"{basename(shard)} row {i} (trajectory_id {tid!r}): {_info(info).get('error')}")
    return out


def output_name(input_url: str) -> str:
    return basename(input_url)


def reward_dir(in_url: str, out_url: str, reward: Scorer | AutoReward, concurrency: int = RewardConfig.CONCURRENCY, on_corrupt: str = "raise",
               dry_run: bool = False, only: list[str] | None = None, worker: tuple[int, int] = (0, 1),
               stop: Any = None, cache: RewardCache | None = None,
               overlong: tuple[int, int] | None = None, on_truncated: str = RewardConfig.GRADE) -> RewardSummary:
    """Reward every input shard not yet consumed by out_url. Returns what was done.

    worker=(i, n): take only the shards whose stable hash falls to worker i of n, so n copies on n
    machines never take the same shard. stop: anything with is_set(); checked between shards, and within
    one before each row: a shard stopped half-way is not written (it stays pending) and the summary's
    `interrupted` names it (the command then exits 75 once it has reported what was written).
    cache: rows it holds are not scored again; each shard's new entries are appended to it (one file)
    before the shard is written, and also when its scoring stops on a TransientError (not with dry_run).
    on_truncated: grade | zero | null for the rows of status truncated.
    """
    start = time.monotonic()
    summary = RewardSummary(on_truncated=on_truncated)
    done = consuming_lineage(out_url, same_name=True)  # 1:1: rewarded/X vouches only for rollouts/X
    unreadable: list[CorruptShardError] = []
    cfg_hash = config_hash({"reward": reward.name, "version": reward.version}
                           | ({"overlong": list(overlong)} if overlong else {})
                           | ({"on_truncated": on_truncated} if on_truncated != "grade" else {}))
    hits, misses = (cache.hits, cache.misses) if cache is not None else (0, 0)
    for shard in only if only is not None else partition(scan(in_url).shards, *worker):
        if stop is not None and stop.is_set():
            break
        summary.inputs_seen += 1
        if basename(shard) in done:
            summary.skipped_consumed += 1
            if done[basename(shard)].config_hash != cfg_hash:  # kept, but not this reward's: say so
                earlier = done[basename(shard)].extra
                summary.other_reward.append(f"{basename(shard)} (rewarded with "
                                            f"{earlier.get('reward_version') if isinstance(earlier, dict) else '?'})")
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
        table, set_aside = _set_aside_unwritable(table, shard, dry_run)
        summary.rows += len(set_aside)
        summary.row_errors += set_aside
        summary.add_causes({"invalid_row": len(set_aside)} if set_aside else {})
        try:
            rewarded = reward_table(table, reward, concurrency, cache, overlong=overlong, stop=stop,
                                    on_truncated=on_truncated)
        except Interrupted:  # stopped half-way: this shard is not written; what was done is reported
            summary.interrupted = f"stopped by a signal while scoring {basename(shard)}: not written, it stays pending"
            break
        finally:  # what was paid for is kept, also when a TransientError leaves the shard pending
            if cache is not None and not dry_run:
                cache.flush()
        summary.rows += rewarded.num_rows
        summary.reward_sum += sum(v for v in rewarded.column("reward").to_pylist() if v is not None)
        summary.truncated += rewarded.column("status").to_pylist().count("truncated")
        summary.envs.update(str(env) for env in rewarded.column("env").to_pylist())
        summary.row_errors += row_errors(rewarded, shard)
        summary.add_causes(error_causes(rewarded))
        if dry_run:
            continue
        target = join(out_url, output_name(shard))
        lineage = Lineage(stage="reward", inputs=[shard], config_hash=cfg_hash,
                          extra={"reward": reward.name, "reward_version": reward.version})
        try:
            summary.written.append(write_shard(rewarded, target, lineage))
        except SchemaError as err:  # fail closed: a shard whose output cannot be written is a bad input
            bad = CorruptShardError(shard, f"its rewarded rows cannot be written ({err})")
            if on_corrupt == "raise":
                unreadable.append(bad)
                continue
            summary.corrupt.append(f"{shard}: {bad.reason}")
            if on_corrupt == "quarantine":
                quarantine(shard)
    if cache is not None:
        summary.cache_hits, summary.cache_misses = cache.hits - hits, cache.misses - misses
    summary.seconds = time.monotonic() - start
    if unreadable:
        more = f" (and {len(unreadable) - 1} more unreadable shards)" if len(unreadable) > 1 else ""
        raise CorruptShardError(unreadable[0].path, unreadable[0].reason + more)
    return summary


def _set_aside_unwritable(table: pa.Table, shard: str, dry_run: bool) -> tuple[pa.Table, list[str]]:
    """The shard without the rows no writer accepts (schemas/trajectory.py `token_layout_problems`),
    and a `shard row i (trajectory_id 'x'): quarantined: cause` line per row set aside. Those rows go
    to `_quarantine/<stem>.rows.parquet` beside the shard (not with dry_run): the rest are rewarded and
    written, so one poison row never fails its shard at write on every retry."""
    problems = token_layout_problems(table)
    if not problems:
        return table, []
    causes: dict[int, str] = {}
    for row, _, cause in problems:
        causes.setdefault(row, cause)
    ids = table.column("trajectory_id").to_pylist()
    lines = [f"{basename(shard)} row {row} (trajectory_id {ids[row]!r}): quarantined: {cause}"
             for row, cause in sorted(causes.items())]
    if not dry_run:
        quarantine_rows(table.take(pa.array(sorted(causes), pa.int64())), shard, lines, stage="reward")
    keep = [i for i in range(table.num_rows) if i not in causes]
    return table.take(pa.array(keep, pa.int64())), lines


def run(cfg: RewardConfig, io: RewardIO, stop: Any = None, reward: Scorer | AutoReward | None = None,
        cache: RewardCache | None = None) -> RewardResult:
    """The stage's entry point: reward what is pending, stopping between shards once `stop` is set.
    reward: the built reward (default: cfg.reward with cfg.reward_opt, arlctl/rewards/composite.py; auto
    without options);
    cache: the invocation's reward cache, opened once (None: none)."""
    from arlctl.rewards.composite import build_reward

    cfg.check()
    if reward is None:
        reward = AutoReward() if cfg.reward == "auto" else build_reward(cfg.reward, cfg.reward_opt)
    return reward_dir(io.in_url, io.out, reward, concurrency=cfg.concurrency,
                      on_corrupt="quarantine" if cfg.quarantine else "raise", dry_run=io.dry_run, worker=io.worker,
                      stop=stop, cache=cache, overlong=cfg.overlong(), on_truncated=cfg.on_truncated)
