"""The harness protocol and registry.

A harness is an object with a `name` and

    async def run(self, ctx: HarnessContext) -> HarnessResult

`ctx` holds the task row, the started sandbox (the task's repository at ctx.sandbox.workdir; commands run
through `ctx.sandbox.exec`), the gateway's OpenAI base URL, the model name to ask for, the session id every
model request must carry in the `X-Arlctl-Session` header (that is how its calls become this run's rows),
the sampling settings and a deadline. It returns how its agent ended (`status`: one of RUN_STATUSES) and
what it said (`detail`). It must not take the diff itself: the rollout takes it from the sandbox afterwards,
the same way for every harness, and the swe reward grades it.

Adding one: write the class, then either register a factory under the `arlctl.harnesses` entry point group
(`mine = "my_pkg.harness:make"`), or pass `--harness my_pkg.harness:make`. The factory takes the
`--harness-opt KEY=VALUE` options as keyword arguments and raises UsageError for one it does not know.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

from arlctl.errors import UsageError

ENTRY_POINT_GROUP = "arlctl.harnesses"
# How a run ended, in the rollout's terms (stages/harness_run.py maps them to a row's status):
# submitted: the agent said it was done; limit: a step/cost limit ended it; timeout: its deadline;
# format: the model's replies could not be read as actions too often; error: the harness itself failed.
RUN_STATUSES = ("submitted", "limit", "timeout", "format", "error")


@dataclass
class HarnessContext:
    task: dict[str, Any]
    sandbox: Any  # arlctl.sandbox.base.Sandbox, started, holding the task's repository
    base_url: str  # the gateway's OpenAI API: POST {base_url}/chat/completions
    model: str  # the model name the gateway serves
    session_id: str  # send as the X-Arlctl-Session header with every request
    problem: str  # the task statement as the harness should see it
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int | None = None
    deadline_s: float = 3600.0  # seconds this run may take
    command_timeout_s: float = 30.0  # seconds one command in the sandbox may take


@dataclass
class HarnessResult:
    status: str  # one of RUN_STATUSES
    detail: str = ""  # the harness's own exit status or error, for env_info
    steps: int = 0  # model calls it made
    info: dict[str, Any] = field(default_factory=dict)


class Harness(Protocol):
    name: str

    async def run(self, ctx: HarnessContext) -> HarnessResult: ...


def _builtin() -> dict[str, Callable[..., Harness]]:
    def mini_swe_agent(**options: Any) -> Harness:
        from arlctl.harnesses.mini_swe_agent import MiniSweAgent

        return MiniSweAgent(**options)

    return {"mini-swe-agent": mini_swe_agent}


def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def harness_names() -> list[str]:
    return sorted({*_builtin(), *_plugins()})


def make_harness(spec: str, options: dict[str, Any] | None = None) -> Harness:
    """The harness `spec` names (a built-in, an entry point, or module:factory), built with `options`."""
    options = dict(options or {})
    factory: Callable[..., Harness] | None = _builtin().get(spec)
    if factory is None and spec in _plugins():
        factory = _plugins()[spec].load()
    if factory is None and ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise UsageError(f"--harness {spec}: cannot load it ({type(err).__name__}: {err})") from None
    if factory is None:
        raise UsageError(f"unknown harness {spec!r}", hint=f"one of {', '.join(harness_names())}, or module:factory")
    try:
        harness = factory(**options)
    except TypeError as err:
        raise UsageError(f"--harness-opt for {spec}: {err}") from None
    if not callable(getattr(harness, "run", None)):
        raise UsageError(f"--harness {spec}: the factory returned {type(harness).__name__}, which has no run()")
    return harness
