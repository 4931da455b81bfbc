"""One `arlctl eval` invocation as a Python API: evaluate a policy version, follow published versions, compare.

An evaluated version is a directory of ordinary rewarded trajectory shards and a summary:

  EVALS/<name>/vNNNNNN/greedy-<utc>-<rand>.parquet    G=1 at temperature 0 (--greedy, the default)
  EVALS/<name>/vNNNNNN/sampled-<utc>-<rand>.parquet   G=K at --temperature (--samples K)
  EVALS/<name>/vNNNNNN/summary.json                   written last: the version is evaluated once it is there

(EVALS = RUN/evals.) The rows come from the rollout stage's own `run_rollout` (into a hidden `_work/` beside
them, removed afterwards) and the reward stage's own `reward_table`; each shard's lineage says stage "eval",
the eval's name, its mode and the policy version, and lists no inputs: it consumed nothing of the pipeline.
Filter reads RUN/rewarded and train RUN/batches, so no eval row is ever trained on.

A version whose summary.json exists is never evaluated again (unless `force`); one without it (an eval
stopped half-way) is cleared and evaluated from the start. `watch` follows a policy directory and
evaluates each published version whose number is a multiple of `--every`, oldest first, until stopped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Generation, Policy, SamplingParams
from arlctl.io import ledger, store
from arlctl.io.fs import basename, join
from arlctl.io.run import EVAL_SUMMARY, eval_version_dir
from arlctl.io.shards import Lineage, config_hash, read_shard, scan, write_shard
from arlctl.stages.eval import MODES, EvalConfig, Outcome, compare, outcomes, summarize
from arlctl.stages.reward import reward_table
from arlctl.stages.rollout_job import EnvPicker, RolloutJob, run_rollout

WORK_DIR = "_work"  # the unrewarded rollouts of a version being evaluated (hidden; removed once it is done)
ROW_COLUMNS = ["task_id", "reward", "status", "reward_info"]


@dataclass
class EvalJob:
    """What every version of one named eval shares: tasks, envs, reward, sampling and where it writes."""

    cfg: EvalConfig
    name: str
    root: str  # the evals directory: RUN/evals, or --out
    tasks: list[dict[str, Any]]
    env: str  # the env of tasks without their own
    env_options: dict[str, Any]
    reward: Any  # a built reward (arlctl.rewards.composite.build_reward, or stages.reward.AutoReward)
    sources: list[str]  # the task specs, recorded in the summary and the lineage
    policy_spec: str = ""
    backend: str = "hf"
    force: bool = False

    def version_dir(self, version: int) -> str:
        return eval_version_dir(self.root, self.name, version)

    def evaluated(self) -> set[int]:
        return evaluated_versions(self.root, self.name)


def evaluated_versions(root: str, name: str) -> set[int]:
    """Versions of eval `name` under `root` whose summary.json exists."""
    found = store.list_committed(join(root, name), EVAL_SUMMARY)
    return {v for entry, _ in found if (v := ledger.parse_version(entry)) is not None}


@dataclass
class EvalResult:
    """One version's evaluation: its summary (None when interrupted before it was written)."""

    version: int
    directory: str
    summary: dict[str, Any] | None
    skipped: bool = False  # already evaluated (its summary.json was there)
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**(self.summary or {}), "version": self.version, "directory": self.directory,
                "skipped": self.skipped, "interrupted": self.interrupted}

    def summary_line(self) -> str:
        if self.interrupted or self.summary is None:
            return f"v{self.version}: interrupted before its summary; nothing counted (a rerun starts it again)"
        s = self.summary
        rate = "-" if s["correct_rate"] is None else f"{s['correct_rate']:.3f} ± {s['correct_se']:.3f}"
        passes = ", ".join(f"pass@{k} {v:.3f}" for k, v in s["pass_at_k"].items())
        left_out = f"; {s['null_reward']} rows without reward, {s['not_answers']} not answers (env/policy error, " \
                   "aborted), left out" if s["null_reward"] or s["not_answers"] else ""
        return (f"{'already evaluated: ' if self.skipped else ''}{self.directory}: {s['n_tasks']} tasks, "
                f"{s['n_rows']} rows; {s['primary']} correct {rate}" + (f"; {passes}" if passes else "") + left_out)


class LentPolicy:
    """The eval's policy lent to one `run_rollout`, which closes what it is given: this one stays open, so a
    version is loaded once for its greedy and sampled passes and reloaded in place for the next version."""

    def __init__(self, policy: Policy):
        self.policy = policy

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def version(self) -> int:
        return self.policy.version

    @version.setter
    def version(self, value: int) -> None:
        self.policy.version = value

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.policy.vocab_size

    @property
    def max_context(self) -> int | None:
        return self.policy.max_context

    def metrics(self) -> dict[str, Any]:
        return self.policy.metrics()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return await self.policy.generate(prompt_ids, sampling)

    async def reload(self, policy_dir: str, version: int) -> None:
        await self.policy.reload(policy_dir, version)

    async def close(self) -> None:
        pass  # the owner closes the policy


