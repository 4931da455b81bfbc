"""The Env protocol (DESIGN.md §7): what the agent loop talks to, and `as_env` for third-party envs.

`Env` declares every member the loop uses. The built-in envs implement all of it; a plugin env needs
only async reset/step/close, and `as_env` fills in the rest with the loop's defaults (by wrapping the
object, not by a base class). One member is optional for every env, built-in or not: `env_info()`
(the EnvInfo protocol below), where the episode's environment ran; the loop reads it with `env_info(env)`.
ToolCall and ParseError belong to the tool-call parsers: import them from arlctl.tools.calls.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from arlctl.errors import UsageError
from arlctl.tools.calls import ParseError, ToolCall

REQUIRED = ("reset", "step", "close")  # what every env object must have; as_env supplies the rest


class EnvFailure(Exception):
    """The environment itself broke: its sandbox died, stopped answering, or lost its exec server.

    An infrastructure failure, never the policy's: the rollout ends the trajectory as `env_error` (which
    filter drops) instead of showing the model an error observation and grading what is left."""


@dataclass
class Action:
    """One assistant turn as the env sees it: the generated text and what was parsed from it."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[ParseError] = field(default_factory=list)


@dataclass
class EnvReset:
    messages: list[dict[str, Any]]  # chat messages: system and user (OpenAI format)
    tools: list[dict[str, Any]]  # OpenAI function-format tool schemas


@dataclass
class StepResult:
    observations: list[dict[str, Any]]  # chat messages to append, normally role "tool"
    done: bool
    final_state: str | None = None  # set when done: the answer (math) or the diff (swe)
    reward_step: float | None = None
    error: str | None = None  # env-side error during this step (counted in env_errors)
    finish_reason: str | None = None  # "submit" when the agent ended the episode itself


@runtime_checkable
class Env(Protocol):
    """One episode at a time; the loop makes one per trajectory (see EnvFactory)."""

    name: str
    # Recorded in the `env_version` column. A plugin may hand back a non-string; the loop makes it text.
    version: Any
    # The tool-call format this env's tools are written for ("hermes", "llama3-json", "mistral"): the loop
    # then reads calls with the chat family's parser. Anything else (None, "bash"): the env's own
    # parse_action reads its turns.
    tool_format: str | None
    # Why the last final_state() was cut (e.g. a swe diff over its byte limit), else None; a cut row
    # becomes status `truncated`.
    final_state_truncated: str | None

    def parse_action(self, text: str) -> Action | None:
        """This env's own reading of an assistant turn, or None to leave it to the family's parser."""
        ...

    async def reset(self, task: dict[str, Any]) -> EnvReset: ...

    async def step(self, action: Action) -> StepResult: ...

    async def final_state(self) -> str | None:
        """The artifact to grade when the loop ended the episode (a bound), not the agent; None if none."""
        ...

    async def close(self) -> None: ...


class EnvInfo(Protocol):
    """The optional member: an env with a sandbox says where the episode ran.

    `env_info()` returns a JSON-ready dict (sandbox kind, host or docker engine, container; `replaced_from`
    when the work moved off a failed sandbox or engine) or None (no sandbox: math, toy). The rollout stores
    it as the row's env_info column (schema v3) on every status, read after the episode ends and before
    close(), so it must stay answerable then and must be cheap. Not part of `Env`, so that an env without
    it (a plugin, a toy) is still a full Env and passes through unwrapped.
    """

    def env_info(self) -> dict[str, Any] | None: ...


ENV_INFO = "env_info"


def env_info(env: Any) -> dict[str, Any] | None:
    """`env.env_info()` for an env that has it (through an as_env wrapper too), else None.

    A value that is not a dict is refused with a TypeError: the caller counts it and records nothing."""
    target = env.wrapped if isinstance(env, _AdaptedEnv) else env
    own = getattr(target, ENV_INFO, None)
    if not callable(own):
        return None
    info = own()
    if info is not None and not isinstance(info, dict):
        raise TypeError(f"{type(target).__name__}.env_info() returned a {type(info).__name__}, not a dict or None")
    return info


@runtime_checkable
class EnvFactory(Protocol):
    """Makes the envs of one run, one per trajectory, and owns what they share (swe: its sandbox pools)."""

    name: str

    def __call__(self) -> Env: ...

    async def aclose(self) -> None:
        """Release what the envs shared (a no-op where they share nothing); call once when the run ends."""
        ...


class _AdaptedEnv:
    """A third-party env object seen as a full Env: its own members where it has them, defaults elsewhere.

    Attributes are read from the wrapped object on every access: an env sets `final_state_truncated`
    while it runs, and may set the others late too.
    """

    def __init__(self, env: Any):
        self.wrapped = env

    @property
    def name(self) -> str:
        return getattr(self.wrapped, "name", type(self.wrapped).__name__)

    @property
    def version(self) -> Any:
        return getattr(self.wrapped, "version", "")

    @property
    def tool_format(self) -> str | None:
        return getattr(self.wrapped, "tool_format", None)

    @property
    def final_state_truncated(self) -> str | None:
        return getattr(self.wrapped, "final_state_truncated", None)

    def parse_action(self, text: str) -> Action | None:
        own = getattr(self.wrapped, "parse_action", None)
        return own(text) if own is not None else None

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        return await self.wrapped.reset(task)

    async def step(self, action: Action) -> StepResult:
        return await self.wrapped.step(action)

    async def final_state(self) -> str | None:
        own = getattr(self.wrapped, "final_state", None)
        return await own() if own is not None else None

    async def close(self) -> None:
        await self.wrapped.close()


def missing_methods(obj: Any) -> list[str]:
    """The required env methods `obj` lacks (empty for anything usable as an env)."""
    return [method for method in REQUIRED if not callable(getattr(obj, method, None))]


def as_env(obj: Any) -> Env:
    """`obj` as a full Env: itself when it already is one (every built-in env), else wrapped with defaults.

    The defaults: name = the class name, version "", tool_format None, parse_action -> None (the family's
    parser reads the turn), final_state() -> None, final_state_truncated None. An object without async
    reset/step/close is a UsageError.
    """
    if isinstance(obj, _AdaptedEnv):
        return obj
    missing = missing_methods(obj)
    if missing:
        raise UsageError(f"a {type(obj).__name__} without {', '.join(missing)} is not an env",
                         hint="an env factory returns an object with async reset, step and close (docs/environments.md)")
    if type(obj) in _FULL_ENV_TYPES:
        return obj
    if isinstance(obj, Env):  # runtime_checkable: every member present
        if all(hasattr(type(obj), member) for member in _env_members()):
            _FULL_ENV_TYPES.add(type(obj))  # its class alone has them all: its next instances skip the check
        return obj
    return _AdaptedEnv(obj)


# Classes whose every instance is a full Env; a runtime Protocol check costs ~0.1 ms, once per trajectory.
_FULL_ENV_TYPES: set[type] = set()


@functools.cache
def _env_members() -> tuple[str, ...]:
    import typing

    names = getattr(Env, "__protocol_attrs__", None) or typing._get_protocol_attrs(Env)  # 3.12+ / 3.11
    return tuple(sorted(names))


__all__ = ["Action", "Env", "EnvFactory", "EnvFailure", "EnvInfo", "EnvReset", "StepResult", "as_env", "env_info",
           "missing_methods"]
