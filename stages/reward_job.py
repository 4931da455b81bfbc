"""The reward stage's job: what `arlctl reward` does, callable without the CLI.

plan_reward checks the settings and the IO, builds the reward once (a wrong option is a usage error
before any row), checks that sandboxed graders can run and opens the reward cache. run_job rewards what is
pending under the stage's run lock, once or as a daemon (io/stage_loop.py), and writes the invocation's
metrics row. verdict turns the result into the exit: None (0), transient (75: a shard stopped half-way)
or terminal (1: no row got a reward, or more than --max-error-frac got none).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.stages.configs import RewardConfig
from arlctl.stages.jobs import RewardOptions, StageLoop, loop_of
from arlctl.stages.reward import AutoReward, RewardIO, RewardResult


@dataclass(kw_only=True)
class RewardJob(StageLoop):
    """One invocation: the settings, where rows come from and go, the built reward and its cache."""

    cfg: RewardConfig
    io: RewardIO
    reward: Any  # a Scorer or AutoReward (build)
    cache: Any = None  # the invocation's RewardCache, opened once (None: no cache)
    metrics_dir: str | None = None

    @property
    def warnings(self) -> list[str]:
        """What opening the cache found (for the caller to show)."""
        return [] if self.cache is None else list(self.cache.warnings)

    @property
    def lock_name(self) -> str:
        i, n = self.io.worker
        return "reward" if n == 1 else f"reward-worker{i}of{n}"


def plan_reward(cfg: RewardConfig, opts: RewardOptions) -> RewardJob:
    """Check everything a run needs before it starts; nothing is written (the cache is compacted unless
    this is a dry run)."""
    from arlctl.io.partition import parse_worker
    from arlctl.io.run import metrics_dir_for, resolve_io

    cfg.check()
    in_url, out = resolve_io("reward", opts.run, opts.in_url, opts.out, watch=opts.watch)
    worker = parse_worker(opts.worker)
    fn = build(cfg)
    if not opts.dry_run:
        preflight_graders(cfg.reward, fn)
    cache = open_cache(cfg, opts.run, opts.dry_run, fn)
    return RewardJob(cfg=cfg, io=RewardIO(in_url=in_url, out=out, worker=worker, dry_run=opts.dry_run),
                     reward=fn, cache=cache, metrics_dir=metrics_dir_for(out, opts.run), **loop_of(opts))


def run_job(job: RewardJob, on_round: Callable[[RewardResult], None] | None = None) -> RewardResult:
    """Reward what is pending (with --watch: until SIGTERM/SIGINT) under the run lock; the total, with the
    metrics row's URL in `metrics` when rows were rewarded."""
    from arlctl.io.stage_loop import run_stage
    from arlctl.stages import reward as stage

    total = RewardResult(on_truncated=job.cfg.on_truncated)

    def once(stop: Any) -> dict[str, Any]:
        done = stage.run(job.cfg, job.io, stop, reward=job.reward, cache=job.cache)
        total.merge(done)
        if on_round is not None:
            on_round(done)
        return done.to_json()

    started = time.monotonic()
    run_stage(once, out=job.io.out, lock_name=job.lock_name, watch=job.watch, poll=job.poll,
              lock_wait=job.lock_wait, dry_run=job.io.dry_run, units=lambda summary: len(summary["written"]))
    total.seconds = time.monotonic() - started
    if not job.io.dry_run and total.rows and job.metrics_dir:
        total.metrics = write_reward_metrics(total, job.reward.version, job.metrics_dir, job.cache is not None)
    return total


def summary(job: RewardJob, total: RewardResult) -> dict[str, Any]:
    """The --json summary: the counts plus the reward version, the cache and the metrics row."""
    out = total.to_json()
    out["reward_version"] = job.reward.version
    out["cache"] = None if job.cache is None else job.cache.url
    out["cache_warnings"] = job.warnings
    if total.metrics is not None:
        out["metrics"] = total.metrics
    return out


def verdict(job: RewardJob, total: RewardResult) -> Exception | None:
    """The error that decides the exit of a finished invocation (None: exit 0)."""
    if total.interrupted:  # a shard stopped half-way by SIGTERM: left pending
        return TransientError(total.interrupted, hint="re-run to reward it")
    if total.rows and not total.rewarded:  # every row failed: a broken grader, not a 0 for the policy
        return TerminalError(f"no row got a reward: all {total.rows} failed; first: {total.row_errors[0]}",
                             hint=_no_reward_hint(job, total))
    failed = error_frac(total, job.cfg.max_error_frac)
    # Outputs kept from other settings are named (a warning) when this invocation rewarded something else too
    # (new shards under new settings into one directory is a way to work); when it rewarded nothing, the
    # settings asked for were applied to nothing: an error, not "skipped N already consumed".
    if failed is None and total.other_reward and not total.written and not job.watch:
        n = len(total.other_reward)
        return TerminalError(f"{n} input shard(s) were rewarded earlier with other reward settings and are kept as they "
                             f"are, not scored with {job.reward.version}: {', '.join(total.other_reward[:3])}"
                             + (f" and {n - 3} more" if n > 3 else ""),
                             hint="give a new --out (e.g. RUN/rewarded-v2) to score them with these settings, or "
                                  "delete those outputs if nothing read them yet")
    return failed


