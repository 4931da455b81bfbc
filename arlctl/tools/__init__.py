"""Tool-call parsers (hermes `<tool_call>` JSON, fenced bash blocks) and tool message rendering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arlctl.envs.base import ParseError, ToolCall
from arlctl.tools.bash_blocks import parse_bash_blocks
from arlctl.tools.hermes import parse_hermes

Parser = Callable[..., tuple[list[ToolCall], list[ParseError]]]

# Name -> parser; `--tool-format` values. Each takes (text, tools) and returns (calls, errors).
PARSERS: dict[str, Parser] = {
    "hermes": parse_hermes,
    "bash": lambda text, tools=None: parse_bash_blocks(text),
}


def get_parser(name: str) -> Parser:
    from arlctl.errors import UsageError

    if name not in PARSERS:
        raise UsageError(f"unknown tool-call format {name!r}", hint=f"choose one of: {', '.join(PARSERS)}")
    return PARSERS[name]


def parse_tool_calls(text: str, fmt: str = "hermes", tools: list[dict[str, Any]] | None = None):
    """Parse one assistant turn in the named format; returns (calls, errors)."""
    return get_parser(fmt)(text, tools)
