"""`arlctl rollout`: run a policy on tasks in an environment; write trajectory shards as groups finish."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import (
    DryRunOpt,
    JsonOpt,
    LockWaitOpt,
    OutOpt,
    PollOpt,
    RunOpt,
    WatchOpt,
    config_command,
)
from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.io.layout import resolve_io
from arlctl.render import one_line, plain, terminal_safe
from arlctl.settings import parse_env_options
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout_job import EnvPicker

HELP = """Run the policy on tasks: G samples per task (a GRPO group), many trajectories in flight, multi-turn with tools. Shards are written as groups finish (a group is never split across shards).

  arlctl rollout --env math --tasks "builtin:math?n=64&seed=0" --policy default --run runs/r1 -G 4

  arlctl rollout --env math --tasks tasks.jsonl --policy runs/r1/policy --out runs/r1/rollouts --json

  arlctl rollout --env math --tasks builtin:math --policy tiny --dry-run    # show the first prompt

  arlctl rollout --watch --run runs/r1 --policy runs/r1/policy --max-pending 256 --max-staleness 2

Ctrl-C (or SIGTERM) stops new work, ends in-flight trajectories as `aborted` and flushes everything. The same command again resumes: it rolls out only the (task, sample) pairs the output does not hold yet; other settings (a new --temperature, a newer policy version) start afresh, and say so.

