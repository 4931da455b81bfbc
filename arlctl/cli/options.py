"""Command options in one place: the aliases every stage command shares, and options derived from a config.

A stage's settings are one dataclass (stages/configs.py, stages/agent_loop.RolloutConfig) whose fields carry
their help text in `field(metadata=...)` (see arlctl/settings.py). `config_command(XConfig)` turns those fields into
the command's Typer options -- same name, type and default -- and hands the command one built `cfg`, so a
default is written once, in the dataclass. Typer reads a command's parameters with `inspect.signature`,
which honours `__signature__`: that is all the mechanism is.

The options every stage shares (--run, --in, --out, --metrics, --watch, --poll, --lock-wait, --json,
--dry-run) are `Annotated` aliases, declared once here (STYLE.md, sqlite-utils `output_options`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from arlctl.cli.common import console
from arlctl.settings import cli_fields, field_default, field_types, flag_of
from arlctl.stages.jobs import LOCK_WAIT_HELP, QUIET_HELP, RunOptions

LockWaitOpt = Annotated[float, typer.Option("--lock-wait", help=LOCK_WAIT_HELP)]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON summary on stdout.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Say what would happen; write nothing.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)]


# The option panels of a big command's --help (arlctl/cli/help.py), keyed by parameter name: each name is
# declared in one panel, the same panel in every command; a name in none stays under "Options".
PANELS: dict[str, tuple[str, ...]] = {
    "Input and output": ("run", "in_url", "out", "out_url", "metrics", "tasks", "env", "env_mix", "env_opt",
                         "limit", "prefix", "name", "policy_dir", "ckpt_dir", "current_version", "reward",
                         "reward_opt", "cache", "no_cache", "cache_flush_s", "quarantine"),
    "Policy and inference": ("policy", "backend", "backend_opt", "server", "servers_file", "max_batch",
                             "chat_template_kwargs", "tool_format", "history", "teacher", "device"),
    "Sampling": ("group_size", "samples", "greedy", "temperature", "top_p", "seed", "max_turns", "max_tokens",
                 "max_new_tokens", "max_obs_tokens", "correct_at", "every", "compare", "force"),
    "Sandbox": ("sandbox", "sandboxes", "insecure_sandbox", "docker_host"),
    "Limits": ("concurrency", "reward_concurrency", "step_timeout", "trajectory_timeout", "max_error_frac",
               "top_up", "max_top_up", "flush_groups", "flush_seconds"),
    "Daemon": ("watch", "poll", "lock_wait", "worker", "max_epochs", "max_pending", "max_staleness", "max_lag",
               "lag_decay", "resume", "nproc"),
    "Optimizer and checkpoints": ("lr", "weight_decay", "warmup_steps", "lr_schedule", "cosine_steps", "grad_clip",
                                  "micro_tokens", "pack", "precision", "strategy", "offload", "grad_checkpoint", "compile",
                                  "lora_rank", "lora_alpha", "lora_targets", "publish_every", "publish_dtype",
                                  "publish_format", "save_every", "keep_checkpoints", "max_steps"),
}
PANEL_OF = {name: panel for panel, names in PANELS.items() for name in names}


def config_parameters(config: type, skip: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per option field of `config`, as Typer reads them."""
    types = field_types(config)
    params = []
    for f in cli_fields(config):
        if f.name in skip:
            continue
        decls = [f.metadata.get("flag") or flag_of(f)] + ([f.metadata["short"]] if f.metadata.get("short") else [])
        option = typer.Option(*decls, help=f.metadata.get("help") or None, metavar=f.metadata.get("metavar"))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=field_default(f),
                                        annotation=Annotated[types[f.name], option]))
    return params


def config_command(config: type, *, param: str = "cfg", skip: tuple[str, ...] = (), options: type | None = None,
                   options_param: str = "opts") -> Callable:
    """Decorate a command `fn(cfg: XConfig, <its own options>)`: its options become the command's own plus
    one per field of `config` (names, types, defaults and help from the dataclass), and `fn` receives the
    built config object as `param`. Fields in `skip` are left at their default, not options.

    `options`: the stage's job options (stages/jobs.py: IO and run options), derived the same way and
    handed to `fn` built, as `options_param`. A command that declares no `quiet` (its own or in `options`)
    gets -q/--quiet here: stderr's console is silent while `fn` runs (errors are printed after it, by
    handle_errors)."""

    def decorate(fn: Callable) -> Callable:
        skipped = {param, options_param} if options is not None else {param}
        own = [_resolved(fn, p) for name, p in inspect.signature(fn).parameters.items() if name not in skipped]
        derived = config_parameters(config, skip)
        names = {f.name for f in cli_fields(config) if f.name not in skip}
        job_names = {f.name for f in cli_fields(options)} if options is not None else set()
        clash = ((names | job_names) & {p.name for p in own}) | (names & job_names)
        if clash:
            raise TypeError(f"{fn.__name__}: options {sorted(clash)} are declared twice")
        quiet_in_job = "quiet" in job_names
        adds_quiet = "quiet" not in {p.name for p in own} and not quiet_in_job

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            quiet = kwargs.pop("quiet") if adds_quiet else bool(quiet_in_job and kwargs.get("quiet"))
            built = {param: config(**_values(kwargs, names, config))}
            if options is not None:
                built[options_param] = options(**_values(kwargs, job_names, options))
            loud = console.quiet
            console.quiet = loud or quiet
            try:
                return fn(**kwargs, **built)
            finally:
                console.quiet = loud

        quiet_param = inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=QuietOpt)
        job = config_parameters(options) if options is not None else []
        shared = {f.name for f in dataclasses.fields(RunOptions)}  # --help: a stage's own IO options first
        job = [p for p in job if p.name not in shared] + [p for p in job if p.name in shared]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + job + [quiet_param] * adds_quiet + derived
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # Typer must read __signature__, not the undecorated function
        return command

    return decorate


def _values(kwargs: dict[str, Any], names: set[str], config: type) -> dict[str, Any]:
    """Pop the values of `names` out of a command's keyword arguments (click gives tuples for lists; a
    `tuple[...]` field, an option of several values such as eval's --compare VA VB, stays a tuple)."""
    kinds = field_types(config)
    values = {name: kwargs.pop(name) for name in names if name in kwargs}
    return {k: list(v) if isinstance(v, tuple) and not _is_tuple(kinds[k]) else v for k, v in values.items()}


def _is_tuple(kind: Any) -> bool:
    """`tuple[...]` or `tuple[...] | None`."""
    union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    return any(typing.get_origin(k) is tuple for k in (typing.get_args(kind) if union else (kind,)))


def _resolved(fn: Callable, p: inspect.Parameter) -> inspect.Parameter:
    """`p` with its annotation evaluated where `fn` was written: Typer evaluates string annotations in the
    generated command's module, which is this one, not the command's."""
    if isinstance(p.annotation, str):
        return p.replace(annotation=eval(p.annotation, fn.__globals__))  # noqa: S307 (our own source text)
    return p


def option_defaults(command: Any) -> dict[str, tuple[str, Any]]:
    """{long option: (parameter name, default)} of a click command: what tests compare with the configs."""
    out: dict[str, tuple[str, Any]] = {}
    for p in command.params:
        for opt in [*p.opts, *getattr(p, "secondary_opts", [])]:
            if opt.startswith("--"):
                out[opt] = (p.name, p.default)
    return out
