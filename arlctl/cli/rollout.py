"""`arlctl rollout`: run a policy on tasks in an environment; write trajectory shards as groups finish."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.errors import UsageError
from arlctl.io.layout import metrics_dir_for, resolve_io
from arlctl.io.shards import Lineage, config_hash
from arlctl.io.sink import GroupShardWriter

HELP = """Run the policy on tasks: G samples per task (a GRPO group), many trajectories in flight,
multi-turn with tools. Shards are written as groups finish (a group is never split across shards).

  arlctl rollout --env math --tasks "builtin:math?n=64&seed=0" --policy default --run runs/r1 -G 4

  arlctl rollout --env math --tasks tasks.jsonl --policy runs/r1/policy --out runs/r1/rollouts --json

  arlctl rollout --env math --tasks builtin:math --policy tiny --dry-run    # show the first prompt

Ctrl-C stops new work, ends in-flight trajectories as `aborted` and flushes everything.
"""


def parse_env_options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"--env-opt expects KEY=VALUE, got {pair!r}")
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
        env: str = typer.Option("math", "--env", help="Environment: math, swe."),
        tasks: str = typer.Option(None, "--tasks", help="builtin:NAME?opts or a JSONL file (default builtin:ENV)."),
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
        max_batch: int = typer.Option(32, "--max-batch", help="Sequences per forward pass (hf backend)."),
        flush_groups: int = typer.Option(16, "--flush-groups", help="Write a shard every N groups."),
        flush_seconds: float = typer.Option(60.0, "--flush-seconds", help="... or every T seconds."),
        prefix: str = typer.Option("part", "--prefix", help="Shard name prefix (e.g. it0003 in a loop)."),
        env_opt: list[str] = typer.Option([], "--env-opt", help="KEY=VALUE passed to the environment."),
        sandbox: str = typer.Option(None, "--sandbox", help="swe: sandbox backend (bwrap, docker, subprocess)."),
        sandboxes: int = typer.Option(None, "--sandboxes", help="swe: warm sandboxes in the pool."),
        insecure_sandbox: bool = typer.Option(False, "--insecure-sandbox",
                                              help="Allow the subprocess backend (trusted code only)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Render the first prompt; write nothing."),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    ) -> None:
        from arlctl.envs.registry import make_env
        from arlctl.envs.tasks import load_tasks
        from arlctl.stages.rollout import RolloutConfig

        task_list = load_tasks(tasks or f"builtin:{env}", env=env)
        if limit is not None:
            task_list = task_list[:limit]
        options = parse_env_options(env_opt)
        if sandbox is not None:
            options["sandbox"] = sandbox
        if sandboxes is not None:
            options["sandboxes"] = sandboxes
        if insecure_sandbox:
            options["insecure_sandbox"] = True
        if dry_run:
            _dry_run(task_list, env, options, policy)
            return
        _, out = resolve_io("rollout", run, None, out)
        cfg = RolloutConfig(env=env, group_size=group_size, concurrency=concurrency, max_turns=max_turns,
                            max_tokens=max_tokens, max_new_tokens=max_new_tokens, step_timeout=step_timeout,
                            trajectory_timeout=trajectory_timeout, max_obs_tokens=max_obs_tokens,
                            temperature=temperature, top_p=top_p, seed=seed)
        from arlctl.inference.loader import load_policy

        backend_opts: dict[str, Any] = {"max_batch": max_batch}
        if policy.startswith("oracle:"):
            backend_opts["tasks"] = task_list
        if server:
            backend_opts["servers"] = server
        pol = load_policy(policy, backend=backend, **backend_opts)
        cfg.max_context = int(getattr(pol, "max_context", None) or cfg.max_context)
        spec = {"tasks": tasks or f"builtin:{env}", "policy": policy, **cfg.as_dict()}
        writer = GroupShardWriter(
            out, lambda: Lineage(stage="rollout", inputs=[], config_hash=config_hash(spec),
                                 extra={"tasks": spec["tasks"], "policy": pol.name, "policy_version": pol.version}),
            flush_groups=flush_groups, flush_seconds=flush_seconds, prefix=prefix)
        summary = asyncio.run(_run(task_list, pol, lambda: make_env(env, **options), cfg, writer, quiet))
        summary["out"] = out
        summary["metrics"] = write_rollout_metrics(summary, metrics_dir_for(out, run), backend)
        if as_json:
            print_json(summary)
        console.print(
            f"[bold]{summary['trajectories']}[/] trajectories in {summary['groups']} groups -> "
            f"{summary['shards_written']} shards in {out}  ({summary['generated_tokens_per_s']:.1f} gen tok/s, "
            f"mean env latency {summary['mean_env_latency_s'] * 1e3:.1f} ms, {summary['errors']} errors"
            f"{', interrupted' if summary['interrupted'] else ''})")


def write_rollout_metrics(summary: dict[str, Any], metrics_dir: str, backend: str) -> str:
    """One row per rollout invocation in RUN/metrics: loop counters plus the backend's own counters."""
    import pyarrow as pa

    from arlctl.io.fs import join
    from arlctl.io.shards import shard_name, write_table_atomic

    row: dict[str, Any] = {"backend": backend}
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[key] = float(value)
    for key, value in (summary.get("backend_metrics") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[f"backend_{key}"] = float(value)
    return write_table_atomic(pa.Table.from_pylist([row]), join(metrics_dir, shard_name("rollout")))


def _dry_run(task_list: list[dict], env: str, options: dict, policy: str) -> None:
    from rich.panel import Panel
    from transformers import AutoTokenizer

    from arlctl.envs.registry import make_env
    from arlctl.inference.chat import ChatCodec
    from arlctl.inference.loader import resolve_policy

    if not task_list:
        raise UsageError("no tasks")
    resolved = resolve_policy(policy)
    codec = ChatCodec(AutoTokenizer.from_pretrained(str(resolved.path), local_files_only=True))
    environment = make_env(env, **options)
    reset = asyncio.run(environment.reset(task_list[0]))
    prompt = codec.prompt(reset.messages, reset.tools)
    console.print(Panel(prompt.text, title=f"first prompt ({len(prompt.ids)} tokens, task {task_list[0].get('task_id')})",
                        title_align="left"))
    console.print(f"tools: {[t['function']['name'] for t in reset.tools]}  "
                  f"({'in the chat template' if codec.tools_in_template else 'described in the system prompt'})")
    console.print(f"dry run: would roll out {len(task_list)} tasks; nothing written")


async def _run(task_list, pol, env_factory, cfg, writer: GroupShardWriter, quiet: bool) -> dict[str, Any]:
    from arlctl.stages.rollout import Stats, rollout

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

    started = time.monotonic()
    with Progress(TextColumn("[bold]rollout"), BarColumn(), MofNCompleteColumn(), TextColumn("groups"),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
                  disable=quiet, transient=False) as progress:
        bar = progress.add_task("rollout", total=len(task_list), detail="")

        async def refresh() -> None:
            while True:
                progress.update(bar, completed=stats.groups_done, detail=(
                    f"in flight {stats.in_flight:3d}  {stats.tokens_per_s():6.1f} tok/s  "
                    f"env {stats.mean_env_latency_s() * 1e3:6.1f} ms  errors {stats.errors}"
                    + (f"  last: {stats.last_error[:60]}" if stats.last_error else "")))
                await asyncio.sleep(0.5)

        ticker = asyncio.ensure_future(refresh())
        try:
            await rollout(task_list, pol, env_factory, cfg, sink, stats=stats, stop=stop)
            await writer.flush()
        finally:
            ticker.cancel()
            progress.update(bar, completed=stats.groups_done)
            backend_metrics = pol.metrics() if hasattr(pol, "metrics") else {}
            await pol.close()
            if cfg.env == "swe":
                from arlctl.envs.swe.sandboxes import close_shared

                await close_shared()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
    elapsed = time.monotonic() - started
    return {
        "groups": stats.groups_done, "trajectories": stats.trajectories_done, "status": status,
        "shards_written": len(writer.written), "shards": writer.written, "rows_written": writer.rows_written,
        "generated_tokens": stats.generated_tokens, "generated_tokens_per_s": stats.generated_tokens / max(elapsed, 1e-9),
        "mean_env_latency_s": stats.mean_env_latency_s(), "env_calls": stats.env_calls, "errors": stats.errors,
        "seconds": elapsed, "interrupted": stop.is_set(), "backend_metrics": backend_metrics,
    }
