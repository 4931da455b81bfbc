"""`arlctl rollout`: run a policy on tasks in an environment; write trajectory shards as groups finish."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arlctl.cli.common import console, handle_errors, plain, print_json, terminal_safe
from arlctl.cli.daemon import LOCK_WAIT_HELP
from arlctl.errors import TerminalError, UsageError
from arlctl.io.fs import basename, join
from arlctl.io.layout import metrics_dir_for, resolve_io
from arlctl.io.shards import Lineage, config_hash
from arlctl.io.sink import GroupShardWriter

HELP = """Run the policy on tasks: G samples per task (a GRPO group), many trajectories in flight,
multi-turn with tools. Shards are written as groups finish (a group is never split across shards).

  arlctl rollout --env math --tasks "builtin:math?n=64&seed=0" --policy default --run runs/r1 -G 4

  arlctl rollout --env math --tasks tasks.jsonl --policy runs/r1/policy --out runs/r1/rollouts --json

  arlctl rollout --env math --tasks builtin:math --policy tiny --dry-run    # show the first prompt

  arlctl rollout --watch --run runs/r1 --policy runs/r1/policy --max-pending 256 --max-staleness 2

Ctrl-C (or SIGTERM) stops new work, ends in-flight trajectories as `aborted` and flushes everything.

