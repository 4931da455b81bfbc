"""One `arlctl rollout` invocation as a Python API: tasks in, trajectory shards and a typed result out.

`RolloutJob` is everything an invocation needs beyond the loop's `RolloutConfig` (tasks, envs, output,
flushing, daemon policy); `run_rollout(job, policy, stop, stats)` drives stages/rollout.py, writes shards
and the RUN/metrics row, and returns a `RolloutResult` (`to_json()`, `summary_line()`, `failure()`).
A re-run with the same settings (tasks, policy and its version, loop config: one config hash) resumes: the
(task, epoch, sample) units the output's committed shards of that hash hold are skipped, and counted.
The CLI (arlctl/cli/rollout.py) only parses options into a job, turns signals into `stop`, shows progress
from `stats` and prints the result.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Policy, as_policy
from arlctl.io.fs import basename, join
from arlctl.io.ledger import WrittenSamples, written_samples
from arlctl.io.run import metrics_dir_for
from arlctl.io.shards import Lineage, config_hash
from arlctl.io.sink import FLUSH_GROUPS, FLUSH_SECONDS, SHARD_PREFIX, GroupShardWriter
from arlctl.render import one_line
from arlctl.schemas.safe_text import parquet_safe
from arlctl.stages.agent_loop import RolloutConfig, Stats
from arlctl.stages.jobs import MAX_ERROR_FRAC, RolloutOptions
from arlctl.stages.policy_job import PolicyChoice
from arlctl.stages.rollout import Resume, rollout
from arlctl.stages.rollout_daemon import Backpressure, PolicyFollower

USABLE_STATUSES = ("ok", "truncated")  # statuses whose rows can be graded and trained on
GC_FULL_RARER = 10  # while a rollout runs, a full garbage collection waits for 10x the young collections


class LoopProbe:
    """Watches the rollout process while it runs, in fixed memory: how late a `tick_s` timer fires (event-loop
    lag: anything that blocks the loop shows here), resident memory at its peak, and CPU time.

    Lags go into a histogram of 1 ms bins, so a daemon that runs for days keeps a few hundred counters.
    RSS is read from /proc/self/statm every `rss_every` ticks; per in-flight trajectory it is the growth over
    the RSS at start divided by the most trajectories in flight (Stats.peak_in_flight).
    """

    def __init__(self, stats: Stats, tick_s: float = 0.01, rss_every: int = 25):
        self.stats, self.tick_s, self.rss_every = stats, tick_s, rss_every
        self.lag_ms: dict[int, int] = {}  # lag rounded up to whole ms -> ticks
        self.lag_max_s = 0.0
        self.rss_start = self.rss_peak = _rss_bytes()
        self.cpu_start = time.process_time()
        self.gc_pause_max_s = self.gc_pause_total_s = 0.0
        self._gc_started = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())
        gc.callbacks.append(self._on_gc)

    async def stop(self) -> dict[str, float]:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.rss_peak = max(self.rss_peak, _rss_bytes())
        return self.summary()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """Time every garbage collection: a full one walks every live object, so it grows with the heap."""
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_started
        self.gc_pause_total_s += pause
        self.gc_pause_max_s = max(self.gc_pause_max_s, pause)

    async def _watch(self) -> None:
        ticks = 0
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            lag = max(0.0, time.perf_counter() - before - self.tick_s)
            self.lag_max_s = max(self.lag_max_s, lag)
            bucket = math.ceil(lag * 1000)
            self.lag_ms[bucket] = self.lag_ms.get(bucket, 0) + 1
            ticks += 1
            if ticks % self.rss_every == 0:
                self.rss_peak = max(self.rss_peak, _rss_bytes())

    def lag_quantile_ms(self, q: float) -> float:
        total = sum(self.lag_ms.values())
        if not total:
            return 0.0
        seen = 0
        for bucket in sorted(self.lag_ms):
            seen += self.lag_ms[bucket]
            if seen >= q * total:
                return min(float(bucket), round(1000 * self.lag_max_s, 2))  # a bin's top may pass the max
        return round(1000 * self.lag_max_s, 2)

    def summary(self) -> dict[str, float]:
        peak_in_flight = self.stats.peak_in_flight
        turns = max(self.stats.env_calls, 1)
        cpu_s = time.process_time() - self.cpu_start
        return {
            "loop_lag_p50_ms": self.lag_quantile_ms(0.50), "loop_lag_p99_ms": self.lag_quantile_ms(0.99),
            "loop_lag_max_ms": round(1000 * self.lag_max_s, 2), "peak_in_flight": peak_in_flight,
            "peak_rss_mb": round(self.rss_peak / 2**20, 1), "start_rss_mb": round(self.rss_start / 2**20, 1),
            "rss_per_trajectory_kb": round((self.rss_peak - self.rss_start) / 1024 / max(peak_in_flight, 1), 2),
            "cpu_s": round(cpu_s, 3), "cpu_per_turn_ms": round(1000 * cpu_s / turns, 4),
            "gc_pause_max_ms": round(1000 * self.gc_pause_max_s, 2), "gc_pause_total_s": round(self.gc_pause_total_s, 3),
        }


def _rss_bytes() -> int:
    """Resident set size now (Linux /proc); elsewhere the peak so far, which is what is reported anyway."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


