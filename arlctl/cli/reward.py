"""`arlctl reward`: score rollouts; 1:1 output shards; inputs already consumed are skipped."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.markup import escape

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.daemon import run_stage
from arlctl.cli.options import (
    DryRunOpt,
    InOpt,
    JsonOpt,
    LockWaitOpt,
    OutOpt,
    PollOpt,
    RunOpt,
    WatchOpt,
    config_command,
)
from arlctl.cli.rollout import parse_env_options
from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.io.layout import metrics_dir_for, resolve_io
from arlctl.render import plain
from arlctl.stages.configs import RewardConfig

MAX_ROW_ERRORS_SHOWN = 10  # rows named on stderr per round; --json carries them all

HELP = """Score trajectories with a reward function: fills reward, reward_components, reward_info and reward_version. Each input shard gives one output shard of the same name; re-running skips what the output directory already holds (lineage), so it is safe after a crash or from cron.

  arlctl reward --run runs/r1 --reward math

  arlctl reward --in runs/r1/rollouts --out runs/r1/rewarded-v2 --reward math --reward-opt format_weight=0.1

  arlctl reward --run runs/r1 --watch --poll 5 --worker 0/2      # a daemon taking half the shards

  arlctl reward --run runs/mix --reward auto --reward-opt swe.sandbox=docker

  arlctl reward --run runs/r1 --reward 'swe + 0.2*judge + 0.1*format' --reward-opt judge.rubric=rubric.yaml

  arlctl reward --run runs/r1 --reward http://grader:8100/swe --concurrency 64      # an `arlctl reward-serve`

  arlctl reward --in runs/r1/rollouts --out runs/r1/rewarded --cache s3://bucket/reward-cache

--reward auto scores each row with the reward registered under the row's own `env` (built in, or a plugin's `arlctl.rewards` entry point of that name); --reward-opt then takes ENV.KEY=VALUE. A row whose env has no reward gets reward = null with reward_info.error "no reward registered for env X", never 0. The rows of a `rollout --history per-turn` trajectory are scored once, on their last row, and all get that reward. A reward that compares the members of a GRPO group (genrm) is called once per group.

A weighted sum ('A + 0.2*B', ' - ' with spaces subtracts) scores each component on its own: reward_components holds each component's value under its name (and its own components as NAME.PART), the reward is the weighted sum, reward_version composite(...) names every part; --reward-opt takes COMPONENT.KEY=VALUE. A component without a reward leaves the row's reward null with the component named, never counted as 0.

The reward cache: a row already scored under the same reward_version (options, rubric hash and judge model included) is not scored again. It is on by default with --run (RUN/reward-cache), off without --run unless --cache URL is given; --no-cache turns it off. Composite rewards are cached per component, so a changed weight re-runs no judge. Rows that got no reward are never cached (they are retried next time). Hits and misses are counted in the summary.

