"""What a tool-call parser produces: the calls a model wrote and the ones it botched.

These live with the parsers (tools/ is below envs/); envs import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