With --watch it runs as a daemon: epoch after epoch over the tasks (--max-epochs N to stop), reloading the policy at turn boundaries when RUN/policy/LATEST names a newer version (checked every --poll s), and holding back new groups while the untrained backlog would exceed --max-pending rows or a new group's projected lag at train time (the trainer's version plus the batches queued in front of it, minus the policy version) would exceed --max-staleness (docs/daemons.md).
"""


def register(app: typer.Typer) -> None:
    @app.command("rollout", help=HELP)
    @handle_errors
    @config_command(RolloutConfig)
    def rollout_cmd(
        cfg: RolloutConfig,
        env: str = typer.Option(None, "--env", help="Environment: math, swe, a plugin name or module:factory "
                                "(default: each task's own \"env\" field, else math)."),
        tasks: list[str] = typer.Option([], "--tasks", help="builtin:NAME?opts or a JSONL file (default builtin:ENV); "
                                        "with --env-mix, repeat as ENV=SOURCE."),
        env_mix: str = typer.Option(None, "--env-mix", help="Sample groups across envs at these ratios, e.g. "
                                    "'swe:0.7,math:0.3' (tasks per env from --tasks ENV=SOURCE or builtin)."),
        chat_template_kwargs: list[str] = typer.Option(
            [], "--chat-template-kwargs", help="KEY=VALUE for the chat template (repeatable), e.g. enable_thinking=false."),
        max_error_frac: float = typer.Option(0.5, "--max-error-frac", help="Exit 1 when more than this share of "
                                             "trajectories ends env_error or policy_error."),
        policy: str = typer.Option("default", "--policy", help="HF dir, RUN/policy (uses LATEST), default, tiny, or a scripted oracle:gold / oracle:empty (swe), oracle:humaneval, oracle:reasoning-gym, oracle:replies=FILE, oracle:textarena, oracle:calculator (math)."),
        backend: str = typer.Option("hf", "--backend", help="Inference backend: hf, vllm, openai."),
        server: list[str] = typer.Option([], "--server", help="openai backend: server URL (repeatable)."),
        servers_file: str = typer.Option(None, "--servers-file", help="openai backend: a file of server URLs "
                                         "re-read while running (engines join and drain); default RUN/fleet.json "
                                         "with --run when it exists or no --server is given."),
        run: RunOpt = None,
        out: OutOpt = None,
        limit: int = typer.Option(None, "--limit", help="Use only the first N tasks."),
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
        docker_host: list[str] = typer.Option([], "--docker-host", help="--sandbox docker: an engine, 'URL max=N' "
                                              "or a hosts file (repeatable); sandboxes spread over them."),
        watch: WatchOpt = False,
        max_epochs: int = typer.Option(None, "--max-epochs", help="--watch: stop after N epochs (default: never)."),
        poll: PollOpt = 5.0,
        max_pending: int = typer.Option(None, "--max-pending",
                                        help="--watch: untrained rows (in flight included) never exceed this."),
        max_staleness: int = typer.Option(None, "--max-staleness",
                                          help="--watch: start no trajectory more than K versions behind the trainer."),
        lock_wait: LockWaitOpt = 0.0,
        worker: str = typer.Option(None, "--worker", help="I/N: roll out only worker I's share of the tasks."),
        dry_run: DryRunOpt = False,
        as_json: JsonOpt = False,
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    ) -> None:
        from arlctl.io.partition import owns, parse_worker
        from arlctl.stages import rollout_job as job_api

        job_api.check_sampling_options(cfg.temperature, cfg.top_p, cfg.max_new_tokens, cfg.seed)
        job_api.check_loop_options(cfg.history, cfg.tool_format, max_error_frac)
        template_kwargs = job_api.parse_template_kwargs(chat_template_kwargs)
        if max_top_up < 0:
            raise UsageError(f"--max-top-up must be >= 0, got {max_top_up}")
        task_list, env = job_api.load_task_list(env, tasks, env_mix, limit, cfg.seed)
        share = parse_worker(worker)
        task_list = [t for t in task_list if owns(str(t.get("task_id", "")), *share)]
        options = parse_env_options(env_opt)
        for key, value in (("sandbox", sandbox), ("sandboxes", sandboxes), ("insecure_sandbox", insecure_sandbox or None),
                           ("docker_hosts", list(docker_host) or None)):
            if value is not None:
                options[key] = value
        picker = job_api.EnvPicker(options)
        env_names = picker.check(task_list, env)  # unknown envs or options: a usage error before any work
        if dry_run:
            _dry_run(task_list, picker, policy, template_kwargs, cfg.tool_format)
            return
        _preflight(env_names, options.get("sandbox"), backend)
        if not policy.startswith("oracle:"):  # a missing or wrong policy is an error before anything is made
            from arlctl.inference.loader import resolve_policy

            resolve_policy(policy, progress=not quiet)
        _, out = resolve_io("rollout", run, None, out, watch=watch)
        # The command's own options that complete the loop settings (--env from the tasks, --top-up gating).
        cfg = dataclasses.replace(cfg, env=env, max_top_up=max_top_up if top_up else 0, template_kwargs=template_kwargs)
        job = job_api.RolloutJob(
            cfg=cfg, tasks=task_list, envs=picker, out=out, run=run, backend=backend,
            sources=list(tasks) or [f"builtin:{env}"], policy_spec=policy, flush_groups=flush_groups,
            flush_seconds=flush_seconds, prefix=prefix,
            daemon=job_api.daemon_options(watch, max_epochs, poll, max_pending, max_staleness, cfg.group_size, policy,
                                          run, out))
        from arlctl.inference.base import as_policy
        from arlctl.inference.loader import load_policy
        from arlctl.io.lock import RunLock

        backend_opts: dict[str, Any] = {"max_batch": max_batch,
                                        **parse_env_options(backend_opt, "--backend-opt")}
        if server:
            backend_opts["servers"] = server
        if backend == "openai":
            servers_file = _servers_file(servers_file or backend_opts.get("servers_file"), run, bool(server))
            if servers_file:
                backend_opts["servers_file"] = servers_file
        lock_name = "rollout" if share[1] == 1 else f"rollout-worker{share[0]}of{share[1]}"
        with RunLock(out, lock_name, wait_s=lock_wait):
            pol = as_policy(_scripted(policy, task_list) if policy.startswith("oracle:")
                            else load_policy(policy, backend=backend, **backend_opts))
            cfg.max_context = int(pol.max_context or cfg.max_context)
            result = asyncio.run(_run_with_progress(job, pol, quiet))
        if as_json:
            print_json(result.to_json())
        console.print(plain(result.summary_line()))
        if result.template_rewrites_history and cfg.history == "full":
            console.print("note: the chat template re-renders earlier turns (it drops their reasoning); rows keep "
                          "what the model saw, prefix-consistent. --history per-turn renders every turn's prompt "
                          "as the template does (docs/inference.md, \"Chat templates, tool calls and history\").", markup=False)
        failed = result.failure(len(task_list), max_error_frac)
        if failed is not None:
            dead = dead_fleet(pol)
            if dead:  # the engines are down, not the tasks or the policy: a retryable exit (75)
                raise TransientError(f"{failed[0]}; no inference server can serve: {dead}",
                                     hint="start the engines (or `arlctl fleet add RUN URL`), then re-run")
            raise TerminalError(failed[0], hint=failed[1])


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


# Scripted policies (`--policy oracle:...`): spec prefix -> module:function loading it as
# load(spec, tokenizer, tasks=...). Each lives with the env whose tasks it knows how to solve.
SCRIPTED = {
    "oracle:textarena": "arlctl.envs.textarena_oracle:load_textarena_oracle",  # wins the games it can solve
    "oracle:humaneval": "arlctl.envs.code_oracle:load_oracle",  # HumanEval's canonical solutions
    "oracle:reasoning-gym": "arlctl.envs.reasoning_gym_oracle:load_scripted",  # regenerated reference answers
    "oracle:replies=": "arlctl.envs.reasoning_gym_oracle:load_scripted",  # replies from a JSONL of task_id -> reply
    "oracle:calculator": "arlctl.envs.math_oracle:load_math_oracle",  # math: calls the calculator, then answers
    "oracle:": "arlctl.envs.swe.oracle:load_oracle",  # swe: oracle:gold (gold patches), oracle:empty (no change)
}


def _scripted(policy: str, task_list: list[dict[str, Any]]) -> Any:
    """The scripted policy a `--policy oracle:...` spec names (the longest matching prefix of SCRIPTED); it
    lives with the env that knows the answers, so it is chosen here, above both layers."""
    import importlib

    from arlctl import models

    prefix = max((p for p in SCRIPTED if policy.startswith(p)), key=len)
    module, _, function = SCRIPTED[prefix].partition(":")
    load = getattr(importlib.import_module(module), function)
    return load(policy, models.smollm2_tokenizer(), tasks=task_list)


def _servers_file(given: str | None, run: str | None, has_servers: bool) -> str | None:
    """The openai backend's servers file: the one given, else RUN/fleet.json when it exists or when no --server
    names an engine (then a missing file is the loader's clear error, not a silent empty fleet)."""
    if given or run is None:
        return given
    from arlctl.io import store
    from arlctl.io.run import RunLayout

    fleet = RunLayout(run).fleet
    return fleet if (not has_servers or store.exists(fleet)) else None


def _preflight(env_names: list[str], sandbox: str | None, backend: str) -> None:
    """The doctor's checks each env and the backend need: one usage error with its fix, before any work."""
    from arlctl.doctor import DoctorOptions, preflight, stage_checks

    for name in env_names:
        checks = stage_checks(name, sandbox, backend)
        if checks:
            preflight(checks, DoctorOptions(sandbox=sandbox or "bwrap", backend=backend))


async def _run_with_progress(job, pol, quiet: bool):
    """run_rollout with Ctrl-C/SIGTERM as its stop (a second one kills) and a live progress bar."""
    from arlctl.stages.rollout import Stats
    from arlctl.stages.rollout_job import run_rollout

    stats, stop = Stats(), asyncio.Event()
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
    epochs = job.daemon.epochs if job.daemon else 1
    total = None if epochs is None else len(job.tasks) * epochs
    try:
        with Progress(TextColumn("[bold]rollout"), BarColumn(), MofNCompleteColumn(), TextColumn("groups"),
                      # the detail holds error text (model-influenced): never parse it as markup
                      TextColumn("{task.fields[detail]}", markup=False), TimeElapsedColumn(), console=console,
                      disable=quiet, transient=False) as progress:
            bar = progress.add_task("rollout", total=total, detail="")

            async def refresh() -> None:
                while True:
                    progress.update(bar, completed=stats.groups_done, detail=(
                        (f"epoch {stats.epoch}  v{pol.version}  " if job.daemon else "")
                        + f"in flight {stats.in_flight:3d}  {stats.tokens_per_s():6.1f} tok/s  "
                        f"env {stats.mean_env_latency_s() * 1e3:6.1f} ms  errors {stats.errors}"
                        + (f"  last: {stats.last_error[:60]}" if stats.last_error else "")))
                    await asyncio.sleep(0.5)

            ticker = asyncio.ensure_future(refresh())
            try:
                return await run_rollout(job, pol, stop, stats, log=lambda line: console.print(line, markup=False))
            finally:
                ticker.cancel()
                progress.update(bar, completed=stats.groups_done)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


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
    from arlctl.schemas.safe_text import parquet_safe_value

    reset = asyncio.run(environment.reset(parquet_safe_value(task_list[0])))  # as the rollout itself would
    prompt = codec.prompt(reset.messages, reset.tools)
    # Task text is data: terminal-safe plain Text, never parsed as Rich markup.
    title = f"first prompt ({len(prompt.ids)} tokens, task {escape(terminal_safe(str(task_list[0].get('task_id'))))})"
    console.print(Panel(plain(prompt.text), title=title, title_align="left"))
    console.print(f"tools: {[t['function']['name'] for t in reset.tools]}  "
                  f"({'in the chat template' if codec.tools_in_template else 'described in the system prompt'}; "
                  f"tool-call parser {tool_parser or parser_for_template(codec.chat_template)})")
    console.print(f"dry run: would roll out {len(task_list)} tasks; nothing written")