A row whose task is not a JSON object, or that the reward function fails on, gets reward = null and reward_info {"error": cause}, named on stderr; its shard is still written. An unreadable input shard is reported (exit 1) after the others are rewarded; --quarantine moves it to _quarantine/ instead. When no row got a reward, or more than --max-error-frac of the rows got none, the command exits 1 naming the most common cause, after writing its output. A reward server that cannot be reached, does not answer within $ARLCTL_REWARD_TIMEOUT_S seconds (default 900, one deadline per request over connect, headers and body) or answers anything but a JSON object exits 75 (retry later) naming the server, with its shard still pending; answers are read up to $ARLCTL_MAX_REWARD_ANSWER_BYTES (256 MiB), and only JSON numbers are rewards. SIGTERM stops at the next row: a shard stopped half-way is not written. One metrics row per invocation goes to RUN/metrics/reward-*.parquet: rows, rewarded, errors, seconds, error_causes (JSON {cause: rows}; "infra:" causes are the grader's, not the policy's), cache_hits and cache_misses.
"""


def register(app: typer.Typer) -> None:
    @app.command("reward", help=HELP)
    @handle_errors
    @config_command(RewardConfig)
    def reward_cmd(
        cfg: RewardConfig,
        run: RunOpt = None,
        in_: InOpt = None,
        out: OutOpt = None,
        dry_run: DryRunOpt = False,
        worker: Annotated[str | None, typer.Option(
            "--worker", help="I/N: take only worker I's share of the inputs (0-based).")] = None,
        watch: WatchOpt = False,
        poll: PollOpt = 5.0,
        lock_wait: LockWaitOpt = 0.0,
        as_json: JsonOpt = False,
    ) -> None:
        from arlctl.io.partition import parse_worker
        from arlctl.stages import reward as stage
        from arlctl.stages.reward import RewardIO, RewardResult

        cfg.check()
        in_, out = resolve_io("reward", run, in_, out, watch=watch)
        shard = parse_worker(worker)
        fn = build(cfg)
        if not dry_run:
            preflight_graders(cfg.reward, fn)
        cache = open_cache(cfg, run, dry_run, fn)
        io = RewardIO(in_url=in_, out=out, worker=shard, dry_run=dry_run)
        total = RewardResult()

        def once(stop) -> dict:
            done = stage.run(cfg, io, stop, reward=fn, cache=cache)
            total.merge(done)
            for line in done.row_errors[:MAX_ROW_ERRORS_SHOWN]:
                console.print(f"[yellow]no reward[/] {escape(line)}", soft_wrap=True)
            if len(done.row_errors) > MAX_ROW_ERRORS_SHOWN:
                console.print(f"[yellow]no reward[/] ... and {len(done.row_errors) - MAX_ROW_ERRORS_SHOWN} more rows "
                              "(each has reward_info.error)")
            return done.to_json()

        started = time.monotonic()
        run_stage(once, out=out, lock_name="reward" if shard[1] == 1 else f"reward-worker{shard[0]}of{shard[1]}",
                  watch=watch, poll=poll, lock_wait=lock_wait, dry_run=dry_run,
                  units=lambda summary: len(summary["written"]))
        total.seconds = time.monotonic() - started
        summary = total.to_json()
        summary["reward_version"] = fn.version
        summary["cache"] = None if cache is None else cache.url
        summary["cache_warnings"] = [] if cache is None else cache.warnings
        if not dry_run and total.rows:
            summary["metrics"] = write_reward_metrics(total, fn.version, metrics_dir_for(out, run), cache is not None)
        if as_json:
            print_json(summary)
        console.print(plain(total.summary_line(fn.version, out, dry_run, cache=cache is not None)), soft_wrap=True)
        for line in total.corrupt:
            console.print(f"[yellow]quarantined[/] {escape(line)}", soft_wrap=True)
        if total.interrupted:  # a shard stopped half-way by SIGTERM: reported above, left pending
            raise TransientError(total.interrupted, hint="re-run to reward it")
        if total.rows and not total.rewarded:  # every row failed: a broken grader, not a 0 for the policy
            raise TerminalError(f"no row got a reward: all {total.rows} failed; first: {total.row_errors[0]}",
                                hint="run `arlctl doctor`; the rows are written with reward_info.error")
        check_error_frac(total, cfg.max_error_frac)


def build(cfg: RewardConfig) -> Any:
    """The reward --reward names: auto, a weighted sum, a reward server's URL, or one reward."""
    from arlctl.rewards.composite import build_reward
    from arlctl.stages.reward import AutoReward

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
    from arlctl.stages.reward import AutoReward

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
    for line in cache.warnings:
        console.print(f"[yellow]warning[/] {escape(line)}", soft_wrap=True)
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


def check_error_frac(total: Any, max_error_frac: float) -> None:
    """Exit 1 (after the output is written) when too many rows got no reward; name the most common cause."""
    errors = len(total.row_errors)
    if not total.rows or errors / total.rows <= max_error_frac:
        return
    cause, count = max(total.error_causes.items(), key=lambda item: item[1]) if total.error_causes else ("?", errors)
    raise TerminalError(f"{errors} of {total.rows} rows got no reward ({errors / total.rows:.0%} > --max-error-frac "
                        f"{max_error_frac:g}); most common cause: {cause} ({count} rows); first: {total.row_errors[0]}",
                        hint="the rows are written with reward_info.error; run `arlctl doctor` for infra: causes")


def write_reward_metrics(total: Any, version: str, metrics_dir: str, cached: bool = False) -> str:
    """One row per reward invocation in RUN/metrics (what `status` and `report` read); cache_hits and
    cache_misses are null when the invocation used no cache."""
    import pyarrow as pa

    from arlctl.io.fs import join
    from arlctl.io.shards import shard_name, write_table_atomic

    row = {"reward_version": version, "rows": total.rows, "rewarded": total.rewarded,
           "errors": len(total.row_errors), "seconds": float(total.seconds),
           "mean_reward": (total.reward_sum / total.rewarded) if total.rewarded else None,
           "error_causes": json.dumps(total.error_causes, sort_keys=True),
           "cache_hits": total.cache_hits if cached else None, "cache_misses": total.cache_misses if cached else None}
    schema = pa.schema([("reward_version", pa.string()), ("rows", pa.int64()), ("rewarded", pa.int64()),
                        ("errors", pa.int64()), ("seconds", pa.float64()), ("mean_reward", pa.float64()),
                        ("error_causes", pa.string()), ("cache_hits", pa.int64()), ("cache_misses", pa.int64())])
    return write_table_atomic(pa.Table.from_pylist([row], schema=schema), join(metrics_dir, shard_name("reward")))
