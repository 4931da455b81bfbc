"""The Env protocol (DESIGN.md §7): what the agent loop talks to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class EnvFailure(Exception):
    """The environment itself broke: its sandbox died, stopped answering, or lost its exec server.

    An infrastructure failure, never the policy's: the rollout ends the trajectory as `env_error` (which
    filter drops) instead of showing the model an error observation and grading what is left."""


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass
class ParseError:
    """A tool call the model wrote that could not be parsed; becomes an error observation."""

    raw: str
    message: str


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
    name: str
    version: str

    async def reset(self, task: dict[str, Any]) -> EnvReset: ...

    async def step(self, action: Action) -> StepResult: ...

    async def close(self) -> None: ...