# ---------------------------------------------------------------------------------------------- one version


async def evaluate_version(job: EvalJob, pol: Policy, stop: asyncio.Event, log: Callable[[str], None] = print,
                           source: str | None = None) -> EvalResult:
    """Evaluate the version `pol` holds: roll out each mode, reward, write the shards, then summary.json.
    source: where that version was loaded from, for the summary (default: the policy's name)."""
    version, directory = pol.version, job.version_dir(pol.version)
    existing = read_summary(directory)
    if existing is not None and not job.force:
        return EvalResult(version, directory, existing, skipped=True)
    store.remove_dir(directory, marker=EVAL_SUMMARY)  # an earlier attempt's leftovers, or --force
    rollouts: dict[str, Any] = {}
    for mode in job.cfg.modes():
        rollouts[mode] = await _roll_out(job, pol, mode, stop, log)
        if stop.is_set():
            return EvalResult(version, directory, None, interrupted=True)
    rows: dict[str, list[Outcome]] = {}
    shards: list[str] = []
    for mode in job.cfg.modes():
        rows[mode] = []
        for shard in scan(join(directory, WORK_DIR, mode)).shards:
            table = read_shard(shard, bad_values="keep")  # bad values are counted, as everywhere
            rewarded = await asyncio.to_thread(reward_table, table, job.reward, job.cfg.reward_concurrency)
            lineage = Lineage(stage="eval", inputs=[], config_hash=config_hash(_spec(job)),
                              extra={"eval": job.name, "mode": mode, "policy": pol.name, "policy_version": version,
                                     "reward_version": job.reward.version})
            shards.append(basename(write_shard(rewarded, join(directory, basename(shard)), lineage)))
            rows[mode] += outcomes(rewarded)
    summary = {"name": job.name, "version": version, "policy": source or pol.name, **_spec(job), "n_tasks_given": len(job.tasks),
               **summarize(rows, job.cfg), "shards": shards,
               "rollout": {m: {k: getattr(r, k) for k in ("trajectories", "generated_tokens", "seconds", "errors",
                                                          "error_causes")} for m, r in rollouts.items()},
               "created_at": time.time()}
    store.write_file(join(directory, EVAL_SUMMARY), json.dumps(summary, indent=1, sort_keys=False) + "\n")
    store.remove_dir(join(directory, WORK_DIR))
    return EvalResult(version, directory, summary)


def _spec(job: EvalJob) -> dict[str, Any]:
    """The settings that make two versions' evals comparable (recorded in every summary)."""
    cfg = job.cfg
    return {"tasks": job.sources, "env": job.env, "modes": cfg.modes(), "greedy": "greedy" in cfg.modes(),
            "samples": cfg.samples, "temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed,
            "correct_at": cfg.correct_at, "reward_version": job.reward.version, "max_turns": cfg.max_turns,
            "max_new_tokens": cfg.max_new_tokens}


async def _roll_out(job: EvalJob, pol: Policy, mode: str, stop: asyncio.Event, log: Callable[[str], None]) -> Any:
    """One mode's rollout into the version's _work/<mode>/ (its metrics row stays in _work/ too)."""
    picker = EnvPicker(job.env_options)
    picker.check(job.tasks, job.env)  # a fresh picker per pass: run_rollout closes the one it is given
    out = join(job.version_dir(pol.version), WORK_DIR, mode)
    rollout_job = RolloutJob(cfg=job.cfg.loop(mode, job.env), tasks=job.tasks, envs=picker, out=out, run=None,
                             backend=job.backend, sources=job.sources, policy_spec=job.policy_spec,
                             flush_groups=1 << 30, flush_seconds=600.0, prefix=mode)
    result = await run_rollout(rollout_job, LentPolicy(pol), stop, log=log)
    failed = result.failure(len(job.tasks), max_error_frac=1.0)  # only "nothing usable": the rest is counted
    if failed is not None and not stop.is_set():
        raise TerminalError(f"eval {job.name} v{pol.version} ({mode}): {failed[0]}", hint=failed[1])
    return result


# ---------------------------------------------------------------------------------------------- reading


def read_summary(directory: str) -> dict[str, Any] | None:
    raw = store.read_file(join(directory, EVAL_SUMMARY))
    return None if raw is None else json.loads(raw)