HISTORIES = ("full", "per-turn")


def check_loop_options(history: str, tool_parser: str | None, max_error_frac: float) -> None:
    from arlctl.tools import PARSERS

    if history not in HISTORIES:
        raise UsageError(f"--history must be one of {', '.join(HISTORIES)}, got {history!r}")
    if tool_parser is not None and tool_parser not in PARSERS:
        raise UsageError(f"unknown --tool-parser {tool_parser!r}", hint=f"choose one of: {', '.join(PARSERS)}")
    if not 0.0 <= max_error_frac <= 1.0:  # NaN fails this too
        raise UsageError(f"--max-error-frac must be in [0, 1], got {max_error_frac}")


def parse_template_kwargs(pairs: list[str]) -> dict[str, Any]:
    """--chat-template-kwargs KEY=VALUE: VALUE as JSON when it parses (false, 3, "x", [1]), else text."""
    import json

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--chat-template-kwargs expects KEY=VALUE, got {pair!r}")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = {"true": True, "false": False}.get(value.lower(), value)
    return options


def check_sampling_options(temperature: float, top_p: float, max_new_tokens: int, seed: int | None) -> None:
    """The sampling options through the same check every backend applies (UsageError: exit 2).

    typer parses `--temperature nan` as a float; without this a NaN reached every log-prob of the run.
    """
    from arlctl.inference.sampling_check import (
        MAX_NEW_TOKENS,
        check_int,
        check_seed,
        check_temperature,
        check_top_p,
    )

    check_temperature(temperature, "--temperature")
    check_top_p(top_p, "--top-p")
    check_int("--max-new-tokens", max_new_tokens, 1, MAX_NEW_TOKENS)
    check_seed(seed, "--seed")


def load_task_list(env: str | None, tasks: list[str], env_mix: str | None, limit: int | None,
                   seed: int | None) -> tuple[list[dict[str, Any]], str]:
    """The tasks to roll out and the default env name.

    --env-mix: groups sampled across envs at the given ratios (arlctl.envs.mix). Otherwise one task
    source; with --env every task must be for it, without --env each task runs the env its own "env"
    field names (math when it has none).
    """
    from arlctl.envs.tasks import load_tasks

    if env_mix is not None:
        from arlctl.envs.mix import mix_sources, mixed_tasks, parse_env_mix

        if env is not None:
            raise UsageError("--env-mix and --env exclude each other", hint="name every env in --env-mix")
        mix = parse_env_mix(env_mix)
        sources = mix_sources(mix, list(tasks))
        n_groups = limit if limit is not None else sum(len(v) for v in sources.values())
        return list(mixed_tasks(sources, mix, seed, n_groups)), mix[0][0]
    if len(tasks) > 1:
        raise UsageError("--tasks is given more than once", hint="several task sources need --env-mix")
    spec = tasks[0] if tasks else f"builtin:{env or 'math'}"
    if env is not None:
        task_list = load_tasks(spec, env=env)
    else:
        task_list = load_tasks(spec, env=None, default_env="math")
    return (task_list[:limit] if limit is not None else task_list), env or "math"