With --watch it runs as a daemon: epoch after epoch over the tasks (--max-epochs N to stop), reloading
the policy at turn boundaries when RUN/policy/LATEST names a newer version (checked every --poll s),
and holding back new groups while the untrained backlog would exceed --max-pending rows or the trainer
is more than --max-staleness versions ahead (README "Running as daemons").
"""


USABLE_STATUSES = ("ok", "truncated")  # statuses whose rows can be graded and trained on


def parse_env_options(pairs: list[str], flag: str = "--env-opt") -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"{flag} expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        options[key.replace("-", "_")] = _coerce(value)
    return options


def _coerce(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)


def register(app: typer.Typer) -> None:
    @app.command("rollout", help=HELP)
    @handle_errors
    def rollout_cmd(
        env: str = typer.Option(None, "--env", help="Environment: math, swe, a plugin name or module:factory "
                                "(default: each task's own \"env\" field, else math)."),
        tasks: list[str] = typer.Option([], "--tasks", help="builtin:NAME?opts or a JSONL file (default builtin:ENV); "
                                        "with --env-mix, repeat as ENV=SOURCE."),
        env_mix: str = typer.Option(None, "--env-mix", help="Sample groups across envs at these ratios, e.g. "
                                    "'swe:0.7,math:0.3' (tasks per env from --tasks ENV=SOURCE or builtin)."),
        history: str = typer.Option("full", "--history", help="full: one prefix-consistent row per trajectory; "
                                    "per-turn: one row per turn, each rendered by the chat template itself."),
        chat_template_kwargs: list[str] = typer.Option(
            [], "--chat-template-kwargs", help="KEY=VALUE for the chat template (repeatable), e.g. enable_thinking=false."),
        tool_parser: str = typer.Option(None, "--tool-parser", help="Tool-call parser: hermes, llama3-json, mistral "
                                        "(default: the one of the chat template's family)."),
        max_error_frac: float = typer.Option(0.5, "--max-error-frac", help="Exit 1 when more than this share of "
                                             "trajectories ends env_error or policy_error."),
        policy: str = typer.Option("default", "--policy", help="HF dir, RUN/policy (uses LATEST), default, tiny."),
        backend: str = typer.Option("hf", "--backend", help="Inference backend: hf, vllm, openai."),
        server: list[str] = typer.Option([], "--server", help="openai backend: server URL (repeatable)."),
        run: str = typer.Option(None, "--run", help="Run directory; output goes to RUN/rollouts."),
        out: str = typer.Option(None, "--out", help="Output directory (any fsspec URL)."),
        group_size: int = typer.Option(4, "--group-size", "-G", help="Samples per task (GRPO group)."),
        concurrency: int = typer.Option(64, "--concurrency", "-c", help="Trajectories in flight."),
        limit: int = typer.Option(None, "--limit", help="Use only the first N tasks."),
        max_turns: int = typer.Option(6, "--max-turns"),
        max_tokens: int = typer.Option(2048, "--max-tokens", help="Response tokens per trajectory."),
        max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="Generated tokens per turn."),
        step_timeout: float = typer.Option(30.0, "--step-timeout", help="Seconds per environment step."),
        trajectory_timeout: float = typer.Option(3600.0, "--trajectory-timeout",
                                                 help="Seconds per trajectory, queueing for the policy included."),
        max_obs_tokens: int = typer.Option(512, "--max-obs-tokens", help="Observation tokens kept per turn."),
        temperature: float = typer.Option(1.0, "--temperature"),
        top_p: float = typer.Option(1.0, "--top-p"),
        seed: int = typer.Option(None, "--seed", help="Sampling seed (per trajectory and turn)."),
        top_up: bool = typer.Option(False, "--top-up", help="Resample a member that ends env_error (a dead "
                                    "sandbox: infrastructure, not the model) with a new seed, so groups stay at G."),
        max_top_up: int = typer.Option(2, "--max-top-up", help="--top-up: resamples allowed per group."),
        max_batch: int = typer.Option(32, "--max-batch", help="Sequences per forward pass (hf backend)."),
        flush_groups: int = typer.Option(16, "--flush-groups", help="Write a shard every N groups."),
        flush_seconds: float = typer.Option(60.0, "--flush-seconds", help="... or every T seconds."),
        prefix: str = typer.Option("part", "--prefix", help="Shard name prefix (e.g. it0003 in a loop)."),
        env_opt: list[str] = typer.Option([], "--env-opt", help="KEY=VALUE passed to the environment."),
        backend_opt: list[str] = typer.Option(
            [], "--backend-opt",
            help="KEY=VALUE passed to the inference backend, e.g. enforce_eager=false (vllm: compiled, "
                 "slower to start, faster to generate) or kv_cache_gib=4."),
        sandbox: str = typer.Option(None, "--sandbox", help="swe: sandbox backend (bwrap, docker, subprocess)."),
        sandboxes: int = typer.Option(None, "--sandboxes", help="swe: warm sandboxes in the pool."),
        insecure_sandbox: bool = typer.Option(False, "--insecure-sandbox",
                                              help="Allow the subprocess backend (trusted code only)."),
        watch: bool = typer.Option(False, "--watch", help="Daemon: run epochs over the tasks until SIGTERM/SIGINT."),
        max_epochs: int = typer.Option(None, "--max-epochs", help="--watch: stop after N epochs (default: never)."),
        poll: float = typer.Option(5.0, "--poll", help="--watch: seconds between LATEST and backlog checks."),
        max_pending: int = typer.Option(None, "--max-pending",
                                        help="--watch: untrained rows (in flight included) never exceed this."),
        max_staleness: int = typer.Option(None, "--max-staleness",
                                          help="--watch: start no trajectory more than K versions behind the trainer."),
        lock_wait: float = typer.Option(0.0, "--lock-wait", help=LOCK_WAIT_HELP),
        worker: str = typer.Option(None, "--worker", help="I/N: roll out only worker I's share of the tasks."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Render the first prompt; write nothing."),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    ) -> None:
        from arlctl.io.partition import owns, parse_worker
        from arlctl.stages.rollout import RolloutConfig

        check_sampling_options(temperature, top_p, max_new_tokens, seed)
        check_loop_options(history, tool_parser, max_error_frac)
        template_kwargs = parse_template_kwargs(chat_template_kwargs)
        if max_top_up < 0:
            raise UsageError(f"--max-top-up must be >= 0, got {max_top_up}")
        task_list, env = load_task_list(env, tasks, env_mix, limit, seed)
        share = parse_worker(worker)
        task_list = [t for t in task_list if owns(str(t.get("task_id", "")), *share)]
        options = parse_env_options(env_opt)
        if sandbox is not None:
            options["sandbox"] = sandbox
        if sandboxes is not None:
            options["sandboxes"] = sandboxes
        if insecure_sandbox:
            options["insecure_sandbox"] = True
        picker = EnvPicker(options)
        env_names = picker.check(task_list, env)  # unknown envs or options: a usage error before any work
        if dry_run:
            _dry_run(task_list, picker, policy, template_kwargs, tool_parser)
            return
        from arlctl.doctor import DoctorOptions, preflight, stage_checks

        for name in env_names:
            checks = stage_checks(name, options.get("sandbox"), backend)
            if checks:  # a missing sandbox backend or vLLM is one usage error with its fix, before any work
                preflight(checks, DoctorOptions(sandbox=options.get("sandbox") or "bwrap", backend=backend))
        _, out = resolve_io("rollout", run, None, out)
        daemon = _daemon_options(watch, max_epochs, poll, max_pending, max_staleness, group_size, policy, run, out)
        cfg = RolloutConfig(env=env, group_size=group_size, concurrency=concurrency, max_turns=max_turns,
                            max_tokens=max_tokens, max_new_tokens=max_new_tokens, step_timeout=step_timeout,
                            trajectory_timeout=trajectory_timeout, max_obs_tokens=max_obs_tokens,
                            temperature=temperature, top_p=top_p, seed=seed,
                            max_top_up=max_top_up if top_up else 0, history=history, tool_format=tool_parser,
                            template_kwargs=template_kwargs)
        from arlctl.inference.loader import load_policy
        from arlctl.io.lock import RunLock

        backend_opts: dict[str, Any] = {"max_batch": max_batch, **parse_env_options(backend_opt, "--backend-opt")}
        if policy.startswith("oracle:"):
            backend_opts["tasks"] = task_list
        if server:
            backend_opts["servers"] = server
        lock_name = "rollout" if share[1] == 1 else f"rollout-worker{share[0]}of{share[1]}"
        with RunLock(out, lock_name, wait_s=lock_wait):
            pol = load_policy(policy, backend=backend, **backend_opts)
            cfg.max_context = int(getattr(pol, "max_context", None) or cfg.max_context)
            spec = {"tasks": list(tasks) or [f"builtin:{env}"], "env_mix": env_mix, "policy": policy,
                    **cfg.as_dict()}
            writer = GroupShardWriter(
                out, lambda: Lineage(stage="rollout", inputs=[], config_hash=config_hash(spec),
                                     extra={"tasks": ",".join(spec["tasks"]), "policy": pol.name,
                                            "policy_version": pol.version}),
                flush_groups=flush_groups, flush_seconds=flush_seconds, prefix=prefix)
            summary = asyncio.run(_run(task_list, pol, picker, cfg, writer, quiet, daemon, env_names))
            summary["out"] = out
            summary["metrics"] = write_rollout_metrics(summary, metrics_dir_for(out, run), backend)
        if as_json:
            print_json(summary)
        console.print(
            f"[bold]{summary['trajectories']}[/] trajectories in {summary['groups']} groups -> "
            f"{summary['shards_written']} shards in {escape(out)}  ({summary['generated_tokens_per_s']:.1f} gen tok/s, "
            f"mean env latency {summary['mean_env_latency_s'] * 1e3:.1f} ms, {summary['errors']} errors"
            f"{', interrupted' if summary['interrupted'] else ''})")
        if summary["template_rewrites_history"] and history == "full":
            console.print("note: the chat template re-renders earlier turns (it drops their reasoning); rows keep "
                          "what the model saw, prefix-consistent. --history per-turn renders every turn's prompt "
                          "as the template does (README \"Chat templates\").", markup=False)
        _fail_if_nothing_usable(summary, len(task_list))
        _fail_if_too_many_errors(summary, max_error_frac)


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
            # looked up at call time, so a factory that fails per trajectory is an env_error row, not a crash
            self.factories[name] = lambda name=name, accepted=accepted: registry.make_env(name, **accepted)
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

    def __call__(self, name: str) -> Any:
        if name not in self.factories:
            raise UsageError(f"env {name!r} was not among the envs checked before the run")
        return self.factories[name]


def _fail_if_too_many_errors(summary: dict[str, Any], max_error_frac: float) -> None:
    """Exit 1 when the share of trajectories that ended env_error/policy_error exceeds --max-error-frac."""
    if summary["interrupted"] or summary["error_fraction"] <= max_error_frac:
        return
    outcomes = summary.get("outcomes") or {}
    failed = outcomes.get("env_error", 0) + outcomes.get("policy_error", 0)
    causes = summary.get("error_causes") or {}
    top = max(causes.items(), key=lambda kv: kv[1]) if causes else None
    raise TerminalError(
        f"{failed} of {sum(outcomes.values())} trajectories failed ({summary['error_fraction']:.0%} > "
        f"--max-error-frac {max_error_frac:g})" + (f"; most common cause {top[0]} ({top[1]})" if top else "")
        + f"; last error: {summary.get('last_error') or 'none recorded'}",
        hint="the rows are kept for `arlctl show`; `arlctl status RUN` lists the causes")


def _fail_if_nothing_usable(summary: dict[str, Any], tasks: int) -> None:
    """Exit non-zero (after the summary) when a finished rollout produced no usable trajectory.

    "Nothing fails silently" (DESIGN.md §6): a run that wrote nothing from non-empty input, or whose
    every trajectory failed (policy_error, env_error, timeout), is a failed command with its cause. An
    interrupted run is not judged: the user stopped it.
    """
    if summary["interrupted"] or tasks == 0:
        return
    cause = summary.get("last_error") or "no error was recorded"
    if summary["rows_written"] == 0:
        raise TerminalError(f"rollout wrote no rows from {tasks} tasks: {cause}",
                            hint="re-run with --debug; check the policy backend and the environment")
    usable = sum(summary["status"].get(s, 0) for s in USABLE_STATUSES)
    if usable == 0:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(summary["status"].items()) if v)
        raise TerminalError(f"every trajectory failed ({counts}); last error: {cause}",
                            hint=f"the rows are kept in {summary['out']} for `arlctl show`")


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


def _daemon_options(watch: bool, max_epochs: int | None, poll: float, max_pending: int | None,
                    max_staleness: int | None, group_size: int, policy: str, run: str | None,
                    out: str) -> dict[str, Any] | None:
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
    follow = None
    from arlctl import models

    if not policy.startswith("oracle:") and policy not in ("tiny", "default", models.DEFAULT_MODEL):
        from arlctl.inference.loader import resolve_policy

        resolved = resolve_policy(policy, progress=False)
        follow = str(resolved.policy_dir) if resolved.policy_dir is not None else None
    if follow is None and run_root is not None and not policy.startswith("oracle:"):
        follow = join(run_root, "policy")  # start from a model, pick up what sync publishes
    return {"epochs": max_epochs, "poll": poll, "max_pending": max_pending, "max_staleness": max_staleness,
            "run": run_root, "follow": follow}


def write_rollout_metrics(summary: dict[str, Any], metrics_dir: str, backend: str) -> str:
    """One row per rollout invocation in RUN/metrics: loop counters plus the backend's own counters."""
    import json

    import pyarrow as pa

    from arlctl.io.fs import join
    from arlctl.io.shards import shard_name, write_table_atomic

    row: dict[str, Any] = {"backend": backend}
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[key] = float(value)
    row["last_error"] = summary.get("last_error")  # already Parquet-safe (see _run)
    row["error_causes"] = json.dumps(summary.get("error_causes") or {}, sort_keys=True)  # {cause: count}
    for key, value in (summary.get("backend_metrics") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[f"backend_{key}"] = float(value)
    return write_table_atomic(pa.Table.from_pylist([row]), join(metrics_dir, shard_name("rollout")))


def _dry_run(task_list: list[dict], picker: EnvPicker, policy: str, template_kwargs: dict[str, Any],
             tool_parser: str | None = None) -> None:
    from rich.panel import Panel
    from transformers import AutoTokenizer

    from arlctl.inference.chat import ChatCodec
    from arlctl.inference.loader import resolve_policy
    from arlctl.tools import parser_for_template

    if not task_list:
        raise UsageError("no tasks")
    resolved = resolve_policy(policy)
    codec = ChatCodec(AutoTokenizer.from_pretrained(str(resolved.path), local_files_only=True), template_kwargs)
    environment = picker(str(task_list[0].get("env") or next(iter(picker.factories))))()
    from arlctl.stages.rollout import parquet_safe_value

    reset = asyncio.run(environment.reset(parquet_safe_value(task_list[0])))  # as the rollout itself would
    prompt = codec.prompt(reset.messages, reset.tools)
    # Task text is data: terminal-safe plain Text, never parsed as Rich markup.
    title = f"first prompt ({len(prompt.ids)} tokens, task {escape(terminal_safe(str(task_list[0].get('task_id'))))})"
    console.print(Panel(plain(prompt.text), title=title, title_align="left"))
    console.print(f"tools: {[t['function']['name'] for t in reset.tools]}  "
                  f"({'in the chat template' if codec.tools_in_template else 'described in the system prompt'}; "
                  f"tool-call parser {tool_parser or parser_for_template(codec.chat_template)})")
    console.print(f"dry run: would roll out {len(task_list)} tasks; nothing written")


def _safe_text(text: str | None) -> str | None:
    from arlctl.stages.rollout import parquet_safe

    return None if text is None else parquet_safe(text)


async def _run(task_list, pol, picker: EnvPicker, cfg, writer: GroupShardWriter, quiet: bool,
               daemon: dict[str, Any] | None = None, env_names: list[str] | None = None) -> dict[str, Any]:
    from arlctl.stages.rollout import Backpressure, PolicyFollower, Stats, rollout

    stats = Stats()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    interrupts = {"n": 0}

    def on_signal() -> None:
        interrupts["n"] += 1
        if interrupts["n"] > 1:
            raise KeyboardInterrupt
        console.print("[yellow]interrupt: no new trajectories; aborting those in flight and flushing[/]")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    status = {"ok": 0}

    async def sink(rows) -> None:
        for r in rows:
            status[r.status] = status.get(r.status, 0) + 1
        await writer.add_group(rows)

    epochs, follower, gate = 1, None, None
    if daemon is not None:
        epochs = daemon["epochs"]
        if daemon["follow"]:
            follower = PolicyFollower(pol, daemon["follow"], daemon["poll"], on_reload=lambda old, new: console.print(
                f"policy reloaded: v{old} -> v{new} (at a turn boundary)"))
        if daemon["max_pending"] is not None or daemon["max_staleness"] is not None:
            gate = Backpressure(
                daemon["run"], cfg.group_size, pol,
                # per-turn rows outnumber trajectories: never let the estimate go negative
                in_flight=lambda: max(0, stats.groups_started * cfg.group_size - writer.rows_written),
                max_pending=daemon["max_pending"], max_staleness=daemon["max_staleness"], poll_s=daemon["poll"],
                follower=follower, flush=writer.flush, log=lambda line: console.print(line, markup=False))

    started = time.monotonic()
    total = None if epochs is None else len(task_list) * epochs
    with Progress(TextColumn("[bold]rollout"), BarColumn(), MofNCompleteColumn(), TextColumn("groups"),
                  # the detail holds error text (model-influenced): never parse it as markup
                  TextColumn("{task.fields[detail]}", markup=False), TimeElapsedColumn(), console=console,
                  disable=quiet, transient=False) as progress:
        bar = progress.add_task("rollout", total=total, detail="")

        async def refresh() -> None:
            while True:
                progress.update(bar, completed=stats.groups_done, detail=(
                    (f"epoch {stats.epoch}  v{pol.version}  " if daemon else "")
                    + f"in flight {stats.in_flight:3d}  {stats.tokens_per_s():6.1f} tok/s  "
                    f"env {stats.mean_env_latency_s() * 1e3:6.1f} ms  errors {stats.errors}"
                    + (f"  last: {stats.last_error[:60]}" if stats.last_error else "")))
                await asyncio.sleep(0.5)

        ticker = asyncio.ensure_future(refresh())
        try:
            await rollout(task_list, pol, picker(cfg.env) if cfg.env in picker.factories else None, cfg, sink,
                          stats=stats, stop=stop, turn_hook=follower.maybe_reload if follower else None,
                          epochs=epochs, before_group=gate.wait if gate else None, env_for=picker)
            await writer.flush()
        finally:
            ticker.cancel()
            progress.update(bar, completed=stats.groups_done)
            backend_metrics = pol.metrics() if hasattr(pol, "metrics") else {}
            await pol.close()
            if "swe" in (env_names or [cfg.env]):
                from arlctl.envs.swe.sandboxes import close_shared

                await close_shared()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
    elapsed = time.monotonic() - started
    summary = {
        "groups": stats.groups_done, "trajectories": stats.trajectories_done, "status": status,
        "shards_written": len(writer.written), "shards": writer.written, "rows_written": writer.rows_written,
        "generated_tokens": stats.generated_tokens, "generated_tokens_per_s": stats.generated_tokens / max(elapsed, 1e-9),
        "mean_env_latency_s": stats.mean_env_latency_s(), "env_calls": stats.env_calls, "errors": stats.errors,
        "top_ups": stats.top_ups, "error_causes": dict(stats.causes), "outcomes": dict(stats.outcomes),
        "error_fraction": stats.error_fraction(), "history": cfg.history,
        "template_rewrites_history": stats.template_rewrites_history,
        "seconds": elapsed, "interrupted": stop.is_set(), "backend_metrics": backend_metrics,
        "epochs": stats.epochs_done, "policy_version": pol.version,
        "last_error": _safe_text(stats.last_error or (follower.last_error if follower else None)),
    }
    if daemon is not None:
        summary["reloads"] = follower.reloads if follower else 0
        if gate is not None:
            summary.update({
                "backpressure_wait_s": sum(gate.waited_s.values()), "backlog_wait_s": gate.waited_s["backlog"],
                "staleness_wait_s": gate.waited_s["staleness"], "backlog_waits": gate.waits["backlog"],
                "staleness_waits": gate.waits["staleness"], "max_backlog": gate.max_backlog,
                "max_staleness_at_start": gate.max_staleness_started,
            })
    return summary
