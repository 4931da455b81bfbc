"""The one resolver from a stage's policy options (--policy, --backend, ...) to a loaded policy.

rollout, eval and serve ask `choose` first: it resolves the spec once (a missing or wrong policy is a usage
error, exit 2, before the command makes any output), and `load` builds the policy from that choice
without resolving it again. Scripted `oracle:*` specs are chosen here too: each lives with the env whose
tasks it knows how to solve, so they are picked above both the envs and the inference layer. No typer here.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arlctl.errors import UsageError
from arlctl.inference.base import Policy, as_policy
from arlctl.inference.loader import ResolvedPolicy, check_backend, load_resolved, resolve_policy
from arlctl.settings import parse_env_options
from arlctl.stages.jobs import PolicyOptions

# Scripted policies (`--policy oracle:...`): spec prefix -> module:function loading it as
# load(spec, tokenizer, tasks=...).
SCRIPTED = {
    "oracle:textarena": "arlctl.envs.textarena_oracle:load_textarena_oracle",  # wins the games it can solve
    "oracle:humaneval": "arlctl.envs.code_oracle:load_oracle",  # HumanEval's canonical solutions
    "oracle:reasoning-gym": "arlctl.envs.reasoning_gym_oracle:load_scripted",  # regenerated reference answers
    "oracle:replies=": "arlctl.envs.reasoning_gym_oracle:load_scripted",  # replies from a JSONL of task_id -> reply
    "oracle:calculator": "arlctl.envs.math_oracle:load_math_oracle",  # math: calls the calculator, then answers
    "oracle:harness-": "arlctl.harnesses.oracle:load_harness_oracle",  # swe through --harness: gold / empty
    "oracle:": "arlctl.envs.swe.oracle:load_oracle",  # swe: oracle:gold (gold patches), oracle:empty (no change)
}


@dataclass(frozen=True)
class PolicyChoice:
    """A policy spec resolved once: the model directory, name and version (None for a scripted policy)."""

    opts: PolicyOptions
    resolved: ResolvedPolicy | None

    @property
    def spec(self) -> str:
        return self.opts.policy or ""

    @property
    def scripted(self) -> bool:
        return self.resolved is None

    @property
    def version(self) -> int:
        return 0 if self.resolved is None else self.resolved.version


def is_scripted(spec: str) -> bool:
    return spec.startswith("oracle:")


def check(opts: PolicyOptions) -> None:
    """The backend options, checked before anything is resolved (a usage error names what is wrong): what
    choose checks first, and what a command that resolves its spec later (eval --watch) checks up front."""
    check_backend(opts.backend)
    backend_options(opts, None)  # a malformed --backend-opt
    if opts.max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1, got {opts.max_batch}")


def choose(opts: PolicyOptions, *, progress: bool = True, scripted_ok: bool = True) -> PolicyChoice:
    """Check the options and resolve the spec (a usage error names what is wrong); nothing is loaded yet.

    scripted_ok=False: a command that needs a model (eval, serve) refuses an oracle:* spec here."""
    check(opts)
    if not opts.policy:
        raise UsageError("no policy given", hint="pass --policy (a model, an HF directory or RUN/policy)")
    if is_scripted(opts.policy):
        if not scripted_ok:
            raise UsageError(f"{opts.policy!r} is a scripted policy for `arlctl rollout --policy {opts.policy}` only",
                             hint="give a model: default, tiny, an HF directory or a policy directory")
        return PolicyChoice(opts, None)
    return PolicyChoice(opts, resolve_policy(opts.policy, progress=progress))


def load(choice: PolicyChoice, *, tasks: list[dict[str, Any]] | None = None, run: str | None = None) -> Policy:
    """The policy a choice names: a scripted one over `tasks`, else the model with its backend options
    (the openai backend's servers file defaults to RUN/fleet.json of `run`)."""
    if choice.resolved is None:
        return as_policy(_scripted(choice.spec, tasks or []))
    return as_policy(load_resolved(choice.resolved, choice.opts.backend, **backend_options(choice.opts, run)))


def loader(opts: PolicyOptions, run: str | None = None) -> Callable[[str], Policy]:
    """load(choose(...)) for other specs with the same backend options: what eval's watcher loads each
    published version with."""

    def load_spec(spec: str) -> Policy:
        return load(choose(dataclasses.replace(opts, policy=spec), progress=False, scripted_ok=False), run=run)

    return load_spec


def backend_options(opts: PolicyOptions, run: str | None) -> dict[str, Any]:
    """The backend's keyword arguments: --max-batch, --backend-opt, --server, the servers file."""
    options: dict[str, Any] = {"max_batch": opts.max_batch, **parse_env_options(opts.backend_opt, "--backend-opt")}
    if opts.server:
        options["servers"] = list(opts.server)
    if opts.backend == "openai":
        servers_file = _servers_file(opts.servers_file or options.get("servers_file"), run, bool(opts.server))
        if servers_file:
            options["servers_file"] = servers_file
    return options


def _servers_file(given: str | None, run: str | None, has_servers: bool) -> str | None:
    """The openai backend's servers file: the one given, else RUN/fleet.json when it exists or when no --server
    names an engine (then a missing file is the loader's clear error, not a silent empty fleet)."""
    if given or run is None:
        return given
    from arlctl.io import store
    from arlctl.io.run import RunLayout

    fleet = RunLayout(run).fleet
    return fleet if (not has_servers or store.exists(fleet)) else None


def _scripted(spec: str, tasks: list[dict[str, Any]]) -> Any:
    """The scripted policy `spec` names (the longest matching prefix of SCRIPTED)."""
    from arlctl import models

    prefix = max((p for p in SCRIPTED if spec.startswith(p)), key=len)
    module, _, function = SCRIPTED[prefix].partition(":")
    return getattr(importlib.import_module(module), function)(spec, models.smollm2_tokenizer(), tasks=tasks)