class EnvPicker:
    """Env name -> factory, for runs where each group runs the env its task names.

    Every name is resolved (plugins loaded) and its options checked once, before any work. Options
    (--env-opt, --sandbox, ...) go to each env whose factory accepts them; one that no env accepts is a
    usage error.
    """

    def __init__(self, options: dict[str, Any]):
        self.options = options
        self.factories: dict[str, Any] = {}

    def check(self, task_list: list[dict[str, Any]], default: str) -> list[str]:
        from arlctl.envs import registry

        names = sorted({str(t.get("env") or default) for t in task_list} or {default})
        taken: set[str] = set()
        for name in names:
            accepted = self._accepted(name)  # resolves the name: an unknown env is a usage error now
            taken |= set(accepted)
            # one factory per env for the whole run: its envs share what it owns (swe: the warm sandbox pool);
            # an env that fails to build per trajectory is an env_error row, not a crash
            self.factories[name] = registry.env_factory(name, **accepted)
        unused = sorted(set(self.options) - taken)
        if unused:
            raise UsageError(f"option {unused[0]!r} is not accepted by env(s) {', '.join(names)}")
        return names

    def _accepted(self, name: str) -> dict[str, Any]:
        import inspect

        from arlctl.envs.registry import resolve_env

        factory = resolve_env(name)
        try:
            params = inspect.signature(factory).parameters.values()
        except (TypeError, ValueError):
            return dict(self.options)
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return dict(self.options)
        names = {p.name for p in params}
        return {k: v for k, v in self.options.items() if k in names}

    async def aclose(self) -> None:
        """Release what each env factory shares across its trajectories (the swe sandbox pool)."""
        for factory in self.factories.values():
            await factory.aclose()

    def __call__(self, name: str) -> Any:
        if name not in self.factories:
            raise UsageError(f"env {name!r} was not among the envs checked before the run")
        return self.factories[name]


@dataclass
class DaemonOptions:
    """--watch: epochs until stopped, reloads from `follow`, backpressure read from the run `run`."""

    epochs: int | None
    poll: float
    max_pending: int | None
    max_staleness: int | None
    run: str | None
    follow: str | None


def daemon_options(watch: bool, max_epochs: int | None, poll: float, max_pending: int | None,
                    max_staleness: int | None, group_size: int, policy: PolicyChoice, run: str | None,
                    out: str) -> DaemonOptions | None:
    """Check the --watch options; resolve the run directory (backpressure) and the policy dir to follow."""
    if not watch:
        if any(v is not None for v in (max_epochs, max_pending, max_staleness)):
            raise UsageError("--max-epochs, --max-pending and --max-staleness need --watch")
        return None
    if max_epochs is not None and max_epochs < 1:
        raise UsageError("--max-epochs must be at least 1")
    if poll <= 0:
        raise UsageError("--poll must be positive")
    if max_pending is not None and max_pending < group_size:
        raise UsageError(f"--max-pending {max_pending} is below the group size {group_size}: no group could start")
    if max_staleness is not None and max_staleness < 0:
        raise UsageError("--max-staleness must be >= 0")
    run_root = run or (out.rstrip("/").rsplit("/", 1)[0] if basename(out) == "rollouts" and "/" in out else None)
    if run_root is None and (max_pending is not None or max_staleness is not None):
        raise UsageError("--max-pending and --max-staleness read the run directory",
                         hint="pass --run RUN (or --out RUN/rollouts)")
    resolved = policy.resolved
    follow = str(resolved.policy_dir) if resolved is not None and resolved.policy_dir is not None else None
    if follow is None and run_root is not None and not policy.scripted:
        follow = join(run_root, "policy")  # start from a model, pick up what sync publishes
    return DaemonOptions(epochs=max_epochs, poll=poll, max_pending=max_pending, max_staleness=max_staleness,
                         run=run_root, follow=follow)


@dataclass
class RolloutJob:
    """One invocation: the loop config, the tasks and envs it runs, where rows go and how they flush."""

    cfg: RolloutConfig
    tasks: list[dict[str, Any]]
    envs: EnvPicker
    out: str
    run: str | None = None
    backend: str = "hf"
    sources: list[str] = field(default_factory=list)  # the task specs, for the shards' lineage
    policy_spec: str = ""
    flush_groups: int = FLUSH_GROUPS
    flush_seconds: float = FLUSH_SECONDS
    prefix: str = SHARD_PREFIX
    daemon: DaemonOptions | None = None
    policy: PolicyChoice | None = None  # what `arlctl rollout` loads (None on a dry run: nothing is resolved)
    max_error_frac: float = MAX_ERROR_FRAC  # above this share of failed trajectories the run fails (RolloutResult.failure)
    lock_name: str = "rollout"  # the run lock on `out`: one per worker share


