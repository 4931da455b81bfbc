"""`arlctl rollout`: run a policy on tasks in an environment; write trajectory shards as groups finish."""

from __future__ import annotations

import asyncio
import signal

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import config_command
from arlctl.errors import UsageError
from arlctl.render import plain, terminal_safe
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.jobs import RolloutOptions
from arlctl.stages.rollout_job import RolloutJob

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
    @config_command(RolloutConfig, options=RolloutOptions)
    def rollout_cmd(cfg: RolloutConfig, opts: RolloutOptions) -> None:
        from arlctl.io.lock import RunLock
        from arlctl.stages import policy_job
        from arlctl.stages import rollout_job as job_api

        job = job_api.plan_rollout(cfg, opts)
        if opts.dry_run:
            _dry_run(job)
            return
        with RunLock(job.out, job.lock_name, wait_s=opts.lock_wait):
            pol = policy_job.load(job.policy, tasks=job.tasks, run=job.run)
            job.cfg.max_context = int(pol.max_context or job.cfg.max_context)
            result = asyncio.run(_run_with_progress(job, pol, opts.quiet))
        if opts.as_json:
            print_json(result.to_json())
        console.print(plain(result.summary_line()))
        if result.template_rewrites_history and job.cfg.history == "full":
            console.print("note: the chat template re-renders earlier turns (it drops their reasoning); rows keep "
                          "what the model saw, prefix-consistent. --history per-turn renders every turn's prompt "
                          "as the template does (docs/inference.md, \"Chat templates, tool calls and history\").",
                          markup=False)
        error = job_api.verdict(job, result, pol)
        if error is not None:
            raise error


async def _run_with_progress(job, pol, quiet: bool):
    """run_rollout with Ctrl-C/SIGTERM as its stop (a second one kills) and a live progress bar."""
    from arlctl.stages.agent_loop import Stats
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


def _dry_run(job: RolloutJob) -> None:
    from rich.panel import Panel
    from transformers import AutoTokenizer

    from arlctl import models
    from arlctl.inference.chat import ChatCodec
    from arlctl.schemas.safe_text import parquet_safe_value
    from arlctl.tools import parser_for_template

    task_list, picker, resolved = job.tasks, job.envs, job.policy.resolved
    if not task_list:
        raise UsageError("no tasks")
    # The tokenizer only, nothing loaded; scripted policies speak through SmolLM2's.
    tokenizer = (models.smollm2_tokenizer() if resolved is None
                 else AutoTokenizer.from_pretrained(str(resolved.path), local_files_only=True))
    codec = ChatCodec(tokenizer, job.cfg.template_kwargs)
    environment = picker(str(task_list[0].get("env") or next(iter(picker.factories))))()
    reset = asyncio.run(environment.reset(parquet_safe_value(task_list[0])))  # as the rollout itself would
    prompt = codec.prompt(reset.messages, reset.tools)
    # Task text is data: terminal-safe plain Text, never parsed as Rich markup.
    title = f"first prompt ({len(prompt.ids)} tokens, task {escape(terminal_safe(str(task_list[0].get('task_id'))))})"
    console.print(Panel(plain(prompt.text), title=title, title_align="left"))
    console.print(f"tools: {[t['function']['name'] for t in reset.tools]}  "
                  f"({'in the chat template' if codec.tools_in_template else 'described in the system prompt'}; "
                  f"tool-call parser {job.cfg.tool_format or parser_for_template(codec.chat_template)})")
    console.print(f"dry run: would roll out {len(task_list)} tasks; nothing written")