def _no_reward_hint(job: RewardJob, total: RewardResult) -> str:
    """Point at --reward auto when --reward named one env's reward and the rows come from other envs (a weighted
    sum, a reward server or a judge is meant to score any env's rows)."""
    from arlctl.envs.registry import ENVS, builtin_names

    hint = "run `arlctl doctor`; the rows are written with reward_info.error"
    env_reward = job.cfg.reward in builtin_names("env") | set(ENVS)
    envs = sorted(total.envs - {job.cfg.reward}) if env_reward else []
    if envs:
        hint = (f"these rows come from env {', '.join(envs[:4])}, not {job.cfg.reward}: --reward auto scores each "
                f"row with its own env's reward (into a new --out, or after deleting what this wrote to {job.io.out})")
    return hint


def build(cfg: RewardConfig) -> Any:
    """The reward --reward names: auto, a weighted sum, a reward server's URL, or one reward."""
    from arlctl.rewards.composite import build_reward
    from arlctl.settings import parse_env_options

    if cfg.reward == "auto":
        return AutoReward(per_env_options(parse_env_options(cfg.reward_opt, "--reward-opt")))
    return build_reward(cfg.reward, cfg.reward_opt)


def preflight_graders(spec: str, fn: Any) -> None:
    """Sandboxed graders (swe: pytest in its sandbox; code: a bwrap sandbox per grade) must be able to run,
    or every row fails: check it now (alone or in a sum)."""
    from arlctl.rewards.composite import CompositeReward

    parts = [(c.spec, c.reward) for c in fn.components] if isinstance(fn, CompositeReward) else [(spec, fn)]
    for name, reward in parts:
        if name not in ("swe", "code"):
            continue
        from arlctl.doctor import DoctorOptions, preflight, stage_checks

        options = getattr(reward.score, "keywords", {})  # get_reward bound them with functools.partial
        kind = str(options.get("sandbox") or "bwrap")
        preflight(stage_checks(name, kind, grading=True), DoctorOptions(sandbox=kind, image=options.get("image")))


def cached_versions(fn: Any) -> set[str] | None:
    """The reward versions this invocation looks up: the cache keeps only those in memory (None: any,
    for --reward auto, whose per-env rewards are found row by row)."""
    from arlctl.rewards.composite import CompositeReward

    if isinstance(fn, AutoReward):
        return None
    return {c.reward.version for c in fn.components} if isinstance(fn, CompositeReward) else {fn.version}


def open_cache(cfg: RewardConfig, run: str | None, dry_run: bool, fn: Any) -> Any:
    """The invocation's reward cache, read once: --cache, else RUN/reward-cache with --run, else none.
    Many files (one is appended per shard) are merged into one first, unless this is a dry run."""
    from arlctl.io.run import RunLayout
    from arlctl.rewards.cache import RewardCache

    url = None if cfg.no_cache else cfg.cache or (RunLayout(run).reward_cache if run else None)
    if url is None:
        return None
    cache = RewardCache(url, versions=cached_versions(fn), flush_s=None if dry_run else cfg.cache_flush_s)
    if not dry_run:
        cache.compact()
    return cache


def per_env_options(options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """--reward-opt ENV.KEY=VALUE (for --reward auto) -> {env: {key: value}}."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in options.items():
        env, dot, name = key.partition(".")
        if not dot or not env or not name:
            raise UsageError(f"with --reward auto, --reward-opt takes ENV.KEY=VALUE, got {key!r}",
                             hint="e.g. --reward-opt swe.sandbox=docker (options go to that env's reward)")
        out.setdefault(env, {})[name] = value
    from arlctl.envs.registry import get_reward

    for env, env_options in out.items():  # a wrong option is a usage error now, not on the first row
        get_reward(env, **env_options)
    return out


def error_frac(total: RewardResult, max_error_frac: float) -> Exception | None:
    """Exit 1 (after the output is written) when too many rows got no reward, naming the most common cause."""
    errors = len(total.row_errors)
    if not total.rows or errors / total.rows <= max_error_frac:
        return None
    cause, count = max(total.error_causes.items(), key=lambda item: item[1]) if total.error_causes else ("?", errors)
    return TerminalError(f"{errors} of {total.rows} rows got no reward ({errors / total.rows:.0%} > --max-error-frac "
                         f"{max_error_frac:g}); most common cause: {cause} ({count} rows); first: {total.row_errors[0]}",
                         hint="the rows are written with reward_info.error; run `arlctl doctor` for infra: causes")


METRICS_SCHEMA_FIELDS = (("reward_version", "string"), ("rows", "int64"), ("rewarded", "int64"), ("errors", "int64"),
                         ("seconds", "float64"), ("mean_reward", "float64"), ("error_causes", "string"),
                         ("cache_hits", "int64"), ("cache_misses", "int64"), ("truncated", "int64"),
                         ("on_truncated", "string"))


def write_reward_metrics(total: RewardResult, version: str, metrics_dir: str, cached: bool = False) -> str:
    """One row per reward invocation in RUN/metrics (what `status` and `report` read); cache_hits and
    cache_misses are null when the invocation used no cache."""
    import pyarrow as pa

    from arlctl.io.metrics import write_metrics_row
    from arlctl.io.shards import shard_name

    row = {"reward_version": version, "rows": total.rows, "rewarded": total.rewarded,
           "errors": len(total.row_errors), "seconds": float(total.seconds),
           "mean_reward": (total.reward_sum / total.rewarded) if total.rewarded else None,
           "error_causes": json.dumps(total.error_causes, sort_keys=True),
           "cache_hits": total.cache_hits if cached else None, "cache_misses": total.cache_misses if cached else None,
           "truncated": total.truncated, "on_truncated": total.on_truncated}
    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in METRICS_SCHEMA_FIELDS])
    return write_metrics_row(row, metrics_dir, shard_name("reward"), schema)