@dataclass
class RolloutResult:
    """What one invocation did; `to_json()` is the --json summary, `summary_line()` the human one."""

    groups: int
    trajectories: int  # trajectories in the rows written (per-turn rows: one per trajectory)
    status: dict[str, int]  # rows written per status
    shards_written: int
    shards: list[str]
    rows_written: int  # rows in the shards this invocation committed
    generated_tokens: int
    generated_tokens_per_s: float
    mean_env_latency_s: float
    env_calls: int
    errors: int
    top_ups: int
    error_causes: dict[str, int]
    outcomes: dict[str, int]  # trajectories per final status
    error_fraction: float
    history: str
    template_rewrites_history: bool
    seconds: float
    interrupted: bool
    backend_metrics: dict[str, Any]
    epochs: int
    policy_version: int
    last_error: str | None
    out: str = ""
    metrics: str | None = None
    daemon: dict[str, Any] | None = None  # --watch: reloads and backpressure waits
    # The process while it ran (LoopProbe): event-loop lag, memory per in-flight trajectory, CPU per turn.
    loop_lag_p50_ms: float = 0.0
    loop_lag_p99_ms: float = 0.0
    loop_lag_max_ms: float = 0.0
    peak_in_flight: int = 0
    peak_rss_mb: float = 0.0
    start_rss_mb: float = 0.0
    rss_per_trajectory_kb: float = 0.0
    cpu_s: float = 0.0
    cpu_per_turn_ms: float = 0.0
    gc_pause_max_ms: float = 0.0
    gc_pause_total_s: float = 0.0
    # Resume: the units earlier invocations of this configuration committed, not rolled out again.
    config_hash: str = ""
    samples_skipped: int = 0
    groups_skipped: int = 0  # groups every sample of which was already written
    resumed_shards: int = 0  # committed shards of this configuration found in the output
    truncated: int = 0  # rows written with status truncated

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(data.pop("daemon") or {})
        return data

    def summary_line(self) -> str:
        skipped = (f"; {self.samples_skipped} samples already written in {self.resumed_shards} shards, skipped"
                   if self.samples_skipped else "")
        return (f"{self.rows_written} rows ({self.trajectories} trajectories, {self.truncated} truncated) in "
                f"{self.groups} groups -> {self.shards_written} shards in {self.out}{skipped}  "
                f"({self.generated_tokens_per_s:.1f} gen tok/s, mean env latency "
                f"{self.mean_env_latency_s * 1e3:.1f} ms, {self.errors} errors"
                f"{', interrupted' if self.interrupted else ''})")

    def failure(self, tasks: int, max_error_frac: float) -> tuple[str, str] | None:
        """(cause, hint) when the run must exit non-zero, else None ("nothing fails silently", DESIGN.md §6).

        A run that wrote nothing from non-empty input, whose every trajectory failed (policy_error,
        env_error, timeout), or whose share of env_error/policy_error trajectories exceeds
        `max_error_frac`. An interrupted run is not judged: the user stopped it.
        """
        if self.interrupted or tasks == 0 or (self.rows_written == 0 and self.samples_skipped and not self.groups):
            return None  # stopped by the user, nothing asked, or every unit written by an earlier invocation
        cause = self.last_error or "no error was recorded"
        if self.rows_written == 0:
            return (f"rollout wrote no rows from {tasks} tasks: {cause}",
                    "re-run with --debug; check the policy backend and the environment")
        if sum(self.status.get(s, 0) for s in USABLE_STATUSES) == 0:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(self.status.items()) if v)
            return (f"every trajectory failed ({counts}); last error: {cause}",
                    f"the rows are kept in {self.out} for `arlctl show`")
        if self.error_fraction > max_error_frac:
            failed = self.outcomes.get("env_error", 0) + self.outcomes.get("policy_error", 0)
            top = max(self.error_causes.items(), key=lambda kv: kv[1]) if self.error_causes else None
            return (f"{failed} of {sum(self.outcomes.values())} trajectories failed ({self.error_fraction:.0%} > "
                    f"--max-error-frac {max_error_frac:g})" + (f"; most common cause {top[0]} ({top[1]})" if top else "")
                    + f"; last error: {self.last_error or 'none recorded'}",
                    "the rows are kept for `arlctl show`; `arlctl status RUN` lists the causes")
        return None