def read_eval(root: str, name: str, version: int) -> tuple[dict[str, Any], dict[str, list[Outcome]]]:
    """An evaluated version's summary and its rows by mode; a version not (completely) evaluated is a
    UsageError naming it."""
    directory = eval_version_dir(root, name, version)
    summary = read_summary(directory)
    if summary is None:
        evaluated = sorted(evaluated_versions(root, name))
        raise UsageError(f"{directory} has no {EVAL_SUMMARY}: v{version} of eval {name!r} is not evaluated",
                         hint=f"evaluated versions: {', '.join(f'v{v}' for v in evaluated) or 'none'}; "
                              f"run `arlctl eval --name {name} --policy ...` first")
    rows: dict[str, list[Outcome]] = {}
    for shard in scan(directory).shards:
        mode = basename(shard).split("-", 1)[0]
        if mode in MODES:
            rows.setdefault(mode, []).extend(outcomes(read_shard(shard, columns=ROW_COLUMNS, bad_values="keep")))
    return summary, rows


def compare_versions(root: str, name: str, version_a: int, version_b: int) -> dict[str, Any]:
    """`arlctl eval --compare vA vB`: stages/eval.compare over two evaluated versions."""
    summary_a, rows_a = read_eval(root, name, version_a)
    summary_b, rows_b = read_eval(root, name, version_b)
    if summary_a.get("tasks") != summary_b.get("tasks"):
        raise UsageError(f"v{version_a} and v{version_b} of eval {name!r} ran different tasks "
                         f"({summary_a.get('tasks')} and {summary_b.get('tasks')})")
    return {"name": name, **compare(summary_a, rows_a, summary_b, rows_b)}


# ---------------------------------------------------------------------------------------------- --watch


@dataclass
class WatchResult:
    evaluated: list[EvalResult] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # version -> why it was not evaluated
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"evaluated": [r.version for r in self.evaluated if not r.skipped and r.summary is not None],
                "skipped": [r.version for r in self.evaluated if r.skipped],
                "failed": {str(v): why for v, why in self.failed.items()}, "interrupted": self.interrupted,
                "summaries": [r.to_json() for r in self.evaluated if r.summary is not None]}


def due_versions(job: EvalJob, policy_dir: str, failed: set[int] | dict[int, str]) -> list[tuple[int, Any]]:
    """Published versions whose number is a multiple of --every, not yet evaluated nor failed, oldest first."""
    done = job.evaluated() if not job.force else set()
    return [(v, loc) for v, loc in ledger.list_versions(policy_dir)
            if v % job.cfg.every == 0 and v not in done and v not in failed]


async def watch(job: EvalJob, policy_dir: str, load: Callable[[str], Policy], stop: asyncio.Event, poll: float,
                first: str | None = None, log: Callable[[str], None] = print,
                on_result: Callable[[EvalResult], None] | None = None) -> WatchResult:
    """Evaluate each due version of `policy_dir` once, oldest first, until `stop`.

    load(path): a loaded Policy for a model directory (the first one; later versions reload in place).
    first: a model to evaluate before the published versions (a base model is version 0).
    A version that cannot be loaded (pruned by `sync --keep` before its turn) or whose rollout produced
    nothing usable is logged and recorded in `failed`, not retried; a TransientError is retried next poll.
    """
    from arlctl.inference.loader import resolve_policy

    result = WatchResult()
    pol: Policy | None = None
    forced: set[int] = set()  # with force, each version once per invocation

    async def one(path: str, version: int | None) -> None:
        nonlocal pol
        if pol is None:
            pol = await asyncio.to_thread(load, path)
        elif version is not None and version != pol.version:
            await pol.reload(path, version)
        if pol.version % job.cfg.every:
            return
        done = await evaluate_version(job, pol, stop, log, source=path)
        forced.add(pol.version)
        result.evaluated.append(done)
        if on_result is not None:
            on_result(done)

    try:
        if first is not None:
            await one(first, None)
        while not stop.is_set():
            for version, location in due_versions(job, policy_dir, {**result.failed, **dict.fromkeys(forced)}):
                if stop.is_set():
                    break
                try:
                    path = await asyncio.to_thread(lambda loc=location: str(resolve_policy(str(loc), False).path))
                    await one(path, version)
                except TransientError as err:
                    log(f"v{version}: {err}; retrying at the next poll")
                    break
                except (TerminalError, OSError) as err:
                    result.failed[version] = str(err)
                    log(f"v{version}: not evaluated: {err}")
            try:
                await asyncio.wait_for(stop.wait(), timeout=poll)
            except TimeoutError:
                pass
    finally:
        if pol is not None:
            await pol.close()
    result.interrupted = any(r.interrupted for r in result.evaluated)
    return result


__all__ = ["EvalJob", "EvalResult", "LentPolicy", "WatchResult", "compare_versions", "due_versions",
           "evaluate_version", "evaluated_versions", "read_eval", "read_summary", "watch"]