def plan_rollout(cfg: RolloutConfig, opts: RolloutOptions) -> RolloutJob:
    """`arlctl rollout`'s options checked and assembled into a job, every usage error before anything is made:
    the sampling and loop options, the tasks (this worker's share), their envs and env options, the doctor's
    checks (not on a dry run), the policy (resolved once: stages/policy_job.py), then the IO and --watch."""
    from arlctl.io.partition import owns, parse_worker
    from arlctl.io.run import resolve_io
    from arlctl.settings import parse_env_options
    from arlctl.stages import policy_job

    check_sampling_options(cfg.temperature, cfg.top_p, cfg.max_new_tokens, cfg.seed)
    check_loop_options(cfg.history, cfg.tool_format, opts.max_error_frac)
    template_kwargs = parse_template_kwargs(opts.chat_template_kwargs)
    if opts.max_top_up < 0:
        raise UsageError(f"--max-top-up must be >= 0, got {opts.max_top_up}")
    task_list, env = load_task_list(opts.env, opts.tasks, opts.env_mix, opts.limit, cfg.seed)
    share = parse_worker(opts.worker)
    task_list = [t for t in task_list if owns(str(t.get("task_id", "")), *share)]
    options = parse_env_options(opts.env_opt)
    for key, value in (("sandbox", opts.sandbox), ("sandboxes", opts.sandboxes),
                       ("insecure_sandbox", opts.insecure_sandbox or None), ("docker_hosts", opts.docker_host or None)):
        if value is not None:
            options[key] = value
    picker = EnvPicker(options)
    env_names = picker.check(task_list, env)  # unknown envs or options: a usage error before any work
    # The command's own options that complete the loop settings (--env from the tasks, --top-up gating).
    cfg = replace(cfg, env=env, max_top_up=opts.max_top_up if opts.top_up else 0, template_kwargs=template_kwargs)
    if opts.harness_opt and not opts.harness:
        raise UsageError("--harness-opt needs --harness", hint="e.g. --harness mini-swe-agent --harness-opt step_limit=8")
    if opts.harness:
        from arlctl.harnesses import make_harness

        harness_options = parse_env_options(opts.harness_opt, "--harness-opt")
        make_harness(opts.harness, harness_options)  # an unknown harness or option: exit 2 before anything runs
        if cfg.history != "full":
            raise UsageError("--harness records whole sessions: --history per-turn does not apply to it")
        cfg = replace(cfg, harness=opts.harness, harness_options=harness_options)
    job = RolloutJob(cfg=cfg, tasks=task_list, envs=picker, out="", run=opts.run, backend=opts.backend,
                     sources=list(opts.tasks) or [f"builtin:{env}"], policy_spec=opts.policy,
                     flush_groups=opts.flush_groups, flush_seconds=opts.flush_seconds, prefix=opts.prefix,
                     max_error_frac=opts.max_error_frac,
                     lock_name="rollout" if share[1] == 1 else f"rollout-worker{share[0]}of{share[1]}")
    if not opts.dry_run:
        _preflight(env_names, options.get("sandbox"), opts.backend)
    job.policy = policy_job.choose(opts, progress=not opts.quiet)  # a wrong policy: exit 2, before the output
    if opts.dry_run:
        return job  # shows the first prompt: no preflight, no policy load, no output
    _, job.out = resolve_io("rollout", opts.run, None, opts.out, watch=opts.watch)
    job.daemon = daemon_options(opts.watch, opts.max_epochs, opts.poll, opts.max_pending, opts.max_staleness,
                                cfg.group_size, job.policy, opts.run, job.out)
    return job


def verdict(job: RolloutJob, result: RolloutResult, pol: Any) -> Exception | None:
    """The error that decides the exit of a finished run (None: exit 0): a failed run is terminal (1), unless
    every inference server is down (transient, 75: start the engines and re-run)."""
    failed = result.failure(len(job.tasks), job.max_error_frac)
    if failed is None:
        return None
    dead = dead_fleet(pol)
    if dead:
        return TransientError(f"{failed[0]}; no inference server can serve: {dead}",
                              hint="start the engines (or `arlctl fleet add RUN URL`), then re-run")
    return TerminalError(failed[0], hint=failed[1])


def dead_fleet(pol: Any) -> str | None:
    """The engines of an openai-backend fleet with no engine able to serve (none active or draining: all
    ejected, joining or retired), each with its state and last error; None for any other policy or fleet."""
    from arlctl.inference.fleet import Fleet

    fleet = getattr(pol, "fleet", None)
    if not isinstance(fleet, Fleet) or any(e.state in ("active", "draining") for e in fleet.engines):
        return None
    shown = [f"{e.url} ({e.state}" + (f": {e.last_error[:160]}" if e.last_error else "") + ")"
             for e in fleet.engines[:8]]
    more = len(fleet.engines) - len(shown)
    return one_line(", ".join(shown) + (f" and {more} more" if more > 0 else ""))


def _preflight(env_names: list[str], sandbox: str | None, backend: str) -> None:
    """The doctor's checks each env and the backend need: one usage error with its fix, before any work."""
    from arlctl.doctor import DoctorOptions, preflight, stage_checks

    for name in env_names:
        checks = stage_checks(name, sandbox, backend)
        if checks:
            preflight(checks, DoctorOptions(sandbox=sandbox or "bwrap", backend=backend))


async def run_rollout(job: RolloutJob, pol: Policy, stop: asyncio.Event, stats: Stats | None = None,
                      log: Callable[[str], None] = print) -> RolloutResult:
    """Run the job to the end (or until `stop`), flush every group, write the metrics row, close the policy.

    stats: counters the caller may watch while it runs (a progress display); fresh when None.
    log: one-line notices (policy reloads, backpressure waits).
    """
    cfg, stats, pol = job.cfg, stats or Stats(), as_policy(pol)
    # The policy's version is part of the configuration: a re-run after a newer version was published
    # rolls out afresh instead of completing the older version's groups.
    spec = {"tasks": job.sources, "policy": job.policy_spec, "policy_version": pol.version, **cfg.as_dict()}
    spec_hash = config_hash(spec)
    earlier = await asyncio.to_thread(written_samples, job.out, spec_hash)
    _log_resume(earlier, job.out, log)
    resume = Resume(key=spec_hash, written=earlier.samples)
    writer = GroupShardWriter(
        job.out, lambda: Lineage(stage="rollout", inputs=[], config_hash=spec_hash,
                                 extra={"tasks": ",".join(job.sources), "policy": pol.name,
                                        "policy_version": pol.version}),
        flush_groups=job.flush_groups, flush_seconds=job.flush_seconds, prefix=job.prefix)
    status: dict[str, int] = {"ok": 0}
    trajectories = [0]

    async def sink(rows) -> None:
        await writer.add_group(rows)  # a group the schema refuses raises here and is not counted
        for r in rows:
            status[r.status] = status.get(r.status, 0) + 1
        trajectories[0] += len({r.trajectory_id for r in rows})

    follower, gate = _daemon_hooks(job, pol, stats, writer, log)
    started = time.monotonic()
    probe = LoopProbe(stats)
    probe.start()
    # Everything alive now (the model, the tokenizer, every imported module: ~300k objects with transformers)
    # leaves the collector's view while the rollout runs; a full collection then walks only the rollout's
    # own objects instead of stalling the loop for the whole heap. A full collection still walks every
    # in-flight trajectory (tens of ms at thousands), so it is also made 10x rarer; the young generations,
    # where the loop's short-lived cycles die, are collected as usual. Both undone at the end.
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], thresholds[2] * GC_FULL_RARER)
    try:
        await rollout(job.tasks, pol, None, cfg, sink, stats=stats, stop=stop,
                      turn_hook=follower.maybe_reload if follower else None,
                      epochs=job.daemon.epochs if job.daemon else 1, before_group=gate.wait if gate else None,
                      env_for=job.envs, resume=resume)
        await writer.flush()
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        health = await probe.stop()
        backend_metrics = pol.metrics()
        await pol.close()
        await job.envs.aclose()
    elapsed = time.monotonic() - started
    last_error = stats.last_error or (follower.last_error if follower else None)
    result = RolloutResult(
        groups=stats.groups_done, trajectories=trajectories[0], status=status,
        shards_written=len(writer.written), shards=writer.written, rows_written=writer.rows_written,
        generated_tokens=stats.generated_tokens, generated_tokens_per_s=stats.generated_tokens / max(elapsed, 1e-9),
        mean_env_latency_s=stats.mean_env_latency_s(), env_calls=stats.env_calls, errors=stats.errors,
        top_ups=stats.top_ups, error_causes=dict(stats.causes), outcomes=dict(stats.outcomes),
        error_fraction=stats.error_fraction(), history=cfg.history,
        template_rewrites_history=stats.template_rewrites_history, seconds=elapsed, interrupted=stop.is_set(),
        backend_metrics=backend_metrics, epochs=stats.epochs_done, policy_version=pol.version,
        last_error=None if last_error is None else parquet_safe(last_error), out=job.out,
        daemon=_daemon_summary(follower, gate) if job.daemon is not None else None, **health,
        config_hash=spec_hash, samples_skipped=resume.samples_skipped, groups_skipped=resume.groups_skipped,
        resumed_shards=earlier.shards, truncated=status.get("truncated", 0))
    # One small Parquet write, still off the loop: a daemon's other tasks keep running meanwhile.
    result.metrics = await asyncio.to_thread(write_rollout_metrics, result.to_json(),
                                             metrics_dir_for(job.out, job.run), job.backend)
    return result


def _log_resume(earlier: WrittenSamples, out: str, log: Callable[[str], None]) -> None:
    """One line each: what is resumed, and committed rollouts of other settings that are not."""
    if earlier.shards:
        log(f"resume: {earlier.count} samples already written in {earlier.shards} shards of {out} "
            "with these settings: rolling out only the rest")
    if earlier.other_configs:
        shards = sum(earlier.other_configs.values())
        log(f"resume: {shards} rollout shards in {out} were written with other settings (config hash "
            f"{', '.join(sorted(earlier.other_configs)[:3])}): not resumed from, their tasks are rolled out again")
    for line in earlier.unreadable[:3]:
        log(one_line(f"resume: unreadable shard {line}: its samples count as not written"))


def _daemon_hooks(job: RolloutJob, pol: Policy, stats: Stats, writer: GroupShardWriter,
                  log: Callable[[str], None]) -> tuple[PolicyFollower | None, Backpressure | None]:
    """--watch: the policy follower (reloads at turn boundaries) and the backpressure gate, if asked for."""
    daemon = job.daemon
    if daemon is None:
        return None, None
    follower = None
    if daemon.follow:
        follower = PolicyFollower(pol, daemon.follow, daemon.poll, on_reload=lambda old, new: log(
            f"policy reloaded: v{old} -> v{new} (at a turn boundary)"))
    gate = None
    if daemon.max_pending is not None or daemon.max_staleness is not None:
        group_size = job.cfg.group_size
        gate = Backpressure(
            daemon.run, group_size, pol,
            # per-turn rows outnumber trajectories: never let the estimate go negative
            in_flight=lambda: max(0, stats.groups_started * group_size - writer.rows_written),
            max_pending=daemon.max_pending, max_staleness=daemon.max_staleness, poll_s=daemon.poll,
            follower=follower, flush=writer.flush, log=log, committed=lambda: writer.rows_written)
    return follower, gate


def _daemon_summary(follower: PolicyFollower | None, gate: Backpressure | None) -> dict[str, Any]:
    summary: dict[str, Any] = {"reloads": follower.reloads if follower else 0}
    if gate is not None:
        summary.update({
            "backpressure_wait_s": sum(gate.waited_s.values()), "backlog_wait_s": gate.waited_s["backlog"],
            "staleness_wait_s": gate.waited_s["staleness"], "backlog_waits": gate.waits["backlog"],
            "staleness_waits": gate.waits["staleness"], "max_backlog": gate.max_backlog,
            "max_staleness_at_start": gate.max_staleness_started,
        })
    return summary


def write_rollout_metrics(summary: dict[str, Any], metrics_dir: str, backend: str) -> str:
    """One row per rollout invocation in RUN/metrics: loop counters plus the backend's own counters."""
    from arlctl.io.metrics import write_metrics_row
    from arlctl.io.shards import shard_name

    row: dict[str, Any] = {"backend": backend}
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[key] = float(value)
    row["last_error"] = summary.get("last_error")  # already Parquet-safe (see run_rollout)
    row["error_causes"] = json.dumps(summary.get("error_causes") or {}, sort_keys=True)  # {cause: count}
    for key, value in (summary.get("backend_metrics") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[f"backend_{key}"] = float(value)
    return write_metrics_row(row, metrics_dir, shard_name("rollout"))
